//! Copy a tile out of a large matrix on the CPU engine: the planner turns it into one 2-D copy.
//!
//! `cargo run --release --example 01_copy_tile`

use ferry::{CpuEngine, EngineExt, Layout, Plan};

fn main() -> Result<(), ferry::Error> {
    let engine = CpuEngine::new(2)?;
    // A 128 x 128 tile out of a 1024 x 1024 f64 matrix, into a dense buffer.
    let big: Vec<f64> = (0..1024 * 1024).map(|i| i as f64).collect();
    let mut tile = vec![0f64; 128 * 128];
    let src = Layout::of::<f64>(&[1024, 1024])?
        .slice(0, 256..384, 1)?
        .slice(1, 512..640, 1)?;
    let dst = Layout::of::<f64>(&[128, 128])?;
    println!("plan: {:?}", Plan::new(&dst, &src)?);
    engine.scope(|s| -> ferry::Result<()> { Ok(s.copy(&mut tile, &dst, &big, &src)?.wait()?) })?;
    assert_eq!(tile[0], (256 * 1024 + 512) as f64);
    assert_eq!(tile[128 * 128 - 1], (383 * 1024 + 639) as f64);
    println!(
        "tile copied: first {} last {}",
        tile[0],
        tile[128 * 128 - 1]
    );
    Ok(())
}
