//! What a turn of an external agent CLI reports (its event lines folded), how its reported
//! changes are checked before anything is written back, and what a turn leaves behind: shared
//! by the live turn (live.rs), the turn answered from its record (turns.rs) and the node
//! (node.rs).

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::session::InstanceRecords;
use crate::{AdapterError, AgentAdapter, AgentEvent, ChangeKind, TurnUsage};
use cairn_graph::under_prefix;
use cairn_node::{NodeCtx, NodeError};

/// The CLI's working directory (the staged project files), relative to /workspace.
pub(crate) const PROJECT_DIR: &str = "project";
/// Parent of the CLI's state directory, relative to /workspace.
pub(crate) const STATE_ROOT: &str = ".cairn-agent";

/// Turn timeout when the node sets none.
pub const DEFAULT_TURN_TIMEOUT_S: u64 = 600;
/// Most project files / bytes staged into the sandbox.
pub(crate) const MAX_STAGED_FILES: usize = 5000;
pub(crate) const MAX_STAGED_BYTES: u64 = 256 << 20;
pub(crate) fn status_error(context: &str) -> impl Fn(tonic::Status) -> NodeError + '_ {
    move |s| NodeError::from_status(context, &s)
}

/// What one turn reported, folded from its event lines.
#[derive(Default)]
pub(crate) struct TurnReport {
    pub handle: Option<String>,
    pub messages: Vec<String>,
    /// Changed paths as the CLI wrote them, last kind per path.
    pub changes: BTreeMap<String, ChangeKind>,
    pub approvals: Vec<(String, String)>,
    pub completed: Option<TurnUsage>,
    pub failed: Vec<String>,
    pub errors: Vec<String>,
    pub protocol: Option<AdapterError>,
    pub lines: usize,
}

impl TurnReport {
    /// Reads the CLI's stdout (`truncated`: the runner cut it at its output cap).
    pub(crate) fn read(adapter: &dyn AgentAdapter, stdout: &str, truncated: bool) -> TurnReport {
        let mut r = TurnReport::parse(adapter, stdout);
        if truncated && r.protocol.is_none() {
            r.protocol = Some(AdapterError::Protocol {
                adapter: adapter.name(),
                line: r.lines,
                message: "the stream was cut at the runner's exec output cap (raise `session.exec_max_output_bytes` on the runner)".into(),
            });
        }
        r
    }

    fn parse(adapter: &dyn AgentAdapter, stdout: &str) -> TurnReport {
        let mut r = TurnReport::default();
        for (i, line) in stdout.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            r.lines += 1;
            match adapter.parse_line(i + 1, line) {
                Ok(AgentEvent::SessionStarted { handle }) => r.handle = Some(handle),
                Ok(AgentEvent::Message { text }) => r.messages.push(text),
                Ok(AgentEvent::FilesChanged { changes }) => {
                    for c in changes {
                        r.changes.insert(c.path, c.kind);
                    }
                }
                Ok(AgentEvent::ApprovalRequested { id, what }) => r.approvals.push((id, what)),
                Ok(AgentEvent::TurnCompleted { usage }) => r.completed = Some(usage),
                Ok(AgentEvent::TurnFailed { message }) => r.failed.push(message),
                Ok(AgentEvent::Error { message }) => r.errors.push(message),
                Ok(AgentEvent::TurnStarted | AgentEvent::Command { .. } | AgentEvent::Other) => {}
                Err(e) => {
                    if r.protocol.is_none() {
                        r.protocol = Some(e);
                    }
                }
            }
        }
        r
    }

    /// Why the turn failed, if it did.
    pub(crate) fn failure(&self, adapter: &str, exit_code: i32) -> Option<String> {
        if let Some(p) = &self.protocol {
            return Some(p.to_string());
        }
        if !self.failed.is_empty() {
            return Some(format!(
                "{adapter}: turn failed: {}",
                self.failed.join("; ")
            ));
        }
        if self.completed.is_none() {
            let why = if self.errors.is_empty() {
                format!(
                    "exited with code {exit_code} before its turn completed ({} event lines)",
                    self.lines
                )
            } else {
                format!(
                    "errors before its turn completed: {}",
                    self.errors.join("; ")
                )
            };
            return Some(format!("{adapter}: {why}"));
        }
        if exit_code != 0 {
            return Some(format!(
                "{adapter}: exited with code {exit_code} after its turn"
            ));
        }
        None
    }
}

/// The reported changes as paths relative to `workspace`, each checked before anything is
/// written: all or nothing.
pub(crate) fn plan_changes(
    adapter: &dyn AgentAdapter,
    report: &TurnReport,
    workspace: &str,
) -> Result<Vec<(String, ChangeKind)>, NodeError> {
    let mut planned = Vec::with_capacity(report.changes.len());
    for (reported, kind) in &report.changes {
        match project_relative(reported) {
            Some(rel) if under_prefix(&format!("{workspace}/{rel}"), workspace) => {
                planned.push((rel, *kind))
            }
            _ => {
                return Err(NodeError::refused(format!(
                    "{} changed `{reported}`, which is outside its working directory /workspace/{PROJECT_DIR}; none of its changes were written back",
                    adapter.name()
                )))
            }
        }
    }
    Ok(planned)
}

/// The agent's own words of this attempt, as `artifacts/turn-<turn>-attempt-<attempt>.md`.
pub(crate) async fn write_messages(
    ctx: &NodeCtx,
    records: &InstanceRecords,
    report: &TurnReport,
) -> Result<(), NodeError> {
    if report.messages.is_empty() {
        return Ok(());
    }
    let rel = format!("artifacts/turn-{}-attempt-{}.md", ctx.turn, ctx.attempt);
    records
        .put(&rel, Bytes::from(report.messages.join("\n\n")))
        .await
        .map_err(status_error("writing the agent's messages"))
}

/// A path the CLI reported, as a path inside the staged project (None: outside it).
fn project_relative(path: &str) -> Option<String> {
    let root = format!("/workspace/{PROJECT_DIR}/");
    let rel = match path.strip_prefix(&root) {
        Some(r) => r,
        None if path.starts_with('/') => return None,
        None => path.strip_prefix("./").unwrap_or(path),
    };
    pathguard::validate(rel).ok().map(|_| rel.to_owned())
}

/// What a turn left behind (run live, or answered from its record).
pub(crate) struct TurnDone {
    pub report: TurnReport,
    pub exit_code: i32,
    pub timed_out: bool,
    pub timeout_s: u64,
    pub written: Vec<cairn_proto::v1::PutResponse>,
    pub deleted: Vec<String>,
    /// Kept state files (relative to the state dir).
    pub kept: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_paths_must_stay_in_the_project() {
        assert_eq!(
            project_relative("/workspace/project/src/a.rs").as_deref(),
            Some("src/a.rs")
        );
        assert_eq!(project_relative("src/a.rs").as_deref(), Some("src/a.rs"));
        assert_eq!(project_relative("./a.rs").as_deref(), Some("a.rs"));
        assert_eq!(project_relative("/etc/passwd"), None);
        assert_eq!(project_relative("/workspace/.cairn-agent/x"), None);
        assert_eq!(project_relative("../up"), None);
        assert_eq!(project_relative("/workspace/project/../x"), None);
    }

    #[test]
    fn a_turn_fails_unless_it_completes() {
        let a = crate::CodexExec;
        let ok = TurnReport::parse(&a, "{\"type\":\"thread.started\",\"thread_id\":\"t\"}\n{\"type\":\"error\",\"message\":\"retrying\"}\n{\"type\":\"turn.completed\",\"usage\":{}}\n");
        assert_eq!(ok.failure("codex-exec", 0), None);
        assert_eq!(ok.handle.as_deref(), Some("t"));
        assert!(ok.failure("codex-exec", 1).unwrap().contains("code 1"));
        let cut = TurnReport::parse(
            &a,
            "{\"type\":\"turn.started\"}\n{\"type\":\"error\",\"message\":\"boom\"}\n",
        );
        assert!(cut.failure("codex-exec", 1).unwrap().contains("boom"));
        let failed = TurnReport::parse(
            &a,
            "{\"type\":\"turn.failed\",\"error\":{\"message\":\"quota\"}}\n",
        );
        assert!(failed.failure("codex-exec", 1).unwrap().contains("quota"));
        let garbage = TurnReport::parse(&a, "{\"type\":\"turn.completed\"}\nnot json\n");
        assert!(garbage.failure("codex-exec", 0).unwrap().contains("line 2"));
    }
}
