//! The human actions on a run: cancel, resume, gate decisions, rework, notes and context edits.
//! Each is recorded as an event carrying who did it; a run with no driver here is brought back
//! to life when the action needs one, and its records are written only under a claim on it.

use std::sync::Arc;

use cairn_proto::v1 as pb;
use tokio::sync::oneshot;

use bytes::Bytes;
use cairn_store_client::PutOptions;

use super::{key, Runs};
use crate::error::{Error, Result};
use crate::gates::Decision;
use crate::human::{self, Manifest};
use crate::run::TaskState;
use crate::rundir::RunDir;
use crate::scheduler::Command;
use crate::task_edits;
use cairn_node::events::{self as ev, Ev};

impl Runs {
    pub async fn cancel(
        &self,
        project: &str,
        run_id: &str,
        by: &str,
        reason: &str,
    ) -> Result<pb::RunInfo> {
        if let Some(c) = self.live_cmd(project, run_id) {
            let (tx, rx) = oneshot::channel();
            let cmd = Command::Cancel {
                by: by.to_owned(),
                reason: reason.to_owned(),
                reply: tx,
            };
            if c.send(cmd).await.is_ok() {
                if let Ok(r) = rx.await {
                    return r;
                }
            }
        }
        let (graph, mut state) = self.load(project, run_id).await?;
        if state.state.is_final() {
            return Err(Error::FailedPrecondition(format!(
                "run {run_id} is already {}",
                state.state.as_str()
            )));
        }
        // Not live (no driver): record the cancellation directly, after any edit a human
        // made to task.yaml meanwhile (the snapshot below rewrites it).
        let mut events = Vec::new();
        let task_yaml = RunDir::new(run_id).task_yaml();
        if let Ok(Some(text)) = self
            .b
            .store
            .get_at_most(project, &task_yaml, 16 << 20)
            .await
        {
            let text = String::from_utf8_lossy(&text);
            if crate::task_edits::changes(&text, &state).is_ok_and(|c| !c.is_empty()) {
                events.push(crate::task_edits::event(&text, &state));
            }
        }
        events.push(
            Ev::run(ev::TASK_CANCELED)
                .with("by", if by.is_empty() { "human" } else { by })
                .with("reason", reason),
        );
        // The event and the snapshot are written under a claim of the run, like any driver's.
        let snapshot = async {
            let claiming = self.claim_lock(project, run_id);
            let _claimed = claiming.lock().await;
            let (epoch, _) = self
                .b
                .store
                .claim_run(project, run_id)
                .await
                .map_err(Error::store(format!("claiming run {run_id}")))?;
            let written = async {
                let r = self
                    .b
                    .store
                    .append_events_fenced(
                        project,
                        run_id,
                        events.iter().map(Ev::to_input).collect(),
                        epoch,
                    )
                    .await
                    .map_err(Error::store("recording task.canceled"))?;
                let ts = ev::now();
                for e in &events {
                    state.apply(&crate::run::EventView::live(e, &ts));
                }
                state.last_seq = r.last_seq;
                self.write_snapshot(&state, &graph, r.last_seq).await
            }
            .await;
            self.b.store.forget_claim(project, run_id, epoch);
            written
        };
        snapshot.await?;
        Ok(state.to_info(RunDir::new(run_id).root()))
    }

    pub async fn resume(
        &self,
        project: &str,
        run_id: &str,
        by: &str,
        reason: &str,
    ) -> Result<pb::RunInfo> {
        let ended = |state: &str| {
            Error::FailedPrecondition(format!(
                "run {run_id} is {state}; request a rework of a node to run parts of it again",
            ))
        };
        if self.live_cmd(project, run_id).is_some() {
            // A driver still finishing a run it just ended (a cancel) must not make resume
            // look as if it worked.
            let info = self.get(project, run_id).await?;
            return match pb::TaskState::try_from(info.state) {
                Ok(pb::TaskState::Completed) => Err(ended("completed")),
                Ok(pb::TaskState::Canceled) => Err(ended("canceled")),
                _ => Ok(info),
            };
        }
        let (_, state) = self.load(project, run_id).await?;
        match state.state {
            TaskState::Completed | TaskState::Canceled => Err(ended(state.state.as_str())),
            _ => {
                self.ensure_live(
                    project,
                    run_id,
                    by,
                    if reason.is_empty() {
                        "resume requested"
                    } else {
                        reason
                    },
                    None,
                )
                .await?;
                self.get(project, run_id).await
            }
        }
    }

    fn note_lock(&self, project: &str, run_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.note_locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(key(project, run_id)).or_default().clone()
    }

    async fn append_note(
        &self,
        project: &str,
        run_id: &str,
        by: &str,
        heading: &str,
        text: &str,
        at: &str,
    ) -> Result<String> {
        let lock = self.note_lock(project, run_id);
        let _g = lock.lock().await;
        let note = human::append_note(&self.b.store, project, run_id, by, heading, text, at);
        self.under_claim(project, run_id, note).await
    }

    /// Runs `write` (a write of a run's records) under this process's claim on the run: the
    /// live driver's, or one taken for this write when no driver here holds one (a person's
    /// note to a run nobody drives).
    async fn under_claim<T>(
        &self,
        project: &str,
        run_id: &str,
        write: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        // Held to the end: no driver here claims the run while this write is under way.
        let claiming = self.claim_lock(project, run_id);
        let _claimed = claiming.lock().await;
        if self.b.store.run_fence(project, run_id).is_some() {
            return write.await;
        }
        let (epoch, _) = self
            .b
            .store
            .claim_run(project, run_id)
            .await
            .map_err(Error::store(format!("claiming run {run_id}")))?;
        let written = write.await;
        self.b.store.forget_claim(project, run_id, epoch);
        written
    }

    pub async fn decide(
        &self,
        project: &str,
        run_id: &str,
        gate: &str,
        d: Decision,
        by: &str,
        note: &str,
    ) -> Result<pb::RunInfo> {
        self.decide_as(project, run_id, gate, d, by, note, None)
            .await
    }

    /// `decide`, for a replay taking a recorded decision too.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn decide_as(
        &self,
        project: &str,
        run_id: &str,
        gate: &str,
        d: Decision,
        by: &str,
        note: &str,
        recorded: Option<crate::gates::Recorded>,
    ) -> Result<pb::RunInfo> {
        // Check before writing the note, so a refused decision leaves nothing behind.
        let info = self.get(project, run_id).await?;
        if let Some(st) = pb::TaskState::try_from(info.state)
            .ok()
            .and_then(TaskState::from_proto)
            .filter(|s| s.is_final())
        {
            return Err(Error::FailedPrecondition(format!(
                "run {run_id} is {}; its gates can no longer be decided",
                st.as_str()
            )));
        }
        let blocked = info
            .gates
            .iter()
            .any(|g| g.id == gate && g.state == pb::GateState::Blocked as i32);
        if !blocked {
            let (_, state) = self.load(project, run_id).await?;
            crate::gates::check_decidable(&state, gate)?;
        }
        if recorded.is_none() {
            self.check_cited(project, run_id, note).await?;
        }
        // When the decision is made: its note's heading and its `decided_at` say the same
        // time, and a replay taking it says the recorded one, so the notes later agents read
        // are the same bytes.
        let at = recorded
            .as_ref()
            .map_or_else(ev::now, |r| r.decided_at.clone());
        let note_ref = if note.trim().is_empty() {
            None
        } else {
            Some(
                self.append_note(
                    project,
                    run_id,
                    by,
                    &format!("{} of gate `{gate}`", d.word()),
                    note,
                    &at,
                )
                .await?,
            )
        };
        let (tx, rx) = oneshot::channel();
        let cmd = Command::Decide {
            gate: gate.to_owned(),
            decision: d,
            by: by.to_owned(),
            note: note.to_owned(),
            note_ref,
            at,
            recorded,
            reply: tx,
        };
        self.ensure_live(project, run_id, by, "gate decision", Some(cmd))
            .await?;
        rx.await
            .map_err(|_| Error::Unavailable("the run stopped before deciding; retry".into()))?
    }

    /// Every `evidence:<id>` a decision's note cites must be in the run's evidence index.
    async fn check_cited(&self, project: &str, run_id: &str, note: &str) -> Result<()> {
        let cited = cairn_node::evidence::cited(note);
        if cited.is_empty() {
            return Ok(());
        }
        let path = crate::rundir::RunDir::new(run_id).path(crate::rundir::EVIDENCE_INDEX);
        let held = self
            .b
            .store
            .get_at_most(project, &path, EVIDENCE_INDEX_MAX)
            .await
            .map_err(Error::store(format!(
                "reading the evidence index of run {run_id}"
            )))?
            .and_then(|b| cairn_node::evidence::parse(&String::from_utf8_lossy(&b)))
            .unwrap_or_default();
        let ids: Vec<String> = cited
            .into_iter()
            .filter(|c| !held.iter().any(|e| &e.id == c))
            .collect();
        if ids.is_empty() {
            Ok(())
        } else {
            Err(Error::UnknownEvidence {
                run_id: run_id.to_owned(),
                ids,
            })
        }
    }

    pub async fn rework(
        &self,
        project: &str,
        run_id: &str,
        node: &str,
        by: &str,
        note: &str,
        from_snapshot: bool,
    ) -> Result<pb::RunInfo> {
        let info = self.get(project, run_id).await?;
        if !info.nodes.iter().any(|n| n.id == node) {
            return Err(Error::NodeNotFound {
                project: project.to_owned(),
                run_id: run_id.to_owned(),
                node: node.to_owned(),
                what: "node",
                hint: "; `cairn runs show RUN` lists its nodes",
            });
        }
        if info.state == pb::TaskState::Canceled as i32 {
            return Err(Error::FailedPrecondition(format!(
                "run {run_id} is canceled; submit it again instead"
            )));
        }
        let note_ref = if note.trim().is_empty() {
            None
        } else {
            Some(
                self.append_note(
                    project,
                    run_id,
                    by,
                    &format!("rework of node `{node}`"),
                    note,
                    &ev::now(),
                )
                .await?,
            )
        };
        let (tx, rx) = oneshot::channel();
        let cmd = Command::Rework {
            node: node.to_owned(),
            by: by.to_owned(),
            note: note.to_owned(),
            note_ref,
            from_snapshot,
            reply: tx,
        };
        self.ensure_live(project, run_id, by, "rework requested", Some(cmd))
            .await?;
        rx.await
            .map_err(|_| Error::Unavailable("the run stopped before the rework; retry".into()))?
    }

    /// Records a human event: through the live run's recorder, or straight to the store.
    async fn record(&self, project: &str, run_id: &str, e: Ev) -> Result<u64> {
        if let Some(c) = self.live_cmd(project, run_id) {
            let (tx, rx) = oneshot::channel();
            if c.send(Command::Record {
                event: e.clone(),
                reply: tx,
            })
            .await
            .is_ok()
            {
                if let Ok(r) = rx.await {
                    return r;
                }
            }
        }
        let r = self
            .b
            .store
            .append_events(project, run_id, vec![e.to_input()])
            .await
            .map_err(Error::store("recording the event"))?;
        Ok(r.first_seq)
    }

    pub async fn add_note(
        &self,
        project: &str,
        run_id: &str,
        by: &str,
        text: &str,
    ) -> Result<(u64, String)> {
        if text.trim().is_empty() {
            return Err(Error::field("text", "the note is empty"));
        }
        self.get(project, run_id).await?;
        let by = if by.is_empty() { "human" } else { by };
        let note_ref = self
            .append_note(project, run_id, by, "note", text, &ev::now())
            .await?;
        let e = Ev::run(ev::HUMAN_NOTE)
            .with("by", by)
            .with("ref", note_ref.clone())
            .with("bytes", text.len());
        let seq = self.record_and_show(project, run_id, e).await?;
        Ok((seq, note_ref))
    }

    /// Changes a run's title, goal or milestone notes (`EditTask`), running or finished.
    pub async fn edit_task(
        &self,
        project: &str,
        run_id: &str,
        by: &str,
        edit: &task_edits::Edit,
    ) -> Result<pb::RunInfo> {
        let (_, state) = self.load(project, run_id).await?;
        let by = if by.is_empty() { "human" } else { by };
        let event = task_edits::edit_event(edit, &state, by).map_err(Error::InvalidArgument)?;
        if let Some(e) = event {
            self.record_and_show(project, run_id, e).await?;
        }
        self.get(project, run_id).await
    }

    /// Records a human event; on a run no driver here holds (a finished one, say) also writes
    /// its task.yaml, state.json and README.md again, so every view shows the event.
    async fn record_and_show(&self, project: &str, run_id: &str, e: Ev) -> Result<u64> {
        if self.live_cmd(project, run_id).is_some() {
            return self.record(project, run_id, e).await;
        }
        let write = async {
            let seq = self.record(project, run_id, e).await?;
            let (_, graph, state) = self.read_records(project, run_id).await?;
            self.write_snapshot(&state, &graph, state.last_seq.max(seq))
                .await?;
            Ok(seq)
        };
        self.under_claim(project, run_id, write).await
    }

    pub async fn edit_context(
        &self,
        project: &str,
        run_id: &str,
        by: &str,
        yaml: &str,
    ) -> Result<u64> {
        let manifest = Manifest::parse(yaml)
            .map_err(|e| Error::field("manifest_yaml", format!("context manifest: {e}")))?;
        self.get(project, run_id).await?;
        let path = RunDir::new(run_id).context_manifest();
        let opts = PutOptions {
            overwrite: true,
            run_id: run_id.to_owned(),
            ..Default::default()
        };
        let put = async {
            self.b
                .store
                .put(project, &path, Bytes::from(yaml.to_owned()), &opts)
                .await
                .map_err(Error::store(format!("writing {path}")))
        };
        self.under_claim(project, run_id, put).await?;
        let by = if by.is_empty() { "human" } else { by };
        let e = Ev::run(ev::CONTEXT_EDITED)
            .with("by", by)
            .with("path", "shared/context-manifest.yaml")
            .with("attachments", manifest.attachments.len());
        self.record(project, run_id, e).await
    }
}

/// Largest evidence index read back to check a note's citations.
const EVIDENCE_INDEX_MAX: u64 = 64 << 20;
