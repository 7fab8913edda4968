//! Fuzz target: whole argument vectors through `ferry`'s parser and every check that runs
//! before work starts (`ferry_cli::args::validate`, then the pure memory check with arbitrary
//! amounts of memory). Nothing is measured or written. Never panics; an accepted bench plan
//! has at least one test, at least one sample, at most `MAX_THREADS` threads, and non-empty,
//! positive size sweeps; the memory check refuses exactly when a test's largest size needs
//! more than the amount given.
#![no_main]

use arbitrary::Arbitrary;
use ferry_cli::args::{check_memory, memory_needed, validate, Plan, MAX_THREADS};
use libfuzzer_sys::fuzz_target;

/// Every subcommand, flag and value form the CLI knows, so the fuzzer reaches deep checks.
const WORDS: &[&str] = &[
    "info", "bench", "plot", "help", "--json", "--list", "--test", "--engine", "--sizes",
    "--latency-sizes", "--threads", "--samples", "--warmup", "--plot", "--trace", "--gantt",
    "--help", "-h", "--version", "-V", "--", "cpu", "cuda", "all", "cpu-contig", "cpu-tile",
    "cpu-transpose-f64", "cpu-latency", "file-read", "pipeline", "cuda-h2d-pinned",
    "cuda-scatter", "multi-peer", "cpu-contig,", ",", "", "4K", "4K..1G", "1T", "16G", "-4K",
    "0", "-1", "1025", "x.svg", "x.png", "x.jpg", "x.json", "/nonexistent/x.png", "/dev/zero",
    "--sizes=4K,1M", "--test=cpu-contig", "--threads=0",
];

#[derive(Arbitrary, Debug)]
enum Arg {
    Word(u8),
    Free(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    args: Vec<Arg>,
    host: Option<u64>,
    device: Option<u64>,
}

fuzz_target!(|input: Input| {
    let argv: Vec<String> = std::iter::once("ferry".to_string())
        .chain(input.args.iter().take(24).map(|a| match a {
            Arg::Word(i) => WORDS[*i as usize % WORDS.len()].to_string(),
            Arg::Free(s) => s.clone(),
        }))
        .collect();
    let Ok(Plan::Bench(plan)) = validate(&argv) else { return };
    let cfg = &plan.cfg;
    assert!(!cfg.tests.is_empty(), "{argv:?}");
    assert!(cfg.method.samples >= 1, "{argv:?}");
    assert!(cfg.threads <= MAX_THREADS.max(ferry::CpuConfig::default().threads), "{argv:?}");
    let mut fits = true;
    for t in &cfg.tests {
        let sizes = plan.sizes_of(t);
        assert!(!sizes.is_empty() && sizes.iter().all(|&s| s > 0), "{argv:?}");
        for s in sizes {
            let (h, d) = memory_needed(t, s).unwrap_or((u64::MAX, u64::MAX));
            fits &= input.host.is_none_or(|a| h <= a);
            fits &= !t.needs.is_gpu() || input.device.is_none_or(|a| d <= a);
        }
    }
    let checked = check_memory(&plan, input.host, input.device);
    assert_eq!(checked.is_ok(), fits, "{argv:?}: {checked:?}");
});
