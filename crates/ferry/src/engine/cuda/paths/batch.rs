//! Segment lists on the copy engines through the driver's batched copy (`cuMemcpyBatchAsync`,
//! CUDA 13's `_v2`): at most [`BATCH_MAX_COPIES`] segments per call. A batch the driver
//! refuses (`CUDA_ERROR_INVALID_VALUE` for some shapes, reported by vLLM's users; there is no
//! `failIdx` in the `_v2` ABI to say which copy) is copied again one `cuMemcpyAsync` per
//! segment, in stream order, and the refusal is kept ([`Batched`]) for the caller to report;
//! the other batches keep the batched copy.

use crate::engine::cuda::route::BATCH_MAX_COPIES;
use crate::engine::cuda::sys::driver;
use crate::op::Segment;
use cudarc::driver::result::DriverError;
use cudarc::driver::sys;

/// What one batched copy of a list did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Batched {
    /// Calls of the batched copy the driver took.
    pub batches: usize,
    /// Batches the driver refused, copied one call per segment instead.
    pub fallbacks: usize,
    /// The driver's first refusal.
    pub first_error: Option<DriverError>,
}

/// Enqueues every segment (`len` bytes from `src + src_off` to `dst + dst_off`) on `stream`
/// in batches; see the [module documentation](self). `overlap_compute`: the batches' hint that
/// the caller's kernels run meanwhile. `Err`: a per-segment copy of a refused batch failed too
/// (the call and the driver's error); earlier batches may have been enqueued.
///
/// # Safety
/// 1. Every segment lies in both buffers, which are valid for the copy (writes of `dst`, reads
///    of `src`) until the stream has passed it, are device-accessible or page-locked unified
///    addresses, and have no destination overlapping another or a source.
/// 2. `stream` is a live stream of the current context, not the legacy default stream.
pub(crate) unsafe fn copy(
    stream: sys::CUstream,
    dst: u64,
    src: u64,
    segs: &[Segment],
    overlap_compute: bool,
) -> Result<Batched, (&'static str, DriverError)> {
    let mut out = Batched::default();
    let live: Vec<&Segment> = segs.iter().filter(|s| s.len > 0).collect();
    let n = live.len().min(BATCH_MAX_COPIES);
    let (mut dsts, mut srcs, mut sizes) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for chunk in live.chunks(BATCH_MAX_COPIES) {
        dsts.clear();
        srcs.clear();
        sizes.clear();
        for s in chunk {
            dsts.push(dst + s.dst_off);
            srcs.push(src + s.src_off);
            sizes.push(s.len as usize);
        }
        // SAFETY: three arrays of the chunk's length, above 0 (1); the segments lie in the
        // buffers, valid until the stream passes them (2, caller's 1); the stream (3, caller's
        // 2).
        match unsafe {
            driver::memcpy_batch(&mut dsts, &mut srcs, &mut sizes, overlap_compute, stream)
        } {
            Ok(()) => out.batches += 1,
            Err(e) => {
                out.fallbacks += 1;
                out.first_error.get_or_insert(e);
                for s in chunk {
                    // SAFETY: the segment lies in both buffers (caller's 1), on the
                    // caller's stream (2).
                    unsafe {
                        sys::cuMemcpyAsync(dst + s.dst_off, src + s.src_off, s.len as usize, stream)
                    }
                    .result()
                    .map_err(|e| ("cuMemcpyAsync", e))?;
                }
            }
        }
    }
    Ok(out)
}
