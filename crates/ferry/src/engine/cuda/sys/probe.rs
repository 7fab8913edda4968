//! What the CUDA backend finds on this machine. Never panics: without a driver it says why.

use super::driver;
use cudarc::driver::sys;
use serde::Serialize;
use std::path::Path;
use std::sync::OnceLock;

/// The driver, the devices and the links between them, as found at run time.
///
/// ```
/// let p = ferry::cuda::probe();
/// match &p.driver {
///     Ok(v) => println!("CUDA driver {v}, {} device(s)", p.devices.len()),
///     Err(why) => println!("no CUDA: {why}"),
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CudaProbe {
    /// The driver's CUDA version (e.g. `13000` for 13.0), or why there is no usable driver.
    pub driver: Result<i32, String>,
    /// One entry per device, by ordinal.
    pub devices: Vec<DeviceInfo>,
    /// `peer[i][j]`: device `i` can access memory of device `j` directly (`cuDeviceCanAccessPeer`;
    /// `false` on the diagonal).
    pub peer: Vec<Vec<bool>>,
    /// Whether the nvidia-fs kernel module (GPUDirect Storage) is loaded.
    pub nvidia_fs: bool,
}

/// One GPU as the driver and sysfs describe it. A field the driver could not report is `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    /// Ordinal.
    pub ordinal: u32,
    /// Marketing name (`NVIDIA H200`).
    pub name: String,
    /// Total memory, bytes.
    pub total_mem: Option<usize>,
    /// Copy engines that can run at the same time as kernels (`ASYNC_ENGINE_COUNT`).
    pub async_engines: Option<i32>,
    /// Streaming multiprocessors.
    pub sm_count: Option<i32>,
    /// Compute capability (major, minor).
    pub compute_capability: Option<(i32, i32)>,
    /// Unified virtual addressing with the host.
    pub unified_addressing: Option<bool>,
    /// `cuMemHostRegister` supported.
    pub host_register: Option<bool>,
    /// Can map page-locked host memory into its address space.
    pub can_map_host_memory: Option<bool>,
    /// Managed memory can be accessed concurrently by host and device.
    pub concurrent_managed_access: Option<bool>,
    /// PCI bus id (`0000:19:00.0`).
    pub pci_bus_id: Option<String>,
    /// Current PCIe link generation (from sysfs `current_link_speed`).
    pub pcie_gen: Option<u32>,
    /// Current PCIe link width (lanes, from sysfs `current_link_width`).
    pub pcie_width: Option<u32>,
    /// NUMA node of the device (sysfs; `None` if unknown or -1).
    pub numa_node: Option<u32>,
}

/// Probes the driver and every device. Never panics.
pub fn probe() -> CudaProbe {
    let nvidia_fs = nvidia_fs_loaded();
    let version = match driver::driver() {
        Ok(v) => v,
        Err(e) => {
            return CudaProbe {
                driver: Err(e.to_string()),
                devices: Vec::new(),
                peer: Vec::new(),
                nvidia_fs,
            }
        }
    };
    let count = driver::device_count().unwrap_or(0);
    let mut handles = Vec::new();
    let mut devices = Vec::new();
    for ordinal in 0..count {
        let Ok(dev) = cudarc::driver::result::device::get(ordinal as i32) else {
            continue;
        };
        handles.push((ordinal, dev));
        devices.push(device_info(ordinal, dev));
    }
    let mut peer = vec![vec![false; count as usize]; count as usize];
    for &(i, di) in &handles {
        for &(j, dj) in &handles {
            if i != j {
                let mut can = 0;
                // SAFETY: `can` is a valid out-pointer; both handles came from cuDeviceGet.
                let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, di, dj) };
                peer[i as usize][j as usize] = r == sys::CUresult::CUDA_SUCCESS && can != 0;
            }
        }
    }
    CudaProbe {
        driver: Ok(version),
        devices,
        peer,
        nvidia_fs,
    }
}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Option<i32> {
    // SAFETY: `dev` came from cuDeviceGet; the attribute is a plain enum value.
    unsafe { cudarc::driver::result::device::get_attribute(dev, a) }.ok()
}

pub(crate) fn device_info(ordinal: u32, dev: sys::CUdevice) -> DeviceInfo {
    use sys::CUdevice_attribute as A;
    let name = cudarc::driver::result::device::get_name(dev)
        .unwrap_or_else(|e| format!("<{}>", super::error::error_string(e.0)));
    // SAFETY: `dev` came from cuDeviceGet.
    let total_mem = unsafe { cudarc::driver::result::device::total_mem(dev) }.ok();
    let cc = match (
        attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
        attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
    ) {
        (Some(a), Some(b)) => Some((a, b)),
        _ => None,
    };
    let flag = |a| attr(dev, a).map(|v| v != 0);
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: `buf` holds `buf.len()` chars; the driver writes a NUL-terminated string into it.
    let r = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) };
    let pci_bus_id = (r == sys::CUresult::CUDA_SUCCESS).then(|| {
        // SAFETY: the driver NUL-terminated the string inside `buf` on success.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .to_lowercase()
    });
    let sysfs = |file: &str| -> Option<String> {
        let id = pci_bus_id.as_ref()?;
        std::fs::read_to_string(format!("/sys/bus/pci/devices/{id}/{file}"))
            .ok()
            .map(|s| s.trim().to_string())
    };
    DeviceInfo {
        ordinal,
        name,
        total_mem,
        async_engines: attr(dev, A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT),
        sm_count: attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        compute_capability: cc,
        unified_addressing: flag(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING),
        host_register: flag(A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED),
        can_map_host_memory: flag(A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY),
        concurrent_managed_access: flag(A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS),
        pcie_gen: sysfs("current_link_speed").as_deref().and_then(pcie_gen),
        pcie_width: sysfs("current_link_width").and_then(|s| s.parse().ok()),
        numa_node: sysfs("numa_node")
            .and_then(|s| s.parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok()),
        pci_bus_id,
    }
}

/// Whether kernels reach page-locked host memory at its host address: unified addressing on
/// every GPU of the machine, and registered memory's device pointer its host pointer
/// (`CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`, which the driver honours only
/// where every visible device has it; memory the driver allocated page-locked is at its host
/// address under unified addressing). Then copies between several host allocations and a device
/// are one kernel's list, at offsets from one base. False where a device cannot be asked.
pub(crate) fn host_memory_at_host_address() -> bool {
    use sys::CUdevice_attribute as A;
    let Ok(count) = driver::device_count() else {
        return false;
    };
    (0..count).all(|i| {
        cudarc::driver::result::device::get(i as i32).is_ok_and(|dev| {
            [
                A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
                A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
            ]
            .into_iter()
            .all(|a| attr(dev, a) == Some(1))
        })
    })
}

/// Whether the host may touch managed memory while GPU `dev` runs kernels
/// (`CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS`): without it a running kernel makes all
/// managed memory inaccessible to the host until the device synchronizes.
pub(crate) fn concurrent_managed_access(dev: sys::CUdevice) -> bool {
    attr(
        dev,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
    ) == Some(1)
}

/// PCIe generation from a sysfs link speed such as `32.0 GT/s PCIe`.
fn pcie_gen(speed: &str) -> Option<u32> {
    let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
    Some(match gts {
        x if x >= 60.0 => 6,
        x if x >= 30.0 => 5,
        x if x >= 15.0 => 4,
        x if x >= 7.0 => 3,
        x if x >= 4.0 => 2,
        _ => 1,
    })
}

/// Whether the `nvidia-fs` kernel module (real GPUDirect Storage) is loaded, looked at once per
/// process. Loads nothing: a program that wants cuFile's compatibility mode without it can set
/// `CUFILE_FORCE_COMPAT_MODE=true` after asking this and before cuFile is first used.
pub fn nvidia_fs_loaded() -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| {
        Path::new("/proc/driver/nvidia-fs").exists() || Path::new("/sys/module/nvidia_fs").exists()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn pcie_gen_from_sysfs_speed() {
        assert_eq!(super::pcie_gen("32.0 GT/s PCIe"), Some(5));
        assert_eq!(super::pcie_gen("16.0 GT/s PCIe"), Some(4));
        assert_eq!(super::pcie_gen("8.0 GT/s"), Some(3));
        assert_eq!(super::pcie_gen("2.5 GT/s"), Some(1));
        assert_eq!(super::pcie_gen("Unknown"), None);
    }
}
