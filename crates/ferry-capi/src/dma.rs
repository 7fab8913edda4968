//! DMA engines (`ferry_dma`): creation, barrier, destruction.

use crate::error::{c_string, guard, out, set_last_error, Fail, FERRY_ENOTAVAIL, FERRY_SUCCESS};
use ferry::{CpuConfig, CpuEngine, Engine, MultiplexEngine};
use std::ffi::{c_char, c_int, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

const DMA_MAGIC: u64 = 0x6665_7272_795f_646d; // "ferry_dm"
static NEXT_DMA: AtomicU64 = AtomicU64::new(1);

/// A DMA engine handle (`ferry_dma` in C): any [`ferry::Engine`] behind one C type.
pub struct FerryDma {
    magic: u64,
    pub(crate) id: u64,
    pub(crate) engine: Box<dyn Engine>,
    /// The failures the last barrier reported: (request id, message).
    failures: Mutex<Vec<(u64, CString)>>,
}

impl FerryDma {
    /// Wraps an engine in a new handle. The lead wires further backends through this.
    pub fn boxed(engine: Box<dyn Engine>) -> *mut FerryDma {
        Box::into_raw(Box::new(FerryDma {
            magic: DMA_MAGIC,
            id: NEXT_DMA.fetch_add(1, Ordering::Relaxed),
            engine,
            failures: Mutex::new(Vec::new()),
        }))
    }

    /// Waits for everything, keeps the failures for `ferry_dma_barrier_failure`, returns their
    /// count and sets the last error message when there are any.
    fn barrier(&self) -> c_int {
        let failures: Vec<(u64, CString)> = match self.engine.barrier() {
            Ok(()) => Vec::new(),
            Err(e) => {
                set_last_error(&e.to_string());
                e.failures
                    .iter()
                    .map(|(id, err)| (*id, c_string(&format!("request #{id} failed: {err}"))))
                    .collect()
            }
        };
        let n = c_int::try_from(failures.len()).unwrap_or(c_int::MAX);
        *self.failures.lock().unwrap_or_else(PoisonError::into_inner) = failures;
        n
    }
}

/// Checks a dma handle.
///
/// # Safety
/// 1. `p` is NULL or a dma from a `ferry_dma_*_create` not yet destroyed.
pub(crate) unsafe fn dma_ref<'a>(p: *const FerryDma) -> Result<&'a FerryDma, Fail> {
    // SAFETY: (1).
    let d = unsafe { p.as_ref() }.ok_or_else(|| Fail::inval("dma is NULL"))?;
    if d.magic != DMA_MAGIC {
        return Err(Fail::inval(
            "dma is not a ferry_dma (destroyed, or another handle type)",
        ));
    }
    Ok(d)
}

/// Creates a CPU engine: a pool of `threads` worker threads (0: one per core, the meaning of
/// `CpuEngine::new(0)` in Rust too) that splits
/// large copies across workers. Reaches host memory of every kind.
///
/// Returns `FERRY_SUCCESS`, `-FERRY_EINVAL` (NULL `out`, negative `threads`) or
/// `-FERRY_EDRIVER` (a worker thread could not be started).
///
/// # Safety
/// 1. `out` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_dma_cpu_create(out: *mut *mut FerryDma, threads: c_int) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let out = unsafe { crate::error::out(out, "out") }?;
        let cfg = match usize::try_from(threads) {
            // 0: one per core, as in Rust.
            Ok(n) => CpuConfig::new(n),
            Err(_) => {
                return Err(Fail::inval(format!(
                    "threads is {threads}; use 0 (one per core) or a positive count"
                )))
            }
        };
        let engine = CpuEngine::with_config(cfg)
            .map_err(|e| Fail::new(crate::error::FERRY_EDRIVER, e.to_string()))?;
        *out = FerryDma::boxed(Box::new(engine));
        Ok(FERRY_SUCCESS)
    })
}

/// Creates a multiplex engine over `count` existing engines: each request goes to the engine
/// with the least bytes per unit of weight so far, and copies of at least `split_bytes` bytes
/// (0: 64 MiB) are split across them.
///
/// Takes ownership of the engines: on success every `engines[i]` is set to NULL and must not
/// be destroyed by the caller. On failure nothing is taken.
///
/// Returns `FERRY_SUCCESS` or `-FERRY_EINVAL` (NULL pointers, `count` 0, an invalid or
/// repeated engine, a weight that is not finite and positive).
///
/// # Safety
/// 1. `out` is NULL or valid for one write.
/// 2. `engines` is NULL or valid for reads and writes of `count` pointers, each NULL or a dma
///    not yet destroyed; `weights` is NULL (every weight 1) or valid for `count` reads.
#[no_mangle]
pub unsafe extern "C" fn ferry_dma_multiplex_create(
    out: *mut *mut FerryDma,
    engines: *mut *mut FerryDma,
    weights: *const f64,
    count: usize,
    split_bytes: usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let out = unsafe { crate::error::out(out, "out") }?;
        if count == 0 {
            return Err(Fail::inval(
                "count is 0: a multiplex engine needs at least one engine",
            ));
        }
        if engines.is_null() {
            return Err(Fail::inval("engines is NULL"));
        }
        // SAFETY: (2): non-null, `count` pointers.
        let slots = unsafe { std::slice::from_raw_parts_mut(engines, count) };
        let weights: Vec<f64> = if weights.is_null() {
            vec![1.0; count]
        } else {
            // SAFETY: (2).
            unsafe { std::slice::from_raw_parts(weights, count) }.to_vec()
        };
        for (i, (&p, &w)) in slots.iter().zip(&weights).enumerate() {
            // SAFETY: (2).
            unsafe { dma_ref(p) }.map_err(|f| Fail::inval(format!("engines[{i}]: {}", f.msg)))?;
            if slots[..i].contains(&p) {
                return Err(Fail::inval(format!("engines[{i}] is given twice")));
            }
            if !(w.is_finite() && w > 0.0) {
                return Err(Fail::inval(format!(
                    "weights[{i}] is {w}; weights must be finite and positive"
                )));
            }
        }
        let mut mux = MultiplexEngine::new();
        if split_bytes != 0 {
            mux = mux.split_bytes(split_bytes);
        }
        for (slot, &w) in slots.iter_mut().zip(&weights) {
            // SAFETY: (2), checked above: a live dma from `Box::into_raw`, taken once.
            let mut b = unsafe { Box::from_raw(*slot) };
            *slot = std::ptr::null_mut();
            // A copy of the handle the caller kept (AML's multiplex does not own its dmas, so
            // `ferry_dma_destroy` of it is a habit) is then usually caught as freed, as a
            // destroyed dma's is.
            b.magic = 0;
            let FerryDma { engine, .. } = *b;
            mux = mux.with(engine, w);
        }
        *out = FerryDma::boxed(Box::new(mux));
        Ok(FERRY_SUCCESS)
    })
}

/// Creates the CUDA engine of GPU `device` (AML's `aml_dma_cuda_create`): a pool of streams
/// per direction (each submitting thread keeps one), one event per request, direction inferred
/// from the buffers' kinds.
///
/// Returns `FERRY_SUCCESS`, `-FERRY_ENOTAVAIL` (no CUDA driver on this machine; `*out`
/// unchanged), `-FERRY_EINVAL` (negative or absent device), `-FERRY_EDRIVER` (a driver call
/// failed; the message says which).
///
/// # Safety
/// 1. `out` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_dma_cuda_create(out: *mut *mut FerryDma, device: c_int) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let out = unsafe { crate::error::out(out, "out") }?;
        let ordinal = u32::try_from(device)
            .map_err(|_| Fail::inval(format!("device is {device}; devices are numbered from 0")))?;
        // The C API tunes staging from FERRY_STAGING_* as the CLI does; a bad value is refused.
        let cfg =
            ferry::cuda::CudaConfig::from_env(ordinal).map_err(|e| Fail::inval(e.to_string()))?;
        match ferry::cuda::CudaEngine::with_config(cfg) {
            Ok(engine) => {
                *out = FerryDma::boxed(Box::new(engine));
                Ok(FERRY_SUCCESS)
            }
            Err(e @ ferry::cuda::CudaError::NoDriver(_)) => {
                Err(Fail::new(FERRY_ENOTAVAIL, e.to_string()))
            }
            Err(e @ ferry::cuda::CudaError::NoDevice { .. }) => Err(Fail::inval(e.to_string())),
            Err(e) => Err(Fail::new(crate::error::FERRY_EDRIVER, e.to_string())),
        }
    })
}

/// Waits for every request submitted to `dma` so far, and reports each one that failed and
/// whose failure was not already returned by `ferry_request_wait`/`ferry_request_test`.
/// May block.
///
/// Returns the number of failed requests (0: all succeeded), or `-FERRY_EINVAL` for a bad
/// `dma`. When it is positive, `ferry_last_error_message()` summarises them and
/// `ferry_dma_barrier_failure(dma, i, ...)` gives each one.
///
/// # Safety
/// 1. `dma` is NULL or a dma not yet destroyed.
/// 2. The buffers of its requests are valid (they are until this returns).
#[no_mangle]
pub unsafe extern "C" fn ferry_dma_barrier(dma: *mut FerryDma) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let d = unsafe { dma_ref(dma) }?;
        Ok(d.barrier())
    })
}

/// The `index`-th failure of the last `ferry_dma_barrier` on `dma`: the failed request's id
/// (as from `ferry_request_id`) and its message. Either output may be NULL.
///
/// Returns `FERRY_SUCCESS`, or `-FERRY_EINVAL` (bad `dma`, `index` not below the last
/// barrier's count).
///
/// # Safety
/// 1. `dma` is NULL or a dma not yet destroyed.
/// 2. `request_id` and `message` are NULL or valid for one write.
/// 3. `*message` stays valid until the next barrier on `dma` or its destruction; the caller
///    must not free it.
#[no_mangle]
pub unsafe extern "C" fn ferry_dma_barrier_failure(
    dma: *mut FerryDma,
    index: usize,
    request_id: *mut u64,
    message: *mut *const c_char,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let d = unsafe { dma_ref(dma) }?;
        let f = d.failures.lock().unwrap_or_else(PoisonError::into_inner);
        let (id, msg) = f.get(index).ok_or_else(|| {
            Fail::inval(format!(
                "index {index}: the last barrier reported {} failure(s)",
                f.len()
            ))
        })?;
        // SAFETY: (2), each checked non-null; (3): the CString lives in `d.failures`.
        unsafe {
            if let Some(r) = request_id.as_mut() {
                *r = *id;
            }
            if let Some(m) = message.as_mut() {
                *m = msg.as_ptr();
            }
        }
        Ok(FERRY_SUCCESS)
    })
}

/// Waits for every request of `*dma` (as `ferry_dma_barrier`), shuts the engine down, frees
/// it and sets `*dma` to NULL. Safe with work in flight: it waits. A NULL `*dma` is a no-op.
///
/// Returns the number of failed requests nobody had seen (0 normally; the last error message
/// summarises them), or `-FERRY_EINVAL` for a NULL `dma` or an invalid handle. Requests of the
/// dma not yet released can still be released with `ferry_request_destroy(NULL, &req)`.
///
/// # Safety
/// 1. `dma` is NULL or valid for a read and a write of one pointer.
/// 2. `*dma` is NULL or a dma not yet destroyed, used by no other thread from now on.
#[no_mangle]
pub unsafe extern "C" fn ferry_dma_destroy(dma: *mut *mut FerryDma) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let slot = unsafe { out(dma, "dma") }?;
        if slot.is_null() {
            return Ok(FERRY_SUCCESS);
        }
        // SAFETY: (2).
        let n = unsafe { dma_ref(*slot) }?.barrier();
        // SAFETY: (2): from `Box::into_raw`; no other user.
        let mut b = unsafe { Box::from_raw(*slot) };
        *slot = std::ptr::null_mut();
        b.magic = 0;
        drop(b);
        Ok(n)
    })
}
