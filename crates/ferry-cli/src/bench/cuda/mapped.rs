//! Mapped (zero-copy) host memory <-> device, moved by the SMs: ferry with
//! `KernelCopies::Always` next to a plain kernel launch and the copy engine.

use super::caller::Moved;
use super::timing::{dev_bufs, devs_check, ferry_batch, poison_devs};
use super::{batch, CudaBench};
use crate::bench::ctx::{setup, Ctx};
use crate::bench::data::pattern_bytes;
use crate::bench::{BenchError, Role, Row};
use ferry::cuda::{DeviceBuffer, Direction, MappedBuffer};
use ferry::{Engine, Layout};

impl CudaBench {
    /// The SM kernels of the mapped rows (ferry's, both of the SM twin's engines, and the raw
    /// copier's) compiled and loaded before any series times them behind the latch
    /// ([`Twin::kernels_ready`](super::Twin)). The raw copier's failure (no NVRTC) is the row's,
    /// named as its series would have named it.
    fn sm_ready(&self, ctx: &Ctx) -> Result<(), BenchError> {
        self.sm.kernels_ready();
        self.raw
            .sm_ready()
            .map_err(|e| ctx.engine_err("raw SM kernel launch", e.to_string()))
    }

    /// Mapped (zero-copy) host memory -> device, read by the SMs: ferry with
    /// `KernelCopies::Always`, a plain kernel launch, and the copy engine.
    pub(super) fn h2d_mapped(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let batch = batch(size);
        let data = pattern_bytes(size);
        let mut src = MappedBuffer::new(size).map_err(setup)?;
        src.copy_from_slice(&data);
        let mut devs = dev_bufs(batch, size, 0)?;
        let payload = (size * batch) as u64;
        let l = Layout::bytes(size).map_err(setup)?;
        let (tm, dir) = (self.clock(true), Direction::HostToDevice);
        self.sm_ready(ctx)?;
        let mut series = vec![];
        let name = format!("ferry {} SM (KernelCopies::Always)", self.sm.name());
        series.push(ctx.clocked_series(&name, Role::Ferry, payload, || {
            poison_devs(&mut devs)?;
            let (t, c) = self.time(tm, |t| {
                ferry_batch(&self.sm, dir, t, |s| {
                    devs.iter_mut()
                        .try_for_each(|d| s.copy(d, &l, &src, &l).map(drop))
                })
            })?;
            Ok((t, devs_check(&devs, &data), c))
        })?);
        for (name, sm) in [
            ("raw SM kernel launch", true),
            ("raw cuMemcpyAsync (copy engine)", false),
        ] {
            series.push(ctx.clocked_series(name, Role::Baseline, payload, || {
                poison_devs(&mut devs)?;
                let (t, c) = self.time(tm, |t| {
                    self.raw_batch(t, |raw| {
                        if sm {
                            devs.iter_mut()
                                .try_for_each(|d| raw.kernel_copy(d, &src, size, 1))
                        } else {
                            raw.copy_into_each(&mut devs, &src, size)
                        }
                    })
                })?;
                Ok((t, devs_check(&devs, &data), c))
            })?);
        }
        let caller = self.dev_caller_view(ctx, &mut devs[0], &src, &data)?;
        let mut row = Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            payload,
            "mapped host -> device".into(),
            series,
        );
        row.caller = Some(caller);
        Ok(row)
    }

    /// Device -> mapped (zero-copy) host memory, written by the SMs.
    pub(super) fn d2h_mapped(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let batch = batch(size);
        let data = pattern_bytes(size);
        let src = DeviceBuffer::from_host(0, &data).map_err(setup)?;
        let mut hosts = (0..batch)
            .map(|_| MappedBuffer::new(size))
            .collect::<Result<Vec<_>, _>>()
            .map_err(setup)?;
        let payload = (size * batch) as u64;
        let l = Layout::bytes(size).map_err(setup)?;
        let (tm, dir) = (self.clock(true), Direction::DeviceToHost);
        self.sm_ready(ctx)?;
        let check = |hs: &[MappedBuffer]| hs.iter().all(|h| h[..] == data[..]);
        let mut series = vec![];
        let name = format!("ferry {} SM (KernelCopies::Always)", self.sm.name());
        series.push(ctx.clocked_series(&name, Role::Ferry, payload, || {
            hosts.iter_mut().for_each(|h| h.fill(0xA5));
            let (t, c) = self.time(tm, |t| {
                ferry_batch(&self.sm, dir, t, |s| {
                    hosts
                        .iter_mut()
                        .try_for_each(|h| s.copy(h, &l, &src, &l).map(drop))
                })
            })?;
            Ok((t, check(&hosts), c))
        })?);
        for (name, sm) in [
            ("raw SM kernel launch", true),
            ("raw cuMemcpyAsync (copy engine)", false),
        ] {
            series.push(ctx.clocked_series(name, Role::Baseline, payload, || {
                hosts.iter_mut().for_each(|h| h.fill(0xA5));
                let (t, c) = self.time(tm, |t| {
                    self.raw_batch(t, |raw| {
                        if sm {
                            hosts
                                .iter_mut()
                                .try_for_each(|h| raw.kernel_copy(h, &src, size, 1))
                        } else {
                            raw.copy_into_each(&mut hosts, &src, size)
                        }
                    })
                })?;
                Ok((t, check(&hosts), c))
            })?);
        }
        let poison = |h: &mut MappedBuffer| {
            h.fill(0xA5);
            Ok(())
        };
        let caller =
            self.caller_view(ctx, &mut hosts[0], &src, Moved::Bytes(size), poison, |h| {
                h[..] == data[..]
            })?;
        let mut row = Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            payload,
            "device -> mapped host".into(),
            series,
        );
        row.caller = Some(caller);
        Ok(row)
    }
}
