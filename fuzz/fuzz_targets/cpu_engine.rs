//! The CPU engine (0, 1 and 2 worker threads, inline and queued, small chunks so that copies
//! are split) and a multiplex of CPU engines, executing random copies and fills on small
//! buffers: the destination must equal the naive element-wise reference byte for byte (bytes
//! outside the layout untouched), and a job is refused exactly when the reference says the
//! layouts do not fit the buffers or cannot be planned.
#![no_main]

#[path = "common/mod.rs"]
mod common;

use common::{reference_copy, reference_fill, Pair};
use ferry::{CpuConfig, CpuEngine, Engine, EngineExt, MultiplexEngine, Plan};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn engines() -> &'static [Box<dyn Engine>] {
    static E: OnceLock<Vec<Box<dyn Engine>>> = OnceLock::new();
    E.get_or_init(|| {
        let cpu = |c: CpuConfig| {
            Box::new(CpuEngine::with_config(c).expect("cpu engine")) as Box<dyn Engine>
        };
        vec![
            cpu(CpuConfig::caller_runs().inline_bytes(0).chunk_bytes(16)),
            cpu(CpuConfig::new(1).inline_bytes(0).chunk_bytes(7)),
            cpu(CpuConfig::new(2).inline_bytes(0).chunk_bytes(32)),
            cpu(CpuConfig::new(2)),
            Box::new(
                MultiplexEngine::new()
                    .with(
                        CpuEngine::with_config(CpuConfig::new(1).inline_bytes(0).chunk_bytes(8))
                            .expect("cpu"),
                        1.0,
                    )
                    .with(CpuEngine::caller_runs().expect("cpu"), 2.0)
                    .split_bytes(1),
            ),
        ]
    })
}

fuzz_target!(|input: (Pair, u8, u8, u8, i8, i8, bool)| {
    let (Pair { dst, src }, which, seed, poison, dst_slack, src_slack, fill) = input;
    let engine = &engines()[which as usize % engines().len()];
    // Buffers sized around the layouts' spans; a negative slack makes them too short.
    let size = |end: usize, slack: i8| (end as isize + slack as isize / 16).max(1) as usize;
    let (dlen, slen) = (
        size(dst.span().end, dst_slack),
        size(src.span().end, src_slack),
    );
    let src_buf: Vec<u8> = (0..slen)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let mut got = vec![poison; dlen];
    let mut want = got.clone();
    if fill {
        let pattern: Vec<u8> = (0..dst.elem_size())
            .map(|i| seed.wrapping_add(i as u8 * 7))
            .collect();
        let ok = dst.check_buffer(dlen).is_ok() && Plan::fill(&dst).is_ok();
        let r = engine.scope(|s| {
            Ok::<_, ferry::BarrierError>(s.fill(&mut got[..], &dst, &pattern).map(|r| r.wait()))
        });
        match r.expect("barrier") {
            Ok(w) => {
                assert!(
                    ok,
                    "fill accepted but the reference refuses {dst:?} in {dlen} bytes"
                );
                w.expect("fill failed");
                reference_fill(&mut want, &dst, &pattern);
            }
            Err(e) => assert!(
                !ok,
                "fill refused ({e}) but the reference accepts {dst:?} in {dlen} bytes"
            ),
        }
    } else {
        let ok = dst.check_buffer(dlen).is_ok()
            && src.check_buffer(slen).is_ok()
            && Plan::new(&dst, &src).is_ok();
        let r = engine.scope(|s| {
            Ok::<_, ferry::BarrierError>(
                s.copy(&mut got[..], &dst, &src_buf[..], &src)
                    .map(|r| r.wait()),
            )
        });
        match r.expect("barrier") {
            Ok(w) => {
                assert!(
                    ok,
                    "copy accepted but the reference refuses {dst:?} <- {src:?}"
                );
                w.expect("copy failed");
                reference_copy(&mut want, &dst, &src_buf, &src);
            }
            Err(e) => assert!(
                !ok,
                "copy refused ({e}) but the reference accepts {dst:?} ({dlen}) <- {src:?} ({slen})"
            ),
        }
    }
    assert!(
        got == want,
        "{} differs from the reference: {dst:?} <- {src:?}",
        engine.name()
    );
});
