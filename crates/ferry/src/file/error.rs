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
        /// The engine's error, as it is (a driver's code kept); boxed, as it is larger than
        /// the other variants.
        source: Box<MoverError>,
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
        code: CuFileCode,
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
    /// A read or write call that moved nothing: end of file inside a read's range
    /// ([`FileError::UnexpectedEof`], `missing` bytes short), or a write that wrote nothing.
    pub(crate) fn no_progress(
        op: IoOp,
        path: &std::path::Path,
        offset: u64,
        missing: usize,
    ) -> FileError {
        match op {
            IoOp::Read => FileError::UnexpectedEof {
                path: path.to_path_buf(),
                offset,
                missing,
            },
            IoOp::Write => {
                let e = std::io::Error::from(std::io::ErrorKind::WriteZero);
                FileError::io(IoOp::Write, path, offset, missing, &e)
            }
        }
    }

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

/// Why a chunk could not be moved between the bounce ring and the buffer
/// ([`FileError::Transfer`]): the error of the engine given to
/// [`FileEngine::with_engine`](super::FileEngine::with_engine), or of the driver call that
/// makes the buffer's context current before a cuFile call, as it is (a driver's code kept:
/// [`MoverError::driver_error`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum MoverError {
    /// The engine refused the copy.
    #[error(transparent)]
    Submit(#[from] crate::engine::SubmitError),
    /// The copy failed.
    #[error(transparent)]
    Request(#[from] crate::request::RequestError),
    /// The buffer's context could not be made current (cuFile).
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
}

impl MoverError {
    /// The failed CUDA driver call behind this error, if one is.
    pub fn driver_error(&self) -> Option<crate::cuda::DriverError> {
        match self {
            MoverError::Submit(e) => e.driver_error(),
            MoverError::Request(e) => e.driver_error(),
            MoverError::Cuda(e) => e.driver_error(),
        }
    }
}

/// A failed cuFile call's code, as cuFile gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CuFileCode {
    /// cuFile's own error: its `CUfileOpError` value (kept raw, so that a value newer than this
    /// build is kept too: [`CuFileCode::op_error`] names it), and the CUDA driver's `CUresult`
    /// value where cuFile returned one (0 otherwise).
    Op {
        /// The `CUfileOpError` value (5001 and up).
        code: u32,
        /// The `CUresult` value, for `CU_FILE_CUDA_DRIVER_ERROR`.
        cuda: u32,
    },
    /// The operating system's error (`cuFileRead`/`cuFileWrite` returned -1 and set `errno`).
    Os {
        /// The `errno` value.
        errno: i32,
    },
}

impl CuFileCode {
    /// cudarc's name for an [`Op`](CuFileCode::Op) code, where this build knows it.
    pub fn op_error(&self) -> Option<cudarc::cufile::sys::CUfileOpError> {
        match *self {
            CuFileCode::Op { code, .. } => OP_ERRORS.iter().copied().find(|e| *e as u32 == code),
            CuFileCode::Os { .. } => None,
        }
    }
}

impl std::fmt::Display for CuFileCode {
    /// `CU_FILE_IO_NOT_SUPPORTED (5008)`, `... CUresult 700`, `errno 5: Input/output error`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            CuFileCode::Op { code, cuda } => {
                match self.op_error() {
                    Some(e) => write!(f, "{e:?} ({code})")?,
                    None => write!(f, "CUfileOpError {code}")?,
                }
                if cuda != 0 {
                    write!(f, ", CUresult {cuda}")?;
                }
                Ok(())
            }
            CuFileCode::Os { errno } => write!(
                f,
                "errno {errno}: {}",
                std::io::Error::from_raw_os_error(errno)
            ),
        }
    }
}

use cudarc::cufile::sys::CUfileOpError as E;
const OP_ERRORS: &[cudarc::cufile::sys::CUfileOpError] = &[
    E::CU_FILE_DRIVER_NOT_INITIALIZED,
    E::CU_FILE_DRIVER_INVALID_PROPS,
    E::CU_FILE_DRIVER_UNSUPPORTED_LIMIT,
    E::CU_FILE_DRIVER_VERSION_MISMATCH,
    E::CU_FILE_DRIVER_VERSION_READ_ERROR,
    E::CU_FILE_DRIVER_CLOSING,
    E::CU_FILE_PLATFORM_NOT_SUPPORTED,
    E::CU_FILE_IO_NOT_SUPPORTED,
    E::CU_FILE_DEVICE_NOT_SUPPORTED,
    E::CU_FILE_NVFS_DRIVER_ERROR,
    E::CU_FILE_CUDA_DRIVER_ERROR,
    E::CU_FILE_CUDA_POINTER_INVALID,
    E::CU_FILE_CUDA_MEMORY_TYPE_INVALID,
    E::CU_FILE_CUDA_POINTER_RANGE_ERROR,
    E::CU_FILE_CUDA_CONTEXT_MISMATCH,
    E::CU_FILE_INVALID_MAPPING_SIZE,
    E::CU_FILE_INVALID_MAPPING_RANGE,
    E::CU_FILE_INVALID_FILE_TYPE,
    E::CU_FILE_INVALID_FILE_OPEN_FLAG,
    E::CU_FILE_DIO_NOT_SET,
    E::CU_FILE_INVALID_VALUE,
    E::CU_FILE_MEMORY_ALREADY_REGISTERED,
    E::CU_FILE_MEMORY_NOT_REGISTERED,
    E::CU_FILE_PERMISSION_DENIED,
    E::CU_FILE_DRIVER_ALREADY_OPEN,
    E::CU_FILE_HANDLE_NOT_REGISTERED,
    E::CU_FILE_HANDLE_ALREADY_REGISTERED,
    E::CU_FILE_DEVICE_NOT_FOUND,
    E::CU_FILE_INTERNAL_ERROR,
    E::CU_FILE_GETNEWFD_FAILED,
    E::CU_FILE_NVFS_SETUP_ERROR,
    E::CU_FILE_IO_DISABLED,
    E::CU_FILE_BATCH_SUBMIT_FAILED,
    E::CU_FILE_GPU_MEMORY_PINNING_FAILED,
    E::CU_FILE_BATCH_FULL,
    E::CU_FILE_ASYNC_NOT_SUPPORTED,
    E::CU_FILE_INTERNAL_BATCH_SETUP_ERROR,
    E::CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR,
    E::CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR,
    E::CU_FILE_INTERNAL_BATCH_CANCEL_ERROR,
    E::CU_FILE_NOMEM_ERROR,
    E::CU_FILE_IO_ERROR,
    E::CU_FILE_INTERNAL_BUF_REGISTER_ERROR,
    E::CU_FILE_HASH_OPR_ERROR,
    E::CU_FILE_INVALID_CONTEXT_ERROR,
    E::CU_FILE_NVFS_INTERNAL_DRIVER_ERROR,
    E::CU_FILE_BATCH_NOCOMPAT_ERROR,
    E::CU_FILE_IO_MAX_ERROR,
];
