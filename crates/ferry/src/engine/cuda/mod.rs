//! The CUDA engine (cudarc, loaded at run time). Placeholder until the CUDA engine lands.

pub mod gather;
pub mod staged;
