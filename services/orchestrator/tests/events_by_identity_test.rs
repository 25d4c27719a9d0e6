//! Folding a run's log ignores events whose stored identity may not emit their type (a log
//! written before the store checked event types): a gated run whose events.jsonl holds a
//! `gate.approved` by ingest stays at its gate after a restart, and the orchestrator reports
//! each such event once as `records.event_ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{
    Event, GateDecisionRequest, GateState, GetRunRequest, ReadEventsRequest, RunInfo,
    SubmitRunRequest, TaskState,
};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tonic::transport::Channel;

const PROJECT: &str = "proj";

const GATED: &str = r#"
nodes:
  - {id: draft, type: write_file, path: "docs/{{run_id}}/draft.txt", content: draft}
  - {id: review, type: gate, reason: "check the draft", needs: [draft]}
  - {id: publish, type: write_file, path: "docs/{{run_id}}/published.txt", content: "ok by {{nodes.review.by}}", needs: [review]}
"#;

/// A server on a loopback port; stopped (and awaited) by [`Served::stop`].
struct Served {
    addr: String,
    stop: oneshot::Sender<()>,
    join: tokio::task::JoinHandle<()>,
}

impl Served {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(30), self.join).await;
    }
}

async fn store(data: &Path) -> Served {
    let svc = cairn_artifact_store::artifact_store_service(cairn_artifact_store::Config::new(data))
        .await
        .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (stop, rx) = oneshot::channel::<()>();
    let join = tokio::spawn(async move {
        let mut host = cairn_server::Host::new();
        host.add(svc);
        let _ = host
            .serve(l, async {
                let _ = rx.await;
            })
            .await;
    });
    Served { addr, stop, join }
}

async fn orchestrator(store_addr: &str) -> (Served, OrchestratorClient<Channel>) {
    let config = cairn_orchestrator::Config {
        store_addr: store_addr.to_owned(),
        ingest_addr: String::new(),
        snapshot_interval_ms: 50,
        ..Default::default()
    };
    let (server, handle) = cairn_orchestrator::orchestrator_service(config)
        .await
        .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (stop, rx) = oneshot::channel::<()>();
    let join = tokio::spawn(async move {
        let mut host = cairn_server::Host::new();
        host.add(server);
        let _ = host
            .serve(l, async {
                let _ = rx.await;
                handle.shutdown().await;
            })
            .await;
    });
    let client = OrchestratorClient::new(cairn_server::connect(&addr).unwrap());
    (Served { addr, stop, join }, client)
}

async fn info(client: &mut OrchestratorClient<Channel>, run: &str) -> Option<RunInfo> {
    client
        .get_run(GetRunRequest {
            project_id: PROJECT.into(),
            run_id: run.into(),
        })
        .await
        .ok()
        .map(|r| r.into_inner())
}

async fn wait_state(
    client: &mut OrchestratorClient<Channel>,
    run: &str,
    state: TaskState,
) -> RunInfo {
    for _ in 0..600 {
        if let Some(i) = info(client, run).await.filter(|i| i.state == state as i32) {
            return i;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "run {run} never reached {state:?}: {:#?}",
        info(client, run).await
    );
}

async fn events(store_addr: &str, run: &str) -> Vec<Event> {
    let mut client = ArtifactStoreClient::new(cairn_server::connect(store_addr).unwrap());
    let mut stream = client
        .read_events(ReadEventsRequest {
            project_id: PROJECT.into(),
            run_id: run.into(),
            from_seq: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(e) = stream.message().await.unwrap() {
        out.push(e);
    }
    out
}

/// The `records.event_ignored` warnings: (seq, type, identity) each names.
async fn ignored(store_addr: &str, run: &str) -> Vec<(u64, String, String)> {
    events(store_addr, run)
        .await
        .into_iter()
        .filter(|e| e.r#type == "records.event_ignored")
        .map(|e| {
            let d: Value = serde_json::from_str(&e.data_json).unwrap();
            (
                d["ignored_seq"].as_u64().unwrap(),
                d["ignored_type"].as_str().unwrap().to_owned(),
                d["ignored_identity"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_gate_approval_in_the_log_is_ignored_and_reported_after_a_restart() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = store(&data).await;
    let (o, mut client) = orchestrator(&s.addr).await;
    let run = client
        .submit_run(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: GATED.into(),
            by: "tester".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    wait_state(&mut client, &run, TaskState::InputRequired).await;
    o.stop().await;
    let last = events(&s.addr, &run).await.last().unwrap().seq;
    s.stop().await;

    // Lines as an ingest with a readable epoch appended them before the store checked types.
    let log = data.join(format!("projects/{PROJECT}/.cairn/runs/{run}/events.jsonl"));
    let forged = [
        ("gate.approved", "review", "ingest"),
        ("node.completed", "review", "ingest"),
        ("task.working", "", "ingest"),
        ("ingest.started", "draft", "ingest"),
        ("node.completed", "publish", "console"),
    ];
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    for (i, (kind, node, identity)) in forged.iter().enumerate() {
        let line = json!({
            "ts": "2026-11-28T12:00:00.000Z",
            "seq": last + 1 + i as u64,
            "type": kind,
            "run_id": run,
            "node_id": node,
            "level": "info",
            "by": "mallory",
            "identity": identity,
        });
        writeln!(f, "{line}").unwrap();
    }
    drop(f);

    // A restarted store and orchestrator: the run is resumed from its records.
    let s = store(&data).await;
    let (o, mut client) = orchestrator(&s.addr).await;
    let blocked = wait_state(&mut client, &run, TaskState::InputRequired).await;
    let expected = vec![
        (last + 1, "gate.approved".to_owned(), "ingest".to_owned()),
        (last + 2, "node.completed".to_owned(), "ingest".to_owned()),
        (last + 3, "task.working".to_owned(), "ingest".to_owned()),
        (last + 5, "node.completed".to_owned(), "console".to_owned()),
    ];
    for _ in 0..200 {
        if ignored(&s.addr, &run).await.len() >= expected.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all: Vec<String> = events(&s.addr, &run)
        .await
        .iter()
        .map(|e| format!("{} {} {}", e.seq, e.r#type, e.data_json))
        .collect();
    assert_eq!(ignored(&s.addr, &run).await, expected, "{all:#?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = info(&mut client, &run).await.unwrap();
    assert_eq!(now.state, TaskState::InputRequired as i32, "{now:#?}");
    assert_eq!(blocked.gates[0].state, GateState::Blocked as i32);
    assert_eq!(now.gates[0].state, GateState::Blocked as i32, "{now:#?}");
    assert!(now.gates[0].decided_by.is_empty(), "{now:#?}");

    // Reported once: another restart adds no second warning.
    o.stop().await;
    let (o, mut client) = orchestrator(&s.addr).await;
    wait_state(&mut client, &run, TaskState::InputRequired).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ignored(&s.addr, &run).await, expected);

    // A real approval still completes the run.
    client
        .approve_gate(GateDecisionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            gate_id: "review".into(),
            by: "ann".into(),
            note: String::new(),
        })
        .await
        .unwrap();
    let done = wait_state(&mut client, &run, TaskState::Completed).await;
    assert_eq!(done.gates[0].decided_by, "ann");
    o.stop().await;
    s.stop().await;
}
