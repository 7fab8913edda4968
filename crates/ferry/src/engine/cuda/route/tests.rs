//! The routing table, on the CPU. Thresholds are written here as numbers, not as the constants:
//! a changed threshold fails the test that names it, and the diff of the test says what moved.

use super::*;
use crate::engine::cuda::config::default_streams;
use crate::layout::Layout;
use crate::op::Segment;
use std::sync::Arc;

const ME: u32 = 0;
const OWN: MemKind = MemKind::Device { ordinal: ME };
const PEER: MemKind = MemKind::Device { ordinal: 1 };
const PAGEABLE: MemKind = MemKind::Pageable;
const PINNED: MemKind = MemKind::Pinned;
const MAPPED: MemKind = MemKind::Mapped;
const MANAGED: MemKind = MemKind::Managed;
const HOST_KINDS: [MemKind; 4] = [PAGEABLE, PINNED, MAPPED, MANAGED];

/// The route under `cfg` on a device whose kernels may touch managed memory (as an H100 or
/// H200: [`Rules::route`]); [`rules`] for one whose kernels may not.
fn route(cfg: &CudaConfig, dst: MemKind, src: Option<MemKind>, steps: &[Step]) -> Route {
    rules(cfg, true).route(dst, src, steps)
}

/// [`Rules::one_run`] as [`route`].
fn one_run(cfg: &CudaConfig, dst: MemKind, src: MemKind, n: usize) -> Option<Route> {
    rules(cfg, true).one_run(dst, src, n)
}

/// [`Rules::walk`] as [`route`].
fn walk(cfg: &CudaConfig, dst: MemKind, src: Option<MemKind>, steps: &[Step]) -> Route {
    rules(cfg, true).walk(dst, src, steps)
}

fn rules(cfg: &CudaConfig, managed_kernels: bool) -> Rules<'_> {
    Rules {
        cfg,
        managed_kernels,
    }
}

fn cfg() -> CudaConfig {
    CudaConfig::new(ME)
}

fn contiguous(bytes: usize) -> Vec<Step> {
    vec![Step::Copy(Plan::contiguous(0, 0, bytes))]
}

/// A copy of `rows` rows of `row` bytes out of a pitch twice as wide (one 2-D call).
fn tile(rows: usize, row: usize) -> Vec<Step> {
    let src = Layout::pitched(&[rows, row], 1, 2 * row).unwrap();
    let dst = Layout::contiguous(&[rows, row], 1).unwrap();
    vec![Step::Copy(Plan::new(&dst, &src).unwrap())]
}

/// A square transpose of `n` x `n` elements of `elem` bytes.
fn transpose(n: usize, elem: usize) -> Vec<Step> {
    let src = Layout::contiguous(&[n, n], elem)
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let dst = Layout::contiguous(&[n, n], elem).unwrap();
    vec![Step::Copy(Plan::new(&dst, &src).unwrap())]
}

fn segments(n: usize, len: u64) -> Vec<Step> {
    let segs: Arc<[Segment]> = (0..n as u64)
        .map(|i| Segment::new(i * len, i * 2 * len, len))
        .collect();
    vec![Step::Segments {
        segs,
        range: 0..n,
        bytes: n * len as usize,
    }]
}

fn fill(bytes: usize) -> Vec<Step> {
    vec![Step::Fill {
        plan: Plan::contiguous(0, 0, bytes),
        pattern: Box::new([7]),
    }]
}

fn paths(r: Route) -> Vec<Path> {
    r.paths().collect()
}

#[test]
fn staging_host_to_device_from_2_mib() {
    let r = route(&cfg(), OWN, Some(PAGEABLE), &contiguous(2 << 20));
    assert_eq!(paths(r), [Path::Staged(StagedDirection::HostToDevice)]);
    assert_eq!(r.stream, Direction::HostToDevice);
    let r = route(&cfg(), OWN, Some(PAGEABLE), &contiguous((2 << 20) - 1));
    assert_eq!(paths(r), [Path::Driver]);
    assert_eq!(r.stream, Direction::HostToDevice);
}

#[test]
fn staging_device_to_host_from_1_mib() {
    let r = route(&cfg(), PAGEABLE, Some(OWN), &contiguous(1 << 20));
    assert_eq!(paths(r), [Path::Staged(StagedDirection::DeviceToHost)]);
    assert_eq!(r.stream, Direction::DeviceToHost);
    let r = route(&cfg(), PAGEABLE, Some(OWN), &contiguous((1 << 20) - 1));
    assert_eq!(paths(r), [Path::Driver]);
}

#[test]
fn staging_counts_every_copy_step_and_never_takes_fills_or_mixed_programs() {
    let two = [contiguous(1 << 20), contiguous(1 << 20)].concat();
    assert_eq!(
        route(&cfg(), OWN, Some(PAGEABLE), &two).first(),
        Path::Staged(StagedDirection::HostToDevice)
    );
    let mixed = [contiguous(4 << 20), segments(1, 4096)].concat();
    assert_ne!(
        route(&cfg(), OWN, Some(PAGEABLE), &mixed).first(),
        Path::Staged(StagedDirection::HostToDevice)
    );
}

#[test]
fn pageable_segment_lists_staged_from_64_segments_or_the_byte_thresholds() {
    let h2d = Path::Staged(StagedDirection::HostToDevice);
    let d2h = Path::Staged(StagedDirection::DeviceToHost);
    // 64 tiny segments are staged; 63 go to the driver, one call each.
    let r = route(&cfg(), OWN, Some(PAGEABLE), &segments(64, 1));
    assert_eq!(paths(r), [h2d]);
    assert_eq!(r.stream, Direction::HostToDevice);
    let r = route(&cfg(), OWN, Some(PAGEABLE), &segments(63, 4096));
    assert_eq!(paths(r), [Path::Driver]);
    let r = route(&cfg(), PAGEABLE, Some(OWN), &segments(64, 1));
    assert_eq!(paths(r), [d2h]);
    assert_eq!(r.stream, Direction::DeviceToHost);
    // Few large segments: by bytes, as a contiguous copy (2 MiB up, 1 MiB down).
    let r = route(&cfg(), OWN, Some(PAGEABLE), &segments(2, 1 << 20));
    assert_eq!(paths(r), [h2d]);
    let r = route(&cfg(), OWN, Some(PAGEABLE), &segments(2, (1 << 20) - 1));
    assert_eq!(paths(r), [Path::Driver]);
    let r = route(&cfg(), PAGEABLE, Some(OWN), &segments(1, 1 << 20));
    assert_eq!(paths(r), [d2h]);
    // The bench's case: 100,000 x 4 KiB.
    let r = route(&cfg(), OWN, Some(PAGEABLE), &segments(100_000, 4096));
    assert_eq!(paths(r), [h2d]);
    // Without staging, pinned memory, or another GPU's memory: not staged.
    let off = cfg().staging(None);
    let r = route(&off, OWN, Some(PAGEABLE), &segments(100_000, 4096));
    assert_eq!(paths(r), [Path::Driver]);
    let r = route(&cfg(), OWN, Some(PINNED), &segments(100_000, 4096));
    assert_eq!(paths(r), [Path::Gather, Path::Driver]);
    let r = route(&cfg(), PEER, Some(PAGEABLE), &segments(100_000, 4096));
    assert_eq!(r.first(), Path::Driver);
}

#[test]
fn staged_chunks_scatter_on_the_device_from_5_short_runs() {
    // Up to 4 runs: one DMA each, whatever their length.
    assert!(!staged_scatters(1, 16 << 20));
    assert!(!staged_scatters(4, 4));
    // 5 runs or more averaging under 1 MiB: device scratch and the gatherer.
    assert!(staged_scatters(5, 5 * ((1 << 20) - 1)));
    assert!(staged_scatters(4096, 16 << 20));
    // Runs averaging 1 MiB or more: one DMA each.
    assert!(!staged_scatters(5, 5 << 20));
    assert!(!staged_scatters(16, 16 << 20));
}

#[test]
fn staging_off_peer_memory_and_pinned_are_never_staged() {
    let big = contiguous(256 << 20);
    let off = cfg().staging(None);
    assert_eq!(
        paths(route(&off, OWN, Some(PAGEABLE), &big)),
        [Path::Driver]
    );
    assert_eq!(
        paths(route(&cfg(), PEER, Some(PAGEABLE), &big)),
        [Path::Driver]
    );
    for k in [PINNED, MAPPED, MANAGED] {
        assert_eq!(
            paths(route(&cfg(), OWN, Some(k), &big)),
            [Path::Driver],
            "{k}"
        );
        assert_eq!(
            paths(route(&cfg(), k, Some(OWN), &big)),
            [Path::Driver],
            "{k}"
        );
    }
}

#[test]
fn staged_stream_follows_the_staging_direction_even_when_a_direction_is_forced() {
    let forced = cfg().direction(Direction::DeviceToDevice);
    let r = route(&forced, OWN, Some(PAGEABLE), &contiguous(4 << 20));
    assert_eq!(r.stream, Direction::HostToDevice);
    let r = route(&forced, OWN, Some(PINNED), &contiguous(4 << 20));
    assert_eq!(r.stream, Direction::DeviceToDevice);
}

#[test]
fn direction_of_every_kind_pair() {
    let on_dev = |k: MemKind| matches!(k, MemKind::Device { .. } | MemKind::Managed);
    let all = [PAGEABLE, PINNED, MAPPED, MANAGED, OWN, PEER];
    for d in all {
        let fill_dir = direction(&cfg(), d, None);
        let want = if on_dev(d) {
            Direction::DeviceToDevice
        } else {
            Direction::DeviceToHost
        };
        assert_eq!(fill_dir, want, "fill of {d}");
        for s in all {
            let want = match (on_dev(d), on_dev(s)) {
                (true, true) => Direction::DeviceToDevice,
                (false, true) => Direction::DeviceToHost,
                (_, false) => Direction::HostToDevice,
            };
            assert_eq!(direction(&cfg(), d, Some(s)), want, "{s} -> {d}");
        }
    }
}

#[test]
fn supports_every_kind_pair() {
    // GPU 0 of three; it can access GPU 1 directly, not GPU 2.
    let access = [false, true, false];
    let far = MemKind::Device { ordinal: 2 };
    let absent = MemKind::Device { ordinal: 3 };
    let host = HOST_KINDS;
    for d in host {
        for s in host {
            let want = !(d == PAGEABLE && s == PAGEABLE);
            assert_eq!(supports(ME, &access, d, Some(s)), want, "{s} -> {d}");
        }
        for dev in [OWN, PEER] {
            assert!(supports(ME, &access, d, Some(dev)), "{dev} -> {d}");
            assert!(supports(ME, &access, dev, Some(d)), "{d} -> {dev}");
        }
        assert!(!supports(ME, &access, d, Some(far)), "{far} -> {d}");
        assert!(!supports(ME, &access, far, Some(d)), "{d} -> {far}");
        assert_eq!(supports(ME, &access, d, None), d != PAGEABLE, "fill {d}");
    }
    // Device <-> device: any two GPUs of the machine with this one on a side.
    for other in [OWN, PEER, far] {
        assert!(supports(ME, &access, OWN, Some(other)));
        assert!(supports(ME, &access, other, Some(OWN)));
    }
    assert!(supports(ME, &access, PEER, Some(PEER)));
    assert!(!supports(ME, &access, far, Some(PEER)));
    assert!(!supports(ME, &access, absent, Some(OWN)));
    assert!(supports(ME, &access, PEER, None));
    assert!(!supports(ME, &access, far, None));
}

#[test]
fn page_lock_query_skipped_only_for_small_contiguous_host_device_copies() {
    let small = contiguous((1 << 20) - 1);
    assert!(!asks_page_lock(OWN, Some(PAGEABLE), &small));
    assert!(!asks_page_lock(PAGEABLE, Some(OWN), &small));
    // From the smaller staging threshold (1 MiB) on the answer can change the path.
    assert!(asks_page_lock(OWN, Some(PAGEABLE), &contiguous(1 << 20)));
    // Host <-> host: pinned memory is reachable by the kernels.
    assert!(asks_page_lock(PAGEABLE, Some(PAGEABLE), &small));
    assert!(asks_page_lock(OWN, Some(PAGEABLE), &tile(64, 64)));
    assert!(asks_page_lock(OWN, None, &fill(64)));
}

#[test]
fn auto_sm_takes_short_runs_from_4096_of_them() {
    // Runs of 16 bytes: one 2-D call for the copy engines; SMs from 4096 rows.
    for k in [OWN, PINNED, MAPPED, MANAGED] {
        let r = route(&cfg(), OWN, Some(k), &tile(4096, 16));
        assert_eq!(paths(r), [Path::Sm, Path::Driver], "{k}");
        let r = route(&cfg(), OWN, Some(k), &tile(4095, 16));
        assert_eq!(paths(r), [Path::Driver], "{k}");
    }
    // 17-byte runs stay on the copy engines at any count (one call).
    let r = route(&cfg(), OWN, Some(OWN), &tile(1 << 16, 17));
    assert_eq!(paths(r), [Path::Driver]);
}

#[test]
fn managed_memory_stays_off_the_kernels_without_concurrent_managed_access() {
    let always = cfg().kernel_copies(KernelCopies::Always);
    for (d, s) in [(OWN, MANAGED), (MANAGED, OWN), (MANAGED, PINNED)] {
        // With it (Hopper on Linux): the SMs and the gatherer as for pinned memory.
        assert_eq!(
            paths(route(&cfg(), d, Some(s), &tile(4096, 16))),
            [Path::Sm, Path::Driver]
        );
        assert_eq!(
            paths(route(&cfg(), d, Some(s), &segments(100, 64))),
            [Path::Gather, Path::Driver]
        );
        assert_eq!(
            paths(route(&always, d, Some(s), &contiguous(4096))),
            [Path::Sm, Path::Driver]
        );
        // Without: driver calls only, whatever the settings ask.
        for steps in [tile(4096, 16), segments(100, 64), contiguous(4096)] {
            for c in [cfg(), always] {
                let r = rules(&c, false).route(d, Some(s), &steps);
                assert_eq!(paths(r), [Path::Driver], "{s} -> {d}");
            }
        }
        assert_eq!(
            paths(rules(&cfg(), false).list_route(d, s, 100, 6400)),
            [Path::Driver]
        );
    }
    // Other memory is routed as before.
    assert_eq!(
        paths(rules(&cfg(), false).route(OWN, Some(PINNED), &tile(4096, 16))),
        [Path::Sm, Path::Driver]
    );
}

#[test]
fn auto_sm_takes_transposes_of_runs_up_to_256_bytes_from_4_calls() {
    // A transpose: one 2-D call per column.
    assert_eq!(
        route(&cfg(), OWN, Some(OWN), &transpose(4, 256)).first(),
        Path::Sm
    );
    assert_eq!(
        route(&cfg(), OWN, Some(OWN), &transpose(3, 256)).first(),
        Path::Driver
    );
    assert_eq!(
        route(&cfg(), OWN, Some(OWN), &transpose(64, 257)).first(),
        Path::Driver
    );
    assert_eq!(
        route(&cfg(), OWN, Some(OWN), &transpose(8, 4)).first(),
        Path::Sm
    );
}

#[test]
fn sm_needs_both_sides_reachable_and_copies_only() {
    let t = transpose(64, 4);
    assert_eq!(route(&cfg(), OWN, Some(PAGEABLE), &t).first(), Path::Driver);
    assert_eq!(route(&cfg(), PAGEABLE, Some(OWN), &t).first(), Path::Driver);
    assert_eq!(route(&cfg(), PEER, Some(OWN), &t).first(), Path::Driver);
    assert_eq!(route(&cfg(), OWN, Some(PEER), &t).first(), Path::Driver);
    assert_eq!(
        route(&cfg(), OWN, None, &fill(1 << 20)).first(),
        Path::Driver
    );
    let never = cfg().kernel_copies(KernelCopies::Never);
    assert_eq!(paths(route(&never, OWN, Some(OWN), &t)), [Path::Driver]);
    // Always: contiguous copies too, but not fills or segment lists.
    let always = cfg().kernel_copies(KernelCopies::Always);
    let r = route(&always, MAPPED, Some(OWN), &contiguous(4096));
    assert_eq!(paths(r), [Path::Sm, Path::Driver]);
    assert_ne!(
        route(&always, OWN, Some(OWN), &segments(100, 64)).first(),
        Path::Sm
    );
    assert_eq!(
        route(&always, OWN, Some(PAGEABLE), &contiguous(4096)).first(),
        Path::Driver
    );
}

#[test]
fn gather_from_64_driver_calls() {
    // 64 segments: 64 calls.
    let r = route(
        &cfg(),
        OWN,
        Some(PINNED),
        &[segments(32, 64), segments(32, 64)].concat(),
    );
    assert_eq!(paths(r), [Path::Gather, Path::Driver]);
    let r = route(
        &cfg(),
        OWN,
        Some(PINNED),
        &[segments(32, 64), segments(31, 64)].concat(),
    );
    assert_eq!(paths(r), [Path::Driver]);
    // A program of 64 one-call copies.
    let many: Vec<Step> = (0..64).flat_map(|_| contiguous(64)).collect();
    assert_eq!(route(&cfg(), OWN, Some(OWN), &many).first(), Path::Gather);
    assert_eq!(
        route(&cfg(), OWN, Some(OWN), &many[..63]).first(),
        Path::Driver
    );
    // Never with pageable memory or another GPU; never with a fill in the program.
    assert_eq!(
        route(&cfg(), OWN, Some(PAGEABLE), &many).first(),
        Path::Driver
    );
    assert_eq!(route(&cfg(), PEER, Some(OWN), &many).first(), Path::Driver);
    let with_fill = [many.clone(), fill(64)].concat();
    assert_eq!(gather_calls(&with_fill), None);
}

#[test]
fn one_segment_list_is_gathered_at_any_length() {
    let r = route(&cfg(), OWN, Some(OWN), &segments(3, 64));
    assert_eq!(paths(r), [Path::Gather, Path::Driver]);
}

#[test]
fn sm_then_gather_then_driver_for_a_many_call_4d_permutation() {
    // Dims reversed: 4-byte runs; the copy engines need one 3-D call per index of the two
    // outer dims, 8 x 8 = 64 of them.
    let src = Layout::contiguous(&[4, 4, 8, 8], 4)
        .unwrap()
        .permute(&[3, 2, 1, 0])
        .unwrap();
    let dst = Layout::contiguous(&[8, 8, 4, 4], 4).unwrap();
    let steps = vec![Step::Copy(Plan::new(&dst, &src).unwrap())];
    let r = route(&cfg(), OWN, Some(OWN), &steps);
    assert_eq!(paths(r), [Path::Sm, Path::Gather, Path::Driver]);
    // A square transpose is one 3-D plan: counted as one call, never gathered.
    let r = route(&cfg(), OWN, Some(OWN), &transpose(64, 4));
    assert_eq!(paths(r), [Path::Sm, Path::Driver]);
}

#[test]
fn split_only_when_asked_from_8_mib_within_this_gpu() {
    let n = 8 << 20;
    assert_eq!(
        paths(route(&cfg(), OWN, Some(OWN), &contiguous(n))),
        [Path::Driver]
    );
    let half = cfg().d2d_sm_share(50);
    let r = route(&half, OWN, Some(OWN), &contiguous(n));
    assert_eq!(paths(r), [Path::Split { sm_bytes: n / 2 }, Path::Driver]);
    let r = route(&half, OWN, Some(OWN), &contiguous(n - 1));
    assert_eq!(paths(r), [Path::Driver]);
    assert_eq!(
        route(&half, OWN, Some(PEER), &contiguous(n)).first(),
        Path::Driver
    );
    assert_eq!(
        route(&half, OWN, Some(PINNED), &contiguous(n)).first(),
        Path::Driver
    );
    assert_eq!(
        route(&half, OWN, Some(OWN), &tile(4096, 4096)).first(),
        Path::Driver
    );
}

#[test]
fn split_copy_engine_part_ends_on_a_4_kib_boundary() {
    let n = (8 << 20) + 100;
    let r = route(&cfg().d2d_sm_share(30), OWN, Some(OWN), &contiguous(n));
    let Path::Split { sm_bytes } = r.first() else {
        panic!("not split: {r:?}");
    };
    assert_eq!((n - sm_bytes) % 4096, 0);
    assert!((n - sm_bytes) >= n * 70 / 100);
    let all = route(&cfg().d2d_sm_share(100), OWN, Some(OWN), &contiguous(n));
    assert_eq!(all.first(), Path::Split { sm_bytes: n });
}

#[test]
fn gather_strategy_thresholds() {
    let yes = || true;
    // Lists between two host buffers keep AUTO_LARGE_SEGMENT at any length (the others:
    // `large_segments_by_sides`).
    let h2h = || Sides::HostToHost;
    // At most 4 segments: one call each.
    assert_eq!(
        gather_strategy(4, 1 << 30, true, || true, || true, yes, h2h),
        Strategy::PerSegment
    );
    // Segments averaging 1 MiB or more: the batch copy where it can run.
    assert_eq!(
        gather_strategy(5, 5 << 20, true, || true, || true, yes, h2h),
        Strategy::Batch
    );
    assert_eq!(
        gather_strategy(5, 5 << 20, true, || true, || false, yes, h2h),
        Strategy::PerSegment
    );
    assert_eq!(
        gather_strategy(5, 5 << 20, true, || false, || true, yes, h2h),
        Strategy::PerSegment
    );
    // Smaller segments: the kernel, else the batch copy, else one call each.
    assert_eq!(
        gather_strategy(5, (5 << 20) - 1, true, || true, || true, yes, h2h),
        Strategy::Kernel
    );
    assert_eq!(
        gather_strategy(5, 5 << 10, true, || true, || true, || false, h2h),
        Strategy::Batch
    );
    assert_eq!(
        gather_strategy(5, 5 << 10, true, || true, || false, || false, h2h),
        Strategy::PerSegment
    );
    assert_eq!(
        gather_strategy(5, 5 << 10, true, || false, || true, yes, h2h),
        Strategy::PerSegment
    );
}

#[test]
fn large_segments_by_sides() {
    use Sides::*;
    let d = MemKind::Device { ordinal: 0 };
    assert_eq!(Sides::of(d, MemKind::Pinned), HostToDevice);
    assert_eq!(Sides::of(MemKind::Mapped, d), DeviceToHost);
    assert_eq!(Sides::of(d, MemKind::Managed), DeviceToDevice);
    assert_eq!(Sides::of(MemKind::Pinned, MemKind::Pinned), HostToHost);
    // From host memory the batch copy takes 64 KiB segments; device -> host keeps 1 MiB.
    assert_eq!(large_segment(HostToDevice, 4096), 64 << 10);
    assert_eq!(large_segment(DeviceToHost, 4096), 1 << 20);
    // Short device -> host lists take the batch copy from 32 KiB segments.
    assert_eq!(large_segment(DeviceToHost, 64), 1 << 20);
    assert_eq!(large_segment(DeviceToHost, 63), 32 << 10);
    assert_eq!(large_segment(HostToHost, 4096), 1 << 20);
    // Device lists: 1 MiB below 64 segments, the kernel at any size from 64.
    assert_eq!(large_segment(DeviceToDevice, 63), 1 << 20);
    assert_eq!(large_segment(DeviceToDevice, 64), u64::MAX);
    let yes = || true;
    let at = |n: usize, avg: u64, sides: Sides| {
        gather_strategy(n, avg * n as u64, true, yes, yes, yes, || sides)
    };
    assert_eq!(at(256, 512 << 10, HostToDevice), Strategy::Batch);
    assert_eq!(at(256, 64 << 10, HostToDevice), Strategy::Batch);
    assert_eq!(at(256, 32 << 10, HostToDevice), Strategy::Kernel);
    assert_eq!(at(256, 512 << 10, DeviceToHost), Strategy::Kernel);
    assert_eq!(at(16, 512 << 10, DeviceToHost), Strategy::Batch);
    assert_eq!(at(16, 64 << 10, DeviceToHost), Strategy::Batch);
    assert_eq!(at(16, 32 << 10, DeviceToHost), Strategy::Batch);
    assert_eq!(at(16, 16 << 10, DeviceToHost), Strategy::Kernel);
    assert_eq!(at(256, 2 << 20, DeviceToDevice), Strategy::Kernel);
    assert_eq!(at(16, 2 << 20, DeviceToDevice), Strategy::Batch);
    // SMs busy: never the kernel, whatever the sides.
    assert_eq!(
        gather_strategy(256, 256 << 20, false, yes, yes, yes, || DeviceToDevice),
        Strategy::Batch
    );
}

#[test]
fn fills_run_as_driver_calls_on_their_destination_stream() {
    let r = route(&cfg(), OWN, None, &fill(1 << 30));
    assert_eq!(paths(r), [Path::Driver]);
    assert_eq!(r.stream, Direction::DeviceToDevice);
    assert_eq!(
        route(&cfg(), PINNED, None, &fill(64)).stream,
        Direction::DeviceToHost
    );
}

/// The plan of copying `src` into a dense layout of the same shape.
fn packed_plan(src: &Layout) -> Plan {
    let dst = Layout::contiguous(src.dims(), src.elem_size()).unwrap();
    Plan::new(&dst, src).unwrap()
}

/// (elem, rows, cols, batch) of the transpose `plan` is, rows along the source's grain.
fn shape(plan: &Plan) -> Option<(usize, usize, usize, usize)> {
    let t = transpose_of(plan)?;
    Some((t.elem, plan.counts()[t.r], plan.counts()[t.c], t.batch))
}

#[test]
fn transposes_of_every_element_size_and_shape() {
    for elem in [1, 2, 4, 8, 16] {
        for (r, c) in [(8192, 8192), (33, 47), (1000, 17), (3, 1029), (2, 2)] {
            let m = Layout::contiguous(&[r, c], elem).unwrap();
            let p = packed_plan(&m.transpose(0, 1).unwrap());
            // The source is read along its columns (c of them per row), written along rows.
            assert_eq!(shape(&p), Some((elem, c, r, 1)), "{r} x {c} of {elem} B");
            let [Step::Copy(q)] = &transpose(64, elem)[..] else {
                unreachable!()
            };
            assert_eq!(shape(q), Some((elem, 64, 64, 1)));
        }
    }
    // Elements the kernel has no word for go to the general SM kernels.
    for elem in [3, 6, 12, 32, 256] {
        let [Step::Copy(p)] = &transpose(64, elem)[..] else {
            unreachable!()
        };
        assert_eq!(transpose_of(p), None, "{elem}-byte elements");
    }
}

#[test]
fn one_row_one_column_and_plain_copies_are_not_transposes() {
    for (r, c) in [(1, 1000), (1000, 1)] {
        let m = Layout::contiguous(&[r, c], 4).unwrap();
        let p = packed_plan(&m.transpose(0, 1).unwrap());
        assert_eq!(p.kind(), PlanKind::Contiguous);
        assert_eq!(transpose_of(&p), None, "{r} x {c}");
    }
    let [Step::Copy(t)] = &tile(4096, 4)[..] else {
        unreachable!()
    };
    assert_eq!(
        transpose_of(t),
        None,
        "rows out of a pitch: same grain on both sides"
    );
    assert_eq!(transpose_of(&Plan::contiguous(0, 0, 1 << 20)), None);
    // Every other element of each row: short runs, same grain.
    let m = Layout::contiguous(&[100, 64], 4).unwrap();
    assert_eq!(
        transpose_of(&packed_plan(&m.slice(1, 0..64, 2).unwrap())),
        None
    );
}

#[test]
fn transposes_with_padded_strides() {
    // A 100 x 63 bf16 matrix in rows of 128 bytes: the source's other stride is the pitch.
    let m = Layout::pitched(&[100, 63], 2, 128).unwrap();
    let p = packed_plan(&m.transpose(0, 1).unwrap());
    let t = transpose_of(&p).unwrap();
    assert_eq!((t.elem, p.counts()[t.r], p.counts()[t.c]), (2, 63, 100));
    assert_eq!((p.src_strides()[t.r], p.src_strides()[t.c]), (2, 128));
    // Every other column of an f32 matrix: the source's grain has stride 8.
    let m = Layout::contiguous(&[50, 80], 4).unwrap();
    let every_other = m.slice(1, 0..80, 2).unwrap().transpose(0, 1).unwrap();
    let p = packed_plan(&every_other);
    let t = transpose_of(&p).unwrap();
    assert_eq!((p.counts()[t.r], p.counts()[t.c]), (40, 50));
    assert_eq!(p.src_strides()[t.r], 8);
}

#[test]
fn batched_transposes_and_two_axis_swaps() {
    // [B, R, C] -> [B, C, R], bf16.
    let m = Layout::contiguous(&[16, 300, 500], 2).unwrap();
    let p = packed_plan(&m.transpose(1, 2).unwrap());
    assert_eq!(shape(&p), Some((2, 500, 300, 16)));
    // Axes 0 and 2 of [A, B, C] swapped: B lies between the two and is the batch.
    let m = Layout::contiguous(&[7, 37, 23], 4).unwrap();
    let p = packed_plan(&m.transpose(0, 2).unwrap());
    assert_eq!(shape(&p), Some((4, 23, 7, 37)));
    // 4-D: two batch dims.
    let m = Layout::contiguous(&[3, 5, 40, 33], 8).unwrap();
    let p = packed_plan(&m.permute(&[1, 0, 3, 2]).unwrap());
    assert_eq!(shape(&p), Some((8, 33, 40, 15)));
    // A batch of one is a plain transpose.
    let m = Layout::contiguous(&[1, 64, 32], 4).unwrap();
    assert_eq!(
        shape(&packed_plan(&m.transpose(1, 2).unwrap())),
        Some((4, 32, 64, 1))
    );
}

#[test]
fn transposes_take_the_sm_path_where_both_sides_are_reachable() {
    let steps = transpose(8192, 2);
    for (dst, src) in [(OWN, OWN), (OWN, PINNED), (PINNED, OWN)] {
        assert_eq!(route(&cfg(), dst, Some(src), &steps).first(), Path::Sm);
    }
    let [Step::Copy(p)] = &steps[..] else {
        unreachable!()
    };
    assert_eq!(
        crate::engine::cuda::paths::strided::SmKernel::for_plan(p),
        crate::engine::cuda::paths::strided::SmKernel::Transpose
    );
}

#[test]
fn the_default_pool_is_one_stream_per_core_up_to_16() {
    assert_eq!(default_streams(0), 1);
    assert_eq!(default_streams(1), 1);
    assert_eq!(default_streams(2), 2);
    assert_eq!(default_streams(16), 16);
    assert_eq!(default_streams(128), 16);
}

#[test]
fn threads_take_the_pool_round_robin_and_keep_their_lane() {
    // Eight threads that start together on a pool of eight: one stream each.
    let lanes: Vec<usize> = (0..8).map(|t| lane(t, 8)).collect();
    assert_eq!(lanes, [0, 1, 2, 3, 4, 5, 6, 7]);
    // Sixteen on eight: two each, whichever thread number the first one had.
    for first in [0, 3, 1000] {
        let mut per = [0; 8];
        (first..first + 16).for_each(|t| per[lane(t, 8)] += 1);
        assert_eq!(per, [2; 8], "threads {first}..{}", first + 16);
    }
    // The same thread, the same lane (a pure function of its number).
    assert_eq!(lane(13, 8), lane(13, 8));
    // One lane (or a pool of 0, counted as 1): everybody on lane 0.
    assert!((0..50).all(|t| lane(t, 1) == 0 && lane(t, 0) == 0));
}

#[test]
fn the_pool_choice_leaves_the_direction_alone() {
    // The lane picks a stream among the direction's: the route's direction is the same for
    // every thread (the pool is per direction).
    let c = cfg().streams(4);
    assert_eq!(c.streams, 4);
    assert_eq!(cfg().streams(0).streams, 1);
    let r = route(&c, OWN, Some(PINNED), &contiguous(64 << 10));
    assert_eq!(r.stream, Direction::HostToDevice);
    assert_eq!(r.first(), Path::Driver);
}

/// `transpose_access` of the plan `dst` <- `src` at these addresses (offsets added), where the
/// plan is a transpose.
fn access(dst: &Layout, src: &Layout, da: u64, sa: u64) -> Option<usize> {
    let p = Plan::new(dst, src).unwrap();
    let t = transpose_of(&p).expect("a transpose");
    transpose_access(
        &t,
        &p,
        da + p.dst_offset() as u64,
        sa + p.src_offset() as u64,
    )
}

/// A `rows` x `cols` matrix of `elem`-byte elements in rows of `pitch` bytes, transposed into a
/// dense one: (destination, source).
fn pitched_transpose(rows: usize, cols: usize, elem: usize, pitch: usize) -> (Layout, Layout) {
    let m = Layout::pitched(&[rows, cols], elem, pitch).unwrap();
    let t = Layout::contiguous(&[cols, rows], elem).unwrap();
    (t, m.transpose(0, 1).unwrap())
}

#[test]
fn transposes_take_words_only_where_every_address_is_aligned() {
    // bf16, dense, aligned: 4-byte words (two elements).
    let (d, s) = pitched_transpose(64, 64, 2, 128);
    assert_eq!(access(&d, &s, 0x1000, 0x2000), Some(2));
    // int8: four elements a word.
    let (d, s) = pitched_transpose(128, 256, 1, 256);
    assert_eq!(access(&d, &s, 0, 0), Some(4));
    // A base 2 bytes into a word: bf16 elements one at a time.
    assert_eq!(access(&d, &s, 0x1002, 0x2000), Some(1), "int8, dst + 2");
    let (d, s) = pitched_transpose(64, 64, 2, 128);
    assert_eq!(access(&d, &s, 0x1002, 0x2000), Some(1), "bf16, dst + 2");
    assert_eq!(access(&d, &s, 0x1000, 0x2002), Some(1), "bf16, src + 2");
    // An odd row length (63 bf16: 126-byte rows): rows start 2 bytes into a word.
    let (d, s) = pitched_transpose(64, 63, 2, 126);
    assert_eq!(access(&d, &s, 0, 0), Some(1));
    // Padded to a multiple of 4 bytes: words again.
    let (d, s) = pitched_transpose(64, 63, 2, 128);
    assert_eq!(access(&d, &s, 0, 0), Some(2));
    // Pitched rows that are not a multiple of 4 (int8, 130-byte rows): bytes.
    let (d, s) = pitched_transpose(100, 127, 1, 130);
    assert_eq!(access(&d, &s, 0, 0), Some(1));
}

#[test]
fn misaligned_elements_keep_off_the_transpose_kernel() {
    // Element sizes at every offset below them: only offset 0 takes the kernel.
    for elem in [2usize, 4, 8, 16] {
        let (d, s) = pitched_transpose(40, 70, elem, 70 * elem);
        for off in 0..elem as u64 {
            let got = access(&d, &s, 0x1000 + off, 0x2000);
            assert_eq!(got.is_some(), off == 0, "{elem}-byte elements, dst + {off}");
            let got = access(&d, &s, 0x1000, 0x2000 + off);
            assert_eq!(got.is_some(), off == 0, "{elem}-byte elements, src + {off}");
        }
    }
    // f32 at offset 2 (a layout offset, as `Layout::with_offset`).
    let (d, s) = pitched_transpose(40, 70, 4, 280);
    let d2 = d.with_offset(2).unwrap();
    assert_eq!(access(&d2, &s, 0x1000, 0x2000), None);
    // Odd strides: f32 rows of 283 bytes.
    let (d, s) = pitched_transpose(40, 70, 4, 283);
    assert_eq!(access(&d, &s, 0, 0), None);
    // f32 rows of 282 bytes: 2-byte aligned only.
    let (d, s) = pitched_transpose(40, 70, 4, 282);
    assert_eq!(access(&d, &s, 0, 0), None);
    // 8-byte elements in rows of 4 * 141 bytes: 4-byte aligned only.
    let (d, s) = pitched_transpose(40, 70, 8, 564);
    assert_eq!(access(&d, &s, 0, 0), None);
    // 1-byte elements are aligned anywhere.
    let (d, s) = pitched_transpose(40, 70, 1, 73);
    assert_eq!(access(&d, &s, 0x1001, 0x2003), Some(1));
}

/// H200 run 31, `cuda_stress` (seed 1796305811726484851, warm-up on "cuda spin", request 4):
/// a bf16 transpose into a device buffer at an odd offset took the transpose kernel with
/// 2-byte accesses and died with `CUDA_ERROR_MISALIGNED_ADDRESS` (reported at request 5, a
/// fill, the next one waited on).
#[test]
fn the_run_31_stress_case_keeps_off_the_transpose_kernel() {
    let dst = Layout::with_byte_strides(&[995, 4, 2], &[82, 2, 245262], 2)
        .unwrap()
        .with_offset(163597)
        .unwrap();
    let src = Layout::with_byte_strides(&[995, 4, 2], &[6, 17904, 5968], 2)
        .unwrap()
        .with_offset(41778)
        .unwrap();
    let p = Plan::new(&dst, &src).unwrap();
    // The engine takes it to the SMs, a transpose: but not to the transpose kernel.
    assert_eq!(
        route(&cfg(), OWN, Some(OWN), &[Step::Copy(p)]).first(),
        Path::Sm
    );
    assert!(transpose_of(&p).is_some());
    assert_eq!(access(&dst, &src, 0x7f00_0000_0000, 0x7f00_1000_0000), None);
    // The same layouts at an even offset take it, one element at a time.
    let even = dst.with_offset(163598).unwrap();
    assert_eq!(
        access(&even, &src, 0x7f00_0000_0000, 0x7f00_1000_0000),
        Some(1)
    );
    // The request the error was reported at: a fill of [21, 3] strides [2, 42] at offset 2
    // (one contiguous run of 126 bytes), which never goes to an SM kernel.
    let fl = Layout::with_byte_strides(&[21, 3], &[2, 42], 2)
        .unwrap()
        .with_offset(2)
        .unwrap();
    let fill = vec![Step::Fill {
        plan: Plan::fill(&fl).unwrap(),
        pattern: Box::new([1, 2]),
    }];
    for mode in [KernelCopies::Auto, KernelCopies::Always] {
        let r = route(&cfg().kernel_copies(mode), OWN, None, &fill);
        assert_eq!(r.paths().collect::<Vec<_>>(), [Path::Driver], "{mode:?}");
    }
}

#[test]
fn one_contiguous_run_is_routed_as_the_general_rules_route_it() {
    let all = [PAGEABLE, PINNED, MAPPED, MANAGED, OWN, PEER];
    let modes = [
        KernelCopies::Auto,
        KernelCopies::Never,
        KernelCopies::Always,
    ];
    let forced = [
        None,
        Some(Direction::HostToDevice),
        Some(Direction::DeviceToHost),
        Some(Direction::DeviceToDevice),
    ];
    let sizes = [
        0,
        1,
        4,
        16,
        256,
        4 << 10,
        64 << 10,
        (1 << 20) - 1,
        1 << 20,
        2 << 20,
        8 << 20,
        1 << 30,
    ];
    let (mut fast, mut asked) = (0, 0);
    for mode in modes {
        for dir in forced {
            for share in [None, Some(30)] {
                for staging in [true, false] {
                    let mut c = cfg().kernel_copies(mode);
                    c.direction = dir;
                    c.d2d_sm_share = share;
                    if !staging {
                        c.staging = None;
                    }
                    for d in all {
                        for s in all {
                            for n in sizes {
                                let steps = contiguous(n);
                                let general = walk(&c, d, Some(s), &steps);
                                let at = format!("{s} -> {d}, {n} B, {mode:?}, {dir:?}");
                                assert_eq!(route(&c, d, Some(s), &steps), general, "{at}");
                                asked += 1;
                                let pageable = d == PAGEABLE || s == PAGEABLE;
                                let want_fast =
                                    share.is_none() && !(pageable && staging && n >= 1 << 20);
                                match one_run(&c, d, s, n) {
                                    Some(r) => {
                                        assert!(want_fast, "{at}");
                                        assert_eq!(r, general, "one_run {at}");
                                        fast += 1;
                                    }
                                    None => assert!(!want_fast, "{at}"),
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(fast > asked / 3, "{fast} of {asked}");
}

#[test]
fn the_bands_are_host_to_device_lists_between_two_thresholds_and_short_lists_either_way() {
    let n = 256;
    let at = |avg: u64| band(Sides::HostToDevice, n, avg * n as u64);
    assert_eq!(at(AUTO_LARGE_SEGMENT_FROM_HOST - 1), None);
    assert_eq!(at(AUTO_LARGE_SEGMENT_FROM_HOST), Some(Band::FromHost));
    assert_eq!(at(AUTO_LARGE_SEGMENT - 1), Some(Band::FromHost));
    assert_eq!(at(AUTO_LARGE_SEGMENT), None);
    // Short host -> device lists: a band of their own below the host band.
    let few_from_host = |n: usize, avg: u64| band(Sides::HostToDevice, n, avg * n as u64);
    assert_eq!(few_from_host(16, AUTO_FEW_FROM_HOST_MIN - 1), None);
    assert_eq!(
        few_from_host(16, AUTO_FEW_FROM_HOST_MIN),
        Some(Band::FromHostFew)
    );
    assert_eq!(
        few_from_host(
            DEVICE_KERNEL_MIN_SEGMENTS - 1,
            AUTO_LARGE_SEGMENT_FROM_HOST - 1
        ),
        Some(Band::FromHostFew)
    );
    assert_eq!(
        few_from_host(DEVICE_KERNEL_MIN_SEGMENTS, AUTO_FEW_FROM_HOST_MIN),
        None
    );
    assert_eq!(
        few_from_host(16, AUTO_LARGE_SEGMENT_FROM_HOST),
        Some(Band::FromHost)
    );
    // Device -> host: short lists on the kernel's side of `large_segment` only.
    let to_host = |n: usize, avg: u64| band(Sides::DeviceToHost, n, avg * n as u64);
    assert_eq!(to_host(16, 2 << 10), Some(Band::ToHostFew));
    assert_eq!(to_host(16, 16 << 10), Some(Band::ToHostFew));
    assert_eq!(to_host(16, 32 << 10), None);
    assert_eq!(to_host(16, 64 << 10), None);
    assert_eq!(
        to_host(16, AUTO_LARGE_SEGMENT_TO_HOST_FEW - 1),
        Some(Band::ToHostFew)
    );
    assert_eq!(to_host(16, AUTO_LARGE_SEGMENT_TO_HOST_FEW), None);
    assert_eq!(
        to_host(DEVICE_KERNEL_MIN_SEGMENTS - 1, 2 << 10),
        Some(Band::ToHostFew)
    );
    assert_eq!(to_host(DEVICE_KERNEL_MIN_SEGMENTS, 2 << 10), None);
    // Where the band times the batch, the plain rule had taken the kernel (and beyond it, the
    // batch): the band covers only lists whose mechanism depends on the host.
    let n16 = 16;
    assert!((2 << 10) < large_segment(Sides::DeviceToHost, n16));
    let avg = 64 << 10;
    for sides in [Sides::DeviceToDevice, Sides::HostToHost] {
        assert_eq!(band(sides, n, avg * n as u64), None, "{sides:?}");
        assert_eq!(band(sides, n16, avg * n16 as u64), None, "{sides:?}");
    }
    // A few segments go one call each anyway.
    let few = AUTO_FEW_SEGMENTS;
    for (sides, avg) in [(Sides::HostToDevice, avg), (Sides::DeviceToHost, 2 << 10)] {
        assert_eq!(band(sides, few, avg * few as u64), None, "{sides:?}");
        assert!(
            band(sides, few + 1, avg * (few as u64 + 1)).is_some(),
            "{sides:?}"
        );
    }
    // Each band has its own measurements, and within it each power of two of the average
    // segment: 64 KiB and 512 KiB lists apart, 64 KiB and 96 KiB together.
    let all = [Band::FromHost, Band::FromHostFew, Band::ToHostFew];
    let mut slots: Vec<usize> = all
        .iter()
        .flat_map(|&b| [64u64 << 10, 512 << 10, 1 << 20].map(|avg| band_slot(b, 8, avg * 8)))
        .collect();
    assert!(slots.iter().all(|&s| s < BAND_SLOTS), "{slots:?}");
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 9, "{slots:?}");
    for b in all {
        assert_eq!(
            band_slot(b, 8, 8 * (64 << 10)),
            band_slot(b, 8, 8 * (96 << 10))
        );
        assert_ne!(
            band_slot(b, 8, 8 * (64 << 10)),
            band_slot(b, 8, 8 * (128 << 10))
        );
    }
    assert_eq!(
        band_slot(Band::ToHostFew, 0, 0),
        band_slot(Band::ToHostFew, 5, 3)
    );
    for (i, a) in all.iter().enumerate() {
        assert!(a.index() < BANDS, "{a:?}");
        assert!(all[i + 1..].iter().all(|b| b.index() != a.index()), "{a:?}");
    }
}

#[test]
fn a_band_times_each_in_turn_then_keeps_the_faster_median() {
    // In turn, the kernel first, counting the samples on their way.
    assert_eq!(band_next(0, 0), Strategy::Kernel);
    assert_eq!(band_next(1, 0), Strategy::Batch);
    assert_eq!(band_next(1, 1), Strategy::Kernel);
    assert_eq!(band_next(3, 2), Strategy::Batch);
    // Undecided until both have their samples.
    let (k, b) = ([48e9, 50e9, 47e9], [30e9, 31e9, 29e9]);
    assert_eq!(band_choice(&k[..2], &b), None);
    assert_eq!(band_choice(&k, &b[..2]), None);
    assert_eq!(band_choice(&k, &b), Some(Strategy::Kernel));
    // The third H100 run's host: the batch ahead at 64 KiB.
    assert_eq!(
        band_choice(&[33e9, 33e9, 23e9], &[40e9, 39e9, 31e9]),
        Some(Strategy::Batch)
    );
    // Medians, not means: one slow outlier does not turn it.
    assert_eq!(
        band_choice(&[48e9, 1e9, 49e9], &[30e9, 31e9, 29e9]),
        Some(Strategy::Kernel)
    );
    // A tie, or a kernel ahead by less than the margin, goes to the copy engines.
    assert_eq!(band_choice(&[40e9; 3], &[40e9; 3]), Some(Strategy::Batch));
    assert_eq!(band_choice(&[43.9e9; 3], &[40e9; 3]), Some(Strategy::Batch));
    assert_eq!(
        band_choice(&[44.1e9; 3], &[40e9; 3]),
        Some(Strategy::Kernel)
    );
}
