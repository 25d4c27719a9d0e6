//! The gRPC face of the store: decodes requests, calls the [`Store`], encodes replies.
//! No filesystem logic lives here.
//!
//! May depend on: store, and the request and reply types of the modules beneath it.

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use cairn_proto::reason::known;
use cairn_proto::v1::artifact_store_server::ArtifactStore;
use cairn_proto::v1::{
    self as pb, get_response, put_request, AppendEventsRequest, AppendEventsResponse,
    ArchiveRunRequest, ArchiveRunResponse, BackupRequest, ClaimRunRequest, ClaimRunResponse,
    CreateProjectRequest, DeleteRequest, DeleteResponse, FileInfo, GetRequest, GetResponse,
    GrantIngestClaimRequest, GrantIngestClaimResponse, ListProjectsRequest, ListProjectsResponse,
    ListRequest, ListResponse, ListRunSummariesRequest, ListRunSummariesResponse, PutDurability,
    PutRequest, PutResponse, ReadEventsRequest, RestoreRequest, RestoreResponse, StatRequest,
    UnarchiveRunRequest, UnarchiveRunResponse, UpdateJsonRequest, UpdateJsonResponse,
};
use futures::{Stream, StreamExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::document::{Merge, Update};
use crate::error::Error;
use crate::events::{Level, NewEvent, StoredEvent};
use crate::files::Outcome;
use crate::page::Page;
use crate::read::{Entry, Kind};
use crate::run_index::{Filter, Summary};
use crate::store::Store;
use crate::write::{Durability, PutSpec};
use crate::{access, run_records, Result};
use cairn_server::Caller;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The tonic service over a [`Store`].
#[derive(Debug, Clone)]
pub struct ArtifactStoreService {
    store: Arc<Store>,
}

impl ArtifactStoreService {
    pub fn new(store: Arc<Store>) -> Self {
        ArtifactStoreService { store }
    }
}

fn file_info(entry: Entry) -> FileInfo {
    FileInfo {
        path: entry.path,
        kind: match entry.kind {
            Kind::File => pb::EntryKind::File,
            Kind::Directory => pb::EntryKind::Directory,
            Kind::Other => pb::EntryKind::Other,
        } as i32,
        size_bytes: entry.size_bytes,
        sha256: entry.sha256,
        modified_at: entry.modified_at,
    }
}

fn event(e: StoredEvent) -> pb::Event {
    pb::Event {
        seq: e.seq,
        ts: e.ts,
        r#type: e.kind,
        run_id: e.run_id,
        node_id: e.node_id,
        level: match e.level {
            Level::Debug => pb::Level::Debug,
            Level::Info => pb::Level::Info,
            Level::Warning => pb::Level::Warning,
            Level::Error => pb::Level::Error,
        } as i32,
        data_json: e.data_json,
        line_json: e.line,
    }
}

/// An event's level; unset (UNSPECIFIED) is INFO, a number the proto does not declare is
/// refused.
fn level(value: i32) -> Result<Level, Status> {
    Ok(match known::<pb::Level>("events.level", value)? {
        pb::Level::Debug => Level::Debug,
        pb::Level::Warning => Level::Warning,
        pb::Level::Error => Level::Error,
        pb::Level::Unspecified | pb::Level::Info => Level::Info,
    })
}

fn summary(s: Summary) -> pb::RunSummary {
    let indexed = s.fields.is_some();
    let f = s.fields.unwrap_or_default();
    pb::RunSummary {
        run_id: s.run_id,
        title: f.title,
        goal: f.goal,
        state: f.state,
        created_at: f.created_at,
        updated_at: f.updated_at,
        indexed,
        state_json: s.state_json.map(Bytes::from).unwrap_or_default(),
    }
}

/// A time bound of ListRunSummaries (empty = none).
fn time_bound(name: &str, value: &str) -> Result<Option<time::OffsetDateTime>> {
    if value.is_empty() {
        return Ok(None);
    }
    time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339)
        .map(Some)
        .map_err(|e| {
            Error::BadRequest(format!(
                "{name} {value:?} is not an RFC 3339 time ({e}); use e.g. 2026-11-25T00:00:00Z"
            ))
        })
}

fn page(p: Option<pb::PageRequest>) -> Result<Page> {
    let p = p.unwrap_or_default();
    Page::parse(p.page_size, &p.page_token)
}

#[tonic::async_trait]
impl ArtifactStore for ArtifactStoreService {
    async fn create_project(
        &self,
        request: Request<CreateProjectRequest>,
    ) -> Result<Response<pb::Project>, Status> {
        let p = self
            .store
            .create_project(&request.into_inner().project_id)
            .await?;
        Ok(Response::new(pb::Project {
            project_id: p.project_id,
            created_at: p.created_at,
        }))
    }

    async fn list_projects(
        &self,
        request: Request<ListProjectsRequest>,
    ) -> Result<Response<ListProjectsResponse>, Status> {
        let (projects, next_page_token) = self
            .store
            .list_projects(page(request.into_inner().page)?)
            .await?;
        let projects = projects
            .into_iter()
            .map(|p| pb::Project {
                project_id: p.project_id,
                created_at: p.created_at,
            })
            .collect();
        Ok(Response::new(ListProjectsResponse {
            projects,
            next_page_token,
        }))
    }

    async fn put(
        &self,
        request: Request<Streaming<PutRequest>>,
    ) -> Result<Response<PutResponse>, Status> {
        let caller = Caller::of(&request);
        let mut stream = request.into_inner();
        let header = match stream.message().await? {
            Some(PutRequest {
                msg: Some(put_request::Msg::Header(h)),
            }) => h,
            _ => {
                return Err(Error::BadRequest(
                    "the first message of a Put must be a PutHeader".into(),
                )
                .into())
            }
        };
        cairn_telemetry::record_ids(&header.project_id, &header.run_id, "");
        let durability = match known::<PutDurability>("durability", header.durability)? {
            PutDurability::WithRunEvents => Durability::WithRunEvents,
            PutDurability::Unspecified | PutDurability::Sync => Durability::Sync,
        };
        // A claim decides the run and epoch a write is fenced by; ingest gets no fence
        // from a number it sends.
        let claim = self.store.verify_claim(&header.claim, &header.project_id)?;
        let fence = match &claim {
            Some(c) if !header.run_id.is_empty() && c.run != header.run_id => {
                return Err(
                    crate::store::other_run(c, &header.project_id, Some(&header.run_id)).into(),
                )
            }
            Some(c) => Some((c.run.clone(), c.epoch)),
            None if caller.is("ingest") => None,
            None => header
                .fence
                .filter(|f| f.epoch > 0)
                .map(|f| (f.run_id, f.epoch)),
        };
        let spec = PutSpec {
            project_id: header.project_id,
            path: header.path,
            overwrite: header.overwrite,
            if_sha256: header.if_sha256,
            expected_sha256: header.expected_sha256,
            expected_size: header.expected_size,
            allowed_prefixes: header.allowed_prefixes,
            run_id: header.run_id,
            create_project: header.create_project,
            durability,
            fence,
            by_hand: false,
            digest_at_end: header.digest_at_end.then(Default::default),
        };
        let spec = PutSpec {
            by_hand: !writes_for_its_run(&caller, &spec.path, spec.fence.as_ref()),
            ..spec
        };
        access::check_claim(
            &caller,
            "cairn.v1.ArtifactStore/Put",
            &spec.path,
            claim.as_ref(),
        )?;
        access::check_write(
            &caller,
            "cairn.v1.ArtifactStore/Put",
            &spec.path,
            spec.fence.as_ref(),
        )?;
        access::check_record_claim(
            &caller,
            "cairn.v1.ArtifactStore/Put",
            &spec.path,
            spec.fence.as_ref(),
        )?;
        // The PutEnd (when the header announced one) is taken out of the chunks into
        // `digest_at_end`; nothing may follow it.
        let at_end = spec.digest_at_end.clone();
        let chunks = stream.filter_map(move |m| {
            let ended = at_end.as_ref().is_some_and(|e| e.get().is_some());
            let item = match m {
                Ok(PutRequest { msg: Some(_) }) if ended => Some(Err(Error::BadRequest(
                    "a Put's PutEnd is its last message: nothing may follow it".into(),
                ))),
                Ok(PutRequest {
                    msg: Some(put_request::Msg::Chunk(bytes)),
                }) => Some(Ok(bytes)),
                Ok(PutRequest {
                    msg: Some(put_request::Msg::End(end)),
                }) => match &at_end {
                    Some(slot) => {
                        let _ = slot.set((end.sha256, end.size_bytes));
                        None
                    }
                    None => Some(Err(Error::BadRequest(
                        "a PutEnd came in a Put whose header did not set digest_at_end: set it, or send no PutEnd".into(),
                    ))),
                },
                Ok(_) => Some(Err(Error::BadRequest(
                    "a Put sends one PutHeader first, then only chunks (and a PutEnd, with digest_at_end)".into(),
                ))),
                Err(status) => Some(Err(Error::Stream(status.message().to_owned()))),
            };
            std::future::ready(item)
        });
        let notes_of = spec
            .by_hand
            .then(|| run_records::human_notes_run(&spec.path))
            .flatten()
            .map(str::to_owned);
        let project = spec.project_id.clone();
        let written = self.store.put(spec, chunks).await?;
        if let (Some(run), Outcome::Overwritten) = (notes_of, &written.outcome) {
            // A person's edit of a run's human notes is part of the run's history.
            let by = if caller.is_local() {
                "human"
            } else {
                caller.name()
            };
            let event = NewEvent::from_client(
                "notes.edited",
                "",
                Level::Info,
                &serde_json::json!({
                    "by": by,
                    "path": "shared/human-notes.md",
                    "sha256": written.digest.sha256,
                    "bytes": written.digest.size_bytes,
                })
                .to_string(),
            )?;
            let event = if caller.is_local() {
                event
            } else {
                event.by(caller.name())
            };
            self.store
                .append_events(&project, &run, vec![event], 0, &[])
                .await?;
        }
        match written.outcome {
            Outcome::Created => {
                cairn_telemetry::metrics::store_written(written.digest.size_bytes, "created")
            }
            Outcome::Overwritten => {
                cairn_telemetry::metrics::store_written(written.digest.size_bytes, "overwritten")
            }
            Outcome::Unchanged => {}
        }
        Ok(Response::new(PutResponse {
            path: written.path,
            digest: Some(pb::Digest {
                sha256: written.digest.sha256,
                size_bytes: written.digest.size_bytes,
            }),
            outcome: match written.outcome {
                Outcome::Created => pb::WriteOutcome::Created,
                Outcome::Unchanged => pb::WriteOutcome::Unchanged,
                Outcome::Overwritten => pb::WriteOutcome::Overwritten,
            } as i32,
            publication_token: written.publication.unwrap_or_default(),
        }))
    }

    type GetStream = BoxStream<GetResponse>;

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<Self::GetStream>, Status> {
        let r = request.into_inner();
        let (entry, chunks) = self
            .store
            .get(&r.project_id, &r.path, r.offset, r.length)
            .await?;
        let first = GetResponse {
            msg: Some(get_response::Msg::Info(file_info(entry))),
        };
        let rest = ReceiverStream::new(chunks).map(|chunk| match chunk {
            Ok(bytes) => Ok(GetResponse {
                msg: Some(get_response::Msg::Chunk(bytes)),
            }),
            Err(e) => Err(Status::from(e)),
        });
        Ok(Response::new(Box::pin(
            futures::stream::once(async { Ok(first) }).chain(rest),
        )))
    }

    async fn stat(&self, request: Request<StatRequest>) -> Result<Response<FileInfo>, Status> {
        let r = request.into_inner();
        let entry = self
            .store
            .stat(&r.project_id, &r.path, r.include_sha256)
            .await?;
        Ok(Response::new(file_info(entry)))
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let r = request.into_inner();
        let (entries, next_page_token) = self
            .store
            .list(&r.project_id, &r.prefix, r.recursive, page(r.page)?)
            .await?;
        Ok(Response::new(ListResponse {
            entries: entries.into_iter().map(file_info).collect(),
            next_page_token,
        }))
    }

    async fn list_run_summaries(
        &self,
        request: Request<ListRunSummariesRequest>,
    ) -> Result<Response<ListRunSummariesResponse>, Status> {
        let r = request.into_inner();
        if r.text.chars().count() > 1000 {
            return Err(Error::BadRequest(
                "text is longer than 1000 characters; search for a shorter part".into(),
            )
            .into());
        }
        let filter = Filter {
            states: r.states,
            text: r.text.to_lowercase(),
            created_after: time_bound("created_after", &r.created_after)?,
            created_before: time_bound("created_before", &r.created_before)?,
            exclude: r.exclude_run_ids.into_iter().collect(),
            unfinished: r.unfinished,
        };
        if r.count_only {
            let total = self
                .store
                .count_run_summaries(&r.project_id, filter)
                .await?;
            return Ok(Response::new(ListRunSummariesResponse {
                total,
                ..Default::default()
            }));
        }
        let mut page = page(r.page)?;
        if let Some(after) = r.after {
            if page.after.is_some() {
                return Err(
                    Error::BadRequest("send a page token or `after`, not both".into()).into(),
                );
            }
            page.after = Some(format!("{}\n{}", after.created_at, after.run_id));
        }
        let (runs, next_page_token) = self
            .store
            .list_run_summaries(&r.project_id, filter, page, r.include_state_json)
            .await?;
        Ok(Response::new(ListRunSummariesResponse {
            runs: runs.into_iter().map(summary).collect(),
            next_page_token,
            total: 0,
        }))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let caller = Caller::of(&request);
        let r = request.into_inner();
        access::check_write(&caller, "cairn.v1.ArtifactStore/Delete", &r.path, None)?;
        access::check_record_claim(&caller, "cairn.v1.ArtifactStore/Delete", &r.path, None)?;
        if run_records::is_task_yaml(&r.path) && !caller.is("orchestrator") {
            return Err(Error::NotEditable {
                path: r.path,
                problem: "it may not be deleted".into(),
            }
            .into());
        }
        if run_records::is_context_manifest(&r.path) && !caller.is("orchestrator") {
            return Err(run_records::context_manifest_refused(&r.path).into());
        }
        let deleted = self.store.delete(&r.project_id, &r.path, &r.run_id).await?;
        Ok(Response::new(DeleteResponse { deleted }))
    }

    async fn append_events(
        &self,
        request: Request<AppendEventsRequest>,
    ) -> Result<Response<AppendEventsResponse>, Status> {
        let caller = Caller::of(&request);
        let r = request.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        // A claim decides the epoch a batch is fenced by; ingest's own number counts for nothing.
        let claim = self.store.verify_claim(&r.claim, &r.project_id)?;
        let epoch = match &claim {
            Some(c) if c.run != r.run_id => {
                return Err(crate::store::other_run(c, &r.project_id, Some(&r.run_id)).into())
            }
            Some(c) => c.epoch,
            None if caller.is("ingest") => 0,
            None => r.epoch,
        };
        access::check_append(&caller, &r.run_id, epoch)?;
        access::check_event_types(
            &caller,
            &r.run_id,
            r.events.iter().map(|e| e.r#type.as_str()),
        )?;
        let identity = (!caller.is_local()).then(|| caller.name().to_owned());
        let levels = r
            .events
            .iter()
            .map(|e| level(e.level))
            .collect::<Result<Vec<_>, Status>>()?;
        let events = r
            .events
            .iter()
            .zip(levels)
            .map(|(e, level)| {
                let event = NewEvent::from_client(&e.r#type, &e.node_id, level, &e.data_json)?;
                Ok(match &identity {
                    Some(id) => event.by(id),
                    None => event,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (first_seq, last_seq) = self
            .store
            .append_events(
                &r.project_id,
                &r.run_id,
                events,
                epoch,
                &r.publication_tokens,
            )
            .await?;
        Ok(Response::new(AppendEventsResponse {
            first_seq,
            last_seq,
        }))
    }

    async fn claim_run(
        &self,
        request: Request<ClaimRunRequest>,
    ) -> Result<Response<ClaimRunResponse>, Status> {
        let caller = Caller::of(&request);
        let r = request.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        // The log names the authenticated identity; the holder text is the caller's own word.
        let holder = if caller.is_local() {
            r.holder
        } else {
            format!("{} (identity {})", r.holder, caller.name())
        };
        let (epoch, last_seq) = self
            .store
            .claim_run(&r.project_id, &r.run_id, &holder)
            .await?;
        Ok(Response::new(ClaimRunResponse { epoch, last_seq }))
    }

    async fn grant_ingest_claim(
        &self,
        request: Request<GrantIngestClaimRequest>,
    ) -> Result<Response<GrantIngestClaimResponse>, Status> {
        let caller = Caller::of(&request);
        let r = request.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        access::check_grant(&caller, &r.run_id)?;
        let (claim, expires_ms, allowed_prefixes) = self
            .store
            .grant_ingest_claim(
                &r.project_id,
                &r.run_id,
                r.epoch,
                r.ttl_s,
                &r.allowed_prefixes,
            )
            .await?;
        let expires_at =
            time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(expires_ms) * 1_000_000)
                .ok()
                .and_then(|t| {
                    t.format(&time::format_description::well_known::Rfc3339)
                        .ok()
                })
                .unwrap_or_default();
        Ok(Response::new(GrantIngestClaimResponse {
            claim,
            expires_at,
            allowed_prefixes,
        }))
    }

    type ReadEventsStream = BoxStream<pb::Event>;

    async fn read_events(
        &self,
        request: Request<ReadEventsRequest>,
    ) -> Result<Response<Self::ReadEventsStream>, Status> {
        let shutdown = cairn_server::drain::Shutdown::of(&request);
        let r = request.into_inner();
        let events = self
            .store
            .read_events(&r.project_id, &r.run_id, r.from_seq, r.follow, r.limit)
            .await?;
        let stream = ReceiverStream::new(events).map(|e| e.map(event).map_err(Status::from));
        if r.follow {
            // A follow never ends by itself: it ends UNAVAILABLE when shutdown begins.
            return Ok(Response::new(Box::pin(shutdown.ending(stream))));
        }
        Ok(Response::new(Box::pin(stream)))
    }

    async fn update_json(
        &self,
        request: Request<UpdateJsonRequest>,
    ) -> Result<Response<UpdateJsonResponse>, Status> {
        let caller = Caller::of(&request);
        let r = request.into_inner();
        access::check_write(&caller, "cairn.v1.ArtifactStore/UpdateJson", &r.path, None)?;
        access::check_record_claim(&caller, "cairn.v1.ArtifactStore/UpdateJson", &r.path, None)?;
        let merge = match known::<pb::MergePolicy>("merge", r.merge)? {
            pb::MergePolicy::None => Merge::None,
            pb::MergePolicy::Max => Merge::Max,
        };
        let update = Update {
            project_id: r.project_id,
            path: r.path,
            expected_version: r.expected_version,
            patch_json: r.patch_json,
            merge,
            run_id: r.run_id,
        };
        let updated = self.store.update_document(update).await?;
        Ok(Response::new(UpdateJsonResponse {
            version: updated.version,
            document_json: updated.document,
            merged_conflict: updated.merged_conflict,
        }))
    }

    type BackupStream = BoxStream<pb::BackupChunk>;

    async fn backup(
        &self,
        request: Request<BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        let r = request.into_inner();
        let chunks = self.store.backup(&r.project_id).await?;
        let stream = ReceiverStream::new(chunks).map(|c| {
            c.map(|chunk| pb::BackupChunk { chunk })
                .map_err(Status::from)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn restore(
        &self,
        request: Request<Streaming<RestoreRequest>>,
    ) -> Result<Response<RestoreResponse>, Status> {
        let mut stream = request.into_inner();
        let first = stream.message().await?.unwrap_or_default();
        let only = first.project_id;
        let rest = stream.map(|m| match m {
            Ok(m) => Ok(m.chunk),
            Err(status) => Err(Error::Stream(status.message().to_owned())),
        });
        let chunks = futures::stream::once(async { Ok(first.chunk) }).chain(rest);
        let restored = self.store.restore(&only, Box::pin(chunks)).await?;
        Ok(Response::new(RestoreResponse {
            project_ids: restored.projects,
            files: restored.files,
            bytes: restored.bytes,
        }))
    }

    async fn archive_run(
        &self,
        request: Request<ArchiveRunRequest>,
    ) -> Result<Response<ArchiveRunResponse>, Status> {
        let r = request.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        let archived = self.store.archive_run(&r.project_id, &r.run_id).await?;
        Ok(Response::new(ArchiveRunResponse {
            path: archived.path,
            size_bytes: archived.size_bytes,
            files: archived.files,
        }))
    }

    async fn unarchive_run(
        &self,
        request: Request<UnarchiveRunRequest>,
    ) -> Result<Response<UnarchiveRunResponse>, Status> {
        let r = request.into_inner();
        cairn_telemetry::record_ids(&r.project_id, &r.run_id, "");
        let unarchived = self.store.unarchive_run(&r.project_id, &r.run_id).await?;
        Ok(Response::new(UnarchiveRunResponse {
            files: unarchived.files,
            size_bytes: unarchived.size_bytes,
        }))
    }
}

/// Whether a write comes from the writer of the run whose records it touches: the orchestrator
/// identity, or a claim (fence) on that very run.
fn writes_for_its_run(caller: &Caller, path: &str, fence: Option<&(String, u64)>) -> bool {
    let run = path
        .strip_prefix(".cairn/runs/")
        .and_then(|rest| rest.split('/').next());
    caller.is("orchestrator") || matches!((run, fence), (Some(r), Some((f, _))) if r == f)
}
