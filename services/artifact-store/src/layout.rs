//! The data root's layout and path rules: `<data_root>/projects` held open, the policies a
//! client's path must pass, the names the store keeps for itself, and each project's root
//! reached beneath the projects directory. Also the id rule shared by projects and runs
//! (common.proto: [A-Za-z0-9._-], 1-128 characters, not `.` or `..`).
//!
//! `.cairn` and the denylist: `.cairn` is not denylisted (`.git` is), because clients write run
//! records there as ordinary files (`.cairn/runs/<run>/sandbox/result.json`, ingest
//! manifests). The store keeps for itself only `.cairn/project.json`, each run's
//! `events.jsonl` (appended only through AppendEvents, so sequence numbers stay gap-free), its
//! seek index `events.idx` and its writer epoch, and any name starting with `.cairn-tmp-` (its temp files, swept at
//! start-up). Its own writes to those bypass the client policy but still walk beneath the
//! project root without following symlinks. An operator who adds `.cairn` to the denylist keeps
//! clients out of run records; events keep working.
//!
//! May depend on: config, error, cairn-contain, pathguard; never on an operation module.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use cairn_contain as contain;
use pathguard::{Policy, SafePath};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::config::Config;
use crate::error::{refusal, Error, Result};

/// Prefix of the store's temporary files.
pub const TEMP_PREFIX: &str = ".cairn-tmp-";
/// A run's event log, beside its other records in `.cairn/runs/<run>/`.
pub const EVENTS_FILE: &str = "events.jsonl";
/// The seek index of a run's event log (see `event_seek`), beside it.
pub const EVENTS_INDEX_FILE: &str = "events.idx";
/// The run's writer epoch (ClaimRun), a decimal number beside its log; absent = 0.
pub const EPOCH_FILE: &str = "events.epoch";
/// An archived run's records, packed (see `archive`), beside its state.json.
pub const ARCHIVE_FILE: &str = "run.tar.gz";
/// Directory of a run's session snapshots (checkpoints of its nodes' sandbox sessions): of no
/// use once the run is finished, so archiving removes them instead of packing them.
pub const SNAPSHOTS_DIR: &str = "snapshots/";

/// The data root as the store sees it.
#[derive(Debug)]
pub struct Layout {
    /// `<data_root>/projects`, held open for the store's lifetime.
    pub(crate) projects: OwnedFd,
    /// Syntax + denylist: what any path must pass (reads and writes).
    pub(crate) read_policy: Policy,
    /// Syntax + denylist + the server's allowed prefixes: what writes must pass.
    pub(crate) write_policy: Policy,
}

impl Layout {
    /// Opens (creating when missing) `<data_root>/projects` and builds the path policies.
    pub fn open(config: &Config) -> Result<Layout> {
        let projects_path = config.data_root.join("projects");
        std::os::unix::fs::DirBuilderExt::mode(
            std::fs::DirBuilder::new().recursive(true),
            contain::DIR_MODE,
        )
        .create(&projects_path)
        .map_err(|e| {
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
        Ok(Layout {
            projects,
            read_policy,
            write_policy,
        })
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
            [".cairn", "runs", _, last] if last.eq_ignore_ascii_case(EVENTS_FILE) => {
                Some("a run's events.jsonl is appended only through AppendEvents")
            }
            [".cairn", "runs", _, last] if last.eq_ignore_ascii_case(EVENTS_INDEX_FILE) => {
                Some("a run's events.idx is the store's seek index of its events.jsonl")
            }
            [".cairn", "runs", _, last] if last.eq_ignore_ascii_case(EPOCH_FILE) => {
                Some("a run's writer epoch is set only through ClaimRun")
            }
            [".cairn", "runs", _, last] if last.eq_ignore_ascii_case(ARCHIVE_FILE) => {
                Some("an archived run's records are packed there only by ArchiveRun")
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
        check_id("project", project_id)?;
        contain::open_dir(self.projects.as_fd(), project_id).map_err(|e| match e {
            Errno::NOENT => Error::ProjectNotFound(project_id.to_owned()),
            e => refusal(e, project_id, "", "opening the project"),
        })
    }
}

/// Refuses ids outside [A-Za-z0-9._-]{1,128}, and `.`/`..`; project ids follow the stricter
/// rule of [`pathguard::is_project_id`].
pub fn check_id(kind: &'static str, id: &str) -> Result<()> {
    if kind == "project" {
        return if pathguard::is_project_id(id) {
            Ok(())
        } else {
            Err(Error::InvalidProjectId(id.chars().take(160).collect()))
        };
    }
    let ok = !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidId {
            kind,
            id: id.chars().take(160).collect(),
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
