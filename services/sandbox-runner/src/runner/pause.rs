//! The runner's PauseSession and ResumeSession: a session into a snapshot (and closed, or
//! going on as a checkpoint), and a snapshot into a new session. The snapshot's layout and checks are snapshot.rs's.

use std::sync::Arc;

use cairn_proto as pb;

use super::{blocking, Runner};
use crate::backend::SessionSandbox;
use crate::error::{Error, Result};
use crate::snapshot::{self, Origin, Prepared, Receiver, Restore, Take};
use cairn_pack::graft::AreaRoots;

/// How a memory checkpoint stands, for the thread that sends its files as runsc writes them.
const CHECKPOINTING: u8 = 0;
const CHECKPOINTED: u8 = 1;
const CHECKPOINT_FAILED: u8 = 2;

/// A snapshot sent by a pause (its SnapshotEnd went to the caller's `end_tx`): whether
/// memory is in it.
pub struct Sent {
    pub memory: bool,
}

impl Runner {
    /// Makes a snapshot of session `id`: with its memory and processes when the backend can
    /// and `files_only` is off (gvisor), else its files. Its header goes to `header` at once
    /// (no sha256 or size yet) and the bytes to `chunks` as they are made (runsc's files
    /// while runsc writes them); their sha256 and size go to `end_tx` once the snapshot is
    /// whole, before the checkpoint's scratch files are removed and a session it ended is
    /// closed (an error after that leaves the snapshot whole). A
    /// memory checkpoint stops the sandbox: with
    /// `keep_open` it is restored in place once the files are sent (the session goes on under
    /// its id, its processes where they were; a restore that fails closes the session), else
    /// the session is closed once the bytes are sent. A files-only session stays open (the
    /// caller closes it once the snapshot is delivered, unless `keep_open`).
    /// Not to be cancelled once the header is out (a checkpoint half handled): a caller that
    /// stops reading `chunks` ends it with an error instead.
    pub async fn pause_session(
        &self,
        id: &str,
        files_only: bool,
        keep_open: bool,
        header: tokio::sync::oneshot::Sender<pb::SnapshotHeader>,
        chunks: tokio::sync::mpsc::Sender<bytes::Bytes>,
        end_tx: tokio::sync::oneshot::Sender<pb::SnapshotEnd>,
    ) -> Result<Sent> {
        self.open()?;
        let s = self.session(id)?;
        let memory = !files_only && self.backend.checkpoints_memory();
        // A memory checkpoint is taken between commands (see Session::checkpointing).
        let mut alone = match memory {
            true => Some(s.checkpointing.write().await),
            false => None,
        };
        let sandbox = s.sandbox.clone();
        let mut scratch = Restore {
            dir: s
                .sandbox
                .task_dir
                .with_file_name(format!("{id}.snap-{}.d", uuid::Uuid::new_v4().simple())),
            checkpoint: None,
            mounted: false,
        };
        let t0 = std::time::Instant::now();
        if memory {
            std::fs::create_dir(&scratch.dir)
                .map_err(Error::io("creating the checkpoint directory"))?;
            // runsc writes the checkpoint into memory rather than the runner's disk: a
            // tmpfs of its own (the image is read once, as it is written, then removed).
            // Where the runner may not mount, a plain directory.
            let max = self.config.session.max_snapshot_bytes;
            match crate::backend::area::mount(&scratch.dir, max, (0, 0), 0o700) {
                Ok(mounted) => scratch.mounted = mounted,
                Err(e) => tracing::debug!(error = %e, "the checkpoint directory stays on disk"),
            }
        }
        let _ = header.send(pb::SnapshotHeader {
            format: match memory {
                true => snapshot::FORMAT,
                // Files only: the layout every runner reads.
                false => 1,
            },
            backend: self.backend.name().into(),
            image: sandbox.image.clone(),
            memory,
            sha256: String::new(),
            size_bytes: 0,
            session_id: id.to_owned(),
            network: sandbox.network,
            limits: Some(sandbox.limits.to_proto()),
            created_unix_ms: snapshot::now_ms(),
        });
        // The checkpoint's files are sent while runsc writes them. The session's files are
        // read once it is finished (the sandbox is stopped then: they match its memory); a
        // restore in place starts once they are sent, as the rest of the checkpoint is.
        let (files_in, in_files) = tokio::sync::oneshot::channel();
        let state = Arc::new(std::sync::atomic::AtomicU8::new(CHECKPOINTING));
        let max = self.config.session.max_snapshot_bytes;
        let writing = {
            let task_dir = s.sandbox.areas.dir().to_path_buf();
            let dir = memory.then(|| scratch.dir.clone());
            let state = state.clone();
            let write = blocking(move || {
                let sink = snapshot::ChunkSink::new(chunks, max);
                let finished = || match state.load(std::sync::atomic::Ordering::Acquire) {
                    CHECKPOINTING => None,
                    CHECKPOINTED => Some(true),
                    _ => Some(false),
                };
                let checkpoint = dir.as_deref().map(|dir| snapshot::Checkpoint {
                    dir,
                    finished: &finished,
                });
                snapshot::write(&task_dir, checkpoint, sink, move || {
                    let _ = files_in.send(());
                })
                .map_err(Error::from)
            });
            async move { (write.await, t0.elapsed()) }
        };
        let checkpointed = std::sync::OnceLock::new();
        let restoring = async {
            if memory {
                let taken = self.backend.checkpoint(&s.sandbox, &scratch.dir).await;
                let _ = checkpointed.set(t0.elapsed());
                let to = match taken {
                    Ok(_) => CHECKPOINTED,
                    Err(_) => CHECKPOINT_FAILED,
                };
                state.store(to, std::sync::atomic::Ordering::Release);
                taken?;
            }
            if !(memory && keep_open) {
                return Ok(None);
            }
            // Err: the writing failed before the files were in; the session goes on anyway.
            let _ = in_files.await;
            let r0 = t0.elapsed();
            let restored = self
                .backend
                .restore_in_place(&s.sandbox, &scratch.dir)
                .await;
            if restored.is_ok() {
                // The sandbox runs again: Execs go on while the snapshot is finished.
                alone.take();
            }
            Ok(Some(restored.map(|()| (r0, t0.elapsed()))))
        };
        let ((written, written_at), restored) = tokio::join!(writing, restoring);
        let restored = match restored {
            Ok(r) => r,
            Err(e) => {
                drop(scratch);
                return Err(self.after_failed_checkpoint(&s, e).await);
            }
        };
        let checkpointed = checkpointed.get().copied().unwrap_or_default();
        let timing = match restored {
            Some(Ok(timing)) => Some(timing),
            Some(Err(e)) => {
                drop(scratch);
                // Closed before the Execs waiting for the checkpoint go on: they find no session.
                if let Err(c) = self.close_session(id).await {
                    tracing::warn!(session_id = %id, error = %c, "closing a session whose restore failed failed");
                }
                drop(alone);
                tracing::warn!(session_id = %id, error = %e, "a session's checkpoint could not be restored in place; the session is closed");
                return Err(Error::Sandbox(format!(
                    "session {id} was checkpointed but could not go on, so it is closed (open a new one, or resume a snapshot of it): {e}"
                )));
            }
            None => None,
        };
        // The checkpoint stopped the sandbox: the session is over whatever comes next.
        let ends_session = memory && !keep_open;
        let written = written.map_err(|e| match e {
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::FileTooLarge => {
                Error::ResourceExhausted {
                    message: format!(
                        "the snapshot of session {id} is larger than this runner's [session] max_snapshot_bytes = {max}: remove files from the session, or raise the limit"
                    ),
                    reason: "too_large",
                }
            }
            other => other,
        });
        let (sha256, size_bytes) = match written {
            Ok(w) => w,
            Err(e) => {
                drop(scratch);
                if ends_session {
                    if let Err(c) = self.close_session(id).await {
                        tracing::warn!(session_id = %id, error = %c, "closing a checkpointed session failed");
                    }
                }
                return Err(e);
            }
        };
        let end = pb::SnapshotEnd { sha256, size_bytes };
        // The snapshot is whole: its end goes out before the clearing up below.
        let _ = end_tx.send(end.clone());
        let sent_at = t0.elapsed();
        drop(scratch);
        if ends_session {
            self.close_session(id).await?;
        }
        drop(alone);
        let (restore_from_ms, paused_ms) = timing
            .map(|(from, to)| (from.as_millis() as u64, to.as_millis() as u64))
            .unwrap_or_default();
        tracing::info!(
            session_id = %id,
            memory,
            keep_open,
            bytes = end.size_bytes,
            checkpoint_ms = checkpointed.as_millis() as u64,
            written_ms = written_at.as_millis() as u64,
            restore_from_ms,
            paused_ms,
            end_sent_ms = sent_at.as_millis() as u64,
            total_ms = t0.elapsed().as_millis() as u64,
            "session snapshot made and sent"
        );
        Ok(Sent { memory })
    }

    /// A memory checkpoint failed with `e`: a session whose sandbox it stopped cannot go on
    /// and is closed (the error says so); one still running stays open.
    async fn after_failed_checkpoint(&self, s: &crate::session::InUse, e: Error) -> Error {
        if self.backend.session_running(&s.sandbox).await {
            return e;
        }
        let id = s.sandbox.session_id.clone();
        if let Err(c) = self.close_session(&id).await {
            tracing::warn!(session_id = %id, error = %c, "closing a session whose checkpoint failed failed");
        }
        Error::Sandbox(format!(
            "{e}; the session's sandbox stopped, so session {id} is closed"
        ))
    }

    /// Checks a snapshot's header (this runner's backend and image) before its bytes come.
    pub fn begin_resume(&self, header: pb::SnapshotHeader) -> Result<Receiver> {
        self.open()?;
        let image = self.config.image_for(&header.image).map_err(|e| {
            Error::SnapshotMismatch(format!(
                "the snapshot was taken in image {:?}, which this runner does not run: {e}",
                header.image
            ))
        })?;
        snapshot::check_header(
            &header,
            self.backend.name(),
            &image,
            self.config.session.max_snapshot_bytes,
        )?;
        self.backend_runs(&image)?;
        let name = format!("resume-{}", uuid::Uuid::new_v4().simple());
        let tasks = self.config.work_root.join("tasks");
        Receiver::new(
            header,
            tasks.join(format!("{name}.snap")),
            tasks.join(format!("{name}.d")),
            self.config.session.max_snapshot_bytes,
        )
    }

    /// Opens `copies` new sessions (at least one) from the received snapshot once its bytes
    /// are verified, the first named `session_id`: the answer is the first's, the others in
    /// its `copies`. All open or none: when one fails, those open are closed.
    pub async fn resume_session(
        self: &Arc<Self>,
        received: Receiver,
        end: Option<pb::SnapshotEnd>,
        session_id: String,
        copies: u32,
    ) -> Result<pb::SessionInfo> {
        let copies = copies.max(1);
        let most = self.config.max_sessions.min(self.config.concurrent_runs());
        if copies as usize > most {
            return Err(Error::ResourceExhausted {
                message: format!(
                    "{copies} copies of a snapshot asked for, and this runner holds at most {most} sessions (max_sessions, max_concurrent_runs): fork fewer at once, or across runners"
                ),
                reason: "too_many_sessions",
            });
        }
        let t0 = std::time::Instant::now();
        let prepared = Arc::new(self.prepare(received, end).await?);
        tracing::debug!(
            prepared_ms = t0.elapsed().as_millis() as u64,
            "snapshot checked and its checkpoint unpacked"
        );
        let opens = (0..copies).map(|n| {
            let req = pb::OpenSessionRequest {
                session_id: if n == 0 {
                    session_id.clone()
                } else {
                    String::new()
                },
                network: prepared.header.network,
                limits: prepared.header.limits,
                image: prepared.header.image.clone(),
                ..Default::default()
            };
            self.open_from(req, Origin::Snapshot(prepared.clone()))
        });
        let opened = futures::future::join_all(opens).await;
        drop(prepared);
        let mut infos = Vec::with_capacity(opened.len());
        let mut failed = None;
        for o in opened {
            match o {
                Ok(info) => infos.push(info),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            for info in &infos {
                if let Err(c) = self.close_session(&info.session_id).await {
                    tracing::warn!(session_id = %info.session_id, error = %c, "closing a copy of a fork that failed failed");
                }
            }
            return Err(e);
        }
        let mut first = infos.remove(0);
        first.copies = infos;
        Ok(first)
    }

    /// Checks the received bytes and, with memory, finishes the checkpoint (its parts came
    /// straight into the restore directory) once for every session resumed from them.
    async fn prepare(&self, received: Receiver, end: Option<pb::SnapshotEnd>) -> Result<Prepared> {
        blocking(move || {
            let (header, payload, checkpoint) = received.finish(end)?;
            if let Some(restore) = &checkpoint {
                // What came whole (directories, a layout-1 file) and a check of every entry.
                snapshot::unpack(&payload.path, Take::Checkpoint(&restore.dir))?;
                if !restore.dir.join(snapshot::IMAGE).is_file() {
                    return Err(Error::SnapshotCorrupt(
                        "the snapshot says it holds memory but has no checkpoint/checkpoint.img"
                            .into(),
                    ));
                }
            }
            Ok(Prepared {
                header,
                payload,
                checkpoint,
            })
        })
        .await
    }

    /// Unpacks a snapshot's files into a new session's areas, given to the sandbox user as
    /// they are made.
    pub(super) async fn unpack_snapshot(
        &self,
        sandbox: &SessionSandbox,
        prepared: Arc<Prepared>,
    ) -> Result<()> {
        let (areas, owner) = (sandbox.areas.dir().to_path_buf(), self.owner);
        blocking(move || {
            let roots =
                AreaRoots::open(&areas, owner).map_err(Error::io("opening the session's areas"))?;
            Ok(snapshot::unpack(
                &prepared.payload.path,
                Take::Files(&roots),
            )?)
        })
        .await
    }
}
