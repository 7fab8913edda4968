//! Shared by the integration tests: where cargo put the static library, and the C toolchain.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `libferry_capi.a` as built by cargo for this test run.
///
/// Cargo builds the library's crate types (staticlib included) before the integration tests,
/// into the `deps/` directory this test executable runs from
/// (`<target>/<profile>/deps/<test>-<hash>`), as `deps/libferry_capi.a`; `cargo build` also
/// copies it up to `<target>/<profile>/`. This holds for any `CARGO_TARGET_DIR`, profile,
/// `--target` triple, and for cargo-nextest. `FERRY_CAPI_STATICLIB` overrides it. Falls back
/// to the profile directory's copy, then to the newest `deps/libferry_capi-*.a`.
pub fn staticlib() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRY_CAPI_STATICLIB") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe
        .parent()
        .expect("test executable has a parent directory");
    let profile = deps.parent().expect("deps/ has a parent directory");
    for p in [
        deps.join("libferry_capi.a"),
        profile.join("libferry_capi.a"),
    ] {
        if p.is_file() {
            return p;
        }
    }
    let newest = std::fs::read_dir(deps)
        .expect("read deps/")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            n.starts_with("libferry_capi-") && n.ends_with(".a")
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
    newest.unwrap_or_else(|| {
        panic!(
            "libferry_capi.a not found in {} nor in {}",
            profile.display(),
            deps.display()
        )
    })
}

/// The C compiler (`$CC`, else `cc`), or `None` if it cannot run.
pub fn c_compiler() -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    Command::new(&cc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| cc)
}

/// Libraries a Rust staticlib needs on Linux (`--print native-static-libs`).
pub const NATIVE_LIBS: &[&str] = &[
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
    "-lc",
];
