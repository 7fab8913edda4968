//! The CUDA engine: copies on the GPU's copy engines through the driver API (cudarc, loaded at
//! run time, so ferry builds and runs without CUDA installed).
//!
//! - [`probe`]: the driver, the devices and the links between them; never panics. Without a
//!   driver every constructor here returns [`CudaError::NoDriver`], and nothing else of the
//!   driver is called.
//! - Buffers ([`DeviceBuffer`], [`PinnedBuffer`], [`Registered`], [`MappedBuffer`],
//!   [`ManagedBuffer`]) implement [`Memory`](crate::Memory)/[`MemoryMut`](crate::MemoryMut), so
//!   every engine's safe API takes them.
//! - [`CudaEngine`]: one per device. Separate non-blocking streams per direction (host to
//!   device, device to host, device to device), so that the directions run on different copy
//!   engines at once. One event per request: waiting on one request never waits for the rest of
//!   its stream. Strided layouts become `cuMemcpy2DAsync`/`cuMemcpy3DAsync`; fills become
//!   `cuMemsetD8/16/32Async` where the pattern allows. A dependency on another CUDA request is a
//!   `cuStreamWaitEvent` (no host round trip); other dependencies are waited on the submitting
//!   thread.
//!
//! - Pageable host memory: copies between pageable memory and this device of at least 2 MiB
//!   (host to device) or 1 MiB (device to host) go through a ring of pinned staging buffers
//!   ([`staged`]), filled and drained by several CPU threads while the copy engine moves the
//!   previous chunk, on one background thread per direction; smaller ones take the driver's own
//!   pageable path. [`CudaConfig::staging`] tunes or disables it.
//! - Segment lists: a program that would take many driver calls (a custom operator's list of
//!   small copies, an N-D plan of many planes) goes through [`gather`]: an SM gather kernel
//!   compiled with NVRTC, the driver's batched copy, or one call per segment, whichever was
//!   measured faster for the segment sizes.
//! - SM copies: strided plans with short runs (a transpose of small elements) between
//!   device-accessible buffers run as one kernel ([`strided`]) instead of many 2-D/3-D rows of a
//!   few bytes on the copy engines; [`CudaConfig::kernel_copies`] chooses where the SMs are used
//!   ([`KernelCopies::Always`]: every such copy, e.g. zero-copy reads and writes of mapped host
//!   memory, as nvbandwidth's SM copies).
//!
//! Which calls block: `submit_raw` enqueues and returns, except that it waits for non-CUDA
//! dependencies and that copies from or to pageable host memory below the staging sizes return
//! once the driver has consumed the host side. A staged request's dependents wait for it on the
//! host. `Request::wait` sleeps ([`WaitMode::Blocking`], default) or spins ([`WaitMode::Spin`]).
//! `barrier` waits for everything.
//!
//! ```no_run
//! use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
//! use ferry::EngineExt;
//! let engine = CudaEngine::new(0)?;
//! let mut host = PinnedBuffer::new(1 << 20)?;
//! host.fill(7);
//! let mut dev = DeviceBuffer::new(0, 1 << 20)?;
//! engine.scope(|s| s.memcpy(&mut dev, &host)?.wait().map_err(ferry::Error::from))??;
//! assert!(dev.to_vec()?.iter().all(|&b| b == 7));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub(crate) mod driver;
pub(crate) mod event;
pub(crate) mod exec;
pub mod gather;
mod memory;
pub mod multi;
mod paths;
mod probe;
mod program;
pub mod split;
pub mod staged;
pub mod strided;

pub use event::CudaCompletion;
pub use memory::{DeviceBuffer, Location, ManagedBuffer, MappedBuffer, PinnedBuffer, Registered};
pub use probe::{probe, CudaProbe, DeviceInfo};
pub use program::KernelError;
pub use strided::KernelCopies;

use super::{Engine, Job, SubmitError};
use crate::memory::MemKind;
use crate::request::{BarrierError, InFlight, Request, RequestError};
use cudarc::driver::{sys, CudaContext, CudaStream};
use driver::{check, DrvErr};
use exec::End;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};
use thiserror::Error;

/// Why a CUDA engine or buffer could not be created.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No usable CUDA driver on this machine (the reason says which part is missing).
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// No device with this ordinal.
    #[error("no CUDA device {ordinal} (this machine has {count})")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// Devices present.
        count: u32,
    },
    /// An allocation or registration failed (out of memory included).
    #[error("cannot allocate {bytes} bytes of {what}: {msg}")]
    Alloc {
        /// What was being allocated.
        what: &'static str,
        /// Bytes asked for.
        bytes: usize,
        /// The driver's error string.
        msg: String,
    },
    /// A driver call failed.
    #[error("{call} failed: {msg}")]
    Driver {
        /// The driver call.
        call: &'static str,
        /// The driver's error string.
        msg: String,
    },
    /// A bad argument (e.g. data larger than its buffer).
    #[error("{0}")]
    InvalidArgument(String),
    /// A thread could not be started.
    #[error("cannot start thread: {0}")]
    Thread(String),
}

impl From<CudaError> for crate::Error {
    fn from(e: CudaError) -> Self {
        crate::Error::Setup(e.to_string())
    }
}

/// How a thread waits for a request.
///
/// Measured on an H200 host (4 KiB pinned host-to-device copy, submitted and waited, median of
/// 2000, `bench/results/h200/run17/cuda_rates.txt`): `Blocking` 23.5 us, `Spin` 7.8 us,
/// `SpinThenBlock(50 us)` 8.4 us (a raw `cuMemcpyAsync` + `cuStreamSynchronize`: about 7.3 us);
/// the sleep and wake-up of a blocking wait cost about 15 us. `SpinThenBlock` gets the spin
/// latency for short copies and sleeps on long ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// Sleep until the copy is done (events made with `CU_EVENT_BLOCKING_SYNC`): no CPU used.
    #[default]
    Blocking,
    /// Let the driver spin on the request's event (an event without `BLOCKING_SYNC`, waited
    /// with `cuEventSynchronize`, as `cuStreamSynchronize` waits by default): the lowest
    /// latency, one core busy while waiting.
    Spin,
    /// Poll for up to this long, then sleep as `Blocking` does.
    SpinThenBlock(std::time::Duration),
}

/// Which of the engine's streams (and so which copy engine) a copy runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Host memory to device memory.
    HostToDevice,
    /// Device memory to host memory.
    DeviceToHost,
    /// Device to device (also peer copies and fills of device memory).
    DeviceToDevice,
}

/// Settings of a [`CudaEngine`]. Plain struct: `CudaConfig::new(ordinal)` then chained setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaConfig {
    /// The device the engine's streams belong to.
    pub ordinal: u32,
    /// How `wait` waits.
    pub wait: WaitMode,
    /// Put every copy on this direction's stream instead of inferring it from the buffers'
    /// kinds (as AML's `aml_dma_cuda_create(kind)`).
    pub direction: Option<Direction>,
    /// How copies between pageable host memory and the device are staged through pinned
    /// buffers; `None` hands them to the driver's own pageable path.
    pub staging: Option<staged::StagingConfig>,
    /// Which copies between device-accessible buffers run on the SMs (a kernel) instead of the
    /// copy engines.
    pub kernel_copies: KernelCopies,
    /// Percent of a contiguous device-to-device copy on this GPU (of at least
    /// [`split::SPLIT_MIN_BYTES`]) done by an SM copy kernel while a copy engine does the rest
    /// ([`split`]); `None` (default): copy engine only.
    pub d2d_sm_share: Option<u8>,
}

impl CudaConfig {
    /// Device `ordinal`, blocking waits, directions inferred.
    pub fn new(ordinal: u32) -> CudaConfig {
        CudaConfig {
            ordinal,
            wait: WaitMode::Blocking,
            direction: None,
            staging: Some(staged::StagingConfig::new()),
            kernel_copies: KernelCopies::Auto,
            d2d_sm_share: None,
        }
    }
    /// Sets which copies run on the SMs ([`KernelCopies`]; default [`KernelCopies::Auto`]).
    pub fn kernel_copies(mut self, k: KernelCopies) -> CudaConfig {
        self.kernel_copies = k;
        self
    }
    /// Splits large device-to-device copies on this GPU: `percent` (1..=100) of the bytes by
    /// an SM copy kernel, the rest by a copy engine, at once. 0 turns it off.
    pub fn d2d_sm_share(mut self, percent: u8) -> CudaConfig {
        self.d2d_sm_share = (percent > 0).then_some(percent.min(100));
        self
    }
    /// Sets the staging of pageable copies (`None`: the driver's own pageable path).
    pub fn staging(mut self, staging: Option<staged::StagingConfig>) -> CudaConfig {
        self.staging = staging;
        self
    }
    /// Sets how `wait` waits.
    pub fn wait_mode(mut self, wait: WaitMode) -> CudaConfig {
        self.wait = wait;
        self
    }
    /// Forces every copy onto one direction's stream.
    pub fn direction(mut self, d: Direction) -> CudaConfig {
        self.direction = Some(d);
        self
    }
}

struct Peer {
    ctx: Arc<CudaContext>,
    enabled: bool,
}

/// The CUDA engine of one device. See the [module documentation](self).
pub struct CudaEngine {
    cfg: CudaConfig,
    ctx: Arc<CudaContext>,
    /// Streams by direction: H2D, D2H, D2D.
    streams: [Arc<CudaStream>; 3],
    /// `can_access[j]`: this device can access device `j` directly.
    can_access: Vec<bool>,
    peers: Mutex<Vec<Option<Peer>>>,
    inflight: InFlight,
    waker_tx: Sender<Arc<event::Inner>>,
    events: Arc<event::EventPool>,
    paths: paths::Paths,
    split: std::sync::OnceLock<Result<split::Splitter, String>>,
}

impl std::fmt::Debug for CudaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEngine")
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl CudaEngine {
    /// An engine on device `ordinal` with default settings.
    pub fn new(ordinal: u32) -> Result<CudaEngine, CudaError> {
        CudaEngine::with_config(CudaConfig::new(ordinal))
    }

    /// An engine with the given settings. Errors: [`CudaError::NoDriver`],
    /// [`CudaError::NoDevice`], a failed stream creation.
    pub fn with_config(cfg: CudaConfig) -> Result<CudaEngine, CudaError> {
        let ctx = driver::context(cfg.ordinal)?;
        let stream = || {
            ctx.new_stream()
                .map_err(|e| DrvErr::new("cuStreamCreate", e.0))
        };
        let streams = [stream()?, stream()?, stream()?];
        let count = driver::device_count()?;
        let me = ctx.cu_device();
        let can_access = (0..count)
            .map(|j| {
                let Ok(dj) = cudarc::driver::result::device::get(j as i32) else {
                    return false;
                };
                let mut can = 0;
                // SAFETY: valid out-pointer and device handles.
                let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, me, dj) };
                j != cfg.ordinal && r == sys::CUresult::CUDA_SUCCESS && can != 0
            })
            .collect();
        let waker_tx = event::spawn_waiter(format!("ferry-cuda{}-waiter", cfg.ordinal))
            .map_err(|e| CudaError::Thread(e.to_string()))?;
        Ok(CudaEngine {
            cfg,
            streams,
            can_access,
            peers: Mutex::new((0..count).map(|_| None).collect()),
            inflight: InFlight::new(),
            waker_tx,
            events: Arc::default(),
            paths: paths::Paths::new(Arc::clone(&ctx), cfg.staging.unwrap_or_default()),
            split: std::sync::OnceLock::new(),
            ctx,
        })
    }

    /// The engine's settings.
    pub fn config(&self) -> CudaConfig {
        self.cfg
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.cfg.ordinal
    }

    /// The stream used for a direction (for interop, e.g. launching kernels ordered with
    /// ferry's copies).
    pub fn stream(&self, d: Direction) -> &Arc<CudaStream> {
        &self.streams[d as usize]
    }

    /// Compiles (NVRTC) and loads this engine's kernels now: the SM copy kernels of
    /// [`KernelCopies`] and the segment-list gather kernel. Otherwise the first copy that needs
    /// one pays for it (about a second on the H200 host, run 20), which a latency-bound or
    /// timed first copy should not. Errors: no NVRTC library, a compile or module-load failure
    /// (the copies then keep to the copy engines and the driver's calls, as without this call).
    ///
    /// ```no_run
    /// let engine = ferry::cuda::CudaEngine::new(0)?;
    /// engine.compile_kernels()?;
    /// # Ok::<(), ferry::cuda::CudaError>(())
    /// ```
    pub fn compile_kernels(&self) -> Result<(), CudaError> {
        let failed = |what: &'static str| move |msg: String| CudaError::Driver { call: what, msg };
        self.paths.sm_copier().map_err(failed("SM copy kernels"))?;
        let g = self
            .paths
            .gatherer_or_why()
            .map_err(failed("gather kernel"))?;
        g.kernel()
            .map(drop)
            .map_err(|e| failed("gather kernel")(e.to_string()))
    }

    /// True if this engine can copy to or from device `ordinal`'s memory.
    fn reaches(&self, ordinal: u32) -> bool {
        ordinal == self.cfg.ordinal
            || self
                .can_access
                .get(ordinal as usize)
                .copied()
                .unwrap_or(false)
    }

    fn direction(&self, dst: MemKind, src: Option<MemKind>) -> Direction {
        if let Some(d) = self.cfg.direction {
            return d;
        }
        let on_dev = |k: MemKind| matches!(k, MemKind::Device { .. } | MemKind::Managed);
        match (on_dev(dst), src.map(on_dev)) {
            (true, None | Some(true)) => Direction::DeviceToDevice,
            (true, Some(false)) => Direction::HostToDevice,
            (false, Some(true)) => Direction::DeviceToHost,
            (false, None) => Direction::DeviceToHost,
            (false, Some(false)) => Direction::HostToDevice,
        }
    }

    /// The end of a copy for a buffer, enabling peer access on first use of another device.
    fn end(&self, addr: u64, kind: MemKind) -> Result<End, SubmitError> {
        let MemKind::Device { ordinal } = kind else {
            return Ok(End {
                addr,
                kind,
                ctx: std::ptr::null_mut(),
            });
        };
        if ordinal == self.cfg.ordinal {
            return Ok(End {
                addr,
                kind,
                ctx: self.ctx.cu_ctx(),
            });
        }
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = peers
            .get_mut(ordinal as usize)
            .ok_or_else(|| self.unsupported(kind, None))?;
        if slot.is_none() {
            let ctx = driver::context(ordinal).map_err(|e| SubmitError::Driver {
                call: "cuDevicePrimaryCtxRetain",
                msg: e.to_string(),
            })?;
            *slot = Some(Peer {
                ctx,
                enabled: false,
            });
        }
        let peer = slot.as_mut().ok_or_else(|| self.unsupported(kind, None))?;
        // Without direct access (no P2P between the two), `cuMemcpyPeerAsync` still copies,
        // staged by the driver; only enable access where the devices allow it.
        if !peer.enabled && self.reaches(ordinal) {
            // SAFETY: this engine's context is current (bound in submit); the peer context is
            // a live primary context. Already-enabled access is not an error.
            let r = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0) };
            if r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                check("cuCtxEnablePeerAccess", r)?;
            }
            peer.enabled = true;
        }
        Ok(End {
            addr,
            kind,
            ctx: peer.ctx.cu_ctx(),
        })
    }

    fn unsupported(&self, dst: MemKind, src: Option<MemKind>) -> SubmitError {
        SubmitError::Unsupported {
            engine: self.name(),
            dst,
            src,
        }
    }

    /// Pageable host memory <-> this device, large enough: the staged ring, on the direction's
    /// staging thread. `Ok(None)`: not for staging.
    fn try_stage(
        &self,
        job: &Job,
        steps: &[crate::op::Step],
    ) -> Result<Option<Request>, SubmitError> {
        let own = |k: MemKind| {
            k == MemKind::Device {
                ordinal: self.cfg.ordinal,
            }
        };
        let (Some(_), Some(src)) = (self.cfg.staging, job.src) else {
            return Ok(None);
        };
        let dir = match (job.dst.kind, src.kind) {
            (d, MemKind::Pageable) if own(d) => staged::Direction::HostToDevice,
            (MemKind::Pageable, s) if own(s) => staged::Direction::DeviceToHost,
            _ => return Ok(None),
        };
        let plans: Option<Vec<crate::plan::Plan>> = steps
            .iter()
            .map(|s| match s {
                crate::op::Step::Copy(p) => Some(*p),
                crate::op::Step::Fill { .. } | crate::op::Step::Segments { .. } => None,
            })
            .collect();
        let Some(plans) = plans else { return Ok(None) };
        if plans.iter().map(|p| p.total_bytes()).sum::<usize>() < paths::stage_min_bytes(dir) {
            return Ok(None);
        }
        let stream = match dir {
            staged::Direction::HostToDevice => Direction::HostToDevice,
            staged::Direction::DeviceToHost => Direction::DeviceToHost,
        };
        let signal = Arc::new(crate::request::Signal::new());
        self.paths
            .stage(paths::StagedTask {
                dir,
                stream: Arc::clone(&self.streams[stream as usize]),
                dst: job.dst.addr,
                src: src.addr,
                plans,
                after: job.after.iter().map(Request::share).collect(),
                signal: Arc::clone(&signal),
            })
            .map_err(|msg| SubmitError::Driver {
                call: "staged copy",
                msg,
            })?;
        Ok(Some(Request::new(signal)))
    }

    /// Long segment lists (many small copies) through the gatherer, on `stream`'s direction.
    /// Returns false (nothing enqueued) where the program is not one, or the gatherer cannot
    /// take it; the caller then runs the steps one by one.
    ///
    /// # Safety
    /// As [`exec::run_step`] for every step.
    unsafe fn try_gather(
        &self,
        steps: &[crate::op::Step],
        dst: End,
        src: Option<End>,
        job: &Job,
        dk: MemKind,
        sk: Option<MemKind>,
    ) -> bool {
        let (Some(src), Some(src_buf)) = (src, job.src) else {
            return false;
        };
        let reachable = |k: MemKind| match k {
            MemKind::Pageable => false,
            MemKind::Device { ordinal } => ordinal == self.cfg.ordinal,
            _ => true,
        };
        if !reachable(dst.kind) || !reachable(src.kind) {
            return false;
        }
        let owned;
        let segs: &[crate::op::Segment] = match steps {
            // A segment list as given: no copy of the list.
            [crate::op::Step::Segments { segs, range, .. }] => &segs[range.clone()],
            _ => match paths::segment_list(steps) {
                Some(s) => {
                    owned = s;
                    &owned
                }
                None => return false,
            },
        };
        let Some(g) = self.paths.gatherer() else {
            return false;
        };
        let stream = &self.streams[self.direction(dk, sk) as usize];
        // SAFETY: the segments are the program's runs, inside both buffers (3); the buffers
        // are valid until the request completes (2); this engine's context and stream (1).
        let r = unsafe {
            g.copy(
                stream,
                dst.addr,
                job.dst.len,
                src.addr,
                src_buf.len,
                segs,
                paths::GATHER_STRATEGY,
            )
        };
        // A failed gather may have enqueued part of the copy; the per-step path then writes
        // the same bytes again, in stream order.
        r.is_ok()
    }

    /// Copies that [`CudaConfig::kernel_copies`] sends to the SMs: every step a copy plan it
    /// takes, both buffers device-accessible. Returns false where not, or where the kernels
    /// cannot be made (nothing enqueued then, or, after a failed launch, the per-step path
    /// writes the same bytes again in stream order).
    ///
    /// # Safety
    /// As [`exec::run_step`] for every step.
    unsafe fn try_sm(
        &self,
        steps: &[crate::op::Step],
        dst: End,
        src: Option<End>,
        dk: MemKind,
        sk: Option<MemKind>,
    ) -> bool {
        let mode = self.cfg.kernel_copies;
        let Some(src) = src.filter(|_| mode != KernelCopies::Never && !steps.is_empty()) else {
            return false;
        };
        let reachable = |k: MemKind| match k {
            MemKind::Pageable => false,
            MemKind::Device { ordinal } => ordinal == self.cfg.ordinal,
            _ => true,
        };
        let takes = |s: &crate::op::Step| match s {
            crate::op::Step::Copy(p) => mode.takes(p),
            _ => false,
        };
        if !reachable(dst.kind) || !reachable(src.kind) || !steps.iter().all(takes) {
            return false;
        }
        let Some(sm) = self.paths.sm() else {
            return false;
        };
        let stream = &self.streams[self.direction(dk, sk) as usize];
        steps.iter().all(|s| match s {
            // SAFETY: the plan is the program's, checked inside both buffers (1); buffers valid
            // until the request completes (caller); this engine's context and stream (2).
            crate::op::Step::Copy(p) => unsafe { sm.copy(stream, dst.addr, src.addr, p) }.is_ok(),
            _ => false,
        })
    }

    /// A large contiguous copy within this GPU's memory, split between a copy engine and the
    /// SM copy kernel when [`CudaConfig::d2d_sm_share`] asks for it. `Ok(false)`: not split
    /// (nothing enqueued).
    ///
    /// # Safety
    /// As [`exec::run_step`] for every step; `stream` is this engine's and its context current.
    unsafe fn try_split(
        &self,
        steps: &[crate::op::Step],
        dst: End,
        src: Option<End>,
        stream: sys::CUstream,
    ) -> Result<bool, SubmitError> {
        let (Some(pct), Some(src)) = (self.cfg.d2d_sm_share, src) else {
            return Ok(false);
        };
        let own = MemKind::Device {
            ordinal: self.cfg.ordinal,
        };
        let [crate::op::Step::Copy(plan)] = steps else {
            return Ok(false);
        };
        let n = plan.total_bytes();
        if dst.kind != own
            || src.kind != own
            || plan.kind() != crate::plan::PlanKind::Contiguous
            || n < split::SPLIT_MIN_BYTES
        {
            return Ok(false);
        }
        let splitter = self.split.get_or_init(|| {
            split::Splitter::new(Arc::clone(&self.ctx))
                .and_then(|s| s.ready().map(|()| s))
                .map_err(|e| e.to_string())
        });
        let Ok(splitter) = splitter else {
            return Ok(false); // no NVRTC or no kernel: the copy engine does it all
        };
        // The copy engine's part ends on a 4 KiB boundary, so that the kernel's part starts
        // as aligned as the buffers (16-byte loads).
        let sm_target = (n as u128 * pct as u128 / 100) as usize;
        let ce = (n - sm_target).next_multiple_of(4096).min(n);
        let sm_bytes = n - ce;
        let (d, s) = (
            dst.addr + plan.dst_offset() as u64,
            src.addr + plan.src_offset() as u64,
        );
        // SAFETY: the plan's contiguous run lies inside both buffers of this device (3, 2);
        // our stream and current context (1).
        unsafe { splitter.copy(stream, d, s, n, sm_bytes) }.map_err(|e| {
            // SAFETY: our live stream: what was enqueued finishes before the error is seen.
            let _ = unsafe { sys::cuStreamSynchronize(stream) };
            SubmitError::Driver {
                call: "split device copy",
                msg: e.to_string(),
            }
        })?;
        Ok(true)
    }

    /// Host memory passed as plain (pageable) memory that is in fact page-locked (a
    /// `PinnedBuffer` or `Registered` seen through a slice, memory registered elsewhere) is
    /// recognised through unified addressing and copied as pinned memory: no staging needed.
    ///
    /// Asked (a driver query per buffer) only where the answer changes the path: staging, the
    /// gather and SM paths, copies between two host buffers. A small contiguous copy takes the
    /// same driver call either way (the driver itself copies page-locked memory without
    /// staging) and skips the query: about a microsecond, 10% of a 256 KiB pageable copy on the
    /// H200 host (run 25).
    fn refine_kinds(&self, mut job: Job, steps: &[crate::op::Step]) -> Job {
        let small_contiguous = match (steps, job.src) {
            ([crate::op::Step::Copy(p)], Some(src)) => {
                p.kind() == crate::plan::PlanKind::Contiguous
                    && p.total_bytes()
                        < paths::stage_min_bytes(staged::Direction::HostToDevice)
                            .min(paths::stage_min_bytes(staged::Direction::DeviceToHost))
                    && job.dst.kind.host_accessible() != src.kind.host_accessible()
            }
            _ => false,
        };
        if small_contiguous {
            return job;
        }
        let pinned = |addr: u64| -> bool {
            driver::bind(&self.ctx).is_ok()
                && driver::memory_type(addr) == Some(sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32)
        };
        // Both ends of the range: a registration covers whole pages of one range.
        let whole = |b: &crate::memory::RawBuf| {
            b.kind == MemKind::Pageable
                && b.len > 0
                && pinned(b.addr)
                && pinned(b.addr + b.len as u64 - 1)
        };
        if whole(&job.dst) {
            job.dst.kind = MemKind::Pinned;
        }
        if let Some(src) = job.src.as_mut() {
            if whole(src) {
                src.kind = MemKind::Pinned;
            }
        }
        job
    }

    fn track(&self, req: Request) -> Request {
        self.inflight.track(&req);
        req
    }
}

impl Engine for CudaEngine {
    fn name(&self) -> String {
        format!("cuda:{}", self.cfg.ordinal)
    }

    /// Every pair that involves memory a GPU can address: device memory of this GPU or of a
    /// peer it can access, pinned, mapped, managed, and pageable host memory on one side of a
    /// copy; copies between device memory of any two GPUs of the machine (`cuMemcpyPeerAsync`,
    /// which the driver stages where the two have no direct access). Not: pageable to
    /// pageable, fills of pageable memory (the CPU engine does those), fills of a GPU this one
    /// cannot access.
    fn supports(&self, dst: MemKind, src: Option<MemKind>) -> bool {
        let count = self.can_access.len() as u32;
        let dev_ok = |k: MemKind| match k {
            MemKind::Device { ordinal } => self.reaches(ordinal),
            _ => true,
        };
        let peer_copy = matches!(
            (dst, src),
            (MemKind::Device { ordinal: a }, Some(MemKind::Device { ordinal: b }))
                if a < count && b < count && (a == self.cfg.ordinal || b == self.cfg.ordinal)
        );
        if !peer_copy && (!dev_ok(dst) || !src.is_none_or(dev_ok)) {
            return false;
        }
        match src {
            None => dst != MemKind::Pageable,
            Some(s) => !(dst == MemKind::Pageable && s == MemKind::Pageable),
        }
    }

    unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
        job.check()?;
        // Prepare: build and check the program (custom operators fail only their request).
        let steps = if job.op.is_builtin() {
            job.op
                .lower(job.dst.len, job.src.map(|s| s.len))?
                .into_steps()
        } else {
            match job.op.lower_catching(job.dst.len, job.src.map(|s| s.len)) {
                Ok(p) => p.into_steps(),
                Err(e) => return Ok(self.track(Request::ready(Err(e)))),
            }
        };
        let job = self.refine_kinds(job, &steps);
        let (dk, sk) = (job.dst.kind, job.src.map(|s| s.kind));
        if !self.supports(dk, sk) {
            return Err(self.unsupported(dk, sk));
        }
        if let Some(req) = self.try_stage(&job, &steps)? {
            return Ok(self.track(req));
        }
        // Dependencies: CUDA requests become stream waits; others are waited here.
        let mut events = Vec::new();
        for dep in &job.after {
            if let Some(c) = dep.completion().as_any().downcast_ref::<CudaCompletion>() {
                match c.known() {
                    Some(Err(e)) => {
                        return Ok(
                            self.track(Request::ready(Err(RequestError::Dependency(Box::new(e)))))
                        )
                    }
                    Some(Ok(())) => {}
                    None => events.push(c.event()),
                }
            } else if let Err(e) = dep.completion().wait() {
                return Ok(self.track(Request::ready(Err(RequestError::Dependency(Box::new(e))))));
            }
        }
        driver::bind(&self.ctx)?;
        let dst = self.end(job.dst.addr, dk)?;
        let src = match job.src {
            Some(s) => Some(self.end(s.addr, s.kind)?),
            None => None,
        };
        let ev = self.events.take(self.cfg.wait)?;
        let stream = self.streams[self.direction(dk, sk) as usize].cu_stream();
        for e in events {
            // SAFETY: live stream of this context and a live event (held by the dependency's
            // request, which the job holds).
            check("cuStreamWaitEvent", unsafe {
                sys::cuStreamWaitEvent(stream, e, 0)
            })?;
        }
        let mut keep = Vec::new();
        // SAFETY: as for the steps below; the SM copier and the gatherer take the same buffers
        // and stream.
        let gathered = unsafe { self.try_sm(&steps, dst, src, dk, sk) }
            || unsafe { self.try_gather(&steps, dst, src, &job, dk, sk) };
        // SAFETY: as for the steps below.
        let gathered = gathered || unsafe { self.try_split(&steps, dst, src, stream)? };
        for step in steps.iter().filter(|_| !gathered) {
            // SAFETY: context current, stream ours (1); buffers valid until the request
            // completes, by this function's contract (2); steps checked by the program (3).
            if let Err(e) =
                unsafe { exec::run_step(stream, dst, src, step, self.cfg.ordinal, &mut keep) }
            {
                // Work enqueued before the failure still uses the buffers: finish it before
                // handing the error (and, in the safe API, the buffers) back.
                // SAFETY: our live stream.
                let _ = unsafe { sys::cuStreamSynchronize(stream) };
                return Err(e.into());
            }
        }
        // SAFETY: live event and stream of this context.
        if let Err(e) = check("cuEventRecord", unsafe {
            sys::cuEventRecord(ev.raw(), stream)
        }) {
            // SAFETY: our live stream.
            let _ = unsafe { sys::cuStreamSynchronize(stream) };
            return Err(e.into());
        }
        let c = CudaCompletion::new(
            ev,
            Arc::clone(&self.events),
            Arc::clone(&self.ctx),
            self.cfg.wait,
            keep,
            self.waker_tx.clone(),
        );
        Ok(self.track(Request::new(c)))
    }

    fn barrier(&self) -> Result<(), BarrierError> {
        self.inflight.barrier()
    }

    /// This GPU's device memory.
    fn home(&self) -> Option<MemKind> {
        Some(MemKind::Device {
            ordinal: self.cfg.ordinal,
        })
    }
}

impl Drop for CudaEngine {
    fn drop(&mut self) {
        // Staged copies finish on their threads first.
        self.paths.shutdown();
        // Work in flight finishes before the streams go; requests keep their own events.
        if driver::bind(&self.ctx).is_ok() {
            for s in &self.streams {
                let _ = s.synchronize();
            }
        }
    }
}
