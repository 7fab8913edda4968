//! Whether GPUDirect Storage (cuFile) could move file bytes straight to a GPU here, and why not.

/// Why device loads and stores go through the pinned bounce ring instead of cuFile, in words
/// (KvikIO's users ask for exactly this: a clear reason when GDS is not used). `Ok` would mean
/// that cuFile can be used; ferry has no cuFile path yet, so today this is always `Err`, with
/// the first missing piece named: the `nvidia-fs` kernel module, the `libcufile` library, or
/// ferry's own cuFile path.
///
/// ```
/// match ferry::file::gds_status() {
///     Ok(()) => println!("cuFile usable"),
///     Err(why) => println!("bounce ring: {why}"),
/// }
/// ```
pub fn gds_status() -> Result<(), String> {
    let module = std::path::Path::new("/proc/driver/nvidia-fs").exists()
        || std::path::Path::new("/sys/module/nvidia_fs").exists();
    if !module {
        return Err("GPUDirect Storage not used: the nvidia-fs kernel module is not loaded".into());
    }
    if !libcufile_present() {
        return Err("GPUDirect Storage not used: libcufile.so was not found".into());
    }
    Err("GPUDirect Storage not used: ferry has no cuFile path yet (nvidia-fs and libcufile are present)".into())
}

fn libcufile_present() -> bool {
    ["libcufile.so.0", "libcufile.so"].iter().any(|name| {
        let Ok(c) = std::ffi::CString::new(*name) else {
            return false;
        };
        // SAFETY: `c` is a valid NUL-terminated string; the handle, if any, is closed at once.
        // Loading runs only the library's initialisers.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            if h.is_null() {
                false
            } else {
                libc::dlclose(h);
                true
            }
        }
    })
}
