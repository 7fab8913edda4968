//! Files <-> host memory and GPUs: byte ranges of a file loaded into any buffer ferry knows, and
//! stored back, in chunks read and written in parallel by a small pool of threads.
//!
//! - Host buffers (pageable, pinned, mapped, managed): each worker `pread`s (`pwrite`s) its
//!   chunks straight into (out of) the buffer.
//! - Other buffers (a GPU's memory): each chunk goes through one buffer of a ring of pinned
//!   bounce buffers: `pread` into the bounce buffer, then the engine given to
//!   [`FileEngine::with_engine`] (a [`CudaEngine`](crate::cuda::CudaEngine)) copies it to the
//!   device on its copy engine, while the other workers read the next chunks. Stores run the
//!   other way. This is KvikIO's "compat mode". Or GPUDirect Storage: each chunk is one
//!   `cuFileRead`/`cuFileWrite` straight between the file and the device buffer, where the
//!   `nvidia-fs` module exists, or wherever cuFile opens with [`CuFileMode::On`] (see
//!   [`choose`]). [`gds_status`] says which this host gets, and every device transfer's
//!   [`IoReport`] carries the transport used and why.
//! - `O_DIRECT` ([`FileConfig::direct`]): the file is opened a second time with `O_DIRECT`, and
//!   every piece whose file offset, memory address and length are multiples of 4096 uses it.
//!   The bounce buffers are page-aligned, so device transfers at aligned file offsets are
//!   direct throughout; reads at unaligned offsets read the aligned span around each chunk
//!   into the bounce buffer, so they are direct too. Host transfers into or out of unaligned
//!   buffers (a `Vec<u8>`) go through the bounce ring as well, copied by the worker. Writes at
//!   unaligned offsets, and the unaligned tail of a write, run buffered. A filesystem that refuses `O_DIRECT`,
//!   at open or at the first transfer, is not an error: the file runs buffered from then on.
//!   Each [`IoReport`] says how many bytes took which path and why `O_DIRECT` was not used.
//! - io_uring ([`FileConfig::uring`], on where the kernel allows it): the `O_DIRECT` part of a
//!   transfer is read (written) by fewer threads, each keeping up to
//!   [`FileConfig::uring_depth`] chunks in flight, into the buffer or the bounce ring's slots;
//!   [`IoReport::issued`] says whether io_uring or the threads issued them, and why.
//! - Errors: a read or write that fails, a file shorter than the range (checked at submit, and
//!   again by every read: a file that shrinks during a load fails it), are [`FileError`]s that
//!   name the file and the offset. Partial data is never reported as success. A failed request
//!   leaves the engine usable; nothing leaks (workers are persistent, bounce buffers return to
//!   the ring on every path).
//!
//! Requests: [`FileEngine::load`] and [`FileEngine::store`] take the buffer by value and return a
//! [`FileTransfer`] (wait, poll, or `.await` it; it hands the buffer back with an [`IoReport`]),
//! built on a [`Request`] like every engine's, and on the safe API's owned-buffer machinery
//! (the one under [`Transfer`](crate::Transfer)). [`FileEngine::load_into`] and
//! [`FileEngine::store_from`] borrow the buffer and block: they wait before they return, so
//! they need no scope. Built on them (`pieces.rs`, all blocking): [`FileEngine::read_all`] (a
//! whole file), [`FileEngine::load_up_to`] ("up to N bytes", as `pread` counts),
//! [`FileEngine::load_pieces`] (many ranges into one buffer), [`FileEngine::load_each`] (many
//! ranges, each into its own buffer) and [`FileEngine::store_pieces`], their transfers all in
//! flight at once.
//!
//! Not an [`Engine`]: a load or store moves bytes between a file and a buffer, and a
//! [`Job`](crate::Job) is two buffers of memory with layouts. A `FileEngine` takes an
//! [`Engine`] instead, for the buffers it cannot reach itself ([`FileEngine::with_engine`]).
//!
//! ```
//! use ferry::file::{FileConfig, FileEngine, OpenMode};
//! let path = std::env::temp_dir().join(format!("ferry-doc-file-{}", std::process::id()));
//! let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7) as u8).collect();
//! std::fs::write(&path, &data)?;
//!
//! let engine = FileEngine::new(FileConfig::new().threads(2))?;
//! let file = engine.open(&path, OpenMode::Read)?;
//! // 64 KiB at offset 4096, into an owned buffer handed back on completion.
//! let t = engine.load(&file, 4096, vec![0u8; 64 << 10])?;
//! let (buf, report) = t.wait()?;
//! assert_eq!(&buf[..], &data[4096..4096 + (64 << 10)]);
//! println!("{report}"); // bytes moved, and which path (O_DIRECT or buffered) they took
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Which calls block: `load`/`store` validate (they read the file's length) and queue; the
//! first transfer through the bounce ring allocates it; the first cuFile transfer of an engine
//! opens cuFile's driver, the first of a file registers it, and a large load registers its
//! buffer, all in the submitting call. `wait`, `load_into`, `store_from`,
//! `barrier` and dropping a [`FileTransfer`] block until the work is done.

mod config;
mod cufile;
mod error;
mod exec;
mod io;
mod pieces;
mod probe;
mod replace;
mod transport;
mod uring;

pub use crate::engine::cuda::sys::probe::nvidia_fs_loaded;
pub use config::FileConfig;
pub use cufile::REGISTER_MIN;
pub use error::{CuFileCode, FileError, IoOp};
pub use exec::live_bounce_buffers;
pub use io::{FileHandle, FileIo, OpenMode, OsFile, DIRECT_ALIGN};
pub use pieces::{ReadInto, ReadPiece, WritePiece};
pub use probe::{gds_probe, gds_status, GdsProbe};
pub use replace::Replacement;
pub use transport::{choose, Choice, CuFileMode, Facts, Transport, NO_NVIDIA_FS};
pub use uring::{uring_ops_in_flight, IoIssue, UringMode};

use crate::engine::{Engine, Lent};
use crate::memory::{MemKind, Memory, MemoryMut, RawBuf};
use crate::request::{BarrierError, InFlight, Request, Signal};
use exec::{Pool, Ring, Xfer};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

/// What one load or store did: bytes, and which path they took.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IoReport {
    /// Bytes moved (the whole range: a request that did not move every byte fails instead).
    pub bytes: u64,
    /// Of those, bytes read or written with `O_DIRECT`.
    pub direct_bytes: u64,
    /// Bytes read or written through the page cache.
    pub buffered_bytes: u64,
    /// Kind of the bounce buffers the bytes went through (`Pinned` for an engine made with
    /// [`FileEngine::with_engine`] on a machine with a CUDA driver, else `Pageable`); `None`
    /// when they went straight to or from the buffer.
    pub bounce: Option<MemKind>,
    /// Why `O_DIRECT` was not used for some or all bytes (`None` when every byte was direct,
    /// or cuFile moved them).
    pub direct_note: Option<String>,
    /// For buffers the CPU cannot reach: the transport used and why (`cuFile (compatibility
    /// mode): ...`, `bounce ring: nvidia-fs not loaded: ...`; see [`choose`]).
    pub gds_note: Option<String>,
    /// How the reads (writes) were issued: io_uring with its depth, or the worker threads and
    /// why ([`FileConfig::uring`]). `None` only in an empty report.
    pub issued: Option<IoIssue>,
    /// How the bytes moved: [`Transport::Host`] for host buffers, cuFile or the bounce ring
    /// for device buffers.
    pub transport: Transport,
    /// Of `bytes`, moved by cuFile (counted in neither `direct_bytes` nor `buffered_bytes`).
    pub cufile_bytes: u64,
}

impl IoReport {
    /// Adds another transfer's report to this one (bytes summed, the first note of each kind
    /// kept): one report over many transfers.
    pub fn add(&mut self, r: IoReport) {
        self.bytes += r.bytes;
        self.direct_bytes += r.direct_bytes;
        self.buffered_bytes += r.buffered_bytes;
        self.bounce = self.bounce.or(r.bounce);
        self.direct_note = self.direct_note.take().or(r.direct_note);
        self.gds_note = self.gds_note.take().or(r.gds_note);
        // io_uring is reported if any transfer used it, else the first reason.
        if !matches!(self.issued, Some(IoIssue::Uring { .. }))
            && (self.issued.is_none() || matches!(r.issued, Some(IoIssue::Uring { .. })))
        {
            self.issued = r.issued;
        }
        if self.transport == Transport::Host {
            self.transport = r.transport;
        }
        self.cufile_bytes += r.cufile_bytes;
    }

    /// `"O_DIRECT"`, `"buffered"`, `"O_DIRECT + buffered"`, `"cuFile"`, or cuFile with either.
    pub fn path(&self) -> &'static str {
        let d = self.direct_bytes > 0;
        let b = self.buffered_bytes > 0;
        match (self.cufile_bytes > 0, d, b) {
            (false, true, false) => "O_DIRECT",
            (false, true, true) => "O_DIRECT + buffered",
            (false, false, _) => "buffered",
            (true, false, false) => "cuFile",
            (true, true, false) => "cuFile + O_DIRECT",
            (true, false, true) => "cuFile + buffered",
            (true, true, true) => "cuFile + O_DIRECT + buffered",
        }
    }
}

impl std::fmt::Display for IoReport {
    /// `1048576 bytes, buffered (direct 0, buffered 1048576); O_DIRECT not used: ...`; a
    /// device transfer ends with its transport and why (`; bounce ring: ...`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes, {} (direct {}, buffered {}",
            self.bytes,
            self.path(),
            self.direct_bytes,
            self.buffered_bytes
        )?;
        if self.cufile_bytes > 0 {
            write!(f, ", cuFile {}", self.cufile_bytes)?;
        }
        f.write_str(")")?;
        if let Some(k) = self.bounce {
            write!(f, " through {k} bounce buffers")?;
        }
        if let Some(n) = &self.direct_note {
            write!(f, "; O_DIRECT not used: {n}")?;
        }
        if let Some(n) = &self.gds_note {
            write!(f, "; {n}")?;
        }
        if let Some(i) = &self.issued {
            write!(f, "; issued by {i}")?;
        }
        Ok(())
    }
}

/// A load or store that failed or was refused, with the buffer handed back (its bytes are
/// unspecified after a failed load). An [`Error`](std::error::Error) (its Debug form leaves the
/// buffer out) that converts into [`ferry::Error`](crate::Error), so `?` works in a function
/// returning either; the buffer is dropped then.
pub struct FileFailed<B> {
    /// Why.
    pub error: FileError,
    /// The buffer.
    pub buf: B,
}

impl<B> std::fmt::Display for FileFailed<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}
impl<B> std::fmt::Debug for FileFailed<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileFailed")
            .field("error", &self.error)
            .field("buf", &std::any::type_name::<B>())
            .finish()
    }
}
impl<B> std::error::Error for FileFailed<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Moves byte ranges between files and buffers. See the [module documentation](self).
pub struct FileEngine {
    cfg: FileConfig,
    pool: Pool,
    mover: Option<Arc<dyn Engine>>,
    ring: Mutex<Option<Arc<Ring>>>,
    inflight: InFlight,
    gds: cufile::EngineGds,
}

impl std::fmt::Debug for FileEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileEngine")
            .field("cfg", &self.cfg)
            .field("mover", &self.mover.as_ref().map(|e| e.name()))
            .finish()
    }
}

impl FileEngine {
    /// An engine for host buffers. Errors: [`FileError::BadConfig`], [`FileError::Setup`].
    pub fn new(cfg: FileConfig) -> Result<FileEngine, FileError> {
        cfg.check()?;
        uring::require(cfg.uring)?;
        Ok(FileEngine {
            cfg,
            pool: Pool::start(cfg.threads)?,
            mover: None,
            ring: Mutex::new(None),
            inflight: InFlight::new(),
            gds: Default::default(),
        })
    }

    /// An engine that also reaches the buffers `engine` reaches from bounce buffers: with a
    /// [`CudaEngine`](crate::cuda::CudaEngine), device memory.
    pub fn with_engine(cfg: FileConfig, engine: Arc<dyn Engine>) -> Result<FileEngine, FileError> {
        let mut e = FileEngine::new(cfg)?;
        e.mover = Some(engine);
        Ok(e)
    }

    /// The engine's settings.
    pub fn config(&self) -> FileConfig {
        self.cfg
    }

    /// Opens `path` for this engine: with `O_DIRECT` too if the config asks for it.
    pub fn open(&self, path: impl AsRef<Path>, mode: OpenMode) -> Result<FileHandle, FileError> {
        FileHandle::open(path, mode, self.cfg.direct)
    }

    /// Bounce buffers this engine holds (0 until the first transfer through the ring, then
    /// [`FileConfig::ring_depth`]).
    pub fn bounce_buffers(&self) -> usize {
        self.ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, |r| r.depth)
    }

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
        let lent = Lent::submit(buf, |b| {
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

    /// Waits for every transfer submitted so far and reports every failure not already seen
    /// through `wait`/`try_wait`. May block.
    pub fn barrier(&self) -> Result<(), BarrierError> {
        self.inflight.barrier()
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
        let gds = (!host).then(|| self.gds_for(file, offset, buf, op));
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
            uring::choose(
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
                uring::runners(chunks, depth, slots, self.cfg.threads)
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
        if choose(&self.cufile_facts()).transport.is_cufile() {
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

impl Drop for FileEngine {
    fn drop(&mut self) {
        // Queued transfers run to the end (their owners may still wait on them), then the
        // workers stop; the ring is freed after the last runner let go of it.
        self.pool.shutdown();
    }
}

/// Waits for a just-submitted request and builds its report (the blocking API).
fn finish_now(req: Request, x: &Arc<Xfer>) -> Result<IoReport, FileError> {
    // The result is read from the transfer's own typed error.
    let _ = req.wait();
    result_of(x)
}

fn result_of(x: &Xfer) -> Result<IoReport, FileError> {
    if let Some(e) = x
        .error
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
    {
        return Err(e);
    }
    let direct_bytes = x.direct_bytes.load(Ordering::Acquire);
    let buffered_bytes = x.buffered_bytes.load(Ordering::Acquire);
    let bytes = x.buf.len as u64;
    let cufile_bytes = x.gds.as_ref().map_or(0, |g| g.bytes());
    let cufile = x.gds.as_ref().is_some_and(|g| g.run.is_some());
    let direct_note = (direct_bytes < bytes).then(|| match x.file.direct_ok() {
        Err(why) => why,
        Ok(()) => format!(
            "pieces not aligned to {DIRECT_ALIGN} bytes (file offset, address or length) run buffered"
        ),
    });
    Ok(IoReport {
        bytes,
        direct_bytes,
        buffered_bytes,
        bounce: x.ring.as_ref().map(|r| r.kind),
        direct_note: if cufile {
            None
        } else if x.direct {
            direct_note
        } else {
            Some("not asked for (FileConfig::direct is off)".into())
        },
        issued: Some(x.issue.clone()),
        gds_note: x.gds.as_ref().map(|g| g.note()),
        transport: x
            .gds
            .as_ref()
            .map_or(Transport::Host, |g| g.choice.transport),
        cufile_bytes,
    })
}

/// A load or store in flight that owns its buffer. [`FileTransfer::wait`] (or `.await`) hands
/// the buffer back with an [`IoReport`]; dropping it waits.
#[must_use = "dropping a FileTransfer blocks until the transfer completes"]
pub struct FileTransfer<B> {
    /// The buffer, lent to the workers until the request completed (dropping it waits).
    lent: Lent<B>,
    x: Arc<Xfer>,
}

impl<B> std::fmt::Debug for FileTransfer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileTransfer")
            .field("request", &self.lent.request())
            .field("path", &self.x.file.path)
            .field("offset", &self.x.offset)
            .field("len", &self.x.buf.len)
            .finish()
    }
}

impl<B> FileTransfer<B> {
    /// Blocks until the transfer completes; returns the buffer and what was done, or the
    /// error with the buffer.
    pub fn wait(self) -> Result<(B, IoReport), FileFailed<B>> {
        // The result is read from the transfer's own typed error.
        let (buf, _) = self.lent.wait();
        finish(buf, &self.x)
    }

    /// `Some(result)` once the transfer completed, `None` while in flight. Never blocks; the
    /// buffer stays in the transfer until [`FileTransfer::wait`].
    pub fn try_wait(&mut self) -> Option<Result<IoReport, FileError>> {
        self.lent.try_wait().map(|_| result_of(&self.x))
    }

    /// True once the transfer completed. Never blocks.
    pub fn is_done(&self) -> bool {
        self.lent.is_done()
    }

    /// The request underneath (its error is the [`FileError`]'s text, as
    /// [`RequestError::Io`](crate::RequestError::Io)).
    pub fn request(&self) -> Option<&Request> {
        self.lent.request()
    }
}

fn finish<B>(buf: B, x: &Xfer) -> Result<(B, IoReport), FileFailed<B>> {
    match result_of(x) {
        Ok(r) => Ok((buf, r)),
        Err(error) => Err(FileFailed { error, buf }),
    }
}

impl<B: Unpin> Future for FileTransfer<B> {
    type Output = Result<(B, IoReport), FileFailed<B>>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.lent.poll(cx).map(|(buf, _)| finish(buf, &this.x))
    }
}
