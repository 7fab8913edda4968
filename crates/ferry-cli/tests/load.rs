//! `ferry load` and `ferry save` end to end on the host (`--device host`), and every bad input
//! refused with a clear message before any work. CPU only: the GPU runs the same code with
//! `--device cuda:0`.

use ferry::checkpoint::{self, Dtype, SaveOptions, SaveTensor};
use ferry::file::{FileConfig, FileEngine};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

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

fn refused(args: &[&str], want: &str) -> String {
    let t0 = Instant::now();
    let o = ferry(args);
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{args:?} succeeded: {e}");
    assert!(e.contains(want), "{args:?}: {e}");
    assert!(
        !e.contains("Os {") && !e.contains("Err("),
        "{args:?}: Debug text: {e}"
    );
    assert!(o.stdout.is_empty(), "{args:?} printed results");
    assert!(t0.elapsed() < Duration::from_secs(20), "{args:?} ran");
    e
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

#[test]
fn bad_input_is_refused_before_any_work() {
    let dir = tmpdir();
    let (p, _, _) = checkpoint_in(dir.path());
    let p = p.to_str().unwrap();
    let raw = dir.path().join("raw.bin");
    std::fs::write(&raw, vec![1u8; 10_000]).unwrap();
    let r = raw.to_str().unwrap();
    refused(
        &["load", "/no/such/file", "--device", "host"],
        "No such file",
    );
    refused(
        &["load", "/dev/zero", "--device", "host"],
        "not a regular file",
    );
    refused(
        &["load", dir.path().to_str().unwrap(), "--device", "host"],
        "not a regular file",
    );
    refused(
        &["load", r, "--device", "host", "--offset", "20000"],
        "past the end",
    );
    refused(
        &[
            "load", r, "--device", "host", "--offset", "5000", "--length", "6000",
        ],
        "runs past the end",
    );
    refused(
        &["load", r, "--device", "host", "--length", "-1"],
        "--length",
    );
    refused(
        &["load", r, "--device", "gpu"],
        "is not cuda:N, host or pinned",
    );
    refused(&["load", r, "--device", "cuda:x"], "not a number");
    refused(
        &["load", r, "--device", "host", "--threads", "0"],
        "--threads",
    );
    refused(
        &["load", p, "--device", "host", "--offset", "8"],
        "add --raw",
    );
    refused(
        &["load", r, "--device", "host", "--select", "w"],
        "apply to safetensors",
    );
    refused(
        &["save", r, r, "--device", "host"],
        "the output is the input",
    );
    refused(
        &["save", r, "/no/such/dir/out.bin", "--device", "host"],
        "does not exist",
    );
    if ferry::cuda::probe().driver.is_err() {
        refused(&["load", r], "use --device host or pinned");
        refused(&["load", r, "--device", "pinned"], "needs a CUDA driver");
    } else {
        refused(&["load", r, "--device", "cuda:999"], "GPU(s)");
    }
    // A FIFO is refused at once, not read for ever.
    let fifo = dir.path().join("pipe.safetensors");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    refused(
        &["load", fifo.to_str().unwrap(), "--device", "host"],
        "not a regular file",
    );
    // A malformed checkpoint is refused with the file and tensor named, nothing printed.
    let bad = dir.path().join("bad.safetensors");
    let hdr = br#"{"w":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}}"#;
    let mut f = (hdr.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(hdr);
    f.extend_from_slice(&[0; 4]);
    std::fs::write(&bad, f).unwrap();
    let e = refused(
        &["load", bad.to_str().unwrap(), "--device", "host"],
        "unknown dtype",
    );
    assert!(e.contains("bad.safetensors") && e.contains("`w`"), "{e}");
}
