//! Chunk arithmetic of a staged copy: which bytes of a plan each ring slot carries, and where
//! each run lies on the host and on the device. Pure arithmetic, no driver.

use super::Direction;
use super::StagedError;
use crate::Plan;

/// The host and device sides of a plan, whichever way it goes.
#[derive(Clone, Copy)]
pub(super) struct Sides<'a> {
    pub(super) plan: &'a Plan,
    pub(super) dir: Direction,
}

impl Sides<'_> {
    /// (device offset, host offset) of run `i`, in `for_each_run` order.
    pub(super) fn run_at(&self, i: usize) -> (usize, usize) {
        let p = self.plan;
        let (mut d, mut s) = (p.dst_offset(), p.src_offset());
        let mut rest = i;
        for k in (0..p.counts().len()).rev() {
            let c = p.counts()[k];
            let j = rest % c;
            rest /= c;
            d += j * p.dst_strides()[k];
            s += j * p.src_strides()[k];
        }
        match self.dir {
            Direction::HostToDevice => (d, s),
            Direction::DeviceToHost => (s, d),
        }
    }
    /// The device-side stride and extent of the innermost outer dim (None for a contiguous plan).
    pub(super) fn dev_inner(&self) -> Option<(usize, usize)> {
        let p = self.plan;
        let n = p.counts().len();
        if n == 0 {
            return None;
        }
        let s = match self.dir {
            Direction::HostToDevice => p.dst_strides()[n - 1],
            Direction::DeviceToHost => p.src_strides()[n - 1],
        };
        Some((s, p.counts()[n - 1]))
    }
}

/// One chunk of a staged copy.
#[derive(Clone, Copy, Debug)]
pub(super) enum Chunk {
    /// `len` bytes of run `run`, starting `at` bytes into it (runs of at least one chunk).
    Piece { run: usize, at: usize, len: usize },
    /// Whole runs `first..first+count`, packed in the slot (runs shorter than a chunk).
    Runs { first: usize, count: usize },
}

/// Cuts a plan into chunks of at most `chunk` bytes: pieces of runs longer than a chunk, or
/// groups of whole runs shorter than one.
pub(super) struct Chunker {
    pub(super) run: usize,
    runs: usize,
    chunk: usize,
    per_run: usize,
    runs_per_chunk: usize,
}

impl Chunker {
    /// Chunks of at most `chunk` bytes of `plan`.
    pub(super) fn new(plan: &Plan, chunk: usize) -> Chunker {
        let run = plan.run();
        let runs = plan.run_count();
        if run >= chunk {
            Chunker {
                run,
                runs,
                chunk,
                per_run: run.div_ceil(chunk),
                runs_per_chunk: 0,
            }
        } else {
            Chunker {
                run,
                runs,
                chunk,
                per_run: 0,
                runs_per_chunk: chunk / run.max(1),
            }
        }
    }
    /// How many chunks.
    pub(super) fn count(&self) -> usize {
        if self.run == 0 || self.runs == 0 {
            0
        } else if self.per_run > 0 {
            self.runs * self.per_run
        } else {
            self.runs.div_ceil(self.runs_per_chunk)
        }
    }
    /// Chunk `k` (`k < count()`).
    pub(super) fn get(&self, k: usize) -> Chunk {
        if let Some(run) = k.checked_div(self.per_run) {
            let piece = k % self.per_run;
            let at = piece * self.chunk;
            Chunk::Piece {
                run,
                at,
                len: self.chunk.min(self.run - at),
            }
        } else {
            let first = k * self.runs_per_chunk;
            Chunk::Runs {
                first,
                count: self.runs_per_chunk.min(self.runs - first),
            }
        }
    }
}

/// `base + off`, or [`StagedError::AddressOverflow`].
pub(super) fn add(base: u64, off: usize) -> Result<u64, StagedError> {
    base.checked_add(off as u64)
        .ok_or(StagedError::AddressOverflow { base, bytes: off })
}

#[cfg(test)]
mod tests {
    use super::{add, Chunk, Chunker, Sides};
    use crate::engine::cuda::paths::staged::Direction;
    use crate::{Layout, Plan};

    #[test]
    fn long_runs_are_cut_into_pieces() {
        let c = Chunker::new(&Plan::contiguous(0, 0, 10 << 20), 4 << 20);
        assert_eq!(c.count(), 3);
        assert!(matches!(c.get(0), Chunk::Piece { run: 0, at: 0, len } if len == 4 << 20));
        assert!(
            matches!(c.get(2), Chunk::Piece { run: 0, at, len } if at == 8 << 20 && len == 2 << 20)
        );
        assert_eq!(Chunker::new(&Plan::contiguous(0, 0, 0), 4096).count(), 0);
    }

    #[test]
    fn short_runs_are_packed_whole() {
        // 100 rows of 1000 bytes out of rows of 4096 (a 2-D plan), 4 rows per 4096-byte chunk.
        let src = Layout::contiguous(&[100, 4096], 1)
            .unwrap()
            .slice(1, 0..1000, 1)
            .unwrap();
        let dst = Layout::contiguous(&[100, 1000], 1).unwrap();
        let plan = Plan::new(&dst, &src).unwrap();
        let c = Chunker::new(&plan, 4096);
        assert_eq!(c.count(), 25);
        assert!(matches!(
            c.get(24),
            Chunk::Runs {
                first: 96,
                count: 4
            }
        ));
        // Device -> host: the source is the device side.
        let sides = Sides {
            plan: &plan,
            dir: Direction::DeviceToHost,
        };
        assert_eq!(sides.run_at(3), (3 * 4096, 3 * 1000));
        assert_eq!(sides.dev_inner(), Some((4096, 100)));
    }

    #[test]
    fn address_overflow_is_an_error() {
        assert_eq!(add(10, 5).unwrap(), 15);
        assert!(add(u64::MAX, 1).is_err());
    }
}
