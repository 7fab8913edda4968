//! The copy planner on random layout pairs: when a plan is made, its runs write every
//! destination byte of the layouts exactly once, each from the source byte the element-wise
//! walk pairs it with, all inside the layouts' spans; `split` covers the same runs; a fill
//! plan covers exactly the destination's bytes. When planning fails, it is for a stated reason.
#![no_main]

#[path = "common/mod.rs"]
mod common;

use common::{plan_map, reference_map, Pair};
use ferry::{Plan, PlanError, PlanKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Pair, u8, u16, u8)| {
    let (Pair { dst, src }, parts, min_bytes, align) = input;
    let plan = match Plan::new(&dst, &src) {
        Ok(p) => p,
        Err(PlanError::ShapeMismatch { .. }) => {
            let a: Vec<_> = dst.dims().iter().filter(|&&d| d != 1).collect();
            let b: Vec<_> = src.dims().iter().filter(|&&d| d != 1).collect();
            assert_ne!(a, b, "ShapeMismatch for equal shapes");
            return;
        }
        Err(PlanError::ElemSizeMismatch { .. }) => {
            assert_ne!(dst.elem_size(), src.elem_size());
            return;
        }
        Err(PlanError::DstSelfOverlap { .. }) => {
            assert!(!dst.is_non_overlapping());
            return;
        }
        Err(e) => panic!("unexpected plan error {e}"),
    };
    let kind = match plan.counts().len() {
        0 => PlanKind::Contiguous,
        1 => PlanKind::Pitched2D,
        2 => PlanKind::Pitched3D,
        _ => PlanKind::Segments,
    };
    assert_eq!(plan.kind(), kind);
    assert_eq!(
        plan.total_bytes(),
        dst.size_bytes(),
        "{plan:?} for {dst:?} <- {src:?}"
    );
    assert!(plan.run() >= dst.elem_size() && plan.run() % dst.elem_size() == 0);
    assert!(
        plan.dst_end() <= dst.span().end,
        "{plan:?} writes past {dst:?}"
    );
    assert!(
        plan.src_end() <= src.span().end,
        "{plan:?} reads past {src:?}"
    );
    assert!(plan.dst_offset() >= dst.span().start && plan.src_offset() >= src.span().start);
    let want = reference_map(&dst, &src);
    let got = plan_map(&plan);
    assert_eq!(got, want, "{plan:?} for {dst:?} <- {src:?}");

    // A split covers the same runs, each byte once.
    let pieces = plan.split(parts as usize, min_bytes as usize, align as usize);
    assert!(!pieces.is_empty() && pieces.len() <= (parts as usize).max(1));
    let mut union = std::collections::BTreeMap::new();
    for p in &pieces {
        for (d, s) in plan_map(p) {
            assert!(
                union.insert(d, s).is_none(),
                "split pieces of {plan:?} overlap at {d}"
            );
        }
    }
    assert_eq!(
        union, want,
        "split({parts}, {min_bytes}, {align}) of {plan:?}"
    );

    // A fill plan covers exactly the destination's bytes.
    let fill = Plan::fill(&dst).expect("fill of a non-overlapping destination");
    assert!(fill.src_strides().iter().all(|&s| s == 0));
    let fill_bytes: Vec<usize> = plan_map(&fill).into_keys().collect();
    assert!(
        fill_bytes.iter().eq(want.keys()),
        "fill plan {fill:?} of {dst:?}"
    );
});
