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
//! Each attempt has its own runner session (live.rs): the project files are staged
//! into `/workspace/project`, the CLI's kept state into `/workspace/.cairn-agent/<dir>`, and
//! the turn is one unary `Exec` of the CLI (`codex exec` is one process per turn, so the whole
//! JSONL stream comes back when the turn ends; docs/adapters.md says why no streaming Exec is
//! needed). The session is closed when the attempt ends, also when it is dropped (cancel,
//! deadline): nothing outlives the attempt but what went to the store.
//!
//! Each turn is recorded under `agents/<instance>/turns/<attempt>-<turn>/` (turns.rs). A
//! replay with recorded sandbox steps opens no session: the turn is answered from the
//! recorded run's record of the same attempt and turn, through the same parser (report.rs).

use bytes::Bytes;
use serde_json::{json, Map, Value};

pub use crate::report::DEFAULT_TURN_TIMEOUT_S;
use crate::report::{status_error, PROJECT_DIR};
use crate::session::{InstanceRecords, InstanceState, Recording, SessionFile, EVENTS};
use crate::{AdapterError, Turn, TurnKind};
use cairn_graph::{ErrorKind, ExternalAgent, OnReject};
use cairn_node::events::{
    now, Ev, AGENT_AWAITING, AGENT_COMPLETED, AGENT_FAILED, AGENT_STARTED, GATE_BLOCKED,
};
use cairn_node::layout::front_matter;
use cairn_node::{artifact_written, NodeCtx, NodeError, NodeSuccess};
use cairn_node::{GateRecord, GateState};

/// Longest prompt given on the command line (Linux caps one argument at 128 KiB).
const MAX_PROMPT_BYTES: usize = 100 << 10;

fn adapter_error(e: AdapterError) -> NodeError {
    match e {
        AdapterError::Request { .. } => NodeError::refused(e.to_string()),
        AdapterError::Protocol { .. } => NodeError::failed(e.to_string()),
    }
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
    // The turn as a replay compares it.
    let request = crate::turns::request_json(
        &ctx.run_id,
        json!({
            "adapter": adapter.name(),
            "kind": if resumed { "resume" } else { "start" },
            "approved": turn.approved,
            "argv": argv,
            "env": spec.env,
            "workspace": workspace,
            "network": spec.network,
            "timeout_s": spec.turn_timeout_s.unwrap_or(DEFAULT_TURN_TIMEOUT_S),
        }),
    );
    // A replay with recorded sandbox steps answers the turn from the recorded run.
    let recorded = match ctx.replay().filter(|r| !r.live_sandbox) {
        Some(r) => {
            crate::turns::lookup(ctx, &r.source, &instance, &request, r.live_after.is_some())
                .await?
        }
        None => None,
    };

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

        let outcome = match recorded {
            // A replay: the recorded turn, no session, no CLI.
            Some(rec) => crate::turns::replay_turn(ctx, adapter, &records, &workspace, &request, rec)
                .await,
            None => {
                crate::live::live_turn(
                    ctx, spec, adapter, &records, &workspace, &argv, resumed, &turn, &request,
                )
                .await
            }
        };
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
        "{}# Agent `{agent}` ({instance})\n\nExternal agent CLI `{adapter}` of node `{}` in run {run}; state **{}**.\n\n- Session handle: [session.json](session.json)\n- Requests: [runtime/requests.jsonl](runtime/requests.jsonl)\n- CLI events: [runtime/events.jsonl](runtime/events.jsonl)\n- CLI stderr: [runtime/stderr.log](runtime/stderr.log)\n- Turn records (what a replay answers each turn from): [turns/](turns/)\n- Messages: [artifacts/](artifacts/)\n",
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
