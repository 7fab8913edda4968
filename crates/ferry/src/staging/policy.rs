//! The staging fill policy, one place for every user: how many workers a staged copy may use
//! by default ([`default_workers`]) and wakes ([`workers_for`]), how a queued fill is cut into pieces ([`FILL_PIECE`], [`fill_pieces`]),
//! and which fills move their lines out of the workers' private caches once copied
//! ([`demoted_fill`]). Whether the copy itself uses non-temporal stores is the engine's
//! staging setting (`StagingConfig::non_temporal`), handed to the copier and the filler as a
//! flag; the copy is `copy.rs`'s.

/// Bytes of one piece of a copy, at most: what a worker takes at a time. One piece is 25-35 us
/// of one core's copy (8-10 GB/s), against well under a microsecond to take it from the queue.
/// A 2 MiB bounce buffer (the bench's 64 MiB rows) is 8 such pieces: fewer than the 12 default
/// workers, so [`fill_pieces`] can cut a copy finer, into a multiple of the workers.
pub(crate) const FILL_PIECE: usize = 256 << 10;

/// Smallest piece [`fill_pieces`] cuts when it spreads a copy over the workers: a piece of a
/// few microseconds of copying still dwarfs the taking of it.
const MIN_SPREAD_PIECE: usize = 64 << 10;

/// How many pieces a copy of `len` bytes is cut into for `workers` workers: pieces of
/// [`FILL_PIECE`]; with `spread`, that count rounded up to a multiple of `workers` (pieces of
/// [`MIN_SPREAD_PIECE`] at least), so that every worker takes an equal part of a copy the queue
/// holds alone, such as a pipeline's first fill: a 2 MiB copy is 8 pieces of 256 KiB, which
/// leave 4 of 12 workers to the next copy while the first one waits for its slowest piece;
/// spread, 12 pieces of 172 KiB, one per worker. At least one piece.
pub(crate) fn fill_pieces(len: usize, workers: usize, spread: bool) -> usize {
    let pieces = len.div_ceil(FILL_PIECE).max(1);
    if !spread || workers <= 1 {
        return pieces;
    }
    let even = pieces.div_ceil(workers) * workers;
    even.min(len.div_ceil(MIN_SPREAD_PIECE)).max(pieces)
}

/// Bytes of later fills per fill worker after which a fill's lines have left the worker's
/// private caches (see [`demoted_fill`]): each byte filled passes about two bytes of lines
/// through the core (the source read, the destination written), so 1 MiB of fills cycles
/// 2 MiB, the L2 of a core of the H200 host's Xeon.
pub(crate) const EVICT_BYTES_PER_WORKER: usize = 1 << 20;

/// Whether the fill of the chunk of a contiguous pageable source that ends `end` bytes into a
/// `total`-byte run moves its lines out of the fill workers' private caches once copied
/// (the GPU pipeline's `BounceFill::demote_last`): the chunks after which fewer than `workers` x
/// [`EVICT_BYTES_PER_WORKER`] bytes of fills follow, the run's last ones.
///
/// Why: a DMA that reads host memory a core still holds modified in its private cache waits for
/// that core to give up each line. In the middle of a run the fills of the chunks after a chunk
/// push its lines out to the shared cache before its DMA reads them, and the DMA runs as fast
/// as from pinned memory (45-47 us a 2 MiB chunk on the H200 host, as the pinned source's); the
/// last chunks have too little filled after them, and their DMAs took 57-107 us (the traces of
/// runs 96-104, `bench/results/h200.md`). Demoted, they took 44-52 us (one 64). The run's first
/// chunk is read right after its fill too, but there it does not pay: demoting (or streaming)
/// its lines lengthens the fill the first DMA waits for by about what it shortens that DMA.
pub(crate) fn demoted_fill(end: usize, total: usize, workers: usize) -> bool {
    total.saturating_sub(end) < workers.saturating_mul(EVICT_BYTES_PER_WORKER)
}

/// The host copy workers a staged copy may use unless configured otherwise (the default of
/// the CUDA engine's `StagingConfig::threads`), and the count the GPU pipeline's automatic fill
/// threads start from (`PipelineConfig::effective_fill_threads`): three quarters of the cores,
/// 1 to 12 (12 on the 16-core H200 host), leaving the rest to the submitting thread and the
/// caller's program. Reads no environment.
pub(crate) fn default_workers() -> usize {
    default_workers_of(std::thread::available_parallelism().map_or(2, |n| n.get()))
}

/// [`default_workers`] on a machine of `cores` cores.
fn default_workers_of(cores: usize) -> usize {
    (cores * 3 / 4).clamp(1, 12)
}

/// Workers for a staged copy of `bytes`: one per 2 MiB, at least 4, at most the pool's. On the
/// H200 host (run 27, `ferry bench --test cuda-h2d-pageable`, staged / the driver's pageable
/// path) 12 workers gave 0.97x / 0.56x / 0.81x / 1.36x at 2 / 4 / 8 / 16 MiB, 4 workers 1.18x /
/// 1.18x / 1.34x / 1.46x; 256 MiB needs all 12 for its 45+ GB/s (4 workers: 30 GB/s, run 29).
/// With this choice and the pool waking workers 0..n (run 29): host to device 0.93-1.12x at
/// 2 MiB, 1.09-1.15x at 4-8 MiB, 48.8 GB/s at 256 MiB; device to host 1.5x at 1 MiB, 51 GB/s
/// at 256 MiB.
pub(crate) fn workers_for(pool: usize, bytes: usize) -> usize {
    (bytes / (2 << 20)).max(4).min(pool.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::staging::copy::piece;

    #[test]
    fn default_workers_are_three_quarters_of_the_cores_up_to_12() {
        let got: Vec<usize> = [1, 2, 4, 8, 16, 17, 64, 256]
            .map(default_workers_of)
            .to_vec();
        assert_eq!(got, [1, 1, 3, 6, 12, 12, 12, 12]);
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        assert!((1..=cores.min(12)).contains(&default_workers()));
    }

    #[test]
    fn the_last_fills_are_demoted() {
        let mib = 1 << 20;
        // 64 MiB in 2 MiB chunks, 8 workers: the four whose later fills are under 8 MiB.
        let demoted: Vec<usize> = (0..32)
            .filter(|&i| demoted_fill((i + 1) * 2 * mib, 64 * mib, 8))
            .collect();
        assert_eq!(demoted, [28, 29, 30, 31]);
        // 256 MiB in 8 MiB chunks, 12 workers: the last two.
        let demoted: Vec<usize> = (0..32)
            .filter(|&i| demoted_fill((i + 1) * 8 * mib, 256 * mib, 12))
            .collect();
        assert_eq!(demoted, [30, 31]);
        // One chunk; a chunk ending past the run's bytes; no workers.
        assert!(demoted_fill(mib, mib, 8));
        assert!(demoted_fill(9 * mib, 8 * mib, 8));
        assert!(!demoted_fill(mib, 64 * mib, 0));
    }

    #[test]
    fn spread_fills_give_every_worker_an_equal_part() {
        // The bench's chunks on 12 workers (the pipeline's fill workers on the GPU host until
        // they became 8): 8 and 32 pieces of 256 KiB, spread 12 and 36; small copies keep
        // pieces of 64 KiB or more.
        assert_eq!(fill_pieces(2 << 20, 12, false), 8);
        assert_eq!(fill_pieces(2 << 20, 12, true), 12);
        assert_eq!(fill_pieces(8 << 20, 12, false), 32);
        assert_eq!(fill_pieces(8 << 20, 12, true), 36);
        assert_eq!(fill_pieces(100 << 10, 12, true), 2);
        assert_eq!(fill_pieces(0, 12, true), 1);
        assert_eq!(fill_pieces(5 << 20, 1, true), 20);
        for workers in 1..=16 {
            for len in [
                1,
                4096,
                300_000,
                1 << 20,
                (2 << 20) + 12_345,
                8 << 20,
                33 << 20,
            ] {
                let (plain, spread) = (
                    fill_pieces(len, workers, false),
                    fill_pieces(len, workers, true),
                );
                assert!(spread >= plain, "{len} on {workers}: {spread} < {plain}");
                // The pieces cover the copy once (the last may be empty: 4 KiB rounding).
                let parts: Vec<_> = (0..spread).filter_map(|i| piece(len, spread, i)).collect();
                let mut next = 0;
                for &(at, l) in &parts {
                    assert_eq!(at, next, "{len} on {workers}");
                    next += l;
                }
                assert_eq!(next, len, "{len} on {workers}");
                if len >= workers * MIN_SPREAD_PIECE {
                    // Every worker has a piece of a copy queued alone, none over FILL_PIECE.
                    assert_eq!(spread % workers, 0, "{len} on {workers}: {spread} pieces");
                    assert!(parts.len() >= workers, "{len} on {workers}: {parts:?}");
                    assert!(
                        parts.iter().all(|p| p.1 <= FILL_PIECE),
                        "{len} on {workers}"
                    );
                }
            }
        }
    }
}
