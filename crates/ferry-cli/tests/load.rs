//! `ferry load` and `ferry save` end to end on the host (`--device host`; bad input is in
//! `bad_input.rs`), `ferry save`'s writers and snapshot bound among them. CPU only: the GPU
//! runs the same code with `--device cuda:0`.

use ferry::checkpoint::{self, Dtype, SaveOptions, SaveTensor};
use ferry::file::{FileConfig, FileEngine, IoIssue, IoReport};
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

/// Asserts that no save left a temporary file (`NAME.ferry-partial-PID-N`) in `dir`.
fn no_partial_files(dir: &Path) {
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".ferry-partial-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
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
        "B/s",
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
    assert_eq!(ck.host("w").map(|v| v.bytes()), Some(&w[..]));
    assert_eq!(ck.host("b").map(|v| v.bytes()), Some(&b[..]));
}

fn refused(args: &[&str], want: &str) -> String {
    let o = ferry(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{args:?} succeeded");
    assert!(err.contains(want), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    err
}

/// The output is the input under another spelling (`./`, a symbolic link, a hard link): refused
/// before anything is written, so `--select` cannot drop the other tensors from the file.
#[test]
fn save_refuses_its_own_input_however_it_is_named() {
    let dir = tmpdir();
    let (p, _, _) = checkpoint_in(dir.path());
    let before = std::fs::read(&p).unwrap();
    let link = dir.path().join("link.safetensors");
    std::os::unix::fs::symlink(&p, &link).unwrap();
    let hard = dir.path().join("hard.safetensors");
    std::fs::hard_link(&p, &hard).unwrap();
    let dotted = dir.path().join(".").join("m.safetensors");
    for dst in [&p, &dotted, &link, &hard] {
        let args = [
            "save",
            p.to_str().unwrap(),
            dst.to_str().unwrap(),
            "--device",
            "host",
            "--select",
            "w",
        ];
        refused(&args, "the output is the input");
    }
    assert!(std::fs::read(&p).unwrap() == before);
}

/// An existing destination that is not a regular file is never replaced (as root, `ferry
/// save m.safetensors /dev/null` would otherwise have put a regular file in its place), and
/// a FIFO with no reader is refused at once rather than waited on.
#[test]
fn save_refuses_what_is_not_a_regular_file() {
    let dir = tmpdir();
    let (p, _, _) = checkpoint_in(dir.path());
    let raw = dir.path().join("raw.bin");
    std::fs::write(&raw, vec![7u8; 1000]).unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // A folder is a sharded save's destination: plain bytes cannot be saved into one.
    refused(
        &[
            "save",
            raw.to_str().unwrap(),
            dir.path().to_str().unwrap(),
            "--device",
            "host",
        ],
        "a sharded save writes a safetensors checkpoint",
    );
    for src in [&p, &raw] {
        for dst in [Path::new("/dev/null"), &fifo] {
            let t0 = std::time::Instant::now();
            let args = [
                "save",
                src.to_str().unwrap(),
                dst.to_str().unwrap(),
                "--device",
                "host",
            ];
            refused(&args, "not a regular file");
            assert!(t0.elapsed().as_secs() < 20, "{args:?} waited");
        }
    }
    let meta = std::fs::metadata("/dev/null").unwrap();
    assert!(!meta.is_file());
}

/// A raw save over an existing file writes beside it and renames: the old bytes stay until
/// the new ones are complete, no temporary file is left, the file's permissions are kept, a
/// symbolic link is written through, and a user's file of the old temporary name is untouched.
#[test]
fn save_replaces_whole_files_and_keeps_links_and_modes() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmpdir();
    let (p, _, _) = checkpoint_in(dir.path());
    let src = dir.path().join("src.bin");
    std::fs::write(&src, vec![9u8; 5000]).unwrap();
    for (input, name) in [(&src, "out.bin"), (&p, "out.safetensors")] {
        let real = dir.path().join(name);
        std::fs::write(&real, b"old").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join(format!("link-{name}"));
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let users = dir.path().join(format!("{name}.ferry-partial"));
        std::fs::write(&users, b"mine").unwrap();
        let args = [
            "save",
            input.to_str().unwrap(),
            link.to_str().unwrap(),
            "--device",
            "host",
        ];
        ok(&args);
        assert!(std::fs::read(&real).unwrap() == std::fs::read(input).unwrap());
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name}");
        assert_eq!(std::fs::read(&users).unwrap(), b"mine");
    }
    no_partial_files(dir.path());
}

/// A tensor name made to fill the table (over the 65,535 characters Rust's formatter pads to)
/// or to drive the terminal is shown cut and escaped; `--json` keeps it whole.
#[test]
fn load_shows_huge_and_odd_names() {
    let dir = tmpdir();
    let p = dir.path().join("odd.safetensors");
    let long = "x".repeat(70_000);
    let odd = "a\nb\u{1b}[31m";
    let v = [1u8, 2, 3, 4];
    let fe = FileEngine::new(FileConfig::new().threads(1)).unwrap();
    checkpoint::save(
        &fe,
        &p,
        &[
            SaveTensor::new(&long, Dtype::U8, &[4], &v),
            SaveTensor::new(odd, Dtype::U8, &[4], &v),
        ],
        &SaveOptions::new(),
    )
    .unwrap();
    let out = ok(&["load", p.to_str().unwrap(), "--device", "host"]);
    assert!(out.contains('…'), "{out}");
    assert!(out.contains("a\\nb\\u{1b}[31m"), "{out}");
    assert!(!out.contains('\u{1b}'));
    let json = ok(&["load", p.to_str().unwrap(), "--device", "host", "--json"]);
    assert!(json.contains(&long));
}

/// `--offset 0` is the file's start (it was refused as a zero size).
#[test]
fn offset_zero_is_the_start() {
    let dir = tmpdir();
    let p = dir.path().join("plain.bin");
    std::fs::write(&p, vec![3u8; 4096]).unwrap();
    let out = ok(&[
        "load",
        p.to_str().unwrap(),
        "--device",
        "host",
        "--offset",
        "0",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["offset"].as_u64(), v["bytes"].as_u64()),
        (Some(0), Some(4096)),
        "{out}"
    );
    // Zero however written: it was refused as "sizes must be at least 1 byte".
    for zero in ["00", "0K", "0B", " 0 "] {
        let out = ok(&[
            "load",
            p.to_str().unwrap(),
            "--device",
            "host",
            "--offset",
            zero,
            "--json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["offset"].as_u64(), Some(0), "{zero}: {out}");
    }
    // A zero --length is still refused, and a negative offset too.
    refused(
        &[
            "load",
            p.to_str().unwrap(),
            "--device",
            "host",
            "--length",
            "0K",
        ],
        "zero",
    );
    refused(
        &[
            "load",
            p.to_str().unwrap(),
            "--device",
            "host",
            "--offset",
            "-0",
        ],
        "negative",
    );
}

/// The host's `MemAvailable` in bytes (None where /proc/meminfo does not say).
/// The machine's memory (`MemTotal`), bytes: more than it is never available, however much other
/// processes free meanwhile (`MemAvailable` read first moved by gigabytes under a parallel
/// build, and the load it was to refuse went through).
fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()?
        .checked_mul(1024)
}

/// `--select` of a 4-byte tensor beside one larger than the machine's memory loads the small
/// one: the memory check counts the tensors selected, not the whole file (the file is sparse:
/// nothing of the large tensor is ever written or read).
#[test]
fn select_needs_memory_for_the_selected_tensors_only() {
    let Some(total) = mem_total() else {
        println!("skipped: no MemTotal in /proc/meminfo");
        return;
    };
    let dir = tmpdir();
    let p = dir.path().join("mixed.safetensors");
    let huge = total + (1 << 30);
    let mut header = serde_json::json!({
        "small": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
        "huge": {"dtype": "U8", "shape": [huge], "data_offsets": [4, 4 + huge]},
    })
    .to_string()
    .into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(b"abcd");
    std::fs::write(&p, &bytes).unwrap();
    if std::fs::File::options()
        .write(true)
        .open(&p)
        .and_then(|f| f.set_len(bytes.len() as u64 + huge))
        .is_err()
    {
        println!("skipped: the temp folder holds no sparse file of {huge} bytes");
        return;
    }
    let p = p.to_str().unwrap();
    let v: serde_json::Value = serde_json::from_str(&ok(&[
        "load", p, "--device", "host", "--select", "small", "--json", "--verify",
    ]))
    .unwrap();
    assert_eq!(v["bytes"], 4);
    assert_eq!(v["tensors"][0]["name"], "small");
    for select in [None, Some("huge"), Some("small,huge")] {
        let mut args = vec!["load", p, "--device", "host"];
        args.extend(select.iter().flat_map(|s| ["--select", *s]));
        refused(&args, "of host memory");
    }
}

/// A save that fails part way (here the file size limit, as a full disk would) leaves the file
/// it was to replace as it was and no temporary file, and the error names that file: a raw
/// save once truncated the destination before writing.
#[test]
fn a_failed_save_keeps_the_file_it_would_replace() {
    use std::os::unix::process::CommandExt;
    let dir = tmpdir();
    let (p, _, _) = checkpoint_in(dir.path());
    let src = dir.path().join("src.bin");
    std::fs::write(&src, vec![9u8; 64 << 10]).unwrap();
    for (input, name) in [(&src, "out.bin"), (&p, "out.safetensors")] {
        let dst = dir.path().join(name);
        std::fs::write(&dst, b"the user's bytes").unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
        cmd.args(["save", input.to_str().unwrap(), dst.to_str().unwrap()])
            .args(["--device", "host"]);
        // SAFETY: setrlimit and signal are async-signal-safe; the closure touches no memory
        // of the parent and allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: 4096,
                    rlim_max: 4096,
                };
                // Past the limit a write fails with EFBIG (SIGXFSZ ignored, not fatal).
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let o = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "{name}: saved under a 4 KiB file size limit"
        );
        assert!(err.contains(&dst.display().to_string()), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(std::fs::read(&dst).unwrap(), b"the user's bytes", "{name}");
    }
    no_partial_files(dir.path());
}

/// A sharded checkpoint whose index lists a missing shard, or a file that names a tensor twice:
/// the error names the index (and the tensor), or says the name is given twice.
#[test]
fn a_missing_shard_or_a_name_given_twice_is_named() {
    let dir = tmpdir();
    let (p, _, _) = checkpoint_in(dir.path());
    let index = dir.path().join("m.safetensors.index.json");
    std::fs::write(
        &index,
        r#"{"weight_map": {"w": "m.safetensors", "x": "m-9.safetensors"}}"#,
    )
    .unwrap();
    let err = refused(
        &["load", index.to_str().unwrap(), "--device", "host"],
        "m-9.safetensors",
    );
    assert!(err.contains(&index.display().to_string()), "{err}");
    assert!(err.contains("`x`"), "{err}");
    drop(p);
    let twice = dir.path().join("twice.safetensors");
    let mut header = br#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#.to_vec();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(&[1; 8]);
    std::fs::write(&twice, bytes).unwrap();
    refused(
        &["load", twice.to_str().unwrap(), "--device", "host"],
        "tensor `a` is named twice",
    );
}

/// An index larger than any real one (a sparse file here) is refused without being read: it
/// was read whole into memory, three times (an 8 GB one: 8 GB and 40 s, then "not JSON").
#[test]
fn an_oversized_index_is_refused_unread() {
    let dir = tmpdir();
    let index = dir.path().join("m.safetensors.index.json");
    std::fs::write(&index, r#"{"weight_map": {}}"#).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&index)
        .unwrap()
        .set_len(checkpoint::MAX_INDEX_BYTES + 1)
        .unwrap();
    let dst = dir.path().join("out.safetensors");
    for args in [
        vec!["load", index.to_str().unwrap(), "--device", "host"],
        vec![
            "save",
            index.to_str().unwrap(),
            dst.to_str().unwrap(),
            "--device",
            "host",
        ],
    ] {
        let err = refused(&args, "over the limit of 100000000 bytes for an index");
        assert!(err.contains(&index.display().to_string()), "{err}");
    }
    assert!(!dst.exists());
}

/// Names from a file quoted in an error (a tensor named twice, a shard that cannot be opened)
/// reach the terminal escaped, as in the tensor table: they were written raw, escape
/// sequences (a window title, a cleared screen) and bidi overrides included.
#[test]
fn names_in_errors_are_escaped() {
    let dir = tmpdir();
    let name = "\u{1b}]0;pwned\u{7}\u{1b}[2Jred\u{202e}";
    let json = serde_json::to_string(name).unwrap();
    let mut header = format!(
        r#"{{{json}:{{"dtype":"U8","shape":[4],"data_offsets":[0,4]}},{json}:{{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}}}"#
    )
    .into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(&[1; 8]);
    let twice = dir.path().join("twice.safetensors");
    std::fs::write(&twice, bytes).unwrap();
    let index = dir.path().join("m.safetensors.index.json");
    let map = serde_json::json!({"weight_map": {name: format!("gone{name}.safetensors")}});
    std::fs::write(&index, map.to_string()).unwrap();
    for p in [&twice, &index] {
        let err = refused(
            &["load", p.to_str().unwrap(), "--device", "host"],
            "\\u{1b}]0;pwned\\u{7}\\u{1b}[2Jred\\u{202e}",
        );
        assert!(!err.contains(['\u{1b}', '\u{7}', '\u{202e}']), "{err:?}");
    }
}

/// Issue 33: a checkpoint's report said "O_DIRECT not used: not asked for (...)" and then
/// "issued by threads (no O_DIRECT part: not asked for (...))" in one line.
#[test]
fn a_report_line_says_each_fact_once() {
    let note = "not asked for (FileConfig::direct is off)".to_string();
    let io = IoReport {
        bytes: 8,
        buffered_bytes: 8,
        direct_note: Some(note.clone()),
        issued: Some(IoIssue::Threads {
            why: format!("no O_DIRECT part: {note}"),
        }),
        ..IoReport::default()
    };
    let line = io.to_string();
    assert_eq!(line.matches("not asked for").count(), 1, "{line}");
    assert!(
        line.contains("issued by threads (no O_DIRECT part)"),
        "{line}"
    );
    // Another reason for threads is kept whole.
    let io = IoReport {
        issued: Some(IoIssue::Threads {
            why: "io_uring unavailable: EPERM".into(),
        }),
        ..io
    };
    let line = io.to_string();
    assert!(
        line.contains("issued by threads (io_uring unavailable: EPERM)"),
        "{line}"
    );
    // And a real load's report, as `Checkpoint::report` displays it.
    let dir = tmpdir();
    let (p, _, _) = checkpoint_in(dir.path());
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let ck = checkpoint::load(
        &fe,
        &p,
        &checkpoint::LoadOptions::new(checkpoint::Target::Pageable),
    )
    .unwrap();
    let line = ck.report().to_string();
    assert!(line.matches("not asked for").count() <= 1, "{line}");
}

/// Issue 33: an 88-byte load printed "0.0000 s, 0.00 GB/s"; and its issued line repeated the
/// reason the path line gives for no O_DIRECT.
#[test]
fn a_tiny_load_prints_its_time_in_useful_units() {
    let dir = tmpdir();
    let p = dir.path().join("tiny.bin");
    std::fs::write(&p, [7u8; 88]).unwrap();
    let out = ok(&["load", p.to_str().unwrap(), "--device", "host"]);
    let time = out.lines().find(|l| l.contains("time  ")).unwrap();
    assert!(
        !time.contains("0.00 GB/s") && !time.contains("0.0000 s"),
        "{out}"
    );
    assert!(time.contains("us, ") || time.contains("ms, "), "{out}");
    assert!(time.contains("B/s"), "{out}");
    assert_eq!(out.matches("not asked for").count(), 1, "{out}");
}

/// `ferry load DIR` of a sharded folder reads every shard through the library's folder
/// resolution, and prints the memory it used (pinned bytes, the process's peak RSS); a
/// folder holding no checkpoint is refused saying so.
#[test]
fn load_a_sharded_folder_and_report_its_memory() {
    let dir = tmpdir();
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let data: Vec<Vec<u8>> = (0..12u8).map(|i| vec![i; 4096 + i as usize * 64]).collect();
    let names: Vec<String> = (0..12).map(|i| format!("layer.{i}")).collect();
    let shapes: Vec<[usize; 1]> = data.iter().map(|d| [d.len()]).collect();
    let list: Vec<SaveTensor<'_>> = names
        .iter()
        .zip(&data)
        .zip(&shapes)
        .map(|((n, d), s)| SaveTensor::new(n, Dtype::U8, s, d))
        .collect();
    let index = dir.path().join("model.safetensors.index.json");
    checkpoint::save(
        &fe,
        &index,
        &list,
        &SaveOptions::new().shard_bytes(16 << 10),
    )
    .unwrap();
    let folder = dir.path().to_str().unwrap();
    let out = ok(&["load", "--device", "host", "--verify", folder]);
    assert!(out.contains("model.safetensors.index.json"), "{out}");
    assert!(out.contains("verify      ok"), "{out}");
    let mem = out
        .lines()
        .find(|l| l.trim_start().starts_with("memory"))
        .unwrap_or_else(|| panic!("no memory line: {out}"));
    assert!(mem.contains(" 0B pinned"), "{mem}");
    assert!(mem.contains("process peak RSS"), "{mem}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["load", "--device", "host", "--json", folder])).unwrap();
    let shards = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "safetensors")
        })
        .count();
    assert!(shards >= 3, "{shards}");
    assert_eq!(json["files"], shards);
    assert_eq!(json["pinned_bytes"], 0);
    assert!(json["peak_rss_bytes"].as_u64().unwrap() > 0, "{json}");
    // A folder with no checkpoint in it.
    let empty = tmpdir();
    let msg = refused(
        &["load", "--device", "host", empty.path().to_str().unwrap()],
        "holds no checkpoint",
    );
    assert!(msg.contains(empty.path().to_str().unwrap()), "{msg}");
}

// `ferry save`'s writer (`--writer auto|buffered|direct`) and bounded snapshot
// (`--snapshot-bytes`): every combination writes the reference writer's bytes, the report
// names the writer used and why, and a bad value is refused before any work.

/// A checkpoint of odd-sized tensors (about 300 KiB) in `dir`, written buffered.
fn odd_checkpoint_in(dir: &Path) -> PathBuf {
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
    let src = odd_checkpoint_in(dir.path());
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
    let src = odd_checkpoint_in(dir.path());
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
