//! The agents' protocol over their Unix socket: a handshake (names, pids, the server's agent
//! id and its process's life word, `sys::Life`, with the word's memfd attached; both ends check
//! that the other runs as the same user), imports confirmed by the owner
//! (with the memfd of shared memory attached), releases, notifications. The same protocol runs
//! over TCP between hosts (`tcp.rs`: no descriptors travel there, the key is proved before the
//! handshake, and transfers are frames of their own carrying the bytes).
//!
//! Frames (`frame.rs`): a peer sends HELLO, IMPORT, RELEASE and NOTIFY; the owner answers HELLO and IMPORT with HELLO, OK
//! or ERR (a reason in UTF-8). This is the second protocol: its HELLO has a tag of its own, so
//! that an agent of the first (an older ferry, whose reply lacked the life word) and one of
//! this refuse each other with the reason instead of misreading the reply.

use super::frame::{
    frame, Stream, ERR, HELLO, HELLO_V1, IMPORT, LANE, LANES, MAX_FRAME, NOTIFY, OK, READ, RELEASE,
    WRITE,
};
use super::{lock, sys, tcp_bytes, AgentError, AgentInner, Descriptor, PeerInner, Reach, Store};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// Accepts peers until the agent is dropped, one thread per connection.
pub(super) fn serve(listener: UnixListener, agent: Weak<AgentInner>) {
    for s in listener.incoming() {
        let Some(a) = agent.upgrade() else { return };
        if a.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut s) = s else { continue };
        match sys::peer_cred(&s) {
            Ok((uid, _)) if uid == sys::uid() => {}
            Ok((uid, pid)) => {
                let why = format!(
                    "pid {pid} runs as uid {uid}, not this agent's uid {}",
                    sys::uid()
                );
                let _ = s.write_all(&frame(ERR, why.as_bytes()));
                continue;
            }
            Err(_) => continue,
        }
        let weak = agent.clone();
        let _ = std::thread::Builder::new()
            .name("ferry-agent-peer".into())
            .spawn(move || handle(Stream::Unix(s), weak));
    }
}

/// Serves one peer's connection until it closes (over TCP, after the peer proved the key). A
/// TCP connection whose first frame is LANE is a lane of another (`tcp.rs`): it then carries
/// WRITE and READ alone, reaching what that connection imported.
pub(super) fn handle(s: Stream, agent: Weak<AgentInner>) {
    let Some(a) = agent.upgrade() else { return };
    let conn = a.next_conn.fetch_add(1, Ordering::Relaxed);
    if let Ok(c) = s.try_clone() {
        lock(&a.conns).insert(conn, c);
    }
    drop(a);
    let mut peer_name = String::from("?");
    // A lane: the connection whose imports its transfers reach (the one that asked for the
    // ticket it presented first thing).
    let (mut lane_of, mut first) = (None::<u64>, true);
    while let Ok((tag, body, _)) = s.next_frame() {
        let Some(a) = agent.upgrade() else { break };
        let was_first = std::mem::replace(&mut first, false);
        let reply = match (tag, &s) {
            (WRITE, Stream::Tcp(t)) => {
                match tcp_bytes::serve_write(&a, lane_of.unwrap_or(conn), t, &body) {
                    Ok(f) => Some((f, None)),
                    Err(_) => break,
                }
            }
            (READ, Stream::Tcp(t)) => {
                match tcp_bytes::serve_read(&a, lane_of.unwrap_or(conn), t, &body) {
                    Ok(()) => None,
                    Err(_) => break,
                }
            }
            (LANE, Stream::Tcp(_)) if was_first => match a.tickets.redeem(conn, &body) {
                Some(of) => {
                    lane_of = Some(of);
                    Some((frame(OK, &[]), None))
                }
                None => {
                    let _ = s.send(&frame(ERR, b"not a ticket this agent gave"), None);
                    break;
                }
            },
            _ if lane_of.is_some() => Some((
                frame(ERR, format!("message {tag} on a lane").as_bytes()),
                None,
            )),
            (LANES, Stream::Tcp(_)) => Some((
                match a.tickets.issue(conn) {
                    Ok(t) => frame(OK, &t),
                    Err(why) => frame(ERR, why.as_bytes()),
                },
                None,
            )),
            (HELLO, _) if body.len() >= 4 => {
                let pid = u32::from_le_bytes(body[..4].try_into().expect("4 bytes"));
                peer_name = String::from_utf8_lossy(&body[4..]).into_owned();
                // This process's life word (0: none; the peer then polls its pidfd), and
                // cross-memory attach allowed: for peers of this host alone.
                let (fd, word) = match &s {
                    Stream::Unix(_) => {
                        sys::allow_ptracer(pid as i32);
                        sys::Life::get().map_or((None, 0), |l| {
                            let (fd, word) = l.share();
                            (Some(fd), word)
                        })
                    }
                    Stream::Tcp(_) => (None, 0),
                };
                let mut p = a.id.to_le_bytes().to_vec();
                p.extend_from_slice(&a.pid.to_le_bytes());
                p.extend_from_slice(&word.to_le_bytes());
                p.extend_from_slice(a.name.as_bytes());
                Some((frame(HELLO, &p), fd))
            }
            (HELLO_V1, _) => Some((
                frame(
                    ERR,
                    b"the peer speaks the first agent protocol, this agent the second: \
                      run one ferry version on both sides",
                ),
                None,
            )),
            (IMPORT, _) => Some(import_reply(&a, conn, &body, matches!(s, Stream::Unix(_)))),
            (RELEASE, _) if body.len() == 8 => {
                a.release(
                    conn,
                    Some(u64::from_le_bytes(body[..8].try_into().expect("8"))),
                );
                None
            }
            (NOTIFY, _) => {
                lock(&a.notes).push_back((peer_name.clone(), body));
                a.notes_cv.notify_all();
                None
            }
            _ => Some((
                frame(ERR, format!("unknown message {tag}").as_bytes()),
                None,
            )),
        };
        if let Some((f, fd)) = reply {
            if s.send(&f, fd).is_err() {
                break;
            }
        }
    }
    s.shutdown();
    if let Some(a) = agent.upgrade() {
        a.release(conn, None);
        let lanes = a.tickets.forget(conn);
        let mut conns = lock(&a.conns);
        for lane in lanes {
            if let Some(c) = conns.get(&lane) {
                c.shutdown();
            }
        }
        conns.remove(&conn);
    }
}

/// The owner's answer to an import: OK (with the memfd of shared memory), or ERR and why.
/// (`fds`: false over TCP, where the importer reaches the memory through the connection.)
fn import_reply(a: &AgentInner, conn: u64, body: &[u8], fds: bool) -> (Vec<u8>, Option<i32>) {
    let refuse = |why: String| (frame(ERR, why.as_bytes()), None);
    let Some(desc) = Descriptor::from_bytes(body) else {
        return refuse("not a descriptor".into());
    };
    let mut regions = lock(&a.regions);
    let Some(e) = regions.get_mut(&desc.region).filter(|e| !e.dropped) else {
        return refuse(format!(
            "{desc} is not registered with agent '{}' (deregistered, or never made here)",
            a.name
        ));
    };
    if e.desc != desc {
        return refuse(format!(
            "{desc} does not match the registration ({}): a forged or corrupted descriptor",
            e.desc
        ));
    }
    *e.importers.entry(conn).or_insert(0) += 1;
    let fd = match &e.local.store {
        Store::Shared { map, .. } if fds => Some(map.fd()),
        Store::Vmm { fd, .. } if fds => Some(std::os::fd::AsRawFd::as_raw_fd(fd)),
        _ => None,
    };
    (frame(OK, &[]), fd)
}

/// Connects to the agent at `path`: the handshake, both ends checked to be the same user.
pub(super) fn connect(me: &AgentInner, path: &Path) -> Result<PeerInner, AgentError> {
    let at = path.display().to_string();
    let s = UnixStream::connect(path).map_err(super::io_err(format!("connect to {at}")))?;
    s.set_read_timeout(Some(me.timeout))
        .map_err(super::io_err("set the socket's timeout"))?;
    let (uid, pid) = sys::peer_cred(&s).map_err(super::io_err(format!("credentials of {at}")))?;
    if uid != sys::uid() {
        return Err(AgentError::Refused {
            peer: at,
            reason: format!(
                "its agent runs as uid {uid}, not as this process's uid {}",
                sys::uid()
            ),
        });
    }
    hello(me, Stream::Unix(s), &at, Reach::Local(pid))
}

/// The handshake on a connection made (`reach`: how the peer's life is watched: the pid its
/// socket's credentials named, opened with the life word the reply brings, or the link over
/// TCP).
pub(super) fn hello(
    me: &AgentInner,
    s: Stream,
    at: &str,
    reach: Reach<i32>,
) -> Result<PeerInner, AgentError> {
    let mut hello = me.pid.to_le_bytes().to_vec();
    hello.extend_from_slice(me.name.as_bytes());
    // An agent that refuses this process answers ERR and closes at once: the send may then
    // fail (EPIPE) with the refusal already waiting to be read, which is the better error.
    let sent = s.send(&frame(HELLO, &hello), None);
    let (tag, body, fd) = match (s.read_frame(), sent) {
        (Ok(f), _) => f,
        (Err(e), Ok(())) | (Err(_), Err(e)) => {
            return Err(super::io_err(format!("handshake with {at}"))(e));
        }
    };
    match tag {
        HELLO if body.len() >= 16 => {
            let agent = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
            let their = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
            let word = u32::from_le_bytes(body[12..16].try_into().expect("4 bytes"));
            let reach = match reach {
                Reach::Local(pid) => {
                    let life = fd.filter(|_| word != 0).map(|fd| (fd, word));
                    Reach::Local(
                        sys::ProcessHandle::open(pid, life)
                            .map_err(super::io_err(format!("pidfd of pid {pid}")))?,
                    )
                }
                Reach::Remote(link) => Reach::Remote(link),
            };
            Ok(PeerInner {
                name: String::from_utf8_lossy(&body[16..]).into_owned(),
                pid: their,
                agent,
                stream: std::sync::Mutex::new(s),
                reach,
            })
        }
        // An older agent answers the unknown handshake so.
        ERR if body.starts_with(format!("unknown message {HELLO}").as_bytes()) => {
            Err(AgentError::Refused {
                peer: at.to_string(),
                reason: "its agent speaks the first agent protocol, this one the second: run \
                         one ferry version on both sides"
                    .into(),
            })
        }
        _ => Err(AgentError::Refused {
            peer: at.to_string(),
            reason: String::from_utf8_lossy(&body).into_owned(),
        }),
    }
}

/// Asks the owner to confirm `desc`; the memfd of shared memory if one came.
pub(super) fn import(peer: &PeerInner, desc: &Descriptor) -> Result<Option<OwnedFd>, AgentError> {
    let s = lock(&peer.stream);
    peer.usable()?;
    let who = format!("{} (pid {})", peer.name, peer.pid);
    let lost = |e: std::io::Error| peer.lost(&s, format!("import from {who}"), e);
    s.send(&frame(IMPORT, &desc.to_bytes()), None)
        .map_err(lost)?;
    let (tag, body, fd) = s.read_frame().map_err(lost)?;
    match tag {
        OK => Ok(fd),
        _ => Err(AgentError::Refused {
            peer: who,
            reason: String::from_utf8_lossy(&body).into_owned(),
        }),
    }
}

/// Tells the owner that this process no longer uses `region` (best effort: a closed
/// connection releases everything anyway).
pub(super) fn release(peer: &PeerInner, region: u64) {
    let s = lock(&peer.stream);
    if peer.usable().is_ok()
        && s.send(&frame(RELEASE, &region.to_le_bytes()), None)
            .is_err()
    {
        s.shutdown();
    }
}

/// Sends a notification.
pub(super) fn notify(peer: &Arc<PeerInner>, msg: &[u8]) -> Result<(), AgentError> {
    if msg.len() + 1 > MAX_FRAME {
        return Err(AgentError::Unsupported(format!(
            "a notification of {} bytes (at most {})",
            msg.len(),
            MAX_FRAME - 1
        )));
    }
    let s = lock(&peer.stream);
    peer.usable()?;
    s.send(&frame(NOTIFY, msg), None)
        .map_err(|e| peer.lost(&s, format!("notify {} (pid {})", peer.name, peer.pid), e))
}
