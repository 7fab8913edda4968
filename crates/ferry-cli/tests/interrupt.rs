//! `ferry save` stopped by Ctrl-C (SIGINT) or SIGTERM while it writes: no partial file is left
//! beside the destination, an existing destination keeps its bytes, and the process exits as
//! the signal says (130, 143). Also sharded saves and loads through a folder, end to end.

use ferry::checkpoint::{self, Dtype, SaveOptions, SaveTensor};
use ferry::file::{FileConfig, FileEngine};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ferry-cli-interrupt-")
        .tempdir()
        .unwrap()
}

fn partial_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".ferry-partial-"))
        .collect()
}

/// A safetensors file of one F32 tensor of `bytes` (a sparse file: zeros, cheap to make).
fn big_checkpoint(dir: &Path, bytes: u64) -> PathBuf {
    let p = dir.join("big.safetensors");
    let header = format!(
        "{{\"w\":{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[0,{bytes}]}}}}",
        bytes / 4
    );
    let mut h = header.into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut f = std::fs::File::create(&p).unwrap();
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    f.set_len(8 + h.len() as u64 + bytes).unwrap();
    p
}

fn spawn_save(src: &Path, dst: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("save")
        .arg(src)
        .arg(dst)
        .args(["--device", "host", "--threads", "1"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ferry save")
}

/// Starts `ferry save`, waits for its partial file to appear, sends `sig`, and checks what is
/// left. Returns whether the signal stopped the save (false: it had finished first).
fn interrupt_once(sig: i32, extra: &[&str], raw: bool) -> bool {
    let dir = tmpdir();
    let src = big_checkpoint(dir.path(), 1 << 30);
    let dst = dir.path().join("out.safetensors");
    std::fs::write(&dst, b"the old bytes").unwrap();
    let mut args = extra.to_vec();
    if raw {
        args.push("--raw");
    }
    let mut child = spawn_save(&src, &dst, &args);
    let t0 = Instant::now();
    let mut seen = false;
    while t0.elapsed() < Duration::from_secs(60) {
        if !partial_files(dir.path()).is_empty() {
            seen = true;
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let pid = child.id() as i32;
    // SAFETY: `pid` is our own child, not yet waited for (so not reused).
    unsafe { libc::kill(pid, sig) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Whatever happened: no partial file is left.
    assert_eq!(partial_files(dir.path()), Vec::<String>::new(), "{err}");
    match out.status.code() {
        Some(c) if c == 128 + sig => {
            assert!(err.contains("interrupted"), "{err}");
            // The destination kept its old bytes.
            assert_eq!(std::fs::read(&dst).unwrap(), b"the old bytes");
            assert!(seen);
            true
        }
        Some(0) => {
            // Finished before the signal arrived: the new file is complete.
            assert_eq!(
                std::fs::metadata(&dst).unwrap().len(),
                std::fs::metadata(&src).unwrap().len()
            );
            false
        }
        other => panic!("ferry save ended with {other:?}: {err}"),
    }
}

fn interrupted(sig: i32, raw: bool) {
    // The save is seen half-written nearly always; a machine so fast that it finishes first
    // gets another try.
    let stopped = (0..3).any(|_| interrupt_once(sig, &[], raw));
    assert!(stopped, "no save was still running when the signal came");
}

#[test]
fn ctrl_c_during_a_checkpoint_save_leaves_nothing() {
    interrupted(libc::SIGINT, false);
}

#[test]
fn sigterm_during_a_checkpoint_save_leaves_nothing() {
    interrupted(libc::SIGTERM, false);
}

#[test]
fn ctrl_c_during_a_raw_save_leaves_nothing() {
    interrupted(libc::SIGINT, true);
}

#[test]
fn a_sharded_save_into_a_folder_loads_back() {
    let dir = tmpdir();
    // Four tensors of 1 MiB: two shards of at most 2 MiB.
    let src = dir.path().join("m.safetensors");
    let bytes: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i + 1; 1 << 20]).collect();
    let names = ["a", "b", "c", "d"];
    let tensors: Vec<SaveTensor<'_>> = names
        .iter()
        .zip(&bytes)
        .map(|(n, b)| SaveTensor::new(n, Dtype::U8, &[1 << 20], b))
        .collect();
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    checkpoint::save(&fe, &src, &tensors, &SaveOptions::new()).unwrap();
    let out = dir.path().join("sharded");
    std::fs::create_dir(&out).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("save")
        .arg(&src)
        .arg(&out)
        .args(["--device", "host", "--shard-size", "2M", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json"
        ]
    );
    // `ferry load` of the folder finds the index.
    let o = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("load")
        .arg(&out)
        .args(["--device", "host", "--verify", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["bytes"], 4 << 20);
    assert_eq!(v["files"], 2);
    assert_eq!(v["verified"], true);
}
