//! The traps a new user met in the safe API (issue 15), each one a test that failed on the
//! old code: a scope that returned `Ok` with its destination untouched, `wait()?` that did not
//! convert, layouts that took element strides as byte strides, buffers of `half`'s types, and
//! two meanings of "0 threads".

use ferry::{CpuEngine, Engine, EngineExt, SubmitError};

/// One `?` on a scope propagates a submit error: an 8-byte copy into a 4-byte destination is
/// an error, not `Ok` with the destination untouched.
#[test]
fn single_question_mark_scope_reports_the_submit_error() {
    fn copy(engine: &CpuEngine, dst: &mut [u8], src: &[u8]) -> ferry::Result<()> {
        engine.scope(|s| -> ferry::Result<()> {
            s.memcpy(dst, src)?.wait()?;
            Ok(())
        })?;
        Ok(())
    }
    let engine = CpuEngine::new(1).unwrap();
    let (src8, mut dst4) = ([7u8; 8], [0u8; 4]);
    let err = copy(&engine, &mut dst4, &src8).unwrap_err();
    assert!(
        matches!(err, ferry::Error::Submit(SubmitError::Op(_))),
        "{err:?}"
    );
    assert_eq!(dst4, [0; 4]);
    let mut dst8 = [0u8; 8];
    copy(&engine, &mut dst8, &src8).unwrap();
    assert_eq!(dst8, src8);
}

/// An operator that fails when it runs: a request that fails after its submit.
struct Fails;
impl ferry::Operator for Fails {
    fn name(&self) -> &str {
        "fails"
    }
    fn lower(&self, _: &mut ferry::Program) -> Result<(), ferry::OpError> {
        Err(ferry::OpError::Custom("no".into()))
    }
}

/// A failure seen only by the scope's barrier comes back through the same `?`.
#[test]
fn scope_returns_the_barriers_failure_as_the_closures_error() {
    let engine = CpuEngine::new(1).unwrap();
    let (src, mut dst) = (vec![1u8; 64], vec![0u8; 64]);
    let r = engine.scope(|s| -> ferry::Result<()> {
        drop(s.custom(&mut dst, &src, std::sync::Arc::new(Fails))?);
        Ok(())
    });
    assert!(matches!(r, Err(ferry::Error::Barrier(_))), "{r:?}");
}

/// The closure's own error wins over a failure only the barrier saw, and the barrier still
/// ran: every request of the scope has ended when it returns (the engine idle after it).
#[test]
fn scope_returns_the_closures_error_before_the_barriers() {
    #[derive(Debug)]
    enum Mine {
        Own,
        Barrier(ferry::BarrierError),
    }
    impl From<ferry::BarrierError> for Mine {
        fn from(b: ferry::BarrierError) -> Mine {
            Mine::Barrier(b)
        }
    }
    let engine = CpuEngine::new(1).unwrap();
    let (src, mut dst, mut big) = (vec![1u8; 64], vec![0u8; 64], vec![0u8; 8 << 20]);
    let big_src = vec![5u8; 8 << 20];
    let r = engine.scope(|s| -> Result<(), Mine> {
        drop(
            s.custom(&mut dst, &src, std::sync::Arc::new(Fails))
                .expect("submitted"),
        );
        drop(s.memcpy(&mut big, &big_src).expect("submitted")); // on the workers, not waited here
        Err(Mine::Own)
    });
    match r {
        Err(Mine::Own) => {}
        Err(Mine::Barrier(b)) => panic!("the barrier's error, not the closure's: {b}"),
        Ok(()) => panic!("Ok, not the closure's error"),
    }
    assert!(big == big_src, "the scope waited for its requests");
    assert!(engine.barrier().is_ok(), "nothing left for a later barrier");
}

/// `Failed` and `Refused` are errors that `?` turns into `ferry::Error` or `Box<dyn Error>`.
#[test]
fn owned_failures_convert_with_question_mark() {
    fn into_ferry(engine: &CpuEngine) -> ferry::Result<Vec<u8>> {
        let (dst, _src) = engine.memcpy_owned(vec![0u8; 4], vec![1u8; 8])?.wait()?;
        Ok(dst)
    }
    fn into_box(engine: &CpuEngine) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let (dst, _src) = engine.memcpy_owned(vec![0u8; 4], vec![1u8; 8])?.wait()?;
        Ok(dst)
    }
    let engine = CpuEngine::new(1).unwrap();
    assert!(matches!(into_ferry(&engine), Err(ferry::Error::Submit(_))));
    let e = into_box(&engine).unwrap_err();
    // Debug leaves the buffers out.
    assert!(!format!("{e:?}").contains("[0, 0, 0, 0]"), "{e:?}");
}

/// `scope` and `copy_owned` work on an engine behind `&dyn Engine`.
#[test]
fn scope_and_owned_copies_on_dyn_engine() {
    let cpu = CpuEngine::new(2).unwrap();
    let engine: &dyn Engine = &cpu;
    let (src, mut dst) = (vec![3u8; 4096], vec![0u8; 4096]);
    engine
        .scope(|s| -> ferry::Result<()> {
            s.memcpy(&mut dst, &src)?.wait()?;
            Ok(())
        })
        .unwrap();
    assert_eq!(dst, src);
    let l = ferry::Layout::bytes(4096).unwrap();
    let (dst, _) = engine
        .copy_owned(vec![0u8; 4096], &l, src.clone(), &l)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(dst, src);
    let boxed: Box<dyn Engine> = Box::new(CpuEngine::new(1).unwrap());
    let mut dst = vec![0u8; 4096];
    boxed
        .scope(|s| -> ferry::Result<()> {
            s.memcpy(&mut dst, &src)?.wait()?;
            Ok(())
        })
        .unwrap();
    assert_eq!(dst, src);
}

/// Element strides (PyTorch's `stride()`) are the default; the same numbers given as byte
/// strides over a typed buffer are refused instead of copying the wrong bytes.
#[test]
fn element_strides_by_default_byte_strides_over_typed_buffers_refused() {
    use ferry::{Layout, LayoutError, OpError};
    let engine = CpuEngine::new(2).unwrap();
    let src: Vec<f32> = (0..12).map(|i| i as f32).collect(); // 3 x 4, row-major
    let mut dst = vec![0f32; 12]; // 4 x 3: the transpose
    let dl = Layout::of::<f32>(&[4, 3]).unwrap();
    // src viewed as 4 x 3 with element strides [1, 4]: the transpose.
    let sl = Layout::with_strides::<f32>(&[4, 3], &[1, 4]).unwrap();
    engine
        .scope(|s| -> ferry::Result<()> {
            s.copy(&mut dst, &dl, &src, &sl)?.wait()?;
            Ok(())
        })
        .unwrap();
    let want: Vec<f32> = (0..4)
        .flat_map(|j| (0..3).map(move |i| (i * 4 + j) as f32))
        .collect();
    assert_eq!(dst, want);
    // The same strides as bytes: refused at submit, destination untouched.
    let bad = Layout::with_byte_strides(&[4, 3], &[1, 4], 4).unwrap();
    let mut dst = vec![0f32; 12];
    let err = engine
        .scope(|s| -> ferry::Result<()> {
            drop(s.copy(&mut dst, &dl, &src, &bad)?);
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            ferry::Error::Submit(SubmitError::Op(OpError::Src(
                LayoutError::NotWholeElements {
                    what: "stride",
                    value: 1,
                    elem: 4
                }
            )))
        ),
        "{err:?}"
    );
    assert!(dst.iter().all(|&x| x == 0.0));
    // A 2-byte element over f32 buffers: refused too (owned copies as well).
    let half = Layout::contiguous(&[24], 2).unwrap();
    let r = engine.copy_owned(vec![0f32; 12], &half, src.clone(), &half);
    assert!(matches!(
        r.map(drop),
        Err(ferry::Refused {
            error: SubmitError::Op(OpError::Dst(LayoutError::NotWholeElements { .. })),
            ..
        })
    ));
    // Bytes are bytes: a byte layout over byte buffers, and memcpy of any types, still work.
    let (dst, _) = engine
        .memcpy_owned(vec![0u8; 48], src.clone())
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(dst[4..8], 1f32.to_ne_bytes());
}

/// A layout made for one element type over a buffer of another is refused, naming both types
/// (issue 33): `Layout::of::<f64>` over `Vec<i32>` used to copy raw bytes. Untyped layouts and
/// byte buffers still pass; nothing is written on refusal.
#[test]
fn a_typed_layout_over_a_buffer_of_another_type_is_refused() {
    use ferry::{Layout, LayoutError, OpError, SubmitError};
    let engine = CpuEngine::new(2).unwrap();
    let src: Vec<i32> = (0..8).collect();
    let mut dst = vec![0i32; 8];
    // Different sizes (f64 over i32) and the same size (f32 over i32): both refused.
    for l in [
        Layout::of::<f64>(&[4]).unwrap(),
        Layout::of::<f32>(&[8]).unwrap(),
    ] {
        let err = engine
            .scope(|s| -> ferry::Result<()> {
                drop(s.copy(&mut dst, &l, &src, &l)?);
                Ok(())
            })
            .unwrap_err();
        match &err {
            ferry::Error::Submit(SubmitError::Op(OpError::Dst(LayoutError::ElemType {
                layout,
                buffer: "i32",
            }))) => assert_eq!(Some(*layout), l.elem_type()),
            other => panic!("{other:?}"),
        }
        let text = err.to_string();
        assert!(
            text.contains("i32") && text.contains(l.elem_type().unwrap()),
            "{text}"
        );
        assert!(dst.iter().all(|&x| x == 0));
    }
    // The source side is named as the source; owned copies refuse and hand the buffers back.
    let f = Layout::of::<f32>(&[8]).unwrap();
    let i = Layout::of::<i32>(&[8]).unwrap();
    let r = engine.copy_owned(vec![0i32; 8], &i, src.clone(), &f);
    match r.map(drop) {
        Err(ferry::Refused {
            error:
                SubmitError::Op(OpError::Src(LayoutError::ElemType {
                    layout: "f32",
                    buffer: "i32",
                })),
            src: back,
            ..
        }) => assert_eq!(back, src),
        other => panic!("{:?}", other.err().map(|r| r.error)),
    }
    // The matching type, an untyped layout of the same size, and a byte buffer all copy.
    let untyped = Layout::contiguous(&[8], 4).unwrap();
    assert_eq!(untyped.elem_type(), None);
    let mut bytes = vec![0u8; 32];
    engine
        .scope(|s| -> ferry::Result<()> {
            s.copy(&mut dst, &i, &src, &i)?.wait()?;
            s.copy(&mut bytes, &f, &src, &untyped)?.wait()?;
            Ok(())
        })
        .unwrap();
    assert_eq!(dst, src);
    assert_eq!(bytes[4..8], 1i32.to_ne_bytes());
}

/// Buffers of `half`'s `bf16` and `f16` (through `bytemuck::Pod`) copy, strided too.
#[test]
fn bf16_and_f16_buffers_copy() {
    use ferry::Layout;
    use half::{bf16, f16};
    let engine = CpuEngine::new(2).unwrap();
    let src: Vec<bf16> = (0..64).map(|i| bf16::from_f32(i as f32)).collect();
    let mut dst = vec![bf16::ZERO; 64];
    engine
        .scope(|s| -> ferry::Result<()> {
            s.memcpy(&mut dst, &src)?.wait()?;
            Ok(())
        })
        .unwrap();
    assert_eq!(dst, src);
    // Every other element, into a dense f16 buffer of half the length.
    let src: Vec<f16> = (0..64).map(|i| f16::from_f32(i as f32)).collect();
    let mut dst = vec![f16::ZERO; 32];
    let sl = Layout::with_strides::<f16>(&[32], &[2]).unwrap();
    let dl = Layout::of::<f16>(&[32]).unwrap();
    engine
        .scope(|s| -> ferry::Result<()> {
            s.copy(&mut dst, &dl, &src, &sl)?.wait()?;
            Ok(())
        })
        .unwrap();
    assert!(dst
        .iter()
        .enumerate()
        .all(|(i, x)| x.to_f32() == (2 * i) as f32));
}

/// "0 threads" means one worker per core, as in the C API (`ferry_dma_cpu_create(&dma, 0)`,
/// tested in ferry-capi); the caller-runs mode has its own name.
#[test]
fn zero_threads_means_one_worker_per_core() {
    use ferry::engine::cpu::probe;
    use ferry::CpuConfig;
    let cores = probe().cores;
    let e = CpuEngine::new(0).unwrap();
    assert_eq!(e.config().threads, cores);
    assert_eq!(e.name(), format!("cpu({cores})"));
    assert_eq!(CpuConfig::new(0), CpuConfig::default());
    let caller = CpuEngine::caller_runs().unwrap();
    assert_eq!(caller.config().threads, 0);
    // Caller-runs still copies (the work runs in wait).
    let (dst, _) = caller
        .memcpy_owned(vec![0u8; 1 << 20], vec![9u8; 1 << 20])
        .unwrap()
        .wait()
        .unwrap();
    assert!(dst.iter().all(|&b| b == 9));
}
