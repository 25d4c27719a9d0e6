//! The seven tools of the code delivery agent: their JSON schemas as offered to
//! the model, and the parsing of the arguments the model wrote. Parsing never fails the task:
//! a malformed call becomes a message the model reads as the tool's result.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::ArchiveFormat;
use cairn_agents::ToolSpec;

pub const READ: &str = "read";
pub const WRITE: &str = "write";
pub const GLOB: &str = "glob";
pub const GREP: &str = "grep";
pub const RUN_BASH_COMMAND: &str = "run_bash_command";
pub const TODO: &str = "todo";
pub const END: &str = "end";

/// The tool names, in the order the model is shown them.
pub const NAMES: [&str; 7] = [READ, WRITE, GLOB, GREP, RUN_BASH_COMMAND, TODO, END];

/// The tools as offered to the model (OpenAI `tools[].function`).
pub fn specs() -> Vec<ToolSpec> {
    let spec = |name: &str, description: &str, parameters: Value| ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters,
    };
    vec![
        spec(
            READ,
            "Read a text file of the workspace (/workspace).",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to /workspace."},
                    "max_chars": {"type": "integer", "minimum": 1, "description": "Return at most this many characters."}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
        ),
        spec(
            WRITE,
            "Write a file of the workspace; parent directories are created.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to /workspace."},
                    "content": {"type": "string"},
                    "mode": {"type": "string", "enum": ["overwrite", "append"], "default": "overwrite"}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        ),
        spec(
            GLOB,
            "List workspace files matching a glob pattern (`**` crosses directories).",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Glob such as `src/**/*.py`."},
                    "base_path": {"type": "string", "description": "Directory relative to /workspace to search from."}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        ),
        spec(
            GREP,
            "Search workspace file contents; returns `file:line:content` lines.",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "path": {"type": "string", "description": "File or directory relative to /workspace (default: all of it)."},
                    "is_regex": {"type": "boolean", "default": false},
                    "case_sensitive": {"type": "boolean", "default": false},
                    "max_matches": {"type": "integer", "minimum": 1}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        ),
        spec(
            RUN_BASH_COMMAND,
            "Run a command with `bash -lc` in the task's sandbox; returns exit_code, stdout and stderr.",
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout_seconds": {"type": "integer", "minimum": 1},
                    "workdir": {"type": "string", "description": "Directory relative to /workspace (default: /workspace)."}
                },
                "required": ["command"],
                "additionalProperties": false
            }),
        ),
        spec(
            TODO,
            "Track the task's to-do items (pending, in_progress, completed); the board is kept with the run.",
            json!({
                "type": "object",
                "properties": {
                    "action": {"type": "string", "enum": ["add", "list", "update", "remove", "clear"]},
                    "item_id": {"type": "integer", "minimum": 1, "description": "For update and remove."},
                    "content": {"type": "string", "description": "For add (required) and update."},
                    "status": {"type": "string", "enum": ["pending", "in_progress", "completed"], "description": "For add and update."}
                },
                "required": ["action"],
                "additionalProperties": false
            }),
        ),
        spec(
            END,
            "Finish the task: pack the workspace (leaving out what exclude_patterns match), store the archive and deliver it to the target. Call it once, when code and documentation are complete.",
            json!({
                "type": "object",
                "properties": {
                    "exclude_patterns": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "Glob patterns of workspace paths to leave out, e.g. .git/**, node_modules/**, __pycache__/**."
                    },
                    "archive_name": {"type": "string", "description": "File name of the archive (no directories)."},
                    "archive_format": {"type": "string", "enum": ["zip", "tar.gz"]},
                    "summary": {"type": "string", "description": "What was delivered, for the recipient."}
                },
                "required": ["exclude_patterns"],
                "additionalProperties": false
            }),
        ),
    ]
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    pub path: String,
    #[serde(default)]
    pub max_chars: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteMode {
    #[default]
    Overwrite,
    Append,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    pub path: String,
    pub content: String,
    #[serde(default)]
    pub mode: WriteMode,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobArgs {
    pub pattern: String,
    #[serde(default)]
    pub base_path: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    pub pattern: String,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub is_regex: bool,
    #[serde(default)]
    pub case_sensitive: bool,
    #[serde(default)]
    pub max_matches: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BashArgs {
    pub command: String,
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    #[serde(default)]
    pub workdir: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TodoAction {
    Add,
    List,
    Update,
    Remove,
    Clear,
}

/// not done / in progress / done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    #[serde(alias = "todo")]
    Pending,
    #[serde(alias = "doing")]
    InProgress,
    #[serde(alias = "done")]
    Completed,
}

impl TodoStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TodoStatus::Pending => "pending",
            TodoStatus::InProgress => "in_progress",
            TodoStatus::Completed => "completed",
        }
    }
}

/// An item id as a number or a numeric string (models write both).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
enum IdArg {
    Number(u64),
    Text(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTodoArgs {
    action: TodoAction,
    #[serde(default)]
    item_id: Option<IdArg>,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    status: Option<TodoStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TodoArgs {
    pub action: TodoAction,
    pub item_id: Option<u64>,
    pub content: Option<String>,
    pub status: Option<TodoStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndArgs {
    pub exclude_patterns: Vec<String>,
    #[serde(default)]
    pub archive_name: Option<String>,
    #[serde(default)]
    pub archive_format: Option<ArchiveFormat>,
    #[serde(default)]
    pub summary: Option<String>,
}

/// A parsed tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Read(ReadArgs),
    Write(WriteArgs),
    Glob(GlobArgs),
    Grep(GrepArgs),
    RunBashCommand(BashArgs),
    Todo(TodoArgs),
    End(EndArgs),
}

fn args<T: DeserializeOwned>(tool: &str, value: Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| {
        let required = specs()
            .into_iter()
            .find(|s| s.name == tool)
            .map(|s| s.parameters)
            .unwrap_or(Value::Null);
        format!(
            "invalid arguments for `{tool}`: {e}. The arguments must match this JSON schema: {required}"
        )
    })
}

/// Parses the call `name(arguments)`; the error is the message the model gets back.
pub fn parse(name: &str, arguments: &str) -> Result<Call, String> {
    if !NAMES.contains(&name) {
        return Err(format!(
            "unknown tool `{name}`; the tools are {}",
            NAMES.join(", ")
        ));
    }
    let text = arguments.trim();
    let value: Value = if text.is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_str(text).map_err(|e| {
            format!("the arguments of `{name}` are not valid JSON ({e}); send one JSON object")
        })?
    };
    if !value.is_object() {
        return Err(format!(
            "the arguments of `{name}` must be a JSON object, not {}",
            kind(&value)
        ));
    }
    Ok(match name {
        READ => Call::Read(args(name, value)?),
        WRITE => Call::Write(args(name, value)?),
        GLOB => Call::Glob(args(name, value)?),
        GREP => Call::Grep(args(name, value)?),
        RUN_BASH_COMMAND => Call::RunBashCommand(args(name, value)?),
        TODO => {
            let raw: RawTodoArgs = args(name, value)?;
            let item_id = match raw.item_id {
                None => None,
                Some(IdArg::Number(n)) => Some(n),
                Some(IdArg::Text(t)) => {
                    Some(t.trim().trim_start_matches('#').parse().map_err(|_| {
                        format!("invalid arguments for `todo`: item_id `{t}` is not a number")
                    })?)
                }
            };
            Call::Todo(TodoArgs {
                action: raw.action,
                item_id,
                content: raw.content,
                status: raw.status,
            })
        }
        _ => Call::End(args(name, value)?),
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_tools_and_nothing_else() {
        let names: Vec<String> = specs().into_iter().map(|s| s.name).collect();
        assert_eq!(names, NAMES);
        for s in specs() {
            assert_eq!(s.parameters["type"], "object", "{}", s.name);
            assert_eq!(s.parameters["additionalProperties"], false, "{}", s.name);
        }
        let end = specs().pop().unwrap();
        assert_eq!(end.parameters["required"], json!(["exclude_patterns"]));
        assert_eq!(
            end.parameters["properties"]["archive_format"]["enum"],
            json!(["zip", "tar.gz"])
        );
    }

    #[test]
    fn parses_good_calls() {
        assert_eq!(
            parse(READ, r#"{"path": "a.py", "max_chars": 10}"#).unwrap(),
            Call::Read(ReadArgs {
                path: "a.py".into(),
                max_chars: Some(10)
            })
        );
        assert_eq!(
            parse(WRITE, r#"{"path": "a", "content": "x", "mode": "append"}"#).unwrap(),
            Call::Write(WriteArgs {
                path: "a".into(),
                content: "x".into(),
                mode: WriteMode::Append
            })
        );
        assert_eq!(
            parse(
                TODO,
                r##"{"action": "update", "item_id": "#2", "status": "done"}"##
            )
            .unwrap(),
            Call::Todo(TodoArgs {
                action: TodoAction::Update,
                item_id: Some(2),
                content: None,
                status: Some(TodoStatus::Completed)
            })
        );
        let Call::End(e) = parse(
            END,
            r#"{"exclude_patterns": [".git/**"], "archive_format": "tar.gz"}"#,
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(e.archive_format, Some(ArchiveFormat::TarGz));
        assert!(matches!(
            parse(GLOB, "").unwrap_err().as_str(),
            m if m.contains("missing field `pattern`")
        ));
    }

    #[test]
    fn malformed_calls_are_messages() {
        let e = parse("rm", "{}").unwrap_err();
        assert!(
            e.contains("unknown tool `rm`") && e.contains("run_bash_command"),
            "{e}"
        );
        let e = parse(READ, "{\"path\": ").unwrap_err();
        assert!(e.contains("not valid JSON"), "{e}");
        let e = parse(READ, "[1]").unwrap_err();
        assert!(e.contains("must be a JSON object, not an array"), "{e}");
        let e = parse(END, "{}").unwrap_err();
        assert!(e.contains("missing field `exclude_patterns`"), "{e}");
        let e = parse(END, r#"{"exclude_patterns": [], "archive_format": "rar"}"#).unwrap_err();
        assert!(e.contains("rar"), "{e}");
        let e = parse(RUN_BASH_COMMAND, r#"{"command": "ls", "sudo": true}"#).unwrap_err();
        assert!(e.contains("unknown field `sudo`"), "{e}");
        let e = parse(TODO, r#"{"action": "remove", "item_id": "two"}"#).unwrap_err();
        assert!(e.contains("not a number"), "{e}");
    }
}
