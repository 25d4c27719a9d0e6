//! `SafePath`: a relative path that passed `validate`. Only this crate constructs one from text.

use std::fmt;
use std::str::FromStr;

use crate::rules::{validate, MAX_PATH_BYTES};
use crate::{Reason, Rejection};

/// A validated, normalised relative path: '/'-separated, no empty/`.`/`..` components.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SafePath(pub(crate) String);

impl SafePath {
    pub fn as_str(&self) -> &str {
        &self.0
    }
    pub fn into_string(self) -> String {
        self.0
    }
    /// The '/'-separated components.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }
    /// The last component.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }
    /// Everything before the last component; `None` for a single-component path.
    pub fn parent(&self) -> Option<SafePath> {
        self.0
            .rsplit_once('/')
            .map(|(parent, _)| SafePath(parent.to_owned()))
    }
    /// `self` joined with a validated relative `rest`. Does not re-check the 1024-byte
    /// limit; use `checked_join` when the result must stay a valid path.
    pub fn join(&self, rest: &SafePath) -> SafePath {
        SafePath(format!("{}/{}", self.0, rest.0))
    }
    /// `join`, refusing (`path_too_long`) a result over 1024 bytes.
    pub fn checked_join(&self, rest: &SafePath) -> Result<SafePath, Rejection> {
        let joined = self.join(rest);
        if joined.0.len() > MAX_PATH_BYTES {
            return Err(Rejection::new(
                Reason::PathTooLong,
                &joined.0,
                format!(
                    "the joined path is {} bytes; paths may be at most {MAX_PATH_BYTES} bytes (UTF-8), use a shorter prefix or name",
                    joined.0.len()
                ),
            ));
        }
        Ok(joined)
    }
    /// True when `self` equals `prefix` or lies beneath it (component-wise).
    pub fn starts_with(&self, prefix: &SafePath) -> bool {
        self.0 == prefix.0
            || (self.0.starts_with(&prefix.0)
                && self.0.as_bytes().get(prefix.0.len()) == Some(&b'/'))
    }
}

impl fmt::Display for SafePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for SafePath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<SafePath> for String {
    fn from(path: SafePath) -> String {
        path.0
    }
}

/// Parsing is `validate`.
impl FromStr for SafePath {
    type Err = Rejection;
    fn from_str(path: &str) -> Result<Self, Self::Err> {
        validate(path)
    }
}

impl TryFrom<&str> for SafePath {
    type Error = Rejection;
    fn try_from(path: &str) -> Result<Self, Self::Error> {
        validate(path)
    }
}
