//! ferry moves bytes between host memory, GPUs and files on the hardware's DMA engines.
//!
//! - [`Layout`]: N-D strided layouts (dims, byte strides, element size), sliced, reshaped and
//!   permuted without copies.
//! - [`Plan`]: the fewest, largest contiguous runs for a copy between two layouts: one 1-D run,
//!   a 2-D pitched copy, a 3-D copy or a list of segments.
//! - [`Engine`]: one trait for every backend, with [`Request`]s that are waited, polled or
//!   awaited, each with its own error; [`EngineExt`] for the safe, borrow-checked API.
//! - Backends: [`CpuEngine`] (a thread pool that splits large copies), [`MultiplexEngine`]
//!   (several engines behind one, by weight), and the CUDA engine in [`engine::cuda`].
//! - Files: [`file::FileEngine`] loads byte ranges of files into host or device buffers and
//!   stores them back (parallel `pread`/`pwrite`, optional `O_DIRECT`, a pinned bounce ring
//!   for GPUs).
//! - [`pipeline`]: double/triple buffering of a large source through device (or host) slots,
//!   a user stage per chunk, results copied back; a timeline of every step.
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

#[cfg(feature = "bench")]
pub mod bench;
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
mod sync;

/// The element-type trait of typed buffers ([`bytemuck::Pod`]), re-exported so that a user
/// type can implement it without naming the crate in its own manifest.
pub use bytemuck;
pub use engine::cpu::{CpuConfig, CpuEngine, THREADS_MAX as CPU_THREADS_MAX};
pub use engine::cuda;
pub use engine::multiplex::MultiplexEngine;
pub use engine::{Engine, EngineExt, Failed, Job, Refused, Scope, SubmitError, Transfer};
pub use env::ConfigError;
pub use error::{Error, Result};
pub use layout::{Layout, LayoutError, MAX_DIMS};
pub use memory::{MemKind, Memory, MemoryMut, RawBuf};
pub use op::{Op, OpError, Operator, Program, Segment, Step};
pub use plan::{Plan, PlanError, PlanKind};
pub use request::{BarrierError, Completion, Request, RequestError};
