//! A strided 3-D layout copy through AML's interface (libaml's C entry points, as a C program
//! calls them) against the same copy through ferry's Rust API, on the same buffers in one run:
//! the CPU (Linux DMA vs `CpuEngine`) and, where CUDA is present, host to device and back
//! (CUDA DMA vs `CudaEngine`). Prints GB/s of each and the ratio AML / Rust (target >= 0.9).
//!
//! Both sides submit the same job (the NULL operator is ferry's planned copy: the unit test
//! `null_operator_submits_the_rust_api_job` checks it), so the samples are interleaved, the
//! order swapped every sample: timed one series after the other, a drift of the machine over
//! the run (clocks, page placement, another process) fell on one side only.
//!
//! `cargo run --release -p ferry-aml --example aml_vs_rust [-- ITERATIONS]`

use aml::dma::{aml_dma_copy_custom, AmlDma};
use aml::layout::{aml_layout_dense_create, aml_layout_destroy, aml_layout_slice, AmlLayout};
use ferry::{CpuEngine, EngineExt, Layout};
use std::ffi::c_void;
use std::time::Instant;

/// Source array (row-major, f32) and the box copied out of it.
const BIG: [usize; 3] = [256, 512, 512];
const BOX: [usize; 3] = [192, 384, 400];
const OFF: [usize; 3] = [16, 32, 48];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Times `a` and `b` `n` times each on `state`, interleaved (ab, ba, ab, ...), after one
/// warm-up each; the medians in seconds.
fn time_pair<T>(
    n: usize,
    state: &mut T,
    mut a: impl FnMut(&mut T),
    mut b: impl FnMut(&mut T),
) -> (f64, f64) {
    a(state);
    b(state);
    let mut one = |f: &mut dyn FnMut(&mut T)| {
        let t = Instant::now();
        f(state);
        t.elapsed().as_secs_f64()
    };
    let (mut sa, mut sb) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        if i % 2 == 0 {
            sa.push(one(&mut a));
            sb.push(one(&mut b));
        } else {
            sb.push(one(&mut b));
            sa.push(one(&mut a));
        }
    }
    (median(sa), median(sb))
}

/// The AML layouts: the box inside the source, the dense destination.
fn aml_layouts(src: *mut c_void, dst: *mut c_void) -> (*mut AmlLayout, *mut AmlLayout) {
    let (mut whole, mut sub, mut dense) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: valid out-pointers and arrays of 3 dims; the buffers outlive the layouts.
    unsafe {
        assert_eq!(
            aml_layout_dense_create(
                &mut whole,
                src,
                1,
                4,
                3,
                BIG.as_ptr(),
                std::ptr::null(),
                std::ptr::null()
            ),
            0
        );
        assert_eq!(
            aml_layout_slice(
                whole,
                &mut sub,
                OFF.as_ptr(),
                BOX.as_ptr(),
                std::ptr::null()
            ),
            0
        );
        assert_eq!(
            aml_layout_dense_create(
                &mut dense,
                dst,
                1,
                4,
                3,
                BOX.as_ptr(),
                std::ptr::null(),
                std::ptr::null()
            ),
            0
        );
        aml_layout_destroy(&mut whole);
    }
    (sub, dense)
}

/// The Rust layouts of the same copy.
fn rust_layouts() -> (Layout, Layout) {
    let mut src = Layout::of::<f32>(&BIG).expect("layout");
    for (axis, (o, n)) in OFF.iter().zip(BOX).enumerate() {
        src = src.slice(axis, *o..o + n, 1).expect("slice");
    }
    (src, Layout::of::<f32>(&BOX).expect("layout"))
}

fn check(dst: &[f32], src: &[f32], what: &str) {
    let (b1, b2) = (BOX[1], BOX[2]);
    for (i, v) in dst.iter().enumerate() {
        let (x, y, z) = (i / (b1 * b2), (i / b2) % b1, i % b2);
        let s = ((x + OFF[0]) * BIG[1] + y + OFF[1]) * BIG[2] + z + OFF[2];
        assert_eq!(*v, src[s], "{what}: element {i}");
    }
}

fn report(what: &str, bytes: usize, aml: f64, rust: f64) {
    let gb = |t: f64| bytes as f64 / t / 1e9;
    println!(
        "{what:<34} AML {:>7.2} GB/s   Rust {:>7.2} GB/s   AML/Rust {:.3}",
        gb(aml),
        gb(rust),
        rust / aml
    );
}

fn cpu(n: usize) {
    let threads = ferry::engine::cpu::probe().default_threads;
    let src: Vec<f32> = (0..BIG.iter().product::<usize>())
        .map(|i| i as f32)
        .collect();
    let mut dst = vec![0f32; BOX.iter().product()];
    let bytes = dst.len() * 4;
    let mut dma: *mut AmlDma = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let rc = unsafe { aml::linux::aml_dma_linux_create(&mut dma, threads) };
    assert_eq!(rc, 0);
    let (sub, dense) = aml_layouts(src.as_ptr().cast_mut().cast(), dst.as_mut_ptr().cast());
    let engine = CpuEngine::new(threads).expect("engine");
    let (sl, dl) = rust_layouts();
    let aml_copy = |_: &mut Vec<f32>| {
        // SAFETY: live dma and layouts over live buffers (`dst` is not borrowed while this
        // runs), waited before returning.
        let rc = unsafe { aml_dma_copy_custom(dma, dense, sub, None, std::ptr::null_mut()) };
        assert_eq!(rc, 0);
    };
    let rust_copy = |dst: &mut Vec<f32>| {
        engine
            .scope(|s| -> ferry::Result<()> {
                Ok(s.copy(&mut dst[..], &dl, &src[..], &sl)?.wait()?)
            })
            .expect("copy");
    };
    // Each side checked on its own, then timed.
    for (what, copy) in [
        ("AML", &aml_copy as &dyn Fn(&mut Vec<f32>)),
        ("Rust", &rust_copy),
    ] {
        dst.fill(0.0);
        copy(&mut dst);
        check(&dst, &src, what);
    }
    let (aml, rust) = time_pair(n, &mut dst, aml_copy, rust_copy);
    report(&format!("cpu, {threads} threads"), bytes, aml, rust);
    // SAFETY: ours, not used afterwards.
    unsafe {
        aml_layout_destroy(&mut { sub });
        aml_layout_destroy(&mut { dense });
        aml::linux::aml_dma_linux_destroy(&mut dma);
    }
}

fn gpu(n: usize) {
    use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
    if ferry::cuda::probe().devices.is_empty() {
        println!("gpu: skipped: no CUDA driver or device");
        return;
    }
    let count: usize = BIG.iter().product();
    let mut host = PinnedBuffer::new(count * 4).expect("pinned");
    for (i, c) in host.chunks_exact_mut(4).enumerate() {
        c.copy_from_slice(&(i as f32).to_ne_bytes());
    }
    let boxed: usize = BOX.iter().product::<usize>() * 4;
    let mut dev = DeviceBuffer::new(0, boxed).expect("device");
    let mut dma: *mut AmlDma = std::ptr::null_mut();
    // SAFETY: a valid out-pointer (cudaMemcpyHostToDevice = 1).
    let rc = unsafe { aml::cuda::aml_dma_cuda_create(&mut dma, 1) };
    assert_eq!(rc, 0, "aml_dma_cuda_create");
    let (sub, dense) = aml_layouts(
        host.as_ptr().cast_mut().cast(),
        dev.device_ptr() as *mut c_void,
    );
    let src: Vec<f32> = host
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    let back = |dev: &DeviceBuffer| -> Vec<f32> {
        dev.to_vec()
            .expect("to_vec")
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    };
    let engine = CudaEngine::new(0).expect("engine");
    let (sl, dl) = rust_layouts();
    let aml_copy = |_: &mut DeviceBuffer| {
        // SAFETY: live dma and layouts over live buffers (`dev` is not borrowed while this
        // runs), waited before returning.
        let rc = unsafe { aml_dma_copy_custom(dma, dense, sub, None, std::ptr::null_mut()) };
        assert_eq!(rc, 0);
    };
    let rust_copy = |dev: &mut DeviceBuffer| {
        engine
            .scope(|s| -> ferry::Result<()> { Ok(s.copy(dev, &dl, &host, &sl)?.wait()?) })
            .expect("copy");
    };
    let zeros = vec![0u8; boxed];
    for (what, copy) in [
        ("AML", &aml_copy as &dyn Fn(&mut DeviceBuffer)),
        ("Rust", &rust_copy),
    ] {
        dev.copy_from_host(&zeros).expect("clear the device buffer");
        copy(&mut dev);
        check(&back(&dev), &src, what);
    }
    let (aml, rust) = time_pair(n, &mut dev, aml_copy, rust_copy);
    report("gpu, pinned host -> device", boxed, aml, rust);
    // SAFETY: ours, not used afterwards.
    unsafe {
        aml_layout_destroy(&mut { sub });
        aml_layout_destroy(&mut { dense });
        aml::cuda::aml_dma_cuda_destroy(&mut dma);
    }
}

fn main() {
    let n = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    println!(
        "strided 3-D copy: box {BOX:?} at {OFF:?} of a {BIG:?} f32 array into a dense array, median of {n}, AML and Rust samples interleaved"
    );
    cpu(n);
    gpu(n);
}
