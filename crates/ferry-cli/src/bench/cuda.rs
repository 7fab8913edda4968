//! GPU tests of `ferry bench`: the CUDA engine next to raw driver calls, in the same run, on
//! the same buffers.
//!
//! Every bandwidth series does one *batch* per timed call: `batch` copies released together
//! (ferry: `batch` requests submitted back to back, then waited; raw: `batch` driver calls on
//! one stream, then one synchronize). `batch` is 8 below 16 MiB and 1 above. Where the copies
//! only enqueue and take few driver calls (every bandwidth test but the pageable ones,
//! `cuda-transpose*` and `cuda-scatter`, whose raw baselines make thousands of calls: more than
//! a stream's queue holds behind a closed latch), the batch is timed with CUDA events behind a
//! latch ([`StreamTimer`]; `cuda-bidir`: both streams behind one latch), as
//! nvbandwidth does: ferry's side on the engine's stream for the copy's direction
//! ([`CudaEngine::stream`]), the raw side on the raw copier's stream
//! ([`RawCopier::timed`]). The other rows, and all rows if the latch cannot be set up here,
//! are timed on the host ([`Clock`](super::Clock) says which, per series). Bandwidth rows use
//! an engine with [`WaitMode::Spin`], as the raw side's `cuStreamSynchronize` spins by
//! default; the latency rows show the default wait ([`WaitMode::Auto`]) and the spin wait.
//! Beside the GPU-event figure, every bandwidth row with a raw submit + synchronize baseline
//! (pinned, pageable and mapped h2d/d2h, d2d, bidir, tile, the transposes, scatter and the
//! pageable segment lists; `cuda-threads` rows are host-clocked submit + wait already) carries
//! the caller's view (`cuda/caller.rs`, [`CallerView`](super::CallerView), one function for
//! every row: `CudaBench::caller_pair`): one operation per call through the public API on the
//! default-config engine, host clock around scope + submit + wait, next to the row's raw driver
//! calls and their `cuStreamSynchronize` timed the same way, interleaved, on the same buffers; and the contiguous rows each series's process CPU time per GB moved. `cuda-wait-cpu` meters the
//! waiting thread's CPU time during one long copy. Destinations
//! are poisoned before each series and compared with the source after it. The link limit is
//! PCIe generation x width as the probe reads it (e.g. gen 5 x16 = 63.0 GB/s per direction).
//!
//! Files: this one holds the test table, the engines and the dispatch; `cuda/timing.rs` how a
//! series is timed and checked; the tests in `cuda/contiguous.rs` (pinned, pageable, d2d,
//! bidir), `cuda/mapped.rs`, `cuda/strided.rs` (tile, transpose, scatter), `cuda/latency.rs`,
//! `cuda/parts.rs` (`cuda-latency-parts`), `cuda/segments.rs` (pageable segment lists),
//! `cuda/threads.rs` (`cuda-threads`: many submitting threads, host clock, one row per thread
//! count), `cuda/blocks.rs` (`cuda-blocks-*`: KV-cache block copies, the SMs free and busy, and
//! the interference with a running kernel) and `cuda/caller.rs` (the caller's view, CPU metering, `cuda-wait-cpu`).

mod blocks;
mod caller;
mod contiguous;
mod latency;
mod mapped;
mod parts;
mod segments;
mod strided;
mod threads;
mod timing;

use super::ctx::{setup, Ctx};
use super::{BenchError, Kind, Method, Needs, Row, TestInfo};
use ferry::cuda::{self, CudaConfig, CudaEngine, KernelCopies, WaitMode};
use ferry_bench::{RawCopier, StreamTimer};

/// The GPU tests (the same paths as the design notes' H200 table).
pub static TESTS: &[TestInfo] = &[
    TestInfo::new("cuda-h2d-pinned", "host (pinned) -> device, vs raw cuMemcpyHtoDAsync", Needs::Cuda, Kind::Bandwidth, "64K,1M,16M,256M"),
    TestInfo::new("cuda-d2h-pinned", "device -> host (pinned), vs raw cuMemcpyDtoHAsync", Needs::Cuda, Kind::Bandwidth, "64K,1M,16M,256M"),
    TestInfo::new("cuda-h2d-pageable", "host (pageable) -> device, ferry's pageable path, vs the driver's own pageable copy", Needs::Cuda, Kind::Bandwidth, "1M,16M,256M"),
    TestInfo::new("cuda-d2h-pageable", "device -> host (pageable), ferry's pageable path, vs the driver's own pageable copy", Needs::Cuda, Kind::Bandwidth, "1M,16M,256M"),
    TestInfo::new("cuda-d2d", "device -> device on one GPU, vs raw cuMemcpyDtoDAsync", Needs::Cuda, Kind::Bandwidth, "1M,16M,256M"),
    TestInfo::new("cuda-bidir", "host -> device and device -> host at once (pinned), payload both ways", Needs::Cuda, Kind::Bandwidth, "1M,16M,256M"),
    TestInfo::new("cuda-tile", "2-D tile (4 KiB rows of a pinned matrix twice as wide) -> device, vs raw cuMemcpy2DAsync and a contiguous copy of the same bytes", Needs::Cuda, Kind::Bandwidth, "1M,16M,256M"),
    TestInfo::new("cuda-h2d-mapped", "host (mapped, zero-copy) -> device read by the SMs (KernelCopies::Always), vs a plain SM kernel launch and cuMemcpyAsync on the copy engine", Needs::Cuda, Kind::Bandwidth, "64K,1M,16M,256M"),
    TestInfo::new("cuda-d2h-mapped", "device -> host (mapped, zero-copy) written by the SMs (KernelCopies::Always), vs a plain SM kernel launch and cuMemcpyAsync on the copy engine", Needs::Cuda, Kind::Bandwidth, "64K,1M,16M,256M"),
    TestInfo::new("cuda-transpose", "transpose of a square f32 matrix (size = matrix bytes; 256M = 8192 x 8192), device -> device, vs raw cuMemcpy2D/3DAsync of the same plan and a contiguous copy of the same bytes", Needs::Cuda, Kind::Bandwidth, "1M,16M,64M,256M"),
    TestInfo::new("cuda-transpose-h2d", "transpose of a square f32 matrix, pinned host -> device, vs raw cuMemcpy2D/3DAsync of the same plan and a contiguous copy of the same bytes", Needs::Cuda, Kind::Bandwidth, "1M,16M,64M,256M"),
    TestInfo::new("cuda-transpose-bf16", "transpose of a square bf16 matrix (size = matrix bytes; 128M = 8192 x 8192), device -> device, vs raw cuMemcpy2D/3DAsync of the same plan and a contiguous copy of the same bytes", Needs::Cuda, Kind::Bandwidth, "1M,16M,128M"),
    TestInfo::new("cuda-transpose-h2d-bf16", "transpose of a square bf16 matrix, pinned host -> device, vs raw cuMemcpy2D/3DAsync of the same plan and a contiguous copy of the same bytes", Needs::Cuda, Kind::Bandwidth, "1M,16M,128M"),
    TestInfo::new("cuda-transpose-batched", "batched transpose [16, n, n] -> last two axes swapped, f32 (size = all 16 matrices), device -> device, vs raw cuMemcpy2D/3DAsync of the same plan and a contiguous copy of the same bytes", Needs::Cuda, Kind::Bandwidth, "16M,256M"),
    TestInfo::new("cuda-scatter", "100,000 scattered segments (size = segment) pinned -> device, vs one cuMemcpyAsync per segment", Needs::Cuda, Kind::Bandwidth, "1K,4K,64K"),
    TestInfo::new("cuda-scatter-pageable", "100,000 scattered segments (size = segment) pageable -> device, vs one cuMemcpyAsync per segment and a 1-thread CPU gather to pinned + one cuMemcpyAsync; CPU time per GB", Needs::Cuda, Kind::Bandwidth, "1K,4K,64K"),
    TestInfo::new("cuda-gather-pageable", "device -> 100,000 scattered segments (size = segment) of pageable memory, vs one cuMemcpyAsync per segment and one cuMemcpyAsync to pinned + a 1-thread CPU scatter; CPU time per GB", Needs::Cuda, Kind::Bandwidth, "1K,4K,64K"),
    TestInfo::new("cuda-blocks-h2d", "block copy (size = block; rows of 16, 256, 4096 blocks, at most 1 GiB) pinned -> device table, a permutation: ferry with the SMs free and busy, vs raw cuMemcpyBatchAsync, cuMemcpyAsync per block and the SM gather kernel; CPU time per GB, submit cost", Needs::Cuda, Kind::Bandwidth, "4K,8K,32K,64K,512K,2M"),
    TestInfo::new("cuda-blocks-d2h", "as cuda-blocks-h2d, device -> pinned table", Needs::Cuda, Kind::Bandwidth, "4K,8K,32K,64K,512K,2M"),
    TestInfo::new("cuda-blocks-d2d", "as cuda-blocks-h2d, device -> device table", Needs::Cuda, Kind::Bandwidth, "4K,8K,32K,64K,512K,2M"),
    TestInfo::new("cuda-blocks-busy", "block copy pinned -> device (the largest count that fits) while an FMA kernel on every SM runs on another stream: time until both are done, and the kernel's slowdown per mechanism", Needs::Cuda, Kind::Latency, "8K,64K,512K,2M"),
    TestInfo::new("cuda-latency", "submit+wait of one small pinned -> device copy, default wait (WaitMode::Auto), vs cuMemcpyAsync + cuStreamSynchronize", Needs::Cuda, Kind::Latency, "4,64,1K,4K,64K"),
    TestInfo::new("cuda-latency-spin", "as cuda-latency with WaitMode::Spin", Needs::Cuda, Kind::Latency, "4,64,1K,4K,64K"),
    TestInfo::new("cuda-latency-hybrid", "as cuda-latency with WaitMode::SpinThenBlock(50 us)", Needs::Cuda, Kind::Latency, "4,4K,64K"),
    TestInfo::new("cuda-wait-cpu", "the waiting thread's CPU time (getrusage RUSAGE_THREAD, wait_cpu_share) during one pinned -> device copy: default wait, Spin, raw cuStreamSynchronize", Needs::Cuda, Kind::Latency, "256M"),
    TestInfo::new("cuda-threads", "1, 2, 8, 16 threads each copying its own pinned buffer -> its own device buffer (size = one copy), submit+wait per copy through ONE shared engine (default config) vs a raw stream per thread (cuMemcpyHtoDAsync + cuStreamSynchronize); rows cuda-threads[N]", Needs::Cuda, Kind::Bandwidth, "64K,4M"),
    TestInfo::new("cuda-latency-parts", "where a small submit+wait's time goes: ferry through the scope (spin and default engines) and through submit_raw (spin; and its submit alone and its wait alone, spin and default), vs raw cuMemcpyAsync waited by stream sync (own stream, ferry's), event sync (one event, 64 in turn), event + stream sync, event query loop", Needs::Cuda, Kind::Latency, "4,4K,64K"),
];

/// Whether the GPU tests can run, or why not.
pub fn available() -> Result<(), String> {
    let p = cuda::probe();
    match p.driver {
        Err(why) => Err(why),
        Ok(_) if p.devices.is_empty() => Err("the CUDA driver sees no GPU".to_string()),
        Ok(_) => Ok(()),
    }
}

/// `src` compiled to PTX for a bench's own kernel (the compute the block and pipeline rows
/// run beside their copies), or why not: NVRTC's absence is asked first, as cudarc's loader
/// panics where the library is missing.
pub(crate) fn compile_kernel(src: &str) -> Result<cudarc::nvrtc::Ptx, String> {
    // SAFETY: only tries to dlopen NVRTC by its usual names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("the compute kernel needs NVRTC (libnvrtc), absent here".into());
    }
    cudarc::nvrtc::compile_ptx(src).map_err(|e| format!("NVRTC: {e}"))
}

/// Whether the tests between GPUs can run (at least two GPUs), or why not.
pub fn available_two() -> Result<(), String> {
    available()?;
    match cuda::probe().devices.len() {
        n if n >= 2 => Ok(()),
        n => Err(format!("needs 2 GPUs; this machine has {n}")),
    }
}

/// An engine for a bench's series and its twin of the same settings for the event timer: the
/// latch holds the twin's streams, and asking an engine for a stream hands it to the caller for
/// the rest of the process (every request there then records its event at submit, held copies
/// go to the driver at once), so the engine the other series use keeps streams of its own.
/// Derefs to the engine.
pub(super) struct Twin {
    engine: CudaEngine,
    /// Used only behind the latch (`timing::ferry_batches`).
    pub(super) latched: CudaEngine,
}

impl Twin {
    fn new(cfg: CudaConfig) -> Result<Twin, BenchError> {
        Ok(Twin {
            engine: CudaEngine::with_config(cfg).map_err(setup)?,
            latched: CudaEngine::with_config(cfg).map_err(setup)?,
        })
    }

    /// Compiles and loads both engines' kernels now (`CudaEngine::compile_kernels`), before a
    /// row times them behind the latch: loading a module may wait for the context's streams,
    /// which the closed latch holds (the tenth H100 run: both mapped tests failed at their first
    /// size, the watchdog opening the latch after 10 s). A failure is left to the timed call,
    /// which then runs without the kernels as any first call would.
    fn kernels_ready(&self) {
        let _ = self.engine.compile_kernels();
        let _ = self.latched.compile_kernels();
    }
}

impl std::ops::Deref for Twin {
    type Target = CudaEngine;
    fn deref(&self) -> &CudaEngine {
        &self.engine
    }
}

/// The GPU side of a bench run: engines on device 0 and a raw copier, created once.
pub struct CudaBench {
    engine: CudaEngine,
    spin: Twin,
    /// Spin waits, every copy between device-accessible buffers on the SMs.
    sm: Twin,
    raw: RawCopier,
    /// The latch and events; `None` where they cannot work here (host clock then).
    timer: Option<StreamTimer>,
    method: Method,
    link_gbps: Option<f64>,
}

/// Copies per timed call: 8 below 16 MiB, else 1.
pub(super) fn batch(size: usize) -> usize {
    if size < 16 << 20 {
        8
    } else {
        1
    }
}

/// PCIe link limit per direction in GB/s.
fn link_limit(gen: u32, width: u32) -> Option<f64> {
    let (gts, enc) = match gen {
        1 => (2.5, 0.8),
        2 => (5.0, 0.8),
        3 => (8.0, 128.0 / 130.0),
        4 => (16.0, 128.0 / 130.0),
        5 => (32.0, 128.0 / 130.0),
        6 => (64.0, 1.0),
        _ => return None,
    };
    Some(gts * enc * width as f64 / 8.0)
}

impl CudaBench {
    /// Engines on device 0 (default wait, and spin wait for the latency test).
    pub fn new(method: Method) -> Result<CudaBench, BenchError> {
        // FERRY_STAGING_* tune the staged path, as in any program that asks for them.
        let base = CudaConfig::from_env(0).map_err(setup)?;
        let engine = CudaEngine::with_config(base).map_err(setup)?;
        let spin = Twin::new(base.wait_mode(WaitMode::Spin))?;
        let sm = Twin::new(
            base.wait_mode(WaitMode::Spin)
                .kernel_copies(KernelCopies::Always),
        )?;
        let raw = RawCopier::new(0).map_err(setup)?;
        // The latch must work on this driver: one empty timed batch, else the host clock. On
        // the timer's own stream: asking an engine for its stream hands the stream to the
        // caller for the rest of the process (an event per request, held copies issued at once:
        // the third H100 run's device -> device "held batch" rows were one call per block).
        let timer = StreamTimer::new(0).ok().filter(StreamTimer::works);
        let link_gbps = cuda::probe()
            .devices
            .first()
            .and_then(|d| link_limit(d.pcie_gen?, d.pcie_width?));
        Ok(CudaBench {
            engine,
            spin,
            sm,
            raw,
            timer,
            method,
            link_gbps,
        })
    }

    /// Runs one GPU test at one size: one row, or one per thread count (`cuda-threads`).
    pub fn run(&mut self, test: &TestInfo, size: u64) -> Result<Vec<Row>, BenchError> {
        let ctx = Ctx::new(test, size);
        let size = usize::try_from(size).map_err(|_| ctx.bad("larger than the address space"))?;
        let mut row = match test.name {
            "cuda-h2d-pinned" => self.h2d(&ctx, size, true)?,
            "cuda-d2h-pinned" => self.d2h(&ctx, size, true)?,
            "cuda-h2d-pageable" => self.h2d(&ctx, size, false)?,
            "cuda-d2h-pageable" => self.d2h(&ctx, size, false)?,
            "cuda-d2d" => self.d2d(&ctx, size)?,
            "cuda-bidir" => self.bidir(&ctx, size)?,
            "cuda-tile" => self.tile(&ctx, size)?,
            "cuda-h2d-mapped" => self.h2d_mapped(&ctx, size)?,
            "cuda-d2h-mapped" => self.d2h_mapped(&ctx, size)?,
            "cuda-transpose" => self.transpose(&ctx, size, (4, 1), false)?,
            "cuda-transpose-h2d" => self.transpose(&ctx, size, (4, 1), true)?,
            "cuda-transpose-bf16" => self.transpose(&ctx, size, (2, 1), false)?,
            "cuda-transpose-h2d-bf16" => self.transpose(&ctx, size, (2, 1), true)?,
            "cuda-transpose-batched" => self.transpose(&ctx, size, (4, 16), false)?,
            "cuda-scatter" => self.scatter(&ctx, size)?,
            "cuda-scatter-pageable" => self.pageable_segments(&ctx, size, true)?,
            "cuda-gather-pageable" => self.pageable_segments(&ctx, size, false)?,
            "cuda-latency" => self.latency(&ctx, size, &self.engine, "")?,
            "cuda-latency-spin" => self.latency(&ctx, size, &self.spin, " spin")?,
            "cuda-latency-hybrid" => {
                let wait = WaitMode::SpinThenBlock(std::time::Duration::from_micros(50));
                let e = CudaEngine::with_config(CudaConfig::new(0).wait_mode(wait));
                self.latency(&ctx, size, &e.map_err(setup)?, " spin-then-block")?
            }
            "cuda-latency-parts" => self.latency_parts(&ctx, size)?,
            "cuda-threads" => return self.threads(&ctx, size),
            "cuda-blocks-h2d" => return self.blocks(&ctx, size, blocks::Way::H2d),
            "cuda-blocks-d2h" => return self.blocks(&ctx, size, blocks::Way::D2h),
            "cuda-blocks-d2d" => return self.blocks(&ctx, size, blocks::Way::D2d),
            "cuda-blocks-busy" => self.blocks_busy(&ctx, size)?,
            "cuda-wait-cpu" => self.wait_cpu(&ctx, size)?,
            _ => {
                return Err(BenchError::UnknownTest {
                    name: test.name.into(),
                    valid: TESTS.iter().map(|t| t.name).collect::<Vec<_>>().join(", "),
                })
            }
        };
        let host_link = !matches!(
            test.name,
            "cuda-d2d" | "cuda-transpose" | "cuda-transpose-bf16" | "cuda-transpose-batched"
        ) && test.kind == Kind::Bandwidth;
        if let (true, Some(limit), Some(f)) =
            (host_link, self.link_gbps, row.ferry().map(|s| s.median))
        {
            // Both directions at once: each direction has its own lanes.
            let limit = if test.name == "cuda-bidir" {
                2.0 * limit
            } else {
                limit
            };
            row.link_limit_fraction = Some(f / limit);
        }
        Ok(vec![row])
    }
}
