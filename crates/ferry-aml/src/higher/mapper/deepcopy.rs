//! `aml/higher/mapper/deepcopy.h`: the deep copy of a tree-shaped structure with creators (one
//! per split field), and its release. The copies made are kept in an `aml_mapped_ptrs`
//! (opaque), the root's first.

use super::creator::{
    aml_mapper_creator_abort, aml_mapper_creator_branch, aml_mapper_creator_create,
    aml_mapper_creator_finish, aml_mapper_creator_next, AmlMapperCreator,
};
use super::AmlMapper;
use crate::area::{aml_area_munmap, AmlArea};
use crate::dma::{AmlDma, AmlDmaOperator};
use crate::error::{fail, guard, guard_ptr, AML_EDOM, AML_EINVAL, AML_SUCCESS};
use std::ffi::{c_int, c_void};

/// `struct aml_mapped_ptr`: one buffer of a deep copy.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AmlMappedPtr {
    /// The buffer.
    pub ptr: *mut c_void,
    /// Its size.
    pub size: usize,
    /// Its area (NULL: host memory from `malloc`).
    pub area: *mut AmlArea,
}

/// Frees one buffer of a deep copy (`struct aml_mapped_ptr *` as `void *`, as AML): unmapped
/// from its area, or `free`d without one. NULL: no-op.
///
/// # Safety
/// 1. `ptr` NULL or a valid `struct aml_mapped_ptr` whose buffer is not used after.
#[no_mangle]
pub unsafe extern "C" fn aml_mapped_ptr_destroy(ptr: *mut c_void) {
    // SAFETY: (1).
    if let Some(p) = unsafe { ptr.cast::<AmlMappedPtr>().as_ref() } {
        // SAFETY: (1).
        unsafe { release(p) };
    }
}

/// # Safety
/// 1. `p`'s buffer from its area (or `malloc`), not used after.
unsafe fn release(p: &AmlMappedPtr) -> c_int {
    if p.area.is_null() {
        // SAFETY: (1).
        unsafe { libc::free(p.ptr) };
        AML_SUCCESS
    } else {
        // SAFETY: (1).
        unsafe { aml_area_munmap(p.area, p.ptr, p.size) }
    }
}

/// Copies the structure at `ptr` (described by `mapper`) into `area`, a buffer per split
/// field (see `aml_mapper_creator_create` for the arguments); the copy, with the buffers in
/// `*out` for `aml_mapper_deepfree`. NULL with `aml_errno` on failure (`AML_EINVAL` for a NULL
/// `out`; a creator's failure), nothing left allocated.
///
/// # Safety
/// 1. As `aml_mapper_creator_create`; `out` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_deepcopy(
    out: *mut *mut c_void,
    ptr: *mut c_void,
    mapper: *mut AmlMapper,
    area: *mut AmlArea,
    area_opts: *mut c_void,
    dma_src_host: *mut AmlDma,
    dma_host_dst: *mut AmlDma,
    memcpy_src_host: AmlDmaOperator,
    memcpy_host_dst: AmlDmaOperator,
) -> *mut c_void {
    guard_ptr(|| {
        if out.is_null() {
            return Err(crate::error::inval("out is NULL"));
        }
        let mut done: Vec<AmlMappedPtr> = Vec::new();
        let mut pending: Vec<*mut AmlMapperCreator> = Vec::new();
        let mut c: *mut AmlMapperCreator = std::ptr::null_mut();
        // SAFETY: (1) for the creator calls; every creator made is finished, or aborted below.
        let rc = unsafe {
            let mut rc = aml_mapper_creator_create(
                &mut c,
                ptr,
                0,
                mapper,
                area,
                area_opts,
                dma_src_host,
                dma_host_dst,
                memcpy_src_host,
                memcpy_host_dst,
            );
            while rc == AML_SUCCESS {
                rc = aml_mapper_creator_next(c);
                while rc == -AML_EINVAL {
                    let mut next = std::ptr::null_mut();
                    rc = aml_mapper_creator_branch(
                        &mut next,
                        c,
                        area,
                        area_opts,
                        dma_host_dst,
                        memcpy_host_dst,
                    );
                    if !next.is_null() {
                        pending.push(next);
                    }
                    if rc == -AML_EINVAL {
                        break; // not a split: a real error
                    }
                    if rc == AML_SUCCESS {
                        rc = aml_mapper_creator_next(c);
                    }
                }
                if rc == -AML_EDOM {
                    let mut p = AmlMappedPtr {
                        ptr: std::ptr::null_mut(),
                        size: 0,
                        area: (*c).device_area,
                    };
                    rc = aml_mapper_creator_finish(c, &mut p.ptr, &mut p.size);
                    if rc != AML_SUCCESS {
                        break;
                    }
                    done.push(p);
                    c = std::ptr::null_mut();
                    match pending.pop() {
                        Some(n) => c = n,
                        None => break,
                    }
                }
            }
            rc
        };
        if rc != AML_SUCCESS {
            // SAFETY: the creators and buffers made above, not handed out.
            unsafe {
                if !c.is_null() {
                    aml_mapper_creator_abort(c);
                }
                for p in pending {
                    aml_mapper_creator_abort(p);
                }
                for p in &done {
                    release(p);
                }
            }
            return Err(fail(-rc, "the deep copy failed"));
        }
        let root = done[0].ptr;
        // SAFETY: (1).
        unsafe { *out = Box::into_raw(Box::new(done)).cast() };
        Ok(root)
    })
}

/// Frees a deep copy (its buffers, the last made first, then the list). `-AML_EINVAL` for NULL;
/// an area's failure (what is not freed yet stays in `data`).
///
/// # Safety
/// 1. `data` NULL or from `aml_mapper_deepcopy`, not used after success.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_deepfree(data: *mut c_void) -> c_int {
    if data.is_null() {
        return -AML_EINVAL;
    }
    guard(|| {
        // SAFETY: (1).
        let list = unsafe { &mut *data.cast::<Vec<AmlMappedPtr>>() };
        while let Some(p) = list.last().copied() {
            // SAFETY: (1).
            let rc = unsafe { release(&p) };
            if rc != AML_SUCCESS {
                return Ok(rc);
            }
            list.pop();
        }
        // SAFETY: (1): from `Box::into_raw`.
        drop(unsafe { Box::from_raw(data.cast::<Vec<AmlMappedPtr>>()) });
        Ok(AML_SUCCESS)
    })
}
