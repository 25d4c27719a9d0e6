//! WatchRun in follow mode (`follow_after_end`): one stream carries a run through its failure,
//! a resume and its completion, and stays open afterwards until the client leaves.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use cairn_proto::v1::{Event, RunActionRequest, TaskState, WatchRunRequest};
use common::*;

/// The stream's next event (20 s at most); the stream must still be open.
async fn next(stream: &mut tonic::Streaming<Event>) -> Event {
    tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .expect("an event within 20 s")
        .unwrap()
        .expect("the stream is still open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_run_follows_a_failed_run_through_its_resume() {
    let s = Stack::start(Options::default()).await;
    // Fails until docs/later.txt exists; ResumeRun then retries the failed node.
    let graph =
        "nodes:\n  - {id: r, type: tool_call, tool: read_file, args: {path: docs/later.txt}}\n";
    let run = s.submit(graph, &[]).await.unwrap().run_id;
    let mut stream = s
        .client
        .clone()
        .watch_run(WatchRunRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            from_seq: 1,
            follow_after_end: true,
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    loop {
        let e = next(&mut stream).await;
        seen.push((e.seq, e.r#type.clone()));
        if e.r#type == "task.failed" {
            break;
        }
    }
    s.wait_state(&run, TaskState::Failed, 20).await;
    put_file(&s.store, "docs/later.txt", b"now here").await;
    s.client
        .clone()
        .resume_run(RunActionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            by: "carol".into(),
            reason: "file added".into(),
        })
        .await
        .unwrap();
    loop {
        let e = next(&mut stream).await;
        seen.push((e.seq, e.r#type.clone()));
        if e.r#type == "task.completed" {
            break;
        }
    }
    let types: Vec<&str> = seen.iter().map(|(_, t)| t.as_str()).collect();
    let resumed = types.iter().position(|t| *t == "task.resumed");
    assert!(
        resumed.is_some_and(|r| r > types.iter().position(|t| *t == "task.failed").unwrap()),
        "the resume comes after the failure on the same stream: {types:?}"
    );
    // Every event of the store, in order, without a gap or a repeat.
    let stored: Vec<(u64, String)> = s
        .events(&run)
        .await
        .into_iter()
        .map(|e| (e.seq, e.r#type))
        .collect();
    assert_eq!(seen, stored[..seen.len()].to_vec());
    assert_eq!(seen.len(), stored.len(), "{seen:?}\n{stored:?}");
    // Still open after the second end.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), stream.message())
            .await
            .is_err(),
        "the stream stays open until the client leaves"
    );
    drop(stream);

    // Without follow, a watch of the finished run from its start reads through its earlier
    // end (task.failed) to the log's end, then ends.
    let mut replay = s
        .client
        .clone()
        .watch_run(WatchRunRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            from_seq: 1,
            follow_after_end: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut all = Vec::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(20), replay.message())
        .await
        .expect("the stream ends within 20 s")
        .unwrap()
    {
        all.push((e.seq, e.r#type));
    }
    assert_eq!(
        all, stored,
        "a non-following watch of an ended run reads every event"
    );
    s.stop().await;
}
