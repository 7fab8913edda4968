//! GPU tests of `ferry bench`.
//!
//! This build has no CUDA engine (`ferry::engine::cuda` is a placeholder), so the tests below
//! are listed, and reported as unavailable with the reason; none is measured. When the CUDA
//! engine lands, this module gets the runners: [`available`] calls
//! `ferry::engine::cuda::probe()`, and [`run`] measures each test with
//! [`super::measure`] and fills [`super::Row::link_limit_fraction`] from the probed PCIe link.

use super::{BenchError, Kind, Needs, Row, TestInfo};

const fn gpu(
    name: &'static str,
    description: &'static str,
    kind: Kind,
    default_sizes: &'static str,
) -> TestInfo {
    TestInfo {
        name,
        description,
        needs: Needs::Cuda,
        kind,
        default_sizes,
    }
}

/// The GPU tests (same paths as the design notes' H200 table).
pub static TESTS: &[TestInfo] = &[
    gpu(
        "cuda-h2d-pinned",
        "host (pinned) -> device copy, vs raw cuMemcpyHtoDAsync",
        Kind::Bandwidth,
        "4K..256M",
    ),
    gpu(
        "cuda-d2h-pinned",
        "device -> host (pinned) copy, vs raw cuMemcpyDtoHAsync",
        Kind::Bandwidth,
        "4K..256M",
    ),
    gpu(
        "cuda-h2d-pageable",
        "host (pageable) -> device copy, vs raw driver copy",
        Kind::Bandwidth,
        "4K..256M",
    ),
    gpu(
        "cuda-d2h-pageable",
        "device -> host (pageable) copy, vs raw driver copy",
        Kind::Bandwidth,
        "4K..256M",
    ),
    gpu(
        "cuda-d2d",
        "device -> device copy on one GPU, vs raw cuMemcpyDtoDAsync",
        Kind::Bandwidth,
        "4K..256M",
    ),
    gpu(
        "cuda-bidir",
        "host -> device and device -> host at once (pinned)",
        Kind::Bandwidth,
        "4K..256M",
    ),
    gpu(
        "cuda-tile",
        "2-D tile host (pinned) -> device, vs raw cuMemcpy2DAsync",
        Kind::Bandwidth,
        "4K..256M",
    ),
    gpu(
        "cuda-latency",
        "submit+wait of a small pinned host -> device copy",
        Kind::Latency,
        "4,64,1K,4K,64K",
    ),
];

/// Whether the GPU tests can run, or why not.
pub fn available() -> Result<(), String> {
    Err("no CUDA engine in this build (ferry::engine::cuda has not landed)".to_string())
}

/// Runs one GPU test at one size. Never reached while [`available`] says no.
pub fn run(test: &TestInfo, _size: u64) -> Result<Row, BenchError> {
    Err(BenchError::NothingToRun(format!(
        "{}: {}",
        test.name,
        available().err().unwrap_or_default()
    )))
}
