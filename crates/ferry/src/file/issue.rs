//! How a transfer's reads and writes are issued: by the worker threads, one blocking call
//! each, or through io_uring (`uring.rs`), many in flight per thread. The choice, per transfer,
//! in one pure function ([`choose`]): io_uring when it is asked for ([`UringMode`]), the kernel
//! allows it (a process-wide probe, `uring::kernel`), and the transfer has an aligned
//! `O_DIRECT` part on an OS file; else the worker threads, with the reason. CPU tests in
//! `issue/tests.rs`.

use super::io::DIRECT_ALIGN;
use crate::env::EnvValue;

/// Whether a [`FileEngine`](super::FileEngine) issues `O_DIRECT` reads and writes through
/// io_uring ([`FileConfig::uring`](super::FileConfig::uring), `FERRY_FILE_URING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum UringMode {
    /// Never: worker threads `pread`/`pwrite` (`off`).
    Off,
    /// Where the kernel allows it, else threads (`auto`, the default).
    #[default]
    Auto,
    /// Always where a transfer has an `O_DIRECT` part; an engine refuses to start on a kernel
    /// without io_uring ([`FileError::Setup`](super::FileError::Setup)) (`on`).
    On,
}

impl EnvValue for UringMode {
    const EXPECTED: &'static str = "off, on or auto";
    fn parse_env(text: &str) -> Option<UringMode> {
        crate::env::word(
            text,
            &[
                ("off", UringMode::Off),
                ("auto", UringMode::Auto),
                ("on", UringMode::On),
            ],
        )
    }
}

/// How a transfer's reads or writes were issued (one field of
/// [`IoReport`](super::IoReport)).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IoIssue {
    /// Through io_uring, up to `depth` in flight per runner thread.
    Uring {
        /// Queue depth.
        depth: usize,
    },
    /// By the worker threads, one blocking call each.
    Threads {
        /// Why not io_uring.
        why: String,
    },
}

impl std::fmt::Display for IoIssue {
    /// `io_uring, depth 32` or `threads (io_uring unavailable: EPERM)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoIssue::Uring { depth } => write!(f, "io_uring, depth {depth}"),
            IoIssue::Threads { why } => write!(f, "threads ({why})"),
        }
    }
}

/// The choice for one transfer. `kernel`: the probe ([`kernel`](super::uring::kernel): `Err(errno)`
/// when `io_uring_setup` failed); `direct`: the file's `O_DIRECT` state
/// ([`super::FileHandle::direct`]); `aligned`: the transfer has a part `O_DIRECT` can take (at
/// least one aligned block: an aligned buffer and offset, or a read through the bounce ring); `fd`:
/// the file has an `O_DIRECT` descriptor to submit on ([`super::FileIo::direct_fd`]).
pub(crate) fn choose(
    mode: UringMode,
    depth: usize,
    kernel: Result<(), i32>,
    direct: Result<(), String>,
    aligned: bool,
    fd: bool,
) -> IoIssue {
    let why = if mode == UringMode::Off {
        "io_uring off: FileConfig::uring or FERRY_FILE_URING=off".to_string()
    } else if let Err(e) = kernel {
        format!("io_uring unavailable: {}", errno_name(e))
    } else if let Err(why) = direct {
        format!("no O_DIRECT part: {why}")
    } else if !aligned {
        format!("no O_DIRECT part: nothing aligned to {DIRECT_ALIGN} bytes")
    } else if !fd {
        "the file has no O_DIRECT descriptor (FileIo::direct_fd)".to_string()
    } else {
        return IoIssue::Uring { depth };
    };
    IoIssue::Threads { why }
}

/// Runner threads for an io_uring transfer of `chunks` chunks: as few as keep `depth` entries
/// in flight each, up to `slots` bounce buffers in all (ring transfers) or `depth` (straight
/// into a host buffer: one thread), at most `threads`.
pub(crate) fn runners(chunks: usize, depth: usize, slots: Option<usize>, threads: usize) -> usize {
    slots
        .unwrap_or(depth)
        .min(chunks)
        .div_ceil(depth.max(1))
        .min(threads)
}

/// The errno's name (`EPERM`), or its number.
pub(super) fn errno_name(e: i32) -> String {
    let n = match e {
        libc::ENOSYS => "ENOSYS",
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::ENOMEM => "ENOMEM",
        libc::EINVAL => "EINVAL",
        libc::EMFILE => "EMFILE",
        _ => return format!("errno {e}"),
    };
    n.to_string()
}

#[cfg(test)]
mod tests;
