//! The store: what the gRPC face calls. It composes the modules beneath it, each of which
//! knows nothing of it: the shared [`State`] (config, data root layout, digests, slots), the
//! run logs of `events` and the document locks of `document`; every operation hands each
//! module only the parts it works on.
//!
//! Layers, each using only those below it (a test in `lib.rs` checks the imports):
//! error → claim → leaves (config, page, stamp, digest, slots, publication, direct, deferred, access)
//! → layout → temp → state → files, read → project → events → write → document → store,
//! sweep → service.
//!
//! May depend on: every operation module; nothing but `service` and the crate root use it.

use std::sync::Arc;

use bytes::Bytes;
use futures::Stream;
use tokio::sync::mpsc;

use crate::claim::{self, Claim, Refused};
use crate::config::Config;
use crate::document::{self, DocLocks, Update, Updated};
use crate::error::{Error, Result};
use crate::events::{NewEvent, RunLogs, StoredEvent};
use crate::files::Written;
use crate::layout::check_id;
use crate::page::Page;
use crate::project::{self, Project};
use crate::read::{self, Entry};
use crate::run_index::{self, Checked, Filter, RunIndex, Summary};
use crate::state::{blocking, State};
use crate::write::{self, PutSpec};

/// The artifact-store's state, shared by every request.
#[derive(Debug)]
pub struct Store {
    state: Arc<State>,
    runs: Arc<RunLogs>,
    docs: DocLocks,
    index: Arc<RunIndex>,
}

/// The run a project-relative path belongs to, and whether it is the run's state.json.
fn run_of(path: &str) -> Option<(&str, bool)> {
    let rest = path.strip_prefix(".cairn/runs/")?;
    let (run, file) = rest.split_once('/').unwrap_or((rest, ""));
    (!run.is_empty()).then_some((run, file == run_index::STATE_FILE))
}

impl Store {
    /// Opens (creating when missing) the data root. Does not sweep; see `sweep::remove_temp_files`.
    pub fn open(config: Config) -> Result<Store> {
        let index = Arc::new(RunIndex::new(&config.data_root));
        Ok(Store {
            state: Arc::new(State::open(config)?),
            runs: Arc::default(),
            docs: DocLocks::default(),
            index,
        })
    }

    /// Loads (checks against the run directories, rebuilding what is missing or stale) the run
    /// index of every project; blocking. Queries of a project not loaded yet load it first.
    pub fn load_run_indexes(&self) -> Vec<(String, Result<Option<Checked>>)> {
        RunIndex::project_ids(&self.state)
            .into_iter()
            .map(|p| {
                let checked = self.index.ensure_loaded(&self.state, &p);
                (p, checked)
            })
            .collect()
    }

    /// After a write to `path` of a project: the run index looks at its run again when the
    /// write was its state.json or the run is new to it. `wait`: return once it has (else in
    /// the background, e.g. behind a deferred publication).
    async fn touched(&self, project: &str, path: &str, wait: bool) {
        let Some((run, state_json)) = run_of(path) else {
            return;
        };
        if !state_json && !self.index.unknown(project, run) {
            return;
        }
        // A query right after the write sees it; a write never waits behind a project's
        // start-up load (its run is looked at after it).
        let wait = wait && !self.index.loading(project);
        let (state, index, project, run) = (
            self.state.clone(),
            self.index.clone(),
            project.to_owned(),
            run.to_owned(),
        );
        let work = blocking(move || {
            if let Err(e) = index.refresh(&state, &project, &run) {
                // The next query loads it again from the run directories.
                tracing::warn!(%project, %run, error = %e, "run index not updated; it will be checked again");
                index.forget(&project);
            }
            Ok(())
        });
        if wait {
            let _ = work.await;
        } else {
            tokio::spawn(work);
        }
    }

    /// A client's path as the store spells it ("" when it is not one).
    fn normal(&self, path: &str) -> String {
        self.state
            .layout
            .read_path(path)
            .map(|p| p.to_string())
            .unwrap_or_default()
    }

    /// ListRunSummaries: one page of a project's runs from the run index, newest first.
    pub async fn list_run_summaries(
        &self,
        project: &str,
        filter: Filter,
        page: Page,
        include_state_json: bool,
    ) -> Result<(Vec<Summary>, String)> {
        let (state, index, project) = (self.state.clone(), self.index.clone(), project.to_owned());
        blocking(move || index.query(&state, &project, &filter, &page, include_state_json)).await
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
        let project = spec.project_id.clone();
        let written = write::put(&self.state, &self.runs, spec, chunks).await?;
        self.touched(&project, &written.path, written.publication.is_none())
            .await;
        Ok(written)
    }

    /// Delete; recorded as an event when a run is given.
    pub async fn delete(&self, project: &str, path: &str, run_id: &str) -> Result<bool> {
        let deleted = write::delete(&self.state, &self.runs, project, path, run_id).await?;
        if deleted {
            self.touched(project, &self.normal(path), true).await;
        }
        Ok(deleted)
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
        let appended = self
            .runs
            .append_fenced(&self.state, project, run, events, epoch, publications)
            .await?;
        self.touched(project, &format!(".cairn/runs/{run}/"), true)
            .await;
        Ok(appended)
    }

    /// The ingest claim `text` grants for a request on `project` (None when `text` is empty).
    pub fn verify_claim(&self, text: &str, project: &str) -> Result<Option<Claim>> {
        if text.is_empty() {
            return Ok(None);
        }
        let claim = self.state.claims.verify(text, claim::now_ms()).map_err(|why| match why {
            Refused::Invalid => Error::ClaimRefused {
                reason: "claim_invalid",
                message: "the ingest claim is not one this store issued (malformed, altered, or made with another key); nothing was written: pass on, unchanged, the claim the run's driver got from GrantIngestClaim".into(),
            },
            Refused::Expired => Error::ClaimRefused {
                reason: "claim_expired",
                message: "the ingest claim has expired; nothing was written: the run's driver asks for a new one (GrantIngestClaim) and calls ingest again".into(),
            },
        })?;
        if claim.project != project {
            return Err(other_run(&claim, project, None));
        }
        Ok(Some(claim))
    }

    /// GrantIngestClaim: a claim for the holder of `run`'s current `epoch`; returns it, its
    /// expiry (ms since the Unix epoch) and its prefixes.
    pub async fn grant_ingest_claim(
        &self,
        project: &str,
        run: &str,
        epoch: u64,
        ttl_s: u32,
        asked: &[String],
    ) -> Result<(String, u64, Vec<String>)> {
        check_id("project", project)?;
        check_id("run", run)?;
        if epoch == 0 {
            return Err(Error::BadRequest(
                "epoch 0 is no claim on the run: call ClaimRun first and send the epoch it returned".into(),
            ));
        }
        let ttl_s = match ttl_s {
            0 => claim::DEFAULT_TTL_S,
            t if t > claim::MAX_TTL_S => {
                return Err(Error::BadRequest(format!(
                    "ttl_s {t} is longer than an ingest claim may last ({} s); ask for less and a new claim when it runs out",
                    claim::MAX_TTL_S
                )))
            }
            t => t,
        };
        let prefixes = claim::ingest_prefixes(run, asked).map_err(Error::BadRequest)?;
        // Only the run's current claim holder gets one (a fenced-off driver is refused).
        let (state, runs, p, r) = (
            self.state.clone(),
            self.runs.clone(),
            project.to_owned(),
            run.to_owned(),
        );
        blocking(move || runs.enter_fence(&state, &p, &r, epoch).map(drop)).await?;
        let expires_ms = claim::now_ms().saturating_add(u64::from(ttl_s) * 1000);
        let text = self
            .state
            .claims
            .issue(project, run, epoch, prefixes.clone(), expires_ms);
        Ok((text, expires_ms, prefixes))
    }

    /// ClaimRun: the new writer epoch and the log's last seq.
    pub async fn claim_run(&self, project: &str, run: &str, holder: &str) -> Result<(u64, u64)> {
        let claimed = self.runs.claim(&self.state, project, run, holder).await?;
        self.touched(project, &format!(".cairn/runs/{run}/"), true)
            .await;
        Ok(claimed)
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
        let (project, path) = (request.project_id.clone(), request.path.clone());
        let updated = document::update(&self.state, &self.runs, &self.docs, request).await?;
        self.touched(&project, &self.normal(&path), true).await;
        Ok(updated)
    }
}

/// The refusal of a claim used for another project (or, with `run`, another run).
pub fn other_run(claim: &Claim, project: &str, run: Option<&str>) -> Error {
    let asked = match run {
        Some(run) => format!("run {run:?} of project {project:?}"),
        None => format!("project {project:?}"),
    };
    Error::ClaimRefused {
        reason: "claim_other_run",
        message: format!(
            "the ingest claim is for run {:?} of project {:?}, not for {asked}; nothing was written: ingest writes only for the run whose claim it was handed",
            claim.run, claim.project
        ),
    }
}
