//! The submission seam every backend shares (`engine/contract.rs`, issue 30 items 2 and 5),
//! without a GPU: a CPU engine's small copies complete inside submit (the folded inline path:
//! no separate call), for borrowed and owned buffers alike, and an engine that claims more
//! than it runs inline still hands owned buffers back only after their copy; `enqueue` N jobs
//! then one `flush` completes them all; the file engine through the [`Backend`] contract
//! (plain descriptors in, `Request`s out, refusals as `SubmitError`s).

use ferry::file::{FileConfig, FileEngine, FileError, FileJob, IoOp, OpenMode};
use ferry::{
    Backend, BarrierError, CpuConfig, CpuEngine, Engine, EngineExt, Job, Layout, MemKind, Memory,
    MemoryMut, Request, SubmitError,
};

/// Deterministic bytes, different per seed.
fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
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
