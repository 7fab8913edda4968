//! Test data and its check: deterministic byte patterns for sources, and the first byte
//! where a destination differs from what it should hold.

/// A pseudo-random byte pattern (xorshift), every page written.
pub(crate) fn pattern_bytes(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_pattern(&mut v);
    v
}

/// Writes [`pattern_bytes`]`(b.len())` into `b`.
pub(super) fn fill_pattern(b: &mut [u8]) {
    xorshift_fill(b, 0x9E37_79B9_7F4A_7C15u64 ^ b.len() as u64);
}

/// Deterministic bytes, different per seed (xorshift).
pub(super) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let x = (0x9E37_79B9_7F4A_7C15u64 ^ len as u64).wrapping_add(seed.wrapping_mul(0xD1B5)) | 1;
    let mut v = vec![0u8; len];
    xorshift_fill(&mut v, x);
    v
}

/// Fills `v` with the xorshift sequence started at `x`, eight bytes at a time.
fn xorshift_fill(v: &mut [u8], mut x: u64) {
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

/// The first byte where `a` and `b` differ.
pub(super) fn first_diff(a: &[u8], b: &[u8]) -> Result<(), usize> {
    if a == b {
        return Ok(());
    }
    Err(a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len())))
}

/// A host test's source and destination, placed in one allocation so that the copy's loads and
/// stores never share their low 12 address bits: the source starts 64 bytes past a 4 KiB
/// boundary and the destination 2 KiB further into its page. Where two separate allocations
/// happen to start at the same offset in a page, every store aliases the load that follows it
/// (4 KiB aliasing: the load waits for the store), and small copies that fit in cache ran from
/// 1.6 to 55 GB/s between runs depending on where the allocator put the buffers.
pub(super) struct Placed<T> {
    buf: Vec<T>,
    src: std::ops::Range<usize>,
    dst: std::ops::Range<usize>,
}

/// Page size the placement is measured in.
const PAGE: usize = 4096;
/// Where the source starts within its page.
const SRC_OFFSET: usize = 64;
/// How much further into its page the destination starts than the source.
const DST_SHIFT: usize = 2048;

impl<T: ferry::bytemuck::Pod> Placed<T> {
    /// A source of `src_len` elements written by `fill` and a zeroed destination of `dst_len`
    /// elements, placed as the type says (the source is filled in place: no second copy of it
    /// is ever resident).
    pub(super) fn new(src_len: usize, dst_len: usize, fill: impl FnOnce(&mut [T])) -> Placed<T> {
        let es = std::mem::size_of::<T>().max(1);
        let slack = 3 * PAGE / es + 1;
        let mut buf = vec![T::zeroed(); src_len + dst_len + slack];
        let addr = buf.as_ptr() as usize;
        let (s0, d0) = if PAGE % es == 0 && addr % es == 0 {
            let s_byte = (PAGE - addr % PAGE) % PAGE + SRC_OFFSET;
            let d_byte = s_byte + (src_len * es).next_multiple_of(PAGE) + DST_SHIFT;
            (s_byte / es, d_byte / es)
        } else {
            (0, src_len)
        };
        fill(&mut buf[s0..s0 + src_len]);
        Placed {
            buf,
            src: s0..s0 + src_len,
            dst: d0..d0 + dst_len,
        }
    }

    /// The source (read) and the destination (written).
    pub(super) fn parts(&mut self) -> (&[T], &mut [T]) {
        let (a, b) = self.buf.split_at_mut(self.dst.start);
        (&a[self.src.clone()], &mut b[..self.dst.len()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_seed() {
        assert_ne!(pattern(4096, 1), pattern(4096, 2));
        assert_eq!(pattern(4099, 3), pattern(4099, 3));
        assert_eq!(pattern_bytes(9).len(), 9);
    }

    #[test]
    fn verification_catches_a_wrong_byte() {
        assert_eq!(first_diff(&[1, 2, 3], &[1, 9, 3]), Err(1));
        assert_eq!(first_diff(&[1, 2], &[1, 2]), Ok(()));
    }
    #[test]
    fn placed_buffers_never_share_a_page_offset() {
        for len in [0usize, 1, 7, 4096, 4099, 65536] {
            let src: Vec<u8> = pattern_bytes(len);
            let mut p = Placed::new(len, len + 3, fill_pattern);
            let (s, d) = p.parts();
            assert_eq!(s, &src[..]);
            assert_eq!(d.len(), len + 3);
            assert!(d.iter().all(|&b| b == 0));
            let (sa, da) = (s.as_ptr() as usize, d.as_ptr() as usize);
            assert_eq!(sa % PAGE, SRC_OFFSET);
            assert_eq!(da % PAGE, SRC_OFFSET + DST_SHIFT);
            assert!(sa + len <= da, "source and destination overlap");
        }
        let f: Vec<f64> = (0..1000).map(f64::from).collect();
        let mut p = Placed::new(1000, 1000, |s| s.copy_from_slice(&f));
        let (s, d) = p.parts();
        assert_eq!(s, &f[..]);
        assert_eq!(
            (d.as_ptr() as usize - s.as_ptr() as usize) % PAGE,
            DST_SHIFT
        );
    }
}
