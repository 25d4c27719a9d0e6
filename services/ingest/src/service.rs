//! The `cairn.v1.Ingest` gRPC service: decode, call the domain ([`Ingestor`]), encode.

use cairn_proto::v1::ingest_server::Ingest;
use cairn_proto::v1::{
    GetEnabledRequest, IngestRequest, IngestResponse, ManifestArtifact, ManifestSummary,
    SetEnabledRequest, SetEnabledResponse,
};
use tonic::{Request, Response, Status};

use crate::block::BlockStatus;
use crate::ingest::{self, check_id, Ingestor, Outcome};

/// The tonic implementation of `Ingest`.
#[derive(Clone)]
pub struct IngestService {
    ingestor: Ingestor,
}

impl IngestService {
    pub fn new(ingestor: Ingestor) -> Self {
        IngestService { ingestor }
    }
}

#[tonic::async_trait]
impl Ingest for IngestService {
    async fn parse(
        &self,
        request: Request<IngestRequest>,
    ) -> Result<Response<IngestResponse>, Status> {
        let req = ingest::Request::from_proto(request.into_inner())?;
        cairn_telemetry::record_ids(&req.project_id, &req.run_id, &req.node_id);
        Ok(Response::new(response(self.ingestor.dry_run(&req).await)))
    }

    async fn ingest(
        &self,
        request: Request<IngestRequest>,
    ) -> Result<Response<IngestResponse>, Status> {
        let req = ingest::Request::from_proto(request.into_inner())?;
        cairn_telemetry::record_ids(&req.project_id, &req.run_id, &req.node_id);
        Ok(Response::new(response(self.ingestor.ingest(&req).await?)))
    }

    async fn set_enabled(
        &self,
        request: Request<SetEnabledRequest>,
    ) -> Result<Response<SetEnabledResponse>, Status> {
        let r = request.into_inner();
        let project = check_id("project", "project_id", r.project_id)?;
        let run = optional_run(r.run_id)?;
        let enabled = self
            .ingestor
            .set_enabled(&project, run.as_deref(), r.enabled)
            .await?;
        Ok(Response::new(SetEnabledResponse { enabled }))
    }

    async fn get_enabled(
        &self,
        request: Request<GetEnabledRequest>,
    ) -> Result<Response<SetEnabledResponse>, Status> {
        let r = request.into_inner();
        let project = check_id("project", "project_id", r.project_id)?;
        let run = optional_run(r.run_id)?;
        let enabled = self.ingestor.enabled(&project, run.as_deref()).await?;
        Ok(Response::new(SetEnabledResponse { enabled }))
    }
}

fn optional_run(run_id: String) -> Result<Option<String>, Status> {
    if run_id.is_empty() {
        Ok(None)
    } else {
        Ok(Some(check_id("run", "run_id", run_id)?))
    }
}

/// The reply of an ingest or dry run.
pub fn response(outcome: Outcome) -> IngestResponse {
    let Some(manifest) = outcome.manifest else {
        return IngestResponse {
            enabled: outcome.enabled,
            level: outcome.severity.to_proto() as i32,
            errors: outcome.notes,
            ..IngestResponse::default()
        };
    };
    let artifacts = manifest
        .artifacts
        .iter()
        .map(|a| ManifestArtifact {
            index: a.index,
            lang: a.lang.clone(),
            declared_file: a.declared_file.clone(),
            workspace_path: a.workspace_path.clone(),
            bytes: a.bytes,
            sha256: a.sha256.clone(),
            status: match a.status {
                BlockStatus::Written => cairn_proto::v1::BlockStatus::Written,
                BlockStatus::Skipped => cairn_proto::v1::BlockStatus::Skipped,
                BlockStatus::Rejected => cairn_proto::v1::BlockStatus::Rejected,
            } as i32,
            reason: a.reason.clone(),
        })
        .collect();
    let s = manifest.summary;
    IngestResponse {
        manifest_json: manifest.to_json(),
        artifacts,
        summary: Some(ManifestSummary {
            total_blocks: s.total_blocks,
            written: s.written,
            skipped: s.skipped,
            rejected: s.rejected,
        }),
        manifest_path: outcome.manifest_path,
        level: outcome.severity.to_proto() as i32,
        errors: outcome.notes,
        enabled: outcome.enabled,
    }
}
