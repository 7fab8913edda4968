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
//!
//! Wakers are the executor's code, run on whatever thread completes the slot (an engine's
//! worker, waiter or staging thread, or a thread that polls a request and finds it done), so
//! the slot runs them the way that cannot harm the engine:
//! - never under the slot's lock, nor under an engine lock: code that may complete a slot while
//!   it holds a lock (an engine's in-flight list pruning its done requests, a CUDA queue
//!   recording its last request's event) takes a [`HoldWakes`] guard first, and the wakers
//!   found meanwhile run when the thread's last guard drops, after the lock was released. A
//!   waker that submits on the same engine from inside `wake` (an executor that polls inline)
//!   then takes those locks again without deadlock.
//! - each one on its own: a waker that panics stops neither the wakers after it nor the thread
//!   that completed the slot (whose loss would leave the requests queued behind it pending for
//!   good). The panic hook has reported the panic; the slot drops it.

use super::RequestError;
use crate::sync::atomic::{seq_cst_handshake, AtomicBool, AtomicU8, Ordering};
use crate::sync::{Condvar, Mutex, MutexGuard, SPIN};
use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::Sender;
use std::sync::PoisonError;
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
    /// stress tests below cannot tell the two apart, the loom models (`loom_tests`) check the
    /// handshake, each side marked by [`seq_cst_handshake`].)
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
            seq_cst_handshake();
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

    /// Wakes the sleeping threads and the registered wakers (once: they are taken), the
    /// wakers after the slot's lock is released ([`wake_all`]: later still if this thread holds
    /// its wake-ups, each one guarded).
    fn wake(&self, mut st: MutexGuard<'_, State>) {
        let wakers = std::mem::take(&mut st.wakers);
        let sleepers = st.sleepers;
        drop(st);
        if sleepers > 0 {
            self.sleep.wake_all();
        }
        wake_all(wakers);
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
        seq_cst_handshake();
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
        while SPIN && Instant::now() < spin_until {
            if let Some(r) = self.get() {
                return r;
            }
            std::hint::spin_loop();
        }
        let mut st = self.lock();
        loop {
            // Flag first, then look (see `listeners`).
            self.listeners.store(true, Ordering::SeqCst);
            seq_cst_handshake();
            if let Some(r) = self.get_locked(&st) {
                return r;
            }
            st.sleepers += 1;
            st = self.sleep.wait(st).unwrap_or_else(PoisonError::into_inner);
            st.sleepers -= 1;
        }
    }
}

/// This thread's [`HoldWakes`] guards: how many are alive, and whether wakers were held.
#[derive(Clone, Copy)]
struct Hold {
    depth: usize,
    held: bool,
}

#[cfg(not(all(test, loom)))]
std::thread_local! {
    static HOLD: Cell<Hold> = const { Cell::new(Hold { depth: 0, held: false }) };
    /// The wakers held by this thread's guards, woken when the last one drops.
    static HELD: RefCell<Vec<Waker>> = const { RefCell::new(Vec::new()) };
}

// Loom runs its threads on one OS thread: its own thread-locals keep them apart.
#[cfg(all(test, loom))]
loom::thread_local! {
    static HOLD: Cell<Hold> = Cell::new(Hold { depth: 0, held: false });
    static HELD: RefCell<Vec<Waker>> = RefCell::new(Vec::new());
}

/// While alive, the wakers of the slots this thread completes are not woken but held, and
/// woken when the thread's last such guard drops. Take one before a lock under which a slot
/// may complete, and let it drop after the lock's guard (declare it first: locals drop in
/// reverse order; a struct's fields in their order), so that no waker runs under the lock.
/// Not `Send`: it counts on the thread that made it.
#[must_use = "wake-ups are held only while the guard lives"]
pub(crate) struct HoldWakes(PhantomData<*const ()>);

/// Holds this thread's wake-ups until the returned guard (and every other one of this thread)
/// drops ([`HoldWakes`]). Costs two thread-local accesses when nothing is held.
pub(crate) fn hold_wakes() -> HoldWakes {
    HOLD.with(|h| {
        let mut s = h.get();
        s.depth += 1;
        h.set(s);
    });
    HoldWakes(PhantomData)
}

impl Drop for HoldWakes {
    fn drop(&mut self) {
        let wake = HOLD.with(|h| {
            let mut s = h.get();
            s.depth -= 1;
            let wake = s.depth == 0 && s.held;
            if wake {
                s.held = false;
            }
            h.set(s);
            wake
        });
        if wake {
            let held = HELD.with(|w| std::mem::take(&mut *w.borrow_mut()));
            wake_each(held);
        }
    }
}

/// Wakes `wakers`: now, or, while this thread holds its wake-ups ([`hold_wakes`]), when it
/// stops; each one guarded ([`wake_each`]).
fn wake_all(wakers: Vec<Waker>) {
    if wakers.is_empty() {
        return;
    }
    let hold = HOLD.with(|h| {
        let mut s = h.get();
        if s.depth > 0 {
            s.held = true;
            h.set(s);
        }
        s.depth > 0
    });
    if hold {
        HELD.with(|w| w.borrow_mut().extend(wakers));
    } else {
        wake_each(wakers);
    }
}

/// Wakes each of `wakers`, every one even if one panics; the panics are dropped (the panic
/// hook has reported them), not passed to the thread that completed the slot.
fn wake_each(wakers: Vec<Waker>) {
    for w in wakers {
        let _ = catch_unwind(AssertUnwindSafe(|| w.wake()));
    }
}

/// Starts an engine's waiter thread for futures: it waits for each item sent to it, in the
/// order sent (`wait` completes the item's slot, which wakes its wakers). A `wait` that panics
/// (a bug) has its item settled by `settle` (given the panic as [`RequestError::Panicked`]: it
/// completes the slot once the item's work is done, never before, its buffers being freed
/// then), and the thread goes on with the next one: ended, it would leave every later item's
/// futures pending for good. Ends when every sender (the engine and its requests) is gone.
pub(crate) fn spawn_waiter<T: Send + 'static>(
    name: String,
    wait: fn(&T),
    settle: fn(&T, RequestError),
) -> std::io::Result<Sender<T>> {
    let (tx, rx) = std::sync::mpsc::channel::<T>();
    std::thread::Builder::new().name(name).spawn(move || {
        while let Ok(item) = rx.recv() {
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| wait(&item))) {
                let e = RequestError::Panicked {
                    op: "wait".into(),
                    msg: crate::op::panic_message(&p),
                };
                let _ = catch_unwind(AssertUnwindSafe(|| settle(&item, e)));
            }
        }
    })?;
    Ok(tx)
}

#[cfg(all(test, not(loom)))]
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

    /// Panics when woken (an executor's bug).
    struct Panics;
    impl Wake for Panics {
        fn wake(self: Arc<Self>) {
            panic!("waker panicked");
        }
    }

    /// Regression: a waker that panicked unwound out of `complete` into the thread completing
    /// the slot (an engine's thread), and the wakers registered after it were never woken.
    #[test]
    fn a_panicking_waker_stops_neither_the_others_nor_the_completer() {
        for result in [Ok(()), failed("x")] {
            let s = Arc::new(Slot::<Condvar>::new());
            let (a, b) = (Arc::new(Count::default()), Arc::new(Count::default()));
            s.register_waker(&Waker::from(Arc::clone(&a)));
            s.register_waker(&Waker::from(Arc::new(Panics)));
            s.register_waker(&Waker::from(Arc::clone(&b)));
            let sleeper = {
                let s = Arc::clone(&s);
                std::thread::spawn(move || s.wait())
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while s.lock().sleepers == 0 {
                assert!(Instant::now() < deadline, "the waiter never went to sleep");
                std::thread::sleep(Duration::from_millis(1));
            }
            let completed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                s.complete(result.clone())
            }));
            assert_eq!(completed.ok(), Some(result.clone()), "complete unwound");
            assert_eq!((a.get(), b.get()), (1, 1), "{result:?}");
            assert_eq!(sleeper.join().unwrap(), result);
        }
    }

    /// Wakers of slots completed while the thread holds its wake-ups run when the last hold
    /// ends, after the lock it guards was released; the slot itself is complete at once.
    #[test]
    fn held_wake_ups_run_when_the_last_hold_ends() {
        /// Counts, and checks that `lock` is free when woken.
        struct FreeLock(Arc<Mutex<()>>, AtomicUsize);
        impl Wake for FreeLock {
            fn wake(self: Arc<Self>) {
                assert!(self.0.try_lock().is_ok(), "woken under the lock");
                self.1.fetch_add(1, Ordering::SeqCst);
            }
        }
        let lock = Arc::new(Mutex::new(()));
        let w = Arc::new(FreeLock(Arc::clone(&lock), AtomicUsize::new(0)));
        let (s1, s2): (Slot, Slot) = (Slot::new(), Slot::new());
        s1.register_waker(&Waker::from(Arc::clone(&w)));
        s2.register_waker(&Waker::from(Arc::clone(&w)));
        s2.register_waker(&Waker::from(Arc::new(Panics)));
        {
            let _outer = hold_wakes();
            let guard = lock.lock().unwrap();
            {
                let _inner = hold_wakes();
                assert_eq!(s1.complete(Ok(())), Ok(()));
            }
            assert_eq!(s2.complete(failed("y")), failed("y"));
            assert_eq!(s1.get(), Some(Ok(())));
            assert_eq!(w.1.load(Ordering::SeqCst), 0, "woken while held");
            drop(guard);
        }
        assert_eq!(w.1.load(Ordering::SeqCst), 2);
        // Nothing held any more: a completion wakes at once.
        let s3: Slot = Slot::new();
        s3.register_waker(&Waker::from(Arc::clone(&w)));
        assert_eq!(s3.complete(Ok(())), Ok(()));
        assert_eq!(w.1.load(Ordering::SeqCst), 3);
    }

    /// A waiter thread whose `wait` panics settles that item and goes on with the next ones.
    #[test]
    fn waiter_thread_survives_a_panicking_wait() {
        type Item = (u32, Arc<Slot>);
        let tx = spawn_waiter::<Item>(
            "slot-test-waiter".into(),
            |(i, s)| {
                assert!(*i != 1, "wait {i} panicked");
                let _ = s.complete(Ok(()));
            },
            |(_, s), e| {
                let _ = s.complete(Err(e));
            },
        )
        .unwrap();
        let slots: Vec<Arc<Slot>> = (0..3).map(|_| Arc::new(Slot::new())).collect();
        for (i, s) in slots.iter().enumerate() {
            tx.send((i as u32, Arc::clone(s))).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while slots.iter().any(|s| s.get().is_none()) {
            assert!(Instant::now() < deadline, "an item was never settled");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(slots[0].get(), Some(Ok(())));
        assert_eq!(
            slots[1].get(),
            Some(Err(RequestError::Panicked {
                op: "wait".into(),
                msg: "wait 1 panicked".into()
            }))
        );
        assert_eq!(slots[2].get(), Some(Ok(())));
    }

    #[test]
    fn waiter_thread_waits_in_order() {
        let done = Arc::new(Mutex::new(Vec::new()));
        type Item = (u32, Arc<Mutex<Vec<u32>>>);
        let tx = spawn_waiter::<Item>(
            "slot-test-waiter".into(),
            |(i, d)| d.lock().unwrap().push(*i),
            |_, _| {},
        )
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

/// Loom models of the slot (`scripts/loom.sh`): every interleaving, at most 4 preemptions, of
/// a completion against a waker's registration, a sleeping waiter, another completion.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::atomic::AtomicUsize;
    use crate::sync::{model, thread};
    use std::sync::Arc;
    use std::task::Wake;

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn failed() -> Result<(), RequestError> {
        Err(RequestError::Io("loom".into()))
    }

    /// A success (lock-free unless someone listens) against a waker's registration: the waker
    /// is woken exactly once, by one side or the other.
    #[test]
    fn loom_success_against_a_waker_wakes_it_once() {
        model(|| {
            let s = Arc::new(Slot::<()>::new());
            let c = Arc::new(Count::default());
            let t = {
                let s = Arc::clone(&s);
                thread::spawn(move || s.complete(Ok(())))
            };
            s.register_waker(&Waker::from(Arc::clone(&c)));
            assert_eq!(t.join().unwrap(), Ok(()));
            assert_eq!(c.0.load(Ordering::SeqCst), 1);
            assert_eq!(s.get(), Some(Ok(())));
        });
    }

    /// A failure (under the lock) against a waker's registration.
    #[test]
    fn loom_failure_against_a_waker_wakes_it_once() {
        model(|| {
            let s = Arc::new(Slot::<()>::new());
            let c = Arc::new(Count::default());
            let t = {
                let s = Arc::clone(&s);
                thread::spawn(move || s.complete(failed()))
            };
            s.register_waker(&Waker::from(Arc::clone(&c)));
            assert_eq!(t.join().unwrap(), failed());
            assert_eq!(c.0.load(Ordering::SeqCst), 1);
            assert_eq!(s.get(), Some(failed()));
        });
    }

    /// A success against a thread going to sleep on the slot: the sleeper always wakes (loom
    /// fails a model whose thread blocks for good).
    #[test]
    fn loom_success_against_a_sleeping_waiter_wakes_it() {
        model(|| {
            let s = Arc::new(Slot::<Condvar>::new());
            let t = {
                let s = Arc::clone(&s);
                thread::spawn(move || s.wait())
            };
            assert_eq!(s.complete(Ok(())), Ok(()));
            assert_eq!(t.join().unwrap(), Ok(()));
        });
    }

    /// A success against a waiter and a waker at once (three threads).
    #[test]
    fn loom_success_against_a_waiter_and_a_waker() {
        model(|| {
            let s = Arc::new(Slot::<Condvar>::new());
            let c = Arc::new(Count::default());
            let waiter = {
                let s = Arc::clone(&s);
                thread::spawn(move || s.wait())
            };
            let completer = {
                let s = Arc::clone(&s);
                thread::spawn(move || s.complete(Ok(())))
            };
            s.register_waker(&Waker::from(Arc::clone(&c)));
            assert_eq!(completer.join().unwrap(), Ok(()));
            assert_eq!(waiter.join().unwrap(), Ok(()));
            assert_eq!(c.0.load(Ordering::SeqCst), 1);
        });
    }

    /// Two completions racing (a success, lock-free, and a failure, under the lock) with a
    /// sleeping waiter: one result wins, and both callers, the waiter and every later look
    /// agree on it.
    #[test]
    fn loom_racing_completions_agree_on_one_result() {
        model(|| {
            let s = Arc::new(Slot::<Condvar>::new());
            let waiter = {
                let s = Arc::clone(&s);
                thread::spawn(move || s.wait())
            };
            let ok = {
                let s = Arc::clone(&s);
                thread::spawn(move || s.complete(Ok(())))
            };
            let bad = s.complete(failed());
            let ok = ok.join().unwrap();
            let now = s.get().expect("complete");
            assert_eq!(ok, now);
            assert_eq!(bad, now);
            assert_eq!(waiter.join().unwrap(), now);
        });
    }
}
