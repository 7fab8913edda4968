//! Where a request's end is marked on the GPU, and what its wait waits on: the one place that
//! decides whether a request records a completion event (`cuEventRecord`) when it is
//! submitted, later, or never.
//!
//! Why: a raw program waits for a small copy with `cuMemcpyAsync` + `cuStreamSynchronize`
//! (two driver calls); ferry recorded an event after every request and waited on it (three:
//! `cuEventRecord` costs about 0.9 us after a 64 KiB copy on the H200, 9.8 against 8.9 us per
//! call in `cuda-latency-parts`), so the caller's view of 64 KiB-1 MiB pinned copies stayed at
//! 0.93-0.98x raw (issue 14, runs 32-33). An event is needed only to mark the request's end
//! once other work follows it on its stream, or to let another stream wait for it; while the
//! request is the last work on its stream, the stream itself marks its end.
//!
//! The rule ([`marking`]): a request submitted on one of the engine's own streams ([`Queue`])
//! in the [`WaitMode::Auto`] or [`WaitMode::Spin`] mode, on a stream nothing but the engine's
//! own submissions uses, is *lazy*: it records no event at submit and becomes its queue's
//! *last*. Its event is recorded later, only if something needs it while it is still pending
//! and still the last work on its stream:
//! - the next submission on the same stream (any route, from any thread of the lane, a staged
//!   copy's DMAs included) records it first, before its own work ([`Queue::enqueue`]), so the
//!   event marks exactly the request's end;
//! - a dependency of a request on another stream or engine, a stream wait by the caller
//!   (`CudaEngine::stream_wait`), a future's waker ([`Queue::mark_last`]).
//!
//! A lazy request without an event waits on its stream ([`wait_on`]): `cuStreamQuery` where
//! the wait polls, `cuStreamSynchronize` where it spins in the driver, with
//! [`WaitMode`]'s schedule unchanged. Both are exact while the request is the stream's last
//! work, and never early: work enqueued after it later only makes them return later (another
//! thread of the same lane may enqueue while a wait is in the driver; the wait then also waits
//! for that work, as a raw `cuStreamSynchronize` would). The queue remembers how far such a
//! wait reached ([`Queue::passed`]: each lazy request gets a position once its work is on the
//! stream), so the other requests it passed ask the driver nothing: a batch waited under
//! `Spin` synchronizes its stream once, not once per request. A request waited (or polled done)
//! before anything followed it never records an event: a small copy submitted and waited costs
//! the copy and `cuStreamSynchronize`, the raw pair's two calls, where it cost three (the tests
//! below count them).
//!
//! Stamped ([`stamps`], `stamp.rs`): a lazy request of the [`WaitMode::Auto`] wait submitted
//! while its queue had nothing pending (its last lazy request known done, or none), by a
//! thread that made the engine's last few submissions (`Lanes::alone`), also has the stream
//! write its number into the queue's completion word after its work; its waits and polls read
//! that word (asking the driver only now and then, for errors), which sees the end sooner than
//! `cuStreamSynchronize` does. A request submitted behind pending work gets none (the word's
//! write would delay the work queued after it), nor one submitted while other threads submit
//! (the write's memory barrier holds up their streams' copies as well).
//!
//! "Idle" is the queue's best guess (no lazy request of its pending); a stamp only ever
//! follows the request's own work, so a wrong guess costs the stream the write, never a wrong
//! answer. A stream handed to the caller (below) gets no more stamps, as it gets no more lazy
//! requests.
//!
//! Held (`Engine::enqueue`, [`Queue::push_held`]): a one-run copy between this GPU's memory
//! and page-locked host memory, enqueued with more work said to follow, is not given to the
//! driver at submit. It waits in its queue with the other such copies of the stream until
//! something needs them: the submitter's flush, a wait, poll, future or dependent of one of
//! them, any other submission on the stream (stream order), or a full batch
//! (`BATCH_MAX_COPIES`). They then go to the GPU at once as one list, by the queue's [`Issue`]
//! (`paths/mod.rs`'s `HeldIssue`: the gather kernel where the engine's segment-list rule picks
//! it, else one batched copy where there are several and the driver has one), and their
//! ends are marked together: lazy ones share one stamp where the issue came from a flush, a
//! wait (a thread waits next) or a full batch, and the policy would have stamped one of them,
//! the last one becomes the queue's last; eager ones record their events after the batch. A
//! copy the driver took no call for completes with the driver's error. Bookkeeping polls
//! (`Completion::poll_quiet`, the in-flight list's pruning) leave them held.
//!
//! A flush of a batch whose last request was already on the stream (a program, or pageable
//! memory: not held) gives that request a stamp then, where it would have had one alone
//! ([`Queue::flush`]): its wait reads the word rather than synchronizing the stream.
//!
//! Eager (an event at submit, as before): [`WaitMode::Blocking`] and
//! [`WaitMode::SpinThenBlock`] (their sleep in the driver is a `BLOCKING_SYNC` event's); a
//! copy on the caller's stream (`CudaEngine::on_stream`: work the engine does not see follows
//! it); a stream the caller has been handed (`CudaEngine::stream`: from then on, for good) or
//! that a staged copy is using (its DMAs are enqueued later by the staging thread).

use super::stamp::Stamp;
use crate::engine::cuda::route::BATCH_MAX_COPIES;
use crate::engine::cuda::sys::driver;
use crate::engine::cuda::CompletionPolicy;
use crate::engine::cuda::DriverError;
use crate::engine::cuda::WaitMode;
use crate::request::{hold_wakes, HoldWakes};
use crate::MemKind;
use cudarc::driver::{sys, CudaStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

/// How a request marks its end on its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marking {
    /// An event recorded after its work at submit.
    Event,
    /// No event at submit: recorded later, only if needed while it is its stream's last work
    /// ([module doc](self)).
    Lazy,
}

/// The marking of a request waited in `mode` under `policy`, submitted on the caller's stream
/// or not (`caller_stream`), on an engine stream that work outside the engine's submissions may
/// follow (`shared`: handed to the caller, or in use by a staged copy). The plain policy marks
/// every request with an event at submit.
pub(crate) fn marking(
    mode: WaitMode,
    policy: CompletionPolicy,
    caller_stream: bool,
    shared: bool,
) -> Marking {
    if policy == CompletionPolicy::Plain {
        return Marking::Event;
    }
    match mode {
        WaitMode::Blocking | WaitMode::SpinThenBlock(_) => Marking::Event,
        _ if caller_stream || shared => Marking::Event,
        WaitMode::Auto | WaitMode::Spin => Marking::Lazy,
    }
}

/// What a request's wait and query call on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitOn {
    /// Its event (`cuEventQuery`, `cuEventSynchronize`).
    Event,
    /// Its stream (`cuStreamQuery`, `cuStreamSynchronize`): a lazy request with no event yet.
    Stream,
}

/// What a request with an event (`has_event`) or without waits on.
pub(crate) fn wait_on(has_event: bool) -> WaitOn {
    if has_event {
        WaitOn::Event
    } else {
        WaitOn::Stream
    }
}

/// Whether a submission records the event of its queue's last lazy request first: only if
/// that request has none yet and is not known to have completed (then nothing ever needs one).
pub(crate) fn seals(last_has_event: bool, last_known_done: bool) -> bool {
    !last_has_event && !last_known_done
}

/// Whether a request waited in `mode` and marked `marking` gets a stamp ([`super::stamp`]):
/// a lazy one waited by [`WaitMode::Auto`] (`Spin` asks for the driver's spin), on a queue
/// that was `idle` when it was submitted (a thread likely waits for it next; with work queued
/// behind it the stamp's write would delay that work), submitted by a thread `alone` on the
/// engine (the write's memory barrier holds up the copy engine's work of other streams too),
/// `worth` one ([`worth_a_stamp`]), whose stream has a completion word.
pub(crate) fn stamps(
    mode: WaitMode,
    marking: Marking,
    (idle, alone, worth): (bool, bool, bool),
    has_word: bool,
) -> bool {
    mode == WaitMode::Auto && marking == Marking::Lazy && idle && alone && worth && has_word
}

/// Host-to-device copies of fewer bytes get no stamp: the driver ends them sooner than the
/// stamp's fenced write does (run 93: stamped and waited on the word, a 4 B upload took 0.91 us
/// longer than `cuStreamSynchronize`, 64 B 0.39 us longer, 1 KiB 0.70 us and 4 KiB 0.76 us
/// shorter; downloads and device copies 0.46-0.95 us shorter from 4 B up).
pub(crate) const STAMP_UPLOAD_MIN: usize = 1024;

/// Whether a request moving `bytes` into `dst` from `src` (`None`: a fill) is worth a stamp
/// ([`stamps`]): all but host-to-device copies under [`STAMP_UPLOAD_MIN`].
pub(crate) fn worth_a_stamp(dst: MemKind, src: Option<MemKind>, bytes: usize) -> bool {
    let upload = matches!(dst, MemKind::Device { .. })
        && matches!(
            src,
            Some(MemKind::Pinned | MemKind::Pageable | MemKind::Mapped)
        );
    !upload || bytes >= STAMP_UPLOAD_MIN
}

/// One of the engine's streams with its lazy bookkeeping: the last lazy request submitted on
/// it, and whether work outside the engine's submissions may follow (then every request
/// records its event at submit).
pub(crate) struct Queue {
    stream: Arc<CudaStream>,
    /// The last lazy request.
    tail: Mutex<Tail>,
    /// The stream's completion word, where it could be made ([`stamps`]).
    stamp: Option<Stamp>,
    /// The last stamp number handed out (0: none yet), of which the word holds the low 32
    /// bits: written under `tail`'s lock, read without it by [`Queue::stamp_seen`].
    issued: AtomicU64,
    /// A write of the word failed once: no more stamps on this queue (the driver would refuse
    /// each one again).
    stamp_off: AtomicBool,
    /// The last position handed to a lazy request once its work was on the stream
    /// ([`Lazy::placed`]; 0: none yet): written under `tail`'s lock, after the enqueue.
    placed: AtomicU64,
    /// The highest position a successful `cuStreamSynchronize` or `cuStreamQuery` of the
    /// stream covered ([`Queue::passed`]): every lazy request placed up to it is done, so its
    /// wait asks the driver nothing (under `Spin` a batch's requests each synchronized the
    /// stream, though the first sync had passed them all).
    passed: AtomicU64,
    /// The stream was handed to the caller (`CudaEngine::stream`).
    exposed: AtomicBool,
    /// Staged copies using the stream now ([`Foreign`]).
    foreign: AtomicUsize,
    /// How held copies go to the GPU.
    issue: Arc<dyn Issue>,
    /// Calls of the batched copy taken for held copies.
    batches: AtomicUsize,
    /// Batches of held copies the driver refused, and its first refusal.
    refused: Mutex<(usize, Option<DriverError>)>,
}

/// A lazy request as its queue sees it (implemented by the request's shared state in
/// `event.rs`, which sits above this file): its event recorded on demand, and whether it is
/// known done.
pub(crate) trait Lazy: Send + Sync {
    /// Records the request's event on `stream` (its queue's, nothing enqueued after it since
    /// its submit: the caller holds the queue's lock) unless it has one or is known done
    /// ([`seals`]).
    fn seal(&self, stream: sys::CUstream) -> Result<(), DriverError>;
    /// Whether its result is known without asking the driver.
    fn known_done(&self) -> bool;
    /// Its held copy ([`Queue::push_held`]) was enqueued on `stream` (its queue's, the caller
    /// holding the queue's lock), with the batch's stamp if it got one (`Ok`), or the driver
    /// took no call for it (`Err`: its result). Marks its end as its marking says: an eager
    /// request records its event now.
    fn issued(&self, stream: sys::CUstream, outcome: Result<Option<u64>, DriverError>);
    /// A stamp written after it at its batch's flush ([`Queue::flush`]): its waits read the
    /// word from now on.
    fn stamp_late(&self, seq: u64);
    /// Its work is on the stream, at position `pos` of the queue's lazy requests (the caller
    /// holds the queue's lock): a stream wait that passed `pos` ([`Queue::passed`]) ended it.
    fn placed(&self, pos: u64);
}

/// One copy of a batched copy (`paths/batch.rs`): a one-run copy held on its queue until its
/// batch is issued ([`Queue::push_held`]), or a gatherer's segment: `len` bytes (above 0) from
/// `src` (memory of kind `src_kind`) to `dst` (of kind `dst_kind`), both on the queue's device
/// or in page-locked host memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchCopy {
    pub dst: u64,
    pub src: u64,
    pub len: usize,
    pub dst_kind: MemKind,
    pub src_kind: MemKind,
}

/// What an [`Issue`] did.
#[derive(Debug, Default)]
pub(crate) struct Issued {
    /// The copies enqueued, from the first: every one, or those before the failure.
    pub enqueued: usize,
    /// Why the others were not: the driver's error.
    pub error: Option<DriverError>,
    /// Calls of the driver's batched copy taken.
    pub batches: usize,
    /// Batches the driver refused (copied one call per copy instead), and its first refusal.
    pub refused: usize,
    pub refusal: Option<DriverError>,
}

/// How a queue's held copies go to the GPU, in the order held (`paths/mod.rs`'s `HeldIssue`,
/// given by the queue's maker: the mechanisms sit above this layer).
pub(crate) trait Issue: Send + Sync {
    /// Enqueues `copies` on `stream`: every one, or those before a failure ([`Issued`]).
    ///
    /// # Safety
    /// Every copy's ranges are valid until the stream passes them, device memory of the
    /// stream's device, page-locked or managed memory, no destination overlapping another or a
    /// source, every length above 0; the stream is live, of the current context, not the
    /// legacy one.
    unsafe fn issue(&self, stream: &Arc<CudaStream>, copies: &[BatchCopy]) -> Issued;
}

/// A held copy with its request.
struct Held {
    copy: BatchCopy,
    req: Weak<dyn Lazy>,
    /// Marked lazily (else an event after the batch).
    lazy: bool,
    /// The policy would stamp it alone ([`stamps`] on an idle queue).
    stamp: bool,
}

/// What issues a queue's held copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// The submitter's flush: the batch is complete, its end stamped where wished.
    Flush,
    /// A wait, poll, future or dependent of one of them: a thread waits next (a stamp).
    Wait,
    /// Another submission on the stream (stream order): work follows, no stamp.
    Interrupt,
    /// [`BATCH_MAX_COPIES`] held: more follow, but a stamp where wished all the same (one
    /// write per 4,096 copies): without it each of the batch's requests was waited with a
    /// `cuStreamQuery` (on the H100 host 4,096 held 4 KiB copies took 8.9 ms against the
    /// batched copy's 1.8).
    Full,
}

/// What a [`Queue`]'s lock guards.
#[derive(Default)]
pub(crate) struct Tail {
    /// The last lazy request, while it has no event (a dropped request waited for itself).
    last: Option<Weak<dyn Lazy>>,
    /// The last lazy request was enqueued with more work said to follow
    /// (`Engine::enqueue`), and no [`Queue::flush`] came since: the next submission does not
    /// record its event first. A batch so marks its end once, not once per request; a request
    /// of it waited meanwhile waits on its stream (later than its own end, never earlier), and
    /// one that a dependent needs records its event then, at the stream's end
    /// ([`Queue::mark_last`]).
    deferred: bool,
    /// `last` was deferred where the policy would have stamped it alone: its flush stamps it.
    last_stamp: bool,
    /// Copies held for the next batch, in the order enqueued ([`Queue::push_held`]).
    held: Vec<Held>,
    /// The copies of the batch being issued, as the driver takes them. Both lists keep their
    /// room from batch to batch (at most [`BATCH_MAX_COPIES`] entries, about 400 KiB): a
    /// batch of 4,096 blocks made them anew each time, growing `held` by doubling and both
    /// past the allocator's mapping threshold, so every batch faulted their pages in again
    /// (null driver: about 100 page faults and 0.32 us a block).
    copies: Vec<BatchCopy>,
}

/// The address of a request's allocation, whatever the pointer's type (the identity the queue
/// compares).
fn addr<T: ?Sized>(p: *const T) -> *const () {
    p.cast::<()>()
}

impl Queue {
    /// A queue on `stream`, with its completion word if it could be made; its held copies go
    /// to the driver through `issue`.
    pub(crate) fn new(
        stream: Arc<CudaStream>,
        stamp: Option<Stamp>,
        issue: Arc<dyn Issue>,
    ) -> Queue {
        Queue {
            stream,
            tail: Mutex::new(Tail::default()),
            stamp,
            issued: AtomicU64::new(0),
            stamp_off: AtomicBool::new(false),
            placed: AtomicU64::new(0),
            passed: AtomicU64::new(0),
            exposed: AtomicBool::new(false),
            foreign: AtomicUsize::new(0),
            issue,
            batches: AtomicUsize::new(0),
            refused: Mutex::new((0, None)),
        }
    }

    /// Calls of the batched copy its held copies took; batches of them the driver refused (each
    /// copied one call per copy), and its first refusal.
    pub(crate) fn batch_stats(&self) -> (usize, usize, Option<DriverError>) {
        let r = *self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        (self.batches.load(Ordering::Relaxed), r.0, r.1)
    }

    /// The stream.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The raw stream handle.
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    fn lock(&self) -> MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the stream's completion word has reached `seq`: `None` where the word cannot
    /// tell (none, or 2^31 numbers or more handed out since: [`super::stamp::seen`]).
    pub(crate) fn stamp_seen(&self, seq: u64) -> Option<bool> {
        let word = self.stamp.as_ref()?.word();
        super::stamp::seen(word, seq, self.issued.load(Ordering::Acquire))
    }

    /// Whether a stream wait has passed the lazy request placed at `pos` ([`Lazy::placed`];
    /// 0: not placed, never passed).
    pub(crate) fn passed(&self, pos: u64) -> bool {
        pos != 0 && pos <= self.passed.load(Ordering::Acquire)
    }

    /// Runs `wait` (a `cuStreamSynchronize` or `cuStreamQuery` of the stream) and returns its
    /// code; where it found everything before it done (success), remembers how far it reached:
    /// every lazy request placed before it was called ([`Queue::passed`]).
    pub(crate) fn wait_stream(&self, wait: impl FnOnce() -> sys::CUresult) -> sys::CUresult {
        // Positions are stored after their work was enqueued: this one's work is before the call.
        let upto = self.placed.load(Ordering::Acquire);
        let code = wait();
        if code == sys::CUresult::CUDA_SUCCESS {
            self.passed.fetch_max(upto, Ordering::Release);
        }
        code
    }

    /// The next position, for a lazy request whose work was just enqueued (the lock held:
    /// `_tail`).
    fn place(&self, _tail: &mut Tail) -> u64 {
        let pos = self.placed.load(Ordering::Relaxed) + 1;
        self.placed.store(pos, Ordering::Release);
        pos
    }

    /// Locks the queue for one submission, after recording the last lazy request's event if it
    /// is still pending ([`seals`]). Hold it while enqueueing; take no other queue's lock
    /// meanwhile (dependencies are marked before). Looking at the last request may find it
    /// done and complete it: its futures' wakers run once the hold is released.
    /// A request enqueued with more work said to follow is left unsealed ([`Tail::deferred`]).
    pub(crate) fn enqueue(&self) -> Enqueue<'_> {
        self.hold(false)
    }

    /// [`Queue::enqueue`]; `seal_deferred`: the last lazy request records its event even if
    /// its submitter said more work follows (work outside the engine's submissions follows).
    fn hold(&self, seal_deferred: bool) -> Enqueue<'_> {
        let wakes = hold_wakes();
        let mut tail = self.lock();
        // Held copies were enqueued before: they go first (stream order).
        self.issue_held(&mut tail, Why::Interrupt);
        let prev = tail.last.take().and_then(|w| w.upgrade());
        let deferred = std::mem::take(&mut tail.deferred) && !seal_deferred;
        let idle = match &prev {
            Some(p) if deferred => p.known_done(),
            Some(p) => {
                // A failed record leaves `prev` without an event: its wait then waits on the
                // stream (later, never early), its dependents on the host.
                let _ = p.seal(self.raw());
                p.known_done()
            }
            None => true,
        };
        Enqueue {
            q: self,
            tail,
            idle,
            _prev: prev,
            _wakes: wakes,
        }
    }

    /// Hands the stream to the caller: every later request on it records its event at submit,
    /// and the last lazy one records its own now (the caller's work may follow it).
    pub(crate) fn expose(&self) {
        let _g = self.hold(true);
        self.exposed.store(true, Ordering::Release);
    }

    /// A staged copy will enqueue DMAs on the stream from its staging thread until the
    /// returned guard drops: the last lazy request records its event now, and requests
    /// submitted meanwhile record theirs at submit.
    pub(crate) fn foreign(self: &Arc<Self>) -> Foreign {
        let _g = self.hold(true);
        self.foreign.fetch_add(1, Ordering::AcqRel);
        Foreign(Arc::clone(self))
    }

    /// Records `request`'s event now if it is this queue's last lazy request (nothing
    /// enqueued after it): `Ok(false)` if it is not (a later submission recorded it, or it
    /// completed before anything followed it, or, enqueued in a batch that a later submission
    /// did not seal ([`Tail::deferred`]), it records its event now at the stream's end: later
    /// than its own end, never earlier). Finding it done completes it: its futures' wakers run
    /// after the queue's lock is released.
    pub(crate) fn mark_last<L: Lazy>(&self, request: &L) -> Result<bool, DriverError> {
        let _wakes = hold_wakes();
        let mut tail = self.lock();
        let me = addr(request as *const L);
        if tail.last.as_ref().is_none_or(|w| addr(w.as_ptr()) != me) {
            // Recorded only where it has no event and is not known done (`seals`).
            return request.seal(self.raw()).map(|()| false);
        }
        tail.last = None;
        tail.deferred = false;
        request.seal(self.raw()).map(|()| true)
    }

    /// `Engine::flush`: issues the held copies ([`Queue::push_held`]) as one batch, their end
    /// stamped where the policy would have stamped one of them alone; where none is held, ends
    /// the deferral of the last lazy request ([`Tail::deferred`]): the next submission records
    /// its event first again, as for any request, and it gets the stamp it would have had
    /// alone (written now, after the stream's work: nothing of the batch follows it).
    pub(crate) fn flush(&self) {
        let _wakes = hold_wakes();
        let mut tail = self.lock();
        if !tail.held.is_empty() {
            return self.issue_held(&mut tail, Why::Flush);
        }
        let stamp = std::mem::take(&mut tail.deferred) && std::mem::take(&mut tail.last_stamp);
        let last = tail.last.as_ref().and_then(Weak::upgrade);
        if let Some(last) = last.filter(|l| stamp && !l.known_done()) {
            if driver::set_current(self.stream.context()).is_ok() {
                // SAFETY: the lock is held; the queue's context made current above.
                if let Some(seq) = unsafe { self.write_stamp() } {
                    last.stamp_late(seq);
                }
            }
        }
    }

    /// A request's wait, poll, future or dependent needs its held copy: issues the held copies
    /// (if another thread has not already), their ends stamped where wished.
    pub(crate) fn release_held(&self) {
        let _wakes = hold_wakes();
        let mut tail = self.lock();
        self.issue_held(&mut tail, Why::Wait);
    }

    /// Holds `copy` for the queue's next batch ([module doc](self)), `request` (just made, of
    /// its copy alone, marked `lazy` or with an event after the batch; `stamp`: the policy
    /// would stamp it alone) completing when the batch is issued. A full batch is issued at
    /// once; so is one whose stream was handed out meanwhile.
    ///
    /// # Safety
    /// The copy's ranges are valid until `request` completes, and as [`Issue`] asks.
    pub(crate) unsafe fn push_held<L: Lazy + 'static>(
        &self,
        copy: BatchCopy,
        request: &Arc<L>,
        (lazy, stamp): (bool, bool),
    ) {
        let _wakes = hold_wakes();
        let mut tail = self.lock();
        let req: Weak<dyn Lazy> = Arc::downgrade(request) as Weak<dyn Lazy>;
        tail.held.push(Held {
            copy,
            req,
            lazy,
            stamp,
        });
        let shared =
            self.exposed.load(Ordering::Acquire) || self.foreign.load(Ordering::Acquire) > 0;
        if tail.held.len() >= BATCH_MAX_COPIES || shared {
            self.issue_held(&mut tail, Why::Full);
        }
    }

    /// Issues the held copies, if any (the lock held: `tail`), after sealing the previous last
    /// lazy request (unless deferred), as any submission does; marks their requests' ends
    /// ([`Lazy::issued`]): one stamp for the lazy ones where `why` allows and one of them wished
    /// it, the last lazy one the queue's last (deferred unless flushed). The copies' validity
    /// is [`Queue::push_held`]'s caller's.
    fn issue_held(&self, tail: &mut Tail, why: Why) {
        if tail.held.is_empty() {
            return;
        }
        // Taken, and given back empty with its room at the end (the lock is held throughout:
        // nothing is pushed meanwhile).
        let mut held = std::mem::take(&mut tail.held);
        let mut copies = std::mem::take(&mut tail.copies);
        let deferred = std::mem::take(&mut tail.deferred);
        tail.last_stamp = false;
        if let Some(prev) = tail.last.take().and_then(|w| w.upgrade()) {
            if !deferred {
                // A failed record: `prev` waits on the stream (later, never early).
                let _ = prev.seal(self.raw());
            }
        }
        copies.clear();
        copies.extend(held.iter().map(|h| h.copy));
        let out = match driver::set_current(self.stream.context()) {
            // SAFETY: the copies are valid until their requests complete, as `Issue` asks
            // (`push_held`'s contract); the queue's live stream, of the context made current.
            Ok(()) => unsafe { self.issue.issue(&self.stream, &copies) },
            Err(e) => Issued {
                error: Some(DriverError::from_cudarc("cuCtxSetCurrent", e)),
                ..Issued::default()
            },
        };
        self.batches.fetch_add(out.batches, Ordering::Relaxed);
        if out.refused > 0 {
            let mut r = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
            r.0 += out.refused;
            r.1 = r.1.or(out.refusal);
        }
        let done = out.enqueued.min(held.len());
        let wished = held[..done].iter().any(|h| h.lazy && h.stamp);
        let stamp = match why {
            // SAFETY: the lock is held; the context was made current above (`done` > 0).
            Why::Flush | Why::Wait | Why::Full if wished => unsafe { self.write_stamp() },
            _ => None,
        };
        let failed = out.error.unwrap_or(DriverError::new(
            "cuMemcpyBatchAsync",
            sys::CUresult::CUDA_ERROR_UNKNOWN,
        ));
        for (i, h) in held.iter().enumerate() {
            let Some(r) = h.req.upgrade() else {
                // Dropped: its drop waits on the stream.
                continue;
            };
            if i < done {
                if h.lazy {
                    r.placed(self.place(tail));
                }
                r.issued(self.raw(), Ok(stamp));
                if h.lazy {
                    tail.last = Some(Weak::clone(&h.req));
                }
            } else {
                r.issued(self.raw(), Err(failed));
            }
        }
        tail.deferred = why != Why::Flush;
        held.clear();
        tail.held = held;
        tail.copies = copies;
    }

    /// Writes the next stamp number into the completion word after the stream's work: `None`
    /// where there is no word or the write could not be enqueued (then no more stamps here).
    ///
    /// # Safety
    /// The queue's lock is held (numbers are handed out under it); its context is current.
    unsafe fn write_stamp(&self) -> Option<u64> {
        let word = self
            .stamp
            .as_ref()
            .filter(|_| !self.stamp_off.load(Ordering::Relaxed))?;
        // Numbers are handed out under the lock: only its holder writes `issued`.
        let seq = self.issued.load(Ordering::Relaxed) + 1;
        // SAFETY: the queue's live stream, in the word's context, current (this function's
        // contract).
        if unsafe { word.write(self.raw(), seq as u32) }.is_err() {
            self.stamp_off.store(true, Ordering::Relaxed);
            return None;
        }
        self.issued.store(seq, Ordering::Release);
        Some(seq)
    }
}

/// A submission's hold on its [`Queue`].
pub(crate) struct Enqueue<'a> {
    q: &'a Queue,
    tail: MutexGuard<'a, Tail>,
    /// Nothing the queue knew of was pending when it was locked: its last lazy request was
    /// known done, or there was none ([`stamps`]).
    idle: bool,
    /// The previous last request, released after the submission (the guard's drop), so that
    /// freeing it is not on the host's path to the next copy.
    _prev: Option<Arc<dyn Lazy>>,
    /// Wakers of requests completed under the lock (the previous last one, found done), run
    /// when this drops: after `tail` (fields drop in order), so never under the queue's lock.
    _wakes: HoldWakes,
}

impl Enqueue<'_> {
    /// Whether work outside the engine's submissions may follow on this stream.
    pub(crate) fn shared(&self) -> bool {
        self.q.exposed.load(Ordering::Acquire) || self.q.foreign.load(Ordering::Acquire) > 0
    }

    /// Makes the lazy request `request` (just enqueued) the queue's last; `more`: its
    /// submitter said more work follows (the next submission leaves it unsealed until a
    /// [`Queue::flush`]: [`Tail::deferred`]); `stamp`: the policy would have stamped it alone
    /// (its flush then does).
    pub(crate) fn push_lazy<L: Lazy + 'static>(
        mut self,
        request: &Arc<L>,
        more: bool,
        stamp: bool,
    ) {
        request.placed(self.q.place(&mut self.tail));
        let last: Weak<L> = Arc::downgrade(request);
        self.tail.last = Some(last);
        self.tail.deferred = more;
        self.tail.last_stamp = more && stamp;
    }

    /// The stamp of a request waited in `mode` and marked `marking`, just enqueued under this
    /// hold by a thread `alone` on the engine, `worth` one ([`stamps`]): the next number,
    /// written to the stream's completion word after its work, where [`stamps`] says so; `None`
    /// otherwise or if the write could not be enqueued.
    ///
    /// # Safety
    /// The queue's context is current on this thread.
    pub(crate) unsafe fn stamp(
        &mut self,
        mode: WaitMode,
        marking: Marking,
        (alone, worth): (bool, bool),
    ) -> Option<u64> {
        let word = self
            .q
            .stamp
            .as_ref()
            .filter(|_| !self.q.stamp_off.load(Ordering::Relaxed));
        if !stamps(mode, marking, (self.idle, alone, worth), word.is_some()) {
            return None;
        }
        // SAFETY: this hold's lock is held; the context is current (this function's contract).
        unsafe { self.q.write_stamp() }
    }
}

/// A staged copy's use of a [`Queue`] ([`Queue::foreign`]); ends when dropped.
pub(crate) struct Foreign(Arc<Queue>);

impl Drop for Foreign {
    fn drop(&mut self) {
        self.0.foreign.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cuda::completion::wait::{self, Expect, Schedule};
    use std::time::Duration;

    #[test]
    fn the_plain_policy_marks_every_request_with_an_event() {
        let hybrid = WaitMode::SpinThenBlock(Duration::from_micros(50));
        for mode in [WaitMode::Auto, WaitMode::Spin, WaitMode::Blocking, hybrid] {
            for (caller, shared) in [(false, false), (true, false), (false, true)] {
                let m = marking(mode, CompletionPolicy::Plain, caller, shared);
                assert_eq!(m, Marking::Event, "{mode:?} {caller} {shared}");
                // An eager request never gets a stamp, whatever else holds.
                assert!(!stamps(mode, m, (true, true, true), true));
            }
        }
    }

    #[test]
    fn only_the_default_and_spin_waits_on_engine_streams_are_lazy() {
        for mode in [WaitMode::Auto, WaitMode::Spin] {
            assert_eq!(
                marking(mode, CompletionPolicy::Tuned, false, false),
                Marking::Lazy
            );
            assert_eq!(
                marking(mode, CompletionPolicy::Tuned, true, false),
                Marking::Event,
                "caller's stream"
            );
            assert_eq!(
                marking(mode, CompletionPolicy::Tuned, false, true),
                Marking::Event,
                "shared stream"
            );
        }
        let hybrid = WaitMode::SpinThenBlock(Duration::from_micros(50));
        for mode in [WaitMode::Blocking, hybrid] {
            assert_eq!(
                marking(mode, CompletionPolicy::Tuned, false, false),
                Marking::Event,
                "{mode:?}"
            );
        }
        assert_eq!(wait_on(true), WaitOn::Event);
        assert_eq!(wait_on(false), WaitOn::Stream);
        assert!(seals(false, false));
        assert!(!seals(true, false), "already recorded");
        assert!(!seals(false, true), "completed: nothing needs an event");
    }

    /// The driver calls of a run of copies of `bytes` on one engine stream in `mode`
    /// (`waited[i]`: copy `i` is waited before copy `i + 1` is submitted; every copy is waited
    /// in the end), as the engine makes them: the decisions above composed in the order
    /// `submit_on` and `event::Inner`'s waits take them (the copy itself, then the marking's
    /// record or the stamp's write; a wait on the stamp's word (no call), or by
    /// [`wait::schedule`] on what [`wait_on`] says).
    fn calls(mode: WaitMode, bytes: usize, waited: &[bool]) -> Vec<&'static str> {
        let link = Some(58.9e9);
        let mut out = Vec::new();
        // Per copy: has an event, known done, stamped.
        let mut reqs: Vec<(bool, bool, bool)> = Vec::new();
        let wait = |out: &mut Vec<&'static str>, r: &mut (bool, bool, bool)| {
            if r.1 {
                return;
            }
            r.1 = true;
            if r.2 {
                // The word is read from host memory.
                return;
            }
            let spin = matches!(
                wait::schedule(Expect::now(wait::expected(bytes, link))),
                Schedule::DriverSpin
            ) || mode != WaitMode::Auto;
            out.push(match (wait_on(r.0), spin) {
                (WaitOn::Event, true) => "cuEventSynchronize",
                (WaitOn::Event, false) => "cuEventQuery",
                (WaitOn::Stream, true) => "cuStreamSynchronize",
                (WaitOn::Stream, false) => "cuStreamQuery",
            });
        };
        for (i, &w) in waited.iter().enumerate() {
            let mut idle = true;
            if let Some(last) = reqs.last_mut() {
                if seals(last.0, last.1) {
                    out.push("cuEventRecord");
                    last.0 = true;
                }
                idle = last.1;
            }
            out.push("cuMemcpyHtoDAsync");
            let m = marking(mode, CompletionPolicy::Tuned, false, false);
            let ev = m == Marking::Event;
            if ev {
                out.push("cuEventRecord");
            }
            let stamped = stamps(mode, m, (idle, true, true), true);
            if stamped {
                out.push("cuStreamWriteValue32");
            }
            reqs.push((ev, false, stamped));
            if w {
                wait(&mut out, &mut reqs[i]);
            }
        }
        for r in &mut reqs {
            wait(&mut out, r);
        }
        out
    }

    #[test]
    fn a_small_copy_waited_costs_two_driver_calls() {
        // 64 KiB, submitted and waited: the copy and its stamp's write, the wait a read of
        // host memory (the raw pair: `cuMemcpyAsync` + `cuStreamSynchronize`).
        let k64 = 64 << 10;
        assert_eq!(
            calls(WaitMode::Auto, k64, &[true]),
            ["cuMemcpyHtoDAsync", "cuStreamWriteValue32"]
        );
        // Spin asks for the driver's spin: no stamp.
        assert_eq!(
            calls(WaitMode::Spin, k64, &[true]),
            ["cuMemcpyHtoDAsync", "cuStreamSynchronize"]
        );
        for mode in [WaitMode::Auto, WaitMode::Spin] {
            // Ten in a row, each waited: two calls per copy (three before: a record each).
            assert_eq!(calls(mode, k64, &[true; 10]).len(), 20, "{mode:?}");
        }
        // Blocking keeps its event (three calls per copy, as every mode before).
        assert_eq!(
            calls(WaitMode::Blocking, k64, &[true]),
            ["cuMemcpyHtoDAsync", "cuEventRecord", "cuEventSynchronize"]
        );
        // A 16 MiB copy polls (Auto): its word.
        assert_eq!(
            calls(WaitMode::Auto, 16 << 20, &[true]),
            ["cuMemcpyHtoDAsync", "cuStreamWriteValue32"]
        );
    }

    #[test]
    fn a_copy_followed_before_its_wait_records_its_event_then() {
        // Two copies submitted back to back, then both waited: the first (on an idle stream)
        // is stamped, and its event is recorded by the second's submit, before its copy; the
        // second (behind pending work: no stamp) waits on the stream.
        assert_eq!(
            calls(WaitMode::Auto, 64 << 10, &[false, false]),
            [
                "cuMemcpyHtoDAsync",
                "cuStreamWriteValue32",
                "cuEventRecord",
                "cuMemcpyHtoDAsync",
                "cuStreamSynchronize"
            ]
        );
        // In Spin: no stamps, the first waits on its event.
        assert_eq!(
            calls(WaitMode::Spin, 64 << 10, &[false, false]),
            [
                "cuMemcpyHtoDAsync",
                "cuEventRecord",
                "cuMemcpyHtoDAsync",
                "cuEventSynchronize",
                "cuStreamSynchronize"
            ]
        );
    }

    #[test]
    fn uploads_under_a_kib_are_not_worth_a_stamp() {
        let dev = MemKind::Device { ordinal: 0 };
        for host in [MemKind::Pinned, MemKind::Pageable, MemKind::Mapped] {
            assert!(!worth_a_stamp(dev, Some(host), 4), "{host:?}");
            assert!(!worth_a_stamp(dev, Some(host), STAMP_UPLOAD_MIN - 1));
            assert!(worth_a_stamp(dev, Some(host), STAMP_UPLOAD_MIN));
            assert!(worth_a_stamp(host, Some(dev), 4), "downloads: from 4 B up");
        }
        assert!(worth_a_stamp(dev, Some(dev), 4), "device copies too");
        assert!(worth_a_stamp(dev, None, 4), "fills");
    }

    #[test]
    fn only_default_waits_of_a_lone_thread_on_idle_streams_are_stamped() {
        let auto = WaitMode::Auto;
        let yes = (true, true, true);
        assert!(stamps(auto, Marking::Lazy, yes, true));
        for (why, cond) in [
            ("work queued", (false, true, true)),
            ("other threads", (true, false, true)),
            ("a tiny upload", (true, true, false)),
        ] {
            assert!(!stamps(auto, Marking::Lazy, cond, true), "{why}");
        }
        assert!(!stamps(auto, Marking::Lazy, yes, false), "no word");
        assert!(!stamps(auto, Marking::Event, yes, true), "has an event");
        for mode in [
            WaitMode::Spin,
            WaitMode::Blocking,
            WaitMode::SpinThenBlock(Duration::from_micros(50)),
        ] {
            assert!(!stamps(mode, Marking::Lazy, yes, true), "{mode:?}");
        }
    }
}
