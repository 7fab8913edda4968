//! `aml/higher/allocator/buddy.h`: a buddy allocator (blocks of powers of two, 64 bytes at
//! least, split on allocation and merged with their buddy when freed) over memory mapped from
//! an area in pools that double in size (AML's policy); and the low-level buddy allocator
//! (`struct buddy_allocator`, over memory the caller gives it), which AML exports too.

use super::{publish, take, AmlAllocator, AmlAllocatorChunk, AmlAllocatorOps, Pools};
use crate::area::AmlArea;
use crate::error::{fail, guard, guard_ptr, inval, AML_EBUSY, AML_ENOMEM, AML_SUCCESS};
use ferry_capi::Fail;
use foldhash::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

/// The smallest block: 2^6 = 64 bytes (AML's).
const MIN_ORDER: u32 = 6;
/// One free list per order.
const ORDERS: usize = usize::BITS as usize;

/// An allocated block: its order, and its chunk if it was allocated as one.
struct Used {
    order: u32,
    chunk: Option<Box<AmlAllocatorChunk>>,
}

/// `struct buddy_allocator` (opaque to C): regions of a power-of-two size, each split in
/// buddies; the bookkeeping is outside the memory.
#[derive(Default)]
pub struct BuddyAllocator {
    /// Region start -> size.
    regions: BTreeMap<usize, usize>,
    /// Free blocks by order (block size 2^order).
    free: Vec<BTreeSet<usize>>,
    /// Allocated blocks by address.
    used: HashMap<usize, Used>,
}

/// The order of the block that holds `size` bytes (at least `MIN_ORDER`), if any can.
fn order_for(size: usize) -> Option<u32> {
    size.max(1 << MIN_ORDER)
        .checked_next_power_of_two()
        .map(usize::trailing_zeros)
}

impl BuddyAllocator {
    fn new() -> Self {
        BuddyAllocator {
            free: vec![BTreeSet::new(); ORDERS],
            ..Default::default()
        }
    }

    /// Adds the region `[base, base + size)`: `size` a power of two of 64 bytes or more, not
    /// overlapping a region already added.
    fn extend(&mut self, base: usize, size: usize) -> Result<(), Fail> {
        if base == 0 || !size.is_power_of_two() || size < 1 << MIN_ORDER {
            return Err(inval(
                "the region is NULL, or its size not a power of two of 64 bytes or more",
            ));
        }
        let end = base
            .checked_add(size)
            .ok_or_else(|| inval("the region wraps around"))?;
        let before = self.regions.range(..end).next_back();
        if before.is_some_and(|(&b, &s)| b + s > base) {
            return Err(inval("the region overlaps one already added"));
        }
        self.regions.insert(base, size);
        self.free[size.trailing_zeros() as usize].insert(base);
        Ok(())
    }

    /// A free block of at least `size` bytes (split from a larger one if need be): its address
    /// and order, marked allocated.
    fn alloc(&mut self, size: usize) -> Option<(usize, u32)> {
        let want = order_for(size)?;
        let mut k = (want as usize..ORDERS).find(|&k| !self.free[k].is_empty())?;
        let addr = self.free[k].pop_first()?;
        while k > want as usize {
            k -= 1;
            self.free[k].insert(addr + (1 << k));
        }
        self.used.insert(
            addr,
            Used {
                order: want,
                chunk: None,
            },
        );
        Some((addr, want))
    }

    /// Frees the block at `addr`, merging it with its free buddies; its record, or None if
    /// `addr` is not an allocated block.
    fn release(&mut self, addr: usize) -> Option<Used> {
        let u = self.used.remove(&addr)?;
        let (&base, &rsize) = self.regions.range(..=addr).next_back()?;
        let (mut a, mut k) = (addr, u.order as usize);
        while (1usize << k) < rsize {
            let buddy = base + ((a - base) ^ (1 << k));
            if !self.free[k].remove(&buddy) {
                break;
            }
            a = a.min(buddy);
            k += 1;
        }
        self.free[k].insert(a);
        Some(u)
    }
}

/// Creates a low-level buddy allocator with no memory. `-AML_EINVAL` for NULL `out`.
///
/// # Safety
/// 1. `out` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn buddy_allocator_create(out: *mut *mut BuddyAllocator) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let o = unsafe { out.as_mut() }.ok_or_else(|| inval("out is NULL"))?;
        *o = Box::into_raw(Box::new(BuddyAllocator::new()));
        Ok(AML_SUCCESS)
    })
}

/// Gives the allocator `size` bytes at `ptr` (mapped by the caller, who unmaps them after
/// destroying it). `-AML_EINVAL` for a NULL allocator or `ptr`, a size not a power of two of
/// 64 bytes or more (AML's smallest block), or a region overlapping one already given.
///
/// # Safety
/// 1. `b` NULL or a valid low-level buddy allocator, not used concurrently.
#[no_mangle]
pub unsafe extern "C" fn buddy_allocator_extend(
    b: *mut BuddyAllocator,
    ptr: *mut c_void,
    size: usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let b = unsafe { b.as_mut() }.ok_or_else(|| inval("allocator is NULL"))?;
        b.extend(ptr as usize, size)?;
        Ok(AML_SUCCESS)
    })
}

/// Frees the allocator (not its memory) and sets `*buddy` NULL. `-AML_EBUSY` while blocks
/// are allocated (AML's); `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `buddy` NULL or valid; `*buddy` NULL or from `buddy_allocator_create`, not in use.
#[no_mangle]
pub unsafe extern "C" fn buddy_allocator_destroy(buddy: *mut *mut BuddyAllocator) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let slot = unsafe { buddy.as_mut() }.ok_or_else(|| inval("buddy is NULL"))?;
        // SAFETY: (1).
        let b = unsafe { slot.as_ref() }.ok_or_else(|| inval("*buddy is NULL"))?;
        if !b.used.is_empty() {
            return Err(fail(AML_EBUSY, "blocks are still allocated"));
        }
        // SAFETY: (1): from `Box::into_raw`.
        drop(unsafe { Box::from_raw(*slot) });
        *slot = std::ptr::null_mut();
        Ok(AML_SUCCESS)
    })
}

/// Frees the block at `ptr`. `-AML_EINVAL` for NULL, or a pointer not allocated by `b` (or
/// already freed).
///
/// # Safety
/// 1. `b` NULL or a valid low-level buddy allocator, not used concurrently.
#[no_mangle]
pub unsafe extern "C" fn buddy_allocator_free(b: *mut BuddyAllocator, ptr: *mut c_void) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let b = unsafe { b.as_mut() }.ok_or_else(|| inval("allocator is NULL"))?;
        b.release(ptr as usize)
            .ok_or_else(|| inval("not a block allocated by this allocator"))?;
        Ok(AML_SUCCESS)
    })
}

/// A block of at least `size` bytes in `*out`. `-AML_ENOMEM` if no free block is large
/// enough; `-AML_EINVAL` for NULL or size 0.
///
/// # Safety
/// 1. `b` NULL or a valid low-level buddy allocator, not used concurrently; `out` NULL or
///    valid for one write.
#[no_mangle]
pub unsafe extern "C" fn buddy_allocator_alloc(
    b: *mut BuddyAllocator,
    out: *mut *mut c_void,
    size: usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (Some(b), Some(o)) = (unsafe { b.as_mut() }, unsafe { out.as_mut() }) else {
            return Err(inval("allocator or out is NULL"));
        };
        if size == 0 {
            return Err(inval("size is 0"));
        }
        let (p, _) = b
            .alloc(size)
            .ok_or_else(|| fail(AML_ENOMEM, "no free block large enough"))?;
        *o = p as *mut c_void;
        Ok(AML_SUCCESS)
    })
}

/// The buddy allocator's data (`struct aml_allocator_buddy`, opaque in libaml).
pub struct BuddyData {
    inner: Mutex<State>,
}

/// What the buddy allocator's lock guards.
struct State {
    buddy: BuddyAllocator,
    pools: Pools,
    /// Chunk address -> block address, for the chunks handed out.
    chunks: HashMap<usize, usize>,
}

impl State {
    /// Frees the block at `addr` (and its chunk): false if it is not allocated.
    fn release(&mut self, addr: usize) -> bool {
        match self.buddy.release(addr) {
            Some(u) => {
                if let Some(c) = u.chunk {
                    self.chunks
                        .remove(&(&*c as *const AmlAllocatorChunk as usize));
                }
                true
            }
            None => false,
        }
    }
}

impl BuddyData {
    /// A block of at least `size` bytes, mapping a new pool when none is free: twice the
    /// last pool, or the block's size if larger, halved while the area refuses (down to the
    /// block's size), as AML.
    fn alloc(
        &self,
        size: usize,
        chunk: bool,
    ) -> Result<(usize, Option<*mut AmlAllocatorChunk>), Fail> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let State {
            buddy,
            pools,
            chunks,
        } = &mut *g;
        let (addr, order) = match buddy.alloc(size) {
            Some(x) => x,
            None => {
                let order = order_for(size).ok_or_else(|| fail(AML_ENOMEM, "size too large"))?;
                let want = 1usize << order;
                let mut len = want.max(pools.last_size().saturating_mul(2).min(1 << (ORDERS - 2)));
                let base = loop {
                    match pools.map(len) {
                        Ok(p) => break p,
                        Err(rc) if len / 2 < want => {
                            return Err(fail(-rc, "the area could not map a pool"))
                        }
                        Err(_) => len /= 2,
                    }
                };
                buddy.extend(base, len)?;
                buddy
                    .alloc(size)
                    .ok_or_else(|| fail(AML_ENOMEM, "no block in the new pool"))?
            }
        };
        if !chunk {
            return Ok((addr, None));
        }
        let mut c = Box::new(AmlAllocatorChunk {
            ptr: addr as *mut c_void,
            size: 1 << order,
            user_data: std::ptr::null_mut(),
        });
        let p: *mut AmlAllocatorChunk = &mut *c;
        chunks.insert(p as usize, addr);
        if let Some(u) = buddy.used.get_mut(&addr) {
            u.chunk = Some(c);
        }
        Ok((addr, Some(p)))
    }
}

/// The buddy allocator's methods (chunks included).
#[no_mangle]
pub static aml_allocator_buddy_ops: AmlAllocatorOps = AmlAllocatorOps {
    alloc: Some(aml_allocator_buddy_alloc),
    free: Some(aml_allocator_buddy_free),
    alloc_chunk: Some(aml_allocator_buddy_alloc_chunk),
    free_chunk: Some(aml_allocator_buddy_free_chunk),
};

/// Creates a buddy allocator over pools mapped from `area` with `opts` (kept, not owned: they
/// must outlive the allocator). The first pool is mapped at the first allocation.
/// `-AML_EINVAL` for a NULL `allocator` or `area`.
///
/// # Safety
/// 1. `allocator` NULL or valid for one write; `area` NULL or a valid area; `opts` NULL or
///    what the area expects; `area` and `opts` outlive the allocator.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_buddy_create(
    allocator: *mut *mut AmlAllocator,
    area: *mut AmlArea,
    opts: *mut c_void,
) -> c_int {
    guard(|| {
        if allocator.is_null() || area.is_null() {
            return Err(inval("allocator or area is NULL"));
        }
        let d = BuddyData {
            inner: Mutex::new(State {
                buddy: BuddyAllocator::new(),
                pools: Pools::new(area, opts),
                chunks: HashMap::default(),
            }),
        };
        // SAFETY: (1).
        unsafe { publish(allocator, d, &aml_allocator_buddy_ops) };
        Ok(AML_SUCCESS)
    })
}

/// Unmaps the pools (blocks still allocated included), frees the allocator and its chunks,
/// and sets `*allocator` NULL. `-AML_EINVAL` for NULL or an allocator of another kind.
///
/// # Safety
/// 1. `allocator` NULL or valid; `*allocator` NULL or a valid allocator, not in use.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_buddy_destroy(allocator: *mut *mut AmlAllocator) -> c_int {
    guard(|| {
        // SAFETY: (1).
        drop(unsafe { take::<BuddyData>(allocator, &aml_allocator_buddy_ops) }?);
        Ok(AML_SUCCESS)
    })
}

/// The buddy allocator's `alloc`: a block of at least `size` bytes (size 0: the smallest
/// block, as AML); NULL with `aml_errno` on failure.
///
/// # Safety
/// 1. `data` NULL or a buddy allocator's data.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_buddy_alloc(data: *mut c_void, size: usize) -> *mut c_void {
    guard_ptr(|| {
        // SAFETY: (1).
        let d = unsafe { super::data::<BuddyData>(data) }?;
        Ok(d.alloc(size, false)?.0 as *mut c_void)
    })
}

/// The buddy allocator's `free`. `-AML_EINVAL` for a pointer it did not allocate (or freed).
///
/// # Safety
/// 1. `data` NULL or a buddy allocator's data.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_buddy_free(data: *mut c_void, ptr: *mut c_void) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let d = unsafe { super::data::<BuddyData>(data) }?;
        let mut g = d.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !g.release(ptr as usize) {
            return Err(inval("not a pointer of this allocator"));
        }
        Ok(AML_SUCCESS)
    })
}

/// The buddy allocator's `alloc_chunk`: the block with its size (a power of two); NULL with
/// `aml_errno` on failure. (AML exports it without declaring it.)
///
/// # Safety
/// 1. `data` NULL or a buddy allocator's data.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_buddy_alloc_chunk(
    data: *mut c_void,
    size: usize,
) -> *mut AmlAllocatorChunk {
    guard_ptr(|| {
        // SAFETY: (1).
        let d = unsafe { super::data::<BuddyData>(data) }?;
        d.alloc(size, true)?
            .1
            .ok_or_else(|| fail(crate::error::AML_FAILURE, "no chunk"))
    })
}

/// The buddy allocator's `free_chunk`. `-AML_EINVAL` for a chunk it did not allocate. (AML
/// exports it without declaring it.)
///
/// # Safety
/// 1. `data` NULL or a buddy allocator's data (`chunk` is looked up, not read).
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_buddy_free_chunk(
    data: *mut c_void,
    chunk: *mut AmlAllocatorChunk,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let d = unsafe { super::data::<BuddyData>(data) }?;
        let mut g = d.inner.lock().unwrap_or_else(|e| e.into_inner());
        let addr = *g
            .chunks
            .get(&(chunk as usize))
            .ok_or_else(|| inval("not a chunk of this allocator"))?;
        g.release(addr);
        Ok(AML_SUCCESS)
    })
}
