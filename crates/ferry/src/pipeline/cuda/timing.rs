//! The timeline of a GPU pipeline run: CUDA events recorded around each step on its stream
//! (see the [parent](super)).

use super::setup;
use crate::pipeline::{Chunk, Phase, PipelineError, Timeline, TimelineClock};
use cudarc::driver::{sys, CudaEvent, CudaStream};

/// Timing events of one run: a base, then (chunk, phase, start, end) for each step.
pub(super) struct Timing {
    base: CudaEvent,
    pub(super) marks: Vec<(usize, Phase, CudaEvent, CudaEvent)>,
    /// Steps whose end could not be recorded on their own stream (host-signalled).
    pub(super) open: Vec<(usize, Phase, CudaEvent)>,
    /// Events made before the run, each recorded once by [`Timing::event`]: a traced run's
    /// submitting thread then pays one `cuEventRecord` per mark, not also a `cuEventCreate`
    /// (six marks a chunk, on the host's path between a chunk's steps).
    spare: Vec<CudaEvent>,
}

fn timing_event(stream: &CudaStream) -> Result<CudaEvent, PipelineError> {
    stream
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(setup)
}

impl Timing {
    /// The base recorded on `compute` now, and the timing events of `chunks` chunks' steps.
    pub(super) fn new(compute: &CudaStream, chunks: usize) -> Result<Timing, PipelineError> {
        let ctx = compute.context();
        let spare = (0..chunks * 6)
            .map(|_| {
                ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(setup)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Timing {
            base: timing_event(compute)?,
            marks: Vec::with_capacity(chunks * 3),
            open: Vec::new(),
            spare,
        })
    }

    /// A timing event recorded on `stream` now (one made ahead when any is left).
    pub(super) fn event(&mut self, stream: &CudaStream) -> Result<CudaEvent, PipelineError> {
        match self.spare.pop() {
            Some(e) => {
                e.record(stream).map_err(setup)?;
                Ok(e)
            }
            None => timing_event(stream),
        }
    }

    /// Ends the open steps now, on `stream`.
    pub(super) fn close_open(&mut self, stream: &CudaStream) -> Result<(), PipelineError> {
        for (c, p, start) in std::mem::take(&mut self.open) {
            let end = self.event(stream)?;
            self.marks.push((c, p, start, end));
        }
        Ok(())
    }

    /// The timeline, once every event has completed (waits for them).
    pub(super) fn finish(
        mut self,
        compute: &CudaStream,
        chunks: &[Chunk],
    ) -> Result<Timeline, PipelineError> {
        self.close_open(compute)?;
        let us = |e: &CudaEvent| {
            self.base
                .elapsed_ms(e)
                .map(|ms| f64::from(ms) * 1e3)
                .map_err(setup)
        };
        let mut times = Vec::with_capacity(self.marks.len());
        for (c, p, s, e) in &self.marks {
            times.push((*c, *p, us(s)?, us(e)?));
        }
        Ok(Timeline::build(TimelineClock::CudaEvents, chunks, times))
    }
}
