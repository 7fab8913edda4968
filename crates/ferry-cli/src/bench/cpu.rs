//! CPU tests of `ferry bench`: the CPU engine next to plain-Rust baselines.
//!
//! Every bandwidth test compares the engine with two baselines measured in the same run on the
//! same buffers: one thread doing the obvious loop, and the same loop split into N chunks on N
//! `std::thread::scope` threads spawned per call (N = the engine's worker threads).

use super::ctx::{setup, threads_label, Ctx, HostSeries};
use super::data::{fill_pattern, first_diff, Placed};
use super::{BenchError, Kind, Method, Needs, Role, Row, TestInfo};
use crate::args::mem_available;
use crate::sizes::format_size;
use ferry::bytemuck::Pod;
use ferry::{CpuConfig, CpuEngine, Engine, EngineExt, Layout};
use half::bf16;
use std::hint::black_box;

/// The CPU tests.
pub static TESTS: &[TestInfo] = &[
    TestInfo::new("cpu-contig", "contiguous copy, vs copy_from_slice and N plain threads", Needs::Cpu, Kind::Bandwidth, "4K..256M"),
    TestInfo::new("cpu-tile", "2-D tile (4 KiB rows) out of a pitched matrix twice as wide, vs a row loop on 1 and N threads", Needs::Cpu, Kind::Bandwidth, "4K..256M"),
    TestInfo::new("cpu-transpose-f32", "transpose of an f32 matrix, vs a 32x32-blocked loop on 1 and N threads", Needs::Cpu, Kind::Bandwidth, "4K..64M"),
    TestInfo::new("cpu-transpose-f64", "transpose of an f64 matrix, vs a 32x32-blocked loop on 1 and N threads", Needs::Cpu, Kind::Bandwidth, "4K..64M"),
    TestInfo::new("cpu-transpose-bf16", "transpose of a bf16 matrix, vs a 32x32-blocked loop on 1 and N threads", Needs::Cpu, Kind::Bandwidth, "4K..64M"),
    TestInfo::new("cpu-latency", "submit+wait of one small copy, engine default (inline at submit), vs copy_from_slice", Needs::Cpu, Kind::Latency, "4,64,1K,4K,16K,64K"),
    TestInfo::new("cpu-latency-queued", "submit+wait of one small copy, inline off (CpuConfig::inline_bytes(0)), vs copy_from_slice", Needs::Cpu, Kind::Latency, "4,64,1K,4K,16K,64K"),
];

/// Row width of `cpu-tile`.
pub const TILE_ROW: usize = 4096;

/// Runs the CPU tests with one engine per configuration.
pub struct CpuBench {
    engine: CpuEngine,
    queued: Option<CpuEngine>,
    method: Method,
}

impl CpuBench {
    /// Starts the engine with `threads` workers and default chunk/inline sizes.
    pub fn new(threads: usize, method: Method) -> Result<CpuBench, BenchError> {
        let engine = CpuEngine::with_config(CpuConfig::new(threads)).map_err(setup)?;
        Ok(CpuBench {
            engine,
            queued: None,
            method,
        })
    }

    /// The default engine's settings.
    pub fn engine_config(&self) -> CpuConfig {
        self.engine.config()
    }

    /// Runs one test at one size.
    pub fn run(&mut self, test: &TestInfo, size: u64) -> Result<Row, BenchError> {
        let ctx = Ctx::new(test, size);
        let size = usize::try_from(size).map_err(|_| ctx.bad("larger than the address space"))?;
        // Buffers each test allocates, as a multiple of the size: source + destination (the
        // tile's source is twice as wide).
        let factor = if test.name == "cpu-tile" { 3 } else { 2 };
        let need = size
            .checked_mul(factor)
            .ok_or_else(|| ctx.bad("larger than the address space"))?;
        if let Some(avail) = mem_available() {
            if need as u64 > avail {
                return Err(ctx.bad(&format!(
                    "needs {} of memory, {} available",
                    format_size(need as u64),
                    format_size(avail)
                )));
            }
        }
        match test.name {
            "cpu-contig" => self.contig(&ctx, size),
            "cpu-tile" => self.tile(&ctx, size),
            "cpu-transpose-f32" => self.transpose::<f32>(&ctx, size),
            "cpu-transpose-f64" => self.transpose::<f64>(&ctx, size),
            "cpu-transpose-bf16" => self.transpose::<bf16>(&ctx, size),
            "cpu-latency" => self.latency(&ctx, size, false),
            "cpu-latency-queued" => self.latency(&ctx, size, true),
            _ => Err(BenchError::UnknownTest {
                name: test.name.to_string(),
                valid: TESTS.iter().map(|t| t.name).collect::<Vec<_>>().join(", "),
            }),
        }
    }

    fn threads(&self) -> usize {
        self.engine.config().threads.max(1)
    }

    /// `ferry cpu(N)`: the default engine's series name.
    fn ferry_name(&self) -> String {
        format!("ferry {}", self.engine.name())
    }

    fn contig(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let mut place = Placed::new(size, size, fill_pattern);
        let (src, dst) = place.parts();
        let n = self.threads();
        let verify = |d: &[u8]| first_diff(d, src);
        let mut s = HostSeries::new(ctx, &self.method, (dst, u8::POISON), size, verify);
        s.run(&self.ferry_name(), Role::Ferry, |d| {
            engine_memcpy(&self.engine, d, src)
        })?;
        s.run("copy_from_slice", Role::Baseline, |d| {
            d.copy_from_slice(black_box(src));
            Ok(())
        })?;
        let name = format!("{} copy_from_slice", threads_label(n));
        s.run(&name, Role::Baseline, |d| {
            par_copy(d, src, n);
            Ok(())
        })?;
        let series = s.done()?;
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            size as u64,
            "1-D contiguous".into(),
            series,
        ))
    }

    fn tile(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let (rows, w) = if size < TILE_ROW {
            (1, size)
        } else {
            (size / TILE_ROW, TILE_ROW)
        };
        let (pitch, off) = (2 * w, w / 2);
        let payload = rows * w;
        let mut place = Placed::new(rows * pitch, payload, fill_pattern);
        let (src, dst) = place.parts();
        let layout_err = |e: ferry::LayoutError| ctx.engine_err("layout", e.to_string());
        let src_l = Layout::contiguous(&[rows, pitch], 1)
            .and_then(|l| l.slice(1, off..off + w, 1))
            .map_err(layout_err)?;
        let dst_l = Layout::contiguous(&[rows, w], 1).map_err(layout_err)?;
        let row_src = |r: usize| &src[r * pitch + off..r * pitch + off + w];
        let verify = |d: &[u8]| {
            (0..rows)
                .find_map(|r| {
                    first_diff(&d[r * w..(r + 1) * w], row_src(r))
                        .err()
                        .map(|o| r * w + o)
                })
                .map_or(Ok(()), Err)
        };
        let n = self.threads();
        let per = rows.div_ceil(n);
        let mut s = HostSeries::new(ctx, &self.method, (dst, u8::POISON), payload, verify);
        s.run(&self.ferry_name(), Role::Ferry, |d| {
            engine_copy(&self.engine, d, &dst_l, src, &src_l)
        })?;
        s.run("row loop", Role::Baseline, |d| {
            for (r, out) in d.chunks_exact_mut(w).enumerate() {
                out.copy_from_slice(black_box(row_src(r)));
            }
            Ok(())
        })?;
        s.run(
            &format!("{} row loop", threads_label(n)),
            Role::Baseline,
            |d| {
                std::thread::scope(|s| {
                    for (k, part) in d.chunks_mut(per * w).enumerate() {
                        s.spawn(move || {
                            for (i, out) in part.chunks_exact_mut(w).enumerate() {
                                out.copy_from_slice(row_src(k * per + i));
                            }
                        });
                    }
                });
                Ok(())
            },
        )?;
        let shape = format!("{rows} rows x {w} B, source pitch {pitch} B");
        let series = s.done()?;
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            payload as u64,
            shape,
            series,
        ))
    }

    fn transpose<T: Elem>(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let es = std::mem::size_of::<T>();
        let count = size / es;
        if count == 0 {
            return Err(ctx.bad(&format!("smaller than one {es}-byte element")));
        }
        // n x m source (row-major), n a power of two near sqrt(count).
        let n = 1usize << (count.ilog2() / 2);
        let m = count / n;
        let payload = n * m * es;
        let mut place = Placed::new(n * m, n * m, |s: &mut [T]| {
            s.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = T::from_index(i))
        });
        let (src, dst) = place.parts();
        let layout_err = |e: ferry::LayoutError| ctx.engine_err("layout", e.to_string());
        let dst_l = Layout::contiguous(&[m, n], es).map_err(layout_err)?;
        let src_l = Layout::contiguous(&[n, m], es)
            .and_then(|l| l.transpose(0, 1))
            .map_err(layout_err)?;
        let verify = |d: &[T]| {
            for j in 0..m {
                for i in 0..n {
                    if d[j * n + i] != src[i * m + j] {
                        return Err((j * n + i) * es);
                    }
                }
            }
            Ok(())
        };
        let threads = self.threads();
        let per = m.div_ceil(threads);
        let mut s = HostSeries::new(ctx, &self.method, (dst, T::POISON), payload, verify);
        s.run(&self.ferry_name(), Role::Ferry, |d| {
            engine_copy(&self.engine, d, &dst_l, src, &src_l)
        })?;
        s.run("blocked 32x32", Role::Baseline, |d| {
            transpose_rows(black_box(d), src, n, m, 0);
            Ok(())
        })?;
        let name = format!("{} blocked", threads_label(threads));
        s.run(&name, Role::Baseline, |d| {
            std::thread::scope(|s| {
                for (k, part) in d.chunks_mut(per * n).enumerate() {
                    s.spawn(move || transpose_rows(part, src, n, m, k * per));
                }
            });
            Ok(())
        })?;
        let shape = format!("{n} x {m} -> {m} x {n}, {es} B elements");
        let series = s.done()?;
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            payload as u64,
            shape,
            series,
        ))
    }

    fn latency(&mut self, ctx: &Ctx, size: usize, queued: bool) -> Result<Row, BenchError> {
        if queued && self.queued.is_none() {
            let cfg = self.engine.config().inline_bytes(0);
            self.queued = Some(CpuEngine::with_config(cfg).map_err(setup)?);
        }
        let engine = if queued {
            self.queued.as_ref().unwrap_or(&self.engine)
        } else {
            &self.engine
        };
        let mut place = Placed::new(size, size, fill_pattern);
        let (src, dst) = place.parts();
        let verify = |d: &[u8]| first_diff(d, src);
        let inline = size <= engine.config().inline_bytes;
        let ferry_name = format!(
            "ferry {} {}",
            engine.name(),
            if inline { "inline" } else { "queued" }
        );
        let mut s = HostSeries::new(ctx, &self.method, (dst, u8::POISON), size, verify);
        s.run(&ferry_name, Role::Ferry, |d| engine_memcpy(engine, d, src))?;
        s.run("copy_from_slice", Role::Baseline, |d| {
            black_box(&mut *d).copy_from_slice(black_box(src));
            Ok(())
        })?;
        let shape = format!(
            "1-D contiguous, {}",
            if inline {
                "run inline at submit"
            } else {
                "queued to a worker"
            }
        );
        let series = s.done()?;
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            size as u64,
            shape,
            series,
        ))
    }
}

/// Element types of the test buffers.
trait Elem: Pod + Send + Sync + PartialEq {
    /// Written into destinations before each series.
    const POISON: Self;
    /// A distinct, finite value for index `i`.
    fn from_index(i: usize) -> Self;
}

impl Elem for u8 {
    const POISON: u8 = 0xA5;
    fn from_index(i: usize) -> u8 {
        (i.wrapping_mul(0x9E37_79B9) >> 11) as u8
    }
}
impl Elem for f32 {
    const POISON: f32 = -1.5;
    fn from_index(i: usize) -> f32 {
        (i & 0xFF_FFFF) as f32
    }
}
impl Elem for f64 {
    const POISON: f64 = -1.5;
    fn from_index(i: usize) -> f64 {
        i as f64
    }
}
impl Elem for bf16 {
    const POISON: bf16 = bf16::from_bits(0xBFC0); // -1.5
    /// The bit patterns 0..0x7F80 are the finite non-negative bf16 values, each distinct.
    fn from_index(i: usize) -> bf16 {
        bf16::from_bits((i % 0x7F80) as u16)
    }
}

/// One submit + wait through the safe scoped API: `memcpy` of the whole buffers.
fn engine_memcpy<T: Elem>(engine: &CpuEngine, dst: &mut [T], src: &[T]) -> Result<(), String> {
    let r = engine.scope(|s| -> Result<(), ferry::Error> { Ok(s.memcpy(dst, src)?.wait()?) });
    r.map_err(|e| e.to_string())
}

/// One submit + wait through the safe scoped API: `copy` between layouts built once per row
/// and passed by reference, as a caller would (copying two 296-byte `Option<Layout>`s per
/// call, as this function once did, cost the 4 KiB rows a store-forwarding stall that was
/// the bench's, not ferry's: issue 32).
fn engine_copy<T: Elem>(
    engine: &CpuEngine,
    dst: &mut [T],
    dst_l: &Layout,
    src: &[T],
    src_l: &Layout,
) -> Result<(), String> {
    let r = engine
        .scope(|s| -> Result<(), ferry::Error> { Ok(s.copy(dst, dst_l, src, src_l)?.wait()?) });
    r.map_err(|e| e.to_string())
}

/// `dst.copy_from_slice(src)` split into `n` chunks on `n` scoped threads.
fn par_copy(dst: &mut [u8], src: &[u8], n: usize) {
    let chunk = src.len().div_ceil(n).max(1);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

/// Writes rows `j0..` of the `m x n` transpose of the `n x m` matrix `src` into `dst`
/// (`dst.len() / n` rows), in 32 x 32 blocks.
fn transpose_rows<T: Copy>(dst: &mut [T], src: &[T], n: usize, m: usize, j0: usize) {
    const B: usize = 32;
    let rows = dst.len() / n;
    for jb in (0..rows).step_by(B) {
        for ib in (0..n).step_by(B) {
            for j in jb..(jb + B).min(rows) {
                for i in ib..(ib + B).min(n) {
                    dst[j * n + i] = src[i * m + j0 + j];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick() -> Method {
        Method {
            warmup: 1,
            samples: 2,
            min_sample_s: 0.0,
        }
    }

    #[test]
    fn sizes_beyond_memory_are_refused_not_allocated() {
        let mut b = CpuBench::new(1, quick()).unwrap();
        if mem_available().is_none() {
            eprintln!("skipped: /proc/meminfo not readable");
            return;
        }
        for t in TESTS {
            let e = b.run(t, 1 << 50).unwrap_err();
            assert!(matches!(e, BenchError::BadSize { .. }), "{e}");
            assert!(e.to_string().contains("available"), "{e}");
        }
    }

    #[test]
    fn every_cpu_test_runs_and_verifies() {
        let mut b = CpuBench::new(2, quick()).unwrap();
        for t in TESTS {
            for size in [4u64, 4096, 100_000, 1 << 20] {
                if t.name == "cpu-transpose-f64" && size == 4 {
                    assert!(matches!(b.run(t, size), Err(BenchError::BadSize { .. })));
                    continue;
                }
                let row = b
                    .run(t, size)
                    .unwrap_or_else(|e| panic!("{} {size}: {e}", t.name));
                assert_eq!(
                    row.series.len(),
                    if t.kind == Kind::Latency { 2 } else { 3 }
                );
                assert!(row
                    .series
                    .iter()
                    .all(|s| s.verified && s.median.is_finite() && s.median > 0.0));
                assert!(
                    row.ratio.is_finite() && row.payload_bytes <= size && row.payload_bytes > 0
                );
            }
        }
    }

    #[test]
    fn transpose_baseline_is_a_transpose() {
        let (n, m) = (3, 5);
        let src: Vec<u32> = (0..15).collect();
        let mut dst = vec![0u32; 15];
        transpose_rows(&mut dst, &src, n, m, 0);
        assert_eq!(&dst[..6], &[0, 5, 10, 1, 6, 11]);
        let mut part = vec![0u32; 6];
        transpose_rows(&mut part, &src, n, m, 2);
        assert_eq!(part, &dst[6..12]);
    }
}
