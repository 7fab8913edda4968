//! The ring of a staged copy: the staging subsystem's ring (`staging/ring.rs`) of pinned slots
//! (the crate's one pinned allocation, [`HostAlloc`]), each completed by an event recorded
//! after the DMA that reads or fills it ([`SlotEvent`]).

use super::error::{driver_error, drv};
use super::StagedError;
use super::StagingConfig;
use crate::engine::cuda::sys::driver;
use crate::engine::cuda::sys::memory::{HostAlloc, PinFlags};
use crate::staging::ring::{Ring as SlotRing, SlotDone};
use cudarc::driver::result as cu;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use std::sync::Arc;

/// What completes a staged slot: its event, recorded after the slot's DMA, and whether that
/// record has not yet been seen complete.
pub(super) struct SlotEvent {
    event: CudaEvent,
    pending: bool,
}

impl SlotDone for SlotEvent {
    type Error = StagedError;
    fn is_pending(&self) -> bool {
        self.pending
    }
    /// Whether the slot's DMA is done (no wait). The slot stays pending if the query fails.
    fn poll(&mut self) -> Result<bool, StagedError> {
        if self.pending {
            if !self.event.try_is_complete().map_err(drv("cuEventQuery"))? {
                return Ok(false);
            }
            self.pending = false;
        }
        Ok(true)
    }
    /// Waits for the slot's DMA, if one is pending. The slot stays pending if the wait fails.
    fn wait(&mut self) -> Result<(), StagedError> {
        if self.pending {
            driver::sync_event(&self.event).map_err(drv("cuEventSynchronize"))?;
            self.pending = false;
        }
        Ok(())
    }
    fn forget(&mut self) {
        self.pending = false;
    }
}

/// A ring of pinned slots with one event per slot (recorded after the slot's DMA).
///
/// What it keeps true: no copy uses a slot (its workers write or read it, a new DMA is issued
/// on it) and no copy returns while driver work it issued on a slot may still run. `pending`
/// and `unsure` say what is not known to have ended; [`Ring::drain`] ends a copy only once
/// nothing is left, synchronizing the stream where an event cannot tell, and
/// [`Ring::ready`] refuses a copy while something is left.
pub(super) struct Ring {
    /// The slots, `chunk_bytes` each, and their events.
    ring: SlotRing<HostAlloc, SlotEvent>,
    /// Driver work may be running that no pending event covers: a chunk's device side failed
    /// after some of its calls were enqueued, its event could not be recorded, or a slot's
    /// event could not be waited for. Only synchronizing the stream (or the context) ends it.
    unsure: bool,
    /// Device scratch, one per slot, `chunk_bytes` each (made on first need): where a staged
    /// segment list's chunk lands before the device scatters it, or is packed before its DMA.
    scratch: Vec<DevScratch>,
}

/// One device allocation of a ring's scratch, freed on drop.
struct DevScratch(u64);

impl Drop for DevScratch {
    fn drop(&mut self) {
        // SAFETY: allocated by `cuMemAlloc` in `Ring::scratch`; the ring drains every DMA and
        // scatter before a copy returns, so nothing uses it any more.
        if unsafe { cu::free_sync(self.0) }.is_ok() {
            count_alloc!(Device, -1);
        }
    }
}

impl Ring {
    /// `cfg.ring_depth` slots of `cfg.chunk_bytes` in `ctx`, allocated with `flags`.
    pub(super) fn new(
        ctx: &Arc<CudaContext>,
        cfg: &StagingConfig,
        flags: PinFlags,
    ) -> Result<Ring, StagedError> {
        let mut slots = Vec::with_capacity(cfg.ring_depth);
        let mut events = Vec::with_capacity(cfg.ring_depth);
        for _ in 0..cfg.ring_depth {
            slots.push(HostAlloc::new(ctx, cfg.chunk_bytes, flags).map_err(driver_error)?);
            events.push(SlotEvent {
                event: ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map_err(drv("cuEventCreate"))?,
                pending: false,
            });
        }
        Ok(Ring {
            ring: SlotRing::new(slots, events),
            unsure: false,
            scratch: Vec::new(),
        })
    }
    /// Slots in the ring.
    pub(super) fn depth(&self) -> usize {
        self.ring.depth()
    }
    /// The slots' addresses, in order.
    pub(super) fn slot_ptrs(&self) -> Vec<*mut u8> {
        self.ring.slots().iter().map(HostAlloc::ptr).collect()
    }
    /// The device scratch buffers, one per slot of `bytes` each (`bytes` is the ring's slot
    /// size; made on the first call, the ring's context current).
    pub(super) fn scratch(&mut self, bytes: usize) -> Result<Vec<u64>, StagedError> {
        while self.scratch.len() < self.ring.depth() {
            // SAFETY: a plain allocation in the current context, owned by the ring.
            let p = unsafe { cu::malloc_sync(bytes.max(1)) }.map_err(drv("cuMemAlloc"))?;
            count_alloc!(Device, 1);
            self.scratch.push(DevScratch(p));
        }
        Ok(self.scratch.iter().map(|d| d.0).collect())
    }
    /// Whether the slot's DMA is done (no wait). The slot stays pending if the query fails.
    pub(super) fn poll(&mut self, slot: usize) -> Result<bool, StagedError> {
        self.ring.poll(slot)
    }
    /// Enqueues a chunk's device side on `stream` (`issue`, given the slot's address: driver
    /// work that reads or fills the slot), then records the slot's event after it. If `issue`
    /// fails after enqueuing part of its work, or the event cannot be recorded, the work is
    /// counted as unsure: [`Ring::drain`] then synchronizes the stream.
    pub(super) fn enqueue(
        &mut self,
        slot: usize,
        stream: &CudaStream,
        issue: impl FnOnce(*mut u8) -> Result<(), StagedError>,
    ) -> Result<(), StagedError> {
        let before = self.unsure;
        self.unsure = true;
        issue(self.ring.slots()[slot].ptr())?;
        self.record(slot, stream)?;
        self.unsure = before;
        Ok(())
    }
    /// Records the slot's event on `stream`, after the slot's DMA.
    fn record(&mut self, slot: usize, stream: &CudaStream) -> Result<(), StagedError> {
        #[cfg(feature = "fault-injection")]
        if crate::fault::fire(crate::fault::Fault::StagedRecord) {
            return Err(StagedError::Driver {
                op: "cuEventRecord",
                source: cu::DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE),
            });
        }
        let done = self.ring.done_mut(slot);
        driver::record_event(&done.event, stream).map_err(drv("cuEventRecord"))?;
        done.pending = true;
        Ok(())
    }
    /// Waits for every DMA the copy issued (also on the error path, so that no DMA outlives
    /// the copy): each pending slot's event, then, where something is unsure (work with no
    /// event after it, an event that could not be waited for), the whole of `stream`, or
    /// failing that the context. `stream` is the one every DMA of the copy went on; the
    /// context is current. Returns the first failure; the ring is settled unless even the
    /// synchronization failed (then [`Ring::ready`] tries again before the next copy).
    pub(super) fn drain(&mut self, stream: &CudaStream) -> Result<(), StagedError> {
        let mut first = self.ring.wait_all();
        if self.unsure || self.ring.any_pending() {
            // SAFETY: `stream` is a live stream of this ring's context (the caller's).
            let by_stream = unsafe { sys::cuStreamSynchronize(stream.cu_stream()) }
                .result()
                .map_err(drv("cuStreamSynchronize"));
            if let Err(e) = by_stream.or_else(|_| self.settle()) {
                first = first.and(Err(e));
            } else {
                self.settled();
            }
        }
        first
    }
    /// Whether a copy may use the ring: nothing of an earlier copy is left running. After a
    /// drain that could not confirm that, the whole context is synchronized (the context is
    /// current); if even that fails the copy is refused before it touches a slot.
    pub(super) fn ready(&mut self) -> Result<(), StagedError> {
        if self.unsure || self.ring.any_pending() {
            self.settle()?;
            self.settled();
        }
        Ok(())
    }
    /// Synchronizes the current context: every DMA issued on the ring has ended after it.
    fn settle(&self) -> Result<(), StagedError> {
        cu::ctx::synchronize().map_err(drv("cuCtxSynchronize"))
    }
    /// Every DMA issued on the ring is known to have ended.
    fn settled(&mut self) {
        self.ring.forget_all();
        self.unsure = false;
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // A ring dropped unsettled (its last copy's drain could not synchronize): its pinned
        // slots are freed only after one more try at waiting for the context.
        if self.unsure || self.ring.any_pending() {
            let ctx =
                (self.ring.depth() > 0).then(|| Arc::clone(self.ring.done_mut(0).event.context()));
            if let Some(ctx) = ctx {
                if driver::bind(&ctx).is_ok() {
                    let _ = self.settle();
                }
            }
        }
    }
}
