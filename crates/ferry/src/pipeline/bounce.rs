//! Pinned bounce slots for GPU pipeline sources the copy engine cannot read directly
//! (pageable host memory, whole or strided, and files).
//!
//! Sent through the engine one chunk at a time, such a source paid the staged path's fill and
//! drain on every chunk: on the H200 host 4-8 MiB pageable chunks moved at about 17 GB/s, and
//! file chunks at about 18 GB/s (run 31: 0.28-0.40x the pinned-source pipeline), where the
//! staged path reaches 46-51 GB/s only on 256 MiB-1 GiB requests. So the pipeline keeps K + 2
//! pinned host buffers of a chunk: host threads fill chunk `i + 1`'s buffer (pageable: the
//! staged path's workers and copy, queued to them (`engine/cuda/staged/fill.rs`), a strided
//! chunk on [`FILL_THREADS`] CPU workers; file: the file engine's parallel reads straight into
//! it) while chunk `i`'s DMA and the steps before it run, started as soon as
//! chunk `i`'s upload is enqueued and waited for only before chunk `i + 1`'s; the upload is
//! then a plain pinned DMA. (Run 32, filled on the submitting thread before each upload: 0.40-0.51x.)
//!
//! A buffer is refilled only after the DMA that read it completed: [`BounceRing::take`] hands
//! out chunk `i`'s buffer only after waiting for the request [`BounceRing::lend`] recorded for
//! chunk `i - B` (B buffers) and any fill still writing it, [`BounceRing::ready`] hands it to
//! the DMA only after waiting for chunk `i`'s fill, and nothing else reaches the buffers.

use crate::request::{Request, RequestError};

/// CPU threads that fill a bounce buffer from a strided pageable source (contiguous chunks go
/// to the staging workers). One core copies 8-12 GB/s from cached pageable memory into pinned
/// memory; the DMA reads about 53 GB/s (H200 host, PCIe gen5), so 8 threads (half the GPU
/// host's 16 cores) leave room for the submitting thread and the file engine's readers.
pub(super) const FILL_THREADS: usize = 8;

/// Smallest piece of a fill one CPU worker copies: 4 MiB chunks (the bench's smallest) split
/// across all [`FILL_THREADS`] workers.
pub(super) const FILL_PIECE: usize = 512 << 10;

/// B buffers (`S`: a pinned buffer on the GPU, anything in the CPU tests) lent in turn to
/// chunk `i % B`: filled for chunk `i` ([`BounceRing::take`], then [`BounceRing::filling`]),
/// read by chunk `i`'s DMA only once that fill completed ([`BounceRing::ready`]), and taken for
/// chunk `i + B` only once that DMA ([`BounceRing::lend`]) and the fill have completed.
pub(super) struct BounceRing<S> {
    slots: Vec<S>,
    busy: Vec<Option<Request>>,
    /// Per buffer: the chunk being filled into it, and the fill.
    fills: Vec<Option<(usize, Request)>>,
}

impl<S> BounceRing<S> {
    /// A ring of `slots` (at least one).
    pub(super) fn new(slots: Vec<S>) -> BounceRing<S> {
        let busy = slots.iter().map(|_| None).collect();
        let fills = slots.iter().map(|_| None).collect();
        BounceRing { slots, busy, fills }
    }

    /// Chunk `index`'s buffer to fill, once the last reader of it (the request lent with chunk
    /// `index - B`) and any fill still writing it have completed, waited for with `wait`. The
    /// reader's error is returned (the buffer stays lent: a later take waits for nothing more
    /// and fails no more).
    pub(super) fn take(
        &mut self,
        index: usize,
        wait: &mut impl FnMut(Request) -> Result<(), RequestError>,
    ) -> Result<&mut S, RequestError> {
        let b = index % self.slots.len();
        if let Some((_, f)) = self.fills[b].take() {
            // A fill never read (the run stopped before its DMA): its outcome is moot.
            let _ = wait(f);
        }
        if let Some(r) = self.busy[b].take() {
            wait(r)?;
        }
        Ok(&mut self.slots[b])
    }

    /// Records `fill` as writing chunk `index`'s buffer (just taken).
    pub(super) fn filling(&mut self, index: usize, fill: Request) {
        let b = index % self.slots.len();
        self.fills[b] = Some((index, fill));
    }

    /// Whether chunk `index`'s fill has been started (and not yet waited for by `ready`).
    pub(super) fn is_filling(&self, index: usize) -> bool {
        let b = index % self.slots.len();
        self.fills[b].as_ref().is_some_and(|(i, _)| *i == index)
    }

    /// Whether [`BounceRing::take`] of chunk `index` would wait for nothing: its buffer's last
    /// reader has completed (or there is none) and no fill is writing it. Never blocks.
    pub(super) fn is_free(&self, index: usize) -> bool {
        let b = index % self.slots.len();
        self.fills[b].is_none() && self.busy[b].as_ref().is_none_or(Request::is_done)
    }

    /// Chunk `index`'s buffer to read, once its fill has completed (waited for with `wait`);
    /// `Ok(None)` when no fill of chunk `index` was started. The fill's error is returned.
    pub(super) fn ready(
        &mut self,
        index: usize,
        wait: &mut impl FnMut(Request) -> Result<(), RequestError>,
    ) -> Result<Option<&S>, RequestError> {
        if !self.is_filling(index) {
            return Ok(None);
        }
        let b = index % self.slots.len();
        if let Some((_, f)) = self.fills[b].take() {
            wait(f)?;
        }
        Ok(Some(&self.slots[b]))
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

    /// Waits for every fill still in flight (their outcome is moot: nothing reads them). A run
    /// calls it before it returns, also on failure: a fill reads the run's borrowed source.
    pub(super) fn settle(&mut self, wait: &mut impl FnMut(Request) -> Result<(), RequestError>) {
        for f in self.fills.iter_mut().filter_map(Option::take) {
            let _ = wait(f.1);
        }
    }

    /// Forgets every lend: call only once every lent request has completed (a new run).
    pub(super) fn forget(&mut self) {
        self.busy.iter_mut().for_each(|b| *b = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{Completion, Signal};
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

    /// The GPU pipeline's order (`cuda.rs`, `upload_bounced`) with K = 2 device slots and
    /// K + 2 buffers: chunk `i + 1`'s fill starts right after chunk `i`'s DMA is enqueued,
    /// while the DMAs of chunks `i - K..=i` are still in flight, and never into a buffer one
    /// of them reads.
    #[test]
    fn fills_run_one_chunk_ahead_never_into_a_buffer_a_dma_reads() {
        const K: usize = 2;
        const N: usize = 10;
        let mut ring = BounceRing::new((0..K + 2).collect::<Vec<usize>>());
        let dmas: Vec<Arc<Signal>> = (0..N).map(|_| Arc::new(Signal::new())).collect();
        let fills: Vec<Arc<Signal>> = (0..N).map(|_| Arc::new(Signal::new())).collect();
        let mut log = Vec::new();
        fn wait(r: Request) -> Result<(), RequestError> {
            assert!(r.is_done(), "a wait would block on a request still running");
            r.wait()
        }
        let prefetch = |ring: &mut BounceRing<usize>, j: usize, log: &mut Vec<String>| {
            let b = *ring.take(j, &mut wait).unwrap();
            // DMAs of chunks j - B + 1 .. j - 1 may still run: none of them reads buffer b.
            let from = j.saturating_sub(K + 1);
            for (d, dma) in dmas.iter().enumerate().take(j).skip(from) {
                if dma.poll_done().is_none() {
                    assert_ne!(d % (K + 2), b, "fill {j} into buffer {b} read by DMA {d}");
                }
            }
            log.push(format!("fill {j}>{b}"));
            ring.filling(j, Request::new(Arc::clone(&fills[j])));
        };
        for i in 0..N {
            // The GPU is K + 1 chunks behind: DMAs before chunk i - K have completed.
            for d in dmas.iter().take(i.saturating_sub(K)) {
                if d.poll_done().is_none() {
                    d.complete(Ok(()));
                }
            }
            if !ring.is_filling(i) {
                prefetch(&mut ring, i, &mut log);
            }
            // The workers finish chunk i's fill while the submitting thread enqueues others.
            fills[i].complete(Ok(()));
            let b = *ring
                .ready(i, &mut wait)
                .unwrap()
                .expect("chunk i was filled");
            assert_eq!(b, i % (K + 2));
            log.push(format!("dma {i}<{b}"));
            ring.lend(i, &Request::new(Arc::clone(&dmas[i])));
            if i + 1 < N {
                prefetch(&mut ring, i + 1, &mut log);
            }
        }
        let mut want = vec!["fill 0>0".to_string()];
        for i in 0..N {
            want.push(format!("dma {i}<{}", i % (K + 2)));
            if i + 1 < N {
                want.push(format!("fill {}>{}", i + 1, (i + 1) % (K + 2)));
            }
        }
        assert_eq!(log, want);
        ring.settle(&mut |r| r.wait());
        assert!(!ring.is_filling(N - 1));
    }

    #[test]
    fn a_fill_never_read_is_waited_for_by_settle_and_a_failed_fill_fails_ready() {
        let mut ring = BounceRing::new(vec![(); 3]);
        let mut wait = |r: Request| r.wait();
        ring.take(0, &mut wait).unwrap();
        let e = RequestError::Operator {
            op: "fill".into(),
            msg: "failed".into(),
        };
        ring.filling(0, Request::ready(Err(e)));
        assert!(ring.ready(0, &mut wait).is_err());
        assert!(ring.ready(1, &mut wait).unwrap().is_none());
        let pending = Arc::new(Signal::new());
        ring.take(1, &mut wait).unwrap();
        ring.filling(1, Request::new(Arc::clone(&pending)));
        assert!(!ring.is_free(1), "a buffer being filled is not free");
        assert!(!ring.is_free(4), "chunk 4 shares chunk 1's buffer");
        assert!(ring.is_free(2));
        let reader = Arc::new(Signal::new());
        ring.take(2, &mut wait).unwrap();
        ring.lend(2, &Request::new(Arc::clone(&reader)));
        assert!(!ring.is_free(5), "chunk 2's DMA still reads the buffer");
        reader.complete(Ok(()));
        assert!(ring.is_free(5));
        pending.complete(Ok(()));
        let mut waited = 0;
        ring.settle(&mut |r| {
            waited += 1;
            r.wait()
        });
        assert_eq!(waited, 1);
        assert!(!ring.is_filling(1));
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
