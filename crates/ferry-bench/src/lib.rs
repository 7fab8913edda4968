//! The baselines and timers of `ferry bench`: what a user writing the driver (or NCCL) calls by
//! hand does, with none of ferry's planning, events or staging, and the GPU-side clock both are
//! timed with. Not part of ferry's API; only the CLI uses it.
//!
//! - [`RawCopier`]: raw driver copies on one device (one call per copy, peer copies, both
//!   directions at once, a plan's 2-D/3-D calls, one call per segment, a plain SM kernel launch,
//!   a small copy waited in each of the driver's ways ([`RawWait`])).
//! - [`StreamTimer`]: CUDA events around a batch released together behind a latch, as
//!   nvbandwidth times copies; [`RawCopier::timed`] times the copier's own calls with it.
//! - [`RawNccl`]: NCCL's own blocking `ncclSend`/`ncclRecv` (from `ferry::bench`, which loads
//!   NCCL the way ferry's NCCL engine does).
//! - [`cpu_time`]: CPU time (user + system) of the process or of the calling thread
//!   (`getrusage`), for the CPU cost of staged copies and of a waiting thread.
//! - [`submit_raw_and_wait`]: ferry's unsafe submit followed at once by the wait, the
//!   engine's cost without the safe scope, for the latency decomposition.
//!
//! This crate is a backend bottom of its own: it calls cudarc's `sys` layer directly, and every
//! such call sits in an `unsafe` block with its `// SAFETY:` reason. Without a driver every
//! constructor returns an error; nothing panics.

mod cputime;
mod error;
mod latency;
mod raw;
mod timer;

pub use cputime::{cpu_time, minor_faults, CpuOf};
pub use error::BaselineError;
pub use ferry::bench::RawNccl;
pub use latency::{submit_raw_and_wait, submit_raw_parts, RawWait};
pub use raw::RawCopier;
pub use timer::{StreamTimer, LATCH_TIMEOUT};
