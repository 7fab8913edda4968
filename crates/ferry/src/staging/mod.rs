//! The host staging subsystem: what every path that moves bytes through host memory it owns
//! (pinned or aligned buffers between pageable memory, files and a device) shares, as KvikIO's
//! bounce buffers are one module.
//!
//! - `ring.rs`: the ring of staging slots, generic over what completes a slot (a CUDA event
//!   recorded after the slot's DMA, a request, or nothing beyond the slot's return): a slot is
//!   reused only once what last read or filled it has completed.
//! - `workers.rs`: the host copy workers' fork-join pool (a staged copy's chunk loop on
//!   workers `0..n`, beside the coordinating thread).
//! - `fill.rs`: the queue of fills (copies into pinned memory cut into pieces, each fill
//!   completing as a request), the GPU pipeline's bounce buffers filled on it.
//! - `policy.rs`: the fill policy (workers per copy, pieces per fill, which fills are demoted
//!   out of the workers' caches); `copy.rs`: the copy itself (non-temporal stores, `CLDEMOTE`).
//!
//! Users: the CUDA engine's staged copies (`engine/cuda/paths/staged/`), the GPU pipeline's
//! bounce buffers (`pipeline/bounce.rs`, `pipeline/cuda.rs`) and the file engine's bounce slots
//! (`file/ring.rs`, `file/exec.rs`). Imports point down: nothing here imports the CUDA engine;
//! a user that needs pinned memory allocates it at the CUDA bottom (`engine/cuda/sys/memory.rs`)
//! and hands the slots in. Nothing here reads the environment: sizes, thread counts and the
//! store kind come from the caller's config.

pub(crate) mod copy;
mod error;
pub(crate) mod fill;
pub(crate) mod policy;
pub(crate) mod ring;
pub(crate) mod workers;

pub(crate) use error::WorkerError;
pub(crate) use fill::Filler;
pub(crate) use workers::Pool;
