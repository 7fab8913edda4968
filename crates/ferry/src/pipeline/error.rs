//! Why a pipeline run failed: [`PipelineError`], and a stage's own error ([`StageError`]).

use super::chunk::Phase;
use crate::engine::SubmitError;
use crate::request::RequestError;
use thiserror::Error;

/// A stage's own error, kept as it was returned.
pub type StageError = Box<dyn std::error::Error + Send + Sync>;

/// Why a pipeline run failed (or could not start). The pipeline and its engine stay usable.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// Bad settings or buffers (zero slots, a destination too short, a layout outside its
    /// buffer).
    #[error("invalid pipeline: {0}")]
    Config(String),
    /// Slots, streams, events or lane threads could not be made.
    #[error("cannot set up the pipeline: {0}")]
    Setup(String),
    /// The stage returned an error on this chunk.
    #[error("the stage failed on chunk {chunk}: {source}")]
    Stage {
        /// The chunk.
        chunk: usize,
        /// The stage's own error.
        source: StageError,
    },
    /// The stage panicked on this chunk (CPU pipelines; a GPU stage's panic unwinds through
    /// `run`, which waits for everything in flight first).
    #[error("the stage panicked on chunk {chunk}: {msg}")]
    Panicked {
        /// The chunk.
        chunk: usize,
        /// The panic message.
        msg: String,
    },
    /// The engine refused a copy.
    #[error("{phase} of chunk {chunk} refused: {source}")]
    Submit {
        /// The chunk.
        chunk: usize,
        /// The step.
        phase: Phase,
        /// The engine's error.
        source: SubmitError,
    },
    /// A copy (or the wait that orders a step after another) failed.
    #[error("{phase} of chunk {chunk} failed: {source}")]
    Copy {
        /// The chunk.
        chunk: usize,
        /// The step.
        phase: Phase,
        /// The request's error.
        source: RequestError,
    },
}

impl PipelineError {
    /// The chunk the failure happened on, if it is a chunk's.
    pub fn chunk(&self) -> Option<usize> {
        match self {
            PipelineError::Stage { chunk, .. }
            | PipelineError::Panicked { chunk, .. }
            | PipelineError::Submit { chunk, .. }
            | PipelineError::Copy { chunk, .. } => Some(*chunk),
            _ => None,
        }
    }
}

/// [`PipelineError::Setup`] with `e`'s text (streams, events or buffers the driver refused).
pub(super) fn setup(e: impl std::fmt::Display) -> PipelineError {
    PipelineError::Setup(e.to_string())
}
