//! The file engine's machinery: persistent worker threads, the bounce ring, and the per-chunk
//! work of a load or store. Unsafe code of the file path lives here.

use super::error::{FileError, IoOp};
use super::io::{FileInner, DIRECT_ALIGN};
use super::uring::IoIssue;
use crate::engine::{Engine, Job};
use crate::memory::{MemKind, RawBuf};
use crate::request::Signal;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

// ---------------------------------------------------------------------------------------------
// Worker threads: a FIFO of tasks, run to the end of the queue on shutdown. Not the CPU
// engine's pool (`engine/cpu/pool.rs`): its waiters run queued work inline, which is sound only
// for work that never blocks, and these tasks block on the file and on the bounce ring.

type Task = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct PoolState {
    queue: VecDeque<Task>,
    shutdown: bool,
}

pub(crate) struct Pool {
    state: Arc<(Mutex<PoolState>, Condvar)>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    pub(crate) fn start(threads: usize) -> Result<Pool, FileError> {
        let pool = Pool {
            state: Arc::new((Mutex::new(PoolState::default()), Condvar::new())),
            handles: Mutex::new(Vec::with_capacity(threads)),
        };
        for i in 0..threads {
            let st = Arc::clone(&pool.state);
            match std::thread::Builder::new()
                .name(format!("ferry-file-{i}"))
                .spawn(move || worker(&st))
            {
                Ok(h) => pool
                    .handles
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(h),
                Err(e) => {
                    pool.shutdown();
                    return Err(FileError::Setup(format!(
                        "cannot start a worker thread: {e}"
                    )));
                }
            }
        }
        Ok(pool)
    }

    pub(crate) fn push(&self, tasks: Vec<Task>) -> Result<(), FileError> {
        let (m, c) = &*self.state;
        let mut st = m.lock().unwrap_or_else(PoisonError::into_inner);
        if st.shutdown {
            return Err(FileError::ShutDown);
        }
        st.queue.extend(tasks);
        c.notify_all();
        Ok(())
    }

    /// Runs the queued tasks to the end, then stops and joins every worker.
    pub(crate) fn shutdown(&self) {
        {
            let (m, c) = &*self.state;
            m.lock().unwrap_or_else(PoisonError::into_inner).shutdown = true;
            c.notify_all();
        }
        let handles =
            std::mem::take(&mut *self.handles.lock().unwrap_or_else(PoisonError::into_inner));
        for h in handles {
            let _ = h.join();
        }
    }
}

fn worker(st: &(Mutex<PoolState>, Condvar)) {
    let (m, c) = st;
    loop {
        let task = {
            let mut g = m.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if let Some(t) = g.queue.pop_front() {
                    break t;
                }
                if g.shutdown {
                    return;
                }
                g = c.wait(g).unwrap_or_else(PoisonError::into_inner);
            }
        };
        // Tasks catch their own panics; this keeps the worker alive if one ever escapes.
        let _ = catch_unwind(AssertUnwindSafe(task));
    }
}

// ---------------------------------------------------------------------------------------------
// The bounce ring: `depth` buffers of `chunk` bytes, page-aligned; pinned when the file engine
// has an engine to DMA from them and a CUDA driver is present, plain aligned host memory
// otherwise.

static LIVE_SLOTS: AtomicUsize = AtomicUsize::new(0);

/// Bounce buffers alive in this process, over every file engine (for leak tests).
pub fn live_bounce_buffers() -> usize {
    LIVE_SLOTS.load(Ordering::Acquire)
}

enum SlotMem {
    Pinned(crate::cuda::PinnedBuffer),
    Host(crate::memory::AlignedBuffer),
}

pub(crate) struct Slot {
    mem: SlotMem,
    pub(super) len: usize,
}

// SAFETY: a slot is plain memory owned by this value; one runner uses it at a time (it is taken
// out of the ring's free list while in use).
unsafe impl Send for Slot {}

impl Slot {
    /// `pinned`: try page-locked memory first (needed only when an engine DMAs from the slot).
    fn new(len: usize, pinned: bool) -> Result<Slot, FileError> {
        let pinned = if pinned {
            crate::cuda::PinnedBuffer::new(len.saturating_add(DIRECT_ALIGN))
        } else {
            Err(crate::cuda::CudaError::NoDriver("not asked for".into()))
        };
        let mem = match pinned {
            Ok(p) => SlotMem::Pinned(p),
            Err(crate::cuda::CudaError::NoDriver(_)) => SlotMem::Host(
                crate::memory::AlignedBuffer::new(len)
                    .map_err(|e| FileError::Setup(format!("a bounce buffer: {e}")))?,
            ),
            Err(e) => return Err(e.into()),
        };
        LIVE_SLOTS.fetch_add(1, Ordering::AcqRel);
        Ok(Slot { mem, len })
    }
    pub(crate) fn kind(&self) -> MemKind {
        match self.mem {
            SlotMem::Pinned(_) => MemKind::Pinned,
            SlotMem::Host(_) => MemKind::Pageable,
        }
    }
    pub(super) fn ptr(&mut self) -> *mut u8 {
        match &mut self.mem {
            // From the first `DIRECT_ALIGN` boundary: the driver aligns large pinned
            // allocations to pages, but carves small ones from shared blocks, after which a
            // 1 MiB one may start anywhere (run 85). In bounds: the buffer holds
            // `DIRECT_ALIGN` bytes more than `len`.
            SlotMem::Pinned(p) => {
                let skip = (p.as_ptr() as usize).wrapping_neg() % DIRECT_ALIGN;
                p[skip..].as_mut_ptr()
            }
            SlotMem::Host(b) => b.as_mut_ptr(),
        }
    }
    pub(super) fn bytes(&mut self, len: usize) -> &mut [u8] {
        let len = len.min(self.len);
        let p = self.ptr();
        // SAFETY: the slot owns `self.len >= len` initialised (zeroed at allocation) bytes,
        // borrowed exclusively through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        LIVE_SLOTS.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(crate) struct Ring {
    free: Mutex<Vec<Slot>>,
    cond: Condvar,
    pub(crate) kind: MemKind,
    pub(crate) depth: usize,
}

impl Ring {
    /// `depth` buffers of `chunk` bytes; `pinned`: page-locked when a CUDA driver is present.
    pub(crate) fn new(depth: usize, chunk: usize, pinned: bool) -> Result<Ring, FileError> {
        // Room for the aligned span around a chunk at an unaligned offset (`O_DIRECT`).
        let room = chunk
            .div_ceil(DIRECT_ALIGN)
            .saturating_add(1)
            .saturating_mul(DIRECT_ALIGN);
        let slots = (0..depth)
            .map(|_| Slot::new(room, pinned))
            .collect::<Result<Vec<_>, _>>()?;
        let kind = slots.first().map_or(MemKind::Pageable, Slot::kind);
        Ok(Ring {
            free: Mutex::new(slots),
            cond: Condvar::new(),
            kind,
            depth,
        })
    }
    /// Takes a free slot, waiting for one (each runner holds at most one, so one comes back).
    pub(super) fn take(self: &Arc<Self>) -> SlotGuard {
        let mut g = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(s) = g.pop() {
                return SlotGuard {
                    ring: Arc::clone(self),
                    slot: Some(s),
                };
            }
            g = self.cond.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// A free slot if one is there now (the io_uring runner's second and later slots).
    pub(super) fn try_take(self: &Arc<Self>) -> Option<SlotGuard> {
        let s = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()?;
        Some(SlotGuard {
            ring: Arc::clone(self),
            slot: Some(s),
        })
    }
}

/// A slot out of the ring; back into it on drop, on every path.
pub(crate) struct SlotGuard {
    ring: Arc<Ring>,
    slot: Option<Slot>,
}

impl SlotGuard {
    pub(super) fn slot(&mut self) -> &mut Slot {
        self.slot
            .as_mut()
            .expect("a guard holds its slot until dropped")
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(s) = self.slot.take() {
            self.ring
                .free
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(s);
            self.ring.cond.notify_one();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One load or store.

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
    pub(crate) gds: Option<super::cufile::Gds>,
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
    /// The runner body: claims chunks until none are left or one failed; the last runner out
    /// completes the request.
    pub(crate) fn run(self: &Arc<Self>) {
        let ran = match self.issue {
            IoIssue::Uring { depth } => {
                let r = catch_unwind(AssertUnwindSafe(|| super::uring::run(self, depth)));
                match r.unwrap_or_else(|p| Err(self.panicked(self.offset, &p))) {
                    Ok(ran) => ran,
                    Err(e) => {
                        self.fail(e);
                        true
                    }
                }
            }
            IoIssue::Threads { .. } => false,
        };
        if !ran {
            self.run_chunks();
        }
        if self.runners.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(g) = &self.gds {
                g.finish();
            }
            let e = self
                .error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            self.signal.complete(e.map_or(Ok(()), |e| Err(e.into())));
        }
    }

    fn panicked(&self, offset: u64, p: &(dyn std::any::Any + Send)) -> FileError {
        FileError::Panicked {
            path: self.file.path.clone(),
            offset,
            msg: panic_text(p),
        }
    }

    /// The threads' loop: one chunk at a time, one blocking call each.
    fn run_chunks(self: &Arc<Self>) {
        while !self.failed.load(Ordering::Acquire) {
            let Some((at, len, foff)) = self.claim() else {
                break;
            };
            let cufile = self.gds.as_ref().and_then(|g| g.run.as_ref());
            let r = catch_unwind(AssertUnwindSafe(|| match (cufile, &self.ring) {
                (Some(c), _) => c.chunk(self.op, &self.file.path, foff, at, len),
                (None, Some(ring)) => self.staged_chunk(ring, at, len),
                (None, None) => self.direct_chunk(at, len),
            }));
            if let Err(e) = r.unwrap_or_else(|p| Err(self.panicked(foff, &p))) {
                self.fail(e);
            }
        }
    }

    fn fail(&self, e: FileError) {
        let mut g = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if g.is_none() {
            *g = Some(e);
        }
        self.failed.store(true, Ordering::Release);
    }

    /// A chunk straight between the file and a host buffer.
    fn direct_chunk(&self, at: usize, len: usize) -> Result<(), FileError> {
        let p = (self.buf.addr as usize + at) as *mut u8;
        let foff = self.offset + at as u64;
        match self.op {
            IoOp::Read => {
                // SAFETY: `at..at+len` lies inside the buffer, which is host memory valid for
                // writes and unshared until the request completes (submit's contract); chunks
                // are disjoint, so this runner is the only one touching these bytes.
                let b = unsafe { std::slice::from_raw_parts_mut(p, len) };
                self.read_full(b, foff)
            }
            IoOp::Write => {
                // SAFETY: as above, for reads of the source buffer.
                let b = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
                self.write_full(b, foff)
            }
        }
    }

    /// A chunk through a bounce slot: file <-> slot by `pread`/`pwrite`, slot <-> buffer by the
    /// mover engine (a GPU's copy engine) or, without one, a CPU copy.
    fn staged_chunk(&self, ring: &Arc<Ring>, at: usize, len: usize) -> Result<(), FileError> {
        let mut g = ring.take();
        let slot = g.slot();
        let foff = self.offset + at as u64;
        match self.op {
            IoOp::Read => {
                let skip = self.read_slot(slot, foff, len)?;
                self.move_chunk(slot, skip, at, len, true)
            }
            IoOp::Write => {
                self.move_chunk(slot, 0, at, len, false)?;
                self.write_full(slot.bytes(len), foff)
            }
        }
    }

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
        let err = |e: crate::Error| FileError::Transfer {
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
        let l = crate::Layout::bytes(len).map_err(|e| err(e.into()))?;
        let job = if to_buf {
            Job::copy(b, l, s, l)
        } else {
            Job::copy(s, l, b, l)
        };
        // SAFETY: the slot is held by this runner until the wait below returns; the buffer's
        // chunk is valid memory of its kind, unshared until the whole request completes
        // (submit's contract), which happens after this wait.
        let req = unsafe { engine.submit_raw(job) }.map_err(|e| err(e.into()))?;
        req.wait().map_err(|e| err(e.into()))
    }

    /// `pread` until `b` is full: short reads continue, end of file is an error.
    fn read_full(&self, b: &mut [u8], off: u64) -> Result<(), FileError> {
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

    /// Reads the chunk's `len` bytes at `foff` into the slot and returns where they start in
    /// it. With `O_DIRECT` at an unaligned offset or length, the aligned span around the chunk
    /// is read (the slot has room for it) so that the read can be direct.
    fn read_slot(&self, slot: &mut Slot, foff: u64, len: usize) -> Result<usize, FileError> {
        let (skip, span) = direct_span(foff, len);
        let aligned = skip == 0 && len % DIRECT_ALIGN == 0;
        if aligned || !self.direct || span > slot.len || self.file.direct_ok().is_err() {
            self.read_full(slot.bytes(len), foff)?;
            return Ok(0);
        }
        let (d, _) = self.read_at_least(slot.bytes(span), foff - skip as u64, skip + len)?;
        self.count_read(d, skip, len);
        Ok(skip)
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

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string())
}
