//! Fuzz target: the CLI's parsing of size sweeps (`--sizes`) and test names (`--test`).
//! Never panics; accepted sweeps are non-empty, positive, and (for ranges) doubling and
//! inside the range; an unknown test name is reported with the list of valid names.
#![no_main]

use ferry_cli::bench::{registry, select, EngineSel};
use ferry_cli::sizes::parse_sizes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(sizes) = parse_sizes(text) {
        assert!(!sizes.is_empty() && sizes.iter().all(|&s| s > 0), "{text:?} -> {sizes:?}");
        if text.contains("..") {
            assert!(sizes.windows(2).all(|w| w[1] == w[0] * 2), "{text:?} -> {sizes:?}");
        } else {
            let mut dedup = sizes.clone();
            dedup.sort_unstable();
            dedup.dedup();
            assert_eq!(dedup.len(), sizes.len(), "{text:?}: duplicates kept");
        }
    }
    for engine in [EngineSel::Cpu, EngineSel::Cuda, EngineSel::All] {
        match select(Some(text), engine) {
            Ok(sel) => {
                let names: Vec<&str> = text.split(',').map(str::trim).collect();
                for t in sel.run.iter() {
                    assert!(names.contains(&t.name), "{text:?} selected {}", t.name);
                }
            }
            Err(e) => {
                let msg = e.to_string();
                for t in registry() {
                    assert!(msg.contains(t.name), "{msg} lacks {}", t.name);
                }
            }
        }
    }
});
