//! Reading runs: one run's info, the list of a project's runs, and following a run's events and
//! its nodes' output. A live run answers from its driver; any other from its records. Never
//! writes a record.

use std::sync::Arc;

use cairn_proto::v1 as pb;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use super::{check_id, cursor_token, key, parse_cursor, RunFilter, Runs};
use crate::error::{Error, Result};
use crate::logs::{LogQuery, Watcher};
use crate::run::{RunState, TaskState};
use crate::rundir::RunDir;
use crate::scheduler::Command;
use cairn_node::events as ev;

impl Runs {
    pub async fn get(&self, project: &str, run_id: &str) -> Result<pb::RunInfo> {
        if let Some(c) = self.live_cmd(project, run_id) {
            let (tx, rx) = oneshot::channel();
            if c.send(Command::Info(tx)).await.is_ok() {
                if let Ok(mut info) = rx.await {
                    if let Some(cluster) = self.cluster() {
                        info.replica = cluster.me().to_owned();
                    }
                    return Ok(info);
                }
            }
        }
        let (_, state) = self.load(project, run_id).await?;
        Ok(state.to_info(RunDir::new(run_id).root()))
    }

    /// Runs of a project, newest first (created_at, then run id, both descending). Runs live
    /// here are described from memory; the others come from the store's run index, a page at
    /// a time. The page token is the place of the last run sent (never an offset), so a page
    /// costs the same however many runs come before it.
    pub async fn list(
        &self,
        project: &str,
        filter: &RunFilter,
        page_size: u32,
        token: &str,
    ) -> Result<(Vec<pb::RunInfo>, String)> {
        check_id("project_id", project)?;
        let size = match page_size {
            0 => 1000,
            n => n.min(10_000),
        } as usize;
        let after = parse_cursor(token)?;
        let before_cursor = |key: &(String, String)| after.as_ref().is_none_or(|a| key < a);
        let live_ids: Vec<String> = {
            let live = self
                .live
                .lock()
                .map_err(|_| Error::Internal("the run table is poisoned".into()))?;
            let prefix = key(project, "");
            live.keys()
                .filter_map(|k| k.strip_prefix(&prefix))
                .map(str::to_owned)
                .collect()
        };
        // (sort key, info): the key is the one the store's order and the cursor use.
        let mut runs: Vec<((String, String), pb::RunInfo)> = Vec::new();
        for run_id in &live_ids {
            if let Ok(info) = self.get(project, run_id).await {
                let k = (info.created_at.clone(), info.run_id.clone());
                if filter.admits(&info) && before_cursor(&k) {
                    runs.push((k, info));
                }
            }
        }
        let format = |t: &Option<time::OffsetDateTime>| {
            t.and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_default()
        };
        let page = self
            .b
            .store
            .list_run_summaries(pb::ListRunSummariesRequest {
                project_id: project.to_owned(),
                states: filter
                    .states
                    .iter()
                    .map(|s| s.as_str().to_owned())
                    .collect(),
                text: filter.text.clone(),
                created_after: format(&filter.created_after),
                created_before: format(&filter.created_before),
                page: Some(pb::PageRequest {
                    page_size: size as u32,
                    page_token: String::new(),
                }),
                exclude_run_ids: live_ids,
                include_state_json: true,
                after: after
                    .clone()
                    .map(|(created_at, run_id)| pb::RunCursor { created_at, run_id }),
                // A stalled run is not final.
                unfinished: filter.stalled,
                count_only: false,
            })
            .await
            .map_err(Error::store("listing runs"))?;
        let dir_of = |run_id: &str| RunDir::new(run_id).root().to_owned();
        for summary in page.runs {
            let k = (summary.created_at.clone(), summary.run_id.clone());
            let parsed = summary
                .indexed
                .then(|| serde_json::from_slice::<RunState>(&summary.state_json).ok())
                .flatten();
            let info = match parsed {
                Some(mut s) => {
                    s.reindex();
                    let info = s.to_info(&dir_of(&summary.run_id));
                    // The store's index filters the rest.
                    if filter.stalled && info.stalled_since.is_empty() {
                        continue;
                    }
                    info
                }
                // No state.json (or one that does not parse): from the run's other records.
                None => match self.get(project, &summary.run_id).await {
                    Ok(info) if filter.admits(&info) => info,
                    _ => continue,
                },
            };
            runs.push((k, info));
        }
        runs.sort_by(|a, b| b.0.cmp(&a.0));
        let more = !page.next_page_token.is_empty() || runs.len() > size;
        runs.truncate(size);
        let next = match runs.last() {
            Some((k, _)) if more => cursor_token(k),
            _ => String::new(),
        };
        Ok((runs.into_iter().map(|(_, info)| info).collect(), next))
    }

    /// Events of a run from `from_seq`, live until the run ends (or forever).
    pub async fn watch(
        &self,
        project: &str,
        run_id: &str,
        from_seq: u64,
        follow_after_end: bool,
    ) -> Result<mpsc::Receiver<std::result::Result<pb::Event, tonic::Status>>> {
        self.get(project, run_id).await?;
        // Whether the run has ended and where its log ends, from one read of the log: an end
        // at or before `history_end` is history (a run resumed or reworked after it) and the
        // stream goes on past it. An ended run's stream ends with the log; a live run's at its
        // next end.
        let (_, state) = self.load(project, run_id).await?;
        let final_now = state.state.is_final();
        let history_end = state.last_seq;
        let follow = follow_after_end || !final_now;
        let mut stream = self
            .b
            .store
            .follow_events(project, run_id, from_seq.max(1), follow)
            .await
            .map_err(Error::store("reading events"))?;
        let (tx, rx) = mpsc::channel(256);
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut last = from_seq.saturating_sub(1);
            loop {
                let next = tokio::select! {
                    _ = tx.closed() => return,
                    // A server shutting down ends the stream (graceful shutdown waits for it).
                    _ = shutdown.cancelled() => {
                        let why = format!("the orchestrator is shutting down; watch again from seq {}", last + 1);
                        let _ = tx.send(Err(cairn_proto::reason::status(tonic::Code::Unavailable, why, "shutting_down"))).await;
                        return;
                    }
                    n = stream.next() => n,
                };
                if let Some(Ok(e)) = &next {
                    last = e.seq;
                }
                match next {
                    Some(Ok(e)) => {
                        let end =
                            ev::is_final(&e.r#type) && !follow_after_end && e.seq > history_end;
                        if tx.send(Ok(e)).await.is_err() || end {
                            return;
                        }
                    }
                    Some(Err(s)) => {
                        let _ = tx.send(Err(s)).await;
                        return;
                    }
                    None => return,
                }
            }
        });
        Ok(rx)
    }

    /// The run's node output (WatchLogs): what is kept now, then, with `follow`, live until the
    /// run is final and every attempt seen has ended.
    pub async fn watch_logs(
        self: Arc<Self>,
        q: LogQuery,
    ) -> Result<mpsc::Receiver<std::result::Result<pb::LogChunk, tonic::Status>>> {
        check_id("project_id", &q.project)?;
        check_id("run_id", &q.run_id)?;
        if let Some(n) = &q.node {
            check_id("node_id", n)?;
        }
        self.get(&q.project, &q.run_id).await?;
        let (tx, rx) = mpsc::channel(256);
        let watcher = Watcher::new(self.b.logs.clone(), self.b.store.clone(), q, tx);
        tokio::spawn(async move { self.follow_logs(watcher).await });
        Ok(rx)
    }

    async fn follow_logs(&self, mut w: Watcher) {
        let mut changes = w.subscribe();
        let mut first = true;
        loop {
            if w.pass(first).await.is_err() {
                break;
            }
            first = false;
            if !w.query().follow {
                break;
            }
            if w.all_ended() {
                let (project, run_id) = (w.query().project.clone(), w.query().run_id.clone());
                let done = match self.get(&project, &run_id).await {
                    Ok(info) => pb::TaskState::try_from(info.state)
                        .ok()
                        .and_then(TaskState::from_proto)
                        .is_some_and(TaskState::is_final),
                    Err(_) => true,
                };
                if done {
                    // Anything that ended and was forgotten since the last look.
                    let _ = w.pass(true).await;
                    break;
                }
            }
            tokio::select! {
                _ = w.sink().closed() => break,
                _ = self.shutdown.cancelled() => {
                    let why = "the orchestrator is shutting down; watch the logs again to resume";
                    let _ = w.sink().send(Err(cairn_proto::reason::status(tonic::Code::Unavailable, why, "shutting_down"))).await;
                    break;
                }
                changed = changes.changed() => {
                    if changed.is_err() {
                        // The run's entry was forgotten: attempts ended; look at the store too.
                        changes = w.subscribe();
                        first = true;
                    }
                }
                _ = tokio::time::sleep(crate::logs::final_check()) => {}
            }
        }
        drop(changes);
        w.release();
    }
}
