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
}

/// A test left out.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// Test name.
    pub test: String,
    /// Why.
    pub reason: String,
}
