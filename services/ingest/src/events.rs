//! The `ingest.*` run events (error policy: events.jsonl records success, skip, refusal
//! and failure). They carry paths, sizes, digests and reasons, never file contents.

use cairn_proto::v1::EventInput;
use serde_json::json;

use crate::block::Block;
use crate::manifest::{Severity, Source, Summary};

pub const STARTED: &str = "ingest.started";
pub const COMPLETED: &str = "ingest.completed";
pub const FAILED: &str = "ingest.failed";

fn event(kind: &str, node_id: &str, severity: Severity, data: serde_json::Value) -> EventInput {
    EventInput {
        r#type: kind.to_owned(),
        node_id: node_id.to_owned(),
        level: severity.to_proto() as i32,
        data_json: data.to_string(),
    }
}

/// `ingest.started`: which document, how big, its digest.
pub fn started(node_id: &str, source: &Source, doc_bytes: u64, doc_sha256: &str) -> EventInput {
    event(
        STARTED,
        node_id,
        Severity::Info,
        json!({
            "doc_path": source.doc_path,
            "mode": source.mode,
            "source_kind": source.kind,
            "bytes": doc_bytes,
            "sha256": doc_sha256,
        }),
    )
}

/// `ingest.block.written|skipped|rejected` for one block; `outcome` is the store's word for a
/// written block (created, unchanged, overwritten).
pub fn block(node_id: &str, block: &Block, outcome: Option<&str>) -> EventInput {
    let path = if block.workspace_path.is_empty() {
        &block.declared_file
    } else {
        &block.workspace_path
    };
    let mut data = json!({
        "index": block.index,
        "path": path,
        "declared_file": block.declared_file,
        "lang": block.lang,
        "reason": block.reason,
        "bytes": block.bytes,
        "sha256": block.sha256,
    });
    if let Some(map) = data.as_object_mut() {
        if !block.detail.is_empty() {
            map.insert("detail".into(), json!(block.detail));
        }
        if let Some(outcome) = outcome {
            map.insert("outcome".into(), json!(outcome));
        }
    }
    event(
        &format!("ingest.block.{}", block.status.as_str()),
        node_id,
        Severity::of_block(block),
        data,
    )
}

/// `ingest.completed`: the summary and where the manifest is.
pub fn completed(
    node_id: &str,
    summary: &Summary,
    manifest_path: &str,
    severity: Severity,
) -> EventInput {
    event(
        COMPLETED,
        node_id,
        severity,
        json!({ "summary": summary, "manifest_path": manifest_path }),
    )
}

/// `ingest.failed`: ingest could not do all of its job (store, I/O, document).
pub fn failed(
    node_id: &str,
    reason: &str,
    error: &str,
    summary: &Summary,
    manifest_path: &str,
) -> EventInput {
    event(
        FAILED,
        node_id,
        Severity::Error,
        json!({ "reason": reason, "error": error, "summary": summary, "manifest_path": manifest_path }),
    )
}
