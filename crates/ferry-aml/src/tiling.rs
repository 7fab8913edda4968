//! Tilings (`aml.h`'s generic calls, `aml/tiling/{resize,pad,native}.h`): a layout cut into
//! tiles of given dims, each tile a new layout (a slice of the tiled layout, which the tiling
//! does not own). The resize tiling's border tiles are smaller; the pad tiling's are pad
//! layouts of the full tile dims over the border slice, with the tiling's neutral element.
//! As AML's: the tiling, its data, arrays and neutral element are one `malloc` block, and the
//! data is AML's public struct (`struct aml_tiling_resize` a prefix of `struct
//! aml_tiling_pad`); the dims are kept in native (column-major) order. Coordinates out of the
//! tiling are refused (NULL, `aml_errno` `AML_EINVAL`; AML asserts).

use crate::error::{fail, guard, guard_ptr, inval, plain_ptr, AML_ENOMEM, AML_SUCCESS};
use crate::excit::{excit_dimension, excit_peek, Excit, EXCIT_SUCCESS};
use crate::layout::generic::{
    aml_layout_deref_native, aml_layout_dims, aml_layout_dims_native, aml_layout_element_size,
    aml_layout_fprintf, aml_layout_ndims, aml_layout_order, aml_layout_slice_native,
};
use crate::layout::pad::aml_layout_pad_create;
use crate::layout::{AmlLayout, AML_LAYOUT_ORDER_ROW_MAJOR};
use ferry_capi::Fail;
use std::ffi::{c_char, c_int, c_void};

/// `AML_TILING_ORDER_COLUMN_MAJOR`.
pub const AML_TILING_ORDER_COLUMN_MAJOR: c_int = 0;
/// `AML_TILING_ORDER_ROW_MAJOR`.
pub const AML_TILING_ORDER_ROW_MAJOR: c_int = 1;

/// A tiling's data, as the ops see it (`struct aml_tiling_data *`).
pub type TData = *const c_void;

/// `struct aml_tiling_ops`, AML's fields in AML's order.
#[repr(C)]
pub struct AmlTilingOps {
    /// The tile at coords (the tiling's order).
    pub index: Option<unsafe extern "C" fn(TData, *const usize) -> *mut AmlLayout>,
    /// The tile at coords (native order).
    pub index_native: Option<unsafe extern "C" fn(TData, *const usize) -> *mut AmlLayout>,
    /// The address of the tile's first element.
    pub rawptr: Option<unsafe extern "C" fn(TData, *const usize) -> *mut c_void>,
    /// `AML_TILING_ORDER_*`.
    pub order: Option<unsafe extern "C" fn(TData) -> c_int>,
    /// Tiles per dim (the tiling's order).
    pub dims: Option<unsafe extern "C" fn(TData, *mut usize) -> c_int>,
    /// Tiles per dim (native order).
    pub dims_native: Option<unsafe extern "C" fn(TData, *mut usize) -> c_int>,
    /// Number of dims.
    pub ndims: Option<unsafe extern "C" fn(TData) -> usize>,
    /// Number of tiles.
    pub ntiles: Option<unsafe extern "C" fn(TData) -> usize>,
    /// Prints the tiling.
    pub fprintf: Option<unsafe extern "C" fn(TData, *mut libc::FILE, *const c_char) -> c_int>,
}

/// `struct aml_tiling`.
#[repr(C)]
pub struct AmlTiling {
    /// The tiling's functions.
    pub ops: *const AmlTilingOps,
    /// Implementation data.
    pub data: *mut c_void,
}

/// `struct aml_tiling_pad`, AML's fields in AML's order; its first six are `struct
/// aml_tiling_resize`.
#[repr(C)]
pub struct AmlTilingPad {
    /// The tags given at creation.
    pub tags: c_int,
    /// The tiled layout (not owned).
    pub layout: *const AmlLayout,
    /// Number of dims.
    pub ndims: usize,
    /// Tile dims, native order.
    pub tile_dims: *mut usize,
    /// Tiles per dim, native order.
    pub dims: *mut usize,
    /// Dims of the last tile of each dim, native order.
    pub border_tile_dims: *mut usize,
    /// 1 where the last tile is padded (pad tiling only).
    pub pad: *mut usize,
    /// The neutral element (pad tiling only).
    pub neutral: *mut c_void,
}

/// `struct aml_tiling_resize`.
#[repr(C)]
pub struct AmlTilingResize {
    /// The tags given at creation.
    pub tags: c_int,
    /// The tiled layout (not owned).
    pub layout: *const AmlLayout,
    /// Number of dims.
    pub ndims: usize,
    /// Tile dims, native order.
    pub tile_dims: *mut usize,
    /// Tiles per dim, native order.
    pub dims: *mut usize,
    /// Dims of the last tile of each dim, native order.
    pub border_tile_dims: *mut usize,
}

/// A tiling's data read back: the arrays as slices; `pad` and `neutral` for a pad tiling.
struct View<'a> {
    tags: c_int,
    layout: *const AmlLayout,
    tile_dims: &'a [usize],
    dims: &'a [usize],
    border: &'a [usize],
    pad: Option<(&'a [usize], *mut c_void)>,
}

/// Reads a tiling's data (a pad tiling's if `pad`).
///
/// # Safety
/// 1. `data` is NULL or a valid resize tiling's data (a pad tiling's if `pad`).
unsafe fn view<'a>(data: TData, pad: bool) -> Result<View<'a>, Fail> {
    // SAFETY: (1): both structs start with the resize fields.
    let d = unsafe { data.cast::<AmlTilingResize>().as_ref() }
        .ok_or_else(|| inval("tiling data is NULL"))?;
    if d.tile_dims.is_null() || d.dims.is_null() || d.border_tile_dims.is_null() {
        return Err(inval("tiling without dims"));
    }
    let n = d.ndims;
    // SAFETY: (1): the arrays hold `ndims` values each.
    let (tile_dims, dims, border) = unsafe {
        (
            std::slice::from_raw_parts(d.tile_dims, n),
            std::slice::from_raw_parts(d.dims, n),
            std::slice::from_raw_parts(d.border_tile_dims, n),
        )
    };
    let pad = if pad {
        // SAFETY: (1): a pad tiling's data.
        let p = unsafe { &*data.cast::<AmlTilingPad>() };
        if p.pad.is_null() {
            return Err(inval("pad tiling without pad flags"));
        }
        // SAFETY: (1).
        Some((unsafe { std::slice::from_raw_parts(p.pad, n) }, p.neutral))
    } else {
        None
    };
    Ok(View {
        tags: d.tags,
        layout: d.layout,
        tile_dims,
        dims,
        border,
        pad,
    })
}

/// Creates a tiling (a pad one with `neutral`): one block, AML's data, dims in native order.
///
/// # Safety
/// 1. `layout` a valid layout outliving the tiling; `tile_dims` NULL or valid for `ndims`
///    reads; `neutral` NULL or valid for the layout's element size in reads.
unsafe fn create(
    tags: c_int,
    layout: *const AmlLayout,
    ndims: usize,
    tile_dims: *const usize,
    neutral: Option<*const c_void>,
) -> Result<*mut AmlTiling, Fail> {
    if layout.is_null() || tile_dims.is_null() || ndims == 0 {
        return Err(inval(
            "layout and tile dims must be non-NULL, ndims non-zero",
        ));
    }
    // SAFETY: (1).
    let given = unsafe { crate::layout::arr(tile_dims, ndims, "tile_dims") }?;
    if given.contains(&0) {
        return Err(inval("a tile dim is 0"));
    }
    // SAFETY: (1).
    if unsafe { aml_layout_ndims(layout) } != ndims {
        return Err(inval("the tiling's ndims is not the layout's"));
    }
    let mut target = vec![0usize; ndims];
    // SAFETY: (1); `target` holds `ndims` values.
    let rc = unsafe { aml_layout_dims_native(layout, target.as_mut_ptr()) };
    if rc != AML_SUCCESS {
        return Err(fail(-rc, "reading the layout's dims failed"));
    }
    let row = tags & 1 == AML_TILING_ORDER_ROW_MAJOR;
    let tile: Vec<usize> = if row {
        given.iter().rev().copied().collect()
    } else {
        given.to_vec()
    };
    let esize = if neutral.is_some() {
        // SAFETY: (1).
        unsafe { aml_layout_element_size(layout) }
    } else {
        0
    };
    let narr = if neutral.is_some() { 4 } else { 3 };
    let head = std::mem::size_of::<AmlTiling>() + std::mem::size_of::<AmlTilingPad>();
    let size = ndims
        .checked_mul(narr * std::mem::size_of::<usize>())
        .and_then(|a| a.checked_add(head))
        .and_then(|a| a.checked_add(esize))
        .ok_or_else(|| inval("too many dims"))?;
    // SAFETY: a plain allocation, checked below.
    let block = unsafe { libc::malloc(size) };
    if block.is_null() {
        return Err(fail(AML_ENOMEM, "tiling allocation failed"));
    }
    let ops: &AmlTilingOps = match (neutral.is_some(), row) {
        (false, false) => &aml_tiling_resize_column_ops,
        (false, true) => &aml_tiling_resize_row_ops,
        (true, false) => &aml_tiling_pad_column_ops,
        (true, true) => &aml_tiling_pad_row_ops,
    };
    // SAFETY: `block` holds the tiling, the data (the pad struct's size for both, 8-aligned
    // after the 16-byte tiling), `narr * ndims` values and `esize` bytes.
    unsafe {
        let t = block.cast::<AmlTiling>();
        let d = t.add(1).cast::<AmlTilingPad>();
        let a = d.add(1).cast::<usize>();
        let (td, dims, border) = (a, a.add(ndims), a.add(2 * ndims));
        for i in 0..ndims {
            *td.add(i) = tile[i];
            *dims.add(i) = target[i].div_ceil(tile[i]);
            *border.add(i) = match target[i] % tile[i] {
                0 => tile[i],
                r => r,
            };
        }
        let (pad, nptr) = match neutral {
            Some(n) => {
                let pad = a.add(3 * ndims);
                for i in 0..ndims {
                    *pad.add(i) = usize::from(target[i] % tile[i] != 0);
                }
                let nptr = pad.add(ndims).cast::<u8>();
                std::ptr::copy_nonoverlapping(n.cast::<u8>(), nptr, esize);
                (pad, nptr.cast::<c_void>())
            }
            None => (std::ptr::null_mut(), std::ptr::null_mut()),
        };
        d.write(AmlTilingPad {
            tags,
            layout,
            ndims,
            tile_dims: td,
            dims,
            border_tile_dims: border,
            pad,
            neutral: nptr,
        });
        t.write(AmlTiling {
            ops,
            data: d.cast(),
        });
        Ok(t)
    }
}

/// The tile at `coords` (native order if `native`, else the tiling's order): a slice of the
/// layout, in a pad layout where the pad tiling's border tile is padded.
///
/// # Safety
/// 1. `data` as `view`'s; `coords` NULL or valid for `ndims` reads.
unsafe fn index(
    data: TData,
    coords: *const usize,
    row: bool,
    native: bool,
    pad: bool,
) -> Result<*mut AmlLayout, Fail> {
    // SAFETY: (1).
    let v = unsafe { view(data, pad) }?;
    let n = v.dims.len();
    // SAFETY: (1).
    let c = unsafe { crate::layout::arr(coords, n, "coords") }?;
    let c: Vec<usize> = if row && !native {
        c.iter().rev().copied().collect()
    } else {
        c.to_vec()
    };
    let mut offsets = vec![0usize; n];
    let mut dims = vec![0usize; n];
    let strides = vec![1usize; n];
    let mut padded = false;
    for i in 0..n {
        if c[i] >= v.dims[i] {
            return Err(inval(format!(
                "tile coords {c:?} out of the tiling's {:?}",
                v.dims
            )));
        }
        offsets[i] = c[i] * v.tile_dims[i];
        let last = c[i] == v.dims[i] - 1;
        dims[i] = if last { v.border[i] } else { v.tile_dims[i] };
        if let Some((p, _)) = v.pad {
            padded |= last && p[i] != 0;
        }
    }
    let mut tile: *mut AmlLayout = std::ptr::null_mut();
    // SAFETY: (1): the layout is the tiling's; the arrays hold `n` values.
    let rc = unsafe {
        aml_layout_slice_native(
            v.layout,
            &mut tile,
            offsets.as_ptr(),
            dims.as_ptr(),
            strides.as_ptr(),
        )
    };
    if rc != AML_SUCCESS {
        return Err(fail(-rc, "slicing the tile failed"));
    }
    let (Some((_, neutral)), true) = (v.pad, padded) else {
        return Ok(tile);
    };
    // SAFETY: (1).
    let lrow = unsafe { aml_layout_order(v.layout) } & 1 == AML_LAYOUT_ORDER_ROW_MAJOR;
    let pdims: Vec<usize> = if lrow {
        v.tile_dims.iter().rev().copied().collect()
    } else {
        v.tile_dims.to_vec()
    };
    let mut out: *mut AmlLayout = std::ptr::null_mut();
    // SAFETY: `tile` is this call's slice, owned by the pad layout on success; `pdims` holds
    // `n` values and the neutral element the layout's element size.
    let rc = unsafe {
        aml_layout_pad_create(
            &mut out,
            if lrow { 1 } else { 0 },
            tile,
            pdims.as_ptr(),
            neutral,
        )
    };
    if rc != AML_SUCCESS {
        // SAFETY: `tile` is still this call's.
        unsafe { crate::layout::generic::aml_layout_destroy(&mut tile) };
        return Err(fail(-rc, "padding the tile failed"));
    }
    Ok(out)
}

/// The native offsets of the tile at `coords` (native order) into `out`; no indexing, so
/// that `rawptr` cannot panic.
fn tile_offsets<'a>(
    coords: impl Iterator<Item = &'a usize>,
    v: &View,
    out: &mut [usize],
) -> Result<(), Fail> {
    for ((o, &ci), (&d, &t)) in out
        .iter_mut()
        .zip(coords)
        .zip(v.dims.iter().zip(v.tile_dims))
    {
        if ci >= d {
            return Err(inval("tile coords out of the tiling"));
        }
        // Below the layout's dim (ci < d tiles of t elements): no overflow.
        *o = ci.wrapping_mul(t);
    }
    Ok(())
}

/// The address of the first element of the tile at `coords`.
///
/// # Safety
/// 1. As `index`'s.
unsafe fn rawptr(data: TData, coords: *const usize, row: bool) -> Result<*mut c_void, Fail> {
    // SAFETY: (1): resize fields only.
    let v = unsafe { view(data, false) }?;
    let n = v.dims.len();
    // SAFETY: (1).
    let c = unsafe { crate::layout::arr(coords, n, "coords") }?;
    // On the stack up to 8 dims: AML's kernels call this once per tile.
    let (mut small, mut large) = ([0usize; 8], Vec::new());
    let offsets: &mut [usize] = match small.get_mut(..n) {
        Some(s) => s,
        None => {
            large.resize(n, 0);
            &mut large
        }
    };
    if row {
        tile_offsets(c.iter().rev(), &v, offsets)?;
    } else {
        tile_offsets(c.iter(), &v, offsets)?;
    }
    // SAFETY: (1): the tiling's layout; `offsets` holds `n` values.
    let p = unsafe { aml_layout_deref_native(v.layout, offsets.as_ptr()) };
    if p.is_null() {
        return Err(fail(crate::error::errno(), "the layout's deref failed"));
    }
    Ok(p.cast())
}

/// [`rawptr`] over one of this library's dense layouts, in one pass and without a call: the
/// tile's address, or None where anything is off (not a dense layout, NULL arrays, coords
/// out of the tiling, a NULL result), for the full path to report. AML's kernels call
/// `aml_tiling_rawptr` once per tile, so this is its cost.
///
/// # Safety
/// 1. As `index`'s.
#[inline]
unsafe fn dense_rawptr(data: TData, coords: *const usize, row: bool) -> Option<*mut c_void> {
    // SAFETY: (1): resize fields only.
    let t = unsafe { data.cast::<AmlTilingResize>().as_ref() }?;
    // SAFETY: (1): the tiling's layout.
    let l = unsafe { crate::layout::as_dense(t.layout) }?;
    let n = t.ndims;
    let ptrs = [t.tile_dims, t.dims, l.stride, l.cpitch];
    if l.ndims != n || coords.is_null() || ptrs.iter().any(|p| p.is_null()) {
        return None;
    }
    let [tile, dims, stride, cpitch, c] =
        [t.tile_dims.cast_const(), t.dims, l.stride, l.cpitch, coords].map(|p| {
            // SAFETY: (1): each array holds `ndims` values (the tiling's, its dense
            // layout's, the coords).
            unsafe { std::slice::from_raw_parts(p, n) }
        });
    // Per native dim: the tiles in it, and the bytes from one tile to the next (wrapping as
    // AML's pointer arithmetic; below the layout's extent for coords inside the tiling).
    let native = dims
        .iter()
        .zip(tile)
        .zip(cpitch.iter().zip(stride))
        .map(|((d, t), (cp, st))| (*d, t.wrapping_mul(*cp).wrapping_mul(*st)));
    let mut off = 0usize;
    let mut add = |(ci, (d, step)): (&usize, (usize, usize))| {
        off = off.wrapping_add(ci.wrapping_mul(step));
        *ci < d
    };
    let inside = if row {
        c.iter().rev().zip(native).all(&mut add)
    } else {
        c.iter().zip(native).all(&mut add)
    };
    let p = (l.ptr as usize).wrapping_add(off);
    (inside && p != 0).then_some(p as *mut c_void)
}

/// Writes the tiles per dim (reversed if `row`).
///
/// # Safety
/// 1. As `view`'s; `out` NULL or valid for `ndims` writes.
unsafe fn dims(data: TData, out: *mut usize, row: bool) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let v = unsafe { view(data, false) }?;
        if out.is_null() {
            return Err(inval("dims is NULL"));
        }
        let n = v.dims.len();
        for i in 0..n {
            let x = if row { v.dims[n - i - 1] } else { v.dims[i] };
            // SAFETY: (1).
            unsafe { *out.add(i) = x };
        }
        Ok(AML_SUCCESS)
    })
}

/// Prints a tiling as AML: header, tags, ndims, a line per dim (the tiling's order), the
/// neutral element's address for a pad tiling, then the layout between `layout: begin` and
/// `layout: end`.
///
/// # Safety
/// 1. As `view`'s; `stream` a valid `FILE *`; `prefix` NULL or a C string.
unsafe fn print(
    data: TData,
    stream: *mut libc::FILE,
    prefix: *const c_char,
    row: bool,
    pad: bool,
) -> c_int {
    guard(|| {
        let kind = if pad { "tiling-pad" } else { "tiling-resize" };
        let order = if row { "row-major" } else { "column-major" };
        let mut lines = vec![format!("{kind}: {data:p}: {order}")];
        if data.is_null() {
            // SAFETY: (1).
            return unsafe { crate::dma::print_lines(stream, prefix, &lines) };
        }
        // SAFETY: (1).
        let v = unsafe { view(data, pad) }?;
        let n = v.dims.len();
        lines.push(format!("tags: {}", v.tags));
        lines.push(format!("ndims: {n}"));
        for i in 0..n {
            let j = if row { n - i - 1 } else { i };
            let mut l = format!(
                "{i:16}: {:16} {:16} {:16}",
                v.dims[j], v.tile_dims[j], v.border[j]
            );
            if let Some((p, _)) = v.pad {
                l.push_str(&format!(" {:16}", p[j]));
            }
            lines.push(l);
        }
        if let Some((_, neutral)) = v.pad {
            lines.push(format!("neutral: {neutral:p}"));
        }
        lines.push("layout: begin".into());
        // SAFETY: (1).
        unsafe { crate::dma::print_lines(stream, prefix, &lines) }?;
        // SAFETY: (1): the tiling's layout.
        let rc = unsafe { aml_layout_fprintf(stream, prefix, v.layout) };
        // SAFETY: (1).
        unsafe { crate::dma::print_lines(stream, prefix, &["layout: end".into()]) }?;
        if rc != AML_SUCCESS {
            return Err(fail(-rc, "printing the tiled layout failed"));
        }
        Ok(AML_SUCCESS)
    })
}

/// The tile at coords, the tiling's order: the column-major resize tiling's `index` op
/// (AML exports it without declaring it; `aml/tiling/resize.h` declares it).
///
/// # Safety
/// 1. `data` this kind's tiling data; `coords` valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_column_index(
    data: TData,
    coords: *const usize,
) -> *mut AmlLayout {
    // SAFETY: (1).
    guard_ptr(|| unsafe { index(data, coords, false, false, false) })
}

/// The tile's first element: the column-major resize tiling's `rawptr` op
/// (AML exports it without declaring it; `aml/tiling/resize.h` declares it).
///
/// # Safety
/// 1. `data` this kind's tiling data; `coords` valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_column_rawptr(
    data: TData,
    coords: *const usize,
) -> *mut c_void {
    // SAFETY: (1).
    if let Some(p) = unsafe { dense_rawptr(data, coords, false) } {
        return p;
    }
    // SAFETY: (1).
    plain_ptr(unsafe { rawptr(data, coords, false) })
}

/// `AML_TILING_ORDER_COLUMN_MAJOR`: the column-major resize tiling's `order` op (AML exports it without
/// declaring it; `aml/tiling/resize.h` declares it).
#[no_mangle]
pub extern "C" fn aml_tiling_resize_column_order(_data: TData) -> c_int {
    AML_TILING_ORDER_COLUMN_MAJOR
}

/// Tiles per dim, the tiling's order: the column-major resize tiling's `dims` op
/// (AML exports it without declaring it; `aml/tiling/resize.h` declares it).
///
/// # Safety
/// 1. `data` this kind's tiling data; `dims` valid for `ndims` writes.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_column_dims(data: TData, dims: *mut usize) -> c_int {
    // SAFETY: (1).
    unsafe { self::dims(data, dims, false) }
}

/// Number of dims, 0 for NULL data: the column-major resize tiling's `ndims` op
/// (AML exports it without declaring it; `aml/tiling/resize.h` declares it).
///
/// # Safety
/// 1. `data` NULL or this kind's tiling data.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_column_ndims(data: TData) -> usize {
    // SAFETY: (1).
    unsafe { view(data, false) }.map_or(0, |v| v.dims.len())
}

/// Number of tiles, 0 for NULL data: the resize tilings' `ntiles` op
/// (AML exports it without declaring it; `aml/tiling/resize.h` declares it).
///
/// # Safety
/// 1. `data` NULL or this kind's tiling data.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_column_ntiles(data: TData) -> usize {
    // SAFETY: (1).
    unsafe { view(data, false) }.map_or(0, |v| v.dims.iter().product())
}

/// Prints the tiling: the column-major resize tiling's `fprintf` op
/// (AML exports it without declaring it; `aml/tiling/resize.h` declares it).
///
/// # Safety
/// 1. `data` NULL or this kind's tiling data; `stream` a valid `FILE *`; `prefix` NULL or a
///    C string.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_column_fprintf(
    data: TData,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    // SAFETY: (1).
    unsafe { print(data, stream, prefix, false, false) }
}

/// The tile at coords, the tiling's order: the row-major resize tiling's `index` op
/// (AML exports it without declaring it; `aml/tiling/resize.h` declares it).
///
/// # Safety
/// 1. `data` this kind's tiling data; `coords` valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_row_index(
    data: TData,
    coords: *const usize,
) -> *mut AmlLayout {
    // SAFETY: (1).
    guard_ptr(|| unsafe { index(data, coords, true, false, false) })
}

/// The tile's first element: the row-major resize tiling's `rawptr` op
/// (AML exports it without declaring it; `aml/tiling/resize.h` declares it).
///
/// # Safety
/// 1. `data` this kind's tiling data; `coords` valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_row_rawptr(
    data: TData,
    coords: *const usize,
) -> *mut c_void {
    // SAFETY: (1).
    if let Some(p) = unsafe { dense_rawptr(data, coords, true) } {
        return p;
    }
    // SAFETY: (1).
    plain_ptr(unsafe { rawptr(data, coords, true) })
}

/// `AML_TILING_ORDER_ROW_MAJOR`: the row-major resize tiling's `order` op (AML exports it without
/// declaring it; `aml/tiling/resize.h` declares it).
#[no_mangle]
pub extern "C" fn aml_tiling_resize_row_order(_data: TData) -> c_int {
    AML_TILING_ORDER_ROW_MAJOR
}

/// Tiles per dim, the tiling's order: the row-major resize tiling's `dims` op
/// (AML exports it without declaring it; `aml/tiling/resize.h` declares it).
///
/// # Safety
/// 1. `data` this kind's tiling data; `dims` valid for `ndims` writes.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_row_dims(data: TData, dims: *mut usize) -> c_int {
    // SAFETY: (1).
    unsafe { self::dims(data, dims, true) }
}

/// Number of dims, 0 for NULL data: the row-major resize tiling's `ndims` op
/// (AML exports it without declaring it; `aml/tiling/resize.h` declares it).
///
/// # Safety
/// 1. `data` NULL or this kind's tiling data.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_row_ndims(data: TData) -> usize {
    // SAFETY: (1).
    unsafe { view(data, false) }.map_or(0, |v| v.dims.len())
}

/// Prints the tiling: the row-major resize tiling's `fprintf` op
/// (AML exports it without declaring it; `aml/tiling/resize.h` declares it).
///
/// # Safety
/// 1. `data` NULL or this kind's tiling data; `stream` a valid `FILE *`; `prefix` NULL or a
///    C string.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_row_fprintf(
    data: TData,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    // SAFETY: (1).
    unsafe { print(data, stream, prefix, true, false) }
}

/// The tile at coords, the tiling's order: the column-major pad tiling's `index` op
/// (AML exports it without declaring it; `aml/tiling/pad.h` declares it).
///
/// # Safety
/// 1. `data` this kind's tiling data; `coords` valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_column_index(
    data: TData,
    coords: *const usize,
) -> *mut AmlLayout {
    // SAFETY: (1).
    guard_ptr(|| unsafe { index(data, coords, false, false, true) })
}

/// The tile's first element: the column-major pad tiling's `rawptr` op
/// (AML exports it without declaring it; `aml/tiling/pad.h` declares it).
///
/// # Safety
/// 1. `data` this kind's tiling data; `coords` valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_column_rawptr(
    data: TData,
    coords: *const usize,
) -> *mut c_void {
    // SAFETY: (1).
    if let Some(p) = unsafe { dense_rawptr(data, coords, false) } {
        return p;
    }
    // SAFETY: (1).
    plain_ptr(unsafe { rawptr(data, coords, false) })
}

/// `AML_TILING_ORDER_COLUMN_MAJOR`: the column-major pad tiling's `order` op (AML exports it without
/// declaring it; `aml/tiling/pad.h` declares it).
#[no_mangle]
pub extern "C" fn aml_tiling_pad_column_order(_data: TData) -> c_int {
    AML_TILING_ORDER_COLUMN_MAJOR
}

/// Tiles per dim, the tiling's order: the column-major pad tiling's `dims` op
/// (AML exports it without declaring it; `aml/tiling/pad.h` declares it).
///
/// # Safety
/// 1. `data` this kind's tiling data; `dims` valid for `ndims` writes.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_column_dims(data: TData, dims: *mut usize) -> c_int {
    // SAFETY: (1).
    unsafe { self::dims(data, dims, false) }
}

/// Number of dims, 0 for NULL data: the column-major pad tiling's `ndims` op
/// (AML exports it without declaring it; `aml/tiling/pad.h` declares it).
///
/// # Safety
/// 1. `data` NULL or this kind's tiling data.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_column_ndims(data: TData) -> usize {
    // SAFETY: (1).
    unsafe { view(data, false) }.map_or(0, |v| v.dims.len())
}

/// Number of tiles, 0 for NULL data: the pad tilings' `ntiles` op
/// (AML exports it without declaring it; `aml/tiling/pad.h` declares it).
///
/// # Safety
/// 1. `data` NULL or this kind's tiling data.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_column_ntiles(data: TData) -> usize {
    // SAFETY: (1).
    unsafe { view(data, false) }.map_or(0, |v| v.dims.iter().product())
}

/// Prints the tiling: the column-major pad tiling's `fprintf` op
/// (AML exports it without declaring it; `aml/tiling/pad.h` declares it).
///
/// # Safety
/// 1. `data` NULL or this kind's tiling data; `stream` a valid `FILE *`; `prefix` NULL or a
///    C string.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_column_fprintf(
    data: TData,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    // SAFETY: (1).
    unsafe { print(data, stream, prefix, false, true) }
}

/// The tile at coords, the tiling's order: the row-major pad tiling's `index` op
/// (AML exports it without declaring it; `aml/tiling/pad.h` declares it).
///
/// # Safety
/// 1. `data` this kind's tiling data; `coords` valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_row_index(
    data: TData,
    coords: *const usize,
) -> *mut AmlLayout {
    // SAFETY: (1).
    guard_ptr(|| unsafe { index(data, coords, true, false, true) })
}

/// The tile's first element: the row-major pad tiling's `rawptr` op
/// (AML exports it without declaring it; `aml/tiling/pad.h` declares it).
///
/// # Safety
/// 1. `data` this kind's tiling data; `coords` valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_row_rawptr(
    data: TData,
    coords: *const usize,
) -> *mut c_void {
    // SAFETY: (1).
    if let Some(p) = unsafe { dense_rawptr(data, coords, true) } {
        return p;
    }
    // SAFETY: (1).
    plain_ptr(unsafe { rawptr(data, coords, true) })
}

/// `AML_TILING_ORDER_ROW_MAJOR`: the row-major pad tiling's `order` op (AML exports it without
/// declaring it; `aml/tiling/pad.h` declares it).
#[no_mangle]
pub extern "C" fn aml_tiling_pad_row_order(_data: TData) -> c_int {
    AML_TILING_ORDER_ROW_MAJOR
}

/// Tiles per dim, the tiling's order: the row-major pad tiling's `dims` op
/// (AML exports it without declaring it; `aml/tiling/pad.h` declares it).
///
/// # Safety
/// 1. `data` this kind's tiling data; `dims` valid for `ndims` writes.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_row_dims(data: TData, dims: *mut usize) -> c_int {
    // SAFETY: (1).
    unsafe { self::dims(data, dims, true) }
}

/// Number of dims, 0 for NULL data: the row-major pad tiling's `ndims` op
/// (AML exports it without declaring it; `aml/tiling/pad.h` declares it).
///
/// # Safety
/// 1. `data` NULL or this kind's tiling data.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_row_ndims(data: TData) -> usize {
    // SAFETY: (1).
    unsafe { view(data, false) }.map_or(0, |v| v.dims.len())
}

/// Prints the tiling: the row-major pad tiling's `fprintf` op
/// (AML exports it without declaring it; `aml/tiling/pad.h` declares it).
///
/// # Safety
/// 1. `data` NULL or this kind's tiling data; `stream` a valid `FILE *`; `prefix` NULL or a
///    C string.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_row_fprintf(
    data: TData,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    // SAFETY: (1).
    unsafe { print(data, stream, prefix, true, true) }
}

/// `aml_tiling_resize_column_ops`, the column-major resize tiling's ops (native order: the column-major ones').
#[no_mangle]
pub static aml_tiling_resize_column_ops: AmlTilingOps = AmlTilingOps {
    index: Some(aml_tiling_resize_column_index),
    index_native: Some(aml_tiling_resize_column_index),
    rawptr: Some(aml_tiling_resize_column_rawptr),
    order: Some(aml_tiling_resize_column_order),
    dims: Some(aml_tiling_resize_column_dims),
    dims_native: Some(aml_tiling_resize_column_dims),
    ndims: Some(aml_tiling_resize_column_ndims),
    ntiles: Some(aml_tiling_resize_column_ntiles),
    fprintf: Some(aml_tiling_resize_column_fprintf),
};

/// `aml_tiling_resize_row_ops`, the row-major resize tiling's ops (native order: the column-major ones').
#[no_mangle]
pub static aml_tiling_resize_row_ops: AmlTilingOps = AmlTilingOps {
    index: Some(aml_tiling_resize_row_index),
    index_native: Some(aml_tiling_resize_column_index),
    rawptr: Some(aml_tiling_resize_row_rawptr),
    order: Some(aml_tiling_resize_row_order),
    dims: Some(aml_tiling_resize_row_dims),
    dims_native: Some(aml_tiling_resize_column_dims),
    ndims: Some(aml_tiling_resize_row_ndims),
    ntiles: Some(aml_tiling_resize_column_ntiles),
    fprintf: Some(aml_tiling_resize_row_fprintf),
};

/// `aml_tiling_pad_column_ops`, the column-major pad tiling's ops (native order: the column-major ones').
#[no_mangle]
pub static aml_tiling_pad_column_ops: AmlTilingOps = AmlTilingOps {
    index: Some(aml_tiling_pad_column_index),
    index_native: Some(aml_tiling_pad_column_index),
    rawptr: Some(aml_tiling_pad_column_rawptr),
    order: Some(aml_tiling_pad_column_order),
    dims: Some(aml_tiling_pad_column_dims),
    dims_native: Some(aml_tiling_pad_column_dims),
    ndims: Some(aml_tiling_pad_column_ndims),
    ntiles: Some(aml_tiling_pad_column_ntiles),
    fprintf: Some(aml_tiling_pad_column_fprintf),
};

/// `aml_tiling_pad_row_ops`, the row-major pad tiling's ops (native order: the column-major ones').
#[no_mangle]
pub static aml_tiling_pad_row_ops: AmlTilingOps = AmlTilingOps {
    index: Some(aml_tiling_pad_row_index),
    index_native: Some(aml_tiling_pad_column_index),
    rawptr: Some(aml_tiling_pad_row_rawptr),
    order: Some(aml_tiling_pad_row_order),
    dims: Some(aml_tiling_pad_row_dims),
    dims_native: Some(aml_tiling_pad_column_dims),
    ndims: Some(aml_tiling_pad_row_ndims),
    ntiles: Some(aml_tiling_pad_column_ntiles),
    fprintf: Some(aml_tiling_pad_row_fprintf),
};

/// Creates a resize tiling of `layout` (not owned: it must outlive the tiling) into tiles of
/// `tile_dims` (given in `tags`' order, `AML_TILING_ORDER_*`); the last tile of a dim holds
/// what is left. `-AML_EINVAL`: NULL arguments, `ndims` 0 or not the layout's, a tile dim 0;
/// `-AML_ENOMEM`.
///
/// # Safety
/// 1. `tiling` NULL or valid for one write; `layout` NULL or a valid layout; `tile_dims` NULL
///    or valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_create(
    tiling: *mut *mut AmlTiling,
    tags: c_int,
    layout: *const AmlLayout,
    ndims: usize,
    tile_dims: *const usize,
) -> c_int {
    guard(|| {
        if tiling.is_null() {
            return Err(inval("tiling is NULL"));
        }
        // SAFETY: (1).
        let t = unsafe { create(tags, layout, ndims, tile_dims, None) }?;
        // SAFETY: (1).
        unsafe { *tiling = t };
        Ok(AML_SUCCESS)
    })
}

/// Creates a pad tiling: as the resize tiling, but a border tile smaller than `tile_dims` is
/// a pad layout of `tile_dims` over it, with `neutral` (the layout's element size in bytes,
/// copied) beyond. `-AML_EINVAL` also for a NULL `neutral`.
///
/// # Safety
/// 1. As `aml_tiling_resize_create`'s; `neutral` NULL or valid for the layout's element size
///    in reads.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_create(
    tiling: *mut *mut AmlTiling,
    tags: c_int,
    layout: *const AmlLayout,
    ndims: usize,
    tile_dims: *const usize,
    neutral: *mut c_void,
) -> c_int {
    guard(|| {
        if tiling.is_null() || neutral.is_null() {
            return Err(inval("tiling and neutral must be non-NULL"));
        }
        // SAFETY: (1).
        let t = unsafe { create(tags, layout, ndims, tile_dims, Some(neutral.cast_const())) }?;
        // SAFETY: (1).
        unsafe { *tiling = t };
        Ok(AML_SUCCESS)
    })
}

/// Frees a tiling (not its layout) and sets `*tiling` NULL. NULL: no-op.
///
/// # Safety
/// 1. `tiling` NULL or valid; `*tiling` NULL or a tiling from this library, not used after.
unsafe fn destroy(tiling: *mut *mut AmlTiling) {
    if tiling.is_null() {
        return;
    }
    // SAFETY: (1): one malloc block.
    unsafe {
        libc::free((*tiling).cast());
        *tiling = std::ptr::null_mut();
    }
}

/// Frees a resize tiling (not its layout) and sets `*tiling` NULL. NULL: no-op.
///
/// # Safety
/// 1. `tiling` NULL or valid; `*tiling` NULL or a resize tiling, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_resize_destroy(tiling: *mut *mut AmlTiling) {
    // SAFETY: (1).
    unsafe { destroy(tiling) }
}

/// Frees a pad tiling (not its layout) and sets `*tiling` NULL. NULL: no-op.
///
/// # Safety
/// 1. `tiling` NULL or valid; `*tiling` NULL or a pad tiling, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_pad_destroy(tiling: *mut *mut AmlTiling) {
    // SAFETY: (1).
    unsafe { destroy(tiling) }
}

/// A tiling's ops, or `-AML_EINVAL`.
///
/// # Safety
/// 1. `t` NULL or a valid tiling.
unsafe fn ops<'a>(t: *const AmlTiling) -> Result<(&'a AmlTilingOps, TData), Fail> {
    // SAFETY: (1).
    let t = unsafe { t.as_ref() }.ok_or_else(|| inval("tiling is NULL"))?;
    // SAFETY: (1): a tiling's ops live as long as it.
    let o = unsafe { t.ops.as_ref() }.ok_or_else(|| inval("tiling without ops"))?;
    Ok((o, t.data.cast_const()))
}

/// Calls a tiling op, or `-AML_EINVAL` where it is missing.
fn need<F>(f: Option<F>, what: &str) -> Result<F, Fail> {
    f.ok_or_else(|| inval(format!("the tiling has no {what} op")))
}

/// The tiling's order (`AML_TILING_ORDER_*`); `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `tiling` NULL or a valid tiling.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_order(tiling: *const AmlTiling) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(tiling) }?;
        // SAFETY: (1): the tiling's own op on its data.
        Ok(unsafe { need(o.order, "order")?(d) })
    })
}

/// Tiles per dim in `dims` (the tiling's order); `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `tiling` NULL or a valid tiling; `dims` NULL or valid for its ndims writes.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_dims(tiling: *const AmlTiling, dims: *mut usize) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(tiling) }?;
        if dims.is_null() {
            return Err(inval("dims is NULL"));
        }
        // SAFETY: (1).
        Ok(unsafe { need(o.dims, "dims")?(d, dims) })
    })
}

/// Tiles per dim in `dims` (native order); `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. As `aml_tiling_dims`'s.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_dims_native(
    tiling: *const AmlTiling,
    dims: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(tiling) }?;
        if dims.is_null() {
            return Err(inval("dims is NULL"));
        }
        // SAFETY: (1).
        Ok(unsafe { need(o.dims_native, "dims_native")?(d, dims) })
    })
}

/// The tiling's number of dims; 0 for NULL (AML asserts).
///
/// # Safety
/// 1. `tiling` NULL or a valid tiling.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_ndims(tiling: *const AmlTiling) -> usize {
    // SAFETY: (1).
    match unsafe { ops(tiling) } {
        // SAFETY: (1).
        Ok((o, d)) => o.ndims.map_or(0, |f| unsafe { f(d) }),
        Err(_) => 0,
    }
}

/// The tiling's number of tiles; 0 for NULL (AML asserts).
///
/// # Safety
/// 1. `tiling` NULL or a valid tiling.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_ntiles(tiling: *const AmlTiling) -> usize {
    // SAFETY: (1).
    match unsafe { ops(tiling) } {
        // SAFETY: (1).
        Ok((o, d)) => o.ntiles.map_or(0, |f| unsafe { f(d) }),
        Err(_) => 0,
    }
}

/// The dims of the tile at `coords` (the tiling's order; NULL: the first tile) in `dims`;
/// `-AML_EINVAL` for NULL or coords out of the tiling.
///
/// # Safety
/// 1. `tiling` NULL or a valid tiling; `coords` NULL or valid for its ndims reads; `dims`
///    NULL or valid for its ndims writes.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_tile_dims(
    tiling: *const AmlTiling,
    coords: *const usize,
    dims: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(tiling) }?;
        if dims.is_null() {
            return Err(inval("dims is NULL"));
        }
        // SAFETY: (1).
        let n = unsafe { aml_tiling_ndims(tiling) };
        let zeros = vec![0usize; n];
        let c = if coords.is_null() {
            zeros.as_ptr()
        } else {
            coords
        };
        // SAFETY: (1).
        let mut tile = unsafe { need(o.index, "index")?(d, c) };
        if tile.is_null() {
            return Err(fail(crate::error::errno(), "no tile at these coords"));
        }
        // SAFETY: `tile` is this call's layout; (1).
        unsafe {
            let rc = aml_layout_dims(tile, dims);
            crate::layout::generic::aml_layout_destroy(&mut tile);
            Ok(rc)
        }
    })
}

/// The tile at `coords` (the tiling's order), a new layout the caller destroys; NULL with
/// `aml_errno` set for NULL arguments or coords out of the tiling.
///
/// # Safety
/// 1. `tiling` NULL or a valid tiling; `coords` NULL or valid for its ndims reads.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_index(
    tiling: *const AmlTiling,
    coords: *const usize,
) -> *mut AmlLayout {
    guard_ptr(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(tiling) }?;
        if coords.is_null() {
            return Err(inval("coords is NULL"));
        }
        // SAFETY: (1).
        let p = unsafe { need(o.index, "index")?(d, coords) };
        if p.is_null() {
            return Err(fail(crate::error::errno(), "no tile at these coords"));
        }
        Ok(p)
    })
}

/// The tile at `coords` in native order, as `aml_tiling_index`.
///
/// # Safety
/// 1. As `aml_tiling_index`'s.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_index_native(
    tiling: *const AmlTiling,
    coords: *const usize,
) -> *mut AmlLayout {
    guard_ptr(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(tiling) }?;
        if coords.is_null() {
            return Err(inval("coords is NULL"));
        }
        // SAFETY: (1).
        let p = unsafe { need(o.index_native, "index_native")?(d, coords) };
        if p.is_null() {
            return Err(fail(crate::error::errno(), "no tile at these coords"));
        }
        Ok(p)
    })
}

/// The address of the first element of the tile at `coords`; NULL with `aml_errno` set for
/// NULL arguments or coords out of the tiling.
///
/// # Safety
/// 1. As `aml_tiling_index`'s.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_rawptr(
    tiling: *const AmlTiling,
    coords: *const usize,
) -> *mut c_void {
    // No unwind guard: AML's kernels call this once per tile, and nothing here can panic (the
    // ops of this library's tilings guard themselves the same way).
    // SAFETY: (1).
    if let Some(p) = unsafe { fast_rawptr(tiling, coords) } {
        return p;
    }
    // SAFETY: (1).
    plain_ptr(unsafe { tiling_rawptr(tiling, coords) })
}

/// [`aml_tiling_rawptr`] on one of this library's resize or pad tilings over a dense layout:
/// the tile's address without the calls through the tiling's and the layout's ops, or None
/// for the full path (which reports what is off).
///
/// # Safety
/// 1. As `aml_tiling_index`'s.
#[inline]
unsafe fn fast_rawptr(tiling: *const AmlTiling, coords: *const usize) -> Option<*mut c_void> {
    // SAFETY: (1).
    let t = unsafe { tiling.as_ref() }?;
    let row = if std::ptr::eq(t.ops, &aml_tiling_resize_column_ops)
        || std::ptr::eq(t.ops, &aml_tiling_pad_column_ops)
    {
        false
    } else if std::ptr::eq(t.ops, &aml_tiling_resize_row_ops)
        || std::ptr::eq(t.ops, &aml_tiling_pad_row_ops)
    {
        true
    } else {
        return None;
    };
    // SAFETY: (1): the data of a tiling with these ops.
    unsafe { dense_rawptr(t.data, coords, row) }
}

/// [`aml_tiling_rawptr`]'s body.
///
/// # Safety
/// 1. As `aml_tiling_index`'s.
unsafe fn tiling_rawptr(
    tiling: *const AmlTiling,
    coords: *const usize,
) -> Result<*mut c_void, Fail> {
    // SAFETY: (1).
    let (o, d) = unsafe { ops(tiling) }?;
    if coords.is_null() {
        return Err(inval("coords is NULL"));
    }
    // SAFETY: (1).
    let p = unsafe { need(o.rawptr, "rawptr")?(d, coords) };
    if p.is_null() {
        return Err(fail(crate::error::errno(), "no tile at these coords"));
    }
    Ok(p)
}

/// The tile at the iterator's current element (native order, not advancing it); NULL with
/// `aml_errno` `AML_EINVAL` for NULL, an iterator of another dimension or one that is over.
///
/// # Safety
/// 1. `tiling` NULL or a valid tiling; `iterator` NULL or a valid `excit_t`.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_index_byiter(
    tiling: *const AmlTiling,
    iterator: *const Excit,
) -> *mut AmlLayout {
    guard_ptr(|| {
        if iterator.is_null() {
            return Err(inval("iterator is NULL"));
        }
        // SAFETY: (1).
        let n = unsafe { aml_tiling_ndims(tiling) };
        let mut dim = 0isize;
        // SAFETY: (1).
        if unsafe { excit_dimension(iterator, &mut dim) } != EXCIT_SUCCESS || dim as usize != n {
            return Err(inval("the iterator's dimension is not the tiling's"));
        }
        let mut c = vec![0isize; n];
        // SAFETY: (1); `c` holds `n` values.
        if unsafe { excit_peek(iterator, c.as_mut_ptr()) } != EXCIT_SUCCESS {
            return Err(inval("the iterator has no current element"));
        }
        if c.iter().any(|&x| x < 0) {
            return Err(inval("negative tile coords"));
        }
        let c: Vec<usize> = c.iter().map(|&x| x as usize).collect();
        // SAFETY: (1); `c` holds `n` values.
        let p = unsafe { aml_tiling_index_native(tiling, c.as_ptr()) };
        if p.is_null() {
            return Err(fail(crate::error::errno(), "no tile at these coords"));
        }
        Ok(p)
    })
}

/// Prints a tiling (its `fprintf` op) with `prefix` (NULL: "") on each line; `-AML_EINVAL`
/// for NULL.
///
/// # Safety
/// 1. `stream` NULL or a valid `FILE *`; `prefix` NULL or a C string; `tiling` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_tiling_fprintf(
    stream: *mut libc::FILE,
    prefix: *const c_char,
    tiling: *const AmlTiling,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(tiling) }?;
        if stream.is_null() {
            return Err(inval("stream is NULL"));
        }
        let empty = c"";
        let p = if prefix.is_null() {
            empty.as_ptr()
        } else {
            prefix
        };
        // SAFETY: (1).
        Ok(unsafe { need(o.fprintf, "fprintf")?(d, stream, p) })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::generic::aml_layout_destroy;
    use crate::layout::reshape::aml_layout_reshape_create;
    use crate::layout::{aml_layout_dense_create, AML_LAYOUT_ORDER_COLUMN_MAJOR};

    /// A 6 x 10 reshape (not a dense layout) of 60 contiguous `u64` at `ptr`.
    fn reshape(ptr: *mut u64) -> *mut AmlLayout {
        let (mut d, mut r) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: `ptr` holds 60 values for as long as the test uses the layouts; the reshape
        // owns `d` (destroyed with it).
        unsafe {
            let rc = aml_layout_dense_create(
                &mut d,
                ptr.cast(),
                AML_LAYOUT_ORDER_COLUMN_MAJOR,
                8,
                1,
                [60usize].as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
            );
            assert_eq!(rc, AML_SUCCESS);
            let rc = aml_layout_reshape_create(
                &mut r,
                d,
                AML_LAYOUT_ORDER_COLUMN_MAJOR,
                2,
                [6usize, 10].as_ptr(),
            );
            assert_eq!(rc, AML_SUCCESS);
        }
        r
    }

    /// `aml_tiling_rawptr`'s one-pass path gives the full path's address for every tile of
    /// resize and pad tilings of both orders over strided dense layouts of both orders, and
    /// leaves coords out of the tiling (and non-dense layouts) to the full path.
    #[test]
    fn dense_rawptr_matches_the_dispatched_path() {
        let mut buf = vec![0u64; 4096];
        let (dims, stride, tile) = ([5usize, 4, 3], [2usize, 1, 3], [2usize, 3, 2]);
        for lorder in [AML_LAYOUT_ORDER_COLUMN_MAJOR, AML_LAYOUT_ORDER_ROW_MAJOR] {
            let mut l: *mut AmlLayout = std::ptr::null_mut();
            // SAFETY: `buf` outlives the layout (destroyed below); the arrays hold 3 values.
            let rc = unsafe {
                aml_layout_dense_create(
                    &mut l,
                    buf.as_mut_ptr().cast(),
                    lorder,
                    8,
                    3,
                    dims.as_ptr(),
                    stride.as_ptr(),
                    std::ptr::null(),
                )
            };
            assert_eq!(rc, AML_SUCCESS);
            for (tags, pad) in [(0, false), (1, false), (0, true), (1, true)] {
                let mut t: *mut AmlTiling = std::ptr::null_mut();
                let mut zero = 0u64;
                // SAFETY: `l` outlives the tiling; `tile` holds 3 values, `zero` one element.
                let rc = unsafe {
                    if pad {
                        aml_tiling_pad_create(
                            &mut t,
                            tags,
                            l,
                            3,
                            tile.as_ptr(),
                            (&mut zero as *mut u64).cast(),
                        )
                    } else {
                        aml_tiling_resize_create(&mut t, tags, l, 3, tile.as_ptr())
                    }
                };
                assert_eq!(rc, AML_SUCCESS);
                let row = tags == AML_TILING_ORDER_ROW_MAJOR;
                let mut td = [0usize; 3];
                // SAFETY: `t` is valid; `td` holds 3 values.
                assert_eq!(unsafe { aml_tiling_dims(t, td.as_mut_ptr()) }, AML_SUCCESS);
                // SAFETY: `t` is valid.
                let data = unsafe { (*t).data.cast_const() };
                let (mut fast, mut out) = (0, 0);
                // Every tile, and one past the last in each dim.
                for i in 0..=td[0] {
                    for j in 0..=td[1] {
                        for k in 0..=td[2] {
                            let c = [i, j, k];
                            // SAFETY: `data` is `t`'s; `c` holds 3 values.
                            let (f, full, api) = unsafe {
                                (
                                    dense_rawptr(data, c.as_ptr(), row),
                                    rawptr(data, c.as_ptr(), row),
                                    aml_tiling_rawptr(t, c.as_ptr()),
                                )
                            };
                            match full {
                                Ok(p) => {
                                    assert_eq!(f, Some(p), "tile {c:?}");
                                    assert_eq!(api, p);
                                    fast += 1;
                                }
                                Err(e) => {
                                    assert_eq!(f, None, "tile {c:?} out of the tiling");
                                    assert!(api.is_null());
                                    assert_eq!(crate::error::code_of(&e), crate::error::AML_EINVAL);
                                    out += 1;
                                }
                            }
                        }
                    }
                }
                assert_eq!(fast, td.iter().product::<usize>());
                assert!(out > 0);
                // A tiling over a layout that is not dense: the fast path declines.
                let mut r = reshape(buf.as_mut_ptr());
                let mut tr: *mut AmlTiling = std::ptr::null_mut();
                // SAFETY: `r` outlives `tr`; both destroyed here.
                unsafe {
                    let rc = aml_tiling_resize_create(&mut tr, 0, r, 2, [4usize, 3].as_ptr());
                    assert_eq!(rc, AML_SUCCESS);
                    let c = [1usize, 1];
                    assert_eq!(dense_rawptr((*tr).data, c.as_ptr(), false), None);
                    let p = rawptr((*tr).data, c.as_ptr(), false).unwrap();
                    assert_eq!(p, buf.as_mut_ptr().add(4 + 3 * 6).cast());
                    assert_eq!(aml_tiling_rawptr(tr, c.as_ptr()), p);
                    aml_tiling_resize_destroy(&mut tr);
                    aml_layout_destroy(&mut r);
                }
                // SAFETY: `t` was made above.
                unsafe {
                    if pad {
                        aml_tiling_pad_destroy(&mut t)
                    } else {
                        aml_tiling_resize_destroy(&mut t)
                    }
                };
            }
            // SAFETY: `l` was made above; its tilings are destroyed.
            unsafe { aml_layout_destroy(&mut l) };
        }
    }
}
