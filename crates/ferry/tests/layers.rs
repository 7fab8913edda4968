//! The layer order of `crates/ferry/src`, checked: every source file's imports (its `use`
//! lines, and the `crate::…` / `super::…` paths written out in its code) are resolved to the
//! file that defines the name, through every re-export on the way (a `pub use` in a `mod.rs`
//! counts as an import of the file that defines the name, as the issue that asked for this
//! test says). Then:
//!
//! - no import loop anywhere in the crate: the graph of files has no cycle;
//! - in `engine/cuda/`, imports point down the layers written in [`CUDA_LAYERS`] (every
//!   exception listed when the test fails);
//! - the pipeline (`pipeline/`) imports none of the CUDA engine's copy mechanisms
//!   (`engine/cuda/paths/`, neither a name they define nor one they re-export): the staging it
//!   shares with them lives in `staging/`.
//!
//! Test code (`tests.rs` files and `#[cfg(test)] mod tests { … }` blocks) may import anything
//! and is left out. A failure prints every offending edge with the file and the name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The CUDA engine's layers, bottom first: a file may import files of its own layer or of a
/// lower one. Matched by the longest prefix of the path below `engine/cuda/`.
const CUDA_LAYERS: &[(&str, &[&str])] = &[
    ("sys", &["sys/"]),
    ("config", &["config/"]),
    ("route", &["route.rs", "route/"]),
    ("completion", &["completion/"]),
    ("paths", &["paths/"]),
    ("submit", &["lanes.rs", "submit.rs"]),
    ("engine", &["engine.rs"]),
    ("top", &["interop.rs", "multi.rs", "mod.rs"]),
];

/// One source file: its module path and its text with comments and test code removed.
struct Source {
    rel: String,
    module: Vec<String>,
    code: String,
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn sources() -> Vec<Source> {
    let mut files = Vec::new();
    walk(&src_dir(), &mut files);
    files.sort();
    let root = src_dir();
    files
        .into_iter()
        .filter_map(|p| {
            let rel = p
                .strip_prefix(&root)
                .ok()?
                .to_string_lossy()
                .replace('\\', "/");
            let mut module: Vec<String> = rel
                .trim_end_matches(".rs")
                .split('/')
                .map(str::to_owned)
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            if module.last().is_some_and(|m| m == "tests") {
                return None;
            }
            let text = std::fs::read_to_string(&p).ok()?;
            Some(Source {
                rel,
                module,
                code: strip_tests(&strip_comments(&text)),
            })
        })
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src is readable").flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text without `//` and `/* */` comments and without string literals' contents.
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'"' && !(i > 0 && b[i - 1] == b'\'') {
            // A string literal (raw strings of this crate hold no quote): skipped whole.
            let raw = i > 0 && b[i - 1] == b'r';
            out.push('"');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' && !raw {
                    i += 1;
                }
                i += 1;
            }
            out.push('"');
            i += 1;
        } else {
            let ch = text[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// The code without test-only items: those under a `#[cfg(..)]` that names `test` and not as
/// `not(test)` (`#[cfg(test)]`, `#[cfg(all(test, loom))]`): a test module or function.
fn strip_tests(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(") {
        let attr_end = rest[at..].find(']').map_or(rest.len(), |e| at + e + 1);
        let attr = &rest[at..attr_end];
        let test_only = find_word(attr, "test").is_some() && !attr.contains("not(test)");
        if !test_only {
            out.push_str(&rest[..attr_end]);
            rest = &rest[attr_end..];
            continue;
        }
        out.push_str(&rest[..at]);
        let after = &rest[attr_end..];
        // The item ends at its closing brace, or at a `;` before any brace (`mod tests;`).
        let (semi, open) = (after.find(';'), after.find('{'));
        let end = match (semi, open) {
            (Some(s), Some(o)) if s < o => s + 1,
            (_, Some(o)) => {
                let mut depth = 0;
                let mut end = after.len();
                for (k, c) in after[o..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = o + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (Some(s), None) => s + 1,
            (None, None) => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// A `use` statement's paths, expanded: `a::{b, c::{d as e}}` gives `a::b` and `a::c::d`
/// (with `e`). `self` inside braces names the prefix itself.
fn expand(tree: &str) -> Vec<(Vec<String>, Option<String>)> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    expand_into(&tree, &[], &mut out);
    out
}

fn expand_into(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let mut p = prefix.to_vec();
        p.extend(
            head.split("::")
                .filter(|s| !s.is_empty())
                .map(|s| s.trim().to_owned()),
        );
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        for part in split_top(inner) {
            expand_into(part, &p, out);
        }
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim().to_owned())),
        None => (tree, None),
    };
    let mut p = prefix.to_vec();
    for seg in path.split("::").map(str::trim) {
        if seg != "self" || p.is_empty() {
            p.push(seg.to_owned());
        }
    }
    out.push((p, alias));
}

/// `a, b::{c, d}, e` split at the commas outside braces.
fn split_top(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Every `use` statement of the code: (its expanded paths, whether it is one).
fn uses(code: &str) -> Vec<(Vec<String>, Option<String>)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let after = &rest[at + 3..];
        let end = after.find(';').unwrap_or(after.len());
        out.extend(expand(&after[..end]));
        rest = &after[end..];
    }
    out
}

/// The next occurrence of `word` as a whole word.
fn find_word(s: &str, word: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(k) = s[from..].find(word) {
        let at = from + k;
        let before = at.checked_sub(1).map(|i| b[i]);
        let after = b.get(at + word.len()).copied();
        let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        if !before.is_some_and(ident) && !after.is_some_and(ident) && before != Some(b':') {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// The `crate::…` and `super::…` paths written out in the code outside `use` statements.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut outside = String::new();
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        outside.push_str(&rest[..at]);
        let after = &rest[at..];
        rest = &after[after.find(';').map_or(after.len(), |e| e + 1)..];
    }
    outside.push_str(rest);
    for start in ["crate::", "super::"] {
        let mut s = outside.as_str();
        while let Some(k) = find_word(s, start.trim_end_matches("::")) {
            let tail = &s[k..];
            if !tail.starts_with(start) {
                s = &s[k + 1..];
                continue;
            }
            let len = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            let path: Vec<String> = tail[..len]
                .split("::")
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect();
            out.push(path);
            s = &tail[len..];
        }
    }
    out
}

struct Crate {
    /// Module path -> index of its file.
    modules: BTreeMap<Vec<String>, usize>,
    files: Vec<Source>,
    /// Per file: the names its `use` statements bring in, with their absolute paths.
    imports: Vec<BTreeMap<String, Vec<String>>>,
}

impl Crate {
    fn load() -> Crate {
        let files = sources();
        let modules = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.module.clone(), i))
            .collect();
        let mut c = Crate {
            modules,
            imports: Vec::new(),
            files,
        };
        c.imports = (0..c.files.len())
            .map(|i| {
                let mut m = BTreeMap::new();
                for (path, alias) in uses(&c.files[i].code) {
                    if let Some(abs) = c.absolute(i, &path) {
                        let name = alias.unwrap_or_else(|| abs.last().cloned().unwrap_or_default());
                        m.insert(name, abs);
                    }
                }
                m
            })
            .collect();
        c
    }

    /// `path` as written in file `i`, from the crate root; `None` outside this crate.
    fn absolute(&self, i: usize, path: &[String]) -> Option<Vec<String>> {
        let mut here = self.files[i].module.clone();
        let mut segs = path.iter().peekable();
        match segs.peek().map(|s| s.as_str()) {
            Some("crate") => {
                segs.next();
                here.clear();
            }
            Some("super") => {
                while segs.peek().is_some_and(|s| *s == "super") {
                    segs.next();
                    here.pop();
                }
            }
            Some("self") => {
                segs.next();
            }
            Some(first) => {
                let mut child = here.clone();
                child.push(first.to_owned());
                if !self.modules.contains_key(&child) {
                    return None; // an external crate, or a name of an inline module
                }
            }
            None => return None,
        }
        here.extend(segs.cloned());
        Some(here)
    }

    /// The file that defines the item at absolute `path` (following re-exports), and the
    /// name as defined there.
    fn defining(&self, path: &[String], depth: usize) -> Option<usize> {
        if depth > 16 {
            return None;
        }
        // The longest prefix that is a module of its own file.
        let mut k = path.len();
        while k > 0 && !self.modules.contains_key(&path[..k]) {
            k -= 1;
        }
        let file = *self.modules.get(&path[..k])?;
        if k == path.len() {
            return Some(file);
        }
        match self.imports[file].get(&path[k]) {
            Some(target) if target.as_slice() != &path[..=k] => {
                let mut next = target.clone();
                next.extend(path[k + 1..].iter().cloned());
                self.defining(&next, depth + 1).or(Some(file))
            }
            _ => Some(file),
        }
    }

    /// Every edge: (from file, to file, the path as resolved).
    fn edges(&self) -> BTreeSet<(usize, usize, String)> {
        let mut out = BTreeSet::new();
        for i in 0..self.files.len() {
            let mut paths: Vec<Vec<String>> = self.imports[i].values().cloned().collect();
            for p in inline_paths(&self.files[i].code) {
                if let Some(abs) = self.absolute(i, &p) {
                    paths.push(abs);
                }
            }
            for p in paths {
                if let Some(j) = self.defining(&p, 0) {
                    if j != i {
                        out.insert((i, j, p.join("::")));
                    }
                }
            }
        }
        out
    }
}

/// Strongly connected components of more than one file (Tarjan).
fn cycles(n: usize, edges: &BTreeSet<(usize, usize, String)>) -> Vec<Vec<usize>> {
    let mut adj = vec![Vec::new(); n];
    for (a, b, _) in edges {
        adj[*a].push(*b);
    }
    struct T<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(t: &mut T<'_>, v: usize) {
        t.index[v] = Some(t.next);
        t.low[v] = t.next;
        t.next += 1;
        t.stack.push(v);
        t.on[v] = true;
        for k in 0..t.adj[v].len() {
            let w = t.adj[v][k];
            match t.index[w] {
                None => {
                    visit(t, w);
                    t.low[v] = t.low[v].min(t.low[w]);
                }
                Some(iw) if t.on[w] => t.low[v] = t.low[v].min(iw),
                _ => {}
            }
        }
        if Some(t.low[v]) == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        adj: &adj,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_import_loop_in_the_crate() {
    let c = Crate::load();
    assert!(c.files.len() > 50, "found {} source files", c.files.len());
    let edges = c.edges();
    let loops = cycles(c.files.len(), &edges);
    let mut report = String::new();
    for comp in &loops {
        let members: BTreeSet<usize> = comp.iter().copied().collect();
        report.push_str("loop:\n");
        for (a, b, name) in &edges {
            if members.contains(a) && members.contains(b) {
                report.push_str(&format!(
                    "  {} -> {} ({name})\n",
                    c.files[*a].rel, c.files[*b].rel
                ));
            }
        }
    }
    assert!(loops.is_empty(), "{} import loops:\n{report}", loops.len());
}

/// The layer of a file below `engine/cuda/`, by [`CUDA_LAYERS`].
fn cuda_layer(rel: &str) -> Option<usize> {
    let below = rel.strip_prefix("engine/cuda/")?;
    let mut best: Option<(usize, usize)> = None;
    for (rank, (_, prefixes)) in CUDA_LAYERS.iter().enumerate() {
        for p in prefixes.iter() {
            if below.starts_with(p) && best.is_none_or(|(len, _)| p.len() > len) {
                best = Some((p.len(), rank));
            }
        }
    }
    Some(
        best.unwrap_or_else(|| panic!("engine/cuda/{below} is in no layer of CUDA_LAYERS"))
            .1,
    )
}

#[test]
fn cuda_imports_point_down() {
    let c = Crate::load();
    let mut up = Vec::new();
    for (a, b, name) in c.edges() {
        let (ra, rb) = (&c.files[a].rel, &c.files[b].rel);
        if let (Some(la), Some(lb)) = (cuda_layer(ra), cuda_layer(rb)) {
            if lb > la {
                up.push(format!(
                    "  {ra} ({}) -> {rb} ({}): {name}",
                    CUDA_LAYERS[la].0, CUDA_LAYERS[lb].0
                ));
            }
        }
    }
    assert!(
        up.is_empty(),
        "{} imports in engine/cuda point up:\n{}",
        up.len(),
        up.join("\n")
    );
}

#[test]
fn the_pipeline_imports_no_cuda_mechanism() {
    let c = Crate::load();
    let mut into = Vec::new();
    for (a, b, name) in c.edges() {
        let (ra, rb) = (&c.files[a].rel, &c.files[b].rel);
        // Through the mechanisms' folder by name (a re-export there) or by definition.
        let named = name.starts_with("engine::cuda::paths::");
        if ra.starts_with("pipeline/") && (named || rb.starts_with("engine/cuda/paths/")) {
            into.push(format!("  {ra} -> {rb}: {name}"));
        }
    }
    assert!(
        into.is_empty(),
        "{} imports from pipeline/ into engine/cuda/paths/ (the shared staging policy and \
         workers are in staging/):\n{}",
        into.len(),
        into.join("\n")
    );
}

#[test]
fn the_parser_expands_use_trees() {
    let got = expand("super::{a, b::{self, c as d}, e::*}");
    let names: Vec<String> = got.iter().map(|(p, _)| p.join("::")).collect();
    assert_eq!(
        names,
        ["super::a", "super::b", "super::b::c", "super::e::*"]
    );
    assert_eq!(got[2].1.as_deref(), Some("d"));
    let code = strip_tests(&strip_comments(
        "use x::y; // use z::w;\n#[cfg(test)]\nmod tests { use q::r; }\n#[cfg(all(test, loom))]\nmod m { use s::t; }\n#[cfg(not(test))]\nuse u::v;\nfn f() { crate::a::b(); }",
    ));
    assert_eq!(uses(&code).len(), 2);
    assert_eq!(inline_paths(&code), vec![vec!["crate", "a", "b"]]);
}
