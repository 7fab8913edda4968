//! The CUDA engine: copies on the GPU's copy engines through the driver API (cudarc, loaded at
//! run time, so ferry builds and runs without CUDA installed).
//!
//! - [`probe`](fn@probe): the driver, the devices and the links between them; never panics. Without a
//!   driver every constructor here returns [`CudaError::NoDriver`], and nothing else of the
//!   driver is called.
//! - Buffers ([`DeviceBuffer`], [`PinnedBuffer`], [`Registered`], [`MappedBuffer`],
//!   [`ManagedBuffer`]) implement [`Memory`](crate::Memory)/[`MemoryMut`](crate::MemoryMut), so
//!   every engine's safe API takes them.
//! - [`CudaEngine`]: one per device. Separate non-blocking streams per direction (host to
//!   device, device to host, device to device), so that the directions run on different copy
//!   engines at once, and a small pool of them per direction ([`CudaConfig::streams`]), so
//!   that threads submitting through one engine do not queue behind each other (see
//!   [Ordering](#ordering)). Waiting on one request never waits for the rest of its stream:
//!   a request records a completion event when something needs it (a later request on its
//!   stream, a dependent elsewhere, a future; at submit for the blocking waits, a caller's
//!   stream, a stream handed out); while it is its stream's last work its wait waits on the
//!   stream, as a raw `cuStreamSynchronize` (`mark.rs` decides). Strided layouts become
//!   `cuMemcpy2DAsync`/`cuMemcpy3DAsync`; fills become `cuMemsetD8/16/32Async` where the
//!   pattern allows. A dependency on another CUDA request is a `cuStreamWaitEvent` (no host
//!   round trip; a request without an event records it then); other dependencies are waited on
//!   the submitting thread.
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
//! Which path a copy takes (staged, SM kernel, gather, split, driver calls, and on which
//! stream) is decided once per request by one pure function (`route.rs`, with the measured
//! thresholds and their CPU tests); `submit_raw` then only runs the chosen route (`paths.rs`
//! for the staged and kernel paths, `exec.rs` for driver calls). One contiguous copy (nearly
//! every request) is checked, routed (`route::one_run`) and submitted without building its
//! program, and through `Engine::submit_copy` (the safe API's copies) without building its job:
//! the host work between one small copy's end and the next copy's start is what a caller
//! waits for. Settings are in
//! [`CudaConfig`], set-up errors in [`CudaError`].
//!
//! Which calls block: `submit_raw` enqueues and returns, except that it waits for non-CUDA
//! dependencies and that copies from or to pageable host memory below the staging sizes return
//! once the driver has consumed the host side. A staged request's dependents wait for it on the
//! host. `Request::wait` sleeps until shortly before the request's expected end and then polls
//! ([`WaitMode::Auto`], default; a request submitted on an idle stream by a thread submitting
//! alone, other than an upload under 1 KiB, is waited by reading a word its stream writes after
//! it, `stamp.rs` and `mark.rs`), sleeps in the driver ([`WaitMode::Blocking`]) or spins
//! ([`WaitMode::Spin`]).
//! `barrier` waits for everything.
//!
//! # Ordering
//!
//! - Independent requests (no `after` between them) may run concurrently and complete in any
//!   order, also requests of one thread in different directions.
//! - One thread's requests in one direction run in the order it submitted them: each thread
//!   keeps one stream of the pool per direction for its life (threads are spread over the
//!   pool's [`CudaConfig::streams`] streams in the order they first submit). Staged requests
//!   (pageable memory from the staging sizes up) run on the staging thread and are ordered
//!   only by dependencies.
//! - Dependencies always hold: a request submitted with `after(r)` starts after `r` completed,
//!   whichever thread submitted `r` and whichever stream it ran on (a CUDA request becomes a
//!   `cuStreamWaitEvent` on the dependent's stream, no host wait).
//! - [`CudaEngine::stream`] is the calling thread's stream for a direction: work the thread
//!   enqueues there is ordered with its copies in that direction.
//! - `barrier` waits for the requests of every thread.
//!
//! ```no_run
//! use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
//! use ferry::EngineExt;
//! let engine = CudaEngine::new(0)?;
//! let mut host = PinnedBuffer::new(1 << 20)?;
//! host.fill(7);
//! let mut dev = DeviceBuffer::new(0, 1 << 20)?;
//! engine.scope(|s| -> ferry::Result<()> { Ok(s.memcpy(&mut dev, &host)?.wait()?) })?;
//! assert!(dev.to_vec()?.iter().all(|&b| b == 7));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod config;
pub(crate) mod driver;
mod error;
pub(crate) mod event;
pub(crate) mod exec;
pub mod gather;
mod interop;
mod lanes;
mod mark;
mod memory;
pub mod multi;
mod paths;
mod probe;
mod program;
mod route;
pub mod split;
pub mod staged;
mod stamp;
pub mod strided;
mod transpose;
mod wait;

pub use config::{CompletionPolicy, CudaConfig, Direction, WaitMode};
pub use error::{CudaError, DriverError};
pub use event::CudaCompletion;
pub use interop::{InteropError, StreamEngine, StreamWait};
pub use memory::{DeviceBuffer, Location, ManagedBuffer, MappedBuffer, PinnedBuffer, Registered};
pub use probe::{probe, CudaProbe, DeviceInfo};
pub use program::KernelError;
pub use route::KernelCopies;

use super::{Engine, Job, SubmitError};
use crate::memory::{MemKind, RawBuf};
use crate::request::{BarrierError, Request, RequestError};
use cudarc::driver::{sys, CudaContext, CudaStream};
use driver::check;
use exec::End;
use route::{Path, Route};
use std::sync::{Arc, Mutex, PoisonError};

struct Peer {
    ctx: Arc<CudaContext>,
    enabled: bool,
}

/// The CUDA engine of one device. See the [module documentation](self).
pub struct CudaEngine {
    cfg: CudaConfig,
    ctx: Arc<CudaContext>,
    /// The stream pool: a stream per direction, an event pool and an in-flight list per lane.
    lanes: lanes::Lanes,
    /// `can_access[j]`: this device can access device `j` directly.
    can_access: Vec<bool>,
    peers: Mutex<Vec<Option<Peer>>>,
    paths: paths::Paths,
    /// Upper bounds on this GPU's path rates, for [`WaitMode::Auto`]'s expected end times.
    rates: wait::Rates,
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
        let first = lanes::Lanes::first(&ctx)?;
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
        let rates = wait::Rates::probe(
            me,
            probe::device_info(cfg.ordinal, me).pci_bus_id.as_deref(),
        );
        let waker_tx = event::spawn_waiter(format!("ferry-cuda{}-waiter", cfg.ordinal))
            .map_err(|e| CudaError::Thread(e.to_string()))?;
        Ok(CudaEngine {
            cfg,
            lanes: lanes::Lanes::new(&ctx, first, cfg.streams, &waker_tx),
            can_access,
            peers: Mutex::new((0..count).map(|_| None).collect()),
            paths: paths::Paths::new(Arc::clone(&ctx), cfg.staging.unwrap_or_default()),
            rates,
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

    /// The stream the calling thread's copies in direction `d` run on (for interop, e.g.
    /// launching kernels ordered with ferry's copies, or timing them with events): the engine
    /// keeps a pool of [`CudaConfig::streams`] streams per direction and each submitting
    /// thread keeps one of them (see [Ordering](self#ordering)). Another thread may get
    /// another stream: ask on the thread that submits. From this call on, every request on
    /// that stream records its completion event at submit (the caller's work may follow it on
    /// the stream; see `mark.rs`).
    pub fn stream(&self, d: Direction) -> &Arc<CudaStream> {
        let q = self.lanes.queue(self.lanes.mine(), d);
        q.expose();
        q.stream()
    }

    /// Compiles (NVRTC) and loads this engine's kernels now: the SM copy kernels of
    /// [`KernelCopies`] and the segment-list gather kernel. Otherwise the first copy that needs
    /// one pays for it (2.8-3.1 s on the H200 host in runs 21-22, once per machine with the PTX
    /// cache), which a latency-bound or timed first copy should not. Errors: no NVRTC library, a compile or module-load failure
    /// (the copies then keep to the copy engines and the driver's calls, as without this call).
    ///
    /// ```no_run
    /// let engine = ferry::cuda::CudaEngine::new(0)?;
    /// engine.compile_kernels()?;
    /// # Ok::<(), ferry::cuda::CudaError>(())
    /// ```
    pub fn compile_kernels(&self) -> Result<(), CudaError> {
        self.paths.sm()?;
        let g = self.paths.gatherer()?;
        g.kernel().map(drop).map_err(CudaError::from)
    }

    /// The end of a copy for a buffer, enabling peer access on first use of another device.
    #[inline(always)]
    fn end(&self, addr: u64, kind: MemKind) -> Result<End, SubmitError> {
        let ctx = match kind {
            MemKind::Device { ordinal } if ordinal != self.cfg.ordinal => {
                return self.peer_end(addr, kind, ordinal);
            }
            MemKind::Device { .. } => self.ctx.cu_ctx(),
            _ => std::ptr::null_mut(),
        };
        Ok(End { addr, kind, ctx })
    }

    /// [`CudaEngine::end`] in another GPU's memory.
    #[cold]
    fn peer_end(&self, addr: u64, kind: MemKind, ordinal: u32) -> Result<End, SubmitError> {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = peers
            .get_mut(ordinal as usize)
            .ok_or_else(|| self.unsupported(kind, None))?;
        if slot.is_none() {
            let ctx = driver::context(ordinal)?;
            *slot = Some(Peer {
                ctx,
                enabled: false,
            });
        }
        let peer = slot.as_mut().ok_or_else(|| self.unsupported(kind, None))?;
        // Without direct access (no P2P between the two), `cuMemcpyPeerAsync` still copies,
        // staged by the driver; only enable access where the devices allow it.
        let direct = self
            .can_access
            .get(ordinal as usize)
            .copied()
            .unwrap_or(false);
        if !peer.enabled && direct {
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

    /// Host memory passed as plain (pageable) memory that is in fact page-locked (a
    /// `PinnedBuffer` or `Registered` seen through a slice, memory registered elsewhere) is
    /// recognised through unified addressing and copied as pinned memory: no staging needed.
    /// Asked (one driver query per buffer, [`driver::page_locked`]) only where
    /// [`route::asks_page_lock`] says the answer can change the path.
    fn refine_kinds(&self, job: &mut Job) {
        self.refine(&mut job.dst);
        if let Some(src) = job.src.as_mut() {
            self.refine(src);
        }
    }

    /// [`CudaEngine::refine_kinds`] of one buffer: `Pinned` if it is `Pageable` and the whole
    /// range is page-locked (one allocation's range, or both ends: a registration covers whole
    /// pages of one range; [`driver::page_locked`]).
    ///
    /// Public as [`CudaEngine::host_kind`].
    fn refine(&self, b: &mut RawBuf) {
        if b.kind == MemKind::Pageable
            && b.len > 0
            && driver::bind(&self.ctx).is_ok()
            && driver::page_locked(b.addr, b.len)
        {
            b.kind = MemKind::Pinned;
        }
    }

    /// `buf` with its kind as this engine's driver knows it: [`MemKind::Pinned`] where a
    /// [`MemKind::Pageable`] view's whole range is page-locked host memory (allocated pinned or
    /// registered, by ferry or by another library such as PyTorch's `pin_memory`), else `buf`
    /// unchanged. The engine asks this itself before routing a copy where the answer can
    /// change the path; bindings that describe foreign host memory by address (ferry's Python
    /// module) ask it before building a pipeline over it. One driver query
    /// (`cuPointerGetAttributes`, about 0.1-0.2 us on the H200 host); nothing is dereferenced.
    pub fn host_kind(&self, mut buf: RawBuf) -> RawBuf {
        self.refine(&mut buf);
        buf
    }

    /// Runs a route's paths in order on `stream` (the route's direction in the submitting
    /// thread's lane) until one has enqueued the
    /// program: a kernel path that cannot be made here (no NVRTC) or whose launch failed before
    /// anything was enqueued falls through to the next, and the driver steps close the list.
    ///
    /// # Safety
    /// As [`exec::run_step`] for every step: this engine's context is current, the buffers are
    /// valid until the request completes, the steps lie inside them.
    unsafe fn run_route(
        &self,
        route: &Route,
        steps: &[crate::op::Step],
        job: &Job,
        (dst, src): (End, Option<End>),
        stream: &Arc<CudaStream>,
        keep: &mut Vec<memory::DeviceBuffer>,
    ) -> Result<(), SubmitError> {
        let src_len = job.src.map_or(0, |s| s.len);
        for path in route.paths() {
            // The route chose a kernel path only where both sides are reachable by this GPU.
            let done = match (path, src) {
                // SAFETY: forwarded with this function's contract (context, stream, buffers).
                (Path::Sm, Some(src)) => unsafe { self.paths.run_sm(stream, dst, src, steps) },
                (Path::Gather, Some(src)) => {
                    // SAFETY: as above; the lengths are the job's buffers'.
                    unsafe {
                        self.paths
                            .run_gather(stream, dst, job.dst.len, src, src_len, steps)
                    }
                }
                (Path::Split { sm_bytes }, Some(src)) => {
                    // SAFETY: as above; the route splits one contiguous plan within this GPU.
                    unsafe { self.paths.run_split(stream, dst, src, steps, sm_bytes)? }
                }
                (Path::Driver, _) => {
                    // SAFETY: forwarded with this function's contract.
                    unsafe { self.run_steps(stream.cu_stream(), steps, dst, src, keep)? };
                    true
                }
                _ => false,
            };
            if done {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The program's steps as driver calls, one after the other. An error returns at once
    /// ([`CudaEngine::launch`] finishes the work enqueued before it).
    ///
    /// # Safety
    /// As [`exec::run_step`].
    unsafe fn run_steps(
        &self,
        stream: sys::CUstream,
        steps: &[crate::op::Step],
        dst: End,
        src: Option<End>,
        keep: &mut Vec<memory::DeviceBuffer>,
    ) -> Result<(), SubmitError> {
        for step in steps {
            // SAFETY: context current, stream ours (1); buffers valid until the request
            // completes, by this function's contract (2); steps checked by the program (3).
            unsafe { exec::run_step(stream, dst, src, step, self.cfg.ordinal, keep)? };
        }
        Ok(())
    }

    /// A staged request: handed to the direction's staging thread, which waits for the
    /// dependencies, moves the bytes through the pinned ring and completes the request.
    fn stage(
        &self,
        job: &Job,
        queue: &Arc<mark::Queue>,
        dir: staged::Direction,
        steps: Vec<crate::op::Step>,
    ) -> Result<Request, SubmitError> {
        // A staged copy's DMAs are submissions too: they end another thread's streak.
        self.counted_alone();
        let work = match <[_; 1]>::try_from(steps) {
            Ok([crate::op::Step::Segments { segs, range, .. }]) => paths::StagedWork::Segments {
                segs,
                range,
                dst_len: job.dst.len,
                src_len: job.src.map_or(0, |s| s.len),
            },
            // The route stages programs of copies only, or one segment list.
            Ok(one) => paths::StagedWork::Plans(paths::plan_steps(one)),
            Err(steps) => paths::StagedWork::Plans(paths::plan_steps(steps)),
        };
        let signal = Arc::new(crate::request::Signal::new());
        self.paths.stage(paths::StagedTask {
            dir,
            stream: Arc::clone(queue.stream()),
            _foreign: queue.foreign(),
            dst: job.dst.addr,
            src: job.src.map_or(0, |s| s.addr),
            work,
            after: job.after.iter().map(Request::share).collect(),
            signal: Arc::clone(&signal),
        })?;
        Ok(Request::new(signal))
    }

    /// Counts a submission of the calling thread towards its streak ([`lanes::Lanes::alone`],
    /// for stamps: every submission of the default wait counts, stampable or not); whether the
    /// thread submits alone. Nothing is counted in the other wait modes (they never stamp).
    fn counted_alone(&self) -> bool {
        self.cfg.wait == WaitMode::Auto && self.lanes.alone()
    }

    /// Tracks `req` in lane `lane`'s in-flight list (for barriers).
    fn track(&self, lane: usize, req: Request) -> Request {
        self.lanes.lane(lane).inflight.track(&req);
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
        route::supports(self.cfg.ordinal, &self.can_access, dst, src)
    }

    unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
        // SAFETY: forwarded with the caller's guarantees; no caller stream.
        unsafe { self.submit_on(job, None) }
    }

    /// One contiguous run is checked, routed and submitted without building the job (as
    /// `submit_raw` would, with the same checks and errors); any other copy through
    /// `submit_raw`.
    unsafe fn submit_copy(
        &self,
        dst: RawBuf,
        dst_layout: &crate::Layout,
        src: RawBuf,
        src_layout: &crate::Layout,
    ) -> Result<Request, SubmitError> {
        super::check_bufs(dst, Some(src))?;
        let lane = self.lanes.mine();
        let (mut dst, mut src, mut asked) = (dst, src, false);
        if let Some(run) = crate::op::checked_run(dst_layout, src_layout, dst.len, src.len)? {
            // SAFETY: forwarded with the caller's guarantees; `run` lies inside both buffers
            // (`checked_run`).
            match unsafe { self.submit_run(dst, src, lane, run)? } {
                Run::Done(req) => return Ok(req),
                Run::General(d, s, a) => (dst, src, asked) = (d, s, a),
            }
        }
        let job = Job::copy(dst, *dst_layout, src, *src_layout);
        // SAFETY: forwarded with the caller's guarantees; checked above; no caller stream.
        unsafe { self.submit_program(job, lane, None, asked) }
    }

    fn barrier(&self) -> Result<(), BarrierError> {
        self.lanes.barrier()
    }

    /// This GPU's device memory.
    fn home(&self) -> Option<MemKind> {
        Some(MemKind::Device {
            ordinal: self.cfg.ordinal,
        })
    }
}

impl CudaEngine {
    /// [`Engine::submit_raw`], in the caller's stream `caller` when given
    /// ([`CudaEngine::on_stream`]): a route whose first path is driver calls runs on that
    /// stream itself (its dependencies waited for there, its event recorded there); any other
    /// route runs on the engine's stream, ordered after and before the caller's stream by
    /// events ([`CudaEngine::around_stream`]).
    ///
    /// # Safety
    /// 1. As [`Engine::submit_raw`] for the job's buffers.
    /// 2. `caller`, when given, is a live stream of this engine's context (or the null stream)
    ///    until the call returns; the request's event is recorded on it.
    pub(crate) unsafe fn submit_on(
        &self,
        mut job: Job,
        caller: Option<sys::CUstream>,
    ) -> Result<Request, SubmitError> {
        job.check()?;
        // The submitting thread's lane: its stream for the route's direction, its events and
        // its in-flight list (see the module documentation, "Ordering").
        let lane = self.lanes.mine();
        let mut asked = false;
        // One contiguous copy on the engine's stream without dependencies (nearly every
        // request): checked, routed and run without building a program.
        if let (None, true, Some(src), crate::op::Op::Copy { dst: dl, src: sl }) =
            (caller, job.after.is_empty(), job.src, &job.op)
        {
            if let Some(run) = crate::op::checked_run(dl, sl, job.dst.len, src.len)? {
                // SAFETY: forwarded (1); `run` lies inside both buffers (`checked_run`).
                match unsafe { self.submit_run(job.dst, src, lane, run)? } {
                    Run::Done(req) => return Ok(req),
                    Run::General(d, s, a) => (job.dst, job.src, asked) = (d, Some(s), a),
                }
            }
        }
        // SAFETY: forwarded (1, 2); the job was checked above (its buffers' kinds at most
        // refined by `submit_run`).
        unsafe { self.submit_program(job, lane, caller, asked) }
    }

    /// [`CudaEngine::submit_on`] by the general rules, in the submitting thread's `lane`, of a
    /// job already checked (`Job::check`): its program built, routed and run.
    ///
    /// # Safety
    /// As [`CudaEngine::submit_on`].
    unsafe fn submit_program(
        &self,
        mut job: Job,
        lane: usize,
        caller: Option<sys::CUstream>,
        asked: bool,
    ) -> Result<Request, SubmitError> {
        // Prepare: build and check the program (custom operators fail only their request).
        let mut prog = crate::op::Program::new(job.dst.len, job.src.map(|s| s.len));
        if job.op.is_builtin() {
            job.op.lower_into(&mut prog)?;
        } else {
            match job.op.lower_catching(job.dst.len, job.src.map(|s| s.len)) {
                Ok(p) => prog = p,
                Err(e) => return Ok(self.track(lane, Request::ready(Err(e)))),
            }
        }
        let steps = prog.steps();
        if !asked && route::asks_page_lock(job.dst.kind, job.src.map(|s| s.kind), steps) {
            self.refine_kinds(&mut job);
        }
        let (dk, sk) = (job.dst.kind, job.src.map(|s| s.kind));
        if !self.supports(dk, sk) {
            return Err(self.unsupported(dk, sk));
        }
        // Decide, then run.
        let route = route::route(&self.cfg, dk, sk, steps);
        if let (Some(c), false) = (caller, route.first() == Path::Driver) {
            // SAFETY: forwarded (1, 2).
            return unsafe { self.around_stream(job, c) };
        }
        let queue = self.lanes.queue(lane, route.stream);
        if let Path::Staged(dir) = route.first() {
            return Ok(self.track(lane, self.stage(&job, queue, dir, prog.into_steps())?));
        }
        let bytes = steps.iter().map(crate::op::Step::bytes).sum();
        let expect = self.expect(bytes, dk, sk);
        // Dependencies: CUDA requests become stream waits; others are waited here. Marked
        // before this queue is locked: marking a lazy request takes its own queue's lock.
        let mut events = Vec::new();
        for dep in &job.after {
            let known = match dep.completion().as_any().downcast_ref::<CudaCompletion>() {
                Some(c) => match c.mark() {
                    event::Mark::Event(e) => {
                        events.push(e);
                        Ok(())
                    }
                    event::Mark::Known(r) => r,
                },
                None => dep.completion().wait(),
            };
            if let Err(e) = known {
                return Ok(self.track(
                    lane,
                    Request::ready(Err(RequestError::Dependency(Box::new(e)))),
                ));
            }
        }
        driver::bind(&self.ctx)?;
        let dst = self.end(job.dst.addr, dk)?;
        let src = match job.src {
            Some(s) => Some(self.end(s.addr, s.kind)?),
            None => None,
        };
        let on = Launch {
            lane,
            queue,
            caller,
            events,
            expect,
            worth: mark::worth_a_stamp(dk, sk, bytes),
        };
        // SAFETY: context current (bound above); the caller's stream, when given, a live
        // stream of this context (2); the buffers are valid until the request completes (1);
        // the steps were checked against the buffers by the program.
        unsafe {
            self.launch(on, |stream, keep| match caller {
                Some(c) => self.run_steps(c, steps, dst, src, keep),
                None => self.run_route(&route, steps, &job, (dst, src), stream, keep),
            })
        }
    }

    /// [`CudaEngine::submit_on`] of a copy that is one contiguous run `(dst offset, src offset,
    /// bytes)`, on the engine's stream, without dependencies: routed by [`route::one_run`] and
    /// run as one driver call. Pageable-kind buffers are first asked about where
    /// [`route::asks_page_lock_run`] says so ([`CudaEngine::refine`]): a slice of pinned memory
    /// then takes this path too (through the general path it cost a 1 MiB copy's caller
    /// 0.5 us more than the `PinnedBuffer` itself on the H200 host, `bench/results/h200.md`
    /// runs 78 and 80). [`Run::General`] where the route is not one driver call (staging, SM
    /// copies, a split): the general path takes the buffers with their kinds as asked.
    ///
    /// # Safety
    /// As [`Engine::submit_raw`] for `dst` and `src`; `run` lies inside both (checked by
    /// `op::checked_run`).
    unsafe fn submit_run(
        &self,
        mut dst: RawBuf,
        mut src: RawBuf,
        lane: usize,
        (d, s, n): (usize, usize, usize),
    ) -> Result<Run, SubmitError> {
        let pageable = dst.kind == MemKind::Pageable || src.kind == MemKind::Pageable;
        let asked = pageable && route::asks_page_lock_run(dst.kind, src.kind, n);
        if asked {
            self.refine(&mut dst);
            self.refine(&mut src);
        }
        let (dk, sk) = (dst.kind, src.kind);
        if !self.supports(dk, Some(sk)) {
            return Ok(Run::General(dst, src, asked));
        }
        let route = match route::one_run(&self.cfg, dk, sk, n) {
            Some(r) if r.first() == Path::Driver => r,
            _ => return Ok(Run::General(dst, src, asked)),
        };
        let queue = self.lanes.queue(lane, route.stream);
        let expect = self.expect(n, dk, Some(sk));
        driver::bind(&self.ctx)?;
        let (dst, src) = (self.end(dst.addr, dk)?, self.end(src.addr, sk)?);
        let on = Launch {
            lane,
            queue,
            caller: None,
            events: Vec::new(),
            expect,
            worth: mark::worth_a_stamp(dk, Some(sk), n),
        };
        // SAFETY: context current (bound above), the stream the engine's; the run lies inside
        // both buffers (this function's contract: `op::checked_run` checked it), valid until
        // the request completes (this function's contract).
        unsafe {
            self.launch(on, |stream, _| {
                Ok(exec::copy1d(stream.cu_stream(), dst.at(d), src.at(s), n)?)
            })
        }
        .map(Run::Done)
    }

    /// For [`WaitMode::Auto`]: the earliest end of `bytes` between memory of these kinds
    /// (bytes over the path's rate bound from now). The other modes never look (no clock read
    /// for them).
    fn expect(&self, bytes: usize, dk: MemKind, sk: Option<MemKind>) -> wait::Expect {
        match self.cfg.wait {
            WaitMode::Auto => {
                wait::Expect::now(wait::expected(bytes, self.rates.for_kinds(dk, sk)))
            }
            _ => wait::Expect::UNUSED,
        }
    }

    /// The end of every submission that runs on the submitting thread: holds the engine's
    /// stream (its last lazy request gets its event first) or takes the caller's, makes it
    /// wait for the dependencies' events, enqueues the work (`run`, given the engine's stream
    /// and a list of device buffers to keep until the request completes), marks the request's
    /// end (an event now, or lazily: [`mark`]) and tracks the request.
    ///
    /// # Safety
    /// This engine's context is current; `on.caller`, when given, is a live stream of it; the
    /// work `run` enqueues is valid to run there (as [`exec::run_step`]).
    unsafe fn launch(
        &self,
        on: Launch<'_>,
        run: impl FnOnce(&Arc<CudaStream>, &mut Vec<memory::DeviceBuffer>) -> Result<(), SubmitError>,
    ) -> Result<Request, SubmitError> {
        let Launch {
            lane,
            queue,
            caller,
            events,
            expect,
            worth,
        } = on;
        let home = &self.lanes.lane(lane).home;
        // The engine's stream is held for the submission (its last lazy request gets its event
        // first); the caller's is not the engine's to track.
        let mut hold = caller.is_none().then(|| queue.enqueue());
        let marking = mark::marking(
            self.cfg.wait,
            self.cfg.completion,
            caller.is_some(),
            hold.as_ref().is_some_and(mark::Enqueue::shared),
        );
        let ev = match marking {
            mark::Marking::Event => Some(home.events.take(self.cfg.wait)?),
            mark::Marking::Lazy => None,
        };
        let raw_stream = caller.unwrap_or(queue.raw());
        for e in events {
            // SAFETY: live stream of this context and a live event (held by the dependency's
            // request, which the job holds).
            check("cuStreamWaitEvent", unsafe {
                sys::cuStreamWaitEvent(raw_stream, e, 0)
            })?;
        }
        let mut keep = Vec::new();
        let ran = run(queue.stream(), &mut keep);
        // Counted after the work is enqueued: nothing more on the host's path to it.
        let alone = self.counted_alone();
        if let Err(e) = ran {
            // Work enqueued before the failure still uses the buffers: finish it before
            // handing the error (and, in the safe API, the buffers) back.
            // SAFETY: a live stream of this context.
            let _ = unsafe { sys::cuStreamSynchronize(raw_stream) };
            return Err(e);
        }
        let marked = match ev {
            Some(ev) => {
                // SAFETY: live event and stream of this context.
                if let Err(e) = check("cuEventRecord", unsafe {
                    sys::cuEventRecord(ev.raw(), raw_stream)
                }) {
                    // SAFETY: our live stream.
                    let _ = unsafe { sys::cuStreamSynchronize(raw_stream) };
                    return Err(e.into());
                }
                event::Marked::Event(ev)
            }
            None => {
                let stamp = match hold.as_mut() {
                    // SAFETY: the context is current (this function's contract).
                    Some(h) => unsafe { h.stamp(self.cfg.wait, marking, (alone, worth)) },
                    None => None,
                };
                event::Marked::Lazy(Arc::clone(queue), stamp)
            }
        };
        let c = CudaCompletion::new(marked, Arc::clone(home), (self.cfg.wait, expect), keep);
        if let (Some(h), mark::Marking::Lazy) = (hold, marking) {
            h.push_lazy(&c);
        }
        Ok(self.track(lane, Request::from_shared(c)))
    }
}

/// What [`CudaEngine::submit_run`] did with a copy of one run.
enum Run {
    /// Submitted as one driver call.
    Done(Request),
    /// Left to the general path ([`CudaEngine::submit_program`]): the destination and source,
    /// their kinds as asked, and whether the driver was asked (it is not asked twice).
    General(RawBuf, RawBuf, bool),
}

/// Where [`CudaEngine::launch`] enqueues a request: the submitting thread's lane, the engine's
/// queue for the route's direction, or the caller's stream; the dependencies' events to wait
/// for first; the request's expected end ([`WaitMode::Auto`]).
struct Launch<'a> {
    lane: usize,
    queue: &'a Arc<mark::Queue>,
    caller: Option<sys::CUstream>,
    events: Vec<sys::CUevent>,
    expect: wait::Expect,
    /// Whether the request is worth a stamp ([`mark::worth_a_stamp`]).
    worth: bool,
}

impl Drop for CudaEngine {
    fn drop(&mut self) {
        // Staged copies finish on their threads first.
        self.paths.shutdown();
        // Work in flight finishes before the streams go; requests keep their own events.
        if driver::bind(&self.ctx).is_ok() {
            for s in self.lanes.streams() {
                let _ = s.synchronize();
            }
        }
    }
}
