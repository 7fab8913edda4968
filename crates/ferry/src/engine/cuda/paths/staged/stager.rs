//! The staging machinery of one device ([`Stager`]): its configuration, the two pinned rings,
//! its hand on the host copy workers, and the checks a copy passes before its bytes move.

use super::chunk::{add, Chunker, Sides};
use super::error::{drv, StagedError};
use super::pipeline::{Flow, Staging, SyncPtr};
use super::ring::Ring;
use super::segments::{Packing, SegStaging};
use crate::engine::cuda::config::StagingConfig;
use crate::engine::cuda::paths::gather::{GatherError, Gatherer, Segment};
use crate::engine::cuda::route::StagedDirection as Direction;
use crate::engine::cuda::sys::driver;
use crate::engine::cuda::sys::memory::PinFlags;
use crate::staging::Pool;
use crate::Plan;
use cudarc::driver::{CudaContext, CudaStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// Persistent staging machinery for one device: two pinned rings (allocated on first use in each
/// direction) and up to `threads` of the process's host copy workers. See the
/// [module documentation](super).
pub struct Stager {
    ctx: Arc<CudaContext>,
    cfg: StagingConfig,
    pool: Pool,
    h2d: Mutex<Option<Ring>>,
    d2h: Mutex<Option<Ring>>,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("device", &self.ctx.ordinal())
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl Stager {
    /// The coordinator of one copy over this stager's workers and settings.
    fn flow(&self) -> Flow<'_> {
        Flow {
            pool: &self.pool,
            cfg: &self.cfg,
        }
    }

    /// Makes a stager for `ctx`'s device and starts the host copy workers it may use where
    /// fewer run (at most the cores, shared with every other stager and pipeline). Pinned rings are
    /// allocated on the first copy in each direction (`ring_depth x chunk_bytes` each).
    ///
    /// Errors: [`StagedError::BadConfig`] (chunk < 4096, ring < 2, threads 0 or > 256),
    /// [`StagedError::Spawn`].
    pub fn new(ctx: Arc<CudaContext>, cfg: StagingConfig) -> Result<Stager, StagedError> {
        if cfg.chunk_bytes < 4096 {
            return Err(StagedError::BadConfig(format!(
                "chunk_bytes {} is under 4096",
                cfg.chunk_bytes
            )));
        }
        if cfg.ring_depth < 2 {
            return Err(StagedError::BadConfig(format!(
                "ring_depth {} is under 2",
                cfg.ring_depth
            )));
        }
        if cfg.threads == 0 || cfg.threads > 256 {
            return Err(StagedError::BadConfig(format!(
                "threads {} is not in 1..=256",
                cfg.threads
            )));
        }
        let pool = Pool::new(cfg.threads)?;
        Ok(Stager {
            ctx,
            cfg,
            pool,
            h2d: Mutex::new(None),
            d2h: Mutex::new(None),
        })
    }

    /// The configuration this stager runs with.
    #[cfg(feature = "bench")]
    pub fn config(&self) -> &StagingConfig {
        &self.cfg
    }

    /// The context this stager belongs to.
    #[cfg(feature = "bench")]
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Copies the runs of `plan` from `src` to `dst` through the pinned ring, and returns when
    /// every byte has arrived (it blocks; call it from a background thread). `dst` and `src` are
    /// base addresses to which the plan's offsets are added: for
    /// [`Direction::HostToDevice`] `dst` is a device pointer (`CUdeviceptr`) and `src` a host
    /// pointer; for [`Direction::DeviceToHost`] the reverse. Host memory may be pageable.
    ///
    /// On error the copy stops, every DMA already issued is waited for (an event per chunk; the
    /// whole stream where a chunk's calls failed part-way or its event could not be recorded or
    /// waited for), and the destination's bytes are unspecified. A panic of the mechanism (a
    /// bug) leaves this call after the same wait; the stager stays usable.
    ///
    /// # Safety
    /// 1. Every byte the plan reads (`src + plan.src_offset() .. src + plan.src_end()`, at the
    ///    plan's runs) is valid, initialized memory of the right kind, not written by anyone
    ///    during the call.
    /// 2. Every byte the plan writes is valid memory of the right kind that nothing else reads
    ///    or writes during the call.
    /// 3. Device memory belongs to (or is accessible from) this stager's context, and `stream`
    ///    belongs to this stager's context.
    /// 4. Source and destination bytes do not overlap.
    pub unsafe fn copy(
        &self,
        stream: &Arc<CudaStream>,
        dir: Direction,
        dst: u64,
        src: u64,
        plan: &Plan,
    ) -> Result<(), StagedError> {
        let chunker = Chunker::new(plan, self.chunk_for(plan.total_bytes()));
        let n = chunker.count();
        if n == 0 {
            return Ok(());
        }
        // Bounds of the address arithmetic, checked once.
        add(dst, plan.dst_end())?;
        add(src, plan.src_end())?;
        driver::set_current(&self.ctx).map_err(drv("cuCtxSetCurrent"))?;
        let sides = Sides { plan, dir };
        let (dev_base, host_base) = match dir {
            Direction::HostToDevice => (dst, src),
            Direction::DeviceToHost => (src, dst),
        };
        let job = Staging {
            sides,
            chunker: &chunker,
            dev: dev_base,
            host: SyncPtr(host_base as *mut u8),
            stream,
        };
        self.with_ring(dir, stream, |ring| self.flow().run(ring, &job, dir))
    }

    /// Copies every segment of `segs` (`len` bytes from `src + src_off` to `dst + dst_off`)
    /// through the pinned ring, and returns when every byte has arrived (it blocks; call it from
    /// a background thread). For [`Direction::HostToDevice`] `dst` is a device pointer and
    /// `src` a host pointer (pageable or not), for [`Direction::DeviceToHost`] the reverse;
    /// `dst_len` / `src_len` are the buffers' lengths, which bound the segments. The workers
    /// gather the host runs into ring-sized chunks (or scatter them out of the chunks) in
    /// parallel, and each chunk moves in one DMA; a chunk with many short runs on the device
    /// side goes through device scratch, and `gatherer` (where given) scatters (gathers) them
    /// on the device; without one, each device run is its own DMA. See `segments.rs`.
    ///
    /// Errors: [`StagedError::Segments`] (a segment out of bounds, checked before anything
    /// runs, or a device-side scatter failed), driver errors. On error every DMA already issued
    /// is waited for and the destination's bytes are unspecified.
    ///
    /// # Safety
    /// 1. `src .. src + src_len` is valid, initialized memory of the right kind, not written by
    ///    anyone during the call; `dst .. dst + dst_len` valid memory of the right kind that
    ///    nothing else reads or writes during the call.
    /// 2. Device memory belongs to (or is accessible from) this stager's context, as do
    ///    `stream` and `gatherer`.
    /// 3. Destination segments do not overlap each other (else either value lands in the
    ///    shared bytes); source and destination bytes do not overlap.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn copy_segments(
        &self,
        stream: &Arc<CudaStream>,
        dir: Direction,
        (dst, dst_len): (u64, usize),
        (src, src_len): (u64, usize),
        segs: &[Segment],
        gatherer: Option<&Gatherer>,
    ) -> Result<(), StagedError> {
        check_segments(segs, dst_len, src_len)?;
        add(dst, dst_len)?;
        add(src, src_len)?;
        let pack = Packing::new(segs, self.chunk_for(segs_bytes(segs)));
        let n = pack.count();
        if n == 0 {
            return Ok(());
        }
        driver::set_current(&self.ctx).map_err(drv("cuCtxSetCurrent"))?;
        let (dev, dev_len, host) = match dir {
            Direction::HostToDevice => (dst, dst_len, src),
            Direction::DeviceToHost => (src, src_len, dst),
        };
        // The device scratch is made where some chunk may scatter on the device: the whole
        // list's runs would (each chunk decides for itself as it goes).
        let runs = super::segments::count_runs(segs, super::segments::dev_off(dir));
        let scatters = crate::engine::cuda::route::staged_scatters(runs, pack.total());
        let scratch_len = self.cfg.chunk_bytes;
        self.with_ring(dir, stream, |ring| {
            let scratch = match (scatters, gatherer) {
                (true, Some(_)) => ring.scratch(scratch_len)?,
                _ => Vec::new(),
            };
            let job = SegStaging {
                segs,
                pack: &pack,
                dir,
                dev,
                dev_len,
                host: SyncPtr(host as *mut u8),
                stream,
                scatter: gatherer.map(|g| (g, &scratch[..])),
                scratch_len,
            };
            self.flow().run(ring, &job, dir)
        })
    }

    /// The chunk size of a copy of `bytes`: copies of a few chunks or less pipeline over
    /// smaller pieces (at least 1 MiB, so the per-chunk overhead stays small), else the first
    /// chunk's host copy is not overlapped.
    fn chunk_for(&self, bytes: usize) -> usize {
        self.cfg.chunk_bytes.min((bytes / 4).max(1 << 20))
    }

    /// Runs `f` on the direction's ring (made on first use), then waits for every DMA it
    /// issued on `stream`, also when `f` failed or panicked (the panic goes on after the
    /// wait), so that no DMA outlives the copy and the next copy finds every slot free.
    fn with_ring(
        &self,
        dir: Direction,
        stream: &CudaStream,
        f: impl FnOnce(&mut Ring) -> Result<(), StagedError>,
    ) -> Result<(), StagedError> {
        // Each direction has its own ring, made on first use; the device -> host ring is never
        // write-combined (the CPU reads it).
        let (ring, flags) = match dir {
            Direction::HostToDevice => (
                &self.h2d,
                PinFlags {
                    write_combined: self.cfg.write_combined,
                    ..PinFlags::PORTABLE
                },
            ),
            Direction::DeviceToHost => (&self.d2h, PinFlags::PORTABLE),
        };
        let mut guard = ring.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            *guard = Some(Ring::new(&self.ctx, &self.cfg, flags)?);
        }
        let ring = guard.as_mut().expect("ring was just made");
        ring.ready()?;
        let r = catch_unwind(AssertUnwindSafe(|| f(&mut *ring)));
        let d = ring.drain(stream);
        match r {
            Ok(r) => r.and(d),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Bytes of a segment list (saturating; the list was checked against its buffers).
fn segs_bytes(segs: &[Segment]) -> usize {
    segs.iter()
        .fold(0u64, |a, s| a.saturating_add(s.len))
        .try_into()
        .unwrap_or(usize::MAX)
}

/// Every segment inside both buffers, or [`GatherError::OutOfBounds`] naming the first that is
/// not.
fn check_segments(segs: &[Segment], dst_len: usize, src_len: usize) -> Result<(), StagedError> {
    let fits =
        |off: u64, len: u64, cap: usize| off.checked_add(len).is_some_and(|e| e <= cap as u64);
    match segs
        .iter()
        .position(|s| !fits(s.dst_off, s.len, dst_len) || !fits(s.src_off, s.len, src_len))
    {
        Some(index) => Err(GatherError::OutOfBounds {
            index,
            seg: segs[index],
            dst_len,
            src_len,
        }
        .into()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_segments, segs_bytes, GatherError, Segment, StagedError};
    use crate::staging::policy::workers_for;

    #[test]
    fn segment_lists_are_checked_against_both_buffers() {
        let ok = [Segment::new(0, 10, 5), Segment::new(5, 0, 5)];
        assert!(check_segments(&ok, 10, 15).is_ok());
        assert_eq!(segs_bytes(&ok), 10);
        for (bad, index) in [
            ([Segment::new(0, 0, 1), Segment::new(6, 0, 5)], 1), // destination past 10
            ([Segment::new(0, 11, 5), Segment::new(0, 0, 1)], 0), // source past 15
            ([Segment::new(u64::MAX, 0, 2), Segment::new(0, 0, 1)], 0), // overflow
        ] {
            match check_segments(&bad, 10, 15) {
                Err(StagedError::Segments(GatherError::OutOfBounds { index: i, .. })) => {
                    assert_eq!(i, index)
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn workers_scale_with_the_copy() {
        assert_eq!(workers_for(12, 1 << 20), 4);
        assert_eq!(workers_for(12, 8 << 20), 4);
        assert_eq!(workers_for(12, 16 << 20), 8);
        assert_eq!(workers_for(12, 256 << 20), 12);
        assert_eq!(workers_for(2, 256 << 20), 2);
        assert_eq!(workers_for(1, 1 << 20), 1);
        assert_eq!(workers_for(0, 1 << 20), 1);
    }
}
