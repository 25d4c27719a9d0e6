//! `cairn sandbox session ...`: sessions on a served runner, paused into snapshots kept in the
//! artifact-store at `.cairn/snapshots/<session>/<n>.snap` (put with their sha256, which the
//! store checks; read back and checked again before a resume), resumed or forked on any
//! runner of the same backend and image.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use cairn_proto::v1::{
    snapshot_part, CloseSessionRequest, ExecRequest, GetRequest, OpenSessionRequest,
    PauseSessionRequest, PutHeader, SnapshotHeader, SnapshotPart, StatRequest,
};
use cairn_runner_client::snapshot;
use serde_json::json;

use crate::cli::{Global, SessionCommand};
use crate::embedded::{Needs, Services};
use crate::failure::{self, Failure};
use crate::output;

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
/// bytes arrive, while also writing them to a local file. The store publishes it only once
/// the payload matched the size and sha256 the runner sent after it (the Put's PutEnd goes
/// only then): a damaged or short snapshot is never stored.
async fn pause(
    global: &Global,
    services: &Services,
    runner: &mut Runner,
    session: &str,
    files_only: bool,
) -> anyhow::Result<Paused> {
    use cairn_proto::v1::{put_request, PutEnd, PutRequest};
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
    let mut header = match stream.message().await? {
        Some(SnapshotPart {
            msg: Some(snapshot_part::Msg::Header(h)),
            ..
        }) => h,
        _ => anyhow::bail!("the runner's snapshot stream did not start with its header"),
    };
    let head = snapshot::prefix(&header);
    let with_trailer = header.sha256.is_empty();
    let local = tempfile::NamedTempFile::with_prefix("cairn-snapshot-")?;
    // The local copy is written and the payload hashed on a thread of their own, beside the
    // bytes' way into the store.
    let (to_disk, mut from_stream) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    let disk = {
        use std::io::Write;
        let (mut file, head) = (local.reopen()?, head.clone());
        tokio::task::spawn_blocking(move || -> std::io::Result<snapshot::Check> {
            file.write_all(&head)?;
            let mut file = std::io::BufWriter::with_capacity(1 << 20, file);
            let mut check = snapshot::Check::new();
            while let Some(c) = from_stream.blocking_recv() {
                // Bytes after the end are refused by `finish` below.
                let _ = check.chunk(&c);
                file.write_all(&c)?;
            }
            file.flush()?;
            Ok(check)
        })
    };
    let (into_store, from_here) = tokio::sync::mpsc::channel::<PutRequest>(16);
    let put = path.map(|path| {
        let header = PutHeader {
            project_id: global.project.clone(),
            path: path.clone(),
            allowed_prefixes: vec![format!("{SNAPSHOTS}/")],
            digest_at_end: true,
            ..Default::default()
        };
        let store = services.store();
        tokio::spawn(async move {
            let first = PutRequest {
                msg: Some(put_request::Msg::Header(header)),
            };
            let requests = futures::StreamExt::chain(
                futures::stream::iter([first]),
                tokio_stream::wrappers::ReceiverStream::new(from_here),
            );
            store?
                .put(requests)
                .await
                .with_context(|| format!("storing the snapshot at {path}"))
                .map(|_| path)
        })
    });
    // False once the store stopped reading (its answer says why).
    let mut feeding = put.is_ok();
    let mut end = None;
    let chunk = |c: bytes::Bytes| PutRequest {
        msg: Some(put_request::Msg::Chunk(c)),
    };
    feeding = feeding && into_store.send(chunk(head.clone().into())).await.is_ok();
    while let Some(part) = stream.message().await? {
        match part.msg {
            Some(snapshot_part::Msg::Chunk(c)) => {
                if end.is_some() {
                    anyhow::bail!("the runner sent snapshot bytes after the snapshot's end");
                }
                if to_disk.send(c.clone()).await.is_err() {
                    break; // the local file failed: its error is below
                }
                feeding = feeding && into_store.send(chunk(c)).await.is_ok();
            }
            Some(snapshot_part::Msg::End(e)) => end = Some(e),
            _ => {}
        }
    }
    drop(to_disk);
    let mut check = disk
        .await
        .map_err(|e| anyhow::anyhow!("the snapshot's local copy failed: {e}"))?
        .context("writing the snapshot's local copy")?;
    if let Some(e) = end {
        check.end(e)?;
    }
    // Not matched: the Put ends without its PutEnd, and the store publishes nothing.
    let matched = check
        .finish(&mut header)
        .map_err(|e| anyhow::anyhow!("{e}: it was damaged on its way, and nothing was stored"))?;
    let mut bytes = head.len() as u64 + matched.size_bytes;
    if with_trailer {
        use std::io::Write;
        let t = snapshot::trailer(&matched).context("the snapshot's sha256 is not hex")?;
        std::fs::OpenOptions::new()
            .append(true)
            .open(local.path())?
            .write_all(&t)?;
        feeding = feeding && into_store.send(chunk(t.clone().into())).await.is_ok();
        bytes += t.len() as u64;
    }
    if feeding {
        let end = PutEnd {
            sha256: String::new(),
            size_bytes: bytes,
        };
        let _ = into_store
            .send(PutRequest {
                msg: Some(put_request::Msg::End(end)),
            })
            .await;
    }
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
    let stream = store
        .get(GetRequest {
            project_id: global.project.clone(),
            path: path.to_owned(),
            ..Default::default()
        })
        .await
        .with_context(|| format!("reading the snapshot {path} from the store"))?
        .into_inner();
    let body = cairn_store_client::streamed::checked(stream, None, format!("the snapshot {path}"));
    let mut reader = tokio_util::io::StreamReader::new(Box::pin(body));
    let header = snapshot::read_header(&mut reader).await?;
    let failure = snapshot::ReadFailure::default();
    let parts = snapshot::parts_reporting(header, reader, String::new(), copies, failure.clone());
    // The store's side first: a snapshot that failed its check explains a refused resume.
    let info = match runner.resume_session(parts).await {
        Ok(info) => info.into_inner(),
        Err(s) => match failure.get() {
            Some(why) => anyhow::bail!("{why}: read it again"),
            None => return Err(s.into()),
        },
    };
    let mut ids = vec![info.session_id];
    ids.extend(info.copies.into_iter().map(|c| c.session_id));
    Ok(ids)
}
