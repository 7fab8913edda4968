//! The bounce ring: `depth` buffers of `chunk` bytes, page-aligned, that device transfers (and
//! unaligned `O_DIRECT` ones) go through; pinned when the file engine has an engine to DMA from
//! them and a CUDA driver is present, plain aligned host memory otherwise.
//!
//! Not the staging ring (`staging/ring.rs`, which the staged copies and the GPU pipeline's
//! bounce buffers share), on purpose: that ring lends slot `i % depth` to chunk `i`, to one
//! thread that issues the chunks in order, and a slot completes when the work recorded on it
//! (an event, a request) has ended. Here many runner threads (and io_uring runners, several
//! slots each) take slots at once, in no order, each holding one only for its own blocking
//! read or write and the move to or from the buffer; a slot completes when its runner hands it
//! back ([`SlotGuard`]'s drop, on every path). In chunk order a runner would wait for the slot
//! another runner holds while others are free, so this is a free list under a lock.

use super::error::FileError;
use super::io::DIRECT_ALIGN;
use crate::memory::MemKind;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

static LIVE_SLOTS: AtomicUsize = AtomicUsize::new(0);

/// Bounce buffers alive in this process, over every file engine (for leak tests).
pub fn live_bounce_buffers() -> usize {
    LIVE_SLOTS.load(Ordering::Acquire)
}

enum SlotMem {
    Pinned(crate::cuda::PinnedBuffer),
    Host(crate::memory::AlignedBuffer),
}

pub(crate) struct Slot {
    mem: SlotMem,
    pub(super) len: usize,
}

// SAFETY: a slot is plain memory owned by this value; one runner uses it at a time (it is taken
// out of the ring's free list while in use).
unsafe impl Send for Slot {}

impl Slot {
    /// `pinned`: try page-locked memory first (needed only when an engine DMAs from the slot).
    fn new(len: usize, pinned: bool) -> Result<Slot, FileError> {
        let pinned = if pinned {
            crate::cuda::PinnedBuffer::new(len.saturating_add(DIRECT_ALIGN))
        } else {
            Err(crate::cuda::CudaError::NoDriver("not asked for".into()))
        };
        let mem = match pinned {
            Ok(p) => SlotMem::Pinned(p),
            Err(crate::cuda::CudaError::NoDriver(_)) => SlotMem::Host(
                crate::memory::AlignedBuffer::new(len)
                    .map_err(|e| FileError::Setup(format!("a bounce buffer: {e}")))?,
            ),
            Err(e) => return Err(e.into()),
        };
        LIVE_SLOTS.fetch_add(1, Ordering::AcqRel);
        Ok(Slot { mem, len })
    }
    pub(crate) fn kind(&self) -> MemKind {
        match self.mem {
            SlotMem::Pinned(_) => MemKind::Pinned,
            SlotMem::Host(_) => MemKind::Pageable,
        }
    }
    pub(super) fn ptr(&mut self) -> *mut u8 {
        match &mut self.mem {
            // From the first `DIRECT_ALIGN` boundary: the driver aligns large pinned
            // allocations to pages, but carves small ones from shared blocks, after which a
            // 1 MiB one may start anywhere (run 85). In bounds: the buffer holds
            // `DIRECT_ALIGN` bytes more than `len`.
            SlotMem::Pinned(p) => {
                let skip = (p.as_ptr() as usize).wrapping_neg() % DIRECT_ALIGN;
                p[skip..].as_mut_ptr()
            }
            SlotMem::Host(b) => b.as_mut_ptr(),
        }
    }
    pub(super) fn bytes(&mut self, len: usize) -> &mut [u8] {
        let len = len.min(self.len);
        let p = self.ptr();
        // SAFETY: the slot owns `self.len >= len` initialised (zeroed at allocation) bytes,
        // borrowed exclusively through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        LIVE_SLOTS.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(crate) struct Ring {
    free: Mutex<Vec<Slot>>,
    cond: Condvar,
    pub(crate) kind: MemKind,
    pub(crate) depth: usize,
    /// Bytes allocated for the slots, all of them.
    pub(crate) bytes: usize,
}

impl Ring {
    /// `depth` buffers of `chunk` bytes; `pinned`: page-locked when a CUDA driver is present.
    pub(crate) fn new(depth: usize, chunk: usize, pinned: bool) -> Result<Ring, FileError> {
        // Room for the aligned span around a chunk at an unaligned offset (`O_DIRECT`).
        let room = chunk
            .div_ceil(DIRECT_ALIGN)
            .saturating_add(1)
            .saturating_mul(DIRECT_ALIGN);
        let slots = (0..depth)
            .map(|_| Slot::new(room, pinned))
            .collect::<Result<Vec<_>, _>>()?;
        let kind = slots.first().map_or(MemKind::Pageable, Slot::kind);
        let extra = if kind == MemKind::Pinned {
            DIRECT_ALIGN
        } else {
            0
        };
        Ok(Ring {
            free: Mutex::new(slots),
            cond: Condvar::new(),
            kind,
            depth,
            bytes: depth.saturating_mul(room.saturating_add(extra)),
        })
    }
    /// Takes a free slot, waiting for one (each runner holds at most one, so one comes back).
    pub(super) fn take(self: &Arc<Self>) -> SlotGuard {
        let mut g = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(s) = g.pop() {
                return SlotGuard {
                    ring: Arc::clone(self),
                    slot: Some(s),
                };
            }
            g = self.cond.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// A free slot if one is there now (the io_uring runner's second and later slots).
    pub(super) fn try_take(self: &Arc<Self>) -> Option<SlotGuard> {
        let s = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()?;
        Some(SlotGuard {
            ring: Arc::clone(self),
            slot: Some(s),
        })
    }
}

/// A slot out of the ring; back into it on drop, on every path.
pub(crate) struct SlotGuard {
    ring: Arc<Ring>,
    slot: Option<Slot>,
}

impl SlotGuard {
    pub(super) fn slot(&mut self) -> &mut Slot {
        self.slot
            .as_mut()
            .expect("a guard holds its slot until dropped")
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(s) = self.slot.take() {
            self.ring
                .free
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(s);
            self.ring.cond.notify_one();
        }
    }
}
