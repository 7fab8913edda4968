//! Load a byte range of a file into host memory, store it back to another file, and, where a
//! GPU is present, load the same range into device memory through the pinned bounce ring.
//! Each transfer's report says how many bytes took which path (`O_DIRECT` or buffered) and why
//! GPUDirect Storage was not used.
//!
//! `cargo run --release --example 05_file_load`

use ferry::cuda::{CudaEngine, DeviceBuffer};
use ferry::file::{FileConfig, FileEngine, OpenMode};
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir();
    let src_path = dir.join(format!("ferry-example-04-{}", std::process::id()));
    let out_path = src_path.with_extension("out");
    let data: Vec<u8> = (0..32u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&src_path, &data)?;
    let result = run(&src_path, &out_path, &data);
    let _ = std::fs::remove_file(&src_path);
    let _ = std::fs::remove_file(&out_path);
    result
}

fn run(
    src_path: &std::path::Path,
    out_path: &std::path::Path,
    data: &[u8],
) -> Result<(), Box<dyn std::error::Error>> {
    // O_DIRECT where the filesystem takes it; unaligned pieces run buffered.
    let cfg = FileConfig::new().direct(true);
    let (off, len) = (4096usize, 16usize << 20);

    // Host: an owned buffer, handed back when the load completes.
    let engine = FileEngine::new(cfg)?;
    let file = engine.open(src_path, OpenMode::Read)?;
    let t = std::time::Instant::now();
    let (buf, report) = engine.load(&file, off as u64, vec![0u8; len])?.wait()?;
    assert!(buf == data[off..off + len]);
    println!("file -> host in {:?}: {report}", t.elapsed());

    // And back out to a new file.
    let out = engine.open(out_path, OpenMode::Create)?;
    let report = engine.store_from(&out, 0, &buf[..])?;
    assert!(std::fs::read(out_path)? == data[off..off + len]);
    println!("host -> file: {report}");

    // Device: the same range through pinned bounce buffers and the CUDA engine.
    if let Err(why) = ferry::cuda::probe().driver {
        println!("device part skipped: {why}");
        return Ok(());
    }
    let gpu = FileEngine::with_engine(cfg, Arc::new(CudaEngine::new(0)?))?;
    let file = gpu.open(src_path, OpenMode::Read)?;
    let mut dev = DeviceBuffer::new(0, len)?;
    let t = std::time::Instant::now();
    let report = gpu.load_into(&file, off as u64, &mut dev)?;
    let took = t.elapsed();
    assert!(dev.to_vec()? == data[off..off + len]);
    println!("file -> device in {took:?}: {report}");
    Ok(())
}
