//! The report of one run, as `--json` writes it: the results and the settings and host they
//! were measured with.

use super::{Method, Row};
use serde::Serialize;

/// Everything a run produced: what `--json` writes.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Schema tag: `ferry-bench/1`.
    pub schema: &'static str,
    /// ferry version.
    pub ferry_version: &'static str,
    /// The commit the binary was built from (`git rev-parse` at build time, or the
    /// `FERRY_COMMIT` variable then; `-dirty` when the work tree had changes), if known.
    pub commit: Option<&'static str>,
    /// Seconds since the Unix epoch at the start of the run.
    pub started_unix_s: u64,
    /// Host facts.
    pub host: Host,
    /// Method settings and text.
    pub method: MethodReport,
    /// CPU engine settings used.
    pub cpu_engine: CpuEngineReport,
    /// Tests selected but not run (name and reason), and (test, size) pairs left out
    /// (`"<test> <size>"` and reason).
    pub skipped: Vec<Skipped>,
    /// Results, in run order.
    pub results: Vec<Row>,
}

/// Host facts in the report.
#[derive(Debug, Clone, Serialize)]
pub struct Host {
    /// The machine's host name, if known.
    pub hostname: Option<String>,
    /// The CPU model (`model name` of `/proc/cpuinfo`), if known.
    pub cpu_model: Option<String>,
    /// The name of each GPU the CUDA driver sees, by ordinal (empty without one).
    pub gpu_models: Vec<String>,
    /// Logical cores.
    pub cores: usize,
    /// `std::env::consts::OS`.
    pub os: &'static str,
    /// `std::env::consts::ARCH`.
    pub arch: &'static str,
}

/// Method in the report.
#[derive(Debug, Clone, Serialize)]
pub struct MethodReport {
    /// Settings.
    #[serde(flatten)]
    pub settings: Method,
    /// Statistic shown as the figure.
    pub statistic: &'static str,
    /// Definition of GB/s.
    pub gbps: &'static str,
    /// The method text.
    pub text: &'static str,
}

/// CPU engine settings in the report.
#[derive(Debug, Clone, Serialize)]
pub struct CpuEngineReport {
    /// Worker threads.
    pub threads: usize,
    /// Smallest chunk of a split copy.
    pub chunk_bytes: usize,
    /// Inline threshold of the default engine.
    pub inline_bytes: usize,
    /// Transposes writing more than this write past the caches.
    pub stream_bytes: usize,
}

/// A test left out.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// Test name.
    pub test: String,
    /// Why.
    pub reason: String,
}

impl Host {
    /// Facts about this machine.
    pub fn gather() -> Host {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let cpu_model = read("/proc/cpuinfo").and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        });
        Host {
            hostname: read("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty()),
            cpu_model,
            gpu_models: ferry::cuda::probe()
                .devices
                .into_iter()
                .map(|d| d.name)
                .collect(),
            cores: ferry::engine::cpu::probe().cores,
            os: std::env::consts::OS,
            arch: std::env::consts::ARCH,
        }
    }
}
