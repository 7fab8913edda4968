//! Replacing a file whole, so that a failed write loses nothing: the new bytes go to a
//! temporary file beside the file they replace, renamed over it once complete
//! ([`Replacement`]). A process killed outright (SIGKILL, a crash) cannot remove its temporary
//! file; the next replacement of the same file removes it, once the process that made it is
//! gone ([`Replacement::new`]). Checkpoint saves ([`crate::checkpoint::save`]) and the CLI's `ferry
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
    /// Before that, temporary files of the same target left by processes that no longer run
    /// (a save killed with SIGKILL, a crash) are removed: `<name>.ferry-partial-<pid>-<n>`
    /// whose `<pid>` is neither this process nor any live one. Another live process's
    /// temporary file (a save in progress) is never touched; a pid since reused by an
    /// unrelated process keeps its file until that process ends.
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
        remove_abandoned(&target, name, pid);
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

/// Removes the temporary files of `target` (its file name `name`) whose process is gone: see
/// [`Replacement::new`]. Best effort: a folder that cannot be listed, or a file that cannot be
/// removed, is left as it is (the new replacement does not depend on it).
fn remove_abandoned(target: &Path, name: &std::ffi::OsStr, me: u32) {
    let dir = target.parent().filter(|d| !d.as_os_str().is_empty());
    let Ok(entries) = std::fs::read_dir(dir.unwrap_or(Path::new("."))) else {
        return;
    };
    let mut prefix = name.as_encoded_bytes().to_vec();
    prefix.extend_from_slice(b".ferry-partial-");
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(pid) = file
            .as_encoded_bytes()
            .strip_prefix(prefix.as_slice())
            .and_then(partial_pid)
        else {
            continue;
        };
        if pid != me && !alive(pid) && entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The pid of a temporary file's name past `.ferry-partial-`: `<pid>-<n>`, both decimal.
fn partial_pid(rest: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(rest).ok()?;
    let (pid, n) = text.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(n) {
        return None;
    }
    pid.parse().ok().filter(|&p| p > 0)
}

/// Whether process `pid` exists (signal 0 delivers nothing; EPERM means it exists but is
/// another user's). Unknown answers count as alive, so that nothing live is removed.
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: kill with signal 0 only checks that `pid` exists and may be signalled.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
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
    fn abandoned_partial_files_are_removed_live_ones_kept() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.bin");
        std::fs::write(&p, b"old").unwrap();
        // A process that has ended: a child, waited for (its pid free until reused).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let live = std::os::unix::process::parent_id(); // our parent runs
        let keep = [
            format!("f.bin.ferry-partial-{live}-0"),
            format!("f.bin.ferry-partial-{}-7", std::process::id()),
            format!("f.bin.ferry-partial-{dead}-x"), // not ferry's name
            format!("g.bin.ferry-partial-{dead}-0"), // another file's
        ];
        for n in &keep {
            std::fs::write(d.path().join(n), b"keep").unwrap();
        }
        let gone = d.path().join(format!("f.bin.ferry-partial-{dead}-3"));
        std::fs::write(&gone, b"left by a killed save").unwrap();
        let r = Replacement::new(&p).unwrap();
        if !alive(dead) {
            assert!(!gone.exists());
        }
        for n in &keep {
            assert_eq!(std::fs::read(d.path().join(n)).unwrap(), b"keep", "{n}");
        }
        drop(r);
        assert_eq!(partial_pid(b"12-0"), Some(12));
        assert_eq!(partial_pid(b"12-"), None);
        assert_eq!(partial_pid(b"0-1"), None);
        assert_eq!(partial_pid(b"a-1"), None);
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
