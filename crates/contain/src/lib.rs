//! Filesystem access confined beneath a held directory handle, never following a symlink.
//!
//! The artifact-store (project files) and the sandbox-runner (workspaces that sandboxed code
//! may change while they are looked at) both resolve every path relative to a directory fd:
//! `openat2` with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS where the kernel has it, else one
//! `openat(O_NOFOLLOW)` per component. A symlink anywhere on the way is refused (ELOOP), an
//! escape too (EXDEV), atomically with the lookup.
//!
//! - [`open`], [`ensure_dir`], [`read_dir`] ...: the raw calls, returning `Errno` (callers turn
//!   them into their own refusals).
//! - [`Root`]: a held directory with `io::Result` opens of files and directories below it.
//! - [`walk`]: a depth-first walk that reports links and never follows them.
//!
//! Depends only on rustix (and tracing for one warning); paths given here must already have
//! passed `pathguard` (no `..`, no empty or `.` components).

mod at;
mod root;
mod walk;

pub use at::{
    dup_dir, ensure_dir, kind, open, open_by_components, open_dir, read_dir, split_parent, stat,
    sync_dir, DIR_MODE, FILE_MODE,
};
pub use root::{regular, Root};
pub use walk::{lossy, walk, walk_to, Entry, Kind, Visit, MAX_DEPTH};
