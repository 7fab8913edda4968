//! `aml/higher/mapper/deepcopy.h`: the deep copy of a tree-shaped structure with creators (one
//! per split field), and its release. The copies made are kept in an `aml_mapped_ptrs` (a
//! `UT_array` of `struct aml_mapped_ptr`, as AML's; see `ptrs`), the root's first.

use super::creator::{
    aml_mapper_creator_abort, aml_mapper_creator_branch, aml_mapper_creator_create,
    aml_mapper_creator_finish, aml_mapper_creator_next, AmlMapperCreator,
};
use super::ptrs::{free_list, new_list, push, release, UtArray};
use super::AmlMapper;
use crate::area::AmlArea;
use crate::dma::{AmlDma, AmlDmaOperator};
use crate::error::{fail, guard, guard_ptr, AML_EDOM, AML_EINVAL, AML_ENOMEM, AML_SUCCESS};
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
        let list = new_list();
        // SAFETY: just made; on failure the buffers are released and the list freed.
        let rc = unsafe {
            let mut rc = if list.is_null() {
                -AML_ENOMEM
            } else {
                AML_SUCCESS
            };
            for p in &done {
                if rc == AML_SUCCESS {
                    rc = push(list, p);
                }
            }
            if rc != AML_SUCCESS {
                for p in &done {
                    release(p);
                }
                if !list.is_null() {
                    (*list).i = 0;
                    free_list(list);
                }
            }
            rc
        };
        if rc != AML_SUCCESS {
            return Err(fail(-rc, "no memory for the list of copies"));
        }
        // SAFETY: (1).
        unsafe { *out = list.cast() };
        Ok(done[0].ptr)
    })
}

/// Frees a deep copy (its buffers, the last made first, then the list; also a list the program
/// made with `utarray_new`, as AML's replica tests do). `-AML_EINVAL` for NULL or a list of
/// other elements; an area's failure (what is not freed yet stays in `data`).
///
/// # Safety
/// 1. `data` NULL or from `aml_mapper_deepcopy` (or a `UT_array` of `struct aml_mapped_ptr`
///    made by `utarray_new`), not used after success.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_deepfree(data: *mut c_void) -> c_int {
    if data.is_null() {
        return -AML_EINVAL;
    }
    // SAFETY: (1).
    guard(|| Ok(unsafe { free_list(data.cast::<UtArray>()) }))
}
