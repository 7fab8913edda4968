//! The checks `ferry bench` and `ferry plot` make before any work, and the outputs they write:
//! FIFOs (with and without a reader) never make the tool wait forever, one file is never
//! given for two outputs, endless plot axes are refused or avoided, and the messages name the
//! option to change. Every run of the binary here has a deadline: a regression fails, it does
//! not hang the test suite.

use ferry_cli::args::{check_memory, check_outputs, preflight, validate, ArgError, Plan};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs ferry with `args`, killing it after `secs` seconds (then the test fails: it hung).
/// Returns (success, stdout, stderr).
fn ferry_within(secs: u64, args: &[&str]) -> (bool, String, String) {
    ferry_within_then(secs, args, |_| {})
}

/// [`ferry_within`], calling `started` with the process id once it runs.
fn ferry_within_then(
    secs: u64,
    args: &[&str],
    started: impl FnOnce(u32),
) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ferry");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).map(|_| s).unwrap_or_default()
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).map(|_| s).unwrap_or_default()
    });
    started(child.id());
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for ferry") {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            child.kill().expect("kill ferry");
            let _ = child.wait();
            panic!("ferry {args:?} still running after {secs} s (hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.success(), out.join().unwrap(), err.join().unwrap())
}

/// `args` are refused quickly with a message containing `want`; returns the message.
fn refused(args: &[&str], want: &str) -> String {
    let (ok, out, err) = ferry_within(20, args);
    assert!(!ok, "{args:?} succeeded: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
    assert!(out.is_empty(), "{args:?} printed results: {out}");
    err
}

fn plan(args: &[&str]) -> ferry_cli::args::BenchPlan {
    let argv = std::iter::once("ferry").chain(args.iter().copied());
    match validate(argv) {
        Ok(Plan::Bench(p)) => *p,
        other => panic!("{args:?}: {other:?}"),
    }
}

fn validate_err(args: &[&str]) -> String {
    let argv = std::iter::once("ferry").chain(args.iter().copied());
    match validate(argv) {
        Err(e) => e.to_string(),
        Ok(p) => panic!("{args:?} accepted: {p:?}"),
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

const QUICK: [&str; 8] = [
    "--sizes",
    "4K",
    "--samples",
    "1",
    "--warmup",
    "0",
    "--threads",
    "1",
];

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_fifo_without_a_reader_is_refused_for_every_output() {
    let dir = tempfile::tempdir().unwrap();
    let (svg, json) = (dir.path().join("f.svg"), dir.path().join("f.json"));
    mkfifo(&svg);
    mkfifo(&json);
    // Was: the check opened the FIFO for writing and waited for a reader forever.
    for (flag, path) in [
        ("--json", &json),
        ("--plot", &svg),
        ("--trace", &json),
        ("--gantt", &svg),
    ] {
        let mut args = vec!["bench", "--test", "pipeline", flag, s(path)];
        args.extend(QUICK);
        refused(&args, "a FIFO with no reader");
    }
    let report = dir.path().join("r.json");
    std::fs::write(&report, "{}").unwrap();
    // `ferry plot` checks its pictures (main.rs) with the same check.
    refused(
        &["plot", s(&report), "--plot", s(&svg)],
        "a FIFO with no reader",
    );
    // The per-run trace files (FILE.TEST-SIZE.json, written with several pipeline runs).
    let trace = dir.path().join("t.json");
    mkfifo(&dir.path().join("t.pipeline-8K.json"));
    let mut args = vec!["bench", "--test", "pipeline", "--trace", s(&trace)];
    args.extend(QUICK);
    args[6] = "4K,8K";
    refused(&args, "t.pipeline-8K.json: a FIFO with no reader");
}

#[test]
fn a_fifo_with_a_reader_gets_the_whole_output() {
    // Was: the check's open and close of the FIFO ended the reader's input (EOF) before the
    // run, and the output's own open then waited for a new reader forever.
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("r.json");
    mkfifo(&fifo);
    let path = fifo.clone();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_string(&mut text))
            .map(|_| text)
    });
    // Let the reader open its end first.
    std::thread::sleep(Duration::from_millis(200));
    let mut args = vec!["bench", "--test", "cpu-contig", "--json", s(&fifo)];
    args.extend(QUICK);
    let (ok, _, err) = ferry_within(60, &args);
    assert!(ok, "{err}");
    let text = reader.join().unwrap().unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).expect("the whole report");
    assert_eq!(v["results"][0]["test"], "cpu-contig", "{text}");
}

#[test]
fn a_fifo_whose_reader_leaves_during_the_run_is_an_error_not_a_hang() {
    // Was: the reader's end closed during the run, and the output's open at the end waited for
    // a new reader forever. Now each output is checked again just before it is written.
    use std::os::unix::fs::OpenOptionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("r.json");
    mkfifo(&fifo);
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    // A run of a few seconds: 1 GiB copies on one thread.
    let args = [
        "bench",
        "--test",
        "cpu-contig",
        "--json",
        s(&fifo),
        "--sizes",
        "1G",
        "--samples",
        "2",
        "--warmup",
        "0",
        "--threads",
        "1",
    ];
    let (ok, out, err) = ferry_within_then(120, &args, |pid| {
        // Once ferry holds the FIFO (its start-up check), the reader leaves.
        let fd_dir = format!("/proc/{pid}/fd");
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(60) {
            let holds = std::fs::read_dir(&fd_dir).is_ok_and(|fds| {
                fds.flatten()
                    .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == fifo))
            });
            if holds {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(reader);
    });
    assert!(!ok, "succeeded: {err}");
    assert!(err.contains("a FIFO with no reader"), "{err}");
    // The run's table was still shown.
    assert!(out.contains("cpu-contig"), "{out}");
}

#[test]
fn standard_output_and_null_take_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![
        "bench",
        "--test",
        "cpu-contig",
        "--json",
        "/dev/stdout",
        "--plot",
        "/dev/null",
    ];
    args.extend(QUICK);
    // `--plot /dev/null` has no .svg: refused by name; with JSON on standard output the run
    // writes it there (a pipe with a reader, as `--json >(jq .)` gives).
    refused(&args, "must end in .svg or .png");
    args.truncate(5);
    args.extend(["--trace", "/dev/null"]);
    args.extend(QUICK);
    let (ok, out, err) = ferry_within(60, &args);
    assert!(ok, "{err}");
    assert!(out.contains("\"schema\": \"ferry-bench/1\""), "{out}");
    // One device for two outputs is allowed: it is not a file that one would overwrite.
    let p = plan(&[
        "bench",
        "--test",
        "cpu-contig",
        "--json",
        "/dev/null",
        "--trace",
        "/dev/null",
    ]);
    preflight(&p).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn one_file_for_two_outputs_is_refused_however_spelled() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("sub")).unwrap();
    let r = d.join("r.json");
    let dotted = d.join("sub/../r.json");
    let check =
        |outs: &[(&str, &PathBuf)]| check_outputs(outs.iter().map(|(f, p)| (*f, p.as_path())));
    // A new file, spelled two ways.
    let e = check(&[("--json", &r), ("--trace", &dotted)]).unwrap_err();
    assert!(
        e.to_string().contains("given for both --json and --trace"),
        "{e}"
    );
    // An existing file and a symbolic link to it.
    std::fs::write(&r, "keep").unwrap();
    let link = d.join("link.json");
    std::os::unix::fs::symlink(&r, &link).unwrap();
    let e = check(&[("--json", &r), ("--trace", &link)]).unwrap_err();
    assert!(matches!(e, ArgError::Output { .. }), "{e}");
    let (a, b) = (d.join("a.svg"), d.join("sub/../a.svg"));
    let e = check(&[("--plot", &a), ("--plot", &b)]).unwrap_err();
    assert!(e.to_string().contains("given twice for --plot"), "{e}");
    check(&[("--json", &r), ("--trace", &d.join("t.json"))]).unwrap();
    assert_eq!(
        std::fs::read_to_string(&r).unwrap(),
        "keep",
        "the check wrote"
    );
    // Through the binary: nothing is run or written.
    let mut args = vec!["bench", "--test", "pipeline", "--json", s(&r)];
    args.extend(["--trace", s(&link)]);
    args.extend(QUICK);
    refused(&args, "each output needs its own file");
    assert_eq!(std::fs::read_to_string(&r).unwrap(), "keep");
    // A per-run trace file that is also the JSON output.
    let (trace, per_run) = (d.join("t.json"), d.join("t.pipeline-8K.json"));
    let mut args = vec!["bench", "--test", "pipeline", "--trace", s(&trace)];
    args.extend(["--json", s(&per_run)]);
    args.extend(QUICK);
    args[8] = "4K,8K";
    refused(&args, "--trace (one file per run)");
}

#[test]
fn folder_paths_are_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let file = d.join("x.svg");
    std::fs::write(&file, "").unwrap();
    for (path, want) in [
        (
            format!("{}/", d.join("new.svg").display()),
            "names a folder",
        ),
        (format!("{}/", file.display()), "names a folder"),
        (
            d.join("sub.svg").display().to_string() + "/",
            "names a folder",
        ),
    ] {
        let mut args = vec!["bench", "--test", "cpu-contig", "--plot", path.as_str()];
        args.extend(QUICK);
        refused(&args, want);
    }
    let svg_dir = d.join("adir.svg");
    std::fs::create_dir(&svg_dir).unwrap();
    let slash = format!("{}/", svg_dir.display());
    let mut args = vec!["bench", "--test", "cpu-contig", "--plot", slash.as_str()];
    args.extend(QUICK);
    refused(&args, "it is a directory");
}

#[test]
fn picture_names_need_a_name_and_svg_or_png() {
    use ferry_cli::plot::{Format, PlotError};
    assert_eq!(Format::of(Path::new("a.SVG")).unwrap(), Format::Svg);
    assert_eq!(Format::of(Path::new("d/.x.png")).unwrap(), Format::Png);
    for p in [".svg", "out/.PNG"] {
        let e = Format::of(Path::new(p)).unwrap_err();
        assert!(matches!(e, PlotError::NoName(..)), "{p}: {e}");
    }
    assert!(matches!(
        Format::of(Path::new("x.pdf")),
        Err(PlotError::Format(_))
    ));
    // Was: "plot file `.svg` must end in .svg or .png".
    refused(
        &["plot", "r.json", "--plot", ".svg"],
        "has no name before the extension: give e.g. `plot.svg`",
    );
    refused(&["bench", "--gantt", "o/.png"], "e.g. `plot.png`");
}

#[test]
fn list_refuses_unknown_test_names() {
    // Was: `--list --test nope` listed every test and exited 0.
    let e = validate_err(&["bench", "--list", "--test", "nope"]);
    assert!(e.contains("unknown test `nope`"), "{e}");
    refused(
        &["bench", "--list", "--test", "cpu-contig,nope"],
        "unknown test",
    );
    let argv = ["ferry", "bench", "--list", "--test", "cpu-contig"];
    assert!(matches!(validate(argv), Ok(Plan::List)));
}

#[test]
fn an_engine_that_leaves_out_every_named_test_says_so() {
    // Was: "no test can run: no test selected".
    let e = validate_err(&["bench", "--engine", "cuda", "--test", "cpu-contig"]);
    assert!(
        e.contains("--engine cuda leaves out cpu-contig (not a cuda test)"),
        "{e}"
    );
    let e = validate_err(&["bench", "--engine", "cpu", "--test", "cuda-d2d,multi-peer"]);
    assert!(
        e.contains("--engine cpu leaves out cuda-d2d, multi-peer (not a cpu test)"),
        "{e}"
    );
}

#[test]
fn threads_are_1_to_1024_as_for_load() {
    // Was: 0 accepted (undocumented) while `ferry load --threads 0` was refused.
    let e = validate_err(&["bench", "--threads", "0"]);
    assert!(e.contains("0 is not in 1..=1024"), "{e}");
    assert_eq!(plan(&["bench", "--threads", "1024"]).cfg.threads, 1024);
    assert_eq!(plan(&["bench", "--threads", "1"]).cfg.threads, 1);
    assert!(plan(&["bench"]).cfg.threads >= 1);
    let (ok, help, _) = ferry_within(20, &["bench", "--help"]);
    assert!(ok);
    assert!(help.contains("1 to 1024 (default: one per core)"), "{help}");
    assert!(help.contains("1 to 10,000"), "{help}");
}

#[test]
fn samples_and_warmup_have_upper_limits() {
    // Was: 4,294,967,295 samples asked for 34 GB of sample slots and aborted (SIGABRT).
    let e = validate_err(&["bench", "--samples", "4294967295", "--warmup", "0"]);
    assert!(e.contains("not in 1..=10000"), "{e}");
    let e = validate_err(&["bench", "--warmup", "4294967295"]);
    assert!(e.contains("not in 0..=10000"), "{e}");
    let p = plan(&["bench", "--samples", "10000", "--warmup", "10000"]);
    assert_eq!(
        (p.cfg.method.samples, p.cfg.method.warmup),
        (10_000, 10_000)
    );
}

#[test]
fn the_memory_message_names_the_option_to_change() {
    let e = check_memory(
        &plan(&["bench", "--test", "cpu-latency", "--latency-sizes", "1G"]),
        Some(1 << 30),
        None,
    )
    .unwrap_err();
    assert!(
        e.to_string().ends_with("give smaller --latency-sizes"),
        "{e}"
    );
    let e = check_memory(
        &plan(&["bench", "--test", "cpu-contig", "--sizes", "1G"]),
        Some(1 << 30),
        None,
    )
    .unwrap_err();
    assert!(e.to_string().ends_with("give smaller --sizes"), "{e}");
}

#[test]
fn the_cpu_pipeline_is_refused_where_it_cannot_fit() {
    // Measured peak: 3.5x the size (3.59 GiB at 1G); 2x let `--sizes 8G` through on 23 GiB.
    let p = plan(&["bench", "--test", "pipeline", "--sizes", "8G"]);
    let e = check_memory(&p, Some(23 << 30), None).unwrap_err();
    assert!(e.to_string().contains("needs at least 28G"), "{e}");
    let p = plan(&["bench", "--test", "pipeline", "--sizes", "4G"]);
    check_memory(&p, Some(23 << 30), None).unwrap();
}

/// A saved report with one bandwidth row of cpu-contig: `size` bytes, `median` GB/s.
fn report(dir: &Path, size: u64, median: &str) -> PathBuf {
    let p = dir.join(format!("r{size}-{median}.json"));
    let text = format!(
        r#"{{"schema": "ferry-bench/1", "results": [{{"test": "cpu-contig", "kind": "bandwidth",
        "size_bytes": {size}, "series": [{{"name": "ferry", "role": "ferry", "median": {median}}}]}}]}}"#
    );
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn plots_never_spin_on_endless_axes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let svg = d.join("o.svg");
    let png = d.join("o.png");
    // Was: 100% CPU forever (log2(0) = -inf on the x axis; the y axis to f64::MAX * 1.08).
    let e = refused(
        &["plot", s(&report(d, 0, "1.0")), "--plot", s(&svg)],
        "result 1 (test `cpu-contig`): `size_bytes` is 0",
    );
    assert!(e.contains("at least 1 byte"), "{e}");
    let none = d.join("none.json");
    std::fs::write(
        &none,
        r#"{"schema": "ferry-bench/1", "results": [{"test": "cpu-latency", "kind": "latency", "size_bytes": 4, "series": []}]}"#,
    )
    .unwrap();
    refused(&["plot", s(&none), "--plot", s(&svg)], "no series");
    for median in ["1.7976931348623157e308", "5e-324", "-1e308"] {
        let r = report(d, 4096, median);
        let (ok, _, err) = ferry_within(60, &["plot", s(&r), "--plot", s(&svg), "--plot", s(&png)]);
        assert!(ok, "median {median}: {err}");
    }
}
