//! Upload a strided tile to the GPU, pageable and pinned, and read it back: the CUDA engine
//! plans one 2-D copy, stages pageable memory through its pinned ring, and waits on one event
//! per request. Prints `skipped: no CUDA driver` on a machine without one.
//!
//! `cargo run --release --example 03_cuda_upload`

use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
use ferry::{EngineExt, Layout};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Err(why) = ferry::cuda::probe().driver {
        println!("skipped: {why}");
        return Ok(());
    }
    let engine = CudaEngine::new(0)?;
    // A 4096 x 4096 f32 matrix in pageable memory; its 2048 x 2048 lower-right tile.
    let n = 4096;
    let host: Vec<f32> = (0..n * n).map(|i| i as f32).collect();
    let tile = Layout::contiguous(&[n, n], 4)?
        .slice(0, 2048..4096, 1)?
        .slice(1, 2048..4096, 1)?;
    let dense = Layout::contiguous(&[2048, 2048], 4)?;
    let mut dev = DeviceBuffer::new(0, 2048 * 2048 * 4)?;
    let mut back = PinnedBuffer::new(2048 * 2048 * 4)?;
    let t = std::time::Instant::now();
    engine.scope(|s| -> Result<(), ferry::Error> {
        let up = s.copy(&mut dev, &dense, &host, &tile)?;
        up.wait()?;
        Ok(())
    })?;
    let up = t.elapsed();
    engine.scope(|s| -> ferry::Result<()> { Ok(s.memcpy(&mut back, &dev)?.wait()?) })?;
    let first = f32::from_ne_bytes(back[..4].try_into()?);
    assert_eq!(first, (2048 * n + 2048) as f32);
    println!("uploaded a 16 MiB tile (pageable, strided) in {up:?}; first element {first}");
    Ok(())
}
