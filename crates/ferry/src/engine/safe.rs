//! The safe API over [`Engine::submit_raw`]: scoped borrows and owned transfers.
//!
//! Two ways make it impossible to free or touch a buffer while a copy uses it:
//! - [`EngineExt::scope`]: buffers are borrowed for the whole scope (as in
//!   [`std::thread::scope`]); the scope waits for every request before it returns, even if the
//!   closure panics or requests are dropped or forgotten.
//! - [`EngineExt::copy_owned`]: the engine takes the buffers and [`Transfer::wait`] hands them
//!   back, failed or not. Dropping a `Transfer` waits; forgetting one leaks the buffers, never
//!   frees them under the copy.
//!
//! The two mechanisms underneath serve every engine with borrowed or owned buffers, not only
//! [`Engine`]s: [`ScopeCore`] (a scope's requests, all waited for before the borrows end, on
//! return or unwind) is also the NCCL engine's scope, and [`Lent`] (buffers held from submit
//! until the request completed) is also the file engine's
//! [`FileTransfer`](crate::file::FileTransfer).

use super::contract::{Engine, Job, SubmitError};
use crate::layout::Layout;
use crate::memory::{Memory, MemoryMut, RawBuf};
use crate::op::{Op, OpError, Operator};
use crate::request::{BarrierError, InFlight, Request, RequestError};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// Safe submission on top of any [`Engine`]. Implemented for every engine.
pub trait EngineExt: Engine {
    /// Runs `f` with a [`Scope`] whose requests may borrow buffers that outlive the call.
    /// Waits for every request of the scope before returning, and reports every failure that
    /// was not already seen through `wait`/`try_wait`. May block.
    ///
    /// `f` returns a `Result` whose error type takes the barrier's error (`E:
    /// From<BarrierError>`: [`ferry::Error`](crate::Error), `Box<dyn Error>`, ...), and the
    /// scope returns that same `Result`: `f`'s error if it returned one (the requests are
    /// still waited for), else the barrier's failures converted into `E`, else `f`'s value.
    /// One `?` propagates both. A closure that returns a bare `Result<Request, SubmitError>`
    /// does not compile (the submit error cannot hold a barrier's failures): return
    /// `Result<_, ferry::Error>` instead, as below.
    ///
    /// ```
    /// use ferry::{CpuEngine, EngineExt, Layout};
    /// let engine = CpuEngine::new(2)?;
    /// let src: Vec<f32> = (0..64 * 64).map(|i| i as f32).collect();
    /// let mut dst = vec![0f32; 64 * 64];
    /// let m = Layout::of::<f32>(&[64, 64])?;
    /// engine.scope(|s| -> ferry::Result<()> {
    ///     // dst = transpose(src)
    ///     s.copy(&mut dst, &m, &src, &m.transpose(0, 1)?)?;
    ///     Ok(())
    /// })?;
    /// assert_eq!(dst[1], src[64]);
    /// # Ok::<(), ferry::Error>(())
    /// ```
    ///
    /// On an engine behind `&dyn Engine` the same call works (through the inherent
    /// [`scope`](trait.Engine.html#method.scope) of `dyn Engine`).
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
    /// engine.scope(|s| -> ferry::Result<()> {
    ///     s.memcpy(&mut dst, &src)?;
    ///     dst[0] = 7; // error: `dst` is mutably borrowed by the in-flight copy
    ///     Ok(())
    /// })?;
    /// # Ok::<(), ferry::Error>(())
    /// ```
    ///
    /// ```compile_fail
    /// use ferry::{CpuEngine, EngineExt};
    /// let engine = CpuEngine::new(1)?;
    /// let src = vec![1u8; 1 << 20];
    /// engine.scope(|s| -> ferry::Result<()> {
    ///     let mut tmp = vec![0u8; 1 << 20];
    ///     s.memcpy(&mut tmp, &src)?; // error: `tmp` would be freed at the end of the closure,
    ///     Ok(())                      // before the scope waits for the copy
    /// })?;
    /// # Ok::<(), ferry::Error>(())
    /// ```
    ///
    /// A submit error is never dropped: the closure's error type must take the barrier's, so
    /// the bare submit result does not compile as the closure's value:
    ///
    /// ```compile_fail
    /// use ferry::{CpuEngine, EngineExt};
    /// let engine = CpuEngine::new(1)?;
    /// let (src, mut dst) = (vec![1u8; 8], vec![0u8; 4]);
    /// engine.scope(|s| s.memcpy(&mut dst, &src))?; // error: SubmitError: From<BarrierError>
    /// # Ok::<(), ferry::Error>(())
    /// ```
    fn scope<'env, T, E>(
        &'env self,
        f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<BarrierError>,
        Self: Sized,
    {
        run_scope(self, f)
    }

    /// Copies `src_layout` of `src` into `dst_layout` of `dst`, taking ownership of both until
    /// the copy completes. Errors at submit hand the buffers back (a layout that a typed
    /// buffer cannot hold, see [`Layout::check_elem`], is one). Two empty layouts complete at
    /// once: the buffers come straight back.
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
    {
        let op = Op::Copy {
            dst: *dst_layout,
            src: *src_layout,
        };
        let checked = check_elems(&op, elem(&dst), Some(elem(&src)))
            .and_then(|()| nothing_to_do(&op, dst.raw().len, Some(src.raw().len)));
        match checked {
            // No element to copy: no request, the buffers come straight back.
            Ok(true) => Ok(Transfer {
                lent: Lent::done((dst, src)),
            }),
            Ok(false) => lend_copy(self, dst, dst_layout, src, src_layout),
            Err(error) => Err(Refused { error, dst, src }),
        }
    }

    /// Copies all of `src`'s bytes into the start of `dst`, owning both until done (any element
    /// types: a byte copy). An empty `src` completes at once.
    fn memcpy_owned<D, S>(&self, dst: D, src: S) -> Result<Transfer<D, S>, Refused<D, S>>
    where
        D: MemoryMut + Send + 'static,
        S: Memory + Send + 'static,
    {
        if src.raw().len == 0 {
            // Nothing to copy: no request, the buffers come straight back.
            return Ok(Transfer {
                lent: Lent::done((dst, src)),
            });
        }
        let len = src.raw().len;
        lend(self, dst, src, len, |e, d, s| {
            // SAFETY: `lend` calls this with the lent buffers' raw views.
            unsafe { e.submit_memcpy(d, s, len) }
        })
    }
}

/// The owned copy of [`EngineExt::copy_owned`], without the typed-buffer check.
fn lend_copy<E, D, S>(
    engine: &E,
    dst: D,
    dst_layout: &Layout,
    src: S,
    src_layout: &Layout,
) -> Result<Transfer<D, S>, Refused<D, S>>
where
    E: Engine + ?Sized,
    D: MemoryMut + Send + 'static,
    S: Memory + Send + 'static,
{
    let bytes = src_layout.size_bytes();
    lend(engine, dst, src, bytes, |e, d, s| {
        // SAFETY: `lend` calls this with the lent buffers' raw views.
        unsafe { e.submit_copy(d, dst_layout, s, src_layout) }
    })
}

/// The buffers lent for the copy `submit` makes of their raw views (`bytes` long), handed back
/// with its error if it is refused. `submit` must only submit over the views it is given: their
/// memory stays valid and untouched until the request completed (`Lent::submit`).
fn lend<E, D, S>(
    engine: &E,
    dst: D,
    src: S,
    bytes: usize,
    submit: impl FnOnce(&E, RawBuf, RawBuf) -> Result<Request, SubmitError>,
) -> Result<Transfer<D, S>, Refused<D, S>>
where
    E: Engine + ?Sized,
    D: MemoryMut + Send + 'static,
    S: Memory + Send + 'static,
{
    // A copy the engine runs to its end in submit (a small CPU copy) keeps its buffers where
    // they are: nothing allocated, shared or tracked (issue 32).
    let inline = bytes <= engine.inline_bytes();
    let lent = Lent::submit((dst, src), inline, |b| {
        submit(engine, b.0.raw_mut(), b.1.raw()).map(|req| (req, ()))
    });
    match lent {
        Ok((lent, ())) => Ok(Transfer { lent }),
        Err((error, (dst, src))) => Err(Refused { error, dst, src }),
    }
}

/// The typed-buffer check of the safe API: the layouts of a copy or a fill fit the elements of
/// their buffers: whole elements ([`Layout::check_elem`]) of the type a typed layout was made
/// for ([`Layout::check_elem_type`]). Other operators check their own.
fn check_elems(op: &Op, dst: Elem, src: Option<Elem>) -> Result<(), SubmitError> {
    match op {
        Op::Copy { dst: dl, src: sl } => check_copy(dl, dst, sl, src.unwrap_or(BYTES)),
        Op::Fill { dst: dl, .. } => Ok(check_held(dl, dst).map_err(OpError::Dst)?),
        _ => Ok(()),
    }
}

/// True for a built-in copy or fill whose layouts hold no element, checked as any request is
/// (layouts inside their buffers, element sizes, shapes: one empty side beside a non-empty one is
/// a shape mismatch): the safe API completes it at once, without a request to the engine.
/// False for anything else, unchecked (the engine checks it).
fn nothing_to_do(op: &Op, dst_len: usize, src_len: Option<usize>) -> Result<bool, SubmitError> {
    let empty = match op {
        Op::Copy { dst, src } => dst.is_empty() || src.is_empty(),
        Op::Fill { dst, .. } => dst.is_empty(),
        _ => false,
    };
    if !empty {
        return Ok(false);
    }
    let prog = op.lower(dst_len, src_len)?;
    Ok(prog.steps().is_empty())
}

/// A buffer's element size and type name ([`Memory::elem_size`], [`Memory::elem_type`]).
type Elem = (usize, Option<&'static str>);

/// The element of untyped memory.
const BYTES: Elem = (1, None);

/// `m`'s [`Elem`].
#[inline]
pub(crate) fn elem<M: Memory + ?Sized>(m: &M) -> Elem {
    (m.elem_size(), m.elem_type())
}

/// Checks that a buffer of `elem` elements holds `l`: whole elements, and the type `l` was
/// made for, if any.
#[inline]
pub(crate) fn check_held(l: &Layout, (size, ty): Elem) -> Result<(), crate::LayoutError> {
    l.check_elem(size)?;
    if size > 1 {
        l.check_elem_type(ty)?;
    }
    Ok(())
}

/// [`check_elems`] of a copy between these layouts.
#[inline]
fn check_copy(
    dst: &Layout,
    dst_elem: Elem,
    src: &Layout,
    src_elem: Elem,
) -> Result<(), SubmitError> {
    check_held(dst, dst_elem).map_err(OpError::Dst)?;
    Ok(check_held(src, src_elem).map_err(OpError::Src)?)
}

impl<E: Engine + ?Sized> EngineExt for E {}

impl<'a> dyn Engine + 'a {
    /// [`EngineExt::scope`] on an engine behind `&dyn Engine` (the trait's method needs a
    /// sized engine, to hand the scope a `&dyn Engine`; this one already has it). Same
    /// contract: `f`'s error, else the barrier's failures converted into `E`, else `f`'s value.
    ///
    /// ```
    /// use ferry::{CpuEngine, Engine, EngineExt};
    /// let cpu = CpuEngine::new(1)?;
    /// let engine: &dyn Engine = &cpu;
    /// let (src, mut dst) = (vec![1u8; 8], vec![0u8; 8]);
    /// engine.scope(|s| -> ferry::Result<()> {
    ///     s.memcpy(&mut dst, &src)?;
    ///     Ok(())
    /// })?;
    /// let (dst, _src) = engine.memcpy_owned(dst, src)?.wait()?; // owned copies work too
    /// assert_eq!(dst, [1; 8]);
    /// # Ok::<(), ferry::Error>(())
    /// ```
    pub fn scope<'env, T, E>(
        &'env self,
        f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<BarrierError>,
    {
        run_scope(self, f)
    }
}

/// The one body of both `scope`s: a scope over `engine`, run by [`ScopeCore::run`].
///
/// Inlined into the caller, with `ScopeCore::run`: out of line, each moved the caller's closure
/// (its captures, just written by the caller in 8-byte stores) with 16-byte loads that cannot
/// take it from the store buffer, a store-forwarding stall on every scope; a 4 KiB `memcpy` in a
/// scope whose closure captured two reborrowed slices took 50 ns against `copy_from_slice`'s 29
/// on the 2-core host, 40 ns inlined (issue 32).
#[inline(always)]
fn run_scope<'env, T, E: From<BarrierError>>(
    engine: &'env dyn Engine,
    f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<T, E>,
) -> Result<T, E> {
    let scope = Scope {
        engine,
        core: ScopeCore::new(),
        enqueued: AtomicBool::new(false),
    };
    // What this thread enqueued and did not flush starts at the body's end (a wait on it
    // would not hang meanwhile, only return later than it could: `Engine::enqueue`).
    let flush = || {
        if scope.enqueued.load(Ordering::Relaxed) {
            scope.engine.flush();
        }
    };
    // Matched per variant, not moved whole: the body's `Ok(())` is an 8-byte tag written
    // just before, and a move of the whole `Result` (`ferry::Error` makes it 80 bytes) reads
    // it back in 16-byte loads that cannot take it from the store buffer: a store-forwarding
    // stall on every scope (issue 32: the 4 KiB copy's largest cost after the copy itself).
    scope.core.run(|| match f(&scope) {
        Ok(v) => {
            flush();
            Ok(v)
        }
        Err(e) => {
            flush();
            Err(e)
        }
    })
}

/// A job refused at submit, with the buffers handed back. An [`Error`](std::error::Error)
/// (its Debug form leaves the buffers out) that converts into [`ferry::Error`](crate::Error),
/// so `?` works in a function returning either; the buffers are dropped then.
pub struct Refused<D, S> {
    /// Why.
    pub error: SubmitError,
    /// The destination buffer, untouched.
    pub dst: D,
    /// The source buffer.
    pub src: S,
}

/// A failed transfer, with the buffers handed back. An [`Error`](std::error::Error) (its
/// Debug form leaves the buffers out) that converts into [`ferry::Error`](crate::Error), so
/// `transfer.wait()?` works in a function returning either; the buffers are dropped then.
pub struct Failed<D, S> {
    /// Why.
    pub error: RequestError,
    /// The destination buffer (its contents are unspecified).
    pub dst: D,
    /// The source buffer, unchanged.
    pub src: S,
}

/// Display, Debug (without the buffers, which may be large), `Error` and the conversion into
/// [`crate::Error`] of a handed-back failure.
macro_rules! handed_back_error {
    ($name:ident) => {
        impl<D, S> std::fmt::Debug for $name<D, S> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("error", &self.error)
                    .field("dst", &std::any::type_name::<D>())
                    .field("src", &std::any::type_name::<S>())
                    .finish()
            }
        }
        impl<D, S> std::fmt::Display for $name<D, S> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.error.fmt(f)
            }
        }
        impl<D, S> std::error::Error for $name<D, S> {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.error)
            }
        }
    };
}
handed_back_error!(Refused);
handed_back_error!(Failed);

/// An owned transfer in flight. [`Transfer::wait`] (or `.await`) hands the buffers back.
///
/// Dropping a `Transfer` blocks until the copy completes (the buffers cannot be freed under
/// it), then drops the buffers; its failure, if any, is then reported by the engine's next
/// [`barrier`](Engine::barrier). To let a copy run on without waiting, keep the `Transfer`
/// (in a collection, a task) and wait later; [`std::mem::forget`] is the only detach that
/// never blocks, and it leaks the buffers (never frees them under the copy).
#[must_use = "dropping a Transfer blocks until the copy completes; call .wait() or .await it"]
pub struct Transfer<D, S> {
    lent: Lent<(D, S)>,
}

impl<D, S> std::fmt::Debug for Transfer<D, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer")
            .field("request", &self.lent.request())
            .field("done", &self.is_done())
            .finish()
    }
}

impl<D, S> Transfer<D, S> {
    /// Blocks until the copy completes and returns the buffers.
    pub fn wait(self) -> Result<(D, S), Failed<D, S>> {
        let (bufs, r) = self.lent.wait();
        finish(bufs, r)
    }
    /// True once the copy completed. Never blocks.
    pub fn is_done(&self) -> bool {
        self.lent.is_done()
    }
}

fn finish<D, S>((dst, src): (D, S), r: Result<(), RequestError>) -> Result<(D, S), Failed<D, S>> {
    match r {
        Ok(()) => Ok((dst, src)),
        Err(error) => Err(Failed { error, dst, src }),
    }
}

impl<D: Unpin, S: Unpin> Future for Transfer<D, S> {
    type Output = Result<(D, S), Failed<D, S>>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut()
            .lent
            .poll(cx)
            .map(|(bufs, r)| finish(bufs, r))
    }
}

/// Buffers lent to an engine from submit until the request completed: what [`Transfer`] and
/// [`FileTransfer`](crate::file::FileTransfer) are made of. The buffers are leaked from a Box
/// while the request runs (no Box, which asserts unique access, exists meanwhile) and rebuilt
/// only once it completed: handed back by [`Lent::wait`] or [`Lent::poll`], or dropped after a
/// wait in Drop. Forgetting a `Lent` leaks them, never frees them under the work.
pub(crate) struct Lent<T> {
    req: Option<Request>,
    bufs: Held<T>,
    _own: PhantomData<T>,
}

/// Where a [`Lent`]'s buffers are.
enum Held<T> {
    /// From `Box::leak`; rebuilt into a Box (in `take`) once, after the request completed.
    Leaked(NonNull<T>),
    /// No work on them: held here, no allocation ([`Lent::done`]).
    Here(T),
    /// Handed back.
    Taken,
}

// SAFETY: a Lent owns the buffers (as a Box would); the engine's access to them ends before
// they are handed back or dropped.
unsafe impl<T: Send> Send for Lent<T> {}
// SAFETY: `&Lent` gives no access to the buffers.
unsafe impl<T> Sync for Lent<T> {}

impl<T> Lent<T> {
    /// Lends `bufs` to the request that `submit` makes over their memory (plus anything else
    /// `submit` returns). The memory stays valid, and nothing but that request touches it,
    /// until the request completed: `submit` may rely on that to call an engine's `unsafe`
    /// submit. Refused: the error and the buffers come back.
    pub(crate) fn submit<X, E>(
        bufs: T,
        inline: bool,
        submit: impl FnOnce(&mut T) -> Result<(Request, X), E>,
    ) -> Result<(Lent<T>, X), (E, T)> {
        if inline {
            return Lent::submit_here(bufs, submit);
        }
        let ptr = NonNull::from(Box::leak(Box::new(bufs)));
        // SAFETY: just leaked from a Box: valid, and not aliased during the call.
        match submit(unsafe { &mut *ptr.as_ptr() }) {
            Ok((req, x)) => Ok((
                Lent {
                    req: Some(req),
                    bufs: Held::Leaked(ptr),
                    _own: PhantomData,
                },
                x,
            )),
            // SAFETY: refused, so nothing uses the buffers; from Box::leak just above, once.
            Err(e) => Err((e, *unsafe { Box::from_raw(ptr.as_ptr()) })),
        }
    }

    /// [`Lent::submit`] of work expected to complete inside `submit` (`inline`: an engine's
    /// [`Engine::inline_bytes`]): the buffers stay where they are (no allocation), and a
    /// request that comes back pending anyway is waited before they move (its result kept in
    /// it, for the transfer's wait or the barrier).
    fn submit_here<X, E>(
        mut bufs: T,
        submit: impl FnOnce(&mut T) -> Result<(Request, X), E>,
    ) -> Result<(Lent<T>, X), (E, T)> {
        match submit(&mut bufs) {
            Ok((req, x)) => {
                if !req.is_done_ok() {
                    // Not moved while the request may use them.
                    let _ = req.settle_keep();
                }
                let lent = Lent {
                    req: Some(req),
                    bufs: Held::Here(bufs),
                    _own: PhantomData,
                };
                Ok((lent, x))
            }
            Err(e) => Err((e, bufs)),
        }
    }

    /// Buffers with no work on them (an empty copy, or one that ran at submit): handed back as
    /// they are.
    pub(crate) fn done(bufs: T) -> Lent<T> {
        Lent {
            req: None,
            bufs: Held::Here(bufs),
            _own: PhantomData,
        }
    }

    /// The request, until its result was taken (`None` for [`Lent::done`]).
    pub(crate) fn request(&self) -> Option<&Request> {
        self.req.as_ref()
    }

    /// Blocks until the request completes; hands the buffers back with its result.
    pub(crate) fn wait(mut self) -> (T, Result<(), RequestError>) {
        let r = self.req.take().map_or(Ok(()), Request::wait);
        (self.take(), r)
    }

    /// `Some(result)` once complete, `None` while in flight; never blocks. The buffers stay
    /// lent until [`Lent::wait`].
    pub(crate) fn try_wait(&mut self) -> Option<Result<(), RequestError>> {
        self.req.as_mut().map_or(Some(Ok(())), Request::try_wait)
    }

    /// True once the request completed. Never blocks.
    pub(crate) fn is_done(&self) -> bool {
        self.req.as_ref().is_none_or(Request::is_done)
    }

    /// Polls the request; once complete, hands the buffers back with its result.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<(T, Result<(), RequestError>)> {
        let r = match self.req.as_mut() {
            Some(req) => match Pin::new(req).poll(cx) {
                Poll::Ready(r) => r,
                Poll::Pending => return Poll::Pending,
            },
            None => Ok(()),
        };
        self.req = None;
        Poll::Ready((self.take(), r))
    }

    /// The buffers, once the request completed (`req` is `None`).
    fn take(&mut self) -> T {
        match std::mem::replace(&mut self.bufs, Held::Taken) {
            // SAFETY: the request completed, so nothing else uses the buffers; the pointer
            // came from Box::leak and is taken (here or in Drop) once.
            Held::Leaked(b) => *unsafe { Box::from_raw(b.as_ptr()) },
            Held::Here(b) => b,
            Held::Taken => unreachable!("lent buffers are handed back once"),
        }
    }
}

impl<T> Drop for Lent<T> {
    fn drop(&mut self) {
        if let Some(req) = self.req.take() {
            // The error is not lost: an unobserved failure is reported by the engine's barrier.
            let _ = req.settle_keep();
        }
        if let Held::Leaked(b) = std::mem::replace(&mut self.bufs, Held::Taken) {
            // SAFETY: the request completed (waited above or before); from Box::leak, once.
            drop(unsafe { Box::from_raw(b.as_ptr()) });
        }
    }
}

/// What every scope of borrowed buffers is made of ([`Scope`], and the NCCL engine's
/// [`NcclScope`](crate::engine::nccl::NcclScope)): the requests it submitted, all waited for
/// before the borrows end. `'scope` is the borrows' lifetime and `'env` the environment's; both
/// are invariant, as in [`std::thread::Scope`], so that a buffer handed to the scope stays
/// borrowed until [`ScopeCore::run`] returns.
pub(crate) struct ScopeCore<'scope, 'env: 'scope> {
    inflight: InFlight,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl ScopeCore<'_, '_> {
    /// A scope with no requests yet.
    pub(crate) fn new() -> Self {
        ScopeCore {
            inflight: InFlight::new(),
            _scope: PhantomData,
            _env: PhantomData,
        }
    }

    /// Tracks a request over the scope's borrowed buffers: [`ScopeCore::run`] waits for it.
    pub(crate) fn track(&self, req: &Request) {
        self.inflight.track(req);
    }

    /// Runs `body` (the user's closure over the scope), then waits for every tracked request
    /// and reports every failure not already seen through `wait`/`try_wait`. Returns `body`'s
    /// error if it returned one (the requests are still waited for), else the barrier's
    /// failures converted into `E`, else `body`'s value. Waits even if `body` unwinds (the
    /// panic goes on; the failures are not reported then). May block.
    ///
    /// Inlined, as `run_scope` (no move of the body's closure).
    #[inline(always)]
    pub(crate) fn run<T, E: From<BarrierError>>(
        &self,
        body: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        // Waits even if `body` unwinds: the borrows end only after every request is done.
        struct WaitAll<'a>(&'a InFlight);
        impl Drop for WaitAll<'_> {
            fn drop(&mut self) {
                let _ = self.0.barrier();
            }
        }
        let guard = WaitAll(&self.inflight);
        // Per variant, as `run_scope` (no move of the whole `Result`).
        match body() {
            Ok(v) => {
                std::mem::forget(guard);
                self.inflight.barrier()?;
                Ok(v)
            }
            Err(e) => {
                std::mem::forget(guard);
                let _ = self.inflight.barrier();
                Err(e)
            }
        }
    }
}

/// A scope whose requests borrow buffers; see [`EngineExt::scope`].
pub struct Scope<'scope, 'env: 'scope> {
    engine: &'env dyn Engine,
    core: ScopeCore<'scope, 'env>,
    /// Set by [`Scope::enqueue`]: the scope's end flushes the engine (on the scope's thread).
    enqueued: AtomicBool,
}

impl<'scope> Scope<'scope, '_> {
    /// Submits a job over borrowed buffers: the general form of the methods below. A layout
    /// that a typed buffer cannot hold ([`Layout::check_elem`]) is refused.
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
        self.submit_job(dst, src, op, after, false)
    }

    /// [`Scope::submit`] of a job that more work follows, through the engine's
    /// [`Engine::enqueue`]: its start may be held until this thread's next [`Scope::flush`]
    /// (or the scope's end, where the scope's own thread enqueued it), so that an engine can
    /// start a batch once (the CUDA engine marks its end once: no event per request). The
    /// request is one like any: waiting on it, polling it or depending on it never hangs for
    /// want of a flush. An engine that holds nothing (the CPU engine) starts it at once.
    ///
    /// ```
    /// use ferry::{CpuEngine, EngineExt, Layout, Op};
    /// let engine = CpuEngine::new(2)?;
    /// let src: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 4096]).collect();
    /// let mut dst = vec![vec![0u8; 4096]; 4];
    /// let l = Layout::bytes(4096)?;
    /// engine.scope(|s| -> ferry::Result<()> {
    ///     for (d, x) in dst.iter_mut().zip(&src) {
    ///         drop(s.enqueue(d, Some(x), Op::Copy { dst: l, src: l }, &[])?);
    ///     }
    ///     s.flush(); // the batch starts (the scope's end would flush it too)
    ///     Ok(())
    /// })?;
    /// assert_eq!(dst, src);
    /// # Ok::<(), ferry::Error>(())
    /// ```
    pub fn enqueue<D, S>(
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
        self.enqueued.store(true, Ordering::Relaxed);
        self.submit_job(dst, src, op, after, true)
    }

    /// Starts what this thread [enqueued](Scope::enqueue) on the scope's engine
    /// ([`Engine::flush`]). Never blocks on the work.
    pub fn flush(&self) {
        self.engine.flush();
    }

    /// The body of [`Scope::submit`] (`more`: false) and [`Scope::enqueue`] (true).
    fn submit_job<D, S>(
        &self,
        dst: &'scope mut D,
        src: Option<&'scope S>,
        op: Op,
        after: &[&Request],
        more: bool,
    ) -> Result<Request, SubmitError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        check_elems(&op, elem(dst), src.map(elem))?;
        // No element and nothing to wait for: done (with dependencies, the engine orders it).
        if after.is_empty() && nothing_to_do(&op, dst.raw().len, src.map(|s| s.raw().len))? {
            return Ok(Request::ready(Ok(())));
        }
        let job = Job {
            dst: dst.raw_mut(),
            src: src.map(|s| s.raw()),
            op,
            after: after.iter().map(|r| r.share()).collect(),
        };
        // SAFETY: `dst` is mutably and `src` immutably borrowed for 'scope, which ends only
        // after `scope()` has waited for every request tracked here, so the memory stays valid
        // and nothing else touches it while the request runs.
        let req = unsafe {
            if more {
                self.engine.enqueue(job)
            } else {
                self.engine.submit_raw(job)
            }
        };
        self.tracked(req)
    }

    /// A request just submitted over buffers borrowed for `'scope`, tracked (the scope waits
    /// for it before the borrows end); a refusal passed on. A copy that ran at submit is handed
    /// on rebuilt from its id, nothing tracked: the engine's result (written through memory by
    /// a call through `dyn Engine`) is read field by field, never moved whole (issue 32: a
    /// move of the whole `Result` read it back wider than the engine had stored it, a
    /// store-forwarding stall, twice a copy).
    #[inline(always)]
    fn tracked(&self, req: Result<Request, SubmitError>) -> Result<Request, SubmitError> {
        if let Ok(r) = &req {
            if r.is_done_ok() {
                return Ok(Request::done_with_id(r.id()));
            }
        }
        self.track_pending(req)
    }

    /// [`Scope::tracked`] of a request still pending, or of a refusal: out of line, so that
    /// the path of a copy that ran at submit stays small.
    #[inline(never)]
    fn track_pending(&self, req: Result<Request, SubmitError>) -> Result<Request, SubmitError> {
        if let Ok(r) = &req {
            self.core.track(r);
        }
        req
    }

    /// Copies `src_layout` of `src` into `dst_layout` of `dst`. Two empty layouts (a dim of
    /// extent 0) complete at once, checked like any; one empty beside a non-empty one is a
    /// shape mismatch.
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
        check_copy(dst_layout, elem(dst), src_layout, elem(src))?;
        if dst_layout.is_empty() || src_layout.is_empty() {
            // No element: checked, then done at once (one empty side is a shape mismatch).
            crate::op::checked_run(dst_layout, src_layout, dst.raw().len, src.raw().len)?;
            return Ok(Request::ready(Ok(())));
        }
        self.submit_copy(dst, dst_layout, src, src_layout)
    }

    /// A copy without the typed-buffer check, through [`Engine::submit_copy`] (no job built
    /// where the engine needs none).
    fn submit_copy<D, S>(
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
        // SAFETY: as in `submit_job`: both buffers are borrowed for 'scope, which ends only
        // after the scope has waited for every request tracked here.
        self.tracked(unsafe {
            self.engine
                .submit_copy(dst.raw_mut(), dst_layout, src.raw(), src_layout)
        })
    }

    /// Copies all of `src`'s bytes into the start of `dst` (error if `dst` is shorter); any
    /// element types (a byte copy). An empty `src` completes at once.
    pub fn memcpy<D, S>(&self, dst: &'scope mut D, src: &'scope S) -> Result<Request, SubmitError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        if src.raw().len == 0 {
            // An empty copy has nothing to do.
            return Ok(Request::ready(Ok(())));
        }
        // A small copy the engine runs in submit (the CPU engine's) comes back done: no request
        // allocated nor tracked, no layout built (issue 32).
        let len = src.raw().len;
        // SAFETY: as in `submit_job`: both buffers are borrowed for 'scope, which ends only
        // after the scope has waited for every request tracked here.
        self.tracked(unsafe { self.engine.submit_memcpy(dst.raw_mut(), src.raw(), len) })
    }

    /// Writes `pattern` (one element) into every element of `layout` in `dst`; an empty layout
    /// completes at once.
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
    /// engine.scope(|s| -> ferry::Result<()> { Ok(s.segments(&mut dst, &src, segs)?.wait()?) })?;
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

    /// Tracks a request over buffers borrowed for `'scope` (the CUDA interop's
    /// [`Scope::copy_to_device`]): the scope waits for it before the borrows end.
    pub(crate) fn track(&self, req: &Request) {
        self.core.track(req);
    }

    /// The engine this scope submits to.
    pub fn engine(&self) -> &dyn Engine {
        self.engine
    }
}
