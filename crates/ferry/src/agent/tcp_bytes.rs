//! The bytes of transfers over TCP (`tcp.rs` makes the connections): a write is a WRITE frame
//! naming the owner's region and segments, followed by the bytes and the sender's status (an OK
//! frame, or ERR and why: its device memory could not be read); the owner's connection thread
//! stores them (host memory straight from the socket, device memory through the owner agent's
//! engine in stage-fulls of [`STAGE`] bytes, two bounce buffers in turn so that one
//! stage's copy runs while the next one's bytes cross the socket, `bounce.rs`) and answers
//! OK once they have landed, or ERR and why. A read is a READ frame, answered by OK, the
//! bytes and the owner's status, or by ERR alone. A copy that fails in the middle of the bytes fails its transfer only: the sender
//! sends the rest as zeros and its status says why, so the stream stays in step and the
//! connection serves the next transfer. On the caller's side a transfer runs on the
//! connection's transfer thread, one at a time per connection and in order, and the caller has
//! its `Request` at once; one of at most [`INLINE_BYTES`] bytes on a
//! connection with nothing queued runs on the calling thread instead, its request done on
//! return. Device memory there is staged the same way. Host memory moves with one
//! `writev`/`readv` for the whole segment list, the status included. A transfer of at least
//! two [`PART_MIN`]s on a connection with lanes (`tcp.rs`) is cut into parts of nearly equal
//! bytes, one per stream, each a transfer of its own as above on its stream, run at once; the
//! request ends when every part has, with the first part's error.

use super::bounce::{self, Bounce, STAGE};
use super::frame::{frame, Stream, ERR, MAX_FRAME, OK, READ, WRITE};
use super::lanes::Lane;
use super::{
    copy_failed, engine_submit, lock, run_on, AgentError, AgentInner, CopyJob, Local, PeerInner,
    Reach, INLINE_BYTES,
};
use crate::memory::RawBuf;
use crate::op::Segment;
use crate::request::{BackendError, Request, RequestError, Signal};
use crate::staging::ring::{Ring, SlotDone};
use crate::Engine;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

/// The most segments one transfer's frame carries (its frame at most `MAX_FRAME`).
pub(super) const MAX_SEGMENTS: usize = (MAX_FRAME - 1 - 12) / 16;

/// The caller's side of a connection over TCP: whether it broke, its transfer thread, and its
/// lanes.
pub(super) struct Link {
    lost: AtomicBool,
    /// Transfers handed to the transfer thread and not yet run to their end.
    queued: AtomicUsize,
    worker: Mutex<Option<mpsc::Sender<CopyJob>>>,
    /// Further connections to the same agent (`tcp.rs` opens them), each carrying a part of
    /// every transfer of at least two [`PART_MIN`]s, on a thread of its own.
    pub(super) lanes: Vec<Lane>,
    /// A handle of every stream, the first and the lanes' (their mutexes may be held by a
    /// transfer when another stream breaks): all are shut down when one breaks, so that the
    /// owner sees the connection end and releases what it imported.
    pub(super) sockets: Vec<TcpStream>,
}

impl Link {
    /// A connection not yet found broken, its transfer thread not yet started, no lanes.
    pub(super) fn new() -> Link {
        Link {
            lost: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
            worker: Mutex::new(None),
            lanes: Vec::new(),
            sockets: Vec::new(),
        }
    }

    /// True once a transfer or message found the connection broken.
    pub(super) fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
    /// Marks the connection broken and shuts every stream of it down.
    fn lose(&self) {
        self.lost.store(true, Ordering::Release);
        for s in &self.sockets {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// The fewest bytes of a part of a transfer carried by a lane: a transfer is cut into as many
/// parts as the connection has streams, each of at least this many bytes (on loopback a
/// part's hand-off to a lane's thread, and the owner's answer on each stream, cost about what
/// this many bytes take to cross).
const PART_MIN: u64 = 256 << 10;

/// The error of a connection that broke, marked so for the transfers after it, every stream
/// of it shut down (the owner then releases what the connection imported).
pub(super) fn broken(peer: &PeerInner, e: &io::Error) -> AgentError {
    if let Reach::Remote(l) = &peer.reach {
        l.lose();
    }
    let reason = match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            "no answer within the agent's timeout".to_string()
        }
        _ => e.to_string(),
    };
    AgentError::Disconnected {
        peer: format!("{} (pid {})", peer.name, peer.pid),
        reason,
    }
}

/// A transfer between the local region `local` and the peer's region `region` over the
/// connection, run on its transfer thread (a small one on an idle connection here, see
/// [`INLINE_BYTES`]); the request completes when the owner has answered
/// (a write: its bytes landed; a read: every byte arrived here). `segs` were checked against
/// both regions.
pub(super) fn transfer(
    peer: &Arc<PeerInner>,
    engine: Arc<dyn Engine>,
    local: Arc<Local>,
    region: u64,
    segs: &[Segment],
    write: bool,
) -> Result<Request, AgentError> {
    let Reach::Remote(link) = &peer.reach else {
        unreachable!("a transfer over TCP on a connection of this host");
    };
    if link.lost() {
        return Err(peer.gone());
    }
    if segs.len() > MAX_SEGMENTS {
        return Err(AgentError::Unsupported(format!(
            "{} segments in one transfer over TCP (at most {MAX_SEGMENTS})",
            segs.len()
        )));
    }
    let signal = Arc::new(Signal::new());
    // Small, with nothing queued before it and the connection free: run here (in order: the
    // transfers queued before it have all ended).
    let bytes: u64 = segs.iter().map(|s| s.len).sum();
    if bytes <= INLINE_BYTES as u64 && link.queued.load(Ordering::Acquire) == 0 {
        if let Ok(guard) = peer.stream.try_lock() {
            let r = run(
                peer,
                &guard,
                &*engine,
                local.raw,
                &Part::new(region, segs, write),
            );
            drop(guard);
            signal.complete(r.map_err(|e| RequestError::Backend(BackendError::new(e))));
            return Ok(Request::new(signal));
        }
    }
    let streams = (1 + link.lanes.len()).min((bytes / PART_MIN).max(1) as usize);
    let mut parts: Vec<Part> = split(segs, streams)
        .iter()
        .map(|p| Part::new(region, p, write))
        .collect();
    if parts.is_empty() {
        // No byte to move: the owner still checks the list (a region not imported, say).
        parts.push(Part::new(region, segs, write));
    }
    let done = Arc::clone(&signal);
    let p = Arc::clone(peer);
    let job = Box::new(move || {
        let r = run_parts(&p, &engine, local.raw, parts);
        drop(local);
        if let Reach::Remote(l) = &p.reach {
            l.queued.fetch_sub(1, Ordering::AcqRel);
        }
        done.complete(r.map_err(|e| RequestError::Backend(BackendError::new(e))));
    });
    link.queued.fetch_add(1, Ordering::AcqRel);
    if let Err(e) = run_on(&link.worker, "ferry-agent-tcp-copy", job) {
        link.queued.fetch_sub(1, Ordering::AcqRel);
        return Err(e);
    }
    Ok(Request::new(signal))
}

/// A transfer, or the part of one, as one stream carries it: its frame (WRITE or READ, the
/// owner's region and offsets) and the offsets and lengths on this side.
struct Part {
    frame: Vec<u8>,
    near: Vec<(u64, u64)>,
    write: bool,
}

impl Part {
    fn new(region: u64, segs: &[Segment], write: bool) -> Part {
        let mut head = Vec::with_capacity(12 + 16 * segs.len());
        head.extend_from_slice(&region.to_le_bytes());
        head.extend_from_slice(&(segs.len() as u32).to_le_bytes());
        for s in segs {
            let far = if write { s.dst_off } else { s.src_off };
            head.extend_from_slice(&far.to_le_bytes());
            head.extend_from_slice(&s.len.to_le_bytes());
        }
        let near = segs
            .iter()
            .map(|s| (if write { s.src_off } else { s.dst_off }, s.len))
            .collect();
        Part {
            frame: frame(if write { WRITE } else { READ }, &head),
            near,
            write,
        }
    }
}

/// `segs` cut into at most `k` parts of nearly equal bytes: each part a run of the list in
/// order, a segment cut in two where a part ends; empty segments dropped, and no part empty.
fn split(segs: &[Segment], k: usize) -> Vec<Vec<Segment>> {
    let total: u64 = segs.iter().map(|s| s.len).sum();
    // Where part `j` ends, in bytes from the start (u128: the product may pass u64).
    let end = |j: usize| (u128::from(total) * (j as u128 + 1) / k.max(1) as u128) as u64;
    let (mut parts, mut part, mut done) = (Vec::with_capacity(k), Vec::new(), 0u64);
    for s in segs.iter().filter(|s| s.len > 0) {
        let mut s = *s;
        loop {
            let room = end(parts.len()).saturating_sub(done);
            if s.len <= room || parts.len() + 1 >= k {
                done += s.len;
                part.push(s);
                break;
            }
            if room > 0 {
                part.push(Segment::new(s.dst_off, s.src_off, room));
                (s.dst_off, s.src_off, s.len) = (s.dst_off + room, s.src_off + room, s.len - room);
                done += room;
            }
            parts.push(std::mem::take(&mut part));
        }
    }
    parts.push(part);
    parts.retain(|p| !p.is_empty());
    parts
}

/// A transfer's parts, run at once: the first on the connection's own stream here, each other
/// on a lane's thread; its result the first part's error in order, once every part has ended
/// (each touches `local`).
fn run_parts(
    peer: &Arc<PeerInner>,
    engine: &Arc<dyn Engine>,
    local: RawBuf,
    parts: Vec<Part>,
) -> Result<(), AgentError> {
    let Reach::Remote(link) = &peer.reach else {
        unreachable!("a transfer over TCP on a connection of this host");
    };
    let mut parts = parts.into_iter();
    let Some(first) = parts.next() else {
        return Ok(());
    };
    let (tx, rx) = mpsc::channel();
    let mut posted = 0;
    let mut lost = None;
    for (i, part) in parts.enumerate() {
        let (p, e, tx) = (Arc::clone(peer), Arc::clone(engine), tx.clone());
        let job = Box::new(move || {
            let Reach::Remote(link) = &p.reach else {
                unreachable!("a lane of a connection over TCP");
            };
            let r = run(&p, &lock(&link.lanes[i].stream), &*e, local, &part);
            let _ = tx.send((i + 1, r));
        });
        // A lane whose thread cannot start (or stopped) leaves the connection short of a
        // stream: broken, as a stream that fails.
        if let Err(e) = run_on(&link.lanes[i].worker, "ferry-agent-tcp-lane", job) {
            lost = Some(broken(
                peer,
                &io::Error::other(format!("lane {}: {e}", i + 1)),
            ));
            break;
        }
        posted += 1;
    }
    drop(tx);
    let mut results = vec![(0, run(peer, &lock(&peer.stream), &**engine, local, &first))];
    // Every posted part reports, or its job was dropped unrun or ended without reporting (its
    // thread gone): the part did not move its bytes, and the connection is broken.
    results.extend(rx.iter().take(posted));
    if results.len() < posted + 1 && lost.is_none() {
        let why = io::Error::other("a lane's thread ended without finishing its part");
        lost = Some(broken(peer, &why));
    }
    results.sort_by_key(|r| r.0);
    match (results.into_iter().find_map(|(_, r)| r.err()), lost) {
        (Some(e), _) | (None, Some(e)) => Err(e),
        (None, None) => Ok(()),
    }
}

/// One transfer on the caller's side, the connection's stream held (`guard`): the frame, the
/// bytes out or in, the owner's answer.
fn run(
    peer: &PeerInner,
    guard: &Stream,
    engine: &dyn Engine,
    local: RawBuf,
    part: &Part,
) -> Result<(), AgentError> {
    let (frame, near, write) = (&part.frame[..], &part.near[..], part.write);
    // Broken since this transfer was queued: its stream may be out of step.
    peer.usable()?;
    let Stream::Tcp(s) = guard else {
        unreachable!("a transfer over TCP on a Unix socket");
    };
    let mut s: &TcpStream = s;
    // Every stream of the connection is shut down (`Link::lose`), this one with them.
    let fail = |e: io::Error| broken(peer, &e);
    let owner = || format!("{} (pid {})", peer.name, peer.pid);
    // A local copy that failed while the bytes went out: the owner was told (the status after
    // the bytes), and this is the transfer's error whatever the owner answers.
    let mut mine = None;
    if write {
        mine = send(&mut s, engine, local, frame, near)
            .map_err(fail)?
            .err();
    } else {
        s.write_all(frame).map_err(fail)?;
    }
    let (tag, body, _) = guard.read_frame().map_err(fail)?;
    match (tag, mine) {
        (_, Some(e)) => Err(e),
        (OK, None) if !write => match recv(&mut s, engine, local, near).map_err(fail)? {
            Ok(()) => Ok(()),
            Err(Fault::Local(e)) => Err(e),
            Err(Fault::Far(why)) => Err(AgentError::Refused {
                peer: owner(),
                reason: format!("the owner's copy failed: {why}"),
            }),
        },
        (OK, None) => Ok(()),
        (_, None) => Err(AgentError::Refused {
            peer: owner(),
            reason: String::from_utf8_lossy(&body).into_owned(),
        }),
    }
}

/// Why bytes that arrived in step are not the transfer's: a copy on this side failed, or the
/// sender's status said its own did (its reason).
enum Fault {
    Local(AgentError),
    Far(String),
}

/// The status that ends a transfer's bytes: OK, an empty frame.
const FINE: [u8; 5] = [1, 0, 0, 0, OK];

/// Reads the rest of a status frame whose first five bytes are `head`: `Ok(None)` for OK,
/// `Ok(Some(why))` for ERR; an error where it is no status (the stream is out of step).
fn status(s: &mut &TcpStream, head: [u8; 5]) -> io::Result<Option<String>> {
    let n = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
    if n == 0 || n > MAX_FRAME || !matches!(head[4], OK | ERR) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no status after a transfer's bytes",
        ));
    }
    let mut body = vec![0u8; n - 1];
    s.read_exact(&mut body)?;
    Ok((head[4] == ERR).then(|| String::from_utf8_lossy(&body).into_owned()))
}

/// Reads a status frame from the stream: [`status`] of its first five bytes read here.
fn read_status(s: &mut &TcpStream) -> io::Result<Option<String>> {
    let mut head = [0u8; 5];
    s.read_exact(&mut head)?;
    status(s, head)
}

/// One stage-full of a transfer's bytes through host memory: its length and its pieces
/// (offset in the memory, offset in the stage, length).
type Stage = (usize, Vec<(u64, u64, u64)>);

/// `segs` (offset in the memory, length) cut into stage-fulls of at most [`STAGE`] bytes, one
/// at a time (a list a peer sent may name far more bytes than fit in memory at once).
fn stages(segs: &[(u64, u64)]) -> Stages<'_> {
    Stages {
        segs,
        at: 0,
        done: 0,
    }
}

/// [`stages`]' iterator: the next segment `at`, `done` bytes of it already staged.
struct Stages<'a> {
    segs: &'a [(u64, u64)],
    at: usize,
    done: u64,
}

impl Iterator for Stages<'_> {
    type Item = Stage;

    fn next(&mut self) -> Option<Stage> {
        let (mut pieces, mut used) = (Vec::new(), 0u64);
        while used < STAGE as u64 {
            let Some(&(off, len)) = self.segs.get(self.at) else {
                break;
            };
            let n = (len - self.done).min(STAGE as u64 - used);
            if n > 0 {
                pieces.push((off + self.done, used, n));
            }
            used += n;
            self.done += n;
            if self.done == len {
                (self.at, self.done) = (self.at + 1, 0);
            }
        }
        (used > 0).then_some((used as usize, pieces))
    }
}

/// Sends `head`, then the bytes of `segs` (offset, length) of `mem` and the status: host memory
/// straight from its pages, gathered with the status into as few `writev` calls as the kernel
/// takes; device memory gathered by `engine` into stage-fulls through the bounce ring
/// ([`send_staged`]). Where a copy fails, the rest goes as zeros and the status is ERR and
/// why: `Ok(Err)`, the copy's error, the stream in step. `Err`: the socket's (the stream is
/// out of step).
fn send(
    s: &mut &TcpStream,
    engine: &dyn Engine,
    mem: RawBuf,
    head: &[u8],
    segs: &[(u64, u64)],
) -> io::Result<Result<(), AgentError>> {
    if mem.kind.host_accessible() {
        let mut bufs: Vec<IoSlice<'_>> = Vec::with_capacity(segs.len() + 2);
        bufs.push(IoSlice::new(head));
        for &(off, len) in segs {
            // SAFETY: the range lies in the registration (checked against it by the caller),
            // kept alive by the request's hold on it; concurrent writers race as with any DMA
            // buffer.
            bufs.push(IoSlice::new(unsafe {
                std::slice::from_raw_parts((mem.addr + off) as *const u8, len as usize)
            }));
        }
        bufs.push(IoSlice::new(&FINE));
        let mut bufs = &mut bufs[..];
        while !bufs.is_empty() {
            match s.write_vectored(bufs) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        return Ok(Ok(()));
    }
    s.write_all(head)?;
    match bounce::staged(|ring| send_staged(s, engine, mem, segs, ring))? {
        None => s.write_all(&FINE).map(Ok),
        Some(e) => s
            .write_all(&frame(ERR, e.to_string().as_bytes()))
            .map(|()| Err(e)),
    }
}

/// The bounce ring's engine copy of stage `i` (`pieces`: offset in `mem`, offset in the stage,
/// length) out of (`out`) or into device memory `mem`, its request recorded on the slot; the
/// copy's error where it could not be submitted.
fn stage_copy(
    ring: &mut Ring<Bounce, Option<Request>>,
    i: usize,
    (n, pieces): &Stage,
    engine: &dyn Engine,
    mem: RawBuf,
    out: bool,
) -> Result<(), AgentError> {
    let b = ring.slot_of(i);
    let host = ring.slot_mut(b).raw(*n);
    let list: Vec<Segment> = pieces
        .iter()
        .map(|&(m, st, len)| match out {
            true => Segment::new(st, m, len),
            false => Segment::new(m, st, len),
        })
        .collect();
    let (dst, src) = if out { (host, mem) } else { (mem, host) };
    // SAFETY: the slot's memory lives in the ring until its request has completed (the ring
    // is waited for before its buffers go back, `bounce::staged`); `mem` is a registration
    // held by the transfer, the pieces inside it (checked) and inside the stage.
    *ring.done_mut(b) = Some(unsafe { engine_submit(engine, dst, src, &list) }?);
    Ok(())
}

/// [`send`]'s bytes of device memory: each stage copied by the engine into a bounce buffer,
/// the next stage's copy running while this one's bytes go out (the stages cut one at a time:
/// a list may name far more bytes than fit in memory). Where a copy fails, that stage and the
/// rest go as zeros: `Ok(Some)`, the copy's error. `Err`: the socket's.
fn send_staged(
    s: &mut &TcpStream,
    engine: &dyn Engine,
    mem: RawBuf,
    segs: &[(u64, u64)],
    ring: &mut Ring<Bounce, Option<Request>>,
) -> io::Result<Option<AgentError>> {
    let mut all = stages(segs).enumerate().peekable();
    let mut failed = None;
    // The next stage's copy, submitted while no copy has failed: whether it was (so a stage
    // submitted is the one in flight, and nothing fails between its submit and its wait).
    let start =
        |ring: &mut Ring<_, _>, next: Option<&(usize, Stage)>, failed: &mut Option<_>| match next {
            Some((j, stage)) if failed.is_none() => {
                let r = stage_copy(ring, *j, stage, engine, mem, true);
                r.map_err(|e| *failed = Some(e)).is_ok()
            }
            _ => false,
        };
    let mut submitted = start(ring, all.peek(), &mut failed);
    while let Some((i, (n, _))) = all.next() {
        let b = ring.slot_of(i);
        let copied = submitted
            && ring
                .done_mut(b)
                .wait()
                .map_err(|e| failed = Some(copy_failed(e)))
                .is_ok();
        submitted = start(ring, all.peek(), &mut failed);
        let bytes = ring.slot_mut(b).bytes(n);
        if !copied {
            // What a failed copy left in the stage is not sent: zeros from here on.
            bytes.fill(0);
        }
        s.write_all(bytes)?;
    }
    Ok(failed)
}

/// Receives the bytes of `segs` into `mem` (as [`send`], scattered) and the sender's status.
/// Every byte and the status are read even where a copy into device memory fails, so the
/// stream stays in step: `Ok(Err)` tells what failed. `Err`: the socket's, or no status came
/// (the stream is out of step).
fn recv(
    s: &mut &TcpStream,
    engine: &dyn Engine,
    mem: RawBuf,
    segs: &[(u64, u64)],
) -> io::Result<Result<(), Fault>> {
    let mut failed = None;
    let far = if mem.kind.host_accessible() {
        let mut head = [0u8; 5];
        let mut bufs: Vec<IoSliceMut<'_>> = segs
            .iter()
            .map(|&(off, len)| {
                // SAFETY: as in `send`; written here.
                IoSliceMut::new(unsafe {
                    std::slice::from_raw_parts_mut((mem.addr + off) as *mut u8, len as usize)
                })
            })
            .collect();
        bufs.push(IoSliceMut::new(&mut head));
        let mut bufs = &mut bufs[..];
        IoSliceMut::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            match s.read_vectored(bufs) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => IoSliceMut::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        status(s, head)?
    } else {
        failed = bounce::staged(|ring| recv_staged(s, engine, mem, segs, ring))?;
        read_status(s)?
    };
    Ok(match (failed, far) {
        (Some(e), _) => Err(Fault::Local(e)),
        (None, Some(why)) => Err(Fault::Far(why)),
        (None, None) => Ok(()),
    })
}

/// [`recv`]'s bytes into device memory: each stage read into a bounce buffer and copied out
/// by the engine while the next stage's bytes arrive in the other. Every byte is read even
/// after a copy fails, and no copy is submitted once a failure is seen; a copy that fails as
/// it completes is seen a stage later, so the stage after it may land too (the region holds
/// what arrived; the transfer fails). `Ok(Some)`: the first failure seen. `Err`: the socket's.
fn recv_staged(
    s: &mut &TcpStream,
    engine: &dyn Engine,
    mem: RawBuf,
    segs: &[(u64, u64)],
    ring: &mut Ring<Bounce, Option<Request>>,
) -> io::Result<Option<AgentError>> {
    let mut failed = None;
    for (i, stage) in stages(segs).enumerate() {
        let b = ring.slot_of(i);
        // The slot's last copy (two stages back) has read it before it is overwritten.
        if let Err(e) = ring.done_mut(b).wait() {
            failed.get_or_insert(copy_failed(e));
        }
        s.read_exact(ring.slot_mut(b).bytes(stage.0))?;
        if failed.is_none() {
            failed = stage_copy(ring, i, &stage, engine, mem, false).err();
        }
    }
    if let Err(e) = ring.wait_all() {
        failed.get_or_insert(copy_failed(e));
    }
    Ok(failed)
}

/// A transfer's frame, read: the owner's region, the segments in it (offset, length), their
/// total length.
struct Wanted {
    region: u64,
    segs: Vec<(u64, u64)>,
    total: u64,
}

fn parse_list(body: &[u8]) -> Option<Wanted> {
    let region = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
    let n = u32::from_le_bytes(body.get(8..12)?.try_into().ok()?) as usize;
    let list = body.get(12..)?;
    if list.len() != 16 * n {
        return None;
    }
    let mut total = 0u64;
    let segs = list
        .chunks_exact(16)
        .map(|c| {
            let off = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
            let len = u64::from_le_bytes(c[8..].try_into().expect("8 bytes"));
            total = total.checked_add(len)?;
            Some((off, len))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Wanted {
        region,
        segs,
        total,
    })
}

/// [`parse_list`] of a `what` frame's body (WRITE or READ); an error where it is malformed (the
/// connection is closed then).
fn parse(body: &[u8], what: &str) -> io::Result<Wanted> {
    parse_list(body)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("a malformed {what}")))
}

/// The registration `region` as connection `conn` may reach it: live, imported by it, and
/// every segment inside it; else why not.
fn reachable(
    a: &AgentInner,
    conn: u64,
    region: u64,
    segs: &[(u64, u64)],
    write: bool,
) -> Result<Arc<Local>, String> {
    let regions = lock(&a.regions);
    let Some(e) = regions.get(&region) else {
        return Err(format!(
            "region {region} is not registered with agent '{}'",
            a.name
        ));
    };
    if !e.importers.contains_key(&conn) || !e.local.live.load(Ordering::Acquire) {
        return Err(format!(
            "region {region} of agent '{}' is not imported by this connection (or deregistered)",
            a.name
        ));
    }
    let len = e.local.raw.len as u64;
    for (i, &(off, n)) in segs.iter().enumerate() {
        if off.checked_add(n).is_none_or(|end| end > len) {
            return Err(format!(
                "segment {i} ({n} bytes at offset {off}) lies outside region {region} ({len} bytes)"
            ));
        }
    }
    // A write's segments land in the region: two that overlap would be two writers of the
    // same bytes at once (the caller's own check refuses them too).
    if write {
        let mut order: Vec<(u64, u64)> = segs.iter().copied().filter(|s| s.1 > 0).collect();
        order.sort_unstable();
        if let Some(w) = order.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0) {
            return Err(format!(
                "segments at offsets {} ({} bytes) and {} overlap in region {region}",
                w[0].0, w[0].1, w[1].0
            ));
        }
    }
    Ok(Arc::clone(&e.local))
}

/// The owner's side of a WRITE: the bytes stored into the region, then OK, or ERR and why (the
/// bytes of a refused transfer are read and dropped, keeping the stream in step; where the
/// sender's status says its copy failed, the region holds what arrived and the answer is ERR).
/// `Err`: the connection broke or sent no frame of the protocol; it is closed.
pub(super) fn serve_write(
    a: &AgentInner,
    conn: u64,
    s: &TcpStream,
    body: &[u8],
) -> io::Result<Vec<u8>> {
    let Wanted {
        region,
        segs,
        total,
    } = parse(body, "WRITE")?;
    let mut r = s;
    let mem = match reachable(a, conn, region, &segs, true) {
        Ok(m) => m,
        Err(why) => {
            if io::copy(&mut r.take(total), &mut io::sink())? < total {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            read_status(&mut r)?;
            return Ok(frame(ERR, why.as_bytes()));
        }
    };
    Ok(match recv(&mut r, &*a.engine, mem.raw, &segs)? {
        Ok(()) => frame(OK, &[]),
        Err(Fault::Local(e)) => frame(ERR, e.to_string().as_bytes()),
        Err(Fault::Far(why)) => frame(ERR, format!("the writer's copy failed: {why}").as_bytes()),
    })
}

/// The owner's side of a READ: OK, the bytes and the status (ERR and why where a copy out of
/// device memory failed on the way: that transfer fails, the connection stays), or ERR alone.
/// `Err`: the connection broke; it is closed.
pub(super) fn serve_read(a: &AgentInner, conn: u64, s: &TcpStream, body: &[u8]) -> io::Result<()> {
    let Wanted { region, segs, .. } = parse(body, "READ")?;
    let mut w = s;
    let mem = match reachable(a, conn, region, &segs, false) {
        Ok(m) => m,
        Err(why) => return w.write_all(&frame(ERR, why.as_bytes())),
    };
    // A failed copy was told to the peer in the status: nothing more to do here.
    send(&mut w, &*a.engine, mem.raw, &frame(OK, &[]), &segs).map(drop)
}

#[cfg(test)]
mod tests {
    use super::super::tcp::tests::{agent, KEY};
    use super::*;
    use crate::memory::MemKind;
    use crate::CpuEngine;
    use proptest::prelude::*;

    proptest! {
        /// The parts, joined, are the list (empty segments dropped; a cut segment's halves
        /// joined), none empty, at most `k`, each of at most as many segments as the list, and
        /// their bytes within one segment's cut of an even share.
        #[test]
        fn parts_keep_every_byte_in_order_and_share_them_evenly(
            lens in proptest::collection::vec(0u64..5000, 0..40),
            k in 1usize..9,
        ) {
            let mut at = 0;
            let segs: Vec<Segment> = lens
                .iter()
                .map(|&n| {
                    // Near and far offsets apart, so that a cut that mixed them up shows.
                    let s = Segment::new(at + 7, 3 * at, n);
                    at += n + 5;
                    s
                })
                .collect();
            let parts = split(&segs, k);
            let total: u64 = lens.iter().sum();
            prop_assert!(parts.len() <= k);
            prop_assert!(parts.iter().all(|p| !p.is_empty() && p.len() <= segs.len()));
            let mut joined: Vec<Segment> = Vec::new();
            for s in parts.iter().flatten() {
                match joined.last_mut() {
                    Some(j) if j.dst_off + j.len == s.dst_off && j.src_off + j.len == s.src_off => {
                        j.len += s.len
                    }
                    _ => joined.push(*s),
                }
            }
            let want: Vec<Segment> = segs.iter().copied().filter(|s| s.len > 0).collect();
            prop_assert_eq!(joined, want);
            if total >= k as u64 {
                prop_assert_eq!(parts.len(), k);
                for p in &parts {
                    let bytes: u64 = p.iter().map(|s| s.len).sum();
                    prop_assert!(bytes.abs_diff(total / k as u64) <= 1, "{} of {}", bytes, total);
                }
            }
        }
    }

    /// The owner's record: the number of lanes of each connection that asked for a ticket.
    fn lanes_of(owner: &super::super::Agent) -> Vec<usize> {
        let mut n = owner.inner.tickets.lanes_per_connection();
        n.sort_unstable();
        n
    }

    /// A large transfer with many segments crosses every stream at once and lands whole, both
    /// ways, and one right after it (in order: the small one lands over it); the owner has the
    /// lanes under the first connection's ticket, and closes them when it closes.
    #[test]
    fn large_transfers_are_cut_across_the_streams_and_land_whole() {
        let owner = agent("tcp-lanes");
        let addr = owner.listen_tcp("127.0.0.1:0", KEY).unwrap().to_string();
        let len = 6 << 20;
        let target = owner.register_host(vec![0u8; len]).unwrap();
        let me = agent("tcp-lanes-peer");
        let peer = me.connect_tcp_streams(&addr, KEY, 4).unwrap();
        assert_eq!(lanes_of(&owner), vec![3]);
        let remote = peer.import(target.descriptor()).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
        let mine = me.register_host(data.clone()).unwrap();
        // Segments of uneven lengths, the far offsets reversed: a part cut in the middle of
        // one shows as bytes out of place.
        let (mut segs, mut at) = (Vec::new(), 0u64);
        for i in 0.. {
            let n = (((i * 7919) % 300_000) as u64 + 1).min(len as u64 - at);
            segs.push(Segment::new(len as u64 - at - n, at, n));
            at += n;
            if at == len as u64 {
                break;
            }
        }
        assert!(segs.len() > 30);
        me.write(&remote, &mine, &segs, None)
            .unwrap()
            .wait()
            .unwrap();
        let mut got = vec![0u8; len];
        target.read_at(0, &mut got).unwrap();
        for s in &segs {
            let (d, o, n) = (s.dst_off as usize, s.src_off as usize, s.len as usize);
            assert_eq!(got[d..d + n], data[o..o + n], "segment at {o}");
        }
        // Read it back, the segments the other way round, into fresh memory.
        let back = me.register_host(vec![0u8; len]).unwrap();
        let flipped: Vec<Segment> = segs
            .iter()
            .map(|s| Segment::new(s.src_off, s.dst_off, s.len))
            .collect();
        let big = me.read(&back, &remote, &flipped, None).unwrap();
        let small = me
            .write(&remote, &mine, &[Segment::new(0, 100, 4096)], None)
            .unwrap();
        big.wait().unwrap();
        small.wait().unwrap();
        back.read_at(0, &mut got).unwrap();
        assert!(got == data, "read back across the streams");
        target.read_at(0, &mut got[..4096]).unwrap();
        assert_eq!(got[..4096], data[100..4196], "the later write landed last");
        drop(remote);
        drop(peer);
        let t0 = std::time::Instant::now();
        while !lock(&owner.inner.conns).is_empty() {
            assert!(t0.elapsed().as_secs() < 5, "the owner kept its connections");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(lanes_of(&owner).is_empty());
    }

    /// A lane that breaks fails the transfer it carried a part of, with the connection's
    /// error, and every later transfer on the connection; every stream of the connection is
    /// shut down, so the owner sees it end and releases its imports (the region can then be
    /// deregistered).
    #[test]
    fn a_broken_lane_fails_the_transfer_and_the_connection() {
        let owner = agent("tcp-lane-break");
        let addr = owner.listen_tcp("127.0.0.1:0", KEY).unwrap().to_string();
        let target = owner.register_host(vec![5u8; 4 << 20]).unwrap();
        let me = agent("tcp-lane-break-peer");
        let peer = me.connect_tcp_streams(&addr, KEY, 3).unwrap();
        let remote = peer.import(target.descriptor()).unwrap();
        let mine = me.register_host(vec![1u8; 4 << 20]).unwrap();
        let Reach::Remote(link) = &peer.inner.reach else {
            unreachable!()
        };
        lock(&link.lanes[1].stream).shutdown();
        let all = [Segment::new(0, 0, 4 << 20)];
        let e = me
            .write(&remote, &mine, &all, None)
            .unwrap()
            .wait()
            .unwrap_err();
        assert!(e.to_string().contains("lost"), "{e}");
        assert!(!peer.is_alive());
        match me.write(&remote, &mine, &[Segment::new(0, 0, 16)], None) {
            Err(AgentError::Disconnected { .. }) => {}
            r => panic!("a write after the break: {r:?}"),
        }
        // The peer and its import are still held here; the owner released them all the same.
        let t0 = std::time::Instant::now();
        while !lock(&owner.inner.conns).is_empty() {
            assert!(
                t0.elapsed().as_secs() < 5,
                "the owner kept the broken connection"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        target.deregister().unwrap();
        drop(remote);
    }

    #[test]
    fn stages_cut_segments_at_the_stage_size_and_keep_every_byte() {
        let st = STAGE as u64;
        let segs = [
            (10, 100),
            (5 * st, st + 7),
            (0, 0),
            (3 * st, st - 100),
            (99, 1),
        ];
        let all: Vec<Stage> = stages(&segs).collect();
        // Every stage full but the last, each piece inside its stage, in order.
        for (i, (n, pieces)) in all.iter().enumerate() {
            assert!(*n == STAGE || i == all.len() - 1);
            let mut at = 0;
            for &(_, st_off, len) in pieces {
                assert_eq!(st_off, at);
                at += len;
            }
            assert_eq!(at, *n as u64);
        }
        // The pieces, joined, are the segments.
        let mut joined: Vec<(u64, u64)> = Vec::new();
        for &(m, _, len) in all.iter().flat_map(|(_, p)| p) {
            match joined.last_mut() {
                Some((o, l)) if *o + *l == m => *l += len,
                _ => joined.push((m, len)),
            }
        }
        let want: Vec<(u64, u64)> = segs.iter().copied().filter(|s| s.1 > 0).collect();
        assert_eq!(joined, want);
        assert!(stages(&[]).next().is_none());
    }

    /// A CPU engine that takes "device" memory for host memory (the tests' stand-in for a GPU)
    /// and refuses its `fail_at`-th copy (counting from 0).
    struct Flaky {
        cpu: CpuEngine,
        copies: std::sync::atomic::AtomicUsize,
        fail_at: usize,
        /// The failing copy is taken and fails as it completes (a GPU's error), rather than
        /// refused at submit.
        late: bool,
    }

    impl Engine for Flaky {
        fn name(&self) -> String {
            "flaky".into()
        }
        fn supports(&self, _: MemKind, _: Option<MemKind>) -> bool {
            true
        }
        unsafe fn submit_raw(&self, mut job: crate::Job) -> Result<Request, crate::SubmitError> {
            if self.copies.fetch_add(1, Ordering::Relaxed) == self.fail_at {
                let why = "flaky (on purpose)";
                return match self.late {
                    false => Err(crate::SubmitError::ShutDown(why.into())),
                    true => Ok(Request::ready(Err(RequestError::Backend(
                        BackendError::new(AgentError::Unsupported(why.into())),
                    )))),
                };
            }
            let host = |b: &mut RawBuf| {
                if !b.kind.host_accessible() {
                    b.kind = MemKind::Pageable;
                }
            };
            host(&mut job.dst);
            job.src.iter_mut().for_each(host);
            // SAFETY: forwarded with the caller's guarantees (the "device" memory is host
            // memory of the test).
            unsafe { self.cpu.submit_raw(job) }
        }
        fn barrier(&self) -> Result<(), crate::BarrierError> {
            self.cpu.barrier()
        }
    }

    fn flaky(fail_at: usize) -> Flaky {
        Flaky {
            cpu: CpuEngine::new(1).unwrap(),
            copies: std::sync::atomic::AtomicUsize::new(0),
            fail_at,
            late: false,
        }
    }

    /// A connected pair of TCP streams on this host.
    fn pair() -> (TcpStream, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// A copy out of (into) device memory that fails in the middle of a transfer's bytes fails
    /// that transfer only: the sender sends the rest as zeros and says why in its status, the
    /// receiver reads every byte and the status, and the next frame on the stream is read as
    /// one. Three stages' worth of segments, the second stage's copy refused at submit or
    /// failing as it completes, either side.
    #[test]
    fn a_copy_failing_mid_stream_fails_its_transfer_and_keeps_the_stream_in_step() {
        for late in [false, true] {
            copy_failing_mid_stream(late);
        }
    }

    fn copy_failing_mid_stream(late: bool) {
        let len = 2 * STAGE + 12345;
        let segs = [(0u64, len as u64)];
        let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let device = |addr: *const u8| RawBuf {
            addr: addr as u64,
            len,
            kind: MemKind::Device { ordinal: 0 },
        };
        for sender_fails in [true, false] {
            let (a, b) = pair();
            let (send_engine, recv_engine) = match sender_fails {
                true => (Flaky { late, ..flaky(1) }, flaky(usize::MAX)),
                false => (flaky(usize::MAX), Flaky { late, ..flaky(1) }),
            };
            let mut dst = vec![7u8; len];
            let (dst_raw, src_raw) = (device(dst.as_mut_ptr()), device(src.as_ptr()));
            std::thread::scope(|sc| {
                sc.spawn(|| {
                    let mut w = &a;
                    let sent = send(&mut w, &send_engine, src_raw, &frame(OK, &[]), &segs)
                        .expect("socket");
                    assert_eq!(sent.is_err(), sender_fails);
                    w.write_all(&frame(ERR, b"next")).unwrap();
                });
                let mut r = &b;
                let mut head = [0u8; 5];
                r.read_exact(&mut head).unwrap();
                assert_eq!(head, FINE);
                let got = recv(&mut r, &recv_engine, dst_raw, &segs).expect("socket");
                match (got, sender_fails) {
                    (Err(Fault::Far(why)), true) => assert!(why.contains("on purpose"), "{why}"),
                    (Err(Fault::Local(e)), false) => {
                        assert!(e.to_string().contains("on purpose"), "{e}")
                    }
                    (Ok(()), _) => panic!("the failed copy was not reported"),
                    (_, _) => panic!("the failure was reported by the wrong side"),
                }
                // In step: the next frame is the one sent after the transfer.
                let next = Stream::Tcp(b.try_clone().unwrap()).read_frame().unwrap();
                assert_eq!((next.0, &next.1[..]), (ERR, &b"next"[..]));
            });
            // The first stage arrived; what followed the failure is zeros (sender) or was not
            // stored (receiver: the failed stage; a copy failing as it completes is seen a stage
            // later, so the stage after it may land).
            assert_eq!(dst[..STAGE], src[..STAGE]);
            let (failed, rest) = (&dst[STAGE..2 * STAGE], &dst[2 * STAGE..]);
            match sender_fails {
                true => assert!(failed.iter().chain(rest).all(|&x| x == 0), "late {late}"),
                false => {
                    assert!(failed.iter().all(|&x| x == 7), "late {late}");
                    assert!(late || rest.iter().all(|&x| x == 7));
                }
            }
        }
    }

    /// Device memory (the stand-in engine's) crosses through the bounce ring whole, both
    /// ways: segments of uneven lengths over five stages and more, each stage's copy beside
    /// the other's bytes on the socket, the far end's status read after them.
    #[test]
    fn staged_bytes_cross_whole_through_the_bounce_ring() {
        let len = 5 * STAGE + 777;
        let src: Vec<u8> = (0..len).map(|i| (i * 31 % 255) as u8).collect();
        let mut dst = vec![0u8; len];
        let (mut segs, mut at) = (Vec::new(), 0u64);
        for i in 0.. {
            let n = ((i * 104_729) % 900_000 + 1).min(len as u64 - at);
            segs.push((at, n));
            at += n;
            if at == len as u64 {
                break;
            }
        }
        let device = |addr: *const u8| RawBuf {
            addr: addr as u64,
            len,
            kind: MemKind::Device { ordinal: 0 },
        };
        let (src_raw, dst_raw) = (device(src.as_ptr()), device(dst.as_mut_ptr()));
        let (a, b) = pair();
        let (out, into) = (flaky(usize::MAX), flaky(usize::MAX));
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let mut w = &a;
                let sent = send(&mut w, &out, src_raw, &frame(OK, &[]), &segs).expect("socket");
                assert!(sent.is_ok());
            });
            let mut r = &b;
            let mut head = [0u8; 5];
            r.read_exact(&mut head).unwrap();
            assert!(recv(&mut r, &into, dst_raw, &segs).expect("socket").is_ok());
        });
        assert!(dst == src, "the bytes crossed whole");
    }

    /// A small transfer on an idle connection comes back done; one queued behind a large
    /// transfer waits its turn (the large one's bytes land first, the small one's over them).
    #[test]
    fn small_transfers_run_here_only_with_nothing_queued() {
        let owner = agent("tcp-inline");
        let addr = owner.listen_tcp("127.0.0.1:0", KEY).unwrap().to_string();
        let big = 8 << 20;
        let target = owner.register_host(vec![0u8; big]).unwrap();
        let me = agent("tcp-inline-peer");
        let peer = me.connect_tcp(&addr, KEY).unwrap();
        let remote = peer.import(target.descriptor()).unwrap();
        let small = me.register_host(vec![2u8; 4096]).unwrap();
        let r = me
            .write(&remote, &small, &[Segment::new(0, 0, 4096)], None)
            .unwrap();
        assert!(r.is_done(), "a 4 KiB write on an idle connection");
        r.wait().unwrap();
        let large = me.register_host(vec![1u8; big]).unwrap();
        let first = me.write(&remote, &large, &[Segment::new(0, 0, big as u64)], None);
        let then = me.write(&remote, &small, &[Segment::new(0, 0, 4096)], None);
        first.unwrap().wait().unwrap();
        then.unwrap().wait().unwrap();
        let mut got = vec![0u8; 8192];
        target.read_at(0, &mut got).unwrap();
        assert!(
            got[..4096].iter().all(|&b| b == 2),
            "the small write ran first"
        );
        assert!(got[4096..].iter().all(|&b| b == 1));
    }

    #[test]
    fn the_owner_checks_every_segment_and_stays_in_step() {
        let owner = agent("tcp-check");
        let addr = owner.listen_tcp("127.0.0.1:0", KEY).unwrap().to_string();
        let mine = owner
            .register_host((0..8192).map(|i| i as u8).collect())
            .unwrap();
        let other = owner.register_host(vec![0u8; 8192]).unwrap();
        let me = agent("tcp-check-peer");
        let peer = me.connect_tcp(&addr, KEY).unwrap();
        let remote = peer.import(mine.descriptor()).unwrap();
        let local = me.register_host(vec![0u8; 8192]).unwrap();
        let engine: Arc<dyn Engine> = Arc::new(CpuEngine::new(1).unwrap());
        // A transfer the caller's own checks would refuse, sent anyway: the owner's error.
        let refused = |region: u64, segs: &[Segment], write: bool| {
            let r = transfer(
                &peer.inner,
                Arc::clone(&engine),
                Arc::clone(&local.local),
                region,
                segs,
                write,
            );
            r.unwrap().wait().unwrap_err().to_string()
        };
        // Past the region's end: refused with the offsets, and the bytes already sent are read
        // and dropped: the next transfer works.
        let past = [Segment::new(8000, 0, 1000)];
        let e = refused(mine.descriptor().region, &past, true);
        assert!(
            e.contains("outside region") && e.contains("offset 8000"),
            "{e}"
        );
        // Two segments writing the same bytes: refused.
        let twice = [Segment::new(0, 0, 100), Segment::new(50, 200, 100)];
        let e = refused(mine.descriptor().region, &twice, true);
        assert!(e.contains("overlap"), "{e}");
        // A region this connection did not import: refused.
        let e = refused(other.descriptor().region, &[Segment::new(0, 0, 16)], false);
        assert!(e.contains("not imported"), "{e}");
        // So with no byte to move, on the transfer thread (the stream held here meanwhile) as
        // on the calling thread.
        let held = lock(&peer.inner.stream);
        let queued = transfer(
            &peer.inner,
            Arc::clone(&engine),
            Arc::clone(&local.local),
            other.descriptor().region,
            &[Segment::new(0, 0, 0)],
            true,
        )
        .unwrap();
        assert!(!queued.is_done());
        drop(held);
        let e = queued.wait().unwrap_err().to_string();
        assert!(e.contains("not imported"), "{e}");
        let e = refused(other.descriptor().region, &[Segment::new(0, 0, 0)], true);
        assert!(e.contains("not imported"), "{e}");
        // In step: a read of the first 4 KiB.
        me.read(&local, &remote, &[Segment::new(0, 0, 4096)], None)
            .unwrap()
            .wait()
            .unwrap();
        let mut got = vec![0u8; 4096];
        local.read_at(0, &mut got).unwrap();
        assert!(got.iter().enumerate().all(|(i, &b)| b == i as u8));
        assert!(peer.is_alive());
    }
}
