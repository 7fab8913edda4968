//! Copies on the SMs: small NVRTC kernels that move a whole [`Plan`] (contiguous, pitched, or
//! N-D strided) between device-accessible buffers (device memory of this GPU, pinned,
//! registered, mapped and managed memory), reading and writing both sides through their
//! device-accessible addresses.
//!
//! Why: the copy engines move a plan as `cuMemcpy2DAsync`/`cuMemcpy3DAsync` calls whose rows are
//! the plan's runs. With long runs that is as fast as a contiguous copy; with runs of a few bytes
//! (a transpose of 4- or 8-byte elements: one run per element) the copy engines crawl, and a
//! transpose that `cuMemcpy3DAsync` cannot express becomes one 2-D call per plane. A kernel moves
//! such a plan at memory speed. For mapped (zero-copy) host memory, the kernel is also the
//! nvbandwidth "SM copy": the SMs read or write host memory over the bus themselves.
//!
//! Five kernels, chosen by the plan ([`SmKernel`]):
//! - [`SmKernel::Linear`]: a contiguous plan, grid-stride, 16-byte words where both sides are
//!   equally aligned.
//! - [`SmKernel::Transpose`]: a transpose of 1-, 2-, 4-, 8- or 16-byte elements, batched or not
//!   (two dims swap grain between the sides, as `route.rs` recognises them): the tiled kernel of
//!   `transpose.rs`, 4-byte words per thread for 1- and 2-byte elements.
//! - [`SmKernel::Tiled`]: other transposing plans (the two innermost outer dims walk the source
//!   against its grain) with runs of at most [`TILE_MAX_RUN`] bytes (3-, 12-, 32-byte elements):
//!   32 x 32 runs go through shared memory, so that both the reads and the writes of a warp are
//!   coalesced. Outer dims beyond the two innermost are walked by the grid.
//! - [`SmKernel::Each`]: other plans with runs of at most [`TILE_MAX_RUN`] bytes: one thread per
//!   run.
//! - [`SmKernel::Rows`]: longer runs: a group of threads per run.
//!
//! Where the engine uses it is `KernelCopies` ([`CudaConfig::kernel_copies`](crate::engine::cuda::CudaConfig)),
//! decided with the other paths in `route.rs`.

use crate::engine::cuda::sys::driver;
use crate::engine::cuda::sys::error::KernelError;
use crate::engine::cuda::sys::program::{self, Made};
use crate::engine::cuda::CudaError;
use crate::plan::Plan;
use cudarc::driver::result::DriverError;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use std::sync::Arc;
use thiserror::Error;

/// Runs of at most this many bytes go through the tiled or one-thread-per-run kernels (the tile
/// of 32 x 33 runs lives in 33 KiB of shared memory).
pub const TILE_MAX_RUN: usize = 32;

#[cfg(feature = "bench")]
pub use crate::engine::cuda::config::KernelCopies;
#[cfg(feature = "bench")]
pub use crate::engine::cuda::route::{
    AUTO_MAX_RUN, AUTO_MAX_RUN_CALLS, AUTO_MIN_CALLS, AUTO_MIN_RUNS,
};

/// Which kernel moved a plan; see the [module documentation](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SmKernel {
    /// A contiguous copy.
    Linear,
    /// A (batched) transpose of 1-, 2-, 4-, 8- or 16-byte elements.
    Transpose,
    /// Runs of another transposing plan through shared-memory tiles.
    Tiled,
    /// One thread per short run.
    Each,
    /// A group of threads per run.
    Rows,
}

impl SmKernel {
    /// The kernel for a plan between buffers whose addresses are aligned to its elements. (A
    /// transpose whose elements are not, as one into a buffer at an odd offset, takes
    /// [`SmKernel::Tiled`]: [`SmCopier::copy`] returns the kernel it used.)
    pub fn for_plan(plan: &Plan) -> SmKernel {
        Self::pick(
            plan,
            crate::engine::cuda::route::transpose_of(plan).is_some(),
        )
    }

    /// The kernel for a plan, `transpose`: the transpose kernel takes it.
    fn pick(plan: &Plan, transpose: bool) -> SmKernel {
        if plan.counts().is_empty() {
            SmKernel::Linear
        } else if transpose {
            SmKernel::Transpose
        } else if plan.run() > TILE_MAX_RUN {
            SmKernel::Rows
        } else if plan.is_transposing() {
            SmKernel::Tiled
        } else {
            SmKernel::Each
        }
    }
}

/// Why an SM copy could not be made.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SmError {
    /// A buffer is not device-accessible (pageable host memory).
    #[error("the {side} buffer at {addr:#x} is not device-accessible (pageable host memory?)")]
    NotDeviceAccessible {
        /// `"source"` or `"destination"`.
        side: &'static str,
        /// Its address.
        addr: u64,
    },
    /// The kernels could not be made (no NVRTC, a compile or module-load failure).
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// A CUDA driver call failed.
    #[error("{op} failed: {source}")]
    Driver {
        /// The driver call.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
}

fn drv(op: &'static str) -> impl FnOnce(DriverError) -> SmError {
    move |source| SmError::Driver { op, source }
}

const KERNEL_SRC: &str = concat!(
    crate::engine::cuda::sys::program::kernel_prelude!(),
    super::transpose::transpose_kernel!(),
    r#"
#define MAXD 16
#define TILE 32
#define MAXRUN 32
struct Params {
    u64 dst, src, run, runs;
    u64 c[MAXD], ds[MAXD], ss[MAXD];
    unsigned n, word, load_b, store_b;
};
// Byte offsets of run k (innermost dim fastest) over dims [0, n) on each side.
__device__ __forceinline__ void offsets(const Params& p, unsigned n, u64 k, u64& d, u64& s) {
    d = 0; s = 0;
    for (int i = (int)n - 1; i >= 0; --i) {
        u64 c = p.c[i], x;
        // 32-bit division where both fit: several times cheaper than 64-bit on the GPU.
        if (((k | c) >> 32) == 0) {
            unsigned k32 = (unsigned)k, c32 = (unsigned)c;
            x = k32 % c32;
            k = k32 / c32;
        } else {
            x = k % c;
            k /= c;
        }
        d += x * p.ds[i];
        s += x * p.ss[i];
    }
}
extern "C" __global__ void ferry_sm_linear(Params p) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x, g = (u64)gridDim.x * blockDim.x;
    copy_any((unsigned char*)p.dst, (const unsigned char*)p.src, p.run, t, g);
}
extern "C" __global__ void ferry_sm_rows(Params p) {
    // A group of threads per run, as many as the run has words (up to a warp): short runs
    // leave no lanes idle.
    u64 words = (p.run + p.word - 1) / p.word, g = 1;
    while (g < words && g < 32) g <<= 1;
    u64 lane = threadIdx.x % g;
    u64 group = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / g;
    u64 groups = ((u64)gridDim.x * blockDim.x) / g;
    for (u64 k = group; k < p.runs; k += groups) {
        u64 d, s;
        offsets(p, p.n, k, d, s);
        copy_any((unsigned char*)(p.dst + d), (const unsigned char*)(p.src + s), p.run, lane, g);
    }
}
template <typename W>
__device__ __forceinline__ void each_body(const Params& p) {
    u64 words = p.run / sizeof(W);
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x, g = (u64)gridDim.x * blockDim.x;
    for (u64 k = t; k < p.runs; k += g) {
        u64 d, s;
        offsets(p, p.n, k, d, s);
        W* dp = (W*)(p.dst + d);
        const W* sp = (const W*)(p.src + s);
        for (u64 w = 0; w < words; ++w) dp[w] = sp[w];
    }
}
extern "C" __global__ void ferry_sm_each(Params p) {
    switch (p.word) {
    case 16: each_body<uint4>(p); break;
    case 8: each_body<u64>(p); break;
    case 4: each_body<unsigned>(p); break;
    case 2: each_body<unsigned short>(p); break;
    default: each_body<unsigned char>(p); break;
    }
}
// One phase of a tile: runs (i along dim a, j along dim b) between a side's memory and the
// shared tile. `fast_b`: the thread index's fast dim walks dim b.
template <typename W, bool LOAD>
__device__ __forceinline__ void tile_phase(const Params& p, unsigned char* tile, u64 base, u64 ta, u64 tb, unsigned fast_b, const u64* st) {
    unsigned n = p.n;
    u64 ca = p.c[n - 2], cb = p.c[n - 1], sa = st[n - 2], sb = st[n - 1];
    u64 words = p.run / sizeof(W);
    for (unsigned y = threadIdx.y; y < TILE; y += blockDim.y) {
        unsigned x = threadIdx.x;
        unsigned i = fast_b ? y : x, j = fast_b ? x : y;
        u64 ia = ta * TILE + i, jb = tb * TILE + j;
        if (ia < ca && jb < cb) {
            W* mem = (W*)(base + ia * sa + jb * sb);
            W* e = (W*)(tile + (u64)(i * (TILE + 1) + j) * p.run);
            if (LOAD) { for (u64 w = 0; w < words; ++w) e[w] = mem[w]; }
            else { for (u64 w = 0; w < words; ++w) mem[w] = e[w]; }
        }
    }
}
template <typename W>
__device__ __forceinline__ void tiled_body(const Params& p, unsigned char* tile) {
    unsigned n = p.n;
    u64 ca = p.c[n - 2], cb = p.c[n - 1];
    u64 na = (ca + TILE - 1) / TILE, nb = (cb + TILE - 1) / TILE;
    u64 total = (p.runs / (ca * cb)) * na * nb;
    for (u64 t = blockIdx.x; t < total; t += gridDim.x) {
        u64 tb = t % nb, r = t / nb, ta = r % na, bi = r / na;
        u64 d, s;
        offsets(p, n - 2, bi, d, s);
        tile_phase<W, true>(p, tile, p.src + s, ta, tb, p.load_b, p.ss);
        __syncthreads();
        tile_phase<W, false>(p, tile, p.dst + d, ta, tb, p.store_b, p.ds);
        __syncthreads();
    }
}
extern "C" __global__ void ferry_sm_tiled(Params p) {
    __shared__ __align__(16) unsigned char tile[TILE * (TILE + 1) * MAXRUN];
    switch (p.word) {
    case 16: tiled_body<uint4>(p, tile); break;
    case 8: tiled_body<u64>(p, tile); break;
    case 4: tiled_body<unsigned>(p, tile); break;
    case 2: tiled_body<unsigned short>(p, tile); break;
    default: tiled_body<unsigned char>(p, tile); break;
    }
}
"#
);

/// The kernels' argument block (`struct Params` in the kernel source).
#[repr(C)]
#[derive(Clone, Copy)]
struct Params {
    dst: u64,
    src: u64,
    run: u64,
    runs: u64,
    c: [u64; crate::MAX_DIMS],
    ds: [u64; crate::MAX_DIMS],
    ss: [u64; crate::MAX_DIMS],
    n: u32,
    word: u32,
    load_b: u32,
    store_b: u32,
}

// SAFETY: plain `#[repr(C)]` data, laid out as the kernel's `struct Params` (u64 fields, then
// four 32-bit fields; no padding in either).
unsafe impl cudarc::driver::DeviceRepr for Params {}

struct Kernels {
    linear: CudaFunction,
    /// By element size: 1, 2, 4, 8, 16 bytes.
    transpose: [CudaFunction; 5],
    tiled: CudaFunction,
    each: CudaFunction,
    rows: CudaFunction,
}

/// SM copies of plans for one context: the kernels, compiled with NVRTC on first use. See the
/// [module documentation](self).
pub struct SmCopier {
    ctx: Arc<CudaContext>,
    kernels: Made<Arc<Kernels>>,
    sms: u32,
}

impl std::fmt::Debug for SmCopier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmCopier")
            .field("device", &self.ctx.ordinal())
            .finish()
    }
}

/// The widest word (1..=16 bytes) every access of the plan is aligned to.
fn word(dst: u64, src: u64, plan: &Plan) -> u32 {
    let mut bits = dst | src | plan.run() as u64;
    for &s in plan.dst_strides().iter().chain(plan.src_strides()) {
        bits |= s as u64;
    }
    1 << bits.trailing_zeros().min(4)
}

impl SmCopier {
    /// An SM copier for `ctx`. Cheap: the kernels are compiled on first use.
    pub fn new(ctx: Arc<CudaContext>) -> Result<SmCopier, SmError> {
        driver::set_current(&ctx).map_err(drv("cuCtxSetCurrent"))?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("cuDeviceGetAttribute"))?
            .max(1) as u32;
        Ok(SmCopier {
            ctx,
            kernels: Made::new(),
            sms,
        })
    }

    /// Compiles the kernels (once). Errors: [`SmError::Kernel`].
    pub fn compile(&self) -> Result<(), SmError> {
        self.kernels().map(drop)
    }

    fn kernels(&self) -> Result<Arc<Kernels>, SmError> {
        Ok(self.kernels.get(|| self.make_kernels())?)
    }

    fn make_kernels(&self) -> Result<Arc<Kernels>, KernelError> {
        let names = [
            "ferry_sm_linear",
            "ferry_sm_tiled",
            "ferry_sm_each",
            "ferry_sm_rows",
            "ferry_sm_transpose1",
            "ferry_sm_transpose2",
            "ferry_sm_transpose4",
            "ferry_sm_transpose8",
            "ferry_sm_transpose16",
        ];
        let [linear, tiled, each, rows, t1, t2, t4, t8, t16] =
            <[CudaFunction; 9]>::try_from(program::program(&self.ctx, KERNEL_SRC, &names)?)
                .map_err(|_| KernelError::Compile("kernels missing from the program".into()))?;
        Ok(Arc::new(Kernels {
            linear,
            transpose: [t1, t2, t4, t8, t16],
            tiled,
            each,
            rows,
        }))
    }

    /// Enqueues `plan` on `stream` as one kernel launch and returns the kernel used. `dst` and
    /// `src` are the unified addresses of the buffers' starts (the plan's offsets are added
    /// here): device pointers of this context's device, or pinned/registered/mapped/managed
    /// host memory. Asynchronous: synchronize the stream (or record an event) before reading the
    /// destination.
    ///
    /// Errors: [`SmError::NotDeviceAccessible`] (checked before anything is enqueued), compile
    /// and driver errors (nothing is enqueued when the launch fails).
    ///
    /// # Safety
    /// 1. Every run of `plan` lies inside the destination and the source buffers, which stay
    ///    allocated until the stream has passed this copy; nothing else writes the destination's
    ///    runs or the source's runs until then, and the two do not overlap.
    /// 2. Device memory belongs to this copier's context (or is accessible from it), and
    ///    `stream` belongs to it.
    pub unsafe fn copy(
        &self,
        stream: &Arc<CudaStream>,
        dst: u64,
        src: u64,
        plan: &Plan,
    ) -> Result<SmKernel, SmError> {
        if plan.total_bytes() == 0 {
            return Ok(SmKernel::for_plan(plan));
        }
        driver::set_current(&self.ctx).map_err(drv("cuCtxSetCurrent"))?;
        let d = driver::device_address(dst).ok_or(SmError::NotDeviceAccessible {
            side: "destination",
            addr: dst,
        })?;
        let s = driver::device_address(src).ok_or(SmError::NotDeviceAccessible {
            side: "source",
            addr: src,
        })?;
        let ks = self.kernels()?;
        let (d, s) = (d + plan.dst_offset() as u64, s + plan.src_offset() as u64);
        // The transpose kernel, where every element it touches is aligned for its accesses.
        let transpose = crate::engine::cuda::route::transpose_of(plan).and_then(|t| {
            Some((
                t,
                crate::engine::cuda::route::transpose_access(&t, plan, d, s)?,
            ))
        });
        let kind = SmKernel::pick(plan, transpose.is_some());
        if let Some((t, vec)) = transpose {
            let (p, cfg) = super::transpose::launch(&t, vec, plan, d, s);
            // Elements of 1, 2, 4, 8, 16 bytes: kernel 0..5.
            let func = &ks.transpose[t.elem.trailing_zeros().min(4) as usize];
            let mut launch = stream.launch_builder(func);
            launch.arg(&p);
            // SAFETY: the kernel takes one `TParams` by value (matching layout); every element
            // lies in its buffer (caller, 1), each addressed through its device-accessible
            // address; the stream belongs to this context (2).
            unsafe { launch.launch(cfg) }.map_err(drv("cuLaunchKernel"))?;
            return Ok(kind);
        }
        let n = plan.counts().len();
        let mut p = Params {
            dst: d,
            src: s,
            run: plan.run() as u64,
            runs: plan.run_count() as u64,
            c: [1; crate::MAX_DIMS],
            ds: [0; crate::MAX_DIMS],
            ss: [0; crate::MAX_DIMS],
            n: n as u32,
            word: 1,
            load_b: 1,
            store_b: 1,
        };
        for i in 0..n {
            p.c[i] = plan.counts()[i] as u64;
            p.ds[i] = plan.dst_strides()[i] as u64;
            p.ss[i] = plan.src_strides()[i] as u64;
        }
        p.word = word(p.dst, p.src, plan);
        let most = u64::from(self.sms) * 16;
        let (func, cfg) = match kind {
            SmKernel::Linear => {
                let blocks = p.run.div_ceil(256 * 16 * 4).clamp(1, most);
                (&ks.linear, linear_cfg(blocks))
            }
            SmKernel::Each => {
                let blocks = p.runs.div_ceil(256).clamp(1, most * 4);
                (&ks.each, linear_cfg(blocks))
            }
            SmKernel::Rows => {
                let blocks = p.runs.div_ceil(8).clamp(1, most);
                (&ks.rows, linear_cfg(blocks))
            }
            // (A transpose launched above; this arm is never reached with one.)
            SmKernel::Tiled | SmKernel::Transpose => {
                // The thread index's fast dim walks the dim of smaller stride, in each phase.
                let (a, b) = (n - 2, n - 1);
                p.load_b = u32::from(p.ss[b] <= p.ss[a]);
                p.store_b = u32::from(p.ds[b] <= p.ds[a]);
                let tiles =
                    (p.runs / (p.c[a] * p.c[b])) * p.c[a].div_ceil(32) * p.c[b].div_ceil(32);
                let blocks = tiles.clamp(1, u64::from(self.sms) * 8) as u32;
                let cfg = LaunchConfig {
                    grid_dim: (blocks, 1, 1),
                    block_dim: (32, 8, 1),
                    shared_mem_bytes: 0,
                };
                (&ks.tiled, cfg)
            }
        };
        let mut launch = stream.launch_builder(func);
        launch.arg(&p);
        // SAFETY: the kernel takes one `Params` by value (matching layout); every run lies in
        // its buffer (caller, 1), each addressed through its device-accessible address; the
        // stream belongs to this context (2).
        unsafe { launch.launch(cfg) }.map_err(drv("cuLaunchKernel"))?;
        Ok(kind)
    }
}

/// A 1-D launch of `blocks` blocks of 256 threads.
fn linear_cfg(blocks: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.min(i32::MAX as u64) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl From<crate::engine::cuda::paths::strided::SmError> for CudaError {
    fn from(e: crate::engine::cuda::paths::strided::SmError) -> Self {
        use crate::engine::cuda::paths::strided::SmError as S;
        match e {
            S::Kernel(k) => CudaError::Kernel(k),
            S::Driver { op, source } => {
                CudaError::Driver(crate::engine::cuda::DriverError::from_cudarc(op, source))
            }
            e => CudaError::InvalidArgument(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Layout;

    #[test]
    fn kernel_choice_follows_the_plan() {
        let l = Layout::bytes(1000).unwrap();
        assert_eq!(
            SmKernel::for_plan(&Plan::new(&l, &l).unwrap()),
            SmKernel::Linear
        );
        let m = Layout::contiguous(&[64, 96], 4).unwrap();
        let t = Layout::contiguous(&[96, 64], 4).unwrap();
        let tr = Plan::new(&t, &m.transpose(0, 1).unwrap()).unwrap();
        assert_eq!(SmKernel::for_plan(&tr), SmKernel::Transpose);
        let m12 = Layout::contiguous(&[64, 96], 12).unwrap();
        let t12 = Layout::contiguous(&[96, 64], 12).unwrap();
        let tr12 = Plan::new(&t12, &m12.transpose(0, 1).unwrap()).unwrap();
        assert_eq!(SmKernel::for_plan(&tr12), SmKernel::Tiled);
        let rows = Layout::contiguous(&[300, 4], 4).unwrap();
        let odd = rows.slice(0, 0..300, 2).unwrap();
        let packed = Layout::contiguous(&[150, 4], 4).unwrap();
        let p = Plan::new(&packed, &odd).unwrap();
        assert_eq!(SmKernel::for_plan(&p), SmKernel::Each);
        let wide = Layout::pitched(&[10, 4096], 1, 8192).unwrap();
        let dense = Layout::contiguous(&[10, 4096], 1).unwrap();
        assert_eq!(
            SmKernel::for_plan(&Plan::new(&dense, &wide).unwrap()),
            SmKernel::Rows
        );
    }

    #[test]
    fn auto_takes_only_many_short_runs() {
        let m = Layout::contiguous(&[64, 64], 4).unwrap();
        let tr = Plan::new(&m, &m.transpose(0, 1).unwrap()).unwrap();
        assert!(KernelCopies::Auto.takes(&tr));
        assert!(KernelCopies::Always.takes(&tr) && !KernelCopies::Never.takes(&tr));
        // Two columns: two driver calls.
        let small = Layout::contiguous(&[2, 2], 4).unwrap();
        let tr_small = Plan::new(&small, &small.transpose(0, 1).unwrap()).unwrap();
        assert!(
            !KernelCopies::Auto.takes(&tr_small),
            "fewer calls than AUTO_MIN_CALLS"
        );
        // A transpose of 256-byte elements: many calls.
        let wide = Layout::contiguous(&[8, 8], 256).unwrap();
        let tr_wide = Plan::new(&wide, &wide.transpose(0, 1).unwrap()).unwrap();
        assert!(KernelCopies::Auto.takes(&tr_wide));
        // Tiles (one 2-D call): short rows only when there are many.
        let tile = |rows: usize, run: usize| {
            let src = Layout::pitched(&[rows, run], 1, 2 * run).unwrap();
            let dst = Layout::contiguous(&[rows, run], 1).unwrap();
            Plan::new(&dst, &src).unwrap()
        };
        assert!(KernelCopies::Auto.takes(&tile(AUTO_MIN_RUNS, 4)));
        assert!(!KernelCopies::Auto.takes(&tile(AUTO_MIN_RUNS - 1, 4)));
        assert!(!KernelCopies::Auto.takes(&tile(1 << 20, 64)));
        let l = Layout::bytes(1 << 20).unwrap();
        let flat = Plan::new(&l, &l).unwrap();
        assert!(!KernelCopies::Auto.takes(&flat) && KernelCopies::Always.takes(&flat));
    }

    #[test]
    fn word_is_the_common_alignment() {
        let m = Layout::contiguous(&[64, 64], 8).unwrap();
        let tr = Plan::new(&m, &m.transpose(0, 1).unwrap()).unwrap();
        assert_eq!(word(0x1000, 0x2000, &tr), 8);
        assert_eq!(word(0x1004, 0x2000, &tr), 4);
        let l = Layout::bytes(4096).unwrap();
        assert_eq!(word(0x1000, 0x2000, &Plan::new(&l, &l).unwrap()), 16);
        let b = Layout::contiguous(&[64, 64], 3).unwrap();
        let trb = Plan::new(&b, &b.transpose(0, 1).unwrap()).unwrap();
        assert_eq!(word(0x1000, 0x2000, &trb), 1);
    }
}
