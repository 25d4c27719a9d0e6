//! The tools of `tool_call` nodes. Built-in tools (this file) read the project through the
//! store (never the host filesystem) and have fixed, documented outputs, so references to them
//! are checked at submit time. Installed tools (`<tools_dir>/<name>/tool.toml`, installed.rs)
//! are programs run as subprocesses (legacy backend, host.rs) or on a sandbox runner
//! (`sandbox.runner.features.use_for_tools`, sandboxed.rs), with the same fixed outputs.
//! Tools that change things are node types of their own (write_file, ...) or installed tools
//! that write through their `output_prefix`.

pub mod host;
pub mod installed;
pub mod manifest;
pub mod sandboxed;

use serde_json::{json, Map, Value};

use crate::nodes::NodeError;
use crate::store::Store;

/// Tools and their required arguments.
const TOOLS: &[(&str, &[&str])] = &[
    ("read_file", &["path"]),
    ("list_files", &["prefix"]),
    ("stat", &["path"]),
    ("json_get", &["path"]),
    ("echo", &["value"]),
];

/// Outputs of every installed tool (`result` is the JSON object it printed).
pub const INSTALLED_OUTPUTS: &[&str] = &[
    "result",
    "written_files",
    "exit_code",
    "duration_ms",
    "stderr",
    "backend",
    "result_path",
];

/// Names of the built-in tools.
pub fn builtin_names() -> Vec<&'static str> {
    TOOLS.iter().map(|(n, _)| *n).collect()
}

pub fn is_builtin(tool: &str) -> bool {
    TOOLS.iter().any(|(n, _)| *n == tool)
}

/// The outputs of `tool`, or None for a name no tool can have.
pub fn outputs(tool: &str) -> Option<&'static [&'static str]> {
    Some(match tool {
        "read_file" => &["path", "text", "bytes", "sha256"],
        "list_files" => &["paths", "count"],
        "stat" => &["path", "exists", "kind", "bytes", "sha256"],
        "json_get" => &["value"],
        "echo" => &["value"],
        t if manifest::valid_name(t) => INSTALLED_OUTPUTS,
        _ => return None,
    })
}

/// Checks a tool name and its arguments at submit time. Installed tools are checked against
/// the orchestrator's tools_dir when the run is submitted (runs.rs), not here.
pub fn check(tool: &str, args: &Map<String, Value>) -> Result<(), String> {
    let names = builtin_names();
    let Some((_, required)) = TOOLS.iter().find(|(n, _)| *n == tool) else {
        if manifest::valid_name(tool) {
            return Ok(());
        }
        return Err(format!(
            "unknown tool `{tool}`; built-in tools: {} (installed tools are named [a-z0-9_-])",
            names.join(", ")
        ));
    };
    for r in *required {
        if !args.contains_key(*r) {
            return Err(format!("tool `{tool}` needs argument `{r}`"));
        }
    }
    Ok(())
}

fn text_arg<'a>(args: &'a Map<String, Value>, key: &str) -> Result<&'a str, NodeError> {
    args.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| NodeError::refused(format!("argument `{key}` must be text")))
}

fn checked_path(p: &str) -> Result<(), NodeError> {
    pathguard::validate(p)
        .map(|_| ())
        .map_err(|rej| NodeError::refused(format!("`{p}`: {rej}")))
}

/// Runs `tool` with rendered `args`; returns its outputs.
pub async fn call(
    store: &Store,
    project: &str,
    tool: &str,
    args: &Map<String, Value>,
) -> Result<Map<String, Value>, NodeError> {
    let out = match tool {
        "read_file" => {
            let path = text_arg(args, "path")?;
            checked_path(path)?;
            let bytes = store
                .get(project, path)
                .await
                .map_err(|s| NodeError::from_status(&format!("reading {path}"), &s))?
                .ok_or_else(|| NodeError::refused(format!("{path} does not exist")))?;
            let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
            json!({"path": path, "text": String::from_utf8_lossy(&bytes), "bytes": bytes.len(), "sha256": sha})
        }
        "list_files" => {
            let prefix = text_arg(args, "prefix")?.trim_end_matches('/');
            if !prefix.is_empty() {
                pathguard::validate_prefix(prefix)
                    .map_err(|rej| NodeError::refused(format!("`{prefix}`: {rej}")))?;
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
                .map(|e| e.path)
                .collect();
            json!({"count": paths.len(), "paths": paths})
        }
        "stat" => {
            let path = text_arg(args, "path")?;
            checked_path(path)?;
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
            checked_path(path)?;
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
