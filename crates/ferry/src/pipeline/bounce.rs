//! Pinned bounce slots for GPU pipeline sources the copy engine cannot read directly
//! (pageable host memory, whole or strided, and files).
//!
//! Sent through the engine one chunk at a time, such a source paid the staged path's fill and drain
//! on every chunk: on the H200 host 4-8 MiB pageable chunks moved at about 17 GB/s, and file chunks
//! at about 18 GB/s (run 31: 0.28-0.40x the pinned-source pipeline), where the staged path reaches
//! 46-51 GB/s only on 256 MiB-1 GiB requests. So the pipeline keeps K + 2 or more
//! (`PipelineConfig::bounce_count`) pinned host buffers of a chunk: host threads fill the buffers
//! of the next chunks (pageable: the fills of `staging/fill.rs` on the process's host copy
//! workers (`staging/workers.rs`, shared with the staged copies), pieces of every
//! queued fill taken in order, by default a multiple of the workers' count of them, the
//! submitting thread copying pieces of a fill it waits for ([`super::BounceFill`]); a strided
//! chunk on a CPU engine's workers; both [`super::PipelineConfig::fill_threads`] threads
//! ([`super::FILL_THREADS`] by default); file: the file
//! engine's parallel reads straight into it) while the DMAs and steps of earlier chunks run, each
//! started as soon as its buffer is free and waited for only before its chunk's upload; the
//! upload is then a plain pinned DMA. (Run 32, filled on the submitting thread before each
//! upload: 0.40-0.51x. Run 33, the next one or two fills started after each upload, each fill
//! handed whole to a fork-join pool, an upload ahead waited for before the computes of earlier
//! chunks were submitted: 0.64-0.89x.)
//!
//! A buffer is refilled only after the DMA that read it completed: [`BounceRing::take`] hands
//! out chunk `i`'s buffer only after waiting for the request [`BounceRing::lend`] recorded for
//! chunk `i - B` (B buffers) and any fill still writing it, [`BounceRing::ready`] hands it to
//! the DMA only after waiting for chunk `i`'s fill, and nothing else reaches the buffers.

use crate::request::{Request, RequestError};
use crate::staging::ring::Ring;

/// B buffers (`S`: a pinned buffer on the GPU, anything in the CPU tests) lent in turn to
/// chunk `i % B`: filled for chunk `i` ([`BounceRing::take`], then [`BounceRing::filling`]),
/// read by chunk `i`'s DMA only once that fill completed ([`BounceRing::ready`]), and taken for
/// chunk `i + B` only once that DMA ([`BounceRing::lend`]) and the fill have completed.
///
/// The staging ring (`staging/ring.rs`) with a request completing each slot (its reader's),
/// and beside it each buffer's fill; the waits go through the caller's `wait` (the pipeline
/// spins a little before it blocks).
pub(super) struct BounceRing<S> {
    ring: Ring<S, Option<Request>>,
    /// Per buffer: the chunk being filled into it, and the fill.
    fills: Vec<Option<(usize, Request)>>,
}

impl<S> BounceRing<S> {
    /// A ring of `slots` (at least one).
    pub(super) fn new(slots: Vec<S>) -> BounceRing<S> {
        let busy = slots.iter().map(|_| None).collect();
        let fills = slots.iter().map(|_| None).collect();
        BounceRing {
            ring: Ring::new(slots, busy),
            fills,
        }
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
        let b = self.ring.slot_of(index);
        if let Some((_, f)) = self.fills[b].take() {
            // A fill never read (the run stopped before its DMA): its outcome is moot.
            let _ = wait(f);
        }
        if let Some(r) = self.ring.done_mut(b).take() {
            wait(r)?;
        }
        Ok(self.ring.slot_mut(b))
    }

    /// Records `fill` as writing chunk `index`'s buffer (just taken).
    pub(super) fn filling(&mut self, index: usize, fill: Request) {
        let b = self.ring.slot_of(index);
        self.fills[b] = Some((index, fill));
    }

    /// Whether chunk `index`'s fill has been started (and not yet waited for by `ready`).
    pub(super) fn is_filling(&self, index: usize) -> bool {
        let b = self.ring.slot_of(index);
        self.fills[b].as_ref().is_some_and(|(i, _)| *i == index)
    }

    /// Whether [`BounceRing::take`] of chunk `index` would wait for nothing: its buffer's last
    /// reader has completed (or there is none) and no fill is writing it. Never blocks.
    pub(super) fn is_free(&self, index: usize) -> bool {
        let b = self.ring.slot_of(index);
        self.fills[b].is_none() && self.ring.is_free(b)
    }

    /// Whether chunk `index`'s fill has been started and has completed (successfully or not):
    /// [`BounceRing::ready`] would not wait. Never blocks.
    pub(super) fn is_filled(&self, index: usize) -> bool {
        let b = self.ring.slot_of(index);
        self.fills[b]
            .as_ref()
            .is_some_and(|(i, f)| *i == index && f.is_done())
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
        let b = self.ring.slot_of(index);
        if let Some((_, f)) = self.fills[b].take() {
            wait(f)?;
        }
        Ok(Some(&self.ring.slots()[b]))
    }

    /// Marks chunk `index`'s buffer as read by `req` until it completes.
    pub(super) fn lend(&mut self, index: usize, req: &Request) {
        let b = self.ring.slot_of(index);
        *self.ring.done_mut(b) = Some(req.share());
    }

    /// The buffers themselves.
    pub(super) fn slots(&self) -> &[S] {
        self.ring.slots()
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
        self.ring.forget_all();
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

    /// The GPU pipeline's order (`cuda.rs`: `top_up`, `upload_ready`, `upload_bounced`) with
    /// K + 2 buffers, the DMAs completing at pseudo-random times: fills start, in chunk order,
    /// as far ahead as the free buffers allow, never into a buffer a DMA still reads or whose
    /// fill was not yet read; an upload finds its fill started (and, here, done) ahead.
    #[test]
    fn fills_start_ahead_into_free_buffers_only() {
        const N: usize = 24;
        for k in 1..=4usize {
            let b = k + 2;
            let mut ring = BounceRing::new((0..b).collect::<Vec<usize>>());
            let dmas: Vec<Arc<Signal>> = (0..N).map(|_| Arc::new(Signal::new())).collect();
            let fills: Vec<Arc<Signal>> = (0..N).map(|_| Arc::new(Signal::new())).collect();
            fn no_wait(r: Request) -> Result<(), RequestError> {
                assert!(
                    r.is_done(),
                    "a fill ahead would wait for a DMA still reading"
                );
                r.wait()
            }
            let mut next_fill = 0;
            let mut most_ahead = 0;
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ k as u64;
            for i in 0..N {
                // top_up: every next chunk whose buffer is free.
                let top_up = |ring: &mut BounceRing<usize>, next_fill: &mut usize| {
                    while *next_fill < N && ring.is_free(*next_fill) {
                        let j = *next_fill;
                        let buf = *ring.take(j, &mut no_wait).unwrap();
                        assert_eq!(buf, j % b);
                        // No DMA still running reads buffer j % b.
                        for (d, dma) in dmas.iter().enumerate().take(j) {
                            if dma.poll_done().is_none() {
                                assert_ne!(d % b, buf, "K={k}: fill {j} into DMA {d}'s buffer");
                            }
                        }
                        ring.filling(j, Request::new(Arc::clone(&fills[j])));
                        *next_fill += 1;
                    }
                };
                top_up(&mut ring, &mut next_fill);
                assert!(
                    ring.is_filling(i),
                    "K={k}: chunk {i}'s fill was not started ahead"
                );
                assert!(!ring.is_filled(i) || fills[i].poll_done().is_some());
                fills[i].complete(Ok(()));
                assert!(ring.is_filled(i));
                let buf = *ring.ready(i, &mut no_wait).unwrap().expect("filled");
                assert!(!ring.is_filled(i), "a fill read is no longer reported");
                assert_eq!(buf, i % b);
                ring.lend(i, &Request::new(Arc::clone(&dmas[i])));
                // The GPU finishes some of the DMAs queued (in order), at least all but K.
                for d in dmas.iter().take(i + 1) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if d.poll_done().is_none() && x % 2 == 0 {
                        d.complete(Ok(()));
                    } else if d.poll_done().is_none() {
                        break;
                    }
                }
                for d in dmas.iter().take((i + 1).saturating_sub(k)) {
                    if d.poll_done().is_none() {
                        d.complete(Ok(()));
                    }
                }
                top_up(&mut ring, &mut next_fill);
                // Chunks i + 1 ..= i + B at most: each fill's buffer free of its last DMA.
                assert!(next_fill <= i + 1 + b);
                most_ahead = most_ahead.max(next_fill - i - 1);
            }
            assert_eq!(next_fill, N);
            assert_eq!(most_ahead, b, "K={k}: fills ran at most {most_ahead} ahead");
            ring.settle(&mut |r| r.wait());
        }
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
