//! Copies of many small segments (gather/scatter) between device memory and pinned or mapped
//! host memory, or within device memory.
//!
//! One driver call per segment costs about 2.6 us, so 100,000 scattered 4 KiB pieces move at
//! about 1.6 GB/s that way; the driver's batched copy does little better. A [`Gatherer`] instead
//! runs a small gather kernel (compiled once per context with NVRTC for the device's compute
//! capability) that reads and writes both sides through their device-accessible addresses,
//! 16 bytes per load where the two sides are equally aligned. The segment table is uploaded once
//! per call through a pinned buffer and an async copy on the caller's stream, one of the
//! gatherer's tables, taken once the call that last used it has ended (a new one while fewer
//! than 64 exist; beyond, [`Strategy::Auto`]'s kernel gives way to the copy engines rather than
//! wait for another stream's work); the engine's block copies write it there straight from
//! their checked mapping (`Gatherer::copy_checked`: no segment list built first).
//!
//! [`Strategy`] picks the mechanism: the kernel, the driver's batch copy
//! (`cuMemcpyBatchAsync`, in batches that fall back one by one to a call per segment where the
//! driver refuses them: `paths/batch.rs`), one `cuMemcpyAsync` per segment, [`Strategy::Auto`],
//! which picks by segment count and size (thresholds measured on an H200, see
//! [`Strategy::Auto`]), or [`Strategy::Dma`], which leaves the SMs to the caller's kernels. A
//! gatherer made with [`Gatherer::leave_sms`] takes [`Strategy::Auto`] as [`Strategy::Dma`].
//!
//! ```no_run
//! use ferry::engine::cuda::gather::{Gatherer, Segment, Strategy};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! if !ferry::engine::cuda::staged::driver_present() {
//!     return Ok(());
//! }
//! let ctx = cudarc::driver::CudaContext::new(0)?;
//! let stream = ctx.new_stream()?;
//! let g = Gatherer::new(ctx.clone())?;
//! let (dst, src) = unsafe { (cudarc::driver::result::malloc_sync(1 << 20)?, cudarc::driver::result::malloc_sync(1 << 20)?) };
//! let segs: Vec<Segment> = (0..256).map(|i| Segment::new(i * 4096, (255 - i) * 4096, 4096)).collect();
//! // SAFETY: both buffers hold 1 MiB of device memory of this context, unused by anyone else.
//! let used = unsafe { g.copy(&stream, dst, 1 << 20, src, 1 << 20, &segs, Strategy::Auto)? };
//! stream.synchronize()?;
//! println!("copied with {used:?}");
//! # Ok(()) }
//! ```

use crate::engine::cuda::completion::mark::BatchCopy;
use crate::engine::cuda::sys::driver;
use crate::engine::cuda::sys::memory::{HostAlloc, PinFlags};
use crate::engine::cuda::sys::program::{self, Made};
use crate::memory::MemKind;
use crate::op::BlockList;
use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// One segment of a gather/scatter: `len` bytes from `src + src_off` to `dst + dst_off` (the
/// core's segment type, `#[repr(C)]` as the kernel reads it).
pub use crate::op::Segment;

pub use crate::engine::cuda::route::Strategy;
use crate::engine::cuda::route::{self, Sides};
use crate::engine::cuda::CudaError;

#[cfg(feature = "bench")]
pub use crate::engine::cuda::route::{AUTO_FEW_SEGMENTS, AUTO_LARGE_SEGMENT};

/// Why a gather/scatter failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GatherError {
    /// A segment reaches past its buffer.
    #[error("segment {index} ({seg:?}) is out of bounds: destination holds {dst_len} bytes, source {src_len}")]
    OutOfBounds {
        /// Index in the segment list.
        index: usize,
        /// The segment.
        seg: Segment,
        /// Destination buffer length.
        dst_len: usize,
        /// Source buffer length.
        src_len: usize,
    },
    /// The kernel was asked for but a buffer is not device-accessible (pageable host memory).
    #[error("the {side} buffer at {addr:#x} is not device-accessible (pageable host memory?); use Strategy::PerSegment or pin it")]
    NotDeviceAccessible {
        /// `"source"` or `"destination"`.
        side: &'static str,
        /// Its address.
        addr: u64,
    },
    /// The kernels could not be made (no NVRTC, a compile or module-load failure).
    #[error(transparent)]
    Kernel(#[from] crate::engine::cuda::KernelError),
    /// The batched copy was asked for but is unusable here.
    #[error("cuMemcpyBatchAsync is unavailable: {0}")]
    BatchUnavailable(&'static str),
    /// A CUDA driver call failed; `op` names it, `source` keeps the driver's error.
    #[error("{op} failed: {source}")]
    Driver {
        /// The driver call.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// The driver's batched copy failed.
    #[error("cuMemcpyBatchAsync failed: {0}")]
    Batch(#[source] DriverError),
}

fn drv(op: &'static str) -> impl FnOnce(DriverError) -> GatherError {
    move |source| GatherError::Driver { op, source }
}

const KERNEL_SRC: &str = concat!(
    crate::engine::cuda::sys::program::kernel_prelude!(),
    r#"
extern "C" __global__ void ferry_gather(unsigned char* dst, const unsigned char* src, const u64* table, u64 n, unsigned g) {
    unsigned lane = threadIdx.x % g;
    u64 group = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / g;
    u64 groups = ((u64)gridDim.x * blockDim.x) / g;
    for (u64 k = group; k < n; k += groups) {
        u64 doff = table[3 * k], soff = table[3 * k + 1], len = table[3 * k + 2];
        unsigned char* d = dst + doff;
        const unsigned char* s = src + soff;
        copy_any(d, s, len, lane, g);
    }
}
"#
);

const BLOCK: u32 = 256;

/// A list the gatherer copies: segments as given, or a checked block mapping or a queue's held
/// copies, whose segments are written where they are needed (the kernel's pinned table)
/// rather than built first.
#[derive(Clone, Copy)]
pub(crate) enum List<'a> {
    /// A segment list.
    Segments(&'a [Segment]),
    /// A block mapping ([`crate::op::check_blocks`]), its list not built.
    Blocks(BlockList<'a>),
    /// A queue's held copies, at unified addresses: each is the segment from `src` to `dst`
    /// (the bases, at or below every copy's source and destination).
    Copies {
        copies: &'a [BatchCopy],
        dst: u64,
        src: u64,
    },
}

impl List<'_> {
    fn len(&self) -> usize {
        match self {
            List::Segments(s) => s.len(),
            List::Blocks(b) => b.runs,
            List::Copies { copies, .. } => copies.len(),
        }
    }

    /// The bytes the list copies.
    fn bytes(&self) -> u64 {
        match self {
            List::Segments(s) => s.iter().map(|s| s.len).sum(),
            List::Blocks(b) => b.bytes() as u64,
            List::Copies { copies, .. } => copies.iter().map(|c| c.len as u64).sum(),
        }
    }

    /// The segments as a slice (a block mapping's or held copies' built: the batched and
    /// per-segment copies read them from host memory anyway).
    fn segments(&self) -> std::borrow::Cow<'_, [Segment]> {
        match self {
            List::Segments(s) => std::borrow::Cow::Borrowed(s),
            List::Blocks(b) => std::borrow::Cow::Owned(b.segments().collect()),
            List::Copies { .. } => std::borrow::Cow::Owned(self.copy_segments().collect()),
        }
    }

    /// The held copies' segments (none for the other lists).
    fn copy_segments(&self) -> impl Iterator<Item = Segment> + '_ {
        let (copies, dst, src): (&[BatchCopy], u64, u64) = match *self {
            List::Copies { copies, dst, src } => (copies, dst, src),
            _ => (&[], 0, 0),
        };
        copies
            .iter()
            .map(move |c| Segment::new(c.dst - dst, c.src - src, c.len as u64))
    }

    /// Writes the segments into `out` (`len()` of them).
    fn fill(&self, out: &mut [Segment]) {
        let zip = |out: &mut [Segment], segs: &mut dyn Iterator<Item = Segment>| {
            for (slot, seg) in out.iter_mut().zip(segs) {
                *slot = seg;
            }
        };
        match self {
            List::Segments(s) => out.copy_from_slice(s),
            List::Blocks(b) => zip(out, &mut b.segments()),
            List::Copies { .. } => zip(out, &mut self.copy_segments()),
        }
    }
}

/// One call's segment table: a pinned staging copy and its device copy, reused by later calls
/// once the upload and the kernel that read it have ended ([`Tables`]).
struct Table {
    /// The pinned staging copy (its length is the capacity), made on first use.
    host: Option<HostAlloc>,
    dev: u64,
    dev_cap: usize,
    uploaded: CudaEvent,
    upload_pending: bool,
    used: CudaEvent,
    use_pending: bool,
}

// SAFETY: the raw buffers are owned by the table and only touched by the call that took it
// (`Gatherer::take_table`) or under the gatherer's lock.
unsafe impl Send for Table {}

impl Table {
    /// An empty table (its memory made by its first call).
    fn new(ctx: &Arc<CudaContext>) -> Result<Table, GatherError> {
        let ev = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(drv("cuEventCreate"))
        };
        Ok(Table {
            host: None,
            dev: 0,
            dev_cap: 0,
            uploaded: ev()?,
            upload_pending: false,
            used: ev()?,
            use_pending: false,
        })
    }

    /// Its pinned and device memory for `bytes` of segments (the table is idle), made or grown
    /// here the first time a list needs more.
    fn memory(
        &mut self,
        ctx: &Arc<CudaContext>,
        bytes: usize,
    ) -> Result<(*mut u8, u64), GatherError> {
        if self.host.as_ref().is_none_or(|h| h.len() < bytes) {
            let cap = bytes.next_power_of_two().max(TABLE_BYTES);
            // No upload reads the old one any more (the table is idle).
            self.host = None;
            let host =
                HostAlloc::new(ctx, cap, PinFlags::PORTABLE).map_err(|e| GatherError::Driver {
                    op: e.call,
                    source: DriverError(e.code),
                })?;
            self.host = Some(host);
        }
        if self.dev_cap < bytes {
            let cap = bytes.next_power_of_two().max(TABLE_BYTES);
            if self.dev != 0 {
                // SAFETY: no kernel reads it any more (the table is idle).
                unsafe { cu::free_sync(self.dev) }.map_err(drv("cuMemFree"))?;
                count_alloc!(Device, -1);
                self.dev = 0;
                self.dev_cap = 0;
            }
            // SAFETY: a plain allocation, owned by the table.
            self.dev = unsafe { cu::malloc_sync(cap) }.map_err(drv("cuMemAlloc"))?;
            count_alloc!(Device, 1);
            self.dev_cap = cap;
        }
        let host = self.host.as_ref().expect("made above").ptr();
        Ok((host, self.dev))
    }

    /// Whether its last upload and kernel have ended (asked of the driver, no wait); clears
    /// what has. A query that fails counts as not ended (the wait reports it).
    fn idle(&mut self) -> bool {
        for (pending, event) in [
            (&mut self.upload_pending, &self.uploaded),
            (&mut self.use_pending, &self.used),
        ] {
            if *pending && event.try_is_complete() == Ok(true) {
                *pending = false;
            }
        }
        !self.upload_pending && !self.use_pending
    }

    /// Waits until its last upload and kernel have ended.
    fn wait(&mut self) -> Result<(), GatherError> {
        if self.upload_pending {
            driver::sync_event(&self.uploaded).map_err(drv("cuEventSynchronize"))?;
            self.upload_pending = false;
        }
        if self.use_pending {
            driver::sync_event(&self.used).map_err(drv("cuEventSynchronize"))?;
            self.use_pending = false;
        }
        Ok(())
    }

    fn free(&mut self) {
        if self.upload_pending {
            let _ = driver::sync_event(&self.uploaded);
        }
        if self.use_pending {
            let _ = driver::sync_event(&self.used);
        }
        // No copy reads it any more (synchronized above).
        self.host = None;
        if self.dev != 0 {
            // SAFETY: allocated by `cuMemAlloc`, no kernel reads it any more (synchronized).
            if unsafe { cu::free_sync(self.dev) }.is_ok() {
                count_alloc!(Device, -1);
            }
            self.dev = 0;
        }
    }
}

/// How many segment tables a gatherer makes before none is free: a call takes a table whose last
/// upload and kernel have ended, else makes one while fewer than this many exist (each at least
/// 64 KiB pinned and 64 KiB of device memory, kept for the gatherer's life); beyond, a kernel
/// the strategy picked gives way to the copy engines, and one asked for by name waits for the
/// table used longest ago. With one table, a call waited on the host for the previous call's
/// upload (on any stream, behind whatever that stream had queued) and made its stream wait for
/// the previous kernel: a block copy enqueued behind a long kernel blocked its caller until
/// that kernel ended, and lanes' copies serialized on one another's streams.
const TABLES: usize = 64;

/// Bytes a table's memory starts at (4,096 segments), each side.
const TABLE_BYTES: usize = 64 << 10;

/// How many of the free tables, the one used longest ago first, a call asks whether they are
/// idle before it makes one ([`Gatherer::take_table`]).
const IDLE_LOOKS: usize = 4;

/// A gatherer's segment tables not in a call now, the one used longest ago first, and how many
/// exist.
#[derive(Default)]
struct Tables {
    free: Vec<Table>,
    made: usize,
}

/// A table taken for one call, given back when dropped (whatever the call's outcome).
struct Taken<'a> {
    tables: &'a Mutex<Tables>,
    table: Option<Table>,
}

impl std::ops::Deref for Taken<'_> {
    type Target = Table;
    fn deref(&self) -> &Table {
        self.table
            .as_ref()
            .expect("a taken table is held until dropped")
    }
}

impl std::ops::DerefMut for Taken<'_> {
    fn deref_mut(&mut self) -> &mut Table {
        self.table
            .as_mut()
            .expect("a taken table is held until dropped")
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.table.take() {
            let mut ts = self.tables.lock().unwrap_or_else(|e| e.into_inner());
            ts.free.push(t);
        }
    }
}

/// One band's measurements at one size ([`route::band_slot`]): the rates of each mechanism
/// timed there, the timed calls not yet read, and the choice once made.
#[derive(Default)]
struct BandTimes {
    /// Bytes per second of the kernel's timed calls.
    kernel: Vec<f64>,
    /// Bytes per second of the batched copy's.
    batch: Vec<f64>,
    pending: Vec<Timed>,
    chosen: Option<Strategy>,
}

/// One timed call of a band: its mechanism, its bytes, and the events around it on its
/// stream.
struct Timed {
    strategy: Strategy,
    bytes: u64,
    start: CudaEvent,
    stop: CudaEvent,
}

impl BandTimes {
    /// Reads the timed calls that have ended (one whose events fail is dropped), then chooses
    /// once both mechanisms have their samples.
    fn collect(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            match self.pending[i].stop.try_is_complete() {
                Ok(false) => i += 1,
                done => {
                    let t = self.pending.swap_remove(i);
                    let ms = done.and_then(|_| t.start.elapsed_ms(&t.stop));
                    if let Ok(ms) = ms.map(f64::from).map_err(drop) {
                        if ms > 0.0 {
                            let rate = t.bytes as f64 / (ms / 1e3);
                            match t.strategy {
                                Strategy::Kernel => self.kernel.push(rate),
                                _ => self.batch.push(rate),
                            }
                        }
                    }
                }
            }
        }
        if self.chosen.is_none() {
            self.chosen = route::band_choice(&self.kernel, &self.batch);
        }
    }

    /// The mechanism of the band's next call, and whether to time it: the choice once made;
    /// else the next to time, until each has its samples measured or on their way (then the
    /// batched copy, untimed, until they are read).
    fn next(&mut self) -> (Strategy, bool) {
        self.collect();
        if let Some(c) = self.chosen {
            return (c, false);
        }
        let on_way = |s: Strategy| self.pending.iter().filter(|t| t.strategy == s).count();
        let k = self.kernel.len() + on_way(Strategy::Kernel);
        let b = self.batch.len() + on_way(Strategy::Batch);
        if k >= route::BAND_SAMPLES && b >= route::BAND_SAMPLES {
            return (Strategy::Batch, false);
        }
        (route::band_next(k, b), true)
    }
}

/// Gather/scatter of segment lists for one context: the compiled kernel (made on first use) and
/// the reusable segment tables. See the [module documentation](self).
pub struct Gatherer {
    ctx: Arc<CudaContext>,
    func: Made<CudaFunction>,
    tables: Mutex<Tables>,
    sms: u32,
    leave_sms: bool,
    /// The host may touch managed memory while a kernel runs
    /// ([`concurrent_managed_access`](crate::engine::cuda::sys::probe::concurrent_managed_access)):
    /// else [`Strategy::Auto`] copies managed memory on the copy engines (a running kernel would
    /// make all of it inaccessible to the host until the device synchronizes).
    managed_with_kernels: bool,
    /// Batches the driver refused so far, and its first refusal.
    refused: Mutex<(usize, Option<DriverError>)>,
    /// What [`Strategy::Auto`] measured in each band at each size ([`route::band_slot`]).
    bands: Mutex<[BandTimes; route::BAND_SLOTS]>,
}

impl std::fmt::Debug for Gatherer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gatherer")
            .field("device", &self.ctx.ordinal())
            .finish()
    }
}

impl Drop for Gatherer {
    fn drop(&mut self) {
        let _ = driver::set_current(&self.ctx);
        let tables = self.tables.get_mut().unwrap_or_else(|e| e.into_inner());
        for t in &mut tables.free {
            t.free();
        }
    }
}

impl Gatherer {
    /// Makes a gatherer for `ctx`. Cheap: the kernel is compiled on its first use.
    pub fn new(ctx: Arc<CudaContext>) -> Result<Gatherer, GatherError> {
        driver::set_current(&ctx).map_err(drv("cuCtxSetCurrent"))?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("cuDeviceGetAttribute"))?
            .max(1) as u32;
        let table = Table::new(&ctx)?;
        let managed_with_kernels =
            crate::engine::cuda::sys::probe::concurrent_managed_access(ctx.cu_device());
        Ok(Gatherer {
            ctx,
            func: Made::new(),
            tables: Mutex::new(Tables {
                free: vec![table],
                made: 1,
            }),
            sms,
            leave_sms: false,
            managed_with_kernels,
            refused: Mutex::new((0, None)),
            bands: Mutex::new(std::array::from_fn(|_| BandTimes::default())),
        })
    }

    /// Makes [`Strategy::Auto`] leave the SMs to the caller's kernels (as [`Strategy::Dma`]):
    /// what an engine configured with
    /// [`CudaConfig::compute_busy`](crate::engine::cuda::CudaConfig::compute_busy) uses.
    pub fn leave_sms(mut self, leave: bool) -> Gatherer {
        self.leave_sms = leave;
        self
    }

    /// How many batches of [`Strategy::Batch`] the driver has refused so far (each copied one
    /// call per segment instead, the copy correct), and the driver's first refusal: a shape
    /// the driver's batched copy does not take shows here, not as a failed request.
    #[cfg(feature = "bench")]
    pub fn batch_refusals(&self) -> (usize, Option<DriverError>) {
        *self.refused.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The context this gatherer belongs to.
    #[cfg(feature = "bench")]
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Compiles (once) and returns the gather kernel. Errors: [`GatherError::Kernel`].
    pub fn kernel(&self) -> Result<CudaFunction, GatherError> {
        Ok(self
            .func
            .get(|| Ok(program::program(&self.ctx, KERNEL_SRC, &["ferry_gather"])?.remove(0)))?)
    }

    /// Whether the driver exports a batched copy (`cuMemcpyBatchAsync_v2`, CUDA 13 or later,
    /// or 12.8's `cuMemcpyBatchAsync`; looked up once).
    pub fn batch_supported() -> bool {
        driver::batch_copy().is_ok()
    }

    /// Enqueues a copy of every segment, `len` bytes from `src + src_off` to `dst + dst_off`, on
    /// `stream`, and returns the strategy used. The copy is asynchronous: synchronize the stream
    /// (or record an event) before reading the destination. Addresses are unified (UVA)
    /// addresses: device pointers, or host pointers of pinned/registered/mapped memory (pageable
    /// host memory only with [`Strategy::PerSegment`]). `dst_len`/`src_len` bound the segments.
    ///
    /// Errors: [`GatherError::OutOfBounds`] (checked before anything runs),
    /// [`GatherError::NotDeviceAccessible`] (kernel on pageable memory),
    /// [`GatherError::BatchUnavailable`], compile and driver errors.
    ///
    /// # Safety
    /// 1. `dst .. dst + dst_len` is writable memory that nothing else reads or writes until the
    ///    stream has passed this copy; `src .. src + src_len` is readable, initialized memory
    ///    nothing writes until then. Both stay allocated until then.
    /// 2. Both buffers belong to (or are accessible from) this gatherer's context, and `stream`
    ///    belongs to it.
    /// 3. Destination segments may overlap each other only if the caller accepts either value
    ///    in the shared bytes; source and destination bytes must not overlap.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn copy(
        &self,
        stream: &Arc<CudaStream>,
        dst: u64,
        dst_len: usize,
        src: u64,
        src_len: usize,
        segs: &[Segment],
        strategy: Strategy,
    ) -> Result<Strategy, GatherError> {
        let mut total = 0u64;
        for (index, s) in segs.iter().enumerate() {
            let ok = s
                .dst_off
                .checked_add(s.len)
                .is_some_and(|e| e <= dst_len as u64)
                && s.src_off
                    .checked_add(s.len)
                    .is_some_and(|e| e <= src_len as u64);
            if !ok {
                return Err(GatherError::OutOfBounds {
                    index,
                    seg: *s,
                    dst_len,
                    src_len,
                });
            }
            total += s.len;
        }
        // SAFETY: forwarded contract; every segment lies inside both buffers (checked above).
        unsafe {
            self.copy_list(
                stream,
                (dst, src),
                List::Segments(segs),
                total,
                strategy,
                None,
            )
        }
    }

    /// [`Gatherer::copy`] of a list already checked against both buffers (a program's
    /// segments, a block mapping checked by [`crate::op::check_blocks`]): no second bounds
    /// pass; a block mapping's kernel table written straight from it, its segment list built
    /// only for another mechanism. The buffers' memory kinds (destination, source), where
    /// known, are the batched copy's location hints.
    ///
    /// # Safety
    /// As [`Gatherer::copy`]; every segment of `list` lies inside both buffers; the kinds are
    /// the buffers'.
    pub(crate) unsafe fn copy_checked(
        &self,
        stream: &Arc<CudaStream>,
        (dst, src): (u64, u64),
        list: List<'_>,
        strategy: Strategy,
        kinds: Option<(MemKind, MemKind)>,
    ) -> Result<Strategy, GatherError> {
        let total = list.bytes();
        // SAFETY: forwarded contract.
        unsafe { self.copy_list(stream, (dst, src), list, total, strategy, kinds) }
    }

    /// The copy of a list whose segments lie inside both buffers, `total` bytes in all.
    ///
    /// # Safety
    /// As [`Gatherer::copy`]; every segment of `list` lies inside both buffers.
    unsafe fn copy_list(
        &self,
        stream: &Arc<CudaStream>,
        (dst, src): (u64, u64),
        list: List<'_>,
        total: u64,
        strategy: Strategy,
        kinds: Option<(MemKind, MemKind)>,
    ) -> Result<Strategy, GatherError> {
        if list.len() == 0 || total == 0 {
            return Ok(if strategy == Strategy::Auto {
                Strategy::PerSegment
            } else {
                strategy
            });
        }
        driver::set_current(&self.ctx).map_err(drv("cuCtxSetCurrent"))?;
        // Asked for by name, the kernel waits for a segment table; picked here, it gives way to
        // the copy engines where every table is in use ([`Gatherer::take_table`]).
        let named = strategy == Strategy::Kernel;
        let (mut strategy, timed) = match strategy {
            Strategy::Auto => self.choose(
                stream,
                (dst, src),
                kinds,
                list.len(),
                total,
                !self.leave_sms,
            ),
            Strategy::Dma => self.choose(stream, (dst, src), kinds, list.len(), total, false),
            s => (s, None),
        };
        let start = timed.and_then(|_| self.record_timing(stream));
        let kernel_ran = || {
            // SAFETY: forwarded contract.
            unsafe { self.copy_kernel(stream, (dst, src), list, total, named) }
        };
        if strategy == Strategy::Kernel && !kernel_ran()? {
            strategy = if Self::batch_supported() && !stream.cu_stream().is_null() {
                Strategy::Batch
            } else {
                Strategy::PerSegment
            };
        }
        match strategy {
            Strategy::Kernel => {}
            // SAFETY: forwarded contract.
            Strategy::Batch => unsafe {
                self.copy_batch(stream, dst, src, &list.segments(), kinds)?
            },
            // SAFETY: forwarded contract.
            Strategy::PerSegment | Strategy::Auto | Strategy::Dma => unsafe {
                self.copy_each(stream, dst, src, &list.segments())?
            },
        }
        if let Some(b) = timed {
            let stop = start.as_ref().and_then(|_| self.record_timing(stream));
            let mut bands = self.bands.lock().unwrap_or_else(|e| e.into_inner());
            let band = &mut bands[b];
            match (start, stop) {
                (Some(start), Some(stop)) => band.pending.push(Timed {
                    strategy,
                    bytes: total,
                    start,
                    stop,
                }),
                // No events to time with: the batched copy from now on, as before the band
                // was measured (else the turns would never end).
                _ => band.chosen = band.chosen.or(Some(Strategy::Batch)),
            }
        }
        Ok(strategy)
    }

    /// A timing event recorded on `stream` now; `None` where the driver refuses it (the call
    /// then goes untimed).
    fn record_timing(&self, stream: &Arc<CudaStream>) -> Option<CudaEvent> {
        let e = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .ok()?;
        driver::record_event(&e, stream).ok()?;
        Some(e)
    }

    /// The strategy for `n` segments of `total` bytes, and the band measurement
    /// ([`route::band_slot`]) whose call to time, if any.
    fn choose(
        &self,
        stream: &Arc<CudaStream>,
        (dst, src): (u64, u64),
        kinds: Option<(MemKind, MemKind)>,
        n: usize,
        total: u64,
        sms_free: bool,
    ) -> (Strategy, Option<usize>) {
        // Pageable memory goes one call per segment (the driver stages it anyway).
        let reachable =
            || driver::device_address(dst).is_some() && driver::device_address(src).is_some();
        let batch = || Self::batch_supported() && !stream.cu_stream().is_null();
        // The buffers' kinds where the caller knows them, else the driver's word (reachable
        // memory only gets here: host memory is pinned, registered or mapped).
        // Asked of the driver at most once (the band asks again).
        let known = std::cell::OnceCell::new();
        let sides = || {
            *known.get_or_init(|| {
                let (d, s) = kinds.unwrap_or_else(|| {
                    let kind = |addr| match driver::memory_type(addr) {
                        Some(t) if t == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 => {
                            MemKind::Pinned
                        }
                        Some(_) => MemKind::Device { ordinal: 0 },
                        None => MemKind::Pageable,
                    };
                    (kind(dst), kind(src))
                });
                Sides::of(d, s)
            })
        };
        let managed = kinds.is_some_and(|(d, s)| d == MemKind::Managed || s == MemKind::Managed);
        let kernel = || (self.managed_with_kernels || !managed) && self.kernel().is_ok();
        let s = route::gather_strategy(n, total, sms_free, reachable, batch, kernel, sides);
        // Either mechanism chosen, both sides are reachable; in a band, both must run here.
        if sms_free && matches!(s, Strategy::Batch | Strategy::Kernel) {
            if let Some(b) = route::band(sides(), n, total).filter(|_| batch() && kernel()) {
                let mut bands = self.bands.lock().unwrap_or_else(|e| e.into_inner());
                let slot = route::band_slot(b, n, total);
                let (s, timed) = bands[slot].next();
                return (s, timed.then_some(slot));
            }
        }
        (s, None)
    }

    /// # Safety
    /// As [`Gatherer::copy`].
    unsafe fn copy_each(
        &self,
        stream: &Arc<CudaStream>,
        dst: u64,
        src: u64,
        segs: &[Segment],
    ) -> Result<(), GatherError> {
        let cs = stream.cu_stream();
        for s in segs.iter().filter(|s| s.len > 0) {
            // SAFETY: the segment lies in both buffers (checked), which are valid by contract.
            unsafe { sys::cuMemcpyAsync(dst + s.dst_off, src + s.src_off, s.len as usize, cs) }
                .result()
                .map_err(drv("cuMemcpyAsync"))?;
        }
        Ok(())
    }

    /// # Safety
    /// As [`Gatherer::copy`].
    unsafe fn copy_batch(
        &self,
        stream: &Arc<CudaStream>,
        dst: u64,
        src: u64,
        segs: &[Segment],
        kinds: Option<(MemKind, MemKind)>,
    ) -> Result<(), GatherError> {
        driver::batch_copy().map_err(GatherError::BatchUnavailable)?;
        let cs = stream.cu_stream();
        if cs.is_null() {
            return Err(GatherError::BatchUnavailable(
                "it does not run on the legacy default stream",
            ));
        }
        // SAFETY: the segments lie in both buffers (checked), valid and unshared by contract;
        // a created stream of this context (not the legacy one: checked).
        let done = unsafe { super::batch::copy(cs, dst, src, segs, kinds) }
            .map_err(|(op, source)| GatherError::Driver { op, source })?;
        if done.fallbacks > 0 {
            let mut r = self.refused.lock().unwrap_or_else(|e| e.into_inner());
            r.0 += done.fallbacks;
            r.1 = r.1.or(done.first_error);
        }
        Ok(())
    }

    /// A segment table for one call, idle (its last upload and kernel ended): one of the
    /// [`IDLE_LOOKS`] used longest ago that is, else a new one while fewer than [`TABLES`]
    /// exist, else (`wait`) the one used longest ago, waited for, or a new one where every
    /// table is in another thread's call; `None` where every table is in use and the caller
    /// does not wait.
    fn take_table(&self, wait: bool) -> Result<Option<Taken<'_>>, GatherError> {
        let mut ts = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        let taken = |table| Taken {
            tables: &self.tables,
            table: Some(table),
        };
        // The few used longest ago: a stream passes its tables in the order it used them, so
        // where those are busy the later ones are too (each asked costs one or two event
        // queries, and 64 of them a call behind a busy stream cost tens of microseconds).
        if let Some(i) = ts.free.iter_mut().take(IDLE_LOOKS).position(Table::idle) {
            return Ok(Some(taken(ts.free.remove(i))));
        }
        if !wait && ts.made >= TABLES {
            return Ok(None);
        }
        if ts.made < TABLES || ts.free.is_empty() {
            ts.made += 1;
            drop(ts);
            return match Table::new(&self.ctx) {
                Ok(t) => Ok(Some(taken(t))),
                Err(e) => {
                    self.tables.lock().unwrap_or_else(|e| e.into_inner()).made -= 1;
                    Err(e)
                }
            };
        }
        let oldest = ts.free.remove(0);
        drop(ts);
        let mut t = taken(oldest);
        t.wait()?;
        Ok(Some(t))
    }

    /// A queue's held copies (`paths/mod.rs`'s `HeldIssue`: unified addresses at offsets from
    /// `dst` and `src`, of these kinds) by the kernel, where [`Strategy::Auto`] picks it
    /// without timing a call (in a band, [`route::Band`]: its choice once measured)
    /// and a segment table is free: `Ok(false)` where not, nothing enqueued (the caller takes
    /// the batched copy rather than wait for another stream's work).
    ///
    /// # Safety
    /// As [`Gatherer::copy`]; every copy of `list` lies inside both "buffers" from the bases,
    /// each address reached by the device at its own value where the base is.
    pub(crate) unsafe fn copy_if_kernel(
        &self,
        stream: &Arc<CudaStream>,
        (dst, src): (u64, u64),
        list: List<'_>,
        kinds: (MemKind, MemKind),
    ) -> Result<bool, GatherError> {
        driver::set_current(&self.ctx).map_err(drv("cuCtxSetCurrent"))?;
        let total = list.bytes();
        match self.choose(
            stream,
            (dst, src),
            Some(kinds),
            list.len(),
            total,
            !self.leave_sms,
        ) {
            // SAFETY: forwarded contract.
            (Strategy::Kernel, None) => unsafe {
                self.copy_kernel(stream, (dst, src), list, total, false)
            },
            _ => Ok(false),
        }
    }

    /// The kernel's copy of `list`, `total` bytes; `wait`: for a segment table where every one
    /// is in use ([`Gatherer::take_table`]), else `Ok(false)` with nothing enqueued (as for held
    /// copies whose bases the device reaches at another address).
    ///
    /// # Safety
    /// As [`Gatherer::copy`].
    unsafe fn copy_kernel(
        &self,
        stream: &Arc<CudaStream>,
        (dst, src): (u64, u64),
        list: List<'_>,
        total: u64,
        wait: bool,
    ) -> Result<bool, GatherError> {
        let ddst = driver::device_address(dst).ok_or(GatherError::NotDeviceAccessible {
            side: "destination",
            addr: dst,
        })?;
        let dsrc = driver::device_address(src).ok_or(GatherError::NotDeviceAccessible {
            side: "source",
            addr: src,
        })?;
        // Held copies lie in several allocations at offsets from their bases: only bases at
        // their own address carry them.
        if matches!(list, List::Copies { .. }) && (ddst != dst || dsrc != src) {
            return Ok(false);
        }
        let func = self.kernel()?;
        let n = list.len();
        let bytes = n * std::mem::size_of::<Segment>();
        let Some(mut t) = self.take_table(wait)? else {
            return Ok(false);
        };
        let (host, dev) = t.memory(&self.ctx, bytes)?;
        // SAFETY: the pinned memory holds at least `bytes` (`n` segments), is page-aligned (the
        // driver's allocation), no copy reads it now (the table is idle) and nothing else refers
        // to it (the table is this call's); `Segment` is repr(C) plain data.
        let table = unsafe { std::slice::from_raw_parts_mut(host as *mut Segment, n) };
        list.fill(table);
        // SAFETY: both buffers hold `bytes`; the pinned one stays untouched until `uploaded`.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dev, host as *const _, bytes, stream.cu_stream()) }
            .result()
            .map_err(drv("cuMemcpyHtoDAsync"))?;
        driver::record_event(&t.uploaded, stream).map_err(settled(stream))?;
        t.upload_pending = true;

        let n = n as u64;
        let avg = total / n;
        // Threads per segment: one 16-byte load each, 32..=256.
        let g: u32 = (avg.div_ceil(16).next_power_of_two() as u32).clamp(32, BLOCK);
        let per_block = (BLOCK / g) as u64;
        let blocks = n.div_ceil(per_block).min(self.sms as u64 * 8).max(1) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let table = dev;
        let mut launch = stream.launch_builder(&func);
        launch.arg(&ddst).arg(&dsrc).arg(&table).arg(&n).arg(&g);
        // SAFETY: the kernel's arguments match its signature (two byte pointers, the table, the
        // count, the group size); every segment lies in its buffer (checked), which the device
        // can address (translated above).
        unsafe { launch.launch(cfg) }.map_err(drv("cuLaunchKernel"))?;
        driver::record_event(&t.used, stream).map_err(settled(stream))?;
        t.use_pending = true;
        Ok(true)
    }
}

/// The error of an event record that failed after work reading a table was enqueued on
/// `stream`: the stream is synchronized first, so that the table, given back idle by its
/// event's word, is not reused while that work still reads it.
fn settled(stream: &CudaStream) -> impl FnOnce(DriverError) -> GatherError + '_ {
    move |source| {
        let _ = driver::sync_stream(stream);
        GatherError::Driver {
            op: "cuEventRecord",
            source,
        }
    }
}

impl From<crate::engine::cuda::paths::gather::GatherError> for CudaError {
    fn from(e: crate::engine::cuda::paths::gather::GatherError) -> Self {
        use crate::engine::cuda::paths::gather::GatherError as G;
        match e {
            G::Kernel(k) => CudaError::Kernel(k),
            G::Driver { op, source } => {
                CudaError::Driver(crate::engine::cuda::DriverError::from_cudarc(op, source))
            }
            G::Batch(source) => CudaError::Driver(crate::engine::cuda::DriverError::from_cudarc(
                "cuMemcpyBatchAsync",
                source,
            )),
            e => CudaError::InvalidArgument(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{block_segments, check_blocks};

    /// What the kernel's table is written with (`List::fill`) and what the batched and
    /// per-block copies read (`List::segments`) are the mapping's segment list, merged runs
    /// included, for a block mapping as for a list given as it is.
    #[test]
    fn a_block_mappings_table_is_its_segment_list() {
        // A permutation's entries, then runs that continue on both sides (merged), then one
        // that continues on one side only (not merged).
        let pairs: Vec<(u64, u64)> = vec![(3, 0), (0, 2), (4, 5), (5, 6), (6, 7), (1, 1), (2, 9)];
        let block = 64;
        let runs = check_blocks(block, &pairs, 10 * block, 10 * block, None).unwrap();
        let want = block_segments(block, &pairs, runs);
        assert_eq!(want.len(), 5, "three entries merged into one segment");
        let list = List::Blocks(BlockList {
            block,
            pairs: &pairs,
            runs,
        });
        assert_eq!(list.len(), want.len());
        assert_eq!(&*list.segments(), &*want);
        let mut table = vec![Segment::default(); list.len()];
        list.fill(&mut table);
        assert_eq!(table, &*want);
        let given = List::Segments(&want);
        let mut again = vec![Segment::default(); given.len()];
        given.fill(&mut again);
        assert_eq!((&*given.segments(), &again[..]), (&*want, &*want));
    }

    /// A queue's held copies are the segments from the list's bases (at or below every copy),
    /// in the order held, in the kernel's table as in the built list; their bytes summed.
    #[test]
    fn held_copies_are_segments_from_their_bases() {
        let (dev, host) = (MemKind::Device { ordinal: 0 }, MemKind::Pinned);
        let copy = |dst: u64, src: u64, len: usize| BatchCopy {
            dst,
            src,
            len,
            dst_kind: dev,
            src_kind: host,
        };
        // Three allocations on each side, out of address order.
        let copies = [
            copy(0x9000, 0x7_0000, 4096),
            copy(0x1000, 0x5_0000, 512),
            copy(0x5000, 0x6_2000, 64),
        ];
        let list = List::Copies {
            copies: &copies,
            dst: 0x1000,
            src: 0x5_0000,
        };
        let want = [
            Segment::new(0x8000, 0x2_0000, 4096),
            Segment::new(0, 0, 512),
            Segment::new(0x4000, 0x1_2000, 64),
        ];
        assert_eq!((list.len(), list.bytes()), (3, 4096 + 512 + 64));
        assert_eq!(&*list.segments(), &want);
        let mut table = vec![Segment::default(); list.len()];
        list.fill(&mut table);
        assert_eq!(table, want);
    }
}
