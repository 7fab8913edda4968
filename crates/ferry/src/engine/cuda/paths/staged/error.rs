//! Why a staged copy (or making a [`Stager`](super::Stager)) failed, and how that reaches the
//! engine's errors.

use crate::engine::cuda::sys::error::DriverError as FerryDriverError;
use crate::engine::cuda::CudaError;
use cudarc::driver::result::DriverError;
use thiserror::Error;

/// Why a staged copy (or making a [`Stager`](super::Stager)) failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StagedError {
    /// A configuration value is out of range.
    #[error("bad staging config: {0}")]
    BadConfig(String),
    /// A CUDA driver call failed; `op` names it, `source` keeps the driver's error.
    #[error("{op} failed: {source}")]
    Driver {
        /// The driver call.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// An address computation overflowed (a plan too large for the given base addresses).
    #[error("address overflow: base {base:#x} + {bytes} bytes")]
    AddressOverflow {
        /// Base address.
        base: u64,
        /// Byte offset past it.
        bytes: usize,
    },
    /// A worker thread panicked while copying (a bug; the copy's bytes are unspecified).
    #[error("a staging worker thread panicked")]
    WorkerPanicked,
    /// The worker threads could not be started.
    #[error("could not start staging worker threads: {0}")]
    Spawn(#[source] std::io::Error),
    /// A staged segment list: a segment out of its buffer (checked before anything runs), or
    /// the device-side scatter (gather) of a chunk failed.
    #[error("staged segment list: {0}")]
    Segments(#[from] crate::engine::cuda::paths::gather::GatherError),
}

pub(super) fn drv(op: &'static str) -> impl FnOnce(DriverError) -> StagedError {
    move |source| StagedError::Driver { op, source }
}

/// A failed call of the backend's shared driver helpers, as a staging error.
pub(super) fn driver_error(e: FerryDriverError) -> StagedError {
    StagedError::Driver {
        op: e.call,
        source: DriverError(e.code),
    }
}

impl From<StagedError> for CudaError {
    fn from(e: StagedError) -> Self {
        use StagedError as S;
        match e {
            S::Driver { op, source } => {
                CudaError::Driver(crate::engine::cuda::DriverError::from_cudarc(op, source))
            }
            S::Spawn(io) => CudaError::Thread(io.to_string()),
            e @ S::WorkerPanicked => CudaError::Thread(e.to_string()),
            S::Segments(g) => CudaError::from(g),
            e @ (S::BadConfig(_) | S::AddressOverflow { .. }) => {
                CudaError::InvalidArgument(e.to_string())
            }
        }
    }
}

impl From<StagedError> for crate::RequestError {
    /// A staged copy's failure: the driver's error as it is, a worker's panic as a panic.
    fn from(e: StagedError) -> Self {
        match e {
            e @ StagedError::WorkerPanicked => crate::RequestError::Panicked {
                op: "staged copy".into(),
                msg: e.to_string(),
            },
            e => CudaError::from(e).into(),
        }
    }
}

impl From<crate::staging::WorkerError> for StagedError {
    /// The staging workers' failure, as the staged path has always named it.
    fn from(e: crate::staging::WorkerError) -> Self {
        use crate::staging::WorkerError as W;
        match e {
            W::BadConfig(m) => StagedError::BadConfig(m),
            W::Panicked => StagedError::WorkerPanicked,
            W::Spawn(io) => StagedError::Spawn(io),
        }
    }
}
