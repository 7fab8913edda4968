//! `aml/higher/allocator/sized.h`: an allocator of one size, over pools mapped from an area.
//! AML maps one chunk per pool; libaml maps pools of as many chunks as are mapped already
//! (up to 1 MiB a pool, or one chunk when chunks are larger), so that n allocations cost
//! O(log n) mappings; the first pool (one chunk) is mapped at creation, as AML's.

use super::{publish, take, AmlAllocator, AmlAllocatorOps, Pools};
use crate::area::AmlArea;
use crate::error::{fail, guard, guard_ptr, inval, AML_ENOMEM, AML_SUCCESS};
use ferry_capi::Fail;
use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

/// The most a pool grows to, in bytes, unless one chunk is larger.
const POOL_BYTES: usize = 1 << 20;

/// The sized allocator's data (`struct aml_allocator_sized`, opaque in libaml).
pub struct SizedData {
    inner: Mutex<State>,
}

/// What the sized allocator's lock guards.
struct State {
    chunk_size: usize,
    pools: Pools,
    /// Free chunks (the lowest address last).
    free: Vec<usize>,
    used: HashSet<usize>,
    /// Chunks mapped so far.
    mapped: usize,
}

impl State {
    /// Maps a pool: as many chunks as are mapped (1 at first, within `POOL_BYTES`), or one
    /// chunk if the area refuses that many.
    fn extend(&mut self) -> Result<(), Fail> {
        let cap = (POOL_BYTES / self.chunk_size).max(1);
        let mut n = self.mapped.clamp(1, cap);
        let base = loop {
            let len = n
                .checked_mul(self.chunk_size)
                .ok_or_else(|| fail(AML_ENOMEM, "pool too large"))?;
            match self.pools.map(len) {
                Ok(p) => break p,
                Err(_) if n > 1 => n = 1,
                Err(rc) => return Err(fail(-rc, "the area could not map a pool")),
            }
        };
        self.free
            .extend((0..n).rev().map(|i| base + i * self.chunk_size));
        self.mapped += n;
        Ok(())
    }
}

/// The sized allocator's methods (no chunk methods, as AML). Its name is AML's (without
/// `_ops`).
#[no_mangle]
pub static aml_allocator_sized: AmlAllocatorOps = AmlAllocatorOps {
    alloc: Some(aml_allocator_sized_alloc),
    free: Some(aml_allocator_sized_free),
    alloc_chunk: None,
    free_chunk: None,
};

/// Creates an allocator of `size`-byte allocations over pools mapped from `area` with `opts`
/// (kept, not owned: they must outlive the allocator); maps the first pool (one chunk), as
/// AML. `-AML_EINVAL` for a NULL `allocator` or `area`, or size 0; else the area's failure.
///
/// # Safety
/// 1. `allocator` NULL or valid for one write; `area` NULL or a valid area; `opts` NULL or
///    what the area expects; `area` and `opts` outlive the allocator.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_sized_create(
    allocator: *mut *mut AmlAllocator,
    size: usize,
    area: *mut AmlArea,
    opts: *mut c_void,
) -> c_int {
    guard(|| {
        if allocator.is_null() || area.is_null() || size == 0 {
            return Err(inval("allocator or area is NULL, or size is 0"));
        }
        let mut st = State {
            chunk_size: size,
            pools: Pools::new(area, opts),
            free: Vec::new(),
            used: HashSet::new(),
            mapped: 0,
        };
        st.extend()?;
        let d = SizedData {
            inner: Mutex::new(st),
        };
        // SAFETY: (1).
        unsafe { publish(allocator, d, &aml_allocator_sized) };
        Ok(AML_SUCCESS)
    })
}

/// Unmaps the pools (allocations still out included), frees the allocator and sets
/// `*allocator` NULL. `-AML_EINVAL` for NULL or an allocator of another kind.
///
/// # Safety
/// 1. `allocator` NULL or valid; `*allocator` NULL or a valid allocator, not in use.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_sized_destroy(allocator: *mut *mut AmlAllocator) -> c_int {
    guard(|| {
        // SAFETY: (1).
        drop(unsafe { take::<SizedData>(allocator, &aml_allocator_sized) }?);
        Ok(AML_SUCCESS)
    })
}

/// The sized allocator's `alloc`: one chunk; NULL with `aml_errno` set to `AML_EINVAL` if
/// `size` is not the allocator's size (AML stores `-AML_EINVAL` there, negated unlike its
/// other calls), or to the area's failure.
///
/// # Safety
/// 1. `data` NULL or a sized allocator's data.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_sized_alloc(data: *mut c_void, size: usize) -> *mut c_void {
    guard_ptr(|| {
        // SAFETY: (1).
        let d = unsafe { super::data::<SizedData>(data) }?;
        let mut st = d.inner.lock().unwrap_or_else(|e| e.into_inner());
        if size != st.chunk_size {
            return Err(inval(format!(
                "size {size} is not the allocator's {}",
                st.chunk_size
            )));
        }
        if st.free.is_empty() {
            st.extend()?;
        }
        let p = st
            .free
            .pop()
            .ok_or_else(|| fail(AML_ENOMEM, "no free chunk"))?;
        st.used.insert(p);
        Ok(p as *mut c_void)
    })
}

/// The sized allocator's `free`. `-AML_EINVAL` for a pointer it did not allocate (or freed).
///
/// # Safety
/// 1. `data` NULL or a sized allocator's data.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_sized_free(data: *mut c_void, ptr: *mut c_void) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let d = unsafe { super::data::<SizedData>(data) }?;
        let mut st = d.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !st.used.remove(&(ptr as usize)) {
            return Err(inval("not a pointer of this allocator"));
        }
        st.free.push(ptr as usize);
        Ok(AML_SUCCESS)
    })
}
