//! Scale-and-sum of a host array eight times larger than the device buffers, triple-buffered:
//! while the GPU sums chunk N (a kernel compiled with NVRTC), chunk N+1 is uploaded and the
//! partial sum of chunk N-1 goes back. The result is checked against the CPU. Prints `skipped:
//! no CUDA driver` on a machine without one.
//!
//! `cargo run --release --example 06_pipeline_scale_sum`

use cudarc::driver::{LaunchConfig, PushKernelArg};
use ferry::cuda::{CudaEngine, PinnedBuffer};
use ferry::pipeline::{CudaPipeline, Dest, OutLen, PipelineConfig, Source};

/// `out = a * sum(x)` over one chunk of `n` floats: one block of 1024 threads, summed in
/// double precision.
const KERNEL: &str = r#"
extern "C" __global__ void scale_sum(const float* x, unsigned long long n, float a, double* out) {
    __shared__ double part[1024];
    double s = 0.0;
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) s += (double)x[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned w = 512; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = (double)a * part[0];
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if ferry::cuda::probe().driver.is_err() {
        println!("skipped: no CUDA driver");
        return Ok(());
    }
    let engine = CudaEngine::new(0)?;
    let ptx = cudarc::nvrtc::compile_ptx(KERNEL)?;
    let scale_sum = engine
        .context()
        .load_module(ptx)?
        .load_function("scale_sum")?;

    // Three device slots of 8 MiB; the host array is eight times all three: 192 MiB of f32.
    let (chunk, slots) = (8 << 20, 3);
    let n = 8 * slots * chunk / 4;
    let mut host = PinnedBuffer::new(n * 4)?;
    for (i, v) in host.chunks_exact_mut(4).enumerate() {
        v.copy_from_slice(&(((i % 1000) as f32) * 0.5).to_ne_bytes());
    }
    let a = 3.0f32;
    let chunks = (n * 4).div_ceil(chunk);
    let mut partial = vec![0f64; chunks];

    let cfg = PipelineConfig::new(chunk, slots).output(OutLen::Fixed(8));
    let mut pipe = CudaPipeline::new(&engine, cfg)?;
    let t = std::time::Instant::now();
    let rep = pipe.run(Source::new(&host), Some(Dest::new(&mut partial)), |g| {
        let (x, len) = (g.input(), (g.chunk().len / 4) as u64);
        let out = g.output().expect("a Fixed(8) output slot");
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `x` holds `len` floats and `out` one double, both the pipeline's slots,
        // valid for work on this stream.
        unsafe {
            g.stream()
                .launch_builder(&scale_sum)
                .arg(&x)
                .arg(&len)
                .arg(&a)
                .arg(&out)
                .launch(cfg)
        }
        .map(drop)
    })?;
    let gpu: f64 = partial.iter().sum();
    let cpu: f64 = host
        .chunks_exact(4)
        .map(|b| f64::from(f32::from_ne_bytes([b[0], b[1], b[2], b[3]])))
        .sum::<f64>()
        * f64::from(a);
    let rel = (gpu - cpu).abs() / cpu.abs();
    println!(
        "{} chunks of {} MiB through {slots} slots in {:?}: sum {gpu} (CPU {cpu}, rel. error {rel:.1e})",
        rep.chunks,
        chunk >> 20,
        t.elapsed()
    );
    assert!(rel < 1e-9, "GPU and CPU sums differ");
    Ok(())
}
