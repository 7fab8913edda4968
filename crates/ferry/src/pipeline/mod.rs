//! Double/triple buffering: stream a large source through K slots while the previous chunks
//! are computed and their results copied back. The seed's loop (load batch N+1, compute batch
//! N, write back batch N-1, all at once), correct by construction.
//!
//! A [`Source`] (host memory of any kind, a strided [`Layout`](crate::Layout) over it, or a file
//! range read through a [`FileEngine`](crate::file::FileEngine) chunk by chunk) is cut into
//! [`Chunk`]s of [`PipelineConfig::chunk_bytes`]; chunk `i` goes to slot `i % K`
//! ([`PipelineConfig::slots`], K >= 1: 2 is double, 3 triple buffering). For each chunk:
//! 1. *upload*: the engine copies it into its input slot, once the slot's previous reader
//!    (the compute of chunk `i - K`) has finished;
//! 2. *compute*: the user's stage runs on the input slot and may write an output slot, once
//!    the upload is done and the output slot's previous download (chunk `i - K`) has finished;
//! 3. *download* (when a [`Dest`] is given): the engine copies the output slot's first
//!    [`OutLen`] bytes to the destination, after the compute.
//!
//! Each arrow is a dependency between requests, never a wait of the submitting thread: on the
//! GPU ([`CudaPipeline`]) an event waited on by a stream (`cuStreamWaitEvent`), the stage
//! enqueues its kernels on the pipeline's compute stream, and uploads run ahead by K-1 chunks,
//! so the copy engines and the SMs are busy at once. On the CPU ([`CpuPipeline`]) the three
//! steps run on three lane threads, each in order like a stream, the copies on any
//! [`Engine`](crate::Engine) (a [`CpuEngine`](crate::CpuEngine)) and the stage a closure. The
//! submitting thread waits only to bound the work queued ahead ([`PipelineConfig::depth`]
//! chunks), on a chunk `depth` behind the newest, and at the end.
//!
//! The slots belong to the pipeline; a stage sees its chunk's slots only for the call (GPU:
//! device addresses valid for the work it enqueues on the compute stream; CPU: slices), so no
//! caller code can reach a slot while a copy or an earlier chunk's compute still uses it: the
//! reuse order above is the pipeline's, not the caller's care. `run` borrows the source and
//! the destination, and returns (or unwinds, if the stage panics) only once every request it
//! made has completed.
//!
//! Errors: the first failure in chunk order stops the pipeline: a stage error (GPU: returned
//! while enqueueing; CPU: returned by the closure) is [`PipelineError::Stage`] with the chunk
//! and the stage's own error; a failed copy is [`PipelineError::Copy`] with the chunk and the
//! step. Nothing more is submitted, everything in flight is waited for, every request's result
//! is observed (the engine's next barrier does not report them again), and the pipeline and
//! the engine stay usable.
//!
//! A [`Timeline`] of every chunk's upload, compute and download (GPU: CUDA events; CPU: the
//! clock) is kept on request ([`PipelineConfig::timeline`]) and exported as Chrome trace JSON.
//!
//! ```
//! use ferry::pipeline::{CpuPipeline, Dest, OutLen, PipelineConfig, Source};
//! let engine = ferry::CpuEngine::new(2)?;
//! let src: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
//! let mut dst = vec![0u8; src.len()];
//! let cfg = PipelineConfig::new(16 << 10, 3).output(OutLen::Same);
//! let mut p = CpuPipeline::new(&engine, cfg)?;
//! p.run(Source::new(&src), Some(Dest::new(&mut dst)), |_c, input: &[u8], out: &mut [u8]| {
//!     for (o, i) in out.iter_mut().zip(input) {
//!         *o = i.wrapping_mul(2);
//!     }
//!     Ok::<(), std::convert::Infallible>(())
//! })?;
//! assert!(dst.iter().zip(&src).all(|(d, s)| *d == s.wrapping_mul(2)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bounce;
mod chunk;
mod config;
mod core;
mod cpu;
mod cuda;
mod error;
mod report;
mod source;
mod timeline;

pub use chunk::{Chunk, Phase};
pub use config::{
    BounceFill, OutLen, PipelineConfig, BOUNCE_AHEAD_BYTES, BOUNCE_MAX, CHUNKS_MAX, FILL_THREADS,
    FILL_THREADS_MAX, SLOTS_MAX,
};
pub use cpu::CpuPipeline;
pub use cuda::{CudaPipeline, GpuChunk};
pub use error::{PipelineError, StageError};
pub use report::RunReport;
pub use source::{Dest, Source};
pub use timeline::{ChunkTimes, Span, Timeline, TimelineClock};
