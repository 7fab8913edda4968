//! Why the staging workers could not do what they were asked.

use thiserror::Error;

/// A failure of the staging workers ([`Pool`](super::Pool), [`Filler`](super::Filler)); each
/// user maps it into its own error (the staged path's `StagedError`, the pipeline's setup
/// error, a fill request's `RequestError::Panicked`).
#[derive(Debug, Error)]
pub(crate) enum WorkerError {
    /// A worker count out of range.
    #[error("bad staging config: {0}")]
    BadConfig(String),
    /// A worker thread panicked while copying (a bug; the copy's bytes are unspecified).
    #[error("a staging worker thread panicked")]
    Panicked,
    /// The worker threads could not be started.
    #[error("could not start staging worker threads: {0}")]
    Spawn(#[source] std::io::Error),
}
