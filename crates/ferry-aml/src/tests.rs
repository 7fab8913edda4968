//! Unit tests through the C ABI (the C programs in `tests/c/` cover the rest).
