//! The ingest hook and the explicit `ingest` node: a document's strict code fences
//! become workspace files through the ingest service. Fail-open: whatever goes wrong is
//! recorded (`ingest.hook_failed` at warning level, the manifest), `workspace_files` is an
//! empty list, and the run goes on. Blocks that were not written (rejected, skipped) are
//! listed in the node's `not_written` output and an `ingest.incomplete` warning.

use std::time::Duration;

use bytes::Bytes;
use cairn_proto::v1::{BlockStatus, IngestRequest, IngestResponse, Level, OverwritePolicy};
use serde_json::{json, Value};

use super::{project_path, Access, NodeCtx, NodeError, NodeSuccess};
use cairn_graph::{IngestNode, Overwrite};
use cairn_node::events::{Ev, INGEST_HOOK_FAILED, INGEST_INCOMPLETE};

const INGEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Most blocks listed in `not_written` and its event (the manifest has them all).
const MAX_LISTED: usize = 100;

/// The policy sent to ingest: a node run again (rework, resume) replaces what it wrote
/// before, even if its manifest never got stored.
fn policy(ctx: &NodeCtx, graph: Overwrite) -> OverwritePolicy {
    match graph {
        Overwrite::Never => OverwritePolicy::Never,
        Overwrite::Ingested if !ctx.reset => OverwritePolicy::Ingested,
        Overwrite::Ingested | Overwrite::Always => OverwritePolicy::Always,
    }
}

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
    let overwrite = policy(ctx, ctx.node.ingest_overwrite);
    match call(ctx, doc_path, content, overwrite, &ctx.scope.graph.mode).await {
        Ok(r) => merge(ctx, doc_path, out, &r),
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
            out.outputs.insert("not_written".into(), json!([]));
        }
    }
}

async fn call(
    ctx: &NodeCtx,
    doc_path: &str,
    content: Bytes,
    overwrite: OverwritePolicy,
    mode: &str,
) -> Result<IngestResponse, String> {
    let Some(client) = ctx.backends.ingest.clone() else {
        return Err("no ingest service configured (ingest_addr)".into());
    };
    // Ingest writes for this run under a claim the store binds to our claim on it: if a
    // successor has taken the run over, nothing of this call lands.
    let claim = ctx
        .backends
        .store
        .ingest_claim(&ctx.project, &ctx.run_id)
        .await
        .map_err(|s| {
            format!(
                "ingest of {doc_path} not started: no ingest claim from the store: {} ({:?})",
                s.message(),
                s.code()
            )
        })?
        .unwrap_or_default();
    let req = IngestRequest {
        project_id: ctx.project.clone(),
        run_id: ctx.run_id.clone(),
        node_id: ctx.node_id.clone(),
        mode: mode.to_owned(),
        doc_path: doc_path.to_owned(),
        content,
        overwrite: false,
        overwrite_policy: overwrite as i32,
        source_kind: "graph_runtime".into(),
        claim,
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

/// The reply into the node's outputs; blocks not written also into a warning event.
fn merge(ctx: &NodeCtx, doc_path: &str, out: &mut NodeSuccess, r: &IngestResponse) {
    let outputs = &mut out.outputs;
    let written: Vec<String> = r
        .artifacts
        .iter()
        .filter(|a| a.status == BlockStatus::Written as i32)
        .map(|a| a.workspace_path.clone())
        .collect();
    let not_written: Vec<Value> = r
        .artifacts
        .iter()
        .filter(|a| a.status != BlockStatus::Written as i32)
        .take(MAX_LISTED)
        .map(|a| {
            let status = BlockStatus::try_from(a.status).unwrap_or(BlockStatus::Unspecified);
            json!({
                "index": a.index,
                "path": if a.workspace_path.is_empty() { &a.declared_file } else { &a.workspace_path },
                "status": status.as_str_name().trim_start_matches("BLOCK_STATUS_").to_ascii_lowercase(),
                "reason": a.reason,
            })
        })
        .collect();
    let s = r.summary.unwrap_or_default();
    outputs.insert("workspace_files".into(), json!(written));
    outputs.insert("not_written".into(), json!(not_written));
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
    if s.skipped + s.rejected > 0 {
        out.events.push(
            Ev::new(INGEST_INCOMPLETE, &ctx.node_id)
                .level(Level::Warning)
                .with("doc_path", doc_path)
                .with("manifest_path", r.manifest_path.as_str())
                .with("written", s.written)
                .with("skipped", s.skipped)
                .with("rejected", s.rejected)
                .with("not_written", json!(not_written)),
        );
    }
}

/// The explicit `ingest` node: ingests a document already in the project.
pub async fn run(ctx: &NodeCtx, spec: &IngestNode) -> Result<NodeSuccess, NodeError> {
    let doc_path = project_path(&ctx.scope, "doc_path", &spec.doc_path, Access::Read)?;
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
        policy(ctx, spec.overwrite),
        &mode,
    )
    .await
    {
        Ok(r) => {
            let s = r.summary.unwrap_or_default();
            merge(ctx, &doc_path, &mut out, &r);
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
            out.outputs.insert("not_written".into(), json!([]));
            out.outputs.insert("written".into(), 0.into());
            out.outputs.insert("skipped".into(), 0.into());
            out.outputs.insert("rejected".into(), 0.into());
            out.outputs.insert("manifest_path".into(), "".into());
            out.outputs
                .insert("ingest".into(), json!({"error": message}));
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
