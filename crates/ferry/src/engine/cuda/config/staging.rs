//! [`StagingConfig`]: the tuning of a [`Stager`](crate::engine::cuda::paths::staged::Stager), from code or from the
//! `FERRY_STAGING_*` environment variables.

use crate::env::{self, ConfigError};

/// Tuning of the staged path of pageable copies (the engine's stager): chunk size, ring depth, worker threads. Plain data; start from
/// [`StagingConfig::new`] (the defaults) and chain setters.
///
/// ```
/// use ferry::cuda::StagingConfig;
/// let cfg = StagingConfig::new().chunk_bytes(64 << 20).ring_depth(3).threads(12);
/// assert_eq!(cfg.get_threads(), 12);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingConfig {
    pub(crate) chunk_bytes: usize,
    pub(crate) ring_depth: usize,
    pub(crate) threads: usize,
    pub(crate) write_combined: bool,
    pub(crate) non_temporal: bool,
    pub(crate) non_temporal_h2d: bool,
}

impl Default for StagingConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl StagingConfig {
    /// The defaults: 16 MiB chunks, a ring of 4 per direction, three quarters of the cores as
    /// worker threads (1 to 12), cached (not write-combined) staging memory, non-temporal stores
    /// for device -> host, plain stores for host -> device. Reads nothing from the environment
    /// ([`StagingConfig::from_env`] does).
    pub fn new() -> Self {
        StagingConfig {
            chunk_bytes: 16 << 20,
            ring_depth: 4,
            threads: crate::staging::policy::default_workers(),
            write_combined: false,
            non_temporal: true,
            non_temporal_h2d: false,
        }
    }

    /// The defaults with the environment's overrides, as KvikIO's `KVIKIO_*` variables do, so
    /// that a deployed program is tuned without a rebuild: `FERRY_STAGING_CHUNK` (bytes),
    /// `FERRY_STAGING_DEPTH`, `FERRY_STAGING_THREADS`, `FERRY_STAGING_NT` and
    /// `FERRY_STAGING_NT_H2D` (`0` or `1`). Unset variables keep the default; the setters still
    /// apply on top.
    ///
    /// Errors: [`ConfigError`] naming a variable whose value does not parse. Ranges are checked
    /// when an engine makes its stager.
    ///
    /// ```
    /// use ferry::cuda::StagingConfig;
    /// let cfg = StagingConfig::from_env()?.threads(4);
    /// assert_eq!(cfg.get_threads(), 4);
    /// # Ok::<(), ferry::ConfigError>(())
    /// ```
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(&env::process)
    }

    /// [`from_env`](Self::from_env) over any lookup.
    pub(crate) fn from_lookup(get: env::Lookup<'_>) -> Result<Self, ConfigError> {
        let mut c = Self::new();
        env::apply(get, "FERRY_STAGING_CHUNK", &mut c.chunk_bytes)?;
        env::apply(get, "FERRY_STAGING_DEPTH", &mut c.ring_depth)?;
        env::apply(get, "FERRY_STAGING_THREADS", &mut c.threads)?;
        env::apply(get, "FERRY_STAGING_NT", &mut c.non_temporal)?;
        env::apply(get, "FERRY_STAGING_NT_H2D", &mut c.non_temporal_h2d)?;
        Ok(c)
    }
    /// Bytes per staging buffer (one DMA per chunk). Must be at least 4096.
    pub fn chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes;
        self
    }
    /// Staging buffers per direction. Must be at least 2 (one filling while one moves).
    pub fn ring_depth(mut self, depth: usize) -> Self {
        self.ring_depth = depth;
        self
    }
    /// Persistent CPU worker threads that split each chunk's host-side copy. At least 1.
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }
    /// Allocate the host -> device ring write-combined (the CPU only writes it). The device ->
    /// host ring is never write-combined: the CPU reads it, and reads of such memory are slow.
    pub fn write_combined(mut self, on: bool) -> Self {
        self.write_combined = on;
        self
    }
    /// Copy from the device -> host ring into pageable memory with non-temporal (streaming)
    /// stores on x86-64, which skip the read-for-ownership of each destination line: host
    /// memory bandwidth, shared by the CPU copy and the DMA, is what caps a staged copy. On by
    /// default (`FERRY_STAGING_NT=0` turns it off).
    pub fn non_temporal(mut self, on: bool) -> Self {
        self.non_temporal = on;
        self
    }
    /// The same for the host -> device fill of the ring. Off by default: on the H200 host
    /// plain stores filled the ring as fast (45.8 against 45.6 GB/s for 256 MiB, one run,
    /// run 17 in `bench/results/h200.md`); `FERRY_STAGING_NT_H2D=1` turns it on.
    pub fn non_temporal_h2d(mut self, on: bool) -> Self {
        self.non_temporal_h2d = on;
        self
    }
    /// Whether the workers use non-temporal stores.
    pub fn get_non_temporal(&self) -> bool {
        self.non_temporal
    }
    /// Bytes per chunk.
    pub fn get_chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }
    /// Ring depth.
    pub fn get_ring_depth(&self) -> usize {
        self.ring_depth
    }
    /// Worker threads.
    pub fn get_threads(&self) -> usize {
        self.threads
    }
    /// Whether the host -> device ring is write-combined.
    pub fn get_write_combined(&self) -> bool {
        self.write_combined
    }
}

#[cfg(test)]
mod tests {
    use super::StagingConfig;
    use crate::env::pairs;

    #[test]
    fn from_lookup_reads_every_variable() {
        let c = StagingConfig::from_lookup(&pairs(&[
            ("FERRY_STAGING_CHUNK", "8388608"),
            ("FERRY_STAGING_DEPTH", "6"),
            ("FERRY_STAGING_THREADS", " 3 "),
            ("FERRY_STAGING_NT", "0"),
            ("FERRY_STAGING_NT_H2D", "1"),
        ]))
        .unwrap();
        let want = StagingConfig::new()
            .chunk_bytes(8 << 20)
            .ring_depth(6)
            .threads(3)
            .non_temporal(false)
            .non_temporal_h2d(true);
        assert_eq!(c, want);
        assert_eq!(
            StagingConfig::from_lookup(&pairs(&[])).unwrap(),
            StagingConfig::new()
        );
        let e = StagingConfig::from_lookup(&pairs(&[("FERRY_STAGING_NT", "2")])).unwrap_err();
        assert_eq!((e.var, e.value.as_str()), ("FERRY_STAGING_NT", "2"));
    }

    /// The only test of the staging config that touches the process environment (no other
    /// test of this binary reads these variables: `new()` ignores them).
    #[test]
    fn new_ignores_the_environment_and_from_env_reads_it() {
        std::env::set_var("FERRY_STAGING_THREADS", "77");
        std::env::set_var("FERRY_STAGING_CHUNK", "1M");
        let new = StagingConfig::new();
        let bad = StagingConfig::from_env();
        std::env::remove_var("FERRY_STAGING_CHUNK");
        let good = StagingConfig::from_env();
        std::env::remove_var("FERRY_STAGING_THREADS");
        assert_eq!(new.get_chunk_bytes(), 16 << 20);
        assert_ne!(new, StagingConfig::new().threads(77));
        let e = bad.unwrap_err();
        assert_eq!((e.var, e.value.as_str()), ("FERRY_STAGING_CHUNK", "1M"));
        assert!(e.to_string().contains("FERRY_STAGING_CHUNK"), "{e}");
        assert_eq!(good.unwrap(), StagingConfig::new().threads(77));
    }
}
