//! Writing files: Put, Delete, and the store's own writes.
//!
//! A write never touches the target until the very end: the bytes go into a temp file in the
//! target's directory (held open as an fd, reached beneath the project root without following
//! symlinks): an unnamed O_TMPFILE inode where the filesystem has it, else a name created with
//! O_CREAT|O_EXCL. They are hashed while they stream, verified against what the client
//! announced, fsync'd, and published by one link (no-replace) or rename (overwrite), after
//! which the directory is fsync'd. An existing file is never opened for writing (no O_TRUNC: it
//! may be a hard link to a file elsewhere); publishing replaces the directory entry, not the
//! inode. Every error or cancellation path drops the [`TempFile`] guard, which closes (an
//! unnamed file is then gone) or unlinks the temp file.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use rustix::fs::{AtFlags, FileType, OFlags, RenameFlags};
use rustix::io::Errno;
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;

use crate::beneath::{self, refusal};
use crate::digest::{self, Digest};
use crate::error::{Error, Result};
use crate::events::NewEvent;
use crate::project;
use crate::store::{blocking, Store, TEMP_PREFIX};

/// Bodies up to this size are received whole and written in one blocking step; larger ones
/// stream through a write thread and a hash thread in parallel.
const SMALL_BYTES: u64 = 1 << 20;
/// Chunks queued for each of the write and hash threads (bounds memory per Put).
const QUEUED_CHUNKS: usize = 8;

/// What a Put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The path did not exist.
    Created,
    /// The same bytes were already there.
    Unchanged,
    /// Other bytes were replaced (overwrite=true).
    Overwritten,
}

/// Result of a write.
#[derive(Debug, Clone)]
pub struct Written {
    /// Normalised project-relative path.
    pub path: String,
    /// Digest of the bytes now at the path.
    pub digest: Digest,
    pub outcome: Outcome,
}

/// When a Put's new directory entry is made durable (the bytes always are, before publishing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Durability {
    /// Before the reply.
    #[default]
    Sync,
    /// With the run's next events (see `deferred`); needs a run id.
    WithRunEvents,
}

/// How a staged file is published.
#[derive(Debug, Clone, Copy, Default)]
struct Publish<'a> {
    /// Replace other bytes at the target.
    overwrite: bool,
    /// Leave the directory fsync to this run's next events.
    defer_to_run: Option<&'a str>,
}

/// A Put's header, in the store's words.
#[derive(Debug, Clone, Default)]
pub struct PutSpec {
    pub project_id: String,
    pub path: String,
    pub overwrite: bool,
    /// Hex sha256 the bytes must have ("" = no check).
    pub expected_sha256: String,
    pub expected_size: Option<u64>,
    /// Narrows the server's allowed prefixes.
    pub allowed_prefixes: Vec<String>,
    /// Run to record an overwrite in ("" = none).
    pub run_id: String,
    pub create_project: bool,
    pub durability: Durability,
}

/// What the client announced about the bytes.
#[derive(Debug, Clone, Default)]
struct Expect {
    sha256: Option<String>,
    size: Option<u64>,
}

impl Expect {
    fn verify(&self, path: &str, got: &Digest) -> Result<()> {
        if let Some(size) = self.size {
            if size != got.size_bytes {
                return Err(Error::DigestMismatch {
                    path: path.to_owned(),
                    expected: format!("{size} bytes"),
                    actual: format!("{} bytes", got.size_bytes),
                });
            }
        }
        if let Some(sha) = &self.sha256 {
            if *sha != got.sha256 {
                return Err(Error::DigestMismatch {
                    path: path.to_owned(),
                    expected: format!("sha256 {sha}"),
                    actual: format!("sha256 {}", got.sha256),
                });
            }
        }
        Ok(())
    }
}

/// The temp file of one write: an unnamed inode in the target's directory (O_TMPFILE, where
/// the filesystem has it: nothing to clean after a crash) or a `.cairn-tmp-*` name, unlinked on
/// drop unless it was published.
#[derive(Debug)]
struct TempFile {
    dir: Arc<OwnedFd>,
    /// None while the inode has no name.
    name: Option<String>,
    armed: bool,
}

impl TempFile {
    fn create(dir: Arc<OwnedFd>, unnamed: bool) -> std::result::Result<(TempFile, File), Errno> {
        if unnamed {
            match rustix::fs::openat(
                dir.as_fd(),
                ".",
                OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
                rustix::fs::Mode::from_raw_mode(beneath::FILE_MODE),
            ) {
                Ok(fd) => {
                    let temp = TempFile {
                        dir,
                        name: None,
                        armed: false,
                    };
                    return Ok((temp, File::from(fd)));
                }
                // This directory's filesystem has no O_TMPFILE: use a name.
                Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {}
                Err(e) => return Err(e),
            }
        }
        let name = temp_name();
        let fd = rustix::fs::openat(
            dir.as_fd(),
            name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            rustix::fs::Mode::from_raw_mode(beneath::FILE_MODE),
        )?;
        Ok((
            TempFile {
                dir,
                name: Some(name),
                armed: true,
            },
            File::from(fd),
        ))
    }

    /// Links the file at `name` in its directory, failing with EEXIST when something is there
    /// (the atomic no-replace publish).
    fn link_as(&mut self, file: &File, name: &str) -> std::result::Result<(), Errno> {
        match &self.name {
            None => link_unnamed(file, self.dir.as_fd(), name),
            Some(tmp) => match rustix::fs::renameat_with(
                self.dir.as_fd(),
                tmp.as_str(),
                self.dir.as_fd(),
                name,
                RenameFlags::NOREPLACE,
            ) {
                Ok(()) => {
                    self.armed = false;
                    Ok(())
                }
                // Filesystems without RENAME_NOREPLACE: link(2) also refuses an existing
                // target atomically; the temp name is then unlinked by the guard.
                Err(Errno::INVAL) => rustix::fs::linkat(
                    self.dir.as_fd(),
                    tmp.as_str(),
                    self.dir.as_fd(),
                    name,
                    AtFlags::empty(),
                ),
                Err(e) => Err(e),
            },
        }
    }

    /// Moves the file over `name`, replacing what is there (an unnamed inode first gets a
    /// temp name, since only rename replaces atomically).
    fn replace(&mut self, file: &File, name: &str) -> std::result::Result<(), Errno> {
        let tmp = match &self.name {
            Some(tmp) => tmp.clone(),
            None => {
                let tmp = temp_name();
                link_unnamed(file, self.dir.as_fd(), &tmp)?;
                self.name = Some(tmp.clone());
                self.armed = true;
                tmp
            }
        };
        rustix::fs::renameat(self.dir.as_fd(), tmp.as_str(), self.dir.as_fd(), name)?;
        self.armed = false;
        Ok(())
    }
}

fn temp_name() -> String {
    format!("{TEMP_PREFIX}{}", uuid::Uuid::new_v4().simple())
}

/// Gives an O_TMPFILE inode the name `name` in `dir` (through its /proc/self/fd link; EEXIST
/// when the name is taken).
fn link_unnamed(file: &File, dir: BorrowedFd<'_>, name: &str) -> std::result::Result<(), Errno> {
    use std::os::fd::AsRawFd;
    rustix::fs::linkat(
        rustix::fs::CWD,
        format!("/proc/self/fd/{}", file.as_raw_fd()).as_str(),
        dir,
        name,
        AtFlags::SYMLINK_FOLLOW,
    )
}

/// Whether unnamed temp files work under `dir` (O_TMPFILE, and /proc to name them).
pub(crate) fn unnamed_temps_work(dir: BorrowedFd<'_>) -> bool {
    let Ok((mut temp, file)) = TempFile::create(
        Arc::new(match rustix::io::dup(dir) {
            Ok(fd) => fd,
            Err(_) => return false,
        }),
        true,
    ) else {
        return false;
    };
    if temp.name.is_some() {
        return false;
    }
    let probe = temp_name();
    let linked = temp.link_as(&file, &probe).is_ok();
    if linked {
        let _ = rustix::fs::unlinkat(dir, probe.as_str(), AtFlags::empty());
    }
    linked
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let (true, Some(name)) = (self.armed, &self.name) {
            let _ = rustix::fs::unlinkat(self.dir.as_fd(), name.as_str(), AtFlags::empty());
        }
    }
}

/// A temp file next to its target, ready to receive bytes.
#[derive(Debug)]
struct Staged {
    project: String,
    path: String,
    /// The target's directory.
    dir: Arc<OwnedFd>,
    /// The target's name in `dir`.
    name: String,
    temp: TempFile,
}

/// Reaches the target's directory beneath `root` (creating it), refuses a non-file at the
/// target early, and creates the temp file.
fn stage(store: &Store, root: BorrowedFd<'_>, project: &str, path: &str) -> Result<(Staged, File)> {
    let (parent, name) = beneath::split_parent(path);
    let dir = beneath::ensure_dir(root, parent)
        .map_err(|e| refusal(e, project, path, "creating the directories of"))?;
    let dir = Arc::new(dir);
    existing_file(dir.as_fd(), name, project, path)?;
    let (temp, file) = TempFile::create(dir.clone(), store.unnamed_temps)
        .map_err(|e| refusal(e, project, path, "creating a temp file for"))?;
    let staged = Staged {
        project: project.to_owned(),
        path: path.to_owned(),
        dir,
        name: name.to_owned(),
        temp,
    };
    Ok((staged, file))
}

/// What is at the target now: a regular file (its stat), nothing, or a refusal.
fn existing_file(
    dir: BorrowedFd<'_>,
    name: &str,
    project: &str,
    path: &str,
) -> Result<Option<rustix::fs::Stat>> {
    match beneath::stat(dir, name) {
        Ok(st) => match beneath::kind(&st) {
            FileType::RegularFile => Ok(Some(st)),
            FileType::Directory => Err(Error::NotAFile {
                path: path.to_owned(),
                found: "a directory is there, not a file; choose another path",
            }),
            FileType::Symlink => Err(Error::SymlinkInPath { path: path.to_owned() }),
            _ => Err(Error::NotAFile {
                path: path.to_owned(),
                found: "a special file (fifo, socket or device) is there; only regular files are stored",
            }),
        },
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(refusal(e, project, path, "looking at")),
    }
}

/// True when the file at the target holds exactly `digest`'s bytes (also returns its size).
fn holds_same_bytes(store: &Store, staged: &Staged, digest: &Digest) -> Result<(bool, u64)> {
    let fd = beneath::open(
        staged.dir.as_fd(),
        &staged.name,
        OFlags::RDONLY | OFlags::NONBLOCK,
        0,
    )
    .map_err(|e| refusal(e, &staged.project, &staged.path, "reading"))?;
    let file = File::from(fd);
    let st =
        rustix::fs::fstat(&file).map_err(|e| Error::io(format!("stat of {:?}", staged.path), e))?;
    if beneath::kind(&st) != FileType::RegularFile {
        return existing_file(
            staged.dir.as_fd(),
            &staged.name,
            &staged.project,
            &staged.path,
        )
        .map(|_| (false, 0));
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size != digest.size_bytes {
        return Ok((false, size));
    }
    let theirs = store
        .digests
        .of_file(&file)
        .map_err(|e| Error::io(format!("reading {:?}", staged.path), e))?;
    Ok((theirs.sha256 == digest.sha256, size))
}

/// fsyncs the temp file and publishes it (see the module header); returns what happened.
fn publish(
    store: &Store,
    mut staged: Staged,
    file: File,
    digest: &Digest,
    how: Publish<'_>,
) -> Result<Outcome> {
    file.sync_all()
        .map_err(|e| Error::io(format!("fsync of the temp file for {:?}", staged.path), e))?;
    let dir = staged.dir.clone();
    let name = staged.name.clone();
    let existed = existing_file(dir.as_fd(), &name, &staged.project, &staged.path)?;
    let outcome = if !how.overwrite {
        match staged.temp.link_as(&file, &name) {
            Ok(()) => Outcome::Created,
            Err(Errno::EXIST) => {
                let (same, existing_size) = holds_same_bytes(store, &staged, digest)?;
                if same {
                    return Ok(Outcome::Unchanged);
                }
                return Err(Error::Exists {
                    path: staged.path.clone(),
                    existing_size,
                });
            }
            Err(e) => return Err(refusal(e, &staged.project, &staged.path, "publishing")),
        }
    } else {
        if let Some(st) = existed {
            if u64::try_from(st.st_size).ok() == Some(digest.size_bytes)
                && holds_same_bytes(store, &staged, digest)?.0
            {
                return Ok(Outcome::Unchanged);
            }
        }
        staged
            .temp
            .replace(&file, &name)
            .map_err(|e| refusal(e, &staged.project, &staged.path, "publishing"))?;
        if existed.is_some() {
            Outcome::Overwritten
        } else {
            Outcome::Created
        }
    };
    let deferred = how
        .defer_to_run
        .is_some_and(|run| store.runs.defer_dir_sync(&staged.project, run, &dir));
    if !deferred {
        beneath::sync_dir(dir.as_fd())
            .map_err(|e| Error::io(format!("fsync of the directory of {:?}", staged.path), e))?;
    }
    // The published inode's stat (rename changed its ctime) keys the digest cache.
    if let Ok(st) = rustix::fs::fstat(&file) {
        store.digests.remember(&st, &digest.sha256);
    }
    drop(staged);
    Ok(outcome)
}

/// Writes `bytes` to `path` in one blocking step (the store's own small writes and small Puts).
pub(crate) fn write_bytes(
    store: &Store,
    root: BorrowedFd<'_>,
    project: &str,
    path: &str,
    bytes: &[Bytes],
    overwrite: bool,
) -> Result<Written> {
    write_small(
        store,
        root,
        project,
        path,
        bytes,
        &Expect::default(),
        Publish {
            overwrite,
            defer_to_run: None,
        },
    )
}

fn write_small(
    store: &Store,
    root: BorrowedFd<'_>,
    project: &str,
    path: &str,
    bytes: &[Bytes],
    expect: &Expect,
    how: Publish<'_>,
) -> Result<Written> {
    let mut hasher = Sha256::new();
    let mut size_bytes = 0u64;
    for chunk in bytes {
        hasher.update(chunk);
        size_bytes += chunk.len() as u64;
    }
    let digest = Digest {
        sha256: hex::encode(hasher.finalize()),
        size_bytes,
    };
    expect.verify(path, &digest)?;
    let (staged, mut file) = stage(store, root, project, path)?;
    for chunk in bytes {
        file.write_all(chunk)
            .map_err(|e| Error::io(format!("writing {path:?}"), e))?;
    }
    let outcome = publish(store, staged, file, &digest, how)?;
    Ok(Written {
        path: path.to_owned(),
        digest,
        outcome,
    })
}

/// Put: checks, receives the stream, publishes; records an overwrite as a run event.
pub async fn put<S>(store: &Arc<Store>, spec: PutSpec, mut chunks: S) -> Result<Written>
where
    S: Stream<Item = Result<Bytes>> + Unpin + Send,
{
    project::check_id("project", &spec.project_id)?;
    if !spec.run_id.is_empty() {
        project::check_id("run", &spec.run_id)?;
    }
    let defer_to_run = match spec.durability {
        Durability::Sync => None,
        Durability::WithRunEvents if spec.run_id.is_empty() => {
            return Err(Error::BadRequest(
                "durability PUT_DURABILITY_WITH_RUN_EVENTS needs a run_id: the file's directory is made durable with that run's next events; set run_id or use PUT_DURABILITY_SYNC".into(),
            ))
        }
        Durability::WithRunEvents => Some(spec.run_id.clone()),
    };
    let path = store
        .write_path(&spec.path, &spec.allowed_prefixes)?
        .to_string();
    let max = store.config.max_file_bytes;
    let expect = Expect {
        sha256: match spec.expected_sha256.as_str() {
            "" => None,
            s => Some(digest::parse_expected(s).ok_or_else(|| {
                Error::BadRequest(format!("expected_sha256 {s:?} is not 64 hex digits; send the lower-case hex sha256 or leave it empty"))
            })?),
        },
        size: spec.expected_size,
    };
    if let Some(size) = expect.size.filter(|s| *s > max) {
        return Err(Error::TooLarge {
            what: format!("the announced size of {path:?} ({size} bytes)"),
            limit: max,
        });
    }
    let too_large = |total: u64| Error::TooLarge {
        what: format!("the body of {path:?} ({total}+ bytes)"),
        limit: max,
    };

    // Receive up to SMALL_BYTES before touching the disk.
    let mut head = Vec::new();
    let mut total = 0u64;
    let mut ended = false;
    while total <= SMALL_BYTES {
        match chunks.next().await {
            None => {
                ended = true;
                break;
            }
            Some(chunk) => {
                let chunk = chunk?;
                total += chunk.len() as u64;
                if total > max {
                    return Err(too_large(total));
                }
                head.push(chunk);
            }
        }
    }

    let written = if ended {
        let (store2, project, path2, overwrite, create, defer) = (
            store.clone(),
            spec.project_id.clone(),
            path.clone(),
            spec.overwrite,
            spec.create_project,
            defer_to_run.clone(),
        );
        blocking(move || {
            let root = open_root(&store2, &project, create)?;
            write_small(
                &store2,
                root.as_fd(),
                &project,
                &path2,
                &head,
                &expect,
                Publish {
                    overwrite,
                    defer_to_run: defer.as_deref(),
                },
            )
        })
        .await?
    } else {
        let (store2, project, path2, create) = (
            store.clone(),
            spec.project_id.clone(),
            path.clone(),
            spec.create_project,
        );
        let (staged, file) = blocking(move || {
            let root = open_root(&store2, &project, create)?;
            stage(&store2, root.as_fd(), &project, &path2)
        })
        .await?;
        let (file, digest) = stream_into(file, head, chunks, total, max, &path).await?;
        expect.verify(&path, &digest)?;
        let (store2, overwrite) = (store.clone(), spec.overwrite);
        blocking(move || {
            let how = Publish {
                overwrite,
                defer_to_run: defer_to_run.as_deref(),
            };
            let outcome = publish(&store2, staged, file, &digest, how)?;
            Ok(Written {
                path: path.clone(),
                digest,
                outcome,
            })
        })
        .await?
    };

    if written.outcome == Outcome::Overwritten {
        tracing::info!(project = %spec.project_id, path = %written.path, sha256 = %written.digest.sha256, run = %spec.run_id, "file overwritten");
        if !spec.run_id.is_empty() {
            let event = NewEvent::store(
                "store.overwritten",
                serde_json::json!({"path": written.path, "sha256": written.digest.sha256, "size_bytes": written.digest.size_bytes}),
            );
            // The new bytes are durable already; a failed event must not make the client
            // believe the write did not happen.
            if let Err(e) = store
                .runs
                .append(store, &spec.project_id, &spec.run_id, vec![event])
                .await
            {
                tracing::error!(error = %e, path = %written.path, "could not record store.overwritten");
            }
        }
    }
    Ok(written)
}

fn open_root(store: &Store, project: &str, create: bool) -> Result<OwnedFd> {
    match store.project_root(project) {
        Err(Error::ProjectNotFound(_)) if create => {
            project::ensure(store, project).map(|(root, _)| root)
        }
        other => other,
    }
}

/// Streams the rest of a large body into `file`: one thread writes, one hashes, both fed
/// through bounded queues, so memory stays flat and hashing overlaps the disk.
async fn stream_into<S>(
    file: File,
    head: Vec<Bytes>,
    mut chunks: S,
    mut total: u64,
    max: u64,
    path: &str,
) -> Result<(File, Digest)>
where
    S: Stream<Item = Result<Bytes>> + Unpin + Send,
{
    let (to_writer, mut writer_rx) = mpsc::channel::<Bytes>(QUEUED_CHUNKS);
    let (to_hasher, mut hasher_rx) = mpsc::channel::<Bytes>(QUEUED_CHUNKS);
    let writer = tokio::task::spawn_blocking(move || -> std::io::Result<File> {
        let mut file = file;
        let mut writeback = Writeback::default();
        while let Some(chunk) = writer_rx.blocking_recv() {
            file.write_all(&chunk)?;
            writeback.wrote(&file, chunk.len() as u64);
        }
        Ok(file)
    });
    let hasher = tokio::task::spawn_blocking(move || {
        let mut hasher = Sha256::new();
        while let Some(chunk) = hasher_rx.blocking_recv() {
            hasher.update(&chunk);
        }
        hex::encode(hasher.finalize())
    });

    let fed = async {
        for chunk in head {
            if to_writer.send(chunk.clone()).await.is_err() || to_hasher.send(chunk).await.is_err()
            {
                return Ok(());
            }
        }
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            total += chunk.len() as u64;
            if total > max {
                return Err(Error::TooLarge {
                    what: format!("the body of {path:?} ({total}+ bytes)"),
                    limit: max,
                });
            }
            // A closed queue means the writer failed; its error is reported below.
            if to_writer.send(chunk.clone()).await.is_err() || to_hasher.send(chunk).await.is_err()
            {
                return Ok(());
            }
        }
        Ok::<(), Error>(())
    }
    .await;
    drop(to_writer);
    drop(to_hasher);
    fed?;
    let joined = |e: tokio::task::JoinError| {
        Error::io("a write task failed", std::io::Error::other(e.to_string()))
    };
    let file = writer
        .await
        .map_err(joined)?
        .map_err(|e| Error::io(format!("writing {path:?}"), e))?;
    let sha256 = hasher.await.map_err(joined)?;
    Ok((
        file,
        Digest {
            sha256,
            size_bytes: total,
        },
    ))
}

/// Starts disk writeback of a large body while it still streams in, a window at a time, so
/// the final fsync finds little left to write and the disk works in parallel with the
/// network instead of after it. Only a hint: durability still comes from that fsync.
#[derive(Default)]
struct Writeback {
    written: u64,
    flushed: u64,
}

impl Writeback {
    const WINDOW: u64 = 8 << 20;

    fn wrote(&mut self, file: &File, bytes: u64) {
        self.written += bytes;
        if self.written - self.flushed < Self::WINDOW {
            return;
        }
        let (start, len) = (self.flushed, self.written - self.flushed);
        self.flushed = self.written;
        // POSIX_FADV_DONTNEED starts writeback of the range's dirty pages without waiting
        // (Linux). Errors only lose the overlap (e.g. a file system without writeback).
        let _ = rustix::fs::fadvise(
            file,
            start,
            std::num::NonZeroU64::new(len),
            rustix::fs::Advice::DontNeed,
        );
    }
}

/// Delete: removes one regular file; records it when a run is given.
pub async fn delete(store: &Arc<Store>, project: &str, path: &str, run_id: &str) -> Result<bool> {
    project::check_id("project", project)?;
    if !run_id.is_empty() {
        project::check_id("run", run_id)?;
    }
    let path = store.write_path(path, &[])?.to_string();
    let (store2, project2, path2) = (store.clone(), project.to_owned(), path.clone());
    let deleted = blocking(move || {
        let root = store2.project_root(&project2)?;
        let (parent, name) = beneath::split_parent(&path2);
        let dir = match beneath::open_dir(root.as_fd(), parent) {
            Err(Errno::NOENT) => return Ok(false),
            other => {
                other.map_err(|e| refusal(e, &project2, &path2, "opening the directory of"))?
            }
        };
        if existing_file(dir.as_fd(), name, &project2, &path2)?.is_none() {
            return Ok(false);
        }
        match rustix::fs::unlinkat(dir.as_fd(), name, AtFlags::empty()) {
            Ok(()) => {}
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(refusal(e, &project2, &path2, "deleting")),
        }
        beneath::sync_dir(dir.as_fd())
            .map_err(|e| Error::io(format!("fsync of the directory of {path2:?}"), e))?;
        Ok(true)
    })
    .await?;
    if deleted && !run_id.is_empty() {
        let event = NewEvent::store("store.deleted", serde_json::json!({"path": path}));
        if let Err(e) = store.runs.append(store, project, run_id, vec![event]).await {
            tracing::error!(error = %e, %path, "could not record store.deleted");
        }
    }
    Ok(deleted)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn open_store(root: &std::path::Path) -> Arc<Store> {
        Arc::new(
            Store::open(Config {
                data_root: root.to_path_buf(),
                ..Config::default()
            })
            .unwrap(),
        )
    }

    fn spec(path: &str, run: &str, durability: Durability) -> PutSpec {
        PutSpec {
            project_id: "p".into(),
            path: path.into(),
            run_id: run.into(),
            create_project: true,
            durability,
            ..PutSpec::default()
        }
    }

    async fn put_bytes(store: &Arc<Store>, spec: PutSpec, body: &'static [u8]) -> Result<Written> {
        put(
            store,
            spec,
            futures::stream::iter([Ok(Bytes::from_static(body))]),
        )
        .await
    }

    #[tokio::test]
    async fn deferred_directories_are_synced_before_the_runs_next_events() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open_store(tmp.path());
        for (i, path) in ["docs/a.md", "docs/b.md", "out/c.md"].iter().enumerate() {
            let w = put_bytes(
                &store,
                spec(path, "r1", Durability::WithRunEvents),
                b"bytes",
            )
            .await
            .unwrap();
            assert_eq!(w.outcome, Outcome::Created, "{i}");
        }
        // Published at once, directories pending: two distinct ones.
        assert_eq!(
            std::fs::read(tmp.path().join("projects/p/docs/b.md")).unwrap(),
            b"bytes"
        );
        assert_eq!(store.runs.pending_dirs("p", "r1"), 2);
        let event = |run: &'static str| {
            let store = store.clone();
            async move {
                let x = NewEvent::store("x", serde_json::json!({}));
                store.runs.append(&store, "p", run, vec![x]).await.unwrap();
            }
        };
        // Another run's events do not sync them.
        event("r2").await;
        assert_eq!(store.runs.pending_dirs("p", "r1"), 2);
        // The run's own next events do, before they are acknowledged.
        event("r1").await;
        assert_eq!(store.runs.pending_dirs("p", "r1"), 0);
    }

    #[tokio::test]
    async fn a_sync_put_defers_nothing_and_deferral_needs_a_run() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open_store(tmp.path());
        put_bytes(&store, spec("a.md", "r1", Durability::Sync), b"x")
            .await
            .unwrap();
        assert_eq!(store.runs.pending_dirs("p", "r1"), 0);
        let err = put_bytes(&store, spec("b.md", "", Durability::WithRunEvents), b"x")
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::BadRequest(m) if m.contains("needs a run_id")),
            "{err}"
        );
        assert!(!tmp.path().join("projects/p/b.md").exists());
        // An unchanged rewrite publishes nothing, so nothing is pending.
        put_bytes(&store, spec("a.md", "r1", Durability::WithRunEvents), b"x")
            .await
            .unwrap();
        assert_eq!(store.runs.pending_dirs("p", "r1"), 0);
    }

    #[tokio::test]
    async fn unnamed_and_named_temp_files_publish_the_same_way() {
        let tmp = tempfile::tempdir().unwrap();
        // This filesystem (the test's temp dir) has O_TMPFILE; the probe finds it.
        assert!(open_store(tmp.path()).unnamed_temps);
        for unnamed in [true, false] {
            let store = Arc::new(
                Store::open(Config {
                    data_root: tmp.path().to_path_buf(),
                    ..Config::default()
                })
                .map(|mut s| {
                    s.unnamed_temps = unnamed;
                    s
                })
                .unwrap(),
            );
            let path = format!("d/{unnamed}.txt");
            let put = |body: &'static [u8], overwrite: bool| {
                let spec = PutSpec {
                    overwrite,
                    ..spec(&path, "", Durability::Sync)
                };
                put_bytes(&store, spec, body)
            };
            assert_eq!(put(b"one", false).await.unwrap().outcome, Outcome::Created);
            assert_eq!(
                put(b"one", false).await.unwrap().outcome,
                Outcome::Unchanged
            );
            assert!(matches!(
                put(b"two", false).await,
                Err(Error::Exists { .. })
            ));
            assert_eq!(
                put(b"two", true).await.unwrap().outcome,
                Outcome::Overwritten
            );
            let file = tmp.path().join("projects/p").join(&path);
            assert_eq!(std::fs::read(&file).unwrap(), b"two");
            let names: Vec<_> = std::fs::read_dir(file.parent().unwrap())
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(TEMP_PREFIX))
                .collect();
            assert!(names.is_empty(), "temp names left: {names:?}");
        }
    }

    #[tokio::test]
    async fn without_events_the_timer_syncs_deferred_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open_store(tmp.path());
        put_bytes(
            &store,
            spec("d/a.md", "r1", Durability::WithRunEvents),
            b"x",
        )
        .await
        .unwrap();
        assert_eq!(store.runs.pending_dirs("p", "r1"), 1);
        let start = std::time::Instant::now();
        while store.runs.pending_dirs("p", "r1") > 0 {
            assert!(
                start.elapsed() < crate::deferred::SYNC_AFTER * 10,
                "the deferred directory was never synced"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(start.elapsed() >= crate::deferred::SYNC_AFTER / 2);
    }
}
