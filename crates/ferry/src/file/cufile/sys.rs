//! cuFile's library, the unsafe bottom of the cuFile path: `libcufile.so.0` (or
//! `libcufile.so`), opened by ferry with `dlopen` once and never closed, its symbols typed with
//! cudarc's bindings (`cudarc::cufile::sys`); every call into it is here. cudarc's own loader
//! is not used: it panics when the library is missing and does not look for the `.so.0` name.

use crate::file::error::{CuFileCode, IoOp};
use cudarc::cufile::sys as cf;
use std::ffi::c_void;
use std::sync::OnceLock;

/// Whether `libcufile` loads here (with every symbol ferry calls).
pub(crate) fn libcufile_present() -> bool {
    api().is_ok()
}

/// `CUfileError_t` with both codes as plain integers (cudarc's has Rust enums there, which a
/// value this build does not know would make invalid).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Status {
    pub(super) err: u32,
    pub(super) cu_err: u32,
}

impl Status {
    pub(super) fn check(self) -> Result<(), CuFileCode> {
        if self.err == 0 {
            Ok(())
        } else {
            Err(self.code())
        }
    }
    pub(super) fn code(self) -> CuFileCode {
        CuFileCode::Op {
            code: self.err,
            cuda: self.cu_err,
        }
    }
}

/// The cuFile entry points ferry calls, typed after cudarc's bindings.
pub(super) struct Api {
    driver_open: unsafe extern "C" fn() -> Status,
    driver_close: unsafe extern "C" fn() -> Status,
    get_properties: unsafe extern "C" fn(*mut cf::CUfileDrvProps_t) -> Status,
    handle_register:
        unsafe extern "C" fn(*mut cf::CUfileHandle_t, *mut cf::CUfileDescr_t) -> Status,
    handle_deregister: unsafe extern "C" fn(cf::CUfileHandle_t),
    buf_register: unsafe extern "C" fn(*const c_void, usize, libc::c_int) -> Status,
    buf_deregister: unsafe extern "C" fn(*const c_void) -> Status,
    read: unsafe extern "C" fn(cf::CUfileHandle_t, *mut c_void, usize, i64, i64) -> isize,
    write: unsafe extern "C" fn(cf::CUfileHandle_t, *const c_void, usize, i64, i64) -> isize,
}

/// The library names tried, in order.
const LIB_NAMES: [&std::ffi::CStr; 2] = [c"libcufile.so.0", c"libcufile.so"];

/// The loaded library, or why it is not there (loaded at the first call, kept for the process).
pub(super) fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, String> {
    let open = |n: &std::ffi::CStr| {
        // SAFETY: dlopen of a valid NUL-terminated name; loading runs only the library's
        // initialisers. The handle is never closed: the symbols stay valid for the process.
        unsafe { libc::dlopen(n.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }
    };
    let lib = LIB_NAMES
        .iter()
        .map(|n| open(n))
        .find(|h| !h.is_null())
        .ok_or_else(|| "libcufile.so.0 was not found".to_string())?;
    // SAFETY: each symbol is looked up in the library just opened and given the signature of
    // cuFile's header (cufile.h of CUDA 12.3 and later, as cudarc's bindings for CUDA 13
    // declare it); `cuFileDriverClose` is the header's macro for `cuFileDriverClose_v2`.
    unsafe {
        Ok(Api {
            driver_open: sym(lib, c"cuFileDriverOpen")?,
            driver_close: sym(lib, c"cuFileDriverClose_v2")
                .or_else(|_| sym(lib, c"cuFileDriverClose"))?,
            get_properties: sym(lib, c"cuFileDriverGetProperties")?,
            handle_register: sym(lib, c"cuFileHandleRegister")?,
            handle_deregister: sym(lib, c"cuFileHandleDeregister")?,
            buf_register: sym(lib, c"cuFileBufRegister")?,
            buf_deregister: sym(lib, c"cuFileBufDeregister")?,
            read: sym(lib, c"cuFileRead")?,
            write: sym(lib, c"cuFileWrite")?,
        })
    }
}

/// The function `name` of `lib` as an `F`.
///
/// # Safety
/// 1. `lib` is a handle from `dlopen` that stays open while the result is used.
/// 2. `F` is an `extern "C"` function pointer type matching the symbol's real signature.
unsafe fn sym<F: Copy>(lib: *mut c_void, name: &std::ffi::CStr) -> Result<F, String> {
    // SAFETY: `lib` is open (contract 1) and `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() || std::mem::size_of::<F>() != std::mem::size_of::<*mut c_void>() {
        return Err(format!("libcufile has no {}", name.to_string_lossy()));
    }
    // SAFETY: `F` is a function pointer of the symbol's signature (contract 2), of the size of
    // the address read.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

impl Api {
    pub(super) fn driver_open(&self) -> Status {
        // SAFETY: no arguments; cuFile opens its driver session (idempotent per process).
        unsafe { (self.driver_open)() }
    }
    pub(super) fn driver_close(&self) -> Result<(), CuFileCode> {
        // SAFETY: called once, by the last user of a session ferry opened, after every file
        // and buffer registration was let go (each holds a user).
        unsafe { (self.driver_close)() }.check()
    }
    pub(super) fn properties(&self) -> Result<cf::CUfileDrvProps_t, CuFileCode> {
        // Room for a longer struct than cudarc's, from a newer library.
        let mut room = [0u64; 64];
        // SAFETY: `room` is 512 zeroed, 8-aligned bytes, more than cuFile writes.
        unsafe { (self.get_properties)(room.as_mut_ptr().cast()) }.check()?;
        // SAFETY: the struct is plain integers, all bit patterns valid, and lies at the start
        // of `room`, which is large and aligned enough.
        Ok(unsafe { std::ptr::read(room.as_ptr().cast::<cf::CUfileDrvProps_t>()) })
    }
    pub(super) fn handle_register(
        &self,
        fd: &std::fs::File,
    ) -> Result<cf::CUfileHandle_t, CuFileCode> {
        use std::os::fd::AsRawFd;
        let mut descr = cf::CUfileDescr_t {
            type_: cf::CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
            handle: cf::CUfileDescr_t__bindgen_ty_1 { fd: fd.as_raw_fd() },
            fs_ops: std::ptr::null(),
        };
        let mut h: cf::CUfileHandle_t = std::ptr::null_mut();
        // SAFETY: both pointers are to valid locals; the descriptor stays open until the handle
        // is deregistered (`CuHandle` owns both and deregisters first).
        unsafe { (self.handle_register)(&mut h, &mut descr) }.check()?;
        Ok(h)
    }
    pub(super) fn handle_deregister(&self, h: cf::CUfileHandle_t) {
        // SAFETY: `h` was registered and is deregistered once (`CuHandle::drop`), after every
        // transfer using it finished (they hold the `CuHandle`).
        unsafe { (self.handle_deregister)(h) }
    }
    pub(super) fn buf_register(&self, addr: u64, len: usize) -> Result<(), CuFileCode> {
        // SAFETY: `addr..addr+len` is device memory of the transfer, valid until it completes
        // (submit's contract); the registration is dropped before it completes (`Gds::finish`)
        // or with the transfer if it never ran.
        unsafe { (self.buf_register)(addr as *const c_void, len, 0) }.check()
    }
    pub(super) fn buf_deregister(&self, addr: u64) -> Result<(), CuFileCode> {
        // SAFETY: `addr` was registered by `buf_register` and is deregistered once (`BufReg`).
        unsafe { (self.buf_deregister)(addr as *const c_void) }.check()
    }
    /// `cuFileRead` (into) or `cuFileWrite` (from) `base + buf_off`, `len` bytes at `file_off`.
    pub(super) fn io(
        &self,
        op: IoOp,
        h: cf::CUfileHandle_t,
        base: u64,
        len: usize,
        file_off: i64,
        buf_off: i64,
    ) -> Result<usize, CuFileCode> {
        let p = base as *mut c_void;
        // SAFETY: `h` is registered; `base + buf_off .. + len` is a chunk of the transfer's
        // device buffer, valid for writes (reads for `cuFileWrite`) and unshared until it
        // completes (submit's contract), touched by this runner only.
        let n = unsafe {
            match op {
                IoOp::Read => (self.read)(h, p, len, file_off, buf_off),
                IoOp::Write => (self.write)(h, p, len, file_off, buf_off),
            }
        };
        result(n)
    }
}

/// A cuFileRead/cuFileWrite return value: bytes, or -1 with `errno`, or minus a CUfileOpError.
pub(super) fn result(n: isize) -> Result<usize, CuFileCode> {
    match n {
        0.. => Ok(n as usize),
        -1 => Err(CuFileCode::Os {
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        }),
        _ => Err(CuFileCode::Op {
            code: u32::try_from(n.unsigned_abs()).unwrap_or(u32::MAX),
            cuda: 0,
        }),
    }
}
