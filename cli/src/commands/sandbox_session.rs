//! `cairn sandbox session ...`: sessions on a served runner, paused into snapshots kept in the
//! artifact-store at `.cairn/snapshots/<session>/<n>.snap` (put with their sha256, which the
//! store checks; read back and checked again before a resume), resumed or forked on any
//! runner of the same backend and image.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use cairn_proto::v1::{
    get_response, snapshot_part, CloseSessionRequest, ExecRequest, FileInfo, GetRequest,
    OpenSessionRequest, PauseSessionRequest, PutHeader, SnapshotHeader, SnapshotPart, StatRequest,
};
use cairn_runner_client::snapshot;
use cairn_sha256::Sha256;
use serde_json::json;

use crate::cli::{Global, SessionCommand};
use crate::embedded::{Needs, Services};
use crate::failure::{self, Failure};
use crate::{output, transfer};

type Runner = cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient<crate::embedded::Authed>;

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
            let paused = pause(global, services, &mut runner, &session, files_only).await?;
            let path = match paused.stored {
                Ok(path) => path,
                Err(e) if files_only => {
                    return Err(not_stored(
                        e,
                        format!("the session {session} stays open: free room in the store and pause it again, or close it"),
                    ))
                }
                Err(e) => {
                    let (_, kept) = paused.local.keep()?;
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
                    "bytes": paused.bytes,
                    "memory": paused.header.memory,
                    "ms": ms,
                }))?;
            } else {
                println!(
                    "{path}  {}  {}  {ms} ms",
                    output::bytes(paused.bytes),
                    if paused.header.memory {
                        "memory and files"
                    } else {
                        "files only"
                    }
                );
            }
        }
        SessionCommand::Resume { snapshot } => {
            let id = resume(global, services, &mut runner, &snapshot, 1)
                .await?
                .remove(0);
            print_id(global, &id, t0)?;
        }
        SessionCommand::Fork { snapshot, count } => {
            let sessions = resume(global, services, &mut runner, &snapshot, count).await?;
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

/// A pause as the CLI delivered it.
struct Paused {
    header: SnapshotHeader,
    /// Bytes of the snapshot file (header and payload).
    bytes: u64,
    /// The store path it was put at, or why the store does not have it.
    stored: anyhow::Result<String>,
    /// The same file on this machine, kept when the store did not take it.
    local: tempfile::NamedTempFile,
}

/// Pauses `session` and puts its snapshot at the next free `<n>.snap` of the session as the
/// bytes arrive, while also writing them to a local file. The store gets the file's size
/// up front and its last chunk only once the payload matched the runner's header (size and
/// sha256): a damaged snapshot arrives short, and the store publishes nothing.
async fn pause(
    global: &Global,
    services: &Services,
    runner: &mut Runner,
    session: &str,
    files_only: bool,
) -> anyhow::Result<Paused> {
    use tokio::io::AsyncWriteExt;
    // A files-only pause keeps the session open until the store has the snapshot, so a
    // refusal loses nothing; a memory checkpoint ends the session.
    let request = PauseSessionRequest {
        session_id: session.to_owned(),
        files_only,
        keep_open: files_only,
    };
    let (paused, path) = tokio::join!(
        runner.pause_session(request),
        next_snapshot_path(global, services, session)
    );
    let mut stream = paused?.into_inner();
    let header = match stream.message().await? {
        Some(SnapshotPart {
            msg: Some(snapshot_part::Msg::Header(h)),
            ..
        }) => h,
        _ => anyhow::bail!("the runner's snapshot stream did not start with its header"),
    };
    let head = snapshot::prefix(&header);
    let bytes = head.len() as u64 + header.size_bytes;
    let local = tempfile::NamedTempFile::with_prefix("cairn-snapshot-")?;
    // The local copy is written and the payload hashed on a thread of their own, beside the
    // bytes' way into the store.
    let (to_disk, mut from_stream) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    let disk = {
        use std::io::Write;
        let (mut file, head) = (local.reopen()?, head.clone());
        tokio::task::spawn_blocking(move || -> std::io::Result<(String, u64)> {
            file.write_all(&head)?;
            let mut file = std::io::BufWriter::with_capacity(1 << 20, file);
            let (mut hash, mut size) = (Sha256::new(), 0u64);
            while let Some(c) = from_stream.blocking_recv() {
                hash.update(&c);
                size += c.len() as u64;
                file.write_all(&c)?;
            }
            file.flush()?;
            Ok((hash.finish_hex(), size))
        })
    };
    let (mut into_store, from_here) = tokio::io::duplex(4 << 20);
    let put = path.map(|path| {
        let header = PutHeader {
            project_id: global.project.clone(),
            path: path.clone(),
            expected_size: Some(bytes),
            allowed_prefixes: vec![format!("{SNAPSHOTS}/")],
            ..Default::default()
        };
        let store = services.store();
        tokio::spawn(async move {
            transfer::put(&mut store?, header, from_here)
                .await
                .with_context(|| format!("storing the snapshot at {path}"))
                .map(|_| path)
        })
    });
    // False once the store stopped reading (its answer says why).
    let mut feeding = put.is_ok() && into_store.write_all(&head).await.is_ok();
    let mut held = None::<bytes::Bytes>;
    while let Some(part) = stream.message().await? {
        if let Some(snapshot_part::Msg::Chunk(c)) = part.msg {
            if to_disk.send(c.clone()).await.is_err() {
                break; // the local file failed: its error is below
            }
            if let Some(prev) = held.replace(c) {
                feeding = feeding && into_store.write_all(&prev).await.is_ok();
            }
        }
    }
    drop(to_disk);
    let (sha, size) = disk
        .await
        .map_err(|e| anyhow::anyhow!("the snapshot's local copy failed: {e}"))?
        .context("writing the snapshot's local copy")?;
    if size != header.size_bytes || sha != header.sha256 {
        anyhow::bail!(
            "the snapshot arrived as {size} bytes with sha256 {sha}; its header says {} bytes with sha256 {}: it was damaged on its way, and nothing was stored",
            header.size_bytes,
            header.sha256
        );
    }
    if let (Some(last), true) = (held, feeding) {
        let _ = into_store.write_all(&last).await;
    }
    let _ = into_store.shutdown().await;
    drop(into_store);
    let stored = match put {
        Ok(task) => task
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("the snapshot storing task failed: {e}"))),
        Err(e) => Err(e),
    };
    Ok(Paused {
        header,
        bytes,
        stored,
        local,
    })
}

/// The next free `<n>.snap` of the session in the store (its project made if missing).
async fn next_snapshot_path(
    global: &Global,
    services: &Services,
    session: &str,
) -> anyhow::Result<String> {
    let mut store = services.store()?;
    let project = global.project.clone();
    store
        .create_project(cairn_proto::v1::CreateProjectRequest {
            project_id: project.clone(),
        })
        .await?;
    let mut n = 1u32;
    loop {
        let path = format!("{SNAPSHOTS}/{session}/{n}.snap");
        let stat = store
            .stat(StatRequest {
                project_id: project.clone(),
                path: path.clone(),
                include_sha256: false,
            })
            .await;
        match stat {
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(path),
            Err(s) => return Err(s.into()),
            Ok(_) => n += 1,
        }
    }
}

/// Streams the stored snapshot at `path` from the store to the runner, which opens `copies`
/// sessions from it; returns their ids. The bytes pass through as they arrive; the last
/// chunk is held back until the whole file matched the store's sha256, so a snapshot
/// damaged on its way reaches the runner cut short, and the runner resumes nothing.
async fn resume(
    global: &Global,
    services: &Services,
    runner: &mut Runner,
    path: &str,
    copies: u32,
) -> anyhow::Result<Vec<String>> {
    let mut store = services.store()?;
    let mut stream = store
        .get(GetRequest {
            project_id: global.project.clone(),
            path: path.to_owned(),
            ..Default::default()
        })
        .await
        .with_context(|| format!("reading the snapshot {path} from the store"))?
        .into_inner();
    let (mut into_runner, from_store) = tokio::io::duplex(4 << 20);
    let shown = path.to_owned();
    let pump = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let (mut hash, mut info, mut held) = (Sha256::new(), None, None::<bytes::Bytes>);
        while let Some(msg) = stream.message().await? {
            match msg.msg {
                Some(get_response::Msg::Info(i)) => info = Some(i),
                Some(get_response::Msg::Chunk(c)) => {
                    hash.update(&c);
                    if let Some(prev) = held.replace(c) {
                        // The runner stopped reading: its answer says why.
                        if into_runner.write_all(&prev).await.is_err() {
                            return Ok(());
                        }
                    }
                }
                None => {}
            }
        }
        let info: FileInfo = info.context("the store sent no file header")?;
        let got = hash.finish_hex();
        if !info.sha256.is_empty() && got != info.sha256 {
            anyhow::bail!(
                "the snapshot {shown} read back with sha256 {got}, the store has {}: read it again",
                info.sha256
            );
        }
        if let Some(last) = held {
            let _ = into_runner.write_all(&last).await;
        }
        let _ = into_runner.shutdown().await;
        Ok::<(), anyhow::Error>(())
    });
    let resumed = async {
        let mut reader = from_store;
        let header = snapshot::read_header(&mut reader).await?;
        let info = runner
            .resume_session(snapshot::parts(header, reader, String::new(), copies))
            .await?
            .into_inner();
        let mut ids = vec![info.session_id];
        ids.extend(info.copies.into_iter().map(|c| c.session_id));
        anyhow::Ok(ids)
    }
    .await;
    // The store's side first: a snapshot that failed its check explains a refused resume.
    match pump.await {
        Ok(Err(e)) => Err(e).with_context(|| format!("reading the snapshot {path} from the store")),
        Err(e) => anyhow::bail!("the snapshot reading task failed: {e}"),
        Ok(Ok(())) => resumed,
    }
}
