//! ferry's CUDA C++ kernels as loaded programs: compiled by NVRTC for the device's
//! architecture, kept as PTX in memory (once per process) and on disk (once per machine), and
//! loaded with every kernel loaded eagerly.
//!
//! A compile of the strided-copy and gather programs took 3.1 s on the H200 host (run 21, the
//! first `CudaEngine::compile_kernels` of a process); a second engine of the process took 6 ms.
//! The disk cache spares later processes the compile: `FERRY_KERNEL_CACHE` names its folder
//! (`off` or an empty value: no disk cache), default `$XDG_CACHE_HOME/ferry/kernels`, else
//! `$HOME/.cache/ferry/kernels`. A cached file is named by a hash of the source, ferry's
//! version and the architecture; one that fails to load (a PTX newer than the driver, a
//! damaged file) is compiled again and replaced. Cache errors never fail a copy.

use super::error::KernelError;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, DriverError};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// CUDA C++ that more than one of ferry's kernel programs uses, as a literal for `concat!`:
/// `u64`, and `copy_any`, which copies `len` bytes by `g` threads (this one `lane`) in the
/// widest words the two addresses' alignment allows.
macro_rules! kernel_prelude {
    () => {
        r#"
typedef unsigned long long u64;
// `len` bytes by `g` threads (this one is `lane`), in words of T past an unaligned head.
template <typename T>
__device__ __forceinline__ void copy_seg(unsigned char* d, const unsigned char* s, u64 len, u64 lane, u64 g) {
    const u64 a = sizeof(T);
    u64 head = (a - ((u64)d & (a - 1))) & (a - 1);
    if (head > len) head = len;
    for (u64 i = lane; i < head; i += g) d[i] = s[i];
    u64 nv = (len - head) / a;
    T* dv = (T*)(d + head);
    const T* sv = (const T*)(s + head);
    u64 i = lane;
    for (; i + 3ull * g < nv; i += 4ull * g) {
        T x0 = sv[i], x1 = sv[i + g], x2 = sv[i + 2ull * g], x3 = sv[i + 3ull * g];
        dv[i] = x0; dv[i + g] = x1; dv[i + 2ull * g] = x2; dv[i + 3ull * g] = x3;
    }
    for (; i < nv; i += g) dv[i] = sv[i];
    for (u64 j = head + nv * a + lane; j < len; j += g) d[j] = s[j];
}
__device__ __forceinline__ void copy_any(unsigned char* d, const unsigned char* s, u64 len, u64 lane, u64 g) {
    u64 x = (u64)d ^ (u64)s;
    if ((x & 15) == 0) copy_seg<uint4>(d, s, len, lane, g);
    else if ((x & 7) == 0) copy_seg<u64>(d, s, len, lane, g);
    else if ((x & 3) == 0) copy_seg<unsigned>(d, s, len, lane, g);
    else copy_seg<unsigned char>(d, s, len, lane, g);
}
"#
    };
}
pub(crate) use kernel_prelude;

/// The kernels `names` of the CUDA C++ program `src`, loaded into `ctx` (see the [module
/// documentation](self) for where the PTX comes from).
pub(crate) fn program(
    ctx: &Arc<CudaContext>,
    src: &'static str,
    names: &[&str],
) -> Result<Vec<CudaFunction>, KernelError> {
    let drv = |op| move |source| KernelError::Driver { op, source };
    super::driver::set_current(ctx).map_err(drv("cuCtxSetCurrent"))?;
    let (maj, min) = ctx
        .compute_capability()
        .map_err(drv("cuDeviceGetAttribute"))?;
    let arch = format!("compute_{maj}{min}");
    type Cache = Mutex<HashMap<(usize, String), Ptx>>;
    static PTX: OnceLock<Cache> = OnceLock::new();
    // Held while compiling: two engines starting at once compile once.
    let mut memory = PTX
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let key = (src.as_ptr() as usize, arch.clone());
    if let Some(ptx) = memory.get(&key) {
        return load(ctx, ptx.clone(), names);
    }
    let file = cache_dir().map(|d| d.join(file_name(src, &arch)));
    if let Some(ptx) = file.as_deref().and_then(read_cached) {
        if let Ok(ks) = load(ctx, ptx.clone(), names) {
            memory.insert(key, ptx);
            return Ok(ks);
        }
    }
    let ptx = compile(src, &arch)?;
    let ks = load(ctx, ptx.clone(), names)?;
    if let Some(f) = &file {
        write_cached(f, &ptx);
    }
    memory.insert(key, ptx);
    Ok(ks)
}

/// Kernels of one program once made for one context, or the lasting reason they cannot be
/// (NVRTC absent, the source refused): what each path's kernels are kept in. A failed driver
/// call (loading the module: out of memory, say) is not kept, so the next request tries again.
///
/// Why the failure is kept: on a host without NVRTC (a runtime-only container: the driver
/// ships without it) every request whose route tried a kernel asked again, looking for the
/// cached PTX on disk each time (2.5% of a 4,096-block copy's host time against the null
/// driver, about 2 of the 3 us of a 16-block one).
pub(crate) struct Made<T>(Mutex<Option<Result<T, KernelError>>>);

impl<T: Clone> Made<T> {
    /// Nothing made yet.
    pub(crate) const fn new() -> Made<T> {
        Made(Mutex::new(None))
    }

    /// The kernels, made by `make` the first time (under the lock: two threads make them
    /// once), or the failure kept from then.
    pub(crate) fn get(
        &self,
        make: impl FnOnce() -> Result<T, KernelError>,
    ) -> Result<T, KernelError> {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = slot.as_ref() {
            return kept.clone();
        }
        let made = make();
        if !matches!(made, Err(KernelError::Driver { .. })) {
            *slot = Some(made.clone());
        }
        made
    }
}

/// Whether NVRTC can be loaded, asked once per process: cudarc's check tries to `dlopen` every
/// candidate name on each call, and a host without NVRTC paid that (about 0.5 ms on the 2-core
/// machine, the null driver) on every copy whose route tried a kernel before falling back.
fn nvrtc_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the library by its candidate names.
    *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

fn compile(src: &str, arch: &str) -> Result<Ptx, KernelError> {
    if !nvrtc_present() {
        return Err(KernelError::NvrtcMissing);
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "-std=c++17".into()],
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(src, opts)
        .map_err(|e| KernelError::Compile(format!("{e:?}")))
}

fn load(
    ctx: &Arc<CudaContext>,
    ptx: Ptx,
    names: &[&str],
) -> Result<Vec<CudaFunction>, KernelError> {
    let module = ctx.load_module(ptx).map_err(|source| KernelError::Driver {
        op: "cuModuleLoadData",
        source,
    })?;
    names
        .iter()
        .map(|n| {
            kernel(&module, n).map_err(|source| KernelError::Driver {
                op: "cuFuncLoad",
                source,
            })
        })
        .collect()
}

/// Kernel `name` of `module`, loaded onto the device now. Under lazy module loading (the
/// driver's default since CUDA 12.2) a kernel is otherwise loaded at its first launch, and that
/// load may wait for the whole context to go idle: behind a stream held by a
/// `StreamTimer` latch (crates/ferry-bench) it waited until the watchdog opened it (H200 run 18), and in
/// general it stalls the first copy behind unrelated work. `cuFuncLoad` (driver 12.4 and later;
/// older drivers load at first launch as before) loads it here instead.
fn kernel(module: &Arc<CudaModule>, name: &str) -> Result<CudaFunction, DriverError> {
    let f = module.load_function(name)?;
    if super::driver::driver().is_ok_and(|v| v >= 12040) {
        // SAFETY: a live function handle of a live module; the driver exports `cuFuncLoad`
        // from 12.4 on (checked above, so the dynamic loader finds it).
        unsafe { cudarc::driver::sys::cuFuncLoad(f.cu_function()) }.result()?;
    }
    Ok(f)
}

/// The disk cache's folder, or `None` where it is turned off or no home is known.
fn cache_dir() -> Option<PathBuf> {
    cache_dir_from(
        std::env::var_os("FERRY_KERNEL_CACHE"),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

fn cache_dir_from(
    ferry: Option<std::ffi::OsString>,
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    let set = |v: Option<std::ffi::OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    match ferry {
        Some(v) if v.is_empty() || v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => set(xdg)
            .map(|x| x.join("ferry"))
            .or_else(|| set(home).map(|h| h.join(".cache").join("ferry")))
            .map(|d| d.join("kernels")),
    }
}

/// `<hash>-<arch>.ptx`: the hash covers the source and ferry's version, so a changed kernel or
/// a new ferry never reads an old file.
fn file_name(src: &str, arch: &str) -> String {
    // Not stable across Rust releases, which only costs a compile.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    src.hash(&mut h);
    env!("CARGO_PKG_VERSION").hash(&mut h);
    format!("{:016x}-{arch}.ptx", h.finish())
}

fn read_cached(path: &Path) -> Option<Ptx> {
    let text = std::fs::read_to_string(path).ok()?;
    text.contains(".entry").then(|| Ptx::from_src(text))
}

/// Writes through a temporary file and a rename, so that a reader never sees half a file;
/// failures (read-only home, full disk) are ignored: the next process compiles again.
fn write_cached(path: &Path, ptx: &Ptx) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("ptx"),
        std::process::id()
    ));
    if std::fs::write(&tmp, ptx.to_src()).is_ok() && std::fs::rename(&tmp, path).is_ok() {
        return;
    }
    let _ = std::fs::remove_file(&tmp);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn cache_folder_from_the_environment() {
        let o = |s: &str| Some(OsString::from(s));
        assert_eq!(cache_dir_from(o("off"), o("/x"), o("/h")), None);
        assert_eq!(cache_dir_from(o(""), o("/x"), o("/h")), None);
        assert_eq!(
            cache_dir_from(o("/k"), o("/x"), o("/h")),
            Some(PathBuf::from("/k"))
        );
        assert_eq!(
            cache_dir_from(None, o("/x"), o("/h")),
            Some(PathBuf::from("/x/ferry/kernels"))
        );
        assert_eq!(
            cache_dir_from(None, o(""), o("/h")),
            Some(PathBuf::from("/h/.cache/ferry/kernels"))
        );
        assert_eq!(cache_dir_from(None, None, None), None);
    }

    #[test]
    fn made_keeps_kernels_and_lasting_failures_but_not_driver_errors() {
        let calls = std::cell::Cell::new(0);
        let count = |r: Result<u32, KernelError>| {
            calls.set(calls.get() + 1);
            r
        };
        let ok = Made::new();
        assert_eq!(ok.get(|| count(Ok(7))), Ok(7));
        assert_eq!(ok.get(|| count(Ok(8))), Ok(7), "made again");
        assert_eq!(calls.get(), 1);
        let missing = Made::<u32>::new();
        assert_eq!(
            missing.get(|| count(Err(KernelError::NvrtcMissing))),
            Err(KernelError::NvrtcMissing)
        );
        assert_eq!(
            missing.get(|| count(Ok(1))),
            Err(KernelError::NvrtcMissing),
            "asked again"
        );
        assert_eq!(calls.get(), 2);
        let driver = Made::<u32>::new();
        let failed = KernelError::Driver {
            op: "cuModuleLoadData",
            source: DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
        };
        assert_eq!(driver.get(|| count(Err(failed.clone()))), Err(failed));
        assert_eq!(
            driver.get(|| count(Ok(3))),
            Ok(3),
            "a driver error was kept"
        );
        assert_eq!(calls.get(), 4);
    }

    #[test]
    fn file_names_follow_source_and_arch() {
        let a = file_name("kernel a", "compute_90");
        assert_eq!(a, file_name("kernel a", "compute_90"));
        assert_ne!(a, file_name("kernel b", "compute_90"));
        assert_ne!(a, file_name("kernel a", "compute_80"));
        assert!(a.ends_with("-compute_90.ptx"));
    }

    #[test]
    fn cached_files_round_trip_and_junk_is_ignored() {
        let dir = std::env::temp_dir().join(format!("ferry-ptx-test-{}", std::process::id()));
        let f = dir.join("sub").join("k.ptx");
        let text = ".version 8.0\n.target sm_90\n.visible .entry k() { ret; }\n";
        write_cached(&f, &Ptx::from_src(text));
        assert_eq!(read_cached(&f).map(|p| p.to_src()), Some(text.to_string()));
        std::fs::write(&f, "not ptx").unwrap();
        assert!(read_cached(&f).is_none());
        assert!(read_cached(&dir.join("missing.ptx")).is_none());
        let leftovers = std::fs::read_dir(dir.join("sub")).unwrap().count();
        assert_eq!(leftovers, 1, "temporary file left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
