//! What a measurement becomes: a [`Series`] (one timed copy: ferry's or a baseline's, its
//! figures in GB/s or microseconds) and a [`Row`] (one test at one size: every series, the
//! better baseline and the ratio). Both are written as they are into the `--json` report.

use super::{Kind, Timing};
use serde::Serialize;

/// Who a series is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A ferry engine.
    Ferry,
    /// A plain baseline the ratio is taken against.
    Baseline,
}

/// How a series was timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Clock {
    /// The host's monotonic clock around each call (or sample of calls).
    #[serde(rename = "host")]
    Host,
    /// CUDA events on the copies' stream, the batch released together behind a latch.
    #[serde(rename = "cuda-events")]
    CudaEvents,
}

impl Clock {
    /// Short name for the terminal table.
    pub fn short(self) -> &'static str {
        match self {
            Clock::Host => "host",
            Clock::CudaEvents => "events",
        }
    }
}

/// One measured series of a row.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    /// e.g. `ferry cpu(2)`, `copy_from_slice`, `2 threads`.
    pub name: String,
    /// Ferry or baseline.
    pub role: Role,
    /// Median figure in the row's unit (GB/s or us).
    pub median: f64,
    /// Worst sample (lowest GB/s, highest us).
    pub worst: f64,
    /// Best sample (highest GB/s, lowest us).
    pub best: f64,
    /// Raw timing.
    pub timing: Timing,
    /// The result was compared with the reference after the run and matched.
    pub verified: bool,
    /// How it was timed.
    pub clock: Clock,
    /// CPU seconds (user + system, every thread of the process: `getrusage(RUSAGE_SELF)`) per
    /// GB moved over the timed calls; set on the contiguous GPU rows (the staged pageable
    /// ones are where it matters: their copies run on CPU threads).
    pub cpu_s_per_gb: Option<f64>,
    /// The waiting thread's CPU time (`getrusage(RUSAGE_THREAD)` around each wait) as a
    /// fraction of the waits' wall time; set by `cuda-wait-cpu`.
    pub wait_cpu_share: Option<f64>,
}

impl Series {
    /// Builds a series from a timing: GB/s of `payload` bytes, or microseconds.
    pub fn new(
        name: impl Into<String>,
        role: Role,
        kind: Kind,
        payload: u64,
        timing: Timing,
    ) -> Series {
        let fig = |s: f64| match kind {
            Kind::Bandwidth => payload as f64 / s / 1e9,
            Kind::Latency => s * 1e6,
        };
        // The slowest sample is the worst figure in both units.
        let (worst, best) = (fig(timing.max_s), fig(timing.min_s));
        Series {
            name: name.into(),
            role,
            median: fig(timing.median_s),
            worst,
            best,
            timing,
            verified: true,
            clock: Clock::Host,
            cpu_s_per_gb: None,
            wait_cpu_share: None,
        }
    }

    /// The same series with its CPU cost: `cpu` spent over `calls` calls of `payload` bytes.
    pub fn with_cpu(
        mut self,
        cpu: Option<std::time::Duration>,
        calls: u64,
        payload: u64,
    ) -> Series {
        let gb = calls as f64 * payload as f64 / 1e9;
        self.cpu_s_per_gb = cpu.filter(|_| gb > 0.0).map(|c| c.as_secs_f64() / gb);
        self
    }

    /// The same series, marked as timed by `clock`.
    pub fn clocked(mut self, clock: Clock) -> Series {
        self.clock = clock;
        self
    }
}

/// One (test, size) result.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Test name.
    pub test: String,
    /// Bandwidth or latency.
    pub kind: Kind,
    /// Unit of every figure in the row.
    pub unit: &'static str,
    /// Requested size in bytes.
    pub size_bytes: u64,
    /// Bytes actually copied per call (may be below `size_bytes` when the shape rounds).
    pub payload_bytes: u64,
    /// Shape of the copy, in words.
    pub shape: String,
    /// Every series: the ferry one first, then baselines.
    pub series: Vec<Series>,
    /// Name of the better baseline.
    pub best_baseline: String,
    /// ferry / better baseline (bandwidth: GB/s ratio, >1 is faster; latency: time ratio,
    /// <1 is faster).
    pub ratio: f64,
    /// Fraction of the link's limit (GPU rows; null for CPU rows).
    pub link_limit_fraction: Option<f64>,
    /// What a program waits for (GPU bandwidth rows; null elsewhere): see [`CallerView`].
    pub caller: Option<CallerView>,
}

/// The caller's view of a GPU bandwidth row (issue 14): one copy of the row's size per call,
/// the host clock around `scope` + copy + `wait` through the public API with the default
/// configuration (`CudaConfig::from_env(0)`, so `WaitMode::Auto`), beside a raw
/// `cuMemcpyAsync` + `cuStreamSynchronize` on the same buffers, timed the same way. The row's
/// own series time the GPU's work (events, spin waits); this one what a user's thread waits.
#[derive(Debug, Clone, Serialize)]
pub struct CallerView {
    /// ferry, default configuration.
    pub ferry: Series,
    /// The raw driver, one copy then one stream synchronize.
    pub raw: Series,
    /// `ferry` / `raw` in GB/s (above 1 ferry is faster).
    pub ratio: f64,
}

impl CallerView {
    /// The view of two series; the ratio of their medians.
    pub fn new(ferry: Series, raw: Series) -> CallerView {
        let ratio = ferry.median / raw.median;
        CallerView { ferry, raw, ratio }
    }
}

impl Row {
    /// Builds a row; the ratio is taken against the better baseline.
    pub fn new(
        test: &str,
        kind: Kind,
        size: u64,
        payload: u64,
        shape: String,
        series: Vec<Series>,
    ) -> Row {
        let ferry = series
            .iter()
            .find(|s| s.role == Role::Ferry)
            .map_or(f64::NAN, |s| s.median);
        let better = |a: f64, b: f64| match kind {
            Kind::Bandwidth => a > b,
            Kind::Latency => a < b,
        };
        let mut best: Option<&Series> = None;
        for s in series.iter().filter(|s| s.role == Role::Baseline) {
            if best.is_none_or(|b| better(s.median, b.median)) {
                best = Some(s);
            }
        }
        let (best_baseline, ratio) = best.map_or((String::new(), f64::NAN), |b| {
            (b.name.clone(), ferry / b.median)
        });
        Row {
            test: test.to_string(),
            kind,
            unit: kind.unit(),
            size_bytes: size,
            payload_bytes: payload,
            shape,
            series,
            best_baseline,
            ratio,
            link_limit_fraction: None,
            caller: None,
        }
    }

    /// The ferry series.
    pub fn ferry(&self) -> Option<&Series> {
        self.series.iter().find(|s| s.role == Role::Ferry)
    }

    /// The better baseline series.
    pub fn baseline(&self) -> Option<&Series> {
        self.series
            .iter()
            .find(|s| s.role == Role::Baseline && s.name == self.best_baseline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_clock_defaults_to_host_and_serializes() {
        let tm = Timing::of(vec![1e-6], 1);
        let s = Series::new("f", Role::Ferry, Kind::Bandwidth, 1000, tm.clone());
        assert_eq!(s.clock, Clock::Host);
        let v = serde_json::to_value(s.clocked(Clock::CudaEvents)).unwrap();
        assert_eq!(v["clock"], "cuda-events");
        let v = serde_json::to_value(Series::new("f", Role::Ferry, Kind::Latency, 1, tm)).unwrap();
        assert_eq!(v["clock"], "host");
    }

    #[test]
    fn caller_view_and_cpu_columns_serialize() {
        let tm = |s: f64| Timing::of(vec![s], 1);
        let f = Series::new("f", Role::Ferry, Kind::Bandwidth, 1000, tm(1e-6)).with_cpu(
            Some(std::time::Duration::from_millis(2)),
            1_000_000,
            1000,
        );
        // 2 ms of CPU over 1 GB moved.
        assert!((f.cpu_s_per_gb.unwrap() - 0.002).abs() < 1e-12);
        let r = Series::new("r", Role::Baseline, Kind::Bandwidth, 1000, tm(0.5e-6));
        let mut row = Row::new(
            "x",
            Kind::Bandwidth,
            1000,
            1000,
            String::new(),
            vec![f.clone()],
        );
        row.caller = Some(CallerView::new(f, r));
        assert!((row.caller.as_ref().unwrap().ratio - 0.5).abs() < 1e-9);
        let v = serde_json::to_value(&row).unwrap();
        assert!((v["caller"]["ratio"].as_f64().unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(v["caller"]["raw"]["name"], "r");
        assert!(v["series"][0]["cpu_s_per_gb"].as_f64().is_some());
        assert!(v["series"][0]["wait_cpu_share"].is_null());
        let none =
            Series::new("n", Role::Ferry, Kind::Bandwidth, 1000, tm(1e-6)).with_cpu(None, 3, 1000);
        assert!(none.cpu_s_per_gb.is_none());
    }

    #[test]
    fn ratio_uses_better_baseline() {
        let tm = |s: f64| Timing {
            samples_s: vec![s],
            reps: 1,
            median_s: s,
            min_s: s,
            max_s: s,
        };
        let row = Row::new(
            "x",
            Kind::Bandwidth,
            1000,
            1000,
            String::new(),
            vec![
                Series::new("f", Role::Ferry, Kind::Bandwidth, 1000, tm(1e-6)),
                Series::new("a", Role::Baseline, Kind::Bandwidth, 1000, tm(2e-6)),
                Series::new("b", Role::Baseline, Kind::Bandwidth, 1000, tm(4e-6)),
            ],
        );
        assert_eq!(row.best_baseline, "a");
        assert!((row.ratio - 2.0).abs() < 1e-9);
        assert!((row.ferry().unwrap().median - 1.0).abs() < 1e-9);
        let lat = Row::new(
            "y",
            Kind::Latency,
            4,
            4,
            String::new(),
            vec![
                Series::new("f", Role::Ferry, Kind::Latency, 4, tm(2e-6)),
                Series::new("a", Role::Baseline, Kind::Latency, 4, tm(1e-6)),
            ],
        );
        assert!((lat.ratio - 2.0).abs() < 1e-9 && (lat.ferry().unwrap().median - 2.0).abs() < 1e-9);
    }
}
