//! External agent CLIs end to end over real gRPC: a fake `codex exec --json`
//! (tests/fixtures/fake_codex.py) runs in a sandbox session (Docker under
//! CAIRN_REQUIRE_DOCKER=1, the local backend otherwise; a `SKIP:` line when neither can run
//! here), asks for approval once, goes awaiting behind the node's gate, and is resumed by its
//! thread id after the decision, in a fresh sandbox session.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::{GateDecisionRequest, GateState, NodeState, ReworkRequest, TaskState};
use common::*;
use serde_json::Value;

const FAKE_CODEX: &str = include_str!("fixtures/fake_codex.py");

async fn stack(test: &str) -> Option<Stack> {
    Stack::with_sandbox(test, |_| {}).await
}

async fn put(s: &Stack, path: &str, text: &str) {
    put_file(&s.store, path, text.as_bytes()).await;
}

/// The project the agent works on: app/README.md and the fake CLI.
async fn project(s: &Stack) {
    put(s, "app/README.md", "# app\n").await;
    put(s, "app/.fake-codex.py", FAKE_CODEX).await;
}

fn graph(prompt: &str, extra: &str) -> String {
    format!(
        r#"
nodes:
  - id: coder
    type: external_agent
    agent: dev
    prompt: "{prompt}"
    command: ["python3", "/workspace/project/.fake-codex.py"]
    workspace: "app/"
    overwrite: true
    turn_timeout_s: 60{extra}
  - id: after
    type: write_file
    path: "docs/{{{{run_id}}}}/after.txt"
    content: "{{{{nodes.coder.text}}}} files={{{{nodes.coder.written_files}}}}"
"#
    )
}

fn decision(run: &str, by: &str, note: &str) -> GateDecisionRequest {
    GateDecisionRequest {
        project_id: PROJECT.into(),
        run_id: run.into(),
        gate_id: "coder".into(),
        by: by.into(),
        note: note.into(),
    }
}

async fn session(s: &Stack, run: &str) -> Value {
    let text = s
        .read_text(&format!(".cairn/runs/{run}/agents/coder/session.json"))
        .await;
    serde_json::from_str(&text).unwrap()
}

async fn lines(s: &Stack, path: &str) -> Vec<Value> {
    s.read_text(path)
        .await
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asks_for_approval_once_then_resumes_by_thread_id() {
    let Some(s) = stack("asks_for_approval_once_then_resumes_by_thread_id").await else {
        return;
    };
    project(&s).await;
    let run = s
        .submit(&graph("add hello.py and deploy it", ""), &[])
        .await
        .unwrap()
        .run_id;
    let blocked = s.wait_final_or(&run, TaskState::InputRequired, 120).await;
    assert_eq!(
        blocked.state,
        TaskState::InputRequired as i32,
        "{blocked:#?}\n{:#?}",
        s.event_types(&run).await
    );
    let dir = format!(".cairn/runs/{run}/agents/coder");

    // The gate is the node's own, blocked with what the CLI asked for.
    let gate = blocked.gates.iter().find(|g| g.id == "coder").unwrap();
    assert_eq!(gate.state, GateState::Blocked as i32);
    assert!(gate.reason.contains("make deploy"), "{}", gate.reason);
    let coder = blocked.nodes.iter().find(|n| n.id == "coder").unwrap();
    assert_eq!(coder.state, NodeState::Blocked as i32);
    let after = blocked.nodes.iter().find(|n| n.id == "after").unwrap();
    assert_eq!(after.state, NodeState::Pending as i32);

    // session.json: awaiting, with the thread id as the opaque handle.
    let sess = session(&s, &run).await;
    let mut keys: Vec<&str> = sess
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "adapter",
            "agent",
            "instance",
            "lastActiveAt",
            "recording",
            "startedAt",
            "state",
            "vendorSession"
        ]
    );
    assert_eq!(sess["agent"], "dev");
    assert_eq!(sess["instance"], "coder");
    assert_eq!(sess["adapter"], "codex-exec");
    assert_eq!(sess["state"], "awaiting");
    assert_eq!(sess["vendorSession"]["tool"], "codex");
    assert_eq!(sess["vendorSession"]["codexHome"], "./codex_home");
    let thread = sess["vendorSession"]["threadId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(thread.len(), 36, "a UUID thread id: {thread}");
    assert_eq!(sess["recording"]["events"], "./runtime/events.jsonl");
    let rollout = sess["recording"]["rollout"].as_str().unwrap().to_owned();
    assert!(rollout.contains(&thread), "{rollout}");
    assert_eq!(sess["vendorSession"]["rolloutPath"], rollout.as_str());
    // The rollout was kept in the run directory (the next turn runs in a fresh session).
    let kept = s
        .read_text(&format!("{dir}/{}", rollout.trim_start_matches("./")))
        .await;
    assert!(kept.contains("\"asked\": true"), "{kept}");

    // The runtime records.
    let requests = lines(&s, &format!("{dir}/runtime/requests.jsonl")).await;
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0]["kind"], "start");
    let events = lines(&s, &format!("{dir}/runtime/events.jsonl")).await;
    assert_eq!(events[0]["type"], "thread.started");
    assert_eq!(events.last().unwrap()["type"], "turn.completed");
    assert!(events.iter().any(|e| e["item"]["status"] == "declined"));
    let stderr = s.read_text(&format!("{dir}/runtime/stderr.log")).await;
    assert!(
        stderr.contains(&format!("thread {thread} turn 1")),
        "{stderr}"
    );
    assert!(!stderr.contains("cairn-agent-pid"), "{stderr}");
    let pid = s.read_text(&format!("{dir}/runtime/pid")).await;
    assert!(pid.trim().parse::<u32>().is_ok(), "{pid:?}");

    // Its file changes went to the project, as artifact.written of the instance.
    assert_eq!(
        s.read_text("app/hello.py").await,
        "print('hello from the fake agent')\n"
    );
    assert_eq!(
        s.read_text("app/README.md").await,
        "# app\n\nEdited by the fake agent.\n"
    );
    let evs = s.events(&run).await;
    let mut written: Vec<String> = evs
        .iter()
        .filter(|e| e.r#type == "artifact.written")
        .map(|e| {
            assert_eq!(data(e)["agent_instance"], "coder");
            data(e)["path"].as_str().unwrap().to_owned()
        })
        .collect();
    written.sort();
    assert_eq!(written, ["app/README.md", "app/hello.py"]);
    let types: Vec<&str> = evs.iter().map(|e| e.r#type.as_str()).collect();
    for t in [
        "agent.started",
        "agent.awaiting",
        "gate.blocked",
        "task.input-required",
    ] {
        assert!(types.contains(&t), "{t} missing: {types:?}");
    }
    let task = s
        .wait_text(&format!(".cairn/runs/{run}/task.yaml"), "awaiting", 10)
        .await;
    assert!(task.contains("instance: coder"), "{task}");

    // Waiting at its gate the node holds no sandbox: no session open on the runner.
    let mut runner = cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient::connect(format!(
        "http://{}",
        s.sandbox_addr.clone().unwrap()
    ))
    .await
    .unwrap();
    let info = runner
        .get_runner_info(cairn_proto::v1::GetRunnerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        info.open_sessions, 0,
        "a node waiting at a gate holds no session"
    );

    // Approve: the same thread is resumed, told the decision, with its sandbox lifted.
    s.client
        .clone()
        .approve_gate(decision(&run, "ann", "ship it"))
        .await
        .unwrap();
    let done = s.wait_final(&run, 120).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{done:#?}\n{:#?}",
        s.event_types(&run).await
    );
    assert_eq!(
        s.read_text("app/deploy.log").await,
        format!("deployed by thread {thread} on turn 2\n")
    );
    let sess = session(&s, &run).await;
    assert_eq!(sess["state"], "dormant");
    assert_eq!(sess["vendorSession"]["threadId"], thread.as_str());
    let requests = lines(&s, &format!("{dir}/runtime/requests.jsonl")).await;
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1]["kind"], "resume");
    assert_eq!(requests[1]["approved"], true);
    let argv: Vec<&str> = requests[1]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(&argv[2..5], ["exec", "resume", thread.as_str()]);
    assert!(argv.contains(&"--dangerously-bypass-approvals-and-sandbox"));
    let prompt = argv.last().unwrap();
    assert!(
        prompt.contains("ann approved") && prompt.contains("ship it"),
        "{prompt}"
    );
    assert_eq!(
        s.read_text(&format!("docs/{run}/after.txt")).await,
        "Deployed. files=[\"app/deploy.log\"]"
    );
    let coder = done.nodes.iter().find(|n| n.id == "coder").unwrap();
    let out: Value = serde_json::from_str(&coder.outputs_json).unwrap();
    assert_eq!(out["handle"], thread.as_str());
    assert_eq!(out["usage"]["input_tokens"], 200);
    let evs = s.events(&run).await;
    assert_eq!(
        evs.iter().filter(|e| e.r#type == "agent.started").count(),
        2
    );
    assert!(evs.iter().any(|e| e.r#type == "gate.approved"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_fails_the_run_and_leaves_the_instance_dormant() {
    let Some(s) = stack("a_rejection_fails_the_run_and_leaves_the_instance_dormant").await else {
        return;
    };
    project(&s).await;
    let run = s.submit(&graph("deploy", ""), &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::InputRequired, 120).await;
    s.client
        .clone()
        .reject_gate(decision(&run, "bob", "not today"))
        .await
        .unwrap();
    let done = s.wait_final(&run, 60).await;
    assert_eq!(done.state, TaskState::Failed as i32);
    assert!(
        done.error.contains("rejected by bob: not today"),
        "{}",
        done.error
    );
    assert_eq!(session(&s, &run).await["state"], "dormant");
    assert!(s.read("app/deploy.log").await.is_none());
    // No second turn ran.
    let requests = lines(
        &s,
        &format!(".cairn/runs/{run}/agents/coder/runtime/requests.jsonl"),
    )
    .await;
    assert_eq!(requests.len(), 1);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_request_with_on_reject_continue_resumes_told_so_and_rework_resumes_again() {
    let Some(s) = stack("a_declined_request_with_on_reject_continue_resumes_told_so").await else {
        return;
    };
    project(&s).await;
    let run = s
        .submit(&graph("deploy", "\n    on_reject: continue"), &[])
        .await
        .unwrap()
        .run_id;
    s.wait_state(&run, TaskState::InputRequired, 120).await;
    s.client
        .clone()
        .reject_gate(decision(&run, "bob", ""))
        .await
        .unwrap();
    let done = s.wait_final(&run, 120).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{:#?}",
        s.event_types(&run).await
    );
    assert!(s.read("app/deploy.log").await.is_none());
    assert_eq!(
        s.read_text("app/hello.py").await,
        "print('hello from the fake agent')\n# turn 2\n"
    );
    let dir = format!(".cairn/runs/{run}/agents/coder");
    let requests = lines(&s, &format!("{dir}/runtime/requests.jsonl")).await;
    assert_eq!(requests[1]["approved"], false);
    let prompt = requests[1]["argv"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    assert!(prompt.contains("bob declined"), "{prompt}");
    let thread = session(&s, &run).await["vendorSession"]["threadId"]
        .as_str()
        .unwrap()
        .to_owned();

    // A rework resumes the same (dormant) thread once more.
    s.client
        .clone()
        .request_rework(ReworkRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            node_id: "coder".into(),
            by: "ann".into(),
            note: "add a comment".into(),
            from_snapshot: false,
        })
        .await
        .unwrap();
    let done = s.wait_final(&run, 120).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{:#?}",
        s.event_types(&run).await
    );
    let requests = lines(&s, &format!("{dir}/runtime/requests.jsonl")).await;
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[2]["kind"], "resume");
    assert_eq!(requests[2]["turn"], 2);
    let argv = requests[2]["argv"].as_array().unwrap();
    assert_eq!(argv[4], thread.as_str());
    assert!(argv
        .last()
        .unwrap()
        .as_str()
        .unwrap()
        .contains("add a comment"));
    assert!(s.read_text("app/hello.py").await.ends_with("# turn 3\n"));
    assert_eq!(session(&s, &run).await["state"], "dormant");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_turns_and_protocol_errors_fail_the_node() {
    let Some(s) = stack("failed_turns_and_protocol_errors_fail_the_node").await else {
        return;
    };
    project(&s).await;
    for (marker, expect) in [
        ("[fail] [no-approval]", "turn failed: model overloaded"),
        ("[garbage] [no-approval]", "is not a valid event"),
    ] {
        let run = s
            .submit(&graph(marker, "\n    retry: {max_attempts: 1}"), &[])
            .await
            .unwrap()
            .run_id;
        let done = s.wait_final(&run, 120).await;
        assert_eq!(done.state, TaskState::Failed as i32, "{marker}");
        assert!(done.error.contains(expect), "{marker}: {}", done.error);
        let sess = session(&s, &run).await;
        assert_eq!(sess["state"], "dormant", "{marker}");
        let evs = s.event_types(&run).await;
        assert!(evs.iter().any(|e| e.starts_with("agent.failed")), "{evs:?}");
        assert!(
            !evs.iter().any(|e| e.starts_with("gate.blocked")),
            "{evs:?}"
        );
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_over_its_timeout_fails_as_a_timeout() {
    let Some(s) = stack("a_turn_over_its_timeout_fails_as_a_timeout").await else {
        return;
    };
    project(&s).await;
    let yaml = graph("[sleep 30] [no-approval]", "\n    retry: {max_attempts: 1}")
        .replace("turn_timeout_s: 60", "turn_timeout_s: 2");
    let started = std::time::Instant::now();
    let run = s.submit(&yaml, &[]).await.unwrap().run_id;
    let done = s.wait_final(&run, 60).await;
    assert_eq!(done.state, TaskState::Failed as i32);
    assert!(done.error.contains("timed out after 2s"), "{}", done.error);
    assert!(started.elapsed().as_secs() < 25, "{:?}", started.elapsed());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_agents_are_checked_at_submit() {
    let s = Stack::start(Options {
        ingest: false,
        ..Default::default()
    })
    .await;
    // No sandbox runner: refused before the run exists.
    let e = s.submit(&graph("x", ""), &[]).await.unwrap_err();
    assert!(e.message().contains("no sandbox runner"), "{e}");
    for (bad, field) in [
        ("\n    adapter: claude-code", "unknown adapter"),
        ("\n    env: {lower: x}", "env.lower"),
        ("\n    turn_timeout_s: 0", "turn_timeout_s"),
    ] {
        let e = s.submit(&graph("x", bad), &[]).await.unwrap_err();
        assert!(e.message().contains(field), "{bad}: {e}");
    }
    let e = s
        .submit(
            "nodes:\n  - {id: m, type: map, over: [1], node: {type: external_agent, prompt: x}}\n",
            &[],
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("map body"), "{e}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awaiting_instance_is_resumed_by_a_restarted_orchestrator() {
    let Some(mut s) = stack("an_awaiting_instance_is_resumed_by_a_restarted_orchestrator").await
    else {
        return;
    };
    project(&s).await;
    let run = s.submit(&graph("deploy", ""), &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::InputRequired, 120).await;
    let thread = session(&s, &run).await["vendorSession"]["threadId"]
        .as_str()
        .unwrap()
        .to_owned();
    // The first orchestrator stops; nothing of the instance lives but its records.
    s.handle.take().unwrap().shutdown().await;

    let config = cairn_orchestrator::Config {
        store_addr: s.store_addr.clone(),
        sandbox_addrs: s.sandbox_addr.iter().cloned().collect(),
        snapshot_interval_ms: 100,
        ..Default::default()
    };
    let (server, handle) = cairn_orchestrator::orchestrator_service(config)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        let mut host = cairn_server::Host::new();
        host.add(server);
        let _ = host
            .serve(listener, async {
                let _ = rx.await;
            })
            .await;
    });
    let mut client =
        cairn_proto::v1::orchestrator_client::OrchestratorClient::new(channel(&addr).await);
    let get = |mut c: cairn_proto::v1::orchestrator_client::OrchestratorClient<_>, run: String| async move {
        c.get_run(cairn_proto::v1::GetRunRequest {
            project_id: PROJECT.into(),
            run_id: run,
        })
        .await
        .map(|r| r.into_inner())
    };
    // Resumed from its records: still waiting at the agent's gate.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Ok(info) = get(client.clone(), run.clone()).await {
            if info.state == TaskState::InputRequired as i32 {
                break;
            }
        }
        assert!(std::time::Instant::now() < deadline, "not resumed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    client
        .approve_gate(decision(&run, "ann", ""))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let done = loop {
        let info = get(client.clone(), run.clone()).await.unwrap();
        if info.state == TaskState::Completed as i32 || info.state == TaskState::Failed as i32 {
            break info;
        }
        assert!(std::time::Instant::now() < deadline, "not final: {info:#?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(done.state, TaskState::Completed as i32, "{done:#?}");
    assert_eq!(
        s.read_text("app/deploy.log").await,
        format!("deployed by thread {thread} on turn 2\n")
    );
    handle.shutdown().await;
    let _ = tx.send(());
    let _ = serving.await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceled_turn_leaves_the_instance_dormant() {
    let Some(s) = stack("a_canceled_turn_leaves_the_instance_dormant").await else {
        return;
    };
    project(&s).await;
    let run = s
        .submit(&graph("[sleep 30] [no-approval]", ""), &[])
        .await
        .unwrap()
        .run_id;
    let path = format!(".cairn/runs/{run}/agents/coder/session.json");
    s.wait_text(&path, "\"working\"", 60).await;
    // Let the turn's process start before the cancel.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    s.client
        .clone()
        .cancel_run(cairn_proto::v1::RunActionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            by: "ann".into(),
            reason: "enough".into(),
        })
        .await
        .unwrap();
    let done = s.wait_final(&run, 30).await;
    assert_eq!(done.state, TaskState::Canceled as i32);
    assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
    s.wait_text(&path, "\"dormant\"", 10).await;
    assert!(s.read("app/hello.py").await.is_none());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletions_are_mirrored_and_changes_outside_the_workspace_are_refused() {
    let Some(s) =
        stack("deletions_are_mirrored_and_changes_outside_the_workspace_are_refused").await
    else {
        return;
    };
    project(&s).await;
    let run = s
        .submit(&graph("[no-approval] [delete-readme]", ""), &[])
        .await
        .unwrap()
        .run_id;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{:#?}",
        s.event_types(&run).await
    );
    let out: Value = serde_json::from_str(
        &done
            .nodes
            .iter()
            .find(|n| n.id == "coder")
            .unwrap()
            .outputs_json,
    )
    .unwrap();
    assert_eq!(out["deleted_files"], serde_json::json!(["app/README.md"]));
    assert_eq!(out["written_files"], serde_json::json!(["app/hello.py"]));
    assert!(s.read("app/README.md").await.is_none());
    assert!(s.read("app/hello.py").await.is_some());

    // A change reported outside the working directory: nothing of the turn is written back.
    put(&s, "app2/.fake-codex.py", FAKE_CODEX).await;
    let run = s
        .submit(
            &graph("[no-approval] [escape]", "\n    retry: {max_attempts: 1}")
                .replace("\"app/\"", "\"app2/\""),
            &[],
        )
        .await
        .unwrap()
        .run_id;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(done.state, TaskState::Failed as i32);
    assert!(
        done.error.contains("outside its working directory"),
        "{}",
        done.error
    );
    assert!(s.read("app2/hello.py").await.is_none());
    s.stop().await;
}
