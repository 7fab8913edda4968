//! The hand-off of a staged copy's ring slots between its host workers and its coordinator,
//! apart from CUDA (the driver side is a [`Dma`]), so that the loom models below explore the
//! very protocol the staged copies run (`pipeline.rs`).
//!
//! Chunk `k` uses slot `k % depth`. The workers take the chunks' parts in order from one counter
//! and wait until the coordinator has opened the part's chunk (`open > k`): host -> device, once
//! the slot's previous DMA has ended; device -> host, once the chunk's own DMA has ended. Each
//! part done raises the slot's count (`Release`); the coordinator sees a chunk whole when the
//! count reaches the parts per chunk (`Acquire`): host -> device it then issues the chunk's DMA
//! out of the slot, device -> host the slot is free for the next DMA into it. Either side stops
//! the other through `stop` (a worker's panic, a coordinator's error or panic): workers then
//! take nothing more and leave their waits, the coordinator returns.

use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The coordinator's device side: the DMA of a chunk between its slot and the device, and
/// whether a slot's last DMA has ended.
pub(super) trait Dma {
    /// Why a DMA could not be issued or polled.
    type Error;
    /// The error a coordinator returns when the copy was stopped (a worker panicked).
    fn stopped() -> Self::Error;
    /// Issues chunk `k`'s DMA between slot `slot` and the device (`h2d`: out of the slot).
    ///
    /// # Safety
    /// Called by [`Handoff`]'s coordinators only where the slot is the DMA's alone until
    /// [`Dma::poll`] has said the DMA ended: host -> device, every part of chunk `k` is in the
    /// slot (seen through an `Acquire` of the workers' `Release`) and no worker writes the slot
    /// until chunk `k + depth` is opened, after that poll; device -> host, every part of the
    /// slot's previous chunk is out of it, and no worker reads it until chunk `k` is opened,
    /// after that poll.
    unsafe fn issue(&mut self, k: usize, slot: usize, h2d: bool) -> Result<(), Self::Error>;
    /// Whether slot `slot`'s last DMA has ended, without waiting.
    fn poll(&mut self, slot: usize) -> Result<bool, Self::Error>;
}

/// What the workers and the coordinator of one staged copy share.
pub(super) struct Handoff {
    /// Chunks in the copy.
    n: usize,
    /// Parts per chunk (one per worker).
    t: usize,
    /// Slots in the ring.
    depth: usize,
    /// The next part a worker takes (`k * t + i`: part `i` of chunk `k`).
    next: AtomicUsize,
    /// Workers may work on chunk `k` once `open > k`: its slot is free (host -> device) or its
    /// DMA is done (device -> host).
    open: AtomicUsize,
    /// Per slot: the parts finished of the slot's current chunk.
    done: Vec<AtomicUsize>,
    /// Set when a worker panicked or the coordinator failed: everyone stops.
    stop: AtomicBool,
}

impl Handoff {
    /// The hand-off of `n` chunks of `t` parts over `depth` slots (at least 1 of each), in
    /// direction `h2d` (host -> device: the first `depth` chunks open at once).
    pub(super) fn new(n: usize, t: usize, depth: usize, h2d: bool) -> Handoff {
        let (t, depth) = (t.max(1), depth.max(1));
        Handoff {
            n,
            t,
            depth,
            next: AtomicUsize::new(0),
            open: AtomicUsize::new(if h2d { depth.min(n) } else { 0 }),
            done: (0..depth).map(|_| AtomicUsize::new(0)).collect(),
            stop: AtomicBool::new(false),
        }
    }

    /// Parts per chunk.
    pub(super) fn parts(&self) -> usize {
        self.t
    }

    /// A worker's next part `(chunk, part)`, once its chunk is open; `None` when every part is
    /// taken or the copy stopped (also while waiting for the chunk).
    pub(super) fn take(&self) -> Option<(usize, usize)> {
        let p = self.next.fetch_add(1, Ordering::Relaxed);
        if p >= self.n * self.t || self.stopped() {
            return None;
        }
        let k = p / self.t;
        let mut spin = Backoff::new();
        while self.open.load(Ordering::Acquire) <= k {
            if self.stopped() {
                return None;
            }
            spin.snooze();
        }
        Some((k, p % self.t))
    }

    /// A worker finished its part of chunk `k`.
    pub(super) fn finished(&self, k: usize) {
        self.done[k % self.depth].fetch_add(1, Ordering::Release);
    }

    /// Stops the copy: workers take nothing more, the coordinator returns.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Whether the copy was stopped.
    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Whether every part of the chunk in `slot` is done; if so, the slot's count starts again
    /// for its next chunk.
    fn take_whole(&self, slot: usize) -> bool {
        if self.done[slot].load(Ordering::Acquire) != self.t {
            return false;
        }
        // No worker touches this slot again until the coordinator opens its next chunk, after
        // this: resetting the count here is safe.
        self.done[slot].store(0, Ordering::Relaxed);
        true
    }

    /// The host -> device coordinator: issues each chunk's DMA as soon as all its parts are in
    /// its slot, and opens chunk `k + depth` to the workers as soon as chunk `k`'s DMA ended.
    /// Stops the workers when it fails (its caller also does if it panics).
    pub(super) fn coordinate_h2d<D: Dma>(&self, dma: &mut D) -> Result<(), D::Error> {
        let r = self.flow_h2d(dma);
        if r.is_err() {
            self.stop();
        }
        r
    }

    fn flow_h2d<D: Dma>(&self, dma: &mut D) -> Result<(), D::Error> {
        let (n, depth) = (self.n, self.depth);
        let (mut issued, mut retired) = (0usize, 0usize);
        let mut spin = Backoff::new();
        while issued < n {
            if self.stopped() {
                return Err(D::stopped());
            }
            let slot = issued % depth;
            if self.take_whole(slot) {
                // SAFETY: every part of chunk `issued` is in (the Acquire above); no worker
                // writes the slot again until chunk `issued + depth` opens, which waits for
                // this DMA's end through `poll` below.
                unsafe { dma.issue(issued, slot, true) }?;
                issued += 1;
                spin = Backoff::new();
            } else if retired < issued && dma.poll(retired % depth)? {
                retired += 1;
                self.open.store((retired + depth).min(n), Ordering::Release);
                spin = Backoff::new();
            } else {
                spin.snooze();
            }
        }
        Ok(())
    }

    /// The device -> host coordinator: issues each chunk's DMA into its slot once the slot's
    /// previous chunk is out of it, and opens a chunk to the workers as soon as its DMA ended.
    /// Stops the workers when it fails (its caller also does if it panics).
    pub(super) fn coordinate_d2h<D: Dma>(&self, dma: &mut D) -> Result<(), D::Error> {
        let r = self.flow_d2h(dma);
        if r.is_err() {
            self.stop();
        }
        r
    }

    fn flow_d2h<D: Dma>(&self, dma: &mut D) -> Result<(), D::Error> {
        let (n, depth) = (self.n, self.depth);
        let (mut issued, mut landed, mut drained) = (0usize, 0usize, 0usize);
        let mut spin = Backoff::new();
        while drained < n {
            if self.stopped() {
                return Err(D::stopped());
            }
            if issued < n && issued < drained + depth {
                // SAFETY: the slot's previous chunk was drained (or it was never used), so the
                // DMA may overwrite it; no worker reads it until chunk `issued` opens, which
                // waits for this DMA's end through `poll` below.
                unsafe { dma.issue(issued, issued % depth, false) }?;
                issued += 1;
                spin = Backoff::new();
            } else if landed < issued && dma.poll(landed % depth)? {
                landed += 1;
                self.open.store(landed, Ordering::Release);
                spin = Backoff::new();
            } else if self.take_whole(drained % depth) {
                // Every part of chunk `drained` is out of its slot; its next use is a DMA
                // issued above, after this reset.
                drained += 1;
                spin = Backoff::new();
            } else {
                spin.snooze();
            }
        }
        Ok(())
    }
}

/// Waiting for another thread's progress: spin briefly, then yield the core (a few hundred
/// microseconds: a chunk's DMA takes about that long, and a sleep would oversleep it by the
/// timer slack), then nap (so a pipeline stalled for longer does not burn every core). Under
/// loom, a yield to the model's other threads.
struct Backoff {
    step: u32,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff { step: 0 }
    }
    fn snooze(&mut self) {
        if !crate::sync::SPIN {
            // Under loom: a yield, which the model explores as one.
            crate::sync::thread::yield_now();
        } else if self.step < 64 {
            std::hint::spin_loop();
        } else if self.step < 4096 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        self.step = self.step.saturating_add(1);
    }
}

/// Loom models of the hand-off (`scripts/loom.sh`): every interleaving, at most 4 preemptions,
/// of a worker thread, the coordinator and a thread per DMA, over two chunks and one slot (the
/// slot reused once: the case that matters). A slot's memory is a loom cell, so a worker and a
/// DMA touching it at once is a data race the model reports; a coordinator or worker that
/// waits for what never comes is a deadlock (or a spin past loom's branch bound) it reports.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::{model, thread};
    use loom::cell::UnsafeCell;
    use std::sync::Arc;

    /// The slot's memory.
    struct Mem(UnsafeCell<usize>);
    // SAFETY: the model's threads touch the cell only in the turns the hand-off orders; loom's
    // cell itself checks that (a data race fails the model).
    unsafe impl Send for Mem {}
    // SAFETY: as above.
    unsafe impl Sync for Mem {}

    /// The device side: each DMA a thread of its own that reads the slot (host -> device: what
    /// it saw is checked at the end) or writes chunk `k + 1` into it (device -> host), then
    /// ends; `poll` sees its end. Issuing chunk `fail_at` fails instead.
    struct FakeDma {
        slot: Arc<Mem>,
        ended: Vec<Arc<AtomicBool>>,
        threads: Vec<thread::JoinHandle<Option<usize>>>,
        fail_at: Option<usize>,
    }

    impl FakeDma {
        fn new(fail_at: Option<usize>) -> FakeDma {
            FakeDma {
                slot: Arc::new(Mem(UnsafeCell::new(0))),
                ended: Vec::new(),
                threads: Vec::new(),
                fail_at,
            }
        }
        /// What each DMA out of the slot read (`None` for DMAs into it), in chunk order.
        fn join(self) -> Vec<Option<usize>> {
            self.threads
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect()
        }
    }

    impl Dma for FakeDma {
        type Error = &'static str;
        fn stopped() -> &'static str {
            "stopped"
        }
        unsafe fn issue(&mut self, k: usize, _slot: usize, h2d: bool) -> Result<(), &'static str> {
            if self.fail_at == Some(k) {
                return Err("issue failed");
            }
            let (slot, ended) = (Arc::clone(&self.slot), Arc::new(AtomicBool::new(false)));
            self.ended.push(Arc::clone(&ended));
            self.threads.push(thread::spawn(move || {
                let seen = if h2d {
                    // SAFETY: the hand-off gives the slot to this DMA until its end is seen.
                    Some(slot.0.with(|p| unsafe { *p }))
                } else {
                    // SAFETY: as above.
                    slot.0.with_mut(|p| unsafe { *p = k + 1 });
                    None
                };
                ended.store(true, Ordering::Release);
                seen
            }));
            Ok(())
        }
        fn poll(&mut self, slot: usize) -> Result<bool, &'static str> {
            // One slot: its last DMA is the last issued.
            assert_eq!(slot, 0);
            Ok(self.ended.last().is_some_and(|e| e.load(Ordering::Acquire)))
        }
    }

    /// A worker thread's loop, as `pipeline.rs`'s: each part taken written into the slot (host
    /// -> device: chunk `k + 1`) or read out of it (device -> host: what it read, per chunk).
    fn worker(h: Arc<Handoff>, slot: Arc<Mem>, h2d: bool) -> thread::JoinHandle<Vec<usize>> {
        thread::spawn(move || {
            let mut seen = Vec::new();
            while let Some((k, _)) = h.take() {
                if h2d {
                    // SAFETY: the hand-off gives the slot to the workers until the chunk is
                    // whole.
                    slot.0.with_mut(|p| unsafe { *p = k + 1 });
                } else {
                    // SAFETY: as above.
                    seen.push(slot.0.with(|p| unsafe { *p }));
                }
                h.finished(k);
            }
            seen
        })
    }

    /// Host -> device, two chunks through one slot: each DMA reads its own chunk's bytes (chunk
    /// 1's fill waited for chunk 0's DMA to end; no data race), both DMAs issued, and the
    /// worker and the coordinator finish.
    #[test]
    fn loom_h2d_a_slot_is_refilled_only_after_its_dma_ended() {
        model(|| {
            let h = Arc::new(Handoff::new(2, 1, 1, true));
            let mut dma = FakeDma::new(None);
            let w = worker(Arc::clone(&h), Arc::clone(&dma.slot), true);
            assert_eq!(h.coordinate_h2d(&mut dma), Ok(()));
            w.join().unwrap();
            assert_eq!(dma.join(), [Some(1), Some(2)], "a DMA read another chunk");
        });
    }

    /// Device -> host, two chunks through one slot: the worker reads each chunk only after its
    /// DMA ended, and chunk 1's DMA overwrites the slot only after chunk 0 was read out.
    #[test]
    fn loom_d2h_a_slot_is_read_after_its_dma_and_reused_after_its_reads() {
        model(|| {
            let h = Arc::new(Handoff::new(2, 1, 1, false));
            let mut dma = FakeDma::new(None);
            let w = worker(Arc::clone(&h), Arc::clone(&dma.slot), false);
            assert_eq!(h.coordinate_d2h(&mut dma), Ok(()));
            assert_eq!(w.join().unwrap(), [1, 2], "a worker read another chunk");
            assert_eq!(dma.join(), [None, None]);
        });
    }

    /// Device -> host, chunk 1's DMA fails to issue while the worker waits for chunk 1: the
    /// coordinator returns the error and the worker leaves its wait (no hang), having read
    /// chunk 0 only.
    #[test]
    fn loom_a_failed_coordinator_releases_a_waiting_worker() {
        model(|| {
            let h = Arc::new(Handoff::new(2, 1, 1, false));
            let mut dma = FakeDma::new(Some(1));
            let w = worker(Arc::clone(&h), Arc::clone(&dma.slot), false);
            assert_eq!(h.coordinate_d2h(&mut dma), Err("issue failed"));
            assert!(h.stopped());
            assert_eq!(w.join().unwrap(), [1]);
            assert_eq!(dma.join(), [None]);
        });
    }
}
