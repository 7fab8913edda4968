//! The README's tour names files; this test keeps it true in both directions: every repository
//! path the README writes in backticks exists, and so does every file a tour paragraph names
//! relative to the folder it introduced just before; and the tour names every source folder
//! of the crates and every source file of more than [`NAMED_LINES`] lines.

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

/// Source files longer than this must be named in the tour.
const NAMED_LINES: usize = 200;

/// Everything the README names, resolved: the paths (files and folders), how many spans were
/// checked, and the spans that name nothing that exists.
fn named() -> (Vec<PathBuf>, usize, Vec<String>) {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let tour = readme
        .split("## A newcomer's tour")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .expect("the README has a tour section");
    let mut checked = 0;
    let mut missing = Vec::new();
    let mut named = Vec::new();
    // Full paths anywhere in the README.
    for span in code_spans(&readme) {
        let span = span.split_whitespace().next().unwrap_or("");
        if TOP.iter().any(|t| span.starts_with(t)) && !span.contains('*') {
            checked += 1;
            if !root.join(span).exists() {
                missing.push(span.to_string());
            }
            named.push(root.join(span));
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
                match found {
                    Some(p) => named.push(p),
                    None => missing.push(format!(
                        "{span} (in the paragraph on {:?})",
                        folders.first()
                    )),
                }
            }
        }
    }
    (named, checked, missing)
}

#[test]
fn every_path_the_readme_names_exists() {
    let (_, checked, missing) = named();
    assert!(checked > 60, "only {checked} paths found in the README");
    assert!(
        missing.is_empty(),
        "README names paths that do not exist: {missing:?}"
    );
}

/// Every folder under `crates/*/src`, and every `.rs` file there of more than [`NAMED_LINES`]
/// lines. Unit tests moved out of their file (`tests.rs`, and a folder that holds only that)
/// are not: the tour says once where they sit.
fn must_be_named(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let tests_only = |d: &Path| {
            std::fs::read_dir(d)
                .unwrap()
                .flatten()
                .all(|f| f.file_name() == "tests.rs")
        };
        if p.is_dir() {
            if !tests_only(&p) {
                out.push(p.clone());
            }
            must_be_named(&p, out);
        } else if p.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        } else if p.extension().is_some_and(|x| x == "rs")
            && std::fs::read_to_string(&p).map_or(0, |t| t.lines().count()) > NAMED_LINES
        {
            out.push(p);
        }
    }
}

#[test]
fn the_tour_names_every_folder_and_every_large_file() {
    let root = root();
    let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let (named, _, _) = named();
    let named: Vec<PathBuf> = named.iter().map(|p| canon(p)).collect();
    let mut want = Vec::new();
    for e in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let src = e.path().join("src");
        if src.is_dir() {
            must_be_named(&src, &mut want);
        }
    }
    assert!(
        want.len() > 40,
        "only {} folders and files found",
        want.len()
    );
    let mut unnamed: Vec<String> = want
        .iter()
        .filter(|p| !named.contains(&canon(p)))
        .map(|p| p.strip_prefix(&root).unwrap_or(p).display().to_string())
        .collect();
    unnamed.sort();
    assert!(
        unnamed.is_empty(),
        "the README's tour names none of these ({}):\n{}",
        unnamed.len(),
        unnamed.join("\n")
    );
}
