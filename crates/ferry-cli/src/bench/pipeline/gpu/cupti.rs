//! The GPU's own record of an untraced run, from CUPTI's activity API (`FERRY_BENCH_CUPTI=1`):
//! the start and end of every copy and kernel of one run, as the driver timestamps them, so
//! that a 3-step row can give each step's busy time and the run's GPU wall without the
//! timeline's events. A timeline brackets every step of every chunk with two timing-enabled
//! CUDA events, each of which costs its stream about 1.4 us on the H200 host (run 66 of
//! `bench/results/h200.md`): the traced run is longer than the untraced one the row times, and
//! its wall over its largest step's busy time counts that cost. CUPTI's records come from the
//! run the user gets (how much the collection itself costs the run, the row's notes show: the
//! host wall of the recorded run beside the timed median).
//!
//! Opt-in: CUPTI is a profiler library (`libcupti.so`, shipped with the CUDA toolkit and
//! PyTorch's `nvidia-cuda-cupti` package, found through `LD_LIBRARY_PATH`); one client at a
//! time per process, so a bench run under another profiler would disturb it. Where the library
//! is missing or refuses, the row says so in its notes and keeps its other figures.

use cudarc::cupti::result::{activity, CuptiError};
use cudarc::cupti::sys;
use std::alloc::{alloc, dealloc, Layout};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Bytes of each activity buffer handed to CUPTI (a run of 256 chunks makes under 1,000
/// records of at most a few hundred bytes).
const BUFFER: usize = 4 << 20;
/// CUPTI's alignment for activity buffers.
const ALIGN: usize = 8;
/// `CUpti_ActivityMemcpyKind`: host to device, device to host.
const HTOD: u8 = 1;
const DTOH: u8 = 2;
/// Record kinds (`CUpti_ActivityKind`) read.
const MEMCPY: u32 = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY as u32;
const KERNEL: u32 = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_KERNEL as u32;
const CONCURRENT_KERNEL: u32 =
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL as u32;

/// True when `FERRY_BENCH_CUPTI` is set to anything but `0` or empty.
pub(super) fn wanted() -> bool {
    std::env::var("FERRY_BENCH_CUPTI").is_ok_and(|v| !v.trim().is_empty() && v.trim() != "0")
}

/// One run's GPU work as CUPTI saw it: (start, end) in nanoseconds, by kind.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Spans {
    /// Host-to-device copies.
    pub up: Vec<(u64, u64)>,
    /// Kernels.
    pub kernels: Vec<(u64, u64)>,
    /// Device-to-host copies.
    pub down: Vec<(u64, u64)>,
    /// Records of other kinds (other copies): counted, not timed.
    pub other: usize,
}

impl Spans {
    /// Nanoseconds covered by at least one of `spans` (overlaps counted once).
    pub fn busy_ns(spans: &[(u64, u64)]) -> u64 {
        let mut v: Vec<(u64, u64)> = spans.iter().copied().filter(|(s, e)| e > s).collect();
        v.sort_unstable();
        let mut total = 0;
        let mut cur: Option<(u64, u64)> = None;
        for (s, e) in v {
            cur = match cur {
                Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
                Some((cs, ce)) => {
                    total += ce - cs;
                    Some((s, e))
                }
                None => Some((s, e)),
            };
        }
        total + cur.map_or(0, |(s, e)| e - s)
    }

    /// From the first start to the last end of every span, in nanoseconds.
    pub fn wall_ns(&self) -> u64 {
        let all = || self.up.iter().chain(&self.kernels).chain(&self.down);
        match (all().map(|s| s.0).min(), all().map(|s| s.1).max()) {
            (Some(s), Some(e)) if e > s => e - s,
            _ => 0,
        }
    }

    /// "busy upload U us, compute C, download D, GPU wall W = R x the largest (N copies and
    /// kernels)", the row's note.
    pub fn summary(&self) -> String {
        let busy = [&self.up, &self.kernels, &self.down].map(|v| Self::busy_ns(v) as f64 / 1e3);
        let top = busy.iter().copied().fold(0.0, f64::max);
        let wall = self.wall_ns() as f64 / 1e3;
        format!(
            "busy upload {:.0} us, compute {:.0}, download {:.0}, GPU wall {wall:.0} = {:.3}x the largest ({} copies and kernels{})",
            busy[0],
            busy[1],
            busy[2],
            wall / top.max(1e-9),
            self.up.len() + self.kernels.len() + self.down.len(),
            if self.other > 0 {
                format!(", {} other records", self.other)
            } else {
                String::new()
            }
        )
    }
}

/// The row's note of one recorded run (what [`record`] returned) whose series' timed median
/// is `median_s`: its spans' summary and host wall, or why CUPTI recorded nothing.
pub(super) fn note(recorded: Result<(Spans, f64), String>, median_s: f64) -> String {
    match recorded {
        Ok((s, host_s)) => format!(
            "{}, host wall {:.0} us (timed median {:.0})",
            s.summary(),
            host_s * 1e6,
            median_s * 1e6
        ),
        Err(why) => format!("not recorded: {why}"),
    }
}

/// Records being collected (one collection at a time: [`record`] holds [`SESSION`]).
static SPANS: Mutex<Option<Spans>> = Mutex::new(None);
/// Held for a whole collection.
static SESSION: Mutex<()> = Mutex::new(());

/// Runs `run` with CUPTI's copy and kernel activity records on, and returns what it recorded
/// with `run`'s host time in seconds. `run` must wait for its GPU work. The outer error is
/// `run`'s own; the inner one names what CUPTI refused (the library missing included).
pub(super) fn record(
    run: impl FnOnce() -> Result<(), String>,
) -> Result<Result<(Spans, f64), String>, String> {
    let _one = SESSION.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = setup() {
        return Ok(Err(e.clone()));
    }
    let refused = |call: &str, e: CuptiError| format!("{call} refused: {:?}", e.0);
    *SPANS.lock().unwrap_or_else(|e| e.into_inner()) = Some(Spans::default());
    let kinds = [
        sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY,
        sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    ];
    // Turning a kind off after its records are flushed: a refusal there changes nothing read.
    let off = || {
        for k in kinds {
            let _ = activity::disable(k);
        }
    };
    for k in kinds {
        if let Err(e) = activity::enable(k) {
            off();
            return Ok(Err(refused("cuptiActivityEnable", e)));
        }
    }
    let t = Instant::now();
    let ran = run();
    let host_s = t.elapsed().as_secs_f64();
    let flushed =
        activity::flush_all(sys::CUpti_ActivityFlag::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED as u32);
    off();
    let spans = SPANS.lock().unwrap_or_else(|e| e.into_inner()).take();
    ran?;
    Ok(match (flushed, spans) {
        (Err(e), _) => Err(refused("cuptiActivityFlushAll", e)),
        (Ok(()), None) => Err("no records collected".into()),
        (Ok(()), Some(s)) => Ok((s, host_s)),
    })
}

/// Once per process: finds the library and registers the buffer callbacks.
fn setup() -> &'static Result<(), String> {
    static SETUP: OnceLock<Result<(), String>> = OnceLock::new();
    SETUP.get_or_init(|| {
        // SAFETY: only probes whether a library of CUPTI's names can be opened (the calls
        // below would panic without it).
        if !unsafe { sys::is_culib_present() } {
            return Err("CUPTI library not found (libcupti.so on LD_LIBRARY_PATH)".into());
        }
        activity::register_callbacks(Some(requested), Some(completed))
            .map_err(|e| format!("cuptiActivityRegisterCallbacks refused: {:?}", e.0))
    })
}

fn buffer_layout() -> Layout {
    // A constant, valid size and alignment: cannot fail.
    Layout::from_size_align(BUFFER, ALIGN).unwrap_or_else(|_| Layout::new::<u64>())
}

/// CUPTI asks for a buffer to write records into.
unsafe extern "C" fn requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let layout = buffer_layout();
    // SAFETY: a non-zero size; freed in `completed`, which CUPTI calls for every buffer it took
    // (at the latest on `cuptiActivityFlushAll`).
    let p = unsafe { alloc(layout) };
    // SAFETY: CUPTI passes valid pointers to write the buffer, its size and the record limit
    // into (0: as many as fit). A null buffer (allocation failed) makes CUPTI drop records.
    unsafe {
        *buffer = p;
        *size = if p.is_null() { 0 } else { layout.size() };
        *max_records = 0;
    }
}

/// CUPTI hands back a buffer of `valid` bytes of records: their spans are kept, the buffer
/// freed.
unsafe extern "C" fn completed(
    _ctx: cudarc::driver::sys::CUcontext,
    _stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    let mut got = Spans::default();
    let mut rec: *mut sys::CUpti_Activity = std::ptr::null_mut();
    // SAFETY: `buffer` is one of `requested`'s, holding `valid` bytes of records; CUPTI's
    // iterator answers an error (the end) past the last one.
    while unsafe { activity::get_next_record(buffer, valid, &mut rec) }.is_ok() {
        // SAFETY: every record starts with its kind; the copy record's `copyKind`, `start` and
        // `end`, and the kernel record's `start` and `end`, sit at the same offsets in every
        // version of those records (read unaligned through raw pointers, no reference made).
        unsafe {
            // The kind as a number: a kind this build's enum lacks is no undefined value.
            match (rec as *const u32).read() {
                MEMCPY => {
                    let m = rec as *const sys::CUpti_ActivityMemcpy6;
                    let kind = std::ptr::addr_of!((*m).copyKind).read_unaligned();
                    let span = (
                        std::ptr::addr_of!((*m).start).read_unaligned(),
                        std::ptr::addr_of!((*m).end).read_unaligned(),
                    );
                    match kind {
                        HTOD => got.up.push(span),
                        DTOH => got.down.push(span),
                        _ => got.other += 1,
                    }
                }
                KERNEL | CONCURRENT_KERNEL => {
                    let k = rec as *const sys::CUpti_ActivityKernel9;
                    got.kernels.push((
                        std::ptr::addr_of!((*k).start).read_unaligned(),
                        std::ptr::addr_of!((*k).end).read_unaligned(),
                    ));
                }
                _ => got.other += 1,
            }
        }
    }
    if let Some(s) = SPANS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        s.up.append(&mut got.up);
        s.kernels.append(&mut got.kernels);
        s.down.append(&mut got.down);
        s.other += got.other;
    }
    // SAFETY: allocated by `requested` with this layout; CUPTI hands each buffer back once.
    unsafe { dealloc(buffer, buffer_layout()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_counts_overlaps_once() {
        assert_eq!(Spans::busy_ns(&[]), 0);
        assert_eq!(Spans::busy_ns(&[(10, 20)]), 10);
        // Out of order, one inside another, one touching, one apart, one empty.
        let v = [(30, 40), (10, 20), (12, 15), (20, 25), (50, 50), (35, 45)];
        assert_eq!(Spans::busy_ns(&v), 15 + 15);
    }

    #[test]
    fn wall_and_summary() {
        let us = |a: u64, b: u64| (a * 1000, b * 1000);
        let s = Spans {
            up: vec![us(100, 200), us(200, 300)],
            kernels: vec![us(200, 300), us(300, 400)],
            down: vec![us(300, 420)],
            other: 0,
        };
        assert_eq!(s.wall_ns(), 320_000);
        assert_eq!(Spans::default().wall_ns(), 0);
        let text = s.summary();
        assert!(
            text.contains("busy upload 200 us, compute 200, download 120, GPU wall 320 = 1.600x the largest (5 copies and kernels)"),
            "{text}"
        );
    }

    #[test]
    fn wanted_reads_the_variable() {
        // Only this test touches the variable.
        std::env::remove_var("FERRY_BENCH_CUPTI");
        assert!(!wanted());
        std::env::set_var("FERRY_BENCH_CUPTI", "0");
        assert!(!wanted());
        std::env::set_var("FERRY_BENCH_CUPTI", "1");
        assert!(wanted());
        std::env::remove_var("FERRY_BENCH_CUPTI");
    }
}
