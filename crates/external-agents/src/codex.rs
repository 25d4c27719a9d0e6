//! `codex exec --json`: one turn per process, a JSONL stream of thread events on stdout
//! (`thread.started` with the thread id, `turn.started`, `item.started` / `item.updated` /
//! `item.completed` with items `agent_message`, `reasoning`, `command_execution`,
//! `file_change`, ..., then `turn.completed` with usage, or `turn.failed`; `error` lines may
//! come in between). A turn is resumed with `codex exec resume <thread_id> --json`.
//!
//! Approvals: `codex exec` never asks interactively; what its approval policy refuses comes
//! back as a `command_execution` (or `file_change`) item with status `declined`. That is the
//! request for a human: the node blocks its gate, and an approved resume runs with codex's own
//! sandbox lifted (`--dangerously-bypass-approvals-and-sandbox`; cairn's sandbox still isolates
//! it, which is what that flag is meant for).

use serde_json::{json, Map, Value};

use super::{
    AdapterError, AgentAdapter, AgentEvent, ChangeKind, FileChange, StateDir, Turn, TurnKind,
    TurnUsage,
};

pub const NAME: &str = cairn_graph::DEFAULT_ADAPTER;

/// Flag of an approved turn.
pub const APPROVED_FLAG: &str = "--dangerously-bypass-approvals-and-sandbox";

pub struct CodexExec;

fn text<'a>(o: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    o.get(key).and_then(Value::as_str)
}

impl CodexExec {
    fn protocol(line: usize, message: impl Into<String>) -> AdapterError {
        AdapterError::Protocol {
            adapter: NAME,
            line,
            message: message.into(),
        }
    }

    fn item(
        line: usize,
        kind: &str,
        item: &Map<String, Value>,
    ) -> Result<AgentEvent, AdapterError> {
        let Some(ty) = text(item, "type") else {
            return Err(Self::protocol(line, format!("{kind} without item.type")));
        };
        let id = text(item, "id").unwrap_or_default().to_owned();
        let status = text(item, "status").unwrap_or_default();
        if kind != "item.completed" {
            return Ok(AgentEvent::Other);
        }
        Ok(match ty {
            "agent_message" => AgentEvent::Message {
                text: text(item, "text").unwrap_or_default().to_owned(),
            },
            "command_execution" => {
                let command = text(item, "command").unwrap_or_default().to_owned();
                if status == "declined" {
                    AgentEvent::ApprovalRequested {
                        id,
                        what: format!("run `{command}`"),
                    }
                } else {
                    AgentEvent::Command {
                        command,
                        exit_code: item.get("exit_code").and_then(Value::as_i64),
                    }
                }
            }
            "file_change" => {
                let changes = Self::changes(line, item)?;
                match status {
                    "declined" => AgentEvent::ApprovalRequested {
                        id,
                        what: format!(
                            "change {}",
                            changes
                                .iter()
                                .map(|c| format!("`{}`", c.path))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    },
                    // A patch that failed to apply changed nothing.
                    "failed" => AgentEvent::Other,
                    _ => AgentEvent::FilesChanged { changes },
                }
            }
            _ => AgentEvent::Other,
        })
    }

    fn changes(line: usize, item: &Map<String, Value>) -> Result<Vec<FileChange>, AdapterError> {
        let Some(list) = item.get("changes").and_then(Value::as_array) else {
            return Err(Self::protocol(line, "file_change without a `changes` list"));
        };
        let mut out = Vec::with_capacity(list.len());
        for c in list {
            let path = c
                .get("path")
                .and_then(Value::as_str)
                .ok_or_else(|| Self::protocol(line, "a file_change entry without `path`"))?;
            // exec writes the kind as a word; the app-server protocol as {"type": ...}.
            let kind = match c.get("kind") {
                Some(Value::String(s)) => s.as_str(),
                Some(Value::Object(o)) => text(o, "type").unwrap_or_default(),
                _ => "",
            };
            let kind = match kind {
                "add" => ChangeKind::Add,
                "delete" => ChangeKind::Delete,
                "update" => ChangeKind::Update,
                other => {
                    return Err(Self::protocol(
                        line,
                        format!(
                            "file_change kind `{other}` for {path}; expected add, update or delete"
                        ),
                    ))
                }
            };
            out.push(FileChange {
                path: path.to_owned(),
                kind,
            });
        }
        Ok(out)
    }
}

impl AgentAdapter for CodexExec {
    fn name(&self) -> &'static str {
        NAME
    }

    fn default_command(&self) -> Vec<String> {
        vec!["codex".into()]
    }

    fn state_dir(&self) -> StateDir {
        StateDir {
            name: "codex_home",
            env: "CODEX_HOME",
            // The rollouts `exec resume` reads; never auth.json, config or logs.
            keep: &["sessions/"],
        }
    }

    fn argv(&self, command: &[String], turn: &Turn) -> Result<Vec<String>, AdapterError> {
        if command.is_empty() {
            return Err(AdapterError::Request {
                adapter: NAME,
                message: "empty command".into(),
            });
        }
        if turn.prompt.trim().is_empty() {
            return Err(AdapterError::Request {
                adapter: NAME,
                message: "the prompt is empty".into(),
            });
        }
        let mut argv: Vec<String> = command.to_vec();
        argv.push("exec".into());
        if let TurnKind::Resume { handle } = &turn.kind {
            argv.push("resume".into());
            argv.push(handle.clone());
        }
        argv.push("--json".into());
        // cairn stages files without .git (the store refuses it).
        argv.push("--skip-git-repo-check".into());
        if turn.approved {
            argv.push(APPROVED_FLAG.into());
        }
        argv.extend(turn.extra_args.iter().cloned());
        if turn.prompt.starts_with('-') {
            argv.push("--".into());
        }
        argv.push(turn.prompt.clone());
        Ok(argv)
    }

    fn parse_line(&self, line_no: usize, line: &str) -> Result<AgentEvent, AdapterError> {
        let v: Value = serde_json::from_str(line)
            .map_err(|e| Self::protocol(line_no, format!("not JSON ({e})")))?;
        let Value::Object(o) = v else {
            return Err(Self::protocol(line_no, "not a JSON object"));
        };
        let Some(kind) = text(&o, "type") else {
            return Err(Self::protocol(line_no, "no `type`"));
        };
        Ok(match kind {
            "thread.started" => AgentEvent::SessionStarted {
                handle: text(&o, "thread_id")
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| Self::protocol(line_no, "thread.started without thread_id"))?
                    .to_owned(),
            },
            "turn.started" => AgentEvent::TurnStarted,
            "turn.completed" => {
                let u = o.get("usage").cloned().unwrap_or(Value::Null);
                let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
                AgentEvent::TurnCompleted {
                    usage: TurnUsage {
                        input_tokens: n("input_tokens"),
                        cached_input_tokens: n("cached_input_tokens"),
                        output_tokens: n("output_tokens"),
                    },
                }
            }
            "turn.failed" => AgentEvent::TurnFailed {
                message: o
                    .get("error")
                    .and_then(|e| e.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("turn failed (no message)")
                    .to_owned(),
            },
            "error" => AgentEvent::Error {
                message: text(&o, "message")
                    .unwrap_or("error (no message)")
                    .to_owned(),
            },
            "item.started" | "item.updated" | "item.completed" => match o.get("item") {
                Some(Value::Object(item)) => Self::item(line_no, kind, item)?,
                _ => return Err(Self::protocol(line_no, format!("{kind} without an item"))),
            },
            _ => AgentEvent::Other,
        })
    }

    fn vendor_session(&self, handle: &str, cwd: &str, rollout: Option<&str>) -> Value {
        let mut v = json!({
            "tool": "codex",
            "threadId": handle,
            "cwd": cwd,
            "codexHome": format!("./{}", self.state_dir().name),
        });
        if let (Some(r), Value::Object(m)) = (rollout, &mut v) {
            m.insert("rolloutPath".into(), Value::String(r.to_owned()));
        }
        v
    }

    fn handle_of(&self, vendor_session: &Value) -> Option<String> {
        vendor_session
            .get("threadId")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
    }

    fn rollout_of(&self, handle: &str, kept: &[String]) -> Option<String> {
        kept.iter()
            .filter(|p| p.starts_with("sessions/") && p.ends_with(".jsonl") && p.contains(handle))
            .max()
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<AgentEvent, AdapterError> {
        CodexExec.parse_line(1, line)
    }

    #[test]
    fn reads_the_exec_event_shapes() {
        assert_eq!(
            parse(
                r#"{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}"#
            ),
            Ok(AgentEvent::SessionStarted {
                handle: "0199a213-81c0-7800-8aa1-bbab2a035a53".into()
            })
        );
        assert_eq!(
            parse(r#"{"type":"turn.started"}"#),
            Ok(AgentEvent::TurnStarted)
        );
        assert_eq!(
            parse(
                r#"{"type":"item.completed","item":{"id":"item_3","type":"agent_message","text":"Done."}}"#
            ),
            Ok(AgentEvent::Message {
                text: "Done.".into()
            })
        );
        assert_eq!(
            parse(
                r#"{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}"#
            ),
            Ok(AgentEvent::Other)
        );
        assert_eq!(
            parse(
                r#"{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"a\n","exit_code":0,"status":"completed"}}"#
            ),
            Ok(AgentEvent::Command {
                command: "bash -lc ls".into(),
                exit_code: Some(0)
            })
        );
        assert_eq!(
            parse(
                r#"{"type":"item.completed","item":{"id":"item_2","type":"file_change","changes":[{"path":"/workspace/project/a.py","kind":"add"},{"path":"b.py","kind":"update"},{"path":"c.py","kind":{"type":"delete"}}],"status":"completed"}}"#
            ),
            Ok(AgentEvent::FilesChanged {
                changes: vec![
                    FileChange {
                        path: "/workspace/project/a.py".into(),
                        kind: ChangeKind::Add
                    },
                    FileChange {
                        path: "b.py".into(),
                        kind: ChangeKind::Update
                    },
                    FileChange {
                        path: "c.py".into(),
                        kind: ChangeKind::Delete
                    },
                ]
            })
        );
        assert_eq!(
            parse(
                r#"{"type":"turn.completed","usage":{"input_tokens":1200,"cached_input_tokens":200,"output_tokens":345}}"#
            ),
            Ok(AgentEvent::TurnCompleted {
                usage: TurnUsage {
                    input_tokens: 1200,
                    cached_input_tokens: 200,
                    output_tokens: 345
                }
            })
        );
        assert_eq!(
            parse(r#"{"type":"turn.failed","error":{"message":"model overloaded"}}"#),
            Ok(AgentEvent::TurnFailed {
                message: "model overloaded".into()
            })
        );
        assert_eq!(
            parse(r#"{"type":"error","message":"stream disconnected"}"#),
            Ok(AgentEvent::Error {
                message: "stream disconnected".into()
            })
        );
        // Types this build does not know are kept, not refused.
        assert_eq!(
            parse(r#"{"type":"thread.compacted"}"#),
            Ok(AgentEvent::Other)
        );
        assert_eq!(
            parse(r#"{"type":"item.completed","item":{"id":"i","type":"reasoning","text":"hm"}}"#),
            Ok(AgentEvent::Other)
        );
    }

    #[test]
    fn declined_items_are_approval_requests() {
        assert_eq!(
            parse(
                r#"{"type":"item.completed","item":{"id":"item_4","type":"command_execution","command":"make deploy","aggregated_output":"","exit_code":null,"status":"declined"}}"#
            ),
            Ok(AgentEvent::ApprovalRequested {
                id: "item_4".into(),
                what: "run `make deploy`".into()
            })
        );
        assert_eq!(
            parse(
                r#"{"type":"item.completed","item":{"id":"item_5","type":"file_change","changes":[{"path":"x","kind":"update"}],"status":"declined"}}"#
            ),
            Ok(AgentEvent::ApprovalRequested {
                id: "item_5".into(),
                what: "change `x`".into()
            })
        );
        // A failed patch changed nothing.
        assert_eq!(
            parse(
                r#"{"type":"item.completed","item":{"id":"i","type":"file_change","changes":[{"path":"x","kind":"update"}],"status":"failed"}}"#
            ),
            Ok(AgentEvent::Other)
        );
    }

    #[test]
    fn protocol_errors_name_the_line() {
        for bad in [
            "not json",
            "[1]",
            r#"{"no":"type"}"#,
            r#"{"type":"thread.started"}"#,
            r#"{"type":"item.completed"}"#,
            r#"{"type":"item.completed","item":{"id":"x"}}"#,
            r#"{"type":"item.completed","item":{"type":"file_change","status":"completed"}}"#,
            r#"{"type":"item.completed","item":{"type":"file_change","changes":[{"path":"a","kind":"rename"}]}}"#,
        ] {
            let e = CodexExec.parse_line(7, bad).unwrap_err();
            assert!(e.to_string().contains("line 7"), "{bad}: {e}");
        }
    }

    #[test]
    fn command_lines_of_new_resumed_and_approved_turns() {
        let cmd = vec!["codex".to_owned()];
        let start = Turn {
            kind: TurnKind::Start,
            prompt: "fix it".into(),
            approved: false,
            extra_args: vec!["--model".into(), "o4".into()],
        };
        assert_eq!(
            CodexExec.argv(&cmd, &start).unwrap(),
            [
                "codex",
                "exec",
                "--json",
                "--skip-git-repo-check",
                "--model",
                "o4",
                "fix it"
            ]
        );
        let resume = Turn {
            kind: TurnKind::Resume {
                handle: "t-1".into(),
            },
            prompt: "-go on".into(),
            approved: true,
            extra_args: vec![],
        };
        assert_eq!(
            CodexExec.argv(&cmd, &resume).unwrap(),
            [
                "codex",
                "exec",
                "resume",
                "t-1",
                "--json",
                "--skip-git-repo-check",
                APPROVED_FLAG,
                "--",
                "-go on"
            ]
        );
        let empty = Turn {
            prompt: " ".into(),
            ..start
        };
        assert!(CodexExec.argv(&cmd, &empty).is_err());
    }

    #[test]
    fn vendor_session_round_trips_the_thread_id() {
        let v = CodexExec.vendor_session(
            "t-9",
            "/workspace/project",
            Some("./codex_home/sessions/r-t-9.jsonl"),
        );
        assert_eq!(v["tool"], "codex");
        assert_eq!(v["codexHome"], "./codex_home");
        assert_eq!(v["rolloutPath"], "./codex_home/sessions/r-t-9.jsonl");
        assert_eq!(CodexExec.handle_of(&v).as_deref(), Some("t-9"));
        assert_eq!(CodexExec.handle_of(&json!({"threadId": ""})), None);
        let kept = vec![
            "sessions/2025/01/01/rollout-x-t-9.jsonl".to_owned(),
            "sessions/other.jsonl".to_owned(),
        ];
        assert_eq!(
            CodexExec.rollout_of("t-9", &kept).as_deref(),
            Some("sessions/2025/01/01/rollout-x-t-9.jsonl")
        );
    }
}
