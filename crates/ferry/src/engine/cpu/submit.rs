//! The CPU engine's submission: the [`Engine`] contract's checks, small copies run to their
//! end on the caller's thread
//! ([`CpuConfig::inline_bytes`](super::CpuConfig::inline_bytes)), anything else handed to the
//! pool.

use super::engine::CpuEngine;
use super::exec;
use crate::engine::{check_bufs, Engine, Job, SubmitError};
use crate::memory::{MemKind, RawBuf};
use crate::op::checked_run;
use crate::plan::Plan;
use crate::request::{BarrierError, Request};
use crate::Layout;

impl CpuEngine {
    /// The inline part of [`Engine::submit_copy`] for a copy that is not one run (a tile, a
    /// transpose) of at most [`CpuConfig::inline_bytes`](super::CpuConfig::inline_bytes): planned and run here, without a
    /// program or a job; `false`, having touched nothing, for any other.
    ///
    /// # Safety
    /// As [`Engine::submit_copy`]; the layouts were checked against the buffers' lengths
    /// (`checked_run` did).
    unsafe fn plan_now(&self, dst: RawBuf, src: RawBuf, dl: &Layout, sl: &Layout) -> bool {
        if check_bufs(dst, Some(src)).is_err() || !self.supports(dst.kind, Some(src.kind)) {
            return false;
        }
        match Plan::general(dl, sl) {
            Ok(plan) if plan.total_bytes() <= self.cfg.inline_bytes => {
                // SAFETY: the caller guarantees the buffers for the call; the layouts lie
                // inside them (checked), so the plan's runs do; `check_bufs` found them
                // disjoint.
                unsafe { exec::copy_plan(dst, src, &plan) };
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
        let inline = match checked_run(dst_layout, src_layout, dst.len, src.len) {
            // No element (two empty layouts): done, nothing touched.
            Ok(Some((_, _, 0))) => true,
            Ok(Some(run)) if run.2 <= self.cfg.inline_bytes => {
                let ok =
                    check_bufs(dst, Some(src)).is_ok() && self.supports(dst.kind, Some(src.kind));
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
            return Ok(Request::ready(Ok(())));
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.submit_raw(Job::copy(dst, *dst_layout, src, *src_layout)) }
    }

    fn inline_bytes(&self) -> usize {
        self.cfg.inline_bytes
    }

    fn barrier(&self) -> Result<(), BarrierError> {
        self.pool.help_until_idle();
        self.inflight.barrier()
    }
}
