//! C ABI for ferry, shaped like AML's DMA interface (`aml_dma_*`).
//!
//! The header is `include/ferry.h` (hand-written; a test checks that it declares exactly the
//! functions exported here). The model is AML's: a *dma* (an engine) creates *requests* from a
//! destination, a source, two *layouts* and an *operator*; requests are waited, polled or
//! destroyed one by one, and a *barrier* waits for everything. What differs from AML:
//!
//! - every argument is checked in every build and a bad one returns a negative `FERRY_E*` code,
//!   with a readable message from [`ferry_last_error_message`];
//! - waiting for a request waits for that request only, and each request keeps its own error;
//! - a barrier returns the number of failed requests and each failure can be fetched with
//!   [`ferry_dma_barrier_failure`];
//! - operators are typed handles (`FERRY_OP_COPY`, `FERRY_OP_MEMCPY`, `FERRY_OP_FILL`, or a
//!   user operator built from a callback table), the same on every engine; a NULL operator is
//!   `-FERRY_EINVAL`;
//! - no Rust panic crosses the boundary: every entry point catches it and returns
//!   `-FERRY_EPANIC`.
//!
//! Every `extern "C"` function is `unsafe`: it dereferences pointers that only the C caller can
//! vouch for. Their `# Safety` lists state what the caller must guarantee.

mod agent;
mod blocks;
mod checkpoint;
mod dma;
mod error;
mod layout;
mod op;
mod request;
#[cfg(test)]
mod tests;

pub use agent::*;
pub use blocks::*;
pub use checkpoint::*;
pub use dma::*;
pub use error::*;
pub use layout::*;
pub use op::*;
pub use request::*;
