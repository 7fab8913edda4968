//! Checkpoints with a GPU: safetensors files loaded into device and pinned memory (packed and
//! per tensor, buffered and `O_DIRECT`), every byte read back and checked; saves from device
//! memory compared byte for byte with the source file. Prints `skipped: no CUDA driver`
//! without a GPU.

mod cuda_common;
use cuda_common::*;
use ferry::checkpoint::{
    self, CheckpointError, Dtype, LoadOptions, Placement, SaveOptions, SaveTensor, Target,
    TensorBuffer, Writer,
};
use ferry::cuda::{CudaEngine, DeviceBuffer};
use ferry::file::{FileConfig, FileEngine};
use ferry::memory::Region;
use ferry::MemKind;
use std::path::PathBuf;
use std::sync::Arc;

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("ferry-cuda-ckpt-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// (name, dtype, shape, bytes) of a test checkpoint: mixed dtypes, empty and 0-d tensors,
/// sizes from a few bytes to `big` bytes.
fn tensors(big: usize) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let mut v = Vec::new();
    let shapes: [(Dtype, Vec<usize>); 8] = [
        (Dtype::F32, vec![big / 4]),
        (Dtype::BF16, vec![1024, 513]),
        (Dtype::F16, vec![0, 7]),
        (Dtype::I64, vec![]),
        (Dtype::U8, vec![3]),
        (Dtype::F64, vec![33, 65]),
        (Dtype::F8_E4M3, vec![1 << 20]),
        (Dtype::F4, vec![4098]),
    ];
    for (i, (d, s)) in shapes.into_iter().enumerate() {
        let n = checkpoint::tensor_bytes(d, &s).unwrap() as usize;
        v.push((format!("t{i}.{d}"), d, s, bytes(n, i as u64 + 1)));
    }
    v
}

/// Writes the tensors with ferry's host save; returns the path.
fn write(dir: &TempDir, name: &str, ts: &[(String, Dtype, Vec<usize>, Vec<u8>)]) -> PathBuf {
    let fe = FileEngine::new(FileConfig::new()).unwrap();
    let save: Vec<SaveTensor<'_>> = ts
        .iter()
        .map(|(n, d, s, b)| SaveTensor::new(n, *d, s, b))
        .collect();
    let p = dir.0.join(name);
    checkpoint::save(&fe, &p, &save, &SaveOptions::new()).unwrap();
    p
}

/// Every tensor of `ck` read back from wherever it lives and compared with `want`.
fn check(ck: &checkpoint::Checkpoint, want: &[(String, Dtype, Vec<usize>, Vec<u8>)], ctx: &str) {
    assert_eq!(ck.tensors().len(), want.len(), "{ctx}");
    let host: Vec<Vec<u8>> = ck
        .buffers()
        .iter()
        .map(|b| match b {
            TensorBuffer::Device(d) => d.to_vec().expect("cuMemcpyDtoH of a loaded buffer"),
            other => other.host_bytes().expect("host memory").to_vec(),
        })
        .collect();
    for (n, d, s, b) in want {
        let t = ck
            .get(n)
            .unwrap_or_else(|| panic!("{ctx}: tensor {n} missing"));
        assert_eq!((&t.dtype, &t.shape), (d, s), "{ctx}: {n}");
        let got = &host[t.buffer][t.offset..t.offset + t.len];
        if let Some(i) = got
            .iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .or((got.len() != b.len()).then_some(0))
        {
            panic!(
                "{ctx}: tensor {n} ({} bytes at buffer {} offset {}) differs at byte {i}: got {:#04x}, want {:#04x}",
                t.len, t.buffer, t.offset, got.get(i).copied().unwrap_or(0), b.get(i).copied().unwrap_or(0)
            );
        }
    }
}

/// The file at `path` holds `want`'s bytes, or the first byte that differs is named.
fn same_file(path: &std::path::Path, want: &[u8], ctx: &str) {
    let got = std::fs::read(path).unwrap();
    let diff = got.iter().zip(want).position(|(a, b)| a != b);
    assert!(
        got.len() == want.len() && diff.is_none(),
        "{ctx}: saved file differs at byte {diff:?} (len {} vs {})",
        got.len(),
        want.len()
    );
}

fn file_engines(cuda: &Arc<CudaEngine>) -> Vec<(&'static str, FileEngine)> {
    let base = FileConfig::new().threads(8).chunk_bytes(4 << 20);
    [("buffered", base), ("direct", base.direct(true))]
        .into_iter()
        .map(|(n, c)| (n, FileEngine::with_engine(c, cuda.clone()).unwrap()))
        .collect()
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn device_loads_every_placement_byte_checked() {
    let Some(cuda) = cuda_or_skip().map(Arc::new) else {
        return;
    };
    let dir = TempDir::new("device");
    let want = tensors(64 << 20);
    let p = write(&dir, "m.safetensors", &want);
    for (name, fe) in file_engines(&cuda) {
        for placement in [Placement::Packed, Placement::PerTensor] {
            let ctx = format!("{name} {placement:?}");
            let ck = checkpoint::load(
                &fe,
                &p,
                &LoadOptions::new(Target::Device).placement(placement),
            )
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            check(&ck, &want, &ctx);
            for t in ck.tensors() {
                assert_eq!(t.kind, MemKind::Device { ordinal: 0 }, "{ctx}");
                let TensorBuffer::Device(b) = &ck.buffers()[t.buffer] else {
                    panic!("{ctx}")
                };
                let v = ck.device(&t.name).expect("a device view");
                assert_eq!(
                    v.device_ptr(),
                    b.device_ptr() + t.offset as u64,
                    "{ctx}: {}",
                    t.name
                );
            }
            println!("{ctx}: {}", ck.report());
            assert!(
                ck.report().io.gds_note.is_some(),
                "{ctx}: the report says why not GDS"
            );
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn subset_and_pinned_loads_byte_checked() {
    let Some(cuda) = cuda_or_skip().map(Arc::new) else {
        return;
    };
    let dir = TempDir::new("pinned");
    let want = tensors(8 << 20);
    let p = write(&dir, "m.safetensors", &want);
    let fe = FileEngine::with_engine(FileConfig::new(), cuda).unwrap();
    let ck = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pinned)).unwrap();
    check(&ck, &want, "pinned");
    assert!(ck.tensors().iter().all(|t| t.kind == MemKind::Pinned));
    let some: Vec<_> = want
        .iter()
        .filter(|t| t.1 != Dtype::BF16)
        .cloned()
        .collect();
    let ck = checkpoint::load(
        &fe,
        &p,
        &LoadOptions::new(Target::Device).filter(|t| t.dtype != Dtype::BF16),
    )
    .unwrap();
    check(&ck, &some, "device subset");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn saves_from_device_memory_match_the_source() {
    let Some(cuda) = cuda_or_skip().map(Arc::new) else {
        return;
    };
    let dir = TempDir::new("save");
    let want = tensors(16 << 20);
    let p = write(&dir, "m.safetensors", &want);
    let src = std::fs::read(&p).unwrap();
    for (name, fe) in file_engines(&cuda) {
        for placement in [Placement::Packed, Placement::PerTensor] {
            let ctx = format!("{name} {placement:?}");
            let ck = checkpoint::load(
                &fe,
                &p,
                &LoadOptions::new(Target::Device).placement(placement),
            )
            .unwrap();
            let out = dir.0.join("out.safetensors");
            let r = ck
                .save(&fe, &out, &SaveOptions::new().fsync(true))
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            same_file(&out, &src, &ctx);
            println!("{ctx}: save {r}");
        }
    }
    // Straight from device buffers the test owns.
    let fe = FileEngine::with_engine(FileConfig::new(), cuda).unwrap();
    let a = bytes(1 << 20, 9);
    let dev = DeviceBuffer::from_host(0, &a).unwrap();
    let half = Region::of(&dev, 0..(1 << 19)).unwrap();
    let out = dir.0.join("direct.safetensors");
    checkpoint::save(
        &fe,
        &out,
        &[
            SaveTensor::new("all", Dtype::U8, &[1 << 20], &dev),
            SaveTensor::new("half", Dtype::F32, &[1 << 17], &half),
        ],
        &SaveOptions::new(),
    )
    .unwrap();
    let ck = checkpoint::load(&fe, &out, &LoadOptions::new(Target::Pageable)).unwrap();
    assert!(ck.host("all").unwrap().bytes() == &a[..]);
    assert!(ck.host("half").unwrap().bytes() == &a[..1 << 19]);
}

/// The default writer without fsync from device memory: `O_DIRECT` windows copied by the GPU
/// from the end beside buffered writes staged through the file engine's ring from the start
/// (where the page cache has room, as on the GPU hosts), one file and shards, every byte as
/// the source.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn the_default_writer_saves_device_tensors_both_ways_at_once() {
    let Some(cuda) = cuda_or_skip().map(Arc::new) else {
        return;
    };
    let dir = TempDir::new("hybrid");
    let want = tensors(300 << 20);
    let p = write(&dir, "m.safetensors", &want);
    let src = std::fs::read(&p).unwrap();
    let fe = FileEngine::with_engine(FileConfig::new(), cuda).unwrap();
    for placement in [Placement::Packed, Placement::PerTensor] {
        let ck = checkpoint::load(
            &fe,
            &p,
            &LoadOptions::new(Target::Device).placement(placement),
        )
        .unwrap();
        let out = dir.0.join("out.safetensors");
        let r = ck.save(&fe, &out, &SaveOptions::new()).unwrap();
        println!("{placement:?}: save {r}");
        assert!(
            r.writer == Writer::Hybrid || r.writer_note.contains("O_DIRECT alone"),
            "{r}"
        );
        same_file(&out, &src, &format!("{placement:?}"));
        let index = dir.0.join("s.safetensors.index.json");
        let r = ck
            .save(&fe, &index, &SaveOptions::new().shard_bytes(64 << 20))
            .unwrap();
        println!("{placement:?}: sharded save {r}");
        assert!(r.files >= 2, "{r}");
        let back = checkpoint::load(&fe, &index, &LoadOptions::new(Target::Pageable)).unwrap();
        check(&back, &want, &format!("{placement:?} sharded"));
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn device_load_without_a_cuda_engine_is_refused() {
    let Some(_cuda) = cuda_or_skip() else { return };
    let dir = TempDir::new("no-engine");
    let want = tensors(1 << 20);
    let p = write(&dir, "m.safetensors", &want);
    let fe = FileEngine::new(FileConfig::new()).unwrap();
    let e = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Device)).unwrap_err();
    assert!(matches!(&e, CheckpointError::NoDevice { .. }), "{e}");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn load_into_device_buffers_the_caller_owns() {
    let Some(cuda) = cuda_or_skip().map(Arc::new) else {
        return;
    };
    let dir = TempDir::new("into");
    let want = tensors(32 << 20);
    let p = write(&dir, "m.safetensors", &want);
    for (name, fe) in file_engines(&cuda) {
        // One device buffer per tensor (empty ones too), filled with a pattern first.
        let mut bufs: Vec<DeviceBuffer> = want
            .iter()
            .map(|(_, _, _, b)| {
                let mut d = DeviceBuffer::new(0, b.len()).unwrap();
                d.copy_from_host(&vec![0xA5; b.len()]).unwrap();
                d
            })
            .collect();
        let mut dests: Vec<checkpoint::Dest<'_>> = want
            .iter()
            .zip(bufs.iter_mut())
            .map(|((n, d, s, _), buf)| checkpoint::Dest::new(n.clone(), buf).dtype(*d).shape(s))
            .collect();
        let r = checkpoint::load_into(&fe, &p, &mut dests).unwrap();
        drop(dests);
        assert_eq!((r.allocations, r.tensors), (0, want.len()), "{name}");
        for ((n, _, _, b), buf) in want.iter().zip(&bufs) {
            assert!(&buf.to_vec().unwrap() == b, "{name}: tensor {n} differs");
        }
    }
}

/// A device load seen through the views: each tensor a `DeviceView` (no host view) on the
/// file engine's GPU, its `device_ptr` inside its buffer, its bytes read back through the
/// CUDA engine from the view (`Memory`) equal to the file's.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn device_views_read_back_through_an_engine() {
    use ferry::checkpoint::TensorView;
    use ferry::EngineExt;
    let Some(cuda) = cuda_or_skip().map(Arc::new) else {
        return;
    };
    let dir = TempDir::new("device-views");
    let want = tensors(4 << 20);
    let p = write(&dir, "m.safetensors", &want);
    let fe = FileEngine::with_engine(FileConfig::new(), cuda.clone()).unwrap();
    for placement in [Placement::Packed, Placement::PerTensor] {
        let ctx = format!("{placement:?}");
        let opts = LoadOptions::new(Target::Device).placement(placement);
        let ck = checkpoint::load(&fe, &p, &opts).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        for (n, d, s, b) in &want {
            assert!(ck.host(n).is_none(), "{ctx}: {n} is on the GPU");
            let Some(TensorView::Device(v)) = ck.view(n) else {
                panic!("{ctx}: {n}: no device view")
            };
            let t = ck.get(n).unwrap();
            assert_eq!((v.dtype(), v.shape()), (*d, &s[..]), "{ctx}: {n}");
            assert_eq!(
                (v.len(), v.is_empty()),
                (b.len(), b.is_empty()),
                "{ctx}: {n}"
            );
            assert_eq!((v.ordinal(), v.tensor().name.as_str()), (0, n.as_str()));
            let TensorBuffer::Device(buf) = &ck.buffers()[t.buffer] else {
                panic!("{ctx}: {n}: not in a device buffer")
            };
            assert_eq!(v.device_ptr(), buf.device_ptr() + t.offset as u64, "{ctx}");
            let raw = ferry::Memory::raw(&v);
            assert_eq!(
                (raw.addr, raw.len, raw.kind),
                (v.device_ptr(), b.len(), MemKind::Device { ordinal: 0 })
            );
            let mut back = vec![0u8; b.len()];
            cuda.scope(|sc| sc.memcpy(&mut back, &v)?.wait().map_err(ferry::Error::from))
                .unwrap_or_else(|e| panic!("{ctx}: {n}: {e}"));
            assert!(
                &back == b,
                "{ctx}: tensor {n} read back through its view differs"
            );
        }
        assert!(ck.device("nope").is_none());
    }
}

/// A pinned load seen through the views: host views of pinned memory (bytes, typed slices),
/// no device view.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn pinned_host_views_give_bytes_and_typed_slices() {
    let Some(cuda) = cuda_or_skip().map(Arc::new) else {
        return;
    };
    let dir = TempDir::new("pinned-views");
    let want = tensors(1 << 20);
    let p = write(&dir, "m.safetensors", &want);
    let fe = FileEngine::with_engine(FileConfig::new(), cuda).unwrap();
    let ck = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pinned)).unwrap();
    for (n, d, _, b) in &want {
        let v = ck.host(n).unwrap_or_else(|| panic!("{n}: no host view"));
        assert!(ck.device(n).is_none(), "{n} is in host memory");
        assert_eq!(
            (v.kind(), ferry::Memory::raw(&v).kind),
            (MemKind::Pinned, MemKind::Pinned)
        );
        assert!(v.bytes() == &b[..], "{n}");
        match d {
            Dtype::F32 => {
                // Compared as bytes: the random bits hold NaNs.
                let got = v.as_slice::<f32>().unwrap();
                assert_eq!(got.len(), b.len() / 4, "{n}");
                assert!(ferry::bytemuck::cast_slice::<f32, u8>(got) == &b[..], "{n}");
            }
            Dtype::BF16 => {
                assert_eq!(v.as_slice::<half::bf16>().unwrap().len(), b.len() / 2);
                assert!(v.as_slice::<half::f16>().is_err(), "{n}: bf16 is not f16");
            }
            _ => {}
        }
    }
}

/// The GPU of a device load is the file engine's: with an engine on each GPU in turn (one on
/// the null driver), every tensor lands on that engine's GPU.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn device_loads_land_on_the_file_engines_gpu() {
    if cuda_or_skip().is_none() {
        return;
    }
    let dir = TempDir::new("which-gpu");
    let want = tensors(1 << 20);
    let p = write(&dir, "m.safetensors", &want);
    let gpus = ferry::cuda::probe().devices.len() as u32;
    for o in 0..gpus {
        let cuda = Arc::new(cuda_engine(o).unwrap());
        let fe = FileEngine::with_engine(FileConfig::new(), cuda).unwrap();
        let ck = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Device)).unwrap();
        check(&ck, &want, &format!("cuda:{o}"));
        for t in ck.tensors() {
            assert_eq!(t.kind, MemKind::Device { ordinal: o }, "{}", t.name);
            assert_eq!(ck.device(&t.name).unwrap().ordinal(), o);
        }
    }
    if gpus < 2 {
        println!("skipped: the second GPU's case needs 2 GPUs ({gpus} here)");
    }
}

/// A device load's pinned memory is the file engine's bounce ring, held to the bound its
/// `FileConfig` sets (ring depth x chunk) however large the checkpoint; a pinned load adds
/// the tensors' own memory. The report gives both and the process's peak RSS.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn device_loads_hold_pinned_memory_to_the_rings_bound() {
    let Some(cuda) = cuda_or_skip().map(Arc::new) else {
        return;
    };
    let dir = TempDir::new("bound");
    let want = tensors(32 << 20);
    let p = write(&dir, "m.safetensors", &want);
    let total: u64 = want.iter().map(|t| t.3.len() as u64).sum();
    for (threads, chunk) in [(2usize, 1usize << 20), (4, 2 << 20)] {
        let ctx = format!("{threads} x {chunk}");
        let cfg = FileConfig::new()
            .threads(threads)
            .chunk_bytes(chunk)
            .cufile(ferry::file::CuFileMode::Off);
        let fe = FileEngine::with_engine(cfg, cuda.clone()).unwrap();
        let ck = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Device))
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        check(&ck, &want, &ctx);
        let r = ck.report();
        println!("{ctx}: {r}");
        assert_eq!(r.io.bounce, Some(MemKind::Pinned), "{ctx}: {r}");
        // Each buffer: the chunk, the O_DIRECT span's extra page and the alignment page.
        let bound = (threads * (chunk + 3 * 4096)) as u64;
        assert!(
            r.pinned_bytes >= (threads * chunk) as u64 && r.pinned_bytes <= bound,
            "{ctx}: {} pinned bytes, bound {bound}",
            r.pinned_bytes
        );
        assert!(
            r.pinned_bytes < total / 4,
            "{ctx}: far below the checkpoint"
        );
        assert!(r.peak_rss_bytes.is_some(), "{ctx}");
    }
    // Into pinned memory: the tensors' own allocation is pinned bytes too.
    let fe = FileEngine::with_engine(FileConfig::new(), cuda).unwrap();
    let ck = checkpoint::load(&fe, &p, &LoadOptions::new(Target::Pinned)).unwrap();
    check(&ck, &want, "pinned");
    let own: u64 = ck
        .buffers()
        .iter()
        .map(|b| ferry::Memory::raw(b).len as u64)
        .sum();
    assert!(own >= total);
    assert_eq!(ck.report().pinned_bytes, own, "{}", ck.report());
}
