//! Fault injection on the host engines: custom operators that fail or panic in the middle of a
//! batch, failed dependencies, engines dropped with failing work in flight, and leak checks
//! (threads, file descriptors, heap allocations) over many engine lifetimes.
//!
//! The CUDA engine's faults (device out of memory, also in the middle of a staged copy; staging
//! threads panicking; custom operators in a CUDA batch) are in `cuda_faults.rs`; the file
//! engine's (read/write errors mid-load, a file shrinking during a load, a panicking reader) in
//! `file_io.rs`. Not covered: a driver error on one stream.

use ferry::{
    CpuConfig, CpuEngine, Engine, EngineExt, Job, Layout, MultiplexEngine, Op, OpError, Operator,
    Program, RawBuf, Request, RequestError,
};
use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// A counting allocator for the whole test binary: live allocations and live bytes.

struct Counting;
static LIVE_ALLOCS: AtomicIsize = AtomicIsize::new(0);
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: AllocLayout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            LIVE_ALLOCS.fetch_add(1, Ordering::Relaxed);
            LIVE_BYTES.fetch_add(l.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: AllocLayout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            LIVE_ALLOCS.fetch_add(1, Ordering::Relaxed);
            LIVE_BYTES.fetch_add(l.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: AllocLayout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(p, l) };
        LIVE_ALLOCS.fetch_sub(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(l.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: AllocLayout, new: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            LIVE_BYTES.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

// ---------------------------------------------------------------------------------------------
// Operators used as faults.

/// Every test buffer here is `N` bytes.
const N: usize = 4096;

/// A working custom operator: copies the first `N` bytes of the source into the destination.
struct CopyAll;
impl Operator for CopyAll {
    fn name(&self) -> &str {
        "copy-all"
    }
    fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
        let l = Layout::bytes(N)?;
        prog.copy(&l, &l)
    }
}

/// Returns an error from `lower`, after an optional delay.
struct Fails(&'static str, Duration);
impl Operator for Fails {
    fn name(&self) -> &str {
        "fails"
    }
    fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
        std::thread::sleep(self.1);
        // A step is added first: a failing operator's partial program must not run.
        prog.fill(&Layout::bytes(1)?, &[0xEE])?;
        Err(OpError::Custom(self.0.to_string()))
    }
}

/// Panics in `lower`.
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

// ---------------------------------------------------------------------------------------------
// Helpers.

const POISON: u8 = 0xA5;

fn src_bytes(seed: u8) -> Vec<u8> {
    (0..N)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// Engines the fault tests run against, by name. Extend with GPU engines when they exist.
fn engines() -> Vec<(String, Box<dyn Engine>)> {
    let cpu = |c: CpuConfig| CpuEngine::with_config(c).expect("cpu engine");
    let mut v: Vec<Box<dyn Engine>> = vec![
        Box::new(cpu(CpuConfig::caller_runs())),
        Box::new(cpu(CpuConfig::new(1).inline_bytes(0))),
        Box::new(cpu(CpuConfig::new(3).inline_bytes(0).chunk_bytes(512))),
    ];
    v.push(Box::new(
        MultiplexEngine::new()
            .with(cpu(CpuConfig::new(1).inline_bytes(0)), 1.0)
            .with(cpu(CpuConfig::caller_runs()), 1.0)
            .with(cpu(CpuConfig::new(2).inline_bytes(0).chunk_bytes(256)), 2.0),
    ));
    v.into_iter().map(|e| (e.name(), e)).collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Copy,
    Custom,
    Fail,
    Panic,
}

fn op_for(kind: Kind, k: usize) -> Op {
    let l = Layout::bytes(N).expect("layout");
    match kind {
        Kind::Copy => Op::Copy { dst: l, src: l },
        Kind::Custom => Op::Custom(Arc::new(CopyAll)),
        Kind::Fail => Op::Custom(Arc::new(Fails(
            if k % 2 == 0 { "even" } else { "odd" },
            Duration::ZERO,
        ))),
        Kind::Panic => Op::Custom(Arc::new(Panics)),
    }
}

fn check_result(kind: Kind, r: &Result<(), RequestError>, dst: &[u8], src: &[u8], ctx: &str) {
    match kind {
        Kind::Copy | Kind::Custom => {
            assert_eq!(r, &Ok(()), "{ctx}");
            assert!(dst == src, "{ctx}: destination differs from source");
        }
        Kind::Fail => {
            assert!(
                matches!(r, Err(RequestError::Operator { op, msg }) if op == "fails" && (msg == "even" || msg == "odd")),
                "{ctx}: {r:?}"
            );
            assert!(
                dst.iter().all(|&b| b == POISON),
                "{ctx}: a failed request wrote its destination"
            );
        }
        Kind::Panic => {
            assert!(
                matches!(r, Err(RequestError::Panicked { op, msg }) if op == "panics" && msg == "injected panic"),
                "{ctx}: {r:?}"
            );
            assert!(
                dst.iter().all(|&b| b == POISON),
                "{ctx}: a panicked request wrote its destination"
            );
        }
    }
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

// ---------------------------------------------------------------------------------------------
// Tests.

/// A batch of 24 requests where every third fails or panics: only those fail, each with its own
/// error; the others copy correctly; later requests complete; barriers stay clean.
#[test]
#[cfg_attr(
    miri,
    ignore = "MiB buffers: too slow under Miri; small_cases_for_miri covers these paths"
)]
fn failing_and_panicking_operators_fail_only_their_requests() {
    quiet_panics();
    let kinds = [
        Kind::Copy,
        Kind::Fail,
        Kind::Custom,
        Kind::Copy,
        Kind::Panic,
        Kind::Custom,
    ];
    for (name, engine) in engines() {
        let src = src_bytes(7);
        let mut dsts = vec![vec![POISON; N]; 24];
        let results: Vec<(Kind, Result<(), RequestError>)> = engine
            .scope(|s| {
                Ok::<_, ferry::BarrierError>({
                    let reqs: Vec<(Kind, Request)> = dsts
                        .iter_mut()
                        .enumerate()
                        .map(|(k, d)| {
                            let kind = kinds[k % kinds.len()];
                            (
                                kind,
                                s.submit(&mut d[..], Some(&src[..]), op_for(kind, k), &[])
                                    .expect("submit"),
                            )
                        })
                        .collect();
                    reqs.into_iter().map(|(kind, r)| (kind, r.wait())).collect()
                })
            })
            .expect("every failure was observed by wait: the barrier is clean");
        for (k, ((kind, r), d)) in results.iter().zip(&dsts).enumerate() {
            check_result(*kind, r, d, &src, &format!("{name} request {k} ({kind:?})"));
        }
        // Still usable: a large copy split across the workers.
        let big_src: Vec<u8> = (0..(4 << 20)).map(|i: usize| (i % 251) as u8).collect();
        let mut big_dst = vec![0u8; 4 << 20];
        engine
            .scope(|s| {
                Ok::<_, ferry::BarrierError>(
                    s.memcpy(&mut big_dst[..], &big_src[..]).map(Request::wait),
                )
            })
            .expect("barrier")
            .expect("submit")
            .expect("copy");
        assert!(big_dst == big_src, "{name}: copy after faults");
        assert!(engine.barrier().is_ok(), "{name}");
    }
}

/// Panics in custom operators do not kill workers: the live worker count is unchanged after
/// 100 panics, and the workers still split a large copy.
#[test]
#[cfg_attr(
    miri,
    ignore = "MiB buffers: too slow under Miri; small_cases_for_miri covers these paths"
)]
fn panics_do_not_poison_cpu_workers() {
    quiet_panics();
    for threads in [1usize, 2, 4] {
        let engine = CpuEngine::with_config(
            CpuConfig {
                threads,
                ..CpuConfig::caller_runs()
            }
            .inline_bytes(0)
            .chunk_bytes(4096),
        )
        .expect("engine");
        assert_eq!(engine.live_workers(), threads);
        let src = src_bytes(1);
        for round in 0..10 {
            let mut dsts = vec![vec![POISON; N]; 10];
            engine
                .scope(|s| {
                    let reqs: Vec<Request> = dsts
                        .iter_mut()
                        .map(|d| {
                            s.custom(&mut d[..], &src[..], Arc::new(Panics))
                                .expect("submit")
                        })
                        .collect();
                    for r in reqs {
                        check_result(
                            Kind::Panic,
                            &r.wait(),
                            &[POISON],
                            &[],
                            &format!("cpu({threads}) round {round}"),
                        );
                    }
                    Ok::<_, ferry::BarrierError>(())
                })
                .expect("barrier");
            assert_eq!(
                engine.live_workers(),
                threads,
                "cpu({threads}) lost a worker in round {round}"
            );
        }
        let big_src: Vec<u8> = (0..(8 << 20)).map(|i: usize| (i % 253) as u8).collect();
        let mut big_dst = vec![0u8; 8 << 20];
        engine
            .scope(|s| {
                Ok::<_, ferry::BarrierError>(
                    s.memcpy(&mut big_dst[..], &big_src[..]).map(Request::wait),
                )
            })
            .expect("barrier")
            .expect("submit")
            .expect("copy");
        assert!(big_dst == big_src);
        assert_eq!(engine.live_workers(), threads);
    }
}

/// A failing or panicking custom operator submitted through a multiplex engine fails only its
/// request: it must not panic on the submitting thread.
#[test]
fn multiplex_custom_operator_panic_fails_only_its_request() {
    quiet_panics();
    let mux = MultiplexEngine::new()
        .with(CpuEngine::new(1).expect("cpu"), 1.0)
        .with(CpuEngine::new(1).expect("cpu"), 1.0);
    let src = src_bytes(3);
    let mut dst = vec![POISON; N];
    let submitted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        mux.scope(|s| {
            Ok::<_, ferry::BarrierError>({
                s.custom(&mut dst[..], &src[..], Arc::new(Panics))
                    .map(Request::wait)
            })
        })
    }));
    let r = submitted.expect("submit to a multiplex must not panic on the caller's thread");
    let r = r.expect("barrier").expect("submit");
    check_result(Kind::Panic, &r, &dst, &src, "multiplex");
}

/// An engine whose submit panics (engines are safe to implement), after starting a thread that
/// completes `gate` a little later.
struct PanicsAtSubmit(Arc<ferry::request::Signal>);

impl Engine for PanicsAtSubmit {
    fn name(&self) -> String {
        "panics-at-submit".into()
    }
    fn supports(&self, _: ferry::MemKind, _: Option<ferry::MemKind>) -> bool {
        true
    }
    unsafe fn submit_raw(&self, _: Job) -> Result<Request, ferry::SubmitError> {
        let gate = Arc::clone(&self.0);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            gate.complete(Ok(()));
        });
        panic!("injected panic");
    }
    fn barrier(&self) -> Result<(), ferry::BarrierError> {
        Ok(())
    }
}

/// A copy split across a CPU engine and an engine whose submit panics: the scope unwinds only
/// once the parts already submitted to the CPU engine have completed (they once ran on into
/// the caller's freed buffers: a SIGSEGV with buffers of tens of MiB).
#[test]
fn multiplex_waits_for_submitted_parts_when_a_submit_panics() {
    quiet_panics();
    let gate = Arc::new(ferry::request::Signal::new());
    let gate_req = Request::new(Arc::clone(&gate));
    let mux = MultiplexEngine::new()
        .with(CpuEngine::new(1).expect("cpu"), 1.0)
        .with(PanicsAtSubmit(Arc::clone(&gate)), 1.0)
        .split_bytes(1 << 10);
    let (src, mut dst) = (vec![7u8; N], vec![0u8; N]);
    let l = Layout::bytes(N).expect("layout");
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // The CPU engine's parts wait for the gate, which opens only after the panic.
        mux.scope(|s| -> ferry::Result<()> {
            drop(s.submit(
                &mut dst[..],
                Some(&src[..]),
                Op::Copy { dst: l, src: l },
                &[&gate_req],
            )?);
            Ok(())
        })
    }));
    let copied = dst.iter().filter(|&&b| b == 7).count();
    // Whatever happened, nothing may still write `dst` when it is dropped.
    let _ = mux.barrier();
    assert!(unwound.is_err(), "the engine's panic goes on to the caller");
    assert_eq!(
        copied,
        N / 2,
        "the CPU engine's parts (the first half: equal weights) were still running when the \
         scope unwound"
    );
}

/// A completion whose wait panics; never done.
struct WaitPanics;

impl ferry::Completion for WaitPanics {
    fn wait(&self) -> Result<(), RequestError> {
        panic!("injected panic");
    }
    fn poll_done(&self) -> Option<Result<(), RequestError>> {
        None
    }
    fn register_waker(&self, _: &std::task::Waker) {}
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// An engine whose requests are [`WaitPanics`] (engines are safe to implement).
struct RequestsPanic;

impl Engine for RequestsPanic {
    fn name(&self) -> String {
        "requests-panic".into()
    }
    fn supports(&self, _: ferry::MemKind, _: Option<ferry::MemKind>) -> bool {
        true
    }
    unsafe fn submit_raw(&self, _: Job) -> Result<Request, ferry::SubmitError> {
        Ok(Request::new(WaitPanics))
    }
    fn barrier(&self) -> Result<(), ferry::BarrierError> {
        Ok(())
    }
}

/// A scope over a multiplex engine whose first engine's requests panic when waited for: the
/// scope's end waits for its other requests (here one on the CPU engine, held back by a gate
/// that opens later) before the panic goes on (it once unwound at the first panic, the CPU
/// copy still running into the caller's buffers).
#[test]
fn scope_waits_for_every_request_when_one_wait_panics() {
    quiet_panics();
    let gate = Arc::new(ferry::request::Signal::new());
    let gate_req = Request::new(Arc::clone(&gate));
    // Whole requests by weight, the first to the first engine: A panics, B copies.
    let mux = MultiplexEngine::new()
        .with(RequestsPanic, 1.0)
        .with(CpuEngine::new(1).expect("cpu"), 1.0)
        .split_bytes(usize::MAX);
    let (src, mut a, mut b) = (vec![7u8; N], vec![0u8; N], vec![0u8; N]);
    let l = Layout::bytes(N).expect("layout");
    let copy = Op::Copy { dst: l, src: l };
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        mux.scope(|s| -> ferry::Result<()> {
            drop(s.submit(&mut a[..], Some(&src[..]), copy.clone(), &[])?);
            drop(s.submit(&mut b[..], Some(&src[..]), copy.clone(), &[&gate_req])?);
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                gate.complete(Ok(()));
            });
            Ok(())
        })
    }));
    let copied = b.iter().filter(|&&x| x == 7).count();
    // Whatever happened, nothing may still write `b` when it is dropped.
    let cpu = mux.engines().nth(1).expect("the CPU engine").0;
    let _ = cpu.barrier();
    assert!(
        unwound.is_err(),
        "the completion's panic goes on to the caller"
    );
    assert_eq!(
        copied, N,
        "the CPU copy was still running when the scope unwound"
    );
}

/// Failures nobody waited for are reported by the engine's barrier, one entry each, once.
#[test]
fn unobserved_failures_are_reported_by_barrier_once() {
    quiet_panics();
    for (name, engine) in engines() {
        let src = src_bytes(9);
        let mut bufs = vec![vec![POISON; N]; 12];
        let out = engine.scope(|s| {
            for (k, d) in bufs.iter_mut().enumerate() {
                let kind = [Kind::Copy, Kind::Fail, Kind::Panic][k % 3];
                drop(
                    s.submit(&mut d[..], Some(&src[..]), op_for(kind, k), &[])
                        .expect("submit"),
                );
            }
            Ok::<_, ferry::BarrierError>(())
        });
        let err = out.expect_err("the scope reports the dropped failures");
        assert_eq!(err.failures.len(), 8, "{name}: {err}");
        let (fails, panics) = err.failures.iter().fold((0, 0), |(f, p), (_, e)| match e {
            RequestError::Operator { .. } => (f + 1, p),
            RequestError::Panicked { .. } => (f, p + 1),
            other => panic!("{name}: unexpected {other:?}"),
        });
        assert_eq!((fails, panics), (4, 4), "{name}");
        // Already reported through the scope: the engine barrier does not repeat them.
        assert!(engine.barrier().is_ok(), "{name}: failures reported twice");
        for (k, d) in bufs.iter().enumerate() {
            let ok = k % 3 == 0;
            assert!(
                if ok {
                    d == &src
                } else {
                    d.iter().all(|&b| b == POISON)
                },
                "{name}: buffer {k}"
            );
        }
    }
}

/// A dependency that fails makes its dependents fail with `RequestError::Dependency` without
/// running them, along a chain and across engines; a good dependency orders the copies.
#[test]
fn failed_dependency_fails_dependents() {
    quiet_panics();
    let list = engines();
    for (an, a) in &list {
        for (bn, b) in &list {
            let ctx = format!("{an} -> {bn}");
            let src = src_bytes(5);
            let mut d0 = vec![POISON; N];
            let mut d1 = vec![POISON; N];
            let mut d2 = vec![POISON; N];
            let mut d3 = vec![POISON; N];
            // Scopes on two engines: requests of one scope may depend on the other's.
            let (r1, r2, r3) = a
                .scope(|sa| {
                    b.scope(|sb| {
                        let slow = Op::Custom(Arc::new(Fails("dep", Duration::from_millis(5))));
                        let r0 = sa
                            .submit(&mut d0[..], Some(&src[..]), slow, &[])
                            .expect("submit");
                        let l = Layout::bytes(N).expect("layout");
                        let cp = Op::Copy { dst: l, src: l };
                        let r1 = sb
                            .submit(&mut d1[..], Some(&src[..]), cp.clone(), &[&r0])
                            .expect("submit");
                        let r2 = sa
                            .submit(&mut d2[..], Some(&src[..]), cp.clone(), &[&r1])
                            .expect("submit");
                        let r3 = sb
                            .submit(&mut d3[..], Some(&src[..]), cp, &[])
                            .expect("submit");
                        let out = (r1.wait(), r2.wait(), r3.wait());
                        assert!(
                            matches!(r0.wait(), Err(RequestError::Operator { .. })),
                            "{ctx}"
                        );
                        Ok::<_, ferry::BarrierError>(out)
                    })
                })
                .expect("barrier");
            match &r1 {
                Err(RequestError::Dependency(e)) => {
                    assert!(matches!(**e, RequestError::Operator { .. }), "{ctx}: {e:?}")
                }
                other => panic!("{ctx}: r1 {other:?}"),
            }
            assert!(
                matches!(&r2, Err(RequestError::Dependency(_))),
                "{ctx}: r2 {r2:?}"
            );
            assert_eq!(r3, Ok(()), "{ctx}: an independent request");
            assert!(
                d1.iter().chain(&d2).all(|&b| b == POISON),
                "{ctx}: a dependent ran"
            );
            assert!(d3 == src, "{ctx}");
            assert!(a.barrier().is_ok() && b.barrier().is_ok(), "{ctx}");
        }
    }
}

/// A chain A -> B -> C where each copies the previous one's destination: the dependency orders
/// them (raw submission: the safe scope cannot lend one buffer as a destination and a source).
#[test]
fn good_dependency_chain_orders_copies() {
    for (name, engine) in engines() {
        for round in 0..20u8 {
            let src = src_bytes(round);
            let mut bufs = [vec![POISON; N], vec![POISON; N], vec![POISON; N]];
            let l = Layout::bytes(N).expect("layout");
            let raw =
                |b: &mut Vec<u8>| RawBuf::host(b.as_mut_ptr(), b.len(), ferry::MemKind::Pageable);
            let (b0, b1, b2) = (raw(&mut bufs[0]), raw(&mut bufs[1]), raw(&mut bufs[2]));
            let s = RawBuf::host(src.as_ptr(), src.len(), ferry::MemKind::Pageable);
            // A slow first step makes the ordering matter.
            struct SlowCopy;
            impl Operator for SlowCopy {
                fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
                    std::thread::sleep(Duration::from_millis(2));
                    let l = Layout::bytes(N)?;
                    prog.copy(&l, &l)
                }
            }
            // SAFETY: every buffer outlives the requests: all three are waited below before
            // `bufs` and `src` go out of scope, and nothing touches them meanwhile.
            let (r0, r1, r2) = unsafe {
                let r0 = engine
                    .submit_raw(Job::custom(b0, Some(s), Arc::new(SlowCopy)))
                    .expect("submit");
                let r1 = engine
                    .submit_raw(Job::copy(b1, l, b0, l).after(&r0))
                    .expect("submit");
                let r2 = engine
                    .submit_raw(Job::copy(b2, l, b1, l).after(&r1))
                    .expect("submit");
                (r0, r1, r2)
            };
            assert_eq!(r2.wait(), Ok(()), "{name}");
            assert_eq!(r1.wait(), Ok(()), "{name}");
            assert_eq!(r0.wait(), Ok(()), "{name}");
            for (k, b) in bufs.iter().enumerate() {
                assert!(
                    b == &src,
                    "{name} round {round}: buffer {k} not ordered after its dependency"
                );
            }
        }
    }
}

/// Dropping an engine with a slow failing request and queued copies in flight: the drop
/// finishes the work, the failing request reports its own error, the copies are complete.
#[test]
fn engine_dropped_with_failing_request_in_flight() {
    quiet_panics();
    for threads in [0usize, 1, 3] {
        for round in 0..5 {
            let ctx = format!("cpu({threads}) round {round}");
            let engine = CpuEngine::with_config(
                CpuConfig {
                    threads,
                    ..CpuConfig::caller_runs()
                }
                .inline_bytes(0),
            )
            .expect("engine");
            let src = src_bytes(round);
            let mut fail_dst = vec![POISON; N];
            let mut panic_dst = vec![POISON; N];
            let s = RawBuf::host(src.as_ptr(), N, ferry::MemKind::Pageable);
            // SAFETY: the buffers outlive the requests, which are waited below before the
            // buffers are dropped; nothing else touches them meanwhile.
            let (rf, rp) = unsafe {
                let fd = RawBuf::host(fail_dst.as_mut_ptr(), N, ferry::MemKind::Pageable);
                let pd = RawBuf::host(panic_dst.as_mut_ptr(), N, ferry::MemKind::Pageable);
                let rf = engine
                    .submit_raw(Job::custom(
                        fd,
                        Some(s),
                        Arc::new(Fails("late", Duration::from_millis(20))),
                    ))
                    .expect("submit");
                let rp = engine
                    .submit_raw(Job::custom(pd, Some(s), Arc::new(Panics)))
                    .expect("submit");
                (rf, rp)
            };
            // Owned transfers queued behind the failing request.
            let transfers: Vec<_> = (0..6)
                .map(|_| {
                    engine
                        .memcpy_owned(vec![POISON; N], src.clone())
                        .map_err(|r| r.error)
                        .expect("submit")
                })
                .collect();
            drop(engine);
            assert!(
                matches!(rf.wait(), Err(RequestError::Operator { ref msg, .. }) if msg == "late"),
                "{ctx}"
            );
            assert!(
                matches!(rp.wait(), Err(RequestError::Panicked { .. })),
                "{ctx}"
            );
            for t in transfers {
                let (d, s2) = t.wait().map_err(|f| f.error).expect("transfer");
                assert!(d == src && s2 == src, "{ctx}");
            }
            assert!(
                fail_dst.iter().chain(&panic_dst).all(|&b| b == POISON),
                "{ctx}"
            );
        }
    }
}

/// Count of entries in a /proc directory of this process.
fn proc_count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn snapshot() -> (usize, usize, isize, isize) {
    (
        proc_count("/proc/self/task"),
        proc_count("/proc/self/fd"),
        LIVE_ALLOCS.load(Ordering::SeqCst),
        LIVE_BYTES.load(Ordering::SeqCst),
    )
}

/// One round of engine lifetimes with faults: engines of each kind created, used (copies,
/// fills, failures, panics, dependencies, dropped requests, futures) and dropped.
fn churn_round(round: usize) {
    for (name, engine) in engines() {
        let src = src_bytes(round as u8);
        let mut bufs = vec![vec![POISON; N]; 6];
        let _ = engine.scope(|s| {
            Ok::<_, ferry::BarrierError>({
                let mut it = bufs.iter_mut();
                let mut next = || &mut it.next().expect("buffer")[..];
                let a = s
                    .submit(next(), Some(&src[..]), op_for(Kind::Fail, round), &[])
                    .expect("submit");
                let b = s
                    .submit(next(), Some(&src[..]), op_for(Kind::Copy, round), &[&a])
                    .expect("submit");
                drop(
                    s.submit(next(), Some(&src[..]), op_for(Kind::Panic, round), &[])
                        .expect("submit"),
                );
                let c = s
                    .submit(next(), Some(&src[..]), op_for(Kind::Custom, round), &[])
                    .expect("submit");
                let d = s
                    .fill(next(), &Layout::bytes(N).expect("layout"), &[1])
                    .expect("submit");
                let _ = (a.wait(), b.wait(), c.wait());
                drop(d);
                s.memcpy(next(), &src[..]).expect("submit")
            })
        });
        let _ = engine.barrier();
        let t = engine
            .memcpy_owned(vec![0u8; N], src.clone())
            .map_err(|r| r.error)
            .expect("submit");
        let (d, _) = t.wait().map_err(|f| f.error).expect("transfer");
        assert!(d == src, "{name}");
    }
}

/// Run by `no_leaks_over_engine_lifetimes` in a child process with one test thread, so the
/// thread, fd and allocation counts see only this test.
#[test]
#[ignore = "run by no_leaks_over_engine_lifetimes in a child process"]
fn leak_child() {
    quiet_panics();
    // Warm up one-time allocations (std's lazy statics, the panic hook, thread names).
    for round in 0..3 {
        churn_round(round);
    }
    // A worker joined in the warm-up may still be listed in /proc for a moment: wait until the
    // thread count holds still, or `before` counts a thread that `after` no longer sees.
    let mut before = snapshot();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(10));
        let again = snapshot();
        if again.0 == before.0 {
            break;
        }
        before = again;
    }
    for round in 0..60 {
        churn_round(round);
    }
    // Worker threads are joined on drop; give the kernel a moment to reap them from /proc.
    let mut after = snapshot();
    for _ in 0..50 {
        if after.0 == before.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        after = snapshot();
    }
    println!("leak-check before (threads, fds, allocs, bytes) = {before:?}, after = {after:?}");
    assert_eq!(after.0, before.0, "threads leaked");
    assert_eq!(after.1, before.1, "file descriptors leaked");
    assert_eq!(after.2, before.2, "heap allocations leaked (live count)");
    assert_eq!(after.3, before.3, "heap bytes leaked");
}

/// No threads, file descriptors or heap allocations leak over 60 rounds of creating, using
/// (with failures, panics, dependencies, dropped requests) and dropping every engine kind.
#[test]
#[cfg_attr(miri, ignore = "spawns a process and reads /proc")]
fn no_leaks_over_engine_lifetimes() {
    let exe = std::env::current_exe().expect("test binary path");
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "leak_child",
            "--ignored",
            "--test-threads=1",
            "--nocapture",
        ])
        .output()
        .expect("run the leak child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "leak child failed:\n{text}");
    assert!(text.contains("1 passed"), "leak child did not run:\n{text}");
    let line = text
        .lines()
        .find(|l| l.contains("leak-check"))
        .unwrap_or("");
    println!("{line}");
}

/// Small cases for Miri: every engine kind, copies (strided), fills, a failure, a panic, a
/// dependency, a dropped request, an owned transfer, an engine dropped with work queued.
#[test]
fn small_cases_for_miri() {
    quiet_panics();
    const M: usize = 64;
    let l = Layout::contiguous(&[8, 8], 1).expect("layout");
    let t = l.transpose(0, 1).expect("transpose");
    for (name, engine) in engines() {
        let src: Vec<u8> = (0..M as u8).collect();
        let mut d = [
            vec![POISON; M],
            vec![POISON; M],
            vec![POISON; M],
            vec![POISON; M],
        ];
        let [d0, d1, d2, d3] = &mut d;
        engine
            .scope(|s| {
                let a = s.copy(&mut d0[..], &l, &src[..], &t).expect("submit");
                let b = s
                    .fill(&mut d1[..], &l.slice(0, 0..8, 2).expect("slice"), &[7])
                    .expect("submit");
                let f = s
                    .submit(
                        &mut d2[..],
                        Some(&src[..]),
                        Op::Custom(Arc::new(Panics)),
                        &[],
                    )
                    .expect("submit");
                let g = s
                    .submit(
                        &mut d3[..],
                        Some(&src[..]),
                        Op::Copy { dst: l, src: l },
                        &[&f],
                    )
                    .expect("submit");
                assert_eq!(a.wait(), Ok(()), "{name}");
                assert_eq!(b.wait(), Ok(()), "{name}");
                let fr = f.wait();
                assert!(
                    matches!(fr, Err(RequestError::Panicked { .. })),
                    "{name}: {fr:?}"
                );
                drop(g);
                Ok::<_, ferry::BarrierError>(())
            })
            .expect_err("the dropped dependent's failure is reported");
        for i in 0..8 {
            for j in 0..8 {
                assert_eq!(d[0][i * 8 + j], src[j * 8 + i], "{name}");
                assert_eq!(
                    d[1][i * 8 + j],
                    if i % 2 == 0 { 7 } else { POISON },
                    "{name}"
                );
            }
        }
        assert!(d[3].iter().all(|&b| b == POISON), "{name}");
        let tr = engine
            .memcpy_owned(vec![0u8; M], src.clone())
            .map_err(|r| r.error)
            .expect("submit");
        drop(engine);
        let (out, _) = tr.wait().map_err(|f| f.error).expect("transfer");
        assert_eq!(out, src, "{name}");
    }
}

/// Runs the ignored test `name` alone in a child process with one test thread; returns its
/// output (the parent fails if the child fails).
fn run_child(name: &str) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            name,
            "--ignored",
            "--test-threads=1",
            "--nocapture",
        ])
        .output()
        .expect("run the child test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} failed:\n{text}");
    assert!(text.contains("1 passed"), "{name} did not run:\n{text}");
    text
}

/// Run by `dropped_requests_do_not_accumulate` in a child process.
#[test]
#[ignore = "run by dropped_requests_do_not_accumulate in a child process"]
fn inflight_child() {
    let engine = CpuEngine::new(1).expect("engine");
    let round = |n: usize| {
        for _ in 0..n {
            // Dropping a Transfer waits for it; nobody observes its (successful) result.
            drop(
                engine
                    .memcpy_owned(vec![0u8; 64], vec![1u8; 64])
                    .map_err(|r| r.error)
                    .expect("submit"),
            );
        }
    };
    round(1000);
    engine.barrier().expect("barrier");
    let before = LIVE_ALLOCS.load(Ordering::SeqCst);
    round(20_000);
    let grown = LIVE_ALLOCS.load(Ordering::SeqCst) - before;
    engine.barrier().expect("barrier");
    let after_barrier = LIVE_ALLOCS.load(Ordering::SeqCst) - before;
    println!("inflight: live allocations grew by {grown} over 20000 dropped transfers, {after_barrier} after a barrier");
    assert!(
        grown < 1000,
        "completed, successful requests accumulate until a barrier: {grown} live allocations"
    );
}

/// An engine used without barriers (a long-running server that drops its transfers) must not
/// keep every completed request: memory would grow without bound.
#[test]
#[cfg_attr(miri, ignore = "spawns a process")]
fn dropped_requests_do_not_accumulate() {
    let text = run_child("inflight_child");
    println!(
        "{}",
        text.lines().find(|l| l.contains("inflight:")).unwrap_or("")
    );
}
