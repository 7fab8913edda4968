//! The bottom of the CUDA engine: the driver's entry points ([`driver`]), memory of every kind
//! ([`memory`]), errors that keep the driver's code ([`error`]), the capability probe
//! ([`probe`]) and NVRTC programs ([`program`]). The only layer that calls the driver's unsafe
//! functions directly besides the mechanisms' own launches; it imports nothing above it.

pub(crate) mod driver;
pub(crate) mod error;
pub(crate) mod memory;
pub(crate) mod probe;
pub(crate) mod program;
