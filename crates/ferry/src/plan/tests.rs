//! Unit tests of the planner: run counts for simple cases, errors, splitting.

use super::*;

fn pairs(p: &Plan) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    p.for_each_run(|d, s| {
        for b in 0..p.run() {
            v.push((d + b, s + b));
        }
    });
    v.sort_unstable();
    v
}

fn reference(dst: &Layout, src: &Layout) -> Vec<(usize, usize)> {
    let e = dst.elem_size();
    let mut v: Vec<(usize, usize)> = dst
        .element_offsets()
        .zip(src.element_offsets())
        .flat_map(|(d, s)| (0..e).map(move |b| (d + b, s + b)))
        .collect();
    v.sort_unstable();
    v
}

fn check(dst: &Layout, src: &Layout) -> Plan {
    let p = Plan::new(dst, src).unwrap();
    assert_eq!(pairs(&p), reference(dst, src), "{p:?}");
    assert_eq!(p.total_bytes(), dst.size_bytes());
    assert!(p.dst_end() <= dst.span().end && p.src_end() <= src.span().end);
    p
}

#[test]
fn contiguous_is_one_run() {
    let l = Layout::contiguous(&[3, 5, 7], 4).unwrap();
    let p = check(&l, &l);
    assert_eq!(
        (p.kind(), p.run(), p.run_count()),
        (PlanKind::Contiguous, 420, 1)
    );
    // Different shapes of size-1 dims still one run.
    let a = Layout::contiguous(&[1, 3, 1, 35], 4).unwrap();
    let b = Layout::contiguous(&[3, 35, 1], 4)
        .unwrap()
        .with_offset(12)
        .unwrap();
    let p = check(&a, &b);
    assert_eq!(
        (p.kind(), p.run(), p.src_offset()),
        (PlanKind::Contiguous, 420, 12)
    );
    // Column-major to column-major is dense in both: one run too.
    let c = Layout::column_major(&[3, 5, 7], 2).unwrap();
    assert_eq!(check(&c, &c).kind(), PlanKind::Contiguous);
}

#[test]
fn padded_rows_are_2d() {
    let src = Layout::pitched(&[16, 10], 4, 48).unwrap();
    let dst = Layout::contiguous(&[16, 10], 4).unwrap();
    let p = check(&dst, &src);
    assert_eq!(
        (
            p.kind(),
            p.run(),
            p.counts(),
            p.dst_strides(),
            p.src_strides()
        ),
        (PlanKind::Pitched2D, 40, &[16][..], &[40][..], &[48][..])
    );
    // Both padded, differently.
    let p = check(&Layout::pitched(&[16, 10], 4, 64).unwrap(), &src);
    assert_eq!((p.kind(), p.run()), (PlanKind::Pitched2D, 40));
}

#[test]
fn padded_planes_are_3d_and_tiles_are_2d() {
    // A 3-D tile of a bigger volume.
    let vol = Layout::contiguous(&[8, 16, 32], 4).unwrap();
    let tile = vol
        .slice(0, 2..6, 1)
        .unwrap()
        .slice(1, 4..12, 1)
        .unwrap()
        .slice(2, 8..24, 1)
        .unwrap();
    let dst = Layout::contiguous(&[4, 8, 16], 4).unwrap();
    let p = check(&dst, &tile);
    assert_eq!(
        (p.kind(), p.run(), p.run_count()),
        (PlanKind::Pitched3D, 64, 32)
    );
    // Full rows of a volume: planes merge with rows.
    let rows = vol.slice(1, 4..12, 1).unwrap();
    let p = check(&Layout::contiguous(&[8, 8, 32], 4).unwrap(), &rows);
    assert_eq!(
        (p.kind(), p.run(), p.run_count()),
        (PlanKind::Pitched2D, 1024, 8)
    );
}

#[test]
fn transpose_is_element_wise_2d() {
    let m = Layout::contiguous(&[6, 9], 8).unwrap();
    let t = Layout::contiguous(&[9, 6], 8)
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let p = check(&m, &t);
    assert_eq!(
        (p.kind(), p.run(), p.run_count()),
        (PlanKind::Pitched3D, 8, 54)
    );
}

#[test]
fn strided_gather_widens_nothing() {
    let src = Layout::contiguous(&[100], 4)
        .unwrap()
        .slice(0, 0..100, 3)
        .unwrap();
    let dst = Layout::contiguous(&[34], 4).unwrap();
    let p = check(&dst, &src);
    assert_eq!(
        (p.kind(), p.run(), p.run_count()),
        (PlanKind::Pitched2D, 4, 34)
    );
}

#[test]
fn broadcast_source() {
    let src = Layout::with_byte_strides(&[5, 4], &[0, 2], 2).unwrap();
    let dst = Layout::contiguous(&[5, 4], 2).unwrap();
    let p = check(&dst, &src);
    assert_eq!(
        (p.kind(), p.run(), p.run_count()),
        (PlanKind::Pitched2D, 8, 5)
    );
}

#[test]
fn fill_plans() {
    let l = Layout::pitched(&[4, 6], 2, 16).unwrap();
    let p = Plan::fill(&l).unwrap();
    assert_eq!(
        (p.kind(), p.run(), p.run_count(), p.src_strides()),
        (PlanKind::Pitched2D, 12, 4, &[0][..])
    );
    let mut runs = Vec::new();
    p.for_each_run(|d, s| runs.push((d, s)));
    assert_eq!(runs, vec![(0, 0), (16, 0), (32, 0), (48, 0)]);
    let c = Plan::fill(&Layout::contiguous(&[4, 6], 2).unwrap()).unwrap();
    assert_eq!((c.kind(), c.run()), (PlanKind::Contiguous, 48));
    let b = Layout::with_byte_strides(&[4], &[0], 2).unwrap();
    assert!(matches!(
        Plan::fill(&b),
        Err(PlanError::DstSelfOverlap { .. })
    ));
}

#[test]
fn errors_name_the_numbers() {
    let a = Layout::contiguous(&[4, 6], 4).unwrap();
    let e = Plan::new(&a, &Layout::contiguous(&[6, 4], 4).unwrap()).unwrap_err();
    assert_eq!(
        e,
        PlanError::ShapeMismatch {
            dst: vec![4, 6],
            src: vec![6, 4]
        }
    );
    assert!(
        e.to_string().contains("[4, 6]") && e.to_string().contains("[6, 4]"),
        "{e}"
    );
    let e = Plan::new(&a, &Layout::contiguous(&[4, 6], 2).unwrap()).unwrap_err();
    assert_eq!(e, PlanError::ElemSizeMismatch { dst: 4, src: 2 });
    assert!(e.to_string().contains("destination 4") && e.to_string().contains("source 2"));
    let bad = Layout::with_byte_strides(&[4, 6], &[4, 4], 4).unwrap();
    let e = Plan::new(&bad, &a).unwrap_err();
    assert_eq!(
        e,
        PlanError::DstSelfOverlap {
            dims: vec![4, 6],
            strides: vec![4, 4]
        }
    );
    assert!(e.to_string().contains("[4, 4]"));
}

#[test]
fn huge_strides_do_not_overflow_the_merge() {
    // Regression: merging computed stride x extent unchecked and panicked on overflow.
    let src = Layout::with_byte_strides(&[2, 2], &[0, usize::MAX / 2 + 1], 1).unwrap();
    let dst = Layout::contiguous(&[2, 2], 1).unwrap();
    let p = Plan::new(&dst, &src).unwrap();
    assert_eq!(p.run_count(), 4);
    let mut runs = Vec::new();
    p.for_each_run(|d, s| runs.push((d, s)));
    runs.sort_unstable();
    assert_eq!(
        runs,
        vec![
            (0, 0),
            (1, usize::MAX / 2 + 1),
            (2, 0),
            (3, usize::MAX / 2 + 1)
        ]
    );
}

#[test]
fn split_covers_the_same_runs() {
    let src = Layout::pitched(&[37, 11], 4, 64).unwrap();
    let dst = Layout::contiguous(&[37, 11], 4).unwrap();
    let p = Plan::new(&dst, &src).unwrap();
    for parts in [1, 2, 3, 5, 37, 100] {
        let pieces = p.split(parts, 1, 4);
        assert!(pieces.len() <= parts.max(1));
        let mut all: Vec<(usize, usize)> = pieces.iter().flat_map(pairs).collect();
        all.sort_unstable();
        assert_eq!(all, pairs(&p), "parts {parts}");
    }
    // A contiguous plan splits its run at the alignment.
    let c = Plan::contiguous(3, 5, 1000);
    let pieces = c.split(3, 1, 64);
    assert_eq!(
        pieces.iter().map(Plan::run).collect::<Vec<_>>(),
        vec![384, 384, 232]
    );
    let mut all: Vec<(usize, usize)> = pieces.iter().flat_map(pairs).collect();
    all.sort_unstable();
    assert_eq!(all, pairs(&c));
    // min_bytes limits the parts.
    assert_eq!(c.split(8, 400, 1).len(), 2);
    assert_eq!(c.split(8, 2000, 1).len(), 1);
}

#[test]
fn tiled_walk_visits_the_same_runs_as_the_plain_walk() {
    // A 3-D transpose-like copy: dst row-major, src with its dims reversed.
    let src = Layout::contiguous(&[5, 37, 70], 4)
        .unwrap()
        .permute(&[2, 1, 0])
        .unwrap();
    let dst = Layout::contiguous(&[70, 37, 5], 4).unwrap();
    let plan = Plan::new(&dst, &src).unwrap();
    assert!(plan.is_transposing(), "{plan:?} {src:?}");
    let mut plain = Vec::new();
    plan.for_each_run(|d, s| plain.push((d, s)));
    for tile in [2, 3, 32, 100] {
        let mut tiled = Vec::new();
        plan.for_each_run_tiled(tile, |d, s| tiled.push((d, s)));
        // Tiles smaller than the inner dim (5) reorder the walk; larger ones keep it.
        assert_eq!(tiled != plain, tile < 5, "tile {tile}");
        tiled.sort_unstable();
        let mut sorted = plain.clone();
        sorted.sort_unstable();
        assert!(tiled == sorted, "tile {tile} visits other runs");
    }
    // A plan that does not transpose is walked in plain order.
    let c = Plan::new(&dst, &dst).unwrap();
    assert!(!c.is_transposing());
}

#[test]
fn contiguous_fast_path_matches_the_general_one() {
    let layouts = [
        Layout::bytes(1).unwrap(),
        Layout::bytes(65536).unwrap(),
        Layout::contiguous(&[4, 8], 4).unwrap(),
        Layout::contiguous(&[1, 3, 1, 5], 2).unwrap(),
        Layout::contiguous(&[2, 3, 4], 8).unwrap(),
        Layout::contiguous(&[1], 16).unwrap(),
    ];
    for l in layouts {
        for (doff, soff) in [(0, 0), (64, 0), (0, 12), (7, 9)] {
            let dst = Layout::with_byte_strides(l.dims(), l.strides(), l.elem_size())
                .unwrap()
                .with_offset(doff)
                .unwrap();
            let src = Layout::with_byte_strides(l.dims(), l.strides(), l.elem_size())
                .unwrap()
                .with_offset(soff)
                .unwrap();
            let fast = Plan::new(&dst, &src).unwrap();
            assert_eq!(
                fast,
                Plan::general(&dst, &src).unwrap(),
                "{l:?} {doff} {soff}"
            );
            assert_eq!(fast.kind(), PlanKind::Contiguous);
            assert_eq!(fast.total_bytes(), l.size_bytes());
        }
    }
    // Not both contiguous, or other dims: the general path (same errors as before).
    let a = Layout::contiguous(&[4, 8], 4).unwrap();
    let b = Layout::contiguous(&[8, 4], 4).unwrap();
    assert!(matches!(
        Plan::new(&a, &b),
        Err(PlanError::ShapeMismatch { .. })
    ));
    let strided = Layout::with_byte_strides(&[4, 8], &[64, 4], 4).unwrap();
    assert_eq!(Plan::new(&strided, &a).unwrap().kind(), PlanKind::Pitched2D);
}

#[test]
fn single_run_of_one_dim() {
    // Every one-dim pair (lengths, element sizes, byte strides, offsets): the one-dim shortcut
    // of `single_run` says what the general test over the dims says.
    let general = |d: &Layout, s: &Layout| {
        (d.dims() == s.dims() && d.is_contiguous() && s.is_contiguous())
            .then(|| (d.offset(), s.offset(), d.size_bytes()))
    };
    for (dn, sn) in [(1, 1), (5, 5), (5, 4), (1, 2)] {
        for e in [1, 2, 8] {
            for (dstride, sstride) in [(e, e), (2 * e, e), (e, 3 * e), (2 * e, 2 * e)] {
                let d = Layout::with_byte_strides(&[dn], &[dstride], e)
                    .unwrap()
                    .with_offset(3 * e)
                    .unwrap();
                let s = Layout::with_byte_strides(&[sn], &[sstride], e).unwrap();
                assert_eq!(
                    Plan::single_run(&d, &s).unwrap(),
                    general(&d, &s),
                    "{dn}/{sn} x{e}, strides {dstride}/{sstride}"
                );
            }
        }
    }
    let (a, b) = (
        Layout::bytes(8).unwrap(),
        Layout::contiguous(&[2], 4).unwrap(),
    );
    assert!(matches!(
        Plan::single_run(&a, &b),
        Err(PlanError::ElemSizeMismatch { dst: 1, src: 4 })
    ));
}

/// `Plan::general`'s plain-transpose path gives the plan the sorting path gives, for every
/// pair it takes; the pairs it leaves (a dense or mergeable source, a padded or strided
/// destination, extents of 1, another element size) go the sorting way.
#[test]
fn transpose_2d_is_the_sorted_plan() {
    let mut taken = 0;
    for e in [1usize, 2, 4, 8, 16] {
        for (a, b) in [(2, 2), (2, 7), (5, 3), (16, 32), (1, 8), (8, 1)] {
            // Destinations: dense, padded rows, and a transposed view.
            let dsts = [
                Layout::contiguous(&[a, b], e).unwrap(),
                Layout::with_byte_strides(&[a, b], &[(b + 3) * e, e], e).unwrap(),
                Layout::contiguous(&[b, a], e)
                    .unwrap()
                    .transpose(0, 1)
                    .unwrap(),
            ];
            // Sources: transposed, transposed with padding, dense, pitched rows, broadcast
            // rows and columns, and one mergeable though not dense (rows of 2 elements apart).
            let srcs = [
                Layout::contiguous(&[b, a], e)
                    .unwrap()
                    .transpose(0, 1)
                    .unwrap(),
                Layout::with_byte_strides(&[a, b], &[e, (a + 5) * e], e).unwrap(),
                Layout::contiguous(&[a, b], e).unwrap(),
                Layout::with_byte_strides(&[a, b], &[(b + 1) * e, e], e).unwrap(),
                Layout::with_byte_strides(&[a, b], &[0, e], e).unwrap(),
                Layout::with_byte_strides(&[a, b], &[e, 0], e).unwrap(),
                Layout::with_byte_strides(&[a, b], &[2 * b * e, 2 * e], e).unwrap(),
            ];
            for dst in &dsts {
                for src in &srcs {
                    for (doff, soff) in [(0, 0), (3 * e, 5 * e)] {
                        let d = dst.with_offset(doff).unwrap();
                        let s = src.with_offset(soff).unwrap();
                        let sorted = Plan::sorted(&d, &s);
                        if let Some(fast) = Plan::transpose_2d(&d, &s) {
                            taken += 1;
                            assert_eq!(Ok(fast), sorted, "{d:?} <- {s:?}");
                            assert!(fast.is_transposing() || s.strides()[1] == 0, "{fast:?}");
                        }
                        assert_eq!(Plan::general(&d, &s), sorted, "{d:?} <- {s:?}");
                    }
                }
            }
        }
        // Another element size on each side: not taken, the same error.
        let d = Layout::contiguous(&[4, 4], e).unwrap();
        let s = Layout::contiguous(&[4, 4], 2 * e)
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        assert_eq!(Plan::transpose_2d(&d, &s), None);
    }
    assert!(taken > 100, "the fast path was taken {taken} times");
}
