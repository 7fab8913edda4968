//! Checkpoints: safetensors files (and sharded checkpoints through their
//! `*.safetensors.index.json`) loaded into GPU, pinned or pageable memory through the
//! [`FileEngine`](crate::file::FileEngine), and saved back.
//!
//! - [`load`](fn@load) (of a file, an index, or a model's folder: [`resolve`]) reads the
//!   header (checked tensor by tensor, then by the `safetensors` crate,
//!   the format's reference implementation), picks the tensors asked for
//!   ([`LoadOptions::names`], [`LoadOptions::filter`]), allocates memory for them
//!   ([`Target`]: a GPU, pinned or pageable host memory; [`Placement`]: one allocation for
//!   all, or one per tensor) and moves the bytes with the file engine's parallel reads: in a
//!   packed allocation, tensors next to each other in the file are read as one piece, so a
//!   whole checkpoint is one large read per file. Device loads take the file engine's
//!   file -> device path (its pinned bounce ring and the CUDA engine given to
//!   [`FileEngine::with_engine`](crate::file::FileEngine::with_engine)), into that engine's
//!   GPU: [`Target::Device`] names no ordinal, the file engine's engine does, once.
//! - [`load_into`] reads tensors into memory the caller already has ([`Dest`]: one
//!   destination per tensor, byte count, dtype and shape checked before anything is read),
//!   allocating nothing: reloading into a model's parameters, or into the buffers of an
//!   earlier [`Placement::PerTensor`] load.
//! - [`Checkpoint`] holds the memory and, per tensor, its name, dtype, shape and byte range in
//!   the file ([`Tensor`]); its memory is borrowed by name as a view that knows where it lives
//!   ([`Checkpoint::view`]): a [`HostView`] (bytes, and typed slices of an [`Element`] type
//!   matching the dtype) or a [`DeviceView`] (its `device_ptr` for other libraries), each
//!   [`Memory`](crate::memory::Memory) for engines and saves.
//! - [`save`](fn@save) writes tensors from any memory the engine reaches (device buffers included) to
//!   a safetensors file, laid out as the reference writer does, through the file engine; the
//!   file appears under its name only once complete ([`SaveOptions::fsync`] for durability;
//!   [`SaveOptions::interrupt`] stops it between batches, leaving nothing behind). To an
//!   index path (`model.safetensors.index.json`) it writes a sharded checkpoint, all shards at
//!   once ([`SaveOptions::shard_bytes`]).
//! - [`Checkpoint::snapshot`] copies tensors out of their memory (a GPU's, into pinned host
//!   memory) and returns once they may change; [`Checkpoint::save_in_background`] writes the
//!   copy on a thread of its own; [`Checkpoint::snapshot_save`] does both within a memory
//!   bound ([`SaveOptions::snapshot_bytes`]), its memory kept for the next save where asked
//!   ([`SaveOptions::keep_snapshot`]: a training loop's stall is then the copy alone).
//! - Errors: [`CheckpointError`], one variant per fault, naming the file and the tensor;
//!   nothing is reported as loaded when one is returned.
//!
//! ```
//! use ferry::checkpoint::{self, Dtype, LoadOptions, SaveOptions, SaveTensor, Target};
//! use ferry::file::{FileConfig, FileEngine};
//! let path = std::env::temp_dir().join(format!("ferry-doc-ckpt-{}.safetensors", std::process::id()));
//! let engine = FileEngine::new(FileConfig::new().threads(2))?;
//!
//! // Save two tensors from host memory...
//! let w: Vec<f32> = (0..6).map(|i| i as f32).collect();
//! let b = vec![1u16; 3];
//! let tensors = [
//!     SaveTensor::new("w", Dtype::F32, &[2, 3], &w),
//!     SaveTensor::new("b", Dtype::BF16, &[3], &b),
//! ];
//! checkpoint::save(&engine, &path, &tensors, &SaveOptions::new())?;
//!
//! // ...and load one of them back into pageable memory (`Target::Device` for the GPU of
//! // a file engine made by `FileEngine::with_engine` with that GPU's `CudaEngine`).
//! let ckpt = checkpoint::load(&engine, &path, &LoadOptions::new(Target::Pageable).names(["w"]))?;
//! let t = ckpt.host("w").expect("loaded to host memory");
//! assert_eq!((t.dtype(), t.shape()), (Dtype::F32, &[2, 3][..]));
//! assert_eq!(t.as_slice::<f32>()?, &w[..]);
//! assert!(ckpt.view("b").is_none());
//! println!("{}", ckpt.report());
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod dirty;
mod error;
mod header;
mod into;
mod kept;
mod load;
mod loaded;
mod options;
mod save;
mod snapshot;
mod stream;
mod view;
mod write;

pub use error::CheckpointError;
pub use header::{read_header, tensor_bytes, Header, TensorEntry};
pub use into::{load_files_into, load_into, Dest};
pub use load::{entries, load, load_files, resolve, MAX_INDEX_BYTES};
pub use loaded::{Checkpoint, LoadReport, Tensor, TensorBuffer};
pub use options::{
    Filter, LoadOptions, Placement, Progress, SaveOptions, SaveTensor, Select, Target, Writer,
    MAX_ALIGN,
};
pub use safetensors::Dtype;
pub use save::{save, SaveReport};
pub use view::{DeviceView, Element, HostView, TensorView};
