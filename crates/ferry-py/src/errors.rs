//! Python exceptions carrying ferry's messages: `ferry.FerryError` and its subclasses.
//!
//! - `ArgumentError`: the call was wrong (shapes, dtypes, read-only destination, an object
//!   that is not an array, a layout ferry cannot express).
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

/// `value`'s `repr()` for a message (`?` where even that fails).
pub(crate) fn shown(value: &Bound<'_, PyAny>) -> String {
    value
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// `value`'s type name for a message.
fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A non-negative int argument (anything with `__index__`, not a bool) that fits `T`: an
/// `ArgumentError` naming the argument and its value otherwise, never PyO3's
/// `OverflowError` / `TypeError`.
pub(crate) fn uint<T: TryFrom<u64>>(value: &Bound<'_, PyAny>, name: &str) -> PyResult<T> {
    let max = |bits: u32| {
        if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        }
    };
    let limit = (0..=64u32)
        .rev()
        .find(|&b| T::try_from(max(b)).is_ok())
        .map_or(0, max);
    if value.is_instance_of::<pyo3::types::PyBool>() || !value.hasattr("__index__")? {
        return Err(arg(format!(
            "{name}={}: expected an int from 0 to {limit}, got {}",
            shown(value),
            type_name(value)
        )));
    }
    value
        .extract::<u64>()
        .ok()
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| {
            arg(format!(
                "{name}={}: expected an int from 0 to {limit}",
                shown(value)
            ))
        })
}

/// A bool argument (`True`/`False`, or NumPy's bool): anything else is an `ArgumentError`
/// naming the argument and the value, not PyO3's `TypeError`.
pub(crate) fn boolean(
    value: Option<&Bound<'_, PyAny>>,
    name: &str,
    default: bool,
) -> PyResult<bool> {
    let Some(v) = value else {
        return Ok(default);
    };
    v.extract::<bool>().map_err(|_| {
        arg(format!(
            "{name}={}: expected True or False, got {}",
            shown(v),
            type_name(v)
        ))
    })
}

/// A `str` argument (a message naming the argument and the value otherwise).
pub(crate) fn string(value: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    value.extract::<String>().map_err(|_| {
        arg(format!(
            "{name}={}: expected a str, got {}",
            shown(value),
            type_name(value)
        ))
    })
}

/// A path argument: a `str` or an `os.PathLike` giving one. `bytes` paths are refused by
/// name (ferry's messages show paths as text).
pub(crate) fn path(value: &Bound<'_, PyAny>, name: &str) -> PyResult<std::path::PathBuf> {
    let bad = || {
        arg(format!(
            "{name}={}: expected a str or os.PathLike path, got {}",
            shown(value),
            type_name(value)
        ))
    };
    let s = if value.hasattr("__fspath__")? {
        value.call_method0("__fspath__").map_err(|_| bad())?
    } else {
        value.clone()
    };
    s.extract::<String>()
        .map(std::path::PathBuf::from)
        .map_err(|_| bad())
}

/// The exception for a submit error: a driver failure, or a bad argument.
pub(crate) fn submit(e: ferry::SubmitError) -> PyErr {
    match e {
        ferry::SubmitError::Overlap(ferry::plan::PlanError::Overlap { dst, src }) => {
            // Offsets from the lower of the two first bytes: the caller's own terms (an
            // array and a view of it), not the process's addresses.
            let base = dst.start.min(src.start);
            let (from, to) = if src.start <= dst.start {
                ("source", "destination")
            } else {
                ("destination", "source")
            };
            ArgumentError::new_err(format!(
                "source and destination overlap: source bytes {}..{}, destination bytes {}..{} \
                 (offsets from the {from}'s first byte, the {to} starting {} bytes in); ferry \
                 does not copy in place, copy through a temporary",
                src.start - base,
                src.end - base,
                dst.start - base,
                dst.end - base,
                dst.start.max(src.start) - base,
            ))
        }
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

/// The `CheckpointError` that is also Python's own exception for an OS error of this kind
/// (`FileNotFoundError`, `PermissionError`, `IsADirectoryError`, `NotADirectoryError`), made
/// once per process as a class of both (`ferry._CheckpointFileNotFoundError`, ...); None for
/// other kinds.
pub(crate) fn checkpoint_os_type(
    py: Python<'_>,
    kind: std::io::ErrorKind,
) -> PyResult<Option<Bound<'_, pyo3::types::PyType>>> {
    use pyo3::exceptions::{
        PyFileNotFoundError, PyIsADirectoryError, PyNotADirectoryError, PyPermissionError,
    };
    use std::io::ErrorKind;
    static TYPES: pyo3::sync::GILOnceCell<Vec<(ErrorKind, Py<pyo3::types::PyType>)>> =
        pyo3::sync::GILOnceCell::new();
    let types = TYPES.get_or_try_init(py, || -> PyResult<_> {
        let make = |name: &str, os: Bound<'_, pyo3::types::PyType>| -> PyResult<_> {
            let ns = pyo3::types::PyDict::new(py);
            ns.set_item("__module__", "ferry")?;
            ns.set_item(
                "__doc__",
                format!(
                    "A CheckpointError that is also a {}: the checkpoint's file could not be \
                     opened, read or written for that reason.",
                    os.name()?
                ),
            )?;
            let bases = (py.get_type::<CheckpointError>(), os);
            Ok(py
                .get_type::<pyo3::types::PyType>()
                .call1((format!("_Checkpoint{name}"), bases, ns))?
                .downcast_into::<pyo3::types::PyType>()?
                .unbind())
        };
        Ok(vec![
            (
                ErrorKind::NotFound,
                make("FileNotFoundError", py.get_type::<PyFileNotFoundError>())?,
            ),
            (
                ErrorKind::PermissionDenied,
                make("PermissionError", py.get_type::<PyPermissionError>())?,
            ),
            (
                ErrorKind::IsADirectory,
                make("IsADirectoryError", py.get_type::<PyIsADirectoryError>())?,
            ),
            (
                ErrorKind::NotADirectory,
                make("NotADirectoryError", py.get_type::<PyNotADirectoryError>())?,
            ),
        ])
    })?;
    Ok(types
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, t)| t.bind(py).clone()))
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
