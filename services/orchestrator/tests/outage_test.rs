//! A store outage is ridden out: the orchestrator process (real, on loopback) runs a graph
//! whose sandbox step is running when the store stops for about 20 s. The run completes, the
//! sandbox step ran once (its result waited for the store), the orchestrator logged the
//! outage once at warn and its end once at info, and its readiness was NOT_SERVING during the
//! outage and SERVING after (liveness SERVING throughout). And SIGTERM ends the orchestrator's
//! open streams (WatchRun, health Watch) with UNAVAILABLE and the process exits in time.
#![allow(clippy::unwrap_used)]

use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_proto::v1 as pb;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::sandbox_runner_server::{SandboxRunner, SandboxRunnerServer};
use futures::Stream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

type Reply<T> = Result<Response<T>, Status>;
type Streamed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

const PROJECT: &str = "outage";
/// How long the fake sandbox step runs.
const STEP: Duration = Duration::from_secs(4);
/// How long the store is away.
const OUTAGE: Duration = Duration::from_secs(20);

/// A runner whose Run takes [`STEP`] and counts its calls.
#[derive(Clone)]
struct SlowRunner {
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl SandboxRunner for SlowRunner {
    async fn run(&self, _: Request<pb::RunRequest>) -> Reply<pb::RunResult> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(STEP).await;
        Ok(Response::new(pb::RunResult {
            runner_id: "slow".into(),
            stdout: bytes::Bytes::from_static(b"ran\n"),
            ..Default::default()
        }))
    }
    type RunStreamStream = Streamed<pb::RunStreamResponse>;
    async fn run_stream(&self, _: Request<pb::RunRequest>) -> Reply<Self::RunStreamStream> {
        Err(Status::unimplemented("fake"))
    }
    async fn open_session(&self, _: Request<pb::OpenSessionRequest>) -> Reply<pb::SessionInfo> {
        Err(Status::unimplemented("fake"))
    }
    async fn exec(&self, _: Request<pb::ExecRequest>) -> Reply<pb::ExecResult> {
        Err(Status::unimplemented("fake"))
    }
    async fn read_file(&self, _: Request<pb::ReadFileRequest>) -> Reply<pb::ReadFileResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn write_file(&self, _: Request<pb::WriteFileRequest>) -> Reply<pb::WriteFileResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn glob(&self, _: Request<pb::GlobRequest>) -> Reply<pb::GlobResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn grep(&self, _: Request<pb::GrepRequest>) -> Reply<pb::GrepResponse> {
        Err(Status::unimplemented("fake"))
    }
    type PackStream = Streamed<pb::PackResponse>;
    async fn pack(&self, _: Request<pb::PackRequest>) -> Reply<Self::PackStream> {
        Err(Status::unimplemented("fake"))
    }
    async fn close_session(
        &self,
        _: Request<pb::CloseSessionRequest>,
    ) -> Reply<pb::CloseSessionResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn touch_session(
        &self,
        _: Request<pb::TouchSessionRequest>,
    ) -> Reply<pb::TouchSessionResponse> {
        Err(Status::unimplemented("fake"))
    }
    type PauseSessionStream = Streamed<pb::SnapshotPart>;
    async fn pause_session(
        &self,
        _: Request<pb::PauseSessionRequest>,
    ) -> Reply<Self::PauseSessionStream> {
        Err(Status::unimplemented("fake"))
    }
    async fn resume_session(
        &self,
        _: Request<tonic::Streaming<pb::SnapshotPart>>,
    ) -> Reply<pb::SessionInfo> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_runner_info(&self, _: Request<pb::GetRunnerInfoRequest>) -> Reply<pb::RunnerInfo> {
        Ok(Response::new(pb::RunnerInfo {
            runner_id: "slow".into(),
            ..Default::default()
        }))
    }
}

/// The store served in-process on a fixed address until `stop`.
struct Store {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn start_store(addr: &str, data_root: &std::path::Path) -> Store {
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let config = cairn_artifact_store::Config::new(data_root);
    let task = tokio::spawn(async move {
        cairn_artifact_store::serve(config, listener, async move {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    Store { stop, task }
}

impl Store {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

/// Starts the orchestrator binary; its log (RUST_LOG=info) goes to `log`.
async fn spawn_orchestrator(
    store_addr: &str,
    extra: &[&str],
    log: &std::path::Path,
) -> (Child, String) {
    let orch_addr = free_addr();
    let child: Child = Command::new(env!("CARGO_BIN_EXE_cairn-orchestrator"))
        .args([
            "--listen",
            &orch_addr,
            "--store-addr",
            store_addr,
            "--ingest-addr",
            "",
            "--set",
            "resume_on_start=false",
        ])
        .args(extra)
        .env_remove("CAIRN_ORCHESTRATOR_CONFIG")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    wait_health(&orch_addr, "", true, 30).await;
    (child, orch_addr)
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

async fn health(addr: &str, service: &str) -> Option<bool> {
    let channel = cairn_server::connect(addr).unwrap();
    cairn_server::serving(channel, service, Duration::from_secs(2))
        .await
        .ok()
}

async fn wait_health(addr: &str, service: &str, serving: bool, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while health(addr, service).await != Some(serving) {
        assert!(
            Instant::now() < deadline,
            "health of {service:?} never became serving={serving}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_info(client: &OrchestratorClient<Channel>, run: &str) -> Option<pb::RunInfo> {
    let mut req = Request::new(pb::GetRunRequest {
        project_id: PROJECT.into(),
        run_id: run.into(),
    });
    req.set_timeout(Duration::from_secs(2));
    client
        .clone()
        .get_run(req)
        .await
        .ok()
        .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_mid_run_is_ridden_out() {
    let tmp = tempfile::tempdir().unwrap();
    let data_root = tmp.path().join("data");
    let store_addr = free_addr();
    let store = start_store(&store_addr, &data_root).await;

    let calls = Arc::new(AtomicUsize::new(0));
    let runner_addr = {
        let mut host = cairn_server::Host::new();
        host.add(SandboxRunnerServer::new(SlowRunner {
            calls: calls.clone(),
        }));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let _ = host.serve(l, std::future::pending()).await;
        });
        addr
    };

    let log_path = tmp.path().join("orchestrator.log");
    let (mut child, orch_addr) =
        spawn_orchestrator(&store_addr, &["--sandbox-addr", &runner_addr], &log_path).await;
    let client = OrchestratorClient::new(cairn_server::connect(&orch_addr).unwrap());

    let graph = "nodes:\n  - {id: a, type: write_file, path: \"docs/a.txt\", content: \"a\"}\n  - {id: s, type: sandbox_run, needs: [a], language: python, code: \"print('ran')\"}\n  - {id: b, type: write_file, needs: [s], path: \"docs/b.txt\", content: \"after {{nodes.s.stdout}}\"}\n";
    let run = client
        .clone()
        .submit_run(pb::SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: graph.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;

    // The sandbox step is running: the store goes away.
    let deadline = Instant::now() + Duration::from_secs(60);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the sandbox step never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopped = Instant::now();
    store.stop().await;

    // Readiness follows the store; liveness stays.
    wait_health(&orch_addr, "", false, 10).await;
    wait_health(&orch_addr, "cairn.v1.Orchestrator", false, 10).await;
    assert_eq!(health(&orch_addr, cairn_server::LIVENESS).await, Some(true));

    tokio::time::sleep(OUTAGE.saturating_sub(stopped.elapsed())).await;
    assert_eq!(health(&orch_addr, cairn_server::LIVENESS).await, Some(true));
    let store = start_store(&store_addr, &data_root).await;
    wait_health(&orch_addr, "", true, 10).await;

    let deadline = Instant::now() + Duration::from_secs(60);
    let info = loop {
        if let Some(i) = run_info(&client, &run).await {
            if i.state == pb::TaskState::Completed as i32 || i.state == pb::TaskState::Failed as i32
            {
                break i;
            }
        }
        assert!(Instant::now() < deadline, "the run did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        info.state,
        pb::TaskState::Completed as i32,
        "the run must complete after the outage: {info:#?}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the sandbox step must run once"
    );

    let _ = child.kill();
    let _ = child.wait();
    store.stop().await;
    let log = std::fs::read_to_string(&log_path).unwrap();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("artifact-store is unreachable"))
        .collect();
    let back: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("INFO") && l.contains("artifact-store is reachable again"))
        .collect();
    assert_eq!(warned.len(), 1, "one warn line per outage:\n{log}");
    assert_eq!(back.len(), 1, "one info line per outage's end:\n{log}");
    assert!(
        std::fs::read_to_string(data_root.join("projects").join(PROJECT).join("docs/b.txt"))
            .unwrap()
            .contains("ran"),
        "the step's output reached the next node"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_watch_run_and_health_watch_and_the_orchestrator_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let data_root = tmp.path().join("data");
    let store_addr = free_addr();
    let store = start_store(&store_addr, &data_root).await;
    let (mut child, orch_addr) =
        spawn_orchestrator(&store_addr, &[], &tmp.path().join("orchestrator.log")).await;
    let client = OrchestratorClient::new(cairn_server::connect(&orch_addr).unwrap());
    // A run waiting at a gate: its WatchRun stays open.
    let run = client
        .clone()
        .submit_run(pb::SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: "nodes:\n  - {id: wait, type: gate}\n".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let mut watch_run = client
        .clone()
        .watch_run(pb::WatchRunRequest {
            project_id: PROJECT.into(),
            run_id: run,
            from_seq: 1,
            follow_after_end: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(watch_run.message().await.unwrap().is_some());
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        cairn_server::connect(&orch_addr).unwrap(),
    )
    .watch(tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    })
    .await
    .unwrap()
    .into_inner();
    assert!(health.message().await.unwrap().is_some());

    let term = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let within = Duration::from_secs(5 + 3);
    let ended = loop {
        match tokio::time::timeout(within, watch_run.message())
            .await
            .expect("WatchRun stayed open after SIGTERM")
        {
            Ok(Some(_)) => {}
            Ok(None) => panic!("WatchRun ended without a status"),
            Err(s) => break s,
        }
    };
    assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
    let ended = loop {
        match tokio::time::timeout(within, health.message())
            .await
            .expect("the health watch stayed open after SIGTERM")
        {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the health watch ended without a status"),
            Err(s) => break s,
        }
    };
    assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            term.elapsed() < within,
            "the orchestrator was still running {:?} after SIGTERM",
            term.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store.stop().await;
}
