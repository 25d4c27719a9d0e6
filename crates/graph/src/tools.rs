//! The vocabulary of `tool_call` nodes: the built-in tools with their required arguments and
//! fixed outputs, and the names installed tools may have (every installed tool has the same
//! outputs). Running tools is the orchestrator's business, not this crate's.

use serde_json::{Map, Value};

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
        t if valid_name(t) => INSTALLED_OUTPUTS,
        _ => return None,
    })
}

/// Checks a tool name and its arguments at submit time. Installed tools are checked against
/// the orchestrator's tools_dir when the run is submitted (runs.rs), not here.
pub fn check(tool: &str, args: &Map<String, Value>) -> Result<(), String> {
    let names = builtin_names();
    let Some((_, required)) = TOOLS.iter().find(|(n, _)| *n == tool) else {
        if valid_name(tool) {
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

/// Names of installed tools: `[a-z0-9_-]`, 1-64 (also keeps lookups inside tools_dir).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}
