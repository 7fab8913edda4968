//! [`FileConfig`]: the settings of a [`FileEngine`](super::FileEngine), from code or from the
//! `FERRY_FILE_*` environment variables.

use super::error::FileError;
use super::issue::UringMode;
use super::transport::CuFileMode;
use crate::env::{self, ConfigError};

/// Settings of a [`FileEngine`](super::FileEngine). Plain data: [`FileConfig::new`] then chained setters.
///
/// ```
/// let cfg = ferry::file::FileConfig::new().threads(4).chunk_bytes(8 << 20).direct(true);
/// assert_eq!(cfg.threads, 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileConfig {
    /// Worker threads (1 to 256).
    pub threads: usize,
    /// Largest chunk one worker reads or writes at a time, and the size of each bounce buffer
    /// (at least 1).
    pub chunk_bytes: usize,
    /// Bounce buffers in the ring (at least 1; more than `threads` is never used).
    pub ring_depth: usize,
    /// Open files with `O_DIRECT` too (see the [module documentation](super)).
    pub direct: bool,
    /// Send host buffers through the bounce ring (and the engine, if any) as well, the path
    /// device buffers take. For tests of that path without a GPU.
    pub staged: bool,
    /// Issue `O_DIRECT` reads and writes through io_uring ([`UringMode`]; default `Auto`).
    pub uring: UringMode,
    /// io_uring entries in flight per runner thread (1 to 4096; default 32).
    pub uring_depth: usize,
    /// When device buffers use cuFile (GPUDirect Storage) instead of the bounce ring.
    pub cufile: CuFileMode,
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig::new()
    }
}

impl FileConfig {
    /// The defaults: one thread per core (1 to 16), 4 MiB chunks, one bounce buffer per
    /// thread, buffered I/O. Reads nothing from the environment ([`FileConfig::from_env`] does).
    pub fn new() -> FileConfig {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.clamp(1, 16);
        FileConfig {
            threads,
            chunk_bytes: 4 << 20,
            ring_depth: threads,
            direct: false,
            staged: false,
            uring: UringMode::Auto,
            uring_depth: 32,
            cufile: CuFileMode::Auto,
        }
    }
    /// The defaults with the environment's overrides, as the staging path's
    /// ([`StagingConfig::from_env`](crate::engine::cuda::paths::staged::StagingConfig::from_env)):
    /// `FERRY_FILE_THREADS`, `FERRY_FILE_CHUNK` (bytes), `FERRY_FILE_DEPTH` (default: the
    /// threads), `FERRY_FILE_DIRECT` (`0` or `1`), `FERRY_FILE_URING` (`off`, `on` or `auto`),
    /// `FERRY_FILE_URING_DEPTH`, `FERRY_CUFILE` (`auto`, `on` or `off`:
    /// [`FileConfig::cufile`]). Unset variables keep the default.
    ///
    /// Errors: [`ConfigError`] naming a variable whose value does not parse.
    /// Ranges are checked by [`FileEngine::new`](super::FileEngine::new).
    pub fn from_env() -> Result<FileConfig, ConfigError> {
        FileConfig::from_lookup(&env::process)
    }
    /// [`from_env`](Self::from_env) over any lookup.
    pub(crate) fn from_lookup(get: env::Lookup<'_>) -> Result<FileConfig, ConfigError> {
        let mut c = FileConfig::new();
        if let Some(n) = env::var(get, "FERRY_FILE_THREADS")? {
            c = c.threads(n);
        }
        env::apply(get, "FERRY_FILE_CHUNK", &mut c.chunk_bytes)?;
        env::apply(get, "FERRY_FILE_DEPTH", &mut c.ring_depth)?;
        env::apply(get, "FERRY_FILE_DIRECT", &mut c.direct)?;
        env::apply(get, "FERRY_FILE_URING", &mut c.uring)?;
        env::apply(get, "FERRY_FILE_URING_DEPTH", &mut c.uring_depth)?;
        env::apply(get, "FERRY_CUFILE", &mut c.cufile)?;
        Ok(c)
    }
    /// Sets the worker threads (the ring depth follows unless set after).
    pub fn threads(mut self, n: usize) -> FileConfig {
        self.threads = n;
        self.ring_depth = n;
        self
    }
    /// Sets the chunk (and bounce buffer) size.
    pub fn chunk_bytes(mut self, bytes: usize) -> FileConfig {
        self.chunk_bytes = bytes;
        self
    }
    /// Sets the number of bounce buffers.
    pub fn ring_depth(mut self, depth: usize) -> FileConfig {
        self.ring_depth = depth;
        self
    }
    /// Opens files with `O_DIRECT` as well (used where alignment allows).
    pub fn direct(mut self, on: bool) -> FileConfig {
        self.direct = on;
        self
    }
    /// Sets whether `O_DIRECT` transfers go through io_uring.
    pub fn uring(mut self, mode: UringMode) -> FileConfig {
        self.uring = mode;
        self
    }
    /// Sets the io_uring queue depth (entries in flight per runner thread).
    pub fn uring_depth(mut self, depth: usize) -> FileConfig {
        self.uring_depth = depth;
        self
    }
    /// Sets when device buffers use cuFile ([`CuFileMode`]; `Auto` by default: where the
    /// `nvidia-fs` module makes it real GPUDirect Storage).
    pub fn cufile(mut self, mode: CuFileMode) -> FileConfig {
        self.cufile = mode;
        self
    }
    /// Routes host buffers through the bounce ring too.
    pub fn staged(mut self, on: bool) -> FileConfig {
        self.staged = on;
        self
    }
    pub(super) fn check(&self) -> Result<(), FileError> {
        let bad = |s: String| Err(FileError::BadConfig(s));
        if self.threads == 0 || self.threads > 256 {
            return bad(format!("threads {} is not in 1..=256", self.threads));
        }
        if self.chunk_bytes == 0 {
            return bad("chunk_bytes is 0".into());
        }
        if self.ring_depth == 0 {
            return bad("ring_depth is 0".into());
        }
        if self.uring_depth == 0 || self.uring_depth > 4096 {
            return bad(format!(
                "uring_depth {} is not in 1..=4096",
                self.uring_depth
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::FileConfig;
    use crate::env::pairs;

    #[test]
    fn from_lookup_reads_every_variable() {
        let c = FileConfig::from_lookup(&pairs(&[
            ("FERRY_FILE_THREADS", "3"),
            ("FERRY_FILE_CHUNK", "65536"),
            ("FERRY_FILE_DIRECT", "1"),
            ("FERRY_FILE_URING", "off"),
            ("FERRY_FILE_URING_DEPTH", "8"),
            ("FERRY_CUFILE", "on"),
        ]))
        .unwrap();
        let want = FileConfig::new().threads(3).chunk_bytes(65536).direct(true);
        let want = want.uring(super::UringMode::Off).uring_depth(8);
        assert_eq!(c, want.cufile(super::CuFileMode::On));
        let c = FileConfig::from_lookup(&pairs(&[
            ("FERRY_FILE_DEPTH", "2"),
            ("FERRY_FILE_THREADS", "5"),
        ]))
        .unwrap();
        assert_eq!((c.threads, c.ring_depth), (5, 2));
        // The off/auto/on words in any case, as the command line takes them.
        let c = FileConfig::from_lookup(&pairs(&[
            ("FERRY_FILE_URING", " Off"),
            ("FERRY_CUFILE", "ON"),
        ]))
        .unwrap();
        assert_eq!(
            (c.uring, c.cufile),
            (super::UringMode::Off, super::CuFileMode::On)
        );
        assert_eq!(
            FileConfig::from_lookup(&pairs(&[])).unwrap(),
            FileConfig::new()
        );
        let e = FileConfig::from_lookup(&pairs(&[("FERRY_FILE_DIRECT", "yes")])).unwrap_err();
        assert_eq!((e.var, e.value.as_str()), ("FERRY_FILE_DIRECT", "yes"));
        let e = FileConfig::from_lookup(&pairs(&[("FERRY_FILE_URING", "yes")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "$FERRY_FILE_URING=\"yes\" is not off, on or auto"
        );
        let e = FileConfig::from_lookup(&pairs(&[("FERRY_CUFILE", "yes")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "$FERRY_CUFILE=\"yes\" is not auto, on or off"
        );
    }

    /// The only test of the file config that touches the process environment (no other test
    /// of this binary reads these variables: `new()` ignores them).
    #[test]
    fn new_ignores_the_environment_and_from_env_reads_it() {
        std::env::set_var("FERRY_FILE_CHUNK", "12345");
        std::env::set_var("FERRY_FILE_THREADS", "four");
        let new = FileConfig::new();
        let bad = FileConfig::from_env();
        std::env::remove_var("FERRY_FILE_THREADS");
        let good = FileConfig::from_env();
        std::env::remove_var("FERRY_FILE_CHUNK");
        assert_eq!(new.chunk_bytes, 4 << 20);
        let e = bad.unwrap_err();
        assert!(
            e.to_string().contains("$FERRY_FILE_THREADS=\"four\""),
            "{e}"
        );
        assert_eq!(good.unwrap(), FileConfig::new().chunk_bytes(12345));
    }
}
