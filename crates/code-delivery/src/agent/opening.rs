//! Opening a task's sandbox session: fresh on the first runner that answers (a git source
//! cloned into it), or, when a rework named one, from the node's last snapshot.

use std::time::Instant;

use cairn_node::events::{Ev, SESSION_RESUMED};
use cairn_node::{NodeError, SnapshotRef};
use cairn_proto::v1::{GitSource, OpenSessionRequest};
use cairn_runner_client::session::RunnerSession;

use super::Task;
use crate::prompt::Source;
use crate::SESSION_OPENED;

impl Task<'_> {
    pub(super) async fn open(&mut self) -> Result<(), NodeError> {
        if let Some(from) = self.ctx.start_from.clone() {
            return self.open_from(from).await;
        }
        let git = match &self.source {
            Source::Empty => None,
            Source::Git { url, git_ref } => Some(GitSource {
                url: url.clone(),
                r#ref: git_ref.clone(),
            }),
        };
        let id = format!("cd-{}", uuid::Uuid::new_v4().simple());
        let req = OpenSessionRequest {
            session_id: id,
            git,
            network: self.network,
            limits: None,
            run_id: self.ctx.run_id.clone(),
            node_id: self.ctx.node_id.clone(),
            image: self.image.clone(),
        };
        let session =
            RunnerSession::open(self.ctx.backends.runners.rotation(), req, "code_delivery")
                .await
                .map_err(|s| NodeError::from_status("opening the sandbox session", &s))?;
        self.ctx.progress.emit(self.opened(&session));
        self.session = Some(session);
        self.checkpoints.opened();
        Ok(())
    }

    /// Opens the session from the snapshot a rework named (its files as they were then; a
    /// git source is not cloned again), on any runner that takes it.
    async fn open_from(&mut self, from: SnapshotRef) -> Result<(), NodeError> {
        let t0 = Instant::now();
        let mut session = self
            .resume_snapshot(&from.path, &from.sha256, from.bytes, "")
            .await
            .map_err(|what| {
                NodeError::failed(format!(
                    "starting the session from the snapshot {} that the rework named: {what}; rework the node without --from-snapshot",
                    from.path
                ))
            })?;
        session.info.git_commit = from.git_commit.clone();
        self.ctx.progress.emit(
            self.opened(&session)
                .with("from_snapshot", from.path.as_str()),
        );
        self.ctx.progress.emit(
            Ev::new(SESSION_RESUMED, self.node())
                .with("snapshot", from.path.as_str())
                .with("session_id", session.id())
                .with("runner", session.runner.as_str())
                .with("previous_session_id", from.session_id.as_str())
                .with("turns_undone", 0u32)
                .with("ms", t0.elapsed().as_millis() as u64)
                .with("cause", "rework"),
        );
        self.session = Some(session);
        self.checkpoints.opened();
        Ok(())
    }

    /// `code_delivery.session_opened` for `session`.
    fn opened(&self, session: &RunnerSession) -> Ev {
        Ev::new(SESSION_OPENED, self.node())
            .with("session_id", session.info.session_id.as_str())
            .with("container_name", session.info.container_name.as_str())
            .with("backend", session.info.backend.as_str())
            .with("git_commit", session.info.git_commit.as_str())
            .with("image", session.info.image.as_str())
            .with("network", self.network)
            .with("runner", session.runner.as_str())
    }
}
