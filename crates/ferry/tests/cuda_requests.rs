//! Requests on the CUDA engine: dependencies across streams and engines, futures, barriers,
//! many threads, wait modes, drops with work in flight. Prints `skipped: no CUDA driver`
//! without a GPU.

mod cuda_common;
use cuda_common::*;
use ferry::cuda::{CudaEngine, DeviceBuffer, Direction, PinnedBuffer, WaitMode};
use ferry::op::Op;
use ferry::{CpuEngine, Engine, EngineExt, Layout, Request, RequestError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn copy_op(n: usize) -> Op {
    let l = Layout::bytes(n).unwrap();
    Op::Copy { dst: l, src: l }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn chain_across_streams_runs_in_order() {
    let Some(e) = cuda_or_skip() else { return };
    // H2D, then D2D, then D2H: three streams, ordered only by event dependencies.
    let n = 64 << 20;
    for round in 0..3u64 {
        let data = bytes(n, 7 + round);
        let mut host = PinnedBuffer::new(n).unwrap();
        host.copy_from_slice(&data);
        let mut a = DeviceBuffer::new(0, n).unwrap();
        let mut b = DeviceBuffer::new(0, n).unwrap();
        let mut back = PinnedBuffer::new(n).unwrap();
        // SAFETY: each buffer is written by one request and read only by requests ordered
        // after it; all outlive the barrier below, and nothing else touches them meanwhile.
        unsafe {
            let r1 = copy_raw(&e, dev_raw(&mut a), staging_raw(&host), &[]);
            let r2 = copy_raw(&e, dev_raw(&mut b), dev_ro(&a), &[&r1]);
            let r3 = copy_raw(&e, pinned_raw(&mut back), dev_ro(&b), &[&r2]);
            r3.wait().unwrap();
        }
        e.barrier().unwrap();
        assert!(
            back[..] == data[..],
            "round {round}: chained copies out of order"
        );
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn host_dependency_and_failed_dependency() {
    let Some(e) = cuda_or_skip() else { return };
    let cpu = CpuEngine::new(2).unwrap();
    let n = 16 << 20;
    let data = bytes(n, 11);
    let mut staging = PinnedBuffer::new(n).unwrap();
    let mut dev = DeviceBuffer::new(0, n).unwrap();
    // A CPU request fills the pinned buffer; the GPU copy waits for it on the host.
    // SAFETY: `staging` is written by the CPU request and then only read by the GPU request,
    // which starts after it; all buffers outlive both waits and nothing else touches them.
    unsafe {
        let l = Layout::bytes(n).unwrap();
        let d = ferry::RawBuf::host(data.as_ptr(), n, ferry::MemKind::Pageable);
        let fill = cpu
            .submit_raw(ferry::Job::copy(pinned_raw(&mut staging), l, d, l))
            .unwrap();
        let r = copy_raw(&e, dev_raw(&mut dev), staging_raw(&staging), &[&fill]);
        r.wait().unwrap();
        fill.wait().unwrap();
    }
    assert!(dev.to_vec().unwrap() == data);
    // A failed dependency fails the dependent request without running it.
    let failed = Request::ready(Err(RequestError::Aborted("test".into())));
    let before = dev.to_vec().unwrap();
    let src = bytes(n, 12);
    e.scope(|s| {
        let r = s
            .submit(&mut dev, Some(&src[..]), copy_op(n), &[&failed])
            .unwrap();
        assert!(matches!(r.wait(), Err(RequestError::Dependency(_))));
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
    assert!(
        dev.to_vec().unwrap() == before,
        "a request whose dependency failed must not run"
    );
}

/// Submits a flat copy of all of `src` after `after`.
///
/// # Safety
/// As [`Engine::submit_raw`].
unsafe fn copy_raw(
    e: &dyn Engine,
    dst: ferry::RawBuf,
    src: ferry::RawBuf,
    after: &[&Request],
) -> Request {
    let l = Layout::bytes(src.len).unwrap();
    let mut job = ferry::Job::copy(dst, l, src, l);
    for r in after {
        job = job.after(r);
    }
    // SAFETY: the caller's guarantees.
    unsafe { e.submit_raw(job) }.unwrap()
}

fn dev_ro(d: &DeviceBuffer) -> ferry::RawBuf {
    use ferry::Memory;
    d.raw()
}
fn pinned_raw(p: &mut PinnedBuffer) -> ferry::RawBuf {
    use ferry::MemoryMut;
    p.raw_mut()
}
fn dev_raw(d: &mut DeviceBuffer) -> ferry::RawBuf {
    use ferry::MemoryMut;
    d.raw_mut()
}
fn staging_raw(p: &PinnedBuffer) -> ferry::RawBuf {
    use ferry::Memory;
    p.raw()
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn futures_complete() {
    let Some(e) = cuda_or_skip() else { return };
    let n = 32 << 20;
    let data = bytes(n, 21);
    let mut dev = DeviceBuffer::new(0, n).unwrap();
    let mut back = vec![0u8; n];
    e.scope(|s| {
        let r = s.memcpy(&mut dev, &data[..]).unwrap();
        block_on(r).unwrap();
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
    e.scope(|s| {
        let r = s.memcpy(&mut back[..], &dev).unwrap();
        block_on(r).unwrap();
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
    assert!(back == data);
    // Many futures at once, awaited in reverse order.
    let srcs: Vec<Vec<u8>> = (0..16).map(|i| bytes(1 << 20, 30 + i)).collect();
    let mut devs: Vec<DeviceBuffer> = (0..16)
        .map(|_| DeviceBuffer::new(0, 1 << 20).unwrap())
        .collect();
    e.scope(|s| {
        {
            let mut reqs: Vec<Request> = devs
                .iter_mut()
                .zip(&srcs)
                .map(|(d, h)| s.memcpy(d, &h[..]).unwrap())
                .collect();
            while let Some(r) = reqs.pop() {
                block_on(r).unwrap();
            }
        }
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
    for (d, h) in devs.iter().zip(&srcs) {
        assert!(d.to_vec().unwrap() == *h);
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn barrier_after_many_requests() {
    let Some(e) = cuda_or_skip() else { return };
    let k = 2000;
    let src = bytes(k * 512, 41);
    let mut dev = DeviceBuffer::new(0, k * 512).unwrap();
    {
        let (sl, dl) = (Layout::bytes(512).unwrap(), Layout::bytes(512).unwrap());
        let raw_d = dev_raw(&mut dev);
        for i in 0..k {
            let d = ferry::RawBuf {
                addr: raw_d.addr + (i * 512) as u64,
                len: 512,
                kind: raw_d.kind,
            };
            let s = ferry::RawBuf::host(src[i * 512..].as_ptr(), 512, ferry::MemKind::Pageable);
            // SAFETY: disjoint 512-byte pieces of `dev` and `src`, both alive and untouched
            // until the barrier below; requests are dropped, the barrier waits for them.
            let r = unsafe { e.submit_raw(ferry::Job::copy(d, dl, s, sl)) }.unwrap();
            drop(r);
        }
        e.barrier().unwrap();
    }
    assert!(dev.to_vec().unwrap() == src);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn many_threads_submit_at_once() {
    let Some(e) = cuda_or_skip() else { return };
    let e = Arc::new(e);
    std::thread::scope(|ts| {
        for t in 0..8u64 {
            let e = Arc::clone(&e);
            ts.spawn(move || {
                let n = (1 << 20) + t as usize * 4099;
                let mut dev = DeviceBuffer::new(0, n).unwrap();
                for i in 0..25 {
                    let data = bytes(n, 1000 * t + i);
                    let mut back = PinnedBuffer::new(n).unwrap();
                    let src = ferry::RawBuf::host(data.as_ptr(), n, ferry::MemKind::Pageable);
                    // SAFETY: `dev` is written by `up` and read by `down`, ordered after it;
                    // every buffer outlives both waits and nothing else touches them.
                    unsafe {
                        let up = copy_raw(&*e, dev_raw(&mut dev), src, &[]);
                        let down = copy_raw(&*e, pinned_raw(&mut back), dev_ro(&dev), &[&up]);
                        down.wait().unwrap();
                        up.wait().unwrap();
                    }
                    assert!(back[..] == data[..], "thread {t} round {i}");
                }
            });
        }
    });
    e.barrier().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn spin_mode_and_forced_direction() {
    if cuda_or_skip().is_none() {
        return;
    }
    for cfg in [
        cuda_config(0).wait_mode(WaitMode::Spin),
        cuda_config(0).direction(Direction::DeviceToDevice),
        cuda_config(0)
            .wait_mode(WaitMode::Spin)
            .direction(Direction::HostToDevice),
        cuda_config(0).wait_mode(WaitMode::SpinThenBlock(std::time::Duration::from_micros(
            20,
        ))),
    ] {
        let e = CudaEngine::with_config(cfg).unwrap();
        for (i, &k) in [Kind::Pageable, Kind::Pinned, Kind::Device]
            .iter()
            .enumerate()
        {
            let l = Layout::bytes(3 << 20).unwrap();
            check_copy(&e, Kind::Device, k, &l, 3 << 20, &l, 3 << 20, 70 + i as u64);
            check_copy(&e, k, Kind::Device, &l, 3 << 20, &l, 3 << 20, 80 + i as u64);
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn try_wait_polls_to_completion() {
    let Some(e) = cuda_or_skip() else { return };
    let n = 256 << 20;
    let data = PinnedBuffer::new(n).unwrap();
    let mut dev = DeviceBuffer::new(0, n).unwrap();
    e.scope(|s| {
        let mut r = s.memcpy(&mut dev, &data).unwrap();
        let mut polls = 0u64;
        let res = loop {
            if let Some(res) = r.try_wait() {
                break res;
            }
            polls += 1;
            std::thread::yield_now();
        };
        res.unwrap();
        println!("256 MiB H2D polled {polls} times before completion");
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn drops_with_work_in_flight_are_safe() {
    let Some(e) = cuda_or_skip() else { return };
    let n = 128 << 20;
    let data = bytes(n, 91);
    let dev = DeviceBuffer::new(0, n).unwrap();
    // Dropping the engine while an owned transfer is in flight: the transfer still completes.
    let t = e
        .memcpy_owned(dev, data.clone())
        .map_err(|r| r.error)
        .unwrap();
    drop(e);
    let (dev, _) = t.wait().map_err(|f| f.error).unwrap();
    assert!(dev.to_vec().unwrap() == data);
    // Dropping requests unwaited inside a scope: the scope waits for them.
    let e = cuda_engine(0).unwrap();
    let mut dev2 = DeviceBuffer::new(0, n).unwrap();
    e.scope(|s| {
        drop(s.memcpy(&mut dev2, &data[..]).unwrap());
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
    assert!(dev2.to_vec().unwrap() == data);
}

/// Runs `f` on a thread and fails the test if it does not finish in `secs` (a deadlock), or
/// if it panicked.
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    within_at(secs, what, &AtomicUsize::new(0), &[], f)
}

/// [`within`], where `f` stores the step it reached in `step` (an index into `steps`): a
/// deadlock's message names the step it blocked in.
fn within_at<T: Send + 'static>(
    secs: u64,
    what: &str,
    step: &AtomicUsize,
    steps: &[&str],
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(t) => t,
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked (above)"),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            let at = step.load(Ordering::SeqCst);
            let name = steps.get(at).copied().unwrap_or("-");
            panic!("{what}: no progress in {secs} s (deadlock?), blocked in step {at} ({name})")
        }
    }
}

/// The first `len` bytes of `b`.
fn head(b: ferry::RawBuf, len: usize) -> ferry::RawBuf {
    ferry::RawBuf { len, ..b }
}

/// Polls `req` once with `waker`: registers it while the request is pending.
fn poll_with(
    req: &mut Request,
    waker: &std::task::Waker,
) -> std::task::Poll<Result<(), RequestError>> {
    let mut cx = std::task::Context::from_waker(waker);
    std::future::Future::poll(std::pin::Pin::new(req), &mut cx)
}

/// A waker that panics when woken (an executor's bug).
struct PanickingWaker;
impl std::task::Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        panic!("waker 31 panicked")
    }
}

/// A waker that says on a channel that it was woken.
struct SendingWaker(std::sync::Mutex<std::sync::mpsc::Sender<()>>);
impl SendingWaker {
    fn pair() -> (std::task::Waker, std::sync::mpsc::Receiver<()>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let w = std::task::Waker::from(Arc::new(SendingWaker(std::sync::Mutex::new(tx))));
        (w, rx)
    }
}
impl std::task::Wake for SendingWaker {
    fn wake(self: Arc<Self>) {
        let _ = self.0.lock().unwrap().send(());
    }
}

/// Both completion policies' engines on device 0.
fn engines_of_each_policy() -> Vec<(ferry::cuda::CompletionPolicy, Arc<CudaEngine>)> {
    use ferry::cuda::CompletionPolicy;
    [CompletionPolicy::Tuned, CompletionPolicy::Plain]
        .into_iter()
        .map(|p| {
            let cfg = ferry::cuda::CudaConfig::new(0).completion(p);
            (p, Arc::new(CudaEngine::with_config(cfg).unwrap()))
        })
        .collect()
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_panicking_waker_harms_no_other_request() {
    // Regression: a waker that panicked in `wake` unwound through the engine's waiter thread,
    // which died: the wakers registered after it were never woken.
    if cuda_or_skip().is_none() {
        return;
    }
    for (policy, e) in engines_of_each_policy() {
        let n = 256 << 20;
        let host = pinned_with(&bytes(n, 41));
        let mut dev = DeviceBuffer::new(0, n).unwrap();
        // SAFETY: `dev` and `host` outlive the wait below; nothing else touches them.
        let mut r = unsafe { copy_raw(&*e, dev_raw(&mut dev), staging_raw(&host), &[]) };
        let panics = std::task::Waker::from(Arc::new(PanickingWaker));
        let (sends, woken) = SendingWaker::pair();
        if poll_with(&mut r, &panics).is_ready() {
            println!("skipped ({policy:?}): a 256 MiB copy completed before its first poll");
            continue;
        }
        if poll_with(&mut r, &sends).is_pending() {
            assert!(
                woken
                    .recv_timeout(std::time::Duration::from_secs(20))
                    .is_ok(),
                "{policy:?}: the waker after the panicking one was never woken"
            );
        }
        assert_eq!(r.wait(), Ok(()));
        // Later futures of the engine complete, woken by its waiter thread.
        let src = bytes(n, 42);
        let e2 = Arc::clone(&e);
        let t = within(30, "a future after the panicking waker", move || {
            let t = e2
                .memcpy_owned(DeviceBuffer::new(0, n).unwrap(), src)
                .unwrap();
            block_on(t).unwrap()
        });
        check(
            "after the panicking waker",
            &t.0.to_vec().unwrap(),
            &bytes(n, 42),
        );
        e.barrier().unwrap();
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_waker_that_submits_on_its_lane_does_not_deadlock() {
    // Regression: the in-flight list of a lane polls its requests when it prunes, and a poll
    // that found a request done woke its futures' wakers with the list's lock held: a waker
    // that submits on the same engine (from the same thread: the same lane) from inside `wake`
    // deadlocked. The engine's waiter thread is kept busy (the first request's waker blocks
    // it), so that the second request's waker is woken by the pruning, not by that thread.
    if cuda_or_skip().is_none() {
        return;
    }
    static STEP: AtomicUsize = AtomicUsize::new(0);
    const STEPS: &[&str] = &[
        "submit the 256 MiB upload",
        "poll it with the blocking waker",
        "wait until its waker runs",
        "submit the 64 MiB and 4 KiB downloads",
        "poll the 4 KiB download with the submitting waker",
        "drop the upload and the 64 MiB download",
        "submit copies until a prune wakes the download's waker",
        "wait for the waker's copy",
        "wait for the other copies",
        "wait for the 4 KiB download",
        "the engine's barrier",
    ];
    let step = |i: usize| STEP.store(i, Ordering::SeqCst);
    for (policy, e) in engines_of_each_policy() {
        step(0);
        within_at(
            60,
            "a waker that submits from inside `wake`",
            &STEP,
            STEPS,
            move || {
                use std::sync::mpsc::channel;
                use std::time::Duration;
                /// Says it entered `wake` and on which thread, then blocks until released (or 20
                /// s).
                struct Blocks(
                    std::sync::Mutex<(
                        std::sync::mpsc::Sender<Option<String>>,
                        std::sync::mpsc::Receiver<()>,
                    )>,
                );
                impl std::task::Wake for Blocks {
                    fn wake(self: Arc<Self>) {
                        let g = self.0.lock().unwrap();
                        let _ = g.0.send(std::thread::current().name().map(str::to_owned));
                        let _ = g.1.recv_timeout(Duration::from_secs(20));
                    }
                }
                type Owned = ferry::Transfer<PinnedBuffer, DeviceBuffer>;
                /// Submits a 4 KiB download on the engine, and hands its transfer on.
                struct Submits {
                    e: Arc<CudaEngine>,
                    bufs: std::sync::Mutex<Option<(PinnedBuffer, DeviceBuffer)>>,
                    out: std::sync::Mutex<std::sync::mpsc::Sender<Owned>>,
                }
                impl std::task::Wake for Submits {
                    fn wake(self: Arc<Self>) {
                        let (dst, src) = self.bufs.lock().unwrap().take().expect("woken once");
                        let t = self.e.memcpy_owned(dst, src).unwrap();
                        let _ = self.out.lock().unwrap().send(t);
                    }
                }
                let n = 256 << 20;
                let host = pinned_with(&bytes(n, 51));
                let mut big = DeviceBuffer::new(0, n).unwrap();
                let mut down = PinnedBuffer::new(64 << 20).unwrap();
                let mut small = PinnedBuffer::new(4096).unwrap();
                let (entered_tx, entered) = channel();
                let (release, release_rx) = channel();
                let blocks = std::task::Waker::from(Arc::new(Blocks(std::sync::Mutex::new((
                    entered_tx, release_rx,
                )))));
                let mut wake_src = DeviceBuffer::new(0, 4096).unwrap();
                wake_src.copy_from_host(&bytes(4096, 52)).unwrap();
                let (out_tx, out) = channel();
                let submits = std::task::Waker::from(Arc::new(Submits {
                    e: Arc::clone(&e),
                    bufs: std::sync::Mutex::new(Some((PinnedBuffer::new(4096).unwrap(), wake_src))),
                    out: std::sync::Mutex::new(out_tx),
                }));
                // SAFETY: every buffer outlives the barrier at the end; each request writes its
                // own destination, which nothing else touches meanwhile.
                unsafe {
                    // The waiter thread waits for an upload, whose waker then blocks it.
                    let mut c = copy_raw(&*e, dev_raw(&mut big), staging_raw(&host), &[]);
                    step(1);
                    if poll_with(&mut c, &blocks).is_ready() {
                        println!("skipped ({policy:?}): a 256 MiB copy completed before its poll");
                        return;
                    }
                    step(2);
                    let woke_on = entered
                        .recv_timeout(Duration::from_secs(20))
                        .expect("the upload's waker was never woken");
                    assert!(
                    woke_on.as_deref().is_some_and(|n| n.ends_with("-waiter")),
                    "{policy:?}: the upload's waker ran on thread {woke_on:?}, not the engine's waiter"
                );
                    step(3);
                    // A small download behind a large one on this thread's lane; its waker queued
                    // behind the blocked one.
                    let m = copy_raw(
                        &*e,
                        pinned_raw(&mut down),
                        head(dev_ro(&big), 64 << 20),
                        &[],
                    );
                    let mut b =
                        copy_raw(&*e, pinned_raw(&mut small), head(dev_ro(&big), 4096), &[]);
                    step(4);
                    if poll_with(&mut b, &submits).is_ready() {
                        println!("skipped ({policy:?}): a copy behind 64 MiB completed at once");
                        let _ = release.send(());
                        return;
                    }
                    step(5);
                    drop((c, m));
                    std::thread::sleep(Duration::from_millis(100));
                    step(6);
                    // More submissions on the lane until its list prunes, polls the download,
                    // finds it done and wakes its waker (which submits on this lane).
                    let mut more = Vec::new();
                    let mut bufs: Vec<PinnedBuffer> =
                        (0..64).map(|_| PinnedBuffer::new(4096).unwrap()).collect();
                    for p in &mut bufs {
                        more.push(copy_raw(&*e, pinned_raw(p), head(dev_ro(&big), 4096), &[]));
                        if let Ok(t) = out.try_recv() {
                            let _ = release.send(());
                            step(7);
                            let (got, _) = t.wait().unwrap();
                            check("the waker's copy", &got, &bytes(4096, 52));
                            step(8);
                            for r in more {
                                r.wait().unwrap();
                            }
                            step(9);
                            b.wait().unwrap();
                            step(10);
                            e.barrier().unwrap();
                            return;
                        }
                    }
                    let _ = release.send(());
                    panic!("{policy:?}: no pruning woke the download's waker");
                }
            },
        );
    }
}
