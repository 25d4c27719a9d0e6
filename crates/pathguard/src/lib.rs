//! THE relative-path rules of cairn (DESIGN.md "artifact-store"; seed 000 and 002 path safety).
//! Every service validates project- and sandbox-relative paths here and nowhere else.
//! It rejects, never silently rewrites. The rules and reason words are in docs/paths.md.

mod policy;
mod reason;
mod rules;
mod safe_path;

pub use policy::{validate_prefix, Policy, DEFAULT_DENYLIST};
pub use reason::{Reason, Rejection, UnknownReason};
pub use rules::{fold_key, is_format_char, validate, MAX_COMPONENT_BYTES, MAX_PATH_BYTES};
pub use safe_path::SafePath;
