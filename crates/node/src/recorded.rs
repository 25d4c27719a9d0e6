//! What a replay reads of the run it replays: that run's events, one node attempt among them
//! (its events and how it ended), and a recorded failure as the error it was.

use serde_json::{Map, Value};

use crate::{NodeCtx, NodeError};
use cairn_graph::ErrorKind;
use cairn_proto::v1 as pb;

/// An event type and its data.
pub type Recorded = (String, Map<String, Value>);

fn data(e: &pb::Event) -> Map<String, Value> {
    match serde_json::from_str(&e.data_json) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// The stored events of recorded run `source`.
pub async fn events(ctx: &NodeCtx, source: &str) -> Result<Vec<pb::Event>, NodeError> {
    ctx.store()
        .read_events(&ctx.project, source, 1)
        .await
        .map_err(|s| {
            NodeError::from_status(&format!("reading the events of recorded run {source}"), &s)
        })
}

/// The recorded events of `node`'s attempt `attempt` (without node.started), and how it
/// ended (node.completed or node.failed); None when that attempt did not finish.
pub fn attempt(
    events: &[pb::Event],
    node: &str,
    attempt: u32,
) -> Option<(Vec<Recorded>, Recorded)> {
    let mut inside = false;
    let mut seen = Vec::new();
    let mut end = None;
    for e in events.iter().filter(|e| e.node_id == node) {
        let d = data(e);
        match e.r#type.as_str() {
            crate::events::NODE_STARTED => {
                inside = d.get("attempt").and_then(Value::as_u64) == Some(u64::from(attempt));
                if inside {
                    // A redelivered attempt starts over.
                    seen.clear();
                    end = None;
                }
            }
            crate::events::NODE_COMPLETED | crate::events::NODE_FAILED if inside => {
                end = Some((std::mem::take(&mut seen), (e.r#type.clone(), d)));
                inside = false;
            }
            t if inside => seen.push((t.to_owned(), d)),
            _ => {}
        }
    }
    end
}

/// The error a recorded `node.failed` carried (its `kind` and `error`).
pub fn failure(end: &Map<String, Value>) -> NodeError {
    let kind = match end.get("kind").and_then(Value::as_str) {
        Some("timeout") => ErrorKind::Timeout,
        Some("unavailable") => ErrorKind::Unavailable,
        Some("refused") => ErrorKind::Refused,
        _ => ErrorKind::Failed,
    };
    let error = end.get("error").and_then(Value::as_str).unwrap_or_default();
    NodeError::new(kind, error.to_owned())
}

/// `v` with the recorded run's id (`source`) written as this run's.
pub fn ours(v: Value, source: &str, run_id: &str) -> Value {
    cairn_agents::records::replace_in(v, source, run_id)
}

/// A recorded event of kind `kind` as this node's event, the recorded run's id replaced.
pub fn event(
    ctx: &NodeCtx,
    source: &str,
    kind: &'static str,
    data: Map<String, Value>,
) -> crate::events::Ev {
    let mut e = crate::events::Ev::new(kind, &ctx.node_id);
    if let Value::Object(m) = ours(Value::Object(data), source, &ctx.run_id) {
        e.data.extend(m);
    }
    e
}
