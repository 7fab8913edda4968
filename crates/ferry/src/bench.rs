//! What the benchmark baselines of `ferry bench` need from inside ferry (feature `bench`, off by
//! default). The baselines themselves (raw driver copies, the event timer behind a latch) live
//! in the workspace crate `ferry-bench`, built on cudarc; these items are the parts that
//! cannot be written there without copying ferry's internals:
//!
//! - [`context`]: the primary context ferry's engines and buffers use, so that the baselines'
//!   streams and events share it (and its one-time set-up) with the engines they are compared
//!   with.
//! - [`enqueue_plan`]: the plain driver calls for a [`Plan`] (one `cuMemcpy2DAsync` or
//!   `cuMemcpy3DAsync` where the strides allow, else rows), exactly as ferry's CUDA engine
//!   issues them: the raw baseline of the strided tests.
//! - [`RawNccl`]: NCCL's own blocking send/receive through ferry's NCCL loader, so that the
//!   baseline and ferry's NCCL engine use the same library.
//! - [`private_fill_workers`]: a diagnostic switch, the GPU pipeline's fills on workers of
//!   their own instead of the process's one set.

pub use crate::engine::nccl::raw::RawNccl;

use crate::engine::cuda::paths::calls::{self as exec, End};
use crate::engine::cuda::sys::driver;
use crate::engine::cuda::CudaError;
use crate::memory::{MemKind, RawBuf};
use crate::plan::Plan;
use cudarc::driver::{CudaContext, CudaStream};
use std::sync::Arc;

/// While `on`, each GPU pipeline that starts filling bounce buffers from a pageable source after
/// this call fills them on a set of host copy workers of its own (stopped with the pipeline),
/// as before the process had one set (`ececbde`): to measure, in one process on one host, what
/// the shared set's hand-off costs the pageable pipeline (`FERRY_BENCH_FILL_PRIVATE=1`). Off by
/// default; what a program gets is always the shared set.
pub fn private_fill_workers(on: bool) {
    crate::staging::fill::PRIVATE_SETS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The primary context of device `ordinal`, the one every ferry engine and buffer on that
/// device uses (made once per process). Errors: no driver, no such device, or the driver
/// refused the context.
pub fn context(ordinal: u32) -> Result<Arc<CudaContext>, CudaError> {
    driver::context(ordinal)
}

/// Enqueues every run of `plan` from `src` to `dst` on `stream` with the fewest plain driver
/// calls the strides allow, as ferry's CUDA engine does for a strided copy on the copy engines;
/// returns without waiting. Makes `stream`'s context current on this thread.
///
/// Errors: the plan reaches outside a buffer, device memory of another device than `stream`'s
/// (refused before any call), or a driver call failed (the copies enqueued before it stay
/// enqueued: synchronize `stream` before handing the buffers back).
///
/// # Safety
/// 1. `dst` and `src` describe memory of the kinds they claim, valid for their whole `len`
///    bytes (`dst` writable, and not read or written by anything else) until the work enqueued
///    here has completed, e.g. until the caller has synchronized `stream`.
/// 2. `stream` is a live stream, not destroyed before that work has completed.
pub unsafe fn enqueue_plan(
    stream: &CudaStream,
    dst: RawBuf,
    src: RawBuf,
    plan: &Plan,
) -> Result<(), CudaError> {
    if plan.dst_end() > dst.len || plan.src_end() > src.len {
        return Err(CudaError::InvalidArgument(
            "plan reaches outside its buffers".into(),
        ));
    }
    let ctx = stream.context();
    let end = |b: RawBuf| match b.kind {
        MemKind::Device { ordinal } if ordinal as usize != ctx.ordinal() => {
            Err(CudaError::InvalidArgument(format!(
                "device {ordinal} memory on a stream of device {}",
                ctx.ordinal()
            )))
        }
        MemKind::Device { .. } => Ok(End {
            addr: b.addr,
            kind: b.kind,
            ctx: ctx.cu_ctx(),
        }),
        _ => Ok(End {
            addr: b.addr,
            kind: b.kind,
            ctx: std::ptr::null_mut(),
        }),
    };
    let (d, s) = (end(dst)?, end(src)?);
    driver::bind(ctx)?;
    // SAFETY: the context is current and `stream` belongs to it (live, 2); both buffers are
    // valid for the plan until the work completes (1), and the plan lies inside them (checked
    // above).
    Ok(unsafe { exec::copy_plan(stream.cu_stream(), d, s, plan) }?)
}
