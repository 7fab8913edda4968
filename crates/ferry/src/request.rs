//! Requests: the handle a submitted copy returns, with `wait`, a non-blocking poll, and
//! [`std::future::Future`].
//!
//! Lifecycle (as in Linux dmaengine): *prepare* (the engine validates the job; never blocks)
//! -> *submit* (the engine owns the work) -> *complete* (each request completes on its own,
//! with its own result). [`Request::wait`] blocks the calling thread; [`Request::try_wait`]
//! and polling the future never block.
//!
//! Dropping a request does not cancel or wait for its work: the engine finishes it and, if it
//! failed, the error is reported by the next barrier. The safe APIs that hand buffers to
//! engines ([`Scope`](crate::Scope), [`Transfer`](crate::Transfer)) wait before the buffers
//! can be touched again.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use thiserror::Error;

mod completion;
mod error;
mod handle;
mod slot;
use crate::small_list::SmallList;
use crate::sync::Condvar;
pub use completion::Completion;
use completion::{next_id, DoneOk};
pub use error::{BackendError, RequestError};
use handle::Handle;
pub(crate) use handle::Shared;
pub(crate) use slot::{hold_wakes, spawn_waiter, HoldWakes, Slot};

/// Waits for a request's completion `c`, its result seen (`Observed` in its header `h`):
/// marked before the wait, and as a success after one.
fn wait_seen(h: &handle::Head, c: &dyn Completion) -> Result<(), RequestError> {
    h.observed.see();
    let r = c.wait();
    if r.is_ok() {
        h.observed.see_ok();
    }
    r
}

/// A submitted copy. Wait on it, poll it, or `.await` it (any executor). Dropping it does
/// not cancel nor wait: the copy runs on, and a failure nobody waited for is reported by the
/// enclosing [`scope`](crate::EngineExt::scope) or the engine's next
/// [`barrier`](crate::Engine::barrier) (so `drop(s.memcpy(..)?)` in a scope loses nothing).
///
/// Awaited, its waker is woken by the thread that completes the request (an engine's thread,
/// or any thread that polls it and finds it done), never while that thread holds an engine's
/// lock: a waker may poll inline and submit on the same engine. A waker that panics is caught
/// there (the panic hook reports it): the other wakers are still woken and the engine's
/// threads carry on.
///
/// ```
/// use ferry::{CpuEngine, Engine, EngineExt};
/// let engine = CpuEngine::new(2)?;
/// let src = vec![7u8; 1 << 20];
/// let mut dst = vec![0u8; 1 << 20];
/// engine.scope(|s| -> ferry::Result<()> {
///     let req = s.memcpy(&mut dst, &src)?;
///     req.wait()?; // or: futures::executor::block_on(req)
///     Ok(())
/// })?;
/// assert_eq!(dst, src);
/// # Ok::<(), ferry::Error>(())
/// ```
#[must_use = "a dropped request still runs, and only the enclosing scope or the engine's next \
              barrier reports its failure: `.wait()?` it to see its result here, or `drop()` it"]
pub struct Request {
    /// The engine's completion (a strong reference to its allocation), or the id of a request
    /// that completed successfully at submit (a small copy run on the caller's thread), with
    /// nothing allocated, shared or counted (issue 32). One word ([`handle`]'s module doc).
    h: Handle,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("id", &self.id()).finish()
    }
}

impl Request {
    /// Wraps an engine's completion. Engine implementations call this.
    pub fn new(completion: impl Completion) -> Request {
        Request::from_shared(Arc::new(Shared::new(completion)))
    }

    /// The request of an allocation the engine made (and may keep handles to: a CUDA
    /// request's queue and waiter thread hold the same allocation, not one of their own).
    pub(crate) fn from_shared(shared: Arc<Shared<impl Completion>>) -> Request {
        Request {
            h: Handle::shared(shared),
        }
    }

    /// A request that has already completed with `result`. A success allocates nothing.
    pub fn ready(result: Result<(), RequestError>) -> Request {
        match result {
            Ok(()) => Request::done_ok(),
            Err(e) => {
                let s = Signal::new();
                s.complete(Err(e));
                Request::new(s)
            }
        }
    }

    /// A request that succeeded at submit: no allocation, no atomic read-modify-write.
    #[inline]
    pub(crate) fn done_ok() -> Request {
        Request::done_with_id(next_id())
    }

    /// The request [`Request::done_ok`] made with this id (a done request handed on rebuilt
    /// from its id rather than moved: the safe scope's `tracked`).
    #[inline]
    pub(crate) fn done_with_id(id: u64) -> Request {
        Request {
            h: Handle::done(id),
        }
    }

    /// True for a request that succeeded at submit ([`Request::done_ok`]): nothing to wait
    /// for nor to report.
    #[inline]
    pub(crate) fn is_done_ok(&self) -> bool {
        self.h.is_done_ok()
    }

    /// A number unique to this request in the process.
    pub fn id(&self) -> u64 {
        self.h.id()
    }

    /// Blocks until the request completes; returns its own result. May block.
    #[inline]
    pub fn wait(self) -> Result<(), RequestError> {
        match self.h.parts() {
            Some((h, c)) => wait_seen(h, c),
            None => Ok(()),
        }
    }

    /// Returns `Some(result)` once complete, `None` while in flight. Never blocks. Once it has
    /// returned `Some`, the barrier no longer reports this request's error.
    pub fn try_wait(&mut self) -> Option<Result<(), RequestError>> {
        let Some((h, c)) = self.h.parts() else {
            return Some(Ok(()));
        };
        let r = c.poll_done();
        match r {
            Some(Ok(())) => h.observed.see_ok(),
            Some(Err(_)) => h.observed.see(),
            None => {}
        }
        r
    }

    /// True once the request has completed (successfully or not). Never blocks.
    pub fn is_done(&self) -> bool {
        self.completion().poll_done().is_some()
    }

    /// The engine's completion object (for engines that chain their own requests).
    pub fn completion(&self) -> &dyn Completion {
        match self.h.parts() {
            Some((_, c)) => c,
            None => &DoneOk,
        }
    }

    /// Seen to succeed through `wait`/`try_wait`, or succeeded at submit.
    fn observed_ok(&self) -> bool {
        self.h.parts().is_none_or(|(h, _)| h.observed.ok())
    }

    /// Its result was seen through `wait`/`try_wait` (or it succeeded at submit).
    fn observed_seen(&self) -> bool {
        self.h.parts().is_none_or(|(h, _)| h.observed.seen())
    }

    /// A second handle to the same request, for engines' and scopes' bookkeeping.
    pub(crate) fn share(&self) -> Request {
        Request { h: self.h.clone() }
    }

    /// Waits without marking the result observed (a later barrier still reports a failure).
    pub(crate) fn settle_keep(&self) -> Result<(), RequestError> {
        self.completion().wait()
    }

    /// Waits and returns the error only if nobody has observed it yet.
    pub(crate) fn settle(&self) -> Result<(), RequestError> {
        let Some((h, c)) = self.h.parts() else {
            return Ok(());
        };
        let r = c.wait();
        if h.observed.claim() {
            return Ok(());
        }
        r
    }
}

impl Future for Request {
    type Output = Result<(), RequestError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(r) = this.try_wait() {
            return Poll::Ready(r);
        }
        this.completion().register_waker(cx.waker());
        // Completion may have raced the registration.
        match this.try_wait() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

/// Every failure a barrier saw, one entry per failed request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{} request(s) failed: {}", failures.len(), summary(failures))]
pub struct BarrierError {
    /// (request id, its error) for each failed request not already observed.
    pub failures: Vec<(u64, RequestError)>,
}

fn summary(f: &[(u64, RequestError)]) -> String {
    f.iter()
        .map(|(id, e)| format!("#{id}: {e}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The requests an engine (or a scope) has in flight, for barriers.
#[derive(Default)]
pub struct InFlight {
    /// A scope's one request inline (no allocation per scope).
    list: Mutex<Tracked>,
    /// False while nothing is tracked since the last barrier: the barrier then takes no lock
    /// (the end of a scope whose copies all completed at submit, issue 32). Set and cleared
    /// under the lock, read without it: a `track` that happened before a barrier is seen by it.
    any: AtomicBool,
}

#[derive(Default)]
struct Tracked {
    requests: SmallList<Request>,
    /// How many requests the last pruning kept (0 after a barrier).
    kept: usize,
}

impl InFlight {
    /// An empty set.
    pub fn new() -> InFlight {
        InFlight::default()
    }
    /// Tracks `req` until the next barrier. Completed, observed requests are pruned here.
    pub fn track(&self, req: &Request) {
        if req.is_done_ok() {
            // Succeeded at submit: nothing to wait for nor to report.
            return;
        }
        // The pruning polls the tracked requests, and a poll may complete one (a CUDA request
        // found done) and so wake its futures: their wakers run once the list is unlocked, so
        // that one may submit on this engine (tracking its request here) from inside `wake`.
        let _wakes = hold_wakes();
        let mut t = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        // Pruned at 16, 32, 64, ... entries: one poll per tracked request, amortized, at any
        // threshold; a low one lets completed requests go soon (a CUDA request's event then
        // returns to its engine's pool while still warm in the driver's caches). At 4 while
        // the last pruning kept nothing (requests waited one by one): 16 requests freed at once
        // overflowed the allocator's per-thread cache of 7 blocks a size, so that half of the
        // next 16 allocations took malloc's slow path (about 150 instructions a request, on the
        // null driver). Once a pruning keeps requests in flight, the rule is 16, 32, ... again,
        // so that a pipeline's pending requests are not polled (a driver query each) at every
        // fourth submit.
        let start = if t.kept == 0 { 4 } else { 16 };
        let l = &mut t.requests;
        if l.len() >= start && l.len().is_power_of_two() {
            // Nothing left to report: done and either observed or successful. (Keeping
            // successful requests that were dropped unwaited would grow the list without bound.)
            l.retain(|r| match r.completion().poll_quiet() {
                Some(Ok(())) => false,
                Some(Err(_)) => !r.observed_seen(),
                None => true,
            });
            t.kept = t.requests.len();
        }
        t.requests.push(req.share());
        if !self.any.load(Ordering::Relaxed) {
            self.any.store(true, Ordering::Release);
        }
    }
    /// Waits for every tracked request and reports every unobserved failure. May block.
    #[inline]
    pub fn barrier(&self) -> Result<(), BarrierError> {
        // Nothing tracked since the last barrier (a scope whose copies all ran at submit): one
        // load, inlined into the scope's end, no call (issue 32).
        if !self.any.load(Ordering::Acquire) {
            return Ok(());
        }
        self.barrier_tracked()
    }
    /// [`InFlight::barrier`] of a set that tracked a request since the last one.
    fn barrier_tracked(&self) -> Result<(), BarrierError> {
        let taken = {
            let mut t = self.list.lock().unwrap_or_else(PoisonError::into_inner);
            self.any.store(false, Ordering::Relaxed);
            // Every request seen to succeed (a scope's requests waited in its body, nearly
            // always): nothing to wait for or report, known without a call into a completion;
            // the list is emptied where it is (the scope's end is on the path a small copy's
            // caller waits for, issue 14).
            if t.requests.as_slice().iter().all(Request::observed_ok) {
                t.requests.clear();
                t.kept = 0;
                return Ok(());
            }
            std::mem::take(&mut *t).requests
        };
        let mut failures = Vec::new();
        wait_each(taken.as_slice(), |r| {
            // Waited for and succeeded: nothing to wait for or report.
            if r.observed_ok() {
                return;
            }
            if let Err(e) = r.settle() {
                failures.push((r.id(), e));
            }
        });
        if failures.is_empty() {
            Ok(())
        } else {
            Err(BarrierError { failures })
        }
    }
    /// Number of requests tracked (completed or not).
    pub fn len(&self) -> usize {
        self.list
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .requests
            .len()
    }
    /// True when nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A completion signalled from host code: a completion slot whose waiters sleep on a condition
/// variable. Engines whose work finishes on host threads (the CPU engine, files, joins) use it.
#[derive(Default)]
pub struct Signal {
    slot: Slot<Condvar>,
}

impl Signal {
    /// A signal not yet completed.
    pub fn new() -> Signal {
        Signal::default()
    }
    /// Completes the signal (the first result wins) and wakes every waiter.
    pub fn complete(&self, result: Result<(), RequestError>) {
        let _ = self.slot.complete(result);
    }
}

impl Completion for Signal {
    fn wait(&self) -> Result<(), RequestError> {
        self.slot.wait()
    }
    fn poll_done(&self) -> Option<Result<(), RequestError>> {
        self.slot.get()
    }
    fn register_waker(&self, waker: &Waker) {
        // Host threads complete it: no waiter to arrange.
        self.slot.register_waker(waker);
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Completion for Arc<Signal> {
    fn wait(&self) -> Result<(), RequestError> {
        (**self).wait()
    }
    fn poll_done(&self) -> Option<Result<(), RequestError>> {
        (**self).poll_done()
    }
    fn register_waker(&self, waker: &Waker) {
        (**self).register_waker(waker)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Requests a call submitted over buffers it only borrows, waited for when dropped: a call that
/// submits several and stops early (a refusal, an error, or an unwind out of code it does not
/// own: an [`Engine`](crate::Engine) or a [`FileIo`](crate::file::FileIo) is safe to implement,
/// so its methods may panic) must not return, nor unwind, while the earlier ones still read or
/// write those buffers.
#[derive(Default)]
pub(crate) struct WaitOnDrop(Vec<Request>);

impl WaitOnDrop {
    /// Adds a request just submitted.
    pub(crate) fn push(&mut self, req: Request) {
        self.0.push(req);
    }
    /// The requests, in submission order, no longer waited for on drop: the caller takes over.
    pub(crate) fn into_vec(mut self) -> Vec<Request> {
        std::mem::take(&mut self.0)
    }
}

impl Drop for WaitOnDrop {
    fn drop(&mut self) {
        wait_each(self.0.drain(..), |r| {
            let _ = r.wait();
        });
    }
}

/// Runs `wait` on each of `reqs`, every one even if one panics (any type may be a completion,
/// the one of a caller's own engine behind a [`MultiplexEngine`](crate::MultiplexEngine): its
/// `wait` may panic), then lets the first panic go on. A wait for several requests that stopped
/// at a panic once let a scope end, its buffers' borrows with it, while the requests after the
/// panicking one still copied into them.
fn wait_each<T>(reqs: impl IntoIterator<Item = T>, mut wait: impl FnMut(T)) {
    let mut panic = None;
    for r in reqs {
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| wait(r))) {
            panic.get_or_insert(p);
        }
    }
    if let Some(p) = panic {
        std::panic::resume_unwind(p);
    }
}

/// A completion made of several parts (a copy split across engines): done when every part is
/// done, failed with the first part's error.
pub struct Join {
    parts: Vec<Request>,
}

impl Join {
    /// Joins `parts` into one completion.
    pub fn new(parts: Vec<Request>) -> Join {
        Join { parts }
    }
}

impl Completion for Join {
    fn wait(&self) -> Result<(), RequestError> {
        let mut first = Ok(());
        wait_each(&self.parts, |p| {
            let r = match p.h.parts() {
                Some((h, c)) => wait_seen(h, c),
                None => Ok(()),
            };
            if first.is_ok() {
                first = r;
            }
        });
        first
    }
    fn poll_done(&self) -> Option<Result<(), RequestError>> {
        let mut first = Ok(());
        for p in &self.parts {
            let r = p.completion().poll_done()?;
            if first.is_ok() {
                first = r;
            }
        }
        for (h, _) in self.parts.iter().filter_map(|p| p.h.parts()) {
            h.observed.see();
        }
        Some(first)
    }
    fn register_waker(&self, waker: &Waker) {
        // Wake on the first part not yet done; the future re-polls and re-registers.
        match self
            .parts
            .iter()
            .find(|p| p.completion().poll_done().is_none())
        {
            Some(p) => p.completion().register_waker(waker),
            None => waker.wake_by_ref(),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
