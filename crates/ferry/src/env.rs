//! Settings read from the environment: the one parser behind the configs' `from_env`
//! ([`StagingConfig::from_env`](crate::cuda::StagingConfig::from_env),
//! [`FileConfig::from_env`](crate::file::FileConfig::from_env)). A config's `new()` reads
//! nothing from the environment; `from_env()` starts from `new()`, applies each variable that is
//! set, and refuses a value that does not parse, naming the variable.

use std::str::FromStr;
use thiserror::Error;

/// An environment variable whose value does not parse.
///
/// ```
/// let e = ferry::ConfigError {
///     var: "FERRY_FILE_CHUNK",
///     value: "4M".into(),
///     expected: "a whole number",
/// };
/// assert_eq!(e.to_string(), "$FERRY_FILE_CHUNK=\"4M\" is not a whole number");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("${var}={value:?} is not {expected}")]
pub struct ConfigError {
    /// The variable.
    pub var: &'static str,
    /// Its value, as set.
    pub value: String,
    /// What it should be (`a whole number`, `0 or 1`).
    pub expected: &'static str,
}

/// Where `from_env` reads its variables: the process environment, or a map in tests.
pub(crate) type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment as a [`Lookup`] (a value that is not Unicode is passed on lossily,
/// so that it fails to parse and is reported).
pub(crate) fn process(var: &str) -> Option<String> {
    std::env::var_os(var).map(|v| v.to_string_lossy().into_owned())
}

/// A value `from_env` knows how to read.
pub(crate) trait EnvValue: Sized {
    /// What a valid value looks like, for the error.
    const EXPECTED: &'static str;
    /// The value of `text` (already trimmed), or None if it does not parse.
    fn parse_env(text: &str) -> Option<Self>;
}

impl EnvValue for usize {
    const EXPECTED: &'static str = "a whole number";
    fn parse_env(text: &str) -> Option<usize> {
        usize::from_str(text).ok()
    }
}

impl EnvValue for bool {
    const EXPECTED: &'static str = "0 or 1";
    fn parse_env(text: &str) -> Option<bool> {
        match text {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        }
    }
}

/// The value of the word `text` names in `table`, in any case and with surrounding blanks:
/// the one parser of the off/auto/on settings (environment and command line alike).
pub(crate) fn word<T: Copy>(text: &str, table: &[(&str, T)]) -> Option<T> {
    let text = text.trim();
    table
        .iter()
        .find(|(w, _)| w.eq_ignore_ascii_case(text))
        .map(|&(_, v)| v)
}

/// Variable `var` from `get` as a `T`: `Ok(None)` when unset, an error naming the variable and
/// its value when it does not parse (surrounding whitespace is ignored).
pub(crate) fn var<T: EnvValue>(
    get: Lookup<'_>,
    var: &'static str,
) -> Result<Option<T>, ConfigError> {
    match get(var) {
        None => Ok(None),
        Some(value) => match T::parse_env(value.trim()) {
            Some(v) => Ok(Some(v)),
            None => Err(ConfigError {
                var,
                value,
                expected: T::EXPECTED,
            }),
        },
    }
}

/// Sets `field` to variable `name` from `get` when it is set; as [`var`] otherwise.
pub(crate) fn apply<T: EnvValue>(
    get: Lookup<'_>,
    name: &'static str,
    field: &mut T,
) -> Result<(), ConfigError> {
    if let Some(v) = var(get, name)? {
        *field = v;
    }
    Ok(())
}

/// A [`Lookup`] over fixed pairs, for tests.
#[cfg(test)]
pub(crate) fn pairs<'a>(kv: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        kv.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::{pairs, var};

    #[test]
    fn unset_set_and_bad_values() {
        let get = pairs(&[("A", " 42 "), ("B", "1"), ("C", "yes"), ("D", "")]);
        assert_eq!(var::<usize>(&get, "A"), Ok(Some(42)));
        assert_eq!(var::<usize>(&get, "Z"), Ok(None));
        assert_eq!(var::<bool>(&get, "B"), Ok(Some(true)));
        let e = var::<bool>(&get, "C").unwrap_err();
        assert_eq!(e.to_string(), "$C=\"yes\" is not 0 or 1");
        let e = var::<usize>(&get, "D").unwrap_err();
        assert_eq!((e.var, e.value.as_str()), ("D", ""));
        assert!(var::<usize>(&get, "B").is_ok());
    }
}
