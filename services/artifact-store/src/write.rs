//! Put and Delete.
//!
//! A Put never touches the target until the very end: the bytes go into a temp file in the
//! target's directory (see `temp` and `files`). They are hashed while they stream, verified
//! against what the client announced, fsync'd, and published by one link (no-replace) or
//! rename (overwrite), after which the directory is fsync'd, now or (deferred) with the run's
//! next events. Every error or cancellation path drops the temp file's guard, which closes (an
//! unnamed file is then gone) or unlinks it. An overwrite or a delete in a run is recorded as
//! one of its events.
//!
//! May depend on: state, layout, files, events, digest, quota, snapshots, error, cairn-durable,
//! cairn-contain; never on `document`, `read` or `store`.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use bytes::Bytes;
use cairn_contain as contain;
use cairn_sha256::Sha256;
use futures::{Stream, StreamExt};
use rustix::fs::AtFlags;
use rustix::io::Errno;
use tokio::sync::mpsc;

use crate::digest::{self, Digest};
use crate::error::{refusal, Error, Result};
use crate::events::{FenceTicket, NewEvent, RunLogs};
use crate::files::{self, existing_file, Outcome, Replace, Staged, Written};
use crate::layout::check_id;
use crate::project;
use crate::quota::Reservation;
use crate::run_records;
use crate::snapshots;
use crate::state::{blocking, State};
use cairn_durable::direct::DirectWriter;

/// Bodies up to this size are received whole and written in one blocking step; larger ones
/// stream through a write thread and a hash thread in parallel.
const SMALL_BYTES: u64 = 1 << 20;
/// Chunks queued for each of the write and hash threads (bounds memory per Put).
const QUEUED_CHUNKS: usize = 8;

/// When a Put is made durable (its bytes always are, before they are published).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Durability {
    /// Published and durable before the reply.
    #[default]
    Sync,
    /// Published in the background after the reply, durable before the run's next events
    /// (see `deferred` and `slots`); needs a run id.
    WithRunEvents,
}

/// How a staged file is published.
#[derive(Debug, Default)]
struct Publish {
    /// When other bytes at the target are replaced.
    replace: Replace,
    /// Publish after the reply, before this run's next events.
    defer: Option<Deferral>,
    /// (run, epoch) the publication is fenced by.
    fence: Option<(String, u64)>,
}

/// What a Put published in the background carries along.
#[derive(Debug)]
struct Deferral {
    state: Arc<State>,
    runs: Arc<RunLogs>,
    run: String,
    /// One of the store's bounded publications in flight.
    _permit: tokio::sync::OwnedSemaphorePermit,
    /// A snapshot's room under its project's quota, held until it is published.
    quota: Option<Reservation>,
}

/// A Put's header, in the store's words.
#[derive(Debug, Clone, Default)]
pub struct PutSpec {
    pub project_id: String,
    pub path: String,
    pub overwrite: bool,
    /// Replace only while the file there holds these bytes (hex sha256; "" = no condition):
    /// other bytes are `changed`, a missing file is created.
    pub if_sha256: String,
    /// Hex sha256 the bytes must have ("" = no check).
    pub expected_sha256: String,
    pub expected_size: Option<u64>,
    /// Narrows the server's allowed prefixes.
    pub allowed_prefixes: Vec<String>,
    /// Run to record an overwrite in ("" = none).
    pub run_id: String,
    pub create_project: bool,
    pub durability: Durability,
    /// (run, epoch): publish only while that run's writer epoch is `epoch` (ClaimRun).
    pub fence: Option<(String, u64)>,
    /// Written by someone other than the run's writer: run records people may edit
    /// (task.yaml) are checked (`run_records`).
    pub by_hand: bool,
    /// The bytes' sha256 (hex) and size, announced after them: set when the stream's last
    /// message said them. Nothing is published without them (a stream cut short).
    pub digest_at_end: Option<DigestAtEnd>,
}

/// Where a Put's digest announced after its bytes lands (see `PutSpec::digest_at_end`).
pub type DigestAtEnd = Arc<std::sync::OnceLock<(String, u64)>>;

/// What the client announced about the bytes.
#[derive(Debug, Clone, Default)]
struct Expect {
    sha256: Option<String>,
    size: Option<u64>,
}

impl Expect {
    /// Adds the digest announced after the bytes, once they are all in.
    fn at_end(&mut self, path: &str, end: Option<&DigestAtEnd>) -> Result<()> {
        let Some(end) = end else { return Ok(()) };
        let (sha, size) = end.get().ok_or_else(|| {
            Error::BadRequest(format!(
                "the Put of {path:?} announced its digest at the end (digest_at_end) and ended without a PutEnd: nothing was published; send the PutEnd after the last chunk"
            ))
        })?;
        let sha = match sha.as_str() {
            "" => None,
            s => Some(digest::parse_expected(s).ok_or_else(|| {
                Error::BadRequest(format!(
                    "the PutEnd's sha256 {s:?} is not 64 hex digits; send the lower-case hex sha256 of the bytes, or leave it empty"
                ))
            })?),
        };
        let differs =
            |a: Option<&String>, b: Option<&String>| matches!((a, b), (Some(a), Some(b)) if a != b);
        if differs(self.sha256.as_ref(), sha.as_ref()) || self.size.is_some_and(|s| s != *size) {
            return Err(Error::DigestMismatch {
                path: path.to_owned(),
                expected: "the same digest in the PutHeader and the PutEnd".into(),
                actual: format!("{size} bytes, sha256 {sha:?} in the PutEnd"),
            });
        }
        self.sha256 = self.sha256.take().or(sha);
        self.size = Some(*size);
        Ok(())
    }

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

/// fsyncs the temp file and publishes it (see the module header); returns what happened. A
/// deferred publication decides its outcome now and leaves the fsync and the link to a
/// background task that holds the path's slot until it is done; it also returns the token
/// the run's events present for it.
fn publish(
    state: &State,
    runs: &RunLogs,
    staged: Staged,
    file: File,
    digest: &Digest,
    how: Publish,
    body: Option<&[Bytes]>,
) -> Result<(Outcome, Option<String>)> {
    if let Some(defer) = how.defer {
        let slot = state.slots.claim_blocking(&staged.project, &staged.path);
        let outcome = files::decide(state, &staged, digest, &how.replace)?;
        if outcome == Outcome::Unchanged {
            // The bytes may be those of a Put acknowledged before a crash whose directory
            // entry was never fsync'd: the run's events make it durable too.
            let token = state.boot.issue(&staged.project, &defer.run);
            let deferred = runs.defer_dir_sync(&staged.project, &defer.run, &staged.dir);
            if !deferred {
                runs.sync_dir_now(&staged.dir).map_err(|e| {
                    Error::io(format!("fsync of the directory of {:?}", staged.path), e)
                })?;
            }
            return Ok((Outcome::Unchanged, Some(token)));
        }
        // Decided under the path's slot, which the publication keeps: link as decided.
        let replace = Replace::overwrite(outcome == Outcome::Overwritten);
        let ticket = fence_ticket(state, runs, &staged.project, &how.fence)?;
        let publication = runs.start_publication(&staged.project, &defer.run, &staged.path);
        let token = state.boot.issue(&staged.project, &defer.run);
        let digest = digest.clone();
        let work = move || {
            // The whole deferral, not only the fields used below (a closure captures fields
            // apart): its publication permit and snapshot reservation last until this is done.
            let mut defer = defer;
            #[cfg(test)]
            drop(defer.state.hold_publications.lock());
            let room = defer.quota.take();
            let result = crate::quota::publish_with(room, || {
                publish_now(
                    &defer.state,
                    &defer.runs,
                    staged,
                    file,
                    &digest,
                    &replace,
                    &defer.run,
                )
            });
            if let Err(e) = &result {
                tracing::error!(run = %defer.run, error = %e, "a deferred publication failed; the run's events are refused");
            }
            // The run's events wait for this, readers of the path for the slot, a ClaimRun
            // of the fencing run for the ticket.
            publication.finish(&result.map(|_| ()));
            drop(ticket);
            drop(slot);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(work)),
            Err(_) => work(),
        }
        return Ok((outcome, Some(token)));
    }
    let fence = |project: &str| fence_ticket(state, runs, project, &how.fence);
    let outcome = files::publish_sync(state, staged, file, digest, &how.replace, fence, body)?;
    Ok((outcome, None))
}

/// Checks a fenced write's claim; the ticket holds off a ClaimRun of the run until dropped.
fn fence_ticket(
    state: &State,
    runs: &RunLogs,
    project: &str,
    fence: &Option<(String, u64)>,
) -> Result<Option<FenceTicket>> {
    match fence {
        Some((run, epoch)) => Ok(Some(runs.enter_fence(state, project, run, *epoch)?)),
        None => Ok(None),
    }
}

/// The background half of a deferred publication: fsync, link, and the directory left to the
/// run's next events.
fn publish_now(
    state: &State,
    runs: &RunLogs,
    mut staged: Staged,
    file: File,
    digest: &Digest,
    replace: &Replace,
    run: &str,
) -> Result<Outcome> {
    files::timed_sync(&file)
        .map_err(|e| Error::io(format!("fsync of the temp file for {:?}", staged.path), e))?;
    state.settle_journal(&staged.project, &staged.path)?;
    let outcome = files::link(state, &mut staged, &file, digest, replace)?;
    if outcome != Outcome::Unchanged {
        let deferred = runs.defer_dir_sync(&staged.project, run, &staged.dir);
        files::sync_published(state, &staged, &file, digest, deferred)?;
    }
    Ok(outcome)
}

/// A small Put's body, received whole, written in one blocking step.
#[allow(clippy::too_many_arguments)]
fn write_small(
    state: &State,
    runs: &RunLogs,
    root: BorrowedFd<'_>,
    project: &str,
    path: &str,
    bytes: &[Bytes],
    expect: &Expect,
    how: Publish,
) -> Result<Written> {
    let digest = files::digest_of(bytes);
    expect.verify(path, &digest)?;
    let (staged, file) = files::stage_bytes(state, root, project, path, bytes)?;
    let (outcome, publication) = publish(state, runs, staged, file, &digest, how, Some(bytes))?;
    Ok(Written {
        path: path.to_owned(),
        digest,
        outcome,
        publication,
    })
}

/// Put: checks, receives the stream, publishes; records an overwrite as a run event. A run's
/// graph.resolved.json is never replaced, whatever the request asks.
pub async fn put<S>(
    state: &Arc<State>,
    runs: &Arc<RunLogs>,
    mut spec: PutSpec,
    chunks: S,
) -> Result<Written>
where
    S: Stream<Item = Result<Bytes>> + Unpin + Send,
{
    let write_once = run_records::is_graph_resolved(&spec.path);
    if write_once {
        spec.overwrite = false;
        spec.if_sha256.clear();
    }
    match put_any(state, runs, spec, chunks).await {
        Err(Error::Exists { path, .. }) if write_once => Err(Error::WriteOnce { path }),
        other => other,
    }
}

async fn put_any<S>(
    state: &Arc<State>,
    runs: &Arc<RunLogs>,
    spec: PutSpec,
    mut chunks: S,
) -> Result<Written>
where
    S: Stream<Item = Result<Bytes>> + Unpin + Send,
{
    check_id("project", &spec.project_id)?;
    if !spec.run_id.is_empty() {
        check_id("run", &spec.run_id)?;
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
    let path = state
        .layout
        .write_path(&spec.path, &spec.allowed_prefixes)?
        .to_string();
    let max = state.config.max_file_bytes;
    let mut expect = Expect {
        sha256: match spec.expected_sha256.as_str() {
            "" => None,
            s => Some(digest::parse_expected(s).ok_or_else(|| {
                Error::BadRequest(format!("expected_sha256 {s:?} is not 64 hex digits; send the lower-case hex sha256 or leave it empty"))
            })?),
        },
        size: spec.expected_size,
    };
    let replace = match spec.if_sha256.as_str() {
        "" => Replace::overwrite(spec.overwrite),
        s => Replace::IfHolds(digest::parse_expected(s).ok_or_else(|| {
            Error::BadRequest(format!("if_sha256 {s:?} is not 64 hex digits; send the lower-case hex sha256 of the file you expect to replace, or leave it empty"))
        })?),
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

    // A snapshot of announced size is refused before its bytes come when it would not fit;
    // one whose size comes at its end, when not one byte more fits (it is admitted at its
    // end with its size).
    let mut reserved = match expect.size {
        Some(size) => snapshots::admit(state, &spec.project_id, &path, size).await?,
        None => {
            snapshots::admit(state, &spec.project_id, &path, 1).await?;
            None
        }
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

    // Creating it (a new run's) is no edit; replacing it is.
    if spec.by_hand && spec.overwrite && run_records::is_context_manifest(&path) {
        return Err(run_records::context_manifest_refused(&path));
    }
    let check_edit = spec.by_hand && run_records::is_task_yaml(&path);
    if check_edit && !ended {
        return Err(Error::TooLarge {
            what: format!("an edit by hand of {path:?}"),
            limit: SMALL_BYTES,
        });
    }
    let mut defer = match defer_to_run {
        None => None,
        Some(run) => Some(Deferral {
            state: state.clone(),
            runs: runs.clone(),
            run,
            quota: None,
            _permit: state
                .publish_permits
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| Error::Unavailable)?,
        }),
    };
    let written = if ended {
        expect.at_end(&path, spec.digest_at_end.as_ref())?;
        if reserved.is_none() {
            reserved = snapshots::admit(state, &spec.project_id, &path, total).await?;
        }
        if let Some(d) = defer.as_mut() {
            d.quota = reserved.take();
        }
        let (state2, runs2, project, path2, create) = (
            state.clone(),
            runs.clone(),
            spec.project_id.clone(),
            path.clone(),
            spec.create_project,
        );
        let how = Publish {
            replace: replace.clone(),
            defer,
            fence: spec.fence.clone(),
        };
        let room = reserved.take();
        blocking(move || {
            let root = open_root(&state2, &project, create)?;
            let root = root.as_fd();
            if check_edit {
                let current = files::read_at_most(root, &project, &path2, SMALL_BYTES)?;
                run_records::check_edit(&path2, current.as_deref(), &head.concat())?;
            }
            crate::quota::publish_with(room, || {
                write_small(&state2, &runs2, root, &project, &path2, &head, &expect, how)
            })
        })
        .await?
    } else {
        let (state2, project, path2, create) = (
            state.clone(),
            spec.project_id.clone(),
            path.clone(),
            spec.create_project,
        );
        let (staged, file) = blocking(move || {
            let root = open_root(&state2, &project, create)?;
            files::stage(&state2, root.as_fd(), &project, &path2)
        })
        .await?;
        // O_DIRECT while a writer's buffers are to be had (see DIRECT_WRITERS).
        let direct = match state.config.direct_io {
            true => state.direct_writers.clone().try_acquire_owned().ok(),
            false => None,
        };
        let (file, digest, _) = stream_into(file, head, chunks, total, max, &path, direct).await?;
        expect.at_end(&path, spec.digest_at_end.as_ref())?;
        expect.verify(&path, &digest)?;
        if reserved.is_none() {
            reserved = snapshots::admit(state, &spec.project_id, &path, digest.size_bytes).await?;
        }
        if let Some(d) = defer.as_mut() {
            d.quota = reserved.take();
        }
        let (state2, runs2) = (state.clone(), runs.clone());
        let how = Publish {
            replace: replace.clone(),
            defer,
            fence: spec.fence.clone(),
        };
        let room = reserved.take();
        blocking(move || {
            let (outcome, publication) = crate::quota::publish_with(room, || {
                publish(&state2, &runs2, staged, file, &digest, how, None)
            })?;
            Ok(Written {
                path: path.clone(),
                digest,
                outcome,
                publication,
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
            // The new bytes are published (or, deferred, will be before this event is); a
            // failed event must not make the client believe the write did not happen.
            if let Err(e) = runs
                .append(state, &spec.project_id, &spec.run_id, vec![event])
                .await
            {
                tracing::error!(error = %e, path = %written.path, "could not record store.overwritten");
            }
        }
    }
    Ok(written)
}

fn open_root(state: &State, project: &str, create: bool) -> Result<OwnedFd> {
    match state.layout.project_root(project) {
        Err(Error::ProjectNotFound(_)) if create => {
            project::ensure(state, project).map(|(root, _)| root)
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
    direct: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Result<(File, Digest, bool)>
where
    S: Stream<Item = Result<Bytes>> + Unpin + Send,
{
    let (to_writer, mut writer_rx) = mpsc::channel::<Bytes>(QUEUED_CHUNKS);
    let (to_hasher, mut hasher_rx) = mpsc::channel::<Bytes>(QUEUED_CHUNKS);
    let writer = tokio::task::spawn_blocking(move || -> std::io::Result<(File, bool)> {
        let file = match &direct {
            Some(_) => DirectWriter::start(file),
            None => Err(file),
        };
        let mut file = match file {
            Ok(mut writer) => {
                while let Some(chunk) = writer_rx.blocking_recv() {
                    writer.write(&chunk)?;
                }
                let file = writer.finish()?;
                drop(direct);
                return Ok((file, true));
            }
            // Through the page cache, its writeback started as the body streams in.
            Err(file) => file,
        };
        let mut writeback = Writeback::default();
        while let Some(chunk) = writer_rx.blocking_recv() {
            file.write_all(&chunk)?;
            writeback.wrote(&file, chunk.len() as u64);
        }
        Ok((file, false))
    });
    let hasher = tokio::task::spawn_blocking(move || {
        let mut hasher = Sha256::new();
        while let Some(chunk) = hasher_rx.blocking_recv() {
            hasher.update(&chunk);
        }
        hasher.finish_hex()
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
    let (file, direct) = writer
        .await
        .map_err(joined)?
        .map_err(|e| Error::io(format!("writing {path:?}"), e))?;
    let sha256 = hasher.await.map_err(joined)?;
    let digest = Digest {
        sha256,
        size_bytes: total,
    };
    Ok((file, digest, direct))
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
pub async fn delete(
    state: &Arc<State>,
    runs: &RunLogs,
    project: &str,
    path: &str,
    run_id: &str,
) -> Result<bool> {
    check_id("project", project)?;
    if !run_id.is_empty() {
        check_id("run", run_id)?;
    }
    let path = state.layout.write_path(path, &[])?.to_string();
    if run_records::is_graph_resolved(&path) {
        return Err(Error::WriteOnce { path });
    }
    let (state2, project2, path2) = (state.clone(), project.to_owned(), path.clone());
    let deleted = blocking(move || {
        let _slot = state2.slots.claim_blocking(&project2, &path2);
        let root = state2.layout.project_root(&project2)?;
        let (parent, name) = contain::split_parent(&path2);
        let dir = match contain::open_dir(root.as_fd(), parent) {
            Err(Errno::NOENT) => return Ok(false),
            other => {
                other.map_err(|e| refusal(e, &project2, &path2, "opening the directory of"))?
            }
        };
        if existing_file(dir.as_fd(), name, &project2, &path2)?.is_none() {
            return Ok(false);
        }
        state2.settle_journal(&project2, &path2)?;
        match rustix::fs::unlinkat(dir.as_fd(), name, AtFlags::empty()) {
            Ok(()) => {}
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(refusal(e, &project2, &path2, "deleting")),
        }
        contain::sync_dir(dir.as_fd())
            .map_err(|e| Error::io(format!("fsync of the directory of {path2:?}"), e))?;
        Ok(true)
    })
    .await?;
    if deleted && !run_id.is_empty() {
        let event = NewEvent::store("store.deleted", serde_json::json!({"path": path}));
        if let Err(e) = runs.append(state, project, run_id, vec![event]).await {
            tracing::error!(error = %e, %path, "could not record store.deleted");
        }
    }
    Ok(deleted)
}

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;
