//! The Linux area (`aml/area/linux.h`): `mmap` with AML's options, and NUMA areas
//! (`aml_area_linux_create(&area, nodemask, policy)`) whose mappings are bound by the kernel's
//! `mbind` (bind, preferred, interleave), called directly (`syscall`), without libnuma. The
//! area's `nodeset` has the layout of libnuma's `struct bitmask` (size in bits, `maskp`), so a
//! program may read it with libnuma's calls; it is part of the area's one `malloc` block.

use super::{AmlArea, AmlAreaOps};
use crate::error::{fail, guard, guard_ptr, inval, AML_EDOM, AML_ENOMEM, AML_FAILURE, AML_SUCCESS};
use crate::utils::bitmap::{AmlBitmap, AML_BITMAP_MAX, AML_BITMAP_NBITS, AML_BITMAP_SIZE};
use ferry_capi::Fail;
use std::ffi::{c_char, c_int, c_long, c_ulong, c_void};

/// The default policy: the thread's (no `mbind`).
pub const AML_AREA_LINUX_POLICY_DEFAULT: c_int = 0;
/// Allocate on the area's nodes only.
pub const AML_AREA_LINUX_POLICY_BIND: c_int = 1;
/// Allocate on the area's (first) node first, elsewhere when it is full.
pub const AML_AREA_LINUX_POLICY_PREFERRED: c_int = 2;
/// Spread the pages over the area's nodes, round-robin.
pub const AML_AREA_LINUX_POLICY_INTERLEAVE: c_int = 3;

/// `mbind`'s flag: move the pages already there (AML's flags).
const MPOL_MF_MOVE: c_ulong = 1 << 1;
/// `get_mempolicy`'s flag: the policy of the page at an address.
const MPOL_F_ADDR: c_ulong = 1 << 1;
/// `get_mempolicy`'s flag: the nodes this thread may use.
const MPOL_F_MEMS_ALLOWED: c_ulong = 1 << 2;
/// The mode bits of a policy (its flags are above).
const MPOL_MODE_MASK: c_int = (1 << 13) - 1;
/// The node masks passed to the kernel: AML's bitmap's 2048 bits. The kernel reads
/// `maxnode - 1` bits, hence the one more (as libnuma passes).
const MAXNODE: c_ulong = AML_BITMAP_MAX as c_ulong + 1;

/// libnuma's `struct bitmask`: `size` bits in `maskp`.
#[repr(C)]
pub struct NumaBitmask {
    /// Number of bits.
    pub size: c_ulong,
    /// The bits, `size / (8 * sizeof(unsigned long))` words.
    pub maskp: *mut c_ulong,
}

/// `struct aml_area_linux_data`.
#[repr(C)]
pub struct AmlAreaLinuxData {
    /// The nodes (NULL: the ready area, no binding).
    pub nodeset: *mut NumaBitmask,
    /// `AML_AREA_LINUX_POLICY_*`.
    pub policy: c_int,
}

// SAFETY: the ready area's data is immutable (a NULL nodeset).
unsafe impl Sync for AmlAreaLinuxData {}

/// `struct aml_area_linux_mmap_options`: `mmap`'s arguments.
#[repr(C)]
pub struct AmlAreaLinuxMmapOptions {
    /// Address hint.
    pub ptr: *mut c_void,
    /// `MAP_*` flags.
    pub flags: c_int,
    /// `PROT_*` protection.
    pub mode: c_int,
    /// File descriptor (-1: none).
    pub fd: c_int,
    /// Offset in the file.
    pub offset: libc::off_t,
}

/// The ready area's data: no nodeset, the default policy.
#[no_mangle]
pub static aml_area_linux_data_default: AmlAreaLinuxData = AmlAreaLinuxData {
    nodeset: std::ptr::null_mut(),
    policy: AML_AREA_LINUX_POLICY_DEFAULT,
};

/// The Linux area's methods (`mmap` binds as the area's policy says).
#[no_mangle]
pub static aml_area_linux_ops: AmlAreaOps = AmlAreaOps {
    mmap: Some(aml_area_linux_mmap_mbind),
    munmap: Some(aml_area_linux_munmap),
    fprintf: Some(aml_area_linux_fprintf),
};

/// The ready Linux area: no binding.
#[no_mangle]
pub static aml_area_linux: AmlArea = AmlArea {
    ops: &aml_area_linux_ops,
    data: std::ptr::from_ref(&aml_area_linux_data_default)
        .cast_mut()
        .cast(),
};

/// The kernel's policy of an AML one.
fn mpol(policy: c_int) -> Result<c_int, Fail> {
    Ok(match policy {
        AML_AREA_LINUX_POLICY_DEFAULT => libc::MPOL_DEFAULT,
        AML_AREA_LINUX_POLICY_BIND => libc::MPOL_BIND,
        AML_AREA_LINUX_POLICY_PREFERRED => libc::MPOL_PREFERRED,
        AML_AREA_LINUX_POLICY_INTERLEAVE => libc::MPOL_INTERLEAVE,
        p => return Err(inval(format!("unknown Linux area policy {p}"))),
    })
}

fn os_error(what: &str) -> Fail {
    fail(
        AML_FAILURE,
        format!("{what}: {}", std::io::Error::last_os_error()),
    )
}

/// The nodes this thread may allocate on (the kernel's `Mems_allowed`).
fn mems_allowed() -> Result<[c_ulong; AML_BITMAP_SIZE], Fail> {
    let mut mask = [0 as c_ulong; AML_BITMAP_SIZE];
    // SAFETY: get_mempolicy writes `MAXNODE - 1` bits (AML_BITMAP_SIZE words) to `mask`; the
    // mode pointer and address are NULL / 0, as MPOL_F_MEMS_ALLOWED allows.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            std::ptr::null_mut::<c_int>(),
            mask.as_mut_ptr(),
            MAXNODE,
            std::ptr::null_mut::<c_void>(),
            MPOL_F_MEMS_ALLOWED,
        )
    };
    if rc != 0 {
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            // A kernel without NUMA: one node, 0.
            mask[0] = 1;
            return Ok(mask);
        }
        return Err(os_error("get_mempolicy(MPOL_F_MEMS_ALLOWED)"));
    }
    Ok(mask)
}

/// The words of a nodeset (`size` bits).
///
/// # Safety
/// 1. `n` is NULL or a valid bitmask whose `maskp` holds `size` bits.
unsafe fn words<'a>(n: *const NumaBitmask) -> Option<&'a [c_ulong]> {
    // SAFETY: (1).
    let n = unsafe { n.as_ref() }?;
    if n.maskp.is_null() {
        return None;
    }
    let len = (n.size as usize).div_ceil(AML_BITMAP_NBITS);
    // SAFETY: (1).
    Some(unsafe { std::slice::from_raw_parts(n.maskp, len) })
}

/// Creates a NUMA area: its mappings are bound to `nodemask` (NULL: every node this thread
/// may use) as `policy` says. `-AML_EINVAL`: NULL `area`, an unknown policy; `-AML_EDOM`: a
/// node this thread may not use; `-AML_FAILURE`: the kernel refused to tell the allowed
/// nodes; `-AML_ENOMEM`.
///
/// # Safety
/// 1. `area` is NULL or valid for one write; `nodemask` NULL or a valid bitmap.
#[no_mangle]
pub unsafe extern "C" fn aml_area_linux_create(
    area: *mut *mut AmlArea,
    nodemask: *const AmlBitmap,
    policy: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let out = unsafe { area.as_mut() }.ok_or_else(|| inval("area is NULL"))?;
        *out = std::ptr::null_mut();
        mpol(policy)?;
        let allowed = mems_allowed()?;
        // SAFETY: (1).
        let mask = match unsafe { nodemask.as_ref() } {
            None => allowed,
            Some(b) => {
                if let Some(i) = (0..AML_BITMAP_SIZE).find(|&i| b.mask[i] & !allowed[i] != 0) {
                    let bit =
                        i * AML_BITMAP_NBITS + (b.mask[i] & !allowed[i]).trailing_zeros() as usize;
                    return Err(fail(
                        AML_EDOM,
                        format!("node {bit} is not one this thread may allocate on"),
                    ));
                }
                b.mask
            }
        };
        #[repr(C)]
        struct Block {
            area: AmlArea,
            data: AmlAreaLinuxData,
            nodeset: NumaBitmask,
            mask: [c_ulong; AML_BITMAP_SIZE],
        }
        // SAFETY: malloc of a non-zero size; the result is checked.
        let b = unsafe { libc::malloc(std::mem::size_of::<Block>()) }.cast::<Block>();
        if b.is_null() {
            return Err(fail(AML_ENOMEM, "malloc failed"));
        }
        // SAFETY: `b` holds one `Block` (malloc's alignment suffices: pointers and longs); the
        // pointers stored point inside it.
        unsafe {
            let data = &raw mut (*b).data;
            let nodeset = &raw mut (*b).nodeset;
            let words = &raw mut (*b).mask;
            words.write(mask);
            nodeset.write(NumaBitmask {
                size: AML_BITMAP_MAX as c_ulong,
                maskp: words.cast(),
            });
            data.write(AmlAreaLinuxData { nodeset, policy });
            (&raw mut (*b).area).write(AmlArea {
                ops: &aml_area_linux_ops,
                data: data.cast(),
            });
        }
        *out = b.cast();
        Ok(AML_SUCCESS)
    })
}

/// Frees an area from `aml_area_linux_create` and sets `*area` to NULL (NULL: no-op). Its
/// mappings stay (unmap them first).
///
/// # Safety
/// 1. `area` is NULL or valid for a read and a write; `*area` NULL or an area from
///    `aml_area_linux_create` not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn aml_area_linux_destroy(area: *mut *mut AmlArea) {
    // SAFETY: (1).
    let Some(slot) = (unsafe { area.as_mut() }) else {
        return;
    };
    if slot.is_null() || std::ptr::eq(*slot, &aml_area_linux) {
        return;
    }
    // SAFETY: (1): one malloc block.
    unsafe { libc::free(slot.cast()) };
    *slot = std::ptr::null_mut();
}

/// Applies the area's policy to `size` bytes at `ptr` (the kernel's `mbind`, moving pages
/// already there). The default policy without a nodeset is the thread's: nothing to do.
/// `-AML_EINVAL`: NULL `bind`, an unknown policy; `-AML_FAILURE`: the kernel refused.
///
/// # Safety
/// 1. `bind` is NULL or a valid Linux area's data; `ptr` page-aligned, `size` bytes mapped.
#[no_mangle]
pub unsafe extern "C" fn aml_area_linux_mbind(
    bind: *mut AmlAreaLinuxData,
    ptr: *mut c_void,
    size: usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let b = unsafe { bind.as_ref() }.ok_or_else(|| inval("area data is NULL"))?;
        let mode = mpol(b.policy)?;
        // MPOL_DEFAULT takes no nodes (AML passes them, and the kernel refuses: its areas of
        // the default policy cannot map).
        let (mask, maxnode) = if mode == libc::MPOL_DEFAULT {
            (std::ptr::null(), 0)
        } else {
            // SAFETY: (1).
            match unsafe { words(b.nodeset) } {
                Some(w) => (w.as_ptr(), (w.len() * AML_BITMAP_NBITS) as c_ulong + 1),
                None => return Err(inval("area without a nodeset")),
            }
        };
        // SAFETY: (1); `mask` holds `maxnode - 1` bits or is NULL.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                ptr,
                size,
                mode as c_long,
                mask,
                maxnode,
                MPOL_MF_MOVE,
            )
        };
        if rc != 0 {
            return Err(os_error("mbind"));
        }
        Ok(AML_SUCCESS)
    })
}

/// Whether the page at `ptr` is bound as the area says: 1 if so, 0 if not; `-AML_EINVAL` if
/// the kernel cannot tell (or NULL arguments). Bind: the same nodes; interleave: no node
/// outside the area's; preferred and default: the mode only. (AML compares the kernel's modes
/// with its own enum's values, which differ.)
///
/// # Safety
/// 1. `area_data` is NULL or a valid Linux area's data; `ptr` an address of this process.
#[no_mangle]
pub unsafe extern "C" fn aml_area_linux_check_binding(
    area_data: *mut AmlAreaLinuxData,
    ptr: *mut c_void,
    _size: usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let b = unsafe { area_data.as_ref() }.ok_or_else(|| inval("area data is NULL"))?;
        let want = mpol(b.policy)?;
        let mut mode: c_int = 0;
        let mut mask = [0 as c_ulong; AML_BITMAP_SIZE];
        // SAFETY: the kernel writes one int and `MAXNODE - 1` bits (AML_BITMAP_SIZE words).
        let rc = unsafe {
            libc::syscall(
                libc::SYS_get_mempolicy,
                &mut mode,
                mask.as_mut_ptr(),
                MAXNODE,
                ptr,
                MPOL_F_ADDR,
            )
        };
        if rc != 0 {
            return Err(inval(format!(
                "get_mempolicy(MPOL_F_ADDR): {}",
                std::io::Error::last_os_error()
            )));
        }
        let mode = mode & MPOL_MODE_MASK;
        if mode != want {
            return Ok(0);
        }
        let mut ours = [0 as c_ulong; AML_BITMAP_SIZE];
        // SAFETY: (1).
        if let Some(w) = unsafe { words(b.nodeset) } {
            let n = w.len().min(AML_BITMAP_SIZE);
            ours[..n].copy_from_slice(&w[..n]);
        }
        let ok = match mode {
            libc::MPOL_BIND => mask == ours,
            libc::MPOL_INTERLEAVE => mask.iter().zip(&ours).all(|(k, o)| k & !o == 0),
            _ => true,
        };
        Ok(c_int::from(ok))
    })
}

/// `mmap` of `size` bytes: with `opts` (a `struct aml_area_linux_mmap_options`: address hint,
/// flags, protection, file, offset), else anonymous, private, read-write. No binding. NULL with
/// `aml_errno` on failure (`AML_ENOMEM` when the kernel is out of memory, else `AML_FAILURE`).
///
/// # Safety
/// 1. `opts` is NULL or a valid `struct aml_area_linux_mmap_options`.
#[no_mangle]
pub unsafe extern "C" fn aml_area_linux_mmap(
    _area_data: *const c_void,
    size: usize,
    opts: *mut c_void,
) -> *mut c_void {
    guard_ptr(|| {
        // SAFETY: (1).
        let o = unsafe { opts.cast::<AmlAreaLinuxMmapOptions>().as_ref() };
        let (addr, prot, flags, fd, off) = match o {
            Some(o) => (o.ptr, o.mode, o.flags, o.fd, o.offset),
            None => (
                std::ptr::null_mut(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ),
        };
        // SAFETY: the caller's mapping request; the result is checked. (A MAP_FIXED hint
        // replaces what was there, as with mmap itself.)
        let p = unsafe { libc::mmap(addr, size, prot, flags, fd, off) };
        if p == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            let code = if e.raw_os_error() == Some(libc::ENOMEM) {
                AML_ENOMEM
            } else {
                AML_FAILURE
            };
            return Err(fail(code, format!("mmap of {size} bytes: {e}")));
        }
        Ok(p)
    })
}

/// The Linux area's `mmap`: [`aml_area_linux_mmap`], then the area's binding
/// ([`aml_area_linux_mbind`]) unless it has the default policy and no nodeset; a failed
/// binding unmaps and returns NULL (`aml_errno` `AML_FAILURE`).
///
/// # Safety
/// 1. `area_data` is NULL (the ready area) or a valid Linux area's data; `opts` as
///    [`aml_area_linux_mmap`]'s.
#[no_mangle]
pub unsafe extern "C" fn aml_area_linux_mmap_mbind(
    area_data: *const c_void,
    size: usize,
    opts: *mut c_void,
) -> *mut c_void {
    // SAFETY: (1).
    let p = unsafe { aml_area_linux_mmap(area_data, size, opts) };
    // SAFETY: (1).
    let Some(d) = (unsafe { area_data.cast::<AmlAreaLinuxData>().as_ref() }) else {
        return p;
    };
    if p.is_null() || (d.nodeset.is_null() && d.policy == AML_AREA_LINUX_POLICY_DEFAULT) {
        return p;
    }
    // SAFETY: (1); `p` is `size` bytes just mapped, page-aligned.
    let rc = unsafe { aml_area_linux_mbind(area_data.cast_mut().cast(), p, size) };
    if rc != AML_SUCCESS {
        // SAFETY: the mapping just made.
        unsafe { libc::munmap(p, size) };
        crate::error::set_errno(rc);
        return std::ptr::null_mut();
    }
    p
}

/// Unmaps `size` bytes at `ptr`. `-AML_EINVAL` if the kernel refuses (AML's is
/// `-AML_FAILURE`: the only cause is a bad argument).
///
/// # Safety
/// 1. `ptr`/`size` a mapping from this area, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn aml_area_linux_munmap(
    _area_data: *const c_void,
    ptr: *mut c_void,
    size: usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        if unsafe { libc::munmap(ptr, size) } != 0 {
            return Err(inval(format!(
                "munmap: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(AML_SUCCESS)
    })
}

/// Prints the area as AML does: its data, the nodeset (size and words), the policy.
///
/// # Safety
/// 1. `data` NULL or a valid Linux area's data; `stream` NULL or a valid `FILE *`; `prefix`
///    NULL or a C string.
#[no_mangle]
pub unsafe extern "C" fn aml_area_linux_fprintf(
    data: *const c_void,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    guard(|| {
        let mut lines = vec![format!("area-linux: {data:p}")];
        // SAFETY: (1).
        if let Some(d) = unsafe { data.cast::<AmlAreaLinuxData>().as_ref() } {
            // SAFETY: (1).
            match unsafe { (d.nodeset.as_ref(), words(d.nodeset)) } {
                (Some(n), Some(w)) => {
                    lines.push(format!("bitmask: size: {}", n.size));
                    let hex: String = w.iter().map(|x| format!("{x:8x}")).collect();
                    lines.push(format!("bitmask: maskp: {hex}"));
                }
                _ => lines.push("bitmask: 0x0".into()),
            }
            let p = match d.policy {
                AML_AREA_LINUX_POLICY_DEFAULT => "default",
                AML_AREA_LINUX_POLICY_BIND => "bind",
                AML_AREA_LINUX_POLICY_PREFERRED => "preferred",
                AML_AREA_LINUX_POLICY_INTERLEAVE => "interleave",
                _ => "unknown",
            };
            lines.push(format!("policy: {p}"));
        }
        // SAFETY: (1).
        unsafe { crate::dma::print_lines(stream, prefix, &lines) }
    })
}
