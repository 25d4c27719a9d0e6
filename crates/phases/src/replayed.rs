//! A replay's `plan` and `assemble` steps and the project's auto-task counters: the plan takes
//! the recorded run's decision (what it selected, from the counters as they stood then) and
//! claims nothing; assemble judges the results again but counts nothing, and reports the
//! counters as the recorded run left them. A replay checks a run; it does not spend a day's
//! auto tasks, and the counters document is not written.

use serde_json::{Map, Value};

use crate::{COUNTERS_UPDATED, PLAN_SELECTED};
use cairn_node::events::{Ev, NODE_FAILED};
use cairn_node::recorded;
use cairn_node::{NodeCtx, NodeError, NodeSuccess};

/// The recorded attempt of this node: its events and how it ended, or why it cannot be used.
async fn recorded_attempt(
    ctx: &NodeCtx,
    source: &str,
) -> Result<(Vec<recorded::Recorded>, recorded::Recorded), NodeError> {
    let events = recorded::events(ctx, source).await?;
    recorded::attempt(&events, &ctx.node_id, ctx.attempt).ok_or_else(|| {
        NodeError::refused(format!(
            "replay record missing: recorded run {source} has no finished attempt {} of node `{}`; its decision cannot be taken from the records",
            ctx.attempt, ctx.node_id
        ))
    })
}

/// The plan of this attempt as the recorded run `source` made it: its outputs and its
/// `plan.selected` event (or its failure), with that run's id made this one's.
pub async fn plan(ctx: &NodeCtx, source: &str) -> Result<NodeSuccess, NodeError> {
    let (seen, (end, data)) = recorded_attempt(ctx, source).await?;
    if end == NODE_FAILED {
        return Err(recorded::failure(&data));
    }
    let outputs = match data.get("outputs") {
        Some(o) => recorded::ours(o.clone(), source, &ctx.run_id),
        None => Value::Null,
    };
    let Value::Object(outputs) = outputs else {
        return Err(NodeError::refused(format!(
            "replay record of node `{}` in run {source} has no outputs; its decision cannot be taken from the records",
            ctx.node_id
        )));
    };
    let events = seen
        .into_iter()
        .filter(|(kind, _)| kind == PLAN_SELECTED)
        .map(|(_, d)| recorded::event(ctx, source, PLAN_SELECTED, d))
        .collect();
    Ok(NodeSuccess { outputs, events })
}

/// The counters as assemble reported them in the recorded run `source` (its `counters`
/// output and its `counters.updated` event); None when that attempt counted nothing.
pub async fn counters(ctx: &NodeCtx, source: &str) -> Result<Option<(Value, Ev)>, NodeError> {
    let (seen, (_, data)) = recorded_attempt(ctx, source).await?;
    let Some(event) = seen
        .into_iter()
        .find(|(kind, _)| kind == COUNTERS_UPDATED)
        .map(|(_, d)| recorded::event(ctx, source, COUNTERS_UPDATED, d))
    else {
        return Ok(None);
    };
    let out = data
        .get("outputs")
        .and_then(|o| o.get("counters"))
        .cloned()
        .map(|c| recorded::ours(c, source, &ctx.run_id))
        .unwrap_or(Value::Object(Map::new()));
    Ok(Some((out, event)))
}
