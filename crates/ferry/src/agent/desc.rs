//! The descriptor of a registration: what a peer needs to reach it, in a fixed little-endian
//! form of at most [`Descriptor::MAX_BYTES`] bytes (a 15,000-region table is under 1.7 MB, not
//! NIXL's 20 MB). Pure: no system call here.
//!
//! Layout (version 1): `b"FRY" 1`, agent id u64, owner pid u32, region id u64, transport u8,
//! device ordinal u32, owner's address u64, length u64, then the 64-byte CUDA IPC handle for
//! [`Transport::CudaIpc`] only (45 or 109 bytes).
//!
//! The transport is the seam for hosts to come: a new value (an RDMA key and address, an NCCL
//! rank) adds its own tail here and its own way to open it, and the request path above stays.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How a peer reaches a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// Pageable host memory read and written with `process_vm_readv`/`process_vm_writev`.
    CrossMemory,
    /// Host memory in a memfd the peer maps (the fd travels over the agent's socket).
    Shared,
    /// As `Shared`, page-locked with CUDA on both sides.
    SharedPinned,
    /// Device memory opened with `cuIpcOpenMemHandle`.
    CudaIpc,
    /// Device memory of the driver's virtual memory calls, its allocation passed as a file
    /// descriptor over the socket (`cuMemImportFromShareableHandle`).
    CudaVmm,
}

impl Transport {
    fn code(self) -> u8 {
        match self {
            Transport::CrossMemory => 0,
            Transport::Shared => 1,
            Transport::SharedPinned => 2,
            Transport::CudaIpc => 3,
            Transport::CudaVmm => 4,
        }
    }
    fn from_code(c: u8) -> Option<Transport> {
        Some(match c {
            0 => Transport::CrossMemory,
            1 => Transport::Shared,
            2 => Transport::SharedPinned,
            3 => Transport::CudaIpc,
            4 => Transport::CudaVmm,
            _ => return None,
        })
    }
    /// Short name, for errors and `Display`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Transport::CrossMemory => "cross-memory",
            Transport::Shared => "shared memory",
            Transport::SharedPinned => "pinned shared memory",
            Transport::CudaIpc => "CUDA IPC",
            Transport::CudaVmm => "CUDA VMM",
        }
    }
}

/// A registration's descriptor: small, plain, serializable (serde, or the compact
/// [`Descriptor::to_bytes`] form). Made by [`Region::descriptor`](super::Region::descriptor),
/// sent to a peer by any means, opened there with [`Peer::import`](super::Peer::import), which
/// asks the owner to confirm that it is still registered. Serde writes it as its compact bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub(crate) agent: u64,
    pub(crate) pid: u32,
    pub(crate) region: u64,
    pub(crate) transport: Transport,
    pub(crate) ordinal: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) ipc: Option<Box<[u8; 64]>>,
}

const MAGIC: &[u8; 4] = b"FRY\x01";
const HEAD: usize = 4 + 8 + 4 + 8 + 1 + 4 + 8 + 8;

impl Descriptor {
    /// The longest compact form, in bytes.
    pub const MAX_BYTES: usize = HEAD + 64;

    /// The bytes of the registration's descriptor (at most [`Descriptor::MAX_BYTES`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::MAX_BYTES);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.agent.to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.region.to_le_bytes());
        b.push(self.transport.code());
        b.extend_from_slice(&self.ordinal.to_le_bytes());
        b.extend_from_slice(&self.addr.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        if let Some(h) = &self.ipc {
            b.extend_from_slice(&h[..]);
        }
        b
    }

    /// Reads [`Descriptor::to_bytes`]'s form; `None` for bytes that are not one.
    pub fn from_bytes(b: &[u8]) -> Option<Descriptor> {
        if b.len() < HEAD || &b[..4] != MAGIC {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let transport = Transport::from_code(b[24])?;
        let ipc = match (transport, b.len() - HEAD) {
            (Transport::CudaIpc, 64) => Some(Box::new(b[HEAD..].try_into().expect("64 bytes"))),
            (Transport::CudaIpc, _) => return None,
            (_, 0) => None,
            _ => return None,
        };
        Some(Descriptor {
            agent: u64_at(4),
            pid: u32_at(12),
            region: u64_at(16),
            transport,
            ordinal: u32_at(25),
            addr: u64_at(29),
            len: u64_at(37),
            ipc,
        })
    }

    /// The registration's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for an empty registration (never made: registrations are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Serialize for Descriptor {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.to_bytes())
    }
}

impl<'de> Deserialize<'de> for Descriptor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Descriptor, D::Error> {
        struct Bytes;
        impl<'de> serde::de::Visitor<'de> for Bytes {
            type Value = Descriptor;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a ferry agent descriptor's bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Descriptor, E> {
                Descriptor::from_bytes(v).ok_or_else(|| E::custom("not a ferry agent descriptor"))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Descriptor, A::Error> {
                let mut v = Vec::with_capacity(Descriptor::MAX_BYTES);
                while let Some(b) = a.next_element::<u8>()? {
                    if v.len() == Descriptor::MAX_BYTES {
                        return Err(serde::de::Error::custom("too long for a descriptor"));
                    }
                    v.push(b);
                }
                self.visit_bytes(&v)
            }
        }
        d.deserialize_bytes(Bytes)
    }
}

impl std::fmt::Display for Descriptor {
    /// `region 3 of pid 1234 (shared memory, 1048576 bytes)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "region {} of pid {} ({}, {} bytes)",
            self.region,
            self.pid,
            self.transport.name(),
            self.len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{Descriptor, Transport};

    fn desc(transport: Transport, ipc: Option<Box<[u8; 64]>>) -> Descriptor {
        Descriptor {
            agent: 0x1122_3344_5566_7788,
            pid: 4242,
            region: 7,
            transport,
            ordinal: 1,
            addr: 0x7f00_0000_1000,
            len: 66 * 1024,
            ipc,
        }
    }

    #[test]
    fn compact_form_round_trips_and_stays_small() {
        for d in [
            desc(Transport::CrossMemory, None),
            desc(Transport::Shared, None),
            desc(Transport::SharedPinned, None),
            desc(Transport::CudaVmm, None),
            desc(Transport::CudaIpc, Some(Box::new([9; 64]))),
        ] {
            let b = d.to_bytes();
            assert!(b.len() <= Descriptor::MAX_BYTES && Descriptor::MAX_BYTES <= 256);
            assert_eq!(Descriptor::from_bytes(&b), Some(d.clone()));
            // Serde too (JSON here; any format).
            let j = serde_json::to_string(&d).unwrap();
            assert_eq!(serde_json::from_str::<Descriptor>(&j).unwrap(), d);
        }
        assert_eq!(desc(Transport::Shared, None).to_bytes().len(), 45);
    }

    #[test]
    fn garbage_is_not_a_descriptor() {
        let good = desc(Transport::Shared, None).to_bytes();
        assert_eq!(Descriptor::from_bytes(&good[..20]), None);
        let mut bad = good.clone();
        bad[0] = b'X';
        assert_eq!(Descriptor::from_bytes(&bad), None);
        let mut bad = good.clone();
        bad[24] = 9; // no such transport
        assert_eq!(Descriptor::from_bytes(&bad), None);
        let mut bad = good;
        bad.push(0); // a tail on a transport without one
        assert_eq!(Descriptor::from_bytes(&bad), None);
        let ipc = desc(Transport::CudaIpc, Some(Box::new([1; 64]))).to_bytes();
        assert_eq!(Descriptor::from_bytes(&ipc[..ipc.len() - 1]), None);
    }
}
