//! GPU tests of `ferry bench`: the CUDA engine next to raw driver calls, in the same run, on
//! the same buffers.
//!
//! Every bandwidth series does one *batch* per timed call: `batch` copies released together
//! (ferry: `batch` requests submitted back to back, then waited; raw: `batch` driver calls on
//! one stream, then one synchronize). `batch` is 8 below 16 MiB and 1 above. Where the copies
//! only enqueue and take few driver calls (every bandwidth test but the pageable ones,
//! `cuda-transpose*` and `cuda-scatter`, whose raw baselines make thousands of calls: more than
//! a stream's queue holds behind a closed latch), the batch is timed with CUDA events behind a
//! latch ([`StreamTimer`]; `cuda-bidir`: both streams behind one latch), as
//! nvbandwidth does: ferry's side on the engine's stream for the copy's direction
//! ([`CudaEngine::stream`]), the raw side on the raw copier's stream
//! ([`RawCopier::timed`]). The other rows, and all rows if the latch cannot be set up here, are
//! timed on the host ([`Clock`] says which, per series). Bandwidth rows use an engine with
//! [`WaitMode::Spin`], as the raw side's `cuStreamSynchronize` spins by default; the latency
//! rows show the default blocking wait and the spin wait. Destinations are poisoned before
//! each series and compared with the source after it. The link limit is PCIe generation x
//! width as the probe reads it (e.g. gen 5 x16 = 63.0 GB/s per direction).

mod parts;

use super::cpu::pattern_bytes;
use super::{
    measure, measure_with, BenchError, Clock, Kind, Method, Needs, Role, Row, Series, TestInfo,
    Timing,
};
use crate::sizes::format_size;
use ferry::cuda::{
    self, CudaConfig, CudaEngine, DeviceBuffer, Direction, KernelCopies, MappedBuffer,
    PinnedBuffer, WaitMode,
};
use ferry::{Engine, EngineExt, Layout, Memory};
use ferry_bench::{BaselineError, RawCopier, StreamTimer};
use std::sync::Arc;

const fn gpu(
    name: &'static str,
    description: &'static str,
    kind: Kind,
    sizes: &'static str,
) -> TestInfo {
    TestInfo::new(name, description, Needs::Cuda, kind, sizes)
}

/// The GPU tests (the same paths as the design notes' H200 table).
pub static TESTS: &[TestInfo] = &[
    gpu("cuda-h2d-pinned", "host (pinned) -> device, vs raw cuMemcpyHtoDAsync", Kind::Bandwidth, "64K,1M,16M,256M"),
    gpu("cuda-d2h-pinned", "device -> host (pinned), vs raw cuMemcpyDtoHAsync", Kind::Bandwidth, "64K,1M,16M,256M"),
    gpu("cuda-h2d-pageable", "host (pageable) -> device, ferry's pageable path, vs the driver's own pageable copy", Kind::Bandwidth, "1M,16M,256M"),
    gpu("cuda-d2h-pageable", "device -> host (pageable), ferry's pageable path, vs the driver's own pageable copy", Kind::Bandwidth, "1M,16M,256M"),
    gpu("cuda-d2d", "device -> device on one GPU, vs raw cuMemcpyDtoDAsync", Kind::Bandwidth, "1M,16M,256M"),
    gpu("cuda-bidir", "host -> device and device -> host at once (pinned), payload both ways", Kind::Bandwidth, "1M,16M,256M"),
    gpu("cuda-tile", "2-D tile (4 KiB rows of a pinned matrix twice as wide) -> device, vs raw cuMemcpy2DAsync and a contiguous copy of the same bytes", Kind::Bandwidth, "1M,16M,256M"),
    gpu("cuda-h2d-mapped", "host (mapped, zero-copy) -> device read by the SMs (KernelCopies::Always), vs a plain SM kernel launch and cuMemcpyAsync on the copy engine", Kind::Bandwidth, "64K,1M,16M,256M"),
    gpu("cuda-d2h-mapped", "device -> host (mapped, zero-copy) written by the SMs (KernelCopies::Always), vs a plain SM kernel launch and cuMemcpyAsync on the copy engine", Kind::Bandwidth, "64K,1M,16M,256M"),
    gpu("cuda-transpose", "transpose of a square f32 matrix (size = matrix bytes), device -> device, vs raw cuMemcpy2D/3DAsync of the same plan and a contiguous copy of the same bytes", Kind::Bandwidth, "1M,16M,64M"),
    gpu("cuda-transpose-h2d", "transpose of a square f32 matrix, pinned host -> device, vs raw cuMemcpy2D/3DAsync of the same plan and a contiguous copy of the same bytes", Kind::Bandwidth, "1M,16M,64M"),
    gpu("cuda-scatter", "100,000 scattered segments (size = segment) pinned -> device, vs one cuMemcpyAsync per segment", Kind::Bandwidth, "1K,4K,64K"),
    gpu("cuda-latency", "submit+wait of one small pinned -> device copy, default (blocking) wait, vs cuMemcpyAsync + cuStreamSynchronize", Kind::Latency, "4,64,1K,4K,64K"),
    gpu("cuda-latency-spin", "as cuda-latency with WaitMode::Spin", Kind::Latency, "4,64,1K,4K,64K"),
    gpu("cuda-latency-hybrid", "as cuda-latency with WaitMode::SpinThenBlock(50 us)", Kind::Latency, "4,4K,64K"),
    gpu("cuda-latency-parts", "where a small submit+wait's time goes: ferry (spin) through the scope and through submit_raw, vs raw cuMemcpyAsync waited by stream sync (own stream, ferry's), event sync (one event, 64 in turn), event + stream sync, event query loop", Kind::Latency, "4,4K,64K"),
];

/// Whether the GPU tests can run, or why not.
pub fn available() -> Result<(), String> {
    let p = cuda::probe();
    match p.driver {
        Err(why) => Err(why),
        Ok(_) if p.devices.is_empty() => Err("the CUDA driver sees no GPU".to_string()),
        Ok(_) => Ok(()),
    }
}

/// Whether the tests between GPUs can run (at least two GPUs), or why not.
pub fn available_two() -> Result<(), String> {
    available()?;
    match cuda::probe().devices.len() {
        n if n >= 2 => Ok(()),
        n => Err(format!("needs 2 GPUs; this machine has {n}")),
    }
}

/// The GPU side of a bench run: engines on device 0 and a raw copier, created once.
pub struct CudaBench {
    engine: CudaEngine,
    spin: CudaEngine,
    /// Spin waits, every copy between device-accessible buffers on the SMs.
    sm: CudaEngine,
    raw: RawCopier,
    /// The latch and events; `None` where they cannot work here (host clock then).
    timer: Option<StreamTimer>,
    method: Method,
    link_gbps: Option<f64>,
}

/// PCIe link limit per direction in GB/s.
fn link_limit(gen: u32, width: u32) -> Option<f64> {
    let (gts, enc) = match gen {
        1 => (2.5, 0.8),
        2 => (5.0, 0.8),
        3 => (8.0, 128.0 / 130.0),
        4 => (16.0, 128.0 / 130.0),
        5 => (32.0, 128.0 / 130.0),
        6 => (64.0, 1.0),
        _ => return None,
    };
    Some(gts * enc * width as f64 / 8.0)
}

fn setup(e: impl std::fmt::Display) -> BenchError {
    BenchError::Setup(e.to_string())
}

impl CudaBench {
    /// Engines on device 0 (default wait, and spin wait for the latency test).
    pub fn new(method: Method) -> Result<CudaBench, BenchError> {
        // FERRY_STAGING_* tune the staged path, as in any program that asks for them.
        let base = CudaConfig::from_env(0).map_err(setup)?;
        let engine = CudaEngine::with_config(base).map_err(setup)?;
        let spin = CudaEngine::with_config(base.wait_mode(WaitMode::Spin)).map_err(setup)?;
        let sm = CudaEngine::with_config(
            base.wait_mode(WaitMode::Spin)
                .kernel_copies(KernelCopies::Always),
        )
        .map_err(setup)?;
        let raw = RawCopier::new(0).map_err(setup)?;
        // The latch must work on this driver: one empty timed batch, else the host clock.
        let timer = StreamTimer::new(0).ok().filter(|t| {
            let st = spin.stream(Direction::DeviceToDevice);
            t.time(st, || ()).is_ok() && t.seconds().is_ok()
        });
        let link_gbps = cuda::probe()
            .devices
            .first()
            .and_then(|d| link_limit(d.pcie_gen?, d.pcie_width?));
        Ok(CudaBench {
            engine,
            spin,
            sm,
            raw,
            timer,
            method,
            link_gbps,
        })
    }

    /// Runs one GPU test at one size.
    pub fn run(&mut self, test: &TestInfo, size: u64) -> Result<Row, BenchError> {
        let ctx = Ctx {
            test: test.name,
            size: format_size(size),
            kind: test.kind,
        };
        let size = usize::try_from(size).map_err(|_| ctx.bad("larger than the address space"))?;
        let mut row = match test.name {
            "cuda-h2d-pinned" => self.h2d(&ctx, size, true)?,
            "cuda-d2h-pinned" => self.d2h(&ctx, size, true)?,
            "cuda-h2d-pageable" => self.h2d(&ctx, size, false)?,
            "cuda-d2h-pageable" => self.d2h(&ctx, size, false)?,
            "cuda-d2d" => self.d2d(&ctx, size)?,
            "cuda-bidir" => self.bidir(&ctx, size)?,
            "cuda-tile" => self.tile(&ctx, size)?,
            "cuda-h2d-mapped" => self.h2d_mapped(&ctx, size)?,
            "cuda-d2h-mapped" => self.d2h_mapped(&ctx, size)?,
            "cuda-transpose" => self.transpose(&ctx, size, false)?,
            "cuda-transpose-h2d" => self.transpose(&ctx, size, true)?,
            "cuda-scatter" => self.scatter(&ctx, size)?,
            "cuda-latency" => self.latency(&ctx, size, &self.engine, "")?,
            "cuda-latency-spin" => self.latency(&ctx, size, &self.spin, " spin")?,
            "cuda-latency-hybrid" => {
                let wait = WaitMode::SpinThenBlock(std::time::Duration::from_micros(50));
                let e = CudaEngine::with_config(CudaConfig::new(0).wait_mode(wait));
                self.latency(&ctx, size, &e.map_err(setup)?, " spin-then-block")?
            }
            "cuda-latency-parts" => self.latency_parts(&ctx, size)?,
            _ => {
                return Err(BenchError::UnknownTest {
                    name: test.name.into(),
                    valid: TESTS.iter().map(|t| t.name).collect::<Vec<_>>().join(", "),
                })
            }
        };
        let host_link =
            !matches!(test.name, "cuda-d2d" | "cuda-transpose") && test.kind == Kind::Bandwidth;
        if let (true, Some(limit), Some(f)) =
            (host_link, self.link_gbps, row.ferry().map(|s| s.median))
        {
            // Both directions at once: each direction has its own lanes.
            let limit = if test.name == "cuda-bidir" {
                2.0 * limit
            } else {
                limit
            };
            row.link_limit_fraction = Some(f / limit);
        }
        Ok(row)
    }

    /// The latch and events, where `events` asks for them and they work here.
    fn clock(&self, events: bool) -> Option<&StreamTimer> {
        self.timer.as_ref().filter(|_| events)
    }

    /// Times `call` (one batch per call): with CUDA events when `timer` is given (`call` then
    /// returns the events' seconds; one untimed call runs first, outside the latch), else with
    /// the host clock.
    fn time(
        &self,
        timer: Option<&StreamTimer>,
        mut call: impl FnMut(Option<&StreamTimer>) -> Result<Option<f64>, String>,
    ) -> Result<(Timing, Clock), String> {
        match timer {
            Some(t) => {
                // One untimed call outside the latch first: lazy set-up (kernel compiles,
                // table and staging allocations, peer access) may wait for the device.
                call(None)?;
                let tm = measure_with(&self.method, || {
                    call(Some(t))?.ok_or_else(|| "the batch was not timed by events".to_string())
                })?;
                Ok((tm, Clock::CudaEvents))
            }
            None => Ok((measure(&self.method, || call(None).map(drop))?, Clock::Host)),
        }
    }

    /// One batch of the raw copier's calls, behind the latch when `timer` is given.
    fn raw_batch(
        &self,
        timer: Option<&StreamTimer>,
        f: impl FnOnce(&RawCopier) -> Result<(), BaselineError>,
    ) -> Result<Option<f64>, String> {
        match timer {
            None => f(&self.raw).map(|()| None),
            Some(t) => self.raw.timed(t, f).map(Some),
        }
        .map_err(|e| e.to_string())
    }

    /// A series whose destination is one device buffer: poison it, time `op` (one batch per
    /// call, given the timer when events apply), compare the buffer with `want`.
    #[allow(clippy::too_many_arguments)]
    fn dev_series(
        &self,
        ctx: &Ctx,
        timer: Option<&StreamTimer>,
        name: &str,
        role: Role,
        payload: u64,
        dev: &mut DeviceBuffer,
        want: &[u8],
        mut op: impl FnMut(&mut DeviceBuffer, Option<&StreamTimer>) -> Result<Option<f64>, String>,
    ) -> Result<Series, BenchError> {
        ctx.series(name, role, payload, || {
            poison_devs(std::slice::from_mut(dev))?;
            let (t, c) = self.time(timer, |tm| op(dev, tm))?;
            Ok((t, dev.to_vec().is_ok_and(|v| v == want), c))
        })
    }

    /// A strided copy into `dev` as three series: ferry's copy of `src` from `src_l` into
    /// `dst_l` (its name ends in `names.0`), the raw driver's calls for the same plan (named
    /// `names.1`), and ferry's contiguous copy of the first `dev.len()` bytes of `src`. `want`:
    /// the strided result; `same`: those first bytes.
    #[allow(clippy::too_many_arguments)]
    fn strided_series<S: Memory + Sync + ?Sized>(
        &self,
        ctx: &Ctx,
        tm: Option<&StreamTimer>,
        dir: Direction,
        dev: &mut DeviceBuffer,
        src: &S,
        (dst_l, src_l): (&Layout, &Layout),
        (want, same): (&[u8], &[u8]),
        names: (&str, &str),
    ) -> Result<Vec<Series>, BenchError> {
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
        Ok(vec![f, r, c])
    }

    /// Host -> device: pinned or pageable source.
    fn h2d(&self, ctx: &Ctx, size: usize, pinned: bool) -> Result<Row, BenchError> {
        let batch = batch(size);
        let data = pattern_bytes(size);
        let mut devs = dev_bufs(batch, size, 0)?;
        let dir = Direction::HostToDevice;
        let (shape, series) = if pinned {
            let mut src = PinnedBuffer::new(size).map_err(setup)?;
            src.copy_from_slice(&data);
            (
                "pinned -> device",
                self.h2d_series(ctx, &mut devs, &src, &data, dir, true)?,
            )
        } else {
            // Pageable: ferry's staged path runs on CPU threads and the driver's pageable copy
            // may wait for the stream: host clock.
            (
                "pageable -> device",
                self.h2d_series(ctx, &mut devs, &data, &data, dir, false)?,
            )
        };
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            (size * batch) as u64,
            shape.into(),
            series,
        ))
    }

    /// `data.len()` bytes of `src` into each of `devs`: ferry (on `dir`'s stream) and the raw
    /// driver; CUDA events where `events`.
    fn h2d_series<S: Memory + ?Sized>(
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
        let f = ctx.series(&name, Role::Ferry, payload, || {
            poison_devs(devs)?;
            let (t, c) = self.time(timer, |tm| {
                ferry_batch(&self.spin, dir, tm, |s| {
                    devs.iter_mut()
                        .try_for_each(|d| s.copy(d, &l, src, &l).map(drop))
                })
            })?;
            Ok((t, devs_check(devs, data), c))
        })?;
        let r = ctx.series("raw driver", Role::Baseline, payload, || {
            poison_devs(devs)?;
            let (t, c) = self.time(timer, |tm| {
                self.raw_batch(tm, |raw| raw.copy_into_each(devs, src, size))
            })?;
            Ok((t, devs_check(devs, data), c))
        })?;
        Ok(vec![f, r])
    }

    /// Device -> host: pinned or pageable destination.
    fn d2h(&self, ctx: &Ctx, size: usize, pinned: bool) -> Result<Row, BenchError> {
        let batch = batch(size);
        let data = pattern_bytes(size);
        let src = DeviceBuffer::from_host(0, &data).map_err(setup)?;
        let payload = (size * batch) as u64;
        let l = Layout::bytes(size).map_err(setup)?;
        let timer = self.clock(pinned);
        let dir = Direction::DeviceToHost;
        let mut series = vec![];
        macro_rules! run_with {
            ($hosts:expr, $shape:expr) => {{
                let mut hosts = $hosts;
                for (name, role) in [
                    (format!("ferry {} spin", self.spin.name()), Role::Ferry),
                    ("raw driver".to_string(), Role::Baseline),
                ] {
                    series.push(ctx.series(&name, role, payload, || {
                        hosts.iter_mut().for_each(|h| h.fill(0xA5));
                        let (t, c) = if role == Role::Ferry {
                            self.time(timer, |tm| {
                                ferry_batch(&self.spin, dir, tm, |s| {
                                    hosts
                                        .iter_mut()
                                        .try_for_each(|h| s.copy(h, &l, &src, &l).map(drop))
                                })
                            })?
                        } else {
                            self.time(timer, |tm| {
                                self.raw_batch(tm, |raw| raw.copy_into_each(&mut hosts, &src, size))
                            })?
                        };
                        Ok((t, hosts.iter().all(|h| h[..] == data[..]), c))
                    })?);
                }
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
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            payload,
            shape.into(),
            series,
        ))
    }

    /// Device 0 -> device `to` (0: on one GPU; 1: a peer copy).
    fn d2d(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let batch = batch(size);
        let data = pattern_bytes(size);
        let src = DeviceBuffer::from_host(0, &data).map_err(setup)?;
        let mut devs = dev_bufs(batch, size, 0)?;
        let dir = Direction::DeviceToDevice;
        let series = self.h2d_series(ctx, &mut devs, &src, &data, dir, true)?;
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            (size * batch) as u64,
            "device -> device".to_string(),
            series,
        ))
    }

    /// Both directions at once, on two streams (ferry: its host-to-device and device-to-host
    /// streams; raw: the copier's two), both behind the latch.
    fn bidir(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
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
        let f = ctx.series(
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
        let r = ctx.series("raw driver (2 streams)", Role::Baseline, payload, || {
            down_dst.fill(0xA5);
            let (t, c) = self.time(timer, |tm| {
                self.raw_batch(tm, |raw| {
                    raw.bidir(&mut up_dst, &up_src, &mut down_dst, &down_src, size, 1)
                })
            })?;
            Ok((t, check(&up_dst, &down_dst), c))
        })?;
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            payload,
            "pinned <-> device, both at once".into(),
            vec![f, r],
        ))
    }

    /// A tile of 4 KiB rows out of a pinned matrix with 8 KiB rows, into a dense device buffer.
    fn tile(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
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
        let series = self.strided_series(
            ctx,
            self.clock(true),
            Direction::HostToDevice,
            &mut dev,
            &host,
            (&dst_l, &src_l),
            (&want, &host[..size]),
            ("2-D", "raw cuMemcpy2DAsync"),
        )?;
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            size as u64,
            format!("{rows} rows x 4 KiB, pitch 8 KiB"),
            series,
        ))
    }

    /// Mapped (zero-copy) host memory -> device, read by the SMs: ferry with
    /// `KernelCopies::Always`, a plain kernel launch, and the copy engine.
    fn h2d_mapped(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let batch = batch(size);
        let data = pattern_bytes(size);
        let mut src = MappedBuffer::new(size).map_err(setup)?;
        src.copy_from_slice(&data);
        let mut devs = dev_bufs(batch, size, 0)?;
        let payload = (size * batch) as u64;
        let l = Layout::bytes(size).map_err(setup)?;
        let (tm, dir) = (self.clock(true), Direction::HostToDevice);
        let mut series = vec![];
        let name = format!("ferry {} SM (KernelCopies::Always)", self.sm.name());
        series.push(ctx.series(&name, Role::Ferry, payload, || {
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
            series.push(ctx.series(name, Role::Baseline, payload, || {
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
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            payload,
            "mapped host -> device".into(),
            series,
        ))
    }

    /// Device -> mapped (zero-copy) host memory, written by the SMs.
    fn d2h_mapped(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
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
        let check = |hs: &[MappedBuffer]| hs.iter().all(|h| h[..] == data[..]);
        let mut series = vec![];
        let name = format!("ferry {} SM (KernelCopies::Always)", self.sm.name());
        series.push(ctx.series(&name, Role::Ferry, payload, || {
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
            series.push(ctx.series(name, Role::Baseline, payload, || {
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
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            payload,
            "device -> mapped host".into(),
            series,
        ))
    }

    /// Transpose of a square f32 matrix of about `size` bytes, into a device buffer, from a
    /// device buffer or (`from_host`) from pinned memory.
    fn transpose(&self, ctx: &Ctx, size: usize, from_host: bool) -> Result<Row, BenchError> {
        const ELEM: usize = 4;
        let side = ((size / ELEM) as f64).sqrt() as usize;
        if side < 2 {
            return Err(ctx.bad("below a 2 x 2 matrix of f32"));
        }
        let bytes = side * side * ELEM;
        let data = pattern_bytes(bytes);
        let m = Layout::contiguous(&[side, side], ELEM).map_err(setup)?;
        let src_l = m.transpose(0, 1).map_err(setup)?;
        // want[j][i] = data[i][j].
        let mut want = vec![0u8; bytes];
        for i in 0..side {
            for j in 0..side {
                let (d, s) = ((j * side + i) * ELEM, (i * side + j) * ELEM);
                want[d..d + ELEM].copy_from_slice(&data[s..s + ELEM]);
            }
        }
        let mut dev = DeviceBuffer::new(0, bytes).map_err(setup)?;
        // Host clock: the raw baseline is one driver call per plane (thousands), more than a
        // stream's queue holds while a latch keeps it from starting.
        let tm = self.clock(false);
        let names = ("(SM kernel: Auto)", "raw cuMemcpy2D/3DAsync");
        let (layouts, bytes_of) = ((&m, &src_l), (&want[..], &data[..]));
        let (series, shape) = if from_host {
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
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            bytes as u64,
            format!("{side} x {side} f32, {shape}"),
            series,
        ))
    }

    /// Many scattered segments of `seg` bytes (a permutation of slots) pinned -> device.
    fn scatter(&self, ctx: &Ctx, seg: usize) -> Result<Row, BenchError> {
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
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            seg as u64,
            payload,
            format!("{count} segments of {}", format_size(seg as u64)),
            vec![f, r],
        ))
    }

    /// Submit+wait of one copy through `engine` (its series named `ferry NAME{wait}`): host
    /// clock (the wait is what is measured).
    fn latency(
        &self,
        ctx: &Ctx,
        size: usize,
        engine: &CudaEngine,
        wait: &str,
    ) -> Result<Row, BenchError> {
        let mut src = PinnedBuffer::new(size).map_err(setup)?;
        let data = pattern_bytes(size);
        src.copy_from_slice(&data);
        let mut dev = DeviceBuffer::new(0, size).map_err(setup)?;
        let l = Layout::bytes(size).map_err(setup)?;
        let name = format!("ferry {}{wait}", engine.name());
        let n = size as u64;
        let f = self.dev_series(ctx, None, &name, Role::Ferry, n, &mut dev, &data, |d, _| {
            flat(engine.scope(|s| s.copy(d, &l, &src, &l)?.wait().map_err(ferry::Error::from)))
                .map(|()| None)
        })?;
        let raw = "cuMemcpyAsync + cuStreamSynchronize";
        let r = self.dev_series(
            ctx,
            None,
            raw,
            Role::Baseline,
            n,
            &mut dev,
            &data,
            |d, _| {
                self.raw
                    .copy(d, &src, size, 1)
                    .map_err(|e| e.to_string())
                    .map(|()| None)
            },
        )?;
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            size as u64,
            "pinned -> device".into(),
            vec![f, r],
        ))
    }
}

struct Ctx {
    test: &'static str,
    size: String,
    kind: Kind,
}

impl Ctx {
    fn bad(&self, why: &str) -> BenchError {
        BenchError::BadSize {
            test: self.test.into(),
            size: self.size.clone(),
            why: why.into(),
        }
    }
    /// Runs `body` (which poisons, times and reports whether the result verified, and how it
    /// was timed) as one series.
    fn series(
        &self,
        name: &str,
        role: Role,
        payload: u64,
        body: impl FnOnce() -> Result<(Timing, bool, Clock), String>,
    ) -> Result<Series, BenchError> {
        let (t, ok, clock) = body().map_err(|message| BenchError::Engine {
            test: self.test.into(),
            series: name.into(),
            size: self.size.clone(),
            message,
        })?;
        if !ok {
            return Err(BenchError::Verify {
                test: self.test.into(),
                series: name.into(),
                size: self.size.clone(),
                offset: 0,
            });
        }
        Ok(Series::new(name, role, self.kind, payload, t).clocked(clock))
    }
}

/// One batch of ferry copies, submitted by `submit` in a scope of `e` and waited; behind
/// `timer`'s latch on `e`'s stream for `dir` when given (then returns the events' seconds).
fn ferry_batch<'env, F, E>(
    e: &'env CudaEngine,
    dir: Direction,
    timer: Option<&StreamTimer>,
    submit: F,
) -> Result<Option<f64>, String>
where
    F: for<'s> FnOnce(&'s ferry::Scope<'s, 'env>) -> Result<(), E>,
    E: std::fmt::Display,
{
    ferry_batches(e, &[dir], timer, submit)
}

/// As [`ferry_batch`], with copies on the streams of several directions, all behind the latch.
fn ferry_batches<'env, F, E>(
    e: &'env CudaEngine,
    dirs: &[Direction],
    timer: Option<&StreamTimer>,
    submit: F,
) -> Result<Option<f64>, String>
where
    F: for<'s> FnOnce(&'s ferry::Scope<'s, 'env>) -> Result<(), E>,
    E: std::fmt::Display,
{
    match timer {
        None => flat(e.scope(submit)).map(|()| None),
        Some(t) => {
            let streams: Vec<_> = dirs.iter().map(|&d| &**e.stream(d)).collect();
            flat(e.scope(|s| t.time_all(&streams, || submit(s))))?.map_err(|e| e.to_string())?;
            t.seconds().map(Some).map_err(|e| e.to_string())
        }
    }
}

/// A scope's two layers of errors (the scope's barrier, the closure's own) as one message.
fn flat<T, E: std::fmt::Display, F: std::fmt::Display>(
    r: Result<Result<T, E>, F>,
) -> Result<T, String> {
    r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
}

fn batch(size: usize) -> usize {
    if size < 16 << 20 {
        8
    } else {
        1
    }
}

fn dev_bufs(n: usize, size: usize, ordinal: u32) -> Result<Vec<DeviceBuffer>, BenchError> {
    (0..n)
        .map(|_| DeviceBuffer::new(ordinal, size).map_err(setup))
        .collect()
}

fn poison_devs(devs: &mut [DeviceBuffer]) -> Result<(), String> {
    for d in devs {
        let n = d.len();
        d.copy_from_host(&vec![0xA5; n])
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn devs_check(devs: &[DeviceBuffer], data: &[u8]) -> bool {
    devs.iter().all(|d| d.to_vec().is_ok_and(|v| v == data))
}
