//! One trust mode per deployment: `cairn up --tokens-file` requires a credential on every
//! service of its port (the store, ingest and the sandbox-runner as well as the
//! orchestrator), takes admin tokens there and nothing less, says so at start, and takes the
//! token from a file (`--token-file`); `cairn up` without any authentication says that too.
#![allow(clippy::unwrap_used)]

mod common;

use assert_cmd::Command;
use bytes::Bytes;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::ingest_client::IngestClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient;
use cairn_proto::v1::{
    put_request, GetRequest, GetRunnerInfoRequest, IngestRequest, ListRunsRequest, PutHeader,
    PutRequest, RunRequest,
};
use cairn_server::roles::Bearer;
use predicates::prelude::*;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::Code;

fn cairn(data: &std::path::Path) -> Command {
    let mut cmd = common::cairn(data);
    cmd.env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_TOKEN_FILE")
        .env_remove("CAIRN_TOKENS_FILE")
        .env_remove("CAIRN_ORCHESTRATOR_AUTH_TOKENS_FILE");
    cmd
}

fn add(data: &std::path::Path, file: &std::path::Path, name: &str, role: &str) -> String {
    let out = cairn(data)
        .args(["tokens", "add", name, "--role", role, "--file"])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

type Authed = InterceptedService<Channel, Bearer>;

struct Clients {
    store: ArtifactStoreClient<Authed>,
    ingest: IngestClient<Authed>,
    runner: SandboxRunnerClient<Authed>,
    orchestrator: OrchestratorClient<Authed>,
}

fn clients(addr: &str, token: Option<&str>) -> Clients {
    let channel = cairn_server::connect(addr).unwrap();
    let authed = || InterceptedService::new(channel.clone(), Bearer::new(token).unwrap());
    Clients {
        store: ArtifactStoreClient::new(authed()),
        ingest: IngestClient::new(authed()),
        runner: SandboxRunnerClient::new(authed()),
        orchestrator: OrchestratorClient::new(authed()),
    }
}

async fn put(c: &mut Clients, path: &str) -> Result<(), tonic::Status> {
    let msgs = vec![
        PutRequest {
            msg: Some(put_request::Msg::Header(PutHeader {
                project_id: "demo".into(),
                path: path.into(),
                create_project: true,
                overwrite: true,
                ..Default::default()
            })),
        },
        PutRequest {
            msg: Some(put_request::Msg::Chunk(Bytes::from_static(
                b"state: completed\n",
            ))),
        },
    ];
    c.store.put(tokio_stream::iter(msgs)).await.map(|_| ())
}

async fn get(c: &mut Clients, path: &str) -> Result<(), tonic::Status> {
    let mut s = c
        .store
        .get(GetRequest {
            project_id: "demo".into(),
            path: path.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    while s.message().await?.is_some() {}
    Ok(())
}

/// The codes of: store Put of a run record, store Get, ingest Parse, sandbox Run, runner
/// info, orchestrator ListRuns.
async fn outcomes(addr: &str, token: Option<&str>) -> Vec<(&'static str, Code)> {
    let mut c = clients(addr, token);
    let code = |r: Result<(), tonic::Status>| r.err().map_or(Code::Ok, |s| s.code());
    let parse = c
        .ingest
        .parse(IngestRequest {
            project_id: "demo".into(),
            content: "text\n".into(),
            ..Default::default()
        })
        .await
        .map(|_| ());
    let run = c
        .runner
        .run(RunRequest {
            language: "sh".into(),
            code: "exit 0".into(),
            ..Default::default()
        })
        .await
        .map(|_| ());
    let info = c
        .runner
        .get_runner_info(GetRunnerInfoRequest {})
        .await
        .map(|_| ());
    let runs = c
        .orchestrator
        .list_runs(ListRunsRequest {
            project_id: "demo".into(),
            ..Default::default()
        })
        .await
        .map(|_| ());
    vec![
        (
            "store Put .cairn/runs/x/task.yaml",
            code(put(&mut c, ".cairn/runs/x/task.yaml").await),
        ),
        ("store Get", code(get(&mut c, "docs/seen.md").await)),
        ("ingest Parse", code(parse)),
        ("sandbox Run", code(run)),
        ("sandbox GetRunnerInfo", code(info)),
        ("orchestrator ListRuns", code(runs)),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cairn_up_with_a_tokens_file_requires_a_token_on_every_service() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("tokens.toml");
    let admin = add(&data, &file, "ada", "admin");
    let operator = add(&data, &file, "ozzy", "operator");
    let (_up, addr, said) = common::up(&data, &["--tokens-file".as_ref(), file.as_os_str()]);
    assert!(said.contains("trust: tokens"), "{said}");

    // The admin puts a file the others then try to read.
    let mut c = clients(&addr, Some(&admin));
    put(&mut c, "docs/seen.md").await.unwrap();

    for (what, code) in outcomes(&addr, None).await {
        assert_eq!(code, Code::Unauthenticated, "{what} with no token");
    }
    for (what, code) in outcomes(&addr, Some("cairn_not_a_token")).await {
        assert_eq!(code, Code::Unauthenticated, "{what} with a wrong token");
    }
    for (what, code) in outcomes(&addr, Some(&operator)).await {
        let expected = if what.starts_with("orchestrator") {
            Code::Ok
        } else {
            Code::PermissionDenied
        };
        assert_eq!(code, expected, "{what} with an operator's token");
    }
    let admin_outcomes = outcomes(&addr, Some(&admin)).await;
    for (what, code) in &admin_outcomes {
        if !["sandbox Run", "ingest Parse"].contains(what) {
            assert_eq!(*code, Code::Ok, "{what} with an admin's token");
        } else {
            // Past authentication: whatever the handler answers of this bare request, not a
            // refusal.
            assert!(
                !matches!(code, Code::Unauthenticated | Code::PermissionDenied),
                "{what} with an admin's token: {code:?}"
            );
        }
    }
    // Probes stay open.
    assert!(cairn_server::serving(
        cairn_server::connect(&addr).unwrap(),
        "",
        std::time::Duration::from_secs(5)
    )
    .await
    .unwrap());

    // The CLI reads the token from a file and sends it to the store too.
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, format!("{admin}\n")).unwrap();
    cairn(&data)
        .args(["--addr", &addr, "--token-file"])
        .arg(&token_file)
        .args(["-p", "demo", "store", "get", "docs/seen.md"])
        .assert()
        .success();
    cairn(&data)
        .args([
            "--addr",
            &addr,
            "-p",
            "demo",
            "store",
            "get",
            "docs/seen.md",
        ])
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("Unauthenticated").or(predicate::str::contains("credential")),
        );
    // On the command line it still works, with a warning.
    cairn(&data)
        .args(["--addr", &addr, "--token", &admin, "runs", "list"])
        .assert()
        .success()
        .stderr(predicate::str::contains("warning: --token"));
    cairn(&data)
        .env("CAIRN_TOKEN", &admin)
        .args(["--addr", &addr, "runs", "list"])
        .assert()
        .success()
        .stderr(predicate::str::contains("warning").not());
}

#[test]
fn cairn_up_without_authentication_says_so_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (_up, _addr, said) = common::up(&dir.path().join("data"), &[]);
    assert!(
        said.contains("trust: NONE") && said.contains("--tokens-file"),
        "{said}"
    );
}
