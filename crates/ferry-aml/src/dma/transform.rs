//! `aml_copy_layout_transform_generic` (`aml.h`): a copy between layouts whose dims are a
//! permutation of each other (a transpose). Between two dense layouts it is ferry's planned
//! copy of the destination against the source's dims and strides permuted, run on the ready
//! Linux DMA's workers (after `aml_init`, else on the caller's thread); between layouts of
//! other types, or overlapping ones (which ferry does not plan), AML's element-wise copy.

use super::plan::dense_job;
use crate::error::{guard, inval, AML_SUCCESS};
use crate::layout::{arr, generic::dims_of, AmlLayout, Dense};
use ferry::MemKind;
use ferry_capi::{Fail, FERRY_EOVERLAP};
use std::ffi::c_int;

/// Copies `src` into `dst`, native dim `i` of `dst` being native dim `target_dims[i]` of
/// `src`: `dst[c] = src[c']` with `c'[target_dims[i]] = c[i]`. Returns `AML_SUCCESS`, or
/// `-AML_EINVAL` for NULL arguments, different numbers of dims or element sizes,
/// `target_dims` not a permutation of `0..ndims`, or dims that do not match through it (AML
/// asserts these, and its release build copies out of bounds), or a request's failure.
///
/// # Safety
/// 1. `dst` and `src` are NULL or valid layouts whose elements lie in valid memory, not
///    written by others during the call; `target_dims` NULL or valid for `ndims` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_copy_layout_transform_generic(
    dst: *mut AmlLayout,
    src: *const AmlLayout,
    target_dims: *const usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (dd, sd) = unsafe { (dims_of(dst, true)?, dims_of(src, true)?) };
        let n = dd.len();
        if sd.len() != n {
            return Err(inval(format!(
                "transform: {n} destination dims, {} source dims",
                sd.len()
            )));
        }
        // SAFETY: (1).
        let (de, se) = unsafe {
            (
                crate::layout::aml_layout_element_size(dst),
                crate::layout::aml_layout_element_size(src),
            )
        };
        if de != se || de == 0 {
            return Err(inval(format!("transform: element sizes {de} and {se}")));
        }
        // SAFETY: (1).
        let t = unsafe { arr(target_dims, n, "target_dims") }?;
        let mut seen = vec![false; n];
        for &k in t {
            if k >= n || std::mem::replace(&mut seen[k], true) {
                return Err(inval(format!(
                    "transform: target_dims {t:?} is not a permutation of 0..{n}"
                )));
            }
        }
        if (0..n).any(|i| sd[t[i]] != dd[i]) {
            return Err(inval(format!(
                "transform: source dims {sd:?} through {t:?} are not the destination's {dd:?}"
            )));
        }
        if dd.contains(&0) {
            return Ok(AML_SUCCESS);
        }
        // SAFETY: (1).
        if let (Some(d), Some(s)) = unsafe { (Dense::of(dst)?, Dense::of(src)?) } {
            let s = Dense {
                dims: t.iter().map(|&k| s.dims[k]).collect(),
                bs: t.iter().map(|&k| s.bs[k]).collect(),
                ..s
            };
            let job = dense_job(&d, &s, |_| MemKind::Pageable)?;
            // SAFETY: (1): both layouts' spans are valid memory for the call.
            match unsafe { crate::linux::run_now(job) } {
                Err(f) if f.code == FERRY_EOVERLAP => {}
                r => return r,
            }
        }
        // SAFETY: (1).
        unsafe { elementwise(dst, src, &dd, t, de) }
    })
}

/// AML's copy, element by element through the layouts' `deref_native`.
///
/// # Safety
/// 1. As [`aml_copy_layout_transform_generic`]'s, with `dims` (non-zero) and `t` checked.
unsafe fn elementwise(
    dst: *mut AmlLayout,
    src: *const AmlLayout,
    dims: &[usize],
    t: &[usize],
    elem: usize,
) -> Result<c_int, Fail> {
    let n = dims.len();
    let (mut c, mut cs) = (vec![0usize; n], vec![0usize; n]);
    loop {
        for i in 0..n {
            cs[t[i]] = c[i];
        }
        // SAFETY: (1): coordinates within the dims.
        unsafe {
            let s = crate::layout::aml_layout_deref_native(src, cs.as_ptr());
            let d = crate::layout::aml_layout_deref_native(dst, c.as_ptr());
            if s.is_null() || d.is_null() {
                return Err(inval("deref_native returned NULL"));
            }
            std::ptr::copy(s.cast::<u8>(), d.cast::<u8>(), elem);
        }
        let Some(i) = (0..n).find(|&i| c[i] + 1 < dims[i]) else {
            return Ok(AML_SUCCESS);
        };
        c[i] += 1;
        c[..i].iter_mut().for_each(|x| *x = 0);
    }
}
