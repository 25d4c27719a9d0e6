//! The artifact-store as the orchestrator and its node kinds use it: the only way they read or
//! write a project file, a run record or an event (the store is the single canonical writer).
//! Thin typed calls over the generated gRPC client, with the trace context injected, riding
//! out outages. Depends on the protos and the shared server/telemetry crates only.

use std::collections::HashMap;

use bytes::Bytes;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::{
    get_response, put_request, AppendEventsRequest, AppendEventsResponse, ClaimRunRequest,
    CreateProjectRequest, Event, EventInput, FileInfo, GetRequest, GrantIngestClaimRequest,
    ListProjectsRequest, ListRequest, PageRequest, PutDurability, PutHeader, PutRequest,
    PutResponse, ReadEventsRequest, RunFence, StatRequest, UpdateJsonRequest, UpdateJsonResponse,
};
use cairn_server::retry::{Dependency, Safety};
use cairn_telemetry::TracedChannel;
use futures::StreamExt;
use tonic::{Code, Status};

pub mod streamed;

/// Largest file this service reads into memory (documents, inputs, manifests).
pub const MAX_READ_BYTES: u64 = 64 << 20;
const CHUNK: usize = 1 << 20;
/// The dependency's name in logs and readiness.
pub const STORE: &str = "artifact-store";

/// How a write treats an existing file.
#[derive(Clone, Debug, Default)]
pub struct PutOptions {
    pub overwrite: bool,
    /// Narrows the store's allowed prefixes for this write.
    pub allowed_prefixes: Vec<String>,
    /// Run on whose behalf (an overwrite leaves a `store.overwritten` event in it).
    pub run_id: String,
    /// Reply once the bytes are durable and published; the directory entry becomes durable
    /// with `run_id`'s next events (PUT_DURABILITY_WITH_RUN_EVENTS). Only for writes that
    /// the run's events record afterwards.
    pub with_run_events: bool,
    /// Compare-and-swap: replace only the file holding these bytes (hex sha256); other bytes
    /// are FAILED_PRECONDITION `changed`. Empty = no condition.
    pub if_sha256: String,
    /// The bytes' hex sha256 as the writer computed it: the store refuses bytes that arrive
    /// with another. Empty = not checked.
    pub expected_sha256: String,
}

#[derive(Clone)]
pub struct Store {
    client: ArtifactStoreClient<TracedChannel>,
    /// This process's claims (ClaimRun) on the runs it drives: (project, run) -> epoch. Puts
    /// for such a run (by `run_id`, or a path in its run directory) carry the fence.
    claims: std::sync::Arc<std::sync::Mutex<HashMap<(String, String), u64>>>,
    /// The store as a dependency: calls that find it away are resent while its outage
    /// budget lasts (only those safe to resend, see each call).
    dependency: Dependency,
    /// Deferred Puts (`with_run_events`) no acknowledged AppendEvents of their run has made
    /// durable yet, by (project, run): their tokens go with the run's next AppendEvents.
    unproven: std::sync::Arc<std::sync::Mutex<UnprovenPuts>>,
}

/// Unproven deferred Puts by (project, run).
type UnprovenPuts = HashMap<(String, String), Vec<Unproven>>;

/// A deferred Put the store acknowledged but no event batch has proven durable yet; kept
/// whole so it can be written again if the store restarted before publishing it.
#[derive(Clone, Debug)]
struct Unproven {
    token: String,
    path: String,
    bytes: Bytes,
    opts: PutOptions,
}

/// The reason word of a refused AppendEvents whose publication tokens the store cannot prove
/// durable (it restarted since the Puts replied).
pub const PUBLICATION_UNPROVEN: &str = "publication_unproven";

/// Whether `s` refused an AppendEvents for unproven publications: the files were written
/// again by [`Store::append_events_fenced`], so the same events may be sent again.
pub fn is_publication_unproven(s: &Status) -> bool {
    s.code() == Code::FailedPrecondition
        && cairn_proto::reason::of(s).as_deref() == Some(PUBLICATION_UNPROVEN)
}

impl Store {
    pub fn connect(addr: &str) -> Result<Store, cairn_server::Error> {
        Self::connect_tls(addr, None)
    }

    /// [`Store::connect`] over mutual TLS when `tls` is given.
    pub fn connect_tls(
        addr: &str,
        tls: Option<&cairn_server::Tls>,
    ) -> Result<Store, cairn_server::Error> {
        let channel = cairn_server::connect_tls(addr, tls)?;
        let client = ArtifactStoreClient::new(cairn_telemetry::traced(channel))
            .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES);
        Ok(Store {
            client,
            claims: Default::default(),
            dependency: Dependency::new(STORE, std::time::Duration::ZERO),
            unproven: Default::default(),
        })
    }

    /// Calls that find the store away are resent while `dependency`'s budget lasts.
    pub fn riding_out(mut self, dependency: Dependency) -> Store {
        self.dependency = dependency;
        self
    }

    /// The store as a dependency (readiness follows it).
    pub fn dependency(&self) -> &Dependency {
        &self.dependency
    }

    /// `call` on a client, resent while the store is away if `safety` allows.
    async fn call<T, F, Fut>(&self, what: &str, safety: Safety, mut call: F) -> Result<T, Status>
    where
        F: FnMut(ArtifactStoreClient<TracedChannel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        self.dependency
            .call(safety, what, || call(self.client.clone()))
            .await
    }

    pub async fn create_project(&self, project: &str) -> Result<(), Status> {
        let req = CreateProjectRequest {
            project_id: project.to_owned(),
        };
        self.call("CreateProject", Safety::Idempotent, |mut c| {
            let req = req.clone();
            async move { c.create_project(req).await.map(|_| ()) }
        })
        .await
    }

    /// Every project id.
    pub async fn projects(&self) -> Result<Vec<String>, Status> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let req = ListProjectsRequest {
                page: Some(PageRequest {
                    page_size: 1000,
                    page_token: token.clone(),
                }),
            };
            let page = self
                .call("ListProjects", Safety::Idempotent, |mut c| {
                    let req = req.clone();
                    async move { c.list_projects(req).await }
                })
                .await?
                .into_inner();
            out.extend(page.projects.into_iter().map(|p| p.project_id));
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            token = page.next_page_token;
        }
    }

    /// Writes one file (created if the project does not exist yet). A deferred write's token
    /// is kept for its run's next AppendEvents.
    pub async fn put(
        &self,
        project: &str,
        path: &str,
        bytes: Bytes,
        opts: &PutOptions,
    ) -> Result<PutResponse, Status> {
        let r = self.put_once(project, path, bytes.clone(), opts).await?;
        if opts.with_run_events && !r.publication_token.is_empty() {
            let entry = Unproven {
                token: r.publication_token.clone(),
                path: path.to_owned(),
                bytes,
                opts: opts.clone(),
            };
            self.unproven_of(project, &opts.run_id).push(entry);
        }
        Ok(r)
    }

    fn unproven_of(&self, project: &str, run_id: &str) -> UnprovenGuard<'_> {
        UnprovenGuard {
            map: self.unproven.lock().unwrap_or_else(|p| p.into_inner()),
            key: (project.to_owned(), run_id.to_owned()),
        }
    }

    async fn put_once(
        &self,
        project: &str,
        path: &str,
        bytes: Bytes,
        opts: &PutOptions,
    ) -> Result<PutResponse, Status> {
        let mut msgs = Vec::with_capacity(2 + bytes.len() / CHUNK);
        msgs.push(PutRequest {
            msg: Some(put_request::Msg::Header(PutHeader {
                project_id: project.to_owned(),
                path: path.to_owned(),
                overwrite: opts.overwrite,
                expected_sha256: opts.expected_sha256.clone(),
                expected_size: Some(bytes.len() as u64),
                allowed_prefixes: opts.allowed_prefixes.clone(),
                run_id: opts.run_id.clone(),
                create_project: true,
                durability: if opts.with_run_events {
                    PutDurability::WithRunEvents
                } else {
                    PutDurability::Sync
                } as i32,
                fence: self.fence_for(project, path, &opts.run_id),
                if_sha256: opts.if_sha256.clone(),
                claim: String::new(),
                // The size is known up front.
                digest_at_end: false,
            })),
        });
        let mut at = 0;
        while at < bytes.len() {
            let end = (at + CHUNK).min(bytes.len());
            msgs.push(PutRequest {
                msg: Some(put_request::Msg::Chunk(bytes.slice(at..end))),
            });
            at = end;
        }
        // The same bytes every time: a resent Put whose first try landed is `unchanged`.
        self.call("Put", Safety::Idempotent, |mut c| {
            let msgs = msgs.clone();
            async move {
                c.put(tokio_stream::iter(msgs))
                    .await
                    .map(|r| r.into_inner())
            }
        })
        .await
    }

    /// Reads a whole file; `None` when it does not exist.
    pub async fn get(&self, project: &str, path: &str) -> Result<Option<Bytes>, Status> {
        self.get_at_most(project, path, MAX_READ_BYTES).await
    }

    /// Reads a whole file of at most `max` bytes; a larger one is ResourceExhausted, found
    /// from the size the store sends first (so it is never read) or, for a file that grows
    /// while read, as soon as more than `max` bytes arrived.
    pub async fn get_at_most(
        &self,
        project: &str,
        path: &str,
        max: u64,
    ) -> Result<Option<Bytes>, Status> {
        let too_large = |size: u64| {
            Status::resource_exhausted(format!(
                "{path} is {size} bytes; the orchestrator reads at most {max} here"
            ))
        };
        let Some(mut stream) = self.open_get(project, path).await? else {
            return Ok(None);
        };
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let msg = match stream.message().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(s) if s.code() == Code::NotFound => return Ok(None),
                Err(s) => return Err(s),
            };
            match msg.msg {
                Some(get_response::Msg::Info(info)) => {
                    if info.size_bytes > max {
                        return Err(too_large(info.size_bytes));
                    }
                    buf.reserve(info.size_bytes as usize);
                }
                Some(get_response::Msg::Chunk(c)) => {
                    buf.extend_from_slice(&c);
                    if buf.len() as u64 > max {
                        return Err(too_large(buf.len() as u64));
                    }
                }
                None => {}
            }
        }
        Ok(Some(Bytes::from(buf)))
    }

    /// A Get of the whole of `path` (resent while the store is away); None when there is no
    /// such file.
    async fn open_get(
        &self,
        project: &str,
        path: &str,
    ) -> Result<Option<tonic::Streaming<cairn_proto::v1::GetResponse>>, Status> {
        let req = GetRequest {
            project_id: project.to_owned(),
            path: path.to_owned(),
            offset: 0,
            length: 0,
        };
        let opened = self
            .call("Get", Safety::Idempotent, |mut c| {
                let req = req.clone();
                async move { c.get(req).await }
            })
            .await;
        match opened {
            Ok(s) => Ok(Some(s.into_inner())),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(s),
        }
    }

    /// Describes one path; `None` when nothing is there.
    pub async fn stat(
        &self,
        project: &str,
        path: &str,
        sha256: bool,
    ) -> Result<Option<FileInfo>, Status> {
        let req = StatRequest {
            project_id: project.to_owned(),
            path: path.to_owned(),
            include_sha256: sha256,
        };
        let stat = self
            .call("Stat", Safety::Idempotent, |mut c| {
                let req = req.clone();
                async move { c.stat(req).await }
            })
            .await;
        match stat {
            Ok(r) => Ok(Some(r.into_inner())),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(s),
        }
    }

    /// Every entry under `prefix` (all pages); an absent prefix lists nothing.
    /// One page of a project's run summaries from the store's run index (ListRunSummaries),
    /// newest first.
    pub async fn list_run_summaries(
        &self,
        req: cairn_proto::v1::ListRunSummariesRequest,
    ) -> Result<cairn_proto::v1::ListRunSummariesResponse, Status> {
        self.call("ListRunSummaries", Safety::Idempotent, |mut c| {
            let req = req.clone();
            async move { c.list_run_summaries(req).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }

    pub async fn list(
        &self,
        project: &str,
        prefix: &str,
        recursive: bool,
    ) -> Result<Vec<FileInfo>, Status> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let req = ListRequest {
                project_id: project.to_owned(),
                prefix: prefix.trim_end_matches('/').to_owned(),
                recursive,
                page: Some(PageRequest {
                    page_size: 10_000,
                    page_token: token.clone(),
                }),
            };
            let listed = self
                .call("List", Safety::Idempotent, |mut c| {
                    let req = req.clone();
                    async move { c.list(req).await }
                })
                .await;
            let page = match listed {
                Ok(r) => r.into_inner(),
                // A missing prefix lists nothing; a missing project is the caller's error.
                Err(s)
                    if s.code() == Code::NotFound
                        && cairn_proto::reason::of(&s).as_deref() != Some("no_project") =>
                {
                    return Ok(out)
                }
                Err(s) => return Err(s),
            };
            out.extend(page.entries);
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            token = page.next_page_token;
        }
    }

    /// Removes a file; Ok(false) when nothing was there. With `run_id` the store records the
    /// deletion in that run's events.
    pub async fn delete(&self, project: &str, path: &str, run_id: &str) -> Result<bool, Status> {
        let req = cairn_proto::v1::DeleteRequest {
            project_id: project.to_owned(),
            path: path.to_owned(),
            run_id: run_id.to_owned(),
        };
        // Resent only when it never reached the store: a second Delete would say "nothing
        // was there" of a file the first removed.
        self.call("Delete", Safety::Once, |mut c| {
            let req = req.clone();
            async move { c.delete(req).await.map(|r| r.into_inner().deleted) }
        })
        .await
    }

    pub async fn append_events(
        &self,
        project: &str,
        run_id: &str,
        events: Vec<EventInput>,
    ) -> Result<AppendEventsResponse, Status> {
        self.append_events_fenced(project, run_id, events, 0).await
    }

    /// AppendEvents as the run's fenced writer (`epoch` from [`Store::claim_run`]); refused
    /// with FAILED_PRECONDITION `fenced` once another writer has claimed the run.
    ///
    /// Durable before named: the batch presents the tokens of every deferred Put of the run
    /// not yet proven durable, so the store commits it only once those files are. When the
    /// store refuses them (`publication_unproven`: it restarted since those Puts replied, and
    /// the files may never have landed) they are written again here and the refusal is
    /// returned: the caller sends the same events again (see [`is_publication_unproven`]).
    pub async fn append_events_fenced(
        &self,
        project: &str,
        run_id: &str,
        events: Vec<EventInput>,
        epoch: u64,
    ) -> Result<AppendEventsResponse, Status> {
        let tokens = self.unproven_of(project, run_id).tokens();
        let req = AppendEventsRequest {
            project_id: project.to_owned(),
            run_id: run_id.to_owned(),
            events,
            epoch,
            publication_tokens: tokens.clone(),
            claim: String::new(),
        };
        // The store does not recognise a batch sent twice: resent here only when it never
        // reached the store (the recorder checks the log's tail before its own retries).
        let sent = self
            .call("AppendEvents", Safety::Once, |mut c| {
                let req = req.clone();
                async move { c.append_events(req).await.map(|r| r.into_inner()) }
            })
            .await;
        match sent {
            Ok(r) => {
                // Committed: every file those tokens stand for is durable.
                self.unproven_of(project, run_id).spend(&tokens);
                Ok(r)
            }
            Err(s) if is_publication_unproven(&s) => {
                self.write_again(project, run_id, &tokens).await?;
                Err(s)
            }
            Err(s) => Err(s),
        }
    }

    /// Writes again the deferred Puts of a run whose `tokens` the store refused; their new
    /// tokens replace the old ones. A write refused now (its bytes can no longer land) is
    /// returned, so the events that name it are never appended.
    async fn write_again(
        &self,
        project: &str,
        run_id: &str,
        tokens: &[String],
    ) -> Result<(), Status> {
        let stale: Vec<Unproven> = self
            .unproven_of(project, run_id)
            .entries()
            .iter()
            .filter(|u| tokens.contains(&u.token))
            .cloned()
            .collect();
        tracing::warn!(
            project,
            run_id,
            files = stale.len(),
            "the store restarted before files it had acknowledged were proven durable; writing them again"
        );
        let rewritten = futures::stream::iter(stale)
            .map(|u| async move {
                let r = self
                    .put_once(project, &u.path, u.bytes.clone(), &u.opts)
                    .await?;
                Ok::<_, Status>((u.token, r.publication_token))
            })
            .buffer_unordered(16);
        futures::pin_mut!(rewritten);
        while let Some(r) = rewritten.next().await {
            let (old, new) = r?;
            self.unproven_of(project, run_id).replace(&old, new);
        }
        Ok(())
    }

    /// Makes this process the run's only fenced writer; returns (epoch, last_seq). Events
    /// read after it are all there will be from earlier writers.
    pub async fn claim_run(&self, project: &str, run_id: &str) -> Result<(u64, u64), Status> {
        let req = ClaimRunRequest {
            project_id: project.to_owned(),
            run_id: run_id.to_owned(),
            holder: format!("orchestrator pid {}", std::process::id()),
        };
        let r = self
            .call("ClaimRun", Safety::Once, |mut c| {
                let req = req.clone();
                async move { c.claim_run(req).await }
            })
            .await?
            .into_inner();
        if let Ok(mut claims) = self.claims.lock() {
            claims.insert((project.to_owned(), run_id.to_owned()), r.epoch);
        }
        Ok((r.epoch, r.last_seq))
    }

    /// Forgets this process's claim `epoch` on a run whose driver has ended (a newer claim of
    /// ours stays).
    pub fn forget_claim(&self, project: &str, run_id: &str, epoch: u64) {
        if let Ok(mut claims) = self.claims.lock() {
            let k = (project.to_owned(), run_id.to_owned());
            if claims.get(&k) == Some(&epoch) {
                claims.remove(&k);
                // Its driver is gone: what no event named is redone by a later resume.
                self.unproven_of(project, run_id).clear();
            }
        }
    }

    /// An ingest claim (GrantIngestClaim) on a run this process drives, for the ingest service
    /// to write for it; None when this process holds no claim on the run. The store binds it
    /// to our current epoch: once a successor claims the run, nothing written with it lands.
    pub async fn ingest_claim(
        &self,
        project: &str,
        run_id: &str,
    ) -> Result<Option<String>, Status> {
        let Some(fence) = self.fence_for(project, "", run_id) else {
            return Ok(None);
        };
        let req = GrantIngestClaimRequest {
            project_id: project.to_owned(),
            run_id: run_id.to_owned(),
            epoch: fence.epoch,
            ..Default::default()
        };
        let r = self
            .call("GrantIngestClaim", Safety::Idempotent, |mut c| {
                let req = req.clone();
                async move { c.grant_ingest_claim(req).await }
            })
            .await?
            .into_inner();
        Ok(Some(r.claim))
    }

    /// This process's claim on a run, if it holds one.
    pub fn run_fence(&self, project: &str, run_id: &str) -> Option<RunFence> {
        self.fence_for(project, "", run_id)
    }

    /// The fence for a write of `path` on behalf of `run_id` (or, without one, of the run
    /// whose directory holds `path`), when this process holds a claim on that run.
    fn fence_for(&self, project: &str, path: &str, run_id: &str) -> Option<RunFence> {
        let run = match run_id {
            "" => path.strip_prefix(".cairn/runs/")?.split('/').next()?,
            run => run,
        };
        let claims = self.claims.lock().ok()?;
        let epoch = *claims.get(&(project.to_owned(), run.to_owned()))?;
        Some(RunFence {
            run_id: run.to_owned(),
            epoch,
        })
    }

    /// Updates a versioned JSON document: `expected_version` is the
    /// `write_version` read (0 = absent); a conflict is Aborted unless `merge` is MAX.
    pub async fn update_json(
        &self,
        project: &str,
        path: &str,
        expected_version: u64,
        patch: &serde_json::Value,
        merge: cairn_proto::v1::MergePolicy,
        run_id: &str,
    ) -> Result<UpdateJsonResponse, Status> {
        let req = UpdateJsonRequest {
            project_id: project.to_owned(),
            path: path.to_owned(),
            expected_version,
            patch_json: patch.to_string(),
            merge: merge as i32,
            run_id: run_id.to_owned(),
        };
        self.call("UpdateJson", Safety::Once, |mut c| {
            let req = req.clone();
            async move { c.update_json(req).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// A run's events from `from_seq` to the end (no follow).
    pub async fn read_events(
        &self,
        project: &str,
        run_id: &str,
        from_seq: u64,
    ) -> Result<Vec<Event>, Status> {
        let mut stream = self.follow_events(project, run_id, from_seq, false).await?;
        let mut out = Vec::new();
        while let Some(e) = stream.message().await? {
            out.push(e);
        }
        Ok(out)
    }

    /// The store's event stream (live when `follow`).
    pub async fn follow_events(
        &self,
        project: &str,
        run_id: &str,
        from_seq: u64,
        follow: bool,
    ) -> Result<tonic::Streaming<Event>, Status> {
        let req = ReadEventsRequest {
            project_id: project.to_owned(),
            run_id: run_id.to_owned(),
            from_seq,
            follow,
            limit: 0,
        };
        self.call("ReadEvents", Safety::Idempotent, |mut c| {
            let req = req.clone();
            async move { c.read_events(req).await.map(|r| r.into_inner()) }
        })
        .await
    }
}

/// The unproven deferred Puts of one run, under the lock.
struct UnprovenGuard<'a> {
    map: std::sync::MutexGuard<'a, UnprovenPuts>,
    key: (String, String),
}

impl UnprovenGuard<'_> {
    fn entries(&self) -> &[Unproven] {
        self.map.get(&self.key).map_or(&[], Vec::as_slice)
    }

    /// The tokens an AppendEvents of the run presents.
    fn tokens(&self) -> Vec<String> {
        self.entries().iter().map(|u| u.token.clone()).collect()
    }

    /// A batch that presented `tokens` was committed: those files are durable.
    fn spend(&mut self, tokens: &[String]) {
        let spent: std::collections::HashSet<&String> = tokens.iter().collect();
        self.retain(|u| !spent.contains(&u.token));
    }

    /// A file was written again: its new token stands for it.
    fn replace(&mut self, old: &str, new: String) {
        let entries = self
            .map
            .get_mut(&self.key)
            .map_or(&mut [][..], Vec::as_mut_slice);
        if let Some(u) = entries.iter_mut().find(|u| u.token == old) {
            u.token = new;
        }
    }

    fn push(&mut self, u: Unproven) {
        self.map.entry(self.key.clone()).or_default().push(u);
    }

    fn retain(&mut self, keep: impl FnMut(&Unproven) -> bool) {
        if let Some(v) = self.map.get_mut(&self.key) {
            v.retain(keep);
            if v.is_empty() {
                self.map.remove(&self.key);
            }
        }
    }

    fn clear(&mut self) {
        self.map.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unproven(token: &str, path: &str) -> Unproven {
        Unproven {
            token: token.to_owned(),
            path: path.to_owned(),
            bytes: Bytes::from_static(b"x"),
            opts: PutOptions::default(),
        }
    }

    fn guard<'a>(map: &'a std::sync::Mutex<UnprovenPuts>, run: &str) -> UnprovenGuard<'a> {
        UnprovenGuard {
            map: map.lock().unwrap_or_else(|p| p.into_inner()),
            key: ("p".to_owned(), run.to_owned()),
        }
    }

    #[test]
    fn only_a_failed_precondition_with_its_reason_word_is_publication_unproven() {
        use cairn_proto::reason::status;
        let unproven = status(Code::FailedPrecondition, "m", PUBLICATION_UNPROVEN);
        assert!(is_publication_unproven(&unproven));
        for other in [
            status(Code::FailedPrecondition, "m", "fenced"),
            status(Code::InvalidArgument, "m", PUBLICATION_UNPROVEN),
            Status::failed_precondition("m"),
        ] {
            assert!(!is_publication_unproven(&other), "{other:?}");
        }
    }

    #[test]
    fn tokens_presented_by_a_committed_batch_are_dropped_and_only_those() {
        let map = std::sync::Mutex::new(UnprovenPuts::new());
        guard(&map, "r1").push(unproven("t1", "a.md"));
        guard(&map, "r1").push(unproven("t2", "b.md"));
        guard(&map, "r2").push(unproven("t3", "c.md"));
        let presented = guard(&map, "r1").tokens();
        assert_eq!(presented, ["t1", "t2"]);
        // A Put that replied while the batch was in flight is not proven by it.
        guard(&map, "r1").push(unproven("t4", "d.md"));
        guard(&map, "r1").spend(&presented);
        assert_eq!(guard(&map, "r1").tokens(), ["t4"]);
        assert_eq!(guard(&map, "r2").tokens(), ["t3"], "another run's stay");
        guard(&map, "r1").spend(&["t4".to_owned()]);
        assert!(guard(&map, "r1").tokens().is_empty());
        let runs = map.lock().unwrap_or_else(|p| p.into_inner()).len();
        assert_eq!(runs, 1, "a run with nothing unproven leaves no entry");
    }

    #[test]
    fn a_rewritten_file_is_presented_with_its_new_token() {
        let map = std::sync::Mutex::new(UnprovenPuts::new());
        guard(&map, "r1").push(unproven("old-a", "a.md"));
        guard(&map, "r1").push(unproven("old-b", "b.md"));
        guard(&map, "r1").replace("old-a", "new-a".to_owned());
        assert_eq!(guard(&map, "r1").tokens(), ["new-a", "old-b"]);
        let paths: Vec<_> = guard(&map, "r1")
            .entries()
            .iter()
            .map(|u| u.path.clone())
            .collect();
        assert_eq!(paths, ["a.md", "b.md"]);
        // A token no longer kept (spent meanwhile) changes nothing.
        guard(&map, "r1").replace("gone", "new-x".to_owned());
        guard(&map, "r2").replace("old-b", "new-y".to_owned());
        assert_eq!(guard(&map, "r1").tokens(), ["new-a", "old-b"]);
        // The old token no longer proves anything; the new one does.
        guard(&map, "r1").spend(&["old-a".to_owned()]);
        assert_eq!(guard(&map, "r1").tokens(), ["new-a", "old-b"]);
        guard(&map, "r1").spend(&["new-a".to_owned()]);
        assert_eq!(guard(&map, "r1").tokens(), ["old-b"]);
    }
}
