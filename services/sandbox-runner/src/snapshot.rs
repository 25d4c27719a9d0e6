//! Snapshots of sessions as this runner takes them in and opens sessions from them. The
//! snapshot's format (the payload, the check of its bytes) is cairn_snapshot's; here is what
//! this runner accepts, and the verified snapshots its sessions open from.

use std::io::Write;
use std::path::PathBuf;

use cairn_proto as pb;
pub use cairn_snapshot::payload::{unpack, write, Checkpoint, ChunkSink, Payload, Take, IMAGE};
use cairn_snapshot::split::Split;
pub use cairn_snapshot::FORMAT;

use crate::error::{Error, Result};

/// Checks a header before any byte is taken: this runner's layout, backend and image.
pub fn check_header(h: &pb::SnapshotHeader, backend: &str, image: &str, max: u64) -> Result<()> {
    if h.format == 0 || h.format > FORMAT {
        return Err(Error::SnapshotMismatch(format!(
            "the snapshot has layout {} and this runner reads layouts 1 to {FORMAT}: resume it on a runner of the version that paused it",
            h.format
        )));
    }
    if h.backend != backend {
        return Err(Error::SnapshotMismatch(format!(
            "the snapshot was taken on the {} backend and this runner uses the {backend} backend: resume it on a {} runner",
            h.backend, h.backend
        )));
    }
    if h.image != image {
        return Err(Error::SnapshotMismatch(format!(
            "the snapshot was taken in image {:?} and this runner runs {image:?}: resume it on a runner with that image",
            h.image
        )));
    }
    if h.memory && backend != "gvisor" {
        return Err(Error::SnapshotMismatch(format!(
            "the snapshot holds memory and processes, which only the gvisor backend restores, not {backend}"
        )));
    }
    if h.size_bytes > max {
        return Err(Error::ResourceExhausted {
            message: format!(
                "the snapshot is {} bytes, above this runner's [session] max_snapshot_bytes = {max}",
                h.size_bytes
            ),
            reason: "too_large",
        });
    }
    if !h.sha256.is_empty() {
        cairn_snapshot::is_sha256(&h.sha256, "header")?;
    } else if h.size_bytes != 0 {
        return Err(Error::SnapshotCorrupt(format!(
            "the snapshot header gives a size ({}) but no sha256: send both, or neither and a SnapshotEnd after the bytes",
            h.size_bytes
        )));
    }
    Ok(())
}

/// Takes a streamed payload in, checking it (cairn_snapshot::Check) against the header or,
/// when the header has no sha256, against the SnapshotEnd that followed the bytes. Without
/// memory the payload goes into a file as it comes; with memory its checkpoint parts go
/// straight into a restore directory and the rest into the file (cairn_snapshot::split).
/// Neither is used before the check passed: dropped, the receiver removes both.
pub struct Receiver {
    pub header: pb::SnapshotHeader,
    payload: Payload,
    sink: Sink,
    check: cairn_snapshot::Check,
    /// Most bytes taken: the header's size, or the runner's limit when it comes at the end.
    most: u64,
}

enum Sink {
    Whole(std::io::BufWriter<std::fs::File>),
    Split {
        split: Split<std::io::BufWriter<std::fs::File>>,
        restore: Restore,
    },
}

impl Receiver {
    /// `max`: the runner's limit, for a snapshot whose size comes after its bytes. `restore`:
    /// the directory a checkpoint goes into (made here, for a header with memory).
    pub fn new(
        header: pb::SnapshotHeader,
        path: PathBuf,
        restore: PathBuf,
        max: u64,
    ) -> Result<Receiver> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(Error::io(format!(
                "creating snapshot file {}",
                path.display()
            )))?;
        let payload = Payload { path };
        let file = std::io::BufWriter::with_capacity(1 << 20, file);
        let sink = match header.memory {
            false => Sink::Whole(file),
            true => {
                std::fs::create_dir(&restore)
                    .map_err(Error::io("creating the restore directory"))?;
                let restore = Restore {
                    checkpoint: Some(restore.join("checkpoint")),
                    dir: restore,
                    mounted: false,
                };
                Sink::Split {
                    split: Split::new(&restore.dir, file)?,
                    restore,
                }
            }
        };
        let most = match header.sha256.is_empty() {
            true => max,
            false => header.size_bytes,
        };
        Ok(Receiver {
            header,
            payload,
            sink,
            check: cairn_snapshot::Check::new(),
            most,
        })
    }

    /// Appends a chunk; more bytes than the header said (or than the runner takes) are
    /// refused at once.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        if self.check.size() + chunk.len() as u64 > self.most {
            return Err(match self.header.sha256.is_empty() {
                true => Error::ResourceExhausted {
                    message: format!(
                        "the snapshot is larger than this runner's [session] max_snapshot_bytes = {}: resume it on a runner with a larger limit",
                        self.most
                    ),
                    reason: "too_large",
                },
                false => Error::SnapshotCorrupt(format!(
                    "the snapshot has more bytes than its header's {}: it is not the snapshot the header describes",
                    self.header.size_bytes
                )),
            });
        }
        self.check.chunk(chunk)?;
        match &mut self.sink {
            Sink::Whole(file) => file
                .write_all(chunk)
                .map_err(Error::io("writing the received snapshot")),
            Sink::Split { split, .. } => Ok(split.push(chunk)?),
        }
    }

    /// The payload (and, with memory, the restore directory its checkpoint went into), when
    /// its size and sha256 are the header's or, for a header without them, `end`'s (the
    /// header then gets them).
    pub fn finish(
        mut self,
        end: Option<pb::SnapshotEnd>,
    ) -> Result<(pb::SnapshotHeader, Payload, Option<Restore>)> {
        if let Some(end) = end {
            self.check.end(end)?;
        }
        self.check.finish(&mut self.header)?;
        let written = Error::io("writing the received snapshot");
        let restore = match self.sink {
            Sink::Whole(mut file) => {
                file.flush().map_err(written)?;
                None
            }
            Sink::Split { split, restore } => {
                split.finish()?.flush().map_err(written)?;
                Some(restore)
            }
        };
        Ok((self.header, self.payload, restore))
    }
}

/// Now in Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Where a session's files come from when it opens.
pub enum Origin {
    /// Empty, or cloned from git.
    Git(Option<pb::GitSource>),
    /// Unpacked from a verified snapshot (shared by the copies of a fork).
    Snapshot(std::sync::Arc<Prepared>),
}

/// A verified snapshot that sessions open from: its payload, whose files each session
/// unpacks, and, with memory, its checkpoint unpacked once for all of them (runsc only
/// reads it). Both go when the last session opened from it no longer needs them.
pub struct Prepared {
    pub header: pb::SnapshotHeader,
    pub payload: Payload,
    pub checkpoint: Option<Restore>,
}

/// A checkpoint unpacked for a restore: `dir`, holding `checkpoint` (runsc's image
/// directory), removed when dropped (the task directory holds the files). `mounted`: `dir`
/// is a tmpfs of its own (a pause's), unmounted first.
pub struct Restore {
    pub dir: PathBuf,
    pub checkpoint: Option<PathBuf>,
    pub mounted: bool,
}

impl Drop for Restore {
    fn drop(&mut self) {
        if self.mounted {
            crate::backend::area::unmount_below(&self.dir);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
