//! The ring of a staged copy: pinned slots (the crate's one pinned allocation,
//! [`HostAlloc`]), each with an event recorded after the DMA that reads or fills it.

use super::{driver_error, drv, StagedError, StagingConfig};
use crate::engine::cuda::memory::{HostAlloc, PinFlags};
use cudarc::driver::result as cu;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use std::sync::Arc;

/// A ring of pinned slots with one event per slot (recorded after the slot's DMA).
pub(super) struct Ring {
    /// The slots, `chunk_bytes` each.
    pub(super) slots: Vec<HostAlloc>,
    events: Vec<CudaEvent>,
    pending: Vec<bool>,
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
            events.push(
                ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map_err(drv("cuEventCreate"))?,
            );
        }
        Ok(Ring {
            pending: vec![false; slots.len()],
            slots,
            events,
            scratch: Vec::new(),
        })
    }
    /// The device scratch buffers, one per slot of `bytes` each (`bytes` is the ring's slot
    /// size; made on the first call, the ring's context current).
    pub(super) fn scratch(&mut self, bytes: usize) -> Result<Vec<u64>, StagedError> {
        while self.scratch.len() < self.slots.len() {
            // SAFETY: a plain allocation in the current context, owned by the ring.
            let p = unsafe { cu::malloc_sync(bytes.max(1)) }.map_err(drv("cuMemAlloc"))?;
            count_alloc!(Device, 1);
            self.scratch.push(DevScratch(p));
        }
        Ok(self.scratch.iter().map(|d| d.0).collect())
    }
    /// Waits for the slot's DMA, if one is pending.
    fn wait(&mut self, slot: usize) -> Result<(), StagedError> {
        if self.pending[slot] {
            self.pending[slot] = false;
            self.events[slot]
                .synchronize()
                .map_err(drv("cuEventSynchronize"))?;
        }
        Ok(())
    }
    /// Whether the slot's DMA is done (no wait).
    pub(super) fn poll(&mut self, slot: usize) -> Result<bool, StagedError> {
        if self.pending[slot] {
            if !self.events[slot]
                .try_is_complete()
                .map_err(drv("cuEventQuery"))?
            {
                return Ok(false);
            }
            self.pending[slot] = false;
        }
        Ok(true)
    }
    /// Records the slot's event on `stream`, after the slot's DMA.
    pub(super) fn record(&mut self, slot: usize, stream: &CudaStream) -> Result<(), StagedError> {
        #[cfg(feature = "fault-injection")]
        if crate::fault::fire(crate::fault::Fault::StagedRecord) {
            return Err(StagedError::Driver {
                op: "cuEventRecord",
                source: cu::DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE),
            });
        }
        self.events[slot]
            .record(stream)
            .map_err(drv("cuEventRecord"))?;
        self.pending[slot] = true;
        Ok(())
    }
    /// Waits for every slot (also on the error path, so no DMA outlives the copy).
    pub(super) fn drain(&mut self) -> Result<(), StagedError> {
        let mut first = Ok(());
        for s in 0..self.slots.len() {
            if let Err(e) = self.wait(s) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}
