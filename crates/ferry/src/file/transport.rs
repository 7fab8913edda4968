//! The transport of a transfer between a file and a buffer: the pure decision ([`choose`])
//! between cuFile (GPUDirect Storage) and the bounce ring for device memory, from [`Facts`]
//! gathered by the file engine (`cufile.rs` gathers and runs them). CPU tests in
//! `transport/tests.rs`.

use super::io::DIRECT_ALIGN;

/// When device transfers use cuFile (see the [module documentation](super)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CuFileMode {
    /// cuFile where GPUDirect Storage is real (the `nvidia-fs` module is loaded), else the
    /// bounce ring. The default.
    #[default]
    Auto,
    /// Never cuFile: the bounce ring.
    Off,
    /// cuFile wherever it opens, in its compatibility mode too (tests, and users who ask).
    On,
}

impl std::fmt::Display for CuFileMode {
    /// `auto`, `off`, `on` (as `FERRY_CUFILE` and `--cufile` take them).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CuFileMode::Auto => "auto",
            CuFileMode::Off => "off",
            CuFileMode::On => "on",
        })
    }
}

impl std::str::FromStr for CuFileMode {
    type Err = String;
    /// `auto`, `on` or `off` (any case).
    fn from_str(s: &str) -> Result<CuFileMode, String> {
        let modes = [
            ("auto", CuFileMode::Auto),
            ("on", CuFileMode::On),
            ("off", CuFileMode::Off),
        ];
        crate::env::word(s, &modes).ok_or_else(|| format!("{s:?} is not auto, on or off"))
    }
}

impl crate::env::EnvValue for CuFileMode {
    const EXPECTED: &'static str = "auto, on or off";
    fn parse_env(text: &str) -> Option<CuFileMode> {
        text.parse().ok()
    }
}

/// How a transfer's bytes move between the file and the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Transport {
    /// Host memory: the workers `pread`/`pwrite` it themselves. The default.
    #[default]
    Host,
    /// Device memory through the pinned bounce ring and the engine's copies.
    BounceRing,
    /// cuFile (`cuFileRead`/`cuFileWrite`); `compat`: in its compatibility mode (no
    /// `nvidia-fs`: cuFile reads into its own host buffers and copies).
    CuFile {
        /// True without `nvidia-fs`.
        compat: bool,
    },
}

impl Transport {
    /// True for either kind of cuFile.
    pub fn is_cufile(self) -> bool {
        matches!(self, Transport::CuFile { .. })
    }
}

impl std::fmt::Display for Transport {
    /// `host`, `bounce ring`, `cuFile`, `cuFile (compatibility mode)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Host => "host",
            Transport::BounceRing => "bounce ring",
            Transport::CuFile { compat: false } => "cuFile",
            Transport::CuFile { compat: true } => "cuFile (compatibility mode)",
        })
    }
}

/// What decides a transfer's transport ([`choose`]). The last three are checked by trying
/// (opening the driver, the file with `O_DIRECT`, registering it): pass `Ok(())` for one not
/// tried yet, to learn whether it matters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Facts {
    /// The mode asked for.
    pub mode: CuFileMode,
    /// The buffer is device memory (the CPU cannot reach it).
    pub device: bool,
    /// `libcufile` loads.
    pub libcufile: bool,
    /// The `nvidia-fs` kernel module is loaded (real GPUDirect Storage).
    pub nvidia_fs: bool,
    /// A load, or a store whose file range (and chunks) start and end on 4 KiB boundaries.
    /// cuFile writes through an `O_DIRECT` descriptor, where a partial block is read, changed
    /// and written back: two chunks or two stores sharing a block would race. Such stores go
    /// through the bounce ring, whose unaligned writes are buffered.
    pub aligned: bool,
    /// `cuFileDriverOpen` succeeded, or its error.
    pub driver: Result<(), String>,
    /// The file could be opened with `O_DIRECT`, or why not.
    pub direct: Result<(), String>,
    /// `cuFileHandleRegister` accepted the file, or its error.
    pub registered: Result<(), String>,
}

impl Facts {
    /// A device or host transfer under `mode` on a host with or without `libcufile` and
    /// `nvidia-fs`; aligned, and the tried facts `Ok` (set the fields to change them).
    pub fn new(mode: CuFileMode, device: bool, libcufile: bool, nvidia_fs: bool) -> Facts {
        Facts {
            mode,
            device,
            libcufile,
            nvidia_fs,
            aligned: true,
            driver: Ok(()),
            direct: Ok(()),
            registered: Ok(()),
        }
    }
}

/// A transport and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The transport.
    pub transport: Transport,
    /// Why, in words (the first missing piece when cuFile is not used).
    pub reason: String,
}

impl std::fmt::Display for Choice {
    /// `bounce ring: nvidia-fs not loaded: ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.transport, self.reason)
    }
}

/// The reason [`choose`] gives in [`CuFileMode::Auto`] on a host without `nvidia-fs`.
pub const NO_NVIDIA_FS: &str = "nvidia-fs not loaded: cuFile would run in its compatibility mode; \
     ferry's bounce ring is used (FERRY_CUFILE=on to force cuFile)";

/// The transport of a transfer, and why: host memory is the workers'; device memory goes
/// through cuFile when the mode allows it and every piece is there, else the bounce ring, with
/// the first missing piece as the reason. Pure; see [`Facts`].
///
/// ```
/// use ferry::file::{choose, CuFileMode, Facts, Transport};
/// let c = choose(&Facts::new(CuFileMode::Auto, true, true, false));
/// assert_eq!(c.transport, Transport::BounceRing);
/// let c = choose(&Facts::new(CuFileMode::On, true, true, false));
/// assert_eq!(c.transport, Transport::CuFile { compat: true });
/// ```
pub fn choose(f: &Facts) -> Choice {
    let ring = |reason: String| Choice {
        transport: Transport::BounceRing,
        reason,
    };
    if !f.device {
        return Choice {
            transport: Transport::Host,
            reason: "host memory: the workers read and write it themselves".into(),
        };
    }
    if f.mode == CuFileMode::Off {
        return ring("cuFile is off (FileConfig::cufile(Off), FERRY_CUFILE=off)".into());
    }
    if !f.libcufile {
        return ring("libcufile.so.0 was not found: GPUDirect Storage is not installed".into());
    }
    if !f.nvidia_fs && f.mode == CuFileMode::Auto {
        return ring(NO_NVIDIA_FS.into());
    }
    if !f.aligned {
        return ring(format!(
            "a store at a file offset or length that is not a multiple of {DIRECT_ALIGN} \
             bytes: written buffered, as cuFile's O_DIRECT writes of shared blocks could race"
        ));
    }
    if let Err(e) = &f.driver {
        return ring(format!("cuFile's driver did not open: {e}"));
    }
    if let Err(e) = &f.direct {
        return ring(format!(
            "the file cannot be opened with O_DIRECT, which cuFile needs: {e}"
        ));
    }
    if let Err(e) = &f.registered {
        return ring(format!("cuFileHandleRegister refused the file: {e}"));
    }
    let asked = if f.mode == CuFileMode::On {
        " (asked for: FileConfig::cufile(On) or FERRY_CUFILE=on)"
    } else {
        ""
    };
    if f.nvidia_fs {
        Choice {
            transport: Transport::CuFile { compat: false },
            reason: format!("GPUDirect Storage, nvidia-fs is loaded{asked}"),
        }
    } else {
        Choice {
            transport: Transport::CuFile { compat: true },
            reason: format!("nvidia-fs not loaded, cuFile runs in its compatibility mode{asked}"),
        }
    }
}

#[cfg(test)]
mod tests;
