//! `aml/higher/allocator/buddy.h`: a buddy allocator (blocks of powers of two, 64 bytes at
//! least, split on allocation and merged with their buddy when freed) over memory mapped from
//! an area in pools that double in size (AML's policy); and the low-level buddy allocator
//! (`struct buddy_allocator`, over memory the caller gives it), which AML exports too.

use super::{publish, take, AmlAllocator, AmlAllocatorChunk, AmlAllocatorOps, Pools};
use crate::area::AmlArea;
use crate::error::{fail, guard, guard_ptr, inval, plain, AML_EBUSY, AML_ENOMEM, AML_SUCCESS};
use ferry_capi::Fail;
use foldhash::HashMap;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

/// The smallest block: 2^6 = 64 bytes (AML's).
const MIN_ORDER: u32 = 6;
/// One free list per order.
const ORDERS: usize = usize::BITS as usize;

/// No node (`Node::prev` / `Node::next` at a region's ends).
const NONE: u32 = u32::MAX;

/// A block of the regions' current partition, free or allocated (AML's `struct
/// buddy_chunk`, kept in a slab outside the memory).
struct Node {
    /// Its address.
    addr: usize,
    /// Its size is 2^order.
    order: u8,
    /// Free (in `free[order]`, at `pos`) or allocated.
    free: bool,
    /// Its index in `free[order]` while free (a buddy leaves its list in O(1) when merged).
    pos: u32,
    /// The region it lies in (an index into `spans`).
    region: u32,
    /// The blocks before and after it in its region (`NONE` at the ends): a block's buddy, if
    /// whole, is one of them.
    prev: u32,
    next: u32,
    /// Its chunk, if it was allocated as one.
    chunk: Option<Box<AmlAllocatorChunk>>,
}

/// `struct buddy_allocator` (opaque to C): regions of a power-of-two size, each split in
/// buddies; the bookkeeping is outside the memory. As AML's: the blocks of each region are a
/// list in address order (a free block finds its buddy next to it), the free ones are also on
/// a stack of their order (an allocation pops), and the allocated ones in a table by address
/// (a free finds its block). The blocks are in a slab, so a split or a merge allocates
/// nothing once the slab has grown.
pub struct BuddyAllocator {
    /// Region start -> size (overlap check on extend).
    regions: BTreeMap<usize, usize>,
    /// The regions by index: start and size (the region's first block is never merged away,
    /// so it stays the same node: the one `extend` made).
    spans: Vec<(usize, usize)>,
    /// The blocks; those in `spare` are unused.
    nodes: Vec<Node>,
    /// Unused slots of `nodes`.
    spare: Vec<u32>,
    /// Free blocks (indices into `nodes`) by order (block size 2^order).
    free: [Vec<u32>; ORDERS],
    /// Bit k set when `free[k]` is not empty.
    nonempty: u64,
    /// Allocated blocks: address -> index into `nodes`.
    used: HashMap<usize, u32>,
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
            regions: BTreeMap::new(),
            spans: Vec::new(),
            nodes: Vec::new(),
            spare: Vec::new(),
            free: std::array::from_fn(|_| Vec::new()),
            nonempty: 0,
            used: HashMap::default(),
        }
    }

    /// A new free node (not yet on a free list): its index, or None past `u32::MAX - 1`
    /// blocks.
    fn new_node(&mut self, node: Node) -> Option<u32> {
        if let Some(i) = self.spare.pop() {
            *self.nodes.get_mut(i as usize)? = node;
            return Some(i);
        }
        let i = u32::try_from(self.nodes.len())
            .ok()
            .filter(|&i| i != NONE)?;
        self.nodes.push(node);
        Some(i)
    }

    /// Pushes the free node `i` of order `order` on its stack, noting its position.
    fn push_free(&mut self, i: u32, order: usize) {
        let Some(list) = self.free.get_mut(order) else {
            return;
        };
        let pos = list.len() as u32;
        list.push(i);
        self.nonempty |= 1u64.wrapping_shl(order as u32);
        if let Some(n) = self.nodes.get_mut(i as usize) {
            n.pos = pos;
        }
    }

    /// Takes the node at position `pos` off `free[order]` (the last one moves into its
    /// place, its position updated).
    fn unlink_free(&mut self, order: usize, pos: u32) {
        let Some(list) = self
            .free
            .get_mut(order)
            .filter(|l| (pos as usize) < l.len())
        else {
            return;
        };
        list.swap_remove(pos as usize);
        if let Some(&moved) = list.get(pos as usize) {
            if let Some(n) = self.nodes.get_mut(moved as usize) {
                n.pos = pos;
            }
        }
        if list.is_empty() {
            self.nonempty &= !1u64.wrapping_shl(order as u32);
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
        let too_many = || fail(AML_ENOMEM, "too many regions or blocks");
        let region = u32::try_from(self.spans.len()).map_err(|_| too_many())?;
        let order = size.trailing_zeros() as usize;
        let i = self
            .new_node(Node {
                addr: base,
                order: order as u8,
                free: true,
                pos: 0,
                region,
                prev: NONE,
                next: NONE,
                chunk: None,
            })
            .ok_or_else(too_many)?;
        self.regions.insert(base, size);
        self.spans.push((base, size));
        self.push_free(i, order);
        Ok(())
    }

    /// A free block of at least `size` bytes (split from a larger one if need be): its address
    /// and order, marked allocated. None if no free block is large enough.
    ///
    /// This and [`release`](Self::release) run without the unwind guard on the hot path, so
    /// they hold no code that can panic: no indexing, wrapping arithmetic (the invariants keep
    /// it in range), and vectors that grow by at most 64 entries a call (a capacity overflow
    /// would need more than the address space).
    fn alloc(&mut self, size: usize) -> Option<(usize, u32)> {
        let want = order_for(size)? as usize;
        // The smallest order >= want with a free block.
        let above = self.nonempty.checked_shr(want as u32).unwrap_or(0);
        if above == 0 {
            return None;
        }
        let mut k = want.wrapping_add(above.trailing_zeros() as usize);
        let i = *self.free.get(k)?.last()?;
        let (addr, region) = {
            let n = self.nodes.get(i as usize)?;
            (n.addr, n.region)
        };
        // Room for the halves split off (each a node) before anything changes.
        let fresh = k.saturating_sub(want).saturating_sub(self.spare.len());
        if self.nodes.len().saturating_add(fresh) >= NONE as usize {
            return None;
        }
        self.nodes.try_reserve(fresh).ok()?;
        self.used.try_reserve(1).ok()?;
        let top = self.free.get(k)?.len().wrapping_sub(1) as u32;
        self.unlink_free(k, top);
        // Split: the right halves go free, the left one keeps the node.
        while k > want {
            k = k.wrapping_sub(1);
            let next = self.nodes.get(i as usize)?.next;
            let r = self.new_node(Node {
                addr: addr.wrapping_add(1usize.wrapping_shl(k as u32)),
                order: k as u8,
                free: true,
                pos: 0,
                region,
                prev: i,
                next,
                chunk: None,
            })?;
            if let Some(n) = self.nodes.get_mut(next as usize) {
                n.prev = r;
            }
            self.nodes.get_mut(i as usize)?.next = r;
            self.push_free(r, k);
        }
        let n = self.nodes.get_mut(i as usize)?;
        n.order = want as u8;
        n.free = false;
        self.used.insert(addr, i);
        Some((addr, want as u32))
    }

    /// Frees the block at `addr`, merging it with its free buddies: its chunk (if it was
    /// allocated as one) in `Some`, or None if `addr` is not an allocated block.
    fn release(&mut self, addr: usize) -> Option<Option<Box<AmlAllocatorChunk>>> {
        let mut i = self.used.remove(&addr)?;
        let n = self.nodes.get_mut(i as usize)?;
        let chunk = n.chunk.take();
        let (mut k, region) = (n.order as usize, n.region);
        let &(base, rsize) = self.spans.get(region as usize)?;
        while 1usize.checked_shl(k as u32).is_some_and(|s| s < rsize) {
            let n = self.nodes.get(i as usize)?;
            // The buddy follows a left half and precedes a right one; it is whole if that
            // neighbour has the same order.
            let left = n.addr.wrapping_sub(base) & 1usize.wrapping_shl(k as u32) == 0;
            let j = if left { n.next } else { n.prev };
            let Some(b) = self
                .nodes
                .get(j as usize)
                .filter(|b| b.free && b.order as usize == k)
            else {
                break;
            };
            let pos = b.pos;
            self.unlink_free(k, pos);
            // The left one stays, as the merged block; the right one's node is dropped.
            let (l, r) = if left { (i, j) } else { (j, i) };
            let after = self.nodes.get(r as usize)?.next;
            if let Some(a) = self.nodes.get_mut(after as usize) {
                a.prev = l;
            }
            self.nodes.get_mut(l as usize)?.next = after;
            self.spare.push(r);
            i = l;
            k = k.wrapping_add(1);
        }
        let n = self.nodes.get_mut(i as usize)?;
        n.order = k as u8;
        n.free = true;
        self.push_free(i, k);
        Some(chunk)
    }

    /// Gives the allocated block at `addr` its chunk.
    fn set_chunk(&mut self, addr: usize, chunk: Box<AmlAllocatorChunk>) {
        if let Some(&i) = self.used.get(&addr) {
            if let Some(n) = self.nodes.get_mut(i as usize) {
                n.chunk = Some(chunk);
            }
        }
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
            Some(chunk) => {
                if let Some(c) = chunk {
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
        buddy.set_chunk(addr, c);
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
    // A block of the pools already mapped is taken without the unwind guard (this runs once
    // per allocation, and the slab's `alloc` cannot panic); mapping a pool runs in the guard.
    // SAFETY: (1).
    if let Ok(d) = unsafe { super::data::<BuddyData>(data) } {
        let mut g = d.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((addr, _)) = g.buddy.alloc(size) {
            return addr as *mut c_void;
        }
    }
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
    // Without the unwind guard, as `aml_allocator_buddy_alloc`: the slab's `release` cannot
    // panic, nor can dropping a chunk.
    // SAFETY: (1).
    let d = match unsafe { super::data::<BuddyData>(data) } {
        Ok(d) => d,
        Err(e) => return plain(Err(e)),
    };
    let mut g = d.inner.lock().unwrap_or_else(|e| e.into_inner());
    if !g.release(ptr as usize) {
        return plain(Err(inval("not a pointer of this allocator")));
    }
    AML_SUCCESS
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

#[cfg(test)]
mod tests {
    use super::{order_for, BuddyAllocator, MIN_ORDER, NONE};
    use proptest::prelude::*;

    /// The allocator's own bookkeeping agrees with itself: each region's block list tiles
    /// it exactly (aligned blocks, links both ways), every node is in a list or spare, each
    /// free block is on its order's stack at its position, each allocated one in `used`, and
    /// the non-empty mask matches the stacks.
    fn check_books(b: &BuddyAllocator) {
        let mut seen = 0;
        for (r, &(base, size)) in b.spans.iter().enumerate() {
            let (mut at, mut i, mut prev) = (base, r_head(b, base), NONE);
            while i != NONE {
                let n = &b.nodes[i as usize];
                let s = 1usize << n.order;
                assert_eq!(n.addr, at, "a gap or overlap in the partition");
                assert_eq!((at - base) % s, 0, "a block not aligned within its region");
                assert_eq!((n.prev, n.region as usize), (prev, r), "bad links");
                if n.free {
                    assert_eq!(b.free[n.order as usize][n.pos as usize], i, "off its stack");
                } else {
                    assert_eq!(b.used[&n.addr], i, "allocated but not in used");
                }
                (at, prev, i) = (at + s, i, n.next);
                seen += 1;
            }
            assert_eq!(at, base + size, "the blocks do not end at the region's end");
        }
        assert_eq!(seen + b.spare.len(), b.nodes.len(), "nodes lost");
        for (k, list) in b.free.iter().enumerate() {
            assert_eq!(
                b.nonempty >> k & 1 == 1,
                !list.is_empty(),
                "mask of order {k}"
            );
        }
        let nfree: usize = b.free.iter().map(Vec::len).sum();
        assert_eq!(nfree + b.used.len(), seen);
    }

    /// The node of the block at `base` (a region's first block, never merged away).
    fn r_head(b: &BuddyAllocator, base: usize) -> u32 {
        b.nodes
            .iter()
            .enumerate()
            .find(|(i, n)| n.addr == base && !b.spare.contains(&(*i as u32)))
            .map(|(i, _)| i as u32)
            .expect("a region without its first block")
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(usize),
        Free(usize),
        /// A pointer that is not an allocated block's start: inside a live block, or one freed.
        BadFree(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1usize..=1 << 13).prop_map(Op::Alloc),
            3 => any::<usize>().prop_map(Op::Free),
            1 => any::<usize>().prop_map(Op::BadFree),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Random allocations and frees over regions at unaligned bases, against a model of
        /// the live blocks: no overlap, every block within a region and aligned there, sizes
        /// as asked; an allocation fails only where no aligned range of its block size is
        /// free; bad frees refused; and once all is freed, each region is one free block.
        #[test]
        fn random_alloc_free_matches_model(
            orders in prop::collection::vec(MIN_ORDER..=14u32, 1..4),
            skew in 0usize..64,
            ops in prop::collection::vec(op(), 1..300),
        ) {
            let mut b = BuddyAllocator::new();
            // Regions 1 MiB apart, at a base that is a multiple of 64 but not of their size.
            let regions: Vec<(usize, usize)> = orders
                .iter()
                .enumerate()
                .map(|(i, &o)| ((i + 1) * (1 << 20) + 64 * (2 * skew + 1), 1usize << o))
                .collect();
            for &(base, size) in &regions {
                b.extend(base, size).unwrap();
            }
            prop_assert!(b.extend(regions[0].0 - 32, 64).is_err(), "overlap accepted");
            let mut live: Vec<(usize, usize)> = Vec::new();
            let mut freed: Vec<usize> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(size) => {
                        let bsize = 1usize << order_for(size).unwrap();
                        let fits = |&(base, rsize): &(usize, usize)| {
                            (0..rsize / bsize.min(rsize)).any(|j| {
                                let a = base + j * bsize;
                                bsize <= rsize
                                    && live.iter().all(|&(l, ls)| l + ls <= a || a + bsize <= l)
                            })
                        };
                        let room = regions.iter().any(fits);
                        match b.alloc(size) {
                            Some((a, order)) => {
                                prop_assert_eq!(1usize << order, bsize);
                                let &(base, _) = regions
                                    .iter()
                                    .find(|&&(base, rsize)| base <= a && a + bsize <= base + rsize)
                                    .expect("a block outside every region");
                                prop_assert_eq!((a - base) % bsize, 0);
                                for &(l, ls) in &live {
                                    prop_assert!(l + ls <= a || a + bsize <= l, "overlap");
                                }
                                live.push((a, bsize));
                            }
                            None => prop_assert!(!room, "refused {} bytes with room", size),
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let (a, _) = live.swap_remove(i % live.len());
                        prop_assert!(b.release(a).is_some());
                        freed.push(a);
                    }
                    Op::Free(_) => {}
                    Op::BadFree(i) => {
                        let bad = match live.get(i % live.len().max(1)) {
                            Some(&(a, s)) if i % 2 == 0 => a + s / 2,
                            _ => freed.get(i % freed.len().max(1)).copied().unwrap_or(1),
                        };
                        if !live.iter().any(|&(a, _)| a == bad) {
                            prop_assert!(b.release(bad).is_none(), "bad free accepted");
                        }
                    }
                }
                check_books(&b);
            }
            for (a, _) in live.drain(..) {
                prop_assert!(b.release(a).is_some());
            }
            check_books(&b);
            prop_assert_eq!(b.nodes.len() - b.spare.len(), regions.len());
            for &(base, size) in &regions {
                let n = &b.nodes[r_head(&b, base) as usize];
                prop_assert!(n.free && 1usize << n.order == size, "region not merged back");
            }
        }
    }
}
