//! AML's task scheduler (`aml/utils/async.h`): `struct aml_task` (a C function and its
//! in/out pointers), the generic calls that dispatch through `sched->ops` (so a program's own
//! scheduler works too), and the queue scheduler, `aml_queue_sched_create(nt)`: a work queue
//! served by `nt` threads, finished tasks queued for `wait` / `wait_any`; with `nt` 0 the
//! waiting caller runs the tasks. As AML's, destroying it runs the tasks still queued on the
//! caller; unlike AML's, waiting for a task that was never submitted (or was already waited
//! for) returns `-AML_EDOM` instead of blocking forever, and a NULL task or function is
//! refused.

use crate::error::{fail, guard, guard_ptr, inval, set_errno, AML_EDOM, AML_FAILURE, AML_SUCCESS};
use ferry_capi::Fail;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// `aml_task_work`: the task's function.
pub type AmlTaskWork = Option<unsafe extern "C" fn(*mut c_void, *mut c_void)>;

/// `struct aml_task`.
#[repr(C)]
pub struct AmlTask {
    /// Input (`struct aml_task_in *`).
    pub r#in: *mut c_void,
    /// Output (`struct aml_task_out *`).
    pub out: *mut c_void,
    /// The work: `fn(in, out)`.
    pub r#fn: AmlTaskWork,
    /// The caller's metadata.
    pub data: *mut c_void,
}

/// `struct aml_sched_ops`.
#[repr(C)]
pub struct AmlSchedOps {
    /// Submits a task.
    pub submit: Option<unsafe extern "C" fn(*mut c_void, *mut AmlTask) -> c_int>,
    /// Waits for one task.
    pub wait: Option<unsafe extern "C" fn(*mut c_void, *mut AmlTask) -> c_int>,
    /// Waits for any task; NULL when none is pending.
    pub wait_any: Option<unsafe extern "C" fn(*mut c_void) -> *mut AmlTask>,
}

/// `struct aml_sched`.
#[repr(C)]
pub struct AmlSched {
    /// Implementation data.
    pub data: *mut c_void,
    /// The scheduler's functions.
    pub ops: *mut AmlSchedOps,
}

/// The generic calls' dispatch: the scheduler's data and ops.
///
/// # Safety
/// 1. `s` is NULL or a valid scheduler whose `ops` is NULL or valid.
unsafe fn parts<'a>(s: *mut AmlSched) -> Result<(*mut c_void, &'a AmlSchedOps), Fail> {
    // SAFETY: (1).
    let s = unsafe { s.as_ref() }.ok_or_else(|| inval("scheduler is NULL"))?;
    // SAFETY: (1).
    let o = unsafe { s.ops.as_ref() }.ok_or_else(|| inval("scheduler ops are NULL"))?;
    if s.data.is_null() {
        return Err(inval("scheduler data is NULL"));
    }
    Ok((s.data, o))
}

/// Submits `task` to `pool`. `-AML_EINVAL`: NULL pool, data or ops; else the scheduler's.
///
/// # Safety
/// 1. `pool` is NULL or a valid scheduler; `task` what its `submit` accepts.
#[no_mangle]
pub unsafe extern "C" fn aml_sched_submit_task(pool: *mut AmlSched, task: *mut AmlTask) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (d, o) = unsafe { parts(pool) }?;
        let f = o.submit.ok_or_else(|| inval("scheduler has no submit"))?;
        // SAFETY: (1).
        Ok(unsafe { f(d, task) })
    })
}

/// Waits until `task` is done. `-AML_EINVAL`: NULL pool, data or ops; else the scheduler's.
///
/// # Safety
/// 1. `pool` is NULL or a valid scheduler; `task` what its `wait` accepts.
#[no_mangle]
pub unsafe extern "C" fn aml_sched_wait_task(pool: *mut AmlSched, task: *mut AmlTask) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (d, o) = unsafe { parts(pool) }?;
        let f = o.wait.ok_or_else(|| inval("scheduler has no wait"))?;
        // SAFETY: (1).
        Ok(unsafe { f(d, task) })
    })
}

/// A finished task (waiting for one if some are pending), or NULL when none is pending (or
/// for a NULL pool, with `aml_errno`).
///
/// # Safety
/// 1. `pool` is NULL or a valid scheduler.
#[no_mangle]
pub unsafe extern "C" fn aml_sched_wait_any(pool: *mut AmlSched) -> *mut AmlTask {
    let mut out = std::ptr::null_mut();
    let rc = guard(|| {
        // SAFETY: (1).
        let (d, o) = unsafe { parts(pool) }?;
        let f = o
            .wait_any
            .ok_or_else(|| inval("scheduler has no wait_any"))?;
        // SAFETY: (1).
        out = unsafe { f(d) };
        Ok(AML_SUCCESS)
    });
    if rc != AML_SUCCESS {
        set_errno(rc);
    }
    out
}

/// A task pointer, moved between threads (the C caller keeps the task alive until it has
/// been waited for).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Task(*mut AmlTask);

// SAFETY: a task is run by one thread at a time; its memory is the caller's to keep valid.
unsafe impl Send for Task {}

impl Task {
    /// Runs the task's function.
    ///
    /// # Safety
    /// 1. The task is valid (checked at submission: non-NULL, with a function).
    unsafe fn run(self) {
        // SAFETY: (1).
        let t = unsafe { &*self.0 };
        if let Some(f) = t.r#fn {
            // SAFETY: (1): the caller's function on the caller's pointers.
            unsafe { f(t.r#in, t.out) };
        }
    }
}

#[derive(Default)]
struct State {
    work: VecDeque<Task>,
    running: Vec<Task>,
    done: VecDeque<Task>,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Work queued, or stop.
    work: Condvar,
    /// A task done.
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned one is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A worker: runs queued tasks until stopped (the queue left to `destroy`).
fn worker(sh: Arc<Shared>) {
    loop {
        let mut st = sh.lock();
        let task = loop {
            if st.stop {
                return;
            }
            if let Some(t) = st.work.pop_front() {
                break t;
            }
            st = sh.work.wait(st).unwrap_or_else(PoisonError::into_inner);
        };
        st.running.push(task);
        drop(st);
        // SAFETY: submitted tasks are valid until waited for.
        unsafe { task.run() };
        let mut st = sh.lock();
        st.running.retain(|&t| t != task);
        st.done.push_back(task);
        drop(st);
        sh.done.notify_all();
    }
}

/// The queue scheduler's block: the public struct first (a `struct aml_sched *` is a pointer
/// to the block), its ops, its state, its threads.
#[repr(C)]
struct Queue {
    public: AmlSched,
    ops: AmlSchedOps,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// # Safety
/// 1. `data` is NULL or a queue scheduler's data (its block).
unsafe fn queue<'a>(data: *mut c_void) -> Result<&'a Queue, Fail> {
    // SAFETY: (1).
    unsafe { data.cast::<Queue>().as_ref() }.ok_or_else(|| inval("scheduler data is NULL"))
}

/// Queues `task`. `-AML_EINVAL`: NULL data or task, a task without a function.
///
/// # Safety
/// 1. `data` is NULL or a queue scheduler's data; `task` NULL or a task valid until waited
///    for.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_sched_submit(data: *mut c_void, task: *mut AmlTask) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let q = unsafe { queue(data) }?;
        // SAFETY: (1).
        let t = unsafe { task.as_ref() }.ok_or_else(|| inval("task is NULL"))?;
        if t.r#fn.is_none() {
            return Err(inval("task without a function"));
        }
        q.shared.lock().work.push_back(Task(task));
        q.shared.work.notify_one();
        Ok(AML_SUCCESS)
    })
}

fn unknown() -> Fail {
    fail(
        AML_EDOM,
        "task not pending: never submitted, or already waited for",
    )
}

/// Waits for `task` (threads run it). `-AML_EDOM` if it is not pending (AML blocks forever).
///
/// # Safety
/// 1. `data` is NULL or a queue scheduler's data.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_sched_wait_async(
    data: *mut c_void,
    task: *mut AmlTask,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let q = unsafe { queue(data) }?;
        let t = Task(task);
        let mut st = q.shared.lock();
        loop {
            if let Some(i) = st.done.iter().position(|&d| d == t) {
                st.done.remove(i);
                return Ok(AML_SUCCESS);
            }
            if !st.work.contains(&t) && !st.running.contains(&t) {
                return Err(unknown());
            }
            st = q
                .shared
                .done
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    })
}

/// Waits for `task` when no thread runs tasks: a finished one is taken, a queued one run now.
/// `-AML_EDOM` if it is not pending.
///
/// # Safety
/// 1. `data` is NULL or a queue scheduler's data.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_sched_wait(data: *mut c_void, task: *mut AmlTask) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let q = unsafe { queue(data) }?;
        let t = Task(task);
        let mut st = q.shared.lock();
        if let Some(i) = st.done.iter().position(|&d| d == t) {
            st.done.remove(i);
            return Ok(AML_SUCCESS);
        }
        let Some(i) = st.work.iter().position(|&w| w == t) else {
            return Err(unknown());
        };
        st.work.remove(i);
        drop(st);
        // SAFETY: a submitted task, valid until waited for.
        unsafe { t.run() };
        Ok(AML_SUCCESS)
    })
}

/// The oldest finished task, waiting while tasks are queued or running; NULL when none is
/// pending.
///
/// # Safety
/// 1. `data` is NULL or a queue scheduler's data.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_sched_wait_any_async(data: *mut c_void) -> *mut AmlTask {
    guard_ptr(|| {
        // SAFETY: (1).
        let q = unsafe { queue(data) }?;
        let mut st = q.shared.lock();
        loop {
            if let Some(t) = st.done.pop_front() {
                return Ok(t.0);
            }
            if st.work.is_empty() && st.running.is_empty() {
                return Ok(std::ptr::null_mut());
            }
            st = q
                .shared
                .done
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    })
}

/// A finished task, else the oldest queued one, run now; NULL when none is pending (no
/// threads).
///
/// # Safety
/// 1. `data` is NULL or a queue scheduler's data.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_sched_wait_any(data: *mut c_void) -> *mut AmlTask {
    guard_ptr(|| {
        // SAFETY: (1).
        let q = unsafe { queue(data) }?;
        let mut st = q.shared.lock();
        if let Some(t) = st.done.pop_front() {
            return Ok(t.0);
        }
        let Some(t) = st.work.pop_front() else {
            return Ok(std::ptr::null_mut());
        };
        drop(st);
        // SAFETY: a submitted task, valid until waited for.
        unsafe { t.run() };
        Ok(t.0)
    })
}

/// Stops the threads (after their current task) and waits for them.
fn stop(q: &mut Queue) {
    q.shared.lock().stop = true;
    q.shared.work.notify_all();
    for t in q.threads.drain(..) {
        // A worker does not panic (the tasks are C functions); a panicked one is gone.
        let _ = t.join();
    }
}

/// A queue scheduler with `nt` threads (0: the waiting caller runs the tasks). NULL with
/// `aml_errno` `AML_FAILURE` if a thread cannot be started.
///
/// # Safety
/// 1. None.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_sched_create(nt: usize) -> *mut AmlSched {
    guard_ptr(|| {
        let shared = Arc::new(Shared::default());
        let ops = if nt == 0 {
            AmlSchedOps {
                submit: Some(aml_queue_sched_submit),
                wait: Some(aml_queue_sched_wait),
                wait_any: Some(aml_queue_sched_wait_any),
            }
        } else {
            AmlSchedOps {
                submit: Some(aml_queue_sched_submit),
                wait: Some(aml_queue_sched_wait_async),
                wait_any: Some(aml_queue_sched_wait_any_async),
            }
        };
        let mut q = Box::new(Queue {
            public: AmlSched {
                data: std::ptr::null_mut(),
                ops: std::ptr::null_mut(),
            },
            ops,
            shared,
            threads: Vec::with_capacity(nt),
        });
        for i in 0..nt {
            let sh = Arc::clone(&q.shared);
            match std::thread::Builder::new()
                .name(format!("aml-sched-{i}"))
                .spawn(move || worker(sh))
            {
                Ok(h) => q.threads.push(h),
                Err(e) => {
                    stop(&mut q);
                    return Err(fail(AML_FAILURE, format!("starting a thread: {e}")));
                }
            }
        }
        let p = Box::into_raw(q);
        // SAFETY: `p` is the block just leaked; its pointers point into it.
        unsafe {
            (*p).public.data = p.cast();
            (*p).public.ops = &raw mut (*p).ops;
        }
        Ok(p.cast::<AmlSched>())
    })
}

/// Stops the threads (after their current task), runs the tasks still queued on the caller
/// (as AML), frees the scheduler and sets `*sched` to NULL. NULL: no-op.
///
/// # Safety
/// 1. `sched` is NULL or valid for a read and a write; `*sched` NULL or a scheduler from
///    `aml_queue_sched_create`, not used by other threads during or after the call.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_sched_destroy(sched: *mut *mut AmlSched) {
    // SAFETY: (1).
    let Some(slot) = (unsafe { sched.as_mut() }) else {
        return;
    };
    if slot.is_null() {
        return;
    }
    // SAFETY: (1): the block of `aml_queue_sched_create`.
    let mut q = unsafe { Box::from_raw(slot.cast::<Queue>()) };
    *slot = std::ptr::null_mut();
    stop(&mut q);
    let rest: Vec<Task> = q.shared.lock().work.drain(..).collect();
    for t in rest {
        // SAFETY: submitted tasks, valid until waited for (or the scheduler's end).
        unsafe { t.run() };
    }
}
