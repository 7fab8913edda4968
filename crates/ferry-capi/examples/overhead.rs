//! What the C interface costs over the Rust engine API, in one run on the CPU engine:
//! per-request cost of a small copy (create + wait) and the rate of a large one, through
//! `ferry::Engine::submit_raw` and through `ferry_dma_request_create`/`ferry_request_wait`,
//! next to a plain `copy_from_slice`. Median of `REPS` samples.
//!
//! `cargo run --release -p ferry-capi --example overhead [small_bytes] [big_mib]`

use ferry::{CpuEngine, Engine, Job, Layout, MemKind, RawBuf};
use ferry_capi::*;
use std::ptr::{null, null_mut};
use std::time::Instant;

const REPS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let small: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let big_mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let big = big_mib << 20;
    let threads = 2;
    let n = 20_000;

    let src = vec![7u8; big];
    let mut dst = vec![0u8; big];
    let engine = CpuEngine::new(threads).expect("cpu engine");
    let mut dma = null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { ferry_dma_cpu_create(&mut dma, threads as i32) }, 0);

    let rust_job = |len: usize, dst: &mut [u8], src: &[u8]| {
        let l = Layout::bytes(len).unwrap();
        Job::copy(
            RawBuf::host(dst.as_mut_ptr(), len, MemKind::Pageable),
            l,
            RawBuf::host(src.as_ptr(), len, MemKind::Pageable),
            l,
        )
    };
    let c_copy = |dma, len: usize, dst: &mut [u8], src: &[u8]| {
        let mut r = null_mut();
        // SAFETY: the buffers outlive the request, which is waited at once.
        unsafe {
            let rc = ferry_dma_request_create(
                dma,
                &mut r,
                dst.as_mut_ptr().cast(),
                len,
                null(),
                src.as_ptr().cast(),
                len,
                null(),
                &ferry_op_memcpy,
                null_mut(),
            );
            assert_eq!(rc, 0);
            assert_eq!(ferry_request_wait(dma, &mut r), 0);
        }
    };

    let (mut plain_s, mut rust_s, mut c_s) = (vec![], vec![], vec![]);
    for _ in 0..REPS {
        let t = Instant::now();
        for _ in 0..n {
            dst[..small].copy_from_slice(&src[..small]);
            std::hint::black_box(&mut dst);
        }
        plain_s.push(t.elapsed().as_secs_f64() / n as f64);
        let t = Instant::now();
        for _ in 0..n {
            // SAFETY: the buffers outlive the request, which is waited at once.
            unsafe { engine.submit_raw(rust_job(small, &mut dst, &src)) }
                .unwrap()
                .wait()
                .unwrap();
        }
        rust_s.push(t.elapsed().as_secs_f64() / n as f64);
        let t = Instant::now();
        for _ in 0..n {
            c_copy(dma, small, &mut dst, &src);
        }
        c_s.push(t.elapsed().as_secs_f64() / n as f64);
    }
    let (p, r, c) = (
        median(plain_s) * 1e6,
        median(rust_s) * 1e6,
        median(c_s) * 1e6,
    );
    println!("{small} B copy, create+wait, median of {REPS} x {n}: copy_from_slice {p:.3} us, Rust submit_raw {r:.3} us, C API {c:.3} us (C/Rust {:.2}x, C - Rust {:+.3} us)", c / r, c - r);

    let (mut plain_b, mut rust_b, mut c_b) = (vec![], vec![], vec![]);
    for _ in 0..REPS {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        plain_b.push(big as f64 / t.elapsed().as_secs_f64() / 1e9);
        let t = Instant::now();
        // SAFETY: as above.
        unsafe { engine.submit_raw(rust_job(big, &mut dst, &src)) }
            .unwrap()
            .wait()
            .unwrap();
        rust_b.push(big as f64 / t.elapsed().as_secs_f64() / 1e9);
        let t = Instant::now();
        c_copy(dma, big, &mut dst, &src);
        c_b.push(big as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    let (p, r, c) = (median(plain_b), median(rust_b), median(c_b));
    println!("{big_mib} MiB copy, {threads} workers, median of {REPS}: copy_from_slice {p:.2} GB/s, Rust submit_raw {r:.2} GB/s, C API {c:.2} GB/s (C/Rust {:.2}x)", c / r);
    assert!(dst.iter().all(|&b| b == 7));
    // SAFETY: a live dma.
    assert_eq!(unsafe { ferry_dma_destroy(&mut dma) }, 0);
}
