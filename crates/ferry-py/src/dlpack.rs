//! DLPack (the unversioned `DLManagedTensor` ABI, which every producer and consumer speaks):
//! reading a producer's capsule, and making capsules for ferry-owned memory.

use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};

/// `kDLCPU`.
pub(crate) const CPU: i32 = 1;
/// `kDLCUDA`.
pub(crate) const CUDA: i32 = 2;
/// `kDLCUDAHost` (pinned host memory).
pub(crate) const CUDA_HOST: i32 = 3;
/// `kDLCUDAManaged`.
pub(crate) const CUDA_MANAGED: i32 = 13;

const NAME: &CStr = c"dltensor";
const USED: &CStr = c"used_dltensor";

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct DlDevice {
    pub device_type: i32,
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct DlDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct DlTensor {
    pub data: *mut c_void,
    pub device: DlDevice,
    pub ndim: i32,
    pub dtype: DlDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

/// `DLManagedTensor`.
#[repr(C)]
pub(crate) struct DlManaged {
    pub dl_tensor: DlTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DlManaged)>,
}

/// What a producer's capsule describes (copied out; the capsule keeps the memory alive).
#[derive(Debug)]
pub(crate) struct Imported {
    /// Address of the first element (`data + byte_offset`).
    pub addr: u64,
    /// Where it lives.
    pub device: DlDevice,
    /// Element type.
    pub dtype: DlDataType,
    /// Dims.
    pub shape: Vec<i64>,
    /// Strides in elements (None: C-contiguous).
    pub strides: Option<Vec<i64>>,
}

/// Reads the tensor a `dltensor` capsule holds. The capsule stays the owner: keep it alive
/// as long as the memory is used; dropping it (unconsumed) runs the producer's deleter.
pub(crate) fn import(capsule: &Bound<'_, PyAny>) -> PyResult<Imported> {
    let bad = || crate::errors::arg("__dlpack__ did not return a \"dltensor\" capsule");
    // SAFETY: `capsule` is a live Python object (borrowed with the GIL held); PyCapsule_IsValid
    // accepts any object.
    if unsafe { ffi::PyCapsule_IsValid(capsule.as_ptr(), NAME.as_ptr()) } != 1 {
        return Err(bad());
    }
    // SAFETY: a valid capsule of this name (checked above).
    let p =
        unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), NAME.as_ptr()) }.cast::<DlManaged>();
    if p.is_null() {
        return Err(bad());
    }
    // SAFETY: a "dltensor" capsule holds a DLManagedTensor (the DLPack ABI), valid while the
    // capsule is unconsumed and alive, which the caller's borrow guarantees.
    let t = unsafe { &(*p).dl_tensor };
    let ndim = usize::try_from(t.ndim).map_err(|_| crate::errors::arg("negative ndim"))?;
    // SAFETY: DLPack: `shape` holds `ndim` values, and `strides`, when not null, too.
    let shape = unsafe { slice(t.shape, ndim) };
    // SAFETY: as above.
    let strides = (!t.strides.is_null()).then(|| unsafe { slice(t.strides, ndim) });
    Ok(Imported {
        addr: (t.data as u64).wrapping_add(t.byte_offset),
        device: t.device,
        dtype: t.dtype,
        shape,
        strides,
    })
}

/// # Safety
/// 1. `p` points to `n` readable `i64`s, or `n` is 0.
unsafe fn slice(p: *const i64, n: usize) -> Vec<i64> {
    if n == 0 || p.is_null() {
        return Vec::new();
    }
    // SAFETY: `n` readable values at `p` (1).
    unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
}

/// What a ferry-made capsule owns: the memory's owner and the shape and strides the
/// `DLTensor` points into.
struct Ctx {
    _owner: Box<dyn Send>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

/// A `dltensor` capsule for `ndim`-D memory at `addr` owned by `owner` (kept alive until the
/// consumer calls the deleter, or the capsule dies unconsumed).
pub(crate) fn export(
    py: Python<'_>,
    owner: Box<dyn Send>,
    addr: u64,
    device: DlDevice,
    dtype: DlDataType,
    shape: &[usize],
) -> PyResult<PyObject> {
    let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    let mut ctx = Box::new(Ctx {
        _owner: owner,
        shape,
        strides,
    });
    let managed = Box::new(DlManaged {
        dl_tensor: DlTensor {
            data: addr as *mut c_void,
            device,
            ndim: ctx.shape.len() as i32,
            dtype,
            shape: ctx.shape.as_mut_ptr(),
            strides: ctx.strides.as_mut_ptr(),
            byte_offset: 0,
        },
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(deleter),
    });
    let managed = Box::into_raw(managed);
    // SAFETY: `managed` was just made from a Box; the context's vectors stay where they are
    // when the Box holding them moves (their heap buffers do not move).
    unsafe { (*managed).manager_ctx = Box::into_raw(ctx).cast() };
    // SAFETY: a valid pointer and a static name; the destructor frees it unless consumed.
    let cap = unsafe { ffi::PyCapsule_New(managed.cast(), NAME.as_ptr(), Some(capsule_dtor)) };
    if cap.is_null() {
        // SAFETY: the capsule was not made, so `managed` is still ours alone.
        unsafe { deleter(managed) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference just returned by PyCapsule_New.
    Ok(unsafe { PyObject::from_owned_ptr(py, cap) })
}

/// The DLPack deleter of ferry-made tensors: frees the tensor and drops its owner.
///
/// # Safety
/// 1. `p` is a `DlManaged` made by [`export`], not yet deleted.
unsafe extern "C" fn deleter(p: *mut DlManaged) {
    if p.is_null() {
        return;
    }
    // SAFETY: made by `export` from a Box and deleted once (1).
    let m = unsafe { Box::from_raw(p) };
    if !m.manager_ctx.is_null() {
        // SAFETY: made by `export` from a Box<Ctx> (1).
        drop(unsafe { Box::from_raw(m.manager_ctx.cast::<Ctx>()) });
    }
}

/// The capsule destructor: deletes the tensor unless a consumer took it (renamed the capsule
/// `used_dltensor`, and calls the deleter itself).
///
/// # Safety
/// 1. `cap` is a capsule made by [`export`], being destroyed.
unsafe extern "C" fn capsule_dtor(cap: *mut ffi::PyObject) {
    // SAFETY: a live capsule (1); the GIL is held in a destructor.
    if unsafe { ffi::PyCapsule_IsValid(cap, USED.as_ptr()) } == 1 {
        return;
    }
    // SAFETY: as above; an unconsumed capsule still holds our pointer under its first name.
    let p = unsafe { ffi::PyCapsule_GetPointer(cap, NAME.as_ptr()) }.cast::<DlManaged>();
    if p.is_null() {
        // SAFETY: clears the error PyCapsule_GetPointer may have set.
        unsafe { ffi::PyErr_Clear() };
        return;
    }
    // SAFETY: made by `export`, not consumed, so not deleted (1).
    unsafe { deleter(p) };
}
