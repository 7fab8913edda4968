//! Several engines behind one: whole requests spread by weight, one large copy split across
//! engines by weight. A copy that touches an engine's [home](Engine::home) memory (a GPU's
//! device memory) goes to the engines at home there: one CUDA engine per GPU behind one
//! multiplex engine stripes copies to several GPUs over each GPU's own link
//! ([`crate::cuda::multi`]).
//!
//! AML's multiplex DMA sends each whole request to one DMA, unlocked, and leaks on error.
//! Here routing is under a lock, a large copy (at least [`MultiplexEngine::split_bytes`]) is
//! split into parts sized by weight and run on every engine that can reach both buffers, and
//! a part refused at submit leaves the parts already submitted to finish (the request they
//! belong to reports the error).
//!
//! ```
//! use ferry::{CpuEngine, EngineExt, MultiplexEngine};
//! let mux = MultiplexEngine::new()
//!     .with(CpuEngine::new(1)?, 1.0)
//!     .with(CpuEngine::new(1)?, 3.0)
//!     .split_bytes(1 << 20);
//! let src = vec![9u8; 32 << 20];
//! let mut dst = vec![0u8; 32 << 20];
//! mux.scope(|s| -> ferry::Result<()> { Ok(s.memcpy(&mut dst, &src)?.wait()?) })?;
//! assert_eq!(dst, src);
//! # Ok::<(), ferry::Error>(())
//! ```

use super::{Engine, Job, SubmitError};
use crate::layout::Layout;
use crate::memory::MemKind;
use crate::op::{Op, Step};
use crate::plan::Plan;
use crate::request::{BarrierError, InFlight, Join, Request, WaitOnDrop};
use std::sync::{Mutex, PoisonError};

/// Several engines behind one. See the [module documentation](self).
pub struct MultiplexEngine {
    engines: Vec<(Box<dyn Engine>, f64)>,
    /// Bytes routed to each engine so far (for weighted routing).
    routed: Mutex<Vec<f64>>,
    split_bytes: usize,
    inflight: InFlight,
}

impl Default for MultiplexEngine {
    fn default() -> Self {
        MultiplexEngine::new()
    }
}

impl MultiplexEngine {
    /// No engines yet; add them with [`with`](Self::with). Copies of 64 MiB or more are split.
    pub fn new() -> MultiplexEngine {
        MultiplexEngine {
            engines: Vec::new(),
            routed: Mutex::new(Vec::new()),
            split_bytes: 64 << 20,
            inflight: InFlight::new(),
        }
    }
    /// Adds an engine with a weight (its share of the bytes; non-positive or non-finite weights
    /// count as 1).
    pub fn with(mut self, engine: impl Engine + 'static, weight: f64) -> MultiplexEngine {
        let w = if weight.is_finite() && weight > 0.0 {
            weight
        } else {
            1.0
        };
        self.engines.push((Box::new(engine), w));
        self.routed
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .push(0.0);
        self
    }
    /// Copies of at least `bytes` bytes are split across engines (`usize::MAX`: never).
    pub fn split_bytes(mut self, bytes: usize) -> MultiplexEngine {
        self.split_bytes = bytes.max(1);
        self
    }
    /// The engines and their weights.
    pub fn engines(&self) -> impl Iterator<Item = (&dyn Engine, f64)> {
        self.engines.iter().map(|(e, w)| (&**e, *w))
    }

    /// The supporting engine with the least bytes routed per unit of weight; charges it.
    fn route(&self, candidates: &[usize], bytes: usize) -> usize {
        let mut routed = self.routed.lock().unwrap_or_else(PoisonError::into_inner);
        let pick = candidates
            .iter()
            .copied()
            .min_by(|&a, &b| {
                let ka = (routed[a] + bytes as f64) / self.engines[a].1;
                let kb = (routed[b] + bytes as f64) / self.engines[b].1;
                ka.total_cmp(&kb)
            })
            .unwrap_or(0);
        routed[pick] += bytes as f64;
        pick
    }

    /// Splits a built-in job into one job per candidate engine, sized by weight.
    fn split(
        &self,
        job: &Job,
        candidates: &[usize],
    ) -> Result<Option<Vec<(usize, Job)>>, SubmitError> {
        let prog = job.op.lower(job.dst.len, job.src.map(|s| s.len))?;
        let [step] = prog.steps() else {
            return Ok(None);
        };
        let (plan, pattern) = match step {
            Step::Copy(p) => (p, None),
            Step::Fill { plan, pattern } => (plan, Some(pattern.clone())),
            Step::Segments { .. } => return Ok(None),
        };
        if plan.total_bytes() < self.split_bytes {
            return Ok(None);
        }
        // Equal pieces, then contiguous groups of pieces per engine by weight.
        let align = pattern.as_ref().map_or(64, |p| p.len());
        // Pieces of up to 1 MiB at least, smaller when the split threshold is lower.
        let min_piece = (self.split_bytes / candidates.len()).clamp(1, 1 << 20);
        let pieces = plan.split(candidates.len() * 16, min_piece, align);
        if pieces.len() < 2 {
            return Ok(None);
        }
        let total_w: f64 = candidates.iter().map(|&i| self.engines[i].1).sum();
        let mut out = Vec::with_capacity(pieces.len());
        let mut acc = 0.0;
        let mut start = 0usize;
        for (k, &i) in candidates.iter().enumerate() {
            acc += self.engines[i].1 / total_w;
            let end = if k + 1 == candidates.len() {
                pieces.len()
            } else {
                ((acc * pieces.len() as f64).round() as usize).min(pieces.len())
            };
            for piece in &pieces[start..end.max(start)] {
                let op = match &pattern {
                    None => {
                        let (dl, sl) = piece_layouts(piece)?;
                        Op::Copy { dst: dl, src: sl }
                    }
                    Some(p) => Op::Fill {
                        dst: fill_piece_layout(piece, p.len())?,
                        pattern: p.clone(),
                    },
                };
                out.push((
                    i,
                    Job {
                        dst: job.dst,
                        src: job.src,
                        op,
                        after: job.after.iter().map(Request::share).collect(),
                    },
                ));
            }
            start = end.max(start);
        }
        Ok(Some(out))
    }

    /// The one routing of a job (for [`Engine::submit_raw`] and [`Engine::enqueue`]): checked,
    /// its candidates the engines that support its memory (those at home there first), split
    /// by weight across them when large enough, else whole to the least loaded; each part
    /// handed on as `hand` says.
    ///
    /// # Safety
    /// As [`Engine::submit_raw`].
    unsafe fn pass(&self, job: Job, hand: Hand) -> Result<Request, SubmitError> {
        job.check()?;
        let (dk, sk) = (job.dst.kind, job.src.map(|s| s.kind));
        let mut candidates: Vec<usize> = (0..self.engines.len())
            .filter(|&i| self.engines[i].0.supports(dk, sk))
            .collect();
        // Locality: engines next to the memory the copy touches (a GPU's own engine for its
        // device memory) take it; the others only reach it from afar.
        let local: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&i| {
                self.engines[i]
                    .0
                    .home()
                    .is_some_and(|h| h == dk || Some(h) == sk)
            })
            .collect();
        if !local.is_empty() {
            candidates = local;
        }
        if candidates.is_empty() {
            return Err(SubmitError::Unsupported {
                engine: self.name(),
                dst: dk,
                src: sk,
            });
        }
        let parts = if candidates.len() > 1 && job.op.is_builtin() {
            self.split(&job, &candidates)?
        } else {
            None
        };
        let req = match parts {
            Some(parts) => {
                // Parts already submitted read and write the caller's buffers: if a later part
                // is refused, or its engine's submit panics (any type may be an engine), they
                // are waited for before this returns or unwinds, so that the caller may reuse
                // or free the buffers then (a panic once left them copying into freed memory).
                let mut reqs = WaitOnDrop::default();
                for (i, part) in parts {
                    // SAFETY: each part covers a subset of the caller's buffers, which the
                    // caller keeps valid until the joined request (hence every part) completes,
                    // or until this call returns or unwinds (`reqs` waits for the parts then).
                    reqs.push(unsafe { hand.to(&*self.engines[i].0, part) }?);
                }
                Request::new(Join::new(reqs.into_vec()))
            }
            None => {
                // Only built-ins are lowered here: a custom operator runs once, on the engine
                // that takes it, where its errors and panics fail only its request.
                let bytes = if job.op.is_builtin() {
                    job.op
                        .lower(job.dst.len, job.src.map(|s| s.len))
                        .map_or(0, |p| p.total_bytes())
                } else {
                    0
                };
                let i = self.route(&candidates, bytes);
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { hand.to(&*self.engines[i].0, job)? }
            }
        };
        self.inflight.track(&req);
        Ok(req)
    }
}

/// How [`MultiplexEngine::pass`] hands a routed job (or part) to its engine.
#[derive(Clone, Copy)]
enum Hand {
    /// [`Engine::submit_raw`].
    Submit,
    /// [`Engine::enqueue`]: more work follows, until [`Engine::flush`].
    Enqueue,
}

impl Hand {
    /// Hands `job` to `engine`.
    ///
    /// # Safety
    /// As [`Engine::submit_raw`].
    unsafe fn to(self, engine: &dyn Engine, job: Job) -> Result<Request, SubmitError> {
        match self {
            // SAFETY: forwarded with the caller's guarantees.
            Hand::Submit => unsafe { engine.submit_raw(job) },
            // SAFETY: as above.
            Hand::Enqueue => unsafe { engine.enqueue(job) },
        }
    }
}

/// The destination and source layouts (in bytes) of one piece of a plan.
fn piece_layouts(p: &Plan) -> Result<(Layout, Layout), SubmitError> {
    let mk = |off: usize, strides: &[usize]| -> Result<Layout, SubmitError> {
        let l = if strides.is_empty() {
            Layout::with_byte_strides(&[1], &[0], p.run())
        } else {
            Layout::with_byte_strides(p.counts(), strides, p.run())
        };
        l.and_then(|l| l.with_offset(off))
            .map_err(|e| SubmitError::Op(e.into()))
    };
    Ok((
        mk(p.dst_offset(), p.dst_strides())?,
        mk(p.src_offset(), p.src_strides())?,
    ))
}

/// The destination layout of one piece of a fill plan, in elements of `elem` bytes (the
/// pattern's size), so that the piece's fill takes the same pattern.
fn fill_piece_layout(p: &Plan, elem: usize) -> Result<Layout, SubmitError> {
    let mut dims = p.counts().to_vec();
    let mut strides = p.dst_strides().to_vec();
    if p.run() > elem || dims.is_empty() {
        dims.push(p.run() / elem);
        strides.push(elem);
    }
    Layout::with_byte_strides(&dims, &strides, elem)
        .and_then(|l| l.with_offset(p.dst_offset()))
        .map_err(|e| SubmitError::Op(e.into()))
}

impl Engine for MultiplexEngine {
    /// Every engine's: a job enqueued here went to one or more of them.
    fn flush(&self) {
        for (e, _) in &self.engines {
            e.flush();
        }
    }

    fn name(&self) -> String {
        let names: Vec<String> = self
            .engines
            .iter()
            .map(|(e, w)| format!("{}x{w}", e.name()))
            .collect();
        format!("multiplex[{}]", names.join(", "))
    }

    fn supports(&self, dst: MemKind, src: Option<MemKind>) -> bool {
        self.engines.iter().any(|(e, _)| e.supports(dst, src))
    }

    unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.pass(job, Hand::Submit) }
    }

    /// Routed as [`submit_raw`](Engine::submit_raw), then enqueued on the chosen engine (each
    /// part of a split job on its own): held there until [`flush`](Engine::flush), which
    /// reaches every engine.
    unsafe fn enqueue(&self, job: Job) -> Result<Request, SubmitError> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.pass(job, Hand::Enqueue) }
    }

    fn barrier(&self) -> Result<(), BarrierError> {
        let mut failures = match self.inflight.barrier() {
            Ok(()) => Vec::new(),
            Err(e) => e.failures,
        };
        for (e, _) in &self.engines {
            if let Err(b) = e.barrier() {
                failures.extend(b.failures);
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(BarrierError { failures })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::CpuEngine;
    use crate::engine::EngineExt;
    use crate::memory::RawBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A CPU engine that claims a home memory kind and counts what it was given.
    struct Homed(CpuEngine, Option<MemKind>, Arc<AtomicUsize>);

    impl Engine for Homed {
        fn name(&self) -> String {
            format!("homed({:?})", self.1)
        }
        fn supports(&self, dst: MemKind, src: Option<MemKind>) -> bool {
            self.0.supports(dst, src)
        }
        unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
            self.2.fetch_add(1, Ordering::Relaxed);
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { self.0.submit_raw(job) }
        }
        fn barrier(&self) -> Result<(), BarrierError> {
            self.0.barrier()
        }
        fn home(&self) -> Option<MemKind> {
            self.1
        }
    }

    /// A CPU engine that counts how jobs reached it (`submit_raw`, `enqueue`) and its flushes.
    #[derive(Default)]
    struct Counted {
        cpu: Option<CpuEngine>,
        submitted: AtomicUsize,
        enqueued: AtomicUsize,
        flushes: AtomicUsize,
    }

    impl Counted {
        fn new() -> Arc<Counted> {
            Arc::new(Counted {
                cpu: Some(CpuEngine::new(1).unwrap()),
                ..Counted::default()
            })
        }
        fn cpu(&self) -> &CpuEngine {
            self.cpu.as_ref().unwrap()
        }
        fn counts(&self) -> [usize; 3] {
            [&self.submitted, &self.enqueued, &self.flushes].map(|c| c.load(Ordering::Relaxed))
        }
    }

    impl Engine for Counted {
        fn name(&self) -> String {
            "counted".into()
        }
        fn supports(&self, dst: MemKind, src: Option<MemKind>) -> bool {
            self.cpu().supports(dst, src)
        }
        unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
            self.submitted.fetch_add(1, Ordering::Relaxed);
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { self.cpu().submit_raw(job) }
        }
        unsafe fn enqueue(&self, job: Job) -> Result<Request, SubmitError> {
            self.enqueued.fetch_add(1, Ordering::Relaxed);
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { self.cpu().enqueue(job) }
        }
        fn flush(&self) {
            self.flushes.fetch_add(1, Ordering::Relaxed);
            self.cpu().flush();
        }
        fn barrier(&self) -> Result<(), BarrierError> {
            self.cpu().barrier()
        }
    }

    /// `enqueue` through the multiplex routes as `submit_raw` does (small jobs whole, large ones
    /// split by weight) and hands every job or part to its engine's `enqueue`, none to
    /// `submit_raw`; nothing is flushed until `flush`, which reaches every engine once; a wait
    /// before the flush returns; every byte arrives.
    #[test]
    fn enqueued_jobs_reach_their_engines_enqueue_and_one_flush_issues_them() {
        let engines = [Counted::new(), Counted::new()];
        let mux = MultiplexEngine::new()
            .with(Arc::clone(&engines[0]), 1.0)
            .with(Arc::clone(&engines[1]), 2.0)
            .split_bytes(32 << 10);
        // Four small copies (whole), four large ones (split across both).
        let lens = [
            4 << 10,
            256 << 10,
            1 << 10,
            128 << 10,
            8 << 10,
            512 << 10,
            3,
            64 << 10,
        ];
        let srcs: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| (j * 7 + i * 13) as u8).collect())
            .collect();
        let mut dsts: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0u8; n]).collect();
        let reqs: Vec<Request> = dsts
            .iter_mut()
            .zip(&srcs)
            .map(|(d, s)| {
                let l = Layout::bytes(s.len()).unwrap();
                let job = Job::copy(
                    RawBuf::host(d.as_mut_ptr(), d.len(), MemKind::Pageable),
                    l,
                    RawBuf::host(s.as_ptr(), s.len(), MemKind::Pageable),
                    l,
                );
                // SAFETY: both vectors outlive the waits below and nothing else touches them.
                unsafe { mux.enqueue(job) }.unwrap()
            })
            .collect();
        // A request of the batch waited before the flush: returns, done.
        reqs[1].completion().wait().unwrap();
        let [a, b] = [engines[0].counts(), engines[1].counts()];
        assert_eq!(
            (a[0], b[0]),
            (0, 0),
            "no job reached an engine's submit_raw"
        );
        assert!(
            a[1] > 0 && b[1] > 0 && a[1] + b[1] > lens.len(),
            "small jobs whole, large ones split across both engines: enqueued {a:?} {b:?}"
        );
        assert_eq!((a[2], b[2]), (0, 0), "nothing flushed before the flush");
        mux.flush();
        let [a, b] = [engines[0].counts(), engines[1].counts()];
        assert_eq!((a[2], b[2]), (1, 1), "one flush reaches every engine once");
        for (i, r) in reqs.into_iter().enumerate() {
            r.wait().unwrap();
            assert_eq!(dsts[i], srcs[i], "copy {i} of {} bytes", lens[i]);
        }
        mux.barrier().unwrap();
    }

    #[test]
    fn copies_go_to_the_engine_at_home() {
        let counts: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::default()).collect();
        // Heavier weights elsewhere: without locality most copies would go there.
        let mux = MultiplexEngine::new()
            .with(
                Homed(CpuEngine::new(1).unwrap(), None, counts[0].clone()),
                10.0,
            )
            .with(
                Homed(
                    CpuEngine::new(1).unwrap(),
                    Some(MemKind::Mapped),
                    counts[1].clone(),
                ),
                1.0,
            )
            .with(
                Homed(CpuEngine::new(1).unwrap(), None, counts[2].clone()),
                10.0,
            )
            .split_bytes(1 << 10);
        let src: Vec<u8> = (0..1 << 16).map(|i| (i % 251) as u8).collect();
        for round in 0..4 {
            let mut dst = vec![0u8; 1 << 16];
            let l = Layout::bytes(1 << 16).unwrap();
            // The destination claims to be the second engine's home kind.
            let job = Job::copy(
                RawBuf::host(dst.as_mut_ptr(), dst.len(), MemKind::Mapped),
                l,
                RawBuf::host(src.as_ptr(), src.len(), MemKind::Pageable),
                l,
            );
            // SAFETY: both vectors outlive the wait below and nothing else touches them.
            unsafe { mux.submit_raw(job) }.unwrap().wait().unwrap();
            assert_eq!(dst, src, "round {round}");
        }
        let n: Vec<usize> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert_eq!(
            n,
            [0, 4, 0],
            "every copy (whole, unsplit) on the engine at home"
        );
        // Copies between memory no engine calls home still spread and split by weight.
        let mut dst = vec![0u8; 1 << 16];
        mux.scope(|s| Ok::<_, crate::BarrierError>(s.memcpy(&mut dst, &src).map(drop)))
            .unwrap()
            .unwrap();
        assert_eq!(dst, src);
        assert!(counts[0].load(Ordering::Relaxed) > 0 && counts[2].load(Ordering::Relaxed) > 0);
    }
}
