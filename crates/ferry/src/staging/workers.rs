//! The host copy workers: one set of threads per process ([`shared`], sized to the machine's
//! cores, each started when a user asks for that many or work finds too few idle) that every staged copy of every device
//! (`engine/cuda/paths/staged/`) and every GPU pipeline's fill queue ([`super::fill`]) share, so
//! that a 16-core host never runs more copy threads than it has cores (issue 30 item 4: one
//! stager's pool and one pipeline's fill threads each were separate sets before).
//!
//! The threads take [`Task`]s from one queue, oldest first, one piece at a time: a staged copy
//! ([`Pool::run_with`]) posts `n` pieces, each a worker's whole part of the copy's chunk loop,
//! beside its coordinating thread; a fill ([`super::fill::Filler`]) posts its pieces of
//! [`FILL_PIECE`](super::policy::FILL_PIECE). Each user asks for at most its own count (its
//! config's threads, which can lower the count a copy uses but never raise the set past the
//! cores); a filler's pieces run on at most its count of workers at once ([`Cap`]: the
//! pipeline's fill threads), whatever the set has started, and a worker passes over the pieces
//! of a user at its limit to the next task's. Two devices' staged copies run side by side: no lock is held around a job, and a
//! job's pieces no worker took by the time its coordinator is done are taken back, so a copy
//! never waits for another one's workers.
//!
//! How they wake: each worker sleeps on its own condition variable, and a posted task wakes
//! the lowest-numbered sleeping workers, as many as it has pieces: always the same warm ones
//! (with one shared condition variable, waking 4 of 12 workers rotated through all twelve, each
//! waking cold, and 1-8 MiB staged copies ran as slowly as with all twelve: H200 run 28,
//! commit a7006da; waking workers 0..n gave 1.09-1.15x the driver's pageable path at 4-8 MiB
//! host -> device, run 29, see [`workers_for`](super::policy::workers_for)). A worker that
//! copied a fill piece polls the queue for [`IDLE_SPIN`] before it sleeps, so the fills of a
//! running pipeline (one every chunk, 40-200 us apart on the H200 host) find it awake; one
//! that ran a staged copy's piece sleeps at once (a staged copy's coordinator wakes what it
//! needs).
//!
//! The CPU engine's pool (`engine/cpu/pool.rs`) and the file engine's workers (`file/exec.rs`)
//! stay their own: why, in their module documentation.

use super::WorkerError;
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::sync::thread::{self, JoinHandle};
use crate::sync::{Condvar, Mutex, MutexGuard, SPIN};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a worker that copied a fill piece polls the queue (spinning, then yielding its
/// core) before it sleeps on its condition variable. Longer than the gap between two fills of
/// a running pipeline, so a fill does not wait for a wake-up (tens of microseconds on a VM
/// whose idle virtual CPUs halt); short enough that the workers of an idle pipeline stop using
/// the cores within a millisecond.
pub(crate) const IDLE_SPIN: Duration = Duration::from_micros(500);

/// The most workers a process starts, whatever its cores.
const MAX_WORKERS: usize = 256;

/// Work the host copy workers run: `pieces()` pieces, each run once by one thread.
pub(crate) trait Task: Send + Sync {
    /// How many pieces the task is cut into (at least 1).
    fn pieces(&self) -> usize;
    /// Runs piece `i`; it catches its own panics (a panic fails the task's request only).
    fn run(&self, i: usize);
    /// Whether the worker that ran a piece polls the queue for [`IDLE_SPIN`] before it sleeps.
    fn spin_after(&self) -> bool;
    /// The id of the request the task completes, for a thread that helps with it
    /// ([`Workers::take_of`]).
    fn request(&self) -> Option<u64> {
        None
    }
    /// The limit its user puts on the workers running its tasks' pieces at once, if any
    /// ([`Cap`]).
    fn cap(&self) -> Option<&Cap> {
        None
    }
}

/// How many workers may run one user's pieces at once (a GPU pipeline's fills: its fill
/// threads), shared by the user's tasks: a worker takes the oldest piece whose user is under
/// its limit. Without it a pipeline's fills spread over every worker the set had started (up
/// to the cores), where 8 of the H200 host's 16 cores filled fastest (`FILL_THREADS`, runs
/// 63-65: 64 MiB in 2 MiB chunks, 0.88-0.89 of the pinned pipeline with 8 threads, 0.82-0.88
/// with 12, 0.68-0.80 with 16); the eleventh H100 run measured the shared set's fills at
/// 0.82-0.85 of the pinned pipeline where `ececbde`'s eight threads of their own reached
/// 0.88-0.93.
pub(crate) struct Cap {
    limit: usize,
    /// Pieces of the user's running on workers (taken under the state's lock, given back by
    /// the worker once the piece ran).
    running: AtomicUsize,
}

impl Cap {
    /// At most `limit` (at least 1) workers at once.
    pub(crate) fn new(limit: usize) -> Cap {
        Cap {
            limit: limit.max(1),
            running: AtomicUsize::new(0),
        }
    }

    /// The most workers at once.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    fn has_room(&self) -> bool {
        self.running.load(Ordering::Acquire) < self.limit
    }
}

/// A posted task and the next of its pieces to take.
struct Queued {
    task: Arc<dyn Task>,
    /// The key [`Workers::post`] returned, for [`Workers::cancel`].
    key: u64,
    next: usize,
}

struct State {
    queue: VecDeque<Queued>,
    /// Per worker slot: asleep on its condition variable, waiting for a task.
    sleeping: Vec<bool>,
    /// Workers started so far (the first `started` slots).
    started: usize,
    next_key: u64,
    shutdown: bool,
}

/// One set of host copy threads and their queue; see the module documentation.
pub(crate) struct Workers {
    state: Mutex<State>,
    /// One per worker slot, so that a task wakes exactly the workers it wants.
    work: Vec<Condvar>,
    /// Tasks posted so far: spinning workers poll it without the lock.
    posted: AtomicU64,
    /// Workers running a piece (a hint for [`Workers::post`]).
    busy: AtomicUsize,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The machine's cores, the size of the process's worker set.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_WORKERS)
}

/// The process's host copy workers, made on first use: at most [`cores`] threads, started as
/// users ask for them ([`Workers::grow`]), living as long as the process.
pub(crate) fn shared() -> &'static Arc<Workers> {
    static SHARED: std::sync::OnceLock<Arc<Workers>> = std::sync::OnceLock::new();
    SHARED.get_or_init(|| Workers::new(cores()))
}

impl Workers {
    /// A set of at most `max` workers (1..=256), none started yet.
    pub(crate) fn new(max: usize) -> Arc<Workers> {
        let max = max.clamp(1, MAX_WORKERS);
        Arc::new(Workers {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                sleeping: vec![false; max],
                started: 0,
                next_key: 0,
                shutdown: false,
            }),
            work: (0..max).map(|_| Condvar::new()).collect(),
            posted: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
            handles: Mutex::new(Vec::new()),
        })
    }

    /// The most workers this set starts.
    pub(crate) fn max(&self) -> usize {
        self.work.len()
    }

    /// The workers started so far.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn started(&self) -> usize {
        lock(&self.state).started
    }

    /// Tasks with pieces no worker has taken yet.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn queued(&self) -> usize {
        lock(&self.state).queue.len()
    }

    /// Starts workers until `want` (at most [`Workers::max`]) run; returns how many run.
    /// Errors: [`WorkerError::Spawn`] (those started before stay).
    pub(crate) fn grow(self: &Arc<Self>, want: usize) -> Result<usize, WorkerError> {
        let want = want.min(self.max());
        let mut st = lock(&self.state);
        while st.started < want {
            self.start_one(&mut st)?;
        }
        Ok(st.started)
    }

    /// Starts the next worker (under the state's lock, which it waits for before it looks at
    /// the queue).
    fn start_one(self: &Arc<Self>, st: &mut State) -> Result<(), WorkerError> {
        let i = st.started;
        let me = Arc::clone(self);
        let h = thread::Builder::new()
            .name(format!("ferry-host-{i}"))
            .spawn(move || me.worker(i))
            .map_err(WorkerError::Spawn)?;
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(h);
        st.started += 1;
        Ok(())
    }

    /// Queues `task` behind those posted before and wakes up to `wake` sleeping workers, the
    /// lowest-numbered; where fewer started workers are free (not running a piece, not owed to
    /// a piece queued before) than `wake`, starts more, up
    /// to [`Workers::max`] (two devices' staged copies each find workers); for a capped user,
    /// as many as its [`Cap`] has room for beyond the workers not running a piece. Returns its key
    /// for [`Workers::cancel`].
    /// Errors: [`WorkerError::BadConfig`] once shut down or before any worker started.
    pub(crate) fn post(
        self: &Arc<Self>,
        task: Arc<dyn Task>,
        wake: usize,
    ) -> Result<u64, WorkerError> {
        let key = {
            let mut st = lock(&self.state);
            if st.shutdown || st.started == 0 {
                return Err(WorkerError::BadConfig(
                    "the host copy workers have stopped".into(),
                ));
            }
            // Pieces queued before this task (each will take an idle worker) and workers
            // running one: what is left of the started workers is free for this task.
            let pending: usize = st.queue.iter().map(|q| q.task.pieces() - q.next).sum();
            let busy = self.busy.load(Ordering::Relaxed);
            let spare = st.started.saturating_sub(pending + busy);
            // A capped user takes at most its limit's room of workers, idle ones first (its
            // own pending pieces wait for that room, not for idle workers).
            let want = match task.cap() {
                Some(c) => wake
                    .min(c.limit.saturating_sub(c.running.load(Ordering::Acquire)))
                    .saturating_sub(st.started.saturating_sub(busy)),
                None => wake.saturating_sub(spare),
            };
            let key = st.next_key;
            st.next_key += 1;
            st.queue.push_back(Queued { task, key, next: 0 });
            let mut left = wake;
            for i in 0..st.started {
                if left == 0 {
                    break;
                }
                if st.sleeping[i] {
                    st.sleeping[i] = false;
                    self.work[i].notify_one();
                    left -= 1;
                }
            }
            let more = want.min(self.max() - st.started);
            for _ in 0..more {
                // A worker that cannot start leaves the task to those running.
                if self.start_one(&mut st).is_err() {
                    break;
                }
            }
            key
        };
        self.posted.fetch_add(1, Ordering::Release);
        Ok(key)
    }

    /// Takes back the pieces of the task posted as `key` that no worker has taken; returns how
    /// many were taken (all of them when the task has left the queue).
    pub(crate) fn cancel(&self, key: u64, pieces: usize) -> usize {
        let mut st = lock(&self.state);
        match st.queue.iter().position(|q| q.key == key) {
            Some(at) => st.queue.remove(at).map_or(pieces, |q| q.next),
            None => pieces,
        }
    }

    /// Takes the next piece of the queued task that completes request `id`, if one is left.
    pub(crate) fn take_of(&self, id: u64) -> Option<(Arc<dyn Task>, usize)> {
        let mut st = lock(&self.state);
        let at = st.queue.iter().position(|q| q.task.request() == Some(id))?;
        take_at(&mut st.queue, at)
    }

    fn worker(&self, index: usize) {
        /// Gives a capped piece's place back when dropped (also if the piece unwinds), before
        /// the worker looks for its next piece: a worker that found the user at its limit
        /// meanwhile left the piece to this one.
        struct Release<'a>(Option<&'a Cap>);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                if let Some(c) = self.0 {
                    c.running.fetch_sub(1, Ordering::Release);
                }
            }
        }
        let mut spin = false;
        let mut freed: Option<Arc<dyn Task>> = None;
        // Ends once shut down, after the tasks queued before.
        while let Some((task, i)) = self.next(index, spin, freed.take()) {
            {
                let _place = Release(task.cap());
                task.run(i);
            }
            self.busy.fetch_sub(1, Ordering::Relaxed);
            spin = task.spin_after();
            if task.cap().is_some() {
                freed = Some(task);
            }
        }
    }

    /// The next piece to run (the oldest task's next), waiting for one; `None` once shut down
    /// and nothing is left. Polls for [`IDLE_SPIN`] first where `spin`. `freed`: the capped
    /// task whose place this worker has just given back: if it takes another task's piece
    /// while that user still has pieces queued, it wakes a sleeping worker for them (else they
    /// would wait for a worker to come by).
    fn next(
        &self,
        index: usize,
        spin: bool,
        freed: Option<Arc<dyn Task>>,
    ) -> Option<(Arc<dyn Task>, usize)> {
        let idle = Instant::now();
        let mut spin = SPIN && spin;
        loop {
            let seen = {
                let mut st = lock(&self.state);
                loop {
                    if let Some(taken) = take_next(&mut st.queue) {
                        self.busy.fetch_add(1, Ordering::Relaxed);
                        if let Some(f) = &freed {
                            self.wake_for_freed(&mut st, f, &taken.0);
                        }
                        return Some(taken);
                    }
                    if st.shutdown {
                        return None;
                    }
                    if spin && idle.elapsed() < IDLE_SPIN {
                        break self.posted.load(Ordering::Acquire);
                    }
                    spin = false;
                    // `post` queues under this lock before it clears the flag and notifies:
                    // no wake-up is lost.
                    st.sleeping[index] = true;
                    st = self.work[index].wait(st).unwrap_or_else(|e| e.into_inner());
                    st.sleeping[index] = false;
                }
            };
            // Poll without the lock until a task is posted or the spin is over.
            while self.posted.load(Ordering::Acquire) == seen && idle.elapsed() < IDLE_SPIN {
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
                std::thread::yield_now();
            }
        }
    }

    /// After a worker that gave back a place of capped `freed` took a piece of `took`: where
    /// that is another user's and `freed`'s user has pieces queued and room, wakes one sleeping
    /// worker for them.
    fn wake_for_freed(&self, st: &mut State, freed: &Arc<dyn Task>, took: &Arc<dyn Task>) {
        let same = |a: &Arc<dyn Task>, b: &Arc<dyn Task>| match (a.cap(), b.cap()) {
            (Some(x), Some(y)) => std::ptr::eq(x, y),
            _ => false,
        };
        if same(freed, took) {
            return;
        }
        let waiting = st
            .queue
            .iter()
            .any(|q| same(&q.task, freed) && q.task.cap().is_some_and(Cap::has_room));
        if !waiting {
            return;
        }
        if let Some(i) = (0..st.started).find(|&i| st.sleeping[i]) {
            st.sleeping[i] = false;
            self.work[i].notify_one();
        }
    }

    /// Stops the workers once the queued tasks are done and joins them (the tests' own sets
    /// and the bench's private fill sets; the process's set lives as long as the process).
    #[cfg(any(test, feature = "bench"))]
    pub(crate) fn shutdown(&self) {
        {
            let mut st = lock(&self.state);
            st.shutdown = true;
            for (i, w) in self.work.iter().enumerate() {
                st.sleeping[i] = false;
                w.notify_one();
            }
        }
        self.posted.fetch_add(1, Ordering::Release);
        let handles = std::mem::take(&mut *self.handles.lock().unwrap_or_else(|e| e.into_inner()));
        for h in handles {
            let _ = h.join();
        }
    }
}

/// Takes the next piece of the oldest task whose user is under its [`Cap`] (a worker's next
/// piece), counting it against the cap.
fn take_next(q: &mut VecDeque<Queued>) -> Option<(Arc<dyn Task>, usize)> {
    let at = q
        .iter()
        .position(|e| e.task.cap().is_none_or(Cap::has_room))?;
    if let Some(c) = q[at].task.cap() {
        c.running.fetch_add(1, Ordering::AcqRel);
    }
    take_at(q, at)
}

/// Takes the next piece of the task at `at`, removing it once its last piece is taken.
fn take_at(q: &mut VecDeque<Queued>, at: usize) -> Option<(Arc<dyn Task>, usize)> {
    let e = q.get_mut(at)?;
    let (task, piece) = (Arc::clone(&e.task), e.next);
    e.next += 1;
    if e.next >= task.pieces() {
        q.remove(at);
    }
    Some((task, piece))
}

type Job = dyn Fn(usize) + Sync;

/// What the pieces of one staged job report back.
struct JobDone {
    /// Pieces run to their end.
    finished: usize,
    panicked: bool,
}

/// One [`Pool::run_with`] job as a task: piece `i` calls `f(i)`.
struct JobTask {
    job: *const Job,
    pieces: usize,
    done: Mutex<JobDone>,
    all_done: Condvar,
}

// SAFETY: `job` is dereferenced only by the pieces a worker took, and `run_with` (which owns
// the borrow) waits for every taken piece to finish before it returns; the closure is `Sync`.
unsafe impl Send for JobTask {}
// SAFETY: as above.
unsafe impl Sync for JobTask {}

impl Task for JobTask {
    fn pieces(&self) -> usize {
        self.pieces
    }

    fn run(&self, i: usize) {
        // SAFETY: `run_with` keeps the closure alive until `finished` counts this piece, which
        // happens only after this call returns.
        let ok = catch_unwind(AssertUnwindSafe(|| unsafe { (*self.job)(i) })).is_ok();
        let mut d = self.done.lock().unwrap_or_else(|e| e.into_inner());
        d.finished += 1;
        d.panicked |= !ok;
        self.all_done.notify_all();
    }

    fn spin_after(&self) -> bool {
        false
    }
}

/// A staged copier's hand on the host copy workers: fork-join jobs of up to `threads()`
/// workers beside the calling thread ([`Pool::run_with`]).
pub(crate) struct Pool {
    workers: Arc<Workers>,
    cap: usize,
    /// One job of this hand at a time: a stager's two directions take turns at the workers,
    /// as with the stager's own pool before (two devices' stagers do not wait for each
    /// other).
    turn: Mutex<()>,
}

impl Pool {
    /// Up to `threads` of the process's workers ([`shared`]), at most its cores; starts them if
    /// fewer run. Errors: [`WorkerError::BadConfig`] (0 or more than 256), [`WorkerError::Spawn`].
    pub(crate) fn new(threads: usize) -> Result<Pool, WorkerError> {
        Pool::on(Arc::clone(shared()), threads)
    }

    /// Up to `threads` workers of `workers`; see [`Pool::new`].
    pub(crate) fn on(workers: Arc<Workers>, threads: usize) -> Result<Pool, WorkerError> {
        if !(1..=MAX_WORKERS).contains(&threads) {
            return Err(WorkerError::BadConfig(format!(
                "threads {threads} is not in 1..={MAX_WORKERS}"
            )));
        }
        let cap = workers.grow(threads)?.min(threads);
        Ok(Pool {
            workers,
            cap,
            turn: Mutex::new(()),
        })
    }

    /// The most workers one job runs on.
    pub(crate) fn threads(&self) -> usize {
        self.cap
    }

    /// Runs `f(i)` for `i` in `0..n` (`n` at most [`Pool::threads`]) on the workers while
    /// `main` runs on the calling thread, then waits for the calls that started: once `main`
    /// returns, the indices no worker has taken yet are taken back and never run (the staged
    /// flow's workers take parts from a shared counter, so a part is done by whichever started).
    /// Each index runs at most once, and on its own worker where workers are free. One job of
    /// this `Pool` at a time: a second call, from another thread, waits for the first (another
    /// `Pool` on the same workers does not). Returns
    /// `main`'s error first, else [`WorkerError::Panicked`] if a call panicked. If `main`
    /// panics, the panic goes on once the started calls returned: `f` must then return without
    /// `main` (the staged pipeline's workers watch a stop flag that its coordinator sets when
    /// it fails or panics), else this waits forever. `main` may wait for the calls' work: the
    /// workers reach this job after the tasks posted before it, which all end on their own.
    pub(crate) fn run_with<E: From<WorkerError>>(
        &self,
        n: usize,
        f: &(dyn Fn(usize) + Sync),
        main: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        let n = n.clamp(1, self.cap);
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: erases the borrow's lifetime; the pointer is used only by pieces taken before
        // the cancel below, each of which this function waits for before returning (also when
        // `main` panics: the guard below waits in its drop).
        let job: *const Job =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Job>(f) };
        let task = Arc::new(JobTask {
            job,
            pieces: n,
            done: Mutex::new(JobDone {
                finished: 0,
                panicked: false,
            }),
            all_done: Condvar::new(),
        });
        let key = self.workers.post(task.clone(), n)?;
        /// Takes back the pieces not started and waits for the others, also when `main` panics.
        struct Finish<'a> {
            workers: &'a Workers,
            task: &'a JobTask,
            key: u64,
        }
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                let taken = self.workers.cancel(self.key, self.task.pieces);
                let mut d = self.task.done.lock().unwrap_or_else(|e| e.into_inner());
                while d.finished < taken {
                    d = self
                        .task
                        .all_done
                        .wait(d)
                        .unwrap_or_else(|e| e.into_inner());
                }
            }
        }
        let finish = Finish {
            workers: &self.workers,
            task: &task,
            key,
        };
        let r = main();
        drop(finish);
        let panicked = task.done.lock().unwrap_or_else(|e| e.into_inner()).panicked;
        r?;
        if panicked {
            return Err(WorkerError::Panicked.into());
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Pool, WorkerError, Workers};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// Spins until `ok` holds, or fails naming `what` after 10 s.
    fn until(what: &str, ok: impl Fn() -> bool) {
        let t = Instant::now();
        while !ok() {
            assert!(t.elapsed() < Duration::from_secs(10), "{what}: timed out");
            std::thread::yield_now();
        }
    }

    #[test]
    fn pool_runs_each_index_once_on_distinct_workers() {
        let workers = Workers::new(6);
        let pool = Pool::on(Arc::clone(&workers), 6).expect("pool");
        assert_eq!((pool.threads(), workers.started()), (6, 6));
        for round in 0..3000usize {
            // Every count from 1 to past the pool's size, in a changing order.
            let want = (round * 7) % 9 + 1;
            let n = want.min(6);
            let hits: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
            let arrived = AtomicUsize::new(0);
            let threads = Mutex::new(Vec::new());
            let main_ran = AtomicUsize::new(0);
            pool.run_with(
                want,
                &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                    let name = std::thread::current().name().map(str::to_owned);
                    assert!(name.is_some_and(|n| n.starts_with("ferry-host-")));
                    threads
                        .lock()
                        .expect("lock")
                        .push(std::thread::current().id());
                    // Every index in at once: each on its own worker.
                    arrived.fetch_add(1, Ordering::Relaxed);
                    until("all indices in", || arrived.load(Ordering::Relaxed) >= n);
                },
                || {
                    main_ran.fetch_add(1, Ordering::Relaxed);
                    // Indices not taken once `main` returns are taken back: wait for all.
                    until("all indices started", || {
                        arrived.load(Ordering::Relaxed) >= n
                    });
                    Ok::<(), WorkerError>(())
                },
            )
            .expect("run");
            assert_eq!(main_ran.load(Ordering::Relaxed), 1);
            for (i, h) in hits.iter().enumerate() {
                let want_hits = usize::from(i < n);
                assert_eq!(
                    h.load(Ordering::Relaxed),
                    want_hits,
                    "round {round} index {i}"
                );
            }
            let mut t = threads.into_inner().expect("lock");
            t.sort_by_key(|id| format!("{id:?}"));
            t.dedup();
            assert_eq!(t.len(), n, "round {round}: one worker per index");
        }
        assert_eq!(
            workers.started(),
            6,
            "no worker started past the set's size"
        );
        workers.shutdown();
    }

    /// Pieces of a capped user ([`super::Cap`]), `pieces` each, that count how many run at once
    /// and how many ran, each held until `gate` opens (at most 10 s: `late` counts those that
    /// gave up).
    struct Capped {
        pieces: usize,
        cap: Arc<super::Cap>,
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        ran: Arc<AtomicUsize>,
        gate: Arc<AtomicBool>,
        late: Arc<AtomicUsize>,
    }

    impl super::Task for Capped {
        fn pieces(&self) -> usize {
            self.pieces
        }
        fn run(&self, _: usize) {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(n, Ordering::SeqCst);
            let t = Instant::now();
            while !self.gate.load(Ordering::SeqCst) {
                if t.elapsed() > Duration::from_secs(10) {
                    self.late.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                std::thread::yield_now();
            }
            self.now.fetch_sub(1, Ordering::SeqCst);
            self.ran.fetch_add(1, Ordering::SeqCst);
        }
        fn spin_after(&self) -> bool {
            true
        }
        fn cap(&self) -> Option<&super::Cap> {
            Some(&self.cap)
        }
    }

    /// A user capped at 2 workers on a set of 4, its pieces held until another user's job has
    /// run: the job, queued behind them, runs on the workers the cap leaves free (without the
    /// cap every worker would wait in a held piece and the job never run); never more than 2 of
    /// the capped pieces at once; no worker started for them past the cap; every piece run.
    #[test]
    fn a_capped_user_runs_on_at_most_its_limit_of_workers() {
        let workers = Workers::new(4);
        workers.grow(2).expect("grow");
        let cap = Arc::new(super::Cap::new(2));
        let (now, most, ran, late) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let gate = Arc::new(AtomicBool::new(false));
        for _ in 0..8 {
            let t = Capped {
                pieces: 4,
                cap: Arc::clone(&cap),
                now: Arc::clone(&now),
                most: Arc::clone(&most),
                ran: Arc::clone(&ran),
                gate: Arc::clone(&gate),
                late: Arc::clone(&late),
            };
            workers.post(Arc::new(t), 4).expect("post");
        }
        assert_eq!(workers.started(), 2, "no worker started past the cap");
        let other = Pool::on(Arc::clone(&workers), 4).expect("pool");
        let other_ran = AtomicUsize::new(0);
        other
            .run_with(
                2,
                &|_| {
                    other_ran.fetch_add(1, Ordering::SeqCst);
                },
                || {
                    until("the other job's pieces", || {
                        other_ran.load(Ordering::SeqCst) == 2
                    });
                    Ok::<(), WorkerError>(())
                },
            )
            .expect("run");
        gate.store(true, Ordering::SeqCst);
        until("every capped piece", || ran.load(Ordering::SeqCst) == 32);
        assert_eq!(late.load(Ordering::SeqCst), 0, "a capped piece waited 10 s");
        assert!(most.load(Ordering::SeqCst) <= 2, "{most:?} at once");
        assert_eq!(cap.running.load(Ordering::SeqCst), 0);
        workers.shutdown();
    }

    /// Two users asking for more workers than the set has share its threads: the set starts
    /// at most its size, and a user's count is capped by it.
    #[test]
    fn users_share_one_set_of_at_most_its_size() {
        let workers = Workers::new(3);
        let a = Pool::on(Arc::clone(&workers), 2).expect("a");
        assert_eq!((a.threads(), workers.started()), (2, 2));
        let b = Pool::on(Arc::clone(&workers), 8).expect("b");
        assert_eq!((b.threads(), workers.started()), (3, 3));
        assert!(matches!(
            Pool::on(Arc::clone(&workers), 0),
            Err(WorkerError::BadConfig(_))
        ));
        workers.shutdown();
    }

    /// Two jobs (two devices' staged copies, each through its own `Pool`) on one set at once:
    /// each job's calls run while
    /// the other's do (no lock around a whole job), and a job whose indices were not taken by
    /// the time its `main` returned does not wait for the other job's workers.
    #[test]
    fn two_jobs_run_side_by_side_and_untaken_indices_are_taken_back() {
        let workers = Workers::new(4);
        // One hand per device's stager (each takes its own turns).
        let pools = [
            Pool::on(Arc::clone(&workers), 2).expect("pool 0"),
            Pool::on(Arc::clone(&workers), 2).expect("pool 1"),
        ];
        let in_job = [AtomicUsize::new(0), AtomicUsize::new(0)];
        std::thread::scope(|s| {
            for j in 0..2 {
                let (pool, in_job) = (&pools[j], &in_job);
                s.spawn(move || {
                    pool.run_with(
                        2,
                        &|_| {
                            in_job[j].fetch_add(1, Ordering::SeqCst);
                            until("the other job running", || {
                                in_job[1 - j].load(Ordering::SeqCst) > 0
                            });
                        },
                        || {
                            // As a staged copy's coordinator waits for its workers' parts.
                            until("a call of this job", || {
                                in_job[j].load(Ordering::SeqCst) > 0
                            });
                            Ok::<(), WorkerError>(())
                        },
                    )
                    .expect("job");
                });
            }
        });
        // One worker held by a job that waits for a flag; a second job posted behind it with
        // no free worker returns once its `main` has (its index is taken back, never run).
        let one = Workers::new(1);
        let (holder, second) = (
            Pool::on(Arc::clone(&one), 1).expect("pool of one"),
            Pool::on(Arc::clone(&one), 1).expect("another pool of one"),
        );
        let (release, held, ran) = (
            AtomicBool::new(false),
            AtomicBool::new(false),
            AtomicBool::new(false),
        );
        std::thread::scope(|s| {
            s.spawn(|| {
                holder
                    .run_with(
                        1,
                        &|_| {
                            held.store(true, Ordering::SeqCst);
                            until("released", || release.load(Ordering::SeqCst));
                        },
                        || {
                            until("the worker held", || held.load(Ordering::SeqCst));
                            Ok::<(), WorkerError>(())
                        },
                    )
                    .expect("holding job");
            });
            until("the worker held", || held.load(Ordering::SeqCst));
            second
                .run_with(1, &|_| ran.store(true, Ordering::SeqCst), || {
                    Ok::<(), WorkerError>(())
                })
                .expect("second job");
            assert!(!ran.load(Ordering::SeqCst), "a taken-back index ran");
            assert_eq!(one.queued(), 0, "the second job's index is still queued");
            release.store(true, Ordering::SeqCst);
        });
        workers.shutdown();
        one.shutdown();
    }

    #[test]
    fn pool_reports_a_panicking_worker_and_keeps_working() {
        let workers = Workers::new(3);
        let pool = Pool::on(Arc::clone(&workers), 3).expect("pool");
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let started = AtomicUsize::new(0);
        let r = pool.run_with(
            2,
            &|i| {
                started.fetch_add(1, Ordering::SeqCst);
                assert!(i != 1, "worker 1 fails")
            },
            || {
                until("both started", || started.load(Ordering::SeqCst) == 2);
                Ok::<(), WorkerError>(())
            },
        );
        std::panic::set_hook(prev);
        assert!(matches!(r, Err(super::WorkerError::Panicked)), "{r:?}");
        let count = AtomicUsize::new(0);
        pool.run_with(
            3,
            &|_| {
                count.fetch_add(1, Ordering::Relaxed);
            },
            || {
                until("all three ran", || count.load(Ordering::Relaxed) == 3);
                Ok::<(), WorkerError>(())
            },
        )
        .expect("run after a panic");
        assert_eq!(count.load(Ordering::Relaxed), 3);
        assert_eq!(workers.started(), 3, "a panic cost a worker");
        workers.shutdown();
    }
}

/// Loom models of the workers (`scripts/loom.sh`): every interleaving, at most 4 preemptions,
/// of a job posted to two sleeping (or falling asleep) workers, the coordinator's `main`
/// beside them, the take-back of untaken indices and the join, a worker's panic and the
/// shutdown.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::{Pool, WorkerError, Workers};
    use crate::sync::atomic::{AtomicUsize, Ordering};
    use crate::sync::{model, Condvar, Mutex};
    use std::sync::Arc;

    /// The payload of the models' planned worker panic, which the panic hook keeps quiet.
    struct PlannedPanic;

    /// Keeps the planned panics from printing a message in every explored interleaving; any
    /// other panic still prints.
    fn quiet_planned_panics() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let prev = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if !info.payload().is::<PlannedPanic>() {
                    prev(info);
                }
            }));
        });
    }

    /// A count a job's calls raise and its `main` waits on (a staged copy's coordinator waits
    /// for its workers' parts the same way).
    struct Started {
        n: Mutex<usize>,
        cv: Condvar,
    }

    impl Started {
        fn new() -> Started {
            Started {
                n: Mutex::new(0),
                cv: Condvar::new(),
            }
        }
        fn raise(&self) {
            *self.n.lock().unwrap() += 1;
            self.cv.notify_all();
        }
        fn wait_for(&self, k: usize) {
            let mut n = self.n.lock().unwrap();
            while *n < k {
                n = self.cv.wait(n).unwrap();
            }
        }
    }

    /// A job of two indices on a set of two workers whose `main` waits for one call: every
    /// posted job is reached (a lost wake-up is a deadlock), each index runs at most once,
    /// `run_with` returns only after every call that started returned (their relaxed stores
    /// visible then, and none runs after: the shutdown's join changes nothing), and the
    /// workers stop and join.
    #[test]
    fn loom_a_job_runs_each_index_at_most_once_and_joins() {
        model(|| {
            let workers = Workers::new(2);
            let pool = Pool::on(Arc::clone(&workers), 2).unwrap();
            let hits = [AtomicUsize::new(0), AtomicUsize::new(0)];
            let started = Started::new();
            pool.run_with(
                2,
                &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                    started.raise();
                },
                || {
                    started.wait_for(1);
                    Ok::<(), WorkerError>(())
                },
            )
            .unwrap();
            let seen: Vec<usize> = hits.iter().map(|h| h.load(Ordering::Relaxed)).collect();
            assert!(seen.iter().all(|&h| h <= 1), "{seen:?}");
            assert_eq!(seen.iter().sum::<usize>(), *started.n.lock().unwrap());
            workers.shutdown();
            let after: Vec<usize> = hits.iter().map(|h| h.load(Ordering::Relaxed)).collect();
            assert_eq!(seen, after, "a call ran after its job returned");
        });
    }

    /// A worker panics in a job whose `main` waits for it: the job fails with `Panicked`, and
    /// the next job, whose `main` waits for its call, runs and succeeds: the panic left the
    /// workers and their queue whole.
    #[test]
    fn loom_a_panicking_worker_fails_the_job_and_the_pool_goes_on() {
        quiet_planned_panics();
        model(|| {
            let workers = Workers::new(2);
            let pool = Pool::on(Arc::clone(&workers), 2).unwrap();
            let started = Started::new();
            let r = pool.run_with(
                1,
                &|_| {
                    started.raise();
                    std::panic::panic_any(PlannedPanic);
                },
                || {
                    started.wait_for(1);
                    Ok::<(), WorkerError>(())
                },
            );
            assert!(matches!(r, Err(WorkerError::Panicked)), "{r:?}");
            let hits = AtomicUsize::new(0);
            let r = pool.run_with(
                1,
                &|_| {
                    hits.fetch_add(1, Ordering::Relaxed);
                    started.raise();
                },
                || {
                    started.wait_for(2);
                    Ok::<(), WorkerError>(())
                },
            );
            assert!(r.is_ok(), "{r:?}");
            assert_eq!(hits.load(Ordering::Relaxed), 1);
            workers.shutdown();
        });
    }
}
