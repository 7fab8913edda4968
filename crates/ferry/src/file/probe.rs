//! Whether GPUDirect Storage (cuFile) moves file bytes to and from GPUs here, and why (not).

use super::cufile;
use super::transport::{choose, Choice, CuFileMode, Facts};

/// What this host offers device transfers: `libcufile`, `nvidia-fs`, and the transport
/// [`choose`] would pick for them with the default mode and with `FERRY_CUFILE`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdsProbe {
    /// `libcufile.so.0` (or `libcufile.so`) loads.
    pub libcufile: bool,
    /// The `nvidia-fs` kernel module is loaded.
    pub nvidia_fs: bool,
    /// `FERRY_CUFILE`, if set (or why its value does not parse).
    pub env_mode: Option<Result<CuFileMode, crate::ConfigError>>,
    /// The choice in [`CuFileMode::Auto`] (the driver, `O_DIRECT` and the file's registration
    /// assumed to succeed: they are tried at the first transfer).
    pub auto: Choice,
    /// The choice in the mode `FERRY_CUFILE` asks for (`Auto` when unset or bad).
    pub configured: Choice,
}

/// Probes `libcufile` (loads it, calling nothing) and `nvidia-fs`; opens no driver.
pub fn gds_probe() -> GdsProbe {
    let libcufile = cufile::libcufile_present();
    let nvidia_fs = crate::engine::cuda::sys::probe::nvidia_fs_loaded();
    let env_mode = crate::env::var::<CuFileMode>(&crate::env::process, "FERRY_CUFILE").transpose();
    let mode = match &env_mode {
        Some(Ok(m)) => *m,
        _ => CuFileMode::Auto,
    };
    GdsProbe {
        libcufile,
        nvidia_fs,
        env_mode,
        auto: choose(&Facts::new(CuFileMode::Auto, true, libcufile, nvidia_fs)),
        configured: choose(&Facts::new(mode, true, libcufile, nvidia_fs)),
    }
}
