//! `cairn sandbox session ...`: sessions on a served runner, paused into snapshots kept in the
//! artifact-store at `.cairn/snapshots/<session>/<n>.snap` (put with their sha256, which the
//! store checks; read back and checked again before a resume), resumed or forked on any
//! runner of the same backend and image.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use cairn_proto::v1::{
    CloseSessionRequest, ExecRequest, FileInfo, GetRequest, OpenSessionRequest,
    PauseSessionRequest, PutHeader, StatRequest,
};
use cairn_runner_client::snapshot;
use cairn_sha256::Sha256;
use serde_json::json;
use tokio::io::AsyncSeekExt;

use crate::cli::{Global, SessionCommand};
use crate::embedded::{Needs, Services};
use crate::failure::{self, Failure};
use crate::{output, transfer};

/// Where the CLI keeps the snapshots of its sessions.
const SNAPSHOTS: &str = ".cairn/snapshots";

pub async fn run(global: &Global, cmd: SessionCommand) -> anyhow::Result<ExitCode> {
    if global.addr.is_none() && global.sandbox_addr.is_none() {
        anyhow::bail!(
            "a session lives in a served runner, not in this process: give --sandbox-addr (and --store-addr, or --addr for both)"
        );
    }
    let services = Services::open(global, Needs::default()).await?;
    let result = session(global, &services, cmd).await;
    services.close().await?;
    result
}

async fn session(
    global: &Global,
    services: &Services,
    cmd: SessionCommand,
) -> anyhow::Result<ExitCode> {
    let t0 = Instant::now();
    let mut runner = services.sandbox()?;
    match cmd {
        SessionCommand::Open { image, network } => {
            let info = runner
                .open_session(OpenSessionRequest {
                    image: image.unwrap_or_default(),
                    network,
                    ..Default::default()
                })
                .await?
                .into_inner();
            print_id(global, &info.session_id, t0)?;
        }
        SessionCommand::Exec {
            session,
            detach,
            timeout,
            command,
        } => {
            let timeout_ms = timeout.map(|s| (s * 1000.0).ceil() as u64).unwrap_or(0);
            let r = runner
                .exec(ExecRequest {
                    session_id: session,
                    command: command.join(" "),
                    timeout_ms,
                    detach,
                    ..Default::default()
                })
                .await?
                .into_inner();
            if global.json {
                output::json(&json!({
                    "exit_code": r.exit_code,
                    "stdout": String::from_utf8_lossy(&r.stdout),
                    "stderr": String::from_utf8_lossy(&r.stderr),
                }))?;
            } else {
                use std::io::Write;
                std::io::stdout()
                    .write_all(&r.stdout)
                    .unwrap_or_else(|e| output::stdout_failed(e));
                let _ = std::io::stderr().write_all(&r.stderr);
            }
            return Ok(ExitCode::from(u8::try_from(r.exit_code).unwrap_or(1)));
        }
        SessionCommand::Pause {
            session,
            files_only,
        } => {
            // A files-only pause keeps the session open until the store has the snapshot, so
            // a refusal (a full quota, a store away) loses nothing. Without --files-only the
            // runner ends the session (a memory checkpoint stops the sandbox), so a snapshot
            // the store refuses is kept on this machine instead.
            let stream = runner
                .pause_session(PauseSessionRequest {
                    session_id: session.clone(),
                    files_only,
                    keep_open: files_only,
                })
                .await?
                .into_inner();
            let local = tempfile::NamedTempFile::with_prefix("cairn-snapshot-")?;
            let mut file = tokio::fs::File::from_std(local.reopen()?);
            let saved = snapshot::save(stream, &mut file).await?;
            file.rewind().await?;
            let path = match store_snapshot(global, services, &session, &saved, file).await {
                Ok(path) => path,
                Err(e) if files_only => {
                    return Err(not_stored(
                        e,
                        format!("the session {session} stays open: free room in the store and pause it again, or close it"),
                    ))
                }
                Err(e) => {
                    let (_, kept) = local.keep()?;
                    return Err(not_stored(
                        e,
                        format!(
                            "the session {session} ended with its pause; its snapshot is kept at {}: once the store has room, `cairn store put {} {SNAPSHOTS}/{session}/<n>.snap`, then resume it from there",
                            kept.display(),
                            kept.display()
                        ),
                    ));
                }
            };
            if files_only {
                runner
                    .close_session(CloseSessionRequest {
                        session_id: session.clone(),
                    })
                    .await?;
            }
            let ms = t0.elapsed().as_millis() as u64;
            if global.json {
                output::json(&json!({
                    "snapshot": path,
                    "bytes": saved.file_bytes,
                    "memory": saved.header.memory,
                    "ms": ms,
                }))?;
            } else {
                println!(
                    "{path}  {}  {}  {ms} ms",
                    output::bytes(saved.file_bytes),
                    if saved.header.memory {
                        "memory and files"
                    } else {
                        "files only"
                    }
                );
            }
        }
        SessionCommand::Resume { snapshot } => {
            let file = fetch_snapshot(global, services, &snapshot).await?;
            let id = resume(&mut runner, &file).await?;
            print_id(global, &id, t0)?;
        }
        SessionCommand::Fork { snapshot, count } => {
            let file = fetch_snapshot(global, services, &snapshot).await?;
            let resumes = (0..count).map(|_| {
                let mut runner = runner.clone();
                let file = &file;
                async move { resume(&mut runner, file).await }
            });
            let sessions = futures::future::try_join_all(resumes).await?;
            if global.json {
                output::json(&json!({ "sessions": sessions }))?;
            } else {
                for id in &sessions {
                    println!("{id}");
                }
            }
        }
        SessionCommand::Close { session } => {
            let closed = runner
                .close_session(CloseSessionRequest {
                    session_id: session,
                })
                .await?
                .into_inner()
                .closed;
            if global.json {
                output::json(&json!({ "closed": closed }))?;
            } else {
                println!("{}", if closed { "closed" } else { "no such session" });
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_id(global: &Global, id: &str, t0: Instant) -> anyhow::Result<()> {
    if global.json {
        output::json(&json!({ "session_id": id, "ms": t0.elapsed().as_millis() as u64 }))
    } else {
        println!("{id}");
        Ok(())
    }
}

/// A snapshot the store did not take, in the CLI's words: the store's own, and `hint` (what
/// became of the session and of the snapshot).
fn not_stored(e: anyhow::Error, hint: String) -> anyhow::Error {
    let status = e.chain().find_map(|c| c.downcast_ref::<tonic::Status>());
    let reason = match status.and_then(cairn_proto::reason::of).as_deref() {
        Some("snapshot_quota") => "snapshot_quota",
        _ => "snapshot_not_stored",
    };
    let (message, exit) = match status {
        Some(s) => (format!("{e}: {}", s.message()), failure::exit_of(s.code())),
        None => (format!("{e:#}"), failure::exit::FAILED),
    };
    Failure {
        reason,
        message,
        hint: Some(hint),
        exit,
    }
    .into()
}

/// Puts a saved snapshot at the next free `<n>.snap` of the session, with its sha256 for
/// the store to check; returns the path.
async fn store_snapshot(
    global: &Global,
    services: &Services,
    session: &str,
    saved: &snapshot::Saved,
    file: tokio::fs::File,
) -> anyhow::Result<String> {
    let mut store = services.store()?;
    let project = global.project.clone();
    store
        .create_project(cairn_proto::v1::CreateProjectRequest {
            project_id: project.clone(),
        })
        .await?;
    let mut n = 1u32;
    let path = loop {
        let path = format!("{SNAPSHOTS}/{session}/{n}.snap");
        let stat = store
            .stat(StatRequest {
                project_id: project.clone(),
                path: path.clone(),
                include_sha256: false,
            })
            .await;
        match stat {
            Err(s) if s.code() == tonic::Code::NotFound => break path,
            Err(s) => return Err(s.into()),
            Ok(_) => n += 1,
        }
    };
    let header = PutHeader {
        project_id: project,
        path: path.clone(),
        expected_sha256: saved.file_sha256.clone(),
        expected_size: Some(saved.file_bytes),
        allowed_prefixes: vec![format!("{SNAPSHOTS}/")],
        ..Default::default()
    };
    transfer::put(&mut store, header, file)
        .await
        .with_context(|| format!("storing the snapshot at {path}"))?;
    Ok(path)
}

/// Reads a stored snapshot into a temporary file, checked against the store's sha256.
async fn fetch_snapshot(
    global: &Global,
    services: &Services,
    path: &str,
) -> anyhow::Result<tempfile::NamedTempFile> {
    let mut store = services.store()?;
    let file = tempfile::NamedTempFile::new()?;
    let mut out = tokio::fs::File::create(file.path()).await?;
    let info: FileInfo = transfer::get(
        &mut store,
        GetRequest {
            project_id: global.project.clone(),
            path: path.to_owned(),
            ..Default::default()
        },
        &mut out,
    )
    .await
    .with_context(|| format!("reading the snapshot {path} from the store"))?;
    let got = {
        let p = file.path().to_owned();
        tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            use std::io::Read;
            let (mut h, mut f) = (Sha256::new(), std::fs::File::open(p)?);
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    return Ok(h.finish_hex());
                }
                h.update(&buf[..n]);
            }
        })
        .await??
    };
    if !info.sha256.is_empty() && got != info.sha256 {
        anyhow::bail!(
            "the snapshot {path} read back with sha256 {got}, the store has {}: read it again",
            info.sha256
        );
    }
    Ok(file)
}

/// Streams a snapshot file to the runner as a new session; returns its id.
async fn resume(
    runner: &mut cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient<
        crate::embedded::Authed,
    >,
    file: &tempfile::NamedTempFile,
) -> anyhow::Result<String> {
    let mut reader = tokio::fs::File::open(file.path()).await?;
    let header = snapshot::read_header(&mut reader).await?;
    let info = runner
        .resume_session(snapshot::parts(header, reader, String::new()))
        .await?
        .into_inner();
    Ok(info.session_id)
}
