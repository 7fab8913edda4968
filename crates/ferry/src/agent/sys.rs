//! The agent's system calls (the unsafe bottom of `agent/`): shared memory (memfd), cross-memory
//! attach (`process_vm_readv`/`process_vm_writev`), process handles (pidfd, and the life word a
//! peer reads instead), and descriptors
//! passed over a Unix socket (`SCM_RIGHTS`) with the peer's credentials (`SO_PEERCRED`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};

/// Host memory in a memfd, mapped shared in this process: the owner's or a peer's mapping of
/// the same pages. Unmapped on drop.
pub(crate) struct SharedMap {
    ptr: *mut u8,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: a mapping owned by this value; the bytes are reached only through raw views whose
// users synchronise (requests), as with any memory a DMA engine touches.
unsafe impl Send for SharedMap {}
// SAFETY: as above.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    /// `len` (> 0) zero bytes in a new memfd, mapped. Its size is sealed (`F_SEAL_SHRINK`,
    /// `F_SEAL_GROW`, then `F_SEAL_SEAL`): a process it is passed to cannot truncate it under
    /// the others' mappings (their next access would fault).
    pub(crate) fn create(len: usize) -> io::Result<SharedMap> {
        // SAFETY: a NUL-terminated name and flags; returns a new descriptor or -1.
        let fd = unsafe {
            libc::memfd_create(
                c"ferry-agent".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just made and is owned here only.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: resizes the memfd owned above.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: adds seals to the memfd owned above.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        SharedMap::map(fd, len)
    }

    /// Maps the first `len` (> 0) bytes of `fd` (a peer's memfd), shared.
    pub(crate) fn map(fd: OwnedFd, len: usize) -> io::Result<SharedMap> {
        // SAFETY: `stat` is plain data, valid all zeros.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid out-pointer for one `stat`.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // A memfd whose size its owner (or another importer) could still shrink would fault
        // this process's accesses: refused (`create` seals its own).
        // SAFETY: asks the seals of a valid descriptor.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the shared memory's size is not sealed (F_SEAL_SHRINK): it could be truncated \
                 under this mapping",
            ));
        }
        if (st.st_size as u64) < len as u64 || len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("shared memory of {} bytes cannot hold {len}", st.st_size),
            ));
        }
        // SAFETY: a new shared mapping of `len` bytes of the file, at an address the kernel
        // picks (no existing mapping is touched).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedMap {
            ptr: p.cast(),
            len,
            fd,
        })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; its users are gone (the agent
        // waits for the requests that touch it before dropping it).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One piece of a cross-memory copy: `len` bytes at `local` in this process and at `remote`
/// in the peer.
#[derive(Clone, Copy)]
pub(crate) struct Piece {
    pub(crate) local: u64,
    pub(crate) remote: u64,
    pub(crate) len: usize,
}

/// Copies `pieces` between this process and process `pid` (`write`: local -> remote), in
/// calls of at most `IOV_MAX` pieces, resuming after partial transfers.
///
/// # Safety
/// 1. Every local range is memory of this process valid for the copy's direction (readable
///    for a write, writable for a read) and not accessed by anyone else meanwhile.
pub(crate) unsafe fn cross_copy(pid: i32, pieces: &[Piece], write: bool) -> io::Result<()> {
    const MAX: usize = 1024; // IOV_MAX on Linux
    for chunk in pieces.chunks(MAX) {
        let mut local: Vec<libc::iovec> = chunk
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.local as *mut libc::c_void,
                iov_len: p.len,
            })
            .collect();
        let mut remote: Vec<libc::iovec> = chunk
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.remote as *mut libc::c_void,
                iov_len: p.len,
            })
            .collect();
        let total: usize = chunk.iter().map(|p| p.len).sum();
        let mut done = 0usize;
        while done < total {
            // SAFETY: the local iovecs cover memory valid for the direction (point 1); the
            // remote ones are checked by the kernel against the peer's mappings.
            let n = unsafe {
                if write {
                    libc::process_vm_writev(
                        pid,
                        local.as_ptr(),
                        local.len() as libc::c_ulong,
                        remote.as_ptr(),
                        remote.len() as libc::c_ulong,
                        0,
                    )
                } else {
                    libc::process_vm_readv(
                        pid,
                        local.as_ptr(),
                        local.len() as libc::c_ulong,
                        remote.as_ptr(),
                        remote.len() as libc::c_ulong,
                        0,
                    )
                }
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "no byte moved",
                ));
            }
            done += n as usize;
            advance(&mut local, n as usize);
            advance(&mut remote, n as usize);
        }
    }
    Ok(())
}

/// Drops the first `n` bytes of an iovec list (after a partial transfer).
fn advance(v: &mut Vec<libc::iovec>, mut n: usize) {
    let mut skip = 0;
    for io in v.iter_mut() {
        if n >= io.iov_len {
            n -= io.iov_len;
            skip += 1;
        } else {
            io.iov_base = (io.iov_base as u64 + n as u64) as *mut libc::c_void;
            io.iov_len -= n;
            break;
        }
    }
    v.drain(..skip);
}

/// The kernel's robust-futex ABI (`Documentation/locking/robust-futex-ABI.rst`): a robust
/// lock's word holds its owner's thread id in these bits; when the owner exits holding it, the
/// kernel clears them and sets `FUTEX_OWNER_DIED`.
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;

/// This process's life word: a robust, process-shared mutex in a memfd, locked for the whole
/// life of the process by a thread that never returns (`ferry-agent-life`). When the process
/// ends (or `exec`s), the kernel walks that thread's robust list before the process's pidfd
/// reads ready and marks the lock's word (the owner's thread id cleared). A peer that maps the
/// memfd tells whether this process lives with one load, where a `poll` of a pidfd is a system
/// call (two per device transfer before: the larger part of a 4 KiB transfer's host cost on the
/// null driver). Hand-written: no crate exposes a robust lock's word.
pub(crate) struct Life {
    map: SharedMap,
    /// The word while the process lives (its life thread's id, read back after locking).
    word: u32,
    /// The process that made it: a child made by `fork` inherits the mapping, not the thread.
    pid: u32,
}

impl Life {
    /// This process's life word, made on first use; `None` where it cannot be (a C library
    /// whose mutex word does not hold its owner's id, a failed memfd), or in a child made by
    /// `fork` (peers then poll its pidfd).
    pub(crate) fn get() -> Option<&'static Life> {
        static LIFE: std::sync::OnceLock<Option<Life>> = std::sync::OnceLock::new();
        LIFE.get_or_init(|| Life::make(true).ok())
            .as_ref()
            .filter(|l| l.pid == std::process::id())
    }

    /// The memfd to pass to a peer, and the word it holds while this process lives.
    pub(crate) fn share(&self) -> (RawFd, u32) {
        (self.map.fd(), self.word)
    }

    /// A new life word, its lock held by a new thread that stays for the process's life
    /// (`stay`; else it returns at once, as a process that exits, for the tests).
    fn make(stay: bool) -> io::Result<Life> {
        let map = SharedMap::create(std::mem::size_of::<libc::pthread_mutex_t>())?;
        let m = map.ptr().cast::<libc::pthread_mutex_t>();
        // SAFETY: `attr` is initialised before use and destroyed after; `m` points at zeroed,
        // suitably aligned (page-aligned) shared memory that holds one mutex, initialised once.
        let init = unsafe {
            let mut attr = std::mem::MaybeUninit::<libc::pthread_mutexattr_t>::uninit();
            let mut r = libc::pthread_mutexattr_init(attr.as_mut_ptr());
            if r == 0 {
                r = libc::pthread_mutexattr_setpshared(
                    attr.as_mut_ptr(),
                    libc::PTHREAD_PROCESS_SHARED,
                );
                if r == 0 {
                    r = libc::pthread_mutexattr_setrobust(
                        attr.as_mut_ptr(),
                        libc::PTHREAD_MUTEX_ROBUST,
                    );
                }
                if r == 0 {
                    r = libc::pthread_mutex_init(m, attr.as_ptr());
                }
                libc::pthread_mutexattr_destroy(attr.as_mut_ptr());
            }
            r
        };
        if init != 0 {
            return Err(io::Error::from_raw_os_error(init));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let at = m as usize;
        std::thread::Builder::new()
            .name("ferry-agent-life".into())
            .spawn(move || {
                let m = at as *mut libc::pthread_mutex_t;
                // SAFETY: the mutex initialised above, in a mapping never unmapped (the static
                // `Life` owns it); locked once, by this thread, never unlocked.
                let r = unsafe { libc::pthread_mutex_lock(m) };
                // SAFETY: no arguments.
                let tid = unsafe { libc::gettid() } as u32;
                // SAFETY: the mutex's first word, 4-byte aligned, read atomically (the kernel
                // writes it at this thread's exit).
                let word = unsafe { (*(at as *const AtomicU32)).load(Ordering::Acquire) };
                // The kernel marks the word only if this thread registered a robust list (the C
                // library does at thread start; a seccomp filter or an emulator may refuse it).
                let (mut head, mut len) = (std::ptr::null_mut::<libc::c_void>(), 0usize);
                // SAFETY: asks the kernel for this thread's (0) robust list head into two valid
                // out-pointers.
                let listed =
                    unsafe { libc::syscall(libc::SYS_get_robust_list, 0, &mut head, &mut len) }
                        == 0
                        && !head.is_null();
                let _ = tx.send((r, tid, word, listed));
                if stay {
                    loop {
                        std::thread::park();
                    }
                }
            })?;
        let (r, tid, word, listed) = rx
            .recv()
            .map_err(|_| io::Error::other("the life thread ended before locking"))?;
        let why = if r != 0 {
            Some(io::Error::from_raw_os_error(r))
        } else if word & FUTEX_TID_MASK != tid {
            Some(io::Error::new(
                io::ErrorKind::Unsupported,
                "this C library's mutex does not keep its owner's thread id in its first word",
            ))
        } else if !listed {
            Some(io::Error::new(
                io::ErrorKind::Unsupported,
                "the life thread has no robust list: the kernel would never mark the word",
            ))
        } else {
            None
        };
        if let Some(e) = why {
            // The life thread may hold the mutex, listed at this address, for the process's
            // life: the mapping stays (a few bytes), so that the kernel's walk of that list at
            // exit never reads memory reused for something else.
            std::mem::forget(map);
            return Err(e);
        }
        Ok(Life {
            map,
            word,
            pid: std::process::id(),
        })
    }
}

/// A handle on a process that tells whether it has exited: its pidfd (immune to pid reuse),
/// and its life word where it shared one ([`Life`]), read instead of polling the pidfd.
pub(crate) struct ProcessHandle {
    pidfd: OwnedFd,
    life: Option<(SharedMap, u32)>,
}

impl ProcessHandle {
    /// A handle on process `pid`, with the life word it shared (its memfd and the word's value
    /// while it lives), if any: a memfd that cannot be mapped is left for the pidfd.
    pub(crate) fn open(pid: i32, life: Option<(OwnedFd, u32)>) -> io::Result<ProcessHandle> {
        // SAFETY: the pidfd_open system call with a pid and no flags; returns a new descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor owned here only.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let life = life.and_then(|(fd, word)| {
            let len = std::mem::size_of::<libc::pthread_mutex_t>();
            SharedMap::map(fd, len).ok().map(|m| (m, word))
        });
        Ok(ProcessHandle { pidfd, life })
    }

    /// True once the process has exited, as the hot paths ask it (a transfer's submit and
    /// completion): its life word changed, or (without one) its pidfd reads as ready.
    pub(crate) fn exited(&self) -> bool {
        if let Some((map, word)) = &self.life {
            // SAFETY: the mapping's first word (at least a mutex long, page-aligned), read
            // atomically: the peer's kernel writes it when the peer exits.
            let now = unsafe { (*map.ptr().cast::<AtomicU32>()).load(Ordering::Acquire) };
            return now & FUTEX_TID_MASK != word & FUTEX_TID_MASK;
        }
        self.pidfd_ready()
    }

    /// True once the process has exited, asked of both its life word and its pidfd: for the
    /// paths off the transfers' (a failed socket call, [`Peer::is_alive`](super::Peer)), where a
    /// word the kernel could not mark (the process's memory reaped before its exit walked the
    /// robust list) must not hide the exit.
    pub(crate) fn exited_surely(&self) -> bool {
        self.exited() || (self.life.is_some() && self.pidfd_ready())
    }

    fn pidfd_ready(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r > 0 && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
    }
}

/// The uid and pid of the process at the other end of `s` (`SO_PEERCRED`).
pub(crate) fn peer_cred(s: &UnixStream) -> io::Result<(u32, i32)> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` and `len` are valid out-pointers of the documented types.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((c.uid, c.pid))
}

/// This process's real uid.
pub(crate) fn uid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::getuid() }
}

/// Sends `data` (non-empty) on `s`, with `fd` attached (`SCM_RIGHTS`) if given.
pub(crate) fn send_with_fd(s: &UnixStream, data: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut sent = 0;
    while sent < data.len() {
        let mut iov = libc::iovec {
            iov_base: data[sent..].as_ptr() as *mut libc::c_void,
            iov_len: data.len() - sent,
        };
        let mut cbuf = [0u64; 4]; // room for one cmsg with one int, aligned
                                  // SAFETY: an all-zero msghdr is valid (no name, no iovecs, no control).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let (Some(fd), 0) = (fd, sent) {
            // SAFETY: CMSG_SPACE of one int fits `cbuf` (32 bytes); the header is written
            // inside it through the libc macros.
            unsafe {
                msg.msg_control = cbuf.as_mut_ptr().cast();
                msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
            }
        }
        // SAFETY: `msg` points at live buffers for the call's duration.
        let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += n as usize;
    }
    Ok(())
}

/// Reads exactly `buf.len()` (> 0) bytes from `s`, and a descriptor if one came with them.
pub(crate) fn recv_with_fd(s: &UnixStream, buf: &mut [u8]) -> io::Result<Option<OwnedFd>> {
    let mut got = 0;
    let mut fd = None;
    while got < buf.len() {
        let mut iov = libc::iovec {
            iov_base: buf[got..].as_mut_ptr().cast(),
            iov_len: buf.len() - got,
        };
        let mut cbuf = [0u64; 4];
        // SAFETY: an all-zero msghdr is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        // SAFETY: `msg` points at live buffers for the call's duration.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ));
        }
        // SAFETY: walks the control messages the kernel wrote into `cbuf` with the libc
        // macros; a descriptor received is owned here from now on.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
                    fd = Some(OwnedFd::from_raw_fd(raw));
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        got += n as usize;
    }
    Ok(fd)
}

/// Fills `buf` from the kernel's random source (`getrandom`): the challenges of connections
/// over TCP.
pub(crate) fn random(buf: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: writes at most `buf.len() - got` bytes into the live slice's tail.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(())
}

/// Turns on TCP keepalive for `s`, probing after 30 s idle, every 10 s, 3 times: an idle
/// connection to a host that died is found broken within about a minute (the kernel's defaults
/// take over two hours). The standard library has no call for it.
pub(crate) fn keepalive(s: &std::net::TcpStream) -> io::Result<()> {
    for (level, name, value) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 30),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 10),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ] {
        let v: libc::c_int = value;
        // SAFETY: a valid socket and a live `int` of the size passed.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                level,
                name,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Makes `dir` a private directory of this user (mode 0700), refusing one owned by another
/// user or open to others.
pub(crate) fn private_dir(dir: &std::path::Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(dir)?;
    if !m.is_dir() || m.uid() != uid() || m.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a private directory of uid {} (owner {}, mode {:o})",
                dir.display(),
                uid(),
                m.uid(),
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Lets process `pid` read and write this one with cross-memory attach where Yama's
/// `ptrace_scope` is 1 (only ancestors may otherwise): `PR_SET_PTRACER`, which names one
/// process at a time (the last peer to connect). Nothing elsewhere.
pub(crate) fn allow_ptracer(pid: i32) {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").unwrap_or_default();
    if scope.trim() == "1" {
        // SAFETY: a prctl with integer arguments; it changes only who may attach to us.
        unsafe { libc::prctl(libc::PR_SET_PTRACER, pid as libc::c_ulong, 0, 0, 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn shared_memory_is_sealed_and_unsealed_memory_is_refused() {
        let m = SharedMap::create(4096).unwrap();
        // SAFETY: `dup` of the live memfd; the copy is owned here.
        let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(m.fd())) };
        // SAFETY: tries to shrink and grow a valid memfd (refused by its seals).
        unsafe {
            assert_ne!(libc::ftruncate(dup.as_raw_fd(), 0), 0);
            assert_ne!(libc::ftruncate(dup.as_raw_fd(), 8192), 0);
        }
        assert!(SharedMap::map(dup, 4096).is_ok());
        // SAFETY: a new memfd without seals, owned here.
        let plain = unsafe {
            let fd = libc::memfd_create(c"plain".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0 && libc::ftruncate(fd, 4096) == 0);
            OwnedFd::from_raw_fd(fd)
        };
        let e = SharedMap::map(plain, 4096)
            .err()
            .expect("an unsealed memfd refused");
        assert!(e.to_string().contains("not sealed"), "{e}");
    }

    /// A peer's view of `life`: its memfd duplicated, as passing it over the socket does.
    fn view(life: &Life) -> ProcessHandle {
        let (fd, word) = life.share();
        // SAFETY: `fd` is the live memfd `life` owns; `dup` makes a descriptor owned here.
        let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(fd)) };
        ProcessHandle::open(std::process::id() as i32, Some((dup, word))).unwrap()
    }

    #[test]
    fn the_life_word_reads_alive_while_its_thread_holds_it() {
        let life = Life::get().expect("glibc's robust mutex word");
        let h = view(life);
        assert!(h.life.is_some(), "the word was not mapped");
        assert!(!h.exited());
    }

    #[test]
    fn the_kernel_marks_the_life_word_when_its_holder_exits() {
        // The holder returns at once: its exit marks the word as the process's end would.
        let life = Life::make(false).unwrap();
        let h = view(&life);
        let t = Instant::now();
        while !h.exited() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the word never changed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
