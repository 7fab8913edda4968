//! The CPU engine's queue and worker threads.
//!
//! Kept apart from the host staging subsystem's workers (`staging/workers.rs`, `fill.rs`) for
//! its own mechanism: here a thread that waits for a request runs that request's queued chunks
//! itself (and a zero-thread pool runs everything on its callers), which is sound only because
//! a chunk never blocks; the file engine's pool (`file/exec.rs`) runs tasks that block on
//! `pread`/`pwrite` and on its bounce slots, and the staging workers run one job on workers
//! `0..n` at once, woken by index, or pieces of queued fills.

use super::config::CpuConfig;
use super::exec;
use crate::engine::{Job, SubmitError};
use crate::memory::RawBuf;
use crate::op::{Op, Step};
use crate::request::{Completion, Request, RequestError, Signal};
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::thread::{self, JoinHandle};
use crate::sync::{Condvar, Mutex, MutexGuard};
use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, PoisonError};
use std::task::Waker;

pub(super) struct Pool {
    state: Mutex<State>,
    cond: Condvar,
    threads: usize,
    /// Cores of the machine: a copy is split into at most this many parts.
    cores: usize,
    live: AtomicUsize,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Task>,
    shutdown: bool,
}

/// A request's shared state: its buffers, the chunks still to run, its first error.
struct JobState {
    dst: RawBuf,
    src: Option<RawBuf>,
    /// The request writes more than [`CpuConfig::stream_bytes`]: its transposes write past the
    /// caches (`exec::run_step`). False for a custom op (lowered later, on a worker).
    stream: bool,
    remaining: AtomicUsize,
    error: Mutex<Option<RequestError>>,
    signal: Arc<Signal>,
}

// SAFETY: RawBuf holds plain addresses; the submitter guaranteed (Engine::submit_raw's
// contract) that the memory stays valid and unshared until the request completes, so moving
// the addresses to worker threads is sound.
unsafe impl Send for JobState {}
// SAFETY: as above; the mutable parts are atomics and mutexes.
unsafe impl Sync for JobState {}

enum Task {
    /// Wait for dependencies, build the program if the op is custom, then fan out chunks.
    Start {
        job: Box<Job>,
        prog: Option<Vec<Step>>,
        state: Arc<JobState>,
        parts: usize,
        chunk: usize,
    },
    /// Run these steps.
    Chunk {
        state: Arc<JobState>,
        steps: Vec<Step>,
    },
}

impl Pool {
    pub(super) fn start(threads: usize, cores: usize) -> std::io::Result<Arc<Pool>> {
        let pool = Arc::new(Pool {
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            threads,
            cores: cores.max(1),
            live: AtomicUsize::new(0),
            handles: Mutex::new(Vec::new()),
        });
        for i in 0..threads {
            let p = Arc::clone(&pool);
            match thread::Builder::new()
                .name(format!("ferry-cpu-{i}"))
                .spawn(move || p.worker())
            {
                Ok(h) => {
                    pool.live.fetch_add(1, Ordering::AcqRel);
                    pool.lock_handles().push(h);
                }
                Err(e) => {
                    // Stop the workers already started, or they would wait forever.
                    pool.shutdown();
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
    fn lock_handles(&self) -> MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.handles.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn live_workers(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    pub(super) fn submit(
        self: &Arc<Self>,
        job: Job,
        cfg: &CpuConfig,
    ) -> Result<Request, SubmitError> {
        if self.lock().shutdown {
            return Err(SubmitError::ShutDown(format!("cpu({})", self.threads)));
        }
        let parts = self.threads.max(1);
        let chunk = cfg.chunk_bytes.max(1);
        let mut prog = None;
        // A builtin op writing more than `stream_bytes` (a custom op is lowered later, on a
        // worker: never).
        let mut stream = false;
        // Allocated only for work that leaves this thread (an inline copy needs neither).
        let shared = |job: &Job, stream: bool| {
            let signal = Arc::new(Signal::new());
            let state = Arc::new(JobState {
                dst: job.dst,
                src: job.src,
                stream,
                remaining: AtomicUsize::new(0),
                error: Mutex::new(None),
                signal: Arc::clone(&signal),
            });
            (signal, state)
        };
        if job.op.is_builtin() {
            // Built-ins are checked here, at submit: a bad layout is a SubmitError.
            let p = job.op.lower(job.dst.len, job.src.map(|s| s.len))?;
            stream = p.total_bytes() > cfg.stream_bytes;
            if job.after.is_empty() {
                if p.total_bytes() <= cfg.inline_bytes {
                    for step in p.steps() {
                        // SAFETY: the caller of submit_raw guarantees the buffers (contract 1
                        // and 2); the program checked every step against their lengths.
                        unsafe { exec::run_step(job.dst, job.src, step, stream) };
                    }
                    return Ok(Request::ready(Ok(())));
                }
                let total = p.total_bytes();
                let (signal, state) = shared(&job, stream);
                // Split only where it pays (above `split_bytes`), over the caller and the
                // workers, at most one part per core; the caller runs its share now.
                let parts = if total > cfg.split_bytes {
                    (self.threads + 1).min(self.cores)
                } else {
                    1
                };
                let caller = self.threads > 0 && parts > 1;
                if let Some(steps) =
                    self.fan_out(&state, p.into_steps(), parts, chunk, false, caller)
                {
                    self.run_task(Task::Chunk {
                        state: Arc::clone(&state),
                        steps,
                    });
                }
                return Ok(self.request(signal));
            }
            prog = Some(p.into_steps());
        }
        let (signal, state) = shared(&job, stream);
        self.push(
            Task::Start {
                job: Box::new(job),
                prog,
                state,
                parts,
                chunk,
            },
            false,
        );
        Ok(self.request(signal))
    }

    fn request(self: &Arc<Self>, signal: Arc<Signal>) -> Request {
        let (helper, own) = if self.threads == 0 {
            (Some(Arc::clone(self)), None)
        } else {
            (None, Some(Arc::clone(self)))
        };
        Request::new(CpuCompletion {
            signal,
            helper,
            own,
        })
    }

    /// Runs the queued chunks of the request completing `signal` on this (waiting) thread,
    /// rather than sleeping while a worker wakes up to run them. Chunks never block, and only
    /// this request's are taken, so this cannot nest into other work.
    fn help_own(&self, signal: &Arc<Signal>) {
        loop {
            let chunk = {
                let mut st = self.lock();
                let mine = |t: &Task| matches!(t, Task::Chunk { state, .. } if Arc::ptr_eq(&state.signal, signal));
                match st.queue.iter().position(mine) {
                    Some(i) => st.queue.remove(i),
                    None => None,
                }
            };
            match chunk {
                Some(t) => self.run(t),
                None => return,
            }
        }
    }

    fn push(&self, task: Task, front: bool) {
        let mut st = self.lock();
        if front {
            st.queue.push_front(task);
        } else {
            st.queue.push_back(task);
        }
        drop(st);
        self.cond.notify_one();
    }

    /// Splits `steps` into up to `parts` chunks of at least `chunk` bytes and queues them;
    /// with `caller`, the last chunk is not queued but returned, for the calling thread to run
    /// (counted in the request's chunks all the same), if there are two or more.
    fn fan_out(
        &self,
        state: &Arc<JobState>,
        steps: Vec<Step>,
        parts: usize,
        chunk: usize,
        front: bool,
        caller: bool,
    ) -> Option<Vec<Step>> {
        let total: usize = steps.iter().map(step_bytes).sum();
        // Steps whose destinations overlap (a custom program may write bytes twice) must run
        // in order on one thread: in parallel they would race on those bytes.
        let parts = if steps_disjoint(&steps) {
            parts.min(total / chunk).max(1)
        } else {
            1
        };
        let mut chunks: Vec<Vec<Step>> = vec![Vec::new(); parts];
        if parts == 1 {
            chunks[0] = steps;
        } else {
            let mut k = 0;
            for step in steps {
                let share = (step_bytes(&step) * parts).div_ceil(total).max(1);
                for piece in split_step(&step, share, chunk) {
                    chunks[k % parts].push(piece);
                    k += 1;
                }
            }
            chunks.retain(|c| !c.is_empty());
        }
        state.remaining.store(chunks.len(), Ordering::Release);
        let mine = if caller && chunks.len() > 1 {
            chunks.pop()
        } else {
            None
        };
        let queued = chunks.len();
        let mut st = self.lock();
        for steps in chunks.into_iter().rev() {
            let t = Task::Chunk {
                state: Arc::clone(state),
                steps,
            };
            if front {
                st.queue.push_front(t);
            } else {
                st.queue.push_back(t);
            }
        }
        drop(st);
        // One worker per chunk queued, not every worker.
        if queued >= self.threads {
            self.cond.notify_all();
        } else {
            for _ in 0..queued {
                self.cond.notify_one();
            }
        }
        mine
    }

    fn pop(&self) -> Option<Task> {
        self.lock().queue.pop_front()
    }

    fn worker(self: Arc<Self>) {
        loop {
            let task = {
                let mut st = self.lock();
                loop {
                    if let Some(t) = st.queue.pop_front() {
                        break t;
                    }
                    if st.shutdown {
                        self.live.fetch_sub(1, Ordering::AcqRel);
                        return;
                    }
                    st = self.cond.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
            };
            self.run(task);
        }
    }

    fn run(&self, task: Task) {
        self.run_task(task);
        if self.threads == 0 {
            // A request may have completed: wake callers idling in `idle_wait`. Taking the
            // lock orders this after their check, so no wake-up is lost.
            drop(self.lock());
            self.cond.notify_all();
        }
    }

    /// Zero-thread mode: sleeps until work is queued or a task finished (or 10 ms passed), unless
    /// `c` is already done or work is waiting.
    fn idle_wait(&self, c: &dyn Completion) {
        let st = self.lock();
        if st.queue.is_empty() && c.poll_done().is_none() {
            let _ = self
                .cond
                .wait_timeout(st, std::time::Duration::from_millis(10));
        }
    }

    fn run_task(&self, task: Task) {
        match task {
            Task::Chunk { state, steps } => {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    for step in &steps {
                        // SAFETY: submit_raw's contract keeps the buffers valid and unshared
                        // until the request completes, which is after this chunk; the program
                        // checked each step against the buffers' lengths.
                        unsafe { exec::run_step(state.dst, state.src, step, state.stream) };
                    }
                }));
                if let Err(p) = r {
                    fail(
                        &state,
                        RequestError::Panicked {
                            op: "copy".into(),
                            msg: crate::op::panic_message(&p),
                        },
                    );
                }
                finish_chunk(&state);
            }
            Task::Start {
                job,
                prog,
                state,
                parts,
                chunk,
            } => {
                for dep in &job.after {
                    // Help with chunks only: running another `Start` here could nest a task
                    // that waits for the very request this frame is about to start (deadlock).
                    // A foreign completion (another engine's, or user code) may panic: that
                    // fails this request, not the worker (whose loss would hang the request).
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.wait_helping_chunks(dep.completion())
                    }))
                    .unwrap_or_else(|p| {
                        Err(RequestError::Panicked {
                            op: "dependency".into(),
                            msg: crate::op::panic_message(&p),
                        })
                    });
                    if let Err(e) = r {
                        fail(&state, RequestError::Dependency(Box::new(e)));
                        state.signal.complete(Err(take_error(&state)));
                        return;
                    }
                }
                let steps = match prog {
                    Some(s) => s,
                    None => match lower_custom(&job.op, &job) {
                        Ok(s) => s,
                        Err(e) => {
                            state.signal.complete(Err(e));
                            return;
                        }
                    },
                };
                if steps.is_empty() {
                    state.signal.complete(Ok(()));
                    return;
                }
                // To the front: a later request that depends on this one must not wait for it
                // behind its own position in the queue.
                let _ = self.fan_out(&state, steps, parts, chunk, true, false);
            }
        }
    }

    /// Waits for `c`, running queued tasks meanwhile (so that a worker or a zero-thread caller
    /// waiting on a dependency never starves the work it waits for).
    fn wait_helping(&self, c: &dyn Completion) -> Result<(), RequestError> {
        loop {
            if let Some(r) = c.poll_done() {
                return r;
            }
            match self.pop() {
                Some(t) => self.run(t),
                // Zero-thread mode: the work may be running on another caller, which may queue
                // more work and return; keep helping rather than block on `c`.
                None if self.threads == 0 => self.idle_wait(c),
                None => return c.wait(),
            }
        }
    }

    /// Waits for `c`, running only queued chunks meanwhile. Chunks never block, so a worker
    /// waiting on a dependency cannot end up, nested, inside a task that waits for itself.
    /// Dependencies were submitted earlier, so their `Start` tasks were taken off the (FIFO)
    /// queue before this one and have fanned out chunks or are running on another thread.
    fn wait_helping_chunks(&self, c: &dyn Completion) -> Result<(), RequestError> {
        loop {
            if let Some(r) = c.poll_done() {
                return r;
            }
            let chunk = {
                let mut st = self.lock();
                match st
                    .queue
                    .iter()
                    .position(|t| matches!(t, Task::Chunk { .. }))
                {
                    Some(i) => st.queue.remove(i),
                    None => None,
                }
            };
            match chunk {
                Some(t) => self.run(t),
                None => {
                    // A request of this zero-thread pool, taken by another caller. Do not call
                    // `c.wait()`: it helps with any task and could run, nested, a `Start` that
                    // waits for the request this frame belongs to. Do not block either: that
                    // caller may queue this request's chunks and return. Idle, then look again.
                    if let Some(cc) = c.as_any().downcast_ref::<CpuCompletion>() {
                        if cc.helper.as_ref().is_some_and(|p| std::ptr::eq(&**p, self)) {
                            self.idle_wait(&*cc.signal);
                            continue;
                        }
                    }
                    return c.wait();
                }
            }
        }
    }

    /// Zero-thread mode: runs queued tasks until the queue is empty.
    pub(super) fn help_until_idle(&self) {
        if self.threads > 0 {
            return;
        }
        while let Some(t) = self.pop() {
            self.run(t);
        }
    }

    pub(super) fn shutdown(&self) {
        self.lock().shutdown = true;
        self.cond.notify_all();
        let handles = std::mem::take(&mut *self.lock_handles());
        for h in handles {
            let _ = h.join();
        }
        // Zero-thread mode, or work left by workers that died: finish it here.
        while let Some(t) = self.pop() {
            self.run(t);
        }
    }
}

fn lower_custom(op: &Op, job: &Job) -> Result<Vec<Step>, RequestError> {
    op.lower_catching(job.dst.len, job.src.map(|s| s.len))
        .map(crate::op::Program::into_steps)
}

/// True when no two steps write overlapping destination byte ranges.
fn steps_disjoint(steps: &[Step]) -> bool {
    if steps.len() < 2 {
        return true;
    }
    // A segment list's own destinations are disjoint (checked), but its span is not known
    // without a scan: next to other steps, treat it as overlapping them.
    if steps.iter().any(|s| matches!(s, Step::Segments { .. })) {
        return false;
    }
    let mut spans: Vec<(usize, usize)> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Copy(p) | Step::Fill { plan: p, .. } => Some((p.dst_offset(), p.dst_end())),
            Step::Segments { .. } => None,
        })
        .collect();
    spans.sort_unstable();
    spans.windows(2).all(|w| w[0].1 <= w[1].0)
}

fn step_bytes(s: &Step) -> usize {
    s.bytes()
}

fn split_step(s: &Step, parts: usize, chunk: usize) -> Vec<Step> {
    match s {
        Step::Segments { segs, range, bytes } => {
            // Equal counts of segments per piece (destinations are disjoint, so pieces may run
            // at once).
            let parts = parts
                .min((bytes / chunk.max(1)).max(1))
                .min(range.len().max(1));
            let per = range.len().div_ceil(parts.max(1)).max(1);
            (range.start..range.end)
                .step_by(per)
                .map(|a| {
                    let r = a..(a + per).min(range.end);
                    let bytes = segs[r.clone()].iter().map(|g| g.len as usize).sum();
                    Step::Segments {
                        segs: segs.clone(),
                        range: r,
                        bytes,
                    }
                })
                .collect()
        }
        Step::Copy(p) => p
            .split(parts, chunk, 64)
            .into_iter()
            .map(Step::Copy)
            .collect(),
        Step::Fill { plan, pattern } => {
            // Fills split on whole elements so the pattern stays aligned.
            let align = pattern.len();
            plan.split(parts, chunk, align)
                .into_iter()
                .map(|plan| Step::Fill {
                    plan,
                    pattern: pattern.clone(),
                })
                .collect()
        }
    }
}

fn fail(state: &JobState, e: RequestError) {
    let mut slot = state.error.lock().unwrap_or_else(PoisonError::into_inner);
    if slot.is_none() {
        *slot = Some(e);
    }
}

fn take_error(state: &JobState) -> RequestError {
    state
        .error
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .unwrap_or_else(|| RequestError::Aborted("unknown".into()))
}

fn finish_chunk(state: &JobState) {
    if state.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
        let err = state
            .error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        state.signal.complete(err.map_or(Ok(()), Err));
    }
}

/// A CPU request's completion. In zero-thread mode, waiting runs queued work; with workers,
/// waiting runs the request's own chunks that no worker has taken yet.
struct CpuCompletion {
    signal: Arc<Signal>,
    helper: Option<Arc<Pool>>,
    own: Option<Arc<Pool>>,
}

impl Completion for CpuCompletion {
    fn wait(&self) -> Result<(), RequestError> {
        if let Some(pool) = &self.own {
            pool.help_own(&self.signal);
        }
        match &self.helper {
            Some(pool) => pool.wait_helping(&*self.signal),
            None => self.signal.wait(),
        }
    }
    fn poll_done(&self) -> Option<Result<(), RequestError>> {
        self.signal.poll_done()
    }
    fn register_waker(&self, waker: &Waker) {
        self.signal.register_waker(waker);
        // Zero-thread mode has nobody to make progress for a future: run the queued work now.
        // Work another thread took is finished there, and that thread wakes the waker.
        if let Some(pool) = &self.helper {
            pool.help_until_idle();
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Loom models of the pool (`scripts/loom.sh`): every interleaving, at most 4 preemptions, of
/// a request's chunks handed between the workers and the thread waiting for the request.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::memory::MemKind;
    use crate::sync::model;
    use crate::Layout;

    /// A 128-byte copy in 64-byte chunks on a pool of `threads` workers, split (`split`) over
    /// the submitting thread, which runs its share at submit, and one worker (2 cores), or
    /// queued whole; waited by the submitting thread (which runs the chunks no worker took
    /// yet); then the pool shuts down. The copy is complete and whole when the wait returns,
    /// and every thread ends.
    fn copy_on(threads: usize, split: bool) {
        model(move || {
            let pool = Pool::start(threads, 2).unwrap();
            let cfg = CpuConfig {
                threads,
                chunk_bytes: 64,
                inline_bytes: 0,
                split_bytes: if split { 64 } else { usize::MAX },
                stream_bytes: usize::MAX,
            };
            let src: Vec<u8> = (0..128).collect();
            let mut dst = vec![0u8; 128];
            let l = Layout::bytes(128).unwrap();
            let job = Job::copy(
                RawBuf::host(dst.as_mut_ptr(), dst.len(), MemKind::Pageable),
                l,
                RawBuf::host(src.as_ptr(), src.len(), MemKind::Pageable),
                l,
            );
            let req = pool.submit(job, &cfg).unwrap();
            assert_eq!(req.wait(), Ok(()));
            assert_eq!(dst, src);
            pool.shutdown();
            assert_eq!(pool.live_workers(), 0);
        });
    }

    /// One worker and the waiting thread race for the request's one chunk.
    #[test]
    fn loom_one_chunk_between_a_worker_and_the_waiter() {
        copy_on(1, false);
    }

    /// Split in two: the submitting thread runs one chunk at submit while two workers and then
    /// the waiting thread race for the other; the last one to finish completes the request,
    /// whoever it is, and the waiter sees the whole copy.
    #[test]
    fn loom_two_chunks_between_the_caller_two_workers_and_the_waiter() {
        copy_on(2, true);
    }
}
