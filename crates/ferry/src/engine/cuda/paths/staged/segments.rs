//! Staged segment lists: many runs of pageable host memory to a device, or the reverse. The
//! list's bytes are packed, in list order, into one stream cut into ring-sized chunks (a
//! segment may span chunks, a chunk may hold thousands of segments); the workers gather the
//! runs into a slot in parallel (host -> device) or scatter a slot's bytes out to the runs
//! (device -> host), and each chunk moves in one large DMA. The device side of a chunk is its
//! runs with adjacent ones merged: a few (or long ones) are one DMA each straight between the
//! slot and the device; many short ones go through a device scratch chunk and the gatherer's
//! device-side scatter (host -> device) or gather (device -> host), as
//! [`route::staged_scatters`] decides.
//!
//! [`Packing`] is the arithmetic (pure, tested on the CPU); [`SegStaging`] the pipeline's view
//! of one copy.

use super::chunk::add;
use super::pipeline::{dma, Chunks, SyncPtr};
use super::Direction;
use super::StagedError;
use crate::engine::cuda::paths::gather::{Gatherer, Segment, Strategy};
use crate::engine::cuda::route;
use crate::staging::copy::copy_bytes;
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// Workers split a chunk at multiples of this many bytes (no two share a cache line or page of
/// the slot).
const PART_ALIGN: u64 = 4096;

/// Where a segment list's bytes lie once packed: segment `i` occupies
/// `starts[i] .. starts[i + 1]` of the packed stream, which is cut into chunks of `chunk` bytes.
#[derive(Debug)]
pub(super) struct Packing {
    starts: Vec<u64>,
    chunk: u64,
}

/// The part of one segment inside a packed byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    /// Index of the segment in the list.
    pub(super) seg: usize,
    /// Offset of the piece in the segment.
    pub(super) at: u64,
    /// Offset of the piece in the packed stream.
    pub(super) packed: u64,
    /// Bytes.
    pub(super) len: u64,
}

/// One device-side run of a chunk: `len` bytes at device offset `dev`, at offset `at` of the
/// chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Run {
    /// Offset in the device buffer.
    pub(super) dev: u64,
    /// Offset in the chunk (the slot).
    pub(super) at: u64,
    /// Bytes.
    pub(super) len: u64,
}

impl Packing {
    /// The packing of `segs` into chunks of `chunk` bytes (at least 1).
    pub(super) fn new(segs: &[Segment], chunk: usize) -> Packing {
        let mut starts = Vec::with_capacity(segs.len() + 1);
        let mut at = 0u64;
        starts.push(0);
        for s in segs {
            at = at.saturating_add(s.len);
            starts.push(at);
        }
        Packing {
            starts,
            chunk: chunk.max(1) as u64,
        }
    }
    /// Bytes of the whole list.
    pub(super) fn total(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }
    /// How many chunks.
    pub(super) fn count(&self) -> usize {
        self.total().div_ceil(self.chunk) as usize
    }
    /// The packed byte range of chunk `k`.
    pub(super) fn chunk(&self, k: usize) -> (u64, u64) {
        let lo = (k as u64).saturating_mul(self.chunk).min(self.total());
        (lo, lo.saturating_add(self.chunk).min(self.total()))
    }
    /// The packed byte range of part `i` of `t` of chunk `k`: the chunk split at multiples of
    /// [`PART_ALIGN`] bytes into `t` parts (trailing ones may be empty).
    pub(super) fn part(&self, k: usize, i: usize, t: usize) -> (u64, u64) {
        let (lo, hi) = self.chunk(k);
        let len = hi - lo;
        let per = len.div_ceil(t.max(1) as u64).div_ceil(PART_ALIGN) * PART_ALIGN;
        let a = (i as u64).saturating_mul(per).min(len);
        let b = (i as u64 + 1).saturating_mul(per).min(len);
        (lo + a, lo + b)
    }
    /// Calls `f` with every non-empty piece of a segment inside the packed range `lo..hi`, in
    /// list order.
    pub(super) fn pieces(&self, lo: u64, hi: u64, mut f: impl FnMut(Piece)) {
        if lo >= hi || self.starts.len() < 2 {
            return;
        }
        // The last segment starting at or before `lo` (empty segments before it skipped).
        let mut i = self.starts.partition_point(|&s| s <= lo).saturating_sub(1);
        while i + 1 < self.starts.len() && self.starts[i] < hi {
            let (s, e) = (self.starts[i].max(lo), self.starts[i + 1].min(hi));
            if s < e {
                f(Piece {
                    seg: i,
                    at: s - self.starts[i],
                    packed: s,
                    len: e - s,
                });
            }
            i += 1;
        }
    }
    /// The device-side runs of chunk `k`, adjacent pieces merged; `dev_off` gives a segment's
    /// offset on the device side.
    pub(super) fn runs(
        &self,
        segs: &[Segment],
        k: usize,
        dev_off: impl Fn(&Segment) -> u64,
    ) -> Vec<Run> {
        let (lo, hi) = self.chunk(k);
        let mut runs: Vec<Run> = Vec::new();
        self.pieces(lo, hi, |p| {
            let dev = dev_off(&segs[p.seg]) + p.at;
            match runs.last_mut() {
                Some(r) if r.dev + r.len == dev => r.len += p.len,
                _ => runs.push(Run {
                    dev,
                    at: p.packed - lo,
                    len: p.len,
                }),
            }
        });
        runs
    }
}

/// One staged segment-list copy in flight, as the pipeline drives it.
pub(super) struct SegStaging<'a> {
    pub(super) segs: &'a [Segment],
    pub(super) pack: &'a Packing,
    pub(super) dir: Direction,
    /// The device buffer and its length.
    pub(super) dev: u64,
    pub(super) dev_len: usize,
    /// The host buffer.
    pub(super) host: SyncPtr,
    pub(super) stream: &'a Arc<CudaStream>,
    /// The gatherer and one device scratch chunk per ring slot (of `scratch_len` bytes), where
    /// some chunk scatters on the device.
    pub(super) scatter: Option<(&'a Gatherer, &'a [u64])>,
    pub(super) scratch_len: usize,
}

impl SegStaging<'_> {
    /// A segment's offset in the host buffer.
    fn host_off(&self, s: &Segment) -> u64 {
        match self.dir {
            Direction::HostToDevice => s.src_off,
            Direction::DeviceToHost => s.dst_off,
        }
    }
}

/// How many runs the device side of `segs` makes in all (list order, adjacent segments merged,
/// empty ones skipped), ignoring chunk edges: what decides whether a copy may need the device
/// scratch at all.
pub(super) fn count_runs(segs: &[Segment], dev_off: impl Fn(&Segment) -> u64) -> usize {
    let mut n = 0;
    let mut end = None;
    for s in segs.iter().filter(|s| s.len > 0) {
        let d = dev_off(s);
        if end != Some(d) {
            n += 1;
        }
        end = Some(d + s.len);
    }
    n
}

/// A segment's offset on the device side of a copy going `dir`.
pub(super) fn dev_off(dir: Direction) -> impl Fn(&Segment) -> u64 {
    move |s| match dir {
        Direction::HostToDevice => s.dst_off,
        Direction::DeviceToHost => s.src_off,
    }
}

impl Chunks for SegStaging<'_> {
    fn count(&self) -> usize {
        self.pack.count()
    }
    fn bytes(&self) -> usize {
        usize::try_from(self.pack.total()).unwrap_or(usize::MAX)
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
    fn part(&self, k: usize, slot: SyncPtr, to_slot: bool, i: usize, t: usize, nt: bool) {
        let (lo, _) = self.pack.chunk(k);
        let (a, b) = self.pack.part(k, i, t);
        self.pack.pieces(a, b, |p| {
            let h = self
                .host
                .at((self.host_off(&self.segs[p.seg]) + p.at) as usize);
            let s = slot.at((p.packed - lo) as usize);
            let len = p.len as usize;
            // SAFETY: the piece lies in its segment, inside the host buffer (checked by
            // `Stager::copy_segments`, valid by its contract), and in the chunk's bytes of the
            // slot; the parts of one chunk are disjoint packed ranges, so disjoint bytes of both.
            unsafe {
                if to_slot {
                    copy_bytes(h, s, len, nt)
                } else {
                    copy_bytes(s, h, len, nt)
                }
            }
        });
    }
    unsafe fn device_side(
        &self,
        k: usize,
        slot: usize,
        ptr: *mut u8,
        h2d: bool,
    ) -> Result<(), StagedError> {
        let (lo, hi) = self.pack.chunk(k);
        let bytes = hi - lo;
        // Worked out here, per chunk, while the workers fill the next ones.
        let runs = self.pack.runs(self.segs, k, dev_off(self.dir));
        let cs = self.stream.cu_stream();
        let one = |dev: u64, host: *mut u8, len: usize| -> Result<(), StagedError> {
            // SAFETY: `host` is `len` bytes of the pinned slot, `dev` `len` bytes of the device
            // buffer (the runs were checked inside it) or of the slot's device scratch, valid
            // by this function's contract.
            unsafe { dma(cs, dev, host, len, h2d) }
        };
        let scatter = match self.scatter {
            Some((g, scratch)) if route::staged_scatters(runs.len(), bytes) => {
                scratch.get(slot).map(|&sc| (g, sc))
            }
            _ => None,
        };
        let Some((g, sc)) = scatter else {
            for r in &runs {
                one(
                    add(self.dev, r.dev as usize)?,
                    ptr.wrapping_add(r.at as usize),
                    r.len as usize,
                )?;
            }
            return Ok(());
        };
        // Through the slot's device scratch: the whole chunk in one DMA, the runs moved
        // between the scratch and the device buffer by the gatherer, in stream order.
        let list: Vec<Segment> = runs
            .iter()
            .map(|r| {
                if h2d {
                    Segment::new(r.dev, r.at, r.len)
                } else {
                    Segment::new(r.at, r.dev, r.len)
                }
            })
            .collect();
        let (dev, dev_len, len) = (self.dev, self.dev_len, self.scratch_len);
        if h2d {
            one(sc, ptr, bytes as usize)?;
            // SAFETY: the scratch chunk is this slot's, untouched until the slot's event
            // (recorded after this call) completes; the device buffer is valid (contract) and
            // the runs inside it and the chunk (checked); both of this stream's context.
            unsafe { g.copy(self.stream, dev, dev_len, sc, len, &list, Strategy::Auto) }?;
        } else {
            // SAFETY: as above, the runs packed from the device buffer into the scratch.
            unsafe { g.copy(self.stream, sc, len, dev, dev_len, &list, Strategy::Auto) }?;
            one(sc, ptr, bytes as usize)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{count_runs, dev_off, Packing, Piece, Run};
    use crate::engine::cuda::paths::gather::Segment;
    use crate::engine::cuda::paths::staged::Direction;

    fn lens(l: &[u64]) -> Vec<Segment> {
        let mut at = 0;
        l.iter()
            .map(|&n| {
                let s = Segment::new(at, 1000 + at * 3, n);
                at += n;
                s
            })
            .collect()
    }

    fn all(p: &Packing, lo: u64, hi: u64) -> Vec<Piece> {
        let mut v = Vec::new();
        p.pieces(lo, hi, |x| v.push(x));
        v
    }

    #[test]
    fn runs_are_packed_in_list_order_across_chunk_boundaries() {
        // 3 + 0 + 10 + 1 bytes in chunks of 4: the 10-byte segment spans three chunks.
        let segs = lens(&[3, 0, 10, 1]);
        let p = Packing::new(&segs, 4);
        assert_eq!(p.total(), 14);
        assert_eq!(p.count(), 4);
        assert_eq!(p.chunk(3), (12, 14)); // ragged last chunk
        let c0 = all(&p, 0, 4);
        assert_eq!(
            c0,
            [
                Piece {
                    seg: 0,
                    at: 0,
                    packed: 0,
                    len: 3
                },
                Piece {
                    seg: 2,
                    at: 0,
                    packed: 3,
                    len: 1
                },
            ]
        );
        assert_eq!(
            all(&p, 4, 8),
            [Piece {
                seg: 2,
                at: 1,
                packed: 4,
                len: 4
            }]
        );
        assert_eq!(
            all(&p, 12, 14),
            [
                Piece {
                    seg: 2,
                    at: 9,
                    packed: 12,
                    len: 1
                },
                Piece {
                    seg: 3,
                    at: 0,
                    packed: 13,
                    len: 1
                },
            ]
        );
        // Every byte once, in order.
        let mut next = 0;
        for k in 0..p.count() {
            let (lo, hi) = p.chunk(k);
            for x in all(&p, lo, hi) {
                assert_eq!(x.packed, next);
                next += x.len;
            }
        }
        assert_eq!(next, 14);
    }

    #[test]
    fn a_run_larger_than_many_chunks_is_cut_into_chunk_pieces() {
        let segs = lens(&[1, 100 << 20, 1]);
        let p = Packing::new(&segs, 16 << 20);
        assert_eq!(p.count(), 7);
        let mid = all(&p, 16 << 20, 32 << 20);
        assert_eq!(
            mid,
            [Piece {
                seg: 1,
                at: (16 << 20) - 1,
                packed: 16 << 20,
                len: 16 << 20
            }]
        );
        let last = all(&p, 96 << 20, (100 << 20) + 2);
        assert_eq!(last.len(), 2);
        assert_eq!(
            last[1],
            Piece {
                seg: 2,
                at: 0,
                packed: (100 << 20) + 1,
                len: 1
            }
        );
    }

    #[test]
    fn empty_lists_and_empty_segments_make_no_chunks() {
        assert_eq!(Packing::new(&[], 4096).count(), 0);
        let p = Packing::new(&lens(&[0, 0]), 4096);
        assert_eq!(p.count(), 0);
        assert!(all(&p, 0, 0).is_empty());
    }

    #[test]
    fn parts_split_a_chunk_at_4_kib_and_cover_it() {
        let p = Packing::new(&lens(&[10_000, 50_000]), 40_000);
        assert_eq!(p.count(), 2);
        for k in 0..2 {
            for t in [1, 3, 7, 12, 64] {
                let (lo, hi) = p.chunk(k);
                let mut at = lo;
                for i in 0..t {
                    let (a, b) = p.part(k, i, t);
                    assert_eq!(a, at, "chunk {k} part {i} of {t}");
                    assert!(b >= a && b <= hi);
                    assert!(b == hi || (b - lo) % 4096 == 0);
                    at = b;
                }
                assert_eq!(at, hi, "chunk {k}, {t} parts cover it");
            }
        }
    }

    #[test]
    fn whole_list_runs_count_merged_segments() {
        let h2d = dev_off(Direction::HostToDevice);
        assert_eq!(count_runs(&lens(&[4096; 1000]), &h2d), 1);
        assert_eq!(count_runs(&[], &h2d), 0);
        let gaps = [
            Segment::new(0, 0, 4),
            Segment::new(4, 9, 0), // empty: skipped
            Segment::new(4, 9, 2),
            Segment::new(7, 0, 1), // a gap
            Segment::new(0, 0, 1), // backwards
        ];
        assert_eq!(count_runs(&gaps, &h2d), 3);
        // Device -> host: the sources are the device side.
        assert_eq!(count_runs(&gaps, dev_off(Direction::DeviceToHost)), 4);
    }

    #[test]
    fn device_runs_merge_adjacent_segments() {
        // Destinations contiguous (as the bench's list): one run per chunk.
        let segs = lens(&[4096; 10]);
        let p = Packing::new(&segs, 16384);
        let h2d = dev_off(Direction::HostToDevice);
        assert_eq!(
            p.runs(&segs, 0, &h2d),
            [Run {
                dev: 0,
                at: 0,
                len: 16384
            }]
        );
        assert_eq!(
            p.runs(&segs, 2, &h2d),
            [Run {
                dev: 32768,
                at: 0,
                len: 8192
            }]
        );
        // Device -> host: the device side is the source, 3 bytes apart per byte: no merging.
        let d2h = dev_off(Direction::DeviceToHost);
        let r = p.runs(&segs, 0, &d2h);
        assert_eq!(r.len(), 4);
        assert_eq!(
            r[1],
            Run {
                dev: 1000 + 4096 * 3,
                at: 4096,
                len: 4096
            }
        );
        // Reversed destinations do not merge; a segment cut by the chunk edge keeps its offset.
        let rev: Vec<Segment> = (0..3u64)
            .map(|i| Segment::new((2 - i) * 6, i * 6, 6))
            .collect();
        let p = Packing::new(&rev, 8);
        assert_eq!(
            p.runs(&rev, 0, &h2d),
            [
                Run {
                    dev: 12,
                    at: 0,
                    len: 6
                },
                Run {
                    dev: 6,
                    at: 6,
                    len: 2
                }
            ]
        );
        assert_eq!(
            p.runs(&rev, 1, &h2d),
            [
                Run {
                    dev: 8,
                    at: 0,
                    len: 4
                },
                Run {
                    dev: 0,
                    at: 4,
                    len: 4
                }
            ]
        );
    }
}
