//! A request's completion: its event (recorded at submit, later or never: [`super::mark`]
//! decides) or, while it has none, its stream; its result slot and wakers. Waiting on a request
//! with an event waits on that event only, never on the rest of its stream.

use super::mark::{self, Lazy, Queue, WaitOn};
use super::wait::{self, Expect};
use crate::engine::cuda::sys::driver::{self, check};
use crate::engine::cuda::sys::memory::DeviceBuffer;
use crate::engine::cuda::DriverError;
use crate::engine::cuda::WaitMode;
use crate::request::{self, Completion, RequestError, Slot};
use cudarc::driver::{sys, CudaContext};
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::task::Waker;

/// A stamped request's spin on its completion word ([`Inner::spin_stamp`]) lasts at most this
/// long before it waits in the driver: far past the requests that spin (expected under
/// [`wait::SPIN_ONLY_BELOW`]), short enough that a failed stream is reported soon.
const STAMP_SPIN_MAX: std::time::Duration = std::time::Duration::from_micros(200);
/// A stamped request's polling asks the driver (for errors) once per this many polls of the
/// word.
const STAMP_ASK_EVERY: u32 = 16;

/// An owned CUDA event handle.
pub(crate) struct Event {
    raw: sys::CUevent,
}

// SAFETY: event handles may be used from any thread.
unsafe impl Send for Event {}
// SAFETY: as above; the driver synchronises concurrent use of one event.
unsafe impl Sync for Event {}

impl Event {
    /// A timing-free event; with `BLOCKING_SYNC` where the mode sleeps in the driver
    /// (`Blocking`, `SpinThenBlock`), so that a waiting thread sleeps; without it for `Spin` and
    /// `Auto` (which sleeps on its own and spins in the driver only for short requests). The
    /// context must be current.
    pub(crate) fn new(mode: WaitMode) -> Result<Event, DriverError> {
        let mut flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        if matches!(mode, WaitMode::Blocking | WaitMode::SpinThenBlock(_)) {
            flags |= sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the caller made a context current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, flags)
        })?;
        Ok(Event { raw })
    }
    pub(crate) fn raw(&self) -> sys::CUevent {
        self.raw
    }
}

/// Completed events of one engine, reused by later requests (creating an event costs a driver
/// call per request otherwise).
#[derive(Default)]
pub(crate) struct EventPool {
    free: Mutex<Vec<Event>>,
}

impl EventPool {
    const MAX: usize = 256;
    /// A free event, or a new one (the context must be current).
    pub(crate) fn take(&self, mode: WaitMode) -> Result<Event, DriverError> {
        match self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
        {
            Some(e) => Ok(e),
            None => Event::new(mode),
        }
    }
    /// Returns a completed event.
    fn give(&self, e: Event) {
        let mut f = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if f.len() < Self::MAX {
            f.push(e);
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate, destroyed once.
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}

/// What every request of one lane holds (one `Arc` per request): the lane's event pool, the
/// engine's context and its waiter thread.
pub(crate) struct Home {
    /// Completed events of the lane's requests, for its next ones.
    pub(crate) events: EventPool,
    ctx: Arc<CudaContext>,
    waker_tx: Sender<Arc<Shared>>,
}

impl Home {
    /// A lane's home on `ctx`, its requests' futures waited by the waiter thread `waker_tx`.
    pub(crate) fn new(ctx: &Arc<CudaContext>, waker_tx: &Sender<Arc<Shared>>) -> Home {
        Home {
            events: EventPool::default(),
            ctx: Arc::clone(ctx),
            waker_tx: waker_tx.clone(),
        }
    }
}

/// How a request's end is marked when it is submitted ([`mark::marking`]).
pub(crate) enum Marked {
    /// An event recorded after its work.
    Event(Event),
    /// None yet: the request is the last work of this queue's stream; its stamp, if it got
    /// one ([`Enqueue::stamp`](super::mark::Enqueue::stamp)).
    Lazy(Arc<Queue>, Option<u64>),
    /// Its copy is held on this queue until its batch is issued ([`Queue::push_held`]); then
    /// marked lazily, or (`true`: eager) by an event recorded after the batch.
    Held(Arc<Queue>, bool),
}

/// What a dependent (another stream, another engine) orders itself after.
pub(crate) enum Mark {
    /// The request's result is known: nothing to wait for (or a failure to report).
    Known(Result<(), RequestError>),
    /// The event recorded after the request's work (held by the request).
    Event(sys::CUevent),
}

/// A CUDA request's one allocation: its [`crate::Request`]'s shared part with the completion
/// inline. The queue's lazy bookkeeping ([`super::mark`]) and the waiter thread hold it too.
pub(crate) type Shared = request::Shared<CudaCompletion>;

/// The engine's part of a CUDA request.
pub(crate) struct Inner {
    /// The allocation this lives in (for the waiter thread and the queue's lazy bookkeeping).
    pub(crate) me: Weak<Shared>,
    /// Set at submit, or later for a lazy request ([`mark`]); handed back to the pool on drop.
    event: OnceLock<Event>,
    /// A lazy or held request's queue (its stream): `None` for one with an event from submit.
    lazy: Option<Arc<Queue>>,
    /// The number its queue's completion word reaches when its work is done (`stamp.rs`;
    /// numbers start at 1), 0 without one; set once, at submit or when its batch is issued or
    /// flushed. A word, not a `OnceLock`: setting one cost a held batch 4.5% of its host time
    /// (null driver, 4,096 held copies).
    stamp: AtomicU64,
    /// A lazy request's position on its queue once its work is on the stream
    /// ([`Lazy::placed`]; 0: none): a stream wait that passed it ended the request.
    pos: AtomicU64,
    /// Its copy is held on its queue, not yet given to the driver ([`Marked::Held`]): its
    /// waits, polls and dependents issue it first ([`Inner::release`]). Cleared (under the
    /// queue's lock) once it is issued.
    held: AtomicBool,
    /// Held and eager: its event is recorded when its batch is issued.
    eager: bool,
    /// Its lane's event pool, context and waiter thread.
    home: Arc<Home>,
    mode: WaitMode,
    /// When it was submitted and how long it takes at the least (for [`WaitMode::Auto`]).
    expect: Expect,
    /// The result once known, and the futures' wakers. Waiting threads block in the driver
    /// (`cuEventSynchronize`, `cuStreamSynchronize`), not on the slot, so it has no condition variable (and no futex
    /// wake-up is paid per request).
    slot: Slot,
    /// Scratch memory the request's work reads (fill patterns); freed after it completes.
    _keep: Vec<DeviceBuffer>,
}

impl Inner {
    /// A held request ([`Marked::Held`]) has its queue issue its held copies, so that what it
    /// waits on follows its copy; nothing for any other.
    fn release(&self) {
        if self.held.load(Ordering::Acquire) {
            if let Some(q) = &self.lazy {
                q.release_held();
            }
        }
    }

    /// Waits for the event (sleeping, or spinning) and records the result.
    pub(crate) fn wait_event(&self, mode: WaitMode) -> Result<(), RequestError> {
        if let Some(r) = self.known() {
            return r;
        }
        self.release();
        let r = match mode {
            // `Blocking` events carry `BLOCKING_SYNC`: the driver sleeps. `Spin` events do not:
            // the driver spins on the event's completion word itself, as `cuStreamSynchronize`
            // does in the default scheduling mode, which notices completion sooner than a loop
            // of `cuEventQuery` calls (each a trip through the driver's locks).
            WaitMode::Blocking | WaitMode::Spin => self.sync(),
            WaitMode::Auto if self.stamp_seen().is_some() => {
                // The word, read from host memory; the driver asked only every so often, for
                // errors (a failed stream never writes the word), and whenever the word can no
                // longer tell.
                let mut polls = 0u32;
                let query = || {
                    polls = polls.wrapping_add(1);
                    match (polls % STAMP_ASK_EVERY, self.stamp_seen()) {
                        (_, Some(true)) => Some(Ok(())),
                        (0, _) | (_, None) => self.query(),
                        (_, Some(false)) => None,
                    }
                };
                wait::wait(self.expect, query, || self.spin_stamp())
            }
            WaitMode::Auto => wait::wait(self.expect, || self.query(), || self.sync()),
            WaitMode::SpinThenBlock(limit) => {
                let start = std::time::Instant::now();
                loop {
                    if let Some(r) = self.query() {
                        break r;
                    }
                    if start.elapsed() >= limit {
                        break self.sync();
                    }
                    std::hint::spin_loop();
                }
            }
        };
        self.slot.complete(r)
    }

    /// Its result where known without asking the driver: in its slot, or its stamp reached
    /// (then stored, so that it never depends on the word again: the word tells only while
    /// fewer than 2^31 numbers were handed out after the request's, `stamp.rs`; the next
    /// submission on its queue asks this of it).
    /// A wait of its stream that passed it counts likewise ([`Queue::passed`]: under `Spin`
    /// the first request of a batch waited synchronizes the stream; the others ask nothing).
    pub(crate) fn known(&self) -> Option<Result<(), RequestError>> {
        match self.slot.get() {
            Some(r) => Some(r),
            None => (self.stamp_seen() == Some(true) || self.passed())
                .then(|| self.slot.complete(Ok(()))),
        }
    }

    /// Whether a wait of its queue's stream passed it ([`Queue::passed`]).
    fn passed(&self) -> bool {
        self.lazy
            .as_deref()
            .is_some_and(|q| q.passed(self.pos.load(Ordering::Acquire)))
    }

    /// Gives it stamp `seq` (at least 1) unless it has one.
    fn set_stamp(&self, seq: u64) {
        let _ = self
            .stamp
            .compare_exchange(0, seq, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Whether its queue's completion word has reached its stamp: `None` without a stamp, or
    /// where the word can no longer tell ([`Queue::stamp_seen`]).
    fn stamp_seen(&self) -> Option<bool> {
        match (self.stamp.load(Ordering::Acquire), self.lazy.as_deref()) {
            (0, _) | (_, None) => None,
            (seq, Some(q)) => q.stamp_seen(seq),
        }
    }

    /// Spins on the completion word until it reaches the stamp; past [`STAMP_SPIN_MAX`] (the
    /// request queued behind other work, or its stream failed), or where the word cannot tell,
    /// waits in the driver instead.
    fn spin_stamp(&self) -> Result<(), RequestError> {
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        loop {
            match self.stamp_seen() {
                Some(true) => return Ok(()),
                None => return self.sync(),
                Some(false) => {}
            }
            spins = spins.wrapping_add(1);
            // The clock read every 64 spins (about 2 us of `pause`s on the H200 host's CPU).
            if spins % 64 == 0 && start.elapsed() >= STAMP_SPIN_MAX {
                return self.sync();
            }
            std::hint::spin_loop();
        }
    }

    /// What the waits call on now: the event, or (a lazy request without one) the stream.
    fn target(&self) -> (WaitOn, Option<&Event>, Option<&Queue>) {
        let ev = self.event.get();
        (mark::wait_on(ev.is_some()), ev, self.lazy.as_deref())
    }

    /// Blocks in `cuEventSynchronize` (sleeping for events made with `BLOCKING_SYNC`, else
    /// spinning as the context's scheduling flags say), or in `cuStreamSynchronize` for a lazy
    /// request without an event (spinning likewise; lazy requests never sleep in the driver).
    fn sync(&self) -> Result<(), RequestError> {
        let _ = driver::bind(&self.home.ctx);
        let r = match self.target() {
            // SAFETY: a live event handle.
            (WaitOn::Event, Some(e), _) => check("cuEventSynchronize", unsafe {
                sys::cuEventSynchronize(e.raw())
            }),
            (_, _, Some(q)) => check(
                "cuStreamSynchronize",
                // SAFETY: the queue's live stream (the queue holds it).
                q.wait_stream(|| unsafe { sys::cuStreamSynchronize(q.raw()) }),
            ),
            // Neither: not made by `CudaCompletion::new`.
            _ => Ok(()),
        };
        r.map_err(RequestError::from)
    }

    /// Non-blocking: `None` while pending (`cuEventQuery`, or `cuStreamQuery` for a lazy
    /// request without an event: success there means everything enqueued before, the request
    /// included, is done; "not ready" may also mean later work is pending, and is asked again).
    fn query(&self) -> Option<Result<(), RequestError>> {
        if let Some(r) = self.known() {
            return Some(r);
        }
        self.release();
        let (call, code) = match self.target() {
            // SAFETY: a live event handle.
            (WaitOn::Event, Some(e), _) => ("cuEventQuery", unsafe { sys::cuEventQuery(e.raw()) }),
            (_, _, Some(q)) => (
                "cuStreamQuery",
                // SAFETY: the queue's live stream.
                q.wait_stream(|| unsafe { sys::cuStreamQuery(q.raw()) }),
            ),
            _ => return Some(Ok(())),
        };
        match code {
            sys::CUresult::CUDA_SUCCESS => Some(Ok(())),
            sys::CUresult::CUDA_ERROR_NOT_READY => None,
            c => Some(Err(DriverError::new(call, c).into())),
        }
    }

    /// Records this request's event on `stream` (its queue's, nothing enqueued after it since
    /// its submit: the caller holds the queue's lock) unless it has one or is known done
    /// ([`mark::seals`]).
    pub(crate) fn seal(&self, stream: sys::CUstream) -> Result<(), DriverError> {
        if !mark::seals(self.event.get().is_some(), self.known().is_some()) {
            return Ok(());
        }
        driver::bind(&self.home.ctx)?;
        let ev = self.home.events.take(self.mode)?;
        // SAFETY: a live event of this context; the queue's live stream of it.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(ev.raw(), stream)
        })?;
        // Recorders hold the queue's lock, so it is unset; were it set, `ev` is just dropped.
        let _ = self.event.set(ev);
        Ok(())
    }

    /// What a dependent orders itself after: the known result, else the event (recorded now if
    /// this lazy request is still its stream's last work). May change the calling thread's
    /// current context; waits on the host only where no event can be recorded.
    pub(crate) fn mark(&self) -> Mark {
        if let Some(r) = self.known() {
            return Mark::Known(r);
        }
        self.release();
        if let Some(q) = self.lazy.as_deref().filter(|_| self.event.get().is_none()) {
            // Not the last: a later submission recorded the event, or it completed first.
            if let Some(me) = self.me.upgrade() {
                let _ = q.mark_last(&*me);
            }
        }
        match self.event.get() {
            Some(e) => Mark::Event(e.raw()),
            None => Mark::Known(self.wait_event(self.mode)),
        }
    }
}

impl Lazy for Shared {
    fn seal(&self, stream: sys::CUstream) -> Result<(), DriverError> {
        self.completion().inner.seal(stream)
    }
    fn known_done(&self) -> bool {
        self.completion().inner.known().is_some()
    }
    fn issued(&self, stream: sys::CUstream, outcome: Result<Option<u64>, DriverError>) {
        let inner = &self.completion().inner;
        match outcome {
            Ok(stamp) => {
                if let Some(seq) = stamp {
                    inner.set_stamp(seq);
                }
                if inner.eager {
                    if let Err(e) = inner.seal(stream) {
                        // No event marks its end: its copy finishes before its failure is
                        // handed back (with the buffers, in the safe API).
                        // SAFETY: its queue's live stream (the caller holds the queue).
                        let _ = unsafe { sys::cuStreamSynchronize(stream) };
                        let _ = inner.slot.complete(Err(e.into()));
                    }
                }
            }
            Err(e) => {
                let _ = inner.slot.complete(Err(e.into()));
            }
        }
        inner.held.store(false, Ordering::Release);
    }
    fn stamp_late(&self, seq: u64) {
        self.completion().inner.set_stamp(seq);
    }
    fn placed(&self, pos: u64) {
        self.completion().inner.pos.store(pos, Ordering::Release);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Drop synchronizes: the scratch buffers and the event outlive the work.
        let ok = match self.slot.get() {
            Some(r) => r.is_ok(),
            None => self.wait_event(self.mode).is_ok(),
        };
        if let Some(e) = self.event.take() {
            if ok {
                // Complete, so a later record on any stream may reuse it.
                self.home.events.give(e);
            }
        }
    }
}

/// The completion of one CUDA request. Recognised by [`crate::engine::cuda::CudaEngine`] in `Job::after`
/// through [`Completion::as_any`], so that a dependency becomes a `cuStreamWaitEvent`.
pub struct CudaCompletion {
    pub(crate) inner: Inner,
}

impl CudaCompletion {
    pub(crate) fn new(
        marked: Marked,
        home: Arc<Home>,
        (mode, expect): (WaitMode, Expect),
        keep: Vec<DeviceBuffer>,
    ) -> Arc<Shared> {
        let (event, lazy, stamp, held) = match marked {
            Marked::Event(e) => (OnceLock::from(e), None, None, None),
            Marked::Lazy(q, stamp) => (OnceLock::new(), Some(q), stamp, None),
            Marked::Held(q, eager) => (OnceLock::new(), Some(q), None, Some(eager)),
        };
        Arc::new_cyclic(|me| {
            Shared::new(CudaCompletion {
                inner: Inner {
                    me: Weak::clone(me),
                    event,
                    lazy,
                    stamp: AtomicU64::new(stamp.unwrap_or(0)),
                    pos: AtomicU64::new(0),
                    held: AtomicBool::new(held.is_some()),
                    eager: held == Some(true),
                    home,
                    mode,
                    expect,
                    slot: Slot::new(),
                    _keep: keep,
                },
            })
        })
    }
    /// What a dependent orders itself after (a later request of this engine or another, a
    /// caller's stream, the NCCL engine): the event its stream waits for (`Ok(Some(event))`,
    /// held by this request, which the caller keeps until the wait is enqueued), or the known
    /// result (`Ok(None)`: done; `Err`: failed). As [`Inner::mark`].
    pub(crate) fn event_to_wait(&self) -> Result<Option<sys::CUevent>, RequestError> {
        match self.inner.mark() {
            Mark::Event(e) => Ok(Some(e)),
            Mark::Known(r) => r.map(|()| None),
        }
    }
}

impl Completion for CudaCompletion {
    fn wait(&self) -> Result<(), RequestError> {
        self.inner.wait_event(self.inner.mode)
    }
    fn poll_done(&self) -> Option<Result<(), RequestError>> {
        if let Some(r) = self.inner.slot.get() {
            return Some(r);
        }
        let r = self.inner.query()?;
        Some(self.inner.slot.complete(r))
    }
    /// A held request's copy stays held (not done yet); others as `poll_done`.
    fn poll_quiet(&self) -> Option<Result<(), RequestError>> {
        if self.inner.slot.get().is_none() && self.inner.held.load(Ordering::Acquire) {
            return None;
        }
        self.poll_done()
    }
    fn register_waker(&self, waker: &Waker) {
        if !self.inner.slot.register_waker(waker) {
            return;
        }
        // The waiter thread waits on the request's event (a lazy request records it now), so
        // that work the caller submits on the same stream meanwhile never delays the wake-up.
        // `Known`: the slot holds the result, and completing it woke the wakers.
        if let Mark::Event(_) = self.inner.mark() {
            // `me` upgrades: the caller's request holds the allocation.
            let sent = (self.inner.me.upgrade())
                .is_some_and(|me| self.inner.home.waker_tx.send(me).is_ok());
            if !sent {
                // The waiter thread is gone: wait here rather than never waking.
                self.inner.wait_event(self.inner.mode).ok();
            }
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The engine's waiter thread: waits events in the order futures registered them and wakes
/// their wakers. Ends when every sender (the engine and its requests) is gone. It waits as a
/// waiting thread would (the request's own mode: `Auto` sleeps until shortly before the expected
/// end, then polls), so a future wakes as soon as `wait` would return. (It used to wait every
/// request as `Blocking`, paying the 15-150 us wake-up of a `BLOCKING_SYNC` event, and spinning
/// instead on `Spin` events, which carry no `BLOCKING_SYNC`.)
pub(crate) fn spawn_waiter(name: String) -> std::io::Result<Sender<Arc<Shared>>> {
    crate::request::spawn_waiter(
        name,
        |shared: &Arc<Shared>| {
            let inner = &shared.completion().inner;
            let _ = inner.wait_event(inner.mode);
        },
        |shared, _| {
            // The panic was the wait's (ferry's own code), not the work's: the driver's answer,
            // once the work is done, is the request's result (failing it earlier would free its
            // buffers while the copy may still use them).
            let inner = &shared.completion().inner;
            let _ = inner.slot.complete(inner.sync());
        },
    )
}
