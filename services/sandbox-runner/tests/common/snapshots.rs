//! Sessions and their snapshots over a test runner's gRPC: open, exec, pause into a
//! snapshot file's bytes, resume (or fork) from them, and what a refused resume may leave.

use cairn_proto::{ExecRequest, ExecResult, OpenSessionRequest, PauseSessionRequest, SessionInfo};
use cairn_runner_client::snapshot;

use super::{gvisor_sandboxes, text, TestRunner};

pub async fn open(r: &TestRunner) -> String {
    r.client
        .clone()
        .open_session(OpenSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .session_id
}

pub async fn exec(r: &TestRunner, id: &str, command: &str, detach: bool) -> ExecResult {
    let out = r
        .client
        .clone()
        .exec(ExecRequest {
            session_id: id.into(),
            command: command.into(),
            detach,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.exit_code, 0, "{command}: {}", text(&out.stderr));
    out
}

/// Pauses `id` on `r`; returns the snapshot file's bytes and header.
pub async fn pause(
    r: &TestRunner,
    id: &str,
    files_only: bool,
) -> (Vec<u8>, cairn_proto::SnapshotHeader) {
    pause_with(r, id, files_only, false).await.unwrap()
}

/// [`pause`], as a checkpoint when `keep_open`.
pub async fn pause_with(
    r: &TestRunner,
    id: &str,
    files_only: bool,
    keep_open: bool,
) -> Result<(Vec<u8>, cairn_proto::SnapshotHeader), tonic::Status> {
    let stream = r
        .client
        .clone()
        .pause_session(PauseSessionRequest {
            session_id: id.into(),
            files_only,
            keep_open,
        })
        .await?
        .into_inner();
    let mut file = Vec::new();
    let saved = snapshot::save(stream, &mut file)
        .await
        .map_err(|e| match e {
            snapshot::SnapshotError::Rpc(s) => s,
            other => panic!("the snapshot stream was not one: {other}"),
        })?;
    assert_eq!(saved.file_bytes, file.len() as u64);
    Ok((file, saved.header))
}

pub async fn resume(r: &TestRunner, file: &[u8]) -> Result<SessionInfo, tonic::Status> {
    resume_copies(r, file, 1).await
}

/// A resume that asks for `copies` sessions (a fork) from one sending of the snapshot.
pub async fn resume_copies(
    r: &TestRunner,
    file: &[u8],
    copies: u32,
) -> Result<SessionInfo, tonic::Status> {
    let mut reader = std::io::Cursor::new(file.to_vec());
    let header = snapshot::read_header(&mut reader).await.unwrap();
    Ok(r.client
        .clone()
        .resume_session(snapshot::parts(header, reader, String::new(), copies))
        .await?
        .into_inner())
}

pub fn reason(s: &tonic::Status) -> String {
    cairn_proto::reason::of(s).unwrap_or_default()
}

pub async fn open_sessions(r: &TestRunner) -> u32 {
    r.info().await.open_sessions
}

/// What a refused resume may leave: nothing in the tasks directory, no session.
pub async fn assert_nothing_resumed(r: &TestRunner) {
    assert_eq!(open_sessions(r).await, 0);
    let left: Vec<_> = std::fs::read_dir(r.work_root.path().join("tasks"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(
        gvisor_sandboxes(r.work_root.path()).await.is_empty(),
        "a sandbox of a refused resume is left"
    );
}
