//! Enqueues program steps on a stream: 1-D, 2-D (`cuMemcpy2DAsync`) and 3-D (`cuMemcpy3DAsync`)
//! copies, peer copies, and fills (`cuMemsetD8/16/32Async` where the pattern allows, else
//! copies from a device-side pattern block). The only place the engine issues copies.
//!
//! Every function here must be called with the engine's context current and only enqueues
//! work: nothing waits for the copy.

use crate::engine::cuda::route::{one_2d_call, one_3d_call};
use crate::engine::cuda::sys::driver::check;
use crate::engine::cuda::sys::memory::DeviceBuffer;
use crate::engine::cuda::DriverError;
use crate::memory::MemKind;
use crate::op::Step;
use crate::plan::{Plan, PlanKind};
use cudarc::driver::sys;

/// One side of a copy: an address, its kind, and (for device memory) its device's context,
/// which peer copies name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct End {
    pub addr: u64,
    pub kind: MemKind,
    pub ctx: sys::CUcontext,
}

impl End {
    pub(crate) fn at(self, off: usize) -> End {
        End {
            addr: self.addr + off as u64,
            ..self
        }
    }
    fn ordinal(self) -> Option<u32> {
        match self.kind {
            MemKind::Device { ordinal } => Some(ordinal),
            _ => None,
        }
    }
}

/// Largest pattern block kept on the device for fills that memset cannot express.
const FILL_BLOCK: usize = 16 << 20;

/// Enqueues one step on `stream`.
///
/// # Safety
/// 1. The engine's context is current on this thread and `stream` belongs to it.
/// 2. `dst` (and `src`, for copies) are valid for the step's whole byte range, of the kinds
///    they claim, until the work enqueued here completes.
/// 3. The step lies inside both buffers (as [`crate::Program`] checks).
pub(crate) unsafe fn run_step(
    stream: sys::CUstream,
    dst: End,
    src: Option<End>,
    step: &Step,
    ordinal: u32,
    keep: &mut Vec<DeviceBuffer>,
) -> Result<(), DriverError> {
    match step {
        Step::Segments { segs, range, .. } => {
            let Some(src) = src else { return Ok(()) };
            for seg in &segs[range.clone()] {
                // SAFETY: each segment lies inside both buffers (3); forwarded guarantees.
                unsafe {
                    copy1d(
                        stream,
                        dst.at(seg.dst_off as usize),
                        src.at(seg.src_off as usize),
                        seg.len as usize,
                    )?
                };
            }
            Ok(())
        }
        Step::Copy(plan) => {
            let Some(src) = src else { return Ok(()) };
            if dst.kind == MemKind::Pageable || src.kind == MemKind::Pageable {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { host_pageable(stream, dst, src, plan) }
            } else {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { copy_plan(stream, dst, src, plan) }
            }
        }
        // SAFETY: forwarded with the caller's guarantees.
        Step::Fill { plan, pattern } => unsafe {
            fill_plan(stream, dst, plan, pattern, ordinal, keep)
        },
    }
}

/// The pageable-host path: a copy of which one side is ordinary (pageable) host memory.
///
/// Today it hands the plan to the driver's own pageable path (plain `cuMemcpy*Async` from or to
/// pageable memory, which the driver stages through its own small pinned buffers and which
/// returns only once the host side has been consumed). This is the seam where the staged
/// pinned ring plugs in: replace the body with the ring's submit (split the plan, CPU-copy
/// chunks into pinned slots on worker threads, DMA each slot on `stream`), keeping the
/// signature and the guarantee that every byte is consumed or enqueued on `stream` on return.
///
/// # Safety
/// As [`run_step`].
pub(crate) unsafe fn host_pageable(
    stream: sys::CUstream,
    dst: End,
    src: End,
    plan: &Plan,
) -> Result<(), DriverError> {
    // SAFETY: forwarded with the caller's guarantees.
    unsafe { copy_plan(stream, dst, src, plan) }
}

/// Enqueues every run of `plan` with the fewest driver calls the strides allow.
///
/// # Safety
/// As [`run_step`].
pub(crate) unsafe fn copy_plan(
    stream: sys::CUstream,
    dst: End,
    src: End,
    plan: &Plan,
) -> Result<(), DriverError> {
    let (run, c, ds, ss) = (
        plan.run(),
        plan.counts(),
        plan.dst_strides(),
        plan.src_strides(),
    );
    let (d, s) = (dst.at(plan.dst_offset()), src.at(plan.src_offset()));
    if run == 0 || c.contains(&0) {
        return Ok(());
    }
    match plan.kind() {
        // SAFETY: one run at the plan's offsets, inside both buffers (3); context, stream and
        // buffers as the caller vouches (1, 2).
        PlanKind::Contiguous => unsafe { copy1d(stream, d, s, run) },
        // SAFETY: the plan's rows and pitches, inside both buffers (3); the rest as (1, 2).
        PlanKind::Pitched2D => unsafe { copy2d(stream, d, s, run, c[0], ds[0], ss[0]) },
        // SAFETY: the plan's rows, planes and pitches, inside both buffers (3); the rest as
        // (1, 2).
        PlanKind::Pitched3D => unsafe {
            copy3d(
                stream,
                d,
                s,
                run,
                [c[0], c[1]],
                [ds[0], ds[1]],
                [ss[0], ss[1]],
            )
        },
        PlanKind::Segments => {
            // A 3-D copy (or its fallback) for the two innermost outer dims, looped over the rest.
            let n = c.len();
            let mut result = Ok(());
            for_each_index(&c[..n - 2], |idx| {
                if result.is_err() {
                    return;
                }
                let doff: usize = idx.iter().zip(ds).map(|(i, s)| i * s).sum();
                let soff: usize = idx.iter().zip(ss).map(|(i, s)| i * s).sum();
                // SAFETY: `idx` is inside the plan's outer counts, so this 3-D block (the two
                // innermost dims at offsets `doff`, `soff`) lies inside both buffers (3); the
                // rest as (1, 2).
                result = unsafe {
                    copy3d(
                        stream,
                        d.at(doff),
                        s.at(soff),
                        run,
                        [c[n - 2], c[n - 1]],
                        [ds[n - 2], ds[n - 1]],
                        [ss[n - 2], ss[n - 1]],
                    )
                };
            });
            result
        }
    }
}

/// Calls `f` with every index of an odometer over `counts` (once with `[]` if empty).
fn for_each_index(counts: &[usize], mut f: impl FnMut(&[usize])) {
    let mut idx = vec![0usize; counts.len()];
    loop {
        f(&idx);
        let mut axis = counts.len();
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            idx[axis] += 1;
            if idx[axis] < counts[axis] {
                break;
            }
            idx[axis] = 0;
        }
    }
}

/// One contiguous run: `cuMemcpyPeerAsync` between two GPUs, else `cuMemcpyAsync` (unified
/// addressing routes every other pair).
///
/// # Safety
/// As [`run_step`], for `n` bytes at each end.
pub(crate) unsafe fn copy1d(
    stream: sys::CUstream,
    d: End,
    s: End,
    n: usize,
) -> Result<(), DriverError> {
    if n == 0 {
        return Ok(());
    }
    match (d.ordinal(), s.ordinal()) {
        (Some(a), Some(b)) if a != b => {
            // SAFETY: both ranges valid on their devices (caller); contexts are those devices'.
            check("cuMemcpyPeerAsync", unsafe {
                sys::cuMemcpyPeerAsync(d.addr, d.ctx, s.addr, s.ctx, n, stream)
            })
        }
        // The typed calls spare the driver the lookup of both addresses that `cuMemcpyAsync`
        // does to find the direction (part of the per-request cost of small copies).
        (Some(_), Some(_)) => check("cuMemcpyDtoDAsync", unsafe {
            // SAFETY: both ranges valid device memory (caller).
            sys::cuMemcpyDtoDAsync_v2(d.addr, s.addr, n, stream)
        }),
        (Some(_), None) if is_host(s.kind) => check("cuMemcpyHtoDAsync", unsafe {
            // SAFETY: `s` is host memory valid for `n` bytes, `d` device memory (caller).
            sys::cuMemcpyHtoDAsync_v2(d.addr, s.addr as *const std::ffi::c_void, n, stream)
        }),
        (None, Some(_)) if is_host(d.kind) => check("cuMemcpyDtoHAsync", unsafe {
            // SAFETY: `d` is host memory valid for `n` bytes, `s` device memory (caller).
            sys::cuMemcpyDtoHAsync_v2(d.addr as *mut std::ffi::c_void, s.addr, n, stream)
        }),
        // SAFETY: both ranges valid (caller); unified addresses.
        _ => check("cuMemcpyAsync", unsafe {
            sys::cuMemcpyAsync(d.addr, s.addr, n, stream)
        }),
    }
}

/// Host memory, by its kind (managed memory is neither host nor device here).
fn is_host(k: MemKind) -> bool {
    matches!(k, MemKind::Pageable | MemKind::Pinned | MemKind::Mapped)
}

fn mem_type(kind: MemKind) -> sys::CUmemorytype {
    match kind {
        MemKind::Pageable | MemKind::Pinned | MemKind::Mapped => {
            sys::CUmemorytype::CU_MEMORYTYPE_HOST
        }
        MemKind::Device { .. } => sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        MemKind::Managed => sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED,
    }
}

/// A driver answer that means "these strides are not for this call": fall back to smaller
/// copies.
fn shape_refused(e: &DriverError) -> bool {
    matches!(e.code, sys::CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// `h` rows of `w` bytes at the given pitches: one `cuMemcpy2DAsync`, or a loop of 1-D copies
/// where the pitches do not suit it (a pitch below the row, a source broadcast, peer memory).
///
/// # Safety
/// As [`run_step`], for every row.
unsafe fn copy2d(
    stream: sys::CUstream,
    d: End,
    s: End,
    w: usize,
    h: usize,
    dp: usize,
    sp: usize,
) -> Result<(), DriverError> {
    let rows = |stream| -> Result<(), DriverError> {
        for i in 0..h {
            // SAFETY: row `i` lies inside both buffers (caller).
            unsafe { copy1d(stream, d.at(i * dp), s.at(i * sp), w)? };
        }
        Ok(())
    };
    let peer = matches!((d.ordinal(), s.ordinal()), (Some(a), Some(b)) if a != b);
    if !one_2d_call(w, h, dp, sp) || peer {
        return rows(stream);
    }
    let m = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: mem_type(s.kind),
        srcHost: s.addr as *const std::ffi::c_void,
        srcDevice: s.addr,
        srcArray: std::ptr::null_mut(),
        srcPitch: sp,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: mem_type(d.kind),
        dstHost: d.addr as *mut std::ffi::c_void,
        dstDevice: d.addr,
        dstArray: std::ptr::null_mut(),
        dstPitch: dp,
        WidthInBytes: w,
        Height: h,
    };
    // SAFETY: `m` describes exactly the rows the caller vouches for.
    match check("cuMemcpy2DAsync", unsafe {
        sys::cuMemcpy2DAsync_v2(&m, stream)
    }) {
        Err(e) if shape_refused(&e) => rows(stream),
        r => r,
    }
}

/// `c[0]` planes of `c[1]` rows of `w` bytes: one `cuMemcpy3DAsync` where each plane stride is
/// a whole number of row pitches (pitches at least the row, planes at least `c[1]` rows), else
/// one 2-D copy per plane.
///
/// # Safety
/// As [`run_step`], for every row of every plane.
unsafe fn copy3d(
    stream: sys::CUstream,
    d: End,
    s: End,
    w: usize,
    c: [usize; 2],
    ds: [usize; 2],
    ss: [usize; 2],
) -> Result<(), DriverError> {
    let planes = |stream| -> Result<(), DriverError> {
        for k in 0..c[0] {
            // SAFETY: plane `k` lies inside both buffers (caller).
            unsafe {
                copy2d(
                    stream,
                    d.at(k * ds[0]),
                    s.at(k * ss[0]),
                    w,
                    c[1],
                    ds[1],
                    ss[1],
                )?
            };
        }
        Ok(())
    };
    let peer = matches!((d.ordinal(), s.ordinal()), (Some(a), Some(b)) if a != b);
    if !one_3d_call(w, c, ds, ss) || peer {
        return planes(stream);
    }
    let m = sys::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: mem_type(s.kind),
        srcHost: s.addr as *const std::ffi::c_void,
        srcDevice: s.addr,
        srcArray: std::ptr::null_mut(),
        reserved0: std::ptr::null_mut(),
        srcPitch: ss[1],
        srcHeight: ss[0] / ss[1],
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: mem_type(d.kind),
        dstHost: d.addr as *mut std::ffi::c_void,
        dstDevice: d.addr,
        dstArray: std::ptr::null_mut(),
        reserved1: std::ptr::null_mut(),
        dstPitch: ds[1],
        dstHeight: ds[0] / ds[1],
        WidthInBytes: w,
        Height: c[1],
        Depth: c[0],
    };
    // SAFETY: `m` describes exactly the planes the caller vouches for.
    match check("cuMemcpy3DAsync", unsafe {
        sys::cuMemcpy3DAsync_v2(&m, stream)
    }) {
        Err(e) if shape_refused(&e) => planes(stream),
        r => r,
    }
}

/// The memset width (1, 2 or 4 bytes) and value that write `pattern` repeatedly, if any.
pub(crate) fn memset_word(pattern: &[u8]) -> Option<(usize, u32)> {
    for w in [1usize, 2, 4] {
        if pattern.len() % w == 0
            && pattern
                .iter()
                .enumerate()
                .all(|(i, &b)| b == pattern[i % w])
        {
            let mut v = [0u8; 4];
            v[..w].copy_from_slice(&pattern[..w]);
            return Some((w, u32::from_le_bytes(v)));
        }
    }
    None
}

/// Fills every run of `plan` in `dst` with `pattern`.
///
/// # Safety
/// As [`run_step`]; `dst` is device-addressable (not pageable).
unsafe fn fill_plan(
    stream: sys::CUstream,
    dst: End,
    plan: &Plan,
    pattern: &[u8],
    ordinal: u32,
    keep: &mut Vec<DeviceBuffer>,
) -> Result<(), DriverError> {
    let (run, c, ds) = (plan.run(), plan.counts(), plan.dst_strides());
    if run == 0 || c.contains(&0) || pattern.is_empty() {
        return Ok(());
    }
    let base = dst.at(plan.dst_offset());
    let n = c.len();
    // Rows: the innermost outer dim (or one row for a contiguous plan); slabs: the rest.
    let (h, pitch) = if n == 0 {
        (1, run)
    } else {
        (c[n - 1], ds[n - 1])
    };
    let outer = if n == 0 { &[][..] } else { &c[..n - 1] };
    let slab_off = |idx: &[usize]| -> usize { idx.iter().zip(ds).map(|(i, s)| i * s).sum() };
    let aligned =
        |w: usize| base.addr % w as u64 == 0 && run % w == 0 && ds.iter().all(|s| s % w == 0);
    let mut result = Ok(());
    if let Some((w, v)) = memset_word(pattern).filter(|&(w, _)| aligned(w)) {
        for_each_index(outer, |idx| {
            if result.is_ok() {
                let at = base.at(slab_off(idx)).addr;
                // SAFETY: the slab's rows lie inside `dst` (caller); memsets are enqueued only.
                result = unsafe { memset2d(stream, at, pitch, w, v, run / w, h) };
            }
        });
        return result;
    }
    // A pattern memset cannot write: copy from a block of whole patterns on the device.
    let block_len = run.min((FILL_BLOCK / pattern.len()).max(1) * pattern.len());
    let block: Vec<u8> = pattern.iter().copied().cycle().take(block_len).collect();
    let scratch = DeviceBuffer::new(ordinal, block_len).map_err(|e| {
        // The allocation's own driver error (out of memory, most likely).
        e.driver_error().unwrap_or(DriverError::new(
            "cuMemAlloc",
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        ))
    })?;
    // The block is written on `stream`, so the copies below follow it in stream order (a
    // synchronous upload on the legacy stream could land after them: H200 run 22). From
    // pageable memory the call returns once `block` has been read.
    // SAFETY: `block` holds `block_len` bytes, the scratch buffer as many; our stream.
    check("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(
            scratch.device_ptr(),
            block.as_ptr().cast(),
            block_len,
            stream,
        )
    })?;
    let src = End {
        addr: scratch.device_ptr(),
        kind: MemKind::Device { ordinal },
        ctx: dst.ctx,
    };
    keep.push(scratch);
    for_each_index(outer, |idx| {
        let slab = base.at(slab_off(idx));
        let mut at = 0;
        while at < run && result.is_ok() {
            let len = block_len.min(run - at);
            // SAFETY: rows of the slab lie inside `dst` (caller); the block holds `len` bytes
            // and lives in `keep` until the request completes.
            result = unsafe { copy2d(stream, slab.at(at), src, len, h, pitch, 0) };
            at += len;
        }
    });
    result
}

/// `h` rows of `n` words of `w` bytes each, `pitch` bytes apart.
///
/// # Safety
/// The rows are valid device-addressable memory until the enqueued memset completes; the
/// context is current and `stream` belongs to it.
unsafe fn memset2d(
    stream: sys::CUstream,
    at: u64,
    pitch: usize,
    w: usize,
    v: u32,
    n: usize,
    h: usize,
) -> Result<(), DriverError> {
    if h == 1 || pitch == n * w {
        // The rows are back to back: one 1-D memset of `n * h` words.
        let total = n * h;
        return match w {
            // SAFETY: `total` bytes at `at` are the caller's rows; context and stream as vouched.
            1 => check("cuMemsetD8Async", unsafe {
                sys::cuMemsetD8Async(at, v as u8, total, stream)
            }),
            // SAFETY: `total` 2-byte words at `at` are the caller's rows; context and stream as
            // vouched.
            2 => check("cuMemsetD16Async", unsafe {
                sys::cuMemsetD16Async(at, v as u16, total, stream)
            }),
            // SAFETY: `total` 4-byte words at `at` are the caller's rows; context and stream as
            // vouched.
            _ => check("cuMemsetD32Async", unsafe {
                sys::cuMemsetD32Async(at, v, total, stream)
            }),
        };
    }
    let r = match w {
        // SAFETY: `h` rows of `n` bytes, `pitch` apart, are the caller's; context and stream as
        // vouched.
        1 => check("cuMemsetD2D8Async", unsafe {
            sys::cuMemsetD2D8Async(at, pitch, v as u8, n, h, stream)
        }),
        // SAFETY: `h` rows of `n` 2-byte words, `pitch` apart, are the caller's; context and
        // stream as vouched.
        2 => check("cuMemsetD2D16Async", unsafe {
            sys::cuMemsetD2D16Async(at, pitch, v as u16, n, h, stream)
        }),
        // SAFETY: `h` rows of `n` 4-byte words, `pitch` apart, are the caller's; context and
        // stream as vouched.
        _ => check("cuMemsetD2D32Async", unsafe {
            sys::cuMemsetD2D32Async(at, pitch, v, n, h, stream)
        }),
    };
    match r {
        Err(e) if shape_refused(&e) => {
            for i in 0..h {
                // SAFETY: row `i` is one of the caller's rows.
                unsafe { memset2d(stream, at + (i * pitch) as u64, n * w, w, v, n, 1)? };
            }
            Ok(())
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memset_word_picks_the_narrowest_period() {
        assert_eq!(memset_word(&[7]), Some((1, 7)));
        assert_eq!(memset_word(&[7, 7, 7, 7]), Some((1, 7)));
        assert_eq!(memset_word(&[1, 2]), Some((2, 0x0201)));
        assert_eq!(memset_word(&[1, 2, 1, 2, 1, 2, 1, 2]), Some((2, 0x0201)));
        assert_eq!(memset_word(&[1, 2, 3, 4]), Some((4, 0x0403_0201)));
        assert_eq!(
            memset_word(&[1, 2, 3, 4, 1, 2, 3, 4]),
            Some((4, 0x0403_0201))
        );
        assert_eq!(memset_word(&[1, 2, 3]), None);
        assert_eq!(memset_word(&[1, 2, 3, 4, 5, 6, 7, 8]), None);
    }

    #[test]
    fn odometer_visits_every_index_once() {
        let mut seen = Vec::new();
        for_each_index(&[2, 3], |i| seen.push(i.to_vec()));
        assert_eq!(seen.len(), 6);
        assert_eq!(seen[0], vec![0, 0]);
        assert_eq!(seen[5], vec![1, 2]);
        let mut once = 0;
        for_each_index(&[], |i| {
            assert!(i.is_empty());
            once += 1;
        });
        assert_eq!(once, 1);
    }
}
