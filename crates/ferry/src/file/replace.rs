//! Replacing a file whole, so that a failed write loses nothing: the new bytes go to a
//! temporary file beside the file they replace, renamed over it once complete
//! ([`Replacement`]). Checkpoint saves ([`crate::checkpoint::save`]) and the CLI's `ferry
//! save` of plain bytes write through it.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A file being replaced: [`Replacement::new`] picks and creates the temporary file,
/// the caller writes it (by its path, through any engine), [`Replacement::commit`] renames it
/// over the target; dropped without a commit, the temporary file is removed and the target
/// stays as it was.
///
/// What is replaced: the file `path` names, through symbolic links (a link stays a link to
/// the new file). Its permission bits carry over to the new file. A target that exists and is
/// not a regular file (a device, FIFO, socket or folder) is refused: renaming over it would
/// replace, say, `/dev/null` with a regular file.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// let r = ferry::file::Replacement::new("model.bin".as_ref())?;
/// std::fs::write(r.temp_path(), b"new bytes")?;
/// r.commit(false)?; // model.bin now holds the new bytes
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Replacement {
    target: PathBuf,
    tmp: PathBuf,
    /// The existing target's permission bits, given to the new file.
    mode: Option<u32>,
    committed: bool,
}

/// Numbers the temporary files of one process.
static NEXT: AtomicU64 = AtomicU64::new(0);

impl Replacement {
    /// Starts replacing `path`: resolves symbolic links, checks what exists there, and creates
    /// an empty temporary file `<name>.ferry-partial-<pid>-<n>` beside the target (created
    /// exclusively: an existing file of that name, the user's, is never touched).
    ///
    /// Errors: [`io::ErrorKind::InvalidInput`] for a target that is not a regular file or a
    /// symbolic link to a missing file; the folder's own errors (missing, not writable).
    pub fn new(path: &Path) -> io::Result<Replacement> {
        let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
        let (target, mode) = match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => (path.to_path_buf(), None),
            Err(e) => return Err(e),
            Ok(link) => {
                let target = if link.file_type().is_symlink() {
                    std::fs::canonicalize(path).map_err(|e| {
                        invalid(format!(
                            "{} is a symbolic link to a file that cannot be reached: {e}",
                            path.display()
                        ))
                    })?
                } else {
                    path.to_path_buf()
                };
                let meta = std::fs::metadata(&target)?;
                if !meta.is_file() {
                    return Err(invalid(format!(
                        "{} is {}, not a regular file: it cannot be replaced",
                        target.display(),
                        super::io::kind_words(&meta.file_type())
                    )));
                }
                (target, Some(meta.permissions().mode() & 0o7777))
            }
        };
        let name = target
            .file_name()
            .ok_or_else(|| invalid(format!("{} names no file", path.display())))?;
        let pid = std::process::id();
        loop {
            let mut tmp_name = name.to_os_string();
            tmp_name.push(format!(
                ".ferry-partial-{pid}-{}",
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let tmp = target.with_file_name(tmp_name);
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
            {
                Ok(_) => {
                    return Ok(Replacement {
                        target,
                        tmp,
                        mode,
                        committed: false,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    let dir = tmp.parent().filter(|d| !d.as_os_str().is_empty());
                    return Err(io::Error::new(
                        e.kind(),
                        format!(
                            "cannot create the temporary file {} (the new bytes go there, then \
                             are renamed over {}): the folder {} does not take new files: {e}",
                            tmp.display(),
                            target.display(),
                            dir.unwrap_or(Path::new(".")).display()
                        ),
                    ));
                }
            }
        }
    }

    /// The temporary file to write the new bytes into (it exists, empty).
    pub fn temp_path(&self) -> &Path {
        &self.tmp
    }

    /// The file that is replaced (symbolic links resolved).
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Renames the temporary file over the target, after giving it the target's permission
    /// bits if the target existed; with `fsync`, also syncs the folder, so that the rename
    /// outlasts a crash (the caller syncs the file's own bytes first). On an error the
    /// temporary file is removed and the target, if the rename did not happen, is untouched.
    pub fn commit(mut self, fsync: bool) -> io::Result<()> {
        if let Some(mode) = self.mode {
            std::fs::set_permissions(&self.tmp, std::fs::Permissions::from_mode(mode))?;
        }
        std::fs::rename(&self.tmp, &self.target)?;
        self.committed = true;
        if fsync {
            let dir = self.target.parent().filter(|d| !d.as_os_str().is_empty());
            std::fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()?;
        }
        Ok(())
    }
}

impl Drop for Replacement {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn commit_replaces_and_keeps_the_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.bin");
        std::fs::write(&p, b"old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let r = Replacement::new(&p).unwrap();
        std::fs::write(r.temp_path(), b"new").unwrap();
        // The target is untouched until the commit.
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        r.commit(true).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        assert_eq!(names(d.path()), ["f.bin"]);
    }

    #[test]
    fn dropped_without_commit_leaves_the_target() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.bin");
        std::fs::write(&p, b"old").unwrap();
        // A file of the old temporary name belongs to the user: never touched.
        let users = d.path().join("f.bin.ferry-partial");
        std::fs::write(&users, b"mine").unwrap();
        let r = Replacement::new(&p).unwrap();
        std::fs::write(r.temp_path(), b"half").unwrap();
        drop(r);
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert_eq!(std::fs::read(&users).unwrap(), b"mine");
        assert_eq!(names(d.path()), ["f.bin", "f.bin.ferry-partial"]);
        // A new file: nothing left behind either.
        let q = d.path().join("new.bin");
        drop(Replacement::new(&q).unwrap());
        assert!(!q.exists());
    }

    #[test]
    fn a_symbolic_link_is_written_through() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real.bin");
        let link = d.path().join("link.bin");
        std::fs::write(&real, b"old").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let r = Replacement::new(&link).unwrap();
        assert_eq!(r.target(), std::fs::canonicalize(&real).unwrap());
        std::fs::write(r.temp_path(), b"new").unwrap();
        r.commit(false).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
        // A link to nothing is refused.
        let dangling = d.path().join("dangling.bin");
        std::os::unix::fs::symlink(d.path().join("missing"), &dangling).unwrap();
        let e = Replacement::new(&dangling).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }

    #[test]
    fn what_is_not_a_regular_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = Replacement::new(d.path()).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = Replacement::new(&fifo).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        if Path::new("/dev/null").exists() {
            let e = Replacement::new(Path::new("/dev/null")).unwrap_err();
            assert!(e.to_string().contains("a character device"), "{e}");
        }
        // Nothing was created beside them.
        assert_eq!(names(d.path()), ["fifo"]);
    }
}
