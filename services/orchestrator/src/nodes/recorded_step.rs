//! A sandbox step of a replay, answered from the recorded run: the recorded attempt's events
//! (sandbox_start, sandbox_complete, the files it wrote) and its outputs or failure, with the
//! recorded run's id replaced by this run's. The files come from the store by the sha256 the
//! recorded run named; a file whose bytes no longer match is refused. No runner is called.

use bytes::Bytes;
use serde_json::{Map, Value};

use super::{artifact_written, NodeCtx, NodeError, NodeSuccess};
use cairn_agents::records::replace_in;
use cairn_node::events::Ev;
use cairn_proto::v1 as pb;
use cairn_sha256::sha256_hex;
use cairn_store_client::PutOptions;

/// The event types a sandbox step records besides its files.
const STEP_EVENTS: &[&str] = &[
    cairn_node::events::SANDBOX_START,
    cairn_node::events::SANDBOX_COMPLETE,
    cairn_node::events::SANDBOX_FAILED,
];

use cairn_node::recorded::attempt as recorded_attempt;

/// Whether this attempt's sandbox request (`ours`, as `request_json` makes it) differs from
/// the one recorded at the same node and attempt of `source`: the unified diff (recorded
/// first) when it does; None when it is the same, or when the recorded run kept no request
/// hash (recorded before requests were kept: replayed as it stands).
pub async fn diverges(
    ctx: &NodeCtx,
    source: &str,
    events: &[pb::Event],
    ours: &str,
) -> Result<Option<String>, NodeError> {
    let store = ctx.store();
    let Some((seen, _)) = recorded_attempt(events, &ctx.node_id, ctx.attempt) else {
        // No finished attempt: `replay` says so.
        return Ok(None);
    };
    let recorded_sha = seen
        .iter()
        .find(|(t, _)| t == cairn_node::events::SANDBOX_START)
        .and_then(|(_, d)| d.get("request_sha256").and_then(Value::as_str))
        .map(str::to_owned);
    let Some(recorded_sha) = recorded_sha else {
        return Ok(None);
    };
    if recorded_sha == sha256_hex(ours.as_bytes()) {
        return Ok(None);
    }
    // The recorded request.json holds the node's last attempt: shown when it is this one.
    let path = cairn_node::RunDir::new(source).sandbox_request(&ctx.node_id);
    let recorded = match store.get(&ctx.project, &path).await {
        Ok(Some(b)) if sha256_hex(&b) == recorded_sha => String::from_utf8_lossy(&b).into_owned(),
        _ => format!(
            "(the recorded request of attempt {} is not kept; its sha256 is {recorded_sha})\n",
            ctx.attempt
        ),
    };
    Ok(Some(cairn_agents::records::unified_diff(
        &recorded, ours, "recorded", "replay",
    )))
}

/// Replays attempt `ctx.attempt` of this node from run `source`'s records (`events`).
pub async fn replay(
    ctx: &NodeCtx,
    source: &str,
    events: &[pb::Event],
) -> Result<NodeSuccess, NodeError> {
    let store = ctx.store();
    let Some((seen, (end, end_data))) = recorded_attempt(events, &ctx.node_id, ctx.attempt) else {
        return Err(NodeError::refused(format!(
            "replay record missing: recorded run {source} has no finished attempt {} of node `{}`; replay with live sandbox steps instead",
            ctx.attempt, ctx.node_id
        )));
    };
    let ours = |v: Value| replace_in(v, source, &ctx.run_id);
    // result.json of the step, as recorded.
    let result_from = cairn_node::RunDir::new(source).sandbox_result(&ctx.node_id);
    if let Ok(Some(bytes)) = store.get(&ctx.project, &result_from).await {
        let text = String::from_utf8_lossy(&bytes).replace(source, &ctx.run_id);
        let to = ctx.run_dir().sandbox_result(&ctx.node_id);
        let opts = PutOptions {
            overwrite: true,
            ..Default::default()
        };
        store
            .put(&ctx.project, &to, Bytes::from(text), &opts)
            .await
            .map_err(|s| NodeError::from_status(&format!("writing {to}"), &s))?;
    }
    let mut out = NodeSuccess::default();
    for (kind, d) in seen {
        if kind != cairn_node::events::ARTIFACT_WRITTEN {
            // Only the step's own event types are replayed.
            let Some(kind) = STEP_EVENTS.iter().find(|k| **k == kind) else {
                continue;
            };
            let mut e = Ev::new(kind, &ctx.node_id);
            if let Value::Object(m) = ours(Value::Object(d)) {
                e.data.extend(m);
            }
            out.events.push(e);
            continue;
        }
        let from = d
            .get("path")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let sha = d.get("sha256").and_then(Value::as_str).unwrap_or_default();
        let bytes = store
            .get(&ctx.project, &from)
            .await
            .map_err(|s| NodeError::from_status(&format!("reading recorded output {from}"), &s))?
            .filter(|b| sha256_hex(b) == sha)
            .ok_or_else(|| {
                NodeError::refused(format!(
                    "replay record missing: recorded output {from} (sha256 {sha}) is gone or changed; replay with live sandbox steps instead"
                ))
            })?;
        let to = from.replace(source, &ctx.run_id);
        let opts = PutOptions {
            overwrite: true,
            run_id: ctx.run_id.clone(),
            ..Default::default()
        };
        let put = store
            .put(&ctx.project, &to, bytes, &opts)
            .await
            .map_err(|s| super::write_file::write_error(&to, &s))?;
        out.events.push(artifact_written(&ctx.node_id, &put, None));
    }
    let d = match ours(Value::Object(end_data)) {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    if end == cairn_node::events::NODE_FAILED {
        for e in out.events {
            ctx.progress.emit(e);
        }
        return Err(cairn_node::recorded::failure(&d));
    }
    if let Some(Value::Object(o)) = d.get("outputs") {
        out.outputs = o.clone();
    }
    Ok(out)
}
