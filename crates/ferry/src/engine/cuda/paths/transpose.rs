//! The SM transpose kernel: plans that [`crate::engine::cuda::route::transpose_of`] recognises (two dims swap grain
//! between the sides, elements of 1, 2, 4, 8 or 16 bytes, any number of batch dims) move
//! through shared-memory tiles, so that a warp reads 128 contiguous bytes of the source and
//! writes 128 contiguous bytes of the destination where the layouts are dense.
//!
//! The tile is `TC` rows along the destination's grain (`c`) of `TR = 32 * V` elements along
//! the source's grain (`r`), padded by 4 bytes (or one element) per row against bank
//! conflicts. Each of the block's 32 x 8 threads moves `V` adjacent elements per access: `V =
//! 4 / elem` for 1- and 2-byte elements (bf16, f16, int8) where both sides are dense along
//! their grain and 4-byte aligned (so each thread's access is a 4-byte word), else 1. Every
//! access must be aligned to its size: [`route::transpose_access`](crate::engine::cuda::route::transpose_access)
//! picks `V` and keeps plans with misaligned elements (a buffer at an odd offset, an odd
//! pitch) off this kernel. It loads
//! `TC / 8` words before storing any (all in flight together), and full tiles take no bounds
//! checks; the ragged edge tiles check every element. The grid is (tiles along `r`, tiles
//! along `c`, batch), with 32-bit index math: the per-tile cost of the strided kernel's 64-bit
//! divisions is what held its f32 transpose of 8192 x 8192 to 0.36x a contiguous copy
//! (724 vs 2,000 GB/s, issue 14).
//!
//! Pinned (and mapped, registered) host memory on either side is read or written by the kernel
//! itself through its device address (zero-copy over PCIe), not copied into a device scratch
//! buffer first: the reads of a tile are whole 128-byte lines, so the link runs at the speed of
//! a contiguous copy (the older tiled kernel already moved f32 transposes pinned -> device at
//! 0.92-0.93x a contiguous copy of the same bytes at 16 and 64 MiB, H200 run 30), and a staged
//! pipeline would add a scratch allocation, a second stream and event hand-offs for the last
//! few percent at most. Writes to pinned memory are posted and coalesced the same way.

use crate::engine::cuda::route::Transpose;
use crate::plan::Plan;
use cudarc::driver::LaunchConfig;

/// The kernel's CUDA C++ source (`ferry_sm_transpose`), as a literal for `concat!` into the
/// SM copier's program (after `kernel_prelude!`, which defines `u64`).
macro_rules! transpose_kernel {
    () => {
        r#"
#define TP_MAXD 16
#define TP_SMEM 16896
#define TP_MINB 8
struct TParams {
    u64 dst, src;
    u64 sr, sc, dr, dc;
    u64 bc[TP_MAXD], bds[TP_MAXD], bss[TP_MAXD];
    unsigned rows, cols, batch, nb, elem, vec;
};
// Tiles of TC rows (along c, the destination's grain) of TR = 32 * V elements (along r, the
// source's grain). V > 1: both sides dense along their grain and VT-aligned (host-checked).
template <typename E, typename VT, int V, int TC>
__device__ __forceinline__ void transpose_tiles(const TParams& p, unsigned char* smem) {
    constexpr int TR = 32 * V;
    constexpr int PAD = sizeof(E) >= 4 ? 1 : 4 / (int)sizeof(E);
    constexpr int P = TR + PAD;
    constexpr int H = TC / TR;
    E* tile = (E*)smem;
    const unsigned lane = threadIdx.x, ty = threadIdx.y;
    const unsigned rows = p.rows, cols = p.cols;
    const unsigned nr = (rows + TR - 1) / TR, nc = (cols + TC - 1) / TC;
    for (unsigned b = blockIdx.z; b < p.batch; b += gridDim.z) {
        u64 so = 0, dof = 0;
        unsigned rest = b;
        for (int i = (int)p.nb - 1; i >= 0; --i) {
            unsigned n = (unsigned)p.bc[i], x = rest % n;
            rest /= n;
            so += x * p.bss[i];
            dof += x * p.bds[i];
        }
        for (unsigned tc = blockIdx.y; tc < nc; tc += gridDim.y) {
            for (unsigned tr = blockIdx.x; tr < nr; tr += gridDim.x) {
                const unsigned r0 = tr * TR, c0 = tc * TC;
                const unsigned char* s = (const unsigned char*)(p.src + so + r0 * p.sr + c0 * p.sc);
                unsigned char* d = (unsigned char*)(p.dst + dof + r0 * p.dr + c0 * p.dc);
                const bool full = (u64)r0 + TR <= rows && (u64)c0 + TC <= cols;
                if (full && V > 1) {
                    VT v[TC / 8];
                    #pragma unroll
                    for (int k = 0; k < TC / 8; ++k) v[k] = *(const VT*)(s + (ty + 8 * k) * p.sc + lane * sizeof(VT));
                    #pragma unroll
                    for (int k = 0; k < TC / 8; ++k) *(VT*)(tile + (ty + 8 * k) * P + lane * V) = v[k];
                } else if (full) {
                    E v[TC / 8];
                    #pragma unroll
                    for (int k = 0; k < TC / 8; ++k) v[k] = *(const E*)(s + (ty + 8 * k) * p.sc + lane * p.sr);
                    #pragma unroll
                    for (int k = 0; k < TC / 8; ++k) tile[(ty + 8 * k) * P + lane] = v[k];
                } else {
                    for (int k = 0; k < TC / 8; ++k) {
                        unsigned c = ty + 8 * k;
                        if (c0 + c >= cols) break;
                        for (int x = 0; x < V; ++x) {
                            unsigned r = lane * V + x;
                            if (r0 + r < rows) tile[c * P + r] = *(const E*)(s + c * p.sc + r * p.sr);
                        }
                    }
                }
                __syncthreads();
                if (full && V > 1) {
                    #pragma unroll
                    for (int k = 0; k < TR / 8; ++k) {
                        unsigned r = ty + 8 * k;
                        #pragma unroll
                        for (int h = 0; h < H; ++h) {
                            union { VT w; E e[V]; } u;
                            #pragma unroll
                            for (int x = 0; x < V; ++x) u.e[x] = tile[(h * TR + lane * V + x) * P + r];
                            *(VT*)(d + r * p.dr + (h * TR + lane * V) * sizeof(E)) = u.w;
                        }
                    }
                } else if (full) {
                    #pragma unroll
                    for (int k = 0; k < TR / 8; ++k) {
                        unsigned r = ty + 8 * k;
                        #pragma unroll
                        for (int h = 0; h < H; ++h) {
                            unsigned c = h * 32 + lane;
                            *(E*)(d + r * p.dr + c * p.dc) = tile[c * P + r];
                        }
                    }
                } else {
                    for (int k = 0; k < TR / 8; ++k) {
                        unsigned r = ty + 8 * k;
                        if (r0 + r >= rows) break;
                        for (int h = 0; h < H; ++h) {
                            for (int x = 0; x < V; ++x) {
                                unsigned c = h * TR + lane * V + x;
                                if (c0 + c < cols) *(E*)(d + r * p.dr + c * p.dc) = tile[c * P + r];
                            }
                        }
                    }
                }
                __syncthreads();
            }
        }
    }
}
// One kernel per element size (each with its own registers), launched as 32 x 8 threads; one
// shared buffer for both vector widths (16896 bytes: the largest tile, 128 x 132 bytes,
// 64 x 33 x 8 or 32 x 33 x 16).
#define TP_KERNEL(NAME, ...) \
    extern "C" __global__ void __launch_bounds__(256, TP_MINB) NAME(TParams p) { \
        __shared__ __align__(16) unsigned char smem[TP_SMEM]; \
        __VA_ARGS__; \
    }
TP_KERNEL(ferry_sm_transpose1, if (p.vec == 4) transpose_tiles<unsigned char, unsigned, 4, 128>(p, smem); else transpose_tiles<unsigned char, unsigned char, 1, 64>(p, smem))
TP_KERNEL(ferry_sm_transpose2, if (p.vec == 2) transpose_tiles<unsigned short, unsigned, 2, 64>(p, smem); else transpose_tiles<unsigned short, unsigned short, 1, 64>(p, smem))
TP_KERNEL(ferry_sm_transpose4, transpose_tiles<unsigned, unsigned, 1, 64>(p, smem))
TP_KERNEL(ferry_sm_transpose8, transpose_tiles<u64, u64, 1, 64>(p, smem))
TP_KERNEL(ferry_sm_transpose16, transpose_tiles<uint4, uint4, 1, 32>(p, smem))
"#
    };
}
pub(crate) use transpose_kernel;

/// The kernel's argument block (`struct TParams` in the kernel source).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TParams {
    dst: u64,
    src: u64,
    sr: u64,
    sc: u64,
    dr: u64,
    dc: u64,
    bc: [u64; crate::MAX_DIMS],
    bds: [u64; crate::MAX_DIMS],
    bss: [u64; crate::MAX_DIMS],
    rows: u32,
    cols: u32,
    batch: u32,
    nb: u32,
    elem: u32,
    vec: u32,
}

// SAFETY: plain `#[repr(C)]` data, laid out as the kernel's `struct TParams` (u64 fields, then
// six 32-bit fields: 456 bytes, no padding in either).
unsafe impl cudarc::driver::DeviceRepr for TParams {}
const _: () = assert!(
    std::mem::size_of::<TParams>() == 456,
    "TParams must match the kernel"
);

/// The kernel's arguments and launch for transpose `t` of `plan` between the device addresses
/// `dst` and `src` (the plan's offsets already added), `vec` elements per access
/// ([`route::transpose_access`](crate::engine::cuda::route::transpose_access), which checked that every
/// address is aligned to that access).
pub(crate) fn launch(
    t: &Transpose,
    vec: usize,
    plan: &Plan,
    dst: u64,
    src: u64,
) -> (TParams, LaunchConfig) {
    let (counts, ds, ss) = (plan.counts(), plan.dst_strides(), plan.src_strides());
    let mut p = TParams {
        dst,
        src,
        sr: ss[t.r] as u64,
        sc: ss[t.c] as u64,
        dr: ds[t.r] as u64,
        dc: ds[t.c] as u64,
        bc: [1; crate::MAX_DIMS],
        bds: [0; crate::MAX_DIMS],
        bss: [0; crate::MAX_DIMS],
        // `transpose_of` checked that these fit in 31 bits.
        rows: counts[t.r] as u32,
        cols: counts[t.c] as u32,
        batch: t.batch as u32,
        nb: 0,
        elem: t.elem as u32,
        vec: vec as u32,
    };
    for i in (0..counts.len()).filter(|&i| i != t.r && i != t.c) {
        let k = p.nb as usize;
        (p.bc[k], p.bds[k], p.bss[k]) = (counts[i] as u64, ds[i] as u64, ss[i] as u64);
        p.nb += 1;
    }
    // The tile's extents, as the kernel's instantiations have them.
    let tr = 32 * p.vec;
    let tc = match (t.elem, p.vec) {
        (1, 4) => 128,
        (16, _) => 32,
        _ => 64,
    };
    let cfg = LaunchConfig {
        grid_dim: (
            p.rows.div_ceil(tr).clamp(1, i32::MAX as u32),
            p.cols.div_ceil(tc).clamp(1, 65535),
            p.batch.clamp(1, 65535),
        ),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    };
    (p, cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cuda::route::transpose_of;
    use crate::Layout;

    fn plan(rows: usize, cols: usize, elem: usize, pitch: Option<usize>) -> Plan {
        let m = match pitch {
            Some(p) => Layout::pitched(&[rows, cols], elem, p).unwrap(),
            None => Layout::contiguous(&[rows, cols], elem).unwrap(),
        };
        let t = Layout::contiguous(&[cols, rows], elem).unwrap();
        Plan::new(&t, &m.transpose(0, 1).unwrap()).unwrap()
    }

    #[test]
    fn params_follow_the_plan() {
        let p = plan(100, 300, 4, None);
        let t = transpose_of(&p).unwrap();
        let (a, cfg) = launch(&t, 1, &p, 0x1000, 0x2000);
        // Source grain: the 300 columns (stride 4); destination grain: the 100 rows.
        assert_eq!((a.rows, a.cols, a.batch, a.nb), (300, 100, 1, 0));
        assert_eq!((a.sr, a.sc, a.dr, a.dc), (4, 1200, 400, 4));
        assert_eq!((a.elem, a.vec), (4, 1));
        assert_eq!(cfg.grid_dim, (10, 2, 1));
        assert_eq!(cfg.block_dim, (32, 8, 1));
    }

    #[test]
    fn word_tiles_are_128_bytes_wide() {
        let b = plan(128, 256, 1, None);
        let tb = transpose_of(&b).unwrap();
        let (a, cfg) = launch(&tb, 4, &b, 0, 0);
        assert_eq!(a.vec, 4);
        assert_eq!(cfg.grid_dim, (2, 1, 1), "128 x 128-byte tiles");
    }

    #[test]
    fn batch_dims_walk_outside_the_tile() {
        // [B, R, C] -> [B, C, R].
        let src = Layout::contiguous(&[5, 40, 70], 2).unwrap();
        let dst = Layout::contiguous(&[5, 70, 40], 2).unwrap();
        let p = Plan::new(&dst, &src.transpose(1, 2).unwrap()).unwrap();
        let t = transpose_of(&p).unwrap();
        let (a, cfg) = launch(&t, 2, &p, 0, 0);
        assert_eq!((a.rows, a.cols, a.batch, a.nb), (70, 40, 5, 1));
        assert_eq!((a.bc[0], a.bds[0], a.bss[0]), (5, 5600, 5600));
        assert_eq!(a.vec, 2);
        assert_eq!(cfg.grid_dim, (2, 1, 5));
    }
}
