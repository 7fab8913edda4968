//! [`IoReport`]: what one load or store did, in bytes, and which path they took.

use super::issue::IoIssue;
use super::transport::Transport;
use crate::memory::MemKind;

/// What one load or store did: bytes, and which path they took.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IoReport {
    /// Bytes moved (the whole range: a request that did not move every byte fails instead).
    pub bytes: u64,
    /// Of those, bytes read or written with `O_DIRECT`.
    pub direct_bytes: u64,
    /// Bytes read or written through the page cache.
    pub buffered_bytes: u64,
    /// Kind of the bounce buffers the bytes went through (`Pinned` for an engine made with
    /// [`FileEngine::with_engine`](super::FileEngine::with_engine) on a machine with a CUDA driver,
    /// else `Pageable`); `None` when they went straight to or from the buffer.
    pub bounce: Option<MemKind>,
    /// Why `O_DIRECT` was not used for some or all bytes (`None` when every byte was direct,
    /// or cuFile moved them).
    pub direct_note: Option<String>,
    /// For buffers the CPU cannot reach: the transport used and why (`cuFile (compatibility
    /// mode): ...`, `bounce ring: nvidia-fs not loaded: ...`; see [`choose`](super::choose)).
    pub gds_note: Option<String>,
    /// How the reads (writes) were issued: io_uring with its depth, or the worker threads and
    /// why ([`FileConfig::uring`](super::FileConfig::uring)). `None` only in an empty report.
    pub issued: Option<IoIssue>,
    /// How the bytes moved: [`Transport::Host`] for host buffers, cuFile or the bounce ring
    /// for device buffers.
    pub transport: Transport,
    /// Of `bytes`, moved by cuFile (counted in neither `direct_bytes` nor `buffered_bytes`).
    pub cufile_bytes: u64,
}

impl IoReport {
    /// Adds another transfer's report to this one (bytes summed, the first note of each kind
    /// kept): one report over many transfers.
    pub fn add(&mut self, r: IoReport) {
        self.bytes += r.bytes;
        self.direct_bytes += r.direct_bytes;
        self.buffered_bytes += r.buffered_bytes;
        self.bounce = self.bounce.or(r.bounce);
        self.direct_note = self.direct_note.take().or(r.direct_note);
        self.gds_note = self.gds_note.take().or(r.gds_note);
        // io_uring is reported if any transfer used it, else the first reason.
        if !matches!(self.issued, Some(IoIssue::Uring { .. }))
            && (self.issued.is_none() || matches!(r.issued, Some(IoIssue::Uring { .. })))
        {
            self.issued = r.issued;
        }
        if self.transport == Transport::Host {
            self.transport = r.transport;
        }
        self.cufile_bytes += r.cufile_bytes;
    }

    /// `"O_DIRECT"`, `"buffered"`, `"O_DIRECT + buffered"`, `"cuFile"`, or cuFile with either.
    pub fn path(&self) -> &'static str {
        let d = self.direct_bytes > 0;
        let b = self.buffered_bytes > 0;
        match (self.cufile_bytes > 0, d, b) {
            (false, true, false) => "O_DIRECT",
            (false, true, true) => "O_DIRECT + buffered",
            (false, false, _) => "buffered",
            (true, false, false) => "cuFile",
            (true, true, false) => "cuFile + O_DIRECT",
            (true, false, true) => "cuFile + buffered",
            (true, true, true) => "cuFile + O_DIRECT + buffered",
        }
    }
}

impl std::fmt::Display for IoReport {
    /// `1048576 bytes, buffered (direct 0, buffered 1048576); O_DIRECT not used: ...`; a
    /// device transfer ends with its transport and why (`; bounce ring: ...`), then how the
    /// transfers were issued (`; issued by ...`). Each fact once: threads chosen for the reason
    /// `O_DIRECT` was not used do not repeat it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes, {} (direct {}, buffered {}",
            self.bytes,
            self.path(),
            self.direct_bytes,
            self.buffered_bytes
        )?;
        if self.cufile_bytes > 0 {
            write!(f, ", cuFile {}", self.cufile_bytes)?;
        }
        f.write_str(")")?;
        if let Some(k) = self.bounce {
            write!(f, " through {k} bounce buffers")?;
        }
        if let Some(n) = &self.direct_note {
            write!(f, "; O_DIRECT not used: {n}")?;
        }
        if let Some(n) = &self.gds_note {
            write!(f, "; {n}")?;
        }
        match (&self.issued, &self.direct_note) {
            // Threads because no part could be O_DIRECT, for the reason just given: said once.
            (Some(IoIssue::Threads { why }), Some(n))
                if why.strip_prefix("no O_DIRECT part: ") == Some(n.as_str()) =>
            {
                f.write_str("; issued by threads (no O_DIRECT part)")?
            }
            (Some(i), _) => write!(f, "; issued by {i}")?,
            (None, _) => {}
        }
        Ok(())
    }
}
