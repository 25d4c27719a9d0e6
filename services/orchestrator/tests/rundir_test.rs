//! The run directory: its layout, task.yaml that always parses and matches the
//! events it claims to reflect, and many runs at once each in their own directory.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use cairn_proto::v1::{Event, GateDecisionRequest, TaskState};
use common::*;
use serde_json::Value;

/// An independent fold of events into (task state, milestone state by node).
fn fold(events: &[Event], upto: u64) -> (String, HashMap<String, String>) {
    let mut task = String::new();
    let mut nodes: HashMap<String, String> = HashMap::new();
    for e in events.iter().filter(|e| e.seq <= upto) {
        let d = data(e);
        let set = |nodes: &mut HashMap<String, String>, s: &str| {
            if !e.node_id.contains('.') {
                nodes.insert(e.node_id.clone(), s.to_owned());
            }
        };
        match e.r#type.as_str() {
            "task.created" => task = "created".into(),
            "task.working" | "task.resumed" | "artifact.rework-requested" => {
                task = "working".into()
            }
            "task.input-required" => task = "input-required".into(),
            "task.completed" => task = "completed".into(),
            "task.failed" => task = "failed".into(),
            "task.canceled" => task = "canceled".into(),
            "node.started" => set(&mut nodes, "working"),
            "node.completed" => set(&mut nodes, "done"),
            "node.skipped" => set(&mut nodes, "skipped"),
            "node.canceled" => set(&mut nodes, "canceled"),
            "node.failed" => set(
                &mut nodes,
                if d["will_retry"] == true {
                    "pending"
                } else {
                    "failed"
                },
            ),
            "gate.blocked" => set(&mut nodes, "blocked"),
            _ => {}
        }
    }
    (task, nodes)
}

/// Checks one task.yaml against the events up to its events_seq.
fn check_snapshot(yaml: &str, events: &[Event]) -> u64 {
    let task: Value = serde_saphyr::from_str(yaml)
        .unwrap_or_else(|e| panic!("task.yaml does not parse: {e}\n{yaml}"));
    let seq = task["events_seq"].as_u64().unwrap();
    let (state, nodes) = fold(events, seq);
    assert_eq!(
        task["state"],
        state.as_str(),
        "task.yaml at seq {seq}:\n{yaml}"
    );
    for m in task["milestones"].as_array().unwrap() {
        let id = m["id"].as_str().unwrap();
        let expected = nodes.get(id).map(String::as_str).unwrap_or("pending");
        assert_eq!(m["state"], expected, "milestone {id} at seq {seq}:\n{yaml}");
    }
    seq
}

const GRAPH: &str = r#"
title: Layout check
goal: Show the run directory.
nodes:
  - id: fan
    type: map
    over: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]
    parallelism: 3
    node: {type: write_file, path: "docs/{{run_id}}/n{{item}}.txt", content: "{{item}}"}
  - {id: check, type: condition, if: "nodes.fan.count == 30", then: [ok], else: [bad]}
  - {id: ok, type: write_file, path: "docs/{{run_id}}/ok.txt", content: ok}
  - {id: bad, type: write_file, path: "docs/{{run_id}}/bad.txt", content: bad}
  - {id: approve, type: gate, reason: "look at it", needs: [ok]}
  - {id: final, type: write_file, path: "docs/{{run_id}}/final.md", content: "done\n"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_yaml_always_parses_and_matches_the_events() {
    let s = Stack::start(Options {
        tweak: |c| c.snapshot_interval_ms = 20,
        ..Default::default()
    })
    .await;
    let run = s.submit(GRAPH, &[]).await.unwrap().run_id;
    let dir = format!(".cairn/runs/{run}");
    let mut seen = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let yaml = s.read_text(&format!("{dir}/task.yaml")).await;
        let events = s.events(&run).await;
        seen.insert(check_snapshot(&yaml, &events));
        let task: Value = serde_saphyr::from_str(&yaml).unwrap();
        if task["state"] == "input-required" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never blocked at the gate"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        seen.len() >= 2,
        "snapshots were written as the run moved: {seen:?}"
    );
    s.client
        .clone()
        .approve_gate(GateDecisionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            gate_id: "approve".into(),
            by: "ann".into(),
            note: String::new(),
        })
        .await
        .unwrap();
    s.wait_state(&run, TaskState::Completed, 30).await;
    // The final snapshot is written after the final event.
    let mut yaml = String::new();
    for _ in 0..100 {
        yaml = s.read_text(&format!("{dir}/task.yaml")).await;
        if yaml.contains("state: completed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let events = s.events(&run).await;
    let seq = check_snapshot(&yaml, &events);
    assert_eq!(
        seq,
        events.last().unwrap().seq,
        "the final task.yaml reflects every event"
    );
    let task: Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(task["id"], run.as_str());
    assert_eq!(task["title"], "Layout check");
    assert_eq!(task["topology"], "dag");
    assert_eq!(task["gates"][0]["type"], "human-approval");
    assert_eq!(task["gates"][0]["state"], "approved");
    assert_eq!(
        task["gates"][0]["instructionsRef"],
        "./shared/human-notes.md"
    );
    let fan = task["milestones"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "fan")
        .unwrap();
    assert_eq!(fan["progress"], "30/30");
    let bad = task["milestones"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "bad")
        .unwrap();
    assert_eq!(bad["state"], "skipped");

    // Layout.
    for f in [
        "README.md",
        "task.yaml",
        "events.jsonl",
        "state.json",
        "graph.resolved.json",
        "shared/human-notes.md",
        "shared/context-manifest.yaml",
        "shared/evidence/index.json",
        "shared/contracts/README.md",
        "shared/decisions/README.md",
        "shared/reports/README.md",
    ] {
        assert!(s.read(&format!("{dir}/{f}")).await.is_some(), "{f} missing");
    }
    let readme = s.read_text(&format!("{dir}/README.md")).await;
    assert!(
        readme.starts_with("---\ntitle: \"Layout check\"\n"),
        "{readme}"
    );
    assert!(
        readme.contains(&format!("task_id: \"{run}\""))
            && readme.contains("Show the run directory.")
            && readme.contains("`completed`")
    );
    assert!(
        readme.contains("[task.yaml](task.yaml)") && readme.contains("| fan | map | done |"),
        "{readme}"
    );
    let state: Value =
        serde_json::from_slice(&s.read(&format!("{dir}/state.json")).await.unwrap()).unwrap();
    assert_eq!(state["state"], "completed");
    assert_eq!(
        state["nodes"][0]["items"]["records"]
            .as_array()
            .unwrap()
            .len(),
        30
    );
    let notes = s.read_text(&format!("{dir}/shared/human-notes.md")).await;
    assert!(notes.starts_with("---\ntitle: \"Human notes\"\n"));
    let evidence: Value = serde_json::from_slice(
        &s.read(&format!("{dir}/shared/evidence/index.json"))
            .await
            .unwrap(),
    )
    .unwrap();
    // The evidence index names each file the run wrote by the event that recorded it.
    let written: Vec<String> = s
        .events(&run)
        .await
        .iter()
        .filter(|e| e.r#type == "artifact.written")
        .map(|e| format!("E{}", e.seq))
        .collect();
    let files: Vec<String> = evidence
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "file")
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(!written.is_empty());
    assert_eq!(files, written);
    // Every line of events.jsonl has ts, seq, type, run_id.
    let raw = s.read_text(&format!("{dir}/events.jsonl")).await;
    for line in raw.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert!(
            v["ts"].is_string()
                && v["seq"].is_u64()
                && v["type"].is_string()
                && v["run_id"] == run.as_str(),
            "{line}"
        );
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_runs_in_parallel_each_in_their_own_directory() {
    let s = Stack::start(Options::default()).await;
    let graph = r#"
nodes:
  - {id: a, type: write_file, path: "docs/{{run_id}}/a.txt", content: "{{run_id}} {{vars.n}}"}
  - id: fan
    type: map
    over: [x, y, z, w]
    parallelism: 2
    node: {type: write_file, path: "docs/{{run_id}}/{{item}}.txt", content: "{{item}} of {{vars.n}}"}
  - {id: b, type: write_file, path: "docs/{{run_id}}/b.txt", content: "{{nodes.a.path}} {{nodes.fan.count}}", needs: [fan]}
"#;
    let submits = (0..20).map(|i| {
        let s = &s;
        async move {
            let n = i.to_string();
            s.submit(graph, &[("n", n.as_str())]).await.unwrap().run_id
        }
    });
    let runs: Vec<String> = futures::future::join_all(submits).await;
    let unique: std::collections::HashSet<_> = runs.iter().collect();
    assert_eq!(unique.len(), 20);
    for (i, run) in runs.iter().enumerate() {
        s.wait_state(run, TaskState::Completed, 60).await;
        assert_eq!(
            s.read_text(&format!("docs/{run}/a.txt")).await,
            format!("{run} {i}")
        );
        assert_eq!(
            s.read_text(&format!("docs/{run}/z.txt")).await,
            format!("z of {i}")
        );
        assert_eq!(
            s.read_text(&format!("docs/{run}/b.txt")).await,
            format!("docs/{run}/a.txt 4")
        );
        let events = s.events(run).await;
        assert!(events.iter().all(|e| e.run_id == *run));
        assert_eq!(
            events.iter().filter(|e| e.r#type == "task.created").count(),
            1
        );
        assert_eq!(
            events
                .iter()
                .filter(|e| e.r#type == "node.completed")
                .count(),
            3 + 4
        );
        let files = s.list(&format!("docs/{run}")).await;
        assert_eq!(files.len(), 6, "{files:?}");
        let task: Value =
            serde_saphyr::from_str(&s.read_text(&format!(".cairn/runs/{run}/task.yaml")).await)
                .unwrap();
        assert_eq!(task["id"], run.as_str());
    }
    let listed = s
        .client
        .clone()
        .list_runs(cairn_proto::v1::ListRunsRequest {
            project_id: PROJECT.into(),
            states: vec![TaskState::Completed as i32],
            page: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.runs.len(), 20);
    s.stop().await;
}
