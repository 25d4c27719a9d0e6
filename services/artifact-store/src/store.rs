//! The store: what the gRPC face calls. It composes the modules beneath it, each of which
//! knows nothing of it: the shared [`State`] (config, data root layout, digests, slots), the
//! run logs of `events` and the document locks of `document`; every operation hands each
//! module only the parts it works on.
//!
//! Layers, each using only those below it (a test in `lib.rs` checks the imports):
//! leaves (error, config, page, stamp, digest, slots, publication, direct, deferred, access)
//! → layout → temp → state → files, read → project → events → write → document → store,
//! sweep → service.
//!
//! May depend on: every operation module; nothing but `service` and the crate root use it.

use std::sync::Arc;

use bytes::Bytes;
use futures::Stream;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::document::{self, DocLocks, Update, Updated};
use crate::error::Result;
use crate::events::{NewEvent, RunLogs, StoredEvent};
use crate::files::Written;
use crate::page::Page;
use crate::project::{self, Project};
use crate::read::{self, Entry};
use crate::state::State;
use crate::write::{self, PutSpec};

/// The artifact-store's state, shared by every request.
#[derive(Debug)]
pub struct Store {
    state: Arc<State>,
    runs: Arc<RunLogs>,
    docs: DocLocks,
}

impl Store {
    /// Opens (creating when missing) the data root. Does not sweep; see `sweep::remove_temp_files`.
    pub fn open(config: Config) -> Result<Store> {
        Ok(Store {
            state: Arc::new(State::open(config)?),
            runs: Arc::default(),
            docs: DocLocks::default(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.state.config
    }

    /// CreateProject (idempotent).
    pub async fn create_project(&self, project_id: &str) -> Result<Project> {
        project::create(&self.state, project_id).await
    }

    /// ListProjects: one page of project ids and the next page's token.
    pub async fn list_projects(&self, page: Page) -> Result<(Vec<Project>, String)> {
        project::list(&self.state, page).await
    }

    /// Put; an overwrite in a run is recorded as its event.
    pub async fn put<S>(&self, spec: PutSpec, chunks: S) -> Result<Written>
    where
        S: Stream<Item = Result<Bytes>> + Unpin + Send,
    {
        write::put(&self.state, &self.runs, spec, chunks).await
    }

    /// Delete; recorded as an event when a run is given.
    pub async fn delete(&self, project: &str, path: &str, run_id: &str) -> Result<bool> {
        write::delete(&self.state, &self.runs, project, path, run_id).await
    }

    /// Get: a file or a byte range of it, streamed.
    pub async fn get(
        &self,
        project: &str,
        path: &str,
        offset: u64,
        length: u64,
    ) -> Result<(Entry, mpsc::Receiver<Result<Bytes>>)> {
        read::get(&self.state, project, path, offset, length).await
    }

    pub async fn stat(&self, project: &str, path: &str, include_sha256: bool) -> Result<Entry> {
        read::stat(&self.state, project, path, include_sha256).await
    }

    pub async fn list(
        &self,
        project: &str,
        prefix: &str,
        recursive: bool,
        page: Page,
    ) -> Result<(Vec<Entry>, String)> {
        read::list(&self.state, project, prefix, recursive, page).await
    }

    /// AppendEvents (fenced by `epoch` unless 0, standing on `publications`).
    pub async fn append_events(
        &self,
        project: &str,
        run: &str,
        events: Vec<NewEvent>,
        epoch: u64,
        publications: &[String],
    ) -> Result<(u64, u64)> {
        self.runs
            .append_fenced(&self.state, project, run, events, epoch, publications)
            .await
    }

    /// ClaimRun: the new writer epoch and the log's last seq.
    pub async fn claim_run(&self, project: &str, run: &str, holder: &str) -> Result<(u64, u64)> {
        self.runs.claim(&self.state, project, run, holder).await
    }

    /// ReadEvents from `from_seq`, then (with `follow`) live ones.
    pub async fn read_events(
        &self,
        project: &str,
        run: &str,
        from_seq: u64,
        follow: bool,
        limit: u64,
    ) -> Result<mpsc::Receiver<Result<StoredEvent>>> {
        self.runs
            .read(&self.state, project, run, from_seq, follow, limit)
            .await
    }

    /// UpdateJson.
    pub async fn update_document(&self, request: Update) -> Result<Updated> {
        document::update(&self.state, &self.runs, &self.docs, request).await
    }
}
