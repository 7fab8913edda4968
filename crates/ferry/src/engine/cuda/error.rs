//! The CUDA engine's set-up errors.

use thiserror::Error;

/// Why a CUDA engine or buffer could not be created.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No usable CUDA driver on this machine (the reason says which part is missing).
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// No device with this ordinal.
    #[error("no CUDA device {ordinal} (this machine has {count})")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// Devices present.
        count: u32,
    },
    /// An allocation or registration failed (out of memory included).
    #[error("cannot allocate {bytes} bytes of {what}: {msg}")]
    Alloc {
        /// What was being allocated.
        what: &'static str,
        /// Bytes asked for.
        bytes: usize,
        /// The driver's error string.
        msg: String,
    },
    /// A driver call failed.
    #[error("{call} failed: {msg}")]
    Driver {
        /// The driver call.
        call: &'static str,
        /// The driver's error string.
        msg: String,
    },
    /// A bad argument (e.g. data larger than its buffer).
    #[error("{0}")]
    InvalidArgument(String),
    /// A thread could not be started.
    #[error("cannot start thread: {0}")]
    Thread(String),
}

impl From<CudaError> for crate::Error {
    fn from(e: CudaError) -> Self {
        crate::Error::Setup(e.to_string())
    }
}
