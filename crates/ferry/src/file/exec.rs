//! The file engine's workers: persistent threads, and what each runs for a transfer: the
//! threads' loop, one blocking call per chunk (straight into a host buffer, through a bounce
//! slot, or by cuFile), or the io_uring runner (`uring.rs`); the last runner out completes the
//! request.

use super::error::{FileError, IoOp};
use super::io::DIRECT_ALIGN;
use super::issue::IoIssue;
use super::ring::{Ring, Slot};
use super::xfer::{direct_span, Xfer};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

// ---------------------------------------------------------------------------------------------
// Worker threads: a FIFO of tasks, run to the end of the queue on shutdown. Not the CPU
// engine's pool (`engine/cpu/pool.rs`): its waiters run queued work inline, which is sound only
// for work that never blocks, and these tasks block on the file and on the bounce slots. Not
// the staging workers (`staging/workers.rs`, `fill.rs`) either: those copy host memory and
// never block, so a task that sleeps in `pread` would hold a copy worker (and its core) idle;
// these threads mostly wait for the disk, and their host copies (slot <-> buffer without a GPU)
// are the only copying they do.

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
// The runners.

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
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string())
}
