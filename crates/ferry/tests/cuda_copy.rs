//! Every direction and memory kind, contiguous and strided (2-D, 3-D, segments), and fills,
//! each byte checked against the CPU engine. Prints `skipped: no CUDA driver` without a GPU.

mod cuda_common;
use cuda_common::*;
use ferry::{EngineExt, Layout, Plan, PlanKind};

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn contiguous_every_kind_pair() {
    let Some(e) = cuda_or_skip() else { return };
    let mut seed = 1;
    for &dk in &KINDS {
        for &sk in &KINDS {
            if is_pageable(dk) && is_pageable(sk) {
                continue;
            }
            for n in [1usize, 4096, 1_000_003, 8 << 20] {
                let l = Layout::bytes(n).unwrap();
                check_copy(&e, dk, sk, &l, n, &l, n, seed);
                seed += 1;
            }
        }
    }
}

/// Strided layouts of each plan kind; returns (dst layout, dst len, src layout, src len).
fn strided_cases() -> Vec<(&'static str, Layout, usize, Layout, usize)> {
    let mut v = Vec::new();
    // 2-D tile out of a 512 x 768 f32 matrix.
    let big = Layout::contiguous(&[512, 768], 4).unwrap();
    let tile = big
        .slice(0, 100..300, 1)
        .unwrap()
        .slice(1, 17..529, 1)
        .unwrap();
    let dense = Layout::contiguous(&[200, 512], 4).unwrap();
    v.push(("tile", dense, dense.size_bytes(), tile, big.size_bytes()));
    // The other way: dense into a tile of a pitched destination.
    v.push(("untile", tile, big.size_bytes(), dense, dense.size_bytes()));
    // Every other row, odd element size.
    let rows = Layout::contiguous(&[300, 37], 3).unwrap();
    let every_other = rows.slice(0, 1..300, 2).unwrap();
    let packed = Layout::contiguous(&[150, 37], 3).unwrap();
    v.push((
        "every other row",
        packed,
        packed.size_bytes(),
        every_other,
        rows.size_bytes(),
    ));
    // Transpose of a 64 x 96 f64 matrix (8-byte runs).
    let m = Layout::contiguous(&[64, 96], 8).unwrap();
    let t = Layout::contiguous(&[96, 64], 8).unwrap();
    v.push((
        "transpose",
        t,
        t.size_bytes(),
        m.transpose(0, 1).unwrap(),
        m.size_bytes(),
    ));
    // 3-D box out of an 8 x 64 x 256 u16 volume: planes whole multiples of the row pitch.
    let vol = Layout::contiguous(&[8, 64, 256], 2).unwrap();
    let bx = vol
        .slice(0, 1..7, 1)
        .unwrap()
        .slice(1, 3..60, 1)
        .unwrap()
        .slice(2, 10..200, 1)
        .unwrap();
    let dbox = Layout::contiguous(&[6, 57, 190], 2).unwrap();
    v.push(("3-D box", dbox, dbox.size_bytes(), bx, vol.size_bytes()));
    // 3-D whose plane stride is not a multiple of the row pitch (loop of 2-D copies).
    let odd = Layout::with_byte_strides(&[5, 40, 100], &[40 * 128 + 24, 128, 1], 1).unwrap();
    let dodd = Layout::contiguous(&[5, 40, 100], 1).unwrap();
    v.push((
        "3-D odd planes",
        dodd,
        dodd.size_bytes(),
        odd,
        odd.span().end,
    ));
    // 4-D segments.
    let hyper = Layout::contiguous(&[4, 5, 6, 64], 4).unwrap();
    let part = hyper
        .slice(0, 1..4, 1)
        .unwrap()
        .slice(1, 0..5, 2)
        .unwrap()
        .slice(2, 1..6, 1)
        .unwrap()
        .slice(3, 8..40, 1)
        .unwrap();
    let dpart = Layout::contiguous(&[3, 3, 5, 32], 4).unwrap();
    v.push((
        "4-D segments",
        dpart,
        dpart.size_bytes(),
        part,
        hyper.size_bytes(),
    ));
    // Permuted 3-D (transposes inside planes) into a destination with an offset.
    let cube = Layout::contiguous(&[6, 20, 30], 4).unwrap();
    let perm = cube.permute(&[2, 0, 1]).unwrap();
    let dperm = Layout::contiguous(&[30, 6, 20], 4)
        .unwrap()
        .with_offset(64)
        .unwrap();
    v.push((
        "permute with offset",
        dperm,
        dperm.span().end + 16,
        perm,
        cube.size_bytes(),
    ));
    v
}

#[test]
fn plan_kinds_of_the_strided_cases() {
    // Runs without a GPU too: the cases cover every plan kind.
    let kinds: Vec<PlanKind> = strided_cases()
        .iter()
        .map(|(_, d, _, s, _)| Plan::new(d, s).unwrap().kind())
        .collect();
    for k in [PlanKind::Pitched2D, PlanKind::Pitched3D, PlanKind::Segments] {
        assert!(kinds.contains(&k), "no case plans to {k:?}: {kinds:?}");
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn strided_every_kind_pair() {
    let Some(e) = cuda_or_skip() else { return };
    let mut seed = 100;
    for (name, dl, dlen, sl, slen) in strided_cases() {
        for &dk in &KINDS {
            for &sk in &KINDS {
                if is_pageable(dk) && is_pageable(sk) {
                    continue;
                }
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    check_copy(&e, dk, sk, &dl, dlen, &sl, slen, seed)
                }));
                if r.is_err() {
                    panic!("case {name}: {dk:?} <- {sk:?} failed");
                }
                seed += 1;
            }
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn fills_every_pattern_width() {
    let Some(e) = cuda_or_skip() else { return };
    let big = Layout::contiguous(&[96, 160], 8).unwrap();
    let cases: Vec<(Layout, usize, Vec<u8>)> = vec![
        (Layout::bytes(1 << 20).unwrap(), 1 << 20, vec![0xAB]),
        (Layout::contiguous(&[1000], 2).unwrap(), 2000, vec![1, 2]),
        (
            Layout::contiguous(&[1000], 4).unwrap(),
            4000,
            vec![1, 2, 3, 4],
        ),
        (
            Layout::contiguous(&[1000], 8).unwrap(),
            8000,
            vec![5, 5, 5, 5, 5, 5, 5, 5],
        ),
        (
            Layout::contiguous(&[1000], 8).unwrap(),
            8000,
            vec![1, 2, 3, 4, 5, 6, 7, 8],
        ),
        (Layout::contiguous(&[999], 3).unwrap(), 2997, vec![9, 8, 7]),
        // Strided fills: a tile of f64, and every other column of bytes.
        (
            big.slice(0, 10..90, 1)
                .unwrap()
                .slice(1, 3..150, 1)
                .unwrap(),
            big.size_bytes(),
            vec![1, 2, 3, 4, 5, 6, 7, 8],
        ),
        (
            big.slice(0, 10..90, 1)
                .unwrap()
                .slice(1, 3..150, 1)
                .unwrap(),
            big.size_bytes(),
            vec![0, 0, 128, 63, 0, 0, 128, 63],
        ),
        (
            Layout::contiguous(&[64, 64], 1)
                .unwrap()
                .slice(1, 0..64, 2)
                .unwrap(),
            4096,
            vec![0x5A],
        ),
        (
            Layout::contiguous(&[4, 6, 8, 16], 4)
                .unwrap()
                .slice(3, 2..14, 1)
                .unwrap(),
            4 * 6 * 8 * 64,
            vec![1, 0, 0, 0],
        ),
    ];
    let mut seed = 500;
    for (l, len, pat) in cases {
        for k in [
            Kind::Device,
            Kind::Pinned,
            Kind::Mapped,
            Kind::Managed,
            Kind::Registered,
        ] {
            let init = bytes(len, seed);
            seed += 1;
            let want = reference_fill(&init, &l, &pat);
            let mut b = Buf::new(k, &init);
            e.scope(|s| s.fill(&mut b, &l, &pat)?.wait().map_err(ferry::Error::from))
                .unwrap();
            assert!(
                b.to_vec() == want,
                "fill {pat:?} over {l:?} in {k:?} differs from the CPU reference"
            );
        }
    }
}

/// A custom operator copying a list of `(dst_offset, src_offset, len)` segments.
struct Segments(Vec<(usize, usize, usize)>);

impl ferry::Operator for Segments {
    fn name(&self) -> &str {
        "segments"
    }
    fn lower(&self, prog: &mut ferry::Program) -> Result<(), ferry::OpError> {
        for &(d, s, n) in &self.0 {
            prog.copy(
                &Layout::bytes(n)?.with_offset(d)?,
                &Layout::bytes(n)?.with_offset(s)?,
            )?;
        }
        Ok(())
    }
}

/// Long segment lists go through the engine's gatherer (kernel, batch or per segment) where
/// both sides are device-accessible, and one copy per segment otherwise: every byte checked,
/// bytes between the segments untouched.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn segment_lists_every_kind_pair() {
    let Some(e) = cuda_or_skip() else { return };
    let mut seed = 7u64;
    for &dk in &KINDS {
        for &sk in &KINDS {
            if is_pageable(dk) && is_pageable(sk) {
                continue;
            }
            // 700 segments of 1..3000 bytes at scattered, non-overlapping destination slots.
            let count = 700;
            let slot = 4096;
            let lens: Vec<usize> = bytes(count * 2, seed)
                .chunks(2)
                .map(|c| 1 + (usize::from(c[0]) << 4 | usize::from(c[1])) % 3000)
                .collect();
            let segs: Vec<(usize, usize, usize)> = (0..count)
                .map(|i| {
                    (
                        (i * 389) % count * slot + (i % 7),
                        i * slot + (i % 13),
                        lens[i],
                    )
                })
                .collect();
            let len = count * slot + 64;
            let list: Vec<ferry::Segment> = segs
                .iter()
                .map(|&(d, s, n)| ferry::Segment::new(d as u64, s as u64, n as u64))
                .collect();
            let op = ferry::Op::Custom(std::sync::Arc::new(Segments(segs)));
            check_segments(&e, dk, sk, len, &list, op, seed);
            seed += 1;
        }
    }
}

/// Large pageable copies go through the staged pinned ring; strided ones too.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn staged_pageable_strided() {
    let Some(e) = cuda_or_skip() else { return };
    // 2048 rows of 3000 bytes out of a pageable matrix with 4096-byte rows: 6 MB, staged.
    let src_l = Layout::pitched(&[2048, 3000], 1, 4096).unwrap();
    let dst_l = Layout::contiguous(&[2048, 3000], 1).unwrap();
    check_copy(
        &e,
        Kind::Device,
        Kind::Pageable,
        &dst_l,
        2048 * 3000,
        &src_l,
        2048 * 4096,
        91,
    );
    check_copy(
        &e,
        Kind::Pageable,
        Kind::Device,
        &src_l,
        2048 * 4096,
        &dst_l,
        2048 * 3000,
        92,
    );
    // 40 MiB + 3 bytes, larger than a staging chunk and not a multiple of it.
    let n = (40 << 20) + 3;
    let l = Layout::bytes(n).unwrap();
    check_copy(&e, Kind::Device, Kind::Pageable, &l, n, &l, n, 93);
    check_copy(&e, Kind::Pageable, Kind::Device, &l, n, &l, n, 94);
}

/// Pinned memory seen through a plain slice (`&mut *pinned`) is recognised as pinned through
/// unified addressing: a fill, which the engine refuses for pageable memory, is accepted, and
/// a copy from it is correct.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn pinned_memory_behind_a_slice_is_recognised() {
    let Some(e) = cuda_or_skip() else { return };
    let mut pinned = ferry::cuda::PinnedBuffer::new(1 << 20).unwrap();
    let l = Layout::bytes(1 << 20).unwrap();
    let slice: &mut [u8] = &mut pinned;
    e.scope(|s| {
        s.fill(slice, &l, &[0x5A])?
            .wait()
            .map_err(ferry::Error::from)
    })
    .unwrap();
    assert!(pinned.iter().all(|&b| b == 0x5A));
    // Parts of it: inside, at its end, one byte short at both ends (the driver's range covers
    // them; one query each since run 76).
    let fill = |buf: &mut [u8], v: u8| {
        let l = Layout::bytes(buf.len()).unwrap();
        e.scope(|s| Ok::<_, ferry::BarrierError>(s.fill(buf, &l, &[v]).map(|r| r.wait())))
            .unwrap()
    };
    let n = 1 << 20;
    for (k, (a, b)) in [(4096, n), (1, n - 1), (n - 1, n), (12345, 12346 + 65536)]
        .into_iter()
        .enumerate()
    {
        let v = 0x10 + k as u8;
        assert!(matches!(fill(&mut pinned[a..b], v), Ok(Ok(()))), "{a}..{b}");
        assert!(pinned[a..b].iter().all(|&x| x == v), "{a}..{b}");
    }
    // Memory page-locked by someone else, in the middle of a pageable buffer: the pages
    // registered count as pinned, a range running one byte past them (or starting before
    // them) does not.
    let mut host = vec![0u8; 6 * 4096];
    let base = host.as_ptr() as usize;
    let first = base.next_multiple_of(4096) - base + 4096;
    let (lo, hi) = (first, first + 2 * 4096);
    e.context().bind_to_thread().unwrap();
    // SAFETY: the two pages lie inside `host`, which outlives the registration (undone below).
    let r = unsafe {
        cudarc::driver::sys::cuMemHostRegister_v2(host[lo..].as_mut_ptr().cast(), hi - lo, 0)
    };
    assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    let inside = fill(&mut host[lo..hi], 7);
    let past = fill(&mut host[lo..hi + 1], 8);
    let before = fill(&mut host[lo - 1..hi], 9);
    let middle = fill(&mut host[lo + 100..hi - 100], 6);
    // SAFETY: registered above.
    let r = unsafe { cudarc::driver::sys::cuMemHostUnregister(host[lo..].as_mut_ptr().cast()) };
    assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    assert!(matches!(inside, Ok(Ok(()))), "{inside:?}");
    assert!(matches!(middle, Ok(Ok(()))), "{middle:?}");
    assert!(host[lo..lo + 100].iter().all(|&x| x == 7));
    assert!(host[lo + 100..hi - 100].iter().all(|&x| x == 6));
    for r in [past, before] {
        assert!(
            matches!(r, Err(ferry::SubmitError::Unsupported { .. })),
            "{r:?}"
        );
    }
    // Plain pageable memory is still refused for fills.
    let mut v = vec![0u8; 1 << 20];
    let r = e
        .scope(|s| Ok::<_, ferry::BarrierError>(s.fill(&mut v, &l, &[1]).map(drop)))
        .unwrap();
    assert!(
        matches!(r, Err(ferry::SubmitError::Unsupported { .. })),
        "{r:?}"
    );
}

/// A registered buffer is described by the slice its `Deref`/`DerefMut` give now, with that
/// slice's own length (never the length recorded at registration), and as pinned only where
/// that slice lies within the registered range: `Deref` and `DerefMut` are safe code and may
/// disagree, and a type holding its data inline moves out of the range it registered. The
/// view once took the current address with the registered length, so a copy could run past
/// the slice, at an address reported pinned that was not registered.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn registered_buffer_is_described_by_its_current_slice() {
    use ferry::cuda::{DeviceBuffer, Registered};
    use ferry::{MemKind, Memory, MemoryMut};
    use std::ops::{Deref, DerefMut};
    let Some(e) = cuda_or_skip() else { return };
    const N: usize = 64 << 10;
    let l = Layout::bytes(N).unwrap();
    // `DerefMut` (which registration uses) gives all N bytes, `Deref` only the first 16.
    // (A `PageVec`: registered pages of its own, whatever other tests register meanwhile.)
    struct Shrinks(PageVec);
    impl Deref for Shrinks {
        type Target = [u8];
        fn deref(&self) -> &[u8] {
            &self.0[..16]
        }
    }
    impl DerefMut for Shrinks {
        fn deref_mut(&mut self) -> &mut [u8] {
            &mut self.0[..]
        }
    }
    let r = Registered::new(Shrinks(PageVec::new(&[7u8; N])))
        .map_err(|(e, _)| e)
        .unwrap();
    let raw = r.raw();
    assert_eq!(
        (raw.addr, raw.len, raw.kind),
        (r.as_ptr() as u64, 16, MemKind::Pinned)
    );
    // A copy of all N bytes from it is refused (the slice it lends holds 16).
    let mut d = DeviceBuffer::new(0, N).unwrap();
    let refused = e
        .scope(|s| Ok::<_, ferry::BarrierError>(s.copy(&mut d, &l, &r, &l).map(drop)))
        .unwrap();
    assert!(refused.is_err(), "a copy past the slice was accepted");
    drop(r);

    // Data held inline moves with the value into `Registered`, away from the registered range:
    // described as pageable at its current address, and copies through it are correct.
    struct Inline([u8; N]);
    impl Deref for Inline {
        type Target = [u8];
        fn deref(&self) -> &[u8] {
            &self.0
        }
    }
    impl DerefMut for Inline {
        fn deref_mut(&mut self) -> &mut [u8] {
            &mut self.0
        }
    }
    let mut r = match Registered::new(Inline([9u8; N])) {
        Ok(r) => r,
        Err((err, _)) => {
            println!("skipped the inline case: the driver refused its registration: {err}");
            return;
        }
    };
    let here = r.as_ptr() as u64;
    let registered_here = format!("{r:?}").contains(&format!("{:p}", r.as_ptr()));
    let want = if registered_here {
        MemKind::Pinned
    } else {
        MemKind::Pageable
    };
    assert_eq!(
        (r.raw().addr, r.raw().len, r.raw().kind),
        (here, N, want),
        "{r:?}"
    );
    assert_eq!((r.raw_mut().addr, r.raw_mut().kind), (here, want));
    e.scope(|s| {
        s.copy(&mut d, &l, &r, &l)?
            .wait()
            .map_err(ferry::Error::from)
    })
    .unwrap();
    assert_eq!(d.to_vec().unwrap(), vec![9u8; N]);
    d.copy_from_host(&[3u8; N]).unwrap();
    e.scope(|s| {
        s.copy(&mut r, &l, &d, &l)?
            .wait()
            .map_err(ferry::Error::from)
    })
    .unwrap();
    assert!(r.iter().all(|&b| b == 3));
}

/// The built-in segment list (`Scope::segments`): 20,000 scattered 4 KiB-ish pieces between
/// every pair of kinds, every byte checked, bytes between the segments untouched.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn builtin_segment_lists_every_kind_pair() {
    let Some(e) = cuda_or_skip() else { return };
    let count = 20_000usize;
    let slot = 4096usize;
    let len = count * slot;
    let mut seed = 300u64;
    for &dk in &KINDS {
        for &sk in &KINDS {
            if is_pageable(dk) && is_pageable(sk) {
                continue;
            }
            let segs: Vec<ferry::Segment> = (0..count)
                .map(|i| {
                    let n = 1 + (i * 131) % slot;
                    ferry::Segment::new(
                        ((i * 7919) % count * slot) as u64,
                        (i * slot) as u64,
                        n as u64,
                    )
                })
                .collect();
            let op = ferry::Op::Segments(segs.clone().into());
            check_segments(&e, dk, sk, len, &segs, op, seed);
            seed += 1;
        }
    }
}

/// Runs `op` (a copy of `segs`) between buffers of kinds `dk` <- `sk` of `len` bytes and checks
/// every destination byte: the segments copied, everything between them untouched.
fn check_segments(
    e: &ferry::cuda::CudaEngine,
    dk: Kind,
    sk: Kind,
    len: usize,
    segs: &[ferry::Segment],
    op: ferry::Op,
    seed: u64,
) {
    let src_h = bytes(len, seed);
    let dst_h = bytes(len, seed ^ 0xBEEF);
    let mut want = dst_h.clone();
    for g in segs {
        let (d, s, n) = (g.dst_off as usize, g.src_off as usize, g.len as usize);
        want[d..d + n].copy_from_slice(&src_h[s..s + n]);
    }
    let src = Buf::new(sk, &src_h);
    let mut dst = Buf::new(dk, &dst_h);
    e.scope(|s| {
        s.submit(&mut dst, Some(&src), op, &[])?
            .wait()
            .map_err(ferry::Error::from)
    })
    .unwrap_or_else(|err| panic!("{dk:?} <- {sk:?}: {err}"));
    let got = dst.to_vec();
    if let Some(i) = (0..len).find(|&i| got[i] != want[i]) {
        panic!("{dk:?} <- {sk:?}: first wrong byte at {i}");
    }
}

/// Setup calls land before the engine's next copy: `DeviceBuffer::from_host` and
/// `DeviceBuffer::zeroed` run on the legacy stream, which ferry's streams do not wait for, and
/// the driver returns from them before the DMA or memset ends; and a fill with a pattern no
/// memset can write copies from a pattern block it uploads itself. Each is followed at once by
/// an engine copy of the same memory (H200 run 22: the stress test saw a fill read its pattern
/// block before the upload landed).
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn setup_calls_land_before_the_next_engine_copy() {
    use ferry::cuda::{DeviceBuffer, PinnedBuffer};
    let Some(e) = cuda_or_skip() else { return };
    let n = 64 << 20;
    let mut host = PinnedBuffer::new(n).unwrap();
    for round in 0..4u64 {
        let data = bytes(n, 100 + round);
        let dev = DeviceBuffer::from_host(0, &data).unwrap();
        e.scope(|s| {
            s.memcpy(&mut host, &dev)?
                .wait()
                .map_err(ferry::Error::from)
        })
        .unwrap();
        assert!(host[..] == data[..], "round {round}: from_host then copy");
        let mut zero = DeviceBuffer::zeroed(0, n).unwrap();
        e.scope(|s| {
            s.memcpy(&mut zero, &host)?
                .wait()
                .map_err(ferry::Error::from)
        })
        .unwrap();
        assert!(
            zero.to_vec().unwrap() == data,
            "round {round}: zeroed then copy"
        );
    }
    let pattern: Vec<u8> = (1..=16).collect();
    for round in 0..16usize {
        let len = 80_557 + round;
        let mut b = PinnedBuffer::new(len).unwrap();
        b.fill(0);
        // 16-byte elements at an odd offset, as the stress case that failed.
        let l = Layout::contiguous(&[(len - 13) / 16], 16)
            .unwrap()
            .with_offset(1 + round % 7)
            .unwrap();
        e.scope(|s| {
            s.fill(&mut b, &l, &pattern)?
                .wait()
                .map_err(ferry::Error::from)
        })
        .unwrap();
        let want = reference_fill(&vec![0u8; len], &l, &pattern);
        assert!(
            b[..] == want[..],
            "round {round}: 16-byte fill of pinned memory"
        );
    }
}

/// One contiguous run at offsets in both buffers, in every kind pair: the engine's one-run
/// path (`Engine::submit_copy`, no job built), with the default config and with kernel copies
/// forced (the general path then: `route::one_run` leaves SM copies to it); a run that does not
/// fit is refused with the same error through `submit_copy` as through `submit_raw`.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn one_run_at_offsets_every_kind_pair() {
    use ferry::cuda::{CudaEngine, KernelCopies};
    use ferry::{Engine, Job, Memory, MemoryMut};
    let Some(e) = cuda_or_skip() else { return };
    let sm = CudaEngine::with_config(cuda_config(0).kernel_copies(KernelCopies::Always))
        .expect("engine with kernel copies");
    let mut seed = 7;
    for eng in [&e, &sm] {
        for &dk in &KINDS {
            for &sk in &KINDS {
                if is_pageable(dk) && is_pageable(sk) {
                    continue;
                }
                for (n, doff, soff) in [(1, 3, 0), (4093, 0, 11), (300_001, 4096, 17)] {
                    let dl = Layout::bytes(n).unwrap().with_offset(doff).unwrap();
                    let sl = Layout::bytes(n).unwrap().with_offset(soff).unwrap();
                    check_copy(eng, dk, sk, &dl, doff + n + 5, &sl, soff + n, seed);
                    seed += 1;
                }
            }
        }
    }
    let src = Buf::new(Kind::Pinned, &[1u8; 64]);
    let mut dst = Buf::new(Kind::Device, &[0u8; 64]);
    let (whole, past) = (
        Layout::bytes(64).unwrap(),
        Layout::bytes(64).unwrap().with_offset(8).unwrap(),
    );
    for (dl, sl) in [(&past, &whole), (&whole, &past)] {
        // SAFETY: refused at submit (the layout lies past its buffer's end): nothing runs.
        let fast = unsafe { e.submit_copy(dst.raw_mut(), dl, src.raw(), sl) }.unwrap_err();
        let job = Job::copy(dst.raw_mut(), *dl, src.raw(), *sl);
        // SAFETY: as above.
        let general = unsafe { e.submit_raw(job) }.unwrap_err();
        assert_eq!(fast.to_string(), general.to_string());
        assert!(matches!(fast, ferry::SubmitError::Op(_)), "{fast:?}");
    }
    e.barrier().expect("nothing failed after the refusals");
}

/// Copies and fills over layouts with no element complete at once, through the scope and the
/// raw contract (alone: a ready request; after another request: when it is done), touching
/// no byte; one empty side beside a non-empty one is refused.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn empty_copies_and_fills_complete_at_once() {
    use ferry::{Engine, Job, Memory, MemoryMut};
    let Some(e) = cuda_or_skip() else { return };
    let n = 4096;
    let empty = Layout::bytes(0).unwrap();
    let empty_2d = Layout::contiguous(&[0, 16], 1)
        .unwrap()
        .with_offset(64)
        .unwrap();
    let whole = Layout::bytes(n).unwrap();
    for &dk in &KINDS {
        for &sk in &KINDS {
            if is_pageable(dk) && is_pageable(sk) {
                continue;
            }
            let (dst_h, src_h) = (bytes(n, 7), bytes(n, 8));
            let src = Buf::new(sk, &src_h);
            let mut dst = Buf::new(dk, &dst_h);
            e.scope(|s| -> ferry::Result<()> {
                let r = s.copy(&mut dst, &empty_2d, &src, &empty)?;
                assert!(r.is_done(), "{dk:?} <- {sk:?}: scoped copy");
                Ok(r.wait()?)
            })
            .unwrap();
            e.scope(|s| -> ferry::Result<()> {
                let r = s.fill(&mut dst, &empty_2d, &[1])?;
                assert!(r.is_done(), "{dk:?}: scoped fill");
                Ok(r.wait()?)
            })
            .unwrap();
            let (d, sr) = (dst.raw_mut(), src.raw());
            // SAFETY: both buffers outlive every request, each waited below.
            unsafe {
                let r = e.submit_raw(Job::copy(d, empty, sr, empty_2d)).unwrap();
                assert!(r.is_done(), "{dk:?} <- {sk:?}: raw copy");
                assert_eq!(r.wait(), Ok(()));
                let r = e.submit_raw(Job::fill(d, empty_2d, &[0])).unwrap();
                assert!(r.is_done(), "{dk:?}: raw fill");
                assert_eq!(r.wait(), Ok(()));
                let mut scratch = Buf::new(dk, &dst_h);
                let first = e
                    .submit_raw(Job::copy(scratch.raw_mut(), whole, sr, whole))
                    .unwrap();
                let r = e
                    .submit_raw(Job::copy(d, empty, sr, empty).after(&first))
                    .unwrap();
                assert_eq!(r.wait(), Ok(()), "{dk:?} <- {sk:?}: raw copy after another");
                assert_eq!(first.wait(), Ok(()));
                check("scratch", &scratch.to_vec(), &src_h);
                assert!(e.submit_raw(Job::copy(d, empty, sr, whole)).is_err());
                assert!(e.submit_raw(Job::copy(d, whole, sr, empty)).is_err());
            }
            check("untouched", &dst.to_vec(), &dst_h);
        }
    }
    e.barrier().unwrap();
}
