//! Shared by the stress tests (`stress.rs`, `cuda_stress.rs`): a seeded generator and random
//! layouts (contiguous, column-major, pitched, strided bases; sliced with steps and offsets;
//! permuted).
#![allow(dead_code)]

use ferry::Layout;

/// SplitMix64: small, fast, deterministic from its seed.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
    pub fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// A random shape: mostly small (up to 64 or 8192 elements), one in ten up to `big` bytes.
pub fn shape(r: &mut Rng, big: usize) -> (Vec<usize>, usize) {
    let elem = [1usize, 2, 4, 8, 16][r.below(5)];
    let nd = r.range(1, 3);
    let max_elems = match if cfg!(miri) { 0 } else { r.below(10) } {
        0..=5 => 64,
        6..=8 => 8192,
        _ => big / elem,
    };
    let mut dims = Vec::with_capacity(nd);
    let mut left = max_elems;
    for _ in 0..nd {
        let d = r.range(1, left.clamp(1, 2048));
        dims.push(d);
        left = (left / d).max(1);
    }
    (dims, elem)
}

/// A layout of `dims` inside a larger buffer: contiguous, column-major, pitched, or an
/// arbitrary-stride base, sliced with steps and offsets, its axes permuted (transposes).
pub fn place(r: &mut Rng, dims: &[usize], elem: usize) -> Layout {
    let n = dims.len();
    let mut perm: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        perm.swap(i, r.below(i + 1));
    }
    let big = dims.iter().product::<usize>() * elem > (1 << 20);
    let step: Vec<usize> = (0..n)
        .map(|_| {
            if big || r.chance(2, 3) {
                1
            } else {
                r.range(2, 3)
            }
        })
        .collect();
    let start: Vec<usize> = (0..n)
        .map(|_| if r.chance(1, 2) { 0 } else { r.range(1, 3) })
        .collect();
    let base_dims: Vec<usize> = (0..n)
        .map(|i| start[i] + (dims[perm[i]] - 1) * step[i] + 1 + usize::from(r.chance(1, 3)))
        .collect();
    let base = match r.below(4) {
        0 => Layout::contiguous(&base_dims, elem),
        1 => Layout::column_major(&base_dims, elem),
        2 => Layout::pitched(
            &base_dims,
            elem,
            base_dims[n - 1] * elem + r.below(3) * 64 + r.below(9),
        ),
        _ => {
            // Dense in a random axis order, with gaps between dims.
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                order.swap(i, r.below(i + 1));
            }
            let mut strides = vec![0; n];
            let mut s = elem;
            for &a in order.iter().rev() {
                strides[a] = s;
                s = s * base_dims[a] + r.below(2) * elem;
            }
            Layout::with_byte_strides(&base_dims, &strides, elem)
        }
    }
    .expect("base layout");
    let mut l = base
        .with_offset(r.below(3) * elem + r.below(2))
        .expect("offset");
    for i in 0..n {
        l = l
            .slice(
                i,
                start[i]..start[i] + (dims[perm[i]] - 1) * step[i] + 1,
                step[i],
            )
            .expect("slice");
    }
    let mut inv = vec![0; n];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    let l = l.permute(&inv).expect("permute");
    assert_eq!(l.dims(), dims);
    l
}

/// Dims, strides, element size and offset, for failure messages.
pub fn fmt_layout(l: &Layout) -> String {
    format!(
        "dims {:?} strides {:?} elem {} offset {}",
        l.dims(),
        l.strides(),
        l.elem_size(),
        l.offset()
    )
}
