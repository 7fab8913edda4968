//! Python exceptions carrying ferry's messages: `ferry.FerryError` and its subclasses.
//!
//! - `ArgumentError`: the call was wrong (shapes, dtypes, read-only destination, an object
//!   that is not an array, a layout ferry cannot express). Also a `ValueError`.
//! - `DriverError`: the CUDA driver failed or is absent (its message names the call and code).
//! - `CheckpointError`: a safetensors file could not be read or written (names file and tensor).
//! - `FerryError` itself: anything else (a failed request, a worker lost).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    ferry,
    FerryError,
    PyException,
    "Base class of every ferry error."
);
create_exception!(
    ferry,
    ArgumentError,
    FerryError,
    "A bad argument: shapes or dtypes that differ, a read-only destination, an object that is not an array."
);
create_exception!(
    ferry,
    DriverError,
    FerryError,
    "The CUDA driver failed (the message names the call and the driver's code) or is absent."
);
create_exception!(
    ferry,
    CheckpointError,
    FerryError,
    "A safetensors checkpoint could not be loaded or saved (the message names the file and tensor)."
);

/// An `ArgumentError` with this message.
pub(crate) fn arg(msg: impl Into<String>) -> PyErr {
    ArgumentError::new_err(msg.into())
}

/// The exception for a submit error: a driver failure, or a bad argument.
pub(crate) fn submit(e: ferry::SubmitError) -> PyErr {
    match e {
        ferry::SubmitError::Backend(_) => DriverError::new_err(e.to_string()),
        ferry::SubmitError::ShutDown(_) => FerryError::new_err(e.to_string()),
        e => ArgumentError::new_err(e.to_string()),
    }
}

/// The exception for a failed request.
pub(crate) fn request(e: &ferry::RequestError) -> PyErr {
    if e.driver_error().is_some() {
        DriverError::new_err(e.to_string())
    } else {
        FerryError::new_err(e.to_string())
    }
}

/// The exception for a CUDA set-up error (no driver, no device, a stream not made).
pub(crate) fn cuda(e: ferry::cuda::CudaError) -> PyErr {
    DriverError::new_err(e.to_string())
}

/// The exception for ferry's umbrella error.
pub(crate) fn ferry(e: ferry::Error) -> PyErr {
    match e {
        ferry::Error::Submit(s) => submit(s),
        ferry::Error::Request(r) => request(&r),
        ferry::Error::Cuda(c) => cuda(c),
        ferry::Error::Layout(_)
        | ferry::Error::Plan(_)
        | ferry::Error::Op(_)
        | ferry::Error::InvalidArgument(_) => ArgumentError::new_err(e.to_string()),
        e => FerryError::new_err(e.to_string()),
    }
}

/// Adds the exception classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("FerryError", py.get_type::<FerryError>())?;
    m.add("ArgumentError", py.get_type::<ArgumentError>())?;
    m.add("DriverError", py.get_type::<DriverError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    Ok(())
}
