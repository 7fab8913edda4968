//! The one error type of the baselines.

use cudarc::driver::{sys, DriverError};
use ferry::cuda::CudaError;
use thiserror::Error;

/// Why a baseline or a timing failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BaselineError {
    /// From ferry: no driver, no such device, a buffer, or a plan's driver calls.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A driver call of the baseline failed.
    #[error("{call} failed: {msg}")]
    Driver {
        /// The driver call.
        call: &'static str,
        /// The driver's result code (e.g. `CUDA_ERROR_OUT_OF_MEMORY`).
        code: sys::CUresult,
        /// The driver's error name and string.
        msg: String,
    },
    /// The SM copy kernel could not be made or launched.
    #[error("{call} failed: {msg}")]
    Kernel {
        /// What failed (set-up or launch).
        call: &'static str,
        /// ferry's error text.
        msg: String,
    },
    /// A bad argument (a copy larger than its buffers).
    #[error("{0}")]
    InvalidArgument(String),
    /// The watchdog thread could not be started.
    #[error("cannot start thread: {0}")]
    Thread(String),
    /// [`crate::StreamTimer::seconds`] before anything was timed.
    #[error("StreamTimer::seconds: nothing was timed")]
    NothingTimed,
    /// The latch stayed closed for [`crate::LATCH_TIMEOUT`] and the watchdog opened it: a call
    /// inside the timed section waited for the stream, so the figure would be wrong.
    #[error(
        "the latch stayed closed for {} s and was opened by the watchdog: a call inside \
         StreamTimer::time waited for the stream",
        crate::LATCH_TIMEOUT.as_secs()
    )]
    Watchdog,
}

impl BaselineError {
    /// A failed driver call, with the driver's `CUDA_ERROR_X: description`.
    pub(crate) fn driver(call: &'static str, code: sys::CUresult) -> BaselineError {
        let text = DriverError(code)
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let msg = match text.is_empty() {
            true => format!("{code:?}"),
            false => format!("{code:?}: {text}"),
        };
        BaselineError::Driver { call, code, msg }
    }
}

/// Turns a driver result into `Result`, naming the call.
pub(crate) fn check(call: &'static str, code: sys::CUresult) -> Result<(), BaselineError> {
    match code {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        c => Err(BaselineError::driver(call, c)),
    }
}
