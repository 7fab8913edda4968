//! Memory kinds and the raw views engines work on.
//!
//! Engines see a buffer as a [`RawBuf`]: an address, a length and a [`MemKind`]. The safe API
//! takes anything that implements [`Memory`] (read) or [`MemoryMut`] (write): slices, arrays
//! and `Vec`s of [`bytemuck::Pod`] element types here (the numeric primitives, `half::f16` and
//! `bf16` with `half`'s `bytemuck` feature, a user's `#[repr(C)]` struct that implements `Pod`),
//! and the CUDA buffer types (pinned, registered, mapped, device, managed) in
//! [`crate::engine::cuda`].

mod aligned;
mod raw;

pub use aligned::{AlignedBuffer, AllocError};

pub(crate) use raw::{first_overlap, RegionMut};
pub use raw::{MemKind, Memory, MemoryMut, RawBuf, Region};
