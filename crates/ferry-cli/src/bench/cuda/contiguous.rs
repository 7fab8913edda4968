//! Contiguous copies: host (pinned or pageable) <-> device, device -> device, and both
//! directions at once.

use super::caller::{cpu_metered, poison_dev, Moved};
use super::timing::{dev_bufs, devs_check, ferry_batch, ferry_batches, poison_devs};
use super::{batch, CudaBench};
use crate::bench::ctx::{flat, setup, Ctx};
use crate::bench::data::pattern_bytes;
use crate::bench::{BenchError, Role, Row, Series};
use ferry::cuda::{DeviceBuffer, Direction, PinnedBuffer};
use ferry::{Engine, EngineExt, Layout, Memory};

impl CudaBench {
    /// Host -> device: pinned or pageable source.
    pub(super) fn h2d(&self, ctx: &Ctx, size: usize, pinned: bool) -> Result<Row, BenchError> {
        let batch = batch(size);
        let data = pattern_bytes(size);
        let mut devs = dev_bufs(batch, size, 0)?;
        let dir = Direction::HostToDevice;
        let (shape, series, caller) = if pinned {
            let mut src = PinnedBuffer::new(size).map_err(setup)?;
            src.copy_from_slice(&data);
            (
                "pinned -> device",
                self.h2d_series(ctx, &mut devs, &src, &data, dir, true)?,
                self.dev_caller_view(ctx, &mut devs[0], &src, &data)?,
            )
        } else {
            // Pageable: ferry's staged path runs on CPU threads and the driver's pageable copy
            // may wait for the stream: host clock.
            (
                "pageable -> device",
                self.h2d_series(ctx, &mut devs, &data, &data, dir, false)?,
                self.dev_caller_view(ctx, &mut devs[0], &data[..], &data)?,
            )
        };
        let mut row = Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            (size * batch) as u64,
            shape.into(),
            series,
        );
        row.caller = Some(caller);
        Ok(row)
    }

    /// `data.len()` bytes of `src` into each of `devs`: ferry (on `dir`'s stream) and the raw
    /// driver; CUDA events where `events`.
    pub(super) fn h2d_series<S: Memory + ?Sized>(
        &self,
        ctx: &Ctx,
        devs: &mut [DeviceBuffer],
        src: &S,
        data: &[u8],
        dir: Direction,
        events: bool,
    ) -> Result<Vec<Series>, BenchError> {
        let size = data.len();
        let payload = (size * devs.len()) as u64;
        let l = Layout::bytes(size).map_err(setup)?;
        let timer = self.clock(events);
        let name = format!("ferry {} spin", self.spin.name());
        let mut cpu = (None, 0);
        let f = ctx
            .clocked_series(&name, Role::Ferry, payload, || {
                poison_devs(devs)?;
                let (r, spent, calls) = cpu_metered(|n| {
                    self.time(timer, |tm| {
                        n.set(n.get() + 1);
                        ferry_batch(&self.spin, dir, tm, |s| {
                            devs.iter_mut()
                                .try_for_each(|d| s.copy(d, &l, src, &l).map(drop))
                        })
                    })
                });
                let (t, c) = r?;
                cpu = (spent, calls);
                Ok((t, devs_check(devs, data), c))
            })?
            .with_cpu(cpu.0, cpu.1, payload);
        let r = ctx
            .clocked_series("raw driver", Role::Baseline, payload, || {
                poison_devs(devs)?;
                let (r, spent, calls) = cpu_metered(|n| {
                    self.time(timer, |tm| {
                        n.set(n.get() + 1);
                        self.raw_batch(tm, |raw| raw.copy_into_each(devs, src, size))
                    })
                });
                let (t, c) = r?;
                cpu = (spent, calls);
                Ok((t, devs_check(devs, data), c))
            })?
            .with_cpu(cpu.0, cpu.1, payload);
        Ok(vec![f, r])
    }

    /// Device -> host: pinned or pageable destination.
    pub(super) fn d2h(&self, ctx: &Ctx, size: usize, pinned: bool) -> Result<Row, BenchError> {
        let batch = batch(size);
        let data = pattern_bytes(size);
        let src = DeviceBuffer::from_host(0, &data).map_err(setup)?;
        let payload = (size * batch) as u64;
        let l = Layout::bytes(size).map_err(setup)?;
        let timer = self.clock(pinned);
        let dir = Direction::DeviceToHost;
        let mut series = vec![];
        let caller;
        macro_rules! run_with {
            ($hosts:expr, $shape:expr) => {{
                let mut hosts = $hosts;
                for (name, role) in [
                    (format!("ferry {} spin", self.spin.name()), Role::Ferry),
                    ("raw driver".to_string(), Role::Baseline),
                ] {
                    let mut cpu = (None, 0);
                    series.push(
                        ctx.clocked_series(&name, role, payload, || {
                            hosts.iter_mut().for_each(|h| h.fill(0xA5));
                            let (r, spent, calls) = cpu_metered(|n| {
                                self.time(timer, |tm| {
                                    n.set(n.get() + 1);
                                    if role == Role::Ferry {
                                        ferry_batch(&self.spin, dir, tm, |s| {
                                            hosts
                                                .iter_mut()
                                                .try_for_each(|h| s.copy(h, &l, &src, &l).map(drop))
                                        })
                                    } else {
                                        self.raw_batch(tm, |raw| {
                                            raw.copy_into_each(&mut hosts, &src, size)
                                        })
                                    }
                                })
                            });
                            let (t, c) = r?;
                            cpu = (spent, calls);
                            Ok((t, hosts.iter().all(|h| h[..] == data[..]), c))
                        })?
                        .with_cpu(cpu.0, cpu.1, payload),
                    );
                }
                caller = Some(self.caller_view(
                    ctx,
                    &mut hosts[0],
                    &src,
                    Moved::Bytes(size),
                    |h| {
                        h.fill(0xA5);
                        Ok(())
                    },
                    |h| h[..] == data[..],
                )?);
                $shape
            }};
        }
        let shape = if pinned {
            run_with!(
                (0..batch)
                    .map(|_| PinnedBuffer::new(size))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(setup)?,
                "device -> pinned"
            )
        } else {
            run_with!(
                (0..batch).map(|_| vec![0u8; size]).collect::<Vec<_>>(),
                "device -> pageable"
            )
        };
        let mut row = Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            payload,
            shape.into(),
            series,
        );
        row.caller = caller;
        Ok(row)
    }

    /// Device 0 -> device `to` (0: on one GPU; 1: a peer copy).
    pub(super) fn d2d(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let batch = batch(size);
        let data = pattern_bytes(size);
        let src = DeviceBuffer::from_host(0, &data).map_err(setup)?;
        let mut devs = dev_bufs(batch, size, 0)?;
        let dir = Direction::DeviceToDevice;
        let series = self.h2d_series(ctx, &mut devs, &src, &data, dir, true)?;
        let caller = self.dev_caller_view(ctx, &mut devs[0], &src, &data)?;
        let mut row = Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            (size * batch) as u64,
            "device -> device".to_string(),
            series,
        );
        row.caller = Some(caller);
        Ok(row)
    }

    /// Both directions at once, on two streams (ferry: its host-to-device and device-to-host
    /// streams; raw: the copier's two), both behind the latch.
    pub(super) fn bidir(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let data = pattern_bytes(size);
        let mut up_src = PinnedBuffer::new(size).map_err(setup)?;
        up_src.copy_from_slice(&data);
        let down_src = DeviceBuffer::from_host(0, &data).map_err(setup)?;
        let mut up_dst = DeviceBuffer::new(0, size).map_err(setup)?;
        let mut down_dst = PinnedBuffer::new(size).map_err(setup)?;
        let l = Layout::bytes(size).map_err(setup)?;
        let payload = 2 * size as u64;
        let check = |up: &DeviceBuffer, down: &PinnedBuffer| {
            up.to_vec().is_ok_and(|v| v == data) && down[..] == data[..]
        };
        let timer = self.clock(true);
        let e = &self.spin;
        let f = ctx.clocked_series(
            &format!("ferry {} spin", e.name()),
            Role::Ferry,
            payload,
            || {
                down_dst.fill(0xA5);
                let dirs = [Direction::HostToDevice, Direction::DeviceToHost];
                let (t, c) = self.time(timer, |tm| {
                    ferry_batches(e, &dirs, tm, |s| {
                        let _up = s.copy(&mut up_dst, &l, &up_src, &l)?;
                        s.copy(&mut down_dst, &l, &down_src, &l).map(drop)
                    })
                })?;
                Ok((t, check(&up_dst, &down_dst), c))
            },
        )?;
        let r = ctx.clocked_series("raw driver (2 streams)", Role::Baseline, payload, || {
            down_dst.fill(0xA5);
            let (t, c) = self.time(timer, |tm| {
                self.raw_batch(tm, |raw| {
                    raw.bidir(&mut up_dst, &up_src, &mut down_dst, &down_src, size, 1)
                })
            })?;
            Ok((t, check(&up_dst, &down_dst), c))
        })?;
        let mut outs = (up_dst, down_dst);
        let caller = self.caller_pair(
            ctx,
            &mut outs,
            payload,
            |e, (up, down)| {
                flat(e.scope(|s| {
                    let u = s.copy(up, &l, &up_src, &l)?;
                    let d = s.copy(down, &l, &down_src, &l)?;
                    u.wait()?;
                    d.wait().map_err(ferry::Error::from)
                }))
            },
            (
                "raw H2D + D2H on 2 streams + 2 cuStreamSynchronize (caller)",
                |raw, (up, down)| {
                    raw.bidir(up, &up_src, down, &down_src, size, 1)
                        .map_err(|e| e.to_string())
                },
            ),
            |(up, down)| {
                down.fill(0xA5);
                poison_dev(up)
            },
            |(up, down)| check(up, down),
        )?;
        let mut row = Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            payload,
            "pinned <-> device, both at once".into(),
            vec![f, r],
        );
        row.caller = Some(caller);
        Ok(row)
    }
}
