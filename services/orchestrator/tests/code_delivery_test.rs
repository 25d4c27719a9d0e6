//! The code delivery agent end to end: the embedded store, ingest and a sandbox
//! runner over real gRPC (Docker under CAIRN_REQUIRE_DOCKER=1, the local bubblewrap backend
//! otherwise; a `SKIP:` line when neither runs here), a fake OpenAI-compatible server with
//! scripted tool calls, and a fake OneBot v11 server. Every test also checks the cleanup: the
//! session's task directory (and container) are gone when the run ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "support/graph_files.rs"]
mod graph_files;

use std::collections::VecDeque;
use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use base64::Engine as _;
use cairn_orchestrator::Config;
use cairn_proto::v1::{RunActionRequest, RunInfo, SubmitRunRequest, TaskState};
use common::*;
use graph_files::graph_files;
#[path = "../../sandbox-runner/tests/common/index.rs"]
mod index;
use index::toolchain_image as toolchain;
use serde_json::{json, Value};
use sha2::Digest;

// ---------------------------------------------------------------- fake LLM

#[derive(Clone)]
enum Answer {
    /// Tool calls (name, arguments as written).
    Calls(Vec<(String, String)>),
    /// Plain text, no tool call.
    Text(String),
    /// An HTTP error status.
    Status(u16),
    /// Never answers.
    Hang,
}

fn calls(list: &[(&str, Value)]) -> Answer {
    Answer::Calls(
        list.iter()
            .map(|(n, a)| ((*n).to_owned(), a.to_string()))
            .collect(),
    )
}

fn raw_calls(list: &[(&str, &str)]) -> Answer {
    Answer::Calls(
        list.iter()
            .map(|(n, a)| ((*n).to_owned(), (*a).to_owned()))
            .collect(),
    )
}

#[derive(Default)]
struct Script {
    answers: VecDeque<Answer>,
    then: Option<Answer>,
    seen: Vec<Value>,
}

#[derive(Clone)]
struct FakeLlm {
    script: Arc<Mutex<Script>>,
    spec: String,
}

impl FakeLlm {
    async fn start(answers: Vec<Answer>, then: Option<Answer>) -> FakeLlm {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let fake = FakeLlm {
            script: Arc::new(Mutex::new(Script {
                answers: answers.into(),
                then,
                seen: vec![],
            })),
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

    fn requests(&self) -> Vec<Value> {
        self.script.lock().unwrap().seen.clone()
    }
}

fn tool_results(request: &Value) -> Vec<String> {
    let msgs = request["messages"].as_array().unwrap();
    // The results of the last assistant turn: tool messages after the last assistant message.
    let from = msgs
        .iter()
        .rposition(|m| m["role"] == "assistant")
        .map_or(0, |i| i + 1);
    msgs[from..]
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect()
}

async fn chat(State(fake): State<FakeLlm>, body: Bytes) -> Response {
    let answer = {
        let mut s = fake.script.lock().unwrap();
        s.seen
            .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
        let n = s.seen.len();
        let then = s.then.clone();
        let a = s.answers.pop_front().or(then);
        (a, n)
    };
    let (answer, n) = answer;
    let json_response = |status: u16, body: Value| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    match answer {
        None => json_response(
            400,
            json!({"error": {"message": "the test's script has no answer left"}}),
        ),
        Some(Answer::Status(code)) => json_response(
            code,
            json!({"error": {"message": format!("scripted failure {code}")}}),
        ),
        Some(Answer::Hang) => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        Some(Answer::Text(t)) => json_response(
            200,
            json!({"model": "fake-model", "choices": [{"index": 0, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}),
        ),
        Some(Answer::Calls(list)) => {
            let tool_calls: Vec<Value> = list
                .iter()
                .enumerate()
                .map(|(i, (name, args))| json!({"id": format!("call_{n}_{i}"), "type": "function", "function": {"name": name, "arguments": args}}))
                .collect();
            json_response(
                200,
                json!({"model": "fake-model", "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": tool_calls}, "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}),
            )
        }
    }
}

// ---------------------------------------------------------------- fake OneBot

#[derive(Clone, Default)]
struct FakeOneBot {
    calls: Arc<Mutex<Vec<(String, Value)>>>,
    /// Actions answered with HTTP 404 (not supported).
    missing: Arc<Vec<&'static str>>,
}

impl FakeOneBot {
    async fn start(missing: Vec<&'static str>) -> (FakeOneBot, String) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let fake = FakeOneBot {
            calls: Default::default(),
            missing: Arc::new(missing),
        };
        let app = Router::new()
            .route("/{action}", post(onebot_action))
            .with_state(fake.clone());
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        (fake, format!("http://{addr}"))
    }

    fn calls(&self) -> Vec<(String, Value)> {
        self.calls.lock().unwrap().clone()
    }
}

async fn onebot_action(
    State(fake): State<FakeOneBot>,
    UrlPath(action): UrlPath<String>,
    _headers: HeaderMap,
    body: Bytes,
) -> Response {
    fake.calls.lock().unwrap().push((
        action.clone(),
        serde_json::from_slice(&body).unwrap_or(Value::Null),
    ));
    if fake.missing.contains(&action.as_str()) {
        return Response::builder().status(404).body(Body::empty()).unwrap();
    }
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"status": "ok", "retcode": 0, "data": null}).to_string(),
        ))
        .unwrap()
}

// ---------------------------------------------------------------- the stack

tokio::task_local! {
    /// The fake OneBot endpoint of the stack being started.
    static ONEBOT_API: String;
}

fn tweak(c: &mut Config) {
    // Fast retries; the attempt limit stays 5.
    c.llm.initial_backoff_ms = 5;
    c.llm.max_backoff_ms = 20;
    c.llm.request_timeout_ms = 30_000;
    // The fake LLM is named by URL in each request.
    c.llm.allow_request_llm_urls = true;
    c.onebot.api_base = ONEBOT_API.try_with(|a| a.clone()).unwrap_or_default();
    c.onebot.access_token_env = "CAIRN_CODE_DELIVERY_TEST_NO_TOKEN".into();
    c.code_delivery.default_command_timeout_seconds = 60;
}

async fn stack(test: &str, onebot: &str) -> Option<Stack> {
    stack_with_runner(test, onebot, |_| {}).await
}

/// `stack` with changes to the sandbox runner's config.
async fn stack_with_runner(
    test: &str,
    onebot: &str,
    runner: impl FnOnce(&mut cairn_sandbox_runner::Config) + Send + 'static,
) -> Option<Stack> {
    let start = Stack::try_start(Options {
        sandbox: Sandbox::Required,
        tweak,
        runner: Box::new(runner),
        ..Default::default()
    });
    match ONEBOT_API.scope(onebot.to_owned(), start).await {
        Ok(s) => {
            eprintln!(
                "{test}: sandbox backend {}",
                s.sandbox_backend.clone().unwrap_or_default()
            );
            Some(s)
        }
        Err(e) => {
            println!("SKIP: {test}: no sandbox backend can run here ({e})");
            None
        }
    }
}

fn graph(node: &str) -> String {
    format!("title: code delivery test\nnodes:\n  - id: cd\n    type: code_delivery\n    prompt: \"Write a greeting script with its documentation.\"\n{node}")
}

const EMPTY_TO_DIR: &str =
    "    source_type: empty\n    target: {type: directory, path: \"out/{{run_id}}\"}\n";

async fn submit(s: &Stack, yaml: &str, llm: &FakeLlm) -> String {
    s.submit_req(SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: yaml.into(),
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

fn sha256(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

fn zip_entries(bytes: &[u8]) -> Vec<String> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let mut names: Vec<String> = (0..z.len())
        .map(|i| z.by_index(i).unwrap().name().unwrap().into_owned())
        .collect();
    names.sort();
    names
}

fn zip_file(bytes: &[u8], name: &str) -> String {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let mut out = String::new();
    z.by_name(name).unwrap().read_to_string(&mut out).unwrap();
    out
}

fn targz_entries(bytes: &[u8]) -> Vec<String> {
    let mut a = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    let mut names: Vec<String> = a
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with('/'))
        .collect();
    names.sort();
    names
}

/// The tool-call events of a run: (tool, ok, result).
async fn tool_events(s: &Stack, run: &str) -> Vec<(String, bool, String)> {
    s.events(run)
        .await
        .iter()
        .filter(|e| e.r#type == "code_delivery.tool_call")
        .map(|e| {
            let d = data(e);
            (
                d["tool"].as_str().unwrap_or_default().to_owned(),
                d["ok"].as_bool().unwrap_or(false),
                d["result"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Every session the run opened is gone: no task directory on the runner, no container.
async fn assert_cleaned_up(s: &Stack, run: &str) {
    let events = s.events(run).await;
    let opened: Vec<Value> = events
        .iter()
        .filter(|e| e.r#type == "code_delivery.session_opened")
        .map(data)
        .collect();
    assert!(!opened.is_empty(), "no session was opened");
    let tasks = s.dir.path().join("sandbox-work/tasks");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<String> = opened
            .iter()
            .map(|o| o["session_id"].as_str().unwrap().to_owned())
            .filter(|id| tasks.join(id).exists())
            .collect();
        let containers: Vec<String> = if s.sandbox_backend.as_deref() == Some("docker") {
            opened
                .iter()
                .map(|o| o["container_name"].as_str().unwrap().to_owned())
                .filter(|name| {
                    let out = Command::new("docker")
                        .args([
                            "ps",
                            "-a",
                            "--filter",
                            &format!("name=^{name}$"),
                            "--format",
                            "{{.Names}}",
                        ])
                        .output()
                        .unwrap();
                    !String::from_utf8_lossy(&out.stdout).trim().is_empty()
                })
                .collect()
        } else {
            vec![]
        };
        if left.is_empty() && containers.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "left behind: task directories {left:?}, containers {containers:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const README: &str = "# Greeter\n\nPrints a greeting.\n\n## Usage\n\n    sh hello.sh NAME\n";

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_source_is_packed_stored_and_written_to_a_directory() {
    let llm = FakeLlm::start(
        vec![
            calls(&[
                ("todo", json!({"action": "add", "content": "write hello.sh and its docs"})),
                ("write", json!({"path": "hello.sh", "content": "echo \"Hello, ${1:-world}!\"\n"})),
                ("write", json!({"path": "README.md", "content": README})),
                ("write", json!({"path": "build/junk.o", "content": "junk"})),
                ("write", json!({"path": ".git/config", "content": "[core]\n"})),
            ]),
            calls(&[
                ("run_bash_command", json!({"command": "sh hello.sh cairn && ls"})),
                ("todo", json!({"action": "update", "item_id": 1, "status": "completed"})),
            ]),
            calls(&[(
                "end",
                json!({"exclude_patterns": [".git/**", "build"], "archive_name": "greeter", "archive_format": "zip", "summary": "a greeting script"}),
            )]),
        ],
        None,
    )
    .await;
    let Some(s) = stack(
        "empty_source_is_packed_stored_and_written_to_a_directory",
        "",
    )
    .await
    else {
        return;
    };
    let run = submit(&s, &graph(EMPTY_TO_DIR), &llm).await;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{done:#?}\n{:#?}",
        tool_events(&s, &run).await
    );
    let out = outputs(&done);
    let stored = format!("docs/artifacts/{run}/greeter.zip");
    assert_eq!(out["archive_path"], stored);
    assert_eq!(out["archive_name"], "greeter.zip");
    assert_eq!(out["upload_status"], "written");
    assert_eq!(out["summary"], "a greeting script");
    assert_eq!(out["iterations"], 3);
    assert_eq!(out["tool_calls"], 8);
    let archive = s.read(&stored).await.unwrap();
    assert_eq!(out["sha256"], sha256(&archive));
    assert_eq!(out["size_bytes"], archive.len() as u64);
    // Delivered: the same bytes in the target directory.
    let copy = s.read(&format!("out/{run}/greeter.zip")).await.unwrap();
    assert_eq!(copy, archive);
    assert_eq!(out["delivered_path"], format!("out/{run}/greeter.zip"));
    // Excludes honoured: no .git/, no build/.
    assert_eq!(zip_entries(&archive), ["README.md", "hello.sh"]);
    assert_eq!(out["entries"], 2);
    assert_eq!(zip_file(&archive, "README.md"), README);

    // What the model was given and got back.
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    let tools: Vec<&str> = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        [
            "read",
            "write",
            "glob",
            "grep",
            "run_bash_command",
            "todo",
            "end"
        ]
    );
    let user = reqs[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        user.starts_with("Initial source: source_type=empty\n"),
        "{user}"
    );
    let bash = &tool_results(&reqs[2])[0];
    let bash: Value = serde_json::from_str(bash).unwrap();
    assert_eq!(bash["exit_code"], 0, "{bash}");
    assert!(
        bash["stdout"].as_str().unwrap().contains("Hello, cairn!"),
        "{bash}"
    );
    // The todo board is kept in the run directory.
    let board: Value = serde_json::from_slice(
        &s.read(&format!(".cairn/runs/{run}/agents/cd/todo.json"))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(board["items"][0]["status"], "completed");
    assert_eq!(board["items"][0]["content"], "write hello.sh and its docs");

    // One event per tool call, the session opened and closed.
    let tools = tool_events(&s, &run).await;
    assert_eq!(
        tools.iter().map(|t| t.0.as_str()).collect::<Vec<_>>(),
        [
            "todo",
            "write",
            "write",
            "write",
            "write",
            "run_bash_command",
            "todo",
            "end"
        ]
    );
    assert!(tools.iter().all(|t| t.1), "{tools:#?}");
    let types = s.event_types(&run).await;
    for t in [
        "code_delivery.started cd",
        "code_delivery.session_opened cd",
        "code_delivery.delivered cd",
        "code_delivery.session_closed cd",
    ] {
        assert!(types.iter().any(|x| x == t), "{t} missing: {types:#?}");
    }
    assert!(s
        .read(&format!(
            ".cairn/runs/{run}/agents/cd/runtime/messages.json"
        ))
        .await
        .is_some());
    assert_cleaned_up(&s, &run).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archives_go_to_onebot_group_and_private_chats() {
    let (bot, api) = FakeOneBot::start(vec!["upload_private_file"]).await;
    let Some(s) = stack("archives_go_to_onebot_group_and_private_chats", &api).await else {
        return;
    };
    let script = || {
        vec![
            calls(&[
                ("write", json!({"path": "hello.sh", "content": "echo hi\n"})),
                ("write", json!({"path": "README.md", "content": README})),
            ]),
            calls(&[(
                "end",
                json!({"exclude_patterns": [], "archive_format": "tar.gz"}),
            )]),
        ]
    };
    // A group: upload_group_file.
    let llm = FakeLlm::start(script(), None).await;
    let run = submit(
        &s,
        &graph("    source_type: empty\n    target: {type: group, id: 123456}\n"),
        &llm,
    )
    .await;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(done.state, TaskState::Completed as i32, "{done:#?}");
    let out = outputs(&done);
    assert_eq!(out["upload_status"], "uploaded");
    assert_eq!(out["location"], "group:123456");
    assert_eq!(out["archive_name"], "cd.tar.gz");
    let archive = s
        .read(&format!("docs/artifacts/{run}/cd.tar.gz"))
        .await
        .unwrap();
    assert_eq!(targz_entries(&archive), ["README.md", "hello.sh"]);
    let calls = bot.calls();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0].0, "upload_group_file");
    assert_eq!(calls[0].1["group_id"], 123456);
    assert_eq!(calls[0].1["name"], "cd.tar.gz");
    let file = calls[0].1["file"].as_str().unwrap();
    let sent = base64::engine::general_purpose::STANDARD
        .decode(file.strip_prefix("base64://").unwrap())
        .unwrap();
    assert_eq!(sha256(&sent), out["sha256"].as_str().unwrap());
    // The end tool's result told the model the same.
    let end = tool_events(&s, &run).await.pop().unwrap();
    let end: Value = serde_json::from_str(&end.2).unwrap();
    assert_eq!(end["upload_status"], "uploaded");
    assert_eq!(end["sha256"], out["sha256"]);
    assert_cleaned_up(&s, &run).await;

    // A private chat whose implementation lacks upload_private_file: the file segment.
    let llm = FakeLlm::start(script(), None).await;
    let run = submit(
        &s,
        &graph("    source_type: empty\n    target: {type: private, id: 10001}\n"),
        &llm,
    )
    .await;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(done.state, TaskState::Completed as i32, "{done:#?}");
    assert_eq!(outputs(&done)["upload_status"], "sent_as_message");
    let calls = bot.calls();
    let actions: Vec<&str> = calls[1..].iter().map(|c| c.0.as_str()).collect();
    assert_eq!(actions, ["upload_private_file", "send_private_msg"]);
    assert_eq!(calls[2].1["user_id"], 10001);
    assert_eq!(calls[2].1["message"][0]["type"], "file");
    assert_cleaned_up(&s, &run).await;
    s.stop().await;
}

/// A bare repository whose `feature` branch holds README.md, app.sh and a cache file.
fn bare_repo(dir: &Path) -> (String, String) {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let git = |args: &[&str], cwd: &Path| {
        let out = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.invalid",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(cwd)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    git(&["init", "-q"], &src);
    std::fs::write(src.join("README.md"), "main branch\n").unwrap();
    git(&["add", "-A"], &src);
    git(&["commit", "-qm", "one"], &src);
    git(&["checkout", "-qb", "feature"], &src);
    std::fs::write(src.join("README.md"), "# App\n\nFeature branch.\n").unwrap();
    std::fs::write(src.join("app.sh"), "echo app\n").unwrap();
    std::fs::create_dir_all(src.join("__pycache__")).unwrap();
    std::fs::write(src.join("__pycache__/x.pyc"), "pyc").unwrap();
    git(&["add", "-A", "-f"], &src);
    git(&["commit", "-qm", "two"], &src);
    let commit = git(&["rev-parse", "HEAD"], &src);
    git(&["clone", "-q", "--bare", "src", "repo.git"], dir);
    (dir.join("repo.git").to_string_lossy().into_owned(), commit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_source_is_cloned_changed_and_delivered_without_excluded_paths() {
    let repos = tempfile::tempdir().unwrap();
    let (url, commit) = bare_repo(repos.path());
    let llm = FakeLlm::start(
        vec![
            calls(&[
                ("read", json!({"path": "README.md"})),
                ("glob", json!({"pattern": "**/*.sh"})),
                ("write", json!({"path": "CHANGES.md", "content": "- added a flag\n"})),
            ]),
            calls(&[(
                "end",
                json!({"exclude_patterns": [".git/**", "__pycache__/**"], "archive_name": "app.zip"}),
            )]),
        ],
        None,
    )
    .await;
    let Some(s) = stack(
        "a_git_source_is_cloned_changed_and_delivered_without_excluded_paths",
        "",
    )
    .await
    else {
        return;
    };
    let node = format!(
        "    source_type: git\n    git_url: \"{url}\"\n    git_ref: feature\n    target: {{type: directory, path: \"out/{{{{run_id}}}}\"}}\n"
    );
    let run = submit(&s, &graph(&node), &llm).await;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{done:#?}\n{:#?}",
        tool_events(&s, &run).await
    );
    let out = outputs(&done);
    assert_eq!(out["git_commit"], commit);
    let archive = s
        .read(&format!("docs/artifacts/{run}/app.zip"))
        .await
        .unwrap();
    assert_eq!(
        zip_entries(&archive),
        ["CHANGES.md", "README.md", "app.sh"],
        "no .git/ and no __pycache__/ in the archive"
    );
    assert_eq!(
        zip_file(&archive, "README.md"),
        "# App\n\nFeature branch.\n"
    );
    let reqs = llm.requests();
    let user = reqs[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        user.starts_with(&format!(
            "Initial source: source_type=git, git_url={url}, git_ref=feature\n"
        )),
        "{user}"
    );
    assert!(user.contains(&commit), "{user}");
    let results = tool_results(&reqs[1]);
    assert_eq!(results[0], "# App\n\nFeature branch.\n");
    assert_eq!(results[1], "app.sh");
    assert_cleaned_up(&s, &run).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_source_end_is_refused_until_readme_and_docs_exist() {
    let end = || ("end", json!({"exclude_patterns": []}));
    let llm = FakeLlm::start(
        vec![
            calls(&[
                ("write", json!({"path": "hello.sh", "content": "echo hi\n"})),
                end(),
            ]),
            calls(&[
                ("write", json!({"path": "README.md", "content": "   \n"})),
                end(),
            ]),
            calls(&[
                (
                    "write",
                    json!({"path": "README.md", "content": "# Hello\n\nSays hi.\n"}),
                ),
                end(),
            ]),
            calls(&[
                (
                    "write",
                    json!({"path": "docs/usage.md", "content": "Run `sh hello.sh`.\n"}),
                ),
                ("end", json!({"exclude_patterns": ["docs/**"]})),
            ]),
            calls(&[end()]),
        ],
        None,
    )
    .await;
    let Some(s) = stack(
        "an_empty_source_end_is_refused_until_readme_and_docs_exist",
        "",
    )
    .await
    else {
        return;
    };
    let run = submit(&s, &graph(EMPTY_TO_DIR), &llm).await;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(done.state, TaskState::Completed as i32, "{done:#?}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 5);
    let refusal = |i: usize| tool_results(&reqs[i]).pop().unwrap();
    let r = refusal(1);
    assert!(
        r.starts_with("error: `end` refused") && r.contains("there is no README.md"),
        "{r}"
    );
    assert!(refusal(2).contains("README.md is empty"), "{}", refusal(2));
    let r = refusal(3);
    assert!(
        !r.contains("README.md is empty") && r.contains("documentation of how to use and run"),
        "{r}"
    );
    let r = refusal(4);
    assert!(
        r.contains("documentation of how to use and run"),
        "docs/ excluded from the archive does not count: {r}"
    );
    let archive = s
        .read(&format!("docs/artifacts/{run}/cd.zip"))
        .await
        .unwrap();
    assert_eq!(
        zip_entries(&archive),
        ["README.md", "docs/usage.md", "hello.sh"]
    );
    let ends: Vec<bool> = tool_events(&s, &run)
        .await
        .into_iter()
        .filter(|t| t.0 == "end")
        .map(|t| t.1)
        .collect();
    assert_eq!(ends, [false, false, false, false, true]);
    assert_cleaned_up(&s, &run).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_arguments_go_back_to_the_model() {
    let llm = FakeLlm::start(
        vec![
            raw_calls(&[
                ("read", "{\"path\": "),
                ("write", "{\"path\": \"a.txt\"}"),
                ("rm", "{\"path\": \"/\"}"),
                ("todo", "{\"action\": \"remove\", \"item_id\": \"two\"}"),
                ("end", "{}"),
                ("read", "{\"path\": \"../../etc/passwd\"}"),
                ("read", "{\"path\": \"missing.txt\"}"),
                ("run_bash_command", "[\"ls\"]"),
            ]),
            Answer::Text("I think I am done.".into()),
            calls(&[
                ("write", json!({"path": "README.md", "content": README})),
                ("end", json!({"exclude_patterns": []})),
            ]),
        ],
        None,
    )
    .await;
    let Some(s) = stack("bad_tool_arguments_go_back_to_the_model", "").await else {
        return;
    };
    let run = submit(&s, &graph(EMPTY_TO_DIR), &llm).await;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(done.state, TaskState::Completed as i32, "{done:#?}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    let results = tool_results(&reqs[1]);
    let expect = [
        "not valid JSON",
        "missing field `content`",
        "unknown tool `rm`",
        "item_id `two` is not a number",
        "missing field `exclude_patterns`",
        "",
        "",
        "must be a JSON object, not an array",
    ];
    assert_eq!(results.len(), expect.len(), "{results:#?}");
    for (r, want) in results.iter().zip(expect) {
        assert!(r.starts_with("error: "), "{r}");
        assert!(r.contains(want), "{want:?} not in {r}");
    }
    // A text answer without a tool call is answered with a nudge, not an end.
    let last = reqs[2]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    assert!(last["content"].as_str().unwrap().contains("call `end`"));
    let events = tool_events(&s, &run).await;
    assert_eq!(events.iter().filter(|t| !t.1).count(), 9, "{events:#?}");
    assert_cleaned_up(&s, &run).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_iteration_limit_ends_the_task() {
    let llm = FakeLlm::start(vec![], Some(calls(&[("todo", json!({"action": "list"}))]))).await;
    let Some(s) = stack("the_iteration_limit_ends_the_task", "").await else {
        return;
    };
    let run = submit(
        &s,
        &graph(&format!("{EMPTY_TO_DIR}    max_iterations: 3\n")),
        &llm,
    )
    .await;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(done.state, TaskState::Failed as i32, "{done:#?}");
    assert!(
        done.nodes[0].error.contains("all 3 turns (max_iterations)"),
        "{}",
        done.nodes[0].error
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    let last = reqs[2]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        last["content"].as_str().unwrap().contains("last turn"),
        "{last}"
    );
    assert_cleaned_up(&s, &run).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_request_failing_five_times_sends_the_failure_notice() {
    let (bot, api) = FakeOneBot::start(vec![]).await;
    let Some(s) = stack(
        "an_llm_request_failing_five_times_sends_the_failure_notice",
        &api,
    )
    .await
    else {
        return;
    };
    // To a group: send_group_msg with the notice.
    let llm = FakeLlm::start(
        vec![calls(&[("todo", json!({"action": "list"}))])],
        Some(Answer::Status(503)),
    )
    .await;
    let run = submit(
        &s,
        &graph("    source_type: empty\n    target: {type: group, id: 42}\n"),
        &llm,
    )
    .await;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(done.state, TaskState::Failed as i32, "{done:#?}");
    let error = &done.nodes[0].error;
    assert!(
        error.contains("failed 5 times in a row")
            && error.contains("failure notice sent to group:42"),
        "{error}"
    );
    assert_eq!(
        llm.requests().len(),
        6,
        "one answer, then 5 attempts of request 2"
    );
    let calls = bot.calls();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0].0, "send_group_msg");
    assert_eq!(calls[0].1["group_id"], 42);
    let text = calls[0].1["message"][0]["data"]["text"].as_str().unwrap();
    assert!(text.starts_with("[cairn] task failed\n"), "{text}");
    assert!(text.contains(&format!("task: {run}/cd")), "{text}");
    assert!(
        text.contains("stage: code delivery tool loop, LLM request 2"),
        "{text}"
    );
    assert!(text.contains("HTTP 503"), "{text}");
    assert!(text.contains("retry: "), "{text}");
    let events = s.events(&run).await;
    let attempts: Vec<Value> = events
        .iter()
        .filter(|e| e.r#type == "llm.attempt" && data(e)["step"] == 2)
        .map(data)
        .collect();
    assert_eq!(attempts.len(), 5);
    assert_eq!(attempts[4]["will_retry"], false);
    assert!(events
        .iter()
        .any(|e| e.r#type == "code_delivery.failure_notice" && data(e)["sent"] == true));
    assert_cleaned_up(&s, &run).await;

    // To a directory: the notice is a file there.
    let llm = FakeLlm::start(vec![], Some(Answer::Status(500))).await;
    let run = submit(&s, &graph(EMPTY_TO_DIR), &llm).await;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(done.state, TaskState::Failed as i32, "{done:#?}");
    assert_eq!(llm.requests().len(), 5);
    let notice = s.read_text(&format!("out/{run}/cd-failure.txt")).await;
    assert!(
        notice.starts_with("[cairn] task failed\n") && notice.contains("HTTP 500"),
        "{notice}"
    );
    assert_cleaned_up(&s, &run).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_time_limit_clean_up_the_session() {
    let Some(s) = stack("cancel_and_time_limit_clean_up_the_session", "").await else {
        return;
    };
    // Cancelled while a command runs.
    let llm = FakeLlm::start(
        vec![calls(&[(
            "run_bash_command",
            json!({"command": "sleep 60"}),
        )])],
        Some(Answer::Hang),
    )
    .await;
    let run = submit(&s, &graph(EMPTY_TO_DIR), &llm).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while llm.requests().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the model was never asked"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    s.client
        .clone()
        .cancel_run(RunActionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            by: "tester".into(),
            reason: "changed my mind".into(),
        })
        .await
        .unwrap();
    let done = s.wait_final(&run, 60).await;
    assert_eq!(done.state, TaskState::Canceled as i32, "{done:#?}");
    assert_cleaned_up(&s, &run).await;

    // The node's time limit (timeout_s 5, less 2 s kept for cleanup) while the model hangs.
    let llm = FakeLlm::start(vec![], Some(Answer::Hang)).await;
    let run = submit(
        &s,
        &graph(&format!("{EMPTY_TO_DIR}    timeout_s: 5\n")),
        &llm,
    )
    .await;
    let done = s.wait_final(&run, 60).await;
    assert_eq!(done.state, TaskState::Failed as i32, "{done:#?}");
    assert!(
        done.nodes[0].error.contains("ran out of time"),
        "{}",
        done.nodes[0].error
    );
    assert!(s
        .event_types(&run)
        .await
        .iter()
        .any(|t| t == "code_delivery.session_closed cd"));
    assert_cleaned_up(&s, &run).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graphs_with_bad_code_delivery_nodes_are_refused_at_submit() {
    let llm = FakeLlm::start(vec![], None).await;
    let Some(s) = stack(
        "graphs_with_bad_code_delivery_nodes_are_refused_at_submit",
        "",
    )
    .await
    else {
        return;
    };
    for (node, want) in [
        (
            "    source_type: git\n    target: {type: directory, path: out}\n",
            "field `git_url`",
        ),
        (
            "    source_type: empty\n    git_url: /x\n    target: {type: directory, path: out}\n",
            "drop `git_url`",
        ),
        (
            "    source_type: empty\n    target: {type: channel, id: 1}\n",
            "not one of group, private, directory",
        ),
        (
            "    source_type: empty\n    target: {type: group, id: -4}\n",
            "positive",
        ),
        (
            "    source_type: empty\n    target: {type: directory, path: ../up}\n",
            "field `target`",
        ),
        (
            "    source_type: empty\n    max_iterations: 0\n    target: {type: directory, path: out}\n",
            "max_iterations",
        ),
        ("    source_type: zip\n    target: {type: directory, path: out}\n", "source_type"),
        (
            "    source_type: empty\n    image: 'no spaces please'\n    target: {type: directory, path: out}\n",
            "field `image`",
        ),
    ] {
        let e = s
            .submit_req(SubmitRunRequest {
                project_id: PROJECT.into(),
                graph_yaml: graph(node),
                llm: llm.spec.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{node}: {e}");
        assert!(e.message().contains(want), "{want:?} not in {}", e.message());
    }
    s.stop().await;
}

/// examples/code_delivery runs offline: replayed tool calls, a refused first `end`, the zip
/// in docs/artifacts/ and in the target directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_code_delivery_example_runs_offline() {
    let Some(s) = stack("the_code_delivery_example_runs_offline", "").await else {
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/code_delivery");
    let run = s
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: std::fs::read_to_string(dir.join("graph.yaml")).unwrap(),
            files: graph_files(&dir).await,
            // What `cairn run` sends for the graph's local `replay:cassette.yaml`.
            llm: inline_cassette(&std::fs::read(dir.join("cassette.yaml")).unwrap()),
            by: "example".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{done:#?}\n{:#?}",
        tool_events(&s, &run).await
    );
    let out = outputs(&done);
    assert_eq!(
        out["archive_path"],
        format!("docs/artifacts/{run}/wordcount.zip")
    );
    assert_eq!(out["upload_status"], "written");
    assert_eq!(out["iterations"], 5);
    let archive = s
        .read(&format!("delivered/{run}/wordcount.zip"))
        .await
        .unwrap();
    assert_eq!(out["sha256"], sha256(&archive));
    assert_eq!(
        zip_entries(&archive),
        ["README.md", "docs/usage.md", "test.sh", "wordcount.sh"]
    );
    let tools = tool_events(&s, &run).await;
    let bash = tools.iter().find(|t| t.0 == "run_bash_command").unwrap();
    assert!(bash.2.contains("all tests passed"), "{bash:?}");
    let ends: Vec<bool> = tools.iter().filter(|t| t.0 == "end").map(|t| t.1).collect();
    assert_eq!(ends, [false, true], "the first end is refused (no README)");
    assert_cleaned_up(&s, &run).await;
    s.stop().await;
}

// ---------------------------------------------------------------- toolchain image, network

/// A task that runs `command` once, writes a README and ends; returns the command's result as
/// the model saw it.
async fn run_one_command(s: &Stack, node: &str, command: &str) -> Value {
    let llm = FakeLlm::start(
        vec![
            calls(&[
                (
                    "run_bash_command",
                    json!({"command": command, "timeout_seconds": 180}),
                ),
                ("write", json!({"path": "README.md", "content": README})),
            ]),
            calls(&[("end", json!({"exclude_patterns": [], "summary": "done"}))]),
        ],
        None,
    )
    .await;
    let run = submit(s, &graph(node), &llm).await;
    let done = s.wait_final(&run, 300).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{done:#?}\n{:#?}",
        tool_events(s, &run).await
    );
    let opened: Vec<Value> = s
        .events(&run)
        .await
        .iter()
        .filter(|e| e.r#type == "code_delivery.session_opened")
        .map(data)
        .collect();
    assert_eq!(opened[0]["image"], toolchain(), "{opened:?}");
    assert_cleaned_up(s, &run).await;
    serde_json::from_str(&tool_results(&llm.requests()[1])[0]).unwrap()
}

/// A code delivery task in the toolchain image installs a package with pip from a local index
/// the test serves on a Docker network it creates (the runner's docker_network) when the node
/// sets `network: true`; its twin without network cannot reach the index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_toolchain_task_pip_installs_from_a_local_index_only_with_network() {
    let test = "a_toolchain_task_pip_installs_from_a_local_index_only_with_network";
    if !docker_required() {
        println!("SKIP: {test}: needs Docker and the toolchain image (set CAIRN_REQUIRE_DOCKER=1)");
        return;
    }
    assert!(
        index::toolchain_image_present(),
        "CAIRN_REQUIRE_DOCKER=1 but the image {} is missing: build it with deploy/images/build-images.sh",
        toolchain()
    );
    let net = index::TestNetwork::create("cd");
    let pypi = index::PackageIndex::serve(&net.gateway).await;
    let network = net.name.clone();
    let Some(s) = stack_with_runner(test, "", move |c| {
        c.network_allowed = true;
        c.docker_network = network;
    })
    .await
    else {
        return;
    };
    let node = |network: bool| {
        format!(
            "    image: {}\n    network: {network}\n{EMPTY_TO_DIR}",
            toolchain()
        )
    };
    let script = pypi.pip_install_script("/tmpfs/venv");

    let off = run_one_command(&s, &node(false), &script).await;
    assert_ne!(off["exit_code"], 0, "{off}");
    assert!(pypi.requests().is_empty(), "{:?}", pypi.requests());

    let on = run_one_command(&s, &node(true), &script).await;
    assert_eq!(on["exit_code"], 0, "{on}");
    assert!(
        on["stdout"].as_str().unwrap().contains(index::VALUE),
        "{on}"
    );
    assert!(
        pypi.requests().iter().any(|p| p.ends_with(".whl")),
        "{:?}",
        pypi.requests()
    );
    s.stop().await;
}

/// On a runner that forbids network (the default) or does not list an image, the task fails
/// at its session's opening, naming the runner setting that would allow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_or_an_image_the_runner_forbids_fails_the_task_naming_the_setting() {
    let test = "network_or_an_image_the_runner_forbids_fails_the_task_naming_the_setting";
    let Some(s) = stack(test, "").await else {
        return;
    };
    for (node, setting) in [
        ("    network: true\n", "network_allowed"),
        ("    image: debian:bookworm\n", "allowed_images"),
    ] {
        let llm = FakeLlm::start(vec![], Some(Answer::Status(500))).await;
        let run = submit(&s, &graph(&format!("{node}{EMPTY_TO_DIR}")), &llm).await;
        let done = s.wait_final(&run, 120).await;
        assert_eq!(done.state, TaskState::Failed as i32, "{done:#?}");
        let error = &done.nodes[0].error;
        assert!(error.contains(setting), "{setting} not in {error}");
        assert!(llm.requests().is_empty(), "the model was asked: {node}");
    }
    s.stop().await;
}
