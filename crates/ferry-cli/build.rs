//! Records the commit the binary was built from as `FERRY_GIT_COMMIT` (for the report header
//! and JSON): `FERRY_COMMIT` from the environment when set, else `git rev-parse HEAD` (with
//! `-dirty` when the work tree has changes), else nothing.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=FERRY_COMMIT");
    for p in ["HEAD", "logs/HEAD", "index"] {
        if let Some(path) = git(&["rev-parse", "--git-path", p]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = std::env::var("FERRY_COMMIT").ok().or_else(|| {
        let head = git(&["rev-parse", "--short=12", "HEAD"])?;
        let dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        Some(if dirty { format!("{head}-dirty") } else { head })
    });
    if let Some(c) = commit.filter(|c| !c.is_empty()) {
        println!("cargo:rustc-env=FERRY_GIT_COMMIT={c}");
    }
}
