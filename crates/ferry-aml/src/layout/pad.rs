//! The pad layout (`aml/layout/pad.h`): a target layout extended along its dims with a
//! neutral element (copied into the layout): an element inside the target's dims is the
//! target's, one beyond them is the neutral element. As AML's: one `malloc` block (a program
//! may `free` it, leaving the target alone), and it owns its target (`aml_layout_pad_destroy`
//! destroys it; duplicate duplicates it).

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

/// `struct aml_layout_pad`, AML's fields in AML's order.
#[repr(C)]
pub struct AmlLayoutPad {
    /// The order given at creation (with any tag bits).
    pub tags: c_int,
    /// The layout padded (owned).
    pub target: *mut AmlLayout,
    /// Number of dims (the target's).
    pub ndims: usize,
    /// Element size (the target's).
    pub element_size: usize,
    /// `ndims` dims of the padded layout, native order.
    pub dims: *mut usize,
    /// `ndims` dims of the target, native order.
    pub target_dims: *mut usize,
    /// The neutral element (`element_size` bytes inside the layout's block).
    pub neutral: *mut c_void,
}

/// A pad's data with its arrays.
struct View<'a> {
    d: &'a AmlLayoutPad,
    dims: &'a [usize],
    target_dims: &'a [usize],
}

/// Reads a pad's data.
///
/// # Safety
/// 1. `data` is NULL or a valid pad's data.
unsafe fn view<'a>(data: Data) -> Result<View<'a>, Fail> {
    // SAFETY: (1).
    let d = unsafe { data.cast::<AmlLayoutPad>().as_ref() }
        .ok_or_else(|| inval("layout data is NULL"))?;
    if d.dims.is_null() || d.target_dims.is_null() {
        return Err(inval("pad layout without dims"));
    }
    // SAFETY: (1): both arrays hold `ndims` values.
    unsafe {
        Ok(View {
            d,
            dims: std::slice::from_raw_parts(d.dims, d.ndims),
            target_dims: std::slice::from_raw_parts(d.target_dims, d.ndims),
        })
    }
}

/// A new pad block (`target` NULL) with room for the dims and the neutral element.
fn alloc(ops: *const AmlLayoutOps, ndims: usize, elem: usize) -> Result<Block<AmlLayoutPad>, Fail> {
    let n = ndims.checked_mul(2).ok_or_else(|| inval("too many dims"))?;
    let b = Block::<AmlLayoutPad>::new(ops, n, elem)?;
    // SAFETY: the block holds the data, `n` values after it, then `elem` bytes.
    unsafe {
        b.data.write(AmlLayoutPad {
            tags: 0,
            target: std::ptr::null_mut(),
            ndims,
            element_size: elem,
            dims: b.arr,
            target_dims: b.arr.add(ndims),
            neutral: b.extra.cast(),
        });
    }
    Ok(b)
}

/// Creates a pad of `target` to `dims` (in `order`: its low bit, `AML_LAYOUT_ORDER_ROW_MAJOR`
/// or `AML_LAYOUT_ORDER_COLUMN_MAJOR`; as many as the target's), the padding reading as
/// `*neutral` (copied). On success the pad owns `target`. `-AML_EINVAL`: NULL `layout`,
/// `target`, `dims` or `neutral`, a target without dims or element size, or a dim below the
/// target's (AML documents the dims as the target's plus the pad, and does not check);
/// `-AML_ENOMEM`.
///
/// # Safety
/// 1. `layout` is NULL or valid for one write; `target` NULL or a valid layout; `dims` NULL or
///    valid for as many reads as the target has dims; `neutral` NULL or valid for reading the
///    target's element size.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_create(
    layout: Out,
    order: c_int,
    target: *mut AmlLayout,
    dims: *const usize,
    neutral: *mut c_void,
) -> c_int {
    guard(|| {
        if layout.is_null() || target.is_null() || neutral.is_null() {
            return Err(inval("layout, target and neutral must be non-NULL"));
        }
        // SAFETY: (1).
        let tdims = unsafe { target_dims(target) }?;
        // SAFETY: (1).
        let elem = unsafe { super::generic::aml_layout_element_size(target) };
        if elem == 0 {
            return Err(inval("the target layout has no element size"));
        }
        let row = is_row(order);
        // SAFETY: (1).
        let dims = native(unsafe { arr(dims, tdims.len(), "dims") }?, row);
        if let Some(i) = (0..dims.len()).find(|&i| dims[i] < tdims[i]) {
            return Err(inval(format!(
                "pad: dim {} (native {i}) is below the target's {}",
                dims[i], tdims[i]
            )));
        }
        let ops = if row {
            &aml_layout_pad_row_ops
        } else {
            &aml_layout_pad_column_ops
        };
        let b = alloc(ops, dims.len(), elem)?;
        // SAFETY: `alloc` sized the arrays and the neutral element; (1).
        unsafe {
            let d = &mut *b.data;
            d.tags = order;
            d.target = target;
            std::ptr::copy_nonoverlapping(dims.as_ptr(), d.dims, dims.len());
            std::ptr::copy_nonoverlapping(tdims.as_ptr(), d.target_dims, tdims.len());
            std::ptr::copy_nonoverlapping(neutral.cast::<u8>(), d.neutral.cast::<u8>(), elem);
            *layout = b.layout;
        }
        Ok(AML_SUCCESS)
    })
}

/// Destroys a pad and its target (NULL: no-op; AML asserts).
///
/// # Safety
/// 1. `l` is NULL or a pad layout not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_destroy(l: *mut AmlLayout) {
    // SAFETY: (1).
    let Some(layout) = (unsafe { l.as_mut() }) else {
        return;
    };
    // SAFETY: (1): a pad's data.
    if let Some(d) = unsafe { layout.data.cast::<AmlLayoutPad>().as_mut() } {
        // SAFETY: (1): the owned target.
        unsafe { super::generic::aml_layout_destroy(&mut d.target) };
    }
    // SAFETY: (1): one malloc block.
    unsafe { libc::free(l.cast()) };
}

/// A copy of the pad over a duplicate of its target (with `ptr` as its pointer if not NULL).
/// `-AML_EINVAL` for NULL arguments; the target's duplicate's failure as is (AML ignores it).
///
/// # Safety
/// 1. `layout` is NULL or a valid pad; `out` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_duplicate(
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
        // The duplicate shares the source's ops table.
        let b = alloc(l.ops, v.d.ndims, v.d.element_size)?;
        // SAFETY: `b` is this call's block; its arrays and neutral element were sized for
        // these values; the source's neutral element holds `element_size` bytes.
        unsafe {
            let d = &mut *b.data;
            let rc = super::generic::aml_layout_duplicate(v.d.target, &mut d.target, ptr);
            if rc != AML_SUCCESS {
                libc::free(b.layout.cast());
                return Ok(rc);
            }
            d.tags = v.d.tags;
            std::ptr::copy_nonoverlapping(v.dims.as_ptr(), d.dims, v.dims.len());
            std::ptr::copy_nonoverlapping(v.target_dims.as_ptr(), d.target_dims, v.dims.len());
            std::ptr::copy_nonoverlapping(
                v.d.neutral.cast::<u8>(),
                d.neutral.cast::<u8>(),
                v.d.element_size,
            );
            *out = b.layout;
        }
        Ok(AML_SUCCESS)
    })
}

/// The element at `coords` (`reversed`: row-major coordinates): the neutral element beyond
/// the target's dims, else the target's.
///
/// # Safety
/// 1. `data` is a valid pad's data; `coords` NULL or valid for `ndims` reads.
unsafe fn deref(data: Data, coords: *const usize, reversed: bool) -> *mut c_void {
    guard_ptr(|| {
        // SAFETY: (1).
        let v = unsafe { view(data) }?;
        // SAFETY: (1).
        let c = unsafe { arr(coords, v.d.ndims, "coords") }?;
        let n = c.len();
        with_coords(n, |t| {
            for (i, ti) in t.iter_mut().enumerate() {
                *ti = c[if reversed { n - 1 - i } else { i }];
            }
            if t.iter().zip(v.target_dims).any(|(c, d)| c >= d) {
                return Ok(v.d.neutral);
            }
            // SAFETY: (1): the target of a valid pad; `t` holds its ndims values.
            unsafe { deref_native(v.d.target, t) }
        })
    })
}

/// Element at native (column-major) coordinates. Not bounds-checked, as AML.
///
/// # Safety
/// 1. `data` is a valid pad's data; `coords` valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_column_deref(
    data: Data,
    coords: *const usize,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { deref(data, coords, false) }
}

/// Element at row-major coordinates. Not bounds-checked, as AML.
///
/// # Safety
/// 1. `data` is a valid pad's data; `coords` valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_row_deref(data: Data, coords: *const usize) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { deref(data, coords, true) }
}

/// The target's pointer.
///
/// # Safety
/// 1. `data` is NULL or a valid pad's data.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_rawptr(data: Data) -> *mut c_void {
    guard_ptr(|| {
        // SAFETY: (1).
        let v = unsafe { view(data) }?;
        // SAFETY: (1): the pad's target is a valid layout.
        Ok(unsafe { super::generic::aml_layout_rawptr(v.d.target) })
    })
}

/// `AML_LAYOUT_ORDER_COLUMN_MAJOR`.
///
/// # Safety
/// 1. None (`data` is unused).
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_column_order(_data: Data) -> c_int {
    AML_LAYOUT_ORDER_COLUMN_MAJOR
}

/// `AML_LAYOUT_ORDER_ROW_MAJOR`.
///
/// # Safety
/// 1. None (`data` is unused).
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_row_order(_data: Data) -> c_int {
    AML_LAYOUT_ORDER_ROW_MAJOR
}

/// Writes the dims, native order or reversed.
///
/// # Safety
/// 1. `data` is NULL or a valid pad's data; `dims` NULL or valid for `ndims` writes.
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
/// 1. `data` is NULL or a valid pad's data; `dims` NULL or valid for `ndims` writes.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_column_dims(data: Data, dims: *mut usize) -> c_int {
    // SAFETY: forwarded.
    unsafe { write_dims(data, dims, false) }
}

/// The dims in row-major order.
///
/// # Safety
/// As [`aml_layout_pad_column_dims`].
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_row_dims(data: Data, dims: *mut usize) -> c_int {
    // SAFETY: forwarded.
    unsafe { write_dims(data, dims, true) }
}

/// The number of dims (0 with `aml_errno` for NULL data).
///
/// # Safety
/// 1. `data` is NULL or a valid pad's data.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_ndims(data: Data) -> usize {
    let mut n = 0;
    guard_void(|| {
        // SAFETY: (1).
        n = unsafe { view(data) }?.d.ndims;
        Ok(AML_SUCCESS)
    });
    n
}

/// The element size (0 with `aml_errno` for NULL data).
///
/// # Safety
/// 1. `data` is NULL or a valid pad's data.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_element_size(data: Data) -> usize {
    let mut n = 0;
    guard_void(|| {
        // SAFETY: (1).
        n = unsafe { view(data) }?.d.element_size;
        Ok(AML_SUCCESS)
    });
    n
}

/// AML's printout, in the user's order: header, element size, neutral, ndims, each dim with
/// the target's, then the target.
///
/// # Safety
/// 1. `data` NULL or a valid pad's data; `stream` NULL or a valid `FILE *`; `prefix` NULL or a
///    C string.
unsafe fn fprintf(data: Data, stream: *mut libc::FILE, prefix: *const c_char, row: bool) -> c_int {
    guard(|| {
        let order = if row { "row-major" } else { "column-major" };
        let mut head = vec![format!("layout-pad: {data:p}: {order}")];
        if data.is_null() {
            // SAFETY: (1).
            return unsafe { crate::dma::print_lines(stream, prefix, &head) };
        }
        // SAFETY: (1).
        let v = unsafe { view(data) }?;
        head.push(format!("element size: {}", v.d.element_size));
        head.push(format!("neutral: {:p}", v.d.neutral));
        head.push(format!("ndims: {}", v.d.ndims));
        let n = v.dims.len();
        for i in 0..n {
            let j = if row { n - 1 - i } else { i };
            head.push(format!("{i:16}: {:16} {:16}", v.dims[j], v.target_dims[j]));
        }
        // SAFETY: (1).
        unsafe { print_nested(stream, prefix, &head, v.d.target) }
    })
}

/// Prints a column-major pad (AML's format).
///
/// # Safety
/// 1. `data` NULL or a valid layout data of this type; `stream` NULL or a valid `FILE *`;
///    `prefix` NULL or a C string.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_column_fprintf(
    data: Data,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { fprintf(data, stream, prefix, false) }
}

/// Prints a row-major pad (AML's format).
///
/// # Safety
/// 1. `data` NULL or a valid layout data of this type; `stream` NULL or a valid `FILE *`;
///    `prefix` NULL or a C string.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_pad_row_fprintf(
    data: Data,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { fprintf(data, stream, prefix, true) }
}

/// The ops of column-major pads (no reshape or slice of a pad, as AML).
#[no_mangle]
pub static aml_layout_pad_column_ops: AmlLayoutOps = AmlLayoutOps {
    deref: Some(aml_layout_pad_column_deref),
    deref_native: Some(aml_layout_pad_column_deref),
    rawptr: Some(aml_layout_pad_rawptr),
    order: Some(aml_layout_pad_column_order),
    dims: Some(aml_layout_pad_column_dims),
    dims_native: Some(aml_layout_pad_column_dims),
    ndims: Some(aml_layout_pad_ndims),
    element_size: Some(aml_layout_pad_element_size),
    reshape: None,
    slice: None,
    slice_native: None,
    fprintf: Some(aml_layout_pad_column_fprintf),
    duplicate: Some(aml_layout_pad_duplicate),
    destroy: Some(aml_layout_pad_destroy),
};

/// The ops of row-major pads.
#[no_mangle]
pub static aml_layout_pad_row_ops: AmlLayoutOps = AmlLayoutOps {
    deref: Some(aml_layout_pad_row_deref),
    deref_native: Some(aml_layout_pad_column_deref),
    rawptr: Some(aml_layout_pad_rawptr),
    order: Some(aml_layout_pad_row_order),
    dims: Some(aml_layout_pad_row_dims),
    dims_native: Some(aml_layout_pad_column_dims),
    ndims: Some(aml_layout_pad_ndims),
    element_size: Some(aml_layout_pad_element_size),
    reshape: None,
    slice: None,
    slice_native: None,
    fprintf: Some(aml_layout_pad_row_fprintf),
    duplicate: Some(aml_layout_pad_duplicate),
    destroy: Some(aml_layout_pad_destroy),
};
