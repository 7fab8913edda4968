//! Property tests of the core: random layout pairs copied by every engine configuration and
//! compared byte for byte with a naive element-wise reference; planner properties; fills.
//!
//! Cases per property: 1500 by default (a few seconds in debug); set `PROPTEST_CASES` for
//! larger runs, e.g. `PROPTEST_CASES=100000 cargo test -p ferry --test core_props`.

use ferry::{CpuConfig, CpuEngine, Engine, EngineExt, Layout, MultiplexEngine, Plan, PlanKind};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500)
}

/// How one side of a copy is laid out around a logical shape.
#[derive(Debug, Clone)]
struct Side {
    /// Memory order of the logical axes, outermost first.
    order: Vec<usize>,
    /// Per logical axis: slice start, step, extra elements after the slice.
    start: Vec<usize>,
    step: Vec<usize>,
    extra: Vec<usize>,
    /// Per logical axis: padding bytes after each extent in memory order.
    pad: Vec<usize>,
    /// Gap bytes between elements of the innermost axis.
    gap: usize,
    /// Per logical axis: broadcast (stride 0; sources only).
    bcast: Vec<bool>,
    offset: usize,
    tail: usize,
}

fn side(ndim: usize, allow_bcast: bool) -> impl Strategy<Value = Side> {
    (
        Just((0..ndim).collect::<Vec<_>>()).prop_shuffle(),
        prop::collection::vec(0..3usize, ndim),
        prop::collection::vec(prop_oneof![4 => Just(1usize), 1 => 2..4usize], ndim),
        prop::collection::vec(prop_oneof![3 => Just(0usize), 1 => 1..3usize], ndim),
        prop::collection::vec(prop_oneof![3 => Just(0usize), 1 => 1..9usize], ndim),
        prop_oneof![4 => Just(0usize), 1 => 1..5usize],
        prop::collection::vec(
            if allow_bcast {
                prop::bool::weighted(0.1).boxed()
            } else {
                Just(false).boxed()
            },
            ndim,
        ),
        0..40usize,
        0..17usize,
    )
        .prop_map(
            |(order, start, step, extra, pad, gap, bcast, offset, tail)| Side {
                order,
                start,
                step,
                extra,
                pad,
                gap,
                bcast,
                offset,
                tail,
            },
        )
}

/// Builds the layout with the public API: a padded layout in memory order, permuted back to
/// logical order, then sliced with steps.
fn build(dims: &[usize], elem: usize, s: &Side) -> (Layout, usize) {
    let n = dims.len();
    let under: Vec<usize> = (0..n)
        .map(|i| s.start[i] + (dims[i] - 1) * s.step[i] + 1 + s.extra[i])
        .collect();
    // Strides in memory order, innermost last.
    let mut strides_mem = vec![0; n];
    let mut stride = elem + s.gap;
    for k in (0..n).rev() {
        let axis = s.order[k];
        if s.bcast[axis] {
            strides_mem[k] = 0;
            continue;
        }
        strides_mem[k] = stride;
        stride = stride * under[axis] + s.pad[axis];
    }
    let dims_mem: Vec<usize> = s.order.iter().map(|&a| under[a]).collect();
    let base = Layout::with_byte_strides(&dims_mem, &strides_mem, elem)
        .unwrap()
        .with_offset(s.offset)
        .unwrap();
    // permute: result axis i is memory axis inv[i], where order[inv[i]] = i.
    let mut inv = vec![0; n];
    for (k, &a) in s.order.iter().enumerate() {
        inv[a] = k;
    }
    let mut l = base.permute(&inv).unwrap();
    for (i, &d) in dims.iter().enumerate() {
        l = l
            .slice(
                i,
                s.start[i]..s.start[i] + (d - 1) * s.step[i] + 1,
                s.step[i],
            )
            .unwrap();
    }
    assert_eq!(l.dims(), dims);
    let len = l.span().end + s.tail;
    (l, len)
}

fn shape() -> impl Strategy<Value = (Vec<usize>, usize)> {
    let dim = prop_oneof![4 => Just(1usize), 3 => Just(2usize), 2 => Just(3usize), 1 => 4..8usize];
    (prop::collection::vec(dim, 1..=10), 1..=16usize).prop_map(|(mut dims, elem)| {
        // Keep cases small: at most 512 elements.
        while dims.iter().product::<usize>() > 512 {
            let i = (0..dims.len()).max_by_key(|&i| dims[i]).unwrap();
            dims[i] = dims[i].div_ceil(2);
        }
        (dims, elem)
    })
}

#[derive(Debug, Clone)]
struct Case {
    dims: Vec<usize>,
    elem: usize,
    dst: Side,
    src: Side,
    /// Dims of extent 1 inserted into the destination shape (the planner ignores them).
    reshape_dst: bool,
}

fn case() -> impl Strategy<Value = Case> {
    shape().prop_flat_map(|(dims, elem)| {
        let n = dims.len();
        (
            Just(dims),
            Just(elem),
            side(n, false),
            side(n, true),
            any::<bool>(),
        )
            .prop_map(|(dims, elem, dst, src, reshape_dst)| Case {
                dims,
                elem,
                dst,
                src,
                reshape_dst,
            })
    })
}

fn poison(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(7) as u8) ^ 0xA5).collect()
}

fn source(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31).wrapping_add(17) % 251) as u8)
        .collect()
}

/// Byte-exact element-wise reference copy.
fn reference_copy(dst: &mut [u8], dl: &Layout, src: &[u8], sl: &Layout) {
    let e = dl.elem_size();
    for (d, s) in dl.element_offsets().zip(sl.element_offsets()) {
        dst[d..d + e].copy_from_slice(&src[s..s + e]);
    }
}

fn engines() -> Vec<(String, Box<dyn Engine>)> {
    let cpu = |threads: usize, chunk: usize, inline: usize| {
        CpuEngine::with_config(
            CpuConfig {
                threads,
                ..CpuConfig::caller_runs()
            }
            .chunk_bytes(chunk)
            .inline_bytes(inline),
        )
        .unwrap()
    };
    let mut v: Vec<(String, Box<dyn Engine>)> = Vec::new();
    for threads in [0, 1, 2, 4] {
        v.push((
            format!("cpu{threads} chunk64 no-inline"),
            Box::new(cpu(threads, 64, 0)),
        ));
    }
    for threads in [1, 2, 4] {
        // Every queued copy split over the submitting thread (its share run at submit) and
        // the workers.
        let e = CpuEngine::with_config(cpu(threads, 64, 0).config().split_bytes(0)).unwrap();
        v.push((
            format!("cpu{threads} chunk64 split0 no-inline"),
            Box::new(e),
        ));
    }
    v.push(("cpu2 chunk32 inline".into(), Box::new(cpu(2, 32, 64 << 10))));
    // Transposes write past the caches at every size (non-temporal stores where aligned).
    let e = CpuEngine::with_config(cpu(2, 4096, 0).config().stream_bytes(0)).unwrap();
    v.push(("cpu2 chunk4096 stream0 no-inline".into(), Box::new(e)));
    v.push(("cpu0 inline".into(), Box::new(cpu(0, 64, 64 << 10))));
    let mux = MultiplexEngine::new()
        .with(cpu(1, 64, 0), 1.0)
        .with(cpu(2, 64, 0), 3.0)
        .with(cpu(0, 64, 0), 0.5)
        .split_bytes(128);
    v.push((
        "mux[cpu1 x1, cpu2 x3, cpu0 x0.5] split128".into(),
        Box::new(mux),
    ));
    v
}

fn run(
    config: Config,
    strategy: impl Strategy<Value = Case>,
    f: impl Fn(Case) -> Result<(), TestCaseError>,
) {
    let mut runner = TestRunner::new(config);
    if let Err(e) = runner.run(&strategy, f) {
        panic!("{e}");
    }
}

fn layouts(c: &Case) -> ((Layout, usize), (Layout, usize)) {
    let (mut dl, dlen) = build(&c.dims, c.elem, &c.dst);
    if c.reshape_dst {
        // Same elements, more dims of extent 1: exercises reshape and the planner's dropping.
        let mut d = vec![1];
        d.extend_from_slice(&c.dims);
        d.push(1);
        if d.len() <= ferry::MAX_DIMS {
            dl = dl.reshape(&d).unwrap();
        }
    }
    ((dl, dlen), build(&c.dims, c.elem, &c.src))
}

#[test]
fn copies_match_reference_on_every_engine() {
    let engines = engines();
    run(
        Config {
            cases: cases(),
            ..Config::default()
        },
        case(),
        |c| {
            let ((dl, dlen), (sl, slen)) = layouts(&c);
            let src = source(slen);
            let mut want = poison(dlen);
            reference_copy(&mut want, &dl, &src, &sl);
            for (name, engine) in &engines {
                let mut dst = poison(dlen);
                engine
                    .scope(|s| {
                        Ok::<_, ferry::BarrierError>(s.copy(&mut dst, &dl, &src, &sl).map(|_| ()))
                    })
                    .map_err(|e| TestCaseError::fail(format!("{name}: barrier {e}")))?
                    .map_err(|e| TestCaseError::fail(format!("{name}: submit {e}")))?;
                if dst != want {
                    let first = dst.iter().zip(&want).position(|(a, b)| a != b).unwrap();
                    return Err(TestCaseError::fail(format!(
                        "{name}: first wrong byte {first} of {dlen}; dst {dl:?} src {sl:?}"
                    )));
                }
            }
            Ok(())
        },
    );
}

#[test]
fn plans_cover_the_element_walk_and_are_minimal() {
    run(
        Config {
            cases: cases() * 2,
            ..Config::default()
        },
        case(),
        |c| {
            let ((dl, dlen), (sl, slen)) = layouts(&c);
            let p = Plan::new(&dl, &sl).map_err(|e| TestCaseError::fail(e.to_string()))?;
            // Same (dst byte, src byte) pairs as the element walk.
            let mut got = Vec::new();
            p.for_each_run(|d, s| got.extend((0..p.run()).map(|b| (d + b, s + b))));
            let e = c.elem;
            let mut want: Vec<(usize, usize)> = dl
                .element_offsets()
                .zip(sl.element_offsets())
                .flat_map(|(d, s)| (0..e).map(move |b| (d + b, s + b)))
                .collect();
            got.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(&got, &want);
            // In bounds, whole elements.
            prop_assert!(p.dst_end() <= dlen && p.src_end() <= slen);
            prop_assert!(p.dst_offset() >= dl.span().start && p.src_offset() >= sl.span().start);
            prop_assert_eq!(p.run() % e, 0);
            prop_assert_eq!(p.total_bytes(), dl.size_bytes());
            // Locally minimal: no two neighbouring levels (or the innermost level and the run) merge.
            let (n, counts, ds, ss) = (
                p.counts().len(),
                p.counts(),
                p.dst_strides(),
                p.src_strides(),
            );
            if n > 0 {
                prop_assert!(
                    !(ds[n - 1] == p.run() && ss[n - 1] == p.run()),
                    "run not widened: {:?}",
                    p
                );
            }
            for i in 0..n.saturating_sub(1) {
                let merge = Some(ds[i]) == ds[i + 1].checked_mul(counts[i + 1])
                    && Some(ss[i]) == ss[i + 1].checked_mul(counts[i + 1]);
                prop_assert!(!merge, "levels {} and {} merge: {:?}", i, i + 1, p);
            }
            prop_assert!(counts.iter().all(|&c| c > 1), "{:?}", p);
            // Simple cases.
            if dl.is_contiguous() && sl.is_contiguous() {
                prop_assert_eq!(p.kind(), PlanKind::Contiguous);
            }
            // Split pieces cover the same pairs.
            let mut parts: Vec<(usize, usize)> = Vec::new();
            for piece in p.split(5, 1, 64) {
                piece.for_each_run(|d, s| parts.extend((0..piece.run()).map(|b| (d + b, s + b))));
            }
            parts.sort_unstable();
            prop_assert_eq!(&parts, &want);
            Ok(())
        },
    );
}

#[test]
fn fills_match_reference_on_every_engine() {
    let engines = engines();
    let strat = (
        case(),
        prop::collection::vec(any::<u8>(), 16),
        any::<bool>(),
    );
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        ..Config::default()
    });
    let r = runner.run(&strat, |(c, pat, uniform)| {
        let (dl, dlen) = build(&c.dims, c.elem, &c.dst);
        let pattern: Vec<u8> = if uniform {
            vec![pat[0]; c.elem]
        } else {
            pat[..c.elem].to_vec()
        };
        let mut want = poison(dlen);
        for d in dl.element_offsets() {
            want[d..d + c.elem].copy_from_slice(&pattern);
        }
        for (name, engine) in &engines {
            let mut dst = poison(dlen);
            engine
                .scope(|s| {
                    Ok::<_, ferry::BarrierError>(s.fill(&mut dst, &dl, &pattern).map(|_| ()))
                })
                .map_err(|e| TestCaseError::fail(format!("{name}: barrier {e}")))?
                .map_err(|e| TestCaseError::fail(format!("{name}: submit {e}")))?;
            prop_assert!(dst == want, "{}: fill of {:?} with {:?}", name, dl, pattern);
        }
        Ok(())
    });
    if let Err(e) = r {
        panic!("{e}");
    }
}

#[test]
fn large_copies_split_across_workers_and_engines() {
    // Bigger than the property cases: 2-D pitched and contiguous copies of a few hundred KiB,
    // so that default-sized chunks split too.
    let engines = engines();
    for (rows, cols, elem, pitch) in [
        (300, 257, 3, 800),
        (64, 4096, 4, 16384),
        (1, 300_000, 1, 300_000),
    ] {
        let sl = Layout::pitched(&[rows, cols], elem, pitch).unwrap();
        let dl = Layout::contiguous(&[rows, cols], elem)
            .unwrap()
            .with_offset(5)
            .unwrap();
        let src = source(sl.span().end);
        let mut want = poison(dl.span().end + 7);
        reference_copy(&mut want, &dl, &src, &sl);
        for (name, engine) in &engines {
            let mut dst = poison(dl.span().end + 7);
            engine
                .scope(|s| {
                    Ok::<_, ferry::BarrierError>(s.copy(&mut dst, &dl, &src, &sl).map(|_| ()))
                })
                .unwrap()
                .unwrap();
            assert!(dst == want, "{name}: {rows}x{cols}x{elem}");
        }
    }
}

#[test]
fn reshape_keeps_the_elements_or_says_why() {
    let strat = (case(), prop::collection::vec((0..3u8, any::<bool>()), 10));
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        ..Config::default()
    });
    let r = runner.run(&strat, |(c, choices)| {
        let (l, _) = build(&c.dims, c.elem, &c.dst);
        // A new shape: each dim kept, split in two at its smallest factor, or merged with the
        // next; extents of 1 inserted here and there.
        let mut new = Vec::new();
        let mut i = 0;
        while i < c.dims.len() {
            let d = c.dims[i];
            let (how, one) = choices[i];
            match how {
                1 if d > 1 => match (2..d).find(|f| d % f == 0) {
                    Some(f) => new.extend([f, d / f]),
                    None => new.push(d),
                },
                2 if i + 1 < c.dims.len() => {
                    new.push(d * c.dims[i + 1]);
                    i += 1;
                }
                _ => new.push(d),
            }
            if one {
                new.push(1);
            }
            i += 1;
        }
        if new.len() > ferry::MAX_DIMS {
            return Ok(());
        }
        match l.reshape(&new) {
            Ok(r) => {
                prop_assert_eq!(r.dims(), &new[..]);
                prop_assert!(
                    r.element_offsets().eq(l.element_offsets()),
                    "{:?} -> {:?}",
                    l,
                    r
                );
                prop_assert_eq!(r.span().start, l.span().start);
            }
            Err(ferry::LayoutError::ReshapeNeedsCopy { .. }) => {
                prop_assert!(
                    !l.is_contiguous(),
                    "a contiguous layout must reshape: {:?} -> {:?}",
                    l,
                    new
                );
            }
            Err(e) => return Err(TestCaseError::fail(format!("{l:?} -> {new:?}: {e}"))),
        }
        Ok(())
    });
    if let Err(e) = r {
        panic!("{e}");
    }
}

/// Transposes (2-D and batched 3-D, square and not, sizes that leave partial tiles and partial
/// SIMD blocks, and sizes that take the staged tiles: whole ones, with partial ones beside,
/// rows aligned to 16 bytes and not, the destination at an aligned address and not) of every
/// element size the CPU engine's blocked kernels take, and of one they do not (3 bytes), match
/// the reference on every engine.
#[test]
fn transposes_of_every_element_size_match_reference() {
    let engines = engines();
    for elem in [1usize, 2, 3, 4, 8, 16] {
        for dims in [
            vec![37usize, 45],
            vec![64, 33],
            vec![3, 9, 70],
            vec![5, 1],
            vec![256, 64],
            vec![64, 256],
            vec![261, 300],
            vec![2, 130, 257],
        ] {
            let nd = dims.len();
            let src_l = Layout::contiguous(&dims, elem).unwrap();
            // The destination holds the source's last two axes swapped, contiguously; the copy
            // reads the source through the swapped view.
            let src_view = src_l.transpose(nd - 2, nd - 1).unwrap();
            let mut tdims = dims.clone();
            tdims.swap(nd - 2, nd - 1);
            let dst_l = Layout::contiguous(&tdims, elem).unwrap();
            let len = dims.iter().product::<usize>() * elem;
            let src = source(len);
            let mut want = poison(len);
            reference_copy(&mut want, &dst_l, &src, &src_view);
            for (name, e) in &engines {
                // The destination at the allocation's start, and 8 bytes into it.
                for at in [0, 8] {
                    let mut dst = poison(len + at);
                    e.scope(|s| -> ferry::Result<()> {
                        Ok(s.copy(&mut dst[at..], &dst_l, &src[..], &src_view)?
                            .wait()?)
                    })
                    .unwrap();
                    assert!(
                        dst[at..] == want,
                        "{name}: elem {elem} dims {dims:?} at {at}"
                    );
                }
            }
        }
    }
}
