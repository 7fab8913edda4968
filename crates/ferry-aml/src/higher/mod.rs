//! AML's higher modules (`aml/higher/*.h`): the allocators and the mappers.

pub mod allocator;
pub mod mapper;
