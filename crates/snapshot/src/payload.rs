//! The payload: a tar of the session's `workspace/` and `tmpfs/` and, with memory, the
//! `checkpoint/` directory `runsc checkpoint` wrote. Payloads live as files beside the
//! runner's task directories (never inside them: they do not count against a session's
//! writable area) and are removed when dropped.

use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use cairn_pack::graft::{AreaRoots, GraftError};
use cairn_sha256::HashingWriter;

pub use crate::assembly::IMAGE;
use crate::assembly::{part_of, Assembly};
use crate::Error;

type Result<T> = std::result::Result<T, Error>;

/// A payload file, removed when dropped.
pub struct Payload {
    pub path: PathBuf,
}

impl Drop for Payload {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A memory checkpoint as `write` takes it: the directory runsc writes its files into and,
/// while it writes them, how it stands (`None`: still writing; `Some(true)`: finished;
/// `Some(false)`: failed).
pub struct Checkpoint<'a> {
    pub dir: &'a Path,
    pub finished: &'a dyn Fn() -> Option<bool>,
}

/// Bytes a checkpoint file must have grown by before they go out as a part of it.
const PART_MIN: u64 = 4 << 20;
/// Bytes of a checkpoint part read and sent at once.
const PIECE: u64 = 1 << 20;
/// How often a checkpoint being written is looked at.
const POLL: std::time::Duration = std::time::Duration::from_millis(2);

/// Writes the payload of `task_dir` (and of `checkpoint`) to `out`; returns its sha256 (hex)
/// and size. Links are stored as links, never followed. A checkpoint's files go in as parts
/// while runsc writes them (runsc only appends to them): `checkpoint/NAME@OFFSET`, each the
/// bytes of `NAME` from `OFFSET` on that were there when the part was made. The session's
/// files go in once the checkpoint is finished (the sandbox is stopped then, so they match its
/// memory), then `files_in` is called (not when writing fails first), then the rest of the
/// checkpoint's files. A checkpoint that fails ends the writing with an error.
pub fn write(
    task_dir: &Path,
    checkpoint: Option<Checkpoint<'_>>,
    out: impl Out,
    files_in: impl FnOnce(),
) -> Result<(String, u64)> {
    // tar copies each file in 8 KiB pieces: buffered, the hash and `out` get 1 MiB ones.
    let mut tar = tar::Builder::new(std::io::BufWriter::with_capacity(
        1 << 20,
        HashingWriter::new(out),
    ));
    tar.follow_symlinks(false);
    let mut parts = Parts::default();
    if let Some(c) = &checkpoint {
        loop {
            // Read before the files are looked at: once finished, they have all their bytes.
            match (c.finished)() {
                Some(true) => break,
                Some(false) => {
                    return Err(Error::io("taking the checkpoint")(std::io::Error::other(
                        "runsc checkpoint failed",
                    )))
                }
                None => {}
            }
            // A part goes out as it is written (it passes tar's buffer by).
            if !parts.add(&mut tar, c.dir, PART_MIN)? {
                std::thread::sleep(POLL);
            }
        }
    }
    let files = [
        ("workspace", task_dir.join("workspace")),
        ("tmpfs", task_dir.join("tmpfs")),
    ];
    for (name, dir) in files {
        tar.append_dir_all(name, &dir).map_err(|e| {
            writing(
                e,
                &format!(
                    "writing {} into the snapshot (a socket or special file there cannot be kept: remove it)",
                    dir.display()
                ),
            )
        })?;
    }
    files_in();
    if let Some(c) = &checkpoint {
        parts.add(&mut tar, c.dir, 0)?;
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

/// Where a payload goes. `send` takes bytes the writer made for it (a checkpoint file's
/// part, read once into its own buffer), which a sink may keep without copying them.
pub trait Out: Write {
    fn send(&mut self, bytes: Bytes) -> std::io::Result<()> {
        self.write_all(&bytes)
    }
}

impl Out for Vec<u8> {}

/// An error writing the payload: the stream's (past the size limit, or its reader gone),
/// or else one of `context`.
fn writing(e: std::io::Error, context: &str) -> Error {
    match e.kind() {
        std::io::ErrorKind::FileTooLarge | std::io::ErrorKind::BrokenPipe => {
            Error::io("sending the snapshot")(e)
        }
        _ => Error::io(context)(e),
    }
}

/// The bytes of each checkpoint file already in the payload.
#[derive(Default)]
struct Parts {
    sent: std::collections::BTreeMap<String, u64>,
}

impl Parts {
    /// Adds, for each file in `dir`, a part with what it gained since its last part when that
    /// is at least `min` bytes (with `min` 0, every file not yet in goes in, empty or not).
    /// True when a part was added.
    fn add<O: Out>(
        &mut self,
        tar: &mut tar::Builder<std::io::BufWriter<HashingWriter<O>>>,
        dir: &Path,
        min: u64,
    ) -> Result<bool> {
        let mut names = Vec::new();
        for e in std::fs::read_dir(dir).map_err(Error::io("reading the checkpoint"))? {
            let e = e.map_err(Error::io("reading the checkpoint"))?;
            let name = e.file_name().into_string().map_err(|n| {
                Error::io("reading the checkpoint")(std::io::Error::other(format!(
                    "runsc wrote a file whose name is not UTF-8: {n:?}"
                )))
            })?;
            names.push(name);
        }
        names.sort();
        let mut added = false;
        for name in names {
            let path = dir.join(&name);
            let meta =
                std::fs::symlink_metadata(&path).map_err(Error::io("reading the checkpoint"))?;
            if !meta.is_file() || name.contains('@') {
                return Err(Error::io("reading the checkpoint")(std::io::Error::other(format!(
                    "the checkpoint holds {name}, which is not a plain file: runsc writes only files"
                ))));
            }
            let from = self.sent.get(&name).copied();
            let at = from.unwrap_or(0);
            let len = meta.len().saturating_sub(at);
            let due = match min {
                0 => len > 0 || from.is_none(),
                _ => len >= min,
            };
            if !due {
                continue;
            }
            let mut file =
                std::fs::File::open(&path).map_err(Error::io("reading the checkpoint"))?;
            std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(at))
                .map_err(Error::io("reading the checkpoint"))?;
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o600);
            h.set_size(len);
            h.set_path(format!("checkpoint/{name}@{at}"))
                .map_err(Error::io("writing the checkpoint into the snapshot"))?;
            h.set_cksum();
            // The part's bytes are read once, each piece into a buffer of its own that goes
            // out as it is (no copy through tar's or the stream's buffers).
            let sending = |e| writing(e, "writing the checkpoint into the snapshot");
            let buffered = tar.get_mut();
            buffered.flush().map_err(sending)?;
            let hashed = buffered.get_mut();
            hashed.write_all(h.as_bytes()).map_err(sending)?;
            let mut left = len;
            while left > 0 {
                let want = left.min(PIECE);
                let mut piece = Vec::with_capacity(want as usize);
                let got = std::io::Read::read_to_end(
                    &mut std::io::Read::take(&mut file, want),
                    &mut piece,
                )
                .map_err(Error::io("reading the checkpoint"))?;
                if got as u64 != want {
                    return Err(Error::io("reading the checkpoint")(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("runsc's {name} shrank while it was being sent"),
                    )));
                }
                hashed
                    .pass(Bytes::from(piece), |out, piece| out.send(piece))
                    .map_err(sending)?;
                left -= want;
            }
            let pad = (512 - len % 512) % 512;
            hashed
                .write_all(&[0u8; 512][..pad as usize])
                .map_err(sending)?;
            self.sent.insert(name, at + len);
            added = true;
        }
        Ok(added)
    }
}

/// Where a pause's payload goes as it is written: chunks to the caller's stream, at most
/// `max` bytes in all. Past `max` a write fails with `FileTooLarge`; once the stream's
/// reader is gone, with `BrokenPipe`.
pub struct ChunkSink {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    sent: u64,
    max: u64,
}

impl ChunkSink {
    pub fn new(tx: tokio::sync::mpsc::Sender<Bytes>, max: u64) -> ChunkSink {
        ChunkSink { tx, sent: 0, max }
    }
}

impl ChunkSink {
    fn take(&mut self, bytes: Bytes) -> std::io::Result<()> {
        let len = bytes.len() as u64;
        if self.sent + len > self.max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!("the snapshot is larger than {} bytes", self.max),
            ));
        }
        self.tx.blocking_send(bytes).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the caller stopped reading the snapshot",
            )
        })?;
        self.sent += len;
        Ok(())
    }
}

impl Write for ChunkSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.take(Bytes::copy_from_slice(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Out for ChunkSink {
    fn send(&mut self, bytes: Bytes) -> std::io::Result<()> {
        self.take(bytes)
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
/// outside `workspace/`, `tmpfs/` and `checkpoint/`, refused. A checkpoint file sent in parts
/// (`checkpoint/NAME@OFFSET`) is put together again; a part that does not start where the
/// ones before it ended is refused. Entries another pass takes are skipped by seeking past
/// them.
pub fn unpack(payload: &Path, take: Take<'_>) -> Result<()> {
    let file = std::fs::File::open(payload).map_err(Error::io("opening the snapshot"))?;
    let mut tar = tar::Archive::new(std::io::BufReader::new(file));
    tar.set_preserve_permissions(true);
    tar.set_unpack_xattrs(false);
    tar.set_overwrite(true);
    let mut assembly = None;
    let corrupt = |e: std::io::Error| Error::Corrupt(format!("reading the snapshot: {e}"));
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
            return Err(Error::Corrupt(format!(
                "the snapshot holds {}, outside workspace/, tmpfs/ and checkpoint/",
                path.display()
            )));
        }
        if !(kind.is_file() || kind.is_dir() || kind.is_symlink()) {
            return Err(Error::Corrupt(format!(
                "the snapshot holds {} of a kind sessions do not keep",
                path.display()
            )));
        }
        let part = match kind.is_file() {
            true => part_of(&path),
            false => None,
        };
        match take {
            Take::Files(areas) if files => place(areas, &mut entry)?,
            Take::Checkpoint(dir) if part.is_some() => {
                let (name, offset) = part.unwrap_or_default();
                if assembly.is_none() {
                    let src =
                        std::fs::File::open(payload).map_err(Error::io("opening the snapshot"))?;
                    assembly = Some((Assembly::new(dir)?, src));
                }
                if let Some((a, src)) = &mut assembly {
                    a.copy(src, &name, offset, entry.raw_file_position(), entry.size())?
                }
            }
            Take::Checkpoint(dir) if !files => {
                let unpacked = entry.unpack_in(dir).map_err(|e| {
                    Error::Corrupt(format!(
                        "unpacking {} from the snapshot: {e}",
                        path.display()
                    ))
                })?;
                if !unpacked {
                    return Err(Error::Corrupt(format!(
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

/// One `workspace/` or `tmpfs/` entry into a session's areas.
fn place<R: std::io::Read>(areas: &AreaRoots, entry: &mut tar::Entry<'_, R>) -> Result<()> {
    areas.place(entry).map_err(|e| match e {
        GraftError::Refused(why) => {
            Error::Corrupt(format!("the snapshot cannot be unpacked: {why}"))
        }
        GraftError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
            Error::NoSpace("the snapshot's files do not fit the session's writable area (max_total_output_bytes): resume it on a runner with a larger cap".into())
        }
        GraftError::Io { context, source } => Error::Io { context, source },
    })
}
