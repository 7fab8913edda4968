//! Asynchronous host-side copies into pinned memory: the GPU pipeline's bounce buffers
//! (`pipeline/bounce.rs`) are filled from pageable memory with the staging copy
//! ([`copy_bytes`], pieces cut by [`piece`]) on the process's host copy workers
//! ([`super::workers`]), and the thread that queues a copy goes on (enqueuing DMAs) and waits
//! for the copy's request only when it needs the bytes.
//!
//! How the workers take the copies: a queued copy is cut into pieces of
//! [`FILL_PIECE`](super::policy::FILL_PIECE) and each worker takes the next piece of the oldest
//! task from the workers' one queue, so consecutive copies overlap (a worker done with its
//! piece of copy `i` starts on copy `i + 1` while others finish `i`: no barrier between
//! copies) and a copy ends as soon as its last piece does. A copy can be cut into a multiple
//! of the workers a [`Filler`] may use ([`fill_pieces`]), so that a copy queued alone (a
//! pipeline's first) has all of them at once, and the thread that needs a copy can copy its
//! untaken pieces itself ([`Filler::help`]) instead of only waiting. A worker that copied a
//! piece polls the queue for [`IDLE_SPIN`](super::workers::IDLE_SPIN) before it sleeps, so
//! the copies of a running pipeline find the workers awake. The first version handed each
//! copy from a dispatching thread to the fork-join pool, one at a time, every worker woken
//! through its condition variable and joined at the copy's end: on the H200 (run 33) a 4 MiB
//! fill took 200-250 us (16-20 GB/s) where the same workers' copy moves 46-51 GB/s in the
//! staged path, whose workers flow from chunk to chunk without a barrier.

use super::copy::{copy_bytes, demote, piece};
use super::policy::fill_pieces;
use super::workers::{Cap, Task, Workers};
use super::WorkerError;
use crate::request::{Request, RequestError, Signal};
use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::sync::{Condvar, Mutex};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// One queued copy: addresses as integers (the thread that queued it keeps them valid).
struct Fill {
    /// The id of the request `queue` returned for it ([`Request::id`]), for [`Filler::help`].
    id: u64,
    dst: usize,
    src: usize,
    len: usize,
    /// Pieces the copy is cut into ([`piece`] of that many).
    pieces: usize,
    /// Pieces not yet copied; the worker that copies the last completes `done`.
    left: AtomicUsize,
    /// Set when a piece's copy panicked.
    failed: AtomicBool,
    /// Demote each piece's lines once copied ([`demote`]).
    demote: bool,
    /// Non-temporal stores.
    nt: bool,
    done: Arc<Signal>,
    /// The queuing filler's count of copies not complete, for its drop.
    open: Arc<Open>,
    /// The queuing filler's limit on the workers copying its pieces at once.
    cap: Arc<Cap>,
    /// Pieces copied so far, for the loom models' exactly-once check: std's counter, which
    /// adds no interleavings of its own.
    #[cfg(all(test, loom))]
    copied: Arc<std::sync::atomic::AtomicUsize>,
}

/// A filler's copies queued and not complete: its drop waits for none to be left (they
/// write the filler's pinned buffers).
struct Open {
    count: Mutex<usize>,
    zero: Condvar,
}

impl Task for Fill {
    fn pieces(&self) -> usize {
        self.pieces
    }

    /// Copies piece `i` (taken from the queue by this thread alone), and completes the
    /// request if it was the last piece left.
    fn run(&self, i: usize) {
        let f = self;
        let ok = match piece(f.len, f.pieces, i) {
            // SAFETY: `queue`'s contract: both ranges are valid, disjoint and unshared
            // until `done` completes, which needs this piece counted below; the pieces
            // of one copy are disjoint.
            Some((at, len)) => catch_unwind(AssertUnwindSafe(|| unsafe {
                let dst = (f.dst + at) as *mut u8;
                copy_bytes((f.src + at) as *const u8, dst, len, f.nt);
                if f.demote {
                    demote(dst, len);
                }
            }))
            .is_ok(),
            None => true,
        };
        if !ok {
            f.failed.store(true, Ordering::Relaxed);
        }
        #[cfg(all(test, loom))]
        f.copied.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // AcqRel: the last piece's worker sees every other piece's bytes (and the failed
        // flag) before it completes the request.
        if f.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let r = match f.failed.load(Ordering::Relaxed) {
                true => Err(RequestError::Panicked {
                    op: "staging fill".into(),
                    msg: WorkerError::Panicked.to_string(),
                }),
                false => Ok(()),
            };
            f.done.complete(r);
            let mut open = f.open.count.lock().unwrap_or_else(|e| e.into_inner());
            *open -= 1;
            if *open == 0 {
                f.open.zero.notify_all();
            }
        }
    }

    fn spin_after(&self) -> bool {
        true
    }

    fn request(&self) -> Option<u64> {
        Some(self.id)
    }

    fn cap(&self) -> Option<&Cap> {
        Some(&self.cap)
    }
}

/// A pipeline's hand on the host copy workers: copies cut into pieces that up to `threads`
/// workers take; see the module documentation.
pub(crate) struct Filler {
    workers: Arc<Workers>,
    /// A set of its own ([`PRIVATE_SETS`]), stopped by the drop.
    #[cfg(feature = "bench")]
    private: bool,
    /// The workers a copy is spread over ([`Cap::limit`]), and the most that copy its pieces
    /// at once.
    cap: Arc<Cap>,
    /// Non-temporal stores.
    nt: bool,
    open: Arc<Open>,
    #[cfg(all(test, loom))]
    copied: Arc<std::sync::atomic::AtomicUsize>,
}

impl Filler {
    /// Up to `threads` of the process's host copy workers
    /// ([`shared`](super::workers::shared), at most its cores; started if fewer run);
    /// non-temporal stores when `nt` (the engine's host -> device staging setting, which its
    /// caller read: nothing here reads the environment).
    /// Errors: [`WorkerError::BadConfig`] (no threads, or more than 256), [`WorkerError::Spawn`].
    pub(crate) fn new(threads: usize, nt: bool) -> Result<Filler, WorkerError> {
        #[cfg(feature = "bench")]
        if PRIVATE_SETS.load(Ordering::Relaxed) {
            let mut f = Filler::on(Workers::new(threads.clamp(1, 256)), threads, nt)?;
            f.private = true;
            return Ok(f);
        }
        Filler::on(Arc::clone(super::workers::shared()), threads, nt)
    }

    /// Up to `threads` workers of `workers`; see [`Filler::new`].
    pub(crate) fn on(
        workers: Arc<Workers>,
        threads: usize,
        nt: bool,
    ) -> Result<Filler, WorkerError> {
        if !(1..=256).contains(&threads) {
            return Err(WorkerError::BadConfig(format!(
                "threads {threads} is not in 1..=256"
            )));
        }
        let threads = workers.grow(threads)?.min(threads);
        Ok(Filler {
            workers,
            #[cfg(feature = "bench")]
            private: false,
            cap: Arc::new(Cap::new(threads)),
            nt,
            open: Arc::new(Open {
                count: Mutex::new(0),
                zero: Condvar::new(),
            }),
            #[cfg(all(test, loom))]
            copied: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        })
    }

    /// Queues a copy of `len` bytes from `src` to `dst` and returns at once, cut into
    /// [`fill_pieces`] (`spread`: a multiple of the workers), each piece's lines moved out of
    /// its worker's private caches once copied where `demote` asks ([`demote`]: for a copy a
    /// DMA reads soon after); the request completes when the bytes are in `dst` (non-temporal
    /// stores fenced), or with `RequestError::Panicked` (a piece's copy panicked).
    ///
    /// # Safety
    /// 1. `src` is readable and `dst` writable for `len` bytes, the ranges do not overlap, and
    ///    both stay valid, with nothing else writing `src` or touching `dst`, until the returned
    ///    request completes (also when the caller fails meanwhile: wait for it).
    pub(crate) unsafe fn queue(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        spread: bool,
        demote: bool,
    ) -> Result<Request, WorkerError> {
        let done = Arc::new(Signal::new());
        let req = Request::new(Arc::clone(&done));
        let pieces = fill_pieces(len, self.cap.limit(), spread);
        let f = Arc::new(Fill {
            id: req.id(),
            dst: dst as usize,
            src: src as usize,
            len,
            pieces,
            left: AtomicUsize::new(pieces),
            failed: AtomicBool::new(false),
            demote,
            nt: self.nt,
            done,
            open: Arc::clone(&self.open),
            cap: Arc::clone(&self.cap),
            #[cfg(all(test, loom))]
            copied: Arc::clone(&self.copied),
        });
        *self.open.count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        if let Err(e) = self.workers.post(f, pieces.min(self.cap.limit())) {
            *self.open.count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
            return Err(e);
        }
        Ok(req)
    }

    /// Copies, on the calling thread, pieces of the copy whose request is `req` (one
    /// [`Filler::queue`] returned) that no worker has taken yet, until none is left; returns
    /// how many it copied (0 when the copy is no longer queued, or is no copy of these
    /// workers). The copy may still be running on the workers after: wait for `req`.
    ///
    /// For a thread that would otherwise wait for `req`: it adds a core to the copy, and the
    /// copy does not wait for sleeping workers to wake. It never takes another copy's piece,
    /// so it returns at most one piece (tens of microseconds) after the copy's last piece was
    /// taken.
    pub(crate) fn help(&self, req: &Request) -> usize {
        let mut copied = 0;
        while let Some((task, i)) = self.workers.take_of(req.id()) {
            task.run(i);
            copied += 1;
        }
        copied
    }
}

impl Drop for Filler {
    /// Waits for the copies queued and not complete (they write the pipeline's pinned buffers,
    /// freed after): the workers run them.
    fn drop(&mut self) {
        let mut open = self.open.count.lock().unwrap_or_else(|e| e.into_inner());
        while *open > 0 {
            open = self.open.zero.wait(open).unwrap_or_else(|e| e.into_inner());
        }
        #[cfg(feature = "bench")]
        if self.private {
            drop(open);
            self.workers.shutdown();
        }
    }
}

/// A diagnostic of `ferry bench` (feature `bench`, [`crate::bench::private_fill_workers`]):
/// while set, each new [`Filler`] runs on a set of workers of its own, as the GPU pipeline's
/// fills did before the process's one set (`ececbde`), to tell the shared set's hand-off from
/// the rest of a run on one host in one process.
#[cfg(feature = "bench")]
pub(crate) static PRIVATE_SETS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::staging::workers::IDLE_SPIN;

    #[test]
    fn queued_fills_copy_every_byte_without_blocking_the_caller() {
        let filler = Filler::new(3, false).expect("filler");
        let src: Vec<u8> = (0..(9 << 20) + 77u32)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let mut dsts = [vec![0u8; src.len()], vec![0u8; 5000], vec![0u8; 0]];
        let lens = [src.len(), 5000, 0];
        let reqs: Vec<Request> = dsts
            .iter_mut()
            .zip(lens)
            .map(|(d, len)| {
                // SAFETY: both vectors outlive the requests, waited for below.
                unsafe {
                    filler.queue(
                        d.as_mut_ptr() as u64,
                        src.as_ptr() as u64,
                        len,
                        true,
                        len > 5000,
                    )
                }
                .expect("queue")
            })
            .collect();
        for r in reqs {
            r.wait().expect("fill");
        }
        assert!(dsts[0] == src, "9 MiB fill differs");
        assert_eq!(dsts[1][..], src[..5000]);
    }

    /// Many small and odd-sized copies queued back to back (pieces of several copies in flight
    /// at once), then more after the workers went to sleep: every byte of every copy, each
    /// request complete only once its bytes are in.
    #[test]
    fn overlapping_fills_and_fills_after_sleep_are_all_complete() {
        let filler = Filler::new(4, false).expect("filler");
        let src: Vec<u8> = (0..(3 << 20) + 4099u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for round in 0..2 {
            let lens: Vec<usize> = (0..24)
                .map(|j| (j * 131_071 + round * 7) % src.len())
                .collect();
            let mut dsts: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
            let reqs: Vec<Request> = dsts
                .iter_mut()
                .enumerate()
                .map(|(j, d)| {
                    let (dst, len) = (d.as_mut_ptr() as u64, d.len());
                    // SAFETY: the vectors outlive the requests, waited for below.
                    unsafe { filler.queue(dst, src.as_ptr() as u64, len, j % 2 == 0, j % 3 == 0) }
                        .expect("queue")
                })
                .collect();
            for (j, (r, d)) in reqs.into_iter().zip(&dsts).enumerate() {
                r.wait().expect("fill");
                if let Some(at) = d.iter().zip(&src).position(|(a, b)| a != b) {
                    panic!(
                        "round {round}, copy {j} of {} bytes: byte {at} differs",
                        d.len()
                    );
                }
            }
            // Past the idle spin: the next round wakes sleeping workers.
            std::thread::sleep(IDLE_SPIN * 3);
        }
    }

    /// A thread waiting for a copy copies that copy's untaken pieces and no other copy's: it
    /// returns once none of its copy's pieces is left in the queue, the copy's bytes are all
    /// in place once its request completes, and a request of no queued copy gets no help.
    #[test]
    fn help_copies_pieces_of_its_own_copy_only() {
        let workers = Workers::new(1);
        let filler = Filler::on(Arc::clone(&workers), 1, false).expect("filler");
        let src: Vec<u8> = (0..(16u32 << 20))
            .map(|i| (i.wrapping_mul(2_246_822_519) >> 9) as u8)
            .collect();
        let mut helped = 0;
        for round in 0..3 {
            let (mut a, mut b) = (vec![0u8; src.len()], vec![0u8; src.len()]);
            // SAFETY: the vectors outlive the requests, waited for below.
            let (ra, rb) = unsafe {
                let s = src.as_ptr() as u64;
                let ra = filler.queue(a.as_mut_ptr() as u64, s, a.len(), false, false);
                let rb = filler.queue(b.as_mut_ptr() as u64, s, b.len(), false, true);
                (ra.expect("queue a"), rb.expect("queue b"))
            };
            assert_eq!(filler.help(&Request::ready(Ok(()))), 0);
            let by_a = filler.help(&ra);
            assert!(
                by_a <= fill_pieces(a.len(), 1, false),
                "round {round}: {by_a}"
            );
            assert!(
                filler.workers.take_of(ra.id()).is_none(),
                "round {round}: help returned with pieces of its copy left"
            );
            let by_b = filler.help(&rb);
            ra.wait().expect("a");
            rb.wait().expect("b");
            assert!(a == src && b == src, "round {round}: a helped copy differs");
            helped += by_a + by_b;
            if helped > 0 {
                break;
            }
        }
        // 128 pieces of 256 KiB for one worker: the calling thread took some of them.
        assert!(helped > 0, "the calling thread never copied a piece");
    }
}

/// Loom models of the fill queue (`scripts/loom.sh`): every interleaving, at most 4
/// preemptions, of fills cut into pieces taken by two workers (and by the thread that helps),
/// each fill's completion, the workers' sleep and wake-up, a filler's drop and the shutdown.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::model;

    /// `len` bytes that differ from a zeroed destination's.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 + 1).collect()
    }

    /// A filler on a set of two workers of its own (shut down with [`finish`]).
    fn filler() -> (Filler, Arc<Workers>) {
        let workers = Workers::new(2);
        (Filler::on(Arc::clone(&workers), 2, false).unwrap(), workers)
    }

    /// Drops the filler (it waits for its copies) and stops and joins the workers; returns
    /// the pieces copied by every thread, the count of a run.
    fn finish(filler: Filler, workers: Arc<Workers>) -> usize {
        let copied = Arc::clone(&filler.copied);
        drop(filler);
        workers.shutdown();
        copied.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One fill of two pieces (128 KiB spread over 2 workers), taken by the two workers and
    /// the queuing thread, which helps and then waits: the request completes once, with
    /// success, only when both pieces' bytes are in, each piece copied exactly once (the bytes
    /// whole and two copies counted), and the workers stop and join.
    #[test]
    fn loom_a_fill_of_two_pieces_between_two_workers_and_the_helper() {
        model(|| {
            let (filler, workers) = filler();
            let src = pattern(128 << 10);
            let mut dst = vec![0u8; src.len()];
            assert_eq!(fill_pieces(src.len(), 2, true), 2);
            // SAFETY: both vectors outlive the request, waited for below.
            let req = unsafe {
                filler.queue(
                    dst.as_mut_ptr() as u64,
                    src.as_ptr() as u64,
                    src.len(),
                    true,
                    false,
                )
            }
            .unwrap();
            let helped = filler.help(&req);
            assert!(helped <= 2, "{helped}");
            assert_eq!(req.wait(), Ok(()));
            assert!(dst == src, "the fill's bytes are not all in");
            assert_eq!(finish(filler, workers), 2);
        });
    }

    /// Two one-piece fills queued back to back to sleeping (or falling asleep) workers, waited
    /// for oldest first, with no help: no wake-up is lost (else the waits deadlock), each fill
    /// completes with its own bytes in, and each piece is copied once.
    #[test]
    fn loom_two_fills_queued_back_to_back_both_complete() {
        model(|| {
            let (filler, workers) = filler();
            let src = pattern(300);
            let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 300]);
            // SAFETY: the vectors outlive the requests, waited for below.
            let (ra, rb) = unsafe {
                let s = src.as_ptr() as u64;
                let ra = filler.queue(a.as_mut_ptr() as u64, s, a.len(), false, false);
                let rb = filler.queue(b.as_mut_ptr() as u64, s, b.len(), false, true);
                (ra.unwrap(), rb.unwrap())
            };
            assert_eq!(ra.wait(), Ok(()));
            assert!(a[..] == src[..100], "the first fill's bytes are not all in");
            assert_eq!(rb.wait(), Ok(()));
            assert!(b == src, "the second fill's bytes are not all in");
            assert_eq!(finish(filler, workers), 2);
        });
    }

    /// A filler capped at one worker on a set of two ([`super::Cap`]): two one-piece fills
    /// queued back to back and waited for with no help. The worker that finds the filler at
    /// its limit passes over its piece (and may sleep); the worker whose piece ends takes the
    /// next: no fill is left behind (else the waits deadlock), each piece copied once.
    #[test]
    fn loom_a_capped_filler_on_more_workers_leaves_no_fill_behind() {
        model(|| {
            let workers = Workers::new(2);
            workers.grow(2).unwrap();
            let filler = Filler::on(Arc::clone(&workers), 1, false).unwrap();
            let src = pattern(200);
            let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 200]);
            // SAFETY: the vectors outlive the requests, waited for below.
            let (ra, rb) = unsafe {
                let s = src.as_ptr() as u64;
                let ra = filler.queue(a.as_mut_ptr() as u64, s, a.len(), false, false);
                let rb = filler.queue(b.as_mut_ptr() as u64, s, b.len(), false, false);
                (ra.unwrap(), rb.unwrap())
            };
            assert_eq!(rb.wait(), Ok(()));
            assert_eq!(ra.wait(), Ok(()));
            assert!(
                a[..] == src[..100] && b == src,
                "a fill's bytes are not all in"
            );
            assert_eq!(finish(filler, workers), 2);
        });
    }

    /// A fill of two pieces waited for with no help: it completes only once both pieces' bytes
    /// are in (the first piece done does not complete it), each piece copied once.
    #[test]
    fn loom_a_fill_of_two_pieces_completes_after_its_last_piece() {
        model(|| {
            let (filler, workers) = filler();
            let src = pattern(128 << 10);
            let mut dst = vec![0u8; src.len()];
            // SAFETY: both vectors outlive the request, waited for below.
            let req = unsafe {
                filler.queue(
                    dst.as_mut_ptr() as u64,
                    src.as_ptr() as u64,
                    src.len(),
                    true,
                    false,
                )
            }
            .unwrap();
            assert_eq!(req.wait(), Ok(()));
            assert!(dst == src, "the fill's bytes are not all in");
            assert_eq!(finish(filler, workers), 2);
        });
    }

    /// A fill queued just before the filler is dropped: the drop returns only after the
    /// workers copied it, so its request is complete once the drop returns, with its bytes in.
    #[test]
    fn loom_dropping_the_filler_finishes_the_queued_fill() {
        model(|| {
            let (filler, workers) = filler();
            let copied = Arc::clone(&filler.copied);
            let src = pattern(100);
            let mut dst = vec![0u8; src.len()];
            // SAFETY: both vectors outlive the request, waited for below.
            let mut req = unsafe {
                filler.queue(
                    dst.as_mut_ptr() as u64,
                    src.as_ptr() as u64,
                    src.len(),
                    false,
                    false,
                )
            }
            .unwrap();
            drop(filler);
            assert_eq!(copied.load(std::sync::atomic::Ordering::Relaxed), 1);
            assert_eq!(req.try_wait(), Some(Ok(())));
            assert!(dst == src, "the fill's bytes are not all in");
            workers.shutdown();
        });
    }
}
