//! The file path on the CPU: loads and stores of byte ranges, every byte checked; `O_DIRECT`
//! and its fallback; clear errors for short files and failing reads; fault injection in the
//! middle of a load with leak checks (threads, bounce buffers) and the engine reused after.
//!
//! Every test takes one lock: thread and bounce-buffer counts are process-wide.

use ferry::file::{
    live_bounce_buffers, FileConfig, FileEngine, FileError, FileHandle, FileIo, IoOp, OpenMode,
    ReadPiece,
};
use ferry::{CpuEngine, MemKind, Memory, MemoryMut, RawBuf};
use proptest::prelude::*;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

mod threads_common;
use threads_common::threads_now;

static LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Deterministic bytes, different per seed (xorshift).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A file in the temp dir, removed on drop.
struct Temp(PathBuf);
impl Temp {
    fn new(tag: &str, data: &[u8]) -> Temp {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "ferry-file-io-{}-{}-{tag}",
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

/// A page-aligned page, so that buffers can take the `O_DIRECT` path.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Page([u8; 4096]);
// SAFETY: an array of bytes with no padding (size equals alignment); all zeroes is valid.
unsafe impl ferry::bytemuck::Zeroable for Page {}
// SAFETY: as above; every bit pattern valid, `Copy`, `repr(C)`.
unsafe impl ferry::bytemuck::Pod for Page {}

fn pages(n: usize) -> Vec<Page> {
    vec![Page([0xA5; 4096]); n]
}
fn page_bytes(p: &[Page]) -> Vec<u8> {
    p.iter().flat_map(|p| p.0).collect()
}

fn configs() -> Vec<(&'static str, FileConfig)> {
    let base = FileConfig::new().threads(3).chunk_bytes(64 << 10);
    vec![
        ("buffered", base),
        ("direct", base.direct(true)),
        ("staged", base.staged(true)),
        ("staged+direct", base.staged(true).direct(true)),
        (
            "one thread, odd chunk",
            FileConfig::new().threads(1).chunk_bytes(5000),
        ),
    ]
}

#[test]
fn loads_ranges_every_byte() {
    let _g = serial();
    let data = bytes(1 << 20, 1);
    let t = Temp::new("ranges", &data);
    for (name, cfg) in configs() {
        let e = FileEngine::new(cfg).unwrap();
        let f = e.open(&t.0, OpenMode::Read).unwrap();
        for (off, len) in [
            (0, 1 << 20),
            (0, 1),
            (4096, 300_000),
            (12_345, 65_537),
            ((1 << 20) - 3, 3),
        ] {
            let mut buf = vec![0xA5u8; len];
            let r = e.load_into(&f, off as u64, &mut buf[..]).unwrap();
            assert!(buf == data[off..off + len], "{name} {off} {len}");
            assert_eq!(r.bytes, len as u64);
            assert_eq!(r.direct_bytes + r.buffered_bytes, len as u64, "{name}: {r}");
            // O_DIRECT reads where the buffer and the offset are not both aligned bounce
            // through the ring, and read the aligned span around each chunk: all direct.
            let in_place = buf.as_ptr() as usize % 4096 == 0 && off % 4096 == 0;
            let bounce_direct = cfg.direct && !in_place && len >= 4096 && f.direct().is_ok();
            assert_eq!(
                r.bounce.is_some(),
                cfg.staged || bounce_direct,
                "{name}: {r}"
            );
            if bounce_direct {
                assert_eq!(r.direct_bytes, len as u64, "{name}: {r}");
            }
        }
    }
}

#[test]
fn owned_load_wait_poll_and_future() {
    let _g = serial();
    let data = bytes(3 << 20, 2);
    let t = Temp::new("owned", &data);
    let e = FileEngine::new(FileConfig::new().threads(2).chunk_bytes(256 << 10)).unwrap();
    let f = e.open(&t.0, OpenMode::Read).unwrap();
    let mut tr = e.load(&f, 100, vec![0u8; 2 << 20]).unwrap();
    while tr.try_wait().is_none() {
        std::thread::yield_now();
    }
    assert!(tr.is_done());
    let (buf, rep) = tr.wait().unwrap();
    assert!(buf == data[100..100 + (2 << 20)]);
    assert_eq!(rep.bytes, 2 << 20);
    let tr = e.load(&f, 7, vec![0u8; 1 << 20]).unwrap();
    let (buf, _) = futures::executor::block_on(tr).unwrap();
    assert!(buf == data[7..7 + (1 << 20)]);
    e.barrier().unwrap();
}

#[test]
fn stores_then_reads_back() {
    let _g = serial();
    for (name, cfg) in configs() {
        let e = FileEngine::new(cfg).unwrap();
        let t = Temp::new("store", &[]);
        let f = e.open(&t.0, OpenMode::Create).unwrap();
        let a = bytes(700_001, 3);
        let b = bytes(5000, 4);
        let r = e.store_from(&f, 0, &a[..]).unwrap();
        assert_eq!(r.bytes, a.len() as u64, "{name}");
        // An owned store at an offset past the end grows the file.
        let tr = e.store(&f, 800_000, b.clone()).unwrap();
        let (back, _) = tr.wait().unwrap();
        assert_eq!(back, b);
        let on_disk = std::fs::read(&t.0).unwrap();
        assert_eq!(on_disk.len(), 805_000, "{name}");
        assert!(on_disk[..a.len()] == a[..], "{name}");
        assert!(on_disk[a.len()..800_000].iter().all(|&x| x == 0), "{name}");
        assert!(on_disk[800_000..] == b[..], "{name}");
    }
}

#[test]
fn direct_io_on_aligned_pieces_or_says_why_not() {
    let _g = serial();
    let data = bytes(1 << 20, 5);
    let t = Temp::new("direct", &data);
    let e = FileEngine::new(
        FileConfig::new()
            .threads(2)
            .chunk_bytes(128 << 10)
            .direct(true),
    )
    .unwrap();
    let f = e.open(&t.0, OpenMode::Read).unwrap();
    let mut buf = pages(64);
    let r = e.load_into(&f, 8192, &mut buf[..]).unwrap();
    assert!(page_bytes(&buf) == data[8192..8192 + (64 << 12)]);
    match f.direct() {
        // The filesystem took O_DIRECT: every byte of this aligned load used it.
        Ok(()) => assert_eq!((r.direct_bytes, r.path()), (64 << 12, "O_DIRECT"), "{r}"),
        Err(why) => {
            assert_eq!(r.buffered_bytes, 64 << 12);
            assert!(r.direct_note.as_deref() == Some(why.as_str()), "{r}");
            println!("O_DIRECT refused here: {why}");
        }
    }
    // Unaligned offset: the aligned span around it is read direct into a bounce buffer.
    let mut v = vec![0u8; 10_000];
    let r = e.load_into(&f, 3, &mut v[..]).unwrap();
    assert!(v == data[3..10_003]);
    if f.direct().is_ok() {
        assert_eq!((r.direct_bytes, r.bounce.is_some()), (10_000, true), "{r}");
    } else {
        assert_eq!(r.direct_bytes, 0);
        assert!(r.direct_note.is_some(), "{r}");
    }
    // An unaligned store offset cannot be direct: buffered, and the report says why.
    let t2 = Temp::new("direct-store", &[]);
    let g = e.open(&t2.0, OpenMode::Create).unwrap();
    let r = e.store_from(&g, 3, &data[..10_000]).unwrap();
    assert_eq!(r.direct_bytes, 0, "{r}");
    assert!(r.direct_note.is_some(), "{r}");
    assert!(std::fs::read(&t2.0).unwrap()[3..] == data[..10_000]);
    // Without `direct`, the report says it was not asked for.
    let e2 = FileEngine::new(FileConfig::new().threads(1)).unwrap();
    let f2 = e2.open(&t.0, OpenMode::Read).unwrap();
    let r = e2.load_into(&f2, 0, &mut v[..]).unwrap();
    assert_eq!(r.path(), "buffered");
    assert!(r.to_string().contains("not asked for"), "{r}");
}

// ---------------------------------------------------------------------------------------------
// Test files: in memory, with faults.

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// A read covering this byte fails with EIO.
    ReadErrorAt(u64),
    /// The file ends here (a file that shrank after the length was read).
    EofAt(u64),
    /// A write covering this byte fails with ENOSPC.
    WriteErrorAt(u64),
    /// A read covering this byte panics.
    PanicAt(u64),
    /// Every read returns at most 7 bytes.
    Short,
    /// Direct reads are refused with EINVAL.
    DirectEinval,
}

struct MemFile {
    data: Mutex<Vec<u8>>,
    len: u64,
    fault: Fault,
    reads: AtomicUsize,
}

impl MemFile {
    fn new(data: Vec<u8>, fault: Fault) -> MemFile {
        MemFile {
            len: data.len() as u64,
            data: Mutex::new(data),
            fault,
            reads: AtomicUsize::new(0),
        }
    }
}

impl FileIo for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64, direct: bool) -> io::Result<usize> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let end = offset + buf.len() as u64;
        let covers = |b: u64| offset <= b && b < end;
        let mut limit = self.len;
        match self.fault {
            Fault::ReadErrorAt(b) if covers(b) => {
                return Err(io::Error::from_raw_os_error(libc::EIO))
            }
            Fault::PanicAt(b) if covers(b) => panic!("injected panic in read_at"),
            Fault::EofAt(b) => limit = b,
            Fault::DirectEinval if direct => {
                return Err(io::Error::from_raw_os_error(libc::EINVAL))
            }
            _ => {}
        }
        if offset >= limit {
            return Ok(0);
        }
        let mut n = (limit - offset).min(buf.len() as u64) as usize;
        if self.fault == Fault::Short {
            n = n.min(7);
        }
        let d = self.data.lock().unwrap();
        buf[..n].copy_from_slice(&d[offset as usize..offset as usize + n]);
        Ok(n)
    }
    fn write_at(&self, buf: &[u8], offset: u64, _direct: bool) -> io::Result<usize> {
        let end = offset + buf.len() as u64;
        if let Fault::WriteErrorAt(b) = self.fault {
            if offset <= b && b < end {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
        }
        let mut d = self.data.lock().unwrap();
        if d.len() < end as usize {
            d.resize(end as usize, 0);
        }
        d[offset as usize..end as usize].copy_from_slice(buf);
        Ok(buf.len())
    }
    fn file_len(&self) -> io::Result<u64> {
        Ok(self.len)
    }
    fn direct(&self) -> Result<(), String> {
        if self.fault == Fault::DirectEinval {
            Ok(())
        } else {
            Err("in-memory test file".into())
        }
    }
}

#[test]
fn read_error_mid_load_is_reported_and_nothing_leaks() {
    let _g = serial();
    let threads_before = threads_now();
    let bounce_before = live_bounce_buffers();
    let data = bytes(1 << 20, 6);
    let fail_at = 600_000u64;
    for (name, cfg) in configs() {
        let e = Arc::new(CpuEngine::new(2).unwrap());
        let fe = FileEngine::with_engine(cfg, e.clone()).unwrap();
        let threads_engine = threads_now();
        for round in 0..3 {
            let f = FileHandle::from_io(
                "/faulty/file",
                MemFile::new(data.clone(), Fault::ReadErrorAt(fail_at)),
            );
            let tr = fe.load(&f, 0, vec![0u8; 1 << 20]).unwrap();
            let failed = tr.wait().unwrap_err();
            match &failed.error {
                FileError::Io {
                    op,
                    path,
                    offset,
                    len,
                    msg,
                    ..
                } => {
                    assert_eq!(*op, IoOp::Read);
                    assert_eq!(path, &PathBuf::from("/faulty/file"));
                    assert!(
                        *offset <= fail_at && fail_at < *offset + *len as u64,
                        "{name}: {}",
                        failed.error
                    );
                    assert!(msg.contains("Input/output error"), "{name}: {msg}");
                }
                other => panic!("{name}: expected an I/O error, got {other}"),
            }
            let msg = failed.error.to_string();
            assert!(
                msg.contains("/faulty/file") && msg.contains("offset"),
                "{msg}"
            );
            // The engine serves the next request correctly.
            let good = FileHandle::from_io("/good", MemFile::new(data.clone(), Fault::None));
            let mut buf = vec![0u8; 1 << 20];
            fe.load_into(&good, 0, &mut buf[..]).unwrap();
            assert!(buf == data, "{name} round {round}");
            assert_eq!(threads_now(), threads_engine, "{name}: threads leaked");
            if cfg.staged {
                assert_eq!(fe.bounce_buffers(), 3.min(cfg.threads), "{name}");
                assert_eq!(
                    live_bounce_buffers(),
                    bounce_before + fe.bounce_buffers(),
                    "{name}"
                );
            }
        }
        fe.barrier().unwrap();
        drop(fe);
        drop(e);
        assert_eq!(
            threads_now(),
            threads_before,
            "{name}: threads left after drop"
        );
        assert_eq!(
            live_bounce_buffers(),
            bounce_before,
            "{name}: bounce buffers left"
        );
    }
}

#[test]
fn file_that_shrinks_mid_load_fails_with_eof() {
    let _g = serial();
    let data = bytes(500_000, 7);
    for (name, cfg) in configs() {
        let fe = FileEngine::new(cfg).unwrap();
        let f = FileHandle::from_io(
            "/shrinks",
            MemFile::new(data.clone(), Fault::EofAt(300_001)),
        );
        let err = fe
            .load_into(&f, 1000, &mut vec![0u8; 400_000][..])
            .unwrap_err();
        match err {
            FileError::UnexpectedEof {
                ref path,
                offset,
                missing,
            } => {
                assert_eq!(path, &PathBuf::from("/shrinks"));
                assert!(offset >= 300_001 || missing > 0, "{name}: {err}");
                assert!(offset <= 401_000, "{name}: {err}");
            }
            other => panic!("{name}: expected end of file, got {other}"),
        }
        // Next request fine.
        let good = FileHandle::from_io("/good", MemFile::new(data.clone(), Fault::None));
        let mut buf = vec![0u8; 400_000];
        fe.load_into(&good, 1000, &mut buf[..]).unwrap();
        assert!(buf == data[1000..401_000], "{name}");
    }
}

#[test]
fn short_file_refused_at_submit_buffer_untouched() {
    let _g = serial();
    let data = bytes(10_000, 8);
    let t = Temp::new("short", &data);
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let f = fe.open(&t.0, OpenMode::Read).unwrap();
    let refused = fe.load(&f, 9000, vec![0xA5u8; 2000]).unwrap_err();
    assert!(refused.buf.iter().all(|&b| b == 0xA5));
    assert_eq!(
        refused.error,
        FileError::OutOfRange {
            path: t.0.clone(),
            offset: 9000,
            len: 2000,
            file_len: 10_000
        }
    );
    assert!(refused.error.to_string().contains("10000 bytes long"));
    // Overflowing range.
    let e = fe.load_into(&f, u64::MAX, &mut [0u8; 2][..]).unwrap_err();
    assert!(matches!(e, FileError::BadRange(_)), "{e}");
    // Missing file.
    let e = fe
        .open(t.0.with_extension("missing"), OpenMode::Read)
        .unwrap_err();
    assert!(
        matches!(
            e,
            FileError::Open {
                kind: io::ErrorKind::NotFound,
                ..
            }
        ),
        "{e}"
    );
    // Zero bytes at the end: fine, nothing read.
    let r = fe.load_into(&f, 10_000, &mut [0u8; 0][..]).unwrap();
    assert_eq!(r.bytes, 0);
    // The exact end: fine.
    let mut last = [0u8; 10];
    fe.load_into(&f, 9990, &mut last[..]).unwrap();
    assert_eq!(last[..], data[9990..]);
}

#[test]
fn short_reads_are_continued() {
    let _g = serial();
    let data = bytes(100_003, 9);
    for (name, cfg) in configs() {
        let fe = FileEngine::new(cfg).unwrap();
        let f = FileHandle::from_io("/short-reads", MemFile::new(data.clone(), Fault::Short));
        let mut buf = vec![0u8; 100_000];
        fe.load_into(&f, 3, &mut buf[..]).unwrap();
        assert!(buf == data[3..], "{name}");
    }
}

#[test]
fn direct_refused_at_run_time_falls_back_to_buffered() {
    let _g = serial();
    let data = bytes(1 << 20, 10);
    let fe = FileEngine::new(
        FileConfig::new()
            .threads(2)
            .chunk_bytes(64 << 10)
            .direct(true),
    )
    .unwrap();
    let f = FileHandle::from_io(
        "/no-direct",
        MemFile::new(data.clone(), Fault::DirectEinval),
    );
    assert!(f.direct().is_ok());
    let mut buf = pages(32);
    let r = fe.load_into(&f, 4096, &mut buf[..]).unwrap();
    assert!(page_bytes(&buf) == data[4096..4096 + (32 << 12)]);
    assert_eq!((r.direct_bytes, r.buffered_bytes), (0, 32 << 12), "{r}");
    let note = r.direct_note.clone().unwrap_or_default();
    assert!(note.contains("refused"), "{r}");
    assert!(f.direct().is_err());
}

#[test]
fn write_error_mid_store_is_reported() {
    let _g = serial();
    let threads_before = threads_now();
    for (name, cfg) in configs() {
        let fe = FileEngine::new(cfg).unwrap();
        let f = FileHandle::from_io(
            "/full-disk",
            MemFile::new(vec![], Fault::WriteErrorAt(250_000)),
        );
        let err = fe.store_from(&f, 0, &bytes(400_000, 11)[..]).unwrap_err();
        match &err {
            FileError::Io {
                op: IoOp::Write,
                offset,
                len,
                msg,
                ..
            } => {
                assert!(
                    *offset <= 250_000 && 250_000 < offset + *len as u64,
                    "{name}: {err}"
                );
                assert!(!msg.is_empty());
            }
            other => panic!("{name}: expected a write error, got {other}"),
        }
        let ok = FileHandle::from_io("/fine", MemFile::new(vec![], Fault::None));
        fe.store_from(&ok, 0, &bytes(1000, 12)[..]).unwrap();
    }
    assert_eq!(threads_now(), threads_before);
}

#[test]
fn panicking_reader_fails_only_its_request() {
    let _g = serial();
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let data = bytes(300_000, 13);
    let fe = FileEngine::new(FileConfig::new().threads(2).chunk_bytes(32 << 10)).unwrap();
    let threads = threads_now();
    let f = FileHandle::from_io(
        "/panics",
        MemFile::new(data.clone(), Fault::PanicAt(100_000)),
    );
    let err = fe
        .load_into(&f, 0, &mut vec![0u8; 300_000][..])
        .unwrap_err();
    std::panic::set_hook(prev);
    assert!(
        matches!(err, FileError::Panicked { offset, .. } if offset <= 100_000),
        "{err}"
    );
    assert_eq!(threads_now(), threads);
    let good = FileHandle::from_io("/good", MemFile::new(data.clone(), Fault::None));
    let mut buf = vec![0u8; 300_000];
    fe.load_into(&good, 0, &mut buf[..]).unwrap();
    assert!(buf == data);
}

#[test]
fn unobserved_failure_reported_by_barrier() {
    let _g = serial();
    let data = bytes(200_000, 14);
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let f = FileHandle::from_io("/bad", MemFile::new(data, Fault::ReadErrorAt(10)));
    let tr = fe.load(&f, 0, vec![0u8; 200_000]).unwrap();
    drop(tr); // waits, but nobody looked at the result
    let e = fe.barrier().unwrap_err();
    assert_eq!(e.failures.len(), 1);
    assert!(e.to_string().contains("/bad"), "{e}");
    fe.barrier().unwrap();
}

/// A buffer that claims to be device memory; refused before it is touched.
struct FakeDevice;
// SAFETY: never read or written: every test refuses it at submit.
unsafe impl Memory for FakeDevice {
    fn raw(&self) -> RawBuf {
        RawBuf {
            addr: 0x1000,
            len: 4096,
            kind: MemKind::Device { ordinal: 0 },
        }
    }
}
// SAFETY: as above.
unsafe impl MemoryMut for FakeDevice {
    fn raw_mut(&mut self) -> RawBuf {
        self.raw()
    }
}

#[test]
fn device_buffers_need_an_engine_that_reaches_them() {
    let _g = serial();
    let data = bytes(8192, 15);
    let t = Temp::new("dev", &data);
    let fe = FileEngine::new(FileConfig::new().threads(1)).unwrap();
    let f = fe.open(&t.0, OpenMode::Read).unwrap();
    let e = fe.load_into(&f, 0, &mut FakeDevice).unwrap_err();
    assert!(
        matches!(
            e,
            FileError::Unsupported {
                kind: MemKind::Device { ordinal: 0 },
                ..
            }
        ),
        "{e}"
    );
    let fe = FileEngine::with_engine(
        FileConfig::new().threads(1),
        Arc::new(CpuEngine::new(1).unwrap()),
    )
    .unwrap();
    let e = fe.load_into(&f, 0, &mut FakeDevice).unwrap_err();
    assert!(e.to_string().contains("cpu(1)"), "{e}");
    let e = fe.store_from(&f, 0, &FakeDevice).unwrap_err();
    assert!(matches!(e, FileError::Unsupported { .. }), "{e}");
}

#[test]
fn bad_configs_are_errors() {
    let _g = serial();
    for cfg in [
        FileConfig::new().threads(0),
        FileConfig::new().threads(1000),
        FileConfig::new().chunk_bytes(0),
        FileConfig::new().ring_depth(0),
    ] {
        assert!(
            matches!(FileEngine::new(cfg), Err(FileError::BadConfig(_))),
            "{cfg:?}"
        );
    }
}

/// This machine's answer, whatever it has: the first missing piece named, in the order
/// `choose` checks them (libcufile, then nvidia-fs); `Ok` only with both.
#[test]
fn gds_probe_names_the_first_missing_piece() {
    use ferry::file::{gds_probe, Transport, NO_NVIDIA_FS};
    let p = gds_probe();
    println!(
        "libcufile {}, nvidia-fs {}: {}",
        p.libcufile, p.nvidia_fs, p.auto
    );
    let why = &p.auto.reason;
    match (p.libcufile, p.nvidia_fs, p.auto.transport.is_cufile()) {
        (false, _, false) => assert!(why.contains("libcufile.so.0 was not found"), "{why}"),
        (true, false, false) => assert_eq!(why, NO_NVIDIA_FS),
        (true, true, true) => assert_eq!(p.auto.transport, Transport::CuFile { compat: false }),
        (l, n, c) => panic!("libcufile {l}, nvidia-fs {n}, cuFile chosen {c}: {why}"),
    }
}

/// A report over cuFile transfers: bytes summed, the device transport kept over host ones,
/// the path and the text saying cuFile.
#[test]
fn io_report_adds_and_prints_cufile_transfers() {
    use ferry::file::{IoReport, Transport};
    let cu = IoReport {
        bytes: 4096,
        cufile_bytes: 4096,
        transport: Transport::CuFile { compat: true },
        gds_note: Some("cuFile (compatibility mode): asked for".into()),
        ..IoReport::default()
    };
    let host = IoReport {
        bytes: 10,
        buffered_bytes: 10,
        ..IoReport::default()
    };
    let mut total = host.clone();
    total.add(cu.clone());
    total.add(cu);
    assert_eq!(
        (total.bytes, total.cufile_bytes, total.transport),
        (8202, 8192, Transport::CuFile { compat: true })
    );
    assert_eq!(total.path(), "cuFile + buffered");
    let text = total.to_string();
    assert!(
        text.starts_with("8202 bytes, cuFile + buffered (direct 0, buffered 10, cuFile 8192)"),
        "{text}"
    );
    assert!(
        text.ends_with("; cuFile (compatibility mode): asked for"),
        "{text}"
    );
    assert_eq!(host.path(), "buffered");
    assert!(!host.to_string().contains("cuFile"), "{host}");
}

/// Host buffers never touch cuFile, whatever the mode: the workers read them.
#[test]
fn host_transfers_report_the_host_transport_in_every_cufile_mode() {
    use ferry::file::{CuFileMode, Transport};
    let data = bytes(100_000, 41);
    let t = Temp::new("cufile-host", &data);
    for mode in [CuFileMode::Auto, CuFileMode::On, CuFileMode::Off] {
        let fe = FileEngine::new(FileConfig::new().threads(2).cufile(mode)).unwrap();
        let f = fe.open(&t.0, OpenMode::Read).unwrap();
        let mut buf = vec![0u8; data.len()];
        let r = fe.load_into(&f, 0, &mut buf[..]).unwrap();
        assert!(buf == data, "{mode}");
        assert_eq!(
            (r.transport, r.cufile_bytes, r.gds_note.is_none()),
            (Transport::Host, 0, true),
            "{mode}: {r}"
        );
    }
}

#[test]
fn engine_dropped_with_transfer_in_flight_completes_it() {
    let _g = serial();
    let threads_before = threads_now();
    let data = bytes(2 << 20, 16);
    let t = Temp::new("drop", &data);
    let fe = FileEngine::new(FileConfig::new().threads(2).chunk_bytes(64 << 10)).unwrap();
    let f = fe.open(&t.0, OpenMode::Read).unwrap();
    let tr = fe.load(&f, 0, vec![0u8; 2 << 20]).unwrap();
    drop(fe);
    let (buf, _) = tr.wait().unwrap();
    assert!(buf == data);
    assert_eq!(threads_now(), threads_before);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn any_range_any_chunking_matches_the_file(
        off in 0usize..70_000,
        len in 0usize..70_000,
        chunk in prop_oneof![1usize..20_000, (1usize..6).prop_map(|k| k * 4096)],
        threads in 1usize..4,
        direct: bool,
        staged: bool,
        mover: bool,
    ) {
        let _g = serial();
        // The data is made once; the file each case (a file kept in a static would never be
        // removed: statics are not dropped).
        static DATA: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let data = DATA.get_or_init(|| bytes(140_000, 17));
        let t = Temp::new("prop", data);
        let cfg = FileConfig::new().threads(threads).chunk_bytes(chunk).direct(direct).staged(staged);
        let fe = if mover {
            FileEngine::with_engine(cfg, Arc::new(CpuEngine::new(1).unwrap())).unwrap()
        } else {
            FileEngine::new(cfg).unwrap()
        };
        let f = fe.open(&t.0, OpenMode::Read).unwrap();
        let mut buf = vec![0xA5u8; len];
        let r = fe.load_into(&f, off as u64, &mut buf[..]).unwrap();
        prop_assert!(buf == data[off..off + len]);
        prop_assert_eq!(r.direct_bytes + r.buffered_bytes, len as u64);
        // And back: store the range into a fresh file at the same offset.
        let out = Temp::new("prop-out", &[]);
        let g = fe.open(&out.0, OpenMode::Create).unwrap();
        fe.store_from(&g, off as u64, &buf[..]).unwrap();
        let back = std::fs::read(&out.0).unwrap();
        prop_assert_eq!(back.len(), if len == 0 { 0 } else { off + len });
        prop_assert!(back[back.len() - len..] == data[off..off + len]);
    }
}

/// A real file that is truncated by the first read (after the length was checked at submit):
/// the operating system's `pread` then returns end of file inside the range.
struct TruncatesOnFirstRead {
    inner: ferry::file::OsFile,
    path: PathBuf,
    keep: u64,
    done: std::sync::Once,
}

impl FileIo for TruncatesOnFirstRead {
    fn read_at(&self, buf: &mut [u8], offset: u64, direct: bool) -> io::Result<usize> {
        self.done.call_once(|| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&self.path)
                .unwrap();
            f.set_len(self.keep).unwrap();
        });
        self.inner.read_at(buf, offset, direct)
    }
    fn write_at(&self, buf: &[u8], offset: u64, direct: bool) -> io::Result<usize> {
        self.inner.write_at(buf, offset, direct)
    }
    fn file_len(&self) -> io::Result<u64> {
        self.inner.file_len()
    }
    fn direct(&self) -> Result<(), String> {
        self.inner.direct()
    }
}

#[test]
fn real_file_truncated_during_load_fails_with_eof() {
    let _g = serial();
    let data = bytes(1 << 20, 18);
    for (name, cfg) in configs() {
        let t = Temp::new("truncated", &data);
        let fe = FileEngine::new(cfg).unwrap();
        let inner = ferry::file::OsFile::open(&t.0, OpenMode::Read, cfg.direct).unwrap();
        let f = FileHandle::from_io(
            t.0.clone(),
            TruncatesOnFirstRead {
                inner,
                path: t.0.clone(),
                keep: 100_000,
                done: std::sync::Once::new(),
            },
        );
        let err = fe
            .load_into(&f, 0, &mut vec![0u8; 1 << 20][..])
            .unwrap_err();
        match &err {
            FileError::UnexpectedEof {
                path,
                offset,
                missing,
            } => {
                assert_eq!(path, &t.0, "{name}");
                assert!(*offset >= 100_000 && *missing > 0, "{name}: {err}");
            }
            other => panic!("{name}: expected end of file, got {other}"),
        }
        assert!(
            err.to_string().contains(&t.0.display().to_string()),
            "{err}"
        );
        // The whole (now short) file still loads.
        let g = fe.open(&t.0, OpenMode::Read).unwrap();
        let mut buf = vec![0u8; 100_000];
        fe.load_into(&g, 0, &mut buf[..]).unwrap();
        assert!(buf == data[..100_000], "{name}");
    }
}

#[test]
fn no_file_descriptors_or_threads_left_after_failures() {
    let _g = serial();
    let fds = || std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let data = bytes(300_000, 19);
    let t = Temp::new("fds", &data);
    let (fd0, th0, b0) = (fds(), threads_now(), live_bounce_buffers());
    for (name, cfg) in configs() {
        let fe = FileEngine::with_engine(cfg, Arc::new(CpuEngine::new(1).unwrap())).unwrap();
        for _ in 0..10 {
            let f = fe.open(&t.0, OpenMode::Read).unwrap();
            // Refused (past the end), failed (missing file), then fine.
            assert!(fe.load(&f, 1, vec![0u8; 300_000]).is_err(), "{name}");
            assert!(fe.open(t.0.with_extension("nope"), OpenMode::Read).is_err());
            let mut buf = vec![0u8; 300_000];
            fe.load_into(&f, 0, &mut buf[..]).unwrap();
            assert!(buf == data, "{name}");
        }
    }
    assert_eq!(
        (fds(), threads_now(), live_bounce_buffers()),
        (fd0, th0, b0)
    );
}

/// A buffer with a null address; refused before it is touched.
struct Null;
// SAFETY: never read or written: refused at submit.
unsafe impl Memory for Null {
    fn raw(&self) -> RawBuf {
        RawBuf {
            addr: 0,
            len: 16,
            kind: MemKind::Pageable,
        }
    }
}
// SAFETY: as above.
unsafe impl MemoryMut for Null {
    fn raw_mut(&mut self) -> RawBuf {
        self.raw()
    }
}

#[test]
fn null_buffer_is_refused() {
    let _g = serial();
    let t = Temp::new("null", &[1u8; 64]);
    let fe = FileEngine::new(FileConfig::new().threads(1)).unwrap();
    let f = fe.open(&t.0, OpenMode::Read).unwrap();
    let e = fe.load_into(&f, 0, &mut Null).unwrap_err();
    assert!(matches!(e, FileError::BadRange(_)), "{e}");
    let e = fe.store_from(&f, 0, &Null).unwrap_err();
    assert!(matches!(e, FileError::BadRange(_)), "{e}");
}

/// A file whose reads take a while: each fills its buffer with `0xab` after 200 ms.
struct SlowFile;

impl FileIo for SlowFile {
    fn read_at(&self, buf: &mut [u8], _offset: u64, _direct: bool) -> io::Result<usize> {
        std::thread::sleep(std::time::Duration::from_millis(200));
        buf.fill(0xab);
        Ok(buf.len())
    }
    fn write_at(&self, buf: &[u8], _offset: u64, _direct: bool) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn file_len(&self) -> io::Result<u64> {
        Ok(1 << 20)
    }
    fn direct(&self) -> Result<(), String> {
        Err("in-memory test file".into())
    }
}

/// A file whose length cannot be asked: `file_len` panics (a `FileIo` is safe to implement).
struct LenPanics;

impl FileIo for LenPanics {
    fn read_at(&self, buf: &mut [u8], _offset: u64, _direct: bool) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn write_at(&self, buf: &[u8], _offset: u64, _direct: bool) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn file_len(&self) -> io::Result<u64> {
        panic!("injected panic in file_len")
    }
    fn direct(&self) -> Result<(), String> {
        Err("in-memory test file".into())
    }
}

/// A load of many pieces whose second file panics at submit: the call unwinds only once the
/// first piece's transfer, already running, has finished writing the buffer (it once wrote on
/// into the caller's freed buffer: a SIGSEGV with a buffer of tens of MiB).
#[test]
fn load_pieces_waits_for_running_transfers_when_a_submit_panics() {
    let _g = serial();
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let (slow, bad) = (
        FileHandle::from_io("/slow/file", SlowFile),
        FileHandle::from_io("/panics/file", LenPanics),
    );
    let mut buf = vec![0u8; 2 << 20];
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let pieces = [
            ReadPiece {
                file: &slow,
                offset: 0,
                at: 0,
                len: 1 << 20,
            },
            ReadPiece {
                file: &bad,
                offset: 0,
                at: 1 << 20,
                len: 1 << 20,
            },
        ];
        fe.load_pieces(&mut buf, &pieces)
    }));
    let arrived = buf.iter().filter(|&&b| b == 0xab).count();
    // Whatever happened, nothing may still write `buf` when it is dropped.
    let _ = fe.barrier();
    assert!(unwound.is_err(), "the file's panic goes on to the caller");
    assert_eq!(
        arrived,
        1 << 20,
        "the first piece's transfer was still running when the call unwound"
    );
}
