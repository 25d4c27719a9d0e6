//! Phase contracts: the interface between the phases of an agent team.
//!
//! A phase writes result files under the run's `results/` directory
//! (`.cairn/runs/<run_id>/results/`); a later phase reads them with fixed rules. This crate owns
//! those rules and never talks gRPC itself except through [`cairn_store_client::Store`]; it
//! depends on the node API (cairn-node) and the graph language, never on the orchestrator:
//! - [`contracts`]: graph-level JSON Schemas for result files, the fail-safe placeholder written
//!   before a node with `result:` runs, and how its result replaces it.
//! - [`assemble`]: reading results (missing = failed, status semantics, `-`/`_` key
//!   normalisation, schema violations = failed with the reason).
//! - [`plan`]: the frequency-limits file and the round-robin selection of auto tasks
//!   (plan_type tasks / auto / idle).
//! - [`counters`]: the versioned counters document (UpdateJson; per-run slots so that a
//!   max-merge after a conflict keeps every increment).
//! - [`plan_node`] and [`assemble_node`]: the `plan` and `assemble` node kinds.
//!
//! Files a graph names relative to its own directory (schema files, the limits file, prompt
//! files) are read once at submit by [`prepare`] and embedded in graph.resolved.json, so a run
//! never depends on them again (resume, edits of the source files).

pub mod assemble;
pub mod assemble_node;
pub mod contracts;
pub mod counters;
pub mod plan;
pub mod plan_node;

use std::path::Path;

pub use assemble::AssembleSpec;
pub use cairn_graph::contract::{check_result_name, normalize_key, RESULT_OUTPUTS};
pub use contracts::{Contract, Contracts};
pub use plan::{LimitTask, Limits, PlanSpec};

use cairn_graph::{Graph, GraphError, NodeKind};
use cairn_node::RunDir;

/// `result.placeholder`: the fail-safe result (status failed) was written before the node ran.
pub const RESULT_PLACEHOLDER: &str = "result.placeholder";
/// `result.written`: the node's result replaced the placeholder.
pub const RESULT_WRITTEN: &str = "result.written";
/// `result.missing`: the node finished without a result; the placeholder stays.
pub const RESULT_MISSING: &str = "result.missing";
/// `result.invalid`: the result violates its contract (assemble reads it as failed).
pub const RESULT_INVALID: &str = "result.invalid";
/// `plan.selected`: what a plan node decided (plan_type, keys).
pub const PLAN_SELECTED: &str = "plan.selected";
/// `counters.updated`: an assemble node counted successes in the counters document.
pub const COUNTERS_UPDATED: &str = "counters.updated";

/// Largest file read from the graph's directory at submit (schema, limits, prompt).
const MAX_LOCAL_FILE_BYTES: u64 = 1 << 20;

/// The project path of result file `name` of run `run_id`.
pub fn results_path(run_id: &str, name: &str) -> String {
    RunDir::new(run_id).path(&format!("results/{name}"))
}

/// The run's results directory (no trailing slash).
pub fn results_dir(run_id: &str) -> String {
    RunDir::new(run_id).path("results")
}

/// Reads a file the graph names relative to its directory. Only relative paths that pathguard
/// accepts are read (no absolute paths, no `..`): a graph cannot make the server read files
/// outside its own directory.
pub fn read_local(base_dir: &Path, rel: &str) -> Result<String, String> {
    pathguard::validate(rel).map_err(|rej| {
        format!("`{rel}`: {rej} (files are named relative to the graph's directory)")
    })?;
    let path = base_dir.join(rel);
    let meta =
        std::fs::metadata(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a file", path.display()));
    }
    if meta.len() > MAX_LOCAL_FILE_BYTES {
        return Err(format!(
            "{} is larger than {} KiB",
            path.display(),
            MAX_LOCAL_FILE_BYTES >> 10
        ));
    }
    std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Submit time: loads the files the graph names relative to `base_dir` (contract
/// `schema_file`s, plan `limits_file`s and their prompt files) into the graph, and checks them,
/// so graph.resolved.json holds everything the phases need.
pub fn prepare(graph: &mut Graph, base_dir: &Path) -> Result<(), GraphError> {
    for (i, c) in graph.contracts.iter_mut().enumerate() {
        contracts::load(c, base_dir).map_err(|m| GraphError {
            node: None,
            field: Some(format!("contracts[{i}].schema_file")),
            message: m,
        })?;
    }
    for n in graph.nodes.iter_mut() {
        let id = n.id.clone();
        let spec = match &mut n.kind {
            NodeKind::Plan(p) => p,
            _ => continue,
        };
        plan::load(spec, base_dir).map_err(|(field, m)| GraphError {
            node: Some(id),
            field: Some(field),
            message: m,
        })?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_normalise_hyphens_to_underscores() {
        assert_eq!(normalize_key("tech-research"), "tech_research");
        assert_eq!(normalize_key("tech_research"), "tech_research");
        assert_eq!(normalize_key("a-b-c"), "a_b_c");
    }

    #[test]
    fn result_names_are_relative_json_paths() {
        assert!(check_result_name("todoist-plan.json").is_ok());
        assert!(check_result_name("phase2/a.json").is_ok());
        assert!(check_result_name("../x.json").is_err());
        assert!(check_result_name("/abs.json").is_err());
        assert!(check_result_name("plan.md").is_err());
    }

    #[test]
    fn local_files_stay_under_the_graph_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.json"), "{}").unwrap();
        assert_eq!(read_local(dir.path(), "a.json").unwrap(), "{}");
        assert!(read_local(dir.path(), "../a.json").is_err());
        assert!(read_local(dir.path(), "/etc/passwd").is_err());
        let e = read_local(dir.path(), "missing.json").unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
    }
}
