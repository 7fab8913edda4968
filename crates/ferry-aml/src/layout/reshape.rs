//! The reshape layout (`aml/layout/reshape.h`): other dims over any target layout's elements,
//! element `i` (in native order) of the reshape being element `i` of the target. It serves
//! where a dense reshape would need a copy, and over layouts of any type. As AML's: one
//! `malloc` block (a program may `free` it, leaving the target alone), and it owns its target
//! (`aml_layout_reshape_destroy` destroys it; duplicate duplicates it).

use super::composite::{
    deref_native, is_row, native, op, print_nested, target_dims, with_coords, Block,
};
use super::{
    arr, AmlLayout, AmlLayoutOps, Data, Out, AML_LAYOUT_ORDER_COLUMN_MAJOR,
    AML_LAYOUT_ORDER_ROW_MAJOR,
};
use crate::error::{guard, guard_ptr, guard_void, inval, AML_SUCCESS};
use ferry_capi::Fail;
use std::ffi::{c_char, c_int, c_void};

/// `struct aml_layout_data_reshape`, AML's fields in AML's order.
#[repr(C)]
pub struct AmlLayoutDataReshape {
    /// The layout reshaped (owned).
    pub target: *mut AmlLayout,
    /// Number of dims of the reshape.
    pub ndims: usize,
    /// Number of dims of the target.
    pub target_ndims: usize,
    /// `ndims` dims, native order.
    pub dims: *mut usize,
    /// `ndims` element counts below each dim (`coffsets[0]` = 1), native order.
    pub coffsets: *mut usize,
    /// `target_ndims` dims of the target, native order.
    pub target_dims: *mut usize,
}

/// A reshape's data with its arrays.
struct View<'a> {
    d: &'a AmlLayoutDataReshape,
    dims: &'a [usize],
    coffsets: &'a [usize],
    target_dims: &'a [usize],
}

/// Reads a reshape's data.
///
/// # Safety
/// 1. `data` is NULL or a valid reshape's data.
unsafe fn view<'a>(data: Data) -> Result<View<'a>, Fail> {
    // SAFETY: (1).
    let d = unsafe { data.cast::<AmlLayoutDataReshape>().as_ref() }
        .ok_or_else(|| inval("layout data is NULL"))?;
    if d.dims.is_null() || d.coffsets.is_null() || d.target_dims.is_null() {
        return Err(inval("reshape layout without dims"));
    }
    // SAFETY: (1): the arrays hold `ndims`, `ndims` and `target_ndims` values.
    unsafe {
        Ok(View {
            d,
            dims: std::slice::from_raw_parts(d.dims, d.ndims),
            coffsets: std::slice::from_raw_parts(d.coffsets, d.ndims),
            target_dims: std::slice::from_raw_parts(d.target_dims, d.target_ndims),
        })
    }
}

/// A new, unfilled reshape block (`target` NULL) with room for the arrays.
fn alloc(
    row: bool,
    ndims: usize,
    target_ndims: usize,
) -> Result<Block<AmlLayoutDataReshape>, Fail> {
    let ops = if row {
        &aml_layout_reshape_row_ops
    } else {
        &aml_layout_reshape_column_ops
    };
    let n = ndims
        .checked_mul(2)
        .and_then(|x| x.checked_add(target_ndims))
        .ok_or_else(|| inval("too many dims"))?;
    let b = Block::<AmlLayoutDataReshape>::new(ops, n, 0)?;
    // SAFETY: the block holds the data and `n` values after it.
    unsafe {
        b.data.write(AmlLayoutDataReshape {
            target: std::ptr::null_mut(),
            ndims,
            target_ndims,
            dims: b.arr,
            coffsets: b.arr.add(ndims),
            target_dims: b.arr.add(2 * ndims),
        });
    }
    Ok(b)
}

/// Creates a reshape of `target` with `ndims` dims (given in `order`: its low bit,
/// `AML_LAYOUT_ORDER_ROW_MAJOR` or `AML_LAYOUT_ORDER_COLUMN_MAJOR`). On success the reshape
/// owns `target`. `-AML_EINVAL`: NULL `layout`, `target` or `dims`, `ndims` 0, a target
/// without dims, or dims that do not hold the target's element count; `-AML_ENOMEM`.
///
/// # Safety
/// 1. `layout` is NULL or valid for one write; `target` NULL or a valid layout; `dims` NULL or
///    valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_create(
    layout: Out,
    target: *mut AmlLayout,
    order: c_int,
    ndims: usize,
    dims: *const usize,
) -> c_int {
    guard(|| {
        if layout.is_null() || target.is_null() || ndims == 0 {
            return Err(inval("layout and target must be non-NULL, ndims non-zero"));
        }
        let row = is_row(order);
        // SAFETY: (1).
        let dims = native(unsafe { arr(dims, ndims, "dims") }?, row);
        // SAFETY: (1).
        let tdims = unsafe { target_dims(target) }?;
        let count = |d: &[usize]| d.iter().try_fold(1usize, |a, &n| a.checked_mul(n));
        let (n, tn) = (count(&dims), count(&tdims));
        if n.is_none() || n != tn {
            return Err(inval(format!(
                "reshape: dims {dims:?} do not hold the target's {tdims:?} elements"
            )));
        }
        let b = alloc(row, ndims, tdims.len())?;
        // SAFETY: `alloc` sized the arrays for these values; `layout` (1).
        unsafe {
            let d = &mut *b.data;
            d.target = target;
            std::ptr::copy_nonoverlapping(dims.as_ptr(), d.dims, ndims);
            let mut prod = 1;
            for (i, &n) in dims.iter().enumerate() {
                *d.coffsets.add(i) = prod;
                prod *= n;
            }
            std::ptr::copy_nonoverlapping(tdims.as_ptr(), d.target_dims, tdims.len());
            *layout = b.layout;
        }
        Ok(AML_SUCCESS)
    })
}

/// Destroys a reshape and its target (NULL: no-op; AML asserts).
///
/// # Safety
/// 1. `l` is NULL or a reshape layout not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_destroy(l: *mut AmlLayout) {
    // SAFETY: (1).
    let Some(layout) = (unsafe { l.as_mut() }) else {
        return;
    };
    // SAFETY: (1): a reshape's data.
    if let Some(d) = unsafe { layout.data.cast::<AmlLayoutDataReshape>().as_mut() } {
        // SAFETY: (1): the owned target.
        unsafe { super::generic::aml_layout_destroy(&mut d.target) };
    }
    // SAFETY: (1): one malloc block.
    unsafe { libc::free(l.cast()) };
}

/// A copy of the reshape over a duplicate of its target (with `ptr` as its pointer if not
/// NULL). `-AML_EINVAL` for NULL arguments; the target's duplicate's failure as is.
///
/// # Safety
/// 1. `layout` is NULL or a valid reshape; `out` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_duplicate(
    layout: *const AmlLayout,
    out: Out,
    ptr: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let l = unsafe { layout.as_ref() }.ok_or_else(|| inval("layout is NULL"))?;
        if out.is_null() {
            return Err(inval("out is NULL"));
        }
        // SAFETY: (1).
        let v = unsafe { view(l.data.cast_const()) }?;
        let row = std::ptr::eq(l.ops, &aml_layout_reshape_row_ops);
        let b = alloc(row, v.d.ndims, v.d.target_ndims)?;
        // SAFETY: `b` is this call's block; the arrays were sized for these values.
        unsafe {
            let d = &mut *b.data;
            let rc = super::generic::aml_layout_duplicate(v.d.target, &mut d.target, ptr);
            if rc != AML_SUCCESS {
                libc::free(b.layout.cast());
                return Ok(rc);
            }
            (*b.layout).ops = l.ops;
            std::ptr::copy_nonoverlapping(v.dims.as_ptr(), d.dims, v.dims.len());
            std::ptr::copy_nonoverlapping(v.coffsets.as_ptr(), d.coffsets, v.coffsets.len());
            std::ptr::copy_nonoverlapping(
                v.target_dims.as_ptr(),
                d.target_dims,
                v.target_dims.len(),
            );
            *out = b.layout;
        }
        Ok(AML_SUCCESS)
    })
}

/// The element at `coords` (`reversed`: row-major coordinates): its native index in the
/// reshape, split by the target's dims.
///
/// # Safety
/// 1. `data` is a valid reshape's data; `coords` NULL or valid for `ndims` reads.
unsafe fn deref(data: Data, coords: *const usize, reversed: bool) -> *mut c_void {
    guard_ptr(|| {
        // SAFETY: (1).
        let v = unsafe { view(data) }?;
        // SAFETY: (1).
        let c = unsafe { arr(coords, v.d.ndims, "coords") }?;
        let n = c.len();
        let mut at: usize = (0..n)
            .map(|i| c[if reversed { n - 1 - i } else { i }] * v.coffsets[i])
            .sum();
        with_coords(v.target_dims.len(), |t| {
            for (ti, &td) in t.iter_mut().zip(v.target_dims) {
                *ti = at % td;
                at /= td;
            }
            // SAFETY: (1): the target of a valid reshape; `t` holds its ndims values.
            unsafe { deref_native(v.d.target, t) }
        })
    })
}

/// Element at native (column-major) coordinates. Not bounds-checked, as AML.
///
/// # Safety
/// 1. `data` is a valid reshape's data; `coords` valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_column_deref(
    data: Data,
    coords: *const usize,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { deref(data, coords, false) }
}

/// Element at row-major coordinates. Not bounds-checked, as AML.
///
/// # Safety
/// 1. `data` is a valid reshape's data; `coords` valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_row_deref(
    data: Data,
    coords: *const usize,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { deref(data, coords, true) }
}

/// The target's pointer.
///
/// # Safety
/// 1. `data` is NULL or a valid reshape's data.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_rawptr(data: Data) -> *mut c_void {
    guard_ptr(|| {
        // SAFETY: (1).
        let v = unsafe { view(data) }?;
        // SAFETY: (1): the reshape's target is a valid layout.
        Ok(unsafe { super::generic::aml_layout_rawptr(v.d.target) })
    })
}

/// `AML_LAYOUT_ORDER_COLUMN_MAJOR`.
///
/// # Safety
/// 1. None (`data` is unused).
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_column_order(_data: Data) -> c_int {
    AML_LAYOUT_ORDER_COLUMN_MAJOR
}

/// `AML_LAYOUT_ORDER_ROW_MAJOR`.
///
/// # Safety
/// 1. None (`data` is unused).
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_row_order(_data: Data) -> c_int {
    AML_LAYOUT_ORDER_ROW_MAJOR
}

/// Writes the dims, native order or reversed.
///
/// # Safety
/// 1. `data` is NULL or a valid reshape's data; `dims` NULL or valid for `ndims` writes.
unsafe fn write_dims(data: Data, dims: *mut usize, reversed: bool) -> c_int {
    op(data, || {
        // SAFETY: (1).
        let v = unsafe { view(data) }?;
        if dims.is_null() {
            return Err(inval("dims is NULL"));
        }
        // SAFETY: (1).
        let out = unsafe { std::slice::from_raw_parts_mut(dims, v.dims.len()) };
        out.copy_from_slice(v.dims);
        if reversed {
            out.reverse();
        }
        Ok(AML_SUCCESS)
    })
}

/// The dims in native (column-major) order.
///
/// # Safety
/// 1. `data` is NULL or a valid reshape's data; `dims` NULL or valid for `ndims` writes.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_column_dims(data: Data, dims: *mut usize) -> c_int {
    // SAFETY: forwarded.
    unsafe { write_dims(data, dims, false) }
}

/// The dims in row-major order.
///
/// # Safety
/// As [`aml_layout_reshape_column_dims`].
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_row_dims(data: Data, dims: *mut usize) -> c_int {
    // SAFETY: forwarded.
    unsafe { write_dims(data, dims, true) }
}

/// The number of dims (0 with `aml_errno` for NULL data).
///
/// # Safety
/// 1. `data` is NULL or a valid reshape's data.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_ndims(data: Data) -> usize {
    let mut n = 0;
    guard_void(|| {
        // SAFETY: (1).
        n = unsafe { view(data) }?.d.ndims;
        Ok(AML_SUCCESS)
    });
    n
}

/// The target's element size (0 with `aml_errno` for NULL data).
///
/// # Safety
/// 1. `data` is NULL or a valid reshape's data.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_element_size(data: Data) -> usize {
    let mut n = 0;
    guard_void(|| {
        // SAFETY: (1).
        let v = unsafe { view(data) }?;
        // SAFETY: (1): the reshape's target is a valid layout.
        n = unsafe { super::generic::aml_layout_element_size(v.d.target) };
        Ok(AML_SUCCESS)
    });
    n
}

/// AML's printout, in the user's order: header, ndims, target-ndims, dims with their offsets,
/// the target's dims, then the target.
///
/// # Safety
/// 1. `data` NULL or a valid reshape's data; `stream` NULL or a valid `FILE *`; `prefix` NULL
///    or a C string.
unsafe fn fprintf(data: Data, stream: *mut libc::FILE, prefix: *const c_char, row: bool) -> c_int {
    guard(|| {
        let order = if row { "row-major" } else { "column-major" };
        let mut head = vec![format!("layout-reshape: {data:p}: {order}")];
        if data.is_null() {
            // SAFETY: (1).
            return unsafe { crate::dma::print_lines(stream, prefix, &head) };
        }
        // SAFETY: (1).
        let v = unsafe { view(data) }?;
        head.push(format!("ndims: {}", v.d.ndims));
        head.push(format!("target-ndims: {}", v.d.target_ndims));
        let n = v.dims.len();
        for i in 0..n {
            let j = if row { n - 1 - i } else { i };
            head.push(format!("{i:16}: {:16} {:16}", v.dims[j], v.coffsets[j]));
        }
        for (i, t) in v.target_dims.iter().enumerate() {
            head.push(format!("{i:16}: {t:16}"));
        }
        // SAFETY: (1).
        unsafe { print_nested(stream, prefix, &head, v.d.target) }
    })
}

/// Prints a column-major reshape (AML's format).
///
/// # Safety
/// 1. `data` NULL or a valid layout data of this type; `stream` NULL or a valid `FILE *`;
///    `prefix` NULL or a C string.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_column_fprintf(
    data: Data,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { fprintf(data, stream, prefix, false) }
}

/// Prints a row-major reshape (AML's format).
///
/// # Safety
/// 1. `data` NULL or a valid layout data of this type; `stream` NULL or a valid `FILE *`;
///    `prefix` NULL or a C string.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_reshape_row_fprintf(
    data: Data,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { fprintf(data, stream, prefix, true) }
}

/// The ops of column-major reshapes (no reshape or slice of a reshape, as AML).
#[no_mangle]
pub static aml_layout_reshape_column_ops: AmlLayoutOps = AmlLayoutOps {
    deref: Some(aml_layout_reshape_column_deref),
    deref_native: Some(aml_layout_reshape_column_deref),
    rawptr: Some(aml_layout_reshape_rawptr),
    order: Some(aml_layout_reshape_column_order),
    dims: Some(aml_layout_reshape_column_dims),
    dims_native: Some(aml_layout_reshape_column_dims),
    ndims: Some(aml_layout_reshape_ndims),
    element_size: Some(aml_layout_reshape_element_size),
    reshape: None,
    slice: None,
    slice_native: None,
    fprintf: Some(aml_layout_reshape_column_fprintf),
    duplicate: Some(aml_layout_reshape_duplicate),
    destroy: Some(aml_layout_reshape_destroy),
};

/// The ops of row-major reshapes.
#[no_mangle]
pub static aml_layout_reshape_row_ops: AmlLayoutOps = AmlLayoutOps {
    deref: Some(aml_layout_reshape_row_deref),
    deref_native: Some(aml_layout_reshape_column_deref),
    rawptr: Some(aml_layout_reshape_rawptr),
    order: Some(aml_layout_reshape_row_order),
    dims: Some(aml_layout_reshape_row_dims),
    dims_native: Some(aml_layout_reshape_column_dims),
    ndims: Some(aml_layout_reshape_ndims),
    element_size: Some(aml_layout_reshape_element_size),
    reshape: None,
    slice: None,
    slice_native: None,
    fprintf: Some(aml_layout_reshape_row_fprintf),
    duplicate: Some(aml_layout_reshape_duplicate),
    destroy: Some(aml_layout_reshape_destroy),
};
