//! Test data and its check: deterministic byte patterns for sources, and the first byte
//! where a destination differs from what it should hold.

/// A pseudo-random byte pattern (xorshift), every page written.
pub(crate) fn pattern_bytes(len: usize) -> Vec<u8> {
    xorshift_bytes(len, 0x9E37_79B9_7F4A_7C15u64 ^ len as u64)
}

/// Deterministic bytes, different per seed (xorshift).
pub(super) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let x = (0x9E37_79B9_7F4A_7C15u64 ^ len as u64).wrapping_add(seed.wrapping_mul(0xD1B5)) | 1;
    xorshift_bytes(len, x)
}

/// `len` bytes of the xorshift sequence started at `x`, eight at a time.
fn xorshift_bytes(len: usize, mut x: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    v
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
}
