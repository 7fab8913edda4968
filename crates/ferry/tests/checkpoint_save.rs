//! Saves that cannot or must not finish: destinations that are not files (a clear error naming
//! the destination and what is wrong, nothing created), saves stopped by
//! [`SaveOptions::interrupt`] (no partial file, the old file kept), sharded saves read
//! back through their index, and every writer ([`SaveOptions::writer`]: buffered, `O_DIRECT`,
//! and both at once) writing the reference writer's bytes.

use ferry::checkpoint::{
    self, Checkpoint, CheckpointError, Dtype, LoadOptions, SaveOptions, SaveTensor, Target, Writer,
};
use ferry::file::{FileConfig, FileEngine};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn engine() -> FileEngine {
    FileEngine::new(FileConfig::new().threads(2)).unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn one<'a>(bytes: &'a dyn ferry::Memory, shape: &'a [usize; 1]) -> [SaveTensor<'a>; 1] {
    [SaveTensor::new("w", Dtype::U8, shape, bytes)]
}

#[test]
fn a_destination_that_is_not_a_file_is_named_with_what_is_wrong() {
    let fe = engine();
    let d = tempfile::tempdir().unwrap();
    let data = vec![1u8; 4096];
    let shape = [data.len()];
    let t = one(&data, &shape);
    // A folder.
    let e = checkpoint::save(&fe, d.path(), &t, &SaveOptions::new()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, CheckpointError::Replace { .. }), "{e:?}");
    assert!(msg.contains(&d.path().display().to_string()), "{msg}");
    assert!(msg.contains("a directory"), "{msg}");
    assert!(!msg.contains("write of 0 bytes"), "{msg}");
    // A FIFO.
    let fifo = d.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = checkpoint::save(&fe, &fifo, &t, &SaveOptions::new()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("fifo") && msg.contains("FIFO"), "{msg}");
    // /proc/version: a file in a folder that takes no new file.
    if Path::new("/proc/version").exists() {
        let e = checkpoint::save(&fe, "/proc/version", &t, &SaveOptions::new()).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, CheckpointError::Replace { .. }), "{e:?}");
        assert!(msg.contains("/proc/version"), "{msg}");
        assert!(msg.contains("cannot create the temporary file"), "{msg}");
        assert!(msg.contains("the folder /proc"), "{msg}");
    }
    // A missing folder.
    let e = checkpoint::save(
        &fe,
        d.path().join("no/such.safetensors"),
        &t,
        &SaveOptions::new(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no/such.safetensors"), "{e}");
    // Nothing was created anywhere.
    assert_eq!(names(d.path()), ["fifo"]);
}

#[test]
fn an_interrupted_save_leaves_the_old_file_and_nothing_else() {
    let fe = engine();
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.safetensors");
    std::fs::write(&p, b"old").unwrap();
    // Three batches' worth of the buffered writer (the O_DIRECT writer's own test is
    // `an_interrupted_o_direct_save_...`): stopped before the second.
    let data = vec![7u8; 600 << 20];
    let shape = [data.len()];
    let asked = Arc::new(AtomicUsize::new(0));
    let a = asked.clone();
    let opts = SaveOptions::new()
        .direct(false)
        .interrupt(move || a.fetch_add(1, Ordering::SeqCst) >= 1);
    let e = checkpoint::save(&fe, &p, &one(&data, &shape), &opts).unwrap_err();
    assert!(matches!(e, CheckpointError::Interrupted { .. }), "{e:?}");
    assert!(e.to_string().contains("interrupted"), "{e}");
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    assert_eq!(std::fs::read(&p).unwrap(), b"old");
    assert_eq!(names(d.path()), ["m.safetensors"]);
    // Never asked to stop: saved, the interrupt asked once per batch and again at the end.
    let asked = Arc::new(AtomicUsize::new(0));
    let a = asked.clone();
    let opts = SaveOptions::new().direct(false).interrupt(move || {
        a.fetch_add(1, Ordering::SeqCst);
        false
    });
    let r = checkpoint::save(&fe, &p, &one(&data, &shape), &opts).unwrap();
    assert_eq!(r.files, 1);
    assert!(asked.load(Ordering::SeqCst) >= 3);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), r.bytes);
}

#[test]
fn a_sharded_save_writes_the_index_and_loads_back() {
    let fe = engine();
    let d = tempfile::tempdir().unwrap();
    let index = d.path().join("model.safetensors.index.json");
    // 40 bf16 tensors of 8 KiB .. 1 MiB, shards of at most 2 MiB.
    let data: Vec<Vec<u16>> = (0..40u16).map(|i| vec![i; 4096 << (i % 8)]).collect();
    let names_: Vec<String> = (0..40).map(|i| format!("layer.{i}.weight")).collect();
    let shapes: Vec<[usize; 1]> = data.iter().map(|v| [v.len()]).collect();
    let tensors: Vec<SaveTensor<'_>> = (0..40)
        .map(|i| SaveTensor::new(&names_[i], Dtype::BF16, &shapes[i], &data[i]))
        .collect();
    let opts = SaveOptions::new()
        .shard_bytes(2 << 20)
        .metadata("format", "pt");
    let r = checkpoint::save(&fe, &index, &tensors, &opts).unwrap();
    assert!(r.files > 1, "{r}");
    let all = names(d.path());
    assert_eq!(all.len(), r.files + 1);
    for i in 1..=r.files {
        let shard = format!("model-{i:05}-of-{:05}.safetensors", r.files);
        assert!(all.contains(&shard), "{all:?}");
        assert!(std::fs::metadata(d.path().join(&shard)).unwrap().len() <= (2 << 20) + 4096);
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    let total: usize = data.iter().map(|v| v.len() * 2).sum();
    assert_eq!(v["metadata"]["total_size"], total);
    assert_eq!(v["metadata"]["format"], "pt");
    assert_eq!(v["weight_map"].as_object().unwrap().len(), 40);
    // Loaded back through the index (and through the folder), every byte in place.
    let ck = checkpoint::load(&fe, &index, &LoadOptions::new(Target::Pageable)).unwrap();
    assert_eq!(ck.tensors().len(), 40);
    for (n, want) in names_.iter().zip(&data) {
        assert_eq!(
            ck.host(n).unwrap().bytes(),
            bytemuck::cast_slice::<u16, u8>(want),
            "{n}"
        );
    }
    // Saved again over itself from the loaded checkpoint: the same files.
    let again = ck.save(&fe, &index, &opts).unwrap();
    assert_eq!(again.files, r.files);
    assert_eq!(names(d.path()), all);
    // A bad index name is refused before anything is written.
    let e = checkpoint::save(
        &fe,
        d.path().join(".safetensors.index.json"),
        &tensors,
        &opts,
    )
    .unwrap_err();
    assert!(matches!(e, CheckpointError::Index { .. }), "{e:?}");
    assert_eq!(names(d.path()), all);
}

#[test]
fn a_snapshot_is_written_as_it_was_taken() {
    let fe = Arc::new(engine());
    let d = tempfile::tempdir().unwrap();
    let mut a = vec![3u8; 5 << 20];
    let b: Vec<u16> = (0..1000).collect();
    let snap = {
        let list = [
            SaveTensor::new("a", Dtype::U8, &[5 << 20], &a),
            SaveTensor::new("b", Dtype::BF16, &[10, 100], &b),
        ];
        Checkpoint::snapshot(&fe, &list).unwrap()
    };
    assert_eq!(snap.report().bytes, (5 << 20) + 2000);
    // The source changes after the snapshot: the file holds the snapshot's bytes.
    a.fill(9);
    let path = d.path().join("s.safetensors");
    let h = snap
        .save_in_background(fe.clone(), &path, SaveOptions::new().fsync(true))
        .unwrap();
    let r = h.join().unwrap().unwrap();
    assert_eq!(r.tensors, 2);
    let ck = checkpoint::load(&fe, &path, &LoadOptions::new(Target::Pageable)).unwrap();
    assert!(ck.host("a").unwrap().bytes().iter().all(|&x| x == 3));
    assert_eq!(
        ck.host("b").unwrap().bytes(),
        bytemuck::cast_slice::<u16, u8>(&b)
    );
    // Into a folder that cannot take it: the error comes back on the handle.
    let snap =
        Checkpoint::snapshot(&fe, &[SaveTensor::new("b", Dtype::BF16, &[1000], &b)]).unwrap();
    let h = snap.save_in_background(
        fe.clone(),
        d.path().join("no/such.safetensors"),
        SaveOptions::new(),
    );
    let e = h.unwrap().join().unwrap().unwrap_err();
    assert!(matches!(e, CheckpointError::Replace { .. }), "{e:?}");
    // A bad tensor is refused by the snapshot itself.
    let e = Checkpoint::snapshot(&fe, &[SaveTensor::new("b", Dtype::F32, &[3], &b)]).unwrap_err();
    assert!(matches!(e, CheckpointError::BadTensor { .. }), "{e:?}");
}

/// `n` bytes of a pattern that differs with `seed`.
/// U8 tensors of the given sizes, patterned from `seed + i`, named `{prefix}.{i}`.
struct U8s {
    data: Vec<Vec<u8>>,
    names: Vec<String>,
    shapes: Vec<[usize; 1]>,
}

impl U8s {
    fn new(sizes: &[usize], seed: u64, prefix: &str) -> U8s {
        U8s {
            data: (0..sizes.len())
                .map(|i| pattern(sizes[i], i as u64 + seed))
                .collect(),
            names: (0..sizes.len()).map(|i| format!("{prefix}.{i}")).collect(),
            shapes: sizes.iter().map(|&n| [n]).collect(),
        }
    }

    /// The reference writer's file of them (the `safetensors` crate's).
    fn reference(&self) -> Vec<u8> {
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = (0..self.data.len())
            .map(|i| {
                let v = safetensors::tensor::TensorView::new(
                    Dtype::U8,
                    vec![self.shapes[i][0]],
                    &self.data[i],
                );
                (self.names[i].clone(), v.unwrap())
            })
            .collect();
        safetensors::tensor::serialize(views, None).unwrap()
    }

    /// The tensors to save.
    fn list(&self) -> Vec<SaveTensor<'_>> {
        (0..self.data.len())
            .map(|i| SaveTensor::new(&self.names[i], Dtype::U8, &self.shapes[i], &self.data[i]))
            .collect()
    }
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    (0..n as u64)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97) >> 7) as u8)
        .collect()
}

#[test]
fn a_snapshot_over_its_memory_bound_streams_the_same_bytes() {
    let fe = Arc::new(engine());
    let d = tempfile::tempdir().unwrap();
    // 40 tensors from 1 KiB to 192 KiB (one of them over the bound), about 2.6 MiB in all.
    let sizes: Vec<usize> = (0..40)
        .map(|i| if i == 17 { 192 << 10 } else { 1024 << (i % 7) })
        .collect();
    let mut data: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i as u64))
        .collect();
    let want = data.clone();
    let tnames: Vec<String> = (0..40).map(|i| format!("layers.{i}.weight")).collect();
    let shapes: Vec<[usize; 1]> = sizes.iter().map(|&n| [n]).collect();
    let bound = 128 << 10;
    for dest in ["one.safetensors", "model.safetensors.index.json"] {
        let opts = SaveOptions::new()
            .metadata("format", "pt")
            .shard_bytes(256 << 10)
            .snapshot_bytes(bound);
        let path = d.path().join(format!("snap-{dest}"));
        let reference = d.path().join(format!("ref-{dest}"));
        let h = {
            let list: Vec<SaveTensor<'_>> = (0..40)
                .map(|i| SaveTensor::new(&tnames[i], Dtype::U8, &shapes[i], &data[i]))
                .collect();
            checkpoint::save(&fe, &reference, &list, &opts).unwrap();
            Checkpoint::snapshot_save(fe.clone(), &path, &list, opts.clone()).unwrap()
        };
        // The tensors change once the call returns: the file holds the bytes of the call.
        for t in data.iter_mut() {
            t.fill(0xee);
        }
        let r = h.join().unwrap().unwrap();
        assert!(r.snapshot_bytes > 0 && r.snapshot_bytes <= bound, "{r:?}");
        assert_eq!(r.tensors, 40);
        let (files, read) = if dest.ends_with(".json") {
            assert!(r.files > 1, "{r:?}");
            let ck = checkpoint::load(&fe, &path, &LoadOptions::new(Target::Pageable)).unwrap();
            for (n, w) in tnames.iter().zip(&want) {
                assert_eq!(ck.host(n).unwrap().bytes(), &w[..], "{n}");
            }
            let shards: Vec<String> = names_with(d.path(), "snap-model-");
            (shards, r.files)
        } else {
            (vec![format!("snap-{dest}")], 1)
        };
        assert_eq!(files.len(), read);
        for f in &files {
            let theirs = f.replacen("snap-", "ref-", 1);
            assert_eq!(
                std::fs::read(d.path().join(f)).unwrap(),
                std::fs::read(d.path().join(&theirs)).unwrap(),
                "{f}"
            );
        }
        for (t, w) in data.iter_mut().zip(&want) {
            t.copy_from_slice(w);
        }
    }
    // Only the files written: no temporary file left beside them.
    assert!(
        names(d.path())
            .iter()
            .all(|n| n.ends_with(".safetensors") || n.ends_with(".safetensors.index.json")),
        "{:?}",
        names(d.path())
    );
}

fn names_with(dir: &Path, prefix: &str) -> Vec<String> {
    names(dir)
        .into_iter()
        .filter(|n| n.starts_with(prefix) && n.ends_with(".safetensors"))
        .collect()
}

#[test]
fn a_snapshot_within_its_bound_is_taken_in_one_piece() {
    let fe = Arc::new(engine());
    let d = tempfile::tempdir().unwrap();
    let a = pattern(300 << 10, 1);
    let b = pattern(5000, 2);
    let list = [
        SaveTensor::new("a", Dtype::U8, &[300 << 10], &a),
        SaveTensor::new("b", Dtype::U8, &[5000], &b),
    ];
    let reference = d.path().join("ref.safetensors");
    checkpoint::save(&fe, &reference, &list, &SaveOptions::new()).unwrap();
    for opts in [
        SaveOptions::new(),
        SaveOptions::new().snapshot_bytes(1 << 20),
    ] {
        let path = d.path().join("snap.safetensors");
        let r = Checkpoint::snapshot_save(fe.clone(), &path, &list, opts)
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        // Today's snapshot: one buffer of every tensor, each at a 4 KiB boundary.
        assert_eq!(r.snapshot_bytes, (300 << 10) + 8192, "{r:?}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            std::fs::read(&reference).unwrap()
        );
    }
    // A bad tensor is refused before anything is written, bound or not.
    for opts in [SaveOptions::new(), SaveOptions::new().snapshot_bytes(4096)] {
        let bad = [SaveTensor::new("b", Dtype::F32, &[3], &b)];
        let e = Checkpoint::snapshot_save(fe.clone(), d.path().join("x.safetensors"), &bad, opts)
            .unwrap_err();
        assert!(matches!(e, CheckpointError::BadTensor { .. }), "{e:?}");
    }
    assert_eq!(names(d.path()), ["ref.safetensors", "snap.safetensors"]);
}

/// The writer a save reports for `asked` ([`SaveOptions::writer`]) in a folder whose file
/// system may refuse `O_DIRECT`: `O_DIRECT` where it takes it, else buffered with the reason.
fn check_writer(r: &checkpoint::SaveReport, asked: Option<bool>) {
    match (asked, r.writer != Writer::Buffered) {
        (Some(false), d) => assert!(!d, "{r}"),
        (_, true) => {
            assert!(r.io.direct_bytes > 0, "{r}");
            assert!(r.snapshot_bytes > 0, "{r}");
        }
        (_, false) => assert!(r.writer_note.contains("O_DIRECT"), "{r}"),
    }
}

#[test]
fn both_writers_write_the_reference_writers_bytes() {
    let fe = engine();
    let d = tempfile::tempdir().unwrap();
    // Odd sizes (the header and every tensor end off the 4 KiB blocks), one tensor over a
    // direct window (64 MiB), and an empty one.
    let sizes = [3usize, 70 << 20, 12_345, 0, 1 << 20, 4097];
    let owned = U8s::new(&sizes, 11, "t");
    let (data, tnames) = (&owned.data, &owned.names);
    let list = owned.list();
    // The reference writer's file.
    let want = owned.reference();
    for writer in [false, true] {
        for fsync in [false, true] {
            let p = d.path().join("w.safetensors");
            std::fs::write(&p, b"old").unwrap();
            let opts = SaveOptions::new().direct(writer).fsync(fsync);
            let r = checkpoint::save(&fe, &p, &list, &opts).unwrap();
            check_writer(&r, Some(writer));
            assert!(r.to_string().contains("writer "), "{r}");
            assert_eq!(r.synced, fsync);
            assert_eq!(
                std::fs::read(&p).unwrap(),
                want,
                "direct {writer} fsync {fsync}"
            );
            // Sharded, several shards written at once.
            let index = d.path().join("m.safetensors.index.json");
            let r =
                checkpoint::save(&fe, &index, &list, &opts.clone().shard_bytes(2 << 20)).unwrap();
            check_writer(&r, Some(writer));
            assert!(r.files >= 2, "{r}");
            let ck = checkpoint::load(&fe, &index, &LoadOptions::new(Target::Pageable)).unwrap();
            for (n, w) in tnames.iter().zip(data) {
                assert_eq!(ck.host(n).unwrap().bytes(), &w[..], "{n}");
            }
        }
    }
    assert!(names(d.path()).iter().all(|n| !n.contains("ferry-partial")));
}

#[test]
fn auto_writes_small_saves_buffered_and_large_ones_from_host_memory_o_direct() {
    let fe = engine();
    let d = tempfile::tempdir().unwrap();
    let big = pattern(65 << 20, 5);
    let small = pattern(1 << 20, 6);
    let p = d.path().join("a.safetensors");
    for (data, fsync) in [(&big, true), (&big, false), (&small, true), (&small, false)] {
        let shape = [data.len()];
        let r = checkpoint::save(
            &fe,
            &p,
            &one(data, &shape),
            &SaveOptions::new().fsync(fsync),
        )
        .unwrap();
        assert!(r.writer_note.starts_with("auto"), "{r}");
        if data.len() < 64 << 20 {
            assert_eq!(r.writer, Writer::Buffered, "{r}");
            assert!(r.writer_note.contains("64 MiB"), "{r}");
        } else {
            check_writer(&r, None);
            assert_ne!(r.writer, Writer::Hybrid, "{r}");
            let why = if fsync { "fsync asked" } else { "host memory" };
            assert!(r.writer_note.contains(why), "{r}");
        }
        let ck = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pageable)).unwrap();
        assert_eq!(ck.host("w").unwrap().bytes(), &data[..]);
    }
}

/// A save the hybrid writer was asked for: both ways where the page cache has room (this
/// machine's: the note gives the figures), else `O_DIRECT` alone saying why.
fn check_hybrid(r: &checkpoint::SaveReport) {
    if r.writer == Writer::Hybrid {
        assert_eq!(r.writer.to_string(), "O_DIRECT + buffered");
        assert!(
            r.writer_note.starts_with("asked: O_DIRECT from the end"),
            "{r}"
        );
        assert!(r.writer_note.contains("MiB dirty now"), "{r}");
        assert_eq!(r.io.direct_bytes + r.io.buffered_bytes, r.io.bytes, "{r}");
        let note = r.io.direct_note.as_deref().unwrap_or("");
        assert!(
            note.starts_with("for the hybrid writer's buffered share"),
            "{r}"
        );
    } else {
        check_writer(r, None);
        assert!(r.writer_note.contains("O_DIRECT alone"), "{r}");
    }
}

#[test]
fn the_hybrid_writer_writes_the_reference_writers_bytes_across_shards() {
    let fe = engine();
    let d = tempfile::tempdir().unwrap();
    // Five tensors over three shards, sizes off the 4 KiB blocks and across the 64 MiB
    // windows, so that the share's pieces and the windows cut files and tensors anywhere.
    let sizes = [
        (100 << 20) + 3,
        12_345,
        (70 << 20) + 4097,
        1 << 20,
        (90 << 20) + 1,
    ];
    let owned = U8s::new(&sizes, 31, "t");
    let (data, tnames) = (&owned.data, &owned.names);
    let list = owned.list();
    let index = d.path().join("m.safetensors.index.json");
    let hybrid = SaveOptions::new().writer(Writer::Hybrid);
    let opts = hybrid.clone().shard_bytes(110 << 20);
    let r = checkpoint::save(&fe, &index, &list, &opts).unwrap();
    assert_eq!(r.files, 3, "{r}");
    check_hybrid(&r);
    let ck = checkpoint::load(&fe, &index, &LoadOptions::new(Target::Pageable)).unwrap();
    for (n, w) in tnames.iter().zip(data) {
        assert_eq!(ck.host(n).unwrap().bytes(), &w[..], "{n}");
    }
    // One file: each shard's bytes as the reference writer lays them out.
    let p = d.path().join("one.safetensors");
    let r = checkpoint::save(&fe, &p, &list, &hybrid).unwrap();
    check_hybrid(&r);
    let want = owned.reference();
    assert!(
        std::fs::read(&p).unwrap() == want,
        "the file differs from the reference writer's"
    );
    assert!(names(d.path()).iter().all(|n| !n.contains("ferry-partial")));
}

/// Whether the file system of `dir` opens files with `O_DIRECT`.
fn takes_o_direct(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.join("probe");
    std::fs::write(&p, b"").unwrap();
    let ok = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&p)
        .is_ok();
    std::fs::remove_file(&p).unwrap();
    ok
}

#[test]
fn o_direct_refused_falls_back_to_buffered_with_the_reason() {
    // tmpfs refused O_DIRECT before Linux 6.6; where it takes it, the direct writer runs.
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    let fe = engine();
    let d = tempfile::tempdir_in(shm).unwrap();
    let data = pattern(3 << 20, 9);
    let shape = [data.len()];
    let p = d.path().join("s.safetensors");
    let opts = SaveOptions::new().direct(true);
    let r = checkpoint::save(&fe, &p, &one(&data, &shape), &opts).unwrap();
    if takes_o_direct(d.path()) {
        assert_eq!(r.writer, Writer::Direct, "{r}");
    } else {
        assert_eq!(r.writer, Writer::Buffered, "{r}");
        assert!(r.writer_note.contains("refused O_DIRECT"), "{r}");
        assert_eq!(r.io.direct_bytes, 0, "{r}");
    }
    let ck = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pageable)).unwrap();
    assert_eq!(ck.host("w").unwrap().bytes(), &data[..]);
    assert_eq!(names(d.path()), ["s.safetensors"]);
}

/// Saves of `bytes` with `opts`, stopped at the interrupt's ask number `stop_at` for each
/// given: each fails with `Interrupted`, the old file kept and nothing else left.
fn interrupted_at(opts: SaveOptions, bytes: usize, stops: &[usize]) {
    let fe = engine();
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.safetensors");
    std::fs::write(&p, b"old").unwrap();
    let data = vec![7u8; bytes];
    let shape = [data.len()];
    for &stop_at in stops {
        let asked = Arc::new(AtomicUsize::new(0));
        let a = asked.clone();
        let opts = opts
            .clone()
            .interrupt(move || a.fetch_add(1, Ordering::SeqCst) >= stop_at);
        let e = checkpoint::save(&fe, &p, &one(&data, &shape), &opts).unwrap_err();
        assert!(matches!(e, CheckpointError::Interrupted { .. }), "{e:?}");
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert_eq!(names(d.path()), ["m.safetensors"]);
    }
}

#[test]
fn an_interrupted_o_direct_save_leaves_the_old_file_and_nothing_else() {
    // Four direct windows' worth: stopped at the first, third and fifth ask.
    interrupted_at(
        SaveOptions::new().direct(true).fsync(true),
        256 << 20,
        &[0, 2, 4],
    );
}

#[test]
fn an_interrupted_hybrid_save_leaves_the_old_file_and_nothing_else() {
    // Both ways (where the page cache has room): stopped at once, and at later asks of
    // whichever side asks.
    interrupted_at(
        SaveOptions::new().writer(Writer::Hybrid),
        384 << 20,
        &[0, 1, 2, 4],
    );
}

#[test]
fn a_streamed_snapshot_holds_at_most_its_bound_with_either_writer() {
    let fe = Arc::new(engine());
    let d = tempfile::tempdir().unwrap();
    let sizes = [5000usize, 300 << 10, 1 << 20, 77, 200 << 10];
    let owned = U8s::new(&sizes, 3, "s");
    let list = owned.list();
    let reference = d.path().join("ref.safetensors");
    checkpoint::save(&fe, &reference, &list, &SaveOptions::new()).unwrap();
    let want = std::fs::read(&reference).unwrap();
    for writer in [false, true] {
        // Bounds from the smallest (two 4 KiB windows) to just under the checkpoint.
        for bound in [8192u64, 100 << 10, 1 << 20, 1500 << 10] {
            let path = d.path().join("snap.safetensors");
            let opts = SaveOptions::new().direct(writer).snapshot_bytes(bound);
            let r = Checkpoint::snapshot_save(fe.clone(), &path, &list, opts)
                .unwrap()
                .join()
                .unwrap()
                .unwrap();
            assert!(
                r.snapshot_bytes > 0 && r.snapshot_bytes <= bound,
                "{bound}: {r}"
            );
            if r.writer != Writer::Buffered {
                assert!(r.io.direct_bytes > 0, "{r}");
            }
            assert_eq!(
                std::fs::read(&path).unwrap(),
                want,
                "direct {writer} {bound}"
            );
        }
    }
    assert_eq!(names(d.path()), ["ref.safetensors", "snap.safetensors"]);
}
