//! The engine's stream pool: [`CudaConfig::streams`](super::CudaConfig::streams) *lanes*, each
//! a non-blocking stream per direction with its own event pool and in-flight list, so that
//! threads submitting through one engine share no stream and no lock (H200 host, issue 14:
//! eight threads submitting 64 KiB copies through one stream per direction moved 0.52x what
//! eight threads with a raw stream each moved).
//!
//! A submitting thread keeps one lane for its life ([`route::lane`] of a number the thread is
//! given on its first submission, threads numbered in the order they first submit): its
//! requests in one direction stay in one stream, in submission order. Lane 0's streams are
//! made with the engine; the others' on the first submission that needs them (a thread that
//! never submits costs nothing); a lane whose stream cannot be made uses lane 0's for good, so
//! the stream a thread is shown ([`super::CudaEngine::stream`]) is always the one its copies
//! run on. Each stream is held in a [`Queue`], which keeps its lazy requests' bookkeeping
//! ([`super::completion::mark`]); a lane that falls back on lane 0's stream shares its queue too.

use super::completion::event::{Home, Shared};
use super::completion::mark::{Issue, Queue};
use super::completion::stamp::Stamp;
use super::route;
use super::Direction;
use super::DriverError;
use crate::request::{BarrierError, InFlight};
use cudarc::driver::{CudaContext, CudaStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock};

/// One lane: a stream per direction (made on first use, but lane 0's), the events its requests
/// record and the requests it has in flight.
pub(crate) struct Lane {
    queues: [OnceLock<Arc<Queue>>; 3],
    /// Completed events of this lane's requests, for its next ones, with what else each of its
    /// requests holds.
    pub(crate) home: Arc<Home>,
    /// This lane's requests, for the engine's barrier.
    pub(crate) inflight: InFlight,
}

/// Every lane of one engine.
pub(crate) struct Lanes {
    ctx: Arc<CudaContext>,
    /// Lane 0's queues (H2D, D2H, D2D), made with the engine: the fallback of the others.
    first: [Arc<Queue>; 3],
    /// How every queue's held copies go to the GPU (the engine's paths).
    issue: Arc<dyn Issue>,
    lanes: Box<[Lane]>,
    /// The thread that submitted last through this engine and how many of the engine's
    /// submissions in a row it made, for [`Lanes::alone`] ([`streak_word`]; 0: none yet).
    last_thread: AtomicUsize,
}

/// A queue on a new non-blocking stream of `ctx`, its held copies issued by `issue`.
fn new_queue(ctx: &Arc<CudaContext>, issue: &Arc<dyn Issue>) -> Result<Arc<Queue>, DriverError> {
    ctx.new_stream()
        .map(|s| Arc::new(Queue::new(s, Stamp::new(ctx), Arc::clone(issue))))
        .map_err(|e| DriverError::new("cuStreamCreate", e.0))
}

/// How many of an engine's submissions in a row one thread makes before its requests may be
/// stamped ([`Lanes::alone`]).
pub(crate) const ALONE_AFTER: usize = 4;

/// The engine's streak word after a submission by thread `me`, and whether `me` is alone:
/// the word holds the last submitter's number plus one above 8 bits and its streak (at most
/// [`ALONE_AFTER`]) in the low 8; 0 before any submission.
pub(crate) fn streak_word(word: usize, me: usize) -> (usize, bool) {
    let id = me.wrapping_add(1) << 8;
    let streak = match word & !0xFF == id {
        true => (word & 0xFF) + 1,
        false => 1,
    }
    .min(ALONE_AFTER);
    (id | streak, streak >= ALONE_AFTER)
}

/// The calling thread's number: 0, 1, 2, ... in the order threads first ask (process-wide).
pub(crate) fn thread_number() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static NUMBER: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|n| *n)
}

impl Lanes {
    /// The most lanes an engine has (a larger [`CudaConfig::streams`](super::CudaConfig::streams)
    /// counts as this many): far more than threads that can submit at once on any host.
    pub(crate) const MAX: usize = 256;

    /// Lane 0's three queues on `ctx` (H2D, D2H, D2D), their held copies issued by `issue`,
    /// for [`Lanes::new`].
    pub(crate) fn first(
        ctx: &Arc<CudaContext>,
        issue: &Arc<dyn Issue>,
    ) -> Result<[Arc<Queue>; 3], DriverError> {
        Ok([
            new_queue(ctx, issue)?,
            new_queue(ctx, issue)?,
            new_queue(ctx, issue)?,
        ])
    }

    /// `n` lanes (1 to [`Lanes::MAX`]) on `ctx`, lane 0's queues `first` ([`Lanes::first`],
    /// with `issue`: the other lanes' queues take it too), their requests' futures waited by
    /// the waiter thread `waker_tx`.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        (first, issue): ([Arc<Queue>; 3], Arc<dyn Issue>),
        n: usize,
        waker_tx: &Sender<Arc<Shared>>,
    ) -> Lanes {
        Lanes {
            ctx: Arc::clone(ctx),
            first,
            issue,
            lanes: (0..n.clamp(1, Lanes::MAX))
                .map(|_| Lane {
                    queues: Default::default(),
                    home: Arc::new(Home::new(ctx, waker_tx)),
                    inflight: InFlight::default(),
                })
                .collect(),
            last_thread: AtomicUsize::new(0),
        }
    }

    /// Whether the calling thread submits alone: the engine's last [`ALONE_AFTER`] submissions,
    /// this one included, came from it (then a request's stamp cannot hold up another thread's
    /// copies: run 86, eight threads copying 64 KiB each with a stamp after every copy moved
    /// 13.5 GB/s against 16.2 waited by `cuStreamSynchronize`; with one submission of the
    /// thread's own before, such threads still made one now and then, run 88). Counts this
    /// submission; the shared word is written only while the streak is short or the
    /// submitter changes, so a thread alone reads it and nothing more.
    pub(crate) fn alone(&self) -> bool {
        let word = self.last_thread.load(Ordering::Relaxed);
        let (next, alone) = streak_word(word, thread_number());
        if next != word {
            self.last_thread.store(next, Ordering::Relaxed);
        }
        alone
    }

    /// The calling thread's lane index.
    pub(crate) fn mine(&self) -> usize {
        route::lane(thread_number(), self.lanes.len())
    }

    /// Lane `i` (an index from [`Lanes::mine`]; out of range: lane 0).
    pub(crate) fn lane(&self, i: usize) -> &Lane {
        self.lanes.get(i).unwrap_or(&self.lanes[0])
    }

    /// Lane `i`'s queue for direction `d`, its stream made now if it is the first use (lane
    /// 0's queue if it cannot be made).
    pub(crate) fn queue(&self, i: usize, d: Direction) -> &Arc<Queue> {
        let first = &self.first[d as usize];
        match self.lanes.get(i) {
            Some(lane) if i > 0 => lane.queues[d as usize].get_or_init(|| {
                new_queue(&self.ctx, &self.issue).unwrap_or_else(|_| Arc::clone(first))
            }),
            _ => first,
        }
    }

    /// Lane `i`'s queues made so far (lane 0's: all three; a lane that fell back on lane 0's
    /// stream: that one).
    pub(crate) fn queues_of(&self, i: usize) -> impl Iterator<Item = &Arc<Queue>> {
        let own = self.lanes.get(i).filter(|_| i > 0);
        let first = own.is_none().then_some(&self.first).into_iter().flatten();
        first.chain(
            own.into_iter()
                .flat_map(|l| l.queues.iter().flat_map(OnceLock::get)),
        )
    }

    /// Every queue made so far (lane 0's, then the others').
    pub(crate) fn queues(&self) -> impl Iterator<Item = &Arc<Queue>> {
        self.first.iter().chain(
            self.lanes
                .iter()
                .flat_map(|l| l.queues.iter().flat_map(OnceLock::get)),
        )
    }

    /// Every stream made so far (lane 0's, then the others').
    pub(crate) fn streams(&self) -> impl Iterator<Item = &Arc<CudaStream>> {
        self.first.iter().map(|q| q.stream()).chain(
            self.lanes
                .iter()
                .flat_map(|l| l.queues.iter().flat_map(OnceLock::get).map(|q| q.stream())),
        )
    }

    /// Waits for every lane's tracked requests; every unobserved failure of any lane.
    pub(crate) fn barrier(&self) -> Result<(), BarrierError> {
        let mut failures = Vec::new();
        for lane in self.lanes.iter() {
            if let Err(e) = lane.inflight.barrier() {
                failures.extend(e.failures);
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(BarrierError { failures })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{streak_word, ALONE_AFTER};

    #[test]
    fn a_thread_is_alone_after_a_streak_of_its_own_submissions() {
        // Thread 7 alone: alone from its ALONE_AFTER-th submission on; the word then stays.
        let mut w = 0;
        for i in 1..=10 {
            let (next, alone) = streak_word(w, 7);
            assert_eq!(alone, i >= ALONE_AFTER, "submission {i}");
            if i > ALONE_AFTER {
                assert_eq!(next, w, "no write once the streak is full");
            }
            w = next;
        }
        // Another thread breaks the streak for both.
        let (w, alone) = streak_word(w, 3);
        assert!(!alone);
        let (_, alone) = streak_word(w, 7);
        assert!(!alone);
        // Thread 0 is told apart from "none yet".
        let (w, _) = streak_word(0, 0);
        assert_ne!(w, 0);
        assert!(!streak_word(w, 1).1);
    }
}
