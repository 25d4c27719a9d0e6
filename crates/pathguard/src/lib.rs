//! THE relative-path rules of cairn (DESIGN.md "artifact-store"; seed 000 and 002 path safety).
//! Every service validates project- and sandbox-relative paths here and nowhere else.
//! It rejects, never silently rewrites.
//!
//! SKELETON: signatures fixed, bodies being written (see issue 2).

use std::fmt;

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
    /// The stable reason word (`invalid_char`, `absolute_path`, ...).
    pub fn as_str(self) -> &'static str {
        unimplemented!()
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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

/// A validated, normalised relative path: '/'-separated, no empty/`.`/`..` components.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SafePath(String);

impl SafePath {
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The '/'-separated components.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }
    /// `self` joined with a validated relative `rest`.
    pub fn join(&self, rest: &SafePath) -> SafePath {
        SafePath(format!("{}/{}", self.0, rest.0))
    }
    /// True when `self` equals `prefix` or lies beneath it (component-wise).
    pub fn starts_with(&self, prefix: &SafePath) -> bool {
        self.0 == prefix.0 || (self.0.starts_with(&prefix.0) && self.0.as_bytes().get(prefix.0.len()) == Some(&b'/'))
    }
}

impl fmt::Display for SafePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks the syntax rules (everything but denylist and prefixes), in DESIGN.md's order.
pub fn validate(path: &str) -> Result<SafePath, Rejection> {
    let _ = path;
    unimplemented!()
}

/// Key under which two paths are "the same file" (NFC-normalised, case-folded), for
/// duplicate detection.
pub fn fold_key(path: &str) -> String {
    let _ = path;
    unimplemented!()
}

/// The default denylist: names no cairn path may contain as any component.
pub const DEFAULT_DENYLIST: &[&str] = &[".ssh", ".aws", ".gnupg", ".kube", ".docker", ".git", ".env"];

/// Denylist + allowed prefixes.
#[derive(Debug, Clone)]
pub struct Policy {
    denylist: Vec<String>,
    allowed_prefixes: Vec<SafePath>,
}

impl Policy {
    /// `denylist` compared case-folded per component (also 8.3 aliases like `SSH~1`);
    /// empty `allowed_prefixes` = everything allowed.
    pub fn new(denylist: Vec<String>, allowed_prefixes: Vec<SafePath>) -> Self {
        Policy { denylist, allowed_prefixes }
    }
    /// Syntax rules, then the denylist, then the allowed prefixes.
    pub fn check(&self, path: &str) -> Result<SafePath, Rejection> {
        let _ = (path, &self.denylist, &self.allowed_prefixes);
        unimplemented!()
    }
    /// A policy whose prefixes are `requested` (each must lie inside this policy's prefixes:
    /// requests may only narrow). Empty `requested` returns a clone of `self`.
    pub fn narrow(&self, requested: &[String]) -> Result<Policy, Rejection> {
        let _ = requested;
        unimplemented!()
    }
    pub fn allowed_prefixes(&self) -> &[SafePath] {
        &self.allowed_prefixes
    }
}
