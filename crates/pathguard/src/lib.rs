//! THE relative-path rules of cairn.
//! Every service validates project- and sandbox-relative paths here and nowhere else.
//! It rejects, never silently rewrites. The rules and reason words: docs/paths.md.
//!
//! ```
//! use pathguard::{Policy, Reason, DEFAULT_DENYLIST};
//!
//! let server = Policy::from_strings(DEFAULT_DENYLIST, ["docs/", "workspace/"])?;
//! let policy = server.narrow(&["docs/specs".to_owned()])?; // a request may only narrow
//! assert_eq!(policy.check("docs/specs/a.md")?.as_str(), "docs/specs/a.md");
//! assert_eq!(policy.check("docs/specs/../x").unwrap_err().reason, Reason::Traversal);
//! assert_eq!(policy.check("docs/specs/.Git/config").unwrap_err().reason, Reason::Denied);
//! assert_eq!(policy.check("docs/other.md").unwrap_err().reason, Reason::PrefixNotAllowed);
//! # Ok::<(), pathguard::Rejection>(())
//! ```

mod policy;
mod reason;
pub mod records;
mod rules;
mod safe_path;

pub use policy::{validate_prefix, Policy, DEFAULT_DENYLIST};
pub use reason::{Reason, Rejection, UnknownReason};
pub use rules::{
    fold_key, is_format_char, is_project_id, validate, MAX_COMPONENT_BYTES, MAX_PATH_BYTES,
    PROJECT_ID_RULE,
};
pub use safe_path::SafePath;
