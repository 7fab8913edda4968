//! ferry moves bytes between host memory, GPUs and files on the hardware's DMA engines.
//!
//! Three jobs, and where each starts:
//!
//! 1. **Copy a buffer or a tile to the GPU (and back).** A [`cuda::CudaEngine`] per GPU;
//!    [`EngineExt::scope`] borrows the buffers and returns a [`Request`] per copy, waited,
//!    polled or awaited. A tile is a [`Layout`] (dims, byte strides) over the source; pageable
//!    memory, pinned [`cuda::PinnedBuffer`]s and [`cuda::DeviceBuffer`]s all take the same call:
//!
//!    ```no_run
//!    use ferry::cuda::{CudaEngine, DeviceBuffer};
//!    use ferry::{EngineExt, Layout};
//!    let engine = CudaEngine::new(0)?;
//!    let host = vec![1f32; 4096 * 4096];
//!    let tile = Layout::of::<f32>(&[4096, 4096])?.slice(0, 0..1024, 1)?.slice(1, 0..1024, 1)?;
//!    let mut dev = DeviceBuffer::new(0, 1024 * 1024 * 4)?;
//!    let dense = Layout::of::<f32>(&[1024, 1024])?;
//!    engine.scope(|s| -> ferry::Result<()> { Ok(s.copy(&mut dev, &dense, &host, &tile)?.wait()?) })?;
//!    # Ok::<(), Box<dyn std::error::Error>>(())
//!    ```
//! 2. **Load a checkpoint.** [`checkpoint::load`] reads a safetensors file (or a sharded
//!    checkpoint's index) through a [`file::FileEngine`] into one GPU's memory or the host's,
//!    and gives each tensor as a typed view ([`checkpoint::Checkpoint::view`]):
//!
//!    ```no_run
//!    use ferry::checkpoint::{self, LoadOptions, Target};
//!    use ferry::cuda::CudaEngine;
//!    use ferry::file::{FileConfig, FileEngine};
//!    use std::sync::Arc;
//!    let files = FileEngine::with_engine(FileConfig::new(), Arc::new(CudaEngine::new(0)?))?;
//!    let ckpt = checkpoint::load(&files, "model.safetensors", &LoadOptions::new(Target::Device))?;
//!    let w = ckpt.device("lm_head.weight").expect("on the GPU");
//!    println!("{:?} {:?} at {:#x}", w.dtype(), w.shape(), w.device_ptr());
//!    # Ok::<(), Box<dyn std::error::Error>>(())
//!    ```
//! 3. **Overlap copies with compute.** [`pipeline::CudaPipeline`] streams a large source
//!    (host memory, a strided layout, or a file range) through K device slots: chunk N+1
//!    uploads while your kernels run on chunk N and chunk N-1's results come back
//!    (`examples/06_pipeline_scale_sum.rs`); [`pipeline::CpuPipeline`] does the same on the
//!    CPU.
//!
//! Underneath:
//! - [`Layout`]: N-D strided layouts (dims, byte strides, element size), sliced, reshaped and
//!   permuted without copies.
//! - [`Plan`]: the fewest, largest contiguous runs for a copy between two layouts: one 1-D run,
//!   a 2-D pitched copy, a 3-D copy or a list of segments.
//! - [`Engine`]: one trait for every backend, with [`Request`]s that are waited, polled or
//!   awaited, each with its own error; [`EngineExt`] for the safe, borrow-checked API.
//! - Backends: [`CpuEngine`] (a thread pool that splits large copies), [`MultiplexEngine`]
//!   (several engines behind one, by weight), the CUDA engine in [`engine::cuda`], NCCL
//!   between processes' GPUs in [`engine::nccl`].
//! - Files: [`file::FileEngine`] loads byte ranges of files into host or device buffers and
//!   stores them back (parallel `pread`/`pwrite`, optional `O_DIRECT` through io_uring, a
//!   pinned bounce ring or cuFile for GPUs).
//!
//! The same tile copy on the CPU engine, which runs anywhere:
//!
//! ```
//! use ferry::{CpuEngine, EngineExt, Layout};
//! let engine = CpuEngine::new(2)?;
//! // Copy a 128 x 128 tile out of a 1024 x 1024 f64 matrix into a dense buffer.
//! let big: Vec<f64> = (0..1024 * 1024).map(|i| i as f64).collect();
//! let mut tile = vec![0f64; 128 * 128];
//! let src = Layout::of::<f64>(&[1024, 1024])?.slice(0, 256..384, 1)?.slice(1, 512..640, 1)?;
//! let dst = Layout::of::<f64>(&[128, 128])?;
//! engine.scope(|s| -> ferry::Result<()> { Ok(s.copy(&mut tile, &dst, &big, &src)?.wait()?) })?;
//! assert_eq!(tile[0], (256 * 1024 + 512) as f64);
//! # Ok::<(), ferry::Error>(())
//! ```

/// Counts a driver allocation made (`+1`) or freed (`-1`) for `fault::live`; nothing without
/// the `fault-injection` feature.
macro_rules! count_alloc {
    ($r:ident, $d:expr) => {
        #[cfg(feature = "fault-injection")]
        crate::fault::count(crate::fault::Resource::$r, $d);
    };
}

pub mod agent;
#[cfg(feature = "bench")]
pub mod bench;
mod blocks;
pub mod checkpoint;
pub mod engine;
mod env;
mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod file;
pub mod layout;
pub mod memory;
pub mod op;
pub mod pipeline;
pub mod plan;
pub mod request;
mod small_list;
mod staging;
mod sync;

/// The element-type trait of typed buffers ([`bytemuck::Pod`]), re-exported so that a user
/// type can implement it without naming the crate in its own manifest.
pub use bytemuck;
pub use engine::cpu::{CpuConfig, CpuEngine};
pub use engine::cuda;
pub use engine::multiplex::MultiplexEngine;
pub use engine::{Backend, Engine, EngineExt, Failed, Job, Refused, Scope, SubmitError, Transfer};
pub use env::ConfigError;
pub use error::{Error, Result};
pub use layout::{Layout, LayoutError, MAX_DIMS};
pub use memory::{MemKind, Memory, MemoryMut, RawBuf};
pub use op::{Op, OpError, Operator, Program, Segment, Step};
pub use plan::{Plan, PlanError, PlanKind};
pub use request::{BarrierError, Completion, Request, RequestError};
