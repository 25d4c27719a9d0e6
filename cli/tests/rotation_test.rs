//! Certificates rotated while runs are in progress: the four services as `cairn serve`
//! processes over mutual TLS, each given only its own directory of one `cairn certs init
//! --split` PKI (as compose mounts them). `cairn certs renew` re-issues every certificate
//! while a sandbox step runs, and later the CA is rolled over with an overlap bundle (the
//! three steps of docs/security.md) while another step runs. Nothing fails: both runs
//! complete with every node once, the services present the new certificates to new
//! connections (`cairn certs show --served`), and after the roll-over a call made with a
//! certificate of the old CA gets no answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::ReadEventsRequest;
use common::procs::{sandbox_backend, wait_for, Proc};

const PROJECT: &str = "rotated";

/// The identities of the four services, as `cairn certs init` names them.
const SERVICES: [&str; 4] = ["artifact-store", "ingest", "sandbox-runner", "orchestrator"];

/// A document through ingest, a sandbox step of `STEP_S` s, a gate, one more document.
const STEP_S: u64 = 12;

fn graph_yaml() -> String {
    format!(
        r##"title: rotated
nodes:
  - id: design
    type: write_file
    path: "docs/{{{{run_id}}}}/design.md"
    content: "# Design\n"
  - id: step
    type: sandbox_run
    needs: [design]
    language: python
    timeout_s: 120
    allowed_prefixes: ["docs/"]
    output_prefix: "docs/{{{{run_id}}}}/step"
    code: |
      import time
      time.sleep({STEP_S})
      open("/output/done.txt", "w").write("ok")
  - {{id: g, type: gate, reason: "check", needs: [step]}}
  - id: after
    type: write_file
    needs: [g]
    path: "docs/{{{{run_id}}}}/after.md"
    content: "# After\n"
"##
    )
}

/// The `cairn` binary with none of the caller's cairn or telemetry environment, JSON logs.
fn cairn() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
    for k in [
        "CAIRN_ADDR",
        "CAIRN_PROJECT",
        "CAIRN_CONFIG",
        "CAIRN_TLS_DIR",
        "CAIRN_TLS_CERT",
        "CAIRN_TLS_KEY",
        "CAIRN_TLS_CA",
        "CAIRN_TOKEN",
        "CAIRN_TOKEN_FILE",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ] {
        c.env_remove(k);
    }
    c.env("OTEL_SDK_DISABLED", "true")
        .env("CAIRN_LOG_FORMAT", "json")
        .env("RUST_LOG", "info");
    c
}

/// `cairn` as the `cli` identity of the directory `tls`, against `addr`.
fn cli(tls: &Path, addr: &str, args: &[&str]) -> std::process::Output {
    cairn()
        .arg("--tls-dir")
        .arg(tls)
        .args(["--addr", addr, "-p", PROJECT])
        .args(args)
        .output()
        .unwrap()
}

fn ok(what: &str, out: std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The serial number of a certificate file (`cairn certs show --json`).
fn serial_of(pem: &Path) -> String {
    let out = ok(
        "certs show",
        cairn()
            .args(["--json", "certs", "show"])
            .arg(pem)
            .output()
            .unwrap(),
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["serial"].as_str().unwrap().to_owned()
}

/// What `cairn certs show --served addr --json` says as `cli` of `tls`; None when no
/// connection is made at all.
fn served(tls: &Path, addr: &str) -> Option<serde_json::Value> {
    let out = cairn()
        .arg("--tls-dir")
        .arg(tls)
        .args(["--json", "certs", "show", "--served", addr])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// The serial number of the certificate the service at `addr` presents to a new connection.
fn served_serial(tls: &Path, addr: &str) -> Option<String> {
    served(tls, addr).and_then(|v| v["serial"].as_str().map(str::to_owned))
}

/// Whether the service at `addr` answers a call made with that certificate (`accepted`).
fn accepted(tls: &Path, addr: &str) -> Option<bool> {
    served(tls, addr).and_then(|v| v["accepted"].as_bool())
}

/// Replaces `path` by rename, as a deployment's tooling would.
fn replace(path: &Path, body: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, body).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Puts `ca` as the trust bundle of the PKI and of every identity directory in it.
fn set_bundle(pki: &Path, ca: &[u8]) {
    replace(&pki.join("ca.pem"), ca);
    for entry in std::fs::read_dir(pki).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("ca.pem").is_file() {
            replace(&dir.join("ca.pem"), ca);
        }
    }
}

/// The four services, each as the identity of its own directory under `pki`.
struct Deployment {
    procs: Vec<Proc>,
    addrs: Vec<(String, String)>,
    orchestrator: String,
    store: String,
}

fn serve(pki: &Path, identity: &str, args: &[&str]) -> Proc {
    let mut c = cairn();
    c.arg("--tls-dir").arg(pki.join(identity)).arg("serve");
    c.args(args);
    Proc::spawn(identity, c)
}

fn deploy(pki: &Path, data: &Path, backend: &str) -> Deployment {
    let data = data.to_str().unwrap();
    let mut store = serve(
        pki,
        "artifact-store",
        &[
            "artifact-store",
            "--listen",
            "127.0.0.1:0",
            "--data-root",
            data,
        ],
    );
    let store_addr = store.wait_addr();
    let mut ingest = serve(
        pki,
        "ingest",
        &[
            "ingest",
            "--listen",
            "127.0.0.1:0",
            "--store-addr",
            &store_addr,
        ],
    );
    let runner_root = format!("{data}-runner");
    let runner_id = format!("rotation{}", std::process::id());
    let mut runner = serve(
        pki,
        "sandbox-runner",
        &[
            "sandbox-runner",
            "--listen",
            "127.0.0.1:0",
            "--pool-size",
            "0",
            "--backend",
            backend,
            "--runner-id",
            &runner_id,
            "--work-root",
            &runner_root,
        ],
    );
    let ingest_addr = ingest.wait_addr();
    let runner_addr = runner.wait_addr();
    let mut orchestrator = serve(
        pki,
        "orchestrator",
        &[
            "orchestrator",
            "--listen",
            "127.0.0.1:0",
            "--store-addr",
            &store_addr,
            "--ingest-addr",
            &ingest_addr,
            "--sandbox-addr",
            &runner_addr,
        ],
    );
    let orchestrator_addr = orchestrator.wait_addr();
    let addrs = SERVICES
        .iter()
        .zip([&store_addr, &ingest_addr, &runner_addr, &orchestrator_addr])
        .map(|(id, a)| ((*id).to_owned(), a.clone()))
        .collect();
    Deployment {
        procs: vec![store, ingest, runner, orchestrator],
        addrs,
        orchestrator: orchestrator_addr,
        store: store_addr,
    }
}

impl Deployment {
    fn logs(&self) -> String {
        self.procs
            .iter()
            .map(|p| format!("--- {}\n{}", p.what, p.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until every service presents the certificate now in its own directory.
    fn wait_serving_the_files(&self, pki: &Path, what: &str) -> Duration {
        let started = Instant::now();
        for (id, addr) in &self.addrs {
            let want = serial_of(&pki.join(id).join(format!("{id}.pem")));
            wait_for(
                &format!("{what}: {id} presenting certificate {want}"),
                Duration::from_secs(15),
                || served_serial(&pki.join("cli"), addr).as_deref() == Some(want.as_str()),
            );
        }
        started.elapsed()
    }

    /// Submits the graph (detached) and waits until its sandbox step runs.
    async fn run_to_its_step(&self, pki: &Path, graph: &Path) -> String {
        let out = ok(
            "cairn run --detach",
            cli(
                &pki.join("cli"),
                &self.orchestrator,
                &["--json", "run", "--detach", graph.to_str().unwrap()],
            ),
        );
        let info: serde_json::Value = serde_json::from_str(&out).unwrap();
        let run = info["run_id"].as_str().unwrap().to_owned();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self
            .event_types(pki, &run)
            .await
            .iter()
            .any(|(t, n)| t == "sandbox_start" && n == "step")
        {
            assert!(
                Instant::now() < deadline,
                "run {run}: the step never started:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        run
    }

    /// The run's events (type, node), read from the store as `cli`.
    async fn event_types(&self, pki: &Path, run: &str) -> Vec<(String, String)> {
        let tls = cairn_server::TlsConfig::dir(pki.join("cli"))
            .load("cli")
            .unwrap()
            .unwrap();
        let channel = cairn_server::connect_tls(&self.store, Some(&tls)).unwrap();
        let mut store = ArtifactStoreClient::new(channel);
        let Ok(stream) = store
            .read_events(ReadEventsRequest {
                project_id: PROJECT.into(),
                run_id: run.into(),
                from_seq: 1,
                follow: false,
                limit: 0,
            })
            .await
        else {
            return Vec::new();
        };
        let mut stream = stream.into_inner();
        let mut out = Vec::new();
        while let Ok(Some(e)) = stream.message().await {
            out.push((e.r#type, e.node_id));
        }
        out
    }

    /// Approves the run's gate as `cli` of the PKI and checks that it completed with every
    /// node once and nothing failed.
    async fn approve_and_check(&self, pki: &Path, run: &str) {
        // The run may not have reached its gate yet: approve once it waits there.
        let deadline = Instant::now() + Duration::from_secs(60);
        let out = loop {
            let out = cli(
                &pki.join("cli"),
                &self.orchestrator,
                &["--json", "gate", "approve", run, "g"],
            );
            let early = String::from_utf8_lossy(&out.stdout).contains("\"wrong_state\"")
                && String::from_utf8_lossy(&out.stdout).contains("not been reached yet");
            if !early || Instant::now() > deadline {
                break out;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        ok("gate approve", out);
        let deadline = Instant::now() + Duration::from_secs(60);
        let events = loop {
            let events = self.event_types(pki, run).await;
            let ended = ["task.completed", "task.failed", "task.canceled"];
            if events.iter().any(|(t, _)| ended.contains(&t.as_str())) {
                break events;
            }
            assert!(
                Instant::now() < deadline,
                "run {run} did not end: {events:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let types: Vec<&str> = events.iter().map(|(t, _)| t.as_str()).collect();
        assert!(types.contains(&"task.completed"), "run {run}: {types:?}");
        for bad in [
            "node.failed",
            "sandbox_failed",
            "ingest.failed",
            "ingest.hook_failed",
            "ingest.incomplete",
            "task.failed",
            "run.stalled",
        ] {
            assert!(!types.contains(&bad), "run {run}: {bad} in {types:?}");
        }
        for node in ["design", "step", "after"] {
            let started = events
                .iter()
                .filter(|(t, n)| t == "node.started" && n == node)
                .count();
            assert_eq!(started, 1, "run {run}: node {node} started {started} times");
        }
        // Both documents went through ingest (orchestrator -> ingest -> store).
        let ingested = types.iter().filter(|t| **t == "ingest.completed").count();
        assert_eq!(ingested, 2, "run {run}: {types:?}");
    }

    /// Whether the run's sandbox step has finished.
    async fn step_done(&self, pki: &Path, run: &str) -> bool {
        self.event_types(pki, run)
            .await
            .iter()
            .any(|(t, n)| t == "sandbox_complete" && n == "step")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_certificate_renewed_and_the_ca_rolled_over_while_runs_go_on() {
    let Some(backend) = sandbox_backend() else {
        println!("SKIP: every_certificate_renewed...: neither Docker with cairn-sandbox:latest nor bubblewrap is available");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let pki: PathBuf = dir.path().join("pki");
    ok(
        "certs init",
        cairn()
            .args(["certs", "init", "--split", "--days", "30", "--out"])
            .arg(&pki)
            .output()
            .unwrap(),
    );
    let graph = dir.path().join("graph.yaml");
    std::fs::write(&graph, graph_yaml()).unwrap();
    let d = deploy(&pki, &dir.path().join("data"), backend);

    // 1. Renew every certificate while a sandbox step runs.
    let run = d.run_to_its_step(&pki, &graph).await;
    let before: Vec<String> = d
        .addrs
        .iter()
        .map(|(_, a)| served_serial(&pki.join("cli"), a).expect("served before the renewal"))
        .collect();
    ok(
        "certs renew",
        cairn()
            .args(["certs", "renew", "--dir"])
            .arg(&pki)
            .output()
            .unwrap(),
    );
    let took = d.wait_serving_the_files(&pki, "after certs renew");
    for ((id, addr), old) in d.addrs.iter().zip(&before) {
        let now = served_serial(&pki.join("cli"), addr).unwrap();
        assert_ne!(&now, old, "{id} still presents its old certificate");
    }
    assert!(
        !d.step_done(&pki, &run).await,
        "the step ended before the renewal was taken; make STEP_S longer"
    );
    println!(
        "renewal: every service presented its new certificate {} ms after `cairn certs renew`",
        took.as_millis()
    );
    d.approve_and_check(&pki, &run).await;

    // 2. Roll the CA over while another step runs: the new CA joins the bundle, every
    //    certificate is re-issued by it, the old CA leaves the bundle.
    let run = d.run_to_its_step(&pki, &graph).await;
    let old_ca = std::fs::read(pki.join("ca.pem")).unwrap();
    // A client of the old CA, kept aside (it trusts either CA: only its certificate is old).
    let old_client = dir.path().join("old-cli");
    std::fs::create_dir(&old_client).unwrap();
    for f in ["cli.pem", "cli.key"] {
        std::fs::copy(pki.join("cli").join(f), old_client.join(f)).unwrap();
    }
    let new_ca_dir = dir.path().join("new-ca");
    ok(
        "certs init (the new CA)",
        cairn()
            .args(["certs", "init", "--name", "cli", "--out"])
            .arg(&new_ca_dir)
            .output()
            .unwrap(),
    );
    let new_ca = std::fs::read(new_ca_dir.join("ca.pem")).unwrap();
    set_bundle(&pki, &[old_ca.clone(), new_ca.clone()].concat());
    replace(
        &pki.join("ca.key"),
        &std::fs::read(new_ca_dir.join("ca.key")).unwrap(),
    );
    // Every service reads its files again within 3 s of a change.
    tokio::time::sleep(Duration::from_secs(4)).await;
    ok(
        "certs renew (from the new CA)",
        cairn()
            .args(["certs", "renew", "--dir"])
            .arg(&pki)
            .output()
            .unwrap(),
    );
    d.wait_serving_the_files(&pki, "after the renewal from the new CA");
    set_bundle(&pki, &new_ca);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !d.step_done(&pki, &run).await,
        "the step ended before the roll-over was done; make STEP_S longer"
    );
    std::fs::write(old_client.join("ca.pem"), &new_ca).unwrap();
    for (id, addr) in &d.addrs {
        assert!(
            served_serial(&pki.join("cli"), addr).is_some(),
            "{id} refuses a client of the new CA"
        );
        assert_eq!(
            accepted(&pki.join("cli"), addr),
            Some(true),
            "{id} refuses a client of the new CA"
        );
        // The old client still sees the server's certificate (TLS 1.3 finishes its side of
        // the handshake first); its calls are what must go unanswered.
        assert_eq!(
            accepted(&old_client, addr),
            Some(false),
            "{id} still takes a certificate of the old CA after it left the bundle"
        );
    }
    d.approve_and_check(&pki, &run).await;
}
