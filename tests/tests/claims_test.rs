//! The ingest identity over real mutual TLS on loopback: what it can do with a stolen, guessed,
//! expired or other-run claim (nothing), what a valid ingest claim allows (exactly
//! `workspace/`, its run's ingest manifests and `ingest.*` events), and, end to end, that a
//! forged gate approval no longer lets a gated run complete after an orchestrator restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{
    get_response, put_request, AppendEventsRequest, ClaimRunRequest, CreateProjectRequest,
    EventInput, GateDecisionRequest, GateState, GetRequest, GetRunRequest, GrantIngestClaimRequest,
    PutHeader, PutRequest, ReadEventsRequest, RunFence, StatRequest, SubmitRunRequest, TaskState,
};
use cairn_server::pki::{self, PkiSpec};
use cairn_server::TlsConfig;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::Code;

type Store = ArtifactStoreClient<Channel>;

/// Every event type an attacker would like to append as ingest.
const FORGED: &[&str] = &[
    "gate.approved",
    "gate.rejected",
    "node.completed",
    "node.started",
    "task.working",
    "task.completed",
    "task.resumed",
    "human.note",
    "artifact.rework-requested",
    "store.deleted",
];

async fn listener() -> (tokio::net::TcpListener, String) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap().to_string();
    (l, a)
}

struct Deployment {
    pki: tempfile::TempDir,
    _data: tempfile::TempDir,
    store: String,
}

impl Deployment {
    /// A PKI and the store over mutual TLS.
    async fn start() -> Deployment {
        let pki = tempfile::tempdir().unwrap();
        pki::init(&PkiSpec::new(pki.path())).unwrap();
        let data = tempfile::tempdir().unwrap();
        let (l, store) = listener().await;
        let mut c = cairn_artifact_store::Config::new(data.path());
        c.tls = TlsConfig::dir(pki.path());
        tokio::spawn(cairn_artifact_store::serve(c, l, std::future::pending()));
        let d = Deployment {
            pki,
            _data: data,
            store,
        };
        common::wait_serving(d.channel(&d.store, "cli"), "the store (over mTLS)").await;
        d
    }

    fn channel(&self, addr: &str, identity: &str) -> Channel {
        let tls = TlsConfig::dir(self.pki.path())
            .load(identity)
            .unwrap()
            .unwrap();
        cairn_server::connect_tls(addr, Some(&tls)).unwrap()
    }

    fn store_as(&self, identity: &str) -> Store {
        ArtifactStoreClient::new(self.channel(&self.store, identity))
    }

    fn pki(&self) -> &Path {
        self.pki.path()
    }
}

async fn claim_run(orch: &mut Store, run: &str) -> u64 {
    orch.claim_run(ClaimRunRequest {
        project_id: "p".into(),
        run_id: run.into(),
        holder: "orchestrator-1".into(),
    })
    .await
    .unwrap()
    .into_inner()
    .epoch
}

async fn grant(orch: &mut Store, run: &str, epoch: u64, ttl_s: u32) -> String {
    orch.grant_ingest_claim(GrantIngestClaimRequest {
        project_id: "p".into(),
        run_id: run.into(),
        epoch,
        ttl_s,
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .claim
}

fn header(path: &str, fence: Option<RunFence>, claim: &str, run_id: &str) -> PutHeader {
    PutHeader {
        project_id: "p".into(),
        path: path.into(),
        create_project: true,
        overwrite: true,
        fence,
        claim: claim.into(),
        run_id: run_id.into(),
        ..Default::default()
    }
}

async fn put(store: &mut Store, header: PutHeader) -> Result<(), tonic::Status> {
    let msgs = vec![
        PutRequest {
            msg: Some(put_request::Msg::Header(header)),
        },
        PutRequest {
            msg: Some(put_request::Msg::Chunk(b"forged".to_vec().into())),
        },
    ];
    store.put(tokio_stream::iter(msgs)).await.map(|_| ())
}

fn events(types: &[&str], node: &str) -> Vec<EventInput> {
    types
        .iter()
        .map(|t| EventInput {
            r#type: (*t).into(),
            node_id: node.into(),
            data_json: r#"{"by":"mallory"}"#.into(),
            ..Default::default()
        })
        .collect()
}

async fn append(
    store: &mut Store,
    run: &str,
    types: &[&str],
    epoch: u64,
    claim: &str,
) -> Result<(), tonic::Status> {
    store
        .append_events(AppendEventsRequest {
            project_id: "p".into(),
            run_id: run.into(),
            events: events(types, "review"),
            epoch,
            claim: claim.into(),
            ..Default::default()
        })
        .await
        .map(|_| ())
}

/// The stored (type, identity) of a run's events.
async fn stored(store: &mut Store, run: &str) -> Vec<(String, Option<String>)> {
    let mut stream = store
        .read_events(ReadEventsRequest {
            project_id: "p".into(),
            run_id: run.into(),
            from_seq: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    while let Some(e) = stream.message().await.unwrap() {
        let line: serde_json::Value = serde_json::from_str(&e.line_json).unwrap();
        seen.push((e.r#type, line["identity"].as_str().map(str::to_owned)));
    }
    seen
}

async fn exists(store: &mut Store, path: &str) -> bool {
    match store
        .stat(StatRequest {
            project_id: "p".into(),
            path: path.into(),
            include_sha256: false,
        })
        .await
    {
        Ok(_) => true,
        Err(s) if s.code() == Code::NotFound => false,
        Err(s) => panic!("stat {path}: {s:?}"),
    }
}

/// The run's writer epoch as anyone who may read the run's files reads it.
async fn steal_epoch(store: &mut Store, run: &str) -> u64 {
    let mut stream = store
        .get(GetRequest {
            project_id: "p".into(),
            path: format!(".cairn/runs/{run}/events.epoch"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut text = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        if let Some(get_response::Msg::Chunk(c)) = m.msg {
            text.extend_from_slice(&c);
        }
    }
    String::from_utf8(text).unwrap().trim().parse().unwrap()
}

fn assert_refused(r: Result<(), tonic::Status>, code: Code, reason: &str, what: &str) {
    let s = r.expect_err(what);
    assert_eq!(s.code(), code, "{what}: {s:?}");
    assert_eq!(
        cairn_proto::reason::of(&s).as_deref(),
        Some(reason),
        "{what}: {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ingest_with_a_stolen_or_guessed_epoch_writes_and_appends_nothing() {
    let d = Deployment::start().await;
    let mut orch = d.store_as("orchestrator");
    orch.create_project(CreateProjectRequest {
        project_id: "p".into(),
    })
    .await
    .unwrap();
    claim_run(&mut orch, "r1").await;
    let mut ingest = d.store_as("ingest");
    let stolen = steal_epoch(&mut ingest, "r1").await;
    for epoch in [stolen, 1, 2, 3] {
        let fence = Some(RunFence {
            run_id: "r1".into(),
            epoch,
        });
        for path in ["workspace/a.py", ".cairn/runs/r1/ingest/n.json"] {
            let r = put(&mut ingest, header(path, fence.clone(), "", "r1")).await;
            assert_refused(r, Code::PermissionDenied, "identity", path);
        }
        for t in FORGED.iter().chain(["ingest.started"].iter()) {
            let r = append(&mut ingest, "r1", &[t], epoch, "").await;
            assert_refused(r, Code::PermissionDenied, "identity", t);
        }
    }
    assert!(!exists(&mut orch, "workspace/a.py").await);
    assert!(stored(&mut orch, "r1").await.is_empty(), "nothing appended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ingest_with_a_guessed_expired_or_other_run_claim_writes_and_appends_nothing() {
    let d = Deployment::start().await;
    let mut orch = d.store_as("orchestrator");
    let mut ingest = d.store_as("ingest");
    orch.create_project(CreateProjectRequest {
        project_id: "p".into(),
    })
    .await
    .unwrap();
    let e1 = claim_run(&mut orch, "r1").await;
    let e2 = claim_run(&mut orch, "r2").await;
    let other = grant(&mut orch, "r2", e2, 0).await;
    let short = grant(&mut orch, "r1", e1, 1).await;
    let valid = grant(&mut orch, "r1", e1, 0).await;

    // Guessed or altered claims.
    let mut altered = valid.clone();
    altered.pop();
    altered.push(if valid.ends_with('A') { 'B' } else { 'A' });
    for guess in [e1.to_string(), "c1.e30.AAAA".into(), altered] {
        let r = put(&mut ingest, header("workspace/a.py", None, &guess, "")).await;
        assert_refused(r, Code::PermissionDenied, "claim_invalid", &guess);
        for t in FORGED.iter().chain(["ingest.started"].iter()) {
            let r = append(&mut ingest, "r1", &[t], e1, &guess).await;
            assert_refused(r, Code::PermissionDenied, "claim_invalid", t);
        }
    }
    // Another run's claim: not this run's events, manifests or record paths.
    for t in FORGED.iter().chain(["ingest.started"].iter()) {
        let r = append(&mut ingest, "r1", &[t], e1, &other).await;
        assert_refused(r, Code::PermissionDenied, "claim_other_run", t);
    }
    let r = put(&mut ingest, header("workspace/a.py", None, &other, "r1")).await;
    assert_refused(r, Code::PermissionDenied, "claim_other_run", "Put for r1");
    let r = put(
        &mut ingest,
        header(".cairn/runs/r1/ingest/n.json", None, &other, ""),
    )
    .await;
    assert_refused(r, Code::PermissionDenied, "identity", "r1's manifest");
    // An expired claim.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = put(&mut ingest, header("workspace/a.py", None, &short, "r1")).await;
    assert_refused(r, Code::PermissionDenied, "claim_expired", "expired Put");
    for t in FORGED.iter().chain(["ingest.started"].iter()) {
        let r = append(&mut ingest, "r1", &[t], e1, &short).await;
        assert_refused(r, Code::PermissionDenied, "claim_expired", t);
    }
    // A valid claim of the run does not make gate, node or task events ingest's.
    for t in FORGED {
        let r = append(&mut ingest, "r1", &["ingest.started", t], 0, &valid).await;
        assert_refused(r, Code::PermissionDenied, "event_not_permitted", t);
    }
    assert!(!exists(&mut orch, "workspace/a.py").await);
    assert!(!exists(&mut orch, ".cairn/runs/r1/ingest/n.json").await);
    assert!(stored(&mut orch, "r1").await.is_empty(), "nothing appended");
    // Ingest cannot mint claims, and a claim's epoch dies with the next ClaimRun.
    let r = ingest
        .grant_ingest_claim(GrantIngestClaimRequest {
            project_id: "p".into(),
            run_id: "r1".into(),
            epoch: e1,
            ..Default::default()
        })
        .await
        .map(|_| ());
    assert_refused(
        r,
        Code::PermissionDenied,
        "identity",
        "ingest grants itself",
    );
    claim_run(&mut orch, "r1").await;
    let r = put(&mut ingest, header("workspace/a.py", None, &valid, "r1")).await;
    assert_refused(r, Code::FailedPrecondition, "fenced", "superseded claim");
    let r = append(&mut ingest, "r1", &["ingest.started"], 0, &valid).await;
    assert_refused(r, Code::FailedPrecondition, "fenced", "superseded claim");
    let r = orch
        .grant_ingest_claim(GrantIngestClaimRequest {
            project_id: "p".into(),
            run_id: "r1".into(),
            epoch: e1,
            ..Default::default()
        })
        .await
        .map(|_| ());
    assert_refused(r, Code::FailedPrecondition, "fenced", "a fenced-off driver");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_valid_claim_allows_exactly_workspace_its_runs_manifests_and_ingest_events() {
    let d = Deployment::start().await;
    let mut orch = d.store_as("orchestrator");
    let mut ingest = d.store_as("ingest");
    orch.create_project(CreateProjectRequest {
        project_id: "p".into(),
    })
    .await
    .unwrap();
    let epoch = claim_run(&mut orch, "r1").await;
    let claim = grant(&mut orch, "r1", epoch, 0).await;
    // The fence a request names is not what decides: the claim's run is.
    let wrong_fence = Some(RunFence {
        run_id: "r2".into(),
        epoch: 99,
    });
    for (path, ok) in [
        ("workspace/a.py", true),
        (".cairn/runs/r1/ingest/n.json", true),
        (".cairn/runs/r1/ingest/history/n.0123.json", true),
        (".cairn/runs/r1/task.yaml", false),
        (".cairn/runs/r1/events.epoch", false),
        (".cairn/runs/r1/ingest.json", false),
        (".cairn/runs/r2/ingest/n.json", false),
        (".cairn/project.json", false),
        ("docs/x.md", false),
    ] {
        let r = put(&mut ingest, header(path, wrong_fence.clone(), &claim, "")).await;
        assert_eq!(r.is_ok(), ok, "{path}: {r:?}");
        if let Err(s) = r {
            assert_eq!(s.code(), Code::PermissionDenied, "{path}: {s:?}");
        }
    }
    append(
        &mut ingest,
        "r1",
        &["ingest.started", "ingest.block.written", "ingest.completed"],
        0,
        &claim,
    )
    .await
    .unwrap();
    assert_eq!(
        stored(&mut orch, "r1").await,
        ["ingest.started", "ingest.block.written", "ingest.completed"]
            .map(|t| (t.to_owned(), Some("ingest".to_owned())))
            .to_vec()
    );
    // Narrowed prefixes narrow; a prefix outside the scope is refused at the grant.
    let narrow = orch
        .grant_ingest_claim(GrantIngestClaimRequest {
            project_id: "p".into(),
            run_id: "r1".into(),
            epoch,
            allowed_prefixes: vec!["workspace/src".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(narrow.allowed_prefixes, ["workspace/src/"]);
    assert!(put(
        &mut ingest,
        header("workspace/src/b.py", None, &narrow.claim, "")
    )
    .await
    .is_ok());
    let r = put(
        &mut ingest,
        header("workspace/b.py", None, &narrow.claim, ""),
    )
    .await;
    assert_refused(
        r,
        Code::PermissionDenied,
        "identity",
        "outside the narrowed claim",
    );
    let r = orch
        .grant_ingest_claim(GrantIngestClaimRequest {
            project_id: "p".into(),
            run_id: "r1".into(),
            epoch,
            allowed_prefixes: vec!["docs".into()],
            ..Default::default()
        })
        .await;
    assert_eq!(r.unwrap_err().code(), Code::InvalidArgument);
}

/// An orchestrator over mutual TLS against `d`'s store; stopped by sending on the sender.
async fn orchestrator(
    d: &Deployment,
) -> (
    OrchestratorClient<Channel>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
    Channel,
) {
    let (l, addr) = listener().await;
    let c = cairn_orchestrator::Config {
        store_addr: d.store.clone(),
        ingest_addr: String::new(),
        tls: TlsConfig::dir(d.pki()),
        resume_on_start: true,
        ..cairn_orchestrator::Config::default()
    };
    let (tx, rx) = oneshot::channel::<()>();
    let join = tokio::spawn(async move {
        let _ = cairn_orchestrator::serve(c, l, async {
            let _ = rx.await;
        })
        .await;
    });
    let channel = d.channel(&addr, "cli");
    (OrchestratorClient::new(channel.clone()), tx, join, channel)
}

async fn get_run(client: &mut OrchestratorClient<Channel>, run: &str) -> Option<i32> {
    client
        .get_run(GetRunRequest {
            project_id: "p".into(),
            run_id: run.into(),
        })
        .await
        .ok()
        .map(|r| r.into_inner().state)
}

async fn wait_state(client: &mut OrchestratorClient<Channel>, run: &str, state: TaskState) {
    for _ in 0..600 {
        if get_run(client, run).await == Some(state as i32) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("run {run} never reached {state:?}");
}

const GATED: &str = r#"
nodes:
  - {id: draft, type: write_file, path: "docs/{{run_id}}/draft.txt", content: draft}
  - {id: review, type: gate, reason: "check the draft", needs: [draft]}
  - {id: publish, type: write_file, path: "docs/{{run_id}}/published.txt", content: "ok by {{nodes.review.by}}", needs: [review]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forged_gate_approval_does_not_complete_a_gated_run_after_an_orchestrator_restart() {
    let d = Deployment::start().await;
    let (mut client, stop, join, channel) = orchestrator(&d).await;
    common::wait_serving(channel.clone(), "the orchestrator").await;
    let run = client
        .submit_run(SubmitRunRequest {
            project_id: "p".into(),
            graph_yaml: GATED.into(),
            by: "tester".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    wait_state(&mut client, &run, TaskState::InputRequired).await;

    // Ingest reads the run's epoch and forges the approval, the gate's completion and the
    // run's progress.
    let mut ingest = d.store_as("ingest");
    let stolen = steal_epoch(&mut ingest, &run).await;
    let forged = ["gate.approved", "node.completed", "task.working"];
    for t in forged {
        let r = append(&mut ingest, &run, &[t], stolen, "").await;
        assert!(r.is_err(), "{t} was appended by ingest");
    }
    let r = put(
        &mut ingest,
        header(
            &format!("docs/{run}/published.txt"),
            Some(RunFence {
                run_id: run.clone(),
                epoch: stolen,
            }),
            "",
            &run,
        ),
    )
    .await;
    assert!(r.is_err(), "ingest wrote a document");

    // The orchestrator restarts and folds the run's log again.
    stop.send(()).unwrap();
    join.await.unwrap();
    let (mut client, stop, join, _) = orchestrator(&d).await;
    wait_state(&mut client, &run, TaskState::InputRequired).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let info = client
        .get_run(GetRunRequest {
            project_id: "p".into(),
            run_id: run.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.state, TaskState::InputRequired as i32, "{info:#?}");
    assert_eq!(info.gates[0].state, GateState::Blocked as i32, "{info:#?}");
    let mut orch = d.store_as("orchestrator");
    assert!(!exists(&mut orch, &format!("docs/{run}/published.txt")).await);
    assert!(
        stored(&mut orch, &run)
            .await
            .iter()
            .all(|(_, id)| id.as_deref() != Some("ingest")),
        "no event of ingest in the run's log"
    );

    // A real approval still completes it.
    client
        .approve_gate(GateDecisionRequest {
            project_id: "p".into(),
            run_id: run.clone(),
            gate_id: "review".into(),
            by: "ann".into(),
            note: String::new(),
        })
        .await
        .unwrap();
    wait_state(&mut client, &run, TaskState::Completed).await;
    assert!(exists(&mut orch, &format!("docs/{run}/published.txt")).await);
    stop.send(()).unwrap();
    join.await.unwrap();
}
