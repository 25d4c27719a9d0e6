//! One ingest, top to bottom: the flag, the document, the
//! blocks, the writes through the store, the manifest, the events.
//!
//! fail-open. Whatever goes wrong with the document or the store (dead,
//! slow, refusing) ends up in the manifest, the events and the reply's level/notes; the caller
//! always gets a normal reply. Only a malformed request is an error. Never logs content.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use bytes::Bytes;
use cairn_proto::v1::{IngestRequest, OverwritePolicy, PutHeader, WriteOutcome};
use futures::StreamExt;
use pathguard::Policy;

use crate::block::{self, reason, sha256_hex, Block, BlockStatus, Limits, WORKSPACE};
use crate::error::{Error, Result};
use crate::events;
use crate::flag;
use crate::manifest::{Manifest, Severity, Source};
use crate::store::{StoreClient, StoreError};

/// Node id used when the request names none.
pub const DEFAULT_NODE_ID: &str = "manual";

/// Most notes a reply carries (the manifest has every block regardless).
const MAX_NOTES: usize = 100;

/// Events per AppendEvents call.
const EVENTS_PER_CALL: usize = 500;

/// Where the manifest of `node_id` in `run_id` is stored (the latest ingest of that node).
pub fn manifest_path(run_id: &str, node_id: &str) -> String {
    format!(".cairn/runs/{run_id}/ingest/{node_id}.json")
}

/// Where every manifest is also kept, named by its digest: a later ingest of the same node
/// replaces `manifest_path`, but what earlier ones wrote stays on record (provenance).
pub fn history_path(run_id: &str, node_id: &str, sha256: &str) -> String {
    let short = sha256.get(..16).unwrap_or(sha256);
    format!(".cairn/runs/{run_id}/ingest/history/{node_id}.{short}.json")
}

/// Which existing workspace files (holding other bytes) a block may replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overwrite {
    /// None: the block is rejected `exists`.
    Never,
    /// Files an earlier ingest wrote that nobody changed since (provenance from the stored
    /// manifests); a human's file is kept and the block rejected `kept`.
    #[default]
    Ingested,
    /// Every file.
    Always,
}

impl Overwrite {
    /// From the request's `overwrite` flag and `overwrite_policy`.
    fn of(overwrite: bool, policy: i32) -> Result<Overwrite> {
        let policy = OverwritePolicy::try_from(policy).map_err(|_| Error::UnknownEnum {
            field: "overwrite_policy",
            value: policy,
        })?;
        Ok(match policy {
            OverwritePolicy::Unspecified if overwrite => Overwrite::Always,
            OverwritePolicy::Unspecified | OverwritePolicy::Ingested => Overwrite::Ingested,
            OverwritePolicy::Never => Overwrite::Never,
            OverwritePolicy::Always => Overwrite::Always,
        })
    }
}

/// A checked ingest request.
#[derive(Debug, Clone)]
pub struct Request {
    pub project_id: String,
    pub run_id: String,
    pub node_id: String,
    pub source: Source,
    /// The document; empty = read `source.doc_path` from the store.
    pub content: Bytes,
    pub overwrite: Overwrite,
    /// The caller's ingest claim on the run (opaque; the store verifies it), sent with every
    /// write and event batch; empty = none.
    pub claim: String,
}

impl Request {
    /// Checks the ids (the only way an ingest request can be refused) and fills defaults.
    pub fn from_proto(r: IngestRequest) -> Result<Request> {
        let project_id = check_id("project", "project_id", r.project_id)?;
        let run_id = check_id("run", "run_id", r.run_id)?;
        let node_id = if r.node_id.is_empty() {
            DEFAULT_NODE_ID.to_owned()
        } else {
            check_id("node", "node_id", r.node_id)?
        };
        let overwrite = Overwrite::of(r.overwrite, r.overwrite_policy)?;
        if !r.doc_path.is_empty() {
            pathguard::validate(&r.doc_path).map_err(|rejection| Error::DocPath {
                path: r.doc_path.clone(),
                rejection,
            })?;
        }
        let or = |s: String, default: &str| if s.is_empty() { default.to_owned() } else { s };
        Ok(Request {
            project_id,
            run_id,
            node_id,
            source: Source {
                kind: or(r.source_kind, "graph_runtime"),
                mode: or(r.mode, "unknown"),
                doc_path: r.doc_path,
            },
            content: r.content,
            overwrite,
            claim: r.claim,
        })
    }
}

/// An id of the form [A-Za-z0-9._-]{1,128}, not `.` or `..` (common.proto).
pub fn check_id(kind: &'static str, field: &'static str, id: String) -> Result<String> {
    if id.is_empty() {
        return Err(Error::Missing(field));
    }
    let ok = id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(id)
    } else {
        Err(Error::InvalidId { kind, id })
    }
}

/// What an ingest (or a dry run) produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// False when ingest is disabled for the project/run: nothing was read or written.
    pub enabled: bool,
    /// The manifest (None when disabled).
    pub manifest: Option<Manifest>,
    /// The blocks behind the manifest, with details.
    pub blocks: Vec<Block>,
    /// Where the manifest was stored; "" for a dry run or when it could not be stored.
    pub manifest_path: String,
    /// Overall severity.
    pub severity: Severity,
    /// Human-readable notes on problems (never content).
    pub notes: Vec<String>,
}

/// The document of a request.
enum Document {
    Loaded(Bytes),
    /// Read from the store but over `max_document_bytes`: (size, sha256).
    Oversized(u64, String),
}

/// What went wrong during one ingest, besides the blocks' own statuses.
#[derive(Default)]
struct Trouble {
    /// Set once the store was found unavailable; later store calls are not attempted.
    store_down: OnceLock<String>,
    /// Set once the store refused the caller's claim: `fenced` (a newer claim holds the run)
    /// or expired, forged, other-run. Nothing more is written and the call fails.
    refused: OnceLock<StoreError>,
    /// The request carries no claim: an `identity` refusal then means one is required.
    claimless: bool,
    /// The first failure of ingest's own job: (reason word, message). Makes `ingest.failed`.
    failure: Option<(String, String)>,
    notes: Vec<String>,
    dropped_notes: usize,
}

impl Trouble {
    fn note(&mut self, note: String) {
        if self.notes.len() < MAX_NOTES {
            self.notes.push(note);
        } else {
            self.dropped_notes += 1;
        }
    }

    fn fail(&mut self, reason: &str, message: String) {
        self.note(message.clone());
        if self.failure.is_none() {
            self.failure = Some((reason.to_owned(), message));
        }
    }

    /// Records a store error of a call that ingest itself needed (not a block's write).
    fn store_failed(&mut self, what: &str, e: &StoreError) {
        self.saw(e);
        self.fail(e.reason(), format!("{what}: {e}"));
    }

    /// Notes a store error that stops later store calls (unavailable, claim refused).
    fn saw(&self, e: &StoreError) {
        if e.is_unavailable() {
            let _ = self.store_down.set(e.to_string());
        } else if e.is_fenced() || e.is_claim_refused() || (self.claimless && e.is_identity()) {
            let _ = self.refused.set(e.clone());
        }
    }

    /// Why no further store call is attempted, if one is not.
    fn stopped(&self) -> Option<String> {
        self.store_down
            .get()
            .cloned()
            .or_else(|| self.refused.get().map(ToString::to_string))
    }

    fn store_up(&self) -> bool {
        self.stopped().is_none()
    }

    fn into_notes(mut self) -> Vec<String> {
        if self.dropped_notes > 0 {
            self.notes.push(format!(
                "... and {} more (see the manifest)",
                self.dropped_notes
            ));
        }
        self.notes
    }
}

/// Ingest's domain: parses documents and writes their blocks through the store.
#[derive(Clone)]
pub struct Ingestor {
    pub store: StoreClient,
    pub limits: Limits,
    pub policy: Policy,
    pub default_enabled: bool,
    pub write_concurrency: usize,
}

impl Ingestor {
    /// Dry run: the manifest as `ingest` would produce it, without writing anything (store-side
    /// refusals such as `exists` cannot be known). Reads `doc_path` from the store when the
    /// request carries no content.
    pub async fn dry_run(&self, req: &Request) -> Outcome {
        let mut trouble = Trouble::default();
        let blocks = match self.document(req, &mut trouble).await {
            Some(doc) => self.blocks_of(&doc).await,
            None => Vec::new(),
        };
        let manifest = Manifest::new(&req.run_id, &req.node_id, req.source.clone(), &blocks);
        self.finish(req, manifest, blocks, String::new(), trouble)
    }

    /// Ingests the document: writes every valid block to `workspace/<file>`, stores the
    /// manifest, appends the events. Fails only when a newer claim on the run fenced the
    /// caller off (then it stops writing); anything else goes into the outcome (fail-open).
    pub async fn ingest(&self, req: &Request) -> Result<Outcome> {
        let mut trouble = Trouble {
            claimless: req.claim.is_empty(),
            ..Trouble::default()
        };
        let enabled = match flag::effective(
            &self.store,
            &req.project_id,
            Some(&req.run_id),
            self.default_enabled,
        )
        .await
        {
            Ok(enabled) => enabled,
            Err(e) => {
                trouble.store_failed("reading the ingest flag", &e);
                self.default_enabled
            }
        };
        if !enabled {
            tracing::info!(project = %req.project_id, run = %req.run_id, node = %req.node_id, "ingest is disabled; nothing done");
            return Ok(Outcome {
                enabled: false,
                manifest: None,
                blocks: Vec::new(),
                manifest_path: String::new(),
                severity: Severity::Info,
                notes: vec![format!(
                    "ingest is disabled for project {:?} run {:?}; enable it with SetEnabled",
                    req.project_id, req.run_id
                )],
            });
        }
        if trouble.store_up() {
            if let Err(e) = self.store.create_project(&req.project_id).await {
                trouble.store_failed("creating the project", &e);
            }
        }
        let document = self.document(req, &mut trouble).await;
        if trouble.store_up() {
            let (bytes, sha256) = match &document {
                Some(Document::Loaded(doc)) => (doc.len() as u64, sha256_hex(doc)),
                Some(Document::Oversized(size, sha256)) => (*size, sha256.clone()),
                None => (0, String::new()),
            };
            let started = events::started(&req.node_id, &req.source, bytes, &sha256);
            if let Err(e) = self
                .store
                .append_events(&req.project_id, &req.run_id, &req.claim, vec![started])
                .await
            {
                trouble.store_failed("appending ingest.started", &e);
            }
        }

        let mut blocks = match &document {
            Some(doc) => self.blocks_of(doc).await,
            None => Vec::new(),
        };
        let outcomes = match &document {
            Some(Document::Loaded(doc)) => self.write_blocks(req, doc, &mut blocks, &trouble).await,
            _ => vec![None; blocks.len()],
        };
        if let Some(b) = blocks
            .iter()
            .find(|b| b.reason == reason::STORE_UNAVAILABLE || b.reason == reason::IO_ERROR)
        {
            let (r, d) = (b.reason.clone(), b.detail.clone());
            trouble.fail(&r, format!("writing the blocks failed: {d}"));
        }
        // The entry standing for an oversized document (no header, so no declared file).
        if let Some(b) = blocks
            .iter()
            .find(|b| b.reason == reason::TOO_LARGE && b.declared_file.is_empty())
        {
            let d = b.detail.clone();
            trouble.fail(reason::TOO_LARGE, d);
        }

        let manifest = Manifest::new(&req.run_id, &req.node_id, req.source.clone(), &blocks);
        let mut stored_at = String::new();
        if trouble.store_up() {
            let path = manifest_path(&req.run_id, &req.node_id);
            let body = Bytes::from(manifest.to_json());
            let header = PutHeader {
                project_id: req.project_id.clone(),
                path: path.clone(),
                overwrite: true,
                expected_sha256: sha256_hex(&body),
                expected_size: Some(body.len() as u64),
                run_id: req.run_id.clone(),
                create_project: true,
                claim: req.claim.clone(),
                ..PutHeader::default()
            };
            let history = PutHeader {
                path: history_path(&req.run_id, &req.node_id, &header.expected_sha256),
                overwrite: false,
                ..header.clone()
            };
            match self.store.put(header, body.clone()).await {
                Ok(_) => stored_at = path,
                Err(e) => trouble.store_failed("storing the manifest", &e),
            }
            if trouble.store_up() && manifest.summary.written > 0 {
                if let Err(e) = self.store.put(history, body).await {
                    trouble.store_failed("keeping the manifest on record", &e);
                }
            }
        } else {
            trouble
                .note("the manifest was not stored: the artifact-store is unavailable".to_owned());
        }

        if trouble.store_up() {
            let mut list: Vec<_> = blocks
                .iter()
                .zip(&outcomes)
                .map(|(b, o)| events::block(&req.node_id, b, *o))
                .collect();
            let severity = Severity::of(&blocks);
            list.push(match &trouble.failure {
                Some((r, message)) => {
                    events::failed(&req.node_id, r, message, &manifest.summary, &stored_at)
                }
                None => events::completed(&req.node_id, &manifest.summary, &stored_at, severity),
            });
            for batch in list.chunks(EVENTS_PER_CALL) {
                if let Err(e) = self
                    .store
                    .append_events(&req.project_id, &req.run_id, &req.claim, batch.to_vec())
                    .await
                {
                    trouble.store_failed("appending the ingest events", &e);
                    break;
                }
            }
        }
        if let Some(refused) = trouble.refused.get() {
            tracing::warn!(project = %req.project_id, run = %req.run_id, node = %req.node_id, %refused, "ingest stopped: the store refused the caller's claim");
            return Err(if refused.is_fenced() {
                Error::Fenced(refused.to_string())
            } else if refused.is_identity() {
                Error::ClaimRequired(refused.to_string())
            } else {
                Error::ClaimRefused {
                    reason: refused.reason().to_owned(),
                    message: refused.to_string(),
                }
            });
        }
        Ok(self.finish(req, manifest, blocks, stored_at, trouble))
    }

    /// The document: the request's content, or `doc_path` read from the store.
    async fn document(&self, req: &Request, trouble: &mut Trouble) -> Option<Document> {
        if !req.content.is_empty() || req.source.doc_path.is_empty() {
            return Some(Document::Loaded(req.content.clone()));
        }
        let doc_path = &req.source.doc_path;
        if !trouble.store_up() {
            trouble.fail(
                reason::STORE_UNAVAILABLE,
                format!("cannot read {doc_path:?}: the artifact-store is unavailable"),
            );
            return None;
        }
        match self
            .store
            .get(&req.project_id, doc_path, self.limits.max_document_bytes)
            .await
        {
            Ok((size, sha256, _)) if size > self.limits.max_document_bytes => {
                Some(Document::Oversized(size, sha256))
            }
            Ok((_, _, bytes)) => Some(Document::Loaded(Bytes::from(bytes))),
            Err(e) => {
                trouble.store_failed(&format!("reading the document {doc_path:?}"), &e);
                None
            }
        }
    }

    async fn blocks_of(&self, document: &Document) -> Vec<Block> {
        match document {
            Document::Loaded(doc) => {
                // CPU-bound (a few ms per MB): off the async workers.
                let (doc, limits, policy) = (doc.clone(), self.limits, self.policy.clone());
                let again = doc.clone();
                match tokio::task::spawn_blocking(move || block::parse(&doc, &limits, &policy))
                    .await
                {
                    Ok(blocks) => blocks,
                    // Only when the runtime is shutting down: parse right here instead.
                    Err(_) => block::parse(&again, &self.limits, &self.policy),
                }
            }
            Document::Oversized(size, sha256) => {
                vec![block::oversized_document(
                    *size,
                    sha256.clone(),
                    self.limits.max_document_bytes,
                )]
            }
        }
    }

    /// Writes every block still `Written` through the store and records what the store said;
    /// then, under [`Overwrite::Ingested`], replaces the files an earlier ingest wrote.
    /// Returns the store's outcome word per block (created, unchanged, overwritten).
    async fn write_blocks(
        &self,
        req: &Request,
        doc: &Bytes,
        blocks: &mut [Block],
        trouble: &Trouble,
    ) -> Vec<Option<&'static str>> {
        let mut outcomes = vec![None; blocks.len()];
        let todo: Vec<Write> = blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.status == BlockStatus::Written)
            .map(|(i, b)| Write::of(i, b, doc, None))
            .collect();
        let results = self.put_all(req, todo, trouble).await;
        record(blocks, &mut outcomes, results);
        if req.overwrite == Overwrite::Ingested && trouble.store_up() {
            self.replace_ingested(req, doc, blocks, &mut outcomes, trouble)
                .await;
        }
        outcomes
    }

    /// The blocks refused `exists` whose file holds bytes an earlier ingest wrote there are
    /// written again as a compare-and-swap on those bytes; the others are `kept`.
    async fn replace_ingested(
        &self,
        req: &Request,
        doc: &Bytes,
        blocks: &mut [Block],
        outcomes: &mut [Option<&'static str>],
        trouble: &Trouble,
    ) {
        let held: Vec<usize> = (0..blocks.len())
            .filter(|&i| blocks[i].status == BlockStatus::Rejected && blocks[i].reason == "exists")
            .collect();
        if held.is_empty() {
            return;
        }
        let wanted: HashSet<&str> = held
            .iter()
            .map(|&i| blocks[i].workspace_path.as_str())
            .collect();
        let written = match self.ingested(&req.project_id, &wanted).await {
            Ok(written) => written,
            Err(e) => {
                trouble.saw(&e);
                for &i in &held {
                    blocks[i].set(
                        BlockStatus::Rejected,
                        reason::KEPT,
                        format!("kept: the earlier ingests of {:?} could not be read ({e}), so it is left as it is", blocks[i].workspace_path),
                    );
                }
                return;
            }
        };
        let mut todo = Vec::new();
        for i in held {
            let path = blocks[i].workspace_path.clone();
            let current = match self.store.stat_sha256(&req.project_id, &path).await {
                Ok(sha) => sha,
                Err(e) => {
                    trouble.saw(&e);
                    let detail = format!("kept: {path:?} could not be read ({e})");
                    blocks[i].set(BlockStatus::Rejected, reason::KEPT, detail);
                    continue;
                }
            };
            match current {
                Some(sha) if written.get(&path).is_some_and(|s| s.contains(&sha)) => {
                    todo.push(Write::of(i, &blocks[i], doc, Some(sha)));
                }
                _ => blocks[i].set(
                    BlockStatus::Rejected,
                    reason::KEPT,
                    format!("kept: {path:?} was written or edited by someone other than ingest (its bytes match no earlier ingest of it), so it is left as it is; set the node's ingest overwrite to `always` to replace it anyway"),
                ),
            }
        }
        for w in &todo {
            blocks[w.index].set(BlockStatus::Written, "", "");
        }
        let results = self.put_all(req, todo, trouble).await;
        for (i, result) in &results {
            if let Err(StoreError::Refused { reason: r, .. }) = result {
                if r == reason::CHANGED {
                    let path = blocks[*i].workspace_path.clone();
                    blocks[*i].set(
                        BlockStatus::Rejected,
                        reason::KEPT,
                        format!("kept: {path:?} was changed while this ingest was deciding to replace it; the change wins"),
                    );
                }
            }
        }
        let results = results
            .into_iter()
            .filter(|(i, _)| blocks[*i].reason != reason::KEPT)
            .collect();
        record(blocks, outcomes, results);
    }

    /// For each of `paths`, the digests stored ingest manifests record as written there.
    async fn ingested(
        &self,
        project: &str,
        paths: &HashSet<&str>,
    ) -> Result<HashMap<String, HashSet<String>>, StoreError> {
        let manifests: Vec<String> = self
            .store
            .list_files(project, RUNS)
            .await?
            .into_iter()
            .filter(|p| is_manifest(p))
            .collect();
        let reads = futures::stream::iter(manifests)
            .map(|path| async move {
                let read = self.store.get(project, &path, MAX_MANIFEST_BYTES).await;
                (path, read)
            })
            .buffer_unordered(self.write_concurrency.max(1));
        futures::pin_mut!(reads);
        let mut written: HashMap<String, HashSet<String>> = HashMap::new();
        while let Some((path, read)) = reads.next().await {
            let bytes = match read {
                Ok((_, _, bytes)) => bytes,
                // Gone meanwhile: it records nothing any more.
                Err(StoreError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            let Ok(manifest) = serde_json::from_slice::<Manifest>(&bytes) else {
                tracing::warn!(%project, manifest = %path, "an ingest manifest does not parse; its files count as not written by ingest");
                continue;
            };
            for a in manifest.artifacts {
                if a.status == BlockStatus::Written && paths.contains(a.workspace_path.as_str()) {
                    written
                        .entry(a.workspace_path)
                        .or_default()
                        .insert(a.sha256);
                }
            }
        }
        Ok(written)
    }

    /// Puts `todo` through the store (in document order when one block's file is another's
    /// directory), stopping once the store is found away or the caller fenced off.
    async fn put_all(
        &self,
        req: &Request,
        todo: Vec<Write>,
        trouble: &Trouble,
    ) -> Vec<(usize, Result<WriteOutcome, StoreError>)> {
        // A file that is also another block's directory ("a" and "a/b"): write in document
        // order so the outcome does not depend on timing.
        let paths: HashSet<&str> = todo.iter().map(|t| t.path.as_str()).collect();
        let nested = todo.iter().any(|t| {
            t.path
                .match_indices('/')
                .any(|(at, _)| paths.contains(&t.path[..at]))
        });
        let concurrency = if nested {
            1
        } else {
            self.write_concurrency.max(1)
        };
        futures::stream::iter(todo)
            .map(|w| async move {
                if let Some(down) = trouble.stopped() {
                    return (
                        w.index,
                        Err(StoreError::Unavailable(format!("not attempted: {down}"))),
                    );
                }
                let header = PutHeader {
                    project_id: req.project_id.clone(),
                    path: w.path,
                    overwrite: req.overwrite == Overwrite::Always,
                    if_sha256: w.if_sha256.unwrap_or_default(),
                    expected_sha256: w.sha256,
                    expected_size: Some(w.content.len() as u64),
                    allowed_prefixes: vec![WORKSPACE.to_owned()],
                    run_id: req.run_id.clone(),
                    create_project: true,
                    claim: req.claim.clone(),
                    ..PutHeader::default()
                };
                let result = self.store.put(header, w.content).await;
                if let Err(e) = &result {
                    trouble.saw(e);
                }
                (
                    w.index,
                    result.map(|r| {
                        WriteOutcome::try_from(r.outcome).unwrap_or(WriteOutcome::Unspecified)
                    }),
                )
            })
            .buffer_unordered(concurrency)
            .collect()
            .await
    }

    /// Severity, notes and the log line of a finished ingest or dry run.
    fn finish(
        &self,
        req: &Request,
        manifest: Manifest,
        blocks: Vec<Block>,
        manifest_path: String,
        mut trouble: Trouble,
    ) -> Outcome {
        let mut severity = Severity::of(&blocks);
        if trouble.failure.is_some() || !trouble.store_up() {
            severity = Severity::Error;
        }
        if blocks.is_empty() && trouble.failure.is_none() {
            trouble.note(
                "nothing to ingest: the document has no block of the form ```<lang> file=<path>"
                    .to_owned(),
            );
        }
        for b in blocks
            .iter()
            .filter(|b| b.status != BlockStatus::Written && b.reason != reason::SUPERSEDED)
        {
            let path = if b.workspace_path.is_empty() {
                &b.declared_file
            } else {
                &b.workspace_path
            };
            trouble.note(format!(
                "block {} {:?}: {} ({}): {}",
                b.index,
                path,
                b.status.as_str(),
                b.reason,
                b.detail
            ));
        }
        let s = manifest.summary;
        let (project, run, node) = (&req.project_id, &req.run_id, &req.node_id);
        match severity {
            Severity::Error => tracing::error!(
                %project, %run, %node, written = s.written, skipped = s.skipped, rejected = s.rejected,
                failure = ?trouble.failure.as_ref().map(|f| &f.1), "ingest finished with errors"
            ),
            Severity::Warning => tracing::warn!(
                %project, %run, %node, written = s.written, skipped = s.skipped, rejected = s.rejected,
                "ingest finished with warnings"
            ),
            Severity::Info => tracing::info!(
                %project, %run, %node, written = s.written, skipped = s.skipped, rejected = s.rejected, "ingest finished"
            ),
        }
        Outcome {
            enabled: true,
            manifest: Some(manifest),
            blocks,
            manifest_path,
            severity,
            notes: trouble.into_notes(),
        }
    }

    /// The effective flag (run over project over default). Store failures are errors here.
    pub async fn enabled(&self, project_id: &str, run_id: Option<&str>) -> Result<bool> {
        flag::effective(&self.store, project_id, run_id, self.default_enabled)
            .await
            .map_err(store_error)
    }

    /// Sets the flag of a project (`run_id` None) or one run; returns the effective flag.
    pub async fn set_enabled(
        &self,
        project_id: &str,
        run_id: Option<&str>,
        enabled: bool,
    ) -> Result<bool> {
        flag::set(&self.store, project_id, run_id, enabled)
            .await
            .map_err(store_error)?;
        self.enabled(project_id, run_id).await
    }
}

/// Where the run records (and their ingest manifests) are.
const RUNS: &str = ".cairn/runs";

/// Largest manifest read for provenance (1,000 blocks of long paths fit easily).
const MAX_MANIFEST_BYTES: u64 = 8 << 20;

/// `.cairn/runs/<run>/ingest/<node>.json` or `.../ingest/history/<node>.<digest>.json`.
fn is_manifest(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    let json = path.ends_with(".json");
    match parts.as_slice() {
        [".cairn", "runs", _, "ingest", _] => json,
        [".cairn", "runs", _, "ingest", "history", _] => json,
        _ => false,
    }
}

/// One block's Put.
struct Write {
    index: usize,
    path: String,
    content: Bytes,
    sha256: String,
    /// Replace only the file holding these bytes.
    if_sha256: Option<String>,
}

impl Write {
    fn of(index: usize, b: &Block, doc: &Bytes, if_sha256: Option<String>) -> Write {
        Write {
            index,
            path: b.workspace_path.clone(),
            content: doc.slice(b.content.clone()),
            sha256: b.sha256.clone(),
            if_sha256,
        }
    }
}

/// Records the store's answers: an outcome word, or the block rejected with the store's reason.
fn record(
    blocks: &mut [Block],
    outcomes: &mut [Option<&'static str>],
    results: Vec<(usize, Result<WriteOutcome, StoreError>)>,
) {
    for (i, result) in results {
        let Some(b) = blocks.get_mut(i) else { continue };
        match result {
            Ok(outcome) => {
                outcomes[i] = Some(match outcome {
                    WriteOutcome::Unchanged => "unchanged",
                    WriteOutcome::Overwritten => "overwritten",
                    _ => "created",
                });
            }
            Err(e) => {
                let r = e.reason().to_owned();
                b.set(BlockStatus::Rejected, &r, e.to_string());
            }
        }
    }
}

fn store_error(e: StoreError) -> Error {
    match e {
        StoreError::Unavailable(m) => Error::StoreUnavailable(m),
        StoreError::Refused {
            reason,
            code,
            message,
        } => Error::Store {
            reason: Some(reason),
            code,
            message,
        },
        other => Error::Store {
            reason: None,
            code: other.code(),
            message: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(matches!(
            check_id("run", "run_id", String::new()),
            Err(Error::Missing("run_id"))
        ));
        assert!(check_id("run", "run_id", "r-1_a.b".into()).is_ok());
        for bad in ["..", ".", "a/b", "a b", &"x".repeat(129)] {
            assert!(
                matches!(
                    check_id("run", "run_id", bad.to_owned()),
                    Err(Error::InvalidId { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn request_defaults() {
        let r = Request::from_proto(IngestRequest {
            project_id: "p".into(),
            run_id: "r".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.node_id, DEFAULT_NODE_ID);
        assert_eq!(r.source.kind, "graph_runtime");
        assert_eq!(r.source.mode, "unknown");
        assert!(Request::from_proto(IngestRequest {
            run_id: "r".into(),
            ..Default::default()
        })
        .is_err());
    }
}
