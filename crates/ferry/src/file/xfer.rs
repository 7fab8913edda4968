//! One load or store in flight ([`Xfer`]): split into chunks that runners claim, and the
//! chunk-level I/O both runners share (the threads' loop in `exec.rs`, the io_uring runner in
//! `uring.rs`): full reads and writes with `O_DIRECT` where aligned, the byte counts, and the
//! move between a bounce slot and the buffer.

use super::cufile::Gds;
use super::error::{FileError, IoOp, MoverError};
use super::handle::FileInner;
use super::io::DIRECT_ALIGN;
use super::issue::IoIssue;
use super::ring::{Ring, Slot};
use crate::engine::{Engine, SubmitError};
use crate::memory::RawBuf;
use crate::op::OpError;
use crate::request::Signal;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A load (file -> buffer) or store (buffer -> file) split into chunks that runners claim.
pub(crate) struct Xfer {
    pub(crate) file: Arc<FileInner>,
    pub(crate) op: IoOp,
    pub(crate) offset: u64,
    pub(crate) buf: RawBuf,
    pub(crate) chunk: usize,
    pub(crate) chunks: usize,
    /// Through the ring (and `mover`, if any) instead of straight into the buffer.
    pub(crate) ring: Option<Arc<Ring>>,
    pub(crate) mover: Option<Arc<dyn Engine>>,
    /// Device buffers: the transport chosen and, for cuFile, its chunks' state.
    pub(crate) gds: Option<Gds>,
    pub(crate) direct: bool,
    pub(crate) next: AtomicUsize,
    pub(crate) failed: AtomicBool,
    pub(crate) runners: AtomicUsize,
    pub(crate) error: Mutex<Option<FileError>>,
    /// Threads or io_uring (`uring.rs`), with the reason.
    pub(crate) issue: IoIssue,
    pub(crate) direct_bytes: AtomicU64,
    pub(crate) buffered_bytes: AtomicU64,
    pub(crate) signal: Arc<Signal>,
}

// SAFETY: `buf` holds plain addresses; whoever submitted the transfer guaranteed that the memory
// stays valid and unshared until the signal completes, which happens after every runner has
// finished with it. Runners touch disjoint chunks.
unsafe impl Send for Xfer {}
// SAFETY: as above; the mutable parts are atomics and mutexes.
unsafe impl Sync for Xfer {}

impl Xfer {
    /// Moves `len` bytes between the slot (from `skip` bytes in) and the buffer at `at`
    /// (`to_buf`: slot -> buffer), and returns once they have arrived.
    pub(super) fn move_chunk(
        &self,
        slot: &mut Slot,
        skip: usize,
        at: usize,
        len: usize,
        to_buf: bool,
    ) -> Result<(), FileError> {
        let kind = slot.kind();
        debug_assert!(skip + len <= slot.len);
        let s = RawBuf::host(slot.ptr().wrapping_add(skip), len, kind);
        let b = RawBuf {
            addr: self.buf.addr + at as u64,
            len,
            kind: self.buf.kind,
        };
        let err = |e: MoverError| FileError::Transfer {
            path: self.file.path.clone(),
            offset: self.offset + at as u64,
            source: Box::new(e),
        };
        let Some(engine) = &self.mover else {
            let (src, dst) = if to_buf { (s, b) } else { (b, s) };
            // SAFETY: without a mover the buffer is host memory (checked at submit); both
            // ranges are `len` bytes inside their allocations, the slot is held by this runner
            // and the buffer's chunk is touched by no one else until the request completes.
            unsafe {
                std::ptr::copy_nonoverlapping(src.addr as *const u8, dst.addr as *mut u8, len)
            };
            return Ok(());
        };
        let l = crate::Layout::bytes(len)
            .map_err(|e| err(SubmitError::from(OpError::from(e)).into()))?;
        let (dst, src) = if to_buf { (b, s) } else { (s, b) };
        // Through `submit_copy`, the contract's one-copy entry: no job built, and an engine
        // that runs small copies at submit (the CPU engine as a mover) does so here too.
        // SAFETY: the slot is held by this runner until the wait below returns; the buffer's
        // chunk is valid memory of its kind, unshared until the whole request completes
        // (submit's contract), which happens after this wait.
        let req = unsafe { engine.submit_copy(dst, &l, src, &l) }.map_err(|e| err(e.into()))?;
        req.wait().map_err(|e| err(e.into()))
    }

    /// `pread` until `b` is full: short reads continue, end of file is an error.
    pub(super) fn read_full(&self, b: &mut [u8], off: u64) -> Result<(), FileError> {
        let need = b.len();
        let (d, n) = self.read_at_least(b, off, need)?;
        self.count(true, d);
        self.count(false, n - d);
        Ok(())
    }

    /// `pread` into `b` until at least `need` bytes are in (more may come, up to `b.len()`):
    /// short reads continue, end of file before `need` is an error. Returns (bytes read with
    /// `O_DIRECT`, bytes read in all).
    pub(super) fn read_at_least(
        &self,
        b: &mut [u8],
        off: u64,
        need: usize,
    ) -> Result<(usize, usize), FileError> {
        let (mut pos, mut direct_n) = (0, 0);
        let mut direct = self.use_direct(b.as_ptr(), b.len(), off);
        while pos < need {
            // Direct only while everything stays aligned (the tail of an unaligned length, or
            // after a short read, goes buffered).
            let want = if direct {
                (b.len() - pos) / DIRECT_ALIGN * DIRECT_ALIGN
            } else {
                need - pos
            };
            if want == 0 {
                direct = false;
                continue;
            }
            let at = off + pos as u64;
            match self.file.io.read_at(&mut b[pos..pos + want], at, direct) {
                Ok(0) => {
                    return Err(FileError::no_progress(
                        IoOp::Read,
                        &self.file.path,
                        at,
                        need - pos,
                    ))
                }
                Ok(n) => {
                    let n = n.min(want);
                    if direct {
                        direct_n += n;
                    }
                    pos += n;
                    if n % DIRECT_ALIGN != 0 {
                        direct = false;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    self.file
                        .refuse_direct(format!("an O_DIRECT read was refused: {e}"));
                    direct = false;
                }
                Err(e) => return Err(FileError::io(IoOp::Read, &self.file.path, at, want, &e)),
            }
        }
        Ok((direct_n, pos))
    }

    /// `pwrite` until all of `b` is written.
    pub(super) fn write_full(&self, b: &[u8], off: u64) -> Result<(), FileError> {
        let mut pos = 0;
        let mut direct = self.use_direct(b.as_ptr(), b.len(), off);
        while pos < b.len() {
            let want = if direct {
                (b.len() - pos) / DIRECT_ALIGN * DIRECT_ALIGN
            } else {
                b.len() - pos
            };
            if want == 0 {
                direct = false;
                continue;
            }
            let at = off + pos as u64;
            match self.file.io.write_at(&b[pos..pos + want], at, direct) {
                Ok(0) => {
                    return Err(FileError::no_progress(
                        IoOp::Write,
                        &self.file.path,
                        at,
                        want,
                    ))
                }
                Ok(n) => {
                    let n = n.min(want);
                    self.count(direct, n);
                    pos += n;
                    if n % DIRECT_ALIGN != 0 {
                        direct = false;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    self.file
                        .refuse_direct(format!("an O_DIRECT write was refused: {e}"));
                    direct = false;
                }
                Err(e) => return Err(FileError::io(IoOp::Write, &self.file.path, at, want, &e)),
            }
        }
        Ok(())
    }

    pub(super) fn use_direct(&self, p: *const u8, len: usize, off: u64) -> bool {
        self.direct
            && len >= DIRECT_ALIGN
            && (p as usize) % DIRECT_ALIGN == 0
            && off % DIRECT_ALIGN as u64 == 0
            && self.file.direct_ok().is_ok()
    }

    /// The next chunk, claimed by the calling runner: (its offset in the buffer, its length,
    /// its file offset); `None` once every chunk is claimed.
    pub(super) fn claim(&self) -> Option<(usize, usize, u64)> {
        let k = self.next.fetch_add(1, Ordering::AcqRel);
        if k >= self.chunks {
            return None;
        }
        let at = k * self.chunk;
        Some((
            at,
            self.chunk.min(self.buf.len - at),
            self.offset + at as u64,
        ))
    }

    /// Counts a chunk of `len` bytes read as the aligned span around it, `skip` bytes before
    /// its start, of which the first `direct` went `O_DIRECT`: the chunk's own bytes are
    /// direct as far as the span's were.
    pub(super) fn count_read(&self, direct: usize, skip: usize, len: usize) {
        let direct = direct.saturating_sub(skip).min(len);
        self.count(true, direct);
        self.count(false, len - direct);
    }

    pub(super) fn count(&self, direct: bool, n: usize) {
        let c = if direct {
            &self.direct_bytes
        } else {
            &self.buffered_bytes
        };
        c.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// For a read of `len` bytes at file offset `foff`: the bytes before it in its first
/// `O_DIRECT` block, and the aligned span that covers it from there.
pub(super) fn direct_span(foff: u64, len: usize) -> (usize, usize) {
    let skip = (foff % DIRECT_ALIGN as u64) as usize;
    (skip, (skip + len).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN)
}
