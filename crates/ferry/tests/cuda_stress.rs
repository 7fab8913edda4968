//! Stress on the CUDA engine: many threads submit a random mix of copies, fills and segment
//! lists (4 B to tens of MiB; contiguous, 2-D/3-D strided, pitched, column-major, transposed
//! layouts) between every kind of memory (device, pinned, mapped, managed, a registered `Vec`,
//! pageable, which is staged through the pinned ring when large) to a random mix of engines
//! (`CudaEngine` blocking, spinning, spin-then-block with a small staging ring, without
//! staging; a `MultiplexEngine` of a CPU and a CUDA engine that splits large copies; a CPU
//! engine), with random drops of requests, of private engines with owned transfers in flight
//! and of shared engines while other threads use them, barriers from several threads, and
//! dependency chains across engines. Every destination is compared byte for byte with a CPU
//! reference, poisoned bytes outside the copied elements included.
//!
//! Leaks: after a warm-up, free device memory (`cuMemGetInfo`) and the process's threads (all,
//! and ferry's `ferry-*` threads) are counted; after the run, once every engine and buffer is
//! dropped, ferry's threads must be back to the same count (all threads: at most
//! `DRIVER_THREADS` more, for the driver's own) and the free device memory within
//! `DEVICE_SLACK` of it. With the `fault-injection` feature (as the GPU bundle builds it), ferry
//! also counts the driver allocations it holds (page-locked host: pinned and mapped buffers,
//! registrations, staging rings, the gather table; device: device and managed buffers, the
//! gather table): those must be back to the same counts exactly.
//!
//! Bounded by count and by time, whichever comes first. Default: 2,000 operations or 40 s,
//! 8 threads, large cases up to 32 MiB (well under a minute on an H100/H200). Knobs:
//! `FERRY_STRESS_OPS`, `FERRY_STRESS_SECS`, `FERRY_STRESS_THREADS`, `FERRY_STRESS_MAX_MIB`,
//! `FERRY_STRESS_SEED` (replays a run; printed at the start and in every failure). Large run:
//! `FERRY_STRESS_SECS=480 FERRY_STRESS_OPS=100000000 FERRY_STRESS_THREADS=16
//! FERRY_STRESS_MAX_MIB=64 .gpu/tests/cuda_stress --nocapture`.
//!
//! Prints `skipped: no CUDA driver` without a GPU.

mod cuda_common;
mod stress_common;

use cuda_common::{
    cuda_config, device_free, kind_of, open_allocs, settled_threads, threads, Buf, Kind,
    DEVICE_SLACK, KINDS,
};
use ferry::cuda::StagingConfig;
use ferry::cuda::{CudaConfig, CudaEngine, WaitMode};
use ferry::{
    CpuEngine, Engine, EngineExt, Job, Layout, Memory, MemoryMut, MultiplexEngine, Op, OpError,
    Operator, Program, Request, Segment,
};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use stress_common::{fmt_layout, place, shape, Rng};

// ---------------------------------------------------------------------------------------------
// Configuration.

struct Cfg {
    secs: f64,
    ops: usize,
    seed: u64,
    threads: usize,
    max_bytes: usize,
}

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn cfg() -> Cfg {
    let seed = env("FERRY_STRESS_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ u64::from(std::process::id())
    });
    Cfg {
        secs: env("FERRY_STRESS_SECS").unwrap_or(40.0),
        ops: env("FERRY_STRESS_OPS").unwrap_or(2000),
        seed,
        threads: env("FERRY_STRESS_THREADS").unwrap_or(8),
        max_bytes: env::<usize>("FERRY_STRESS_MAX_MIB").unwrap_or(32).max(2) << 20,
    }
}

/// The largest strided case, bytes: 4 MiB, or 256 KiB under the asynchronous null driver
/// (`NULL_CUDA_ASYNC`, CI), which delays every copy of a batch by its set time: a transpose of
/// 4 MiB of 1-byte elements is millions of copies there, minutes of the run's budget for one
/// case (a seed ran 113 s of a 20 s budget).
fn strided_max() -> usize {
    if std::env::var_os("NULL_CUDA_ASYNC").is_some_and(|v| v != "0") {
        256 << 10
    } else {
        4 << 20
    }
}

/// Threads the CUDA driver may start (and keep) during the run, beyond those of the warm-up.
const DRIVER_THREADS: usize = 4;

// ---------------------------------------------------------------------------------------------
// Engines.

type Factory = (&'static str, fn() -> Box<dyn Engine>);

fn cuda(c: CudaConfig) -> CudaEngine {
    CudaEngine::with_config(c).expect("cuda engine")
}

fn factories() -> Vec<Factory> {
    vec![
        ("cuda", || Box::new(cuda(cuda_config(0)))),
        ("cuda spin", || {
            Box::new(cuda(cuda_config(0).wait_mode(WaitMode::Spin)))
        }),
        ("cuda spin-then-block, small ring", || {
            Box::new(cuda(
                cuda_config(0)
                    .wait_mode(WaitMode::SpinThenBlock(Duration::from_micros(20)))
                    .staging(Some(
                        StagingConfig::new()
                            .chunk_bytes(1 << 20)
                            .ring_depth(2)
                            .threads(2),
                    )),
            ))
        }),
        ("cuda unstaged", || {
            Box::new(cuda(cuda_config(0).staging(None)))
        }),
        ("multiplex cpu+cuda", || {
            Box::new(
                MultiplexEngine::new()
                    .with(CpuEngine::new(2).expect("cpu engine"), 1.0)
                    .with(cuda(cuda_config(0)), 2.0)
                    .split_bytes(4 << 20),
            )
        }),
        ("cpu(2)", || {
            Box::new(CpuEngine::new(2).expect("cpu engine"))
        }),
    ]
}

// ---------------------------------------------------------------------------------------------
// Cases.

/// A custom operator copying a segment list one `Program::copy` per segment.
struct SegmentsOp(Vec<Segment>);
impl Operator for SegmentsOp {
    fn name(&self) -> &str {
        "segments"
    }
    fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
        for g in &self.0 {
            let l = Layout::bytes(g.len as usize)?;
            prog.copy(
                &l.with_offset(g.dst_off as usize)?,
                &l.with_offset(g.src_off as usize)?,
            )?;
        }
        Ok(())
    }
}

#[allow(clippy::large_enum_variant)] // a few per batch
enum What {
    Copy {
        dl: Layout,
        sl: Layout,
    },
    Fill {
        dl: Layout,
        pattern: Vec<u8>,
    },
    /// Built-in (`Op::Segments`) or as a custom operator.
    Segments {
        segs: Vec<Segment>,
        custom: bool,
    },
}

/// One operation: kinds, host images of its buffers, and the expected destination.
struct Case {
    dk: Kind,
    sk: Kind,
    what: What,
    src: Vec<u8>,
    dst: Vec<u8>,
    want: Vec<u8>,
}

/// Classes from this one on are fills.
const FILLS: usize = 17;

fn pick_kinds(r: &mut Rng, e: &dyn Engine, fill: bool) -> Option<(Kind, Kind)> {
    for _ in 0..32 {
        let dk = KINDS[r.below(KINDS.len())];
        let sk = KINDS[r.below(KINDS.len())];
        let src = (!fill).then(|| kind_of(sk));
        if e.supports(kind_of(dk), src) {
            return Some((dk, sk));
        }
    }
    None
}

impl Case {
    /// A random case this engine supports (`None`: it supports none of the tried kinds).
    fn random(r: &mut Rng, e: &dyn Engine, max_bytes: usize) -> Option<Case> {
        let class = r.below(20);
        let (dk, sk) = pick_kinds(r, e, class >= FILLS)?;
        Some(Case::new(r, class, dk, sk, max_bytes))
    }

    /// A case of class `class` (0-2: large contiguous copy; 3: long segment list; 4: short
    /// one; 5: either; 6-16: strided copy; 17-19: strided fill) between these kinds.
    fn new(r: &mut Rng, class: usize, dk: Kind, sk: Kind, max_bytes: usize) -> Case {
        let fill = class >= FILLS;
        let poison = r.next() as u8;
        match class {
            // Large contiguous, maybe at an offset: staged when one side is pageable.
            0..=2 => {
                let n = r.range(1 << 20, max_bytes);
                let (doff, soff) = (r.below(64), r.below(64));
                let dl = Layout::bytes(n).unwrap().with_offset(doff).unwrap();
                let sl = Layout::bytes(n).unwrap().with_offset(soff).unwrap();
                let mut src = vec![0u8; soff + n + r.below(64)];
                r.fill(&mut src);
                let dst = vec![poison; doff + n + r.below(64)];
                let mut want = dst.clone();
                want[doff..doff + n].copy_from_slice(&src[soff..soff + n]);
                Case {
                    dk,
                    sk,
                    what: What::Copy { dl, sl },
                    src,
                    dst,
                    want,
                }
            }
            // Segment lists: up to a few thousand pieces, scattered destination slots.
            3..=5 => {
                let count = if class == 4 || (class == 5 && r.chance(1, 2)) {
                    r.range(1, 63)
                } else {
                    r.range(64, 3000)
                };
                let slot = [64usize, 512, 4096][r.below(3)];
                let mut order: Vec<usize> = (0..count).collect();
                for i in (1..count).rev() {
                    order.swap(i, r.below(i + 1));
                }
                let len = count * slot + r.below(64);
                let mut src = vec![0u8; len];
                r.fill(&mut src);
                let dst = vec![poison; len];
                let mut want = dst.clone();
                let segs: Vec<Segment> = order
                    .iter()
                    .map(|&o| {
                        let n = r.range(1, slot);
                        let d = o * slot + r.below(slot - n + 1);
                        let s = r.below(len - n + 1);
                        want[d..d + n].copy_from_slice(&src[s..s + n]);
                        Segment::new(d as u64, s as u64, n as u64)
                    })
                    .collect();
                Case {
                    dk,
                    sk,
                    what: What::Segments {
                        segs,
                        custom: r.chance(1, 3),
                    },
                    src,
                    dst,
                    want,
                }
            }
            // Random strided layouts (up to 4 MiB), a copy or a fill.
            _ => {
                let (dims, elem) = shape(r, strided_max());
                let dl = place(r, &dims, elem);
                let sl = place(r, &dims, elem);
                let mut src = vec![0u8; sl.span().end + r.below(16)];
                r.fill(&mut src);
                let dst = vec![poison; dl.span().end + r.below(16)];
                let mut want = dst.clone();
                let what = if fill {
                    let mut p = vec![0u8; elem];
                    r.fill(&mut p);
                    dl.element_offsets()
                        .for_each(|d| want[d..d + elem].copy_from_slice(&p));
                    What::Fill { dl, pattern: p }
                } else {
                    for (d, s) in dl.element_offsets().zip(sl.element_offsets()) {
                        want[d..d + elem].copy_from_slice(&src[s..s + elem]);
                    }
                    What::Copy { dl, sl }
                };
                Case {
                    dk,
                    sk,
                    what,
                    src,
                    dst,
                    want,
                }
            }
        }
    }

    fn describe(&self) -> String {
        let what = match &self.what {
            What::Copy { dl, sl } => format!("copy {} <- {}", fmt_layout(dl), fmt_layout(sl)),
            What::Fill { dl, pattern } => {
                format!("fill {} with {} bytes", fmt_layout(dl), pattern.len())
            }
            What::Segments { segs, custom } => {
                format!("{} segments (custom operator: {custom})", segs.len())
            }
        };
        format!("{:?} <- {:?}: {what}", self.dk, self.sk)
    }

    fn check(&self, got: &[u8], ctx: &str) {
        if got != self.want {
            let at = got
                .iter()
                .zip(&self.want)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!(
                "{ctx}: destination differs from the reference at byte {at} of {} ({})",
                got.len(),
                self.describe()
            );
        }
    }

    fn op(&self) -> Option<Op> {
        match &self.what {
            What::Copy { .. } | What::Fill { .. } => None,
            What::Segments { segs, custom } => Some(if *custom {
                Op::Custom(Arc::new(SegmentsOp(segs.clone())))
            } else {
                Op::Segments(segs.clone().into())
            }),
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
        std::thread::park_timeout(Duration::from_secs(60));
        assert!(
            t.elapsed() < Duration::from_secs(60),
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
    bytes: AtomicUsize,
}

impl Shared {
    fn engine(&self, i: usize) -> Arc<dyn Engine> {
        Arc::clone(&self.slots[i].lock().unwrap_or_else(PoisonError::into_inner))
    }
    /// Replaces an engine: the old one is dropped by whichever thread lets go of it last,
    /// possibly with work in flight.
    fn replace(&self, i: usize) {
        let fresh: Arc<dyn Engine> = Arc::from((self.factories[i].1)());
        let old = std::mem::replace(
            &mut *self.slots[i].lock().unwrap_or_else(PoisonError::into_inner),
            fresh,
        );
        drop(old);
    }
}

const OPS: [&str; 6] = [
    "scoped batch",
    "owned transfers",
    "private engine dropped",
    "dependency chain",
    "barrier",
    "engine replaced",
];

/// A batch of random cases in one scope; each request is waited, polled, awaited or dropped.
fn op_scoped(r: &mut Rng, engine: &Arc<dyn Engine>, max: usize, ctx: &str) -> usize {
    let cases: Vec<Case> = (0..r.range(1, 5))
        .filter_map(|_| Case::random(r, &**engine, max))
        .collect();
    run_cases(r, engine, &cases, ctx)
}

/// Runs `cases` in one scope and checks every destination; returns the bytes checked.
fn run_cases(r: &mut Rng, engine: &Arc<dyn Engine>, cases: &[Case], ctx: &str) -> usize {
    let mut bufs: Vec<(Buf, Buf)> = cases
        .iter()
        .map(|c| (Buf::new(c.dk, &c.dst), Buf::new(c.sk, &c.src)))
        .collect();
    let how: Vec<usize> = cases.iter().map(|_| r.below(4)).collect();
    engine
        .scope(|s| {
            let reqs: Vec<Request> = cases
                .iter()
                .zip(bufs.iter_mut())
                .map(|(c, (d, src))| {
                    let req = match (&c.what, c.op()) {
                        (What::Copy { dl, sl }, _) => s.copy(d, dl, &*src, sl),
                        (What::Fill { dl, pattern }, _) => s.fill(d, dl, pattern),
                        (What::Segments { .. }, Some(op)) => s.submit(d, Some(&*src), op, &[]),
                        (What::Segments { .. }, None) => unreachable!("segments have an op"),
                    };
                    req.unwrap_or_else(|e| panic!("{ctx}: submit refused: {e} ({})", c.describe()))
                })
                .collect();
            for (k, (mut req, h)) in reqs.into_iter().zip(&how).enumerate() {
                let res = match h {
                    0 => req.wait(),
                    1 => loop {
                        if let Some(res) = req.try_wait() {
                            break res;
                        }
                        std::thread::yield_now();
                    },
                    2 => block_on(req, ctx),
                    _ => {
                        drop(req);
                        Ok(())
                    }
                };
                assert_eq!(res, Ok(()), "{ctx}: request {k} ({})", cases[k].describe());
            }
            Ok::<_, ferry::BarrierError>(())
        })
        .unwrap_or_else(|e| panic!("{ctx}: scope barrier: {e}"));
    let mut bytes = 0;
    for (k, (c, (d, _))) in cases.iter().zip(&bufs).enumerate() {
        c.check(&d.to_vec(), &format!("{ctx} case {k}"));
        bytes += c.want.len();
    }
    bytes
}

/// Owned transfers (copies), waited or awaited, sometimes after dropping the engine.
fn op_owned(
    r: &mut Rng,
    engine: Arc<dyn Engine>,
    max: usize,
    ctx: &str,
    drop_engine: bool,
) -> usize {
    let mut pending = Vec::new();
    for _ in 0..r.range(1, 4) {
        let Some(c) = Case::random(r, &*engine, max) else {
            continue;
        };
        let What::Copy { dl, sl } = &c.what else {
            continue;
        };
        let t = engine
            .copy_owned(Buf::new(c.dk, &c.dst), dl, Buf::new(c.sk, &c.src), sl)
            .unwrap_or_else(|refused| {
                panic!(
                    "{ctx}: submit refused: {} ({})",
                    refused.error,
                    c.describe()
                )
            });
        pending.push((t, c));
    }
    if drop_engine {
        drop(engine);
    }
    let mut bytes = 0;
    for (k, (t, c)) in pending.into_iter().enumerate() {
        let out = if r.chance(1, 2) {
            t.wait()
        } else {
            block_on(t, ctx)
        };
        let (dst, _src) = out.unwrap_or_else(|f| {
            panic!("{ctx}: transfer {k} failed: {} ({})", f.error, c.describe())
        });
        c.check(&dst.to_vec(), &format!("{ctx} transfer {k}"));
        bytes += c.want.len();
    }
    bytes
}

/// src -> b1 -> b2 -> b3, each hop on a random engine that supports its kinds, ordered only by
/// dependencies (event waits between CUDA engines, host waits otherwise).
fn op_chain(r: &mut Rng, shared: &Shared, max: usize, ctx: &str) -> usize {
    let len = if r.chance(1, 4) {
        r.range(1 << 20, max.min(16 << 20))
    } else {
        r.range(1, 64 << 10)
    };
    let mut data = vec![0u8; len];
    r.fill(&mut data);
    let kinds: Vec<Kind> = (0..4).map(|_| KINDS[r.below(KINDS.len())]).collect();
    let src = Buf::new(kinds[0], &data);
    let mut bufs: Vec<Buf> = (1..4)
        .map(|i| Buf::new(kinds[i], &vec![i as u8; len]))
        .collect();
    let raws: Vec<ferry::RawBuf> = bufs.iter_mut().map(|b| b.raw_mut()).collect();
    let l = Layout::bytes(len).unwrap();
    let mut engines = Vec::new();
    let mut names = Vec::new();
    for hop in 0..3 {
        let (dk, sk) = (
            raws[hop].kind,
            if hop == 0 {
                src.raw().kind
            } else {
                raws[hop - 1].kind
            },
        );
        let ns = shared.slots.len();
        let start = r.below(ns);
        let i = (0..ns)
            .map(|k| (start + k) % ns)
            .find(|&i| shared.engine(i).supports(dk, Some(sk)))
            .expect("the CPU engine supports every host pair, CUDA every other");
        engines.push(shared.engine(i));
        names.push(shared.factories[i].0);
    }
    let ctx = format!("{ctx} [{kinds:?} on {names:?}]");
    let mut reqs: Vec<Request> = Vec::with_capacity(3);
    for hop in 0..3 {
        let s = if hop == 0 { src.raw() } else { raws[hop - 1] };
        let mut job = Job::copy(raws[hop], l, s, l);
        if let Some(prev) = reqs.last() {
            job = job.after(prev);
        }
        // SAFETY: `src` and `bufs` outlive the three requests, which are all waited below
        // before anything else touches the buffers; each hop reads only what the previous hop
        // (its dependency) wrote.
        let req = unsafe { engines[hop].submit_raw(job) }
            .unwrap_or_else(|e| panic!("{ctx}: hop {hop} refused: {e}"));
        reqs.push(req);
    }
    for (k, req) in reqs.into_iter().enumerate().rev() {
        assert_eq!(req.wait(), Ok(()), "{ctx}: hop {k}");
    }
    for (k, b) in bufs.iter().enumerate() {
        let got = b.to_vec();
        if got != data {
            let at = got.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
            panic!(
                "{ctx}: buffer {k} differs at byte {at} of {len}: not ordered after its dependency"
            );
        }
    }
    3 * len
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
            50..=64 => 1,
            65..=71 => 2,
            72..=86 => 3,
            87..=96 => 4,
            _ => 5,
        };
        let ctx = format!(
            "seed {} thread {t} op {k} ({}) on {}",
            cfg.seed, OPS[kind], shared.factories[i].0
        );
        let bytes = match kind {
            0 => op_scoped(&mut r, &shared.engine(i), cfg.max_bytes, &ctx),
            1 => op_owned(&mut r, shared.engine(i), cfg.max_bytes, &ctx, false),
            2 => {
                let e: Arc<dyn Engine> = Arc::from((shared.factories[i].1)());
                op_owned(&mut r, e, cfg.max_bytes, &ctx, true)
            }
            3 => op_chain(&mut r, shared, cfg.max_bytes, &ctx),
            4 => {
                let res = shared.engine(i).barrier();
                assert!(res.is_ok(), "{ctx}: barrier reported failures: {res:?}");
                0
            }
            _ => {
                shared.replace(i);
                0
            }
        };
        shared.bytes.fetch_add(bytes, Ordering::Relaxed);
        shared.counts[kind].fetch_add(1, Ordering::Relaxed);
        k += 1;
    }
}

/// Every path once, so that lazily made resources (primary context, staging rings and threads,
/// the gather kernel, event pools) exist before the leak baseline is taken.
fn warm_up(cfg: &Cfg) {
    let mut r = Rng(cfg.seed ^ 0x5EED);
    for f in factories() {
        let e: Arc<dyn Engine> = Arc::from((f.1)());
        if !e.supports(kind_of(Kind::Device), Some(kind_of(Kind::Pageable))) {
            continue;
        }
        let (dev, host) = (Kind::Device, Kind::Pageable);
        let cases = [
            Case::new(&mut r, 0, dev, host, 8 << 20),
            Case::new(&mut r, 0, host, dev, 8 << 20),
            Case::new(&mut r, 3, dev, dev, cfg.max_bytes),
            Case::new(&mut r, 3, dev, Kind::Pinned, cfg.max_bytes),
            Case::new(&mut r, 6, dev, dev, cfg.max_bytes),
            Case::new(&mut r, FILLS, dev, dev, cfg.max_bytes),
        ];
        run_cases(&mut r, &e, &cases, &format!("warm-up on {}", f.0));
        assert!(e.barrier().is_ok());
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn cuda_stress_random_mix() {
    if ferry::cuda::probe().driver.is_err() {
        println!("skipped: no CUDA driver");
        return;
    }
    let cfg = cfg();
    println!(
        "cuda stress: seed {} (replay: FERRY_STRESS_SEED={}), {} threads, up to {} ops / {} s, \
         large cases up to {} MiB",
        cfg.seed,
        cfg.seed,
        cfg.threads,
        cfg.ops,
        cfg.secs,
        cfg.max_bytes >> 20
    );
    warm_up(&cfg);
    let threads0 = settled_threads(0, 5);
    let free0 = device_free();
    let allocs0 = open_allocs();
    let factories = factories();
    let shared = Shared {
        slots: factories
            .iter()
            .map(|f| Mutex::new(Arc::from((f.1)())))
            .collect(),
        factories,
        done: AtomicUsize::new(0),
        counts: Default::default(),
        bytes: AtomicUsize::new(0),
    };
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(cfg.secs);
    std::thread::scope(|s| {
        for t in 0..cfg.threads {
            let (shared, cfg) = (&shared, &cfg);
            s.spawn(move || worker(shared, cfg, t, deadline));
        }
    });
    let busy = threads();
    for (i, slot) in shared.slots.iter().enumerate() {
        let e = slot.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(
            e.barrier().is_ok(),
            "seed {}: final barrier on {}",
            cfg.seed,
            shared.factories[i].0
        );
    }
    let elapsed = start.elapsed().as_secs_f64();
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
    let gib = shared.bytes.load(Ordering::Relaxed) as f64 / f64::from(1u32 << 30);
    let Shared { slots, .. } = shared;
    drop(slots);
    let threads1 = settled_threads(threads0.1, 10);
    let free1 = device_free();
    let allocs1 = open_allocs();
    println!(
        "cuda stress: seed {}, {total} ops in {elapsed:.1} s [{}], {gib:.2} GiB verified; threads \
         (all, ferry-*) {threads0:?} before, {busy:?} at the end of the run, {threads1:?} after \
         dropping the engines; free device memory {} MiB before, {} MiB after; open driver \
         allocations (pinned host, device) {allocs0:?} before, {allocs1:?} after",
        cfg.seed,
        counts.join(", "),
        free0 >> 20,
        free1 >> 20
    );
    assert!(
        total >= cfg.threads.min(cfg.ops),
        "every thread ran at least one operation"
    );
    assert_eq!(
        allocs1, allocs0,
        "seed {}: driver allocations left open",
        cfg.seed
    );
    assert_eq!(
        threads1.1, threads0.1,
        "seed {}: ferry threads leaked",
        cfg.seed
    );
    // Threads that are not ferry's belong to the driver and NVRTC, which may start a few on
    // first use of a feature and keep them.
    assert!(
        threads1.0 <= threads0.0 + DRIVER_THREADS,
        "seed {}: {} threads after, {} before",
        cfg.seed,
        threads1.0,
        threads0.0
    );
    assert!(
        free1 + DEVICE_SLACK >= free0,
        "seed {}: device memory leaked: {} MiB free before, {} MiB after",
        cfg.seed,
        free0 >> 20,
        free1 >> 20
    );
}
