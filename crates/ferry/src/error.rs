//! The crate-wide error: every operation's own error converts into it, so `?` works across
//! layouts, planning, submission and waiting.

use thiserror::Error;

/// `Result` with [`ferry::Error`](enum@Error) as its default error: the usual return type of a
/// [`scope`](crate::EngineExt::scope) closure (`|s| -> ferry::Result<()> { ... }`).
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Any ferry error. Each operation returns its own small error type; this one wraps them.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Error {
    /// Building or checking a layout.
    #[error(transparent)]
    Layout(#[from] crate::layout::LayoutError),
    /// Planning a copy.
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    /// Building an operator's program.
    #[error(transparent)]
    Op(#[from] crate::op::OpError),
    /// Submitting a job.
    #[error(transparent)]
    Submit(#[from] crate::engine::SubmitError),
    /// One request failed.
    #[error(transparent)]
    Request(#[from] crate::request::RequestError),
    /// A barrier saw failures.
    #[error(transparent)]
    Barrier(#[from] crate::request::BarrierError),
    /// A file load or store.
    #[error(transparent)]
    File(#[from] crate::file::FileError),
    /// Creating a CUDA engine, a buffer or one of its helpers.
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
    /// A bad argument to a call that takes several buffers (e.g. parts that do not add up).
    #[error("{0}")]
    InvalidArgument(String),
    /// An environment variable ferry reads (`from_env`) does not parse.
    #[error(transparent)]
    Config(#[from] crate::ConfigError),
    /// A thread could not be started (the operating system's message).
    #[error("cannot start thread: {0}")]
    Thread(String),
    /// The NCCL engine: set-up, a refused send/receive, a timeout or an abort.
    #[error(transparent)]
    Nccl(#[from] crate::engine::nccl::NcclError),
    /// Reading, loading or saving a checkpoint ([`crate::checkpoint`]).
    #[error(transparent)]
    Checkpoint(Box<crate::checkpoint::CheckpointError>),
}

impl Error {
    /// The failed CUDA driver call behind this error, if one is, wherever it sits (a submit, a
    /// request, a barrier's first failure, a file transfer's copy, an engine's set-up).
    ///
    /// ```
    /// # fn f(r: Result<(), ferry::Error>) {
    /// if let Err(e) = r {
    ///     if e.driver_error().is_some_and(|d| d.is_out_of_memory()) {
    ///         // free something and try again
    ///     }
    /// }
    /// # }
    /// ```
    pub fn driver_error(&self) -> Option<crate::cuda::DriverError> {
        match self {
            Error::Submit(e) => e.driver_error(),
            Error::Request(e) => e.driver_error(),
            Error::Barrier(b) => b.failures.iter().find_map(|(_, e)| e.driver_error()),
            Error::Cuda(e) => e.driver_error(),
            Error::File(e) => e.driver_error(),
            Error::Checkpoint(e) => match &**e {
                crate::checkpoint::CheckpointError::File { source, .. } => source.driver_error(),
                crate::checkpoint::CheckpointError::Shard { source, .. } => source.driver_error(),
                _ => None,
            },
            _ => None,
        }
    }
}

// Every operation's handed-back and own errors convert here, at the top, so that no module
// below imports the umbrella error.

impl<D, S> From<crate::engine::Refused<D, S>> for Error {
    fn from(e: crate::engine::Refused<D, S>) -> Self {
        e.error.into()
    }
}

impl<D, S> From<crate::engine::Failed<D, S>> for Error {
    fn from(e: crate::engine::Failed<D, S>) -> Self {
        e.error.into()
    }
}

impl<B> From<crate::file::FileFailed<B>> for Error {
    fn from(e: crate::file::FileFailed<B>) -> Self {
        e.error.into()
    }
}

impl From<crate::checkpoint::CheckpointError> for Error {
    fn from(e: crate::checkpoint::CheckpointError) -> Self {
        Error::Checkpoint(Box::new(e))
    }
}
