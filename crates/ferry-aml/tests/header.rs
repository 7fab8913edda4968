//! The headers are hand-written: they must declare exactly what libaml exports (the
//! `#[no_mangle]` functions and objects of the sources), and the constants must have the
//! library's values. (scripts/aml-ctest.sh compiles them as C11 and C++11 with -Werror.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            files(&p, ext, out);
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Names after `#[no_mangle]` (an `extern "C" fn` or a `static`).
fn exported() -> BTreeSet<String> {
    let mut srcs = Vec::new();
    files(&root().join("src"), "rs", &mut srcs);
    let mut names = BTreeSet::new();
    for f in srcs {
        let text = std::fs::read_to_string(&f).expect("read source");
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, l) in lines.iter().enumerate() {
            if *l != "#[no_mangle]" {
                continue;
            }
            let decl = lines.get(i + 1).copied().unwrap_or("");
            for key in ["extern \"C\" fn ", "static "] {
                if let Some(p) = decl.find(key) {
                    names.insert(ident(&decl[p + key.len()..]).to_string());
                    break;
                }
            }
        }
    }
    names
}

/// The headers without comments and preprocessor lines, joined.
fn header_code() -> String {
    let mut hs = Vec::new();
    files(&root().join("include"), "h", &mut hs);
    let mut code = String::new();
    for h in hs {
        let text = std::fs::read_to_string(&h).expect("read header");
        let mut rest = text.as_str();
        let mut out = String::new();
        while let Some(i) = rest.find("/*") {
            out.push_str(&rest[..i]);
            rest = rest[i..].find("*/").map_or("", |j| &rest[i + j + 2..]);
        }
        out.push_str(rest);
        let mut in_macro = false;
        for l in out.lines() {
            let t = l.trim_start();
            if t.starts_with('#') || in_macro {
                in_macro = l.trim_end().ends_with('\\');
                continue;
            }
            code.push_str(l);
            code.push('\n');
        }
    }
    code
}

/// `aml_*` names (and the low-level buddy allocator's `buddy_allocator_*`, which AML exports
/// too, and libaml's `excit_*`) declared as functions (`name(` not after `(*`) or `extern`
/// objects.
fn declared() -> BTreeSet<String> {
    let code = header_code();
    let mut names = BTreeSet::new();
    let starts = code
        .match_indices("aml_")
        .chain(code.match_indices("buddy_allocator_"))
        .chain(code.match_indices("excit_"));
    for (i, _) in starts {
        let b = code.as_bytes();
        if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
            continue;
        }
        let name = ident(&code[i..]);
        let after = code[i + name.len()..].trim_start();
        let before = code[..i].trim_end();
        let stmt = code[..i].rsplit([';', '{', '}']).next().unwrap_or("");
        let is_fn = after.starts_with('(') && !before.ends_with("(*") && !before.ends_with('(');
        let is_obj = after.starts_with(';') && stmt.contains("extern");
        if is_fn || is_obj {
            names.insert(name.to_string());
        }
    }
    names
}

#[test]
fn headers_declare_exactly_the_exported_symbols() {
    let (exp, dec) = (exported(), declared());
    let missing: Vec<_> = exp.difference(&dec).collect();
    let extra: Vec<_> = dec.difference(&exp).collect();
    assert!(missing.is_empty(), "exported but not declared: {missing:?}");
    assert!(extra.is_empty(), "declared but not exported: {extra:?}");
    assert!(exp.len() > 80, "{} symbols", exp.len());
}

#[test]
fn constants_have_the_library_values() {
    let mut hs = Vec::new();
    files(&root().join("include"), "h", &mut hs);
    let text: String = hs
        .iter()
        .map(|h| std::fs::read_to_string(h).expect("read"))
        .collect();
    let want: &[(&str, i64)] = &[
        ("AML_SUCCESS", aml::error::AML_SUCCESS as i64),
        ("AML_FAILURE", aml::error::AML_FAILURE as i64),
        ("AML_ENOMEM", aml::error::AML_ENOMEM as i64),
        ("AML_EINVAL", aml::error::AML_EINVAL as i64),
        ("AML_EDOM", aml::error::AML_EDOM as i64),
        ("AML_ENOTSUP", aml::error::AML_ENOTSUP as i64),
        ("AML_EBUSY", aml::error::AML_EBUSY as i64),
        ("AML_EPERM", aml::error::AML_EPERM as i64),
        (
            "AML_AREA_CUDA_FLAG_DEFAULT",
            aml::area::AML_AREA_CUDA_FLAG_DEFAULT as i64,
        ),
    ];
    for (name, v) in want {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("{name} not defined"));
        let val: i64 = line
            .split_whitespace()
            .nth(2)
            .and_then(|x| x.parse().ok())
            .expect("value");
        assert_eq!(val, *v, "{name}");
    }
    for (name, v) in [
        (
            "AML_LAYOUT_ORDER_ROW_MAJOR (1 << 0)",
            aml::layout::AML_LAYOUT_ORDER_ROW_MAJOR,
        ),
        (
            "AML_LAYOUT_ORDER_COLUMN_MAJOR (0 << 0)",
            aml::layout::AML_LAYOUT_ORDER_COLUMN_MAJOR,
        ),
        (
            "AML_AREA_CUDA_FLAG_ALLOC_HOST (1 << 0)",
            aml::area::AML_AREA_CUDA_FLAG_ALLOC_HOST,
        ),
        (
            "AML_AREA_CUDA_FLAG_ALLOC_UNIFIED (1 << 1)",
            aml::area::AML_AREA_CUDA_FLAG_ALLOC_UNIFIED,
        ),
        (
            "AML_AREA_CUDA_FLAG_ALLOC_MAPPED (1 << 2)",
            aml::area::AML_AREA_CUDA_FLAG_ALLOC_MAPPED,
        ),
        (
            "AML_AREA_CUDA_FLAG_ALLOC_GLOBAL (1 << 3)",
            aml::area::AML_AREA_CUDA_FLAG_ALLOC_GLOBAL,
        ),
        ("AML_BACKEND_CUDA (1UL << 2)", aml::AML_BACKEND_CUDA as i32),
    ] {
        assert!(text.contains(&format!("#define {name}")), "{name}");
        let shift: i32 = name
            .rsplit("<< ")
            .next()
            .and_then(|x| x.trim_end_matches(')').parse().ok())
            .expect("shift");
        let base: i32 = if name.contains("(0 <<") { 0 } else { 1 };
        assert_eq!(base << shift, v, "{name}");
    }
}
