//! `cairn store put|get|ls|stat|events|backup|restore`: the artifact-store from the command
//! line.

use std::path::Path;
use std::process::ExitCode;

use cairn_proto::v1::{
    BackupRequest, EntryKind, FileInfo, GetRequest, ListRequest, PageRequest, PutHeader,
    ReadEventsRequest, RestoreRequest, StatRequest, WriteOutcome,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;

use crate::cli::{Global, StoreCommand};
use crate::embedded::{Needs, Services};
use crate::{output, transfer};

pub async fn run(global: &Global, cmd: StoreCommand) -> anyhow::Result<ExitCode> {
    let services = Services::open(global, Needs::default()).await?;
    let result = run_with(global, &services, cmd).await;
    services.close().await?;
    result
}

async fn run_with(
    global: &Global,
    services: &Services,
    cmd: StoreCommand,
) -> anyhow::Result<ExitCode> {
    let mut store = services.store()?;
    let project = global.project.clone();
    match cmd {
        StoreCommand::Put {
            local,
            path,
            overwrite,
            sha256,
        } => {
            let header = PutHeader {
                project_id: project,
                path,
                overwrite,
                expected_sha256: sha256.unwrap_or_default(),
                create_project: true,
                ..Default::default()
            };
            let response = if local.as_os_str() == "-" {
                transfer::put(&mut store, header, tokio::io::stdin()).await?
            } else {
                let file = tokio::fs::File::open(&local)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", local.display()))?;
                transfer::put(&mut store, header, file).await?
            };
            let outcome = outcome_word(response.outcome());
            let digest = response.digest.unwrap_or_default();
            if global.json {
                output::json(
                    &json!({"path": response.path, "sha256": digest.sha256, "size_bytes": digest.size_bytes, "outcome": outcome}),
                )?;
            } else {
                println!(
                    "{outcome} {} ({}, sha256 {})",
                    response.path,
                    output::bytes(digest.size_bytes),
                    digest.sha256
                );
            }
        }
        StoreCommand::Get {
            path,
            local,
            offset,
            length,
        } => {
            let request = GetRequest {
                project_id: project,
                path,
                offset,
                length,
            };
            match local.filter(|l| l.as_os_str() != "-") {
                Some(local) => {
                    let info = replace_whole(&local, async |file| {
                        transfer::get(&mut store, request, file).await
                    })
                    .await?;
                    if global.json {
                        output::json(&file_json(&info))?;
                    } else {
                        eprintln!(
                            "{} -> {} ({})",
                            info.path,
                            local.display(),
                            output::bytes(info.size_bytes)
                        );
                    }
                }
                None => {
                    transfer::get(&mut store, request, &mut tokio::io::stdout()).await?;
                }
            }
        }
        StoreCommand::Ls { prefix, recursive } => {
            let mut token = String::new();
            let mut all = Vec::new();
            let now = time::OffsetDateTime::now_utc();
            loop {
                let page = store
                    .list(ListRequest {
                        project_id: project.clone(),
                        prefix: prefix.clone(),
                        recursive,
                        page: Some(PageRequest {
                            page_size: 1000,
                            page_token: token,
                        }),
                    })
                    .await?
                    .into_inner();
                for entry in &page.entries {
                    if !global.json {
                        let kind = if entry.kind() == EntryKind::Directory {
                            "dir "
                        } else {
                            "file"
                        };
                        let (size, age) = if entry.kind() == EntryKind::File {
                            (
                                output::bytes(entry.size_bytes),
                                output::age(&entry.modified_at, now),
                            )
                        } else {
                            (String::new(), String::new())
                        };
                        println!("{kind} {size:>10} {age:>7}  {}", entry.path);
                    }
                }
                all.extend(page.entries);
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
            if global.json {
                output::json(&all.iter().map(file_json).collect::<Vec<_>>())?;
            }
        }
        StoreCommand::Stat { path } => {
            let info = store
                .stat(StatRequest {
                    project_id: project,
                    path,
                    include_sha256: true,
                })
                .await?
                .into_inner();
            if global.json {
                output::json(&file_json(&info))?;
            } else {
                println!(
                    "{}  {}  {}  sha256 {}  modified {}",
                    info.path,
                    kind_word(info.kind()),
                    output::bytes(info.size_bytes),
                    info.sha256,
                    info.modified_at
                );
            }
        }
        StoreCommand::Backup { out } => {
            let project = if project_named() {
                project
            } else {
                String::new()
            };
            let mut stream = store
                .backup(BackupRequest {
                    project_id: project.clone(),
                })
                .await?
                .into_inner();
            let size = replace_whole(&out, async |file| {
                let mut size = 0u64;
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk?.chunk;
                    size += chunk.len() as u64;
                    file.write_all(&chunk).await?;
                }
                file.sync_all().await?;
                anyhow::Ok(size)
            })
            .await?;
            let what = if project.is_empty() {
                "every project".to_owned()
            } else {
                format!("project {project}")
            };
            if global.json {
                output::json(&json!({"out": out, "size_bytes": size, "project": project}))?;
            } else {
                eprintln!(
                    "backup of {what} -> {} ({})",
                    out.display(),
                    output::bytes(size)
                );
            }
        }
        StoreCommand::Restore { file } => {
            let only = if project_named() {
                project
            } else {
                String::new()
            };
            let mut local = tokio::fs::File::open(&file)
                .await
                .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", file.display()))?;
            let (tx, rx) = tokio::sync::mpsc::channel::<RestoreRequest>(4);
            // The file is read beside the call; a read error ends the stream so nothing is restored.
            let pump = tokio::spawn(async move {
                let mut first = Some(only);
                loop {
                    let mut buf = vec![0u8; 1 << 20];
                    let n = local.read(&mut buf).await?;
                    if n == 0 && first.is_none() {
                        return Ok::<(), std::io::Error>(());
                    }
                    buf.truncate(n);
                    let msg = RestoreRequest {
                        chunk: buf.into(),
                        project_id: first.take().unwrap_or_default(),
                    };
                    if tx.send(msg).await.is_err() || n == 0 {
                        return Ok(());
                    }
                }
            });
            let reply = store
                .restore(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await;
            pump.await?
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
            let reply = reply?.into_inner();
            if global.json {
                output::json(
                    &json!({"projects": reply.project_ids, "files": reply.files, "size_bytes": reply.bytes}),
                )?;
            } else {
                println!(
                    "restored {} ({} files, {})",
                    reply.project_ids.join(", "),
                    reply.files,
                    output::bytes(reply.bytes)
                );
            }
        }
        StoreCommand::Events { run, from, follow } => {
            if follow {
                // Following a run that has no events yet waits for its first one: say so,
                // rather than wait silently on a mistyped id.
                let probe = store
                    .read_events(ReadEventsRequest {
                        project_id: project.clone(),
                        run_id: run.clone(),
                        from_seq: 1,
                        follow: false,
                        limit: 1,
                    })
                    .await;
                let missing = match probe {
                    Err(s) => s.code() == tonic::Code::NotFound,
                    Ok(r) => {
                        matches!(r.into_inner().next().await, Some(Err(s)) if s.code() == tonic::Code::NotFound)
                    }
                };
                if missing {
                    eprintln!("note: run {run:?} of project {project:?} has no events yet; waiting for its first one (Ctrl-C to stop; `cairn runs list` lists the runs)");
                }
            }
            let mut stream = store
                .read_events(ReadEventsRequest {
                    project_id: project,
                    run_id: run,
                    from_seq: from,
                    follow,
                    limit: 0,
                })
                .await?
                .into_inner();
            loop {
                let next = tokio::select! {
                    next = stream.next() => next,
                    () = cairn_server::shutdown_signal() => None,
                };
                let Some(event) = next else { break };
                let event = event?;
                if global.json {
                    println!("{}", event.line_json);
                } else {
                    println!(
                        "{:>5} {} {:<28} {} {}",
                        event.seq, event.ts, event.r#type, event.node_id, event.data_json
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `local` through `fill` beside it, then renames it into place: a failure leaves no
/// partial file.
async fn replace_whole<T>(
    local: &Path,
    fill: impl AsyncFnOnce(&mut tokio::fs::File) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let tmp = local.with_extension("cairn-partial");
    let mut file = tokio::fs::File::create(&tmp)
        .await
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", tmp.display()))?;
    let filled = fill(&mut file).await;
    drop(file);
    match filled {
        Ok(value) => {
            tokio::fs::rename(&tmp, local).await?;
            Ok(value)
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            Err(e)
        }
    }
}

/// Whether a project was named (`--project`, `-p` or CAIRN_PROJECT) rather than left at its
/// default: backups and restores then cover that project alone.
fn project_named() -> bool {
    std::env::var_os("CAIRN_PROJECT").is_some_and(|v| !v.is_empty())
        || std::env::args()
            .skip(1)
            .take_while(|a| a != "--")
            .any(|a| a == "-p" || a == "--project" || a.starts_with("--project="))
}

fn outcome_word(o: WriteOutcome) -> &'static str {
    match o {
        WriteOutcome::Created => "created",
        WriteOutcome::Unchanged => "unchanged",
        WriteOutcome::Overwritten => "overwritten",
        WriteOutcome::Unspecified => "written",
    }
}

fn kind_word(k: EntryKind) -> &'static str {
    match k {
        EntryKind::File => "file",
        EntryKind::Directory => "dir",
        EntryKind::Other => "other",
        EntryKind::Unspecified => "?",
    }
}

fn file_json(info: &FileInfo) -> serde_json::Value {
    json!({
        "path": info.path,
        "kind": kind_word(info.kind()),
        "size_bytes": info.size_bytes,
        "sha256": info.sha256,
        "modified_at": info.modified_at,
    })
}
