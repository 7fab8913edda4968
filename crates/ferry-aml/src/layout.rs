//! Dense layouts (`aml/layout/dense.h`) and the generic layout calls (`aml.h`).
//!
//! As AML: a layout carries its pointer; dims are stored natively in column-major (Fortran)
//! order, innermost first; `stride` is in elements, `cpitch` the cumulative pitch in bytes
//! (`cpitch[0]` = element size), so element `c` is at `ptr + sum(c[i] * cpitch[i] *
//! stride[i])`. A layout and its arrays are one `malloc` block (a program may `free` it, as
//! with AML). There is no limit on the number of dims. The generic calls dispatch through
//! `layout->ops`, so a program's own layout types work too; bad arguments are error values
//! (AML asserts).

use crate::error::{guard, guard_ptr, guard_void, inval, plain_ptr, AML_ENOMEM, AML_SUCCESS};
use ferry_capi::Fail;
use std::ffi::{c_char, c_int, c_void};

/// Column-major (Fortran) order: the first dim is contiguous. AML's value, 0.
pub const AML_LAYOUT_ORDER_COLUMN_MAJOR: c_int = 0;
/// Row-major (C) order: the last dim is contiguous. AML's value, 1.
pub const AML_LAYOUT_ORDER_ROW_MAJOR: c_int = 1;

/// `struct aml_layout`: the ops table and the implementation's data.
#[repr(C)]
pub struct AmlLayout {
    /// The layout's functions.
    pub ops: *const AmlLayoutOps,
    /// Implementation data (`struct aml_layout_dense` for dense layouts).
    pub data: *mut c_void,
}

/// `struct aml_layout_dense`: the data of a dense layout, native (column-major) order.
#[repr(C)]
pub struct AmlLayoutDense {
    /// Address of element (0, ..., 0).
    pub ptr: *mut c_void,
    /// Number of dims.
    pub ndims: usize,
    /// `ndims` dims, innermost first.
    pub dims: *mut usize,
    /// `ndims` strides, in elements.
    pub stride: *mut usize,
    /// `ndims` cumulative pitches, in bytes (`cpitch[0]` = element size).
    pub cpitch: *mut usize,
}

pub(crate) type Data = *const c_void;
pub(crate) type Out = *mut *mut AmlLayout;

/// `struct aml_layout_ops`, in AML's field order.
#[repr(C)]
pub struct AmlLayoutOps {
    /// Element at coordinates in the user's order.
    pub deref: Option<unsafe extern "C" fn(Data, *const usize) -> *mut c_void>,
    /// Element at coordinates in native (column-major) order.
    pub deref_native: Option<unsafe extern "C" fn(Data, *const usize) -> *mut c_void>,
    /// The layout's pointer.
    pub rawptr: Option<unsafe extern "C" fn(Data) -> *mut c_void>,
    /// `AML_LAYOUT_ORDER_*`.
    pub order: Option<unsafe extern "C" fn(Data) -> c_int>,
    /// Dims in the user's order.
    pub dims: Option<unsafe extern "C" fn(Data, *mut usize) -> c_int>,
    /// Dims in native order.
    pub dims_native: Option<unsafe extern "C" fn(Data, *mut usize) -> c_int>,
    /// Number of dims.
    pub ndims: Option<unsafe extern "C" fn(Data) -> usize>,
    /// Element size in bytes.
    pub element_size: Option<unsafe extern "C" fn(Data) -> usize>,
    /// New layout with other dims over the same elements.
    pub reshape: Option<unsafe extern "C" fn(Data, Out, usize, *const usize) -> c_int>,
    /// Sub-layout (user order).
    pub slice:
        Option<unsafe extern "C" fn(Data, Out, *const usize, *const usize, *const usize) -> c_int>,
    /// Sub-layout (native order).
    pub slice_native:
        Option<unsafe extern "C" fn(Data, Out, *const usize, *const usize, *const usize) -> c_int>,
    /// Prints the layout.
    pub fprintf: Option<unsafe extern "C" fn(Data, *mut libc::FILE, *const c_char) -> c_int>,
    /// Copies the layout (optionally with another pointer).
    pub duplicate: Option<unsafe extern "C" fn(*const AmlLayout, Out, *mut c_void) -> c_int>,
    /// Frees the layout (NULL: `free`).
    pub destroy: Option<unsafe extern "C" fn(*mut AmlLayout)>,
}

/// The ops of dense column-major layouts.
#[no_mangle]
pub static aml_layout_column_ops: AmlLayoutOps = AmlLayoutOps {
    deref: Some(aml_layout_column_deref),
    deref_native: Some(aml_layout_column_deref),
    rawptr: Some(aml_layout_dense_rawptr),
    order: Some(aml_layout_column_order),
    dims: Some(aml_layout_column_dims),
    dims_native: Some(aml_layout_column_dims),
    ndims: Some(aml_layout_dense_ndims),
    element_size: Some(aml_layout_dense_element_size),
    reshape: Some(aml_layout_column_reshape),
    slice: Some(aml_layout_column_slice),
    slice_native: Some(aml_layout_column_slice),
    fprintf: Some(aml_layout_column_fprintf),
    duplicate: Some(aml_layout_dense_duplicate),
    destroy: None,
};

/// The ops of dense row-major layouts.
#[no_mangle]
pub static aml_layout_row_ops: AmlLayoutOps = AmlLayoutOps {
    deref: Some(aml_layout_row_deref),
    deref_native: Some(aml_layout_column_deref),
    rawptr: Some(aml_layout_dense_rawptr),
    order: Some(aml_layout_row_order),
    dims: Some(aml_layout_row_dims),
    dims_native: Some(aml_layout_column_dims),
    ndims: Some(aml_layout_dense_ndims),
    element_size: Some(aml_layout_dense_element_size),
    reshape: Some(aml_layout_row_reshape),
    slice: Some(aml_layout_row_slice),
    slice_native: Some(aml_layout_row_slice_native),
    fprintf: Some(aml_layout_row_fprintf),
    duplicate: Some(aml_layout_dense_duplicate),
    destroy: None,
};

/// A dense layout read out: pointer, native dims and byte strides, element size, order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dense {
    pub(crate) ptr: u64,
    pub(crate) elem: usize,
    pub(crate) dims: Vec<usize>,
    /// Byte strides (`cpitch[i] * stride[i]`), native order.
    pub(crate) bs: Vec<usize>,
    pub(crate) row: bool,
}

impl Dense {
    /// Reads a dense layout's data.
    ///
    /// # Safety
    /// 1. `d` points to a valid `AmlLayoutDense` whose arrays hold `ndims` values.
    unsafe fn read(d: *const AmlLayoutDense, row: bool) -> Result<Dense, Fail> {
        // SAFETY: (1).
        let d = unsafe { d.as_ref() }.ok_or_else(|| inval("layout data is NULL"))?;
        if d.ndims == 0 || d.dims.is_null() || d.stride.is_null() || d.cpitch.is_null() {
            return Err(inval("dense layout without dims"));
        }
        // SAFETY: (1).
        let (dims, stride, cpitch) = unsafe {
            (
                std::slice::from_raw_parts(d.dims, d.ndims),
                std::slice::from_raw_parts(d.stride, d.ndims),
                std::slice::from_raw_parts(d.cpitch, d.ndims),
            )
        };
        let bs = cpitch
            .iter()
            .zip(stride)
            .map(|(c, s)| c.checked_mul(*s).ok_or_else(|| inval("stride overflows")))
            .collect::<Result<_, _>>()?;
        Ok(Dense {
            ptr: d.ptr as u64,
            elem: cpitch[0],
            dims: dims.to_vec(),
            bs,
            row,
        })
    }

    /// Reads a layout if it is one of this library's dense layouts (`None` for another type).
    ///
    /// # Safety
    /// 1. `l` is NULL or a valid layout.
    pub(crate) unsafe fn of(l: *const AmlLayout) -> Result<Option<Dense>, Fail> {
        // SAFETY: (1).
        let l = unsafe { l.as_ref() }.ok_or_else(|| inval("layout is NULL"))?;
        let row = if std::ptr::eq(l.ops, &aml_layout_row_ops) {
            true
        } else if std::ptr::eq(l.ops, &aml_layout_column_ops) {
            false
        } else {
            return Ok(None);
        };
        // SAFETY: (1): a dense layout's data is an `AmlLayoutDense`.
        unsafe { Dense::read(l.data.cast(), row) }.map(Some)
    }

    /// Bytes from the pointer to one past the last element.
    pub(crate) fn span(&self) -> usize {
        self.dims
            .iter()
            .zip(&self.bs)
            .map(|(d, s)| (d - 1) * s)
            .sum::<usize>()
            + self.elem
    }

    pub(crate) fn count(&self) -> usize {
        self.dims.iter().product()
    }

    /// A new layout block: stride 1 above dim 0 and the byte stride as cumulative pitch.
    pub(crate) fn boxed(&self) -> Result<*mut AmlLayout, Fail> {
        let e = self.elem;
        let stride: Vec<usize> = (0..self.dims.len())
            .map(|i| if i == 0 { self.bs[0] / e } else { 1 })
            .collect();
        let cpitch: Vec<usize> = (0..self.dims.len())
            .map(|i| if i == 0 { e } else { self.bs[i] })
            .collect();
        alloc(
            self.ptr as *mut c_void,
            self.row,
            &self.dims,
            &stride,
            &cpitch,
        )
    }
}

/// Allocates a dense layout in one `malloc` block (layout, data, then dims, stride, cpitch).
fn alloc(
    ptr: *mut c_void,
    row: bool,
    dims: &[usize],
    stride: &[usize],
    cpitch: &[usize],
) -> Result<*mut AmlLayout, Fail> {
    let n = dims.len();
    let head = std::mem::size_of::<AmlLayout>() + std::mem::size_of::<AmlLayoutDense>();
    let bytes = (3 * n + 1)
        .checked_mul(std::mem::size_of::<usize>())
        .and_then(|a| a.checked_add(head))
        .ok_or_else(|| crate::error::fail(AML_ENOMEM, "layout too large"))?;
    // SAFETY: malloc of a non-zero size; the result is checked.
    let block = unsafe { libc::malloc(bytes) }.cast::<u8>();
    if block.is_null() {
        return Err(crate::error::fail(AML_ENOMEM, "malloc failed"));
    }
    // SAFETY: `block` holds `bytes` bytes, aligned for pointers (malloc); the three parts are
    // laid out back to back inside it, each pointer-aligned (all fields are pointer-sized).
    unsafe {
        let l = block.cast::<AmlLayout>();
        let d = block
            .add(std::mem::size_of::<AmlLayout>())
            .cast::<AmlLayoutDense>();
        let arr = block.add(head).cast::<usize>();
        std::ptr::copy_nonoverlapping(dims.as_ptr(), arr, n);
        std::ptr::copy_nonoverlapping(stride.as_ptr(), arr.add(n), n);
        std::ptr::copy_nonoverlapping(cpitch.as_ptr(), arr.add(2 * n), n);
        // One more slot, as AML's cpitch array: the total pitch.
        *arr.add(3 * n) = cpitch[n - 1] * dims[n - 1] * stride[n - 1];
        d.write(AmlLayoutDense {
            ptr,
            ndims: n,
            dims: arr,
            stride: arr.add(n),
            cpitch: arr.add(2 * n),
        });
        l.write(AmlLayout {
            ops: if row {
                &aml_layout_row_ops
            } else {
                &aml_layout_column_ops
            },
            data: d.cast(),
        });
        Ok(l)
    }
}

/// Reads `n` values of a C array.
///
/// # Safety
/// 1. `p` is NULL or valid for `n` reads.
pub(crate) unsafe fn arr<'a>(p: *const usize, n: usize, what: &str) -> Result<&'a [usize], Fail> {
    if p.is_null() {
        return Err(inval(format!("{what} is NULL")));
    }
    // SAFETY: (1).
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Writes a new layout to `*out`.
///
/// # Safety
/// 1. `out` is NULL or valid for one write.
pub(crate) unsafe fn emit(out: Out, l: Result<*mut AmlLayout, Fail>) -> Result<c_int, Fail> {
    // SAFETY: (1).
    let o = unsafe { out.as_mut() }.ok_or_else(|| inval("output layout pointer is NULL"))?;
    *o = l?;
    Ok(AML_SUCCESS)
}

/// Creates a dense layout over `ptr` (AML's constructor): `order` is
/// `AML_LAYOUT_ORDER_COLUMN_MAJOR` (0) or `AML_LAYOUT_ORDER_ROW_MAJOR` (1), `dims` in that
/// order; `stride` (elements between consecutive elements of a dim; NULL: 1) and `pitch`
/// (elements between consecutive indices of the next dim; NULL: the dims, as AML, even with
/// strides) in the same order. Returns `AML_SUCCESS`, `-AML_EINVAL` (NULL layout, ptr or dims,
/// zero size or ndims, unknown order, zero dim or stride, a given pitch below dim * stride) or
/// `-AML_ENOMEM`.
///
/// # Safety
/// 1. `layout` is NULL or valid for one write; `dims` is NULL or valid for `ndims` reads, and
///    `stride`, `pitch` likewise.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_dense_create(
    layout: Out,
    ptr: *mut c_void,
    order: c_int,
    element_size: usize,
    ndims: usize,
    dims: *const usize,
    stride: *const usize,
    pitch: *const usize,
) -> c_int {
    guard(|| {
        if layout.is_null() || ptr.is_null() || element_size == 0 || ndims == 0 {
            return Err(inval(
                "layout, ptr, element_size and ndims must be non-NULL / non-zero",
            ));
        }
        // SAFETY: (1).
        let dims = unsafe { arr(dims, ndims, "dims") }?;
        let get = |p: *const usize, what| -> Result<Option<&[usize]>, Fail> {
            // SAFETY: (1).
            (!p.is_null())
                .then(|| unsafe { arr(p, ndims, what) })
                .transpose()
        };
        let (stride, pitch) = (get(stride, "stride")?, get(pitch, "pitch")?);
        let row = match order & 1 {
            AML_LAYOUT_ORDER_ROW_MAJOR => true,
            _ if order == AML_LAYOUT_ORDER_COLUMN_MAJOR => false,
            _ => {
                return Err(inval(format!(
                    "order {order} is neither row nor column major"
                )))
            }
        };
        let native = |a: &[usize]| -> Vec<usize> {
            if row {
                a.iter().rev().copied().collect()
            } else {
                a.to_vec()
            }
        };
        let d = native(dims);
        let s = stride.map_or_else(|| vec![1; ndims], native);
        let p = pitch.map_or_else(|| d.clone(), native);
        if d.contains(&0) || s.contains(&0) {
            return Err(inval("a dim or stride is 0"));
        }
        let mut cpitch = vec![element_size; ndims];
        // A dimension's extent, (dim - 1) x stride + 1, checked (it wrapped in release builds
        // and let a too-small pitch through).
        // A NULL pitch is AML's default, the dims, whatever the strides: such a layout's
        // elements may overlap (AML's own tests make them), so only a given pitch is checked.
        let extent = |i: usize| (d[i] - 1).checked_mul(s[i]).and_then(|x| x.checked_add(1));
        for i in 1..ndims {
            let need = extent(i - 1).ok_or_else(|| inval("dims x strides overflow"))?;
            if pitch.is_some() && p[i - 1] < need {
                return Err(inval(format!(
                    "pitch {} is below what dim {} x stride {} needs",
                    p[i - 1],
                    d[i - 1],
                    s[i - 1]
                )));
            }
            cpitch[i] = cpitch[i - 1]
                .checked_mul(p[i - 1])
                .ok_or_else(|| inval("pitch overflows"))?;
        }
        // The total pitch `alloc` stores, checked too.
        cpitch[ndims - 1]
            .checked_mul(d[ndims - 1])
            .and_then(|x| x.checked_mul(s[ndims - 1]))
            .ok_or_else(|| inval("the total pitch overflows"))?;
        // SAFETY: (1).
        unsafe { emit(layout, alloc(ptr, row, &d, &s, &cpitch)) }
    })
}

/// Reads a dense layout's data (for the ops below, which AML lets skip checks).
///
/// # Safety
/// 1. `data` is NULL or a valid `struct aml_layout_dense`.
pub(crate) unsafe fn data(data: Data) -> Result<Dense, Fail> {
    // SAFETY: (1).
    unsafe { Dense::read(data.cast(), false) }
}

pub(crate) fn offset(d: &Dense, coords: &[usize], reversed: bool) -> u64 {
    let n = d.dims.len();
    (0..n)
        .map(|i| {
            let k = if reversed { n - 1 - i } else { i };
            (coords[i] * d.bs[k]) as u64
        })
        .sum::<u64>()
        + d.ptr
}

/// The address at `coords` (native order, or row-major if `reversed`) of a dense layout's
/// data, read in place: the deref ops run once per tile or element in AML's kernels
/// (`aml_tiling_rawptr` in a loop), so they allocate nothing and cannot panic (iterators,
/// wrapping arithmetic), as [`plain_ptr`] needs.
///
/// # Safety
/// 1. `data` is NULL or a valid `struct aml_layout_dense` whose arrays hold `ndims` values;
///    `coords` NULL or valid for `ndims` reads.
unsafe fn dense_deref(
    data: Data,
    coords: *const usize,
    reversed: bool,
) -> Result<*mut c_void, Fail> {
    // SAFETY: (1).
    let d = unsafe { data.cast::<AmlLayoutDense>().as_ref() }
        .ok_or_else(|| inval("layout data is NULL"))?;
    if d.ndims == 0 || d.stride.is_null() || d.cpitch.is_null() {
        return Err(inval("dense layout without dims"));
    }
    let n = d.ndims;
    // SAFETY: (1).
    let (stride, cpitch, c) = unsafe {
        (
            std::slice::from_raw_parts(d.stride, n),
            std::slice::from_raw_parts(d.cpitch, n),
            arr(coords, n, "coords")?,
        )
    };
    // Wrapping, as AML's pointer arithmetic: coords are not checked (only out-of-range ones
    // could overflow).
    let step = |off: usize, (ci, (cp, st)): (&usize, (&usize, &usize))| {
        off.wrapping_add(cp.wrapping_mul(*st).wrapping_mul(*ci))
    };
    let bs = cpitch.iter().zip(stride);
    let off = if reversed {
        c.iter().zip(bs.rev()).fold(0, step)
    } else {
        c.iter().zip(bs).fold(0, step)
    };
    Ok((d.ptr as usize).wrapping_add(off) as *mut c_void)
}

/// `l`'s data if it is one of this library's dense layouts (either order), for the callers
/// that compute its addresses without the call through its ops (the tilings' `rawptr`, once
/// per tile in AML's kernels).
///
/// # Safety
/// 1. `l` NULL or a valid layout.
pub(crate) unsafe fn as_dense<'a>(l: *const AmlLayout) -> Option<&'a AmlLayoutDense> {
    // SAFETY: (1).
    let l = unsafe { l.as_ref() }?;
    if !std::ptr::eq(l.ops, &aml_layout_column_ops) && !std::ptr::eq(l.ops, &aml_layout_row_ops) {
        return None;
    }
    // SAFETY: (1): a dense layout's data.
    unsafe { l.data.cast::<AmlLayoutDense>().as_ref() }
}

/// Element at native coordinates (column-major order). No bounds check, as AML.
///
/// # Safety
/// 1. `data` is a valid dense layout's data; `coords` holds `ndims` values.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_column_deref(data: Data, coords: *const usize) -> *mut c_void {
    // SAFETY: (1).
    plain_ptr(unsafe { dense_deref(data, coords, false) })
}

/// Element at row-major coordinates (last dim fastest). No bounds check, as AML.
///
/// # Safety
/// 1. `data` is a valid dense layout's data; `coords` holds `ndims` values.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_row_deref(data: Data, coords: *const usize) -> *mut c_void {
    // SAFETY: (1).
    plain_ptr(unsafe { dense_deref(data, coords, true) })
}

/// The pointer of a dense layout, from its data (its `rawptr` method; AML exports it without
/// declaring it). NULL with `aml_errno` for NULL data.
///
/// # Safety
/// 1. `data` NULL or a valid dense layout's data.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_dense_rawptr(data: Data) -> *mut c_void {
    // SAFETY: (1).
    guard_ptr(|| Ok(unsafe { self::data(data) }?.ptr as *mut c_void))
}

/// `AML_LAYOUT_ORDER_COLUMN_MAJOR`.
///
/// # Safety
/// 1. None (`data` is unused).
#[no_mangle]
pub unsafe extern "C" fn aml_layout_column_order(_data: Data) -> c_int {
    AML_LAYOUT_ORDER_COLUMN_MAJOR
}

/// `AML_LAYOUT_ORDER_ROW_MAJOR`.
///
/// # Safety
/// 1. None (`data` is unused).
#[no_mangle]
pub unsafe extern "C" fn aml_layout_row_order(_data: Data) -> c_int {
    AML_LAYOUT_ORDER_ROW_MAJOR
}

/// Writes the dims in native order, or reversed.
///
/// # Safety
/// 1. `data` is a valid dense layout's data; `dims` is NULL or valid for `ndims` writes.
unsafe fn write_dims(data: Data, dims: *mut usize, reversed: bool) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let d = unsafe { self::data(data) }?;
        if dims.is_null() {
            return Err(inval("dims is NULL"));
        }
        // SAFETY: (1).
        let out = unsafe { std::slice::from_raw_parts_mut(dims, d.dims.len()) };
        out.copy_from_slice(&d.dims);
        if reversed {
            out.reverse();
        }
        Ok(AML_SUCCESS)
    })
}

/// The dims of a column-major dense layout, in column-major order (its `dims` method; AML
/// exports it without declaring it).
///
/// # Safety
/// 1. `data` is a valid dense layout's data; `dims` is NULL or valid for `ndims` writes.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_column_dims(data: Data, dims: *mut usize) -> c_int {
    // SAFETY: forwarded.
    unsafe { write_dims(data, dims, false) }
}

/// The dims of a row-major layout, in row-major order.
///
/// # Safety
/// 1. `data` is a valid dense layout's data; `dims` is valid for `ndims` writes.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_row_dims(data: Data, dims: *mut usize) -> c_int {
    // SAFETY: forwarded.
    unsafe { write_dims(data, dims, true) }
}

/// The number of dims of a dense layout (0 on a NULL `data`, with `aml_errno`).
///
/// # Safety
/// 1. `data` is NULL or a valid dense layout's data.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_dense_ndims(data: Data) -> usize {
    let mut n = 0;
    // SAFETY: (1).
    guard_void(|| {
        // SAFETY: (1).
        n = unsafe { self::data(data) }?.dims.len();
        Ok(AML_SUCCESS)
    });
    n
}

/// The element size of a dense layout (`cpitch[0]`; 0 on a NULL `data`, with `aml_errno`).
///
/// # Safety
/// 1. `data` is NULL or a valid dense layout's data.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_dense_element_size(data: Data) -> usize {
    let mut n = 0;
    // SAFETY: (1).
    guard_void(|| {
        // SAFETY: (1).
        n = unsafe { self::data(data) }?.elem;
        Ok(AML_SUCCESS)
    });
    n
}

/// AML's text for a dense layout: a header line, the pointer, ndims, then one line per dim (in
/// the user's order) with its dim, stride and cumulative pitch.
///
/// # Safety
/// 1. `data` is a valid dense layout's data.
unsafe fn dense_text(data: Data, row: bool) -> Result<Vec<String>, Fail> {
    // SAFETY: (1).
    let d: &AmlLayoutDense = unsafe { data.cast::<AmlLayoutDense>().as_ref() }
        .ok_or_else(|| inval("layout data is NULL"))?;
    let order = if row { "row-major" } else { "column-major" };
    let mut lines = vec![
        format!("layout-dense: {data:p}: {order}"),
        format!("ptr: {:p}", d.ptr),
        format!("ndims: {}", d.ndims),
    ];
    if d.ndims == 0 || d.dims.is_null() || d.stride.is_null() || d.cpitch.is_null() {
        return Ok(lines);
    }
    // SAFETY: (1): a dense layout's arrays hold `ndims` values.
    let (dims, stride, cpitch) = unsafe {
        (
            std::slice::from_raw_parts(d.dims, d.ndims),
            std::slice::from_raw_parts(d.stride, d.ndims),
            std::slice::from_raw_parts(d.cpitch, d.ndims),
        )
    };
    for i in 0..d.ndims {
        let j = if row { d.ndims - i - 1 } else { i };
        lines.push(format!(
            "{i:16}: {:16} {:16} {:16}",
            dims[j], stride[j], cpitch[j]
        ));
    }
    Ok(lines)
}

/// Prints a column-major dense layout, from its data (its `fprintf` method; AML exports it
/// without declaring it).
///
/// # Safety
/// 1. `data` is a valid column-major dense layout's data; `stream` a valid `FILE *`; `prefix`
///    NULL or a C string.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_column_fprintf(
    data: Data,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    // SAFETY: (1).
    guard(|| unsafe { crate::dma::print_lines(stream, prefix, &dense_text(data, false)?) })
}

/// Prints a row-major dense layout, from its data (its `fprintf` method; AML exports it
/// without declaring it).
///
/// # Safety
/// 1. `data` is a valid row-major dense layout's data; `stream` a valid `FILE *`; `prefix`
///    NULL or a C string.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_row_fprintf(
    data: Data,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    // SAFETY: (1).
    guard(|| unsafe { crate::dma::print_lines(stream, prefix, &dense_text(data, true)?) })
}

/// Copies a dense layout in `*out`, over `ptr` (NULL: the same pointer) (its `duplicate`
/// method; AML exports it without declaring it). `-AML_EINVAL` for NULL or a layout that is
/// not dense.
///
/// # Safety
/// 1. `layout` NULL or a valid layout; `out` valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_dense_duplicate(
    layout: *const AmlLayout,
    out: Out,
    ptr: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let l = unsafe { layout.as_ref() }.ok_or_else(|| inval("layout is NULL"))?;
        if !std::ptr::eq(l.ops, &aml_layout_column_ops) && !std::ptr::eq(l.ops, &aml_layout_row_ops)
        {
            return Err(inval("not a dense layout"));
        }
        // SAFETY: (1).
        let d: &AmlLayoutDense = unsafe { l.data.cast::<AmlLayoutDense>().as_ref() }
            .ok_or_else(|| inval("layout data is NULL"))?;
        let n = d.ndims;
        // SAFETY: (1): a dense layout's arrays hold `ndims` values.
        let (dims, stride, cpitch) = unsafe {
            (
                std::slice::from_raw_parts(d.dims, n),
                std::slice::from_raw_parts(d.stride, n),
                std::slice::from_raw_parts(d.cpitch, n),
            )
        };
        let p = if ptr.is_null() { d.ptr } else { ptr };
        let row = std::ptr::eq(l.ops, &aml_layout_row_ops);
        // SAFETY: (1).
        unsafe { emit(out, alloc(p, row, dims, stride, cpitch)) }
    })
}

mod composite;
mod derive;
pub(crate) mod generic;
pub mod pad;
pub mod reshape;
pub use derive::*;
pub use generic::*;
