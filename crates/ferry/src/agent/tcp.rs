//! Agents on other hosts: the agents' protocol over TCP ([`Agent::listen_tcp`],
//! [`Agent::connect_tcp`]): the listener, the key's proof, the connection made, its lanes; the
//! transfers' bytes then travel in the connection itself (`tcp_bytes.rs`).
//!
//! Lanes: a connection of several streams (4 by default) is its first connection and
//! further ones to the same address, the lanes. After the handshake the connector asks the
//! owner for a ticket on the first (LANES: its connection number and 16 random bytes); each
//! lane proves the key as any connection does, then presents the ticket as its first message
//! (LANE). The owner then serves on it WRITE and READ alone, reaching what the first
//! connection imported, and closes the lanes when the first closes. One stream runs at what
//! one core copies through the kernel; several at what the network takes, as NCCL's sockets
//! (`NCCL_NSOCKS_PERTHREAD`) and UCX's lanes do.
//!
//! Why TCP: it reaches any host with nothing but the kernel, and it carries host and device
//! memory alike (device memory staged through host memory). Device memory between two hosts
//! at the network's full speed needs RDMA (GPUDirect, through UCX or NCCL's network plugins)
//! and a second GPU or host to run at all (NCCL refuses two ranks on one GPU); this transport
//! runs wherever its tests run, over loopback on one host.
//!
//! Trust: both agents hold one key (at least [`MIN_KEY`] bytes, given to both by the
//! application). Before any other message each end proves it to the other with HMAC-SHA256
//! over the other's random challenge, so the key itself never travels and a connector without
//! it reaches nothing. The bytes are not encrypted and carry no check of their own (as with
//! NCCL's and UCX's sockets), and nothing ties the proof to the connection: an attacker on the
//! path between two agents (or one an agent is tricked into connecting to, relaying the
//! challenges) can read and change what follows. A network the cluster trusts, or a tunnel
//! (WireGuard, SSH, TLS) where it does not. A connection that breaks (the peer's process or host gone, a
//! peer silent for the agent's timeout in the middle of a transfer) fails its transfer and
//! every later one on it with [`AgentError::Disconnected`]; a copy of device memory that fails
//! on either side fails its transfer only, with the cause (`tcp_bytes.rs`), and the connection
//! serves the next one.
//!
//! [`Agent::listen_tcp`]: super::Agent::listen_tcp
//! [`Agent::connect_tcp`]: super::Agent::connect_tcp

use super::frame::{frame, Stream, AUTH, ERR, LANE, LANES, OK};
use super::lanes::{Lane, MAX_LANES};
use super::tcp_bytes::Link;
use super::wire;
use super::{io_err, lock, sys, AgentError, AgentInner, PeerInner, Reach};
use crate::env;
use crate::ConfigError;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The shortest key accepted, in bytes.
pub(super) const MIN_KEY: usize = 16;
/// The challenges' length in bytes.
const NONCE: usize = 32;
/// A proof's length in bytes (HMAC-SHA256).
const PROOF: usize = 32;

/// The HMAC-SHA256 of the key over `role`, the challenger's nonce and the prover's.
fn proof(key: &[u8], role: &[u8], theirs: &[u8], mine: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(role);
    m.update(theirs);
    m.update(mine);
    m
}

fn random_nonce() -> io::Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    sys::random(&mut n)?;
    Ok(n)
}

fn refused(peer: &str, reason: impl Into<String>) -> AgentError {
    AgentError::Refused {
        peer: peer.to_string(),
        reason: reason.into(),
    }
}

/// The options every agent connection over TCP gets: no Nagle delay (frames are whole
/// messages), keepalive (a dead host is noticed by an idle owner), a write timeout.
fn tune(s: &TcpStream, timeout: Duration) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_write_timeout(Some(timeout))?;
    sys::keepalive(s)
}

/// The TCP side of an agent: where it listens.
pub(super) struct Listening {
    pub(super) addr: SocketAddr,
}

/// Binds `addr` and serves peers that prove `key`, one thread per connection (as the Unix
/// socket's). The address bound (port 0: the one the kernel chose).
pub(super) fn listen(
    agent: &Arc<AgentInner>,
    addr: &str,
    key: &[u8],
) -> Result<SocketAddr, AgentError> {
    if key.len() < MIN_KEY {
        return Err(AgentError::Unsupported(format!(
            "a key of {} bytes: at least {MIN_KEY}",
            key.len()
        )));
    }
    let mut tcp = lock(&agent.tcp);
    if let Some(l) = tcp.as_ref() {
        return Err(AgentError::Unsupported(format!(
            "agent '{}' already listens at {}",
            agent.name, l.addr
        )));
    }
    let listener = TcpListener::bind(addr).map_err(io_err(format!("bind {addr}")))?;
    let bound = listener
        .local_addr()
        .map_err(io_err(format!("the address bound for {addr}")))?;
    let (weak, key): (Weak<AgentInner>, Arc<[u8]>) = (Arc::downgrade(agent), key.into());
    std::thread::Builder::new()
        .name("ferry-agent-tcp".into())
        .spawn(move || serve(listener, weak, key))
        .map_err(io_err("start the agent's TCP thread"))?;
    *tcp = Some(Listening { addr: bound });
    Ok(bound)
}

/// Accepts peers until the agent is dropped.
fn serve(listener: TcpListener, agent: Weak<AgentInner>, key: Arc<[u8]>) {
    // Connections still proving the key: past `MAX_PROVING` more are closed at once (a host
    // without the key cannot hold an unbounded number of threads).
    let proving = Arc::new(AtomicUsize::new(0));
    for s in listener.incoming() {
        let Some(a) = agent.upgrade() else { return };
        if a.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(s) = s else {
            // Out of descriptors, say: not a busy loop.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if proving.fetch_add(1, Ordering::AcqRel) >= MAX_PROVING {
            proving.fetch_sub(1, Ordering::AcqRel);
            let _ = s.shutdown(Shutdown::Both);
            continue;
        }
        let (weak, key, timeout) = (agent.clone(), Arc::clone(&key), a.timeout);
        let count = Arc::clone(&proving);
        drop(a);
        let spawned = std::thread::Builder::new()
            .name("ferry-agent-peer".into())
            .spawn(move || {
                let proved = tune(&s, timeout).is_ok() && prove_as_owner(&s, &key, timeout);
                count.fetch_sub(1, Ordering::AcqRel);
                if !proved {
                    let _ = s.shutdown(Shutdown::Both);
                    return;
                }
                wire::handle(Stream::Tcp(s), weak);
            });
        if spawned.is_err() {
            proving.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The most connections proving the key at once.
const MAX_PROVING: usize = 64;

/// The key's two messages: a frame of exactly `1 + len` bytes with the tag AUTH, read within
/// `deadline` (its length checked before anything is allocated); `None` for anything else.
fn auth_frame(s: &TcpStream, len: usize, deadline: Instant) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 5 + len];
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.checked_duration_since(Instant::now())?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        match io::Read::read(&mut &*s, &mut buf[got..]) {
            Ok(0) | Err(_) => return None,
            Ok(n) => got += n,
        }
        if got >= 5
            && (u32::from_le_bytes(buf[..4].try_into().expect("4 bytes")) as usize != 1 + len
                || buf[4] != AUTH)
        {
            return None;
        }
    }
    Some(buf.split_off(5))
}

/// The owner's half of the challenge: true once the connector has proved the key (a
/// connector that does not, or stays silent for `timeout`, is answered ERR or dropped).
fn prove_as_owner(s: &TcpStream, key: &[u8], timeout: Duration) -> bool {
    let stream = Stream::Tcp(match s.try_clone() {
        Ok(c) => c,
        Err(_) => return false,
    });
    // The whole proof within the agent's timeout, however slowly its bytes come.
    let deadline = Instant::now() + timeout;
    let Some(theirs) = auth_frame(s, NONCE, deadline) else {
        return false;
    };
    let Ok(mine) = random_nonce() else {
        return false;
    };
    let mut reply = mine.to_vec();
    reply.extend_from_slice(
        &proof(key, b"ferry agent owner", &theirs, &mine)
            .finalize()
            .into_bytes(),
    );
    if stream.send(&frame(AUTH, &reply), None).is_err() {
        return false;
    }
    let Some(tag) = auth_frame(s, PROOF, deadline) else {
        return false;
    };
    if proof(key, b"ferry agent peer", &mine, &theirs)
        .verify_slice(&tag)
        .is_err()
    {
        let _ = stream.send(
            &frame(ERR, b"the peer does not hold this agent's key"),
            None,
        );
        return false;
    }
    // The agent's timeout from now on: a frame's first byte waits without a limit (an idle
    // peer, `Stream::next_frame`), the rest of it and a transfer's bytes do not.
    s.set_read_timeout(Some(timeout)).is_ok()
}

/// `addr`'s addresses ("host:port"), within `timeout`: a literal address at once, a name through
/// the system's resolver on a thread of its own, given up after `timeout` (the resolver takes no
/// timeout of its own and can wait far longer for a DNS server that does not answer; the thread
/// then ends whenever the resolver returns, its answer dropped).
fn resolve(addr: &str, timeout: Duration) -> io::Result<Vec<SocketAddr>> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = addr.to_string();
    std::thread::Builder::new()
        .name("ferry-agent-resolve".into())
        .spawn(move || {
            let _ = tx.send(name.to_socket_addrs().map(Vec::from_iter));
        })?;
    rx.recv_timeout(timeout).unwrap_or_else(|_| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no answer within the agent's timeout",
        ))
    })
}

/// Connects to the agent listening at `addr` over TCP: the key proved both ways, the
/// handshake, then `streams - 1` lanes (further connections to the same address, each proving
/// the key and presenting the first connection's ticket) that carry parts of large transfers.
pub(super) fn connect(
    me: &AgentInner,
    addr: &str,
    key: &[u8],
    streams: usize,
) -> Result<PeerInner, AgentError> {
    if key.len() < MIN_KEY {
        return Err(AgentError::Unsupported(format!(
            "a key of {} bytes: at least {MIN_KEY}",
            key.len()
        )));
    }
    if !(1..=MAX_LANES + 1).contains(&streams) {
        return Err(AgentError::Unsupported(format!(
            "{streams} TCP streams to one peer: 1 to {}",
            MAX_LANES + 1
        )));
    }
    // The whole connection (the name, then each address in turn) within the agent's timeout.
    let deadline = Instant::now() + me.timeout;
    let addrs = resolve(addr, me.timeout).map_err(io_err(format!("resolve {addr}")))?;
    let mut last = None;
    let mut s = None;
    for a in &addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(a, left) {
            Ok(c) => {
                s = Some((c, *a));
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some((s, at)) = s else {
        let e = last.unwrap_or_else(|| match addrs.is_empty() {
            true => io::Error::new(io::ErrorKind::NotFound, "no address"),
            false => io::Error::new(
                io::ErrorKind::TimedOut,
                "no answer within the agent's timeout",
            ),
        });
        return Err(io_err(format!("connect to {addr}"))(e));
    };
    let who = format!("tcp://{at}");
    let stream = prove_as_peer(me, s, &who, key)?;
    let mut peer = wire::hello(me, stream, &who, Reach::Remote(Link::new()))?;
    let lanes = match streams {
        1 => Vec::new(),
        n => open_lanes(me, &peer, at, &who, key, n - 1)?,
    };
    let mut sockets = vec![tcp_handle(&lock(&peer.stream))];
    sockets.extend(lanes.iter().map(|l| tcp_handle(&lock(&l.stream))));
    let sockets = sockets
        .into_iter()
        .collect::<io::Result<Vec<_>>>()
        .map_err(io_err(format!("a handle of the connection to {who}")))?;
    if let Reach::Remote(link) = &mut peer.reach {
        (link.lanes, link.sockets) = (lanes, sockets);
    }
    Ok(peer)
}

/// A second handle of a TCP stream (to shut it down while a transfer holds it).
fn tcp_handle(s: &Stream) -> io::Result<TcpStream> {
    match s {
        Stream::Tcp(t) => t.try_clone(),
        Stream::Unix(_) => unreachable!("a connection over TCP on a Unix socket"),
    }
}

/// The connector's half of the key's proof on a connection made: its options set, the
/// challenge sent, the owner's proof checked and this side's sent.
fn prove_as_peer(
    me: &AgentInner,
    s: TcpStream,
    who: &str,
    key: &[u8],
) -> Result<Stream, AgentError> {
    tune(&s, me.timeout).map_err(io_err(format!("set up the connection to {who}")))?;
    s.set_read_timeout(Some(me.timeout))
        .map_err(io_err("set the socket's timeout"))?;
    let stream = Stream::Tcp(s);
    let lost = |e: io::Error| io_err(format!("prove the key to {who}"))(e);
    let mine = random_nonce().map_err(io_err("getrandom"))?;
    stream.send(&frame(AUTH, &mine), None).map_err(lost)?;
    let (tag, body, _) = stream.read_frame().map_err(lost)?;
    if tag == ERR {
        return Err(refused(who, String::from_utf8_lossy(&body)));
    }
    if tag != AUTH || body.len() < NONCE {
        return Err(refused(
            who,
            "not a ferry agent's answer to the key's challenge",
        ));
    }
    let (theirs, tag) = body.split_at(NONCE);
    if proof(key, b"ferry agent owner", &mine, theirs)
        .verify_slice(tag)
        .is_err()
    {
        return Err(refused(who, "its agent does not hold this key"));
    }
    let tag = proof(key, b"ferry agent peer", theirs, &mine)
        .finalize()
        .into_bytes();
    stream.send(&frame(AUTH, &tag), None).map_err(lost)?;
    Ok(stream)
}

/// Opens `n` lanes to the agent at `at` for the connection `peer` holds: its ticket asked for
/// on it (LANES), then each lane connected, the key proved, the ticket presented (LANE).
fn open_lanes(
    me: &AgentInner,
    peer: &PeerInner,
    at: SocketAddr,
    who: &str,
    key: &[u8],
    n: usize,
) -> Result<Vec<Lane>, AgentError> {
    let answer = |s: &Stream, what: &str| -> Result<Vec<u8>, AgentError> {
        let (tag, body, _) = s
            .read_frame()
            .map_err(io_err(format!("{what} from {who}")))?;
        match tag {
            OK => Ok(body),
            _ => Err(refused(who, String::from_utf8_lossy(&body))),
        }
    };
    let ticket = {
        let s = lock(&peer.stream);
        s.send(&frame(LANES, &[]), None)
            .map_err(io_err(format!("ask {who} for a lane's ticket")))?;
        match answer(&s, "a lane's ticket") {
            Err(AgentError::Refused { reason, .. })
                if reason.starts_with(&format!("unknown message {LANES}")) =>
            {
                return Err(refused(
                    who,
                    "its agent is an older ferry, without lanes: run one ferry version on both \
                     sides, or connect with one stream",
                ));
            }
            r => r?,
        }
    };
    (0..n)
        .map(|_| {
            let s = TcpStream::connect_timeout(&at, me.timeout)
                .map_err(io_err(format!("connect a lane to {who}")))?;
            let s = prove_as_peer(me, s, who, key)?;
            s.send(&frame(LANE, &ticket), None)
                .map_err(io_err(format!("join a lane to {who}")))?;
            answer(&s, "a lane's admission")?;
            Ok(Lane::new(s))
        })
        .collect()
}

/// The number of TCP streams a peer connection opens by default: `$FERRY_AGENT_TCP_STREAMS`
/// where set, else [`DEFAULT_STREAMS`].
/// (`get`: where the variable is read: the process environment, or a map in tests).
pub(super) fn default_streams(get: env::Lookup<'_>) -> Result<usize, ConfigError> {
    Ok(env::var::<usize>(get, STREAMS_VAR)?.unwrap_or(DEFAULT_STREAMS))
}

/// The variable that sets [`default_streams`].
pub(super) const STREAMS_VAR: &str = "FERRY_AGENT_TCP_STREAMS";

/// Streams per peer connection where the caller names none: one carries small transfers and
/// its share of large ones, the others ([`Lane`]s) the rest of large ones, in parallel. Each
/// lane is a thread on both sides. On loopback with 16 cores 4 streams carried 10-16 GB/s of
/// large transfers (one: 3-4; 8: 15-26, at 14 threads a connection), and on 2 cores 2 and 4
/// alike 3.7-4.9 (one: 2.4-4.0) (`bench/results/`).
pub(super) const DEFAULT_STREAMS: usize = 4;

#[cfg(test)]
pub(super) mod tests {
    use super::super::{Agent, AgentError};
    use super::*;
    use crate::CpuEngine;

    /// The key of the TCP tests' agents (`tcp_bytes.rs`' too).
    pub(in crate::agent) const KEY: &[u8] = b"sixteen byte key, and more";

    /// An agent on a one-thread CPU engine, 5 s timeout (`tcp_bytes.rs`' tests too).
    pub(in crate::agent) fn agent(name: &str) -> Agent {
        let engine = Arc::new(CpuEngine::new(1).expect("cpu engine"));
        Agent::with_timeout(name, engine, Duration::from_secs(5)).expect("agent")
    }

    /// A raw client: connects and sends the challenge, returns the owner's answer.
    fn challenge(addr: SocketAddr) -> (Stream, [u8; NONCE], Vec<u8>) {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let s = Stream::Tcp(s);
        let mine = random_nonce().unwrap();
        s.send(&frame(AUTH, &mine), None).unwrap();
        let (tag, body, _) = s.read_frame().unwrap();
        assert_eq!(tag, AUTH);
        (s, mine, body)
    }

    #[test]
    fn a_connector_without_the_key_reaches_nothing() {
        let owner = agent("tcp-owner");
        let addr = owner.listen_tcp("127.0.0.1:0", KEY).unwrap();
        let region = owner.register_host(vec![3u8; 4096]).unwrap();
        // A wrong proof: answered ERR, then the connection is closed (a HELLO or an import
        // after it gets nothing).
        let (s, _, _) = challenge(addr);
        s.send(&frame(AUTH, &[0u8; 32]), None).unwrap();
        let (tag, body, _) = s.read_frame().unwrap();
        assert_eq!(tag, ERR);
        assert!(String::from_utf8_lossy(&body).contains("does not hold"));
        let _ = s.send(
            &frame(super::super::frame::IMPORT, &region.descriptor().to_bytes()),
            None,
        );
        assert!(s.read_frame().is_err(), "a refused connector got an answer");
        // A challenge frame claiming 16 MiB: dropped before anything is allocated for it.
        let raw = TcpStream::connect(addr).unwrap();
        raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut head = ((16u32 << 20) + 1).to_le_bytes().to_vec();
        head.push(AUTH);
        let raw = Stream::Tcp(raw);
        raw.send(&head, None).unwrap();
        assert!(raw.read_frame().is_err());
        // A message instead of the challenge: dropped unanswered.
        let raw = TcpStream::connect(addr).unwrap();
        raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let raw = Stream::Tcp(raw);
        raw.send(
            &frame(super::super::frame::IMPORT, &region.descriptor().to_bytes()),
            None,
        )
        .unwrap();
        assert!(raw.read_frame().is_err());
        // The owner's proof binds the connector's challenge: replayed to another challenge
        // (an agent without the key that recorded an answer), it fails the check.
        let (_, first, answer) = challenge(addr);
        let (theirs, tag) = answer.split_at(NONCE);
        assert!(proof(KEY, b"ferry agent owner", &first, theirs)
            .verify_slice(tag)
            .is_ok());
        let other = random_nonce().unwrap();
        assert!(proof(KEY, b"ferry agent owner", &other, theirs)
            .verify_slice(tag)
            .is_err());
    }

    #[test]
    fn keys_are_checked_both_ways() {
        let owner = agent("tcp-keys");
        let addr = owner.listen_tcp("127.0.0.1:0", KEY).unwrap().to_string();
        let me = agent("tcp-keys-peer");
        match me.connect_tcp(&addr, b"another key of sixteen bytes") {
            Err(AgentError::Refused { reason, .. }) => {
                assert!(reason.contains("does not hold this key"), "{reason}")
            }
            r => panic!("a wrong key: {r:?}"),
        }
        assert!(matches!(
            me.connect_tcp(&addr, b"short"),
            Err(AgentError::Unsupported(_))
        ));
        assert!(matches!(
            owner.listen_tcp("127.0.0.1:0", KEY),
            Err(AgentError::Unsupported(_))
        ));
        let peer = me.connect_tcp(&addr, KEY).unwrap();
        assert_eq!(peer.name(), "tcp-keys");
        assert_eq!(peer.pid(), std::process::id());
        assert!(peer.is_alive());
    }

    /// A connection proving the key, as a lane would: its stream.
    fn proved(addr: SocketAddr) -> Stream {
        let me = agent("tcp-lane-raw");
        let s = TcpStream::connect(addr).unwrap();
        prove_as_peer(&me.inner, s, "test", KEY).unwrap()
    }

    /// Lanes join only with the ticket their connection was given, as their first message,
    /// and carry transfers alone; at most [`MAX_LANES`] join one connection; a connector asks
    /// for 1 to 16 streams, and the variable that sets the default is checked.
    #[test]
    fn lanes_join_only_with_their_ticket_and_carry_transfers_alone() {
        use super::super::frame::{HELLO, IMPORT};
        use super::super::lanes::TOKEN;
        let owner = agent("tcp-tickets");
        let addr = owner.listen_tcp("127.0.0.1:0", KEY).unwrap();
        let region = owner.register_host(vec![1u8; 4096]).unwrap();
        // A connection's ticket (asked on it after the handshake, as `open_lanes` does).
        let first = proved(addr);
        let mut hello = 1u32.to_le_bytes().to_vec();
        hello.extend_from_slice(b"raw");
        first.send(&frame(HELLO, &hello), None).unwrap();
        assert_eq!(first.read_frame().unwrap().0, HELLO);
        first.send(&frame(LANES, &[]), None).unwrap();
        let (tag, ticket, _) = first.read_frame().unwrap();
        assert_eq!((tag, ticket.len()), (OK, 8 + TOKEN));
        // A forged ticket: ERR, and the connection closed.
        let mut forged = ticket.clone();
        forged[8] ^= 1;
        let lane = proved(addr);
        lane.send(&frame(LANE, &forged), None).unwrap();
        let (tag, why, _) = lane.read_frame().unwrap();
        assert_eq!(tag, ERR);
        assert!(String::from_utf8_lossy(&why).contains("ticket"));
        assert!(lane.read_frame().is_err());
        // The true one: admitted; a message other than a transfer on it is refused.
        let lane = proved(addr);
        lane.send(&frame(LANE, &ticket), None).unwrap();
        assert_eq!(lane.read_frame().unwrap().0, OK);
        lane.send(&frame(IMPORT, &region.descriptor().to_bytes()), None)
            .unwrap();
        let (tag, why, _) = lane.read_frame().unwrap();
        assert_eq!(tag, ERR);
        assert!(
            String::from_utf8_lossy(&why).contains("on a lane"),
            "{why:?}"
        );
        // LANE after the first message: an unknown message there.
        first.send(&frame(LANE, &ticket), None).unwrap();
        let (tag, why, _) = first.read_frame().unwrap();
        assert_eq!(tag, ERR);
        assert!(String::from_utf8_lossy(&why).contains("unknown message"));
        // One lane is in; MAX_LANES - 1 more join, the next is refused.
        let more: Vec<Stream> = (1..MAX_LANES)
            .map(|_| {
                let l = proved(addr);
                l.send(&frame(LANE, &ticket), None).unwrap();
                assert_eq!(l.read_frame().unwrap().0, OK);
                l
            })
            .collect();
        let over = proved(addr);
        over.send(&frame(LANE, &ticket), None).unwrap();
        assert_eq!(over.read_frame().unwrap().0, ERR);
        drop(more);
        // Streams out of range, and a default that does not parse.
        let me = agent("tcp-tickets-peer");
        for n in [0, MAX_LANES + 2] {
            match me.connect_tcp_streams(&addr.to_string(), KEY, n) {
                Err(AgentError::Unsupported(why)) => assert!(why.contains("streams"), "{why}"),
                r => panic!("{n} streams: {r:?}"),
            }
        }
        let set = |v: &'static str| move |var: &str| (var == STREAMS_VAR).then(|| v.to_string());
        assert_eq!(default_streams(&set("4x")).unwrap_err().var, STREAMS_VAR);
        assert_eq!(default_streams(&set(" 8 ")), Ok(8));
        assert_eq!(default_streams(&|_| None), Ok(DEFAULT_STREAMS));
    }

    /// A name is resolved (`localhost`), and one that does not resolve fails within the
    /// agent's timeout, whether the resolver says so at once or never answers.
    #[test]
    fn names_resolve_within_the_timeout() {
        let owner = agent("tcp-names");
        let port = owner.listen_tcp("127.0.0.1:0", KEY).unwrap().port();
        let engine = Arc::new(CpuEngine::new(1).expect("cpu engine"));
        let me = Agent::with_timeout("tcp-names-peer", engine, Duration::from_secs(1)).unwrap();
        let peer = me.connect_tcp(&format!("localhost:{port}"), KEY).unwrap();
        assert_eq!(peer.name(), "tcp-names");
        let t0 = Instant::now();
        match me.connect_tcp("no-such-host.invalid:1", KEY) {
            Err(AgentError::Io { what, .. }) => assert!(what.contains("resolve"), "{what}"),
            r => panic!("an unknown name: {r:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        assert!(matches!(
            me.connect_tcp("no port here", KEY),
            Err(AgentError::Io { .. })
        ));
    }
}
