//! Transpose a matrix on the GPU, and read mapped host memory with the SMs: the CUDA engine
//! moves a plan of 4-byte runs as one kernel (`KernelCopies::Auto`) instead of thousands of
//! 4-byte rows on the copy engines, and `KernelCopies::Always` makes every copy between
//! device-accessible buffers a kernel (zero-copy reads of mapped memory). Prints
//! `skipped: ...` on a machine without a CUDA driver.
//!
//! `cargo run --release --example 04_cuda_transpose`

use ferry::cuda::{CudaConfig, CudaEngine, DeviceBuffer, KernelCopies, MappedBuffer};
use ferry::{EngineExt, Layout};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Err(why) = ferry::cuda::probe().driver {
        println!("skipped: {why}");
        return Ok(());
    }
    let n = 2048;
    let bytes = n * n * 4;
    // Row i of the matrix holds i * n .. (i + 1) * n as f32, in mapped host memory.
    let mut host = MappedBuffer::new(bytes)?;
    for (i, v) in host.chunks_exact_mut(4).enumerate() {
        v.copy_from_slice(&(i as f32).to_ne_bytes());
    }
    let m = Layout::contiguous(&[n, n], 4)?;
    let mut dev = DeviceBuffer::new(0, bytes)?;
    let mut dev_t = DeviceBuffer::new(0, bytes)?;

    // Mapped host -> device, read by the SMs.
    let sm = CudaEngine::with_config(CudaConfig::new(0).kernel_copies(KernelCopies::Always))?;
    sm.scope(|s| -> ferry::Result<()> { Ok(s.memcpy(&mut dev, &host)?.wait()?) })?;

    // Device -> device transpose: element (i, j) of the result is element (j, i) of `dev`.
    let engine = CudaEngine::new(0)?;
    let t = std::time::Instant::now();
    engine.scope(|s| -> Result<(), ferry::Error> {
        s.copy(&mut dev_t, &m, &dev, &m.transpose(0, 1)?)?.wait()?;
        Ok(())
    })?;
    let took = t.elapsed();
    let back = dev_t.to_vec()?;
    let at =
        |i: usize, j: usize| f32::from_ne_bytes(back[(i * n + j) * 4..][..4].try_into().unwrap());
    assert_eq!(at(0, 1), n as f32);
    assert_eq!(at(5, 7), (7 * n + 5) as f32);
    println!("transposed a {n} x {n} f32 matrix (16 MiB) on the GPU in {took:?}");
    Ok(())
}
