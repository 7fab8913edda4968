//! cuFile (GPUDirect Storage) with a GPU: file -> device and device -> file by `cuFileRead` /
//! `cuFileWrite` under `CuFileMode::On`, every byte checked against the file, at sizes around
//! the 4 KiB block and at aligned and unaligned offsets; a file that shrinks during a load; a
//! store to a read-only handle (cuFile's error kept); what `Auto` and `Off` choose. Without
//! `nvidia-fs` (the H200 host) cuFile runs in its compatibility mode: the tests set
//! `CUFILE_FORCE_COMPAT_MODE=true` before the first driver open. Prints `skipped: no CUDA
//! driver` without a GPU, `skipped: null CUDA driver: ...` on the null driver (CI),
//! `skipped: no cuFile` without `libcufile`.

mod cuda_common;
mod files_common;
use cuda_common::*;
use ferry::cuda::{CudaEngine, DeviceBuffer};
use ferry::file::{
    gds_probe, CuFileMode, FileConfig, FileEngine, FileError, OpenMode, Transport, NO_NVIDIA_FS,
};
use files_common::TempDir;
use std::sync::{Arc, Mutex, MutexGuard, Once};

static LOCK: Mutex<()> = Mutex::new(());
fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A CUDA engine on device 0 with cuFile usable, or `None` after printing why not. Without
/// `nvidia-fs`, cuFile is told to run in its compatibility mode (before any driver open).
fn cufile_or_skip() -> Option<Arc<CudaEngine>> {
    let cuda = cuda_or_skip()?;
    if skip_on_null_driver("cuFile calls the CUDA driver itself, for what the null driver lacks") {
        return None;
    }
    // Before libcufile is loaded (gds_probe loads it), in case it reads them then.
    static ENV: Once = Once::new();
    ENV.call_once(|| {
        if !gds_probe().nvidia_fs {
            std::env::set_var("CUFILE_FORCE_COMPAT_MODE", "true");
        }
        std::env::set_var(
            "CUFILE_LOGFILE_PATH",
            std::env::temp_dir().join("ferry-cuda-cufile.log"),
        );
    });
    let p = gds_probe();
    if !p.libcufile {
        println!("skipped: no cuFile");
        return None;
    }
    println!(
        "nvidia-fs loaded: {}; Auto would choose {}",
        p.nvidia_fs, p.auto
    );
    Some(Arc::new(cuda))
}

/// As [`cufile_or_skip`], and `None` (after printing why) where cuFile registers no file.
fn registering_cufile_or_skip() -> Option<Arc<CudaEngine>> {
    let cuda = cufile_or_skip()?;
    // Whether cuFile registers a file here at all. On the H200 host it registers none, compat
    // mode included: libcufile finds no udev data for the disk (no /run/udev; its log says
    // "udev property not found: ID_FS_USAGE vda ... failed to allocate file object"). Then
    // ferry must fall back to the bounce ring with cuFile's reason and move every byte right;
    // that is checked here, and the cuFile-only checks print why they were skipped. With the
    // udev records written (`scripts/cufile-udev.sh`), cuFile registers files there and every
    // check below runs.
    let dir = TempDir::new("cufile-probe");
    let data = bytes(3 << 12, 9);
    let t = dir.file("probe", &data);
    let fe = engine(&cuda, CuFileMode::On);
    let f = fe.open(&t, OpenMode::Read).expect("open the probe file");
    let mut dev = DeviceBuffer::zeroed(0, data.len()).unwrap();
    let r = fe
        .load_into(&f, 0, &mut dev)
        .unwrap_or_else(|e| panic!("probe load: {e}"));
    check("probe load", &dev.to_vec().unwrap(), &data);
    if r.transport != on_transport() {
        let note = r.gds_note.clone().unwrap_or_default();
        assert!(
            matches!(r.transport, Transport::BounceRing) && note.contains("cuFile"),
            "a refused cuFile falls back to the bounce ring with cuFile's reason: {r}"
        );
        println!("skipped: cuFile registers no file on this host (bounce ring used, bytes checked): {note}");
        return None;
    }
    Some(cuda)
}

/// The transport `On` gives on this host.
fn on_transport() -> Transport {
    Transport::CuFile {
        compat: !gds_probe().nvidia_fs,
    }
}

fn engine(cuda: &Arc<CudaEngine>, mode: CuFileMode) -> FileEngine {
    let cfg = FileConfig::new()
        .threads(4)
        .chunk_bytes(1 << 20)
        .cufile(mode);
    FileEngine::with_engine(cfg, cuda.clone()).unwrap()
}

const SIZES: [usize; 6] = [0, 1, 4095, 4097, (1 << 20) + 7, 64 << 20];
const OFFSETS: [u64; 3] = [0, 4096, 4099];

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn file_to_device_through_cufile_every_byte() {
    let _g = serial();
    let Some(cuda) = registering_cufile_or_skip() else {
        return;
    };
    let dir = TempDir::new("cufile");
    let data = bytes((64 << 20) + 8192, 3);
    let t = dir.file("load", &data);
    let fe = engine(&cuda, CuFileMode::On);
    let f = fe.open(&t, OpenMode::Read).unwrap();
    for len in SIZES {
        for off in OFFSETS {
            let at = off as usize;
            let mut dev = DeviceBuffer::zeroed(0, len).unwrap();
            let r = fe
                .load_into(&f, off, &mut dev)
                .unwrap_or_else(|e| panic!("load of {len} bytes at {off}: {e}"));
            let got = dev.to_vec().unwrap();
            if let Some(i) = first_diff(&got, &data[at..at + len]) {
                panic!(
                    "load of {len} bytes at {off}: first wrong byte at {i} (got {:?}, file {:?}); {r}",
                    got.get(i),
                    data.get(at + i)
                );
            }
            assert_eq!(r.transport, on_transport(), "{len} at {off}: {r}");
            assert_eq!(
                (r.bytes, r.cufile_bytes),
                (len as u64, len as u64),
                "{len} at {off}: {r}"
            );
            if len >= 1 << 20 {
                println!("load {len} at {off}: {r}");
            }
        }
    }
    // cuFile needs no bounce buffers.
    assert_eq!(fe.bounce_buffers(), 0);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn device_to_file_through_cufile_every_byte() {
    let _g = serial();
    let Some(cuda) = registering_cufile_or_skip() else {
        return;
    };
    let dir = TempDir::new("cufile");
    let fe = engine(&cuda, CuFileMode::On);
    let mut sizes = SIZES.to_vec();
    sizes.push(1 << 20);
    for len in sizes {
        for off in OFFSETS {
            let at = off as usize;
            // The file around the range must stay as it was.
            let before = bytes(at + len + 100, 5);
            let t = dir.file(&format!("store-{len}-{off}"), &before);
            let f = fe.open(&t, OpenMode::ReadWrite).unwrap();
            let src = bytes(len, 7 + len as u64);
            let dev = DeviceBuffer::from_host(0, &src).unwrap();
            let r = fe
                .store_from(&f, off, &dev)
                .unwrap_or_else(|e| panic!("store of {len} bytes at {off}: {e}"));
            drop(f);
            let mut want = before.clone();
            want[at..at + len].copy_from_slice(&src);
            let got = std::fs::read(&t).unwrap();
            if let Some(i) = first_diff(&got, &want) {
                panic!(
                    "store of {len} bytes at {off}: first wrong byte of the file at {i} \
                     (file {} bytes, want {}); {r}",
                    got.len(),
                    want.len()
                );
            }
            // Stores whose range is not 4 KiB-aligned at both ends go through the ring.
            let aligned = off % 4096 == 0 && len % 4096 == 0;
            let want_t = if aligned {
                on_transport()
            } else {
                Transport::BounceRing
            };
            assert_eq!(r.transport, want_t, "{len} at {off}: {r}");
            assert_eq!(
                r.cufile_bytes,
                if aligned { len as u64 } else { 0 },
                "{len} at {off}: {r}"
            );
            if len >= 1 << 20 {
                println!("store {len} at {off}: {r}");
            }
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn missing_truncated_and_shrinking_files_are_errors_that_name_the_file() {
    let _g = serial();
    let Some(cuda) = registering_cufile_or_skip() else {
        return;
    };
    let dir = TempDir::new("cufile");
    let fe = engine(&cuda, CuFileMode::On);
    let missing = std::env::temp_dir().join("ferry-cuda-cufile-no-such-file");
    match fe.open(&missing, OpenMode::Read) {
        Err(FileError::Open { path, .. }) => assert_eq!(path, missing),
        other => panic!("open of a missing file: {other:?}"),
    }
    // A range beyond the end: refused at submit, nothing read.
    let t = dir.file("short", &bytes(100_000, 9));
    let f = fe.open(&t, OpenMode::Read).unwrap();
    let mut dev = DeviceBuffer::zeroed(0, 200_000).unwrap();
    match fe.load_into(&f, 0, &mut dev) {
        Err(e @ FileError::OutOfRange { .. }) => {
            assert!(e.to_string().contains(&*t.to_string_lossy()), "{e}")
        }
        other => panic!("load beyond the end: {other:?}"),
    }
    // A file that shrinks while it loads: cuFileRead finds the end inside the range.
    let len = 128 << 20;
    let t = dir.file("shrink", &bytes(len, 11));
    let fe1 = FileEngine::with_engine(
        FileConfig::new()
            .threads(1)
            .chunk_bytes(16 << 10)
            .cufile(CuFileMode::On),
        cuda.clone(),
    )
    .unwrap();
    let f = fe1.open(&t, OpenMode::Read).unwrap();
    let dev = DeviceBuffer::zeroed(0, len).unwrap();
    let tr = fe1.load(&f, 0, dev).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&t)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    match tr.wait() {
        Err(failed) => {
            let e = failed.error;
            println!("shrunk during the load: {e}");
            assert!(
                matches!(
                    e,
                    FileError::UnexpectedEof { .. } | FileError::CuFile { .. }
                ),
                "{e:?}"
            );
            assert!(e.to_string().contains(&*t.to_string_lossy()), "{e}");
        }
        Ok((_, r)) => println!("the load finished before the file shrank (not checked): {r}"),
    }
    // The engine still works after a failure (the buffer was deregistered, the handle kept).
    let data = bytes(1 << 20, 13);
    let t2 = dir.file("after", &data);
    let f2 = fe1.open(&t2, OpenMode::Read).unwrap();
    let mut dev = DeviceBuffer::zeroed(0, data.len()).unwrap();
    let r = fe1.load_into(&f2, 0, &mut dev).unwrap();
    assert!(dev.to_vec().unwrap() == data, "{r}");
    assert_eq!(r.transport, on_transport(), "{r}");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_store_to_a_read_only_handle_keeps_cufiles_error() {
    let _g = serial();
    let Some(cuda) = registering_cufile_or_skip() else {
        return;
    };
    let dir = TempDir::new("cufile");
    let fe = engine(&cuda, CuFileMode::On);
    let t = dir.file("ro", &bytes(1 << 20, 15));
    let f = fe.open(&t, OpenMode::Read).unwrap();
    let dev = DeviceBuffer::from_host(0, &bytes(1 << 20, 17)).unwrap();
    match fe.store_from(&f, 0, &dev) {
        Err(e @ FileError::CuFile { .. }) => {
            println!("{e}");
            assert!(e.to_string().contains("cuFileWrite"), "{e}");
        }
        other => panic!("store through a read-only handle: {other:?}"),
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn auto_and_off_choose_as_the_host_allows_and_say_why() {
    let _g = serial();
    let Some(cuda) = cufile_or_skip() else { return };
    let dir = TempDir::new("cufile");
    let data = bytes(3 << 20, 19);
    let t = dir.file("modes", &data);
    for mode in [CuFileMode::Auto, CuFileMode::Off] {
        let fe = engine(&cuda, mode);
        let f = fe.open(&t, OpenMode::Read).unwrap();
        let mut dev = DeviceBuffer::zeroed(0, data.len()).unwrap();
        let r = fe.load_into(&f, 0, &mut dev).unwrap();
        assert!(dev.to_vec().unwrap() == data, "{mode}: {r}");
        println!("{mode}: {r}");
        let note = r.gds_note.clone().unwrap_or_default();
        match (mode, gds_probe().nvidia_fs) {
            (CuFileMode::Off, _) => {
                assert_eq!(r.transport, Transport::BounceRing, "{r}");
                assert!(note.contains("FERRY_CUFILE=off"), "{r}");
            }
            (_, false) => {
                assert_eq!(r.transport, Transport::BounceRing, "{r}");
                assert!(note.ends_with(NO_NVIDIA_FS), "{r}");
            }
            (_, true) => assert_eq!(r.transport, Transport::CuFile { compat: false }, "{r}"),
        }
    }
}
