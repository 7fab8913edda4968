//! AML's utilities (`aml/utils/*.h`, included by `aml.h`): the bitmap, the vector, the queue
//! and the version. The header-only pieces (`AML_INNER_MALLOC*` and the counting macros of
//! `aml/utils/macros.h`) have no Rust side.

pub mod bitmap;
pub mod queue;
pub mod vector;
pub mod version;
