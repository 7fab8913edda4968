//! The agents' frames and the connection they travel on: a frame is its length (u32,
//! little-endian, tag included), a tag byte and the payload; a [`Stream`] is a Unix socket (one
//! host: a file descriptor may travel with a frame) or TCP (between hosts: none does). Every
//! tag of the protocol is here, the messages' meaning with their users: `wire.rs` (handshake,
//! imports, releases, notifications), `tcp.rs` (the key's proof, lanes), `tcp_bytes.rs` (transfers
//! carrying their bytes).

use super::sys;
use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The handshake of this protocol (the second: the reply carries the owner's life word).
pub(super) const HELLO: u8 = 6;
/// The first protocol's handshake (an older ferry), refused with the reason.
pub(super) const HELLO_V1: u8 = 1;
pub(super) const IMPORT: u8 = 2;
pub(super) const RELEASE: u8 = 3;
pub(super) const NOTIFY: u8 = 4;
/// A transfer over TCP: a region, then its segments in the owner's region (offset, length),
/// then (a write) the bytes.
pub(super) const WRITE: u8 = 7;
/// As WRITE, the bytes coming back after the owner's OK.
pub(super) const READ: u8 = 8;
/// The key's challenges and proofs over TCP, before the handshake.
pub(super) const AUTH: u8 = 9;
/// Over TCP, after the handshake: the connector asks for the ticket its further connections
/// (lanes, carrying parts of large transfers) present; answered OK with it.
pub(super) const LANES: u8 = 10;
/// The first frame of a lane, after the key's proof: the ticket; answered OK (the connection
/// then carries WRITE and READ for the connection that asked for the ticket) or ERR.
pub(super) const LANE: u8 = 11;
pub(super) const OK: u8 = 0x80;
pub(super) const ERR: u8 = 0x81;
/// The largest frame accepted (a notification's message included).
pub(super) const MAX_FRAME: usize = 16 << 20;

pub(super) fn frame(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(5 + payload.len());
    f.extend_from_slice(&(payload.len() as u32 + 1).to_le_bytes());
    f.push(tag);
    f.extend_from_slice(payload);
    f
}

/// A connection between two agents: a Unix socket (one host: descriptors travel with the
/// frames) or TCP (`tcp.rs`: none do, and transfers carry their bytes in the stream).
pub(super) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    /// Sends one frame, with `fd` attached on a Unix socket (none goes over TCP).
    pub(super) fn send(&self, f: &[u8], fd: Option<RawFd>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => sys::send_with_fd(s, f, fd),
            Stream::Tcp(s) => (&*s).write_all(f),
        }
    }

    /// Reads exactly `buf.len()` bytes, and a descriptor if one came with them.
    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<OwnedFd>> {
        match self {
            Stream::Unix(s) => sys::recv_with_fd(s, buf),
            Stream::Tcp(s) => io::Read::read_exact(&mut &*s, buf).map(|()| None),
        }
    }

    /// Reads one frame: its tag, payload and any descriptor attached.
    pub(super) fn read_frame(&self) -> io::Result<(u8, Vec<u8>, Option<OwnedFd>)> {
        let mut head = [0u8; 4];
        let fd = self.recv(&mut head)?;
        self.read_body(head, fd)
    }

    fn read_body(
        &self,
        head: [u8; 4],
        fd: Option<OwnedFd>,
    ) -> io::Result<(u8, Vec<u8>, Option<OwnedFd>)> {
        let n = u32::from_le_bytes(head) as usize;
        if n == 0 || n > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a frame of {n} bytes"),
            ));
        }
        let mut body = vec![0u8; n];
        let fd2 = self.recv(&mut body)?;
        let tag = body.remove(0);
        Ok((tag, body, fd.or(fd2)))
    }

    /// The owner's wait for a peer's next frame: without a limit (an idle peer), the rest of
    /// the frame and a transfer's bytes within the agent's timeout over TCP (the socket's read
    /// timeout, set once: a peer that stalls inside a transfer breaks the connection rather
    /// than holding this thread).
    pub(super) fn next_frame(&self) -> io::Result<(u8, Vec<u8>, Option<OwnedFd>)> {
        let Stream::Tcp(s) = self else {
            return self.read_frame();
        };
        let (mut head, mut got) = ([0u8; 4], 0);
        while got < head.len() {
            match io::Read::read(&mut &*s, &mut head[got..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if got == 0
                        && matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) => {}
                Err(e) => return Err(e),
            }
        }
        self.read_body(head, None)
    }

    pub(super) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    pub(super) fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }
}
