//! The synchronisation types of ferry's lock-free completion code: std's in every normal
//! build, [loom](https://docs.rs/loom)'s in the model-checking build (`--cfg loom`,
//! `scripts/loom.sh`), so that loom explores the interleavings of the very code that ships.
//!
//! Only the files whose interleavings the loom models explore import from here: the completion
//! slot (`request/slot.rs`), [`Signal`](crate::request::Signal) (`request.rs`), the CPU
//! engine's pool (`engine/cpu/pool.rs`), the staging subsystem's worker pool and fill queue
//! (`staging/workers.rs`, `fill.rs`) and the staged copy's slot hand-off
//! (`engine/cuda/paths/staged/handoff.rs`). Everything else uses `std::sync` directly;
//! a normal build compiles to the same code as before this module existed.

// loom is a dev-dependency: only the library's unit tests build with it (`all(test, loom)`).
// Any other build under `--cfg loom` is a normal one: the copy of ferry that its own
// dev-dependency on itself (for the integration tests) builds beside the unit tests.

#[cfg(not(all(test, loom)))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(all(test, loom)))]
pub(crate) use std::thread;

#[cfg(all(test, loom))]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(all(test, loom))]
pub(crate) use loom::thread;

/// Atomics (`Ordering` is std's in both builds).
pub(crate) mod atomic {
    pub(crate) use std::sync::atomic::Ordering;
    #[cfg(not(all(test, loom)))]
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize};

    #[cfg(all(test, loom))]
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize};

    /// Where a store and a later load of another atomic, both `SeqCst`, must not be reordered
    /// (each side of a store-then-load handshake, the completion slot's `listeners`): nothing
    /// in a normal build, where the `SeqCst` accesses themselves give that order. Under loom,
    /// which models `SeqCst` accesses as `AcqRel` only (its README: false alarms on exactly
    /// this pattern), a `SeqCst` fence, which it models fully: the model then sees the order
    /// the real build has. (It cannot tell a `SeqCst` access weakened by mistake: keep them
    /// `SeqCst` where this is called.)
    #[inline(always)]
    pub(crate) fn seq_cst_handshake() {
        #[cfg(all(test, loom))]
        loom::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// Whether waits spin before they sleep: not under loom, where a spin is a loop of loads the
/// model would explore one by one, and changes nothing a model can see (a thread that spins
/// and then sleeps is one that sleeps at once, a little later).
pub(crate) const SPIN: bool = !cfg!(all(test, loom));

/// Runs the loom model `f` over every interleaving of its threads, with at most 4 preemptions
/// each (`LOOM_MAX_PREEMPTIONS` overrides it): the bound keeps all of them to seconds (6 takes
/// minutes), and bugs of this kind of code need few preemptions to show.
#[cfg(all(test, loom))]
pub(crate) fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(4);
    }
    b.check(f);
}
