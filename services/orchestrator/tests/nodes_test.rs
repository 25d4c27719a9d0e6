//! Every node type over real gRPC (store, ingest, orchestrator in-process); sandbox_run and
//! gates have their own files.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::{NodeState, SubmitRunRequest, TaskState};
use common::*;
use serde_json::Value;

fn node<'a>(info: &'a cairn_proto::v1::RunInfo, id: &str) -> &'a cairn_proto::v1::NodeInfo {
    info.nodes
        .iter()
        .find(|n| n.id == id)
        .unwrap_or_else(|| panic!("no node {id}"))
}

fn outputs(info: &cairn_proto::v1::RunInfo, id: &str) -> Value {
    serde_json::from_str(&node(info, id).outputs_json).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_file_tool_call_ingest_and_deliver() {
    let s = Stack::start(Options::default()).await;
    let graph = r##"
title: tools
vars: {who: world}
nodes:
  - id: greet
    type: write_file
    path: "docs/{{run_id}}/greet.txt"
    content: "hello {{vars.who}}"
  - id: data
    type: write_file
    path: docs/data.json
    content: '{"items": ["a", "b"], "n": 2}'
  - id: read
    type: tool_call
    tool: read_file
    args: {path: "{{nodes.greet.path}}"}
  - id: listing
    type: tool_call
    tool: list_files
    args: {prefix: "docs/{{run_id}}"}
    needs: [greet]
  - id: pick
    type: tool_call
    tool: json_get
    args: {path: "{{nodes.data.path}}", pointer: /items/1}
  - id: missing
    type: tool_call
    tool: stat
    args: {path: docs/nope.txt}
  - id: echo
    type: tool_call
    tool: echo
    args: {value: "{{nodes.read.text}} / {{nodes.pick.value}}"}
  - id: doc
    type: write_file
    path: docs/design.md
    content: "# Design\n\n```python file=pkg/mod.py\nX = 1\n```\n"
    ingest: false
  - id: explicit
    type: ingest
    doc_path: "{{nodes.doc.path}}"
  - id: ship
    type: deliver
    target: {type: local_dir, path: "docs/delivered/{{run_id}}"}
    files: ["{{nodes.greet.path}}", docs/data.json]
    needs: [data]
"##;
    let info = s.submit(graph, &[("who", "cairn")]).await.unwrap();
    let run = info.run_id.clone();
    let done = s.wait_state(&run, TaskState::Completed, 30).await;
    assert_eq!(
        s.read_text(&format!("docs/{run}/greet.txt")).await,
        "hello cairn"
    );
    assert_eq!(outputs(&done, "read")["text"], "hello cairn");
    assert_eq!(
        outputs(&done, "listing")["paths"],
        serde_json::json!([format!("docs/{run}/greet.txt")])
    );
    assert_eq!(outputs(&done, "pick")["value"], "b");
    assert_eq!(outputs(&done, "missing")["exists"], false);
    assert_eq!(outputs(&done, "echo")["value"], "hello cairn / b");
    // The explicit ingest node wrote the fenced block (the hook was off for `doc`).
    assert_eq!(s.read_text("workspace/pkg/mod.py").await, "X = 1\n");
    assert_eq!(outputs(&done, "explicit")["written"], 1);
    assert!(outputs(&done, "doc").get("workspace_files").is_none());
    assert_eq!(
        s.read_text(&format!("docs/delivered/{run}/greet.txt"))
            .await,
        "hello cairn"
    );
    assert_eq!(
        s.read_text(&format!("docs/delivered/{run}/data.json"))
            .await,
        r#"{"items": ["a", "b"], "n": 2}"#
    );
    assert_eq!(
        outputs(&done, "ship")["delivered"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let events = s.events(&run).await;
    let written: Vec<_> = events
        .iter()
        .filter(|e| e.r#type == "artifact.written")
        .map(|e| data(e)["path"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        written.contains(&format!("docs/{run}/greet.txt"))
            && written.contains(&"docs/design.md".to_owned()),
        "{written:?}"
    );
    assert!(events.iter().any(|e| e.r#type == "deliver.completed"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn condition_branches_are_skipped_and_recorded() {
    let s = Stack::start(Options::default()).await;
    let graph = r#"
nodes:
  - {id: check, type: condition, if: "vars.mode == 'fast'", then: [fast], else: [slow]}
  - {id: fast, type: write_file, path: "docs/{{run_id}}/fast.txt", content: fast}
  - {id: slow, type: write_file, path: "docs/{{run_id}}/slow.txt", content: slow}
  - {id: after_slow, type: write_file, path: "docs/{{run_id}}/after_slow.txt", content: x, needs: [slow]}
  - {id: join, type: write_file, path: "docs/{{run_id}}/join.txt", content: joined, needs: [fast, slow], trigger: none_failed}
  - {id: never, type: write_file, path: "docs/{{run_id}}/never.txt", content: x, when: "nodes.check.value == false"}
"#;
    for (mode, taken, skipped) in [("fast", "fast", "slow"), ("slow", "slow", "fast")] {
        let run = s.submit(graph, &[("mode", mode)]).await.unwrap().run_id;
        let done = s.wait_state(&run, TaskState::Completed, 20).await;
        assert_eq!(node(&done, taken).state, NodeState::Succeeded as i32);
        assert_eq!(node(&done, skipped).state, NodeState::Skipped as i32);
        assert_eq!(
            node(&done, "join").state,
            NodeState::Succeeded as i32,
            "none_failed joins after a branch"
        );
        assert_eq!(
            outputs(&done, "check")["branch"],
            if mode == "fast" { "then" } else { "else" }
        );
        assert!(s.read(&format!("docs/{run}/{taken}.txt")).await.is_some());
        assert!(s.read(&format!("docs/{run}/{skipped}.txt")).await.is_none());
        let events = s.events(&run).await;
        let skip = events
            .iter()
            .find(|e| e.r#type == "node.skipped" && e.node_id == skipped)
            .expect("skip recorded");
        assert!(
            data(skip)["reason"]
                .as_str()
                .unwrap()
                .contains("condition `check`"),
            "{:?}",
            data(skip)
        );
        let after = node(&done, "after_slow").state;
        if mode == "fast" {
            assert_eq!(
                after,
                NodeState::Skipped as i32,
                "a skipped need skips by default"
            );
            let e = events
                .iter()
                .find(|e| e.r#type == "node.skipped" && e.node_id == "after_slow")
                .unwrap();
            assert!(data(e)["reason"].as_str().unwrap().contains("slow"));
        } else {
            assert_eq!(after, NodeState::Succeeded as i32);
        }
        let never = node(&done, "never").state;
        assert_eq!(never == NodeState::Skipped as i32, mode == "fast");
    }
    s.stop().await;
}

/// Largest number of items started and not yet finished, from the event order.
fn max_in_flight(events: &[cairn_proto::v1::Event], map: &str) -> usize {
    let prefix = format!("{map}.");
    let mut now = 0usize;
    let mut max = 0;
    for e in events.iter().filter(|e| e.node_id.starts_with(&prefix)) {
        match e.r#type.as_str() {
            "node.started" => {
                now += 1;
                max = max.max(now);
            }
            "node.completed" | "node.failed" | "node.skipped" | "node.canceled" => {
                now = now.saturating_sub(1)
            }
            _ => {}
        }
    }
    max
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_with_parallelism_one_and_n() {
    let s = Stack::start(Options::default()).await;
    for parallelism in [1usize, 3] {
        let graph = format!(
            r#"
nodes:
  - id: fan
    type: map
    over: [alpha, beta, gamma, delta, epsilon, zeta, eta]
    parallelism: {parallelism}
    node:
      type: write_file
      path: "docs/{{{{run_id}}}}/item-{{{{index}}}}.txt"
      content: "{{{{item}}}}"
  - {{id: total, type: write_file, path: "docs/{{{{run_id}}}}/total.txt", content: "{{{{nodes.fan.count}}}} items"}}
"#
        );
        let run = s.submit(&graph, &[]).await.unwrap().run_id;
        let done = s.wait_state(&run, TaskState::Completed, 30).await;
        let names = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"];
        for (i, n) in names.iter().enumerate() {
            assert_eq!(s.read_text(&format!("docs/{run}/item-{i}.txt")).await, *n);
        }
        assert_eq!(
            s.read_text(&format!("docs/{run}/total.txt")).await,
            "7 items"
        );
        let out = outputs(&done, "fan");
        assert_eq!(out["count"], 7);
        assert_eq!(out["succeeded"], 7);
        assert_eq!(out["items"][2]["path"], format!("docs/{run}/item-2.txt"));
        let events = s.events(&run).await;
        assert_eq!(
            max_in_flight(&events, "fan"),
            parallelism,
            "parallelism {parallelism}"
        );
        let completed = events
            .iter()
            .filter(|e| e.r#type == "node.completed" && e.node_id.starts_with("fan."))
            .count();
        assert_eq!(completed, 7);
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_over_a_json_file_and_a_template() {
    let s = Stack::start(Options::default()).await;
    let graph = r#"
nodes:
  - {id: list, type: write_file, path: "docs/{{run_id}}/list.json", content: '{"people": [{"name": "ann"}, {"name": "bo"}]}'}
  - id: byfile
    type: map
    over: {file: "{{nodes.list.path}}", pointer: /people}
    node: {type: write_file, path: "docs/{{run_id}}/p-{{item.name}}.txt", content: "hi {{item.name}}"}
  - {id: files, type: tool_call, tool: list_files, args: {prefix: "docs/{{run_id}}"}, needs: [byfile]}
  - id: bytemplate
    type: map
    over: "{{nodes.files.paths}}"
    parallelism: 2
    node: {type: tool_call, tool: stat, args: {path: "{{item}}"}}
"#;
    let run = s.submit(graph, &[]).await.unwrap().run_id;
    let done = s.wait_state(&run, TaskState::Completed, 30).await;
    assert_eq!(s.read_text(&format!("docs/{run}/p-bo.txt")).await, "hi bo");
    let out = outputs(&done, "bytemplate");
    assert_eq!(out["count"], 3);
    assert!(out["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["exists"] == true));
    // Items that did not come from the graph are recorded, so a resume maps the same list.
    let events = s.events(&run).await;
    let items = events
        .iter()
        .find(|e| e.r#type == "map.items" && e.node_id == "byfile")
        .unwrap();
    assert_eq!(data(items)["items"][1]["name"], "bo");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_task_replays_and_records_the_agent() {
    let s = Stack::start(Options::default()).await;
    let llm = cassette(
        s.dir.path(),
        "c.yaml",
        "answers:\n  - node: writer\n    content: |\n      # Plan\n\n      Step one.\n  - node: critic\n    content: looks fine\n",
    );
    let graph = r#"
title: agents
nodes:
  - {id: writer, type: agent_task, prompt: "Write a plan for {{vars.topic}}", path: "docs/{{run_id}}/plan.md", tags: [plan]}
  - {id: critic, type: agent_task, agent: reviewer, prompt: "Review: {{nodes.writer.text}}"}
"#;
    let req = SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: graph.into(),
        vars: [("topic".to_owned(), "tea".to_owned())].into(),
        llm: llm.clone(),
        ..Default::default()
    };
    let run = s.submit_req(req).await.unwrap().run_id;
    let done = s.wait_state(&run, TaskState::Completed, 30).await;
    let plan = s.read_text(&format!("docs/{run}/plan.md")).await;
    assert!(plan.starts_with("---\ntitle: \"writer\"\n"), "{plan}");
    assert!(
        plan.contains(&format!("task_id: \"{run}\""))
            && plan.contains("agent_instance: \"writer\"")
            && plan.contains("tags: [\"plan\"]")
    );
    assert!(plan.ends_with("# Plan\n\nStep one.\n"));
    // The critic's default path and the text reference to the writer's document.
    let review = s.read_text(&format!("docs/{run}/critic.md")).await;
    assert!(review.ends_with("looks fine"));
    let requests = s
        .read_text(&format!(
            ".cairn/runs/{run}/agents/critic/runtime/requests.jsonl"
        ))
        .await;
    assert!(
        requests.contains("Review: ---") && requests.contains("Step one."),
        "{requests}"
    );
    let session: Value = serde_json::from_slice(
        &s.read(&format!(".cairn/runs/{run}/agents/writer/session.json"))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(session["state"], "dormant");
    assert!(s
        .read(&format!(".cairn/runs/{run}/agents/writer/README.md"))
        .await
        .is_some());
    assert!(s
        .read(&format!(
            ".cairn/runs/{run}/agents/writer/artifacts/turn-1.md"
        ))
        .await
        .is_some());
    assert!(s
        .read(&format!(
            ".cairn/runs/{run}/agents/writer/runtime/events.jsonl"
        ))
        .await
        .is_some());
    assert_eq!(outputs(&done, "writer")["turn"], 1);
    let yaml = s
        .wait_text(
            &format!(".cairn/runs/{run}/task.yaml"),
            "state: completed",
            10,
        )
        .await;
    let task: Value = serde_saphyr::from_str(&yaml).unwrap();
    let roster = task["roster"].as_array().unwrap();
    assert!(
        roster.iter().any(|r| r["instance"] == "critic"
            && r["agent"] == "reviewer"
            && r["state"] == "dormant"),
        "{roster:?}"
    );

    // A missing cassette answer is a clear failure naming node and turn.
    let req = SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: "nodes:\n  - {id: ghost, type: agent_task, prompt: hi}\n".into(),
        llm,
        ..Default::default()
    };
    let run = s.submit_req(req).await.unwrap().run_id;
    let failed = s.wait_state(&run, TaskState::Failed, 20).await;
    assert!(
        failed.error.contains("no answer for node `ghost` turn 1"),
        "{}",
        failed.error
    );
    assert_eq!(
        node(&failed, "ghost").attempts,
        1,
        "a refused request is not retried"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_follow_the_policy_then_fail_the_run() {
    let s = Stack::start(Options::default()).await;
    let graph = r#"
nodes:
  - id: flaky
    type: tool_call
    tool: read_file
    args: {path: docs/not-there.txt}
    retry: {max_attempts: 3, initial_backoff_ms: 10, retry_on: [refused]}
  - {id: after, type: write_file, path: docs/after.txt, content: x, needs: [flaky]}
"#;
    let run = s.submit(graph, &[]).await.unwrap().run_id;
    let failed = s.wait_state(&run, TaskState::Failed, 20).await;
    assert_eq!(node(&failed, "flaky").attempts, 3);
    assert_eq!(node(&failed, "flaky").state, NodeState::Failed as i32);
    assert_eq!(node(&failed, "after").state, NodeState::Pending as i32);
    assert!(
        failed.error.contains("docs/not-there.txt does not exist"),
        "{}",
        failed.error
    );
    let events = s.events(&run).await;
    let fails: Vec<Value> = events
        .iter()
        .filter(|e| e.r#type == "node.failed")
        .map(data)
        .collect();
    assert_eq!(fails.len(), 3);
    assert_eq!(
        fails
            .iter()
            .map(|d| d["will_retry"] == true)
            .collect::<Vec<_>>(),
        vec![true, true, false]
    );
    assert!(fails[0]["retry_in_ms"].as_u64().unwrap() <= 12);
    assert!(s.read("docs/after.txt").await.is_none());
    // Without retry_on: refused, the default policy does not retry a refusal.
    let run = s
        .submit(
            "nodes:\n  - {id: once, type: tool_call, tool: read_file, args: {path: docs/none}}\n",
            &[],
        )
        .await
        .unwrap()
        .run_id;
    let failed = s.wait_state(&run, TaskState::Failed, 20).await;
    assert_eq!(node(&failed, "once").attempts, 1);
    // A failed run is an error-level event.
    let ended = s.events(&run).await;
    let ended = ended.iter().find(|e| e.r#type == "task.failed").unwrap();
    assert_eq!(ended.level, cairn_proto::v1::Level::Error as i32);
    s.stop().await;
}
