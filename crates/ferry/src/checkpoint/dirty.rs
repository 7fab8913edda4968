//! The page cache's room for a save's dirty bytes: how many more the kernel takes before its
//! background writeback starts (and, a little further, before it throttles writers to the
//! disk's rate), as `mm/page-writeback.c` works them out: a share (`vm.dirty_ratio`,
//! `vm.dirty_background_ratio`) of the memory that may hold dirty pages (free pages and the
//! file cache's), or the fixed `vm.dirty_bytes` / `vm.dirty_background_bytes`; under a
//! cgroup v2 memory limit, the same of the group's own file pages and headroom, whichever is
//! less. The hybrid writer ([`Writer::Hybrid`](super::options::Writer::Hybrid)) writes at most
//! this much buffered beside its `O_DIRECT` stream, so that no writeback competes with the
//! stream for the disk while the save runs. Read by hand: no crate reads these limits.

use std::path::Path;

/// The kernel's writeback settings (`/proc/sys/vm/dirty_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Limits {
    pub ratio: u64,
    pub background_ratio: u64,
    pub bytes: u64,
    pub background_bytes: u64,
}

/// One memory domain's state: the memory dirty pages may take (free plus file pages), and
/// the bytes dirty or under writeback now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Domain {
    pub dirtyable: u64,
    pub dirty: u64,
}

/// The background writeback threshold of a domain, in bytes, as the kernel computes it
/// (`domain_dirty_limits`): the fixed byte settings where set, else the ratios of its
/// dirtyable memory; a background threshold at or above the throttling one is half of it.
pub(super) fn background(l: &Limits, d: &Domain) -> u64 {
    let of = |bytes: u64, ratio: u64| {
        if bytes > 0 {
            bytes
        } else {
            d.dirtyable / 100 * ratio
        }
    };
    let thresh = of(l.bytes, l.ratio);
    let bg = of(l.background_bytes, l.background_ratio);
    if bg >= thresh {
        thresh / 2
    } else {
        bg
    }
}

/// Bytes a domain takes before its background writeback starts.
pub(super) fn room(l: &Limits, d: &Domain) -> u64 {
    background(l, d).saturating_sub(d.dirty)
}

/// The room of this machine's page cache for this process's dirty bytes now, and the figures
/// it came from in words; `None` where `/proc` cannot be read.
pub(super) fn room_now() -> Option<(u64, String)> {
    let limits = read_limits(Path::new("/proc/sys/vm"))?;
    let global = read_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)?;
    let mut room_b = room(&limits, &global);
    let mut why = format!(
        "background writeback from {} MiB dirty, {} MiB dirty now",
        background(&limits, &global) >> 20,
        global.dirty >> 20
    );
    if let Some(group) = cgroup_domain() {
        let r = room(&limits, &group);
        if r < room_b {
            room_b = r;
            why = format!(
                "its memory cgroup's background writeback from {} MiB dirty, {} MiB dirty now",
                background(&limits, &group) >> 20,
                group.dirty >> 20
            );
        }
    }
    Some((room_b, why))
}

fn read_limits(dir: &Path) -> Option<Limits> {
    let get = |name: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some(Limits {
        ratio: get("dirty_ratio")?,
        background_ratio: get("dirty_background_ratio")?,
        bytes: get("dirty_bytes").unwrap_or(0),
        background_bytes: get("dirty_background_bytes").unwrap_or(0),
    })
}

/// `/proc/meminfo`'s `MemFree + Active(file) + Inactive(file)` and `Dirty + Writeback`.
pub(super) fn read_meminfo(text: &str) -> Option<Domain> {
    let kib = |key: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|k| k << 10)
    };
    Some(Domain {
        dirtyable: kib("MemFree")? + kib("Active(file)")? + kib("Inactive(file)")?,
        dirty: kib("Dirty")? + kib("Writeback").unwrap_or(0),
    })
}

/// This process's cgroup v2 memory domain where it has a limit: its file pages plus its
/// headroom under `memory.max`, and its dirty and writeback bytes (`memory.stat`).
fn cgroup_domain() -> Option<Domain> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
    let max: u64 = std::fs::read_to_string(dir.join("memory.max"))
        .ok()?
        .trim()
        .parse()
        .ok()?; // "max": no limit
    let current: u64 = std::fs::read_to_string(dir.join("memory.current"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    read_memory_stat(
        &std::fs::read_to_string(dir.join("memory.stat")).ok()?,
        max,
        current,
    )
}

/// A cgroup's domain from its `memory.stat` text, `memory.max` and `memory.current`.
pub(super) fn read_memory_stat(text: &str, max: u64, current: u64) -> Option<Domain> {
    let get = |key: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    };
    Some(Domain {
        dirtyable: get("file")? + max.saturating_sub(current),
        dirty: get("file_dirty")? + get("file_writeback").unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn ratios_of_the_dirtyable_memory_or_the_fixed_bytes() {
        let l = Limits {
            ratio: 20,
            background_ratio: 10,
            ..Limits::default()
        };
        let d = Domain {
            dirtyable: 100 * GIB,
            dirty: 2 * GIB,
        };
        assert_eq!(background(&l, &d), 10 * GIB);
        assert_eq!(room(&l, &d), 8 * GIB);
        // Fixed bytes win over the ratios, each on its own.
        let fixed = Limits {
            background_bytes: GIB,
            ..l
        };
        assert_eq!(background(&fixed, &d), GIB);
        assert_eq!(room(&fixed, &d), 0);
        // A background threshold at or above the throttling one is half of it.
        let odd = Limits {
            ratio: 10,
            background_ratio: 30,
            ..l
        };
        assert_eq!(background(&odd, &d), 5 * GIB);
        let odd_bytes = Limits {
            bytes: 4 * GIB,
            background_bytes: 4 * GIB,
            ..l
        };
        assert_eq!(background(&odd_bytes, &d), 2 * GIB);
    }

    #[test]
    fn meminfo_and_memory_stat_parse() {
        let meminfo = "MemTotal:       24683772 kB\nMemFree:         1000 kB\n\
                       Active(file):     200 kB\nInactive(file):   300 kB\nDirty:   7 kB\n\
                       Writeback:        1 kB\nWritebackTmp:   50 kB\n";
        assert_eq!(
            read_meminfo(meminfo),
            Some(Domain {
                dirtyable: 1500 << 10,
                dirty: 8 << 10
            })
        );
        assert_eq!(read_meminfo("MemFree: 1 kB\n"), None);
        let stat = "anon 5\nfile 1000\nfile_mapped 3\nfile_dirty 40\nfile_writeback 2\n";
        assert_eq!(
            read_memory_stat(stat, 5000, 3000),
            Some(Domain {
                dirtyable: 3000,
                dirty: 42
            })
        );
        assert_eq!(read_memory_stat("anon 5\n", 1, 1), None);
    }

    #[test]
    fn this_machine_has_a_room() {
        // Linux: /proc is there; the figure is whatever the machine has now.
        let (_, why) = room_now().expect("/proc/sys/vm and /proc/meminfo readable");
        assert!(why.contains("MiB dirty now"), "{why}");
    }
}
