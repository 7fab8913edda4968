//! `cuda-scatter-pageable` and `cuda-gather-pageable`: 100,000 segments (size = segment) of a
//! pageable host buffer to the device, or from the device into scattered pieces of a pageable
//! buffer, through ferry's spin-wait engine (the staged segment-list path; as every host-clock
//! bandwidth row, so that rows compare copies, not wake-ups), next to what a user
//! writes by hand: (a) one `cuMemcpyAsync` per segment from (into) the pageable buffer, (b) a
//! one-thread CPU gather into a pinned buffer and one `cuMemcpyAsync` (one `cuMemcpyAsync`
//! into a pinned buffer and a one-thread CPU scatter). All on the host clock (the baselines'
//! 100,000 calls are more than a stream's queue holds behind a latch). The row's shape also
//! gives ferry's ratio to each baseline and each series' CPU time per GB moved (`getrusage`,
//! `RUSAGE_SELF`: every thread of the process, the staging workers included, over every call of
//! the series, warm-up included).

use super::caller::{dev_is, poison_dev, Moved};
use super::timing::ferry_batch;
use super::CudaBench;
use crate::bench::ctx::{setup, Ctx};
use crate::bench::data::pattern_bytes;
use crate::bench::{BenchError, CallerView, Role, Row, Series};
use crate::sizes::format_size;
use ferry::cuda::{DeviceBuffer, Direction, PinnedBuffer};
use ferry::Engine;
use std::cell::Cell;
use std::sync::Arc;

/// CPU seconds of this process so far (user + system, every thread).
fn cpu_seconds() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `u` is a valid out-pointer for one `rusage`; getrusage only writes it.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
    if rc != 0 {
        return f64::NAN;
    }
    // SAFETY: getrusage returned 0, so it filled the struct (and zeroed() made it valid anyway).
    let u = unsafe { u.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// CPU time and bytes moved by the calls of one series.
#[derive(Default)]
struct CpuMeter {
    secs: Cell<f64>,
    bytes: Cell<f64>,
}

impl CpuMeter {
    /// Runs one call that moves `bytes`, counting its CPU time.
    fn run<T>(&self, bytes: u64, f: impl FnOnce() -> T) -> T {
        let t0 = cpu_seconds();
        let r = f();
        self.secs.set(self.secs.get() + (cpu_seconds() - t0));
        self.bytes.set(self.bytes.get() + bytes as f64);
        r
    }
    /// CPU seconds per GB moved.
    fn per_gb(&self) -> f64 {
        self.secs.get() / (self.bytes.get() / 1e9)
    }
}

impl CudaBench {
    /// 100,000 segments of `seg` bytes (at most 1 GiB in all) between a pageable host buffer,
    /// where they are scattered (a permutation of slots), and a device buffer, where they lie
    /// back to back: host -> device (`h2d`) or device -> host.
    pub(super) fn pageable_segments(
        &self,
        ctx: &Ctx,
        seg: usize,
        h2d: bool,
    ) -> Result<Row, BenchError> {
        if seg == 0 {
            return Err(ctx.bad("zero-byte segments"));
        }
        let count = 100_000.min((1usize << 30) / seg).max(1);
        let total = count * seg;
        let payload = total as u64;
        // Device slot i <-> host slot perm(i).
        let perm = |i: usize| (i.wrapping_mul(7919) % count) * seg;
        let segs: Vec<(usize, usize, usize)> = (0..count)
            .map(|i| {
                if h2d {
                    (i * seg, perm(i), seg)
                } else {
                    (perm(i), i * seg, seg)
                }
            })
            .collect();
        let list: Arc<[ferry::Segment]> = segs
            .iter()
            .map(|&(d, s, n)| ferry::Segment::new(d as u64, s as u64, n as u64))
            .collect();
        let data = pattern_bytes(total);
        let mut want = vec![0u8; total];
        for &(d, s, n) in &segs {
            want[d..d + n].copy_from_slice(&data[s..s + n]);
        }
        let mut pinned = PinnedBuffer::new(total).map_err(setup)?;
        let meters: [CpuMeter; 3] = Default::default();
        let ferry_name = format!("ferry {} spin segment list", self.spin.name());
        let names = if h2d {
            [
                &ferry_name,
                "raw cuMemcpyAsync per segment",
                "raw 1-thread gather to pinned + 1 cuMemcpyAsync",
            ]
        } else {
            [
                &ferry_name,
                "raw cuMemcpyAsync per segment",
                "raw 1 cuMemcpyAsync to pinned + 1-thread scatter",
            ]
        };
        // The caller's view: the default engine vs the raw per-segment calls + synchronize.
        let (series, caller): (Vec<Series>, CallerView) = if h2d {
            let host = data;
            let mut dev = DeviceBuffer::new(0, total).map_err(setup)?;
            let dir = Direction::HostToDevice;
            let mut one =
                |i: usize, role, op: &mut dyn FnMut(&mut DeviceBuffer) -> Result<(), String>| {
                    self.dev_series(
                        ctx,
                        None,
                        names[i],
                        role,
                        payload,
                        &mut dev,
                        &want,
                        |d, _| meters[i].run(payload, || op(d)).map(|()| None),
                    )
                };
            let f = one(0, Role::Ferry, &mut |d| {
                ferry_batch(&self.spin, dir, None, |s| {
                    s.segments(d, &host, Arc::clone(&list)).map(drop)
                })
                .map(drop)
            })?;
            let a = one(1, Role::Baseline, &mut |d| {
                self.raw_batch(None, |raw| raw.copy_segments(d, &host, &segs, 1))
                    .map(drop)
            })?;
            let b = one(2, Role::Baseline, &mut |d| {
                for &(dd, s, n) in &segs {
                    pinned[dd..dd + n].copy_from_slice(&host[s..s + n]);
                }
                self.raw_batch(None, |raw| raw.copy(d, &*pinned, total, 1))
                    .map(drop)
            })?;
            let caller = self.caller_view(
                ctx,
                &mut dev,
                &host[..],
                Moved::Segments(&list, &segs),
                poison_dev,
                dev_is(&want),
            )?;
            (vec![f, a, b], caller)
        } else {
            let dev = DeviceBuffer::from_host(0, &data).map_err(setup)?;
            let mut host = vec![0u8; total];
            let dir = Direction::DeviceToHost;
            let mut one =
                |i: usize, role, op: &mut dyn FnMut(&mut Vec<u8>) -> Result<(), String>| {
                    ctx.clocked_series(names[i], role, payload, || {
                        host.fill(0xA5);
                        let (t, c) = self.time(None, |_| {
                            meters[i].run(payload, || op(&mut host)).map(|()| None)
                        })?;
                        Ok((t, host == want, c))
                    })
                };
            let f = one(0, Role::Ferry, &mut |h| {
                ferry_batch(&self.spin, dir, None, |s| {
                    s.segments(h, &dev, Arc::clone(&list)).map(drop)
                })
                .map(drop)
            })?;
            let a = one(1, Role::Baseline, &mut |h| {
                self.raw_batch(None, |raw| raw.copy_segments(h, &dev, &segs, 1))
                    .map(drop)
            })?;
            let b = one(2, Role::Baseline, &mut |h| {
                self.raw_batch(None, |raw| raw.copy(&mut *pinned, &dev, total, 1))?;
                for &(d, s, n) in &segs {
                    h[d..d + n].copy_from_slice(&pinned[s..s + n]);
                }
                Ok(())
            })?;
            let caller = self.caller_view(
                ctx,
                &mut host,
                &dev,
                Moved::Segments(&list, &segs),
                |h| {
                    h.fill(0xA5);
                    Ok(())
                },
                |h| *h == want,
            )?;
            (vec![f, a, b], caller)
        };
        let ratio = |i: usize| series[0].median / series[i].median;
        let shape = format!(
            "{count} segments of {}, pageable {}; ferry / per-segment {:.2}x, ferry / 1-thread \
             {} {:.2}x; CPU s per GB: ferry {:.3}, per-segment {:.3}, 1-thread {} {:.3}",
            format_size(seg as u64),
            if h2d { "-> device" } else { "<- device" },
            ratio(1),
            if h2d { "gather" } else { "scatter" },
            ratio(2),
            meters[0].per_gb(),
            meters[1].per_gb(),
            if h2d { "gather" } else { "scatter" },
            meters[2].per_gb(),
        );
        let mut row = Row::new(ctx.test, ctx.kind, seg as u64, payload, shape, series);
        row.caller = Some(caller);
        Ok(row)
    }
}
