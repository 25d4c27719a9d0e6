//! The small-Put journal: a synchronous Put of a small body is made durable by one
//! `fdatasync` of a log kept beneath the data root (`put.journal`) instead of two fsyncs (the
//! temp file's before its name, the directory's after it).
//!
//! The log is a file of fixed size, zero-filled and fsync'd when it is made, so appending a
//! record rewrites blocks it already owns and its `fdatasync` flushes data only: no inode or
//! directory change, no journal commit of the filesystem. A journaled publication:
//!
//! 1. decides its outcome under the path's slot (as every write does);
//! 2. appends a record (project, path, the bytes, their sha256) and waits until it is durable:
//!    concurrent publications share one `fdatasync` (group commit);
//! 3. links the temp file under its name, unsynced, and replies.
//!
//! So once a record is durable its bytes survive a power cut whatever became of the file, and
//! a crash before the record is durable leaves the old bytes or nothing, as before. A link
//! that fails after its record was written appends a cancel record, so that write is never
//! redone.
//!
//! **Checkpoint.** When the log is full, or another write is about to change a path that has
//! a record (a Delete, a large or deferred Put, an archive, a restore), the files the log holds
//! records for are made durable (one `syncfs` of their filesystem on ext4, xfs, btrfs,
//! overlayfs and tmpfs; elsewhere, FUSE and network filesystems, each file and directory is
//! fsync'd, and at most [`MAX_PENDING`] files wait), and only then a new generation is written to the header: records of older
//! generations no longer count. A write never changes a path behind
//! a record that could later be redone over it.
//!
//! **Recovery**, before the store serves: the records of the current generation are read up
//! to the first that is torn, out of sequence or of another generation; for each path, the
//! last write not cancelled is made durable (rewritten when the file does not hold its bytes,
//! else fsync'd with its directory); then a new generation begins.
//!
//! Records name a project and a path, but nothing here opens them: the store makes the writes
//! found at start-up durable (its `files::restore_journaled`) before calling [`Journal::begin`].

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use rustix::fs::{Mode, OFlags};

use crate::IoError;

type Result<T> = std::result::Result<T, IoError>;

/// The log's name beneath the data root.
pub const FILE_NAME: &str = "put.journal";
/// Largest body a synchronous Put journals; larger ones are fsync'd in place.
pub const MAX_BODY: u64 = 128 << 10;
/// The log's fixed size.
const CAPACITY: u64 = 4 << 20;
/// Where records start; the two header slots lie before it.
const RECORDS_AT: u64 = 4096;
/// The second header slot (generations alternate between the two, so a torn header write
/// leaves the other one whole).
const SECOND_SLOT: u64 = 512;
/// Most files waiting on the log when each is fsync'd at the checkpoint.
const MAX_PENDING: usize = 256;
/// `f_type`s of the filesystems whose `syncfs` makes every file and name written before it
/// durable: ext4, xfs, btrfs, overlayfs (it syncs its upper filesystem), tmpfs (nothing to
/// keep). Elsewhere (FUSE, whose `syncfs` reaches no server; network filesystems) a
/// checkpoint fsyncs each file and directory.
const SYNCFS_FILESYSTEMS: [u64; 5] = [0xEF53, 0x5846_5342, 0x9123_683E, 0x794C_7630, 0x0102_1994];
const HEADER_MAGIC: &[u8; 8] = b"CAIRNJH1";
const RECORD_MAGIC: &[u8; 4] = b"CJR1";
/// magic, payload length, generation, sequence, kind, project length, path length, data
/// length, data sha256 (hex).
const RECORD_HEAD: usize = 4 + 4 + 8 + 8 + 1 + 2 + 2 + 4 + 64;
const CHECK_LEN: usize = 32;

const WRITE: u8 = 1;
const CANCEL: u8 = 2;

/// One write found in the log at start-up: the bytes `path` of `project` must hold.
#[derive(Debug, Clone)]
pub struct Recovered {
    pub project: String,
    pub path: String,
    pub bytes: Bytes,
    pub sha256: String,
}

/// The log, open.
#[derive(Debug)]
pub struct Journal {
    file: File,
    path: PathBuf,
    /// Held shared from a record's append until its file is linked (and registered); held
    /// alone by a checkpoint, so a generation never ends between the two.
    gate: RwLock<()>,
    inner: Mutex<Inner>,
    /// (generation, offset): the log is durable up to there.
    synced: Mutex<(u64, u64)>,
    /// A checkpoint makes the files durable with one `syncfs` of their filesystem (see
    /// [`SYNCFS_FILESYSTEMS`]); else by fsyncing each file and directory.
    syncfs: bool,
}

#[derive(Debug)]
struct Inner {
    generation: u64,
    seq: u64,
    end: u64,
    /// Each journaled path (project, path): its directory and name, opened and fsync'd at
    /// the checkpoint (no descriptor is kept per file).
    files: HashMap<(String, String), (Arc<OwnedFd>, String)>,
    /// Their directories, by (device, inode).
    dirs: HashMap<(u64, u64), Arc<OwnedFd>>,
    /// Set when a record could not be made durable or cancelled: the log may hold a write
    /// that was refused, until a checkpoint succeeds.
    broken: Option<String>,
    /// False until `begin`: the writes found at opening are not durable yet.
    ready: bool,
}

/// What a journaled publication says of itself.
pub struct Record<'a> {
    pub project: &'a str,
    pub path: &'a str,
    pub sha256: &'a str,
    pub bytes: &'a [Bytes],
}

impl Journal {
    /// Opens the log beneath `data_root` (making it when missing) and returns it with the
    /// writes its current generation holds. Nothing may be appended before `begin` is called
    /// (after those writes were made durable).
    pub fn open(data_root: &Path) -> Result<(Journal, Vec<Recovered>)> {
        let path = data_root.join(FILE_NAME);
        let io =
            |what: &str, e: std::io::Error| IoError::new(format!("{what} {}", path.display()), e);
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                make(&path).map_err(|e| io("creating the Put journal", e))?
            }
            Err(e) => return Err(io("opening the Put journal", e)),
        };
        let len = file.metadata().map_err(|e| io("reading", e))?.len();
        let mut image = vec![0u8; len.min(CAPACITY) as usize];
        file.read_exact_at(&mut image, 0)
            .map_err(|e| io("reading the Put journal", e))?;
        let generation = current_generation(&image).ok_or_else(|| {
            IoError::new(
                format!("reading the Put journal {}", path.display()),
                std::io::Error::other(
                    "neither header is whole: the file is not a Put journal or was damaged; move it aside to start without it (writes it held may be lost)",
                ),
            )
        })?;
        let recovered = replay(&image, generation);
        let syncs_whole = |fd: &File| {
            rustix::fs::fstatfs(fd).is_ok_and(|fs| SYNCFS_FILESYSTEMS.contains(&(fs.f_type as u64)))
        };
        let projects = File::open(data_root.join("projects"));
        let syncfs = syncs_whole(&file) && projects.as_ref().is_ok_and(syncs_whole);
        let journal = Journal {
            syncfs,
            file,
            path,
            gate: RwLock::new(()),
            inner: Mutex::new(Inner {
                generation,
                seq: 0,
                end: CAPACITY,
                files: HashMap::new(),
                dirs: HashMap::new(),
                broken: None,
                ready: false,
            }),
            synced: Mutex::new((generation, CAPACITY)),
        };
        Ok((journal, recovered))
    }

    /// Starts a new generation: every write of the old one must be durable by now.
    pub fn begin(&self) -> Result<()> {
        let mut inner = self.inner.lock();
        self.next_generation(&mut inner)?;
        inner.ready = true;
        Ok(())
    }

    fn next_generation(&self, inner: &mut Inner) -> Result<()> {
        let generation = inner.generation + 1;
        let slot = if generation.is_multiple_of(2) {
            0
        } else {
            SECOND_SLOT
        };
        self.file
            .write_all_at(&header(generation), slot)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| {
                IoError::new(
                    format!("starting a generation of {}", self.path.display()),
                    e,
                )
            })?;
        inner.generation = generation;
        inner.seq = 0;
        inner.end = RECORDS_AT;
        inner.files.clear();
        inner.dirs.clear();
        inner.broken = None;
        *self.synced.lock() = (generation, RECORDS_AT);
        Ok(())
    }

    /// Makes `record` durable, then runs `link` (which publishes the file); on success the
    /// published `file` and its `dir` wait for the next checkpoint. Returns None, having run
    /// nothing, when the log cannot take the record (too large, or broken and not mended by a
    /// checkpoint): the caller then fsyncs in place.
    pub fn publish<T, E: From<IoError>>(
        &self,
        record: Record<'_>,
        dir: &Arc<OwnedFd>,
        name: &str,
        link: impl FnOnce() -> std::result::Result<T, E>,
    ) -> Option<std::result::Result<T, E>> {
        let data_len: u64 = record.bytes.iter().map(|b| b.len() as u64).sum();
        if data_len > MAX_BODY {
            return None;
        }
        let len =
            (RECORD_HEAD + record.project.len() + record.path.len() + CHECK_LEN) as u64 + data_len;
        loop {
            let gate = self.gate.read();
            let mut inner = self.inner.lock();
            if !inner.ready {
                return None;
            }
            let full =
                inner.end + len > CAPACITY || (!self.syncfs && inner.files.len() >= MAX_PENDING);
            if full || inner.broken.is_some() {
                drop(inner);
                drop(gate);
                if let Err(e) = self.checkpoint() {
                    tracing::error!(error = %e, "a checkpoint of the Put journal failed; Puts fsync in place until one succeeds");
                    return None;
                }
                continue;
            }
            let encoded = encode(inner.generation, inner.seq, WRITE, &record);
            let at = inner.end;
            if let Err(e) = self.file.write_all_at(&encoded, at) {
                inner.broken = Some(format!("appending to the Put journal: {e}"));
                return None;
            }
            let generation = inner.generation;
            inner.seq += 1;
            inner.end += encoded.len() as u64;
            let end = inner.end;
            drop(inner);
            if let Err(e) = self.sync_to(generation, end) {
                // The record may or may not have reached the disk: not a write to redo.
                self.inner.lock().broken = Some(format!("fdatasync of the Put journal: {e}"));
                return Some(Err(E::from(IoError::new(
                    format!(
                        "making the Put of {:?} durable ({})",
                        record.path,
                        self.path.display()
                    ),
                    e,
                ))));
            }
            let linked = link();
            let mut inner = self.inner.lock();
            match &linked {
                Ok(_) => match dir_key(dir) {
                    Some(key) => {
                        let at = (dir.clone(), name.to_owned());
                        let path = (record.project.to_owned(), record.path.to_owned());
                        inner.files.insert(path, at);
                        inner.dirs.entry(key).or_insert_with(|| dir.clone());
                    }
                    None => inner.broken = Some("a journaled file's directory is gone".into()),
                },
                Err(_) => {
                    let cancel = Record {
                        bytes: &[],
                        sha256: "",
                        ..record
                    };
                    let encoded = encode(inner.generation, inner.seq, CANCEL, &cancel);
                    let at = inner.end;
                    let fits = at + encoded.len() as u64 <= CAPACITY;
                    let written = fits && self.file.write_all_at(&encoded, at).is_ok();
                    if written {
                        inner.seq += 1;
                        inner.end += encoded.len() as u64;
                    }
                    let end = inner.end;
                    drop(inner);
                    if !written || self.sync_to(generation, end).is_err() {
                        self.inner.lock().broken =
                            Some(format!("cancelling the refused Put of {:?}", record.path));
                    }
                }
            }
            drop(gate);
            return Some(linked);
        }
    }

    /// Waits until the log is durable up to `end` of `generation`; one caller's fdatasync
    /// covers every record appended before it started.
    fn sync_to(&self, generation: u64, end: u64) -> std::io::Result<()> {
        let mut synced = self.synced.lock();
        if synced.0 != generation || synced.1 >= end {
            return Ok(());
        }
        let upto = self.inner.lock().end;
        let started = std::time::Instant::now();
        let result = self.file.sync_data();
        cairn_telemetry::metrics::store_fsynced("journal", started.elapsed());
        result?;
        *synced = (generation, upto);
        Ok(())
    }

    /// Whether `path` of `project` (or, with `path` "", anything of the project) has a record
    /// in the current generation.
    fn holds(&self, project: &str, path: &str) -> bool {
        let inner = self.inner.lock();
        if path.is_empty() {
            inner.files.keys().any(|(p, _)| p == project)
        } else {
            inner
                .files
                .contains_key(&(project.to_owned(), path.to_owned()))
        }
    }

    /// Before another kind of write changes `path` of `project` ("" = anything in it): when
    /// the log holds a record for it, a checkpoint, so that record is never redone over it.
    pub fn settle(&self, project: &str, path: &str) -> Result<()> {
        if self.holds(project, path) {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Makes every journaled file durable, then starts a new generation.
    pub fn checkpoint(&self) -> Result<()> {
        let _alone = self.gate.write();
        let mut inner = self.inner.lock();
        if !inner.ready
            || (inner.files.is_empty() && inner.broken.is_none() && inner.end == RECORDS_AT)
        {
            return Ok(());
        }
        let started = std::time::Instant::now();
        if self.syncfs {
            // Every file written before it, data and names, is durable when this returns: one
            // call per filesystem the journaled files' directories are on.
            let mut devices = std::collections::HashSet::new();
            for ((device, _), dir) in &inner.dirs {
                if devices.insert(*device) {
                    rustix::fs::syncfs(dir).map_err(|e| {
                        IoError::new(
                            "syncfs of the projects' filesystem",
                            std::io::Error::from(e),
                        )
                    })?;
                }
            }
        } else {
            self.sync_each(&inner)?;
        }
        let files = inner.files.len();
        self.next_generation(&mut inner)?;
        cairn_telemetry::metrics::store_fsynced("journal_checkpoint", started.elapsed());
        tracing::debug!(
            files,
            took_ms = started.elapsed().as_millis() as u64,
            "Put journal checkpoint"
        );
        Ok(())
    }
}

impl Journal {
    /// fsyncs each journaled file, then each of their directories (one writeback of the
    /// filesystem first, so the fsyncs mostly find their data written).
    fn sync_each(&self, inner: &Inner) -> Result<()> {
        let _ = rustix::fs::syncfs(&self.file);
        for ((project, path), (dir, name)) in &inner.files {
            let io = |e: rustix::io::Errno| {
                IoError::new(
                    format!("fsync of {path:?} of project {project:?}"),
                    std::io::Error::from(e),
                )
            };
            let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            match rustix::fs::openat(dir, name.as_str(), flags, Mode::empty()) {
                Ok(fd) => rustix::fs::fsync(&fd).map_err(io)?,
                // Gone since (an archive removes files after settling): nothing to keep.
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(io(e)),
            }
        }
        for dir in inner.dirs.values() {
            rustix::fs::fsync(dir.as_fd()).map_err(|e| {
                IoError::new(
                    "fsync of a journaled file's directory",
                    std::io::Error::from(e),
                )
            })?;
        }
        Ok(())
    }
}

/// Creates the log: both headers (generation 1 in the second slot), zeros to its size,
/// fsync'd, then given its name.
fn make(path: &Path) -> std::io::Result<File> {
    let temp = path.with_extension("journal.new");
    let made = make_at(&temp, path);
    if made.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    made
}

fn make_at(temp: &Path, path: &Path) -> std::io::Result<File> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .open(temp)?;
    let mut image = vec![0u8; RECORDS_AT as usize];
    image[SECOND_SLOT as usize..SECOND_SLOT as usize + HEADER_LEN].copy_from_slice(&header(1));
    file.write_all(&image)?;
    let zeros = vec![0u8; 1 << 20];
    let mut left = CAPACITY - RECORDS_AT;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    std::fs::rename(temp, path)?;
    if let Some(parent) = path.parent() {
        File::open(parent)?.sync_all()?;
    }
    Ok(file)
}

const HEADER_LEN: usize = 8 + 8 + CHECK_LEN;

fn header(generation: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(HEADER_MAGIC);
    h[8..16].copy_from_slice(&generation.to_le_bytes());
    let check = cairn_sha256::sha256(&h[..16]);
    h[16..].copy_from_slice(&check);
    h
}

/// The newer of the two whole headers' generations.
fn current_generation(image: &[u8]) -> Option<u64> {
    [0usize, SECOND_SLOT as usize]
        .iter()
        .filter_map(|&at| {
            let h = image.get(at..at + HEADER_LEN)?;
            let whole = &h[..8] == HEADER_MAGIC && cairn_sha256::sha256(&h[..16])[..] == h[16..];
            whole.then(|| u64::from_le_bytes(h[8..16].try_into().unwrap_or_default()))
        })
        .max()
}

fn encode(generation: u64, seq: u64, kind: u8, record: &Record<'_>) -> Vec<u8> {
    let data_len: usize = record.bytes.iter().map(|b| b.len()).sum();
    let payload = RECORD_HEAD - 8 + record.project.len() + record.path.len() + data_len;
    let mut out = Vec::with_capacity(8 + payload + CHECK_LEN);
    out.extend_from_slice(RECORD_MAGIC);
    out.extend_from_slice(&(payload as u32).to_le_bytes());
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(&(record.project.len() as u16).to_le_bytes());
    out.extend_from_slice(&(record.path.len() as u16).to_le_bytes());
    out.extend_from_slice(&(data_len as u32).to_le_bytes());
    let mut sha = [b'0'; 64];
    let given = record.sha256.as_bytes();
    sha[..given.len().min(64)].copy_from_slice(&given[..given.len().min(64)]);
    out.extend_from_slice(&sha);
    out.extend_from_slice(record.project.as_bytes());
    out.extend_from_slice(record.path.as_bytes());
    // The check covers everything but the data, which the sha256 above stands for (checked
    // against the data at recovery).
    let check = cairn_sha256::sha256(&out);
    for chunk in record.bytes {
        out.extend_from_slice(chunk);
    }
    out.extend_from_slice(&check);
    out
}

/// One record as read back.
struct Parsed<'a> {
    kind: u8,
    project: &'a str,
    path: &'a str,
    data: &'a [u8],
    sha256: &'a str,
    len: usize,
}

fn parse(at: &[u8], generation: u64, seq: u64) -> Option<Parsed<'_>> {
    let head = at.get(..RECORD_HEAD)?;
    if &head[..4] != RECORD_MAGIC {
        return None;
    }
    let u16_at = |i: usize| u16::from_le_bytes([head[i], head[i + 1]]) as usize;
    let u32_at = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().unwrap_or_default());
    let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().unwrap_or_default());
    if u64_at(8) != generation || u64_at(16) != seq {
        return None;
    }
    let kind = head[24];
    let (project_len, path_len, data_len) = (u16_at(25), u16_at(27), u32_at(29) as usize);
    let payload = u32_at(4) as usize;
    if payload != RECORD_HEAD - 8 + project_len + path_len + data_len {
        return None;
    }
    let names_end = RECORD_HEAD + project_len + path_len;
    let total = names_end + data_len + CHECK_LEN;
    let whole = at.get(..total)?;
    let check = cairn_sha256::sha256(&whole[..names_end]);
    if check[..] != whole[total - CHECK_LEN..] {
        return None;
    }
    let text = |r: std::ops::Range<usize>| std::str::from_utf8(&whole[r]).ok();
    let sha256 = text(33..33 + 64)?;
    let data = &whole[names_end..names_end + data_len];
    if kind == WRITE && cairn_sha256::sha256_hex(data) != sha256 {
        return None;
    }
    Some(Parsed {
        kind,
        project: text(RECORD_HEAD..RECORD_HEAD + project_len)?,
        path: text(RECORD_HEAD + project_len..names_end)?,
        data,
        sha256,
        len: total,
    })
}

/// The writes of `generation` that stand: per path, the last write not cancelled.
fn replay(image: &[u8], generation: u64) -> Vec<Recovered> {
    let mut order: Vec<(String, String)> = Vec::new();
    let mut writes: HashMap<(String, String), Vec<Recovered>> = HashMap::new();
    let mut at = RECORDS_AT as usize;
    let mut seq = 0u64;
    while let Some(record) = image
        .get(at..)
        .and_then(|rest| parse(rest, generation, seq))
    {
        let key = (record.project.to_owned(), record.path.to_owned());
        let stack = writes.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            Vec::new()
        });
        match record.kind {
            WRITE => stack.push(Recovered {
                project: record.project.to_owned(),
                path: record.path.to_owned(),
                bytes: Bytes::copy_from_slice(record.data),
                sha256: record.sha256.to_owned(),
            }),
            CANCEL => drop(stack.pop()),
            _ => break,
        }
        at += record.len;
        seq += 1;
    }
    order
        .into_iter()
        .filter_map(|key| writes.remove(&key).and_then(|mut stack| stack.pop()))
        .collect()
}

fn dir_key(dir: &OwnedFd) -> Option<(u64, u64)> {
    rustix::fs::fstat(dir).ok().map(|st| (st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record<'a>(path: &'a str, sha: &'a str, bytes: &'a [Bytes]) -> Record<'a> {
        Record {
            project: "p",
            path,
            sha256: sha,
            bytes,
        }
    }

    fn image_with(records: &[(u8, &str, &[u8])], generation: u64) -> Vec<u8> {
        let mut image = vec![0u8; RECORDS_AT as usize];
        image[SECOND_SLOT as usize..SECOND_SLOT as usize + HEADER_LEN]
            .copy_from_slice(&header(generation));
        for (seq, (kind, path, data)) in records.iter().enumerate() {
            let sha = cairn_sha256::sha256_hex(data);
            let bytes = [Bytes::copy_from_slice(data)];
            image.extend(encode(
                generation,
                seq as u64,
                *kind,
                &record(path, &sha, &bytes),
            ));
        }
        image.resize(image.len() + 4096, 0);
        image
    }

    #[test]
    fn the_last_write_not_cancelled_stands_for_each_path() {
        let image = image_with(
            &[
                (WRITE, "a", b"a1"),
                (WRITE, "b", b"b1"),
                (WRITE, "a", b"a2"),
                (WRITE, "b", b"b2"),
                (CANCEL, "b", b""),
                (WRITE, "c", b"c1"),
                (CANCEL, "c", b""),
            ],
            3,
        );
        assert_eq!(current_generation(&image), Some(3));
        let got: Vec<(String, Bytes)> = replay(&image, 3)
            .into_iter()
            .map(|r| (r.path, r.bytes))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), Bytes::from("a2")),
                ("b".into(), Bytes::from("b1"))
            ]
        );
        assert!(
            replay(&image, 4).is_empty(),
            "records of another generation count for nothing"
        );
    }

    #[test]
    fn a_torn_or_damaged_record_ends_the_log() {
        let clean = image_with(&[(WRITE, "a", b"first"), (WRITE, "b", b"second")], 1);
        let second_at = RECORDS_AT as usize + RECORD_HEAD + 1 + 1 + 5 + CHECK_LEN;
        for flip in [
            second_at + 2,
            second_at + 20,
            second_at + RECORD_HEAD + 2,
            second_at + RECORD_HEAD + 4,
        ] {
            let mut image = clean.clone();
            image[flip] ^= 0x40;
            let got: Vec<String> = replay(&image, 1).into_iter().map(|r| r.path).collect();
            assert_eq!(got, vec!["a".to_string()], "byte {flip} flipped");
        }
        let got: Vec<String> = replay(&clean, 1).into_iter().map(|r| r.path).collect();
        assert_eq!(got, vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn a_torn_header_leaves_the_other_one() {
        let mut image = image_with(&[], 7);
        image[..HEADER_LEN].copy_from_slice(&header(8));
        assert_eq!(current_generation(&image), Some(8));
        image[3] ^= 1;
        assert_eq!(current_generation(&image), Some(7));
        image[SECOND_SLOT as usize + 9] ^= 1;
        assert_eq!(current_generation(&image), None);
    }

    #[test]
    fn records_are_redone_after_a_reopen_until_a_new_generation_begins() {
        let root = tempfile::tempdir().unwrap();
        let dir = Arc::new(
            rustix::fs::open(
                root.path(),
                rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY,
                rustix::fs::Mode::empty(),
            )
            .unwrap(),
        );
        let (journal, found) = Journal::open(root.path()).unwrap();
        assert!(found.is_empty());
        journal.begin().unwrap();
        std::fs::write(root.path().join("x"), b"hello").unwrap();
        let body = [Bytes::from_static(b"hello")];
        let sha = cairn_sha256::sha256_hex(b"hello");
        let done = journal.publish(record("x", &sha, &body), &dir, "x", || Ok::<_, IoError>(7));
        assert_eq!(done.unwrap().unwrap(), 7);
        let refused = journal.publish(record("y", &sha, &body), &dir, "y", || {
            Err::<(), _>(IoError::new("refused", std::io::Error::other("no")))
        });
        assert!(refused.unwrap().is_err());
        drop(journal);
        let (journal, found) = Journal::open(root.path()).unwrap();
        let got: Vec<(String, Bytes)> = found.into_iter().map(|r| (r.path, r.bytes)).collect();
        assert_eq!(
            got,
            vec![("x".into(), Bytes::from("hello"))],
            "the refused y is not redone"
        );
        journal.begin().unwrap();
        drop(journal);
        let (_, found) = Journal::open(root.path()).unwrap();
        assert!(found.is_empty(), "a new generation voids the old records");
    }
}
