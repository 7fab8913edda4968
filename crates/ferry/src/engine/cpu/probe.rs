//! What the CPU engine finds on this machine, and its defaults.

/// Defaults and limits of the CPU engine on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuProbe {
    /// Logical cores available to this process.
    pub cores: usize,
    /// Worker threads a default engine starts (one per core, at least 1).
    pub default_threads: usize,
    /// The per-core (level 2) cache, in bytes, where the system says (Linux sysfs).
    pub l2_bytes: Option<usize>,
    /// Largest copy a default engine runs on one thread
    /// ([`CpuConfig::split_bytes`](super::CpuConfig::split_bytes)): half the level-2 cache
    /// (1 MiB if unknown), at least 1 MiB. Up to it, source and destination fit in one
    /// core's cache, where one thread copies fastest; beyond it, two cores' caches and
    /// bandwidth pay for the hand-off (on one core nothing is split). The floor is measured:
    /// on the 2-core development VM (1 MiB of L2 per core) a 1 MiB copy split in two ran
    /// 0.58-1.13x one `copy_from_slice` from run to run (0.67-0.92 in three runs back to
    /// back), where 2 and 4 MiB split ran 1.25-1.59x (`bench/results/cpu-2core.md`).
    pub split_bytes: usize,
    /// The last-level cache (the largest level Linux sysfs lists for CPU 0), in bytes.
    pub llc_bytes: Option<usize>,
    /// Transposes writing more than this go past the caches
    /// ([`CpuConfig::stream_bytes`](super::CpuConfig::stream_bytes)): a quarter of the
    /// last-level cache (8 MiB if unknown), at least `split_bytes`: source and destination
    /// together then take half of a cache that every core and all other data share. On the
    /// 2-core VM (32 MiB) 16 and 256 MiB transposes ran 1.2-2.8x faster so
    /// (`bench/results/cpu-2core.md`).
    pub stream_bytes: usize,
}

/// Reads the machine's core count and cache size.
pub fn probe() -> CpuProbe {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (l2_bytes, llc_bytes) = cache_sizes();
    let split_bytes = l2_bytes.map_or(1 << 20, |b| b / 2).max(1 << 20);
    CpuProbe {
        cores,
        default_threads: cores,
        l2_bytes,
        split_bytes,
        llc_bytes,
        stream_bytes: llc_bytes.map_or(8 << 20, |b| b / 4).max(split_bytes),
    }
}

/// CPU 0's level-2 and last-level (the highest level listed) data or unified caches, in
/// bytes, in one pass over `/sys/devices/system/cpu/cpu0/cache/index*`.
///
/// Read without the heap: fixed paths and stack buffers, not `read_dir`. The probe runs in every
/// default engine's construction (libaml's `aml_init` among them), and glibc's `opendir` buffer
/// (32 KiB) freed there, under the allocations that stay, left a hole in the program's heap;
/// libgomp then took each parallel region's team from that hole, about 20-25 ns slower than
/// from the heap's top, and AML's `tiled_l1` (a parallel region per tile) ran 4-9% slower on
/// one thread against libaml than against AML (`bench/results/cpu-2core.md`).
fn cache_sizes() -> (Option<usize>, Option<usize>) {
    let (mut l2, mut llc) = (None, None::<(u32, usize)>);
    for index in 0..16 {
        let (mut lv, mut kind, mut size) = ([0; 64], [0; 64], [0; 64]);
        // The indices are numbered from 0 without gaps: the first missing one ends the list.
        let Some(lv) = cache_field(index, "level", &mut lv) else {
            break;
        };
        let (Ok(lv), Some(kind)) = (lv.parse::<u32>(), cache_field(index, "type", &mut kind))
        else {
            continue;
        };
        let Some(size) = cache_field(index, "size", &mut size).and_then(parse_size) else {
            continue;
        };
        if kind == "Instruction" {
            continue;
        }
        if lv == 2 && l2.is_none() {
            l2 = Some(size);
        }
        if llc.is_none_or(|(l, _)| lv > l) {
            llc = Some((lv, size));
        }
    }
    (l2, llc.map(|c| c.1))
}

/// `/sys/devices/system/cpu/cpu0/cache/index{index}/{name}` read into `buf`, trimmed; nothing
/// on the heap (the path is formatted on the stack, and `File::open` converts a path this short
/// on the stack too).
fn cache_field<'b>(index: usize, name: &str, buf: &'b mut [u8; 64]) -> Option<&'b str> {
    use std::io::{Read, Write};
    let mut path = [0u8; 96];
    let mut rest = &mut path[..];
    write!(
        rest,
        "/sys/devices/system/cpu/cpu0/cache/index{index}/{name}"
    )
    .ok()?;
    let len = 96 - rest.len();
    let path = std::str::from_utf8(&path[..len]).ok()?;
    let n = std::fs::File::open(path).ok()?.read(buf).ok()?;
    std::str::from_utf8(&buf[..n]).ok().map(str::trim)
}

/// `2048K`, `4M`, `512` (bytes) as sysfs writes cache sizes.
fn parse_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_size("2048K"), Some(2 << 20));
        assert_eq!(parse_size("4M"), Some(4 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("xK"), None);
        let p = probe();
        assert!(p.cores >= 1 && p.split_bytes >= 1 << 20);
    }

    /// The stack-only reading finds what listing the directory finds.
    #[test]
    fn l2_matches_the_cache_directory_listed() {
        let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
        let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
        let listed = std::fs::read_dir(dir).ok().and_then(|entries| {
            entries.flatten().find_map(|e| {
                let p = e.path();
                let (level, kind) = (read(p.join("level"))?, read(p.join("type"))?);
                if level.trim() != "2" || kind.trim() == "Instruction" {
                    return None;
                }
                parse_size(read(p.join("size"))?.trim())
            })
        });
        assert_eq!(cache_sizes().0, listed);
    }
}
