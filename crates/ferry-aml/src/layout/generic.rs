//! The generic layout calls of `aml.h` (and `aml/layout/native.h`): each checks its arguments
//! (AML asserts) and dispatches through `layout->ops`.

use super::{arr, AmlLayout, AmlLayoutOps, Data, Out};
use crate::error::{
    fail, guard, guard_ptr, guard_void, inval, plain_ptr, AML_ENOTSUP, AML_SUCCESS,
};
use ferry_capi::Fail;
use std::ffi::{c_char, c_int, c_void};

/// The ops table and data of a layout.
///
/// # Safety
/// 1. `l` is NULL or a valid layout whose `ops` is NULL or a valid table.
unsafe fn ops<'a>(l: *const AmlLayout) -> Result<(&'a AmlLayoutOps, Data), Fail> {
    // SAFETY: (1).
    let l = unsafe { l.as_ref() }.ok_or_else(|| inval("layout is NULL"))?;
    // SAFETY: (1).
    let o = unsafe { l.ops.as_ref() }.ok_or_else(|| inval("layout->ops is NULL"))?;
    Ok((o, l.data.cast_const()))
}

fn need<T>(f: Option<T>, what: &str) -> Result<T, Fail> {
    f.ok_or_else(|| fail(AML_ENOTSUP, format!("this layout type has no {what}")))
}

/// The layout's dims in its user order.
///
/// # Safety
/// 1. `l` is a valid layout.
pub(crate) unsafe fn dims_of(l: *const AmlLayout, native: bool) -> Result<Vec<usize>, Fail> {
    // SAFETY: (1).
    let (o, d) = unsafe { ops(l) }?;
    // SAFETY: (1): the layout's own functions on its own data.
    let n = unsafe { need(o.ndims, "ndims")?(d) };
    let f = need(if native { o.dims_native } else { o.dims }, "dims")?;
    let mut v = vec![0; n];
    // SAFETY: (1); `v` holds `ndims` values.
    let rc = unsafe { f(d, v.as_mut_ptr()) };
    if rc != AML_SUCCESS {
        return Err(fail(-rc, "the layout's dims function failed"));
    }
    Ok(v)
}

/// Element at `coords` (user order) with coordinates checked against the dims first.
///
/// # Safety
/// 1. `l` is a valid layout; `coords` valid for `ndims` reads.
unsafe fn deref(
    l: *const AmlLayout,
    coords: *const usize,
    native: bool,
    check: bool,
) -> *mut c_void {
    if !check {
        // SAFETY: (1).
        return plain_ptr(unsafe { deref_unchecked(l, coords, native) });
    }
    guard_ptr(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(l) }?;
        if check {
            // SAFETY: (1).
            let dims = unsafe { dims_of(l, native) }?;
            // SAFETY: (1).
            let c = unsafe { arr(coords, dims.len(), "coords") }?;
            if let Some(i) = (0..dims.len()).find(|&i| c[i] >= dims[i]) {
                return Err(inval(format!(
                    "coords[{i}] = {} is not below {}",
                    c[i], dims[i]
                )));
            }
        } else if coords.is_null() {
            return Err(inval("coords is NULL"));
        }
        let f = need(if native { o.deref_native } else { o.deref }, "deref")?;
        // SAFETY: (1).
        Ok(unsafe { f(d, coords) })
    })
}

/// The layout's own deref op, unchecked (as AML): no unwind guard, since nothing here can
/// panic and AML's kernels call it once per element (each of this library's ops guards itself).
///
/// # Safety
/// 1. `l` is NULL or a valid layout; `coords` NULL or valid for `ndims` reads.
unsafe fn deref_unchecked(
    l: *const AmlLayout,
    coords: *const usize,
    native: bool,
) -> Result<*mut c_void, Fail> {
    // SAFETY: (1).
    let (o, d) = unsafe { ops(l) }?;
    if coords.is_null() {
        return Err(inval("coords is NULL"));
    }
    let f = need(if native { o.deref_native } else { o.deref }, "deref")?;
    // SAFETY: (1).
    Ok(unsafe { f(d, coords) })
}

/// Address of the element at `coords` (in the layout's order). Not bounds-checked (as AML);
/// NULL with `aml_errno` for a NULL layout or coords.
///
/// # Safety
/// 1. `layout` is NULL or valid; `coords` NULL or valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_deref(
    layout: *const AmlLayout,
    coords: *const usize,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { deref(layout, coords, false, false) }
}

/// As `aml_layout_deref`, with coordinates checked: NULL and `aml_errno` = `-AML_EINVAL` when
/// one is out of bounds.
///
/// # Safety
/// As [`aml_layout_deref`].
#[no_mangle]
pub unsafe extern "C" fn aml_layout_deref_safe(
    layout: *const AmlLayout,
    coords: *const usize,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { deref(layout, coords, false, true) }
}

/// Address of the element at native (column-major) `coords`. Not bounds-checked.
///
/// # Safety
/// As [`aml_layout_deref`].
#[no_mangle]
pub unsafe extern "C" fn aml_layout_deref_native(
    layout: *const AmlLayout,
    coords: *const usize,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { deref(layout, coords, true, false) }
}

/// The layout's pointer (NULL with `aml_errno` for a NULL layout).
///
/// # Safety
/// 1. `layout` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_rawptr(layout: *const AmlLayout) -> *mut c_void {
    guard_ptr(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(layout) }?;
        // SAFETY: (1).
        Ok(unsafe { need(o.rawptr, "rawptr")?(d) })
    })
}

/// `AML_LAYOUT_ORDER_ROW_MAJOR` or `AML_LAYOUT_ORDER_COLUMN_MAJOR`; `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `layout` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_order(layout: *const AmlLayout) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(layout) }?;
        // SAFETY: (1).
        Ok(unsafe { need(o.order, "order")?(d) })
    })
}

/// Writes the dims (in the layout's order) to `dims` (room for `ndims` values).
///
/// # Safety
/// 1. `layout` is NULL or valid; `dims` NULL or valid for `ndims` writes.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_dims(layout: *const AmlLayout, dims: *mut usize) -> c_int {
    // SAFETY: forwarded.
    unsafe { write_dims(layout, dims, false) }
}

/// The body of both dims calls: the layout's `dims` or `dims_native` op.
///
/// # Safety
/// As [`aml_layout_dims`].
unsafe fn write_dims(layout: *const AmlLayout, dims: *mut usize, native: bool) -> c_int {
    guard(|| {
        if dims.is_null() {
            return Err(inval("dims is NULL"));
        }
        // SAFETY: (1).
        let (o, d) = unsafe { ops(layout) }?;
        let f = need(if native { o.dims_native } else { o.dims }, "dims")?;
        // SAFETY: (1).
        Ok(unsafe { f(d, dims) })
    })
}

/// Writes the dims in native (column-major) order.
///
/// # Safety
/// As [`aml_layout_dims`].
#[no_mangle]
pub unsafe extern "C" fn aml_layout_dims_native(
    layout: *const AmlLayout,
    dims: *mut usize,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { write_dims(layout, dims, true) }
}

/// The number of dims (0 with `aml_errno` for a NULL layout).
///
/// # Safety
/// 1. `layout` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_ndims(layout: *const AmlLayout) -> usize {
    let mut n = 0;
    guard_void(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(layout) }?;
        // SAFETY: (1).
        n = unsafe { need(o.ndims, "ndims")?(d) };
        Ok(AML_SUCCESS)
    });
    n
}

/// The element size in bytes (0 with `aml_errno` for a NULL layout).
///
/// # Safety
/// 1. `layout` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_element_size(layout: *const AmlLayout) -> usize {
    let mut n = 0;
    guard_void(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(layout) }?;
        // SAFETY: (1).
        n = unsafe { need(o.element_size, "element_size")?(d) };
        Ok(AML_SUCCESS)
    });
    n
}

/// A new layout over the same elements with `ndims` new dims (layout order), without a copy.
/// `-AML_EINVAL`: NULL arguments, another element count, dims that would need a copy;
/// `-AML_ENOTSUP`: the layout type cannot reshape.
///
/// # Safety
/// 1. `layout` is NULL or valid; `output` NULL or valid for one write; `dims` NULL or valid for
///    `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape(
    layout: *const AmlLayout,
    output: Out,
    ndims: usize,
    dims: *const usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(layout) }?;
        if output.is_null() || dims.is_null() || ndims == 0 {
            return Err(inval("output, dims and ndims must be non-NULL / non-zero"));
        }
        // SAFETY: (1).
        Ok(unsafe { need(o.reshape, "reshape")?(d, output, ndims, dims) })
    })
}

/// A sub-layout: `dims[i]` elements from `offsets[i]` (NULL: 0) every `strides[i]` (NULL: 1)
/// along each dim, in the layout's order. `-AML_EINVAL` if it does not fit.
///
/// # Safety
/// 1. `layout` is NULL or valid; `output` NULL or valid for one write; the arrays NULL or
///    valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_slice(
    layout: *const AmlLayout,
    output: Out,
    offsets: *const usize,
    dims: *const usize,
    strides: *const usize,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { slice(layout, output, (offsets, dims, strides), false) }
}

/// As `aml_layout_slice`, arguments in native (column-major) order.
///
/// # Safety
/// As [`aml_layout_slice`].
#[no_mangle]
pub unsafe extern "C" fn aml_layout_slice_native(
    layout: *const AmlLayout,
    output: Out,
    offsets: *const usize,
    dims: *const usize,
    strides: *const usize,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { slice(layout, output, (offsets, dims, strides), true) }
}

/// The body of both slice calls: the layout's `slice` or `slice_native` op.
///
/// # Safety
/// As [`aml_layout_slice`].
unsafe fn slice(
    layout: *const AmlLayout,
    output: Out,
    (offsets, dims, strides): (*const usize, *const usize, *const usize),
    native: bool,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(layout) }?;
        let f = need(if native { o.slice_native } else { o.slice }, "slice")?;
        // SAFETY: (1).
        Ok(unsafe { f(d, output, offsets, dims, strides) })
    })
}

/// Prints the layout's description (not its content) on `stream`, each line after `prefix`.
///
/// # Safety
/// 1. `stream` is NULL or a valid `FILE *`; `prefix` NULL or a C string; `layout` NULL or
///    valid.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_fprintf(
    stream: *mut libc::FILE,
    prefix: *const c_char,
    layout: *const AmlLayout,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(layout) }?;
        // SAFETY: (1).
        Ok(unsafe { need(o.fprintf, "fprintf")?(d, stream, prefix) })
    })
}

/// A copy of the layout's description (not its data), with `ptr` as its pointer if not NULL.
///
/// # Safety
/// 1. `src` is NULL or valid; `out` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_duplicate(
    src: *const AmlLayout,
    out: Out,
    ptr: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (o, _) = unsafe { ops(src) }?;
        if out.is_null() {
            return Err(inval("out is NULL"));
        }
        // SAFETY: (1).
        Ok(unsafe { need(o.duplicate, "duplicate")?(src, out, ptr) })
    })
}

/// Frees `*layout` (its `destroy` op, else `free`) and sets it to NULL. NULL: no-op.
///
/// # Safety
/// 1. `layout` is NULL or valid for a read and a write; `*layout` NULL or a layout not used
///    afterwards, allocated with `malloc` if its type has no `destroy` op.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_destroy(layout: *mut *mut AmlLayout) {
    // SAFETY: (1).
    let Some(slot) = (unsafe { layout.as_mut() }) else {
        return;
    };
    if slot.is_null() {
        return;
    }
    // SAFETY: (1).
    let destroy = unsafe { (**slot).ops.as_ref() }.and_then(|o| o.destroy);
    match destroy {
        // SAFETY: (1): the type's own destructor.
        Some(d) => unsafe { d(*slot) },
        // SAFETY: (1): a malloc'd block (dense layouts are one).
        None => unsafe { libc::free(slot.cast()) },
    }
    *slot = std::ptr::null_mut();
}
