//! The pipeline that drives a staged copy: the workers copy parts of chunks between host
//! memory and the ring's slots, the calling thread issues each chunk's DMA between a slot and
//! the device and retires it through the slot's event.

use super::chunk::{add, Chunk, Chunker, Sides};
use super::error::drv;
use super::handoff::{Dma, Handoff};
use super::ring::Ring;
use super::Direction;
use super::StagedError;
use super::StagingConfig;
use crate::staging::copy::{copy_bytes, piece};
use crate::staging::policy::workers_for;
use crate::staging::Pool;
use cudarc::driver::{sys, CudaStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

#[cfg(feature = "fault-injection")]
use cudarc::driver::result::DriverError;

/// Largest pitch `cuMemcpy2D` takes on every device we know (CU_DEVICE_ATTRIBUTE_MAX_PITCH is
/// 2^31 - 1 on current GPUs).
const MAX_PITCH: usize = (1 << 31) - 1;

/// A raw pointer the pool's workers share (they touch disjoint bytes). `Sync` only: the
/// workers reach it through the job they share, and copy it out on their own thread.
#[derive(Clone, Copy)]
pub(super) struct SyncPtr(pub(super) *mut u8);
// SAFETY: used only to hand disjoint byte ranges to the pool's workers, which finish before the
// copy returns.
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    /// The address `off` bytes on (a method, so closures capture the `Sync` wrapper).
    pub(super) fn at(self, off: usize) -> *mut u8 {
        self.0.wrapping_add(off)
    }
}

/// The coordinator of one staged copy over a stager's pool, as its settings say ([`Flow::run`]).
pub(super) struct Flow<'a> {
    /// The stager's workers.
    pub(super) pool: &'a Pool,
    /// The stager's settings (which copies use non-temporal stores).
    pub(super) cfg: &'a StagingConfig,
}

impl Flow<'_> {
    /// Part `i` of `t` of chunk `k`'s host-side copy (`to_slot`: host -> slot, else slot ->
    /// host). The parts of one chunk touch disjoint bytes; together they cover the chunk.
    fn part(&self, job: &dyn Chunks, k: usize, slot: SyncPtr, to_slot: bool, i: usize, t: usize) {
        #[cfg(feature = "fault-injection")]
        if crate::fault::fire(crate::fault::Fault::StagingWorkerPanic) {
            panic!("injected panic");
        }
        let nt = if to_slot {
            self.cfg.non_temporal_h2d
        } else {
            self.cfg.non_temporal
        };
        job.part(k, slot, to_slot, i, t, nt);
    }

    /// The flowing pipeline: the workers take parts of chunks in order from a shared counter
    /// (no barrier between chunks: a worker done with its part of chunk `k` starts on chunk
    /// `k+1` while others finish `k`), and this thread issues each chunk's DMA as soon as all its
    /// parts are in (host -> device), or opens a chunk to the workers as soon as its DMA is done
    /// (device -> host), polling the ring's events: the hand-off is `handoff.rs`'s.
    pub(super) fn run(
        &self,
        ring: &mut Ring,
        job: &dyn Chunks,
        dir: Direction,
    ) -> Result<(), StagedError> {
        let t = workers_for(self.pool.threads(), job.bytes());
        let depth = ring.depth();
        let slots: Vec<SyncPtr> = ring.slot_ptrs().into_iter().map(SyncPtr).collect();
        let h2d = dir == Direction::HostToDevice;
        let hand = Handoff::new(job.count(), t, depth, h2d);
        let worker = |_: usize| {
            while let Some((k, i)) = hand.take() {
                let r = catch_unwind(AssertUnwindSafe(|| {
                    self.part(job, k, slots[k % depth], h2d, i, hand.parts())
                }));
                if r.is_err() {
                    hand.stop();
                    // Re-raised as the pool's `WorkerPanicked`.
                    std::panic::resume_unwind(Box::new("staging part panicked"));
                }
                hand.finished(k);
            }
        };
        let coordinate = || -> Result<(), StagedError> {
            // Whether the coordinator fails or panics (a bug, in it or in a chunk's device
            // side), the workers must stop: they wait for chunks it would open, and the pool
            // waits for them before it returns (or unwinds).
            let r = catch_unwind(AssertUnwindSafe(|| {
                let mut device = Device { ring, job };
                if h2d {
                    hand.coordinate_h2d(&mut device)
                } else {
                    hand.coordinate_d2h(&mut device)
                }
            }));
            if !matches!(r, Ok(Ok(()))) {
                hand.stop();
            }
            r.unwrap_or_else(|p| std::panic::resume_unwind(p))
        };
        self.pool.run_with(t, &worker, coordinate)
    }
}

/// The device side of a staged copy for [`Handoff`]'s coordinators: each chunk's DMA on the
/// job's stream, its end marked by its slot's event in the ring.
struct Device<'r, 'j> {
    ring: &'r mut Ring,
    job: &'j dyn Chunks,
}

impl Dma for Device<'_, '_> {
    type Error = StagedError;
    fn stopped() -> StagedError {
        StagedError::WorkerPanicked
    }
    unsafe fn issue(&mut self, k: usize, slot: usize, h2d: bool) -> Result<(), StagedError> {
        let job = self.job;
        self.ring.enqueue(slot, job.stream(), |ptr| {
            // SAFETY: the slot is this DMA's alone until the ring knows it ended (its event,
            // recorded by `enqueue`, or the drain's synchronization): `Dma::issue`'s contract,
            // which the hand-off keeps; the device range is valid by `copy`'s contract.
            unsafe { issue(job, k, slot, ptr, h2d) }
        })
    }
    fn poll(&mut self, slot: usize) -> Result<bool, StagedError> {
        self.ring.poll(slot)
    }
}

/// One staged copy as the pipeline drives it: its chunks, the workers' host-side part of each
/// and the coordinator's device-side DMA of each. A plan ([`Staging`]) and a segment list
/// (`segments::SegStaging`) are the two kinds.
pub(super) trait Chunks: Sync {
    /// How many chunks.
    fn count(&self) -> usize;
    /// Bytes the copy moves (sets how many workers it gets).
    fn bytes(&self) -> usize;
    /// The stream the DMAs go on.
    fn stream(&self) -> &Arc<CudaStream>;
    /// Part `i` of `t` of chunk `k`'s host-side copy between host memory and the ring slot
    /// `slot` (`to_slot`: host -> slot), with non-temporal stores when `nt`. The parts of one
    /// chunk touch disjoint bytes; together they cover the chunk.
    fn part(&self, k: usize, slot: SyncPtr, to_slot: bool, i: usize, t: usize, nt: bool);
    /// Issues the device side of chunk `k` between the ring slot number `slot` (at `ptr`) and
    /// the device (`h2d`: slot -> device), on [`Chunks::stream`].
    ///
    /// # Safety
    /// 1. `ptr` holds at least the chunk's bytes and stays valid until the work enqueued here
    ///    has ended (the ring's event recorded after this call, or a synchronization).
    /// 2. The chunk's device bytes are valid device memory of the stream's context.
    unsafe fn device_side(
        &self,
        k: usize,
        slot: usize,
        ptr: *mut u8,
        h2d: bool,
    ) -> Result<(), StagedError>;
}

/// [`Chunks::device_side`], or the injected failure (or panic) of a chunk's device side.
///
/// # Safety
/// As [`Chunks::device_side`].
unsafe fn issue(
    job: &dyn Chunks,
    k: usize,
    slot: usize,
    ptr: *mut u8,
    h2d: bool,
) -> Result<(), StagedError> {
    #[cfg(feature = "fault-injection")]
    if crate::fault::fire(crate::fault::Fault::StagingCoordinatorPanic) {
        panic!("injected panic");
    }
    #[cfg(feature = "fault-injection")]
    if crate::fault::fire(crate::fault::Fault::StagedChunk) {
        return Err(StagedError::Driver {
            op: if h2d {
                "cuMemcpyHtoDAsync"
            } else {
                "cuMemcpyDtoHAsync"
            },
            source: DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
        });
    }
    // SAFETY: forwarded contract.
    unsafe { job.device_side(k, slot, ptr, h2d) }
}

/// One DMA of `len` bytes between pinned host memory at `host` and device memory at `dev` on
/// `cs` (`h2d`: host -> device).
///
/// # Safety
/// 1. `host` is `len` bytes of pinned memory, `dev` `len` bytes of device memory of the
///    stream's context, both valid and untouched by others until the stream passes the copy.
pub(super) unsafe fn dma(
    cs: sys::CUstream,
    dev: u64,
    host: *mut u8,
    len: usize,
    h2d: bool,
) -> Result<(), StagedError> {
    #[cfg(feature = "fault-injection")]
    if crate::fault::fire(crate::fault::Fault::StagedDma) {
        return Err(StagedError::Driver {
            op: if h2d {
                "cuMemcpyHtoDAsync"
            } else {
                "cuMemcpyDtoHAsync"
            },
            source: DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE),
        });
    }
    if h2d {
        // SAFETY: this function's contract.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dev, host as *const _, len, cs) }
            .result()
            .map_err(drv("cuMemcpyHtoDAsync"))
    } else {
        // SAFETY: this function's contract.
        unsafe { sys::cuMemcpyDtoHAsync_v2(host as *mut _, dev, len, cs) }
            .result()
            .map_err(drv("cuMemcpyDtoHAsync"))
    }
}

/// One copy in flight: what the loops need.
pub(super) struct Staging<'a> {
    pub(super) sides: Sides<'a>,
    pub(super) chunker: &'a Chunker,
    pub(super) dev: u64,
    pub(super) host: SyncPtr,
    pub(super) stream: &'a Arc<CudaStream>,
}

impl Chunks for Staging<'_> {
    fn count(&self) -> usize {
        self.chunker.count()
    }
    fn bytes(&self) -> usize {
        self.sides.plan.total_bytes()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
    fn part(&self, k: usize, slot: SyncPtr, to_slot: bool, i: usize, t: usize, nt: bool) {
        let host = self.host;
        let sides = self.sides;
        let run = self.chunker.run;
        let copy = |a: *const u8, b: *mut u8, len: usize| {
            // SAFETY: `a`/`b` lie in the caller's buffers (contract of `Stager::copy`) or in the
            // slot, for `len` bytes; the parts' ranges are disjoint.
            unsafe { copy_bytes(a, b, len, nt) }
        };
        match self.chunker.get(k) {
            Chunk::Piece { run: r, at, len } => {
                let (_, h) = sides.run_at(r);
                let h = h + at;
                // Split at 4 KiB boundaries; small pieces stay on few parts.
                let Some((start, l)) = piece(len, t, i) else {
                    return;
                };
                let (hp, sp) = (host.at(h + start), slot.at(start));
                if to_slot {
                    copy(hp, sp, l)
                } else {
                    copy(sp, hp, l)
                }
            }
            Chunk::Runs { first, count } => {
                let (a, b) = (count * i / t, count * (i + 1) / t);
                for k in a..b {
                    let (_, h) = sides.run_at(first + k);
                    let (hp, sp) = (host.at(h), slot.at(k * run));
                    if to_slot {
                        copy(hp, sp, run)
                    } else {
                        copy(sp, hp, run)
                    }
                }
            }
        }
    }

    /// Issues the DMA between a ring slot and the device for chunk `k` (`h2d`: slot -> device).
    ///
    /// # Safety
    /// 1. `slot` holds at least the chunk's bytes and stays valid until the work enqueued here
    ///    has ended (the ring's event recorded after this call, or a synchronization).
    /// 2. The chunk's device bytes are valid device memory of the stream's context.
    unsafe fn device_side(
        &self,
        k: usize,
        _slot: usize,
        slot: *mut u8,
        h2d: bool,
    ) -> Result<(), StagedError> {
        let chunk = self.chunker.get(k);
        let cs = self.stream.cu_stream();
        let one = |dev: u64, host: *mut u8, len: usize| -> Result<(), StagedError> {
            // SAFETY: `host` is `len` bytes of the pinned slot, `dev` `len` valid device bytes
            // (this function's contract).
            unsafe { dma(cs, dev, host, len, h2d) }
        };
        match chunk {
            Chunk::Piece { run, at, len } => {
                let (d, _) = self.sides.run_at(run);
                one(add(self.dev, d + at)?, slot, len)
            }
            Chunk::Runs { first, count } => {
                let run = self.chunker.run;
                let Some((pitch, inner)) = self.sides.dev_inner() else {
                    let (d, _) = self.sides.run_at(first);
                    return one(add(self.dev, d)?, slot, run * count);
                };
                let two_d = pitch >= run && pitch <= MAX_PITCH;
                let mut k = 0;
                while k < count {
                    // Runs k.. up to the end of this sweep of the innermost dim share one pitch.
                    let j = (first + k) % inner;
                    let rows = (inner - j).min(count - k);
                    let (d, _) = self.sides.run_at(first + k);
                    let sp = slot.wrapping_add(k * run);
                    if pitch == run || rows == 1 {
                        one(add(self.dev, d)?, sp, run * rows)?;
                    } else if two_d {
                        let dev = add(self.dev, d)?;
                        let (host_t, dev_t) = (
                            sys::CUmemorytype::CU_MEMORYTYPE_HOST,
                            sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                        );
                        let mut p = sys::CUDA_MEMCPY2D {
                            srcXInBytes: 0,
                            srcY: 0,
                            srcMemoryType: dev_t,
                            srcHost: std::ptr::null(),
                            srcDevice: 0,
                            srcArray: std::ptr::null_mut(),
                            srcPitch: 0,
                            dstXInBytes: 0,
                            dstY: 0,
                            dstMemoryType: dev_t,
                            dstHost: std::ptr::null_mut(),
                            dstDevice: 0,
                            dstArray: std::ptr::null_mut(),
                            dstPitch: 0,
                            WidthInBytes: run,
                            Height: rows,
                        };
                        if h2d {
                            p.srcMemoryType = host_t;
                            p.srcHost = sp as *const _;
                            p.srcPitch = run;
                            p.dstDevice = dev;
                            p.dstPitch = pitch;
                        } else {
                            p.srcDevice = dev;
                            p.srcPitch = pitch;
                            p.dstMemoryType = host_t;
                            p.dstHost = sp as *mut _;
                            p.dstPitch = run;
                        }
                        // SAFETY: the descriptor names `rows` rows of `run` bytes in the slot and
                        // in valid device memory (this function's contract).
                        unsafe { sys::cuMemcpy2DAsync_v2(&p, cs) }
                            .result()
                            .map_err(drv("cuMemcpy2DAsync"))?;
                    } else {
                        for r in 0..rows {
                            one(add(self.dev, d + r * pitch)?, sp.wrapping_add(r * run), run)?;
                        }
                    }
                    k += rows;
                }
                Ok(())
            }
        }
    }
}
