//! The CUDA engine's errors: [`DriverError`], a failed driver call that keeps the driver's own
//! result code (so a caller can match out-of-memory), and [`CudaError`], why an engine, a
//! buffer or a helper object could not be made. Both travel unchanged, never as strings,
//! through [`SubmitError`](crate::SubmitError), [`RequestError`](crate::RequestError) and
//! [`ferry::Error`](crate::Error); each of those has a `driver_error()` that finds the driver's
//! code wherever it sits.
//!
//! ```
//! use ferry::cuda::{CudaError, DriverError};
//! use cudarc::driver::sys::CUresult;
//! let e = DriverError::new("cuMemAlloc", CUresult::CUDA_ERROR_OUT_OF_MEMORY);
//! let err: ferry::Error = CudaError::Alloc { what: "device memory", bytes: 1 << 40, source: e }.into();
//! assert!(err.driver_error().is_some_and(|d| d.is_out_of_memory()));
//! ```

use cudarc::driver::sys;
use thiserror::Error;

/// A failed CUDA driver call: which call, and the driver's result code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverError {
    /// The driver call (`cuMemAlloc`, `cuMemcpyAsync`, ...).
    pub call: &'static str,
    /// The driver's result, e.g. `CUresult::CUDA_ERROR_OUT_OF_MEMORY`.
    pub code: sys::CUresult,
}

impl DriverError {
    /// The failure of `call` with `code`.
    pub fn new(call: &'static str, code: sys::CUresult) -> DriverError {
        DriverError { call, code }
    }
    /// cudarc's error of `call`.
    pub fn from_cudarc(call: &'static str, e: cudarc::driver::DriverError) -> DriverError {
        DriverError { call, code: e.0 }
    }
    /// True for `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn is_out_of_memory(&self) -> bool {
        self.code == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
    }
    /// The code's name, `CUDA_ERROR_OUT_OF_MEMORY` (no driver call).
    pub fn name(&self) -> String {
        format!("{:?}", self.code)
    }
}

impl std::fmt::Display for DriverError {
    /// `cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory` (the driver's own text,
    /// where its library is loaded).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failed: {}",
            self.call,
            super::driver::error_string(self.code)
        )
    }
}

impl std::error::Error for DriverError {}

/// Why a CUDA engine, a buffer or one of the engine's helpers (staging ring, kernels) could not
/// be made.
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
    #[error("cannot allocate {bytes} bytes of {what}: {source}")]
    Alloc {
        /// What was being allocated.
        what: &'static str,
        /// Bytes asked for.
        bytes: usize,
        /// The driver's error.
        source: DriverError,
    },
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// ferry's kernels could not be made (no NVRTC, a compile or module-load failure).
    #[error(transparent)]
    Kernel(#[from] super::KernelError),
    /// A bad argument (e.g. data larger than its buffer, a staging setting out of range).
    #[error("{0}")]
    InvalidArgument(String),
    /// A thread could not be started.
    #[error("cannot start thread: {0}")]
    Thread(String),
}

impl CudaError {
    /// The failed driver call behind this error, if one is.
    pub fn driver_error(&self) -> Option<DriverError> {
        match self {
            CudaError::Alloc { source, .. } => Some(*source),
            CudaError::Driver(d) => Some(*d),
            CudaError::Kernel(k) => k.driver_error(),
            _ => None,
        }
    }
}

impl From<super::staged::StagedError> for CudaError {
    fn from(e: super::staged::StagedError) -> Self {
        use super::staged::StagedError as S;
        match e {
            S::Driver { op, source } => CudaError::Driver(DriverError::from_cudarc(op, source)),
            S::Spawn(io) => CudaError::Thread(io.to_string()),
            e @ S::WorkerPanicked => CudaError::Thread(e.to_string()),
            S::Segments(g) => CudaError::from(g),
            e @ (S::BadConfig(_) | S::AddressOverflow { .. }) => {
                CudaError::InvalidArgument(e.to_string())
            }
        }
    }
}

impl From<super::gather::GatherError> for CudaError {
    fn from(e: super::gather::GatherError) -> Self {
        use super::gather::GatherError as G;
        match e {
            G::Kernel(k) => CudaError::Kernel(k),
            G::Driver { op, source } => CudaError::Driver(DriverError::from_cudarc(op, source)),
            G::Batch(source) => {
                CudaError::Driver(DriverError::from_cudarc("cuMemcpyBatchAsync", source))
            }
            e => CudaError::InvalidArgument(e.to_string()),
        }
    }
}

impl From<super::strided::SmError> for CudaError {
    fn from(e: super::strided::SmError) -> Self {
        use super::strided::SmError as S;
        match e {
            S::Kernel(k) => CudaError::Kernel(k),
            S::Driver { op, source } => CudaError::Driver(DriverError::from_cudarc(op, source)),
            e => CudaError::InvalidArgument(e.to_string()),
        }
    }
}

impl From<super::staged::StagedError> for crate::RequestError {
    /// A staged copy's failure: the driver's error as it is, a worker's panic as a panic.
    fn from(e: super::staged::StagedError) -> Self {
        match e {
            e @ super::staged::StagedError::WorkerPanicked => crate::RequestError::Panicked {
                op: "staged copy".into(),
                msg: e.to_string(),
            },
            e => CudaError::from(e).into(),
        }
    }
}
