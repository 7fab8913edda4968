//! The host staging subsystem: what every path that moves bytes through host memory it owns
//! (pinned or aligned buffers between pageable memory, files and a device) shares, as KvikIO's
//! bounce buffers are one module.
//!
//! - `ring.rs`: the ring of staging slots, generic over what completes a slot (a CUDA event
//!   recorded after the slot's DMA, a request, or nothing beyond the slot's return): a slot is
//!   reused only once what last read or filled it has completed.
//! - `workers.rs`: the host copy workers, one set of threads per process sized to the cores
//!   (`ferry-host-*`, started as users ask for them), fed from one queue that takes both a
//!   staged copy's fork-join job (its chunk loop on up to `n` workers, beside the coordinating
//!   thread) and the fill queue's pieces; every device's stager and every pipeline share it.
//! - `fill.rs`: the fills (copies into pinned memory cut into pieces for those workers, each
//!   fill completing as a request), the GPU pipeline's bounce buffers filled on it.
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
