//! The copy planner: (dst layout, src layout) -> the fewest, largest contiguous runs.
//!
//! A [`Plan`] is one contiguous run length (`run` bytes) repeated over up to
//! [`MAX_DIMS`] outer dims, each with its own destination and source
//! byte stride. The planner
//! 1. drops dims of extent 1,
//! 2. orders dims by destination stride, so that writes are as sequential as they can be
//!    (copy order is free: the destination never overlaps itself),
//! 3. merges neighbouring dims that are contiguous in both layouts,
//! 4. widens the element into the innermost run where both layouts are dense there.
//!
//! What is left is a [`PlanKind`]: one 1-D run, a 2-D pitched copy, a 3-D copy, or N-D segments.
//!
//! ```
//! use ferry::{Layout, Plan, PlanKind};
//! // A 256 x 1024-byte tile out of a 4096-byte-pitched image into a dense buffer.
//! let src = Layout::pitched(&[1024, 4096], 1, 4096)?.slice(0, 0..256, 1)?.slice(1, 0..1024, 1)?;
//! let dst = Layout::contiguous(&[256, 1024], 1)?;
//! let plan = Plan::new(&dst, &src)?;
//! assert_eq!(plan.kind(), PlanKind::Pitched2D);
//! assert_eq!(plan.run(), 1024);
//! assert_eq!(plan.run_count(), 256);
//! # Ok::<(), ferry::Error>(())
//! ```

use crate::layout::{Layout, MAX_DIMS};
use thiserror::Error;

/// Why two layouts cannot be copied into each other.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The layouts have different shapes (dims of extent 1 are ignored).
    #[error("shape mismatch: destination dims {dst:?}, source dims {src:?}")]
    ShapeMismatch {
        /// Destination dims.
        dst: Vec<usize>,
        /// Source dims.
        src: Vec<usize>,
    },
    /// The layouts have different element sizes.
    #[error("element size mismatch: destination {dst} bytes, source {src} bytes")]
    ElemSizeMismatch {
        /// Destination element size.
        dst: usize,
        /// Source element size.
        src: usize,
    },
    /// Two destination elements may share bytes, so the result would depend on copy order.
    #[error("destination layout overlaps itself (dims {dims:?}, strides {strides:?})")]
    DstSelfOverlap {
        /// Destination dims.
        dims: Vec<usize>,
        /// Destination strides.
        strides: Vec<usize>,
    },
    /// Source and destination share bytes of one buffer; ferry does not copy in place.
    #[error("source bytes {src:?} and destination bytes {dst:?} overlap in one buffer")]
    Overlap {
        /// Destination byte range (addresses).
        dst: std::ops::Range<u64>,
        /// Source byte range (addresses).
        src: std::ops::Range<u64>,
    },
}

/// The shape of a plan, in the hardware's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlanKind {
    /// One contiguous run.
    Contiguous,
    /// Rows of `run` bytes at a destination and a source pitch (`cuMemcpy2D`).
    Pitched2D,
    /// Planes of rows (`cuMemcpy3D` where the strides allow it).
    Pitched3D,
    /// More than three levels: a list of runs walked N-D.
    Segments,
}

/// A planned copy: `run` contiguous bytes, repeated over the outer dims. Offsets are in bytes
/// from the start of each buffer. Plain data; see the [module documentation](self).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Plan {
    run: usize,
    dst_offset: usize,
    src_offset: usize,
    n: usize,
    counts: [usize; MAX_DIMS],
    dst_strides: [usize; MAX_DIMS],
    src_strides: [usize; MAX_DIMS],
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("kind", &self.kind())
            .field("run", &self.run)
            .field("counts", &self.counts())
            .field("dst_strides", &self.dst_strides())
            .field("src_strides", &self.src_strides())
            .field("dst_offset", &self.dst_offset)
            .field("src_offset", &self.src_offset)
            .finish()
    }
}

impl Plan {
    /// Plans a copy of every element of `src` to the element of `dst` at the same index. Two
    /// empty layouts (whatever their dims) plan one run of 0 bytes.
    ///
    /// Errors: [`PlanError::ShapeMismatch`], [`PlanError::ElemSizeMismatch`],
    /// [`PlanError::DstSelfOverlap`].
    pub fn new(dst: &Layout, src: &Layout) -> Result<Plan, PlanError> {
        match Plan::single_run(dst, src)? {
            Some((dst_offset, src_offset, bytes)) => {
                Ok(Plan::contiguous(dst_offset, src_offset, bytes))
            }
            None => Plan::general(dst, src),
        }
    }

    /// [`Plan::new`]'s first half: the element sizes checked, then the common case (every
    /// `memcpy`, each small copy's per-request cost): the same dims, both contiguous, which is
    /// one run, `Some((dst_offset, src_offset, bytes))` for [`Plan::contiguous`]. `None`: the
    /// general path ([`Plan::general`]), which gives the same plan for that case (tests:
    /// plan.rs `contiguous_fast_path_matches_the_general_one`) after sorting and merging the
    /// dims. Apart so that a program builds the plan where it stays (`Program::copy`) instead
    /// of moving 416 bytes out of a `Result`.
    #[inline]
    pub(crate) fn single_run(
        dst: &Layout,
        src: &Layout,
    ) -> Result<Option<(usize, usize, usize)>, PlanError> {
        if dst.elem_size() != src.elem_size() {
            return Err(PlanError::ElemSizeMismatch {
                dst: dst.elem_size(),
                src: src.elem_size(),
            });
        }
        // No element on either side: nothing to copy, where both have none (a zero-byte run,
        // which programs and engines drop); one empty side only is a shape mismatch.
        if dst.is_empty() || src.is_empty() {
            if dst.is_empty() && src.is_empty() {
                return Ok(Some((dst.offset(), src.offset(), 0)));
            }
            return Err(PlanError::ShapeMismatch {
                dst: dst.dims().to_vec(),
                src: src.dims().to_vec(),
            });
        }
        // One dim each (every `memcpy`, `Layout::bytes`): the same test without the loops over
        // the dims (tests: `single_run_of_one_dim`).
        if let ([dn], [sn], [ds], [ss]) = (dst.dims(), src.dims(), dst.strides(), src.strides()) {
            let e = dst.elem_size();
            let one = dn == sn && (*dn == 1 || (*ds == e && *ss == e));
            return Ok(one.then(|| (dst.offset(), src.offset(), dn * e)));
        }
        Ok(
            // `Iterator::eq` rather than `==` on the slices: a loop over the few dims where
            // the slices' `==` called `memcmp` (issue 14 counts the host work per request).
            (dst.dims().iter().eq(src.dims()) && dst.is_contiguous() && src.is_contiguous())
                .then(|| (dst.offset(), src.offset(), dst.size_bytes())),
        )
    }

    /// [`Plan::new`] by sorting and merging the dims (shapes; element sizes checked by
    /// [`Plan::single_run`]); a plain transpose ([`Plan::transpose_2d`]) without them.
    pub(crate) fn general(dst: &Layout, src: &Layout) -> Result<Plan, PlanError> {
        match Plan::transpose_2d(dst, src) {
            Some(p) => Ok(p),
            None => Plan::sorted(dst, src),
        }
    }

    /// The plan [`Plan::sorted`] makes of two 2-D layouts of the same extents (both at least
    /// 2) and element size, the destination dense in row-major order and the source neither
    /// dense along the rows nor mergeable into one dim (a transpose, or a source whose
    /// elements along a row are spaced apart or broadcast): those two dims as they are, one
    /// element a run. Without sorting, merging or the overlap check (a dense destination does
    /// not overlap itself): planning took about 40% of a 4 KiB transpose run inline (issue 32).
    /// `None` for any other pair (tests: `transpose_2d_is_the_sorted_plan`).
    #[inline]
    fn transpose_2d(dst: &Layout, src: &Layout) -> Option<Plan> {
        let e = dst.elem_size();
        let (&[a, b], &[sa_n, sb_n]) = (dst.dims(), src.dims()) else {
            return None;
        };
        let (&[da, db], &[sa, sb]) = (dst.strides(), src.strides()) else {
            return None;
        };
        let plain = src.elem_size() == e
            && (a, b) == (sa_n, sb_n)
            && a >= 2
            && b >= 2
            && db == e
            && b.checked_mul(e) == Some(da)
            && sb != e
            && b.checked_mul(sb) != Some(sa);
        plain.then(|| {
            let mut p = Plan::contiguous(dst.offset(), src.offset(), e);
            p.n = 2;
            p.counts[..2].copy_from_slice(&[a, b]);
            p.dst_strides[..2].copy_from_slice(&[da, db]);
            p.src_strides[..2].copy_from_slice(&[sa, sb]);
            p
        })
    }

    /// [`Plan::general`] for any pair: the dims of extent 1 dropped, sorted outermost first,
    /// neighbours merged.
    fn sorted(dst: &Layout, src: &Layout) -> Result<Plan, PlanError> {
        if dst.is_empty() || src.is_empty() {
            return Plan::new(dst, src);
        }
        // Dims of extent 1 dropped, on the stack (planning allocates nothing).
        let (dt, dn) = non_unit(dst, 0);
        let (st, sn) = non_unit(src, 0);
        if dn != sn || (0..dn).any(|i| dt[i].0 != st[i].0) {
            return Err(PlanError::ShapeMismatch {
                dst: dst.dims().to_vec(),
                src: src.dims().to_vec(),
            });
        }
        if !dst.is_non_overlapping() {
            return Err(PlanError::DstSelfOverlap {
                dims: dst.dims().to_vec(),
                strides: dst.strides().to_vec(),
            });
        }
        let mut triples = dt;
        for i in 0..dn {
            triples[i].2 = st[i].1;
        }
        Ok(Plan::build(
            &mut triples[..dn],
            dst.elem_size(),
            dst.offset(),
            src.offset(),
            true,
        ))
    }

    /// Plans a walk over the elements of one layout (a fill): the source side has stride 0
    /// everywhere and offset 0, so every run reads the same pattern. An empty layout plans one
    /// run of 0 bytes.
    pub fn fill(dst: &Layout) -> Result<Plan, PlanError> {
        if dst.is_empty() {
            return Ok(Plan::contiguous(dst.offset(), 0, 0));
        }
        if !dst.is_non_overlapping() {
            return Err(PlanError::DstSelfOverlap {
                dims: dst.dims().to_vec(),
                strides: dst.strides().to_vec(),
            });
        }
        let (mut triples, n) = non_unit(dst, 0);
        Ok(Plan::build(
            &mut triples[..n],
            dst.elem_size(),
            dst.offset(),
            0,
            false,
        ))
    }

    /// A single contiguous run of `bytes` bytes.
    #[inline]
    pub fn contiguous(dst_offset: usize, src_offset: usize, bytes: usize) -> Plan {
        Plan {
            run: bytes,
            dst_offset,
            src_offset,
            n: 0,
            counts: [1; MAX_DIMS],
            dst_strides: [0; MAX_DIMS],
            src_strides: [0; MAX_DIMS],
        }
    }

    fn build(
        t: &mut [(usize, usize, usize)],
        elem: usize,
        dst_offset: usize,
        src_offset: usize,
        src_matters: bool,
    ) -> Plan {
        // Outermost first: descending destination stride, then source stride.
        // (Unstable sort, which does not allocate: two dims with equal strides in both layouts
        // would make the destination overlap itself, which was rejected.)
        t.sort_unstable_by_key(|a| std::cmp::Reverse((a.1, a.2)));
        // Merge neighbours contiguous in both.
        let mut merged = [(0usize, 0usize, 0usize); MAX_DIMS];
        let mut m = 0usize;
        for &mut (d, ds, ss) in t {
            if let Some(last) = m.checked_sub(1).map(|i| &mut merged[i]) {
                // Checked: a huge stride times its extent may not fit in usize (the layout
                // only guarantees `stride * (extent - 1)` does); then the dims do not merge.
                let fits = |outer: usize, inner: usize| inner.checked_mul(d) == Some(outer);
                if fits(last.1, ds) && (!src_matters || fits(last.2, ss)) {
                    *last = (last.0 * d, ds, ss);
                    continue;
                }
            }
            merged[m] = (d, ds, ss);
            m += 1;
        }
        // Widen the element into the innermost run.
        let mut run = elem;
        if let Some(&(d, ds, ss)) = m.checked_sub(1).map(|i| &merged[i]) {
            if ds == elem && (!src_matters || ss == elem) {
                run = elem * d;
                m -= 1;
            }
        }
        let mut p = Plan::contiguous(dst_offset, src_offset, run);
        p.n = m;
        for (i, &(d, ds, ss)) in merged[..m].iter().enumerate() {
            p.counts[i] = d;
            p.dst_strides[i] = ds;
            p.src_strides[i] = if src_matters { ss } else { 0 };
        }
        p
    }

    /// The plan's shape in hardware terms.
    pub fn kind(&self) -> PlanKind {
        match self.n {
            0 => PlanKind::Contiguous,
            1 => PlanKind::Pitched2D,
            2 => PlanKind::Pitched3D,
            _ => PlanKind::Segments,
        }
    }
    /// Bytes in each contiguous run.
    pub fn run(&self) -> usize {
        self.run
    }
    /// Byte offset of the first run in the destination buffer.
    pub fn dst_offset(&self) -> usize {
        self.dst_offset
    }
    /// Byte offset of the first run in the source buffer.
    pub fn src_offset(&self) -> usize {
        self.src_offset
    }
    /// Extent of each outer dim, outermost first (empty for a contiguous plan).
    pub fn counts(&self) -> &[usize] {
        &self.counts[..self.n]
    }
    /// Destination byte stride of each outer dim, outermost first.
    pub fn dst_strides(&self) -> &[usize] {
        &self.dst_strides[..self.n]
    }
    /// Source byte stride of each outer dim, outermost first.
    pub fn src_strides(&self) -> &[usize] {
        &self.src_strides[..self.n]
    }
    /// Number of contiguous runs.
    pub fn run_count(&self) -> usize {
        self.counts().iter().product()
    }
    /// Bytes copied.
    pub fn total_bytes(&self) -> usize {
        self.run * self.run_count()
    }
    /// One past the last destination byte written, from the buffer start.
    pub fn dst_end(&self) -> usize {
        self.dst_offset
            + self.run
            + self
                .counts()
                .iter()
                .zip(self.dst_strides())
                .map(|(&c, &s)| (c - 1) * s)
                .sum::<usize>()
    }
    /// One past the last source byte read, from the buffer start.
    pub fn src_end(&self) -> usize {
        self.src_offset
            + self.run
            + self
                .counts()
                .iter()
                .zip(self.src_strides())
                .map(|(&c, &s)| (c - 1) * s)
                .sum::<usize>()
    }

    /// Calls `f(dst_offset, src_offset)` for each run, in order.
    pub fn for_each_run(&self, mut f: impl FnMut(usize, usize)) {
        let n = self.n;
        if n == 0 {
            f(self.dst_offset, self.src_offset);
            return;
        }
        let inner_c = self.counts[n - 1];
        let (ids, iss) = (self.dst_strides[n - 1], self.src_strides[n - 1]);
        let mut idx = [0usize; MAX_DIMS];
        let (mut d, mut s) = (self.dst_offset, self.src_offset);
        loop {
            let (mut dd, mut ss) = (d, s);
            // Wrapping steps: one step past the last run may exceed usize for huge strides;
            // every offset passed to `f` is in range, and modular arithmetic keeps it exact.
            for _ in 0..inner_c {
                f(dd, ss);
                dd = dd.wrapping_add(ids);
                ss = ss.wrapping_add(iss);
            }
            // Odometer over the dims outside the innermost outer dim.
            let mut axis = n - 1;
            loop {
                if axis == 0 {
                    return;
                }
                axis -= 1;
                idx[axis] += 1;
                d = d.wrapping_add(self.dst_strides[axis]);
                s = s.wrapping_add(self.src_strides[axis]);
                if idx[axis] < self.counts[axis] {
                    break;
                }
                d = d.wrapping_sub(self.dst_strides[axis].wrapping_mul(self.counts[axis]));
                s = s.wrapping_sub(self.src_strides[axis].wrapping_mul(self.counts[axis]));
                idx[axis] = 0;
            }
        }
    }

    /// True when the two innermost outer dims walk the source against its grain (the outer of
    /// the two has the smaller source stride, as in a transpose): [`Plan::for_each_run_tiled`]
    /// then keeps both sides in cache.
    pub fn is_transposing(&self) -> bool {
        let n = self.n;
        n >= 2 && self.src_strides[n - 2] < self.src_strides[n - 1]
    }

    /// Calls `f(dst_offset, src_offset)` for each run, as [`Plan::for_each_run`] does, but walks
    /// the two innermost outer dims in `tile` x `tile` blocks (cache blocking for transposes).
    /// Same runs, another order.
    pub fn for_each_run_tiled(&self, tile: usize, mut f: impl FnMut(usize, usize)) {
        let n = self.n;
        if n < 2 || tile < 2 {
            return self.for_each_run(f);
        }
        let (ca, cb) = (self.counts[n - 2], self.counts[n - 1]);
        let (da, db) = (self.dst_strides[n - 2], self.dst_strides[n - 1]);
        let (sa, sb) = (self.src_strides[n - 2], self.src_strides[n - 1]);
        // The dims outside the tile, walked as a plan of their own.
        let mut outer = *self;
        outer.n = n - 2;
        outer.for_each_run(|d0, s0| {
            for ib in (0..ca).step_by(tile) {
                for jb in (0..cb).step_by(tile) {
                    for i in ib..(ib + tile).min(ca) {
                        let mut d = d0
                            .wrapping_add(i.wrapping_mul(da))
                            .wrapping_add(jb.wrapping_mul(db));
                        let mut s = s0
                            .wrapping_add(i.wrapping_mul(sa))
                            .wrapping_add(jb.wrapping_mul(sb));
                        for _ in jb..(jb + tile).min(cb) {
                            f(d, s);
                            d = d.wrapping_add(db);
                            s = s.wrapping_add(sb);
                        }
                    }
                }
            }
        });
    }

    /// Splits the plan into at most `parts` plans that together cover the same runs, each of
    /// at least `min_bytes` where possible. Splits the outermost dim, or the run itself for a
    /// contiguous plan (at multiples of `align` bytes).
    pub fn split(&self, parts: usize, min_bytes: usize, align: usize) -> Vec<Plan> {
        let total = self.total_bytes();
        let align = align.max(1);
        let parts = parts.max(1).min((total / min_bytes.max(1)).max(1));
        if parts == 1 {
            return vec![*self];
        }
        let mut out = Vec::with_capacity(parts);
        if self.n == 0 {
            let piece = total.div_ceil(parts).div_ceil(align) * align;
            let mut at = 0;
            while at < total {
                let len = piece.min(total - at);
                out.push(Plan::contiguous(
                    self.dst_offset + at,
                    self.src_offset + at,
                    len,
                ));
                at += len;
            }
            return out;
        }
        let c = self.counts[0];
        let parts = parts.min(c);
        let mut at = 0;
        for k in 0..parts {
            let len = c / parts + usize::from(k < c % parts);
            let mut p = *self;
            p.counts[0] = len;
            p.dst_offset += at * self.dst_strides[0];
            p.src_offset += at * self.src_strides[0];
            if len == 1 {
                p = p.drop_outermost();
            }
            out.push(p);
            at += len;
        }
        out
    }

    /// Removes an outermost dim of extent 1.
    fn drop_outermost(mut self) -> Plan {
        for i in 1..self.n {
            self.counts[i - 1] = self.counts[i];
            self.dst_strides[i - 1] = self.dst_strides[i];
            self.src_strides[i - 1] = self.src_strides[i];
        }
        self.n -= 1;
        self
    }

    /// The same plan with both offsets moved by the given bytes.
    pub fn offset_by(mut self, dst: usize, src: usize) -> Plan {
        self.dst_offset += dst;
        self.src_offset += src;
        self
    }
}

/// The (extent, stride, `fill`) triples of a layout's dims of extent other than 1, in order,
/// and how many there are.
fn non_unit(l: &Layout, fill: usize) -> ([(usize, usize, usize); MAX_DIMS], usize) {
    let mut out = [(0usize, 0usize, 0usize); MAX_DIMS];
    let mut n = 0;
    for (&d, &s) in l.dims().iter().zip(l.strides()) {
        if d != 1 {
            out[n] = (d, s, fill);
            n += 1;
        }
    }
    (out, n)
}

#[cfg(test)]
mod tests;
