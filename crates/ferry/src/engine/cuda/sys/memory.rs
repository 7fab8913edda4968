//! GPU-reachable buffers: device, pinned, registered, mapped and managed memory.
//!
//! Each type owns its allocation, frees it on drop, and implements [`Memory`]/[`MemoryMut`] so
//! that any engine's safe API takes it. Allocation failures (out of memory included) are
//! [`CudaError`]s, never panics; the process and its engines stay usable after one.

use super::driver::{self, check};
use crate::engine::cuda::CudaError;
use crate::memory::{MemKind, Memory, MemoryMut, RawBuf};
use bytemuck::Pod;
use cudarc::driver::{sys, CudaContext};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// Waits for the work of the current context's legacy stream. `cuMemcpyHtoD` from pageable
/// memory returns once the data is staged, and `cuMemsetD8` on device memory returns at once,
/// both before the device memory holds the bytes; ferry's streams do not wait for the legacy
/// stream (they are non-blocking), so a copy queued next could read or overwrite the bytes
/// before they land (the H200 stress test, run 22, saw a fill read a pattern block too early).
fn legacy_sync() -> Result<(), crate::engine::cuda::DriverError> {
    // SAFETY: the null stream is the current context's legacy stream; only waits.
    check("cuStreamSynchronize", unsafe {
        sys::cuStreamSynchronize(std::ptr::null_mut())
    })
}

fn alloc_err(what: &'static str, bytes: usize, e: crate::engine::cuda::DriverError) -> CudaError {
    CudaError::Alloc {
        what,
        bytes,
        source: e,
    }
}

/// Memory on one GPU (`cuMemAlloc`). Not host-accessible: use [`DeviceBuffer::to_vec`] or an
/// engine to read it.
///
/// ```no_run
/// use ferry::cuda::DeviceBuffer;
/// let buf = DeviceBuffer::from_host(0, &[1u8, 2, 3])?;
/// assert_eq!(buf.to_vec()?, vec![1, 2, 3]);
/// # Ok::<(), ferry::cuda::CudaError>(())
/// ```
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    ordinal: u32,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer is a device address plus a length; the driver allows any thread to use it.
unsafe impl Send for DeviceBuffer {}
// SAFETY: shared access only reads the address and length.
unsafe impl Sync for DeviceBuffer {}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer {{ device: {}, ptr: {:#x}, len: {} }}",
            self.ordinal, self.ptr, self.len
        )
    }
}

impl DeviceBuffer {
    /// `len` bytes of uninitialised (arbitrary but valid) memory on device `ordinal`.
    /// Errors: [`CudaError::NoDriver`], [`CudaError::NoDevice`], [`CudaError::Alloc`] (out of
    /// memory included).
    pub fn new(ordinal: u32, len: usize) -> Result<DeviceBuffer, CudaError> {
        let ctx = driver::context(ordinal)?;
        driver::bind(&ctx)?;
        let mut ptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the device's context is current. A zero-byte
        // request allocates one byte so that the address is valid and distinct.
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, len.max(1))
        })
        .map_err(|e| alloc_err("device memory", len, e))?;
        count_alloc!(Device, 1);
        Ok(DeviceBuffer {
            ptr,
            len,
            ordinal,
            ctx,
        })
    }
    /// `len` zero bytes on device `ordinal`.
    pub fn zeroed(ordinal: u32, len: usize) -> Result<DeviceBuffer, CudaError> {
        let b = DeviceBuffer::new(ordinal, len)?;
        // SAFETY: the allocation holds at least `len` bytes; the memset runs on the legacy
        // stream of the current context (bound by `new`).
        check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(b.ptr, 0, len) })?;
        legacy_sync()?;
        Ok(b)
    }
    /// A device copy of `data` (synchronous: the bytes are on the device when it returns).
    pub fn from_host(ordinal: u32, data: &[u8]) -> Result<DeviceBuffer, CudaError> {
        let mut b = DeviceBuffer::new(ordinal, data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }
    /// Overwrites the start of the buffer with `data` (synchronous: the bytes are on the device
    /// when it returns). Errors if it does not fit.
    pub fn copy_from_host(&mut self, data: &[u8]) -> Result<(), CudaError> {
        if data.len() > self.len {
            return Err(CudaError::InvalidArgument(format!(
                "{} bytes do not fit a device buffer of {}",
                data.len(),
                self.len
            )));
        }
        if data.is_empty() {
            return Ok(());
        }
        driver::bind(&self.ctx)?;
        // SAFETY: `data` is valid for reads of its length, the buffer for writes of at least as
        // many bytes (checked above); the call returns once `data` has been read.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(self.ptr, data.as_ptr().cast(), data.len())
        })?;
        legacy_sync()?;
        Ok(())
    }
    /// The buffer's bytes, copied to the host (synchronous).
    pub fn to_vec(&self) -> Result<Vec<u8>, CudaError> {
        let mut v = vec![0u8; self.len];
        if self.len > 0 {
            driver::bind(&self.ctx)?;
            // SAFETY: `v` is valid for writes of `len` bytes, the buffer for reads of as many;
            // synchronous copy.
            check("cuMemcpyDtoH", unsafe {
                sys::cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), self.ptr, self.len)
            })?;
        }
        Ok(v)
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The device it lives on.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }
    /// The device address (for kernels and other libraries).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if driver::bind(&self.ctx).is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc and is freed once; the safe APIs guarantee no
            // copy still uses it.
            let r = unsafe { sys::cuMemFree_v2(self.ptr) };
            if r == sys::CUresult::CUDA_SUCCESS {
                count_alloc!(Device, -1);
            }
        }
    }
}

// SAFETY: a live allocation of at least `len` bytes on device `ordinal`.
unsafe impl Memory for DeviceBuffer {
    fn raw(&self) -> RawBuf {
        RawBuf {
            addr: self.ptr,
            len: self.len,
            kind: MemKind::Device {
                ordinal: self.ordinal,
            },
        }
    }
}
// SAFETY: as above; `&mut self` is exclusive.
unsafe impl MemoryMut for DeviceBuffer {
    fn raw_mut(&mut self) -> RawBuf {
        self.raw()
    }
}

/// How a page-locked allocation is made (the `CU_MEMHOSTALLOC_*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PinFlags {
    /// Page-locked for every context, not only the one it was made in (`PORTABLE`).
    pub(crate) portable: bool,
    /// Mapped into the devices' address space (`DEVICEMAP`).
    pub(crate) mapped: bool,
    /// Write-combined: fast for the CPU to write and the GPU to read, very slow for the CPU to
    /// read (`WRITECOMBINED`).
    pub(crate) write_combined: bool,
}

impl PinFlags {
    /// Portable and mapped: what [`PinnedBuffer`] and [`MappedBuffer`] use.
    pub(crate) const MAPPED: PinFlags = PinFlags {
        portable: true,
        mapped: true,
        write_combined: false,
    };
    /// Portable only: the staging ring and the gather table.
    pub(crate) const PORTABLE: PinFlags = PinFlags {
        portable: true,
        mapped: false,
        write_combined: false,
    };
    fn bits(self) -> u32 {
        let bit = |on: bool, b: u32| if on { b } else { 0 };
        bit(self.portable, sys::CU_MEMHOSTALLOC_PORTABLE)
            | bit(self.mapped, sys::CU_MEMHOSTALLOC_DEVICEMAP)
            | bit(self.write_combined, sys::CU_MEMHOSTALLOC_WRITECOMBINED)
    }
}

/// One page-locked host allocation (`cuMemHostAlloc`), freed on drop: the crate's only owner
/// of such memory, under [`PinnedBuffer`], [`MappedBuffer`], the staging ring
/// (`staged/ring.rs`), the gather table (`gather.rs`) and the streams' completion words
/// (`completion/stamp.rs`). Its bytes start uninitialised; it hands out its address, not a slice.
pub(crate) struct HostAlloc {
    ptr: *mut u8,
    len: usize,
    /// Keeps the context (and so the allocation's registration) alive until the free.
    _ctx: Arc<CudaContext>,
}

impl HostAlloc {
    /// `len` bytes (at least one is allocated, so the address is valid and distinct) in `ctx`,
    /// which is made current on this thread. Errors: the failed driver call (out of memory
    /// included).
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        len: usize,
        flags: PinFlags,
    ) -> Result<HostAlloc, crate::engine::cuda::DriverError> {
        driver::bind(ctx)?;
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; `ctx` is current. The pointer is owned by the
        // returned value and freed once, in `Drop`.
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut p, len.max(1), flags.bits())
        })?;
        count_alloc!(PinnedHost, 1);
        Ok(HostAlloc {
            ptr: p.cast::<u8>(),
            len,
            _ctx: Arc::clone(ctx),
        })
    }
    /// The host address of the first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Bytes asked for.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once; the owners wait for every
        // copy that uses it before they drop it.
        if unsafe { sys::cuMemFreeHost(self.ptr.cast()) } == sys::CUresult::CUDA_SUCCESS {
            count_alloc!(PinnedHost, -1);
        }
    }
}

// SAFETY: plain owned host memory; its owners order the accesses to its bytes.
unsafe impl Send for HostAlloc {}
// SAFETY: shared access only reads the address and length.
unsafe impl Sync for HostAlloc {}

/// A zeroed [`HostAlloc`] seen as `[u8]`: the memory of [`PinnedBuffer`] and [`MappedBuffer`].
struct ZeroedHost(HostAlloc);

impl ZeroedHost {
    fn new(len: usize, flags: PinFlags, what: &'static str) -> Result<ZeroedHost, CudaError> {
        let ctx = driver::context(0)?;
        driver::bind(&ctx)?;
        let mem = HostAlloc::new(&ctx, len, flags).map_err(|e| alloc_err(what, len, e))?;
        // SAFETY: fresh allocation of at least `len` bytes; zeroed so that it reads as `[u8]`.
        unsafe { std::ptr::write_bytes(mem.ptr(), 0, len) };
        Ok(ZeroedHost(mem))
    }
    fn slice(&self) -> &[u8] {
        // SAFETY: `len` bytes, initialised (zeroed) in `new`, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.0.ptr(), self.0.len()) }
    }
    fn slice_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.0.ptr(), self.0.len()) }
    }
}

/// `Deref`/`DerefMut` to `[u8]` and `Memory`/`MemoryMut` of kind `$kind` for a buffer type
/// whose memory is its field `mem: ZeroedHost` ([`PinnedBuffer`], [`MappedBuffer`]).
macro_rules! zeroed_host_memory {
    ($ty:ty, $kind:expr) => {
        impl Deref for $ty {
            type Target = [u8];
            fn deref(&self) -> &[u8] {
                self.mem.slice()
            }
        }
        impl DerefMut for $ty {
            fn deref_mut(&mut self) -> &mut [u8] {
                self.mem.slice_mut()
            }
        }
        // SAFETY: `mem` is a live page-locked allocation (mapped for `MemKind::Mapped`) of
        // `len` bytes, host-addressable at `ptr`, owned by the buffer.
        unsafe impl Memory for $ty {
            fn raw(&self) -> RawBuf {
                RawBuf::host(self.mem.0.ptr(), self.mem.0.len(), $kind)
            }
        }
        // SAFETY: as above; `&mut self` is exclusive.
        unsafe impl MemoryMut for $ty {
            fn raw_mut(&mut self) -> RawBuf {
                self.raw()
            }
        }
    };
}

/// Page-locked host memory (`cuMemHostAlloc`, portable to every device, mapped). Cached, so the
/// CPU reads it at full speed; [`PinnedBuffer::write_combined`] for upload-only staging.
/// Dereferences to `[u8]`.
///
/// ```no_run
/// let mut p = ferry::cuda::PinnedBuffer::new(1 << 20)?;
/// p[0] = 7;
/// # Ok::<(), ferry::cuda::CudaError>(())
/// ```
pub struct PinnedBuffer {
    mem: ZeroedHost,
    write_combined: bool,
}

impl PinnedBuffer {
    /// `len` zeroed bytes of pinned, cached host memory.
    pub fn new(len: usize) -> Result<PinnedBuffer, CudaError> {
        Ok(PinnedBuffer {
            mem: ZeroedHost::new(len, PinFlags::MAPPED, "pinned host memory")?,
            write_combined: false,
        })
    }
    /// `len` zeroed bytes of pinned write-combined memory: fast for the CPU to write and the
    /// GPU to read, very slow for the CPU to read. For upload staging only.
    pub fn write_combined(len: usize) -> Result<PinnedBuffer, CudaError> {
        let flags = PinFlags {
            write_combined: true,
            ..PinFlags::MAPPED
        };
        Ok(PinnedBuffer {
            mem: ZeroedHost::new(len, flags, "write-combined host memory")?,
            write_combined: true,
        })
    }
    /// True if allocated write-combined.
    pub fn is_write_combined(&self) -> bool {
        self.write_combined
    }
}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PinnedBuffer {{ ptr: {:p}, len: {}, write_combined: {} }}",
            self.mem.0.ptr(),
            self.mem.0.len(),
            self.write_combined
        )
    }
}

zeroed_host_memory!(PinnedBuffer, MemKind::Pinned);

/// Page-locked host memory mapped into the GPUs' address space (zero-copy): kernels read and
/// write it over the bus through [`MappedBuffer::device_ptr`]. Dereferences to `[u8]`.
pub struct MappedBuffer {
    mem: ZeroedHost,
    dptr: u64,
}

impl MappedBuffer {
    /// `len` zeroed bytes of mapped pinned memory.
    pub fn new(len: usize) -> Result<MappedBuffer, CudaError> {
        let mem = ZeroedHost::new(len, PinFlags::MAPPED, "mapped host memory")?;
        let mut dptr = 0;
        // SAFETY: `mem.ptr` came from cuMemHostAlloc with DEVICEMAP; `dptr` is an out-pointer.
        check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut dptr, mem.0.ptr().cast(), 0)
        })?;
        Ok(MappedBuffer { mem, dptr })
    }
    /// The address GPUs use for this memory (equal to the host address under unified
    /// addressing).
    pub fn device_ptr(&self) -> u64 {
        self.dptr
    }
}

impl std::fmt::Debug for MappedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MappedBuffer {{ ptr: {:p}, device_ptr: {:#x}, len: {} }}",
            self.mem.0.ptr(),
            self.dptr,
            self.mem.0.len()
        )
    }
}
zeroed_host_memory!(MappedBuffer, MemKind::Mapped);

/// An existing host buffer (a `Vec<T>`, a boxed slice...) page-locked in place with
/// `cuMemHostRegister`, so that copies from and to it run at the pinned rate. Unregistered on
/// drop or by [`Registered::into_inner`]. Dereferences to the buffer's slice (not to the
/// container, so it cannot reallocate while registered).
///
/// ```no_run
/// let mut r = ferry::cuda::Registered::new(vec![0u8; 1 << 20]).map_err(|(e, _)| e)?;
/// r[0] = 1;
/// let v: Vec<u8> = r.into_inner();
/// # Ok::<(), ferry::cuda::CudaError>(())
/// ```
pub struct Registered<T> {
    inner: Option<T>,
    ptr: *mut u8,
    len: usize,
    _ctx: Arc<CudaContext>,
}

// SAFETY: owns `T`; the pointer points into `T`'s own buffer.
unsafe impl<T: Send> Send for Registered<T> {}
// SAFETY: shared access is read-only.
unsafe impl<T: Sync> Sync for Registered<T> {}

impl<T, E> Registered<T>
where
    T: DerefMut<Target = [E]>,
    E: Pod,
{
    /// Registers `buf`'s memory. On error the buffer is handed back with the reason.
    pub fn new(mut buf: T) -> Result<Registered<T>, (CudaError, T)> {
        let s: &mut [E] = &mut buf;
        let (ptr, len) = (s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s));
        if len == 0 {
            return Err((
                CudaError::InvalidArgument("cannot register an empty buffer".into()),
                buf,
            ));
        }
        let ctx = match driver::context(0) {
            Ok(c) => c,
            Err(e) => return Err((e, buf)),
        };
        if let Err(e) = driver::bind(&ctx) {
            return Err((e.into(), buf));
        }
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: `ptr..ptr+len` is the buffer's live memory, which stays in place while it is
        // owned here (only its slice is exposed, so it cannot reallocate).
        if let Err(e) = check("cuMemHostRegister", unsafe {
            sys::cuMemHostRegister_v2(ptr.cast(), len, flags)
        }) {
            return Err((alloc_err("host registration", len, e), buf));
        }
        count_alloc!(PinnedHost, 1);
        Ok(Registered {
            inner: Some(buf),
            ptr,
            len,
            _ctx: ctx,
        })
    }
}

impl<T> Registered<T> {
    /// Unregisters and returns the buffer.
    pub fn into_inner(mut self) -> T {
        self.unregister();
        self.inner
            .take()
            .expect("Registered always holds its buffer until dropped")
    }
    fn unregister(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: `ptr` was registered by `new` and is unregistered once.
            if unsafe { sys::cuMemHostUnregister(self.ptr.cast()) } == sys::CUresult::CUDA_SUCCESS {
                count_alloc!(PinnedHost, -1);
            }
            self.ptr = std::ptr::null_mut();
        }
    }
}

impl<T> Drop for Registered<T> {
    fn drop(&mut self) {
        self.unregister();
    }
}

impl<T: Deref<Target = [E]>, E> Deref for Registered<T> {
    type Target = [E];
    fn deref(&self) -> &[E] {
        self.inner.as_deref().unwrap_or(&[])
    }
}
impl<T: DerefMut<Target = [E]>, E> DerefMut for Registered<T> {
    fn deref_mut(&mut self) -> &mut [E] {
        self.inner.as_deref_mut().unwrap_or(&mut [])
    }
}
impl<T> std::fmt::Debug for Registered<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registered {{ ptr: {:p}, len: {} }}", self.ptr, self.len)
    }
}
/// The raw view of the slice `ptr..ptr + len` a registered buffer's `Deref`/`DerefMut` gives
/// now: its own address and length always (never the length recorded at registration), and
/// `Pinned` only when it lies within the registered range `reg..reg + reg_len`, else
/// `Pageable`. `T`'s `Deref` and `DerefMut` are safe code that may return different slices,
/// or slices that shrink or move (a type whose data is inline moves with it into
/// [`Registered`]): the view once took the current address with the registered length, so a
/// copy could run past the slice, at an address reported pinned that was not registered.
fn registered_view(reg: *const u8, reg_len: usize, ptr: *const u8, len: usize) -> RawBuf {
    let (reg, ptr) = (reg as usize, ptr as usize);
    // Overflow-free: `ptr - reg` only when `ptr >= reg`, `reg_len - len` only when
    // `len <= reg_len`. A null `reg` is no registration (after `unregister`).
    let inside = reg != 0 && ptr >= reg && len <= reg_len && ptr - reg <= reg_len - len;
    let kind = if inside {
        MemKind::Pinned
    } else {
        MemKind::Pageable
    };
    RawBuf::host(ptr as *const u8, len, kind)
}

// SAFETY: the slice the owned buffer's `Deref` gives, valid for reads of its own length while
// `self` is borrowed; `Pinned` only when it lies within the registered (page-locked) range,
// else `Pageable` (`registered_view`).
unsafe impl<T: Deref<Target = [E]>, E: Pod> Memory for Registered<T> {
    fn raw(&self) -> RawBuf {
        let s: &[E] = self.deref();
        registered_view(
            self.ptr,
            self.len,
            s.as_ptr().cast(),
            std::mem::size_of_val(s),
        )
    }
    fn elem_size(&self) -> usize {
        std::mem::size_of::<E>()
    }
    fn elem_type(&self) -> Option<&'static str> {
        Some(std::any::type_name::<E>())
    }
}
// SAFETY: as above, with the slice `DerefMut` gives; `&mut self` is exclusive.
unsafe impl<T: DerefMut<Target = [E]>, E: Pod> MemoryMut for Registered<T> {
    fn raw_mut(&mut self) -> RawBuf {
        let (reg, reg_len) = (self.ptr, self.len);
        let s: &mut [E] = self.deref_mut();
        registered_view(
            reg,
            reg_len,
            s.as_mut_ptr().cast(),
            std::mem::size_of_val(s),
        )
    }
}

/// Where managed memory should live: [`ManagedBuffer::prefetch_to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Host memory.
    Host,
    /// Device memory of this GPU.
    Device(u32),
}

/// CUDA managed (unified) memory (`cuMemAllocManaged`), migrated between host and devices on
/// demand or by [`ManagedBuffer::prefetch_to`]. Dereferences to `[u8]`. Ask for no more than
/// the device has free: oversubscribed managed memory can stall the GPU.
pub struct ManagedBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: an owned managed allocation, usable from any thread.
unsafe impl Send for ManagedBuffer {}
// SAFETY: shared access is read-only.
unsafe impl Sync for ManagedBuffer {}

impl ManagedBuffer {
    /// `len` zeroed bytes of managed memory, associated with device `ordinal`.
    pub fn new(ordinal: u32, len: usize) -> Result<ManagedBuffer, CudaError> {
        let ctx = driver::context(ordinal)?;
        driver::bind(&ctx)?;
        let mut ptr = 0;
        // SAFETY: out-pointer valid; context current.
        check("cuMemAllocManaged", unsafe {
            sys::cuMemAllocManaged(
                &mut ptr,
                len.max(1),
                sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32,
            )
        })
        .map_err(|e| alloc_err("managed memory", len, e))?;
        count_alloc!(Device, 1);
        let b = ManagedBuffer { ptr, len, ctx };
        // SAFETY: the allocation holds at least `len` bytes; synchronous memset.
        check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(b.ptr, 0, len) })?;
        // SAFETY: the legacy stream of the current context; waits for the memset.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })?;
        Ok(b)
    }
    /// Migrates the whole buffer to `to` and waits for the migration.
    pub fn prefetch_to(&self, to: Location) -> Result<(), CudaError> {
        driver::bind(&self.ctx)?;
        let loc = match to {
            Location::Host => sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
                id: 0,
            },
            Location::Device(o) => sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: o as i32,
            },
        };
        // SAFETY: range inside the managed allocation; null stream of the current context.
        check("cuMemPrefetchAsync", unsafe {
            sys::cuMemPrefetchAsync_v2(self.ptr, self.len.max(1), loc, 0, std::ptr::null_mut())
        })?;
        // SAFETY: waits for the prefetch on the current context.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })?;
        Ok(())
    }
    /// The managed address (valid on the host and on devices).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

impl std::fmt::Debug for ManagedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ManagedBuffer {{ ptr: {:#x}, len: {} }}",
            self.ptr, self.len
        )
    }
}
impl Deref for ManagedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: managed memory is host-addressable; `len` initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}
impl DerefMut for ManagedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }
}
impl Drop for ManagedBuffer {
    fn drop(&mut self) {
        if driver::bind(&self.ctx).is_ok() {
            // SAFETY: `ptr` came from cuMemAllocManaged and is freed once.
            if unsafe { sys::cuMemFree_v2(self.ptr) } == sys::CUresult::CUDA_SUCCESS {
                count_alloc!(Device, -1);
            }
        }
    }
}
// SAFETY: a live managed allocation of `len` bytes.
unsafe impl Memory for ManagedBuffer {
    fn raw(&self) -> RawBuf {
        RawBuf {
            addr: self.ptr,
            len: self.len,
            kind: MemKind::Managed,
        }
    }
}
// SAFETY: as above; `&mut self` is exclusive.
unsafe impl MemoryMut for ManagedBuffer {
    fn raw_mut(&mut self) -> RawBuf {
        self.raw()
    }
}

// ---------------------------------------------------------------------------------------------
// Interprocess memory, for the agent (`crate::agent`): a device allocation's CUDA IPC handle, a
// peer's allocation opened in this process, and a peer's shared host pages page-locked here.

/// The CUDA IPC handle of `buf`'s allocation (`cuIpcGetMemHandle`): 64 bytes another process
/// of the same host opens with [`IpcMapping::open`].
pub(crate) fn ipc_handle(buf: &DeviceBuffer) -> Result<[u8; 64], CudaError> {
    driver::bind(&buf.ctx)?;
    let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `h` is a valid out-pointer; `buf.ptr` is the base of a live allocation of the
    // context made current above.
    check("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(&mut h, buf.ptr)
    })?;
    Ok(h.reserved.map(|b| b as u8))
}

/// Another process's device allocation opened in this one (`cuIpcOpenMemHandle`), closed on
/// drop (`cuIpcCloseMemHandle`).
pub(crate) struct IpcMapping {
    ptr: sys::CUdeviceptr,
    len: usize,
    ordinal: u32,
    ctx: Arc<CudaContext>,
}

// SAFETY: a device address plus a length; the driver allows any thread to use it.
unsafe impl Send for IpcMapping {}
// SAFETY: shared access only reads the address and length.
unsafe impl Sync for IpcMapping {}

impl IpcMapping {
    /// Opens `handle` (from [`ipc_handle`] in another process) on device `ordinal`, an
    /// allocation of `len` bytes.
    pub(crate) fn open(
        ordinal: u32,
        handle: &[u8; 64],
        len: usize,
    ) -> Result<IpcMapping, CudaError> {
        let ctx = driver::context(ordinal)?;
        driver::bind(&ctx)?;
        let h = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut ptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: `ptr` is a valid out-pointer; the handle is plain bytes the driver checks.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut ptr, h, flags)
        })?;
        Ok(IpcMapping {
            ptr,
            len,
            ordinal,
            ctx,
        })
    }

    /// The opened memory as an engine sees it.
    pub(crate) fn raw(&self) -> RawBuf {
        RawBuf {
            addr: self.ptr,
            len: self.len,
            kind: MemKind::Device {
                ordinal: self.ordinal,
            },
        }
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if driver::bind(&self.ctx).is_ok() {
            // SAFETY: `ptr` was opened by `open` and is closed once; no request of this
            // process uses it any more (the agent waits for them first).
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

/// Host pages mapped by the caller (a peer's shared memory) page-locked with
/// `cuMemHostRegister` (portable, mapped) until drop.
pub(crate) struct HostPin {
    ptr: *mut u8,
    _ctx: Arc<CudaContext>,
}

// SAFETY: an address registered with the driver; any thread may unregister it.
unsafe impl Send for HostPin {}
// SAFETY: shared access reads nothing.
unsafe impl Sync for HostPin {}

impl HostPin {
    /// Page-locks the `len` bytes at `ptr`.
    ///
    /// # Safety
    /// 1. `ptr..ptr + len` is mapped memory of this process that stays mapped until the
    ///    returned value is dropped.
    pub(crate) unsafe fn new(ptr: *mut u8, len: usize) -> Result<HostPin, CudaError> {
        let ctx = driver::context(0)?;
        driver::bind(&ctx)?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the caller keeps the range mapped while registered (point 1).
        check("cuMemHostRegister", unsafe {
            sys::cuMemHostRegister_v2(ptr.cast(), len, flags)
        })
        .map_err(|e| alloc_err("host registration", len, e))?;
        Ok(HostPin { ptr, _ctx: ctx })
    }
}

impl Drop for HostPin {
    fn drop(&mut self) {
        // SAFETY: registered by `new`, unregistered once, while still mapped (its contract).
        let _ = unsafe { sys::cuMemHostUnregister(self.ptr.cast()) };
    }
}

/// Device memory made with the driver's virtual memory calls (`cuMemCreate`, reserved and
/// mapped with read-write access for its device) whose allocation can travel to another
/// process as a POSIX file descriptor (`cuMemExportToShareableHandle`), or a peer's such
/// allocation imported in this process (`cuMemImportFromShareableHandle`). Unmapped and
/// released on drop.
pub(crate) struct VmmBuffer {
    ptr: sys::CUdeviceptr,
    /// Mapped bytes (the length asked, rounded up to the allocation granularity).
    size: usize,
    /// The length asked.
    len: usize,
    handle: sys::CUmemGenericAllocationHandle,
    ordinal: u32,
    ctx: Arc<CudaContext>,
}

// SAFETY: a device address plus handles; the driver allows any thread to use them.
unsafe impl Send for VmmBuffer {}
// SAFETY: shared access only reads the address and length.
unsafe impl Sync for VmmBuffer {}

/// What allocating and importing VMM memory both start with: device `ordinal`'s context made
/// current, its allocation properties, and `len` (at least 1) rounded up to whole granules.
fn vmm_start(
    ordinal: u32,
    len: usize,
) -> Result<(Arc<CudaContext>, sys::CUmemAllocationProp, usize), CudaError> {
    let ctx = driver::context(ordinal)?;
    driver::bind(&ctx)?;
    let prop = vmm_prop(ordinal);
    let mut gran = 0usize;
    // SAFETY: valid out-pointer and property struct.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut gran,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    Ok((ctx, prop, len.max(1).div_ceil(gran.max(1)) * gran.max(1)))
}

fn vmm_prop(ordinal: u32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct, valid all zeros (no compression, no flags).
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = ordinal as i32;
    p
}

impl VmmBuffer {
    /// `len` (> 0) bytes on device `ordinal`, exportable as a file descriptor.
    pub(crate) fn alloc(ordinal: u32, len: usize) -> Result<VmmBuffer, CudaError> {
        let (ctx, prop, size) = vmm_start(ordinal, len)?;
        let mut handle = 0;
        // SAFETY: valid out-pointer and property struct.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, size, &prop, 0)
        })
        .map_err(|e| alloc_err("device memory (VMM)", len, e))?;
        VmmBuffer::map(handle, size, len, ordinal, ctx)
    }

    /// Reserves addresses for `handle`'s `size` bytes, maps them with read-write access;
    /// releases the handle on failure.
    fn map(
        handle: sys::CUmemGenericAllocationHandle,
        size: usize,
        len: usize,
        ordinal: u32,
        ctx: Arc<CudaContext>,
    ) -> Result<VmmBuffer, CudaError> {
        let mut b = VmmBuffer {
            ptr: 0,
            size,
            len,
            handle,
            ordinal,
            ctx,
        };
        // SAFETY: a valid out-pointer; no fixed address asked.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut b.ptr, size, 0, 0, 0)
        })?;
        // SAFETY: the reserved range and a live handle of `size` bytes.
        check("cuMemMap", unsafe {
            sys::cuMemMap(b.ptr, size, 0, handle, 0)
        })?;
        let access = sys::CUmemAccessDesc {
            location: vmm_prop(ordinal).location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range mapped above; one access descriptor.
        check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(b.ptr, size, &access, 1)
        })?;
        Ok(b)
    }

    /// A new file descriptor of the allocation, for another process.
    pub(crate) fn export_fd(&self) -> Result<std::os::fd::OwnedFd, CudaError> {
        use std::os::fd::FromRawFd;
        driver::bind(&self.ctx)?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: for the POSIX handle type the driver writes one int.
        check("cuMemExportToShareableHandle", unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast(),
                self.handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        // SAFETY: a new descriptor the driver made for the caller.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    /// Imports a peer's allocation of `len` bytes from its file descriptor, on `ordinal`.
    pub(crate) fn import(
        ordinal: u32,
        fd: std::os::fd::RawFd,
        len: usize,
    ) -> Result<VmmBuffer, CudaError> {
        let (ctx, _, size) = vmm_start(ordinal, len)?;
        let mut handle = 0;
        // SAFETY: for the POSIX handle type the descriptor itself is passed as the pointer
        // value (the driver's documented convention); the caller keeps `fd` open meanwhile.
        check("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd as usize as *mut std::ffi::c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        VmmBuffer::map(handle, size, len, ordinal, ctx)
    }

    /// The memory as an engine sees it.
    pub(crate) fn raw(&self) -> RawBuf {
        RawBuf {
            addr: self.ptr,
            len: self.len,
            kind: MemKind::Device {
                ordinal: self.ordinal,
            },
        }
    }
}

impl Drop for VmmBuffer {
    fn drop(&mut self) {
        if driver::bind(&self.ctx).is_err() {
            return;
        }
        // SAFETY: the mapping, reservation and handle made by `alloc`/`import`, each undone
        // once (a step that never happened is refused by the driver, harmlessly); the agent
        // waits for this process's requests on it first.
        unsafe {
            if self.ptr != 0 {
                let _ = sys::cuMemUnmap(self.ptr, self.size);
                let _ = sys::cuMemAddressFree(self.ptr, self.size);
            }
            let _ = sys::cuMemRelease(self.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_view_is_pinned_only_within_the_registration() {
        let v = vec![0u8; 4096];
        let reg = v.as_ptr();
        let at = |off: usize| reg.wrapping_add(off);
        // The registered slice itself, or any part of it: pinned, with its own length.
        for (off, len) in [(0, 4096), (0, 16), (100, 3996), (4096, 0), (4000, 96)] {
            assert_eq!(
                registered_view(reg, 4096, at(off), len),
                RawBuf::host(at(off), len, MemKind::Pinned),
                "{off} + {len}"
            );
        }
        // Past its end, before its start, elsewhere, or longer: pageable, with its own
        // address and length (never the registered length).
        for (p, len) in [
            (at(1), 4096),
            (at(4000), 97),
            (at(4096), 1),
            (reg.wrapping_sub(1), 2),
            (at(0), 4097),
            (at(8192), 16),
            (at(0), usize::MAX),
            (at(usize::MAX), 1),
        ] {
            assert_eq!(
                registered_view(reg, 4096, p, len),
                RawBuf::host(p, len, MemKind::Pageable),
                "{p:p} + {len}"
            );
        }
        // No registration (null): pageable.
        assert_eq!(
            registered_view(std::ptr::null(), 0, reg, 16).kind,
            MemKind::Pageable
        );
    }
}
