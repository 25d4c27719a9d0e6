//! Idle follow streams cost bounded memory: the store process's resident memory grows by at
//! most a bounded amount per open follow stream, however many events each run had before.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::{AppendEventsRequest, EventInput, ReadEventsRequest};
use common::{connect, create_project, Process};

/// Follow streams opened, each on its own run.
const STREAMS: usize = 200;
/// Events in each run before it is followed (each about 1 KiB).
const EVENTS: usize = 300;
/// The bound per idle follow stream.
const MAX_PER_STREAM_KIB: u64 = 64;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_follow_streams_cost_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Process::spawn(&tmp.path().join("data"));
    let mut c = connect(&store.addr).await;
    create_project(&mut c, "p").await;
    let pad = "x".repeat(1000);
    for r in 0..STREAMS {
        let events = (0..EVENTS)
            .map(|_| EventInput {
                r#type: "node.output".into(),
                data_json: serde_json::json!({ "pad": pad }).to_string(),
                ..Default::default()
            })
            .collect();
        c.append_events(AppendEventsRequest {
            project_id: "p".into(),
            run_id: format!("r{r}"),
            events,
            epoch: 0,
            publication_tokens: Vec::new(),
            claim: String::new(),
        })
        .await
        .unwrap();
    }
    // A fresh process: following a run opens its log, as after any restart.
    store.kill9();
    let store = Process::spawn(&tmp.path().join("data"));
    let mut c = connect(&store.addr).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let before = rss_kib(store.child.id());
    let mut streams = Vec::new();
    for r in 0..STREAMS {
        // From the end: idle streams that read nothing but wait for new events.
        let s = c
            .read_events(ReadEventsRequest {
                project_id: "p".into(),
                run_id: format!("r{r}"),
                from_seq: EVENTS as u64 + 1,
                follow: true,
                limit: 0,
            })
            .await
            .unwrap()
            .into_inner();
        streams.push(s);
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let after = rss_kib(store.child.id());
    let per_stream = after.saturating_sub(before) / STREAMS as u64;
    println!("idle follow streams: {STREAMS}, RSS {before} KiB -> {after} KiB, {per_stream} KiB per stream");
    assert!(
        per_stream <= MAX_PER_STREAM_KIB,
        "{per_stream} KiB per idle follow stream (RSS {before} -> {after} KiB)"
    );
    drop(streams);
}
