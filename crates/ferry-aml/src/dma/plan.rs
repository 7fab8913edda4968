//! The NULL operator: two AML dense layouts as one ferry job (ferry's planned layout copy).
//!
//! Both layouts' dims of 1 are dropped and neighbouring dims that are contiguous in both are
//! merged (the same rule as AML's reshape). Up to ferry's `MAX_DIMS` dims this is one
//! `Job::copy`, which the engine plans into the fewest, largest runs (and on a GPU, 2-D/3-D
//! copies); AML has no limit on dims, so beyond that the outer dims are enumerated, one planned
//! copy step each.

use crate::error::inval;
use crate::layout::{AmlLayout, Dense};
use ferry::{Job, Layout, MemKind, OpError, Operator, Program, RawBuf, MAX_DIMS};
use ferry_capi::Fail;
use std::sync::Arc;

/// Shared native dims and each side's byte strides, mergeable dims merged.
/// Shared dims, destination byte strides, source byte strides (native order).
type Merged = (Vec<usize>, Vec<usize>, Vec<usize>);

fn merge(d: &Dense, s: &Dense) -> Result<Merged, Fail> {
    if d.elem != s.elem {
        return Err(inval(format!(
            "element sizes differ: destination {} bytes, source {}",
            d.elem, s.elem
        )));
    }
    let strip = |l: &Dense| -> Vec<(usize, usize)> {
        l.dims
            .iter()
            .copied()
            .zip(l.bs.iter().copied())
            .filter(|&(n, _)| n > 1)
            .collect()
    };
    let (dd, sd) = (strip(d), strip(s));
    if dd.iter().map(|x| x.0).ne(sd.iter().map(|x| x.0)) {
        return Err(inval(format!(
            "shapes differ: destination dims {:?}, source dims {:?} (native order)",
            d.dims, s.dims
        )));
    }
    let (mut dims, mut db, mut sb) = (Vec::new(), Vec::new(), Vec::new());
    for (&(n, a), &(_, b)) in dd.iter().zip(&sd) {
        match (dims.last_mut(), db.last(), sb.last()) {
            (Some(l), Some(&la), Some(&lb)) if la * *l == a && lb * *l == b => *l *= n,
            _ => {
                dims.push(n);
                db.push(a);
                sb.push(b);
            }
        }
    }
    if dims.is_empty() {
        // One element.
        dims.push(1);
        db.push(d.elem);
        sb.push(s.elem);
    }
    Ok((dims, db, sb))
}

/// A ferry layout of native dims/strides `dims[..k]` (outermost first), at `offset`.
fn layout(dims: &[usize], bs: &[usize], elem: usize, offset: usize) -> Result<Layout, Fail> {
    let d: Vec<usize> = dims.iter().rev().copied().collect();
    let b: Vec<usize> = bs.iter().rev().copied().collect();
    Ok(Layout::with_byte_strides(&d, &b, elem)?.with_offset(offset)?)
}

/// Copies of more dims than a ferry layout holds: one planned copy per outer index.
struct Split(Vec<(Layout, Layout)>);

impl Operator for Split {
    fn name(&self) -> &str {
        "aml layout copy"
    }
    fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
        self.0.iter().try_for_each(|(d, s)| prog.copy(d, s))
    }
}

/// The copy of `s` into `d` as ferry layout pairs (offsets from each layout's pointer): one
/// pair up to `MAX_DIMS` merged dims, else one per index of the outer dims.
pub(crate) fn pairs(d: &Dense, s: &Dense) -> Result<Vec<(Layout, Layout)>, Fail> {
    let (dims, db, sb) = merge(d, s)?;
    if dims.len() <= MAX_DIMS {
        return Ok(vec![(
            layout(&dims, &db, d.elem, 0)?,
            layout(&dims, &sb, d.elem, 0)?,
        )]);
    }
    // Enumerate the outer dims (native order: dims[k..], innermost first).
    let k = MAX_DIMS;
    let outer = &dims[k..];
    let mut steps = Vec::new();
    let mut idx = vec![0usize; outer.len()];
    loop {
        let off = |bs: &[usize]| idx.iter().zip(&bs[k..]).map(|(i, b)| i * b).sum::<usize>();
        steps.push((
            layout(&dims[..k], &db[..k], d.elem, off(&db))?,
            layout(&dims[..k], &sb[..k], d.elem, off(&sb))?,
        ));
        let Some(pos) = (0..outer.len()).find(|&i| idx[i] + 1 < outer[i]) else {
            return Ok(steps);
        };
        idx[pos] += 1;
        idx[..pos].iter_mut().for_each(|i| *i = 0);
    }
}

/// The job copying AML layout `src` into `dst` (ferry's planned copy), the memory kinds from
/// `kind`; `None` when either is not a dense layout of this library.
///
/// # Safety
/// 1. `dst` and `src` are NULL or valid layouts.
pub(crate) unsafe fn planned_job(
    dst: *const AmlLayout,
    src: *const AmlLayout,
    kind: impl Fn(u64) -> MemKind,
) -> Result<Option<Job>, Fail> {
    // SAFETY: (1).
    let (Some(d), Some(s)) = (unsafe { Dense::of(dst) }?, unsafe { Dense::of(src) }?) else {
        return Ok(None);
    };
    dense_job(&d, &s, kind).map(Some)
}

/// The job copying dense `s` into `d` (ferry's planned copy), the memory kinds from `kind`.
pub(crate) fn dense_job(d: &Dense, s: &Dense, kind: impl Fn(u64) -> MemKind) -> Result<Job, Fail> {
    let buf = |l: &Dense| RawBuf {
        addr: l.ptr,
        len: l.span(),
        kind: kind(l.ptr),
    };
    let (dbuf, sbuf) = (buf(d), buf(s));
    let mut steps = pairs(d, s)?;
    if steps.len() == 1 {
        let (dl, sl) = steps.remove(0);
        return Ok(Job::copy(dbuf, dl, sbuf, sl));
    }
    Ok(Job::custom(dbuf, Some(sbuf), Arc::new(Split(steps))))
}
