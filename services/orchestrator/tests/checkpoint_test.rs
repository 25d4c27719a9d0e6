//! Checkpoints of a code_delivery session and failover, end to end over real gRPC on
//! loopback: the embedded store, the orchestrator, two sandbox runners (Docker under
//! CAIRN_REQUIRE_DOCKER=1, the local bubblewrap backend otherwise; a `SKIP:` line when neither
//! runs here; gvisor for the test of memory checkpoints) and a fake OpenAI-compatible server
//! whose answers the test scripts and can hold back (so a runner is stopped at a known point
//! of the tool loop).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::VecDeque;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use cairn_orchestrator::Config;
use cairn_proto::v1::{RunInfo, SubmitRunRequest, TaskState};
use common::*;
use serde_json::{json, Value};
use sha2::Digest;
use tokio::sync::{oneshot, Notify};

// ---------------------------------------------------------------- fake LLM

/// The tool calls of one answer: (tool, arguments).
type Turn = Vec<(&'static str, Value)>;

/// Scripted tool calls, one list per request; request `hold` (1-based) is answered only once
/// the test calls `release`.
#[derive(Clone)]
struct FakeLlm {
    answers: Arc<Mutex<VecDeque<Turn>>>,
    seen: Arc<Mutex<Vec<Value>>>,
    hold: usize,
    gate: Arc<Notify>,
    spec: String,
}

impl FakeLlm {
    async fn start(answers: Vec<Turn>, hold: usize) -> FakeLlm {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let fake = FakeLlm {
            answers: Arc::new(Mutex::new(answers.into())),
            seen: Default::default(),
            hold,
            gate: Arc::new(Notify::new()),
            spec: format!("openai:http://{addr}/v1#fake-model"),
        };
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .with_state(fake.clone());
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        fake
    }

    fn release(&self) {
        self.gate.notify_one();
    }

    fn requests(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }
}

async fn chat(State(fake): State<FakeLlm>, body: Bytes) -> Response {
    let n = {
        let mut seen = fake.seen.lock().unwrap();
        seen.push(serde_json::from_slice(&body).unwrap_or(Value::Null));
        seen.len()
    };
    if n == fake.hold {
        fake.gate.notified().await;
    }
    let answer = fake.answers.lock().unwrap().pop_front();
    let (status, body) = match answer {
        None => (
            400,
            json!({"error": {"message": "the test's script has no answer left"}}),
        ),
        Some(list) => {
            let tool_calls: Vec<Value> = list
                .iter()
                .enumerate()
                .map(|(i, (name, args))| json!({"id": format!("call_{n}_{i}"), "type": "function", "function": {"name": name, "arguments": args.to_string()}}))
                .collect();
            (
                200,
                json!({"model": "fake-model", "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": tool_calls}, "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}),
            )
        }
    };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

// ---------------------------------------------------------------- two runners and a stack

static NEXT_RUNNER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One served sandbox runner.
struct Runner {
    addr: String,
    handle: cairn_sandbox_runner::RunnerHandle,
    stop: Option<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
    _dir: tempfile::TempDir,
}

impl Runner {
    async fn start(name: &str) -> Result<Runner, String> {
        let backend = if docker_required() {
            cairn_sandbox_runner::BackendChoice::Docker
        } else {
            cairn_sandbox_runner::BackendChoice::Local
        };
        Runner::start_on(name, backend).await
    }

    async fn start_on(
        name: &str,
        backend: cairn_sandbox_runner::BackendChoice,
    ) -> Result<Runner, String> {
        let dir = tempfile::tempdir().unwrap();
        let config = cairn_sandbox_runner::Config {
            work_root: dir.path().join("work"),
            // Unique among the runners of this process: a runner's shutdown and start-up
            // sweep remove what its id started.
            runner_id: format!(
                "ckpt{name}{}x{}",
                std::process::id(),
                NEXT_RUNNER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
            backend,
            // One export of the sandbox image for every gvisor runner of the tests.
            gvisor_rootfs_cache: std::env::temp_dir().join("cairn-test-gvisor-rootfs"),
            ..Default::default()
        };
        let (server, handle) = cairn_sandbox_runner::sandbox_service(config)
            .await
            .map_err(|e| e.to_string())?;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
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
        Ok(Runner {
            addr,
            handle,
            stop: Some((tx, join)),
            _dir: dir,
        })
    }

    /// Gone, as a runner whose host died: its sessions are closed and nothing answers at its
    /// address any more.
    async fn kill(&mut self) {
        self.handle.shutdown().await;
        if let Some((tx, join)) = self.stop.take() {
            let _ = tx.send(());
            let _ = tokio::time::timeout(Duration::from_secs(10), join).await;
        }
    }
}

tokio::task_local! {
    /// The runners of the stack being started.
    static RUNNERS: Vec<String>;
}

fn tweak(c: &mut Config) {
    c.llm.initial_backoff_ms = 5;
    c.llm.max_backoff_ms = 20;
    c.llm.request_timeout_ms = 60_000;
    c.llm.allow_request_llm_urls = true;
    c.code_delivery.default_command_timeout_seconds = 60;
    c.sandbox_addrs = RUNNERS.try_with(|r| r.clone()).unwrap_or_default();
    c.sandbox_health_interval_ms = 200;
}

/// Two runners and a stack using both; None (with a SKIP line) when no backend runs here.
async fn two_runners(test: &str) -> Option<(Stack, Vec<Runner>)> {
    two_runners_on(test, None).await
}

/// [`two_runners`] on `backend` when given (else docker or local, as above).
async fn two_runners_on(
    test: &str,
    backend: Option<cairn_sandbox_runner::BackendChoice>,
) -> Option<(Stack, Vec<Runner>)> {
    let mut runners = Vec::new();
    for name in ["a", "b"] {
        let started = match backend {
            Some(b) => Runner::start_on(name, b).await,
            None => Runner::start(name).await,
        };
        match started {
            Ok(r) => runners.push(r),
            Err(e) if docker_required() => {
                panic!("CAIRN_REQUIRE_DOCKER=1 but the docker runner failed: {e}")
            }
            Err(e) => {
                println!("SKIP: {test}: no sandbox backend can run here ({e})");
                return None;
            }
        }
    }
    let addrs: Vec<String> = runners.iter().map(|r| r.addr.clone()).collect();
    let start = Stack::try_start(Options {
        ingest: false,
        tweak,
        ..Default::default()
    });
    let stack = RUNNERS.scope(addrs, start).await.unwrap();
    eprintln!("{test}: backend {}", runners[0].handle.backend());
    Some((stack, runners))
}

async fn submit(s: &Stack, node: &str, llm: &FakeLlm) -> String {
    let yaml = format!(
        "title: checkpoint test\nnodes:\n  - id: cd\n    type: code_delivery\n    prompt: \"Write notes.\"\n    source_type: empty\n    target: {{type: directory, path: \"out/{{{{run_id}}}}\"}}\n{node}"
    );
    s.submit_req(SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: yaml,
        by: "tester".into(),
        llm: llm.spec.clone(),
        ..Default::default()
    })
    .await
    .unwrap()
    .run_id
}

fn outputs(info: &RunInfo) -> Value {
    serde_json::from_str(&info.nodes[0].outputs_json).unwrap_or(Value::Null)
}

fn zip_file(bytes: &[u8], name: &str) -> Option<String> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let mut out = String::new();
    z.by_name(name).ok()?.read_to_string(&mut out).unwrap();
    Some(out)
}

/// The data of the run's events of type `kind`.
async fn events_of(s: &Stack, run: &str, kind: &str) -> Vec<Value> {
    s.events(run)
        .await
        .iter()
        .filter(|e| e.r#type == kind)
        .map(data)
        .collect()
}

/// Waits for the first event of type `kind`.
async fn wait_event(s: &Stack, run: &str, kind: &str, secs: u64) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(e) = events_of(s, run, kind).await.into_iter().next() {
            return e;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {kind} event in {secs} s: {:#?}",
            s.event_types(run).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first tool call whose arguments hold `needle`.
async fn tool_call_with(s: &Stack, run: &str, needle: &str) -> Value {
    events_of(s, run, "code_delivery.tool_call")
        .await
        .into_iter()
        .find(|e| e["arguments"].as_str().unwrap_or_default().contains(needle))
        .unwrap_or_else(|| panic!("no tool call with {needle:?}"))
}

/// Kills the runner at `addr` (the session's), lets the model answer, and waits for the run
/// to complete (it must).
async fn kill_then_finish(
    s: &Stack,
    runners: &mut [Runner],
    addr: &str,
    llm: &FakeLlm,
    run: &str,
    secs: u64,
) -> RunInfo {
    runners
        .iter_mut()
        .find(|r| r.addr == addr)
        .expect("the session's runner is one of ours")
        .kill()
        .await;
    llm.release();
    s.wait_completed(run, secs).await
}

const README: &str = "# Notes\n\nNotes kept across a failover.\n\n## Usage\n\n    cat notes.txt\n";

// ---------------------------------------------------------------- tests

/// A file written, a checkpoint taken, the session's runner killed: the next tool call fails
/// over to the other runner from the checkpoint, the conversation goes on from the
/// checkpoint's turn, and the archive holds the file written before the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_runner_is_replaced_by_the_last_checkpoint() {
    let Some((s, mut runners)) =
        two_runners("a_killed_runner_is_replaced_by_the_last_checkpoint").await
    else {
        return;
    };
    let llm = FakeLlm::start(
        vec![
            // 1: a file, then time for a checkpoint to fall due.
            vec![
                (
                    "write",
                    json!({"path": "notes.txt", "content": "written before the failure\n"}),
                ),
                ("run_bash_command", json!({"command": "sleep 1.3"})),
            ],
            // 2 (held until the runner is gone): undone by the failover.
            vec![(
                "write",
                json!({"path": "lost.txt", "content": "never kept"}),
            )],
            // 3: in the resumed session.
            vec![
                ("run_bash_command", json!({"command": "cat notes.txt; ls"})),
                ("write", json!({"path": "README.md", "content": README})),
                (
                    "end",
                    json!({"exclude_patterns": [], "archive_name": "notes.zip"}),
                ),
            ],
        ],
        2,
    )
    .await;
    let run = submit(&s, "    checkpoint_every_s: 1\n", &llm).await;

    let checkpoint = wait_event(&s, &run, "session.checkpointed", 60).await;
    let opened = wait_event(&s, &run, "code_delivery.session_opened", 5).await;
    let first_session = opened["session_id"].as_str().unwrap().to_owned();
    let first_runner = opened["runner"].as_str().unwrap().to_owned();
    let snapshot = checkpoint["snapshot"].as_str().unwrap().to_owned();
    assert_eq!(
        snapshot,
        format!(".cairn/runs/{run}/snapshots/{first_session}/1.snap")
    );
    assert_eq!(checkpoint["memory"], false);
    assert_eq!(checkpoint["step"], 2);
    let done = kill_then_finish(&s, &mut runners, &first_runner, &llm, &run, 120).await;

    // The stored checkpoint is the one the events name, with its sha256.
    let stored = s.read(&snapshot).await.expect("the checkpoint is stored");
    assert_eq!(stored.len() as u64, checkpoint["bytes"].as_u64().unwrap());
    assert_eq!(
        hex::encode(sha2::Sha256::digest(&stored)),
        checkpoint["sha256"].as_str().unwrap()
    );
    assert!(stored.starts_with(b"cairn-snapshot\n"));

    // Resumed on the other runner from that snapshot; turn 2 undone.
    let resumed = events_of(&s, &run, "session.resumed").await;
    assert_eq!(resumed.len(), 1, "{resumed:#?}");
    let r = &resumed[0];
    assert_eq!(r["snapshot"], snapshot.as_str());
    assert_eq!(r["previous_session_id"], first_session.as_str());
    assert_eq!(r["previous_runner"], first_runner.as_str());
    assert_ne!(r["runner"], first_runner.as_str());
    assert_ne!(r["session_id"], first_session.as_str());
    assert_eq!(r["turns_undone"], 1);
    let out = outputs(&done);
    assert_eq!(out["session_id"], r["session_id"]);

    // The model's third request continued from the checkpoint's conversation: the second
    // request's messages, without its answer.
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[2]["messages"], reqs[1]["messages"]);

    // The file written before the failure is in the resumed session and in the archive; the
    // undone write is not.
    let archive = s
        .read(&format!("docs/artifacts/{run}/notes.zip"))
        .await
        .unwrap();
    assert_eq!(
        zip_file(&archive, "notes.txt").as_deref(),
        Some("written before the failure\n")
    );
    assert_eq!(zip_file(&archive, "lost.txt"), None);
    assert_eq!(zip_file(&archive, "README.md").as_deref(), Some(README));
    let cat = tool_call_with(&s, &run, "cat notes.txt").await;
    assert!(
        cat["result"]
            .as_str()
            .unwrap()
            .contains("written before the failure"),
        "{cat}"
    );
    s.stop().await;
    for mut r in runners {
        r.kill().await;
    }
}

/// A counter in memory only, writing its value to /tmpfs/count every 20 ms, left running.
const COUNTER: &str = "nohup python3 -c 'import os, time\ni = 0\nwhile True:\n    i += 1\n    open(\"/tmpfs/c.tmp\", \"w\").write(str(i))\n    os.replace(\"/tmpfs/c.tmp\", \"/tmpfs/count\")\n    time.sleep(0.02)' > /dev/null 2>&1 & sleep 1.3; cat /tmpfs/count";

/// Is the gvisor backend usable here (runsc, root)? Required under CAIRN_REQUIRE_DOCKER=1.
fn gvisor_usable(test: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let why = if !std::env::split_paths(&path).any(|d| d.join("runsc").is_file()) {
        "gVisor's runsc is not installed"
    } else if !rustix::process::geteuid().is_root() {
        "the gvisor backend needs root"
    } else {
        return true;
    };
    assert!(
        !docker_required(),
        "CAIRN_REQUIRE_DOCKER=1 but the gvisor backend is not usable: {why}"
    );
    println!("SKIP: {test} [gvisor]: {why}");
    false
}

/// The numbers a run_bash_command's stdout holds (its tool_call event's `result`).
fn numbers_printed(result: &str) -> Vec<u64> {
    let out: Value = serde_json::from_str(result).unwrap_or(Value::Null);
    out["stdout"]
        .as_str()
        .unwrap_or_default()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// The last answer of the counter tests: the counter read twice a second apart, then the end.
fn counter_read_twice_then_end() -> Turn {
    vec![
        (
            "run_bash_command",
            json!({"command": "cat /tmpfs/count; echo; sleep 1; cat /tmpfs/count"}),
        ),
        ("write", json!({"path": "README.md", "content": README})),
        (
            "end",
            json!({"exclude_patterns": [], "archive_name": "notes.zip"}),
        ),
    ]
}

/// The counter's reads (each `run_bash_command` that read /tmpfs/count): the first read's
/// value, then the last read's two values a second apart must show the counter resumed from
/// where it was (not back near 0) and still counting.
async fn assert_counter_went_on(s: &Stack, run: &str) {
    let results: Vec<Vec<u64>> = events_of(s, run, "code_delivery.tool_call")
        .await
        .into_iter()
        .filter(|e| {
            e["arguments"]
                .as_str()
                .unwrap_or_default()
                .contains("/tmpfs/count")
        })
        .map(|e| numbers_printed(e["result"].as_str().unwrap_or_default()))
        .collect();
    assert!(results.len() >= 2, "{results:?}");
    let before = results[0].first().copied().unwrap_or(0);
    let after = results.last().unwrap();
    assert!(before > 0 && after.len() == 2, "{results:?}");
    let (first, second) = (after[0], after[1]);
    assert!(
        first >= before,
        "resumed at {first}, below {before}: {results:?}"
    );
    assert!(second > first, "not counting after the resume: {results:?}");
}

/// On gvisor runners a checkpoint holds the session's memory: a counter a command left
/// running goes on in the session after the checkpoint and, once the session's runner is
/// killed, in the session resumed from it on the other runner, from its checkpointed value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_gvisor_a_background_process_survives_a_failover() {
    let test = "on_gvisor_a_background_process_survives_a_failover";
    if !gvisor_usable(test) {
        return;
    }
    let Some((s, mut runners)) =
        two_runners_on(test, Some(cairn_sandbox_runner::BackendChoice::Gvisor)).await
    else {
        return;
    };
    let llm = FakeLlm::start(
        vec![
            // 1: the counter, left running; a checkpoint falls due after it.
            vec![("run_bash_command", json!({"command": COUNTER}))],
            // 2 (held until the runner is gone): undone by the failover.
            vec![("run_bash_command", json!({"command": "cat /tmpfs/count"}))],
            // 3: in the resumed session.
            counter_read_twice_then_end(),
        ],
        2,
    )
    .await;
    let run = submit(&s, "    checkpoint_every_s: 1\n", &llm).await;
    let checkpoint = wait_event(&s, &run, "session.checkpointed", 120).await;
    assert_eq!(checkpoint["memory"], true, "{checkpoint}");
    let opened = wait_event(&s, &run, "code_delivery.session_opened", 5).await;
    let first_runner = opened["runner"].as_str().unwrap().to_owned();
    // Request 2 is asked (and held) after the checkpoint: the session went on.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while llm.requests().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no second request");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(open_sessions(&first_runner).await, 1);
    kill_then_finish(&s, &mut runners, &first_runner, &llm, &run, 180).await;
    let resumed = events_of(&s, &run, "session.resumed").await;
    assert_eq!(resumed.len(), 1, "{resumed:#?}");
    assert_eq!(resumed[0]["memory"], true);
    assert_ne!(resumed[0]["runner"], first_runner.as_str());
    // Turn 1's value before the checkpoint; turn 3's two values a second apart on the
    // other runner: not back near 0, and still counting.
    assert_counter_went_on(&s, &run).await;
    s.stop().await;
    for mut r in runners {
        r.kill().await;
    }
}

/// Checkpoints on: the session goes on after each (the same session to the end); off: no
/// snapshot is stored at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_keep_the_session_open_and_off_means_none() {
    let Some((s, runners)) =
        two_runners("checkpoints_keep_the_session_open_and_off_means_none").await
    else {
        return;
    };
    let script = || {
        vec![
            vec![
                ("write", json!({"path": "notes.txt", "content": "one\n"})),
                ("run_bash_command", json!({"command": "sleep 1.2"})),
            ],
            vec![
                (
                    "write",
                    json!({"path": "notes.txt", "content": "two\n", "mode": "append"}),
                ),
                ("run_bash_command", json!({"command": "sleep 1.2"})),
            ],
            vec![
                ("write", json!({"path": "README.md", "content": README})),
                (
                    "end",
                    json!({"exclude_patterns": [], "archive_name": "notes.zip"}),
                ),
            ],
        ]
    };
    for (node, want) in [("    checkpoint_every_s: 1\n", 2usize), ("", 0)] {
        let llm = FakeLlm::start(script(), 0).await;
        let run = submit(&s, node, &llm).await;
        let done = s.wait_final(&run, 120).await;
        assert_eq!(
            done.state,
            TaskState::Completed as i32,
            "{node:?}: {done:#?}\n{:#?}",
            s.event_types(&run).await
        );
        let session = outputs(&done)["session_id"].as_str().unwrap().to_owned();
        let taken = events_of(&s, &run, "session.checkpointed").await;
        let files = s.list(&format!(".cairn/runs/{run}/snapshots/")).await;
        assert_eq!(taken.len(), want, "{node:?}: {taken:#?}");
        assert_eq!(files.len(), want, "{node:?}: {files:?}");
        for (i, t) in taken.iter().enumerate() {
            // Every checkpoint is of the one session the task ended in.
            assert_eq!(t["session_id"], session.as_str());
            assert_eq!(
                t["snapshot"],
                format!(".cairn/runs/{run}/snapshots/{session}/{}.snap", i + 1)
            );
        }
        assert!(events_of(&s, &run, "session.resumed").await.is_empty());
        let archive = s
            .read(&format!("docs/artifacts/{run}/notes.zip"))
            .await
            .unwrap();
        assert_eq!(
            zip_file(&archive, "notes.txt").as_deref(),
            Some("one\ntwo\n")
        );
    }
    s.stop().await;
    for mut r in runners {
        r.kill().await;
    }
}

/// Without checkpoints a lost session is what it always was: the attempt fails (unavailable)
/// and the node's retry starts over in a fresh session, without the earlier files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_checkpoint_a_killed_runner_starts_the_task_over() {
    let Some((s, mut runners)) =
        two_runners("without_a_checkpoint_a_killed_runner_starts_the_task_over").await
    else {
        return;
    };
    let llm = FakeLlm::start(
        vec![
            vec![(
                "write",
                json!({"path": "notes.txt", "content": "first attempt\n"}),
            )],
            // 2 (held until the runner is gone): fails, and so does the attempt.
            vec![(
                "write",
                json!({"path": "lost.txt", "content": "never kept"}),
            )],
            // The second attempt, from scratch.
            vec![
                ("write", json!({"path": "README.md", "content": README})),
                (
                    "end",
                    json!({"exclude_patterns": [], "archive_name": "notes.zip"}),
                ),
            ],
        ],
        2,
    )
    .await;
    let run = submit(&s, "", &llm).await;
    let opened = wait_event(&s, &run, "code_delivery.session_opened", 60).await;
    // Request 2 is asked (and held) once turn 1's write is done.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while llm.requests().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no second request");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_runner = opened["runner"].as_str().unwrap().to_owned();
    kill_then_finish(&s, &mut runners, &first_runner, &llm, &run, 120).await;
    assert!(events_of(&s, &run, "session.resumed").await.is_empty());
    assert!(events_of(&s, &run, "session.checkpointed").await.is_empty());
    assert!(s
        .list(&format!(".cairn/runs/{run}/snapshots/"))
        .await
        .is_empty());
    let opened = events_of(&s, &run, "code_delivery.session_opened").await;
    assert_eq!(opened.len(), 2, "{opened:#?}");
    assert_ne!(opened[1]["runner"], first_runner.as_str());
    // A fresh workspace: the first attempt's file is gone.
    let archive = s
        .read(&format!("docs/artifacts/{run}/notes.zip"))
        .await
        .unwrap();
    assert_eq!(zip_file(&archive, "notes.txt"), None);
    assert_eq!(zip_file(&archive, "README.md").as_deref(), Some(README));
    s.stop().await;
    for mut r in runners {
        r.kill().await;
    }
}

/// Sessions open on the runner at `addr`.
async fn open_sessions(addr: &str) -> u32 {
    cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
        .get_runner_info(cairn_proto::v1::GetRunnerInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .open_sessions
}

/// `pause_after_ms`: while a slow answer is awaited the session is checkpointed and closed (no
/// runner holds a session), then resumed from that checkpoint when the answer comes, with
/// nothing undone; the task finishes with the files written before the pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_is_paused_while_the_model_answers_and_resumed_after() {
    let Some((s, runners)) =
        two_runners("an_idle_session_is_paused_while_the_model_answers_and_resumed_after").await
    else {
        return;
    };
    let llm = FakeLlm::start(
        vec![
            vec![(
                "write",
                json!({"path": "notes.txt", "content": "written before the pause\n"}),
            )],
            // 2: held until the session has been paused.
            vec![
                ("run_bash_command", json!({"command": "cat notes.txt"})),
                ("write", json!({"path": "README.md", "content": README})),
                (
                    "end",
                    json!({"exclude_patterns": [], "archive_name": "notes.zip"}),
                ),
            ],
        ],
        2,
    )
    .await;
    let run = submit(&s, "    pause_after_ms: 1000\n", &llm).await;
    let opened = wait_event(&s, &run, "code_delivery.session_opened", 60).await;
    let first_session = opened["session_id"].as_str().unwrap().to_owned();
    let paused = wait_event(&s, &run, "session.paused", 60).await;
    assert_eq!(paused["session_id"], first_session.as_str());
    assert_eq!(paused["step"], 2);
    assert_eq!(paused["idle_ms"], 1000);
    let snapshot = paused["snapshot"].as_str().unwrap().to_owned();
    assert_eq!(
        snapshot,
        format!(".cairn/runs/{run}/snapshots/{first_session}/1.snap")
    );
    // Waiting for the model, the node holds no sandbox on either runner.
    for r in &runners {
        assert_eq!(open_sessions(&r.addr).await, 0, "runner {}", r.addr);
    }
    assert!(
        s.read(&snapshot).await.is_some(),
        "the pause's snapshot is stored"
    );
    llm.release();

    let done = s.wait_final(&run, 120).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{done:#?}\n{:#?}",
        s.event_types(&run).await
    );
    let resumed = events_of(&s, &run, "session.resumed").await;
    assert_eq!(resumed.len(), 1, "{resumed:#?}");
    let r = &resumed[0];
    assert_eq!(r["cause"], "idle");
    assert_eq!(r["snapshot"], snapshot.as_str());
    assert_eq!(r["previous_session_id"], first_session.as_str());
    assert_eq!(r["turns_undone"], 0);
    assert!(r["paused_ms"].as_u64().is_some());
    assert_ne!(r["session_id"], first_session.as_str());
    assert_eq!(outputs(&done)["session_id"], r["session_id"]);
    // Nothing redone: two requests in all.
    assert_eq!(llm.requests().len(), 2);
    let cat = events_of(&s, &run, "code_delivery.tool_call")
        .await
        .into_iter()
        .find(|e| e["tool"] == "run_bash_command")
        .unwrap();
    assert!(
        cat["result"]
            .as_str()
            .unwrap()
            .contains("written before the pause"),
        "{cat}"
    );
    let archive = s
        .read(&format!("docs/artifacts/{run}/notes.zip"))
        .await
        .unwrap();
    assert_eq!(
        zip_file(&archive, "notes.txt").as_deref(),
        Some("written before the pause\n")
    );
    s.stop().await;
    for mut r in runners {
        r.kill().await;
    }
}

/// A paused session whose snapshot no longer resumes (its bytes were replaced in the store
/// while the model answered) fails the attempt as `unavailable`, naming the snapshot; the
/// retry starts over in a fresh session, and nothing of the failed resume is left open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_that_cannot_be_resumed_fails_the_attempt_and_the_retry_starts_over() {
    let Some((s, runners)) =
        two_runners("a_pause_that_cannot_be_resumed_fails_the_attempt_and_the_retry_starts_over")
            .await
    else {
        return;
    };
    let llm = FakeLlm::start(
        vec![
            vec![(
                "write",
                json!({"path": "notes.txt", "content": "written before the pause\n"}),
            )],
            // 2: held until the snapshot has been replaced; never run (the resume fails).
            vec![(
                "write",
                json!({"path": "lost.txt", "content": "never kept"}),
            )],
            // The second attempt, from scratch.
            vec![
                ("write", json!({"path": "README.md", "content": README})),
                (
                    "end",
                    json!({"exclude_patterns": [], "archive_name": "notes.zip"}),
                ),
            ],
        ],
        2,
    )
    .await;
    let run = submit(&s, "    pause_after_ms: 1000\n", &llm).await;
    let paused = wait_event(&s, &run, "session.paused", 60).await;
    let snapshot = paused["snapshot"].as_str().unwrap().to_owned();
    put_file(
        &s.store,
        &snapshot,
        b"cairn-snapshot\nnot the bytes that were paused",
    )
    .await;
    llm.release();
    let done = s.wait_final(&run, 120).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{done:#?}\n{:#?}",
        s.event_types(&run).await
    );
    assert!(events_of(&s, &run, "session.resumed").await.is_empty());
    let failed = events_of(&s, &run, "node.failed").await;
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert_eq!(failed[0]["will_retry"], true, "{failed:#?}");
    let said = failed[0].to_string();
    assert!(
        said.contains("unavailable") && said.contains(&snapshot),
        "the failure is unavailable and names the snapshot: {said}"
    );
    let opened = events_of(&s, &run, "code_delivery.session_opened").await;
    assert_eq!(opened.len(), 2, "{opened:#?}");
    // A fresh workspace: the first attempt's file is gone, and no runner keeps a session.
    let archive = s
        .read(&format!("docs/artifacts/{run}/notes.zip"))
        .await
        .unwrap();
    assert_eq!(zip_file(&archive, "notes.txt"), None);
    assert_eq!(zip_file(&archive, "README.md").as_deref(), Some(README));
    assert_eq!(zip_file(&archive, "lost.txt"), None);
    for r in &runners {
        assert_eq!(open_sessions(&r.addr).await, 0, "runner {}", r.addr);
    }
    s.stop().await;
    for mut r in runners {
        r.kill().await;
    }
}

/// `pause_after_ms` on gvisor runners: the idle pause holds the session's memory, so a counter
/// a command left running is, after the model's slow answer, still counting in the resumed
/// session from where it stood, while no runner held a sandbox for it in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_gvisor_an_idle_pause_keeps_a_background_process() {
    let test = "on_gvisor_an_idle_pause_keeps_a_background_process";
    if !gvisor_usable(test) {
        return;
    }
    let Some((s, runners)) =
        two_runners_on(test, Some(cairn_sandbox_runner::BackendChoice::Gvisor)).await
    else {
        return;
    };
    let llm = FakeLlm::start(
        vec![
            vec![("run_bash_command", json!({"command": COUNTER}))],
            // 2: held until the session has been paused.
            counter_read_twice_then_end(),
        ],
        2,
    )
    .await;
    let run = submit(&s, "    pause_after_ms: 1000\n", &llm).await;
    let paused = wait_event(&s, &run, "session.paused", 120).await;
    assert_eq!(paused["memory"], true, "{paused}");
    for r in &runners {
        assert_eq!(open_sessions(&r.addr).await, 0, "runner {}", r.addr);
    }
    llm.release();
    let done = s.wait_final(&run, 180).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{done:#?}\n{:#?}",
        s.event_types(&run).await
    );
    let resumed = events_of(&s, &run, "session.resumed").await;
    assert_eq!(resumed.len(), 1, "{resumed:#?}");
    assert_eq!(resumed[0]["cause"], "idle");
    assert_eq!(resumed[0]["memory"], true);
    assert_eq!(resumed[0]["turns_undone"], 0);
    assert_counter_went_on(&s, &run).await;
    assert_eq!(llm.requests().len(), 2);
    s.stop().await;
    for mut r in runners {
        r.kill().await;
    }
}

/// `cairn runs rework --from-snapshot`: the reworked attempt's session starts from the node's
/// last checkpoint (its files as they were then), not from a fresh workspace; a node that took
/// no snapshot is refused, naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rework_from_the_snapshot_starts_the_session_with_its_files() {
    let Some((s, runners)) =
        two_runners("a_rework_from_the_snapshot_starts_the_session_with_its_files").await
    else {
        return;
    };
    let end = || {
        (
            "end",
            json!({"exclude_patterns": [], "archive_name": "notes.zip"}),
        )
    };
    let llm = FakeLlm::start(
        vec![
            vec![
                (
                    "write",
                    json!({"path": "notes.txt", "content": "kept in the snapshot\n"}),
                ),
                ("run_bash_command", json!({"command": "sleep 1.2"})),
            ],
            // After the checkpoint: not in it.
            vec![
                ("write", json!({"path": "README.md", "content": README})),
                end(),
            ],
            // The reworked attempt.
            vec![
                ("run_bash_command", json!({"command": "cat notes.txt; ls"})),
                ("write", json!({"path": "README.md", "content": README})),
                end(),
            ],
        ],
        0,
    )
    .await;
    let run = submit(&s, "    checkpoint_every_s: 1\n", &llm).await;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(done.state, TaskState::Completed as i32, "{done:#?}");
    let taken = events_of(&s, &run, "session.checkpointed").await;
    assert_eq!(taken.len(), 1, "{taken:#?}");
    let snapshot = taken[0]["snapshot"].as_str().unwrap().to_owned();

    s.client
        .clone()
        .request_rework(cairn_proto::v1::ReworkRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            node_id: "cd".into(),
            by: "tester".into(),
            note: "again, from where it was".into(),
            from_snapshot: true,
        })
        .await
        .unwrap();
    let done = s.wait_final(&run, 120).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{done:#?}\n{:#?}",
        s.event_types(&run).await
    );
    let resumed = events_of(&s, &run, "session.resumed").await;
    assert_eq!(resumed.len(), 1, "{resumed:#?}");
    assert_eq!(resumed[0]["cause"], "rework");
    assert_eq!(resumed[0]["snapshot"], snapshot.as_str());
    assert_eq!(resumed[0]["previous_session_id"], taken[0]["session_id"]);
    let opened = events_of(&s, &run, "code_delivery.session_opened").await;
    assert_eq!(opened.len(), 2, "{opened:#?}");
    assert_eq!(opened[1]["from_snapshot"], snapshot.as_str());
    // The snapshot's file is there; what the first attempt wrote after it is not.
    let ls = events_of(&s, &run, "code_delivery.tool_call")
        .await
        .into_iter()
        .find(|e| {
            e["tool"] == "run_bash_command"
                && e["arguments"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("cat notes.txt")
        })
        .unwrap();
    let listed = ls["result"].as_str().unwrap();
    assert!(listed.contains("kept in the snapshot"), "{listed}");
    assert!(
        !listed.contains("README.md"),
        "README.md came after the checkpoint: {listed}"
    );

    // Without a snapshot there is nothing to start from.
    let plain = FakeLlm::start(
        vec![vec![
            ("write", json!({"path": "README.md", "content": README})),
            end(),
        ]],
        0,
    )
    .await;
    let other = submit(&s, "", &plain).await;
    s.wait_final(&other, 120).await;
    let refused = s
        .client
        .clone()
        .request_rework(cairn_proto::v1::ReworkRequest {
            project_id: PROJECT.into(),
            run_id: other.clone(),
            node_id: "cd".into(),
            by: "tester".into(),
            from_snapshot: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("took no session snapshot"),
        "{}",
        refused.message()
    );
    s.stop().await;
    for mut r in runners {
        r.kill().await;
    }
}

/// Resident memory of this process now (KiB), with its peak (VmHWM) reset to it.
fn reset_peak_rss_kib() -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    status_kib("VmRSS:")
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A checkpoint far larger than what the orchestrator may hold passes through it as it
/// streams, both ways: stored from the runner into the store, then read back into the other
/// runner after a failover. The store, the runners and the orchestrator all run in this
/// process, so its peak resident memory bounds what any of them held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_checkpoint_streams_through_and_back_without_being_held() {
    const FILES: usize = 15;
    const MIB_EACH: usize = 15;
    let Some((s, mut runners)) =
        two_runners("a_large_checkpoint_streams_through_and_back_without_being_held").await
    else {
        return;
    };
    let write_big = format!(
        "for i in $(seq {FILES}); do head -c {} /dev/zero > big$i.bin || exit 1; done; du -sb . | cut -f1; sleep 1.3",
        MIB_EACH << 20
    );
    let llm = FakeLlm::start(
        vec![
            vec![("run_bash_command", json!({"command": write_big}))],
            // 2 (held until the runner is gone): undone by the failover.
            vec![("run_bash_command", json!({"command": "true"}))],
            vec![
                (
                    "run_bash_command",
                    json!({"command": "ls big*.bin | wc -l; cat big*.bin | wc -c"}),
                ),
                ("write", json!({"path": "README.md", "content": README})),
                (
                    "end",
                    json!({"exclude_patterns": ["big*.bin"], "archive_name": "notes.zip"}),
                ),
            ],
        ],
        2,
    )
    .await;
    let before = reset_peak_rss_kib();
    let run = submit(&s, "    checkpoint_every_s: 1\n", &llm).await;
    let checkpoint = wait_event(&s, &run, "session.checkpointed", 120).await;
    let total = (FILES * MIB_EACH) as u64 * 1024 * 1024;
    assert!(
        checkpoint["bytes"].as_u64().unwrap() > total,
        "the checkpoint holds the files: {checkpoint}"
    );
    let runner = checkpoint["runner"].as_str().unwrap().to_owned();
    kill_then_finish(&s, &mut runners, &runner, &llm, &run, 180).await;
    let resumed = events_of(&s, &run, "session.resumed").await;
    assert_eq!(resumed.len(), 1, "{resumed:#?}");
    assert_ne!(resumed[0]["runner"], runner.as_str());
    let counted = tool_call_with(&s, &run, "wc -c").await;
    let result: Value = serde_json::from_str(counted["result"].as_str().unwrap()).unwrap();
    assert_eq!(
        result["stdout"],
        format!("{FILES}\n{total}\n"),
        "the resumed session has every file whole: {counted}"
    );
    let grown_mib = status_kib("VmHWM:").saturating_sub(before) / 1024;
    assert!(
        grown_mib < 128,
        "the process's peak memory grew {grown_mib} MiB for a {} MiB checkpoint stored and resumed: something held it whole",
        total >> 20
    );
    eprintln!(
        "peak memory grew {grown_mib} MiB for a {} MiB checkpoint (stored in {} ms, resumed in {} ms)",
        total >> 20,
        checkpoint["ms"],
        resumed[0]["ms"]
    );
    s.stop().await;
    for mut r in runners {
        r.kill().await;
    }
}
