//! The host-side copy of every staging user (a staged chunk, a bounce buffer's fill): a plain
//! `memcpy`, or on x86-64 one with non-temporal (streaming) stores, which skip the
//! read-for-ownership of each destination line. Host memory bandwidth, shared by the workers'
//! copies and the DMA, is what caps a staged copy
//! ([`StagingConfig::non_temporal`](crate::cuda::StagingConfig::non_temporal)). And
//! [`demote`], which moves just-written lines out of the writing core's private caches before a
//! DMA reads them; [`piece`] cuts a copy between workers.

/// Copies `len` bytes from `src` to `dst`; with `nt` on x86-64, through non-temporal 16-byte
/// stores (then a store fence, so the bytes are visible to the DMA that follows).
///
/// # Safety
/// 1. `src` is readable and `dst` writable for `len` bytes, and the two ranges do not overlap.
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize, nt: bool) {
    #[cfg(target_arch = "x86_64")]
    if nt && len >= 4096 {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = dst.align_offset(16).min(len);
        // SAFETY: every access below stays inside `src..src+len` / `dst..dst+len` (contract);
        // stream stores go to 16-byte aligned addresses (`head` aligns `dst`); SSE2 is part of
        // the x86-64 baseline.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            let (mut s, mut d, mut n) = (src.add(head), dst.add(head), len - head);
            while n >= 64 {
                let a = _mm_loadu_si128(s as *const __m128i);
                let b = _mm_loadu_si128(s.add(16) as *const __m128i);
                let c = _mm_loadu_si128(s.add(32) as *const __m128i);
                let e = _mm_loadu_si128(s.add(48) as *const __m128i);
                _mm_stream_si128(d as *mut __m128i, a);
                _mm_stream_si128(d.add(16) as *mut __m128i, b);
                _mm_stream_si128(d.add(32) as *mut __m128i, c);
                _mm_stream_si128(d.add(48) as *mut __m128i, e);
                s = s.add(64);
                d = d.add(64);
                n -= 64;
            }
            std::ptr::copy_nonoverlapping(s, d, n);
            _mm_sfence();
        }
        return;
    }
    let _ = nt;
    // SAFETY: the contract above.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Hints the CPU to move the cache lines of `addr..addr + len` from the calling core's private
/// caches to the cache shared by all cores (`CLDEMOTE`, x86-64 CPUs from Sapphire Rapids on; on
/// other x86-64 CPUs the same bytes are a no-op, as the instruction was defined in the
/// hint-NOP space; nothing elsewhere). A DMA that reads host memory a core has just written
/// otherwise waits for that core to give up each line it still holds modified: on the H200
/// host's Xeon, the DMAs of a GPU pipeline's last 2 MiB bounce buffers, which 8 threads filled
/// with nothing filled after them, took 57-107 us, against 44-52 us once the lines were demoted
/// (runs 96-104 of `bench/results/h200.md`).
///
/// # Safety
/// 1. `addr..addr + len` is mapped memory of this process (the hint never faults on the Intel
///    CPUs that have it, but nothing outside the contract is relied upon).
pub(crate) unsafe fn demote(addr: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let end = addr as usize + len;
        let mut line = addr as usize & !63;
        while line < end {
            // SAFETY: `line` is inside the first or a later line of the range (contract); the
            // bytes 0F 1C /0 are CLDEMOTE m8 with the address in rax (written out so that no
            // target feature is needed to assemble it), a hint that reads and writes nothing
            // the program sees, no stack, no flags.
            unsafe {
                std::arch::asm!(
                    ".byte 0x0f, 0x1c, 0x00",
                    in("rax") line,
                    options(nostack, preserves_flags, readonly)
                );
            }
            line += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (addr, len);
}

/// Worker `i`'s piece of a `len`-byte copy split across `t` workers, as `(offset, len)`: `t`
/// equal pieces rounded up to 4 KiB (small copies stay on few workers), `None` past the end.
pub(crate) fn piece(len: usize, t: usize, i: usize) -> Option<(usize, usize)> {
    let per = len.div_ceil(t.max(1)).div_ceil(4096) * 4096;
    let start = i.checked_mul(per)?;
    (start < len).then(|| (start, per.min(len - start)))
}

#[cfg(test)]
mod tests {
    use super::{copy_bytes, piece};

    #[test]
    fn pieces_cover_a_copy_once_on_4k_boundaries() {
        for (len, t) in [(0, 4), (1, 4), (4096 * 3 + 5, 4), (9 << 20, 12), (100, 1)] {
            let mut next = 0;
            for i in 0..t + 2 {
                if let Some((at, l)) = piece(len, t, i) {
                    assert_eq!(at, next, "{len} {t} {i}");
                    assert_eq!(at % 4096, 0);
                    next = at + l;
                }
            }
            assert_eq!(next, len, "{len} {t}");
        }
    }

    #[test]
    fn demoted_bytes_are_unchanged() {
        let buf: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        let want = buf.clone();
        for (at, len) in [(0, 10_000), (1, 63), (63, 2), (4096, 0), (9_999, 1)] {
            // SAFETY: every range is inside `buf`.
            unsafe { super::demote(buf.as_ptr().add(at), len) };
        }
        assert_eq!(buf, want);
    }

    #[test]
    fn non_temporal_copy_every_alignment_and_length() {
        let src: Vec<u8> = (0..20_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for (so, do_, len) in [
            (0, 0, 4096),
            (1, 3, 4096),
            (5, 0, 9999),
            (0, 15, 10_001),
            (7, 9, 19_000),
            (3, 3, 100),
        ] {
            for nt in [true, false] {
                let mut dst = vec![0xEEu8; 20_016];
                // SAFETY: both ranges are inside their vectors and do not overlap.
                unsafe { copy_bytes(src.as_ptr().add(so), dst.as_mut_ptr().add(do_), len, nt) };
                assert_eq!(
                    &dst[do_..do_ + len],
                    &src[so..so + len],
                    "{so} {do_} {len} {nt}"
                );
                assert!(dst[..do_].iter().all(|&b| b == 0xEE));
                assert!(dst[do_ + len..].iter().all(|&b| b == 0xEE));
            }
        }
    }
}
