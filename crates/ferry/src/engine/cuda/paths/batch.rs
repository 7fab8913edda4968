//! Many copies on the copy engines through the driver's batched copy (`cuMemcpyBatchAsync`:
//! CUDA 13's `_v2`, else 12.8's, whichever the driver exports: `sys/driver.rs`), at most
//! [`BATCH_MAX_COPIES`] per call: a segment list between two buffers ([`copy`]), or the
//! one-run copies a caller enqueued on one stream until its flush ([`copy_held`], where the
//! issuer of `completion/mark.rs`'s held copies, `paths/mod.rs`'s `HeldIssue`, does not take
//! the gather kernel).
//!
//! Each range carries its sides' location hints (device memory on its ordinal, host memory on
//! the host: `driver::copy_attributes`), one attribute per run of ranges with the same kinds.
//! A batch the driver refuses (`CUDA_ERROR_INVALID_VALUE` for some shapes, reported by vLLM's
//! users) is copied again one call per copy, in stream order, from the copy the driver named
//! (12.8's `failIdx`: the copies before it were enqueued) or from the batch's start (`_v2`
//! names none); the refusal is kept ([`Batched`]) for the caller to report, and the other
//! batches keep the batched copy.

use crate::engine::cuda::completion::mark::{BatchCopy, Issued};
use crate::engine::cuda::paths::calls::{copy1d, End};
use crate::engine::cuda::route::{self, BATCH_MAX_COPIES};
use crate::engine::cuda::sys::driver;
use crate::engine::cuda::DriverError;
use crate::memory::MemKind;
use crate::op::Segment;
use cudarc::driver::sys;

/// What one batched copy of a list did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Batched {
    /// Calls of the batched copy the driver took.
    pub batches: usize,
    /// Batches the driver refused, copied one call per copy instead (from the failed copy on,
    /// where the driver named it).
    pub fallbacks: usize,
    /// The driver's first refusal.
    pub first_error: Option<cudarc::driver::DriverError>,
}

/// A failure of a one-call-per-copy copy: the copies before `at` were enqueued, the call and
/// its error; what the batches did before it.
struct Stopped {
    at: usize,
    call: &'static str,
    error: DriverError,
    so_far: Batched,
}

/// Enqueues `copies` on `stream` in batches of at most [`BATCH_MAX_COPIES`] (see the [module
/// documentation](self)), each range with its location hints and the copy-engine preference
/// ([`route::BATCH_PREFER_OVERLAP`]).
///
/// # Safety
/// 1. Every copy's ranges are valid for the copy (writes of `dst`, reads of `src`) until the
///    stream has passed it, device-accessible or page-locked unified addresses, of the kinds
///    given; no destination overlaps another or a source; every length is above 0.
/// 2. `stream` is a live stream of the current context, not the legacy default stream.
unsafe fn batches(stream: sys::CUstream, copies: &[BatchCopy]) -> Result<Batched, Stopped> {
    let mut out = Batched::default();
    let n = copies.len().min(BATCH_MAX_COPIES);
    let (mut dsts, mut srcs, mut sizes) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut attrs, mut idxs) = (Vec::new(), Vec::new());
    for (c, chunk) in copies.chunks(BATCH_MAX_COPIES).enumerate() {
        dsts.clear();
        srcs.clear();
        sizes.clear();
        attrs.clear();
        idxs.clear();
        let mut kinds = None;
        for (i, s) in chunk.iter().enumerate() {
            dsts.push(s.dst);
            srcs.push(s.src);
            sizes.push(s.len);
            if kinds != Some((s.dst_kind, s.src_kind)) {
                kinds = Some((s.dst_kind, s.src_kind));
                attrs.push(driver::copy_attributes(
                    s.dst_kind,
                    s.src_kind,
                    route::BATCH_PREFER_OVERLAP,
                ));
                idxs.push(i);
            }
        }
        // SAFETY: three arrays of the chunk's length, above 0, and one attribute per run of
        // copies of the same kinds, the first at 0 (1); the copies' ranges are valid until
        // the stream passes them (2, caller's 1); the stream (3, caller's 2).
        let refused = match unsafe {
            driver::memcpy_batch(
                &mut dsts, &mut srcs, &mut sizes, &mut attrs, &mut idxs, stream,
            )
        } {
            Ok(()) => {
                out.batches += 1;
                continue;
            }
            Err(r) => r,
        };
        out.fallbacks += 1;
        out.first_error.get_or_insert(refused.error);
        let from = refused.fail_idx.unwrap_or(0).min(chunk.len());
        // SAFETY: the copies' ranges are valid (caller's 1), on the caller's stream (2).
        unsafe { one_each(stream, &chunk[from..], c * BATCH_MAX_COPIES + from, out) }?;
    }
    Ok(out)
}

/// Enqueues `copies` one call each on `stream`, the first being copy `at` of the caller's
/// list; a failure says where it stopped and keeps `so_far` (what the batches before did).
///
/// # Safety
/// Every copy's ranges are valid until the stream passes them, on one device or the host, or
/// unified managed memory (no copy between two GPUs, so no context is needed); `stream` is a
/// live stream of the current context.
unsafe fn one_each(
    stream: sys::CUstream,
    copies: &[BatchCopy],
    at: usize,
    so_far: Batched,
) -> Result<(), Stopped> {
    let end = |addr, kind| End {
        addr,
        kind,
        ctx: std::ptr::null_mut(),
    };
    copies.iter().enumerate().try_for_each(|(i, s)| {
        // SAFETY: this function's contract.
        unsafe {
            copy1d(
                stream,
                end(s.dst, s.dst_kind),
                end(s.src, s.src_kind),
                s.len,
            )
        }
        .map_err(|error| Stopped {
            at: at + i,
            call: error.call,
            error,
            so_far,
        })
    })
}

/// Enqueues every segment (`len` bytes from `src + src_off` to `dst + dst_off`) on `stream`
/// in batches; see the [module documentation](self). `kinds`: the destination's and the
/// source's memory kinds, for the location hints (`None`: left to the driver). `Err`: a
/// per-segment copy of a refused batch failed too (the call and the driver's error); earlier
/// copies may have been enqueued.
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
    kinds: Option<(MemKind, MemKind)>,
) -> Result<Batched, (&'static str, cudarc::driver::DriverError)> {
    // Managed: no hint (`driver::location`).
    let (dst_kind, src_kind) = kinds.unwrap_or((MemKind::Managed, MemKind::Managed));
    let copies: Vec<BatchCopy> = segs
        .iter()
        .filter(|s| s.len > 0)
        .map(|s| BatchCopy {
            dst: dst + s.dst_off,
            src: src + s.src_off,
            len: s.len as usize,
            dst_kind,
            src_kind,
        })
        .collect();
    // SAFETY: the segments lie in both buffers, valid until the stream passes them, of these
    // kinds (caller's 1); the stream (caller's 2).
    unsafe { batches(stream, &copies) }
        .map_err(|s| (s.call, cudarc::driver::DriverError(s.error.code)))
}

/// Enqueues a queue's held copies ([`BatchCopy`], in the order they were enqueued) on its
/// stream: one `cuMemcpyAsync` (the typed call) for a single copy, else batches of the
/// driver's batched copy where it has one (refused batches one call per copy), one call per
/// copy where it has none, the copy engines preferred as for the gatherer's batches
/// ([`route::BATCH_PREFER_OVERLAP`]).
///
/// # Safety
/// As [`Issue::issue`](crate::engine::cuda::completion::mark::Issue::issue): every copy's
/// ranges are valid until the stream passes them, device memory of the stream's device,
/// page-locked host or managed memory (no copy between two GPUs), no destination overlapping
/// another or a source, every length above 0; `stream` a live stream of the current context,
/// not the legacy one.
pub(crate) unsafe fn copy_held(stream: sys::CUstream, copies: &[BatchCopy]) -> Issued {
    let mut out = Issued {
        enqueued: copies.len(),
        ..Issued::default()
    };
    let each = copies.len() < 2 || driver::batch_copy().is_err() || stream.is_null();
    let r = if each {
        // SAFETY: the copies' ranges are valid, on this device or the host, on the caller's
        // stream (this function's contract).
        unsafe { one_each(stream, copies, 0, Batched::default()) }.map(|()| Batched::default())
    } else {
        // SAFETY: this function's contract is `batches`' (1, 2).
        unsafe { batches(stream, copies) }
    };
    let b = match r {
        Ok(b) => b,
        Err(s) => {
            out.enqueued = s.at;
            out.error = Some(s.error);
            s.so_far
        }
    };
    let symbol = driver::batch_copy().unwrap_or("cuMemcpyBatchAsync");
    out.batches = b.batches;
    out.refused = b.fallbacks;
    out.refusal = b.first_error.map(|e| DriverError::new(symbol, e.0));
    out
}
