//! The unique id every rank of a communicator must share, and the two ways ferry hands it from
//! rank 0 to the others: a file every rank can read (a shared file system, or `/tmp` on one
//! host), or an environment variable set by the launcher.
//!
//! The id is 128 opaque bytes made by rank 0 (`ncclGetUniqueId`; it names rank 0's bootstrap
//! socket). Its text form is 256 lowercase hex digits.

use super::error::NcclError;
use super::sys;
use std::path::Path;
use std::time::{Duration, Instant};

/// Bytes in an id.
pub(crate) const ID_BYTES: usize = 128;

/// A communicator's unique id. Made once by rank 0 ([`NcclId::new`]), then given to every
/// rank ([`NcclId::to_hex`]/[`NcclId::from_hex`], [`NcclId::exchange_file`],
/// [`NcclId::from_env`]).
///
/// ```
/// use ferry::engine::nccl::NcclId;
/// let id = NcclId::from_bytes([7u8; 128]);
/// let text = id.to_hex();
/// assert_eq!(text.len(), 256);
/// assert_eq!(NcclId::from_hex(&text)?, id);
/// assert!(NcclId::from_hex("12").is_err());
/// # Ok::<(), ferry::engine::nccl::NcclError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclId([u8; ID_BYTES]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclId({}..)", &self.to_hex()[..16])
    }
}

impl NcclId {
    /// A fresh id from the NCCL library (rank 0 calls this once per communicator). Needs the
    /// library, not a GPU. Errors: [`NcclError::NoLibrary`], [`NcclError::Nccl`].
    pub fn new() -> Result<NcclId, NcclError> {
        let lib = sys::lib().map_err(NcclError::NoLibrary)?;
        let mut id = sys::UniqueId { internal: [0; 128] };
        // SAFETY: `id` is a valid out-pointer to a whole ncclUniqueId.
        let r = unsafe { (lib.get_unique_id)(&mut id) };
        if r != sys::SUCCESS {
            return Err(NcclError::nccl("ncclGetUniqueId", r, None));
        }
        Ok(NcclId(id.internal.map(|c| c as u8)))
    }

    /// An id from its 128 bytes (as another process produced them).
    pub fn from_bytes(bytes: [u8; ID_BYTES]) -> NcclId {
        NcclId(bytes)
    }

    /// The 128 bytes.
    pub fn as_bytes(&self) -> &[u8; ID_BYTES] {
        &self.0
    }

    pub(crate) fn raw(&self) -> sys::UniqueId {
        sys::UniqueId {
            internal: self.0.map(|b| b as std::ffi::c_char),
        }
    }

    /// 256 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses [`to_hex`](Self::to_hex)'s form (surrounding whitespace allowed, either case).
    /// Errors: [`NcclError::BadId`] naming what is wrong.
    pub fn from_hex(text: &str) -> Result<NcclId, NcclError> {
        let t = text.trim();
        if t.len() != 2 * ID_BYTES {
            return Err(NcclError::BadId(format!(
                "expected {} hex digits, found {} characters",
                2 * ID_BYTES,
                t.len()
            )));
        }
        let mut out = [0u8; ID_BYTES];
        for (i, pair) in t.as_bytes().chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).map_err(|_| bad_digit(i))?;
            out[i] = u8::from_str_radix(s, 16).map_err(|_| bad_digit(i))?;
        }
        Ok(NcclId(out))
    }

    /// Reads the id from environment variable `var` (hex). Errors: [`NcclError::BadId`] when it
    /// is unset or malformed.
    pub fn from_env(var: &str) -> Result<NcclId, NcclError> {
        match std::env::var(var) {
            Ok(v) => NcclId::from_hex(&v).map_err(|e| NcclError::BadId(format!("${var}: {e}"))),
            Err(_) => Err(NcclError::BadId(format!("${var} is not set"))),
        }
    }

    /// Writes the id to `path` atomically (a temporary file in the same folder, then a rename),
    /// so a reader never sees half an id.
    pub fn write_file(&self, path: &Path) -> Result<(), NcclError> {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, self.to_hex() + "\n").map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(path, e)
        })
    }

    /// Reads an id from `path`, waiting up to `timeout` for the file to appear. Errors:
    /// [`NcclError::Timeout`], [`NcclError::BadId`] (a malformed file), [`NcclError::Io`].
    pub fn read_file(path: &Path, timeout: Duration) -> Result<NcclId, NcclError> {
        let start = Instant::now();
        loop {
            match std::fs::read_to_string(path) {
                Ok(s) => {
                    return NcclId::from_hex(&s)
                        .map_err(|e| NcclError::BadId(format!("{}: {e}", path.display())))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if start.elapsed() >= timeout {
                        return Err(NcclError::Timeout {
                            what: format!("the id file {} to appear", path.display()),
                            after: timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(io(path, e)),
            }
        }
    }

    /// The file exchange in one call: rank 0 makes a fresh id and writes it to `path`; every
    /// other rank waits up to `timeout` for the file and reads it. The path must be new for
    /// each communicator (e.g. name it after the job), or removed before the ranks start: a
    /// rank that finds an old file would use an old id.
    pub fn exchange_file(path: &Path, rank: u32, timeout: Duration) -> Result<NcclId, NcclError> {
        if rank == 0 {
            let id = NcclId::new()?;
            id.write_file(path)?;
            Ok(id)
        } else {
            NcclId::read_file(path, timeout)
        }
    }
}

fn bad_digit(pair: usize) -> NcclError {
    NcclError::BadId(format!(
        "characters {}..{} are not two hex digits",
        2 * pair,
        2 * pair + 2
    ))
}

fn io(path: &Path, e: std::io::Error) -> NcclError {
    NcclError::Io {
        path: path.display().to_string(),
        msg: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_errors() {
        let mut b = [0u8; ID_BYTES];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 37 + 11) as u8;
        }
        let id = NcclId::from_bytes(b);
        assert_eq!(NcclId::from_hex(&id.to_hex()).unwrap(), id);
        assert_eq!(
            NcclId::from_hex(&format!("  {}\n", id.to_hex().to_uppercase())).unwrap(),
            id
        );
        let short = NcclId::from_hex("abcd").unwrap_err().to_string();
        assert!(short.contains("256 hex digits"), "{short}");
        let mut bad = id.to_hex();
        bad.replace_range(10..12, "zz");
        let e = NcclId::from_hex(&bad).unwrap_err().to_string();
        assert!(e.contains("10..12"), "{e}");
        let mut multi = id.to_hex();
        multi.replace_range(0..2, "é");
        assert!(NcclId::from_hex(&multi).is_err());
    }

    #[test]
    fn file_exchange_waits_and_times_out() {
        let dir = std::env::temp_dir().join(format!("ferry-nccl-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("id");
        let _ = std::fs::remove_file(&path);
        let e = NcclId::read_file(&path, Duration::from_millis(50)).unwrap_err();
        assert!(matches!(e, NcclError::Timeout { .. }), "{e}");
        let id = NcclId::from_bytes([0x5a; ID_BYTES]);
        let p2 = path.clone();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(60));
            id.write_file(&p2).unwrap();
        });
        let got = NcclId::exchange_file(&path, 1, Duration::from_secs(10)).unwrap();
        writer.join().unwrap();
        assert_eq!(got, id);
        std::fs::write(&path, "not an id").unwrap();
        let e = NcclId::read_file(&path, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, NcclError::BadId(_)), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn env_id_errors_name_the_variable() {
        let e = NcclId::from_env("FERRY_TEST_SURELY_UNSET_VAR").unwrap_err();
        assert!(e.to_string().contains("FERRY_TEST_SURELY_UNSET_VAR"), "{e}");
    }
}
