//! Requests: wait, try_wait, futures, barriers, dependencies, drops, zero-thread mode, owned
//! transfers, and regressions for the deadlock and race fixed in the CPU pool.

use ferry::request::{InFlight, Signal};
use ferry::{
    Completion, CpuConfig, CpuEngine, Engine, EngineExt, Job, Layout, MemKind, MultiplexEngine,
    OpError, Operator, Program, RawBuf, Request, RequestError, SubmitError,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cpu(threads: usize) -> CpuEngine {
    CpuEngine::with_config(
        CpuConfig {
            threads,
            ..CpuConfig::caller_runs()
        }
        .chunk_bytes(4096)
        .inline_bytes(0),
    )
    .unwrap()
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

fn raw(v: &mut [u8]) -> RawBuf {
    RawBuf::host(v.as_mut_ptr(), v.len(), MemKind::Pageable)
}

/// Runs `f` on a thread and fails the test if it does not finish in `secs` (a deadlock).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what}: no progress in {secs} s (deadlock?)"))
}

struct Fails(u32);
impl Operator for Fails {
    fn name(&self) -> &str {
        "fails"
    }
    fn lower(&self, _: &mut Program) -> Result<(), OpError> {
        Err(OpError::Custom(format!("failure {}", self.0)))
    }
}

#[test]
fn wait_and_try_wait() {
    for threads in [0, 1, 3] {
        let e = cpu(threads);
        let src = data(1 << 20, 1);
        let mut dst = vec![0u8; 1 << 20];
        e.scope(|s| {
            {
                {
                    let mut r = s.memcpy(&mut dst, &src).unwrap();
                    if threads > 0 {
                        // Poll until done; never blocks.
                        let t = Instant::now();
                        let res = loop {
                            if let Some(res) = r.try_wait() {
                                break res;
                            }
                            assert!(t.elapsed() < Duration::from_secs(20));
                            std::thread::yield_now();
                        };
                        assert_eq!(res, Ok(()));
                        assert!(r.is_done());
                        assert_eq!(r.try_wait(), Some(Ok(())));
                    } else {
                        // Zero threads: nothing runs until someone waits.
                        assert_eq!(r.try_wait(), None);
                        assert!(!r.is_done());
                        r.wait().unwrap();
                    }
                };
                Ok::<_, ferry::BarrierError>(())
            }
        })
        .unwrap();
        assert_eq!(dst, src, "threads {threads}");
    }
}

#[test]
fn futures_block_on_and_join_all() {
    for threads in [0, 2] {
        let e = cpu(threads);
        let srcs: Vec<Vec<u8>> = (0..64).map(|i| data(10_000 + i * 100, i as u8)).collect();
        let mut dsts: Vec<Vec<u8>> = srcs.iter().map(|s| vec![0u8; s.len()]).collect();
        e.scope(|s| {
            let mut it = dsts.iter_mut().zip(&srcs);
            let (d0, s0) = it.next().unwrap();
            futures::executor::block_on(s.memcpy(d0, s0).unwrap()).unwrap();
            let reqs: Vec<Request> = it.map(|(d, src)| s.memcpy(d, src).unwrap()).collect();
            let results = futures::executor::block_on(futures::future::join_all(reqs));
            assert!(results.iter().all(Result::is_ok));
            Ok::<_, ferry::BarrierError>(())
        })
        .unwrap();
        assert_eq!(dsts, srcs, "threads {threads}");
        // A failing request's error comes out of the future.
        let src = vec![0u8; 8];
        let mut d = vec![0u8; 8];
        e.scope(|s| {
            let r = s.custom(&mut d, &src, Arc::new(Fails(9))).unwrap();
            let err = futures::executor::block_on(r).unwrap_err();
            assert_eq!(
                err,
                RequestError::Operator {
                    op: "fails".into(),
                    msg: "failure 9".into()
                }
            );
            Ok::<_, ferry::BarrierError>(())
        })
        .unwrap();
    }
}

#[test]
fn barrier_reports_every_failure_once() {
    for threads in [0, 1, 4] {
        let e = cpu(threads);
        let src = data(4096, 3);
        let mut dsts = vec![vec![0u8; 4096]; 50];
        let mut failing = Vec::new();
        let mut reqs = Vec::new();
        for (i, d) in dsts.iter_mut().enumerate() {
            let job = if [7, 23, 41].contains(&i) {
                Job::custom(
                    raw(d),
                    Some(RawBuf::host(src.as_ptr(), 4096, MemKind::Pageable)),
                    Arc::new(Fails(i as u32)),
                )
            } else {
                let l = Layout::bytes(4096).unwrap();
                Job::copy(
                    raw(d),
                    l,
                    RawBuf::host(src.as_ptr(), 4096, MemKind::Pageable),
                    l,
                )
            };
            // SAFETY: `src` and `dsts` outlive the barrier below and are not touched before it.
            let r = unsafe { e.submit_raw(job) }.unwrap();
            if [7, 23, 41].contains(&i) {
                failing.push((r.id(), i));
            }
            reqs.push(r);
        }
        drop(reqs);
        let err = e.barrier().unwrap_err();
        let mut got: Vec<u64> = err.failures.iter().map(|(id, _)| *id).collect();
        got.sort_unstable();
        assert_eq!(got, failing.iter().map(|f| f.0).collect::<Vec<_>>());
        for ((_, e), (_, i)) in err.failures.iter().zip(&failing) {
            assert_eq!(
                e,
                &RequestError::Operator {
                    op: "fails".into(),
                    msg: format!("failure {i}")
                }
            );
        }
        let msg = err.to_string();
        assert!(
            msg.starts_with("3 request(s) failed") && msg.contains("failure 23"),
            "{msg}"
        );
        for (i, d) in dsts.iter().enumerate() {
            assert_eq!(d == &src, ![7, 23, 41].contains(&i));
        }
        // Reported once: a second barrier is clean.
        e.barrier().unwrap();

        // An error observed through wait is not re-reported; an unobserved one is.
        let mut d1 = vec![0u8; 8];
        let mut d2 = vec![0u8; 8];
        // SAFETY: buffers outlive the barrier.
        let r1 =
            unsafe { e.submit_raw(Job::custom(raw(&mut d1), None, Arc::new(Fails(1)))) }.unwrap();
        // SAFETY: as above.
        let r2 =
            unsafe { e.submit_raw(Job::custom(raw(&mut d2), None, Arc::new(Fails(2)))) }.unwrap();
        let id2 = r2.id();
        drop(r2);
        assert!(r1.wait().is_err());
        let err = e.barrier().unwrap_err();
        assert_eq!(err.failures.len(), 1);
        assert_eq!(err.failures[0].0, id2);
    }
}

#[test]
fn scope_barrier_reports_failures_and_engine_does_not_repeat_them() {
    let e = cpu(2);
    let src = data(256, 0);
    let mut dsts = vec![vec![0u8; 256]; 20];
    let err = e
        .scope(|s| {
            for (i, d) in dsts.iter_mut().enumerate() {
                if i % 7 == 3 {
                    drop(s.custom(d, &src, Arc::new(Fails(i as u32))).unwrap());
                } else {
                    drop(s.memcpy(d, &src).unwrap());
                }
            }
            Ok::<_, ferry::BarrierError>(())
        })
        .unwrap_err();
    assert_eq!(err.failures.len(), 3);
    e.barrier().unwrap();
}

#[test]
fn dependency_chain_runs_in_order() {
    for threads in [0, 1, 2, 4] {
        let e = cpu(threads);
        let n = 3 << 20;
        let src = data(n, 5);
        let (mut a, mut b, mut c) = (vec![0u8; n], vec![0u8; n], vec![0u8; n]);
        let l = Layout::bytes(n).unwrap();
        let s = RawBuf::host(src.as_ptr(), n, MemKind::Pageable);
        let (ra, rb, rc) = (raw(&mut a), raw(&mut b), raw(&mut c));
        // SAFETY: the buffers outlive the waits below; each job reads only what its
        // dependency finished writing.
        unsafe {
            let r1 = e.submit_raw(Job::copy(ra, l, s, l)).unwrap();
            let r2 = e.submit_raw(Job::copy(rb, l, ra, l).after(&r1)).unwrap();
            let r3 = e.submit_raw(Job::copy(rc, l, rb, l).after(&r2)).unwrap();
            r3.wait().unwrap();
        }
        e.barrier().unwrap();
        assert!(a == src && b == src && c == src, "threads {threads}");
    }
}

#[test]
fn failed_dependency_fails_dependents() {
    for threads in [0, 2] {
        let e = cpu(threads);
        let (mut a, mut b, mut c) = (vec![0u8; 64], vec![0u8; 64], vec![0u8; 64]);
        let l = Layout::bytes(64).unwrap();
        // SAFETY: buffers outlive the waits.
        unsafe {
            let r1 = e
                .submit_raw(Job::custom(raw(&mut a), None, Arc::new(Fails(1))))
                .unwrap();
            let r2 = e
                .submit_raw(Job::fill(raw(&mut b), l, &[9]).after(&r1))
                .unwrap();
            let r3 = e
                .submit_raw(Job::fill(raw(&mut c), l, &[9]).after(&r2))
                .unwrap();
            let e1 = RequestError::Operator {
                op: "fails".into(),
                msg: "failure 1".into(),
            };
            let e2 = RequestError::Dependency(Box::new(e1.clone()));
            assert_eq!(
                r3.wait(),
                Err(RequestError::Dependency(Box::new(e2.clone())))
            );
            assert_eq!(r2.wait(), Err(e2.clone()));
            assert!(
                e2.to_string().contains("dependency failed")
                    && e2.to_string().contains("failure 1")
            );
            assert_eq!(r1.wait(), Err(e1));
        }
        assert!(b.iter().chain(&c).all(|&x| x == 0));
        e.barrier().unwrap();
    }
}

#[test]
fn scope_submit_with_dependencies() {
    let e = cpu(2);
    let src = data(1 << 20, 2);
    let (mut a, mut b) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let l = Layout::bytes(1 << 20).unwrap();
    e.scope(|s| {
        let r1 = s.copy(&mut a, &l, &src, &l).unwrap();
        let r2 = s
            .submit(
                &mut b,
                Some(&src[..]),
                ferry::Op::Fill {
                    dst: l,
                    pattern: Box::new([4]),
                },
                &[&r1],
            )
            .unwrap();
        r2.wait().unwrap();
        assert!(r1.is_done(), "a dependent completed before its dependency");
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
    assert_eq!(a, src);
    assert!(b.iter().all(|&x| x == 4));
}

#[test]
fn dependencies_across_workers_do_not_deadlock() {
    // Regression: a worker waiting on a dependency ran any queued task, including the Start of
    // a request that depends on the one it was about to start, and blocked forever.
    within(60, "chains on 2 workers", || {
        let e = CpuEngine::with_config(CpuConfig::new(2).chunk_bytes(usize::MAX).inline_bytes(0))
            .unwrap();
        let n = 16 << 20;
        let src = vec![1u8; n];
        let mut bufs = vec![vec![0u8; n]; 4];
        let l = Layout::bytes(n).unwrap();
        let s = RawBuf::host(src.as_ptr(), n, MemKind::Pageable);
        for _ in 0..10 {
            let r: Vec<RawBuf> = bufs.iter_mut().map(|b| raw(b)).collect();
            // SAFETY: the buffers outlive the wait; each copy reads what its dependency wrote.
            unsafe {
                let r0 = e.submit_raw(Job::copy(r[0], l, s, l)).unwrap();
                let r1 = e
                    .submit_raw(Job::copy(r[1], l, r[0], l).after(&r0))
                    .unwrap();
                let r2 = e
                    .submit_raw(Job::copy(r[2], l, r[1], l).after(&r1))
                    .unwrap();
                let r3 = e
                    .submit_raw(Job::copy(r[3], l, r[2], l).after(&r2))
                    .unwrap();
                r3.wait().unwrap();
            }
        }
        assert!(bufs.iter().all(|b| b == &src));
    });
}

#[test]
fn dependency_on_another_engine_including_zero_thread() {
    within(60, "cross-engine dependency", || {
        let lazy = cpu(0);
        let busy = cpu(1);
        let n = 1 << 20;
        let src = data(n, 8);
        let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
        let l = Layout::bytes(n).unwrap();
        // SAFETY: buffers outlive the waits.
        unsafe {
            let r1 = lazy
                .submit_raw(Job::copy(
                    raw(&mut a),
                    l,
                    RawBuf::host(src.as_ptr(), n, MemKind::Pageable),
                    l,
                ))
                .unwrap();
            let ra = RawBuf::host(a.as_ptr(), n, MemKind::Pageable);
            // The 1-thread engine's worker makes the zero-thread engine's request progress.
            let r2 = busy
                .submit_raw(Job::copy(raw(&mut b), l, ra, l).after(&r1))
                .unwrap();
            r2.wait().unwrap();
        }
        assert!(a == src && b == src);
    });
}

#[test]
fn dropping_requests_and_engines_with_work_in_flight() {
    for threads in [0, 1, 4] {
        let n = 2 << 20;
        let src = data(n, 4);
        let mut dsts = vec![vec![0u8; n]; 8];
        {
            let e = cpu(threads);
            let l = Layout::bytes(n).unwrap();
            for d in dsts.iter_mut() {
                // SAFETY: `dsts` and `src` outlive the engine, whose drop finishes the work.
                let r = unsafe {
                    e.submit_raw(Job::copy(
                        raw(d),
                        l,
                        RawBuf::host(src.as_ptr(), n, MemKind::Pageable),
                        l,
                    ))
                };
                drop(r.unwrap());
            }
            // Dropped here with the copies queued or running.
        }
        assert!(dsts.iter().all(|d| d == &src), "threads {threads}");
    }
    // A request outliving its engine still reports its result.
    let src = data(1 << 20, 1);
    let mut d = vec![0u8; 1 << 20];
    let l = Layout::bytes(1 << 20).unwrap();
    let e = cpu(0);
    // SAFETY: the request is waited before `d` is read.
    let r = unsafe {
        e.submit_raw(Job::copy(
            raw(&mut d),
            l,
            RawBuf::host(src.as_ptr(), 1 << 20, MemKind::Pageable),
            l,
        ))
    }
    .unwrap();
    drop(e);
    assert_eq!(r.wait(), Ok(()));
    assert_eq!(d, src);
}

#[test]
fn scope_waits_even_when_the_closure_panics() {
    let e = cpu(1);
    let src = data(8 << 20, 6);
    let mut dst = vec![0u8; 8 << 20];
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = e.scope(|s| -> ferry::Result<()> {
            drop(s.memcpy(&mut dst, &src).unwrap());
            panic!("closure panics with a copy in flight");
        });
    }));
    assert!(r.is_err());
    assert_eq!(dst, src, "the scope returned before its copy finished");
    let _ = e.barrier();
}

#[test]
fn zero_thread_mode_progresses_in_wait_barrier_and_futures() {
    let e = cpu(0);
    let n = 1 << 20;
    let src = data(n, 9);
    let mut d = vec![vec![0u8; n]; 3];
    let l = Layout::bytes(n).unwrap();
    let s = RawBuf::host(src.as_ptr(), n, MemKind::Pageable);
    let r: Vec<RawBuf> = d.iter_mut().map(|b| raw(b)).collect();
    // SAFETY: buffers outlive the barrier.
    unsafe {
        drop(e.submit_raw(Job::copy(r[0], l, s, l)).unwrap());
        drop(e.submit_raw(Job::copy(r[1], l, s, l)).unwrap());
        let r3 = e.submit_raw(Job::copy(r[2], l, s, l)).unwrap();
        futures::executor::block_on(r3).unwrap();
    }
    e.barrier().unwrap();
    assert!(d.iter().all(|b| b == &src));
}

/// A test engine whose requests complete after a delay, from another thread.
struct SlowEngine {
    fail: bool,
    done: Arc<AtomicBool>,
}
impl Engine for SlowEngine {
    fn name(&self) -> String {
        "slow".into()
    }
    fn supports(&self, _: MemKind, _: Option<MemKind>) -> bool {
        true
    }
    unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
        let sig = Arc::new(Signal::new());
        let (s2, done, fail) = (Arc::clone(&sig), Arc::clone(&self.done), self.fail);
        let addr = job.dst.addr as usize;
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            if !fail {
                // SAFETY: submit_raw's contract keeps `dst` valid until completion.
                unsafe { *(addr as *mut u8) = 42 };
            }
            done.store(true, Ordering::SeqCst);
            s2.complete(if fail {
                Err(RequestError::from(ferry::cuda::DriverError::new(
                    "slowCopy",
                    cudarc::driver::sys::CUresult::CUDA_ERROR_LAUNCH_FAILED,
                )))
            } else {
                Ok(())
            });
        });
        Ok(Request::new(sig))
    }
    fn barrier(&self) -> Result<(), ferry::BarrierError> {
        Ok(())
    }
}

#[test]
fn transfers_return_buffers_and_drop_waits() {
    // Success, with the real engine.
    let e = cpu(2);
    let t = e
        .memcpy_owned(vec![0u8; 3 << 20], data(3 << 20, 1))
        .unwrap();
    let (dst, src) = t.wait().unwrap();
    assert_eq!(dst, src);
    // As a future.
    let t = e.memcpy_owned(vec![0u32; 1000], vec![7u32; 1000]).unwrap();
    let (dst, _) = futures::executor::block_on(t).unwrap();
    assert!(dst.iter().all(|&x| x == 7));
    // Empty copies complete at once (regression: they were refused with ZeroDim).
    let (d, s) = e
        .memcpy_owned(Vec::<u8>::new(), Vec::<u8>::new())
        .unwrap()
        .wait()
        .unwrap();
    assert!(d.is_empty() && s.is_empty());
    let (mut d, s) = (vec![5u8; 4], Vec::<u8>::new());
    e.scope(|sc| -> ferry::Result<()> { Ok(sc.memcpy(&mut d, &s)?.wait()?) })
        .unwrap();
    assert_eq!(d, vec![5u8; 4]);
    // Arrays held inline are owned and returned too.
    let (d, _) = e
        .memcpy_owned([0u8; 4096], [3u8; 4096])
        .unwrap()
        .wait()
        .unwrap();
    assert!(d.iter().all(|&x| x == 3));
    // Refused at submit: buffers come back untouched.
    let l = Layout::bytes(100).unwrap();
    let refused = e
        .copy_owned(vec![0u8; 10], &l, vec![1u8; 100], &l)
        .unwrap_err();
    assert!(
        matches!(refused.error, SubmitError::Op(OpError::Dst(_))),
        "{}",
        refused.error
    );
    assert_eq!((refused.dst.len(), refused.src.len()), (10, 100));
    // Failed at run time: buffers come back with the error.
    let done = Arc::new(AtomicBool::new(false));
    let slow = SlowEngine {
        fail: true,
        done: Arc::clone(&done),
    };
    let t = slow.memcpy_owned(vec![0u8; 16], vec![1u8; 16]).unwrap();
    let failed = t.wait().unwrap_err();
    assert_eq!(
        failed.error,
        RequestError::from(ferry::cuda::DriverError::new(
            "slowCopy",
            cudarc::driver::sys::CUresult::CUDA_ERROR_LAUNCH_FAILED
        ))
    );
    // The driver's code travels typed; without a driver library the text is the code's name.
    let d = failed.error.driver_error().unwrap();
    assert!(!d.is_out_of_memory());
    assert!(failed
        .error
        .to_string()
        .contains("slowCopy failed: CUDA_ERROR_LAUNCH_FAILED"));
    assert_eq!(
        (failed.dst.len(), failed.src, done.load(Ordering::SeqCst)),
        (16, vec![1u8; 16], true)
    );
    // Drop waits for the copy.
    let done = Arc::new(AtomicBool::new(false));
    let slow = SlowEngine {
        fail: false,
        done: Arc::clone(&done),
    };
    let t = slow.memcpy_owned(vec![0u8; 16], vec![1u8; 16]).unwrap();
    assert!(!t.is_done());
    drop(t);
    assert!(
        done.load(Ordering::SeqCst),
        "dropping a Transfer returned before its copy completed"
    );
}

#[test]
fn overlapping_steps_of_one_program_run_in_order() {
    // Regression: steps of one custom program ran as parallel chunks even when they wrote the
    // same bytes (a data race reachable from safe code, and a wrong result).
    struct FillThenCopy(usize);
    impl Operator for FillThenCopy {
        fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
            let l = Layout::bytes(self.0)?;
            prog.fill(&l, &[0xFF])?;
            prog.copy(&l, &l)?;
            prog.fill(&Layout::bytes(8)?, &[1])
        }
    }
    let n = 4 << 20;
    let e = cpu(4);
    let src = data(n, 7);
    for _ in 0..5 {
        let mut dst = vec![0u8; n];
        e.scope(|s| {
            s.custom(&mut dst, &src, Arc::new(FillThenCopy(n)))
                .unwrap()
                .wait()
                .unwrap();
            Ok::<_, ferry::BarrierError>(())
        })
        .unwrap();
        assert_eq!(&dst[..8], &[1u8; 8]);
        assert!(dst[8..] == src[8..]);
    }
}

#[test]
fn multiplex_splits_fills_and_copies() {
    // Regression: a fill above split_bytes was split into sub-fills whose element size was the
    // run length, and every one was refused with PatternSize.
    let mux = MultiplexEngine::new()
        .with(cpu(1), 1.0)
        .with(cpu(2), 2.0)
        .split_bytes(1 << 20);
    let n = 6 << 20;
    let mut dst = vec![0u8; n];
    let l = Layout::contiguous(&[n / 4], 4).unwrap();
    mux.scope(|s| Ok::<_, ferry::BarrierError>(s.fill(&mut dst, &l, &[1, 2, 3, 4]).map(|_| ())))
        .unwrap()
        .unwrap();
    assert!(dst.chunks(4).all(|c| c == [1, 2, 3, 4]));
    let src = data(n, 3);
    mux.scope(|s| Ok::<_, ferry::BarrierError>(s.memcpy(&mut dst, &src).map(|_| ())))
        .unwrap()
        .unwrap();
    assert_eq!(dst, src);
    mux.barrier().unwrap();
}

#[test]
fn inflight_prunes_completed_requests() {
    // Regression: successful requests dropped without a wait were kept until the next barrier.
    let f = InFlight::new();
    for _ in 0..10_000 {
        f.track(&Request::ready(Ok(())));
    }
    assert!(f.len() <= 128, "{} requests tracked", f.len());
    // Unobserved failures are kept for the barrier.
    for _ in 0..100 {
        f.track(&Request::ready(Err(RequestError::Aborted("x".into()))));
    }
    assert_eq!(f.barrier().unwrap_err().failures.len(), 100);
    assert!(f.is_empty());
    // And a Signal completed later still wakes its waiter.
    let s = Arc::new(Signal::new());
    let r = Request::new(Arc::clone(&s));
    let h = std::thread::spawn(move || r.wait());
    std::thread::sleep(Duration::from_millis(20));
    s.complete(Ok(()));
    assert_eq!(h.join().unwrap(), Ok(()));
    assert_eq!(s.poll_done(), Some(Ok(())));
}

#[test]
fn panicking_dependency_fails_only_its_dependent() {
    // Regression: a dependency whose completion panicked killed the worker, and the dependent
    // request never completed.
    struct Boom;
    impl Completion for Boom {
        fn wait(&self) -> Result<(), RequestError> {
            panic!("completion 13 panicked")
        }
        fn poll_done(&self) -> Option<Result<(), RequestError>> {
            panic!("completion 13 panicked")
        }
        fn register_waker(&self, _: &std::task::Waker) {}
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }
    within(30, "panicking dependency", || {
        let e = cpu(1);
        let mut d = vec![0u8; 64];
        let dep = Request::new(Boom);
        let l = Layout::bytes(64).unwrap();
        // SAFETY: `d` outlives the wait.
        let r = unsafe { e.submit_raw(Job::fill(raw(&mut d), l, &[1]).after(&dep)) }.unwrap();
        let err = r.wait().unwrap_err();
        assert_eq!(
            err,
            RequestError::Dependency(Box::new(RequestError::Panicked {
                op: "dependency".into(),
                msg: "completion 13 panicked".into()
            }))
        );
        assert_eq!(d, vec![0u8; 64]);
        assert_eq!(e.live_workers(), 1);
    });
}

#[test]
fn chains_waited_from_many_threads() {
    // Several threads make progress for one zero-thread engine at once, through a chain of
    // dependent copies; a waiter must never nest a task that waits for its own request.
    for threads in [0, 0, 1, 4] {
        within(60, "chain with 4 waiters", move || {
            let e = Arc::new(cpu(threads));
            let (n, len) = (40, 256 << 10);
            let src = data(len, 11);
            let mut bufs = vec![vec![0u8; len]; n];
            let l = Layout::bytes(len).unwrap();
            let mut prev = RawBuf::host(src.as_ptr(), len, MemKind::Pageable);
            let mut reqs: Vec<Option<Request>> = Vec::new();
            for b in bufs.iter_mut() {
                let job = Job::copy(raw(b), l, prev, l);
                let job = match reqs.last() {
                    Some(Some(r)) => job.after(r),
                    _ => job,
                };
                // SAFETY: the buffers outlive the joins below; each copy reads what its
                // dependency wrote.
                reqs.push(Some(unsafe { e.submit_raw(job) }.unwrap()));
                prev = RawBuf::host(b.as_ptr(), len, MemKind::Pageable);
            }
            let mut handles = Vec::new();
            for t in 0..4 {
                let mine: Vec<Request> = (0..n)
                    .rev()
                    .filter(|i| i % 4 == t)
                    .map(|i| reqs[i].take().unwrap())
                    .collect();
                handles.push(std::thread::spawn(move || {
                    mine.into_iter().map(Request::wait).collect::<Vec<_>>()
                }));
            }
            for h in handles {
                assert!(h.join().unwrap().iter().all(Result::is_ok));
            }
            e.barrier().unwrap();
            assert!(bufs.iter().all(|b| b == &src), "threads {threads}");
        });
    }
}

#[test]
fn scope_barrier_skips_what_was_seen_and_reports_the_rest() {
    // Requests waited or polled to success (skipped by the barrier without asking their
    // completion), failures seen through wait or try_wait (not reported again), and failures
    // and successes dropped unseen (only the failures reported, each once), in one scope.
    // Workers make the progress the polled requests wait for (a zero-thread engine makes none
    // from `try_wait` alone).
    for threads in [1, 2] {
        let e = cpu(threads);
        let src = data(256, 3);
        let mut dsts = vec![vec![0u8; 256]; 12];
        let mut dropped_failures = Vec::new();
        let err = e
            .scope(|s| {
                for (i, d) in dsts.iter_mut().enumerate() {
                    let fails = i % 3 == 1;
                    let mut r = if fails {
                        s.custom(d, &src, Arc::new(Fails(i as u32))).unwrap()
                    } else {
                        s.memcpy(d, &src).unwrap()
                    };
                    match i % 4 {
                        0 => assert_eq!(r.wait().is_err(), fails),
                        1 => {
                            let deadline = std::time::Instant::now() + Duration::from_secs(30);
                            let seen = loop {
                                if let Some(x) = r.try_wait() {
                                    break x;
                                }
                                assert!(std::time::Instant::now() < deadline, "no progress");
                                std::thread::yield_now();
                            };
                            assert_eq!(seen.is_err(), fails);
                        }
                        _ => {
                            if fails {
                                dropped_failures.push(r.id());
                            }
                            drop(r);
                        }
                    }
                }
                Ok::<_, ferry::BarrierError>(())
            })
            .unwrap_err();
        let mut reported: Vec<u64> = err.failures.iter().map(|f| f.0).collect();
        reported.sort_unstable();
        dropped_failures.sort_unstable();
        assert_eq!(reported, dropped_failures, "{threads} threads");
        assert!(dsts
            .iter()
            .enumerate()
            .all(|(i, d)| i % 3 == 1 || *d == src));
        // Everything seen or reported: the engine's barrier has nothing left.
        e.barrier().unwrap();
        // A scope whose requests were all waited to success returns Ok.
        let mut d = vec![0u8; 256];
        e.scope(|s| -> ferry::Result<()> {
            s.memcpy(&mut d, &src)?.wait()?;
            s.memcpy(&mut dsts[0], &src)?.wait()?;
            Ok(())
        })
        .unwrap();
        assert_eq!(d, src);
    }
}

/// A waker that panics when woken (an executor's bug).
struct PanickingWaker;
impl std::task::Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        panic!("waker 21 panicked")
    }
}

/// A waker that says on a channel that it was woken.
struct SendingWaker(std::sync::Mutex<mpsc::Sender<()>>);
impl std::task::Wake for SendingWaker {
    fn wake(self: Arc<Self>) {
        let _ = self.0.lock().unwrap().send(());
    }
}

/// Polls `req` once with `waker`: registers it while the request is pending.
fn poll_with(
    req: &mut Request,
    waker: &std::task::Waker,
) -> std::task::Poll<Result<(), RequestError>> {
    let mut cx = std::task::Context::from_waker(waker);
    std::future::Future::poll(std::pin::Pin::new(req), &mut cx)
}

#[test]
fn a_panicking_waker_harms_no_other_request() {
    // Regression: a waker that panicked in `wake` unwound through the worker that completed
    // its request: the wakers after it were never woken, the worker died, and requests queued
    // later (awaited: no waiting thread runs their chunks) never completed.
    let e = Arc::new(cpu(1));
    let gate = Arc::new(Signal::new());
    let gate_req = Request::new(Arc::clone(&gate));
    let src = data(64 << 10, 3);
    let mut dst = vec![0u8; src.len()];
    let l = Layout::bytes(src.len()).unwrap();
    let job = Job::copy(
        raw(&mut dst),
        l,
        RawBuf::host(src.as_ptr(), src.len(), MemKind::Pageable),
        l,
    );
    // SAFETY: `dst` and `src` outlive the request, waited below.
    let mut r = unsafe { e.submit_raw(job.after(&gate_req)) }.unwrap();
    let (tx, rx) = mpsc::channel();
    let panics = std::task::Waker::from(Arc::new(PanickingWaker));
    let sends = std::task::Waker::from(Arc::new(SendingWaker(std::sync::Mutex::new(tx))));
    // Both registered while the request waits for its gate: the panicking one first.
    assert!(poll_with(&mut r, &panics).is_pending());
    assert!(poll_with(&mut r, &sends).is_pending());
    gate.complete(Ok(()));
    assert!(
        rx.recv_timeout(Duration::from_secs(20)).is_ok(),
        "the waker after the panicking one was never woken"
    );
    assert_eq!(r.wait(), Ok(()));
    assert_eq!(dst, src);
    // The worker lives on: a request submitted now completes as a future, whose executor
    // thread runs nothing of it.
    let e2 = Arc::clone(&e);
    within(20, "a request after the panicking waker", move || {
        let src = data(64 << 10, 4);
        let t = e2.memcpy_owned(vec![0u8; src.len()], src.clone()).unwrap();
        let (d, _) = futures::executor::block_on(t).unwrap();
        assert_eq!(d, src);
    });
    e.barrier().unwrap();
}

#[test]
fn no_waker_runs_under_the_in_flight_lock() {
    // A completion that finds out it is done when polled (as a CUDA request does) and then
    // wakes its futures' wakers: the engine's in-flight list polls it while pruning. Regression:
    // the wakers ran with the list's lock held, and one that submits on the same engine (so
    // tracks its request in the same list) from inside `wake` deadlocked.
    struct FoundDone {
        done: Arc<AtomicBool>,
        signal: Signal,
    }
    impl Completion for FoundDone {
        fn wait(&self) -> Result<(), RequestError> {
            self.signal.complete(Ok(()));
            self.signal.wait()
        }
        fn poll_done(&self) -> Option<Result<(), RequestError>> {
            if self.done.load(Ordering::Acquire) {
                self.signal.complete(Ok(()));
            }
            self.signal.poll_done()
        }
        fn register_waker(&self, waker: &std::task::Waker) {
            self.signal.register_waker(waker);
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }
    /// Tracks a request in `list` when woken (as a waker that submits on the engine would).
    struct Tracks(Arc<InFlight>, mpsc::Sender<usize>);
    impl std::task::Wake for Tracks {
        fn wake(self: Arc<Self>) {
            self.0.track(&Request::ready(Ok(())));
            let _ = self.1.send(self.0.len());
        }
    }
    let (tx, rx) = mpsc::channel();
    within(
        20,
        "a waker that tracks a request from inside `wake`",
        move || {
            let list = Arc::new(InFlight::new());
            let done = Arc::new(AtomicBool::new(false));
            let mut r = Request::new(FoundDone {
                done: Arc::clone(&done),
                signal: Signal::new(),
            });
            let waker = std::task::Waker::from(Arc::new(Tracks(Arc::clone(&list), tx)));
            assert!(poll_with(&mut r, &waker).is_pending());
            list.track(&r);
            done.store(true, Ordering::Release);
            // Pending requests until a pruning polls `r` (the list is pruned at 4 entries).
            let pending: Vec<Arc<Signal>> = (0..8).map(|_| Arc::new(Signal::new())).collect();
            for s in &pending {
                list.track(&Request::new(Arc::clone(s)));
            }
            for s in &pending {
                s.complete(Ok(()));
            }
            list.barrier().unwrap();
        },
    );
    assert!(
        rx.recv_timeout(Duration::from_secs(1)).is_ok(),
        "the waker was never woken"
    );
}

/// Small copies run at submit (issue 32): the scoped and owned APIs hand back requests and
/// buffers that are already done, ids stay unique, errors are the same as on the queued path,
/// and owned buffers held by value (arrays, which move) come back whole.
#[test]
fn copies_run_at_submit_are_done_unique_and_checked_as_queued_ones() {
    let e = CpuEngine::new(2).unwrap();
    let queued = cpu(2);
    let src = data(4096, 3);
    let mut dst = vec![vec![0u8; 4096]; 3];
    let mut ids = Vec::new();
    e.scope(|s| -> ferry::Result<()> {
        for d in dst.iter_mut() {
            let mut r = s.memcpy(&mut d[..], &src[..])?;
            assert_eq!(r.try_wait(), Some(Ok(())));
            assert!(r.is_done());
            ids.push(r.id());
            r.wait()?;
        }
        Ok(())
    })
    .unwrap();
    assert!(dst.iter().all(|d| *d == src));
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "ids are unique");
    // A destination too short is refused alike at submit and on the queued path.
    let (mut short, mut short2) = (vec![0u8; 100], vec![0u8; 100]);
    let l = Layout::bytes(200).unwrap();
    let errs: Vec<String> = [&e, &queued]
        .iter()
        .map(|eng| {
            eng.scope(|s| -> ferry::Result<()> {
                let a = s.memcpy(&mut short[..], &src[..200]).unwrap_err();
                let b = s.copy(&mut short2[..], &l, &src[..], &l).unwrap_err();
                Err(ferry::Error::InvalidArgument(format!("{a} / {b}")))
            })
            .unwrap_err()
            .to_string()
        })
        .collect();
    assert_eq!(errs[0], errs[1]);
    // Owned arrays (moved, not boxed, when the copy runs at submit) and vectors.
    let (d, s) = e
        .memcpy_owned([0u8; 64], [9u8; 64])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!((d, s), ([9u8; 64], [9u8; 64]));
    let l = Layout::bytes(64).unwrap();
    let t = e.copy_owned([0u8; 64], &l, [5u8; 64], &l).unwrap();
    assert!(t.is_done());
    assert_eq!(t.wait().unwrap().0, [5u8; 64]);
    let (d, _) = e
        .memcpy_owned(vec![0u8; 8], data(8, 1))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(d, data(8, 1));
    // An owned copy whose destination is too short is refused with the buffers back.
    let r = e.memcpy_owned(vec![0u8; 4], vec![1u8; 8]).unwrap_err();
    assert_eq!((r.dst.len(), r.src.len()), (4, 8));
    assert!(e.barrier().is_ok());
}

/// A copy in a scope of its own: whether its request came back done, once waited.
fn scoped_copy(
    e: &dyn Engine,
    d: &mut Vec<f32>,
    dl: &Layout,
    s: &Vec<f32>,
    sl: &Layout,
) -> Result<bool, ferry::Error> {
    e.scope(|sc| -> ferry::Result<bool> {
        let r = sc.copy(d, dl, s, sl)?;
        let done = r.is_done();
        r.wait()?;
        Ok(done)
    })
}

/// A fill in a scope of its own: whether its request came back done, once waited.
fn scoped_fill(e: &dyn Engine, d: &mut Vec<f32>, l: &Layout) -> Result<bool, ferry::Error> {
    e.scope(|sc| -> ferry::Result<bool> {
        let r = sc.fill(d, l, &9f32.to_ne_bytes())?;
        let done = r.is_done();
        r.wait()?;
        Ok(done)
    })
}

/// Copies and fills over layouts with no element (a dim of extent 0) complete at once through
/// the safe API (scoped and owned) and through the raw contract, on the CPU engine in each
/// mode and behind a multiplexer; one empty side beside a non-empty one is refused.
#[test]
fn empty_copies_and_fills_complete_at_once_on_every_path() {
    let inline = CpuEngine::with_config(CpuConfig::caller_runs()).unwrap();
    let mux = MultiplexEngine::new().with(cpu(1), 1.0).with(cpu(1), 1.0);
    let engines: Vec<Box<dyn Engine>> = vec![
        Box::new(cpu(2)),
        Box::new(cpu(0)),
        Box::new(inline),
        Box::new(mux),
    ];
    let empty = Layout::of::<f32>(&[0]).unwrap();
    let empty_2d = Layout::of::<f32>(&[3, 0]).unwrap().with_offset(8).unwrap();
    let four = Layout::of::<f32>(&[4]).unwrap();
    for e in &engines {
        let e: &dyn Engine = e.as_ref();
        let name = e.name();
        // Scoped: over empty and non-empty buffers, at an offset inside the buffer.
        let (mut d, s) = (vec![5f32; 4], vec![7f32; 4]);
        let (mut none_d, none_s) = (Vec::<f32>::new(), Vec::<f32>::new());
        for (dl, sl) in [(empty, empty), (empty_2d, empty), (empty, empty_2d)] {
            assert!(
                scoped_copy(e, &mut d, &dl, &s, &sl).unwrap(),
                "{name}: {dl:?}"
            );
        }
        assert!(
            scoped_copy(e, &mut none_d, &empty, &none_s, &empty).unwrap(),
            "{name}"
        );
        assert!(
            scoped_fill(e, &mut d, &empty_2d).unwrap(),
            "{name}: scoped fill"
        );
        // One empty side is a shape mismatch; an empty layout past the buffer is refused.
        for (dl, sl) in [(empty, four), (four, empty)] {
            let err = scoped_copy(e, &mut d, &dl, &s, &sl).unwrap_err();
            assert!(err.to_string().contains("shape mismatch"), "{name}: {err}");
        }
        let far = empty.with_offset(20).unwrap();
        let err = scoped_copy(e, &mut d, &far, &s, &empty).unwrap_err();
        assert!(err.to_string().contains("destination"), "{name}: {err}");
        assert!(scoped_fill(e, &mut d, &far).is_err(), "{name}");
        assert_eq!((&d, &none_d), (&vec![5f32; 4], &vec![]), "{name}");
        // Owned: the buffers come straight back.
        let t = e
            .copy_owned(
                vec![1u16; 3],
                &Layout::of::<u16>(&[0, 3]).unwrap(),
                vec![2u16; 3],
                &Layout::of::<u16>(&[3, 0]).unwrap(),
            )
            .unwrap();
        assert!(t.is_done(), "{name}: owned copy");
        assert_eq!(t.wait().unwrap(), (vec![1u16; 3], vec![2u16; 3]));
        let refused = e
            .copy_owned(
                vec![1u8; 4],
                &Layout::bytes(0).unwrap(),
                vec![2u8; 4],
                &Layout::bytes(4).unwrap(),
            )
            .unwrap_err();
        assert_eq!((refused.dst, refused.src), (vec![1u8; 4], vec![2u8; 4]));
        // Raw: a job that lowers to no step completes, alone or after another request.
        let (mut a, mut b, mut c) = (vec![3u8; 4096], data(4096, 1), vec![0u8; 4096]);
        let bytes0 = Layout::bytes(0).unwrap();
        let whole = Layout::bytes(4096).unwrap();
        // SAFETY: the buffers outlive every request, each waited before the end of the test.
        unsafe {
            let r = e
                .submit_raw(Job::copy(raw(&mut a), bytes0, raw(&mut b), bytes0))
                .unwrap();
            assert_eq!(r.wait(), Ok(()), "{name}: raw copy");
            let r = e
                .submit_raw(Job::fill(raw(&mut a), empty_2d, &[0; 4]))
                .unwrap();
            assert_eq!(r.wait(), Ok(()), "{name}: raw fill");
            let first = e
                .submit_raw(Job::copy(raw(&mut c), whole, raw(&mut b), whole))
                .unwrap();
            let r = e
                .submit_raw(Job::copy(raw(&mut a), bytes0, raw(&mut b), bytes0).after(&first))
                .unwrap();
            assert_eq!(r.wait(), Ok(()), "{name}: raw copy after another");
            assert_eq!(first.wait(), Ok(()));
            let bad = e.submit_raw(Job::copy(raw(&mut a), bytes0, raw(&mut b), whole));
            assert!(bad.is_err(), "{name}: one empty side");
        }
        assert_eq!((a, c), (vec![3u8; 4096], b), "{name}");
        e.barrier().unwrap();
    }
    // The programs: no step for either.
    let mut p = Program::new(16, Some(16));
    p.copy(&empty, &empty_2d).unwrap();
    p.fill(&empty_2d, &[0; 4]).unwrap();
    assert!(p.steps().is_empty());
    assert!(p.copy(&empty, &four).is_err() && p.steps().is_empty());
}

/// Small 2-D tiles run at submit as a loop over their rows (issue 32): done at submit, the same
/// bytes as the queued path, and the same refusals (destination rows that overlap, a source
/// outside its buffer).
#[test]
fn tiles_run_at_submit_match_the_queued_path() {
    let (e, queued) = (CpuEngine::new(2).unwrap(), cpu(2));
    let src = data(8192, 7);
    // (dims, dst byte strides, src byte strides, elem size, dst offset, src offset)
    type Case = (
        &'static [usize],
        &'static [usize],
        &'static [usize],
        usize,
        usize,
        usize,
    );
    let cases: [Case; 6] = [
        (&[16, 64], &[64, 1], &[128, 1], 1, 0, 32), // pitched source
        (&[8, 16], &[40, 2], &[64, 2], 2, 8, 6),    // both pitched, offsets
        (&[1, 5, 1, 12], &[1, 64, 1, 4], &[1, 48, 1, 4], 4, 0, 4), // unit dims
        (&[1, 1, 100], &[1, 1, 1], &[1, 1, 1], 1, 3, 1), // one run
        (&[4, 8], &[0, 1], &[64, 1], 1, 0, 0),      // destination rows overlap
        (&[4, 8], &[8, 1], &[4096, 1], 1, 0, 0),    // source beyond its buffer
    ];
    for (dims, ds, ss, es, doff, soff) in cases {
        let dl = Layout::with_byte_strides(dims, ds, es)
            .and_then(|l| l.with_offset(doff))
            .unwrap();
        let sl = Layout::with_byte_strides(dims, ss, es)
            .and_then(|l| l.with_offset(soff))
            .unwrap();
        let run = |eng: &CpuEngine| {
            let mut dst = vec![0u8; 2048];
            let r = eng.scope(|s| -> ferry::Result<bool> {
                let req = s.copy(&mut dst[..], &dl, &src[..4096], &sl)?;
                let done = req.is_done();
                req.wait()?;
                Ok(done)
            });
            (r.map_err(|e| e.to_string()), dst)
        };
        let ((a, da), (b, db)) = (run(&e), run(&queued));
        assert_eq!(a.is_ok(), b.is_ok(), "{dims:?}: {a:?} / {b:?}");
        if let (Err(x), Err(y)) = (&a, &b) {
            assert_eq!(x, y, "{dims:?}");
        }
        assert_eq!(
            a.as_ref().ok(),
            a.is_ok().then_some(&true),
            "{dims:?}: done at submit"
        );
        assert_eq!(da, db, "{dims:?}");
        if a.is_ok() {
            // Against the naive reference: element by element.
            let mut want = vec![0u8; 2048];
            for (o, i) in dl.element_offsets().zip(sl.element_offsets()) {
                want[o..o + es].copy_from_slice(&src[i..i + es]);
            }
            assert_eq!(da, want, "{dims:?}");
        }
    }
}
