//! The timeline of a GPU pipeline run: a timing event recorded on each step's stream after it,
//! and its start known from the events it follows (see the [parent](super)).
//!
//! A step's start is when its stream reaches it: after the stream's previous work and after
//! the events it waits for. Where the previous step on its stream (in this run) is still
//! running when the step is submitted, and every step it waits for is in the timeline, that
//! moment is the latest of their ends, and no event is recorded for it ([`Start::After`]).
//! Otherwise (the stream's first step in the run, a stream gone idle before the host submitted:
//! a late fill or a slow stage, a dependency the timeline does not know) a timing event is
//! recorded before the step ([`Start::Event`]). Each timing-enabled record costs its stream
//! about 1.4 us on the H200 host (run 66 of `bench/results/h200.md`), so a step usually costs
//! one instead of two. A step's span then also holds the stream's own latency between two steps
//! (which a start event recorded before the step fired at the same moment as well).
//! Work others enqueue on the same stream between two of the run's steps counts into the later
//! step.

use crate::pipeline::chunk::{Chunk, Phase};
use crate::pipeline::error::{setup, PipelineError};
use crate::pipeline::timeline::{Timeline, TimelineClock};
use cudarc::driver::{sys, CudaEvent, CudaStream};

/// How a step's start is known.
pub(super) enum Start {
    /// A timing event recorded on its stream right before it (after its waits).
    Event(CudaEvent),
    /// The latest end of these marks (indices into [`Timing`]'s marks): the previous step on
    /// its stream, still running when it was submitted, and the steps it waits for.
    After(Vec<usize>),
}

/// A step's start in a resolved timeline ([`resolve`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum StartAt {
    /// Measured, us.
    At(f64),
    /// The latest end among these earlier marks.
    After(Vec<usize>),
}

/// One timed step.
struct Mark {
    chunk: usize,
    phase: Phase,
    start: Start,
    end: CudaEvent,
}

/// Timing events of one run: a base, then each step's start and end.
pub(super) struct Timing {
    base: CudaEvent,
    marks: Vec<Mark>,
    /// Steps whose end could not be recorded on their own stream (host-signalled).
    open: Vec<(usize, Phase, Start)>,
    /// Each stream's last step in the run, while its end is on that stream (`None` after a
    /// step it cannot follow: a host-signalled one, or events of other steps recorded there).
    last: Vec<(sys::CUstream, Option<usize>)>,
    /// The mark of each chunk's steps, by phase.
    by_step: Vec<[Option<usize>; 3]>,
    /// Events made before the run, each recorded once by [`Timing::event`]: a traced run's
    /// submitting thread then pays one `cuEventRecord` per mark, not also a `cuEventCreate`.
    spare: Vec<CudaEvent>,
}

fn timing_event(stream: &CudaStream) -> Result<CudaEvent, PipelineError> {
    stream
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(setup)
}

fn phase_index(p: Phase) -> usize {
    match p {
        Phase::Upload => 0,
        Phase::Compute => 1,
        Phase::Download => 2,
    }
}

impl Timing {
    /// The base recorded on `compute` now, and the timing events of `chunks` chunks' steps.
    pub(super) fn new(compute: &CudaStream, chunks: usize) -> Result<Timing, PipelineError> {
        let ctx = compute.context();
        // An end a step, and a start for the few that record one.
        let spare = (0..chunks * 4)
            .map(|_| {
                ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(setup)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Timing {
            base: timing_event(compute)?,
            marks: Vec::with_capacity(chunks * 3),
            open: Vec::new(),
            last: Vec::new(),
            by_step: vec![[None; 3]; chunks],
            spare,
        })
    }

    /// A timing event recorded on `stream` now (one made ahead when any is left).
    fn event(&mut self, stream: &CudaStream) -> Result<CudaEvent, PipelineError> {
        match self.spare.pop() {
            Some(e) => {
                e.record(stream).map_err(setup)?;
                Ok(e)
            }
            None => timing_event(stream),
        }
    }

    fn last_on(&mut self, stream: sys::CUstream) -> &mut Option<usize> {
        let i = match self.last.iter().position(|(s, _)| *s == stream) {
            Some(i) => i,
            None => {
                self.last.push((stream, None));
                self.last.len() - 1
            }
        };
        &mut self.last[i].1
    }

    /// The start of a step about to be enqueued on `stream` (its waits already enqueued),
    /// which waits for the steps `deps` (chunk, phase): see the [module documentation](self).
    pub(super) fn begin(
        &mut self,
        stream: &CudaStream,
        deps: &[(usize, Phase)],
    ) -> Result<Start, PipelineError> {
        let prev = *self.last_on(stream.cu_stream());
        let running = prev.filter(|&i| self.marks[i].end.try_is_complete() == Ok(false));
        if let Some(prev) = running {
            let known: Option<Vec<usize>> = std::iter::once(Some(prev))
                .chain(
                    deps.iter()
                        .map(|&(c, p)| self.by_step.get(c).and_then(|s| s[phase_index(p)])),
                )
                .collect();
            if let Some(after) = known {
                return Ok(Start::After(after));
            }
        }
        Ok(Start::Event(self.event(stream)?))
    }

    /// Ends chunk `chunk`'s `phase` (begun with `start`) on `stream` now.
    pub(super) fn end(
        &mut self,
        stream: &CudaStream,
        chunk: usize,
        phase: Phase,
        start: Start,
    ) -> Result<(), PipelineError> {
        let i = self.close(stream, chunk, phase, start)?;
        *self.last_on(stream.cu_stream()) = Some(i);
        Ok(())
    }

    /// Records chunk `chunk`'s `phase` (begun with `start`) as ended by an event on `stream`
    /// now; its mark's index.
    fn close(
        &mut self,
        stream: &CudaStream,
        chunk: usize,
        phase: Phase,
        start: Start,
    ) -> Result<usize, PipelineError> {
        let end = self.event(stream)?;
        let i = self.marks.len();
        self.marks.push(Mark {
            chunk,
            phase,
            start,
            end,
        });
        if let Some(s) = self.by_step.get_mut(chunk) {
            s[phase_index(phase)] = Some(i);
        }
        Ok(i)
    }

    /// A step on `stream` whose end is signalled by a host thread: ended later by
    /// [`Timing::close_open`]; the next step on `stream` records its own start.
    pub(super) fn open(&mut self, stream: &CudaStream, chunk: usize, phase: Phase, start: Start) {
        self.open.push((chunk, phase, start));
        *self.last_on(stream.cu_stream()) = None;
    }

    /// Ends the open steps now, on `stream` (whose next step then records its own start).
    pub(super) fn close_open(&mut self, stream: &CudaStream) -> Result<(), PipelineError> {
        let open = std::mem::take(&mut self.open);
        if open.is_empty() {
            return Ok(());
        }
        for (c, p, start) in open {
            self.close(stream, c, p, start)?;
        }
        *self.last_on(stream.cu_stream()) = None;
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
        let mut ends = Vec::with_capacity(self.marks.len());
        let mut starts = Vec::with_capacity(self.marks.len());
        for m in &self.marks {
            ends.push(us(&m.end)?);
            starts.push(match &m.start {
                Start::Event(e) => StartAt::At(us(e)?),
                Start::After(after) => StartAt::After(after.clone()),
            });
        }
        let starts = resolve(&starts, &ends);
        let times = self
            .marks
            .iter()
            .zip(starts.into_iter().zip(ends))
            .map(|(m, (s, e))| (m.chunk, m.phase, s, e));
        Ok(Timeline::build(TimelineClock::CudaEvents, chunks, times))
    }
}

/// Each mark's start, us: measured, or the latest of the ends it follows (`ends[i]` is mark
/// `i`'s end; a mark follows only marks before it, a start after nothing is its end).
pub(super) fn resolve(starts: &[StartAt], ends: &[f64]) -> Vec<f64> {
    starts
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            StartAt::At(t) => *t,
            StartAt::After(after) => after
                .iter()
                .filter(|&&j| j < i)
                .filter_map(|&j| ends.get(j).copied())
                .reduce(f64::max)
                .unwrap_or(ends[i]),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inferred_start_is_the_latest_end_it_follows() {
        // Two uploads back to back on one stream (the first's start measured), a compute
        // after the first upload, a download after the compute and the second upload.
        let ends = [10.0, 20.0, 25.0, 40.0, 12.0];
        let starts = [
            StartAt::At(1.0),
            StartAt::After(vec![0]),
            StartAt::After(vec![0]),
            StartAt::After(vec![2, 1]),
            // A mark may name only earlier marks; a later one is ignored, none left: its end.
            StartAt::After(vec![4, 7]),
        ];
        assert_eq!(resolve(&starts, &ends), vec![1.0, 10.0, 10.0, 25.0, 12.0]);
    }

    #[test]
    fn phases_have_distinct_indices() {
        let mut seen = [Phase::Upload, Phase::Compute, Phase::Download].map(phase_index);
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2]);
    }
}
