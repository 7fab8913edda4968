//! The submission path of the CUDA engine: the engine's state ([`CudaEngine`]'s fields: the
//! lanes of streams, the peers, the mechanisms, the rate bounds) and how one job becomes work
//! on a stream, in the dmaengine's three steps:
//!
//! - **prepare** (nothing enqueued, nothing blocks): the job is checked, lowered to its
//!   program once (one contiguous run skips the program: [`CudaEngine::submit_run`]), the
//!   buffers' kinds refined where the route depends on them, and routed (`route.rs`, pure);
//! - **enqueue** ([`CudaEngine::launch`]): the dependencies become stream waits, the route's
//!   mechanism enqueues the work (`paths/`), the request's end is marked by the completion
//!   policy (`completion/`);
//! - **flush**: the driver starts enqueued work itself; a staged route hands its task to the
//!   staging thread.
//!
//! One unsafe contract covers the path: [`CudaEngine::submit_on`]'s.

use super::completion;
use super::paths;
use super::paths::calls::End;
use super::route::{self, Path, Route};
use super::sys::driver::{self, check};
use super::sys::memory;
use super::{lanes, CudaCompletion, CudaConfig, WaitMode};
use crate::engine::{Engine, Job, SubmitError};
use crate::memory::{MemKind, RawBuf};
use crate::request::{Request, RequestError};
use cudarc::driver::{sys as cu, CudaContext, CudaStream};
use std::sync::{Arc, Mutex, PoisonError};

pub(super) struct Peer {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) enabled: bool,
}

/// The CUDA engine of one device. See the [module documentation](crate::engine::cuda).
pub struct CudaEngine {
    pub(super) cfg: CudaConfig,
    pub(super) ctx: Arc<CudaContext>,
    /// The stream pool: a stream per direction, an event pool and an in-flight list per lane.
    pub(super) lanes: lanes::Lanes,
    /// `can_access[j]`: this device can access device `j` directly.
    pub(super) can_access: Vec<bool>,
    pub(super) peers: Mutex<Vec<Option<Peer>>>,
    pub(super) paths: paths::Paths,
    /// Upper bounds on this GPU's path rates, for [`WaitMode::Auto`]'s expected end times.
    pub(super) rates: completion::wait::Rates,
}

impl CudaEngine {
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
            let r = unsafe { cu::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0) };
            if r != cu::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
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

    pub(super) fn unsupported(&self, dst: MemKind, src: Option<MemKind>) -> SubmitError {
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
    pub(super) fn refine(&self, b: &mut RawBuf) {
        if b.kind == MemKind::Pageable
            && b.len > 0
            && driver::bind(&self.ctx).is_ok()
            && driver::page_locked(b.addr, b.len)
        {
            b.kind = MemKind::Pinned;
        }
    }

    /// Runs a route's paths in order on `stream` (the route's direction in the submitting
    /// thread's lane) until one has enqueued the
    /// program: a kernel path that cannot be made here (no NVRTC) or whose launch failed before
    /// anything was enqueued falls through to the next, and the driver steps close the list.
    ///
    /// # Safety
    /// As [`paths::calls::run_step`] for every step: this engine's context is current, the buffers are
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
    /// As [`paths::calls::run_step`].
    unsafe fn run_steps(
        &self,
        stream: cu::CUstream,
        steps: &[crate::op::Step],
        dst: End,
        src: Option<End>,
        keep: &mut Vec<memory::DeviceBuffer>,
    ) -> Result<(), SubmitError> {
        for step in steps {
            // SAFETY: context current, stream ours (1); buffers valid until the request
            // completes, by this function's contract (2); steps checked by the program (3).
            unsafe { paths::calls::run_step(stream, dst, src, step, self.cfg.ordinal, keep)? };
        }
        Ok(())
    }

    /// A staged request: handed to the direction's staging thread, which waits for the
    /// dependencies, moves the bytes through the pinned ring and completes the request.
    fn stage(
        &self,
        job: &Job,
        queue: &Arc<completion::mark::Queue>,
        dir: paths::staged::Direction,
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
        caller: Option<cu::CUstream>,
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
    pub(super) unsafe fn submit_program(
        &self,
        mut job: Job,
        lane: usize,
        caller: Option<cu::CUstream>,
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
                Some(c) => c.event_to_wait().map(|e| events.extend(e)),
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
            worth: completion::mark::worth_a_stamp(dk, sk, bytes),
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
    pub(super) unsafe fn submit_run(
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
            worth: completion::mark::worth_a_stamp(dk, Some(sk), n),
        };
        // SAFETY: context current (bound above), the stream the engine's; the run lies inside
        // both buffers (this function's contract: `op::checked_run` checked it), valid until
        // the request completes (this function's contract).
        unsafe {
            self.launch(on, |stream, _| {
                Ok(paths::calls::copy1d(
                    stream.cu_stream(),
                    dst.at(d),
                    src.at(s),
                    n,
                )?)
            })
        }
        .map(Run::Done)
    }

    /// For [`WaitMode::Auto`]: the earliest end of `bytes` between memory of these kinds
    /// (bytes over the path's rate bound from now). The other modes never look (no clock read
    /// for them).
    fn expect(&self, bytes: usize, dk: MemKind, sk: Option<MemKind>) -> completion::wait::Expect {
        match self.cfg.wait {
            WaitMode::Auto => completion::wait::Expect::now(completion::wait::expected(
                bytes,
                self.rates.for_kinds(dk, sk),
            )),
            _ => completion::wait::Expect::UNUSED,
        }
    }

    /// The end of every submission that runs on the submitting thread: holds the engine's
    /// stream (its last lazy request gets its event first) or takes the caller's, makes it
    /// wait for the dependencies' events, enqueues the work (`run`, given the engine's stream
    /// and a list of device buffers to keep until the request completes), marks the request's
    /// end (an event now, or lazily: [`mark`](completion::mark)) and tracks the request.
    ///
    /// # Safety
    /// This engine's context is current; `on.caller`, when given, is a live stream of it; the
    /// work `run` enqueues is valid to run there (as [`paths::calls::run_step`]).
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
        let marking = completion::mark::marking(
            self.cfg.wait,
            self.cfg.completion,
            caller.is_some(),
            hold.as_ref().is_some_and(completion::mark::Enqueue::shared),
        );
        let ev = match marking {
            completion::mark::Marking::Event => Some(home.events.take(self.cfg.wait)?),
            completion::mark::Marking::Lazy => None,
        };
        let raw_stream = caller.unwrap_or(queue.raw());
        for e in events {
            // SAFETY: live stream of this context and a live event (held by the dependency's
            // request, which the job holds).
            check("cuStreamWaitEvent", unsafe {
                cu::cuStreamWaitEvent(raw_stream, e, 0)
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
            let _ = unsafe { cu::cuStreamSynchronize(raw_stream) };
            return Err(e);
        }
        let marked = match ev {
            Some(ev) => {
                // SAFETY: live event and stream of this context.
                if let Err(e) = check("cuEventRecord", unsafe {
                    cu::cuEventRecord(ev.raw(), raw_stream)
                }) {
                    // SAFETY: our live stream.
                    let _ = unsafe { cu::cuStreamSynchronize(raw_stream) };
                    return Err(e.into());
                }
                completion::event::Marked::Event(ev)
            }
            None => {
                let stamp = match hold.as_mut() {
                    // SAFETY: the context is current (this function's contract).
                    Some(h) => unsafe { h.stamp(self.cfg.wait, marking, (alone, worth)) },
                    None => None,
                };
                completion::event::Marked::Lazy(Arc::clone(queue), stamp)
            }
        };
        let c = CudaCompletion::new(marked, Arc::clone(home), (self.cfg.wait, expect), keep);
        if let (Some(h), completion::mark::Marking::Lazy) = (hold, marking) {
            h.push_lazy(&c);
        }
        Ok(self.track(lane, Request::from_shared(c)))
    }
}

/// What [`CudaEngine::submit_run`] did with a copy of one run.
pub(super) enum Run {
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
    queue: &'a Arc<completion::mark::Queue>,
    caller: Option<cu::CUstream>,
    events: Vec<cu::CUevent>,
    expect: completion::wait::Expect,
    /// Whether the request is worth a stamp ([`completion::mark::worth_a_stamp`]).
    worth: bool,
}
