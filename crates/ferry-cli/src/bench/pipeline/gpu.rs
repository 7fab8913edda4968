//! `cuda-pipeline`: ferry's GPU pipeline, the sequential loop and a raw driver loop on the same
//! pinned buffers, the kernel's rounds calibrated so that compute and copy of a chunk balance.

use super::{failed, keep_trace, mismatch, tracing, verify, SLOTS};
use crate::bench::data::pattern_bytes;
use crate::bench::{measure, BenchError, Kind, Method, Role, Row, Series, TestInfo};
use crate::sizes::format_size;
use cudarc::driver::{sys, CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
use ferry::pipeline::{CudaPipeline, Dest, GpuChunk, PipelineConfig, Source};
use ferry::Memory;
use std::sync::Arc;

const KERNEL: &str = r#"
extern "C" __global__ void lcg(const unsigned char* in, unsigned char* out, unsigned long long n, unsigned int rounds) {
    for (unsigned long long j = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; j < n;
         j += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned int x = in[j];
        for (unsigned int r = 0; r < rounds; ++r) x = x * 1664525u + 1013904223u;
        out[j] = (unsigned char)(x >> 24);
    }
}
"#;

fn setup(e: impl std::fmt::Display) -> BenchError {
    BenchError::Setup(e.to_string())
}

fn launch_cfg(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 132 * 16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Enqueues the kernel on `s`: `n` bytes from `input` to `out`.
fn launch(
    f: &CudaFunction,
    s: &CudaStream,
    input: u64,
    out: u64,
    n: usize,
    rounds: u32,
) -> Result<(), String> {
    let n64 = n as u64;
    // SAFETY: callers pass device addresses of at least `n` bytes, alive until the stream is
    // synchronized.
    unsafe {
        s.launch_builder(f)
            .arg(&input)
            .arg(&out)
            .arg(&n64)
            .arg(&rounds)
            .launch(launch_cfg(n))
    }
    .map(drop)
    .map_err(|e| e.to_string())
}

/// The first byte where a baseline's output differs from ferry's (verified) output.
fn compare(test: &str, series: &str, size: u64, got: &[u8], want: &[u8]) -> Result<(), BenchError> {
    mismatch(
        test,
        series,
        size,
        got.iter().zip(want).position(|(a, b)| a != b),
    )
}

fn drv(call: &'static str, r: sys::CUresult) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {r:?}"))
    }
}

/// The raw baseline's pieces: three streams and K reused events per edge.
struct Raw {
    up: Arc<CudaStream>,
    comp: Arc<CudaStream>,
    down: Arc<CudaStream>,
    uploaded: Vec<CudaEvent>,
    computed: Vec<CudaEvent>,
    downloaded: Vec<CudaEvent>,
}

pub(super) fn run(test: &TestInfo, size: u64, method: &Method) -> Result<Row, BenchError> {
    let n = size as usize;
    let chunk = (n / 16).max(1);
    let engine = CudaEngine::new(0).map_err(setup)?;
    let ctx = Arc::clone(engine.context());
    let ptx = cudarc::nvrtc::compile_ptx(KERNEL).map_err(|e| setup(format!("{e:?}")))?;
    let f = ctx
        .load_module(ptx)
        .and_then(|m| m.load_function("lcg"))
        .map_err(setup)?;
    let mut src = PinnedBuffer::new(n).map_err(setup)?;
    src.copy_from_slice(&pattern_bytes(n));
    let mut dst = PinnedBuffer::new(n).map_err(setup)?;
    let fail = |s: &str| failed(test.name, s, size);

    // Calibrate: one chunk's upload against the kernel at 64 rounds, host clock, synchronized.
    let s = ctx.new_stream().map_err(setup)?;
    let (din, dout) = (
        DeviceBuffer::new(0, chunk).map_err(setup)?,
        DeviceBuffer::new(0, chunk).map_err(setup)?,
    );
    let time = |f: &mut dyn FnMut() -> Result<(), String>| -> Result<f64, String> {
        f()?;
        let t = std::time::Instant::now();
        for _ in 0..5 {
            f()?;
        }
        Ok(t.elapsed().as_secs_f64() / 5.0)
    };
    let t_copy = time(&mut || {
        // SAFETY: `din` holds `chunk` bytes, `src` at least that; synchronized below.
        drv("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                din.device_ptr(),
                src.raw().addr as *const _,
                chunk,
                s.cu_stream(),
            )
        })?;
        s.synchronize().map_err(|e| e.to_string())
    })
    .map_err(fail("calibration"))?;
    let t_k = time(&mut || {
        launch(&f, &s, din.device_ptr(), dout.device_ptr(), chunk, 64)?;
        s.synchronize().map_err(|e| e.to_string())
    })
    .map_err(fail("calibration"))?;
    let rounds = ((64.0 * t_copy / t_k.max(1e-9)) as u32).clamp(1, 1 << 20);
    drop((din, dout));

    // ferry's pipeline.
    let name = format!("ferry pipeline (K={SLOTS})");
    let cfg = PipelineConfig::new(chunk, SLOTS);
    let mut pipe = CudaPipeline::new(&engine, cfg).map_err(setup)?;
    let stage = |g: &GpuChunk<'_>| {
        let out = g.output().ok_or("no output slot")?;
        launch(&f, g.stream(), g.input(), out, g.chunk().len, rounds)
    };
    let ferry_t = measure(method, || {
        pipe.run(Source::new(&src), Some(Dest::new(&mut dst)), stage)
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .map_err(fail(&name))?;
    verify(test.name, &name, size, &src, &dst, rounds)?;
    let ferry_out = dst.to_vec();
    if tracing() {
        let mut p = CudaPipeline::new(&engine, cfg.timeline(true)).map_err(setup)?;
        let rep = p
            .run(Source::new(&src), Some(Dest::new(&mut dst)), stage)
            .map_err(|e| fail(&name)(e.to_string()))?;
        if let Some(t) = rep.timeline {
            keep_trace(format!("{} {}", test.name, format_size(size)), t);
        }
    }
    drop(pipe);
    dst.fill(0);

    // Slots for the baselines.
    let ins: Vec<DeviceBuffer> = (0..SLOTS)
        .map(|_| DeviceBuffer::new(0, chunk))
        .collect::<Result<_, _>>()
        .map_err(setup)?;
    let outs: Vec<DeviceBuffer> = (0..SLOTS)
        .map(|_| DeviceBuffer::new(0, chunk))
        .collect::<Result<_, _>>()
        .map_err(setup)?;
    let (src_addr, dst_addr) = (src.raw().addr, {
        use ferry::MemoryMut;
        dst.raw_mut().addr
    });
    let h2d = |d: u64, off: usize, len: usize, st: &CudaStream| {
        // SAFETY: `d` is a slot of `chunk` >= len bytes, `src` holds `off + len`; every caller
        // synchronizes before the buffers go.
        drv("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(d, (src_addr + off as u64) as *const _, len, st.cu_stream())
        })
    };
    let d2h = |off: usize, d: u64, len: usize, st: &CudaStream| {
        // SAFETY: as above, into `dst`.
        drv("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2((dst_addr + off as u64) as *mut _, d, len, st.cu_stream())
        })
    };

    // Sequential: copy in, compute, copy out, each waited for.
    let seq_name = "sequential copy-compute-copy (raw, synchronized)";
    let seq_t = measure(method, || {
        for (i, off) in (0..n).step_by(chunk).enumerate() {
            let len = chunk.min(n - off);
            let (din, dout) = (ins[i % SLOTS].device_ptr(), outs[i % SLOTS].device_ptr());
            h2d(din, off, len, &s)?;
            s.synchronize().map_err(|e| e.to_string())?;
            launch(&f, &s, din, dout, len, rounds)?;
            s.synchronize().map_err(|e| e.to_string())?;
            d2h(off, dout, len, &s)?;
            s.synchronize().map_err(|e| e.to_string())?;
        }
        Ok(())
    })
    .map_err(fail(seq_name))?;
    compare(test.name, seq_name, size, &dst, &ferry_out)?;
    dst.fill(0);

    // Raw loop: three streams, events reused per slot, the same schedule as ferry's.
    let raw_name = "raw driver loop (3 streams, events)";
    let ev = || ctx.new_event(None).map_err(setup);
    let stream = || ctx.new_stream().map_err(setup);
    let raw = Raw {
        up: stream()?,
        comp: stream()?,
        down: stream()?,
        uploaded: (0..SLOTS).map(|_| ev()).collect::<Result<_, _>>()?,
        computed: (0..SLOTS).map(|_| ev()).collect::<Result<_, _>>()?,
        downloaded: (0..SLOTS).map(|_| ev()).collect::<Result<_, _>>()?,
    };
    let e = |r: Result<(), cudarc::driver::DriverError>| r.map_err(|e| e.to_string());
    let raw_t = measure(method, || {
        for (i, off) in (0..n).step_by(chunk).enumerate() {
            let (k, len) = (i % SLOTS, chunk.min(n - off));
            let (din, dout) = (ins[k].device_ptr(), outs[k].device_ptr());
            if i >= SLOTS {
                e(raw.up.wait(&raw.computed[k]))?;
            }
            h2d(din, off, len, &raw.up)?;
            e(raw.uploaded[k].record(&raw.up))?;
            e(raw.comp.wait(&raw.uploaded[k]))?;
            if i >= SLOTS {
                e(raw.comp.wait(&raw.downloaded[k]))?;
            }
            launch(&f, &raw.comp, din, dout, len, rounds)?;
            e(raw.computed[k].record(&raw.comp))?;
            e(raw.down.wait(&raw.computed[k]))?;
            d2h(off, dout, len, &raw.down)?;
            e(raw.downloaded[k].record(&raw.down))?;
        }
        e(raw.down.synchronize())?;
        e(raw.comp.synchronize())
    })
    .map_err(fail(raw_name))?;
    compare(test.name, raw_name, size, &dst, &ferry_out)?;
    Ok(Row::new(
        test.name,
        Kind::Bandwidth,
        size,
        size,
        format!(
            "chunks of {}, {SLOTS} slots, {rounds}-round LCG kernel (one chunk: copy {:.0} us, kernel {:.0} us)",
            format_size(chunk as u64),
            t_copy * 1e6,
            t_k * 1e6 * f64::from(rounds) / 64.0
        ),
        vec![
            Series::new(name, Role::Ferry, Kind::Bandwidth, size, ferry_t),
            Series::new(seq_name, Role::Baseline, Kind::Bandwidth, size, seq_t),
            Series::new(raw_name, Role::Baseline, Kind::Bandwidth, size, raw_t),
        ],
    ))
}
