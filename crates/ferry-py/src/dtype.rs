//! Element types: one name per type (`float32`, `bfloat16`, ...), from NumPy type strings,
//! DLPack codes and safetensors dtypes, and back.

/// An element type: its canonical name and size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DType {
    /// `float32`, `int64`, `bool`, ... (PyTorch's and NumPy's names).
    pub name: &'static str,
    /// Bytes per element.
    pub size: usize,
    /// DLPack type code (0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool).
    pub dl_code: u8,
}

const fn d(name: &'static str, size: usize, dl_code: u8) -> DType {
    DType {
        name,
        size,
        dl_code,
    }
}

/// Every type ferry's Python module knows.
pub(crate) const ALL: [DType; 15] = [
    d("bool", 1, 6),
    d("int8", 1, 0),
    d("uint8", 1, 1),
    d("int16", 2, 0),
    d("uint16", 2, 1),
    d("int32", 4, 0),
    d("uint32", 4, 1),
    d("int64", 8, 0),
    d("uint64", 8, 1),
    d("float16", 2, 2),
    d("bfloat16", 2, 4),
    d("float32", 4, 2),
    d("float64", 8, 2),
    d("complex64", 8, 5),
    d("complex128", 16, 5),
];

fn find(code: u8, size: usize) -> Option<DType> {
    ALL.iter()
        .copied()
        .find(|t| t.dl_code == code && t.size == size)
}

/// The type of a DLPack dtype (code, bits, lanes); one lane only.
pub(crate) fn from_dlpack(code: u8, bits: u8, lanes: u16) -> Result<DType, String> {
    let none = || format!("unsupported DLPack dtype (code {code}, {bits} bits, {lanes} lanes)");
    if lanes != 1 || bits % 8 != 0 {
        return Err(none());
    }
    // Older producers export bool as an 8-bit unsigned integer: that reads as uint8.
    find(code, bits as usize / 8).ok_or_else(none)
}

/// The type of a NumPy array-interface type string (`<f4`, `|b1`, `<c8`, ...).
pub(crate) fn from_typestr(s: &str) -> Result<DType, String> {
    let bad = || format!("unsupported array type string {s:?}");
    let b = s.as_bytes();
    if b.len() < 3 {
        return Err(bad());
    }
    let little = cfg!(target_endian = "little");
    match b[0] {
        b'|' | b'=' => {}
        b'<' if little => {}
        b'>' if !little => {}
        _ => {
            return Err(format!(
                "{s:?}: byte order other than the machine's is not supported"
            ))
        }
    }
    // `get`: a string whose third byte is inside a character (`"<é"`) once panicked here.
    let size: usize = s.get(2..).ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let code = match b[1] {
        b'b' => 6,
        b'i' => 0,
        b'u' => 1,
        b'f' => 2,
        b'c' => 5,
        _ => return Err(bad()),
    };
    find(code, size).ok_or_else(bad)
}

/// The NumPy type string of a type (`bfloat16` has none: `<V2`).
pub(crate) fn typestr(t: DType) -> String {
    let kind = match t.dl_code {
        6 => 'b',
        0 => 'i',
        1 => 'u',
        2 => 'f',
        5 => 'c',
        _ => 'V',
    };
    let order = if t.size == 1 { '|' } else { '<' };
    format!("{order}{kind}{}", t.size)
}

/// The type of a safetensors dtype.
pub(crate) fn from_safetensors(t: ferry::checkpoint::Dtype) -> Result<DType, String> {
    use ferry::checkpoint::Dtype as S;
    let name = match t {
        S::BOOL => "bool",
        S::U8 => "uint8",
        S::I8 => "int8",
        S::I16 => "int16",
        S::U16 => "uint16",
        S::F16 => "float16",
        S::BF16 => "bfloat16",
        S::I32 => "int32",
        S::U32 => "uint32",
        S::F32 => "float32",
        S::F64 => "float64",
        S::I64 => "int64",
        S::U64 => "uint64",
        other => {
            return Err(format!(
                "safetensors dtype {other:?} has no Python array type here"
            ))
        }
    };
    by_name(name).ok_or_else(|| format!("dtype {name} unknown"))
}

/// The safetensors dtype of a type.
pub(crate) fn to_safetensors(t: DType) -> Result<ferry::checkpoint::Dtype, String> {
    use ferry::checkpoint::Dtype as S;
    Ok(match t.name {
        "bool" => S::BOOL,
        "uint8" => S::U8,
        "int8" => S::I8,
        "int16" => S::I16,
        "uint16" => S::U16,
        "float16" => S::F16,
        "bfloat16" => S::BF16,
        "int32" => S::I32,
        "uint32" => S::U32,
        "float32" => S::F32,
        "float64" => S::F64,
        "int64" => S::I64,
        "uint64" => S::U64,
        other => return Err(format!("dtype {other} cannot be stored in safetensors")),
    })
}

/// The type named `name`.
pub(crate) fn by_name(name: &str) -> Option<DType> {
    ALL.iter().copied().find(|t| t.name == name)
}
