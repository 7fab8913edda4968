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
use pyo3::exceptions::{PyFileNotFoundError, PyPermissionError};
use pyo3::prelude::*;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

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

/// The exception for a file error on `path` (its message names the file).
fn file_err(path: &Path, e: FileError) -> PyErr {
    let msg = e.to_string();
    let shown = path.display().to_string();
    let msg = if msg.contains(&shown) {
        msg
    } else {
        format!("{shown}: {msg}")
    };
    match &e {
        FileError::Open {
            kind: ErrorKind::NotFound,
            ..
        } => PyFileNotFoundError::new_err(msg),
        FileError::Open {
            kind: ErrorKind::PermissionDenied,
            ..
        } => PyPermissionError::new_err(msg),
        FileError::BadRange(_) | FileError::OutOfRange { .. } => arg(msg),
        _ if e.driver_error().is_some() => errors::DriverError::new_err(msg),
        _ => errors::FerryError::new_err(msg),
    }
}

/// The file engine that reaches `a`: the host one, or one with `a`'s GPU's CUDA engine.
fn engine_for(py: Python<'_>, a: &Arr) -> PyResult<std::sync::Arc<ferry::file::FileEngine>> {
    match a.kind() {
        MemKind::Device { ordinal } => file_engine(py, Some(ordinal)),
        _ => file_engine(py, None),
    }
}

/// `ferry.read_file(path, out, *, offset=0, size=None) -> int`: see the module documentation.
#[pyfunction]
#[pyo3(signature = (path, out, *, offset = 0, size = None))]
pub(crate) fn read_file(
    py: Python<'_>,
    path: PathBuf,
    out: &Bound<'_, PyAny>,
    offset: u64,
    size: Option<usize>,
) -> PyResult<usize> {
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

/// `ferry.write_file(path, src, *, offset=0) -> int`: see the module documentation.
#[pyfunction]
#[pyo3(signature = (path, src, *, offset = 0))]
pub(crate) fn write_file(
    py: Python<'_>,
    path: PathBuf,
    src: &Bound<'_, PyAny>,
    offset: u64,
) -> PyResult<usize> {
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
