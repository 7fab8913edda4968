//! When each chunk's upload, compute and download ran, and the same as Chrome trace JSON (open
//! it in Perfetto, <https://ui.perfetto.dev>, or `chrome://tracing`): one track per step, so
//! that overlap shows as bars stacked in time.

use super::chunk::{Chunk, Phase};
use std::fmt::Write as _;

/// Which clock a timeline's times come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimelineClock {
    /// The host's monotonic clock, read by the lane threads around each step (CPU pipelines).
    Host,
    /// CUDA events recorded around each step on the stream it runs on (GPU pipelines).
    CudaEvents,
}

/// A step's start and end, in microseconds from the start of the run's first step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    /// Start.
    pub start_us: f64,
    /// End.
    pub end_us: f64,
}

impl Span {
    /// End minus start.
    pub fn len_us(&self) -> f64 {
        self.end_us - self.start_us
    }
}

/// One chunk's steps (`None`: the step did not run, or did not get as far as its end).
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkTimes {
    /// The chunk.
    pub chunk: Chunk,
    /// Source to input slot.
    pub upload: Option<Span>,
    /// The stage.
    pub compute: Option<Span>,
    /// Output slot to destination.
    pub download: Option<Span>,
}

impl ChunkTimes {
    /// The span of `phase`.
    pub fn get(&self, phase: Phase) -> Option<Span> {
        match phase {
            Phase::Upload => self.upload,
            Phase::Compute => self.compute,
            Phase::Download => self.download,
        }
    }
    fn slot(&mut self, phase: Phase) -> &mut Option<Span> {
        match phase {
            Phase::Upload => &mut self.upload,
            Phase::Compute => &mut self.compute,
            Phase::Download => &mut self.download,
        }
    }
}

/// Every chunk's steps in one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// Where the times come from.
    pub clock: TimelineClock,
    /// One entry per chunk, in order.
    pub chunks: Vec<ChunkTimes>,
}

const PHASES: [Phase; 3] = [Phase::Upload, Phase::Compute, Phase::Download];

impl Timeline {
    /// A timeline from raw `(chunk, phase, start, end)` times in microseconds on any origin;
    /// shifted so that the earliest start is 0.
    pub(crate) fn build(
        clock: TimelineClock,
        chunks: &[Chunk],
        times: impl IntoIterator<Item = (usize, Phase, f64, f64)>,
    ) -> Timeline {
        let mut out: Vec<ChunkTimes> = chunks
            .iter()
            .map(|&chunk| ChunkTimes {
                chunk,
                upload: None,
                compute: None,
                download: None,
            })
            .collect();
        let mut origin = f64::INFINITY;
        for (i, phase, start, end) in times {
            if let Some(c) = out.get_mut(i) {
                *c.slot(phase) = Some(Span {
                    start_us: start,
                    end_us: end.max(start),
                });
                origin = origin.min(start);
            }
        }
        if origin.is_finite() {
            for c in &mut out {
                for p in PHASES {
                    if let Some(s) = c.slot(p) {
                        s.start_us -= origin;
                        s.end_us -= origin;
                    }
                }
            }
        }
        Timeline { clock, chunks: out }
    }

    /// Sum of the step's spans over the chunks (its busy time).
    pub fn busy_us(&self, phase: Phase) -> f64 {
        self.chunks
            .iter()
            .filter_map(|c| c.get(phase))
            .map(|s| s.len_us())
            // A fold from +0.0: `sum` of no spans is -0.0, printed "-0".
            .fold(0.0, |a, b| a + b)
    }

    /// From the first start to the last end.
    pub fn wall_us(&self) -> f64 {
        let spans = || {
            self.chunks
                .iter()
                .flat_map(|c| PHASES.map(|p| c.get(p)))
                .flatten()
        };
        let start = spans().map(|s| s.start_us).fold(f64::INFINITY, f64::min);
        let end = spans().map(|s| s.end_us).fold(f64::NEG_INFINITY, f64::max);
        if start.is_finite() && end.is_finite() {
            end - start
        } else {
            0.0
        }
    }

    /// Time during which steps `a` and `b` both ran (of any chunks), in microseconds.
    pub fn overlap_us(&self, a: Phase, b: Phase) -> f64 {
        let merged = |p: Phase| {
            let mut v: Vec<(f64, f64)> = self
                .chunks
                .iter()
                .filter_map(|c| c.get(p))
                .map(|s| (s.start_us, s.end_us))
                .collect();
            v.sort_by(|x, y| x.0.total_cmp(&y.0));
            let mut out: Vec<(f64, f64)> = Vec::new();
            for (s, e) in v {
                match out.last_mut() {
                    Some(last) if s <= last.1 => last.1 = last.1.max(e),
                    _ => out.push((s, e)),
                }
            }
            out
        };
        let (x, y) = (merged(a), merged(b));
        let (mut i, mut j, mut total) = (0, 0, 0.0);
        while i < x.len() && j < y.len() {
            let lo = x[i].0.max(y[j].0);
            let hi = x[i].1.min(y[j].1);
            if hi > lo {
                total += hi - lo;
            }
            if x[i].1 < y[j].1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        total
    }

    /// The timeline as Chrome trace JSON (the "JSON object format": complete events, `ph:
    /// "X"`, one thread per step, times in microseconds), under process name `name`.
    pub fn to_chrome_trace(&self, name: &str) -> String {
        let mut s = String::from("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
        let _ = write!(
            s,
            "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{{\"name\":{}}}}}",
            json_string(name)
        );
        for (tid, p) in PHASES.iter().enumerate() {
            let _ = write!(
                s,
                ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{},\"args\":{{\"name\":\"{p}\"}}}}",
                tid + 1
            );
        }
        for c in &self.chunks {
            for (tid, p) in PHASES.iter().enumerate() {
                if let Some(sp) = c.get(*p) {
                    let bytes = match p {
                        Phase::Download => c.chunk.out_len,
                        _ => c.chunk.len,
                    };
                    let _ = write!(
                        s,
                        ",\n{{\"name\":\"{p} {i}\",\"cat\":\"{p}\",\"ph\":\"X\",\"pid\":1,\"tid\":{tid},\"ts\":{ts:.3},\"dur\":{dur:.3},\"args\":{{\"chunk\":{i},\"bytes\":{bytes}}}}}",
                        i = c.chunk.index,
                        tid = tid + 1,
                        ts = sp.start_us,
                        dur = sp.len_us(),
                    );
                }
            }
        }
        s.push_str("\n]}\n");
        s
    }
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut s = String::from("\"");
    for ch in text.chars() {
        match ch {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(index: usize) -> Chunk {
        Chunk {
            index,
            offset: index * 10,
            len: 10,
            out_offset: index * 10,
            out_len: 10,
        }
    }

    #[test]
    fn shifts_sums_and_overlaps() {
        let chunks = [chunk(0), chunk(1)];
        let t = Timeline::build(
            TimelineClock::Host,
            &chunks,
            [
                (0, Phase::Upload, 100.0, 110.0),
                (0, Phase::Compute, 110.0, 130.0),
                (1, Phase::Upload, 110.0, 120.0),
                (1, Phase::Compute, 130.0, 150.0),
            ],
        );
        assert_eq!(
            t.chunks[0].upload,
            Some(Span {
                start_us: 0.0,
                end_us: 10.0
            })
        );
        assert_eq!(t.busy_us(Phase::Upload), 20.0);
        assert_eq!(t.busy_us(Phase::Compute), 40.0);
        assert_eq!(t.wall_us(), 50.0);
        assert_eq!(t.overlap_us(Phase::Upload, Phase::Compute), 10.0);
        assert_eq!(t.overlap_us(Phase::Upload, Phase::Download), 0.0);
        // A step no chunk had (no downloads here) is busy for +0, not -0 ("-0" in the chart).
        assert!(t.busy_us(Phase::Download).is_sign_positive());
        assert_eq!(format!("{:.0}", t.busy_us(Phase::Download)), "0");
    }

    #[test]
    fn chrome_trace_is_one_json_object_with_every_span() {
        let t = Timeline::build(
            TimelineClock::Host,
            &[chunk(0)],
            [(0, Phase::Upload, 0.0, 1.5), (0, Phase::Compute, 1.5, 2.0)],
        );
        let j = t.to_chrome_trace("a \"quoted\" name");
        assert!(j.starts_with('{') && j.trim_end().ends_with('}'));
        assert!(j.contains("\\\"quoted\\\""));
        assert_eq!(j.matches("\"ph\":\"X\"").count(), 2);
        assert_eq!(j.matches("\"ph\":\"M\"").count(), 4);
        assert!(j.contains("\"name\":\"upload 0\"") && j.contains("\"dur\":1.500"));
    }
}
