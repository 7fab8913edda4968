//! The staging workers' fork-join pool. `run_with(n, f, main)` calls `f(i)` on worker `i` for
//! `i` in `0..n` (only those are woken, always the same low-numbered ones), runs `main` on the
//! calling thread meanwhile, and returns when all `n` have returned. It runs one job at a time:
//! a second `run_with`, from another thread, waits for the first to return. The staged path
//! (`engine/cuda/paths/staged/`) runs its chunk loop on it.
//!
//! Why a fork-join pool and not a queue of independent tasks (the CPU engine's
//! `engine/cpu/pool.rs`, the file engine's `file/exec.rs`, the fill queue of `fill.rs`): a
//! staged copy needs `n` workers running one job at the same time, side by side with the
//! coordinating thread, and it must wake exactly those `n`, always the same warm ones. Each
//! worker sleeps on its own condition variable for that: with one shared condition variable,
//! waking 4 of 12 workers rotated through all twelve, each waking cold, and 1-8 MiB staged
//! copies ran as slowly as with all twelve (H200 run 28, commit a7006da); waking workers 0..n
//! gave 1.09-1.15x the driver's pageable path at 4-8 MiB host -> device (run 29, see
//! [`workers_for`](super::policy::workers_for)).

use super::WorkerError;
use crate::sync::thread::{self, JoinHandle};
use crate::sync::{Condvar, Mutex};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

type Job = dyn Fn(usize) + Sync;

struct PoolState {
    generation: u64,
    job: Option<*const Job>,
    /// Workers the current job wants: those numbered 0..wanted.
    wanted: usize,
    remaining: usize,
    panicked: bool,
    shutdown: bool,
}

// SAFETY: the raw job pointer is only dereferenced while `Pool::run` (which owns the borrow)
// waits for every worker to finish with it.
unsafe impl Send for PoolState {}

struct PoolShared {
    state: Mutex<PoolState>,
    /// One per worker, so that a job wakes exactly the workers it wants.
    work: Vec<Condvar>,
    done: Condvar,
}

/// The persistent fork-join pool of a staged copier (`Stager`); see the module documentation.
pub(crate) struct Pool {
    shared: Arc<PoolShared>,
    handles: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

impl Pool {
    pub(crate) fn new(threads: usize) -> Result<Pool, WorkerError> {
        let shared = Arc::new(PoolShared {
            state: Mutex::new(PoolState {
                generation: 0,
                job: None,
                wanted: 0,
                remaining: 0,
                panicked: false,
                shutdown: false,
            }),
            work: (0..threads).map(|_| Condvar::new()).collect(),
            done: Condvar::new(),
        });
        let mut pool = Pool {
            shared: shared.clone(),
            handles: Vec::with_capacity(threads),
            run_lock: Mutex::new(()),
        };
        for i in 0..threads {
            let sh = shared.clone();
            let h = thread::Builder::new()
                .name(format!("ferry-stage-{i}"))
                .spawn(move || Pool::worker(sh, i))
                .map_err(WorkerError::Spawn)?;
            pool.handles.push(h);
        }
        Ok(pool)
    }

    pub(crate) fn threads(&self) -> usize {
        self.handles.len()
    }

    fn worker(sh: Arc<PoolShared>, index: usize) {
        let mut seen = 0u64;
        loop {
            // Worker `index` runs each job that wants it once. `run_with` wakes it through its
            // own condition variable; if it was not asleep then, it sees the job here before it
            // sleeps again.
            let job = {
                let mut st = sh.state.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if st.shutdown {
                        return;
                    }
                    if st.generation != seen {
                        seen = st.generation;
                        if index < st.wanted {
                            break st.job;
                        }
                    }
                    st = sh.work[index].wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            let ok = match job {
                // SAFETY: `run` keeps the closure alive until `remaining` reaches 0, which
                // happens only after this call returns.
                Some(j) => catch_unwind(AssertUnwindSafe(|| unsafe { (*j)(index) })).is_ok(),
                None => true,
            };
            let mut st = sh.state.lock().unwrap_or_else(|e| e.into_inner());
            st.panicked |= !ok;
            st.remaining -= 1;
            if st.remaining == 0 {
                sh.done.notify_all();
            }
        }
    }

    /// Runs `f(i)` for each `i` in `0..n` on `n` workers (at most all of them) while `main`
    /// runs on the calling thread, then waits for those workers (after one job of another
    /// thread, if one is running). Returns `main`'s error first, else [`WorkerError::Panicked`] if a
    /// worker panicked. If `main` panics, the panic goes on once the workers have returned:
    /// `f` must then return without `main` (the staged pipeline's workers watch a stop flag
    /// that its coordinator sets when it fails or panics), else this waits forever.
    pub(crate) fn run_with<E: From<WorkerError>>(
        &self,
        n: usize,
        f: &(dyn Fn(usize) + Sync),
        main: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        let n = n.clamp(1, self.handles.len());
        let _turn = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: erases the borrow's lifetime; the pointer is used only until every worker has
        // decremented `remaining`, which this function waits for before returning (also when
        // `main` panics: the guard below waits in its drop).
        let ptr: *const Job =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Job>(f) };
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.job = Some(ptr);
            st.wanted = n;
            st.remaining = n;
            st.panicked = false;
            st.generation += 1;
        }
        // Only the workers wanted, and always the same ones (0..n): waking 4 of 12 workers
        // through one shared condition variable rotated through all twelve, each waking cold,
        // and left 1-8 MiB staged copies as slow as with all twelve (H200 run 28).
        for w in &self.shared.work[..n] {
            w.notify_one();
        }
        /// Waits for every worker to be done with the job, also when `main` panics.
        struct Finish<'a>(&'a PoolShared);
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
                while st.remaining > 0 {
                    st = self.0.done.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                st.job = None;
            }
        }
        let finish = Finish(&self.shared);
        let r = main();
        drop(finish);
        let panicked = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .panicked;
        r?;
        if panicked {
            return Err(WorkerError::Panicked.into());
        }
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.shutdown = true;
            for w in &self.shared.work {
                w.notify_one();
            }
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Pool, WorkerError};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    #[test]
    fn pool_runs_each_index_once_on_distinct_workers() {
        let pool = Pool::new(6).expect("pool");
        for round in 0..3000usize {
            // Every count from 1 to past the pool's size, in a changing order.
            let want = (round * 7) % 9 + 1;
            let n = want.min(6);
            let hits: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
            let threads = Mutex::new(Vec::new());
            let main_ran = AtomicUsize::new(0);
            pool.run_with(
                want,
                &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                    // Index i always runs on worker i (the same warm threads every time).
                    assert_eq!(
                        std::thread::current().name(),
                        Some(format!("ferry-stage-{i}").as_str())
                    );
                    threads
                        .lock()
                        .expect("lock")
                        .push(std::thread::current().id());
                },
                || {
                    main_ran.fetch_add(1, Ordering::Relaxed);
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
    }

    #[test]
    fn pool_reports_a_panicking_worker_and_keeps_working() {
        let pool = Pool::new(3).expect("pool");
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = pool.run_with(2, &|i| assert!(i != 1, "worker 1 fails"), || {
            Ok::<(), WorkerError>(())
        });
        std::panic::set_hook(prev);
        assert!(matches!(r, Err(super::WorkerError::Panicked)), "{r:?}");
        let count = AtomicUsize::new(0);
        pool.run_with(
            3,
            &|_| {
                count.fetch_add(1, Ordering::Relaxed);
            },
            || Ok::<(), WorkerError>(()),
        )
        .expect("run after a panic");
        assert_eq!(count.load(Ordering::Relaxed), 3);
    }
}

/// Loom models of the pool (`scripts/loom.sh`): every interleaving, at most 4 preemptions, of a
/// job handed to two workers, the coordinator's `main` beside them, the join, a worker's panic
/// and the shutdown.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::{Pool, WorkerError};
    use crate::sync::atomic::{AtomicUsize, Ordering};
    use crate::sync::{model, thread};

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

    /// A job on both workers of a 2-worker pool with `main` running meanwhile: `run_with`
    /// returns only after each index ran exactly once, on its own worker, and `main` once, and
    /// their effects (relaxed stores) are visible to the caller then: the join publishes them.
    /// Dropping the pool ends and joins both workers (a lost shutdown wake-up is a deadlock).
    #[test]
    fn loom_a_job_runs_each_index_once_and_joins() {
        model(|| {
            let pool = Pool::new(2).unwrap();
            let hits = [AtomicUsize::new(0), AtomicUsize::new(0)];
            let main_ran = AtomicUsize::new(0);
            pool.run_with(
                2,
                &|i| {
                    assert_eq!(
                        thread::current().name(),
                        Some(format!("ferry-stage-{i}").as_str())
                    );
                    hits[i].fetch_add(1, Ordering::Relaxed);
                },
                || {
                    main_ran.fetch_add(1, Ordering::Relaxed);
                    Ok::<(), WorkerError>(())
                },
            )
            .unwrap();
            assert_eq!(main_ran.load(Ordering::Relaxed), 1);
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), 1);
            }
            drop(pool);
        });
    }

    /// Worker 1 panics in a job on both workers: the job fails with `WorkerPanicked` only once
    /// both workers are done (worker 0's effect is visible), and the next job, on one worker,
    /// runs and succeeds: the panic left the pool's state whole.
    #[test]
    fn loom_a_panicking_worker_fails_the_job_and_the_pool_goes_on() {
        quiet_planned_panics();
        model(|| {
            let pool = Pool::new(2).unwrap();
            let hits = AtomicUsize::new(0);
            let r = pool.run_with(
                2,
                &|i| {
                    if i == 1 {
                        std::panic::panic_any(PlannedPanic);
                    }
                    hits.fetch_add(1, Ordering::Relaxed);
                },
                || Ok::<(), WorkerError>(()),
            );
            assert!(matches!(r, Err(WorkerError::Panicked)), "{r:?}");
            assert_eq!(hits.load(Ordering::Relaxed), 1);
            let r = pool.run_with(
                1,
                &|_| {
                    hits.fetch_add(1, Ordering::Relaxed);
                },
                || Ok::<(), WorkerError>(()),
            );
            assert!(r.is_ok(), "{r:?}");
            assert_eq!(hits.load(Ordering::Relaxed), 2);
            drop(pool);
        });
    }
}
