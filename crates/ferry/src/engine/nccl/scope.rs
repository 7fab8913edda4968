//! The NCCL engine's scope: sends and receives over borrowed buffers, on the safe API's
//! [`ScopeCore`] (every request waited for before the borrows end, even if the closure
//! panics; unobserved failures reported), as [`EngineExt::scope`](crate::EngineExt::scope).

use super::engine::NcclEngine;
use super::error::NcclError;
use super::submit::{P2p, P2pKind};
use crate::engine::ScopeCore;
use crate::memory::{Memory, MemoryMut};
use crate::request::{BarrierError, Request};
use std::marker::PhantomData;

impl NcclEngine {
    /// Runs `f` with a scope whose sends and receives borrow buffers; waits for every request
    /// of the scope before returning (even if `f` panics) and reports unobserved failures.
    /// As [`EngineExt::scope`](crate::EngineExt::scope), `f` returns a `Result` whose error
    /// takes the barrier's (`E: From<BarrierError>`), and the scope returns `f`'s error, else
    /// the barrier's failures converted into `E`, else `f`'s value: one `?` for both.
    ///
    /// A buffer handed to the scope stays borrowed until the scope has waited for every
    /// request (as with [`EngineExt::scope`](crate::EngineExt::scope)):
    ///
    /// ```compile_fail
    /// use ferry::engine::nccl::NcclEngine;
    /// use ferry::cuda::DeviceBuffer;
    /// fn f(engine: &NcclEngine, mut inbox: DeviceBuffer) {
    ///     let _ = engine.scope(|s| -> ferry::Result<()> {
    ///         s.recv(&mut inbox, 64, 0)?;
    ///         let _ = inbox.len(); // error: `inbox` is mutably borrowed by the receive
    ///         Ok(())
    ///     });
    /// }
    /// ```
    pub fn scope<'env, T, E: From<BarrierError>>(
        &'env self,
        f: impl for<'scope> FnOnce(&'scope NcclScope<'scope, 'env>) -> Result<T, E>,
    ) -> Result<T, E> {
        let scope = NcclScope {
            engine: self,
            core: ScopeCore::new(),
        };
        scope.core.run(|| f(&scope))
    }
}

/// A scope of borrowed sends and receives; see [`NcclEngine::scope`].
pub struct NcclScope<'scope, 'env: 'scope> {
    engine: &'env NcclEngine,
    core: ScopeCore<'scope, 'env>,
}

/// The operations of one group, collected by [`NcclScope::group`].
pub struct Group<'scope> {
    ops: Vec<P2p>,
    _scope: PhantomData<&'scope mut &'scope ()>,
}

impl<'scope> Group<'scope> {
    /// Sends the first `bytes` bytes of `buf` to rank `peer`.
    pub fn send<B: Memory + ?Sized>(&mut self, buf: &'scope B, bytes: usize, peer: u32) {
        self.ops.push(P2p {
            kind: P2pKind::Send,
            buf: buf.raw(),
            bytes,
            peer,
        });
    }
    /// Receives `bytes` bytes from rank `peer` into the start of `buf`.
    pub fn recv<B: MemoryMut + ?Sized>(&mut self, buf: &'scope mut B, bytes: usize, peer: u32) {
        self.ops.push(P2p {
            kind: P2pKind::Recv,
            buf: buf.raw_mut(),
            bytes,
            peer,
        });
    }
}

impl<'scope> NcclScope<'scope, '_> {
    /// Submits the sends and receives `f` adds, as one NCCL group (one request).
    pub fn group(&self, f: impl FnOnce(&mut Group<'scope>)) -> Result<Request, NcclError> {
        self.group_after(&[], f)
    }
    /// As [`group`](Self::group), started only after `after` complete (see
    /// [`NcclEngine::submit_raw`]; a CUDA engine's request is waited on the GPU, not here).
    pub fn group_after(
        &self,
        after: &[&Request],
        f: impl FnOnce(&mut Group<'scope>),
    ) -> Result<Request, NcclError> {
        let mut g = Group {
            ops: Vec::new(),
            _scope: PhantomData,
        };
        f(&mut g);
        // SAFETY: every buffer is borrowed for 'scope (shared for sends, exclusive for
        // receives), which ends only after the scope waited for every request tracked here.
        let req = unsafe { self.engine.submit_raw(&g.ops, after)? };
        self.core.track(&req);
        Ok(req)
    }
    /// Sends the first `bytes` bytes of `buf` to rank `peer`.
    pub fn send<B: Memory + ?Sized>(
        &self,
        buf: &'scope B,
        bytes: usize,
        peer: u32,
    ) -> Result<Request, NcclError> {
        self.group(|g| g.send(buf, bytes, peer))
    }
    /// Receives `bytes` bytes from rank `peer` into the start of `buf`.
    pub fn recv<B: MemoryMut + ?Sized>(
        &self,
        buf: &'scope mut B,
        bytes: usize,
        peer: u32,
    ) -> Result<Request, NcclError> {
        self.group(|g| g.recv(buf, bytes, peer))
    }
}
