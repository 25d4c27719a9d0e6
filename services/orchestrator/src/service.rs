//! The Orchestrator gRPC service: authorize, decode, call `Runs`, encode. Nothing else lives
//! here. Every handler first asks `auth` whether its caller may make this call on this project
//! (the one table is `auth::Rpc::required_role`); the `by` it records is the caller's.

use std::pin::Pin;
use std::sync::Arc;

use cairn_proto::v1 as pb;
use cairn_proto::v1::orchestrator_server::Orchestrator;
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::auth::{Auth, Caller, Rpc};
use crate::error::Error;
use crate::gates::Decision;
use crate::logs::LogQuery;
use crate::run::TaskState;
use crate::runs::{RunFilter, Runs, Submit};

#[derive(Clone)]
pub struct OrchestratorService {
    runs: Arc<Runs>,
    auth: Arc<Auth>,
}

impl OrchestratorService {
    pub fn new(runs: Arc<Runs>, auth: Arc<Auth>) -> Self {
        OrchestratorService { runs, auth }
    }

    /// Who may make `rpc` on the request's project (refusals are logged there).
    fn caller<T>(&self, req: &Request<T>, rpc: Rpc, project: &str) -> Result<Caller, Status> {
        Ok(self.auth.authorize(req, rpc, project)?)
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send + 'static>>;
type LogStream = Pin<Box<dyn Stream<Item = Result<pb::LogChunk, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Orchestrator for OrchestratorService {
    async fn submit_run(
        &self,
        req: Request<pb::SubmitRunRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let who = self.caller(&req, Rpc::SubmitRun, &req.get_ref().project_id)?;
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        let submit = Submit {
            project_id: r.project_id,
            graph_yaml: r.graph_yaml,
            vars: r.vars.into_iter().collect(),
            run_id: r.run_id,
            title: r.title,
            mode: r.mode,
            prompt: r.prompt,
            by: who.by(&r.by),
            llm: r.llm,
            base_dir: r.base_dir,
            request_id: r.request_id,
            rerun_of: r.rerun_of,
        };
        Ok(Response::new(self.runs.submit(submit).await?))
    }

    async fn get_run(
        &self,
        req: Request<pb::GetRunRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        self.caller(&req, Rpc::GetRun, &req.get_ref().project_id)?;
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        Ok(Response::new(
            self.runs.get(&r.project_id, &r.run_id).await?,
        ))
    }

    async fn list_runs(
        &self,
        req: Request<pb::ListRunsRequest>,
    ) -> Result<Response<pb::ListRunsResponse>, Status> {
        self.caller(&req, Rpc::ListRuns, &req.get_ref().project_id)?;
        let r = req.into_inner();
        let mut states = Vec::with_capacity(r.states.len());
        for s in &r.states {
            let state = cairn_proto::reason::known::<pb::TaskState>("states", *s)?;
            // UNSPECIFIED filters nothing (as before: an empty list lists every run).
            states.extend(TaskState::from_proto(state));
        }
        let filter = RunFilter {
            states,
            text: search_text(&r.text)?,
            created_after: time_bound("created_after", &r.created_after)?,
            created_before: time_bound("created_before", &r.created_before)?,
        };
        let page = r.page.unwrap_or_default();
        let (runs, next_page_token) = self
            .runs
            .list(&r.project_id, &filter, page.page_size, &page.page_token)
            .await?;
        Ok(Response::new(pb::ListRunsResponse {
            runs,
            next_page_token,
        }))
    }

    type WatchRunStream = EventStream;

    async fn watch_run(
        &self,
        req: Request<pb::WatchRunRequest>,
    ) -> Result<Response<Self::WatchRunStream>, Status> {
        self.caller(&req, Rpc::WatchRun, &req.get_ref().project_id)?;
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        let rx = self
            .runs
            .watch(&r.project_id, &r.run_id, r.from_seq, r.follow_after_end)
            .await?;
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    type WatchLogsStream = LogStream;

    async fn watch_logs(
        &self,
        req: Request<pb::WatchLogsRequest>,
    ) -> Result<Response<Self::WatchLogsStream>, Status> {
        self.caller(&req, Rpc::WatchLogs, &req.get_ref().project_id)?;
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, &r.node_id);
        let q = LogQuery {
            project: r.project_id,
            run_id: r.run_id,
            node: Some(r.node_id).filter(|n| !n.is_empty()),
            follow: r.follow,
            after_attempt: r.after_attempt,
            after_seq: r.after_seq,
        };
        let rx = self.runs.clone().watch_logs(q).await?;
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn cancel_run(
        &self,
        req: Request<pb::RunActionRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let who = self.caller(&req, Rpc::CancelRun, &req.get_ref().project_id)?;
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        Ok(Response::new(
            self.runs
                .cancel(&r.project_id, &r.run_id, &who.by(&r.by), &r.reason)
                .await?,
        ))
    }

    async fn resume_run(
        &self,
        req: Request<pb::RunActionRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let who = self.caller(&req, Rpc::ResumeRun, &req.get_ref().project_id)?;
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        Ok(Response::new(
            self.runs
                .resume(&r.project_id, &r.run_id, &who.by(&r.by), &r.reason)
                .await?,
        ))
    }

    async fn approve_gate(
        &self,
        req: Request<pb::GateDecisionRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let who = self.caller(&req, Rpc::ApproveGate, &req.get_ref().project_id)?;
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, &r.gate_id);
        let info = self
            .runs
            .decide(
                &r.project_id,
                &r.run_id,
                &r.gate_id,
                Decision::Approve,
                &who.by(&r.by),
                &r.note,
            )
            .await?;
        Ok(Response::new(info))
    }

    async fn reject_gate(
        &self,
        req: Request<pb::GateDecisionRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let who = self.caller(&req, Rpc::RejectGate, &req.get_ref().project_id)?;
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, &r.gate_id);
        let info = self
            .runs
            .decide(
                &r.project_id,
                &r.run_id,
                &r.gate_id,
                Decision::Reject,
                &who.by(&r.by),
                &r.note,
            )
            .await?;
        Ok(Response::new(info))
    }

    async fn add_note(
        &self,
        req: Request<pb::AddNoteRequest>,
    ) -> Result<Response<pb::AddNoteResponse>, Status> {
        let who = self.caller(&req, Rpc::AddNote, &req.get_ref().project_id)?;
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        let (seq, note_ref) = self
            .runs
            .add_note(&r.project_id, &r.run_id, &who.by(&r.by), &r.text)
            .await?;
        Ok(Response::new(pb::AddNoteResponse {
            seq,
            r#ref: note_ref,
        }))
    }

    async fn request_rework(
        &self,
        req: Request<pb::ReworkRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let who = self.caller(&req, Rpc::RequestRework, &req.get_ref().project_id)?;
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, &r.node_id);
        Ok(Response::new(
            self.runs
                .rework(
                    &r.project_id,
                    &r.run_id,
                    &r.node_id,
                    &who.by(&r.by),
                    &r.note,
                )
                .await?,
        ))
    }

    async fn edit_context(
        &self,
        req: Request<pb::EditContextRequest>,
    ) -> Result<Response<pb::EditContextResponse>, Status> {
        let who = self.caller(&req, Rpc::EditContext, &req.get_ref().project_id)?;
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        let seq = self
            .runs
            .edit_context(&r.project_id, &r.run_id, &who.by(&r.by), &r.manifest_yaml)
            .await?;
        Ok(Response::new(pb::EditContextResponse { seq }))
    }

    async fn who_am_i(
        &self,
        req: Request<pb::WhoAmIRequest>,
    ) -> Result<Response<pb::WhoAmIResponse>, Status> {
        let who = self.caller(&req, Rpc::WhoAmI, "")?;
        Ok(Response::new(pb::WhoAmIResponse {
            name: who.name,
            role: who.role.as_str().to_owned(),
            projects: who.projects,
            tokens_required: self.auth.tokens_required(),
        }))
    }
}

/// Longest ListRuns search text, in characters.
const MAX_SEARCH_CHARS: usize = 200;

fn search_text(text: &str) -> Result<String, Status> {
    let text = text.trim();
    if text.chars().count() > MAX_SEARCH_CHARS {
        return Err(Error::InvalidArgument(format!(
            "text is {} characters; search with at most {MAX_SEARCH_CHARS}",
            text.chars().count()
        ))
        .into());
    }
    Ok(text.to_lowercase())
}

fn time_bound(field: &str, text: &str) -> Result<Option<time::OffsetDateTime>, Status> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    time::OffsetDateTime::parse(text.trim(), &time::format_description::well_known::Rfc3339)
        .map(Some)
        .map_err(|e| {
            Error::InvalidArgument(format!(
                "{field} `{text}` is not an RFC 3339 time (e.g. 2026-11-25T00:00:00Z): {e}"
            ))
            .into()
        })
}
