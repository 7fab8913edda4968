//! AML's utilities (`aml/utils/*.h`, included by `aml.h`): the bitmap, the vector, the queue,
//! the version, the task scheduler and the Linux backend's setup. The header-only pieces (`AML_INNER_MALLOC*`, the
//! counting macros of `aml/utils/macros.h`, the feature macros of `aml/utils/features.h`)
//! have no Rust side.

pub mod backend;
pub mod bitmap;
pub mod queue;
pub mod sched;
pub mod vector;
pub mod version;
