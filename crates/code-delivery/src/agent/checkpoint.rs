//! Checkpoints of a task's session and failover. With `checkpoint_every_s` set, the session's
//! files (and, where the runner's backend keeps them, gvisor, its memory and processes) are
//! snapshotted between turns (at most that often) while it stays open, and streamed into
//! the store at `.cairn/runs/<run>/snapshots/<session>/<n>.snap` as the runner sends them
//! (never held whole here), their size and sha256 sent after the bytes for the store to
//! check. When a call finds the session's runner gone (or the session unknown to it), the
//! task resumes the last checkpoint on another runner and goes on from the conversation as it
//! was at that checkpoint: the turns after it are undone, since the files they changed are.
//! A task without a checkpoint fails as it always did. With `pause_after_ms` set, a session
//! left idle that long while the model answers is checkpointed and closed (no sandbox held
//! while waiting) and resumed from that checkpoint, on any runner, when the answer comes.
//! This module never touches the runner but through `RunnerSession`, nor the store but
//! through the node's store client.

use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_node::events::{
    Ev, SESSION_CHECKPOINTED, SESSION_CHECKPOINT_FAILED, SESSION_PAUSED, SESSION_PAUSE_FAILED,
    SESSION_RESUMED,
};
use cairn_node::NodeError;
use cairn_proto::v1::Level;
use cairn_proto::v1::PutEnd;
use cairn_runner_client::session::RunnerSession;
use cairn_runner_client::snapshot;
use cairn_store_client::streamed::Expected;
use cairn_store_client::PutOptions;
use futures::SinkExt;
use tonic::Status;

use super::Task;
use crate::todo::TodoBoard;

/// Failovers of one task at most: a session lost again and again points at something other
/// than one dying runner.
const MAX_FAILOVERS: u32 = 3;

/// A stored checkpoint and the task's state when it was taken.
#[derive(Clone)]
struct Taken {
    path: String,
    sha256: String,
    bytes: u64,
    /// It holds the session's memory and processes, not files only.
    memory: bool,
    /// The turn it was taken before.
    step: u32,
    /// Messages of the conversation then.
    messages: usize,
    board: TodoBoard,
}

/// A session paused while the model answered.
struct Paused {
    session_id: String,
    runner: String,
    git_commit: String,
    since: Instant,
}

/// The checkpoints of one task.
pub(super) struct Checkpoints {
    /// Zero: none are taken.
    every: Duration,
    /// Zero: an idle session is never paused.
    pause_after: Duration,
    paused: Option<Paused>,
    /// Since the session opened, or the last checkpoint.
    since: Instant,
    /// Checkpoints of the current session so far.
    n: u32,
    last: Option<Taken>,
    failovers: u32,
}

impl Checkpoints {
    pub(super) fn new(every_s: u64, pause_after_ms: u64) -> Checkpoints {
        Checkpoints {
            every: Duration::from_secs(every_s),
            pause_after: Duration::from_millis(pause_after_ms),
            paused: None,
            since: Instant::now(),
            n: 0,
            last: None,
            failovers: 0,
        }
    }

    /// How long an idle session waits before it is paused (None: never).
    pub(super) fn pause_after(&self) -> Option<Duration> {
        (!self.pause_after.is_zero()).then_some(self.pause_after)
    }

    fn due(&self) -> bool {
        !self.every.is_zero() && self.since.elapsed() >= self.every
    }

    /// The session was (re)opened: its checkpoints count from here.
    pub(super) fn opened(&mut self) {
        self.since = Instant::now();
        self.n = 0;
    }
}

impl Task<'_> {
    /// Before turn `step`: a checkpoint when one is due. A session found lost here fails over
    /// (Ok: go on, maybe from an earlier turn); any other failure is reported and skipped.
    pub(super) async fn checkpoint_if_due(&mut self, step: u32) -> Result<(), NodeError> {
        if !self.checkpoints.due() {
            return Ok(());
        }
        self.checkpoints.since = Instant::now();
        let Err(s) = self.checkpoint(step).await else {
            return Ok(());
        };
        if self.session()?.lost(&s) {
            let e = NodeError::from_status("checkpointing the sandbox session", &s);
            return self.fail_over(e, s).await;
        }
        self.ctx.progress.emit(
            Ev::new(SESSION_CHECKPOINT_FAILED, self.node())
                .level(Level::Warning)
                .with("session_id", self.session()?.id())
                .with("step", step)
                .with("error", s.message()),
        );
        Ok(())
    }

    /// Takes and stores one checkpoint: the runner's bytes go into the store as they arrive
    /// (nothing is held whole here), and the store publishes the file only once the payload
    /// matched what the runner sent with it.
    async fn checkpoint(&mut self, step: u32) -> Result<(), Status> {
        let t0 = Instant::now();
        let session = self
            .session
            .as_ref()
            .ok_or_else(|| Status::failed_precondition("the sandbox session is not open"))?;
        let stream = session.checkpoint().await?;
        let n = self.checkpoints.n + 1;
        let path = self
            .ctx
            .run_dir()
            .path(&format!("snapshots/{}/{n}.snap", session.id()));
        let opts = PutOptions {
            run_id: self.ctx.run_id.clone(),
            ..Default::default()
        };
        let (tx, body) = futures::channel::mpsc::channel::<Bytes>(4);
        let (end_tx, end_rx) = tokio::sync::oneshot::channel::<PutEnd>();
        let save = async move {
            let mut sink = tx.sink_map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the store stopped reading")
            });
            let saved = snapshot::save_into(stream, &mut sink).await;
            // The body ends here, and its end follows only for a whole snapshot.
            drop(sink);
            if let Ok(s) = &saved {
                let _ = end_tx.send(PutEnd {
                    sha256: s.file_sha256.clone(),
                    size_bytes: s.file_bytes,
                });
            }
            saved
        };
        let put =
            self.ctx
                .store()
                .put_streamed(&self.ctx.project, &path, &opts, body, async move {
                    end_rx.await.ok()
                });
        let (saved, put) = tokio::join!(save, put);
        // Not the session's fault: never taken for a lost runner.
        let storing =
            |s: Status| Status::failed_precondition(format!("storing {path}: {}", s.message()));
        let saved = match (saved, put) {
            (Ok(saved), Ok(_)) => saved,
            (Err(snapshot::SnapshotError::Rpc(s)), _) => return Err(s),
            // The store refused first: that is why the bytes stopped.
            (Err(snapshot::SnapshotError::Io(e)), Err(s))
                if e.kind() == std::io::ErrorKind::BrokenPipe =>
            {
                return Err(storing(s))
            }
            (Ok(_), Err(s)) => return Err(storing(s)),
            // The runner's bytes were no snapshot: the store only saw them end short.
            (Err(other), _) => return Err(Status::data_loss(other.to_string())),
        };
        self.checkpoints.n = n;
        self.ctx.progress.emit(
            Ev::new(SESSION_CHECKPOINTED, self.node())
                .with("session_id", session.id())
                .with("snapshot", path.as_str())
                .with("bytes", saved.file_bytes)
                .with("sha256", saved.file_sha256.as_str())
                .with("memory", saved.header.memory)
                .with("n", n)
                .with("step", step)
                .with("runner", session.runner.as_str())
                .with("git_commit", session.info.git_commit.as_str())
                .with("ms", t0.elapsed().as_millis() as u64),
        );
        self.checkpoints.last = Some(Taken {
            path,
            sha256: saved.file_sha256,
            bytes: saved.file_bytes,
            memory: saved.header.memory,
            step,
            messages: self.messages.len(),
            board: self.board.clone(),
        });
        Ok(())
    }

    /// After a tool call failed with `error`: Ok when the session was lost and the task goes
    /// on in one resumed from the last checkpoint (its turns after the checkpoint undone).
    pub(super) async fn recover(&mut self, error: NodeError) -> Result<(), NodeError> {
        let lost = self.lost.lock().unwrap_or_else(|p| p.into_inner()).take();
        match lost {
            Some(s) => self.fail_over(error, s).await,
            None => Err(error),
        }
    }

    /// After `error` (from `lost`, a call that found the session lost): the session resumed
    /// from the last checkpoint on another runner, the conversation and the board as they were
    /// then. Err(error) when there is no checkpoint (today's behaviour: the task fails, and the
    /// node's retry policy may start it over).
    async fn fail_over(&mut self, error: NodeError, lost: Status) -> Result<(), NodeError> {
        let Some(last) = self.checkpoints.last.clone() else {
            return Err(error);
        };
        if self.checkpoints.failovers >= MAX_FAILOVERS {
            return Err(NodeError::new(
                error.kind,
                format!(
                    "{} (the session was already resumed from a checkpoint {MAX_FAILOVERS} times)",
                    error.message
                ),
            ));
        }
        let t0 = Instant::now();
        let old = self.session.take();
        let (old_id, old_runner) = old
            .as_ref()
            .map(|s| (s.id().to_owned(), s.runner.clone()))
            .unwrap_or_default();
        let mut session = match self.resume_taken(&last, &old_runner).await {
            Ok(s) => s,
            Err(what) => {
                self.session = old;
                return Err(NodeError::new(
                    error.kind,
                    format!(
                        "{}; resuming the checkpoint {} failed: {what}",
                        error.message, last.path
                    ),
                ));
            }
        };
        if let Some(o) = &old {
            // The checked-out commit of a git source is the task's, whatever the session.
            session.info.git_commit.clone_from(&o.info.git_commit);
        }
        // The old session is closed in the background (if its runner is still there).
        drop(old);
        self.checkpoints.failovers += 1;
        self.checkpoints.opened();
        let undone = self.iterations.saturating_sub(last.step.saturating_sub(1));
        self.messages.truncate(last.messages);
        self.board = last.board;
        self.save_board().await?;
        self.ctx.progress.emit(
            Ev::new(SESSION_RESUMED, self.node())
                .level(Level::Warning)
                .with("snapshot", last.path.as_str())
                .with("session_id", session.id())
                .with("runner", session.runner.as_str())
                .with("previous_session_id", old_id.as_str())
                .with("previous_runner", old_runner.as_str())
                .with("error", lost.message())
                .with("memory", session.info.memory_restored)
                .with("step", last.step)
                .with("turns_undone", undone)
                .with("ms", t0.elapsed().as_millis() as u64)
                .with("cause", "failover"),
        );
        self.session = Some(session);
        Ok(())
    }

    /// A new session from checkpoint `last`, read back from the store and checked again, on
    /// the first runner that takes it (`avoid`, the one that lost or held the old session,
    /// tried last: it may be back, having forgotten its sessions). Err says why not.
    async fn resume_taken(&self, last: &Taken, avoid: &str) -> Result<RunnerSession, String> {
        self.resume_snapshot(&last.path, &last.sha256, last.bytes, avoid)
            .await
    }

    /// A new session from the snapshot at `path` (checked against `sha256` and `bytes`), as
    /// [`Task::resume_taken`] makes one.
    pub(super) async fn resume_snapshot(
        &self,
        path: &str,
        sha256: &str,
        bytes: u64,
        avoid: &str,
    ) -> Result<RunnerSession, String> {
        let mut rotation = self.ctx.backends.runners.rotation();
        rotation.sort_by_key(|(addr, _)| *addr == avoid);
        let id = format!("cd-{}", uuid::Uuid::new_v4().simple());
        let expect = Expected {
            sha256: sha256.to_owned(),
            size: bytes,
        };
        // Read afresh for each runner it is offered to, checked against what was stored.
        let open = || async {
            match self
                .ctx
                .store()
                .read_checked(&self.ctx.project, path, Some(expect.clone()))
                .await?
            {
                Some(body) => Ok(tokio_util::io::StreamReader::new(Box::pin(body))),
                None => Err(Status::not_found("it is no longer in the store")),
            }
        };
        RunnerSession::resume_from(rotation, open, id)
            .await
            .map_err(|s| s.message().to_owned())
    }

    /// While the model answers turn `step` and the session has been idle past
    /// `pause_after_ms`: checkpoint it and close it. A pause that fails leaves it open.
    pub(super) async fn pause_while_waiting(&mut self, step: u32) {
        let t0 = Instant::now();
        let idle_ms = self.checkpoints.pause_after.as_millis() as u64;
        if let Err(s) = self.checkpoint(step).await {
            let id = self.session.as_ref().map(|s| s.id().to_owned());
            self.ctx.progress.emit(
                Ev::new(SESSION_PAUSE_FAILED, self.node())
                    .level(Level::Warning)
                    .with("session_id", id.unwrap_or_default())
                    .with("step", step)
                    .with("error", s.message()),
            );
            return;
        }
        let Some(session) = self.session.take() else {
            return;
        };
        let paused = Paused {
            session_id: session.id().to_owned(),
            runner: session.runner.clone(),
            git_commit: session.info.git_commit.clone(),
            since: Instant::now(),
        };
        if let Err(e) = session.close().await {
            // The runner closes it when its idle timeout passes, untouched from now on.
            tracing::warn!(session_id = %paused.session_id, error = %e.message(), "closing the paused session failed");
        }
        let (snapshot, memory) = self
            .checkpoints
            .last
            .as_ref()
            .map(|t| (t.path.clone(), t.memory))
            .unwrap_or_default();
        self.ctx.progress.emit(
            Ev::new(SESSION_PAUSED, self.node())
                .with("session_id", paused.session_id.as_str())
                .with("snapshot", snapshot)
                .with("memory", memory)
                .with("step", step)
                .with("runner", paused.runner.as_str())
                .with("idle_ms", idle_ms)
                .with("ms", t0.elapsed().as_millis() as u64),
        );
        self.checkpoints.paused = Some(paused);
    }

    /// When the session was paused while the model answered: resume it from the pause's
    /// checkpoint on any runner (nothing changed in it since, so no turn is undone).
    pub(super) async fn resume_if_paused(&mut self) -> Result<(), NodeError> {
        let Some(paused) = self.checkpoints.paused.take() else {
            return Ok(());
        };
        let Some(last) = self.checkpoints.last.clone() else {
            return Err(NodeError::failed(
                "the paused session has no checkpoint to resume from",
            ));
        };
        let t0 = Instant::now();
        let mut session = self.resume_taken(&last, "").await.map_err(|what| {
            NodeError::new(
                cairn_graph::ErrorKind::Unavailable,
                format!(
                    "resuming the paused sandbox session from {}: {what}",
                    last.path
                ),
            )
        })?;
        session.info.git_commit = paused.git_commit;
        self.checkpoints.opened();
        self.ctx.progress.emit(
            Ev::new(SESSION_RESUMED, self.node())
                .with("snapshot", last.path.as_str())
                .with("session_id", session.id())
                .with("runner", session.runner.as_str())
                .with("previous_session_id", paused.session_id.as_str())
                .with("previous_runner", paused.runner.as_str())
                .with("memory", session.info.memory_restored)
                .with("step", last.step)
                .with("turns_undone", 0u32)
                .with("paused_ms", paused.since.elapsed().as_millis() as u64)
                .with("ms", t0.elapsed().as_millis() as u64)
                .with("cause", "idle"),
        );
        self.session = Some(session);
        Ok(())
    }
}
