//! Runs program steps with CPU loads and stores. The only unsafe code of the CPU engine.

use crate::memory::RawBuf;
use crate::op::Step;
use crate::plan::Plan;

/// Runs one step over raw buffers; `stream`: the request's destination is larger than the
/// caches ([`CpuConfig::stream_bytes`](super::CpuConfig::stream_bytes)), so a transpose may
/// write it past them ([`copy_plan`]).
///
/// # Safety
/// 1. `dst` must be host-accessible memory valid for writes of `dst.len` bytes, and `src` (if
///    any) valid for reads of `src.len` bytes, for the duration of the call.
/// 2. The step must lie inside both buffers (as [`crate::Program`] checks when it builds it).
/// 3. No other thread may touch the destination bytes of this step during the call.
pub(crate) unsafe fn run_step(dst: RawBuf, src: Option<RawBuf>, step: &Step, stream: bool) {
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
            // SAFETY: by this function's contract (1-3; disjoint: `Job::check`).
            unsafe { copy_plan(dst, src, plan, stream) }
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

/// Copies the runs of `plan` from `src` to `dst`; with `stream`, a transpose's staged tiles
/// write the destination with non-temporal stores ([`transpose_staged`]).
///
/// # Safety
/// 1. `dst` valid for writes and `src` for reads of their lengths for the duration of the call.
/// 2. Every run of the plan lies inside both buffers (as [`crate::Program`] and
///    [`Plan::general`] after the layouts' buffer checks ensure).
/// 3. The buffers do not overlap (as [`crate::engine::check_bufs`] checks), and no other
///    thread touches the plan's destination bytes during the call.
pub(crate) unsafe fn copy_plan(dst: RawBuf, src: RawBuf, plan: &Plan, stream: bool) {
    let (d, s) = (dst.addr as *mut u8, src.addr as *const u8);
    let run = plan.run();
    let copy = |doff: usize, soff: usize| {
        // SAFETY: the plan's runs lie inside both buffers (2), which are valid (1) and do not
        // overlap (3).
        unsafe { copy_run(d.add(doff), s.add(soff), run) }
    };
    if plan.is_transposing() && matches!(run, 1 | 2 | 4 | 8 | 16) {
        // One element per run against the source's grain (a transpose): a kernel per element
        // size, staged tiles where both sides are dense, else blocks of 32 x 32 elements (16 x
        // 16 of 16 bytes) that keep both sides in the level-1 cache ([`transpose`]).
        let tile = if run == 16 { 16 } else { 32 };
        // SAFETY: as above (1-3).
        unsafe {
            match run {
                1 => transpose_any::<u8>(d, s, plan, tile, stream),
                2 => transpose_any::<u16>(d, s, plan, tile, stream),
                4 => transpose_any::<u32>(d, s, plan, tile, stream),
                8 => transpose_any::<u64>(d, s, plan, tile, stream),
                _ => transpose_any::<u128>(d, s, plan, tile, stream),
            }
        }
    } else if run <= 64 && plan.is_transposing() {
        // Small runs against the source's grain: 32 x 32 blocks keep both sides in cache.
        plan.for_each_run_tiled(32, copy);
    } else {
        plan.for_each_run(copy);
    }
}

/// Bytes of each source row a staged tile reads whole ([`staged`]): four cache lines.
const STAGE_ROW: usize = 256;
/// Source rows a staged tile reads, at most: its buffer, `STAGE_ROWS` x [`STAGE_ROW`] bytes
/// (16 KiB), lives on the stack. Each destination row gets `STAGE_ROWS` elements or
/// [`STAGE_ROW`] bytes per tile, the fewer.
const STAGE_ROWS: usize = 64;

/// A staged tile's buffer, aligned to a cache line; written before it is read.
#[repr(align(64))]
struct Stage([std::mem::MaybeUninit<u8>; STAGE_ROWS * STAGE_ROW]);

/// The staged tile of a transpose plan with `size_of::<T>()`-byte elements: `ea` destination
/// rows (one source row's run of [`STAGE_ROW`] bytes) x `eb` source rows.
const fn stage_tile(es: usize) -> (usize, usize) {
    let e = STAGE_ROW / es;
    (e, if e < STAGE_ROWS { e } else { STAGE_ROWS })
}

/// Whether a transpose plan (one element per run) goes through [`transpose_staged`]: both
/// sides dense along their own axis, and both axes at least a staged tile long.
fn stages(plan: &Plan) -> bool {
    let (es, n) = (plan.run(), plan.counts().len());
    let (c, dst, src) = (plan.counts(), plan.dst_strides(), plan.src_strides());
    let (ea, eb) = stage_tile(es);
    src[n - 2] == es && dst[n - 1] == es && c[n - 2] >= ea && c[n - 1] >= eb
}

/// A transpose of `T` elements: [`transpose_staged`] where [`stages`] takes the plan, else
/// [`transpose`] (two functions, so that the small transposes' path stays as short as it was).
///
/// # Safety
/// As [`transpose`].
#[inline(always)]
unsafe fn transpose_any<T: Copy>(d: *mut u8, s: *const u8, plan: &Plan, tile: usize, stream: bool) {
    // SAFETY: as the function's contract; `stages` checked what `transpose_staged` needs.
    unsafe {
        if stages(plan) {
            transpose_staged::<T>(d, s, plan, tile, stream)
        } else {
            transpose::<T>(d, s, plan, tile)
        }
    }
}

/// Copies a plan whose runs are single elements of `T` (`size_of::<T>()` bytes) and whose two
/// innermost outer dims transpose ([`Plan::is_transposing`]) in `tile` x `tile` blocks that
/// keep both sides in cache ([`blocks`]); where both sides are dense along their own axis, 8
/// x 8 blocks (2-byte elements), 4 x 4 (4-byte) or 2 x 2 (8-byte) go through SIMD registers.
/// Dense plans of at least a staged tile go through [`transpose_staged`] instead.
///
/// # Safety
/// As [`run_step`]: every run of the plan lies inside both buffers (`d`, `s` their starts),
/// which are valid, and do not overlap.
unsafe fn transpose<T: Copy>(d: *mut u8, s: *const u8, plan: &Plan, tile: usize) {
    let es = std::mem::size_of::<T>();
    let n = plan.counts().len();
    let (c, dst, src) = (plan.counts(), plan.dst_strides(), plan.src_strides());
    let (ca, cb) = (c[n - 2], c[n - 1]);
    let strides = (dst[n - 2], dst[n - 1], src[n - 2], src[n - 1]);
    let dense = strides.2 == es && strides.1 == es;
    let one = |d0: usize, s0: usize| {
        // SAFETY: every element of the plan lies inside both buffers (the function's
        // contract): `d0`, `s0` are the offsets of one 2-D block's origin.
        unsafe { blocks::<T>(d.add(d0), s.add(s0), (0, ca, 0, cb), strides, tile, dense) }
    };
    for_each_outer(plan, n - 2, one);
}

/// A transpose as [`transpose`], of a plan [`stages`] takes: staged tiles ([`staged`]) as far
/// as both axes hold whole ones, each tile's source rows copied whole into a buffer on the
/// stack, then transposed from it into the destination's rows, which are written whole; with
/// `stream`, and the destination's rows aligned to 16 bytes, those writes go past the caches
/// (non-temporal stores, for a destination larger than the caches:
/// [`CpuConfig::stream_bytes`](super::CpuConfig::stream_bytes)). The partial tiles at the
/// edges go through `tile` x `tile` blocks.
///
/// # Safety
/// As [`transpose`]; the plan is one [`stages`] takes.
unsafe fn transpose_staged<T: Copy>(
    d: *mut u8,
    s: *const u8,
    plan: &Plan,
    tile: usize,
    stream: bool,
) {
    let es = std::mem::size_of::<T>();
    let n = plan.counts().len();
    let (c, dst, src) = (plan.counts(), plan.dst_strides(), plan.src_strides());
    let (ca, cb) = (c[n - 2], c[n - 1]);
    let (da, sb) = (dst[n - 2], src[n - 1]);
    let strides = (da, es, es, sb);
    // Whole tiles over `0..fa` x `0..fb`.
    let (ea, eb) = stage_tile(es);
    let (fa, fb) = (ca - ca % ea, cb - cb % eb);
    let mut streamed = false;
    let one = |d0: usize, s0: usize| {
        // SAFETY: (this closure's body) every element of the plan lies inside both buffers
        // (the function's contract): `d0`, `s0` are the offsets of one 2-D block's origin.
        let (d, s) = unsafe { (d.add(d0), s.add(s0)) };
        let nt = stream && (d as usize) % 16 == 0 && da % 16 == 0;
        streamed |= nt;
        // SAFETY: the tiles' elements are elements of the plan (contract above), both sides
        // dense; with `nt`, every destination row starts 16-byte aligned.
        unsafe { staged::<T>(d, s, (fa, fb), (da, sb), nt) };
        // The rest in blocks: rows `0..fa` past column `fb`, then every row from `fa`.
        // SAFETY: elements of the plan (contract above).
        unsafe {
            blocks::<T>(d, s, (0, fa, fb, cb), strides, tile, true);
            blocks::<T>(d, s, (fa, ca, 0, cb), strides, tile, true);
        }
    };
    for_each_outer(plan, n - 2, one);
    #[cfg(target_arch = "x86_64")]
    if streamed {
        // SAFETY: a fence, no memory touched: it orders the non-temporal stores before the
        // stores that follow (the request's completion), which plain stores would not wait for.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
}

/// Elements `i0..i1` x `j0..j1` of one 2-D block of [`transpose`] (origin `d`, `s`; strides
/// `(da, db, sa, sb)`), in `tile` x `tile` blocks ([`block`]).
///
/// # Safety
/// Every element `(i, j)` of the range, at `d + i * da + j * db` and `s + i * sa + j * sb`,
/// lies inside the buffers, which are valid and do not overlap.
#[inline(always)]
unsafe fn blocks<T: Copy>(
    d: *mut u8,
    s: *const u8,
    (i0, i1, j0, j1): (usize, usize, usize, usize),
    strides: (usize, usize, usize, usize),
    tile: usize,
    dense: bool,
) {
    for ib in (i0..i1).step_by(tile) {
        let ie = (ib + tile).min(i1);
        for jb in (j0..j1).step_by(tile) {
            let je = (jb + tile).min(j1);
            // SAFETY: the block's elements are in the range (the function's contract).
            unsafe { block::<T>(d, s, (ib, ie, jb, je), strides, dense) };
        }
    }
}

/// The staged tiles of [`transpose_staged`] over elements `0..fa` x `0..fb` of one 2-D block (origin
/// `d`, `s`; both sides dense: element `(i, j)` at `d + i * da + j * es` and `s + i * es + j *
/// sb`), each `ea` x `eb` elements (`fa`, `fb` multiples of them). A tile's `eb` source rows
/// (`ea` contiguous elements, [`STAGE_ROW`] bytes, each) are copied whole into a buffer, then
/// transposed from it into its `ea` destination rows (`eb` contiguous elements each), each
/// written whole; through SIMD registers for 2-, 4- and 8-byte elements. With `nt` the tile is
/// transposed into a second buffer, and its rows streamed out with non-temporal stores
/// ([`simd::stream_rows`]).
///
/// Why stage: the rows of a large matrix lie a power of two apart more often than not (the
/// bench's 8192 x 8192 f32 has 32 KiB pitches), so the rows of a tile fall in one set of the
/// level-1 and level-2 caches, which hold a few of them. Read in place, each source line was
/// fetched again for each register block that took 16 bytes of it (four times for f32); here
/// each line of either side moves once, in runs of whole lines, and the transposing reads only
/// the buffer, whose rows spread over the cache's sets (the 2-core VM: 256 MiB f32 1.3x, 16 MiB
/// 2-3x the tiles read in place, `bench/results/cpu-2core.md`).
///
/// Not inlined: the buffers (16 KiB each) stay off the stack of the copies that need none.
///
/// # Safety
/// Every element of the tiles lies inside the buffers, which are valid and do not overlap;
/// with `nt`, `d` and `da` are multiples of 16.
#[inline(never)]
unsafe fn staged<T: Copy>(
    d: *mut u8,
    s: *const u8,
    (fa, fb): (usize, usize),
    (da, sb): (usize, usize),
    nt: bool,
) {
    let es = std::mem::size_of::<T>();
    let (ea, eb) = stage_tile(es);
    let mut stage = Stage([std::mem::MaybeUninit::uninit(); STAGE_ROWS * STAGE_ROW]);
    let buf = stage.0.as_mut_ptr().cast::<u8>();
    // With `nt`, the transposed tile, then streamed out row by row.
    #[cfg(target_arch = "x86_64")]
    let mut out = Stage([std::mem::MaybeUninit::uninit(); STAGE_ROWS * STAGE_ROW]);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = nt;
    for ib in (0..fa).step_by(ea) {
        for jb in (0..fb).step_by(eb) {
            // SAFETY: the tile's source rows `jb..jb + eb` (run `ib..ib + ea`) lie inside the
            // source (contract); the buffer holds `eb <= STAGE_ROWS` rows of STAGE_ROW bytes.
            unsafe {
                let s = s.add(ib * es + jb * sb);
                for r in 0..eb {
                    std::ptr::copy_nonoverlapping(s.add(r * sb), buf.add(r * STAGE_ROW), STAGE_ROW);
                }
            }
            // Element (i, j) of the tile: `buf + j * STAGE_ROW + i * es` -> `d + i * da + j * es`.
            // SAFETY: as above for the destination's rows `ib..ib + ea` (run `jb..jb + eb`);
            // the buffer's rows were written just now; with `nt`, `out` holds the tile's `ea`
            // rows of `eb * es` bytes (a multiple of 16), and `d + ib * da + jb * es` is 16-byte
            // aligned (`d`, `da` by the contract, `jb * es` a multiple of `eb * es`).
            unsafe {
                let d = d.add(ib * da + jb * es);
                #[cfg(target_arch = "x86_64")]
                if nt {
                    let out = out.0.as_mut_ptr().cast::<u8>();
                    unstage::<T>(out, eb * es, buf);
                    simd::stream_rows(d, da, out, ea, eb * es);
                    continue;
                }
                unstage::<T>(d, da, buf);
            }
        }
    }
}

/// The second half of a staged tile ([`staged`]): its `ea` x `eb` elements from the buffer
/// into rows at `d`, `da` bytes apart.
///
/// # Safety
/// The tile's rows at `d` writable (`eb` elements each), the buffer's `eb` rows written.
#[inline(always)]
unsafe fn unstage<T: Copy>(d: *mut u8, da: usize, buf: *const u8) {
    let es = std::mem::size_of::<T>();
    let (ea, eb) = stage_tile(es);
    #[cfg(target_arch = "x86_64")]
    if matches!(es, 2 | 4 | 8) {
        let w = 16 / es;
        for i in (0..ea).step_by(w) {
            for j in (0..eb).step_by(w) {
                // SAFETY: the w x w elements from (i, j) are in the tile (`ea`, `eb` are
                // multiples of `w`); rows of w elements are contiguous in the buffer and at `d`.
                unsafe {
                    let (dp, sp) = (d.add(i * da + j * es), buf.add(j * STAGE_ROW + i * es));
                    simd::square(w, dp, da, sp, STAGE_ROW)
                }
            }
        }
        return;
    }
    for i in 0..ea {
        for j in 0..eb {
            // SAFETY: element (i, j) of the tile, in the buffer and row `i` at `d`.
            unsafe { copy_elem::<T>(d.add(i * da + j * es), buf.add(j * STAGE_ROW + i * es)) };
        }
    }
}

/// One block `ib..ie` x `jb..je` of [`transpose`].
///
/// # Safety
/// Every element `(i, j)` of the block, at `d + i * da + j * db` and `s + i * sa + j * sb`,
/// lies inside the buffers, which are valid and do not overlap.
#[inline(always)]
unsafe fn block<T: Copy>(
    d: *mut u8,
    s: *const u8,
    (ib, ie, jb, je): (usize, usize, usize, usize),
    (da, db, sa, sb): (usize, usize, usize, usize),
    dense: bool,
) {
    let mut i = ib;
    #[cfg(target_arch = "x86_64")]
    if dense && matches!(std::mem::size_of::<T>(), 2 | 4 | 8) {
        let w = 16 / std::mem::size_of::<T>();
        while i + w <= ie {
            let mut j = jb;
            while j + w <= je {
                // SAFETY: the w x w elements from (i, j) are in the block (loop bounds), so
                // inside the buffers; dense: rows of w elements are contiguous on both sides.
                unsafe {
                    let (dp, sp) = (d.add(i * da + j * db), s.add(i * sa + j * sb));
                    simd::square(w, dp, da, sp, sb)
                }
                j += w;
            }
            for ii in i..i + w {
                for jj in j..je {
                    // SAFETY: an element of the block.
                    unsafe { copy_elem::<T>(d.add(ii * da + jj * db), s.add(ii * sa + jj * sb)) };
                }
            }
            i += w;
        }
    }
    let _ = dense;
    for ii in i..ie {
        // SAFETY: elements of the block (the function's contract).
        unsafe {
            let (dr, sr) = (d.add(ii * da), s.add(ii * sa));
            for jj in jb..je {
                copy_elem::<T>(dr.add(jj * db), sr.add(jj * sb));
            }
        }
    }
}

/// Copies one `T` between unaligned addresses.
///
/// # Safety
/// `s` readable and `d` writable for `size_of::<T>()` bytes.
#[inline(always)]
unsafe fn copy_elem<T: Copy>(d: *mut u8, s: *const u8) {
    // SAFETY: by the function's contract.
    unsafe {
        d.cast::<T>()
            .write_unaligned(s.cast::<T>().read_unaligned())
    }
}

/// Calls `f(dst_offset, src_offset)` at each index of the plan's `outer` outermost dims (their
/// origin offsets, the plan's own included); once for a plan with none.
fn for_each_outer(plan: &Plan, outer: usize, mut f: impl FnMut(usize, usize)) {
    let c = &plan.counts()[..outer];
    let (ds, ss) = (&plan.dst_strides()[..outer], &plan.src_strides()[..outer]);
    let mut idx = [0usize; crate::layout::MAX_DIMS];
    loop {
        let (mut d, mut s) = (plan.dst_offset(), plan.src_offset());
        for k in 0..outer {
            d += idx[k] * ds[k];
            s += idx[k] * ss[k];
        }
        f(d, s);
        // Odometer, innermost of the outer dims first.
        let mut k = outer;
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < c[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// Register transposes (SSE2, which every x86_64 has).
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// Writes `rows` rows of `bytes` bytes (a multiple of 16) from `s` (contiguous, 16-byte
    /// aligned) to `d`, `da` bytes apart, with non-temporal stores: past the caches, each row's
    /// lines filled one after the other, so that at most one line is open in the write-combining
    /// buffers at a time (a register transpose's stores into 4-8 rows at once kept that many
    /// open, and the 16-core host's bf16 256 MiB transpose fell to 0.3x).
    ///
    /// # Safety
    /// `s` readable for `rows * bytes` bytes and 16-byte aligned; each destination row writable
    /// for `bytes` bytes and 16-byte aligned (`d`, `da` multiples of 16).
    #[inline(always)]
    pub(super) unsafe fn stream_rows(
        d: *mut u8,
        da: usize,
        s: *const u8,
        rows: usize,
        bytes: usize,
    ) {
        for r in 0..rows {
            for k in (0..bytes).step_by(16) {
                // SAFETY: by the function's contract: both 16 bytes inside their rows, aligned.
                unsafe {
                    let x = _mm_load_si128(s.add(r * bytes + k).cast());
                    _mm_stream_si128(d.add(r * da + k).cast(), x);
                }
            }
        }
    }

    /// Transposes one `w` x `w` block of `16 / w`-byte elements ([`t8x8`], [`t4x4`] or
    /// [`t2x2`]).
    ///
    /// # Safety
    /// `w` is 8, 4 or 2; the `w` source rows readable and the `w` destination rows writable,
    /// 16 bytes each.
    #[inline(always)]
    pub(super) unsafe fn square(w: usize, d: *mut u8, da: usize, s: *const u8, sb: usize) {
        // SAFETY: by the function's contract.
        unsafe {
            match w {
                8 => t8x8(d, da, s, sb),
                4 => t4x4(d, da, s, sb),
                _ => t2x2(d, da, s, sb),
            }
        }
    }

    /// Transposes 4 x 4 four-byte elements: row `j` of the source block (4 contiguous elements
    /// at `s + j * sb`) becomes column `j` of the destination block (rows at `d + i * da`).
    ///
    /// # Safety
    /// The 4 source rows readable and the 4 destination rows writable, 16 bytes each.
    #[inline(always)]
    pub(super) unsafe fn t4x4(d: *mut u8, da: usize, s: *const u8, sb: usize) {
        // SAFETY: by the function's contract; unaligned loads and stores; SSE2 is part of
        // x86_64.
        unsafe {
            let r0 = _mm_loadu_ps(s.cast());
            let r1 = _mm_loadu_ps(s.add(sb).cast());
            let r2 = _mm_loadu_ps(s.add(2 * sb).cast());
            let r3 = _mm_loadu_ps(s.add(3 * sb).cast());
            let t0 = _mm_unpacklo_ps(r0, r1);
            let t1 = _mm_unpacklo_ps(r2, r3);
            let t2 = _mm_unpackhi_ps(r0, r1);
            let t3 = _mm_unpackhi_ps(r2, r3);
            _mm_storeu_ps(d.cast(), _mm_movelh_ps(t0, t1));
            _mm_storeu_ps(d.add(da).cast(), _mm_movehl_ps(t1, t0));
            _mm_storeu_ps(d.add(2 * da).cast(), _mm_movelh_ps(t2, t3));
            _mm_storeu_ps(d.add(3 * da).cast(), _mm_movehl_ps(t3, t2));
        }
    }

    /// Transposes 8 x 8 two-byte elements (bf16, f16, u16), as [`t4x4`]: eight loads, 24
    /// unpacks and eight stores for 64 elements, where the element loop made 64 of each. Each
    /// 16-byte piece of a row is touched once, so the rows of a block that fall in one cache
    /// set (power-of-two pitches: a 2048 x 4096 bf16 matrix has 4 KiB and 8 KiB pitches) are
    /// read once a block rather than once an element (issue 32: bf16 16 MiB at 0.4-0.65x a
    /// 32 x 32 loop).
    ///
    /// # Safety
    /// The 8 source rows readable and the 8 destination rows writable, 16 bytes each.
    #[inline(always)]
    pub(super) unsafe fn t8x8(d: *mut u8, da: usize, s: *const u8, sb: usize) {
        // SAFETY: as in `t4x4`.
        unsafe {
            let r = |k: usize| _mm_loadu_si128(s.add(k * sb).cast());
            let (r0, r1, r2, r3) = (r(0), r(1), r(2), r(3));
            let (r4, r5, r6, r7) = (r(4), r(5), r(6), r(7));
            // Pairs of rows interleaved by element, then by pairs, then by fours: column k of
            // the block in one register.
            let a0 = _mm_unpacklo_epi16(r0, r1);
            let a1 = _mm_unpackhi_epi16(r0, r1);
            let a2 = _mm_unpacklo_epi16(r2, r3);
            let a3 = _mm_unpackhi_epi16(r2, r3);
            let a4 = _mm_unpacklo_epi16(r4, r5);
            let a5 = _mm_unpackhi_epi16(r4, r5);
            let a6 = _mm_unpacklo_epi16(r6, r7);
            let a7 = _mm_unpackhi_epi16(r6, r7);
            let b0 = _mm_unpacklo_epi32(a0, a2);
            let b1 = _mm_unpackhi_epi32(a0, a2);
            let b2 = _mm_unpacklo_epi32(a1, a3);
            let b3 = _mm_unpackhi_epi32(a1, a3);
            let b4 = _mm_unpacklo_epi32(a4, a6);
            let b5 = _mm_unpackhi_epi32(a4, a6);
            let b6 = _mm_unpacklo_epi32(a5, a7);
            let b7 = _mm_unpackhi_epi32(a5, a7);
            let w = |k: usize, x: __m128i| _mm_storeu_si128(d.add(k * da).cast(), x);
            w(0, _mm_unpacklo_epi64(b0, b4));
            w(1, _mm_unpackhi_epi64(b0, b4));
            w(2, _mm_unpacklo_epi64(b1, b5));
            w(3, _mm_unpackhi_epi64(b1, b5));
            w(4, _mm_unpacklo_epi64(b2, b6));
            w(5, _mm_unpackhi_epi64(b2, b6));
            w(6, _mm_unpacklo_epi64(b3, b7));
            w(7, _mm_unpackhi_epi64(b3, b7));
        }
    }

    /// Transposes 2 x 2 eight-byte elements, as [`t4x4`].
    ///
    /// # Safety
    /// The 2 source rows readable and the 2 destination rows writable, 16 bytes each.
    #[inline(always)]
    pub(super) unsafe fn t2x2(d: *mut u8, da: usize, s: *const u8, sb: usize) {
        // SAFETY: as in `t4x4`.
        unsafe {
            let r0 = _mm_loadu_pd(s.cast());
            let r1 = _mm_loadu_pd(s.add(sb).cast());
            _mm_storeu_pd(d.cast(), _mm_unpacklo_pd(r0, r1));
            _mm_storeu_pd(d.add(da).cast(), _mm_unpackhi_pd(r0, r1));
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

/// Rows of one copy: `count` runs of `run` bytes, the `i`-th at `dst + i * dst_stride` and
/// `src + i * src_stride` (offsets from the buffers' starts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rows {
    pub(crate) count: usize,
    pub(crate) run: usize,
    pub(crate) dst: (usize, usize),
    pub(crate) src: (usize, usize),
}

/// Copies the rows of a 2-D tile ([`Rows`]) between the buffers.
///
/// # Safety
/// 1. `dst` valid for writes and `src` for reads of their lengths for the duration of the call.
/// 2. Every row lies inside both buffers, and the destination's rows do not overlap (as
///    the CPU engine's submit checks before it calls this).
/// 3. The buffers do not overlap (as [`crate::engine::check_bufs`] checks), and no other
///    thread touches the destination bytes during the call.
#[inline]
pub(crate) unsafe fn copy_rows(dst: RawBuf, src: RawBuf, r: &Rows) {
    let (d, s) = (dst.addr as *mut u8, src.addr as *const u8);
    let ((mut doff, dstride), (mut soff, sstride)) = (r.dst, r.src);
    for _ in 0..r.count {
        // SAFETY: by the function's contract (1-3): row `i` at these offsets lies inside both
        // buffers.
        unsafe { std::ptr::copy_nonoverlapping(s.add(soff), d.add(doff), r.run) };
        doff = doff.wrapping_add(dstride);
        soff = soff.wrapping_add(sstride);
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
