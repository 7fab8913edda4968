//! Fault injection on the CUDA engine. Each fault must be reported to the requests it hits
//! (a clear error, no panic, no hang), leave the engine usable (checked by copies on every
//! path afterwards), and leak nothing: ferry's threads (`ferry-*`), free device memory
//! (`cuMemGetInfo`, within `DEVICE_SLACK`) and, with the `fault-injection` feature, the driver
//! allocations ferry holds open (page-locked host, device; `ferry::fault::live`) are counted
//! before and after.
//!
//! - Device out of memory: the card filled until allocation fails, then copies, fills that need
//!   a scratch pattern block, segment lists that need the gather table, staged copies, new
//!   buffers and engines.
//! - Custom operators failing, panicking or going out of bounds in the middle of a CUDA batch
//!   (and of a CPU + CUDA multiplex batch): only their requests fail.
//! - With the cargo feature `fault-injection` (see `ferry::fault`; `scripts/gpu-bundle.sh`
//!   builds the GPU tests with it): out of memory on chunk k of a staged copy, both directions,
//!   with a dependent request; a staging worker thread panicking mid-copy; the staging thread
//!   panicking at the start of a request; the thread coordinating a staged copy panicking
//!   (each such request waited under a deadline: it used to hang); a chunk's event not
//!   recorded, or a chunk's second DMA call failing, after part of its work was enqueued (the
//!   request must complete only once every DMA it issued has ended: its stream idle, nothing
//!   pending in the null driver). With the null CUDA driver only (`cuda_common::null`): the
//!   staged path's own event, stream and context synchronizations failing.
//!
//! The tests take one lock each: they fill the card or arm process-wide faults. Prints
//! `skipped: no CUDA driver` without a GPU. With the null CUDA driver, which has no kernels,
//! the injected-fault tests check only staged copies afterwards.

mod cuda_common;
use cuda_common::*;
use ferry::cuda::{CudaEngine, CudaError, DeviceBuffer};
use ferry::{
    CpuEngine, Engine, EngineExt, Layout, MultiplexEngine, Op, OpError, Operator, Program, Request,
    RequestError, Segment,
};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

static LOCK: Mutex<()> = Mutex::new(());

/// The lock every test here runs under, or `None` after printing `skipped: no CUDA driver`.
/// Taken before anything of CUDA is made, so that no other test's threads are still exiting
/// while a test counts them.
fn serial_with_driver() -> Option<MutexGuard<'static, ()>> {
    let g = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    if ferry::cuda::probe().driver.is_err() {
        println!("skipped: no CUDA driver");
        return None;
    }
    Some(g)
}

fn quiet_panics() {
    // The injected panics are expected; keep the test output readable.
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info.payload().downcast_ref::<&str>().copied().unwrap_or("");
            if msg != "injected panic" {
                prev(info);
            }
        }));
    });
}

/// Counts taken before a fault test; `check` compares after everything was dropped.
struct Leaks {
    ferry_threads: usize,
    free: usize,
    allocs: Option<(isize, isize)>,
}

impl Leaks {
    fn start() -> Leaks {
        Leaks {
            ferry_threads: settled_threads(0, 5).1,
            free: device_free(),
            allocs: open_allocs(),
        }
    }
    fn check(self, what: &str) {
        let (_, ferry) = settled_threads(self.ferry_threads, 10);
        let free = device_free();
        println!(
            "{what}: ferry threads {} -> {ferry}; free device memory {} -> {} MiB",
            self.ferry_threads,
            self.free >> 20,
            free >> 20
        );
        assert_eq!(ferry, self.ferry_threads, "{what}: ferry threads leaked");
        let allocs = open_allocs();
        println!(
            "{what}: open allocations (pinned host, device) {:?} -> {allocs:?}",
            self.allocs
        );
        assert_eq!(allocs, self.allocs, "{what}: driver allocations left open");
        assert!(
            free + DEVICE_SLACK >= self.free,
            "{what}: device memory leaked ({} MiB free before, {} MiB after)",
            self.free >> 20,
            free >> 20
        );
    }
}

/// Every path of the engine once, each destination checked: contiguous pinned -> device, a
/// staged pageable copy both ways, a segment list device -> device (gathered), a fill with a
/// 16-byte pattern (scratch block) and one with a 4-byte pattern (memset).
fn still_works(e: &CudaEngine, seed: u64) {
    let n = 8 << 20;
    let l = Layout::bytes(n).unwrap();
    check_copy(e, Kind::Device, Kind::Pinned, &l, n, &l, n, seed);
    check_copy(e, Kind::Device, Kind::Pageable, &l, n, &l, n, seed + 1);
    check_copy(e, Kind::Pageable, Kind::Device, &l, n, &l, n, seed + 2);
    let segs: Vec<Segment> = (0..500u64)
        .map(|i| Segment::new((i * 7 % 500) * 4096, i * 4096 + 5, 1000 + i))
        .collect();
    let src_h = bytes(500 * 4096 + 600, seed + 3);
    let dst_h = bytes(500 * 4096 + 600, seed + 4);
    let mut want = dst_h.clone();
    for g in &segs {
        let (d, s, k) = (g.dst_off as usize, g.src_off as usize, g.len as usize);
        want[d..d + k].copy_from_slice(&src_h[s..s + k]);
    }
    let src = Buf::new(Kind::Device, &src_h);
    let mut dst = Buf::new(Kind::Device, &dst_h);
    e.scope(|s| {
        s.segments(&mut dst, &src, segs)
            .unwrap()
            .wait()
            .expect("segment list");
        Ok::<_, ferry::BarrierError>(())
    })
    .expect("barrier");
    assert!(dst.to_vec() == want, "segment list after the fault");
    for pat in [&[1u8, 2, 3, 4][..], &(0..16).collect::<Vec<u8>>()] {
        let fl = Layout::contiguous(&[n / 16], 16).unwrap();
        let want = reference_fill(&vec![0u8; n], &fl, &pat.repeat(16 / pat.len()));
        let mut d = Buf::new(Kind::Device, &vec![0u8; n]);
        let fl = Layout::contiguous(&[n / pat.len()], pat.len()).unwrap();
        e.scope(|s| {
            s.fill(&mut d, &fl, pat).unwrap().wait().expect("fill");
            Ok::<_, ferry::BarrierError>(())
        })
        .expect("barrier");
        assert!(
            d.to_vec() == want,
            "fill of {} bytes after the fault",
            pat.len()
        );
    }
    assert!(e.barrier().is_ok());
}

/// A submit error or a request error, as ferry's error (the driver's code kept).
fn flat<E: Into<ferry::Error>, F: Into<ferry::Error>>(
    r: Result<Result<(), F>, E>,
) -> Result<(), ferry::Error> {
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(e.into()),
    }
}

/// With the card full, an operation either works (`verify` checks its bytes) or fails with
/// the driver's out-of-memory error; anything else fails the test.
fn under_oom(
    what: &str,
    r: Result<(), ferry::Error>,
    outcomes: &mut Vec<String>,
    verify: impl FnOnce(),
) {
    match r {
        Ok(()) => {
            verify();
            outcomes.push(format!("{what}: ok, bytes checked"));
        }
        Err(e) => {
            // Matched on the driver's code, not on text.
            let oom = e.driver_error().is_some_and(|d| d.is_out_of_memory());
            assert!(oom, "{what} with the card full: {e:?}");
            outcomes.push(format!("{what}: {e}"));
        }
    }
}

/// Allocates device memory until the driver refuses even 2 MiB; returns the buffers.
fn fill_the_card() -> Vec<DeviceBuffer> {
    let mut hog = Vec::new();
    for size in [1usize << 30, 64 << 20, 2 << 20] {
        loop {
            match DeviceBuffer::new(0, size) {
                Ok(b) => hog.push(b),
                Err(CudaError::Alloc { source, .. }) => {
                    assert!(source.is_out_of_memory(), "allocation failed with {source}");
                    break;
                }
                Err(e) => panic!("allocation failed with an unexpected error: {e}"),
            }
        }
    }
    hog
}

/// The card filled: every submission either succeeds with the right bytes or fails with a
/// clear error; nothing panics; afterwards the engine works on every path and nothing leaked.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn card_filled_out_of_memory() {
    let Some(_g) = serial_with_driver() else {
        return;
    };
    let leaks = Leaks::start();
    {
        let e = cuda_engine(0).unwrap();
        let mux = MultiplexEngine::new()
            .with(CpuEngine::new(2).unwrap(), 1.0)
            .with(cuda_engine(0).unwrap(), 1.0)
            .split_bytes(1 << 20);
        let n = 4 << 20;
        let l = Layout::bytes(n).unwrap();
        let data = bytes(n, 5);
        let pinned = Buf::new(Kind::Pinned, &data);
        let mut dev_a = Buf::new(Kind::Device, &vec![0u8; n]);
        let mut dev_b = Buf::new(Kind::Device, &vec![0u8; n]);
        let mut back = vec![0u8; n];

        let total = ferry::cuda::probe().devices[0].total_mem.unwrap();
        match DeviceBuffer::new(0, total + (1 << 30)) {
            Err(CudaError::Alloc { source, .. }) => assert!(source.is_out_of_memory(), "{source}"),
            other => panic!("a buffer larger than the card: expected Alloc, got {other:?}"),
        }
        let hog = fill_the_card();
        println!(
            "card filled: {} buffers, {} MiB, {} MiB left free",
            hog.len(),
            hog.iter().map(|b| b.len()).sum::<usize>() >> 20,
            device_free() >> 20
        );

        // Copies that need no device memory of their own, then work that does (a 16-byte
        // fill's pattern block; the gather module and table of a long segment list).
        let mut outcomes = Vec::new();
        let r = e
            .scope(|s| {
                Ok::<_, ferry::BarrierError>(s.copy(&mut dev_a, &l, &pinned, &l).map(Request::wait))
            })
            .unwrap();
        under_oom("pinned -> device", flat(r), &mut outcomes, || {
            assert!(dev_a.to_vec() == data)
        });
        let r = e
            .scope(|s| {
                Ok::<_, ferry::BarrierError>(
                    s.copy(&mut back[..], &l, &dev_a, &l).map(Request::wait),
                )
            })
            .unwrap();
        under_oom("staged device -> pageable", flat(r), &mut outcomes, || {
            assert!(back == data)
        });
        let pat: Vec<u8> = (0..16).collect();
        let fl = Layout::contiguous(&[n / 16], 16).unwrap();
        for (name, engine) in [
            ("cuda", &e as &dyn Engine),
            ("multiplex", &mux as &dyn Engine),
        ] {
            let before = dev_a.to_vec();
            // SAFETY: `dev_a` is live and untouched until the request is waited here.
            let r = unsafe {
                engine.submit_raw(ferry::Job::fill(
                    ferry::MemoryMut::raw_mut(&mut dev_a),
                    fl,
                    &pat,
                ))
            };
            let r = flat(r.map(Request::wait));
            under_oom(&format!("{name}: 16-byte fill"), r, &mut outcomes, || {
                assert!(dev_a.to_vec() == reference_fill(&before, &fl, &pat))
            });
        }
        let segs: Vec<Segment> = (0..500u64)
            .map(|i| Segment::new((i * 7 % 500) * 8192, i * 8192, 4000))
            .collect();
        let r = e
            .scope(|s| {
                Ok::<_, ferry::BarrierError>({
                    s.segments(&mut dev_b, &dev_a, segs.clone())
                        .map(Request::wait)
                })
            })
            .unwrap();
        under_oom("segment list", flat(r), &mut outcomes, || {
            let (a, b) = (dev_a.to_vec(), dev_b.to_vec());
            for g in &segs {
                let (d, s, k) = (g.dst_off as usize, g.src_off as usize, g.len as usize);
                assert!(
                    b[d..d + k] == a[s..s + k],
                    "segment list with the card full"
                );
            }
        });
        // New buffers and engines: a clear error or success, never a panic.
        match DeviceBuffer::new(0, 64 << 20) {
            Err(CudaError::Alloc { source, .. }) => assert!(source.is_out_of_memory(), "{source}"),
            Ok(_) => outcomes.push("a 64 MiB buffer was allocated after all".into()),
            Err(other) => panic!("{other:?}"),
        }
        match cuda_engine(0) {
            Ok(e2) => {
                outcomes.push("a new engine opened".into());
                let r = e2
                    .scope(|s| {
                        Ok::<_, ferry::BarrierError>(
                            s.copy(&mut dev_b, &l, &pinned, &l).map(Request::wait),
                        )
                    })
                    .unwrap();
                under_oom(
                    "copy on an engine made with the card full",
                    flat(r),
                    &mut outcomes,
                    || assert!(dev_b.to_vec() == data),
                );
            }
            Err(err) => {
                outcomes.push(format!("a new engine: {err}"));
            }
        }
        for o in &outcomes {
            println!("with the card full: {o}");
        }
        drop(hog);
        still_works(&e, 100);
        // A fresh engine too (its gatherer is made now, with memory available).
        still_works(&cuda_engine(0).unwrap(), 200);
    }
    leaks.check("card filled");
}

// ---------------------------------------------------------------------------------------------
// Custom operators in the middle of a batch.

const N: usize = 1 << 20;
const POISON: u8 = 0xA5;

struct Fails;
impl Operator for Fails {
    fn name(&self) -> &str {
        "fails"
    }
    fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
        prog.fill(&Layout::bytes(1)?, &[0xEE])?;
        Err(OpError::Custom("injected failure".into()))
    }
}

struct Panics;
impl Operator for Panics {
    fn name(&self) -> &str {
        "panics"
    }
    fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
        prog.fill(&Layout::bytes(1)?, &[0xEE])?;
        panic!("injected panic")
    }
}

/// Copies 100 segments, then one past the end of the destination.
struct OutOfBounds;
impl Operator for OutOfBounds {
    fn name(&self) -> &str {
        "out-of-bounds"
    }
    fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
        let l = Layout::bytes(1000)?;
        for i in 0..100 {
            prog.copy(&l.with_offset(i * 4096)?, &l.with_offset(i * 4096)?)?;
        }
        prog.copy(&l.with_offset(N - 10)?, &l)
    }
}

/// Copies the whole buffer as 256 segments of 4 KiB (through the gatherer).
struct Pieces;
impl Operator for Pieces {
    fn name(&self) -> &str {
        "pieces"
    }
    fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
        let l = Layout::bytes(N / 256)?;
        for i in 0..256 {
            let at = i * (N / 256);
            prog.copy(&l.with_offset(at)?, &l.with_offset(at)?)?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum OpKind {
    Copy,
    Pieces,
    Fail,
    Panic,
    OutOfBounds,
}

fn op_for(k: OpKind) -> Op {
    let l = Layout::bytes(N).unwrap();
    match k {
        OpKind::Copy => Op::Copy { dst: l, src: l },
        OpKind::Pieces => Op::Custom(Arc::new(Pieces)),
        OpKind::Fail => Op::Custom(Arc::new(Fails)),
        OpKind::Panic => Op::Custom(Arc::new(Panics)),
        OpKind::OutOfBounds => Op::Custom(Arc::new(OutOfBounds)),
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn custom_operator_faults_fail_only_their_requests() {
    let Some(_g) = serial_with_driver() else {
        return;
    };
    quiet_panics();
    let leaks = Leaks::start();
    {
        let engines: Vec<(&str, Box<dyn Engine>)> = vec![
            ("cuda", Box::new(cuda_engine(0).unwrap())),
            (
                "multiplex cpu+cuda",
                Box::new(
                    MultiplexEngine::new()
                        .with(CpuEngine::new(2).unwrap(), 1.0)
                        .with(cuda_engine(0).unwrap(), 1.0)
                        .split_bytes(256 << 10),
                ),
            ),
        ];
        let kinds = [
            OpKind::Copy,
            OpKind::Fail,
            OpKind::Pieces,
            OpKind::Panic,
            OpKind::Copy,
            OpKind::OutOfBounds,
        ];
        for (name, engine) in &engines {
            for (dk, sk) in [
                (Kind::Device, Kind::Pinned),
                (Kind::Pinned, Kind::Device),
                (Kind::Device, Kind::Device),
                (Kind::Managed, Kind::Mapped),
            ] {
                let src_h = bytes(N, 17);
                let src = Buf::new(sk, &src_h);
                let mut dsts: Vec<Buf> = (0..24).map(|_| Buf::new(dk, &[POISON; N])).collect();
                let results: Vec<(OpKind, Result<(), RequestError>)> = engine
                    .scope(|s| {
                        Ok::<_, ferry::BarrierError>({
                            let reqs: Vec<(OpKind, Request)> = dsts
                                .iter_mut()
                                .enumerate()
                                .map(|(k, d)| {
                                    let kind = kinds[k % kinds.len()];
                                    let r = s.submit(d, Some(&src), op_for(kind), &[]);
                                    (kind, r.expect("submit"))
                                })
                                .collect();
                            reqs.into_iter().map(|(k, r)| (k, r.wait())).collect()
                        })
                    })
                    .expect("every failure was observed by wait: the barrier is clean");
                for (k, ((kind, r), d)) in results.iter().zip(&dsts).enumerate() {
                    let ctx = format!("{name} {dk:?} <- {sk:?} request {k} ({kind:?})");
                    let got = d.to_vec();
                    match kind {
                        OpKind::Copy | OpKind::Pieces => {
                            assert_eq!(r, &Ok(()), "{ctx}");
                            assert!(got == src_h, "{ctx}: destination differs");
                        }
                        OpKind::Fail | OpKind::Panic | OpKind::OutOfBounds => {
                            let ok = match (kind, r) {
                                (OpKind::Fail, Err(RequestError::Operator { op, msg })) => {
                                    op == "fails" && msg.contains("injected failure")
                                }
                                (OpKind::Panic, Err(RequestError::Panicked { op, msg })) => {
                                    op == "panics" && msg == "injected panic"
                                }
                                (OpKind::OutOfBounds, Err(RequestError::Operator { op, .. })) => {
                                    op == "out-of-bounds"
                                }
                                _ => false,
                            };
                            assert!(ok, "{ctx}: {r:?}");
                            assert!(
                                got.iter().all(|&b| b == POISON),
                                "{ctx}: a failed request wrote its destination"
                            );
                        }
                    }
                }
            }
            assert!(engine.barrier().is_ok(), "{name}");
        }
        still_works(&cuda_engine(0).unwrap(), 300);
    }
    leaks.check("custom operator faults");
}

// ---------------------------------------------------------------------------------------------
// Injected faults in the staged path (feature `fault-injection`).

#[cfg(feature = "fault-injection")]
mod injected {
    use super::*;
    use ferry::cuda::PinnedBuffer;
    use ferry::cuda::StagingConfig;
    use ferry::fault::{arm, disarm_all, is_armed, Fault};

    /// 64 MiB in 4 MiB chunks (16 chunks), ring of 3, 4 workers.
    fn engine() -> CudaEngine {
        let st = StagingConfig::new()
            .chunk_bytes(4 << 20)
            .ring_depth(3)
            .threads(4);
        CudaEngine::with_config(cuda_config(0).staging(Some(st))).unwrap()
    }

    const M: usize = 64 << 20;

    /// The results of a staged copy and of its dependent, the destination's bytes, and the
    /// bytes it should hold.
    type Pair = (
        Result<(), RequestError>,
        Result<(), RequestError>,
        Vec<u8>,
        Vec<u8>,
    );

    /// One staged copy of `M` bytes in direction `h2d` (pageable <-> device), with a dependent
    /// device-side copy after it.
    fn staged_pair(e: &CudaEngine, h2d: bool, seed: u64) -> Pair {
        let data = bytes(M, seed);
        let l = Layout::bytes(M).unwrap();
        if h2d {
            let src = data.clone();
            let mut dev = DeviceBuffer::new(0, M).unwrap();
            let mut out = PinnedBuffer::new(M).unwrap();
            let d = ferry::MemoryMut::raw_mut(&mut dev);
            let o = ferry::MemoryMut::raw_mut(&mut out);
            let h = ferry::RawBuf::host(src.as_ptr(), M, ferry::MemKind::Pageable);
            // SAFETY: `src`, `dev` and `out` outlive both requests, which are waited here;
            // `dev` is written by `a` and read by `b` only after `a` (its dependency).
            let (a, b) = unsafe {
                let a = e.submit_raw(ferry::Job::copy(d, l, h, l)).unwrap();
                let b = e
                    .submit_raw(ferry::Job::copy(o, l, d, l).after(&a))
                    .unwrap();
                (a.wait(), b.wait())
            };
            let got = dev.to_vec().unwrap();
            (a, b, got, data)
        } else {
            let dev = DeviceBuffer::from_host(0, &data).unwrap();
            let mut host = vec![POISON; M];
            let mut dev2 = DeviceBuffer::new(0, 4096).unwrap();
            let small = Layout::bytes(4096).unwrap();
            let (a, b) = e
                .scope(|s| {
                    Ok::<_, ferry::BarrierError>({
                        let a = s.copy(&mut host[..], &l, &dev, &l).unwrap();
                        let b = s
                            .submit(
                                &mut dev2,
                                Some(&dev),
                                Op::Copy {
                                    dst: small,
                                    src: small,
                                },
                                &[&a],
                            )
                            .unwrap();
                        (a.wait(), b.wait())
                    })
                })
                .unwrap_or_else(|e| panic!("barrier: {e}"));
            (a, b, host, data)
        }
    }

    /// Out of memory on chunk k of a staged copy, both directions: the request fails with the
    /// driver's error, its dependent fails as such, the next copy is correct, nothing leaks.
    #[test]
    #[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
    fn staged_chunk_out_of_memory() {
        let Some(_g) = serial_with_driver() else {
            return;
        };
        let leaks = Leaks::start();
        {
            let e = engine();
            for h2d in [true, false] {
                for k in [0usize, 1, 5, 15] {
                    let what = format!("{} chunk {k}", if h2d { "h2d" } else { "d2h" });
                    arm(Fault::StagedChunk, k);
                    let (a, b, _, _) = staged_pair(&e, h2d, k as u64);
                    let fired = !is_armed(Fault::StagedChunk);
                    disarm_all();
                    assert!(fired, "{what}: the copy had fewer chunks than expected");
                    match a.as_ref().map_err(RequestError::driver_error) {
                        Err(Some(d)) => {
                            assert!(d.is_out_of_memory(), "{what}: {d}");
                        }
                        other => panic!("{what}: expected the injected error, got {other:?}"),
                    }
                    assert!(
                        matches!(b, Err(RequestError::Dependency(_))),
                        "{what}: dependent got {b:?}"
                    );
                    let (a, b, got, want) = staged_pair(&e, h2d, 1000 + k as u64);
                    assert_eq!((a, b), (Ok(()), Ok(())), "{what}: the copy after");
                    assert!(got == want, "{what}: the copy after the fault differs");
                }
            }
            staged_still_work(&e, 400);
            if !null::is_null_driver() {
                still_works(&e, 400);
            }
        }
        leaks.check("staged chunk out of memory");
    }

    /// A staging worker thread panics in the middle of a copy (the 6th part: chunk 1, part 1 of
    /// 4): the request fails, the pool keeps its threads,
    /// the next copies are correct.
    #[test]
    #[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
    fn staging_worker_panics() {
        let Some(_g) = serial_with_driver() else {
            return;
        };
        quiet_panics();
        let leaks = Leaks::start();
        {
            let e = engine();
            for h2d in [true, false] {
                let what = if h2d { "h2d" } else { "d2h" };
                // The pool exists once a copy ran; count the threads with it.
                let (a, _, _, _) = staged_pair(&e, h2d, 7);
                assert_eq!(a, Ok(()));
                let before = (threads().1, host_workers().0);
                arm(Fault::StagingWorkerPanic, 5);
                let (a, b, _, _) = staged_pair(&e, h2d, 8);
                let fired = !is_armed(Fault::StagingWorkerPanic);
                disarm_all();
                assert!(fired, "{what}: the worker fault point was never reached");
                match &a {
                    Err(RequestError::Panicked { msg, .. }) => {
                        assert!(msg.contains("panicked"), "{what}: {msg}")
                    }
                    other => panic!("{what}: expected a worker panic error, got {other:?}"),
                }
                assert!(
                    matches!(b, Err(RequestError::Dependency(_))),
                    "{what}: {b:?}"
                );
                assert_eq!(threads().1, before.0, "{what}: a ferry thread was lost");
                // The process's host copy workers stay (a panic is caught on its worker); more may
                // start meanwhile, up to the cores.
                let host = host_workers().0;
                assert!(
                    (before.1..=cores()).contains(&host),
                    "{what}: a staging worker was lost: host copy workers {} -> {host}",
                    before.1
                );
                let (a, b, got, want) = staged_pair(&e, h2d, 9);
                assert_eq!((a, b), (Ok(()), Ok(())), "{what}: the copy after");
                assert!(got == want, "{what}: the copy after the panic differs");
            }
            staged_still_work(&e, 500);
            if !null::is_null_driver() {
                still_works(&e, 500);
            }
        }
        leaks.check("staging worker panics");
    }

    /// How long a staged request of these tests may take before the test calls it hung.
    const HUNG: std::time::Duration = std::time::Duration::from_secs(30);

    /// Runs `f` on a thread of its own and returns its result, or fails the test naming
    /// `what` if it has not returned within [`HUNG`] (a deadlock: the thread is left behind,
    /// holding what it holds, so that nothing here waits for it).
    fn deadline<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
        });
        match rx.recv_timeout(HUNG) {
            Ok(Ok(v)) => v,
            Ok(Err(p)) => std::panic::resume_unwind(p),
            Err(_) => panic!("{what}: no result after {HUNG:?}: the staged copy hangs"),
        }
    }

    /// Staged copies of `M` bytes both ways (pageable <-> device), each checked: what is left
    /// of [`still_works`] with the null CUDA driver, which has no kernels or memsets.
    fn staged_still_work(e: &CudaEngine, seed: u64) {
        for h2d in [true, false] {
            let (a, b, got, want) = staged_pair(e, h2d, seed + u64::from(h2d));
            assert_eq!(
                (a, b),
                (Ok(()), Ok(())),
                "h2d {h2d}: a staged copy after the fault"
            );
            assert!(
                got == want,
                "h2d {h2d}: a staged copy after the fault differs"
            );
        }
    }

    /// The thread that coordinates a staged copy panics as it issues chunk k's device side,
    /// both directions: the request fails with the panic, within a deadline (it used to hang:
    /// the workers, never told to stop, waited for chunks the coordinator would open, and the
    /// pool waited for them while holding the ring), with none of its DMAs left (with the null
    /// driver: nothing pending), its dependent fails as such, no staging worker is lost, the
    /// next copies are correct, nothing leaks.
    #[test]
    #[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
    fn staging_coordinator_panics() {
        let Some(_g) = serial_with_driver() else {
            return;
        };
        quiet_panics();
        let leaks = Leaks::start();
        {
            let e = Arc::new(engine());
            for h2d in [true, false] {
                // The pool exists once a copy ran; count the threads with it.
                let (a, _, _, _) = staged_pair(&e, h2d, 20);
                assert_eq!(a, Ok(()));
                let before = (threads().1, host_workers().0);
                for k in [0usize, 2, 7] {
                    let what = format!("{} chunk {k}", if h2d { "h2d" } else { "d2h" });
                    arm(Fault::StagingCoordinatorPanic, k);
                    let e2 = Arc::clone(&e);
                    let (a, b, _, _) =
                        deadline(&what, move || staged_pair(&e2, h2d, 21 + k as u64));
                    let pending = null::pending();
                    let fired = !is_armed(Fault::StagingCoordinatorPanic);
                    disarm_all();
                    assert!(
                        pending.is_none_or(|n| n == 0),
                        "{what}: {pending:?} operations pending in the null driver after the panic"
                    );
                    assert!(fired, "{what}: the copy had fewer chunks than expected");
                    match &a {
                        Err(RequestError::Panicked { op, msg }) => {
                            assert_eq!(op, "staged copy", "{what}");
                            assert_eq!(msg, "injected panic", "{what}");
                        }
                        other => panic!("{what}: expected the coordinator's panic, got {other:?}"),
                    }
                    assert!(
                        matches!(b, Err(RequestError::Dependency(_))),
                        "{what}: dependent got {b:?}"
                    );
                    assert_eq!(threads().1, before.0, "{what}: a ferry thread was lost");
                    // The process's host copy workers stay (a panic is caught on its worker); more may
                    // start meanwhile, up to the cores.
                    let host = host_workers().0;
                    assert!(
                        (before.1..=cores()).contains(&host),
                        "{what}: a staging thread was lost: host copy workers {} -> {host}",
                        before.1
                    );
                    let e2 = Arc::clone(&e);
                    let (a, b, got, want) =
                        deadline(&what, move || staged_pair(&e2, h2d, 40 + k as u64));
                    assert_eq!((a, b), (Ok(()), Ok(())), "{what}: the copy after");
                    assert!(got == want, "{what}: the copy after the panic differs");
                }
            }
            staged_still_work(&e, 700);
            if !null::is_null_driver() {
                still_works(&e, 700);
            }
        }
        leaks.check("staging coordinator panics");
    }

    /// One staged copy of these tests: `M` bytes pageable <-> device, as one plan, or as a
    /// segment list of 1 MiB runs spread over a device buffer of twice the size (not adjacent
    /// there, so each is its own DMA: four driver calls per 4 MiB chunk).
    struct Staged {
        h2d: bool,
        list: bool,
        /// The pageable side.
        host: Vec<u8>,
        dev: DeviceBuffer,
    }

    const RUN: usize = 1 << 20;

    impl Staged {
        /// Source bytes from `seed`, destination poisoned.
        fn new(h2d: bool, list: bool, seed: u64) -> Staged {
            let dev_len = if list { 2 * M } else { M };
            let data = bytes(M, seed);
            let (host, dev) = if h2d {
                (
                    data,
                    DeviceBuffer::from_host(0, &vec![POISON; dev_len]).unwrap(),
                )
            } else {
                let mut d = vec![POISON; dev_len];
                if list {
                    for (i, c) in data.chunks(RUN).enumerate() {
                        d[2 * i * RUN..2 * i * RUN + RUN].copy_from_slice(c);
                    }
                } else {
                    d.copy_from_slice(&data);
                }
                (vec![POISON; M], DeviceBuffer::from_host(0, &d).unwrap())
            };
            Staged {
                h2d,
                list,
                host,
                dev,
            }
        }
        /// Submits the copy (on the calling thread's stream of its direction).
        fn submit(&mut self, e: &CudaEngine) -> Request {
            let d = ferry::MemoryMut::raw_mut(&mut self.dev);
            let h = ferry::RawBuf::host(self.host.as_mut_ptr(), M, ferry::MemKind::Pageable);
            let (dst, src) = if self.h2d { (d, h) } else { (h, d) };
            let op = if self.list {
                let segs: Vec<Segment> = (0..(M / RUN) as u64)
                    .map(|i| {
                        let (dev, host) = (2 * i * RUN as u64, i * RUN as u64);
                        if self.h2d {
                            Segment::new(dev, host, RUN as u64)
                        } else {
                            Segment::new(host, dev, RUN as u64)
                        }
                    })
                    .collect();
                Op::Segments(segs.into())
            } else {
                let l = Layout::bytes(M).unwrap();
                Op::Copy { dst: l, src: l }
            };
            let job = ferry::Job {
                dst,
                src: Some(src),
                op,
                after: Vec::new(),
            };
            // SAFETY: both buffers belong to `self`, which the callers keep alive and untouched
            // until the request has completed (they wait for it before anything else).
            unsafe { e.submit_raw(job) }.expect("submit")
        }
        /// The destination's bytes (a list's device side in packed order).
        fn got(&self) -> Vec<u8> {
            if self.h2d {
                packed(self.dev.to_vec().unwrap(), self.list)
            } else {
                self.host.clone()
            }
        }
        /// The source's bytes (a list's device side in packed order).
        fn want(&self) -> Vec<u8> {
            if self.h2d {
                self.host.clone()
            } else {
                packed(self.dev.to_vec().unwrap(), self.list)
            }
        }
        /// Overwrites the destination with `pattern` bytes, past any stream of the engine
        /// (a synchronous copy on the legacy stream, which the engine's non-blocking streams do
        /// not wait for; a plain write of host memory).
        fn overwrite(&mut self, pattern: u8) {
            if self.h2d {
                let n = self.dev.len();
                self.dev.copy_from_host(&vec![pattern; n]).unwrap();
            } else {
                self.host.fill(pattern);
            }
        }
        /// Whether the destination still holds only `pattern` bytes.
        fn holds(&self, pattern: u8) -> bool {
            let all = if self.h2d {
                self.dev.to_vec().unwrap()
            } else {
                self.host.clone()
            };
            all.iter().all(|&b| b == pattern)
        }
    }

    /// The device side's bytes of a [`Staged`] copy in packed order: for a list, the first
    /// half of every 2 MiB.
    fn packed(dev: Vec<u8>, list: bool) -> Vec<u8> {
        if !list {
            return dev;
        }
        dev.chunks(2 * RUN)
            .flat_map(|c| c[..RUN].to_vec())
            .collect()
    }

    /// The engine's direction of a staged copy.
    fn dir(h2d: bool) -> ferry::cuda::Direction {
        if h2d {
            ferry::cuda::Direction::HostToDevice
        } else {
            ferry::cuda::Direction::DeviceToHost
        }
    }

    /// The call named by a request's driver error, or a panic naming `what`.
    fn failed_call(what: &str, r: &Result<(), RequestError>) -> &'static str {
        match r.as_ref().map_err(RequestError::driver_error) {
            Err(Some(d)) => d.call,
            _ => panic!("{what}: expected a driver error, got {r:?}"),
        }
    }

    /// What of a staged copy may still run on `stream` (the copy's) the moment its request
    /// has returned: `None` if nothing (the stream is idle; with the null CUDA driver, no
    /// operation is pending either).
    fn still_running(stream: &cudarc::driver::CudaStream) -> Option<String> {
        if let Some(n) = null::pending().filter(|&n| n > 0) {
            return Some(format!("{n} operations pending in the null driver"));
        }
        // SAFETY: a live stream of the engine, queried only.
        let q = unsafe { cudarc::driver::sys::cuStreamQuery(stream.cu_stream()) };
        (q != cudarc::driver::sys::CUresult::CUDA_SUCCESS)
            .then(|| format!("the copy's stream is not idle: {q:?}"))
    }

    /// A staged copy fails after a chunk's device side was (partly) enqueued: its event could
    /// not be recorded after its DMA (plans), or its second driver call failed after the first
    /// was enqueued (segment lists, four calls per chunk). Both directions, early and late
    /// chunks. The request fails with that driver error, and only once every DMA it issued has
    /// ended: its stream is idle when `wait` returns (those DMAs used to be left running: the
    /// slot was never marked pending, so the drain skipped it), and a destination overwritten
    /// right then keeps what it was given while the next copy, which refills the ring, runs;
    /// that copy is correct; nothing leaks.
    #[test]
    #[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
    fn staged_failure_waits_for_its_dmas() {
        let Some(_g) = serial_with_driver() else {
            return;
        };
        let leaks = Leaks::start();
        {
            let e = engine();
            for (fault, list) in [(Fault::StagedRecord, false), (Fault::StagedDma, true)] {
                for h2d in [true, false] {
                    let stream = Arc::clone(e.stream(dir(h2d)));
                    for k in [0usize, 3, 10] {
                        let what = format!("{fault:?}, h2d {h2d}, chunk {k}");
                        let mut failed = Staged::new(h2d, list, k as u64);
                        // A list's chunk k makes calls 4k .. 4k + 3: its second fails.
                        arm(fault, if list { 4 * k + 1 } else { k });
                        let r = failed.submit(&e).wait();
                        let running = still_running(&stream);
                        let fired = !is_armed(fault);
                        disarm_all();
                        assert!(fired, "{what}: the copy had fewer chunks than expected");
                        let call = match (fault, h2d) {
                            (Fault::StagedRecord, _) => "cuEventRecord",
                            (_, true) => "cuMemcpyHtoDAsync",
                            (_, false) => "cuMemcpyDtoHAsync",
                        };
                        assert_eq!(failed_call(&what, &r), call, "{what}: {r:?}");
                        assert_eq!(
                            running, None,
                            "{what}: the request completed before its DMAs"
                        );
                        failed.overwrite(0x3C);
                        let mut next = Staged::new(h2d, list, 100 + k as u64);
                        let r = next.submit(&e).wait();
                        assert_eq!(r, Ok(()), "{what}: the copy after");
                        assert!(next.got() == next.want(), "{what}: the copy after differs");
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        assert!(
                            failed.holds(0x3C),
                            "{what}: the failed copy's destination was written after it completed"
                        );
                    }
                }
            }
            staged_still_work(&e, 800);
            if !null::is_null_driver() {
                still_works(&e, 800);
            }
        }
        leaks.check("staged failure waits for its DMAs");
    }

    /// The staged path's own waits fail (null CUDA driver only, in its asynchronous mode: its
    /// injected driver failures), both directions. A slot's `cuEventSynchronize` fails in the
    /// drain: the copy still ends every DMA it issued before it completes, through the stream
    /// (the failed wait used to forget the slot first, and the copy completed with its last
    /// DMAs queued). A chunk's event cannot be recorded and `cuStreamSynchronize` fails too:
    /// the context is synchronized instead. Even `cuCtxSynchronize` fails: the copy completes
    /// with its error, and the next copy synchronizes the context before it touches the ring;
    /// while that fails too the copy is refused (its destination untouched), and the one after
    /// copies correctly.
    #[test]
    #[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
    fn staged_wait_failures_fall_back_to_synchronizing() {
        let Some(_g) = serial_with_driver() else {
            return;
        };
        let _null = null::exclusive();
        if !null::is_null_driver() {
            println!("skipped: needs the null CUDA driver (its control API)");
            return;
        }
        null::set_async(500);
        let code = cudarc::driver::sys::CUresult::CUDA_ERROR_UNKNOWN;
        let leaks = Leaks::start();
        {
            let e = engine();
            for h2d in [true, false] {
                let stream = Arc::clone(e.stream(dir(h2d)));
                let dma = if h2d {
                    "cuMemcpyHtoDAsync"
                } else {
                    "cuMemcpyDtoHAsync"
                };

                // The drain's first event wait fails. Host -> device, the drain waits for the
                // last chunks in flight; device -> host, the coordinator waits for every chunk
                // itself, so a DMA fails first (chunk 5) and the drain waits for those before.
                let what = format!("h2d {h2d}: cuEventSynchronize fails");
                let mut failed = Staged::new(h2d, false, 1);
                if !h2d {
                    arm(Fault::StagedDma, 5);
                }
                assert!(null::fail("cuEventSynchronize", 1, code));
                let r = failed.submit(&e).wait();
                let running = still_running(&stream);
                disarm_all();
                null::clear();
                let want = if h2d { "cuEventSynchronize" } else { dma };
                assert_eq!(failed_call(&what, &r), want, "{what}: {r:?}");
                assert_eq!(
                    running, None,
                    "{what}: the request completed before its DMAs"
                );

                // A chunk's event is not recorded, and the stream cannot be synchronized.
                let what = format!("h2d {h2d}: cuEventRecord and cuStreamSynchronize fail");
                let mut failed = Staged::new(h2d, false, 2);
                arm(Fault::StagedRecord, 5);
                assert!(null::fail("cuStreamSynchronize", 1, code));
                let r = failed.submit(&e).wait();
                let running = still_running(&stream);
                disarm_all();
                null::clear();
                assert_eq!(failed_call(&what, &r), "cuEventRecord", "{what}: {r:?}");
                assert_eq!(
                    running, None,
                    "{what}: the request completed before its DMAs"
                );

                // Nor the context: the copy cannot know its DMAs ended, and says its own error.
                let what = format!("h2d {h2d}: no synchronization works");
                let mut failed = Staged::new(h2d, false, 3);
                arm(Fault::StagedRecord, 5);
                assert!(null::fail("cuStreamSynchronize", 1, code));
                assert!(null::fail("cuCtxSynchronize", 1, code));
                let r = failed.submit(&e).wait();
                disarm_all();
                null::clear();
                assert_eq!(failed_call(&what, &r), "cuEventRecord", "{what}: {r:?}");
                // The next copy first synchronizes the context; while that fails, it is refused
                // before it touches the ring or its buffers.
                let mut refused = Staged::new(h2d, false, 4);
                assert!(null::fail("cuCtxSynchronize", 1, code));
                let r = refused.submit(&e).wait();
                null::clear();
                assert_eq!(failed_call(&what, &r), "cuCtxSynchronize", "{what}: {r:?}");
                assert!(
                    refused.holds(POISON),
                    "{what}: a refused copy wrote its destination"
                );
                let mut next = Staged::new(h2d, false, 5);
                let r = next.submit(&e).wait();
                assert_eq!(r, Ok(()), "{what}: the copy after");
                assert!(next.got() == next.want(), "{what}: the copy after differs");
                assert_eq!(still_running(&stream), None, "{what}: the copy after");
            }
            staged_still_work(&e, 900);
        }
        leaks.check("staged wait failures");
    }

    /// The staging thread itself panics at the start of a request: that request fails (it
    /// does not hang), the thread goes on, the next staged copies are correct.
    #[test]
    #[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
    fn staging_thread_panics() {
        let Some(_g) = serial_with_driver() else {
            return;
        };
        quiet_panics();
        let leaks = Leaks::start();
        {
            let e = engine();
            for h2d in [true, false] {
                let what = if h2d { "h2d" } else { "d2h" };
                arm(Fault::StagingThreadPanic, 0);
                let (a, b, _, _) = staged_pair(&e, h2d, 11);
                let fired = !is_armed(Fault::StagingThreadPanic);
                disarm_all();
                assert!(fired, "{what}: the staged request never reached its thread");
                match &a {
                    Err(RequestError::Panicked { op, msg }) => {
                        assert_eq!(op, "staged copy", "{what}");
                        assert_eq!(msg, "injected panic", "{what}");
                    }
                    other => panic!("{what}: expected the staging thread's panic, got {other:?}"),
                }
                assert!(
                    matches!(b, Err(RequestError::Dependency(_))),
                    "{what}: {b:?}"
                );
                let (a, b, got, want) = staged_pair(&e, h2d, 12);
                assert_eq!((a, b), (Ok(()), Ok(())), "{what}: the copy after");
                assert!(got == want, "{what}: the copy after the panic differs");
            }
            staged_still_work(&e, 600);
            if !null::is_null_driver() {
                still_works(&e, 600);
            }
        }
        leaks.check("staging thread panics");
    }
}
