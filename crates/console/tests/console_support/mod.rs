//! Test support for the console: a real artifact-store and a FAKE orchestrator, each served
//! in-process on its own 127.0.0.1 port over real gRPC, plus a cookie-keeping client for the
//! console router. The fake records every call it receives and moves its canned run like the
//! real one would (approve => completed, reject => failed, cancel => canceled), emitting events
//! through WatchRun.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use cairn_console::{console_router, ConsoleConfig};
use cairn_proto::v1 as pb;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::orchestrator_server::{Orchestrator, OrchestratorServer};
use futures::Stream;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use tokio::sync::{oneshot, watch};
use tonic::{Request as GrpcRequest, Response as GrpcResponse, Status};
use tower::ServiceExt;

pub const PROJECT: &str = "proj";
pub const RUN: &str = "run-1";
pub const TOKEN: &str = "correct-horse-battery-staple";
/// The Host a browser sends to the console of the default configuration (127.0.0.1:7480).
pub const CONSOLE_HOST: &str = "127.0.0.1:7480";
/// The Origin a browser sends with the console's own forms.
pub const CONSOLE_ORIGIN: &str = "http://127.0.0.1:7480";

/// The canned run's page.
pub fn run_url() -> String {
    format!("/projects/{PROJECT}/runs/{RUN}")
}

/// A client of a console over `s` (shared token), logged in as ann.
pub async fn logged_in(s: &Services) -> Client {
    let mut c = Client::new(s.router(Some(TOKEN)));
    c.login("ann", Some(TOKEN)).await;
    c
}

/// One call the fake received.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Call {
    pub method: &'static str,
    pub project_id: String,
    pub run_id: String,
    pub gate_id: String,
    pub node_id: String,
    pub by: String,
    /// note / text / reason / manifest_yaml
    pub text: String,
}

#[derive(Default)]
struct Runs {
    runs: HashMap<String, pb::RunInfo>,
    events: HashMap<String, Vec<pb::Event>>,
    /// Node output by run, in order.
    logs: HashMap<String, Vec<pb::LogChunk>>,
    calls: Vec<Call>,
    submits: Vec<pb::SubmitRunRequest>,
    lists: Vec<pb::ListRunsRequest>,
    diffs: Vec<pb::DiffRunsRequest>,
    /// What DiffRuns answers (None: an empty report, the runs identical).
    diff_reply: Option<pb::DiffRunsResponse>,
}

#[derive(Clone)]
pub struct FakeOrchestrator {
    state: Arc<Mutex<Runs>>,
    changed: Arc<watch::Sender<u64>>,
}

fn now() -> String {
    let t = time::OffsetDateTime::now_utc();
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

impl FakeOrchestrator {
    pub fn new() -> FakeOrchestrator {
        FakeOrchestrator {
            state: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    /// Every SubmitRun received, in order.
    pub fn submits(&self) -> Vec<pb::SubmitRunRequest> {
        self.state.lock().unwrap().submits.clone()
    }

    /// Every ListRuns received, in order.
    pub fn lists(&self) -> Vec<pb::ListRunsRequest> {
        self.state.lock().unwrap().lists.clone()
    }

    /// Every DiffRuns received, in order.
    pub fn diffs(&self) -> Vec<pb::DiffRunsRequest> {
        self.state.lock().unwrap().diffs.clone()
    }

    /// What DiffRuns answers from now on: `report` and `verdict` as the orchestrator's JSON.
    pub fn set_diff(&self, report: serde_json::Value, verdict: serde_json::Value) {
        self.state.lock().unwrap().diff_reply = Some(pb::DiffRunsResponse {
            report_json: report.to_string(),
            verdict: verdict["verdict"].as_str().unwrap_or_default().to_owned(),
            verdict_json: verdict.to_string(),
        });
    }

    pub fn run(&self, run_id: &str) -> pb::RunInfo {
        self.state.lock().unwrap().runs[run_id].clone()
    }

    pub fn add_run(&self, info: pb::RunInfo) {
        let mut s = self.state.lock().unwrap();
        s.events.entry(info.run_id.clone()).or_default();
        s.runs.insert(info.run_id.clone(), info);
    }

    pub fn set_title(&self, run_id: &str, title: &str) {
        self.state
            .lock()
            .unwrap()
            .runs
            .get_mut(run_id)
            .unwrap()
            .title = title.into();
    }

    /// Sets (or adds) node `node.id` of run `run_id` as GetRun reports it.
    pub fn set_node(&self, run_id: &str, node: pb::NodeInfo) {
        let mut s = self.state.lock().unwrap();
        let run = s.runs.get_mut(run_id).unwrap();
        match run.nodes.iter_mut().find(|n| n.id == node.id) {
            Some(n) => *n = node,
            None => run.nodes.push(node),
        }
    }

    /// Adds a chunk of node output (WatchLogs sends it) and wakes the watchers.
    pub fn add_log(&self, run_id: &str, chunk: pb::LogChunk) {
        self.state
            .lock()
            .unwrap()
            .logs
            .entry(run_id.to_owned())
            .or_default()
            .push(chunk);
        self.changed.send_modify(|v| *v += 1);
    }

    /// Appends an event with the next sequence number and wakes the watchers.
    pub fn emit(&self, run_id: &str, kind: &str, node: &str, data: serde_json::Value) -> u64 {
        let seq = {
            let mut s = self.state.lock().unwrap();
            let list = s.events.entry(run_id.to_owned()).or_default();
            let seq = list.len() as u64 + 1;
            let ts = now();
            let line = serde_json::json!({"ts": ts, "seq": seq, "type": kind, "run_id": run_id, "node_id": node, "data": data});
            list.push(pb::Event {
                seq,
                ts,
                r#type: kind.into(),
                run_id: run_id.into(),
                node_id: node.into(),
                level: pb::Level::Info as i32,
                data_json: data.to_string(),
                line_json: line.to_string(),
            });
            seq
        };
        self.changed.send_modify(|v| *v += 1);
        seq
    }

    fn record(&self, call: Call) {
        self.state.lock().unwrap().calls.push(call);
    }

    fn update(
        &self,
        run_id: &str,
        f: impl FnOnce(&mut pb::RunInfo) -> Result<(), Status>,
    ) -> Result<pb::RunInfo, Status> {
        let mut s = self.state.lock().unwrap();
        let run = s
            .runs
            .get_mut(run_id)
            .ok_or_else(|| Status::not_found(format!("run `{run_id}` not found")))?;
        f(run)?;
        run.updated_at = now();
        Ok(run.clone())
    }

    fn decide(&self, r: pb::GateDecisionRequest, approve: bool) -> Result<pb::RunInfo, Status> {
        self.record(Call {
            method: if approve { "ApproveGate" } else { "RejectGate" },
            project_id: r.project_id.clone(),
            run_id: r.run_id.clone(),
            gate_id: r.gate_id.clone(),
            by: r.by.clone(),
            text: r.note.clone(),
            ..Default::default()
        });
        let info = self.update(&r.run_id, |run| {
            let gate = run
                .gates
                .iter_mut()
                .find(|g| g.id == r.gate_id)
                .ok_or_else(|| Status::not_found(format!("gate `{}` not found", r.gate_id)))?;
            if gate.state != pb::GateState::Blocked as i32 {
                return Err(Status::failed_precondition(format!(
                    "gate `{}` is not blocked",
                    r.gate_id
                )));
            }
            gate.state = if approve {
                pb::GateState::Approved
            } else {
                pb::GateState::Rejected
            } as i32;
            gate.decided_by = r.by.clone();
            gate.note = r.note.clone();
            gate.decided_at = now();
            run.state = if approve {
                pb::TaskState::Completed
            } else {
                pb::TaskState::Failed
            } as i32;
            for n in &mut run.nodes {
                n.state = pb::NodeState::Succeeded as i32;
            }
            Ok(())
        })?;
        let kind = if approve {
            "gate.approved"
        } else {
            "gate.rejected"
        };
        self.emit(
            &r.run_id,
            kind,
            &r.gate_id,
            serde_json::json!({"gate_id": r.gate_id, "by": r.by, "note": r.note}),
        );
        self.emit(
            &r.run_id,
            if approve {
                "task.completed"
            } else {
                "task.failed"
            },
            "",
            serde_json::json!({}),
        );
        Ok(info)
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send + 'static>>;
type LogStream = Pin<Box<dyn Stream<Item = Result<pb::LogChunk, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Orchestrator for FakeOrchestrator {
    /// Starts a canned working run: the run id given (ALREADY_EXISTS when it exists, like the
    /// real one), `req-<request_id>` (the same run again for a repeated request id), else
    /// `run-<n>`; a graph that says `invalid` is refused.
    async fn submit_run(
        &self,
        req: GrpcRequest<pb::SubmitRunRequest>,
    ) -> Result<GrpcResponse<pb::RunInfo>, Status> {
        let r = req.into_inner();
        let mut s = self.state.lock().unwrap();
        s.submits.push(r.clone());
        if r.graph_yaml.contains("invalid") {
            return Err(Status::invalid_argument(
                "node `a`: field `type`: unknown node type",
            ));
        }
        let run_id = match (r.run_id.is_empty(), r.request_id.is_empty()) {
            (false, _) => r.run_id.clone(),
            (true, true) => format!("run-{}", s.runs.len() + 1),
            (true, false) => format!("req-{}", r.request_id),
        };
        if let Some(run) = s.runs.get(&run_id) {
            // Like the real one: a run id given twice is refused, a request id finds its run.
            if !r.run_id.is_empty() {
                return Err(Status::already_exists(format!("run {run_id} exists")));
            }
            return Ok(GrpcResponse::new(run.clone()));
        }
        let info = pb::RunInfo {
            run_id: run_id.clone(),
            project_id: r.project_id.clone(),
            title: if r.title.is_empty() {
                "Started".into()
            } else {
                r.title.clone()
            },
            state: pb::TaskState::Working as i32,
            created_at: now(),
            updated_at: now(),
            run_dir: format!(".cairn/runs/{run_id}"),
            rerun_of: r.rerun_of.clone(),
            ..Default::default()
        };
        s.events.entry(run_id.clone()).or_default();
        s.runs.insert(run_id, info.clone());
        Ok(GrpcResponse::new(info))
    }

    async fn get_run(
        &self,
        req: GrpcRequest<pb::GetRunRequest>,
    ) -> Result<GrpcResponse<pb::RunInfo>, Status> {
        let r = req.into_inner();
        let s = self.state.lock().unwrap();
        match s.runs.get(&r.run_id) {
            Some(run) if run.project_id == r.project_id => Ok(GrpcResponse::new(run.clone())),
            _ => Err(Status::not_found(format!(
                "run `{}` not found in project `{}`",
                r.run_id, r.project_id
            ))),
        }
    }

    async fn list_runs(
        &self,
        req: GrpcRequest<pb::ListRunsRequest>,
    ) -> Result<GrpcResponse<pb::ListRunsResponse>, Status> {
        let r = req.into_inner();
        let mut s = self.state.lock().unwrap();
        s.lists.push(r.clone());
        let mut runs: Vec<pb::RunInfo> = s
            .runs
            .values()
            .filter(|run| {
                run.project_id == r.project_id
                    && (r.states.is_empty() || r.states.contains(&run.state))
            })
            .cloned()
            .collect();
        runs.sort_by(|a, b| b.created_at.cmp(&a.created_at));
        // One page (the token is not followed: the tests read first pages).
        let size = r.page.as_ref().map_or(0, |p| p.page_size as usize);
        let next_page_token = if size > 0 && runs.len() > size {
            runs.truncate(size);
            "more".to_owned()
        } else {
            String::new()
        };
        Ok(GrpcResponse::new(pb::ListRunsResponse {
            runs,
            next_page_token,
        }))
    }

    type WatchRunStream = EventStream;

    async fn watch_run(
        &self,
        req: GrpcRequest<pb::WatchRunRequest>,
    ) -> Result<GrpcResponse<Self::WatchRunStream>, Status> {
        let r = req.into_inner();
        if !self.state.lock().unwrap().runs.contains_key(&r.run_id) {
            return Err(Status::not_found(format!("run `{}` not found", r.run_id)));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let me = self.clone();
        let mut changed = self.changed.subscribe();
        tokio::spawn(async move {
            let mut next = r.from_seq.max(1);
            loop {
                let (batch, done) = {
                    let s = me.state.lock().unwrap();
                    let batch: Vec<pb::Event> = s
                        .events
                        .get(&r.run_id)
                        .map(|l| l.iter().filter(|e| e.seq >= next).cloned().collect())
                        .unwrap_or_default();
                    let st = s.runs[&r.run_id].state;
                    let done = [
                        pb::TaskState::Completed,
                        pb::TaskState::Failed,
                        pb::TaskState::Canceled,
                    ]
                    .iter()
                    .any(|f| *f as i32 == st);
                    (batch, done)
                };
                for e in batch {
                    next = e.seq + 1;
                    if tx.send(Ok(e)).await.is_err() {
                        return;
                    }
                }
                // Follow mode goes on past the end, like the real orchestrator.
                if done && !r.follow_after_end {
                    return;
                }
                if changed.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(GrpcResponse::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    type WatchLogsStream = LogStream;

    async fn watch_logs(
        &self,
        req: GrpcRequest<pb::WatchLogsRequest>,
    ) -> Result<GrpcResponse<Self::WatchLogsStream>, Status> {
        let r = req.into_inner();
        if !self.state.lock().unwrap().runs.contains_key(&r.run_id) {
            return Err(Status::not_found(format!("run `{}` not found", r.run_id)));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let me = self.clone();
        let mut changed = self.changed.subscribe();
        tokio::spawn(async move {
            let after = (r.after_attempt, r.after_seq);
            let mut sent = 0;
            loop {
                let batch: Vec<pb::LogChunk> = {
                    let s = me.state.lock().unwrap();
                    s.logs
                        .get(&r.run_id)
                        .map(|l| l.iter().skip(sent).cloned().collect())
                        .unwrap_or_default()
                };
                sent += batch.len();
                for c in batch {
                    let wanted = (r.node_id.is_empty() || c.node_id == r.node_id)
                        && (c.attempt, c.seq) > after;
                    if wanted && tx.send(Ok(c)).await.is_err() {
                        return;
                    }
                }
                if !r.follow || changed.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(GrpcResponse::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn cancel_run(
        &self,
        req: GrpcRequest<pb::RunActionRequest>,
    ) -> Result<GrpcResponse<pb::RunInfo>, Status> {
        let r = req.into_inner();
        self.record(Call {
            method: "CancelRun",
            project_id: r.project_id.clone(),
            run_id: r.run_id.clone(),
            by: r.by.clone(),
            text: r.reason.clone(),
            ..Default::default()
        });
        let info = self.update(&r.run_id, |run| {
            run.state = pb::TaskState::Canceled as i32;
            Ok(())
        })?;
        self.emit(
            &r.run_id,
            "task.canceled",
            "",
            serde_json::json!({"by": r.by, "reason": r.reason}),
        );
        Ok(GrpcResponse::new(info))
    }

    /// A failed run works again; any other is refused as the real one refuses it.
    async fn resume_run(
        &self,
        req: GrpcRequest<pb::RunActionRequest>,
    ) -> Result<GrpcResponse<pb::RunInfo>, Status> {
        let r = req.into_inner();
        self.record(Call {
            method: "ResumeRun",
            project_id: r.project_id.clone(),
            run_id: r.run_id.clone(),
            by: r.by.clone(),
            text: r.reason.clone(),
            ..Default::default()
        });
        let info = self.update(&r.run_id, |run| {
            if run.state != pb::TaskState::Failed as i32 {
                return Err(Status::failed_precondition("the run has not failed"));
            }
            run.state = pb::TaskState::Working as i32;
            Ok(())
        })?;
        self.emit(
            &r.run_id,
            "task.resumed",
            "",
            serde_json::json!({"by": r.by, "reason": r.reason}),
        );
        Ok(GrpcResponse::new(info))
    }

    async fn approve_gate(
        &self,
        req: GrpcRequest<pb::GateDecisionRequest>,
    ) -> Result<GrpcResponse<pb::RunInfo>, Status> {
        Ok(GrpcResponse::new(self.decide(req.into_inner(), true)?))
    }

    async fn reject_gate(
        &self,
        req: GrpcRequest<pb::GateDecisionRequest>,
    ) -> Result<GrpcResponse<pb::RunInfo>, Status> {
        Ok(GrpcResponse::new(self.decide(req.into_inner(), false)?))
    }

    async fn add_note(
        &self,
        req: GrpcRequest<pb::AddNoteRequest>,
    ) -> Result<GrpcResponse<pb::AddNoteResponse>, Status> {
        let r = req.into_inner();
        self.record(Call {
            method: "AddNote",
            project_id: r.project_id.clone(),
            run_id: r.run_id.clone(),
            by: r.by.clone(),
            text: r.text.clone(),
            ..Default::default()
        });
        let seq = self.emit(
            &r.run_id,
            "human.note",
            "",
            serde_json::json!({"by": r.by, "ref": "shared/human-notes.md#note-2"}),
        );
        Ok(GrpcResponse::new(pb::AddNoteResponse {
            seq,
            r#ref: "shared/human-notes.md#note-2".into(),
        }))
    }

    async fn request_rework(
        &self,
        req: GrpcRequest<pb::ReworkRequest>,
    ) -> Result<GrpcResponse<pb::RunInfo>, Status> {
        let r = req.into_inner();
        self.record(Call {
            method: "RequestRework",
            project_id: r.project_id.clone(),
            run_id: r.run_id.clone(),
            node_id: r.node_id.clone(),
            by: r.by.clone(),
            text: r.note.clone(),
            ..Default::default()
        });
        let info = self.update(&r.run_id, |run| {
            run.state = pb::TaskState::Working as i32;
            Ok(())
        })?;
        self.emit(
            &r.run_id,
            "artifact.rework-requested",
            &r.node_id,
            serde_json::json!({"by": r.by, "note": r.note}),
        );
        Ok(GrpcResponse::new(info))
    }

    async fn edit_context(
        &self,
        req: GrpcRequest<pb::EditContextRequest>,
    ) -> Result<GrpcResponse<pb::EditContextResponse>, Status> {
        let r = req.into_inner();
        self.record(Call {
            method: "EditContext",
            project_id: r.project_id.clone(),
            run_id: r.run_id.clone(),
            by: r.by.clone(),
            text: r.manifest_yaml.clone(),
            ..Default::default()
        });
        if !r.manifest_yaml.trim_start().starts_with("attachments:") {
            return Err(Status::invalid_argument(
                "not a context manifest: expected a mapping with `attachments`",
            ));
        }
        let seq = self.emit(
            &r.run_id,
            "context.edited",
            "",
            serde_json::json!({"by": r.by}),
        );
        Ok(GrpcResponse::new(pb::EditContextResponse { seq }))
    }

    async fn edit_task(
        &self,
        req: GrpcRequest<pb::EditTaskRequest>,
    ) -> Result<GrpcResponse<pb::RunInfo>, Status> {
        let r = req.into_inner();
        let info = self.update(&r.run_id, |run| {
            if let Some(title) = &r.title {
                run.title = title.clone();
            }
            Ok(())
        })?;
        Ok(GrpcResponse::new(info))
    }

    async fn who_am_i(
        &self,
        _: GrpcRequest<pb::WhoAmIRequest>,
    ) -> Result<GrpcResponse<pb::WhoAmIResponse>, Status> {
        // Like an orchestrator without a tokens file.
        Ok(GrpcResponse::new(pb::WhoAmIResponse {
            name: "local".into(),
            role: "admin".into(),
            projects: Vec::new(),
            tokens_required: false,
        }))
    }

    async fn replay_run(
        &self,
        _: GrpcRequest<pb::ReplayRunRequest>,
    ) -> Result<GrpcResponse<pb::RunInfo>, Status> {
        Err(Status::unimplemented(
            "the console's fake orchestrator does not replay runs",
        ))
    }

    async fn diff_runs(
        &self,
        req: GrpcRequest<pb::DiffRunsRequest>,
    ) -> Result<GrpcResponse<pb::DiffRunsResponse>, Status> {
        let r = req.into_inner();
        let mut s = self.state.lock().unwrap();
        s.diffs.push(r.clone());
        for run in [&r.run_a, &r.run_b] {
            if !s.runs.contains_key(run.as_str()) {
                return Err(Status::not_found(format!("run `{run}` not found")));
            }
        }
        let verdict = serde_json::json!({"run_id": r.run_b, "replay_of": r.run_a, "verdict": "identical", "divergence": null});
        Ok(GrpcResponse::new(s.diff_reply.clone().unwrap_or_else(|| {
            pb::DiffRunsResponse {
                report_json: serde_json::json!({"run_a": r.run_a, "run_b": r.run_b, "graph": {"same": true}}).to_string(),
                verdict: "identical".into(),
                verdict_json: verdict.to_string(),
            }
        })))
    }
}

/// A run blocked at gate `review`, like the real orchestrator reports one.
pub fn blocked_run(run_id: &str, title: &str, created_at: &str) -> pb::RunInfo {
    let node = |id: &str, kind: &str, state: pb::NodeState| pb::NodeInfo {
        id: id.into(),
        r#type: kind.into(),
        state: state as i32,
        attempts: 1,
        ..Default::default()
    };
    pb::RunInfo {
        run_id: run_id.into(),
        project_id: PROJECT.into(),
        title: title.into(),
        state: pb::TaskState::InputRequired as i32,
        created_at: created_at.into(),
        updated_at: created_at.into(),
        nodes: vec![
            node("draft", "write_file", pb::NodeState::Succeeded),
            node("review", "gate", pb::NodeState::Blocked),
            node("publish", "write_file", pb::NodeState::Pending),
        ],
        gates: vec![pb::GateInfo {
            id: "review".into(),
            state: pb::GateState::Blocked as i32,
            reason: format!("check docs/{run_id}/draft.txt"),
            ..Default::default()
        }],
        run_dir: format!(".cairn/runs/{run_id}"),
        ..Default::default()
    }
}

pub fn task_yaml(run_id: &str) -> String {
    format!(
        "# Machine entry of this run\nid: {run_id}\ntitle: Draft and publish\ntopology: graph\nstate: input-required\nevents_seq: 2\nmilestones:\n  - id: draft\n    title: Write the draft\n    type: write_file\n    state: done\n    attempts: 1\n  - id: review\n    title: Human review\n    type: gate\n    state: blocked\n    attempts: 1\n  - id: publish\n    title: Publish\n    type: write_file\n    state: pending\n    attempts: 0\nroster:\n  - instance: writer-1\n    agent: writer\n    state: awaiting\n    node: draft\ngates:\n  - id: review\n    type: human-approval\n    state: blocked\n"
    )
}

pub fn manifest_json(run_id: &str) -> String {
    serde_json::json!({
        "version": "1", "run_id": run_id, "node_id": "draft",
        "source": {"kind": "node_output", "mode": "auto", "doc_path": format!("docs/{run_id}/draft.md")},
        "artifacts": [
            {"index": 0, "lang": "rust", "declared_file": "src/main.rs", "workspace_path": "workspace/src/main.rs", "bytes": 42, "sha256": "ab", "status": "written", "reason": ""},
            {"index": 1, "lang": "sh", "declared_file": "../../etc/passwd", "workspace_path": "", "bytes": 9, "sha256": "", "status": "rejected", "reason": "traversal"}
        ],
        "summary": {"total_blocks": 2, "written": 1, "skipped": 0, "rejected": 1},
        "ts": "2026-01-01T00:00:01.000Z"
    })
    .to_string()
}

/// The real orchestrator over the store at `store_addr`, served on a 127.0.0.1 port.
pub async fn real_orchestrator(store_addr: &str) -> (String, cairn_orchestrator::Handle) {
    let config = cairn_orchestrator::Config {
        store_addr: store_addr.to_owned(),
        snapshot_interval_ms: 100,
        ..cairn_orchestrator::Config::default()
    };
    let (server, handle) = cairn_orchestrator::orchestrator_service(config)
        .await
        .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut host = cairn_server::Host::new();
        host.add(server);
        let _ = host.serve(l, std::future::pending()).await;
    });
    (addr, handle)
}

/// A sandbox runner on a 127.0.0.1 port (Docker when CAIRN_REQUIRE_DOCKER=1, else the local
/// backend) and the real orchestrator over it and the store; Err(why) when no runner can start
/// here.
pub async fn real_orchestrator_with_runner(
    store_addr: &str,
    dir: &std::path::Path,
) -> Result<
    (
        String,
        cairn_orchestrator::Handle,
        cairn_sandbox_runner::RunnerHandle,
    ),
    String,
> {
    let docker = std::env::var("CAIRN_REQUIRE_DOCKER").is_ok_and(|v| v == "1");
    let config = cairn_sandbox_runner::Config {
        work_root: dir.join("sandbox-work"),
        runner_id: format!("consoletest{}", std::process::id()),
        backend: if docker {
            cairn_sandbox_runner::BackendChoice::Docker
        } else {
            cairn_sandbox_runner::BackendChoice::Local
        },
        ..Default::default()
    };
    let (server, runner) = match cairn_sandbox_runner::sandbox_service(config).await {
        Ok(r) => r,
        Err(e) if docker => panic!("CAIRN_REQUIRE_DOCKER=1 but the docker runner failed: {e}"),
        Err(e) => return Err(e.to_string()),
    };
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sandbox_addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut host = cairn_server::Host::new();
        host.add(server);
        let _ = host.serve(l, std::future::pending()).await;
    });
    let config = cairn_orchestrator::Config {
        store_addr: store_addr.to_owned(),
        sandbox_addrs: vec![sandbox_addr],
        snapshot_interval_ms: 100,
        ..cairn_orchestrator::Config::default()
    };
    let (server, handle) = cairn_orchestrator::orchestrator_service(config)
        .await
        .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut host = cairn_server::Host::new();
        host.add(server);
        let _ = host.serve(l, std::future::pending()).await;
    });
    Ok((addr, handle, runner))
}

/// Every event of the run, as the store holds them.
pub async fn read_store_events(store_addr: &str, run: &str) -> Vec<pb::Event> {
    let mut client = ArtifactStoreClient::new(cairn_server::connect(store_addr).unwrap());
    let mut stream = client
        .read_events(pb::ReadEventsRequest {
            project_id: PROJECT.into(),
            run_id: run.into(),
            from_seq: 1,
            follow: false,
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(e) = stream.message().await.unwrap() {
        out.push(e);
    }
    out
}

/// Appends `events` (their type, node, level and data) to the run's events in the store.
pub async fn append_events(store_addr: &str, project: &str, run: &str, events: &[pb::Event]) {
    let mut client = ArtifactStoreClient::new(cairn_server::connect(store_addr).unwrap());
    client
        .append_events(pb::AppendEventsRequest {
            project_id: project.into(),
            run_id: run.into(),
            events: events
                .iter()
                .map(|e| pb::EventInput {
                    r#type: e.r#type.clone(),
                    node_id: e.node_id.clone(),
                    level: e.level,
                    data_json: e.data_json.clone(),
                })
                .collect(),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// Writes one file into the store (overwriting). A run record is written as the run's writer
/// (claimed and fenced), as the orchestrator writes them: the store refuses a task.yaml written
/// by hand unless it only edits the few fields people may change.
pub async fn put(store_addr: &str, project: &str, path: &str, bytes: Vec<u8>) {
    let mut client = ArtifactStoreClient::new(cairn_server::connect(store_addr).unwrap())
        .max_encoding_message_size(64 << 20);
    let run = path
        .strip_prefix(".cairn/runs/")
        .and_then(|rest| rest.split('/').next());
    let fence = match run {
        Some(run) => {
            // The project must exist before a claim.
            let _ = client
                .create_project(pb::CreateProjectRequest {
                    project_id: project.into(),
                })
                .await;
            let claim = client
                .claim_run(pb::ClaimRunRequest {
                    project_id: project.into(),
                    run_id: run.into(),
                    holder: "console test".into(),
                })
                .await
                .unwrap()
                .into_inner();
            Some(pb::RunFence {
                run_id: run.into(),
                epoch: claim.epoch,
            })
        }
        None => None,
    };
    let msgs = vec![
        pb::PutRequest {
            msg: Some(pb::put_request::Msg::Header(pb::PutHeader {
                project_id: project.into(),
                path: path.into(),
                overwrite: true,
                create_project: true,
                fence,
                ..Default::default()
            })),
        },
        pb::PutRequest {
            msg: Some(pb::put_request::Msg::Chunk(bytes.into())),
        },
    ];
    client.put(tokio_stream::iter(msgs)).await.unwrap();
}

/// The store (real) and the orchestrator (fake) on loopback ports, with the canned run's files.
pub struct Services {
    pub dir: tempfile::TempDir,
    pub store_addr: String,
    pub orchestrator_addr: String,
    pub fake: FakeOrchestrator,
    stops: Vec<oneshot::Sender<()>>,
}

async fn host<S>(svc: S) -> (String, oneshot::Sender<()>)
where
    S: tower::Service<axum::http::Request<tonic::body::Body>, Error = std::convert::Infallible>
        + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Response: axum::response::IntoResponse,
    S::Future: Send + 'static,
{
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut host = cairn_server::Host::new();
        host.add(svc);
        let _ = host
            .serve(l, async {
                let _ = rx.await;
            })
            .await;
    });
    (addr, tx)
}

/// Starts a real artifact-store over a temp dir.
pub async fn start_store(dir: &std::path::Path) -> (String, oneshot::Sender<()>) {
    let svc = cairn_artifact_store::artifact_store_service(cairn_artifact_store::Config::new(
        dir.join("data"),
    ))
    .await
    .unwrap();
    host(svc).await
}

impl Services {
    pub async fn start() -> Services {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let (store_addr, store_stop) = start_store(dir.path()).await;
        let fake = FakeOrchestrator::new();
        let (orchestrator_addr, orch_stop) = host(OrchestratorServer::new(fake.clone())).await;
        fake.add_run(blocked_run(
            RUN,
            "Draft and publish",
            "2026-01-01T00:00:00.000Z",
        ));
        fake.emit(RUN, "task.created", "", serde_json::json!({"by": "cli"}));
        fake.emit(
            RUN,
            "gate.blocked",
            "review",
            serde_json::json!({"reason": "check docs/run-1/draft.txt"}),
        );
        let s = Services {
            dir,
            store_addr,
            orchestrator_addr,
            fake,
            stops: vec![store_stop, orch_stop],
        };
        let run_dir = format!(".cairn/runs/{RUN}");
        s.put(&format!("{run_dir}/task.yaml"), task_yaml(RUN)).await;
        // The store holds what the fake emitted so far: the page reads events from the store.
        let emitted: Vec<pb::Event> = s.fake.state.lock().unwrap().events[RUN].clone();
        append_events(&s.store_addr, PROJECT, RUN, &emitted).await;
        s.put(
            &format!("{run_dir}/shared/human-notes.md"),
            "---\ntitle: \"Human notes\"\n---\n# Human notes for run run-1\n\n<a id=\"note-1\"></a>\n### Note 1: note (by ann, 2026-01-01)\n\nKeep the API stable. <img src=x onerror=alert(1)> [click](javascript:alert(2))\n",
        )
        .await;
        s.put(&format!("{run_dir}/shared/context-manifest.yaml"), "attachments:\n  - id: contract\n    kind: file\n    path: ./shared/contracts/api.md\n    reason: the API\n").await;
        s.put(&format!("{run_dir}/ingest/draft.json"), manifest_json(RUN))
            .await;
        s.put(
            &format!("{run_dir}/ingest/enabled.json"),
            "{\"enabled\": true}",
        )
        .await;
        s.put(
            "docs/run-1/report.md",
            "# Report\n\nSome **bold** text.\n\n<script>alert('md')</script>\n\n[next](next.md) [evil](javascript:alert(3))\n",
        )
        .await;
        s.put(
            "workspace/src/main.rs",
            "fn main() { println!(\"<b>hi</b>\"); }\n",
        )
        .await;
        s.put("docs/run-1/a&b'c.md", "# odd name\n").await;
        s.put_bytes("docs/run-1/bundle.zip", {
            let mut b = b"PK\x03\x04".to_vec();
            b.extend((0..3_000_000u32).map(|i| (i % 251) as u8));
            b
        })
        .await;
        s
    }

    pub async fn put(&self, path: &str, text: impl Into<String>) {
        put(&self.store_addr, PROJECT, path, text.into().into_bytes()).await
    }

    /// An event of run `run`, both where the page reads it (the store) and live (the fake's
    /// WatchRun).
    pub async fn emit(&self, run: &str, kind: &str, node: &str, data: serde_json::Value) {
        self.fake.emit(run, kind, node, data);
        let last = self.fake.state.lock().unwrap().events[run]
            .last()
            .cloned()
            .unwrap();
        append_events(&self.store_addr, PROJECT, run, &[last]).await;
    }

    /// Many events of run `run` at once, as [`Services::emit`] does one by one.
    pub async fn emit_all(&self, run: &str, events: &[(&str, &str, serde_json::Value)]) {
        for (kind, node, data) in events {
            self.fake.emit(run, kind, node, data.clone());
        }
        let all = self.fake.state.lock().unwrap().events[run].clone();
        let new = &all[all.len() - events.len()..];
        append_events(&self.store_addr, PROJECT, run, new).await;
    }

    pub async fn put_bytes(&self, path: &str, bytes: Vec<u8>) {
        put(&self.store_addr, PROJECT, path, bytes).await
    }

    pub fn config(&self, token: Option<&str>) -> ConsoleConfig {
        ConsoleConfig {
            enabled: true,
            orchestrator_addr: self.orchestrator_addr.clone(),
            store_addr: self.store_addr.clone(),
            token: token.map(str::to_owned),
            ..ConsoleConfig::default()
        }
    }

    pub fn router(&self, token: Option<&str>) -> Router {
        console_router(self.config(token)).unwrap()
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        for tx in self.stops.drain(..) {
            let _ = tx.send(());
        }
    }
}

/// A response as the tests look at it.
pub struct Page {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: String,
    pub bytes: Vec<u8>,
}

impl Page {
    pub fn location(&self) -> &str {
        self.headers
            .get(header::LOCATION)
            .map(|v| v.to_str().unwrap())
            .unwrap_or("")
    }

    /// The CSRF token of the first form on the page.
    pub fn csrf(&self) -> String {
        let at = self
            .body
            .find("name=\"csrf\" value=\"")
            .expect("a form with a csrf field")
            + 19;
        self.body[at..].split('"').next().unwrap().to_owned()
    }
}

pub fn encode(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                utf8_percent_encode(k, NON_ALPHANUMERIC),
                utf8_percent_encode(v, NON_ALPHANUMERIC)
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// A browser without a browser: keeps the session cookie across requests to the router.
pub struct Client {
    pub router: Router,
    pub cookie: Option<String>,
}

impl Client {
    pub fn new(router: Router) -> Client {
        Client {
            router,
            cookie: None,
        }
    }

    pub async fn send(&mut self, req: Request<Body>) -> Page {
        let res = self.router.clone().oneshot(req).await.unwrap();
        for v in res.headers().get_all(header::SET_COOKIE) {
            let v = v.to_str().unwrap();
            let pair = v.split(';').next().unwrap();
            if let Some(id) = pair.strip_prefix("cairn_console=") {
                self.cookie = (!id.is_empty()).then(|| id.to_owned());
            }
        }
        let status = res.status();
        let headers = res.headers().clone();
        let bytes = axum::body::to_bytes(res.into_body(), 64 << 20)
            .await
            .unwrap()
            .to_vec();
        Page {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
        }
    }

    /// A request as a browser on the console's own page sends it: with its Host, and the
    /// console's Origin on POSTs.
    fn builder(&self, method: &str, uri: &str) -> axum::http::request::Builder {
        let mut b = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::HOST, CONSOLE_HOST);
        if method == "POST" {
            b = b.header(header::ORIGIN, CONSOLE_ORIGIN);
        }
        if let Some(c) = &self.cookie {
            b = b.header(header::COOKIE, format!("cairn_console={c}"));
        }
        b
    }

    /// A request with exactly these headers (besides the session cookie).
    pub async fn raw(
        &mut self,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        form: &[(&str, &str)],
    ) -> Page {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(c) = &self.cookie {
            b = b.header(header::COOKIE, format!("cairn_console={c}"));
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        if !form.is_empty() {
            b = b.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        let req = b.body(Body::from(encode(form))).unwrap();
        self.send(req).await
    }

    pub async fn get(&mut self, uri: &str) -> Page {
        let req = self.builder("GET", uri).body(Body::empty()).unwrap();
        self.send(req).await
    }

    /// GETs an event stream and reads it until its text contains `needle` (10 s at most);
    /// returns the text and whether the stream was still open 300 ms later.
    pub async fn stream_until(
        &mut self,
        uri: &str,
        headers: &[(&str, &str)],
        needle: &str,
    ) -> (String, bool) {
        use futures::StreamExt;
        let mut b = self.builder("GET", uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let res = self
            .router
            .clone()
            .oneshot(b.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let mut body = res.into_body().into_data_stream();
        let mut text = String::new();
        let found = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while !text.contains(needle) {
                match body.next().await {
                    Some(Ok(chunk)) => text.push_str(&String::from_utf8_lossy(&chunk)),
                    _ => return false,
                }
            }
            true
        })
        .await;
        assert!(
            matches!(found, Ok(true)),
            "no {needle:?} in the stream: {text}"
        );
        let open = tokio::time::timeout(std::time::Duration::from_millis(300), async {
            loop {
                match body.next().await {
                    // Keep-alive comments and later events: still open.
                    Some(Ok(chunk)) => text.push_str(&String::from_utf8_lossy(&chunk)),
                    _ => return,
                }
            }
        })
        .await
        .is_err();
        (text, open)
    }

    pub async fn get_with(&mut self, uri: &str, name: &str, value: &str) -> Page {
        let req = self
            .builder("GET", uri)
            .header(name, value)
            .body(Body::empty())
            .unwrap();
        self.send(req).await
    }

    pub async fn post(&mut self, uri: &str, fields: &[(&str, &str)]) -> Page {
        let req = self
            .builder("POST", uri)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(encode(fields)))
            .unwrap();
        self.send(req).await
    }

    /// GET /login, then POST it with `name` (and `token`); returns the response of the POST.
    pub async fn login(&mut self, name: &str, token: Option<&str>) -> Page {
        let form = self.get("/login").await;
        assert_eq!(form.status, StatusCode::OK, "{}", form.body);
        let csrf = form.csrf();
        let mut fields = vec![("csrf", csrf.as_str()), ("name", name), ("next", "/runs")];
        if let Some(t) = token {
            fields.push(("token", t));
        }
        self.post("/login", &fields).await
    }

    /// GET /login, then POST it with a personal token of the tokens file (no name: the file
    /// names the person); returns the response of the POST.
    pub async fn login_token(&mut self, token: &str) -> Page {
        let form = self.get("/login").await;
        assert_eq!(form.status, StatusCode::OK, "{}", form.body);
        let csrf = form.csrf();
        self.post(
            "/login",
            &[("csrf", csrf.as_str()), ("token", token), ("next", "/runs")],
        )
        .await
    }

    /// The CSRF token of this session, read from a page that has forms.
    pub async fn csrf(&mut self) -> String {
        self.get(&format!("/projects/{PROJECT}/runs/{RUN}"))
            .await
            .csrf()
    }
}

/// A DiffRuns answer comparing `a` and `b` as the orchestrator writes it: the graph and a
/// variable changed, node `draft`'s outputs and its file differ (the new text names markup,
/// which the page must show as text), `review` is the same, `extra` ran in B only, and B
/// diverged at `draft`.
pub fn sample_diff(a: &str, b: &str) -> (serde_json::Value, serde_json::Value) {
    let report = serde_json::json!({
        "run_a": a, "run_b": b,
        "state": {"a": "completed", "b": "completed"},
        "graph": {"same": false, "diff": "--- a\n+++ b\n@@ -1,3 +1,4 @@\n {\n   \"nodes\": [\n+    \"extra\",\n     \"draft\"\n"},
        "vars": [{"name": "topic", "a": "snow", "b": "<b>rain</b>"}, {"name": "only_a", "a": "1", "b": null}],
        "nodes": [
            {"node": "draft", "attempts": {"a": 1, "b": 2}, "outputs_same": false,
             "outputs_diff": "--- a\n+++ b\n@@ -1,3 +1,3 @@\n {\n-  \"words\": 10\n+  \"words\": 12\n }\n",
             "usage": {"a": {"prompt_tokens": 10, "completion_tokens": 5}, "b": {"prompt_tokens": 11, "completion_tokens": 7}},
             "duration_ms": {"a": 1200, "b": 65000}},
            {"node": "review", "attempts": {"a": 1, "b": 1}, "outputs_same": true,
             "usage": {"a": {"prompt_tokens": 0, "completion_tokens": 0}, "b": {"prompt_tokens": 0, "completion_tokens": 0}},
             "duration_ms": {"a": 5, "b": null}},
            {"node": "extra", "attempts": {"a": 0, "b": 1}, "outputs_same": false, "outputs_diff": "--- a\n+++ b\n@@ -1 +1 @@\n-null\n+{}\n",
             "usage": {"a": {"prompt_tokens": 0, "completion_tokens": 0}, "b": {"prompt_tokens": 0, "completion_tokens": 0}},
             "duration_ms": {"a": null, "b": 3}}
        ],
        "files": [
            {"path": "docs/⟨run_id⟩/draft.md", "sha256": {"a": "sha256:aaaa1111", "b": "sha256:bbbb2222"}, "same": false,
             "diff": "--- a/docs/⟨run_id⟩/draft.md\n+++ b/docs/⟨run_id⟩/draft.md\n@@ -1,2 +1,2 @@\n # Draft\n-snow falls\n+<script>alert(1)</script> rain falls\n"},
            {"path": "docs/⟨run_id⟩/same.md", "sha256": {"a": "sha256:cccc", "b": "sha256:cccc"}, "same": true},
            {"path": "docs/⟨run_id⟩/image.png", "sha256": {"a": null, "b": "sha256:dddd"}, "same": false}
        ],
        "usage": {"a": {"prompt_tokens": 10, "completion_tokens": 5}, "b": {"prompt_tokens": 11, "completion_tokens": 7}},
        "duration_ms": {"a": 1300, "b": 66000}
    });
    let verdict = serde_json::json!({
        "run_id": b, "replay_of": a, "verdict": "diverged",
        "divergence": {"node": "draft", "attempt": 2, "what": "outputs",
                       "diff": "--- a\n+++ b\n@@ -1,3 +1,3 @@\n {\n-  \"words\": 10\n+  \"words\": 12\n }\n"}
    });
    (report, verdict)
}
