//! The NCCL engine: copies between device buffers of different ranks (processes or threads,
//! one GPU each, on one host or across hosts) with NCCL's send/receive, as ferry requests.
//!
//! - [`NcclEngine`]: owns one rank of a communicator, made from an [`NcclConfig`] (device,
//!   rank, number of ranks, the shared [`NcclId`], a timeout). Its requests are
//!   [`Request`]s like every engine's: one CUDA event each, waited, polled or awaited.
//! - Sends and receives: [`NcclScope::send`], [`NcclScope::recv`], and [`NcclScope::group`]
//!   for several at once (`ncclGroupStart`/`ncclGroupEnd`: all of them progress together, so
//!   an exchange in both directions cannot deadlock). Buffers are device memory of the
//!   engine's GPU, borrowed for the scope, which waits for every request before it returns
//!   (the safe API's scope machinery, as [`EngineExt::scope`](crate::EngineExt::scope)).
//! - Not an [`Engine`](crate::Engine): a send or a receive is one buffer and a peer rank, and
//!   it completes only when the peer posts its side, not a [`Job`](crate::Job) (a destination
//!   and a source of this process, with layouts) that one engine runs alone.
//! - Errors: a small enum, [`NcclError`] (also [`crate::Error::Nccl`]); bad input (a peer
//!   outside the communicator, a buffer shorter than the count, host memory) is refused
//!   before NCCL is called. Timeouts: the communicator is created non-blocking (unless
//!   [`NcclConfig::blocking`]) and every wait polls `ncclCommGetAsyncError`; when
//!   [`NcclConfig::timeout`] (or [`NcclConfig::init_timeout`] while joining) passes (a peer
//!   that never arrives, never posts the matching receive, or died) the communicator is
//!   aborted (`ncclCommAbort`, which stops its kernels) and the request fails with
//!   [`RequestError::Timeout`]; later submits fail with [`NcclError::Aborted`].
//! - Without the NCCL library (or without a CUDA driver) every constructor returns an error
//!   ([`NcclError::NoLibrary`], [`NcclError::Cuda`]); nothing panics. [`probe`](fn@probe) says what is
//!   there. The library is found as `$FERRY_NCCL_LIB`, `libnccl.so.2` or `libnccl.so`
//!   through the dynamic loader (`LD_LIBRARY_PATH`); for the `nvidia-nccl-cu13` Python wheel
//!   that is `$(python3 -c "import nvidia.nccl,os;print(os.path.dirname(nvidia.nccl.__file__))")/lib`.
//!   ferry sets `NCCL_NVLS_ENABLE=0` (no NVLink multicast) when it first creates a
//!   communicator, unless it is already set: ferry uses only point-to-point operations.
//!   Changing the environment while other threads read it is not thread-safe in C: set the
//!   variable before starting threads (the GPU bundle's `run.sh` does) to leave it untouched.
//!
//! # Setting up ranks
//!
//! Every rank needs the same [`NcclId`], made by rank 0. Two ways to hand it over:
//!
//! - **A file** every rank can read (`/tmp` on one host, a shared file system across hosts):
//!   [`NcclId::exchange_file`] (rank 0 writes it atomically, the others wait for it). Use a
//!   path that is new for each job.
//! - **An environment variable**: the launcher runs rank 0's `NcclId::new()` (or any program
//!   printing [`NcclId::to_hex`]) and passes the hex text to every rank; [`NcclId::from_env`].
//!
//! [`NcclConfig::from_env`] reads the whole set-up from the environment: `FERRY_NCCL_RANK`,
//! `FERRY_NCCL_NRANKS`, optionally `FERRY_NCCL_DEVICE` (default: the rank modulo the GPUs
//! of this host), `FERRY_NCCL_ID` (hex) or `FERRY_NCCL_ID_FILE` (a path, exchanged as above),
//! optionally `FERRY_NCCL_TIMEOUT_S` (default 120) and `FERRY_NCCL_INIT_TIMEOUT_S` (default:
//! the former).
//!
//! ```no_run
//! use ferry::engine::nccl::{NcclConfig, NcclEngine};
//! use ferry::cuda::DeviceBuffer;
//! // Two processes: FERRY_NCCL_RANK=0|1 FERRY_NCCL_NRANKS=2 FERRY_NCCL_ID_FILE=/tmp/job42.id
//! let engine = NcclEngine::new(NcclConfig::from_env()?)?;
//! let n = 64 << 20;
//! let peer = 1 - engine.rank();
//! let out = DeviceBuffer::from_host(engine.ordinal(), &vec![engine.rank() as u8; n])?;
//! let mut inbox = DeviceBuffer::new(engine.ordinal(), n)?;
//! engine.scope(|s| -> Result<(), Box<dyn std::error::Error>> {
//!     // Both directions at once, in one group.
//!     s.group(|g| {
//!         g.send(&out, n, peer);
//!         g.recv(&mut inbox, n, peer);
//!     })?
//!     .wait()?;
//!     Ok(())
//! })?;
//! assert!(inbox.to_vec()?.iter().all(|&b| b == peer as u8));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod comm;
mod config;
mod event;
pub mod id;
mod probe;
#[cfg(feature = "bench")]
pub(crate) mod raw;
mod scope;
mod sys;

pub use config::{NcclConfig, DEFAULT_TIMEOUT};
pub use event::NcclCompletion;
pub use id::NcclId;
pub use probe::{probe, NcclProbe};
pub use scope::{Group, NcclScope};

use crate::engine::cuda::sys::driver;
use crate::engine::cuda::{CudaCompletion, CudaError};
use crate::memory::{MemKind, RawBuf};
use crate::request::{BarrierError, InFlight, Request, RequestError};
use comm::Comm;
use cudarc::driver::{sys as cu, CudaStream};
use event::Event;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// Why an NCCL engine could not be made or a send/receive could not be submitted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum NcclError {
    /// The NCCL library is not there (or too old); the reason says what was tried.
    #[error("no NCCL library: {0}")]
    NoLibrary(String),
    /// The CUDA side failed (no driver, no such device, a stream or event).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The set-up is inconsistent (rank not below the number of ranks, a missing variable).
    #[error("invalid NCCL configuration: {0}")]
    InvalidConfig(String),
    /// A unique id could not be parsed.
    #[error("bad NCCL unique id: {0}")]
    BadId(String),
    /// Reading or writing the id file failed.
    #[error("{path}: {msg}")]
    Io {
        /// The file.
        path: String,
        /// The system's error.
        msg: String,
    },
    /// Something did not happen in time (a peer that never arrived); the communicator, if
    /// there was one, was aborted.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The limit.
        after: Duration,
    },
    /// An NCCL call failed; NCCL's own error string is kept.
    #[error("{call} failed: {msg}")]
    Nccl {
        /// The call.
        call: &'static str,
        /// NCCL's result code.
        code: i32,
        /// NCCL's error string (and its last error text, where it has one).
        msg: String,
    },
    /// The communicator was aborted after an earlier error or timeout; make a new engine.
    #[error("the NCCL communicator was aborted: {0}")]
    Aborted(String),
    /// A send or receive that cannot be right (peer outside the communicator, a buffer shorter
    /// than the count, memory that is not on this engine's GPU).
    #[error("{0}")]
    InvalidArgument(String),
}

impl NcclError {
    fn nccl(call: &'static str, code: i32, comm: Option<(&sys::Lib, sys::Comm)>) -> NcclError {
        let msg = match (comm, sys::lib()) {
            (Some((lib, c)), _) => lib.message(code, Some(c)),
            (None, Ok(lib)) => lib.message(code, None),
            (None, Err(_)) => format!("NCCL error {code}"),
        };
        NcclError::Nccl { call, code, msg }
    }
}

impl From<crate::engine::cuda::DriverError> for NcclError {
    fn from(e: crate::engine::cuda::DriverError) -> Self {
        NcclError::Cuda(e.into())
    }
}

/// Send or receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2pKind {
    /// `ncclSend`: the buffer is read.
    Send,
    /// `ncclRecv`: the buffer is written.
    Recv,
}

/// One send or receive of `bytes` bytes from the start of `buf`, to or from rank `peer`.
/// Plain descriptor for [`NcclEngine::submit_raw`].
#[derive(Debug, Clone, Copy)]
pub struct P2p {
    /// Send or receive.
    pub kind: P2pKind,
    /// The buffer (device memory of the engine's GPU).
    pub buf: RawBuf,
    /// Bytes to move (the peer's matching call must use the same count).
    pub bytes: usize,
    /// The other rank (may be this rank: a send to itself needs the matching receive in the
    /// same group).
    pub peer: u32,
}

/// One rank of an NCCL communicator. See the [module documentation](self).
pub struct NcclEngine {
    cfg: NcclConfig,
    comm: Arc<Comm>,
    stream: Arc<CudaStream>,
    inflight: InFlight,
    waker_tx: Sender<Arc<event::Inner>>,
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
fn no_multicast() {
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
        let waker_tx = event::spawn_waiter(format!("ferry-nccl{}-waiter", cfg.rank))
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

    fn check(&self, op: &P2p) -> Result<(), NcclError> {
        let bad = |m: String| Err(NcclError::InvalidArgument(m));
        if op.peer >= self.cfg.nranks {
            return bad(format!(
                "peer rank {} is outside the communicator (ranks 0..{})",
                op.peer, self.cfg.nranks
            ));
        }
        if op.bytes > op.buf.len {
            return bad(format!(
                "{:?} of {} bytes from a buffer of {} bytes",
                op.kind, op.bytes, op.buf.len
            ));
        }
        let here = MemKind::Device {
            ordinal: self.cfg.ordinal,
        };
        if op.bytes > 0 && op.buf.kind != here {
            return bad(format!(
                "NCCL buffers must be device memory of GPU {} (this rank's), not {} memory",
                self.cfg.ordinal, op.buf.kind
            ));
        }
        if op.bytes > 0 && op.buf.addr == 0 {
            return bad("null buffer address".into());
        }
        Ok(())
    }

    /// Submits sends and receives as one group (one request), to start after `after`: a CUDA
    /// engine's request becomes a `cuStreamWaitEvent` (no host round trip, e.g. a copy into
    /// the buffer that is then sent), any other request is waited here; a failed dependency
    /// fails this request without starting it. Checks every operation first; nothing is
    /// started when one is refused.
    ///
    /// Which calls block: this call waits (up to the timeout) until NCCL has enqueued the
    /// group; the first exchange with a peer also sets up the connection to it, which needs
    /// the peer to post its side.
    ///
    /// # Safety
    /// 1. Each buffer is valid for reads (`Send`) or writes (`Recv`) of `bytes` bytes, of the
    ///    kind it claims, until the returned request completes.
    /// 2. Nothing else writes a sent buffer, or reads or writes a received one, until then.
    pub unsafe fn submit_raw(&self, ops: &[P2p], after: &[&Request]) -> Result<Request, NcclError> {
        for op in ops {
            self.check(op)?;
        }
        let mut events = Vec::new();
        for dep in after {
            let c = dep.completion();
            let known = match c.as_any().downcast_ref::<CudaCompletion>() {
                // A lazy CUDA request records its event now (`cuda/completion/mark.rs`).
                Some(cc) => cc.event_to_wait().map(|e| events.extend(e)),
                None => c.wait(),
            };
            if let Err(e) = known {
                let req = Request::ready(Err(RequestError::Dependency(Box::new(e))));
                self.inflight.track(&req);
                return Ok(req);
            }
        }
        if ops.is_empty() {
            return Ok(Request::ready(Ok(())));
        }
        let lib = self.comm.lib;
        let mut st = self.comm.lock();
        if let Some(why) = &*st {
            return Err(NcclError::Aborted(why.clone()));
        }
        self.comm.bind()?;
        for e in events {
            // SAFETY: our live stream; a live event held by the dependency's request, which the
            // caller holds until this call returns (the wait is enqueued by then).
            driver::check("cuStreamWaitEvent", unsafe {
                cu::cuStreamWaitEvent(self.stream.cu_stream(), e, 0)
            })?;
        }
        let stream = self.stream.cu_stream() as *mut std::ffi::c_void;
        // SAFETY: no arguments; opens a group closed below on every path.
        let r = unsafe { (lib.group_start)() };
        if r != sys::SUCCESS {
            return Err(NcclError::nccl("ncclGroupStart", r, None));
        }
        let mut first_err = None;
        for op in ops {
            // SAFETY: the communicator is live (not aborted, lock held) and ours; the stream
            // belongs to its device; each buffer holds `bytes` bytes of this device's memory
            // (checked) and stays valid until the request completes (1, 2).
            let (call, r) = unsafe {
                match op.kind {
                    P2pKind::Send => (
                        "ncclSend",
                        (lib.send)(
                            op.buf.addr as *const _,
                            op.bytes,
                            sys::UINT8,
                            op.peer as i32,
                            self.comm.raw,
                            stream,
                        ),
                    ),
                    P2pKind::Recv => (
                        "ncclRecv",
                        (lib.recv)(
                            op.buf.addr as *mut _,
                            op.bytes,
                            sys::UINT8,
                            op.peer as i32,
                            self.comm.raw,
                            stream,
                        ),
                    ),
                }
            };
            if r != sys::SUCCESS && r != sys::IN_PROGRESS && first_err.is_none() {
                first_err = Some(NcclError::nccl(call, r, Some((lib, self.comm.raw))));
            }
        }
        // SAFETY: closes the group opened above.
        let r = unsafe { (lib.group_end)() };
        if let Some(e) = first_err {
            // The group may have enqueued nothing or part; make sure nothing runs on.
            self.comm.wait_ready_locked(
                &mut st,
                "ncclGroupEnd",
                "a failed group to settle",
                self.cfg.timeout,
            )?;
            // SAFETY: our live stream.
            let _ = unsafe { cu::cuStreamSynchronize(self.stream.cu_stream()) };
            return Err(e);
        }
        if r != sys::SUCCESS && r != sys::IN_PROGRESS {
            return Err(NcclError::nccl(
                "ncclGroupEnd",
                r,
                Some((lib, self.comm.raw)),
            ));
        }
        let what = describe(self.cfg.rank, ops);
        self.comm.wait_ready_locked(
            &mut st,
            "ncclGroupEnd",
            &format!("NCCL to enqueue {what}"),
            self.cfg.timeout,
        )?;
        let ev = Event::new()?;
        // SAFETY: a live event and stream of this context.
        if let Err(e) = driver::check("cuEventRecord", unsafe {
            cu::cuEventRecord(ev.raw(), self.stream.cu_stream())
        }) {
            // SAFETY: our live stream; the work must end before the buffers are handed back.
            let _ = unsafe { cu::cuStreamSynchronize(self.stream.cu_stream()) };
            return Err(e.into());
        }
        drop(st);
        let c = NcclCompletion::new(
            ev,
            Arc::clone(&self.comm),
            what,
            self.cfg.timeout,
            self.waker_tx.clone(),
        );
        let req = Request::new(c);
        self.inflight.track(&req);
        Ok(req)
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

fn describe(rank: u32, ops: &[P2p]) -> String {
    let parts: Vec<String> = ops
        .iter()
        .map(|o| match o.kind {
            P2pKind::Send => format!("send {} B {rank}->{}", o.bytes, o.peer),
            P2pKind::Recv => format!("recv {} B {}->{rank}", o.bytes, o.peer),
        })
        .collect();
    parts.join(", ")
}

impl Drop for NcclEngine {
    fn drop(&mut self) {
        // Requests finish (or time out) before the communicator can go; they hold it too.
        let _ = self.inflight.barrier();
    }
}

#[cfg(test)]
mod tests;
