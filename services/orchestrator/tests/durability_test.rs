//! kill -9 of the orchestrator process mid-run, restart, and the run resumes from its records:
//! no completed node redone, no file or event duplicated.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{GetRunRequest, RunInfo, SubmitRunRequest, TaskState};
use common::*;
use tonic::transport::Channel;

/// The orchestrator as its own process, against the in-process store.
struct Proc {
    child: Child,
    client: OrchestratorClient<Channel>,
}

/// A test that fails midway leaves no orchestrator running.
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn spawn(store_addr: &str) -> Proc {
    spawn_with(store_addr, &[]).await
}

/// [`spawn`] with more arguments.
async fn spawn_with(store_addr: &str, extra: &[&str]) -> Proc {
    // A free port can be taken by someone else before the child binds it: then it exits (or
    // something else answers) and we try another.
    for _ in 0..5 {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let addr = format!("127.0.0.1:{port}");
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn-orchestrator"))
            .args([
                "--listen",
                &addr,
                "--store-addr",
                store_addr,
                "--ingest-addr",
                "",
                "--set",
                "snapshot_interval_ms=50",
            ])
            .args(extra)
            .env_remove("CAIRN_ORCHESTRATOR_CONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let client = OrchestratorClient::new(channel(&addr).await);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // Our orchestrator answers NotFound for an unknown run; anything else is not it.
            let r = client
                .clone()
                .get_run(GetRunRequest {
                    project_id: PROJECT.into(),
                    run_id: "none".into(),
                })
                .await;
            match r {
                Err(e) if e.code() == tonic::Code::NotFound => return Proc { child, client },
                _ if child.try_wait().unwrap().is_some() || Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
    panic!("the orchestrator process never answered");
}

/// Submits `graph` to `p`; the run's id.
async fn submit(p: &Proc, graph: impl Into<String>) -> String {
    p.client
        .clone()
        .submit_run(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: graph.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run_id
}

async fn info(p: &Proc, run: &str) -> RunInfo {
    p.client
        .clone()
        .get_run(GetRunRequest {
            project_id: PROJECT.into(),
            run_id: run.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

async fn wait_state(p: &Proc, run: &str, state: TaskState, secs: u64) -> RunInfo {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let i = info(p, run).await;
        if i.state == state as i32 {
            return i;
        }
        assert!(
            Instant::now() < deadline,
            "run did not reach {state:?}: {i:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn chain_and_map(n_chain: usize, n_items: usize) -> String {
    let mut g = String::from("title: long\nnodes:\n");
    for i in 0..n_chain {
        let content = if i == 0 {
            "start".to_owned()
        } else {
            format!("after {{{{nodes.c{}.path}}}}", i - 1)
        };
        g.push_str(&format!("  - {{id: c{i}, type: write_file, path: \"docs/{{{{run_id}}}}/c{i}.txt\", content: \"{content}\"}}\n"));
    }
    let items: Vec<String> = (0..n_items).map(|i| i.to_string()).collect();
    g.push_str(&format!(
        "  - id: fan\n    type: map\n    parallelism: 2\n    over: [{}]\n    node: {{type: write_file, path: \"docs/{{{{run_id}}}}/m{{{{item}}}}.txt\", content: \"item {{{{item}}}}\"}}\n",
        items.join(", ")
    ));
    g
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_mid_run_resumes_without_duplicates() {
    // The in-process orchestrator of the stack must not resume this run too: one orchestrator
    // drives a run (see docs/run-directory.md, "Who drives a run").
    let s = Stack::start(Options {
        ingest: false,
        tweak: |c| c.resume_on_start = false,
        ..Default::default()
    })
    .await;
    let (n_chain, n_items) = (120, 150);
    let mut p = spawn(&s.store_addr).await;
    let run = submit(&p, chain_and_map(n_chain, n_items)).await;
    // Let it get somewhere, then kill -9.
    s.wait_completed_nodes(&run, 40, 60).await;
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    let before = s.events(&run).await;
    let completed_before = before
        .iter()
        .filter(|e| e.r#type == "node.completed")
        .count();
    assert!(
        !before.iter().any(|e| e.r#type == "task.completed"),
        "killed too late; make the graph longer"
    );

    let mut p = spawn(&s.store_addr).await;
    let done = wait_state(&p, &run, TaskState::Completed, 120).await;
    assert!(done
        .nodes
        .iter()
        .all(|n| n.state == cairn_proto::v1::NodeState::Succeeded as i32));
    p.child.kill().unwrap();
    p.child.wait().unwrap();

    let events = s.events(&run).await;
    // One completion per node and per map item: nothing completed before the kill was redone.
    let mut completions: HashMap<String, usize> = HashMap::new();
    for e in events.iter().filter(|e| e.r#type == "node.completed") {
        *completions.entry(e.node_id.clone()).or_default() += 1;
    }
    assert_eq!(completions.len(), n_chain + 1 + n_items);
    assert!(
        completions.values().all(|&c| c == 1),
        "{:?}",
        completions
            .iter()
            .filter(|(_, &c)| c > 1)
            .collect::<Vec<_>>()
    );
    // One artifact.written per file.
    let mut written: HashMap<String, usize> = HashMap::new();
    for e in events.iter().filter(|e| e.r#type == "artifact.written") {
        *written
            .entry(data(e)["path"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(written.len(), n_chain + n_items);
    assert!(
        written.values().all(|&c| c == 1),
        "{:?}",
        written.iter().filter(|(_, &c)| c > 1).collect::<Vec<_>>()
    );
    for kind in ["task.created", "task.resumed", "task.completed"] {
        assert_eq!(
            events.iter().filter(|e| e.r#type == kind).count(),
            1,
            "{kind}"
        );
    }
    // Sequence numbers are gap-free and each event line appears once.
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1);
    }
    let resumed_at = events
        .iter()
        .position(|e| e.r#type == "task.resumed")
        .unwrap();
    assert!(
        resumed_at >= completed_before,
        "completions recorded before the kill stay before the resume"
    );
    // The files: exactly one per node/item, with the right content.
    let files = s.list(&format!("docs/{run}")).await;
    assert_eq!(files.len(), n_chain + n_items);
    assert_eq!(
        s.read_text(&format!("docs/{run}/c7.txt")).await,
        format!("after docs/{run}/c6.txt")
    );
    assert_eq!(
        s.read_text(&format!("docs/{run}/m149.txt")).await,
        "item 149"
    );
    s.stop().await;
}

/// Submits `a` (write_file) -> `g` (gate) -> `b` (write_file) and waits until it blocks.
async fn run_to_its_gate(p: &Proc) -> String {
    let graph = "nodes:\n  - {id: a, type: write_file, path: 'docs/{{run_id}}/a.txt', content: a}\n  - {id: g, type: gate, needs: [a]}\n  - {id: b, type: write_file, path: 'docs/{{run_id}}/b.txt', content: b, needs: [g]}\n";
    let run = submit(p, graph).await;
    wait_state(p, &run, TaskState::InputRequired, 30).await;
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_at_a_gate_keeps_it_blocked_until_approved() {
    // The in-process orchestrator of the stack must not resume this run too: one orchestrator
    // drives a run (see docs/run-directory.md, "Who drives a run").
    let s = Stack::start(Options {
        ingest: false,
        tweak: |c| c.resume_on_start = false,
        ..Default::default()
    })
    .await;
    let mut p = spawn(&s.store_addr).await;
    let run = run_to_its_gate(&p).await;
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    let mut p = spawn(&s.store_addr).await;
    let blocked = wait_state(&p, &run, TaskState::InputRequired, 30).await;
    assert_eq!(
        blocked.gates[0].state,
        cairn_proto::v1::GateState::Blocked as i32
    );
    p.client
        .clone()
        .approve_gate(approval(&run, "g", "ann"))
        .await
        .unwrap();
    wait_state(&p, &run, TaskState::Completed, 30).await;
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    let events = s.events(&run).await;
    assert_eq!(
        events
            .iter()
            .filter(|e| e.r#type == "node.completed" && e.node_id == "a")
            .count(),
        1
    );
    assert_eq!(
        events.iter().filter(|e| e.r#type == "gate.blocked").count(),
        1,
        "the gate did not block twice"
    );
    assert_eq!(s.read_text(&format!("docs/{run}/b.txt")).await, "b");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_fences_off_a_predecessor_that_is_still_alive() {
    // Orchestrator A drives a run to its gate and stays alive (a partition, a hung process
    // that a supervisor replaced). Orchestrator B takes the run over; from then on A can
    // record nothing in it.
    let s = Stack::start(Options {
        ingest: false,
        tweak: |c| c.resume_on_start = false,
        ..Default::default()
    })
    .await;
    let mut a = spawn(&s.store_addr).await;
    let run = run_to_its_gate(&a).await;

    let mut b = spawn(&s.store_addr).await;
    let decision = |by: &str| approval(&run, "g", by);
    b.client
        .clone()
        .approve_gate(decision("bea"))
        .await
        .unwrap();
    wait_state(&b, &run, TaskState::Completed, 30).await;

    // A still believes it drives the run: its note and its approval are refused, not
    // recorded.
    let note = a
        .client
        .clone()
        .add_note(cairn_proto::v1::AddNoteRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            by: "al".into(),
            text: "from the fenced-off orchestrator".into(),
        })
        .await;
    assert!(note.is_err(), "a fenced-off orchestrator's note: {note:?}");
    let approved = a.client.clone().approve_gate(decision("al")).await;
    assert!(
        approved.is_err(),
        "a fenced-off orchestrator's approval: {approved:?}"
    );

    // Nor does A's stopping driver overwrite B's records with its stale view.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for p in [&mut a, &mut b] {
        p.child.kill().unwrap();
        p.child.wait().unwrap();
    }
    let task: serde_json::Value =
        serde_saphyr::from_str(&s.read_text(&format!(".cairn/runs/{run}/task.yaml")).await)
            .unwrap();
    assert_eq!(task["state"], "completed", "{task:?}");
    let events = s.events(&run).await;
    let by_al: Vec<_> = events
        .iter()
        .filter(|e| data(e)["by"] == "al")
        .map(|e| e.r#type.clone())
        .collect();
    assert!(by_al.is_empty(), "A recorded after B's claim: {by_al:?}");
    for kind in ["gate.approved", "task.completed"] {
        assert_eq!(
            events.iter().filter(|e| e.r#type == kind).count(),
            1,
            "{kind} once"
        );
    }
    // Nor did the text of A's note reach human-notes.md (A's Puts carry its fence too).
    let notes = s
        .read_text(&format!(".cairn/runs/{run}/shared/human-notes.md"))
        .await;
    assert!(!notes.contains("fenced-off"), "{notes}");
    assert_eq!(s.read_text(&format!("docs/{run}/b.txt")).await, "b");
    s.stop().await;
}

/// A finished run taken back to life (a rework recorded) whose orchestrator died before its
/// snapshot caught up: state.json still says `completed`, the events say otherwise. The next
/// orchestrator finds it through the store's run index (runs whose log goes past their
/// snapshot) and finishes the rework.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_reworked_before_a_crash_is_resumed_by_its_events_not_its_snapshot() {
    let s = Stack::start(Options {
        ingest: false,
        tweak: |c| c.resume_on_start = false,
        ..Default::default()
    })
    .await;
    let graph = "title: once more\nnodes:\n  - {id: a, type: write_file, path: \"docs/{{run_id}}/a.txt\", content: \"a\"}\n";
    let run = s.submit(graph, &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::Completed, 30).await;
    // Another finished run that nobody touched: it stays as it is.
    let untouched = s.submit(graph, &[]).await.unwrap().run_id;
    s.wait_state(&untouched, TaskState::Completed, 30).await;
    let snapshot = || async {
        let text = s.read_text(&format!(".cairn/runs/{run}/state.json")).await;
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["state"].clone()
    };
    // What a rework records first, appended as a driver killed right after it would leave it.
    s.store
        .clone()
        .append_events(cairn_proto::v1::AppendEventsRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            events: vec![cairn_proto::v1::EventInput {
                r#type: "artifact.rework-requested".into(),
                node_id: "a".into(),
                data_json:
                    serde_json::json!({"target": "a", "by": "ann", "note": "", "nodes": ["a"]})
                        .to_string(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        snapshot().await,
        "completed",
        "the snapshot lags the events"
    );

    let mut p = spawn(&s.store_addr).await;
    let done = wait_state(&p, &run, TaskState::Completed, 60).await;
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    assert_eq!(
        done.nodes[0].state,
        cairn_proto::v1::NodeState::Succeeded as i32
    );
    let types: Vec<String> = s.events(&run).await.into_iter().map(|e| e.r#type).collect();
    let rework = types
        .iter()
        .position(|t| t == "artifact.rework-requested")
        .unwrap();
    assert!(
        types[rework..].iter().any(|t| t == "task.resumed")
            && types[rework..].iter().any(|t| t == "node.completed"),
        "the rework was not carried out: {types:?}"
    );
    assert_eq!(
        s.events(&untouched)
            .await
            .iter()
            .filter(|e| e.r#type == "task.resumed")
            .count(),
        0,
        "a finished run was resumed"
    );
}

/// kill -9 of the orchestrator while a sandbox step runs: the restarted one delivers the same
/// step again, under the same step key with one more redelivery (in the events and in the
/// program's environment); a step that finished is not delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_interrupted_by_a_crash_is_redelivered_under_the_same_key() {
    let Some(s) = Stack::with_sandbox(
        "a_step_interrupted_by_a_crash_is_redelivered_under_the_same_key",
        |c| c.resume_on_start = false,
    )
    .await
    else {
        return;
    };
    let runner = s.sandbox_addr.clone().unwrap();
    let graph = r#"
nodes:
  - id: first
    type: sandbox_run
    language: python
    allowed_prefixes: ["docs/"]
    output_prefix: "docs/{{run_id}}/first"
    code: |
      import os
      open("/output/step.txt", "w").write(os.environ["CAIRN_STEP_KEY"] + " " + os.environ["CAIRN_STEP_REDELIVERY"])
  - id: slow
    type: sandbox_run
    language: python
    needs: [first]
    timeout_s: 120
    allowed_prefixes: ["docs/"]
    output_prefix: "docs/{{run_id}}/slow"
    code: |
      import os, time
      key, n = os.environ["CAIRN_STEP_KEY"], os.environ["CAIRN_STEP_REDELIVERY"]
      if n == "0":
          time.sleep(600)
      open("/output/step.txt", "w").write(key + " " + n)
"#;
    let mut p = spawn_with(&s.store_addr, &["--sandbox-addr", &runner]).await;
    let run = submit(&p, graph).await;
    // The slow step is running: kill -9 the orchestrator.
    let deadline = Instant::now() + Duration::from_secs(90);
    while !s
        .events(&run)
        .await
        .iter()
        .any(|e| e.r#type == "sandbox_start" && e.node_id == "slow")
    {
        assert!(Instant::now() < deadline, "the slow step never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    let mut p = spawn_with(&s.store_addr, &["--sandbox-addr", &runner]).await;
    wait_state(&p, &run, TaskState::Completed, 120).await;
    p.child.kill().unwrap();
    p.child.wait().unwrap();

    let events = s.events(&run).await;
    let started = |node: &str| -> Vec<(String, u64, u64)> {
        events
            .iter()
            .filter(|e| e.r#type == "node.started" && e.node_id == node)
            .map(|e| {
                let d = data(e);
                (
                    d["step_key"].as_str().unwrap_or_default().to_owned(),
                    d["redelivery"].as_u64().unwrap(),
                    d["attempt"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    // Finished before the crash: one delivery, its own key.
    assert_eq!(started("first"), vec![(format!("{run}/first/1"), 0, 1)]);
    assert_eq!(
        s.read_text(&format!("docs/{run}/first/step.txt")).await,
        format!("{run}/first/1 0")
    );
    // Interrupted: the same key twice, the second a redelivery (a new attempt number).
    let slow = started("slow");
    assert_eq!(slow.len(), 2, "{slow:?}");
    assert_eq!(slow[0].0, format!("{run}/slow/1"));
    assert_eq!((slow[0].1, slow[1].1), (0, 1));
    assert_eq!(slow[1].0, slow[0].0, "the redelivery keeps the key");
    assert_eq!(
        s.read_text(&format!("docs/{run}/slow/step.txt")).await,
        format!("{run}/slow/1 1"),
        "the program saw the key and its redelivery"
    );
    let complete = events
        .iter()
        .find(|e| e.r#type == "sandbox_complete" && e.node_id == "slow")
        .unwrap();
    assert_eq!(data(complete)["step_key"], format!("{run}/slow/1"));
    assert_eq!(data(complete)["redelivery"], 1);
    s.stop().await;
}
