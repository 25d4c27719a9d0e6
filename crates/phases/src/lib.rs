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
//! - [`inputs`]: the files a graph names (schema files, the limits file, prompt files): read
//!   once at submit by [`prepare`] from what the submitter sent or the run's project, and
//!   embedded in graph.resolved.json, so a run never depends on them again (resume, rerun,
//!   edits of the source files).

pub mod assemble;
pub mod assemble_node;
pub mod contracts;
pub mod counters;
pub mod inputs;
pub mod plan;
pub mod plan_node;
pub mod replayed;

pub use assemble::AssembleSpec;
pub use cairn_graph::contract::{check_result_name, normalize_key, RESULT_OUTPUTS};
pub use contracts::{Contract, Contracts};
pub use inputs::GraphFiles;
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

/// The project path of result file `name` of run `run_id`.
pub fn results_path(run_id: &str, name: &str) -> String {
    RunDir::new(run_id).path(&format!("results/{name}"))
}

/// The run's results directory (no trailing slash).
pub fn results_dir(run_id: &str) -> String {
    RunDir::new(run_id).path("results")
}

/// Submit time: loads the files the graph names (contract `schema_file`s, plan
/// `limits_file`s and their prompt files) from `files` into the graph, and checks them, so
/// graph.resolved.json holds everything the phases need.
pub async fn prepare<F: GraphFiles>(graph: &mut Graph, files: &F) -> Result<(), GraphError> {
    for (i, c) in graph.contracts.iter_mut().enumerate() {
        contracts::load(c, files).await.map_err(|m| GraphError {
            position: None,
            node: None,
            field: Some(format!("contracts[{i}].schema_file")),
            message: m,
        })?;
    }
    for (i, n) in graph.nodes.iter_mut().enumerate() {
        let id = n.id.clone();
        let spec = match &mut n.kind {
            NodeKind::Plan(p) => p,
            _ => continue,
        };
        plan::load(spec, files)
            .await
            .map_err(|(field, m)| GraphError {
                position: Some(i),
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
}
