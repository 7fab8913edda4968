//! Standard output that goes away or fills up: the tool never panics on it. A reader that left
//! (`ferry bench --list | head -1`) ends the output quietly; a full device is an error naming
//! standard output, and a bench run's files are still written.

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Output, Stdio};

fn ferry_into(stdout: impl Into<Stdio>, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .expect("run ferry")
}

/// A pipe whose read end is already closed: every write to it fails with a broken pipe.
/// (`libc::pipe`: `std::io::pipe` is newer than the workspace's minimum Rust.)
fn pipe_without_reader() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe` writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: both descriptors were just opened by `pipe` and are owned by nothing else.
    let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(reader);
    writer
}

/// A one-sample `cpu-contig` bench run whose results go to `json`.
fn bench_into(json: &str) -> [&str; 9] {
    [
        "bench",
        "--test",
        "cpu-contig",
        "--sizes",
        "4K",
        "--samples",
        "1",
        "--json",
        json,
    ]
}

#[test]
fn a_reader_that_left_ends_the_output_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let json = json.to_str().unwrap();
    let runs: [&[&str]; 3] = [&["bench", "--list"], &["info"], &bench_into(json)];
    for args in runs {
        let o = ferry_into(pipe_without_reader(), args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{args:?}: {:?}: {err}", o.status);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // The bench run's results were written although nobody read its table.
    let text = std::fs::read_to_string(json).unwrap();
    assert!(text.contains("cpu-contig"), "{text}");
}

#[test]
fn a_full_device_is_an_error_and_the_results_are_kept() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        println!("skipped: no /dev/full here");
        return;
    };
    let o = ferry_into(full.try_clone().unwrap(), &["bench", "--list"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot write to standard output"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let o = ferry_into(full, &bench_into(json.to_str().unwrap()));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot write to standard output"), "{err}");
    let text = std::fs::read_to_string(&json).unwrap();
    assert!(text.contains("cpu-contig"), "{text}");
}
