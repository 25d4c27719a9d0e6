//! The Orchestrator gRPC service: decode, call `Runs`, encode. Nothing else lives here.

use std::pin::Pin;
use std::sync::Arc;

use cairn_proto::v1 as pb;
use cairn_proto::v1::orchestrator_server::Orchestrator;
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::gates::Decision;
use crate::run::TaskState;
use crate::runs::{Runs, Submit};

#[derive(Clone)]
pub struct OrchestratorService {
    runs: Arc<Runs>,
}

impl OrchestratorService {
    pub fn new(runs: Arc<Runs>) -> Self {
        OrchestratorService { runs }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Orchestrator for OrchestratorService {
    async fn submit_run(
        &self,
        req: Request<pb::SubmitRunRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
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
            by: r.by,
            llm: r.llm,
            base_dir: r.base_dir,
        };
        Ok(Response::new(self.runs.submit(submit).await?))
    }

    async fn get_run(
        &self,
        req: Request<pb::GetRunRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
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
        let r = req.into_inner();
        let states: Vec<TaskState> = r
            .states
            .iter()
            .filter_map(|s| {
                pb::TaskState::try_from(*s)
                    .ok()
                    .and_then(TaskState::from_proto)
            })
            .collect();
        let page = r.page.unwrap_or_default();
        let (runs, next_page_token) = self
            .runs
            .list(&r.project_id, &states, page.page_size, &page.page_token)
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

    async fn cancel_run(
        &self,
        req: Request<pb::RunActionRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        Ok(Response::new(
            self.runs
                .cancel(&r.project_id, &r.run_id, &r.by, &r.reason)
                .await?,
        ))
    }

    async fn resume_run(
        &self,
        req: Request<pb::RunActionRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        Ok(Response::new(
            self.runs
                .resume(&r.project_id, &r.run_id, &r.by, &r.reason)
                .await?,
        ))
    }

    async fn approve_gate(
        &self,
        req: Request<pb::GateDecisionRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, &r.gate_id);
        let info = self
            .runs
            .decide(
                &r.project_id,
                &r.run_id,
                &r.gate_id,
                Decision::Approve,
                &r.by,
                &r.note,
            )
            .await?;
        Ok(Response::new(info))
    }

    async fn reject_gate(
        &self,
        req: Request<pb::GateDecisionRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, &r.gate_id);
        let info = self
            .runs
            .decide(
                &r.project_id,
                &r.run_id,
                &r.gate_id,
                Decision::Reject,
                &r.by,
                &r.note,
            )
            .await?;
        Ok(Response::new(info))
    }

    async fn add_note(
        &self,
        req: Request<pb::AddNoteRequest>,
    ) -> Result<Response<pb::AddNoteResponse>, Status> {
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        let (seq, note_ref) = self
            .runs
            .add_note(&r.project_id, &r.run_id, &r.by, &r.text)
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
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, &r.node_id);
        Ok(Response::new(
            self.runs
                .rework(&r.project_id, &r.run_id, &r.node_id, &r.by, &r.note)
                .await?,
        ))
    }

    async fn edit_context(
        &self,
        req: Request<pb::EditContextRequest>,
    ) -> Result<Response<pb::EditContextResponse>, Status> {
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        let seq = self
            .runs
            .edit_context(&r.project_id, &r.run_id, &r.by, &r.manifest_yaml)
            .await?;
        Ok(Response::new(pb::EditContextResponse { seq }))
    }
}
