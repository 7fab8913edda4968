//! `O_DIRECT` reads and writes through io_uring: one thread keeps up to a queue depth of chunk
//! reads (writes) in flight, instead of one blocking `pread` (`pwrite`) per worker.
//!
//! - The choice, per transfer, in one pure function ([`choose`](super::issue::choose), in
//!   `issue.rs`): io_uring when it is asked for ([`UringMode`]), the kernel allows it (the
//!   process-wide probe here, [`kernel`]: `io_uring_setup` fails with `ENOSYS` on old kernels,
//!   `EPERM` under seccomp filters or `kernel.io_uring_disabled=2`), and the transfer has an
//!   aligned `O_DIRECT` part on an OS file; else the worker threads, as before. The reason
//!   lands in [`IoReport::issued`](super::IoReport::issued).
//! - What goes through the ring: each chunk's aligned `O_DIRECT` span, into (out of) the host
//!   buffer itself or a bounce slot (device buffers: the slot then goes up by the mover engine
//!   as with threads). Unaligned tails, and the rest of a chunk after a short read that broke
//!   the alignment, run the threads' own code (`pread`, buffered), so both paths count and
//!   fail the same way. Aligned short reads are resubmitted for the rest; end of file inside
//!   the range is [`FileError::UnexpectedEof`].
//! - Memory safety: every submitted entry's memory is either a bounce slot owned by the entry
//!   itself, or the transfer's buffer, valid until the transfer completes (after every runner
//!   returned). A runner's ring is drained (every submitted entry completed) before it returns
//!   or unwinds, on every path: [`uring_ops_in_flight`] counts entries still in the kernel.
//!
//! Unsafe code is at the bottom of this file only.

use super::error::{FileError, IoOp};
use super::io::DIRECT_ALIGN;
use super::issue::{errno_name, UringMode};
use super::ring::SlotGuard;
use super::xfer::{direct_span, Xfer};
use io_uring::{opcode, types, IoUring};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Whether this process may use io_uring: `io_uring_setup` of a small ring, and `IORING_OP_READ`
/// and `IORING_OP_WRITE` supported (Linux 5.6). Probed once; `Err(errno)` else.
pub(crate) fn kernel() -> Result<(), i32> {
    static PROBE: OnceLock<Result<(), i32>> = OnceLock::new();
    *PROBE.get_or_init(|| {
        let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(libc::EINVAL);
        let ring = IoUring::new(2).map_err(errno)?;
        let mut p = io_uring::Probe::new();
        ring.submitter().register_probe(&mut p).map_err(errno)?;
        if p.is_supported(opcode::Read::CODE) && p.is_supported(opcode::Write::CODE) {
            Ok(())
        } else {
            Err(libc::EINVAL)
        }
    })
}

/// For [`UringMode::On`]: the engine's setup error when the kernel refuses io_uring.
pub(crate) fn require(mode: UringMode) -> Result<(), FileError> {
    match (mode, kernel()) {
        (UringMode::On, Err(e)) => Err(FileError::Setup(format!(
            "io_uring asked for (FileConfig::uring On) but unavailable: {}",
            errno_name(e)
        ))),
        _ => Ok(()),
    }
}

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// io_uring entries submitted and not yet completed in this process, over every file engine
/// (0 whenever no transfer runs: for leak tests).
pub fn uring_ops_in_flight() -> usize {
    IN_FLIGHT.load(Ordering::Acquire)
}

// ---------------------------------------------------------------------------------------------
// The runner: claims chunks like a worker, but keeps up to `depth` of them in flight.

/// One chunk in flight: its aligned span `base..base+span` of the file, of which bytes
/// `skip..need` are the chunk's (`skip` > 0 only for reads at unaligned offsets through a slot),
/// `pos` bytes done.
struct Op {
    at: usize,
    len: usize,
    base: u64,
    span: usize,
    skip: usize,
    need: usize,
    pos: usize,
    /// Bytes of the span moved with `O_DIRECT`.
    direct: usize,
    /// The bounce slot the span lives in (`None`: the transfer's own buffer at `at`).
    slot: Option<SlotGuard>,
}

impl Op {
    /// Start of the span in memory (computed, not dereferenced).
    fn ptr(&mut self, x: &Xfer) -> *mut u8 {
        match &mut self.slot {
            Some(g) => g.slot().ptr(),
            None => (x.buf.addr as usize + self.at) as *mut u8,
        }
    }
}

/// The runner body for an io_uring transfer, on this thread's ring (kept between transfers).
/// `Ok(false)`: no ring could be set up for this runner (the caller runs the threads' loop
/// instead).
pub(crate) fn run(x: &Arc<Xfer>, depth: usize) -> Result<bool, FileError> {
    let Some(fd) = x.file.io.direct_fd() else {
        return Ok(false);
    };
    let Ok(mut ring) = Uring::new(depth, fd) else {
        return Ok(false);
    };
    // On an error `ring` is dropped here, after every entry it submitted completed.
    pump(x, &mut ring).map(|()| true)
}

fn pump(x: &Arc<Xfer>, ring: &mut Uring) -> Result<(), FileError> {
    let mut done = Vec::new();
    loop {
        while !x.failed.load(Ordering::Acquire) && ring.has_room() {
            match next_op(x, ring.in_flight() == 0)? {
                Some(op) => start(x, ring, op)?,
                None => break,
            }
        }
        if ring.in_flight() == 0 {
            return Ok(());
        }
        ring.wait(x, &mut done)?;
        for (op, res) in done.drain(..) {
            if !x.failed.load(Ordering::Acquire) {
                step(x, ring, op, res)?;
            }
        }
    }
}

/// Claims the next chunk (with a bounce slot for ring transfers: waited for only when this
/// runner holds none, so runners never wait on each other while holding slots). A write's
/// bytes are moved into its slot here.
fn next_op(x: &Arc<Xfer>, may_wait: bool) -> Result<Option<Op>, FileError> {
    let mut slot = match &x.ring {
        Some(r) if may_wait => Some(r.take()),
        Some(r) => match r.try_take() {
            Some(g) => Some(g),
            None => return Ok(None),
        },
        None => None,
    };
    let Some((at, len, foff)) = x.claim() else {
        return Ok(None);
    };
    let (mut skip, mut span) = (0, len);
    if let Some(g) = &mut slot {
        let s = g.slot();
        match x.op {
            IoOp::Read => {
                (skip, span) = direct_span(foff, len);
                if span > s.len {
                    (skip, span) = (0, len);
                }
            }
            IoOp::Write => x.move_chunk(s, 0, at, len, false)?,
        }
    }
    Ok(Some(Op {
        at,
        len,
        base: foff - skip as u64,
        span,
        skip,
        need: skip + len,
        pos: 0,
        direct: 0,
        slot,
    }))
}

/// Submits the rest of `op` from `pos` if an aligned `O_DIRECT` part of it is left, else
/// finishes it with the threads' code.
fn start(x: &Xfer, ring: &mut Uring, mut op: Op) -> Result<(), FileError> {
    let p = op.ptr(x).wrapping_add(op.pos);
    let off = op.base + op.pos as u64;
    let rest = op.span - op.pos;
    let want = if x.use_direct(p, rest, off) {
        (rest / DIRECT_ALIGN * DIRECT_ALIGN).min(MAX_ENTRY)
    } else {
        0
    };
    if want == 0 {
        return finish_sync(x, op);
    }
    match ring.issue(x, op, want) {
        Ok(()) => Ok(()),
        // No room (`pump` fills only while there is): the threads' way instead.
        Err(op) => finish_sync(x, op),
    }
}

/// One completion: `res` bytes, or `-errno`.
fn step(x: &Xfer, ring: &mut Uring, mut op: Op, res: i32) -> Result<(), FileError> {
    let at = op.base + op.pos as u64;
    if res < 0 {
        let e = std::io::Error::from_raw_os_error(-res);
        return match -res {
            libc::EINTR => start(x, ring, op),
            // Try again later: the blocking call below waits instead of resubmitting without
            // bound.
            libc::EAGAIN => finish_sync(x, op),
            // The filesystem takes `O_DIRECT` but not through io_uring: this chunk's rest by
            // the threads' code (still `O_DIRECT` where aligned).
            libc::EOPNOTSUPP => finish_sync(x, op),
            libc::EINVAL => {
                x.file
                    .refuse_direct(format!("an O_DIRECT {} was refused: {e}", x.op));
                finish_sync(x, op)
            }
            _ => Err(FileError::io(x.op, &x.file.path, at, op.span - op.pos, &e)),
        };
    }
    let n = res as usize;
    if n == 0 {
        let missing = match x.op {
            IoOp::Read => op.need - op.pos,
            IoOp::Write => op.span - op.pos,
        };
        return Err(FileError::no_progress(x.op, &x.file.path, at, missing));
    }
    op.pos += n;
    op.direct += n;
    if op.pos >= op.need {
        complete(x, op)
    } else {
        start(x, ring, op)
    }
}

/// The rest of `op` by the threads' own `pread`/`pwrite` (unaligned tails, after a short read
/// or a refused `O_DIRECT`), then its completion.
fn finish_sync(x: &Xfer, mut op: Op) -> Result<(), FileError> {
    if op.pos < op.need {
        let off = op.base + op.pos as u64;
        let (pos, span, need) = (op.pos, op.span, op.need);
        match x.op {
            IoOp::Read => {
                let b = op_bytes_mut(x, &mut op, span);
                let (d, n) = x.read_at_least(&mut b[pos..], off, need - pos)?;
                op.direct += d;
                op.pos += n;
            }
            IoOp::Write => {
                // `write_full` counts its own bytes.
                x.write_full(&op_bytes(x, &mut op, span)[pos..], off)?;
                op.pos = span;
            }
        }
    }
    complete(x, op)
}

/// A chunk whose span is in: counted, and a read's bytes moved out of its slot.
fn complete(x: &Xfer, mut op: Op) -> Result<(), FileError> {
    match x.op {
        IoOp::Read => {
            x.count_read(op.direct, op.skip, op.len);
            if let Some(g) = &mut op.slot {
                x.move_chunk(g.slot(), op.skip, op.at, op.len, true)?;
            }
        }
        IoOp::Write => x.count(true, op.direct),
    }
    Ok(())
}

/// The largest entry submitted (a read's length is a `u32`); the rest is resubmitted.
const MAX_ENTRY: usize = 1 << 30;

// ---------------------------------------------------------------------------------------------
// The ring. Unsafe code of the io_uring path is here only.

/// One runner's io_uring instance and the ops it has in flight (each op owns its slot, so a
/// slot cannot return to the bounce ring while the kernel may still write into it).
struct Uring {
    /// Always `Some` while the `Uring` lives; taken by `Drop` to keep it for the next run.
    ring: Option<IoUring>,
    entries: u32,
    fd: types::Fd,
    ops: Vec<Option<Op>>,
    free: Vec<usize>,
    in_flight: usize,
}

thread_local! {
    /// This runner thread's drained ring, kept for its next transfer: setting one up is an
    /// `io_uring_setup` call and its mappings, which a load of many small tensors (one
    /// transfer each) paid per tensor.
    static SPARE: std::cell::RefCell<Option<(u32, IoUring)>> =
        const { std::cell::RefCell::new(None) };
}

impl Uring {
    fn new(depth: usize, fd: std::os::fd::RawFd) -> std::io::Result<Uring> {
        let entries = u32::try_from(depth.next_power_of_two()).unwrap_or(1 << 15);
        let spare = SPARE
            .try_with(|s| s.borrow_mut().take())
            .ok()
            .flatten()
            .filter(|(n, _)| *n == entries);
        let ring = match spare {
            Some((_, r)) => r,
            None => IoUring::new(entries)?,
        };
        Ok(Uring {
            ring: Some(ring),
            entries,
            fd: types::Fd(fd),
            ops: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            in_flight: 0,
        })
    }

    fn has_room(&self) -> bool {
        !self.free.is_empty()
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Submits `want` bytes of `op` from its `pos` (a multiple of [`DIRECT_ALIGN`], as are
    /// its address and file offset: `start` checked). The op back when no entry is free.
    fn issue(&mut self, x: &Xfer, mut op: Op, want: usize) -> Result<(), Op> {
        let Some(i) = self.free.pop() else {
            return Err(op);
        };
        let p = op.ptr(x).wrapping_add(op.pos);
        let off = op.base + op.pos as u64;
        // `want` <= MAX_ENTRY < u32::MAX.
        let len = want as u32;
        let entry = match x.op {
            IoOp::Read => opcode::Read::new(self.fd, p, len).offset(off).build(),
            IoOp::Write => opcode::Write::new(self.fd, p, len).offset(off).build(),
        }
        .user_data(i as u64);
        let Some(ring) = self.ring.as_mut() else {
            self.free.push(i);
            return Err(op);
        };
        // SAFETY: the entry's memory, `p..p+want`, lies inside the op's span: either its own
        // bounce slot (heap memory that does not move with the op, which is kept in
        // `self.ops[i]` until the completion is reaped; `Drop` reaps every completion before
        // the ops are dropped), or the transfer's buffer, which is valid for writes (reads) and
        // touched by no one else until the transfer completes (submit's contract); that happens
        // after every runner returned, and a runner's ring is drained before it returns. The
        // descriptor is the file's `O_DIRECT` one, kept open by the transfer's
        // `Arc<FileInner>`. A ring kept for a later transfer is kept only once drained.
        if unsafe { ring.submission().push(&entry) }.is_err() {
            self.free.push(i);
            return Err(op);
        }
        self.ops[i] = Some(op);
        self.in_flight += 1;
        IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Submits what is queued, waits for at least one completion, and adds every completed op
    /// with its result (bytes, or `-errno`) to `out`.
    fn wait(&mut self, x: &Xfer, out: &mut Vec<(Op, i32)>) -> Result<(), FileError> {
        loop {
            match self.submit_and_wait() {
                Ok(_) => break,
                Err(e) if retry(&e) => {}
                Err(e) => {
                    return Err(FileError::io(x.op, &x.file.path, x.offset, 0, &e));
                }
            }
        }
        self.reap(out);
        Ok(())
    }

    fn submit_and_wait(&mut self) -> std::io::Result<usize> {
        match self.ring.as_mut() {
            Some(r) => r.submit_and_wait(1),
            None => Ok(0),
        }
    }

    fn reap(&mut self, out: &mut Vec<(Op, i32)>) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        for c in ring.completion() {
            let i = c.user_data() as usize;
            if let Some(op) = self.ops.get_mut(i).and_then(Option::take) {
                self.free.push(i);
                self.in_flight -= 1;
                IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
                out.push((op, c.result()));
            }
        }
    }
}

fn retry(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
    )
}

impl Drop for Uring {
    /// Waits for every submitted entry before the ops (and their slots) are dropped: no kernel
    /// write lands in freed memory. Completions that `io_uring_enter` cannot wait for (an
    /// unexpected error) are polled for every millisecond.
    fn drop(&mut self) {
        let mut done = Vec::new();
        while self.in_flight > 0 {
            match self.submit_and_wait() {
                Ok(_) => {}
                Err(e) if retry(&e) => {}
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
            self.reap(&mut done);
            done.clear();
        }
        // Drained: nothing of this run is left in it; kept for this thread's next run.
        if let Some(r) = self.ring.take() {
            let entries = self.entries;
            let _ = SPARE.try_with(|s| *s.borrow_mut() = Some((entries, r)));
        }
    }
}

/// The op's span `..span` as bytes to read into: its slot's, or the transfer's buffer's at `at`.
fn op_bytes_mut<'a>(x: &Xfer, op: &'a mut Op, span: usize) -> &'a mut [u8] {
    match &mut op.slot {
        Some(g) => g.slot().bytes(span),
        None => {
            let p = (x.buf.addr as usize + op.at) as *mut u8;
            // SAFETY: without a slot the op is a chunk `at..at+len` of a load's buffer, host
            // memory valid for writes and touched by no one else until the transfer completes
            // (submit's contract); chunks are disjoint and this runner holds this one, with no
            // entry of it in flight while these bytes are borrowed (`finish_sync` runs between
            // completions and submissions).
            unsafe { std::slice::from_raw_parts_mut(p, span.min(op.len)) }
        }
    }
}

/// The op's span `..span` as bytes to write: its slot's, or the transfer's buffer's at `at`.
fn op_bytes<'a>(x: &Xfer, op: &'a mut Op, span: usize) -> &'a [u8] {
    match &mut op.slot {
        Some(g) => g.slot().bytes(span),
        None => {
            let p = (x.buf.addr as usize + op.at) as *const u8;
            // SAFETY: as in `op_bytes_mut`, for a store's buffer, valid for reads and not
            // written by anyone until the transfer completes.
            unsafe { std::slice::from_raw_parts(p, span.min(op.len)) }
        }
    }
}
