//! The submission path of the CUDA engine: the engine's state ([`CudaEngine`]'s fields: the
//! lanes of streams, the peers, the mechanisms, the rate bounds) and how one job becomes work
//! on a stream, in the dmaengine's three steps:
//!
//! - **prepare** (nothing enqueued, nothing blocks): the job is checked, lowered once (one
//!   contiguous run builds no program, and a run that cannot take the one-call path becomes a
//!   one-step program without a second check; a block copy's mapping builds no segment list
//!   where the gatherer takes it first: [`CudaEngine::enqueue_blocks`]), the buffers' kinds
//!   refined where the route depends on them, and routed (`route.rs`, pure);
//! - **enqueue** ([`CudaEngine::launch`]): the dependencies become stream waits, the route's
//!   mechanism enqueues the work (`paths/`), the request's end is marked by the completion
//!   policy (`completion/`);
//! - **flush**: the driver starts enqueued work itself; a staged route hands its task to the
//!   staging thread. A caller that said more work follows (`Engine::enqueue`) has its one-run
//!   copies between this GPU and page-locked host memory held on their stream until
//!   `Engine::flush` ([`CudaEngine::flush_lane`]), then given to the GPU as one list
//!   ([`completion::mark`]'s held copies, `paths/mod.rs`'s `HeldIssue`: the gather kernel where
//!   the segment-list rule picks it, else `cuMemcpyBatchAsync` where the driver has it,
//!   `paths/batch.rs`), their ends marked once (one stamp where the policy would have stamped
//!   one of them); a wait, poll or dependent of one of them, or another submission on the
//!   stream, issues them at once. Its other work starts at once, the tuned policy marking the
//!   batch's end once instead of each request's (no event, no stamp per request) until the
//!   flush, which stamps the batch's last request where it would have been stamped alone;
//!   where the caller said nothing, the policy's guesses hold (a lone thread on an idle stream
//!   waits next: a stamp).
//!
//! One trunk for every submission ([`CudaEngine::submit`]: `submit_raw`, `submit_copy`,
//! `enqueue`, a caller's stream), one unsafe contract: its.

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
    /// This device's kernels may touch managed memory while the host does
    /// (`CONCURRENT_MANAGED_ACCESS`): else the route keeps managed memory off the SMs.
    pub(super) managed_kernels: bool,
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
    ///
    /// One buffer's kind: `Pinned` if it is `Pageable` and the whole
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
        (dst, src): (End, Option<End>),
        stream: &Arc<CudaStream>,
        keep: &mut Vec<memory::DeviceBuffer>,
    ) -> Result<(), SubmitError> {
        for path in route.paths() {
            // The route chose a kernel path only where both sides are reachable by this GPU.
            let done = match (path, src) {
                // SAFETY: forwarded with this function's contract (context, stream, buffers).
                (Path::Sm, Some(src)) => unsafe { self.paths.run_sm(stream, dst, src, steps) },
                (Path::Gather, Some(src)) => {
                    let segs = paths::segments(steps);
                    let list = paths::gather::List::Segments(&segs);
                    // SAFETY: as above; the program checked its segments against the buffers.
                    unsafe { self.paths.run_gather(stream, dst, src, list) }
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
        (dst, src): (RawBuf, Option<RawBuf>),
        after: &[Request],
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
                dst_len: dst.len,
                src_len: src.map_or(0, |s| s.len),
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
            dst: dst.addr,
            src: src.map_or(0, |s| s.addr),
            work,
            after: after.iter().map(Request::share).collect(),
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

/// What a submission asks for, borrowed from its caller: a copy between two layouts (the
/// safe API's copies, no job built) or a job's operator.
#[derive(Clone, Copy)]
pub(super) enum What<'a> {
    /// Copy `.1` of the source into `.0` of the destination.
    Copy(&'a crate::Layout, &'a crate::Layout),
    /// Any operator.
    Op(&'a crate::op::Op),
}

/// One submission as the trunk ([`CudaEngine::submit`]) takes it: a job's parts, borrowed.
pub(super) struct Submission<'a> {
    pub(super) dst: RawBuf,
    pub(super) src: Option<RawBuf>,
    pub(super) what: What<'a>,
    /// Requests it starts after.
    pub(super) after: &'a [Request],
    /// The caller's stream ([`CudaEngine::on_stream`]), if any.
    pub(super) caller: Option<cu::CUstream>,
    /// The caller said more work follows (`Engine::enqueue`): its end is marked with the
    /// batch's ([`completion::mark`]'s deferral), and it gets no stamp.
    pub(super) more: bool,
}

impl<'a> Submission<'a> {
    /// A job's submission.
    pub(super) fn of(job: &'a Job, caller: Option<cu::CUstream>, more: bool) -> Submission<'a> {
        Submission {
            dst: job.dst,
            src: job.src,
            what: What::Op(&job.op),
            after: &job.after,
            caller,
            more,
        }
    }
}

/// What lowering a submission gave ([`lower`]).
enum Lowered<'a> {
    /// A copy of one contiguous run `(dst offset, src offset, bytes)`: no program built yet.
    Run((usize, usize, usize)),
    /// A block copy's mapping, checked against both tables: its segment list not built yet
    /// (the gatherer's kernel takes the mapping as it is).
    Blocks(crate::op::BlockList<'a>),
    /// The program (built in the caller's [`crate::op::Program`]).
    Program,
    /// A custom operator failed or panicked: the request fails, nothing is enqueued.
    Failed(RequestError),
}

impl CudaEngine {
    /// What this engine's routes are decided against ([`route::Rules`]).
    fn rules(&self) -> route::Rules<'_> {
        route::Rules {
            cfg: &self.cfg,
            managed_kernels: self.managed_kernels,
        }
    }

    /// [`Engine::submit_raw`] of `job` (or [`Engine::enqueue`]: `more`), in the caller's
    /// stream `caller` when given ([`CudaEngine::on_stream`]): see [`CudaEngine::submit`].
    ///
    /// # Safety
    /// As [`CudaEngine::submit`].
    pub(crate) unsafe fn submit_on(
        &self,
        job: Job,
        caller: Option<cu::CUstream>,
    ) -> Result<Request, SubmitError> {
        // SAFETY: forwarded.
        unsafe { self.submit(Submission::of(&job, caller, false)) }
    }

    /// The one trunk of every submission (`submit_raw`, `submit_copy`, `enqueue`, a caller's
    /// stream): **prepare** (checked, lowered once: one contiguous run builds no program, nor a
    /// block copy's mapping a segment list where the gatherer takes it first; kinds
    /// refined where the route depends on them; routed), then **enqueue**: a run whose route is
    /// one driver call on the engine's stream, without dependencies, straight to
    /// [`CudaEngine::launch`] (nearly every request: the path a small copy's caller waits for,
    /// issue 14); anything else as its program's route says. A route whose first path is driver
    /// calls runs on the caller's stream itself when one is given (its dependencies waited for
    /// there, its event recorded there); any other route runs on the engine's stream, ordered
    /// after and before the caller's stream by events ([`CudaEngine::around_stream`]).
    ///
    /// # Safety
    /// 1. As [`Engine::submit_raw`] for the submission's buffers.
    /// 2. `caller`, when given, is a live stream of this engine's context (or the null stream)
    ///    until the call returns; the request's event is recorded on it.
    pub(super) unsafe fn submit(&self, s: Submission<'_>) -> Result<Request, SubmitError> {
        crate::engine::check_bufs(s.dst, s.src)?;
        // The submitting thread's lane: its stream for the route's direction, its events and
        // its in-flight list (see the module documentation, "Ordering").
        let lane = self.lanes.mine();
        // Prepare: lowered once, the program built where it stays (custom operators fail only
        // their request).
        let mut prog = crate::op::Program::new(s.dst.len, s.src.map(|b| b.len));
        let (mut run, mut blocks) = (None, None);
        match lower(&s, &mut prog)? {
            Lowered::Run(r) => run = Some(r),
            Lowered::Blocks(b) => blocks = Some(b),
            Lowered::Program => {}
            Lowered::Failed(e) => return Ok(self.track(lane, Request::ready(Err(e)))),
        }
        // No step (a copy or fill of no element, an operator that adds none): no driver call.
        if blocks.is_none() && run.map_or(prog.steps().is_empty(), |(_, _, n)| n == 0) {
            return Ok(self.nothing(lane, s.after));
        }
        // Kinds: page-locked memory seen as pageable is asked about where the route depends on
        // it (once).
        let (mut dst, mut src) = (s.dst, s.src);
        let asks = match (run, src) {
            (Some((_, _, n)), Some(b)) => {
                (dst.kind == MemKind::Pageable || b.kind == MemKind::Pageable)
                    && route::asks_page_lock_run(dst.kind, b.kind, n)
            }
            _ => route::asks_page_lock(dst.kind, src.map(|b| b.kind), prog.steps()),
        };
        if asks {
            self.refine(&mut dst);
            if let Some(b) = src.as_mut() {
                self.refine(b);
            }
        }
        let (dk, sk) = (dst.kind, src.map(|b| b.kind));
        if !self.supports(dk, sk) {
            return Err(self.unsupported(dk, sk));
        }
        // Route; one run on the engine's stream without dependencies: one driver call.
        if let (Some(run), Some(b), None, true) = (run, src, s.caller, s.after.is_empty()) {
            if let Some(r) = self.rules().one_run(dk, b.kind, run.2) {
                if r.first() == Path::Driver {
                    // SAFETY: forwarded (1); `run` lies inside both buffers (`checked_run`).
                    return unsafe { self.enqueue_run(&r, lane, (dst, b), run, s.more) };
                }
            }
        }
        // A block copy the gatherer takes first, on the engine's stream without dependencies:
        // its mapping as it is (no segment list built).
        if let (Some(b), Some(sb), None, true) = (blocks, src, s.caller, s.after.is_empty()) {
            let r = self.rules().list_route(dk, sb.kind, b.runs, b.bytes());
            if r.first() == Path::Gather {
                // SAFETY: forwarded (1); the mapping was checked against both buffers.
                return unsafe { self.enqueue_blocks(&r, lane, (dst, sb), b, s.more) };
            }
        }
        if let Some(b) = blocks {
            b.push_into(&mut prog);
        }
        if let Some(run) = run {
            prog.push_run(run);
        }
        // SAFETY: forwarded (1, 2); the program was checked against the buffers.
        unsafe { self.enqueue_program(&s, (dst, src), prog, lane) }
    }

    /// The request of a submission with no step: done at once, or when its dependencies are
    /// (their failures are its own, as for any request that waits for them).
    fn nothing(&self, lane: usize, after: &[Request]) -> Request {
        if after.is_empty() {
            return Request::ready(Ok(()));
        }
        let deps = after.iter().map(Request::share).collect();
        self.track(lane, Request::new(AfterAll(deps)))
    }

    /// Enqueue of a copy that is one contiguous run `(dst offset, src offset, bytes)`, routed
    /// by [`route::Rules::one_run`] to one driver call on the engine's stream, without dependencies.
    ///
    /// # Safety
    /// As [`Engine::submit_raw`] for `dst` and `src`; `run` lies inside both (checked by
    /// `op::checked_run`).
    #[inline(always)]
    unsafe fn enqueue_run(
        &self,
        route: &Route,
        lane: usize,
        (dst, src): (RawBuf, RawBuf),
        (d, s, n): (usize, usize, usize),
        more: bool,
    ) -> Result<Request, SubmitError> {
        let (dk, sk) = (dst.kind, src.kind);
        let queue = self.lanes.queue(lane, route.stream);
        let expect = self.expect(n, dk, Some(sk));
        if more && self.holds(dk) && self.holds(sk) && n > 0 {
            let copy = completion::mark::BatchCopy {
                dst: dst.addr + d as u64,
                src: src.addr + s as u64,
                len: n,
                dst_kind: dk,
                src_kind: sk,
            };
            // SAFETY: the run lies inside both buffers, valid until the request completes
            // (this function's contract); of kinds `holds` takes.
            return Ok(unsafe { self.hold_copy(lane, queue, copy, expect) });
        }
        driver::bind(&self.ctx)?;
        let (dst, src) = (self.end(dst.addr, dk)?, self.end(src.addr, sk)?);
        let on = Launch {
            lane,
            queue,
            caller: None,
            events: Vec::new(),
            expect,
            worth: completion::mark::worth_a_stamp(dk, Some(sk), n),
            more,
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
    }

    /// Enqueue of a block copy whose route starts with the gatherer, on the engine's stream,
    /// without dependencies: the gatherer takes the checked mapping as it is (its kernel's
    /// table written from it; a list built only for another mechanism); where the gatherer
    /// cannot run it, the list as driver calls.
    ///
    /// # Safety
    /// As [`Engine::submit_raw`] for `dst` and `src`; `blocks` was checked against both.
    unsafe fn enqueue_blocks(
        &self,
        route: &Route,
        lane: usize,
        (dst, src): (RawBuf, RawBuf),
        blocks: crate::op::BlockList<'_>,
        more: bool,
    ) -> Result<Request, SubmitError> {
        let (dk, sk, bytes) = (dst.kind, src.kind, blocks.bytes());
        driver::bind(&self.ctx)?;
        let (dst_end, src_end) = (self.end(dst.addr, dk)?, self.end(src.addr, sk)?);
        let on = Launch {
            lane,
            queue: self.lanes.queue(lane, route.stream),
            caller: None,
            events: Vec::new(),
            expect: self.expect(bytes, dk, Some(sk)),
            worth: completion::mark::worth_a_stamp(dk, Some(sk), bytes),
            more,
        };
        // SAFETY: context current (bound above), the stream the engine's; the mapping lies
        // inside both buffers (checked), valid until the request completes (this function's
        // contract).
        unsafe {
            self.launch(on, |stream, keep| {
                let list = paths::gather::List::Blocks(blocks);
                if self.paths.run_gather(stream, dst_end, src_end, list) {
                    return Ok(());
                }
                let mut prog = crate::op::Program::new(dst.len, Some(src.len));
                blocks.push_into(&mut prog);
                self.run_steps(
                    stream.cu_stream(),
                    prog.steps(),
                    dst_end,
                    Some(src_end),
                    keep,
                )
            })
        }
    }

    /// Whether a one-run copy with memory of kind `k` at one end may be held until a flush
    /// ([`completion::mark::Queue::push_held`]): this GPU's memory, page-locked host memory or
    /// managed memory, which the batched copy takes by unified address (not pageable memory,
    /// whose copies the driver stages on the host; not another GPU's, a peer copy).
    fn holds(&self, k: MemKind) -> bool {
        match k {
            MemKind::Device { ordinal } => ordinal == self.cfg.ordinal,
            MemKind::Pinned | MemKind::Mapped | MemKind::Managed => true,
            MemKind::Pageable => false,
        }
    }

    /// Holds `copy` on `queue` until its batch is issued (the caller's flush, a wait, another
    /// submission on the stream: [`completion::mark::Queue::push_held`]); its request.
    ///
    /// # Safety
    /// The copy's ranges are valid until the request completes; both ends of kinds
    /// [`CudaEngine::holds`] takes, its length above 0.
    unsafe fn hold_copy(
        &self,
        lane: usize,
        queue: &Arc<completion::mark::Queue>,
        copy: completion::mark::BatchCopy,
        expect: completion::wait::Expect,
    ) -> Request {
        use completion::mark;
        let home = &self.lanes.lane(lane).home;
        let marking = mark::marking(self.cfg.wait, self.cfg.completion, false, false);
        let alone = self.counted_alone();
        let worth = mark::worth_a_stamp(copy.dst_kind, Some(copy.src_kind), copy.len);
        let stamp = mark::stamps(self.cfg.wait, marking, (true, alone, worth), true);
        let lazy = marking == mark::Marking::Lazy;
        let c = CudaCompletion::new(
            completion::event::Marked::Held(Arc::clone(queue), !lazy),
            Arc::clone(home),
            (self.cfg.wait, expect),
            Vec::new(),
        );
        // SAFETY: valid until the request completes, on this device or page-locked host
        // memory (this function's contract).
        unsafe { queue.push_held(copy, &c, (lazy, stamp)) };
        self.track(lane, Request::from_shared(c))
    }

    /// Issues every lane's held copies (the engine's drop: nothing stays held once it is gone).
    pub(super) fn issue_held(&self) {
        for q in self.lanes.queues() {
            q.release_held();
        }
    }

    /// Calls of the driver's batched copy that held copies took (one-run copies enqueued with
    /// [`Engine::enqueue`] until a flush, several at a time, where the gather kernel did not
    /// take them), and batches of them the driver
    /// refused (each copied one call per copy instead, the copies correct) with its first
    /// refusal: a shape the driver does not batch.
    pub fn flush_batches(&self) -> (usize, usize, Option<crate::engine::cuda::DriverError>) {
        self.lanes.queues().fold((0, 0, None), |(b, r, e), q| {
            let (qb, qr, qe) = q.batch_stats();
            (b + qb, r + qr, e.or(qe))
        })
    }

    /// Enqueue of a prepared program (its buffers' kinds refined, supported): routed, its
    /// dependencies made stream waits, run on the route's paths.
    ///
    /// # Safety
    /// As [`CudaEngine::submit`]; `prog` was checked against the buffers.
    unsafe fn enqueue_program(
        &self,
        s: &Submission<'_>,
        (dst, src): (RawBuf, Option<RawBuf>),
        prog: crate::op::Program,
        lane: usize,
    ) -> Result<Request, SubmitError> {
        let (dk, sk) = (dst.kind, src.map(|b| b.kind));
        let steps = prog.steps();
        let route = self.rules().route(dk, sk, steps);
        if let (Some(c), false) = (s.caller, route.first() == Path::Driver) {
            // The caller's stream cannot run this route: this enqueue runs it on the engine's
            // stream, after an event recorded on the caller's and before the caller's next
            // work ([`CudaEngine::around_stream`]).
            // SAFETY: the caller's stream is live (2); the enqueue is forwarded (1).
            return unsafe {
                self.around_stream(c, s.after, |after| {
                    let engines = Submission {
                        after,
                        caller: None,
                        ..*s
                    };
                    self.enqueue_program(&engines, (dst, src), prog, lane)
                })
            };
        }
        let queue = self.lanes.queue(lane, route.stream);
        if let Path::Staged(dir) = route.first() {
            let req = self.stage((dst, src), s.after, queue, dir, prog.into_steps())?;
            return Ok(self.track(lane, req));
        }
        let bytes = steps.iter().map(crate::op::Step::bytes).sum();
        let expect = self.expect(bytes, dk, sk);
        // Dependencies: CUDA requests become stream waits; others are waited here. Marked
        // before this queue is locked: marking a lazy request takes its own queue's lock.
        let mut events = Vec::new();
        for dep in s.after {
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
        let dst_end = self.end(dst.addr, dk)?;
        let src_end = match src {
            Some(b) => Some(self.end(b.addr, b.kind)?),
            None => None,
        };
        let on = Launch {
            lane,
            queue,
            caller: s.caller,
            events,
            expect,
            worth: completion::mark::worth_a_stamp(dk, sk, bytes),
            more: s.more,
        };
        // SAFETY: context current (bound above); the caller's stream, when given, a live
        // stream of this context (2); the buffers are valid until the request completes (1);
        // the steps were checked against the buffers by the program.
        unsafe {
            self.launch(on, |stream, keep| match s.caller {
                Some(c) => self.run_steps(c, steps, dst_end, src_end, keep),
                None => self.run_route(&route, steps, (dst_end, src_end), stream, keep),
            })
        }
    }

    /// Ends the deferral of the requests the calling thread enqueued with more work said to
    /// follow ([`Engine::flush`]): the next submission on each of its lane's streams marks the
    /// batch's last request's end exactly again. Their work is on the streams already (the
    /// driver starts enqueued work itself).
    pub(super) fn flush_lane(&self) {
        for q in self.lanes.queues_of(self.lanes.mine()) {
            q.flush();
        }
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
            more,
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
                    // No stamp where more work follows: its write would delay that work, and
                    // the caller does not wait next.
                    Some(_) if more => None,
                    // SAFETY: the context is current (this function's contract).
                    Some(h) => unsafe { h.stamp(self.cfg.wait, marking, (alone, worth)) },
                    None => None,
                };
                completion::event::Marked::Lazy(Arc::clone(queue), stamp)
            }
        };
        let c = CudaCompletion::new(marked, Arc::clone(home), (self.cfg.wait, expect), keep);
        if let (Some(h), completion::mark::Marking::Lazy) = (hold, marking) {
            // A deferred request the policy would have stamped alone is stamped at its flush.
            let wish = completion::mark::stamps(self.cfg.wait, marking, (true, alone, worth), true);
            h.push_lazy(&c, more, wish);
        }
        Ok(self.track(lane, Request::from_shared(c)))
    }
}

/// Prepare's lowering of a submission, once: a copy checked by [`crate::op::checked_run`] (one
/// contiguous run: nothing built; else its plan, not checked again), a block copy's mapping
/// checked (its segment list not built yet), another built-in operator's program built into
/// `prog`, a custom operator's program built with its errors and panics caught (they fail the
/// request only).
#[inline(always)]
fn lower<'a>(
    s: &Submission<'a>,
    prog: &mut crate::op::Program,
) -> Result<Lowered<'a>, SubmitError> {
    let copy = match (s.what, s.src) {
        (What::Copy(dl, sl), Some(src)) => Some((dl, sl, src)),
        (What::Op(crate::op::Op::Copy { dst: dl, src: sl }), Some(src)) => Some((dl, sl, src)),
        _ => None,
    };
    if let Some((dl, sl, src)) = copy {
        return match crate::op::checked_run(dl, sl, s.dst.len, src.len)? {
            Some(run) => Ok(Lowered::Run(run)),
            None => {
                prog.push_general(dl, sl)?;
                Ok(Lowered::Program)
            }
        };
    }
    match s.what {
        What::Op(op @ crate::op::Op::Blocks { .. }) => {
            let src = s.src.ok_or(crate::op::OpError::NoSource)?;
            // An empty mapping: no step.
            if let Some(list) = op.checked_blocks(s.dst.len, src.len)? {
                return Ok(Lowered::Blocks(list));
            }
        }
        What::Op(op) if op.is_builtin() => op.lower_into(prog)?,
        What::Op(op) => match op.lower_catching(s.dst.len, s.src.map(|b| b.len)) {
            Ok(p) => *prog = p,
            Err(e) => return Ok(Lowered::Failed(e)),
        },
        // A copy without a source: the program says so.
        What::Copy(dl, sl) => prog.copy(dl, sl)?,
    }
    Ok(Lowered::Program)
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
    /// The caller said more work follows ([`Submission::more`]).
    more: bool,
}

/// The completion of a request with no step but dependencies: done when they all are, failed
/// ([`RequestError::Dependency`]) when one failed (their own results stay theirs to report).
struct AfterAll(Vec<Request>);

impl crate::request::Completion for AfterAll {
    fn wait(&self) -> Result<(), RequestError> {
        for d in &self.0 {
            d.completion()
                .wait()
                .map_err(|e| RequestError::Dependency(Box::new(e)))?;
        }
        Ok(())
    }
    fn poll_done(&self) -> Option<Result<(), RequestError>> {
        for d in &self.0 {
            if let Err(e) = d.completion().poll_done()? {
                return Some(Err(RequestError::Dependency(Box::new(e))));
            }
        }
        Some(Ok(()))
    }
    fn register_waker(&self, waker: &std::task::Waker) {
        match self.0.iter().find(|d| d.completion().poll_done().is_none()) {
            Some(d) => d.completion().register_waker(waker),
            None => waker.wake_by_ref(),
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
