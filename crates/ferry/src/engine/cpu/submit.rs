//! The CPU engine's submission: the [`Engine`] contract's checks, small copies run to their
//! end on the caller's thread
//! ([`CpuConfig::inline_bytes`](super::CpuConfig::inline_bytes)), anything else handed to the
//! pool.

use super::engine::CpuEngine;
use super::exec::{self, Rows};
use crate::engine::contract::memcpy_by_layouts;
use crate::engine::{check_bufs, Engine, Job, SubmitError};
use crate::memory::{MemKind, RawBuf};
use crate::op::checked_run;
use crate::plan::Plan;
use crate::request::{BarrierError, Request};
use crate::Layout;

/// The copy between `dl` and `sl` as [`Rows`] (a 2-D tile: every dim of extent 1 but at most
/// two, the inner one dense on both sides, the outer one not overlapping itself in the
/// destination), without planning; `None` for any other pair (the general plan decides, errors
/// included).
#[inline]
pub(super) fn rows(dl: &Layout, sl: &Layout) -> Option<Rows> {
    let e = dl.elem_size();
    if sl.elem_size() != e {
        return None;
    }
    // One dim each (every `memcpy`): one run if dense, without the pass below.
    if let ([n], [sn], [ds], [ss]) = (dl.dims(), sl.dims(), dl.strides(), sl.strides()) {
        return (n == sn && (*n == 1 || (*ds == e && *ss == e))).then(|| Rows {
            count: 1,
            run: n * e,
            dst: (dl.offset(), 0),
            src: (sl.offset(), 0),
        });
    }
    // The (at most two) dims of extent above 1, outer first: (extent, dst, src stride).
    let mut dims = [(1usize, 0usize, 0usize); 2];
    let (mut nd, mut ns) = (0usize, 0usize);
    for (&n, &st) in dl.dims().iter().zip(dl.strides()) {
        if n != 1 {
            *dims.get_mut(nd)? = (n, st, 0);
            nd += 1;
        }
    }
    for (&n, &st) in sl.dims().iter().zip(sl.strides()) {
        if n != 1 {
            let d = dims.get_mut(ns)?;
            if d.0 != n {
                return None;
            }
            d.2 = st;
            ns += 1;
        }
    }
    if nd != ns {
        return None;
    }
    // Innermost dim dense on both sides (a single element is dense too).
    let (inner, outer) = match nd {
        0 => ((1, e, e), (1, 0, 0)),
        1 => (dims[0], (1, 0, 0)),
        _ => (dims[1], dims[0]),
    };
    if inner.1 != e || inner.2 != e {
        return None;
    }
    let run = inner.0 * e;
    // The destination's rows may not overlap each other (a zero or short stride).
    if outer.0 > 1 && outer.1 < run {
        return None;
    }
    Some(Rows {
        count: outer.0,
        run,
        dst: (dl.offset(), outer.1),
        src: (sl.offset(), outer.2),
    })
}

impl CpuEngine {
    /// Whether a copy between `dst` and `src` may run here at submit: non-null, disjoint
    /// ([`check_bufs`]) and reachable from the CPU. The one check of every inline path; any
    /// other copy goes to the general path, which says what is wrong.
    #[inline]
    fn runs_here(&self, dst: RawBuf, src: RawBuf) -> bool {
        check_bufs(dst, Some(src)).is_ok() && self.supports(dst.kind, Some(src.kind))
    }

    /// The inline part of [`Engine::submit_copy`] for a 2-D tile ([`rows`]) of at most
    /// [`CpuConfig::inline_bytes`](super::CpuConfig::inline_bytes) inside both buffers: a loop
    /// over its rows, here; `false`, having touched nothing, for any other copy (the general
    /// path then checks it and says what is wrong).
    ///
    /// # Safety
    /// As [`Engine::submit_copy`].
    #[inline]
    unsafe fn rows_now(&self, dst: RawBuf, src: RawBuf, dl: &Layout, sl: &Layout) -> bool {
        let Some(r) = rows(dl, sl) else { return false };
        // The last row's end inside each buffer (overflow: not inside).
        let fits = |(off, stride): (usize, usize), len: usize| {
            (r.count - 1)
                .checked_mul(stride)
                .and_then(|x| x.checked_add(off))
                .and_then(|x| x.checked_add(r.run))
                .is_some_and(|end| end <= len)
        };
        let small = r
            .count
            .checked_mul(r.run)
            .is_some_and(|n| n <= self.cfg.inline_bytes);
        if !(small && fits(r.dst, dst.len) && fits(r.src, src.len) && self.runs_here(dst, src)) {
            return false;
        }
        // SAFETY: the caller guarantees the buffers until the request completes (it completes
        // here); every row lies inside both (`fits`), the destination's rows do not overlap
        // each other (`rows`), and `check_bufs` found the buffers disjoint.
        unsafe { exec::copy_rows(dst, src, &r) };
        true
    }

    /// The inline part of [`Engine::submit_copy`] for a copy that is not one run (a tile, a
    /// transpose) of at most [`CpuConfig::inline_bytes`](super::CpuConfig::inline_bytes): planned and run here, without a
    /// program or a job; `false`, having touched nothing, for any other.
    ///
    /// # Safety
    /// As [`Engine::submit_copy`]; the layouts were checked against the buffers' lengths
    /// (`checked_run` did).
    unsafe fn plan_now(&self, dst: RawBuf, src: RawBuf, dl: &Layout, sl: &Layout) -> bool {
        if !self.runs_here(dst, src) {
            return false;
        }
        match Plan::general(dl, sl) {
            Ok(plan) if plan.total_bytes() <= self.cfg.inline_bytes => {
                // SAFETY: the caller guarantees the buffers for the call; the layouts lie
                // inside them (checked), so the plan's runs do; `check_bufs` found them
                // disjoint.
                unsafe {
                    exec::copy_plan(dst, src, &plan, plan.total_bytes() > self.cfg.stream_bytes)
                };
                true
            }
            _ => false,
        }
    }
}

impl Engine for CpuEngine {
    fn name(&self) -> String {
        format!("cpu({})", self.cfg.threads)
    }

    fn supports(&self, dst: MemKind, src: Option<MemKind>) -> bool {
        dst.host_accessible() && src.is_none_or(MemKind::host_accessible)
    }

    unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
        job.check()?;
        if !self.supports(job.dst.kind, job.src.map(|s| s.kind)) {
            return Err(SubmitError::Unsupported {
                engine: self.name(),
                dst: job.dst.kind,
                src: job.src.map(|s| s.kind),
            });
        }
        let req = self.pool.submit(job, &self.cfg)?;
        // A copy that already ran inline and succeeded has nothing left for a barrier.
        if !matches!(req.completion().poll_done(), Some(Ok(()))) {
            self.inflight.track(&req);
        }
        Ok(req)
    }

    /// A copy of at most [`CpuConfig::inline_bytes`](super::CpuConfig::inline_bytes) runs here, on the caller's thread, and
    /// returns a done request that allocated nothing (one run: no plan either); any other copy
    /// (errors included) as `submit_raw`'s job.
    #[inline]
    unsafe fn submit_copy(
        &self,
        dst: RawBuf,
        dst_layout: &Layout,
        src: RawBuf,
        src_layout: &Layout,
    ) -> Result<Request, SubmitError> {
        // First as rows (one run, or a tile): one pass over the dims, no plan, nothing out of
        // line (issue 32: the 4 KiB tile paid the general checks and a plan; a 4 KiB `memcpy`
        // paid `checked_run`'s calls and its result written and read back through memory).
        // SAFETY: forwarded with the caller's guarantees.
        if unsafe { self.rows_now(dst, src, dst_layout, src_layout) } {
            return Ok(Request::done_ok());
        }
        let inline = match checked_run(dst_layout, src_layout, dst.len, src.len) {
            // No element (two empty layouts): done, nothing touched.
            Ok(Some((_, _, 0))) => true,
            Ok(Some(run)) if run.2 <= self.cfg.inline_bytes => {
                let ok = self.runs_here(dst, src);
                if ok {
                    // SAFETY: the caller guarantees the buffers until the request completes
                    // (it completes here); the run lies inside both (`checked_run`), and
                    // `check_bufs` found them disjoint.
                    unsafe { exec::copy_at(dst, src, run) };
                }
                ok
            }
            // SAFETY: forwarded with the caller's guarantees; `checked_run` checked both
            // layouts against their buffers.
            Ok(None) => unsafe { self.plan_now(dst, src, dst_layout, src_layout) },
            _ => false,
        };
        if inline {
            return Ok(Request::done_ok());
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.submit_raw(Job::copy(dst, *dst_layout, src, *src_layout)) }
    }

    /// A `memcpy` of at most [`CpuConfig::inline_bytes`](super::CpuConfig::inline_bytes)
    /// inside both buffers runs here without a layout (building two of 296 bytes and reading
    /// them back was a tenth of a 4 KiB copy: issue 32); any other as `submit_copy`'s.
    #[inline]
    unsafe fn submit_memcpy(
        &self,
        dst: RawBuf,
        src: RawBuf,
        len: usize,
    ) -> Result<Request, SubmitError> {
        if len != 0
            && len <= self.cfg.inline_bytes
            && len <= dst.len
            && len <= src.len
            && self.runs_here(dst, src)
        {
            // SAFETY: the caller guarantees the buffers until the request completes (it
            // completes here); `len` bytes lie inside both, and `check_bufs` found them
            // disjoint.
            unsafe { exec::copy_at(dst, src, (0, 0, len)) };
            return Ok(Request::done_ok());
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { memcpy_by_layouts(self, dst, src, len) }
    }

    fn inline_bytes(&self) -> usize {
        self.cfg.inline_bytes
    }

    fn barrier(&self) -> Result<(), BarrierError> {
        self.pool.help_until_idle();
        self.inflight.barrier()
    }
}
