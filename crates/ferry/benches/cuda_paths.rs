//! Micro-benchmark of ferry's fast CUDA paths next to the raw driver, in one run:
//! - staged pageable copies (`engine::cuda::staged`) vs the driver's pageable copy vs a pinned
//!   copy, host -> device and device -> host, 16 MiB / 256 MiB / 1 GiB;
//! - segment gather/scatter (`engine::cuda::gather`) strategies vs one `cuMemcpyAsync` per
//!   segment, 1 KiB / 4 KiB / 64 KiB segments.
//!
//! Each figure: host clock around work that is complete when the clock stops (the staged copy
//! returns when done; the others are followed by a stream synchronize), after 2 warm-up runs,
//! median of `FERRY_BENCH_SAMPLES` (default 7) samples; the data is verified after. GB/s = 1e9 B/s.
//! Run: `cargo bench -p ferry --bench cuda_paths` (`FERRY_BENCH_SWEEP=1` adds more staging
//! configurations to the sweep).

use cudarc::driver::result as cu;
use cudarc::driver::{sys, CudaContext, CudaStream};
use ferry::engine::cuda::gather::{Gatherer, Segment, Strategy};
use ferry::engine::cuda::staged::{driver_present, Direction, Stager, StagingConfig};
use ferry::Plan;
use std::sync::Arc;
use std::time::Instant;

fn samples() -> usize {
    std::env::var("FERRY_BENCH_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7)
        .max(5)
}

/// Median seconds of `f` over the samples, after 2 warm-ups.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    f();
    let mut v: Vec<f64> = (0..samples())
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn gbs(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

struct Pinned(*mut u8, usize);
impl Pinned {
    fn new(len: usize) -> Pinned {
        // SAFETY: plain allocation, freed on drop.
        Pinned(
            unsafe { cu::malloc_host(len, 0) }.expect("cuMemHostAlloc") as *mut u8,
            len,
        )
    }
    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.0, self.1) }
    }
}
impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: from cuMemHostAlloc; all work synchronized.
        unsafe { cu::free_host(self.0 as *mut _) }.unwrap();
    }
}

struct Dev(u64, usize);
impl Dev {
    fn new(len: usize) -> Dev {
        // SAFETY: plain allocation, freed on drop.
        Dev(unsafe { cu::malloc_sync(len) }.expect("cuMemAlloc"), len)
    }
    fn read(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.1];
        // SAFETY: `self.1` bytes.
        unsafe { cu::memcpy_dtoh_sync(&mut v, self.0) }.unwrap();
        v
    }
    fn write(&self, d: &[u8]) {
        // SAFETY: `self.1` bytes.
        unsafe { cu::memcpy_htod_sync(self.0, d) }.unwrap();
    }
}
impl Drop for Dev {
    fn drop(&mut self) {
        // SAFETY: from cuMemAlloc; all work synchronized.
        unsafe { cu::free_sync(self.0) }.unwrap();
    }
}

fn fill(v: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
}

fn staged_rows(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    stager: &Stager,
    sizes: &[usize],
    baseline: bool,
    label: &str,
) {
    let cs = stream.cu_stream();
    for &n in sizes {
        let mut host = vec![0u8; n];
        fill(&mut host, n as u64);
        let mut back = vec![0u8; n];
        back.iter_mut().step_by(4096).for_each(|b| *b = 1); // touch every page
        let dev = Dev::new(n);
        let mut pinned = Pinned::new(n);
        pinned.slice().copy_from_slice(&host);
        ctx.bind_to_thread().unwrap();
        let plan = Plan::contiguous(0, 0, n);
        let mib = n >> 20;
        // H2D
        // SAFETY: `host` and `dev` hold `n` bytes each, distinct allocations of this context,
        // untouched by anything else during the copy; the stream is this context's.
        let t_ferry = time(|| unsafe {
            stager
                .copy(
                    stream,
                    Direction::HostToDevice,
                    dev.0,
                    host.as_ptr() as u64,
                    &plan,
                )
                .expect("staged h2d")
        });
        assert!(dev.read() == host, "staged h2d verification failed");
        if baseline {
            // SAFETY: `n` bytes at each end, alive until the synchronize; a live stream of
            // the current context.
            let t_page = time(|| unsafe {
                sys::cuMemcpyHtoDAsync_v2(dev.0, host.as_ptr() as *const _, n, cs)
                    .result()
                    .unwrap();
                stream.synchronize().unwrap();
            });
            // SAFETY: as above.
            let t_pin = time(|| unsafe {
                sys::cuMemcpyHtoDAsync_v2(dev.0, pinned.0 as *const _, n, cs)
                    .result()
                    .unwrap();
                stream.synchronize().unwrap();
            });
            row_staged("H2D", mib, n, t_ferry, t_page, t_pin);
        } else {
            println!("| H2D | {mib} MiB | {label} | {:.1} |", gbs(n, t_ferry));
        }
        // D2H
        // SAFETY: `dev` and `back` hold `n` bytes each, distinct allocations of this context,
        // untouched by anything else during the copy; the stream is this context's.
        let t_ferry = time(|| unsafe {
            stager
                .copy(
                    stream,
                    Direction::DeviceToHost,
                    back.as_mut_ptr() as u64,
                    dev.0,
                    &plan,
                )
                .expect("staged d2h")
        });
        assert!(back == host, "staged d2h verification failed");
        if baseline {
            // SAFETY: `n` bytes at each end, alive until the synchronize; a live stream of
            // the current context.
            let t_page = time(|| unsafe {
                sys::cuMemcpyDtoHAsync_v2(back.as_mut_ptr() as *mut _, dev.0, n, cs)
                    .result()
                    .unwrap();
                stream.synchronize().unwrap();
            });
            // SAFETY: as above.
            let t_pin = time(|| unsafe {
                sys::cuMemcpyDtoHAsync_v2(pinned.0 as *mut _, dev.0, n, cs)
                    .result()
                    .unwrap();
                stream.synchronize().unwrap();
            });
            row_staged("D2H", mib, n, t_ferry, t_page, t_pin);
        } else {
            println!("| D2H | {mib} MiB | {label} | {:.1} |", gbs(n, t_ferry));
        }
    }
}

fn row_staged(dir: &str, mib: usize, n: usize, f: f64, p: f64, q: f64) {
    let (f, p, q) = (gbs(n, f), gbs(n, p), gbs(n, q));
    println!(
        "| {dir} | {mib} MiB | {f:.1} | {p:.1} | {:.2}x | {q:.1} | {:.2} |",
        f / p,
        f / q
    );
}

#[derive(Clone, Copy, PartialEq)]
enum Mem {
    Pinned,
    Device,
}

fn gather_rows(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    g: &Gatherer,
    len: usize,
    n: usize,
    dst_kind: Mem,
    src_kind: Mem,
) {
    // Gather: source pieces scattered over a buffer twice the size (random order), destination
    // packed; scatter the other way round when the destination is the host.
    let packed = n * len;
    let spread = 2 * packed;
    let mut perm: Vec<u64> = (0..2 * n as u64).collect();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..perm.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        perm.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let scatter = dst_kind == Mem::Pinned;
    let segs: Vec<Segment> = (0..n)
        .map(|i| {
            let (a, b) = (i as u64 * len as u64, perm[i] * len as u64);
            if scatter {
                Segment::new(b, a, len as u64)
            } else {
                Segment::new(a, b, len as u64)
            }
        })
        .collect();
    let (dst_len, src_len) = if scatter {
        (spread, packed)
    } else {
        (packed, spread)
    };
    let mut src_data = vec![0u8; src_len];
    fill(&mut src_data, len as u64 ^ n as u64);
    let mut want = vec![0u8; dst_len];
    for s in &segs {
        want[s.dst_off as usize..(s.dst_off + s.len) as usize]
            .copy_from_slice(&src_data[s.src_off as usize..(s.src_off + s.len) as usize]);
    }
    ctx.bind_to_thread().unwrap();
    let mut hsrc = None;
    let mut dsrc = None;
    let src = match src_kind {
        Mem::Pinned => {
            let mut p = Pinned::new(src_len);
            p.slice().copy_from_slice(&src_data);
            let a = p.0 as u64;
            hsrc = Some(p);
            a
        }
        Mem::Device => {
            let d = Dev::new(src_len);
            d.write(&src_data);
            let a = d.0;
            dsrc = Some(d);
            a
        }
    };
    let mut hdst = None;
    let mut ddst = None;
    let dst = match dst_kind {
        Mem::Pinned => {
            let mut p = Pinned::new(dst_len);
            let a = p.0 as u64;
            p.slice().fill(0);
            hdst = Some(p);
            a
        }
        Mem::Device => {
            let d = Dev::new(dst_len);
            let a = d.0;
            ddst = Some(d);
            a
        }
    };
    let name = match (src_kind, dst_kind) {
        (Mem::Pinned, Mem::Device) => "pinned->device",
        (Mem::Device, Mem::Pinned) => "device->pinned",
        _ => "device->device",
    };
    let mut run = |s: Strategy| -> Option<(f64, Strategy)> {
        if s == Strategy::Batch && !Gatherer::batch_supported() {
            return None;
        }
        // Poison, then one checked copy.
        match (&mut hdst, &ddst) {
            (Some(p), _) => p.slice().fill(0x5A),
            (_, Some(d)) => d.write(&vec![0x5Au8; dst_len]),
            _ => unreachable!(),
        }
        // SAFETY: `dst` and `src` are distinct live buffers of `dst_len` and `src_len` bytes of
        // this context, synchronized below before they are read or reused.
        let used = match unsafe { g.copy(stream, dst, dst_len, src, src_len, &segs, s) } {
            Ok(u) => u,
            Err(e) => {
                println!("<!-- {s:?} {name} {len} B x {n}: {e} -->");
                return None;
            }
        };
        stream.synchronize().unwrap();
        let got = match (&mut hdst, &ddst) {
            (Some(p), _) => p.slice().to_vec(),
            (_, Some(d)) => d.read(),
            _ => unreachable!(),
        };
        // Only the segments are defined (packed sides are covered completely; spread ones in part).
        for sg in &segs {
            let r = sg.dst_off as usize..(sg.dst_off + sg.len) as usize;
            assert!(
                got[r.clone()] == want[r],
                "{s:?} {name} verification failed"
            );
        }
        let t = time(|| {
            // SAFETY: as above.
            unsafe { g.copy(stream, dst, dst_len, src, src_len, &segs, s) }.unwrap();
            stream.synchronize().unwrap();
        });
        Some((t, used))
    };
    let base = run(Strategy::PerSegment);
    let kern = run(Strategy::Kernel);
    let batch = run(Strategy::Batch);
    let auto = run(Strategy::Auto);
    let fmt = |r: Option<(f64, Strategy)>| match (r, base) {
        (Some((t, _)), Some((b, _))) => format!("{:.1} ({:.1}x)", gbs(packed, t), b / t),
        (Some((t, _)), None) => format!("{:.1}", gbs(packed, t)),
        _ => "n/a".into(),
    };
    let used = auto.map(|a| format!("{:?}", a.1)).unwrap_or_default();
    println!(
        "| {name} | {n} x {} | {} | {} | {} | {} ({used}) |",
        if len >= 1024 {
            format!("{} KiB", len >> 10)
        } else {
            format!("{len} B")
        },
        base.map(|b| format!("{:.2}", gbs(packed, b.0)))
            .unwrap_or("n/a".into()),
        fmt(kern),
        fmt(batch),
        fmt(auto),
    );
    drop((hsrc, dsrc));
}

fn main() {
    if !driver_present() {
        println!("skipped: no CUDA driver");
        return;
    }
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let stream = ctx.new_stream().unwrap();
    println!(
        "device: {} ({} samples per figure, median)",
        ctx.name().unwrap_or_default(),
        samples()
    );

    // Variations around the default staging configuration, 256 MiB.
    println!("\n| dir | size | config | staged GB/s |\n|---|---|---|---|");
    let base = StagingConfig::new();
    println!("default config: {base:?}");
    // (label, config, earlier fork-join pipeline)
    let mut variants = vec![
        ("default (flow)", base, false),
        ("fork-join", base, true),
        ("flow, NT h2d", base.non_temporal_h2d(true), false),
        ("flow, WC h2d ring", base.write_combined(true), false),
        ("flow, 8 threads", base.threads(8), false),
        ("flow, 16 threads", base.threads(16), false),
    ];
    if std::env::var("FERRY_BENCH_SWEEP").is_ok() {
        variants.extend([
            (
                "flow, 4 MiB x 8",
                base.chunk_bytes(4 << 20).ring_depth(8),
                false,
            ),
            (
                "flow, 8 MiB x 6",
                base.chunk_bytes(8 << 20).ring_depth(6),
                false,
            ),
            (
                "flow, 32 MiB x 3",
                base.chunk_bytes(32 << 20).ring_depth(3),
                false,
            ),
            (
                "flow, WC + NT h2d",
                base.write_combined(true).non_temporal_h2d(true),
                false,
            ),
            (
                "flow, 16 threads, NT h2d",
                base.threads(16).non_temporal_h2d(true),
                false,
            ),
            ("fork-join, NT h2d", base.non_temporal_h2d(true), true),
        ]);
    }
    for (label, cfg, fork_join) in variants {
        // The stager reads this once, when made (an A/B switch for this measurement only).
        std::env::set_var("FERRY_STAGING_FORKJOIN", if fork_join { "1" } else { "0" });
        let st = Stager::new(ctx.clone(), cfg).unwrap();
        std::env::remove_var("FERRY_STAGING_FORKJOIN");
        staged_rows(&ctx, &stream, &st, &[16 << 20, 256 << 20], false, label);
    }

    let stager = Stager::new(ctx.clone(), StagingConfig::new()).unwrap();
    println!("\nStaged pageable copies, {:?}", stager.config());
    println!("\n| dir | size | ferry staged GB/s | driver pageable GB/s | ferry/pageable | driver pinned GB/s | ferry/pinned |");
    println!("|---|---|---|---|---|---|---|");
    staged_rows(
        &ctx,
        &stream,
        &stager,
        &[16 << 20, 256 << 20, 1 << 30],
        true,
        "",
    );

    let g = Gatherer::new(ctx.clone()).unwrap();
    println!("\nSegment gather/scatter, GB/s of segment bytes (speed-up over one cuMemcpyAsync per segment)");
    println!("\n| direction | segments | per-segment calls | kernel | batch | auto (picked) |\n|---|---|---|---|---|---|");
    for (len, n) in [(1024usize, 100_000usize), (4096, 100_000), (65536, 16_384)] {
        gather_rows(&ctx, &stream, &g, len, n, Mem::Device, Mem::Pinned);
    }
    for (len, n) in [(4096usize, 100_000usize), (65536, 16_384)] {
        gather_rows(&ctx, &stream, &g, len, n, Mem::Pinned, Mem::Device);
        gather_rows(&ctx, &stream, &g, len, n, Mem::Device, Mem::Device);
    }
    // Few large segments, for the Auto threshold.
    gather_rows(&ctx, &stream, &g, 4 << 20, 64, Mem::Device, Mem::Pinned);
    gather_rows(&ctx, &stream, &g, 1 << 20, 256, Mem::Device, Mem::Pinned);
}
