//! The SM transpose kernel (`engine/cuda/paths/transpose.rs`, picked as `SmKernel::Transpose` for the
//! plans `route::transpose_of` recognises): elements of 1, 2, 4, 8 and 16 bytes, square and
//! not, sizes that are not multiples of the tile, 1 x N and N x 1, padded strides, unaligned
//! starts (no 4-byte words), batches and 2-axis swaps; device -> device, pinned host -> device
//! and device -> pinned host, through the engine (`KernelCopies::Auto` and `Always`) and the
//! SM copier called directly. Every destination byte is checked against the CPU engine's
//! result (or, for the 4096 x 4096 matrices, against the transpose computed here).
//! Prints `skipped: no CUDA driver` without a GPU.

mod cuda_common;
use cuda_common::*;
use ferry::cuda::strided::{KernelCopies, SmCopier, SmKernel};
use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
use ferry::{EngineExt, Layout, Plan};

fn engine(mode: KernelCopies) -> Option<CudaEngine> {
    cuda_or_skip()?;
    Some(CudaEngine::with_config(cuda_config(0).kernel_copies(mode)).unwrap())
}

const ELEMS: [usize; 5] = [1, 2, 4, 8, 16];

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

/// Shapes around the tiles (32 x 64, 64 x 64, 128 x 128 elements): full tiles, ragged edges
/// on either side, one tile's worth minus and plus one, single rows and columns.
const SHAPES: [(usize, usize); 11] = [
    (64, 64),
    (128, 256),
    (33, 47),
    (1000, 17),
    (3, 1029),
    (257, 255),
    (127, 129),
    (1, 1000),
    (1000, 1),
    (2, 2),
    (300, 500),
];

/// Transposes of every element size and each of `shapes` between each pair of `kinds`
/// (destination, source), by engines with `KernelCopies::Auto` and `Always`.
fn transposes(kinds: &[(Kind, Kind)], shapes: &[(usize, usize)], mut seed: u64) {
    for mode in [KernelCopies::Auto, KernelCopies::Always] {
        let Some(e) = engine(mode) else { return };
        for elem in ELEMS {
            for &(r, c) in shapes {
                let (dl, dn, sl, sn) = transpose(r, c, elem);
                for &(dk, sk) in kinds {
                    check_copy(&e, dk, sk, &dl, dn, &sl, sn, seed);
                    seed += 1;
                }
            }
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn every_element_size_and_shape_device_to_device() {
    transposes(&[(Kind::Device, Kind::Device)], &SHAPES, 1);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn pinned_to_device_and_device_to_pinned() {
    let kinds = [
        (Kind::Device, Kind::Pinned),
        (Kind::Pinned, Kind::Device),
        (Kind::Device, Kind::Mapped),
        (Kind::Mapped, Kind::Device),
    ];
    transposes(&kinds, &[(129, 200), (256, 512), (64, 1), (77, 300)], 1000);
}

/// `check_copy` of `src` (in a buffer of `src_len` bytes) into a buffer that just holds `dst`
/// (padding and offset included), a new seed each call.
fn checker(e: &CudaEngine, mut seed: u64) -> impl FnMut(Kind, Kind, &Layout, &Layout, usize) + '_ {
    move |dk, sk, dst, src, src_len| {
        check_copy(e, dk, sk, dst, dst.span().end, src, src_len, seed);
        seed += 1;
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn padded_strides_offsets_and_unaligned_starts() {
    let Some(e) = engine(KernelCopies::Auto) else {
        return;
    };
    let mut check = checker(&e, 2000);
    let dev = Kind::Device;
    for elem in ELEMS {
        // Source rows padded to a pitch: a multiple of 4 bytes, and (for 1- and 2-byte
        // elements) not.
        for extra in [4usize, 6, 64] {
            let (r, c) = (100, 63);
            let pitch = (c * elem + extra).next_multiple_of(elem);
            let m = Layout::pitched(&[r, c], elem, pitch).unwrap();
            let sl = m.transpose(0, 1).unwrap();
            let dl = Layout::contiguous(&[c, r], elem).unwrap();
            // (The buffers hold the padded rows: span, not the elements' bytes.)
            check(dev, dev, &dl, &sl, m.span().end);
            // Destination rows padded too.
            let dp = Layout::pitched(&[c, r], elem, (r + 3) * elem).unwrap();
            check(Kind::Pinned, dev, &dp, &sl, m.span().end);
        }
        // A window out of a larger matrix, starting one element in (an unaligned start for
        // 1- and 2-byte elements: no 4-byte words).
        let big = Layout::contiguous(&[90, 150], elem).unwrap();
        let win = big.slice(0, 1..81, 1).unwrap().slice(1, 1..131, 1).unwrap();
        let dl = Layout::contiguous(&[130, 80], elem).unwrap();
        check(
            dev,
            dev,
            &dl,
            &win.transpose(0, 1).unwrap(),
            big.size_bytes(),
        );
        // Every other column: the source's grain has a stride of two elements.
        let every_other = big.slice(1, 0..150, 2).unwrap().transpose(0, 1).unwrap();
        let dl = Layout::contiguous(&[75, 90], elem).unwrap();
        check(dev, dev, &dl, &every_other, big.size_bytes());
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn batched_transposes_and_axis_swaps() {
    for (mode, seed) in [(KernelCopies::Auto, 3000), (KernelCopies::Always, 4000)] {
        let Some(e) = engine(mode) else { return };
        let mut check = checker(&e, seed);
        let dev = Kind::Device;
        for elem in ELEMS {
            // [B, R, C] -> [B, C, R].
            for (b, r, c) in [(16, 64, 64), (3, 70, 130), (5, 1, 40), (7, 33, 200)] {
                let m = Layout::contiguous(&[b, r, c], elem).unwrap();
                let sl = m.transpose(1, 2).unwrap();
                let dl = Layout::contiguous(&[b, c, r], elem).unwrap();
                check(dev, dev, &dl, &sl, m.size_bytes());
                check(dev, Kind::Pinned, &dl, &sl, m.size_bytes());
            }
            // Axes 0 and 2 of a cube swapped (the middle one is the batch), and 4-D.
            let cube = Layout::contiguous(&[7, 37, 23], elem).unwrap();
            let dl = Layout::contiguous(&[23, 37, 7], elem).unwrap();
            check(
                dev,
                dev,
                &dl,
                &cube.transpose(0, 2).unwrap(),
                cube.size_bytes(),
            );
            let h = Layout::contiguous(&[3, 5, 40, 33], elem).unwrap();
            let sl = h.permute(&[1, 0, 3, 2]).unwrap();
            let dl = Layout::contiguous(&[5, 3, 33, 40], elem).unwrap();
            check(Kind::Pinned, dev, &dl, &sl, h.size_bytes());
        }
    }
}

/// The SM copier called directly picks the transpose kernel for each element size, and writes
/// every byte (device -> device).
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn sm_copier_picks_the_transpose_kernel() {
    if cuda_or_skip().is_none()
        || skip_on_null_driver(
            "calls ferry's transpose kernels (built with NVRTC): the null driver runs no kernels",
        )
    {
        return;
    }
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let sm = SmCopier::new(ctx.clone()).unwrap();
    for (i, elem) in ELEMS.into_iter().enumerate() {
        let (dl, dn, sl, sn) = transpose(190, 333, elem);
        let src_h = bytes(sn, 40 + i as u64);
        let dst_h = bytes(dn, 50 + i as u64);
        let want = reference_copy(&dst_h, &dl, &src_h, &sl);
        let src = DeviceBuffer::from_host(0, &src_h).unwrap();
        let dst = DeviceBuffer::from_host(0, &dst_h).unwrap();
        let plan = Plan::new(&dl, &sl).unwrap();
        // SAFETY: the plan lies inside both buffers (made from the layouts' sizes), which live
        // until the stream is synchronized below; nothing else touches them.
        let k = unsafe { sm.copy(&stream, dst.device_ptr(), src.device_ptr(), &plan) }.unwrap();
        stream.synchronize().unwrap();
        assert_eq!(k, SmKernel::Transpose, "{elem}-byte elements");
        let got = dst.to_vec().unwrap();
        if let Some(b) = (0..dn).find(|&b| got[b] != want[b]) {
            panic!(
                "{elem}-byte transpose 190 x 333: first wrong byte at {b} (element {}): got {}, want {}",
                b / elem,
                got[b],
                want[b]
            );
        }
    }
}

/// 4096 x 4096 f32 and bf16 transposes (64 and 32 MiB: many full tiles), device -> device,
/// pinned -> device and device -> pinned, checked element by element.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn large_f32_and_bf16() {
    let Some(e) = engine(KernelCopies::Auto) else {
        return;
    };
    const N: usize = 4096;
    for elem in [4usize, 2] {
        let (dl, _, sl, _) = transpose(N, N, elem);
        let data = bytes(N * N * elem, 7 + elem as u64);
        let mut want = vec![0u8; data.len()];
        for i in 0..N {
            for j in 0..N {
                let (d, s) = ((j * N + i) * elem, (i * N + j) * elem);
                want[d..d + elem].copy_from_slice(&data[s..s + elem]);
            }
        }
        let check = |got: &[u8], what: &str| {
            if let Some(b) = (0..got.len()).find(|&b| got[b] != want[b]) {
                let (el, row, col) = (b / elem, b / elem / N, b / elem % N);
                panic!("{what}, {elem}-byte elements {N} x {N}: first wrong byte at {b} (element {el}: dst row {row}, col {col}): got {}, want {}", got[b], want[b]);
            }
        };
        let dev_src = DeviceBuffer::from_host(0, &data).unwrap();
        let mut pinned_src = PinnedBuffer::new(data.len()).unwrap();
        pinned_src.copy_from_slice(&data);
        let mut dev = DeviceBuffer::new(0, data.len()).unwrap();
        e.scope(|s| {
            s.copy(&mut dev, &dl, &dev_src, &sl)?
                .wait()
                .map_err(ferry::Error::from)
        })
        .unwrap();
        check(&dev.to_vec().unwrap(), "device -> device");
        let mut dev = DeviceBuffer::new(0, data.len()).unwrap();
        e.scope(|s| {
            s.copy(&mut dev, &dl, &pinned_src, &sl)?
                .wait()
                .map_err(ferry::Error::from)
        })
        .unwrap();
        check(&dev.to_vec().unwrap(), "pinned -> device");
        let mut pinned_dst = PinnedBuffer::new(data.len()).unwrap();
        e.scope(|s| {
            s.copy(&mut pinned_dst, &dl, &dev_src, &sl)?
                .wait()
                .map_err(ferry::Error::from)
        })
        .unwrap();
        check(&pinned_dst, "device -> pinned");
    }
}

/// Every element size at every offset below it, on either side, with row pitches that are and
/// are not multiples of the element or of 4 bytes: the transpose kernel where every address is
/// aligned for its accesses, the general SM kernels (in narrower words) where not; no
/// misaligned access (which would end the context: H200 run 31). Device -> device, and
/// device -> pinned for the pitches, through `KernelCopies::Auto` and `Always`.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn every_element_size_at_every_offset_and_odd_pitches() {
    for (mode, seed) in [(KernelCopies::Auto, 6000), (KernelCopies::Always, 7000)] {
        let Some(e) = engine(mode) else { return };
        let mut check = checker(&e, seed);
        let dev = Kind::Device;
        let (r, c) = (37, 70);
        for elem in ELEMS {
            for extra in [0usize, 1, 2, 3, elem] {
                let m = Layout::pitched(&[r, c], elem, c * elem + extra).unwrap();
                let dl = Layout::contiguous(&[c, r], elem).unwrap();
                for off in 0..elem {
                    let sl = m.transpose(0, 1).unwrap().with_offset(off).unwrap();
                    check(dev, dev, &dl, &sl, sl.span().end + 3);
                    let dl_off = dl.with_offset(off).unwrap();
                    let sl0 = m.transpose(0, 1).unwrap();
                    check(dev, dev, &dl_off, &sl0, m.span().end);
                    if extra == 1 {
                        check(Kind::Pinned, dev, &dl_off, &sl, sl.span().end);
                    }
                }
            }
        }
    }
}

/// H200 run 31, `cuda_stress` (seed 1796305811726484851, warm-up on "cuda spin"): a bf16
/// transpose into a device buffer at an odd offset (request 4) took the transpose kernel with
/// 2-byte accesses, and the next request waited on (5, a fill) reported
/// `CUDA_ERROR_MISALIGNED_ADDRESS`. Both, with those exact layouts, then a plain transpose on
/// the same engine (the context must still work).
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn run_31_stress_case_copy_and_fill() {
    for mode in [KernelCopies::Auto, KernelCopies::Always] {
        let Some(e) = engine(mode) else { return };
        let dl = Layout::with_byte_strides(&[995, 4, 2], &[82, 2, 245262], 2)
            .unwrap()
            .with_offset(163597)
            .unwrap();
        let sl = Layout::with_byte_strides(&[995, 4, 2], &[6, 17904, 5968], 2)
            .unwrap()
            .with_offset(41778)
            .unwrap();
        let dev = Kind::Device;
        check_copy(
            &e,
            dev,
            dev,
            &dl,
            dl.span().end + 7,
            &sl,
            sl.span().end + 5,
            8000,
        );
        let fl = Layout::with_byte_strides(&[21, 3], &[2, 42], 2)
            .unwrap()
            .with_offset(2)
            .unwrap();
        let init = bytes(fl.span().end + 9, 8001);
        let want = reference_fill(&init, &fl, &[0xA5, 0x5A]);
        let mut dst = Buf::new(dev, &init);
        e.scope(|s| {
            s.fill(&mut dst, &fl, &[0xA5, 0x5A])?
                .wait()
                .map_err(ferry::Error::from)
        })
        .unwrap_or_else(|err| panic!("{mode:?}: fill {fl:?}: {err}"));
        let got = dst.to_vec();
        if let Some(b) = (0..got.len()).find(|&b| got[b] != want[b]) {
            panic!(
                "{mode:?}: fill {fl:?}: first wrong byte at {b}: got {}, want {}",
                got[b], want[b]
            );
        }
        let (dl, dn, sl, sn) = transpose(300, 500, 2);
        check_copy(&e, dev, dev, &dl, dn, &sl, sn, 8002);
    }
}
