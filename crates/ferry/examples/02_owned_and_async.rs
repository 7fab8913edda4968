//! Owned transfers handed back on completion, futures, and a barrier that reports every failure.
//!
//! `cargo run --release --example 02_owned_and_async`

use ferry::{CpuEngine, Engine, EngineExt, OpError, Operator, Program};
use std::sync::Arc;

/// A custom operator that always fails: only its own request fails.
struct Broken;
impl Operator for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    fn lower(&self, _prog: &mut Program) -> Result<(), OpError> {
        Err(OpError::Custom("this operator always fails".into()))
    }
}

/// Polls a future to completion on this thread (any executor works; this keeps the example
/// free of dependencies).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

fn main() -> Result<(), ferry::Error> {
    let engine = CpuEngine::new(2)?;
    // Owned: the engine holds the buffers until the copy completes, then hands them back.
    let t = engine.memcpy_owned(vec![0u8; 64 << 20], vec![3u8; 64 << 20])?;
    let (dst, _src) = block_on(t)?;
    assert!(dst.iter().all(|&b| b == 3));
    println!("owned 64 MiB copy done");

    // Scoped: two good copies and one failing operator; the scope reports the failure.
    let src = vec![1u8; 1 << 20];
    let (mut a, mut b, mut c) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let r = engine.scope(|s| -> Result<(), ferry::Error> {
        drop(s.memcpy(&mut a, &src)?);
        drop(s.custom(&mut b, &src, Arc::new(Broken))?);
        drop(s.memcpy(&mut c, &src)?);
        Ok(())
    });
    match r {
        Err(ferry::Error::Barrier(e)) => println!("the scope reported: {e}"),
        other => other?,
    }
    assert!(
        a.iter().chain(&c).all(|&x| x == 1),
        "the good copies completed"
    );
    engine.barrier()?;
    Ok(())
}
