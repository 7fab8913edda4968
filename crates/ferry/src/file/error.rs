//! The file path's error: one small enum; every I/O error names the file and the offset.

use std::path::PathBuf;
use thiserror::Error;

/// Which way an I/O call went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoOp {
    /// `pread` (file -> memory).
    Read,
    /// `pwrite` (memory -> file).
    Write,
}

impl std::fmt::Display for IoOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoOp::Read => "read",
            IoOp::Write => "write",
        })
    }
}

/// Why a file load or store failed (or was refused). A failed request reports the first error
/// of its chunks; the destination's bytes are then unspecified, never reported as loaded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FileError {
    /// The file could not be opened (or its size read).
    #[error("cannot open {}: {msg}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The system's error kind.
        kind: std::io::ErrorKind,
        /// The system's error text.
        msg: String,
    },
    /// A `pread`/`pwrite` failed.
    #[error("{op} of {len} bytes at offset {offset} of {} failed: {msg}", path.display())]
    Io {
        /// Read or write.
        op: IoOp,
        /// The file.
        path: PathBuf,
        /// Byte offset in the file of the failed call.
        offset: u64,
        /// Bytes the call asked for.
        len: usize,
        /// The system's error kind.
        kind: std::io::ErrorKind,
        /// The system's error text.
        msg: String,
    },
    /// The file ended before the requested range did, found at submit (nothing was read).
    #[error("{} is {file_len} bytes long: cannot read {len} bytes at offset {offset}", path.display())]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// Start of the range asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The file's length at submit.
        file_len: u64,
    },
    /// A read returned end of file inside the requested range (the file shrank while it was
    /// being loaded).
    #[error("unexpected end of {} at offset {offset}: {missing} bytes of the range were not there", path.display())]
    UnexpectedEof {
        /// The file.
        path: PathBuf,
        /// Offset at which the read returned 0 bytes.
        offset: u64,
        /// Bytes of that chunk still missing.
        missing: usize,
    },
    /// `offset + len` overflows, or the buffer is shorter than the range.
    #[error("bad range: {0}")]
    BadRange(String),
    /// No engine given to this file engine can reach the buffer's memory.
    #[error("cannot move file bytes to or from {kind} memory: {why}")]
    Unsupported {
        /// The buffer's kind.
        kind: crate::MemKind,
        /// Why.
        why: String,
    },
    /// The engine that moves bytes between the bounce ring and the buffer failed.
    #[error("moving the bytes at offset {offset} of {} through the bounce ring failed: {source}", path.display())]
    Transfer {
        /// The file.
        path: PathBuf,
        /// File offset of the chunk.
        offset: u64,
        /// The engine's error, as it is (a driver's code kept).
        source: Box<crate::Error>,
    },
    /// A cuFile call failed (GPUDirect Storage), with cuFile's own code.
    #[error("{call} of {len} bytes at offset {offset} of {} failed: {code}", path.display())]
    CuFile {
        /// `cuFileRead` or `cuFileWrite`.
        call: &'static str,
        /// The file.
        path: PathBuf,
        /// Byte offset in the file of the failed call.
        offset: u64,
        /// Bytes the call asked for.
        len: usize,
        /// cuFile's code.
        code: super::cufile::CuFileCode,
    },
    /// A configuration value is out of range.
    #[error("bad file engine config: {0}")]
    BadConfig(String),
    /// Threads or host bounce buffers could not be set up.
    #[error("file engine setup failed: {0}")]
    Setup(String),
    /// The pinned bounce buffers could not be made (the driver's error kept).
    #[error("file engine bounce buffers: {0}")]
    Cuda(#[from] crate::cuda::CudaError),
    /// Code run by a worker panicked (a bug); the engine stays usable.
    #[error("a file worker panicked at offset {offset} of {}: {msg}", path.display())]
    Panicked {
        /// The file.
        path: PathBuf,
        /// File offset of the chunk.
        offset: u64,
        /// The panic message.
        msg: String,
    },
    /// The engine shut down before the request ran.
    #[error("the file engine shut down")]
    ShutDown,
}

impl FileError {
    pub(crate) fn io(
        op: IoOp,
        path: &std::path::Path,
        offset: u64,
        len: usize,
        e: &std::io::Error,
    ) -> FileError {
        FileError::Io {
            op,
            path: path.to_path_buf(),
            offset,
            len,
            kind: e.kind(),
            msg: e.to_string(),
        }
    }
}

impl From<FileError> for crate::request::RequestError {
    fn from(e: FileError) -> Self {
        crate::request::RequestError::Io(e.to_string())
    }
}

impl FileError {
    /// The failed CUDA driver call behind this error, if one is.
    pub fn driver_error(&self) -> Option<crate::cuda::DriverError> {
        match self {
            FileError::Transfer { source, .. } => source.driver_error(),
            FileError::Cuda(e) => e.driver_error(),
            _ => None,
        }
    }
}
