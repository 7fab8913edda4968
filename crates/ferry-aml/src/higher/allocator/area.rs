//! `aml/higher/allocator/area.h`: every allocation is its own mapping from the area (AML's
//! area allocator); destroy unmaps what is still allocated.

use super::{publish, take, AmlAllocator, AmlAllocatorOps, Pools};
use crate::area::AmlArea;
use crate::error::{guard, guard_ptr, inval, AML_EINVAL, AML_SUCCESS};
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

/// The area allocator's data (`struct aml_allocator_area_data`, opaque in libaml).
pub struct AreaData {
    pools: Mutex<Pools>,
}

/// The area allocator's methods (no chunk methods, as AML).
#[no_mangle]
pub static aml_allocator_area_ops: AmlAllocatorOps = AmlAllocatorOps {
    alloc: Some(aml_allocator_area_alloc),
    free: Some(aml_allocator_area_free),
    alloc_chunk: None,
    free_chunk: None,
};

/// Creates an allocator mapping each allocation from `area` with `opts` (both kept, not
/// owned: they must outlive the allocator). `-AML_EINVAL` for a NULL `out` or `area`.
///
/// # Safety
/// 1. `out` NULL or valid for one write; `area` NULL or a valid area; `opts` NULL or what the
///    area expects; `area` and `opts` outlive the allocator.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_area_create(
    out: *mut *mut AmlAllocator,
    area: *mut AmlArea,
    opts: *mut c_void,
) -> c_int {
    guard(|| {
        if out.is_null() || area.is_null() {
            return Err(inval("out or area is NULL"));
        }
        let d = AreaData {
            pools: Mutex::new(Pools::new(area, opts)),
        };
        // SAFETY: (1).
        unsafe { publish(out, d, &aml_allocator_area_ops) };
        Ok(AML_SUCCESS)
    })
}

/// Unmaps what is still allocated, frees the allocator and sets `*allocator` NULL.
/// `-AML_EINVAL` for NULL or an allocator of another kind.
///
/// # Safety
/// 1. `allocator` NULL or valid; `*allocator` NULL or a valid allocator, not in use.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_area_destroy(allocator: *mut *mut AmlAllocator) -> c_int {
    guard(|| {
        // SAFETY: (1).
        drop(unsafe { take::<AreaData>(allocator, &aml_allocator_area_ops) }?);
        Ok(AML_SUCCESS)
    })
}

/// The area allocator's `alloc`: maps `size` bytes (NULL with `aml_errno` on failure;
/// `AML_EINVAL` for size 0).
///
/// # Safety
/// 1. `data` NULL or an area allocator's data.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_area_alloc(data: *mut c_void, size: usize) -> *mut c_void {
    guard_ptr(|| {
        // SAFETY: (1).
        let d = unsafe { super::data::<AreaData>(data) }?;
        if size == 0 {
            return Err(inval("size is 0"));
        }
        let mut pools = d.pools.lock().unwrap_or_else(|e| e.into_inner());
        match pools.map(size) {
            Ok(p) => Ok(p as *mut c_void),
            Err(rc) => Err(crate::error::fail(-rc, "the area could not map")),
        }
    })
}

/// The area allocator's `free`: unmaps `ptr`. `-AML_EINVAL` if it is not an allocation of
/// this allocator; else the area's result.
///
/// # Safety
/// 1. `data` NULL or an area allocator's data.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_area_free(data: *mut c_void, ptr: *mut c_void) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let d = unsafe { super::data::<AreaData>(data) }?;
        let rc = d
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unmap(ptr as usize);
        if rc == -AML_EINVAL {
            return Err(inval("not a pointer of this allocator"));
        }
        Ok(rc)
    })
}
