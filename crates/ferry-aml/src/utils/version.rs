//! `aml/utils/version.h`: the library's version, as values a program compares with the
//! header's macros.

use std::ffi::{c_char, c_int};

/// A C string pointer that may live in a `static` (it points to a static literal).
#[repr(transparent)]
pub struct CStrPtr(pub *const c_char);

// SAFETY: the pointer is to an immutable static string.
unsafe impl Sync for CStrPtr {}

/// `AML_VERSION_MAJOR`.
#[no_mangle]
pub static aml_version_major: c_int = 0;
/// `AML_VERSION_MINOR`.
#[no_mangle]
pub static aml_version_minor: c_int = 3;
/// `AML_VERSION_PATCH`.
#[no_mangle]
pub static aml_version_patch: c_int = 0;
/// `AML_VERSION_REVISION`: "" (a release).
#[no_mangle]
pub static aml_version_revision: CStrPtr = CStrPtr(c"".as_ptr());
/// `AML_VERSION_STRING`.
#[no_mangle]
pub static aml_version_string: CStrPtr = CStrPtr(c"0.3.0-ferry".as_ptr());
