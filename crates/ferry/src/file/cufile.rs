//! GPUDirect Storage through cuFile: file <-> device memory by `cuFileRead` / `cuFileWrite`, the
//! third way a chunk moves (beside a host buffer's own `pread`/`pwrite` and the bounce ring).
//!
//! - The transport of a device transfer is decided by one pure function, [`choose`], from
//!   [`Facts`]: the [`CuFileMode`](super::transport::CuFileMode) asked for ([`FileConfig::cufile`](super::FileConfig::cufile),
//!   `FERRY_CUFILE`), whether `libcufile` loads, whether the `nvidia-fs` module is loaded, and
//!   whether the driver, an `O_DIRECT` descriptor and the file's registration could be had.
//!   Every device transfer's [`IoReport`](super::IoReport) carries the [`Choice`] and its reason.
//! - The library: `libcufile.so.0` (or `libcufile.so`), opened by ferry with `dlopen`, its
//!   symbols typed with cudarc's bindings (`cudarc::cufile::sys`). cudarc's own loader is not
//!   used: it panics when the library is missing and does not look for the `.so.0` name.
//! - Driver: opened (`cuFileDriverOpen`) by the first engine that chooses cuFile, closed
//!   (`cuFileDriverClose`) when the last engine or file handle using it is dropped.
//! - Files: a second descriptor, opened with `O_DIRECT`, registered (`cuFileHandleRegister`)
//!   once per [`FileHandle`], deregistered and closed when it is dropped.
//! - Buffers: a load of at least [`REGISTER_MIN`] bytes registers its destination
//!   (`cuFileBufRegister`) for the transfer; it is deregistered when the last chunk finished,
//!   errors included. A refused registration is no error: cuFile then reads through its own
//!   buffers (the report says so).
//! - Chunks: [`FileConfig::chunk_bytes`](super::FileConfig::chunk_bytes) each, claimed by the
//!   workers as every transfer's; a short read or write continues; end of file inside the range
//!   is [`FileError::UnexpectedEof`]; a failed call is [`FileError::CuFile`] with cuFile's code.
//! - Compatibility mode: without `nvidia-fs`, cuFile can still run (POSIX reads into its own
//!   host buffers, then copies), slower than ferry's bounce ring: used only with
//!   [`CuFileMode::On`](super::transport::CuFileMode::On), and only where cuFile itself allows it (`CUFILE_FORCE_COMPAT_MODE=true`,
//!   or `"allow_compat_mode": true` in the cufile.json that `CUFILE_ENV_PATH_JSON` names).

use super::error::{CuFileCode, FileError, IoOp};
use super::io::{OpenMode, DIRECT_ALIGN};
use super::transport::{choose, Choice, Facts};
use super::{FileEngine, FileHandle};
use crate::engine::cuda::sys::driver as cuda;
use crate::memory::{MemKind, RawBuf};
use cudarc::cufile::sys as cf;
use cudarc::driver::CudaContext;
use std::ffi::c_void;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Whether `libcufile` loads here (with every symbol ferry calls).
pub(crate) fn libcufile_present() -> bool {
    api().is_ok()
}

/// Loads of at least this many bytes register their destination with `cuFileBufRegister`
/// (smaller ones do not: registration pins GPU memory into the BAR for the transfer, a cost a
/// small read does not repay). To be measured with real GPUDirect Storage; compat mode ignores
/// it.
pub const REGISTER_MIN: usize = 16 << 20;

// ---------------------------------------------------------------------------------------------
// The driver: one session per process, counted over every engine and file handle using it.

/// One use of cuFile's driver; the driver closes when the last is dropped.
pub(crate) struct Driver {
    api: &'static Api,
    /// `cuFileDriverGetProperties`, in words.
    pub(crate) props: String,
}

/// Users of the driver, and whether ferry opened it (it is not closed when someone else in the
/// process had opened it first: `CU_FILE_DRIVER_ALREADY_OPEN`).
static USERS: Mutex<(usize, bool)> = Mutex::new((0, false));

impl Driver {
    fn acquire() -> Result<Driver, String> {
        let api = api()?;
        let mut g = USERS.lock().unwrap_or_else(PoisonError::into_inner);
        if g.0 == 0 {
            let st = api.driver_open();
            let owned = match st.err {
                0 => true,
                e if e == cf::CUfileOpError::CU_FILE_DRIVER_ALREADY_OPEN as u32 => false,
                _ => return Err(format!("cuFileDriverOpen failed: {}", st.code())),
            };
            g.1 = owned;
        }
        g.0 += 1;
        let props = match api.properties() {
            Ok(p) => format!(
                "nvidia-fs driver {}.{}, compat mode {}allowed by cufile.json",
                p.nvfs.major_version,
                p.nvfs.minor_version,
                if p.nvfs.dcontrolflags
                    & (1 << cf::CUfileDriverControlFlags::CU_FILE_ALLOW_COMPAT_MODE as u32)
                    != 0
                {
                    ""
                } else {
                    "not "
                }
            ),
            Err(c) => format!("cuFileDriverGetProperties failed: {c}"),
        };
        Ok(Driver { api, props })
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let mut g = USERS.lock().unwrap_or_else(PoisonError::into_inner);
        g.0 -= 1;
        if g.0 == 0 && g.1 {
            // Nothing to report to: a failed close leaves the process as it was.
            let _ = self.api.driver_close();
        }
    }
}

/// An engine's hold on the driver, opened at its first cuFile transfer, let go at its drop.
#[derive(Default)]
pub(crate) struct EngineGds {
    driver: OnceLock<Result<Arc<Driver>, String>>,
}

impl EngineGds {
    fn driver(&self) -> Result<Arc<Driver>, String> {
        self.driver
            .get_or_init(|| Driver::acquire().map(Arc::new))
            .clone()
    }
}

// ---------------------------------------------------------------------------------------------
// Files: an O_DIRECT descriptor registered with cuFile, once per file handle.

/// A file handle's cuFile side: how the file was opened, and its registration once tried.
#[derive(Default)]
pub(crate) struct FileGds {
    os_mode: OnceLock<OpenMode>,
    handle: Mutex<Option<Result<Arc<CuHandle>, Refused>>>,
}

#[derive(Clone)]
enum Refused {
    Direct(String),
    Register(String),
}

impl FileGds {
    /// Marks the file as opened by the operating system in `mode` (not a test's `FileIo`).
    pub(crate) fn set_os(&self, mode: OpenMode) {
        let _ = self.os_mode.set(mode);
    }

    fn handle(&self, path: &Path, driver: &Arc<Driver>) -> Result<Arc<CuHandle>, Refused> {
        let mut g = self.handle.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = &*g {
            return r.clone();
        }
        let r = self.register(path, driver);
        *g = Some(r.clone());
        r
    }

    fn register(&self, path: &Path, driver: &Arc<Driver>) -> Result<Arc<CuHandle>, Refused> {
        let Some(&mode) = self.os_mode.get() else {
            return Err(Refused::Direct(
                "not a file of the operating system (FileHandle::from_io)".into(),
            ));
        };
        use std::os::unix::fs::OpenOptionsExt;
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .write(mode != OpenMode::Read)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|e| Refused::Direct(e.to_string()))?;
        let handle = driver.api.handle_register(&fd).map_err(|c| {
            use std::os::unix::fs::MetadataExt;
            let unlinked = fd.metadata().is_ok_and(|m| m.nlink() == 0);
            let udev = Path::new(UDEV_DATA).is_dir();
            Refused::Register(match register_hint(unlinked, udev) {
                Some(hint) => format!("{c} ({hint})"),
                None => c.to_string(),
            })
        })?;
        Ok(Arc::new(CuHandle {
            api: driver.api,
            handle,
            _fd: fd,
            _driver: Arc::clone(driver),
        }))
    }
}

/// The udev database, where libcufile reads a file's filesystem attributes (`ID_FS_USAGE`).
const UDEV_DATA: &str = "/run/udev/data";

/// The likely cause of a refused registration that cuFile's own code does not name (it writes
/// the cause to its log only): a file without a name (libcufile reopens files by path), or a
/// host without a udev database (a VM or container without udevd: libcufile then finds no
/// filesystem attributes for any file, compatibility mode included; seen on the H200 host).
fn register_hint(unlinked: bool, udev: bool) -> Option<&'static str> {
    if unlinked {
        Some("the file has no name (unlinked): cuFile reopens files by path")
    } else if !udev {
        Some(
            "this host has no udev database (/run/udev/data): libcufile reads the \
             filesystem's attributes from it and registers no file without them",
        )
    } else {
        None
    }
}

/// A registered file: deregistered, then its descriptor closed, then the driver let go, on
/// drop (field order).
struct CuHandle {
    api: &'static Api,
    handle: cf::CUfileHandle_t,
    _fd: std::fs::File,
    _driver: Arc<Driver>,
}

// SAFETY: the handle is an opaque token cuFile accepts from any thread; it is deregistered
// once, in drop, after every transfer using it let go of its `Arc`.
unsafe impl Send for CuHandle {}
// SAFETY: as above; cuFileRead/cuFileWrite on one handle from several threads is allowed.
unsafe impl Sync for CuHandle {}

impl Drop for CuHandle {
    fn drop(&mut self) {
        self.api.handle_deregister(self.handle);
    }
}

// ---------------------------------------------------------------------------------------------
// One transfer's cuFile side.

/// A device transfer's transport, and for cuFile what its chunks need.
pub(crate) struct Gds {
    pub(crate) choice: Choice,
    pub(crate) run: Option<Run>,
}

impl Gds {
    /// The report's note: the choice, and what became of the buffer's registration.
    pub(crate) fn note(&self) -> String {
        match self.run.as_ref().and_then(|r| r.reg_note.as_deref()) {
            Some(n) => format!("{}; {n}", self.choice),
            None => self.choice.to_string(),
        }
    }
    /// Bytes cuFile moved.
    pub(crate) fn bytes(&self) -> u64 {
        self.run
            .as_ref()
            .map_or(0, |r| r.bytes.load(Ordering::Acquire))
    }
    /// Deregisters the buffer (the last runner, before the request completes).
    pub(crate) fn finish(&self) {
        if let Some(r) = &self.run {
            drop(r.reg.lock().unwrap_or_else(PoisonError::into_inner).take());
        }
    }
}

/// What a cuFile transfer's runners share.
pub(crate) struct Run {
    handle: Arc<CuHandle>,
    ctx: Arc<CudaContext>,
    base: u64,
    reg: Mutex<Option<BufReg>>,
    reg_note: Option<String>,
    bytes: AtomicU64,
}

/// A registered buffer: deregistered on drop, on every path.
struct BufReg {
    api: &'static Api,
    ctx: Arc<CudaContext>,
    addr: u64,
    _driver: Arc<Driver>,
}

impl Drop for BufReg {
    fn drop(&mut self) {
        // cuFile needs the buffer's context current; nothing to report to if either fails.
        let _ = cuda::bind(&self.ctx);
        let _ = self.api.buf_deregister(self.addr);
    }
}

impl Run {
    /// Moves the chunk of `len` bytes at `at` in the buffer, `foff` in the file.
    pub(crate) fn chunk(
        &self,
        op: IoOp,
        path: &Path,
        foff: u64,
        at: usize,
        len: usize,
    ) -> Result<(), FileError> {
        cuda::bind(&self.ctx).map_err(|e| FileError::Transfer {
            path: path.to_path_buf(),
            offset: foff,
            source: Box::new(crate::cuda::CudaError::from(e).into()),
        })?;
        let mut pos = 0;
        while pos < len {
            let (off, want) = (foff + pos as u64, len - pos);
            let bad = |what: &str| FileError::BadRange(format!("{what} does not fit in off_t"));
            let file_off = i64::try_from(off).map_err(|_| bad("file offset"))?;
            let buf_off = i64::try_from(at + pos).map_err(|_| bad("buffer offset"))?;
            let h = &self.handle;
            let r = h.api.io(op, h.handle, self.base, want, file_off, buf_off);
            match r {
                Ok(0) => return Err(FileError::no_progress(op, path, off, want)),
                Ok(n) => pos += n.min(want),
                Err(CuFileCode::Os { errno }) if errno == libc::EINTR => {}
                Err(code) => {
                    return Err(FileError::CuFile {
                        call: match op {
                            IoOp::Read => "cuFileRead",
                            IoOp::Write => "cuFileWrite",
                        },
                        path: path.to_path_buf(),
                        offset: off,
                        len: want,
                        code,
                    })
                }
            }
        }
        self.bytes.fetch_add(len as u64, Ordering::Relaxed);
        Ok(())
    }
}

impl FileEngine {
    /// What is known about cuFile for a device transfer before `libcufile` is loaded (it is
    /// loaded only once these cheaper facts allow cuFile: not in `Auto` without nvidia-fs):
    /// until then it counts as present.
    pub(super) fn cufile_facts(&self) -> Facts {
        Facts::new(
            self.cfg.cufile,
            true,
            true,
            crate::engine::cuda::sys::probe::nvidia_fs_loaded(),
        )
    }

    /// The transport of a transfer of `buf` (device memory) to or from `file`: the facts
    /// gathered as far as [`choose`] needs them, then, for cuFile, the run state (the context
    /// bound on this thread, the buffer registered for large loads).
    pub(super) fn gds_for(&self, file: &FileHandle, offset: u64, buf: RawBuf, op: IoOp) -> Gds {
        let mut f = self.cufile_facts();
        let a = DIRECT_ALIGN as u64;
        f.aligned = op == IoOp::Read
            || (offset % a == 0 && buf.len as u64 % a == 0 && self.cfg.chunk_bytes as u64 % a == 0);
        let ring = |f: &Facts| Gds {
            choice: choose(f),
            run: None,
        };
        if !choose(&f).transport.is_cufile() {
            return ring(&f);
        }
        f.libcufile = libcufile_present();
        if !f.libcufile {
            return ring(&f);
        }
        let MemKind::Device { ordinal } = buf.kind else {
            f.device = false;
            return ring(&f);
        };
        let ctx = match cuda::context(ordinal) {
            Ok(c) => c,
            Err(e) => {
                f.driver = Err(format!("no CUDA context for device {ordinal}: {e}"));
                return ring(&f);
            }
        };
        if let Err(e) = cuda::bind(&ctx) {
            f.driver = Err(e.to_string());
            return ring(&f);
        }
        let driver = match self.gds.driver() {
            Ok(d) => d,
            Err(e) if !f.nvidia_fs => {
                f.driver = Err(format!(
                    "{e} (without nvidia-fs cuFile opens only in its compatibility mode: \
                     CUFILE_FORCE_COMPAT_MODE=true, or \"allow_compat_mode\": true in cufile.json)"
                ));
                return ring(&f);
            }
            Err(e) => {
                f.driver = Err(e);
                return ring(&f);
            }
        };
        let handle = match file.inner.gds.handle(&file.inner.path, &driver) {
            Ok(h) => h,
            Err(Refused::Direct(e)) => {
                f.direct = Err(e);
                return ring(&f);
            }
            Err(Refused::Register(e)) => {
                f.registered = Err(e);
                return ring(&f);
            }
        };
        let (reg, reg_note) = if op == IoOp::Read && buf.len >= REGISTER_MIN {
            match driver.api.buf_register(buf.addr, buf.len) {
                Ok(()) => (
                    Some(BufReg {
                        api: driver.api,
                        ctx: Arc::clone(&ctx),
                        addr: buf.addr,
                        _driver: Arc::clone(&driver),
                    }),
                    None,
                ),
                Err(c) => (
                    None,
                    Some(format!(
                        "cuFileBufRegister refused the buffer ({c}): read unregistered"
                    )),
                ),
            }
        } else {
            (None, None)
        };
        let mut choice = choose(&f);
        choice.reason = format!("{} ({})", choice.reason, driver.props);
        Gds {
            choice,
            run: Some(Run {
                handle,
                ctx,
                base: buf.addr,
                reg: Mutex::new(reg),
                reg_note,
                bytes: AtomicU64::new(0),
            }),
        }
    }
}

#[cfg(test)]
mod tests;

// ---------------------------------------------------------------------------------------------
// The library: dlopen'ed once, never closed; every call into it below.

/// `CUfileError_t` with both codes as plain integers (cudarc's has Rust enums there, which a
/// value this build does not know would make invalid).
#[repr(C)]
#[derive(Clone, Copy)]
struct Status {
    err: u32,
    cu_err: u32,
}

impl Status {
    fn check(self) -> Result<(), CuFileCode> {
        if self.err == 0 {
            Ok(())
        } else {
            Err(self.code())
        }
    }
    fn code(self) -> CuFileCode {
        CuFileCode::Op {
            code: self.err,
            cuda: self.cu_err,
        }
    }
}

/// The cuFile entry points ferry calls, typed after cudarc's bindings.
struct Api {
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
fn api() -> Result<&'static Api, String> {
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
    fn driver_open(&self) -> Status {
        // SAFETY: no arguments; cuFile opens its driver session (idempotent per process).
        unsafe { (self.driver_open)() }
    }
    fn driver_close(&self) -> Result<(), CuFileCode> {
        // SAFETY: called once, by the last user of a session ferry opened, after every file
        // and buffer registration was let go (each holds a user).
        unsafe { (self.driver_close)() }.check()
    }
    fn properties(&self) -> Result<cf::CUfileDrvProps_t, CuFileCode> {
        // Room for a longer struct than cudarc's, from a newer library.
        let mut room = [0u64; 64];
        // SAFETY: `room` is 512 zeroed, 8-aligned bytes, more than cuFile writes.
        unsafe { (self.get_properties)(room.as_mut_ptr().cast()) }.check()?;
        // SAFETY: the struct is plain integers, all bit patterns valid, and lies at the start
        // of `room`, which is large and aligned enough.
        Ok(unsafe { std::ptr::read(room.as_ptr().cast::<cf::CUfileDrvProps_t>()) })
    }
    fn handle_register(&self, fd: &std::fs::File) -> Result<cf::CUfileHandle_t, CuFileCode> {
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
    fn handle_deregister(&self, h: cf::CUfileHandle_t) {
        // SAFETY: `h` was registered and is deregistered once (`CuHandle::drop`), after every
        // transfer using it finished (they hold the `CuHandle`).
        unsafe { (self.handle_deregister)(h) }
    }
    fn buf_register(&self, addr: u64, len: usize) -> Result<(), CuFileCode> {
        // SAFETY: `addr..addr+len` is device memory of the transfer, valid until it completes
        // (submit's contract); the registration is dropped before it completes (`Gds::finish`)
        // or with the transfer if it never ran.
        unsafe { (self.buf_register)(addr as *const c_void, len, 0) }.check()
    }
    fn buf_deregister(&self, addr: u64) -> Result<(), CuFileCode> {
        // SAFETY: `addr` was registered by `buf_register` and is deregistered once (`BufReg`).
        unsafe { (self.buf_deregister)(addr as *const c_void) }.check()
    }
    /// `cuFileRead` (into) or `cuFileWrite` (from) `base + buf_off`, `len` bytes at `file_off`.
    fn io(
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
fn result(n: isize) -> Result<usize, CuFileCode> {
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
