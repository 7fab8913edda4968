//! `cuda-pipeline-upcompute` and `cuda-pipeline-pageable`; see the [parent](super).

use super::{
    compare, cu, failed, launch, run_once, setup, timed_pair, traced, verify, Bench, SLOTS,
};
use crate::bench::ctx::env_number;
use crate::bench::{measure, BenchError, Kind, Method, Role, Row, Series, TestInfo};
use crate::sizes::format_size;
use cudarc::driver::sys;
use ferry::cuda::{DeviceBuffer, PinnedBuffer};
use ferry::pipeline::{BounceFill, CudaPipeline, GpuChunk, OutLen, PipelineConfig, Source};

/// Zeroes `n` bytes of device memory at `d` (between series, so that each is checked on its
/// own output).
fn zero(b: &Bench, d: u64, n: usize) -> Result<(), BenchError> {
    b.ctx.bind_to_thread().map_err(setup)?;
    // SAFETY: `d` is a live device allocation of at least `n` bytes; synchronous, and nothing
    // else runs on it (every series synchronized before returning).
    let r = unsafe { sys::cuMemsetD8_v2(d, 0, n) };
    super::drv("cuMemsetD8", r).map_err(setup)
}

/// `cuda-pipeline-upcompute`: pinned -> device slot -> kernel writing a device array of the
/// source's length (no download). ferry vs a raw 2-stream event loop (the ratio), the
/// sequential copy-then-compute loop, the uploads alone and the kernels alone.
pub(super) fn upcompute(
    b: &Bench,
    test: &TestInfo,
    size: u64,
    method: &Method,
) -> Result<Row, BenchError> {
    let (n, rounds) = (b.n, b.rounds);
    let out = DeviceBuffer::new(0, n).map_err(setup)?;
    let out_ptr = out.device_ptr();
    let read_back = || out.to_vec().map_err(setup);
    let name = format!("ferry pipeline, upload + compute (K={SLOTS})");
    let stage = |g: &GpuChunk<'_>| {
        let c = g.chunk();
        launch(
            &b.f,
            g.stream(),
            g.input(),
            out_ptr + c.offset as u64,
            c.len,
            rounds,
        )
    };
    let cfg = PipelineConfig::new(b.chunk, SLOTS).output(OutLen::Fixed(0));
    let mut pipe = CudaPipeline::new(&b.engine, cfg).map_err(setup)?;
    let src = Source::new(&b.src);
    run_once(&mut pipe, src, None, &stage).map_err(failed(test.name, &name, size))?;
    let ferry_out = read_back()?;
    verify(test.name, &name, size, &b.src, &ferry_out, rounds)?;
    zero(b, out_ptr, n)?;

    // Sequential: copy a chunk in, wait, compute it, wait.
    let s = &b.s;
    let seq_name = "sequential copy-then-compute (raw, synchronized)";
    let seq_t = measure(method, || {
        for (i, off, len) in b.chunks() {
            let din = b.ins[i % SLOTS].device_ptr();
            b.h2d(din, off, len, s)?;
            cu(s.synchronize())?;
            launch(&b.f, s, din, out_ptr + off as u64, len, rounds)?;
            cu(s.synchronize())?;
        }
        Ok(())
    })
    .map_err(failed(test.name, seq_name, size))?;
    compare(test.name, seq_name, size, &read_back()?, &ferry_out)?;
    zero(b, out_ptr, n)?;

    // Raw loop: an upload stream and a compute stream, events reused per slot, ferry's
    // schedule (an upload into a slot waits for the kernel that last read it).
    let raw_name = "raw driver loop (2 streams, events)";
    let (up, comp) = (
        b.ctx.new_stream().map_err(setup)?,
        b.ctx.new_stream().map_err(setup)?,
    );
    let (uploaded, computed) = (b.new_events()?, b.new_events()?);
    let raw = || {
        for (i, off, len) in b.chunks() {
            let k = i % SLOTS;
            let din = b.ins[k].device_ptr();
            if i >= SLOTS {
                cu(up.wait(&computed[k]))?;
            }
            b.h2d(din, off, len, &up)?;
            cu(uploaded[k].record(&up))?;
            cu(comp.wait(&uploaded[k]))?;
            launch(&b.f, &comp, din, out_ptr + off as u64, len, rounds)?;
            cu(computed[k].record(&comp))?;
        }
        cu(comp.synchronize())
    };
    raw().map_err(failed(test.name, raw_name, size))?;
    compare(test.name, raw_name, size, &read_back()?, &ferry_out)?;
    zero(b, out_ptr, n)?;

    // ferry and the raw loop timed in turns (both write the same bytes).
    let (ferry_t, raw_t) = timed_pair(
        method,
        (test.name, size),
        (&name, || run_once(&mut pipe, src, None, &stage)),
        (raw_name, &raw),
    )?;
    // Each once more into a cleared array (either may have written it last), checked; ferry's
    // run is the traced one when tracing.
    zero(b, out_ptr, n)?;
    raw().map_err(failed(test.name, raw_name, size))?;
    compare(test.name, raw_name, size, &read_back()?, &ferry_out)?;
    zero(b, out_ptr, n)?;
    let timeline = traced(b, cfg, test.name, &name, size, src, None, &stage)?;
    if timeline.is_none() {
        run_once(&mut pipe, src, None, &stage).map_err(failed(test.name, &name, size))?;
    }
    compare(test.name, &name, size, &read_back()?, &ferry_out)?;

    // The two totals the overlap is measured against: every upload alone, every kernel alone
    // (one stream each, host clock, synchronized once).
    let copy_t = measure(method, || {
        for (i, off, len) in b.chunks() {
            b.h2d(b.ins[i % SLOTS].device_ptr(), off, len, s)?;
        }
        cu(s.synchronize())
    })
    .map_err(failed(test.name, "uploads alone", size))?;
    let kernel_t = measure(method, || {
        for (i, off, len) in b.chunks() {
            let din = b.ins[i % SLOTS].device_ptr();
            launch(&b.f, s, din, out_ptr + off as u64, len, rounds)?;
        }
        cu(s.synchronize())
    })
    .map_err(failed(test.name, "kernels alone", size))?;
    let (total, copy, kernel) = (ferry_t.median_s, copy_t.median_s, kernel_t.median_s);
    let what = format!(
        "upload + compute, no download; uploads alone {:.0} us, kernels alone {:.0} us; ferry total / max(copy, compute) = {:.3} (target <= 1.05); sequential / ferry = {:.2} (target >= 1.8)",
        copy * 1e6,
        kernel * 1e6,
        total / copy.max(kernel).max(1e-12),
        seq_t.median_s / total.max(1e-12),
    );
    Ok(Row::new(
        test.name,
        Kind::Bandwidth,
        size,
        size,
        b.shape(&what, timeline.as_ref()),
        vec![
            Series::new(name, Role::Ferry, Kind::Bandwidth, size, ferry_t),
            Series::new(seq_name, Role::Baseline, Kind::Bandwidth, size, seq_t),
            Series::new(raw_name, Role::Baseline, Kind::Bandwidth, size, raw_t),
        ],
    ))
}

/// `cuda-pipeline-pageable`: the 3-step pipeline from a pageable copy of the source, against
/// the same pipeline from the pinned source (the row's ratio: pageable / pinned).
pub(super) fn pageable(
    b: &Bench,
    test: &TestInfo,
    size: u64,
    method: &Method,
) -> Result<Row, BenchError> {
    let pageable_src: Vec<u8> = b.src.to_vec();
    let cfg = source_cfg(b)?;
    let what = format!(
        "pageable source (Vec<u8>) -> pinned bounce buffers (filled ahead by {} threads, FERRY_BENCH_FILL_THREADS; pieces of 256 KiB or fewer, FERRY_BENCH_FILL) -> device slots, pinned destination; ratio: pageable / pinned source (target >= 0.9)",
        cfg.effective_fill_threads()
    );
    let src = Source::new(&pageable_src);
    against_pinned(b, test, size, method, cfg, src, "pageable", &what)
}

/// `cuda-pipeline-file`: the 3-step pipeline from a file (written just before, so read from
/// the page cache: the path's speed, not the disk's) through a file engine with the default
/// config moving chunks to the device slots with the pipeline's engine, against the same
/// pipeline from the pinned source holding the same bytes (the row's ratio: file / pinned).
pub(super) fn file(
    b: &Bench,
    test: &TestInfo,
    size: u64,
    method: &Method,
) -> Result<Row, BenchError> {
    use ferry::file::{FileConfig, FileEngine, OpenMode};
    use std::io::Write;
    let mut tf = tempfile::NamedTempFile::new().map_err(setup)?;
    tf.write_all(&b.src)
        .and_then(|()| tf.flush())
        .map_err(setup)?;
    // Each chunk is one read into a pinned bounce buffer: pieces of 1/16 of it keep every
    // file worker busy on it (the default 4 MiB pieces gave a 4-8 MiB chunk 1-2 workers).
    let fcfg = FileConfig::new().chunk_bytes((b.chunk / 16).max(256 << 10));
    let files = FileEngine::with_engine(fcfg, b.engine.clone()).map_err(setup)?;
    let handle = files.open(tf.path(), OpenMode::Read).map_err(setup)?;
    let what = format!(
        "file in the page cache -> file engine ({} threads, {} pieces) -> pinned bounce buffers -> device slots, pinned destination; ratio: file / pinned source (target >= 0.9)",
        files.config().threads,
        format_size(files.config().chunk_bytes as u64)
    );
    let src = Source::file(&files, &handle, 0, b.n).map_err(setup)?;
    against_pinned(b, test, size, method, source_cfg(b)?, src, "file", &what)
}

/// The pipeline settings of the rows from a source that is filled into bounce buffers:
/// `FERRY_BENCH_BOUNCE=N` gives N bounce buffers instead of the automatic count
/// (`PipelineConfig::bounce_count`), `FERRY_BENCH_FILL_THREADS=N` N fill threads for a pageable
/// source (`PipelineConfig::fill_threads`), `FERRY_BENCH_FILL` the fill's mode ([`bounce_fill`]),
/// `FERRY_BENCH_FILL_PRIVATE=1` the fills on workers of the pipeline's own
/// (`ferry::bench::private_fill_workers`), to compare settings on one host.
fn source_cfg(b: &Bench) -> Result<PipelineConfig, BenchError> {
    let bounce = env_number("FERRY_BENCH_BOUNCE", "a number of bounce buffers")?;
    let threads = env_number("FERRY_BENCH_FILL_THREADS", "a number of fill threads")?;
    let private = env_number::<u8>("FERRY_BENCH_FILL_PRIVATE", "0 or 1")?;
    ferry::bench::private_fill_workers(private.unwrap_or(0) != 0);
    Ok(PipelineConfig::new(b.chunk, SLOTS)
        .bounce(bounce.unwrap_or(0))
        .bounce_fill(bounce_fill()?)
        .fill_threads(threads.unwrap_or(0)))
}

/// The 3-step pipeline with `cfg` from `src` and from the pinned source holding the same
/// bytes, each into its own destination, each checked, then timed in turns ([`timed_pair`];
/// `src`'s run traced): one row, `src` as ferry's series and the pinned source as its
/// baseline. `label` names the source in the series.
#[allow(clippy::too_many_arguments)]
fn against_pinned(
    b: &Bench,
    test: &TestInfo,
    size: u64,
    method: &Method,
    cfg: PipelineConfig,
    src: Source<'_>,
    label: &str,
    what: &str,
) -> Result<Row, BenchError> {
    let rounds = b.rounds;
    let mut dst = PinnedBuffer::new(b.n).map_err(setup)?;
    let stage = |g: &GpuChunk<'_>| {
        let out = g.output().ok_or("no output slot")?;
        launch(&b.f, g.stream(), g.input(), out, g.chunk().len, rounds)
    };
    let name = format!("ferry pipeline, {label} source (K={SLOTS})");
    let pinned_name = format!("ferry pipeline, pinned source (K={SLOTS})");
    let pinned_src = Source::new(&b.src);
    let mut pipe = CudaPipeline::new(&b.engine, cfg).map_err(setup)?;
    let mut pinned_pipe = CudaPipeline::new(&b.engine, cfg).map_err(setup)?;
    // Each into its own destination, checked there first, then both timed in turns.
    let mut pinned_dst = PinnedBuffer::new(b.n).map_err(setup)?;
    for (name, pipe, src, dst) in [
        (&name, &mut pipe, src, &mut dst),
        (&pinned_name, &mut pinned_pipe, pinned_src, &mut pinned_dst),
    ] {
        dst.fill(0);
        run_once(pipe, src, Some(dst), &stage).map_err(failed(test.name, name, size))?;
        verify(test.name, name, size, &b.src, dst, rounds)?;
    }
    let (t, pinned_t) = timed_pair(
        method,
        (test.name, size),
        (&name, || run_once(&mut pipe, src, Some(&mut dst), &stage)),
        (&pinned_name, || {
            run_once(&mut pinned_pipe, pinned_src, Some(&mut pinned_dst), &stage)
        }),
    )?;
    verify(test.name, &name, size, &b.src, &dst, rounds)?;
    verify(test.name, &pinned_name, size, &b.src, &pinned_dst, rounds)?;
    dst.fill(0);
    let timeline = traced(b, cfg, test.name, &name, size, src, Some(&mut dst), &stage)?;
    if timeline.is_some() {
        verify(test.name, &name, size, &b.src, &dst, rounds)?;
    }
    let series = vec![
        Series::new(name, Role::Ferry, Kind::Bandwidth, size, t),
        Series::new(pinned_name, Role::Baseline, Kind::Bandwidth, size, pinned_t),
    ];
    Ok(Row::new(
        test.name,
        Kind::Bandwidth,
        size,
        size,
        b.shape(what, timeline.as_ref()),
        series,
    ))
}

/// `FERRY_BENCH_FILL=N`: how the pageable source's bounce buffers are filled, to compare the
/// ways on one host in one run ([`BounceFill`]), a sum of 1 (pieces spread over every fill
/// worker), 2 (the submitting thread copies pieces of the fill it waits for) and 4 (the last
/// chunks' fills demote their lines to the shared cache): 0 is the oldest way, 3 the default
/// before the demoted ends, 7 the default (also when unset).
fn bounce_fill() -> Result<BounceFill, BenchError> {
    const WHAT: &str =
        "a fill mode 0-7 (1: spread pieces, 2: the submitting thread helps, 4: demoted ends)";
    match env_number::<u8>("FERRY_BENCH_FILL", WHAT)? {
        None => Ok(BounceFill::default()),
        Some(n @ 0..=7) => Ok(BounceFill {
            spread: n & 1 != 0,
            help: n & 2 != 0,
            demote_last: n & 4 != 0,
        }),
        Some(n) => Err(BenchError::Setup(format!(
            "$FERRY_BENCH_FILL=\"{n}\" is not {WHAT}"
        ))),
    }
}
