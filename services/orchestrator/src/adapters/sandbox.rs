//! Where an external agent's turn runs: a sandbox session on a runner (OpenSession, WriteFile,
//! Exec, Glob, ReadFile, CloseSession). One session per node attempt: the project files are
//! staged into `/workspace/project`, the CLI's kept state into `/workspace/.cairn-agent/<dir>`,
//! and the turn is one unary `Exec` of the CLI (`codex exec` is one process per turn, so the
//! whole JSONL stream comes back when the turn ends; docs/adapters.md says why no streaming
//! Exec is needed for that). The session is closed when the attempt ends, also when it is
//! dropped (cancel, deadline): nothing outlives the attempt but what went to the store.

use bytes::Bytes;
use cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient;
use cairn_proto::v1::{
    CloseSessionRequest, ExecRequest, ExecResult, GlobRequest, OpenSessionRequest, ReadFileRequest,
    ReadFileResponse, WriteFileRequest, WriteMode,
};
use cairn_telemetry::TracedChannel;
use tonic::{Code, Status};

pub type Client = SandboxRunnerClient<TracedChannel>;

/// The CLI's working directory (the staged project files), relative to /workspace.
pub const PROJECT_DIR: &str = "project";
/// Parent of the CLI's state directory, relative to /workspace.
pub const STATE_ROOT: &str = ".cairn-agent";

/// An open session; closed by [`AgentSandbox::close`] or, failing that, on drop.
pub struct AgentSandbox {
    client: Client,
    pub runner: String,
    pub session_id: String,
    open: bool,
}

fn close_in_background(mut client: Client, id: String) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(session_id = %id, "no runtime to close the agent's sandbox session; the runner removes it at its next start");
        return;
    };
    handle.spawn(async move {
        if let Err(e) = client
            .close_session(CloseSessionRequest {
                session_id: id.clone(),
            })
            .await
        {
            tracing::warn!(session_id = %id, error = %e.message(), "closing the agent's sandbox session failed");
        }
    });
}

impl AgentSandbox {
    /// Opens session `id` on the first runner of `rotation` that answers (Unavailable ones are
    /// skipped). No network: the runner's default, unless the node asks and the runner allows.
    pub async fn open(
        rotation: Vec<(String, Client)>,
        id: &str,
        network: bool,
        run_id: &str,
        node_id: &str,
    ) -> Result<AgentSandbox, Status> {
        if rotation.is_empty() {
            return Err(Status::failed_precondition(
                "no sandbox runner configured: set sandbox_addrs (CAIRN_ORCHESTRATOR_SANDBOX_ADDRS) to run external_agent nodes",
            ));
        }
        let mut last = None;
        for (addr, client) in rotation {
            let req = OpenSessionRequest {
                session_id: id.to_owned(),
                git: None,
                network,
                limits: None,
                run_id: run_id.to_owned(),
                node_id: node_id.to_owned(),
            };
            // Dropped mid-call (cancel): the id is ours, so close it whatever happened.
            let mut guard = CloseGuard {
                client: client.clone(),
                id: id.to_owned(),
                armed: true,
            };
            match client.clone().open_session(req).await {
                Ok(info) => {
                    guard.armed = false;
                    return Ok(AgentSandbox {
                        client,
                        runner: addr,
                        session_id: info.into_inner().session_id,
                        open: true,
                    });
                }
                Err(s) if s.code() == Code::Unavailable => {
                    guard.armed = false;
                    tracing::warn!(runner = %addr, error = %s.message(), "sandbox runner unavailable; opening the agent's session on the next one");
                    last = Some(s);
                }
                Err(s) => {
                    guard.armed = false;
                    return Err(s);
                }
            }
        }
        Err(last.unwrap_or_else(|| Status::unavailable("no sandbox runner answered")))
    }

    pub async fn write(&self, path: &str, content: Bytes) -> Result<(), Status> {
        self.client
            .clone()
            .write_file(WriteFileRequest {
                session_id: self.session_id.clone(),
                path: path.to_owned(),
                content,
                mode: WriteMode::Overwrite as i32,
            })
            .await
            .map(|_| ())
    }

    pub async fn read(&self, path: &str) -> Result<ReadFileResponse, Status> {
        self.client
            .clone()
            .read_file(ReadFileRequest {
                session_id: self.session_id.clone(),
                path: path.to_owned(),
                max_bytes: 0,
            })
            .await
            .map(|r| r.into_inner())
    }

    /// Files under `base` (relative to /workspace); `truncated` when the runner's cap was hit.
    pub async fn files(&self, base: &str) -> Result<(Vec<String>, bool), Status> {
        let r = self
            .client
            .clone()
            .glob(GlobRequest {
                session_id: self.session_id.clone(),
                pattern: "**".into(),
                base_path: base.to_owned(),
                max_results: 0,
            })
            .await?
            .into_inner();
        Ok((r.paths, r.truncated))
    }

    pub async fn exec(&self, command: &str, timeout_ms: u64) -> Result<ExecResult, Status> {
        self.client
            .clone()
            .exec(ExecRequest {
                session_id: self.session_id.clone(),
                command: command.to_owned(),
                timeout_ms,
                workdir: String::new(),
                max_output_bytes: 0,
            })
            .await
            .map(|r| r.into_inner())
    }

    /// Stops and removes the session.
    pub async fn close(mut self) {
        self.open = false;
        let id = self.session_id.clone();
        if let Err(e) = self
            .client
            .clone()
            .close_session(CloseSessionRequest {
                session_id: id.clone(),
            })
            .await
        {
            tracing::warn!(session_id = %id, error = %e.message(), "closing the agent's sandbox session failed; the runner removes it at its next start");
        }
    }
}

impl Drop for AgentSandbox {
    fn drop(&mut self) {
        if self.open {
            close_in_background(self.client.clone(), self.session_id.clone());
        }
    }
}

/// Closes session `id` on drop while armed: an OpenSession dropped in flight.
struct CloseGuard {
    client: Client,
    id: String,
    armed: bool,
}

impl Drop for CloseGuard {
    fn drop(&mut self) {
        if self.armed {
            close_in_background(self.client.clone(), self.id.clone());
        }
    }
}
