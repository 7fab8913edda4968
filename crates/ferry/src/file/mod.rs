//! Files <-> host memory and GPUs: byte ranges of a file loaded into any buffer ferry knows, and
//! stored back, in chunks read and written in parallel by a small pool of threads.
//!
//! - Host buffers (pageable, pinned, mapped, managed): each worker `pread`s (`pwrite`s) its
//!   chunks straight into (out of) the buffer.
//! - Other buffers (a GPU's memory): each chunk goes through one buffer of a ring of pinned
//!   bounce buffers: `pread` into the bounce buffer, then the engine given to
//!   [`FileEngine::with_engine`] (a [`CudaEngine`](crate::cuda::CudaEngine)) copies it to the
//!   device on its copy engine, while the other workers read the next chunks. Stores run the
//!   other way. This is KvikIO's "compat mode". Or GPUDirect Storage: each chunk is one
//!   `cuFileRead`/`cuFileWrite` straight between the file and the device buffer, where the
//!   `nvidia-fs` module exists, or wherever cuFile opens with [`CuFileMode::On`] (see
//!   [`choose`]). [`gds_probe`]`().auto` says which this host gets, and every device transfer's
//!   [`IoReport`] carries the transport used and why.
//! - `O_DIRECT` ([`FileConfig::direct`]): the file is opened a second time with `O_DIRECT`, and
//!   every piece whose file offset, memory address and length are multiples of 4096 uses it.
//!   The bounce buffers are page-aligned, so device transfers at aligned file offsets are
//!   direct throughout; reads at unaligned offsets read the aligned span around each chunk
//!   into the bounce buffer, so they are direct too. Host transfers into or out of unaligned
//!   buffers (a `Vec<u8>`) go through the bounce ring as well, copied by the worker. Writes at
//!   unaligned offsets, and the unaligned tail of a write, run buffered. A filesystem that refuses `O_DIRECT`,
//!   at open or at the first transfer, is not an error: the file runs buffered from then on.
//!   Each [`IoReport`] says how many bytes took which path and why `O_DIRECT` was not used.
//! - io_uring ([`FileConfig::uring`], on where the kernel allows it): the `O_DIRECT` part of a
//!   transfer is read (written) by fewer threads, each keeping up to
//!   [`FileConfig::uring_depth`] chunks in flight, into the buffer or the bounce ring's slots;
//!   [`IoReport::issued`] says whether io_uring or the threads issued them, and why.
//! - Errors: a read or write that fails, a file shorter than the range (checked at submit, and
//!   again by every read: a file that shrinks during a load fails it), are [`FileError`]s that
//!   name the file and the offset. Partial data is never reported as success. A failed request
//!   leaves the engine usable; nothing leaks (workers are persistent, bounce buffers return to
//!   the ring on every path).
//!
//! Requests: [`FileEngine::load`] and [`FileEngine::store`] take the buffer by value and return a
//! [`FileTransfer`] (wait, poll, or `.await` it; it hands the buffer back with an [`IoReport`]),
//! built on a [`Request`](crate::Request) like every engine's, and on the safe API's owned-buffer
//! machinery (the one under [`Transfer`](crate::Transfer)). [`FileEngine::load_into`] and
//! [`FileEngine::store_from`] borrow the buffer and block: they wait before they return, so
//! they need no scope. Built on them (`pieces.rs`, all blocking): [`FileEngine::read_all`] (a
//! whole file), [`FileEngine::load_up_to`] ("up to N bytes", as `pread` counts),
//! [`FileEngine::load_pieces`] (many ranges into one buffer), [`FileEngine::load_each`] (many
//! ranges, each into its own buffer) and [`FileEngine::store_pieces`], their transfers all in
//! flight at once.
//!
//! Not an [`Engine`](crate::Engine): a load or store moves bytes between a file and a buffer, and a
//! [`Job`](crate::Job) is two buffers of memory with layouts. A `FileEngine` keeps the same
//! contract as a [`Backend`](crate::Backend) whose work is a [`FileJob`] (a file range and a
//! buffer: requests out, refusals as [`SubmitError`](crate::SubmitError)s), and takes an
//! [`Engine`](crate::Engine) for the buffers it cannot reach itself
//! ([`FileEngine::with_engine`]).
//!
//! ```
//! use ferry::file::{FileConfig, FileEngine, OpenMode};
//! let path = std::env::temp_dir().join(format!("ferry-doc-file-{}", std::process::id()));
//! let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7) as u8).collect();
//! std::fs::write(&path, &data)?;
//!
//! let engine = FileEngine::new(FileConfig::new().threads(2))?;
//! let file = engine.open(&path, OpenMode::Read)?;
//! // 64 KiB at offset 4096, into an owned buffer handed back on completion.
//! let t = engine.load(&file, 4096, vec![0u8; 64 << 10])?;
//! let (buf, report) = t.wait()?;
//! assert_eq!(&buf[..], &data[4096..4096 + (64 << 10)]);
//! println!("{report}"); // bytes moved, and which path (O_DIRECT or buffered) they took
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Which calls block: `load`/`store` validate (they read the file's length) and queue; the
//! first transfer through the bounce ring allocates it; the first cuFile transfer of an engine
//! opens cuFile's driver, the first of a file registers it, and a large load registers its
//! buffer, all in the submitting call. `wait`, `load_into`, `store_from`,
//! `barrier` and dropping a [`FileTransfer`] block until the work is done.

mod completion;
mod config;
mod cufile;
mod engine;
mod error;
mod exec;
mod handle;
mod io;
mod issue;
mod pieces;
mod probe;
mod replace;
mod report;
mod ring;
mod submit;
mod transport;
mod uring;
mod xfer;

pub use completion::{FileFailed, FileTransfer};
pub use config::FileConfig;
pub use engine::{FileEngine, FileJob};
pub use error::{CuFileCode, FileError, IoOp, MoverError};
pub use handle::FileHandle;
pub(crate) use io::preallocate;
pub use io::{FileIo, OpenMode, OsFile};

pub use issue::{IoIssue, UringMode};
pub use pieces::{ReadInto, ReadPiece, WritePiece};
pub use probe::{gds_probe, GdsProbe};
pub use replace::Replacement;
pub use report::IoReport;
pub use ring::live_bounce_buffers;
pub use transport::{choose, Choice, CuFileMode, Facts, Transport, NO_NVIDIA_FS};
pub use uring::uring_ops_in_flight;
