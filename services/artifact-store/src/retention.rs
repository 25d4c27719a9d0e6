//! The retention sweep's choices: which finished runs of a project to archive and which
//! archived runs to delete, by the project's [`RetentionRule`]. The store does the work.
//!
//! May depend on: config, state, layout, run_index (state.json fields), error, cairn-contain.

use std::os::fd::AsFd;

use rustix::fs::FileType;
use time::OffsetDateTime;

use cairn_contain as contain;

use crate::config::RetentionRule;
use crate::error::Result;
use crate::layout::{check_id, ARCHIVE_FILE};
use crate::run_index::{fields_of, FINAL_STATES, STATE_FILE};
use crate::state::State;

const DAY_S: i64 = 86_400;

/// What the sweep does to a project's runs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Due {
    pub archive: Vec<String>,
    pub delete: Vec<String>,
}

/// A run as the sweep sees it.
struct Run {
    id: String,
    /// Its last update (state.json's updated_at, else created_at), seconds since the epoch.
    updated_s: i64,
    /// When it was archived (the archive's mtime), seconds since the epoch.
    archived_s: Option<i64>,
}

fn seconds(text: &str) -> Option<i64> {
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(OffsetDateTime::unix_timestamp)
}

/// The project's finished runs (blocking); others are left out.
fn finished_runs(state: &State, project: &str) -> Result<Vec<Run>> {
    let root = state.layout.project_root(project)?;
    let Ok(runs) = contain::open_dir(root.as_fd(), ".cairn/runs") else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (id, kind) in contain::read_dir(runs.as_fd()).unwrap_or_default() {
        if kind != FileType::Directory || check_id("run", &id).is_err() {
            continue;
        }
        let Ok(dir) = contain::open_dir(runs.as_fd(), &id) else {
            continue;
        };
        let archived_s = contain::stat(dir.as_fd(), ARCHIVE_FILE)
            .ok()
            .map(|st| st.st_mtime);
        let Ok(fd) = contain::open(dir.as_fd(), STATE_FILE, rustix::fs::OFlags::RDONLY, 0) else {
            continue;
        };
        let mut bytes = Vec::new();
        if std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut bytes).is_err() {
            continue;
        }
        let Some(fields) = fields_of(&bytes) else {
            continue;
        };
        if !FINAL_STATES.contains(&fields.state.as_str()) {
            continue;
        }
        let Some(updated_s) = seconds(&fields.updated_at).or_else(|| seconds(&fields.created_at))
        else {
            continue;
        };
        out.push(Run {
            id,
            updated_s,
            archived_s,
        });
    }
    Ok(out)
}

/// What `rule` says of `runs` at `now` (seconds since the epoch).
fn choose(rule: &RetentionRule, mut runs: Vec<Run>, now: i64) -> Due {
    runs.sort_by(|a, b| b.updated_s.cmp(&a.updated_s).then(b.id.cmp(&a.id)));
    let mut due = Due::default();
    let older =
        |t: i64, days: u64| now - t > i64::try_from(days).unwrap_or(i64::MAX / DAY_S) * DAY_S;
    for (i, run) in runs.into_iter().enumerate() {
        match run.archived_s {
            Some(at) => {
                if rule.delete_after_days > 0 && older(at, rule.delete_after_days) {
                    due.delete.push(run.id);
                }
            }
            None => {
                let beyond = rule.keep_runs == 0 || i as u64 >= rule.keep_runs;
                let old =
                    rule.archive_after_days == 0 || older(run.updated_s, rule.archive_after_days);
                let any = rule.keep_runs > 0 || rule.archive_after_days > 0;
                if any && beyond && old {
                    due.archive.push(run.id);
                }
            }
        }
    }
    due
}

/// The runs of `project` to archive and to delete now (blocking).
pub fn due(state: &State, project: &str, rule: &RetentionRule) -> Result<Due> {
    let now = OffsetDateTime::now_utc().unix_timestamp();
    Ok(choose(rule, finished_runs(state, project)?, now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, age_days: i64, archived_days: Option<i64>) -> Run {
        Run {
            id: id.into(),
            updated_s: 1_000 * DAY_S - age_days * DAY_S,
            archived_s: archived_days.map(|d| 1_000 * DAY_S - d * DAY_S),
        }
    }

    #[test]
    fn runs_beyond_the_newest_and_older_than_the_horizon_are_archived() {
        let now = 1_000 * DAY_S;
        let runs = || {
            vec![
                run("a", 1, None),
                run("b", 10, None),
                run("c", 40, None),
                run("d", 90, Some(70)),
            ]
        };
        let rule = |archive_after_days, keep_runs, delete_after_days| RetentionRule {
            archive_after_days,
            keep_runs,
            delete_after_days,
        };
        assert_eq!(choose(&rule(0, 0, 0), runs(), now), Due::default());
        assert_eq!(choose(&rule(30, 0, 0), runs(), now).archive, ["c"]);
        assert_eq!(choose(&rule(0, 1, 0), runs(), now).archive, ["b", "c"]);
        assert_eq!(choose(&rule(5, 2, 0), runs(), now).archive, ["c"]);
        assert_eq!(choose(&rule(0, 0, 60), runs(), now).delete, ["d"]);
        assert!(choose(&rule(0, 0, 80), runs(), now).delete.is_empty());
    }
}
