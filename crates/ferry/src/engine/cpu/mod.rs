//! The CPU engine: the caller's thread and a pool of workers, sharing each large copy.
//!
//! - Small copies (at most [`CpuConfig::inline_bytes`]) run on the submitting thread during
//!   submit: handing them to a worker would cost more than the copy, and the caller's cache
//!   holds the data. A contiguous or strided copy so allocates nothing and its request is
//!   done when submit returns. Set it to 0 to queue all.
//! - Parallel inside one request, where it pays: a copy larger than
//!   [`CpuConfig::split_bytes`] (from the cache size: [`CpuProbe::split_bytes`]) is split into
//!   one chunk per core at most (at least [`CpuConfig::chunk_bytes`] each); the submitting
//!   thread runs one share at submit, the workers the others (and the waiting thread any that
//!   no worker took yet). A copy between the two thresholds is one chunk, queued.
//! - Transposes (one element per run against the source's grain): a kernel per element size
//!   (1, 2, 4, 8, 16 bytes; SIMD register transposes for 2, 4 and 8 on x86_64). A plain
//!   transpose goes through staged tiles (each tile's source rows copied whole into a buffer
//!   on the stack, transposed from there into whole destination rows); one that writes more
//!   than [`CpuConfig::stream_bytes`] (a quarter of the last-level cache) writes its
//!   destination past the caches.
//! - Threads: `CpuEngine::new(0)` (and `CpuConfig::new(0)`, and the C API's
//!   `ferry_dma_cpu_create(&dma, 0)`) means one worker per core.
//! - Caller-runs mode ([`CpuEngine::caller_runs`], [`CpuConfig::caller_runs`]): no workers,
//!   nothing runs in the background; the caller makes progress in `wait` and `barrier`.
//! - Each request completes on its own with its own error; a panicking custom operator fails
//!   only its request and the worker lives on.
//! - Dropping the engine finishes the queued work first; dropping a request does not cancel it.
//!
//! It reaches host-accessible memory only (pageable, pinned, mapped, managed).

//! The files: `config.rs` ([`CpuConfig`]), `probe.rs` (cores, cache: [`CpuProbe`]),
//! `engine.rs` ([`CpuEngine`]: state, constructors), `submit.rs` (the `Engine` contract: checks,
//! inline copies, hand-off to the pool), `pool.rs` (the workers; a request's completion),
//! `exec.rs` (the copy kernels).

mod config;
mod engine;
mod exec;
mod pool;
mod probe;
mod submit;

pub use config::CpuConfig;
pub use engine::CpuEngine;
pub use probe::{probe, CpuProbe};
