//! GPUDirect Storage through cuFile: file <-> device memory by `cuFileRead` / `cuFileWrite`, the
//! third way a chunk moves (beside a host buffer's own `pread`/`pwrite` and the bounce ring).
//!
//! - The transport of a device transfer is decided by one pure function, [`choose`], from
//!   [`Facts`]: the [`CuFileMode`] asked for ([`FileConfig::cufile`](super::FileConfig::cufile),
//!   `FERRY_CUFILE`), whether `libcufile` loads, whether the `nvidia-fs` module is loaded, and
//!   whether the driver, an `O_DIRECT` descriptor and the file's registration could be had.
//!   Every device transfer's [`IoReport`](super::IoReport) carries the [`Choice`] and its reason.
//! - The library (`cufile/sys.rs`): `libcufile.so.0` (or `libcufile.so`), opened by ferry with
//!   `dlopen`, its symbols typed with cudarc's bindings (`cudarc::cufile::sys`). cudarc's own
//!   loader is not used: it panics when the library is missing and does not look for the
//!   `.so.0` name.
//! - Driver (`cufile/driver.rs`): opened (`cuFileDriverOpen`) by the first engine that chooses
//!   cuFile, closed (`cuFileDriverClose`) when the last engine or file handle using it is
//!   dropped.
//! - Files (`cufile/driver.rs`): a second descriptor, opened with `O_DIRECT`, registered
//!   (`cuFileHandleRegister`) once per [`FileHandle`], deregistered and closed when it is
//!   dropped.
//! - Buffers: a load of at least [`REGISTER_MIN`] bytes registers its destination
//!   (`cuFileBufRegister`) for the transfer; it is deregistered when the last chunk finished,
//!   errors included. A refused registration is no error: cuFile then reads through its own
//!   buffers (the report says so).
//! - Chunks: [`FileConfig::chunk_bytes`](super::FileConfig::chunk_bytes) each, claimed by the
//!   workers as every transfer's; a short read or write continues; end of file inside the range
//!   is [`FileError::UnexpectedEof`]; a failed call is [`FileError::CuFile`] with cuFile's code.
//! - Compatibility mode: without `nvidia-fs`, cuFile can still run (POSIX reads into its own
//!   host buffers, then copies), slower than ferry's bounce ring: used only with
//!   [`CuFileMode::On`], and only where cuFile itself allows it (`CUFILE_FORCE_COMPAT_MODE=true`,
//!   or `"allow_compat_mode": true` in the cufile.json that `CUFILE_ENV_PATH_JSON` names).

mod driver;
mod sys;

pub(super) use driver::FileGds;
pub(crate) use sys::libcufile_present;

use super::config::FileConfig;
use super::error::{CuFileCode, FileError, IoOp};
use super::handle::FileHandle;
use super::io::DIRECT_ALIGN;
use super::transport::{choose, Choice, CuFileMode, Facts};
use crate::engine::cuda::sys::driver as cuda;
use crate::memory::{MemKind, RawBuf};
use cudarc::driver::CudaContext;
use driver::{CuHandle, Driver, Refused};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use sys::Api;

/// Loads of at least this many bytes register their destination with `cuFileBufRegister`
/// (smaller ones do not: registration pins GPU memory into the BAR for the transfer, a cost a
/// small read does not repay). To be measured with real GPUDirect Storage; compat mode ignores
/// it.
pub const REGISTER_MIN: usize = 16 << 20;

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

/// What is known about cuFile for a device transfer in `mode` before `libcufile` is loaded (it
/// is loaded only once these cheaper facts allow cuFile: not in `Auto` without nvidia-fs):
/// until then it counts as present.
pub(super) fn facts(mode: CuFileMode) -> Facts {
    Facts::new(
        mode,
        true,
        true,
        crate::engine::cuda::sys::probe::nvidia_fs_loaded(),
    )
}

impl EngineGds {
    /// The transport of a transfer of `buf` (device memory) to or from `file` by an engine
    /// set up with `cfg`: the facts gathered as far as [`choose`] needs them, then, for cuFile,
    /// the run state (the context bound on this thread, the buffer registered for large loads).
    pub(super) fn gds_for(
        &self,
        cfg: &FileConfig,
        file: &FileHandle,
        offset: u64,
        buf: RawBuf,
        op: IoOp,
    ) -> Gds {
        let mut f = facts(cfg.cufile);
        let a = DIRECT_ALIGN as u64;
        f.aligned = op == IoOp::Read
            || (offset % a == 0 && buf.len as u64 % a == 0 && cfg.chunk_bytes as u64 % a == 0);
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
        let driver = match self.driver() {
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
