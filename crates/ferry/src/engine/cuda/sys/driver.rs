//! The driver's entry points ferry needs: loading, contexts, error strings. All calls into
//! cudarc's `result`/`sys` layers that are shared by the other files of this backend live here
//! or beside their single user.

use super::error::{error_string, CudaError};
use crate::memory::MemKind;
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use super::error::DriverError;

/// Turns a driver result into `Result`, naming the call.
pub(crate) fn check(call: &'static str, code: sys::CUresult) -> Result<(), DriverError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DriverError::new(call, code))
    }
}

/// Whether the driver library loads and initialises; the driver version (e.g. 13000) if so.
/// Never panics: cudarc's loader panics when `libcuda` is absent, so its presence is tested
/// first with a plain `dlopen`, and nothing else is called when it is missing.
pub(crate) fn driver() -> Result<i32, CudaError> {
    static STATE: OnceLock<Result<i32, String>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            if std::env::var_os("FERRY_NO_CUDA").is_some() {
                return Err("disabled by FERRY_NO_CUDA".to_string());
            }
            // SAFETY: only tries to dlopen the driver library by its usual names and closes it
            // again; runs no code of the library but its initialisers.
            if !unsafe { sys::is_culib_present() } {
                return Err("the CUDA driver library (libcuda.so) was not found".to_string());
            }
            result::init().map_err(|e| format!("cuInit failed: {}", error_string(e.0)))?;
            let mut v = 0;
            // SAFETY: `v` is a valid out-pointer for one int.
            check("cuDriverGetVersion", unsafe {
                sys::cuDriverGetVersion(&mut v)
            })
            .map_err(|e| e.to_string())?;
            Ok(v)
        })
        .clone()
        .map_err(CudaError::NoDriver)
}

/// Number of devices the driver sees (0 when there is no driver).
pub(crate) fn device_count() -> Result<u32, CudaError> {
    driver()?;
    let n =
        result::device::get_count().map_err(|e| DriverError::from_cudarc("cuDeviceGetCount", e))?;
    Ok(n.max(0) as u32)
}

/// The primary context of device `ordinal`, shared by every engine and buffer of the process.
pub(crate) fn context(ordinal: u32) -> Result<Arc<CudaContext>, CudaError> {
    static CTXS: OnceLock<Mutex<Vec<Option<Arc<CudaContext>>>>> = OnceLock::new();
    let count = device_count()?;
    if ordinal >= count {
        return Err(CudaError::NoDevice { ordinal, count });
    }
    let mut ctxs = CTXS
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if ctxs.len() <= ordinal as usize {
        ctxs.resize(ordinal as usize + 1, None);
    }
    if let Some(c) = &ctxs[ordinal as usize] {
        return Ok(Arc::clone(c));
    }
    let c = CudaContext::new(ordinal as usize)
        .map_err(|e| DriverError::from_cudarc("cuDevicePrimaryCtxRetain", e))?;
    ctxs[ordinal as usize] = Some(Arc::clone(&c));
    Ok(c)
}

/// The driver's memory type of unified address `addr` (`CU_MEMORYTYPE_*`), or None for an
/// address the driver does not know (pageable host memory).
pub(crate) fn memory_type(addr: u64) -> Option<u32> {
    let mut ty: u32 = 0;
    // SAFETY: queries one attribute into a local of the documented size (unsigned int); the
    // driver only looks the address up in its tables and never dereferences it.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ty as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            addr,
        )
    };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(ty)
}

/// Whether the `len` (> 0) bytes at unified address `addr` are page-locked host memory of
/// one allocation or registration (a `PinnedBuffer` or `Registered` seen through a slice,
/// memory pinned by another library), asked in one driver call where the driver gives the
/// allocation's range: `cuPointerGetAttributes` of the memory type, the range's start and
/// size. Where it does not (no range, or a range that does not cover the bytes), the last
/// byte is asked on its own ([`memory_type`]), as a registration covers whole pages of one
/// range.
///
/// Why one call (H200 host, driver 580, `bench/results/h200.md` run 79): on page-locked memory
/// it costs 101-112 ns against 90-96 ns for each end asked on its own; on pageable memory, the
/// usual answer, 200 ns against 743 ns for `cuPointerGetAttribute`, which fails there
/// (`CUDA_ERROR_INVALID_VALUE`) and takes the driver's slower error path.
pub(crate) fn page_locked(addr: u64, len: usize) -> bool {
    use sys::CUpointer_attribute as A;
    let host = sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32;
    let (mut ty, mut start, mut size) = (0u32, 0u64, 0usize);
    let mut attrs = [
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut std::ffi::c_void; 3] = [
        (&mut ty as *mut u32).cast(),
        (&mut start as *mut u64).cast(),
        (&mut size as *mut usize).cast(),
    ];
    // SAFETY: three attributes, each written into a local of its documented type (unsigned
    // int, CUdeviceptr, size_t); the driver only looks the address up in its tables (an
    // address it does not know gets zeros and success, per the documentation).
    let r = unsafe { sys::cuPointerGetAttributes(3, attrs.as_mut_ptr(), data.as_mut_ptr(), addr) };
    if r != sys::CUresult::CUDA_SUCCESS {
        // An older driver without the call's range attributes: both ends one by one.
        return memory_type(addr) == Some(host) && last_byte_locked(addr, len, host);
    }
    if ty != host {
        return false;
    }
    let end = addr.checked_add(len as u64);
    let covered = start <= addr && end.is_some_and(|e| e <= start.saturating_add(size as u64));
    covered || last_byte_locked(addr, len, host)
}

/// Whether the last of the `len` bytes at `addr` is of memory type `host`.
fn last_byte_locked(addr: u64, len: usize, host: u32) -> bool {
    addr.checked_add(len as u64 - 1)
        .is_some_and(|last| memory_type(last) == Some(host))
}

/// The device-accessible address of the memory at unified address `addr` (the mapped address
/// of page-locked host memory, else `addr`), or None for memory the device cannot reach
/// (pageable host memory).
pub(crate) fn device_address(addr: u64) -> Option<u64> {
    if memory_type(addr)? != sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 {
        return Some(addr);
    }
    let mut d: u64 = 0;
    // SAFETY: `addr` is page-locked host memory (the driver said so); writes one pointer.
    let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, addr as *mut _, 0) };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(d)
}

/// Makes `ctx` current on this thread ([`set_current`]), with ferry's error.
pub(crate) fn bind(ctx: &CudaContext) -> Result<(), DriverError> {
    set_current(ctx).map_err(|e| DriverError::from_cudarc("cuCtxSetCurrent", e))
}

/// Makes `ctx` current on this thread: where it already is (every call after a thread's
/// first), one `cuCtxGetCurrent` and nothing else; else `cuCtxSetCurrent`. Not cudarc's
/// `bind_to_thread`, which also first returns (and clears) any error cudarc stored from an
/// earlier asynchronous call of the context (a drop's free), with an atomic swap each call (on
/// the path a small copy's caller waits for, issue 14): that error is cudarc's to report, and
/// returned here it would fail an unrelated call, or end a wait before the work it waits for
/// ([`sync_stream`]).
pub(crate) fn set_current(ctx: &CudaContext) -> Result<(), cudarc::driver::DriverError> {
    let mut current: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer for one context handle.
    let r = unsafe { sys::cuCtxGetCurrent(&mut current) };
    if r == sys::CUresult::CUDA_SUCCESS && current == ctx.cu_ctx() {
        return Ok(());
    }
    // SAFETY: `ctx` is alive (borrowed), so is its context handle.
    unsafe { sys::cuCtxSetCurrent(ctx.cu_ctx()) }.result()
}

/// Waits for all work enqueued on `stream` (`cuStreamSynchronize`, its context made current).
/// Callers about to free or reuse memory the stream's work touches use this, not cudarc's
/// `CudaStream::synchronize`: that returns an error cudarc stored earlier without waiting
/// ([`set_current`]).
pub(crate) fn sync_stream(stream: &CudaStream) -> Result<(), cudarc::driver::DriverError> {
    set_current(stream.context())?;
    // SAFETY: `stream` is alive (borrowed), a stream of the context made current above.
    unsafe { sys::cuStreamSynchronize(stream.cu_stream()) }.result()
}

/// Waits for `event`'s recorded work (`cuEventSynchronize`, its context made current), for
/// the reason [`sync_stream`] gives.
pub(crate) fn sync_event(event: &CudaEvent) -> Result<(), cudarc::driver::DriverError> {
    set_current(event.context())?;
    // SAFETY: `event` is alive (borrowed), an event of the context made current above.
    unsafe { sys::cuEventSynchronize(event.cu_event()) }.result()
}

/// Records `event` after the work enqueued on `stream` so far (`cuEventRecord`, the stream's
/// context made current), for the reason [`sync_stream`] gives: cudarc's `CudaEvent::record`
/// first returns an error cudarc stored earlier, failing a record that would succeed.
pub(crate) fn record_event(
    event: &CudaEvent,
    stream: &CudaStream,
) -> Result<(), cudarc::driver::DriverError> {
    set_current(stream.context())?;
    // SAFETY: both are alive (borrowed), of the context made current above.
    unsafe { sys::cuEventRecord(event.cu_event(), stream.cu_stream()) }.result()
}

/// `cuMemcpyBatchAsync_v2` (CUDA 13): no `failIdx`.
type BatchV2 = unsafe extern "C" fn(
    *mut sys::CUdeviceptr,
    *mut sys::CUdeviceptr,
    *mut usize,
    usize,
    *mut sys::CUmemcpyAttributes,
    *mut usize,
    usize,
    sys::CUstream,
) -> sys::CUresult;
/// `cuMemcpyBatchAsync` (CUDA 12.8's ABI, still exported by later drivers): a `failIdx`
/// out-parameter before the stream.
type BatchV1 = unsafe extern "C" fn(
    *mut sys::CUdeviceptr,
    *mut sys::CUdeviceptr,
    *mut usize,
    usize,
    *mut sys::CUmemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    sys::CUstream,
) -> sys::CUresult;

/// The driver's batched copy, by the symbol it exports.
#[derive(Clone, Copy)]
enum BatchFn {
    V2(BatchV2),
    V1(BatchV1),
}

/// The batched copy the driver exports, looked up once at run time: `cuMemcpyBatchAsync_v2`
/// (CUDA 13's ABI) first, else `cuMemcpyBatchAsync` (12.8's, with `failIdx`). Each exported
/// name keeps its own ABI (a newer ABI gets a new suffix), so the name says how to call it.
fn batch_fn() -> Result<BatchFn, &'static str> {
    static FOUND: OnceLock<Result<BatchFn, &'static str>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        if driver().is_err() {
            return Err("no CUDA driver");
        }
        // SAFETY: the library is present and initialised (checked above); looking a symbol up
        // calls nothing. Each symbol is the driver's function of exactly the type it is read
        // as (its exported name fixes its ABI: cuda.h's prototypes of both), and the library
        // is never unloaded (cudarc keeps it for the process), so the pointers stay valid.
        unsafe {
            let lib = sys::culib();
            if let Ok(f) = lib.get::<BatchV2>(b"cuMemcpyBatchAsync_v2") {
                return Ok(BatchFn::V2(*f));
            }
            if let Ok(f) = lib.get::<BatchV1>(b"cuMemcpyBatchAsync") {
                return Ok(BatchFn::V1(*f));
            }
        }
        Err("the driver exports no cuMemcpyBatchAsync (CUDA 12.8 or later)")
    })
}

/// Whether the driver has a batched copy ([`batch_fn`]): its symbol's name
/// (`cuMemcpyBatchAsync_v2`, or 12.8's `cuMemcpyBatchAsync`), or why not.
pub(crate) fn batch_copy() -> Result<&'static str, &'static str> {
    batch_fn().map(|f| match f {
        BatchFn::V2(_) => "cuMemcpyBatchAsync_v2",
        BatchFn::V1(_) => "cuMemcpyBatchAsync",
    })
}

/// Where the driver may expect memory of kind `k` (a batched copy's location hint): device
/// memory on its ordinal, host memory on the host; managed memory is left to the driver.
pub(crate) fn location(k: MemKind) -> sys::CUmemLocation {
    let (type_, id) = match k {
        MemKind::Device { ordinal } => (
            sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            ordinal as i32,
        ),
        MemKind::Pinned | MemKind::Mapped | MemKind::Pageable => {
            (sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, 0)
        }
        _ => (sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID, 0),
    };
    sys::CUmemLocation { type_, id }
}

/// The attributes of a batched copy's ranges from memory of kind `src` to memory of kind
/// `dst`: the source read in stream order, each side's location hint ([`location`]), and
/// `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE` where `overlap_compute` (the copy engines
/// preferred to the SMs, the caller's kernels running).
pub(crate) fn copy_attributes(
    dst: MemKind,
    src: MemKind,
    overlap_compute: bool,
) -> sys::CUmemcpyAttributes {
    let flags = if overlap_compute {
        sys::CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
    } else {
        sys::CUmemcpyFlags::CU_MEMCPY_FLAG_DEFAULT
    };
    sys::CUmemcpyAttributes {
        srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        srcLocHint: location(src),
        dstLocHint: location(dst),
        flags: flags as u32,
    }
}

/// A batched copy the driver refused: its error, and (12.8's symbol only, where the driver
/// named one) the index of the copy that failed; the copies before it were enqueued.
pub(crate) struct BatchRefused {
    pub error: cudarc::driver::DriverError,
    pub fail_idx: Option<usize>,
}

/// Enqueues one batched copy on `stream` through the driver's batched copy ([`batch_fn`]):
/// `sizes[i]` bytes from `srcs[i]` to `dsts[i]` for every `i`, unordered among themselves, in
/// stream order with the stream's other work. `attrs[j]` applies from copy `attr_idxs[j]` up
/// to the next one's start.
///
/// # Safety
/// 1. The three copy slices have the same length, above 0; `attrs` and `attr_idxs` have the
///    same length, above 0, `attr_idxs[0]` is 0 and the indices increase below the copies'
///    count.
/// 2. Every `dsts[i] .. + sizes[i]` is memory valid for writes and every `srcs[i] .. +
///    sizes[i]` valid for reads (unified addresses the driver can copy) until the stream has
///    passed this copy; no destination overlaps another or a source.
/// 3. `stream` is a live stream of the current context, not the legacy default stream.
pub(crate) unsafe fn memcpy_batch(
    dsts: &mut [u64],
    srcs: &mut [u64],
    sizes: &mut [usize],
    attrs: &mut [sys::CUmemcpyAttributes],
    attr_idxs: &mut [usize],
    stream: sys::CUstream,
) -> Result<(), BatchRefused> {
    let refused = |code: sys::CUresult, fail_idx: Option<usize>| BatchRefused {
        error: cudarc::driver::DriverError(code),
        fail_idx,
    };
    let f = batch_fn().map_err(|_| refused(sys::CUresult::CUDA_ERROR_NOT_FOUND, None))?;
    let (n, na) = (sizes.len(), attrs.len());
    let mut fail_idx = usize::MAX;
    // SAFETY: the arrays hold `n` (copies) and `na` (attributes) entries (1), read during the
    // call only; the copies' memory is valid by (2), the stream by (3); `fail_idx` is a valid
    // out-pointer for one `size_t`. Each function pointer has its symbol's ABI ([`batch_fn`]).
    let r = unsafe {
        match f {
            BatchFn::V2(f) => f(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                n,
                attrs.as_mut_ptr(),
                attr_idxs.as_mut_ptr(),
                na,
                stream,
            ),
            BatchFn::V1(f) => f(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                n,
                attrs.as_mut_ptr(),
                attr_idxs.as_mut_ptr(),
                na,
                &mut fail_idx,
                stream,
            ),
        }
    };
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        // SIZE_MAX (or anything past the batch): the failure is no one copy's.
        code => Err(refused(code, (fail_idx < n).then_some(fail_idx))),
    }
}
