//! Pinned bounce slots for GPU pipeline sources the copy engine cannot read directly
//! (pageable host memory, whole or strided, and files).
//!
//! Sent through the engine one chunk at a time, such a source paid the staged path's fill and
//! drain on every chunk: on the H200 host 4-8 MiB pageable chunks moved at about 17 GB/s, and
//! file chunks at about 18 GB/s (run 31: 0.28-0.40x the pinned-source pipeline), where the
//! staged path reaches 46-51 GB/s only on 256 MiB-1 GiB requests. So the pipeline keeps K + 1
//! pinned host buffers of a chunk: host threads fill chunk `i`'s buffer (pageable: a parallel
//! copy on [`FILL_THREADS`] CPU workers; file: the file engine's parallel reads straight into
//! it) while the chunks before it are DMAed, and the upload is then a plain pinned DMA.
//!
//! A buffer is refilled only after the DMA that read it completed: [`BounceRing::take`] hands
//! out chunk `i`'s buffer only after waiting for the request [`BounceRing::lend`] recorded for
//! chunk `i - B` (B buffers), and nothing else reaches the buffers.

use crate::request::{Request, RequestError};

/// CPU threads that fill a bounce buffer from pageable memory. One core copies 8-12 GB/s
/// from cached pageable memory into pinned memory; the DMA reads about 53 GB/s (H200 host,
/// PCIe gen5), so 8 threads (half the GPU host's 16 cores) keep ahead of it with room left
/// for the submitting thread and the file engine's readers.
pub(super) const FILL_THREADS: usize = 8;

/// Smallest piece of a fill one CPU worker copies: 4 MiB chunks (the bench's smallest) split
/// across all [`FILL_THREADS`] workers.
pub(super) const FILL_PIECE: usize = 512 << 10;

/// B buffers (`S`: a pinned buffer on the GPU, anything in the CPU tests) lent in turn to
/// chunk `i % B`, each back only once the request that last read it completed.
pub(super) struct BounceRing<S> {
    slots: Vec<S>,
    busy: Vec<Option<Request>>,
}

impl<S> BounceRing<S> {
    /// A ring of `slots` (at least one).
    pub(super) fn new(slots: Vec<S>) -> BounceRing<S> {
        let busy = slots.iter().map(|_| None).collect();
        BounceRing { slots, busy }
    }

    /// Chunk `index`'s buffer, once the last reader of it (the request lent with chunk
    /// `index - B`) has completed, waited for with `wait`. The reader's error is returned (the
    /// buffer stays lent: a later take waits for nothing more and fails no more).
    pub(super) fn take(
        &mut self,
        index: usize,
        wait: &mut impl FnMut(Request) -> Result<(), RequestError>,
    ) -> Result<&mut S, RequestError> {
        let b = index % self.slots.len();
        if let Some(r) = self.busy[b].take() {
            wait(r)?;
        }
        Ok(&mut self.slots[b])
    }

    /// Marks chunk `index`'s buffer as read by `req` until it completes.
    pub(super) fn lend(&mut self, index: usize, req: &Request) {
        let b = index % self.slots.len();
        self.busy[b] = Some(req.share());
    }

    /// The buffers themselves.
    pub(super) fn slots(&self) -> &[S] {
        &self.slots
    }

    /// Forgets every lend: call only once every lent request has completed (a new run).
    pub(super) fn forget(&mut self) {
        self.busy.iter_mut().for_each(|b| *b = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Signal;
    use std::sync::Arc;

    #[test]
    fn a_buffer_comes_back_only_after_its_reader_completed() {
        let mut ring = BounceRing::new(vec![0u8, 1, 2]);
        let readers: Vec<Arc<Signal>> = (0..8).map(|_| Arc::new(Signal::new())).collect();
        let mut waited = Vec::new();
        for i in 0..8 {
            let mut wait = |r: Request| {
                waited.push(i);
                assert!(
                    r.is_done(),
                    "chunk {i}: its buffer's reader is still running"
                );
                r.wait()
            };
            // The reader of chunk i - 3 completes just before chunk i needs its buffer.
            if i >= 3 {
                readers[i - 3].complete(Ok(()));
            }
            let b = *ring.take(i, &mut wait).unwrap();
            assert_eq!(usize::from(b), i % 3, "chunk {i} got buffer {b}");
            ring.lend(i, &Request::new(Arc::clone(&readers[i])));
        }
        assert_eq!(waited, vec![3, 4, 5, 6, 7]);
        assert_eq!(ring.slots(), &[0, 1, 2]);
    }

    #[test]
    fn a_failed_reader_fails_the_next_take_once() {
        let mut ring = BounceRing::new(vec![(); 2]);
        let mut wait = |r: Request| r.wait();
        ring.take(0, &mut wait).unwrap();
        let e = RequestError::Operator {
            op: "dma".into(),
            msg: "failed".into(),
        };
        ring.lend(0, &Request::ready(Err(e)));
        ring.take(1, &mut wait).unwrap();
        assert!(ring.take(2, &mut wait).is_err());
        assert!(ring.take(2, &mut wait).is_ok());
    }
}
