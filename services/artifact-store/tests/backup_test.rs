//! Online backup and restore, archived runs and retention, through real gRPC on loopback.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use cairn_proto::v1::{
    AppendEventsRequest, ArchiveRunRequest, BackupRequest, EventInput, ListProjectsRequest,
    ListRunSummariesRequest, RestoreRequest, RestoreResponse,
};
use common::*;
use futures::StreamExt;
use serde_json::json;
use tonic::{Code, Status};

fn event(kind: &str, data: serde_json::Value) -> EventInput {
    EventInput {
        r#type: kind.into(),
        data_json: data.to_string(),
        ..Default::default()
    }
}

async fn append(
    client: &mut Client,
    project: &str,
    run: &str,
    e: EventInput,
) -> Result<u64, Status> {
    client
        .append_events(AppendEventsRequest {
            project_id: project.into(),
            run_id: run.into(),
            events: vec![e],
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().last_seq)
}

async fn backup(client: &mut Client, project: &str) -> Result<Vec<u8>, Status> {
    let mut stream = client
        .backup(BackupRequest {
            project_id: project.into(),
        })
        .await?
        .into_inner();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        bytes.extend_from_slice(&chunk?.chunk);
    }
    Ok(bytes)
}

async fn restore(
    client: &mut Client,
    project: &str,
    bytes: &[u8],
) -> Result<RestoreResponse, Status> {
    let mut msgs = Vec::new();
    for (i, chunk) in bytes.chunks(256 << 10).enumerate() {
        msgs.push(RestoreRequest {
            chunk: Bytes::copy_from_slice(chunk),
            project_id: if i == 0 {
                project.into()
            } else {
                String::new()
            },
        });
    }
    client
        .restore(tokio_stream::iter(msgs))
        .await
        .map(|r| r.into_inner())
}

async fn projects(client: &mut Client) -> Vec<String> {
    client
        .list_projects(ListProjectsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .projects
        .into_iter()
        .map(|p| p.project_id)
        .collect()
}

fn file_body(writer: usize, i: u64) -> Vec<u8> {
    format!("writer {writer} file {i}\n")
        .repeat(1 + (i as usize % 50))
        .into_bytes()
}

/// A run with a graph, events and a state.json in `state` that folded in every event.
async fn make_run(client: &mut Client, project: &str, run: &str, state: &str, day: u32) {
    put(
        client,
        project,
        &format!(".cairn/runs/{run}/graph.resolved.json"),
        b"{\"nodes\":[]}",
    )
    .await
    .unwrap();
    let mut last = 0;
    for i in 0..5 {
        last = append(
            client,
            project,
            run,
            event("node.started", json!({ "i": i })),
        )
        .await
        .unwrap();
    }
    let state_json = json!({
        "run_id": run, "title": run, "goal": "g", "state": state,
        "created_at": format!("2026-03-{day:02}T10:00:00Z"),
        "updated_at": format!("2026-03-{day:02}T11:00:00Z"),
        "events_seq": last, "nodes": [],
    });
    put_overwrite(
        client,
        project,
        &format!(".cairn/runs/{run}/state.json"),
        state_json.to_string().as_bytes(),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_taken_during_a_write_storm_restores_a_consistent_point() {
    let source = serve().await;
    let mut client = source.client.clone();
    create_project(&mut client, "p").await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4usize {
        let (mut c, stop) = (source.client.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let run = format!("r{w}");
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) || i < 20 {
                i += 1;
                // A run's file first, then the event that stands on it.
                put(
                    &mut c,
                    "p",
                    &format!(".cairn/runs/{run}/files/f{i}.txt"),
                    &file_body(w, i),
                )
                .await
                .unwrap();
                let seq = append(
                    &mut c,
                    "p",
                    &run,
                    event("node.completed", json!({ "i": i })),
                )
                .await
                .unwrap();
                assert_eq!(seq, i);
                put_overwrite(
                    &mut c,
                    "p",
                    &format!("docs/shared-{w}.md"),
                    &file_body(w, i),
                )
                .await
                .unwrap();
            }
            i
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let bytes = backup(&mut client, "").await.unwrap();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }

    let target = serve().await;
    let mut restored = target.client.clone();
    let reply = restore(&mut restored, "", &bytes).await.unwrap();
    assert_eq!(reply.project_ids, ["p"]);
    let (mut some_events, mut cut) = (0, 0);
    for w in 0..4usize {
        let run = format!("r{w}");
        let finals = run_events(&mut client, "p", &run).await;
        let got = run_events(&mut restored, "p", &run).await;
        // A gap-free prefix of the final log, line for line.
        for (n, e) in got.iter().enumerate() {
            assert_eq!(e.seq, n as u64 + 1, "{run}");
            assert_eq!(e.line_json, finals[n].line_json, "{run}");
        }
        some_events += got.len();
        cut += usize::from(got.len() < finals.len());
        // Every event's file is in the backup, whole.
        for e in &got {
            let path = format!(".cairn/runs/{run}/files/f{}.txt", e.seq);
            let body = get(&mut restored, "p", &path).await.unwrap();
            assert_eq!(body, file_body(w, e.seq), "{path}");
        }
        let shared = get(&mut restored, "p", &format!("docs/shared-{w}.md"))
            .await
            .unwrap();
        assert!(String::from_utf8(shared)
            .unwrap()
            .starts_with(&format!("writer {w} file ")));
        // The restored run goes on from its last event.
        let next = append(&mut restored, "p", &run, event("node.started", json!({})))
            .await
            .unwrap();
        assert_eq!(next, got.len() as u64 + 1);
    }
    assert!(some_events > 0, "the backup began after the first events");
    assert!(cut > 0, "the writers went on after the backup");
}

#[tokio::test]
async fn restore_refuses_a_store_that_has_the_projects() {
    let source = serve().await;
    let mut client = source.client.clone();
    put(&mut client, "p", "docs/a.md", b"a").await.unwrap();
    put(&mut client, "q", "docs/b.md", b"b").await.unwrap();
    let bytes = backup(&mut client, "").await.unwrap();

    let target = serve().await;
    let mut other = target.client.clone();
    put(&mut other, "q", "docs/mine.md", b"mine").await.unwrap();
    let status = assert_refused(
        restore(&mut other, "", &bytes).await,
        Code::FailedPrecondition,
        "store_not_empty",
    );
    assert!(status.message().contains("--project"), "{status:?}");
    assert_eq!(get(&mut other, "q", "docs/mine.md").await.unwrap(), b"mine");
    // One project the store does not have is restored beside the others.
    let reply = restore(&mut other, "p", &bytes).await.unwrap();
    assert_eq!(reply.project_ids, ["p"]);
    assert_eq!(get(&mut other, "p", "docs/a.md").await.unwrap(), b"a");
    assert!(get(&mut other, "q", "docs/b.md").await.is_err());
    assert_refused(
        restore(&mut other, "p", &bytes).await,
        Code::FailedPrecondition,
        "store_not_empty",
    );
}

#[tokio::test]
async fn a_damaged_backup_restores_nothing() {
    let source = serve().await;
    let mut client = source.client.clone();
    for i in 0..40 {
        put(&mut client, "p", &format!("docs/{i}.md"), &file_body(0, i))
            .await
            .unwrap();
    }
    append(&mut client, "p", "r", event("node.started", json!({})))
        .await
        .unwrap();
    put(&mut client, "z", "docs/z.md", b"z").await.unwrap();
    let bytes = backup(&mut client, "").await.unwrap();
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x40;
    let truncated = &bytes[..bytes.len() * 2 / 3];
    for damaged in [&flipped[..], truncated] {
        let target = serve().await;
        let mut c = target.client.clone();
        let result = restore(&mut c, "", damaged).await;
        assert!(result.is_err(), "a damaged backup was restored");
        assert!(projects(&mut c).await.is_empty(), "{result:?}");
        let left: Vec<_> = std::fs::read_dir(&target.data_root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".cairn-tmp-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

#[tokio::test]
async fn an_archived_run_is_still_read_and_an_unfinished_one_is_refused() {
    let served = serve().await;
    let mut client = served.client.clone();
    make_run(&mut client, "p", "done", "completed", 1).await;
    make_run(&mut client, "p", "busy", "working", 2).await;
    let snapshot = ".cairn/runs/done/snapshots/cd-1/1.snap";
    put(&mut client, "p", snapshot, b"cairn-snapshot\n...")
        .await
        .unwrap();
    let before = run_events(&mut client, "p", "done").await;
    let archive = |run: &str| ArchiveRunRequest {
        project_id: "p".into(),
        run_id: run.into(),
    };
    assert_refused(
        client.archive_run(archive("busy")).await,
        Code::FailedPrecondition,
        "run_unfinished",
    );
    assert!(!served
        .project_dir("p")
        .join(".cairn/runs/busy/run.tar.gz")
        .exists());
    let reply = client
        .archive_run(archive("done"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.path, ".cairn/runs/done/run.tar.gz");
    let dir = served.project_dir("p").join(".cairn/runs/done");
    assert!(!dir.join("events.jsonl").exists() && dir.join("state.json").exists());
    // Its session snapshots are removed, not packed.
    assert!(!dir.join("snapshots/cd-1/1.snap").exists());
    assert!(get(&mut client, "p", snapshot).await.is_err());
    // What `cairn runs show` reads: the graph and the events, as before.
    assert_eq!(run_events(&mut client, "p", "done").await, before);
    let graph = get(&mut client, "p", ".cairn/runs/done/graph.resolved.json")
        .await
        .unwrap();
    assert_eq!(graph, b"{\"nodes\":[]}");
    let summaries = client
        .list_run_summaries(ListRunSummariesRequest {
            project_id: "p".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(summaries
        .runs
        .iter()
        .any(|r| r.run_id == "done" && r.state == "completed"));
    // It takes no more events, claims or writes.
    assert_refused(
        append(&mut client, "p", "done", event("node.started", json!({}))).await,
        Code::FailedPrecondition,
        "archived",
    );
    assert_refused(
        put(&mut client, "p", ".cairn/runs/done/x.txt", b"x").await,
        Code::FailedPrecondition,
        "archived",
    );
    assert_refused(
        client.archive_run(archive("done")).await,
        Code::FailedPrecondition,
        "archived",
    );
    // A backup carries the archive, and the restored run reads the same.
    let bytes = backup(&mut client, "p").await.unwrap();
    let target = serve().await;
    let mut restored = target.client.clone();
    restore(&mut restored, "", &bytes).await.unwrap();
    assert_eq!(run_events(&mut restored, "p", "done").await, before);
}

#[tokio::test]
async fn retention_archives_finished_runs_beyond_the_newest_and_never_unfinished_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = cairn_artifact_store::Config::new(tmp.path().join("data"));
    config.retention.keep_runs = 1;
    config.retention.sweep_interval_s = 1;
    let served = serve_with(config).await;
    let mut client = served.client.clone();
    make_run(&mut client, "p", "old", "failed", 1).await;
    make_run(&mut client, "p", "new", "completed", 2).await;
    make_run(&mut client, "p", "live", "working", 3).await;
    let before = run_events(&mut client, "p", "old").await;
    let runs = served.project_dir("p").join(".cairn/runs");
    let archived = runs.join("old/run.tar.gz");
    wait_until("the sweep archives the oldest finished run", || {
        archived.exists()
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(
        !runs.join("new/run.tar.gz").exists(),
        "the newest finished run is kept"
    );
    assert!(
        !runs.join("live/run.tar.gz").exists(),
        "an unfinished run is never archived"
    );
    assert_eq!(run_events(&mut client, "p", "old").await, before);
}

/// Bytes of the large file of the memory test: far more than the bound, incompressible.
const BIG: u64 = 96 << 20;
/// What archiving, reading or unarchiving that run may add to the store's resident memory.
const BOUND_KIB: u64 = 32 << 10;

/// Writes `BIG` pseudo-random bytes to `path` a MiB at a time; returns their sha256.
fn write_big(path: &std::path::Path) -> String {
    use sha2::Digest;
    use std::io::Write;
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let (mut gen, mut hasher) = (Bytegen::new(7), sha2::Sha256::new());
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..BIG >> 20 {
        gen.fill(&mut buf);
        hasher.update(&buf);
        file.write_all(&buf).unwrap();
    }
    file.flush().unwrap();
    hex::encode(hasher.finalize())
}

/// Gets a file, hashing it as it streams in: (Get's sha256, the bytes' sha256, their size).
async fn get_hashed(client: &mut Client, project: &str, path: &str) -> (String, String, u64) {
    use sha2::Digest;
    let mut stream = client
        .get(cairn_proto::v1::GetRequest {
            project_id: project.into(),
            path: path.into(),
            offset: 0,
            length: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let (mut info, mut hasher, mut size) = (String::new(), sha2::Sha256::new(), 0u64);
    while let Some(msg) = stream.next().await {
        match msg.unwrap().msg {
            Some(cairn_proto::v1::get_response::Msg::Info(i)) => info = i.sha256,
            Some(cairn_proto::v1::get_response::Msg::Chunk(c)) => {
                hasher.update(&c);
                size += c.len() as u64;
            }
            None => {}
        }
    }
    (info, hex::encode(hasher.finalize()), size)
}

/// A finished run whose records hold a 96 MiB file is archived, read from its archive and
/// unarchived by a store process whose resident memory grows by far less than the file
/// each time (the archive is written and read as a stream), and the bytes come back the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_a_large_file_is_archived_read_and_unarchived_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let store = Process::spawn(&data);
    let mut client = connect(&store.addr).await;
    make_run(&mut client, "p", "big", "completed", 1).await;
    let rel = ".cairn/runs/big/sandbox/blob.bin";
    let want = write_big(&data.join("projects/p").join(rel));
    let grown = |base: u64| store.peak_rss_kib().saturating_sub(base);

    let base = store.reset_peak_rss();
    let reply = client
        .archive_run(ArchiveRunRequest {
            project_id: "p".into(),
            run_id: "big".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let archiving = grown(base);
    assert!(
        reply.size_bytes > BIG,
        "incompressible bytes: {}",
        reply.size_bytes
    );
    assert!(!data.join("projects/p").join(rel).exists());

    let base = store.reset_peak_rss();
    let (said, got, size) = get_hashed(&mut client, "p", rel).await;
    let reading = grown(base);
    assert_eq!(
        (said.as_str(), got.as_str(), size),
        (want.as_str(), want.as_str(), BIG)
    );

    let base = store.reset_peak_rss();
    let back = client
        .unarchive_run(cairn_proto::v1::UnarchiveRunRequest {
            project_id: "p".into(),
            run_id: "big".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let unarchiving = grown(base);
    assert!(back.size_bytes > BIG, "{back:?}");
    assert_eq!(get_hashed(&mut client, "p", rel).await.1, want);
    println!(
        "peak resident memory added (KiB) for a {} MiB file: archive {archiving}, read {reading}, unarchive {unarchiving}",
        BIG >> 20
    );
    for (what, kib) in [
        ("archiving", archiving),
        ("reading from the archive", reading),
        ("unarchiving", unarchiving),
    ] {
        assert!(
            kib < BOUND_KIB,
            "{what} added {kib} KiB of resident memory (bound {BOUND_KIB} KiB)"
        );
    }
}

/// An unarchived run has its files on disk again, reads the same, and takes events, writes and
/// claims again (also after a second round trip); unarchiving a run that is not archived is
/// refused.
#[tokio::test]
async fn an_unarchived_run_reads_the_same_and_takes_writes_again() {
    let served = serve().await;
    let mut client = served.client.clone();
    make_run(&mut client, "p", "done", "completed", 1).await;
    let before = run_events(&mut client, "p", "done").await;
    let req = |run: &str| {
        (
            ArchiveRunRequest {
                project_id: "p".into(),
                run_id: run.into(),
            },
            cairn_proto::v1::UnarchiveRunRequest {
                project_id: "p".into(),
                run_id: run.into(),
            },
        )
    };
    assert_refused(
        client.unarchive_run(req("done").1).await,
        Code::FailedPrecondition,
        "not_archived",
    );
    client.archive_run(req("done").0).await.unwrap();
    let dir = served.project_dir("p").join(".cairn/runs/done");
    let back = client
        .unarchive_run(req("done").1)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(back.files, 3, "graph, events, state: {back:?}");
    assert!(dir.join("events.jsonl").exists() && !dir.join("run.tar.gz").exists());
    assert_eq!(run_events(&mut client, "p", "done").await, before);
    assert_eq!(
        get(&mut client, "p", ".cairn/runs/done/graph.resolved.json")
            .await
            .unwrap(),
        b"{\"nodes\":[]}"
    );
    // The round trip again: it packs and unpacks as the first time.
    client.archive_run(req("done").0).await.unwrap();
    client.unarchive_run(req("done").1).await.unwrap();
    assert_eq!(run_events(&mut client, "p", "done").await, before);
    // Writable again: an event (the next seq), a file, a claim.
    let seq = append(&mut client, "p", "done", event("human.note", json!({})))
        .await
        .unwrap();
    assert_eq!(seq, before.len() as u64 + 1);
    put(&mut client, "p", ".cairn/runs/done/x.txt", b"x")
        .await
        .unwrap();
    client
        .claim_run(cairn_proto::v1::ClaimRunRequest {
            project_id: "p".into(),
            run_id: "done".into(),
            holder: "test".into(),
        })
        .await
        .unwrap();
    assert_refused(
        client.unarchive_run(req("done").1).await,
        Code::FailedPrecondition,
        "not_archived",
    );
}

#[tokio::test]
async fn a_backup_naming_what_is_no_project_restores_nothing() {
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let list = json!({"format": 1, "created_at": "", "projects": {"../escape": []}}).to_string();
    let mut header = tar::Header::new_gnu();
    header.set_size(list.len() as u64);
    header.set_mode(0o644);
    tar.append_data(&mut header, "cairn-backup.json", list.as_bytes())
        .unwrap();
    let bytes = tar.into_inner().unwrap().finish().unwrap();
    let target = serve().await;
    let mut c = target.client.clone();
    assert_refused(
        restore(&mut c, "", &bytes).await,
        Code::DataLoss,
        "backup_corrupt",
    );
    assert!(projects(&mut c).await.is_empty());
    assert!(!target.data_root.join("escape").exists());
    assert!(!target.data_root.parent().unwrap().join("escape").exists());
}
