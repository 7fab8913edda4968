//! Strided copies: a 2-D tile, a transpose and a scattered segment list into the device,
//! each next to the raw driver's calls for the same plan and a contiguous copy of the same
//! bytes.

use super::caller::{dev_is, poison_dev, Moved};
use super::timing::ferry_batch;
use super::CudaBench;
use crate::bench::ctx::{flat, setup, Ctx};
use crate::bench::data::pattern_bytes;
use crate::bench::{BenchError, CallerView, Role, Row, Series};
use crate::sizes::format_size;
use ferry::cuda::{DeviceBuffer, Direction, PinnedBuffer};
use ferry::{Engine, EngineExt, Error, Layout, Memory};
use ferry_bench::StreamTimer;
use std::sync::Arc;

impl CudaBench {
    /// A strided copy into `dev` as three series: ferry's copy of `src` from `src_l` into
    /// `dst_l` (its name ends in `names.0`), the raw driver's calls for the same plan (named
    /// `names.1`), and ferry's contiguous copy of the first `dev.len()` bytes of `src`; and the
    /// caller's view of the strided copy (the default engine vs the raw calls + synchronize).
    /// `want`: the strided result; `same`: those first bytes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn strided_series<S: Memory + Sync + ?Sized>(
        &self,
        ctx: &Ctx,
        tm: Option<&StreamTimer>,
        dir: Direction,
        dev: &mut DeviceBuffer,
        src: &S,
        (dst_l, src_l): (&Layout, &Layout),
        (want, same): (&[u8], &[u8]),
        names: (&str, &str),
    ) -> Result<(Vec<Series>, CallerView), BenchError> {
        let plan = ferry::Plan::new(dst_l, src_l).map_err(setup)?;
        let flat_l = Layout::bytes(dev.len()).map_err(setup)?;
        let payload = dev.len() as u64;
        let name = format!("ferry {} spin {}", self.spin.name(), names.0);
        let f = self.dev_series(ctx, tm, &name, Role::Ferry, payload, dev, want, |d, t| {
            ferry_batch(&self.spin, dir, t, |s| {
                s.copy(d, dst_l, src, src_l).map(drop)
            })
        })?;
        let r = self.dev_series(
            ctx,
            tm,
            names.1,
            Role::Baseline,
            payload,
            dev,
            want,
            |d, t| self.raw_batch(t, |raw| raw.copy_plan(d, src, &plan, 1)),
        )?;
        let contig = "ferry contiguous, same bytes";
        let c = self.dev_series(
            ctx,
            tm,
            contig,
            Role::Baseline,
            payload,
            dev,
            same,
            |d, t| {
                ferry_batch(&self.spin, dir, t, |s| {
                    s.copy(d, &flat_l, src, &flat_l).map(drop)
                })
            },
        )?;
        let caller = self.dev_caller_pair(
            ctx,
            dev,
            want,
            |e, d| flat(e.scope(|s| s.copy(d, dst_l, src, src_l)?.wait().map_err(Error::from))),
            (
                &format!("{} + cuStreamSynchronize (caller)", names.1),
                |raw, d| raw.copy_plan(d, src, &plan, 1).map_err(|e| e.to_string()),
            ),
        )?;
        Ok((vec![f, r, c], caller))
    }

    /// A tile of 4 KiB rows out of a pinned matrix with 8 KiB rows, into a dense device buffer.
    pub(super) fn tile(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        const ROW: usize = 4096;
        let rows = size / ROW;
        if rows == 0 {
            return Err(ctx.bad("below one 4 KiB row"));
        }
        let size = rows * ROW;
        let mut host = PinnedBuffer::new(2 * size).map_err(setup)?;
        host.copy_from_slice(&pattern_bytes(2 * size));
        let src_l = Layout::pitched(&[rows, ROW], 1, 2 * ROW).map_err(setup)?;
        let dst_l = Layout::contiguous(&[rows, ROW], 1).map_err(setup)?;
        let want: Vec<u8> = host
            .chunks(2 * ROW)
            .flat_map(|r| r[..ROW].to_vec())
            .collect();
        let mut dev = DeviceBuffer::new(0, size).map_err(setup)?;
        let (series, caller) = self.strided_series(
            ctx,
            self.clock(true),
            Direction::HostToDevice,
            &mut dev,
            &host,
            (&dst_l, &src_l),
            (&want, &host[..size]),
            ("2-D", "raw cuMemcpy2DAsync"),
        )?;
        let mut row = Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            size as u64,
            format!("{rows} rows x 4 KiB, pitch 8 KiB"),
            series,
        );
        row.caller = Some(caller);
        Ok(row)
    }

    /// Transpose of `batch` square matrices of `elem`-byte elements, about `size` bytes in all
    /// (`[batch, n, n] -> [batch, n, n]` with the last two axes swapped), into a device buffer,
    /// from a device buffer or (`from_host`) from pinned memory.
    pub(super) fn transpose(
        &self,
        ctx: &Ctx,
        size: usize,
        (elem, batch): (usize, usize),
        from_host: bool,
    ) -> Result<Row, BenchError> {
        let ty = match elem {
            2 => "bf16".to_string(),
            4 => "f32".to_string(),
            _ => format!("{elem}-byte"),
        };
        let side = ((size / elem / batch) as f64).sqrt() as usize;
        if side < 2 {
            return Err(ctx.bad("below a 2 x 2 matrix per batch"));
        }
        let plane = side * side * elem;
        let bytes = batch * plane;
        let data = pattern_bytes(bytes);
        let m = Layout::contiguous(&[batch, side, side], elem).map_err(setup)?;
        let src_l = m.transpose(1, 2).map_err(setup)?;
        // want[b][j][i] = data[b][i][j].
        let mut want = vec![0u8; bytes];
        for b in 0..batch {
            for i in 0..side {
                for j in 0..side {
                    let d = b * plane + (j * side + i) * elem;
                    let s = b * plane + (i * side + j) * elem;
                    want[d..d + elem].copy_from_slice(&data[s..s + elem]);
                }
            }
        }
        let mut dev = DeviceBuffer::new(0, bytes).map_err(setup)?;
        // Host clock: the raw baseline is one driver call per plane (thousands), more than a
        // stream's queue holds while a latch keeps it from starting.
        let tm = self.clock(false);
        let names = ("(SM kernel: Auto)", "raw cuMemcpy2D/3DAsync");
        let (layouts, bytes_of) = ((&m, &src_l), (&want[..], &data[..]));
        let ((series, caller), shape) = if from_host {
            let mut host = PinnedBuffer::new(bytes).map_err(setup)?;
            host.copy_from_slice(&data);
            let dir = Direction::HostToDevice;
            let series =
                self.strided_series(ctx, tm, dir, &mut dev, &host, layouts, bytes_of, names)?;
            (series, "pinned -> device")
        } else {
            let src = DeviceBuffer::from_host(0, &data).map_err(setup)?;
            let dir = Direction::DeviceToDevice;
            let series =
                self.strided_series(ctx, tm, dir, &mut dev, &src, layouts, bytes_of, names)?;
            (series, "device -> device")
        };
        let what = match batch {
            1 => format!("{side} x {side} {ty}, {shape}"),
            _ => format!("{batch} x {side} x {side} {ty} (last two axes), {shape}"),
        };
        let mut row = Row::new(ctx.test, ctx.kind, size as u64, bytes as u64, what, series);
        row.caller = Some(caller);
        Ok(row)
    }

    /// Many scattered segments of `seg` bytes (a permutation of slots) pinned -> device.
    pub(super) fn scatter(&self, ctx: &Ctx, seg: usize) -> Result<Row, BenchError> {
        if seg == 0 {
            return Err(ctx.bad("zero-byte segments"));
        }
        let count = 100_000.min((1usize << 30) / seg).max(1);
        let total = count * seg;
        let mut host = PinnedBuffer::new(total).map_err(setup)?;
        host.copy_from_slice(&pattern_bytes(total));
        // Segment i of the destination comes from slot perm(i) of the source.
        let segs: Vec<(usize, usize, usize)> = (0..count)
            .map(|i| (i * seg, (i.wrapping_mul(7919) % count) * seg, seg))
            .collect();
        let want: Vec<u8> = segs
            .iter()
            .flat_map(|&(_, s, n)| host[s..s + n].to_vec())
            .collect();
        let mut dev = DeviceBuffer::new(0, total).map_err(setup)?;
        let list: Arc<[ferry::Segment]> = segs
            .iter()
            .map(|&(d, s, n)| ferry::Segment::new(d as u64, s as u64, n as u64))
            .collect();
        let payload = total as u64;
        // Host clock: the raw baseline is 100,000 driver calls, more than a stream's queue
        // holds while a latch keeps it from starting.
        let (tm, dir) = (self.clock(false), Direction::HostToDevice);
        let name = format!("ferry {} spin segment list", self.spin.name());
        let f = self.dev_series(
            ctx,
            tm,
            &name,
            Role::Ferry,
            payload,
            &mut dev,
            &want,
            |d, t| {
                ferry_batch(&self.spin, dir, t, |s| {
                    s.segments(d, &host, Arc::clone(&list)).map(drop)
                })
            },
        )?;
        let per = "raw cuMemcpyAsync per segment";
        let r = self.dev_series(
            ctx,
            tm,
            per,
            Role::Baseline,
            payload,
            &mut dev,
            &want,
            |d, t| self.raw_batch(t, |raw| raw.copy_segments(d, &host, &segs, 1)),
        )?;
        let caller = self.caller_view(
            ctx,
            &mut dev,
            &*host,
            Moved::Segments(&list, &segs),
            poison_dev,
            dev_is(&want),
        )?;
        let mut row = Row::new(
            ctx.test,
            ctx.kind,
            seg as u64,
            payload,
            format!("{count} segments of {}", format_size(seg as u64)),
            vec![f, r],
        );
        row.caller = Some(caller);
        Ok(row)
    }
}
