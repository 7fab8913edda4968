//! `O_DIRECT` through io_uring on the CPU: loads into host buffers of many sizes at aligned and
//! unaligned offsets (straight in, and through the bounce ring), stores read back, a file that
//! ends early, the fallback (io_uring off) giving the same bytes, and nothing left in the kernel
//! after failures or a transfer dropped in the middle. Every byte checked.
//!
//! Where the kernel refuses io_uring (seccomp, `kernel.io_uring_disabled=2`), the checks that
//! need it print `skipped: io_uring unavailable` and the fallback is still tested.
//!
//! Every test takes one lock: the in-flight counts are process-wide.

mod files_common;
use ferry::file::{
    live_bounce_buffers, uring_ops_in_flight, FileConfig, FileEngine, FileError, FileHandle,
    FileIo, IoIssue, OpenMode, OsFile, UringMode,
};
use ferry::memory::AlignedBuffer;
use files_common::{bytes, TempDir};
use std::io;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, Once};

static LOCK: Mutex<()> = Mutex::new(());
fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// True when io_uring works here; else prints the skip line for `what`.
fn uring_or_skip(what: &str) -> bool {
    match FileEngine::new(FileConfig::new().uring(UringMode::On)) {
        Ok(_) => true,
        Err(e) => {
            println!("skipped: io_uring unavailable ({what}: {e})");
            false
        }
    }
}

/// For the io_uring-only checks: a file of `n` bytes (seed `seed`) in a temp dir, or `None`
/// after the skip line.
fn uring_file(what: &str, n: usize, seed: u64) -> Option<(TempDir, Vec<u8>, PathBuf)> {
    if !uring_or_skip(what) {
        return None;
    }
    let dir = TempDir::new("uring");
    let data = bytes(n, seed);
    let path = dir.file("data", &data);
    Some((dir, data, path))
}

fn base() -> FileConfig {
    FileConfig::new()
        .threads(3)
        .chunk_bytes(1 << 20)
        .direct(true)
        .uring_depth(4)
}

/// The modes to run: io_uring (when available) and threads.
fn modes(what: &str) -> Vec<(&'static str, FileConfig)> {
    let mut v = vec![("threads", base().uring(UringMode::Off))];
    if uring_or_skip(what) {
        v.push(("io_uring", base().uring(UringMode::On)));
        v.push(("io_uring staged", base().uring(UringMode::On).staged(true)));
        v.push((
            "io_uring depth 1",
            base().uring(UringMode::On).uring_depth(1),
        ));
    }
    v
}

fn first_diff(got: &[u8], want: &[u8]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(got.len().min(want.len()));
    }
    got.iter().zip(want).position(|(a, b)| a != b)
}

fn check_issue(name: &str, cfg: &FileConfig, aligned: bool, r: &ferry::file::IoReport) {
    let issued = r.issued.clone().expect("a report says how it was issued");
    match (cfg.uring, aligned) {
        (UringMode::On, true) => {
            assert_eq!(
                issued,
                IoIssue::Uring {
                    depth: cfg.uring_depth
                },
                "{name}: {r}"
            )
        }
        (UringMode::Off, _) => assert_eq!(
            issued.to_string(),
            "threads (io_uring off: FileConfig::uring or FERRY_FILE_URING=off)",
            "{name}: {r}"
        ),
        _ => assert!(matches!(issued, IoIssue::Threads { .. }), "{name}: {r}"),
    }
}

#[test]
fn loads_every_size_and_offset_through_io_uring_and_threads() {
    let _g = serial();
    let dir = TempDir::new("uring-load");
    let data = bytes((64 << 20) + 3 * 4096, 1);
    let path = dir.file("data", &data);
    for (name, cfg) in modes("loads") {
        let fe = FileEngine::new(cfg).unwrap();
        let f = fe.open(&path, OpenMode::Read).unwrap();
        for len in [0usize, 1, 4095, 4096, (1 << 20) + 7, 64 << 20] {
            for off in [0usize, 4096, 1, 4097] {
                if len == 64 << 20 && (off == 4096 || off == 4097) {
                    continue; // the big one twice, not four times
                }
                // Aligned address: straight in (aligned offsets) or through the ring.
                let mut a = AlignedBuffer::new(len.max(1)).unwrap();
                let r = fe.load_into(&f, off as u64, &mut a[..len]).unwrap();
                if let Some(i) = first_diff(&a[..len], &data[off..off + len]) {
                    panic!("{name}: aligned load of {len} at {off}: first wrong byte at {i}");
                }
                assert_eq!(r.bytes, len as u64, "{name}");
                assert_eq!(r.direct_bytes + r.buffered_bytes, len as u64, "{name}: {r}");
                // Reads at unaligned offsets read the aligned span around each chunk into
                // the bounce ring: direct too.
                check_issue(name, &cfg, len >= 4096, &r);
                if len >= 4096 && off % 4096 == 0 {
                    assert!(r.direct_bytes >= (len / 4096 * 4096) as u64, "{name}: {r}");
                }
                // Unaligned address (a Vec at +1): through the bounce ring, read direct.
                let mut v = vec![0u8; len + 1];
                let r = fe.load_into(&f, off as u64, &mut v[1..]).unwrap();
                if let Some(i) = first_diff(&v[1..], &data[off..off + len]) {
                    panic!("{name}: unaligned load of {len} at {off}: first wrong byte at {i}");
                }
                check_issue(name, &cfg, len >= 4096, &r);
            }
        }
        assert_eq!(uring_ops_in_flight(), 0, "{name}");
    }
}

#[test]
fn stores_round_trip() {
    let _g = serial();
    let dir = TempDir::new("uring-store");
    for (name, cfg) in modes("stores") {
        let fe = FileEngine::new(cfg).unwrap();
        for len in [1usize, 4095, 4096, (1 << 20) + 7, 9 << 20] {
            for off in [0usize, 4096, 1] {
                let data = bytes(len, len as u64 + off as u64);
                let path = dir.0.join(format!("out-{len}-{off}"));
                let f = fe.open(&path, OpenMode::Create).unwrap();
                let mut a = AlignedBuffer::new(len).unwrap();
                a.copy_from_slice(&data);
                let r = fe.store_from(&f, off as u64, &a[..]).unwrap();
                assert_eq!(r.bytes, len as u64, "{name}: {r}");
                assert_eq!(r.direct_bytes + r.buffered_bytes, len as u64, "{name}: {r}");
                check_issue(name, &cfg, len >= 4096 && off % 4096 == 0, &r);
                let got = std::fs::read(&path).unwrap();
                assert_eq!(got.len(), off + len, "{name}: store of {len} at {off}");
                if let Some(i) = first_diff(&got[off..], &data) {
                    panic!("{name}: store of {len} at {off}: first wrong byte at {i}");
                }
            }
        }
        assert_eq!(uring_ops_in_flight(), 0, "{name}");
    }
}

#[test]
fn fallback_gives_identical_bytes() {
    let _g = serial();
    let dir = TempDir::new("uring-same");
    let data = bytes((8 << 20) + 12_345, 3);
    let path = dir.file("data", &data);
    let mut outs = Vec::new();
    for (name, cfg) in modes("fallback comparison") {
        let fe = FileEngine::new(cfg).unwrap();
        let f = fe.open(&path, OpenMode::Read).unwrap();
        let mut a = AlignedBuffer::new(data.len() - 4096).unwrap();
        fe.load_into(&f, 4096, &mut a[..]).unwrap();
        outs.push((name, a.to_vec()));
    }
    for (name, o) in &outs {
        assert!(*o == data[4096..], "{name}: differs from the file");
        assert!(*o == outs[0].1, "{name}: differs from {}", outs[0].0);
    }
}

#[test]
fn load_up_to_stops_at_the_end_of_the_file() {
    let _g = serial();
    let dir = TempDir::new("uring-eof");
    let data = bytes((1 << 20) + 100, 4);
    let path = dir.file("data", &data);
    for (name, cfg) in modes("end of file") {
        let fe = FileEngine::new(cfg).unwrap();
        let f = fe.open(&path, OpenMode::Read).unwrap();
        let mut a = AlignedBuffer::new(2 << 20).unwrap();
        for off in [0usize, 4096, 1] {
            let (n, r) = fe.load_up_to(&f, off as u64, &mut a[..]).unwrap();
            assert_eq!(n, data.len() - off, "{name} at {off}: {r}");
            if let Some(i) = first_diff(&a[..n], &data[off..]) {
                panic!("{name}: load_up_to at {off}: first wrong byte at {i}");
            }
        }
    }
}

/// A real file whose `O_DIRECT` descriptor goes to io_uring, with one of two faults: truncated
/// to `keep` bytes right after the engine read its length at submit (the reads then meet the
/// end of the file), or `fd` handed to io_uring in its place (a write-only descriptor: every
/// read entry fails with `EBADF`).
struct Faulty {
    inner: OsFile,
    truncate: Option<(PathBuf, u64, Once)>,
    fd: Option<std::fs::File>,
}

impl FileIo for Faulty {
    fn read_at(&self, buf: &mut [u8], offset: u64, direct: bool) -> io::Result<usize> {
        self.inner.read_at(buf, offset, direct)
    }
    fn write_at(&self, buf: &[u8], offset: u64, direct: bool) -> io::Result<usize> {
        self.inner.write_at(buf, offset, direct)
    }
    fn file_len(&self) -> io::Result<u64> {
        let n = self.inner.file_len()?;
        if let Some((path, keep, once)) = &self.truncate {
            once.call_once(|| {
                let f = std::fs::OpenOptions::new().write(true).open(path);
                f.and_then(|f| f.set_len(*keep)).expect("truncate");
            });
        }
        Ok(n)
    }
    fn direct(&self) -> Result<(), String> {
        self.inner.direct()
    }
    fn direct_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        match &self.fd {
            Some(f) => Some(f.as_raw_fd()),
            None => self.inner.direct_fd(),
        }
    }
}

#[test]
fn truncated_file_fails_with_eof_and_leaves_nothing_in_flight() {
    let _g = serial();
    let dir = TempDir::new("uring-trunc");
    let data = bytes(16 << 20, 5);
    for (name, cfg) in modes("truncated file") {
        for (staged, keep) in [(false, 100_000u64), (true, 5 << 20), (false, 8 << 20)] {
            let cfg = cfg.staged(staged);
            let path = dir.file("data", &data);
            let fe = FileEngine::new(cfg).unwrap();
            let inner = OsFile::open(&path, OpenMode::Read, true).unwrap();
            let truncate = Some((path.clone(), keep, Once::new()));
            let f = FileHandle::from_io(
                path.clone(),
                Faulty {
                    inner,
                    truncate,
                    fd: None,
                },
            );
            let mut a = AlignedBuffer::new(16 << 20).unwrap();
            let err = fe.load_into(&f, 0, &mut a[..]).unwrap_err();
            match &err {
                FileError::UnexpectedEof {
                    path: p, offset, ..
                } => {
                    assert_eq!(p, &path, "{name}");
                    assert!(*offset >= keep / 4096 * 4096, "{name}: {err}");
                }
                other => panic!("{name} (keep {keep}): expected end of file, got {other}"),
            }
            assert!(err.to_string().contains(&path.display().to_string()));
            assert_eq!(
                uring_ops_in_flight(),
                0,
                "{name}: entries left in the kernel"
            );
            // The engine is usable after, on the short file.
            let g = fe.open(&path, OpenMode::Read).unwrap();
            let n = keep as usize;
            let r = fe.load_into(&g, 0, &mut a[..n]).unwrap();
            assert!(a[..n] == data[..n], "{name}: reload after the failure: {r}");
            drop(fe);
            assert_eq!(live_bounce_buffers(), 0, "{name}");
        }
    }
}

#[test]
fn dropped_in_the_middle_leaves_nothing_submitted() {
    let _g = serial();
    let Some((_dir, data, path)) = uring_file("drop in the middle", 32 << 20, 6) else {
        return;
    };
    for staged in [false, true] {
        let fe = FileEngine::new(base().uring(UringMode::On).staged(staged)).unwrap();
        let f = fe.open(&path, OpenMode::Read).unwrap();
        // Dropped at once: the drop waits for the transfer, which drains its rings.
        let t = fe
            .load(&f, 0, AlignedBuffer::new(32 << 20).unwrap())
            .unwrap();
        drop(t);
        assert_eq!(uring_ops_in_flight(), 0, "staged {staged}");
        // The engine dropped with a transfer in flight: it completes, bytes right.
        let mut t = fe
            .load(&f, 4096, AlignedBuffer::new(16 << 20).unwrap())
            .unwrap();
        drop(fe);
        let (buf, r) = loop {
            if t.try_wait().is_some() {
                break t.wait().unwrap();
            }
            std::thread::yield_now();
        };
        assert!(
            buf[..] == data[4096..4096 + (16 << 20)],
            "staged {staged}: {r}"
        );
        assert_eq!(uring_ops_in_flight(), 0);
        assert_eq!(live_bounce_buffers(), 0);
    }
}

#[test]
fn io_uring_errors_name_the_file_and_the_errno() {
    let _g = serial();
    let Some((_dir, _, path)) = uring_file("errors", 8 << 20, 7) else {
        return;
    };
    for staged in [false, true] {
        let fe = FileEngine::new(base().uring(UringMode::On).staged(staged)).unwrap();
        let wo = {
            use std::os::unix::fs::OpenOptionsExt;
            let mut o = std::fs::OpenOptions::new();
            o.write(true).custom_flags(libc::O_DIRECT);
            o.open(&path).unwrap()
        };
        let inner = OsFile::open(&path, OpenMode::Read, true).unwrap();
        let f = FileHandle::from_io(
            path.clone(),
            Faulty {
                inner,
                truncate: None,
                fd: Some(wo),
            },
        );
        let mut a = AlignedBuffer::new(8 << 20).unwrap();
        let err = fe.load_into(&f, 0, &mut a[..]).unwrap_err();
        match &err {
            FileError::Io { path: p, msg, .. } => {
                assert_eq!(p, &path);
                assert!(msg.contains("os error 9"), "staged {staged}: {err}");
            }
            other => panic!("staged {staged}: expected an I/O error, got {other}"),
        }
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert_eq!(uring_ops_in_flight(), 0, "staged {staged}");
        drop(fe);
        assert_eq!(live_bounce_buffers(), 0);
    }
}
