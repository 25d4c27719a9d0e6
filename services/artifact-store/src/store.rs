//! The store: what the gRPC face calls. It composes the modules beneath it, each of which
//! knows nothing of it: the shared [`State`] (config, data root layout, digests, slots), the
//! run logs of `events` and the document locks of `document`; every operation hands each
//! module only the parts it works on.
//!
//! Layers, each using only those below it (a test in `lib.rs` checks the imports):
//! error → claim → leaves (config, page, stamp, digest, slots, publication, direct, deferred, access)
//! → layout → temp → state → files, read, run_index → project → events, retention → write,
//! archive, backup → document → store, sweep → service.
//!
//! May depend on: every operation module; nothing but `service` and the crate root use it.

use std::sync::Arc;

use bytes::Bytes;
use futures::Stream;
use tokio::sync::mpsc;

use crate::archive::{self, Archived, Unarchived};
use crate::backup::{self, Restored};
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
use crate::retention;
use crate::run_index::{self, Checked, Filter, RunIndex, Summary};
use crate::snapshots;
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
        let state = State::open(config)?;
        crate::files::restore_journaled(&state)?;
        Ok(Store {
            state: Arc::new(state),
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

    /// ListRunSummaries `count_only`: how many of a project's runs match, from the run index.
    pub async fn count_run_summaries(&self, project: &str, filter: Filter) -> Result<u64> {
        let (state, index, project) = (self.state.clone(), self.index.clone(), project.to_owned());
        blocking(move || index.count(&state, &project, &filter)).await
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
        self.refuse_archived(&project, &self.normal(&spec.path))
            .await?;
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
        match read::get(&self.state, project, path, offset, length).await {
            Err(Error::NotFound { .. }) if archive::run_file(&self.normal(path)).is_some() => {
                let entry = self.archived_file(project, path, true).await?;
                archive::check_range(offset, entry.size_bytes)?;
                let (state, project, path) =
                    (self.state.clone(), project.to_owned(), self.normal(path));
                let chunk = self.config().chunk_bytes;
                let (tx, rx) = mpsc::channel(4);
                tokio::task::spawn_blocking(move || {
                    let range = (offset, length);
                    if let Err(e) = archive::send_range(&state, &project, &path, range, chunk, &tx)
                    {
                        let _ = tx.blocking_send(Err(e));
                    }
                });
                Ok((entry, rx))
            }
            other => other,
        }
    }

    pub async fn stat(&self, project: &str, path: &str, include_sha256: bool) -> Result<Entry> {
        match read::stat(&self.state, project, path, include_sha256).await {
            Err(Error::NotFound { .. }) if archive::run_file(&self.normal(path)).is_some() => {
                self.archived_file(project, path, include_sha256).await
            }
            other => other,
        }
    }

    /// A file of an archived run described (NotFound when there is none).
    async fn archived_file(
        &self,
        project: &str,
        path: &str,
        include_sha256: bool,
    ) -> Result<Entry> {
        let (state, project, path) = (self.state.clone(), project.to_owned(), self.normal(path));
        blocking(move || {
            archive::describe(&state, &project, &path, include_sha256)?
                .ok_or(Error::NotFound { project, path })
        })
        .await
    }

    /// Refuses a write into an archived run's directory.
    async fn refuse_archived(&self, project: &str, path: &str) -> Result<()> {
        let Some((run, _)) = archive::run_file(path) else {
            return Ok(());
        };
        let (state, project, run) = (self.state.clone(), project.to_owned(), run.to_owned());
        blocking(move || match archive::is_archived(&state, &project, &run) {
            Ok(true) => Err(Error::Archived { run }),
            // A missing project or run is the write's own business.
            _ => Ok(()),
        })
        .await
    }

    /// ArchiveRun: packs a finished run; no event of it is committed meanwhile.
    pub async fn archive_run(&self, project: &str, run: &str) -> Result<Archived> {
        check_id("project", project)?;
        check_id("run", run)?;
        let (state, p, r) = (self.state.clone(), project.to_owned(), run.to_owned());
        let archived = self
            .runs
            .quiesced(project, run, move || archive::pack(&state, &p, &r))
            .await?;
        self.touched(project, &format!(".cairn/runs/{run}/"), true)
            .await;
        Ok(archived)
    }

    /// UnarchiveRun: puts an archived run's files back; no event of it is committed meanwhile.
    pub async fn unarchive_run(&self, project: &str, run: &str) -> Result<Unarchived> {
        check_id("project", project)?;
        check_id("run", run)?;
        let (state, p, r) = (self.state.clone(), project.to_owned(), run.to_owned());
        let unarchived = self
            .runs
            .quiesced(project, run, move || archive::unpack(&state, &p, &r))
            .await?;
        self.touched(project, &format!(".cairn/runs/{run}/"), true)
            .await;
        Ok(unarchived)
    }

    /// Backup: the backup file's bytes, streamed, of `project` ("" = every project).
    pub async fn backup(&self, project: &str) -> Result<mpsc::Receiver<Result<Bytes>>> {
        let (state, project) = (self.state.clone(), project.to_owned());
        let projects = blocking(move || {
            if project.is_empty() {
                return Ok(backup::existing_projects(&state));
            }
            state.layout.project_root(&project)?;
            Ok(vec![project])
        })
        .await?;
        let (tx, rx) = mpsc::channel(8);
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || {
            let out = ChannelWriter {
                tx: tx.clone(),
                buf: Vec::with_capacity(CHUNK),
            };
            if let Err(e) = backup::write(&state, &projects, out) {
                tracing::warn!(error = %e, "backup not finished");
                let _ = tx.blocking_send(Err(e));
            }
        });
        Ok(rx)
    }

    /// Restore: writes the backup's bytes aside, then restores `only` ("" = every project).
    pub async fn restore<S>(&self, only: &str, mut chunks: S) -> Result<Restored>
    where
        S: Stream<Item = Result<Bytes>> + Unpin + Send,
    {
        use futures::StreamExt;
        use tokio::io::AsyncWriteExt;
        let root = &self.state.config.data_root;
        let path = root.join(format!(
            "{}restore-{}.tar.gz",
            crate::layout::TEMP_PREFIX,
            uuid::Uuid::new_v4()
        ));
        let received = async {
            let mut file = tokio::fs::File::create(&path)
                .await
                .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
            while let Some(chunk) = chunks.next().await {
                file.write_all(&chunk?)
                    .await
                    .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
            }
            file.flush()
                .await
                .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
            std::fs::File::open(&path)
                .map_err(|e| Error::io(format!("opening {}", path.display()), e))
        }
        .await;
        let restored = match received {
            Ok(file) => {
                let (state, only) = (self.state.clone(), only.to_owned());
                blocking(move || backup::restore(&state, file, &only)).await
            }
            Err(e) => Err(e),
        };
        let _ = tokio::fs::remove_file(&path).await;
        let restored = restored?;
        for project in &restored.projects {
            self.index.forget(project);
        }
        Ok(restored)
    }

    /// One retention sweep over every project (blocking work off the async threads).
    pub async fn sweep_retention(&self) {
        let retention = &self.state.config.retention;
        let state = self.state.clone();
        let projects = blocking(move || Ok(backup::existing_projects(&state)))
            .await
            .unwrap_or_default();
        for project in projects {
            self.sweep_snapshots(&project).await;
            let rule = retention.rule(&project);
            if !rule.active() {
                continue;
            }
            let (state, p) = (self.state.clone(), project.clone());
            let due = match blocking(move || retention::due(&state, &p, &rule)).await {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!(%project, error = %e, "retention sweep skipped the project");
                    continue;
                }
            };
            for run in due.archive {
                match self.archive_run(&project, &run).await {
                    Ok(a) => {
                        tracing::info!(%project, %run, size_bytes = a.size_bytes, "retention archived a run")
                    }
                    Err(e) => {
                        tracing::warn!(%project, %run, error = %e, "retention could not archive a run")
                    }
                }
            }
            for run in due.delete {
                let (state, p, r) = (self.state.clone(), project.clone(), run.clone());
                let removed = self
                    .runs
                    .quiesced(&project, &run, move || archive::remove(&state, &p, &r))
                    .await;
                match removed {
                    Ok(()) => tracing::info!(%project, %run, "retention deleted an archived run"),
                    Err(e) => {
                        tracing::warn!(%project, %run, error = %e, "retention could not delete a run")
                    }
                }
                self.index.forget(&project);
            }
        }
    }

    /// Removes `project`'s CLI snapshots older than `snapshots.delete_after_days` (0: none).
    async fn sweep_snapshots(&self, project: &str) {
        let days = self.state.config.snapshots.delete_after_days;
        if days == 0 {
            return;
        }
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let (state, p) = (self.state.clone(), project.to_owned());
        let old = match blocking(move || snapshots::older_than(&state, &p, days, now)).await {
            Ok(old) => old,
            Err(e) => {
                tracing::warn!(%project, error = %e, "the snapshot sweep skipped the project");
                return;
            }
        };
        if old.is_empty() {
            return;
        }
        for path in &old {
            match write::delete(&self.state, &self.runs, project, path, "").await {
                Ok(_) => tracing::info!(%project, %path, days, "removed an old session snapshot"),
                Err(e) => {
                    tracing::warn!(%project, %path, error = %e, "could not remove an old session snapshot")
                }
            }
        }
        let (state, p) = (self.state.clone(), project.to_owned());
        if let Err(e) = blocking(move || snapshots::remove_empty_dirs(&state, &p)).await {
            tracing::warn!(%project, error = %e, "could not remove empty snapshot directories");
        }
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
        check_id("project", project)?;
        check_id("run", run)?;
        let (state, p, r) = (self.state.clone(), project.to_owned(), run.to_owned());
        let archived = blocking(move || archive::is_archived(&state, &p, &r)).await?;
        if !archived {
            return self
                .runs
                .read(&self.state, project, run, from_seq, follow, limit)
                .await;
        }
        // An archived run has all its events: a follow ends after them.
        let (state, p, r) = (self.state.clone(), project.to_owned(), run.to_owned());
        let (tx, rx) = mpsc::channel(256);
        let range = (from_seq.max(1), limit);
        tokio::task::spawn_blocking(move || {
            let failed = match archive::send_events(&state, &p, &r, range, &tx) {
                Ok(true) => return,
                // Unpacked meanwhile: its log is on disk again, read it afresh.
                Ok(false) => Error::RunNotFound {
                    project: p.clone(),
                    run: r.clone(),
                },
                Err(e) => e,
            };
            let _ = tx.blocking_send(Err(failed));
        });
        Ok(rx)
    }

    /// UpdateJson.
    pub async fn update_document(&self, request: Update) -> Result<Updated> {
        let (project, path) = (request.project_id.clone(), request.path.clone());
        let updated = document::update(&self.state, &self.runs, &self.docs, request).await?;
        self.touched(&project, &self.normal(&path), true).await;
        Ok(updated)
    }
}

/// Bytes of a Backup reply message.
const CHUNK: usize = 1 << 20;

/// Sends what is written in chunks down a channel (blocking); a closed channel (the client
/// went away) ends the writing.
struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx.blocking_send(Ok(chunk)).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
        })
    }
}

impl std::io::Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
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
