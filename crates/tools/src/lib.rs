//! The tools of `tool_call` nodes. Built-in tools (this file) read the project through the
//! store (never the host filesystem) and have fixed, documented outputs, so references to them
//! are checked at submit time. Installed tools (`<tools_dir>/<name>/tool.toml`, installed.rs)
//! are programs run as subprocesses (legacy backend, host.rs) or on a sandbox runner
//! (`sandbox.runner.features.use_for_tools`, sandboxed.rs), with the same fixed outputs.
//! Tools that change things are node types of their own (write_file, ...) or installed tools
//! that write through their `output_prefix`. The `tool_call` node kind is node.rs.
//! Depends on the node API (cairn-node), the graph language and the service clients; never on
//! the orchestrator.

pub mod host;
pub mod installed;
pub mod manifest;
pub mod node;
pub mod sandboxed;

use serde_json::{json, Map, Value};

use cairn_node::NodeError;
use cairn_store_client::Store;

pub use cairn_graph::tools::{builtin_names, check, is_builtin, outputs, INSTALLED_OUTPUTS};

fn text_arg<'a>(args: &'a Map<String, Value>, key: &str) -> Result<&'a str, NodeError> {
    args.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| NodeError::refused(format!("argument `{key}` must be text")))
}

/// A path a built-in tool reads for a node of `run_id`: valid, and not another run's records.
fn checked_path(p: &str, run_id: &str) -> Result<(), NodeError> {
    pathguard::validate(p)
        .map(|_| ())
        .map_err(|rej| NodeError::refused(format!("`{p}`: {rej}")))?;
    cairn_node::check_access(run_id, "path", p, cairn_node::Access::Read)
}

/// Runs `tool` with rendered `args` for a node of `run_id`; returns its outputs.
pub async fn call(
    store: &Store,
    project: &str,
    run_id: &str,
    tool: &str,
    args: &Map<String, Value>,
) -> Result<Map<String, Value>, NodeError> {
    let out = match tool {
        "read_file" => {
            let path = text_arg(args, "path")?;
            checked_path(path, run_id)?;
            let bytes = store
                .get(project, path)
                .await
                .map_err(|s| NodeError::from_status(&format!("reading {path}"), &s))?
                .ok_or_else(|| NodeError::refused(format!("{path} does not exist")))?;
            let sha = cairn_sha256::sha256_hex(&bytes);
            json!({"path": path, "text": String::from_utf8_lossy(&bytes), "bytes": bytes.len(), "sha256": sha})
        }
        "list_files" => {
            let prefix = text_arg(args, "prefix")?.trim_end_matches('/');
            if !prefix.is_empty() {
                pathguard::validate_prefix(prefix)
                    .map_err(|rej| NodeError::refused(format!("`{prefix}`: {rej}")))?;
                cairn_node::check_access(run_id, "prefix", prefix, cairn_node::Access::Read)?;
            }
            let recursive = args
                .get("recursive")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            let entries = store
                .list(project, prefix, recursive)
                .await
                .map_err(|s| NodeError::from_status(&format!("listing {prefix}"), &s))?;
            let paths: Vec<String> = entries
                .into_iter()
                .filter(|e| e.kind == cairn_proto::v1::EntryKind::File as i32)
                // The whole project's listing leaves out other runs' records.
                .filter(|e| pathguard::records::check_node_read(&e.path, run_id).is_ok())
                .map(|e| e.path)
                .collect();
            json!({"count": paths.len(), "paths": paths})
        }
        "stat" => {
            let path = text_arg(args, "path")?;
            checked_path(path, run_id)?;
            match store
                .stat(project, path, true)
                .await
                .map_err(|s| NodeError::from_status(&format!("stat {path}"), &s))?
            {
                Some(info) => {
                    let kind = match cairn_proto::v1::EntryKind::try_from(info.kind) {
                        Ok(cairn_proto::v1::EntryKind::File) => "file",
                        Ok(cairn_proto::v1::EntryKind::Directory) => "directory",
                        _ => "other",
                    };
                    json!({"path": path, "exists": true, "kind": kind, "bytes": info.size_bytes, "sha256": info.sha256})
                }
                None => {
                    json!({"path": path, "exists": false, "kind": "", "bytes": 0, "sha256": ""})
                }
            }
        }
        "json_get" => {
            let path = text_arg(args, "path")?;
            checked_path(path, run_id)?;
            let bytes = store
                .get(project, path)
                .await
                .map_err(|s| NodeError::from_status(&format!("reading {path}"), &s))?
                .ok_or_else(|| NodeError::refused(format!("{path} does not exist")))?;
            let doc: Value = serde_json::from_slice(&bytes)
                .map_err(|e| NodeError::refused(format!("{path} is not JSON: {e}")))?;
            let pointer = args.get("pointer").and_then(Value::as_str).unwrap_or("");
            let value = doc.pointer(pointer).cloned().ok_or_else(|| {
                NodeError::refused(format!("{path} has nothing at JSON pointer `{pointer}`"))
            })?;
            json!({ "value": value })
        }
        "echo" => json!({ "value": args.get("value").cloned().unwrap_or(Value::Null) }),
        other => return Err(NodeError::refused(format!("unknown tool `{other}`"))),
    };
    match out {
        Value::Object(m) => Ok(m),
        _ => Ok(Map::new()),
    }
}
