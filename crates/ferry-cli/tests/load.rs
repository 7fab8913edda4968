//! `ferry load` and `ferry save` end to end on the host (`--device host`; bad input is in
//! `bad_input.rs`). CPU only: the GPU runs the same code with `--device cuda:0`.

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

fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ferry-cli-load-")
        .tempdir()
        .unwrap()
}

/// A checkpoint of three tensors in `dir`, and its tensors' bytes.
fn checkpoint_in(dir: &Path) -> (PathBuf, Vec<u8>, Vec<u8>) {
    let w: Vec<u8> = (0..4096u32 * 4).map(|i| (i * 7) as u8).collect();
    let b: Vec<u8> = (0..64u8).collect();
    let s = 5i64.to_le_bytes();
    let p = dir.join("m.safetensors");
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    checkpoint::save(
        &fe,
        &p,
        &[
            SaveTensor::new("w", Dtype::F32, &[64, 64], &w),
            SaveTensor::new("b", Dtype::BF16, &[32], &b),
            SaveTensor::new("step", Dtype::I64, &[], &s),
        ],
        &SaveOptions::new(),
    )
    .unwrap();
    (p, w, b)
}

#[test]
fn load_a_checkpoint_on_the_host_with_table_and_json() {
    let dir = tmpdir();
    let (p, w, _) = checkpoint_in(dir.path());
    let p = p.to_str().unwrap();
    let out = ok(&["load", p, "--device", "host", "--verify"]);
    for want in [
        "loaded",
        "safetensors",
        "-> pageable",
        "GB/s",
        "page cache",
        "verify      ok",
        "issued by   threads (no O_DIRECT part",
        "tensor",
        "dtype",
        "step",
        "[64,64]",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    let v: serde_json::Value = serde_json::from_str(&ok(&[
        "load", p, "--device", "host", "--json", "--select", "w,step",
    ]))
    .unwrap();
    assert_eq!(v["kind"], "safetensors");
    assert_eq!(v["bytes"], w.len() as u64 + 8);
    assert_eq!(v["tensors"].as_array().unwrap().len(), 2);
    assert!(
        v["io_path"].as_str().unwrap().starts_with("buffered"),
        "{v}"
    );
    assert!(v["page_cache"].as_str().unwrap().contains('%'), "{v}");
    assert!(
        v["issued"].as_str().unwrap().starts_with("threads ("),
        "{v}"
    );
    let frac = v["page_cache_fraction"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&frac), "{v}");
    let per: serde_json::Value = serde_json::from_str(&ok(&[
        "load",
        p,
        "--device",
        "host",
        "--json",
        "--per-tensor",
        "--direct",
        "--threads",
        "3",
    ]))
    .unwrap();
    assert_eq!(
        (per["allocations"].as_u64(), per["reads"].as_u64()),
        (Some(3), Some(3))
    );
    // --direct: io_uring where this kernel allows it, else the threads with the reason.
    let issued = per["issued"].as_str().unwrap();
    assert!(
        issued.starts_with("io_uring, depth ") || issued.starts_with("threads ("),
        "{per}"
    );
}

#[test]
fn load_a_range_of_a_plain_file_and_save_it_back() {
    let dir = tmpdir();
    let data: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
    let src = dir.path().join("data.bin");
    std::fs::write(&src, &data).unwrap();
    let s = src.to_str().unwrap();
    let out = ok(&[
        "load", s, "--device", "host", "--offset", "4K", "--length", "1M", "--verify", "--direct",
    ]);
    assert!(
        out.contains("(raw)") && out.contains("1048576") && out.contains("verify      ok"),
        "{out}"
    );
    let v: serde_json::Value = serde_json::from_str(&ok(&[
        "load", s, "--device", "host", "--offset", "1000", "--json",
    ]))
    .unwrap();
    assert_eq!(
        (v["offset"].as_u64(), v["bytes"].as_u64()),
        (Some(1000), Some((3 << 20) - 1000))
    );
    let dst = dir.path().join("copy.bin");
    let out = ok(&[
        "save",
        s,
        dst.to_str().unwrap(),
        "--device",
        "host",
        "--fsync",
    ]);
    assert!(out.contains("saved") && out.contains("fsynced"), "{out}");
    assert!(std::fs::read(&dst).unwrap() == data);
}

/// The transport line and fields, and `--cufile` (host memory never uses cuFile: the mode is
/// accepted and changes nothing there).
#[test]
fn load_and_save_report_the_transport_and_take_cufile() {
    let dir = tmpdir();
    let src = dir.path().join("t.bin");
    std::fs::write(&src, vec![7u8; 100_000]).unwrap();
    let s = src.to_str().unwrap();
    for mode in ["auto", "on", "off"] {
        let out = ok(&["load", s, "--device", "host", "--cufile", mode]);
        assert!(out.contains("  transport   host\n"), "{out}");
        let v: serde_json::Value = serde_json::from_str(&ok(&[
            "load", s, "--device", "host", "--cufile", mode, "--json",
        ]))
        .unwrap();
        assert_eq!(v["transport"], "host", "{v}");
        assert!(v["transport_reason"].is_null(), "{v}");
    }
    let dst = dir.path().join("u.bin");
    let v: serde_json::Value = serde_json::from_str(&ok(&[
        "save",
        s,
        dst.to_str().unwrap(),
        "--device",
        "host",
        "--json",
    ]))
    .unwrap();
    assert_eq!(v["save"]["transport"], "host", "{v}");
    let o = ferry(&["load", s, "--device", "host", "--cufile", "maybe"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not auto, on or off"), "{err}");
}

#[test]
fn save_a_checkpoint_through_host_memory() {
    let dir = tmpdir();
    let (p, w, b) = checkpoint_in(dir.path());
    let dst = dir.path().join("again.safetensors");
    let out = ok(&[
        "save",
        p.to_str().unwrap(),
        dst.to_str().unwrap(),
        "--device",
        "host",
    ]);
    assert!(out.contains("saved"), "{out}");
    // The same tensors (and, written by the same writer, the same bytes).
    assert!(std::fs::read(&dst).unwrap() == std::fs::read(&p).unwrap());
    let fe = FileEngine::new(FileConfig::new().threads(1)).unwrap();
    let ck = checkpoint::load(
        &fe,
        &dst,
        &checkpoint::LoadOptions::new(checkpoint::Target::Pageable),
    )
    .unwrap();
    assert_eq!(ck.host_bytes("w"), Some(&w[..]));
    assert_eq!(ck.host_bytes("b"), Some(&b[..]));
}
