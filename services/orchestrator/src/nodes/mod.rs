//! Node types, one file each. A node with effects runs as its own task with a [`NodeCtx`] and
//! returns its outputs plus the events that belong with its completion (artifact.written ...);
//! the scheduler records `node.completed` with them in one batch. `condition`, `gate` and `map`
//! are driven by the scheduler itself; their files hold the parts that are theirs.

pub mod agent_task;
pub mod condition;
pub mod gate;
pub mod ingest;
pub mod map;
pub mod recorded_step;
pub mod sandbox_run;
pub mod write_file;

use std::sync::Arc;

pub use cairn_node::{
    artifact_written, check_access, expand_files, file_outputs, outcome_word, project_path, Access,
    NodeCtx, NodeError, NodeSuccess, Progress, Registry, Scope, Services, TaskMsg,
};

use crate::config::Config;

/// What the core shares with every run: the services node kinds use, the configuration and
/// the registered node kinds.
pub struct Backends {
    pub services: Arc<Services>,
    pub config: Config,
    pub kinds: Registry,
}

impl std::ops::Deref for Backends {
    type Target = Services;
    fn deref(&self) -> &Services {
        &self.services
    }
}

/// The node kinds of this orchestrator, each with its part of the configuration.
pub fn registry(config: &Config) -> Registry {
    Registry::new()
        .with(write_file::WriteFileKind)
        .with(agent_task::AgentTaskKind)
        .with(sandbox_run::SandboxRunKind)
        .with(ingest::IngestKind)
        .with(cairn_phases::plan_node::PlanKind)
        .with(cairn_phases::assemble_node::AssembleKind)
        .with(cairn_tools::node::ToolCallKind {
            tools_dir: config.tools_dir.clone(),
            use_sandbox: config.sandbox.runner.features.use_for_tools,
        })
        .with(cairn_delivery::node::DeliverKind {
            onebot: config.onebot.clone(),
        })
        .with(cairn_code_delivery::node::CodeDeliveryKind {
            config: config.code_delivery.clone(),
            onebot: config.onebot.clone(),
        })
        .with(cairn_external_agents::node::ExternalAgentKind)
}

/// Runs one attempt of a node with effects.
pub async fn execute(ctx: &mut NodeCtx, kinds: &Registry) -> Result<NodeSuccess, NodeError> {
    let store = ctx.backends.store.clone();
    let node = ctx.node.clone();
    ctx.scope.load_texts(&store, &ctx.project, &node).await?;
    // the fail-safe placeholder of a declared result comes first.
    let slot = cairn_phases::contracts::begin(ctx).await?;
    let outcome = match kinds.get(node.kind.type_name()) {
        Some(kind) => kind.run(ctx).await,
        // condition, gate and map are the scheduler's own.
        None => Err(NodeError::refused(format!(
            "{} nodes are run by the scheduler",
            node.kind.type_name()
        ))),
    };
    match slot {
        Some(slot) => cairn_phases::contracts::finish(ctx, slot, outcome).await,
        None => outcome,
    }
}
