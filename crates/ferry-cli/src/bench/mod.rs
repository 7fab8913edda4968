//! `ferry bench`: a registry of tests and one measurement core shared by all of them.
//!
//! - A [`TestInfo`] names a test, says what it needs ([`Needs`]), whether it measures
//!   bandwidth or latency ([`Kind`]) and its default size sweep.
//! - [`measure`](fn@measure) is the only timing loop: warm-up calls, one calibration call, then samples of
//!   `reps` back-to-back calls each (reps chosen so a sample lasts at least
//!   [`Method::min_sample_s`]); the per-call time of each sample is kept, and the median, min
//!   and max reported.
//! - Each backend module (`cpu`, later `cuda`) turns (test, size) into a [`Row`]: ferry and its
//!   baselines measured in the same run on the same buffers, each result verified afterwards.
//!
//! Files: this one holds the registry, the selection and the run loop; `measure.rs` the timing
//! loop and its statistics, `row.rs` the [`Series`] and [`Row`] types, `report.rs` what
//! `--json` writes.

pub mod cpu;
pub mod cuda;
pub mod file;
pub mod ipc;
pub mod multi;
pub mod pipeline;

mod ctx;
mod data;
mod measure;
mod report;
mod row;

pub use measure::{
    last_in_turns, measure, measure_interleaved, measure_pair, measure_with, Calls, Method, Timing,
};
pub use report::{CpuEngineReport, Host, MethodReport, Report, Skipped};
pub use row::{CallerView, Clock, Role, Row, Series};

use serde::Serialize;
use thiserror::Error;

/// The method, as printed in `--help` and in the report header.
pub const METHOD: &str = "\
Method: for every test and size, ferry and each baseline run on the same buffers, one after
the other, in the same process. Buffers are allocated and written (every page touched) before
timing, so no first-touch page fault is timed. Each series runs W warm-up calls, one
calibration call, then S samples; a sample is R back-to-back calls timed with a monotonic clock
(R chosen so a sample lasts >= 1 ms; R = 1 for large copies), recorded as time per call. Reported:
median (min..max) over the samples. GB/s = 10^9 bytes/s of payload (bytes copied, not bytes
touched). After each series the destination is compared with the source / a reference; a
mismatch fails the run. CPU rows, file reads into host memory and the cuda-blocks rows check
each series first (poisoned destination, one call, compared), then take the samples in turns:
sample i of every series in one round, each round starting one series further on, so that a
drift of the machine falls on all alike; a sample of R > 1 calls follows one untimed call of its
own series (none pays for the caches the series before it left). Ratio: ferry / better baseline (bandwidth), ferry time / better
baseline time (latency). Small sizes are cache-resident: they show the per-call cost, not DRAM.
GPU tests: ferry's CUDA engine and raw driver calls (cuMemcpy*Async, cuMemcpy2DAsync, one
cuMemcpyAsync per segment, a plain SM kernel launch) on the same buffers; a call is a batch of
copies released together (8 below 16 MiB, else 1). GPU bandwidth rows are timed with CUDA
events, as nvbandwidth does: on the stream that does the copies, a cuStreamWaitValue32 latch on
a flag in mapped host memory, the start event, the batch (ferry: its requests submitted on the
engine's stream for the direction; raw: driver calls on the raw copier's stream), the end
event; then the host releases the latch, so submission and queueing are not timed, only the
GPU's work from start to end event (cuda-bidir: both streams behind one latch, from the
earliest start to the latest end). The table's clock column says events for these.
Host-clock rows (clock: host): the pageable tests (ferry's staged path runs on CPU threads,
and the driver's pageable copies may wait for the stream, so no latch can hold them),
cuda-transpose* and cuda-scatter (their raw baselines make thousands of driver calls, more
than a stream's queue holds behind a closed latch), the latency tests (submit+wait is what
they measure), and any row where the latch could not be set up; they are timed on the host
around submit..completion of the batch.
Host-clock series wait by spinning (raw: the driver's default synchronize; ferry:
WaitMode::Spin), so the rows compare copies, not sleep/wake-up costs; cuda-latency shows
ferry's default wait (WaitMode::Auto). Beside them, the single-copy GPU rows (h2d/d2h pinned,
pageable and mapped, d2d) report the caller's view: one copy per call through the public API with
the default config (CudaConfig::from_env(0)), host clock around scope + copy + wait, with its
own ratio to a raw cuMemcpyAsync + cuStreamSynchronize on the same buffers timed the same way;
and each series's process CPU seconds per GB moved (getrusage RUSAGE_SELF over the timed
calls). cuda-wait-cpu reports the waiting thread's CPU time (RUSAGE_THREAD around each wait)
as a share of the wait's wall time. The link column is ferry's figure over PCIe generation x width
as the driver and sysfs report it (both directions: twice that).";

/// Errors of `ferry bench`.
#[derive(Debug, Error)]
pub enum BenchError {
    /// `--test` named a test that does not exist.
    #[error("unknown test `{name}`; valid tests: {valid}")]
    UnknownTest {
        /// The name given.
        name: String,
        /// Every valid name, comma separated.
        valid: String,
    },
    /// `--engine` named an engine that does not exist.
    #[error("unknown engine `{0}`; valid engines: cpu, cuda, all")]
    UnknownEngine(String),
    /// `--test` named no test (only commas or spaces).
    #[error("--test names no test; valid tests: {0}")]
    NoTestNamed(String),
    /// Nothing selected can run on this machine.
    #[error("no test can run: {0}")]
    NothingToRun(String),
    /// The engine refused or failed a copy.
    #[error("{test} {series} at {size}: the engine failed: {message}")]
    Engine {
        /// Test name.
        test: String,
        /// Series name.
        series: String,
        /// Size label.
        size: String,
        /// The engine's error text.
        message: String,
    },
    /// A result did not match the reference after the run.
    #[error("{test} {series} at {size}: wrong result at byte {offset} of the destination")]
    Verify {
        /// Test name.
        test: String,
        /// Series name.
        series: String,
        /// Size label.
        size: String,
        /// First differing byte.
        offset: usize,
    },
    /// A size cannot be set up for this test.
    #[error("{test}: size {size} cannot be used: {why}")]
    BadSize {
        /// Test name.
        test: String,
        /// Size label.
        size: String,
        /// Why.
        why: String,
    },
    /// What this test measures cannot run on this host (e.g. cuFile refuses every file): the
    /// test is listed as skipped with the reason, the other tests run.
    #[error("{test}: not available here: {why}")]
    Unavailable {
        /// Test name.
        test: String,
        /// Why.
        why: String,
    },
    /// Engine setup failed.
    #[error("cannot start the engine: {0}")]
    Setup(String),
    /// `--samples 0`.
    #[error("--samples must be at least 1")]
    NoSamples,
}

/// What a test needs to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Needs {
    /// The CPU engine (always present).
    Cpu,
    /// The CUDA engine and a GPU.
    Cuda,
    /// The CUDA engine and at least two GPUs.
    #[serde(rename = "cuda2")]
    Cuda2,
    /// At least two GPUs and the NCCL library.
    #[serde(rename = "nccl2")]
    Nccl2,
}

impl Needs {
    /// True for the GPU tests.
    pub fn is_gpu(self) -> bool {
        matches!(self, Needs::Cuda | Needs::Cuda2 | Needs::Nccl2)
    }
}

/// What a test measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// GB/s (10^9 bytes/s of payload); higher is better.
    Bandwidth,
    /// Microseconds per submit+wait; lower is better.
    Latency,
}

impl Kind {
    /// The unit of the figures.
    pub fn unit(self) -> &'static str {
        match self {
            Kind::Bandwidth => "GB/s",
            Kind::Latency => "us",
        }
    }
}

/// One entry of the test registry.
#[derive(Debug, Clone)]
pub struct TestInfo {
    /// Name used by `--test`.
    pub name: &'static str,
    /// One-line description shown by `--list`.
    pub description: &'static str,
    /// Engine and paths it needs.
    pub needs: Needs,
    /// Bandwidth or latency.
    pub kind: Kind,
    /// Default size sweep (`--sizes` replaces it for bandwidth tests, `--latency-sizes` for
    /// latency tests).
    pub default_sizes: &'static str,
}

impl TestInfo {
    /// A registry entry (usable in `static` tables).
    pub const fn new(
        name: &'static str,
        description: &'static str,
        needs: Needs,
        kind: Kind,
        default_sizes: &'static str,
    ) -> TestInfo {
        TestInfo {
            name,
            description,
            needs,
            kind,
            default_sizes,
        }
    }
}

/// Every test, CPU and GPU.
pub fn registry() -> Vec<TestInfo> {
    cpu::TESTS
        .iter()
        .chain(cuda::TESTS)
        .chain(file::TESTS)
        .chain(multi::TESTS)
        .chain(pipeline::TESTS)
        .chain(ipc::TESTS)
        .cloned()
        .collect()
}

/// Whether tests needing `needs` can run in this build on this machine, or why not.
pub fn availability(needs: Needs) -> Result<(), String> {
    match needs {
        Needs::Cpu => Ok(()),
        Needs::Cuda => cuda::available(),
        Needs::Cuda2 => cuda::available_two(),
        Needs::Nccl2 => multi::available_nccl(),
    }
}

/// Which engines `--engine` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineSel {
    /// CPU tests only.
    Cpu,
    /// GPU tests only.
    Cuda,
    /// Both (default).
    All,
}

impl std::str::FromStr for EngineSel {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        match s {
            "cpu" => Ok(EngineSel::Cpu),
            "cuda" => Ok(EngineSel::Cuda),
            "all" => Ok(EngineSel::All),
            _ => Err(BenchError::UnknownEngine(s.to_string())),
        }
    }
}

/// The tests chosen and those left out (with why).
#[derive(Debug, Clone)]
pub struct Selection {
    /// Tests to run, in registry order.
    pub run: Vec<TestInfo>,
    /// Tests selected but unavailable: (name, reason).
    pub skipped: Vec<(String, String)>,
}

/// Resolves `--test a,b` (None: all) and `--engine` against the registry.
pub fn select(tests: Option<&str>, engine: EngineSel) -> Result<Selection, BenchError> {
    let reg = registry();
    let wanted: Vec<TestInfo> = match tests {
        None => reg.clone(),
        Some(list) => {
            let mut out = vec![];
            // Empty items (`cpu-contig,`) are ignored; a list of nothing but commas is refused.
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                match reg.iter().find(|t| t.name == name) {
                    Some(t) if !out.iter().any(|o: &TestInfo| o.name == name) => {
                        out.push(t.clone())
                    }
                    Some(_) => {}
                    None => {
                        let valid = reg.iter().map(|t| t.name).collect::<Vec<_>>().join(", ");
                        return Err(BenchError::UnknownTest {
                            name: name.to_string(),
                            valid,
                        });
                    }
                }
            }
            if out.is_empty() {
                let valid = reg.iter().map(|t| t.name).collect::<Vec<_>>().join(", ");
                return Err(BenchError::NoTestNamed(valid));
            }
            out
        }
    };
    let mut sel = Selection {
        run: vec![],
        skipped: vec![],
    };
    for t in wanted {
        let engine_ok = match engine {
            EngineSel::All => true,
            EngineSel::Cpu => t.needs == Needs::Cpu,
            EngineSel::Cuda => t.needs.is_gpu(),
        };
        if !engine_ok {
            continue;
        }
        match availability(t.needs) {
            Ok(()) => sel.run.push(t),
            Err(why) => sel.skipped.push((t.name.to_string(), why)),
        }
    }
    Ok(sel)
}

/// Settings of one `ferry bench` run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Tests to run.
    pub tests: Vec<TestInfo>,
    /// Sizes for bandwidth tests (None: each test's default).
    pub sizes: Option<Vec<u64>>,
    /// Sizes for latency tests (None: each test's default).
    pub latency_sizes: Option<Vec<u64>>,
    /// CPU engine worker threads.
    pub threads: usize,
    /// Timing method.
    pub method: Method,
}

/// Runs every selected test over its sizes. `progress` is called after each (test, size)
/// with (done, total).
pub fn run(
    cfg: &BenchConfig,
    skipped: &[(String, String)],
    mut progress: impl FnMut(usize, usize, &str),
) -> Result<Report, BenchError> {
    if cfg.method.samples == 0 {
        return Err(BenchError::NoSamples);
    }
    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let plan: Vec<(TestInfo, Vec<u64>)> = cfg
        .tests
        .iter()
        .map(|t| {
            let own = match t.kind {
                Kind::Bandwidth => cfg.sizes.clone(),
                Kind::Latency => cfg.latency_sizes.clone(),
            };
            let sizes = own
                .unwrap_or_else(|| crate::sizes::parse_sizes(t.default_sizes).unwrap_or_default());
            (t.clone(), sizes)
        })
        .collect();
    let total = plan.iter().map(|(_, s)| s.len()).sum();
    let mut cpu = cpu::CpuBench::new(cfg.threads, cfg.method.clone())?;
    let mut gpu: Option<cuda::CudaBench> = None;
    let mut files: Option<file::FileBench> = None;
    let mut multi_gpu: Option<multi::MultiBench> = None;
    let mut agents: Option<ipc::IpcBench> = None;
    let mut results = vec![];
    let mut size_skips = vec![];
    let mut done = 0;
    for (t, sizes) in &plan {
        for &size in sizes {
            progress(
                done,
                total,
                &format!("{} {}", t.name, crate::sizes::format_size(size)),
            );
            let in_multi = multi::TESTS.iter().any(|m| m.name == t.name);
            let rows = match t.needs {
                _ if ipc::owns(t.name) => agents
                    .get_or_insert_with(|| ipc::IpcBench::new(cfg.threads, cfg.method.clone()))
                    .run(t, size),
                _ if pipeline::owns(t.name) => {
                    pipeline::run(t, size, cfg.threads, &cfg.method).map(|r| vec![r])
                }
                _ if file::owns(t.name) => match &mut files {
                    Some(f) => f.run(t, size),
                    None => files
                        .insert(file::FileBench::new(cfg.threads, cfg.method.clone())?)
                        .run(t, size),
                }
                .map(|r| vec![r]),
                _ if in_multi => match &mut multi_gpu {
                    Some(g) => g.run(t, size),
                    None => multi_gpu
                        .insert(multi::MultiBench::new(cfg.method.clone())?)
                        .run(t, size),
                },
                Needs::Cpu => cpu.run(t, size).map(|r| vec![r]),
                Needs::Cuda | Needs::Cuda2 | Needs::Nccl2 => match &mut gpu {
                    Some(g) => g.run(t, size),
                    None => gpu
                        .insert(cuda::CudaBench::new(cfg.method.clone())?)
                        .run(t, size),
                },
            };
            match rows {
                Ok(rows) => results.extend(rows),
                // A size this test cannot take (e.g. below one element) is left out, not fatal.
                Err(BenchError::BadSize { why, .. } | BenchError::Unavailable { why, .. }) => {
                    size_skips.push(Skipped {
                        test: format!("{} {}", t.name, crate::sizes::format_size(size)),
                        reason: why,
                    })
                }
                Err(e) => return Err(e),
            }
            done += 1;
        }
    }
    progress(done, total, "done");
    if results.is_empty() {
        let why: Vec<String> = size_skips
            .iter()
            .map(|s| format!("{}: {}", s.test, s.reason))
            .collect();
        return Err(BenchError::NothingToRun(format!(
            "every size was left out ({})",
            why.join("; ")
        )));
    }
    let c = cpu.engine_config();
    Ok(Report {
        schema: "ferry-bench/1",
        ferry_version: env!("CARGO_PKG_VERSION"),
        commit: option_env!("FERRY_GIT_COMMIT"),
        started_unix_s,
        host: Host::gather(),
        method: MethodReport {
            settings: cfg.method.clone(),
            statistic: "median",
            gbps: "1e9 bytes/s of payload",
            text: METHOD,
        },
        cpu_engine: CpuEngineReport {
            threads: c.threads,
            chunk_bytes: c.chunk_bytes,
            inline_bytes: c.inline_bytes,
            stream_bytes: c.stream_bytes,
        },
        skipped: skipped
            .iter()
            .map(|(t, r)| Skipped {
                test: t.clone(),
                reason: r.clone(),
            })
            .chain(size_skips)
            .collect(),
        results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_by_name_and_engine() {
        let s = select(Some("cpu-contig,cpu-tile"), EngineSel::All).unwrap();
        assert_eq!(
            s.run.iter().map(|t| t.name).collect::<Vec<_>>(),
            ["cpu-contig", "cpu-tile"]
        );
        let s = select(None, EngineSel::Cpu).unwrap();
        assert!(s.run.iter().all(|t| t.needs == Needs::Cpu) && !s.run.is_empty());
        assert!(s.skipped.is_empty());
    }

    #[test]
    fn unknown_test_lists_valid_names() {
        let e = select(Some("cpu-contig,nope"), EngineSel::All).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("`nope`"), "{msg}");
        for t in registry() {
            assert!(msg.contains(t.name), "{msg} lacks {}", t.name);
        }
    }

    #[test]
    fn gpu_tests_listed_as_unavailable_without_cuda() {
        let reg = registry();
        assert!(reg.iter().any(|t| t.needs == Needs::Cuda));
        if cuda::available().is_err() {
            let s = select(None, EngineSel::All).unwrap();
            assert!(s.skipped.iter().all(|(_, why)| !why.is_empty()));
            assert_eq!(
                s.skipped.len(),
                reg.iter().filter(|t| t.needs.is_gpu()).count()
            );
        }
    }

    #[test]
    fn default_sizes_parse() {
        for t in registry() {
            assert!(
                !crate::sizes::parse_sizes(t.default_sizes)
                    .unwrap()
                    .is_empty(),
                "{}",
                t.name
            );
        }
    }
}
