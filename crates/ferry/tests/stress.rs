//! Stress: many threads submit a random mix of copies and fills (sizes from bytes to MiB;
//! contiguous, sliced, strided, transposed, pitched, column-major layouts) to a random mix of
//! engines (CPU with 0, 1 and N workers, inline and queued; a multiplex of CPU engines that
//! splits large copies), with random drops of requests, of whole engines with work in flight,
//! barriers from several threads, dependencies across engines, and futures. Every destination is
//! compared byte for byte with a naive element-wise reference, poisoned bytes outside included.
//!
//! Bounded for CI (about 15 s and a few thousand operations in debug on 2 cores). Larger runs:
//! `FERRY_STRESS_SECS=600 FERRY_STRESS_OPS=10000000 cargo test --release --test stress`.
//! `FERRY_STRESS_SEED` replays a run (the seed is printed at the start and in every failure);
//! `FERRY_STRESS_THREADS` sets the submitting threads (default 6).
//!
//! The engine list is [`factories`]; the CUDA engines have their own stress test, with GPU memory
//! kinds and leak counts: `cuda_stress.rs`.

use ferry::{
    CpuConfig, CpuEngine, Engine, EngineExt, Job, Layout, MemKind, MultiplexEngine, RawBuf, Request,
};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

mod stress_common;
use stress_common::{fmt_layout, place, shape, Rng};

// ---------------------------------------------------------------------------------------------
// Configuration and randomness.

struct Cfg {
    secs: f64,
    ops: usize,
    seed: u64,
    threads: usize,
}

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn cfg() -> Cfg {
    let seed = env("FERRY_STRESS_SEED").unwrap_or_else(|| {
        if cfg!(miri) {
            // Miri isolates the clock; a fixed seed keeps its runs reproducible.
            return 1;
        }
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ u64::from(std::process::id())
    });
    Cfg {
        secs: env("FERRY_STRESS_SECS").unwrap_or(if cfg!(miri) { 0.0 } else { 15.0 }),
        ops: env("FERRY_STRESS_OPS").unwrap_or(if cfg!(miri) { 12 } else { 4000 }),
        seed,
        threads: env("FERRY_STRESS_THREADS").unwrap_or(if cfg!(miri) { 2 } else { 6 }),
    }
}

// ---------------------------------------------------------------------------------------------
// Engines.

type Factory = (&'static str, fn() -> Box<dyn Engine>);

/// Every host engine kind under stress (the CUDA engines: `cuda_stress.rs`).
fn factories() -> Vec<Factory> {
    fn cpu(c: CpuConfig) -> CpuEngine {
        CpuEngine::with_config(c).expect("cpu engine")
    }
    vec![
        ("cpu(0)", || Box::new(cpu(CpuConfig::caller_runs()))),
        ("cpu(1) queued", || {
            Box::new(cpu(CpuConfig::new(1).inline_bytes(0)))
        }),
        ("cpu(4) small chunks", || {
            Box::new(cpu(CpuConfig::new(4).inline_bytes(0).chunk_bytes(4096)))
        }),
        ("cpu(2) default", || Box::new(cpu(CpuConfig::new(2)))),
        ("multiplex", || {
            Box::new(
                MultiplexEngine::new()
                    .with(cpu(CpuConfig::new(1).inline_bytes(0)), 1.0)
                    .with(cpu(CpuConfig::caller_runs()), 1.0)
                    .with(cpu(CpuConfig::new(2).chunk_bytes(8192)), 2.0)
                    .split_bytes(256 << 10),
            )
        }),
    ]
}

// ---------------------------------------------------------------------------------------------
// Random layouts and the reference.

/// One copy or fill with its buffers and expected result.
struct Case {
    dst_layout: Layout,
    src_layout: Layout,
    pattern: Option<Vec<u8>>,
    src: Vec<u8>,
    dst: Vec<u8>,
    want: Vec<u8>,
}

impl Case {
    fn random(r: &mut Rng) -> Case {
        let (dims, elem) = shape(r, 2 << 20);
        let dst_layout = place(r, &dims, elem);
        let src_layout = place(r, &dims, elem);
        let mut src = vec![0u8; src_layout.span().end + r.below(16)];
        r.fill(&mut src);
        let poison = r.next() as u8;
        let dst = vec![poison; dst_layout.span().end + r.below(16)];
        let pattern = if r.chance(1, 6) {
            let mut p = vec![0u8; elem];
            r.fill(&mut p);
            Some(p)
        } else {
            None
        };
        let mut want = dst.clone();
        let e = elem;
        match &pattern {
            Some(p) => dst_layout
                .element_offsets()
                .for_each(|d| want[d..d + e].copy_from_slice(p)),
            None => {
                for (d, s) in dst_layout
                    .element_offsets()
                    .zip(src_layout.element_offsets())
                {
                    want[d..d + e].copy_from_slice(&src[s..s + e]);
                }
            }
        }
        Case {
            dst_layout,
            src_layout,
            pattern,
            src,
            dst,
            want,
        }
    }

    fn check(&self, ctx: &str) {
        if self.dst != self.want {
            let at = self
                .dst
                .iter()
                .zip(&self.want)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!(
                "{ctx}: destination differs from the reference at byte {at} of {} ({} <- {}, fill: {})",
                self.dst.len(),
                fmt_layout(&self.dst_layout),
                fmt_layout(&self.src_layout),
                self.pattern.is_some()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Futures without an executor crate.

struct Unpark(std::thread::Thread);
impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `f` to completion, parking between polls; a wake-up that never comes fails the test.
fn block_on<F: Future>(f: F, ctx: &str) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        let t = Instant::now();
        std::thread::park_timeout(Duration::from_secs(30));
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{ctx}: a future was never woken (lost wake-up)"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The operations.

struct Shared {
    slots: Vec<Mutex<Arc<dyn Engine>>>,
    factories: Vec<Factory>,
    done: AtomicUsize,
    counts: [AtomicUsize; 6],
}

impl Shared {
    fn engine(&self, i: usize) -> Arc<dyn Engine> {
        Arc::clone(&self.slots[i].lock().unwrap_or_else(PoisonError::into_inner))
    }
    /// Replaces an engine: the old one is dropped by whichever thread lets go of it last,
    /// possibly with work still queued.
    fn replace(&self, i: usize) {
        let fresh: Arc<dyn Engine> = Arc::from((self.factories[i].1)());
        let old = std::mem::replace(
            &mut *self.slots[i].lock().unwrap_or_else(PoisonError::into_inner),
            fresh,
        );
        drop(old);
    }
}

/// try_wait polls that fell back to wait: [engines with a zero-thread part, others].
static FALLBACKS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

const OPS: [&str; 6] = [
    "scoped batch",
    "owned transfers",
    "private engine dropped",
    "dependency chain",
    "barrier",
    "engine replaced",
];

/// A batch of cases in one scope; each request is waited, polled, awaited or dropped.
fn op_scoped(r: &mut Rng, engine: &Arc<dyn Engine>, ctx: &str) {
    let mut cases: Vec<Case> = (0..r.range(1, 6)).map(|_| Case::random(r)).collect();
    let how: Vec<usize> = cases.iter().map(|_| r.below(4)).collect();
    engine
        .scope(|s| {
            {
                let reqs: Vec<Request> = cases
                    .iter_mut()
                    .map(|c| {
                        let req = match &c.pattern {
                            Some(p) => s.fill(&mut c.dst[..], &c.dst_layout, p),
                            None => {
                                s.copy(&mut c.dst[..], &c.dst_layout, &c.src[..], &c.src_layout)
                            }
                        };
                        req.unwrap_or_else(|e| panic!("{ctx}: submit refused: {e}"))
                    })
                    .collect();
                for (k, (mut req, h)) in reqs.into_iter().zip(&how).enumerate() {
                    let res = match h {
                        0 => req.wait(),
                        // Polling: a zero-thread engine makes progress only in wait/barrier (as
                        // documented), so after a while the poller falls back to wait.
                        1 => {
                            let t = Instant::now();
                            loop {
                                if let Some(res) = req.try_wait() {
                                    break res;
                                }
                                if t.elapsed() > Duration::from_millis(20) {
                                    let zero = engine.name().contains("cpu(0)");
                                    FALLBACKS[usize::from(!zero)].fetch_add(1, Ordering::Relaxed);
                                    break req.wait();
                                }
                                std::thread::yield_now();
                            }
                        }
                        2 => block_on(req, ctx),
                        _ => {
                            drop(req);
                            Ok(())
                        }
                    };
                    assert_eq!(res, Ok(()), "{ctx}: request {k}");
                }
                Ok::<_, ferry::BarrierError>(())
            }
        })
        .unwrap_or_else(|e| panic!("{ctx}: scope barrier: {e}"));
    for (k, c) in cases.iter().enumerate() {
        c.check(&format!("{ctx} case {k}"));
    }
}

/// Owned transfers, waited or awaited, sometimes after dropping the engine that runs them.
fn op_owned(r: &mut Rng, engine: Arc<dyn Engine>, ctx: &str, drop_engine: bool) {
    let n = r.range(1, 5);
    let mut pending = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = Case::random(r);
        if c.pattern.is_some() {
            c = Case { pattern: None, ..c };
            // Recompute the reference for a copy.
            let e = c.dst_layout.elem_size();
            c.want = c.dst.clone();
            for (d, s) in c
                .dst_layout
                .element_offsets()
                .zip(c.src_layout.element_offsets())
            {
                c.want[d..d + e].copy_from_slice(&c.src[s..s + e]);
            }
        }
        let Case {
            dst_layout,
            src_layout,
            dst,
            src,
            want,
            ..
        } = c;
        let t = engine
            .copy_owned(dst, &dst_layout, src, &src_layout)
            .unwrap_or_else(|refused| panic!("{ctx}: submit refused: {}", refused.error));
        pending.push((t, dst_layout, src_layout, want));
    }
    if drop_engine {
        drop(engine);
    }
    for (k, (t, dst_layout, src_layout, want)) in pending.into_iter().enumerate() {
        let out = if r.chance(1, 2) {
            t.wait()
        } else {
            block_on(t, ctx)
        };
        let (dst, src) = out.unwrap_or_else(|f| panic!("{ctx}: transfer {k} failed: {}", f.error));
        let c = Case {
            dst_layout,
            src_layout,
            pattern: None,
            src,
            dst,
            want,
        };
        c.check(&format!("{ctx} transfer {k}"));
    }
}

/// A -> B -> C across (possibly) different engines: B copies A's destination, C copies B's.
fn op_chain(r: &mut Rng, engines: [&dyn Engine; 3], ctx: &str) {
    let len = r.range(1, if cfg!(miri) { 256 } else { 64 << 10 });
    let l = Layout::bytes(len).expect("layout");
    let mut src = vec![0u8; len];
    r.fill(&mut src);
    let mut bufs = [vec![0u8; len], vec![1u8; len], vec![2u8; len]];
    let raw = |b: &mut Vec<u8>| RawBuf::host(b.as_mut_ptr(), b.len(), MemKind::Pageable);
    let (b0, b1, b2) = (raw(&mut bufs[0]), raw(&mut bufs[1]), raw(&mut bufs[2]));
    let s = RawBuf::host(src.as_ptr(), len, MemKind::Pageable);
    // SAFETY: `src` and `bufs` outlive the three requests, which are all waited below before
    // they are dropped; only the engines touch them meanwhile, in the order the dependencies set.
    let reqs = unsafe {
        let a = engines[0]
            .submit_raw(Job::copy(b0, l, s, l))
            .expect("submit");
        let b = engines[1]
            .submit_raw(Job::copy(b1, l, b0, l).after(&a))
            .expect("submit");
        let c = engines[2]
            .submit_raw(Job::copy(b2, l, b1, l).after(&b))
            .expect("submit");
        [a, b, c]
    };
    for (k, req) in reqs.into_iter().rev().enumerate() {
        assert_eq!(req.wait(), Ok(()), "{ctx}: chain request {k}");
    }
    for (k, b) in bufs.iter().enumerate() {
        assert!(
            b == &src,
            "{ctx}: chain buffer {k} not ordered after its dependency"
        );
    }
}

fn worker(shared: &Shared, cfg: &Cfg, t: usize, deadline: Instant) {
    let mut r = Rng(cfg.seed ^ (t as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F));
    let ns = shared.slots.len();
    let mut k = 0usize;
    while shared.done.fetch_add(1, Ordering::Relaxed) < cfg.ops
        && (k == 0 || Instant::now() < deadline)
    {
        let i = r.below(ns);
        let kind = match r.below(100) {
            0..=49 => 0,
            50..=69 => 1,
            70..=77 => 2,
            78..=89 => 3,
            90..=97 => 4,
            _ => 5,
        };
        let ctx = format!(
            "seed {} thread {t} op {k} ({}) on {}",
            cfg.seed, OPS[kind], shared.factories[i].0
        );
        match kind {
            0 => op_scoped(&mut r, &shared.engine(i), &ctx),
            1 => op_owned(&mut r, shared.engine(i), &ctx, false),
            2 => {
                let e: Arc<dyn Engine> = Arc::from((shared.factories[i].1)());
                op_owned(&mut r, e, &ctx, true);
            }
            3 => {
                let es = [
                    shared.engine(i),
                    shared.engine(r.below(ns)),
                    shared.engine(r.below(ns)),
                ];
                op_chain(&mut r, [&*es[0], &*es[1], &*es[2]], &ctx);
            }
            4 => {
                let res = shared.engine(i).barrier();
                assert!(res.is_ok(), "{ctx}: barrier reported failures: {res:?}");
            }
            _ => shared.replace(i),
        }
        shared.counts[kind].fetch_add(1, Ordering::Relaxed);
        k += 1;
    }
}

#[test]
fn stress_engines_with_random_mix() {
    let cfg = cfg();
    eprintln!(
        "stress: seed {} (replay: FERRY_STRESS_SEED={}), {} threads, up to {} ops / {} s",
        cfg.seed, cfg.seed, cfg.threads, cfg.ops, cfg.secs
    );
    let factories = factories();
    let shared = Shared {
        slots: factories
            .iter()
            .map(|f| Mutex::new(Arc::from((f.1)())))
            .collect(),
        factories,
        done: AtomicUsize::new(0),
        counts: Default::default(),
    };
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(cfg.secs);
    std::thread::scope(|s| {
        for t in 0..cfg.threads {
            let (shared, cfg) = (&shared, &cfg);
            s.spawn(move || worker(shared, cfg, t, deadline));
        }
    });
    // Final barriers on every engine still in the slots.
    for (i, slot) in shared.slots.iter().enumerate() {
        let e = slot.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(
            e.barrier().is_ok(),
            "seed {}: final barrier on {}",
            cfg.seed,
            shared.factories[i].0
        );
    }
    let counts: Vec<String> = OPS
        .iter()
        .zip(&shared.counts)
        .map(|(n, c)| format!("{n}: {}", c.load(Ordering::Relaxed)))
        .collect();
    let total: usize = shared
        .counts
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum();
    println!(
        "stress: seed {}, {total} ops in {:.1} s [{}]; try_wait polls that fell back to wait \
         after 20 ms: {} on engines with a zero-thread part, {} on others",
        cfg.seed,
        start.elapsed().as_secs_f64(),
        counts.join(", "),
        FALLBACKS[0].load(Ordering::Relaxed),
        FALLBACKS[1].load(Ordering::Relaxed)
    );
    assert!(
        total >= cfg.threads.min(cfg.ops),
        "every thread ran at least one operation"
    );
}
