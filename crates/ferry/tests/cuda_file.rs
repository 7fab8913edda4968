//! The file path with a GPU: file -> device and device -> file through the pinned bounce ring
//! and the CUDA engine, every byte checked; loads into every buffer kind; a read error in the
//! middle of a device load (reported, nothing leaked, engine usable after). Prints
//! `skipped: no CUDA driver` without a GPU.

mod cuda_common;
mod threads_common;
use cuda_common::*;
use ferry::cuda::{CudaEngine, DeviceBuffer};
use ferry::file::{
    live_bounce_buffers, FileConfig, FileEngine, FileError, FileHandle, FileIo, OpenMode,
};
use ferry::MemKind;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use threads_common::threads_now;

static LOCK: Mutex<()> = Mutex::new(());
fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

struct Temp(PathBuf);
impl Temp {
    fn new(tag: &str, data: &[u8]) -> Temp {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "ferry-cuda-file-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&p, data).expect("write temp file");
        Temp(p)
    }
}
impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn engines() -> Option<Arc<CudaEngine>> {
    cuda_or_skip().map(Arc::new)
}

fn configs() -> Vec<(&'static str, FileConfig)> {
    let base = FileConfig::new().threads(4).chunk_bytes(1 << 20);
    vec![
        ("buffered", base),
        ("direct", base.direct(true)),
        (
            "small chunks",
            FileConfig::new().threads(3).chunk_bytes(12_345),
        ),
    ]
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn file_to_device_every_byte() {
    let _g = serial();
    let Some(cuda) = engines() else { return };
    let data = bytes(40 << 20, 1);
    let t = Temp::new("load", &data);
    for (name, cfg) in configs() {
        let fe = FileEngine::with_engine(cfg, cuda.clone()).unwrap();
        let f = fe.open(&t.0, OpenMode::Read).unwrap();
        for (off, len) in [
            (0usize, 40usize << 20),
            (4096, 16 << 20),
            (3, 5_000_001),
            (0, 1),
            ((40 << 20) - 17, 17),
        ] {
            let mut dev = DeviceBuffer::zeroed(0, len).unwrap();
            let r = fe.load_into(&f, off as u64, &mut dev).unwrap();
            let got = dev.to_vec().unwrap();
            if let Some(i) = first_diff(&got, &data[off..off + len]) {
                panic!("{name}: load of {len} at {off}: first wrong byte at {i}");
            }
            assert_eq!(r.bytes, len as u64);
            assert_eq!(r.bounce, Some(MemKind::Pinned), "{name}: {r}");
            assert!(r.gds_note.is_some(), "{r}");
            if name == "direct" && off % 4096 == 0 && len >= 1 << 20 {
                println!("{name} {off} {len}: {r}");
            }
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn owned_device_load_and_future() {
    let _g = serial();
    let Some(cuda) = engines() else { return };
    let data = bytes(8 << 20, 2);
    let t = Temp::new("owned", &data);
    let fe = FileEngine::with_engine(FileConfig::new().threads(2), cuda).unwrap();
    let f = fe.open(&t.0, OpenMode::Read).unwrap();
    let tr = fe
        .load(&f, 1000, DeviceBuffer::new(0, 7 << 20).unwrap())
        .unwrap();
    let (dev, rep) = block_on(tr).unwrap();
    assert_eq!(
        first_diff(&dev.to_vec().unwrap(), &data[1000..1000 + (7 << 20)]),
        None
    );
    println!("owned load: {rep}");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn device_to_file_every_byte() {
    let _g = serial();
    let Some(cuda) = engines() else { return };
    let data = bytes(24 << 20, 3);
    for (name, cfg) in configs() {
        let fe = FileEngine::with_engine(cfg, cuda.clone()).unwrap();
        let t = Temp::new("store", &[]);
        let f = fe.open(&t.0, OpenMode::Create).unwrap();
        let dev = DeviceBuffer::from_host(0, &data).unwrap();
        let r = fe.store_from(&f, 4096, &dev).unwrap();
        assert_eq!(r.bytes, data.len() as u64);
        let odd = DeviceBuffer::from_host(0, &data[..777_777]).unwrap();
        let (_, _) = fe
            .store(&f, (24 << 20) + 4096 + 5, odd)
            .unwrap()
            .wait()
            .unwrap();
        let back = std::fs::read(&t.0).unwrap();
        assert_eq!(back.len(), (24 << 20) + 4096 + 5 + 777_777, "{name}");
        assert!(back[..4096].iter().all(|&b| b == 0), "{name}");
        assert_eq!(
            first_diff(&back[4096..4096 + (24 << 20)], &data),
            None,
            "{name}"
        );
        assert_eq!(
            first_diff(&back[(24 << 20) + 4096 + 5..], &data[..777_777]),
            None,
            "{name}"
        );
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn loads_into_every_buffer_kind() {
    let _g = serial();
    let Some(cuda) = engines() else { return };
    let data = bytes(3 << 20, 4);
    let t = Temp::new("kinds", &data);
    let fe =
        FileEngine::with_engine(FileConfig::new().threads(2).chunk_bytes(1 << 20), cuda).unwrap();
    let f = fe.open(&t.0, OpenMode::Read).unwrap();
    for k in KINDS {
        let mut b = Buf::new(k, &vec![0xA5u8; 2 << 20]);
        let r = fe.load_into(&f, 12_345, &mut b).unwrap();
        assert_eq!(
            first_diff(&b.to_vec(), &data[12_345..12_345 + (2 << 20)]),
            None,
            "{k:?}"
        );
        assert_eq!(r.bounce.is_some(), k == Kind::Device, "{k:?}: {r}");
        // And back out of each kind.
        let out = Temp::new("kinds-out", &[]);
        let g = fe.open(&out.0, OpenMode::Create).unwrap();
        fe.store_from(&g, 0, &b).unwrap();
        assert_eq!(
            first_diff(
                &std::fs::read(&out.0).unwrap(),
                &data[12_345..12_345 + (2 << 20)]
            ),
            None,
            "{k:?}"
        );
    }
}

/// A file whose reads fail with EIO at one byte.
struct Faulty {
    data: Vec<u8>,
    fail_at: Option<u64>,
}
impl FileIo for Faulty {
    fn read_at(&self, buf: &mut [u8], offset: u64, _direct: bool) -> io::Result<usize> {
        let end = offset + buf.len() as u64;
        if self.fail_at.is_some_and(|b| offset <= b && b < end) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let n = (self.data.len() as u64)
            .saturating_sub(offset)
            .min(buf.len() as u64) as usize;
        buf[..n].copy_from_slice(&self.data[offset as usize..offset as usize + n]);
        Ok(n)
    }
    fn write_at(&self, _buf: &[u8], _offset: u64, _direct: bool) -> io::Result<usize> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
    fn file_len(&self) -> io::Result<u64> {
        Ok(self.data.len() as u64)
    }
    fn direct(&self) -> Result<(), String> {
        Err("in-memory test file".into())
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn read_error_mid_device_load_reported_nothing_leaked() {
    let _g = serial();
    let Some(cuda) = engines() else { return };
    let data = bytes(32 << 20, 5);
    let good = FileHandle::from_io(
        "/good",
        Faulty {
            data: data.clone(),
            fail_at: None,
        },
    );
    // A first engine's life, so that threads the driver starts lazily are not counted.
    {
        let fe = FileEngine::with_engine(FileConfig::new().threads(2), cuda.clone()).unwrap();
        fe.load_into(&good, 0, &mut DeviceBuffer::zeroed(0, 4 << 20).unwrap())
            .unwrap();
    }
    let threads_before = threads_now();
    let bounce_before = live_bounce_buffers();
    {
        let fe = FileEngine::with_engine(
            FileConfig::new().threads(4).chunk_bytes(1 << 20),
            cuda.clone(),
        )
        .unwrap();
        // The ring is allocated on the first device transfer.
        let mut dev = DeviceBuffer::zeroed(0, 32 << 20).unwrap();
        fe.load_into(&good, 0, &mut dev).unwrap();
        let threads_engine = threads_now();
        let ring = live_bounce_buffers();
        assert_eq!(ring, bounce_before + fe.bounce_buffers());
        for round in 0..5 {
            let fail_at = 17_000_000 + round * 1_000_003;
            let bad = FileHandle::from_io(
                "/bad",
                Faulty {
                    data: data.clone(),
                    fail_at: Some(fail_at),
                },
            );
            let err = fe.load_into(&bad, 0, &mut dev).unwrap_err();
            match &err {
                FileError::Io {
                    path, offset, len, ..
                } => {
                    assert_eq!(path, &PathBuf::from("/bad"));
                    assert!(
                        *offset <= fail_at && fail_at < offset + *len as u64,
                        "{err}"
                    );
                }
                other => panic!("expected an I/O error, got {other}"),
            }
            assert_eq!(threads_now(), threads_engine, "round {round}: threads");
            assert_eq!(live_bounce_buffers(), ring, "round {round}: bounce buffers");
            // The engine serves the next request, every byte right.
            let mut fresh = DeviceBuffer::zeroed(0, 32 << 20).unwrap();
            fe.load_into(&good, 0, &mut fresh).unwrap();
            assert_eq!(
                first_diff(&fresh.to_vec().unwrap(), &data),
                None,
                "round {round}"
            );
        }
        fe.barrier().unwrap();
        // The CUDA engine saw no failure either.
        ferry::Engine::barrier(&*cuda).unwrap();
    }
    assert_eq!(
        live_bounce_buffers(),
        bounce_before,
        "bounce buffers left after drop"
    );
    assert_eq!(threads_now(), threads_before, "threads left after drop");
}
