//! Pipeline tests of `ferry bench`: ferry's pipeline (upload, compute, download overlapped
//! through 3 slots) next to the sequential copy-then-compute loop, and on the GPU next to a
//! hand-written loop of raw driver calls on three streams ordered by reused events, in the same
//! run on the same buffers (and on the GPU upload + compute, pageable-source and file-source rows,
//! see `pipeline/gpu.rs`).
//! Each row's size is the source's bytes; GB/s is source bytes over the whole run's host time
//! (submit to last byte back). Chunks are 1/16 of the source on the CPU; on the GPU see
//! `pipeline/gpu.rs`.
//!
//! The stage maps every byte through `rounds` steps of an LCG: on the CPU 4 rounds; on the GPU
//! the rounds are calibrated before the row so that one chunk's kernel takes about as long as
//! one chunk's upload (the balanced case of the targets). Outputs of every series are
//! compared with each other and, at 4099-byte steps, with the CPU's.
//!
//! `--trace FILE` / `--gantt FILE`: each test runs once more with a timeline; [`take_traces`]
//! hands the timelines to the binary.

use super::data::pattern_bytes;
use super::{measure, BenchError, Kind, Method, Needs, Role, Row, Series, TestInfo};
use crate::sizes::format_size;
use ferry::pipeline::{Chunk, CpuPipeline, Dest, PipelineConfig, Source, Timeline};
use ferry::{CpuEngine, Engine, Job, Layout, MemKind, RawBuf};
use std::sync::Mutex;

/// The pipeline tests.
pub static TESTS: &[TestInfo] = &[
    TestInfo::new(
        "pipeline",
        "host -> slot -> stage (closure) -> host, 3 slots: ferry's CPU pipeline vs the sequential copy-compute-copy loop",
        Needs::Cpu,
        Kind::Bandwidth,
        "16M,64M",
    ),
    TestInfo::new(
        "cuda-pipeline",
        "pinned -> device -> kernel -> pinned, 3 slots, compute balanced with copies: ferry's GPU pipeline vs sequential loop and a raw 3-stream event loop",
        Needs::Cuda,
        Kind::Bandwidth,
        "64M,256M",
    ),
    TestInfo::new(
        "cuda-pipeline-upcompute",
        "pinned -> device -> kernel into a device array (no download), 3 slots, balanced: ferry's GPU pipeline vs a raw 2-stream event loop and the sequential copy-then-compute loop; notes: total / max(uploads alone, kernels alone), sequential / total",
        Needs::Cuda,
        Kind::Bandwidth,
        "64M,256M",
    ),
    TestInfo::new(
        "cuda-pipeline-pageable",
        "pageable -> device -> kernel -> pinned, 3 slots: ferry's GPU pipeline from a pageable source vs the same from a pinned source (ratio pageable / pinned)",
        Needs::Cuda,
        Kind::Bandwidth,
        "64M,256M",
    ),
    TestInfo::new(
        "cuda-pipeline-file",
        "file (page cache) -> device -> kernel -> pinned, 3 slots: ferry's GPU pipeline from a file through a file engine vs the same from a pinned source (ratio file / pinned)",
        Needs::Cuda,
        Kind::Bandwidth,
        "64M,256M",
    ),
];

/// True for the tests of this module.
pub fn owns(name: &str) -> bool {
    TESTS.iter().any(|t| t.name == name)
}

const SLOTS: usize = 3;
const CPU_ROUNDS: u32 = 4;

static TRACE: Mutex<Option<Vec<(String, Timeline)>>> = Mutex::new(None);

/// Keep a timeline of each pipeline test (one extra run per row) from now on.
pub fn set_trace(on: bool) {
    *TRACE.lock().unwrap_or_else(|e| e.into_inner()) = on.then(Vec::new);
}

/// The timelines kept since [`set_trace`], as (`test size`, timeline).
pub fn take_traces() -> Vec<(String, Timeline)> {
    TRACE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .map(std::mem::take)
        .unwrap_or_default()
}

fn tracing() -> bool {
    TRACE.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}

fn keep_trace(name: String, t: Timeline) {
    if let Some(v) = TRACE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        v.push((name, t));
    }
}

/// The stage on one byte.
fn lcg(b: u8, rounds: u32) -> u8 {
    let mut x = u32::from(b);
    for _ in 0..rounds {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
    }
    (x >> 24) as u8
}

fn stage_cpu(input: &[u8], out: &mut [u8]) {
    for (o, &i) in out.iter_mut().zip(input) {
        *o = lcg(i, CPU_ROUNDS);
    }
}

fn failed<'a>(test: &'a str, series: &str, size: u64) -> impl Fn(String) -> BenchError + 'a {
    let series = series.to_string();
    move |message| BenchError::Engine {
        test: test.to_string(),
        series: series.clone(),
        size: format_size(size),
        message,
    }
}

/// The first byte where `got` differs from the CPU's stage at 4099-byte steps, or from `other`.
fn verify(
    test: &str,
    series: &str,
    size: u64,
    src: &[u8],
    got: &[u8],
    rounds: u32,
) -> Result<(), BenchError> {
    let bad = (0..src.len())
        .step_by(4099)
        .chain([src.len().saturating_sub(1)])
        .find(|&i| got[i] != lcg(src[i], rounds));
    mismatch(test, series, size, bad)
}

/// A verification failure at `offset`, if any.
fn mismatch(test: &str, series: &str, size: u64, offset: Option<usize>) -> Result<(), BenchError> {
    match offset {
        Some(offset) => Err(BenchError::Verify {
            test: test.into(),
            series: series.into(),
            size: format_size(size),
            offset,
        }),
        None => Ok(()),
    }
}

/// Runs one pipeline test at one size.
pub fn run(test: &TestInfo, size: u64, threads: usize, method: &Method) -> Result<Row, BenchError> {
    match test.name {
        "pipeline" => run_cpu(test, size, threads, method),
        _ => gpu::run(test, size, method),
    }
}

fn run_cpu(test: &TestInfo, size: u64, threads: usize, method: &Method) -> Result<Row, BenchError> {
    let n = size as usize;
    let chunk = (n / 16).max(1);
    let engine = CpuEngine::new(threads).map_err(|e| BenchError::Setup(e.to_string()))?;
    let src = pattern_bytes(n);
    let mut dst = vec![0u8; n];
    let name = format!("ferry pipeline (K={SLOTS})");
    let cfg = PipelineConfig::new(chunk, SLOTS);
    let mut pipe = CpuPipeline::new(&engine, cfg).map_err(|e| BenchError::Setup(e.to_string()))?;
    let stage = |_: &Chunk, i: &[u8], o: &mut [u8]| {
        stage_cpu(i, o);
        Ok::<(), std::convert::Infallible>(())
    };
    let ferry = measure(method, || {
        pipe.run(Source::new(&src), Some(Dest::new(&mut dst)), stage)
            .map(drop)
            .map_err(|e| failed(test.name, &name, size)(e.to_string()))
    })?;
    verify(test.name, &name, size, &src, &dst, CPU_ROUNDS)?;
    if tracing() {
        let mut p = CpuPipeline::new(&engine, cfg.timeline(true))
            .map_err(|e| BenchError::Setup(e.to_string()))?;
        let rep = p
            .run(Source::new(&src), Some(Dest::new(&mut dst)), stage)
            .map_err(|e| failed(test.name, &name, size)(e.to_string()))?;
        if let Some(t) = rep.timeline {
            keep_trace(format!("{} {}", test.name, format_size(size)), t);
        }
    }
    // Baseline: the same chunks, copied in, computed and copied out one after the other.
    let seq_name = "sequential copy-compute-copy (same engine)";
    let (mut slot, mut out) = (vec![0u8; chunk], vec![0u8; chunk]);
    let mut seq_dst = vec![0u8; n];
    let copy = |to: RawBuf, from: RawBuf| -> Result<(), String> {
        let l = Layout::bytes(from.len).map_err(|e| e.to_string())?;
        // SAFETY: both buffers are borrowed by this function's caller until the wait below.
        let r =
            unsafe { engine.submit_raw(Job::copy(to, l, from, l)) }.map_err(|e| e.to_string())?;
        r.wait().map_err(|e| e.to_string())
    };
    let host = |p: *const u8, len| RawBuf::host(p, len, MemKind::Pageable);
    let seq = measure(method, || {
        for off in (0..n).step_by(chunk) {
            let len = chunk.min(n - off);
            copy(host(slot.as_mut_ptr(), len), host(src[off..].as_ptr(), len))?;
            stage_cpu(&slot[..len], &mut out[..len]);
            copy(
                host(seq_dst[off..].as_mut_ptr(), len),
                host(out.as_ptr(), len),
            )?;
        }
        Ok(())
    })
    .map_err(failed(test.name, seq_name, size))?;
    verify(test.name, seq_name, size, &src, &seq_dst, CPU_ROUNDS)?;
    Ok(Row::new(
        test.name,
        Kind::Bandwidth,
        size,
        size,
        format!(
            "chunks of {}, {SLOTS} slots, {CPU_ROUNDS}-round LCG per byte",
            format_size(chunk as u64)
        ),
        vec![
            Series::new(name, Role::Ferry, Kind::Bandwidth, size, ferry),
            Series::new(seq_name, Role::Baseline, Kind::Bandwidth, size, seq),
        ],
    ))
}

mod gpu;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_pipeline_row_verifies_and_traces() {
        set_trace(true);
        let m = Method {
            warmup: 1,
            samples: 2,
            min_sample_s: 0.0,
        };
        let row = run(&TESTS[0], 1 << 20, 2, &m).unwrap();
        assert_eq!(row.series.len(), 2);
        assert!(row.ratio.is_finite());
        let t = take_traces();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].1.chunks.len(), 16);
        set_trace(false);
    }
}
