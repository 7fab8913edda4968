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

use cudarc::driver::{result, sys};
use std::sync::OnceLock;
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
        write!(f, "{} failed: {}", self.call, error_string(self.code))
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
    Kernel(#[from] KernelError),
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

/// Why ferry's kernels (the SM copy kernels, the gather kernel, the split kernel) could not be
/// made; the copies that need them then keep to the copy engines and the driver's calls.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// No NVRTC library (`libnvrtc`) to compile them with.
    #[error("NVRTC (libnvrtc) is not available, so ferry's kernels cannot be built")]
    NvrtcMissing,
    /// NVRTC rejected the source (a bug in ferry); the compiler log is kept.
    #[error("NVRTC could not compile ferry's kernels: {0}")]
    Compile(String),
    /// A driver call failed (loading the module or a kernel).
    #[error("{op} failed: {source}")]
    Driver {
        /// The driver call.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
}

impl KernelError {
    /// The failed driver call behind this error, if one is.
    pub fn driver_error(&self) -> Option<DriverError> {
        match self {
            KernelError::Driver { op, source } => Some(DriverError::from_cudarc(op, *source)),
            _ => None,
        }
    }
}

/// `CUDA_ERROR_X: description`, as the driver words it (the name alone where the driver
/// library is not loaded: asking it would panic).
pub(crate) fn error_string(code: sys::CUresult) -> String {
    let name = format!("{code:?}");
    if !driver_present() {
        return name;
    }
    let text = result::DriverError(code)
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    if text.is_empty() {
        name
    } else {
        format!("{name}: {text}")
    }
}

/// Whether the CUDA driver library (`libcuda`) can be loaded on this machine. Never panics;
/// the answer is computed once and cached.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to open the library by its candidate names
    // (dlopen); it calls no driver function.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}
