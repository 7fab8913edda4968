//! AML's higher modules (`aml/higher/*.h`): the allocators, the mappers, the replicaset.

pub mod allocator;
pub mod mapper;
pub mod replicaset;
