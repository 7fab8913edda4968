//! The GPU pipeline rows: ferry's pipeline through its public API with the default engine
//! config, next to raw driver loops on the same buffers in the same process, the kernel's
//! rounds calibrated so that one chunk's compute matches one chunk's upload (the balanced case
//! of the issue's targets):
//! - `cuda-pipeline`: upload, compute, download (3 slots) vs the sequential loop and a raw
//!   3-stream event loop;
//! - `cuda-pipeline-upcompute` ([`up`]): upload and compute only, the kernel writing a device
//!   array, vs a raw 2-stream event loop, the sequential loop, and the uploads alone and the
//!   kernels alone (the row's notes give total / max(copy, compute) and sequential / total);
//! - `cuda-pipeline-pageable` ([`up`]): the 3-step pipeline from a pageable source vs the same
//!   from the pinned source (the ratio is pageable / pinned);
//! - `cuda-pipeline-file` ([`up`]): the same from a file (page cache) through a file engine,
//!   vs the pinned source (the ratio is file / pinned). `FERRY_BENCH_BOUNCE=N` gives these two
//!   sources N bounce buffers instead of the automatic count, to compare counts on one host;
//!   `FERRY_BENCH_FILL=0..7` picks how the pageable source's buffers are filled and
//!   `FERRY_BENCH_FILL_THREADS=N` by how many threads (`up.rs`).
//!
//! Ferry's series and the one its ratio is taken against (the raw loop; the pinned source) are
//! each first run once and checked on their own output, then warmed up ([`WARMUP_RUNS`] runs at
//! least) and timed in turns ([`timed_pair`]), so that the shared host's drift during a row
//! moves both alike, then each run and checked once more (ferry's the traced run when
//! tracing); the sequential loop is timed alone and checked after.
//!
//! Chunks (`chunk_for`): 1/32 of the source, at least 2 MiB. A pipeline of N balanced chunks
//! through three steps cannot take less than (N + 2) / N of one step's total (the first upload
//! and the first compute run before the first download): 1.125x at 16 chunks, 1.06x at 32, so
//! the 1.10x target needs more than 20, and two steps (N + 1) / N (1.06x at 16, 1.03x at 32,
//! against the 1.05x target). Each chunk also costs its stream a gap of 2-3 us between one
//! copy and the next (run 33's timeline, 4 MiB chunks: downloads back to back 2.2-7.5 us
//! apart), which grows with N: the 3-step wall over the largest step's busy time is about
//! (U + C + N g) / (N D) + 1 (U, C, D one chunk's upload, compute and download, g the gap),
//! least near N = 32 at 64 MiB (about 1.12-1.13 from run 33's figures, against its 1.178 with
//! 16 chunks of 4 MiB). A 2 MiB chunk's copy takes about 40 us, still above what the host
//! spends submitting a chunk's three steps (a few driver calls each); the minimum stays there
//! (at 1 MiB the gaps alone would be 10% of the copies).
//!
//! That model leaves out two things measured later (runs 61-65, `bench/results/h200.md`): with
//! uploads and downloads running at once each direction moves about 43.6 GB/s on the H200 host
//! against 51-54 GB/s alone, so the raw loop takes the same wall with 16, 24 or 32 chunks at
//! 64 MiB; and the traced run's six timing events a chunk cost its wall about 8 us a chunk
//! (1,786 us traced against 1,536 untraced at 64 MiB), which the row's wall / largest-step
//! ratio, taken from the traced run, includes. The timeline now records one event a step
//! where the stream was still busy with the step before (its start is then that step's end or
//! its dependency's, whichever is later: `ferry::pipeline`'s `cuda/timing.rs`), about half
//! that cost.

use super::{failed, keep_trace, mismatch, tracing, verify, SLOTS};
use crate::bench::data::pattern_bytes;
use crate::bench::{
    measure, measure_pair, BenchError, Kind, Method, Role, Row, Series, TestInfo, Timing,
};
use crate::sizes::format_size;
use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};
use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
use ferry::pipeline::{CudaPipeline, Dest, GpuChunk, Phase, PipelineConfig, Source, Timeline};
use ferry::{Memory, MemoryMut};
use std::sync::Arc;

mod up;

const KERNEL: &str = r#"
extern "C" __global__ void lcg(const unsigned char* in, unsigned char* out, unsigned long long n, unsigned int rounds) {
    for (unsigned long long j = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; j < n;
         j += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned int x = in[j];
        for (unsigned int r = 0; r < rounds; ++r) x = x * 1664525u + 1013904223u;
        out[j] = (unsigned char)(x >> 24);
    }
}
"#;

/// Untimed runs of each series of a row before its samples, at least (`--warmup` asks for more,
/// not fewer): a pageable or file source's fill threads start from cores left idle by the
/// row's GPU-only calibration, and their runs speed up run after run for a dozen or so. In run
/// 105 of `bench/results/h200.md`, after 3 warm-ups, the ten samples of a 64 MiB pipeline from
/// a pageable source fell from 1,994-3,446 us to 1,714-2,086 us while the pinned source's
/// stayed flat. A row reports the pipeline running, as a program streaming its data sees it.
const WARMUP_RUNS: usize = 30;

/// Chunks per source (fewer where a chunk would be under [`MIN_CHUNK`]); see the module
/// documentation.
const CHUNKS: usize = 32;
/// Smallest chunk the rows use (64 MiB: 32 chunks); see the module documentation. (4 MiB until
/// run 34: 16 chunks at 64 MiB, which cannot reach the 3-step 1.10x target.)
const MIN_CHUNK: usize = 2 << 20;
/// How close (as a fraction) calibration brings a chunk's kernel time to its upload time.
const BALANCE: f64 = 0.05;
/// Most times calibration rescales the rounds and measures again.
const CALIBRATION_ROUNDS: usize = 8;
/// Timed passes of each calibration measurement (the median is kept).
const CALIBRATION_REPEATS: usize = 3;

/// The chunk size of a row of `n` source bytes: the one place the rows' chunking is decided.
fn chunk_for(n: usize) -> usize {
    (n / CHUNKS).max(MIN_CHUNK).min(n).max(1)
}

fn setup(e: impl std::fmt::Display) -> BenchError {
    BenchError::Setup(e.to_string())
}

fn launch_cfg(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 132 * 16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Enqueues the kernel on `s`: `n` bytes from `input` to `out`.
fn launch(
    f: &CudaFunction,
    s: &CudaStream,
    input: u64,
    out: u64,
    n: usize,
    rounds: u32,
) -> Result<(), String> {
    let n64 = n as u64;
    // SAFETY: callers pass device addresses of at least `n` bytes, alive until the stream is
    // synchronized.
    unsafe {
        s.launch_builder(f)
            .arg(&input)
            .arg(&out)
            .arg(&n64)
            .arg(&rounds)
            .launch(launch_cfg(n))
    }
    .map(drop)
    .map_err(|e| e.to_string())
}

/// The first byte where a baseline's output differs from ferry's (verified) output.
fn compare(test: &str, series: &str, size: u64, got: &[u8], want: &[u8]) -> Result<(), BenchError> {
    mismatch(
        test,
        series,
        size,
        got.iter().zip(want).position(|(a, b)| a != b),
    )
}

fn drv(call: &'static str, r: sys::CUresult) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {r:?}"))
    }
}

fn cu(r: Result<(), cudarc::driver::DriverError>) -> Result<(), String> {
    r.map_err(|e| e.to_string())
}

/// What every GPU row shares: the engine (default config), the kernel calibrated for the
/// row's chunk, the pinned source, K device slots for the baselines, a stream and events.
struct Bench {
    engine: Arc<CudaEngine>,
    ctx: Arc<CudaContext>,
    f: CudaFunction,
    n: usize,
    chunk: usize,
    rounds: u32,
    /// One chunk's upload and kernel (calibrated rounds) as measured last by calibration:
    /// every chunk back to back on one stream, per chunk.
    t_copy: f64,
    t_kernel: f64,
    src: PinnedBuffer,
    ins: Vec<DeviceBuffer>,
    outs: Vec<DeviceBuffer>,
    s: Arc<CudaStream>,
}

impl Bench {
    fn new(test: &TestInfo, size: u64) -> Result<Bench, BenchError> {
        let n = size as usize;
        let chunk = chunk_for(n);
        // The default engine, its staging (which the bounce fills use) tunable by
        // FERRY_STAGING_* as in any program that asks for them (none set: the defaults).
        let cfg = ferry::cuda::CudaConfig::from_env(0).map_err(|e| setup(e.to_string()))?;
        let engine = Arc::new(CudaEngine::with_config(cfg).map_err(setup)?);
        let ctx = Arc::clone(engine.context());
        let ptx = crate::bench::cuda::compile_kernel(KERNEL).map_err(setup)?;
        let f = ctx
            .load_module(ptx)
            .and_then(|m| m.load_function("lcg"))
            .map_err(setup)?;
        let mut src = PinnedBuffer::new(n).map_err(setup)?;
        src.copy_from_slice(&pattern_bytes(n));
        let slots = || -> Result<Vec<DeviceBuffer>, BenchError> {
            (0..SLOTS)
                .map(|_| DeviceBuffer::new(0, chunk).map_err(setup))
                .collect()
        };
        let (ins, outs) = (slots()?, slots()?);
        let s = ctx.new_stream().map_err(setup)?;
        let mut b = Bench {
            engine,
            ctx,
            f,
            n,
            chunk,
            rounds: 64,
            t_copy: 0.0,
            t_kernel: 0.0,
            src,
            ins,
            outs,
            s,
        };
        b.calibrate()
            .map_err(failed(test.name, "calibration", size))?;
        Ok(b)
    }

    /// Sets the kernel's rounds so that a chunk's kernel takes as long as a chunk's upload,
    /// both measured the way the rows run them: every chunk back to back on one stream,
    /// synchronized once, after a warm-up pass (the GPU's clocks ramp up under load: run 31's
    /// single cold kernel, timed alone, took 2.3x its time in the row), the median of
    /// [`CALIBRATION_REPEATS`] passes over the chunk count. Rounds are rescaled and the kernel
    /// measured again until it is within [`BALANCE`] of the upload, at most
    /// [`CALIBRATION_ROUNDS`] times.
    fn calibrate(&mut self) -> Result<(), String> {
        let chunks = self.chunks().count() as f64;
        let per_chunk = |f: &mut dyn FnMut() -> Result<(), String>| -> Result<f64, String> {
            f()?;
            let mut t = Vec::with_capacity(CALIBRATION_REPEATS);
            for _ in 0..CALIBRATION_REPEATS {
                let t0 = std::time::Instant::now();
                f()?;
                t.push(t0.elapsed().as_secs_f64() / chunks);
            }
            t.sort_by(f64::total_cmp);
            Ok(t[t.len() / 2])
        };
        let s = Arc::clone(&self.s);
        let this = &*self;
        let t_copy = per_chunk(&mut || {
            for (i, off, len) in this.chunks() {
                this.h2d(this.ins[i % SLOTS].device_ptr(), off, len, &s)?;
            }
            cu(s.synchronize())
        })?;
        let mut rounds = 64u32;
        let mut t_kernel = 0.0;
        for _ in 0..CALIBRATION_ROUNDS {
            t_kernel = per_chunk(&mut || {
                for (i, _, len) in this.chunks() {
                    let k = i % SLOTS;
                    let (din, dout) = (this.ins[k].device_ptr(), this.outs[k].device_ptr());
                    launch(&this.f, &s, din, dout, len, rounds)?;
                }
                cu(s.synchronize())
            })?;
            let ratio = t_kernel / t_copy.max(1e-12);
            if (ratio - 1.0).abs() <= BALANCE {
                break;
            }
            rounds = ((f64::from(rounds) / ratio.max(1e-9)).round() as u32).clamp(1, 1 << 20);
        }
        (self.rounds, self.t_copy, self.t_kernel) = (rounds, t_copy, t_kernel);
        Ok(())
    }

    /// The chunks as (index, offset, len).
    fn chunks(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        (0..self.n)
            .step_by(self.chunk)
            .enumerate()
            .map(|(i, off)| (i, off, self.chunk.min(self.n - off)))
    }

    /// Enqueues `len` source bytes at `off` into device address `d` on `st`.
    fn h2d(&self, d: u64, off: usize, len: usize, st: &CudaStream) -> Result<(), String> {
        // SAFETY: `d` is a slot of `chunk` >= len bytes (or a device array of the source's
        // length), `src` holds `off + len`; every caller synchronizes before the buffers go.
        drv("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                d,
                (self.src.raw().addr + off as u64) as *const _,
                len,
                st.cu_stream(),
            )
        })
    }

    fn new_events(&self) -> Result<Vec<CudaEvent>, BenchError> {
        (0..SLOTS)
            .map(|_| self.ctx.new_event(None).map_err(setup))
            .collect()
    }

    /// The row's notes: chunks, slots, the kernel, and what the timeline (if kept) showed.
    fn shape(&self, what: &str, timeline: Option<&Timeline>) -> String {
        let mut s = format!(
            "{what}; chunks of {}, {SLOTS} slots, {}-round LCG kernel (calibrated per chunk, every chunk back to back, warm: upload {:.0} us, kernel {:.0} us); at least {WARMUP_RUNS} warm-up runs of each series",
            format_size(self.chunk as u64),
            self.rounds,
            self.t_copy * 1e6,
            self.t_kernel * 1e6,
        );
        if let Some(t) = timeline {
            let busy = [Phase::Upload, Phase::Compute, Phase::Download].map(|p| t.busy_us(p));
            let top = busy.iter().copied().fold(0.0, f64::max);
            s += &format!(
                "; timeline: busy upload {:.0} us, compute {:.0}, download {:.0}, wall {:.0} = {:.3}x the largest",
                busy[0],
                busy[1],
                busy[2],
                t.wall_us(),
                t.wall_us() / top.max(1e-9)
            );
        }
        s
    }
}

/// Runs one GPU pipeline row.
pub(super) fn run(test: &TestInfo, size: u64, method: &Method) -> Result<Row, BenchError> {
    let b = Bench::new(test, size)?;
    match test.name {
        "cuda-pipeline-upcompute" => up::upcompute(&b, test, size, method),
        "cuda-pipeline-pageable" => up::pageable(&b, test, size, method),
        "cuda-pipeline-file" => up::file(&b, test, size, method),
        _ => three_steps(&b, test, size, method),
    }
}

/// One run of `pipe` from `src` into `dst` (if any) with `stage`.
fn run_once(
    pipe: &mut CudaPipeline<'_>,
    src: Source<'_>,
    dst: Option<&mut PinnedBuffer>,
    stage: &dyn Fn(&GpuChunk<'_>) -> Result<(), String>,
) -> Result<(), String> {
    pipe.run(src, dst.map(Dest::new), stage)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The run once more on a pipeline that keeps a timeline, kept for `--trace` and returned,
/// when tracing (`None` otherwise).
#[allow(clippy::too_many_arguments)]
fn traced(
    b: &Bench,
    cfg: PipelineConfig,
    test: &str,
    name: &str,
    size: u64,
    src: Source<'_>,
    dst: Option<&mut PinnedBuffer>,
    stage: &dyn Fn(&GpuChunk<'_>) -> Result<(), String>,
) -> Result<Option<Timeline>, BenchError> {
    if !tracing() {
        return Ok(None);
    }
    let mut p = CudaPipeline::new(&b.engine, cfg.timeline(true)).map_err(setup)?;
    let rep = p
        .run(src, dst.map(Dest::new), stage)
        .map_err(|e| failed(test, name, size)(e.to_string()))?;
    Ok(rep.timeline.inspect(|tl| {
        keep_trace(format!("{test} {}", format_size(size)), tl.clone());
    }))
}

/// Times `a` and `b` taking turns sample by sample ([`measure_pair`]), so that a host whose
/// speed drifts during the row (the GPU host is a shared VM: run 56's pageable rows swung
/// 24-39 GB/s between series) moves both alike and their ratio stays fair; each one's error
/// named by its series.
fn timed_pair(
    method: &Method,
    (test, size): (&str, u64),
    (a_name, mut a): (&str, impl FnMut() -> Result<(), String>),
    (b_name, mut b): (&str, impl FnMut() -> Result<(), String>),
) -> Result<(Timing, Timing), BenchError> {
    let method = Method {
        warmup: method.warmup.max(WARMUP_RUNS),
        ..method.clone()
    };
    measure_pair(
        &method,
        || a().map_err(failed(test, a_name, size)),
        || b().map_err(failed(test, b_name, size)),
    )
}

/// `cuda-pipeline`: upload, compute, download.
fn three_steps(b: &Bench, test: &TestInfo, size: u64, method: &Method) -> Result<Row, BenchError> {
    let (n, chunk, rounds) = (b.n, b.chunk, b.rounds);
    let mut dst = PinnedBuffer::new(n).map_err(setup)?;
    let name = format!("ferry pipeline (K={SLOTS})");
    let stage = |g: &GpuChunk<'_>| {
        let out = g.output().ok_or("no output slot")?;
        launch(&b.f, g.stream(), g.input(), out, g.chunk().len, rounds)
    };
    let cfg = PipelineConfig::new(chunk, SLOTS);
    let mut pipe = CudaPipeline::new(&b.engine, cfg).map_err(setup)?;
    let src = Source::new(&b.src);
    run_once(&mut pipe, src, Some(&mut dst), &stage).map_err(failed(test.name, &name, size))?;
    verify(test.name, &name, size, &b.src, &dst, rounds)?;
    let ferry_out = dst.to_vec();
    dst.fill(0);

    let dst_addr = dst.raw_mut().addr;
    let d2h = |off: usize, d: u64, len: usize, st: &CudaStream| {
        // SAFETY: `d` is a slot of at least `len` bytes, `dst` holds `off + len`; every caller
        // synchronizes before the buffers go.
        drv("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2((dst_addr + off as u64) as *mut _, d, len, st.cu_stream())
        })
    };

    // Sequential: copy in, compute, copy out, each waited for.
    let seq_name = "sequential copy-compute-copy (raw, synchronized)";
    let s = &b.s;
    let seq_t = measure(method, || {
        for (i, off, len) in b.chunks() {
            let (din, dout) = (
                b.ins[i % SLOTS].device_ptr(),
                b.outs[i % SLOTS].device_ptr(),
            );
            b.h2d(din, off, len, s)?;
            cu(s.synchronize())?;
            launch(&b.f, s, din, dout, len, rounds)?;
            cu(s.synchronize())?;
            d2h(off, dout, len, s)?;
            cu(s.synchronize())?;
        }
        Ok(())
    })
    .map_err(failed(test.name, seq_name, size))?;
    compare(test.name, seq_name, size, &dst, &ferry_out)?;
    dst.fill(0);

    // Raw loop: three streams, events reused per slot, the same schedule as ferry's.
    let raw_name = "raw driver loop (3 streams, events)";
    let stream = || b.ctx.new_stream().map_err(setup);
    let (up, comp, down) = (stream()?, stream()?, stream()?);
    let (uploaded, computed, downloaded) = (b.new_events()?, b.new_events()?, b.new_events()?);
    let raw = || {
        for (i, off, len) in b.chunks() {
            let k = i % SLOTS;
            let (din, dout) = (b.ins[k].device_ptr(), b.outs[k].device_ptr());
            if i >= SLOTS {
                cu(up.wait(&computed[k]))?;
            }
            b.h2d(din, off, len, &up)?;
            cu(uploaded[k].record(&up))?;
            cu(comp.wait(&uploaded[k]))?;
            if i >= SLOTS {
                cu(comp.wait(&downloaded[k]))?;
            }
            launch(&b.f, &comp, din, dout, len, rounds)?;
            cu(computed[k].record(&comp))?;
            cu(down.wait(&computed[k]))?;
            d2h(off, dout, len, &down)?;
            cu(downloaded[k].record(&down))?;
        }
        cu(down.synchronize())?;
        cu(comp.synchronize())
    };
    raw().map_err(failed(test.name, raw_name, size))?;
    compare(test.name, raw_name, size, &dst, &ferry_out)?;
    dst.fill(0);

    // ferry and the raw loop timed in turns (both write the same bytes into `dst`).
    let (ferry_t, raw_t) = timed_pair(
        method,
        (test.name, size),
        (&name, || run_once(&mut pipe, src, Some(&mut dst), &stage)),
        (raw_name, &raw),
    )?;
    // Each once more into a cleared destination (either may have written it last), checked;
    // ferry's run is the traced one when tracing.
    dst.fill(0);
    raw().map_err(failed(test.name, raw_name, size))?;
    compare(test.name, raw_name, size, &dst, &ferry_out)?;
    dst.fill(0);
    let timeline = traced(b, cfg, test.name, &name, size, src, Some(&mut dst), &stage)?;
    if timeline.is_none() {
        run_once(&mut pipe, src, Some(&mut dst), &stage).map_err(failed(test.name, &name, size))?;
    }
    compare(test.name, &name, size, &dst, &ferry_out)?;
    Ok(Row::new(
        test.name,
        Kind::Bandwidth,
        size,
        size,
        b.shape("pinned source and destination", timeline.as_ref()),
        vec![
            Series::new(name, Role::Ferry, Kind::Bandwidth, size, ferry_t),
            Series::new(seq_name, Role::Baseline, Kind::Bandwidth, size, seq_t),
            Series::new(raw_name, Role::Baseline, Kind::Bandwidth, size, raw_t),
        ],
    ))
}
