//! A load or store that owns its buffer: [`FileTransfer`] in flight, [`FileFailed`] when it
//! failed or was refused; and the [`IoReport`] of a finished transfer, built from what its
//! runners counted.

use super::error::FileError;
use super::io::DIRECT_ALIGN;
use super::report::IoReport;
use super::transport::Transport;
use super::xfer::Xfer;
use crate::engine::Lent;
use crate::request::Request;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll};

/// A load or store that failed or was refused, with the buffer handed back (its bytes are
/// unspecified after a failed load). An [`Error`](std::error::Error) (its Debug form leaves the
/// buffer out) that converts into [`ferry::Error`](crate::Error), so `?` works in a function
/// returning either; the buffer is dropped then.
pub struct FileFailed<B> {
    /// Why.
    pub error: FileError,
    /// The buffer.
    pub buf: B,
}

impl<B> std::fmt::Display for FileFailed<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}
impl<B> std::fmt::Debug for FileFailed<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileFailed")
            .field("error", &self.error)
            .field("buf", &std::any::type_name::<B>())
            .finish()
    }
}
impl<B> std::error::Error for FileFailed<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Waits for a just-submitted request and builds its report (the blocking API).
pub(super) fn finish_now(req: Request, x: &Arc<Xfer>) -> Result<IoReport, FileError> {
    // The result is read from the transfer's own typed error.
    let _ = req.wait();
    result_of(x)
}

pub(super) fn result_of(x: &Xfer) -> Result<IoReport, FileError> {
    if let Some(e) = x
        .error
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
    {
        return Err(e);
    }
    let direct_bytes = x.direct_bytes.load(Ordering::Acquire);
    let buffered_bytes = x.buffered_bytes.load(Ordering::Acquire);
    let bytes = x.buf.len as u64;
    let cufile_bytes = x.gds.as_ref().map_or(0, |g| g.bytes());
    let cufile = x.gds.as_ref().is_some_and(|g| g.run.is_some());
    let direct_note = (direct_bytes < bytes).then(|| match x.file.direct_ok() {
        Err(why) => why,
        Ok(()) => format!(
            "pieces not aligned to {DIRECT_ALIGN} bytes (file offset, address or length) run buffered"
        ),
    });
    Ok(IoReport {
        bytes,
        direct_bytes,
        buffered_bytes,
        bounce: x.ring.as_ref().map(|r| r.kind),
        direct_note: if cufile {
            None
        } else if x.direct {
            direct_note
        } else {
            Some("not asked for (FileConfig::direct is off)".into())
        },
        issued: Some(x.issue.clone()),
        gds_note: x.gds.as_ref().map(|g| g.note()),
        transport: x
            .gds
            .as_ref()
            .map_or(Transport::Host, |g| g.choice.transport),
        cufile_bytes,
    })
}

/// A load or store in flight that owns its buffer. [`FileTransfer::wait`] (or `.await`) hands
/// the buffer back with an [`IoReport`]; dropping it waits.
#[must_use = "dropping a FileTransfer blocks until the transfer completes"]
pub struct FileTransfer<B> {
    /// The buffer, lent to the workers until the request completed (dropping it waits).
    pub(super) lent: Lent<B>,
    pub(super) x: Arc<Xfer>,
}

impl<B> std::fmt::Debug for FileTransfer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileTransfer")
            .field("request", &self.lent.request())
            .field("path", &self.x.file.path)
            .field("offset", &self.x.offset)
            .field("len", &self.x.buf.len)
            .finish()
    }
}

impl<B> FileTransfer<B> {
    /// Blocks until the transfer completes; returns the buffer and what was done, or the
    /// error with the buffer.
    pub fn wait(self) -> Result<(B, IoReport), FileFailed<B>> {
        // The result is read from the transfer's own typed error.
        let (buf, _) = self.lent.wait();
        finish(buf, &self.x)
    }

    /// `Some(result)` once the transfer completed, `None` while in flight. Never blocks; the
    /// buffer stays in the transfer until [`FileTransfer::wait`].
    pub fn try_wait(&mut self) -> Option<Result<IoReport, FileError>> {
        self.lent.try_wait().map(|_| result_of(&self.x))
    }

    /// True once the transfer completed. Never blocks.
    pub fn is_done(&self) -> bool {
        self.lent.is_done()
    }

    /// The request underneath (its error is the [`FileError`]'s text, as
    /// [`RequestError::Io`](crate::RequestError::Io)).
    pub fn request(&self) -> Option<&Request> {
        self.lent.request()
    }
}

fn finish<B>(buf: B, x: &Xfer) -> Result<(B, IoReport), FileFailed<B>> {
    match result_of(x) {
        Ok(r) => Ok((buf, r)),
        Err(error) => Err(FileFailed { error, buf }),
    }
}

impl<B: Unpin> Future for FileTransfer<B> {
    type Output = Result<(B, IoReport), FileFailed<B>>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.lent.poll(cx).map(|(buf, _)| finish(buf, &this.x))
    }
}
