//! `aml/higher/mapper/replicaset.h`: replicas of a structure built by threads that share the
//! parts marked `AML_MAPPER_REPLICASET_SHARED` / `GLOBAL` (one thread of a group copies such a
//! part, the others connect to it, in lock step), the parts marked `LOCAL` copied by each.
//! AML's public config struct, its pthread mutex and semaphores included.

use super::creator::{
    aml_mapper_creator_abort, aml_mapper_creator_branch, aml_mapper_creator_connect,
    aml_mapper_creator_create, aml_mapper_creator_finish, aml_mapper_creator_next,
    AmlMapperCreator,
};
use super::deepcopy::AmlMappedPtr;
use super::ptrs::{push, release, UtArray};
use super::visitor::{aml_mapper_visitor_size, AmlMapperVisitor};
use super::AML_MAPPER_FLAG_SPLIT;
use crate::area::AmlArea;
use crate::dma::{AmlDma, AmlDmaOperator};
use crate::error::{guard, inval, set_errno, AML_EDOM, AML_EINVAL, AML_FAILURE, AML_SUCCESS};
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// A part copied once for all replicas.
pub const AML_MAPPER_REPLICASET_GLOBAL: u64 = AML_MAPPER_FLAG_SPLIT | 0x8000_0000;
/// A part copied once per group of replicas.
pub const AML_MAPPER_REPLICASET_SHARED: u64 = AML_MAPPER_FLAG_SPLIT | 0x4000_0000;
/// A part copied by each replica.
pub const AML_MAPPER_REPLICASET_LOCAL: u64 = AML_MAPPER_FLAG_SPLIT | 0x2000_0000;

/// `struct aml_shared_replica_config`: where one level of replicas goes, and how its threads
/// meet.
#[repr(C)]
pub struct AmlSharedReplicaConfig {
    /// The area copies go to.
    pub area: *mut AmlArea,
    /// Its options.
    pub area_opts: *mut c_void,
    /// The dma from the host to the area.
    pub dma_host_dst: *mut AmlDma,
    /// Its memcpy operator.
    pub memcpy_host_dst: AmlDmaOperator,
    /// The threads sharing this config.
    pub num_shared: c_uint,
    /// Held by the thread copying the current part.
    pub producer: libc::pthread_mutex_t,
    /// Posted by each thread that connected to the part.
    pub consumed: libc::sem_t,
    /// Posted by the producer for each other thread.
    pub produced: libc::sem_t,
    /// The part copied last.
    pub ptr: *mut c_void,
}

/// Initializes a config shared by `num_sharing` threads (a NULL `out`: `aml_errno` set to
/// `AML_EINVAL`, nothing done).
///
/// # Safety
/// 1. `out` NULL or valid for writes, not initialized already (or finalized).
#[no_mangle]
pub unsafe extern "C" fn aml_replica_build_init(
    out: *mut AmlSharedReplicaConfig,
    num_sharing: c_uint,
    area: *mut AmlArea,
    opts: *mut c_void,
    dma_host_dst: *mut AmlDma,
    memcpy_host_dst: AmlDmaOperator,
) {
    // SAFETY: (1).
    let Some(c) = (unsafe { out.as_mut() }) else {
        set_errno(AML_EINVAL);
        return;
    };
    c.area = area;
    c.area_opts = opts;
    c.dma_host_dst = dma_host_dst;
    c.memcpy_host_dst = memcpy_host_dst;
    c.num_shared = num_sharing;
    c.ptr = std::ptr::null_mut();
    forget(out);
    // SAFETY: (1): fields of the caller's struct, initialized in place.
    unsafe {
        libc::pthread_mutex_init(&mut c.producer, std::ptr::null());
        libc::sem_init(&mut c.consumed, 0, 0);
        libc::sem_init(&mut c.produced, 0, 0);
    }
}

/// Releases what `aml_replica_build_init` made (NULL: no-op).
///
/// # Safety
/// 1. `out` NULL or initialized, its threads done.
#[no_mangle]
pub unsafe extern "C" fn aml_replica_build_fini(out: *mut AmlSharedReplicaConfig) {
    // SAFETY: (1).
    if let Some(c) = unsafe { out.as_mut() } {
        forget(out);
        // SAFETY: (1).
        unsafe {
            libc::pthread_mutex_destroy(&mut c.producer);
            libc::sem_destroy(&mut c.consumed);
            libc::sem_destroy(&mut c.produced);
        }
    }
}

/// One round at a config: the threads that reach the same part, the first of which copies it
/// (the producer) while the others wait for its pointer and connect to it. Rounds are
/// numbered, each thread counting its own, and a round starts when the one before is over
/// (AML's semaphores let a fast thread take a token of a round it already passed, and connect
/// to the wrong part, or leave a round one thread short).
#[derive(Default)]
struct Round {
    gen: u64,
    arrived: c_uint,
    need: c_uint,
    ready: bool,
    taken: c_uint,
    ptr: usize,
    ok: bool,
}

/// The rendezvous of a config's threads.
#[derive(Default)]
struct Meet {
    round: Mutex<Round>,
    cv: Condvar,
}

/// A thread's part in a round.
enum Role {
    Producer,
    Consumer(*mut c_void, bool),
}

impl Meet {
    fn lock(&self) -> MutexGuard<'_, Round> {
        self.round.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn wait<'a>(&self, g: MutexGuard<'a, Round>) -> MutexGuard<'a, Round> {
        self.cv.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// Joins round `k` (the caller's k-th at this config, counted from 0) of `need` threads,
    /// once the rounds before it are over. A thread past round `k` already gets a failure.
    fn join(&self, k: u64, need: c_uint) -> Role {
        let mut r = self.lock();
        while r.gen < k {
            r = self.wait(r);
        }
        if r.gen > k {
            return Role::Consumer(std::ptr::null_mut(), false);
        }
        if r.arrived == 0 {
            r.arrived = 1;
            r.need = need.max(1);
            r.ready = false;
            r.taken = 0;
            return Role::Producer;
        }
        r.arrived += 1;
        while !(r.ready && r.gen == k) {
            r = self.wait(r);
        }
        r.taken += 1;
        self.cv.notify_all();
        Role::Consumer(r.ptr as *mut c_void, r.ok)
    }

    /// The producer's pointer (NULL: an empty part) and success, handed to the round; returns
    /// once every thread of the round has it.
    fn publish(&self, ptr: *mut c_void, ok: bool) {
        let mut r = self.lock();
        r.ptr = ptr as usize;
        r.ok = ok;
        r.ready = true;
        self.cv.notify_all();
        while r.taken + 1 < r.need {
            r = self.wait(r);
        }
        r.gen += 1;
        r.arrived = 0;
        r.ready = false;
        self.cv.notify_all();
    }
}

/// The rendezvous of each config in use, by address (made at the first round, dropped by
/// `aml_replica_build_fini`).
fn meets() -> MutexGuard<'static, HashMap<usize, Arc<Meet>>> {
    static MEETS: OnceLock<Mutex<HashMap<usize, Arc<Meet>>>> = OnceLock::new();
    MEETS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Drops the rendezvous of a config (the map's table too when it is empty, so that nothing
/// stays allocated after the last `aml_replica_build_fini`).
fn forget(cfg: *const AmlSharedReplicaConfig) {
    let mut m = meets();
    m.remove(&(cfg as usize));
    if m.is_empty() {
        *m = HashMap::new();
    }
}

fn meet_of(cfg: &AmlSharedReplicaConfig) -> Arc<Meet> {
    meets()
        .entry(cfg as *const AmlSharedReplicaConfig as usize)
        .or_default()
        .clone()
}

/// Which config a part goes to.
#[derive(Clone, Copy)]
enum Level {
    Local,
    Shared,
    Global,
}

/// What a build thread gets.
struct Args {
    ptrs: *mut UtArray,
    mutex: *mut libc::pthread_mutex_t,
    crtr: *mut AmlMapperCreator,
    local: *mut AmlSharedReplicaConfig,
    shared: *mut AmlSharedReplicaConfig,
    global: *mut AmlSharedReplicaConfig,
}

/// Builds one replica (see `aml_mapper_replica_build_start`): its root, or NULL with
/// `aml_errno` set.
///
/// # Safety
/// 1. `a` the creator and configs as `aml_mapper_replica_build_start` requires.
unsafe fn build(a: &Args) -> Result<*mut c_void, c_int> {
    let mask =
        (AML_MAPPER_REPLICASET_LOCAL | AML_MAPPER_REPLICASET_SHARED | AML_MAPPER_REPLICASET_GLOBAL)
            & !AML_MAPPER_FLAG_SPLIT;
    let mut crtr = a.crtr;
    // The level of the part the current creator copies (the root: every thread's own).
    let mut level_of = Level::Local;
    let mut pending: Vec<(*mut AmlMapperCreator, Level)> = Vec::new();
    // The rounds this thread joined at each config.
    let mut rounds: HashMap<usize, u64> = HashMap::new();
    let mut done: Vec<AmlMappedPtr> = Vec::new();
    // SAFETY: (1) for every call below.
    unsafe {
        // Threads meeting at a global part under a shared one (read before a config is
        // borrowed: the configs are shared with the other threads).
        let per_shared = (*a.global).num_shared / (*a.shared).num_shared.max(1);
        let mut err = aml_mapper_creator_next(crtr);
        let fail = |err: c_int,
                    crtr: *mut AmlMapperCreator,
                    pending: &[(*mut AmlMapperCreator, Level)],
                    done: &[AmlMappedPtr]| {
            if !crtr.is_null() {
                aml_mapper_creator_abort(crtr);
            }
            for &(p, _) in pending {
                aml_mapper_creator_abort(p);
            }
            for p in done {
                release(p);
            }
            Err(err)
        };
        loop {
            match err {
                AML_SUCCESS => err = aml_mapper_creator_next(crtr),
                e if e == -AML_EDOM => {
                    let mut p = AmlMappedPtr {
                        ptr: std::ptr::null_mut(),
                        size: 0,
                        area: (*crtr).device_area,
                    };
                    let rc = aml_mapper_creator_finish(crtr, &mut p.ptr, &mut p.size);
                    if rc != AML_SUCCESS {
                        return fail(rc, crtr, &pending, &done);
                    }
                    done.push(p);
                    match pending.pop() {
                        Some((n, l)) => {
                            crtr = n;
                            level_of = l;
                            err = aml_mapper_creator_next(crtr);
                        }
                        None => break,
                    }
                }
                e if e == -AML_EINVAL => {
                    // A split part: the level whose config it goes to, and how many threads
                    // reach it (those building the enclosing part and sharing that config).
                    let flags = (*(*(*crtr).stack).mapper).flags & mask;
                    let part = if flags & AML_MAPPER_REPLICASET_LOCAL != 0 {
                        Level::Local
                    } else if flags & AML_MAPPER_REPLICASET_SHARED != 0 {
                        Level::Shared
                    } else if flags & AML_MAPPER_REPLICASET_GLOBAL != 0 {
                        Level::Global
                    } else {
                        return fail(-AML_EINVAL, crtr, &pending, &done);
                    };
                    // Read only: its fields are set before the threads start.
                    let level: &AmlSharedReplicaConfig = match part {
                        Level::Local => &*a.local,
                        Level::Shared => &*a.shared,
                        Level::Global => &*a.global,
                    };
                    let num_consumer = match (level_of, part) {
                        (Level::Local, _) => level.num_shared,
                        (Level::Shared, Level::Global) => per_shared,
                        _ => 1,
                    };
                    let meet = meet_of(level);
                    let k = rounds.entry(Arc::as_ptr(&meet) as usize).or_insert(0);
                    let round = *k;
                    *k += 1;
                    match meet.join(round, num_consumer) {
                        Role::Producer => {
                            let mut next = std::ptr::null_mut();
                            err = aml_mapper_creator_branch(
                                &mut next,
                                crtr,
                                level.area,
                                level.area_opts,
                                level.dma_host_dst,
                                level.memcpy_host_dst,
                            );
                            let ok = err == AML_SUCCESS || err == -AML_EDOM;
                            let ptr = if ok && !next.is_null() {
                                pending.push((next, part));
                                (*next).device_memory
                            } else {
                                std::ptr::null_mut()
                            };
                            meet.publish(ptr, ok);
                            if !ok {
                                return fail(err, crtr, &pending, &done);
                            }
                        }
                        Role::Consumer(ptr, ok) => {
                            err = if !ok {
                                -AML_FAILURE
                            } else if ptr.is_null() {
                                // An empty part: the field stays NULL.
                                (*crtr).connect_to(std::ptr::null_mut())
                            } else {
                                aml_mapper_creator_connect(crtr, ptr)
                            };
                            if !ok {
                                return fail(err, crtr, &pending, &done);
                            }
                        }
                    }
                }
                e => return fail(e, crtr, &pending, &done),
            }
        }
        libc::pthread_mutex_lock(a.mutex);
        let mut rc = AML_SUCCESS;
        let mut pushed = 0;
        for p in &done {
            rc = push(a.ptrs, p);
            if rc != AML_SUCCESS {
                break;
            }
            pushed += 1;
        }
        libc::pthread_mutex_unlock(a.mutex);
        if rc != AML_SUCCESS {
            return fail(rc, std::ptr::null_mut(), &[], &done[pushed..]);
        }
        Ok(done[0].ptr)
    }
}

/// The build thread: its exit value is the replica (NULL on failure, `aml_errno` set).
extern "C" fn build_thread(arg: *mut c_void) -> *mut c_void {
    // SAFETY: `arg` is the `Args` box `aml_mapper_replica_build_start` handed to this thread.
    let a = unsafe { Box::from_raw(arg.cast::<Args>()) };
    let mut out = std::ptr::null_mut();
    let rc = guard(|| {
        // SAFETY: the start function's contract.
        match unsafe { build(&a) } {
            Ok(p) => {
                out = p;
                Ok(AML_SUCCESS)
            }
            Err(rc) => Ok(rc),
        }
    });
    if rc != AML_SUCCESS {
        set_errno(rc);
    }
    out
}

/// Starts a thread building a replica of the structure `visitor` visits: the parts marked
/// `AML_MAPPER_REPLICASET_LOCAL` copied into `local`'s area, `SHARED` ones copied once per
/// group sharing `shared`, `GLOBAL` ones once for those sharing `global`; the threads of a
/// group meet at each shared part, so all of them must be started. `pthread_join` gives the
/// replica (NULL on failure); its buffers are appended to `replicaset_pointers` (a `UT_array`
/// of `struct aml_mapped_ptr`, passed as itself, as AML's test does) under `replicaset_mutex`,
/// for `aml_mapper_deepfree`. `-AML_EINVAL` for a NULL argument; the creator's or the
/// visitor's failure; `-AML_FAILURE` if no thread could start.
///
/// # Safety
/// 1. All pointers NULL or valid until the thread is joined; the configs initialized; the
///    structure readable through the visitor's dma (or by the host).
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_replica_build_start(
    thread_handle: *mut libc::pthread_t,
    visitor: *mut AmlMapperVisitor,
    local: *mut AmlSharedReplicaConfig,
    shared: *mut AmlSharedReplicaConfig,
    global: *mut AmlSharedReplicaConfig,
    replicaset_pointers: *mut *mut c_void,
    replicaset_mutex: *mut libc::pthread_mutex_t,
) -> c_int {
    guard(|| {
        if thread_handle.is_null()
            || visitor.is_null()
            || local.is_null()
            || shared.is_null()
            || global.is_null()
            || replicaset_pointers.is_null()
            || replicaset_mutex.is_null()
        {
            return Err(inval("a NULL argument"));
        }
        // SAFETY: (1).
        unsafe {
            let mut size = 0;
            let rc = aml_mapper_visitor_size(visitor, &mut size);
            if rc != AML_SUCCESS {
                return Ok(rc);
            }
            let head = &*(*visitor).stack;
            let l = &*local;
            let mut crtr = std::ptr::null_mut();
            let rc = aml_mapper_creator_create(
                &mut crtr,
                head.device_ptr,
                size,
                head.mapper,
                l.area,
                l.area_opts,
                (*visitor).dma,
                l.dma_host_dst,
                (*visitor).memcpy_op,
                l.memcpy_host_dst,
            );
            if rc != AML_SUCCESS {
                return Ok(rc);
            }
            let args = Box::into_raw(Box::new(Args {
                ptrs: replicaset_pointers.cast(),
                mutex: replicaset_mutex,
                crtr,
                local,
                shared,
                global,
            }));
            if libc::pthread_create(thread_handle, std::ptr::null(), build_thread, args.cast()) != 0
            {
                drop(Box::from_raw(args));
                aml_mapper_creator_abort(crtr);
                return Ok(-AML_FAILURE);
            }
        }
        Ok(AML_SUCCESS)
    })
}
