//! The NCCL library, loaded at run time: the only file of this backend that calls into it.
//!
//! Why ferry loads `libnccl` itself rather than through cudarc's `nccl` feature (cudarc 0.19):
//! cudarc searches `libnccl.so`, `libnccl.so.13`, `.12`, ... `.1` but not `libnccl.so.2`, the
//! name NCCL's runtime packages ship (the distro `libnccl2` package and the `nvidia-nccl-cu*`
//! Python wheels install only `libnccl.so.2`); its loader panics when the library is absent, and
//! each entry point panics on first use when the symbol is missing (an older NCCL). Here the
//! library is opened once with `dlopen`, every symbol is looked up at load, and a missing
//! library or symbol is an error string, never a panic.
//!
//! Search order: `$FERRY_NCCL_LIB` (a path or a name), then `libnccl.so.2`, then `libnccl.so`,
//! each through the dynamic loader (so `LD_LIBRARY_PATH` applies).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// `ncclResult_t` as a plain integer (an enum would make an unknown value undefined behaviour).
pub(crate) type NcclResult = c_int;
pub(crate) const SUCCESS: NcclResult = 0;
pub(crate) const IN_PROGRESS: NcclResult = 7;

/// `ncclUint8`.
pub(crate) const UINT8: c_int = 1;

/// An opaque `ncclComm_t`.
pub(crate) type Comm = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UniqueId {
    pub internal: [c_char; 128],
}

/// The first fields of `ncclConfig_t`, as of NCCL 2.14 (the first release with
/// `ncclCommInitRankConfig`). NCCL copies `size` bytes of it and gives every field that a
/// `version` before its own does not know its default, so this prefix works with every later
/// release.
#[repr(C)]
pub(crate) struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
}

impl Config {
    /// A config with only `blocking` set (0: non-blocking communicator).
    pub(crate) fn blocking(blocking: bool) -> Config {
        Config {
            size: std::mem::size_of::<Config>(),
            magic: 0xcafe_beef,
            version: 21400,
            blocking: c_int::from(blocking),
        }
    }
}

type Stream = *mut c_void;

/// Every entry point ferry uses.
pub(crate) struct Lib {
    pub path: String,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    pub get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    pub get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    pub get_last_error: Option<unsafe extern "C" fn(Comm) -> *const c_char>,
    /// Used by the blocking baseline only (`ferry::bench::RawNccl`, feature `bench`); loaded
    /// always, so that the set of symbols a library must have does not depend on the feature.
    #[cfg_attr(not(feature = "bench"), allow(dead_code))]
    pub comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult,
    pub comm_init_rank_config:
        unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int, *mut Config) -> NcclResult,
    pub comm_get_async_error: unsafe extern "C" fn(Comm, *mut NcclResult) -> NcclResult,
    pub comm_abort: unsafe extern "C" fn(Comm) -> NcclResult,
    pub comm_finalize: unsafe extern "C" fn(Comm) -> NcclResult,
    pub comm_destroy: unsafe extern "C" fn(Comm) -> NcclResult,
    pub comm_count: unsafe extern "C" fn(Comm, *mut c_int) -> NcclResult,
    pub comm_cu_device: unsafe extern "C" fn(Comm, *mut c_int) -> NcclResult,
    pub comm_user_rank: unsafe extern "C" fn(Comm, *mut c_int) -> NcclResult,
    pub group_start: unsafe extern "C" fn() -> NcclResult,
    pub group_end: unsafe extern "C" fn() -> NcclResult,
    pub send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult,
    pub recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult,
}

// SAFETY: plain function pointers into a library that stays loaded for the whole process.
unsafe impl Send for Lib {}
// SAFETY: as above.
unsafe impl Sync for Lib {}

/// The loaded library, or why it is not there. Loaded once; never panics.
pub(crate) fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn candidates() -> Vec<String> {
    let mut c = Vec::new();
    if let Some(p) = std::env::var_os("FERRY_NCCL_LIB") {
        // An empty name would make dlopen return the program itself.
        if !p.is_empty() {
            c.push(p.to_string_lossy().into_owned());
        }
    }
    c.push("libnccl.so.2".into());
    c.push("libnccl.so".into());
    c
}

fn load() -> Result<Lib, String> {
    if std::env::var_os("FERRY_NO_NCCL").is_some() {
        return Err("disabled by FERRY_NO_NCCL".into());
    }
    let names = candidates();
    // The first candidate that opens and has every entry point; else the first complaint.
    let mut first_err = None;
    for name in &names {
        let Ok(c) = CString::new(name.as_str()) else {
            continue;
        };
        // SAFETY: a NUL-terminated, non-empty name; dlopen runs the library's initialisers.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            continue;
        }
        match resolve(handle, name) {
            Ok(lib) => return Ok(lib),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Err(first_err.unwrap_or_else(|| {
        format!(
            "the NCCL library was not found (tried {}; set LD_LIBRARY_PATH or FERRY_NCCL_LIB)",
            names.join(", ")
        )
    }))
}

// Each transmute's target is the `Lib` field it initialises, whose type spells the signature.
#[allow(clippy::missing_transmute_annotations)]
fn resolve(handle: *mut c_void, path: &str) -> Result<Lib, String> {
    let sym = |name: &str| -> Result<*mut c_void, String> {
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: a live handle and a NUL-terminated symbol name; looking up calls nothing.
        let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
        if p.is_null() {
            Err(format!(
                "{path} lacks `{name}` (ferry needs NCCL 2.14 or later)"
            ))
        } else {
            Ok(p)
        }
    };
    macro_rules! f {
        ($name:literal) => {
            // SAFETY: the symbol is the NCCL entry point of that name, whose C signature is the
            // field's type (nccl.h, 2.14 and later).
            unsafe { std::mem::transmute::<*mut c_void, _>(sym($name)?) }
        };
    }
    let last = sym("ncclGetLastError").ok();
    Ok(Lib {
        get_version: f!("ncclGetVersion"),
        get_unique_id: f!("ncclGetUniqueId"),
        get_error_string: f!("ncclGetErrorString"),
        // SAFETY: as in `f!`.
        get_last_error: last.map(|p| unsafe {
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Comm) -> *const c_char>(p)
        }),
        comm_init_rank: f!("ncclCommInitRank"),
        comm_init_rank_config: f!("ncclCommInitRankConfig"),
        comm_get_async_error: f!("ncclCommGetAsyncError"),
        comm_abort: f!("ncclCommAbort"),
        comm_finalize: f!("ncclCommFinalize"),
        comm_destroy: f!("ncclCommDestroy"),
        comm_count: f!("ncclCommCount"),
        comm_cu_device: f!("ncclCommCuDevice"),
        comm_user_rank: f!("ncclCommUserRank"),
        group_start: f!("ncclGroupStart"),
        group_end: f!("ncclGroupEnd"),
        send: f!("ncclSend"),
        recv: f!("ncclRecv"),
        path: path.to_string(),
    })
}

impl Lib {
    /// The library's version as NCCL encodes it (e.g. 22703 for 2.27.3).
    pub(crate) fn version(&self) -> Result<i32, NcclResult> {
        let mut v = 0;
        // SAFETY: `v` is a valid out-pointer for one int.
        let r = unsafe { (self.get_version)(&mut v) };
        if r == SUCCESS {
            Ok(v)
        } else {
            Err(r)
        }
    }

    /// `ncclGetErrorString(code)`, and the communicator's last error text where there is one.
    pub(crate) fn message(&self, code: NcclResult, comm: Option<Comm>) -> String {
        // SAFETY: NCCL returns a static NUL-terminated string for any code.
        let s = unsafe { (self.get_error_string)(code) };
        let mut msg = if s.is_null() {
            format!("NCCL error {code}")
        } else {
            // SAFETY: non-null, NUL-terminated, static.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        };
        if let (Some(f), Some(c)) = (self.get_last_error, comm) {
            // SAFETY: `c` is a live communicator (caller); the result is a NUL-terminated string
            // owned by NCCL, read at once.
            let l = unsafe { f(c) };
            if !l.is_null() {
                // SAFETY: as above.
                let last = unsafe { CStr::from_ptr(l) }.to_string_lossy();
                if !last.trim().is_empty() {
                    msg = format!("{msg} ({})", last.trim());
                }
            }
        }
        msg
    }
}
