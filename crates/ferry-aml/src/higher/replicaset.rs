//! `aml/higher/replicaset.h`: the generic replicaset (a set of replicas of one buffer and its
//! methods). AML's only implementation needs hwloc, which libaml does not use; a program may
//! bring its own methods.

use crate::error::{AML_EINVAL, AML_ENOTSUP};
use std::ffi::{c_int, c_uint, c_void};

/// `struct aml_replicaset_ops`.
#[repr(C)]
pub struct AmlReplicasetOps {
    /// Fills every replica from `data`.
    pub init: Option<unsafe extern "C" fn(*mut AmlReplicaset, *const c_void) -> c_int>,
    /// Copies replica `id` to the others.
    pub sync: Option<unsafe extern "C" fn(*mut AmlReplicaset, c_uint) -> c_int>,
}

/// `struct aml_replicaset`.
#[repr(C)]
pub struct AmlReplicaset {
    /// The replicas.
    pub n: c_uint,
    /// The size of one.
    pub size: usize,
    /// Their pointers.
    pub replica: *mut *mut c_void,
    /// The methods.
    pub ops: *mut AmlReplicasetOps,
    /// The implementation's data.
    pub data: *mut c_void,
}

/// The replicaset's methods, or `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `r` NULL or a valid replicaset.
unsafe fn ops<'a>(r: *mut AmlReplicaset) -> Result<&'a AmlReplicasetOps, c_int> {
    // SAFETY: (1).
    unsafe { r.as_ref().and_then(|r| r.ops.as_ref()) }.ok_or(-AML_EINVAL)
}

/// Fills every replica from `data` with the replicaset's `init`: `-AML_EINVAL` for NULL,
/// `-AML_ENOTSUP` without the method; else its result.
///
/// # Safety
/// 1. `replicaset` NULL or valid; `data` what its `init` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_replicaset_init(
    replicaset: *mut AmlReplicaset,
    data: *const c_void,
) -> c_int {
    if data.is_null() {
        return -AML_EINVAL;
    }
    // SAFETY: (1).
    match unsafe { ops(replicaset) } {
        // SAFETY: (1): the replicaset's own method.
        Ok(o) => o
            .init
            .map_or(-AML_ENOTSUP, |f| unsafe { f(replicaset, data) }),
        Err(rc) => rc,
    }
}

/// Copies replica `id` to the others with the replicaset's `sync`: `-AML_EINVAL` for NULL,
/// `-AML_ENOTSUP` without the method; else its result.
///
/// # Safety
/// 1. `replicaset` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_replicaset_sync(replicaset: *mut AmlReplicaset, id: c_uint) -> c_int {
    // SAFETY: (1).
    match unsafe { ops(replicaset) } {
        // SAFETY: (1): the replicaset's own method.
        Ok(o) => o
            .sync
            .map_or(-AML_ENOTSUP, |f| unsafe { f(replicaset, id) }),
        Err(rc) => rc,
    }
}
