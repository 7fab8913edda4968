//! The bytes of transfers over TCP (`tcp.rs` makes the connections): a write is a WRITE frame
//! naming the owner's region and segments, followed by the bytes; the owner's connection
//! thread stores them (host memory straight from the socket, device memory through the owner
//! agent's engine in stage-fulls of [`STAGE`] bytes) and answers OK once they have landed, or
//! ERR and why. A read is a READ frame, answered by OK and the bytes, or ERR. On the caller's
//! side a transfer runs on the connection's transfer thread, one at a time per connection and
//! in order; the caller has its `Request` at once, and device memory there is staged the same
//! way. Host memory moves with one `writev`/`readv` for the whole segment list.

use super::frame::{frame, Stream, ERR, MAX_FRAME, OK, READ, WRITE};
use super::{engine_copy, lock, run_on, AgentError, AgentInner, CopyJob, Local, PeerInner, Reach};
use crate::memory::{MemKind, RawBuf};
use crate::op::Segment;
use crate::request::{BackendError, Request, RequestError, Signal};
use crate::Engine;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

/// Device memory crosses host memory in pieces of this many bytes.
const STAGE: usize = 4 << 20;
/// The most segments one transfer's frame carries (its frame at most `MAX_FRAME`).
pub(super) const MAX_SEGMENTS: usize = (MAX_FRAME - 1 - 12) / 16;

/// The caller's side of a connection over TCP: whether it broke, and its transfer thread.
pub(super) struct Link {
    lost: AtomicBool,
    worker: Mutex<Option<mpsc::Sender<CopyJob>>>,
}

impl Link {
    /// A connection not yet found broken, its transfer thread not yet started.
    pub(super) fn new() -> Link {
        Link {
            lost: AtomicBool::new(false),
            worker: Mutex::new(None),
        }
    }

    /// True once a transfer or message found the connection broken.
    pub(super) fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
    fn lose(&self) {
        self.lost.store(true, Ordering::Release);
    }
}

/// The error of a connection that broke, marked so for the transfers after it (the caller,
/// who holds the stream, closes it where the stream is out of step).
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
/// connection, run on its transfer thread; the request completes when the owner has answered
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
    let mut head = Vec::with_capacity(12 + 16 * segs.len());
    head.extend_from_slice(&region.to_le_bytes());
    head.extend_from_slice(&(segs.len() as u32).to_le_bytes());
    for s in segs {
        let far = if write { s.dst_off } else { s.src_off };
        head.extend_from_slice(&far.to_le_bytes());
        head.extend_from_slice(&s.len.to_le_bytes());
    }
    let frame = frame(if write { WRITE } else { READ }, &head);
    let near: Vec<(u64, u64)> = segs
        .iter()
        .map(|s| (if write { s.src_off } else { s.dst_off }, s.len))
        .collect();
    let signal = Arc::new(Signal::new());
    let done = Arc::clone(&signal);
    let p = Arc::clone(peer);
    let job = Box::new(move || {
        let r = run(&p, &*engine, local.raw, &frame, &near, write);
        drop(local);
        done.complete(r.map_err(|e| RequestError::Backend(BackendError::new(e))));
    });
    run_on(&link.worker, "ferry-agent-tcp-copy", job)?;
    Ok(Request::new(signal))
}

/// One transfer on the caller's side: the frame, the bytes out or in, the owner's answer.
fn run(
    peer: &PeerInner,
    engine: &dyn Engine,
    local: RawBuf,
    frame: &[u8],
    near: &[(u64, u64)],
    write: bool,
) -> Result<(), AgentError> {
    let guard = lock(&peer.stream);
    // Broken since this transfer was queued: its stream may be out of step.
    peer.usable()?;
    let Stream::Tcp(s) = &*guard else {
        unreachable!("a transfer over TCP on a Unix socket");
    };
    let mut s: &TcpStream = s;
    let fail = |e: io::Error| {
        let _ = s.shutdown(Shutdown::Both);
        broken(peer, &e)
    };
    if write {
        // A local copy that fails while the bytes go out leaves the owner waiting for bytes
        // this side cannot send: the connection is closed, and the transfer fails with the
        // copy's error.
        send(&mut s, engine, local, frame, near).map_err(|e| match e {
            AgentError::Io { source, .. } => fail(source),
            e => {
                let _ = fail(io::Error::other("closed after a failed local copy"));
                e
            }
        })?;
    } else {
        s.write_all(frame).map_err(fail)?;
    }
    let (tag, body, _) = guard.read_frame().map_err(fail)?;
    match tag {
        // Every byte is read even where a local copy fails (the stream stays in step).
        OK if !write => recv(&mut s, engine, local, near).map_err(|e| match e {
            AgentError::Io { source, .. } => fail(source),
            e => e,
        }),
        OK => Ok(()),
        _ => Err(AgentError::Refused {
            peer: format!("{} (pid {})", peer.name, peer.pid),
            reason: String::from_utf8_lossy(&body).into_owned(),
        }),
    }
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

fn socket_error(what: &'static str) -> impl Fn(io::Error) -> AgentError {
    move |e| AgentError::Io {
        what: what.into(),
        source: e,
    }
}

/// Sends `head`, then the bytes of `segs` (offset, length) of `mem`: host memory straight from
/// its pages, gathered into as few `writev` calls as the kernel takes; device memory gathered
/// by `engine` into stage-fulls, one copy and one write each. Errors: the socket's
/// ([`AgentError::Io`]) or the copy's.
fn send(
    s: &mut &TcpStream,
    engine: &dyn Engine,
    mem: RawBuf,
    head: &[u8],
    segs: &[(u64, u64)],
) -> Result<(), AgentError> {
    let sent = socket_error("send a transfer's bytes");
    if mem.kind.host_accessible() {
        let mut bufs: Vec<IoSlice<'_>> = Vec::with_capacity(segs.len() + 1);
        bufs.push(IoSlice::new(head));
        for &(off, len) in segs {
            // SAFETY: the range lies in the registration (checked against it by the caller),
            // kept alive by the request's hold on it; concurrent writers race as with any DMA
            // buffer.
            bufs.push(IoSlice::new(unsafe {
                std::slice::from_raw_parts((mem.addr + off) as *const u8, len as usize)
            }));
        }
        let mut bufs = &mut bufs[..];
        while !bufs.is_empty() {
            match s.write_vectored(bufs) {
                Ok(0) => return Err(sent(io::ErrorKind::WriteZero.into())),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(sent(e)),
            }
        }
        return Ok(());
    }
    s.write_all(head).map_err(&sent)?;
    let mut stage = vec![0u8; segs.iter().map(|g| g.1).sum::<u64>().min(STAGE as u64) as usize];
    for (n, pieces) in stages(segs) {
        let host = RawBuf::host(stage.as_mut_ptr(), n, MemKind::Pageable);
        let list: Vec<Segment> = pieces
            .iter()
            .map(|&(m, st, len)| Segment::new(st, m, len))
            .collect();
        engine_copy(engine, host, mem, &list)?;
        s.write_all(&stage[..n]).map_err(&sent)?;
    }
    Ok(())
}

/// Receives the bytes of `segs` into `mem` (as [`send`], scattered). Every byte is read even
/// where a copy into device memory fails (the first such error is returned after the last
/// byte), so the stream stays in step; a socket error returns at once.
fn recv(
    s: &mut &TcpStream,
    engine: &dyn Engine,
    mem: RawBuf,
    segs: &[(u64, u64)],
) -> Result<(), AgentError> {
    let got = socket_error("receive a transfer's bytes");
    if mem.kind.host_accessible() {
        let mut bufs: Vec<IoSliceMut<'_>> = segs
            .iter()
            .map(|&(off, len)| {
                // SAFETY: as in `send`; written here.
                IoSliceMut::new(unsafe {
                    std::slice::from_raw_parts_mut((mem.addr + off) as *mut u8, len as usize)
                })
            })
            .collect();
        let mut bufs = &mut bufs[..];
        IoSliceMut::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            match s.read_vectored(bufs) {
                Ok(0) => return Err(got(io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => IoSliceMut::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(got(e)),
            }
        }
        return Ok(());
    }
    let mut stage = vec![0u8; segs.iter().map(|g| g.1).sum::<u64>().min(STAGE as u64) as usize];
    let mut failed = None;
    for (n, pieces) in stages(segs) {
        s.read_exact(&mut stage[..n]).map_err(&got)?;
        if failed.is_some() {
            continue;
        }
        let host = RawBuf::host(stage.as_ptr(), n, MemKind::Pageable);
        let list: Vec<Segment> = pieces
            .iter()
            .map(|&(m, st, len)| Segment::new(m, st, len))
            .collect();
        failed = engine_copy(engine, mem, host, &list).err();
    }
    failed.map_or(Ok(()), Err)
}

/// A transfer's frame, read: the owner's region, the segments in it (offset, length), their
/// total length.
struct Wanted {
    region: u64,
    segs: Vec<(u64, u64)>,
    total: u64,
}

fn parse(body: &[u8]) -> Option<Wanted> {
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
/// bytes of a refused transfer are read and dropped, keeping the stream in step). `Err`: the
/// connection broke or sent no frame of the protocol; it is closed.
pub(super) fn serve_write(
    a: &AgentInner,
    conn: u64,
    s: &TcpStream,
    body: &[u8],
) -> io::Result<Vec<u8>> {
    let Some(Wanted {
        region,
        segs,
        total,
    }) = parse(body)
    else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a malformed WRITE",
        ));
    };
    let mut r = s;
    let mem = match reachable(a, conn, region, &segs, true) {
        Ok(m) => m,
        Err(why) => {
            io::copy(&mut r.take(total), &mut io::sink())?;
            return Ok(frame(ERR, why.as_bytes()));
        }
    };
    Ok(match recv(&mut r, &*a.engine, mem.raw, &segs) {
        Ok(()) => frame(OK, &[]),
        Err(AgentError::Io { source, .. }) => return Err(source),
        Err(e) => frame(ERR, e.to_string().as_bytes()),
    })
}

/// The owner's side of a READ: OK and the bytes, or ERR and why. `Err`: the connection broke,
/// or a copy failed after OK was sent (the connection is closed then: the peer's transfer
/// fails).
pub(super) fn serve_read(a: &AgentInner, conn: u64, s: &TcpStream, body: &[u8]) -> io::Result<()> {
    let Some(Wanted { region, segs, .. }) = parse(body) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a malformed READ",
        ));
    };
    let mut w = s;
    let mem = match reachable(a, conn, region, &segs, false) {
        Ok(m) => m,
        Err(why) => return w.write_all(&frame(ERR, why.as_bytes())),
    };
    send(&mut w, &*a.engine, mem.raw, &frame(OK, &[]), &segs).map_err(|e| match e {
        AgentError::Io { source, .. } => source,
        e => io::Error::other(e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::super::tcp::tests::{agent, KEY};
    use super::*;
    use crate::CpuEngine;

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
        let p = &peer.inner;
        // Past the region's end (the caller's own check bypassed): refused with the offsets,
        // and the bytes already sent are read and dropped: the next transfer works.
        let past = [Segment::new(8000, 0, 1000)];
        let r = transfer(
            p,
            Arc::clone(&engine),
            Arc::clone(&local.local),
            mine.descriptor().region,
            &past,
            true,
        )
        .unwrap()
        .wait();
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("outside region") && e.contains("offset 8000"),
            "{e}"
        );
        // Two segments writing the same bytes (the caller's own check bypassed): refused.
        let twice = [Segment::new(0, 0, 100), Segment::new(50, 200, 100)];
        let r = transfer(
            p,
            Arc::clone(&engine),
            Arc::clone(&local.local),
            mine.descriptor().region,
            &twice,
            true,
        )
        .unwrap()
        .wait();
        let e = r.unwrap_err().to_string();
        assert!(e.contains("overlap"), "{e}");
        // A region this connection did not import: refused.
        let r = transfer(
            p,
            Arc::clone(&engine),
            Arc::clone(&local.local),
            other.descriptor().region,
            &[Segment::new(0, 0, 16)],
            false,
        )
        .unwrap()
        .wait();
        assert!(r.unwrap_err().to_string().contains("not imported"));
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
