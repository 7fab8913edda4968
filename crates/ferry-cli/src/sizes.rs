//! Size arguments: `4K..1G` (doubling range), `4K,1M,256M` (list), K/M/G/T = 2^10, 2^20, ...

use thiserror::Error;

/// Why a size argument was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SizeError {
    /// Nothing was given.
    #[error("empty size list: give e.g. `4K..1G` or `4K,1M,256M`")]
    Empty,
    /// A size does not parse.
    #[error("bad size `{0}`: expected a number with an optional K, M, G or T suffix (powers of 1024), e.g. 4K or 256M")]
    Bad(String),
    /// A size is negative.
    #[error("size `{0}` is negative: sizes must be positive, e.g. 4K")]
    Negative(String),
    /// A size is zero.
    #[error("size `{0}` is zero: sizes must be at least 1 byte")]
    Zero(String),
    /// A size does not fit in 64 bits.
    #[error("size `{0}` is too large")]
    TooLarge(String),
    /// A range runs backwards.
    #[error("range `{0}`: the start is larger than the end")]
    Backwards(String),
}

/// Parses one size: digits with an optional K/M/G/T suffix (also `KiB`, `k`, ...; `B` for bytes).
///
/// ```
/// assert_eq!(ferry_cli::sizes::parse_size("4K"), Ok(4096));
/// assert_eq!(ferry_cli::sizes::parse_size("256M"), Ok(256 << 20));
/// assert!(ferry_cli::sizes::parse_size("4X").is_err());
/// ```
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    if t.strip_prefix('-')
        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
    {
        return Err(SizeError::Negative(text.to_string()));
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    if digits.is_empty() {
        return Err(SizeError::Bad(text.to_string()));
    }
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        _ => return Err(SizeError::Bad(text.to_string())),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| SizeError::TooLarge(text.to_string()))?;
    if n == 0 {
        return Err(SizeError::Zero(text.to_string()));
    }
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| SizeError::TooLarge(text.to_string()))
}

/// Parses a size sweep: `A..B` doubles from A while at most B (B is included when it is A
/// times a power of two); `A,B,C` is a list (kept in the given order, duplicates removed).
///
/// ```
/// use ferry_cli::sizes::parse_sizes;
/// assert_eq!(parse_sizes("4K..16K").unwrap(), vec![4096, 8192, 16384]);
/// assert_eq!(parse_sizes("4K,1M").unwrap(), vec![4096, 1 << 20]);
/// ```
pub fn parse_sizes(text: &str) -> Result<Vec<u64>, SizeError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    if let Some((a, b)) = t.split_once("..") {
        let (start, end) = (parse_size(a)?, parse_size(b)?);
        if start > end {
            return Err(SizeError::Backwards(t.to_string()));
        }
        let mut out = vec![];
        let mut s = start;
        while s <= end {
            out.push(s);
            match s.checked_mul(2) {
                Some(n) => s = n,
                None => break,
            }
        }
        return Ok(out);
    }
    let mut out: Vec<u64> = vec![];
    for part in t.split(',') {
        if part.trim().is_empty() {
            return Err(SizeError::Bad(part.to_string()));
        }
        let s = parse_size(part)?;
        if !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(out)
}

/// A parsed size sweep (for argument parsers: `"4K..1G".parse::<Sizes>()`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizes(pub Vec<u64>);

impl std::str::FromStr for Sizes {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Sizes, SizeError> {
        parse_sizes(s).map(Sizes)
    }
}

/// Short label for a size: `4`, `4K`, `1.5M`, `1G` (powers of 1024).
///
/// ```
/// assert_eq!(ferry_cli::sizes::format_size(256 << 20), "256M");
/// assert_eq!(ferry_cli::sizes::format_size(4), "4B");
/// ```
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "T"), (30, "G"), (20, "M"), (10, "K")];
    for (shift, unit) in UNITS {
        let u = 1u64 << shift;
        if bytes >= u {
            return if bytes % u == 0 {
                format!("{}{unit}", bytes >> shift)
            } else {
                format!("{:.1}{unit}", bytes as f64 / u as f64)
            };
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_sizes() {
        assert_eq!(parse_size("1"), Ok(1));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size(" 64B "), Ok(64));
    }

    #[test]
    fn bad_sizes() {
        assert_eq!(parse_size("K"), Err(SizeError::Bad("K".into())));
        assert_eq!(parse_size("4X"), Err(SizeError::Bad("4X".into())));
        assert_eq!(parse_size("-4"), Err(SizeError::Negative("-4".into())));
        // A flag taken as the value (`--sizes --test x`) is not called negative.
        assert_eq!(parse_size("--test"), Err(SizeError::Bad("--test".into())));
        assert_eq!(parse_size("1.5M"), Err(SizeError::Bad("1.5M".into())));
        assert_eq!(parse_size("0"), Err(SizeError::Zero("0".into())));
        assert_eq!(
            parse_size("99999999999T"),
            Err(SizeError::TooLarge("99999999999T".into()))
        );
        assert_eq!(
            parse_size("99999999999999999999999"),
            Err(SizeError::TooLarge("99999999999999999999999".into()))
        );
    }

    #[test]
    fn ranges_and_lists() {
        assert_eq!(parse_sizes("4K..1G").unwrap().len(), 19);
        assert_eq!(parse_sizes("4K..4K").unwrap(), vec![4096]);
        assert_eq!(parse_sizes("3..10").unwrap(), vec![3, 6]);
        assert_eq!(
            parse_sizes("4K,1M,256M").unwrap(),
            vec![4096, 1 << 20, 256 << 20]
        );
        assert_eq!(parse_sizes("4K,4K").unwrap(), vec![4096]);
        assert_eq!(parse_sizes("8T..16T").unwrap(), vec![8 << 40, 16 << 40]);
    }

    #[test]
    fn bad_sweeps() {
        assert_eq!(parse_sizes(""), Err(SizeError::Empty));
        assert_eq!(
            parse_sizes("1G..4K"),
            Err(SizeError::Backwards("1G..4K".into()))
        );
        assert_eq!(parse_sizes("4K,,1M"), Err(SizeError::Bad("".into())));
        assert_eq!(parse_sizes("4K..x"), Err(SizeError::Bad("x".into())));
        let msg = parse_sizes("4Q").unwrap_err().to_string();
        assert!(msg.contains("4Q") && msg.contains("suffix"), "{msg}");
    }

    #[test]
    fn labels() {
        assert_eq!(format_size(4096), "4K");
        assert_eq!(format_size(3 << 19), "1.5M");
        assert_eq!(format_size(1 << 30), "1G");
        assert_eq!(format_size(1000), "1000B");
    }
}
