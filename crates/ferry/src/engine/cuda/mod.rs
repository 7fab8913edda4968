//! The CUDA engine: copies on the GPU's copy engines through the driver API (cudarc, loaded at
//! run time, so ferry builds and runs without CUDA installed).
//!
//! - [`probe`](fn@probe): the driver, the devices and the links between them; never panics. Without a
//!   driver every constructor here returns [`CudaError::NoDriver`], and nothing else of the
//!   driver is called.
//! - Buffers ([`DeviceBuffer`], [`PinnedBuffer`], [`Registered`], [`MappedBuffer`],
//!   [`ManagedBuffer`]) implement [`Memory`](crate::Memory)/[`MemoryMut`](crate::MemoryMut), so
//!   every engine's safe API takes them.
//! - [`CudaEngine`]: one per device. Separate non-blocking streams per direction (host to
//!   device, device to host, device to device), so that the directions run on different copy
//!   engines at once, and a small pool of them per direction ([`CudaConfig::streams`]), so
//!   that threads submitting through one engine do not queue behind each other (see
//!   [Ordering](#ordering)). Waiting on one request never waits for the rest of its stream:
//!   a request records a completion event when something needs it (a later request on its
//!   stream, a dependent elsewhere, a future; at submit for the blocking waits, a caller's
//!   stream, a stream handed out); while it is its stream's last work its wait waits on the
//!   stream, as a raw `cuStreamSynchronize` (`completion/mark.rs` decides). Strided layouts become
//!   `cuMemcpy2DAsync`/`cuMemcpy3DAsync`; fills become `cuMemsetD8/16/32Async` where the
//!   pattern allows. A dependency on another CUDA request is a `cuStreamWaitEvent` (no host
//!   round trip; a request without an event records it then); other dependencies are waited on
//!   the submitting thread.
//!
//! - Pageable host memory: copies between pageable memory and this device of at least 2 MiB
//!   (host to device) or 1 MiB (device to host) go through a ring of pinned staging buffers
//!   (`paths/staged/`), filled and drained by several CPU threads while the copy engine moves the
//!   previous chunk, on one background thread per direction; smaller ones take the driver's own
//!   pageable path. [`CudaConfig::staging`] tunes or disables it.
//! - Segment lists: a program that would take many driver calls (a custom operator's list of
//!   small copies, an N-D plan of many planes) goes through the gatherer (`paths/gather.rs`): an SM gather kernel
//!   compiled with NVRTC, the driver's batched copy, or one call per segment, whichever was
//!   measured faster for the segment sizes.
//! - SM copies: strided plans with short runs (a transpose of small elements) between
//!   device-accessible buffers run as one kernel (`paths/strided.rs`) instead of many 2-D/3-D rows of a
//!   few bytes on the copy engines; [`CudaConfig::kernel_copies`] chooses where the SMs are used
//!   ([`KernelCopies::Always`]: every such copy, e.g. zero-copy reads and writes of mapped host
//!   memory, as nvbandwidth's SM copies).
//!
//! Which path a copy takes (staged, SM kernel, gather, split, driver calls, and on which
//! stream) is decided once per request by one pure function (`route.rs`, with the measured
//! thresholds and their CPU tests); `submit_raw` then only runs the chosen route (`paths/`
//! for the staged and kernel paths, `paths/calls.rs` for driver calls). One contiguous copy (nearly
//! every request) is checked, routed (`route::Rules::one_run`) and submitted without building its
//! program, and through `Engine::submit_copy` (the safe API's copies) without building its job:
//! the host work between one small copy's end and the next copy's start is what a caller
//! waits for. Settings are in
//! [`CudaConfig`], set-up errors in [`CudaError`].
//!
//! Which calls block: `submit_raw` enqueues and returns, except that it waits for non-CUDA
//! dependencies and that copies from or to pageable host memory below the staging sizes return
//! once the driver has consumed the host side. A staged request's dependents wait for it on the
//! host. `Request::wait` sleeps until shortly before the request's expected end and then polls
//! ([`WaitMode::Auto`], default; a request submitted on an idle stream by a thread submitting
//! alone, other than an upload under 1 KiB, is waited by reading a word its stream writes after
//! it, `completion/stamp.rs` and `completion/mark.rs`), sleeps in the driver ([`WaitMode::Blocking`]) or spins
//! ([`WaitMode::Spin`]).
//! `barrier` waits for everything. A stream's queue is finite: behind work that has not run (a
//! long kernel, a held stream) the driver makes a submitting thread wait once it is full (on
//! the H100 host: 64 gather-kernel calls of four operations and two batched copies of 400
//! copies were queued behind a held stream, and a third batch waited), so `submit_raw` and
//! `flush` do not return at once behind that much queued work.
//!
//! # Ordering
//!
//! - Independent requests (no `after` between them) may run concurrently and complete in any
//!   order, also requests of one thread in different directions.
//! - One thread's requests in one direction run in the order it submitted them: each thread
//!   keeps one stream of the pool per direction for its life (threads are spread over the
//!   pool's [`CudaConfig::streams`] streams in the order they first submit). Staged requests
//!   (pageable memory from the staging sizes up) run on the staging thread and are ordered
//!   only by dependencies.
//! - Dependencies always hold: a request submitted with `after(r)` starts after `r` completed,
//!   whichever thread submitted `r` and whichever stream it ran on (a CUDA request becomes a
//!   `cuStreamWaitEvent` on the dependent's stream, no host wait).
//! - [`CudaEngine::stream`] is the calling thread's stream for a direction: work the thread
//!   enqueues there is ordered with its copies in that direction.
//! - `barrier` waits for the requests of every thread.
//!
//! ```no_run
//! use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
//! use ferry::EngineExt;
//! let engine = CudaEngine::new(0)?;
//! let mut host = PinnedBuffer::new(1 << 20)?;
//! host.fill(7);
//! let mut dev = DeviceBuffer::new(0, 1 << 20)?;
//! engine.scope(|s| -> ferry::Result<()> { Ok(s.memcpy(&mut dev, &host)?.wait()?) })?;
//! assert!(dev.to_vec()?.iter().all(|&b| b == 7));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub(crate) mod completion;
mod config;
mod engine;
mod interop;
mod lanes;
pub mod multi;
pub(crate) mod paths;
mod route;
mod submit;
pub(crate) mod sys;

/// The copy mechanisms themselves (the gatherer, the SM copier and splitter, the stager), for
/// ferry's own benchmarks and tests (feature `bench`): internals with no semver promise, their
/// thresholds measured on one machine. A program reaches them through [`CudaEngine`] and
/// [`CudaConfig`].
#[cfg(feature = "bench")]
pub use paths::{gather, split, staged, strided};

pub(crate) use completion::event::CudaCompletion;
pub use config::{CompletionPolicy, CudaConfig, Direction, KernelCopies, StagingConfig, WaitMode};
pub use interop::{InteropError, StreamEngine, StreamWait};
pub use submit::CudaEngine;
pub use sys::error::KernelError;
pub use sys::error::{CudaError, DriverError};
pub use sys::memory::{
    DeviceBuffer, Location, ManagedBuffer, MappedBuffer, PinnedBuffer, Registered,
};
pub use sys::probe::{probe, CudaProbe, DeviceInfo};
