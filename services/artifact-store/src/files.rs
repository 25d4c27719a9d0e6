//! The store's atomic file writes, below Put and Delete: a temp file staged in the target's
//! directory (reached beneath the project root without following symlinks), published by one
//! link (no-replace) or rename (overwrite), then the directory fsync'd. An existing file is
//! never opened for writing (no O_TRUNC: it may be a hard link to a file elsewhere);
//! publishing replaces the directory entry, not the inode. The store's own small writes
//! (project metadata, run epochs, JSON documents) go through [`write_bytes`]. Small bodies held
//! in memory are made durable through the Put journal instead of two fsyncs (see `journal`),
//! whose records are redone at start-up by [`restore_journaled`].
//!
//! May depend on: state, layout, temp, digest, error, cairn-contain, cairn-durable; never on the run
//! logs or anything above them.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use bytes::Bytes;
use cairn_contain as contain;
use cairn_sha256::Sha256;
use rustix::fs::{FileType, OFlags};
use rustix::io::Errno;

use crate::digest::Digest;
use crate::error::{refusal, Error, Result};
use crate::state::State;
use crate::temp::TempFile;
use cairn_durable::journal;

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The path did not exist.
    Created,
    /// The same bytes were already there.
    Unchanged,
    /// Other bytes were replaced (overwrite=true).
    Overwritten,
}

/// When a write may replace a file that holds other bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Replace {
    /// Never: other bytes at the path are `exists` (overwrite=false).
    #[default]
    Never,
    /// Always (overwrite=true).
    Always,
    /// Only while the file there holds exactly these bytes (lower-case hex sha256): a
    /// compare-and-swap. Other bytes are `changed`; a missing file is created.
    IfHolds(String),
}

impl Replace {
    /// `overwrite` as the Put header spells it.
    pub fn overwrite(overwrite: bool) -> Replace {
        if overwrite {
            Replace::Always
        } else {
            Replace::Never
        }
    }
}

/// Result of a write.
#[derive(Debug, Clone)]
pub struct Written {
    /// Normalised project-relative path.
    pub path: String,
    /// Digest of the bytes now at the path.
    pub digest: Digest,
    pub outcome: Outcome,
    /// A deferred Put's publication token (see `publication`); None when durable already.
    pub publication: Option<String>,
}

/// A temp file next to its target, ready to receive bytes.
#[derive(Debug)]
pub(crate) struct Staged {
    pub(crate) project: String,
    pub(crate) path: String,
    /// The target's directory.
    pub(crate) dir: Arc<OwnedFd>,
    /// The target's name in `dir`.
    pub(crate) name: String,
    temp: TempFile,
}

/// Reaches the target's directory beneath `root` (creating it), refuses a non-file at the
/// target early, and creates the temp file.
pub(crate) fn stage(
    state: &State,
    root: BorrowedFd<'_>,
    project: &str,
    path: &str,
) -> Result<(Staged, File)> {
    let (parent, name) = contain::split_parent(path);
    let dir = contain::ensure_dir(root, parent)
        .map_err(|e| refusal(e, project, path, "creating the directories of"))?;
    let dir = Arc::new(dir);
    existing_file(dir.as_fd(), name, project, path)?;
    let (temp, file) = TempFile::create(dir.clone(), state.unnamed_temps)
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

/// Reads a regular file of at most `max` bytes beneath `root` (None when nothing is there);
/// a larger one is `too_large`, another kind of entry `not_a_file`.
pub(crate) fn read_at_most(
    root: BorrowedFd<'_>,
    project: &str,
    path: &str,
    max: u64,
) -> Result<Option<Vec<u8>>> {
    use std::io::Read as _;
    let fd = match contain::open(root, path, OFlags::RDONLY | OFlags::NONBLOCK, 0) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(refusal(e, project, path, "reading")),
    };
    let file = File::from(fd);
    let st = rustix::fs::fstat(&file).map_err(|e| Error::io(format!("stat of {path:?}"), e))?;
    match contain::kind(&st) {
        FileType::RegularFile => {}
        FileType::Directory => {
            return Err(Error::NotAFile {
                path: path.to_owned(),
                found: "a directory is there, not a file",
            })
        }
        _ => {
            return Err(Error::NotAFile {
                path: path.to_owned(),
                found: "a special file is there, not a regular file",
            })
        }
    }
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading {path:?}"), e))?;
    if bytes.len() as u64 > max {
        return Err(Error::TooLarge {
            what: format!("file {path:?}"),
            limit: max,
        });
    }
    Ok(Some(bytes))
}

/// What is at the target now: a regular file (its stat), nothing, or a refusal.
pub(crate) fn existing_file(
    dir: BorrowedFd<'_>,
    name: &str,
    project: &str,
    path: &str,
) -> Result<Option<rustix::fs::Stat>> {
    match contain::stat(dir, name) {
        Ok(st) => match contain::kind(&st) {
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
pub(crate) fn holds_same_bytes(
    state: &State,
    staged: &Staged,
    digest: &Digest,
) -> Result<(bool, u64)> {
    match current_digest(state, staged, Some(digest.size_bytes))? {
        Some((sha256, size)) => Ok((sha256.as_deref() == Some(digest.sha256.as_str()), size)),
        None => Ok((false, 0)),
    }
}

/// The sha256 and size of the regular file at the target (None: not a regular file). The
/// file is only hashed when its size is `size_hint` (or there is no hint).
fn current_digest(
    state: &State,
    staged: &Staged,
    size_hint: Option<u64>,
) -> Result<Option<(Option<String>, u64)>> {
    let fd = contain::open(
        staged.dir.as_fd(),
        &staged.name,
        OFlags::RDONLY | OFlags::NONBLOCK,
        0,
    )
    .map_err(|e| refusal(e, &staged.project, &staged.path, "reading"))?;
    let file = File::from(fd);
    let st =
        rustix::fs::fstat(&file).map_err(|e| Error::io(format!("stat of {:?}", staged.path), e))?;
    if contain::kind(&st) != FileType::RegularFile {
        return existing_file(
            staged.dir.as_fd(),
            &staged.name,
            &staged.project,
            &staged.path,
        )
        .map(|_| None);
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size_hint.is_some_and(|hint| hint != size) {
        return Ok(Some((None, size)));
    }
    let theirs = state
        .digests
        .of_file(&file)
        .map_err(|e| Error::io(format!("reading {:?}", staged.path), e))?;
    Ok(Some((Some(theirs.sha256), size)))
}

/// Decides a compare-and-swap against the file at the target: `Unchanged` when it already
/// holds the new bytes, `Overwritten` when it holds `expected` (replace it), `Created` when
/// nothing is there, else `changed`.
pub(crate) fn compare(
    state: &State,
    staged: &Staged,
    digest: &Digest,
    expected: &str,
) -> Result<Outcome> {
    if existing_file(
        staged.dir.as_fd(),
        &staged.name,
        &staged.project,
        &staged.path,
    )?
    .is_none()
    {
        return Ok(Outcome::Created);
    }
    let actual = match current_digest(state, staged, None)? {
        Some((Some(sha256), _)) => sha256,
        _ => String::new(),
    };
    if actual == digest.sha256 {
        Ok(Outcome::Unchanged)
    } else if actual == expected {
        Ok(Outcome::Overwritten)
    } else {
        Err(Error::Changed {
            project: staged.project.clone(),
            path: staged.path.clone(),
            expected: expected.to_owned(),
            actual,
        })
    }
}

/// Gives the fsync'd temp file the target's name: no-replace (an existing file with the same
/// bytes is `Unchanged`, other bytes `Exists`), by rename (`Always`), or by rename only while
/// the target holds the expected bytes (`IfHolds`; the caller holds the path's slot).
pub(crate) fn link(
    state: &State,
    staged: &mut Staged,
    file: &File,
    digest: &Digest,
    replace: &Replace,
) -> Result<Outcome> {
    if let Replace::IfHolds(expected) = replace {
        return match compare(state, staged, digest, expected)? {
            Outcome::Created => link(state, staged, file, digest, &Replace::Never),
            Outcome::Overwritten => link(state, staged, file, digest, &Replace::Always),
            Outcome::Unchanged => Ok(Outcome::Unchanged),
        };
    }
    if *replace == Replace::Never {
        let name = staged.name.clone();
        return match staged.temp.link_as(file, &name) {
            Ok(()) => Ok(Outcome::Created),
            Err(Errno::EXIST) => {
                let (same, existing_size) = holds_same_bytes(state, staged, digest)?;
                if same {
                    return Ok(Outcome::Unchanged);
                }
                Err(Error::Exists {
                    project: staged.project.clone(),
                    path: staged.path.clone(),
                    existing_size,
                })
            }
            Err(e) => Err(refusal(e, &staged.project, &staged.path, "publishing")),
        };
    }
    let dir = staged.dir.clone();
    let existed = existing_file(dir.as_fd(), &staged.name, &staged.project, &staged.path)?;
    if let Some(st) = existed {
        if u64::try_from(st.st_size).ok() == Some(digest.size_bytes)
            && holds_same_bytes(state, staged, digest)?.0
        {
            return Ok(Outcome::Unchanged);
        }
    }
    let name = staged.name.clone();
    staged
        .temp
        .replace(file, &name)
        .map_err(|e| refusal(e, &staged.project, &staged.path, "publishing"))?;
    Ok(if existed.is_some() {
        Outcome::Overwritten
    } else {
        Outcome::Created
    })
}

/// Makes a new directory entry durable (now, unless `deferred` to a run's next events) and
/// remembers the file's digest.
pub(crate) fn sync_published(
    state: &State,
    staged: &Staged,
    file: &File,
    digest: &Digest,
    deferred: bool,
) -> Result<()> {
    if !deferred {
        contain::sync_dir(staged.dir.as_fd())
            .map_err(|e| Error::io(format!("fsync of the directory of {:?}", staged.path), e))?;
    }
    remember(state, file, digest);
    Ok(())
}

/// The digest of a body held in memory.
pub(crate) fn digest_of(bytes: &[Bytes]) -> Digest {
    let mut hasher = Sha256::new();
    let mut size_bytes = 0u64;
    for chunk in bytes {
        hasher.update(chunk);
        size_bytes += chunk.len() as u64;
    }
    Digest {
        sha256: hasher.finish_hex(),
        size_bytes,
    }
}

/// Stages a body held in memory next to its target (see [`stage`]).
pub(crate) fn stage_bytes(
    state: &State,
    root: BorrowedFd<'_>,
    project: &str,
    path: &str,
    bytes: &[Bytes],
) -> Result<(Staged, File)> {
    let (staged, mut file) = stage(state, root, project, path)?;
    for chunk in bytes {
        file.write_all(chunk)
            .map_err(|e| Error::io(format!("writing {path:?}"), e))?;
    }
    Ok((staged, file))
}

/// `sync_all` of a file's bytes, timed for `cairn.store.fsync.duration`.
pub(crate) fn timed_sync(file: &File) -> std::io::Result<()> {
    let started = std::time::Instant::now();
    let synced = file.sync_all();
    cairn_telemetry::metrics::store_fsynced("file", started.elapsed());
    synced
}

/// Decides what publishing the staged bytes would do, without doing it (the caller holds the
/// path's slot): `Created`, `Unchanged`, `Overwritten`, or the refusal (`exists`, `changed`).
pub(crate) fn decide(
    state: &State,
    staged: &Staged,
    digest: &Digest,
    replace: &Replace,
) -> Result<Outcome> {
    if let Replace::IfHolds(expected) = replace {
        return compare(state, staged, digest, expected);
    }
    match existing_file(
        staged.dir.as_fd(),
        &staged.name,
        &staged.project,
        &staged.path,
    )? {
        None => Ok(Outcome::Created),
        Some(_) => {
            let (same, existing_size) = holds_same_bytes(state, staged, digest)?;
            if same {
                Ok(Outcome::Unchanged)
            } else if *replace == Replace::Never {
                Err(Error::Exists {
                    project: staged.project.clone(),
                    path: staged.path.clone(),
                    existing_size,
                })
            } else {
                Ok(Outcome::Overwritten)
            }
        }
    }
}

/// Publishes the temp file now, holding the path's slot (and what `guard` returns for the
/// project: a run's fence ticket) across the link; durable before this returns. A body held
/// in memory (`body`) small enough for the Put journal is made durable by the journal's
/// record (see `journal`); any other is fsync'd, linked, and its directory fsync'd.
pub(crate) fn publish_sync<G>(
    state: &State,
    mut staged: Staged,
    file: File,
    digest: &Digest,
    replace: &Replace,
    guard: impl FnOnce(&str) -> Result<G>,
    body: Option<&[Bytes]>,
) -> Result<Outcome> {
    let journal = state
        .journal
        .as_ref()
        .zip(body.filter(|_| digest.size_bytes <= journal::MAX_BODY));
    if journal.is_none() {
        timed_sync(&file)
            .map_err(|e| Error::io(format!("fsync of the temp file for {:?}", staged.path), e))?;
    }
    let slot = state.slots.claim_blocking(&staged.project, &staged.path);
    let guard = guard(&staged.project)?;
    match journal {
        Some((journal, bytes)) => {
            let outcome = decide(state, &staged, digest, replace)?;
            if outcome == Outcome::Unchanged {
                return Ok(outcome);
            }
            let replace = Replace::overwrite(outcome == Outcome::Overwritten);
            let (project, path, dir) = (
                staged.project.clone(),
                staged.path.clone(),
                staged.dir.clone(),
            );
            let record = journal::Record {
                project: &project,
                path: &path,
                sha256: &digest.sha256,
                bytes,
            };
            let name = staged.name.clone();
            let linked = journal.publish(record, &dir, &name, || {
                link(state, &mut staged, &file, digest, &replace)
            });
            if let Some(linked) = linked {
                let outcome = linked?;
                drop(guard);
                drop(slot);
                remember(state, &file, digest);
                return Ok(outcome);
            }
            // The journal could not take it (it is failing): durable the plain way, once no
            // record of the path is left to be redone over it.
            state.settle_journal(&project, &path)?;
            timed_sync(&file)
                .map_err(|e| Error::io(format!("fsync of the temp file for {path:?}"), e))?;
        }
        None => state.settle_journal(&staged.project, &staged.path)?,
    }
    let outcome = link(state, &mut staged, &file, digest, replace)?;
    drop(guard);
    drop(slot);
    if outcome != Outcome::Unchanged {
        sync_published(state, &staged, &file, digest, false)?;
    }
    Ok(outcome)
}

/// Makes the writes the Put journal held at start-up durable (rewriting a file that does not
/// hold its record's bytes), then starts the journal's next generation. Returns how many files
/// were rewritten. A write whose project or path is gone or no longer a file is logged and
/// left.
pub(crate) fn restore_journaled(state: &State) -> Result<usize> {
    let Some(journal) = &state.journal else {
        return Ok(0);
    };
    let recovered = std::mem::take(&mut *state.recovered.lock());
    let mut rewritten = 0;
    for r in &recovered {
        match restore_one(state, r) {
            Ok(true) => rewritten += 1,
            Ok(false) => {}
            Err(e @ (Error::ProjectNotFound(_) | Error::NotAFile { .. })) => {
                tracing::warn!(project = %r.project, path = %r.path, error = %e, "a journaled Put was not restored");
            }
            Err(e) => return Err(e),
        }
    }
    journal.begin()?;
    if !recovered.is_empty() {
        tracing::info!(
            journaled = recovered.len(),
            rewritten,
            "made the Put journal's writes durable"
        );
    }
    Ok(rewritten)
}

/// One journaled write made durable; true when the file had to be written again.
fn restore_one(state: &State, r: &journal::Recovered) -> Result<bool> {
    let root = state.layout.project_root(&r.project)?;
    let current = read_at_most(root.as_fd(), &r.project, &r.path, journal::MAX_BODY).or_else(
        |e| match e {
            Error::TooLarge { .. } => Ok(None),
            other => Err(other),
        },
    )?;
    let (parent, name) = contain::split_parent(&r.path);
    if current.as_deref() == Some(&r.bytes[..]) {
        let dir = contain::open_dir(root.as_fd(), parent)
            .map_err(|e| refusal(e, &r.project, &r.path, "opening the directory of"))?;
        let fd = rustix::fs::openat(
            &dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| refusal(e, &r.project, &r.path, "opening"))?;
        let io = |e: std::io::Error| Error::io(format!("fsync of {:?}", r.path), e);
        File::from(fd).sync_all().map_err(io)?;
        contain::sync_dir(dir.as_fd()).map_err(|e| io(e.into()))?;
        return Ok(false);
    }
    // The journal takes no record before it begins: this write is fsync'd in place.
    write_bytes(
        state,
        root.as_fd(),
        &r.project,
        &r.path,
        std::slice::from_ref(&r.bytes),
        true,
    )?;
    Ok(true)
}

/// Remembers a published file's digest, keyed by its inode's stat.
fn remember(state: &State, file: &File, digest: &Digest) {
    // The published inode's stat (rename changed its ctime) keys the digest cache.
    if let Ok(st) = rustix::fs::fstat(file) {
        state.digests.remember(&st, &digest.sha256);
    }
}

/// Writes `bytes` to `path` in one blocking step (the store's own small writes).
pub(crate) fn write_bytes(
    state: &State,
    root: BorrowedFd<'_>,
    project: &str,
    path: &str,
    bytes: &[Bytes],
    overwrite: bool,
) -> Result<Written> {
    let digest = digest_of(bytes);
    let (staged, file) = stage_bytes(state, root, project, path, bytes)?;
    let replace = Replace::overwrite(overwrite);
    let outcome = publish_sync(
        state,
        staged,
        file,
        &digest,
        &replace,
        |_| Ok(()),
        Some(bytes),
    )?;
    Ok(Written {
        path: path.to_owned(),
        digest,
        outcome,
        publication: None,
    })
}
