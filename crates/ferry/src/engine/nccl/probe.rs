//! What this machine has for NCCL: the library and its version, or why not.

use super::sys;

/// What this machine has for NCCL: the library (path and version) or why not.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NcclProbe {
    /// The library's name as it was opened, and its version (e.g. 22703 for 2.27.3), or why
    /// it is unusable.
    pub library: Result<(String, i32), String>,
}

/// Looks for the NCCL library. Never panics; needs no GPU.
pub fn probe() -> NcclProbe {
    NcclProbe {
        library: sys::lib().and_then(|l| {
            l.version()
                .map(|v| (l.path.clone(), v))
                .map_err(|c| format!("ncclGetVersion failed: {}", l.message(c, None)))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics() {
        // With or without the library: either a version or a reason.
        match probe().library {
            Ok((path, v)) => assert!(!path.is_empty() && v > 0),
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
