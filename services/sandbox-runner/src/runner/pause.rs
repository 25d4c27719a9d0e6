//! The runner's PauseSession and ResumeSession: a session into a snapshot (and closed), and a
//! snapshot into a new session. The snapshot's layout and checks are snapshot.rs's.

use std::sync::Arc;

use cairn_proto as pb;

use super::{blocking, Runner};
use crate::backend::SessionSandbox;
use crate::error::{Error, Result};
use crate::graft::AreaRoots;
use crate::snapshot::{self, Made, Origin, Payload, Receiver, Restore};

impl Runner {
    /// Makes a snapshot of session `id`: with its memory and processes when the backend can
    /// and `files_only` is off (gvisor; the session is closed then, its sandbox stopped by
    /// the checkpoint), else its files while it stays open (the caller closes it once the
    /// snapshot is delivered).
    pub async fn pause_session(&self, id: &str, files_only: bool) -> Result<Made> {
        self.open()?;
        let s = self.session(id)?;
        let sandbox = s.sandbox.clone();
        let stem = format!("{id}.snap-{}", uuid::Uuid::new_v4().simple());
        let payload = Payload {
            path: s.sandbox.task_dir.with_file_name(&stem),
        };
        let scratch = Restore {
            dir: s.sandbox.task_dir.with_file_name(format!("{stem}.d")),
            checkpoint: None,
        };
        let t0 = std::time::Instant::now();
        let memory = !files_only && {
            std::fs::create_dir(&scratch.dir)
                .map_err(Error::io("creating the checkpoint directory"))?;
            self.backend.checkpoint(&s.sandbox, &scratch.dir).await?
        };
        let checkpointed = std::time::Instant::now();
        let written = {
            let (task_dir, out) = (s.sandbox.areas.dir().to_path_buf(), payload.path.clone());
            let dir = memory.then(|| scratch.dir.clone());
            blocking(move || snapshot::write(&task_dir, dir.as_deref(), &out)).await
        };
        drop(scratch);
        if memory {
            // The checkpoint stopped the sandbox: the session is over whatever comes next.
            drop(s);
            self.close_session(id).await?;
        }
        let (sha256, size_bytes) = written?;
        let max = self.config.session.max_snapshot_bytes;
        if size_bytes > max {
            return Err(Error::ResourceExhausted {
                message: format!(
                    "the snapshot of session {id} is {size_bytes} bytes, above this runner's [session] max_snapshot_bytes = {max}: remove files from the session, or raise the limit"
                ),
                reason: "too_large",
            });
        }
        tracing::info!(
            session_id = %id,
            memory,
            bytes = size_bytes,
            checkpoint_ms = (checkpointed - t0).as_millis() as u64,
            total_ms = t0.elapsed().as_millis() as u64,
            "session snapshot made"
        );
        Ok(Made {
            header: pb::SnapshotHeader {
                format: snapshot::FORMAT,
                backend: self.backend.name().into(),
                image: sandbox.image,
                memory,
                sha256,
                size_bytes,
                session_id: id.to_owned(),
                network: sandbox.network,
                limits: Some(sandbox.limits.to_proto()),
                created_unix_ms: snapshot::now_ms(),
            },
            payload,
        })
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
        let path = self
            .config
            .work_root
            .join("tasks")
            .join(format!("resume-{}.snap", uuid::Uuid::new_v4().simple()));
        Receiver::new(header, path)
    }

    /// Opens a new session from the received snapshot once its bytes are verified.
    pub async fn resume_session(
        self: &Arc<Self>,
        received: Receiver,
        session_id: String,
    ) -> Result<pb::SessionInfo> {
        let (header, payload) = blocking(move || received.finish()).await?;
        let req = pb::OpenSessionRequest {
            session_id,
            network: header.network,
            limits: header.limits,
            image: header.image.clone(),
            ..Default::default()
        };
        self.open_from(req, Origin::Snapshot { header, payload })
            .await
    }

    /// Unpacks a snapshot into a new session's task directory (and, with memory, its
    /// checkpoint beside it), files given to the sandbox user.
    pub(super) async fn unpack_snapshot(
        &self,
        sandbox: &SessionSandbox,
        payload: Payload,
        memory: bool,
    ) -> Result<Restore> {
        let dir = sandbox.task_dir.with_file_name(format!(
            "{}.restore-{}",
            sandbox.session_id,
            uuid::Uuid::new_v4().simple()
        ));
        let restore = Restore {
            checkpoint: memory.then(|| dir.join("checkpoint")),
            dir,
        };
        let (areas, dir, owner) = (
            sandbox.areas.dir().to_path_buf(),
            restore.dir.clone(),
            self.owner,
        );
        blocking(move || {
            std::fs::create_dir(&dir).map_err(Error::io("creating the restore directory"))?;
            // What is placed is given to the sandbox user as it is made.
            let roots =
                AreaRoots::open(&areas, owner).map_err(Error::io("opening the session's areas"))?;
            snapshot::unpack(&payload.path, &roots, &dir)?;
            drop(payload);
            if memory && !dir.join("checkpoint").join("checkpoint.img").is_file() {
                return Err(Error::SnapshotCorrupt(
                    "the snapshot says it holds memory but has no checkpoint/checkpoint.img".into(),
                ));
            }
            Ok(())
        })
        .await?;
        Ok(restore)
    }
}
