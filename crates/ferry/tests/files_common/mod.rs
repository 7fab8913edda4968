//! Shared helpers of the CPU file and checkpoint tests: deterministic bytes, a temp folder
//! removed on drop, and a real file whose reads a test can intercept.
#![allow(dead_code)]

use ferry::file::{FileConfig, FileEngine, FileIo, OpenMode, OsFile};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Deterministic bytes, different per seed (xorshift).
pub fn bytes(n: usize, seed: u64) -> Vec<u8> {
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

/// Three small file engines: buffered, `O_DIRECT`, and staged (host buffers through the
/// bounce ring: the path device loads take).
pub fn engines() -> Vec<(&'static str, FileEngine)> {
    let base = FileConfig::new().threads(3).chunk_bytes(64 << 10);
    vec![
        ("buffered", FileEngine::new(base).unwrap()),
        ("direct", FileEngine::new(base.direct(true)).unwrap()),
        ("staged", FileEngine::new(base.staged(true)).unwrap()),
    ]
}

/// A folder in the temp dir, removed (with its files) on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "ferry-files-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    /// Writes `data` to `name` in the folder; returns its path.
    pub fn file(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, data).expect("write temp file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a [`Hooked`] file's hook says about one read: `None` lets it through.
pub type ReadHook = Box<dyn Fn(&Path, &mut [u8], u64) -> Option<io::Result<usize>> + Send + Sync>;

/// A real file whose every read first goes to a hook (which may fail it, or change the file).
pub struct Hooked {
    inner: OsFile,
    path: PathBuf,
    hook: ReadHook,
}

impl Hooked {
    pub fn open(path: &Path, direct: bool, hook: ReadHook) -> Hooked {
        Hooked {
            inner: OsFile::open(path, OpenMode::Read, direct).expect("open"),
            path: path.to_path_buf(),
            hook,
        }
    }
}

impl FileIo for Hooked {
    fn read_at(&self, buf: &mut [u8], offset: u64, direct: bool) -> io::Result<usize> {
        if let Some(r) = (self.hook)(&self.path, buf, offset) {
            return r;
        }
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
