//! `external_agent`: an external coding-agent CLI as an agent instance,
//! one turn per attempt, run in a sandbox session through its adapter (adapters/). The
//! project directory `workspace` is staged as the CLI's working directory and the CLI's kept
//! state (codex: `codex_home/sessions/`) is restored from the instance directory, so any
//! attempt can resume the CLI's own session by its handle. After the turn: the CLI's event
//! lines, stderr and pid are recorded under `agents/<instance>/runtime/`, its file changes are
//! written back through the store (`artifact.written`), and session.json says where the
//! instance stands:
//! - `awaiting`: the turn ended asking for approval. The node's gate blocks (`gate.blocked`,
//!   task `input-required`); a decision runs the node again, which resumes the CLI session
//!   told the decision.
//! - `dormant`: no process, handle kept (turn done or failed); a rework resumes the session.
//!
//! Each attempt has its own runner session (runner_session.rs): the project files are staged
//! into `/workspace/project`, the CLI's kept state into `/workspace/.cairn-agent/<dir>`, and
//! the turn is one unary `Exec` of the CLI (`codex exec` is one process per turn, so the whole
//! JSONL stream comes back when the turn ends; docs/adapters.md says why no streaming Exec is
//! needed). The session is closed when the attempt ends, also when it is dropped (cancel,
//! deadline): nothing outlives the attempt but what went to the store.

use std::collections::BTreeMap;

use bytes::Bytes;
use cairn_proto::v1::{OpenSessionRequest, WriteMode};
use serde_json::{json, Map, Value};

use crate::session::{
    InstanceRecords, InstanceState, Recording, SessionFile, EVENTS, PID, REQUESTS, STDERR,
};
use crate::{
    shell_quote, AdapterError, AgentAdapter, AgentEvent, ChangeKind, Turn, TurnKind, TurnUsage,
};
use cairn_graph::{under_prefix, ErrorKind, ExternalAgent, OnReject};
use cairn_node::events::{
    now, Ev, AGENT_AWAITING, AGENT_COMPLETED, AGENT_FAILED, AGENT_STARTED, GATE_BLOCKED,
};
use cairn_node::layout::front_matter;
use cairn_node::{artifact_written, NodeCtx, NodeError, NodeSuccess};
use cairn_node::{GateRecord, GateState};
use cairn_runner_client::session::RunnerSession;
use cairn_store_client::PutOptions;

/// The CLI's working directory (the staged project files), relative to /workspace.
const PROJECT_DIR: &str = "project";
/// Parent of the CLI's state directory, relative to /workspace.
const STATE_ROOT: &str = ".cairn-agent";

/// Turn timeout when the node sets none.
pub const DEFAULT_TURN_TIMEOUT_S: u64 = 600;
/// Most project files / bytes staged into the sandbox.
const MAX_STAGED_FILES: usize = 5000;
const MAX_STAGED_BYTES: u64 = 256 << 20;
/// Longest prompt given on the command line (Linux caps one argument at 128 KiB).
const MAX_PROMPT_BYTES: usize = 100 << 10;
/// Marker the turn's shell writes to stderr before it becomes the CLI.
const PID_MARKER: &str = "cairn-agent-pid ";

fn status_error(context: &str) -> impl Fn(tonic::Status) -> NodeError + '_ {
    move |s| NodeError::from_status(context, &s)
}

fn adapter_error(e: AdapterError) -> NodeError {
    match e {
        AdapterError::Request { .. } => NodeError::refused(e.to_string()),
        AdapterError::Protocol { .. } => NodeError::failed(e.to_string()),
    }
}

/// What one turn reported, folded from its event lines.
#[derive(Default)]
struct TurnReport {
    handle: Option<String>,
    messages: Vec<String>,
    /// Changed paths as the CLI wrote them, last kind per path.
    changes: BTreeMap<String, ChangeKind>,
    approvals: Vec<(String, String)>,
    completed: Option<TurnUsage>,
    failed: Vec<String>,
    errors: Vec<String>,
    protocol: Option<AdapterError>,
    lines: usize,
}

impl TurnReport {
    fn read(adapter: &dyn AgentAdapter, stdout: &str) -> TurnReport {
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
    fn failure(&self, adapter: &str, exit_code: i32) -> Option<String> {
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

/// The shell command of a turn: make the directories, point the CLI at its state, announce
/// the pid, then become the CLI.
fn turn_command(
    argv: &[String],
    env: &BTreeMap<String, String>,
    state_env: &str,
    state_dir: &str,
) -> String {
    let mut cmd = format!(
        "mkdir -p /workspace/{PROJECT_DIR} /workspace/{STATE_ROOT}/{state_dir} && cd /workspace/{PROJECT_DIR} && export {state_env}=/workspace/{STATE_ROOT}/{state_dir}"
    );
    for (k, v) in env {
        cmd.push_str(&format!(" {k}={}", shell_quote(v)));
    }
    cmd.push_str(&format!(" && echo \"{PID_MARKER}$$\" >&2 && exec"));
    for a in argv {
        cmd.push(' ');
        cmd.push_str(&shell_quote(a));
    }
    cmd
}

/// The pid marker line out of stderr: (pid, the rest of stderr).
fn split_pid(stderr: &str) -> (Option<u32>, String) {
    let mut pid = None;
    let mut rest = String::with_capacity(stderr.len());
    for line in stderr.split_inclusive('\n') {
        if pid.is_none() {
            if let Some(p) = line.trim_end().strip_prefix(PID_MARKER) {
                if let Ok(n) = p.trim().parse() {
                    pid = Some(n);
                    continue;
                }
            }
        }
        rest.push_str(line);
    }
    (pid, rest)
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

fn human_section(notes: &Option<String>) -> String {
    match notes {
        Some(n) => format!(
            "Human notes for this run (highest priority: they override other instructions):\n\n{n}\n\n---\n\n"
        ),
        None => String::new(),
    }
}

/// The prompt of a turn resumed after a human decided on what the previous one asked.
fn decision_prompt(g: &GateRecord, notes: &Option<String>) -> String {
    let asked = g.reason.clone().unwrap_or_else(|| "your request".into());
    let by = g.decided_by.clone().unwrap_or_else(|| "a human".into());
    let note = g
        .note
        .as_deref()
        .filter(|n| !n.trim().is_empty())
        .map(|n| format!(" Their note: {n}"))
        .unwrap_or_default();
    let body = if g.state == GateState::Approved {
        format!("{by} approved this request: {asked}.{note} Go ahead with it and finish the task.")
    } else {
        format!(
            "{by} declined this request: {asked}.{note} Do not do it; finish the task without it."
        )
    };
    format!("{}{body}", human_section(notes))
}

pub async fn run(ctx: &NodeCtx, spec: &ExternalAgent) -> Result<NodeSuccess, NodeError> {
    let adapter = crate::by_name(&spec.adapter).ok_or_else(|| {
        NodeError::refused(format!(
            "unknown adapter `{}`; one of {}",
            spec.adapter,
            crate::ADAPTERS.join(", ")
        ))
    })?;
    let instance = ctx.node_id.replace('.', "-");
    let agent = spec.agent.clone().unwrap_or_else(|| ctx.node_id.clone());
    let workspace = ctx
        .scope
        .render("workspace", &spec.workspace)?
        .trim_end_matches('/')
        .to_owned();
    pathguard::validate_prefix(&workspace)
        .map_err(|rej| NodeError::refused(format!("field `workspace`: `{workspace}`: {rej}")))?;
    // Staged in and written back: the records rule for writes covers both.
    cairn_node::check_access(
        &ctx.run_id,
        "workspace",
        &workspace,
        cairn_node::Access::Write,
    )?;
    if workspace.is_empty() {
        return Err(NodeError::refused(
            "field `workspace`: name a project directory such as `workspace/`",
        ));
    }
    let records = InstanceRecords::new(ctx.store().clone(), &ctx.project, &ctx.run_id, &instance);
    let prev = records
        .load_session()
        .await
        .map_err(status_error("reading the instance's session.json"))?;
    let handle = prev
        .as_ref()
        .and_then(|p| adapter.handle_of(&p.vendor_session));
    let decision = match (&prev, &ctx.gate) {
        (Some(p), Some(g))
            if p.state == InstanceState::Awaiting
                && matches!(g.state, GateState::Approved | GateState::Rejected) =>
        {
            Some(g.clone())
        }
        _ => None,
    };

    if let (Some(g), Some(p)) = (&decision, &prev) {
        if g.state == GateState::Rejected && spec.on_reject == OnReject::Fail {
            // Nothing to resume for: the instance sleeps with its handle, the node fails.
            let mut s = p.clone();
            dormant(&records, &mut s)
                .await
                .map_err(status_error("writing session.json"))?;
            let by = g.decided_by.clone().unwrap_or_else(|| "a human".into());
            let note = g
                .note
                .as_deref()
                .filter(|n| !n.is_empty())
                .map(|n| format!(": {n}"))
                .unwrap_or_default();
            let why = format!(
                "gate `{}` rejected by {by}{note} (set `on_reject: continue` to resume the agent told so)",
                ctx.node_id
            );
            ctx.progress.emit(
                Ev::new(AGENT_FAILED, &ctx.node_id)
                    .with("agent", p.agent.as_str())
                    .with("agent_instance", instance.as_str())
                    .with("error", why.clone()),
            );
            return Err(NodeError::refused(why));
        }
    }
    let notes = ctx
        .store()
        .get(&ctx.project, &ctx.run_dir().human_notes())
        .await
        .map_err(status_error("reading shared/human-notes.md"))?
        .and_then(|b| cairn_node::context::notes_for_agents(&String::from_utf8_lossy(&b)));
    let task = ctx.scope.render("prompt", &spec.prompt)?;
    let (kind, prompt, approved) = match (&handle, &decision) {
        (Some(h), Some(g)) => (
            TurnKind::Resume { handle: h.clone() },
            decision_prompt(g, &notes),
            g.state == GateState::Approved,
        ),
        // A rework, a retry or an interrupted attempt: the same CLI session goes on.
        (Some(h), None) => (
            TurnKind::Resume { handle: h.clone() },
            format!(
                "{}Continue with this task (turn {} of the run):\n\n{task}",
                human_section(&notes),
                ctx.turn
            ),
            false,
        ),
        (None, _) => (
            TurnKind::Start,
            format!("{}{task}", human_section(&notes)),
            false,
        ),
    };
    if prompt.len() > MAX_PROMPT_BYTES {
        return Err(NodeError::refused(format!(
            "the prompt is {} bytes; at most {MAX_PROMPT_BYTES} go on a command line: put the details in a project file under `{workspace}/` and refer to it",
            prompt.len()
        )));
    }
    let resumed = matches!(kind, TurnKind::Resume { .. });
    let command = if spec.command.is_empty() {
        adapter.default_command()
    } else {
        spec.command.clone()
    };
    let turn = Turn {
        kind,
        prompt,
        approved,
        extra_args: spec.args.clone(),
    };
    let argv = adapter.argv(&command, &turn).map_err(adapter_error)?;
    let state_dir = adapter.state_dir();

    let mut session = SessionFile {
        agent: agent.clone(),
        instance: instance.clone(),
        adapter: adapter.name().to_owned(),
        vendor_session: prev
            .as_ref()
            .map(|p| p.vendor_session.clone())
            .unwrap_or(Value::Null),
        recording: prev
            .as_ref()
            .map(|p| p.recording.clone())
            .unwrap_or_default(),
        started_at: prev
            .as_ref()
            .map(|p| p.started_at.clone())
            .unwrap_or_else(now),
        last_active_at: now(),
        state: InstanceState::Working,
    };
    records
        .save_session(&session)
        .await
        .map_err(status_error("writing session.json"))?;
    ctx.progress.emit(
        Ev::new(AGENT_STARTED, &ctx.node_id)
            .with("agent", agent.as_str())
            .with("agent_instance", instance.as_str())
            .with("adapter", adapter.name())
            .with("turn", ctx.turn)
            .with("resume", resumed)
            .with("approved", approved),
    );
    // A dropped attempt (cancel, deadline) took its CLI process down with the sandbox
    // session: the instance sleeps with its handle.
    let mut guard = SleepOnDrop {
        records: Some(records.clone()),
        session: session.clone(),
    };
    let result: Result<NodeSuccess, NodeError> = async {
        let fail = |message: String, kind: ErrorKind| {
            ctx.progress.emit(
                Ev::new(AGENT_FAILED, &ctx.node_id)
                    .with("agent", agent.as_str())
                    .with("agent_instance", instance.as_str())
                    .with("error", message.clone()),
            );
            NodeError::new(kind, message)
        };

        // The sandbox session of this attempt (closed on every way out: `close` or drop).
        let sandbox_id = format!("agent-{}", uuid::Uuid::new_v4());
        // The balancer picks a healthy runner; the session stays on it.
        let opened = match ctx.backends.runners.pick().await {
            Ok(runner) => {
                let req = OpenSessionRequest {
                    session_id: sandbox_id.clone(),
                    git: None,
                    network: spec.network,
                    limits: None,
                    run_id: ctx.run_id.clone(),
                    node_id: ctx.node_id.clone(),
                    // The runner's default image (the adapter's CLI is staged into it).
                    image: String::new(),
                };
                RunnerSession::open(vec![runner], req, "external_agent").await
            }
            Err(s) => Err(s),
        };
        let sandbox = match opened {
            Ok(s) => s,
            Err(s) => {
                let e = NodeError::from_status("opening the agent's sandbox session", &s);
                let _ = dormant(&records, &mut session).await;
                return Err(fail(e.message, e.kind));
            }
        };
        let outcome = turn_in(
            ctx, spec, adapter, &records, &sandbox, &workspace, &argv, resumed, &turn,
        )
        .await;
        if let Err(e) = sandbox.close().await {
            tracing::warn!(session_id = %sandbox_id, error = %e.message(), "closing the agent's sandbox session failed; the runner removes it at its next start");
        }
        let done = match outcome {
            Ok(d) => d,
            Err(e) => {
                let _ = dormant(&records, &mut session).await;
                return Err(fail(e.message, e.kind));
            }
        };

        if let Some(h) = &done.report.handle {
            let rollout = adapter
                .rollout_of(h, &done.kept)
                .map(|r| format!("./{}/{r}", state_dir.name));
            session.vendor_session =
                adapter.vendor_session(h, &format!("/workspace/{PROJECT_DIR}"), rollout.as_deref());
            session.recording = Recording {
                rollout,
                ..Recording::default()
            };
        }
        session.last_active_at = now();
        let written: Vec<String> = done.written.iter().map(|p| p.path.clone()).collect();
        let mut events: Vec<Ev> = done
            .written
            .iter()
            .map(|p| artifact_written(&ctx.node_id, p, Some(&instance)))
            .collect();

        if let Some(why) = done.report.failure(adapter.name(), done.exit_code) {
            let _ = dormant(&records, &mut session).await;
            let kind = if done.timed_out {
                ErrorKind::Timeout
            } else {
                ErrorKind::Failed
            };
            let why = if done.timed_out {
                format!(
                    "{}: the turn timed out after {}s (turn_timeout_s)",
                    adapter.name(),
                    done.timeout_s
                )
            } else {
                why
            };
            // Files it wrote before failing are recorded all the same.
            for e in events {
                ctx.progress.emit(e);
            }
            return Err(fail(format!("{why}; see {}", records.path(EVENTS)), kind));
        }

        let text = done.report.messages.last().cloned().unwrap_or_default();
        let usage = done.report.completed.clone().unwrap_or_default();
        if !done.report.approvals.is_empty() {
            if done.report.handle.is_none() && !resumed {
                let _ = dormant(&records, &mut session).await;
                return Err(fail(
                    format!(
                        "{} asked for approval but reported no session handle, so it could not be resumed after a decision",
                        adapter.name()
                    ),
                    ErrorKind::Failed,
                ));
            }
            session.state = InstanceState::Awaiting;
            records
                .save_session(&session)
                .await
                .map_err(status_error("writing session.json"))?;
            let asked: Vec<&str> = done
                .report
                .approvals
                .iter()
                .map(|(_, w)| w.as_str())
                .collect();
            let reason = format!(
                "agent `{instance}` ({}) asks for approval to {}",
                adapter.name(),
                asked.join("; ")
            );
            readme(
                ctx,
                &records,
                &agent,
                adapter.name(),
                InstanceState::Awaiting,
            )
            .await?;
            events.push(
                Ev::new(AGENT_AWAITING, &ctx.node_id)
                    .with("agent", agent.as_str())
                    .with("agent_instance", instance.as_str())
                    .with("gate_id", ctx.node_id.as_str()),
            );
            events.push(
                Ev::new(GATE_BLOCKED, &ctx.node_id)
                    .with("gate_id", ctx.node_id.as_str())
                    .with("reason", reason)
                    .with("agent_instance", instance.as_str())
                    .with(
                        "requests",
                        json!(done
                            .report
                            .approvals
                            .iter()
                            .map(|(id, what)| json!({"id": id, "what": what}))
                            .collect::<Vec<_>>()),
                    ),
            );
            return Ok(NodeSuccess {
                outputs: Map::new(),
                events,
            });
        }

        session.state = InstanceState::Dormant;
        records
            .save_session(&session)
            .await
            .map_err(status_error("writing session.json"))?;
        readme(
            ctx,
            &records,
            &agent,
            adapter.name(),
            InstanceState::Dormant,
        )
        .await?;
        events.push(
            Ev::new(AGENT_COMPLETED, &ctx.node_id)
                .with("agent", agent.as_str())
                .with("agent_instance", instance.as_str())
                .with("turn", ctx.turn)
                .with("usage", json!(usage)),
        );
        let mut outputs = Map::new();
        outputs.insert("agent_instance".into(), instance.clone().into());
        outputs.insert("adapter".into(), adapter.name().into());
        outputs.insert(
            "handle".into(),
            adapter
                .handle_of(&session.vendor_session)
                .map(Value::String)
                .unwrap_or(Value::Null),
        );
        outputs.insert("text".into(), text.into());
        outputs.insert("written_files".into(), json!(written));
        outputs.insert("deleted_files".into(), json!(done.deleted));
        outputs.insert("usage".into(), json!(usage));
        outputs.insert("turn".into(), ctx.turn.into());
        Ok(NodeSuccess { outputs, events })
    }
    .await;
    guard.records = None;
    result
}

/// Marks the instance dormant from a background task if the attempt is dropped mid-way.
struct SleepOnDrop {
    records: Option<InstanceRecords>,
    session: SessionFile,
}

impl Drop for SleepOnDrop {
    fn drop(&mut self) {
        let Some(records) = self.records.take() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut session = self.session.clone();
        handle.spawn(async move {
            let _ = dormant(&records, &mut session).await;
        });
    }
}

async fn dormant(records: &InstanceRecords, s: &mut SessionFile) -> Result<(), tonic::Status> {
    s.state = InstanceState::Dormant;
    s.last_active_at = now();
    records.save_session(s).await
}

/// What a turn left behind.
struct TurnDone {
    report: TurnReport,
    exit_code: i32,
    timed_out: bool,
    timeout_s: u64,
    written: Vec<cairn_proto::v1::PutResponse>,
    deleted: Vec<String>,
    /// Kept state files (relative to the state dir).
    kept: Vec<String>,
}

/// Stages, runs the turn, records it, writes its file changes back and keeps the CLI's state.
#[allow(clippy::too_many_arguments)]
async fn turn_in(
    ctx: &NodeCtx,
    spec: &ExternalAgent,
    adapter: &dyn AgentAdapter,
    records: &InstanceRecords,
    sandbox: &RunnerSession,
    workspace: &str,
    argv: &[String],
    resumed: bool,
    turn: &Turn,
) -> Result<TurnDone, NodeError> {
    let state = adapter.state_dir();
    // The project directory, then the CLI's kept state.
    let files = ctx
        .store()
        .list(&ctx.project, workspace, true)
        .await
        .map_err(status_error(&format!("listing {workspace}/")))?;
    let files: Vec<String> = files
        .into_iter()
        .filter(|e| e.kind == cairn_proto::v1::EntryKind::File as i32)
        .map(|e| e.path)
        .collect();
    if files.len() > MAX_STAGED_FILES {
        return Err(NodeError::refused(format!(
            "{workspace}/ holds {} files; at most {MAX_STAGED_FILES} are staged: point `workspace` at a smaller directory",
            files.len()
        )));
    }
    let mut total = 0u64;
    for path in &files {
        let Some(rel) = path
            .strip_prefix(workspace)
            .and_then(|r| r.strip_prefix('/'))
        else {
            continue;
        };
        let bytes = ctx
            .store()
            .get(&ctx.project, path)
            .await
            .map_err(status_error(&format!("reading {path}")))?
            .unwrap_or_default();
        total += bytes.len() as u64;
        if total > MAX_STAGED_BYTES {
            return Err(NodeError::refused(format!(
                "{workspace}/ holds more than {} MiB; point `workspace` at a smaller directory",
                MAX_STAGED_BYTES >> 20
            )));
        }
        sandbox
            .write(&format!("{PROJECT_DIR}/{rel}"), bytes, WriteMode::Overwrite)
            .await
            .map_err(status_error(&format!("staging {path}")))?;
    }
    let kept_prefix = records.path(state.name);
    let kept_files = ctx
        .store()
        .list(&ctx.project, &kept_prefix, true)
        .await
        .map_err(status_error(&format!("listing {kept_prefix}/")))?;
    for e in kept_files
        .into_iter()
        .filter(|e| e.kind == cairn_proto::v1::EntryKind::File as i32)
    {
        let Some(rel) = e
            .path
            .strip_prefix(&format!("{kept_prefix}/"))
            .map(str::to_owned)
        else {
            continue;
        };
        let bytes = ctx
            .store()
            .get(&ctx.project, &e.path)
            .await
            .map_err(status_error(&format!("reading {}", e.path)))?
            .unwrap_or_default();
        sandbox
            .write(
                &format!("{STATE_ROOT}/{}/{rel}", state.name),
                bytes,
                WriteMode::Overwrite,
            )
            .await
            .map_err(status_error("restoring the agent's state"))?;
    }

    let timeout_s = spec.turn_timeout_s.unwrap_or(DEFAULT_TURN_TIMEOUT_S);
    records
        .append(
            REQUESTS,
            &json!({
                "ts": now(),
                "node": ctx.node_id,
                "turn": ctx.turn,
                "attempt": ctx.attempt,
                "kind": if resumed { "resume" } else { "start" },
                "approved": turn.approved,
                "argv": argv,
                "env": spec.env,
                "sandbox": {"runner": sandbox.runner, "session_id": sandbox.id()},
                "staged_files": files.len(),
                "timeout_s": timeout_s,
            })
            .to_string(),
        )
        .await
        .map_err(status_error("recording the request"))?;
    let command = turn_command(argv, &spec.env, state.env, state.name);
    let result = sandbox
        .exec(&command, timeout_s.saturating_mul(1000), "")
        .await
        .map_err(status_error("running the agent's turn"))?;
    let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
    let (pid, stderr) = split_pid(&String::from_utf8_lossy(&result.stderr));
    records
        .append(EVENTS, &stdout)
        .await
        .map_err(status_error("recording the agent's events"))?;
    records
        .append(STDERR, &stderr)
        .await
        .map_err(status_error("recording the agent's stderr"))?;
    if let Some(pid) = pid {
        records
            .put(PID, Bytes::from(format!("{pid}\n")))
            .await
            .map_err(status_error("recording the agent's pid"))?;
    }
    let mut report = TurnReport::read(adapter, &stdout);
    if result.stdout_truncated && report.protocol.is_none() {
        report.protocol = Some(AdapterError::Protocol {
            adapter: adapter.name(),
            line: report.lines,
            message: "the stream was cut at the runner's exec output cap (raise `session.exec_max_output_bytes` on the runner)".into(),
        });
    }

    // File changes go back to the project, beneath `workspace` only.
    let mut written = Vec::new();
    let mut deleted = Vec::new();
    let opts = PutOptions {
        overwrite: spec.overwrite || ctx.reset || resumed,
        run_id: ctx.run_id.clone(),
        allowed_prefixes: vec![workspace.to_owned()],
        ..Default::default()
    };
    // Every reported path is checked before anything is written: all or nothing.
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
    for (rel, kind) in planned {
        let path = format!("{workspace}/{rel}");
        let file = match kind {
            ChangeKind::Delete => None,
            // Gone again by the end of the turn (removed by a command): mirrored as deleted.
            _ => match sandbox.read(&format!("{PROJECT_DIR}/{rel}"), 0).await {
                Ok(f) => Some(f),
                Err(s) if s.code() == tonic::Code::NotFound => None,
                Err(s) => {
                    return Err(NodeError::from_status(
                        &format!("reading the changed file {rel}"),
                        &s,
                    ))
                }
            },
        };
        let Some(file) = file else {
            if ctx
                .store()
                .delete(&ctx.project, &path, &ctx.run_id)
                .await
                .map_err(status_error(&format!("deleting {path}")))?
            {
                deleted.push(path);
            }
            continue;
        };
        if file.truncated {
            return Err(NodeError::new(
                ErrorKind::Failed,
                format!(
                    "the changed file {rel} is {} bytes, more than the runner's read cap; nothing of it was written back",
                    file.size_bytes
                ),
            ));
        }
        let put = ctx
            .store()
            .put(&ctx.project, &path, file.content, &opts)
            .await
            .map_err(|s| cairn_node::write_error(&path, &s))?;
        written.push(put);
    }

    // The CLI's resumable state, for the next attempt (maybe in another session).
    let base = format!("{STATE_ROOT}/{}", state.name);
    let listed = sandbox
        .glob("**", &base)
        .await
        .map_err(status_error("listing the agent's state"))?;
    let (paths, truncated) = (listed.paths, listed.truncated);
    if truncated {
        tracing::warn!(run_id = %ctx.run_id, node = %ctx.node_id, "the agent's state directory has more files than one Glob returns; some are not kept");
    }
    let mut kept = Vec::new();
    for p in paths {
        let Some(rel) = p.strip_prefix(&format!("{base}/")).map(str::to_owned) else {
            continue;
        };
        if !state
            .keep
            .iter()
            .any(|k| rel == *k || (k.ends_with('/') && rel.starts_with(k)))
        {
            continue;
        }
        let file = sandbox
            .read(&p, 0)
            .await
            .map_err(status_error("reading the agent's state"))?;
        if file.truncated {
            tracing::warn!(run_id = %ctx.run_id, node = %ctx.node_id, file = %rel, "an agent state file is larger than the runner's read cap; not kept");
            continue;
        }
        records
            .put(&format!("{}/{rel}", state.name), file.content)
            .await
            .map_err(status_error("keeping the agent's state"))?;
        kept.push(rel);
    }

    // The agent's own words of this attempt.
    if !report.messages.is_empty() {
        let rel = format!("artifacts/turn-{}-attempt-{}.md", ctx.turn, ctx.attempt);
        records
            .put(&rel, Bytes::from(report.messages.join("\n\n")))
            .await
            .map_err(status_error("writing the agent's messages"))?;
    }
    Ok(TurnDone {
        report,
        exit_code: result.exit_code,
        timed_out: result.timed_out,
        timeout_s,
        written,
        deleted,
        kept,
    })
}

/// agents/<instance>/README.md: the human entry of the instance.
async fn readme(
    ctx: &NodeCtx,
    records: &InstanceRecords,
    agent: &str,
    adapter: &str,
    state: InstanceState,
) -> Result<(), NodeError> {
    let run = &ctx.run_id;
    let instance = &records.instance;
    let body = format!(
        "{}# Agent `{agent}` ({instance})\n\nExternal agent CLI `{adapter}` of node `{}` in run {run}; state **{}**.\n\n- Session handle: [session.json](session.json)\n- Requests: [runtime/requests.jsonl](runtime/requests.jsonl)\n- CLI events: [runtime/events.jsonl](runtime/events.jsonl)\n- CLI stderr: [runtime/stderr.log](runtime/stderr.log)\n- Messages: [artifacts/](artifacts/)\n",
        front_matter(
            &format!("Agent {instance}"),
            &format!("Index of agent {instance} in run {run}"),
            &["agent", "external-agent"],
            run,
            Some(instance),
            None
        ),
        ctx.node_id,
        state.as_str(),
    );
    records
        .put("README.md", Bytes::from(body))
        .await
        .map_err(status_error("writing the instance README.md"))
}

/// The `external_agent` kind.
pub struct ExternalAgentKind;

impl cairn_node::Kind for ExternalAgentKind {
    fn type_name(&self) -> &'static str {
        "external_agent"
    }

    fn check(&self, node: &cairn_graph::Node) -> Result<(), String> {
        match &node.kind {
            cairn_graph::NodeKind::ExternalAgent(x) if crate::by_name(&x.adapter).is_none() => {
                Err(format!(
                    "field `adapter`: unknown adapter `{}`; one of {}",
                    x.adapter,
                    crate::ADAPTERS.join(", ")
                ))
            }
            _ => Ok(()),
        }
    }

    fn run<'a>(
        &'a self,
        ctx: &'a NodeCtx,
    ) -> cairn_node::BoxFuture<'a, Result<NodeSuccess, NodeError>> {
        Box::pin(async move {
            match &ctx.node.kind {
                cairn_graph::NodeKind::ExternalAgent(spec) => run(ctx, spec).await,
                _ => Err(cairn_node::mismatch(self.type_name(), &ctx.node)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_turn_command_quotes_everything() {
        let env = BTreeMap::from([("MODE".to_owned(), "a b".to_owned())]);
        let cmd = turn_command(
            &["codex".into(), "exec".into(), "it's".into()],
            &env,
            "CODEX_HOME",
            "codex_home",
        );
        assert_eq!(
            cmd,
            "mkdir -p /workspace/project /workspace/.cairn-agent/codex_home && cd /workspace/project && export CODEX_HOME=/workspace/.cairn-agent/codex_home MODE='a b' && echo \"cairn-agent-pid $$\" >&2 && exec codex exec 'it'\\''s'"
        );
    }

    #[test]
    fn the_pid_marker_is_taken_out_of_stderr() {
        assert_eq!(
            split_pid("cairn-agent-pid 42\nwarn: x\n"),
            (Some(42), "warn: x\n".to_owned())
        );
        assert_eq!(split_pid("no marker\n"), (None, "no marker\n".to_owned()));
    }

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
        let ok = TurnReport::read(&a, "{\"type\":\"thread.started\",\"thread_id\":\"t\"}\n{\"type\":\"error\",\"message\":\"retrying\"}\n{\"type\":\"turn.completed\",\"usage\":{}}\n");
        assert_eq!(ok.failure("codex-exec", 0), None);
        assert_eq!(ok.handle.as_deref(), Some("t"));
        assert!(ok.failure("codex-exec", 1).unwrap().contains("code 1"));
        let cut = TurnReport::read(
            &a,
            "{\"type\":\"turn.started\"}\n{\"type\":\"error\",\"message\":\"boom\"}\n",
        );
        assert!(cut.failure("codex-exec", 1).unwrap().contains("boom"));
        let failed = TurnReport::read(
            &a,
            "{\"type\":\"turn.failed\",\"error\":{\"message\":\"quota\"}}\n",
        );
        assert!(failed.failure("codex-exec", 1).unwrap().contains("quota"));
        let garbage = TurnReport::read(&a, "{\"type\":\"turn.completed\"}\nnot json\n");
        assert!(garbage.failure("codex-exec", 0).unwrap().contains("line 2"));
    }
}
