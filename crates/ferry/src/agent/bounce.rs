//! The host memory device memory crosses on its way to or from a TCP socket (`tcp_bytes.rs`):
//! bounce buffers of [`STAGE`] bytes, pinned where the driver gives them (the copy engines
//! reach them directly, without the engine's own staging), pageable otherwise (no driver: the
//! tests' stand-in engines). A staged transfer borrows two as a ring of the staging subsystem
//! (`staging/ring.rs`): the copy of one stage runs while the other's bytes cross the socket.
//! They go back to a free list for the process's next transfer (at most [`KEPT`] kept, 32 MiB
//! of pinned memory held by the process from its first staged transfer on; two more in use
//! per staged transfer running beyond that), as the file engine's bounce slots do: many
//! connections' threads take them at once, in no order.

use super::lock;
use crate::cuda::PinnedBuffer;
use crate::memory::{MemKind, RawBuf};
use crate::request::Request;
use crate::staging::ring::Ring;
use std::sync::Mutex;

/// A stage's bytes: device memory crosses host memory in pieces of this many bytes.
pub(super) const STAGE: usize = 2 << 20;
/// Buffers a staged transfer borrows (one filled or drained by the engine while the other's
/// bytes cross the socket).
const DEPTH: usize = 2;
/// The most buffers kept between transfers (pinned memory held by the process: 32 MiB).
const KEPT: usize = 16;

/// One bounce buffer of [`STAGE`] bytes.
pub(super) enum Bounce {
    Pinned(PinnedBuffer),
    Pageable(Box<[u8]>),
}

impl Bounce {
    fn new() -> Bounce {
        match PinnedBuffer::new(STAGE) {
            Ok(p) => Bounce::Pinned(p),
            Err(_) => Bounce::Pageable(vec![0u8; STAGE].into_boxed_slice()),
        }
    }

    /// Its first `n` bytes.
    pub(super) fn bytes(&mut self, n: usize) -> &mut [u8] {
        match self {
            Bounce::Pinned(p) => &mut p[..n],
            Bounce::Pageable(b) => &mut b[..n],
        }
    }

    /// Its first `n` bytes as the engine takes them (valid while the buffer lives).
    pub(super) fn raw(&mut self, n: usize) -> RawBuf {
        let kind = match self {
            Bounce::Pinned(_) => MemKind::Pinned,
            Bounce::Pageable(_) => MemKind::Pageable,
        };
        RawBuf::host(self.bytes(n).as_mut_ptr(), n, kind)
    }
}

/// The free list.
static FREE: Mutex<Vec<Bounce>> = Mutex::new(Vec::new());

/// Runs `f` (a staged transfer) with a ring of bounce buffers, then waits for every copy on
/// them (whatever `f` returned: a socket error leaves a copy running) and gives them back.
/// Where `f` unwinds (an engine's wait may panic), the buffers are leaked instead: a copy on
/// them may still run, and its request may be gone with the panic.
pub(super) fn staged<R>(f: impl FnOnce(&mut Ring<Bounce, Option<Request>>) -> R) -> R {
    let mut lent = Lent(Some(ring()));
    f(lent.0.as_mut().expect("lent until dropped"))
}

/// A ring lent to a staged transfer: given back on drop, or leaked while unwinding.
struct Lent(Option<Ring<Bounce, Option<Request>>>);

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(ring) = self.0.take() {
            match std::thread::panicking() {
                true => std::mem::forget(ring),
                false => give_back(ring),
            }
        }
    }
}

/// A staged transfer's ring of bounce buffers: two from the free list, or new.
fn ring() -> Ring<Bounce, Option<Request>> {
    let taken: Vec<Option<Bounce>> = {
        let mut free = lock(&FREE);
        (0..DEPTH).map(|_| free.pop()).collect()
    };
    // New ones made outside the lock (a pinned allocation takes a millisecond or more).
    let slots = taken
        .into_iter()
        .map(|b| b.unwrap_or_else(Bounce::new))
        .collect();
    Ring::new(slots, (0..DEPTH).map(|_| None).collect())
}

/// Waits for every copy on the ring's buffers (their errors were the transfer's to report),
/// then gives them back to the free list.
/// Pinned buffers alone are kept: a pageable one (no driver, or the driver refused to pin)
/// is freed, so that the next transfer asks for pinned memory again.
fn give_back(mut ring: Ring<Bounce, Option<Request>>) {
    // An engine's wait that panics here would free the buffers under the other slot's copy
    // as the ring unwound: leaked instead, the panic passed on.
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(ring.wait_all())));
    if let Err(panic) = waited {
        std::mem::forget(ring);
        std::panic::resume_unwind(panic);
    }
    // A copy whose wait failed has ended too (an `Option<Request>` is free after its error).
    match ring.into_slots() {
        Ok(slots) => {
            let mut free = lock(&FREE);
            for b in slots {
                if matches!(b, Bounce::Pinned(_)) && free.len() < KEPT {
                    free.push(b);
                }
            }
        }
        // Never after `wait_all`; were a copy still to run, its buffer must outlive it.
        Err(ring) => std::mem::forget(ring),
    }
}
