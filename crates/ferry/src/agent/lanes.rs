//! Lanes: the further TCP connections of a peer connection (`tcp.rs` opens them,
//! `tcp_bytes.rs` cuts large transfers across them). The caller's side of each is a [`Lane`];
//! the owner's is its [`Tickets`]: the ticket a connection asks for (LANES) and presents on
//! each lane as its first message (LANE), and the lanes that joined with it, closed when it
//! closes.

use super::frame::Stream;
use super::{lock, sys, CopyJob};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{mpsc, Mutex};

/// The most lanes one connection may have (each a thread on both sides).
pub(super) const MAX_LANES: usize = 15;
/// A ticket's secret part, in bytes (the connection's number comes before it).
pub(super) const TOKEN: usize = 16;

/// A lane of a connection, the caller's side: its stream and the thread that runs its parts
/// of transfers.
pub(super) struct Lane {
    pub(super) stream: Mutex<Stream>,
    pub(super) worker: Mutex<Option<mpsc::Sender<CopyJob>>>,
}

impl Lane {
    /// A lane on `stream` (the key proved, the ticket accepted), its thread not yet started.
    pub(super) fn new(stream: Stream) -> Lane {
        Lane {
            stream: Mutex::new(stream),
            worker: Mutex::new(None),
        }
    }
}

/// The owner's tickets, by connection number: each connection's token and the lanes (their
/// connection numbers) that presented it.
#[derive(Default)]
pub(super) struct Tickets(Mutex<HashMap<u64, Ticket>>);

struct Ticket {
    token: [u8; TOKEN],
    lanes: Vec<u64>,
}

impl Tickets {
    /// The ticket connection `conn` hands its lanes (LANES' answer: its number and a random
    /// token), made at its first asking; why not where the token cannot be drawn.
    pub(super) fn issue(&self, conn: u64) -> Result<Vec<u8>, String> {
        let mut all = lock(&self.0);
        let t = match all.entry(conn) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => {
                let mut token = [0u8; TOKEN];
                sys::random(&mut token).map_err(|e| format!("getrandom: {e}"))?;
                v.insert(Ticket {
                    token,
                    lanes: Vec::new(),
                })
            }
        };
        let mut body = conn.to_le_bytes().to_vec();
        body.extend_from_slice(&t.token);
        Ok(body)
    }

    /// Connection `lane` presents `body` as a ticket: the connection it joins, or `None` (no
    /// such ticket, or that connection has its [`MAX_LANES`]).
    pub(super) fn redeem(&self, lane: u64, body: &[u8]) -> Option<u64> {
        let conn = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
        let token = body.get(8..).filter(|t| t.len() == TOKEN)?;
        let mut all = lock(&self.0);
        let t = all.get_mut(&conn)?;
        // Compared in constant time (the ticket is no secret from the key's holders, whose
        // proof every lane has made; still, nothing of it leaks through the time taken).
        let differ = t.token.iter().zip(token).fold(0, |d, (x, y)| d | (x ^ y));
        if differ != 0 || t.lanes.len() >= MAX_LANES {
            return None;
        }
        t.lanes.push(lane);
        Some(conn)
    }

    /// Connection `conn` has closed: its ticket is void (a lane of another is struck from its
    /// list). Its lanes, for the caller to close.
    pub(super) fn forget(&self, conn: u64) -> Vec<u64> {
        let mut all = lock(&self.0);
        for t in all.values_mut() {
            t.lanes.retain(|&x| x != conn);
        }
        all.remove(&conn).map(|t| t.lanes).unwrap_or_default()
    }

    /// The number of lanes of each connection that asked for a ticket.
    #[cfg(test)]
    pub(super) fn lanes_per_connection(&self) -> Vec<usize> {
        lock(&self.0).values().map(|t| t.lanes.len()).collect()
    }
}
