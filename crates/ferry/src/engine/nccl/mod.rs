//! The NCCL engine: copies between device buffers of different ranks (processes or threads,
//! one GPU each, on one host or across hosts) with NCCL's send/receive, as ferry requests.
//!
//! - [`NcclEngine`]: owns one rank of a communicator, made from an [`NcclConfig`] (device,
//!   rank, number of ranks, the shared [`NcclId`], a timeout). Its requests are
//!   [`Request`](crate::Request)s like every engine's: one CUDA event each, waited, polled or
//!   awaited.
//! - Sends and receives: [`NcclScope::send`], [`NcclScope::recv`], and [`NcclScope::group`]
//!   for several at once (`ncclGroupStart`/`ncclGroupEnd`: all of them progress together, so
//!   an exchange in both directions cannot deadlock). Buffers are device memory of the
//!   engine's GPU, borrowed for the scope, which waits for every request before it returns
//!   (the safe API's scope machinery, as [`EngineExt::scope`](crate::EngineExt::scope)).
//! - Not an [`Engine`](crate::Engine): a send or a receive is one buffer and a peer rank, and
//!   it completes only when the peer posts its side, not a [`Job`](crate::Job) (a destination
//!   and a source of this process, with layouts) that one engine runs alone. The same contract
//!   as a [`Backend`](crate::Backend) whose work is a group of [`P2p`]s and the requests it
//!   starts after.
//! - Errors: a small enum, [`NcclError`] (also [`crate::Error::Nccl`]); bad input (a peer
//!   outside the communicator, a buffer shorter than the count, host memory) is refused
//!   before NCCL is called. Timeouts: the communicator is created non-blocking (unless
//!   [`NcclConfig::blocking`]) and every wait polls `ncclCommGetAsyncError`; when
//!   [`NcclConfig::timeout`] (or [`NcclConfig::init_timeout`] while joining) passes (a peer
//!   that never arrives, never posts the matching receive, or died) the communicator is
//!   aborted (`ncclCommAbort`, which stops its kernels) and the request fails with
//!   [`RequestError::Timeout`](crate::RequestError::Timeout); later submits fail with
//!   [`NcclError::Aborted`].
//! - Without the NCCL library (or without a CUDA driver) every constructor returns an error
//!   ([`NcclError::NoLibrary`], [`NcclError::Cuda`]); nothing panics. [`probe`](fn@probe) says what is
//!   there. The library is found as `$FERRY_NCCL_LIB`, `libnccl.so.2` or `libnccl.so`
//!   through the dynamic loader (`LD_LIBRARY_PATH`); for the `nvidia-nccl-cu13` Python wheel
//!   that is `$(python3 -c "import nvidia.nccl,os;print(os.path.dirname(nvidia.nccl.__file__))")/lib`.
//!   ferry sets `NCCL_NVLS_ENABLE=0` (no NVLink multicast) when it first creates a
//!   communicator, unless it is already set: ferry uses only point-to-point operations.
//!   Changing the environment while other threads read it is not thread-safe in C: set the
//!   variable before starting threads (the GPU bundle's `run.sh` does) to leave it untouched.
//!
//! # The files, bottom up
//!
//! `sys.rs` (libnccl, loaded at run time: the only file that calls into it), `error.rs`
//! ([`NcclError`]), `id.rs`, `config.rs`, `probe.rs`, `comm.rs` (a communicator: its calls
//! serialized, its abort remembered), `completion.rs` (a request's event, deadline and abort),
//! `engine.rs` (joining a communicator: [`NcclEngine`]), `submit.rs` (checks, dependencies,
//! one NCCL group per request), `scope.rs` (borrowed buffers); `raw.rs` is NCCL by hand, for
//! the benches. This file only declares and re-exports.
//!
//! # Setting up ranks
//!
//! Every rank needs the same [`NcclId`], made by rank 0. Two ways to hand it over:
//!
//! - **A file** every rank can read (`/tmp` on one host, a shared file system across hosts):
//!   [`NcclId::exchange_file`] (rank 0 writes it atomically, the others wait for it). Use a
//!   path that is new for each job.
//! - **An environment variable**: the launcher runs rank 0's `NcclId::new()` (or any program
//!   printing [`NcclId::to_hex`]) and passes the hex text to every rank; [`NcclId::from_env`].
//!
//! [`NcclConfig::from_env`] reads the whole set-up from the environment: `FERRY_NCCL_RANK`,
//! `FERRY_NCCL_NRANKS`, optionally `FERRY_NCCL_DEVICE` (default: the rank modulo the GPUs
//! of this host), `FERRY_NCCL_ID` (hex) or `FERRY_NCCL_ID_FILE` (a path, exchanged as above),
//! optionally `FERRY_NCCL_TIMEOUT_S` (default 120) and `FERRY_NCCL_INIT_TIMEOUT_S` (default:
//! the former).
//!
//! ```no_run
//! use ferry::engine::nccl::{NcclConfig, NcclEngine};
//! use ferry::cuda::DeviceBuffer;
//! // Two processes: FERRY_NCCL_RANK=0|1 FERRY_NCCL_NRANKS=2 FERRY_NCCL_ID_FILE=/tmp/job42.id
//! let engine = NcclEngine::new(NcclConfig::from_env()?)?;
//! let n = 64 << 20;
//! let peer = 1 - engine.rank();
//! let out = DeviceBuffer::from_host(engine.ordinal(), &vec![engine.rank() as u8; n])?;
//! let mut inbox = DeviceBuffer::new(engine.ordinal(), n)?;
//! engine.scope(|s| -> Result<(), Box<dyn std::error::Error>> {
//!     // Both directions at once, in one group.
//!     s.group(|g| {
//!         g.send(&out, n, peer);
//!         g.recv(&mut inbox, n, peer);
//!     })?
//!     .wait()?;
//!     Ok(())
//! })?;
//! assert!(inbox.to_vec()?.iter().all(|&b| b == peer as u8));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod comm;
mod completion;
mod config;
mod engine;
mod error;
pub mod id;
mod probe;
#[cfg(feature = "bench")]
pub(crate) mod raw;
mod scope;
mod submit;
mod sys;

pub use completion::NcclCompletion;
pub use config::NcclConfig;
pub use engine::NcclEngine;
pub use error::NcclError;
pub use id::NcclId;
pub use probe::{probe, NcclProbe};
pub use scope::{Group, NcclScope};
pub use submit::{P2p, P2pKind};

#[cfg(test)]
mod tests;
