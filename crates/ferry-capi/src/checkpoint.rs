//! Checkpoints (`ferry_checkpoint_*`): safetensors files saved from the caller's tensors
//! (host or GPU memory), in the background too, and loaded back into the caller's buffers,
//! through [`ferry::checkpoint`].

use crate::error::{guard, Fail, FERRY_EDRIVER, FERRY_EINVAL, FERRY_ENOTAVAIL, FERRY_SUCCESS};
use crate::request::{wait_release, FerryBuffer, FerryRequest};
use ferry::checkpoint::{self, CheckpointError, Dest, Dtype, SaveOptions, SaveTensor, Writer};
use ferry::cuda::{CudaEngine, CudaError};
use ferry::file::{FileConfig, FileEngine};
use ferry::request::{BackendError, Signal};
use ferry::{MemKind, Memory, MemoryMut, RawBuf, Request, RequestError};
use std::ffi::{c_char, c_int, CStr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// The dtypes of `FERRY_DTYPE_*`, in code order (`FERRY_DTYPE_BOOL` is 0).
const DTYPES: [Dtype; 20] = [
    Dtype::BOOL,
    Dtype::U8,
    Dtype::I8,
    Dtype::I16,
    Dtype::U16,
    Dtype::F16,
    Dtype::BF16,
    Dtype::I32,
    Dtype::U32,
    Dtype::F32,
    Dtype::F64,
    Dtype::I64,
    Dtype::U64,
    Dtype::F8_E5M2,
    Dtype::F8_E4M3,
    Dtype::F8_E8M0,
    Dtype::C64,
    Dtype::F4,
    Dtype::F6_E2M3,
    Dtype::F6_E3M2,
];

/// `ferry_checkpoint_load`: a tensor's dtype left unchecked.
pub const FERRY_DTYPE_ANY: i32 = -1;
/// Booleans, one byte each.
pub const FERRY_DTYPE_BOOL: i32 = 0;
/// Unsigned 8-bit integers.
pub const FERRY_DTYPE_U8: i32 = 1;
/// Signed 8-bit integers.
pub const FERRY_DTYPE_I8: i32 = 2;
/// Signed 16-bit integers.
pub const FERRY_DTYPE_I16: i32 = 3;
/// Unsigned 16-bit integers.
pub const FERRY_DTYPE_U16: i32 = 4;
/// IEEE half floats.
pub const FERRY_DTYPE_F16: i32 = 5;
/// bfloat16.
pub const FERRY_DTYPE_BF16: i32 = 6;
/// Signed 32-bit integers.
pub const FERRY_DTYPE_I32: i32 = 7;
/// Unsigned 32-bit integers.
pub const FERRY_DTYPE_U32: i32 = 8;
/// IEEE single floats.
pub const FERRY_DTYPE_F32: i32 = 9;
/// IEEE double floats.
pub const FERRY_DTYPE_F64: i32 = 10;
/// Signed 64-bit integers.
pub const FERRY_DTYPE_I64: i32 = 11;
/// Unsigned 64-bit integers.
pub const FERRY_DTYPE_U64: i32 = 12;
/// 8-bit floats, 5 exponent bits.
pub const FERRY_DTYPE_F8_E5M2: i32 = 13;
/// 8-bit floats, 4 exponent bits.
pub const FERRY_DTYPE_F8_E4M3: i32 = 14;
/// 8-bit exponents (MX scales).
pub const FERRY_DTYPE_F8_E8M0: i32 = 15;
/// Complex numbers of two single floats.
pub const FERRY_DTYPE_C64: i32 = 16;
/// 4-bit floats (two per byte).
pub const FERRY_DTYPE_F4: i32 = 17;
/// 6-bit floats, 2 exponent bits.
pub const FERRY_DTYPE_F6_E2M3: i32 = 18;
/// 6-bit floats, 3 exponent bits.
pub const FERRY_DTYPE_F6_E3M2: i32 = 19;

/// Saves (`ferry_checkpoint_options.writer`): the library's choice (buffered under 64 MiB;
/// `O_DIRECT` when fsynced or from host memory; from a GPU, the hybrid writer).
pub const FERRY_WRITER_AUTO: i32 = 0;
/// Saves: parallel writes through the page cache.
pub const FERRY_WRITER_BUFFERED: i32 = 1;
/// Saves: `O_DIRECT` from aligned windows (buffered where the file system refuses it).
pub const FERRY_WRITER_DIRECT: i32 = 2;
/// Saves: `O_DIRECT` from the end beside buffered writes from the start into the page
/// cache's room before writeback, each at its own rate.
pub const FERRY_WRITER_HYBRID: i32 = 3;

/// One tensor of a checkpoint (`ferry_tensor` in C): its name, dtype, shape and bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FerryTensor {
    /// UTF-8, NUL-terminated.
    pub name: *const c_char,
    /// One of `FERRY_DTYPE_*` (`FERRY_DTYPE_ANY` for a load that does not check it).
    pub dtype: i32,
    /// Dimensions (0: a scalar).
    pub ndims: usize,
    /// `ndims` dimensions (NULL when `ndims` is 0; a load: NULL leaves the shape unchecked).
    pub shape: *const usize,
    /// Its bytes, where they live (`len` 0 with any `ptr` for an empty tensor).
    pub buf: FerryBuffer,
}

/// Options of the checkpoint calls (`ferry_checkpoint_options`); NULL means all zero.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct FerryCheckpointOptions {
    /// Saves: non-zero syncs the files (and their folder) before they count as written.
    pub fsync: c_int,
    /// Saves to an index path or a folder: the largest shard in bytes (0: 5e9, as Hugging
    /// Face cuts them).
    pub shard_bytes: u64,
    /// `ferry_checkpoint_save_async`: host memory for the copy of the tensors (0: 1 GiB); a
    /// larger checkpoint is streamed through it.
    pub snapshot_bytes: u64,
    /// File engine worker threads (0: `FERRY_FILE_THREADS`, else one per core up to 16).
    pub threads: c_int,
    /// Non-zero: `O_DIRECT` where the file system and alignment allow.
    pub direct: c_int,
    /// `ferry_checkpoint_save_async`: non-zero keeps the copy's host memory once written,
    /// for the next asynchronous save that fits in it (its stall is then the copy alone);
    /// zero frees it and what earlier saves kept.
    pub keep_snapshot: c_int,
    /// Saves: the writer (`FERRY_WRITER_*`; 0, `FERRY_WRITER_AUTO`, lets the library choose).
    pub writer: c_int,
}

/// What a checkpoint call did (`ferry_checkpoint_report`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct FerryCheckpointReport {
    /// Loads: bytes of tensor data; saves: bytes written (headers included).
    pub bytes: u64,
    /// Tensors moved.
    pub tensors: u64,
    /// Files read or written.
    pub files: u64,
    /// Seconds moving the bytes.
    pub seconds: f64,
    /// Pinned host memory used: the file engine's bounce ring for GPU memory.
    pub pinned_bytes: u64,
    /// The process's peak resident memory so far (`VmHWM`), 0 where it cannot be read.
    pub peak_rss_bytes: u64,
    /// Saves: the writer that ran (`FERRY_WRITER_BUFFERED`, `_DIRECT` or `_HYBRID`: what
    /// `FERRY_WRITER_AUTO` chose); loads: 0.
    pub writer: c_int,
}

/// A caller's buffer as ferry memory: the C caller vouches for it (the calls' contracts).
struct Lent(RawBuf);

// SAFETY: the C caller guarantees the buffer is valid for reads (saves) or writes (loads) of
// `len` bytes of the kind it claims, and not touched by others, for the whole call (an
// asynchronous save: until it returns, after which the tensors are copied out).
unsafe impl Memory for Lent {
    fn raw(&self) -> RawBuf {
        self.0
    }
}
// SAFETY: as above; a load's destinations are the caller's to write.
unsafe impl MemoryMut for Lent {
    fn raw_mut(&mut self) -> RawBuf {
        self.0
    }
}

/// A tensor checked and copied out of C.
struct Tensor {
    name: String,
    dtype: Option<Dtype>,
    shape: Option<Vec<usize>>,
    mem: Lent,
}

/// The code of a checkpoint error: `FERRY_EDRIVER` where the system refused (a file, memory,
/// the replace), `FERRY_EINVAL` for bad input (the tensors given, the files read).
fn fail(e: &CheckpointError) -> Fail {
    let code = match e {
        CheckpointError::File { .. }
        | CheckpointError::Shard { .. }
        | CheckpointError::Alloc { .. }
        | CheckpointError::Replace { .. } => FERRY_EDRIVER,
        _ => FERRY_EINVAL,
    };
    Fail::new(code, e.to_string())
}

/// The path of a C string.
///
/// # Safety
/// 1. `path` is NULL or a NUL-terminated string.
unsafe fn path_of(path: *const c_char) -> Result<PathBuf, Fail> {
    // SAFETY: (1).
    let s = unsafe { crate::error::utf8(path, "path") }?;
    if s.is_empty() {
        return Err(Fail::inval("path is empty"));
    }
    Ok(PathBuf::from(s))
}

/// Copies the tensors out of C, checked; `save`: dtype and shape required.
///
/// # Safety
/// 1. `tensors` is NULL or valid for reads of `n` tensors, each with `name` NULL or
///    NUL-terminated and `shape` NULL or valid for reads of `ndims` values.
unsafe fn tensors_of(
    tensors: *const FerryTensor,
    n: usize,
    save: bool,
) -> Result<Vec<Tensor>, Fail> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if tensors.is_null() {
        return Err(Fail::inval("tensors is NULL"));
    }
    // SAFETY: (1).
    let list = unsafe { std::slice::from_raw_parts(tensors, n) };
    let mut out = Vec::with_capacity(n);
    for (i, t) in list.iter().enumerate() {
        let at = |m: String| Fail::inval(format!("tensors[{i}]: {m}"));
        if t.name.is_null() {
            return Err(at("name is NULL".into()));
        }
        // SAFETY: (1).
        let name = unsafe { CStr::from_ptr(t.name) }
            .to_str()
            .map_err(|_| at("name is not UTF-8".into()))?
            .to_string();
        let at = |m: String| Fail::inval(format!("tensors[{i}] (`{name}`): {m}"));
        let dtype = match t.dtype {
            FERRY_DTYPE_ANY if !save => None,
            d => Some(
                usize::try_from(d)
                    .ok()
                    .and_then(|d| DTYPES.get(d).copied())
                    .ok_or_else(|| at(format!("dtype {d} is not one of FERRY_DTYPE_*")))?,
            ),
        };
        if t.ndims > ferry::MAX_DIMS {
            return Err(at(format!(
                "{} dimensions, more than {}",
                t.ndims,
                ferry::MAX_DIMS
            )));
        }
        let shape = if t.shape.is_null() {
            if save && t.ndims > 0 {
                return Err(at("shape is NULL".into()));
            }
            (t.ndims == 0 && save).then(Vec::new)
        } else {
            // SAFETY: (1).
            Some(unsafe { std::slice::from_raw_parts(t.shape, t.ndims) }.to_vec())
        };
        let raw = if t.buf.len == 0 {
            // An empty tensor: no byte is read or written; its kind still names its home.
            let mut b = t.buf;
            b.ptr = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
            b.len = 1;
            RawBuf {
                len: 0,
                ..b.raw("buf").map_err(|f| at(f.msg))?
            }
        } else {
            t.buf.raw("buf").map_err(|f| at(f.msg))?
        };
        out.push(Tensor {
            name,
            dtype,
            shape,
            mem: Lent(raw),
        });
    }
    Ok(out)
}

/// The file engine for these tensors: with the CUDA engine of their GPU where they are on one
/// (two GPUs: `FERRY_EINVAL`). One per GPU (or none) and settings in the process, made on the
/// first call and kept, as Python's: a training loop's saves reuse its CUDA engine, pinned
/// memory and threads instead of starting them on every call.
fn engine_for(tensors: &[Tensor], opts: &FerryCheckpointOptions) -> Result<Arc<FileEngine>, Fail> {
    let mut cfg = FileConfig::from_env().map_err(|e| Fail::inval(e.to_string()))?;
    if opts.threads < 0 {
        return Err(Fail::inval(format!("threads {} is negative", opts.threads)));
    }
    if opts.threads > 0 {
        cfg = cfg.threads(opts.threads as usize);
    }
    cfg = cfg.direct(opts.direct != 0);
    let mut gpu = None;
    for t in tensors {
        if let MemKind::Device { ordinal } = t.mem.0.kind {
            match gpu {
                Some(g) if g != ordinal => {
                    return Err(Fail::inval(format!(
                        "tensor `{}` is on GPU {ordinal}, another on GPU {g}: one call moves \
                         the tensors of one GPU",
                        t.name
                    )))
                }
                _ => gpu = Some(ordinal),
            }
        }
    }
    type Kept = Vec<((Option<u32>, FileConfig), Arc<FileEngine>)>;
    static ENGINES: OnceLock<Mutex<Kept>> = OnceLock::new();
    // Held while a first engine is made: two first calls for one GPU make one engine.
    let mut kept = ENGINES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some((_, fe)) = kept.iter().find(|(k, _)| *k == (gpu, cfg)) {
        return Ok(Arc::clone(fe));
    }
    let made = match gpu {
        None => FileEngine::new(cfg),
        Some(g) => {
            let cuda = CudaEngine::new(g).map_err(|e| {
                let code = match e {
                    CudaError::NoDriver(_) => FERRY_ENOTAVAIL,
                    _ => FERRY_EDRIVER,
                };
                Fail::new(code, format!("the CUDA engine of GPU {g}: {e}"))
            })?;
            FileEngine::with_engine(cfg, Arc::new(cuda))
        }
    };
    let fe = Arc::new(made.map_err(|e| Fail::new(FERRY_EDRIVER, format!("the file engine: {e}")))?);
    kept.push(((gpu, cfg), Arc::clone(&fe)));
    Ok(fe)
}

/// The save's options, and its path: an existing folder is a sharded save into it
/// (`model.safetensors.index.json`), as `ferry save` and Python's `save_safetensors` take it.
fn save_options(
    path: PathBuf,
    opts: &FerryCheckpointOptions,
) -> Result<(PathBuf, SaveOptions), Fail> {
    let path = if path.is_dir() {
        path.join("model.safetensors.index.json")
    } else {
        path
    };
    let mut o = SaveOptions::new()
        .fsync(opts.fsync != 0)
        .writer(match opts.writer {
            FERRY_WRITER_AUTO => Writer::Auto,
            FERRY_WRITER_BUFFERED => Writer::Buffered,
            FERRY_WRITER_DIRECT => Writer::Direct,
            FERRY_WRITER_HYBRID => Writer::Hybrid,
            w => {
                return Err(Fail::inval(format!(
                    "writer {w} is none of FERRY_WRITER_AUTO (0), _BUFFERED (1), _DIRECT (2) and \
                 _HYBRID (3)"
                )))
            }
        });
    if opts.shard_bytes > 0 {
        o = o.shard_bytes(opts.shard_bytes);
    }
    if opts.snapshot_bytes > 0 {
        o = o.snapshot_bytes(opts.snapshot_bytes);
    }
    Ok((path, o.keep_snapshot(opts.keep_snapshot != 0)))
}

/// The writer a save's report names (`FERRY_WRITER_*`).
fn writer_ran(r: &checkpoint::SaveReport) -> c_int {
    match r.writer {
        Writer::Hybrid => FERRY_WRITER_HYBRID,
        Writer::Direct => FERRY_WRITER_DIRECT,
        Writer::Buffered | Writer::Auto => FERRY_WRITER_BUFFERED,
    }
}

/// The tensors as the save takes them.
fn save_list(tensors: &[Tensor]) -> Vec<SaveTensor<'_>> {
    tensors
        .iter()
        .map(|t| {
            SaveTensor::new(
                &t.name,
                t.dtype.unwrap_or(Dtype::U8),
                t.shape.as_deref().unwrap_or(&[]),
                &t.mem,
            )
        })
        .collect()
}

/// Reads the options (NULL: the defaults).
///
/// # Safety
/// 1. `opts` is NULL or valid for one read.
unsafe fn options(opts: *const FerryCheckpointOptions) -> FerryCheckpointOptions {
    // SAFETY: (1).
    unsafe { opts.as_ref() }.copied().unwrap_or_default()
}

/// Writes `r` to `report` where it is not NULL.
///
/// # Safety
/// 1. `report` is NULL or valid for one write.
unsafe fn put(report: *mut FerryCheckpointReport, r: FerryCheckpointReport) {
    // SAFETY: (1).
    if let Some(out) = unsafe { report.as_mut() } {
        *out = r;
    }
}

/// Saves `n` tensors to `path`: one safetensors file, or a sharded checkpoint where `path`
/// ends in `.safetensors.index.json` or is an existing folder (its
/// `model.safetensors.index.json` and shards, `opts->shard_bytes` each at most). Each file
/// appears under its name only once complete (an existing one is replaced whole); on failure
/// nothing is left behind and existing files are as they were. Tensors on a GPU
/// (`FERRY_MEM_DEVICE`, all on one GPU) are read through that GPU's CUDA engine.
///
/// Returns `FERRY_SUCCESS` and fills `*report` (when not NULL), or `-FERRY_EINVAL` (NULL or
/// bad arguments: a name given twice, bytes that do not match dtype x shape, an unknown
/// dtype), `-FERRY_ENOTAVAIL` (GPU memory without a CUDA driver), `-FERRY_EDRIVER` (a file
/// or system call failed; the message names the file and the tensor).
///
/// # Safety
/// 1. `path` is NULL or NUL-terminated; `opts` NULL or valid for a read; `report` NULL or
///    valid for a write.
/// 2. `tensors` is NULL (with `n` 0) or valid for reads of `n` tensors whose names are
///    NUL-terminated, whose shapes hold `ndims` values, and whose buffers are valid for reads
///    of `len` bytes of the kind they claim and not written by anyone until this returns.
#[no_mangle]
pub unsafe extern "C" fn ferry_checkpoint_save(
    path: *const c_char,
    tensors: *const FerryTensor,
    n: usize,
    opts: *const FerryCheckpointOptions,
    report: *mut FerryCheckpointReport,
) -> c_int {
    guard(|| {
        // SAFETY: (1), (2).
        let (path, list, o) =
            unsafe { (path_of(path)?, tensors_of(tensors, n, true)?, options(opts)) };
        let fe = engine_for(&list, &o)?;
        let (path, so) = save_options(path, &o)?;
        let r = checkpoint::save(&fe, &path, &save_list(&list), &so).map_err(|e| fail(&e))?;
        // SAFETY: (1).
        unsafe { put(report, save_report(&r, &fe)) };
        Ok(FERRY_SUCCESS)
    })
}

/// A save's report in C's terms, taken when the save is done.
fn save_report(r: &checkpoint::SaveReport, fe: &FileEngine) -> FerryCheckpointReport {
    FerryCheckpointReport {
        bytes: r.bytes,
        tensors: r.tensors as u64,
        files: r.files as u64,
        seconds: r.seconds,
        pinned_bytes: fe.pinned_bytes(),
        peak_rss_bytes: checkpoint::LoadReport::process_peak_rss().unwrap_or(0),
        writer: writer_ran(r),
    }
}

/// The report an asynchronous save's request carries (its `extra`), set when the save
/// succeeded.
type SaveSlot = OnceLock<FerryCheckpointReport>;

/// Saves as `ferry_checkpoint_save` without waiting for the files: returns once every
/// tensor's bytes are copied out of the caller's memory (into at most `opts->snapshot_bytes`
/// of host memory, pinned for GPU tensors; a larger checkpoint is streamed, the call then
/// waiting for all but the last window's write), after which the caller may change or free
/// the tensors. The files are written on a thread of ferry's; `*req` completes when they are
/// in place. It belongs to no dma: wait, test and destroy it with a NULL dma
/// (`ferry_request_wait(NULL, &req)`: `-FERRY_EREQUEST` with the save's message if it
/// failed), or wait for it with `ferry_checkpoint_save_wait` for the save's report. Release it
/// before the process exits.
///
/// Errors as `ferry_checkpoint_save` before the call returns (nothing submitted, `*req`
/// unchanged), and `-FERRY_EDRIVER` when no thread could be started.
///
/// # Safety
/// As `ferry_checkpoint_save` (the tensors' buffers until this call returns), and `req` is
/// NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_checkpoint_save_async(
    path: *const c_char,
    tensors: *const FerryTensor,
    n: usize,
    opts: *const FerryCheckpointOptions,
    req: *mut *mut FerryRequest,
) -> c_int {
    guard(|| {
        // SAFETY: the contract above.
        let out_slot = unsafe { crate::error::out(req, "req") }?;
        // SAFETY: the contract above.
        let (path, list, o) =
            unsafe { (path_of(path)?, tensors_of(tensors, n, true)?, options(opts)) };
        let fe = engine_for(&list, &o)?;
        let (path, so) = save_options(path, &o)?;
        let handle =
            checkpoint::Checkpoint::snapshot_save(Arc::clone(&fe), path, &save_list(&list), so)
                .map_err(|e| fail(&e))?;
        let done = Arc::new(Signal::new());
        let signal = Arc::clone(&done);
        let slot = Arc::new(SaveSlot::new());
        let report = Arc::clone(&slot);
        std::thread::Builder::new()
            .name("ferry-capi-save".into())
            .spawn(move || {
                let result = match handle.join() {
                    Ok(Ok(r)) => {
                        // Set before the request completes: its waiter reads it after.
                        let _ = report.set(save_report(&r, &fe));
                        Ok(())
                    }
                    Ok(Err(e)) => Err(RequestError::Backend(BackendError::new(e))),
                    Err(_) => Err(RequestError::Panicked {
                        op: "checkpoint save".into(),
                        msg: "the writing thread panicked".into(),
                    }),
                };
                signal.complete(result);
            })
            .map_err(|e| {
                Fail::new(
                    FERRY_EDRIVER,
                    format!("cannot start the thread that waits for the save: {e}"),
                )
            })?;
        *out_slot = FerryRequest::boxed_with(0, Request::new(done), Some(slot));
        Ok(FERRY_SUCCESS)
    })
}

/// Waits for an asynchronous save's request (`ferry_checkpoint_save_async`) as
/// `ferry_request_wait(NULL, req)` does (releases it, sets `*req` to NULL) and fills `*report`
/// (when not NULL) with what the save did, as `ferry_checkpoint_save`'s.
///
/// Returns `FERRY_SUCCESS`, `-FERRY_EREQUEST` if the save failed (the message says why; the
/// request is released all the same, `*report` unchanged), or `-FERRY_EINVAL` (NULL or invalid
/// `req`/`*req`, or a request that is not an asynchronous save's: nothing released).
/// `-FERRY_EDRIVER` if a save that succeeded left no report (not expected: the writing side
/// sets it before the request completes; the request is released, `*report` unchanged).
///
/// # Safety
/// 1. `req` is NULL or valid for a read and a write of one pointer; `*req` is NULL or a
///    request not yet released.
/// 2. `report` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_checkpoint_save_wait(
    req: *mut *mut FerryRequest,
    report: *mut FerryCheckpointReport,
) -> c_int {
    guard(|| {
        let is_save = |r: &FerryRequest| {
            if r.extra().is_some_and(|e| e.is::<SaveSlot>()) {
                Ok(())
            } else {
                Err(Fail::inval(
                    "req is not an asynchronous save's request (ferry_checkpoint_save_async)",
                ))
            }
        };
        // SAFETY: (1), with a NULL dma.
        let extra = unsafe { wait_release(std::ptr::null_mut(), req, is_save) }?;
        let r = extra
            .and_then(|e| e.downcast::<SaveSlot>().ok())
            .and_then(|s| s.get().copied())
            .ok_or_else(|| Fail::new(FERRY_EDRIVER, "the save finished without its report"))?;
        // SAFETY: (2).
        unsafe { put(report, r) };
        Ok(FERRY_SUCCESS)
    })
}

/// Loads the `n` named tensors of the checkpoint at `path` (a safetensors file, a sharded
/// checkpoint's `*.safetensors.index.json`, or a checkpoint's folder: its index, else its
/// safetensors file) into the caller's buffers, every shard's reads in flight at once; GPU
/// buffers (`FERRY_MEM_DEVICE`, all on one GPU) through that GPU's CUDA engine and pinned
/// bounce buffers. Every tensor is checked before a byte is read: its name must be in the
/// checkpoint (once), its `buf.len` the tensor's bytes, and its dtype (unless
/// `FERRY_DTYPE_ANY`) and shape (unless NULL) the tensor's.
///
/// Returns `FERRY_SUCCESS` and fills `*report` (when not NULL), or `-FERRY_EINVAL` (bad
/// arguments, a tensor that is not in the checkpoint or does not fit its buffer, a malformed
/// file or index: no buffer written), `-FERRY_ENOTAVAIL` (GPU memory without a CUDA driver),
/// `-FERRY_EDRIVER` (a file or shard that cannot be opened or read; the buffers' bytes are then
/// unspecified). The message names the file and the tensor.
///
/// # Safety
/// 1. `path` is NULL or NUL-terminated; `opts` NULL or valid for a read; `report` NULL or
///    valid for a write.
/// 2. `tensors` is NULL (with `n` 0) or valid for reads of `n` tensors whose names are
///    NUL-terminated, whose shapes are NULL or hold `ndims` values, and whose buffers are
///    valid for writes of `len` bytes of the kind they claim, not read or written by anyone
///    else until this returns, and not overlapping one another.
#[no_mangle]
pub unsafe extern "C" fn ferry_checkpoint_load(
    path: *const c_char,
    tensors: *const FerryTensor,
    n: usize,
    opts: *const FerryCheckpointOptions,
    report: *mut FerryCheckpointReport,
) -> c_int {
    guard(|| {
        // SAFETY: (1), (2).
        let (path, mut list, o) = unsafe {
            (
                path_of(path)?,
                tensors_of(tensors, n, false)?,
                options(opts),
            )
        };
        let fe = engine_for(&list, &o)?;
        let mut dests: Vec<Dest<'_>> = list
            .iter_mut()
            .map(|t| {
                let mut d = Dest::new(t.name.clone(), &mut t.mem);
                d.dtype = t.dtype;
                d.shape = t.shape.clone();
                d
            })
            .collect();
        let r = checkpoint::load_into(&fe, &path, &mut dests).map_err(|e| fail(&e))?;
        let out = FerryCheckpointReport {
            bytes: r.bytes,
            tensors: r.tensors as u64,
            files: r.files as u64,
            seconds: r.seconds,
            pinned_bytes: r.pinned_bytes,
            peak_rss_bytes: r.peak_rss_bytes.unwrap_or(0),
            writer: 0,
        };
        // SAFETY: (1).
        unsafe { put(report, out) };
        Ok(FERRY_SUCCESS)
    })
}

#[cfg(test)]
#[path = "checkpoint_tests.rs"]
mod tests;
