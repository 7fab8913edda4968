//! SM copies of strided plans (`ferry::cuda::strided`): transposes of every element size, odd
//! shapes, 3-D and 4-D permutations, offsets, every device-accessible memory kind, each engine
//! mode (`KernelCopies::Auto`, `Always`, `Never`), and the kernels called directly; every
//! destination byte is checked against the CPU engine's result. The last two tests print SM and
//! copy-engine timings of transposes by run length and by run count, for setting
//! `strided::AUTO_MAX_RUN`, `AUTO_MIN_RUNS`, `AUTO_MAX_RUN_CALLS` and `AUTO_MIN_CALLS`.
//! The timings mean something only with the GPU to themselves:
//! `cuda_strided --test-threads=1 --nocapture timings`.
//! Prints `skipped: no CUDA driver` without a GPU.

mod cuda_common;
use cuda_common::*;
use ferry::cuda::strided::{KernelCopies, SmCopier, SmKernel};
use ferry::cuda::{CudaEngine, DeviceBuffer, MappedBuffer};
use ferry::{EngineExt, Layout, Plan};
use std::time::Instant;

fn engine(mode: KernelCopies) -> Option<CudaEngine> {
    cuda_or_skip()?;
    Some(CudaEngine::with_config(cuda_config(0).kernel_copies(mode)).unwrap())
}

const MODES: [KernelCopies; 3] = [
    KernelCopies::Auto,
    KernelCopies::Always,
    KernelCopies::Never,
];

/// Device-accessible kinds the SM path takes, plus pageable (always on the copy engines).
const SM_KINDS: [Kind; 5] = [
    Kind::Device,
    Kind::Pinned,
    Kind::Mapped,
    Kind::Managed,
    Kind::Registered,
];

/// (dst layout, dst len, src layout, src len) of the transpose of a `rows` x `cols` matrix.
fn transpose(rows: usize, cols: usize, elem: usize) -> (Layout, usize, Layout, usize) {
    let m = Layout::contiguous(&[rows, cols], elem).unwrap();
    let t = Layout::contiguous(&[cols, rows], elem).unwrap();
    (
        t,
        t.size_bytes(),
        m.transpose(0, 1).unwrap(),
        m.size_bytes(),
    )
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn transposes_every_element_size_and_odd_shapes() {
    let mut seed = 1;
    for mode in MODES {
        let Some(e) = engine(mode) else { return };
        for elem in [1usize, 2, 3, 4, 8, 12, 16, 32, 48] {
            for (r, c) in [(64, 64), (33, 47), (1000, 17), (3, 1029), (257, 255)] {
                let (dl, dn, sl, sn) = transpose(r, c, elem);
                check_copy(&e, Kind::Device, Kind::Device, &dl, dn, &sl, sn, seed);
                seed += 1;
            }
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn transposes_between_every_device_accessible_kind() {
    let mut seed = 1000;
    for mode in [KernelCopies::Auto, KernelCopies::Always] {
        let Some(e) = engine(mode) else { return };
        for &dk in &SM_KINDS {
            for &sk in &SM_KINDS {
                for elem in [4usize, 8] {
                    let (dl, dn, sl, sn) = transpose(129, 200, elem);
                    check_copy(&e, dk, sk, &dl, dn, &sl, sn, seed);
                    seed += 1;
                }
            }
        }
        // Pageable on one side stays on the copy engines (or the staged path), still correct.
        let (dl, dn, sl, sn) = transpose(129, 200, 4);
        check_copy(&e, Kind::Device, Kind::Pageable, &dl, dn, &sl, sn, seed);
        check_copy(&e, Kind::Pageable, Kind::Device, &dl, dn, &sl, sn, seed + 1);
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn permutations_of_3d_and_4d() {
    let mut seed = 2000;
    let orders3: [[usize; 3]; 6] = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    for mode in MODES {
        let Some(e) = engine(mode) else { return };
        for elem in [2usize, 4, 8] {
            let cube = Layout::contiguous(&[7, 37, 23], elem).unwrap();
            for order in orders3 {
                let p = cube.permute(&order).unwrap();
                let dims: Vec<usize> = order.iter().map(|&i| cube.dims()[i]).collect();
                let d = Layout::contiguous(&dims, elem).unwrap();
                check_copy(
                    &e,
                    Kind::Device,
                    Kind::Device,
                    &d,
                    d.size_bytes(),
                    &p,
                    cube.size_bytes(),
                    seed,
                );
                seed += 1;
            }
        }
        // 4-D: several outer dims beyond the tile (the grid walks them).
        let h = Layout::contiguous(&[3, 5, 40, 33], 4).unwrap();
        for order in [[3usize, 2, 1, 0], [1, 3, 0, 2], [0, 1, 3, 2], [2, 0, 3, 1]] {
            let p = h.permute(&order).unwrap();
            let dims: Vec<usize> = order.iter().map(|&i| h.dims()[i]).collect();
            let d = Layout::contiguous(&dims, 4).unwrap();
            check_copy(
                &e,
                Kind::Device,
                Kind::Pinned,
                &d,
                d.size_bytes(),
                &p,
                h.size_bytes(),
                seed,
            );
            seed += 1;
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn offsets_slices_and_unaligned_starts() {
    let mut seed = 3000;
    for mode in [KernelCopies::Auto, KernelCopies::Always] {
        let Some(e) = engine(mode) else { return };
        // A tile of a transposed view, into a destination at an odd offset: 1-byte words only.
        let m = Layout::contiguous(&[300, 200], 4).unwrap();
        let view = m
            .transpose(0, 1)
            .unwrap()
            .slice(0, 3..197, 1)
            .unwrap()
            .slice(1, 5..290, 1)
            .unwrap();
        let d = Layout::contiguous(&[194, 285], 4)
            .unwrap()
            .with_offset(3)
            .unwrap();
        check_copy(
            &e,
            Kind::Device,
            Kind::Device,
            &d,
            d.span().end + 5,
            &view,
            m.size_bytes(),
            seed,
        );
        // Every other element of every other row (one thread per run).
        let g = Layout::contiguous(&[400, 300], 8).unwrap();
        let sparse = g.slice(0, 0..400, 2).unwrap().slice(1, 1..300, 2).unwrap();
        let dense = Layout::contiguous(&[200, 150], 8).unwrap();
        check_copy(
            &e,
            Kind::Mapped,
            Kind::Device,
            &dense,
            dense.size_bytes(),
            &sparse,
            g.size_bytes(),
            seed + 1,
        );
        // Scatter back into the sparse positions.
        check_copy(
            &e,
            Kind::Device,
            Kind::Pinned,
            &sparse,
            g.size_bytes(),
            &dense,
            dense.size_bytes(),
            seed + 2,
        );
        seed += 3;
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn always_moves_contiguous_copies_through_mapped_memory() {
    let Some(e) = engine(KernelCopies::Always) else {
        return;
    };
    let mut seed = 4000;
    for n in [1usize, 15, 4097, (8 << 20) + 3] {
        let l = Layout::bytes(n).unwrap();
        for (dk, sk) in [
            (Kind::Device, Kind::Mapped),
            (Kind::Mapped, Kind::Device),
            (Kind::Device, Kind::Device),
            (Kind::Managed, Kind::Pinned),
        ] {
            check_copy(&e, dk, sk, &l, n, &l, n, seed);
            seed += 1;
        }
    }
    // Misaligned starts inside the buffers (offsets 1 and 6: no common word wider than 1 byte).
    let src = Layout::bytes(10_000).unwrap().with_offset(1).unwrap();
    let dst = Layout::bytes(10_000).unwrap().with_offset(6).unwrap();
    check_copy(
        &e,
        Kind::Mapped,
        Kind::Device,
        &dst,
        10_010,
        &src,
        10_004,
        seed,
    );
}

/// The kernels called directly: each plan kind picks its kernel and writes every byte.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn sm_copier_kernels_directly() {
    if cuda_or_skip().is_none()
        || skip_on_null_driver(
            "calls ferry's SM copy kernels (built with NVRTC): the null driver runs no kernels",
        )
    {
        return;
    }
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let sm = SmCopier::new(ctx.clone()).unwrap();
    sm.compile().unwrap();
    let m = Layout::contiguous(&[300, 500], 4).unwrap();
    let t = Layout::contiguous(&[500, 300], 4).unwrap();
    let sparse = m.slice(1, 0..500, 2).unwrap();
    let dense = Layout::contiguous(&[300, 250], 4).unwrap();
    let wide = Layout::pitched(&[100, 1000], 1, 1500).unwrap();
    let packed = Layout::contiguous(&[100, 1000], 1).unwrap();
    let flat = Layout::bytes(600_000).unwrap();
    let m12 = Layout::contiguous(&[100, 500], 12).unwrap();
    let t12 = Layout::contiguous(&[500, 100], 12).unwrap();
    let cases = [
        (SmKernel::Transpose, t, m.transpose(0, 1).unwrap()),
        (SmKernel::Tiled, t12, m12.transpose(0, 1).unwrap()),
        (SmKernel::Each, dense, sparse),
        (SmKernel::Rows, packed, wide),
        (SmKernel::Linear, flat, flat),
    ];
    for (i, (want_kernel, dl, sl)) in cases.iter().enumerate() {
        let src_h = bytes(600_000, 77 + i as u64);
        let dst_h = bytes(600_000, 99 + i as u64);
        let want = reference_copy(&dst_h, dl, &src_h, sl);
        let src = DeviceBuffer::from_host(0, &src_h).unwrap();
        let mut mapped = MappedBuffer::new(600_000).unwrap();
        mapped.copy_from_slice(&dst_h);
        let plan = Plan::new(dl, sl).unwrap();
        // SAFETY: the plan lies inside both 600,000-byte buffers (the layouts span less), which
        // live until the stream is synchronized below; nothing else touches them.
        let k = unsafe { sm.copy(&stream, mapped.device_ptr(), src.device_ptr(), &plan) }.unwrap();
        stream.synchronize().unwrap();
        assert_eq!(k, *want_kernel);
        let got = mapped.to_vec();
        if let Some(b) = (0..got.len()).find(|&b| got[b] != want[b]) {
            panic!(
                "{k:?}: first wrong byte at {b}: got {}, want {}",
                got[b], want[b]
            );
        }
    }
    // Pageable memory is refused before anything runs.
    let host = vec![0u8; 4096];
    let dev = DeviceBuffer::new(0, 4096).unwrap();
    let l = Layout::bytes(4096).unwrap();
    // SAFETY: nothing is enqueued: the pageable source is refused first.
    let r = unsafe {
        sm.copy(
            &stream,
            dev.device_ptr(),
            host.as_ptr() as u64,
            &Plan::new(&l, &l).unwrap(),
        )
    };
    assert!(r.is_err(), "pageable source accepted: {r:?}");
}

/// GB/s of one `src` -> `dst` copy by engine `e` (median of 5 after a warm-up; once if a call
/// takes over 1 s: the copy engines on 1-byte runs); checks the destination's bytes.
#[allow(clippy::too_many_arguments)]
fn copy_gbps(
    e: &CudaEngine,
    dk: Kind,
    sk: Kind,
    dl: &Layout,
    dn: usize,
    sl: &Layout,
    sn: usize,
    seed: u64,
) -> f64 {
    let src_h = bytes(sn, seed);
    let src = Buf::new(sk, &src_h);
    let want = reference_copy(&vec![0u8; dn], dl, &src_h, sl);
    let mut dst = Buf::new(dk, &vec![0u8; dn]);
    let mut times = vec![];
    for i in 0..6 {
        let t = Instant::now();
        e.scope(|s| {
            s.copy(&mut dst, dl, &src, sl)?
                .wait()
                .map_err(ferry::Error::from)
        })
        .unwrap();
        let took = t.elapsed().as_secs_f64();
        if i > 0 || took > 1.0 {
            times.push(took);
        }
        if took > 1.0 {
            break;
        }
    }
    assert!(
        dst.to_vec() == want,
        "{dk:?} <- {sk:?}, seed {seed}: wrong bytes"
    );
    times.sort_by(f64::total_cmp);
    dl.size_bytes() as f64 / times[times.len() / 2] / 1e9
}

/// Prints, per run length, the SM and copy-engine rates of square transposes (device ->
/// device, and pinned host -> device) and of 2-D tiles (rows of the run length out of a pitch
/// twice as wide, 16 MiB, device -> device, pinned -> device, device -> pinned): for choosing
/// `strided::AUTO_MAX_RUN` and `AUTO_MAX_RUN_CALLS`. Checks the bytes of each.
/// `CudaEngine::compile_kernels` makes the kernels ahead of the first copy; a second engine on
/// the device reuses the compiled program (prints both times), and copies right away.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn kernels_compiled_ahead_and_shared_between_engines() {
    let (Some(a), Some(b)) = (engine(KernelCopies::Auto), engine(KernelCopies::Auto)) else {
        return;
    };
    if skip_on_null_driver(
        "compiles and loads ferry's SM copy kernels (built with NVRTC): the null driver runs \
         no kernels",
    ) {
        return;
    }
    let t = Instant::now();
    a.compile_kernels().unwrap();
    let first = t.elapsed();
    let t = Instant::now();
    b.compile_kernels().unwrap();
    let second = t.elapsed();
    println!("compile_kernels: first engine {first:?}, second engine {second:?}");
    let (dl, dn, sl, sn) = transpose(300, 200, 4);
    check_copy(&b, Kind::Device, Kind::Device, &dl, dn, &sl, sn, 77);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn transpose_timings_by_run_length() {
    let (Some(sm), Some(ce)) = (engine(KernelCopies::Always), engine(KernelCopies::Never)) else {
        return;
    };
    if skip_on_null_driver(
        "times ferry's SM copy kernels (built with NVRTC): the null driver runs no kernels",
    ) {
        return;
    }
    // The first SM copy would otherwise carry the compile.
    sm.compile_kernels().unwrap();
    let pair = |what: String, dk, sk, dl: &Layout, dn, sl: &Layout, sn, seed| {
        let a = copy_gbps(&sm, dk, sk, dl, dn, sl, sn, seed);
        let b = copy_gbps(&ce, dk, sk, dl, dn, sl, sn, seed);
        println!("{what}: SM {a:.1} GB/s copy engines {b:.1} GB/s");
    };
    for (dk, sk) in [(Kind::Device, Kind::Device), (Kind::Device, Kind::Pinned)] {
        for elem in [1usize, 2, 4, 8, 16, 32, 64, 128, 256] {
            // About 16 MiB, square.
            let side = (((16usize << 20) / elem) as f64).sqrt() as usize;
            let (dl, dn, sl, sn) = transpose(side, side, elem);
            let what = format!("transpose {side}x{side} of {elem}-byte elements {dk:?} <- {sk:?}");
            pair(what, dk, sk, &dl, dn, &sl, sn, elem as u64);
        }
    }
    for (dk, sk) in [
        (Kind::Device, Kind::Device),
        (Kind::Device, Kind::Pinned),
        (Kind::Pinned, Kind::Device),
    ] {
        for run in [4usize, 16, 64, 256, 1024, 4096] {
            let rows = (16usize << 20) / run;
            let sl = Layout::pitched(&[rows, run], 1, 2 * run).unwrap();
            let dl = Layout::contiguous(&[rows, run], 1).unwrap();
            let what = format!(
                "tile {rows} rows of {run} B (pitch {}) {dk:?} <- {sk:?}",
                2 * run
            );
            let (dn, sn) = (dl.size_bytes(), rows * 2 * run);
            pair(what, dk, sk, &dl, dn, &sl, sn, run as u64);
        }
    }
}

/// Prints, for small square transposes of f32 (64 to 65,536 runs), the submit+wait time on the
/// SMs and on the copy engines (median of 21 after a warm-up), for choosing
/// `strided::AUTO_MIN_CALLS` (an n x n transpose is n driver calls on the copy engines); checks
/// the bytes of each.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn small_transpose_timings_by_run_count() {
    let (Some(sm), Some(ce)) = (engine(KernelCopies::Always), engine(KernelCopies::Never)) else {
        return;
    };
    if skip_on_null_driver(
        "times ferry's SM copy kernels (built with NVRTC): the null driver runs no kernels",
    ) {
        return;
    }
    sm.compile_kernels().unwrap();
    for side in [8usize, 16, 32, 64, 128, 256] {
        let (dl, dn, sl, sn) = transpose(side, side, 4);
        let src_h = bytes(sn, side as u64);
        let src = DeviceBuffer::from_host(0, &src_h).unwrap();
        let want = reference_copy(&vec![0u8; dn], &dl, &src_h, &sl);
        let mut line = format!("transpose {side}x{side} f32 ({} runs):", side * side);
        for (name, e) in [("SM", &sm), ("copy engines", &ce)] {
            let mut dst = DeviceBuffer::zeroed(0, dn).unwrap();
            let mut times = vec![];
            for i in 0..22 {
                let t = Instant::now();
                e.scope(|s| {
                    s.copy(&mut dst, &dl, &src, &sl)?
                        .wait()
                        .map_err(ferry::Error::from)
                })
                .unwrap();
                if i > 0 {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            assert!(
                dst.to_vec().unwrap() == want,
                "{name} side {side}: wrong bytes"
            );
            times.sort_by(f64::total_cmp);
            line += &format!(" {name} {:.1} us", times[times.len() / 2] * 1e6);
        }
        println!("{line}");
    }
}
