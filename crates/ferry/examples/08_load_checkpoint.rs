//! Save a small safetensors checkpoint, load it back (all of it, then a subset) into pageable
//! memory, reload two tensors into memory the program already has (`load_into`: no
//! allocation, dtype and shape checked first), and, where a GPU is present, into device memory through the file engine's
//! file -> device path; save it again from the device. Every tensor's name, dtype, shape, byte
//! range and place is printed, with each load's report (bytes, reads, GB/s, the I/O path); the
//! tensors are reached through typed views (host: bytes and typed slices; device: a pointer).
//!
//! `cargo run --release --example 08_load_checkpoint`

use ferry::checkpoint::{
    self, Dest, Dtype, LoadOptions, Placement, SaveOptions, SaveTensor, Target,
};
use ferry::cuda::CudaEngine;
use ferry::file::{FileConfig, FileEngine};
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("ferry-example-08-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    // A checkpoint of a few layers: f32 weights, bf16 biases, a step.
    let layers = 4;
    let weights: Vec<Vec<f32>> = (0..layers)
        .map(|l| {
            (0..256 * 1024)
                .map(|i| (l * 1000 + i % 1000) as f32)
                .collect()
        })
        .collect();
    let biases: Vec<Vec<half::bf16>> = (0..layers)
        .map(|l| vec![half::bf16::from_f32(l as f32); 1024])
        .collect();
    let step = [1234i64];
    let names: Vec<(String, String)> = (0..layers)
        .map(|l| (format!("layers.{l}.weight"), format!("layers.{l}.bias")))
        .collect();
    let mut tensors = Vec::new();
    for l in 0..layers {
        tensors.push(SaveTensor::new(
            &names[l].0,
            Dtype::F32,
            &[256, 1024],
            &weights[l],
        ));
        tensors.push(SaveTensor::new(
            &names[l].1,
            Dtype::BF16,
            &[1024],
            &biases[l],
        ));
    }
    tensors.push(SaveTensor::new("step", Dtype::I64, &[], &step));
    let path = dir.join("model.safetensors");
    let host = FileEngine::new(FileConfig::new())?;
    let saved = checkpoint::save(
        &host,
        &path,
        &tensors,
        &SaveOptions::new().metadata("format", "pt"),
    )?;
    println!("saved {}: {saved}", path.display());

    // Everything, one allocation, one read.
    let ck = checkpoint::load(&host, &path, &LoadOptions::new(Target::Pageable))?;
    println!("pageable: {}", ck.report());
    for t in ck.tensors() {
        println!(
            "  {:<18} {:<5} {:<12} file {:>9}..{:<9} buffer {} + {}",
            t.name,
            t.dtype.to_string(),
            format!("{:?}", t.shape),
            t.file_range.start,
            t.file_range.end,
            t.buffer,
            t.offset
        );
    }
    // A host view: the bytes, or the elements as the Rust type of the tensor's dtype (another
    // type is an error, not a reinterpretation).
    let w1 = ck.host("layers.1.weight").ok_or("missing")?;
    assert_eq!(w1.as_slice::<f32>()?, &weights[1][..]);
    let b1 = ck.host("layers.1.bias").ok_or("missing")?;
    assert_eq!(b1.as_slice::<half::bf16>()?, &biases[1][..]);
    println!("as u16: {}", b1.as_slice::<u16>().err().ok_or("accepted")?);

    // Only the biases, one allocation each.
    let opts = LoadOptions::new(Target::Pageable)
        .placement(Placement::PerTensor)
        .filter(|t| t.name.ends_with(".bias"));
    let ck = checkpoint::load(&host, &path, &opts)?;
    println!("biases only: {}", ck.report());

    // Into the program's own buffers (a model's parameters, say): nothing allocated.
    let mut w0 = vec![0f32; 256 * 1024];
    let mut b0 = vec![half::bf16::ZERO; 1024];
    let r = checkpoint::load_into(
        &host,
        &path,
        &mut [
            Dest::new("layers.0.weight", &mut w0)
                .dtype(Dtype::F32)
                .shape(&[256, 1024]),
            Dest::new("layers.0.bias", &mut b0).dtype(Dtype::BF16),
        ],
    )?;
    assert!(w0 == weights[0] && b0 == biases[0]);
    println!("into existing buffers: {r}");
    let mut wrong = vec![0f32; 1024];
    let e = checkpoint::load_into(&host, &path, &mut [Dest::new("layers.0.bias", &mut wrong)]);
    println!(
        "a destination that does not fit: {}",
        e.err().ok_or("accepted")?
    );

    // Device: the same file into GPU memory, then saved again from there. The GPU is named
    // once, by the CUDA engine the file engine moves the bytes with.
    if let Err(why) = ferry::cuda::probe().driver {
        println!("device part skipped: {why}");
        return Ok(());
    }
    let gpu = FileEngine::with_engine(FileConfig::new(), Arc::new(CudaEngine::new(0)?))?;
    let ck = checkpoint::load(&gpu, &path, &LoadOptions::new(Target::Device))?;
    println!("cuda:0: {}", ck.report());
    let w3 = ck.device("layers.3.weight").ok_or("missing")?;
    println!(
        "  layers.3.weight lives on cuda:{} at device address {:#x} ({} bytes, {} {:?})",
        w3.ordinal(),
        w3.device_ptr(),
        w3.len(),
        w3.dtype(),
        w3.shape()
    );
    let again = dir.join("from-device.safetensors");
    let r = ck.save(&gpu, &again, &SaveOptions::new().fsync(true))?;
    assert!(std::fs::read(&again)? == std::fs::read(&path)?);
    println!("saved from the device: {r}");
    Ok(())
}
