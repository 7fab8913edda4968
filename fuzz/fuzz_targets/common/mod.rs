//! Shared input generators and reference checks of the fuzz targets.
#![allow(dead_code)]

use arbitrary::{Arbitrary, Result, Unstructured};
use ferry::{Layout, Plan};
use std::collections::BTreeMap;

/// Largest element count walked element by element in a check.
pub const WALK_LIMIT: usize = 1 << 14;

/// A number biased towards small values, with the full `usize` range reachable.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Num {
    Small(u8),
    Mid(u16),
    Big(usize),
    Max,
}

impl Num {
    pub fn get(self) -> usize {
        match self {
            Num::Small(v) => v as usize,
            Num::Mid(v) => v as usize,
            Num::Big(v) => v,
            Num::Max => usize::MAX,
        }
    }
}

fn nums(v: &[Num]) -> Vec<usize> {
    v.iter().map(|n| n.get()).collect()
}

/// One of the public layout constructors, with arbitrary arguments.
#[derive(Arbitrary, Debug)]
pub enum Ctor {
    New {
        dims: Vec<Num>,
        strides: Vec<Num>,
        elem: Num,
    },
    Contiguous {
        dims: Vec<Num>,
        elem: Num,
    },
    ColumnMajor {
        dims: Vec<Num>,
        elem: Num,
    },
    Pitched {
        dims: Vec<Num>,
        elem: Num,
        pitch: Num,
    },
    Bytes(Num),
}

impl Ctor {
    pub fn build(&self) -> std::result::Result<Layout, ferry::LayoutError> {
        match self {
            Ctor::New {
                dims,
                strides,
                elem,
            } => Layout::with_byte_strides(&nums(dims), &nums(strides), elem.get()),
            Ctor::Contiguous { dims, elem } => Layout::contiguous(&nums(dims), elem.get()),
            Ctor::ColumnMajor { dims, elem } => Layout::column_major(&nums(dims), elem.get()),
            Ctor::Pitched { dims, elem, pitch } => {
                Layout::pitched(&nums(dims), elem.get(), pitch.get())
            }
            Ctor::Bytes(n) => Layout::bytes(n.get()),
        }
    }
}

/// One layout transformation, with arbitrary arguments.
#[derive(Arbitrary, Debug)]
pub enum LOp {
    Slice {
        axis: u8,
        start: Num,
        end: Num,
        step: Num,
    },
    Index {
        axis: u8,
        index: Num,
    },
    Permute(Vec<u8>),
    Transpose(u8, u8),
    Reshape(Vec<Num>),
    WithOffset(Num),
}

impl LOp {
    pub fn apply(&self, l: &Layout) -> std::result::Result<Layout, ferry::LayoutError> {
        match self {
            LOp::Slice {
                axis,
                start,
                end,
                step,
            } => l.slice(*axis as usize, start.get()..end.get(), step.get()),
            LOp::Index { axis, index } => l.index(*axis as usize, index.get()),
            LOp::Permute(o) => l.permute(&o.iter().map(|&x| x as usize).collect::<Vec<_>>()),
            LOp::Transpose(a, b) => l.transpose(*a as usize, *b as usize),
            LOp::Reshape(d) => l.reshape(&nums(d)),
            LOp::WithOffset(n) => l.with_offset(n.get()),
        }
    }
}

/// Decodes a row-major linear index into coordinates.
pub fn unravel(dims: &[usize], mut k: usize) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for a in (0..dims.len()).rev() {
        idx[a] = k % dims[a];
        k /= dims[a];
    }
    idx
}

/// Every invariant a built layout must satisfy. Panics (a finding) on a violation.
pub fn check_layout(l: &Layout) {
    let nd = l.ndim();
    assert!((1..=ferry::MAX_DIMS).contains(&nd), "ndim {nd}");
    assert_eq!(l.dims().len(), nd);
    assert_eq!(l.strides().len(), nd);
    assert!(l.elem_size() >= 1);
    assert!(l.dims().iter().all(|&d| d >= 1), "zero dim in {l:?}");
    // Element count and byte size do not overflow.
    let len = l
        .dims()
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .expect("len overflows");
    assert_eq!(l.len(), len);
    assert_eq!(len.checked_mul(l.elem_size()), Some(l.size_bytes()));
    // The span is exact and does not overflow.
    let extent = l
        .dims()
        .iter()
        .zip(l.strides())
        .try_fold(l.elem_size(), |a, (&d, &s)| {
            (d - 1).checked_mul(s).and_then(|x| x.checked_add(a))
        })
        .expect("extent overflows");
    let end = l.offset().checked_add(extent).expect("span overflows");
    assert_eq!(l.span(), l.offset()..end, "{l:?}");
    assert!(l.check_buffer(end).is_ok(), "{l:?} must fit in {end} bytes");
    assert!(
        matches!(
            l.check_buffer(end - 1),
            Err(ferry::LayoutError::OutOfBounds { .. })
        ),
        "{l:?}"
    );
    if len > WALK_LIMIT {
        return;
    }
    // The element walk: count, bounds, offset_of agreement.
    let offs: Vec<usize> = l.element_offsets().collect();
    assert_eq!(offs.len(), len);
    for (k, &o) in offs.iter().enumerate() {
        assert!(
            o >= l.offset() && o + l.elem_size() <= end,
            "element {k} at {o} outside {:?}",
            l.span()
        );
        if k % 97 == 0 || k + 1 == len {
            assert_eq!(
                l.offset_of(&unravel(l.dims(), k)),
                Ok(o),
                "offset_of({k}) of {l:?}"
            );
        }
    }
    assert_eq!(*offs.iter().min().unwrap(), l.offset());
    assert_eq!(offs.iter().max().unwrap() + l.elem_size(), end);
    let mut sorted = offs.clone();
    sorted.sort_unstable();
    let disjoint = sorted.windows(2).all(|w| w[1] >= w[0] + l.elem_size());
    if l.is_non_overlapping() {
        assert!(
            disjoint,
            "is_non_overlapping but elements share bytes: {l:?}"
        );
    }
    if l.is_dense() {
        assert!(
            disjoint && extent == l.size_bytes(),
            "is_dense but not dense: {l:?}"
        );
    }
    if l.is_contiguous() {
        for (k, &o) in offs.iter().enumerate() {
            assert_eq!(
                o,
                l.offset() + k * l.elem_size(),
                "is_contiguous but element {k} misplaced: {l:?}"
            );
        }
    }
    let inner = l.contiguous_inner_bytes();
    assert!(inner >= l.elem_size() && inner % l.elem_size() == 0);
    let per = inner / l.elem_size();
    assert!(
        per <= len && len % per == 0,
        "inner run of {per} elements in {len}: {l:?}"
    );
    for k in 0..per {
        assert_eq!(
            offs[k],
            l.offset() + k * l.elem_size(),
            "inner run broken at {k}: {l:?}"
        );
    }
}

/// Checks that `out = op(l)` has the elements it should, element by element.
pub fn check_transform(l: &Layout, op: &LOp, out: &Layout) {
    if l.len() > WALK_LIMIT {
        return;
    }
    match op {
        LOp::Slice {
            axis, start, step, ..
        } => {
            let (a, s0, st) = (*axis as usize, start.get(), step.get());
            for k in 0..out.len() {
                let idx = unravel(out.dims(), k);
                let mut orig = idx.clone();
                orig[a] = s0 + idx[a] * st;
                assert_eq!(
                    out.offset_of(&idx),
                    l.offset_of(&orig),
                    "slice {op:?} of {l:?}"
                );
            }
        }
        LOp::Index { axis, index } => {
            let a = *axis as usize;
            for k in 0..out.len() {
                let idx = unravel(out.dims(), k);
                let mut orig = idx.clone();
                if l.ndim() == 1 {
                    orig[0] = index.get();
                } else {
                    orig.insert(a, index.get());
                }
                assert_eq!(
                    out.offset_of(&idx),
                    l.offset_of(&orig),
                    "index {op:?} of {l:?}"
                );
            }
        }
        LOp::Permute(_) | LOp::Transpose(..) => {
            let order: Vec<usize> = match op {
                LOp::Permute(o) => o.iter().map(|&x| x as usize).collect(),
                LOp::Transpose(a, b) => {
                    let mut o: Vec<usize> = (0..l.ndim()).collect();
                    o.swap(*a as usize, *b as usize);
                    o
                }
                _ => unreachable!(),
            };
            for k in 0..out.len() {
                let idx = unravel(out.dims(), k);
                let mut orig = vec![0; l.ndim()];
                for (i, &o) in order.iter().enumerate() {
                    orig[o] = idx[i];
                }
                assert_eq!(
                    out.offset_of(&idx),
                    l.offset_of(&orig),
                    "permute {op:?} of {l:?}"
                );
            }
        }
        LOp::Reshape(_) => {
            assert!(
                out.element_offsets().eq(l.element_offsets()),
                "reshape {op:?} of {l:?} changed the elements: {out:?}"
            );
        }
        LOp::WithOffset(n) => {
            assert_eq!(out.offset(), n.get());
            assert_eq!(out.dims(), l.dims());
            assert_eq!(out.strides(), l.strides());
        }
    }
}

/// A small layout of the given shape inside a larger base (strided, pitched, sliced,
/// permuted), built through the public API only. `None` when the choices are invalid.
#[derive(Debug, Clone)]
pub struct Placed {
    pub layout: Layout,
}

/// How to place a shape inside a buffer.
#[derive(Arbitrary, Debug, Clone)]
pub struct Placement {
    /// Base kind: 0 contiguous, 1 column-major, 2 pitched, 3 arbitrary strides.
    kind: u8,
    perm_seed: u8,
    steps: [u8; 4],
    starts: [u8; 4],
    extra: [u8; 4],
    pad: u8,
    strides: [u8; 4],
    offset: u8,
    /// Inserts a dim of extent 1 at this position (when < ndim + 1).
    unit_at: u8,
}

impl Placement {
    /// A layout of `dims` (at most 4) and `elem` bytes per element.
    pub fn place(&self, dims: &[usize], elem: usize) -> Option<Layout> {
        let n = dims.len();
        // A permutation from the seed (Lehmer-style).
        let mut pool: Vec<usize> = (0..n).collect();
        let mut perm = Vec::with_capacity(n);
        let mut s = self.perm_seed as usize;
        for k in (1..=n).rev() {
            perm.push(pool.remove(s % k));
            s /= k;
        }
        // Base dim i holds target dim perm[i], with a step and room around it.
        let step: Vec<usize> = (0..n).map(|i| 1 + (self.steps[i] % 3) as usize).collect();
        let start: Vec<usize> = (0..n).map(|i| (self.starts[i] % 3) as usize).collect();
        let base_dims: Vec<usize> = (0..n)
            .map(|i| start[i] + (dims[perm[i]] - 1) * step[i] + 1 + (self.extra[i] % 2) as usize)
            .collect();
        let base = match self.kind % 4 {
            0 => Layout::contiguous(&base_dims, elem),
            1 => Layout::column_major(&base_dims, elem),
            2 => Layout::pitched(
                &base_dims,
                elem,
                base_dims[n - 1] * elem + (self.pad % 17) as usize,
            ),
            _ => {
                let st: Vec<usize> = (0..n)
                    .map(|i| (self.strides[i] as usize % 64) * elem.max(1) / 2)
                    .collect();
                Layout::with_byte_strides(&base_dims, &st, elem)
            }
        }
        .ok()?;
        let mut l = base.with_offset(self.offset as usize % 32).ok()?;
        for i in 0..n {
            l = l
                .slice(
                    i,
                    start[i]..start[i] + (dims[perm[i]] - 1) * step[i] + 1,
                    step[i],
                )
                .ok()?;
        }
        // Base dim i is target dim perm[i]: result dim j is base dim inv[j].
        let mut inv = vec![0; n];
        for (i, &p) in perm.iter().enumerate() {
            inv[p] = i;
        }
        l = l.permute(&inv).ok()?;
        let u = self.unit_at as usize;
        if u <= n && n < ferry::MAX_DIMS {
            let mut d = l.dims().to_vec();
            let mut s = l.strides().to_vec();
            d.insert(u, 1);
            s.insert(u, (self.pad as usize) * 8);
            l = Layout::with_byte_strides(&d, &s, elem)
                .ok()?
                .with_offset(l.offset())
                .ok()?;
        }
        debug_assert_eq!(
            l.dims()
                .iter()
                .copied()
                .filter(|&d| d != 1)
                .collect::<Vec<_>>(),
            { dims.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>() }
        );
        Some(l)
    }
}

/// A pair of layouts for a copy: usually the same shape placed twice, sometimes anything.
#[derive(Debug)]
pub struct Pair {
    pub dst: Layout,
    pub src: Layout,
}

impl<'a> Arbitrary<'a> for Pair {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let n = u.int_in_range(1..=4usize)?;
        let mut dims = Vec::with_capacity(n);
        for _ in 0..n {
            dims.push(u.int_in_range(1..=6usize)?);
        }
        let elem = *u.choose(&[1usize, 2, 3, 4, 8, 16])?;
        let dp: Placement = u.arbitrary()?;
        let sp: Placement = u.arbitrary()?;
        let mismatch = u.ratio(1u8, 16)?;
        let src_elem = if mismatch {
            *u.choose(&[1usize, 2, 4, 8])?
        } else {
            elem
        };
        let src_dims = if mismatch && u.arbitrary()? {
            let mut d = dims.clone();
            d[0] += 1;
            d
        } else {
            dims.clone()
        };
        let dst = dp
            .place(&dims, elem)
            .ok_or(arbitrary::Error::IncorrectFormat)?;
        let src = sp
            .place(&src_dims, src_elem)
            .ok_or(arbitrary::Error::IncorrectFormat)?;
        Ok(Pair { dst, src })
    }
}

/// The reference: destination byte -> source byte, from the element-wise walk.
pub fn reference_map(dst: &Layout, src: &Layout) -> BTreeMap<usize, usize> {
    let mut m = BTreeMap::new();
    for (d, s) in dst.element_offsets().zip(src.element_offsets()) {
        for b in 0..dst.elem_size() {
            assert!(
                m.insert(d + b, s + b).is_none(),
                "reference writes byte {} twice",
                d + b
            );
        }
    }
    m
}

/// The plan's runs as destination byte -> source byte; panics if a byte is written twice.
pub fn plan_map(p: &Plan) -> BTreeMap<usize, usize> {
    let mut m = BTreeMap::new();
    let mut runs = 0usize;
    p.for_each_run(|d, s| {
        runs += 1;
        for b in 0..p.run() {
            assert!(
                m.insert(d + b, s + b).is_none(),
                "plan {p:?} writes byte {} twice",
                d + b
            );
        }
    });
    assert_eq!(
        runs,
        p.run_count(),
        "for_each_run visited {runs} runs, run_count says {}",
        p.run_count()
    );
    m
}

/// Naive element-wise copy (the reference engine).
pub fn reference_copy(dst_buf: &mut [u8], dst: &Layout, src_buf: &[u8], src: &Layout) {
    let e = dst.elem_size();
    for (d, s) in dst.element_offsets().zip(src.element_offsets()) {
        dst_buf[d..d + e].copy_from_slice(&src_buf[s..s + e]);
    }
}

/// Naive element-wise fill.
pub fn reference_fill(dst_buf: &mut [u8], dst: &Layout, pattern: &[u8]) {
    let e = dst.elem_size();
    for d in dst.element_offsets() {
        dst_buf[d..d + e].copy_from_slice(pattern);
    }
}
