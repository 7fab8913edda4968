//! Layouts: N-D strided views of elements in a buffer (`ferry_layout`).

use crate::error::{array, guard, out, Fail, FERRY_ELAYOUT, FERRY_SUCCESS};
use ferry::{Layout, LayoutError, MAX_DIMS};
use std::ffi::c_int;

/// The most dimensions a layout holds (`FERRY_MAX_DIMS` in C).
pub const FERRY_MAX_DIMS: usize = MAX_DIMS;
/// Row-major (C) order: the last dim is contiguous.
pub const FERRY_ORDER_ROW_MAJOR: c_int = 0;
/// Column-major (Fortran) order: the first dim is contiguous.
pub const FERRY_ORDER_COLUMN_MAJOR: c_int = 1;

const LAYOUT_MAGIC: u64 = 0x6665_7272_795f_6c61; // "ferry_la"

/// A layout handle (`ferry_layout` in C). Immutable once created.
pub struct FerryLayout {
    magic: u64,
    pub(crate) layout: Layout,
}

impl FerryLayout {
    pub(crate) fn boxed(layout: Layout) -> *mut FerryLayout {
        Box::into_raw(Box::new(FerryLayout {
            magic: LAYOUT_MAGIC,
            layout,
        }))
    }
}

/// Checks a layout handle.
///
/// # Safety
/// 1. `p` is NULL or points to a live `FerryLayout` (or to readable memory of at least its size).
pub(crate) unsafe fn layout_ref<'a>(p: *const FerryLayout, what: &str) -> Result<&'a Layout, Fail> {
    // SAFETY: the caller's guarantee (1).
    let l = unsafe { p.as_ref() }.ok_or_else(|| Fail::inval(format!("{what} is NULL")))?;
    if l.magic != LAYOUT_MAGIC {
        return Err(Fail::inval(format!(
            "{what} is not a ferry_layout (destroyed, or another handle type)"
        )));
    }
    Ok(&l.layout)
}

/// Same as `layout_ref`, `None` for NULL.
///
/// # Safety
/// As [`layout_ref`].
pub(crate) unsafe fn layout_opt(p: *const FerryLayout, what: &str) -> Result<Option<Layout>, Fail> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded.
    unsafe { layout_ref(p, what) }.map(|l| Some(*l))
}

/// The C API's own rule, kept where ferry's `Layout` now accepts empty layouts: every dim holds
/// at least one element (`ferry.h` documents a zero dim as `-FERRY_ELAYOUT`).
fn check_no_zero_dim(dims: &[usize]) -> Result<(), Fail> {
    match dims.iter().position(|&d| d == 0) {
        Some(axis) => Err(LayoutError::ZeroDim { axis }.into()),
        None => Ok(()),
    }
}

fn check_ndims(ndims: usize) -> Result<(), Fail> {
    if ndims > MAX_DIMS {
        return Err(Fail::new(
            FERRY_ELAYOUT,
            format!("{ndims} dims, at most {MAX_DIMS} are supported"),
        ));
    }
    Ok(())
}

/// Writes a new layout handle to `*out`.
fn emit(out: &mut *mut FerryLayout, l: Layout) -> Result<c_int, Fail> {
    *out = FerryLayout::boxed(l);
    Ok(FERRY_SUCCESS)
}

/// Creates a dense layout of `ndims` dims (outermost first) in row-major or column-major
/// order.
///
/// Returns `FERRY_SUCCESS`, `-FERRY_EINVAL` (NULL pointer, unknown order) or `-FERRY_ELAYOUT`
/// (no dims, more than `FERRY_MAX_DIMS`, a zero dim or element size, overflow).
///
/// # Safety
/// 1. `out` is NULL or valid for one write.
/// 2. `dims` is NULL or valid for reads of `ndims` values.
#[no_mangle]
pub unsafe extern "C" fn ferry_layout_create_dense(
    out: *mut *mut FerryLayout,
    ndims: usize,
    dims: *const usize,
    elem_size: usize,
    order: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let out = unsafe { crate::error::out(out, "out") }?;
        check_ndims(ndims)?;
        // SAFETY: (2).
        let dims = unsafe { array(dims, ndims, "dims") }?;
        check_no_zero_dim(dims)?;
        let l = match order {
            FERRY_ORDER_ROW_MAJOR => Layout::contiguous(dims, elem_size)?,
            FERRY_ORDER_COLUMN_MAJOR => Layout::column_major(dims, elem_size)?,
            o => {
                return Err(Fail::inval(format!(
                    "order {o} is neither FERRY_ORDER_ROW_MAJOR nor FERRY_ORDER_COLUMN_MAJOR"
                )))
            }
        };
        emit(out, l)
    })
}

/// Creates a general layout: `ndims` dims (outermost first), the byte stride of each, the
/// element size, and the byte offset of the first element in the buffer.
///
/// Returns `FERRY_SUCCESS`, `-FERRY_EINVAL` (NULL pointer) or `-FERRY_ELAYOUT` (as
/// `ferry_layout_create_dense`, or an offset that overflows).
///
/// # Safety
/// 1. `out` is NULL or valid for one write.
/// 2. `dims` and `byte_strides` are NULL or valid for reads of `ndims` values each.
#[no_mangle]
pub unsafe extern "C" fn ferry_layout_create_strided(
    out: *mut *mut FerryLayout,
    ndims: usize,
    dims: *const usize,
    byte_strides: *const usize,
    elem_size: usize,
    offset: usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let out = unsafe { crate::error::out(out, "out") }?;
        check_ndims(ndims)?;
        // SAFETY: (2).
        let dims = unsafe { array(dims, ndims, "dims") }?;
        check_no_zero_dim(dims)?;
        // SAFETY: (2).
        let strides = unsafe { array(byte_strides, ndims, "byte_strides") }?;
        emit(
            out,
            Layout::with_byte_strides(dims, strides, elem_size)?.with_offset(offset)?,
        )
    })
}

/// Creates a layout that is `in` with axis `axis` cut to elements `start, start+step, ...`
/// below `end` (numpy's `a[start:end:step]` on that axis). `in` is unchanged.
///
/// Returns `FERRY_SUCCESS`, `-FERRY_EINVAL` (NULL pointer, bad handle) or `-FERRY_ELAYOUT`
/// (axis out of range, zero step, empty range or a range past the dim).
///
/// # Safety
/// 1. `in` is NULL or a layout from `ferry_layout_create_*` not yet destroyed.
/// 2. `out` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_layout_slice(
    r#in: *const FerryLayout,
    out: *mut *mut FerryLayout,
    axis: usize,
    start: usize,
    end: usize,
    step: usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let l = unsafe { layout_ref(r#in, "in") }?;
        // SAFETY: (2).
        let out = unsafe { crate::error::out(out, "out") }?;
        emit(out, l.slice(axis, start..end, step)?)
    })
}

/// Creates a layout with the same elements, in the same row-major order, seen with new dims,
/// without copying (numpy's reshape). `-FERRY_ELAYOUT` if the element counts differ or the
/// shape cannot be expressed without a copy (e.g. flattening a transposed matrix).
///
/// # Safety
/// 1. `in` is NULL or a layout from `ferry_layout_create_*` not yet destroyed.
/// 2. `out` is NULL or valid for one write.
/// 3. `dims` is NULL or valid for reads of `ndims` values.
#[no_mangle]
pub unsafe extern "C" fn ferry_layout_reshape(
    r#in: *const FerryLayout,
    out: *mut *mut FerryLayout,
    ndims: usize,
    dims: *const usize,
) -> c_int {
    // SAFETY: the caller's guarantees (1) to (3) are `derive`'s.
    unsafe { derive(r#in, out, (ndims, dims, "dims"), Layout::reshape) }
}

/// Creates a layout whose dim `i` is dim `order[i]` of `in` (a transpose for 2 dims).
/// `-FERRY_ELAYOUT` unless `order` is a permutation of `0..ndims` with `ndims` the layout's
/// number of dims.
///
/// # Safety
/// 1. `in` is NULL or a layout from `ferry_layout_create_*` not yet destroyed.
/// 2. `out` is NULL or valid for one write.
/// 3. `order` is NULL or valid for reads of `ndims` values.
#[no_mangle]
pub unsafe extern "C" fn ferry_layout_permute(
    r#in: *const FerryLayout,
    out: *mut *mut FerryLayout,
    ndims: usize,
    order: *const usize,
) -> c_int {
    // SAFETY: the caller's guarantees (1) to (3) are `derive`'s.
    unsafe { derive(r#in, out, (ndims, order, "order"), Layout::permute) }
}

/// The body of [`ferry_layout_reshape`] and [`ferry_layout_permute`]: the layout `f` makes of
/// `in` and the `ndims` values at `vals` (named `what` in errors), written to `out`.
///
/// # Safety
/// 1. `in` is NULL or a layout from `ferry_layout_create_*` not yet destroyed.
/// 2. `out` is NULL or valid for one write.
/// 3. `vals` is NULL or valid for reads of `ndims` values.
unsafe fn derive(
    r#in: *const FerryLayout,
    out: *mut *mut FerryLayout,
    (ndims, vals, what): (usize, *const usize, &'static str),
    f: fn(&Layout, &[usize]) -> Result<Layout, ferry::LayoutError>,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let l = unsafe { layout_ref(r#in, "in") }?;
        // SAFETY: (2).
        let out = unsafe { crate::error::out(out, "out") }?;
        check_ndims(ndims)?;
        // SAFETY: (3).
        let vals = unsafe { array(vals, ndims, what) }?;
        emit(out, f(l, vals)?)
    })
}

/// Describes a layout. Each output pointer may be NULL (not written). `dims` and
/// `byte_strides` receive one value per dim and must have room for `capacity` values;
/// `-FERRY_EINVAL` if the layout has more dims than `capacity` and either array is given
/// (`FERRY_MAX_DIMS` is always enough).
///
/// # Safety
/// 1. `layout` is NULL or a layout from `ferry_layout_create_*` not yet destroyed.
/// 2. Each non-NULL output is valid for writes (`dims`, `byte_strides`: `capacity` values).
#[no_mangle]
pub unsafe extern "C" fn ferry_layout_describe(
    layout: *const FerryLayout,
    capacity: usize,
    ndims: *mut usize,
    dims: *mut usize,
    byte_strides: *mut usize,
    elem_size: *mut usize,
    offset: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let l = unsafe { layout_ref(layout, "layout") }?;
        if (!dims.is_null() || !byte_strides.is_null()) && capacity < l.ndim() {
            return Err(Fail::inval(format!(
                "capacity {capacity} is less than the layout's {} dims",
                l.ndim()
            )));
        }
        // SAFETY: (2), each checked non-null, arrays of at least `capacity` >= ndim values.
        unsafe {
            if !ndims.is_null() {
                *ndims = l.ndim();
            }
            if !dims.is_null() {
                std::slice::from_raw_parts_mut(dims, l.ndim()).copy_from_slice(l.dims());
            }
            if !byte_strides.is_null() {
                std::slice::from_raw_parts_mut(byte_strides, l.ndim()).copy_from_slice(l.strides());
            }
            if !elem_size.is_null() {
                *elem_size = l.elem_size();
            }
            if !offset.is_null() {
                *offset = l.offset();
            }
        }
        Ok(FERRY_SUCCESS)
    })
}

/// The smallest buffer, in bytes, that holds the layout (one past its last byte, offset
/// included), written to `*bytes`.
///
/// # Safety
/// 1. `layout` is NULL or a layout from `ferry_layout_create_*` not yet destroyed.
/// 2. `bytes` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_layout_span(layout: *const FerryLayout, bytes: *mut usize) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let l = unsafe { layout_ref(layout, "layout") }?;
        // SAFETY: (2).
        *unsafe { out(bytes, "bytes") }? = l.span().end;
        Ok(FERRY_SUCCESS)
    })
}

/// Destroys a layout and sets `*layout` to NULL. A NULL `*layout` is a no-op returning
/// `FERRY_SUCCESS`; a NULL `layout` is `-FERRY_EINVAL`. Requests created with the layout do not
/// need it any more (they keep a copy).
///
/// # Safety
/// 1. `layout` is NULL or valid for a read and a write of one pointer.
/// 2. `*layout` is NULL or a layout from `ferry_layout_create_*` not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn ferry_layout_destroy(layout: *mut *mut FerryLayout) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let slot = unsafe { out(layout, "layout") }?;
        if slot.is_null() {
            return Ok(FERRY_SUCCESS);
        }
        // SAFETY: (2): checks the magic before taking ownership.
        unsafe { layout_ref(*slot, "*layout") }?;
        // SAFETY: (2): the pointer came from `Box::into_raw` and is not used after this.
        let mut b = unsafe { Box::from_raw(*slot) };
        b.magic = 0;
        drop(b);
        *slot = std::ptr::null_mut();
        Ok(FERRY_SUCCESS)
    })
}
