//! `ferry save`'s writer (`--writer auto|buffered|direct`) and bounded snapshot
//! (`--snapshot-bytes`) end to end on the host: every combination writes the reference
//! writer's bytes, the report names the writer used and why, and a bad value is refused
//! before any work.

use ferry::checkpoint::{self, Dtype, SaveOptions, SaveTensor};
use ferry::file::{FileConfig, FileEngine};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ferry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .output()
        .expect("run ferry")
}

fn ok(args: &[&str]) -> String {
    let o = ferry(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{args:?} failed: {err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A checkpoint of odd-sized tensors (about 300 KiB) in `dir`, written buffered.
fn checkpoint_in(dir: &Path) -> PathBuf {
    let sizes = [5000usize, 200 << 10, 77, 100 << 10];
    let data: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|k| (k * 31 + i * 7 + k / 251) as u8).collect())
        .collect();
    let names: Vec<String> = (0..sizes.len()).map(|i| format!("t.{i}")).collect();
    let shapes: Vec<[usize; 1]> = sizes.iter().map(|&n| [n]).collect();
    let list: Vec<SaveTensor<'_>> = (0..sizes.len())
        .map(|i| SaveTensor::new(&names[i], Dtype::U8, &shapes[i], &data[i]))
        .collect();
    let p = dir.join("m.safetensors");
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let opts = SaveOptions::new().direct(false);
    checkpoint::save(&fe, &p, &list, &opts).unwrap();
    p
}

#[test]
fn every_writer_and_snapshot_bound_writes_the_same_bytes_and_says_which_writer() {
    let dir = tempfile::tempdir().unwrap();
    let src = checkpoint_in(dir.path());
    let want = std::fs::read(&src).unwrap();
    let dst = dir.path().join("out.safetensors");
    let (s, d) = (src.to_str().unwrap(), dst.to_str().unwrap());
    for writer in ["auto", "buffered", "direct"] {
        for snap in [None, Some("8K"), Some("64K"), Some("1G")] {
            for fsync in [false, true] {
                let mut args = vec!["save", s, d, "--device", "host", "--writer", writer];
                if let Some(b) = snap {
                    args.extend(["--snapshot-bytes", b]);
                }
                if fsync {
                    args.push("--fsync");
                }
                let text = ok(&args);
                assert_eq!(std::fs::read(&dst).unwrap(), want, "{args:?}");
                let line = text
                    .lines()
                    .find(|l| l.trim_start().starts_with("writer "))
                    .unwrap_or_else(|| panic!("no writer line: {text}"));
                match writer {
                    "buffered" => assert!(line.contains("buffered (asked)"), "{line}"),
                    // Under Auto's 64 MiB: buffered, saying why.
                    "auto" => assert!(line.contains("buffered (auto"), "{line}"),
                    _ => assert!(
                        line.contains("O_DIRECT (asked)") || line.contains("refused O_DIRECT"),
                        "{line}"
                    ),
                }
                if snap.is_some() {
                    assert!(text.contains("  snapshot    "), "{text}");
                }
                args.push("--json");
                let v: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
                let sv = &v["save"];
                assert!(sv["writer"].is_string(), "{v}");
                if let Some(b) = snap {
                    let bound = match b {
                        "8K" => 8 << 10,
                        "64K" => 64 << 10,
                        _ => 1 << 30,
                    };
                    let held = sv["held_bytes"].as_u64().unwrap();
                    assert!(held > 0 && held <= bound, "{b}: {sv}");
                    assert!(sv["stall_seconds"].as_f64().unwrap() >= 0.0, "{sv}");
                }
                assert_eq!(std::fs::read(&dst).unwrap(), want, "{args:?}");
            }
        }
    }
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["m.safetensors", "out.safetensors"]);
}

#[test]
fn a_bad_writer_or_snapshot_size_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let src = checkpoint_in(dir.path());
    let dst = dir.path().join("out.safetensors");
    let (s, d) = (src.to_str().unwrap(), dst.to_str().unwrap());
    for (flag, value, want) in [
        (
            "--writer",
            "fast",
            "possible values: auto, buffered, direct",
        ),
        ("--snapshot-bytes", "lots", "lots"),
    ] {
        let o = ferry(&["save", s, d, "--device", "host", flag, value]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{flag} {value}");
        assert!(err.contains(want), "{err}");
        assert!(!dst.exists());
    }
    let help = ok(&["save", "--help"]);
    for w in ["--writer", "--snapshot-bytes", "O_DIRECT"] {
        assert!(help.contains(w), "{help}");
    }
}
