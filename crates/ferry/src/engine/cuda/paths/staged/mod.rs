//! Staged copies between pageable host memory and a device, through a ring of pinned buffers.
//!
//! The driver copies pageable memory slowly (about 9-15 GB/s on a PCIe 5.0 host) because it
//! stages through its own small pinned buffers with one CPU thread. A [`Stager`] keeps a ring of
//! large pinned staging buffers per direction and a pool of persistent CPU worker threads: while
//! the copy engine moves chunk `k` between the ring and the device, the workers copy chunk `k+1`
//! between pageable memory and the ring (host -> device), or drain chunk `k-1` (device -> host).
//! The workers take the chunks' parts in order from a shared counter, with no barrier between
//! chunks, and the calling thread issues each chunk's DMA the moment its last part is in: on the
//! H200 host this moved 256 MiB host -> device at 45.8 GB/s against 43.9 for the earlier design
//! (every worker on one chunk, then a barrier), 45.6 against 36.7 with non-temporal stores, in
//! one run (run 17 in `bench/results/h200.md`, "The staging pipeline, gather strategies and
//! wait modes").
//!
//! A [`Stager`] is made once per device and reused by many copies. Each direction has its own
//! ring, allocated on first use, but both share one pool of workers, which runs one copy at a
//! time: a host -> device and a device -> host copy take turns at the workers (only the last
//! DMAs of one, waited for after it leaves the pool, overlap the start of the other), and two
//! copies in the same direction take turns at their ring as well. Running both directions at
//! once would need workers for each (a pool per direction: up to twice the threads, competing
//! for the cores and for host memory bandwidth, which already bounds one direction's copy);
//! that is not measured, so not done.
//!
//! Failures fail cleanly: a copy returns (with its error, or with a panic of the mechanism,
//! which goes on unwinding) only after every DMA it issued has ended, whatever failed, and the
//! stager stays usable for the next copy.
//!
//! Plans with a strided host side are gathered into (or scattered out of) the ring run by run;
//! a pitched device side is written from the ring with `cuMemcpy2DAsync`.
//!
//! The parts, one file each: this file holds the API ([`Stager`], [`Direction`],
//! [`StagedError`]); `config.rs` the tuning ([`StagingConfig`], `FERRY_STAGING_*`); `chunk.rs`
//! which bytes each chunk carries; `ring.rs` the pinned slots and their events; `pool.rs` the
//! worker threads; `nt_copy.rs` the workers' (non-temporal) copy and its pieces; `fill.rs` workers of
//! their own filling the GPU pipeline's pinned bounce buffers with that copy, from a queue of
//! pieces; `pipeline.rs` the loop that
//! drives the workers, the ring and the DMAs; `segments.rs` segment lists
//! ([`Stager::copy_segments`]: many runs of pageable memory packed into the ring's chunks).
//!
//! ```no_run
//! use ferry::engine::cuda::staged::{Direction, Stager, StagingConfig};
//! use ferry::Plan;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! if !ferry::engine::cuda::staged::driver_present() {
//!     return Ok(()); // no CUDA driver on this machine
//! }
//! let ctx = cudarc::driver::CudaContext::new(0)?;
//! let stream = ctx.new_stream()?;
//! let stager = Stager::new(ctx.clone(), StagingConfig::new().threads(8))?;
//! let host = vec![7u8; 1 << 20];
//! let dev = unsafe { cudarc::driver::result::malloc_sync(host.len())? };
//! // SAFETY: `dev` holds `host.len()` bytes, `host` is live for the call, nothing else uses them.
//! unsafe {
//!     stager.copy(&stream, Direction::HostToDevice, dev, host.as_ptr() as u64, &Plan::contiguous(0, 0, host.len()))?;
//! }
//! # Ok(()) }
//! ```

mod chunk;
mod fill;
mod nt_copy;
mod pipeline;
mod pool;
mod ring;
mod segments;

pub use crate::engine::cuda::config::StagingConfig;
pub(crate) use fill::{Filler, FILL_PIECE};

use crate::engine::cuda::paths::gather::{GatherError, Gatherer, Segment};
pub use crate::engine::cuda::route::StagedDirection as Direction;
pub use crate::engine::cuda::sys::error::driver_present;
use crate::engine::cuda::sys::error::DriverError as FerryDriverError;
use crate::engine::cuda::sys::memory::PinFlags;
use crate::engine::cuda::CudaError;
use crate::Plan;
use chunk::{add, Chunker, Sides};
use cudarc::driver::result::DriverError;
use cudarc::driver::{CudaContext, CudaStream};
use pipeline::{Staging, SyncPtr};
use pool::Pool;
use ring::Ring;
use segments::{Packing, SegStaging};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// Why a staged copy (or making a [`Stager`]) failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StagedError {
    /// A configuration value is out of range.
    #[error("bad staging config: {0}")]
    BadConfig(String),
    /// A CUDA driver call failed; `op` names it, `source` keeps the driver's error.
    #[error("{op} failed: {source}")]
    Driver {
        /// The driver call.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// An address computation overflowed (a plan too large for the given base addresses).
    #[error("address overflow: base {base:#x} + {bytes} bytes")]
    AddressOverflow {
        /// Base address.
        base: u64,
        /// Byte offset past it.
        bytes: usize,
    },
    /// A worker thread panicked while copying (a bug; the copy's bytes are unspecified).
    #[error("a staging worker thread panicked")]
    WorkerPanicked,
    /// The worker threads could not be started.
    #[error("could not start staging worker threads: {0}")]
    Spawn(#[source] std::io::Error),
    /// A staged segment list: a segment out of its buffer (checked before anything runs), or
    /// the device-side scatter (gather) of a chunk failed.
    #[error("staged segment list: {0}")]
    Segments(#[from] crate::engine::cuda::paths::gather::GatherError),
}

fn drv(op: &'static str) -> impl FnOnce(DriverError) -> StagedError {
    move |source| StagedError::Driver { op, source }
}

/// A failed call of the backend's shared driver helpers, as a staging error.
fn driver_error(e: FerryDriverError) -> StagedError {
    StagedError::Driver {
        op: e.call,
        source: DriverError(e.code),
    }
}

/// Persistent staging machinery for one device: two pinned rings (allocated on first use in each
/// direction) and a pool of CPU worker threads. See the [module documentation](self).
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

/// Workers for a staged copy of `bytes`: one per 2 MiB, at least 4, at most the pool's. On the
/// H200 host (run 27, `ferry bench --test cuda-h2d-pageable`, staged / the driver's pageable
/// path) 12 workers gave 0.97x / 0.56x / 0.81x / 1.36x at 2 / 4 / 8 / 16 MiB, 4 workers 1.18x /
/// 1.18x / 1.34x / 1.46x; 256 MiB needs all 12 for its 45+ GB/s (4 workers: 30 GB/s, run 29).
/// With this choice and the pool waking workers 0..n (run 29): host to device 0.93-1.12x at
/// 2 MiB, 1.09-1.15x at 4-8 MiB, 48.8 GB/s at 256 MiB; device to host 1.5x at 1 MiB, 51 GB/s
/// at 256 MiB.
fn workers_for(pool: usize, bytes: usize) -> usize {
    (bytes / (2 << 20)).max(4).min(pool.max(1))
}

impl Stager {
    /// Makes a stager for `ctx`'s device and starts its worker threads. Pinned rings are
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
    pub fn config(&self) -> &StagingConfig {
        &self.cfg
    }

    /// The context this stager belongs to.
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
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
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
        self.with_ring(dir, stream, |ring| self.flow(ring, &job, dir))
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
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let (dev, dev_len, host) = match dir {
            Direction::HostToDevice => (dst, dst_len, src),
            Direction::DeviceToHost => (src, src_len, dst),
        };
        // The device scratch is made where some chunk may scatter on the device: the whole
        // list's runs would (each chunk decides for itself as it goes).
        let runs = segments::count_runs(segs, segments::dev_off(dir));
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
            self.flow(ring, &job, dir)
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

impl From<crate::engine::cuda::paths::staged::StagedError> for CudaError {
    fn from(e: crate::engine::cuda::paths::staged::StagedError) -> Self {
        use crate::engine::cuda::paths::staged::StagedError as S;
        match e {
            S::Driver { op, source } => {
                CudaError::Driver(crate::engine::cuda::DriverError::from_cudarc(op, source))
            }
            S::Spawn(io) => CudaError::Thread(io.to_string()),
            e @ S::WorkerPanicked => CudaError::Thread(e.to_string()),
            S::Segments(g) => CudaError::from(g),
            e @ (S::BadConfig(_) | S::AddressOverflow { .. }) => {
                CudaError::InvalidArgument(e.to_string())
            }
        }
    }
}

impl From<crate::engine::cuda::paths::staged::StagedError> for crate::RequestError {
    /// A staged copy's failure: the driver's error as it is, a worker's panic as a panic.
    fn from(e: crate::engine::cuda::paths::staged::StagedError) -> Self {
        match e {
            e @ crate::engine::cuda::paths::staged::StagedError::WorkerPanicked => {
                crate::RequestError::Panicked {
                    op: "staged copy".into(),
                    msg: e.to_string(),
                }
            }
            e => CudaError::from(e).into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{check_segments, segs_bytes, workers_for, GatherError, Segment, StagedError};

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
