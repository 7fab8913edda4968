//! Random argument vectors through `ferry`'s parser and pre-run checks
//! (`ferry_cli::args::validate`): never a panic, and an accepted bench plan is sane. The same
//! property as the fuzz target `fuzz/fuzz_targets/cli_argv.rs`, for CI (stable, no libFuzzer).

use ferry_cli::args::{check_memory, validate, Plan, MAX_THREADS};
use proptest::prelude::*;

const WORDS: &[&str] = &[
    "info",
    "bench",
    "plot",
    "help",
    "--json",
    "--list",
    "--test",
    "--engine",
    "--sizes",
    "--latency-sizes",
    "--threads",
    "--samples",
    "--warmup",
    "--plot",
    "--trace",
    "--gantt",
    "--verbose",
    "--help",
    "-h",
    "--version",
    "--",
    "cpu",
    "cuda",
    "all",
    "cpu-contig",
    "cpu-tile",
    "cpu-transpose-f64",
    "cpu-latency",
    "file-read",
    "pipeline",
    "cuda-h2d-pinned",
    "cuda-scatter",
    "multi-peer",
    "cpu-contig,",
    ",",
    "",
    "4K",
    "4K..1G",
    "1T",
    "16G",
    "-4K",
    "0",
    "-1",
    "1025",
    "x.svg",
    "x.png",
    "x.jpg",
    "x.json",
    "/nonexistent/x.png",
    "/dev/zero",
    "--sizes=4K,1M",
    "--test=cpu-contig",
    "--threads=0",
];

fn arg() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(WORDS).prop_map(str::to_string),
        1 => any::<String>(),
        1 => "[-=.,0-9KMGTk]{0,12}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_argument_vector_is_checked_without_panicking(
        args in proptest::collection::vec(arg(), 0..12),
        host in proptest::option::of(any::<u64>()),
        device in proptest::option::of(any::<u64>()),
    ) {
        let argv: Vec<String> = std::iter::once("ferry".to_string()).chain(args).collect();
        if let Ok(Plan::Bench(plan)) = validate(&argv) {
            prop_assert!(!plan.cfg.tests.is_empty());
            prop_assert!(plan.cfg.method.samples >= 1);
            prop_assert!(plan.cfg.threads <= MAX_THREADS.max(ferry::CpuConfig::default().threads));
            for t in &plan.cfg.tests {
                let sizes = plan.sizes_of(t);
                prop_assert!(!sizes.is_empty() && sizes.iter().all(|&s| s > 0));
            }
            let _ = check_memory(&plan, host, device);
        }
    }
}
