//! Run records: `.cairn/` holds each run's records (`.cairn/runs/<run>/`), written only by the
//! run's own driver through its record path. A path a graph names (a node's file, output
//! prefix, delivery directory, tool argument...) never writes there, and reads only its own
//! run's records. Compared case-folded, so no spelling of `.cairn` gets round the rule on a
//! file system that ignores case.

/// The records directory at the top of every project.
pub const RECORDS_DIR: &str = ".cairn";

/// Why a path a graph names was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordsRefusal {
    #[error("`{0}` is under .cairn/, which holds run records that only the run's driver writes; write under docs/ or workspace/ instead")]
    Write(String),
    #[error("`{path}` is in the records of run {run} (.cairn/runs/{run}/); a node reads only its own run's records")]
    OtherRun { path: String, run: String },
    #[error("`{0}` is under .cairn/ but outside this run's records (.cairn/runs/<run>/); a node reads only its own run's records")]
    Read(String),
}

fn first(path: &str) -> &str {
    path.split('/').next().unwrap_or_default()
}

fn is_records_dir(component: &str) -> bool {
    crate::fold_key(component) == RECORDS_DIR
}

/// Whether `path` (a file or a prefix) lies in the records directory `.cairn/`.
pub fn in_records(path: &str) -> bool {
    is_records_dir(first(path))
}

/// The run whose records hold `path` (`.cairn/runs/<run>/...`), if any.
pub fn run_of(path: &str) -> Option<&str> {
    let mut parts = path.split('/');
    if !is_records_dir(parts.next()?) || crate::fold_key(parts.next()?) != "runs" {
        return None;
    }
    parts.next().filter(|r| !r.is_empty())
}

/// May a node write `path` (a file or a prefix)? Never under `.cairn/`.
pub fn check_node_write(path: &str) -> Result<(), RecordsRefusal> {
    if in_records(path) {
        return Err(RecordsRefusal::Write(path.to_owned()));
    }
    Ok(())
}

/// May a node of run `run_id` read `path` (a file or a prefix)? Under `.cairn/` only inside
/// `.cairn/runs/<run_id>/`, spelled exactly so.
pub fn check_node_read(path: &str, run_id: &str) -> Result<(), RecordsRefusal> {
    if !in_records(path) {
        return Ok(());
    }
    let own = format!("{RECORDS_DIR}/runs/{run_id}");
    let trimmed = path.trim_end_matches('/');
    if !run_id.is_empty() && (trimmed == own || path.starts_with(&format!("{own}/"))) {
        return Ok(());
    }
    match run_of(path) {
        Some(run) if run != run_id => Err(RecordsRefusal::OtherRun {
            path: path.to_owned(),
            run: run.to_owned(),
        }),
        _ => Err(RecordsRefusal::Read(path.to_owned())),
    }
}

/// Whether a graph path's template text (`{{...}}` for values filled in at run time) names
/// the records directory in its literal first component, so submit can refuse it.
pub fn template_in_records(source: &str) -> bool {
    let head = first(source);
    !head.contains("{{") && is_records_dir(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_never_write_records() {
        for p in [
            ".cairn/runs/r1/task.yaml",
            ".cairn/runs/r2/graph.resolved.json",
            ".cairn/project.json",
            ".cairn",
            ".cairn/",
            ".CAIRN/runs/r1/task.yaml",
            ".Cairn/x",
        ] {
            assert!(check_node_write(p).is_err(), "{p}");
        }
        for p in [
            "docs/a.md",
            "workspace/.cairn/x",
            ".cairn-agent/x",
            "cairn/x",
        ] {
            assert!(check_node_write(p).is_ok(), "{p}");
        }
    }

    #[test]
    fn nodes_read_only_their_own_runs_records() {
        assert!(check_node_read(".cairn/runs/r1/agents/a/x.md", "r1").is_ok());
        assert!(check_node_read(".cairn/runs/r1/", "r1").is_ok());
        assert!(check_node_read(".cairn/runs/r1", "r1").is_ok());
        assert!(check_node_read("docs/x", "r1").is_ok());
        assert!(matches!(
            check_node_read(".cairn/runs/r2/task.yaml", "r1"),
            Err(RecordsRefusal::OtherRun { run, .. }) if run == "r2"
        ));
        assert!(check_node_read(".cairn/runs/r10/x", "r1").is_err());
        assert!(check_node_read(".cairn/runs/", "r1").is_err());
        assert!(check_node_read(".cairn/", "r1").is_err());
        assert!(check_node_read(".cairn/project.json", "r1").is_err());
        // Its own run's records, spelled otherwise: the general rule, not "another run".
        assert_eq!(
            check_node_read(".CAIRN/runs/r1/x", "r1"),
            Err(RecordsRefusal::Read(".CAIRN/runs/r1/x".into()))
        );
        assert_eq!(
            check_node_read(".cairn/RUNS/r2/x", "r1"),
            Err(RecordsRefusal::OtherRun {
                path: ".cairn/RUNS/r2/x".into(),
                run: "r2".into()
            })
        );
        assert!(check_node_read(".cairn/runs/r1/x", "").is_err());
    }

    #[test]
    fn templates_refused_by_their_literal_head() {
        assert!(template_in_records(".cairn/runs/{{run_id}}/task.yaml"));
        assert!(template_in_records(".cairn"));
        assert!(!template_in_records("{{vars.p}}/x"));
        assert!(!template_in_records("docs/{{run_id}}.md"));
        assert_eq!(run_of(".cairn/runs/r1/task.yaml"), Some("r1"));
        assert_eq!(run_of(".cairn/runs/"), None);
        assert_eq!(run_of("docs/x"), None);
    }
}
