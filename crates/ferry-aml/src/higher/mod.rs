//! AML's higher modules (`aml/higher/*.h`): the allocators.

pub mod allocator;
