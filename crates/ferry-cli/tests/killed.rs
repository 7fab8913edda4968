//! `ferry save` killed with SIGKILL at random points: it can clean nothing up, so the
//! destination must be byte-for-byte the old file or the complete new one, and the next save
//! to the same destination removes the partial file the killed one left (its process is gone).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn partial_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".ferry-partial-"))
        .collect()
}

fn save(src: &Path, dst: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
    c.arg("save")
        .arg(src)
        .arg(dst)
        .args(["--device", "host", "--threads", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// A safetensors file of one U8 tensor of `bytes` bytes that are not all alike.
fn checkpoint(dir: &Path, bytes: usize) -> std::path::PathBuf {
    let p = dir.join("src.safetensors");
    let data: Vec<u8> = (0..bytes).map(|i| (i * 31 + i / 4099) as u8).collect();
    let shape = [bytes];
    let t = [ferry::checkpoint::SaveTensor::new(
        "w",
        ferry::checkpoint::Dtype::U8,
        &shape,
        &data,
    )];
    let fe = ferry::file::FileEngine::new(ferry::file::FileConfig::new().threads(1)).unwrap();
    ferry::checkpoint::save(&fe, &p, &t, &Default::default()).unwrap();
    p
}

/// xorshift64: the kill points, the same on every run.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn a_save_killed_anywhere_leaves_old_or_new_and_the_next_save_cleans_up() {
    let dir = tempfile::Builder::new()
        .prefix("ferry-cli-killed-")
        .tempdir()
        .unwrap();
    let src = checkpoint(dir.path(), 96 << 20);
    // The complete new file, and how long a whole save takes here.
    let reference = dir.path().join("ref.safetensors");
    let t0 = Instant::now();
    let o = save(&src, &reference).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let whole = t0.elapsed().as_micros() as u64;
    let new = std::fs::read(&reference).unwrap();
    let old = b"the old bytes".to_vec();
    let dst = dir.path().join("out.safetensors");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut left = 0;
    for round in 0..8 {
        std::fs::write(&dst, &old).unwrap();
        // Even rounds: anywhere from the start to a little past the end of a whole save. Odd
        // rounds: once the partial file exists, within the write.
        let at = Duration::from_micros(next(&mut seed) % (whole + whole / 4 + 1));
        let mut child = save(&src, &dst).spawn().unwrap();
        if round % 2 == 1 {
            let t = Instant::now();
            while partial_files(dir.path()).is_empty()
                && child.try_wait().unwrap().is_none()
                && t.elapsed() < Duration::from_secs(60)
            {
                std::thread::sleep(Duration::from_micros(200));
            }
            std::thread::sleep(at / 16);
        } else {
            std::thread::sleep(at);
        }
        // SAFETY: `child` is our own child, not yet waited for (its pid not reused).
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        let now = std::fs::read(&dst).unwrap();
        assert!(
            now == old || now == new,
            "round {round}, killed after {at:?}: the destination is neither the old file nor \
             the new one ({} bytes)",
            now.len()
        );
        left += partial_files(dir.path()).len();
        // The next save removes what the killed one left.
        let o = save(&src, &dst).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(std::fs::read(&dst).unwrap(), new, "round {round}");
        assert_eq!(
            partial_files(dir.path()),
            Vec::<String>::new(),
            "round {round}"
        );
    }
    eprintln!("{left} partial file(s) left by killed saves, all removed by the next");
    assert!(left > 0, "no kill landed while the file was being written");
}
