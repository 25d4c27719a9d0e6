//! Crash safety and shutdown: kill -9 during a large Put leaves the old content (or nothing)
//! and the start-up sweep removes the temp file; a graceful shutdown lets an in-flight Put
//! finish; a client that cancels mid-stream leaves nothing; kill -9 amid deferred Puts loses no
//! file that a recorded event names.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_artifact_store::Config;
use cairn_proto::v1::{put_request, PutHeader, PutRequest, WriteOutcome};
use common::*;
use futures::StreamExt;
use tokio::sync::mpsc;

const CHUNK: usize = 1 << 20;

fn chunk_msg(i: u64) -> PutRequest {
    let mut c = vec![(i % 251) as u8; CHUNK];
    c[..8].copy_from_slice(&i.to_le_bytes());
    PutRequest {
        msg: Some(put_request::Msg::Chunk(Bytes::from(c))),
    }
}

/// Starts a 512 MiB overwriting Put, kills the store with SIGKILL once 100 MiB are sent, and
/// checks the target before and after a restart.
async fn kill_during_put(previous: Option<&[u8]>) {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Process::spawn(tmp.path());
    let mut client = connect(&store.addr).await;
    let target = tmp.path().join("projects/p/workspace/model.bin");
    match previous {
        Some(old) => assert_eq!(
            outcome(
                &put(&mut client, "p", "workspace/model.bin", old)
                    .await
                    .unwrap()
            ),
            WriteOutcome::Created
        ),
        None => {
            create_project(&mut client, "p").await;
        }
    }

    let (tx, rx) = mpsc::channel::<PutRequest>(4);
    let header = PutHeader {
        overwrite: true,
        ..header("p", "workspace/model.bin")
    };
    let put = tokio::spawn(async move {
        client
            .put(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    tx.send(PutRequest {
        msg: Some(put_request::Msg::Header(header)),
    })
    .await
    .unwrap();
    for i in 0..100 {
        tx.send(chunk_msg(i)).await.unwrap();
    }
    // Wait until the store has written part of the body to its temp file.
    let pid = store.child.id();
    wait_until("a partial temp file", || {
        open_temp_files(pid, tmp.path())
            .first()
            .is_some_and(|(_, size)| *size > 0)
    })
    .await;
    let partial = open_temp_files(pid, tmp.path());
    assert!(
        partial.len() == 1 && partial[0].1 > 0 && partial[0].1 < 512 * CHUNK as u64,
        "one partial temp file is being written mid-Put: {partial:?}"
    );
    store.kill9();
    drop(tx);
    assert!(
        put.await.unwrap().is_err(),
        "the killed Put did not succeed"
    );

    let check_target = || match previous {
        Some(old) => assert_eq!(std::fs::read(&target).unwrap(), old, "old content intact"),
        None => assert!(!target.exists(), "nothing published"),
    };
    check_target();

    // Restart on the same data root: the sweep removes the temp file before serving.
    let store = Process::spawn(tmp.path());
    let mut client = connect(&store.addr).await;
    let listed = get(&mut client, "p", "workspace/model.bin").await;
    match previous {
        Some(old) => assert_eq!(listed.unwrap(), old),
        None => assert_eq!(listed.unwrap_err().code(), tonic::Code::NotFound),
    }
    assert_no_temp_files_stay(tmp.path(), "after the restart").await;
    check_target();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_an_overwrite_keeps_the_old_content() {
    kill_during_put(Some(&b"the old model\n".repeat(10_000))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_new_file_leaves_nothing() {
    kill_during_put(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_an_in_flight_put_finish() {
    let tmp = tempfile::tempdir().unwrap();
    let s = serve_with(Config::new(tmp.path())).await;
    let mut client = s.client.clone();
    let (tx, rx) = mpsc::channel::<PutRequest>(4);
    let put = tokio::spawn(async move {
        client
            .put(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    tx.send(PutRequest {
        msg: Some(put_request::Msg::Header(header("p", "docs/in-flight.bin"))),
    })
    .await
    .unwrap();
    for i in 0..20 {
        tx.send(chunk_msg(i)).await.unwrap();
    }
    let stopping = tokio::spawn(s.stop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !stopping.is_finished(),
        "shutdown waits for the in-flight Put"
    );
    for i in 20..40 {
        tx.send(chunk_msg(i)).await.unwrap();
    }
    drop(tx);
    let response = put.await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), stopping)
        .await
        .expect("shutdown completes")
        .unwrap();
    let target = tmp.path().join("projects/p/docs/in-flight.bin");
    match response {
        Ok(r) => {
            assert_eq!(r.into_inner().digest.unwrap().size_bytes, 40 * CHUNK as u64);
            let bytes = std::fs::read(&target).unwrap();
            assert_eq!(bytes.len(), 40 * CHUNK);
            assert_eq!(&bytes[39 * CHUNK..39 * CHUNK + 8], &39u64.to_le_bytes());
        }
        Err(status) => {
            assert!(!target.exists(), "a failed Put leaves nothing ({status:?})");
        }
    }
    assert!(temp_files(tmp.path()).is_empty());
    assert!(open_temp_files(std::process::id(), tmp.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cancelling_mid_stream_leaves_nothing() {
    let s = serve().await;
    let mut client = s.client.clone();
    let (tx, rx) = mpsc::channel::<PutRequest>(4);
    let put = tokio::spawn(async move {
        client
            .put(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    tx.send(PutRequest {
        // The size is announced, as cairn's clients do: a stream cut short is then refused
        // whether the transport resets it or (client task dropped) ends it cleanly.
        msg: Some(put_request::Msg::Header(PutHeader {
            expected_size: Some(20 * CHUNK as u64),
            ..header("p", "docs/cancelled.bin")
        })),
    })
    .await
    .unwrap();
    for i in 0..10 {
        tx.send(chunk_msg(i)).await.unwrap();
    }
    // (the store runs in this process)
    let writing = || open_temp_files(std::process::id(), &s.data_root);
    // Distinct files, judged on one sample: the store's writer threads use descriptors of the
    // file while it is written, and a second look, taken apart from the first, once saw none.
    let files = || {
        writing()
            .into_iter()
            .map(|(name, _)| name)
            .collect::<std::collections::BTreeSet<_>>()
    };
    wait_until("exactly one temp file being written by the Put", || {
        files().len() == 1
    })
    .await;
    put.abort();
    // The store notices the reset stream and drops the temp file (closed, and unlinked if named).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(temp_files(&s.data_root).is_empty() && writing().is_empty())
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        temp_files(&s.data_root).is_empty() && writing().is_empty(),
        "temp file removed after cancel"
    );
    assert!(!s.project_dir("p").join("docs/cancelled.bin").exists());
    drop(tx);
    // The store still serves.
    let mut client = s.client.clone();
    assert!(put_stream_ok(&mut client).await);
}

async fn put_stream_ok(client: &mut Client) -> bool {
    let msgs = vec![
        PutRequest {
            msg: Some(put_request::Msg::Header(header("p", "docs/after.txt"))),
        },
        chunk_msg(1),
    ];
    client
        .put(futures::stream::iter(msgs).boxed())
        .await
        .is_ok()
}

fn deferred_body(i: u64) -> Vec<u8> {
    format!("file {i}\n").repeat(400).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_amid_deferred_puts_loses_no_file_that_an_event_names() {
    // Writers put files with PUT_DURABILITY_WITH_RUN_EVENTS (the reply comes before the file
    // is published) and then record them in the run's events, as write_file nodes do. A kill
    // -9 at any moment may lose files no acknowledged event names yet, but every file an
    // event in the log names is there, whole; no file is ever partial and no temp file stays.
    // (The ordering itself, events after publications, is pinned deterministically by
    // write::tests::a_deferred_put_replies_before_publishing_and_readers_and_events_wait_for_it;
    // a kill lands in that microsecond window too rarely for this test to be its check.)
    use cairn_proto::v1::{AppendEventsRequest, EventInput, PutDurability};
    use std::sync::atomic::{AtomicU64, Ordering};
    // The kill comes a few batches in (not after a fixed time: a loaded machine may not have
    // recorded anything yet), then after a varying extra delay so it lands at other moments.
    for (round, delay_ms) in [0u64, 7, 40].into_iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = Process::spawn(tmp.path());
        let mut client = connect(&store.addr).await;
        create_project(&mut client, "p").await;
        let appended = Arc::new(AtomicU64::new(0));
        let mut writers = Vec::new();
        for w in 0..4u64 {
            let mut c = client.clone();
            let appended = appended.clone();
            writers.push(tokio::spawn(async move {
                for k in 0.. {
                    let ids = [w * 100_000 + 2 * k, w * 100_000 + 2 * k + 1];
                    for i in ids {
                        let h = PutHeader {
                            run_id: "r".into(),
                            durability: PutDurability::WithRunEvents as i32,
                            ..header("p", &format!("docs/f{i}.txt"))
                        };
                        if put_with(&mut c, h, &deferred_body(i)).await.is_err() {
                            return;
                        }
                    }
                    let event = EventInput {
                        r#type: "wrote".into(),
                        data_json: serde_json::json!({ "ids": ids }).to_string(),
                        ..Default::default()
                    };
                    let appended_now = c
                        .append_events(AppendEventsRequest {
                            project_id: "p".into(),
                            run_id: "r".into(),
                            events: vec![event],
                            ..Default::default()
                        })
                        .await;
                    if appended_now.is_err() {
                        return;
                    }
                    appended.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while appended.load(Ordering::SeqCst) < 8 {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: the writers recorded nothing within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        let acknowledged = appended.load(Ordering::SeqCst);
        store.kill9();
        for w in writers {
            w.await.unwrap();
        }

        let store = Process::spawn(tmp.path());
        let mut client = connect(&store.addr).await;
        let events = run_events(&mut client, "p", "r").await;
        assert!(
            events.len() as u64 >= acknowledged,
            "round {round}: {acknowledged} batches were acknowledged before the kill, {} survived",
            events.len()
        );
        let docs = tmp.path().join("projects/p/docs");
        for e in &events {
            let data: serde_json::Value = serde_json::from_str(&e.data_json).unwrap();
            for i in data["ids"].as_array().unwrap() {
                let i = i.as_u64().unwrap();
                let on_disk = std::fs::read(docs.join(format!("f{i}.txt"))).unwrap_or_else(|err| {
                    panic!("round {round}: event {} names f{i}: {err}", e.seq)
                });
                assert!(
                    on_disk == deferred_body(i),
                    "round {round}: f{i} is not whole"
                );
            }
        }
        for entry in std::fs::read_dir(&docs).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let i: u64 = name
                .strip_prefix('f')
                .and_then(|n| n.strip_suffix(".txt"))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("round {round}: unexpected {name}"));
            assert!(
                std::fs::read(entry.path()).unwrap() == deferred_body(i),
                "round {round}: {name} is partial"
            );
        }
        assert_no_temp_files_stay(tmp.path(), &format!("round {round}")).await;
    }
}
