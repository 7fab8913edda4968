//! Every bad input of issue 15 gets a clear message and a non-zero exit before any work
//! starts. None of these allocates much memory or runs a measurement longer than a moment.

use ferry_cli::args::{check_memory, check_temp_space, validate, ArgError, Plan};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn ferry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .output()
        .expect("run ferry")
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
    // Refused up front: no results table, and quickly.
    assert!(o.stdout.is_empty(), "{args:?} printed results");
    assert!(t0.elapsed() < Duration::from_secs(20), "{args:?} ran");
    e
}

fn plan(args: &[&str]) -> ferry_cli::args::BenchPlan {
    let argv = std::iter::once("ferry").chain(args.iter().copied());
    match validate(argv) {
        Ok(Plan::Bench(p)) => *p,
        other => panic!("{args:?}: {other:?}"),
    }
}

#[test]
fn sizes_beyond_host_memory_are_refused_before_allocating() {
    // 64T needs 128T: beyond any machine's MemAvailable (was: abort on allocation, rc 134).
    let e = refused(
        &["bench", "--test", "file-read", "--sizes", "64T"],
        "needs at least 128T of host memory",
    );
    assert!(e.contains("available"), "{e}");
    refused(
        &["bench", "--test", "cpu-contig", "--sizes", "4K,64T"],
        "cpu-contig at 64T",
    );
}

#[test]
fn memory_check_refuses_what_does_not_fit() {
    // `--sizes 16G` on a machine with 24 GiB available (was: OOM-killed, 16 GiB left in /tmp).
    let p = plan(&["bench", "--test", "file-read", "--sizes", "16G"]);
    let e = check_memory(&p, Some(24 << 30), None).unwrap_err();
    assert!(matches!(e, ArgError::Memory { .. }), "{e}");
    assert!(e.to_string().contains("32G"), "{e}");
    assert!(check_memory(&p, Some(64 << 30), None).is_ok());
    assert!(
        check_memory(&p, None, None).is_ok(),
        "unknown memory: not checked"
    );
    // The default sweep of every CPU test fits in 4 GiB.
    let p = plan(&["bench", "--engine", "cpu"]);
    assert!(check_memory(&p, Some(4 << 30), None).is_ok());
}

#[test]
fn file_tests_larger_than_the_temp_dir_are_refused() {
    let p = plan(&["bench", "--test", "file-read", "--sizes", "1M,8G"]);
    let dir = std::path::Path::new("/tmp");
    let e = check_temp_space(&p, dir, Some(4 << 30)).unwrap_err();
    assert!(
        matches!(e, ArgError::Space { size, .. } if size == 8 << 30),
        "{e}"
    );
    assert!(
        e.to_string().contains("/tmp") && e.to_string().contains("TMPDIR"),
        "{e}"
    );
    assert!(check_temp_space(&p, dir, Some(16 << 30)).is_ok());
    assert!(
        check_temp_space(&p, dir, None).is_ok(),
        "unknown space: not checked"
    );
    // Tests that write no file are not concerned.
    let p = plan(&["bench", "--test", "cpu-contig", "--sizes", "8G"]);
    assert!(check_temp_space(&p, dir, Some(1)).is_ok());
    // And through the command line: a size that fits in memory nowhere is refused first.
    refused(&["bench", "--test", "file-read", "--sizes", "64T"], "64T");
}

#[test]
fn replot_refuses_non_regular_files() {
    // Was: hangs reading /dev/zero for ever.
    refused(
        &["plot", "/dev/zero", "--plot", "x.svg"],
        "not a regular file",
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    refused(&["plot", d, "--plot", "x.svg"], "not a regular file");
}

#[test]
fn unwritable_outputs_are_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let base = ["bench", "--test", "cpu-contig", "--sizes", "4K"];
    for (flag, path, want) in [
        (
            "--json",
            "/nonexistent/x.json".to_string(),
            "folder /nonexistent does not exist",
        ),
        (
            "--plot",
            "/nonexistent/x.png".to_string(),
            "cannot write /nonexistent/x.png",
        ),
        (
            "--trace",
            "/nonexistent/t.json".to_string(),
            "cannot write /nonexistent/t.json",
        ),
        (
            "--gantt",
            "/nonexistent/g.svg".to_string(),
            "cannot write /nonexistent/g.svg",
        ),
        ("--json", d.clone(), "is a directory"),
    ] {
        let mut args = base.to_vec();
        args.extend([flag, path.as_str()]);
        refused(&args, want);
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "left files"
    );
}

/// Issue 33: a device that takes no bytes (`/dev/full`) is found by a test write before the
/// run, not after the whole bench (which is why the default sweep is used here: it would take
/// minutes).
#[test]
fn an_output_that_cannot_take_a_write_is_refused_before_the_run() {
    if !std::path::Path::new("/dev/full").exists() {
        println!("skipped: no /dev/full here");
        return;
    }
    for flag in ["--json", "--trace"] {
        let e = refused(
            &["bench", "--test", "cpu-contig,pipeline", flag, "/dev/full"],
            "a test write failed",
        );
        assert!(e.contains("/dev/full"), "{e}");
    }
}

#[test]
fn a_run_with_every_size_left_out_fails() {
    // 4 bytes is less than one f64: the only size is left out (was: exit 0, no results).
    let o = ferry(&[
        "bench",
        "--test",
        "cpu-transpose-f64",
        "--sizes",
        "4",
        "--samples",
        "1",
        "--warmup",
        "0",
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains("every size was left out") && e.contains("8-byte"),
        "{e}"
    );
}

#[test]
fn negative_sizes_and_counts_get_a_clear_message() {
    // Was: "unexpected argument '-4' found".
    refused(
        &["bench", "--sizes", "-4K"],
        "is negative: sizes must be positive",
    );
    refused(&["bench", "--latency-sizes", "-4"], "is negative");
    refused(&["bench", "--threads", "-1"], "is not in 1..=1024");
    refused(&["bench", "--threads", "100000"], "is not in 1..=1024");
    refused(&["bench", "--samples", "-1"], "invalid value '-1'");
    // Was: an allocation of 34 GB of sample slots, aborted (SIGABRT).
    refused(
        &["bench", "--samples", "4294967295", "--warmup", "0"],
        "is not in 1..=10000",
    );
    refused(&["bench", "--warmup", "10001"], "is not in 0..=10000");
    let dir = tempfile::tempdir().unwrap();
    let same = dir.path().join("same.json");
    let same = same.to_str().unwrap();
    refused(
        &[
            "bench", "--test", "pipeline", "--json", same, "--trace", same,
        ],
        "each output needs its own file",
    );
    // Was: the check opened the FIFO for writing and waited for a reader forever.
    let fifo = dir.path().join("fifo.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    refused(
        &[
            "bench",
            "--test",
            "cpu-contig",
            "--json",
            fifo.to_str().unwrap(),
        ],
        "a FIFO with no reader",
    );
    // Was: accepted, and the write failed after the whole run.
    let slash = format!("{}/", dir.path().join("plot.svg").display());
    refused(&["bench", "--plot", &slash], "names a folder");
}

#[test]
fn empty_test_items_are_ignored_and_only_commas_refused() {
    // Was: unknown test ``.
    let p = plan(&["bench", "--test", "cpu-contig,", "--sizes", "4K"]);
    assert_eq!(p.cfg.tests.len(), 1);
    let p = plan(&["bench", "--test", " ,cpu-tile, ,cpu-contig"]);
    assert_eq!(p.cfg.tests.len(), 2);
    refused(&["bench", "--test", ","], "--test names no test");
    refused(&["bench", "--test", ""], "--test names no test");
}

#[test]
fn bad_plot_formats_are_refused_for_every_picture() {
    refused(&["bench", "--gantt", "g.jpg"], "must end in .svg or .png");
    refused(
        &["plot", "r.json", "--plot", "x.pdf"],
        "must end in .svg or .png",
    );
}

#[test]
fn the_file_test_leaves_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "bench",
            "--test",
            "file-read",
            "--sizes",
            "4K",
            "--samples",
            "1",
        ])
        .args(["--warmup", "0"])
        .env("TMPDIR", dir.path())
        .output()
        .expect("run ferry");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "left files"
    );
}

#[test]
fn info_json_is_plain_and_text_shows_all_of_it() {
    let o = ferry(&["info", "--json"]);
    assert!(o.status.success());
    let json = String::from_utf8_lossy(&o.stdout);
    assert!(
        !json.contains("\"Err\"") && !json.contains("\"Ok\""),
        "{json}"
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(v["gpu"]["gds"]["used"].is_boolean(), "{json}");
    assert!(v["gpu"]["nvidia_fs"].is_boolean(), "{json}");
    let o = ferry(&["info"]);
    let text = String::from_utf8_lossy(&o.stdout);
    for want in [
        "GPUDirect Storage",
        "nvidia-fs module",
        "NCCL",
        "CUDA engine",
        "cores",
    ] {
        assert!(text.contains(want), "{text} lacks {want}");
    }
    if let Some(why) = v["gpu"]["gds"]["reason"].as_str() {
        assert!(text.contains(why), "{text} lacks {why}");
    }
    assert!(text.contains("libcufile"), "{text}");
    let t = v["gpu"]["gds"]["transport"].as_str().unwrap();
    assert!(
        text.contains(&format!("GPUDirect Storage    {t} ")),
        "{text}"
    );
}

#[test]
fn list_columns_are_aligned() {
    let o = ferry(&["bench", "--list"]);
    let out = String::from_utf8_lossy(&o.stdout);
    let firsts: Vec<&str> = out.lines().step_by(2).collect();
    let col = |l: &str, word: &str| l.find(word);
    let sizes: Vec<_> = firsts.iter().map(|l| col(l, "sizes ")).collect();
    assert!(sizes.iter().all(|c| c.is_some() && *c == sizes[0]), "{out}");
}

#[test]
fn report_has_header_reading_and_summary_and_method_only_when_verbose() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--test",
            "cpu-contig,cpu-latency",
            "--sizes",
            "4K",
            "--latency-sizes",
            "4",
            "--samples",
            "1",
            "--warmup",
            "0",
        ];
        args.extend(extra);
        let o = ferry(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let out = run(&[]);
    let first = out.lines().next().unwrap();
    for want in ["(commit ", " on ", "CPU: ", "GPU: "] {
        assert!(first.contains(want), "{first} lacks {want}");
    }
    assert!(
        out.contains("Reading:") && out.contains("4 KiB aliasing"),
        "{out}"
    );
    assert!(
        !out.contains("Method:"),
        "method printed without --verbose: {out}"
    );
    let summary = out.split("\nsummary").nth(1).expect("a summary");
    assert!(
        summary.contains("CPU") && summary.contains("latency"),
        "{summary}"
    );
    assert!(run(&["--verbose"]).contains("Method:"));
}

#[test]
fn a_picture_that_cannot_be_written_is_reported_plainly_by_the_library() {
    let plot = ferry_cli::plot::Plot {
        title: "t".into(),
        rows: vec![ferry_cli::plot::PlotRow {
            test: "cpu-contig".into(),
            latency: false,
            size_bytes: 4096,
            series: vec![ferry_cli::plot::PlotSeries {
                name: "ferry".into(),
                ferry: true,
                median: 1.0,
                worst: 0.9,
                best: 1.1,
            }],
        }],
    };
    let e = plot.write(std::path::Path::new("/nonexistent/x.png"));
    let msg = e.unwrap_err().to_string();
    assert!(msg.contains("folder /nonexistent does not exist"), "{msg}");
    assert!(!msg.contains("Os {"), "{msg}");
}

#[test]
fn load_and_save_refuse_bad_input_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    let fe = ferry::file::FileEngine::new(ferry::file::FileConfig::new().threads(1)).unwrap();
    let w = [0u8; 16];
    let t = ferry::checkpoint::SaveTensor::new("w", ferry::checkpoint::Dtype::F32, &[4], &w);
    ferry::checkpoint::save(&fe, &p, &[t], &Default::default()).unwrap();
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
    // A folder is a checkpoint's (its index, else its one safetensors file): one holding
    // none is refused saying so.
    let none = dir.path().join("none");
    std::fs::create_dir(&none).unwrap();
    refused(
        &["load", none.to_str().unwrap(), "--device", "host"],
        "holds no checkpoint",
    );
    // Was: 0 bytes loaded, and --verify agreed. /proc's files say 0 bytes and hold more.
    if std::fs::metadata("/proc/self/status").is_ok_and(|m| m.len() == 0) {
        for dev in ["host", "pinned"] {
            refused(
                &["load", "/proc/self/status", "--device", dev, "--verify"],
                "says it holds 0 bytes but has content",
            );
        }
    }
    // An empty regular file still loads (0 bytes).
    let empty = dir.path().join("empty.bin");
    std::fs::write(&empty, b"").unwrap();
    let o = ferry(&[
        "load",
        empty.to_str().unwrap(),
        "--device",
        "host",
        "--verify",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    refused(
        &["load", r, "--device", "host", "--offset", "20000"],
        "past the end",
    );
    // Issue 33: at the end it loaded 0 bytes and exited 0, where `--length 0` is refused.
    let end = std::fs::metadata(r).unwrap().len().to_string();
    refused(
        &["load", r, "--device", "host", "--offset", &end],
        "is the end of the file",
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
        "is not cuda, cuda:N, host or pinned",
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
    // Was: nothing selected, nothing loaded, exit 0.
    refused(
        &["load", p, "--device", "host", "--select", ","],
        "names no tensor",
    );
    refused(
        &["load", p, "--device", "host", "--select", ""],
        "names no tensor",
    );
    refused(
        &["save", r, "/no/such/dir/out.bin", "--device", "host"],
        "does not exist",
    );
    if ferry::cuda::probe().driver.is_err() {
        refused(&["load", r], "use --device host");
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
