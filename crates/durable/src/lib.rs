//! How the artifact-store's bytes reach the disk durably, below its requests, slots and
//! policies (the journal's records name a project and a path, but nothing here opens them):
//!
//! - [`direct`]: large bodies written with O_DIRECT from aligned buffers, several device
//!   writes in flight;
//! - [`journal`]: the small-write journal, a preallocated log whose records make small writes
//!   durable with one shared `fdatasync`, checkpointed and redone at start-up.

pub mod direct;
pub mod journal;

/// An I/O failure, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct IoError {
    pub what: String,
    #[source]
    pub source: std::io::Error,
}

impl IoError {
    pub fn new(what: impl Into<String>, source: impl Into<std::io::Error>) -> IoError {
        IoError {
            what: what.into(),
            source: source.into(),
        }
    }
}
