//! The crate-wide error: every operation's own error converts into it, so `?` works across
//! layouts, planning, submission and waiting.

use thiserror::Error;

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
    /// Creating an engine or a buffer.
    #[error("{0}")]
    Setup(String),
    /// The NCCL engine: set-up, a refused send/receive, a timeout or an abort.
    #[error(transparent)]
    Nccl(#[from] crate::engine::nccl::NcclError),
}
