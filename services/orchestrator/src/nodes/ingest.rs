//! The ingest hook and the explicit `ingest` node: a document's strict code fences
//! become workspace files through the ingest service. Fail-open: whatever goes wrong is
//! recorded (`ingest.hook_failed` at warning level, the manifest), `workspace_files` is an
//! empty list, and the run goes on.

use std::time::Duration;

use bytes::Bytes;
use cairn_proto::v1::{BlockStatus, IngestRequest, IngestResponse, Level};
use serde_json::{json, Map, Value};

use super::{project_path, NodeCtx, NodeError, NodeSuccess};
use cairn_graph::IngestNode;
use cairn_node::events::{Ev, INGEST_HOOK_FAILED};

const INGEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether the hook runs after this node wrote `path`: the server flag, an ingest service
/// configured, and the node's `ingest:` (default: Markdown documents).
pub fn wants_hook(ctx: &NodeCtx, path: &str) -> bool {
    let b = &ctx.backends;
    if !b.ingest_hook || b.ingest.is_none() {
        return false;
    }
    ctx.node.ingest.unwrap_or_else(|| is_document(path))
}

fn is_document(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    lower.ends_with(".md") || lower.ends_with(".markdown")
}

/// Calls Ingest; the outcome goes into the node's outputs and events, never into its result.
pub async fn hook(ctx: &NodeCtx, doc_path: &str, content: Bytes, out: &mut NodeSuccess) {
    match call(ctx, doc_path, content, ctx.reset, &ctx.scope.graph.mode).await {
        Ok(r) => merge(&mut out.outputs, &r),
        Err(message) => {
            // fail-open, but recorded.
            out.events.push(
                Ev::new(INGEST_HOOK_FAILED, &ctx.node_id)
                    .level(Level::Warning)
                    .with("doc_path", doc_path)
                    .with("error", message.clone()),
            );
            out.outputs
                .insert("ingest".into(), json!({"error": message}));
            // Nothing reached the workspace: later nodes read an empty list, not a hole.
            out.outputs.insert("workspace_files".into(), json!([]));
        }
    }
}

async fn call(
    ctx: &NodeCtx,
    doc_path: &str,
    content: Bytes,
    overwrite: bool,
    mode: &str,
) -> Result<IngestResponse, String> {
    let Some(client) = ctx.backends.ingest.clone() else {
        return Err("no ingest service configured (ingest_addr)".into());
    };
    let req = IngestRequest {
        project_id: ctx.project.clone(),
        run_id: ctx.run_id.clone(),
        node_id: ctx.node_id.clone(),
        mode: mode.to_owned(),
        doc_path: doc_path.to_owned(),
        content,
        overwrite,
        source_kind: "graph_runtime".into(),
        // Ingest writes for this run under our claim: if a successor has taken the run over,
        // nothing of this call lands.
        fence: ctx.backends.store.run_fence(&ctx.project, &ctx.run_id),
    };
    // Ingest appends events of its own: resent only when it never reached the service.
    let call =
        ctx.backends
            .ingest_dependency
            .call(cairn_server::retry::Safety::Once, "Ingest", || {
                let (mut client, req) = (client.clone(), req.clone());
                async move { client.ingest(req).await }
            });
    match tokio::time::timeout(INGEST_TIMEOUT, call).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(format!(
            "ingest of {doc_path} failed: {} ({:?})",
            s.message(),
            s.code()
        )),
        Err(_) => Err(format!(
            "ingest of {doc_path} took longer than {}s",
            INGEST_TIMEOUT.as_secs()
        )),
    }
}

fn merge(outputs: &mut Map<String, Value>, r: &IngestResponse) {
    let written: Vec<String> = r
        .artifacts
        .iter()
        .filter(|a| a.status == BlockStatus::Written as i32)
        .map(|a| a.workspace_path.clone())
        .collect();
    let s = r.summary.unwrap_or_default();
    outputs.insert("workspace_files".into(), json!(written));
    outputs.insert(
        "ingest".into(),
        json!({
            "enabled": r.enabled,
            "manifest_path": r.manifest_path,
            "written": s.written,
            "skipped": s.skipped,
            "rejected": s.rejected,
        }),
    );
}

/// The explicit `ingest` node: ingests a document already in the project.
pub async fn run(ctx: &NodeCtx, spec: &IngestNode) -> Result<NodeSuccess, NodeError> {
    let doc_path = project_path(&ctx.scope, "doc_path", &spec.doc_path)?;
    let mode = spec
        .mode
        .clone()
        .unwrap_or_else(|| ctx.scope.graph.mode.clone());
    let mut out = NodeSuccess::default();
    // The ingest service reads doc_path from the store when content is empty.
    match call(
        ctx,
        &doc_path,
        Bytes::new(),
        spec.overwrite || ctx.reset,
        &mode,
    )
    .await
    {
        Ok(r) => {
            let s = r.summary.unwrap_or_default();
            merge(&mut out.outputs, &r);
            out.outputs
                .insert("manifest_path".into(), r.manifest_path.clone().into());
            out.outputs.insert("written".into(), s.written.into());
            out.outputs.insert("skipped".into(), s.skipped.into());
            out.outputs.insert("rejected".into(), s.rejected.into());
            out.outputs.insert("enabled".into(), r.enabled.into());
        }
        Err(message) => {
            out.events.push(
                Ev::new(INGEST_HOOK_FAILED, &ctx.node_id)
                    .level(Level::Warning)
                    .with("doc_path", doc_path.as_str())
                    .with("error", message.clone()),
            );
            out.outputs.insert("enabled".into(), false.into());
            out.outputs.insert("workspace_files".into(), json!([]));
            out.outputs.insert("written".into(), 0.into());
            out.outputs.insert("skipped".into(), 0.into());
            out.outputs.insert("rejected".into(), 0.into());
            out.outputs.insert("manifest_path".into(), "".into());
            out.outputs
                .insert("ingest".into(), json!({"error": message}));
            // Nothing reached the workspace: later nodes read an empty list, not a hole.
            out.outputs.insert("workspace_files".into(), json!([]));
        }
    }
    Ok(out)
}

cairn_node::unit_kind!(
    /// The `ingest` kind.
    IngestKind,
    "ingest",
    cairn_graph::NodeKind::Ingest,
    run
);
