//! `aml/utils/vector.h`: a growable array of fixed-size elements (opaque to C). Pointers from
//! `aml_vector_get` stay valid until the vector's length changes.

use crate::error::{AML_EDOM, AML_EINVAL, AML_FAILURE, AML_SUCCESS};
use std::ffi::{c_int, c_void};

/// A comparison function (`qsort`'s; for `find`, 0 means a match).
pub type Comp = Option<unsafe extern "C" fn(*const c_void, *const c_void) -> c_int>;

/// `struct aml_vector`: opaque to C.
pub struct AmlVector {
    elem: usize,
    data: Vec<u8>,
}

impl AmlVector {
    fn len(&self) -> usize {
        self.data.len() / self.elem
    }
    fn at(&self, i: usize) -> *const c_void {
        self.data[i * self.elem..].as_ptr().cast()
    }
}

/// Creates a vector of `element_size`-byte elements. `-AML_EINVAL` for NULL or size 0.
///
/// # Safety
/// 1. `vector` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_vector_create(
    vector: *mut *mut AmlVector,
    element_size: usize,
) -> c_int {
    // SAFETY: (1).
    match unsafe { vector.as_mut() } {
        Some(out) if element_size > 0 => {
            *out = Box::into_raw(Box::new(AmlVector {
                elem: element_size,
                data: Vec::new(),
            }));
            AML_SUCCESS
        }
        _ => -AML_EINVAL,
    }
}

/// Frees a vector and sets `*vector` NULL (NULL: no-op).
///
/// # Safety
/// 1. `vector` NULL or valid; `*vector` NULL or from `aml_vector_create`.
#[no_mangle]
pub unsafe extern "C" fn aml_vector_destroy(vector: *mut *mut AmlVector) {
    // SAFETY: (1).
    if let Some(slot) = unsafe { vector.as_mut() } {
        if !slot.is_null() {
            // SAFETY: (1): from `Box::into_raw`.
            drop(unsafe { Box::from_raw(*slot) });
        }
        *slot = std::ptr::null_mut();
    }
}

/// The number of elements in `*length`. `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `vector` NULL or valid; `length` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_vector_length(vector: *const AmlVector, length: *mut usize) -> c_int {
    // SAFETY: (1).
    match unsafe { (vector.as_ref(), length.as_mut()) } {
        (Some(v), Some(l)) => {
            *l = v.len();
            AML_SUCCESS
        }
        _ => -AML_EINVAL,
    }
}

/// A pointer to element `index` in `*out`. `-AML_EINVAL` for NULL `vector` or `out`,
/// `-AML_EDOM` for an index out of bounds.
///
/// # Safety
/// 1. `vector` NULL or valid; `out` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_vector_get(
    vector: *const AmlVector,
    index: usize,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: (1).
    let (Some(v), Some(o)) = (unsafe { vector.as_ref() }, unsafe { out.as_mut() }) else {
        return -AML_EINVAL;
    };
    if index >= v.len() {
        return -AML_EDOM;
    }
    *o = v.at(index).cast_mut();
    AML_SUCCESS
}

/// The position of the first element `e` with `comp(key, e) == 0` in `*pos` (NULL: not
/// stored). `-AML_EINVAL` for NULL `vector`, `key` or `comp`; `-AML_FAILURE` if none matches.
///
/// # Safety
/// 1. `vector` NULL or valid; `key` what `comp` reads; `pos` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_vector_find(
    vector: *const AmlVector,
    key: *const c_void,
    comp: Comp,
    pos: *mut usize,
) -> c_int {
    // SAFETY: (1).
    let (Some(v), Some(comp), false) = (unsafe { vector.as_ref() }, comp, key.is_null()) else {
        return -AML_EINVAL;
    };
    // SAFETY: (1): the comparison's contract.
    match (0..v.len()).find(|&i| unsafe { comp(key, v.at(i)) } == 0) {
        Some(i) => {
            // SAFETY: (1).
            if let Some(p) = unsafe { pos.as_mut() } {
                *p = i;
            }
            AML_SUCCESS
        }
        None => -AML_FAILURE,
    }
}

/// Sorts the elements with `comp` (`qsort`). `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `vector` NULL or valid, not aliased during the call; `comp` a `qsort` comparison.
#[no_mangle]
pub unsafe extern "C" fn aml_vector_sort(vector: *mut AmlVector, comp: Comp) -> c_int {
    // SAFETY: (1).
    let (Some(v), Some(_)) = (unsafe { vector.as_mut() }, comp) else {
        return -AML_EINVAL;
    };
    let n = v.len();
    if n > 1 {
        // SAFETY: (1): `n` elements of `elem` bytes at the data.
        unsafe { libc::qsort(v.data.as_mut_ptr().cast(), n, v.elem, comp) };
    }
    AML_SUCCESS
}

/// As `aml_vector_find`, in a vector sorted by `comp` (`bsearch`).
///
/// # Safety
/// As [`aml_vector_find`].
#[no_mangle]
pub unsafe extern "C" fn aml_vector_bsearch(
    vector: *const AmlVector,
    key: *const c_void,
    comp: Comp,
    pos: *mut usize,
) -> c_int {
    // SAFETY: (1).
    let (Some(v), Some(_), false) = (unsafe { vector.as_ref() }, comp, key.is_null()) else {
        return -AML_EINVAL;
    };
    if v.len() == 0 {
        return -AML_FAILURE;
    }
    // SAFETY: (1): `len` elements of `elem` bytes.
    let hit = unsafe { libc::bsearch(key, v.data.as_ptr().cast(), v.len(), v.elem, comp) };
    if hit.is_null() {
        return -AML_FAILURE;
    }
    // SAFETY: (1).
    if let Some(p) = unsafe { pos.as_mut() } {
        *p = (hit as usize - v.data.as_ptr() as usize) / v.elem;
    }
    AML_SUCCESS
}

/// Sets the length to `newlen` (new elements zeroed). `-AML_EINVAL` for NULL,
/// `-AML_ENOMEM`.
///
/// # Safety
/// 1. `vector` NULL or valid, not aliased during the call.
#[no_mangle]
pub unsafe extern "C" fn aml_vector_resize(vector: *mut AmlVector, newlen: usize) -> c_int {
    // SAFETY: (1).
    let Some(v) = (unsafe { vector.as_mut() }) else {
        return -AML_EINVAL;
    };
    let Some(bytes) = newlen.checked_mul(v.elem) else {
        return -crate::error::AML_ENOMEM;
    };
    if bytes > v.data.len() && v.data.try_reserve(bytes - v.data.len()).is_err() {
        return -crate::error::AML_ENOMEM;
    }
    v.data.resize(bytes, 0);
    AML_SUCCESS
}

/// Appends a copy of `*element`. `-AML_EINVAL` for NULL, `-AML_ENOMEM`.
///
/// # Safety
/// 1. `vector` NULL or valid; `element` NULL or valid for `element_size` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_vector_push_back(
    vector: *mut AmlVector,
    element: *const c_void,
) -> c_int {
    // SAFETY: (1).
    let (Some(v), false) = (unsafe { vector.as_mut() }, element.is_null()) else {
        return -AML_EINVAL;
    };
    if v.data.try_reserve(v.elem).is_err() {
        return -crate::error::AML_ENOMEM;
    }
    // SAFETY: (1).
    let e = unsafe { std::slice::from_raw_parts(element.cast::<u8>(), v.elem) };
    v.data.extend_from_slice(e);
    AML_SUCCESS
}

/// Removes element `position`, copying it to `out`. `-AML_EINVAL` for NULL `vector` or `out`,
/// `-AML_EDOM` for a position out of bounds.
///
/// # Safety
/// 1. `vector` NULL or valid; `out` NULL or valid for `element_size` writes.
#[no_mangle]
pub unsafe extern "C" fn aml_vector_take(
    vector: *mut AmlVector,
    position: usize,
    out: *mut c_void,
) -> c_int {
    // SAFETY: (1).
    let (Some(v), false) = (unsafe { vector.as_mut() }, out.is_null()) else {
        return -AML_EINVAL;
    };
    if position >= v.len() {
        return -AML_EDOM;
    }
    let at = position * v.elem;
    // SAFETY: (1): `elem` bytes from the element to `out`.
    unsafe { std::ptr::copy_nonoverlapping(v.data[at..].as_ptr(), out.cast::<u8>(), v.elem) };
    v.data.drain(at..at + v.elem);
    AML_SUCCESS
}

/// Removes the last element, copying it to `out`. `-AML_EINVAL` for NULL `vector` or `out`,
/// `-AML_EDOM` if the vector is empty.
///
/// # Safety
/// As [`aml_vector_take`].
#[no_mangle]
pub unsafe extern "C" fn aml_vector_pop_back(vector: *mut AmlVector, out: *mut c_void) -> c_int {
    // SAFETY: (1).
    let n = match unsafe { vector.as_ref() } {
        Some(v) => v.len(),
        None => return -AML_EINVAL,
    };
    if n == 0 && !out.is_null() {
        return -AML_EDOM;
    }
    // SAFETY: as the caller's.
    unsafe { aml_vector_take(vector, n.wrapping_sub(1), out) }
}
