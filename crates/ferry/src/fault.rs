//! Fault injection for reliability tests (cargo feature `fault-injection`, off by default; the
//! library has no hook and no cost without it).
//!
//! A few points inside the library ask (through a crate-private `fire`) whether to fail there.
//! A test [`arm`]s a point to fire once, after the point has been passed a given number of
//! times, then checks that the failure is reported to the one request it hit and that the
//! engine stays usable and leaks nothing. The points:
//!
//! - [`Fault::StagedChunk`]: the device-side copy of a chunk of a staged (pinned ring) copy
//!   fails with `CUDA_ERROR_OUT_OF_MEMORY`, in either direction, after earlier chunks were
//!   issued (device out of memory in the middle of staging).
//! - [`Fault::StagingWorkerPanic`]: a staging worker thread panics at the start of its part of
//!   a chunk's copy between pageable memory and the ring (parts are counted across workers).
//! - [`Fault::StagingThreadPanic`]: the engine's staging thread (the one that runs staged
//!   requests) panics at the start of a request.
//! - [`Fault::StagingCoordinatorPanic`]: the thread coordinating a staged copy (the one that
//!   issues each chunk's DMA while the workers copy) panics as it issues a chunk's device side
//!   (chunks are counted).
//! - [`Fault::StagedDma`]: one driver copy call of a staged copy fails with
//!   `CUDA_ERROR_INVALID_VALUE` (calls are counted, so that a chunk whose device side is
//!   several calls can fail after some of them were enqueued).
//! - [`Fault::StagedRecord`]: recording a ring slot's event after a chunk's device side fails
//!   with `CUDA_ERROR_INVALID_VALUE` (chunks are counted): the chunk's DMA is enqueued, with no
//!   event after it.
//!
//! With the feature, ferry also counts the driver allocations it holds ([`live`]): page-locked
//! host memory (pinned and mapped buffers, registrations, staging rings, the gather table's host
//! side) and device memory (device and managed buffers, the gather table), so that a test can
//! check that none is left open after a fault.
//!
//! The state is global to the process: tests that arm faults must not run at the same time as
//! other staged copies they do not expect to fail.
//!
//! ```
//! use ferry::fault::{arm, disarm_all, Fault};
//! arm(Fault::StagedChunk, 2); // the third staged chunk from now fails
//! disarm_all();
//! ```

use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

/// A point where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The device-side copy of one chunk of a staged copy fails (out of memory).
    StagedChunk,
    /// A staging worker thread panics while copying its share of a chunk.
    StagingWorkerPanic,
    /// The staging thread panics at the start of a staged request.
    StagingThreadPanic,
    /// The thread coordinating a staged copy panics as it issues a chunk's device side.
    StagingCoordinatorPanic,
    /// One driver copy call of a staged copy fails (counted per call, not per chunk).
    StagedDma,
    /// Recording a ring slot's event after a chunk's device side fails.
    StagedRecord,
}

/// How many points there are.
const POINTS: usize = 6;

/// Per point: 0 = off; n > 0 = fire when the count reaches 1, n - 1 passes from now.
static ARMED: [AtomicUsize; POINTS] = [const { AtomicUsize::new(0) }; POINTS];

/// Makes `fault` fire once, at the pass after `skip` passes of its point.
pub fn arm(fault: Fault, skip: usize) {
    ARMED[fault as usize].store(skip.saturating_add(1), Ordering::SeqCst);
}

/// Turns every point off.
pub fn disarm_all() {
    for a in &ARMED {
        a.store(0, Ordering::SeqCst);
    }
}

/// Whether `fault` is still armed (it has not fired yet).
pub fn is_armed(fault: Fault) -> bool {
    ARMED[fault as usize].load(Ordering::SeqCst) != 0
}

/// Called at the point of `fault`: true exactly once per [`arm`], at the chosen pass.
pub(crate) fn fire(fault: Fault) -> bool {
    ARMED[fault as usize]
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok_and(|n| n == 1)
}

/// A kind of driver allocation ferry counts (with this feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resource {
    /// Page-locked host memory: `cuMemHostAlloc` allocations and `cuMemHostRegister`
    /// registrations.
    PinnedHost,
    /// Device memory: `cuMemAlloc` and `cuMemAllocManaged` allocations.
    Device,
}

static LIVE: [AtomicIsize; 2] = [AtomicIsize::new(0), AtomicIsize::new(0)];

/// Allocations of this kind that ferry made and has not freed yet, in this process.
pub fn live(r: Resource) -> isize {
    LIVE[r as usize].load(Ordering::SeqCst)
}

/// Records `delta` allocations of `r` (+1 made, -1 freed).
pub(crate) fn count(r: Resource, delta: isize) {
    LIVE[r as usize].fetch_add(delta, Ordering::SeqCst);
}
