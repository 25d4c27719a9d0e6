//! Snapshots of sessions: the bytes PauseSession sends and ResumeSession takes. A snapshot is
//! a header (backend, image, memory or files only, sha256 and size of the payload) and a
//! payload: a tar of the session's `workspace/` and `tmpfs/` and, with memory (gvisor), the
//! `checkpoint/` directory `runsc checkpoint` wrote. Payloads live as files beside the task
//! directories (never inside them: they do not count against a session's writable area) and
//! are removed when dropped. Nothing here knows gRPC or the store.

use std::io::Write;
use std::path::{Path, PathBuf};

use cairn_proto as pb;
use cairn_sha256::{HashingWriter, Sha256};

use crate::error::{Error, Result};
use cairn_pack::graft::{AreaRoots, GraftError};

/// The snapshot layout this runner writes and reads.
pub const FORMAT: u32 = 1;

/// A payload file, removed when dropped.
pub struct Payload {
    pub path: PathBuf,
}

impl Drop for Payload {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Writes the payload of `task_dir` (and `checkpoint`, a directory) to `out`; returns its
/// sha256 (hex) and size. Links are stored as links, never followed. `files_in` is called
/// once the session's files are in, before the checkpoint's (not when writing fails first).
pub fn write(
    task_dir: &Path,
    checkpoint: Option<&Path>,
    out: impl Write,
    files_in: impl FnOnce(),
) -> Result<(String, u64)> {
    // tar copies each file in 8 KiB pieces: buffered, the hash and `out` get 1 MiB ones.
    let mut tar = tar::Builder::new(std::io::BufWriter::with_capacity(
        1 << 20,
        HashingWriter::new(out),
    ));
    tar.follow_symlinks(false);
    let files = [
        ("workspace", task_dir.join("workspace")),
        ("tmpfs", task_dir.join("tmpfs")),
    ];
    for (name, dir) in files {
        tar.append_dir_all(name, &dir).map_err(|e| {
            let context = match e.kind() {
                std::io::ErrorKind::FileTooLarge | std::io::ErrorKind::BrokenPipe => {
                    "sending the snapshot".to_owned()
                }
                _ => format!(
                    "writing {} into the snapshot (a socket or special file there cannot be kept: remove it)",
                    dir.display()
                ),
            };
            Error::Io { context, source: e }
        })?;
    }
    files_in();
    if let Some(dir) = checkpoint {
        tar.append_dir_all("checkpoint", dir)
            .map_err(Error::io("writing the checkpoint into the snapshot"))?;
    }
    let (_out, sha, size) = tar
        .into_inner()
        .map_err(Error::io("finishing the snapshot"))?
        .into_inner()
        .map_err(|e| Error::io("writing the snapshot")(e.into_error()))?
        .finish()
        .map_err(Error::io("writing the snapshot"))?;
    Ok((sha, size))
}

/// Where a pause's payload goes as it is written: chunks to the caller's stream, at most
/// `max` bytes in all. Past `max` a write fails with `FileTooLarge`; once the stream's
/// reader is gone, with `BrokenPipe`.
pub struct ChunkSink {
    tx: tokio::sync::mpsc::Sender<bytes::Bytes>,
    sent: u64,
    max: u64,
}

impl ChunkSink {
    pub fn new(tx: tokio::sync::mpsc::Sender<bytes::Bytes>, max: u64) -> ChunkSink {
        ChunkSink { tx, sent: 0, max }
    }
}

impl Write for ChunkSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.sent + buf.len() as u64 > self.max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!("the snapshot is larger than {} bytes", self.max),
            ));
        }
        self.tx
            .blocking_send(bytes::Bytes::copy_from_slice(buf))
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the caller stopped reading the snapshot",
                )
            })?;
        self.sent += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Checks a header before any byte is taken: this runner's layout, backend and image.
pub fn check_header(h: &pb::SnapshotHeader, backend: &str, image: &str, max: u64) -> Result<()> {
    if h.format != FORMAT {
        return Err(Error::SnapshotMismatch(format!(
            "the snapshot has layout {} and this runner reads layout {FORMAT}: resume it on a runner of the version that paused it",
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
        is_sha256(&h.sha256, "header")?;
    } else if h.size_bytes != 0 {
        return Err(Error::SnapshotCorrupt(format!(
            "the snapshot header gives a size ({}) but no sha256: send both, or neither and a SnapshotEnd after the bytes",
            h.size_bytes
        )));
    }
    Ok(())
}

/// `sha` is 64 hex digits (`what` names where it came from).
fn is_sha256(sha: &str, what: &str) -> Result<()> {
    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::SnapshotCorrupt(format!(
            "the snapshot {what}'s sha256 {sha:?} is not 64 hex digits"
        )));
    }
    Ok(())
}

/// Takes a streamed payload into a file, hashing it; `finish` checks it against the header
/// or, when the header has no sha256, against the SnapshotEnd that followed the bytes.
pub struct Receiver {
    pub header: pb::SnapshotHeader,
    payload: Payload,
    file: std::io::BufWriter<std::fs::File>,
    hasher: Sha256,
    size: u64,
    /// Most bytes taken: the header's size, or the runner's limit when it comes at the end.
    most: u64,
}

impl Receiver {
    /// `max`: the runner's limit, for a snapshot whose size comes after its bytes.
    pub fn new(header: pb::SnapshotHeader, path: PathBuf, max: u64) -> Result<Receiver> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(Error::io(format!(
                "creating snapshot file {}",
                path.display()
            )))?;
        let most = match header.sha256.is_empty() {
            true => max,
            false => header.size_bytes,
        };
        Ok(Receiver {
            header,
            payload: Payload { path },
            file: std::io::BufWriter::with_capacity(1 << 20, file),
            hasher: Sha256::new(),
            size: 0,
            most,
        })
    }

    /// Appends a chunk; more bytes than the header said (or than the runner takes) are
    /// refused at once.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        self.size += chunk.len() as u64;
        if self.size > self.most {
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
        self.hasher.update(chunk);
        self.file
            .write_all(chunk)
            .map_err(Error::io("writing the received snapshot"))
    }

    /// The payload, when its size and sha256 are the header's or, for a header without them,
    /// `end`'s (the header then gets them).
    pub fn finish(mut self, end: Option<pb::SnapshotEnd>) -> Result<(pb::SnapshotHeader, Payload)> {
        if self.header.sha256.is_empty() {
            let end = end.ok_or_else(|| {
                Error::SnapshotCorrupt(format!(
                    "the snapshot is cut short: {} bytes arrived and no SnapshotEnd after them; send it whole",
                    self.size
                ))
            })?;
            is_sha256(&end.sha256, "end")?;
            self.header.sha256 = end.sha256;
            self.header.size_bytes = end.size_bytes;
        } else if let Some(end) = end {
            if (end.sha256.as_str(), end.size_bytes)
                != (self.header.sha256.as_str(), self.header.size_bytes)
            {
                return Err(Error::SnapshotCorrupt(
                    "the snapshot's SnapshotEnd disagrees with its header: it is not one snapshot"
                        .into(),
                ));
            }
        }
        if self.size != self.header.size_bytes {
            return Err(Error::SnapshotCorrupt(format!(
                "{} bytes of the snapshot arrived and it has {}: it was cut short or altered; send it whole",
                self.size, self.header.size_bytes
            )));
        }
        let sha = std::mem::take(&mut self.hasher).finish_hex();
        if sha != self.header.sha256 {
            return Err(Error::SnapshotCorrupt(format!(
                "the snapshot's bytes have sha256 {sha} and were sent as {}: they were altered or damaged; nothing was resumed",
                self.header.sha256
            )));
        }
        self.file
            .flush()
            .map_err(Error::io("writing the received snapshot"))?;
        Ok((self.header, self.payload))
    }
}

/// What one pass over a verified payload takes from it; every entry is checked either way.
pub enum Take<'a> {
    /// `checkpoint/` into this directory (made once for every session resumed from it).
    Checkpoint(&'a Path),
    /// `workspace/` and `tmpfs/` into a session's areas (by descriptor, cairn_pack::graft).
    Files(&'a AreaRoots),
}

/// Unpacks what `take` names from a verified payload. Only files, directories and links,
/// each made beneath its target without following a link; anything else, or anything
/// outside `workspace/`, `tmpfs/` and `checkpoint/`, refused. Entries another pass takes
/// are skipped by seeking past them.
pub fn unpack(payload: &Path, take: Take<'_>) -> Result<()> {
    let file = std::fs::File::open(payload).map_err(Error::io("opening the snapshot"))?;
    let mut tar = tar::Archive::new(std::io::BufReader::new(file));
    tar.set_preserve_permissions(true);
    tar.set_unpack_xattrs(false);
    tar.set_overwrite(true);
    let corrupt = |e: std::io::Error| Error::SnapshotCorrupt(format!("reading the snapshot: {e}"));
    for entry in tar.entries_with_seek().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        let path = entry.path().map_err(corrupt)?.into_owned();
        let top = match path.components().next() {
            Some(std::path::Component::Normal(c)) => c.to_string_lossy().into_owned(),
            _ => String::new(),
        };
        let kind = entry.header().entry_type();
        let files = top == "workspace" || top == "tmpfs";
        if !files && top != "checkpoint" {
            return Err(Error::SnapshotCorrupt(format!(
                "the snapshot holds {}, outside workspace/, tmpfs/ and checkpoint/",
                path.display()
            )));
        }
        if !(kind.is_file() || kind.is_dir() || kind.is_symlink()) {
            return Err(Error::SnapshotCorrupt(format!(
                "the snapshot holds {} of a kind sessions do not keep",
                path.display()
            )));
        }
        match take {
            Take::Files(areas) if files => place(areas, &mut entry)?,
            Take::Checkpoint(dir) if kind.is_file() && path == Path::new(IMAGE) => {
                copy_image(payload, entry.raw_file_position(), entry.size(), dir)?
            }
            Take::Checkpoint(dir) if !files => {
                let unpacked = entry.unpack_in(dir).map_err(|e| {
                    Error::SnapshotCorrupt(format!(
                        "unpacking {} from the snapshot: {e}",
                        path.display()
                    ))
                })?;
                if !unpacked {
                    return Err(Error::SnapshotCorrupt(format!(
                        "the snapshot names {}, which would land outside the session",
                        path.display()
                    )));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// runsc's memory image in a payload: the bulk of a snapshot with memory.
pub const IMAGE: &str = "checkpoint/checkpoint.img";

/// The memory image, `len` bytes at `at` in the payload, copied by the kernel
/// (copy_file_range: no pass through this process) to `dir/checkpoint/checkpoint.img`,
/// made new beneath `dir` without following a link.
fn copy_image(payload: &Path, at: u64, len: u64, dir: &Path) -> Result<()> {
    use std::os::fd::AsFd;
    let failed = |e: std::io::Error| Error::Io {
        context: "copying the checkpoint's image out of the snapshot".into(),
        source: e,
    };
    let src = std::fs::File::open(payload).map_err(failed)?;
    let root = std::fs::File::open(dir).map_err(failed)?;
    let sub = match cairn_contain::open_dir(root.as_fd(), "checkpoint") {
        Err(rustix::io::Errno::NOENT) => {
            rustix::fs::mkdirat(&root, "checkpoint", rustix::fs::Mode::from_raw_mode(0o700))
                .map_err(|e| failed(e.into()))?;
            cairn_contain::open_dir(root.as_fd(), "checkpoint")
        }
        other => other,
    }
    .map_err(|e| failed(e.into()))?;
    let dst = rustix::fs::openat(
        &sub,
        "checkpoint.img",
        rustix::fs::OFlags::WRONLY
            | rustix::fs::OFlags::CREATE
            | rustix::fs::OFlags::EXCL
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .map_err(|e| {
        Error::SnapshotCorrupt(format!(
            "the snapshot holds {IMAGE} twice or beside a link: {e}"
        ))
    })?;
    let (mut off, mut left) = (at, len);
    while left > 0 {
        let n = rustix::fs::copy_file_range(
            &src,
            Some(&mut off),
            &dst,
            None,
            left.min(1 << 30) as usize,
        )
        .map_err(|e| failed(e.into()))?;
        if n == 0 {
            return Err(Error::SnapshotCorrupt(format!(
                "the snapshot ends inside {IMAGE}"
            )));
        }
        left -= n as u64;
    }
    Ok(())
}

/// One `workspace/` or `tmpfs/` entry into a session's areas.
fn place<R: std::io::Read>(areas: &AreaRoots, entry: &mut tar::Entry<'_, R>) -> Result<()> {
    areas.place(entry).map_err(|e| match e {
        GraftError::Refused(why) => {
            Error::SnapshotCorrupt(format!("the snapshot cannot be unpacked: {why}"))
        }
        GraftError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
            Error::ResourceExhausted {
                message: "the snapshot's files do not fit the session's writable area (max_total_output_bytes): resume it on a runner with a larger cap".into(),
                reason: "no_space",
            }
        }
        GraftError::Io { context, source } => Error::Io { context, source },
    })
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
/// directory), removed when dropped (the task directory holds the files).
pub struct Restore {
    pub dir: PathBuf,
    pub checkpoint: Option<PathBuf>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
