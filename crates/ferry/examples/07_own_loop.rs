//! The seed's loop, for users who own it: ferry uploads batch i on its copy stream while the
//! caller's compute stream runs a kernel on batch i-1, double-buffered, ordered by events only
//! (`stream_wait`: the compute stream waits for the upload; `record`: the next upload into a
//! buffer waits for the kernel that read it). No pipeline object, no host wait per batch, and
//! no unsafe ferry call: the uploads go through a scope (`Scope::copy_to_device`, which writes
//! a device buffer the scope shares with the kernels); the one `unsafe` block is cudarc's
//! kernel launch.
//! Prints `skipped: no CUDA driver` on a machine without one.
//!
//! `cargo run --release --example 07_own_loop`

use cudarc::driver::{LaunchConfig, PushKernelArg};
use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
use ferry::{EngineExt, Layout, Request};

const KERNEL: &str = r#"
extern "C" __global__ void process(const unsigned char* in, unsigned long long n, unsigned long long* out) {
    unsigned long long s = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        s += in[i];
    atomicAdd(out, s);
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if ferry::cuda::probe().driver.is_err() {
        println!("skipped: no CUDA driver");
        return Ok(());
    }
    let engine = CudaEngine::new(0)?;
    let ptx = cudarc::nvrtc::compile_ptx(KERNEL)?;
    let process = engine
        .context()
        .load_module(ptx)?
        .load_function("process")?;
    let compute = engine.context().new_stream()?;

    let (batch, batches) = (4 << 20, 64);
    let mut host = PinnedBuffer::new(batch * batches)?;
    for (i, b) in host.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let d_input = [DeviceBuffer::new(0, batch)?, DeviceBuffer::new(0, batch)?];
    let d_output = DeviceBuffer::zeroed(0, 8)?;
    let out_ptr = d_output.device_ptr();
    let l = Layout::bytes(batch)?;
    let t = std::time::Instant::now();
    // The scope keeps every buffer borrowed until all of ferry's copies have completed; the
    // device buffers are shared with the kernels, ordered on the GPU by the events below.
    engine.scope(|s| -> Result<(), Box<dyn std::error::Error>> {
        // The point of the compute stream after the last kernel that read each buffer.
        let mut read_done: [Option<Request>; 2] = [None, None];
        for i in 0..batches {
            let buf = &d_input[i % 2];
            // DMA: copy batch i to the GPU on ferry's copy stream, once the kernel that last
            // read this buffer (batch i-2) is done: a cuStreamWaitEvent on the copy stream.
            let after: Vec<&Request> = read_done[i % 2].iter().collect();
            let upload =
                s.copy_to_device(buf, &l, &host[i * batch..(i + 1) * batch], &l, &after)?;
            // Compute waits for the copy on the GPU (cudaStreamWaitEvent), then runs on batch i.
            engine.stream_wait(&compute, &upload)?;
            let (ptr, n) = (buf.device_ptr(), batch as u64);
            // SAFETY: cudarc's kernel launch: the arguments match the kernel's signature;
            // `ptr` holds `n` bytes and `out_ptr` one u64, both alive until the compute stream
            // is synchronized below; the next write of `ptr` waits for this kernel.
            unsafe {
                compute
                    .launch_builder(&process)
                    .arg(&ptr)
                    .arg(&n)
                    .arg(&out_ptr)
                    .launch(LaunchConfig {
                        grid_dim: (264, 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    })?;
            }
            // cudaEventRecord on the compute stream: the next upload into this buffer waits
            // for it.
            read_done[i % 2] = Some(engine.record(&compute)?);
        }
        compute.synchronize()?;
        Ok(())
    })?;
    let gpu = u64::from_ne_bytes(d_output.to_vec()?[..8].try_into()?);
    let cpu: u64 = host.iter().map(|&b| u64::from(b)).sum();
    println!(
        "{batches} batches of {} MiB in {:?}: sum {gpu} (CPU {cpu})",
        batch >> 20,
        t.elapsed()
    );
    assert_eq!(gpu, cpu);
    Ok(())
}
