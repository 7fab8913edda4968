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

/// The buffers kept, pinned and pageable.
static KEPT: Mutex<Vec<TensorBuffer>> = Mutex::new(Vec::new());

fn kept() -> MutexGuard<'static, Vec<TensorBuffer>> {
    // A panic while holding the lock left a plain list: still usable.
    KEPT.lock().unwrap_or_else(|p| p.into_inner())
}

/// The smallest kept buffer of `kind` of at least `len` bytes, taken out of the list.
pub(super) fn take(kind: MemKind, len: usize) -> Option<TensorBuffer> {
    let mut list = kept();
    let i = (0..list.len())
        .filter(|&i| list[i].raw().kind == kind && list[i].raw().len >= len)
        .min_by_key(|&i| list[i].raw().len)?;
    Some(list.swap_remove(i))
}

/// `n` buffers of `kind` of at least `len` bytes each, kept ones first, the rest made by
/// `make`. Errors: `make`'s.
pub(super) fn take_or_make<E>(
    kind: MemKind,
    len: usize,
    n: usize,
    mut make: impl FnMut() -> Result<TensorBuffer, E>,
) -> Result<Vec<TensorBuffer>, E> {
    (0..n)
        .map(|_| take(kind, len).map_or_else(&mut make, Ok))
        .collect()
}

/// Keeps host buffers for a later snapshot (a device buffer is dropped: snapshots are host
/// memory).
pub(super) fn keep(bufs: impl IntoIterator<Item = TensorBuffer>) {
    let host: Vec<TensorBuffer> = bufs
        .into_iter()
        .filter(|b| !matches!(b, TensorBuffer::Device(_)))
        .collect();
    kept().extend(host);
}

/// Frees every kept buffer; returns their bytes.
pub(super) fn release() -> u64 {
    let gone = std::mem::take(&mut *kept());
    gone.iter().map(|b| b.raw().len as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the list is the process's, and the crate's other tests never keep memory.
    #[test]
    fn the_smallest_fitting_buffer_of_the_kind_is_taken_and_release_frees_all() {
        release();
        let page = |n| TensorBuffer::new(MemKind::Pageable, n).expect("host memory");
        keep([page(4096), page(1 << 20), page(65536)]);
        assert!(take(MemKind::Pinned, 1).is_none(), "no pinned buffer kept");
        assert!(
            take(MemKind::Pageable, 2 << 20).is_none(),
            "none large enough"
        );
        let got = take(MemKind::Pageable, 5000).expect("the 64 KiB one fits");
        assert_eq!(got.raw().len, 65536);
        let two = take_or_make(MemKind::Pageable, 4096, 2, || -> Result<_, ()> {
            Ok(page(8192))
        })
        .expect("made");
        let mut lens: Vec<usize> = two.iter().map(|b| b.raw().len).collect();
        lens.sort_unstable();
        assert_eq!(lens, [4096, 1 << 20], "both kept ones before a new one");
        keep(two);
        assert_eq!(release(), 4096 + (1 << 20));
        assert_eq!(release(), 0);
        snapshot_saves_keep_and_reuse_their_memory();
    }

    /// Snapshot saves through the list (here: the list is the process's, so in the one test).
    fn snapshot_saves_keep_and_reuse_their_memory() {
        use crate::checkpoint::{Checkpoint, Dtype, SaveOptions, SaveTensor};
        use crate::file::{FileConfig, FileEngine};
        use std::sync::Arc;
        let dir = tempfile::tempdir().expect("a scratch folder");
        let engine = Arc::new(FileEngine::new(FileConfig::new().threads(2)).expect("engine"));
        let data: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
        let shape = [data.len()];
        let tensors = [SaveTensor::new("w", Dtype::U8, &shape, &data)];
        let save = |opts: SaveOptions| {
            let path = dir.path().join("w.safetensors");
            Checkpoint::snapshot_save(Arc::clone(&engine), &path, &tensors, opts)
                .expect("started")
                .join()
                .expect("the writing thread")
                .expect("written");
            let back = std::fs::read(&path).expect("the file");
            assert_eq!(
                &back[back.len() - data.len()..],
                &data[..],
                "the bytes in the file"
            );
        };
        // Within the bound: the snapshot's buffer is kept, and the next snapshot takes it.
        save(SaveOptions::new().keep_snapshot(true));
        let snap = Checkpoint::snapshot(&engine, &tensors).expect("snapshot");
        assert_eq!(snap.report().allocations, 0, "the kept buffer was taken");
        drop(snap);
        assert_eq!(release(), 0, "a plain snapshot does not give it back");
        // Without the option, what is kept is freed and nothing new is kept.
        save(SaveOptions::new().keep_snapshot(true));
        save(SaveOptions::new());
        assert_eq!(release(), 0, "freed by the save without keep_snapshot");
        // Streamed (the bound below the checkpoint): the windows are kept. One may be freed
        // instead when the writer hands it back in the instant the copying side lets go of
        // its windows (memory not reused, nothing wrong), so at least one of the two.
        let bound = 1 << 20;
        save(SaveOptions::new().keep_snapshot(true).snapshot_bytes(bound));
        let windows = release();
        assert!(
            (bound / 2..=bound).contains(&windows),
            "kept {windows} bytes of windows"
        );
    }
}
