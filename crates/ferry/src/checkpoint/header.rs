//! A safetensors file's header: read through the file engine, checked entry by entry so that
//! each fault is a specific error naming the tensor, then handed to the `safetensors` crate
//! (the format's reference implementation) as the final word.

use super::error::CheckpointError;
use crate::file::{FileEngine, FileHandle};
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The format's limit on the JSON header's length.
const MAX_HEADER: u64 = 100_000_000;

/// One tensor of a safetensors file, as its header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// Its name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions (empty for a 0-d tensor).
    pub shape: Vec<usize>,
    /// Byte range in the file (absolute: the data section's offsets plus the header).
    pub file_range: Range<u64>,
}

impl TensorEntry {
    /// Bytes of data.
    pub fn len(&self) -> u64 {
        self.file_range.end - self.file_range.start
    }
    /// True for a tensor with no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A safetensors file's header, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The file.
    pub path: PathBuf,
    /// Bytes of the JSON header (padding included).
    pub header_len: u64,
    /// Offset of the data section (8 + `header_len`).
    pub data_start: u64,
    /// Bytes of the data section.
    pub data_len: u64,
    /// The tensors, in file order.
    pub tensors: Vec<TensorEntry>,
    /// The `__metadata__` string map (empty if absent).
    pub metadata: BTreeMap<String, String>,
}

impl Header {
    /// The tensor whose bytes hold file offset `offset`, if one (for naming a failed read).
    pub fn tensor_at(&self, offset: u64) -> Option<&TensorEntry> {
        let i = self.tensors.partition_point(|t| t.file_range.end <= offset);
        self.tensors
            .get(i)
            .filter(|t| t.file_range.contains(&offset))
    }
}

/// Reads and checks the header of the safetensors file open in `file`, through `engine`.
///
/// Errors: every malformed header as its own [`CheckpointError`] variant naming the file
/// (and the tensor at fault): [`TooShort`](CheckpointError::TooShort),
/// [`HeaderBeyondFile`](CheckpointError::HeaderBeyondFile),
/// [`NotUtf8`](CheckpointError::NotUtf8), [`BadJson`](CheckpointError::BadJson),
/// [`UnknownDtype`](CheckpointError::UnknownDtype), [`BadOffsets`](CheckpointError::BadOffsets),
/// [`Overlap`](CheckpointError::Overlap), [`Gap`](CheckpointError::Gap),
/// [`OutsideData`](CheckpointError::OutsideData),
/// [`SizeMismatch`](CheckpointError::SizeMismatch),
/// [`TrailingBytes`](CheckpointError::TrailingBytes),
/// [`Duplicate`](CheckpointError::Duplicate) (a name given twice in the header).
pub fn read_header(engine: &FileEngine, file: &FileHandle) -> Result<Header, CheckpointError> {
    let path = file.path().to_path_buf();
    let ferr = |source| CheckpointError::File {
        path: path.clone(),
        tensor: None,
        source,
    };
    let file_len = file.len().map_err(ferr)?;
    let mut n8 = [0u8; 8];
    let (got, _) = engine.load_up_to(file, 0, &mut n8).map_err(ferr)?;
    // Both: the read takes the file's length anew, and a file that grew since `file_len`
    // (a writer filling it) gives 8 bytes where `file_len` is still under 8.
    if got < 8 || file_len < 8 {
        return Err(CheckpointError::TooShort { path, file_len });
    }
    let header_len = u64::from_le_bytes(n8);
    if header_len > MAX_HEADER {
        return Err(CheckpointError::HeaderTooLarge { path, header_len });
    }
    if header_len > file_len - 8 {
        return Err(CheckpointError::HeaderBeyondFile {
            path,
            header_len,
            file_len,
        });
    }
    let mut raw = vec![0u8; header_len as usize];
    engine.load_into(file, 8, &mut raw[..]).map_err(ferr)?;
    let data_start = 8 + header_len;
    parse(&path, &raw, data_start, file_len - data_start)
}

/// Checks the header's bytes; `data_len`: the bytes of the file after the header.
pub(crate) fn parse(
    path: &Path,
    raw: &[u8],
    data_start: u64,
    data_len: u64,
) -> Result<Header, CheckpointError> {
    let path_buf = || path.to_path_buf();
    let text = std::str::from_utf8(raw).map_err(|e| CheckpointError::NotUtf8 {
        path: path_buf(),
        valid_up_to: e.valid_up_to(),
    })?;
    let members: Members = serde_json::from_str(text).map_err(|e| CheckpointError::BadJson {
        path: path_buf(),
        msg: e.to_string(),
    })?;
    if let Some(name) = members.twice {
        return Err(CheckpointError::Duplicate {
            tensor: name,
            first: path_buf(),
            second: path_buf(),
        });
    }
    let mut metadata = BTreeMap::new();
    let mut entries: Vec<(String, TensorInfo)> = Vec::with_capacity(members.list.len());
    for (name, value) in members.list {
        let bad = |msg: String| CheckpointError::BadEntry {
            path: path_buf(),
            tensor: name.clone(),
            msg,
        };
        // `null`: no metadata, as the reference reader (an `Option`) takes it.
        if name == "__metadata__" && value.is_null() {
            continue;
        }
        if name == "__metadata__" {
            metadata = serde_json::from_value(value)
                .map_err(|e| bad(format!("not a map of strings: {e}")))?;
            continue;
        }
        if let Some(d) = value.get("dtype").and_then(|d| d.as_str()) {
            if serde_json::from_value::<Dtype>(serde_json::Value::String(d.into())).is_err() {
                return Err(CheckpointError::UnknownDtype {
                    path: path_buf(),
                    tensor: name,
                    dtype: d.to_string(),
                });
            }
        }
        let info: TensorInfo = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        check_entry(path, &name, &info)?;
        entries.push((name, info));
    }
    entries.sort_by(|a, b| a.1.data_offsets.cmp(&b.1.data_offsets).then(a.0.cmp(&b.0)));
    let mut expected = 0usize;
    for (i, (name, info)) in entries.iter().enumerate() {
        let (begin, end) = info.data_offsets;
        if begin < expected {
            return Err(CheckpointError::Overlap {
                path: path_buf(),
                tensor: name.clone(),
                other: entries[i - 1].0.clone(),
            });
        }
        if end as u64 > data_len {
            return Err(CheckpointError::OutsideData {
                path: path_buf(),
                tensor: name.clone(),
                end: end as u64,
                data_len,
            });
        }
        if begin > expected {
            return Err(CheckpointError::Gap {
                path: path_buf(),
                tensor: name.clone(),
                begin: begin as u64,
                expected: expected as u64,
            });
        }
        expected = end;
    }
    if (expected as u64) < data_len {
        return Err(CheckpointError::TrailingBytes {
            path: path_buf(),
            data_len: expected as u64,
            extra: data_len - expected as u64,
        });
    }
    // The reference implementation's own check, over the same entries.
    let meta = (!metadata.is_empty()).then(|| metadata.clone().into_iter().collect());
    Metadata::new(meta, entries.clone()).map_err(|e| CheckpointError::Header {
        path: path_buf(),
        msg: e.to_string(),
    })?;
    let tensors = entries
        .into_iter()
        .map(|(name, info)| TensorEntry {
            name,
            dtype: info.dtype,
            shape: info.shape,
            file_range: data_start + info.data_offsets.0 as u64
                ..data_start + info.data_offsets.1 as u64,
        })
        .collect();
    Ok(Header {
        path: path_buf(),
        header_len: data_start - 8,
        data_start,
        data_len,
        tensors,
        metadata,
    })
}

/// A JSON object's members, sorted by name, and the first name found twice in it: serde_json's
/// own map keeps the last of two members of one name and drops the other without a word (a
/// header naming a tensor twice then failed as a gap in the data section).
pub(super) struct Members {
    /// The members (the first of two of one name), sorted by name.
    pub list: Vec<(String, serde_json::Value)>,
    /// The first name that appears more than once, if one does.
    pub twice: Option<String>,
}

impl<'de> serde::Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Members, A::Error> {
                use std::collections::btree_map::Entry;
                let mut seen = BTreeMap::new();
                let mut twice = None;
                while let Some((k, v)) = a.next_entry::<String, serde_json::Value>()? {
                    match seen.entry(k) {
                        Entry::Occupied(o) => {
                            twice.get_or_insert_with(|| o.key().clone());
                        }
                        Entry::Vacant(e) => {
                            e.insert(v);
                        }
                    }
                }
                Ok(Members {
                    list: seen.into_iter().collect(),
                    twice,
                })
            }
        }
        d.deserialize_map(Visit)
    }
}

/// Bytes a tensor of `shape` and `dtype` holds: `None` if that overflows or is not a whole
/// number of bytes (sub-byte dtypes).
pub fn tensor_bytes(dtype: Dtype, shape: &[usize]) -> Option<u64> {
    let elems = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64))?;
    let bits = elems.checked_mul(dtype.bitsize() as u64)?;
    (bits % 8 == 0).then_some(bits / 8)
}

fn check_entry(path: &Path, name: &str, info: &TensorInfo) -> Result<(), CheckpointError> {
    let (begin, end) = info.data_offsets;
    if end < begin {
        return Err(CheckpointError::BadOffsets {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            begin: begin as u64,
            end: end as u64,
        });
    }
    let bytes = (end - begin) as u64;
    let need = tensor_bytes(info.dtype, &info.shape);
    if need != Some(bytes) {
        return Err(CheckpointError::SizeMismatch {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            dtype: info.dtype,
            shape: info.shape.clone(),
            need,
            bytes,
        });
    }
    Ok(())
}
