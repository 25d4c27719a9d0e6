//! No request reaches the orchestrator's host over real mutual TLS on loopback: a client that
//! still sends the removed `base_dir` (field 10) at the PKI directory, with a plan task whose
//! `prompt_file` names the orchestrator's private key, gets a refusal; the key is in no run
//! record, and no run exists to watch. The same for `/etc` and `passwd`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{GetRequest, GetRunRequest, ListRequest, RunInfo};
use cairn_server::pki::{self, PkiSpec};
use cairn_server::TlsConfig;
use tonic::transport::Channel;
use tonic::Code;

/// SubmitRunRequest as clients sent it while it had `base_dir` (field 10).
#[derive(Clone, PartialEq, prost::Message)]
struct LegacySubmit {
    #[prost(string, tag = "1")]
    project_id: String,
    #[prost(string, tag = "2")]
    graph_yaml: String,
    #[prost(string, tag = "4")]
    run_id: String,
    #[prost(string, tag = "10")]
    base_dir: String,
}

fn plan_naming(file: &str) -> String {
    format!(
        "nodes:\n  - {{id: p, type: plan, limits: {{tasks: {{t: {{daily_limit: 1, prompt_file: \"{file}\"}}}}}}}}\n"
    )
}

async fn submit_legacy(ch: Channel, req: LegacySubmit) -> Result<RunInfo, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await.unwrap();
    grpc.unary(
        tonic::Request::new(req),
        "/cairn.v1.Orchestrator/SubmitRun".parse().unwrap(),
        tonic_prost::ProstCodec::<LegacySubmit, RunInfo>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_orchestrators_key_is_not_readable_through_a_submit() {
    let pki_dir = tempfile::tempdir().unwrap();
    pki::init(&PkiSpec::new(pki_dir.path())).unwrap();
    let tls = TlsConfig::dir(pki_dir.path());
    let s = common::start(&tls).await;
    let channel = |addr: &str| {
        let id = tls.load("cli").unwrap().unwrap();
        cairn_server::connect_tls(addr, Some(&id)).unwrap()
    };
    let orch = channel(&s.orchestrator);
    common::wait_serving(orch.clone(), "the orchestrator (over mTLS)").await;

    let key = std::fs::read_to_string(pki_dir.path().join("orchestrator.key")).unwrap();
    let key_body: String = key.lines().nth(1).unwrap().to_owned();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let cases = [
        (
            "key",
            pki_dir.path().display().to_string(),
            "orchestrator.key",
        ),
        ("passwd", "/etc".to_owned(), "passwd"),
    ];
    for (run, base_dir, file) in cases {
        let r = submit_legacy(
            orch.clone(),
            LegacySubmit {
                project_id: "p".into(),
                graph_yaml: plan_naming(file),
                run_id: run.into(),
                base_dir,
            },
        )
        .await;
        let e = r.expect_err("a submit naming a host file must be refused");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains("was not sent with the graph"),
            "{}",
            e.message()
        );
        assert!(!e.message().contains(&key_body) && !e.message().contains("root:x:"));
        let get = OrchestratorClient::new(orch.clone())
            .get_run(GetRunRequest {
                project_id: "p".into(),
                run_id: run.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(get.code(), Code::NotFound, "{get:?}");
    }
    // Nothing of either file reached the project.
    let mut store = ArtifactStoreClient::new(channel(&s.store));
    let listed = store
        .list(ListRequest {
            project_id: "p".into(),
            prefix: String::new(),
            recursive: true,
            page: None,
        })
        .await;
    let paths: Vec<String> = match listed {
        Ok(r) => r.into_inner().entries.into_iter().map(|e| e.path).collect(),
        Err(e) => {
            assert_eq!(e.code(), Code::NotFound, "{e:?}");
            Vec::new()
        }
    };
    for path in paths {
        let mut got = store
            .get(GetRequest {
                project_id: "p".into(),
                path: path.clone(),
                offset: 0,
                length: 0,
            })
            .await
            .unwrap()
            .into_inner();
        let mut text = Vec::new();
        while let Some(m) = got.message().await.unwrap() {
            if let Some(cairn_proto::v1::get_response::Msg::Chunk(c)) = m.msg {
                text.extend_from_slice(&c);
            }
        }
        let text = String::from_utf8_lossy(&text);
        assert!(
            !text.contains(&key_body),
            "{path} holds the orchestrator's key"
        );
        assert!(
            passwd.is_empty() || !text.contains(passwd.lines().next().unwrap_or("\u{0}")),
            "{path} holds /etc/passwd"
        );
    }
    drop(s);
}
