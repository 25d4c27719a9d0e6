//! The tool loop of one code delivery task: open a sandbox session (empty or
//! a git clone), ask the model with the seven tools until `end` succeeds, then close the
//! session. Limits: `max_iterations` requests, and the node's deadline (minus a margin kept for
//! cleanup). Whatever the model sends, the loop answers with a tool result; only the sandbox
//! or store going away, a limit, or an LLM request that used all its attempts end the task,
//! and the last one sends the failure notice to the target first. A session lost with its
//! runner is resumed from the last checkpoint instead, when there is one (`checkpoint`).

mod checkpoint;
mod opening;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_proto::v1::{Level, LogStream, PutResponse};
use globset::GlobSet;
use serde_json::{json, Map, Value};
use tonic::{Code, Status};

use crate::archive::{archive_name, exclude_set, excluded, format_name, ENTRY_MTIME};
use crate::config::{ArchiveFormat, CodeDeliveryConfig};
use crate::prompt::{self, Source};
use crate::spec::{CodeDelivery, SourceType};
use crate::target::{Delivery, Place, Target};
use crate::todo::TodoBoard;
use crate::tools::{self, Call, WriteMode};
use crate::{CLOSED, DELIVERED, FAILURE_NOTICE, KEPT, STARTED, TOOL_CALL};
use cairn_agents::{
    AgentError, AgentRequest, Attempt, Message, Provider, Role, ToolCall, ToolChoice, Usage,
};
use cairn_delivery::onebot::{FailureNotice, OneBotConfig};
use cairn_graph::ErrorKind;
use cairn_node::events::{now, Ev, LLM_ATTEMPT};
use cairn_node::{NodeCtx, NodeError, NodeSuccess};
use cairn_runner_client::session::{PackError, RunnerSession};
use cairn_store_client::PutOptions;

/// Characters of arguments and results kept in a tool-call event.
const EVENT_TEXT_CHARS: usize = 2000;
/// Most characters `read` returns, whatever the model asks.
const MAX_READ_CHARS: u64 = 1_000_000;
/// Bytes of a README or docs file read to see that it is not blank.
const DOC_PROBE_BYTES: u64 = 64 << 10;
/// Docs files probed at most.
const DOC_PROBE_FILES: usize = 20;
/// Time kept back from the node's deadline for the notice and cleanup.
const MIN_CLEANUP_MARGIN: Duration = Duration::from_secs(2);
const MAX_CLEANUP_MARGIN: Duration = Duration::from_secs(30);

/// How the loop ended.
enum Ending {
    /// `end` packed, stored and delivered (delivery may have failed: see its status).
    Ended(Box<EndReport>),
    /// An LLM request ended without an answer (its attempts are spent).
    LlmFailed { error: AgentError, step: u32 },
    /// Anything else that ends the task (limits, the sandbox or store gone).
    Failed(NodeError),
}

/// What `end` produced.
struct EndReport {
    name: String,
    format: ArchiveFormat,
    put: PutResponse,
    entries: u32,
    excluded: u32,
    refused: Vec<Value>,
    delivery: Delivery,
    summary: String,
}

impl EndReport {
    fn sha256(&self) -> String {
        self.put.digest.clone().unwrap_or_default().sha256
    }
    fn size(&self) -> u64 {
        self.put.digest.clone().unwrap_or_default().size_bytes
    }
    /// The delivery summary: name, size, hash, upload status.
    fn result(&self) -> Value {
        let mut v = json!({
            "archive_name": self.name,
            "stored_path": self.put.path,
            "format": format_name(self.format),
            "size_bytes": self.size(),
            "sha256": self.sha256(),
            "entries": self.entries,
            "excluded": self.excluded,
            "upload_status": self.delivery.status,
            "location": self.delivery.location,
        });
        if let Some(e) = &self.delivery.error {
            v["error"] = json!(e);
        }
        if !self.refused.is_empty() {
            v["refused"] = json!(self.refused);
        }
        v
    }
}

/// A tool's answer to the model.
struct Reply {
    text: String,
    ok: bool,
    end: Option<Box<EndReport>>,
}

impl Reply {
    fn ok(text: impl Into<String>) -> Reply {
        Reply {
            text: text.into(),
            ok: true,
            end: None,
        }
    }
    fn error(text: impl Into<String>) -> Reply {
        Reply {
            text: format!("error: {}", text.into()),
            ok: false,
            end: None,
        }
    }
}

/// One task's state; outlives the loop future so cleanup can follow a deadline.
struct Task<'a> {
    ctx: &'a NodeCtx,
    cfg: CodeDeliveryConfig,
    provider: Arc<dyn Provider>,
    target: Target,
    source: Source,
    instance: String,
    max_iterations: u32,
    network: bool,
    /// The session's image ("" = the runner's default).
    image: String,
    board: TodoBoard,
    session: Option<RunnerSession>,
    messages: Vec<Message>,
    iterations: u32,
    tool_calls: u32,
    usage: Usage,
    checkpoints: checkpoint::Checkpoints,
    /// Why the session was found lost by the last call (set by `refusal`), for a failover.
    lost: Mutex<Option<Status>>,
}

fn archive_format(f: ArchiveFormat) -> cairn_proto::v1::ArchiveFormat {
    match f {
        ArchiveFormat::Zip => cairn_proto::v1::ArchiveFormat::Zip,
        ArchiveFormat::TarGz => cairn_proto::v1::ArchiveFormat::TarGz,
    }
}

fn write_mode(m: WriteMode) -> cairn_proto::v1::WriteMode {
    match m {
        WriteMode::Overwrite => cairn_proto::v1::WriteMode::Overwrite,
        WriteMode::Append => cairn_proto::v1::WriteMode::Append,
    }
}

fn provider_error(e: AgentError) -> NodeError {
    NodeError::refused(e.to_string())
}

/// Runs the task of a `code_delivery` node.
pub async fn run(
    ctx: &NodeCtx,
    spec: &CodeDelivery,
    cfg: &CodeDeliveryConfig,
    onebot: &OneBotConfig,
) -> Result<NodeSuccess, NodeError> {
    let cfg = cfg.clone();
    if !cfg.enabled {
        return Err(NodeError::refused(
            "code delivery is turned off on this orchestrator (code_delivery.enabled = false)",
        ));
    }
    let scope = &ctx.scope;
    let prompt = scope.render("prompt", &spec.prompt)?;
    let source = match spec.source_type {
        SourceType::Empty => Source::Empty,
        SourceType::Git => {
            let url = match &spec.git_url {
                Some(t) => scope.render("git_url", t)?.trim().to_owned(),
                None => String::new(),
            };
            if url.is_empty() {
                return Err(NodeError::refused(
                    "field `git_url`: empty; source_type git needs a repository",
                ));
            }
            let git_ref = match &spec.git_ref {
                Some(t) => scope.render("git_ref", t)?.trim().to_owned(),
                None => String::new(),
            };
            Source::Git { url, git_ref }
        }
    };
    let target = Target::new(&spec.target, scope, onebot)?;
    let provider = ctx
        .provider(spec.llm.as_deref())
        .await
        .map_err(provider_error)?;
    let budget = Duration::from_secs(ctx.node.timeout_s.unwrap_or(ctx.backends.node_timeout_s));
    // Kept back for the notice and cleanup: a tenth of the budget, 2-30 s, at most half.
    let margin = (budget / 10)
        .clamp(MIN_CLEANUP_MARGIN, MAX_CLEANUP_MARGIN)
        .min(budget / 2);
    let limit = budget.saturating_sub(margin);
    let deadline = tokio::time::Instant::now() + limit;
    ctx.progress.emit(
        Ev::new(STARTED, &ctx.node_id)
            .with("source_type", source.type_name())
            .with("source", source.line())
            .with("target", target.describe())
            .with("provider", provider.name())
            .with("max_iterations", spec.max_iterations)
            .with("time_limit_s", limit.as_secs()),
    );
    let mut task = Task {
        ctx,
        provider,
        target,
        source,
        instance: ctx.node_id.replace('.', "-"),
        max_iterations: spec.max_iterations,
        network: spec.network,
        image: spec.image.clone().unwrap_or_default(),
        board: TodoBoard::default(),
        session: None,
        messages: Vec::new(),
        iterations: 0,
        tool_calls: 0,
        usage: Usage::default(),
        checkpoints: checkpoint::Checkpoints::new(
            spec.checkpoint_every_s.unwrap_or(cfg.checkpoint_every_s),
            spec.pause_after_ms.unwrap_or(cfg.pause_after_ms),
        ),
        lost: Mutex::new(None),
        cfg,
    };
    // Each command and its output go to the node's log when the command has finished.
    ctx.log().begin();
    // A fresh attempt starts a fresh workspace, so a fresh board.
    task.save_board().await?;
    let ending = match tokio::time::timeout_at(deadline, task.drive(&prompt)).await {
        Ok(e) => e,
        Err(_) => Ending::Failed(NodeError::failed(format!(
            "the task ran out of time after {}s (the node's timeout_s {}s minus {}s kept for cleanup) before a successful `end`; raise timeout_s or narrow the task",
            limit.as_secs(),
            budget.as_secs(),
            (budget - limit).as_secs()
        ))),
    };
    task.finish(ending).await
}

impl Task<'_> {
    fn node(&self) -> &str {
        &self.ctx.node_id
    }

    fn place(&self) -> Place<'_> {
        Place {
            store: self.ctx.store(),
            project: &self.ctx.project,
            run_id: &self.ctx.run_id,
            node_id: &self.ctx.node_id,
            overwrite: self.ctx.reset,
            step_key: &self.ctx.step.key,
        }
    }

    fn session(&self) -> Result<&RunnerSession, NodeError> {
        self.session
            .as_ref()
            .ok_or_else(|| NodeError::failed("the sandbox session is not open"))
    }

    async fn drive(&mut self, prompt: &str) -> Ending {
        if let Err(e) = self.open().await {
            return Ending::Failed(e);
        }
        if let Err(e) = self.first_messages(prompt).await {
            return Ending::Failed(e);
        }
        let specs = tools::specs();
        'turns: loop {
            if let Err(e) = self.checkpoint_if_due(self.iterations + 1).await {
                return Ending::Failed(e);
            }
            if self.iterations >= self.max_iterations {
                return Ending::Failed(NodeError::failed(format!(
                    "the model used all {} turns (max_iterations) without a successful `end`; raise max_iterations or narrow the task (its tool calls are in the run's events)",
                    self.max_iterations
                )));
            }
            self.iterations += 1;
            let step = self.iterations;
            if step == self.max_iterations && step > 1 {
                self.messages.push(Message::new(
                    Role::User,
                    "This is your last turn: call `end` now with what you have.",
                ));
            }
            let request = AgentRequest {
                run_id: self.ctx.run_id.clone(),
                node_id: self.ctx.node_id.clone(),
                agent: "code_delivery".into(),
                instance: self.instance.clone(),
                turn: self.ctx.turn,
                messages: self.messages.clone(),
                tools: specs.clone(),
                tool_choice: Some(ToolChoice::Auto),
                max_attempts: Some(self.cfg.llm_max_retries_per_request),
            };
            let progress = self.ctx.progress.clone();
            let node = self.ctx.node_id.clone();
            let instance = self.instance.clone();
            let turn = self.ctx.turn;
            let observer = move |a: &Attempt| {
                let mut e = Ev::new(LLM_ATTEMPT, &node)
                    .with("agent_instance", instance.as_str())
                    .with("turn", turn)
                    .with("step", step);
                if let Ok(Value::Object(m)) = serde_json::to_value(a) {
                    e.data.extend(m);
                }
                if !matches!(a.outcome, cairn_agents::retry::AttemptOutcome::Succeeded) {
                    e = e.level(Level::Warning);
                }
                progress.emit(e);
            };
            let provider = self.provider.clone();
            let answer = provider.complete_observed(&request, &observer);
            tokio::pin!(answer);
            let answer = match self.checkpoints.pause_after() {
                None => answer.await,
                // A slow answer: the session is paused meanwhile, holding no sandbox.
                Some(after) => tokio::select! {
                    a = &mut answer => a,
                    () = tokio::time::sleep(after) => {
                        self.pause_while_waiting(step).await;
                        answer.await
                    }
                },
            };
            let reply = match answer {
                Ok(r) => r,
                Err(error) => return Ending::LlmFailed { error, step },
            };
            if let Err(e) = self.resume_if_paused().await {
                return Ending::Failed(e);
            }
            self.usage.prompt_tokens += reply.usage.prompt_tokens;
            self.usage.completion_tokens += reply.usage.completion_tokens;
            if reply.tool_calls.is_empty() {
                self.messages
                    .push(Message::new(Role::Assistant, reply.content.clone()));
                self.messages.push(Message::new(
                    Role::User,
                    "Continue with the tools. When the work is complete, call `end`.",
                ));
                self.ctx.progress.emit(
                    Ev::new(TOOL_CALL, self.node())
                        .level(Level::Warning)
                        .with("step", step)
                        .with("tool", "")
                        .with("ok", false)
                        .with("result", "the model answered without a tool call"),
                );
                continue;
            }
            self.messages.push(Message::assistant_calls(
                reply.content.clone(),
                reply.tool_calls.clone(),
            ));
            for call in &reply.tool_calls {
                let started = Instant::now();
                let answer = match self.call(call).await {
                    Ok(a) => a,
                    // A lost session resumed from a checkpoint goes on from that turn.
                    Err(e) => match self.recover(e).await {
                        Ok(()) => continue 'turns,
                        Err(e) => return Ending::Failed(e),
                    },
                };
                self.tool_calls += 1;
                self.messages
                    .push(Message::tool_result(call.id.clone(), answer.text.clone()));
                self.ctx.progress.emit(
                    Ev::new(TOOL_CALL, self.node())
                        .level(if answer.ok {
                            Level::Info
                        } else {
                            Level::Warning
                        })
                        .with("step", step)
                        .with("call_id", call.id.as_str())
                        .with("tool", call.name.as_str())
                        .with("arguments", clip_event(&call.arguments))
                        .with("ok", answer.ok)
                        .with("result", clip_event(&answer.text))
                        .with(
                            "duration_ms",
                            u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                        ),
                );
                if let Some(report) = answer.end {
                    return Ending::Ended(report);
                }
            }
        }
    }

    /// System prompt, human notes (highest priority), the task with its source.
    async fn first_messages(&mut self, prompt: &str) -> Result<(), NodeError> {
        self.messages.push(Message::new(
            Role::System,
            prompt::system(&self.source, self.max_iterations, &self.target.describe()),
        ));
        let notes = self
            .ctx
            .store()
            .get(&self.ctx.project, &self.ctx.run_dir().human_notes())
            .await
            .map_err(|s| NodeError::from_status("reading shared/human-notes.md", &s))?;
        if let Some(notes) =
            notes.and_then(|b| cairn_node::context::notes_for_agents(&String::from_utf8_lossy(&b)))
        {
            self.messages.push(Message::new(
                Role::System,
                format!("Human notes for this run (highest priority: they override other instructions):\n\n{notes}"),
            ));
        }
        let commit = self.session()?.info.git_commit.clone();
        self.messages.push(Message::new(
            Role::User,
            prompt::task(&self.source, &commit, prompt),
        ));
        Ok(())
    }

    /// One tool call. Err only when the task cannot go on (sandbox or store gone).
    async fn call(&mut self, call: &ToolCall) -> Result<Reply, NodeError> {
        let parsed = match tools::parse(&call.name, &call.arguments) {
            Ok(c) => c,
            Err(message) => return Ok(Reply::error(message)),
        };
        match parsed {
            Call::Read(a) => self.read(&a.path, a.max_chars).await,
            Call::Write(a) => {
                let r = self
                    .session()?
                    .write(&a.path, Bytes::from(a.content), write_mode(a.mode))
                    .await;
                self.answer(r, |w| {
                    json!({"path": a.path, "bytes_written": w.bytes_written, "size_bytes": w.size_bytes})
                        .to_string()
                })
            }
            Call::Glob(a) => {
                let base = a.base_path.unwrap_or_default();
                let r = self.session()?.glob(&a.pattern, &base).await;
                self.answer(r, |g| {
                    if g.paths.is_empty() {
                        return format!("no files match `{}`", a.pattern);
                    }
                    let mut out = g.paths.join("\n");
                    if g.truncated {
                        out.push_str("\n[more files match; narrow the pattern]");
                    }
                    out
                })
            }
            Call::Grep(a) => {
                let r = self
                    .session()?
                    .grep(
                        &a.pattern,
                        a.path.as_deref().unwrap_or_default(),
                        a.is_regex,
                        a.case_sensitive,
                        a.max_matches.unwrap_or(0),
                    )
                    .await;
                let cap = self.text_cap();
                self.answer(r, |g| {
                    if g.matches.is_empty() {
                        return format!("no matches for `{}`", a.pattern);
                    }
                    let mut out = g
                        .matches
                        .iter()
                        .map(|m| format!("{}:{}:{}", m.path, m.line, m.text))
                        .collect::<Vec<_>>()
                        .join("\n");
                    if g.truncated {
                        out.push_str("\n[more matches; narrow the pattern or raise max_matches]");
                    }
                    clip(&out, cap)
                })
            }
            Call::RunBashCommand(a) => {
                let secs = a
                    .timeout_seconds
                    .unwrap_or(self.cfg.default_command_timeout_seconds);
                if secs == 0 {
                    return Ok(Reply::error("timeout_seconds must be at least 1"));
                }
                let r = self
                    .session()?
                    .exec(
                        &a.command,
                        secs.saturating_mul(1000),
                        a.workdir.as_deref().unwrap_or_default(),
                    )
                    .await;
                self.log_step(&a.command, &r);
                let cap = self.text_cap();
                self.answer(r, |x| {
                    let text = |b: &[u8], cut: bool| {
                        let mut s = clip(&String::from_utf8_lossy(b), cap);
                        if cut {
                            s.push_str("\n[the runner cut this output at its size limit]");
                        }
                        s
                    };
                    // No wall-clock time: the model's next request is then a function of the
                    // work alone, and a replay of the run sends it byte for byte (the time is
                    // in the tool_call event's duration_ms).
                    json!({
                        "exit_code": x.exit_code,
                        "timed_out": x.timed_out,
                        "stdout": text(&x.stdout, x.stdout_truncated),
                        "stderr": text(&x.stderr, x.stderr_truncated),
                    })
                    .to_string()
                })
            }
            Call::Todo(a) => match self.board.apply(&a, &now()) {
                Ok(out) => {
                    if out.changed {
                        self.save_board().await?;
                    }
                    Ok(Reply::ok(out.message))
                }
                Err(e) => Ok(Reply::error(e)),
            },
            Call::End(a) => self.end(a).await,
        }
    }

    /// A finished command with its output into the node's log (whole steps: Exec is unary).
    fn log_step(&self, command: &str, r: &Result<cairn_proto::v1::ExecResult, Status>) {
        let log = self.ctx.log();
        log.step(&format!("$ {command}"));
        match r {
            Ok(x) => {
                log.write(LogStream::Stdout, x.stdout.clone());
                log.write(LogStream::Stderr, x.stderr.clone());
                let cut = if x.stdout_truncated || x.stderr_truncated {
                    " (output cut at the runner's size limit)"
                } else {
                    ""
                };
                if x.timed_out {
                    log.step(&format!("[timed out after {} ms]{cut}", x.duration_ms));
                } else {
                    log.step(&format!("[exit {}]{cut}", x.exit_code));
                }
            }
            Err(s) => log.step(&format!("[not run: {}]", s.message())),
        }
    }

    /// Characters of command output (and similar) given back to the model.
    fn text_cap(&self) -> usize {
        usize::try_from(self.cfg.max_command_output_chars).unwrap_or(usize::MAX)
    }

    /// A runner answer as a tool reply: success rendered, refusals as messages, a lost
    /// sandbox as the end of the task.
    fn answer<T>(
        &self,
        r: Result<T, Status>,
        render: impl FnOnce(T) -> String,
    ) -> Result<Reply, NodeError> {
        match r {
            Ok(v) => Ok(Reply::ok(render(v))),
            Err(s) => self.refusal(s),
        }
    }

    fn refusal(&self, s: Status) -> Result<Reply, NodeError> {
        let lost = match s.code() {
            Code::Unavailable
            | Code::Unknown
            | Code::Internal
            | Code::Cancelled
            | Code::Aborted
            | Code::DeadlineExceeded
            | Code::Unauthenticated => true,
            // The session itself is gone (the runner restarted): nothing more can be done.
            Code::NotFound => {
                let id = self
                    .session
                    .as_ref()
                    .map(|x| x.info.session_id.clone())
                    .unwrap_or_default();
                s.message().contains(&format!("session \"{id}\""))
            }
            _ => false,
        };
        if lost {
            if self.session.as_ref().is_some_and(|x| x.lost(&s)) {
                *self.lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.clone());
            }
            return Err(NodeError::from_status("the sandbox session", &s));
        }
        Ok(Reply::error(s.message().to_owned()))
    }

    async fn read(&self, path: &str, max_chars: Option<u64>) -> Result<Reply, NodeError> {
        let chars = max_chars
            .unwrap_or(self.cfg.max_command_output_chars)
            .clamp(1, MAX_READ_CHARS);
        let max_bytes = chars.saturating_mul(4).min(1 << 20);
        let r = self.session()?.read(path, max_bytes).await;
        let chars = usize::try_from(chars).unwrap_or(usize::MAX);
        self.answer(r, |f| {
            if f.content.contains(&0) {
                return format!(
                    "{path} is a binary file ({} bytes); inspect it with run_bash_command (file, xxd, unzip -l ...)",
                    f.size_bytes
                );
            }
            let text = String::from_utf8_lossy(&f.content);
            let shown: String = text.chars().take(chars).collect();
            if f.truncated || shown.len() < text.len() {
                format!(
                    "{shown}\n[truncated: {path} is {} bytes; this is the first {} characters. Read less at a time or use grep]",
                    f.size_bytes,
                    shown.chars().count()
                )
            } else {
                shown
            }
        })
    }

    /// `end`: check, pack, store, deliver.
    async fn end(&mut self, a: tools::EndArgs) -> Result<Reply, NodeError> {
        let (name, format) = match archive_name(
            a.archive_name.as_deref(),
            a.archive_format,
            self.cfg.default_archive_format,
            self.node(),
        ) {
            Ok(x) => x,
            Err(m) => return Ok(Reply::error(m)),
        };
        let patterns: Vec<String> = a
            .exclude_patterns
            .iter()
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty())
            .collect();
        let excludes = match exclude_set(&patterns) {
            Ok(s) => s,
            Err(m) => return Ok(Reply::error(m)),
        };
        if self.source == Source::Empty {
            let problems = self.missing_docs(&excludes).await?;
            if !problems.is_empty() {
                return Ok(Reply::error(format!(
                    "`end` refused: this project started from an empty directory (source_type=empty), so the delivery must contain a non-empty README.md and documentation of how to use and run it. Missing: {}. Write them with `write`, then call `end` again.",
                    problems.join("; ")
                )));
            }
        }
        let max_bytes = self.cfg.max_archive_size_mb.saturating_mul(1 << 20);
        let packed = match self
            .session()?
            .pack(
                archive_format(format),
                &patterns,
                &name,
                ENTRY_MTIME,
                max_bytes,
            )
            .await
        {
            Ok(p) => p,
            Err(PackError::Status(s)) => return self.refusal(s),
            Err(PackError::TooLarge { max_bytes }) => {
                return Ok(Reply::error(format!(
                    "the archive is larger than {} MiB (code_delivery.max_archive_size_mb): exclude build output, dependencies and caches with exclude_patterns",
                    max_bytes >> 20
                )))
            }
            Err(PackError::Corrupt(m)) => return Err(NodeError::new(ErrorKind::Unavailable, m)),
        };
        if packed.summary.entries == 0 {
            return Ok(Reply::error(
                "nothing to pack: the workspace is empty or every file is excluded",
            ));
        }
        let stored_path = format!("docs/artifacts/{}/{name}", self.ctx.run_id);
        let opts = PutOptions {
            overwrite: self.ctx.reset,
            run_id: self.ctx.run_id.clone(),
            ..Default::default()
        };
        let put = match self
            .ctx
            .store()
            .put(&self.ctx.project, &stored_path, packed.bytes.clone(), &opts)
            .await
        {
            Ok(p) => p,
            Err(s) if s.code() == Code::AlreadyExists => {
                return Ok(Reply::error(format!(
                    "{stored_path} already exists: choose another archive_name"
                )))
            }
            Err(s) => return Err(cairn_node::write_error(&stored_path, &s)),
        };
        let digest = put.digest.clone().unwrap_or_default();
        let packed_digest = packed.summary.digest.clone().unwrap_or_default();
        if digest.sha256 != packed_digest.sha256 {
            return Err(NodeError::new(
                ErrorKind::Unavailable,
                format!(
                    "the store holds {stored_path} with sha256 {} but the runner packed {}",
                    digest.sha256, packed_digest.sha256
                ),
            ));
        }
        let delivery = self
            .target
            .deliver(&self.place(), &name, &packed.bytes, &put.path)
            .await;
        self.ctx.progress.emit(
            Ev::new(DELIVERED, self.node())
                .level(if delivery.status == "failed" {
                    Level::Error
                } else {
                    Level::Info
                })
                .with("archive", put.path.as_str())
                .with("sha256", digest.sha256.as_str())
                .with("size_bytes", digest.size_bytes)
                .with("target", self.target.describe())
                .with("status", delivery.status)
                .with("location", delivery.location.as_str())
                .with("error", delivery.error.clone().unwrap_or_default()),
        );
        let report = EndReport {
            name,
            format,
            put,
            entries: packed.summary.entries,
            excluded: packed.summary.excluded,
            refused: packed
                .summary
                .refused
                .iter()
                .map(|r| json!({"path": r.path, "reason": r.reason}))
                .collect(),
            delivery,
            summary: a.summary.unwrap_or_default(),
        };
        let ok = report.delivery.status != "failed";
        Ok(Reply {
            text: report.result().to_string(),
            ok,
            end: Some(Box::new(report)),
        })
    }

    /// What an empty-source delivery lacks: README.md with content, and docs
    /// (a non-blank file under docs/, or a usage/running section in README.md), all kept by
    /// the exclude patterns.
    async fn missing_docs(&self, excludes: &GlobSet) -> Result<Vec<String>, NodeError> {
        let session = self.session()?;
        let mut problems = Vec::new();
        let mut readme_documents_use = false;
        match session.read("README.md", DOC_PROBE_BYTES).await {
            Ok(f) => {
                let text = String::from_utf8_lossy(&f.content);
                if text.trim().is_empty() {
                    problems.push("README.md is empty".to_owned());
                } else if excluded(excludes, "README.md") {
                    problems.push("exclude_patterns leave README.md out of the archive".to_owned());
                } else {
                    readme_documents_use = has_usage_section(&text);
                }
            }
            Err(s) if s.code() == Code::NotFound || s.code() == Code::InvalidArgument => {
                problems.push("there is no README.md at the workspace root".to_owned())
            }
            Err(s) => return self.refusal(s).map(|r| vec![r.text]),
        }
        if !readme_documents_use && !self.docs_dir_has_content(excludes).await? {
            problems.push(
                "documentation of how to use and run the project: add a docs/ directory (e.g. docs/usage.md) or a `## Usage` / `## Running` section in README.md".to_owned(),
            );
        }
        Ok(problems)
    }

    async fn docs_dir_has_content(&self, excludes: &GlobSet) -> Result<bool, NodeError> {
        let session = self.session()?;
        let listed = match session.glob("docs/**", "").await {
            Ok(g) => g.paths,
            Err(s) => {
                self.refusal(s)?;
                return Ok(false);
            }
        };
        for path in listed
            .iter()
            .filter(|p| !excluded(excludes, p))
            .take(DOC_PROBE_FILES)
        {
            if let Ok(f) = session.read(path, DOC_PROBE_BYTES).await {
                if !f.content.contains(&0) && !String::from_utf8_lossy(&f.content).trim().is_empty()
                {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    async fn save_board(&self) -> Result<(), NodeError> {
        let path = self.ctx.run_dir().agent(&self.instance, "todo.json");
        let body = serde_json::to_string_pretty(&self.board).unwrap_or_default() + "\n";
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

    /// The conversation, for the record (best effort).
    async fn save_messages(&self) {
        let path = self
            .ctx
            .run_dir()
            .agent(&self.instance, "runtime/messages.json");
        let doc = json!({
            "node": self.ctx.node_id,
            "turn": self.ctx.turn,
            "attempt": self.ctx.attempt,
            "provider": self.provider.name(),
            "iterations": self.iterations,
            "usage": self.usage,
            "messages": self.messages,
        });
        let opts = PutOptions {
            overwrite: true,
            ..Default::default()
        };
        if let Err(s) = self
            .ctx
            .store()
            .put(
                &self.ctx.project,
                &path,
                Bytes::from(format!("{doc:#}\n")),
                &opts,
            )
            .await
        {
            tracing::warn!(path = %path, error = %s.message(), "could not record the code delivery conversation");
        }
    }

    /// Notice, records and cleanup, then the node's result.
    async fn finish(mut self, ending: Ending) -> Result<NodeSuccess, NodeError> {
        let mut result = match ending {
            Ending::Ended(report) => self.success(*report),
            Ending::Failed(e) => Err(e),
            Ending::LlmFailed { error, step } => Err(self.llm_failed(error, step).await),
        };
        self.save_messages().await;
        if let Some(session) = self.session.take() {
            let id = session.info.session_id.clone();
            if self.cfg.cleanup_on_finish {
                let closed = session.close().await;
                let mut e = Ev::new(CLOSED, self.node()).with("session_id", id.as_str());
                e = match &closed {
                    Ok(c) => e.with("closed", *c),
                    Err(s) => e
                        .level(Level::Warning)
                        .with("closed", false)
                        .with("error", s.message()),
                };
                self.ctx.progress.emit(e);
            } else {
                let info = session.keep();
                self.ctx.progress.emit(
                    Ev::new(KEPT, self.node())
                        .with("session_id", info.session_id.as_str())
                        .with("container_name", info.container_name.as_str()),
                );
            }
            if let Ok(out) = &mut result {
                out.outputs.insert("session_id".into(), id.into());
            }
        }
        result
    }

    fn success(&self, report: EndReport) -> Result<NodeSuccess, NodeError> {
        if report.delivery.status == "failed" {
            return Err(NodeError::failed(format!(
                "the archive is stored at {} ({} bytes, sha256 {}) but delivering it to {} failed: {}",
                report.put.path,
                report.size(),
                report.sha256(),
                self.target.describe(),
                report.delivery.error.clone().unwrap_or_default()
            )));
        }
        let mut o = Map::new();
        o.insert("archive_name".into(), report.name.clone().into());
        o.insert("archive_path".into(), report.put.path.clone().into());
        o.insert("format".into(), format_name(report.format).into());
        o.insert("size_bytes".into(), report.size().into());
        o.insert("sha256".into(), report.sha256().into());
        o.insert("entries".into(), report.entries.into());
        o.insert("excluded".into(), report.excluded.into());
        o.insert("upload_status".into(), report.delivery.status.into());
        o.insert("location".into(), report.delivery.location.clone().into());
        o.insert(
            "delivered_path".into(),
            report.delivery.path.clone().unwrap_or_default().into(),
        );
        o.insert("summary".into(), report.summary.clone().into());
        o.insert("iterations".into(), self.iterations.into());
        o.insert("tool_calls".into(), self.tool_calls.into());
        o.insert(
            "git_commit".into(),
            self.session
                .as_ref()
                .map(|s| s.info.git_commit.clone())
                .unwrap_or_default()
                .into(),
        );
        o.insert("provider".into(), self.provider.name().into());
        o.insert("usage".into(), json!(self.usage));
        Ok(NodeSuccess {
            outputs: o,
            events: vec![cairn_node::artifact_written(
                self.node(),
                &report.put,
                Some(&self.instance),
            )],
        })
    }

    /// the notice to the target, then the node's error.
    async fn llm_failed(&self, error: AgentError, step: u32) -> NodeError {
        let (summary, advice) = match &error {
            AgentError::Llm(e) => (e.summary(), e.retry_advice()),
            other => (
                other.to_string(),
                "fix the LLM setting of the run or node (see the error), then submit the task again".to_owned(),
            ),
        };
        let mut message = format!("LLM request {step} of the tool loop: {error}");
        if self.cfg.notify_on_llm_failure {
            let task_id = format!("{}/{}", self.ctx.run_id, self.ctx.node_id);
            let stage = format!(
                "code delivery tool loop, LLM request {step} (after {} tool calls)",
                self.tool_calls
            );
            let notice = FailureNotice {
                task_id: &task_id,
                stage: &stage,
                error_summary: &summary,
                retry_advice: &advice,
            };
            let sent = self.target.notify(&self.place(), &notice).await;
            let mut e = Ev::new(FAILURE_NOTICE, self.node())
                .with("target", self.target.describe())
                .with("stage", stage.as_str())
                .with("error_summary", summary.as_str())
                .with("sent", sent.is_ok());
            match &sent {
                Ok(to) => {
                    e = e.with("to", to.as_str());
                    message.push_str(&format!("; failure notice sent to {to}"));
                }
                Err(why) => {
                    e = e.level(Level::Error).with("error", why.as_str());
                    message.push_str(&format!("; the failure notice could not be sent: {why}"));
                }
            }
            self.ctx.progress.emit(e);
        }
        NodeError::failed(message)
    }
}

/// A Markdown heading about using or running the project.
fn has_usage_section(readme: &str) -> bool {
    const WORDS: [&str; 9] = [
        "usage",
        "use",
        "using",
        "run",
        "running",
        "install",
        "installation",
        "quickstart",
        "setup",
    ];
    const PHRASES: [&str; 8] = [
        "getting started",
        "quick start",
        "how to",
        "使用",
        "运行",
        "用法",
        "安装",
        "快速开始",
    ];
    readme.lines().any(|line| {
        let Some(heading) = line.trim_start().strip_prefix('#') else {
            return false;
        };
        let h = heading.trim_start_matches('#').trim().to_lowercase();
        h.split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| WORDS.contains(&w))
            || PHRASES.iter().any(|p| h.contains(p))
    })
}

/// `text` cut to `max` characters: its start and its end (the end of build output says most).
fn clip(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_owned();
    }
    let head = max / 4;
    let tail = max - head;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(n - tail).collect();
    format!("{start}\n[... {} characters cut ...]\n{end}", n - max)
}

fn clip_event(text: &str) -> String {
    if text.chars().count() <= EVENT_TEXT_CHARS {
        return text.to_owned();
    }
    let mut s: String = text.chars().take(EVENT_TEXT_CHARS).collect();
    s.push('…');
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn usage_sections() {
        assert!(has_usage_section("# App\n\n## Usage\n\nrun it"));
        assert!(has_usage_section("# App\n## How to run\n"));
        assert!(has_usage_section("# 项目\n## 使用方法\n"));
        assert!(!has_usage_section("# App\n\nA thing.\n"));
        assert!(!has_usage_section("# Rune collection\n"));
    }

    #[test]
    fn clipping_keeps_start_and_end() {
        assert_eq!(clip("abc", 3), "abc");
        let c = clip(&("x".repeat(50) + "END"), 20);
        assert!(c.starts_with("xxxxx\n[... 33 characters cut ...]\n"), "{c}");
        assert!(c.ends_with("END"));
    }
}
