//! A session snapshot's format, shared by the sandbox-runner (which makes snapshots and
//! resumes them) and its callers (which keep them): the layout version, the payload (a tar of
//! the session's `workspace/` and `tmpfs/` and, with memory, the `checkpoint/` runsc wrote),
//! and the check of a streamed payload against its header or against the SnapshotEnd after
//! it. Nothing here knows gRPC, the store or a runner's state.

mod assembly;
pub mod check;
pub mod payload;
pub mod split;

pub use check::Check;

/// The snapshot layout this version writes with memory, and the newest it reads. Layout 1
/// has runsc's files whole (`checkpoint/NAME`); layout 2 may have them in parts
/// (`checkpoint/NAME@OFFSET`), sent while runsc wrote them. A files-only snapshot is the
/// same in both and is written as layout 1.
pub const FORMAT: u32 = 2;

/// What is wrong with a snapshot, or with writing or reading one.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes are not a whole snapshot matching its header: damaged, cut short or forged.
    #[error("{0}")]
    Corrupt(String),
    /// More bytes than the limit the writer or reader was given.
    #[error("{0}")]
    TooLarge(String),
    /// The snapshot's files do not fit where they are unpacked.
    #[error("{0}")]
    NoSpace(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

impl Error {
    /// An `Io` error with `context`, for `map_err`.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}

/// `sha` is 64 hex digits (`what` names where it came from).
pub fn is_sha256(sha: &str, what: &str) -> Result<(), Error> {
    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::Corrupt(format!(
            "the snapshot {what}'s sha256 {sha:?} is not 64 hex digits"
        )));
    }
    Ok(())
}
