//! Reshape and slice of dense layouts (new layouts over the same elements, no copy).

use super::{arr, data, emit, offset, Data, Dense, Out};
use crate::error::{guard, inval};
use ferry_capi::Fail;
use std::ffi::c_int;

/// Native dims and byte strides with dims of 1 dropped and mergeable neighbours merged.
fn merged(d: &Dense) -> (Vec<usize>, Vec<usize>) {
    let (mut md, mut mb): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    for (&n, &b) in d.dims.iter().zip(&d.bs).filter(|(&n, _)| n > 1) {
        match (md.last_mut(), mb.last()) {
            (Some(ld), Some(&lb)) if lb * *ld == b => *ld *= n,
            _ => {
                md.push(n);
                mb.push(b);
            }
        }
    }
    (md, mb)
}

/// The same elements seen with `new` dims (native order), without a copy.
fn reshape(d: &Dense, new: &[usize], row: bool) -> Result<Dense, Fail> {
    if new.is_empty() || new.contains(&0) {
        return Err(inval("reshape: no dims, or a dim of 0"));
    }
    if new.iter().try_fold(1usize, |a, &n| a.checked_mul(n)) != Some(d.count()) {
        return Err(inval(format!(
            "reshape: {new:?} does not hold the layout's {} elements",
            d.count()
        )));
    }
    let (mut md, mut mb) = merged(d);
    let mut bs = Vec::with_capacity(new.len());
    let mut cur = 0;
    for &n in new {
        if n == 1 {
            bs.push(mb.get(cur).copied().unwrap_or(d.elem));
            continue;
        }
        match md.get(cur) {
            Some(&m) if m == n => {
                bs.push(mb[cur]);
                cur += 1;
            }
            Some(&m) if m % n == 0 => {
                bs.push(mb[cur]);
                mb[cur] *= n;
                md[cur] = m / n;
            }
            _ => {
                return Err(inval(format!(
                    "reshape to {new:?} needs a copy (dims do not split the layout's runs)"
                )))
            }
        }
    }
    Ok(Dense {
        dims: new.to_vec(),
        bs,
        row,
        ..d.clone()
    })
}

/// # Safety
/// 1. `data` is a valid dense layout's data; `output` valid for one write; `dims` for `ndims`
///    reads.
unsafe fn reshape_entry(
    data: Data,
    output: Out,
    ndims: usize,
    dims: *const usize,
    row: bool,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let d = unsafe { self::data(data) }?;
        // SAFETY: (1).
        let mut new = unsafe { arr(dims, ndims, "dims") }?.to_vec();
        if row {
            new.reverse();
        }
        // SAFETY: (1).
        unsafe { emit(output, reshape(&d, &new, row).and_then(|r| r.boxed())) }
    })
}

/// Reshapes a column-major layout (dims in column-major order). `-AML_EINVAL` if the element
/// counts differ or the new dims need a copy.
///
/// # Safety
/// 1. `data` is a valid dense layout's data; `output` valid for one write; `dims` for `ndims`
///    reads.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_column_reshape(
    data: Data,
    output: Out,
    ndims: usize,
    dims: *const usize,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { reshape_entry(data, output, ndims, dims, false) }
}

/// Reshapes a row-major layout (dims in row-major order).
///
/// # Safety
/// As [`aml_layout_column_reshape`].
#[no_mangle]
pub unsafe extern "C" fn aml_layout_row_reshape(
    data: Data,
    output: Out,
    ndims: usize,
    dims: *const usize,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { reshape_entry(data, output, ndims, dims, true) }
}

/// The sub-layout: `dims[i]` elements from `offsets[i]` every `strides[i]` along each dim
/// (given in native order when `reversed` is false). Bounds are checked (`-AML_EINVAL`).
///
/// # Safety
/// 1. `data` is a valid dense layout's data; `output` valid for one write; the arrays NULL
///    (offsets: 0, strides: 1) or valid for `ndims` reads.
unsafe fn slice_entry(
    data: Data,
    output: Out,
    (offsets, dims, strides): (*const usize, *const usize, *const usize),
    reversed: bool,
    row: bool,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let d = unsafe { self::data(data) }?;
        let n = d.dims.len();
        // `dflt`: the value of every entry when `p` is NULL (None: required).
        let read = |p: *const usize, dflt: Option<usize>, what| -> Result<Vec<usize>, Fail> {
            let mut v = if let (true, Some(v)) = (p.is_null(), dflt) {
                vec![v; n]
            } else {
                // SAFETY: (1).
                unsafe { arr(p, n, what) }?.to_vec()
            };
            if reversed {
                v.reverse();
            }
            Ok(v)
        };
        let off = read(offsets, Some(0), "offsets")?;
        let dims = read(dims, None, "dims")?;
        let st = read(strides, Some(1), "strides")?;
        for i in 0..n {
            let last = (dims[i].max(1) - 1)
                .checked_mul(st[i])
                .and_then(|x| x.checked_add(off[i]));
            if dims[i] == 0 || st[i] == 0 || last.is_none_or(|l| l >= d.dims[i]) {
                return Err(inval(format!(
                    "slice of native dim {i}: {} elements from {} every {} do not fit in {}",
                    dims[i], off[i], st[i], d.dims[i]
                )));
            }
        }
        let s = Dense {
            ptr: offset(&d, &off, false),
            bs: d.bs.iter().zip(&st).map(|(b, s)| b * s).collect(),
            dims,
            row,
            ..d
        };
        // SAFETY: (1).
        unsafe { emit(output, s.boxed()) }
    })
}

/// Slices a column-major layout (arguments in column-major order).
///
/// # Safety
/// 1. `data` is a valid dense layout's data; `output` valid for one write; `dims` valid for
///    `ndims` reads, `offsets` and `strides` NULL or likewise.
#[no_mangle]
pub unsafe extern "C" fn aml_layout_column_slice(
    data: Data,
    output: Out,
    offsets: *const usize,
    dims: *const usize,
    strides: *const usize,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { slice_entry(data, output, (offsets, dims, strides), false, false) }
}

/// Slices a row-major layout (arguments in row-major order).
///
/// # Safety
/// As [`aml_layout_column_slice`].
#[no_mangle]
pub unsafe extern "C" fn aml_layout_row_slice(
    data: Data,
    output: Out,
    offsets: *const usize,
    dims: *const usize,
    strides: *const usize,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { slice_entry(data, output, (offsets, dims, strides), true, true) }
}

/// Slices a row-major layout with arguments in native (column-major) order.
///
/// # Safety
/// As [`aml_layout_column_slice`].
#[no_mangle]
pub unsafe extern "C" fn aml_layout_row_slice_native(
    data: Data,
    output: Out,
    offsets: *const usize,
    dims: *const usize,
    strides: *const usize,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { slice_entry(data, output, (offsets, dims, strides), false, true) }
}
