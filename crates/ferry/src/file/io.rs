//! Files as the operating system sees them: positioned reads and writes ([`FileIo`]), and the
//! operating system's implementation ([`OsFile`]: a buffered descriptor plus an optional
//! `O_DIRECT` one). The engine's handle on them is `handle.rs`.

use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Alignment `O_DIRECT` transfers keep: file offset, memory address and length are multiples
/// of it (4096 covers every logical block size in use).
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// Positioned I/O on one file: what the engine's workers call, from several threads at once.
/// [`OsFile`] is the real one; tests implement it to inject faults (a read that fails at a
/// given byte). cuFile sits beside the bounce ring, not here (it opens the file's path itself,
/// with `O_DIRECT`): this trait is host memory only.
pub trait FileIo: Send + Sync + 'static {
    /// Reads up to `buf.len()` bytes at `offset` (`pread`). `direct`: through the `O_DIRECT`
    /// descriptor (the engine asks only when [`FileIo::direct`] said yes and `offset`, the
    /// buffer's address and its length are multiples of 4,096 bytes, `O_DIRECT`'s alignment). Returns the bytes
    /// read; 0 at end of file. May return fewer bytes than asked.
    fn read_at(&self, buf: &mut [u8], offset: u64, direct: bool) -> io::Result<usize>;
    /// Writes up to `buf.len()` bytes at `offset` (`pwrite`), as `read_at` for `direct`.
    /// Returns the bytes written.
    fn write_at(&self, buf: &[u8], offset: u64, direct: bool) -> io::Result<usize>;
    /// The file's current length in bytes.
    fn file_len(&self) -> io::Result<u64>;
    /// `Ok` when `direct` transfers can be asked for, else why not.
    fn direct(&self) -> Result<(), String>;
    /// Flushes written bytes and the file's size to stable storage (`fsync`). The default
    /// does nothing (memory-backed test files).
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    /// The `O_DIRECT` descriptor, for io_uring to submit on
    /// ([`FileConfig::uring`](super::FileConfig::uring)); it must stay open as long as the
    /// value. `None` (the default): this file's transfers use the worker threads.
    fn direct_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// How [`FileHandle::open`](super::FileHandle::open) opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpenMode {
    /// Read only (loads).
    Read,
    /// Read and write an existing file.
    ReadWrite,
    /// Read and write; created if missing, truncated to 0 bytes if present.
    Create,
}

/// A file opened by the operating system: a buffered descriptor always, and an `O_DIRECT`
/// descriptor when asked for and the filesystem accepted it.
#[derive(Debug)]
pub struct OsFile {
    buffered: std::fs::File,
    direct: Result<std::fs::File, String>,
}

impl OsFile {
    /// Opens `path`; with `direct`, also an `O_DIRECT` descriptor (its refusal is kept as the
    /// reason, not an error: transfers then run buffered).
    ///
    /// Only regular files and block devices are opened: a FIFO, socket, character device
    /// (`/dev/zero`) or directory is refused with [`io::ErrorKind::InvalidInput`] naming what
    /// it is, at once: the open itself uses `O_NONBLOCK` (cleared afterwards), so a FIFO with
    /// no writer does not block it.
    pub fn open(path: &Path, mode: OpenMode, direct: bool) -> io::Result<OsFile> {
        let opts = |extra: i32| {
            let mut o = std::fs::OpenOptions::new();
            o.read(true);
            match mode {
                OpenMode::Read => {}
                OpenMode::ReadWrite => {
                    o.write(true);
                }
                OpenMode::Create => {
                    o.write(true).create(true);
                }
            }
            o.custom_flags(extra);
            o
        };
        let buffered = {
            let mut o = opts(libc::O_NONBLOCK);
            if mode == OpenMode::Create {
                o.truncate(true);
            }
            o.open(path)?
        };
        check_file_type(&buffered)?;
        clear_nonblock(&buffered)?;
        let direct = if !direct {
            Err("not asked for (FileConfig::direct is off)".to_string())
        } else {
            // The file exists now (created above): no create or truncate here.
            let mut o = std::fs::OpenOptions::new();
            o.read(true).write(mode != OpenMode::Read);
            o.custom_flags(libc::O_DIRECT);
            o.open(path)
                .map_err(|e| format!("the filesystem refused O_DIRECT: {e}"))
        };
        Ok(OsFile { buffered, direct })
    }
}

impl FileIo for OsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64, direct: bool) -> io::Result<usize> {
        match (&self.direct, direct) {
            (Ok(f), true) => f.read_at(buf, offset),
            _ => self.buffered.read_at(buf, offset),
        }
    }
    fn write_at(&self, buf: &[u8], offset: u64, direct: bool) -> io::Result<usize> {
        match (&self.direct, direct) {
            (Ok(f), true) => f.write_at(buf, offset),
            _ => self.buffered.write_at(buf, offset),
        }
    }
    fn file_len(&self) -> io::Result<u64> {
        use std::os::unix::fs::FileTypeExt;
        let m = self.buffered.metadata()?;
        if !m.file_type().is_block_device() {
            return Ok(m.len());
        }
        // A block device's size is its end, not its inode's length (0).
        use std::io::Seek;
        (&self.buffered).seek(io::SeekFrom::End(0))
    }
    fn direct(&self) -> Result<(), String> {
        self.direct.as_ref().map(|_| ()).map_err(Clone::clone)
    }
    fn sync(&self) -> io::Result<()> {
        self.buffered.sync_all()
    }
    fn direct_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.direct.as_ref().ok().map(AsRawFd::as_raw_fd)
    }
}

/// Refuses what is not a regular file or a block device (`fstat` on the open descriptor, so
/// the check is about the file opened, not a path that may change).
fn check_file_type(f: &std::fs::File) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let t = f.metadata()?.file_type();
    if t.is_file() || t.is_block_device() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{}: only regular files and block devices can be loaded or stored",
            kind_words(&t)
        ),
    ))
}

/// What a file type is, in words for messages ("a FIFO (named pipe)", "a directory", ...).
pub(crate) fn kind_words(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() {
        "a regular file"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// Clears the `O_NONBLOCK` the open used (reads of a regular file ignore it; cleared anyway so
/// that the descriptor behaves as an ordinary one).
fn clear_nonblock(f: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    // SAFETY: `fd` is a descriptor owned by `f`, open for the duration of both calls; F_GETFL
    // and F_SETFL only read and set its status flags.
    let r = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            flags
        } else {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK)
        }
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reserves `len` bytes for the file at `path` and sets its size to `len` (`fallocate`, mode
/// 0): the blocks of the `O_DIRECT` writes that follow are allocated at once, and they never
/// extend the file. Errors: the system's (`EOPNOTSUPP` where the file system cannot, `ENOSPC`
/// on a full disk).
pub(crate) fn preallocate(path: &Path, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Ok(());
    }
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too large to preallocate"))?;
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    loop {
        // SAFETY: the descriptor is owned by `f`, open for the whole call; fallocate reads and
        // writes no memory of this process.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
