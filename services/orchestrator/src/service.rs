//! The Orchestrator gRPC service: authorize, decode, call `Runs`, encode. Nothing else lives
//! here. Every handler first asks `auth` whether its caller may make this call on this project
//! (the one table is `auth::Rpc::required_role`); the `by` it records is the caller's.
//!
//! With replicas (the cairn-cluster crate), a call about a run another replica drives is sent on to it
//! with the caller's credentials, which it checks again; reads of records (ListRuns,
//! WatchRun) are answered by any replica from the store.

use std::pin::Pin;
use std::sync::Arc;

use cairn_proto::v1 as pb;
use cairn_proto::v1::orchestrator_server::Orchestrator;
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::auth::{Auth, Caller, Rpc};
use crate::cluster::Route;
use crate::error::Error;
use crate::gates::Decision;
use crate::logs::LogQuery;
use crate::run::TaskState;
use crate::runs::{RunFilter, Runs, Submit};
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_telemetry::TracedChannel;

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
        Ok(self
            .auth
            .authorize(req, rpc, project)
            .map_err(crate::error::Error::from)?)
    }

    /// The replica a call about `project/run_id` goes to, when another one drives the run.
    /// A call a replica sent on is answered where it arrives (no forwarding loops while two
    /// replicas' views of the members differ).
    fn peer<T>(
        &self,
        req: &Request<T>,
        project: &str,
        run_id: &str,
    ) -> Result<Option<Peer>, Status> {
        let Some(cluster) = self.runs.cluster() else {
            return Ok(None);
        };
        if req.metadata().contains_key(FORWARDED_BY) && from_a_replica(req) {
            return Ok(None);
        }
        match cluster.route(project, run_id) {
            Ok(Route::Here) => Ok(None),
            Ok(Route::Peer { member, client }) => Ok(Some(Peer {
                member,
                client: *client,
                me: cluster.me().to_owned(),
            })),
            Err(why) => Err(cairn_proto::reason::status(
                tonic::Code::Unavailable,
                why,
                "not_in_cluster",
            )),
        }
    }
}

/// The metadata a forwarded call carries: the member id of the replica that sent it on.
pub const FORWARDED_BY: &str = "x-cairn-forwarded-by";

/// Whether a call came from another replica: the `orchestrator` certificate, or a plaintext
/// connection (the trusted single-user setting). Anyone else's mark is ignored and the call
/// is routed as usual, so no client can make a replica drive a run another one owns.
fn from_a_replica<T>(req: &Request<T>) -> bool {
    use cairn_server::caller::{Caller, Principal};
    match Caller::of(req).principal {
        Principal::Local => true,
        Principal::Service(id) => id == crate::IDENTITY,
        Principal::Anonymous => false,
    }
}

/// The replica that drives a run, as a client.
struct Peer {
    member: String,
    client: OrchestratorClient<TracedChannel>,
    me: String,
}

impl Peer {
    /// `req` as sent on: the message and the caller's credentials, marked as forwarded.
    fn request<T>(&self, req: Request<T>) -> Request<T> {
        let auth = req.metadata().get(crate::auth::AUTHORIZATION).cloned();
        let mut out = Request::new(req.into_inner());
        if let Some(a) = auth {
            out.metadata_mut().insert(crate::auth::AUTHORIZATION, a);
        }
        if let Ok(v) = self.me.parse() {
            out.metadata_mut().insert(FORWARDED_BY, v);
        }
        out
    }

    /// A transport failure reaching the replica, said in the user's words.
    fn unreachable(&self, s: Status) -> Status {
        if s.code() != tonic::Code::Unavailable
            || s.metadata().contains_key(cairn_proto::reason::METADATA_KEY)
        {
            return s;
        }
        cairn_proto::reason::status(
            tonic::Code::Unavailable,
            format!(
                "replica `{}`, which drives this run, does not answer ({}): retry; if it is gone, another replica takes the run over within the cluster's lease_ttl_s",
                self.member,
                s.message()
            ),
            "replica_unreachable",
        )
    }
}

/// Sends a unary call about one run on to the replica that drives it, and returns its answer.
macro_rules! forward {
    ($self:ident, $req:ident, $run_id:expr, $method:ident) => {
        let (project, run_id) = ($req.get_ref().project_id.clone(), $run_id);
        if let Some(mut peer) = $self.peer(&$req, &project, &run_id)? {
            let fwd = peer.request($req);
            return peer
                .client
                .$method(fwd)
                .await
                .map_err(|s| peer.unreachable(s));
        }
    };
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send + 'static>>;
type LogStream = Pin<Box<dyn Stream<Item = Result<pb::LogChunk, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Orchestrator for OrchestratorService {
    async fn submit_run(
        &self,
        req: Request<pb::SubmitRunRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let mut req = req;
        let who = self.caller(&req, Rpc::SubmitRun, &req.get_ref().project_id)?;
        if self.runs.cluster().is_some() {
            // The run id decides the replica: fix it here, as the owner would.
            let r = req.get_mut();
            if r.run_id.is_empty() && r.request_id.is_empty() {
                r.run_id = uuid::Uuid::now_v7().to_string();
            }
            let id = if r.run_id.is_empty() {
                crate::runs::request_run_id(&r.project_id, &r.request_id)?
            } else {
                r.run_id.clone()
            };
            forward!(self, req, id, submit_run);
        }
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
            files: r.files,
            graph_dir: r.graph_dir,
            request_id: r.request_id,
            rerun_of: r.rerun_of,
            ..Submit::default()
        };
        Ok(Response::new(self.runs.submit(submit).await?))
    }

    async fn get_run(
        &self,
        req: Request<pb::GetRunRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        self.caller(&req, Rpc::GetRun, &req.get_ref().project_id)?;
        let run_id = req.get_ref().run_id.clone();
        // Out of the cluster, the records still answer.
        if let Ok(Some(mut peer)) = self.peer(&req, &req.get_ref().project_id, &run_id) {
            let mut copy = Request::new(req.get_ref().clone());
            *copy.metadata_mut() = req.metadata().clone();
            let fwd = peer.request(copy);
            match peer.client.get_run(fwd).await {
                // The records answer while the replica driving the run does not.
                Err(s) if s.code() == tonic::Code::Unavailable => {}
                other => return other,
            }
        }
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
            stalled: r.stalled,
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
        let run_id = req.get_ref().run_id.clone();
        if let Some(mut peer) = self.peer(&req, &req.get_ref().project_id, &run_id)? {
            // Live output is in the memory of the replica that drives the run.
            let fwd = peer.request(req);
            let stream = peer
                .client
                .watch_logs(fwd)
                .await
                .map_err(|s| peer.unreachable(s))?
                .into_inner();
            return Ok(Response::new(Box::pin(stream)));
        }
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
        forward!(self, req, req.get_ref().run_id.clone(), cancel_run);
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
        forward!(self, req, req.get_ref().run_id.clone(), resume_run);
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
        forward!(self, req, req.get_ref().run_id.clone(), approve_gate);
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
        forward!(self, req, req.get_ref().run_id.clone(), reject_gate);
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
        forward!(self, req, req.get_ref().run_id.clone(), add_note);
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
        forward!(self, req, req.get_ref().run_id.clone(), request_rework);
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
                    r.from_snapshot,
                )
                .await?,
        ))
    }

    async fn edit_context(
        &self,
        req: Request<pb::EditContextRequest>,
    ) -> Result<Response<pb::EditContextResponse>, Status> {
        let who = self.caller(&req, Rpc::EditContext, &req.get_ref().project_id)?;
        forward!(self, req, req.get_ref().run_id.clone(), edit_context);
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        let seq = self
            .runs
            .edit_context(&r.project_id, &r.run_id, &who.by(&r.by), &r.manifest_yaml)
            .await?;
        Ok(Response::new(pb::EditContextResponse { seq }))
    }

    async fn edit_task(
        &self,
        req: Request<pb::EditTaskRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let who = self.caller(&req, Rpc::EditTask, &req.get_ref().project_id)?;
        forward!(self, req, req.get_ref().run_id.clone(), edit_task);
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        let edit = crate::task_edits::Edit {
            title: r.title,
            goal: r.goal,
            milestone_notes: r.milestone_notes.into_iter().collect(),
        };
        Ok(Response::new(
            self.runs
                .edit_task(&r.project_id, &r.run_id, &who.by(&r.by), &edit)
                .await?,
        ))
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

    async fn replay_run(
        &self,
        req: Request<pb::ReplayRunRequest>,
    ) -> Result<Response<pb::RunInfo>, Status> {
        let mut req = req;
        // A replay is a new run of the recorded run's project: SubmitRun's role there, which
        // includes reading the recorded run.
        let who = self.caller(&req, Rpc::ReplayRun, &req.get_ref().project_id)?;
        if self.runs.cluster().is_some() {
            let r = req.get_mut();
            if r.replay_run_id.is_empty() {
                r.replay_run_id = uuid::Uuid::now_v7().to_string();
            }
            forward!(self, req, req.get_ref().replay_run_id.clone(), replay_run);
        }
        let r = req.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        let info = self
            .runs
            .replay(crate::runs::Submit {
                project_id: r.project_id,
                replay_of: r.run_id,
                vars: r.vars.into_iter().collect(),
                by: who.by(&r.by),
                run_id: r.replay_run_id,
                live_sandbox: r.live_sandbox,
                live_gates: r.live_gates,
                graph_yaml: r.graph_yaml,
                files: r.files,
                live_after: r.live_after,
                llm: r.llm,
                ..crate::runs::Submit::default()
            })
            .await?;
        Ok(Response::new(info))
    }

    async fn diff_runs(
        &self,
        req: Request<pb::DiffRunsRequest>,
    ) -> Result<Response<pb::DiffRunsResponse>, Status> {
        self.caller(&req, Rpc::DiffRuns, &req.get_ref().project_id)?;
        let r = req.into_inner();
        let (report, verdict) = self.runs.diff(&r.project_id, &r.run_a, &r.run_b).await?;
        Ok(Response::new(pb::DiffRunsResponse {
            report_json: report.to_string(),
            verdict: verdict["verdict"].as_str().unwrap_or_default().to_owned(),
            verdict_json: verdict.to_string(),
        }))
    }
}

/// Longest ListRuns search text, in characters.
const MAX_SEARCH_CHARS: usize = 200;

fn search_text(text: &str) -> Result<String, Status> {
    let text = text.trim();
    if text.chars().count() > MAX_SEARCH_CHARS {
        return Err(Error::field(
            "text",
            format!(
                "text is {} characters; search with at most {MAX_SEARCH_CHARS}",
                text.chars().count()
            ),
        )
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
            Error::field(
                field,
                format!(
                    "{field} `{text}` is not an RFC 3339 time (e.g. 2026-11-25T00:00:00Z): {e}"
                ),
            )
            .into()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_server::caller::{Caller, Principal};

    fn marked(principal: Option<Principal>) -> Request<()> {
        let mut req = Request::new(());
        req.metadata_mut()
            .insert(FORWARDED_BY, "o1".parse().unwrap());
        if let Some(principal) = principal {
            req.extensions_mut().insert(Caller {
                principal,
                peer: None,
            });
        }
        req
    }

    #[test]
    fn only_a_replica_may_mark_a_call_as_forwarded() {
        assert!(from_a_replica(&marked(Some(Principal::Service(
            crate::IDENTITY.into()
        )))));
        assert!(from_a_replica(&marked(Some(Principal::Local))));
        assert!(from_a_replica(&marked(None)), "in-process: local");
        for other in ["cli", "console", "ingest"] {
            assert!(
                !from_a_replica(&marked(Some(Principal::Service(other.into())))),
                "{other} must not pass as a replica"
            );
        }
    }
}
