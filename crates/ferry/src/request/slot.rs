//! The completion slot every engine's completion is built on (CPU, CUDA, NCCL, files): the
//! result (the first one set wins), the wakers of the futures waiting for it and, for
//! completions signalled from host threads, the threads asleep on it.
//!
//! Two kinds of waiting, chosen by the slot's [`Sleep`] parameter:
//! - `Slot<Condvar>` ([`Signal`](super::Signal)): work finished by host threads; a waiting
//!   thread spins briefly, then sleeps on the condition variable. Completion wakes it only if a
//!   thread is asleep (a wake-up is a system call even with nobody to wake, a large part of a
//!   small copy).
//! - `Slot<()>` (CUDA and NCCL requests): waiting threads block in the driver
//!   (`cuEventSynchronize`) or poll it, never on the slot, so the slot has no condition variable
//!   and completion pays no futex wake-up. Futures are woken by the engine's waiter thread
//!   ([`spawn_waiter`]), which the first registered waker starts waiting.

use super::RequestError;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::{Duration, Instant};

/// How threads waiting on a [`Slot`] sleep: `()` where they wait elsewhere (in the driver),
/// [`Condvar`] where they sleep on the slot.
pub(crate) trait Sleep: Default + Send + Sync {
    /// Wakes every thread asleep on the slot (called only when one is).
    fn wake_all(&self);
}

impl Sleep for () {
    fn wake_all(&self) {}
}

impl Sleep for Condvar {
    fn wake_all(&self) {
        self.notify_all();
    }
}

/// A request's completion: result, wakers, sleepers, under one lock, and the state of the
/// result beside it ([`Done`]) so that asking a pending or successful slot takes no lock.
/// Stored inline in the completion that owns it (no allocation of its own).
#[derive(Default)]
pub(crate) struct Slot<S: Sleep = ()> {
    state: Mutex<State>,
    /// [`Done`] as a number, read without the lock by `get`. A success is set by one
    /// compare-and-swap, without the lock (the result of nearly every request: a CUDA request's
    /// completion then costs no lock, on the path between its copy's end and its caller's
    /// return); a failure is set under the lock, after its error. A CUDA request's slot is asked
    /// 4-5 times in its life (at the start of its wait, by the scope's barrier, the engine's
    /// list's pruning, its drop).
    done: AtomicU8,
    /// Set (under the lock) once a waker was registered or a thread went to sleep on the slot:
    /// a success then takes the lock to wake them. Both sides use `SeqCst` on `done` and on
    /// this flag, each writing its own and then reading the other's, so at least one sees the
    /// other: either the completion sees the flag and wakes, or the registration (or the thread
    /// about to sleep) sees the result and does not wait. (Release/Acquire would not do: each
    /// side's store must be ordered before its own later load, which only `SeqCst` orders; the
    /// stress tests below cannot tell the two apart.)
    listeners: AtomicBool,
    sleep: S,
}

/// What [`Slot::done`] says.
#[repr(u8)]
enum Done {
    /// No result yet.
    Pending = 0,
    /// Succeeded: `get` answers without the lock.
    Ok = 1,
    /// Failed: the error is read under the lock.
    Failed = 2,
}

#[derive(Default)]
struct State {
    /// A failure's error (a success is only [`Slot::done`]).
    result: Option<Result<(), RequestError>>,
    wakers: Vec<Waker>,
    /// Threads asleep on the slot's condition variable (always 0 for `Slot<()>`): counted
    /// under the lock that `complete` takes before it reads the count, so a completion after a
    /// thread went to sleep sees it and wakes it.
    sleepers: usize,
    /// Set by the first waker registered while pending: the owner then arranges for someone to
    /// complete the slot (the engine's waiter thread).
    watched: bool,
}

impl<S: Sleep> Slot<S> {
    /// A slot not yet completed.
    pub(crate) fn new() -> Slot<S> {
        Slot::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Completes the slot: the first result wins, and is returned (this one or an earlier
    /// one). Wakes every registered waker once, and the sleeping threads if there are any.
    pub(crate) fn complete(&self, result: Result<(), RequestError>) -> Result<(), RequestError> {
        if result.is_ok() {
            // The lock-free path: one compare-and-swap; the lock only if someone listens.
            if self
                .done
                .compare_exchange(
                    Done::Pending as u8,
                    Done::Ok as u8,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_err()
            {
                return self.get().unwrap_or(Ok(()));
            }
            if self.listeners.load(Ordering::SeqCst) {
                self.wake(self.lock());
            }
            return Ok(());
        }
        let mut st = self.lock();
        if let Some(prev) = self.get_locked(&st) {
            return prev;
        }
        st.result = Some(result.clone());
        // Release (SeqCst): a `get` that sees it takes the lock, so it sees the error.
        if self
            .done
            .compare_exchange(
                Done::Pending as u8,
                Done::Failed as u8,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_err()
        {
            // A success won meanwhile (it takes no lock).
            st.result = None;
            return Ok(());
        }
        self.wake(st);
        result
    }

    /// Wakes the registered wakers (once: they are taken) and the sleeping threads.
    fn wake(&self, mut st: MutexGuard<'_, State>) {
        let wakers = std::mem::take(&mut st.wakers);
        let sleepers = st.sleepers;
        drop(st);
        if sleepers > 0 {
            self.sleep.wake_all();
        }
        for w in wakers {
            w.wake();
        }
    }

    /// [`Slot::get`] with the lock held.
    fn get_locked(&self, st: &State) -> Option<Result<(), RequestError>> {
        match self.done.load(Ordering::SeqCst) {
            d if d == Done::Pending as u8 => None,
            d if d == Done::Ok as u8 => Some(Ok(())),
            _ => st.result.clone(),
        }
    }

    /// The result once complete; never blocks (takes the slot's lock only for a failure).
    /// Inlined: a CUDA request asks 4-5 times in its life, nearly always pending or successful.
    #[inline]
    pub(crate) fn get(&self) -> Option<Result<(), RequestError>> {
        match self.done.load(Ordering::Acquire) {
            d if d == Done::Pending as u8 => None,
            d if d == Done::Ok as u8 => Some(Ok(())),
            _ => self.failure(),
        }
    }

    /// [`Slot::get`] of a failed slot: the error, read under the lock.
    #[cold]
    fn failure(&self) -> Option<Result<(), RequestError>> {
        self.lock().result.clone()
    }

    /// Arranges for `waker` to be woken on completion; wakes it at once if complete. Returns
    /// true exactly once, for the first waker registered while pending: the caller then
    /// arranges for the slot to be completed (a waiter thread) if nothing else will.
    pub(crate) fn register_waker(&self, waker: &Waker) -> bool {
        let mut st = self.lock();
        if !st.wakers.iter().any(|w| w.will_wake(waker)) {
            st.wakers.push(waker.clone());
        }
        // Flag first, then look (see `listeners`): a success that did not see the flag is
        // seen here.
        self.listeners.store(true, Ordering::SeqCst);
        if self.get_locked(&st).is_some() {
            st.wakers.retain(|w| !w.will_wake(waker));
            drop(st);
            waker.wake_by_ref();
            return false;
        }
        !std::mem::replace(&mut st.watched, true)
    }
}

impl Slot<Condvar> {
    /// Blocks until complete. A short spin first: work that finishes within microseconds (a
    /// small copy on another thread) then costs no sleep and wake-up, which is tens of
    /// microseconds on some VMs. Then it sleeps on the condition variable.
    pub(crate) fn wait(&self) -> Result<(), RequestError> {
        if let Some(r) = self.get() {
            return r;
        }
        let spin_until = Instant::now() + Duration::from_micros(20);
        while Instant::now() < spin_until {
            if let Some(r) = self.get() {
                return r;
            }
            std::hint::spin_loop();
        }
        let mut st = self.lock();
        loop {
            // Flag first, then look (see `listeners`).
            self.listeners.store(true, Ordering::SeqCst);
            if let Some(r) = self.get_locked(&st) {
                return r;
            }
            st.sleepers += 1;
            st = self.sleep.wait(st).unwrap_or_else(PoisonError::into_inner);
            st.sleepers -= 1;
        }
    }
}

/// Starts an engine's waiter thread for futures: it waits for each item sent to it, in the
/// order sent (`wait` completes the item's slot, which wakes its wakers). Ends when every
/// sender (the engine and its requests) is gone.
pub(crate) fn spawn_waiter<T: Send + 'static>(
    name: String,
    wait: fn(&T),
) -> std::io::Result<Sender<T>> {
    let (tx, rx) = std::sync::mpsc::channel::<T>();
    std::thread::Builder::new().name(name).spawn(move || {
        while let Ok(item) = rx.recv() {
            wait(&item);
        }
    })?;
    Ok(tx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::task::Wake;

    #[derive(Default)]
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    impl Count {
        fn get(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// A `Sleep` that counts its wake-ups (nobody sleeps on it).
    #[derive(Default)]
    struct Wakes(AtomicUsize);
    impl Sleep for Wakes {
        fn wake_all(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn failed(msg: &str) -> Result<(), RequestError> {
        Err(RequestError::Io(msg.into()))
    }

    #[test]
    fn first_result_wins() {
        let s: Slot = Slot::new();
        assert_eq!(s.get(), None);
        assert_eq!(s.complete(failed("first")), failed("first"));
        assert_eq!(s.complete(Ok(())), failed("first"));
        assert_eq!(s.get(), Some(failed("first")));
    }

    #[test]
    fn get_answers_without_the_lock_unless_failed() {
        let ok: Slot = Slot::new();
        let guard = ok.lock();
        // Pending and successful slots are answered while another thread holds the lock.
        assert_eq!(ok.get(), None);
        drop(guard);
        assert_eq!(ok.complete(Ok(())), Ok(()));
        let guard = ok.lock();
        assert_eq!(ok.get(), Some(Ok(())));
        drop(guard);
        // A failure's error is read under the lock, and a later result does not change it.
        let bad: Slot = Slot::new();
        assert_eq!(bad.complete(failed("x")), failed("x"));
        assert_eq!(bad.complete(Ok(())), failed("x"));
        assert_eq!(bad.get(), Some(failed("x")));
        assert_eq!(bad.done.load(Ordering::Acquire), Done::Failed as u8);
    }

    #[test]
    fn completion_seen_across_threads() {
        let s = Arc::new(Slot::<()>::new());
        let t = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || loop {
                if let Some(r) = s.get() {
                    break r;
                }
                std::hint::spin_loop();
            })
        };
        assert_eq!(s.complete(Ok(())), Ok(()));
        assert_eq!(t.join().unwrap(), Ok(()));
    }

    #[test]
    fn wakers_woken_once() {
        let s: Slot = Slot::new();
        let (a, b) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let (wa, wb) = (Waker::from(Arc::clone(&a)), Waker::from(Arc::clone(&b)));
        // Only the first registration asks for a watcher; a waker registered twice is kept once.
        assert!(s.register_waker(&wa));
        assert!(!s.register_waker(&wa));
        assert!(!s.register_waker(&wb));
        assert_eq!((a.get(), b.get()), (0, 0));
        assert_eq!(s.complete(Ok(())), Ok(()));
        assert_eq!((a.get(), b.get()), (1, 1));
        assert_eq!(s.complete(failed("late")), Ok(()));
        assert_eq!((a.get(), b.get()), (1, 1));
        // Registered after completion: woken at once, no watcher needed.
        assert!(!s.register_waker(&wa));
        assert_eq!(a.get(), 2);
    }

    #[test]
    fn no_wake_up_without_sleepers() {
        let s: Slot<Wakes> = Slot::new();
        let c = Arc::new(Count::default());
        s.register_waker(&Waker::from(Arc::clone(&c)));
        assert_eq!(s.complete(Ok(())), Ok(()));
        assert_eq!(c.get(), 1);
        assert_eq!(
            s.sleep.0.load(Ordering::SeqCst),
            0,
            "nobody slept: no wake-up"
        );
    }

    #[test]
    fn sleeping_waiter_is_woken() {
        let s = Arc::new(Slot::<Condvar>::new());
        let t = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || s.wait())
        };
        // Wait until the waiter is asleep on the condition variable (past its spin).
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.lock().sleepers == 0 {
            assert!(Instant::now() < deadline, "the waiter never went to sleep");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(s.complete(failed("done")), failed("done"));
        assert_eq!(t.join().unwrap(), failed("done"));
        assert_eq!(s.lock().sleepers, 0);
        // Already complete: returns at once.
        assert_eq!(s.wait(), failed("done"));
    }

    /// A success takes no lock: a waker registered at the same moment, or a thread going to
    /// sleep at the same moment, is still woken (or sees the result), every time.
    #[test]
    fn lock_free_success_never_loses_a_waker_or_a_sleeper() {
        for round in 0..2000 {
            let s = Arc::new(Slot::<Condvar>::new());
            let c = Arc::new(Count::default());
            let waker = Waker::from(Arc::clone(&c));
            let sleeper = {
                let s = Arc::clone(&s);
                std::thread::spawn(move || s.wait())
            };
            let completer = {
                let s = Arc::clone(&s);
                std::thread::spawn(move || {
                    if round % 3 == 0 {
                        std::thread::yield_now();
                    }
                    s.complete(Ok(()))
                })
            };
            s.register_waker(&waker);
            assert_eq!(completer.join().unwrap(), Ok(()), "round {round}");
            assert_eq!(sleeper.join().unwrap(), Ok(()), "round {round}");
            assert!(c.get() >= 1, "round {round}: the waker was never woken");
            assert_eq!(s.get(), Some(Ok(())));
            // A later failure does not replace the success.
            assert_eq!(s.complete(failed("late")), Ok(()));
        }
    }

    /// A success and a failure racing: exactly one wins, and every later look agrees with it.
    /// Both threads are running before either completes (the success thread says it is ready,
    /// then both wait for a shared flag: on a loaded two-core machine a freshly spawned thread
    /// was otherwise often not yet scheduled, and the failure won every round), and each side
    /// waits a varying spin, so that the success also lands while the failure holds the lock
    /// with its error set (the failure then gives way). With two cores or more, rounds go on
    /// until each outcome was seen often; with one (the two threads never run at once, and the
    /// failure nearly always completes first) 2,000 rounds check only that all looks agree.
    #[test]
    fn racing_success_and_failure_agree_on_one_result() {
        /// Waits for `flag` to read `want`, spinning a little, then yielding (one free core).
        fn until(flag: &AtomicUsize, want: usize) {
            let mut spins = 0u32;
            while flag.load(Ordering::Acquire) != want {
                spins += 1;
                if spins < 1000 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut won = [0usize; 2];
        let mut round = 0u32;
        while round < 2_000 || (cores > 1 && won.iter().any(|&n| n < 50)) {
            assert!(round < 200_000, "one outcome always wins: {won:?}");
            let s = Arc::new(Slot::<()>::new());
            let go = Arc::new(AtomicUsize::new(0));
            let ok = {
                let (s, go) = (Arc::clone(&s), Arc::clone(&go));
                std::thread::spawn(move || {
                    go.store(1, Ordering::Release);
                    until(&go, 2);
                    for _ in 0..round % 64 {
                        std::hint::spin_loop();
                    }
                    s.complete(Ok(()))
                })
            };
            until(&go, 1);
            go.store(2, Ordering::Release);
            for _ in 0..(round / 64) % 64 {
                std::hint::spin_loop();
            }
            let bad = s.complete(failed("racing"));
            let ok = ok.join().unwrap();
            let now = s.get().expect("complete");
            assert_eq!(ok, now, "round {round}");
            assert_eq!(bad, now, "round {round}");
            won[usize::from(now.is_ok())] += 1;
            round += 1;
        }
    }

    /// A success (the lock-free path) wakes a thread asleep on the condition variable.
    #[test]
    fn success_wakes_a_sleeping_waiter() {
        let s = Arc::new(Slot::<Condvar>::new());
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let s = Arc::clone(&s);
            std::thread::spawn(move || tx.send(s.wait()));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.lock().sleepers == 0 {
            assert!(Instant::now() < deadline, "the waiter never went to sleep");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(s.complete(Ok(())), Ok(()));
        let woken = rx.recv_timeout(Duration::from_secs(10));
        assert_eq!(woken, Ok(Ok(())), "the sleeping waiter was not woken");
    }

    #[test]
    fn waiter_thread_waits_in_order() {
        let done = Arc::new(Mutex::new(Vec::new()));
        type Item = (u32, Arc<Mutex<Vec<u32>>>);
        let tx = spawn_waiter::<Item>("slot-test-waiter".into(), |(i, d)| {
            d.lock().unwrap().push(*i)
        })
        .unwrap();
        for i in 0..3 {
            tx.send((i, Arc::clone(&done))).unwrap();
        }
        drop(tx);
        let deadline = Instant::now() + Duration::from_secs(10);
        while done.lock().unwrap().len() < 3 {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*done.lock().unwrap(), [0, 1, 2]);
    }
}
