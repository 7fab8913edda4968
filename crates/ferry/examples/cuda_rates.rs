//! Measures the CUDA engine's copy rates and small-copy latency on device 0 (host clock around
//! submit + wait, median of repetitions after a warm-up). Prints `skipped: no CUDA driver`
//! without a GPU. Run: `cargo run --release --example cuda_rates`.
//!
//! Seen on one H200 host (PCIe 5.0 x16, driver 580, CUDA 13.0), 2026-12-02, through
//! `scripts/gpu-bundle.sh` + `run.sh` (GB/s = 1e9 B/s):
//!
//! | 256 MiB | H2D pinned | D2H pinned | H2D pageable | D2H pageable | D2D | H2D+D2H |
//! |---|---|---|---|---|---|---|
//! | ferry | 53.8 | 53.8 | 6.7 | 11.6 | 1515 | 97.1 |
//!
//! 2-D 256 B rows at 1 KiB pitch: H2D 50.2, D2H 49.7; 3-D box H2D 52.1. 4 KiB pinned H2D
//! submit+wait: Blocking 27.65 us, Spin 9.10 us, SpinThenBlock(50 us) 10.08 us.

use ferry::cuda::{CudaConfig, CudaEngine, DeviceBuffer, PinnedBuffer, WaitMode};
use ferry::{EngineExt, Layout, Memory, MemoryMut};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median seconds of `reps` runs of `f` after 2 warm-ups.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    f();
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn copy<D: MemoryMut + ?Sized, S: Memory + ?Sized>(
    e: &CudaEngine,
    d: &mut D,
    dl: &Layout,
    s: &S,
    sl: &Layout,
) {
    e.scope(|sc| sc.copy(d, dl, s, sl).unwrap().wait().unwrap())
        .unwrap();
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if ferry::cuda::probe().driver.is_err() {
        println!("skipped: no CUDA driver");
        return Ok(());
    }
    let e = CudaEngine::new(0)?;
    let n = 256 << 20;
    let l = Layout::bytes(n)?;
    let gbs = |secs: f64, bytes: usize| bytes as f64 / secs / 1e9;
    let mut pinned = PinnedBuffer::new(n)?;
    pinned
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i as u8);
    let mut pinned2 = PinnedBuffer::new(n)?;
    let mut pageable = vec![1u8; n];
    let mut dev = DeviceBuffer::new(0, n)?;
    let mut dev2 = DeviceBuffer::new(0, n)?;
    println!("256 MiB copies, GB/s (1e9 B/s), median of 10, host clock around submit+wait:");
    let t = time(10, || copy(&e, &mut dev, &l, &pinned, &l));
    println!("  H2D pinned    {:7.1}", gbs(t, n));
    let t = time(10, || copy(&e, &mut pinned2, &l, &dev, &l));
    println!("  D2H pinned    {:7.1}", gbs(t, n));
    let t = time(10, || copy(&e, &mut dev, &l, &pageable, &l));
    println!("  H2D pageable  {:7.1}", gbs(t, n));
    let t = time(10, || copy(&e, &mut pageable, &l, &dev, &l));
    println!("  D2H pageable  {:7.1}", gbs(t, n));
    let t = time(10, || copy(&e, &mut dev2, &l, &dev, &l));
    println!("  D2D           {:7.1}  (bytes copied / time)", gbs(t, n));
    let t = time(10, || {
        e.scope(|s| {
            let a = s.memcpy(&mut dev2, &pinned).unwrap();
            let b = s.memcpy(&mut pinned2, &dev).unwrap();
            a.wait().unwrap();
            b.wait().unwrap();
        })
        .unwrap()
    });
    println!(
        "  H2D+D2H       {:7.1}  (both directions at once, total bytes / time)",
        gbs(t, 2 * n)
    );

    // Strided: 256-byte rows at a 1024-byte pitch (64 MiB payload), and a 3-D box.
    let rows = 256 << 10;
    let src2 = Layout::pitched(&[rows, 1024], 1, 1024)?.slice(1, 0..256, 1)?;
    let dst2 = Layout::contiguous(&[rows, 256], 1)?;
    let t = time(10, || copy(&e, &mut dev, &dst2, &pinned, &src2));
    println!(
        "  2-D H2D 256 B rows, pitch 1 KiB: {:7.1}",
        gbs(t, rows * 256)
    );
    let t = time(10, || copy(&e, &mut pinned2, &src2, &dev, &dst2));
    println!(
        "  2-D D2H 256 B rows, pitch 1 KiB: {:7.1}",
        gbs(t, rows * 256)
    );
    let vol = Layout::contiguous(&[64, 1024, 4096], 1)?;
    let bx = vol
        .slice(0, 0..64, 1)?
        .slice(1, 0..1000, 1)?
        .slice(2, 0..2048, 1)?;
    let dbx = Layout::contiguous(&[64, 1000, 2048], 1)?;
    let t = time(10, || copy(&e, &mut dev, &dbx, &pinned, &bx));
    println!(
        "  3-D H2D box 64x1000x2048 B out of 64x1024x4096: {:7.1}",
        gbs(t, 64 * 1000 * 2048)
    );

    // Small copies: 4 KiB pinned H2D submitted and waited, per wait mode.
    let small = Layout::bytes(4096)?;
    for mode in [
        WaitMode::Blocking,
        WaitMode::Spin,
        WaitMode::SpinThenBlock(std::time::Duration::from_micros(50)),
    ] {
        let e = CudaEngine::with_config(CudaConfig::new(0).wait_mode(mode))?;
        let mut one = DeviceBuffer::new(0, 4096)?;
        let h = PinnedBuffer::new(4096)?;
        let t = time(2000, || copy(&e, &mut one, &small, &h, &small));
        println!(
            "4 KiB pinned H2D submit+wait, {mode:?}: {:.2} us (median of 2000)",
            t * 1e6
        );
    }
    Ok(())
}
