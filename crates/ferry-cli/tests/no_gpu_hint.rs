//! What `ferry load` suggests when the device asked for is not there (no driver, no GPU, too
//! little memory) names only what works on this machine: every `--device X` a refusal names
//! is run, on the same file, and must succeed; a GPU is named only where the driver finds one.

use ferry::checkpoint::{self, Dtype, SaveOptions, SaveTensor};
use ferry::file::{FileConfig, FileEngine};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

fn ferry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .output()
        .expect("run ferry")
}

/// The `--device X` values `message` suggests ("use --device X", "into --device X"; the
/// placeholder `cuda:N` taken as `cuda:0`), not the one it echoes as refused.
fn devices_named(message: &str) -> Vec<String> {
    ["use --device ", "into --device "]
        .iter()
        .flat_map(|lead| message.split(lead).skip(1))
        .map(|rest| {
            let d: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == ':')
                .collect();
            let d = d.trim_end_matches(':');
            if d == "cuda:N" {
                "cuda:0".into()
            } else {
                d.to_string()
            }
        })
        .collect()
}

/// Refused: its message's suggestions are each tried on `file` (a small one) and work.
fn every_suggestion_works(args: &[&str], file: &str) -> usize {
    let o = ferry(args);
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{args:?} succeeded: {e}");
    let named = devices_named(&e);
    for d in &named {
        let o = ferry(&["load", file, "--device", d]);
        assert!(
            o.status.success(),
            "{args:?} suggested --device {d}, which fails here: {}\n(the suggestion: {e})",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    if ferry::cuda::probe().devices.is_empty() {
        assert!(
            named.iter().all(|d| d == "host"),
            "a GPU's or pinned memory suggested where there is no GPU: {e}"
        );
        assert!(!e.contains("into --device cuda"), "{e}");
    }
    named.len()
}

#[test]
fn the_device_hints_name_only_what_works() {
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small.safetensors");
    let data = vec![7u8; 4096];
    let t = [SaveTensor::new("w", Dtype::U8, &[4096], &data)];
    let fe = FileEngine::new(FileConfig::new().threads(1)).unwrap();
    checkpoint::save(&fe, &small, &t, &SaveOptions::new()).unwrap();
    let s = small.to_str().unwrap();
    let p = ferry::cuda::probe();
    let mut named = 0;
    if p.driver.is_err() || p.devices.is_empty() {
        // No GPU: the default device (cuda:0) and pinned are refused, naming host.
        named += every_suggestion_works(&["load", s], s);
        named += every_suggestion_works(&["load", s, "--device", "pinned"], s);
        assert!(named >= 2, "no way forward was suggested");
    } else {
        let far = format!("cuda:{}", p.devices.len());
        every_suggestion_works(&["load", s, "--device", &far], s);
    }
    // More than the host's memory (a sparse file): the hint names less to load, and a GPU only
    // where there is one.
    let Some(avail) = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let l = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
        l.split_whitespace().nth(1)?.parse::<u64>().ok()
    }) else {
        return;
    };
    let huge = dir.path().join("huge.safetensors");
    let bytes = (avail * 1024 * 2).next_multiple_of(4);
    let header = format!(
        "{{\"w\":{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[0,{bytes}]}}}}",
        bytes / 4
    );
    let mut h = header.into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut f = std::fs::File::create(&huge).unwrap();
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    if f.set_len(8 + h.len() as u64 + bytes).is_err() {
        return; // the file system takes no file that large, even sparse
    }
    let hg = huge.to_str().unwrap();
    for args in [
        vec!["load", hg, "--device", "host"],
        vec!["load", hg, "--device", "host", "--raw"],
    ] {
        let o = ferry(&args);
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "{e}");
        assert!(e.contains("memory"), "{e}");
        let flag = if args.contains(&"--raw") {
            "--length"
        } else {
            "--select"
        };
        assert!(e.contains(flag), "{args:?}: {e}");
        every_suggestion_works(&args, s);
    }
    assert!(Path::new(s).exists());
}
