//! Checkpoints on the CPU: safetensors round trips against the reference implementation
//! (the `safetensors` crate) for every dtype, 0-d and empty tensors, thousands of tensors,
//! sharded indexes, subsets; loads into the caller's memory (`load_into`); every malformed
//! file refused with its own error naming the file and the tensor; files that shrink, fail or
//! are not files.

use ferry::checkpoint::{
    self, CheckpointError, Dest, Dtype, LoadOptions, Placement, SaveOptions, SaveTensor, Target,
};
use ferry::file::{FileConfig, FileEngine, FileError, FileHandle, OpenMode};
use std::io;
use std::path::{Path, PathBuf};

mod files_common;
use files_common::{bytes, engines, Hooked, TempDir};

const ALL_DTYPES: [Dtype; 20] = [
    Dtype::BOOL,
    Dtype::F4,
    Dtype::F6_E2M3,
    Dtype::F6_E3M2,
    Dtype::U8,
    Dtype::I8,
    Dtype::F8_E5M2,
    Dtype::F8_E4M3,
    Dtype::F8_E8M0,
    Dtype::I16,
    Dtype::U16,
    Dtype::F16,
    Dtype::BF16,
    Dtype::I32,
    Dtype::U32,
    Dtype::F32,
    Dtype::C64,
    Dtype::F64,
    Dtype::I64,
    Dtype::U64,
];

/// A tensor owned by a test: name, dtype, shape, bytes.
#[derive(Debug, Clone)]
struct Owned {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl safetensors::View for &Owned {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (&self.data[..]).into()
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn owned(name: &str, dtype: Dtype, shape: &[usize], seed: u64) -> Owned {
    let n = checkpoint::tensor_bytes(dtype, shape).expect("whole bytes") as usize;
    Owned {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        data: bytes(n, seed),
    }
}

/// Every dtype in a few shapes (0-d where a single element is whole bytes, empty ones).
fn every_dtype() -> Vec<Owned> {
    let mut v = Vec::new();
    for (i, &d) in ALL_DTYPES.iter().enumerate() {
        let i = i as u64;
        v.push(owned(&format!("{d}.vec"), d, &[8], i));
        v.push(owned(&format!("{d}.mat"), d, &[3, 8], 100 + i));
        v.push(owned(&format!("{d}.empty"), d, &[0], 200 + i));
        v.push(owned(&format!("{d}.empty2"), d, &[4, 0, 2], 300 + i));
        if d.bitsize() % 8 == 0 {
            v.push(owned(&format!("{d}.scalar"), d, &[], 400 + i));
        }
    }
    v
}

fn reference_bytes(tensors: &[Owned]) -> Vec<u8> {
    safetensors::serialize(tensors.iter().map(|t| (t.name.clone(), t)), None).unwrap()
}

fn check_loaded(ck: &checkpoint::Checkpoint, want: &[Owned], ctx: &str) {
    assert_eq!(ck.tensors().len(), want.len(), "{ctx}");
    for w in want {
        let t = ck
            .get(&w.name)
            .unwrap_or_else(|| panic!("{ctx}: {} missing", w.name));
        assert_eq!(
            (t.dtype, &t.shape),
            (w.dtype, &w.shape),
            "{ctx}: {}",
            w.name
        );
        assert_eq!(t.len, w.data.len(), "{ctx}: {}", w.name);
        let got = ck.host(&w.name).unwrap().bytes();
        if let Some(i) = got.iter().zip(&w.data).position(|(a, b)| a != b) {
            panic!("{ctx}: tensor {} differs at byte {i}", w.name);
        }
    }
    assert_eq!(
        ck.report().bytes,
        want.iter().map(|w| w.data.len() as u64).sum::<u64>(),
        "{ctx}"
    );
}

#[test]
fn reference_files_load_every_dtype_every_placement() {
    let dir = TempDir::new("every-dtype");
    let want = every_dtype();
    let path = dir.file("every.safetensors", &reference_bytes(&want));
    for (name, fe) in engines() {
        for placement in [Placement::Packed, Placement::PerTensor] {
            let ctx = format!("{name} {placement:?}");
            let opts = LoadOptions::new(Target::Pageable).placement(placement);
            let ck = checkpoint::load(&fe, &path, &opts).unwrap();
            check_loaded(&ck, &want, &ctx);
            let r = ck.report();
            match placement {
                // The whole data section is one run: one read.
                Placement::Packed => assert_eq!((r.reads, r.allocations), (1, 1), "{ctx}"),
                Placement::PerTensor => {
                    assert_eq!((r.reads, r.allocations), (want.len(), want.len()), "{ctx}")
                }
            }
            for t in ck.tensors() {
                assert_eq!(t.kind, ferry::MemKind::Pageable);
                assert_eq!(t.file, path);
                assert_eq!(t.file_range.end - t.file_range.start, t.len as u64);
            }
        }
    }
}

#[test]
fn saves_match_the_reference_writer_byte_for_byte() {
    let dir = TempDir::new("save");
    let want = every_dtype();
    let fe = FileEngine::new(FileConfig::new().threads(3)).unwrap();
    let tensors: Vec<SaveTensor<'_>> = want
        .iter()
        .map(|t| SaveTensor::new(&t.name, t.dtype, &t.shape, &t.data))
        .collect();
    let path = dir.0.join("ours.safetensors");
    let report = checkpoint::save(&fe, &path, &tensors, &SaveOptions::new().fsync(true)).unwrap();
    let ours = std::fs::read(&path).unwrap();
    assert_eq!(report.bytes, ours.len() as u64);
    assert!(report.synced);
    assert!(
        ours == reference_bytes(&want),
        "file differs from safetensors::serialize"
    );
    // No partial file left beside it.
    let left: Vec<_> = std::fs::read_dir(&dir.0).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");
    // And the reference reader reads it.
    let st = safetensors::SafeTensors::deserialize(&ours).unwrap();
    for w in &want {
        let v = st.tensor(&w.name).unwrap();
        assert_eq!(
            (v.dtype(), v.shape(), v.data()),
            (w.dtype, &w.shape[..], &w.data[..])
        );
    }
}

#[test]
fn load_then_save_round_trip_keeps_metadata() {
    let dir = TempDir::new("meta");
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let a = owned("a", Dtype::F32, &[16, 4], 1);
    let b = owned("b", Dtype::I8, &[5], 2);
    let src = dir.0.join("src.safetensors");
    let opts = SaveOptions::new().metadata("format", "pt");
    checkpoint::save(
        &fe,
        &src,
        &[
            SaveTensor::new("a", a.dtype, &a.shape, &a.data),
            SaveTensor::new("b", b.dtype, &b.shape, &b.data),
        ],
        &opts,
    )
    .unwrap();
    let ck = checkpoint::load(&fe, &src, &LoadOptions::new(Target::Pageable)).unwrap();
    assert_eq!(ck.metadata().get("format").map(String::as_str), Some("pt"));
    let copy = dir.0.join("copy.safetensors");
    ck.save(&fe, &copy, &SaveOptions::new()).unwrap();
    assert!(std::fs::read(&src).unwrap() == std::fs::read(&copy).unwrap());
}

#[test]
fn thousands_of_tensors_and_subsets() {
    let dir = TempDir::new("many");
    let want: Vec<Owned> = (0..5000)
        .map(|i| {
            owned(
                &format!("layer.{i:05}.w"),
                Dtype::F16,
                &[i % 7, 3],
                i as u64,
            )
        })
        .collect();
    let path = dir.file("many.safetensors", &reference_bytes(&want));
    let fe = FileEngine::new(FileConfig::new().threads(3)).unwrap();
    for placement in [Placement::Packed, Placement::PerTensor] {
        let ck = checkpoint::load(
            &fe,
            &path,
            &LoadOptions::new(Target::Pageable).placement(placement),
        )
        .unwrap();
        check_loaded(&ck, &want, &format!("{placement:?}"));
    }
    // Every other tensor by predicate: one read per run of adjacent tensors chosen.
    let even: Vec<Owned> = want
        .iter()
        .filter(|t| {
            t.name.ends_with("0.w")
                || t.name.ends_with("2.w")
                || t.name.ends_with("4.w")
                || t.name.ends_with("6.w")
                || t.name.ends_with("8.w")
        })
        .cloned()
        .collect();
    let opts = LoadOptions::new(Target::Pageable).filter(|t| {
        let n: usize = t.name[6..11].parse().unwrap();
        n % 2 == 0
    });
    let ck = checkpoint::load(&fe, &path, &opts).unwrap();
    check_loaded(&ck, &even, "filter");
    assert!(ck.report().reads <= even.len(), "{}", ck.report());
    // In a packed allocation, offsets keep the data section's alignment (mod 256).
    let h = checkpoint::read_header(&fe, &fe.open(&path, OpenMode::Read).unwrap()).unwrap();
    for t in ck.tensors() {
        let rel = t.file_range.start - h.data_start;
        assert_eq!(t.offset as u64 % 256, rel % 256, "{}", t.name);
    }
    // By name, in any order; a missing name is refused before anything is loaded.
    let ck = checkpoint::load(
        &fe,
        &path,
        &LoadOptions::new(Target::Pageable).names(["layer.04999.w", "layer.00001.w"]),
    )
    .unwrap();
    check_loaded(&ck, &[want[1].clone(), want[4999].clone()], "names");
    let e = checkpoint::load(
        &fe,
        &path,
        &LoadOptions::new(Target::Pageable).names(["nope"]),
    )
    .unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Missing { tensor, .. } if tensor == "nope"),
        "{e}"
    );
    assert_eq!(e.path(), Some(path.as_path()));
}

/// `LoadOptions::align`: the setter rounds up to a power of two and stops at the largest one
/// (`next_power_of_two` of more than 2^63 once panicked in debug builds and gave 0 in release
/// builds); the field set directly to anything else is refused by the load, naming it, before
/// a tensor is read (`usize::MAX` once overflowed the placement arithmetic). The largest
/// alignment works: each run lands at its data-section offset.
#[test]
fn align_is_rounded_capped_and_checked() {
    use ferry::checkpoint::MAX_ALIGN;
    let o = || LoadOptions::new(Target::Pageable);
    assert_eq!(MAX_ALIGN, 1 << (usize::BITS - 1));
    for (asked, got) in [
        (0, 1),
        (1, 1),
        (3, 4),
        (4096, 4096),
        (MAX_ALIGN - 1, MAX_ALIGN),
        (MAX_ALIGN, MAX_ALIGN),
        (MAX_ALIGN + 1, MAX_ALIGN),
        (usize::MAX, MAX_ALIGN),
    ] {
        assert_eq!(o().align(asked).align, got, "align({asked})");
    }

    let dir = TempDir::new("align");
    let want: Vec<Owned> = (0..6)
        .map(|i| owned(&format!("t.{i}"), Dtype::U8, &[5 + i], i as u64))
        .collect();
    let path = dir.file("align.safetensors", &reference_bytes(&want));
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let h = checkpoint::read_header(&fe, &fe.open(&path, OpenMode::Read).unwrap()).unwrap();
    // Every other tensor: one run each, so each is placed by the alignment.
    let odd: Vec<Owned> = want.iter().skip(1).step_by(2).cloned().collect();
    let by_odd = |o: LoadOptions| o.names(odd.iter().map(|t| t.name.clone()));
    for a in [1, 3, 256, MAX_ALIGN, usize::MAX] {
        let ck = checkpoint::load(&fe, &path, &by_odd(o().align(a))).unwrap();
        check_loaded(&ck, &odd, &format!("align({a})"));
        let a = a.max(1).checked_next_power_of_two().unwrap_or(MAX_ALIGN) as u64;
        for t in ck.tensors() {
            let rel = t.file_range.start - h.data_start;
            assert_eq!(t.offset as u64 % a, rel % a, "{}", t.name);
        }
    }
    // The field itself: 0 counts as 1, a power of two is used as is, anything else refused.
    for a in [0, 1, MAX_ALIGN] {
        let mut opts = by_odd(o());
        opts.align = a;
        let ck = checkpoint::load(&fe, &path, &opts).unwrap();
        check_loaded(&ck, &odd, &format!("align = {a}"));
    }
    for a in [3, 100, MAX_ALIGN + 1, usize::MAX] {
        for placement in [Placement::Packed, Placement::PerTensor] {
            let mut opts = o().placement(placement);
            opts.align = a;
            let e = checkpoint::load(&fe, &path, &opts).unwrap_err();
            assert!(
                matches!(&e, CheckpointError::Align { align, .. } if *align == a),
                "{a}: {e}"
            );
            assert_eq!(e.path(), Some(path.as_path()));
            assert!(e.to_string().contains("not a power of two"), "{e}");
        }
    }
}

/// Writes two shards and their index; returns (index path, all tensors).
fn sharded(dir: &TempDir) -> (PathBuf, Vec<Owned>) {
    let s1: Vec<Owned> = (0..10)
        .map(|i| owned(&format!("a.{i}"), Dtype::F32, &[i + 1], i as u64))
        .collect();
    let s2: Vec<Owned> = (0..7)
        .map(|i| owned(&format!("b.{i}"), Dtype::BF16, &[2, i], 50 + i as u64))
        .collect();
    dir.file("model-00001-of-00002.safetensors", &reference_bytes(&s1));
    dir.file("model-00002-of-00002.safetensors", &reference_bytes(&s2));
    let mut map = serde_json::Map::new();
    for t in &s1 {
        map.insert(t.name.clone(), "model-00001-of-00002.safetensors".into());
    }
    for t in &s2 {
        map.insert(t.name.clone(), "model-00002-of-00002.safetensors".into());
    }
    let index = serde_json::json!({"metadata": {"total_size": 1234}, "weight_map": map});
    let p = dir.file("model.safetensors.index.json", index.to_string().as_bytes());
    (p, s1.into_iter().chain(s2).collect())
}

#[test]
fn sharded_checkpoint_through_its_index() {
    let dir = TempDir::new("sharded");
    let (index, want) = sharded(&dir);
    for (name, fe) in engines() {
        for placement in [Placement::Packed, Placement::PerTensor] {
            let ck = checkpoint::load(
                &fe,
                &index,
                &LoadOptions::new(Target::Pageable).placement(placement),
            )
            .unwrap();
            check_loaded(&ck, &want, &format!("{name} {placement:?}"));
            assert_eq!(ck.report().files, 2);
            assert_eq!(
                ck.metadata().get("total_size").map(String::as_str),
                Some("1234")
            );
            if placement == Placement::Packed {
                assert_eq!(ck.report().reads, 2, "one read per shard");
                assert_eq!(ck.buffers().len(), 1);
            }
        }
    }
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let ck = checkpoint::load(
        &fe,
        &index,
        &LoadOptions::new(Target::Pageable).names(["b.3", "a.0"]),
    )
    .unwrap();
    check_loaded(&ck, &[want[0].clone(), want[13].clone()], "subset");
}

#[test]
fn bad_indexes_are_refused() {
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let dir = TempDir::new("bad-index");
    let (index, _) = sharded(&dir);
    let text = std::fs::read_to_string(&index).unwrap();
    // A tensor mapped to a shard that does not hold it.
    let p = dir.file(
        "wrong.safetensors.index.json",
        text.replace("\"a.3\":\"model-00001", "\"a.3\":\"model-00002")
            .as_bytes(),
    );
    let e = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pageable)).unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Index { msg, .. } if msg.contains("a.3")),
        "{e}"
    );
    // A shard that does not exist: the error names it.
    let p = dir.file(
        "gone.safetensors.index.json",
        text.replace("model-00002-of-00002", "model-00009")
            .as_bytes(),
    );
    let e = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pageable)).unwrap_err();
    assert!(e.to_string().contains("model-00009"), "{e}");
    // Shards outside the index's folder.
    for evil in ["/etc/passwd", "../model-00001-of-00002.safetensors"] {
        let p = dir.file(
            "evil.safetensors.index.json",
            text.replace("model-00002-of-00002.safetensors", evil)
                .as_bytes(),
        );
        let e = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pageable)).unwrap_err();
        assert!(
            matches!(&e, CheckpointError::Index { msg, .. } if msg.contains("inside")),
            "{e}"
        );
    }
    // Not JSON, no weight_map.
    for (name, body) in [
        ("notjson", "{\"weight_map\": "),
        ("nomap", "{\"metadata\": {}}"),
    ] {
        let p = dir.file(&format!("{name}.index.json"), body.as_bytes());
        let e = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pageable)).unwrap_err();
        assert!(matches!(e, CheckpointError::Index { .. }), "{name}: {e}");
    }
    // The same tensor in two shards.
    let dup = reference_bytes(&[owned("a.1", Dtype::F32, &[2], 9)]);
    dir.file("model-00002-of-00002.safetensors", &dup);
    let e = checkpoint::load_files(
        &fe,
        &[
            fe.open(
                dir.0.join("model-00001-of-00002.safetensors"),
                OpenMode::Read,
            )
            .unwrap(),
            fe.open(
                dir.0.join("model-00002-of-00002.safetensors"),
                OpenMode::Read,
            )
            .unwrap(),
        ],
        &LoadOptions::new(Target::Pageable),
    )
    .unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Duplicate { tensor, .. } if tensor == "a.1"),
        "{e}"
    );
}

/// An index larger than any real one is refused before it is read (it was read whole into
/// memory: a sparse 8 GB `*.index.json` cost 8 GB and 40 s before "not JSON").
#[test]
fn an_oversized_index_is_refused_unread() {
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let dir = TempDir::new("big-index");
    let p = dir.file("model.safetensors.index.json", b"{\"weight_map\": {}}");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(checkpoint::MAX_INDEX_BYTES + 1)
        .unwrap();
    let e = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pageable)).unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Index { msg, .. } if msg.contains("over the limit")),
        "{e}"
    );
    assert!(checkpoint::entries(&fe, &p).is_err());
}

/// A safetensors file from a header text and data bytes.
fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

fn load_err(path: &Path) -> CheckpointError {
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    for placement in [Placement::Packed, Placement::PerTensor] {
        let r = checkpoint::load(
            &fe,
            path,
            &LoadOptions::new(Target::Pageable).placement(placement),
        );
        if r.is_ok() {
            panic!("{} loaded", path.display());
        }
    }
    let e = checkpoint::load(&fe, path, &LoadOptions::new(Target::Pageable)).unwrap_err();
    assert_eq!(e.path(), Some(path), "{e}");
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    e
}

#[test]
fn every_bad_file_has_its_own_error() {
    let dir = TempDir::new("bad");
    let t = |name: &str, dtype: &str, shape: &str, b: u64, e: u64| {
        format!("\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape},\"data_offsets\":[{b},{e}]}}")
    };
    let hdr = |entries: &[String]| format!("{{{}}}", entries.join(","));

    // Shorter than the 8-byte length.
    let e = load_err(&dir.file("tiny", &[1, 2, 3]));
    assert!(
        matches!(e, CheckpointError::TooShort { file_len: 3, .. }),
        "{e}"
    );
    // Header length beyond the file.
    let mut f = raw_file(&hdr(&[t("x", "F32", "[1]", 0, 4)]), &[0; 4]);
    f[..8].copy_from_slice(&1000u64.to_le_bytes());
    let e = load_err(&dir.file("beyond", &f));
    assert!(
        matches!(
            e,
            CheckpointError::HeaderBeyondFile {
                header_len: 1000,
                ..
            }
        ),
        "{e}"
    );
    let mut f2 = f.clone();
    f2[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = load_err(&dir.file("huge", &f2));
    assert!(matches!(e, CheckpointError::HeaderTooLarge { .. }), "{e}");
    // Truncated JSON (the length covers the file, the JSON stops early).
    let full = hdr(&[t("x", "F32", "[1]", 0, 4)]);
    let e = load_err(&dir.file("truncated", &raw_file(&full[..full.len() - 5], &[])));
    assert!(matches!(e, CheckpointError::BadJson { .. }), "{e}");
    // Non-UTF-8 header.
    let mut f = raw_file(&full, &[0; 4]);
    f[12] = 0xFF;
    let e = load_err(&dir.file("utf8", &f));
    assert!(
        matches!(e, CheckpointError::NotUtf8 { valid_up_to: 4, .. }),
        "{e}"
    );
    // Unknown dtype.
    let e = load_err(&dir.file(
        "dtype",
        &raw_file(&hdr(&[t("w", "F17", "[1]", 0, 4)]), &[0; 4]),
    ));
    assert!(
        matches!(&e, CheckpointError::UnknownDtype { tensor, dtype, .. } if tensor == "w" && dtype == "F17"),
        "{e}"
    );
    // A malformed entry.
    let e = load_err(&dir.file(
        "entry",
        &raw_file(
            "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
            &[0; 4],
        ),
    ));
    assert!(
        matches!(&e, CheckpointError::BadEntry { tensor, .. } if tensor == "w"),
        "{e}"
    );
    // Offsets out of order.
    let e = load_err(&dir.file(
        "order",
        &raw_file(&hdr(&[t("w", "U8", "[0]", 4, 0)]), &[0; 4]),
    ));
    assert!(
        matches!(&e, CheckpointError::BadOffsets { tensor, begin: 4, end: 0, .. } if tensor == "w"),
        "{e}"
    );
    // Overlapping tensors.
    let e = load_err(&dir.file(
        "overlap",
        &raw_file(
            &hdr(&[t("a", "U8", "[4]", 0, 4), t("b", "U8", "[4]", 2, 6)]),
            &[0; 6],
        ),
    ));
    assert!(
        matches!(&e, CheckpointError::Overlap { tensor, other, .. } if tensor == "b" && other == "a"),
        "{e}"
    );
    // A gap between tensors.
    let e = load_err(&dir.file(
        "gap",
        &raw_file(
            &hdr(&[t("a", "U8", "[4]", 0, 4), t("b", "U8", "[2]", 6, 8)]),
            &[0; 8],
        ),
    ));
    assert!(
        matches!(&e, CheckpointError::Gap { tensor, begin: 6, expected: 4, .. } if tensor == "b"),
        "{e}"
    );
    // Outside the data section.
    let e = load_err(&dir.file(
        "outside",
        &raw_file(
            &hdr(&[t("a", "U8", "[4]", 0, 4), t("b", "U8", "[8]", 4, 12)]),
            &[0; 6],
        ),
    ));
    assert!(
        matches!(&e, CheckpointError::OutsideData { tensor, end: 12, data_len: 6, .. } if tensor == "b"),
        "{e}"
    );
    // Shape x dtype not matching the byte range (and a sub-byte count).
    let e = load_err(&dir.file(
        "size",
        &raw_file(&hdr(&[t("w", "F32", "[2,3]", 0, 20)]), &[0; 20]),
    ));
    assert!(
        matches!(&e, CheckpointError::SizeMismatch { tensor, need: Some(24), bytes: 20, .. } if tensor == "w"),
        "{e}"
    );
    let e = load_err(&dir.file(
        "nibble",
        &raw_file(&hdr(&[t("w", "F4", "[3]", 0, 2)]), &[0; 2]),
    ));
    assert!(
        matches!(&e, CheckpointError::SizeMismatch { need: None, .. }),
        "{e}"
    );
    let e = load_err(&dir.file(
        "overflow",
        &raw_file(
            &hdr(&[t("w", "F64", "[4294967296,4294967296]", 0, 8)]),
            &[0; 8],
        ),
    ));
    assert!(
        matches!(&e, CheckpointError::SizeMismatch { need: None, .. }),
        "{e}"
    );
    // Bytes after the last tensor.
    let e = load_err(&dir.file(
        "trailing",
        &raw_file(&hdr(&[t("w", "U8", "[4]", 0, 4)]), &[0; 9]),
    ));
    assert!(
        matches!(
            e,
            CheckpointError::TrailingBytes {
                data_len: 4,
                extra: 5,
                ..
            }
        ),
        "{e}"
    );
    // A metadata entry that is not a string map.
    let e = load_err(&dir.file("meta", &raw_file("{\"__metadata__\":{\"a\":1}}", &[])));
    assert!(
        matches!(&e, CheckpointError::BadEntry { tensor, .. } if tensor == "__metadata__"),
        "{e}"
    );
    // The reference reader refuses every one of these too.
    for f in std::fs::read_dir(&dir.0).unwrap() {
        let b = std::fs::read(f.unwrap().path()).unwrap();
        assert!(safetensors::SafeTensors::deserialize(&b).is_err());
    }
}

/// `"__metadata__": null` is no metadata, as the reference reader takes it (it was refused as
/// "not a map of strings").
#[test]
fn null_metadata_is_no_metadata() {
    let dir = TempDir::new("null-meta");
    let header = r#"{"__metadata__":null,"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
    let bytes = raw_file(header, &[1, 2, 3, 4]);
    assert!(safetensors::SafeTensors::deserialize(&bytes).is_ok());
    let p = dir.file("null-meta.safetensors", &bytes);
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let ck = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pageable)).unwrap();
    assert_eq!(ck.host("w").map(|v| v.bytes()), Some(&[1u8, 2, 3, 4][..]));
    assert!(ck.metadata().is_empty());
}

#[test]
fn empty_checkpoint_loads_nothing() {
    let dir = TempDir::new("empty");
    let p = dir.file("empty.safetensors", &raw_file("{}      ", &[]));
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let ck = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pageable)).unwrap();
    assert_eq!((ck.tensors().len(), ck.report().bytes), (0, 0));
}

/// The safetensors file at `p` opened so that the first read at or past `header` (the data
/// section) truncates it inside the second of two 1 MiB tensors.
fn shrinking(p: &Path, header: u64, direct: bool) -> FileHandle {
    let (keep, once) = (header + (1 << 20) + 1000, std::sync::Once::new());
    let hook = move |path: &Path, _: &mut [u8], offset: u64| {
        if offset >= header {
            once.call_once(|| {
                let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
                f.set_len(keep).unwrap();
            });
        }
        None
    };
    FileHandle::from_io(p.to_path_buf(), Hooked::open(p, direct, Box::new(hook)))
}

/// End of file inside a read, or (a later tensor's read submitted after the file shrank) a
/// range beyond the end at submit: either names the file and the tensor "second".
fn assert_shrank(e: &CheckpointError, p: &Path, ctx: &str) {
    match e {
        CheckpointError::File {
            path,
            tensor,
            source: FileError::UnexpectedEof { .. } | FileError::OutOfRange { .. },
        } => {
            assert_eq!(path, p, "{ctx}: {e}");
            assert_eq!(tensor.as_deref(), Some("second"), "{ctx}: {e}");
        }
        _ => panic!("{ctx}: {e}"),
    }
}

/// A file that is empty when its length is first taken and whole afterwards: a writer
/// filling it while the load starts.
struct GrowsAfterLen {
    inner: ferry::file::OsFile,
    asked: std::sync::atomic::AtomicBool,
}

impl ferry::file::FileIo for GrowsAfterLen {
    fn read_at(&self, buf: &mut [u8], offset: u64, direct: bool) -> io::Result<usize> {
        self.inner.read_at(buf, offset, direct)
    }
    fn write_at(&self, buf: &[u8], offset: u64, direct: bool) -> io::Result<usize> {
        self.inner.write_at(buf, offset, direct)
    }
    fn file_len(&self) -> io::Result<u64> {
        if self.asked.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.inner.file_len()
        } else {
            Ok(0)
        }
    }
    fn direct(&self) -> Result<(), String> {
        self.inner.direct()
    }
}

/// The header's reader took the file's length, then read the 8-byte header length (which
/// takes the length anew): a file that grew past 8 bytes in between underflowed `file_len -
/// 8` (a panic in debug builds, a data section of 2^64 - 8 - n bytes and a nonsense error
/// in release builds). It is too short as its length said.
#[test]
fn a_file_that_grows_while_its_header_is_read_is_too_short_not_a_panic() {
    let dir = TempDir::new("grows");
    let p = dir.file(
        "grows.safetensors",
        &reference_bytes(&[owned("w", Dtype::F32, &[4], 1)]),
    );
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let f = FileHandle::from_io(
        p.clone(),
        GrowsAfterLen {
            inner: ferry::file::OsFile::open(&p, OpenMode::Read, false).unwrap(),
            asked: Default::default(),
        },
    );
    let e = checkpoint::load_files(&fe, &[f], &LoadOptions::new(Target::Pageable)).unwrap_err();
    assert!(
        matches!(e, CheckpointError::TooShort { file_len: 0, .. }),
        "{e}"
    );
}

#[test]
fn a_file_that_shrinks_while_loading_fails_naming_the_tensor() {
    let dir = TempDir::new("shrink");
    let want = vec![
        owned("first", Dtype::U8, &[1 << 20], 1),
        owned("second", Dtype::U8, &[1 << 20], 2),
    ];
    let bytes = reference_bytes(&want);
    let header = bytes.len() as u64 - (2 << 20);
    for (name, fe) in engines() {
        for placement in [Placement::Packed, Placement::PerTensor] {
            let p = dir.file("shrinks.safetensors", &bytes);
            let f = shrinking(&p, header, fe.config().direct);
            let opts = LoadOptions::new(Target::Pageable).placement(placement);
            let e = checkpoint::load_files(&fe, &[f], &opts).unwrap_err();
            assert_shrank(&e, &p, &format!("{name} {placement:?}"));
        }
        // Into the caller's memory.
        let p = dir.file("shrinks.safetensors", &bytes);
        let f = shrinking(&p, header, fe.config().direct);
        let (mut a, mut b) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
        let mut into = [Dest::new("first", &mut a), Dest::new("second", &mut b)];
        let e = checkpoint::load_files_into(&fe, &[f], &mut into).unwrap_err();
        assert_shrank(&e, &p, &format!("{name} into"));
    }
}

#[test]
fn permission_denied_is_reported_with_file_and_tensor() {
    let dir = TempDir::new("perm");
    let want = vec![
        owned("a", Dtype::F32, &[1000], 1),
        owned("b", Dtype::F32, &[1000], 2),
    ];
    let bytes = reference_bytes(&want);
    let p = dir.file("perm.safetensors", &bytes);
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let at = bytes.len() as u64 - 4000 + 10;
    let f = FileHandle::from_io(
        p.clone(),
        Hooked::open(
            &p,
            false,
            Box::new(move |_: &Path, buf: &mut [u8], offset: u64| {
                (offset + buf.len() as u64 > at)
                    .then(|| Err(io::Error::from(io::ErrorKind::PermissionDenied)))
            }),
        ),
    );
    let e = checkpoint::load_files(
        &fe,
        &[f],
        &LoadOptions::new(Target::Pageable).placement(Placement::PerTensor),
    )
    .unwrap_err();
    assert!(
        matches!(&e, CheckpointError::File { tensor: Some(t), source: FileError::Io { kind: io::ErrorKind::PermissionDenied, .. }, .. } if t == "b"),
        "{e}"
    );
    // A file the process may not open (root may open anything: then only the injected case).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::File::open(&p).is_err() {
        let e = load_err(&p);
        assert!(
            matches!(
                &e,
                CheckpointError::File {
                    source: FileError::Open {
                        kind: io::ErrorKind::PermissionDenied,
                        ..
                    },
                    ..
                }
            ),
            "{e}"
        );
    } else {
        println!("running as root: the open-time permission check cannot be shown here");
    }
}

/// Runs `f` on a thread and fails if it takes longer than 10 s (a blocked open).
fn within_10s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what}: blocked for 10 s"))
}

#[test]
fn fifos_and_character_devices_are_refused_at_open() {
    let dir = TempDir::new("fifo");
    let fifo = dir.0.join("pipe.safetensors");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    for p in [
        fifo.clone(),
        PathBuf::from("/dev/zero"),
        PathBuf::from("/dev/null"),
    ] {
        let p2 = p.clone();
        let e = within_10s(&p.display().to_string(), move || {
            let fe = FileEngine::new(FileConfig::new().threads(1)).unwrap();
            checkpoint::load(&fe, &p2, &LoadOptions::new(Target::Pageable)).unwrap_err()
        });
        match &e {
            CheckpointError::File {
                path,
                source:
                    FileError::Open {
                        kind: io::ErrorKind::InvalidInput,
                        msg,
                        ..
                    },
                ..
            } => {
                assert_eq!(path, &p);
                assert!(
                    msg.contains("FIFO")
                        || msg.contains("character device")
                        || msg.contains("directory"),
                    "{e}"
                );
            }
            _ => panic!("{}: {e}", p.display()),
        }
    }
    // A folder is a checkpoint's: one holding only a FIFO holds none (the FIFO is not
    // opened).
    let d = dir.0.clone();
    let e = within_10s("folder", move || {
        let fe = FileEngine::new(FileConfig::new().threads(1)).unwrap();
        checkpoint::load(&fe, &d, &LoadOptions::new(Target::Pageable)).unwrap_err()
    });
    assert!(
        matches!(&e, CheckpointError::Index { path, msg } if path == &dir.0 && msg.contains("no checkpoint")),
        "{e}"
    );
    // And for plain file engine opens, writers included.
    let e = within_10s("fifo for writing", move || {
        let fe = FileEngine::new(FileConfig::new().threads(1)).unwrap();
        fe.open(&fifo, OpenMode::ReadWrite).unwrap_err()
    });
    assert!(matches!(e, FileError::Open { .. }), "{e}");
}

#[test]
fn save_refuses_bad_tensors_and_leaves_no_file() {
    let dir = TempDir::new("save-bad");
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let data = vec![0u8; 10];
    let path = dir.0.join("out.safetensors");
    let e = checkpoint::save(
        &fe,
        &path,
        &[SaveTensor::new("w", Dtype::F32, &[3], &data)],
        &SaveOptions::new(),
    )
    .unwrap_err();
    assert!(
        matches!(&e, CheckpointError::BadTensor { tensor, .. } if tensor == "w"),
        "{e}"
    );
    let four = vec![0u8; 4];
    let e = checkpoint::save(
        &fe,
        &path,
        &[
            SaveTensor::new("w", Dtype::F32, &[1], &four),
            SaveTensor::new("w", Dtype::U8, &[4], &four),
        ],
        &SaveOptions::new(),
    )
    .unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Duplicate { tensor, .. } if tensor == "w"),
        "{e}"
    );
    // Into a folder that does not exist: the temporary file cannot be made, naming the file.
    let e = checkpoint::save(
        &fe,
        dir.0.join("no/such/dir/x.safetensors"),
        &[],
        &SaveOptions::new(),
    )
    .unwrap_err();
    assert!(matches!(e, CheckpointError::Replace { .. }), "{e}");
    assert!(e.to_string().contains("x.safetensors"), "{e}");
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0);
}

#[test]
fn pinned_without_a_driver_is_an_allocation_error() {
    if ferry::cuda::probe().driver.is_ok() {
        println!("skipped: a CUDA driver is present (tests/cuda_checkpoint.rs covers pinned)");
        return;
    }
    let dir = TempDir::new("pinned");
    let p = dir.file(
        "p.safetensors",
        &reference_bytes(&[owned("w", Dtype::U8, &[8], 1)]),
    );
    let fe = FileEngine::new(FileConfig::new().threads(1)).unwrap();
    let e = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pinned)).unwrap_err();
    assert!(matches!(e, CheckpointError::Alloc { .. }), "{e}");
}

/// `Target::Device` is the GPU of the file engine's CUDA engine: a file engine without one,
/// or with an engine of no single GPU, is `NoDevice` before anything is allocated (without a
/// driver an allocation would be `Alloc`; with one, it would be a buffer freed unused).
#[test]
fn device_target_without_a_gpu_engine_is_no_device_before_any_allocation() {
    let dir = TempDir::new("no-device");
    let p = dir.file(
        "p.safetensors",
        &reference_bytes(&[owned("w", Dtype::U8, &[8], 1)]),
    );
    let cfg = FileConfig::new().threads(1);
    let cpu = std::sync::Arc::new(ferry::CpuEngine::new(1).unwrap());
    let cases = [
        ("no engine", FileEngine::new(cfg).unwrap(), "no CUDA engine"),
        (
            "cpu engine",
            FileEngine::with_engine(cfg, cpu).unwrap(),
            "is not one GPU's",
        ),
    ];
    for (ctx, fe, words) in cases {
        for placement in [Placement::Packed, Placement::PerTensor] {
            let opts = LoadOptions::new(Target::Device).placement(placement);
            let e = checkpoint::load(&fe, &p, &opts).unwrap_err();
            assert!(
                matches!(&e, CheckpointError::NoDevice { path, .. } if path == &p),
                "{ctx}: {e}"
            );
            assert!(e.to_string().contains(words), "{ctx}: {e}");
            assert_eq!(e.path(), Some(p.as_path()));
        }
    }
}

/// A load to pageable memory, seen through the typed views: host views with bytes and typed
/// slices (every `Element` type, its dtype checked), no device view, `Memory` for a save.
#[test]
fn host_views_give_bytes_and_typed_slices_of_the_matching_dtype() {
    use checkpoint::{Element, TensorView};
    let dir = TempDir::new("views");
    let want = vec![
        owned("u8", Dtype::U8, &[5], 1),
        owned("i8", Dtype::I8, &[3], 2),
        owned("u16", Dtype::U16, &[3], 3),
        owned("i16", Dtype::I16, &[2, 2], 4),
        owned("u32", Dtype::U32, &[3], 5),
        owned("i32", Dtype::I32, &[], 6),
        owned("u64", Dtype::U64, &[2], 7),
        owned("i64", Dtype::I64, &[1, 2], 8),
        owned("f16", Dtype::F16, &[3], 9),
        owned("bf16", Dtype::BF16, &[5, 1], 10),
        owned("f32", Dtype::F32, &[2, 3], 11),
        owned("f64", Dtype::F64, &[0, 4], 12),
        owned("bool", Dtype::BOOL, &[3], 13),
    ];
    let p = dir.file("v.safetensors", &reference_bytes(&want));
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    fn typed<T: Element>(ck: &checkpoint::Checkpoint, w: &Owned, ctx: &str) {
        let v = ck.host(&w.name).unwrap();
        if w.dtype == T::DTYPE {
            let got = v.as_slice::<T>().unwrap_or_else(|e| panic!("{ctx}: {e}"));
            // The same memory, every element (compared as bytes: random bits hold NaNs).
            assert_eq!(got.len(), w.data.len() / std::mem::size_of::<T>(), "{ctx}");
            assert_eq!(got.as_ptr().cast::<u8>(), v.bytes().as_ptr(), "{ctx}");
            assert_eq!(
                ferry::bytemuck::cast_slice::<T, u8>(got),
                &w.data[..],
                "{ctx}"
            );
        } else {
            let Err(e) = v.as_slice::<T>() else {
                panic!("{ctx}: {} ({}) read as {}", w.name, w.dtype, T::DTYPE)
            };
            assert!(
                matches!(&e, CheckpointError::View { tensor, .. } if tensor == &w.name),
                "{ctx}: {e}"
            );
            assert!(e.to_string().contains("its dtype is"), "{ctx}: {e}");
        }
    }
    for placement in [Placement::Packed, Placement::PerTensor] {
        let ctx = format!("{placement:?}");
        let ck = checkpoint::load(
            &fe,
            &p,
            &LoadOptions::new(Target::Pageable).placement(placement),
        )
        .unwrap();
        for w in &want {
            let v = ck
                .host(&w.name)
                .unwrap_or_else(|| panic!("{ctx}: {}", w.name));
            assert_eq!(v.bytes(), &w.data[..], "{ctx}: {}", w.name);
            assert_eq!((v.dtype(), v.shape()), (w.dtype, &w.shape[..]), "{ctx}");
            assert_eq!((v.len(), v.is_empty()), (w.data.len(), w.data.is_empty()));
            assert_eq!(v.kind(), ferry::MemKind::Pageable);
            assert_eq!(v.tensor().name, w.name);
            let raw = ferry::Memory::raw(&v);
            assert_eq!(
                (raw.addr, raw.len, raw.kind),
                (
                    v.bytes().as_ptr() as u64,
                    w.data.len(),
                    ferry::MemKind::Pageable
                )
            );
            assert!(ck.device(&w.name).is_none(), "{ctx}: host memory");
            let TensorView::Host(h) = ck.view(&w.name).unwrap() else {
                panic!("{ctx}: {} is in host memory", w.name)
            };
            assert_eq!(h.bytes(), v.bytes());
            typed::<u8>(&ck, w, &ctx);
            typed::<i8>(&ck, w, &ctx);
            typed::<u16>(&ck, w, &ctx);
            typed::<i16>(&ck, w, &ctx);
            typed::<u32>(&ck, w, &ctx);
            typed::<i32>(&ck, w, &ctx);
            typed::<u64>(&ck, w, &ctx);
            typed::<i64>(&ck, w, &ctx);
            typed::<half::f16>(&ck, w, &ctx);
            typed::<half::bf16>(&ck, w, &ctx);
            typed::<f32>(&ck, w, &ctx);
            typed::<f64>(&ck, w, &ctx);
        }
        assert!(ck.view("nope").is_none() && ck.host("nope").is_none());
        // The views are `Memory`: saved from them, the file is the same.
        let views: Vec<_> = want.iter().map(|w| ck.view(&w.name).unwrap()).collect();
        let save: Vec<SaveTensor<'_>> = views
            .iter()
            .map(|v| SaveTensor::new(&v.tensor().name, v.tensor().dtype, &v.tensor().shape, v))
            .collect();
        let out = dir.0.join("views-out.safetensors");
        checkpoint::save(&fe, &out, &save, &SaveOptions::new()).unwrap();
        let back = checkpoint::load(&fe, &out, &LoadOptions::new(Target::Pageable)).unwrap();
        check_loaded(&back, &want, &format!("{ctx}: saved from views"));
    }
}

/// A tensor at an offset in the file that is not a multiple of its element size stays so in
/// a packed load: its typed slice is a `View` error (its bytes are there); in its own
/// allocation (per tensor) it is aligned and the slice is given.
#[test]
fn typed_slice_of_a_misaligned_tensor_is_a_view_error() {
    let dir = TempDir::new("misaligned");
    let header = concat!(
        r#"{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"#,
        r#""w":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}}"#
    );
    let mut data = vec![7u8, 8, 9];
    data.extend_from_slice(ferry::bytemuck::cast_slice(&[1.5f32, -2.0]));
    let p = dir.file("m.safetensors", &raw_file(header, &data));
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let ck = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pageable)).unwrap();
    let w = ck.host("w").unwrap();
    assert_eq!(w.bytes(), &data[3..]);
    let e = w.as_slice::<f32>().unwrap_err();
    assert!(
        matches!(&e, CheckpointError::View { tensor, path, .. } if tensor == "w" && path == &p),
        "{e}"
    );
    assert!(e.to_string().contains("cannot be read as f32"), "{e}");
    assert_eq!(ck.host("a").unwrap().as_slice::<u8>().unwrap(), &[7, 8, 9]);
    let opts = LoadOptions::new(Target::Pageable).placement(Placement::PerTensor);
    let ck = checkpoint::load(&fe, &p, &opts).unwrap();
    assert_eq!(
        ck.host("w").unwrap().as_slice::<f32>().unwrap(),
        &[1.5, -2.0]
    );
}

#[test]
fn progress_is_reported_in_batches_and_the_bytes_still_match() {
    let dir = TempDir::new("progress");
    // 140 MiB: batches of 64 MiB split the large tensor across three of them.
    let want = vec![
        owned("small", Dtype::U8, &[1000], 1),
        owned("big", Dtype::F32, &[25 << 20], 2),
        owned("tail", Dtype::U8, &[(40 << 20) + 3], 3),
    ];
    let path = dir.file("p.safetensors", &reference_bytes(&want));
    let fe = FileEngine::new(FileConfig::new().threads(3)).unwrap();
    for placement in [Placement::Packed, Placement::PerTensor] {
        let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let c = calls.clone();
        let opts = LoadOptions::new(Target::Pageable)
            .placement(placement)
            .progress(move |done, total| c.lock().unwrap().push((done, total)));
        let ck = checkpoint::load(&fe, &path, &opts).unwrap();
        check_loaded(&ck, &want, &format!("{placement:?}"));
        let calls = calls.lock().unwrap();
        let total = ck.report().bytes;
        assert!(calls.len() >= 3, "{placement:?}: {calls:?}");
        assert!(calls.windows(2).all(|w| w[0].0 < w[1].0), "{calls:?}");
        assert_eq!(calls.last(), Some(&(total, total)), "{placement:?}");
    }
}

/// Destinations for `want`, filled with a pattern no tensor has (0xA5).
fn sentinels(want: &[Owned]) -> Vec<Vec<u8>> {
    want.iter().map(|w| vec![0xA5u8; w.data.len()]).collect()
}

#[test]
fn load_into_fills_the_callers_memory_for_every_dtype() {
    let dir = TempDir::new("into-every");
    let want = every_dtype();
    let path = dir.file("every.safetensors", &reference_bytes(&want));
    for (name, fe) in engines() {
        let mut outs = sentinels(&want);
        let mut dests: Vec<Dest<'_>> = want
            .iter()
            .zip(outs.iter_mut())
            .map(|(w, o)| Dest::new(w.name.clone(), o).dtype(w.dtype).shape(&w.shape))
            .collect();
        let r = checkpoint::load_into(&fe, &path, &mut dests).unwrap();
        drop(dests);
        for (w, o) in want.iter().zip(&outs) {
            assert!(o == &w.data, "{name}: tensor {} differs", w.name);
        }
        let nonempty = want.iter().filter(|w| !w.data.is_empty()).count();
        assert_eq!(
            (r.tensors, r.reads, r.allocations, r.files),
            (want.len(), nonempty, 0, 1),
            "{name}"
        );
        assert_eq!(
            r.bytes,
            want.iter().map(|w| w.data.len() as u64).sum::<u64>()
        );
    }
}

#[test]
fn load_into_a_subset_of_a_sharded_checkpoint() {
    let dir = TempDir::new("into-sharded");
    let (index, want) = sharded(&dir);
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    // One tensor from each shard, in the opposite order of the files, into typed memory.
    let (b3, a4) = (&want[13], &want[4]);
    assert_eq!((b3.name.as_str(), a4.name.as_str()), ("b.3", "a.4"));
    let mut bf = vec![0u16; b3.data.len() / 2];
    let mut f = vec![0f32; a4.data.len() / 4];
    let r = checkpoint::load_into(
        &fe,
        &index,
        &mut [
            Dest::new("b.3", &mut bf).dtype(Dtype::BF16),
            Dest::new("a.4", &mut f).shape(&[5]),
        ],
    )
    .unwrap();
    assert_eq!(bytemuck::cast_slice::<u16, u8>(&bf), &b3.data[..]);
    assert_eq!(bytemuck::cast_slice::<f32, u8>(&f), &a4.data[..]);
    assert_eq!((r.tensors, r.files, r.allocations), (2, 2, 0));
    // Reloading into the same memory: no allocation, same bytes.
    bf.fill(0);
    checkpoint::load_into(&fe, &index, &mut [Dest::new("b.3", &mut bf)]).unwrap();
    assert_eq!(bytemuck::cast_slice::<u16, u8>(&bf), &b3.data[..]);
}

#[test]
fn load_into_refuses_what_does_not_fit_before_writing_anything() {
    let dir = TempDir::new("into-bad");
    let want = vec![
        owned("w", Dtype::F32, &[2, 3], 1),
        owned("b", Dtype::BF16, &[3], 2),
    ];
    let path = dir.file("m.safetensors", &reference_bytes(&want));
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    // Each case: destinations for "w" (24 bytes) and something wrong; both untouched after.
    type Case<'c> = &'c mut dyn FnMut(
        &mut [u8],
        &mut Vec<u8>,
    ) -> Result<checkpoint::LoadReport, CheckpointError>;
    let run = |case: &str, wrong: Case<'_>| {
        let mut good = vec![0xA5u8; 24];
        let mut other = vec![0xA5u8; 6];
        let e = wrong(&mut good, &mut other).unwrap_err();
        assert!(
            good.iter().all(|&b| b == 0xA5),
            "{case}: the good destination was written"
        );
        assert!(
            other.iter().all(|&b| b == 0xA5),
            "{case}: the bad destination was written"
        );
        assert_eq!(e.path(), Some(path.as_path()), "{case}: {e}");
        e
    };
    let e = run("missing", &mut |g, o| {
        checkpoint::load_into(&fe, &path, &mut [Dest::new("w", g), Dest::new("nope", o)])
    });
    assert!(
        matches!(&e, CheckpointError::Missing { tensor, .. } if tensor == "nope"),
        "{e}"
    );
    let e = run("twice", &mut |g, o| {
        checkpoint::load_into(&fe, &path, &mut [Dest::new("w", g), Dest::new("w", o)])
    });
    assert!(
        matches!(&e, CheckpointError::Destination { tensor, msg, .. } if tensor == "w" && msg.contains("twice")),
        "{e}"
    );
    let e = run("short", &mut |g, o| {
        o.truncate(5);
        checkpoint::load_into(&fe, &path, &mut [Dest::new("w", g), Dest::new("b", o)])
    });
    assert_eq!(
        e.to_string(),
        format!(
            "{}: tensor `b`: the destination holds 5 bytes, the tensor 6 (BF16 [3])",
            path.display()
        )
    );
    let e = run("dtype", &mut |g, o| {
        checkpoint::load_into(
            &fe,
            &path,
            &mut [Dest::new("w", g), Dest::new("b", o).dtype(Dtype::F16)],
        )
    });
    assert!(
        e.to_string()
            .ends_with("the destination expects F16, the tensor is BF16"),
        "{e}"
    );
    let e = run("shape", &mut |g, o| {
        checkpoint::load_into(
            &fe,
            &path,
            &mut [Dest::new("w", g).shape(&[3, 2]), Dest::new("b", o)],
        )
    });
    assert_eq!(e.tensor(), Some("w"), "{e}");
    assert!(
        e.to_string()
            .contains("expects shape [3, 2], the tensor's is [2, 3]"),
        "{e}"
    );
    // A bad file is the load's own error, the destinations untouched.
    let bad = dir.file(
        "bad.safetensors",
        &raw_file(
            r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#,
            &[0; 10],
        ),
    );
    let mut g = vec![0xA5u8; 24];
    let e = checkpoint::load_into(&fe, &bad, &mut [Dest::new("w", &mut g)]).unwrap_err();
    assert!(matches!(e, CheckpointError::OutsideData { .. }), "{e}");
    assert!(g.iter().all(|&b| b == 0xA5));
}

/// Host memory that says it is GPU 0's: nothing may write it through a host-only engine.
struct ClaimsDevice(Vec<u8>);
// SAFETY: the bytes of the Vec, valid while borrowed; only its kind is false, and the test
// checks that no engine touches it.
unsafe impl ferry::Memory for ClaimsDevice {
    fn raw(&self) -> ferry::RawBuf {
        ferry::RawBuf {
            addr: self.0.as_ptr() as u64,
            len: self.0.len(),
            kind: ferry::MemKind::Device { ordinal: 0 },
        }
    }
}
// SAFETY: as above; `&mut self` is exclusive.
unsafe impl ferry::MemoryMut for ClaimsDevice {
    fn raw_mut(&mut self) -> ferry::RawBuf {
        ferry::Memory::raw(self)
    }
}

#[test]
fn load_into_memory_the_engine_cannot_reach_is_refused_before_any_read() {
    let dir = TempDir::new("into-reach");
    let want = vec![
        owned("a", Dtype::U8, &[1 << 20], 1),
        owned("b", Dtype::U8, &[4096], 2),
    ];
    let path = dir.file("m.safetensors", &reference_bytes(&want));
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let mut a = vec![0xA5u8; 1 << 20];
    let mut b = ClaimsDevice(vec![0xA5u8; 4096]);
    let e = checkpoint::load_into(
        &fe,
        &path,
        &mut [Dest::new("a", &mut a), Dest::new("b", &mut b)],
    )
    .unwrap_err();
    assert!(
        matches!(&e, CheckpointError::File { tensor: Some(t), source: FileError::Unsupported { .. }, .. } if t == "b"),
        "{e}"
    );
    assert!(
        a.iter().all(|&x| x == 0xA5),
        "a was read before b was refused"
    );
    assert!(b.0.iter().all(|&x| x == 0xA5));
    // The file engine's own many-piece call checks every buffer first as well.
    let f = fe.open(&path, OpenMode::Read).unwrap();
    let e = fe
        .load_each(&mut [
            ferry::file::ReadInto::new(&f, 0, &mut a),
            ferry::file::ReadInto::new(&f, 0, &mut b),
        ])
        .unwrap_err();
    assert!(matches!(e, FileError::Unsupported { .. }), "{e}");
    assert!(
        a.iter().all(|&x| x == 0xA5),
        "a was read before b was refused"
    );
    // No files at all: nothing to load, and a name is missing.
    let r = checkpoint::load_files_into(&fe, &[], &mut []).unwrap();
    assert_eq!((r.tensors, r.bytes, r.files), (0, 0, 0));
    let e = checkpoint::load_files_into(&fe, &[], &mut [Dest::new("a", &mut a)]).unwrap_err();
    assert!(matches!(e, CheckpointError::Missing { .. }), "{e}");
}

/// A header that names a tensor twice is refused as such: serde_json's map kept the last of
/// the two silently, and the load failed on a gap in the data section instead. The same for
/// an index that lists a tensor twice, and for `entries`.
#[test]
fn a_name_given_twice_is_refused_as_such() {
    let dir = TempDir::new("twice");
    let fe = FileEngine::new(FileConfig::new().threads(1)).unwrap();
    let a = |b: u32, e: u32| {
        format!("\"a\":{{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[{b},{e}]}}")
    };
    for (name, header) in [
        ("two", format!("{{{},{}}}", a(0, 4), a(4, 8))),
        ("same", format!("{{{},{}}}", a(0, 4), a(0, 4))),
        (
            "meta",
            format!(
                "{{\"__metadata__\":{{}},{},\"__metadata__\":{{}}}}",
                a(0, 4)
            ),
        ),
    ] {
        let p = dir.file(&format!("{name}.safetensors"), &raw_file(&header, &[7; 8]));
        let e = load_err(&p);
        let want = if name == "meta" { "__metadata__" } else { "a" };
        assert!(
            matches!(&e, CheckpointError::Duplicate { tensor, first, second } if tensor == want && first == &p && second == &p),
            "{name}: {e:?}"
        );
        assert!(
            e.to_string()
                .ends_with(&format!("tensor `{want}` is named twice")),
            "{e}"
        );
        assert!(checkpoint::entries(&fe, &p).is_err(), "{name}");
    }
    // An index listing a tensor twice (the shard is fine).
    let (index, _) = sharded(&dir);
    let text = std::fs::read_to_string(&index).unwrap();
    let twice = text.replacen(
        "\"weight_map\":{",
        "\"weight_map\":{\"a.1\":\"model-00002-of-00002.safetensors\",",
        1,
    );
    assert_ne!(twice, text);
    let p = dir.file("twice.safetensors.index.json", twice.as_bytes());
    let e = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pageable)).unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Index { msg, .. } if msg.contains("`a.1` is listed twice")),
        "{e}"
    );
    // The original index still loads.
    checkpoint::load(&fe, &index, &LoadOptions::new(Target::Pageable)).unwrap();
}

/// A shard that an index lists and that cannot be opened is named with the index that lists
/// it and a tensor mapped to it (it was named alone, the index nowhere).
#[test]
fn a_missing_shard_names_its_index() {
    let dir = TempDir::new("gone-shard");
    let fe = FileEngine::new(FileConfig::new().threads(1)).unwrap();
    let (index, _) = sharded(&dir);
    std::fs::remove_file(dir.0.join("model-00002-of-00002.safetensors")).unwrap();
    for e in [
        checkpoint::load(&fe, &index, &LoadOptions::new(Target::Pageable)).unwrap_err(),
        checkpoint::entries(&fe, &index).unwrap_err(),
    ] {
        let CheckpointError::Shard {
            index: i,
            tensor,
            source,
        } = &e
        else {
            panic!("{e:?}")
        };
        let FileError::Open { path, kind, .. } = &**source else {
            panic!("{e:?}")
        };
        assert_eq!(i, &index);
        assert_eq!(path, &dir.0.join("model-00002-of-00002.safetensors"));
        assert!(tensor.starts_with("b."), "{e}");
        assert_eq!(*kind, io::ErrorKind::NotFound, "{e}");
        assert_eq!(e.tensor(), Some(tensor.as_str()));
        assert_eq!(e.path(), Some(index.as_path()));
        let text = e.to_string();
        assert!(text.starts_with(&index.display().to_string()), "{text}");
        assert!(text.contains("model-00002-of-00002.safetensors"), "{text}");
    }
}

/// A sharded save into a folder loads back from the folder (and from its index), every shard
/// read, into fresh memory and into the caller's; the report gives the files and the memory.
#[test]
fn a_sharded_save_loads_back_from_its_folder() {
    let dir = TempDir::new("folder-round-trip");
    let fe = FileEngine::new(FileConfig::new().threads(3)).unwrap();
    let want: Vec<Owned> = (0..40)
        .map(|i| owned(&format!("layer.{i}.w"), Dtype::BF16, &[64, 8 + i], i as u64))
        .collect();
    let list: Vec<SaveTensor<'_>> = want
        .iter()
        .map(|t| SaveTensor::new(&t.name, t.dtype, &t.shape, &t.data))
        .collect();
    let index = dir.0.join("model.safetensors.index.json");
    checkpoint::save(&fe, &index, &list, &SaveOptions::new().shard_bytes(8 << 10)).unwrap();
    let shards = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter(|e| {
            let e = e.as_ref().unwrap().file_name();
            let n = e.to_string_lossy();
            n.ends_with(".safetensors")
        })
        .count();
    assert!(shards >= 4, "{shards} shards");
    assert_eq!(checkpoint::resolve(&dir.0).unwrap(), index);
    for (what, path) in [("folder", &dir.0), ("index", &index)] {
        for placement in [Placement::Packed, Placement::PerTensor] {
            let ck = checkpoint::load(
                &fe,
                path,
                &LoadOptions::new(Target::Pageable).placement(placement),
            )
            .unwrap();
            check_loaded(&ck, &want, &format!("{what} {placement:?}"));
            let r = ck.report();
            assert_eq!(r.files, shards, "{what}: every shard read");
            if placement == Placement::Packed {
                assert_eq!(r.reads, shards, "{what}: one read per shard");
            }
            // Host memory, no bounce ring: no pinned bytes; the process's peak is at least
            // what it holds now.
            assert_eq!(r.pinned_bytes, 0, "{what}");
            let peak = r.peak_rss_bytes.expect("VmHWM on Linux");
            assert!(
                peak >= r.bytes,
                "{what}: peak RSS {peak} < {} loaded",
                r.bytes
            );
            assert!(r.to_string().contains("peak RSS"), "{r}");
        }
    }
    let mut back: Vec<Vec<u8>> = want.iter().map(|t| vec![0u8; t.data.len()]).collect();
    let mut dests: Vec<Dest<'_>> = want
        .iter()
        .zip(back.iter_mut())
        .map(|(t, b)| Dest::new(t.name.clone(), b).shape(&t.shape))
        .collect();
    let r = checkpoint::load_into(&fe, &dir.0, &mut dests).unwrap();
    drop(dests);
    assert_eq!((r.files, r.tensors), (shards, want.len()));
    for (t, b) in want.iter().zip(&back) {
        assert_eq!(&t.data, b, "{}", t.name);
    }
    assert_eq!(checkpoint::entries(&fe, &dir.0).unwrap().len(), want.len());
}

/// Folders: a single file found, an index preferred, none or several refused naming the folder.
#[test]
fn folders_resolve_to_their_checkpoint_or_say_why_not() {
    let fe = FileEngine::new(FileConfig::new().threads(1)).unwrap();
    let dir = TempDir::new("folders");
    let load = |p: &Path| checkpoint::load(&fe, p, &LoadOptions::new(Target::Pageable));
    // Empty: nothing to load.
    let e = load(&dir.0).unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Index { path, msg } if path == &dir.0 && msg.contains("no checkpoint")),
        "{e}"
    );
    // One file, whatever its name.
    let one = vec![owned("x", Dtype::F32, &[3], 1)];
    dir.file("weights.safetensors", &reference_bytes(&one));
    check_loaded(&load(&dir.0).unwrap(), &one, "one file");
    // Two files, neither model.safetensors: refused, both named.
    dir.file("other.safetensors", &reference_bytes(&one));
    let e = load(&dir.0).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("other.safetensors") && text.contains("weights.safetensors"),
        "{text}"
    );
    assert_eq!(e.path(), Some(dir.0.as_path()));
    // model.safetensors is the folder's.
    let model = vec![owned("m", Dtype::U8, &[5], 2)];
    dir.file("model.safetensors", &reference_bytes(&model));
    check_loaded(&load(&dir.0).unwrap(), &model, "model.safetensors");
    // An index wins over the files.
    let (index, want) = sharded(&dir);
    assert_eq!(checkpoint::resolve(&dir.0).unwrap(), index);
    check_loaded(&load(&dir.0).unwrap(), &want, "index");
    // Two indexes, neither model.safetensors.index.json: refused.
    std::fs::rename(&index, dir.0.join("a.safetensors.index.json")).unwrap();
    std::fs::copy(
        dir.0.join("a.safetensors.index.json"),
        dir.0.join("b.safetensors.index.json"),
    )
    .unwrap();
    let e = load(&dir.0).unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Index { msg, .. } if msg.contains("2 indexes")),
        "{e}"
    );
    // A file path is taken as it is.
    let f = dir.0.join("model.safetensors");
    assert_eq!(checkpoint::resolve(&f).unwrap(), f);
}

/// Through a folder: a missing shard names the index and the shard; a tensor held by two
/// shards is a duplicate naming both; a bad index is an index error. Nothing loads.
#[test]
fn a_folders_missing_shard_duplicate_or_bad_index_is_named() {
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let load = |p: &Path| checkpoint::load(&fe, p, &LoadOptions::new(Target::Pageable));
    // Duplicate: shard 2 holds `a.1` too (the index maps it to shard 1).
    let dir = TempDir::new("folder-dup");
    let (index, want) = sharded(&dir);
    let mut s2: Vec<Owned> = want
        .iter()
        .filter(|t| t.name.starts_with("b."))
        .cloned()
        .collect();
    s2.push(owned("a.1", Dtype::F32, &[2], 9));
    dir.file("model-00002-of-00002.safetensors", &reference_bytes(&s2));
    let e = load(&dir.0).unwrap_err();
    let CheckpointError::Duplicate {
        tensor,
        first,
        second,
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(tensor, "a.1");
    assert_eq!(first, &dir.0.join("model-00001-of-00002.safetensors"));
    assert_eq!(second, &dir.0.join("model-00002-of-00002.safetensors"));
    let mut x = vec![0u8; 8];
    assert!(matches!(
        checkpoint::load_into(&fe, &dir.0, &mut [Dest::new("a.1", &mut x)]),
        Err(CheckpointError::Duplicate { .. })
    ));
    assert_eq!(x, [0u8; 8], "nothing written");
    // Missing shard.
    std::fs::remove_file(dir.0.join("model-00002-of-00002.safetensors")).unwrap();
    let e = load(&dir.0).unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Shard { index: i, .. } if i == &index),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("model-00002-of-00002.safetensors"),
        "{e}"
    );
    // Bad index: not JSON.
    std::fs::write(&index, b"{\"weight_map\": ").unwrap();
    let e = load(&dir.0).unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Index { path, .. } if path == &index),
        "{e}"
    );
}
