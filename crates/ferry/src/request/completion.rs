//! What every request shares whatever its engine: the [`Completion`] trait engines implement,
//! request ids, and whether a request's result was seen ([`Observed`]). Below both the
//! [`Request`](super::Request) and its one-word handle (`handle.rs`).

use super::error::RequestError;
use std::any::Any;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::task::Waker;

/// How an engine reports completion. Engines implement this; users see
/// [`Request`](crate::Request).
pub trait Completion: Send + Sync + 'static {
    /// Blocks until the work is done and returns its result.
    fn wait(&self) -> Result<(), RequestError>;
    /// Returns the result if the work is done, without blocking.
    fn poll_done(&self) -> Option<Result<(), RequestError>>;
    /// [`Completion::poll_done`] for bookkeeping (an in-flight list's pruning): never starts
    /// work an engine holds until a flush ([`crate::Engine::enqueue`]) to find out, where
    /// `poll_done` would. Default: `poll_done`.
    fn poll_quiet(&self) -> Option<Result<(), RequestError>> {
        self.poll_done()
    }
    /// Arranges for `waker` to be woken once the work is done (may wake at once).
    fn register_waker(&self, waker: &Waker);
    /// For engines that recognise their own completions (event dependencies).
    fn as_any(&self) -> &dyn Any;
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Ids handed out per thread in blocks: a request's id costs no atomic read-modify-write on
/// the path of a small copy (issue 32). Unique in the process; increasing per thread.
const ID_BLOCK: u64 = 1024;

thread_local! {
    /// The next id of this thread's block and the block's end.
    static IDS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// A request id unique in the process.
#[inline]
pub(super) fn next_id() -> u64 {
    IDS.with(|c| {
        let (mut next, mut end) = c.get();
        if next == end {
            next = NEXT_ID.fetch_add(ID_BLOCK, Ordering::Relaxed);
            end = next + ID_BLOCK;
        }
        c.set((next + 1, end));
        next
    })
}

/// Whether a request's result was seen through `wait`/`try_wait` (then a barrier does not
/// report it again), and whether it was seen to succeed (then a barrier skips the request
/// without asking its completion: the scope's end after a waited copy, issue 14).
#[derive(Default)]
pub(super) struct Observed(AtomicU8);

impl Observed {
    const SEEN: u8 = 1;
    const OK: u8 = 2;
    /// Its result is being or was seen: set before a wait, so that a barrier that settles the
    /// request after the wait began does not report its failure again (a barrier that claimed
    /// it first reports it too: two observers, as before this flag).
    pub(super) fn see(&self) {
        // A plain store: at worst it turns `OK` back into `SEEN`, and a barrier then asks the
        // completion (as it did before this flag).
        self.0.store(Self::SEEN, Ordering::Release);
    }
    /// Its result was seen and is a success.
    pub(super) fn see_ok(&self) {
        self.0.store(Self::OK, Ordering::Release);
    }
    pub(super) fn seen(&self) -> bool {
        self.0.load(Ordering::Acquire) >= Self::SEEN
    }
    pub(super) fn ok(&self) -> bool {
        self.0.load(Ordering::Acquire) == Self::OK
    }
    /// Marks it seen; true if it already was (the caller then reports nothing).
    pub(super) fn claim(&self) -> bool {
        self.0.swap(Self::SEEN, Ordering::AcqRel) >= Self::SEEN
    }
}

/// The completion of a request that succeeded at submit
/// ([`Request::ready`](crate::Request::ready)`(Ok(()))`).
pub(super) struct DoneOk;

impl Completion for DoneOk {
    fn wait(&self) -> Result<(), RequestError> {
        Ok(())
    }
    fn poll_done(&self) -> Option<Result<(), RequestError>> {
        Some(Ok(()))
    }
    fn register_waker(&self, waker: &Waker) {
        waker.wake_by_ref();
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
