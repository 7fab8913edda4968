//! [`NcclError`]: why an NCCL engine could not be made or a send/receive could not be
//! submitted; NCCL's own result code and error string kept.

use super::sys;
use crate::engine::cuda::{CudaError, DriverError};
use std::time::Duration;
use thiserror::Error;

/// Why an NCCL engine could not be made or a send/receive could not be submitted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum NcclError {
    /// The NCCL library is not there (or too old); the reason says what was tried.
    #[error("no NCCL library: {0}")]
    NoLibrary(String),
    /// The CUDA side failed (no driver, no such device, a stream or event).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The set-up is inconsistent (rank not below the number of ranks, a missing variable).
    #[error("invalid NCCL configuration: {0}")]
    InvalidConfig(String),
    /// A unique id could not be parsed.
    #[error("bad NCCL unique id: {0}")]
    BadId(String),
    /// Reading or writing the id file failed.
    #[error("{path}: {msg}")]
    Io {
        /// The file.
        path: String,
        /// The system's error.
        msg: String,
    },
    /// Something did not happen in time (a peer that never arrived); the communicator, if
    /// there was one, was aborted.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The limit.
        after: Duration,
    },
    /// An NCCL call failed; NCCL's own error string is kept.
    #[error("{call} failed: {msg}")]
    Nccl {
        /// The call.
        call: &'static str,
        /// NCCL's result code.
        code: i32,
        /// NCCL's error string (and its last error text, where it has one).
        msg: String,
    },
    /// The communicator was aborted after an earlier error or timeout; make a new engine.
    #[error("the NCCL communicator was aborted: {0}")]
    Aborted(String),
    /// A send or receive that cannot be right (peer outside the communicator, a buffer shorter
    /// than the count, memory that is not on this engine's GPU).
    #[error("{0}")]
    InvalidArgument(String),
}

impl NcclError {
    /// NCCL call `call` returned `code`: [`NcclError::Nccl`] with NCCL's error string, and the
    /// communicator's last error text where `comm` names one.
    pub(super) fn nccl(
        call: &'static str,
        code: i32,
        comm: Option<(&sys::Lib, sys::Comm)>,
    ) -> NcclError {
        let msg = match (comm, sys::lib()) {
            (Some((lib, c)), _) => lib.message(code, Some(c)),
            (None, Ok(lib)) => lib.message(code, None),
            (None, Err(_)) => format!("NCCL error {code}"),
        };
        NcclError::Nccl { call, code, msg }
    }
}

impl From<DriverError> for NcclError {
    fn from(e: DriverError) -> Self {
        NcclError::Cuda(e.into())
    }
}
