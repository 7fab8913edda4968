//! What a completed run did: [`RunReport`].

use super::chunk::Chunk;
use super::source::Source;
use super::timeline::Timeline;

/// What a completed run did.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Chunks run.
    pub chunks: usize,
    /// Bytes read from the source.
    pub bytes_in: u64,
    /// Bytes written to the destination.
    pub bytes_out: u64,
    /// Host time from the call to the end of the last chunk.
    pub elapsed: std::time::Duration,
    /// Every chunk's steps, when [`PipelineConfig::timeline`](super::PipelineConfig::timeline) is
    /// set.
    pub timeline: Option<Timeline>,
}

impl RunReport {
    /// The report of a run of `chunks` over `src` that started at `t0`.
    pub(super) fn of(
        chunks: &[Chunk],
        src: &Source<'_>,
        t0: std::time::Instant,
        timeline: Option<Timeline>,
    ) -> RunReport {
        RunReport {
            chunks: chunks.len(),
            bytes_in: src.len() as u64,
            bytes_out: chunks.iter().map(|c| c.out_len as u64).sum(),
            elapsed: t0.elapsed(),
            timeline,
        }
    }
}
