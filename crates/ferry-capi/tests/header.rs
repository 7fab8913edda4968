//! `include/ferry.h` is hand-written; these tests keep it honest: it declares exactly the
//! functions and objects the library exports (checked against the sources and, where `nm` is
//! installed, against the static library's symbol table), its constants have the library's
//! values, and it compiles as C and C++ with warnings as errors.

mod support;

use std::collections::BTreeSet;
use std::process::Command;

fn header() -> String {
    std::fs::read_to_string(support::repo_root().join("crates/ferry-capi/include/ferry.h"))
        .expect("read ferry.h")
}

/// The header without comments and preprocessor lines.
fn header_code() -> String {
    let h = header();
    let mut out = String::new();
    let mut rest = h.as_str();
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = rest[i..].find("*/").map_or("", |j| &rest[i + j + 2..]);
    }
    out.push_str(rest);
    out.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(s: &str, start: usize) -> &str {
    let end = s[start..]
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(s.len(), |e| start + e);
    &s[start..end]
}

/// `ferry_*` names declared as functions (`name(` not preceded by `(*`) or extern objects.
fn header_symbols() -> BTreeSet<String> {
    let code = header_code();
    let mut names = BTreeSet::new();
    for (i, _) in code.match_indices("ferry_") {
        if i > 0
            && (code.as_bytes()[i - 1].is_ascii_alphanumeric() || code.as_bytes()[i - 1] == b'_')
        {
            continue;
        }
        let name = ident_at(&code, i);
        let after = code[i + name.len()..].trim_start();
        let before = code[..i].trim_end();
        let is_fn = after.starts_with('(') && !before.ends_with("(*");
        let is_extern_obj = after.starts_with(';')
            && code[..i]
                .rsplit(';')
                .next()
                .is_some_and(|d| d.contains("extern"));
        if is_fn || is_extern_obj {
            names.insert(name.to_string());
        }
    }
    names
}

/// Names the sources export: `#[no_mangle]` followed by an `extern "C" fn` or a `static`.
fn source_symbols() -> BTreeSet<String> {
    let src = support::repo_root().join("crates/ferry-capi/src");
    let mut names = BTreeSet::new();
    for e in std::fs::read_dir(src).expect("read src/") {
        let text = std::fs::read_to_string(e.expect("dir entry").path()).expect("read source");
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, l) in lines.iter().enumerate() {
            if *l != "#[no_mangle]" {
                continue;
            }
            let decl = lines.get(i + 1).copied().unwrap_or("");
            let name = if let Some(p) = decl.find("extern \"C\" fn ") {
                ident_at(decl, p + "extern \"C\" fn ".len())
            } else if let Some(p) = decl.find("static ") {
                ident_at(decl, p + "static ".len())
            } else {
                panic!("#[no_mangle] on an unexpected item: {decl}")
            };
            names.insert(name.to_string());
        }
    }
    names
}

#[test]
fn header_declares_exactly_the_exported_symbols() {
    let h = header_symbols();
    let s = source_symbols();
    assert!(
        s.len() >= 30,
        "found only {} exported symbols: {s:?}",
        s.len()
    );
    let missing: Vec<_> = s.difference(&h).collect();
    let extra: Vec<_> = h.difference(&s).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "exported but not in ferry.h: {missing:?}; in ferry.h but not exported: {extra:?}"
    );
}

#[test]
fn staticlib_exports_what_the_header_declares() {
    if !Command::new("nm")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        println!("skipped: nm not installed");
        return;
    }
    let lib = support::staticlib();
    let out = Command::new("nm")
        .args(["-g", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("run nm");
    assert!(
        out.status.success(),
        "nm {}: {}",
        lib.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let exported: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|n| n.starts_with("ferry_"))
        .map(str::to_string)
        .collect();
    assert_eq!(
        exported,
        header_symbols(),
        "nm {} vs ferry.h",
        lib.display()
    );
}

#[test]
fn header_constants_match_the_library() {
    use ferry_capi::*;
    let rust: Vec<(&str, i64)> = vec![
        ("FERRY_SUCCESS", FERRY_SUCCESS.into()),
        ("FERRY_EINVAL", FERRY_EINVAL.into()),
        ("FERRY_ELAYOUT", FERRY_ELAYOUT.into()),
        ("FERRY_ESHAPE", FERRY_ESHAPE.into()),
        ("FERRY_EOVERLAP", FERRY_EOVERLAP.into()),
        ("FERRY_EUNSUPPORTED", FERRY_EUNSUPPORTED.into()),
        ("FERRY_ENOTAVAIL", FERRY_ENOTAVAIL.into()),
        ("FERRY_ESHUTDOWN", FERRY_ESHUTDOWN.into()),
        ("FERRY_EDRIVER", FERRY_EDRIVER.into()),
        ("FERRY_EREQUEST", FERRY_EREQUEST.into()),
        ("FERRY_EOP", FERRY_EOP.into()),
        ("FERRY_EPANIC", FERRY_EPANIC.into()),
        ("FERRY_MAX_DIMS", FERRY_MAX_DIMS as i64),
        ("FERRY_ORDER_ROW_MAJOR", FERRY_ORDER_ROW_MAJOR.into()),
        ("FERRY_ORDER_COLUMN_MAJOR", FERRY_ORDER_COLUMN_MAJOR.into()),
        ("FERRY_MEM_PAGEABLE", FERRY_MEM_PAGEABLE.into()),
        ("FERRY_MEM_PINNED", FERRY_MEM_PINNED.into()),
        ("FERRY_MEM_MAPPED", FERRY_MEM_MAPPED.into()),
        ("FERRY_MEM_DEVICE", FERRY_MEM_DEVICE.into()),
        ("FERRY_MEM_MANAGED", FERRY_MEM_MANAGED.into()),
        ("FERRY_DTYPE_ANY", FERRY_DTYPE_ANY.into()),
        ("FERRY_DTYPE_BOOL", FERRY_DTYPE_BOOL.into()),
        ("FERRY_DTYPE_U8", FERRY_DTYPE_U8.into()),
        ("FERRY_DTYPE_I8", FERRY_DTYPE_I8.into()),
        ("FERRY_DTYPE_I16", FERRY_DTYPE_I16.into()),
        ("FERRY_DTYPE_U16", FERRY_DTYPE_U16.into()),
        ("FERRY_DTYPE_F16", FERRY_DTYPE_F16.into()),
        ("FERRY_DTYPE_BF16", FERRY_DTYPE_BF16.into()),
        ("FERRY_DTYPE_I32", FERRY_DTYPE_I32.into()),
        ("FERRY_DTYPE_U32", FERRY_DTYPE_U32.into()),
        ("FERRY_DTYPE_F32", FERRY_DTYPE_F32.into()),
        ("FERRY_DTYPE_F64", FERRY_DTYPE_F64.into()),
        ("FERRY_DTYPE_I64", FERRY_DTYPE_I64.into()),
        ("FERRY_DTYPE_U64", FERRY_DTYPE_U64.into()),
        ("FERRY_DTYPE_F8_E5M2", FERRY_DTYPE_F8_E5M2.into()),
        ("FERRY_DTYPE_F8_E4M3", FERRY_DTYPE_F8_E4M3.into()),
        ("FERRY_DTYPE_F8_E8M0", FERRY_DTYPE_F8_E8M0.into()),
        ("FERRY_DTYPE_C64", FERRY_DTYPE_C64.into()),
        ("FERRY_DTYPE_F4", FERRY_DTYPE_F4.into()),
        ("FERRY_DTYPE_F6_E2M3", FERRY_DTYPE_F6_E2M3.into()),
        ("FERRY_DTYPE_F6_E3M2", FERRY_DTYPE_F6_E3M2.into()),
        ("FERRY_WRITER_AUTO", FERRY_WRITER_AUTO.into()),
        ("FERRY_WRITER_BUFFERED", FERRY_WRITER_BUFFERED.into()),
        ("FERRY_WRITER_DIRECT", FERRY_WRITER_DIRECT.into()),
        ("FERRY_WRITER_HYBRID", FERRY_WRITER_HYBRID.into()),
    ];
    let h = header();
    let mut numeric = BTreeSet::new();
    for l in h.lines() {
        let mut w = l.split_whitespace();
        if w.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(val)) = (w.next(), w.next()) else {
            continue;
        };
        if let Ok(v) = val.parse::<i64>() {
            numeric.insert(name.to_string());
            let r = rust
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("{name} in ferry.h has no Rust constant"));
            assert_eq!(r.1, v, "{name}: Rust {} vs ferry.h {v}", r.1);
        }
    }
    for (n, _) in &rust {
        assert!(numeric.contains(*n), "{n} missing from ferry.h");
    }
}

#[test]
fn header_compiles_as_c_and_cpp() {
    let Some(cc) = support::c_compiler() else {
        println!("skipped: no C compiler");
        return;
    };
    let inc = support::repo_root().join("crates/ferry-capi/include");
    let probe = "#include \"ferry.h\"\nint main(void) { const ferry_op *o = FERRY_OP_COPY; return o == 0; }\n";
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let c = dir.join("probe.c");
    std::fs::write(&c, probe).expect("write probe");
    let mut runs = vec![(
        cc.clone(),
        vec![
            "-std=c99",
            "-pedantic",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
        ],
        c.clone(),
    )];
    if Command::new("c++")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let cpp = dir.join("probe.cpp");
        std::fs::write(&cpp, probe.replace("(void)", "()")).expect("write probe");
        runs.push((
            "c++".into(),
            vec![
                "-std=c++11",
                "-pedantic",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-fsyntax-only",
            ],
            cpp,
        ));
    }
    for (compiler, flags, file) in runs {
        let out = Command::new(&compiler)
            .args(&flags)
            .arg("-I")
            .arg(&inc)
            .arg(&file)
            .output()
            .expect("run compiler");
        assert!(
            out.status.success(),
            "{compiler} {flags:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
