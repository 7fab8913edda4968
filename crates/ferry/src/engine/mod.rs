//! The engine trait and the job descriptor every backend takes.
//!
//! One trait, [`Engine`], for every backend: [`cpu`] (a thread pool; the reference), `cuda`
//! (the GPU's copy engines), and [`multiplex`] (several engines behind one). Each backend folder
//! has the same file names. A backend that is absent at run time is reported by its probe, not
//! by a panic.
//!
//! Engines take a [`Job`] through the `unsafe` [`Engine::submit_raw`]; users call the safe
//! wrappers in [`EngineExt`] (scoped borrows, or owned buffers handed back on completion).

mod contract;
pub mod cpu;
pub mod cuda;
pub mod multiplex;
pub mod nccl;
mod safe;

pub(crate) use contract::check_bufs;
pub use contract::{Backend, Engine, Job, SubmitError};
pub use safe::{EngineExt, Failed, Refused, Scope, Transfer};
pub(crate) use safe::{Lent, ScopeCore};
