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

/// `cairn` copied where any user may run it, for the other-user cases below.
fn cairn_for_anyone(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let copy = dir.join("cairn");
    std::fs::copy(assert_cmd::cargo::cargo_bin("cairn"), &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

/// `cairn --addr ADDR -p demo store put FILE PATH` run as the user nobody (setpriv).
fn put_as_nobody(
    cairn: &std::path::Path,
    home: &std::path::Path,
    addr: &str,
    file: &std::path::Path,
    path: &str,
) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(cairn)
        .args(["--addr", addr, "-p", "demo", "store", "put"])
        .arg(file)
        .arg(path)
        .env_clear()
        .env("HOME", home)
        .env("PATH", "/usr/bin:/bin")
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

/// `cairn up --socket PATH`: the socket is mode 0600 from the start, the CLI works through
/// `unix:PATH`, and another local user cannot connect (though it can once the socket's mode
/// lets it: the refusal is the mode's, not the directory's); with a tokens file every service
/// behind the socket still needs a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cairn_up_on_a_socket_lets_only_its_owner_in() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // Everyone may pass through the directory: only the socket's own mode keeps others out.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("data");
    let sock = dir.path().join("cairn.sock");
    let (_up, addr, said) = common::up_on(&data, &["--socket".as_ref(), sock.as_os_str()], &[]);
    assert_eq!(addr, format!("unix:{}", sock.display()), "{said}");
    assert!(
        said.contains("trust: the Unix socket") && said.contains("0600"),
        "{said}"
    );
    let mode = std::fs::symlink_metadata(&sock)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the socket's mode");

    // Its owner: the CLI through unix:PATH.
    let file = dir.path().join("note.md");
    std::fs::write(&file, "owner\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    cairn(&data)
        .args(["--addr", &addr, "-p", "demo", "store", "put"])
        .arg(&file)
        .arg("docs/owner.md")
        .assert()
        .success();
    cairn(&data)
        .args(["--addr", &addr, "-p", "demo", "runs", "list"])
        .assert()
        .success();

    // /proc/self belongs to this process's effective user.
    let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0;
    if !root {
        println!("SKIP: cairn_up_on_a_socket_lets_only_its_owner_in [another user]: setpriv to nobody needs root");
    } else {
        let bin = cairn_for_anyone(dir.path());
        let home = tempfile::tempdir().unwrap();
        std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let refused = put_as_nobody(&bin, home.path(), &addr, &file, "docs/nobody.md");
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success(),
            "nobody wrote through the 0600 socket: {said}"
        );
        assert!(
            said.contains("permission denied") && said.contains("only the user who started it"),
            "{said}"
        );
        cairn(&data)
            .args([
                "--addr",
                &addr,
                "-p",
                "demo",
                "store",
                "stat",
                "docs/nobody.md",
            ])
            .assert()
            .failure();
        // The control: the same user and command get in once the mode lets them.
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
        let let_in = put_as_nobody(&bin, home.path(), &addr, &file, "docs/nobody.md");
        assert!(
            let_in.status.success(),
            "the control failed, so the refusal above proves nothing: {}",
            String::from_utf8_lossy(&let_in.stderr)
        );
    }

    // One trust mode: with a tokens file, the socket's callers need tokens on every service.
    let file = dir.path().join("tokens.toml");
    let data2 = dir.path().join("data2");
    add(&data2, &file, "ada", "admin");
    let sock2 = dir.path().join("tokens.sock");
    let (_up2, addr2, said) = common::up_on(
        &data2,
        &["--socket".as_ref(), sock2.as_os_str()],
        &["--tokens-file".as_ref(), file.as_os_str()],
    );
    assert!(said.contains("trust: tokens, on the Unix socket"), "{said}");
    for (what, code) in outcomes(&addr2, None).await {
        assert_eq!(code, Code::Unauthenticated, "{what} with no token");
    }
}

/// What `--socket` refuses: TLS settings (the file's mode is the socket's only guard), and a
/// console anyone on the machine could use without a login.
#[test]
fn cairn_up_on_a_socket_refuses_tls_and_an_open_console() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sock = dir.path().join("cairn.sock");
    cairn(&data)
        .args(["up", "--socket"])
        .arg(&sock)
        .args(["--console-listen", "127.0.0.1:0"])
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("--no-console")
                .and(predicate::str::contains("--console-token")),
        );
    assert!(!sock.exists(), "the refused start left its socket behind");
    cairn(&data)
        .env("CAIRN_TLS_DIR", dir.path().join("pki"))
        .args(["up", "--no-console", "--socket"])
        .arg(&sock)
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .failure()
        .stderr(predicate::str::contains("TLS"));
    cairn(&data)
        .args(["up", "--no-console", "--listen", "127.0.0.1:0", "--socket"])
        .arg(&sock)
        .assert()
        .failure()
        .stderr(predicate::str::contains("cannot be used with"));
}
