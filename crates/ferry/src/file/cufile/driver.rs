//! cuFile's driver session and file registrations: the driver opened once per process and
//! counted over every engine and file handle using it, and each file's `O_DIRECT` descriptor
//! registered with cuFile once per [`FileHandle`](crate::file::FileHandle).

use super::sys::{api, Api};
use crate::file::io::OpenMode;
use cudarc::cufile::sys as cf;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

// ---------------------------------------------------------------------------------------------
// The driver: one session per process, counted over every engine and file handle using it.

/// One use of cuFile's driver; the driver closes when the last is dropped.
pub(crate) struct Driver {
    pub(super) api: &'static Api,
    /// `cuFileDriverGetProperties`, in words.
    pub(crate) props: String,
}

/// Users of the driver, and whether ferry opened it (it is not closed when someone else in the
/// process had opened it first: `CU_FILE_DRIVER_ALREADY_OPEN`).
static USERS: Mutex<(usize, bool)> = Mutex::new((0, false));

impl Driver {
    pub(super) fn acquire() -> Result<Driver, String> {
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

// ---------------------------------------------------------------------------------------------
// Files: an O_DIRECT descriptor registered with cuFile, once per file handle.

/// A file handle's cuFile side: how the file was opened, and its registration once tried.
#[derive(Default)]
pub(crate) struct FileGds {
    os_mode: OnceLock<OpenMode>,
    handle: Mutex<Option<Result<Arc<CuHandle>, Refused>>>,
}

#[derive(Clone)]
pub(super) enum Refused {
    Direct(String),
    Register(String),
}

impl FileGds {
    /// Marks the file as opened by the operating system in `mode` (not a test's `FileIo`).
    pub(crate) fn set_os(&self, mode: OpenMode) {
        let _ = self.os_mode.set(mode);
    }

    pub(super) fn handle(
        &self,
        path: &Path,
        driver: &Arc<Driver>,
    ) -> Result<Arc<CuHandle>, Refused> {
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
pub(super) fn register_hint(unlinked: bool, udev: bool) -> Option<&'static str> {
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
pub(super) struct CuHandle {
    pub(super) api: &'static Api,
    pub(super) handle: cf::CUfileHandle_t,
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
