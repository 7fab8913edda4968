//! A request's one-word handle ([`Handle`]) to its shared allocation ([`Shared`]), or, for a
//! request that succeeded at submit, its id alone.
//!
//! Why one word: a [`Request`](super::Request) was a fat `Option<Arc<Shared<dyn Completion>>>`
//! and an id (24 bytes). A request that succeeded at submit (a small copy run on the caller's
//! thread) wrote only the pointer's null word and the id, and the safe scope moved it on with
//! 16-byte loads over the pointer's two words: the load found one fresh 8-byte store and one
//! stale word, could not be forwarded from the store, and waited for it to retire (a
//! store-forwarding stall: on the 2-core machine `perf` put 73% of `run_scope`'s samples, 16% of
//! a 4 KiB scoped copy's, on that load; issue 32). A one-word handle moves in one register.
//!
//! Written by hand: a thin pointer to a trait object needs its vtable inside the allocation,
//! which no well-kept crate provides for an `Arc` with a typed handle kept beside it (the CUDA
//! engine keeps `Arc<Shared<CudaCompletion>>` for its queues and waiter thread). Every `unsafe`
//! of the request layer is here.

use super::completion::{next_id, Completion, Observed};
use std::num::NonZeroU64;
use std::sync::Arc;

/// One allocation per request: the header first (`repr(C)`: at offset 0 whatever `C` is, so a
/// pointer to the header is a pointer to the whole), the engine's completion inline.
#[repr(C)]
pub(crate) struct Shared<C> {
    head: Head,
    completion: C,
}

/// What a handle reads without knowing the completion's type.
pub(crate) struct Head {
    /// How to reach the completion and count references, for this allocation's `C`.
    vt: &'static VTable,
    pub(crate) observed: Observed,
    pub(crate) id: u64,
}

/// The operations a [`Handle`] needs of a `Shared<C>` whose `C` it does not know.
struct VTable {
    /// The completion of the `Shared<C>` whose header this is.
    completion: unsafe fn(*const Head) -> *const dyn Completion,
    /// One more strong reference to the allocation.
    retain: unsafe fn(*const Head),
    /// One strong reference fewer (the last frees it).
    release: unsafe fn(*const Head),
}

impl<C: Completion> Shared<C> {
    const VT: VTable = VTable {
        completion: completion_of::<C>,
        retain: retain::<C>,
        release: release::<C>,
    };

    /// A request's shared part around `completion`, with the next request id.
    pub(crate) fn new(completion: C) -> Shared<C> {
        Shared {
            head: Head {
                vt: &Self::VT,
                observed: Observed::default(),
                id: next_id(),
            },
            completion,
        }
    }
}

impl<C> Shared<C> {
    /// The engine's completion.
    pub(crate) fn completion(&self) -> &C {
        &self.completion
    }
}

/// # Safety
/// `p` is the header of a live `Shared<C>`.
unsafe fn completion_of<C: Completion>(p: *const Head) -> *const dyn Completion {
    // SAFETY: `p` is at offset 0 of a live `Shared<C>` (`repr(C)`, the header first), so the
    // cast names the whole allocation (the caller's contract).
    let s = unsafe { &*p.cast::<Shared<C>>() };
    &s.completion as &dyn Completion
}

/// # Safety
/// `p` is the header of a `Shared<C>` held by an `Arc` (from `Arc::into_raw`), still alive.
unsafe fn retain<C>(p: *const Head) {
    // SAFETY: the pointer came from `Arc::<Shared<C>>::into_raw` and a strong reference to it is
    // held (the caller's contract).
    unsafe { Arc::increment_strong_count(p.cast::<Shared<C>>()) }
}

/// # Safety
/// As [`retain`], and the caller gives up the strong reference it held.
unsafe fn release<C>(p: *const Head) {
    // SAFETY: as `retain`; the reference released is the caller's own.
    unsafe { Arc::decrement_strong_count(p.cast::<Shared<C>>()) }
}

/// A request's handle: a strong reference to its `Shared<C>` (an even word: the header's
/// address), or (odd) the id of a request that succeeded at submit, which has no allocation.
pub(crate) struct Handle(NonZeroU64);

impl Handle {
    /// The handle of an allocation the engine made (and may keep handles to).
    pub(crate) fn shared<C: Completion>(s: Arc<Shared<C>>) -> Handle {
        // The address keeps the whole allocation's provenance (exposed: `Handle::ptr` takes it
        // back), not only the header's.
        let addr = Arc::into_raw(s).cast::<Head>().expose_provenance();
        // The header holds a reference and a u64: its address is even (never a done handle's
        // odd word) and an `Arc`'s is never 0.
        debug_assert!(addr % 2 == 0);
        Handle(NonZeroU64::new(addr as u64).expect("an Arc's address is never 0"))
    }

    /// The handle of a request that succeeded at submit with this id (below 2^63: ids count up
    /// from 1 in blocks of 1,024).
    #[inline]
    pub(crate) fn done(id: u64) -> Handle {
        Handle(NonZeroU64::MIN | (id << 1))
    }

    /// True for a request that succeeded at submit.
    #[inline]
    pub(crate) fn is_done_ok(&self) -> bool {
        self.0.get() & 1 == 1
    }

    /// The allocation (a pointer to its header, with the whole allocation's provenance: the
    /// vtable's functions reach the completion through it), unless the request succeeded at
    /// submit.
    #[inline]
    fn ptr(&self) -> Option<*const Head> {
        (!self.is_done_ok()).then(|| std::ptr::with_exposed_provenance(self.0.get() as usize))
    }

    /// The header, unless the request succeeded at submit.
    #[inline]
    fn head(&self) -> Option<&Head> {
        // SAFETY: an even word is the header of a `Shared` this handle holds a strong reference
        // to (`Handle::shared`), alive as long as the handle.
        self.ptr().map(|p| unsafe { &*p })
    }

    /// The request's id.
    #[inline]
    pub(crate) fn id(&self) -> u64 {
        match self.head() {
            Some(h) => h.id,
            None => self.0.get() >> 1,
        }
    }

    /// The header and the engine's completion, unless the request succeeded at submit.
    #[inline]
    pub(crate) fn parts(&self) -> Option<(&Head, &dyn Completion)> {
        let p = self.ptr()?;
        // SAFETY: `p` is the header of the live `Shared<C>` its vtable was made for (the
        // pointer `Handle::shared` exposed); the completion lives as long as the allocation,
        // which this handle keeps.
        let (h, c) = unsafe { (&*p, &*((*p).vt.completion)(p)) };
        Some((h, c))
    }
}

impl Clone for Handle {
    #[inline]
    fn clone(&self) -> Handle {
        if let Some(p) = self.ptr() {
            // SAFETY: this handle holds a strong reference to the allocation whose header `p` is.
            unsafe { ((*p).vt.retain)(p) };
        }
        Handle(self.0)
    }
}

impl Drop for Handle {
    #[inline]
    fn drop(&mut self) {
        if let Some(p) = self.ptr() {
            // SAFETY: the strong reference this handle held to the allocation whose header `p`
            // is, given up once (the handle goes).
            unsafe { ((*p).vt.release)(p) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::completion::DoneOk;

    #[test]
    fn a_handle_is_one_word_and_frees_its_allocation_once() {
        assert_eq!(std::mem::size_of::<Handle>(), 8);
        assert_eq!(std::mem::size_of::<Option<Handle>>(), 8);
        let s = Arc::new(Shared::new(DoneOk));
        let (id, freed) = (s.head.id, Arc::downgrade(&s));
        let kept = Arc::clone(&s);
        let h = Handle::shared(s);
        assert!(!h.is_done_ok());
        assert_eq!(h.id(), id);
        let (head, c) = h.parts().expect("a shared handle has parts");
        assert_eq!(head.id, id);
        assert!(c.as_any().is::<DoneOk>(), "the completion's own type");
        let h2 = h.clone();
        assert_eq!(Arc::strong_count(&kept), 3);
        drop(h);
        drop(h2);
        assert_eq!(Arc::strong_count(&kept), 1);
        drop(kept);
        assert_eq!(freed.strong_count(), 0, "freed by the last reference");
        assert!(freed.upgrade().is_none());
    }

    #[test]
    fn a_done_handle_keeps_its_id_and_has_no_parts() {
        for id in [1, 2, 1023, 1 << 40, (1 << 63) - 1] {
            let h = Handle::done(id);
            assert!(h.is_done_ok());
            assert_eq!(h.id(), id);
            assert!(h.parts().is_none());
            let c = h.clone();
            assert_eq!(c.id(), id);
        }
    }
}
