//! The ring of staging slots: host buffers lent in turn to the chunks of a transfer, chunk `i`
//! to slot `i % depth`, each slot reused only once what last read or filled it has completed.
//!
//! One type for every user, generic over what completes a slot ([`SlotDone`]):
//! - the staged copy's pinned slots (`engine/cuda/paths/staged/ring.rs`): an event recorded
//!   after the slot's DMA, polled by the coordinator and waited for at the end of the copy;
//! - the GPU pipeline's bounce buffers (`pipeline/bounce.rs`): the request of the DMA that
//!   reads the buffer ([`Option<Request>`]), beside the fill that writes it;
//! - the transfer agent's bounce buffers for device memory over TCP (`agent/bounce.rs`): the
//!   request of the engine's copy into or out of the buffer, beside the socket.
//!
//! The file engine's bounce slots (`file/ring.rs`) are a free list instead, on purpose: many
//! runner threads take slots at once, in no order, each holding one only for its own blocking
//! read or write, so a slot completes when its runner hands it back, and a ring in chunk order
//! would make a runner wait for a slot another runner holds while others are free.
//!
//! The ring owns no memory kind: its users hand the slots in (pinned memory is allocated at the
//! CUDA bottom, `engine/cuda/sys/memory.rs`, or by the pipeline's `PinnedBuffer`), so nothing
//! here imports the CUDA engine.

use crate::request::{Request, RequestError};

/// What completes a slot of a [`Ring`]: the work that last read or filled it, pending until it
/// has ended. The ring hands a slot out again only once this is not pending.
pub(crate) trait SlotDone {
    /// Why the completion could not be polled or waited for.
    type Error;
    /// Whether work on the slot may still run (never blocks, never fails).
    fn is_pending(&self) -> bool;
    /// Whether the work has ended, without waiting; `Ok(true)` leaves it not pending. On an
    /// error the slot stays pending.
    fn poll(&mut self) -> Result<bool, Self::Error>;
    /// Waits for the work; `Ok` leaves it not pending. On an error the slot stays pending
    /// unless the implementation says otherwise.
    fn wait(&mut self) -> Result<(), Self::Error>;
    /// The work is known to have ended by other means (the stream or context was synchronized,
    /// a new run after every lent request completed).
    fn forget(&mut self);
}

/// The request of the work that last read (or filled) a slot: pending until it completes. A
/// failed request is reported once by [`SlotDone::wait`] and the slot is free after it (the
/// work has ended, with its error).
impl SlotDone for Option<Request> {
    type Error = RequestError;
    fn is_pending(&self) -> bool {
        self.as_ref().is_some_and(|r| !r.is_done())
    }
    fn poll(&mut self) -> Result<bool, RequestError> {
        match self.as_ref().map(Request::is_done) {
            None => Ok(true),
            Some(false) => Ok(false),
            Some(true) => self.take().map_or(Ok(()), Request::wait).map(|()| true),
        }
    }
    fn wait(&mut self) -> Result<(), RequestError> {
        self.take().map_or(Ok(()), Request::wait)
    }
    fn forget(&mut self) {
        *self = None;
    }
}

/// `depth` slots (`S`: the memory, `D`: what completes each) lent in turn to chunk `i % depth`.
pub(crate) struct Ring<S, D> {
    slots: Vec<S>,
    done: Vec<D>,
}

impl<S, D: SlotDone> Ring<S, D> {
    /// A ring of `slots`, slot `b` completed by `done[b]` (the same count; at least one slot
    /// for any chunk to be lent one).
    pub(crate) fn new(slots: Vec<S>, done: Vec<D>) -> Ring<S, D> {
        debug_assert_eq!(slots.len(), done.len());
        Ring { slots, done }
    }

    /// Slots in the ring.
    pub(crate) fn depth(&self) -> usize {
        self.slots.len()
    }

    /// The slot chunk `index` is lent.
    pub(crate) fn slot_of(&self, index: usize) -> usize {
        index % self.slots.len().max(1)
    }

    /// The slots themselves.
    pub(crate) fn slots(&self) -> &[S] {
        &self.slots
    }

    /// Slot `b`'s memory.
    pub(crate) fn slot_mut(&mut self, b: usize) -> &mut S {
        &mut self.slots[b]
    }

    /// What completes slot `b` (to record new work on it, or to wait for it another way).
    pub(crate) fn done_mut(&mut self, b: usize) -> &mut D {
        &mut self.done[b]
    }

    /// Whether slot `b` is free: nothing that read or filled it may still run. Never blocks.
    pub(crate) fn is_free(&self, b: usize) -> bool {
        !self.done[b].is_pending()
    }

    /// Whether any slot's work may still run.
    pub(crate) fn any_pending(&self) -> bool {
        self.done.iter().any(SlotDone::is_pending)
    }

    /// Whether slot `b`'s work has ended, without waiting.
    pub(crate) fn poll(&mut self, b: usize) -> Result<bool, D::Error> {
        self.done[b].poll()
    }

    /// Waits for every slot's work (each one, also after a failure); returns the first error.
    pub(crate) fn wait_all(&mut self) -> Result<(), D::Error> {
        let mut first = Ok(());
        for d in &mut self.done {
            if let Err(e) = d.wait() {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Every slot's work is known to have ended by other means.
    pub(crate) fn forget_all(&mut self) {
        self.done.iter_mut().for_each(SlotDone::forget);
    }

    /// The slots, once no work on them may still run (after [`Ring::wait_all`]); the ring
    /// itself back where some may.
    pub(crate) fn into_slots(self) -> Result<Vec<S>, Self> {
        match self.any_pending() {
            true => Err(self),
            false => Ok(self.slots),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Signal;
    use std::sync::Arc;

    /// A completion that fails its first `fails` polls and waits, staying pending meanwhile
    /// (the staged ring's events), then ends.
    struct Flaky {
        pending: bool,
        fails: usize,
    }

    impl SlotDone for Flaky {
        type Error = &'static str;
        fn is_pending(&self) -> bool {
            self.pending
        }
        fn poll(&mut self) -> Result<bool, &'static str> {
            self.wait().map(|()| true)
        }
        fn wait(&mut self) -> Result<(), &'static str> {
            if !self.pending {
                return Ok(());
            }
            if self.fails > 0 {
                self.fails -= 1;
                return Err("not yet");
            }
            self.pending = false;
            Ok(())
        }
        fn forget(&mut self) {
            self.pending = false;
        }
    }

    #[test]
    fn chunks_take_slots_in_turn_and_a_slot_is_free_only_once_its_request_completed() {
        let mut ring: Ring<u8, Option<Request>> = Ring::new(vec![0, 1, 2], vec![None, None, None]);
        assert_eq!(ring.depth(), 3);
        assert_eq!(
            (0..7).map(|i| ring.slot_of(i)).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2, 0]
        );
        let s = Arc::new(Signal::new());
        *ring.done_mut(1) = Some(Request::new(Arc::clone(&s)));
        assert!(!ring.is_free(1) && ring.is_free(0) && ring.any_pending());
        assert_eq!(ring.poll(1), Ok(false));
        s.complete(Ok(()));
        assert!(ring.is_free(1), "a completed request frees its slot");
        assert_eq!(ring.poll(1), Ok(true));
        assert!(!ring.any_pending());
        // A failed reader is reported once; the slot is free after it.
        let e = RequestError::Operator {
            op: "dma".into(),
            msg: "failed".into(),
        };
        *ring.done_mut(2) = Some(Request::ready(Err(e)));
        assert!(ring.done_mut(2).wait().is_err());
        assert_eq!(ring.done_mut(2).wait(), Ok(()));
        assert_eq!(ring.slots(), &[0, 1, 2]);
    }

    #[test]
    fn a_failed_wait_keeps_the_slot_pending_and_wait_all_waits_for_every_slot() {
        let flaky = |fails| Flaky {
            pending: true,
            fails,
        };
        let mut ring = Ring::new(vec![(); 3], vec![flaky(1), flaky(0), flaky(1)]);
        assert_eq!(ring.poll(0), Err("not yet"));
        assert!(!ring.is_free(0), "a slot whose wait failed is not free");
        // Every slot is waited for, also after a failure; the first error is returned.
        assert_eq!(ring.wait_all(), Err("not yet"));
        assert!(ring.is_free(0) && ring.is_free(1) && !ring.is_free(2));
        assert_eq!(ring.wait_all(), Ok(()));
        assert!(!ring.any_pending());
        *ring.done_mut(1) = flaky(5);
        ring.forget_all();
        assert!(!ring.any_pending());
        *ring.slot_mut(2) = ();
    }
}

/// Loom models of the ring's slot reuse (`scripts/loom.sh`): every interleaving, at most 4
/// preemptions, of a slot's reader (a thread standing for the DMA) completing its request
/// against the ring's owner polling the slot and taking it for the next chunk.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::request::Signal;
    use crate::sync::{model, thread};
    use loom::cell::UnsafeCell;
    use std::sync::Arc;

    /// A slot's memory, read by the reader thread and written by the ring's owner.
    struct Mem(UnsafeCell<u32>);
    // SAFETY: the model's threads touch the cell only in turns the ring's completion orders;
    // loom's cell itself checks that (a data race fails the model).
    unsafe impl Send for Mem {}
    // SAFETY: as above.
    unsafe impl Sync for Mem {}

    /// A ring of one slot lent to chunk 0's reader, which reads the slot on another thread and
    /// then completes its request; the owner polls the slot, then waits for it and writes
    /// chunk 1 into it. The write never races the read (loom's cell reports a data race if the
    /// completion did not order them), the reader sees chunk 0's bytes, and the slot is free
    /// exactly once the request completed.
    #[test]
    fn loom_a_slot_is_refilled_only_after_its_reader_completed() {
        model(|| {
            let slot = Arc::new(Mem(UnsafeCell::new(0u32)));
            let mut ring: Ring<Arc<Mem>, Option<Request>> =
                Ring::new(vec![Arc::clone(&slot)], vec![None]);
            // SAFETY: no other thread has the slot yet.
            ring.slots()[0].0.with_mut(|p| unsafe { *p = 7 });
            let done = Arc::new(Signal::new());
            *ring.done_mut(ring.slot_of(0)) = Some(Request::new(Arc::clone(&done)));
            let reader = {
                let slot = Arc::clone(&slot);
                thread::spawn(move || {
                    // SAFETY: the owner writes the slot only once this request completed.
                    let seen = slot.0.with(|p| unsafe { *p });
                    done.complete(Ok(()));
                    seen
                })
            };
            let b = ring.slot_of(1);
            if ring.poll(b) == Ok(true) {
                assert!(ring.is_free(b));
            }
            assert_eq!(ring.done_mut(b).wait(), Ok(()));
            assert!(ring.is_free(b) && !ring.any_pending());
            // SAFETY: the reader's request completed: it no longer reads the slot.
            ring.slot_mut(b).0.with_mut(|p| unsafe { *p = 8 });
            assert_eq!(reader.join().unwrap(), 7, "the reader saw chunk 1's bytes");
        });
    }
}
