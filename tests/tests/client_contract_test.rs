//! What a gRPC client author expects of every cairn service, over real gRPC on loopback (the
//! four services each on a listener of its own): refusals carry a `google.rpc.Status` with an
//! `ErrorInfo` (reason word, domain `cairn`, what was refused), a request that is not protobuf
//! is INVALID_ARGUMENT, enum numbers the protos do not declare are refused, SubmitRun is
//! idempotent by request_id, reflection lists exactly the services a port serves, gzip requests are accepted,
//! and a permanent limit error is INVALID_ARGUMENT, never retryable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use cairn_proto::reason;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient;
use cairn_proto::v1::{
    put_request, AppendEventsRequest, ClaimRunRequest, EventInput, Limits, ListRunsRequest,
    PackRequest, PutHeader, PutRequest, RunFence, RunRequest, StatRequest, SubmitRunRequest,
    UpdateJsonRequest, WriteFileRequest,
};
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;
use tonic::Code;

const GRAPH: &str =
    "nodes:\n  - {id: a, type: write_file, path: 'docs/{{run_id}}/a.txt', content: a}\n";

mod common;

use common::Services as Deployment;

/// The four services in plaintext on loopback, each answering health before the test starts
/// (the sandbox-runner is waited for by the tests that call it).
async fn deploy() -> Deployment {
    let d = common::start(&cairn_server::TlsConfig::default()).await;
    for addr in [&d.store, &d.ingest, &d.orchestrator] {
        wait_serving(addr).await;
    }
    d
}

async fn wait_serving(addr: &str) {
    common::wait_serving(cairn_server::connect(addr).unwrap(), addr).await;
}

fn channel(addr: &str) -> Channel {
    cairn_server::connect(addr).unwrap()
}

fn store(d: &Deployment) -> ArtifactStoreClient<Channel> {
    ArtifactStoreClient::new(channel(&d.store))
}

async fn put(
    client: &mut ArtifactStoreClient<Channel>,
    header: PutHeader,
    body: &[u8],
) -> Result<cairn_proto::v1::PutResponse, tonic::Status> {
    let messages = vec![
        PutRequest {
            msg: Some(put_request::Msg::Header(header)),
        },
        PutRequest {
            msg: Some(put_request::Msg::Chunk(body.to_vec().into())),
        },
    ];
    client
        .put(tokio_stream::iter(messages))
        .await
        .map(tonic::Response::into_inner)
}

fn header(project: &str, path: &str) -> PutHeader {
    PutHeader {
        project_id: project.into(),
        path: path.into(),
        create_project: true,
        ..PutHeader::default()
    }
}

/// The refusal's reason word is in `cairn-reason` and in the `ErrorInfo` (domain `cairn`).
#[track_caller]
fn refused(status: &tonic::Status, code: Code, word: &str) -> reason::ErrorInfo {
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(reason::of(status).as_deref(), Some(word), "{status:?}");
    let info = reason::info(status).unwrap_or_else(|| panic!("no ErrorInfo detail: {status:?}"));
    assert_eq!(info.reason, word, "{info:?}");
    assert_eq!(info.domain, reason::DOMAIN, "{info:?}");
    info
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_refusals_carry_error_info_with_what_was_refused() {
    let d = deploy().await;
    let mut s = store(&d);
    put(&mut s, header("p", "docs/a.txt"), b"one")
        .await
        .unwrap();

    let e = put(&mut s, header("p", "docs/a.txt"), b"two")
        .await
        .unwrap_err();
    let info = refused(&e, Code::AlreadyExists, "exists");
    assert_eq!(
        info.metadata.get("path").map(String::as_str),
        Some("docs/a.txt")
    );
    assert_eq!(info.metadata.get("project").map(String::as_str), Some("p"));

    let e = s
        .stat(StatRequest {
            project_id: "p".into(),
            path: "docs/missing.txt".into(),
            include_sha256: false,
        })
        .await
        .unwrap_err();
    let info = refused(&e, Code::NotFound, "not_found");
    assert_eq!(
        info.metadata.get("path").map(String::as_str),
        Some("docs/missing.txt")
    );
    assert_eq!(info.metadata.get("project").map(String::as_str), Some("p"));

    // ABORTED: a version conflict names the path and both versions.
    let update = |expected_version| UpdateJsonRequest {
        project_id: "p".into(),
        path: "docs/doc.json".into(),
        expected_version,
        patch_json: "{\"n\": 1}".into(),
        ..UpdateJsonRequest::default()
    };
    s.update_json(update(0)).await.unwrap();
    let e = s.update_json(update(7)).await.unwrap_err();
    let info = refused(&e, Code::Aborted, "version_conflict");
    assert_eq!(
        info.metadata.get("path").map(String::as_str),
        Some("docs/doc.json")
    );

    // FAILED_PRECONDITION: a fenced writer learns which run it lost.
    let claim = || ClaimRunRequest {
        project_id: "p".into(),
        run_id: "r1".into(),
        holder: "t".into(),
    };
    let old = s.claim_run(claim()).await.unwrap().into_inner().epoch;
    s.claim_run(claim()).await.unwrap();
    let e = s
        .append_events(AppendEventsRequest {
            project_id: "p".into(),
            run_id: "r1".into(),
            epoch: old,
            events: vec![EventInput {
                r#type: "x.y".into(),
                ..EventInput::default()
            }],
            ..AppendEventsRequest::default()
        })
        .await
        .unwrap_err();
    let info = refused(&e, Code::FailedPrecondition, "fenced");
    assert_eq!(info.metadata.get("run_id").map(String::as_str), Some("r1"));
    // The PreconditionFailure detail names the violation and the run.
    assert_eq!(
        reason::preconditions(&e),
        vec![("fenced".to_owned(), "r1".to_owned())]
    );
    let mut fenced_put = header("p", "docs/b.txt");
    fenced_put.fence = Some(RunFence {
        run_id: "r1".into(),
        epoch: old,
    });
    let e = put(&mut s, fenced_put, b"b").await.unwrap_err();
    let info = refused(&e, Code::FailedPrecondition, "fenced");
    assert_eq!(info.metadata.get("run_id").map(String::as_str), Some("r1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn submit_run_is_idempotent_by_request_id_and_names_the_existing_run() {
    let d = deploy().await;
    let mut o = OrchestratorClient::new(channel(&d.orchestrator));
    let submit = |request_id: &str, run_id: &str| SubmitRunRequest {
        project_id: "p".into(),
        graph_yaml: GRAPH.into(),
        request_id: request_id.into(),
        run_id: run_id.into(),
        ..SubmitRunRequest::default()
    };
    let first = o
        .submit_run(submit("req-1", ""))
        .await
        .unwrap()
        .into_inner();
    let again = o
        .submit_run(submit("req-1", ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.run_id, again.run_id, "a retry returns the first run");
    let other = o
        .submit_run(submit("req-2", ""))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(
        first.run_id, other.run_id,
        "another request_id is another run"
    );
    let listed = o
        .list_runs(ListRunsRequest {
            project_id: "p".into(),
            ..ListRunsRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.runs.len(), 2, "{listed:?}");

    // Re-submitting a run id is ALREADY_EXISTS naming the run.
    let e = o.submit_run(submit("", &first.run_id)).await.unwrap_err();
    let info = refused(&e, Code::AlreadyExists, "exists");
    assert_eq!(info.metadata.get("run_id"), Some(&first.run_id));
    assert_eq!(info.metadata.get("project").map(String::as_str), Some("p"));

    let e = o.submit_run(submit("req-3", "r9")).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    let e = o
        .get_run(cairn_proto::v1::GetRunRequest {
            project_id: "p".into(),
            run_id: "nope".into(),
        })
        .await
        .unwrap_err();
    let info = refused(&e, Code::NotFound, "not_found");
    assert_eq!(
        info.metadata.get("run_id").map(String::as_str),
        Some("nope")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_enum_numbers_are_refused_on_every_request_enum() {
    let d = deploy().await;
    let mut s = store(&d);
    let mut h = header("p", "docs/e.txt");
    h.durability = 9;
    let e = put(&mut s, h, b"x").await.unwrap_err();
    let info = refused(&e, Code::InvalidArgument, reason::UNKNOWN_ENUM);
    assert_eq!(
        info.metadata.get("field").map(String::as_str),
        Some("durability")
    );

    let e = s
        .update_json(UpdateJsonRequest {
            project_id: "p".into(),
            path: "docs/d.json".into(),
            patch_json: "{}".into(),
            merge: 5,
            ..UpdateJsonRequest::default()
        })
        .await
        .unwrap_err();
    refused(&e, Code::InvalidArgument, reason::UNKNOWN_ENUM);

    let e = s
        .append_events(AppendEventsRequest {
            project_id: "p".into(),
            run_id: "r".into(),
            events: vec![EventInput {
                r#type: "x.y".into(),
                level: 42,
                ..EventInput::default()
            }],
            ..AppendEventsRequest::default()
        })
        .await
        .unwrap_err();
    refused(&e, Code::InvalidArgument, reason::UNKNOWN_ENUM);

    let mut o = OrchestratorClient::new(channel(&d.orchestrator));
    let e = o
        .list_runs(ListRunsRequest {
            project_id: "p".into(),
            states: vec![42],
            ..ListRunsRequest::default()
        })
        .await
        .unwrap_err();
    let info = refused(&e, Code::InvalidArgument, reason::UNKNOWN_ENUM);
    assert_eq!(
        info.metadata.get("field").map(String::as_str),
        Some("states")
    );

    // The runner checks its enums before looking the session up.
    wait_serving(&d.runner).await;
    let mut r = SandboxRunnerClient::new(channel(&d.runner));
    let e = r
        .write_file(WriteFileRequest {
            session_id: "s".into(),
            path: "a.txt".into(),
            mode: 7,
            ..WriteFileRequest::default()
        })
        .await
        .unwrap_err();
    refused(&e, Code::InvalidArgument, reason::UNKNOWN_ENUM);
    let e = r
        .pack(PackRequest {
            session_id: "s".into(),
            format: 7,
            ..PackRequest::default()
        })
        .await
        .unwrap_err();
    refused(&e, Code::InvalidArgument, reason::UNKNOWN_ENUM);
}

/// Calls `path` with `bytes` that are not a valid protobuf of any cairn request (a string
/// field holding bytes that are not UTF-8).
async fn raw_call(addr: &str, path: &str, bytes: Vec<u8>) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel(addr));
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<Vec<u8>, ()>::default();
    grpc.unary(tonic::Request::new(bytes), path.parse().unwrap(), codec)
        .await
        .expect_err("a malformed request must be refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_request_is_invalid_argument_on_every_service() {
    let d = deploy().await;
    wait_serving(&d.runner).await;
    // Vec<u8> encodes as field 1 (bytes): every request below has a string field 1.
    let not_utf8 = vec![0xff, 0xfe, 0xfd];
    for (addr, path) in [
        (&d.store, "/cairn.v1.ArtifactStore/Stat"),
        (&d.store, "/cairn.v1.ArtifactStore/Get"),
        (&d.orchestrator, "/cairn.v1.Orchestrator/GetRun"),
        (&d.runner, "/cairn.v1.SandboxRunner/ReadFile"),
    ] {
        let e = raw_call(addr, path, not_utf8.clone()).await;
        refused(&e, Code::InvalidArgument, reason::MALFORMED);
        assert!(
            e.message().contains("not a valid protobuf"),
            "{path}: {e:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reflection_lists_health_and_gzip_requests_are_accepted() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let d = deploy().await;
    wait_serving(&d.runner).await;
    for (addr, own) in [
        (&d.store, "cairn.v1.ArtifactStore"),
        (&d.ingest, "cairn.v1.Ingest"),
        (&d.runner, "cairn.v1.SandboxRunner"),
        (&d.orchestrator, "cairn.v1.Orchestrator"),
    ] {
        let mut client = ServerReflectionClient::new(channel(addr));
        let mut replies = client
            .server_reflection_info(tokio_stream::once(ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            }))
            .await
            .unwrap()
            .into_inner();
        let reply = replies.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
            panic!("{addr}: not a service list: {reply:?}");
        };
        let mut names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        // Exactly what the port serves: a client never finds a service that answers
        // UNIMPLEMENTED.
        assert_eq!(
            names,
            [
                own,
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            ],
            "{addr}"
        );
        // Its file resolves too, so a client can call it from reflection alone.
        let mut replies = client
            .server_reflection_info(tokio_stream::once(ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::FileContainingSymbol(
                    "grpc.health.v1.Health".into(),
                )),
            }))
            .await
            .unwrap()
            .into_inner();
        let reply = replies.message().await.unwrap().unwrap();
        assert!(
            matches!(
                reply.message_response,
                Some(MessageResponse::FileDescriptorResponse(_))
            ),
            "{addr}: {reply:?}"
        );
    }

    // gzip-compressed requests, unary and streamed, on every service.
    let mut s = store(&d).send_compressed(CompressionEncoding::Gzip);
    let body = vec![b'z'; 256 * 1024];
    let r = put(&mut s, header("p", "docs/gz.txt"), &body)
        .await
        .unwrap();
    assert_eq!(r.digest.unwrap().size_bytes, body.len() as u64);
    let st = s
        .stat(StatRequest {
            project_id: "p".into(),
            path: "docs/gz.txt".into(),
            include_sha256: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.size_bytes, body.len() as u64);
    let mut o = OrchestratorClient::new(channel(&d.orchestrator))
        .send_compressed(CompressionEncoding::Gzip);
    o.list_runs(ListRunsRequest {
        project_id: "p".into(),
        ..ListRunsRequest::default()
    })
    .await
    .unwrap();
    let mut r =
        SandboxRunnerClient::new(channel(&d.runner)).send_compressed(CompressionEncoding::Gzip);
    r.get_runner_info(cairn_proto::v1::GetRunnerInfoRequest {})
        .await
        .unwrap();
    let mut i = cairn_proto::v1::ingest_client::IngestClient::new(channel(&d.ingest))
        .send_compressed(CompressionEncoding::Gzip);
    let answer = i
        .get_enabled(cairn_proto::v1::GetEnabledRequest {
            project_id: "p".into(),
            ..cairn_proto::v1::GetEnabledRequest::default()
        })
        .await;
    // The request decoded: the answer is ingest's own (a project without flags is NOT_FOUND).
    if let Err(e) = answer {
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permanent_limit_error_is_invalid_argument_not_unavailable() {
    let d = deploy().await;
    wait_serving(&d.runner).await;
    let mut r = SandboxRunnerClient::new(channel(&d.runner));
    for memory_bytes in [1, u64::MAX] {
        let e = r
            .run(RunRequest {
                language: "bash".into(),
                code: "true".into(),
                limits: Some(Limits {
                    memory_bytes,
                    ..Limits::default()
                }),
                ..RunRequest::default()
            })
            .await
            .unwrap_err();
        let info = refused(&e, Code::InvalidArgument, "limit_out_of_range");
        assert_eq!(
            info.metadata.get("field").map(String::as_str),
            Some("limits.memory_bytes"),
            "{info:?}"
        );
    }
}
