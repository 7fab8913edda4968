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

/// A failure seen only by the scope's barrier comes back through the same `?`.
#[test]
fn scope_returns_the_barriers_failure_as_the_closures_error() {
    struct Fails;
    impl ferry::Operator for Fails {
        fn name(&self) -> &str {
            "fails"
        }
        fn lower(&self, _: &mut ferry::Program) -> Result<(), ferry::OpError> {
            Err(ferry::OpError::Custom("no".into()))
        }
    }
    let engine = CpuEngine::new(1).unwrap();
    let (src, mut dst) = (vec![1u8; 64], vec![0u8; 64]);
    let r = engine.scope(|s| -> ferry::Result<()> {
        drop(s.custom(&mut dst, &src, std::sync::Arc::new(Fails))?);
        Ok(())
    });
    assert!(matches!(r, Err(ferry::Error::Barrier(_))), "{r:?}");
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
