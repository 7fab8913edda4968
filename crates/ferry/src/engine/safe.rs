//! The safe API over [`Engine::submit_raw`]: scoped borrows and owned transfers.
//!
//! Two ways make it impossible to free or touch a buffer while a copy uses it:
//! - [`EngineExt::scope`]: buffers are borrowed for the whole scope (as in
//!   [`std::thread::scope`]); the scope waits for every request before it returns, even if the
//!   closure panics or requests are dropped or forgotten.
//! - [`EngineExt::copy_owned`]: the engine takes the buffers and [`Transfer::wait`] hands them
//!   back, failed or not. Dropping a `Transfer` waits; forgetting one leaks the buffers, never
//!   frees them under the copy.

use super::{Engine, Job, SubmitError};
use crate::layout::Layout;
use crate::memory::{Memory, MemoryMut};
use crate::op::{Op, Operator};
use crate::request::{BarrierError, InFlight, Request, RequestError};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Safe submission on top of any [`Engine`]. Implemented for every engine.
pub trait EngineExt: Engine {
    /// Runs `f` with a [`Scope`] whose requests may borrow buffers that outlive the call.
    /// Waits for every request of the scope before returning, and reports every failure that
    /// was not already seen through `wait`/`try_wait`. May block.
    ///
    /// ```
    /// use ferry::{CpuEngine, EngineExt, Layout};
    /// let engine = CpuEngine::new(2)?;
    /// let src: Vec<f32> = (0..64 * 64).map(|i| i as f32).collect();
    /// let mut dst = vec![0f32; 64 * 64];
    /// let m = Layout::contiguous(&[64, 64], 4)?;
    /// engine.scope(|s| {
    ///     // dst = transpose(src)
    ///     s.copy(&mut dst, &m, &src, &m.transpose(0, 1)?)?;
    ///     Ok::<(), ferry::Error>(())
    /// })??;
    /// assert_eq!(dst[1], src[64]);
    /// # Ok::<(), ferry::Error>(())
    /// ```
    ///
    /// A buffer handed to the scope stays borrowed until the scope has waited for every
    /// request, so it cannot be read, written or freed inside the scope, and a buffer that
    /// does not outlive the scope cannot be handed to it:
    ///
    /// ```compile_fail
    /// use ferry::{CpuEngine, EngineExt};
    /// let engine = CpuEngine::new(1)?;
    /// let src = vec![1u8; 1 << 20];
    /// let mut dst = vec![0u8; 1 << 20];
    /// engine.scope(|s| {
    ///     s.memcpy(&mut dst, &src)?;
    ///     dst[0] = 7; // error: `dst` is mutably borrowed by the in-flight copy
    ///     Ok::<(), ferry::Error>(())
    /// })??;
    /// # Ok::<(), ferry::Error>(())
    /// ```
    ///
    /// ```compile_fail
    /// use ferry::{CpuEngine, EngineExt};
    /// let engine = CpuEngine::new(1)?;
    /// let src = vec![1u8; 1 << 20];
    /// let mut dst = vec![0u8; 1 << 20];
    /// engine.scope(|s| {
    ///     let mut tmp = vec![0u8; 1 << 20];
    ///     s.memcpy(&mut tmp, &src)?; // error: `tmp` would be freed at the end of the closure,
    ///     Ok::<(), ferry::Error>(())  // before the scope waits for the copy
    /// })??;
    /// # Ok::<(), ferry::Error>(())
    /// ```
    fn scope<'env, T>(
        &'env self,
        f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
    ) -> Result<T, BarrierError>
    where
        Self: Sized,
    {
        let scope = Scope {
            engine: self,
            inflight: InFlight::new(),
            _scope: PhantomData,
            _env: PhantomData,
        };
        // Waits even if `f` unwinds: the borrows end only after every request is done.
        struct WaitAll<'a>(&'a InFlight);
        impl Drop for WaitAll<'_> {
            fn drop(&mut self) {
                let _ = self.0.barrier();
            }
        }
        let guard = WaitAll(&scope.inflight);
        let out = f(&scope);
        std::mem::forget(guard);
        scope.inflight.barrier().map(|()| out)
    }

    /// Copies `src_layout` of `src` into `dst_layout` of `dst`, taking ownership of both until
    /// the copy completes. Errors at submit hand the buffers back.
    fn copy_owned<D, S>(
        &self,
        dst: D,
        dst_layout: &Layout,
        src: S,
        src_layout: &Layout,
    ) -> Result<Transfer<D, S>, Refused<D, S>>
    where
        D: MemoryMut + Send + 'static,
        S: Memory + Send + 'static,
        Self: Sized,
    {
        let bufs = NonNull::from(Box::leak(Box::new((dst, src))));
        // SAFETY: `bufs` was just leaked from a Box: valid and not aliased.
        let job = unsafe {
            let b = &mut *bufs.as_ptr();
            Job::copy(b.0.raw_mut(), *dst_layout, b.1.raw(), *src_layout)
        };
        // SAFETY: the buffers are owned by the Transfer through a raw pointer, so their memory
        // stays valid and untouched until the Transfer has waited for the request (in wait or
        // in Drop); no Box (which asserts unique access) exists while the request runs.
        match unsafe { self.submit_raw(job) } {
            Ok(req) => Ok(Transfer {
                req: Some(req),
                bufs: Some(bufs),
                _own: PhantomData,
            }),
            Err(error) => {
                // SAFETY: refused, so nothing uses the buffers; `bufs` came from Box::leak.
                let (dst, src) = *unsafe { Box::from_raw(bufs.as_ptr()) };
                Err(Refused { error, dst, src })
            }
        }
    }

    /// Copies all of `src` into the start of `dst`, owning both until done. An empty `src`
    /// completes at once.
    fn memcpy_owned<D, S>(&self, dst: D, src: S) -> Result<Transfer<D, S>, Refused<D, S>>
    where
        D: MemoryMut + Send + 'static,
        S: Memory + Send + 'static,
        Self: Sized,
    {
        if src.raw().len == 0 {
            // Nothing to copy: no request, the buffers come straight back.
            return Ok(Transfer {
                req: None,
                bufs: Some(NonNull::from(Box::leak(Box::new((dst, src))))),
                _own: PhantomData,
            });
        }
        match Layout::bytes(src.raw().len) {
            Ok(l) => self.copy_owned(dst, &l, src, &l),
            Err(e) => Err(Refused {
                error: SubmitError::Op(e.into()),
                dst,
                src,
            }),
        }
    }
}

impl<E: Engine + ?Sized> EngineExt for E {}

/// A job refused at submit, with the buffers handed back.
#[derive(Debug)]
pub struct Refused<D, S> {
    /// Why.
    pub error: SubmitError,
    /// The destination buffer, untouched.
    pub dst: D,
    /// The source buffer.
    pub src: S,
}

impl<D, S> std::fmt::Display for Refused<D, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}
impl<D: std::fmt::Debug, S: std::fmt::Debug> std::error::Error for Refused<D, S> {}

/// A failed transfer, with the buffers handed back.
#[derive(Debug)]
pub struct Failed<D, S> {
    /// Why.
    pub error: RequestError,
    /// The destination buffer (its contents are unspecified).
    pub dst: D,
    /// The source buffer, unchanged.
    pub src: S,
}

/// An owned transfer in flight. [`Transfer::wait`] (or `.await`) hands the buffers back.
#[must_use = "dropping a Transfer blocks until the copy completes"]
pub struct Transfer<D, S> {
    req: Option<Request>,
    /// The buffers, from `Box::leak`, rebuilt into a Box only once the request completed.
    bufs: Option<NonNull<(D, S)>>,
    _own: PhantomData<(D, S)>,
}

// SAFETY: the Transfer owns the buffers (as a Box would); the engine's access to them ends
// before they are handed back or dropped.
unsafe impl<D: Send, S: Send> Send for Transfer<D, S> {}
// SAFETY: `&Transfer` gives no access to the buffers.
unsafe impl<D, S> Sync for Transfer<D, S> {}

impl<D, S> std::fmt::Debug for Transfer<D, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer")
            .field("request", &self.req)
            .field("done", &self.is_done())
            .finish()
    }
}

impl<D, S> Transfer<D, S> {
    /// Blocks until the copy completes and returns the buffers.
    pub fn wait(mut self) -> Result<(D, S), Failed<D, S>> {
        let r = self.req.take().map_or(Ok(()), Request::wait);
        self.finish(r)
    }
    /// True once the copy completed. Never blocks.
    pub fn is_done(&self) -> bool {
        self.req.as_ref().is_none_or(Request::is_done)
    }
    fn finish(&mut self, r: Result<(), RequestError>) -> Result<(D, S), Failed<D, S>> {
        // `bufs` is taken only here and in Drop, after the request completed.
        let (dst, src) = match self.bufs.take() {
            // SAFETY: the request completed, so nothing else uses the buffers; the pointer came
            // from Box::leak and is taken (here or in Drop) once.
            Some(b) => *unsafe { Box::from_raw(b.as_ptr()) },
            None => unreachable!("a Transfer's buffers are taken once"),
        };
        match r {
            Ok(()) => Ok((dst, src)),
            Err(error) => Err(Failed { error, dst, src }),
        }
    }
}

impl<D: Unpin, S: Unpin> Future for Transfer<D, S> {
    type Output = Result<(D, S), Failed<D, S>>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let r = match this.req.as_mut() {
            Some(req) => match Pin::new(req).poll(cx) {
                Poll::Ready(r) => r,
                Poll::Pending => return Poll::Pending,
            },
            None => Ok(()),
        };
        this.req = None;
        Poll::Ready(this.finish(r))
    }
}

impl<D, S> Drop for Transfer<D, S> {
    fn drop(&mut self) {
        if let Some(req) = self.req.take() {
            // The error is not lost: an unobserved failure is reported by the engine's barrier.
            let _ = req.settle_keep();
        }
        if let Some(b) = self.bufs.take() {
            // SAFETY: the request completed (waited above or before); from Box::leak, once.
            drop(unsafe { Box::from_raw(b.as_ptr()) });
        }
    }
}

/// A scope whose requests borrow buffers; see [`EngineExt::scope`].
pub struct Scope<'scope, 'env: 'scope> {
    engine: &'env dyn Engine,
    inflight: InFlight,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl<'scope> Scope<'scope, '_> {
    /// Submits a job over borrowed buffers: the general form of the methods below.
    pub fn submit<D, S>(
        &self,
        dst: &'scope mut D,
        src: Option<&'scope S>,
        op: Op,
        after: &[&Request],
    ) -> Result<Request, SubmitError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        let job = Job {
            dst: dst.raw_mut(),
            src: src.map(|s| s.raw()),
            op,
            after: after.iter().map(|r| r.share()).collect(),
        };
        // SAFETY: `dst` is mutably and `src` immutably borrowed for 'scope, which ends only
        // after `scope()` has waited for every request tracked here, so the memory stays valid
        // and nothing else touches it while the request runs.
        let req = unsafe { self.engine.submit_raw(job)? };
        self.inflight.track(&req);
        Ok(req)
    }

    /// Copies `src_layout` of `src` into `dst_layout` of `dst`.
    pub fn copy<D, S>(
        &self,
        dst: &'scope mut D,
        dst_layout: &Layout,
        src: &'scope S,
        src_layout: &Layout,
    ) -> Result<Request, SubmitError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        self.submit(
            dst,
            Some(src),
            Op::Copy {
                dst: *dst_layout,
                src: *src_layout,
            },
            &[],
        )
    }

    /// Copies all of `src` into the start of `dst` (error if `dst` is shorter). An empty `src`
    /// completes at once.
    pub fn memcpy<D, S>(&self, dst: &'scope mut D, src: &'scope S) -> Result<Request, SubmitError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        if src.raw().len == 0 {
            // An empty copy has nothing to do (a layout holds at least one element).
            return Ok(Request::ready(Ok(())));
        }
        let l = Layout::bytes(src.raw().len).map_err(|e| SubmitError::Op(e.into()))?;
        self.copy(dst, &l, src, &l)
    }

    /// Writes `pattern` (one element) into every element of `layout` in `dst`.
    pub fn fill<D>(
        &self,
        dst: &'scope mut D,
        layout: &Layout,
        pattern: &[u8],
    ) -> Result<Request, SubmitError>
    where
        D: MemoryMut + ?Sized,
    {
        self.submit::<D, [u8]>(
            dst,
            None,
            Op::Fill {
                dst: *layout,
                pattern: pattern.into(),
            },
            &[],
        )
    }

    /// Copies a list of scattered segments from `src` to `dst` (destinations must not
    /// overlap). On a GPU this is one gather/scatter, not one copy per segment.
    ///
    /// ```
    /// use ferry::{CpuEngine, EngineExt, Segment};
    /// let engine = CpuEngine::new(2)?;
    /// let src: Vec<u8> = (0..=255).collect();
    /// let mut dst = vec![0u8; 8];
    /// let segs = vec![Segment::new(0, 200, 4), Segment::new(4, 10, 4)];
    /// engine.scope(|s| s.segments(&mut dst, &src, segs).map(drop))??;
    /// assert_eq!(dst, [200, 201, 202, 203, 10, 11, 12, 13]);
    /// # Ok::<(), ferry::Error>(())
    /// ```
    pub fn segments<D, S>(
        &self,
        dst: &'scope mut D,
        src: &'scope S,
        segs: impl Into<Arc<[crate::op::Segment]>>,
    ) -> Result<Request, SubmitError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        self.submit(dst, Some(src), Op::Segments(segs.into()), &[])
    }

    /// Runs a custom operator over `dst` and `src`.
    pub fn custom<D, S>(
        &self,
        dst: &'scope mut D,
        src: &'scope S,
        op: Arc<dyn Operator>,
    ) -> Result<Request, SubmitError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        self.submit(dst, Some(src), Op::Custom(op), &[])
    }

    /// The engine this scope submits to.
    pub fn engine(&self) -> &dyn Engine {
        self.engine
    }
}
