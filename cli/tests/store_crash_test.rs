//! Durable before named: the artifact-store and the orchestrator run as separate `cairn serve`
//! processes on 127.0.0.1; a run maps 3,000 `write_file` nodes; the store is killed with
//! SIGKILL at several moments while the run's files are being acknowledged, and restarted on
//! the same port and data root (the run is resumed when it failed meanwhile). Afterwards the
//! run has completed and every path an `artifact.written` event names holds bytes with the
//! event's sha256: no event names a file a crash lost, and the orchestrator re-wrote whatever
//! the store had acknowledged but not yet published.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{
    GetRunRequest, ReadEventsRequest, RunActionRequest, SubmitRunRequest, TaskState,
};
use sha2::{Digest, Sha256};
use tonic::transport::Channel;

const PROJECT: &str = "crash";
/// Files the run writes (one map item each).
const ITEMS: usize = 3000;
/// Most times the store is killed during the run, and the fewest the test accepts (the run may
/// finish before the last kill: events queued across a restart land in bursts).
const KILLS: usize = 12;
const MIN_KILLS: usize = 5;
/// Longest the whole run may take, kills and restarts included.
const RUN_LIMIT: Duration = Duration::from_secs(240);

/// A `cairn` child process whose stderr is collected (for the failure message).
struct Proc {
    what: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(what: &str, args: &[&str]) -> Proc {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
        for k in ["CAIRN_ADDR", "CAIRN_PROJECT", "CAIRN_ORCHESTRATOR_CONFIG"] {
            c.env_remove(k);
        }
        let mut child = c
            .args(args)
            .env("CAIRN_LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .env("OTEL_SDK_DISABLED", "true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Proc {
            what: what.to_owned(),
            child,
            lines,
        }
    }

    fn tail(&self) -> String {
        let lines = self.lines.lock().unwrap();
        let from = lines.len().saturating_sub(40);
        lines[from..].join("\n")
    }

    /// The address from the service's `serving gRPC` log line.
    async fn wait_serving(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let found = self.lines.lock().unwrap().iter().find_map(|line| {
                let v: serde_json::Value = serde_json::from_str(line).ok()?;
                (v["fields"]["message"] == "serving gRPC").then(|| {
                    v["fields"]["addr"]
                        .as_str()
                        .unwrap_or_default()
                        .trim_start_matches("Some(")
                        .trim_end_matches(')')
                        .to_owned()
                })
            });
            if let Some(addr) = found {
                return addr;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "{} exited ({status}) before serving:\n{}",
                    self.what,
                    self.tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} not serving after 60 s:\n{}",
                self.what,
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The store on `port` over `data`; a port taken meanwhile by someone else fails the test.
async fn start_store(port: u16, data: &Path) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let data = data.display().to_string();
    let mut p = Proc::spawn(
        "artifact-store",
        &[
            "serve",
            "artifact-store",
            "--listen",
            &listen,
            "--data-root",
            &data,
        ],
    );
    p.wait_serving().await;
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn graph() -> String {
    let items: Vec<String> = (0..ITEMS).map(|i| i.to_string()).collect();
    // Store outages make attempts fail as unavailable: retried quickly and often, so the run
    // mostly rides the restarts out (a run that fails anyway is resumed below).
    format!(
        "title: crash\nretry: {{max_attempts: 40, initial_backoff_ms: 50, max_backoff_ms: 500}}\nnodes:\n  - id: fan\n    type: map\n    parallelism: 32\n    over: [{}]\n    node: {{type: write_file, path: \"docs/{{{{run_id}}}}/f{{{{item}}}}.txt\", content: \"file {{{{item}}}} of the crash run\"}}\n",
        items.join(", ")
    )
}

/// The run's events from the store as (type, data) from `from` on; empty while the store is
/// away.
async fn events_from(
    store: &ArtifactStoreClient<Channel>,
    run: &str,
    from: u64,
) -> Vec<(u64, String, serde_json::Value)> {
    let req = ReadEventsRequest {
        project_id: PROJECT.into(),
        run_id: run.into(),
        from_seq: from,
        follow: false,
        limit: 0,
    };
    let Ok(stream) = store.clone().read_events(req).await else {
        return Vec::new();
    };
    let mut stream = stream.into_inner();
    let mut out = Vec::new();
    while let Ok(Some(e)) = stream.message().await {
        let data = serde_json::from_str(&e.data_json).unwrap_or_default();
        out.push((e.seq, e.r#type, data));
    }
    out
}

async fn run_state(orch: &OrchestratorClient<Channel>, run: &str) -> Option<TaskState> {
    let info = orch
        .clone()
        .get_run(GetRunRequest {
            project_id: PROJECT.into(),
            run_id: run.into(),
        })
        .await
        .ok()?
        .into_inner();
    TaskState::try_from(info.state).ok()
}

fn sha256_of(path: &PathBuf) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|b| hex::encode(Sha256::digest(&b)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_kill_9_mid_run_loses_no_file_an_event_names() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let mut store = start_store(port, &data).await;
    let store_addr = format!("http://127.0.0.1:{port}");
    let mut orchestrator = Proc::spawn(
        "orchestrator",
        &[
            "serve",
            "orchestrator",
            "--listen",
            "127.0.0.1:0",
            "--store-addr",
            &store_addr,
            "--ingest-addr",
            "",
            "--set",
            "resume_on_start=false",
        ],
    );
    let orch_addr = orchestrator.wait_serving().await;
    let orch = OrchestratorClient::new(cairn_server::connect(&orch_addr).unwrap());
    let store_client = ArtifactStoreClient::new(cairn_server::connect(&store_addr).unwrap());

    let run = orch
        .clone()
        .submit_run(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: graph(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;

    // Each kill comes once the store has published some more of the run's files since the last
    // restart: it is then acknowledging Puts and publishing them as it dies.
    let deadline = Instant::now() + RUN_LIMIT;
    let step = ITEMS / 30;
    let run_dir = data.join("projects").join(PROJECT).join("docs").join(&run);
    let published = || std::fs::read_dir(&run_dir).map_or(0, |d| d.count());
    let mut written: BTreeMap<String, String> = BTreeMap::new();
    let mut next_seq = 1;
    let mut kills = 0;
    let mut resumes = 0;
    let mut published_at_restart = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "the run did not complete within {RUN_LIMIT:?} ({kills} kills, {resumes} resumes, {} files recorded):\norchestrator:\n{}\nstore:\n{}",
            written.len(),
            orchestrator.tail(),
            store.tail()
        );
        let seen = next_seq;
        for (seq, kind, data) in events_from(&store_client, &run, next_seq).await {
            next_seq = seq + 1;
            if kind == "artifact.written" {
                written.insert(
                    data["path"].as_str().unwrap().to_owned(),
                    data["sha256"].as_str().unwrap().to_owned(),
                );
            }
        }
        if kills < KILLS && published() >= published_at_restart + step {
            store.kill9();
            kills += 1;
            eprintln!(
                "kill {kills}: {} files published, {} recorded ({:?} into the run)",
                published(),
                written.len(),
                Instant::now() + RUN_LIMIT - deadline
            );
            store = start_store(port, &data).await;
            published_at_restart = published();
            continue;
        }
        if next_seq > seen {
            // Still recording: look again before asking for the run's state (a large answer).
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        match run_state(&orch, &run).await {
            Some(TaskState::Completed) => break,
            // An outage outlasted the retries: resume the run, as an operator would.
            Some(TaskState::Failed) => {
                resumes += 1;
                assert!(resumes <= 20, "the run kept failing");
                let _ = orch
                    .clone()
                    .resume_run(RunActionRequest {
                        project_id: PROJECT.into(),
                        run_id: run.clone(),
                        ..Default::default()
                    })
                    .await;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Everything the run recorded, read once it completed.
    for (_, kind, data) in events_from(&store_client, &run, next_seq).await {
        if kind == "artifact.written" {
            written.insert(
                data["path"].as_str().unwrap().to_owned(),
                data["sha256"].as_str().unwrap().to_owned(),
            );
        }
    }
    store.kill9();
    let missing: Vec<String> = written
        .iter()
        .filter(|(path, sha)| {
            sha256_of(&data.join("projects").join(PROJECT).join(path)).as_deref()
                != Some(sha.as_str())
        })
        .map(|(path, _)| path.clone())
        .collect();
    assert!(
        missing.is_empty(),
        "the run completed, but {} of the {} files its artifact.written events name are missing or differ after {kills} store crashes: {missing:?}",
        missing.len(),
        written.len()
    );
    assert_eq!(written.len(), ITEMS, "one file per map item");
    // The store refused the events of files acknowledged before a crash, and the orchestrator
    // wrote those files again.
    let rewrites = orchestrator
        .lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("were proven durable; writing them again"))
        .count();
    assert!(
        rewrites > 0,
        "no crash left acknowledged files unproven: make the kills land amid the writes"
    );
    assert!(
        kills >= MIN_KILLS,
        "the run completed after only {kills} kills; make the kills more frequent"
    );
}
