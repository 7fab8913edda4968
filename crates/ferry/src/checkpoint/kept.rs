//! Host memory of finished snapshots, kept for the next one ([`SaveOptions::keep_snapshot`]):
//! a training loop that saves every N steps pays `cuMemHostAlloc` and the zeroing of its
//! pinned snapshot once, not at every save (on the H100 host a fresh 9 GB pinned snapshot
//! costs seconds; the copy into kept memory runs at the link's rate). One list for the
//! process: pinned buffers are page-locked for every context (`PORTABLE`), so any GPU's engine
//! copies into them at full speed.
//!
//! [`SaveOptions::keep_snapshot`]: super::SaveOptions::keep_snapshot

use super::TensorBuffer;
use crate::memory::{MemKind, Memory};
use std::sync::{Mutex, MutexGuard};

/// The buffers kept, pinned and pageable, and how many times they were released.
struct Kept {
    bufs: Vec<TensorBuffer>,
    /// Bumped by [`release`]: a save that started before a release keeps nothing after it.
    generation: u64,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    bufs: Vec::new(),
    generation: 0,
});

fn kept() -> MutexGuard<'static, Kept> {
    // A panic while holding the lock left a plain list: still usable.
    KEPT.lock().unwrap_or_else(|p| p.into_inner())
}

/// The current generation: what a save passes to [`keep`] at its end.
pub(super) fn generation() -> u64 {
    kept().generation
}

/// The smallest kept buffer of `kind` of `len` to `max` bytes, taken out of the list. On a
/// miss, the kept buffers of `kind` are freed: none fits this save's shape (a first save
/// smaller than the next, another bound), and the memory this save allocates is kept in their
/// place, so the list never holds more than the last saves used.
pub(super) fn take(kind: MemKind, len: usize, max: usize) -> Option<TensorBuffer> {
    let mut k = kept();
    let fits = |b: &TensorBuffer| b.raw().kind == kind && (len..=max).contains(&b.raw().len);
    match (0..k.bufs.len())
        .filter(|&i| fits(&k.bufs[i]))
        .min_by_key(|&i| k.bufs[i].raw().len)
    {
        Some(i) => Some(k.bufs.swap_remove(i)),
        None => {
            k.bufs.retain(|b| b.raw().kind != kind);
            None
        }
    }
}

/// `n` buffers of `kind` of exactly-fitting size (`len` bytes, up to `max`), kept ones first,
/// the rest made by `make`. Errors: `make`'s.
pub(super) fn take_or_make<E>(
    kind: MemKind,
    len: usize,
    max: usize,
    n: usize,
    mut make: impl FnMut() -> Result<TensorBuffer, E>,
) -> Result<Vec<TensorBuffer>, E> {
    (0..n)
        .map(|_| take(kind, len, max).map_or_else(&mut make, Ok))
        .collect()
}

/// Keeps host buffers for a later snapshot, unless the list was released since `since` (a
/// [`generation`] read when the save started: a save without the option freed the memory
/// meanwhile). A device buffer is dropped: snapshots are host memory.
pub(super) fn keep(bufs: impl IntoIterator<Item = TensorBuffer>, since: u64) {
    let host: Vec<TensorBuffer> = bufs
        .into_iter()
        .filter(|b| !matches!(b, TensorBuffer::Device(_)))
        .collect();
    let mut k = kept();
    if k.generation == since {
        k.bufs.extend(host);
    }
}

/// Frees every kept buffer, and whatever saves still writing would keep; returns the bytes
/// freed.
pub(super) fn release() -> u64 {
    let gone = {
        let mut k = kept();
        k.generation += 1;
        std::mem::take(&mut k.bufs)
    };
    gone.iter().map(|b| b.raw().len as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the list is the process's. No other unit test of the crate calls a snapshot
    // (`Checkpoint::snapshot`, `snapshot_save`), which is what reads or releases the list; the
    // snapshot saves below are in here for that reason, though they sit above this module.
    #[test]
    fn the_smallest_fitting_buffer_of_the_kind_is_taken_and_release_frees_all() {
        release();
        let page = |n| TensorBuffer::new(MemKind::Pageable, n).expect("host memory");
        let gen = generation();
        keep([page(4096), page(1 << 20), page(65536)], gen);
        assert!(
            take(MemKind::Pinned, 1, usize::MAX).is_none(),
            "no pinned buffer kept"
        );
        let got = take(MemKind::Pageable, 5000, usize::MAX).expect("the 64 KiB one fits");
        assert_eq!(got.raw().len, 65536);
        assert!(
            take(MemKind::Pageable, 8192, 65536).is_none(),
            "the 1 MiB one is above the most asked"
        );
        assert_eq!(release(), 0, "a miss freed the buffers of its kind");
        keep([page(4096), page(4096), page(1 << 20)], generation());
        let two = take_or_make(MemKind::Pageable, 4096, 4096, 2, || -> Result<_, ()> {
            Ok(page(8192))
        })
        .expect("made");
        let lens: Vec<usize> = two.iter().map(|b| b.raw().len).collect();
        assert_eq!(lens, [4096, 4096], "both kept ones, no new one");
        // A save that started before a release keeps nothing after it.
        let before = generation();
        assert_eq!(release(), 1 << 20);
        keep(two, before);
        assert_eq!(release(), 0, "kept by a save older than the release: freed");
        snapshot_saves_keep_and_reuse_their_memory();
    }

    /// Snapshot saves through the list, each of other bytes than the one before (a kept
    /// buffer holds the last save's bytes).
    fn snapshot_saves_keep_and_reuse_their_memory() {
        use crate::checkpoint::{Checkpoint, Dtype, SaveOptions, SaveTensor};
        use crate::file::{FileConfig, FileEngine};
        use std::sync::Arc;
        let dir = tempfile::tempdir().expect("a scratch folder");
        let engine = Arc::new(FileEngine::new(FileConfig::new().threads(2)).expect("engine"));
        let len = 3 << 20;
        let bytes =
            |seed: usize| -> Vec<u8> { (0..len).map(|i| ((i + seed) % 251) as u8).collect() };
        let shape = [len];
        let save = |opts: SaveOptions, seed: usize| {
            let data = bytes(seed);
            let tensors = [SaveTensor::new("w", Dtype::U8, &shape, &data)];
            let path = dir.path().join("w.safetensors");
            Checkpoint::snapshot_save(Arc::clone(&engine), &path, &tensors, opts)
                .expect("started")
                .join()
                .expect("the writing thread")
                .expect("written");
            let back = std::fs::read(&path).expect("the file");
            assert_eq!(
                &back[back.len() - len..],
                &data[..],
                "save {seed}: the file's bytes"
            );
        };
        // Within the bound: the snapshot's buffer is kept, and the next snapshot takes it.
        save(SaveOptions::new().keep_snapshot(true), 1);
        save(SaveOptions::new().keep_snapshot(true), 2);
        let data = bytes(3);
        let tensors = [SaveTensor::new("w", Dtype::U8, &shape, &data)];
        let snap = Checkpoint::snapshot(&engine, &tensors).expect("snapshot");
        assert_eq!(snap.report().allocations, 0, "the kept buffer was taken");
        assert_eq!(
            snap.buffers()[0].host_bytes().map(|b| &b[..len]),
            Some(&data[..])
        );
        drop(snap);
        assert_eq!(release(), 0, "a plain snapshot does not give it back");
        // Without the option, what is kept is freed and nothing new is kept.
        save(SaveOptions::new().keep_snapshot(true), 4);
        save(SaveOptions::new(), 5);
        assert_eq!(release(), 0, "freed by the save without keep_snapshot");
        // Streamed (the bound below the checkpoint): both windows are kept, and the next
        // streamed save takes them.
        let bound = 1 << 20;
        save(
            SaveOptions::new().keep_snapshot(true).snapshot_bytes(bound),
            6,
        );
        save(
            SaveOptions::new().keep_snapshot(true).snapshot_bytes(bound),
            7,
        );
        assert_eq!(release(), bound, "the two windows of half the bound");
    }
}
