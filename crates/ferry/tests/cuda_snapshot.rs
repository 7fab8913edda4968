//! Snapshot, then write, from a GPU: `checkpoint::snapshot` copies device tensors into pinned
//! host memory; the device buffers are then overwritten (a training step) while the snapshot
//! is written in the background, and the file holds the bytes of the moment of the snapshot.
//! Also a sharded save straight from device memory. Prints `skipped: no CUDA driver` without
//! a GPU. A snapshot over its memory bound ([`SaveOptions::snapshot_bytes`]) streams through
//! two pinned windows (one copied while the other is written) and writes the same bytes, with
//! either writer ([`SaveOptions::direct`]); so does an `O_DIRECT` save straight from device memory.
//! Timings (the stall vs the write) are printed: run with `--nocapture`.

mod cuda_common;
use cuda_common::*;
use ferry::checkpoint::{
    self, Checkpoint, Dtype, LoadOptions, SaveOptions, SaveTensor, Target, Writer,
};
use ferry::cuda::DeviceBuffer;
use ferry::file::{FileConfig, FileEngine};
use std::sync::Arc;

/// A file engine over GPU 0's CUDA engine; `None` (said) without a CUDA driver.
fn file_engine() -> Option<Arc<FileEngine>> {
    let cuda = Arc::new(cuda_or_skip()?);
    Some(Arc::new(
        FileEngine::with_engine(FileConfig::new(), cuda).unwrap(),
    ))
}

/// One pattern per tensor of `sizes`, the `i`-th seeded `seed + i`.
fn host_bytes(sizes: &[usize], seed: u64) -> Vec<Vec<u8>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| bytes(n, seed + i as u64))
        .collect()
}

/// Zeroes every device buffer: the training step that follows a snapshot.
fn zero(dev: &mut [DeviceBuffer]) {
    for d in dev.iter_mut() {
        d.copy_from_host(&vec![0u8; d.len()]).unwrap();
    }
}

/// Loads the checkpoint at `path` into host memory and checks each named tensor's bytes
/// against `want` (`what`: a prefix for the failure's message).
fn check_file(
    fe: &FileEngine,
    path: &std::path::Path,
    names: &[String],
    want: &[Vec<u8>],
    what: &str,
) {
    let ck = checkpoint::load(fe, path, &LoadOptions::new(Target::Pageable)).unwrap();
    for (n, w) in names.iter().zip(want) {
        assert_eq!(ck.host(n).unwrap().bytes(), &w[..], "{what}{n}");
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_snapshot_of_device_tensors_is_written_after_they_change() {
    let Some(fe) = file_engine() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // 64 bf16 tensors from 8 KiB to 8 MiB (about 170 MiB in all).
    let sizes: Vec<usize> = (0..64).map(|i| 8192 << (i % 11)).collect();
    let host: Vec<Vec<u8>> = host_bytes(&sizes, 7);
    let mut dev: Vec<DeviceBuffer> = host
        .iter()
        .map(|h| DeviceBuffer::from_host(0, h).unwrap())
        .collect();
    let names: Vec<String> = (0..64).map(|i| format!("layers.{i}.weight")).collect();
    let shapes: Vec<[usize; 1]> = sizes.iter().map(|&n| [n / 2]).collect();
    let snap = {
        let list: Vec<SaveTensor<'_>> = (0..64)
            .map(|i| SaveTensor::new(&names[i], Dtype::BF16, &shapes[i], &dev[i]))
            .collect();
        Checkpoint::snapshot(&fe, &list).unwrap()
    };
    let total: usize = sizes.iter().sum();
    println!(
        "snapshot of {total} bytes: {:.4} s ({:.2} GB/s, the caller's stall)",
        snap.report().seconds,
        total as f64 / snap.report().seconds / 1e9
    );
    // The "training step": every device tensor overwritten while the write runs.
    let t0 = std::time::Instant::now();
    let path = dir.path().join("snap.safetensors");
    let handle = snap
        .save_in_background(fe.clone(), &path, SaveOptions::new())
        .unwrap();
    zero(&mut dev);
    let r = handle.join().unwrap().unwrap();
    println!(
        "background write: {r} ({:.4} s after the snapshot)",
        t0.elapsed().as_secs_f64()
    );
    check_file(&fe, &path, &names, &host, "");
    // A sharded save straight from device memory (the zeros now), read back.
    let index = dir.path().join("model.safetensors.index.json");
    let list: Vec<SaveTensor<'_>> = (0..64)
        .map(|i| SaveTensor::new(&names[i], Dtype::BF16, &shapes[i], &dev[i]))
        .collect();
    for direct in [false, true] {
        let opts = SaveOptions::new().shard_bytes(32 << 20).direct(direct);
        let r = checkpoint::save(&fe, &index, &list, &opts).unwrap();
        println!("sharded save from the GPU: {r}");
        assert!(r.files > 1);
        assert_eq!(r.writer != Writer::Buffered, r.io.direct_bytes > 0, "{r}");
        let ck = checkpoint::load(&fe, &index, &LoadOptions::new(Target::Pageable)).unwrap();
        for n in &names {
            assert!(ck.host(n).unwrap().bytes().iter().all(|&b| b == 0), "{n}");
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_snapshot_over_its_bound_streams_from_the_gpu() {
    let Some(fe) = file_engine() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // 48 bf16 tensors from 8 KiB to 8 MiB and one of 24 MiB (about 150 MiB), a 16 MiB bound.
    let sizes: Vec<usize> = (0..48)
        .map(|i| if i == 5 { 24 << 20 } else { 8192 << (i % 11) })
        .collect();
    let host: Vec<Vec<u8>> = host_bytes(&sizes, 3);
    let mut dev: Vec<DeviceBuffer> = host
        .iter()
        .map(|h| DeviceBuffer::from_host(0, h).unwrap())
        .collect();
    let names: Vec<String> = (0..48).map(|i| format!("layers.{i}.weight")).collect();
    let shapes: Vec<[usize; 1]> = sizes.iter().map(|&n| [n / 2]).collect();
    let bound = 16 << 20;
    let path = dir.path().join("streamed.safetensors");
    for direct in [false, true] {
        for (d, h) in dev.iter_mut().zip(&host) {
            d.copy_from_host(h).unwrap();
        }
        let t0 = std::time::Instant::now();
        let handle = {
            let list: Vec<SaveTensor<'_>> = (0..48)
                .map(|i| SaveTensor::new(&names[i], Dtype::BF16, &shapes[i], &dev[i]))
                .collect();
            let opts = SaveOptions::new().snapshot_bytes(bound).direct(direct);
            Checkpoint::snapshot_save(fe.clone(), &path, &list, opts).unwrap()
        };
        let total: usize = sizes.iter().sum();
        println!(
            "streamed snapshot of {total} bytes through {bound} (O_DIRECT {direct}): the caller waited \
             waited {:.4} s",
            t0.elapsed().as_secs_f64()
        );
        zero(&mut dev);
        let r = handle.join().unwrap().unwrap();
        println!("streamed write: {r}");
        assert!(r.snapshot_bytes > 0 && r.snapshot_bytes <= bound, "{r:?}");
        check_file(&fe, &path, &names, &host, "");
    }
}

/// A training loop's saves through kept pinned memory (`SaveOptions::keep_snapshot`): each
/// step's device tensors change between saves, and every file holds its own step's bytes, the
/// snapshot within its bound (one buffer) and streamed (two windows). The list is the
/// process's and other tests here release it, so reuse is not counted, only the bytes.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn saves_in_a_loop_through_kept_pinned_memory_write_each_steps_bytes() {
    let Some(fe) = file_engine() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sizes = [8192usize, 1 << 20, 3 << 20];
    let names: Vec<String> = (0..sizes.len()).map(|i| format!("w{i}")).collect();
    let shapes: Vec<[usize; 1]> = sizes.iter().map(|&n| [n]).collect();
    let mut dev: Vec<DeviceBuffer> = sizes
        .iter()
        .map(|&n| DeviceBuffer::zeroed(0, n).unwrap())
        .collect();
    for (step, bound) in [(0u64, 64 << 20), (1, 64 << 20), (2, 1 << 20), (3, 1 << 20)] {
        let host: Vec<Vec<u8>> = host_bytes(&sizes, 100 * step);
        for (d, h) in dev.iter_mut().zip(&host) {
            d.copy_from_host(h).unwrap();
        }
        let list: Vec<SaveTensor<'_>> = (0..sizes.len())
            .map(|i| SaveTensor::new(&names[i], Dtype::U8, &shapes[i], &dev[i]))
            .collect();
        let path = dir.path().join(format!("step{step}.safetensors"));
        let opts = SaveOptions::new().keep_snapshot(true).snapshot_bytes(bound);
        let h = Checkpoint::snapshot_save(fe.clone(), &path, &list, opts).unwrap();
        drop(list);
        zero(&mut dev); // the next step begins
        h.join().unwrap().unwrap();
        check_file(&fe, &path, &names, &host, &format!("step {step}: "));
    }
}

/// One snapshot of device and host tensors mixed, interleaved in the list: the device ones
/// copied on the GPU's engine, the host ones on CPU threads, each into its own place of one
/// pinned buffer; the file holds every tensor's bytes.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_snapshot_of_device_and_host_tensors_mixed_holds_every_tensor() {
    let Some(fe) = file_engine() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sizes = [4096usize, 100_000, 2 << 20, 12_345, 3 << 20, 1];
    let host: Vec<Vec<u8>> = host_bytes(&sizes, 900);
    // Even indices on the GPU, odd ones in host memory.
    let dev: Vec<Option<DeviceBuffer>> = host
        .iter()
        .enumerate()
        .map(|(i, h)| (i % 2 == 0).then(|| DeviceBuffer::from_host(0, h).unwrap()))
        .collect();
    let names: Vec<String> = (0..sizes.len()).map(|i| format!("t{i}")).collect();
    let shapes: Vec<[usize; 1]> = sizes.iter().map(|&n| [n]).collect();
    let list: Vec<SaveTensor<'_>> = (0..sizes.len())
        .map(|i| {
            let data: &dyn ferry::Memory = match &dev[i] {
                Some(d) => d,
                None => &host[i],
            };
            SaveTensor::new(&names[i], Dtype::U8, &shapes[i], data)
        })
        .collect();
    let snap = Checkpoint::snapshot(&fe, &list).unwrap();
    drop(list);
    let path = dir.path().join("mixed.safetensors");
    snap.save(&fe, &path, &SaveOptions::new()).unwrap();
    check_file(&fe, &path, &names, &host, "");
}
