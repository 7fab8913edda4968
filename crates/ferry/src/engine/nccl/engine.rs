//! [`NcclEngine`]: one rank of a communicator. Joining it (`ncclCommInitRankConfig`, waited up
//! to the join timeout and checked against the configuration), what the engine is, its barrier,
//! abort, and its orderly end. Sends and receives are submitted in `submit.rs`.

use super::comm::Comm;
use super::completion::{self, Inner};
use super::config::NcclConfig;
use super::error::NcclError;
use super::sys;
use crate::engine::cuda::sys::driver;
use crate::engine::cuda::CudaError;
use crate::request::{BarrierError, InFlight};
use cudarc::driver::CudaStream;
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// One rank of an NCCL communicator. See the [module documentation](super).
pub struct NcclEngine {
    pub(super) cfg: NcclConfig,
    pub(super) comm: Arc<Comm>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) inflight: InFlight,
    pub(super) waker_tx: Sender<Arc<Inner>>,
}

impl std::fmt::Debug for NcclEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclEngine")
            .field("rank", &self.cfg.rank)
            .field("nranks", &self.cfg.nranks)
            .field("device", &self.cfg.ordinal)
            .finish()
    }
}

/// Sets `NCCL_NVLS_ENABLE=0` unless the user set it: ferry never uses NVLink multicast.
pub(super) fn no_multicast() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            std::env::set_var("NCCL_NVLS_ENABLE", "0");
        }
    });
}

impl NcclEngine {
    /// Joins the communicator: blocks until every rank has joined or the timeout passes.
    /// Errors: [`NcclError::InvalidConfig`], [`NcclError::NoLibrary`], [`NcclError::Cuda`],
    /// [`NcclError::Timeout`] (a rank never arrived; the half-made communicator is aborted),
    /// [`NcclError::Nccl`].
    pub fn new(cfg: NcclConfig) -> Result<NcclEngine, NcclError> {
        cfg.validate()?;
        no_multicast();
        let lib = sys::lib().map_err(NcclError::NoLibrary)?;
        let ctx = driver::context(cfg.ordinal)?;
        driver::bind(&ctx)?;
        let stream = ctx.new_stream().map_err(|e| {
            CudaError::Driver(crate::cuda::DriverError::from_cudarc("cuStreamCreate", e))
        })?;
        let mut raw: sys::Comm = std::ptr::null_mut();
        let mut conf = sys::Config::blocking(cfg.blocking);
        // SAFETY: valid out-pointer and config; the id is 128 bytes by value; this device's
        // context is current (NCCL takes the current device).
        let r = unsafe {
            (lib.comm_init_rank_config)(
                &mut raw,
                cfg.nranks as i32,
                cfg.id.raw(),
                cfg.rank as i32,
                &mut conf,
            )
        };
        if r != sys::SUCCESS && r != sys::IN_PROGRESS {
            let e = NcclError::nccl("ncclCommInitRankConfig", r, None);
            if !raw.is_null() {
                // SAFETY: a communicator handle NCCL returned; freed once, here.
                let _ = unsafe { (lib.comm_abort)(raw) };
            }
            return Err(e);
        }
        if raw.is_null() {
            return Err(NcclError::Nccl {
                call: "ncclCommInitRankConfig",
                code: r,
                msg: "returned no communicator".into(),
            });
        }
        let comm = Arc::new(Comm::new(raw, lib, ctx));
        {
            let mut st = comm.lock();
            comm.wait_ready_locked(
                &mut st,
                "ncclCommInitRankConfig",
                &format!(
                    "all {} ranks to join the communicator (this is rank {})",
                    cfg.nranks, cfg.rank
                ),
                cfg.init_timeout,
            )?;
            // NCCL's view of the communicator must be the configured one.
            let query = |f: unsafe extern "C" fn(sys::Comm, *mut i32) -> sys::NcclResult| {
                let mut v = -1;
                // SAFETY: a live, ready communicator (lock held); `v` a valid out-pointer.
                let r = unsafe { f(comm.raw, &mut v) };
                (r == sys::SUCCESS).then_some(v)
            };
            let seen = (
                query(lib.comm_count),
                query(lib.comm_user_rank),
                query(lib.comm_cu_device),
            );
            let want = (
                Some(cfg.nranks as i32),
                Some(cfg.rank as i32),
                Some(cfg.ordinal as i32),
            );
            if seen != want {
                return Err(NcclError::InvalidConfig(format!(
                    "NCCL reports (ranks, rank, device) = {seen:?}, configured {want:?}"
                )));
            }
        }
        let waker_tx = completion::spawn_waiter(format!("ferry-nccl{}-waiter", cfg.rank))
            .map_err(|e| CudaError::Thread(e.to_string()))?;
        Ok(NcclEngine {
            cfg,
            comm,
            stream,
            inflight: InFlight::new(),
            waker_tx,
        })
    }

    /// The settings.
    pub fn config(&self) -> &NcclConfig {
        &self.cfg
    }
    /// This rank.
    pub fn rank(&self) -> u32 {
        self.cfg.rank
    }
    /// Ranks in the communicator.
    pub fn nranks(&self) -> u32 {
        self.cfg.nranks
    }
    /// The GPU of this rank.
    pub fn ordinal(&self) -> u32 {
        self.cfg.ordinal
    }
    /// The stream the engine's work runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// A short name (`nccl:1/2@cuda:1`).
    pub fn name(&self) -> String {
        format!(
            "nccl:{}/{}@cuda:{}",
            self.cfg.rank, self.cfg.nranks, self.cfg.ordinal
        )
    }

    /// Waits for every request submitted so far; reports every failure not already seen.
    pub fn barrier(&self) -> Result<(), BarrierError> {
        self.inflight.barrier()
    }

    /// Aborts the communicator now (every rank's pending work with this rank fails or times
    /// out); later submits fail with [`NcclError::Aborted`].
    pub fn abort(&self) {
        self.comm.abort("aborted by the user");
    }
}

impl Drop for NcclEngine {
    fn drop(&mut self) {
        // Requests finish (or time out) before the communicator can go; they hold it too.
        let _ = self.inflight.barrier();
    }
}
