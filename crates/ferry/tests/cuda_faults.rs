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
//!   panicking at the start of a request.
//!
//! The tests take one lock each: they fill the card or arm process-wide faults. Prints
//! `skipped: no CUDA driver` without a GPU.

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
    use ferry::cuda::staged::StagingConfig;
    use ferry::cuda::PinnedBuffer;
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
                    match &a {
                        Err(RequestError::Driver(d)) => {
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
            still_works(&e, 400);
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
                let before = threads().1;
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
                assert_eq!(threads().1, before, "{what}: a staging worker was lost");
                let (a, b, got, want) = staged_pair(&e, h2d, 9);
                assert_eq!((a, b), (Ok(()), Ok(())), "{what}: the copy after");
                assert!(got == want, "{what}: the copy after the panic differs");
            }
            still_works(&e, 500);
        }
        leaks.check("staging worker panics");
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
            still_works(&e, 600);
        }
        leaks.check("staging thread panics");
    }
}
