//! The RPCs not covered elsewhere: WatchRun (live, then ending with the run, or following on),
//! ListRuns paging, NotFound, and the per-node deadline against a service that never answers.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use cairn_proto::v1::ingest_server::{Ingest, IngestServer};
use cairn_proto::v1::{
    GetEnabledRequest, GetRunRequest, IngestRequest, IngestResponse, ListRunsRequest, PageRequest,
    SetEnabledRequest, SetEnabledResponse, TaskState, WatchRunRequest,
};
use common::*;
use tonic::{Code, Request, Response, Status};

/// A watch started while a short run ends (between the service's looks at the run) still ends
/// with the run, whatever moment it starts at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_started_as_the_run_ends_ends_with_it() {
    let s = Stack::start(Options::default()).await;
    let graph =
        "nodes:\n  - {id: a, type: write_file, path: 'docs/{{run_id}}/a.txt', content: a}\n";
    for i in 0..30 {
        let run = s.submit(graph, &[]).await.unwrap().run_id;
        if i % 3 == 1 {
            tokio::time::sleep(Duration::from_millis(i)).await;
        }
        let mut stream = s
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
        let mut last = String::new();
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(e) = stream.message().await.unwrap() {
                last = e.r#type;
            }
        })
        .await;
        assert!(
            ended.is_ok(),
            "run {i}: the watch did not end with the run (last {last})"
        );
        assert_eq!(last, "task.completed", "run {i}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_run_streams_live_until_the_run_ends() {
    let s = Stack::start(Options::default()).await;
    let graph = "nodes:\n  - {id: a, type: write_file, path: 'docs/{{run_id}}/a.txt', content: a}\n  - {id: g, type: gate, needs: [a]}\n  - {id: b, type: write_file, path: 'docs/{{run_id}}/b.txt', content: b, needs: [g]}\n";
    let run = s.submit(graph, &[]).await.unwrap().run_id;
    let mut stream = s
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
    // Live: the gate blocks, then a decision made while watching arrives on the stream.
    let mut seen = Vec::new();
    while let Some(e) = stream.message().await.unwrap() {
        seen.push(e.r#type.clone());
        if e.r#type == "gate.blocked" {
            break;
        }
    }
    s.client
        .clone()
        .approve_gate(cairn_proto::v1::GateDecisionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            gate_id: "g".into(),
            by: "ann".into(),
            note: String::new(),
        })
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(e) = stream.message().await.unwrap() {
            seen.push(e.r#type.clone());
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stream ends after task.completed: {seen:?}"
    );
    assert_eq!(seen.first().map(String::as_str), Some("task.created"));
    assert_eq!(seen.last().map(String::as_str), Some("task.completed"));
    assert!(seen.contains(&"gate.approved".to_owned()));

    // From a later sequence number, after the end: only the tail, then the end.
    let all = s.events(&run).await;
    let from = all.len() as u64 - 1;
    let mut stream = s
        .client
        .clone()
        .watch_run(WatchRunRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            from_seq: from,
            follow_after_end: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut tail = Vec::new();
    while let Some(e) = stream.message().await.unwrap() {
        tail.push(e.seq);
    }
    assert_eq!(tail, vec![from, from + 1]);

    // follow_after_end keeps the stream open.
    let mut stream = s
        .client
        .clone()
        .watch_run(WatchRunRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            from_seq: from + 1,
            follow_after_end: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().seq, from + 1);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.message())
            .await
            .is_err(),
        "still open"
    );

    let e = s
        .client
        .clone()
        .watch_run(WatchRunRequest {
            project_id: PROJECT.into(),
            run_id: "nope".into(),
            from_seq: 1,
            follow_after_end: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = s
        .client
        .clone()
        .get_run(GetRunRequest {
            project_id: PROJECT.into(),
            run_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_runs_pages_newest_first_and_filters() {
    let s = Stack::start(Options::default()).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let run = s
            .submit(
                "nodes:\n  - {id: a, type: write_file, path: 'docs/{{run_id}}.txt', content: a}\n",
                &[],
            )
            .await
            .unwrap()
            .run_id;
        s.wait_state(&run, TaskState::Completed, 20).await;
        ids.push(run);
    }
    let blocked = s
        .submit("nodes:\n  - {id: g, type: gate}\n", &[])
        .await
        .unwrap()
        .run_id;
    s.wait_state(&blocked, TaskState::InputRequired, 20).await;
    let mut got = Vec::new();
    let mut token = String::new();
    loop {
        let page = s
            .client
            .clone()
            .list_runs(ListRunsRequest {
                project_id: PROJECT.into(),
                states: vec![],
                page: Some(PageRequest {
                    page_size: 2,
                    page_token: token.clone(),
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.runs.len() <= 2);
        got.extend(page.runs.into_iter().map(|r| r.run_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut expected = ids.clone();
    expected.push(blocked.clone());
    expected.reverse();
    assert_eq!(got, expected, "newest first (run ids are time-ordered)");
    let waiting = s
        .client
        .clone()
        .list_runs(ListRunsRequest {
            project_id: PROJECT.into(),
            states: vec![TaskState::InputRequired as i32],
            page: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        waiting
            .runs
            .iter()
            .map(|r| r.run_id.clone())
            .collect::<Vec<_>>(),
        vec![blocked]
    );
    // A project that does not exist is NOT_FOUND, as the store says, not an empty list.
    let e = s
        .client
        .clone()
        .list_runs(ListRunsRequest {
            project_id: "no-such-project".into(),
            states: vec![],
            page: None,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert_eq!(cairn_proto::reason::of(&e).as_deref(), Some("no_project"));
    s.stop().await;
}

/// An ingest service that never answers.
struct Silent;

#[tonic::async_trait]
impl Ingest for Silent {
    async fn parse(&self, _: Request<IngestRequest>) -> Result<Response<IngestResponse>, Status> {
        std::future::pending().await
    }
    async fn ingest(&self, _: Request<IngestRequest>) -> Result<Response<IngestResponse>, Status> {
        std::future::pending().await
    }
    async fn set_enabled(
        &self,
        _: Request<SetEnabledRequest>,
    ) -> Result<Response<SetEnabledResponse>, Status> {
        std::future::pending().await
    }
    async fn get_enabled(
        &self,
        _: Request<GetEnabledRequest>,
    ) -> Result<Response<SetEnabledResponse>, Status> {
        std::future::pending().await
    }
}

static SILENT_ADDR: std::sync::OnceLock<String> = std::sync::OnceLock::new();

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_past_its_deadline_times_out_and_is_retried_by_policy() {
    let mut host = cairn_server::Host::new();
    host.add(IngestServer::new(Silent));
    SILENT_ADDR.set(serve_host(host).await).unwrap();
    let s = Stack::start(Options {
        ingest: false,
        tweak: |c| c.ingest_addr = SILENT_ADDR.get().unwrap().clone(),
        ..Default::default()
    })
    .await;
    let graph = "nodes:\n  - {id: doc, type: write_file, path: docs/d.md, content: x, ingest: false}\n  - {id: ing, type: ingest, doc_path: '{{nodes.doc.path}}', timeout_s: 1, retry: {max_attempts: 2, initial_backoff_ms: 10}}\n";
    let t0 = Instant::now();
    let run = s.submit(graph, &[]).await.unwrap().run_id;
    let failed = s.wait_state(&run, TaskState::Failed, 30).await;
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    let ing = failed.nodes.iter().find(|n| n.id == "ing").unwrap();
    assert_eq!(
        ing.attempts, 2,
        "a timeout is retried by the default retry_on"
    );
    assert!(
        failed.error.contains("no result within 1s"),
        "{}",
        failed.error
    );
    let events = s.events(&run).await;
    let kinds: Vec<_> = events
        .iter()
        .filter(|e| e.r#type == "node.failed" && e.node_id == "ing")
        .map(|e| data(e)["kind"].clone())
        .collect();
    assert_eq!(
        kinds,
        vec![serde_json::json!("timeout"), serde_json::json!("timeout")]
    );
    s.stop().await;
}
