//! The `ferry` command-line tool as a library: `ferry info`, `ferry bench`, `ferry load` and
//! `ferry save`.
//!
//! The binary (`src/main.rs`) only parses arguments and calls into these modules, so the
//! same code is reachable from tests.

pub mod args;
pub mod bench;
pub mod gantt;
pub mod info;
pub mod load;
pub mod plot;
pub mod report;
pub mod signal;
pub mod sizes;
