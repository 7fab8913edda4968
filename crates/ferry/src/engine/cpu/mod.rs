//! The CPU engine: the caller's thread and a pool of workers, sharing each large copy.
//!
//! - Small copies (at most [`CpuConfig::inline_bytes`]) run on the submitting thread during
//!   submit: handing them to a worker would cost more than the copy, and the caller's cache
//!   holds the data. A contiguous or strided copy so allocates nothing and its request is
//!   done when submit returns. Set it to 0 to queue all.
//! - Parallel inside one request, where it pays: a copy larger than
//!   [`CpuConfig::split_bytes`] (from the cache size: [`CpuProbe::split_bytes`]) is split into
//!   one chunk per core at most (at least [`CpuConfig::chunk_bytes`] each); the submitting
//!   thread runs one share at submit, the workers the others (and the waiting thread any that
//!   no worker took yet). A copy between the two thresholds is one chunk, queued.
//! - Transposes (one element per run against the source's grain): a blocked kernel per
//!   element size (1, 2, 4, 8, 16 bytes; SIMD register transposes for 4 and 8 on x86_64).
//! - Threads: `CpuEngine::new(0)` (and `CpuConfig::new(0)`, and the C API's
//!   `ferry_dma_cpu_create(&dma, 0)`) means one worker per core.
//! - Caller-runs mode ([`CpuEngine::caller_runs`], [`CpuConfig::caller_runs`]): no workers,
//!   nothing runs in the background; the caller makes progress in `wait` and `barrier`.
//! - Each request completes on its own with its own error; a panicking custom operator fails
//!   only its request and the worker lives on.
//! - Dropping the engine finishes the queued work first; dropping a request does not cancel it.
//!
//! It reaches host-accessible memory only (pageable, pinned, mapped, managed).

mod config;
mod exec;
mod pool;
mod probe;

pub use config::{CpuConfig, THREADS_MAX};
pub use probe::{probe, CpuProbe};

use super::{check_bufs, Engine, Job, SubmitError};
use crate::memory::{MemKind, RawBuf};
use crate::op::checked_run;
use crate::plan::Plan;
use crate::request::{BarrierError, InFlight, Request};
use crate::Layout;
use pool::Pool;
use std::sync::Arc;

/// The CPU engine. See the [module documentation](self).
///
/// ```
/// use ferry::{CpuEngine, EngineExt};
/// let engine = CpuEngine::new(2)?;
/// let t = engine.memcpy_owned(vec![0u8; 8 << 20], vec![1u8; 8 << 20])?;
/// let (dst, _src) = t.wait()?;
/// assert!(dst.iter().all(|&b| b == 1));
/// # Ok::<(), ferry::Error>(())
/// ```
pub struct CpuEngine {
    pool: Arc<Pool>,
    inflight: InFlight,
    cfg: CpuConfig,
}

impl CpuEngine {
    /// An engine with `threads` workers (0: one per core, as the C API's
    /// `ferry_dma_cpu_create(&dma, 0)`).
    pub fn new(threads: usize) -> Result<CpuEngine, crate::Error> {
        CpuEngine::with_config(CpuConfig::new(threads))
    }
    /// An engine without workers: the caller runs the work in `wait`/`barrier`
    /// ([`CpuConfig::caller_runs`]).
    pub fn caller_runs() -> Result<CpuEngine, crate::Error> {
        CpuEngine::with_config(CpuConfig::caller_runs())
    }
    /// An engine with the given settings. Errors: more than [`THREADS_MAX`] workers
    /// ([`crate::Error::InvalidArgument`]), a worker thread that cannot be started.
    pub fn with_config(cfg: CpuConfig) -> Result<CpuEngine, crate::Error> {
        if cfg.threads > THREADS_MAX {
            // Asked for 1,000,000 (Python) or INT_MAX (the C API), threads were started until
            // the system refused one.
            return Err(crate::Error::InvalidArgument(format!(
                "{} worker threads asked for; at most {THREADS_MAX}",
                cfg.threads
            )));
        }
        let pool = Pool::start(cfg.threads, probe().cores)
            .map_err(|e| crate::Error::Thread(format!("CPU worker: {e}")))?;
        Ok(CpuEngine {
            pool,
            inflight: InFlight::new(),
            cfg,
        })
    }
    /// The engine's settings.
    pub fn config(&self) -> CpuConfig {
        self.cfg
    }
    /// Worker threads still alive (for tests of worker loss).
    pub fn live_workers(&self) -> usize {
        self.pool.live_workers()
    }
}

impl CpuEngine {
    /// The inline part of [`Engine::submit_copy`] for a copy that is not one run (a tile, a
    /// transpose) of at most [`CpuConfig::inline_bytes`]: planned and run here, without a
    /// program or a job; `false`, having touched nothing, for any other.
    ///
    /// # Safety
    /// As [`Engine::submit_copy`]; the layouts were checked against the buffers' lengths
    /// (`checked_run` did).
    unsafe fn plan_now(&self, dst: RawBuf, src: RawBuf, dl: &Layout, sl: &Layout) -> bool {
        if check_bufs(dst, Some(src)).is_err() || !self.supports(dst.kind, Some(src.kind)) {
            return false;
        }
        match Plan::general(dl, sl) {
            Ok(plan) if plan.total_bytes() <= self.cfg.inline_bytes => {
                // SAFETY: the caller guarantees the buffers for the call; the layouts lie
                // inside them (checked), so the plan's runs do; `check_bufs` found them
                // disjoint.
                unsafe { exec::copy_plan(dst, src, &plan) };
                true
            }
            _ => false,
        }
    }
}

impl Engine for CpuEngine {
    fn name(&self) -> String {
        format!("cpu({})", self.cfg.threads)
    }

    fn supports(&self, dst: MemKind, src: Option<MemKind>) -> bool {
        dst.host_accessible() && src.is_none_or(MemKind::host_accessible)
    }

    unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
        job.check()?;
        if !self.supports(job.dst.kind, job.src.map(|s| s.kind)) {
            return Err(SubmitError::Unsupported {
                engine: self.name(),
                dst: job.dst.kind,
                src: job.src.map(|s| s.kind),
            });
        }
        let req = self.pool.submit(job, &self.cfg)?;
        // A copy that already ran inline and succeeded has nothing left for a barrier.
        if !matches!(req.completion().poll_done(), Some(Ok(()))) {
            self.inflight.track(&req);
        }
        Ok(req)
    }

    /// A copy of at most [`CpuConfig::inline_bytes`] runs here, on the caller's thread, and
    /// returns a done request that allocated nothing (one run: no plan either); any other copy
    /// (errors included) as `submit_raw`'s job.
    #[inline]
    unsafe fn submit_copy(
        &self,
        dst: RawBuf,
        dst_layout: &Layout,
        src: RawBuf,
        src_layout: &Layout,
    ) -> Result<Request, SubmitError> {
        let inline = match checked_run(dst_layout, src_layout, dst.len, src.len) {
            Ok(Some(run)) if run.2 <= self.cfg.inline_bytes => {
                let ok =
                    check_bufs(dst, Some(src)).is_ok() && self.supports(dst.kind, Some(src.kind));
                if ok {
                    // SAFETY: the caller guarantees the buffers until the request completes
                    // (it completes here); the run lies inside both (`checked_run`), and
                    // `check_bufs` found them disjoint.
                    unsafe { exec::copy_at(dst, src, run) };
                }
                ok
            }
            // SAFETY: forwarded with the caller's guarantees; `checked_run` checked both
            // layouts against their buffers.
            Ok(None) => unsafe { self.plan_now(dst, src, dst_layout, src_layout) },
            _ => false,
        };
        if inline {
            return Ok(Request::ready(Ok(())));
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.submit_raw(Job::copy(dst, *dst_layout, src, *src_layout)) }
    }

    fn inline_bytes(&self) -> usize {
        self.cfg.inline_bytes
    }

    fn barrier(&self) -> Result<(), BarrierError> {
        self.pool.help_until_idle();
        self.inflight.barrier()
    }
}

impl Drop for CpuEngine {
    fn drop(&mut self) {
        // Finish queued work (on this thread in zero-thread mode), then stop the workers.
        self.pool.shutdown();
    }
}
