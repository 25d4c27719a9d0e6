//! The `google.rpc.Status` details of cairn's refusals, over real gRPC on loopback, as the
//! Google API design guide has them: `BadRequest` with field paths on INVALID_ARGUMENT (graph
//! errors name `nodes[i].field`), `ResourceInfo` on NOT_FOUND, `PreconditionFailure` on sha
//! and epoch mismatches; ingest refuses a `doc_path` outside the project, and an ingest
//! without the claim the store requires is an error status, not an OK with every block
//! rejected; a service whose store is down says UNAVAILABLE with `RetryInfo`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use cairn_proto::reason;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::ingest_client::IngestClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{
    put_request, GateDecisionRequest, GetRunRequest, IngestRequest, ListRunsRequest, PageRequest,
    PutHeader, PutRequest, ReworkRequest, StatRequest, SubmitRunRequest,
};
use cairn_server::TlsConfig;
use tonic::transport::Channel;
use tonic::Code;

async fn deploy(tls: &TlsConfig) -> common::Services {
    common::start(tls).await
}

async fn plain() -> common::Services {
    let d = deploy(&TlsConfig::default()).await;
    for addr in [&d.store, &d.ingest, &d.orchestrator] {
        common::wait_serving(cairn_server::connect(addr).unwrap(), addr).await;
    }
    d
}

fn channel(addr: &str) -> Channel {
    cairn_server::connect(addr).unwrap()
}

async fn put(
    client: &mut ArtifactStoreClient<Channel>,
    header: PutHeader,
    body: &[u8],
) -> Result<(), tonic::Status> {
    let messages = vec![
        PutRequest {
            msg: Some(put_request::Msg::Header(header)),
        },
        PutRequest {
            msg: Some(put_request::Msg::Chunk(body.to_vec().into())),
        },
    ];
    client.put(tokio_stream::iter(messages)).await.map(|_| ())
}

fn header(path: &str) -> PutHeader {
    PutHeader {
        project_id: "p".into(),
        path: path.into(),
        create_project: true,
        ..PutHeader::default()
    }
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_refusals_carry_resource_precondition_and_field_details() {
    let d = plain().await;
    let mut s = ArtifactStoreClient::new(channel(&d.store));
    put(&mut s, header("docs/a.txt"), b"one").await.unwrap();

    // NOT_FOUND names the resource: a file of project p.
    let e = s
        .stat(StatRequest {
            project_id: "p".into(),
            path: "docs/missing.txt".into(),
            include_sha256: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(
        reason::resource(&e),
        Some(("file".into(), "docs/missing.txt".into(), "p".into())),
        "{e:?}"
    );

    // A compare-and-swap Put over other bytes: PreconditionFailure on the path.
    let mut cas = header("docs/a.txt");
    cas.overwrite = true;
    cas.if_sha256 = "0".repeat(64);
    let e = put(&mut s, cas, b"two").await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        reason::preconditions(&e),
        owned(&[("changed", "docs/a.txt")])
    );

    // A fenced epoch's PreconditionFailure: client_contract_test's fenced case.

    // INVALID_ARGUMENT names the field.
    let e = s
        .stat(StatRequest {
            project_id: "bad id!".into(),
            path: "docs/a.txt".into(),
            include_sha256: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let v = reason::violations(&e);
    assert_eq!(v.len(), 1, "{e:?}");
    assert_eq!(v[0].0, "project", "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graph_errors_name_the_field_path_and_missing_runs_the_run() {
    let d = plain().await;
    let mut o = OrchestratorClient::new(channel(&d.orchestrator));
    let graph = "nodes:\n  - {id: a, type: write_file, path: docs/a, content: x}\n  - {id: b, type: write_file, path: docs/b, content: '{{nodes.a.size}}'}\n";
    let e = o
        .submit_run(SubmitRunRequest {
            project_id: "p".into(),
            graph_yaml: graph.into(),
            ..SubmitRunRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(reason::of(&e).as_deref(), Some("invalid_graph"));
    let v = reason::violations(&e);
    assert_eq!(v.len(), 1, "{e:?}");
    assert_eq!(v[0].0, "nodes[1].content", "{e:?}");
    assert!(v[0].1.contains("no output `size`"), "{e:?}");
    assert_eq!(reason::detail(&e, "node").as_deref(), Some("b"));
    assert_eq!(
        reason::detail(&e, "field").as_deref(),
        Some("nodes[1].content")
    );

    let e = o
        .get_run(GetRunRequest {
            project_id: "p".into(),
            run_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert_eq!(
        reason::resource(&e),
        Some(("run".into(), "nope".into(), "p".into())),
        "{e:?}"
    );

    // A run that exists (waiting at its gate), a node or gate it does not have: ResourceInfo
    // names the node.
    let run = o
        .submit_run(SubmitRunRequest {
            project_id: "p".into(),
            graph_yaml: "nodes:\n  - {id: g, type: gate}\n".into(),
            ..SubmitRunRequest::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let e = o
        .approve_gate(GateDecisionRequest {
            project_id: "p".into(),
            run_id: run.clone(),
            gate_id: "nogate".into(),
            ..GateDecisionRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert_eq!(
        reason::resource(&e),
        Some(("node".into(), "nogate".into(), "p".into())),
        "{e:?}"
    );
    assert_eq!(reason::detail(&e, "run_id").as_deref(), Some(run.as_str()));
    assert!(e.message().contains("cairn runs show"), "{e:?}");
    let e = o
        .request_rework(ReworkRequest {
            project_id: "p".into(),
            run_id: run,
            node_id: "zz".into(),
            ..ReworkRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert_eq!(
        reason::resource(&e).map(|r| (r.0, r.1)),
        Some(("node".into(), "zz".into())),
        "{e:?}"
    );
}

/// Every INVALID_ARGUMENT of a plain request field names that field's path, not only graph
/// errors: a run id, a page token, a mode, a variable, a search text, a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_field_errors_name_the_field_path() {
    let d = plain().await;
    let o = OrchestratorClient::new(channel(&d.orchestrator));
    let field_of = |e: &tonic::Status| {
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        let v = reason::violations(e);
        assert_eq!(v.len(), 1, "{e:?}");
        assert_eq!(v[0].1, e.message(), "{e:?}");
        assert_eq!(reason::detail(e, "field"), Some(v[0].0.clone()), "{e:?}");
        v[0].0.clone()
    };
    let submit = |req: SubmitRunRequest| {
        let mut o = o.clone();
        async move { o.submit_run(req).await.unwrap_err() }
    };
    let e = submit(SubmitRunRequest {
        project_id: "p".into(),
        run_id: "bad id!".into(),
        graph_yaml: "nodes:\n  - {id: g, type: gate}\n".into(),
        ..SubmitRunRequest::default()
    })
    .await;
    assert_eq!(field_of(&e), "run_id");
    let e = submit(SubmitRunRequest {
        project_id: "p".into(),
        mode: "nope".into(),
        ..SubmitRunRequest::default()
    })
    .await;
    assert_eq!(field_of(&e), "mode");
    let e = submit(SubmitRunRequest {
        project_id: "p".into(),
        mode: "self_critique".into(),
        prompt: "x".into(),
        vars: [("reviews".to_owned(), "99".to_owned())].into(),
        ..SubmitRunRequest::default()
    })
    .await;
    assert_eq!(field_of(&e), "vars.reviews");
    let e = submit(SubmitRunRequest {
        project_id: "p".into(),
        ..SubmitRunRequest::default()
    })
    .await;
    assert_eq!(field_of(&e), "graph_yaml");
    let list = |req: ListRunsRequest| {
        let mut o = o.clone();
        async move { o.list_runs(req).await.unwrap_err() }
    };
    let e = list(ListRunsRequest {
        project_id: "p".into(),
        page: Some(PageRequest {
            page_size: 10,
            page_token: "forged".into(),
        }),
        ..ListRunsRequest::default()
    })
    .await;
    assert_eq!(field_of(&e), "page.page_token");
    let e = list(ListRunsRequest {
        project_id: "p".into(),
        text: "x".repeat(500),
        ..ListRunsRequest::default()
    })
    .await;
    assert_eq!(field_of(&e), "text");
    let e = list(ListRunsRequest {
        project_id: "p".into(),
        created_after: "yesterday".into(),
        ..ListRunsRequest::default()
    })
    .await;
    assert_eq!(field_of(&e), "created_after");
}

fn doc(doc_path: &str) -> IngestRequest {
    IngestRequest {
        project_id: "p".into(),
        run_id: "r1".into(),
        doc_path: doc_path.into(),
        content: b"```text file=a.txt\nhi\n```\n".to_vec().into(),
        ..IngestRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ingest_refuses_a_doc_path_outside_the_project() {
    let d = plain().await;
    let mut i = IngestClient::new(channel(&d.ingest));
    for bad in ["../x.md", "/etc/x.md", "docs/../../x.md"] {
        let e = i.parse(doc(bad)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e:?}");
        let v = reason::violations(&e);
        assert_eq!(v.len(), 1, "{e:?}");
        assert_eq!(v[0].0, "doc_path", "{e:?}");
        let e = i.ingest(doc(bad)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e:?}");
    }
    i.parse(doc("docs/x.md")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ingest_without_the_claim_the_store_requires_is_refused() {
    let pki = tempfile::tempdir().unwrap();
    cairn_server::pki::init(&cairn_server::pki::PkiSpec::new(pki.path())).unwrap();
    let tls = TlsConfig::dir(pki.path());
    let d = deploy(&tls).await;
    let cli = tls.load("cli").unwrap().unwrap();
    let ch = cairn_server::connect_tls(&d.ingest, Some(&cli)).unwrap();
    common::wait_serving(ch.clone(), "ingest over mTLS").await;
    let e = IngestClient::new(ch)
        .ingest(doc("docs/x.md"))
        .await
        .expect_err("the store writes nothing of ingest's without a claim");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert_eq!(reason::of(&e).as_deref(), Some("claim_required"), "{e:?}");
    assert!(e.message().contains("claim"), "{e:?}");
}

/// A service whose store cannot be reached answers UNAVAILABLE with `RetryInfo` (and the
/// reason `unavailable`), so a client knows to retry and when; the same service answers again
/// once the store is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_whose_store_is_down_answers_unavailable_with_retry_info() {
    // An address nothing listens on: the store "down".
    let (l, store) = common::listener().await;
    drop(l);
    let (l, ingest) = common::listener().await;
    let c = cairn_ingest::Config {
        store_addr: store.clone(),
        ..cairn_ingest::Config::default()
    };
    tokio::spawn(cairn_ingest::serve(c, l, std::future::pending()));
    let (l, orchestrator) = common::listener().await;
    let c = cairn_orchestrator::Config {
        store_addr: store.clone(),
        ingest_addr: ingest.clone(),
        resume_on_start: false,
        // Calls ride out a store outage this long before they answer UNAVAILABLE.
        dependency_outage_s: 2,
        ..cairn_orchestrator::Config::default()
    };
    tokio::spawn(cairn_orchestrator::serve(c, l, std::future::pending()));
    for addr in [&ingest, &orchestrator] {
        common::wait_serving(channel(addr), addr).await;
    }
    let retryable = |what: &str, e: &tonic::Status| {
        assert_eq!(e.code(), Code::Unavailable, "{what}: {e:?}");
        assert!(
            reason::retry_delay(e).is_some_and(|d| !d.is_zero()),
            "{what}: UNAVAILABLE without a RetryInfo delay: {e:?}"
        );
        assert!(
            reason::of(e).is_some(),
            "{what}: no ErrorInfo reason: {e:?}"
        );
    };
    let mut o = OrchestratorClient::new(channel(&orchestrator));
    let e = o
        .list_runs(ListRunsRequest {
            project_id: "p".into(),
            ..ListRunsRequest::default()
        })
        .await
        .unwrap_err();
    retryable("ListRuns", &e);
    let e = o
        .get_run(GetRunRequest {
            project_id: "p".into(),
            run_id: "r1".into(),
        })
        .await
        .unwrap_err();
    retryable("GetRun", &e);
    // (Ingest answers a store outage with its manifest, every block `store_unavailable`, after
    // riding it out for `dependency_outage_s`: ingest's own outage tests cover that.)

    // The store comes up on its address: the same orchestrator answers without a restart.
    let data = tempfile::tempdir().unwrap();
    let l = tokio::net::TcpListener::bind(&store).await.unwrap();
    let c = cairn_artifact_store::Config::new(data.path());
    tokio::spawn(cairn_artifact_store::serve(c, l, std::future::pending()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let answer = o
            .list_runs(ListRunsRequest {
                project_id: "p".into(),
                ..ListRunsRequest::default()
            })
            .await;
        match answer {
            Ok(_) => break,
            Err(e) if e.code() == Code::NotFound => break,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the orchestrator still refuses with the store back: {e:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
}
