//! The store: its data root handle, path policies and shared state. Every operation module
//! (`project`, `write`, `read`, `events`, `document`) works through a `Store`.
//!
//! `.cairn` and the denylist: `.cairn` is not denylisted (`.git` is), because clients write run
//! records there as ordinary files (`.cairn/runs/<run>/sandbox/result.json`, ingest
//! manifests). The store keeps for itself only `.cairn/project.json`, each run's
//! `events.jsonl` (appended only through AppendEvents, so sequence numbers stay gap-free) and
//! any name starting with `.cairn-tmp-` (its temp files, swept at start-up). Its own writes to
//! those bypass the client policy but still walk beneath the project root without following
//! symlinks. An operator who adds `.cairn` to the denylist keeps clients out of run records;
//! events keep working.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use pathguard::{Policy, SafePath};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::beneath;
use crate::config::Config;
use crate::digest::DigestCache;
use crate::document::DocLocks;
use crate::error::{Error, Result};
use crate::events::RunLogs;
use crate::slots::Slots;

/// Most Puts published in the background at once (each holds two fds until it is done).
const PUBLICATIONS_IN_FLIGHT: usize = 256;
/// Most large Puts written with O_DIRECT at once (each holds three 4 MiB buffers and two
/// threads); the others go through the page cache.
const DIRECT_WRITERS: usize = 16;

/// Prefix of the store's temporary files.
pub const TEMP_PREFIX: &str = ".cairn-tmp-";

/// The artifact-store's state, shared by every request.
#[derive(Debug)]
pub struct Store {
    pub(crate) config: Config,
    /// `<data_root>/projects`, held open for the store's lifetime.
    pub(crate) projects: OwnedFd,
    /// Syntax + denylist: what any path must pass (reads and writes).
    pub(crate) read_policy: Policy,
    /// Syntax + denylist + the server's allowed prefixes: what writes must pass.
    pub(crate) write_policy: Policy,
    pub(crate) digests: DigestCache,
    pub(crate) runs: RunLogs,
    /// This boot of the process: the publication tokens of deferred Puts are bound to it.
    pub(crate) boot: crate::publication::Boot,
    pub(crate) docs: DocLocks,
    /// Writes stage into unnamed O_TMPFILE inodes (probed at open; else `.cairn-tmp-*` names).
    pub(crate) unnamed_temps: bool,
    /// The paths being published now.
    pub(crate) slots: std::sync::Arc<Slots>,
    /// Bounds the Puts published after their reply; beyond it a Put waits.
    pub(crate) publish_permits: std::sync::Arc<tokio::sync::Semaphore>,
    /// Bounds the large Puts written with O_DIRECT; beyond it a Put uses the page cache.
    pub(crate) direct_writers: std::sync::Arc<tokio::sync::Semaphore>,
    /// Tests hold this to keep background publications from starting.
    #[cfg(test)]
    pub(crate) hold_publications: std::sync::Mutex<()>,
}

impl Store {
    /// Opens (creating when missing) the data root. Does not sweep; see `sweep::remove_temp_files`.
    pub fn open(config: Config) -> Result<Store> {
        config.check()?;
        let projects_path = config.data_root.join("projects");
        std::fs::create_dir_all(&projects_path).map_err(|e| {
            Error::io(
                format!("cannot create data root {}", projects_path.display()),
                e,
            )
        })?;
        let projects = open_dir_path(&projects_path)?;
        let mut denylist: Vec<String> = pathguard::DEFAULT_DENYLIST
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        denylist.extend(config.denylist.iter().cloned());
        let write_policy = Policy::from_strings(&denylist, &config.allowed_prefixes)
            .map_err(|r| Error::Config(format!("{}: {}", r.path, r.message)))?;
        let read_policy = Policy::new(write_policy.denylist().to_vec(), Vec::new());
        let unnamed_temps = crate::write::unnamed_temps_work(projects.as_fd());
        Ok(Store {
            unnamed_temps,
            read_policy,
            write_policy,
            projects,
            digests: DigestCache::default(),
            runs: RunLogs::default(),
            boot: crate::publication::Boot::new(),
            docs: DocLocks::default(),
            slots: Default::default(),
            publish_permits: std::sync::Arc::new(tokio::sync::Semaphore::new(
                PUBLICATIONS_IN_FLIGHT,
            )),
            direct_writers: std::sync::Arc::new(tokio::sync::Semaphore::new(DIRECT_WRITERS)),
            #[cfg(test)]
            hold_publications: std::sync::Mutex::new(()),
            config,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Checks a path a client reads (syntax, denylist, the store's temp names).
    pub(crate) fn read_path(&self, path: &str) -> Result<SafePath> {
        let safe = self.read_policy.check(path)?;
        refuse_temp_names(&safe)?;
        Ok(safe)
    }

    /// Checks a path a client writes or deletes: syntax, denylist, the server's allowed
    /// prefixes narrowed by the request's, and the store's reserved files.
    pub(crate) fn write_path(&self, path: &str, requested_prefixes: &[String]) -> Result<SafePath> {
        let safe = if requested_prefixes.is_empty() {
            self.write_policy.check(path)?
        } else {
            self.write_policy.narrow(requested_prefixes)?.check(path)?
        };
        refuse_temp_names(&safe)?;
        let parts: Vec<&str> = safe.components().collect();
        let reserved = match parts.as_slice() {
            [".cairn", "project.json"] => Some("the store keeps the project's metadata there"),
            [".cairn", "runs", _, last] if last.eq_ignore_ascii_case("events.jsonl") => {
                Some("a run's events.jsonl is appended only through AppendEvents")
            }
            [".cairn", "runs", _, last] if last.eq_ignore_ascii_case(crate::events::EPOCH_FILE) => {
                Some("a run's writer epoch is set only through ClaimRun")
            }
            _ => None,
        };
        match reserved {
            Some(why) => Err(Error::Reserved {
                path: safe.to_string(),
                why,
            }),
            None => Ok(safe),
        }
    }

    /// Opens a project's root directory.
    pub(crate) fn project_root(&self, project_id: &str) -> Result<OwnedFd> {
        crate::project::check_id("project", project_id)?;
        beneath::open_dir(self.projects.as_fd(), project_id).map_err(|e| match e {
            Errno::NOENT => Error::ProjectNotFound(project_id.to_owned()),
            e => beneath::refusal(e, project_id, "", "opening the project"),
        })
    }
}

fn refuse_temp_names(path: &SafePath) -> Result<()> {
    if path.components().any(|c| c.starts_with(TEMP_PREFIX)) {
        return Err(Error::Reserved {
            path: path.to_string(),
            why: "names starting with .cairn-tmp- are the store's temporary files; choose another name",
        });
    }
    Ok(())
}

fn open_dir_path(path: &Path) -> Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))
}

/// Now as RFC 3339 UTC with milliseconds ("2026-01-01T00:00:00.000Z").
pub fn timestamp_now() -> String {
    timestamp(time::OffsetDateTime::now_utc())
}

/// A time as RFC 3339 UTC with milliseconds.
pub fn timestamp(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// A stat's modification time as RFC 3339.
pub fn mtime_of(st: &rustix::fs::Stat) -> String {
    let nanos = i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec as i64);
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .map(timestamp)
        .unwrap_or_default()
}

/// Runs blocking filesystem work off the async threads.
pub(crate) async fn blocking<T, F>(work: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) if e.is_cancelled() => Err(Error::Unavailable),
        Err(e) => Err(Error::io(
            "a store task failed",
            std::io::Error::other(e.to_string()),
        )),
    }
}
