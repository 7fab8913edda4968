//! Every bad input gets its own error variant with a readable message naming the numbers
//! involved, and leaves the engine usable.

use ferry::{
    CpuConfig, CpuEngine, Engine, EngineExt, Job, Layout, LayoutError, MemKind, MultiplexEngine,
    OpError, Operator, PlanError, Program, RawBuf, RequestError, SubmitError,
};
use std::sync::Arc;

fn engines() -> Vec<Box<dyn Engine>> {
    vec![
        Box::new(CpuEngine::caller_runs().unwrap()),
        Box::new(
            CpuEngine::with_config(CpuConfig::new(2).chunk_bytes(64).inline_bytes(0)).unwrap(),
        ),
        Box::new(
            MultiplexEngine::new()
                .with(CpuEngine::new(1).unwrap(), 1.0)
                .with(
                    CpuEngine::with_config(CpuConfig::new(2).inline_bytes(0)).unwrap(),
                    2.0,
                )
                .split_bytes(256),
        ),
    ]
}

/// Asserts `msg` mentions every one of `parts`.
fn says(msg: impl ToString, parts: &[&str]) {
    let msg = msg.to_string();
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} does not mention {p:?}");
    }
}

/// A copy through the safe API that must be refused at submit.
fn refused<E: Engine>(
    e: &E,
    dst_len: usize,
    dl: &Layout,
    src_len: usize,
    sl: &Layout,
) -> SubmitError {
    let src = vec![1u8; src_len];
    let mut dst = vec![0u8; dst_len];
    let r = e
        .scope(|s| Ok::<_, ferry::BarrierError>(s.copy(&mut dst, dl, &src, sl).map(|_| ())))
        .unwrap();
    assert!(dst.iter().all(|&b| b == 0), "a refused copy wrote");
    r.unwrap_err()
}

/// The engine still copies correctly.
fn still_usable<E: Engine>(e: &E) {
    let src: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    let mut dst = vec![0u8; 5000];
    e.scope(|s| Ok::<_, ferry::BarrierError>(s.memcpy(&mut dst, &src).map(|_| ())))
        .unwrap()
        .unwrap();
    assert_eq!(dst, src);
}

#[test]
fn shape_and_elem_size_mismatch() {
    for e in engines() {
        let a = Layout::contiguous(&[4, 6], 4).unwrap();
        let b = Layout::contiguous(&[6, 4], 4).unwrap();
        let err = refused(&e, 96, &a, 96, &b);
        assert_eq!(
            err,
            SubmitError::Op(OpError::Plan(PlanError::ShapeMismatch {
                dst: vec![4, 6],
                src: vec![6, 4]
            }))
        );
        says(&err, &["[4, 6]", "[6, 4]"]);
        let c = Layout::contiguous(&[4, 6], 2).unwrap();
        let err = refused(&e, 96, &a, 96, &c);
        assert_eq!(
            err,
            SubmitError::Op(OpError::Plan(PlanError::ElemSizeMismatch {
                dst: 4,
                src: 2
            }))
        );
        says(&err, &["4 bytes", "2 bytes"]);
        still_usable(&e);
    }
}

#[test]
fn layout_larger_than_its_buffer() {
    for e in engines() {
        let l = Layout::contiguous(&[10, 10], 4).unwrap();
        let err = refused(&e, 399, &l, 400, &l);
        assert_eq!(
            err,
            SubmitError::Op(OpError::Dst(LayoutError::OutOfBounds {
                end: 400,
                len: 399
            }))
        );
        says(&err, &["destination", "400", "399"]);
        let off = l.with_offset(3).unwrap();
        let err = refused(&e, 400, &l, 400, &off);
        assert_eq!(
            err,
            SubmitError::Op(OpError::Src(LayoutError::OutOfBounds {
                end: 403,
                len: 400
            }))
        );
        says(&err, &["source", "403", "400"]);
        // memcpy into a shorter destination.
        let src = vec![1u8; 100];
        let mut dst = vec![0u8; 99];
        let err = e
            .scope(|s| Ok::<_, ferry::BarrierError>(s.memcpy(&mut dst, &src).map(|_| ())))
            .unwrap()
            .unwrap_err();
        assert_eq!(
            err,
            SubmitError::Op(OpError::Dst(LayoutError::OutOfBounds { end: 100, len: 99 }))
        );
        still_usable(&e);
    }
}

#[test]
fn destination_overlapping_itself() {
    for e in engines() {
        let dl = Layout::with_byte_strides(&[4, 4], &[4, 2], 4).unwrap();
        let sl = Layout::contiguous(&[4, 4], 4).unwrap();
        let err = refused(&e, 64, &dl, 64, &sl);
        assert_eq!(
            err,
            SubmitError::Op(OpError::Plan(PlanError::DstSelfOverlap {
                dims: vec![4, 4],
                strides: vec![4, 2]
            }))
        );
        says(&err, &["overlaps itself", "[4, 2]"]);
        let b = Layout::with_byte_strides(&[4], &[0], 4).unwrap();
        let src = vec![0u8; 4];
        let mut dst = vec![0u8; 4];
        let err = e
            .scope(|s| {
                Ok::<_, ferry::BarrierError>(s.fill(&mut dst, &b, &[1, 2, 3, 4]).map(|_| ()))
            })
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(
                err,
                SubmitError::Op(OpError::Plan(PlanError::DstSelfOverlap { .. }))
            ),
            "{err}"
        );
        // A broadcast source is fine.
        let dl = Layout::contiguous(&[4], 4).unwrap();
        let mut dst = vec![0u8; 16];
        e.scope(|s| Ok::<_, ferry::BarrierError>(s.copy(&mut dst, &dl, &src, &b).map(|_| ())))
            .unwrap()
            .unwrap();
        still_usable(&e);
    }
}

#[test]
fn overlapping_source_and_destination_in_one_buffer() {
    for e in engines() {
        let mut buf = vec![0u8; 1024];
        let p = buf.as_mut_ptr();
        let l = Layout::bytes(512).unwrap();
        let dst = RawBuf::host(p, 512, MemKind::Pageable);
        // SAFETY: both views lie inside `buf`, which outlives the calls.
        let src = RawBuf::host(unsafe { p.add(256) }, 512, MemKind::Pageable);
        // SAFETY: the job is refused before anything runs (asserted below).
        let err = unsafe { e.submit_raw(Job::copy(dst, l, src, l)) }.unwrap_err();
        let (a, b) = (p as u64, p as u64 + 256);
        assert_eq!(
            err,
            SubmitError::Overlap(PlanError::Overlap {
                dst: a..a + 512,
                src: b..b + 512
            })
        );
        says(&err, &[&a.to_string(), &(b + 512).to_string(), "overlap"]);
        // Disjoint halves of one allocation are fine.
        // SAFETY: 512 is inside `buf` (1024 bytes long).
        let src = RawBuf::host(unsafe { p.add(512) }, 512, MemKind::Pageable);
        // SAFETY: disjoint views inside `buf`, which is not touched until the request is waited.
        let r = unsafe { e.submit_raw(Job::copy(dst, l, src, l)) }.unwrap();
        r.wait().unwrap();
        // Null addresses.
        let null = RawBuf {
            addr: 0,
            len: 512,
            kind: MemKind::Pageable,
        };
        // SAFETY: refused before anything runs.
        let err = unsafe { e.submit_raw(Job::copy(null, l, src, l)) }.unwrap_err();
        assert_eq!(err, SubmitError::Null);
        says(&err, &["null"]);
        drop(buf);
        e.barrier().unwrap();
        still_usable(&e);
    }
}

#[test]
fn unsupported_memory_kind() {
    for e in engines() {
        let mut host = vec![0u8; 64];
        let src = [0u8; 64];
        let l = Layout::bytes(64).unwrap();
        let dev = RawBuf {
            addr: host.as_mut_ptr() as u64,
            len: 64,
            kind: MemKind::Device { ordinal: 3 },
        };
        let s = RawBuf::host(src.as_ptr(), 64, MemKind::Pageable);
        // SAFETY: refused before anything runs.
        let err = unsafe { e.submit_raw(Job::copy(dev, l, s, l)) }.unwrap_err();
        assert!(
            matches!(
                &err,
                SubmitError::Unsupported {
                    dst: MemKind::Device { ordinal: 3 },
                    src: Some(MemKind::Pageable),
                    ..
                }
            ),
            "{err}"
        );
        says(
            &err,
            &["cannot copy pageable memory -> device 3 memory", &e.name()],
        );
        // SAFETY: refused before anything runs.
        let err = unsafe { e.submit_raw(Job::fill(dev, l, &[0])) }.unwrap_err();
        says(&err, &["cannot fill device 3 memory"]);
        assert!(!e.supports(MemKind::Pageable, Some(MemKind::Device { ordinal: 0 })));
        assert!(e.supports(MemKind::Pinned, Some(MemKind::Mapped)));
        still_usable(&e);
    }
}

#[test]
fn fill_pattern_of_the_wrong_size() {
    for e in engines() {
        let l = Layout::contiguous(&[8], 4).unwrap();
        let mut dst = vec![0u8; 32];
        let err = e
            .scope(|s| Ok::<_, ferry::BarrierError>(s.fill(&mut dst, &l, &[1, 2, 3]).map(|_| ())))
            .unwrap()
            .unwrap_err();
        assert_eq!(
            err,
            SubmitError::Op(OpError::PatternSize {
                pattern: 3,
                elem: 4
            })
        );
        says(&err, &["3 bytes", "4 bytes"]);
        let err = e
            .scope(|s| Ok::<_, ferry::BarrierError>(s.fill(&mut dst, &l, &[]).map(|_| ())))
            .unwrap()
            .unwrap_err();
        assert_eq!(
            err,
            SubmitError::Op(OpError::PatternSize {
                pattern: 0,
                elem: 4
            })
        );
        assert!(dst.iter().all(|&b| b == 0));
        still_usable(&e);
    }
}

#[test]
fn layout_errors_are_specific_and_readable() {
    let l = Layout::contiguous(&[10, 6], 4).unwrap();
    let e = l.slice(1, 2..9, 1).unwrap_err();
    assert_eq!(
        e,
        LayoutError::SliceOutOfRange {
            axis: 1,
            start: 2,
            end: 9,
            dim: 6
        }
    );
    says(&e, &["2..9", "axis 1", "0..6"]);
    let e = l.slice(0, 0..4, 0).unwrap_err();
    assert_eq!(e, LayoutError::ZeroStep { axis: 0 });
    says(&e, &["axis 0"]);
    // A zero dim is an empty layout, not an error (the C API refuses it: ferry-capi's tests).
    assert!(Layout::with_byte_strides(&[3, 0, 2], &[1, 1, 1], 1)
        .unwrap()
        .is_empty());
    let e = Layout::contiguous(&[4], 0).unwrap_err();
    assert_eq!(e, LayoutError::ZeroElemSize);
    says(&e, &["element size"]);
    let e = Layout::contiguous(&[usize::MAX / 2, 3], 1).unwrap_err();
    assert_eq!(e, LayoutError::Overflow);
    says(&e, &["overflows"]);
    let e = Layout::contiguous(&[2; 20], 1).unwrap_err();
    assert_eq!(
        e,
        LayoutError::TooManyDims {
            ndim: 20,
            max: ferry::MAX_DIMS
        }
    );
    says(&e, &["20", "16"]);
    let e = l.reshape(&[7, 9]).unwrap_err();
    assert_eq!(e, LayoutError::ReshapeCount { from: 60, to: 63 });
    says(&e, &["60", "63"]);
    let e = l.transpose(0, 1).unwrap().reshape(&[60]).unwrap_err();
    assert!(matches!(e, LayoutError::ReshapeNeedsCopy { .. }));
    says(&e, &["[6, 10]", "[4, 24]", "[60]"]);
    let e = l.permute(&[1, 1]).unwrap_err();
    assert_eq!(
        e,
        LayoutError::BadPermutation {
            ndim: 2,
            order: vec![1, 1]
        }
    );
    says(&e, &["[1, 1]", "2 axes"]);
    let e = Layout::with_byte_strides(&[3, 3], &[4], 4).unwrap_err();
    assert_eq!(
        e,
        LayoutError::StridesLength {
            dims: 2,
            strides: 1
        }
    );
    says(&e, &["2 dims", "1 strides"]);
    // Through the crate-wide error, the message is unchanged.
    let top: ferry::Error = e.clone().into();
    assert_eq!(top.to_string(), e.to_string());
}

struct Fails;
impl Operator for Fails {
    fn name(&self) -> &str {
        "fails"
    }
    fn lower(&self, _: &mut Program) -> Result<(), OpError> {
        Err(OpError::Custom("boom at byte 42".into()))
    }
}

struct Panics;
impl Operator for Panics {
    fn name(&self) -> &str {
        "panics"
    }
    fn lower(&self, _: &mut Program) -> Result<(), OpError> {
        panic!("kaboom at byte 7")
    }
}

/// A custom operator whose program reaches past the source buffer.
struct TooFar;
impl Operator for TooFar {
    fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
        prog.copy(&Layout::bytes(8)?, &Layout::bytes(8)?.with_offset(60)?)
    }
}

#[test]
fn failing_and_panicking_operators_fail_only_their_request() {
    for e in engines() {
        let src: Vec<u8> = (0..64u8).collect();
        let (mut a, mut b, mut c, mut d, mut f) = (
            vec![0u8; 64],
            vec![0u8; 64],
            vec![0u8; 64],
            vec![0u8; 64],
            vec![0u8; 64],
        );
        let r = e.scope(|s| {
            Ok::<_, ferry::BarrierError>({
                let r1 = s.memcpy(&mut a, &src).unwrap();
                let bad = s.custom(&mut b, &src, Arc::new(Fails)).unwrap();
                let r2 = s.memcpy(&mut c, &src).unwrap();
                let boom = s.custom(&mut d, &src, Arc::new(Panics)).unwrap();
                let far = s.custom(&mut f, &src, Arc::new(TooFar)).unwrap();
                (r1.wait(), bad.wait(), r2.wait(), boom.wait(), far.wait())
            })
        });
        let (r1, bad, r2, boom, far) = r.unwrap();
        assert_eq!(r1, Ok(()));
        assert_eq!(r2, Ok(()));
        let bad = bad.unwrap_err();
        assert_eq!(
            bad,
            RequestError::Operator {
                op: "fails".into(),
                msg: "boom at byte 42".into()
            }
        );
        says(&bad, &["fails", "42"]);
        let boom = boom.unwrap_err();
        assert_eq!(
            boom,
            RequestError::Panicked {
                op: "panics".into(),
                msg: "kaboom at byte 7".into()
            }
        );
        says(&boom, &["panicked", "7"]);
        let far = far.unwrap_err();
        assert!(
            matches!(&far, RequestError::Operator { op, .. } if op == "custom"),
            "{far}"
        );
        says(&far, &["source", "68", "64"]);
        assert_eq!(a, src);
        assert_eq!(c, src);
        assert!(b.iter().chain(&d).chain(&f).all(|&x| x == 0));
        // Everything was observed through wait: nothing left for the engine's barrier.
        e.barrier().unwrap();
        still_usable(&e);
    }
    let cpu = CpuEngine::new(2).unwrap();
    let src = vec![0u8; 8];
    let mut d = vec![0u8; 8];
    for _ in 0..4 {
        let r = cpu
            .scope(|s| {
                Ok::<_, ferry::BarrierError>(s.custom(&mut d, &src, Arc::new(Panics)).map(|_| ()))
            })
            .unwrap_err();
        assert_eq!(r.failures.len(), 1);
    }
    assert_eq!(
        cpu.live_workers(),
        2,
        "a panicking operator must not kill a worker"
    );
    still_usable(&cpu);
}

#[test]
fn operator_without_source() {
    struct NeedsSource;
    impl Operator for NeedsSource {
        fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
            prog.copy(&Layout::bytes(4)?, &Layout::bytes(4)?)
        }
    }
    let e = CpuEngine::new(1).unwrap();
    let mut dst = vec![0u8; 8];
    let job = Job::custom(
        RawBuf::host(dst.as_mut_ptr(), 8, MemKind::Pageable),
        None,
        Arc::new(NeedsSource),
    );
    // SAFETY: `dst` outlives the request, which is waited before `dst` is touched.
    let err = unsafe { e.submit_raw(job) }.unwrap().wait().unwrap_err();
    assert_eq!(
        err,
        RequestError::Operator {
            op: "custom".into(),
            msg: OpError::NoSource.to_string()
        }
    );
    says(&err, &["no source buffer"]);
    assert_eq!(dst, vec![0u8; 8]);
}

#[test]
fn segment_lists_copy_and_reject_bad_lists() {
    use ferry::{CpuConfig, CpuEngine, EngineExt, OpError, Segment, SubmitError};
    let src: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    for threads in [0, 1, 2] {
        let e = CpuEngine::with_config(
            CpuConfig {
                threads,
                ..CpuConfig::caller_runs()
            }
            .chunk_bytes(64)
            .inline_bytes(0),
        )
        .unwrap();
        // 300 segments in scrambled destination order, so both the sort check and the split run.
        let segs: Vec<Segment> = (0..300u64)
            .map(|i| Segment::new((i * 37 % 300) * 12, i * 13, 1 + i % 12))
            .collect();
        let mut dst = vec![0xA5u8; 300 * 12];
        let mut want = dst.clone();
        for g in &segs {
            let (d, s, n) = (g.dst_off as usize, g.src_off as usize, g.len as usize);
            want[d..d + n].copy_from_slice(&src[s..s + n]);
        }
        e.scope(|s| {
            Ok::<_, ferry::BarrierError>(s.segments(&mut dst, &src, segs.clone()).map(drop))
        })
        .unwrap()
        .unwrap();
        assert_eq!(dst, want, "threads {threads}");

        // Out of bounds: index, segment and lengths in the message.
        let mut small = vec![0u8; 16];
        let bad = vec![Segment::new(0, 0, 4), Segment::new(14, 0, 4)];
        let r = e
            .scope(|s| Ok::<_, ferry::BarrierError>(s.segments(&mut small, &src, bad).map(drop)))
            .unwrap();
        match r {
            Err(SubmitError::Op(OpError::SegmentOutOfBounds { index, dst_len, .. })) => {
                assert_eq!((index, dst_len), (1, 16));
            }
            other => panic!("{other:?}"),
        }
        assert!(small.iter().all(|&b| b == 0), "nothing written");
        // Overlapping destinations.
        let overlap = vec![
            Segment::new(8, 0, 4),
            Segment::new(0, 0, 4),
            Segment::new(2, 0, 4),
        ];
        let r = e
            .scope(|s| {
                Ok::<_, ferry::BarrierError>(s.segments(&mut small, &src, overlap).map(drop))
            })
            .unwrap();
        let err = r.unwrap_err();
        assert!(
            matches!(err, SubmitError::Op(OpError::SegmentOverlap { .. })),
            "{err:?}"
        );
        assert!(err.to_string().contains("overlapping"), "{err}");
        // An offset whose end overflows u64 is out of bounds, not a panic.
        let huge = vec![Segment::new(u64::MAX - 1, 0, 4)];
        let r = e
            .scope(|s| Ok::<_, ferry::BarrierError>(s.segments(&mut small, &src, huge).map(drop)))
            .unwrap();
        assert!(matches!(
            r,
            Err(SubmitError::Op(OpError::SegmentOutOfBounds { .. }))
        ));
    }
}

/// More worker threads than `CpuConfig::THREADS_MAX` are refused before any is started (1,000,000
/// from Python or INT_MAX from C started threads until the system refused one).
#[test]
fn too_many_cpu_workers_are_refused() {
    let e = CpuEngine::new(ferry::CpuConfig::THREADS_MAX + 1)
        .err()
        .expect("refused");
    assert!(matches!(e, ferry::Error::InvalidArgument(_)), "{e}");
    says(e, &["1025", "at most 1024"]);
    let e = CpuEngine::new(i32::MAX as usize).err().expect("refused");
    assert!(matches!(e, ferry::Error::InvalidArgument(_)), "{e}");
}
