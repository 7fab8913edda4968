//! `aml_mapped_ptrs`: the buffers of deep copies and replicas, a `UT_array` of
//! `struct aml_mapped_ptr` as AML's (uthash's layout, which libaml's `internal/utarray.h`
//! shares), since AML's programs make and read that array themselves.

use super::deepcopy::{aml_mapped_ptr_destroy, AmlMappedPtr};
use crate::area::aml_area_munmap;
use crate::error::{AML_EINVAL, AML_ENOMEM, AML_SUCCESS};
use std::ffi::{c_char, c_int, c_uint, c_void};

/// uthash's `UT_icd`.
#[repr(C)]
pub struct UtIcd {
    /// Element size.
    pub sz: usize,
    /// Element initializer.
    pub init: Option<unsafe extern "C" fn(*mut c_void)>,
    /// Element copy.
    pub copy: Option<unsafe extern "C" fn(*mut c_void, *const c_void)>,
    /// Element destructor.
    pub dtor: Option<unsafe extern "C" fn(*mut c_void)>,
}

/// uthash's `UT_array`.
#[repr(C)]
pub struct UtArray {
    /// Elements in use.
    pub i: c_uint,
    /// Elements allocated.
    pub n: c_uint,
    /// The element type.
    pub icd: UtIcd,
    /// The elements (`malloc`ed).
    pub d: *mut c_char,
}

/// A new, empty list of mapped pointers (`malloc`ed, as `utarray_new`), or NULL.
pub(crate) fn new_list() -> *mut UtArray {
    // SAFETY: plain allocation.
    let a = unsafe { libc::malloc(std::mem::size_of::<UtArray>()) }.cast::<UtArray>();
    if !a.is_null() {
        // SAFETY: just allocated, sized for it.
        unsafe {
            a.write(UtArray {
                i: 0,
                n: 0,
                icd: UtIcd {
                    sz: std::mem::size_of::<AmlMappedPtr>(),
                    init: None,
                    copy: None,
                    dtor: Some(aml_mapped_ptr_destroy),
                },
                d: std::ptr::null_mut(),
            })
        };
    }
    a
}

/// Appends `p` to the list: `-AML_EINVAL` if its elements are not `struct aml_mapped_ptr`,
/// `-AML_ENOMEM`.
///
/// # Safety
/// 1. `a` a valid `UT_array`, not used concurrently.
pub(crate) unsafe fn push(a: *mut UtArray, p: &AmlMappedPtr) -> c_int {
    // SAFETY: (1).
    let a = unsafe { &mut *a };
    let sz = std::mem::size_of::<AmlMappedPtr>();
    if a.icd.sz != sz {
        return -AML_EINVAL;
    }
    if a.i >= a.n {
        let n = a.n.saturating_mul(2).max(8);
        // SAFETY: (1): `d` from `malloc`/`realloc` (or NULL).
        let d = unsafe { libc::realloc(a.d.cast(), n as usize * sz) };
        if d.is_null() {
            return -AML_ENOMEM;
        }
        a.d = d.cast();
        a.n = n;
    }
    // SAFETY: slot `i` is allocated (above).
    let slot = unsafe { a.d.add(a.i as usize * sz) }.cast::<c_void>();
    match a.icd.copy {
        // SAFETY: the array's own copy function.
        Some(copy) => unsafe { copy(slot, (p as *const AmlMappedPtr).cast()) },
        // SAFETY: the slot holds one element.
        None => unsafe { slot.cast::<AmlMappedPtr>().write_unaligned(*p) },
    }
    a.i += 1;
    AML_SUCCESS
}

/// Frees a buffer: unmapped from its area, or `free`d without one.
///
/// # Safety
/// 1. `p`'s buffer from its area (or `malloc`), not used after.
pub(crate) unsafe fn release(p: &AmlMappedPtr) -> c_int {
    if p.area.is_null() {
        // SAFETY: (1).
        unsafe { libc::free(p.ptr) };
        AML_SUCCESS
    } else {
        // SAFETY: (1).
        unsafe { aml_area_munmap(p.area, p.ptr, p.size) }
    }
}

/// Frees the list's buffers (the last first) and the list: an area's failure stops it (what
/// is left stays in the list).
///
/// # Safety
/// 1. `a` a valid `UT_array` of `struct aml_mapped_ptr` (`malloc`ed, as `utarray_new`), not
///    used after success.
pub(crate) unsafe fn free_list(a: *mut UtArray) -> c_int {
    // SAFETY: (1).
    let arr = unsafe { &mut *a };
    if arr.icd.sz != std::mem::size_of::<AmlMappedPtr>() {
        return -AML_EINVAL;
    }
    while arr.i > 0 {
        // SAFETY: (1): element `i - 1` is in use.
        let p = unsafe {
            arr.d
                .add((arr.i as usize - 1) * arr.icd.sz)
                .cast::<AmlMappedPtr>()
                .read_unaligned()
        };
        // SAFETY: (1).
        let rc = unsafe { release(&p) };
        if rc != AML_SUCCESS {
            return rc;
        }
        arr.i -= 1;
    }
    // SAFETY: (1): both from `malloc`.
    unsafe {
        libc::free(arr.d.cast());
        libc::free(a.cast());
    }
    AML_SUCCESS
}
