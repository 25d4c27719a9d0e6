//! Installed tools of `tool_call` nodes on both backends: the legacy subprocess
//! (default) and the sandbox runner (`sandbox.runner.features.use_for_tools = true`). The same
//! tool gives the same result on both; the flag off changes nothing; a timeout or protocol
//! error on the sandbox backend fails the node and never falls back to the legacy one. Tests
//! that need a sandbox runner use Docker under CAIRN_REQUIRE_DOCKER=1, the local backend
//! otherwise, and print a `SKIP:` line when neither can run here.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_orchestrator::Config;
use cairn_proto::v1::{SubmitRunRequest, TaskState};
use common::*;
use serde_json::Value;

fn tools_dir(c: &mut Config) {
    c.tools_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tools").into();
    c.retry.max_attempts = 1;
}

fn sandboxed(c: &mut Config) {
    tools_dir(c);
    c.sandbox.runner.features.use_for_tools = true;
}

/// The flag on, but the only runner is a port nobody listens on.
fn sandboxed_dead_runner(c: &mut Config) {
    sandboxed(c);
    c.sandbox_addrs = vec!["127.0.0.1:1".into()];
}

async fn put(s: &Stack, path: &str, text: &str) {
    put_file(&s.store, path, text.as_bytes()).await;
}

async fn project(s: &Stack) {
    put(s, "docs/in/a.md", "one two three\n").await;
    put(s, "docs/in/b.md", "four five\n").await;
    put(s, "docs/other.md", "not counted\n").await;
    // Outside the tool's allowed_paths: never staged.
    put(s, "secret/key.txt", "s3cr3t\n").await;
}

const GRAPH: &str = r#"
nodes:
  - id: count
    type: tool_call
    tool: wordcount
    args: {prefix: docs/in, label: "run {{run_id}}"}
  - id: echo
    type: tool_call
    tool: echo
    args: {value: "{{nodes.count.result.words}} words"}
  - id: report
    type: write_file
    path: "docs/{{run_id}}/report.txt"
    content: "{{nodes.count.result.files}} files, {{nodes.echo.value}}, total {{nodes.count.written_files}}"
"#;

async fn submit(s: &Stack, yaml: &str, run_id: &str) -> String {
    s.submit_req(SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: yaml.into(),
        run_id: run_id.into(),
        by: "tester".into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .run_id
}

fn outputs(info: &cairn_proto::v1::RunInfo, node: &str) -> Value {
    let n = info.nodes.iter().find(|n| n.id == node).unwrap();
    serde_json::from_str(&n.outputs_json).unwrap_or(Value::Null)
}

/// What a run of GRAPH produced, for comparing backends.
struct Produced {
    result: Value,
    written: Value,
    files: Vec<(String, String)>,
    report: String,
    backend: String,
    events: Vec<String>,
}

async fn run_graph(s: &Stack, run_id: &str) -> Produced {
    project(s).await;
    let run = submit(s, GRAPH, run_id).await;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{done:#?}\n{:#?}",
        s.event_types(&run).await
    );
    let out = outputs(&done, "count");
    let mut files = Vec::new();
    for p in s.list(&format!("docs/artifacts/{run}/count")).await {
        files.push((p.clone(), s.read_text(&p).await));
    }
    files.sort();
    Produced {
        result: out["result"].clone(),
        written: out["written_files"].clone(),
        files,
        report: s.read_text(&format!("docs/{run}/report.txt")).await,
        backend: out["backend"].as_str().unwrap().to_owned(),
        events: s.event_types(&run).await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_tool_gives_the_same_result_on_both_backends() {
    let legacy = Stack::start(Options {
        ingest: false,
        tweak: tools_dir,
        ..Default::default()
    })
    .await;
    let a = run_graph(&legacy, "same-run").await;
    legacy.stop().await;

    // The legacy result itself is right.
    assert_eq!(a.backend, "legacy");
    assert_eq!(a.result["files"], 2);
    assert_eq!(a.result["words"], 5);
    assert_eq!(a.result["label"], "run same-run");
    assert_eq!(
        a.result["seen"],
        serde_json::json!(["docs/in/a.md", "docs/in/b.md", "docs/other.md"])
    );
    assert_eq!(a.result["env_leak"], serde_json::json!([]));
    assert_eq!(
        a.files,
        [
            (
                "docs/artifacts/same-run/count/counts.json".to_owned(),
                r#"{"docs/in/a.md": 3, "docs/in/b.md": 2}"#.to_owned()
            ),
            (
                "docs/artifacts/same-run/count/summary/total.txt".to_owned(),
                "5\n".to_owned()
            ),
        ]
    );
    assert_eq!(
        a.report,
        r#"2 files, 5 words, total ["docs/artifacts/same-run/count/counts.json","docs/artifacts/same-run/count/summary/total.txt"]"#
    );
    assert!(
        !a.events.iter().any(|e| e.starts_with("sandbox_")),
        "{:?}",
        a.events
    );

    let Ok(sandbox) = Stack::try_start(Options {
        ingest: false,
        sandbox: Sandbox::Required,
        tweak: sandboxed,
        ..Default::default()
    })
    .await
    else {
        println!("SKIP: the_same_tool_gives_the_same_result_on_both_backends: sandbox half (no sandbox backend can run here)");
        return;
    };
    let b = run_graph(&sandbox, "same-run").await;
    assert_eq!(b.backend, "sandbox");
    assert_eq!(b.result, a.result);
    assert_eq!(b.written, a.written);
    assert_eq!(b.files, a.files);
    assert_eq!(b.report, a.report);
    // The sandbox run is recorded as one.
    for t in ["sandbox_start count", "sandbox_complete count"] {
        assert!(b.events.iter().any(|e| e == t), "{t}: {:?}", b.events);
    }
    let record: Value = serde_json::from_str(
        &sandbox
            .read_text(".cairn/runs/same-run/sandbox/count/result.json")
            .await,
    )
    .unwrap();
    assert_eq!(record["tool"], "wordcount");
    assert_eq!(record["exit_code"], 0);
    sandbox.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flag_off_changes_nothing_even_with_a_runner() {
    // A runner is configured, the flag is off: installed tools stay subprocesses and built-in
    // tools are what they always were.
    let s = match Stack::try_start(Options {
        ingest: false,
        sandbox: Sandbox::Required,
        tweak: tools_dir,
        ..Default::default()
    })
    .await
    {
        Ok(s) => s,
        Err(e) => {
            println!(
                "SKIP: the_flag_off_changes_nothing_even_with_a_runner: no sandbox backend ({e})"
            );
            return;
        }
    };
    let p = run_graph(&s, "flag-off").await;
    assert_eq!(p.backend, "legacy");
    assert_eq!(p.result["words"], 5);
    assert!(
        !p.events.iter().any(|e| e.starts_with("sandbox_")),
        "{:?}",
        p.events
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_on_the_sandbox_backend_fails_the_node() {
    let s = match Stack::try_start(Options {
        ingest: false,
        sandbox: Sandbox::Required,
        tweak: sandboxed,
        ..Default::default()
    })
    .await
    {
        Ok(s) => s,
        Err(e) => {
            println!(
                "SKIP: a_timeout_on_the_sandbox_backend_fails_the_node: no sandbox backend ({e})"
            );
            return;
        }
    };
    let started = std::time::Instant::now();
    let run = submit(
        &s,
        "nodes:\n  - {id: nap, type: tool_call, tool: sleeper}\n",
        "",
    )
    .await;
    let done = s.wait_final(&run, 60).await;
    assert_eq!(done.state, TaskState::Failed as i32);
    assert!(
        done.error
            .contains("timed out after 1s on the sandbox backend"),
        "{}",
        done.error
    );
    assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
    let evs = s.event_types(&run).await;
    assert!(evs.iter().any(|e| e == "sandbox_failed nap"), "{evs:?}");
    assert!(
        !evs.iter().any(|e| e.starts_with("artifact.written")),
        "{evs:?}"
    );
    // Nothing came back by another way.
    assert!(s.list(&format!("docs/artifacts/{run}")).await.is_empty());

    // A protocol error (stdout that is not a result) fails the node too.
    let run = submit(
        &s,
        "nodes:\n  - {id: chatty, type: tool_call, tool: notjson}\n",
        "",
    )
    .await;
    let done = s.wait_final(&run, 60).await;
    assert_eq!(done.state, TaskState::Failed as i32);
    assert!(
        done.error.contains("other than one JSON object"),
        "{}",
        done.error
    );
    assert!(s
        .event_types(&run)
        .await
        .iter()
        .any(|e| e == "sandbox_failed chatty"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_runner_fails_the_node_and_never_falls_back() {
    let s = Stack::start(Options {
        ingest: false,
        tweak: sandboxed_dead_runner,
        ..Default::default()
    })
    .await;
    project(&s).await;
    let run = submit(&s, GRAPH, "").await;
    let done = s.wait_final(&run, 60).await;
    assert_eq!(done.state, TaskState::Failed as i32);
    assert!(
        done.error
            .contains("tool `wordcount` on the sandbox backend"),
        "{}",
        done.error
    );
    // The legacy backend never ran it: no output, no result.
    assert!(s.list(&format!("docs/artifacts/{run}")).await.is_empty());
    let evs = s.event_types(&run).await;
    assert!(evs.iter().any(|e| e == "sandbox_failed count"), "{evs:?}");
    assert!(!evs.iter().any(|e| e == "node.completed count"), "{evs:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_backend_refusals_and_failures() {
    let s = Stack::start(Options {
        ingest: false,
        tweak: tools_dir,
        ..Default::default()
    })
    .await;
    project(&s).await;
    for (tool, expect) in [
        ("notjson", "other than one JSON object"),
        ("linker", "output `passwd` refused (symlink)"),
        ("sleeper", "timed out after 1s on the legacy backend"),
    ] {
        let started = std::time::Instant::now();
        let run = submit(
            &s,
            &format!("nodes:\n  - {{id: t, type: tool_call, tool: {tool}}}\n"),
            "",
        )
        .await;
        let done = s.wait_final(&run, 60).await;
        assert_eq!(done.state, TaskState::Failed as i32, "{tool}");
        assert!(done.error.contains(expect), "{tool}: {}", done.error);
        assert!(
            s.list(&format!("docs/artifacts/{run}")).await.is_empty(),
            "{tool}"
        );
        assert!(
            started.elapsed().as_secs() < 20,
            "{tool}: {:?}",
            started.elapsed()
        );
    }
    // Checked at submit: a tool that is not installed, a missing argument.
    let e = s
        .submit("nodes:\n  - {id: t, type: tool_call, tool: nosuch}\n", &[])
        .await
        .unwrap_err();
    assert!(e.message().contains("not installed"), "{e}");
    let e = s
        .submit(
            "nodes:\n  - {id: t, type: tool_call, tool: wordcount}\n",
            &[],
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("needs argument `prefix`"), "{e}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_tools_need_a_tools_dir() {
    let s = Stack::start(Options {
        ingest: false,
        ..Default::default()
    })
    .await;
    let e = s
        .submit(
            "nodes:\n  - {id: t, type: tool_call, tool: wordcount, args: {prefix: docs}}\n",
            &[],
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("no tools_dir"), "{e}");
    let e = s
        .submit(
            "nodes:\n  - {id: t, type: tool_call, tool: \"Bad/Name\"}\n",
            &[],
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("unknown tool"), "{e}");
    s.stop().await;
}
