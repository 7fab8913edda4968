//! Builds the C programs of `examples/c/` (`copy_tile.c`, `copy_blocks.c`, `checkpoint.c`)
//! with the C compiler against the static library cargo built, runs them, and checks their
//! output (and, where valgrind is installed, that `copy_tile` makes no memory error and leaks
//! nothing definitely).

mod support;

use std::path::PathBuf;
use std::process::Command;

/// Compiles `examples/c/{name}.c` into a directory of its own (`tag`: tests run in parallel).
fn build(name: &str, tag: &str) -> Option<PathBuf> {
    let Some(cc) = support::c_compiler() else {
        println!("skipped: no C compiler (set CC or install cc)");
        return None;
    };
    let root = support::repo_root();
    let lib = support::staticlib();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("c_program-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    let exe = dir.join(name);
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g"])
        .arg("-I")
        .arg(root.join("crates/ferry-capi/include"))
        .arg(root.join(format!("examples/c/{name}.c")))
        .arg(&lib)
        .args(support::NATIVE_LIBS)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run the C compiler");
    assert!(
        out.status.success(),
        "compiling {name}.c against {} failed:\n{}",
        lib.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

#[test]
fn copy_tile_runs_and_checks_every_byte() {
    let Some(exe) = build("copy_tile", "run") else {
        return;
    };
    let out = Command::new(&exe).output().expect("run copy_tile");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "copy_tile failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for want in [
        "tile: 32 x 24 doubles copied, 10112 destination bytes checked",
        "transpose: 24 x 32 checked",
        "fill: column of 24 checked",
        "multiplex memcpy: 8388608 bytes checked",
        "barrier: 2 failed requests",
        "operator `out_of_bounds` failed: returned -2",
        "wait on failing request: -9 (request failed)",
        "null op: -1 (invalid argument): operator is NULL",
        "short source: -2",
    ] {
        assert!(stdout.contains(want), "missing `{want}` in:\n{stdout}");
    }
    assert!(
        stdout.contains("cuda: -6 (not available on this machine)") || stdout.contains("cuda: 0 "),
        "{stdout}"
    );
    assert_eq!(stdout.matches("  failure ").count(), 2, "{stdout}");
    assert!(stdout.trim_end().ends_with("copy_tile: OK"), "{stdout}");
}

#[test]
fn copy_tile_is_clean_under_valgrind() {
    let vg = Command::new("valgrind").arg("--version").output();
    if !vg.is_ok_and(|o| o.status.success()) {
        println!("skipped: valgrind not installed");
        return;
    }
    let Some(exe) = build("copy_tile", "valgrind") else {
        return;
    };
    let out = Command::new("valgrind")
        .args([
            "--quiet",
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
        ])
        .arg(&exe)
        .output()
        .expect("run valgrind");
    assert!(
        out.status.success(),
        "valgrind reported errors ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("copy_tile: OK"));
}

/// `examples/c/checkpoint.c`: saves a model's tensors (one file, a sharded folder, in the
/// background while the model changes), loads each back into zeroed buffers and compares every
/// byte, and sees a load with the wrong shape refused before anything is written.
#[test]
fn checkpoint_example_saves_and_loads_back() {
    let Some(exe) = build("checkpoint", "checkpoint") else {
        return;
    };
    let work = exe.with_file_name("work");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("create temp dir");
    let out = Command::new(&exe)
        .arg(&work)
        .output()
        .expect("run checkpoint");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "checkpoint failed ({}):\n{stdout}",
        out.status
    );
    for want in [
        // 256 x 128 f32, 1000 bf16, one i64: 133080 bytes of tensors.
        "load file: 3 tensors, 133080 bytes from 1 file(s) checked",
        "load async save: 3 tensors, 133080 bytes from 1 file(s) checked",
        "wrong shape: -1 (invalid argument)",
        "expects shape [128, 256]",
    ] {
        assert!(stdout.contains(want), "missing `{want}` in:\n{stdout}");
    }
    // The background save's report (`ferry_checkpoint_save_wait`) says what the one in the
    // foreground says: the same tensors, the same file.
    let line = |p: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(p))
            .map(|l| l[p.len()..].to_string())
    };
    let saved = line("save: ").unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(line("async save: "), Some(saved.clone()), "{stdout}");
    assert!(saved.starts_with("3 tensors, "), "{saved}");
    let folder = stdout
        .lines()
        .find(|l| l.starts_with("load folder: "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(!folder.contains("from 1 file(s)"), "sharded: {folder}");
    let saved = stdout
        .lines()
        .find_map(|l| l.strip_prefix("save: 3 tensors, "))
        .and_then(|l| l.strip_suffix(" bytes"))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    let file = std::fs::metadata(work.join("model.safetensors")).expect("the saved file");
    assert_eq!(saved, file.len(), "a save reports the file's bytes");
    assert!(stdout.trim_end().ends_with("checkpoint: OK"), "{stdout}");
    assert!(work.join("sharded/model.safetensors.index.json").is_file());
    let _ = std::fs::remove_dir_all(&work);
}

/// `examples/c/copy_blocks.c`: moves mapped blocks between two block tables and sees each bad
/// mapping refused with a message naming its entry.
#[test]
fn copy_blocks_moves_the_mapped_blocks_and_refuses_bad_mappings() {
    let Some(exe) = build("copy_blocks", "run") else {
        return;
    };
    let out = Command::new(&exe).output().expect("run copy_blocks");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "copy_blocks failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // 2 layers x 6 destination blocks x 96 bytes, every one checked.
    assert!(
        stdout.contains("blocks: 5 of 96 bytes in 2 layers, 1152 destination bytes checked"),
        "{stdout}"
    );
    // Each refusal: -FERRY_EINVAL, its message naming the mapping's entry.
    for (what, says) in [
        (
            "destination past its table",
            "mapping entry 1: destination block 6",
        ),
        ("source past its table", "mapping entry 0: source block 8"),
        ("negative index", "mapping entry 1: source block index -1"),
        ("one destination twice", "mapping entries 0 and 1"),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("refused ({what}): -1 (invalid argument)")))
            .unwrap_or_else(|| panic!("no refusal line for `{what}` in:\n{stdout}"));
        assert!(line.contains(says), "`{what}`: want `{says}` in: {line}");
    }
    assert!(stdout.trim_end().ends_with("copy_blocks: OK"), "{stdout}");
}
