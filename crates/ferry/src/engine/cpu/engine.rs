//! [`CpuEngine`]: its state (the pool, the in-flight list, the settings) and constructors.

use super::config::{CpuConfig, THREADS_MAX};
use super::pool::Pool;
use super::probe::probe;
use crate::request::InFlight;
use std::sync::Arc;

/// The CPU engine. See the [module documentation](super).
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
    pub(super) pool: Arc<Pool>,
    pub(super) inflight: InFlight,
    pub(super) cfg: CpuConfig,
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
    /// An engine with the given settings. Errors: more than [`CpuConfig::THREADS_MAX`](crate::CpuConfig::THREADS_MAX) workers
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

impl Drop for CpuEngine {
    fn drop(&mut self) {
        // Finish queued work (on this thread in zero-thread mode), then stop the workers.
        self.pool.shutdown();
    }
}
