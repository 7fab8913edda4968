//! Layout constructors and transformations from arbitrary input: never panic, and every layout
//! they return satisfies the invariants in `common::check_layout` (span exact and in bounds,
//! element count consistent, walk agrees with offset_of, the density and overlap predicates
//! are true of the elements), and each transformation moves exactly the elements it should.
#![no_main]

#[path = "common/mod.rs"]
mod common;

use common::{check_layout, check_transform, Ctor, LOp};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Ctor, Vec<LOp>)| {
    let (ctor, ops) = input;
    let Ok(mut l) = ctor.build() else { return };
    check_layout(&l);
    for op in ops.iter().take(8) {
        if let Ok(out) = op.apply(&l) {
            check_layout(&out);
            check_transform(&l, op, &out);
            l = out;
        }
    }
});
