//! GPU tests of the staged pageable path and the segment gather/scatter. Every byte of every
//! destination buffer is checked against a host reference, poison outside the copied bytes
//! included. With the `gpu` feature but without a CUDA driver, each test prints
//! `skipped: no CUDA driver`.

use cudarc::driver::result as cu;
use cudarc::driver::{CudaContext, CudaStream, PinnedHostSlice};
use ferry::engine::cuda::gather::{GatherError, Gatherer, Segment, Strategy};
use ferry::engine::cuda::staged::{driver_present, Direction, StagedError, Stager, StagingConfig};
use ferry::{Layout, Plan};
use std::sync::Arc;

mod cuda_common;

const POISON: u8 = 0xA5;

/// The device to this binary's other tests (read) or to one test alone (write): a stream held
/// behind a latch must not meet another test's device-wide synchronization (a free, say), which
/// would wait for the latch, nor the driver locks such a call holds.
static DEVICE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A share of the device beside this binary's other tests.
fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    DEVICE
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn setup() -> Option<(Arc<CudaContext>, Arc<CudaStream>)> {
    if !driver_present() {
        println!("skipped: no CUDA driver");
        return None;
    }
    match CudaContext::new(0) {
        Ok(ctx) => {
            let stream = ctx.new_stream().expect("stream");
            Some((ctx, stream))
        }
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            None
        }
    }
}

/// xorshift64*: reproducible test data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next() >> 32) as u8).collect()
    }
}

/// Device memory, freed on drop.
struct Dev {
    ptr: u64,
    len: usize,
}
impl Dev {
    fn new(ctx: &CudaContext, len: usize) -> Dev {
        ctx.bind_to_thread().unwrap();
        // SAFETY: a plain allocation owned by the returned value.
        let ptr = unsafe { cu::malloc_sync(len.max(1)) }.expect("cuMemAlloc");
        Dev { ptr, len }
    }
    fn write(&self, data: &[u8]) {
        assert_eq!(data.len(), self.len);
        // SAFETY: `ptr` holds `len` bytes.
        unsafe { cu::memcpy_htod_sync(self.ptr, data) }.expect("htod");
    }
    fn read(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // SAFETY: `ptr` holds `len` bytes.
        unsafe { cu::memcpy_dtoh_sync(&mut v, self.ptr) }.expect("dtoh");
        v
    }
}
impl Drop for Dev {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_sync`, every test synchronizes before dropping.
        unsafe { cu::free_sync(self.ptr) }.expect("cuMemFree");
    }
}

/// The reference: what `dst` holds after copying `plan` from `src`.
fn reference(plan: &Plan, dst: &mut [u8], src: &[u8]) {
    let run = plan.run();
    plan.for_each_run(|d, s| dst[d..d + run].copy_from_slice(&src[s..s + run]));
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Runs `plan` both ways through `stager` and checks every byte of both destinations.
fn check_plan(stager: &Stager, stream: &Arc<CudaStream>, plan: &Plan, seed: u64) {
    let ctx = stager.context();
    let mut rng = Rng(seed | 1);
    let (dst_len, src_len) = (plan.dst_end(), plan.src_end());
    let what = format!("{plan:?} cfg {:?}", stager.config());

    // Host (pageable) -> device.
    let src = rng.bytes(src_len);
    let dev = Dev::new(ctx, dst_len);
    dev.write(&vec![POISON; dst_len]);
    // SAFETY: `dev` holds `plan.dst_end()` bytes, `src` `plan.src_end()`, nothing else uses them.
    unsafe {
        stager.copy(
            stream,
            Direction::HostToDevice,
            dev.ptr,
            src.as_ptr() as u64,
            plan,
        )
    }
    .expect("staged h2d");
    let mut want = vec![POISON; dst_len];
    reference(plan, &mut want, &src);
    let got = dev.read();
    assert_eq!(first_diff(&got, &want), None, "h2d {what}");

    // Device -> host (pageable).
    let dsrc = Dev::new(ctx, src_len);
    dsrc.write(&src);
    let mut host = vec![POISON; dst_len];
    // SAFETY: as above, the other way.
    unsafe {
        stager.copy(
            stream,
            Direction::DeviceToHost,
            host.as_mut_ptr() as u64,
            dsrc.ptr,
            plan,
        )
    }
    .expect("staged d2h");
    assert_eq!(first_diff(&host, &want), None, "d2h {what}");
}

fn small_stager(ctx: &Arc<CudaContext>) -> Stager {
    Stager::new(
        ctx.clone(),
        StagingConfig::new()
            .chunk_bytes(64 << 10)
            .ring_depth(2)
            .threads(3),
    )
    .expect("stager")
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn staged_contiguous_sizes() {
    let _device = shared();
    let Some((ctx, stream)) = setup() else { return };
    let st = small_stager(&ctx);
    // 1 byte, under a chunk, exactly one chunk, one over, larger than the whole ring.
    for (i, &n) in [1usize, 1000, 65536, 65537, 5 * 65536 + 123, 1 << 20]
        .iter()
        .enumerate()
    {
        check_plan(&st, &stream, &Plan::contiguous(0, 0, n), 10 + i as u64);
        check_plan(&st, &stream, &Plan::contiguous(3, 7, n), 20 + i as u64);
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn staged_default_config_larger_than_ring() {
    let _device = shared();
    let Some((ctx, stream)) = setup() else { return };
    let st = Stager::new(ctx.clone(), StagingConfig::new()).expect("stager");
    let cfg = st.config();
    let n = cfg.get_chunk_bytes() * (cfg.get_ring_depth() + 1) + 4097;
    check_plan(&st, &stream, &Plan::contiguous(0, 0, n), 99);
    // Reuse of the same stager (persistent rings and workers).
    check_plan(&st, &stream, &Plan::contiguous(1, 0, 3 << 20), 98);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn staged_strided() {
    let _device = shared();
    let Some((ctx, stream)) = setup() else { return };
    let st = small_stager(&ctx);
    // (dims, dst strides, src strides, elem): for H2D dst is the device side, for D2H the host.
    #[allow(clippy::type_complexity)]
    let cases: Vec<(Vec<usize>, Vec<usize>, Vec<usize>, usize)> = vec![
        // Pitched rows one side, dense the other.
        (vec![300, 200], vec![800, 4], vec![1000, 4], 4),
        (vec![300, 200], vec![1024, 4], vec![800, 4], 4),
        // 3-D, both pitched, rows of 264 bytes.
        (
            vec![5, 70, 33],
            vec![80 * 272, 272, 8],
            vec![70 * 300, 300, 8],
            8,
        ),
        // Runs longer than a chunk (100 KiB rows, 64 KiB chunks).
        (
            vec![5, 100 << 10],
            vec![110 << 10, 1],
            vec![100 << 10, 1],
            1,
        ),
        // A transpose: 4-byte runs.
        (vec![64, 64], vec![256, 4], vec![4, 256], 4),
        // 4-D (a segment list), odd sizes.
        (
            vec![3, 4, 5, 7],
            vec![4 * 5 * 7 * 16, 5 * 7 * 16, 7 * 16, 16],
            vec![4 * 6 * 8 * 16, 6 * 8 * 16, 8 * 16, 16],
            3,
        ),
        // Rows whose count does not divide the chunk, pitch > rows fit in chunk boundary.
        (vec![1000, 333], vec![333, 1], vec![400, 1], 1),
    ];
    for (i, (dims, ds, ss, elem)) in cases.into_iter().enumerate() {
        let dl = Layout::with_byte_strides(&dims, &ds, elem).expect("dst layout");
        let sl = Layout::with_byte_strides(&dims, &ss, elem).expect("src layout");
        let plan = Plan::new(&dl, &sl).expect("plan");
        check_plan(&st, &stream, &plan, 100 + i as u64);
        check_plan(&st, &stream, &plan.offset_by(5, 11), 200 + i as u64);
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn staged_bad_config() {
    let _device = shared();
    let Some((ctx, _stream)) = setup() else {
        return;
    };
    for cfg in [
        StagingConfig::new().chunk_bytes(100),
        StagingConfig::new().ring_depth(1),
        StagingConfig::new().threads(0),
    ] {
        match Stager::new(ctx.clone(), cfg) {
            Err(StagedError::BadConfig(msg)) => assert!(!msg.is_empty()),
            other => panic!("expected BadConfig for {cfg:?}, got {other:?}"),
        }
    }
}

/// Random segments with non-overlapping destinations inside `dst_len`, sources anywhere.
fn random_segments(
    rng: &mut Rng,
    n: usize,
    min: u64,
    max: u64,
    dst_len: usize,
    src_len: usize,
) -> Vec<Segment> {
    let slot = max + 64;
    assert!(slot as usize * n <= dst_len);
    let mut slots: Vec<u64> = (0..(dst_len as u64 / slot)).collect();
    // Fisher-Yates, then take n slots in random order.
    for i in (1..slots.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        slots.swap(i, j);
    }
    slots
        .into_iter()
        .take(n)
        .map(|s| {
            let len = min + rng.below(max - min + 1);
            let dst = s * slot + rng.below(slot - len + 1);
            let src = rng.below(src_len as u64 - len + 1);
            Segment::new(dst, src, len)
        })
        .collect()
}

fn seg_reference(want: &mut [u8], src: &[u8], segs: &[Segment]) {
    for s in segs {
        let (d, o, l) = (s.dst_off as usize, s.src_off as usize, s.len as usize);
        want[d..d + l].copy_from_slice(&src[o..o + l]);
    }
}

enum Side {
    Dev(Dev),
    Pinned(PinnedHostSlice<u8>),
}
impl Side {
    fn new(ctx: &Arc<CudaContext>, pinned: bool, len: usize) -> Side {
        if pinned {
            // SAFETY: filled before use.
            Side::Pinned(unsafe { ctx.alloc_pinned_with_flags::<u8>(len, 0) }.expect("pinned"))
        } else {
            Side::Dev(Dev::new(ctx, len))
        }
    }
    fn addr(&mut self) -> u64 {
        match self {
            Side::Dev(d) => d.ptr,
            Side::Pinned(p) => p.as_mut_ptr().unwrap() as u64,
        }
    }
    fn write(&mut self, data: &[u8]) {
        match self {
            Side::Dev(d) => d.write(data),
            Side::Pinned(p) => p.as_mut_slice().unwrap().copy_from_slice(data),
        }
    }
    fn read(&self) -> Vec<u8> {
        match self {
            Side::Dev(d) => d.read(),
            Side::Pinned(p) => p.as_slice().unwrap().to_vec(),
        }
    }
}

/// `segs` of `src` gathered by `strategy` into a new destination of `len` bytes (pinned where
/// `pinned`, else device memory) filled with [`POISON`] first, the stream synchronized: the
/// strategy used and the destination's bytes.
fn gather_poisoned(
    (g, stream): (&Gatherer, &Arc<CudaStream>),
    (pinned, len): (bool, usize),
    (src, src_len): (&mut Side, usize),
    segs: &[Segment],
    strategy: Strategy,
) -> Result<(Strategy, Vec<u8>), GatherError> {
    let mut dst = Side::new(stream.context(), pinned, len);
    dst.write(&vec![POISON; len]);
    // SAFETY: buffers of the given lengths, unused elsewhere until the sync below.
    let used = unsafe { g.copy(stream, dst.addr(), len, src.addr(), src_len, segs, strategy)? };
    stream.synchronize().expect("sync");
    Ok((used, dst.read()))
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn gather_every_strategy_and_direction() {
    let _device = shared();
    let Some((ctx, stream)) = setup() else { return };
    let g = Gatherer::new(ctx.clone()).expect("gatherer");
    let batch = Gatherer::batch_supported();
    println!("batch copy supported: {batch}");
    let kernel = !cuda_common::skip_on_null_driver(
        "Strategy::Kernel not checked: ferry's gather kernel is built with NVRTC and the null \
         driver runs no kernels",
    );
    let (dst_len, src_len) = (8 << 20, 6 << 20);
    let mut seed = 1000;
    // (dst pinned, src pinned): H2D, D2H, D2D.
    for (dp, sp) in [(false, true), (true, false), (false, false)] {
        for strategy in [
            Strategy::Kernel,
            Strategy::Batch,
            Strategy::PerSegment,
            Strategy::Auto,
        ] {
            if strategy == Strategy::Batch && !batch {
                println!("batch strategy not checked: driver lacks cuMemcpyBatchAsync_v2");
                continue;
            }
            if strategy == Strategy::Kernel && !kernel {
                continue;
            }
            // Random sizes (all alignments), aligned 4 KiB pieces, a few large ones.
            for (n, min, max, aligned) in [
                (2000, 1, 3000, false),
                (1500, 4096, 4096, true),
                (3, 100_000, 1_000_000, false),
            ] {
                seed += 1;
                let mut rng = Rng(seed);
                let mut segs = random_segments(&mut rng, n, min, max, dst_len, src_len);
                if aligned {
                    for s in &mut segs {
                        s.dst_off &= !4095;
                        s.src_off &= !4095;
                    }
                }
                let src_data = rng.bytes(src_len);
                let mut src = Side::new(&ctx, sp, src_len);
                src.write(&src_data);
                let (used, got) = gather_poisoned(
                    (&g, &stream),
                    (dp, dst_len),
                    (&mut src, src_len),
                    &segs,
                    strategy,
                )
                .unwrap_or_else(|e| panic!("{strategy:?} dst pinned {dp} src pinned {sp}: {e}"));
                let mut want = vec![POISON; dst_len];
                seg_reference(&mut want, &src_data, &segs);
                assert_eq!(
                    first_diff(&got, &want),
                    None,
                    "{strategy:?} (used {used:?}) dst pinned {dp} src pinned {sp}, {n} segments {min}..={max}"
                );
            }
        }
    }
}

/// Kernel gathers enqueued on a stream held back (a host function waiting on a latch) return
/// at once, each with a segment table of its own: none waits on the host for an earlier call's
/// table upload, which the held stream has not run (with one table per gatherer, the second
/// call waited for the first's upload: a block copy behind a long kernel blocked its caller).
/// Past the gatherer's 64 tables, `Strategy::Auto` gives the kernel's lists to the copy engines
/// rather than wait. Every byte right once the stream runs. The device is this test's alone,
/// and the lists are short (16 segments): on the H100 host, with 400, 64 kernel calls and two
/// batched copies returned and the third batch waited (the stream's queue was full: about
/// 1,100 entries behind the latch), and beside this binary's other tests the first call
/// waited.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn kernel_gathers_behind_a_held_stream_return_at_once() {
    let _device = DEVICE
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some((ctx, stream)) = setup() else { return };
    if cuda_common::skip_on_null_driver("the gather kernel is built with NVRTC") {
        return;
    }
    let g = Arc::new(Gatherer::new(ctx.clone()).expect("gatherer"));
    if let Err(e) = g.kernel() {
        println!("skipped: no gather kernel here ({e})");
        return;
    }
    // Four calls naming the kernel, then 70 `Auto` ones: 60 take the tables left, 10 find none
    // (64 x 4 queued operations, then 10 batches of 16 copies).
    let (len, named, auto) = (1 << 20, 4, 70);
    let calls = named + auto;
    let mut rng = Rng(77);
    let src_data = rng.bytes(len);
    let mut src = Side::new(&ctx, false, len);
    src.write(&src_data);
    let segs = random_segments(&mut rng, 16, 1, 2000, len, len);
    let mut dsts: Vec<Side> = (0..calls)
        .map(|_| {
            let mut d = Side::new(&ctx, false, len);
            d.write(&vec![POISON; len]);
            d
        })
        .collect();
    // The latch: the stream runs nothing after it until `release` (or 60 s).
    let (release, latch) = std::sync::mpsc::channel::<()>();
    cuda_common::host_fn(&stream, move || {
        let _ = latch.recv_timeout(std::time::Duration::from_secs(60));
    })
    .expect("host function");
    let (addrs, from) = (
        dsts.iter_mut().map(Side::addr).collect::<Vec<_>>(),
        src.addr(),
    );
    let (done_tx, done) = std::sync::mpsc::channel();
    let returned = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let worker = {
        let (g, stream, segs) = (Arc::clone(&g), Arc::clone(&stream), segs.clone());
        let returned = Arc::clone(&returned);
        std::thread::spawn(move || {
            let used: Vec<Strategy> = addrs
                .iter()
                .enumerate()
                .map(|(i, &to)| {
                    let asked = if i < named {
                        Strategy::Kernel
                    } else {
                        Strategy::Auto
                    };
                    // SAFETY: device buffers of `len` bytes, untouched until the stream is
                    // synchronized below.
                    let s = unsafe { g.copy(&stream, to, len, from, len, &segs, asked) };
                    returned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    s.expect("gather")
                })
                .collect();
            let _ = done_tx.send(used);
        })
    };
    let used = done.recv_timeout(std::time::Duration::from_secs(20));
    let stuck_after = returned.load(std::sync::atomic::Ordering::Relaxed);
    let _ = release.send(());
    worker.join().expect("the gathers' thread");
    stream.synchronize().expect("sync");
    let used = used.unwrap_or_else(|_| {
        panic!(
            "{calls} gathers behind a held stream had not returned after 20 s: call {stuck_after} \
             waited for the stream (for an earlier call's table, or in a driver allocation)"
        )
    });
    let kernels = used.iter().filter(|&&s| s == Strategy::Kernel).count();
    println!(
        "{calls} gathers behind a held stream: {kernels} by the kernel, the last by {:?}",
        used[calls - 1]
    );
    assert_eq!(
        kernels, 64,
        "each table once, then the copy engines: {used:?}"
    );
    assert_ne!(used[calls - 1], Strategy::Kernel);
    let mut want = vec![POISON; len];
    seg_reference(&mut want, &src_data, &segs);
    for (i, d) in dsts.iter().enumerate() {
        assert_eq!(first_diff(&d.read(), &want), None, "call {i}");
    }
}

/// The three bands, where the kernel and the batched copy cross at a host-dependent size: host
/// -> device lists of 64 KiB segments, host -> device lists of 16 segments of 32 KiB, and
/// device -> host lists of 16 segments of 2 KiB (the short lists: too few segments to fill the
/// SMs). In each, on a gatherer of its own, `Strategy::Auto` times both on its first calls,
/// each in turn, then keeps one; every call's bytes right. Within a band each power of two of
/// the average segment is measured apart: host -> device lists of 256 KiB segments, after the
/// 64 KiB ones on the same gatherer, are timed in turn again.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn auto_measures_each_band_then_keeps_one() {
    let _device = shared();
    let Some((ctx, stream)) = setup() else { return };
    if !Gatherer::batch_supported()
        || cuda_common::skip_on_null_driver(
            "the bands time the gather kernel (NVRTC) against the batched copy",
        )
    {
        return;
    }
    // (what, blocks, block bytes, destination pinned, source pinned)
    let mut h2d = None;
    for (what, count, block, dst_pinned, src_pinned) in [
        ("host -> device", 64usize, 64usize << 10, false, true),
        ("host -> device, few", 16, 32 << 10, false, true),
        ("device -> host, few", 16, 2 << 10, true, false),
        (
            "host -> device, 256 KiB after 64 KiB",
            64,
            256 << 10,
            false,
            true,
        ),
    ] {
        let g = match (count, block) {
            (64, b) if b == 256 << 10 => h2d.take().expect("the 64 KiB gatherer"),
            _ => Gatherer::new(ctx.clone()).expect("gatherer"),
        };
        let len = block * count;
        let segs: Vec<Segment> = (0..count as u64)
            .map(|i| {
                Segment::new(
                    ((i * 37) % count as u64) * block as u64,
                    i * block as u64,
                    block as u64,
                )
            })
            .collect();
        let mut rng = Rng(77);
        let src_data = rng.bytes(len);
        let mut src = Side::new(&ctx, src_pinned, len);
        src.write(&src_data);
        let mut want = vec![POISON; len];
        seg_reference(&mut want, &src_data, &segs);
        let mut used = Vec::new();
        for call in 0..16 {
            let (s, got) = gather_poisoned(
                (&g, &stream),
                (dst_pinned, len),
                (&mut src, len),
                &segs,
                Strategy::Auto,
            )
            .unwrap_or_else(|e| panic!("{what}, call {call}: {e}"));
            assert_eq!(first_diff(&got, &want), None, "{what}, call {call} ({s:?})");
            used.push(s);
        }
        println!("{what}: strategies: {used:?}");
        // Timed in turn, the kernel first: three of each.
        assert_eq!(
            &used[..6],
            &[
                Strategy::Kernel,
                Strategy::Batch,
                Strategy::Kernel,
                Strategy::Batch,
                Strategy::Kernel,
                Strategy::Batch
            ],
            "{what}"
        );
        // Each call was waited, so every timing was read by the next: one choice from then on.
        let kept = used[6];
        assert!(matches!(kept, Strategy::Kernel | Strategy::Batch), "{what}");
        assert!(used[6..].iter().all(|&s| s == kept), "{what}: {used:?}");
        if block == 64 << 10 && count == 64 {
            h2d = Some(g);
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn gather_rejects_bad_input() {
    let _device = shared();
    let Some((ctx, stream)) = setup() else { return };
    let g = Gatherer::new(ctx.clone()).expect("gatherer");
    let dev = Dev::new(&ctx, 4096);
    let other = Dev::new(&ctx, 4096);
    let segs = [Segment::new(0, 0, 100), Segment::new(4000, 0, 200)];
    // SAFETY: nothing is copied: the bounds check fails first.
    let r = unsafe {
        g.copy(
            &stream,
            dev.ptr,
            4096,
            other.ptr,
            4096,
            &segs,
            Strategy::Kernel,
        )
    };
    assert!(
        matches!(r, Err(GatherError::OutOfBounds { index: 1, .. })),
        "{r:?}"
    );
    // SAFETY: nothing is copied: the bounds check fails first.
    let r = unsafe {
        g.copy(
            &stream,
            dev.ptr,
            4096,
            other.ptr,
            4096,
            &[Segment::new(0, u64::MAX, 2)],
            Strategy::Auto,
        )
    };
    assert!(
        matches!(r, Err(GatherError::OutOfBounds { index: 0, .. })),
        "{r:?}"
    );
    // The kernel cannot read pageable memory; per-segment copies can.
    let mut host = vec![7u8; 4096];
    let segs = [Segment::new(0, 0, 4096)];
    // SAFETY: nothing is copied: the kernel strategy refuses pageable memory first.
    let r = unsafe {
        g.copy(
            &stream,
            host.as_mut_ptr() as u64,
            4096,
            dev.ptr,
            4096,
            &segs,
            Strategy::Kernel,
        )
    };
    assert!(
        matches!(
            r,
            Err(GatherError::NotDeviceAccessible {
                side: "destination",
                ..
            })
        ),
        "{r:?}"
    );
    dev.write(&[3u8; 4096]);
    let segs: Vec<Segment> = (0..64)
        .map(|i| Segment::new(i * 64, 4032 - i * 64, 64))
        .collect();
    // SAFETY: both buffers hold 4096 bytes; synchronized below.
    let used = unsafe {
        g.copy(
            &stream,
            host.as_mut_ptr() as u64,
            4096,
            dev.ptr,
            4096,
            &segs,
            Strategy::Auto,
        )
    }
    .expect("auto pageable");
    stream.synchronize().unwrap();
    assert_ne!(used, Strategy::Kernel);
    assert!(host.iter().all(|&b| b == 3));
}
