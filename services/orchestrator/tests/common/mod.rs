//! Test support: the artifact-store, ingest, a sandbox runner and the orchestrator, each
//! served in-process on its own 127.0.0.1 port over real gRPC.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use cairn_orchestrator::Config;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{
    get_response, Event, GetRequest, ReadEventsRequest, RunInfo, SubmitRunRequest, TaskState,
};
use tokio::sync::oneshot;
use tonic::transport::Channel;

pub const PROJECT: &str = "proj";

pub struct Stack {
    pub dir: tempfile::TempDir,
    pub store_addr: String,
    pub ingest_addr: String,
    pub sandbox_addr: Option<String>,
    pub sandbox_backend: Option<String>,
    pub orch_addr: String,
    pub client: OrchestratorClient<Channel>,
    pub store: ArtifactStoreClient<Channel>,
    pub handle: Option<cairn_orchestrator::Handle>,
    stops: Vec<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
    orch_stop: Option<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
    sandbox_handle: Option<cairn_sandbox_runner::RunnerHandle>,
    sandbox_stop: Option<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Sandbox {
    None,
    /// Docker when CAIRN_REQUIRE_DOCKER=1, else the local backend.
    Required,
}

pub struct Options {
    pub ingest: bool,
    pub sandbox: Sandbox,
    pub tweak: fn(&mut Config),
    /// Changes to the sandbox runner's config (with `Sandbox::Required`).
    pub runner: Box<dyn FnOnce(&mut cairn_sandbox_runner::Config) + Send>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ingest: true,
            sandbox: Sandbox::None,
            tweak: |_| {},
            runner: Box::new(|_| {}),
        }
    }
}

pub fn docker_required() -> bool {
    std::env::var("CAIRN_REQUIRE_DOCKER")
        .map(|v| v == "1")
        .unwrap_or(false)
}

async fn listener() -> (tokio::net::TcpListener, String) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (l, addr)
}

pub async fn channel(addr: &str) -> Channel {
    cairn_server::connect(addr).unwrap()
}

/// Starts a sandbox runner: Docker when required, else local; Err(reason) when neither works.
async fn start_sandbox(
    dir: &std::path::Path,
    tweak: Box<dyn FnOnce(&mut cairn_sandbox_runner::Config) + Send>,
) -> Result<
    (
        cairn_sandbox_runner::RunnerHandle,
        String,
        String,
        oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    String,
> {
    let mut config = cairn_sandbox_runner::Config {
        work_root: dir.join("sandbox-work"),
        runner_id: format!("orchtest{}", std::process::id()),
        backend: if docker_required() {
            cairn_sandbox_runner::BackendChoice::Docker
        } else {
            cairn_sandbox_runner::BackendChoice::Local
        },
        ..Default::default()
    };
    tweak(&mut config);
    let (server, handle) = cairn_sandbox_runner::sandbox_service(config)
        .await
        .map_err(|e| e.to_string())?;
    let backend = handle.backend().to_owned();
    let (l, addr) = listener().await;
    let (tx, rx) = oneshot::channel();
    let join = tokio::spawn(async move {
        let mut host = cairn_server::Host::new();
        host.add(server);
        let _ = host
            .serve(l, async {
                let _ = rx.await;
            })
            .await;
    });
    Ok((handle, addr, backend, tx, join))
}

impl Stack {
    pub async fn start(opts: Options) -> Stack {
        Self::try_start(opts).await.unwrap()
    }

    /// Err(reason) only when a sandbox was asked for and none can run here.
    pub async fn try_start(opts: Options) -> Result<Stack, String> {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let mut stops = Vec::new();

        let store_cfg = cairn_artifact_store::Config::new(dir.path().join("data"));
        let store_svc = cairn_artifact_store::artifact_store_service(store_cfg)
            .await
            .unwrap();
        let (l, store_addr) = listener().await;
        let (tx, rx) = oneshot::channel::<()>();
        let join = tokio::spawn(async move {
            let mut host = cairn_server::Host::new();
            host.add(store_svc);
            let _ = host
                .serve(l, async {
                    let _ = rx.await;
                })
                .await;
        });
        stops.push((tx, join));

        let mut ingest_addr = String::new();
        if opts.ingest {
            let cfg = cairn_ingest::Config {
                store_addr: store_addr.clone(),
                ..Default::default()
            };
            let svc = cairn_ingest::ingest_service(&cfg).unwrap();
            let (l, addr) = listener().await;
            let (tx, rx) = oneshot::channel::<()>();
            let join = tokio::spawn(async move {
                let mut host = cairn_server::Host::new();
                host.add(svc);
                let _ = host
                    .serve(l, async {
                        let _ = rx.await;
                    })
                    .await;
            });
            stops.push((tx, join));
            ingest_addr = addr;
        }

        let mut sandbox_addr = None;
        let mut sandbox_backend = None;
        let mut sandbox_handle = None;
        let mut sandbox_stop = None;
        if opts.sandbox == Sandbox::Required {
            match start_sandbox(dir.path(), opts.runner).await {
                Ok((handle, addr, backend, tx, join)) => {
                    sandbox_stop = Some((tx, join));
                    sandbox_addr = Some(addr);
                    sandbox_backend = Some(backend);
                    sandbox_handle = Some(handle);
                }
                Err(e) if docker_required() => {
                    panic!("CAIRN_REQUIRE_DOCKER=1 but the docker runner failed: {e}")
                }
                Err(e) => return Err(e),
            }
        }

        let mut config = Config {
            store_addr: store_addr.clone(),
            ingest_addr: ingest_addr.clone(),
            sandbox_addrs: sandbox_addr.iter().cloned().collect(),
            snapshot_interval_ms: 100,
            ..Config::default()
        };
        config.retry.initial_backoff_ms = 20;
        (opts.tweak)(&mut config);
        let (server, handle) = cairn_orchestrator::orchestrator_service(config)
            .await
            .unwrap();
        let (l, orch_addr) = listener().await;
        let (tx, rx) = oneshot::channel::<()>();
        let h2 = handle.clone();
        let join = tokio::spawn(async move {
            let mut host = cairn_server::Host::new();
            host.add(server);
            let _ = host
                .serve(l, async {
                    let _ = rx.await;
                    h2.shutdown().await;
                })
                .await;
        });
        let client =
            OrchestratorClient::new(channel(&orch_addr).await).max_decoding_message_size(64 << 20);
        let store = ArtifactStoreClient::new(channel(&store_addr).await)
            .max_decoding_message_size(64 << 20);
        Ok(Stack {
            dir,
            store_addr,
            ingest_addr,
            sandbox_addr,
            sandbox_backend,
            orch_addr,
            client,
            store,
            handle: Some(handle),
            stops,
            orch_stop: Some((tx, join)),
            sandbox_handle,
            sandbox_stop,
        })
    }

    /// A stack with a sandbox runner (and no ingest) whose orchestrator `tweak` changes;
    /// None, with a SKIP line naming `test`, when no sandbox backend can run here.
    pub async fn with_sandbox(test: &str, tweak: fn(&mut Config)) -> Option<Stack> {
        Stack::sandboxed(test, false, tweak).await
    }

    /// [`Stack::with_sandbox`], with the ingest service when `ingest`.
    pub async fn sandboxed(test: &str, ingest: bool, tweak: fn(&mut Config)) -> Option<Stack> {
        match Stack::try_start(Options {
            ingest,
            sandbox: Sandbox::Required,
            tweak,
            ..Default::default()
        })
        .await
        {
            Ok(s) => Some(s),
            Err(e) => {
                println!("SKIP: {test}: no sandbox backend can run here ({e})");
                None
            }
        }
    }

    pub async fn stop(mut self) {
        if let Some((tx, join)) = self.orch_stop.take() {
            let _ = tx.send(());
            let _ = tokio::time::timeout(Duration::from_secs(30), join).await;
        }
        self.stop_sandbox().await;
        for (tx, join) in self.stops.drain(..).rev() {
            let _ = tx.send(());
            let _ = tokio::time::timeout(Duration::from_secs(10), join).await;
        }
    }

    /// Stops the sandbox runner (its sessions and its gRPC server): from here on nothing can
    /// open a session or run a step.
    pub async fn stop_sandbox(&mut self) {
        if let Some(h) = self.sandbox_handle.take() {
            h.shutdown().await;
        }
        if let Some((tx, join)) = self.sandbox_stop.take() {
            let _ = tx.send(());
            let _ = tokio::time::timeout(Duration::from_secs(10), join).await;
        }
    }

    pub async fn submit(
        &self,
        yaml: &str,
        vars: &[(&str, &str)],
    ) -> Result<RunInfo, tonic::Status> {
        self.submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: yaml.into(),
            vars: vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
            by: "tester".into(),
            ..Default::default()
        })
        .await
    }

    pub async fn submit_req(&self, req: SubmitRunRequest) -> Result<RunInfo, tonic::Status> {
        self.client
            .clone()
            .submit_run(req)
            .await
            .map(|r| r.into_inner())
    }

    /// Replays `run` (ReplayRun with the request `tweak` makes of the plain one) and waits up
    /// to `secs` for the replay to end; the replay's run id.
    pub async fn replay_with(
        &self,
        run: &str,
        secs: u64,
        tweak: impl FnOnce(&mut cairn_proto::v1::ReplayRunRequest),
    ) -> Result<String, tonic::Status> {
        let mut req = cairn_proto::v1::ReplayRunRequest {
            project_id: PROJECT.into(),
            run_id: run.into(),
            by: "tester".into(),
            ..Default::default()
        };
        tweak(&mut req);
        let info = self.client.clone().replay_run(req).await?.into_inner();
        assert_eq!(info.replay_of, run);
        self.wait_final(&info.run_id, secs).await;
        Ok(info.run_id)
    }

    /// DiffRuns of `a` and `b`: (the verdict object, the report).
    pub async fn verdict(&self, a: &str, b: &str) -> (serde_json::Value, serde_json::Value) {
        let d = self
            .client
            .clone()
            .diff_runs(cairn_proto::v1::DiffRunsRequest {
                project_id: PROJECT.into(),
                run_a: a.into(),
                run_b: b.into(),
            })
            .await
            .unwrap()
            .into_inner();
        let v: serde_json::Value = serde_json::from_str(&d.verdict_json).unwrap();
        assert_eq!(v["verdict"], d.verdict.as_str());
        (v, serde_json::from_str(&d.report_json).unwrap())
    }

    pub async fn get(&self, run_id: &str) -> RunInfo {
        self.client
            .clone()
            .get_run(cairn_proto::v1::GetRunRequest {
                project_id: PROJECT.into(),
                run_id: run_id.into(),
            })
            .await
            .unwrap()
            .into_inner()
    }

    /// Polls until the run is in `state` (panics after `secs`).
    pub async fn wait_state(&self, run_id: &str, state: TaskState, secs: u64) -> RunInfo {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let info = self.get(run_id).await;
            if info.state == state as i32 {
                return info;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "run {run_id} did not reach {state:?} in {secs}s: {info:#?}\nevents: {:#?}",
                    self.event_types(run_id).await
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls until the run is in `state` or final, whichever comes first.
    pub async fn wait_final_or(&self, run_id: &str, state: TaskState, secs: u64) -> RunInfo {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let info = self.get(run_id).await;
            let fin = [TaskState::Completed, TaskState::Failed, TaskState::Canceled]
                .iter()
                .any(|s| *s as i32 == info.state);
            if fin || info.state == state as i32 || tokio::time::Instant::now() > deadline {
                return info;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls until the run is final.
    pub async fn wait_final(&self, run_id: &str, secs: u64) -> RunInfo {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let info = self.get(run_id).await;
            if [TaskState::Completed, TaskState::Failed, TaskState::Canceled]
                .iter()
                .any(|s| *s as i32 == info.state)
            {
                return info;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("run {run_id} not final after {secs}s: {info:#?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `wait_final`, asserting the run completed (the failure shows the run and its events).
    pub async fn wait_completed(&self, run_id: &str, secs: u64) -> RunInfo {
        let info = self.wait_final(run_id, secs).await;
        assert_eq!(
            info.state,
            TaskState::Completed as i32,
            "{info:#?}\n{:#?}",
            self.event_types(run_id).await
        );
        info
    }

    pub async fn events(&self, run_id: &str) -> Vec<Event> {
        read_events(&self.store, run_id).await
    }

    /// Waits until `n` nodes of the run have completed (a run under way, to kill mid-run).
    pub async fn wait_completed_nodes(&self, run_id: &str, n: usize, secs: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let done = self
                .events(run_id)
                .await
                .iter()
                .filter(|e| e.r#type == "node.completed")
                .count();
            if done >= n {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "run {run_id}: {done} of {n} nodes completed within {secs} s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn event_types(&self, run_id: &str) -> Vec<String> {
        self.events(run_id)
            .await
            .into_iter()
            .map(|e| format!("{} {}", e.r#type, e.node_id))
            .collect()
    }

    pub async fn read(&self, path: &str) -> Option<Vec<u8>> {
        read_file(&self.store, path).await
    }

    pub async fn read_text(&self, path: &str) -> String {
        String::from_utf8(
            self.read(path)
                .await
                .unwrap_or_else(|| panic!("{path} missing")),
        )
        .unwrap()
    }

    /// Reads `path` until it contains `needle` (snapshots are written just after the events
    /// they reflect); panics after `secs`.
    pub async fn wait_text(&self, path: &str, needle: &str, secs: u64) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let text = self
                .read(path)
                .await
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            if text.contains(needle) {
                return text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{path} never contained {needle:?}:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Project files under `prefix` (recursive).
    pub async fn list(&self, prefix: &str) -> Vec<String> {
        list_files(&self.store, prefix).await
    }
}

pub async fn read_events(store: &ArtifactStoreClient<Channel>, run_id: &str) -> Vec<Event> {
    let mut s = store
        .clone()
        .read_events(ReadEventsRequest {
            project_id: PROJECT.into(),
            run_id: run_id.into(),
            from_seq: 1,
            follow: false,
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(e) = s.message().await.unwrap() {
        out.push(e);
    }
    out
}

pub async fn read_file(store: &ArtifactStoreClient<Channel>, path: &str) -> Option<Vec<u8>> {
    let mut s = match store
        .clone()
        .get(GetRequest {
            project_id: PROJECT.into(),
            path: path.into(),
            offset: 0,
            length: 0,
        })
        .await
    {
        Ok(s) => s.into_inner(),
        Err(e) if e.code() == tonic::Code::NotFound => return None,
        Err(e) => panic!("get {path}: {e}"),
    };
    let mut out = Vec::new();
    loop {
        match s.message().await {
            Ok(Some(m)) => {
                if let Some(get_response::Msg::Chunk(c)) = m.msg {
                    out.extend_from_slice(&c);
                }
            }
            Ok(None) => return Some(out),
            Err(e) if e.code() == tonic::Code::NotFound => return None,
            Err(e) => panic!("get {path}: {e}"),
        }
    }
}

pub async fn list_files(store: &ArtifactStoreClient<Channel>, prefix: &str) -> Vec<String> {
    let r = store
        .clone()
        .list(cairn_proto::v1::ListRequest {
            project_id: PROJECT.into(),
            prefix: prefix.into(),
            recursive: true,
            page: None,
        })
        .await;
    match r {
        Ok(r) => r.into_inner().entries.into_iter().map(|e| e.path).collect(),
        Err(e) if e.code() == tonic::Code::NotFound => vec![],
        Err(e) => panic!("list {prefix}: {e}"),
    }
}

/// Data of an event as JSON.
/// Serves `host` on a fresh 127.0.0.1 port until the test ends; returns the address.
pub async fn serve_host(host: cairn_server::Host) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let _ = host.serve(l, std::future::pending()).await;
    });
    addr
}

/// An approval of gate `gate` of `run` in PROJECT by `by`, without a note.
pub fn approval(run: &str, gate: &str, by: &str) -> cairn_proto::v1::GateDecisionRequest {
    cairn_proto::v1::GateDecisionRequest {
        project_id: PROJECT.into(),
        run_id: run.into(),
        gate_id: gate.into(),
        by: by.into(),
        note: String::new(),
    }
}

pub fn data(e: &Event) -> serde_json::Value {
    serde_json::from_str(&e.data_json).unwrap_or(serde_json::Value::Null)
}

/// The `llm` setting that sends `yaml` as an inline cassette (what `cairn run` sends for a
/// local cassette; the orchestrator never reads the host's files). `dir` and `name` are kept
/// for the callers' sake: the cassette is written there too, for a look after a failure.
pub fn cassette(dir: &std::path::Path, name: &str, yaml: &str) -> String {
    std::fs::write(dir.join(name), yaml).unwrap();
    inline_cassette(yaml.as_bytes())
}

/// `replay-inline:<base64 of bytes>`.
pub fn inline_cassette(bytes: &[u8]) -> String {
    use base64::Engine as _;
    format!(
        "replay-inline:{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// Writes `bytes` at `path` of project PROJECT (created if missing) through the store.
pub async fn put_file(store: &ArtifactStoreClient<Channel>, path: &str, bytes: &[u8]) {
    use cairn_proto::v1::{put_request, PutHeader, PutRequest};
    let msgs = vec![
        PutRequest {
            msg: Some(put_request::Msg::Header(PutHeader {
                project_id: PROJECT.into(),
                path: path.into(),
                overwrite: true,
                create_project: true,
                ..Default::default()
            })),
        },
        PutRequest {
            msg: Some(put_request::Msg::Chunk(bytes.to_vec().into())),
        },
    ];
    store.clone().put(tokio_stream::iter(msgs)).await.unwrap();
}
