//! How one load or store is submitted: validated (the range, the buffer's reach), decided (the
//! transport, `O_DIRECT`, threads or io_uring, the chunks) and queued to the workers; the
//! owned and borrowed forms of [`FileEngine::load`] and [`FileEngine::store`] on top.

use super::completion::{finish_now, FileFailed, FileTransfer};
use super::cufile;
use super::engine::FileEngine;
use super::error::{FileError, IoOp};
use super::handle::FileHandle;
use super::io::DIRECT_ALIGN;
use super::issue::{self, IoIssue};
use super::report::IoReport;
use super::ring::Ring;
use super::transport::choose;
use super::uring;
use super::xfer::Xfer;
use crate::engine::Lent;
use crate::memory::{MemKind, Memory, MemoryMut, RawBuf};
use crate::request::{Request, Signal};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, PoisonError};

impl FileEngine {
    /// Loads `buf.len()` bytes at `offset` of `file` into `buf`, which the transfer owns until
    /// it completes. Refused (the buffer handed back) if the range does not fit in the file,
    /// or no engine reaches the buffer.
    pub fn load<B>(
        &self,
        file: &FileHandle,
        offset: u64,
        buf: B,
    ) -> Result<FileTransfer<B>, FileFailed<B>>
    where
        B: MemoryMut + Send + 'static,
    {
        self.lend(file, offset, buf, IoOp::Read, |b| b.raw_mut())
    }

    /// Stores all of `buf` at `offset` of `file` (the file grows as needed), owning the buffer
    /// until the transfer completes.
    pub fn store<B>(
        &self,
        file: &FileHandle,
        offset: u64,
        buf: B,
    ) -> Result<FileTransfer<B>, FileFailed<B>>
    where
        B: Memory + Send + 'static,
    {
        self.lend(file, offset, buf, IoOp::Write, |b| b.raw())
    }

    /// Submits `op` on the memory `raw` finds in `buf`, which the transfer then owns until the
    /// request completed (the safe API's [`Lent`]); refused: the buffer is handed back.
    fn lend<B>(
        &self,
        file: &FileHandle,
        offset: u64,
        buf: B,
        op: IoOp,
        raw: impl FnOnce(&mut B) -> RawBuf,
    ) -> Result<FileTransfer<B>, FileFailed<B>> {
        let lent = Lent::submit(buf, false, |b| {
            let raw = raw(b);
            // SAFETY: the buffer is lent: its memory stays valid and untouched until the
            // request completed (`Lent::submit`); a store only reads it.
            unsafe { self.submit(file, offset, raw, op) }
        });
        match lent {
            Ok((lent, x)) => Ok(FileTransfer { lent, x }),
            Err((error, buf)) => Err(FileFailed { error, buf }),
        }
    }

    /// Loads `buf.len()` bytes at `offset` into the borrowed `buf` and returns when done.
    pub fn load_into<B: MemoryMut + ?Sized>(
        &self,
        file: &FileHandle,
        offset: u64,
        buf: &mut B,
    ) -> Result<IoReport, FileError> {
        let raw = buf.raw_mut();
        // SAFETY: `buf` is mutably borrowed for this call, and `finish_now` waits for the
        // request right after submit (nothing in between can unwind) before the borrow ends.
        let (req, x) = unsafe { self.submit(file, offset, raw, IoOp::Read)? };
        finish_now(req, &x)
    }

    /// Stores all of the borrowed `buf` at `offset` and returns when done.
    pub fn store_from<B: Memory + ?Sized>(
        &self,
        file: &FileHandle,
        offset: u64,
        buf: &B,
    ) -> Result<IoReport, FileError> {
        let raw = buf.raw();
        // SAFETY: as in `load_into`; the borrow outlives the wait.
        let (req, x) = unsafe { self.submit(file, offset, raw, IoOp::Write)? };
        finish_now(req, &x)
    }

    /// Validates and queues one transfer (the pipeline's file source loads its chunks here).
    ///
    /// # Safety
    /// 1. `buf` describes memory of its kind valid for writes (`Read`) or reads (`Write`) of
    ///    its whole length until the returned request completes.
    /// 2. Nothing else reads or writes (`Read`), or writes (`Write`), those bytes until then.
    pub(crate) unsafe fn submit(
        &self,
        file: &FileHandle,
        offset: u64,
        buf: RawBuf,
        op: IoOp,
    ) -> Result<(Request, Arc<Xfer>), FileError> {
        let len = buf.len;
        let path = &file.inner.path;
        let end = offset.checked_add(len as u64).ok_or_else(|| {
            FileError::BadRange(format!("offset {offset} + {len} bytes overflows"))
        })?;
        if op == IoOp::Read && len > 0 {
            let file_len = file.len()?;
            if end > file_len {
                return Err(FileError::OutOfRange {
                    path: path.clone(),
                    offset,
                    len: len as u64,
                    file_len,
                });
            }
        }
        if len > 0 && buf.addr == 0 {
            return Err(FileError::BadRange("null buffer address".into()));
        }
        let host = buf.kind.host_accessible();
        // Buffers the CPU cannot reach: cuFile or the bounce ring (`cufile::choose`).
        let gds = (!host).then(|| self.gds.gds_for(&self.cfg, file, offset, buf, op));
        let cufile = gds.as_ref().is_some_and(|g| g.run.is_some());
        // Through the engine: buffers the CPU cannot reach, or all with `staged`.
        let moved = (!host || self.cfg.staged) && !cufile;
        // `O_DIRECT` where the buffer and the offset are not both aligned (a `Vec<u8>`): bounce
        // through the aligned ring, copied by the worker itself (reads at unaligned offsets
        // read the aligned span around each chunk; writes there stay buffered).
        let align = DIRECT_ALIGN as u64;
        let in_place = buf.addr % align == 0 && offset % align == 0;
        let bounce_direct = self.cfg.direct
            && host
            && len >= DIRECT_ALIGN
            && !in_place
            && (op == IoOp::Read || offset % align == 0)
            && self.cfg.chunk_bytes % DIRECT_ALIGN == 0
            && file.direct().is_ok();
        let ring = if len > 0 && (moved || bounce_direct) {
            let ring = self.ring()?;
            if moved {
                self.check_mover(buf.kind, ring.kind, op)?;
            }
            Some(ring)
        } else {
            None
        };
        // Host transfers spread over every worker (chunks of at least 256 KiB, multiples of
        // the direct alignment); ring transfers use whole bounce buffers.
        let chunk = if ring.is_some() || cufile {
            self.cfg.chunk_bytes
        } else {
            let spread = len
                .div_ceil(self.cfg.threads)
                .div_ceil(DIRECT_ALIGN)
                .saturating_mul(DIRECT_ALIGN)
                .max(256 << 10);
            self.cfg.chunk_bytes.min(spread)
        };
        let chunks = len.div_ceil(chunk);
        let signal = Arc::new(Signal::new());
        let aligned = self.cfg.direct
            && len >= DIRECT_ALIGN
            && (in_place || (ring.is_some() && (op == IoOp::Read || offset % align == 0)));
        // cuFile issues its own reads and writes (the workers call it); io_uring only feeds
        // host memory and the bounce ring.
        let issue = if cufile {
            IoIssue::Threads {
                why: "cuFile issues the reads and writes".into(),
            }
        } else {
            issue::choose(
                self.cfg.uring,
                self.cfg.uring_depth,
                uring::kernel(),
                file.direct(),
                aligned,
                file.inner.io.direct_fd().is_some(),
            )
        };
        let runners = match issue {
            IoIssue::Uring { depth } => {
                let slots = ring.as_ref().map(|r| r.depth);
                issue::runners(chunks, depth, slots, self.cfg.threads)
            }
            IoIssue::Threads { .. } => chunks.min(self.cfg.threads),
        };
        let x = Arc::new(Xfer {
            file: Arc::clone(&file.inner),
            op,
            offset,
            buf,
            chunk,
            chunks,
            mover: if moved { self.mover.clone() } else { None },
            ring,
            gds,
            direct: self.cfg.direct,
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            runners: AtomicUsize::new(runners),
            error: Mutex::new(None),
            issue,
            direct_bytes: AtomicU64::new(0),
            buffered_bytes: AtomicU64::new(0),
            signal: Arc::clone(&signal),
        });
        if chunks == 0 {
            signal.complete(Ok(()));
            return Ok((Request::new(signal), x));
        }
        let tasks = (0..runners)
            .map(|_| {
                let x = Arc::clone(&x);
                Box::new(move || x.run()) as Box<dyn FnOnce() + Send>
            })
            .collect();
        self.pool.push(tasks)?;
        let req = Request::new(signal);
        self.inflight.track(&req);
        Ok((req, x))
    }

    /// Checks that the buffer can be reached from the ring: by the mover engine, or by the
    /// worker itself for host memory.
    /// Whether a transfer of `op` into (out of) memory of `kind` can be submitted, as far as
    /// that is known without opening cuFile or allocating the bounce ring: the calls that
    /// submit many transfers check every buffer first, so none is refused after others ran.
    pub(crate) fn check_reach(&self, kind: MemKind, op: IoOp) -> Result<(), FileError> {
        if kind.host_accessible() {
            return Ok(());
        }
        // cuFile may take it without an engine (`gds_for`'s first, cheap decision).
        if choose(&cufile::facts(self.cfg.cufile))
            .transport
            .is_cufile()
        {
            return Ok(());
        }
        // Else the bounce ring: pinned where there is an engine to move it.
        let ring = match self.mover {
            Some(_) => MemKind::Pinned,
            None => MemKind::Pageable,
        };
        self.check_mover(kind, ring, op)
    }

    fn check_mover(&self, kind: MemKind, ring: MemKind, op: IoOp) -> Result<(), FileError> {
        match &self.mover {
            Some(m) => {
                let ok = match op {
                    IoOp::Read => m.supports(kind, Some(ring)),
                    IoOp::Write => m.supports(ring, Some(kind)),
                };
                if ok {
                    Ok(())
                } else {
                    Err(FileError::Unsupported {
                        kind,
                        why: format!("engine `{}` cannot copy it from {ring} memory", m.name()),
                    })
                }
            }
            None if kind.host_accessible() => Ok(()),
            None => Err(FileError::Unsupported {
                kind,
                why: "this file engine has no engine for it (FileEngine::with_engine)".into(),
            }),
        }
    }

    fn ring(&self) -> Result<Arc<Ring>, FileError> {
        let mut g = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = &*g {
            return Ok(Arc::clone(r));
        }
        let depth = self.cfg.ring_depth.min(self.cfg.threads);
        let r = Arc::new(Ring::new(
            depth,
            self.cfg.chunk_bytes,
            self.mover.is_some(),
        )?);
        *g = Some(Arc::clone(&r));
        Ok(r)
    }
}
