//! Which path a copy takes: one pure function of the memory kinds, the lowered program and the
//! engine's settings, decided once per request before anything runs. The code that runs a path
//! (`paths`, `exec`) never re-decides it. Every threshold measured on the H200 lives here, next
//! to the figures that set it, and the CPU tests at the bottom pin each one: changing a
//! threshold is a one-line diff here and a failing test that names it.
//!
//! The paths, in the order a [`Route`] tries them:
//! - [`Path::Staged`]: pageable host memory <-> this GPU through the pinned ring
//!   ([`super::paths::staged`]), on a staging thread: programs of copies, or one segment list (its
//!   runs packed into the ring's chunks, [`STAGE_MIN_SEGMENTS`]). Exclusive: nothing else is
//!   tried.
//! - [`Path::Sm`]: every step a copy plan that [`KernelCopies`] sends to the SMs, both sides
//!   reachable by this GPU's kernels ([`super::paths::strided`]; the transposes that [`transpose_of`]
//!   recognises by the tiled kernel of [`super::paths::transpose`], pinned host memory read or
//!   written in place).
//! - [`Path::Gather`]: a program that would take at least [`GATHER_MIN_CALLS`] driver calls, as
//!   one segment list ([`super::paths::gather`], whose own strategy is [`gather_strategy`]).
//! - [`Path::Split`]: one large contiguous copy within this GPU split between a copy engine and
//!   an SM kernel ([`super::paths::split`], off unless [`CudaConfig::d2d_sm_share`] is set).
//! - [`Path::Driver`]: the program's steps as driver calls (`cuMemcpy*Async`, `cuMemset*Async`,
//!   `cuMemcpyPeerAsync`), always last: a kernel path that cannot be made here (no NVRTC) falls
//!   through to the next one.
//!
//! The route's stream is a direction ([`direction`]); which of the engine's pool of streams
//! for that direction runs it is the submitting thread's lane ([`lane`]), so that one thread's
//! requests in one direction stay in order on one stream while other threads use others.

use super::config::{CudaConfig, Direction, KernelCopies};
use crate::memory::MemKind;
use crate::op::Step;
use crate::plan::{Plan, PlanKind};

/// Copies at least this large from pageable memory to the device are staged; smaller ones take
/// the driver's own pageable path (the hand-off to the staging thread and the ring's start-up
/// cost more). Measured on the H200 host (run 24, `ferry bench --test
/// cuda-h2d-pageable,cuda-d2h-pageable --sizes 1M,2M,4M,8M,16M,32M`, batches of 8): staged /
/// driver = 0.86x at 1 MiB, 1.14x at 2 MiB, 1.35x at 4 MiB.
pub const STAGE_MIN_H2D: usize = 2 << 20;

/// As [`STAGE_MIN_H2D`], device to pageable host memory: staged / driver = 1.35x at 1 MiB,
/// 1.58x at 2 MiB (run 24; the driver's pageable read-back is the slower of the two).
pub const STAGE_MIN_D2H: usize = 1 << 20;

/// A segment list between pageable host memory and this GPU of at least this many segments is
/// staged whatever its size (as is one of at least [`STAGE_MIN_H2D`] / [`STAGE_MIN_D2H`]
/// bytes): the staging workers pack the runs into the pinned ring and each chunk moves in one
/// DMA. Set from the H200 figures (not yet a sweep of this threshold): the driver's pageable
/// path took 2.5 us per 4 KiB segment (1.6 GB/s, 100,000 segments), so 64 segments cost about
/// 160 us of driver calls, more than a staged copy's hand-off and start (a staged 2 MiB copy
/// breaks even with the driver's ~12 GB/s pageable copy, run 24: under 175 us all told).
pub const STAGE_MIN_SEGMENTS: usize = 64;

/// A staged segment list's chunk whose device-side runs (adjacent segments merged) number at
/// most this many, or average at least [`AUTO_LARGE_SEGMENT`] bytes, moves between the pinned
/// slot and the device with one DMA per run; more, shorter runs land in a device scratch chunk
/// in one DMA and the gatherer scatters them on the device (or packs them there, device ->
/// host): one driver call per run costs ~2.5 us (the 4 KiB figure above), the device-side
/// pass one launch and a copy at device bandwidth (the gather kernel: 47 GB/s at 4 KiB
/// segments from pinned memory, far more device to device).
pub const STAGED_DIRECT_MAX_RUNS: usize = AUTO_FEW_SEGMENTS;

/// Programs that would take at least this many driver calls go to the gatherer.
pub const GATHER_MIN_CALLS: usize = 64;

/// [`KernelCopies::Auto`] moves a strided plan on the SMs when its runs are at most this many
/// bytes and there are at least [`AUTO_MIN_RUNS`] of them, even where the copy engines take the
/// plan in one 2-D or 3-D call.
///
/// Measured on the H200 (run 19, `cuda_strided`'s `transpose_timings_by_run_length`: 2-D tiles
/// of 16 MiB, rows out of a pitch twice as wide, SM vs one `cuMemcpy2DAsync`): at 4-byte rows
/// the kernel moved 220.5 vs 25.9 GB/s device to device, 15.8 vs 1.6 pinned to device, 42.1 vs
/// 3.1 device to pinned; at 16-byte rows 232.1 vs 85.8, 20.2 vs 9.7, 40.2 vs 11.5. From 64-byte
/// rows on the copy engines were as fast or faster with host memory (64 B: 31.8 vs 23.7 GB/s
/// pinned to device) and they leave the SMs to the user's kernels.
pub const AUTO_MAX_RUN: usize = 16;

/// [`KernelCopies::Auto`] leaves one-call plans of fewer runs than this on the copy engines.
/// A kernel launch costs a few microseconds more than one copy call (run 19: an 8x8 f32
/// transpose on the SMs took 30.6 us submit+wait with blocking waits), which the copy engines'
/// per-row cost at short rows (0.15 ns device to device, 2.5 ns pinned to device at 4 bytes,
/// from the rates above) makes up only after thousands of rows.
pub const AUTO_MIN_RUNS: usize = 4096;

/// [`KernelCopies::Auto`] also moves on the SMs plans of runs up to this many bytes that the
/// copy engines would need at least [`AUTO_MIN_CALLS`] driver calls for (transposes: one 2-D
/// call per column). Run 19, square transposes of 16 MiB: with 256-byte elements the kernels
/// moved 234.3 vs 11.5 GB/s device to device and 27.8 vs 9.3 pinned to device; they were ahead
/// at every element size from 1 to 256 bytes.
pub const AUTO_MAX_RUN_CALLS: usize = 256;

/// See [`AUTO_MAX_RUN_CALLS`]. Run 19: an 8x8 f32 transpose (8 driver calls) took 86.1 us on
/// the copy engines and 30.6 us on the SMs.
pub const AUTO_MIN_CALLS: usize = 4;

/// Contiguous device copies below this many bytes are never split between a copy engine and
/// the SMs (two launches cost more than they save).
pub const SPLIT_MIN_BYTES: usize = 8 << 20;

/// The copy engine's part of a split copy ends on this boundary, so that the kernel's part
/// starts as aligned as the buffers (16-byte loads).
const SPLIT_ALIGN: usize = 4096;

/// [`Strategy::Auto`] copies this many segments or fewer with one driver call each.
pub const AUTO_FEW_SEGMENTS: usize = 4;

/// [`Strategy::Auto`] copies segments averaging this many bytes or more on the copy engines (the
/// batch copy, else one call each): they then run at link speed and leave the SMs free.
/// Measured on the H200 (`bench/results/h200.md`, scattered segments): the batch copy 52 GB/s
/// at 1 MiB segments against the kernel's 50; the kernel 47 GB/s at 4 KiB. Device -> host
/// lists and short device lists keep it; host -> device lists and long device lists have
/// their own (`large_segment`).
pub const AUTO_LARGE_SEGMENT: u64 = 1 << 20;

/// [`large_segment`] of a list from host memory to a device. The kernel reads the host's
/// memory over the link itself, and on the H100 host its reads stopped at 33 GB/s where the
/// batched copy reached 52.5 (`bench/results/h100.md`, `cuda-blocks-h2d`: 256 x 512 KiB).
/// Two runs there put the crossing between 32 and 64 KiB: at 64 KiB the batch copy 31.0 /
/// 39.8 / 40.6 GB/s for 16 / 256 / 4,096 blocks against the kernel's 23.1 / 33.2 / 33.2; at
/// 32 KiB 21.6 / 30.8 / 32.2 against 17.5 / 32.6 / 33.7 (level but for short lists). With this
/// threshold (third run) the 64 KiB rows ran 1.03 / 1.01 / 0.92 of the raw batch (they were
/// 0.71 / 0.83 / 0.82 on the kernel). On the H200 the batch copy was level with the kernel
/// from 1 MiB (nothing measured there below). The fourth H100 run's host (another machine)
/// went the other way: its kernel read host memory at 45-51 GB/s with 4,096 blocks from 4 KiB
/// up, and 64 KiB lists ran 0.78 / 0.64 of it here (256 / 4,096 blocks; the raw batch 30.0 /
/// 38.9 GB/s against the kernel's 48.7 / 51.0), level from 512 KiB, and the fifth run's host
/// as well (0.62 / 0.60). The crossing depends on the host, which one constant cannot follow:
/// from here up to [`AUTO_LARGE_SEGMENT`] the gatherer measures both ([`Band::FromHost`]).
pub(crate) const AUTO_LARGE_SEGMENT_FROM_HOST: u64 = 64 << 10;

/// The smallest average segment of a short host -> device list that [`Band::FromHostFew`]
/// measures: below it the kernel led the batched copy on every host measured (16 x 4 / 8 KiB:
/// 1.74x / 2.02x in the eleventh H100 run, `cuda-blocks-h2d`).
pub(crate) const AUTO_FEW_FROM_HOST_MIN: u64 = 32 << 10;

/// A band of segment lists where the gather kernel and the batched copy cross at a point that
/// depends on the host, so that [`Strategy::Auto`], the SMs free, times both there
/// ([`BAND_SAMPLES`] calls each, CUDA events around the copy) and keeps the faster for the
/// gatherer's life ([`band_choice`]); the batched copy until then, or where the kernel or the
/// batch cannot run. Each band is measured on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Band {
    /// Host -> device lists averaging from [`AUTO_LARGE_SEGMENT_FROM_HOST`] up to
    /// [`AUTO_LARGE_SEGMENT`]: the kernel reads host memory at 33 GB/s on one H100 host and at
    /// 45-51 on two others (the batch 1.2x the kernel at 64 KiB on the first, the kernel 1.6x
    /// the batch on the others; `bench/results/h100.md`, third to fifth runs).
    FromHost,
    /// Host -> device lists of fewer than [`DEVICE_KERNEL_MIN_SEGMENTS`] segments averaging
    /// from [`AUTO_FEW_FROM_HOST_MIN`] up to [`AUTO_LARGE_SEGMENT_FROM_HOST`]: below the
    /// host band, where longer lists stay on the kernel, too few segments to fill the SMs.
    /// `cuda-blocks-h2d`, 16 x 32 KiB, the raw batched copy against the bare kernel: the third
    /// H100 run 21.6 against 17.5 GB/s, the eleventh 21.95 against 19.73 (the route, on the
    /// kernel, 0.89 of the batch), the tenth's first lease 0.78, its second 0.99-1.00.
    FromHostFew,
    /// Device -> host lists of fewer than [`DEVICE_KERNEL_MIN_SEGMENTS`] segments averaging
    /// under [`AUTO_LARGE_SEGMENT_TO_HOST_FEW`] (32 KiB; the kernel's side of [`large_segment`]):
    /// too few segments to fill the SMs, and the two cross by host (16 blocks of 4 / 8 KiB: the
    /// batch 1.06-1.15x ahead on two H100 hosts, the kernel 1.16-1.19x on another; the
    /// constant's figures). From 32 KiB the batched copy led on every host but one, so the band
    /// stops there.
    ToHostFew,
}

impl Band {
    /// Its index among a gatherer's band measurements.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// How many bands there are ([`Band`]).
pub(crate) const BANDS: usize = 3;

/// The sizes at which a band keeps a choice of its own ([`band_slot`]): one per power of two
/// of the list's average segment, up to [`AUTO_LARGE_SEGMENT`]. One choice for a whole band
/// was taken at the band's first size and kept at the others: the twelfth H100 run's
/// `kv_blocks.py` h2d rows (`bench/results/h100.md`), 256 x 512 KiB measured first, then
/// 256 x 64 KiB ran 27.4 GB/s on the kernel chosen at 512 KiB against the batched copy's 44.6
/// (0.61), and 41.3 (0.93) where 64 KiB came first.
pub(crate) const BAND_SIZES: usize = 21;

/// A gatherer's band measurements: [`BANDS`] x [`BAND_SIZES`].
pub(crate) const BAND_SLOTS: usize = BANDS * BAND_SIZES;

/// Which of a gatherer's band measurements a list of `n` segments of `total` bytes in `band`
/// takes: its band's, at the power of two at or below its average segment.
pub(crate) fn band_slot(band: Band, n: usize, total: u64) -> usize {
    let avg = (total / n.max(1) as u64).max(1);
    let size = avg.ilog2() as usize;
    band.index() * BAND_SIZES + size.min(BAND_SIZES - 1)
}

/// The band (see [`Band`]) of `n` segments of `total` bytes between these `sides`, if any: a
/// list of more than [`AUTO_FEW_SEGMENTS`] segments (fewer go one call each anyway).
pub(crate) fn band(sides: Sides, n: usize, total: u64) -> Option<Band> {
    if n <= AUTO_FEW_SEGMENTS {
        return None;
    }
    let avg = total / n as u64;
    match sides {
        Sides::HostToDevice
            if (AUTO_LARGE_SEGMENT_FROM_HOST..AUTO_LARGE_SEGMENT).contains(&avg) =>
        {
            Some(Band::FromHost)
        }
        Sides::HostToDevice
            if n < DEVICE_KERNEL_MIN_SEGMENTS
                && (AUTO_FEW_FROM_HOST_MIN..AUTO_LARGE_SEGMENT_FROM_HOST).contains(&avg) =>
        {
            Some(Band::FromHostFew)
        }
        Sides::DeviceToHost
            if n < DEVICE_KERNEL_MIN_SEGMENTS && avg < AUTO_LARGE_SEGMENT_TO_HOST_FEW =>
        {
            Some(Band::ToHostFew)
        }
        _ => None,
    }
}

/// Calls of each mechanism timed in a [`Band`] before [`band_choice`] decides.
pub const BAND_SAMPLES: usize = 3;

/// How much faster than the batched copy the kernel's timed calls must be for a [`Band`] to
/// keep the kernel: the copy engines leave the SMs to the caller's kernels, and close timings
/// do not tell the two apart. The eighth H100 run (`cuda-blocks-h2d`, 4,096 x 64 KiB): the
/// default engine's band kept the kernel and ran 32.2 GB/s, the Spin engine's in the same row
/// kept the batched copy and ran 40.4 (the raw batch 40.6): the timings (CUDA events around
/// each call, the host's submission inside them where the stream was idle) had ranked the two
/// differently on two engines, where the host clock put the batch 1.25x ahead. The hosts where
/// the kernel won (third to fifth runs) had it 1.6x ahead.
pub const BAND_KERNEL_MARGIN: f64 = 1.1;

/// A [`Band`]'s mechanism from the rates measured there (bytes per second, any order): `None`
/// until each has [`BAND_SAMPLES`]; then the kernel where its median rate is at least
/// [`BAND_KERNEL_MARGIN`] times the batched copy's, else the batched copy.
pub(crate) fn band_choice(kernel: &[f64], batch: &[f64]) -> Option<Strategy> {
    if kernel.len() < BAND_SAMPLES || batch.len() < BAND_SAMPLES {
        return None;
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Some(if median(kernel) >= BAND_KERNEL_MARGIN * median(batch) {
        Strategy::Kernel
    } else {
        Strategy::Batch
    })
}

/// Which mechanism a [`Band`] times next: the one with fewer samples (measured or on their
/// way), the kernel first.
pub(crate) fn band_next(kernel: usize, batch: usize) -> Strategy {
    if kernel <= batch {
        Strategy::Kernel
    } else {
        Strategy::Batch
    }
}

/// [`large_segment`]: device lists of this many segments or more stay on the kernel at any
/// segment size. On the H100 host 256 x 2 MiB ran 1,341 GB/s through the kernel against the
/// batch copy's 456, and 256 x 512 KiB 1,201 against 166; 16 x 2 MiB ran 451 through the
/// batch copy against the kernel's 349 (too few blocks to fill the SMs).
pub(crate) const DEVICE_KERNEL_MIN_SEGMENTS: usize = 64;

/// [`large_segment`] of a device -> host list of fewer than [`DEVICE_KERNEL_MIN_SEGMENTS`]
/// segments: from 32 KiB such lists go to the copy engines without measuring; below it
/// [`Band::ToHostFew`] times both. On the H100 hosts the batched copy ran level with the kernel
/// or ahead from 32 KiB to 512 KiB (`bench/results/h100.md`, `cuda-blocks-d2h`, 16 blocks of 32
/// / 64 KiB: the tenth run 23.2 / 32.1 GB/s against the kernel's 20.6 / 29.4; the sixteenth's
/// three processes on two hosts 22.3-23.6 / 31.7-32.3 against 21.5-22.4 / 30.7-31.5; from 512
/// KiB the batch 1.02-1.06x, third to eighth runs), ahead of it by a tenth on one host only
/// (the seventh run). Measured there ([`Band::ToHostFew`] up to 512 KiB before), the route ran
/// 0.88-0.92 of the batch in one process of several (fourteenth to sixteenth runs, 16 x 32 or
/// 64 KiB), at the bare kernel's rate while the series that never takes the kernel
/// (`compute_busy`) matched the batch: the band's few timed calls had kept the kernel. A gain
/// of a tenth on one host does not pay for the SMs (issue 34): the copy engines take these
/// lists. Below 32 KiB the hosts differ by more: at 4 / 8 KiB the batch led 1.06-1.15x on the
/// tenth run's host and the sixteenth's first, the kernel 1.16-1.19x on its second.
pub(crate) const AUTO_LARGE_SEGMENT_TO_HOST_FEW: u64 = 32 << 10;

/// Where a segment list's two sides live, as the gatherer's choice weighs them: host memory
/// (pinned, registered or mapped: reached over the link) or a GPU's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sides {
    /// Host memory into a device's.
    HostToDevice,
    /// A device's memory into host memory.
    DeviceToHost,
    /// Device memory on both sides (one device, or peers).
    DeviceToDevice,
    /// Host memory on both sides (the kernel and the copy engines both cross the link twice).
    HostToHost,
}

impl Sides {
    /// The sides of a copy from memory of kind `src` to memory of kind `dst` (managed memory
    /// counts as the device's).
    pub(crate) fn of(dst: MemKind, src: MemKind) -> Sides {
        let host = |k: MemKind| matches!(k, MemKind::Pageable | MemKind::Pinned | MemKind::Mapped);
        match (host(dst), host(src)) {
            (false, true) => Sides::HostToDevice,
            (true, false) => Sides::DeviceToHost,
            (false, false) => Sides::DeviceToDevice,
            (true, true) => Sides::HostToHost,
        }
    }
}

/// The average segment size from which [`Strategy::Auto`] moves a list of `n` segments with
/// these `sides` on the copy engines rather than the kernel: [`AUTO_LARGE_SEGMENT`], or
/// [`AUTO_LARGE_SEGMENT_FROM_HOST`] from host memory into a device, or
/// [`AUTO_LARGE_SEGMENT_TO_HOST_FEW`] for short lists from a device into host memory, or never
/// (`u64::MAX`) for device lists of [`DEVICE_KERNEL_MIN_SEGMENTS`] or more.
pub(crate) fn large_segment(sides: Sides, n: usize) -> u64 {
    match sides {
        Sides::HostToDevice => AUTO_LARGE_SEGMENT_FROM_HOST,
        Sides::DeviceToHost if n < DEVICE_KERNEL_MIN_SEGMENTS => AUTO_LARGE_SEGMENT_TO_HOST_FEW,
        Sides::DeviceToDevice if n >= DEVICE_KERNEL_MIN_SEGMENTS => u64::MAX,
        Sides::DeviceToDevice | Sides::DeviceToHost | Sides::HostToHost => AUTO_LARGE_SEGMENT,
    }
}

/// A plan the SM transpose kernel ([`super::paths::transpose`]) moves: two of its dims swap grain
/// between the sides. `r` is the dim the source walks fastest (its smallest stride) and `c` the
/// dim the destination walks fastest, `r != c`; every other dim is a batch (`[B, R, C] -> [B,
/// C, R]`, or any 2-axis swap with dims between the two). Elements (the plan's runs) of 1, 2, 4,
/// 8 or 16 bytes; each count and the batch fit in 31 bits (the kernel's index math). Plans of
/// one row or one column are not transposes: the planner merges them into one contiguous run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transpose {
    /// Element (run) bytes.
    pub elem: usize,
    /// Plan dim of the source's grain.
    pub r: usize,
    /// Plan dim of the destination's grain.
    pub c: usize,
    /// Product of the other dims' counts (1 for a plain 2-D transpose).
    pub batch: usize,
}

/// The transpose `plan` is, if it is one (see [`Transpose`]).
pub(crate) fn transpose_of(plan: &Plan) -> Option<Transpose> {
    let (counts, ds, ss) = (plan.counts(), plan.dst_strides(), plan.src_strides());
    if counts.len() < 2 || !matches!(plan.run(), 1 | 2 | 4 | 8 | 16) {
        return None;
    }
    let min_by = |st: &[usize]| (0..st.len()).min_by_key(|&i| (st[i], std::cmp::Reverse(i)));
    let (r, c) = (min_by(ss)?, min_by(ds)?);
    let fits = |n: usize| n <= i32::MAX as usize;
    let batch: usize = (0..counts.len())
        .filter(|&i| i != r && i != c)
        .map(|i| counts[i])
        .product();
    (r != c && fits(counts[r]) && fits(counts[c]) && fits(batch)).then_some(Transpose {
        elem: plan.run(),
        r,
        c,
        batch,
    })
}

/// How the transpose kernel moves transpose `t` of `plan` between the device addresses `dst`
/// and `src` (the plan's offsets added): how many elements each of its loads and stores moves,
/// or `None` where it must not take the plan.
///
/// An access of `w` bytes needs its address aligned to `w` (else the kernel dies with
/// `CUDA_ERROR_MISALIGNED_ADDRESS`, which ends the context: H200 run 31, a bf16 transpose into
/// a buffer at an odd offset, and 4-byte elements at offset 3). Every address the kernel forms
/// is a base plus a sum of strides (of dims of more than one element), so:
/// - `Some(4 / elem)` (one 4-byte word per access) for 1- and 2-byte elements where the source
///   is dense along `r`, the destination along `c`, and both bases and every other stride are
///   multiples of 4;
/// - `Some(1)` (one element per access) where both bases and every stride are multiples of
///   the element size;
/// - `None` otherwise (a buffer at an offset that is not a multiple of the element, a pitch or
///   stride that is not): the general SM kernels take the plan, in words of the alignment that
///   every address shares (single bytes at worst).
pub(crate) fn transpose_access(t: &Transpose, plan: &Plan, dst: u64, src: u64) -> Option<usize> {
    let (counts, ds, ss) = (plan.counts(), plan.dst_strides(), plan.src_strides());
    // Whether `base` and the strides of every dim of more than one element but `skip` are
    // multiples of `w`.
    let aligned = |w: usize, base: u64, st: &[usize], skip: usize| {
        base % w as u64 == 0 && (0..st.len()).all(|i| i == skip || counts[i] < 2 || st[i] % w == 0)
    };
    let none = usize::MAX;
    if !(aligned(t.elem, dst, ds, none) && aligned(t.elem, src, ss, none)) {
        return None;
    }
    let words = t.elem < 4
        && ss[t.r] == t.elem
        && ds[t.c] == t.elem
        && aligned(4, dst, ds, t.c)
        && aligned(4, src, ss, t.r);
    Some(if words { 4 / t.elem } else { 1 })
}

/// The lane (stream of the pool, per direction) of the thread numbered `thread` (threads are
/// numbered in the order they first submit) on an engine of `lanes` lanes: round-robin over
/// the threads, fixed for a thread's life, so that its requests in one direction keep their
/// order and threads that start together get different streams.
pub(crate) fn lane(thread: usize, lanes: usize) -> usize {
    thread % lanes.max(1)
}

impl KernelCopies {
    /// Whether a copy of `plan` between device-accessible buffers goes to the SMs.
    pub fn takes(self, plan: &Plan) -> bool {
        match self {
            KernelCopies::Never => false,
            KernelCopies::Always => true,
            KernelCopies::Auto => {
                let run = plan.run();
                !plan.counts().is_empty()
                    && ((run <= AUTO_MAX_RUN && plan.run_count() >= AUTO_MIN_RUNS)
                        || (run <= AUTO_MAX_RUN_CALLS && driver_calls(plan) >= AUTO_MIN_CALLS))
            }
        }
    }
}

/// One way of running a request's program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// Through the pinned staging ring, on the direction's staging thread.
    Staged(StagedDirection),
    /// Each copy step as one SM kernel.
    Sm,
    /// The whole program as one segment list through the gatherer.
    Gather,
    /// One contiguous device copy: `sm_bytes` at its end by an SM kernel, the rest by a copy
    /// engine, at once.
    Split {
        /// Bytes the kernel copies (the last ones of the run).
        sm_bytes: usize,
    },
    /// The steps as driver calls, one after the other.
    Driver,
}

/// The decision for one request: which stream it runs on, and the paths to try in order (the
/// first that can be made here runs; [`Path::Driver`] closes every list but a staged one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    /// The engine stream (and so the copy engine) the request's work and event go on.
    pub stream: Direction,
    paths: [Option<Path>; 4],
}

impl Route {
    fn new(stream: Direction) -> Route {
        Route {
            stream,
            paths: [None; 4],
        }
    }
    fn then(mut self, p: Path) -> Route {
        if let Some(slot) = self.paths.iter_mut().find(|s| s.is_none()) {
            *slot = Some(p);
        }
        self
    }
    /// The paths in the order to try them.
    pub fn paths(&self) -> impl Iterator<Item = Path> + '_ {
        self.paths.iter().map_while(|p| *p)
    }
    /// The first path (the one that runs where every kernel can be made).
    pub fn first(&self) -> Path {
        self.paths[0].unwrap_or(Path::Driver)
    }
}

/// Whether a copy touches only memory this GPU's kernels can address: not pageable host memory,
/// no other GPU's memory, managed memory only where `managed_kernels` (the device's
/// `CONCURRENT_MANAGED_ACCESS`, asked once by the engine: without it a running kernel makes all
/// managed memory inaccessible to the host until the device synchronizes, so a copy kernel on
/// managed memory would fault the caller's host threads; the copy engines do not).
fn kernel_reachable(me: u32, managed_kernels: bool, k: MemKind) -> bool {
    match k {
        MemKind::Pageable => false,
        MemKind::Device { ordinal } => ordinal == me,
        MemKind::Managed => managed_kernels,
        MemKind::Pinned | MemKind::Mapped => true,
    }
}

/// Whether an engine on GPU `me` (which can access the devices `can_access[j]` directly) takes
/// jobs between memory of these kinds. Every pair that involves memory a GPU can address:
/// device memory of this GPU or of a peer it can access, pinned, mapped, managed, and pageable
/// host memory on one side of a copy; copies between device memory of any two GPUs of the
/// machine (`cuMemcpyPeerAsync`, which the driver stages where the two have no direct access).
/// Not: pageable to pageable, fills of pageable memory, fills of a GPU this one cannot access.
pub(crate) fn supports(me: u32, can_access: &[bool], dst: MemKind, src: Option<MemKind>) -> bool {
    let count = can_access.len() as u32;
    let reaches = |o: u32| o == me || can_access.get(o as usize).copied().unwrap_or(false);
    let dev_ok = |k: MemKind| match k {
        MemKind::Device { ordinal } => reaches(ordinal),
        _ => true,
    };
    let peer_copy = matches!(
        (dst, src),
        (MemKind::Device { ordinal: a }, Some(MemKind::Device { ordinal: b }))
            if a < count && b < count && (a == me || b == me)
    );
    if !peer_copy && (!dev_ok(dst) || !src.is_none_or(dev_ok)) {
        return false;
    }
    match src {
        None => dst != MemKind::Pageable,
        Some(s) => !(dst == MemKind::Pageable && s == MemKind::Pageable),
    }
}

/// The stream a copy between these kinds runs on: the configured one, else inferred (host ->
/// device, device -> host, device -> device; fills by their destination).
pub(crate) fn direction(cfg: &CudaConfig, dst: MemKind, src: Option<MemKind>) -> Direction {
    if let Some(d) = cfg.direction {
        return d;
    }
    let on_dev = |k: MemKind| matches!(k, MemKind::Device { .. } | MemKind::Managed);
    match (on_dev(dst), src.map(on_dev)) {
        (true, None | Some(true)) => Direction::DeviceToDevice,
        (true, Some(false)) | (false, Some(false)) => Direction::HostToDevice,
        (false, Some(true) | None) => Direction::DeviceToHost,
    }
}

/// Whether the engine should ask the driver if `Pageable` buffers are in fact page-locked
/// (a `PinnedBuffer` seen through a slice, memory registered elsewhere) before routing: only
/// where the answer can change the path (staging, the gather and SM paths, copies between two
/// host buffers). A small contiguous copy between host and device takes the same driver call
/// either way (the driver copies page-locked memory without staging) and skips the query:
/// about a microsecond, 10% of a 256 KiB pageable copy on the H200 host (run 25).
pub(crate) fn asks_page_lock(dst: MemKind, src: Option<MemKind>, steps: &[Step]) -> bool {
    match (steps, src) {
        ([Step::Copy(p)], Some(src)) if p.kind() == PlanKind::Contiguous => {
            asks_page_lock_run(dst, src, p.total_bytes())
        }
        _ => true,
    }
}

/// [`asks_page_lock`] of one contiguous run of `bytes`.
pub(crate) fn asks_page_lock_run(dst: MemKind, src: MemKind, bytes: usize) -> bool {
    bytes >= STAGE_MIN_H2D.min(STAGE_MIN_D2H) || dst.host_accessible() == src.host_accessible()
}

/// What a route is decided against: the engine's settings and what its device lets a kernel
/// touch. Made per decision from the engine's fields (a reference and a flag).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules<'a> {
    /// The engine's settings.
    pub(crate) cfg: &'a CudaConfig,
    /// The device's kernels may touch managed memory (its `CONCURRENT_MANAGED_ACCESS`, asked
    /// once by the engine; see [`kernel_reachable`]).
    pub(crate) managed_kernels: bool,
}

impl Rules<'_> {
    /// Whether this GPU's kernels reach both sides ([`kernel_reachable`]).
    fn kernels_reach(&self, dst: MemKind, src: MemKind) -> bool {
        let me = self.cfg.ordinal;
        kernel_reachable(me, self.managed_kernels, dst)
            && kernel_reachable(me, self.managed_kernels, src)
    }

    /// The route of a request between memory of kinds `dst` and `src` (already refined by the
    /// page-lock query where [`asks_page_lock`] said so, and checked by [`supports`]) whose
    /// program is `steps`.
    pub(crate) fn route(&self, dst: MemKind, src: Option<MemKind>, steps: &[Step]) -> Route {
        let general = || self.walk(dst, src, steps);
        match (steps, src) {
            ([Step::Copy(p)], Some(s)) if p.kind() == PlanKind::Contiguous => {
                self.one_run(dst, s, p.run()).unwrap_or_else(general)
            }
            _ => general(),
        }
    }

    /// [`Rules::route`] of one contiguous copy of `bytes` (nearly every request), decided without
    /// [`Rules::walk`]'s passes over the plan (the host work per small request is issue 14's figure): one
    /// run is one driver call, so [`KernelCopies::Auto`] leaves it to the copy engines (below
    /// [`AUTO_MIN_RUNS`] and [`AUTO_MIN_CALLS`]) and the gatherer never takes it (below
    /// [`GATHER_MIN_CALLS`]); only [`KernelCopies::Always`] sends it to the SMs, where both sides
    /// are reachable. `None` (ask [`Rules::walk`]): a split is configured, or pageable memory is on a side
    /// and the copy is large enough to be staged. The tests check that both agree on every copy.
    pub(crate) fn one_run(&self, dst: MemKind, src: MemKind, bytes: usize) -> Option<Route> {
        let cfg = self.cfg;
        let pageable = dst == MemKind::Pageable || src == MemKind::Pageable;
        let may_stage = cfg.staging.is_some() && bytes >= STAGE_MIN_H2D.min(STAGE_MIN_D2H);
        if cfg.d2d_sm_share.is_some() || (pageable && may_stage) {
            return None;
        }
        let r = Route::new(direction(cfg, dst, Some(src)));
        let sm = cfg.kernel_copies == KernelCopies::Always && self.kernels_reach(dst, src);
        Some(if sm { r.then(Path::Sm) } else { r }.then(Path::Driver))
    }

    /// [`Rules::route`] of one segment list of `n` segments, `bytes` in all: staged, else the gatherer
    /// where the GPU reaches both sides, then driver calls. Also a block copy's route before its
    /// list is built (the list it would be has `n` segments).
    pub(crate) fn list_route(&self, dst: MemKind, src: MemKind, n: usize, bytes: usize) -> Route {
        if let Some(r) = staged(self.cfg, dst, src, bytes, Some(n)) {
            return r;
        }
        let r = Route::new(direction(self.cfg, dst, Some(src)));
        // A segment list as given goes to the gatherer at any length (it picks one call each for
        // a few segments).
        let r = if self.kernels_reach(dst, src) {
            r.then(Path::Gather)
        } else {
            r
        };
        r.then(Path::Driver)
    }

    /// [`Rules::route`] by the general rules, for any program.
    fn walk(&self, dst: MemKind, src: Option<MemKind>, steps: &[Step]) -> Route {
        let cfg = self.cfg;
        let me = cfg.ordinal;
        let own = MemKind::Device { ordinal: me };
        let Some(src) = src else {
            // Fills: memsets or pattern copies, as driver calls.
            return Route::new(direction(cfg, dst, None)).then(Path::Driver);
        };
        if let [Step::Segments { range, bytes, .. }] = steps {
            return self.list_route(dst, src, range.len(), *bytes);
        }
        // Staged: pageable <-> this GPU, every step a copy, large enough.
        if steps.iter().all(|s| matches!(s, Step::Copy(_))) {
            let bytes = steps.iter().map(Step::bytes).sum();
            if let Some(r) = staged(cfg, dst, src, bytes, None) {
                return r;
            }
        }
        let mut r = Route::new(direction(cfg, dst, Some(src)));
        let reachable = self.kernels_reach(dst, src);
        let mode = match cfg.kernel_copies {
            KernelCopies::Auto if cfg.compute_busy => KernelCopies::Never,
            k => k,
        };
        let sm = reachable
            && mode != KernelCopies::Never
            && !steps.is_empty()
            && steps.iter().all(|s| match s {
                Step::Copy(p) => mode.takes(p),
                _ => false,
            });
        if sm {
            r = r.then(Path::Sm);
        }
        // Other programs go to the gatherer from GATHER_MIN_CALLS driver calls on.
        if reachable && gather_calls(steps).is_some_and(|n| n >= GATHER_MIN_CALLS) {
            r = r.then(Path::Gather);
        }
        if let (Some(pct), [Step::Copy(plan)]) = (cfg.d2d_sm_share, steps) {
            let n = plan.total_bytes();
            if dst == own
                && src == own
                && plan.kind() == PlanKind::Contiguous
                && n >= SPLIT_MIN_BYTES
            {
                let sm_target = (n as u128 * pct as u128 / 100) as usize;
                let ce = (n - sm_target).next_multiple_of(SPLIT_ALIGN).min(n);
                r = r.then(Path::Split { sm_bytes: n - ce });
            }
        }
        r.then(Path::Driver)
    }
}

/// The staged route of `bytes` between `dst` and `src` (a program of copies, or one segment
/// list of `list` segments), where pageable memory on one side and this GPU's on the other make
/// the request large enough for the pinned ring.
fn staged(
    cfg: &CudaConfig,
    dst: MemKind,
    src: MemKind,
    bytes: usize,
    list: Option<usize>,
) -> Option<Route> {
    let own = MemKind::Device {
        ordinal: cfg.ordinal,
    };
    let dir = match (dst, src) {
        _ if cfg.staging.is_none() => return None,
        (d, MemKind::Pageable) if d == own => StagedDirection::HostToDevice,
        (MemKind::Pageable, s) if s == own => StagedDirection::DeviceToHost,
        _ => return None,
    };
    let (min, stream) = match dir {
        StagedDirection::HostToDevice => (STAGE_MIN_H2D, Direction::HostToDevice),
        StagedDirection::DeviceToHost => (STAGE_MIN_D2H, Direction::DeviceToHost),
    };
    (bytes >= min || list.is_some_and(|n| n >= STAGE_MIN_SEGMENTS))
        .then(|| Route::new(stream).then(Path::Staged(dir)))
}

/// Whether a staged segment list's chunk whose device side is `runs` runs of `bytes` in all goes
/// through device scratch and the gatherer (true) or one DMA per run (false); see
/// [`STAGED_DIRECT_MAX_RUNS`].
pub(crate) fn staged_scatters(runs: usize, bytes: u64) -> bool {
    runs > STAGED_DIRECT_MAX_RUNS && bytes / (runs as u64) < AUTO_LARGE_SEGMENT
}

/// Driver calls `exec::copy_plan` would make for a plan between host and device (3-D copies
/// counted as one): what the gatherer saves.
fn plan_calls(p: &Plan) -> usize {
    match p.kind() {
        PlanKind::Contiguous | PlanKind::Pitched2D | PlanKind::Pitched3D => 1,
        PlanKind::Segments => p.counts()[..p.counts().len() - 2].iter().product(),
    }
}

/// Driver calls the program would take one step at a time, where it is all copies (a fill
/// cannot be gathered).
pub(crate) fn gather_calls(steps: &[Step]) -> Option<usize> {
    let mut n = 0usize;
    for s in steps {
        n += match s {
            Step::Copy(p) => plan_calls(p),
            Step::Segments { range, .. } => range.len(),
            Step::Fill { .. } => return None,
        };
    }
    Some(n)
}

/// The strategy an engine configured by `cfg` asks its gatherer for (segment lists, block
/// copies): [`Strategy::Auto`], or [`Strategy::Dma`] where the SMs are left to the caller's
/// kernels ([`CudaConfig::compute_busy`], [`KernelCopies::Never`]).
pub(crate) fn gather_mode(cfg: &CudaConfig) -> Strategy {
    if cfg.compute_busy || cfg.kernel_copies == KernelCopies::Never {
        Strategy::Dma
    } else {
        Strategy::Auto
    }
}

/// The driver's batched copy takes at most this many copies per call; a longer list is
/// several batches, each of which falls back to one call per copy on its own if the driver
/// refuses it (`CUDA_ERROR_INVALID_VALUE` for some shapes, reported by vLLM's users). Not yet
/// measured: the largest count of the `cuda-blocks` bench (4,096 blocks) is one batch.
pub const BATCH_MAX_COPIES: usize = 4096;

/// Whether ferry's batched copies (the gatherer's, and the copies held by `enqueue` until a
/// flush) carry `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE` (the driver asked to keep them on
/// the copy engines): the batched copy is the route that leaves the SMs free, so yes. On the
/// H100 host (`bench/results/h100.md`, second run, `cuda-blocks-*`) the same single batched
/// call with the flag (the raw baseline, and ferry's `compute_busy` route) ran 1.3-4.9x the
/// held batch without it for blocks of 4-64 KiB, in every direction (h2d 4,096 x 64 KiB 40.6
/// against 19.4 GB/s; d2h 256 x 4 KiB 8.43 against 1.81), and 1.0-1.28x at 2 MiB; against the
/// null driver the two made the same calls (one batch, one stamp, nothing per wait), the flag
/// aside. The held batches took it from then on; with it (third run) they still ran 0.20-0.81x
/// the raw batch: the flag was not the difference (the bench's held series waited each of its
/// requests with a stream sync of its own under `WaitMode::Spin`: `h100.md`, third run).
pub const BATCH_PREFER_OVERLAP: bool = true;

/// What the gatherer's [`Strategy::Auto`] (`sms_free`) or [`Strategy::Dma`] (not `sms_free`)
/// does with `n` segments of `total` bytes. The facts it needs are asked only when the answer
/// matters (each costs driver calls, the kernel a compile the first time): `reachable`, both
/// buffers are device-accessible; `batch`, the driver has `cuMemcpyBatchAsync` and the stream
/// is not the legacy one; `kernel`, the gather kernel can be made.
///
/// With the SMs free, the kernel takes segments averaging under [`large_segment`] of the
/// list's `sides` (47 GB/s at 4 KiB against the batched copy's 2.0-2.9 on the H200: the gain
/// is large); with the SMs busy, nothing goes to them: the batched copy (one call for the
/// whole list, unordered within it) where it can run, else one call per segment.
pub(crate) fn gather_strategy(
    n: usize,
    total: u64,
    sms_free: bool,
    reachable: impl FnOnce() -> bool,
    batch: impl FnOnce() -> bool,
    kernel: impl FnOnce() -> bool,
    sides: impl FnOnce() -> Sides,
) -> Strategy {
    if n <= AUTO_FEW_SEGMENTS {
        return Strategy::PerSegment;
    }
    let reachable = reachable();
    let batch = reachable && batch();
    if !sms_free || total / n as u64 >= large_segment(sides(), n) {
        return if batch {
            Strategy::Batch
        } else {
            Strategy::PerSegment
        };
    }
    if reachable && kernel() {
        Strategy::Kernel
    } else if batch {
        Strategy::Batch
    } else {
        Strategy::PerSegment
    }
}

#[cfg(test)]
mod tests;

/// How many copy calls [`copy_plan`](super::paths::calls::copy_plan) makes for `plan` between two buffers of one device (where
/// the driver takes every 2-D and 3-D shape offered): what the copy engines cost next to one
/// kernel launch ([`KernelCopies::Auto`] weighs it).
pub(crate) fn driver_calls(plan: &Plan) -> usize {
    let (w, c, ds, ss) = (
        plan.run(),
        plan.counts(),
        plan.dst_strides(),
        plan.src_strides(),
    );
    let calls2d = |h: usize, dp: usize, sp: usize| if one_2d_call(w, h, dp, sp) { 1 } else { h };
    let calls3d = |c: [usize; 2], ds: [usize; 2], ss: [usize; 2]| {
        if one_3d_call(w, c, ds, ss) {
            1
        } else {
            c[0] * calls2d(c[1], ds[1], ss[1])
        }
    };
    match plan.kind() {
        PlanKind::Contiguous => 1,
        PlanKind::Pitched2D => calls2d(c[0], ds[0], ss[0]),
        PlanKind::Pitched3D => calls3d([c[0], c[1]], [ds[0], ds[1]], [ss[0], ss[1]]),
        PlanKind::Segments => {
            let n = c.len();
            let outer: usize = c[..n - 2].iter().product();
            outer
                * calls3d(
                    [c[n - 2], c[n - 1]],
                    [ds[n - 2], ds[n - 1]],
                    [ss[n - 2], ss[n - 1]],
                )
        }
    }
}

/// Whether `h` rows of `w` bytes at pitches `dp`, `sp` are one `cuMemcpy2DAsync`.
pub(crate) fn one_2d_call(w: usize, h: usize, dp: usize, sp: usize) -> bool {
    h > 1 && dp >= w && sp >= w
}

/// Whether `c[0]` planes of `c[1]` rows of `w` bytes are one `cuMemcpy3DAsync`: each plane
/// stride a whole number of row pitches (pitches at least the row, planes at least `c[1]`
/// rows).
pub(crate) fn one_3d_call(w: usize, c: [usize; 2], ds: [usize; 2], ss: [usize; 2]) -> bool {
    let fits =
        |st: [usize; 2]| st[1] >= w && st[1] > 0 && st[0] % st[1] == 0 && st[0] / st[1] >= c[1];
    c[0] > 1 && fits(ds) && fits(ss)
}

/// How a [`Gatherer`](super::paths::gather::Gatherer) moves the segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// The NVRTC gather kernel on the SMs. Both buffers must be device-accessible (device
    /// memory, or pinned/registered host memory).
    Kernel,
    /// The driver's batched copy, `cuMemcpyBatchAsync` (CUDA 12.8+; not on the legacy default
    /// stream).
    Batch,
    /// One `cuMemcpyAsync` per segment (copy engines; works for any memory, pageable included).
    PerSegment,
    /// The copy engines only, leaving the SMs to the caller's kernels: the batched copy where
    /// both sides are device-accessible and the driver has it, else one call per segment
    /// (what [`CudaConfig::compute_busy`](super::CudaConfig::compute_busy) makes the engine ask
    /// for).
    Dma,
    /// Pick by measurement (H200, PCIe 5.0; `bench/results/h200.md`, "The staging pipeline,
    /// gather strategies and wait modes"): one driver call
    /// each for at most [`AUTO_FEW_SEGMENTS`] segments; the batch copy where segments average at
    /// least [`AUTO_LARGE_SEGMENT`] bytes (52 GB/s at 1 MiB against the kernel's 50, and the SMs
    /// stay free); else the kernel (47 GB/s at 4 KiB); all three only where both sides are
    /// device-accessible, pageable memory getting one call per segment. Host -> device lists
    /// averaging 64 KiB to 1 MiB, host -> device lists of fewer than 64 segments averaging 32-64
    /// KiB, and device -> host lists of fewer than 64 segments averaging under 32 KiB (the
    /// bands, `route.rs`): the kernel and the batch are timed on the gatherer's first such
    /// calls and the faster kept, each band on its own; device -> host lists of fewer than 64
    /// segments from 32 KiB take the batch.
    Auto,
}

/// Which way a staged copy goes (public as `cuda::staged::Direction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StagedDirection {
    /// Pageable host memory (`src`) to device memory (`dst`).
    HostToDevice,
    /// Device memory (`src`) to pageable host memory (`dst`).
    DeviceToHost,
}
