//! The submission seam every backend shares (`engine/contract.rs`, issue 30 items 2 and 5),
//! without a GPU: a CPU engine's small copies complete inside submit (the folded inline path:
//! no separate call), for borrowed and owned buffers alike, and an engine that claims more
//! than it runs inline still hands owned buffers back only after their copy; `enqueue` N jobs
//! then one `flush` completes them all, through the raw trait and through a scope
//! (`Scope::enqueue`/`flush`, any engine); the file engine through the [`Backend`] contract
//! (plain descriptors in, `Request`s out, refusals as `SubmitError`s).

use ferry::file::{FileConfig, FileEngine, FileError, FileJob, IoOp, OpenMode};
use ferry::{
    Backend, BarrierError, CpuConfig, CpuEngine, Engine, EngineExt, Job, Layout, MemKind, Memory,
    MemoryMut, Op, Request, SubmitError,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Deterministic bytes, different per seed.
fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn a_request_is_one_word_with_distinct_ids() {
    // Moved in one register: a 24-byte request done at submit cost the scope a
    // store-forwarding stall (issue 32, `request/handle.rs`).
    assert_eq!(std::mem::size_of::<Request>(), 8);
    assert_eq!(std::mem::size_of::<Option<Request>>(), 8);
    let e = CpuEngine::new(2).unwrap();
    let (src, mut dst) = (data(64, 3), vec![0u8; 64]);
    let l = Layout::bytes(64).unwrap();
    let ids: Vec<u64> = (0..3)
        .map(|_| {
            // SAFETY: both live for the call; the request is waited before the next submit.
            let r = unsafe { e.submit_copy(dst.raw_mut(), &l, src.raw(), &l) }.unwrap();
            let id = r.id();
            assert_eq!(format!("{r:?}"), format!("Request {{ id: {id} }}"));
            r.wait().unwrap();
            id
        })
        .chain([Request::ready(Err(ferry::RequestError::Io("refused".into()))).id()])
        .collect();
    let mut sorted = ids.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "ids {ids:?}");
    assert_eq!(dst, src);
}

#[test]
fn a_small_cpu_copy_completes_inside_submit() {
    let e = CpuEngine::with_config(CpuConfig::new(2).inline_bytes(64 << 10)).unwrap();
    assert_eq!(e.inline_bytes(), 64 << 10);
    for n in [1, 4 << 10, 64 << 10] {
        let src = data(n, 1);
        let mut dst = vec![0u8; n];
        let l = Layout::bytes(n).unwrap();
        // SAFETY: both live for the call, and the request is done when it returns (asserted).
        let r = unsafe { e.submit_copy(dst.raw_mut(), &l, src.raw(), &l) }.unwrap();
        assert!(r.is_done(), "{n} B: not done at submit");
        r.wait().unwrap();
        assert_eq!(dst, src, "{n} B");
        // Scoped and owned, the same path.
        let mut dst2 = vec![0u8; n];
        e.scope(|s| -> Result<(), ferry::Error> {
            let r = s.memcpy(&mut dst2, &src)?;
            assert!(r.is_done(), "{n} B: scoped copy not done at submit");
            Ok(())
        })
        .unwrap();
        assert_eq!(dst2, src);
        let t = e.memcpy_owned(vec![0u8; n], src.clone()).unwrap();
        assert!(t.is_done(), "{n} B: owned copy not done at submit");
        let (d, _) = t.wait().unwrap();
        assert_eq!(d, src);
    }
    // Above the threshold: queued, as any copy.
    let n = 1 << 20;
    let t = e.memcpy_owned(vec![0u8; n], data(n, 2)).unwrap();
    assert_eq!(t.wait().unwrap().0, data(n, 2));
}

/// `submit_memcpy` (the CPU engine's runs a small one without layouts) does what
/// `submit_copy` of two `Layout::bytes(len)` does: the same bytes copied, the same refusals
/// (a buffer too short, shared bytes, a null address), through an `Arc` and a `Box` too.
#[test]
fn a_memcpy_without_layouts_matches_the_copy_with_them() {
    let cpu = CpuEngine::with_config(CpuConfig::new(2).inline_bytes(64 << 10)).unwrap();
    let arc = std::sync::Arc::new(CpuEngine::new(1).unwrap());
    let boxed: Box<dyn Engine> = Box::new(CpuEngine::new(1).unwrap());
    let engines: [&dyn Engine; 3] = [&cpu, &arc, &*boxed];
    // (destination length, source length, bytes): inline, queued (above 64 KiB), part of
    // longer buffers, and refused (one buffer too short).
    let shapes = [
        (4096, 4096, 4096),
        (1 << 20, 1 << 20, 1 << 20),
        (100, 90, 50),
        (10, 64, 64),
        (64, 10, 64),
    ];
    for e in engines {
        for (dn, sn, len) in shapes {
            let src = data(sn, 4);
            let (mut a, mut b) = (vec![7u8; dn], vec![7u8; dn]);
            // SAFETY: the buffers live until the requests are waited for, below.
            let fast = unsafe { e.submit_memcpy(a.raw_mut(), src.raw(), len) };
            let l = Layout::bytes(len).unwrap();
            // SAFETY: as above.
            let slow = unsafe { e.submit_copy(b.raw_mut(), &l, src.raw(), &l) };
            match (fast, slow) {
                (Ok(f), Ok(s)) => {
                    f.wait().unwrap();
                    s.wait().unwrap();
                    assert_eq!(a[..len], src[..len], "{} {dn}/{sn}/{len}", e.name());
                    assert!(a[len..].iter().all(|&x| x == 7), "past the copy");
                    assert_eq!(a, b);
                }
                (Err(f), Err(s)) => {
                    assert_eq!(f, s, "{dn}/{sn}/{len}");
                    assert!(a.iter().all(|&x| x == 7), "refused, yet written");
                }
                (f, s) => panic!("{dn}/{sn}/{len}: memcpy {f:?}, copy {s:?}"),
            }
        }
        // Shared bytes and a null address: refused alike, nothing written.
        let mut buf = data(256, 5);
        let p = buf.as_mut_ptr();
        let dst = ferry::RawBuf::host(p, 128, MemKind::Pageable);
        let src = ferry::RawBuf::host(p.wrapping_add(64), 128, MemKind::Pageable);
        let l = Layout::bytes(128).unwrap();
        // SAFETY: refused at submit (asserted): nothing runs.
        let (f, s) = unsafe {
            (
                e.submit_memcpy(dst, src, 128),
                e.submit_copy(dst, &l, src, &l),
            )
        };
        assert!(matches!(f, Err(SubmitError::Overlap(_))), "{f:?}");
        assert_eq!(f.unwrap_err(), s.unwrap_err());
        assert_eq!(buf, data(256, 5));
        let null = ferry::RawBuf::host(std::ptr::null(), 128, MemKind::Pageable);
        // SAFETY: refused at submit (asserted): nothing runs.
        let f = unsafe { e.submit_memcpy(dst, null, 128) };
        assert!(matches!(f, Err(SubmitError::Null)), "{f:?}");
    }
}

/// A CPU engine that claims every copy runs inline, though large ones go to its workers.
struct Claims(CpuEngine);

impl Engine for Claims {
    fn name(&self) -> String {
        "claims".into()
    }
    fn supports(&self, dst: MemKind, src: Option<MemKind>) -> bool {
        self.0.supports(dst, src)
    }
    unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.0.submit_raw(job) }
    }
    fn inline_bytes(&self) -> usize {
        usize::MAX
    }
    fn barrier(&self) -> Result<(), BarrierError> {
        self.0.barrier()
    }
}

#[test]
fn owned_buffers_kept_in_place_come_back_only_after_their_copy() {
    // Zero workers' inline threshold: every copy leaves the submitting thread, yet the engine
    // says they run inline; the owned copy must still hand back finished buffers.
    let e = Claims(CpuEngine::with_config(CpuConfig::new(2).inline_bytes(0)).unwrap());
    for n in [4 << 10, 8 << 20] {
        let t = e.memcpy_owned(vec![0u8; n], data(n, 3)).unwrap();
        let (d, s) = t.wait().unwrap();
        assert_eq!(d, s, "{n} B");
    }
    // Refused: both buffers come back.
    let Err(refused) = e.memcpy_owned(vec![0u8; 4], vec![1u8; 8]) else {
        panic!("a destination shorter than the source is refused");
    };
    assert_eq!((refused.dst.len(), refused.src.len()), (4, 8));
}

#[test]
fn n_enqueued_jobs_then_one_flush_all_complete() {
    for threads in [0, 2] {
        let e = CpuEngine::new(threads).unwrap();
        let n = 64;
        let len = 256 << 10;
        let srcs: Vec<Vec<u8>> = (0..n).map(|i| data(len, i as u8)).collect();
        let mut dsts: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; len]).collect();
        let l = Layout::bytes(len).unwrap();
        let reqs: Vec<Request> = dsts
            .iter_mut()
            .zip(&srcs)
            // SAFETY: the buffers outlive the requests, waited below; nothing else touches them.
            .map(|(d, s)| unsafe { e.enqueue(Job::copy(d.raw_mut(), l, s.raw(), l)) }.unwrap())
            .collect();
        e.flush();
        for r in reqs {
            r.wait().unwrap();
        }
        assert_eq!(dsts, srcs, "{threads} threads");
        e.barrier().unwrap();
    }
}

/// A CPU engine that counts the submissions, enqueues and flushes it is given: a scope's
/// batch through an engine other than the CPU engine itself (any `Engine`).
struct Counts {
    cpu: CpuEngine,
    submits: AtomicUsize,
    enqueues: AtomicUsize,
    flushes: AtomicUsize,
}

impl Counts {
    fn new(cpu: CpuEngine) -> Counts {
        Counts {
            cpu,
            submits: AtomicUsize::new(0),
            enqueues: AtomicUsize::new(0),
            flushes: AtomicUsize::new(0),
        }
    }
    /// (submits, enqueues, flushes) so far.
    fn counts(&self) -> (usize, usize, usize) {
        let get = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        (get(&self.submits), get(&self.enqueues), get(&self.flushes))
    }
}

impl Engine for Counts {
    fn name(&self) -> String {
        "counts".into()
    }
    fn supports(&self, dst: MemKind, src: Option<MemKind>) -> bool {
        self.cpu.supports(dst, src)
    }
    unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
        self.submits.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.cpu.submit_raw(job) }
    }
    unsafe fn enqueue(&self, job: Job) -> Result<Request, SubmitError> {
        self.enqueues.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.cpu.enqueue(job) }
    }
    fn flush(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.cpu.flush();
    }
    fn barrier(&self) -> Result<(), BarrierError> {
        self.cpu.barrier()
    }
}

#[test]
fn a_scope_enqueues_a_batch_and_flushes_it() {
    let len = 256 << 10;
    let l = Layout::bytes(len).unwrap();
    let copy = Op::Copy { dst: l, src: l };
    let srcs: Vec<Vec<u8>> = (0..8).map(|i| data(len, i)).collect();
    for inline in [0, len] {
        // Queued to the workers (inline 0) and run at submit.
        let e =
            Counts::new(CpuEngine::with_config(CpuConfig::new(2).inline_bytes(inline)).unwrap());
        let mut dsts = vec![vec![0u8; len]; srcs.len()];
        e.scope(|s| -> ferry::Result<()> {
            for (d, x) in dsts.iter_mut().zip(&srcs) {
                drop(s.enqueue(d, Some(x), copy.clone(), &[])?);
            }
            s.flush();
            Ok(())
        })
        .unwrap();
        assert_eq!(dsts, srcs, "inline {inline}");
        // Enqueued, not submitted; the explicit flush and the scope's end.
        assert_eq!(e.counts(), (0, srcs.len(), 2), "inline {inline}");
        // No flush in the closure: the scope's end starts the batch; the requests are waited
        // on inside the scope all the same (a wait never hangs for want of a flush).
        let mut dsts = vec![vec![0u8; len]; srcs.len()];
        e.scope(|s| -> ferry::Result<()> {
            let reqs = dsts
                .iter_mut()
                .zip(&srcs)
                .map(|(d, x)| s.enqueue(d, Some(x), copy.clone(), &[]))
                .collect::<Result<Vec<_>, _>>()?;
            reqs.into_iter().try_for_each(Request::wait)?;
            Ok(())
        })
        .unwrap();
        assert_eq!(dsts, srcs, "inline {inline}");
        assert_eq!(e.counts(), (0, 2 * srcs.len(), 3), "inline {inline}");
        // A refusal comes back at enqueue (the destination is short), untouched; a scope that
        // enqueued nothing flushes nothing.
        let mut short = vec![0u8; len - 1];
        let err = e
            .scope(|s| {
                s.enqueue(&mut short, Some(&srcs[0]), copy.clone(), &[])
                    .map_err(ferry::Error::from)
            })
            .expect_err("a short destination is refused");
        assert!(matches!(err, ferry::Error::Submit(_)), "{err}");
        assert!(short.iter().all(|&b| b == 0));
        let mut d = vec![0u8; len];
        e.scope(|s| -> ferry::Result<()> { Ok(s.memcpy(&mut d, &srcs[1])?.wait()?) })
            .unwrap();
        assert_eq!(d, srcs[1]);
        assert_eq!(
            e.counts().2,
            4,
            "inline {inline}: only the enqueuing scope flushed"
        );
    }
}

/// Submits `work` through any backend and waits for it.
fn run<B: Backend>(b: &B, work: B::Work) -> Result<(), String> {
    // SAFETY: the callers' buffers outlive this call, which waits for the request.
    let req = unsafe { b.submit_work(work) }.map_err(|e| e.to_string())?;
    b.flush();
    let r = req.wait().map_err(|e| e.to_string());
    b.barrier().map_err(|e| e.to_string())?;
    r
}

#[test]
fn the_file_engine_through_the_backend_contract() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("backend.bin");
    let e = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    assert!(
        Backend::name(&e).starts_with("file("),
        "{}",
        Backend::name(&e)
    );
    let n = 3 << 20;
    let src = data(n, 9);
    let file = e.open(&path, OpenMode::Create).unwrap();
    let store = FileJob {
        file: file.clone(),
        offset: 4096,
        buf: src.raw(),
        op: IoOp::Write,
    };
    run(&e, store).unwrap();
    let mut back = vec![0u8; n];
    let load = FileJob {
        file: file.clone(),
        offset: 4096,
        buf: back.raw_mut(),
        op: IoOp::Read,
    };
    run(&e, load).unwrap();
    assert_eq!(back, src);
    // Past the end: refused at submit, the file engine's own error kept whole.
    let mut past = vec![0u8; 8192];
    let job = FileJob {
        file,
        offset: (n as u64) + 4096 - 100,
        buf: past.raw_mut(),
        op: IoOp::Read,
    };
    // SAFETY: refused before anything runs (asserted).
    let err = unsafe { e.submit_work(job) }.expect_err("a range past the end is refused");
    match &err {
        SubmitError::Backend(b) => assert!(
            matches!(
                b.downcast_ref::<FileError>(),
                Some(FileError::OutOfRange { .. })
            ),
            "{err}"
        ),
        other => panic!("not the file engine's error: {other}"),
    }
    assert!(past.iter().all(|&b| b == 0));
}
