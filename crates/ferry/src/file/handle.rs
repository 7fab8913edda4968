//! An open file as loads and stores take it: the cloneable [`FileHandle`], over the file's
//! [`FileIo`], with its `O_DIRECT` state and its registration with cuFile.

use super::cufile::FileGds;
use super::error::{FileError, IoOp};
use super::io::{FileIo, OpenMode, OsFile};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

pub(crate) struct FileInner {
    pub(crate) path: PathBuf,
    pub(crate) io: Box<dyn FileIo>,
    /// Set once a direct transfer was refused at run time (`EINVAL`): later ones go buffered.
    pub(crate) direct_refused: Mutex<Option<String>>,
    /// Its registration with cuFile, once a device transfer asked for it.
    pub(crate) gds: FileGds,
}

impl FileInner {
    /// `Ok` if direct transfers may be tried now, else why not.
    pub(crate) fn direct_ok(&self) -> Result<(), String> {
        self.io.direct()?;
        match &*self
            .direct_refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }
    pub(crate) fn refuse_direct(&self, why: String) {
        let mut g = self
            .direct_refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if g.is_none() {
            *g = Some(why);
        }
    }
}

/// An open file that loads and stores take. Cheap to clone (shared); requests keep it open
/// until they complete.
///
/// ```
/// use ferry::file::{FileHandle, OpenMode};
/// let path = std::env::temp_dir().join(format!("ferry-doc-handle-{}", std::process::id()));
/// std::fs::write(&path, b"hello")?;
/// let f = FileHandle::open(&path, OpenMode::Read, false)?;
/// assert_eq!(f.len()?, 5);
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct FileHandle {
    pub(crate) inner: Arc<FileInner>,
}

impl std::fmt::Debug for FileHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileHandle")
            .field("path", &self.inner.path)
            .field("direct", &self.inner.direct_ok())
            .finish()
    }
}

impl FileHandle {
    /// Opens `path`. With `direct`, an `O_DIRECT` descriptor is opened too; a filesystem that
    /// refuses it (tmpfs on older kernels, some network filesystems) is not an error: the
    /// handle then runs buffered and [`FileHandle::direct`] says why.
    pub fn open(
        path: impl AsRef<Path>,
        mode: OpenMode,
        direct: bool,
    ) -> Result<FileHandle, FileError> {
        let path = path.as_ref();
        let io = OsFile::open(path, mode, direct).map_err(|e| FileError::Open {
            path: path.to_path_buf(),
            kind: e.kind(),
            msg: e.to_string(),
        })?;
        let h = FileHandle::from_io(path, io);
        h.inner.gds.set_os(mode);
        Ok(h)
    }

    /// A handle over any [`FileIo`] (tests inject faults this way). `path` names it in errors.
    pub fn from_io(path: impl Into<PathBuf>, io: impl FileIo) -> FileHandle {
        FileHandle {
            inner: Arc::new(FileInner {
                path: path.into(),
                io: Box::new(io),
                direct_refused: Mutex::new(None),
                gds: Default::default(),
            }),
        }
    }

    /// The path the handle was opened with.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The file's current length.
    pub fn len(&self) -> Result<u64, FileError> {
        self.inner.io.file_len().map_err(|e| FileError::Open {
            path: self.inner.path.clone(),
            kind: e.kind(),
            msg: e.to_string(),
        })
    }

    /// Flushes written bytes and the file's size to stable storage (`fsync`).
    pub fn sync(&self) -> Result<(), FileError> {
        self.inner.io.sync().map_err(|e| FileError::Io {
            op: IoOp::Write,
            path: self.inner.path.clone(),
            offset: 0,
            len: 0,
            kind: e.kind(),
            msg: format!("fsync failed: {e}"),
        })
    }

    /// True when the file is empty now.
    pub fn is_empty(&self) -> Result<bool, FileError> {
        Ok(self.len()? == 0)
    }

    /// `Ok` when transfers may use `O_DIRECT`, else why not (not asked for, refused at open,
    /// or refused by a transfer since).
    pub fn direct(&self) -> Result<(), String> {
        self.inner.direct_ok()
    }
}
