//! A session on a sandbox runner (sandbox.proto's session calls), the one
//! client of that API in the orchestrator: the `code_delivery` and `external_agent` nodes
//! both work through it. Opening picks the first runner that answers; the session then stays
//! on that runner for Exec, ReadFile, WriteFile, Glob, Grep and Pack until it is closed. A
//! session can be checkpointed while it goes on (`checkpoint`), and a snapshot resumed as a
//! new session on any runner that takes it (`resume_from`, which reads it afresh for each
//! runner it is offered to and streams it as it reads).
//!
//! Nothing outlives its task: a session dropped while open (a cancelled run, a node deadline)
//! and an OpenSession dropped in flight (the id is ours, chosen before the call) are closed by
//! a CloseSession sent from a background task. While a session is held, a background task
//! touches it (TouchSession) three times per runner idle timeout, so a holder waiting for a
//! model keeps it; a holder that dies stops touching and the runner closes the session.

use bytes::{Bytes, BytesMut};
use cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient;
use cairn_proto::v1::{
    pack_response, ArchiveFormat, CloseSessionRequest, ExecRequest, ExecResult, GlobRequest,
    GlobResponse, GrepRequest, GrepResponse, OpenSessionRequest, PackRequest, PackSummary,
    PauseSessionRequest, ReadFileRequest, ReadFileResponse, SessionInfo, SnapshotPart,
    TouchSessionRequest, WriteFileRequest, WriteFileResponse, WriteMode,
};
use cairn_telemetry::TracedChannel;

use crate::snapshot::SnapshotError;
use tonic::{Code, Status};

pub type Client = SandboxRunnerClient<TracedChannel>;

/// An open session on one runner; closed by [`RunnerSession::close`] or, failing that, on
/// drop.
pub struct RunnerSession {
    client: Client,
    /// Address of the runner that holds it.
    pub runner: String,
    pub info: SessionInfo,
    /// Still to be closed (by `close` or on drop).
    open: bool,
    /// The task touching the session while it is held; stopped on drop.
    keepalive: Option<tokio::task::AbortHandle>,
}

/// A packed archive, fully received and checked against the runner's digest.
pub struct Packed {
    pub bytes: Bytes,
    pub summary: PackSummary,
}

/// Why a pack ended without an archive.
#[derive(Debug)]
pub enum PackError {
    /// The runner refused or failed (its status).
    Status(Status),
    /// More bytes arrived than `max_bytes`.
    TooLarge { max_bytes: u64 },
    /// The bytes do not match the runner's summary (size or sha256), or no summary came.
    Corrupt(String),
}

impl RunnerSession {
    /// Opens `req.session_id` (set by the caller, so a dropped call can still be closed) on the
    /// first runner of `rotation` that answers, moving on while runners are gone.
    /// `node_type` names the node kind in the message given when no runner is configured.
    pub async fn open(
        rotation: Vec<(String, Client)>,
        req: OpenSessionRequest,
        node_type: &str,
    ) -> Result<RunnerSession, Status> {
        if rotation.is_empty() {
            return Err(Status::failed_precondition(format!(
                "no sandbox runner configured: set sandbox_addrs (CAIRN_ORCHESTRATOR_SANDBOX_ADDRS) to run {node_type} nodes"
            )));
        }
        if req.session_id.is_empty() {
            return Err(Status::invalid_argument(
                "a session id is needed before opening: without one a dropped OpenSession could not be closed",
            ));
        }
        let id = req.session_id.clone();
        on_first_that_answers(
            rotation,
            &id,
            "opening the session",
            |_| false,
            |mut client| {
                let req = req.clone();
                async move { client.open_session(req).await }
            },
        )
        .await
    }

    /// Opens a new session `session_id` from a snapshot file held in memory, as
    /// [`RunnerSession::resume_from`] does.
    pub async fn resume(
        rotation: Vec<(String, Client)>,
        file: Bytes,
        session_id: String,
    ) -> Result<RunnerSession, Status> {
        let open = move || {
            let file = file.clone();
            async move { Ok(std::io::Cursor::new(file)) }
        };
        Self::resume_from(rotation, open, session_id).await
    }

    /// Opens a new session `session_id` from a snapshot file (`snapshot.rs`'s layout), read
    /// afresh from `open` for each runner offered it and streamed as it is read, on the first
    /// runner of `rotation` that takes it: moving on while runners are gone and past runners
    /// of another backend or image (they refuse it, FailedPrecondition: a fleet may mix
    /// backends). A damaged file is refused by the runner (InvalidArgument) before any session
    /// exists, and tried nowhere else; a reader that fails makes it short, and the answer is
    /// then DataLoss naming the reader's error. An `open` that fails ends the call with its
    /// error unless that is Unavailable (the next runner opens again). When no runner took
    /// it: a runner that was gone (it may come back) over a refusal.
    pub async fn resume_from<F, Fut, R>(
        rotation: Vec<(String, Client)>,
        mut open: F,
        session_id: String,
    ) -> Result<RunnerSession, Status>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<R, Status>>,
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
    {
        let id = session_id.clone();
        on_first_that_answers(
            rotation,
            &id,
            "resuming the snapshot",
            |s| s.code() == Code::FailedPrecondition,
            |mut client| {
                let reader = open();
                let session_id = session_id.clone();
                async move {
                    let mut reader = reader.await.map_err(|s| {
                        Status::new(s.code(), format!("reading the snapshot: {}", s.message()))
                    })?;
                    let header = crate::snapshot::read_header(&mut reader)
                        .await
                        .map_err(|e| match e {
                            SnapshotError::Io(e) => {
                                Status::data_loss(format!("reading the snapshot: {e}"))
                            }
                            e => Status::invalid_argument(e.to_string()),
                        })?;
                    let failure = crate::snapshot::ReadFailure::default();
                    let parts = crate::snapshot::parts_reporting(
                        header,
                        reader,
                        session_id,
                        1,
                        failure.clone(),
                    );
                    let answer = client.resume_session(parts).await;
                    match (answer, failure.get()) {
                        (Err(s), Some(why)) => Err(Status::data_loss(format!(
                            "reading the snapshot failed ({why}), so the runner got it short: {}",
                            s.message()
                        ))),
                        (answer, _) => answer,
                    }
                }
            },
        )
        .await
    }

    pub fn id(&self) -> &str {
        &self.info.session_id
    }

    /// Do this session's snapshots hold its memory and processes (a gvisor runner), not
    /// only its files?
    pub fn keeps_memory(&self) -> bool {
        self.info.backend == "gvisor"
    }

    /// A checkpoint: a snapshot of the session while it stays open (PauseSession with
    /// `keep_open`), to be written with `snapshot::save`: with its memory and processes where
    /// the runner keeps them ([`RunnerSession::keeps_memory`]; the sandbox stops for the
    /// checkpoint and goes on restored in place), else its files only. Call it while no other
    /// call runs in the session: the files are read as they are.
    pub async fn checkpoint(&self) -> Result<tonic::Streaming<SnapshotPart>, Status> {
        self.client
            .clone()
            .pause_session(PauseSessionRequest {
                session_id: self.id().to_owned(),
                files_only: !self.keeps_memory(),
                keep_open: true,
            })
            .await
            .map(|r| r.into_inner())
    }

    /// Did `s`, the answer to a call in this session, come from losing the session: its
    /// runner down or gone mid-call (an Unknown the transport made counts too), or the runner
    /// no longer knowing the session (it restarted, or closed it)? Such a session can only be
    /// replaced.
    pub fn lost(&self, s: &Status) -> bool {
        crate::runner_gone(s)
            || (s.code() == Code::Unknown && crate::from_transport(s))
            || (s.code() == Code::NotFound
                && s.message().contains(&format!("session \"{}\"", self.id())))
    }

    /// Runs `bash -lc COMMAND` in `workdir` ("" = /workspace).
    pub async fn exec(
        &self,
        command: &str,
        timeout_ms: u64,
        workdir: &str,
    ) -> Result<ExecResult, Status> {
        self.client
            .clone()
            .exec(ExecRequest {
                session_id: self.id().to_owned(),
                command: command.to_owned(),
                timeout_ms,
                workdir: workdir.to_owned(),
                max_output_bytes: 0,
                detach: false,
            })
            .await
            .map(|r| r.into_inner())
    }

    /// Reads a workspace file; `max_bytes` 0 = the runner's cap.
    pub async fn read(&self, path: &str, max_bytes: u64) -> Result<ReadFileResponse, Status> {
        self.client
            .clone()
            .read_file(ReadFileRequest {
                session_id: self.id().to_owned(),
                path: path.to_owned(),
                max_bytes,
            })
            .await
            .map(|r| r.into_inner())
    }

    pub async fn write(
        &self,
        path: &str,
        content: Bytes,
        mode: WriteMode,
    ) -> Result<WriteFileResponse, Status> {
        self.client
            .clone()
            .write_file(WriteFileRequest {
                session_id: self.id().to_owned(),
                path: path.to_owned(),
                content,
                mode: mode as i32,
            })
            .await
            .map(|r| r.into_inner())
    }

    /// Files under `base_path` matching `pattern`; `truncated` when the runner's cap was hit.
    pub async fn glob(&self, pattern: &str, base_path: &str) -> Result<GlobResponse, Status> {
        self.client
            .clone()
            .glob(GlobRequest {
                session_id: self.id().to_owned(),
                pattern: pattern.to_owned(),
                base_path: base_path.to_owned(),
                max_results: 0,
            })
            .await
            .map(|r| r.into_inner())
    }

    pub async fn grep(
        &self,
        pattern: &str,
        path: &str,
        is_regex: bool,
        case_sensitive: bool,
        max_matches: u32,
    ) -> Result<GrepResponse, Status> {
        self.client
            .clone()
            .grep(GrepRequest {
                session_id: self.id().to_owned(),
                pattern: pattern.to_owned(),
                path: path.to_owned(),
                is_regex,
                case_sensitive,
                max_matches,
            })
            .await
            .map(|r| r.into_inner())
    }

    /// Packs the workspace and receives the whole archive (at most `max_bytes`), checking its
    /// size and sha256 against the runner's summary. `entry_mtime` (RFC 3339; empty: the
    /// files' own times) is given to every entry, so the same files pack to the same bytes.
    pub async fn pack(
        &self,
        format: ArchiveFormat,
        exclude_patterns: &[String],
        archive_name: &str,
        entry_mtime: &str,
        max_bytes: u64,
    ) -> Result<Packed, PackError> {
        let mut stream = self
            .client
            .clone()
            .pack(PackRequest {
                session_id: self.id().to_owned(),
                format: format as i32,
                exclude_patterns: exclude_patterns.to_vec(),
                archive_name: archive_name.to_owned(),
                max_archive_bytes: 0,
                entry_mtime: entry_mtime.to_owned(),
            })
            .await
            .map_err(PackError::Status)?
            .into_inner();
        let mut buf = BytesMut::new();
        let mut summary = None;
        while let Some(msg) = stream.message().await.map_err(PackError::Status)? {
            match msg.msg {
                Some(pack_response::Msg::Chunk(c)) => {
                    if (buf.len() + c.len()) as u64 > max_bytes {
                        return Err(PackError::TooLarge { max_bytes });
                    }
                    buf.extend_from_slice(&c);
                }
                Some(pack_response::Msg::Summary(s)) => summary = Some(s),
                None => {}
            }
        }
        let summary =
            summary.ok_or_else(|| PackError::Corrupt("the runner sent no pack summary".into()))?;
        let digest = summary.digest.clone().unwrap_or_default();
        let sha = cairn_sha256::sha256_hex(&buf);
        if digest.size_bytes != buf.len() as u64 || digest.sha256 != sha {
            return Err(PackError::Corrupt(format!(
                "the archive received ({} bytes, sha256 {sha}) differs from the runner's summary ({} bytes, sha256 {})",
                buf.len(),
                digest.size_bytes,
                digest.sha256
            )));
        }
        Ok(Packed {
            bytes: buf.freeze(),
            summary,
        })
    }

    /// Stops and removes the container and task directory. Ok(false): it was already gone.
    pub async fn close(mut self) -> Result<bool, Status> {
        self.open = false;
        self.client
            .clone()
            .close_session(CloseSessionRequest {
                session_id: self.id().to_owned(),
            })
            .await
            .map(|r| r.into_inner().closed)
    }

    /// Leaves the session open (`code_delivery.cleanup_on_finish = false`) and stops touching
    /// it: the runner removes it once idle (`[session] idle_timeout_ms`), at its shutdown or at
    /// its next start.
    pub fn keep(mut self) -> SessionInfo {
        self.open = false;
        self.info.clone()
    }
}

impl Drop for RunnerSession {
    fn drop(&mut self) {
        if let Some(k) = self.keepalive.take() {
            k.abort();
        }
        if self.open {
            close_in_background(self.client.clone(), self.info.session_id.clone());
        }
    }
}

/// Makes session `id` with `call` on the first runner of `rotation` that answers, moving on
/// while runners are gone (Unavailable, or the connection lost mid-call); any other refusal
/// ends it. A call dropped in flight, or lost with its connection, is followed by a
/// CloseSession of `id` in the background, in case the runner made the session.
async fn on_first_that_answers<F, Fut>(
    rotation: Vec<(String, Client)>,
    id: &str,
    what: &str,
    not_for_this_runner: fn(&Status) -> bool,
    mut call: F,
) -> Result<RunnerSession, Status>
where
    F: FnMut(Client) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<SessionInfo>, Status>>,
{
    let mut last = None;
    let mut refused = None;
    for (addr, client) in rotation {
        let mut guard = CloseOnDrop {
            client: client.clone(),
            id: id.to_owned(),
            armed: true,
        };
        let answer = call(client.clone()).await;
        match answer {
            Ok(info) => {
                // Opened: the session closes it from here.
                guard.armed = false;
                let info = info.into_inner();
                let keepalive = keep_touching(&client, &info);
                return Ok(RunnerSession {
                    client,
                    runner: addr,
                    info,
                    open: true,
                    keepalive,
                });
            }
            Err(s) if crate::runner_gone(&s) => {
                guard.armed = s.code() != Code::Unavailable;
                tracing::warn!(runner = %addr, error = %s.message(), "sandbox runner unavailable; {what} on the next one");
                last = Some(s);
            }
            Err(s) if not_for_this_runner(&s) => {
                // Refused by this runner only: nothing was made; another may take it.
                guard.armed = false;
                tracing::info!(runner = %addr, error = %s.message(), "sandbox runner refused; {what} on the next one");
                refused = Some(s);
            }
            Err(s) => {
                // Refused: nothing was made.
                guard.armed = false;
                return Err(s);
            }
        }
    }
    Err(last
        .or(refused)
        .unwrap_or_else(|| Status::unavailable("no sandbox runner answered")))
}

/// Touches the session three times per idle timeout until aborted or the session is gone
/// (none when the runner never closes idle sessions, or there is no runtime).
fn keep_touching(client: &Client, info: &SessionInfo) -> Option<tokio::task::AbortHandle> {
    if info.idle_timeout_ms == 0 {
        return None;
    }
    let handle = tokio::runtime::Handle::try_current().ok()?;
    let every = std::time::Duration::from_millis((info.idle_timeout_ms / 3).max(10));
    let mut client = client.clone();
    let id = info.session_id.clone();
    let task = handle.spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let touched = client
                .touch_session(TouchSessionRequest {
                    session_id: id.clone(),
                })
                .await;
            match touched {
                Ok(_) => {}
                Err(e) if e.code() == Code::NotFound => {
                    tracing::warn!(session_id = %id, error = %e.message(), "the sandbox session is gone; no longer touching it");
                    return;
                }
                // A runner briefly out of reach: the next touch may get through in time.
                Err(e) => {
                    tracing::warn!(session_id = %id, error = %e.message(), "touching the sandbox session failed")
                }
            }
        }
    });
    Some(task.abort_handle())
}

/// Closes a session id on drop while armed: an OpenSession dropped in flight.
struct CloseOnDrop {
    client: Client,
    id: String,
    armed: bool,
}

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        if self.armed {
            close_in_background(self.client.clone(), self.id.clone());
        }
    }
}

fn close_in_background(mut client: Client, id: String) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(session_id = %id, "no runtime to close the sandbox session; the runner removes it at its next start");
        return;
    };
    handle.spawn(async move {
        match client
            .close_session(CloseSessionRequest {
                session_id: id.clone(),
            })
            .await
        {
            Ok(_) => tracing::info!(session_id = %id, "sandbox session closed after its task ended early"),
            Err(e) => tracing::warn!(session_id = %id, error = %e.message(), "closing the sandbox session failed"),
        }
    });
}
