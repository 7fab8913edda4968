//! `cuda-latency-parts`: where the time of one small submit+wait goes. One pinned -> device
//! copy waited at once, by ferry (the safe scope as `cuda-latency-spin` times it, the same with
//! the default engine as the caller's view times it, and the unsafe `submit_raw` with no scope,
//! whole and split into its submit and its wait, each timed alone by the host clock) and by raw
//! driver calls in several shapes: the plain copy and stream synchronize, the same on ferry's
//! own host -> device stream, and the copy followed by an event waited in each of the driver's
//! ways. Host clock, spinning waits, as the other
//! latency tests. (Was `examples/cuda_latency_parts.rs` until commit eaaeb62, which ran the
//! variants interleaved in rounds; here each is a series of the usual method, one after the
//! other.)

use super::timing::poison_devs;
use super::CudaBench;
use crate::bench::ctx::{flat, setup, Ctx};
use crate::bench::data::pattern_bytes;
use crate::bench::{measure_with, BenchError, Clock, Role, Row};
use ferry::cuda::{DeviceBuffer, Direction, PinnedBuffer};
use ferry::{Engine, EngineExt, Layout};
use ferry_bench::{submit_raw_and_wait, submit_raw_parts, RawWait};

impl CudaBench {
    /// Submit+wait of one copy of `size` bytes in each shape: host clock.
    pub(super) fn latency_parts(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let mut src = PinnedBuffer::new(size).map_err(setup)?;
        let data = pattern_bytes(size);
        src.copy_from_slice(&data);
        let mut dev = DeviceBuffer::new(0, size).map_err(setup)?;
        let l = Layout::bytes(size).map_err(setup)?;
        let n = size as u64;
        let (e, d) = (&self.spin, &self.engine);
        let spin: &ferry::cuda::CudaEngine = e;
        let mut series = Vec::new();
        // The safe API's shape with the spin engine (as `cuda-latency-spin` times it) and with
        // the default one (as the caller's view does).
        for (eng, how) in [(spin, "spin"), (d, "default")] {
            let name = format!("ferry {} {how}: scope + copy + wait", eng.name());
            series.push(self.dev_series(
                ctx,
                None,
                &name,
                Role::Ferry,
                n,
                &mut dev,
                &data,
                |dv, _| {
                    flat(
                        eng.scope(|s| s.copy(dv, &l, &src, &l)?.wait().map_err(ferry::Error::from)),
                    )
                    .map(|()| None)
                },
            )?);
        }
        series.push(self.dev_series(
            ctx,
            None,
            &format!("ferry {} spin: submit_raw + wait", e.name()),
            Role::Ferry,
            n,
            &mut dev,
            &data,
            |dv, _| {
                submit_raw_and_wait(e, dv, &src, l)
                    .map_err(|e| e.to_string())
                    .map(|()| None)
            },
        )?);
        // The two halves of `submit_raw` + wait, each timed alone (the other half runs
        // untimed): where ferry's time goes, beside the raw shapes below.
        for (eng, how) in [(spin, "spin"), (d, "default")] {
            for (part, wait_half) in [("submit_raw only", false), ("its wait only", true)] {
                let name = format!("ferry {} {how}: {part}", eng.name());
                series.push(ctx.clocked_series(&name, Role::Ferry, n, || {
                    poison_devs(std::slice::from_mut(&mut dev))?;
                    let t = measure_with(&self.method, || {
                        submit_raw_parts(eng, &mut dev, &src, l)
                            .map(|(s, w)| if wait_half { w } else { s }.as_secs_f64())
                            .map_err(|e| e.to_string())
                    })?;
                    Ok((t, dev.to_vec().is_ok_and(|v| v == data), Clock::Host))
                })?);
            }
        }
        // The twin's (the same settings): handing out the spin engine's own stream would make
        // its later requests record events at submit (the next sizes' ferry series).
        let ferry_stream = &**e.latched.stream(Direction::HostToDevice);
        let raw = [
            ("raw copy + cuStreamSynchronize", None, RawWait::StreamSync),
            (
                "raw copy on ferry's H2D stream + cuStreamSynchronize",
                Some(ferry_stream),
                RawWait::StreamSync,
            ),
            (
                "raw copy + cuEventRecord + cuEventSynchronize",
                None,
                RawWait::EventSync,
            ),
            (
                "raw copy + cuEventRecord + cuEventSynchronize, 64 events in turn",
                None,
                RawWait::EventRing,
            ),
            (
                "raw copy + cuEventRecord + cuStreamSynchronize",
                None,
                RawWait::EventThenStreamSync,
            ),
            (
                "raw copy + cuEventRecord + cuEventQuery loop",
                None,
                RawWait::EventQuery,
            ),
        ];
        for (name, stream, wait) in raw {
            series.push(self.dev_series(
                ctx,
                None,
                name,
                Role::Baseline,
                n,
                &mut dev,
                &data,
                |d, _| {
                    self.raw
                        .copy_waited(d, &src, size, stream, wait)
                        .map_err(|e| e.to_string())
                        .map(|()| None)
                },
            )?);
        }
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            n,
            n,
            "pinned -> device".into(),
            series,
        ))
    }
}
