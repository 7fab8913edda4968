//! The pieces of a run: its [`Chunk`]s and each chunk's three steps ([`Phase`]).

/// One chunk of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Its number, from 0.
    pub index: usize,
    /// Byte offset of its data in the source's order (the source's element order for a
    /// strided source).
    pub offset: usize,
    /// Bytes of input.
    pub len: usize,
    /// Byte offset of its output in the destination.
    pub out_offset: usize,
    /// Bytes of output ([`PipelineConfig::output`](super::PipelineConfig::output) of `len`; 0
    /// without a destination).
    pub out_len: usize,
}

/// One of a chunk's three steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Source to input slot.
    Upload,
    /// The stage.
    Compute,
    /// Output slot to destination.
    Download,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Upload => "upload",
            Phase::Compute => "compute",
            Phase::Download => "download",
        })
    }
}
