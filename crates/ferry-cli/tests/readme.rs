//! The README's tour names files; this test keeps it true: every repository path the README
//! writes in backticks exists, and so does every file a tour paragraph names relative to the
//! folder it introduced just before.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The spans of `text` between backticks.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

const TOP: [&str; 7] = [
    "crates/",
    "bench/",
    "docs/",
    "scripts/",
    "fuzz/",
    "examples/",
    ".ci/",
];

#[test]
fn every_path_the_readme_names_exists() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let tour = readme
        .split("## A newcomer's tour")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .expect("the README has a tour section");
    let mut checked = 0;
    let mut missing = Vec::new();
    // Full paths anywhere in the README.
    for span in code_spans(&readme) {
        let span = span.split_whitespace().next().unwrap_or("");
        if TOP.iter().any(|t| span.starts_with(t)) && !span.contains('*') {
            checked += 1;
            if !root.join(span).exists() {
                missing.push(span.to_string());
            }
        }
    }
    // In the tour, a paragraph names folders, then files in them by bare names: each bare
    // name must be in one of the folders named before it in the paragraph (or their `src/`).
    for para in tour.split("\n\n") {
        let mut folders: Vec<PathBuf> = Vec::new();
        for span in code_spans(para) {
            if span.contains(' ') || span.contains("::") || span.contains('*') {
                continue;
            }
            if TOP.iter().any(|t| span.starts_with(t)) {
                let p = root.join(span);
                folders.push(if span.ends_with('/') {
                    p
                } else {
                    p.parent().map_or(p.clone(), Path::to_path_buf)
                });
            } else if span.ends_with(".rs") || span.ends_with('/') {
                checked += 1;
                let name = span.trim_end_matches('/');
                let found = folders
                    .iter()
                    .rev()
                    .flat_map(|d| [d.join(name), d.join("src").join(name)])
                    .find(|p| p.exists());
                if let (Some(dir), true) = (&found, span.ends_with('/')) {
                    // A sub-folder named bare: the names after it may be inside it.
                    folders.push(dir.clone());
                }
                if found.is_none() {
                    missing.push(format!(
                        "{span} (in the paragraph on {:?})",
                        folders.first()
                    ));
                }
            }
        }
    }
    assert!(checked > 60, "only {checked} paths found in the README");
    assert!(
        missing.is_empty(),
        "README names paths that do not exist: {missing:?}"
    );
}
