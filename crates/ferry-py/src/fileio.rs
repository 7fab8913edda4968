//! `ferry.read_file(path, out, *, offset=0, size=None)` and
//! `ferry.write_file(path, src, *, offset=0)`: a file's bytes into an existing array, or an
//! array's bytes into a file, through ferry's [`FileEngine`](ferry::file::FileEngine) (its
//! parallel reads and writes; device memory through pinned bounce buffers and the GPU's CUDA
//! engine), as KvikIO's `CuFile.pread`/`pwrite` followed by a wait.
//!
//! - `read_file` reads up to `size` bytes (default: all of `out`'s) at `offset` into the start
//!   of `out` (a C-contiguous, writable array, host or device) and returns how many it read:
//!   fewer where the file ends first, 0 at or past its end.
//! - `write_file` writes all of `src` (a C-contiguous array) at `offset`, creating the file if
//!   missing; an existing file is not truncated (as `pwrite`). Returns the bytes written.
//!
//! Both block with the GIL released. A device array is first ordered after its producer's
//! stream (PyTorch's current stream for a PyTorch tensor, the array interface's `stream`, the
//! legacy default stream for other DLPack producers): the host waits for that stream's work
//! queued so far, as the copy must see it; when the call returns, the bytes are in place.
//! Errors name the file: `FileNotFoundError` / `PermissionError` when it cannot be opened for
//! those reasons, `ArgumentError` for a bad array or range, `DriverError` for a CUDA failure,
//! else `FerryError`.

use crate::array::{Arr, Held};
use crate::ckpt::file_engine;
use crate::copy::after_producer;
use crate::errors::{self, arg};
use ferry::file::{FileError, OpenMode};
use ferry::{MemKind, RawBuf};
use pyo3::exceptions::{
    PyFileExistsError, PyFileNotFoundError, PyIsADirectoryError, PyNotADirectoryError,
    PyPermissionError,
};
use pyo3::prelude::*;
use std::io::ErrorKind;
use std::path::Path;

/// The array as one contiguous byte range, for the file engine.
pub(crate) fn contiguous(a: &Arr, role: &str) -> PyResult<RawBuf> {
    if a.layout.is_some_and(|l| !l.is_contiguous()) {
        return Err(arg(format!(
            "{role} {} is not C-contiguous (pass a contiguous array or a contiguous view)",
            a.describe()
        )));
    }
    Ok(RawBuf {
        len: a.numel() * a.dtype.size,
        ..a.raw
    })
}

/// The exception for a file error on `path` (its message names the file): Python's own
/// `OSError` subclass where the system's error has one (`FileNotFoundError`,
/// `PermissionError`, `IsADirectoryError`, ...), for opening and for reading or writing
/// alike, else ferry's.
fn file_err(path: &Path, e: FileError) -> PyErr {
    let msg = e.to_string();
    let shown = path.display().to_string();
    let msg = if msg.contains(&shown) {
        msg
    } else {
        format!("{shown}: {msg}")
    };
    let kind = match &e {
        // The file engine refuses what is not a regular file or block device after opening
        // it (`InvalidInput`): a directory is still Python's `IsADirectoryError`.
        FileError::Open { .. } if path.is_dir() => Some(ErrorKind::IsADirectory),
        FileError::Open { kind, .. } | FileError::Io { kind, .. } => Some(*kind),
        _ => None,
    };
    if let Some(err) = kind.and_then(|k| os_error(k, &msg)) {
        return err;
    }
    match &e {
        FileError::BadRange(_) | FileError::OutOfRange { .. } => arg(msg),
        _ if e.driver_error().is_some() => errors::DriverError::new_err(msg),
        _ => errors::FerryError::new_err(msg),
    }
}

/// Python's own exception for an OS error of this kind (as `open()` raises it), with ferry's
/// message; None for kinds without one of their own.
pub(crate) fn os_error(kind: ErrorKind, msg: &str) -> Option<PyErr> {
    let msg = msg.to_string();
    Some(match kind {
        ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
        ErrorKind::PermissionDenied => PyPermissionError::new_err(msg),
        ErrorKind::IsADirectory => PyIsADirectoryError::new_err(msg),
        ErrorKind::NotADirectory => PyNotADirectoryError::new_err(msg),
        ErrorKind::AlreadyExists => PyFileExistsError::new_err(msg),
        _ => return None,
    })
}

/// The file engine that reaches `a`: the host one, or one with `a`'s GPU's CUDA engine.
fn engine_for(py: Python<'_>, a: &Arr) -> PyResult<std::sync::Arc<ferry::file::FileEngine>> {
    match a.kind() {
        MemKind::Device { ordinal } => file_engine(py, Some(ordinal)),
        _ => file_engine(py, None),
    }
}

/// Reads a file's bytes into an existing array, in place (as KvikIO's ``pread`` + wait).
///
/// Args:
///     path (str | os.PathLike[str]): the file.
///     out: a C-contiguous, writable array (host or GPU) that receives the bytes at its start.
///     offset (int): the file offset to read from (0 or more).
///     size (int | None): bytes to read (default: all of ``out``'s); not more than ``out`` holds.
///
/// Returns:
///     int: the bytes read: fewer than asked where the file ends first, 0 at or past its end.
///
/// Raises:
///     FileNotFoundError, PermissionError, IsADirectoryError: the file cannot be opened or
///         read (ferry's message names the file).
///     ArgumentError: a bad array, ``offset`` or ``size`` (the message names it).
///     DriverError: a CUDA failure. FerryError: any other failure.
///
/// Example:
///     >>> buf = numpy.empty(1024, dtype=numpy.uint8)
///     >>> n = ferry.read_file("data.bin", buf, offset=4096)
#[pyfunction]
#[pyo3(
    signature = (path, out, *, offset = None, size = None),
    text_signature = "(path, out, *, offset=0, size=None)"
)]
pub(crate) fn read_file(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    offset: Option<&Bound<'_, PyAny>>,
    size: Option<&Bound<'_, PyAny>>,
) -> PyResult<usize> {
    let path = errors::path(path, "path")?;
    let offset: u64 = offset.map_or(Ok(0), |o| errors::uint(o, "offset"))?;
    let size: Option<usize> = match size.filter(|s| !s.is_none()) {
        Some(s) => Some(errors::uint(s, "size")?),
        None => None,
    };
    let a = Arr::from_py(out, Some(1))?;
    a.writable("out")?;
    let mut raw = contiguous(&a, "out")?;
    if let Some(n) = size {
        if n > raw.len {
            return Err(arg(format!(
                "size={n} is more than out's {} bytes ({})",
                raw.len,
                a.describe()
            )));
        }
        raw.len = n;
    }
    if raw.len == 0 {
        return Ok(0);
    }
    let fe = engine_for(py, &a)?;
    after_producer(py, &a, &mut Vec::new())?;
    let n = py
        .allow_threads(|| {
            let file = fe.open(&path, OpenMode::Read)?;
            fe.load_up_to(&file, offset, &mut Held(raw))
        })
        .map_err(|e| file_err(&path, e))?
        .0;
    drop(a);
    Ok(n)
}

/// Writes all of an array's bytes into a file at ``offset`` (as KvikIO's ``pwrite`` + wait),
/// creating the file if missing; an existing file is not truncated.
///
/// Args:
///     path (str | os.PathLike[str]): the file.
///     src: a C-contiguous array (host or GPU).
///     offset (int): the file offset to write at (0 or more).
///
/// Returns:
///     int: the bytes written (all of ``src``'s).
///
/// Raises:
///     FileNotFoundError, PermissionError, IsADirectoryError: the file cannot be created,
///         opened or written (ferry's message names the file).
///     ArgumentError: a bad array or ``offset`` (the message names it).
///     DriverError: a CUDA failure. FerryError: any other failure.
///
/// Example:
///     >>> ferry.write_file("data.bin", numpy.arange(256, dtype=numpy.uint8))
///     256
#[pyfunction]
#[pyo3(
    signature = (path, src, *, offset = None),
    text_signature = "(path, src, *, offset=0)"
)]
pub(crate) fn write_file(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    offset: Option<&Bound<'_, PyAny>>,
) -> PyResult<usize> {
    let path = errors::path(path, "path")?;
    let offset: u64 = offset.map_or(Ok(0), |o| errors::uint(o, "offset"))?;
    let a = Arr::from_py(src, Some(1))?;
    let raw = contiguous(&a, "src")?;
    let fe = engine_for(py, &a)?;
    after_producer(py, &a, &mut Vec::new())?;
    py.allow_threads(|| {
        let mode = match path.exists() {
            true => OpenMode::ReadWrite,
            false => OpenMode::Create,
        };
        let file = fe.open(&path, mode)?;
        if raw.len > 0 {
            fe.store_from(&file, offset, &Held(raw))?;
        }
        Ok(())
    })
    .map_err(|e| file_err(&path, e))?;
    drop(a);
    Ok(raw.len)
}
