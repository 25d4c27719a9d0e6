//! Session snapshots as the store keeps them: a project's snapshots (the CLI's under
//! `.cairn/snapshots/`, the runs' under `.cairn/runs/<run>/snapshots/`) are bounded by the
//! project's quota, checked before a snapshot Put is published; the CLI's are removed by the
//! sweep once older than `snapshots.delete_after_days` (a run's go with its archive).
//!
//! The quota is checked against a walk of the snapshot directories plus the bytes of snapshot
//! Puts admitted and not yet published (`quota`); one admission at a time, so two Puts cannot
//! both fit in the same room, and no admitted Put is published during a walk, so none is
//! counted twice or not at all.
//!
//! May depend on: state, layout, quota, error, cairn-contain.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use rustix::fs::FileType;
use rustix::io::Errno;

use cairn_contain as contain;

use crate::error::{Error, Result};
use crate::layout::{check_id, SNAPSHOTS_DIR};
use crate::quota::Reservation;
use crate::state::{blocking, State};

/// The CLI's snapshots, `<session>/<n>.snap` beneath it.
pub const CLI_SNAPSHOTS: &str = ".cairn/snapshots";
const RUNS: &str = ".cairn/runs";

/// Whether `path` (checked, project-relative) is a session snapshot: beneath
/// `.cairn/snapshots/` or a run's `.cairn/runs/<run>/snapshots/`.
pub fn is_snapshot(path: &str) -> bool {
    if let Some(rest) = path.strip_prefix(CLI_SNAPSHOTS) {
        return rest.starts_with('/');
    }
    let Some(rest) = path.strip_prefix(RUNS).and_then(|r| r.strip_prefix('/')) else {
        return false;
    };
    match rest.split_once('/') {
        Some((run, below)) => !run.is_empty() && below.starts_with(SNAPSHOTS_DIR),
        None => false,
    }
}

/// Admits a Put of `bytes` at `path` of `project` under the project's snapshot quota: None for
/// a path that is no snapshot or a project without a quota; refused (`snapshot_quota`) when
/// the project's snapshots, less the file `path` replaces, plus the pending ones, plus these
/// bytes would pass it. Keep the reservation until the Put is published.
pub async fn admit(
    state: &Arc<State>,
    project: &str,
    path: &str,
    bytes: u64,
) -> Result<Option<Reservation>> {
    let limit = state.config.snapshots.quota(project);
    if limit == 0 || !is_snapshot(path) {
        return Ok(None);
    }
    let _one = state.snapshot_quota.one_at_a_time().await;
    let (state, project, path) = (state.clone(), project.to_owned(), path.to_owned());
    blocking(move || {
        let walk = || usage(&state, &project, Some(&path));
        state
            .snapshot_quota
            .reserve(&project, &path, bytes, limit, walk)
            .map(Some)
    })
    .await
}

/// Bytes of `project`'s snapshots on disk, the file at `except` left out (blocking).
pub fn usage(state: &State, project: &str, except: Option<&str>) -> Result<u64> {
    let root = match state.layout.project_root(project) {
        Ok(root) => root,
        Err(Error::ProjectNotFound(_)) => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut total = sum_below(root.as_fd(), CLI_SNAPSHOTS, except)?;
    let Ok(runs) = contain::open_dir(root.as_fd(), RUNS) else {
        return Ok(total);
    };
    for (run, kind) in contain::read_dir(runs.as_fd()).unwrap_or_default() {
        if kind != FileType::Directory || check_id("run", &run).is_err() {
            continue;
        }
        let dir = format!("{RUNS}/{run}/{}", SNAPSHOTS_DIR.trim_end_matches('/'));
        total = total.saturating_add(sum_below(root.as_fd(), &dir, except)?);
    }
    Ok(total)
}

/// Bytes of the regular files beneath `dir` (project-relative; none when it is missing).
fn sum_below(root: BorrowedFd<'_>, dir: &str, except: Option<&str>) -> Result<u64> {
    let held = match contain::open_dir(root, dir) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::NOTDIR) => return Ok(0),
        Err(e) => return Err(Error::io(format!("opening {dir:?}"), e)),
    };
    let mut total = 0u64;
    contain::walk(held.as_fd(), &mut |entry| {
        if entry.kind == contain::Kind::File {
            let full = entry.rel_str().map(|rel| format!("{dir}/{rel}"));
            if except.is_none() || full.as_deref() != except {
                total = total.saturating_add(u64::try_from(entry.stat.st_size).unwrap_or(0));
            }
        }
        contain::Visit::Continue
    })
    .map_err(|e| Error::io(format!("reading {dir:?}"), e))?;
    Ok(total)
}

/// The CLI's snapshots of `project` last written more than `days` days before `now` (seconds
/// since the epoch), as project-relative paths (blocking).
pub fn older_than(state: &State, project: &str, days: u64, now: i64) -> Result<Vec<String>> {
    let root = state.layout.project_root(project)?;
    let held = match contain::open_dir(root.as_fd(), CLI_SNAPSHOTS) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::NOTDIR) => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("opening {CLI_SNAPSHOTS:?}"), e)),
    };
    let horizon =
        now.saturating_sub(i64::try_from(days.saturating_mul(86_400)).unwrap_or(i64::MAX));
    let mut old = Vec::new();
    contain::walk(held.as_fd(), &mut |entry| {
        if entry.kind == contain::Kind::File && entry.stat.st_mtime < horizon {
            if let Some(rel) = entry.rel_str() {
                old.push(format!("{CLI_SNAPSHOTS}/{rel}"));
            }
        }
        contain::Visit::Continue
    })
    .map_err(|e| Error::io(format!("reading {CLI_SNAPSHOTS:?}"), e))?;
    Ok(old)
}

/// Removes the directories beneath the CLI's snapshots that are left empty (blocking; a
/// directory written to meanwhile stays).
pub fn remove_empty_dirs(state: &State, project: &str) -> Result<()> {
    let root = state.layout.project_root(project)?;
    let Ok(held) = contain::open_dir(root.as_fd(), CLI_SNAPSHOTS) else {
        return Ok(());
    };
    for (name, kind) in contain::read_dir(held.as_fd()).unwrap_or_default() {
        if kind == FileType::Directory {
            match rustix::fs::unlinkat(held.as_fd(), name.as_str(), rustix::fs::AtFlags::REMOVEDIR)
            {
                Ok(()) | Err(Errno::NOTEMPTY | Errno::EXIST | Errno::NOENT) => {}
                Err(e) => return Err(Error::io(format!("removing {CLI_SNAPSHOTS}/{name}"), e)),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_paths_are_the_clis_and_the_runs_and_nothing_else() {
        for yes in [
            ".cairn/snapshots/s1/1.snap",
            ".cairn/snapshots/x",
            ".cairn/runs/r1/snapshots/s/2.snap",
        ] {
            assert!(is_snapshot(yes), "{yes}");
        }
        for no in [
            ".cairn/snapshots",
            ".cairn/snapshotsX/a",
            ".cairn/runs/r1/snapshot/a",
            ".cairn/runs/r1/events.jsonl",
            ".cairn/runs//snapshots/a",
            ".cairn/runs/snapshots/a",
            "snapshots/a",
            "src/.cairn/snapshots/a",
        ] {
            assert!(!is_snapshot(no), "{no}");
        }
    }
}
