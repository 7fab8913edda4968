//! The CUDA DMA (`aml/dma/cuda.h`) on ferry's CUDA engine, and AML's CUDA operators.
//!
//! - `aml_dma_cuda_create(&dma, kind)`: a ferry CUDA engine on the calling thread's current
//!   device. Its `struct aml_dma_cuda_data` holds the engine's stream for `kind` (what AML
//!   operators enqueue on) and `kind`. `aml_dma_cuda`: the ready one, on stream 0 with
//!   `cudaMemcpyDefault`, its engine made on first use.
//! - An AML operator runs on the calling thread (as AML) with an `aml_dma_cuda_op_arg`; the
//!   request then completes when the stream reaches that point (an event ferry records), so
//!   waiting for it waits for that request only. NULL operator: ferry's planned layout copy,
//!   the memory kinds told from the pointers (`cudaMemcpyDefault`).
//! - Without a CUDA driver every call is `-AML_ENOTSUP`.

use crate::cuda_sys;
use crate::dma::{destroy_dma, planned_job, AmlDma, AmlDmaOperator, AmlDmaOps, Backend};
use crate::error::{fail, guard, inval, AML_ENOTSUP, AML_SUCCESS};
use crate::layout::AmlLayout;
use ferry::cuda::{CudaConfig, CudaEngine, Direction};
use ferry_capi::Fail;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, PoisonError};

/// `cudaMemcpyHostToHost`.
pub const CUDA_MEMCPY_HOST_TO_HOST: c_int = 0;
/// `cudaMemcpyHostToDevice`.
pub const CUDA_MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// `cudaMemcpyDeviceToHost`.
pub const CUDA_MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `cudaMemcpyDeviceToDevice`.
pub const CUDA_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
/// `cudaMemcpyDefault`.
pub const CUDA_MEMCPY_DEFAULT: c_int = 4;

const MAGIC: u64 = 0x616d_6c5f_6375_6461; // "aml_cuda"

/// `struct aml_dma_cuda_data`: AML's fields (the stream operators enqueue on, the copy kind),
/// then this library's.
#[repr(C)]
pub struct AmlDmaCudaData {
    /// `cudaStream_t`.
    pub stream: *mut c_void,
    /// `enum cudaMemcpyKind`.
    pub kind: c_int,
    magic: u64,
    inner: *const Inner,
}

// SAFETY: the stream handle may be used from any thread; `inner` is an `Arc`'s pointer.
unsafe impl Sync for AmlDmaCudaData {}

/// `struct aml_dma_cuda_op_arg`: what an operator gets as `arg` on a CUDA DMA.
#[repr(C)]
pub struct AmlDmaCudaOpArg {
    /// The DMA's data (stream and kind).
    pub data: *mut AmlDmaCudaData,
    /// The caller's `op_arg`.
    pub op_arg: *mut c_void,
}

struct Inner {
    cuda: Arc<CudaEngine>,
    backend: Backend,
}

/// The methods of the CUDA DMA.
#[no_mangle]
pub static aml_dma_cuda_ops: AmlDmaOps = AmlDmaOps {
    create_request: Some(aml_dma_cuda_request_create),
    destroy_request: Some(aml_dma_cuda_request_destroy),
    wait_request: Some(aml_dma_cuda_request_wait),
    barrier: Some(aml_dma_cuda_barrier),
    fprintf: Some(cuda_fprintf),
};

static READY_DATA: AmlDmaCudaData = AmlDmaCudaData {
    stream: std::ptr::null_mut(),
    kind: CUDA_MEMCPY_DEFAULT,
    magic: MAGIC,
    inner: std::ptr::null(),
};

/// The ready CUDA DMA: stream 0, `cudaMemcpyDefault` (ferry tells host from device memory).
#[no_mangle]
pub static aml_dma_cuda: AmlDma = AmlDma {
    ops: &aml_dma_cuda_ops,
    data: &READY_DATA as *const AmlDmaCudaData as *mut c_void,
};

/// The ready DMA's engine, made on first use (on the current device), dropped by
/// `aml_finalize`.
static READY: Mutex<Option<Arc<Inner>>> = Mutex::new(None);

fn new_inner(ordinal: u32) -> Result<Arc<Inner>, Fail> {
    cuda_sys::devices()?;
    let cfg = CudaConfig::from_env(ordinal).map_err(|e| inval(e.to_string()))?;
    let cuda = Arc::new(CudaEngine::with_config(cfg).map_err(|e| match e {
        ferry::cuda::CudaError::NoDriver(_) => fail(AML_ENOTSUP, e.to_string()),
        e => fail(crate::error::AML_FAILURE, e.to_string()),
    })?);
    Ok(Arc::new(Inner {
        backend: Backend::new(Box::new(Arc::clone(&cuda))),
        cuda,
    }))
}

/// The engine behind a CUDA DMA's data.
///
/// # Safety
/// 1. `data` is NULL or a CUDA DMA's data not yet destroyed.
unsafe fn inner<'a>(data: *const c_void) -> Result<(&'a AmlDmaCudaData, Arc<Inner>), Fail> {
    // SAFETY: (1).
    let d: &AmlDmaCudaData = unsafe { data.cast::<AmlDmaCudaData>().as_ref() }
        .ok_or_else(|| inval("dma data is NULL"))?;
    if d.magic != MAGIC {
        return Err(inval("not a CUDA dma (destroyed, or another dma type)"));
    }
    cuda_sys::devices()?;
    if d.inner.is_null() {
        let mut r = READY.lock().unwrap_or_else(PoisonError::into_inner);
        if r.is_none() {
            *r = Some(new_inner(cuda_sys::current_device()?)?);
        }
        return Ok((
            d,
            r.as_ref()
                .map(Arc::clone)
                .ok_or_else(|| inval("no engine"))?,
        ));
    }
    // SAFETY: (1): `inner` is an `Arc` pointer that lives as long as the dma.
    let i = unsafe {
        Arc::increment_strong_count(d.inner);
        Arc::from_raw(d.inner)
    };
    Ok((d, i))
}

/// Drops the ready DMA's engine (`aml_finalize`).
pub(crate) fn finalize_ready() {
    if let Some(i) = READY.lock().unwrap_or_else(PoisonError::into_inner).take() {
        i.backend.barrier();
    }
}

/// Creates a CUDA DMA on the current device for copies of `kind` (`enum cudaMemcpyKind`).
/// Returns `AML_SUCCESS`, `-AML_EINVAL` (NULL dma, unknown kind) or `-AML_FAILURE` (no CUDA
/// driver or device, as AML; or a driver call failed: `ferry_last_error_message` says which).
///
/// # Safety
/// 1. `dma` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_cuda_create(dma: *mut *mut AmlDma, kind: c_int) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let out = unsafe { dma.as_mut() }.ok_or_else(|| inval("dma is NULL"))?;
        let dir = match kind {
            CUDA_MEMCPY_HOST_TO_DEVICE | CUDA_MEMCPY_DEFAULT | CUDA_MEMCPY_HOST_TO_HOST => {
                Direction::HostToDevice
            }
            CUDA_MEMCPY_DEVICE_TO_HOST => Direction::DeviceToHost,
            CUDA_MEMCPY_DEVICE_TO_DEVICE => Direction::DeviceToDevice,
            k => return Err(inval(format!("cudaMemcpyKind {k} is not one of 0..=4"))),
        };
        let i = cuda_sys::current_device()
            .and_then(new_inner)
            .map_err(crate::error::unsupported_is_failure)?;
        let data = Box::new(AmlDmaCudaData {
            stream: i.cuda.stream(dir).cu_stream().cast(),
            kind,
            magic: MAGIC,
            inner: Arc::into_raw(i),
        });
        *out = Box::into_raw(Box::new(AmlDma {
            ops: &aml_dma_cuda_ops,
            data: Box::into_raw(data).cast(),
        }));
        Ok(AML_SUCCESS)
    })
}

/// Waits for the DMA's work, destroys it and sets `*dma` to NULL (NULL `*dma`: no-op).
///
/// # Safety
/// 1. `dma` is NULL or valid; `*dma` NULL or a DMA from `aml_dma_cuda_create` not used
///    afterwards (its unreleased requests may still be waited).
#[no_mangle]
pub unsafe extern "C" fn aml_dma_cuda_destroy(dma: *mut *mut AmlDma) -> c_int {
    let check = |data: *mut c_void| -> Result<(), Fail> {
        // SAFETY: (1).
        let (d, i) = unsafe { inner(data) }?;
        if d.inner.is_null() {
            return Err(inval("the ready aml_dma_cuda is not destroyed"));
        }
        i.backend.barrier();
        Ok(())
    };
    let retire = |d: &mut AmlDmaCudaData| {
        d.magic = 0;
        // SAFETY: (1): from `Arc::into_raw` in create, released once.
        drop(unsafe { Arc::from_raw(d.inner) });
    };
    // SAFETY: (1): a CUDA DMA's data is a `Box<AmlDmaCudaData>`.
    unsafe { destroy_dma(dma, check, retire) }
}

/// Submits a request: `op` (called here, on the DMA's stream, with an `aml_dma_cuda_op_arg`)
/// or, NULL, ferry's planned copy of `src` into `dest`. `req` NULL: reclaimed by the barrier.
/// `-AML_EINVAL`: NULL data, dest or src, layouts that do not match; the operator's error.
///
/// # Safety
/// 1. `data` is NULL or a CUDA DMA's data; `req` NULL or valid for one write.
/// 2. `dest`/`src` are what `op` expects; the memory valid until the request is done.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_cuda_request_create(
    data: *mut c_void,
    req: *mut *mut c_void,
    dest: *mut AmlLayout,
    src: *mut AmlLayout,
    op: AmlDmaOperator,
    op_arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (d, i) = unsafe { inner(data) }?;
        if dest.is_null() || src.is_null() {
            return Err(inval("dest or src is NULL"));
        }
        // Pointer kinds, the operator's driver calls and the recorded event: this device.
        i.cuda
            .context()
            .bind_to_thread()
            .map_err(|e| fail(crate::error::AML_FAILURE, format!("cuCtxSetCurrent: {e:?}")))?;
        let Some(op) = op else {
            // SAFETY: (2).
            let job = unsafe { planned_job(dest, src, cuda_sys::kind_of) }?.ok_or_else(|| {
                fail(
                    AML_ENOTSUP,
                    "the NULL operator needs dense layouts of this library",
                )
            })?;
            // SAFETY: (1), (2).
            return unsafe { i.backend.submit(req, job) };
        };
        let mut arg = AmlDmaCudaOpArg {
            data: (d as *const AmlDmaCudaData).cast_mut(),
            op_arg,
        };
        // SAFETY: (2): the operator's contract; `arg` lives for the call.
        let rc = unsafe { op(dest, src, (&mut arg as *mut AmlDmaCudaOpArg).cast()) };
        if rc != AML_SUCCESS {
            return Ok(rc);
        }
        // SAFETY: the DMA's stream (an engine stream, or the legacy stream 0) is live.
        let r = unsafe { i.cuda.record_raw(d.stream.cast()) }
            .map_err(|e| fail(crate::error::AML_FAILURE, e.to_string()))?;
        // SAFETY: (1).
        unsafe { i.backend.hand_out(req, r) };
        Ok(AML_SUCCESS)
    })
}

/// Waits for this request only (not the whole stream) and releases it.
///
/// # Safety
/// 1. `dma` is NULL or a CUDA DMA's data; `req` NULL or valid; `*req` NULL or its request.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_cuda_request_wait(
    dma: *mut c_void,
    req: *mut *mut c_void,
) -> c_int {
    // SAFETY: (1).
    guard(|| unsafe { inner(dma)?.1.backend.wait(req) })
}

/// Releases a request without its result (waits until its memory is free).
///
/// # Safety
/// As [`aml_dma_cuda_request_wait`].
#[no_mangle]
pub unsafe extern "C" fn aml_dma_cuda_request_destroy(
    dma: *mut c_void,
    req: *mut *mut c_void,
) -> c_int {
    // SAFETY: (1).
    guard(|| unsafe { inner(dma)?.1.backend.cancel(req) })
}

/// Waits for everything submitted to the DMA; the first failure (AML ignores CUDA errors).
///
/// # Safety
/// 1. `data` is NULL or a CUDA DMA's data.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_cuda_barrier(data: *mut c_void) -> c_int {
    guard(|| {
        // The ready `aml_dma_cuda` whose engine was never made has nothing pending: success,
        // as AML (with or without a driver).
        if std::ptr::eq(data.cast_const().cast::<AmlDmaCudaData>(), &READY_DATA)
            && READY
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_none()
        {
            return Ok(AML_SUCCESS);
        }
        // SAFETY: (1).
        Ok(unsafe { inner(data) }?.1.backend.barrier())
    })
}

/// # Safety
/// 1. `data` a CUDA DMA's data; `stream` a valid `FILE *`; `prefix` a C string.
unsafe extern "C" fn cuda_fprintf(
    data: *const c_void,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (d, i) = unsafe { inner(data) }?;
        let lines = [
            format!("dma-cuda: {data:p}"),
            format!("device: {}", i.cuda.ordinal()),
            format!("kind: {}", d.kind),
            format!("stream: {:p}", d.stream),
        ];
        // SAFETY: (1).
        unsafe { crate::dma::print_lines(stream, prefix, &lines) }
    })
}

/// The operator argument of a CUDA DMA.
///
/// # Safety
/// 1. `arg` is NULL or an `aml_dma_cuda_op_arg` of a live CUDA DMA.
unsafe fn op_arg<'a>(arg: *mut c_void) -> Result<&'a AmlDmaCudaOpArg, Fail> {
    // SAFETY: (1).
    let a =
        unsafe { arg.cast::<AmlDmaCudaOpArg>().as_ref() }.ok_or_else(|| inval("arg is NULL"))?;
    // SAFETY: (1).
    match unsafe { a.data.as_ref() } {
        Some(d) if d.magic == MAGIC => Ok(a),
        _ => Err(inval(
            "arg is not an aml_dma_cuda_op_arg (use this operator with a CUDA dma)",
        )),
    }
}

/// AML's flat CUDA copy of 1-D dense layouts (`element_size * dims[0]` bytes) on the DMA's
/// stream; on a `cudaMemcpyDeviceToDevice` DMA, `op_arg` is `AML_DMA_CUDA_DEVICE_PAIR(src,
/// dst)` and the copy is a peer copy.
///
/// # Safety
/// 1. `dst`, `src` are valid layouts over memory of that size; `arg` the DMA's op arg.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_cuda_copy_1D(
    dst: *mut AmlLayout,
    src: *const AmlLayout,
    arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let a = unsafe { op_arg(arg) }?;
        // SAFETY: (1).
        let n = unsafe { crate::linux::flat_bytes(dst, src) }?;
        // SAFETY: (1).
        let (dp, sp) = unsafe {
            (
                crate::layout::aml_layout_rawptr(dst) as u64,
                crate::layout::aml_layout_rawptr(src) as u64,
            )
        };
        // SAFETY: (1): checked to be a live CUDA DMA's data.
        let d = unsafe { &*a.data };
        if d.kind == CUDA_MEMCPY_DEVICE_TO_DEVICE {
            let pair = a.op_arg as usize as u64;
            let (sdev, ddev) = ((pair & 0xffff_ffff) as u32, (pair >> 32) as u32);
            // SAFETY: (1).
            unsafe { cuda_sys::memcpy_peer_async(dp, ddev, sp, sdev, n, d.stream) }?;
        } else {
            // SAFETY: (1).
            unsafe { cuda_sys::memcpy_async(dp, sp, n, d.stream) }?;
        }
        Ok(AML_SUCCESS)
    })
}

/// AML's CUDA memcpy operator: `dst`/`src` are raw pointers, the caller's `op_arg` the byte
/// count; one `cuMemcpyAsync` on the DMA's stream (unified addressing: any direction,
/// device to device too, unlike AML).
///
/// # Safety
/// 1. `dst`/`src` valid for that many bytes until the copy completes; `arg` the DMA's op arg.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_cuda_memcpy_op(
    dst: *mut AmlLayout,
    src: *const AmlLayout,
    arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let a = unsafe { op_arg(arg) }?;
        if dst.is_null() || src.is_null() {
            return Err(inval("dst or src is NULL"));
        }
        // SAFETY: (1).
        let stream = unsafe { (*a.data).stream };
        // SAFETY: (1).
        unsafe { cuda_sys::memcpy_async(dst as u64, src as u64, a.op_arg as usize, stream) }?;
        Ok(AML_SUCCESS)
    })
}
