//! Test support for humans as principals: an artifact-store and a real orchestrator with a
//! tokens file (one person per role, and one approver scoped to one project) on loopback, and
//! a capture of everything logged at warn.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cairn_orchestrator::auth::tokens::TokensFile;
use cairn_orchestrator::auth::Role;
use cairn_orchestrator::Config;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{GetRunRequest, RunInfo, SubmitRunRequest, TaskState};
use tonic::transport::Channel;
use tonic::Request;

use crate::common::{self, serve_host, PROJECT};

pub const OTHER: &str = "elsewhere";

pub const GATED: &str = r#"
nodes:
  - {id: draft, type: write_file, path: "docs/{{run_id}}/draft.txt", content: draft}
  - {id: review, type: gate, reason: "check the draft", needs: [draft]}
  - {id: publish, type: write_file, path: "docs/{{run_id}}/published.txt", content: "ok", needs: [review]}
"#;

/// Everything logged at warn or above, for the whole test process.
pub fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || Capture(writer.clone()))
            .try_init();
        buf
    })
    .clone()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn logged() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap()).into_owned()
}

/// A store and an orchestrator with (or without) a tokens file, on loopback.
pub struct Secured {
    pub dir: tempfile::TempDir,
    pub tokens_file: std::path::PathBuf,
    /// name -> token
    pub tokens: HashMap<&'static str, String>,
    pub orch: Channel,
    pub orch_addr: String,
    pub store_addr: String,
    pub store: ArtifactStoreClient<Channel>,
}

/// People of the tokens file: name, role, projects.
pub const PEOPLE: &[(&str, Role, &[&str])] = &[
    ("vic", Role::Viewer, &[]),
    ("ozzy", Role::Operator, &[]),
    ("ann", Role::Approver, &[]),
    ("ada", Role::Admin, &[]),
    ("pat", Role::Approver, &[PROJECT]),
];

impl Secured {
    pub async fn start(with_tokens: bool) -> Secured {
        Secured::start_with(with_tokens, |_, _| {}).await
    }

    /// As [`Secured::start`], with `configure` changing the orchestrator's config (given the
    /// test's directory) before it starts.
    pub async fn start_with(
        with_tokens: bool,
        configure: impl FnOnce(&mut Config, &std::path::Path),
    ) -> Secured {
        logs();
        let dir = tempfile::tempdir().unwrap();
        let tokens_file = dir.path().join("tokens.toml");
        let mut file = TokensFile::default();
        let mut tokens = HashMap::new();
        for (name, role, projects) in PEOPLE {
            let projects: Vec<String> = projects.iter().map(|p| (*p).to_owned()).collect();
            tokens.insert(*name, file.add(name, *role, &projects).unwrap());
        }
        file.write(&tokens_file).unwrap();

        let store = cairn_artifact_store::artifact_store_service(
            cairn_artifact_store::Config::new(dir.path().join("data")),
        )
        .await
        .unwrap();
        let mut host = cairn_server::Host::new();
        host.add(store);
        let store_addr = serve_host(host).await;

        let mut config = Config {
            store_addr: store_addr.clone(),
            ingest_addr: String::new(),
            snapshot_interval_ms: 100,
            ..Config::default()
        };
        if with_tokens {
            config.auth.tokens_file = tokens_file.display().to_string();
        }
        configure(&mut config, dir.path());
        let (server, _handle) = cairn_orchestrator::orchestrator_service(config)
            .await
            .unwrap();
        let mut host = cairn_server::Host::new();
        host.add(server);
        let orch_addr = serve_host(host).await;
        Secured {
            dir,
            tokens_file,
            tokens,
            orch: common::channel(&orch_addr).await,
            orch_addr,
            store_addr: store_addr.clone(),
            store: ArtifactStoreClient::new(common::channel(&store_addr).await),
        }
    }

    pub fn client(&self) -> OrchestratorClient<Channel> {
        OrchestratorClient::new(self.orch.clone())
    }

    pub fn token(&self, name: &str) -> String {
        self.tokens[name].clone()
    }

    /// A run of `project` submitted by the admin, waited for until it blocks at its gate.
    pub async fn blocked_run(&self, project: &str) -> String {
        let run = self
            .client()
            .submit_run(as_(
                &self.token("ada"),
                SubmitRunRequest {
                    project_id: project.into(),
                    graph_yaml: GATED.into(),
                    ..Default::default()
                },
            ))
            .await
            .unwrap()
            .into_inner()
            .run_id;
        self.wait_state(project, &run, TaskState::InputRequired)
            .await;
        run
    }

    pub async fn get(&self, project: &str, run: &str) -> RunInfo {
        self.client()
            .get_run(as_(
                &self.token("ada"),
                GetRunRequest {
                    project_id: project.into(),
                    run_id: run.into(),
                },
            ))
            .await
            .unwrap()
            .into_inner()
    }

    pub async fn wait_state(&self, project: &str, run: &str, state: TaskState) -> RunInfo {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let info = self.get(project, run).await;
            if info.state == state as i32 {
                return info;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "run {run} never reached {state:?}: {info:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A request carrying `authorization: Bearer <token>`, exactly as on the wire.
pub fn as_<T>(token: &str, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}
