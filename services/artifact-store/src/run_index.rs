//! The run index: per project, a summary of every run (title, goal, state, created_at,
//! updated_at of its `state.json`) kept in memory in newest-first order, backed by a log file
//! `<data_root>/index/<project>/runs.log` so a restart need not read every state.json again.
//!
//! The log is a cache, never the truth: each line records the identity (inode, size, mtime,
//! ctime) of the state.json it summarises, and loading a project's index (at start-up, in the
//! background, or on its first use) checks every run directory against it: a run whose
//! state.json changed, appeared or vanished is read again, a run whose directory is gone is
//! dropped. A crash at any point (a line torn, not written, a state.json published but not yet
//! summarised) therefore only costs re-reads at the next load; a deleted or corrupted log is
//! rebuilt from the run directories. While the store runs, every state.json it publishes or
//! deletes is summarised again (after the publication, waiting for a deferred one) and
//! appended to the log; the log is compacted (written anew, then renamed over) when most of
//! its lines are stale.
//!
//! Line format: `<16 hex digits> <json>\n`, the digits the start of the sha256 of the JSON; a
//! line whose digits do not match is ignored (its run is re-read). The first line is
//! [`HEADER`].
//!
//! May depend on: state, layout, page, error, cairn-contain.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cairn_contain as contain;
use rustix::fs::{FileType, OFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::layout::{check_id, TEMP_PREFIX};
use crate::page::{self, Page};
use crate::state::State;

/// First line of every log; another first line means the log is rebuilt.
pub const HEADER: &str = "cairn-run-index 2";
/// The file a run's summary is read from.
pub const STATE_FILE: &str = "state.json";
const RUNS_DIR: &str = ".cairn/runs";
/// Largest state.json the index reads.
const MAX_STATE_BYTES: u64 = 64 << 20;
/// A log is compacted when it has this many more lines than runs (and twice as many).
const SLACK_LINES: usize = 1024;

/// Identity of the state.json a summary was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(st: &rustix::fs::Stat) -> Stamp {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Stamp {
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime_ns: ns(st.st_mtime, st.st_mtime_nsec as i64),
            ctime_ns: ns(st.st_ctime, st.st_ctime_nsec as i64),
        }
    }
}

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Record {
    run: String,
    /// The run is gone (its directory removed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    gone: bool,
    /// None: the run has no state.json.
    #[serde(default)]
    stamp: Option<Stamp>,
    /// None: there is no readable summary (no state.json, or not JSON with the fields).
    #[serde(default)]
    summary: Option<Fields>,
}

/// What a state.json says of its run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Fields {
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub goal: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub created_at: String,
    #[serde(default)]
    pub updated_at: String,
    /// The last event the snapshot folded in (None: not said).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events_seq: Option<u64>,
}

/// A run as a page of [`RunIndex::query`] returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub run_id: String,
    /// None: not indexed (no readable state.json).
    pub fields: Option<Fields>,
    /// With `include_state_json`: the state.json read for this page.
    pub state_json: Option<Vec<u8>>,
}

/// Which runs a query returns.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub states: Vec<String>,
    /// Lower-cased.
    pub text: String,
    pub created_after: Option<time::OffsetDateTime>,
    pub created_before: Option<time::OffsetDateTime>,
    pub exclude: HashSet<String>,
    /// Only runs that may not be final: no readable state.json, a state that is not final,
    /// or events appended after the ones state.json folded in (a finished run taken back to
    /// life whose snapshot lags). Costs a look at the tail of each final run's event log.
    pub unfinished: bool,
}

impl Filter {
    /// The text to find, ready to search (None: no text filter).
    fn finder(&self) -> Option<memchr::memmem::Finder<'_>> {
        (!self.text.is_empty()).then(|| memchr::memmem::Finder::new(self.text.as_bytes()))
    }

    fn admits(&self, e: &Entry, finder: Option<&memchr::memmem::Finder<'_>>) -> bool {
        let Some(f) = &e.fields else {
            // Nothing is known to filter on: the caller decides.
            return true;
        };
        if !self.states.is_empty() && !self.states.contains(&f.state) {
            return false;
        }
        if let Some(finder) = finder {
            // `hay` joins the fields with NUL: a text with a NUL is looked for field by field.
            let found = if self.text.contains('\0') {
                e.hay.split('\0').any(|f| f.contains(&self.text))
            } else {
                finder.find(e.hay.as_bytes()).is_some()
            };
            if !found {
                return false;
            }
        }
        if self.created_after.is_none() && self.created_before.is_none() {
            return true;
        }
        let Some(created) = e.created else {
            return false;
        };
        self.created_after.is_none_or(|t| created >= t)
            && self.created_before.is_none_or(|t| created < t)
    }
}

#[derive(Debug, Clone)]
struct Entry {
    stamp: Option<Stamp>,
    fields: Option<Fields>,
    /// Lower-cased title, goal and run id, joined by NUL (one search per run).
    hay: String,
    created: Option<time::OffsetDateTime>,
}

impl Entry {
    fn new(run: &str, stamp: Option<Stamp>, fields: Option<Fields>) -> Entry {
        let (hay, created) = match &fields {
            Some(f) => (
                format!(
                    "{}\0{}\0{}",
                    f.title.to_lowercase(),
                    f.goal.to_lowercase(),
                    run.to_lowercase()
                ),
                time::OffsetDateTime::parse(
                    &f.created_at,
                    &time::format_description::well_known::Rfc3339,
                )
                .ok(),
            ),
            None => (Default::default(), None),
        };
        Entry {
            stamp,
            fields,
            hay,
            created,
        }
    }

    fn key(&self, run: &str) -> (String, String) {
        let created = self
            .fields
            .as_ref()
            .map(|f| f.created_at.clone())
            .unwrap_or_default();
        (created, run.to_owned())
    }
}

/// One project's index, loaded.
#[derive(Debug, Default)]
struct Loaded {
    /// (created_at, run id) → the run, ascending; queries walk it backwards.
    order: BTreeMap<(String, String), Entry>,
    /// Run id → its created_at (its place in `order`).
    places: HashMap<String, String>,
    log: Option<File>,
    lines: usize,
}

impl Loaded {
    fn put(&mut self, run: &str, entry: Entry) {
        self.remove(run);
        let key = entry.key(run);
        self.places.insert(run.to_owned(), key.0.clone());
        self.order.insert(key, entry);
    }

    fn remove(&mut self, run: &str) {
        if let Some(created) = self.places.remove(run) {
            self.order.remove(&(created, run.to_owned()));
        }
    }

    fn get(&self, run: &str) -> Option<&Entry> {
        let created = self.places.get(run)?;
        self.order.get(&(created.clone(), run.to_owned()))
    }

    fn len(&self) -> usize {
        self.places.len()
    }

    fn record(&self, run: &str) -> Record {
        match self.get(run) {
            Some(e) => Record {
                run: run.to_owned(),
                gone: false,
                stamp: e.stamp,
                summary: e.fields.clone(),
            },
            None => Record {
                run: run.to_owned(),
                gone: true,
                stamp: None,
                summary: None,
            },
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    loaded: Option<Loaded>,
}

/// The run indexes of every project touched since start-up.
#[derive(Debug)]
pub struct RunIndex {
    /// `<data_root>/index`.
    dir: PathBuf,
    projects: Mutex<HashMap<String, Arc<Mutex<Slot>>>>,
    /// The runs of each loaded project: a write to a run not among them makes the index look
    /// at it (a project not loaded is looked at whole when it is).
    known: Mutex<HashMap<String, HashSet<String>>>,
    /// Projects whose index is being loaded now.
    loading: Mutex<HashSet<String>>,
}

/// One log line for `record`.
pub fn line(record: &impl Serialize) -> String {
    let json = serde_json::to_string(record).unwrap_or_default();
    format!("{} {json}\n", check_digits(&json))
}

fn check_digits(json: &str) -> String {
    hex::encode(&cairn_sha256::sha256(json.as_bytes())[..8])
}

/// A log's records by run, its line count and how many lines were bad.
type LogContents = (HashMap<String, Record>, usize, usize);

/// Reads a log: the records of its good lines (last one of each run wins) and how many lines
/// it has; None when it is missing or its header is not [`HEADER`].
fn read_log(path: &Path) -> std::io::Result<Option<LogContents>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    if first.trim_end_matches('\n') != HEADER {
        return Ok(None);
    }
    let mut records = HashMap::new();
    let (mut lines, mut bad) = (0, 0);
    let mut text = String::new();
    loop {
        text.clear();
        if reader.read_line(&mut text)? == 0 {
            break;
        }
        lines += 1;
        match parse_line(&text) {
            Some(r) => {
                records.insert(r.run.clone(), r);
            }
            None => bad += 1,
        }
    }
    Ok(Some((records, lines, bad)))
}

/// A complete, intact line; None for a torn or damaged one.
fn parse_line(text: &str) -> Option<Record> {
    let text = text.strip_suffix('\n')?;
    let (digits, json) = text.split_once(' ')?;
    if digits != check_digits(json) {
        return None;
    }
    let r: Record = serde_json::from_str(json).ok()?;
    check_id("run", &r.run).ok()?;
    Some(r)
}

/// Reads a run's state.json beneath `runs` (the project's `.cairn/runs`): its stamp and bytes,
/// or None when there is none.
fn read_state(runs: &impl AsFd, run: &str) -> std::io::Result<Option<(Stamp, Vec<u8>)>> {
    let path = format!("{run}/{STATE_FILE}");
    let fd = match contain::open(runs.as_fd(), &path, OFlags::RDONLY | OFlags::NONBLOCK, 0) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::XDEV) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&fd)?;
    if contain::kind(&st) != FileType::RegularFile {
        return Ok(None);
    }
    let mut bytes = Vec::with_capacity(st.st_size as usize);
    File::from(fd)
        .take(MAX_STATE_BYTES)
        .read_to_end(&mut bytes)?;
    Ok(Some((Stamp::of(&st), bytes)))
}

/// States after which a run does nothing more unless someone takes it back to life.
pub(crate) const FINAL_STATES: [&str; 3] = ["completed", "failed", "canceled"];
/// The most of an event log's end read to find its last line.
const TAIL_BYTES: u64 = 64 << 10;

/// Whether a run may still have work: anything but a final snapshot that folded in the last
/// event of its log. Doubt (a log that cannot be read, a torn last line) says yes: the caller
/// checks the run's events itself.
fn may_be_unfinished(runs: Option<&std::os::fd::OwnedFd>, run: &str, e: &Entry) -> bool {
    let Some(f) = &e.fields else { return true };
    if !FINAL_STATES.contains(&f.state.as_str()) {
        return true;
    }
    let (Some(runs), Some(folded)) = (runs, f.events_seq) else {
        return true;
    };
    match last_event_seq(runs, run) {
        Ok(Some(last)) => last > folded,
        Ok(None) => false,
        Err(_) => true,
    }
}

/// The seq of the last whole line of a run's event log; None without a log. Err when the log
/// cannot be read or its end is not a whole event line (an append in flight, a torn line).
pub(crate) fn last_event_seq(runs: &impl AsFd, run: &str) -> std::io::Result<Option<u64>> {
    use std::os::unix::fs::FileExt;
    let path = format!("{run}/events.jsonl");
    let fd = match contain::open(runs.as_fd(), &path, OFlags::RDONLY | OFlags::NONBLOCK, 0) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let file = File::from(fd);
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(None);
    }
    let start = len.saturating_sub(TAIL_BYTES);
    let mut tail = vec![0u8; (len - start) as usize];
    file.read_exact_at(&mut tail, start)?;
    let bad = || std::io::Error::other("the event log does not end with a whole event line");
    let body = tail.strip_suffix(b"\n").ok_or_else(bad)?;
    let line = match memchr::memrchr(b'\n', body) {
        Some(i) => &body[i + 1..],
        None if start == 0 => body,
        None => return Err(bad()),
    };
    serde_json::from_slice::<serde_json::Value>(line)
        .ok()
        .and_then(|v| v.get("seq").and_then(serde_json::Value::as_u64))
        .map(Some)
        .ok_or_else(bad)
}

/// The summary fields of a state.json; None when it does not parse.
pub fn fields_of(bytes: &[u8]) -> Option<Fields> {
    serde_json::from_slice::<Fields>(bytes).ok()
}

/// Stamp of a run's state.json without reading it.
fn stamp_of(runs: &impl AsFd, run: &str) -> std::io::Result<Option<Stamp>> {
    let path = format!("{run}/{STATE_FILE}");
    let fd = match contain::open(runs.as_fd(), &path, OFlags::PATH | OFlags::NOFOLLOW, 0) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::XDEV) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&fd)?;
    if contain::kind(&st) != FileType::RegularFile {
        return Ok(None);
    }
    Ok(Some(Stamp::of(&st)))
}

/// The project's `.cairn/runs` directory; None when it has none yet.
fn runs_dir(state: &State, project: &str) -> Result<Option<std::os::fd::OwnedFd>> {
    let root = state.layout.project_root(project)?;
    match contain::open_dir(root.as_fd(), RUNS_DIR) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(crate::error::refusal(e, project, RUNS_DIR, "opening")),
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

/// What a load found, for logs and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    pub runs: usize,
    /// Runs read again from their state.json (changed, new, or not in the log).
    pub reread: usize,
    /// Runs in the log whose directory is gone.
    pub dropped: usize,
    /// Log lines that were torn or damaged.
    pub bad_lines: usize,
    /// The log was missing or not a run index log.
    pub rebuilt: bool,
}

impl RunIndex {
    pub fn new(data_root: &Path) -> RunIndex {
        RunIndex {
            dir: data_root.join("index"),
            projects: Mutex::default(),
            known: Mutex::default(),
            loading: Mutex::default(),
        }
    }

    fn slot(&self, project: &str) -> Arc<Mutex<Slot>> {
        let mut projects = self.projects.lock().unwrap_or_else(|p| p.into_inner());
        projects.entry(project.to_owned()).or_default().clone()
    }

    fn log_path(&self, project: &str) -> PathBuf {
        self.dir.join(project).join("runs.log")
    }

    /// Whether a write to `run` needs the index to look at it (blocking work: see
    /// [`RunIndex::refresh`]). Cheap: called on every write to a run.
    pub fn unknown(&self, project: &str, run: &str) -> bool {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known.get(project).is_some_and(|runs| !runs.contains(run))
    }

    /// Drops a project's loaded index: the next use loads it again from the run directories.
    pub fn forget(&self, project: &str) {
        self.slot(project)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .loaded = None;
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(project);
    }

    /// Loads a project's index if it is not loaded yet (blocking): reads its log and checks it
    /// against the run directories (see the module header).
    pub fn ensure_loaded(&self, state: &State, project: &str) -> Result<Option<Checked>> {
        let slot = self.slot(project);
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if slot.loaded.is_some() {
            return Ok(None);
        }
        // Writes during the load look at their run after it.
        self.loading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(project.to_owned());
        let loaded = self.load_known(state, project);
        self.loading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(project);
        let (loaded, checked) = loaded?;
        slot.loaded = Some(loaded);
        Ok(Some(checked))
    }

    /// Whether a project's index is being loaded now (a write then does not wait for it).
    pub fn loading(&self, project: &str) -> bool {
        self.loading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(project)
    }

    /// [`RunIndex::load`], with the project's runs made known to [`RunIndex::unknown`].
    fn load_known(&self, state: &State, project: &str) -> Result<(Loaded, Checked)> {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(project.to_owned(), HashSet::new());
        let (loaded, checked) = match self.load(state, project) {
            Ok(done) => done,
            Err(e) => {
                self.known
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(project);
                return Err(e);
            }
        };
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(project.to_owned(), loaded.places.keys().cloned().collect());
        Ok((loaded, checked))
    }

    fn load(&self, state: &State, project: &str) -> Result<(Loaded, Checked)> {
        let path = self.log_path(project);
        let read = read_log(&path).map_err(io(format!("reading {}", path.display())))?;
        let mut checked = Checked::default();
        let (mut records, lines) = match read {
            Some((records, lines, bad)) => {
                checked.bad_lines = bad;
                (records, lines)
            }
            None => {
                checked.rebuilt = true;
                (HashMap::new(), 0)
            }
        };
        let mut loaded = Loaded::default();
        if let Some(runs) = runs_dir(state, project)? {
            let names = contain::read_dir(runs.as_fd())
                .map_err(|e| Error::io(format!("listing {RUNS_DIR} of {project:?}"), e))?;
            for (run, kind) in names {
                if check_id("run", &run).is_err() || run.starts_with(TEMP_PREFIX) {
                    continue;
                }
                if kind != FileType::Directory && kind != FileType::Unknown {
                    continue;
                }
                let logged = records.remove(&run).filter(|r| !r.gone);
                let stamp = stamp_of(&runs, &run)
                    .map_err(io(format!("stat of {RUNS_DIR}/{run}/{STATE_FILE}")))?;
                let entry = match logged {
                    Some(r) if r.stamp == stamp => Entry::new(&run, r.stamp, r.summary),
                    _ => {
                        checked.reread += 1;
                        self.summarise(&runs, &run)?
                    }
                };
                loaded.put(&run, entry);
            }
        }
        checked.dropped = records.values().filter(|r| !r.gone).count();
        checked.runs = loaded.len();
        let stale = lines.saturating_sub(loaded.len());
        let rewrite = checked.rebuilt
            || checked.reread > 0
            || checked.dropped > 0
            || checked.bad_lines > 0
            || stale > loaded.len() + SLACK_LINES;
        if rewrite {
            self.compact(project, &mut loaded)?;
        } else {
            let file = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io(format!("opening {}", path.display())))?;
            loaded.log = Some(file);
            loaded.lines = lines;
        }
        if checked.rebuilt || checked.reread > 0 || checked.dropped > 0 || checked.bad_lines > 0 {
            tracing::info!(
                project,
                runs = checked.runs,
                reread = checked.reread,
                dropped = checked.dropped,
                bad_lines = checked.bad_lines,
                rebuilt = checked.rebuilt,
                "run index checked against the run directories"
            );
        }
        Ok((loaded, checked))
    }

    /// A run's entry as its state.json says now.
    fn summarise(&self, runs: &impl AsFd, run: &str) -> Result<Entry> {
        let read =
            read_state(runs, run).map_err(io(format!("reading {RUNS_DIR}/{run}/{STATE_FILE}")))?;
        Ok(match read {
            Some((stamp, bytes)) => Entry::new(run, Some(stamp), fields_of(&bytes)),
            None => Entry::new(run, None, None),
        })
    }

    /// Writes the whole log anew (temp file, fsync, rename, fsync of the directory).
    fn compact(&self, project: &str, loaded: &mut Loaded) -> Result<()> {
        let dir = self.dir.join(project);
        std::os::unix::fs::DirBuilderExt::mode(
            std::fs::DirBuilder::new().recursive(true),
            contain::DIR_MODE,
        )
        .create(&dir)
        .map_err(io(format!("creating {}", dir.display())))?;
        let temp = dir.join(format!("{TEMP_PREFIX}runs.log"));
        let path = dir.join("runs.log");
        let write = || -> std::io::Result<File> {
            let file = std::os::unix::fs::OpenOptionsExt::mode(
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true),
                contain::FILE_MODE,
            )
            .open(&temp)?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            out.write_all(HEADER.as_bytes())?;
            out.write_all(b"\n")?;
            let mut runs: Vec<&String> = loaded.places.keys().collect();
            runs.sort();
            for run in runs {
                out.write_all(line(&loaded.record(run)).as_bytes())?;
            }
            let file = out.into_inner().map_err(|e| e.into_error())?;
            file.sync_data()?;
            std::fs::rename(&temp, &path)?;
            File::open(&dir)?.sync_all()?;
            std::fs::OpenOptions::new().append(true).open(&path)
        };
        let file = write().map_err(io(format!("writing {}", path.display())))?;
        loaded.log = Some(file);
        loaded.lines = loaded.len();
        Ok(())
    }

    /// Looks at one run again after a write to it (blocking): its state.json is summarised
    /// anew when it changed (waiting for a publication of it in flight), and logged. Does
    /// nothing for a project not loaded yet (its load will look).
    pub fn refresh(&self, state: &State, project: &str, run: &str) -> Result<()> {
        let slot = self.slot(project);
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        let Some(loaded) = slot.loaded.as_mut() else {
            return Ok(());
        };
        // A deferred publication of the file holds its slot until it is linked.
        drop(
            state
                .slots
                .claim_blocking(project, &format!("{RUNS_DIR}/{run}/{STATE_FILE}")),
        );
        let Some(runs) = runs_dir(state, project)? else {
            return Ok(());
        };
        let exists = match contain::stat(runs.as_fd(), run) {
            Ok(st) => contain::kind(&st) == FileType::Directory,
            Err(Errno::NOENT) => false,
            Err(e) => return Err(Error::io(format!("stat of {RUNS_DIR}/{run}"), e)),
        };
        if !exists {
            if loaded.places.contains_key(run) {
                loaded.remove(run);
                self.append(project, loaded, run)?;
            }
            return Ok(());
        }
        let stamp =
            stamp_of(&runs, run).map_err(io(format!("stat of {RUNS_DIR}/{run}/{STATE_FILE}")))?;
        if let Some(e) = loaded.get(run) {
            if e.stamp == stamp {
                return Ok(());
            }
        }
        let entry = self.summarise(&runs, run)?;
        loaded.put(run, entry);
        if let Some(runs) = self
            .known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(project)
        {
            runs.insert(run.to_owned());
        }
        self.append(project, loaded, run)
    }

    /// Logs a run's current record; compacts when most lines are stale.
    fn append(&self, project: &str, loaded: &mut Loaded, run: &str) -> Result<()> {
        if loaded.lines > 2 * loaded.len() + SLACK_LINES {
            return self.compact(project, loaded);
        }
        let text = line(&loaded.record(run));
        let path = self.log_path(project);
        match loaded.log.as_mut() {
            // One write of a whole line: a crash leaves it whole or torn, never interleaved.
            Some(file) => file
                .write_all(text.as_bytes())
                .map_err(io(format!("appending to {}", path.display())))?,
            None => return self.compact(project, loaded),
        }
        loaded.lines += 1;
        Ok(())
    }

    /// How many runs match `filter`: one pass over the project's index, nothing copied (loads
    /// the index on first use; blocking).
    pub fn count(&self, state: &State, project: &str, filter: &Filter) -> Result<u64> {
        self.ensure_loaded(state, project)?;
        let runs_fd = if filter.unfinished {
            runs_dir(state, project)?
        } else {
            None
        };
        let slot = self.slot(project);
        let slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        let Some(loaded) = slot.loaded.as_ref() else {
            return Ok(0);
        };
        let finder = filter.finder();
        let n = loaded
            .order
            .iter()
            .filter(|(key, entry)| {
                !filter.exclude.contains(&key.1)
                    && filter.admits(entry, finder.as_ref())
                    && (!filter.unfinished || may_be_unfinished(runs_fd.as_ref(), &key.1, entry))
            })
            .count();
        Ok(n as u64)
    }

    /// One page of a project's runs, newest first (loads the index on first use; blocking).
    pub fn query(
        &self,
        state: &State,
        project: &str,
        filter: &Filter,
        page: &Page,
        include_state_json: bool,
    ) -> Result<(Vec<Summary>, String)> {
        self.ensure_loaded(state, project)?;
        let after = match &page.after {
            None => None,
            Some(key) => Some(
                key.rsplit_once('\n')
                    .map(|(c, r)| (c.to_owned(), r.to_owned()))
                    .ok_or_else(|| {
                        Error::BadRequest(
                            "page_token was not issued by ListRunSummaries; start again with an empty token".into(),
                        )
                    })?,
            ),
        };
        let mut out = Vec::new();
        let mut next = String::new();
        let runs_fd = if filter.unfinished {
            runs_dir(state, project)?
        } else {
            None
        };
        {
            let slot = self.slot(project);
            let slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            let Some(loaded) = slot.loaded.as_ref() else {
                return Ok((Vec::new(), String::new()));
            };
            let runs: Box<dyn Iterator<Item = (&(String, String), &Entry)>> = match &after {
                Some(after) => Box::new(loaded.order.range(..after.clone()).rev()),
                None => Box::new(loaded.order.iter().rev()),
            };
            let finder = filter.finder();
            for (key, entry) in runs {
                if filter.exclude.contains(&key.1) || !filter.admits(entry, finder.as_ref()) {
                    continue;
                }
                if filter.unfinished && !may_be_unfinished(runs_fd.as_ref(), &key.1, entry) {
                    continue;
                }
                if out.len() == page.size {
                    if let Some(last) = out.last() {
                        next = page::token(&cursor(loaded, last));
                    }
                    break;
                }
                out.push(Summary {
                    run_id: key.1.clone(),
                    fields: entry.fields.clone(),
                    state_json: None,
                });
            }
        }
        if include_state_json {
            if let Some(runs) = runs_dir(state, project)? {
                for s in &mut out {
                    let read = read_state(&runs, &s.run_id)
                        .map_err(io(format!("reading {RUNS_DIR}/{}/{STATE_FILE}", s.run_id)))?;
                    s.state_json = read.map(|(_, bytes)| bytes);
                }
            }
        }
        Ok((out, next))
    }

    /// Every project under the data root (for the start-up load).
    pub fn project_ids(state: &State) -> Vec<String> {
        contain::read_dir(state.layout.projects.as_fd())
            .map(|names| {
                names
                    .into_iter()
                    .filter(|(n, k)| *k == FileType::Directory && check_id("project", n).is_ok())
                    .map(|(n, _)| n)
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn cursor(loaded: &Loaded, last: &Summary) -> String {
    let created = loaded
        .places
        .get(&last.run_id)
        .map(String::as_str)
        .unwrap_or_default();
    format!("{created}\n{}", last.run_id)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn record(run: &str, title: &str) -> Record {
        Record {
            run: run.into(),
            gone: false,
            stamp: Some(Stamp {
                ino: 1,
                size: 2,
                mtime_ns: 3,
                ctime_ns: 4,
            }),
            summary: Some(Fields {
                title: title.into(),
                ..Fields::default()
            }),
        }
    }

    #[test]
    fn lines_round_trip_and_damage_is_detected() {
        let r = record("r1", "a title");
        let text = line(&r);
        assert!(text.ends_with('\n'));
        assert_eq!(parse_line(&text), Some(r.clone()));
        // Torn: no newline, or cut short.
        assert_eq!(parse_line(text.trim_end_matches('\n')), None);
        assert_eq!(parse_line(&text[..text.len() / 2]), None);
        // A changed byte of the JSON no longer matches its digits.
        let damaged = text.replace("a title", "b title");
        assert_eq!(parse_line(&damaged), None);
        // A bad run id is refused even with good digits.
        assert_eq!(parse_line(&line(&record("../x", "t"))), None);
    }

    #[test]
    fn the_log_keeps_the_last_record_of_each_run_and_skips_bad_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("runs.log");
        let mut text = format!("{HEADER}\n");
        text.push_str(&line(&record("r1", "first")));
        text.push_str("0000000000000000 {\"run\":\"r9\"}\n");
        text.push_str(&line(&record("r2", "two")));
        text.push_str(&line(&record("r1", "second")));
        let torn = line(&record("r3", "three"));
        text.push_str(&torn[..torn.len() - 5]);
        std::fs::write(&path, &text).unwrap();
        let (records, lines, bad) = read_log(&path).unwrap().unwrap();
        assert_eq!((lines, bad), (5, 2));
        assert_eq!(records.len(), 2);
        assert_eq!(
            records["r1"].summary.as_ref().unwrap().title,
            "second".to_owned()
        );
        // Another header: not a log of this format.
        std::fs::write(&path, "something else\n").unwrap();
        assert!(read_log(&path).unwrap().is_none());
        assert!(read_log(&tmp.path().join("missing")).unwrap().is_none());
    }

    #[test]
    fn unfinished_means_not_final_or_events_past_the_snapshot() {
        let tmp = tempfile::tempdir().unwrap();
        let runs = tmp.path();
        let run = |id: &str, state: &str, folded: Option<u64>, log: Option<&str>| {
            std::fs::create_dir_all(runs.join(id)).unwrap();
            if let Some(log) = log {
                std::fs::write(runs.join(id).join("events.jsonl"), log).unwrap();
            }
            let fields = Fields {
                state: state.into(),
                events_seq: folded,
                ..Fields::default()
            };
            Entry::new(id, None, Some(fields))
        };
        let fd: std::os::fd::OwnedFd = File::open(runs).unwrap().into();
        let log =
            "{\"seq\":1,\"type\":\"task.created\"}\n{\"seq\":2,\"type\":\"task.completed\"}\n";
        let cases = [
            // Final, and the snapshot folded in the log's last event: nothing to do.
            ("done", run("done", "completed", Some(2), Some(log)), false),
            ("failed", run("failed", "failed", Some(2), Some(log)), false),
            // Not final.
            ("busy", run("busy", "working", Some(2), Some(log)), true),
            (
                "gate",
                run("gate", "input-required", Some(1), Some(log)),
                true,
            ),
            // Final by a snapshot that lags its log: taken back to life (a rework).
            (
                "reworked",
                run("reworked", "completed", Some(1), Some(log)),
                true,
            ),
            // Doubt: the snapshot does not say what it folded, the log ends mid-line.
            ("old", run("old", "completed", None, Some(log)), true),
            (
                "torn",
                run(
                    "torn",
                    "completed",
                    Some(2),
                    Some("{\"seq\":1}\n{\"seq\":2}\n{\"seq\":3,"),
                ),
                true,
            ),
            // No log at all: nothing was ever recorded to resume.
            ("nolog", run("nolog", "completed", Some(0), None), false),
        ];
        for (id, entry, want) in &cases {
            assert_eq!(may_be_unfinished(Some(&fd), id, entry), *want, "run {id}");
        }
        // No state.json read: unknown, so included.
        assert!(may_be_unfinished(
            Some(&fd),
            "x",
            &Entry::new("x", None, None)
        ));
        // A long log: only its end is read.
        let mut long = String::new();
        for seq in 1..=5000 {
            long.push_str(&format!(
                "{{\"seq\":{seq},\"data\":\"{}\"}}\n",
                "x".repeat(40)
            ));
        }
        let e = run("long", "completed", Some(5000), Some(&long));
        assert!(!may_be_unfinished(Some(&fd), "long", &e));
        let e = run("long", "completed", Some(4999), Some(&long));
        assert!(may_be_unfinished(Some(&fd), "long", &e));
    }

    #[test]
    fn filters_and_order() {
        let mut loaded = Loaded::default();
        let fields = |state: &str, created: &str, title: &str| Fields {
            title: title.into(),
            goal: "Goal".into(),
            state: state.into(),
            created_at: created.into(),
            updated_at: created.into(),
            events_seq: None,
        };
        loaded.put(
            "a",
            Entry::new(
                "a",
                None,
                Some(fields("working", "2026-01-02T00:00:00Z", "Alpha")),
            ),
        );
        loaded.put(
            "b",
            Entry::new(
                "b",
                None,
                Some(fields("completed", "2026-01-03T00:00:00Z", "Beta")),
            ),
        );
        loaded.put("c", Entry::new("c", None, None));
        let order: Vec<&str> = loaded.order.keys().rev().map(|k| k.1.as_str()).collect();
        assert_eq!(order, ["b", "a", "c"]);
        let f = Filter {
            states: vec!["working".into()],
            ..Filter::default()
        };
        assert!(
            f.admits(loaded.get("a").unwrap(), f.finder().as_ref())
                && !f.admits(loaded.get("b").unwrap(), f.finder().as_ref())
        );
        // An unindexed run is left to the caller.
        assert!(f.admits(loaded.get("c").unwrap(), f.finder().as_ref()));
        let f = Filter {
            text: "alp".into(),
            ..Filter::default()
        };
        // Fields are searched one by one: a text spanning two of them matches neither.
        let across = Filter {
            text: "alpha\0goal".into(),
            ..Filter::default()
        };
        assert!(!across.admits(loaded.get("a").unwrap(), across.finder().as_ref()));
        let across = Filter {
            text: "alphagoal".into(),
            ..Filter::default()
        };
        assert!(!across.admits(loaded.get("a").unwrap(), across.finder().as_ref()));
        assert!(
            f.admits(loaded.get("a").unwrap(), f.finder().as_ref())
                && !f.admits(loaded.get("b").unwrap(), f.finder().as_ref())
        );
        let f = Filter {
            created_after: Some(time::macros::datetime!(2026-01-03 00:00 UTC)),
            ..Filter::default()
        };
        assert!(
            !f.admits(loaded.get("a").unwrap(), f.finder().as_ref())
                && f.admits(loaded.get("b").unwrap(), f.finder().as_ref())
        );
        let f = Filter {
            created_before: Some(time::macros::datetime!(2026-01-03 00:00 UTC)),
            ..Filter::default()
        };
        assert!(
            f.admits(loaded.get("a").unwrap(), f.finder().as_ref())
                && !f.admits(loaded.get("b").unwrap(), f.finder().as_ref())
        );
        // Moving a run moves its place.
        loaded.put(
            "a",
            Entry::new(
                "a",
                None,
                Some(fields("working", "2026-01-04T00:00:00Z", "Alpha")),
            ),
        );
        let order: Vec<&str> = loaded.order.keys().rev().map(|k| k.1.as_str()).collect();
        assert_eq!(order, ["a", "b", "c"]);
        loaded.remove("b");
        assert_eq!(loaded.order.len(), 2);
    }
}
