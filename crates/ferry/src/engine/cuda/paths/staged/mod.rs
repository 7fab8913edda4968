//! Staged copies between pageable host memory and a device, through a ring of pinned buffers.
//!
//! The driver copies pageable memory slowly (about 9-15 GB/s on a PCIe 5.0 host) because it
//! stages through its own small pinned buffers with one CPU thread. A [`Stager`] keeps a ring of
//! large pinned staging buffers per direction and runs its copies on the process's host copy
//! workers (persistent CPU threads, one set shared by every device's stager and every GPU
//! pipeline, at most the cores; `src/staging/workers.rs`): while
//! the copy engine moves chunk `k` between the ring and the device, the workers copy chunk `k+1`
//! between pageable memory and the ring (host -> device), or drain chunk `k-1` (device -> host).
//! The workers take the chunks' parts in order from a shared counter, with no barrier between
//! chunks, and the calling thread issues each chunk's DMA the moment its last part is in: on the
//! H200 host this moved 256 MiB host -> device at 45.8 GB/s against 43.9 for the earlier design
//! (every worker on one chunk, then a barrier), 45.6 against 36.7 with non-temporal stores, in
//! one run (run 17 in `bench/results/h200.md`, "The staging pipeline, gather strategies and
//! wait modes").
//!
//! A [`Stager`] is made once per device and reused by many copies. Each direction has its own
//! ring, allocated on first use, but both share the stager's turn at the workers, one copy at a
//! time (two devices' stagers run side by side, each on workers of its own): a host -> device and a device -> host copy take turns at the workers (only the last
//! DMAs of one, waited for after it leaves the pool, overlap the start of the other), and two
//! copies in the same direction take turns at their ring as well. Running both directions at
//! once would need workers for each (a pool per direction: up to twice the threads, competing
//! for the cores and for host memory bandwidth, which already bounds one direction's copy);
//! that is not measured, so not done.
//!
//! Failures fail cleanly: a copy returns (with its error, or with a panic of the mechanism,
//! which goes on unwinding) only after every DMA it issued has ended, whatever failed, and the
//! stager stays usable for the next copy.
//!
//! Plans with a strided host side are gathered into (or scattered out of) the ring run by run;
//! a pitched device side is written from the ring with `cuMemcpy2DAsync`.
//!
//! The parts, one file each: this file holds the API ([`Stager`], [`Direction`],
//! [`StagedError`]); the tuning is [`StagingConfig`] (`engine/cuda/config/staging.rs`,
//! `FERRY_STAGING_*`); `chunk.rs` which bytes each chunk carries; `ring.rs` the pinned slots
//! and their events; `handoff.rs` the hand-off of the slots between the host workers and the
//! coordinator (apart from CUDA, model-checked with loom); `pipeline.rs` the loop that drives
//! the workers, the ring and the DMAs through it;
//! `segments.rs` segment lists ([`Stager::copy_segments`]: many runs of pageable memory packed
//! into the ring's chunks). The host side is the crate's staging subsystem (`src/staging/`):
//! the host copy workers, the (non-temporal) copy and its pieces, the fill policy.
//!
//! ```no_run
//! use ferry::engine::cuda::staged::{Direction, Stager, StagingConfig};
//! use ferry::Plan;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! if !ferry::engine::cuda::staged::driver_present() {
//!     return Ok(()); // no CUDA driver on this machine
//! }
//! let ctx = cudarc::driver::CudaContext::new(0)?;
//! let stream = ctx.new_stream()?;
//! let stager = Stager::new(ctx.clone(), StagingConfig::new().threads(8))?;
//! let host = vec![7u8; 1 << 20];
//! let dev = unsafe { cudarc::driver::result::malloc_sync(host.len())? };
//! // SAFETY: `dev` holds `host.len()` bytes, `host` is live for the call, nothing else uses them.
//! unsafe {
//!     stager.copy(&stream, Direction::HostToDevice, dev, host.as_ptr() as u64, &Plan::contiguous(0, 0, host.len()))?;
//! }
//! # Ok(()) }
//! ```

mod chunk;
mod error;
mod handoff;
mod pipeline;
mod ring;
mod segments;
mod stager;

pub use crate::engine::cuda::config::StagingConfig;
pub use crate::engine::cuda::route::StagedDirection as Direction;
#[cfg(feature = "bench")]
pub use crate::engine::cuda::sys::error::driver_present;
pub use error::StagedError;
pub use stager::Stager;
