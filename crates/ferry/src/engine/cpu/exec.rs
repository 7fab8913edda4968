//! Runs program steps with CPU loads and stores. The only unsafe code of the CPU engine.

use crate::memory::RawBuf;
use crate::op::Step;

/// Runs one step over raw buffers.
///
/// # Safety
/// 1. `dst` must be host-accessible memory valid for writes of `dst.len` bytes, and `src` (if
///    any) valid for reads of `src.len` bytes, for the duration of the call.
/// 2. The step must lie inside both buffers (as [`crate::Program`] checks when it builds it).
/// 3. No other thread may touch the destination bytes of this step during the call.
pub(crate) unsafe fn run_step(dst: RawBuf, src: Option<RawBuf>, step: &Step) {
    let d = dst.addr as *mut u8;
    match step {
        Step::Segments { segs, range, .. } => {
            let Some(src) = src else { return };
            let s = src.addr as *const u8;
            for seg in &segs[range.clone()] {
                // SAFETY: every segment lies inside both buffers (2: checked by
                // `check_segments`); destinations of one list never overlap; buffers valid (1).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        s.add(seg.src_off as usize),
                        d.add(seg.dst_off as usize),
                        seg.len as usize,
                    )
                };
            }
        }
        Step::Copy(plan) => {
            let Some(src) = src else { return };
            let s = src.addr as *const u8;
            let run = plan.run();
            let copy = |doff: usize, soff: usize| {
                // SAFETY: the plan's runs lie inside both buffers (2), which are valid (1);
                // source and destination do not overlap (checked by `Job::check` at submit).
                unsafe { copy_run(d.add(doff), s.add(soff), run) }
            };
            if run <= 64 && plan.is_transposing() {
                // Small elements against the source's grain: 32 x 32 blocks keep both sides in
                // cache (a transpose).
                plan.for_each_run_tiled(32, copy);
            } else {
                plan.for_each_run(copy);
            }
        }
        Step::Fill { plan, pattern } => {
            let run = plan.run();
            if pattern.iter().all(|&b| b == pattern[0]) {
                let b = pattern[0];
                // SAFETY: as above; write_bytes writes exactly `run` bytes at each run.
                plan.for_each_run(|doff, _| unsafe { std::ptr::write_bytes(d.add(doff), b, run) });
                return;
            }
            // A block of whole patterns to copy from (runs are whole elements).
            let reps = (4096 / pattern.len()).max(1);
            let block: Vec<u8> = pattern
                .iter()
                .copied()
                .cycle()
                .take(reps * pattern.len())
                .collect();
            plan.for_each_run(|doff, _| {
                let mut at = 0;
                while at < run {
                    let n = block.len().min(run - at);
                    // SAFETY: as above; `block` is a separate allocation.
                    unsafe { std::ptr::copy_nonoverlapping(block.as_ptr(), d.add(doff + at), n) };
                    at += n;
                }
            });
        }
    }
}

/// Copies one contiguous run `(dst_offset, src_offset, bytes)` between the buffers.
///
/// # Safety
/// 1. `dst` valid for writes and `src` for reads of their lengths for the duration of the call.
/// 2. The run lies inside both buffers (as [`crate::op::checked_run`] checks it).
/// 3. The buffers do not overlap (as [`crate::engine::check_bufs`] checks), and no other
///    thread touches the destination bytes during the call.
#[inline]
pub(crate) unsafe fn copy_at(dst: RawBuf, src: RawBuf, (doff, soff, n): (usize, usize, usize)) {
    // SAFETY: by the function's contract (1-3).
    unsafe {
        std::ptr::copy_nonoverlapping(
            (src.addr as *const u8).add(soff),
            (dst.addr as *mut u8).add(doff),
            n,
        )
    }
}

/// Copies `run` bytes; element-sized runs are one load and one store.
///
/// # Safety
/// `s` is valid for reads and `d` for writes of `run` bytes, and they do not overlap.
#[inline(always)]
unsafe fn copy_run(d: *mut u8, s: *const u8, run: usize) {
    // SAFETY: by the function's contract; unaligned accesses for any alignment.
    unsafe {
        match run {
            1 => *d = *s,
            2 => d
                .cast::<u16>()
                .write_unaligned(s.cast::<u16>().read_unaligned()),
            4 => d
                .cast::<u32>()
                .write_unaligned(s.cast::<u32>().read_unaligned()),
            8 => d
                .cast::<u64>()
                .write_unaligned(s.cast::<u64>().read_unaligned()),
            16 => d
                .cast::<u128>()
                .write_unaligned(s.cast::<u128>().read_unaligned()),
            _ => std::ptr::copy_nonoverlapping(s, d, run),
        }
    }
}
