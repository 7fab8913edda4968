//! End-to-end tests of the `ferry` binary: arguments, JSON schema, plots. CPU only.

use std::path::Path;
use std::process::{Command, Output};

fn ferry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .output()
        .expect("run ferry")
}

/// A fresh temp folder, removed (with what the test wrote in it) when dropped.
fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ferry-cli-test-")
        .tempdir()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A tiny bench: two bandwidth tests, one latency test, small sizes, few samples.
fn tiny(json: &Path, plots: &[&Path]) -> Output {
    let mut args = vec![
        "bench",
        "--test",
        "cpu-contig,cpu-tile,cpu-latency",
        "--sizes",
        "4K,64K",
        "--latency-sizes",
        "4,4K",
        "--samples",
        "2",
        "--warmup",
        "1",
        "--threads",
        "2",
        "--json",
        json.to_str().unwrap(),
    ];
    for p in plots {
        args.push("--plot");
        args.push(p.to_str().unwrap());
    }
    let o = ferry(&args);
    assert!(o.status.success(), "ferry bench failed: {}", stderr(&o));
    o
}

#[test]
fn unknown_test_lists_valid_names() {
    let o = ferry(&["bench", "--test", "cpu-contig,bogus"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("unknown test `bogus`"), "{e}");
    for name in [
        "cpu-contig",
        "cpu-tile",
        "cpu-transpose-f32",
        "cpu-latency",
        "cuda-h2d-pinned",
    ] {
        assert!(e.contains(name), "{e} lacks {name}");
    }
}

#[test]
fn bad_sizes_and_engine_are_refused_clearly() {
    for (args, want) in [
        (vec!["bench", "--sizes", "4Q"], "bad size `4Q`"),
        (
            vec!["bench", "--sizes", "1G..4K"],
            "start is larger than the end",
        ),
        (vec!["bench", "--sizes", "0"], "is zero"),
        (
            vec!["bench", "--engine", "tpu"],
            "valid engines: cpu, cuda, all",
        ),
        (vec!["bench", "--samples", "0"], "--samples"),
        (vec!["bench", "--plot", "x.jpg"], "must end in .svg or .png"),
    ] {
        let o = ferry(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn list_shows_every_test_and_gpu_reason() {
    let o = ferry(&["bench", "--list"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    for t in ferry_cli::bench::registry() {
        assert!(out.contains(t.name), "{out} lacks {}", t.name);
    }
    if let Err(why) = ferry_cli::bench::cuda::available() {
        assert!(out.contains(&format!("unavailable: {why}")), "{out}");
    }
}

#[test]
fn help_prints_the_method() {
    let o = ferry(&["bench", "--help"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("Method:") && out.contains("median") && out.contains("10^9"),
        "{out}"
    );
}

#[test]
fn info_json_has_cpu_and_gpu_sections() {
    let o = ferry(&["info", "--json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["cpu"]["cores"].as_u64().unwrap() >= 1);
    assert!(v["cpu"]["default_threads"].as_u64().unwrap() >= 1);
    assert!(v["cpu"]["inline_bytes"].is_u64() && v["cpu"]["chunk_bytes"].is_u64());
    assert!(v["cpu"]["stream_bytes"].is_u64());
    assert!(v["cpu"]["llc_bytes"].is_u64() || v["cpu"]["llc_bytes"].is_null());
    assert!(v["gpu"]["cuda_engine_in_build"].is_boolean());
}

#[test]
fn json_report_follows_the_schema() {
    let dir = tmpdir();
    let json = dir.path().join("tiny.json");
    let o = tiny(&json, &[]);
    if ferry_cli::bench::cuda::available().is_err() {
        let e = stderr(&o);
        assert_eq!(
            e.lines().filter(|l| l.contains("GPU test")).count(),
            0,
            "GPU not selected, no line expected: {e}"
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["schema"], "ferry-bench/1");
    assert!(v["started_unix_s"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(v["method"]["samples"], 2);
    assert_eq!(v["method"]["warmup"], 1);
    assert_eq!(v["method"]["statistic"], "median");
    assert_eq!(v["cpu_engine"]["threads"], 2);
    let results = v["results"].as_array().unwrap();
    // 2 bandwidth tests x 2 sizes + 1 latency test x 2 sizes.
    assert_eq!(results.len(), 6);
    for r in results {
        let kind = r["kind"].as_str().unwrap();
        assert_eq!(r["unit"], if kind == "bandwidth" { "GB/s" } else { "us" });
        assert!(r["size_bytes"].as_u64().unwrap() >= r["payload_bytes"].as_u64().unwrap());
        assert!(r["ratio"].as_f64().unwrap() > 0.0);
        assert!(r["link_limit_fraction"].is_null());
        let series = r["series"].as_array().unwrap();
        assert_eq!(series.iter().filter(|s| s["role"] == "ferry").count(), 1);
        assert!(series
            .iter()
            .any(|s| s["name"] == r["best_baseline"] && s["role"] == "baseline"));
        for s in series {
            let (med, worst, best) = (
                s["median"].as_f64().unwrap(),
                s["worst"].as_f64().unwrap(),
                s["best"].as_f64().unwrap(),
            );
            assert!(med > 0.0 && s["verified"] == true);
            if kind == "bandwidth" {
                assert!(worst <= med && med <= best);
            } else {
                assert!(best <= med && med <= worst);
            }
            let t = &s["timing"];
            assert_eq!(t["samples_s"].as_array().unwrap().len(), 2);
            // CPU rows are timed on the host; GPU rows may say "cuda-events".
            assert_eq!(s["clock"], "host");
            assert!(t["reps"].as_u64().unwrap() >= 1);
        }
    }
    let sizes: Vec<u64> = results
        .iter()
        .filter(|r| r["test"] == "cpu-contig")
        .map(|r| r["size_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [4096, 65536]);
}

#[test]
fn plots_are_valid_svg_and_png_with_one_series_per_path() {
    let dir = tmpdir();
    let (json, svg, png) = (
        dir.path().join("p.json"),
        dir.path().join("p.svg"),
        dir.path().join("p.png"),
    );
    tiny(&json, &[svg.as_path(), png.as_path()]);
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("valid SVG/XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    // Legend: ferry and each named baseline for every test, latency included; one panel per
    // family, titled.
    for label in [
        "cpu-contig: ferry",
        "cpu-contig: copy_from_slice",
        "cpu-tile: ferry",
        "cpu-latency: ferry",
        "cpu-latency: copy_from_slice",
        "CPU: GB/s",
        "latency: us per copy, lower is better",
    ] {
        assert_eq!(
            texts.iter().filter(|t| **t == label).count(),
            1,
            "{label} in {texts:?}"
        );
    }
    assert!(!texts.iter().any(|t| t.contains("better baseline")));
    assert!(texts
        .iter()
        .any(|t| t.starts_with("ferry bench ") && t.contains("commit")));
    // Axis labels with K suffixes.
    assert!(texts.contains(&"4K") && texts.contains(&"64K"), "{texts:?}");
    // 4 data lines + 4 legend samples (polylines or paths).
    let lines = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline") || n.has_tag_name("path"))
        .count();
    assert!(lines >= 8, "{lines} line elements");
    let png_bytes = std::fs::read(&png).unwrap();
    assert_eq!(&png_bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert!(png_bytes.len() > 10_000);
}

#[test]
fn gpu_only_run_says_why_and_fails() {
    if ferry_cli::bench::cuda::available().is_ok() {
        eprintln!("skipped: a CUDA engine is present");
        return;
    }
    let o = ferry(&["bench", "--engine", "cuda"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert_eq!(
        e.lines()
            .filter(|l| l.contains("GPU test(s) left out"))
            .count(),
        1,
        "{e}"
    );
    assert!(e.contains("no test can run"), "{e}");
}

#[test]
fn new_gpu_tests_are_selectable_by_name() {
    let names = [
        "cuda-h2d-mapped",
        "cuda-d2h-mapped",
        "cuda-transpose",
        "cuda-transpose-h2d",
        "cuda-transpose-bf16",
        "cuda-transpose-h2d-bf16",
        "cuda-transpose-batched",
    ];
    let o = ferry(&["bench", "--list"]);
    let out = String::from_utf8_lossy(&o.stdout);
    for n in names {
        assert!(out.contains(n), "{out} lacks {n}");
    }
    let sel = ferry_cli::bench::select(
        Some("cuda-h2d-mapped,cuda-d2h-mapped,cuda-transpose,cuda-transpose-h2d,cuda-transpose-bf16,cuda-transpose-h2d-bf16,cuda-transpose-batched"),
        ferry_cli::bench::EngineSel::Cuda,
    )
    .unwrap();
    let mut got: Vec<&str> = sel.run.iter().map(|t| t.name).collect();
    got.extend(sel.skipped.iter().map(|(n, _)| n.as_str()));
    got.sort_unstable();
    let mut want = names.to_vec();
    want.sort_unstable();
    assert_eq!(got, want);
}

#[test]
fn help_prints_the_event_timing_method() {
    let o = ferry(&["bench", "--help"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    for want in ["CUDA", "events", "cuStreamWaitValue32", "latch", "median"] {
        assert!(out.contains(want), "--help lacks {want}: {out}");
    }
}

#[test]
fn default_run_prints_one_line_about_gpu_tests() {
    if ferry_cli::bench::cuda::available().is_ok() {
        eprintln!("skipped: a CUDA engine is present");
        return;
    }
    let dir = tmpdir();
    let json = dir.path().join("d.json");
    let o = ferry(&[
        "bench",
        "--test",
        "cpu-contig,cuda-d2d,cuda-tile",
        "--sizes",
        "4K",
        "--samples",
        "1",
        "--warmup",
        "0",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert_eq!(
        e.lines()
            .filter(|l| l.contains("GPU test(s) left out"))
            .count(),
        1,
        "{e}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["skipped"].as_array().unwrap().len(), 2);
    assert_eq!(v["results"].as_array().unwrap().len(), 1);
}

#[test]
fn saved_json_is_replotted_and_foreign_json_refused() {
    let dir = tmpdir();
    let (json, svg) = (dir.path().join("r.json"), dir.path().join("r.svg"));
    tiny(&json, &[]);
    let o = ferry(&[
        "plot",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("valid SVG/XML");
    let texts: Vec<&str> = doc
        .descendants()
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    assert!(texts.contains(&"cpu-contig: ferry"), "{texts:?}");
    assert!(texts.contains(&"cpu-contig: copy_from_slice"), "{texts:?}");
    // A JSON file that is not a ferry bench report: a clear error, no file written.
    let other = dir.path().join("other.json");
    std::fs::write(&other, "{\"results\": []}").unwrap();
    let out = dir.path().join("other.svg");
    let o = ferry(&[
        "plot",
        other.to_str().unwrap(),
        "--plot",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("ferry-bench/1"), "{}", stderr(&o));
    assert!(!out.exists());
}

#[test]
fn bad_ferry_env_values_are_refused_clearly() {
    for (var, value) in [
        ("FERRY_STAGING_CHUNK", "1M"),
        ("FERRY_STAGING_NT", "yes"),
        ("FERRY_FILE_DIRECT", "2"),
        ("FERRY_FILE_THREADS", "four"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["bench", "--test", "cpu-contig", "--sizes", "4K"])
            .env(var, value)
            .output()
            .expect("run ferry");
        assert!(!o.status.success(), "{var}={value} was accepted");
        let e = stderr(&o);
        assert!(e.contains(&format!("${var}=\"{value}\"")), "{var}: {e}");
    }
}

#[test]
fn valid_ferry_file_values_are_accepted() {
    let o = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "--test", "file-read", "--sizes", "256K"])
        .args(["--samples", "1", "--warmup", "0", "--threads", "2"])
        .env("FERRY_FILE_CHUNK", "65536")
        .env("FERRY_FILE_DIRECT", "0")
        .output()
        .expect("run ferry");
    assert!(o.status.success(), "{}", stderr(&o));
}
