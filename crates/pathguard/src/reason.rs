//! The reason vocabulary: one stable word per refusal, in the order the checks run
//! (ingest "Path checks"). Words are shared by manifests, events and `cairn-reason` metadata;
//! never rename one.

use std::fmt;
use std::str::FromStr;

/// Why a path was refused. `as_str()` gives the stable reason word used in manifests,
/// events and the `cairn-reason` gRPC metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    InvalidChar,
    AbsolutePath,
    DriveLetter,
    Backslash,
    Traversal,
    DirectoryPath,
    EmptyComponent,
    DotComponent,
    PathTooLong,
    NotNormalized,
    ReservedName,
    Denied,
    PrefixNotAllowed,
}

impl Reason {
    /// Every reason, in the order the checks run (`invalid_char` also runs a second time,
    /// after `backslash`, for `<>:"|?*` and format characters).
    pub const ALL: [Reason; 13] = [
        Reason::InvalidChar,
        Reason::AbsolutePath,
        Reason::DriveLetter,
        Reason::Backslash,
        Reason::Traversal,
        Reason::DirectoryPath,
        Reason::EmptyComponent,
        Reason::DotComponent,
        Reason::PathTooLong,
        Reason::NotNormalized,
        Reason::ReservedName,
        Reason::Denied,
        Reason::PrefixNotAllowed,
    ];

    /// The stable reason word (`invalid_char`, `absolute_path`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::InvalidChar => "invalid_char",
            Reason::AbsolutePath => "absolute_path",
            Reason::DriveLetter => "drive_letter",
            Reason::Backslash => "backslash",
            Reason::Traversal => "traversal",
            Reason::DirectoryPath => "directory_path",
            Reason::EmptyComponent => "empty_component",
            Reason::DotComponent => "dot_component",
            Reason::PathTooLong => "path_too_long",
            Reason::NotNormalized => "not_normalized",
            Reason::ReservedName => "reserved_name",
            Reason::Denied => "denied",
            Reason::PrefixNotAllowed => "prefix_not_allowed",
        }
    }

    /// The reason for a word produced by `as_str`, `None` for any other text.
    pub fn from_str_opt(word: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == word)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word that is not one of pathguard's reasons.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown path reason {0:?}; expected one of invalid_char, absolute_path, drive_letter, backslash, traversal, directory_path, empty_component, dot_component, path_too_long, not_normalized, reserved_name, denied, prefix_not_allowed")]
pub struct UnknownReason(pub String);

impl FromStr for Reason {
    type Err = UnknownReason;
    fn from_str(word: &str) -> Result<Self, Self::Err> {
        Reason::from_str_opt(word).ok_or_else(|| UnknownReason(word.to_owned()))
    }
}

/// A refused path: the reason word plus a message that tells the user what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("path {path:?} refused ({reason}): {message}")]
pub struct Rejection {
    pub reason: Reason,
    /// The offending path (lossy, control characters escaped by Debug formatting).
    pub path: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl Rejection {
    pub(crate) fn new(reason: Reason, path: &str, message: impl Into<String>) -> Self {
        Rejection {
            reason,
            path: path.to_owned(),
            message: message.into(),
        }
    }
}
