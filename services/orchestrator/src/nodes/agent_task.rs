//! `agent_task`: asks the run's LLM provider (replay for now) and writes the answer as a
//! Markdown document with front matter, then runs the ingest hook. The agent's
//! own records go to agents/<instance>/ (README.md, session.json, runtime/, artifacts/).
//! Human notes are given first, as high-priority context.

use bytes::Bytes;
use serde_json::{json, Value};

use super::{
    artifact_written, file_outputs, ingest, project_path, Access, NodeCtx, NodeError, NodeSuccess,
};
use crate::rundir::front_matter;
use cairn_agents::{AgentError, AgentRequest, Attempt, Message, Role};
use cairn_graph::AgentTask;
use cairn_node::events::{now, Ev, AGENT_COMPLETED, AGENT_FAILED, AGENT_STARTED, LLM_ATTEMPT};
use cairn_store_client::PutOptions;

/// Most bytes of one context file given to an agent.
const MAX_CONTEXT_BYTES: usize = 64 << 10;
/// Most context files per request.
const MAX_CONTEXT_FILES: usize = 16;

/// The node error of a provider error: setting problems are refused, a request that used all
/// its attempts failed.
pub fn agent_error(e: AgentError) -> NodeError {
    match e {
        AgentError::MissingAnswer { .. }
        | AgentError::Cassette { .. }
        | AgentError::Unsupported(_)
        | AgentError::BadSpec { .. }
        | AgentError::Refused { .. }
        | AgentError::Record(_)
        | AgentError::NotConfigured => NodeError::refused(e.to_string()),
        // The store did not answer for the cassette: worth another attempt.
        AgentError::Unavailable(_) => {
            NodeError::new(cairn_graph::ErrorKind::Unavailable, e.to_string())
        }
        // The provider already made its attempts; not retried as a node.
        AgentError::Llm(_) | AgentError::Replayed(_) => NodeError::failed(e.to_string()),
    }
}

pub async fn run(ctx: &NodeCtx, spec: &AgentTask) -> Result<NodeSuccess, NodeError> {
    let base_id = ctx
        .node_id
        .split('.')
        .next()
        .unwrap_or(&ctx.node_id)
        .to_owned();
    let agent = spec.agent.clone().unwrap_or_else(|| base_id.clone());
    let instance = ctx.node_id.replace('.', "-");
    let dir = ctx.run_dir();
    let provider = ctx
        .provider(spec.llm.as_deref())
        .await
        .map_err(agent_error)?;
    let path = match &spec.path {
        Some(t) => project_path(&ctx.scope, "path", t, Access::Write)?,
        None => format!("docs/{}/{}.md", ctx.run_id, ctx.node_id),
    };
    let messages = messages(ctx, spec, &agent).await?;
    let request = AgentRequest {
        run_id: ctx.run_id.clone(),
        node_id: ctx.node_id.clone(),
        agent: agent.clone(),
        instance: instance.clone(),
        turn: ctx.turn,
        messages,
        tools: Vec::new(),
        tool_choice: None,
        max_attempts: None,
    };
    let started = now();
    ctx.progress.emit(
        Ev::new(AGENT_STARTED, &ctx.node_id)
            .with("agent", agent.as_str())
            .with("agent_instance", instance.as_str())
            .with("turn", ctx.turn)
            .with("provider", provider.name()),
    );
    let records = AgentRecords {
        ctx,
        instance: &instance,
        agent: &agent,
        provider: provider.name(),
    };
    records.session("working", &started).await?;
    records
        .append_line(
            "runtime/requests.jsonl",
            json!({"ts": now(), "turn": ctx.turn, "attempt": ctx.attempt, "request": request}),
        )
        .await?;

    // Every attempt becomes an `llm.attempt` event. Cancelling the run drops this future,
    // which drops the HTTP request.
    let observer = |a: &Attempt| {
        ctx.progress
            .emit(attempt_event(&ctx.node_id, &instance, ctx.turn, a))
    };
    let reply = match provider.complete_observed(&request, &observer).await {
        Ok(r) => r,
        Err(e) => {
            ctx.progress.emit(
                Ev::new(AGENT_FAILED, &ctx.node_id)
                    .with("agent", agent.as_str())
                    .with("agent_instance", instance.as_str())
                    .with("error", e.to_string()),
            );
            let _ = records.session("dormant", &started).await;
            return Err(agent_error(e));
        }
    };
    records
        .append_line(
            "runtime/events.jsonl",
            json!({"ts": now(), "type": "reply", "turn": ctx.turn, "model": reply.model, "usage": reply.usage, "bytes": reply.content.len()}),
        )
        .await?;
    let opts_own = PutOptions {
        overwrite: true,
        ..Default::default()
    };
    let raw_path = dir.agent(&instance, &format!("artifacts/turn-{}.md", ctx.turn));
    ctx.store()
        .put(
            &ctx.project,
            &raw_path,
            Bytes::from(reply.content.clone()),
            &opts_own,
        )
        .await
        .map_err(|s| NodeError::from_status(&format!("writing {raw_path}"), &s))?;

    // The published document: front matter unless the agent wrote its own.
    let is_md = path.ends_with(".md") || path.ends_with(".markdown");
    let body = if spec.front_matter && is_md && !reply.content.starts_with("---") {
        let title = ctx
            .node
            .title
            .clone()
            .unwrap_or_else(|| ctx.node_id.clone());
        let purpose = spec
            .purpose
            .clone()
            .unwrap_or_else(|| format!("Output of agent `{agent}` for run {}", ctx.run_id));
        let mut tags: Vec<&str> = spec.tags.iter().map(String::as_str).collect();
        if tags.is_empty() {
            tags.push("agent-output");
        }
        let artifact_id = format!("{}-{}-v{}", ctx.run_id, instance, ctx.turn);
        format!(
            "{}{}",
            front_matter(
                &title,
                &purpose,
                &tags,
                &ctx.run_id,
                Some(&instance),
                Some(&artifact_id)
            ),
            reply.content
        )
    } else if path.ends_with(".json") {
        unfence(&reply.content).to_owned()
    } else {
        reply.content.clone()
    };
    let bytes = Bytes::from(body);
    let opts = PutOptions {
        overwrite: spec.overwrite || ctx.reset,
        run_id: ctx.run_id.clone(),
        ..Default::default()
    };
    let put = ctx
        .store()
        .put(&ctx.project, &path, bytes.clone(), &opts)
        .await
        .map_err(|s| super::write_file::write_error(&path, &s))?;
    records.session("dormant", &started).await?;
    records.readme(&put.path, ctx.turn).await?;

    let mut out = NodeSuccess {
        outputs: file_outputs(&put),
        events: vec![artifact_written(&ctx.node_id, &put, Some(&instance))],
    };
    out.outputs.insert("turn".into(), ctx.turn.into());
    out.outputs
        .insert("provider".into(), provider.name().into());
    out.outputs
        .insert("agent_instance".into(), instance.clone().into());
    out.outputs.insert("usage".into(), json!(reply.usage));
    if ingest::wants_hook(ctx, &put.path) {
        ingest::hook(ctx, &put.path, bytes, &mut out).await;
    }
    out.events.push(
        Ev::new(AGENT_COMPLETED, &ctx.node_id)
            .with("agent", agent.as_str())
            .with("agent_instance", instance.as_str())
            .with("turn", ctx.turn)
            .with("usage", json!(reply.usage)),
    );
    Ok(out)
}

/// A reply that is one fenced block (```json ... ```), as models often wrap data, without
/// the fence; anything else unchanged.
fn unfence(reply: &str) -> &str {
    let t = reply.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return reply;
    };
    let Some((_, body)) = rest.split_once('\n') else {
        return reply;
    };
    match body.trim_end().strip_suffix("```") {
        Some(inner) if !inner.contains("\n```") => inner,
        _ => reply,
    }
}

/// The `llm.attempt` event of one attempt (warning level when it failed).
pub fn attempt_event(node_id: &str, instance: &str, turn: u32, a: &Attempt) -> Ev {
    let mut e = Ev::new(LLM_ATTEMPT, node_id)
        .with("agent_instance", instance)
        .with("turn", turn);
    if let Ok(Value::Object(m)) = serde_json::to_value(a) {
        e.data.extend(m);
    }
    if matches!(
        a.outcome,
        cairn_agents::retry::AttemptOutcome::Failed { .. }
    ) {
        e = e.level(cairn_proto::v1::Level::Warning);
    }
    e
}

/// System prompt, human notes (high priority), shared context, then the task.
async fn messages(ctx: &NodeCtx, spec: &AgentTask, agent: &str) -> Result<Vec<Message>, NodeError> {
    let dir = ctx.run_dir();
    let system = match &spec.system {
        Some(t) => ctx.scope.render("system", t)?,
        None => format!(
            "You are `{agent}`, an agent of run {} ({}). Write your answer as Markdown. Put every file you create in a fenced block whose opening line is ```<lang> file=<relative/path>.",
            ctx.run_id, ctx.scope.graph.title
        ),
    };
    let mut out = vec![Message::new(Role::System, system)];
    let notes = ctx
        .store()
        .get(&ctx.project, &dir.human_notes())
        .await
        .map_err(|s| NodeError::from_status("reading shared/human-notes.md", &s))?;
    if let Some(notes) =
        notes.and_then(|b| crate::human::notes_for_agents(&String::from_utf8_lossy(&b)))
    {
        out.push(Message::new(
            Role::System,
            format!("Human notes for this run (highest priority: they override other instructions):\n\n{notes}"),
        ));
    }
    let mut files: Vec<(String, Option<String>, String)> = Vec::new();
    if let Some(manifest) = ctx
        .store()
        .get(&ctx.project, &dir.context_manifest())
        .await
        .map_err(|s| NodeError::from_status("reading shared/context-manifest.yaml", &s))?
    {
        if let Ok(m) = crate::human::Manifest::parse(&String::from_utf8_lossy(&manifest)) {
            for a in m.attachments {
                let path = a.resolved_path(&ctx.run_id);
                super::check_access(&ctx.run_id, "context attachment", &path, Access::Read)?;
                files.push((path, a.range.clone(), a.reason.clone()));
            }
        }
    }
    // Entries may be `dir/` (every file beneath) or one reference to a list of paths.
    for path in super::expand_files(ctx, "context", &spec.context).await? {
        files.push((path, None, String::new()));
    }
    for (path, range, reason) in files.into_iter().take(MAX_CONTEXT_FILES) {
        let Some(bytes) = ctx
            .store()
            .get(&ctx.project, &path)
            .await
            .map_err(|s| NodeError::from_status(&format!("reading {path}"), &s))?
        else {
            continue;
        };
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if let Some((a, b)) = range.as_deref().and_then(|r| r.split_once(':')) {
            if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                text = text
                    .lines()
                    .skip(a.saturating_sub(1))
                    .take(b.saturating_sub(a.saturating_sub(1)))
                    .collect::<Vec<_>>()
                    .join("\n");
            }
        }
        if text.len() > MAX_CONTEXT_BYTES {
            let mut cut = MAX_CONTEXT_BYTES;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str("\n[truncated]");
        }
        let why = if reason.is_empty() {
            String::new()
        } else {
            format!(" ({reason})")
        };
        out.push(Message::new(
            Role::User,
            format!("Context file `{path}`{why}:\n\n{text}"),
        ));
    }
    out.push(Message::new(
        Role::User,
        ctx.scope.render("prompt", &spec.prompt)?,
    ));
    Ok(out)
}

/// Writer of agents/<instance>/.
struct AgentRecords<'a> {
    ctx: &'a NodeCtx,
    instance: &'a str,
    agent: &'a str,
    provider: String,
}

impl AgentRecords<'_> {
    async fn put(&self, rel: &str, body: String) -> Result<(), NodeError> {
        let path = self.ctx.run_dir().agent(self.instance, rel);
        let opts = PutOptions {
            overwrite: true,
            ..Default::default()
        };
        self.ctx
            .store()
            .put(&self.ctx.project, &path, Bytes::from(body), &opts)
            .await
            .map(|_| ())
            .map_err(|s| NodeError::from_status(&format!("writing {path}"), &s))
    }

    /// session.json: `working` while it runs, `dormant` after.
    async fn session(&self, state: &str, started: &str) -> Result<(), NodeError> {
        let doc = json!({
            "agent": self.agent,
            "instance": self.instance,
            "adapter": "cairn-provider",
            "vendorSession": {"provider": self.provider, "node": self.ctx.node_id, "turn": self.ctx.turn},
            "recording": {"requests": "./runtime/requests.jsonl", "events": "./runtime/events.jsonl"},
            "startedAt": started,
            "lastActiveAt": now(),
            "state": state,
        });
        self.put("session.json", format!("{doc:#}\n")).await
    }

    async fn append_line(&self, rel: &str, line: Value) -> Result<(), NodeError> {
        let path = self.ctx.run_dir().agent(self.instance, rel);
        let mut body = match self.ctx.store().get(&self.ctx.project, &path).await {
            Ok(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
            Ok(None) => String::new(),
            Err(s) => return Err(NodeError::from_status(&format!("reading {path}"), &s)),
        };
        body.push_str(&line.to_string());
        body.push('\n');
        self.put(rel, body).await
    }

    async fn readme(&self, doc: &str, turn: u32) -> Result<(), NodeError> {
        let run = &self.ctx.run_id;
        let body = format!(
            "{}# Agent `{}` ({})\n\nNode `{}` of run {run}, provider `{}`.\n\n- Latest document: `{doc}` (turn {turn})\n- Raw answers: [artifacts/](artifacts/)\n- Session: [session.json](session.json)\n- Requests: [runtime/requests.jsonl](runtime/requests.jsonl)\n- Events: [runtime/events.jsonl](runtime/events.jsonl)\n",
            front_matter(&format!("Agent {}", self.instance), &format!("Index of agent {} in run {run}", self.instance), &["agent"], run, Some(self.instance), None),
            self.agent,
            self.instance,
            self.ctx.node_id,
            self.provider,
        );
        self.put("README.md", body).await
    }
}

/// The `agent_task` kind.
pub struct AgentTaskKind;

impl cairn_node::Kind for AgentTaskKind {
    fn type_name(&self) -> &'static str {
        "agent_task"
    }

    fn check(&self, node: &cairn_graph::Node) -> Result<(), String> {
        match &node.kind {
            cairn_graph::NodeKind::AgentTask(a) => a.llm.as_deref().map_or(Ok(()), check_llm),
            _ => Ok(()),
        }
    }

    fn run<'a>(
        &'a self,
        ctx: &'a NodeCtx,
    ) -> cairn_node::BoxFuture<'a, Result<NodeSuccess, NodeError>> {
        Box::pin(async move {
            match &ctx.node.kind {
                cairn_graph::NodeKind::AgentTask(spec) => run(ctx, spec).await,
                _ => Err(cairn_node::mismatch(self.type_name(), &ctx.node)),
            }
        })
    }
}

pub use cairn_agents::check_llm;

#[cfg(test)]
mod tests {
    use super::unfence;

    #[test]
    fn unfence_strips_one_whole_fence_only() {
        assert_eq!(unfence("```json\n{\"a\": 1}\n```\n"), "{\"a\": 1}\n");
        assert_eq!(unfence("{\"a\": 1}"), "{\"a\": 1}");
        let two = "```json\n1\n```\ntext\n```json\n2\n```";
        assert_eq!(unfence(two), two);
        assert_eq!(unfence("```"), "```");
    }
}
