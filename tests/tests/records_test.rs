//! Run records over real mutual TLS on loopback: the store takes a run's records from the
//! orchestrator identity only under a claim on that very run at its current epoch, keeps
//! graph.resolved.json write-once whoever asks, and a real orchestrator still drives a gated
//! run through submit, note, approval and completion with every record write claimed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{
    put_request, AddNoteRequest, ClaimRunRequest, CreateProjectRequest, DeleteRequest,
    GateDecisionRequest, GetRunRequest, PutHeader, PutRequest, RunFence, SubmitRunRequest,
    TaskState, UpdateJsonRequest, WriteOutcome,
};
use cairn_server::pki::{self, PkiSpec};
use cairn_server::TlsConfig;
use tonic::transport::Channel;
use tonic::Code;

struct Deployment {
    pki: tempfile::TempDir,
    services: common::Services,
}

impl Deployment {
    async fn start() -> Deployment {
        let pki = tempfile::tempdir().unwrap();
        pki::init(&PkiSpec::new(pki.path())).unwrap();
        let services = common::start(&TlsConfig::dir(pki.path())).await;
        let d = Deployment { pki, services };
        for addr in [&d.services.store, &d.services.orchestrator] {
            common::wait_serving(d.channel(addr, "cli"), &format!("{addr} (over mTLS)")).await;
        }
        d
    }

    fn channel(&self, addr: &str, identity: &str) -> Channel {
        let tls = TlsConfig::dir(self.pki.path())
            .load(identity)
            .unwrap()
            .unwrap();
        cairn_server::connect_tls(addr, Some(&tls)).unwrap()
    }

    fn store(&self, identity: &str) -> ArtifactStoreClient<Channel> {
        ArtifactStoreClient::new(self.channel(&self.services.store, identity))
    }
}

async fn put(
    client: &mut ArtifactStoreClient<Channel>,
    path: &str,
    body: &[u8],
    overwrite: bool,
    fence: Option<(&str, u64)>,
) -> Result<i32, tonic::Status> {
    let header = PutHeader {
        project_id: "p".into(),
        path: path.into(),
        create_project: true,
        overwrite,
        fence: fence.map(|(run, epoch)| RunFence {
            run_id: run.into(),
            epoch,
        }),
        ..Default::default()
    };
    let msgs = vec![
        PutRequest {
            msg: Some(put_request::Msg::Header(header)),
        },
        PutRequest {
            msg: Some(put_request::Msg::Chunk(body.to_vec().into())),
        },
    ];
    client
        .put(tokio_stream::iter(msgs))
        .await
        .map(|r| r.into_inner().outcome)
}

async fn claim(client: &mut ArtifactStoreClient<Channel>, run: &str) -> u64 {
    client
        .claim_run(ClaimRunRequest {
            project_id: "p".into(),
            run_id: run.into(),
            holder: "test".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .epoch
}

fn reason(s: &tonic::Status) -> Option<String> {
    cairn_proto::reason::of(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_orchestrator_writes_a_runs_records_only_under_its_current_claim_on_that_run() {
    let d = Deployment::start().await;
    let mut admin = d.store("cli");
    admin
        .create_project(CreateProjectRequest {
            project_id: "p".into(),
        })
        .await
        .unwrap();
    let mut orch = d.store("orchestrator");
    let first = claim(&mut orch, "r1").await;
    let other = claim(&mut orch, "r2").await;

    // No claim, another run's claim: refused by identity.
    for fence in [None, Some(("r2", other))] {
        let s = put(&mut orch, ".cairn/runs/r1/task.yaml", b"x", true, fence)
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::PermissionDenied, "{fence:?}: {s:?}");
        assert_eq!(reason(&s).as_deref(), Some("identity"));
        assert!(s.message().contains("claim"), "{}", s.message());
    }
    // A claim taken over since: fenced.
    let current = claim(&mut orch, "r1").await;
    assert!(current > first);
    let s = put(
        &mut orch,
        ".cairn/runs/r1/task.yaml",
        b"x",
        true,
        Some(("r1", first)),
    )
    .await
    .unwrap_err();
    assert_eq!(reason(&s).as_deref(), Some("fenced"), "{s:?}");
    // The current claim on that run: written.
    put(
        &mut orch,
        ".cairn/runs/r1/task.yaml",
        b"x",
        true,
        Some(("r1", current)),
    )
    .await
    .unwrap();
    // Delete and UpdateJson carry no claim: not in records.
    let s = orch
        .delete(DeleteRequest {
            project_id: "p".into(),
            path: ".cairn/runs/r1/task.yaml".into(),
            run_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let s = orch
        .update_json(UpdateJsonRequest {
            project_id: "p".into(),
            path: ".cairn/runs/r1/counters.json".into(),
            patch_json: "{}".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    // Outside run records nothing changes.
    put(&mut orch, "docs/a.md", b"a", false, None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graph_resolved_json_is_written_once_whoever_asks() {
    let d = Deployment::start().await;
    let path = ".cairn/runs/r1/graph.resolved.json";
    let mut admin = d.store("cli");
    let created = put(&mut admin, path, b"{\"nodes\":[1]}", false, None)
        .await
        .unwrap();
    assert_eq!(created, WriteOutcome::Created as i32);
    let same = put(&mut admin, path, b"{\"nodes\":[1]}", true, None)
        .await
        .unwrap();
    assert_eq!(same, WriteOutcome::Unchanged as i32);
    let s = put(&mut admin, path, b"{\"nodes\":[]}", true, None)
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
    assert_eq!(reason(&s).as_deref(), Some("write_once"));
    assert!(s.message().contains("written once"), "{}", s.message());
    let s = admin
        .delete(DeleteRequest {
            project_id: "p".into(),
            path: path.into(),
            run_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&s).as_deref(), Some("write_once"), "{s:?}");
    // The run's driver, under its claim, is held to it too.
    let mut orch = d.store("orchestrator");
    let epoch = claim(&mut orch, "r1").await;
    let s = put(
        &mut orch,
        path,
        b"{\"nodes\":[]}",
        true,
        Some(("r1", epoch)),
    )
    .await
    .unwrap_err();
    assert_eq!(reason(&s).as_deref(), Some("write_once"), "{s:?}");
}

const GATED: &str = r#"
nodes:
  - {id: draft, type: write_file, path: "docs/{{run_id}}/draft.txt", content: draft}
  - {id: review, type: gate, reason: "check the draft", needs: [draft]}
  - {id: publish, type: write_file, path: "docs/{{run_id}}/published.txt", content: "ok by {{nodes.review.by}}", needs: [review]}
"#;

async fn wait(c: &OrchestratorClient<Channel>, run: &str, want: TaskState) {
    let req = GetRunRequest {
        project_id: "p".into(),
        run_id: run.into(),
    };
    let mut info = None;
    for _ in 0..400 {
        let got = c.clone().get_run(req.clone()).await.unwrap().into_inner();
        if got.state == want as i32 {
            return;
        }
        info = Some(got);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("run never reached {want:?}: {info:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_orchestrator_over_mtls_claims_every_record_it_writes() {
    let d = Deployment::start().await;
    let mut c = OrchestratorClient::new(d.channel(&d.services.orchestrator, "cli"));
    let run = c
        .submit_run(SubmitRunRequest {
            project_id: "p".into(),
            graph_yaml: GATED.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    wait(&c, &run, TaskState::InputRequired).await;
    c.add_note(AddNoteRequest {
        project_id: "p".into(),
        run_id: run.clone(),
        by: "ann".into(),
        text: "fine".into(),
    })
    .await
    .unwrap();
    c.approve_gate(GateDecisionRequest {
        project_id: "p".into(),
        run_id: run.clone(),
        gate_id: "review".into(),
        by: "ann".into(),
        note: "go".into(),
    })
    .await
    .unwrap();
    wait(&c, &run, TaskState::Completed).await;
    // A note to a run no driver holds any more is written under a claim taken for it.
    c.add_note(AddNoteRequest {
        project_id: "p".into(),
        run_id: run.clone(),
        by: "ann".into(),
        text: "afterwards".into(),
    })
    .await
    .unwrap();
    let mut admin = d.store("cli");
    let mut stream = admin
        .get(cairn_proto::v1::GetRequest {
            project_id: "p".into(),
            path: format!(".cairn/runs/{run}/shared/human-notes.md"),
            offset: 0,
            length: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut text = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        if let Some(cairn_proto::v1::get_response::Msg::Chunk(b)) = m.msg {
            text.extend_from_slice(&b);
        }
    }
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.contains("fine") && text.contains("afterwards"),
        "{text}"
    );
}
