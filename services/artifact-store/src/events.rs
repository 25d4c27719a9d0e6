//! Run event logs: `.cairn/runs/<run_id>/events.jsonl`, one JSON object per line,
//! `{"ts","seq","type","run_id","node_id","level", ...data}`.
//!
//! The store assigns `seq` per run: 1, 2, 3 ... strictly increasing, no gaps, the events of one
//! call contiguous, and fsync'd before the reply. Each run has one async mutex; callers queue
//! their batch, and whoever holds the mutex writes every queued batch with one write and one
//! fsync (group commit), so concurrent appenders share fsyncs. The last seq is recovered from
//! the file's tail on first touch; a torn last line left by a crash is cut off. Live readers
//! subscribe to a broadcast per run while holding the mutex, then read the file up to the seq
//! they saw, then switch to the broadcast: nothing is lost or sent twice at the switch.
//!
//! [`RunLogs`] also keeps what Put needs of a run: the fence a ClaimRun moves, the deferred
//! publications its next events wait for, the directories they fsync first.
//!
//! May depend on: state, layout, files, deferred, event_seek, stamp, error, cairn-contain; never on
//! `write`, `document` or `store` (which use it).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rustix::fs::{FileType, OFlags};
use rustix::io::Errno;
use serde_json::{Map, Value};
use tokio::sync::{broadcast, mpsc, oneshot};

use cairn_contain as contain;

use crate::deferred::{self, Added, PendingDirs, Publishing};
use crate::error::{refusal, Error, Result};
use crate::event_seek;
use crate::files;
use crate::layout::{check_id, ARCHIVE_FILE, EPOCH_FILE, EVENTS_FILE, EVENTS_INDEX_FILE};
use crate::stamp::timestamp_now;
use crate::state::{blocking, State};

/// Live events buffered per followed run. The ring is allocated whole while anyone follows the
/// run (4096 slots cost about 150 KiB per followed run); a reader that falls behind it goes back
/// to the file, so a small ring costs nothing but a file read under bursts.
const LIVE_CAPACITY: usize = 256;
/// Run logs kept open before idle ones are closed.
const OPEN_LOGS: usize = 256;
const RESERVED_KEYS: &[&str] = &[
    "ts", "seq", "type", "run_id", "node_id", "level", "identity",
];
/// Longest line `recover` reads back to find the last seq.
const MAX_TAIL_LINE: u64 = 64 << 20;

/// Severity of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warning,
    Error,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warning => "warning",
            Level::Error => "error",
        }
    }

    fn parse(s: &str) -> Level {
        match s {
            "debug" => Level::Debug,
            "warning" => Level::Warning,
            "error" => Level::Error,
            _ => Level::Info,
        }
    }
}

/// An event to append.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// Dotted type ("ingest.block.written").
    pub kind: String,
    pub node_id: String,
    pub level: Level,
    /// Extra fields (reserved keys refused).
    pub data: Map<String, Value>,
}

impl NewEvent {
    /// Parses and checks a client's event.
    pub fn from_client(
        kind: &str,
        node_id: &str,
        level: Level,
        data_json: &str,
    ) -> Result<NewEvent> {
        if kind.is_empty()
            || kind.len() > 128
            || kind.chars().any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(Error::BadRequest(format!(
                "event type {kind:?} is invalid: use a dotted name of 1-128 characters without spaces, e.g. \"ingest.block.written\""
            )));
        }
        if !node_id.is_empty() {
            check_id("node", node_id)?;
        }
        let data = match data_json.trim() {
            "" => Map::new(),
            text => match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(map)) => map,
                Ok(_) => {
                    return Err(Error::BadRequest(format!(
                        "data_json of event {kind:?} must be a JSON object"
                    )))
                }
                Err(e) => {
                    return Err(Error::BadRequest(format!(
                        "data_json of event {kind:?} is not valid JSON: {e}"
                    )))
                }
            },
        };
        if let Some(key) = RESERVED_KEYS.iter().find(|k| data.contains_key(**k)) {
            return Err(Error::BadRequest(format!(
                "data_json of event {kind:?} uses the reserved key {key:?} (ts, seq, type, run_id, node_id, level and identity are set by the store); rename it"
            )));
        }
        Ok(NewEvent {
            kind: kind.to_owned(),
            node_id: node_id.to_owned(),
            level,
            data,
        })
    }

    /// Records the authenticated identity that appended it (`identity`; never client-chosen).
    pub fn by(mut self, identity: &str) -> NewEvent {
        self.data
            .insert("identity".to_owned(), Value::String(identity.to_owned()));
        self
    }

    /// An event the store itself records.
    pub fn store(kind: &str, data: Value) -> NewEvent {
        let data = match data {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        NewEvent {
            kind: kind.to_owned(),
            node_id: String::new(),
            level: Level::Info,
            data,
        }
    }

    /// The stored line (without newline).
    pub(crate) fn render(&self, seq: u64, ts: &str, run_id: &str) -> String {
        let s = |v: &str| Value::from(v).to_string();
        let mut line = format!(
            "{{\"ts\":{},\"seq\":{seq},\"type\":{},\"run_id\":{},\"node_id\":{},\"level\":\"{}\"",
            s(ts),
            s(&self.kind),
            s(run_id),
            s(&self.node_id),
            self.level.as_str()
        );
        for (key, value) in &self.data {
            line.push(',');
            line.push_str(&s(key));
            line.push(':');
            line.push_str(&value.to_string());
        }
        line.push('}');
        line
    }
}

/// An event as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: u64,
    pub ts: String,
    pub kind: String,
    pub run_id: String,
    pub node_id: String,
    pub level: Level,
    /// The extra fields as a JSON object.
    pub data_json: String,
    /// The whole line.
    pub line: String,
}

impl StoredEvent {
    pub(crate) fn parse(line: &str) -> Option<StoredEvent> {
        let Ok(Value::Object(mut map)) = serde_json::from_str::<Value>(line) else {
            return None;
        };
        let seq = map.remove("seq")?.as_u64()?;
        let mut text = |k: &str| match map.remove(k) {
            Some(Value::String(s)) => s,
            _ => String::new(),
        };
        let (ts, kind, run_id, node_id, level) = (
            text("ts"),
            text("type"),
            text("run_id"),
            text("node_id"),
            text("level"),
        );
        Some(StoredEvent {
            seq,
            ts,
            kind,
            run_id,
            node_id,
            level: Level::parse(&level),
            data_json: Value::Object(map).to_string(),
            line: line.to_owned(),
        })
    }
}

/// The event logs of every run touched since start-up.
#[derive(Debug, Default)]
pub struct RunLogs {
    logs: Mutex<HashMap<(String, String), Arc<RunLog>>>,
    /// Tests set this to leave deferred directories to the events alone (no timer).
    #[cfg(test)]
    pub(crate) no_timer: std::sync::atomic::AtomicBool,
}

#[derive(Debug)]
struct RunLog {
    state: tokio::sync::Mutex<LogState>,
    queue: Mutex<VecDeque<Batch>>,
    live: broadcast::Sender<Arc<StoredEvent>>,
    /// Directories of deferred Puts, fsync'd before the next events are written.
    pending: PendingDirs,
    /// Deferred Puts still being published; the next events wait for them.
    publishing: Publishing,
    /// The run's writer epoch (the one both fenced Puts and fenced batches are checked
    /// against), and how many fenced Puts are past the check.
    fence: Mutex<Fence>,
    /// Signalled when the last fenced Put past the check is done.
    fence_done: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Fence {
    /// None until read from the run's epoch file.
    epoch: Option<u64>,
    in_flight: u64,
}

/// A fenced Put that passed its check; ClaimRun waits until it is dropped (published or not).
#[derive(Debug)]
pub struct FenceTicket {
    log: Arc<RunLog>,
}

impl RunLog {
    /// The run's writer epoch, read from its file on first use (blocking).
    fn current_epoch(&self, store: &State, project: &str, run: &str) -> Result<u64> {
        let mut fence = self.fence.lock().unwrap_or_else(|p| p.into_inner());
        fence.loaded(store, project, run)
    }
}

impl Fence {
    fn loaded(&mut self, store: &State, project: &str, run: &str) -> Result<u64> {
        if self.epoch.is_none() {
            self.epoch = Some(epoch_of(store, project, run)?);
        }
        Ok(self.epoch.unwrap_or(0))
    }
}

impl Drop for FenceTicket {
    fn drop(&mut self) {
        let mut fence = self.log.fence.lock().unwrap_or_else(|p| p.into_inner());
        fence.in_flight -= 1;
        if fence.in_flight == 0 {
            self.log.fence_done.notify_waiters();
        }
    }
}

/// A background publication of one of a run's files; the run's next events wait until it is
/// finished (dropping it unfinished counts as lost).
#[derive(Debug)]
pub struct Publication {
    log: Arc<RunLog>,
    id: u64,
    path: String,
    finished: bool,
}

impl Publication {
    pub fn finish(mut self, result: &Result<()>) {
        self.finished = true;
        let failure = result
            .as_ref()
            .err()
            .map(|e| (self.path.clone(), e.to_string()));
        self.log.publishing.finish(self.id, failure);
    }
}

impl Drop for Publication {
    fn drop(&mut self) {
        if !self.finished {
            self.log.publishing.finish(
                self.id,
                Some((self.path.clone(), "its task ended before publishing".into())),
            );
        }
    }
}

#[derive(Debug, Default)]
struct LogState {
    /// The open log (O_APPEND); None until the file exists and was recovered.
    file: Option<Arc<File>>,
    /// Bytes of complete lines in the file.
    len: u64,
    last_seq: u64,
    /// The log's seek index (O_APPEND; see `event_seek`); None when it could not be opened.
    marks: Option<Arc<File>>,
}

#[derive(Debug)]
struct Batch {
    events: Vec<NewEvent>,
    /// 0 = unfenced.
    epoch: u64,
    done: oneshot::Sender<std::result::Result<(u64, u64), Failure>>,
}

/// Why a batch was not appended.
#[derive(Debug, Clone)]
enum Failure {
    /// The kind is kept so a full disk still answers RESOURCE_EXHAUSTED.
    Io(std::io::ErrorKind, String),
    /// (sent, current) epochs of a batch from a writer that was fenced off.
    Fenced(u64, u64),
    /// (path, cause) of a publication the run lost.
    Lost(String, String),
}

impl RunLogs {
    fn log(&self, project: &str, run: &str) -> Arc<RunLog> {
        let mut logs = self.logs.lock().unwrap_or_else(|p| p.into_inner());
        if logs.len() >= OPEN_LOGS {
            // Close logs nobody is using (each holds an fd); a later touch reopens and
            // recovers them from the file.
            logs.retain(|_, log| {
                Arc::strong_count(log) > 1
                    || log.live.receiver_count() > 0
                    || !log.pending.is_empty()
                    || !log.publishing.is_idle()
                    || log.fence.lock().map_or(true, |f| f.in_flight > 0)
            });
        }
        logs.entry((project.to_owned(), run.to_owned()))
            .or_insert_with(|| {
                Arc::new(RunLog {
                    state: tokio::sync::Mutex::new(LogState::default()),
                    queue: Mutex::new(VecDeque::new()),
                    live: broadcast::channel(LIVE_CAPACITY).0,
                    pending: PendingDirs::default(),
                    publishing: Publishing::default(),
                    fence: Mutex::new(Fence::default()),
                    fence_done: tokio::sync::Notify::new(),
                })
            })
            .clone()
    }

    /// Defers the fsync of `dir` (which just received a new entry) to the run's next commit
    /// of events, or to a timer when none comes. False: the caller must fsync it now.
    pub fn defer_dir_sync(&self, project: &str, run: &str, dir: &Arc<OwnedFd>) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let log = self.log(project, run);
        match log.pending.add(dir) {
            Added::Full => false,
            Added::Joined => true,
            #[cfg(test)]
            Added::First if self.no_timer.load(std::sync::atomic::Ordering::Relaxed) => true,
            Added::First => {
                let (project, run) = (project.to_owned(), run.to_owned());
                runtime.spawn(async move {
                    tokio::time::sleep(deferred::SYNC_AFTER).await;
                    // Under the commit mutex: a commit never writes events while a directory
                    // taken from the set is still being synced here.
                    let _state = log.state.lock().await;
                    let dirs = log.pending.take();
                    if dirs.is_empty() {
                        return;
                    }
                    let synced = tokio::task::spawn_blocking(move || {
                        let result = deferred::sync(&dirs);
                        (result, dirs)
                    })
                    .await;
                    if let Ok((Err(e), dirs)) = synced {
                        tracing::error!(%project, %run, error = %e, "fsync of deferred directories failed; the next events retry it");
                        log.pending.restore(dirs);
                    }
                });
                true
            }
        }
    }

    /// fsyncs `dir` now (blocking): what a Put does when [`RunLogs::defer_dir_sync`] says
    /// it could not defer it.
    pub fn sync_dir_now(&self, dir: &OwnedFd) -> std::result::Result<(), Errno> {
        deferred::sync_now(dir)
    }

    /// Registers a publication of `path` that finishes after its Put replied.
    pub fn start_publication(&self, project: &str, run: &str, path: &str) -> Publication {
        let log = self.log(project, run);
        let id = log.publishing.start();
        Publication {
            log,
            id,
            path: path.to_owned(),
            finished: false,
        }
    }

    /// A fenced Put of `run` checks its epoch (blocking: may read the epoch file); the ticket
    /// keeps a ClaimRun of the run waiting until the Put is done.
    pub fn enter_fence(
        &self,
        store: &State,
        project: &str,
        run: &str,
        epoch: u64,
    ) -> Result<FenceTicket> {
        check_id("run", run)?;
        let log = self.log(project, run);
        // Under the lock a claim moves the epoch with: checked before it, or refused.
        let mut fence = log.fence.lock().unwrap_or_else(|p| p.into_inner());
        let current = fence.loaded(store, project, run)?;
        if current != epoch {
            return Err(Error::Fenced {
                run: run.to_owned(),
                sent: epoch,
                current,
            });
        }
        fence.in_flight += 1;
        drop(fence);
        Ok(FenceTicket { log })
    }

    /// Directories still waiting for their deferred fsync in a run.
    #[cfg(test)]
    pub fn pending_dirs(&self, project: &str, run: &str) -> usize {
        self.log(project, run).pending.len()
    }

    /// Appends `events` contiguously; returns (first_seq, last_seq) once they are durable.
    pub async fn append(
        &self,
        store: &Arc<State>,
        project: &str,
        run: &str,
        events: Vec<NewEvent>,
    ) -> Result<(u64, u64)> {
        self.append_fenced(store, project, run, events, 0, &[])
            .await
    }

    /// [`RunLogs::append`] for a fenced writer: refused (`fenced`) unless `epoch` is 0 or
    /// the run's current epoch when the batch is committed. `publications` are the tokens of
    /// the deferred Puts the events stand on: each must be this boot's, for this run
    /// (`publication_unproven` otherwise), and the commit makes them durable first.
    pub async fn append_fenced(
        &self,
        store: &Arc<State>,
        project: &str,
        run: &str,
        events: Vec<NewEvent>,
        epoch: u64,
        publications: &[String],
    ) -> Result<(u64, u64)> {
        check_id("project", project)?;
        check_id("run", run)?;
        // Durable before named: a token this boot cannot vouch for may stand for a file that
        // never landed, so none of the events is committed.
        for token in publications {
            if let Err(why) = store.boot.verify(project, run, token) {
                return Err(Error::PublicationUnproven {
                    run: run.to_owned(),
                    token: token.chars().take(80).collect(),
                    why: why.describe(),
                });
            }
        }
        if events.is_empty() {
            return Err(Error::BadRequest(
                "no events to append; send at least one".into(),
            ));
        }
        let max = store.config.max_event_bytes;
        for event in &events {
            let size = event
                .render(u64::MAX, "2026-01-01T00:00:00.000Z", run)
                .len();
            if size > max {
                return Err(Error::TooLarge {
                    what: format!("event {:?} ({size} bytes as a line)", event.kind),
                    limit: max as u64,
                });
            }
        }
        let log = self.log(project, run);
        if let Some((path, cause)) = log.publishing.lost() {
            return Err(lost(run, path, cause));
        }
        {
            let mut state = log.state.lock().await;
            load(store, &mut state, project, run, true).await?;
        }
        if epoch != 0 {
            // The commit compares against it.
            current_epoch(store, &log, project, run).await?;
        }
        let (done, receipt) = oneshot::channel();
        log.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(Batch {
                events,
                epoch,
                done,
            });
        // The commit runs in a task of its own: once queued, a batch is committed promptly even
        // if this call is cancelled (its client gone), never later inside someone else's
        // commit. Whoever gets the mutex first commits everything queued (group commit).
        let run = run.to_owned();
        let committer = run.clone();
        tokio::spawn(async move {
            let run = committer;
            let mut state = log.state.lock().await;
            let batches: Vec<Batch> = log
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .drain(..)
                .collect();
            if !batches.is_empty() {
                commit(&log, &mut state, &run, batches).await;
            }
        });
        match receipt.await {
            Ok(Ok(range)) => Ok(range),
            Ok(Err(Failure::Io(kind, e))) => {
                Err(Error::io("appending events", std::io::Error::new(kind, e)))
            }
            Ok(Err(Failure::Lost(path, cause))) => Err(lost(&run, path, cause)),
            Ok(Err(Failure::Fenced(sent, current))) => Err(Error::Fenced { run, sent, current }),
            Err(_) => Err(Error::Unavailable),
        }
    }

    /// ClaimRun: bumps the run's writer epoch (durably, before the reply) and returns it with
    /// the log's last seq. Batches committed from now on with an older epoch are refused.
    pub async fn claim(
        &self,
        store: &Arc<State>,
        project: &str,
        run: &str,
        holder: &str,
    ) -> Result<(u64, u64)> {
        check_id("project", project)?;
        check_id("run", run)?;
        let log = self.log(project, run);
        // Held to the end: no batch is committed while the epoch moves.
        let mut state = log.state.lock().await;
        load(store, &mut state, project, run, true).await?;
        let epoch = current_epoch(store, &log, project, run)
            .await?
            .checked_add(1)
            .ok_or_else(|| Error::NotAFile {
                path: epoch_path(run),
                found: "the run's writer epoch is at its maximum; remove the file (claims start again at 1)",
            })?;
        // Fenced Puts checked from now on are refused; those already past the check finish
        // first, so none of them lands after the reply.
        let before = {
            let mut fence = log.fence.lock().unwrap_or_else(|p| p.into_inner());
            fence.epoch.replace(epoch)
        };
        loop {
            let done = log.fence_done.notified();
            if log.fence.lock().map_or(true, |f| f.in_flight == 0) {
                break;
            }
            done.await;
        }
        let (store2, project2, path) = (store.clone(), project.to_owned(), epoch_path(run));
        let written = blocking(move || {
            let root = store2.layout.project_root(&project2)?;
            let body = [Bytes::from(format!("{epoch}\n"))];
            files::write_bytes(&store2, root.as_fd(), &project2, &path, &body, true)
        })
        .await;
        if let Err(e) = written {
            log.fence.lock().unwrap_or_else(|p| p.into_inner()).epoch = before;
            return Err(e);
        }
        tracing::info!(
            project,
            run,
            epoch,
            holder,
            last_seq = state.last_seq,
            "run claimed"
        );
        Ok((epoch, state.last_seq))
    }

    /// Runs `work` (blocking) while none of the run's events is committed, then closes the
    /// run's log: its next use opens it from the disk again.
    pub async fn quiesced<T, F>(&self, project: &str, run: &str, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        let log = self.log(project, run);
        let mut state = log.state.lock().await;
        let done = blocking(work).await;
        *state = LogState::default();
        done
    }

    /// Streams a run's events from `from_seq`, then (with `follow`) live ones.
    pub async fn read(
        &self,
        store: &Arc<State>,
        project: &str,
        run: &str,
        from_seq: u64,
        follow: bool,
        limit: u64,
    ) -> Result<mpsc::Receiver<Result<StoredEvent>>> {
        check_id("project", project)?;
        check_id("run", run)?;
        let log = self.log(project, run);
        let exists = {
            let mut state = log.state.lock().await;
            load(store, &mut state, project, run, false).await?
        };
        if !exists && !follow {
            return Err(Error::RunNotFound {
                project: project.to_owned(),
                run: run.to_owned(),
            });
        }
        let (tx, rx) = mpsc::channel(256);
        let reader = Reader {
            store: store.clone(),
            log,
            project: project.to_owned(),
            run: run.to_owned(),
            next: from_seq.max(1),
            remaining: if limit == 0 { u64::MAX } else { limit },
            follow,
            tx,
        };
        tokio::spawn(reader.run());
        Ok(rx)
    }
}

/// Opens and recovers the log on first touch. Returns whether the file exists.
async fn load(
    store: &Arc<State>,
    state: &mut LogState,
    project: &str,
    run: &str,
    create: bool,
) -> Result<bool> {
    if state.file.is_some() {
        return Ok(true);
    }
    let (store2, project2, run2) = (store.clone(), project.to_owned(), run.to_owned());
    let opened = blocking(move || open_log(&store2, &project2, &run2, create)).await?;
    if let Some((file, len, last_seq, marks)) = opened {
        *state = LogState {
            file: Some(Arc::new(file)),
            len,
            last_seq,
            marks: marks.map(Arc::new),
        };
        Ok(true)
    } else {
        Ok(false)
    }
}

fn log_path(run: &str) -> String {
    format!(".cairn/runs/{run}/{EVENTS_FILE}")
}

/// An opened log: the file, its length, its last seq and its seek index.
type Opened = (File, u64, u64, Option<File>);

/// Opens (or creates) a run's log beneath the project root and recovers its last seq; opens
/// and repairs its seek index (a failure there only costs seeks: it is logged).
fn open_log(store: &State, project: &str, run: &str, create: bool) -> Result<Option<Opened>> {
    let root = store.layout.project_root(project)?;
    let dir_path = format!(".cairn/runs/{run}");
    let path = log_path(run);
    let dir = if create {
        contain::ensure_dir(root.as_fd(), &dir_path)
    } else {
        contain::open_dir(root.as_fd(), &dir_path)
    };
    let dir = match dir {
        Ok(dir) => dir,
        Err(Errno::NOENT) if !create => return Ok(None),
        Err(e) => return Err(refusal(e, project, &path, "opening the run directory of")),
    };
    // An archived run's log is read from its archive and never written again.
    if contain::stat(dir.as_fd(), ARCHIVE_FILE).is_ok() {
        return match create {
            true => Err(Error::Archived {
                run: run.to_owned(),
            }),
            false => Ok(None),
        };
    }
    let mut flags = OFlags::RDWR | OFlags::APPEND | OFlags::NONBLOCK;
    if create {
        flags |= OFlags::CREATE;
    }
    let fd = match contain::open(dir.as_fd(), EVENTS_FILE, flags, contain::FILE_MODE) {
        Ok(fd) => fd,
        Err(Errno::NOENT) if !create => return Ok(None),
        Err(e) => return Err(refusal(e, project, &path, "opening")),
    };
    let file = File::from(fd);
    let st = rustix::fs::fstat(&file).map_err(|e| Error::io(format!("stat of {path:?}"), e))?;
    if contain::kind(&st) != FileType::RegularFile {
        return Err(Error::NotAFile {
            path,
            found: "the run's event log is not a regular file; remove it",
        });
    }
    // A hard link would make appends land in a file elsewhere.
    if st.st_nlink != 1 {
        return Err(Error::NotAFile { path, found: "the run's event log has other hard links; the store appends only to its own file: remove it" });
    }
    if create {
        contain::sync_dir(dir.as_fd())
            .map_err(|e| Error::io(format!("fsync of the directory of {path:?}"), e))?;
    }
    let (len, last_seq) = recover(&file)
        .map_err(|e| Error::io(format!("recovering {path:?} of project {project:?}"), e))?;
    let marks = open_marks(dir.as_fd(), &file, len, last_seq);
    if let Err(e) = &marks {
        tracing::warn!(%project, %run, error = %e, "the event log's seek index is unusable; reads scan the log");
    }
    Ok(Some((file, len, last_seq, marks.ok())))
}

/// Opens (creating) a log's seek index in the run directory `dir` and brings it in line.
fn open_marks(dir: BorrowedFd<'_>, log: &File, len: u64, last_seq: u64) -> std::io::Result<File> {
    let flags = OFlags::RDWR | OFlags::APPEND | OFlags::CREATE | OFlags::NONBLOCK;
    let fd = contain::open(dir, EVENTS_INDEX_FILE, flags, contain::FILE_MODE)?;
    let st = rustix::fs::fstat(&fd)?;
    if contain::kind(&st) != FileType::RegularFile || st.st_nlink != 1 {
        return Err(std::io::Error::other(
            "events.idx is not a regular file of its own; remove it",
        ));
    }
    let index = File::from(fd);
    let added = event_seek::repair(&index, log, len, last_seq)?;
    if added > 0 {
        tracing::debug!(added, "event log seek index caught up");
    }
    Ok(index)
}

fn epoch_path(run: &str) -> String {
    format!(".cairn/runs/{run}/{EPOCH_FILE}")
}

/// [`RunLog::current_epoch`] from async code.
async fn current_epoch(
    store: &Arc<State>,
    log: &Arc<RunLog>,
    project: &str,
    run: &str,
) -> Result<u64> {
    let (store, log, project, run) = (
        store.clone(),
        log.clone(),
        project.to_owned(),
        run.to_owned(),
    );
    blocking(move || log.current_epoch(&store, &project, &run)).await
}

/// The run's writer epoch read from its file beneath the project (0 when never claimed).
fn epoch_of(store: &State, project: &str, run: &str) -> Result<u64> {
    let root = store.layout.project_root(project)?;
    let path = epoch_path(run);
    let opened = contain::open(root.as_fd(), &path, OFlags::RDONLY | OFlags::NONBLOCK, 0);
    let fd = match opened {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(0),
        Err(e) => return Err(refusal(e, project, &path, "opening")),
    };
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(File::from(fd), 64), &mut text)
        .map_err(|e| Error::io(format!("reading {path:?}"), e))?;
    text.trim().parse().map_err(|_| Error::NotAFile {
        path,
        found: "the run's writer epoch is not a number; remove the file (the next ClaimRun writes it anew)",
    })
}

/// Finds the last seq; cuts off a torn last line (a crash mid-append).
fn recover(file: &File) -> std::io::Result<(u64, u64)> {
    let mut len = file.metadata()?.len();
    if len == 0 {
        return Ok((0, 0));
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1)?;
    if last[0] != b'\n' {
        let keep = last_newline_before(file, len)?.map_or(0, |p| p + 1);
        tracing::warn!(
            cut_bytes = len - keep,
            "event log ended with a torn line; cutting it off"
        );
        file.set_len(keep)?;
        file.sync_data()?;
        len = keep;
    }
    if len == 0 {
        return Ok((0, 0));
    }
    let start = last_newline_before(file, len - 1)?.map_or(0, |p| p + 1);
    if len - 1 - start > MAX_TAIL_LINE {
        return Err(std::io::Error::other(
            "the last event line is implausibly long; repair the file",
        ));
    }
    let mut line = vec![0u8; (len - 1 - start) as usize];
    file.read_exact_at(&mut line, start)?;
    let seq = std::str::from_utf8(&line)
        .ok()
        .and_then(StoredEvent::parse)
        .map(|e| e.seq)
        .ok_or_else(|| {
            std::io::Error::other(
                "the last event line is not a JSON event with a seq; repair the file",
            )
        })?;
    Ok((len, seq))
}

/// Position of the last '\n' strictly before `end`.
fn last_newline_before(file: &File, end: u64) -> std::io::Result<Option<u64>> {
    let mut buf = vec![0u8; 64 << 10];
    let mut hi = end;
    while hi > 0 {
        let lo = hi.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(hi - lo) as usize];
        file.read_exact_at(chunk, lo)?;
        if let Some(i) = memchr_rev(chunk) {
            return Ok(Some(lo + i as u64));
        }
        hi = lo;
    }
    Ok(None)
}

fn memchr_rev(bytes: &[u8]) -> Option<usize> {
    bytes.iter().rposition(|b| *b == b'\n')
}

fn lost(run: &str, path: String, cause: String) -> Error {
    Error::PublicationLost {
        run: run.to_owned(),
        path,
        cause,
    }
}

/// Writes every queued batch with one write and one fsync, then answers each caller and
/// publishes the events to live readers. Files acknowledged to the run before are published
/// and their directories fsync'd first.
async fn commit(log: &RunLog, state: &mut LogState, run: &str, batches: Vec<Batch>) {
    let refuse = |batches: Vec<Batch>, failure: Failure| {
        for batch in batches {
            let _ = batch.done.send(Err(failure.clone()));
        }
    };
    let Some(file) = state.file.clone() else {
        return refuse(
            batches,
            Failure::Io(
                std::io::ErrorKind::Other,
                "the event log is not open".into(),
            ),
        );
    };
    // A fenced-off writer's batches go no further; the others are committed.
    // Loaded by every fenced append before it queued; claims change it only under `state`.
    let current = log
        .fence
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .epoch
        .unwrap_or(0);
    let (batches, fenced): (Vec<Batch>, Vec<Batch>) = batches
        .into_iter()
        .partition(|b| b.epoch == 0 || b.epoch == current);
    for batch in fenced {
        let sent = batch.epoch;
        refuse(vec![batch], Failure::Fenced(sent, current));
    }
    if batches.is_empty() {
        return;
    }
    if let Some((path, cause)) = log.publishing.settle().await {
        return refuse(batches, Failure::Lost(path, cause));
    }
    let ts = timestamp_now();
    let mut seq = state.last_seq;
    let old_len = state.len;
    let mut marks = Vec::new();
    let mut text = String::new();
    let mut ranges = Vec::with_capacity(batches.len());
    let mut stored = Vec::new();
    for batch in &batches {
        let first = seq + 1;
        for event in &batch.events {
            seq += 1;
            let line = event.render(seq, &ts, run);
            if event_seek::is_mark(seq) {
                marks.extend_from_slice(&event_seek::encode(seq, old_len + text.len() as u64));
            }
            text.push_str(&line);
            text.push('\n');
            stored.push(StoredEvent {
                seq,
                ts: ts.clone(),
                kind: event.kind.clone(),
                run_id: run.to_owned(),
                node_id: event.node_id.clone(),
                level: event.level,
                data_json: Value::Object(event.data.clone()).to_string(),
                line,
            });
        }
        ranges.push((first, seq));
    }
    let added = text.len() as u64;
    let dirs = log.pending.take();
    let index = state.marks.clone();
    let written = tokio::task::spawn_blocking(move || {
        // Files written before these events are durable before the events are.
        if let Err(e) = deferred::sync(&dirs) {
            let e = std::io::Error::new(
                e.kind(),
                format!("fsync of a directory written before these events: {e}"),
            );
            return (Err(e), dirs);
        }
        #[cfg(test)]
        deferred::probe::events_written(&*file);
        let result = (&*file).write_all(text.as_bytes()).and_then(|()| {
            let started = std::time::Instant::now();
            let synced = file.sync_data();
            cairn_telemetry::metrics::store_fsynced("events", started.elapsed());
            synced
        });
        if result.is_err() {
            // Leave no partial batch behind: its seqs will be given again.
            let _ = file.set_len(old_len);
        } else if let (Some(index), false) = (index, marks.is_empty()) {
            // After the events are durable; a record lost here is added back at the next
            // open, a wrong one is never used (see event_seek).
            if let Err(e) = (&*index).write_all(&marks) {
                tracing::warn!(error = %e, "could not extend the event log's seek index");
            }
        }
        (result, Vec::new())
    })
    .await
    .map(|(result, unsynced)| {
        log.pending.restore(unsynced);
        result
    });
    match written {
        Ok(Ok(())) => {
            state.len += added;
            state.last_seq = seq;
            for (batch, range) in batches.into_iter().zip(ranges) {
                let _ = batch.done.send(Ok(range));
            }
            for event in stored {
                let _ = log.live.send(Arc::new(event));
            }
        }
        failed => {
            let (kind, message) = match failed {
                Ok(Err(e)) => (e.kind(), e.to_string()),
                Err(e) => (std::io::ErrorKind::Other, e.to_string()),
                Ok(Ok(())) => (std::io::ErrorKind::Other, String::new()),
            };
            tracing::error!(run, error = %message, "appending events failed");
            refuse(batches, Failure::Io(kind, message));
        }
    }
}

#[path = "events_reader.rs"]
mod reader;
use reader::Reader;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn lines_have_the_fixed_fields_first_and_parse_back() {
        let mut data = Map::new();
        data.insert("path".into(), Value::from("a\"b"));
        let event = NewEvent {
            kind: "x.y".into(),
            node_id: "n1".into(),
            level: Level::Warning,
            data,
        };
        let line = event.render(7, "2026-01-01T00:00:00.000Z", "r1");
        assert!(line.starts_with(r#"{"ts":"2026-01-01T00:00:00.000Z","seq":7,"type":"x.y","run_id":"r1","node_id":"n1","level":"warning","path":"a\"b"}"#), "{line}");
        let back = StoredEvent::parse(&line).unwrap();
        assert_eq!(
            (back.seq, back.level, back.data_json.as_str()),
            (7, Level::Warning, r#"{"path":"a\"b"}"#)
        );
    }

    #[test]
    fn reserved_keys_and_non_objects_are_refused() {
        assert!(NewEvent::from_client("t", "", Level::Info, r#"{"seq":1}"#).is_err());
        assert!(NewEvent::from_client("t", "", Level::Info, "[1]").is_err());
        assert!(NewEvent::from_client("", "", Level::Info, "").is_err());
        assert!(NewEvent::from_client("t", "", Level::Info, "").is_ok());
    }

    #[test]
    fn recover_cuts_a_torn_line_and_finds_the_last_seq() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("events.jsonl");
        std::fs::write(&path, "{\"seq\":1}\n{\"seq\":2}\n{\"seq\":3,\"ty").unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(&path)
            .unwrap();
        assert_eq!(recover(&file).unwrap(), (20, 2));
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"seq\":1}\n{\"seq\":2}\n"
        );
        std::fs::write(&path, "{\"seq\":1").unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(&path)
            .unwrap();
        assert_eq!(recover(&file).unwrap(), (0, 0));
    }
}
