//! Phase contracts and auto tasks over real gRPC: the fail-safe placeholder and its
//! replacement, the assemble rules (missing results, statuses, schema violations, `-`/`_`
//! keys), the counters document under concurrent conflicting updates, and the plan's
//! round-robin across runs, limits, idle, the daily reset and concurrent runs.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use cairn_phases::counters::{self, Counters};
use cairn_proto::v1::{MergePolicy, RunInfo, TaskState};
use cairn_store_client::Store;
use common::*;
use serde_json::{json, Value};

fn outputs(info: &RunInfo, id: &str) -> Value {
    let n = info
        .nodes
        .iter()
        .find(|n| n.id == id)
        .unwrap_or_else(|| panic!("no node {id}"));
    serde_json::from_str(&n.outputs_json).unwrap_or(Value::Null)
}

fn quick() -> Options {
    Options {
        ingest: false,
        ..Default::default()
    }
}

async fn completed(s: &Stack, yaml: &str, vars: &[(&str, &str)]) -> RunInfo {
    let run = s.submit(yaml, vars).await.unwrap().run_id;
    let info = s.wait_final(&run, 60).await;
    assert_eq!(
        info.state,
        TaskState::Completed as i32,
        "{info:#?}\n{:#?}",
        s.event_types(&run).await
    );
    info
}

async fn json_file(s: &Stack, path: &str) -> Value {
    serde_json::from_str(&s.read_text(path).await).unwrap()
}

fn result_path(run: &str, name: &str) -> String {
    format!(".cairn/runs/{run}/results/{name}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholder_first_then_the_result_replaces_it() {
    let s = Stack::start(quick()).await;
    let graph = r##"
contracts:
  - files: good.json
    schema: {type: object, required: [status, summary]}
nodes:
  - id: probe
    type: tool_call
    tool: read_file
    args: {path: ".cairn/runs/{{run_id}}/results/probe.json"}
    result: probe.json
  - id: good
    type: write_file
    path: "docs/{{run_id}}/good.json"
    content: '{"agent": "good", "status": "success", "summary": "did it"}'
    result: good.json
  - id: fenced
    type: write_file
    path: "docs/{{run_id}}/fenced.md"
    ingest: false
    result: fenced.json
    content: |
      # Report

      ```json
      {"status": "partial", "summary": "half", "error": "one source was down"}
      ```
  - id: prose
    type: write_file
    path: "docs/{{run_id}}/prose.md"
    ingest: false
    result: prose.json
    content: "# Done\n\nNo JSON in here.\n"
  - id: after
    type: write_file
    path: "docs/{{run_id}}/after.txt"
    content: "good={{nodes.good.result_status}} fenced={{nodes.fenced.result_status}} prose={{nodes.prose.result_status}}"
"##;
    let info = completed(&s, graph, &[]).await;
    let run = &info.run_id;
    // The placeholder existed while `probe` ran: it read it.
    let probe = outputs(&info, "probe");
    assert!(
        probe["text"]
            .as_str()
            .unwrap()
            .contains("\"placeholder\": true"),
        "{probe}"
    );
    // Replaced by the node's document.
    let good = json_file(&s, &result_path(run, "good.json")).await;
    assert_eq!(
        good,
        json!({"agent": "good", "status": "success", "summary": "did it"})
    );
    let fenced = json_file(&s, &result_path(run, "fenced.json")).await;
    assert_eq!(fenced["status"], "partial");
    assert_eq!(fenced["error"], "one source was down");
    // No result: the placeholder stays, with the reason.
    let prose = json_file(&s, &result_path(run, "prose.json")).await;
    assert_eq!(prose["status"], "failed");
    assert_eq!(prose["placeholder"], true);
    let why = prose["error"].as_str().unwrap();
    assert!(
        why.contains("node `prose` finished without a result") && why.contains("```json"),
        "{why}"
    );
    assert_eq!(
        s.read_text(&format!("docs/{run}/after.txt")).await,
        "good=success fenced=partial prose=failed"
    );
    // Order: placeholder, then the node's completion with result.written.
    let ev = s.event_types(run).await;
    let at = |t: &str| {
        ev.iter()
            .position(|e| e == t)
            .unwrap_or_else(|| panic!("{t}: {ev:#?}"))
    };
    assert!(at("result.placeholder good") < at("result.written good"));
    assert!(at("result.written good") < at("node.completed good"));
    assert!(at("result.placeholder prose") < at("result.missing prose"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_node_leaves_a_failed_placeholder_with_its_error() {
    let s = Stack::start(quick()).await;
    let graph = r##"
nodes:
  - id: boom
    type: tool_call
    tool: read_file
    args: {path: "docs/not-there.txt"}
    result: boom.json
"##;
    let run = s.submit(graph, &[]).await.unwrap().run_id;
    let info = s.wait_final(&run, 60).await;
    assert_eq!(info.state, TaskState::Failed as i32);
    let doc = json_file(&s, &result_path(&run, "boom.json")).await;
    assert_eq!(doc["status"], "failed");
    let why = doc["error"].as_str().unwrap();
    assert!(
        why.contains("node `boom` failed") && why.contains("does not exist"),
        "{why}"
    );
    s.stop().await;
}

const ASSEMBLE_RULES: &str = r##"
contracts:
  - files: "todoist-auto-*.json"
    schema:
      type: object
      required: [status, summary]
      properties:
        status: {enum: [success, partial, failed, no_changes]}
nodes:
  - id: plan
    type: write_file
    path: "docs/{{run_id}}/plan.json"
    result: todoist-plan.json
    content: '{"agent": "todoist-query", "status": "success", "plan_type": "auto", "date": "2026-02-28", "counters": "context/rules.json", "tasks": [], "auto_tasks": {"selected_tasks": [{"key": "tech-research", "limit": 3}, {"key": "log_audit", "limit": 2}, {"key": "gone"}, {"key": "bad-schema"}, {"key": "half"}, {"key": "silent"}]}}'
  - id: tech
    type: write_file
    path: "docs/{{run_id}}/tech.json"
    content: '{"status": "success", "summary": "researched"}'
    result: todoist-auto-tech-research.json
  - id: log
    type: write_file
    path: "docs/{{run_id}}/log.json"
    content: '{"status": "no_changes", "summary": "nothing new"}'
    result: todoist-auto-log-audit.json
  - id: bad
    type: write_file
    path: "docs/{{run_id}}/bad.json"
    content: '{"status": "done"}'
    result: todoist-auto-bad_schema.json
  - id: half
    type: write_file
    path: "docs/{{run_id}}/half.json"
    content: '{"status": "partial", "summary": "2 of 3", "error": "one source down"}'
    result: todoist-auto-half.json
  - id: silent
    type: write_file
    path: "docs/{{run_id}}/silent.md"
    ingest: false
    content: "I finished, but wrote no JSON."
    result: todoist-auto-silent.json
  - id: assemble
    type: assemble
    needs: [plan, tech, log, bad, half, silent]
    plan: todoist-plan.json
    report: "docs/{{run_id}}/phase3.md"
"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assemble_reads_results_by_the_seed_rules() {
    let s = Stack::start(quick()).await;
    let info = completed(&s, ASSEMBLE_RULES, &[]).await;
    let run = &info.run_id;
    let out = outputs(&info, "assemble");
    let results = out["results"].as_array().unwrap();
    let by_key = |k: &str| {
        results
            .iter()
            .find(|r| r["key"] == k)
            .unwrap_or_else(|| panic!("no {k} in {results:#?}"))
    };
    // Hyphenated plan key and file name, compared in underscore form.
    let tech = by_key("tech_research");
    assert_eq!(tech["status"], "success");
    assert_eq!(tech["file"], "todoist-auto-tech_research.json");
    assert_eq!(tech["found"], "todoist-auto-tech-research.json");
    assert_eq!(tech["action"], "count");
    let log = by_key("log_audit");
    assert_eq!(
        (log["status"].as_str(), log["action"].as_str()),
        (Some("no_changes"), Some("count"))
    );
    // Missing result = failed (§6.1).
    let gone = by_key("gone");
    assert_eq!(gone["status"], "failed");
    assert!(
        gone["reason"].as_str().unwrap().starts_with("missing"),
        "{gone}"
    );
    // Schema violation = failed with the reason.
    let bad = by_key("bad_schema");
    assert_eq!(bad["status"], "failed");
    let why = bad["reason"].as_str().unwrap();
    assert!(
        why.starts_with("schema violation") && why.contains("summary") && why.contains("/status"),
        "{why}"
    );
    let half = by_key("half");
    assert_eq!(
        (
            half["status"].as_str(),
            half["reason"].as_str(),
            half["action"].as_str()
        ),
        (Some("partial"), Some("one source down"), Some("none"))
    );
    // The node that wrote no result: its placeholder reads as failed, with why.
    let silent = by_key("silent");
    assert_eq!(silent["status"], "failed");
    assert!(
        silent["reason"]
            .as_str()
            .unwrap()
            .contains("finished without a result"),
        "{silent}"
    );
    assert_eq!(out["status"], "partial");
    assert_eq!(out["plan_type"], "auto");
    assert_eq!(
        (
            out["succeeded"].as_u64(),
            out["failed"].as_u64(),
            out["partial"].as_u64()
        ),
        (Some(2), Some(3), Some(1))
    );
    // Only success / no_changes are counted, in the plan's counters document and day.
    let c = s.read_text("context/rules.json").await;
    let c = Counters::parse("c", Some(c.as_bytes())).unwrap();
    assert_eq!(c.used("2026-02-28", "tech_research"), 1);
    assert_eq!(c.used("2026-02-28", "log_audit"), 1);
    for k in ["gone", "bad_schema", "half", "silent"] {
        assert_eq!(c.used("2026-02-28", k), 0, "{k}");
    }
    let report = s.read_text(&format!("docs/{run}/phase3.md")).await;
    assert!(report.starts_with("---\n"), "{report}");
    assert!(
        report.contains("Overall: **partial**")
            && report.contains("| `todoist-auto-gone.json` | failed | none | missing")
            && report.contains("`tech_research` 1/3"),
        "{report}"
    );
    let ev = s.event_types(run).await;
    assert!(ev.contains(&"result.invalid bad".to_owned()), "{ev:#?}");
    assert!(ev.contains(&"result.missing silent".to_owned()), "{ev:#?}");
    assert!(
        ev.contains(&"counters.updated assemble".to_owned()),
        "{ev:#?}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_plans_expect_a_result_per_rank_and_a_missing_plan_ends_the_phase() {
    let s = Stack::start(quick()).await;
    let graph = r##"
nodes:
  - id: plan
    type: plan
    limits: {tasks: [{key: never, daily_limit: 1, prompt: x}]}
    tasks: '[{"task_id": "t1", "content": "first"}, {"task_id": "t2", "content": "second"}]'
    result: todoist-plan.json
  - id: one
    type: write_file
    needs: [plan]
    path: "docs/{{run_id}}/one.json"
    content: '{"status": "success", "task_id": "t1"}'
    result: todoist-result-1.json
  - id: assemble
    type: assemble
    needs: [one]
    plan: todoist-plan.json
"##;
    let info = completed(&s, graph, &[]).await;
    assert_eq!(outputs(&info, "plan")["plan_type"], "tasks");
    let plan = json_file(&s, &result_path(&info.run_id, "todoist-plan.json")).await;
    assert_eq!(plan["tasks"][1]["rank"], 2);
    assert_eq!(plan["auto_tasks"], Value::Null);
    let out = outputs(&info, "assemble");
    let r = out["results"].as_array().unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(
        (r[0]["status"].as_str(), r[0]["action"].as_str()),
        (Some("success"), Some("close"))
    );
    assert_eq!(
        (r[1]["status"].as_str(), r[1]["action"].as_str()),
        (Some("failed"), Some("comment_failed"))
    );
    assert_eq!(r[1]["rank"], 2);
    // A tasks plan touches no counters.
    assert!(s.read("context/auto-tasks-today.json").await.is_none());

    let missing = r##"
nodes:
  - id: assemble
    type: assemble
    plan: todoist-plan.json
"##;
    let run = s.submit(missing, &[]).await.unwrap().run_id;
    let info = s.wait_final(&run, 60).await;
    assert_eq!(info.state, TaskState::Failed as i32);
    assert!(
        info.error.contains("todoist-plan.json is failed: missing")
            && info.error.contains("never written"),
        "{}",
        info.error
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_phase_graphs_are_refused_at_submit() {
    let s = Stack::start(quick()).await;
    let cases: &[(&str, &str)] = &[
        (
            "contracts: [{files: a.json, schema: {type: nope}}]\nnodes: [{id: a, type: write_file, path: a.txt, content: x}]",
            "contracts[0].schema",
        ),
        (
            "contracts: [{files: a.json}]\nnodes: [{id: a, type: write_file, path: a.txt, content: x}]",
            "contracts[0].schema",
        ),
        (
            "contracts: [{files: a.json, schema_file: ../outside.json}]\nnodes: [{id: a, type: write_file, path: a.txt, content: x}]",
            "contracts[0].schema_file",
        ),
        (
            "nodes: [{id: a, type: write_file, path: a.txt, content: x, result: ../a.json}]",
            "node `a` field `result`",
        ),
        (
            "nodes: [{id: a, type: write_file, path: a.txt, content: x, result: a.md}]",
            "ends in `.json`",
        ),
        (
            "nodes: [{id: g, type: gate, result: g.json}]",
            "a gate node writes no result",
        ),
        ("nodes: [{id: p, type: plan}]", "node `p` field `limits_file`"),
        (
            "nodes: [{id: p, type: plan, limits: {tasks: {a-b: {daily_limit: 1, prompt: one}, a_b: {daily_limit: 1, prompt: two}}}}]",
            "same key `a_b`",
        ),
        (
            "nodes: [{id: p, type: plan, limits_file: no-such-limits.yaml}]",
            "no-such-limits.yaml",
        ),
        (
            "nodes: [{id: p, type: plan, limits: {tasks: {git_push: {daily_limit: 1, prompt: x, result: ../gitpush.json}}}}]",
            "task `git_push`: result",
        ),
        ("nodes: [{id: p, type: assemble}]", "node `p` field `plan`"),
        (
            "nodes: [{id: p, type: assemble, plan: x.json, auto_results: auto.json}]",
            "must contain `{key}`",
        ),
        (
            "nodes: [{id: a, type: write_file, path: a.txt, content: x}, {id: b, type: write_file, path: b.txt, content: '{{nodes.a.result_status}}'}]",
            "has no output `result_status`",
        ),
    ];
    for (yaml, needle) in cases {
        let e = s.submit(yaml, &[]).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{yaml}: {e:?}");
        assert!(e.message().contains(needle), "{yaml}\n=> {}", e.message());
    }
    s.stop().await;
}

/// The auto-task graph of the plan tests: one writer per key (when selected; its result's
/// status is `vars.status_<key>`, default success), then assemble.
fn auto_graph(limits: &[(&str, u32)], max: u32) -> String {
    let tasks: Vec<String> = limits
        .iter()
        .map(|(k, l)| format!("{{key: {k}, daily_limit: {l}, prompt: 'do {k}'}}"))
        .collect();
    let statuses: Vec<String> = limits
        .iter()
        .map(|(k, _)| format!("status_{k}: success"))
        .collect();
    let mut g = format!(
        r##"
vars: {{date: "", {}}}
contracts:
  - files: "todoist-auto-*.json"
    schema: {{type: object, required: [status, type, summary]}}
nodes:
  - id: plan
    type: plan
    date: "{{{{vars.date}}}}"
    counters: context/auto.json
    max_per_run: {max}
    limits: {{tasks: [{}]}}
    result: todoist-plan.json
"##,
        statuses.join(", "),
        tasks.join(", ")
    );
    let mut needs = Vec::new();
    for (k, _) in limits {
        g.push_str(&format!(
            r##"  - id: do_{k}
    type: write_file
    when: nodes.plan.selected.{k}
    path: "docs/{{{{run_id}}}}/{k}.json"
    content: '{{"status": "{{{{vars.status_{k}}}}}", "type": "{k}", "summary": "did {k}"}}'
    result: todoist-auto-{k}.json
"##
        ));
        needs.push(format!("do_{k}"));
    }
    g.push_str(&format!(
        "  - id: assemble\n    type: assemble\n    needs: [{}]\n    trigger: none_failed\n    plan: todoist-plan.json\n",
        needs.join(", ")
    ));
    g
}

async fn plan_keys(s: &Stack, run: &str) -> Vec<String> {
    let plan = json_file(s, &result_path(run, "todoist-plan.json")).await;
    plan["auto_tasks"]["selected_tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["key"].as_str().unwrap().to_owned())
        .collect()
}

async fn counters_doc(s: &Stack) -> Counters {
    let text = s.read_text("context/auto.json").await;
    Counters::parse("context/auto.json", Some(text.as_bytes())).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_continues_across_runs() {
    let s = Stack::start(quick()).await;
    let g = auto_graph(&[("a", 5), ("b", 5), ("c", 5)], 2);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let info = completed(&s, &g, &[("date", "2026-02-28")]).await;
        seen.push(plan_keys(&s, &info.run_id).await);
        assert_eq!(outputs(&info, "assemble")["status"], "success");
    }
    assert_eq!(seen, vec![vec!["a", "b"], vec!["c", "a"], vec!["b", "c"]]);
    let c = counters_doc(&s).await;
    for k in ["a", "b", "c"] {
        assert_eq!(c.used("2026-02-28", k), 2, "{k}");
    }
    assert_eq!(c.cursor(), 6);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_skip_exhausted_keys_then_idle_then_a_new_day() {
    let s = Stack::start(quick()).await;
    let g = auto_graph(&[("a", 1), ("b", 1), ("c", 1)], 2);
    let day = [("date", "2026-02-28"), ("status_c", "failed")];
    // Run 1: a, b succeed.
    let r1 = completed(&s, &g, &day).await;
    assert_eq!(plan_keys(&s, &r1.run_id).await, ["a", "b"]);
    // Run 2: a and b are exhausted; c runs and fails, so it is not counted.
    let r2 = completed(&s, &g, &day).await;
    assert_eq!(plan_keys(&s, &r2.run_id).await, ["c"]);
    let plan2 = json_file(&s, &result_path(&r2.run_id, "todoist-plan.json")).await;
    let skipped: Vec<&str> = plan2["skipped_tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["key"].as_str().unwrap())
        .collect();
    assert_eq!(skipped, ["a", "b"]);
    assert_eq!(outputs(&r2, "assemble")["status"], "failed");
    assert_eq!(counters_doc(&s).await.used("2026-02-28", "c"), 0);
    // Run 3: c is still available (its failure released its claim); now it succeeds.
    let r3 = completed(&s, &g, &[("date", "2026-02-28")]).await;
    assert_eq!(plan_keys(&s, &r3.run_id).await, ["c"]);
    let plan3 = json_file(&s, &result_path(&r3.run_id, "todoist-plan.json")).await;
    assert_eq!(
        plan3["auto_tasks"]["summary"],
        json!({"total_limit": 3, "total_used": 2, "remaining": 1, "selected_count": 1, "max_per_run": 2})
    );
    // Run 4: everything exhausted: idle, and the run completes with nothing to do.
    let r4 = completed(&s, &g, &day).await;
    let plan4 = json_file(&s, &result_path(&r4.run_id, "todoist-plan.json")).await;
    assert_eq!(plan4["plan_type"], "idle");
    assert_eq!(plan4["auto_tasks"]["all_exhausted"], true);
    assert_eq!(
        plan4["auto_tasks"]["next_execution_order_after"],
        Value::Null
    );
    assert_eq!(plan4["auto_tasks"]["summary"]["remaining"], 0);
    let a4 = outputs(&r4, "assemble");
    assert_eq!(
        (a4["plan_type"].as_str(), a4["status"].as_str()),
        (Some("idle"), Some("no_changes"))
    );
    let skipped_nodes = r4
        .nodes
        .iter()
        .filter(|n| {
            n.id.starts_with("do_") && n.state == cairn_proto::v1::NodeState::Skipped as i32
        })
        .count();
    assert_eq!(skipped_nodes, 3);
    let ev = s.events(&r4.run_id).await;
    let sel = ev.iter().find(|e| e.r#type == "plan.selected").unwrap();
    assert_eq!(data(sel)["plan_type"], "idle");
    // Next day: the counts start again and the old day is dropped.
    let r5 = completed(&s, &g, &[("date", "2026-03-01")]).await;
    assert_eq!(plan_keys(&s, &r5.run_id).await.len(), 2);
    let c = counters_doc(&s).await;
    let days: Vec<&String> = c.doc["days"].as_object().unwrap().keys().collect();
    assert_eq!(days, ["2026-03-01"]);
    assert_eq!(c.used("2026-02-28", "a"), 0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_runs_pick_different_tasks_and_both_are_counted() {
    let s = Stack::start(quick()).await;
    let g = auto_graph(&[("a", 1), ("b", 1), ("c", 1), ("d", 1)], 2);
    let vars = [("date", "2026-02-28")];
    let (r1, r2) = tokio::join!(s.submit(&g, &vars), s.submit(&g, &vars));
    let (r1, r2) = (r1.unwrap().run_id, r2.unwrap().run_id);
    for r in [&r1, &r2] {
        let info = s.wait_final(r, 60).await;
        assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
        assert_eq!(outputs(&info, "assemble")["status"], "success");
    }
    let mut all = plan_keys(&s, &r1).await;
    all.extend(plan_keys(&s, &r2).await);
    all.sort();
    assert_eq!(all, ["a", "b", "c", "d"], "the two plans overlap");
    let c = counters_doc(&s).await;
    for k in ["a", "b", "c", "d"] {
        assert_eq!(c.used("2026-02-28", k), 1, "{k}: {:#?}", c.doc);
    }
    let settled = c.doc["days"]["2026-02-28"]["settled"].as_object().unwrap();
    assert!(settled.contains_key(&r1) && settled.contains_key(&r2));
    let r3 = completed(&s, &g, &vars).await;
    assert_eq!(outputs(&r3, "plan")["plan_type"], "idle");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_conflicting_counter_updates_keep_every_increment() {
    let s = Stack::start(quick()).await;
    let store = Store::connect(&s.store_addr).unwrap();
    store.create_project(PROJECT).await.unwrap();
    let path = "context/race.json";
    let date = "2026-02-28";
    // Eight writers read the same version, then all write: one wins, seven conflict.
    let writers = 8;
    let barrier = Arc::new(tokio::sync::Barrier::new(writers));
    let mut tasks = Vec::new();
    for i in 0..writers {
        let (store, barrier) = (store.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let c = Counters::read(&store, PROJECT, path).await.unwrap();
            barrier.wait().await;
            let patch = counters::record_patch(date, &format!("run{i}"), &[("k".into(), 1)]);
            store
                .update_json(PROJECT, path, c.version, &patch, MergePolicy::Max, "")
                .await
                .unwrap()
        }));
    }
    let mut merged = 0;
    for t in tasks {
        merged += usize::from(t.await.unwrap().merged_conflict);
    }
    assert_eq!(merged, writers - 1, "every writer but the first conflicted");
    let c = Counters::read(&store, PROJECT, path).await.unwrap();
    assert_eq!(c.used(date, "k"), writers as u64, "{:#?}", c.doc);
    assert_eq!(c.version, writers as u64);

    // record() from many runs at once, each also counting a second key.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            counters::record(
                &store,
                PROJECT,
                path,
                &format!("other{i}"),
                date,
                &[("k".into(), 1), ("j".into(), 2)],
            )
            .await
            .unwrap()
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let c = Counters::read(&store, PROJECT, path).await.unwrap();
    assert_eq!(c.used(date, "k"), 28);
    assert_eq!(c.used(date, "j"), 40);

    // Without merge a stale version is refused and nothing changes.
    let stale = store
        .update_json(
            PROJECT,
            path,
            1,
            &json!({"cursor": 99}),
            MergePolicy::None,
            "",
        )
        .await
        .unwrap_err();
    assert_eq!(stale.code(), tonic::Code::Aborted);
    assert_eq!(
        Counters::read(&store, PROJECT, path)
            .await
            .unwrap()
            .cursor(),
        0
    );

    // Plan decisions by compare-and-swap: six at once each take the next cursor position.
    let mut tasks = Vec::new();
    for i in 0..6 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let run = format!("plan{i}");
            let (taken, _, version) =
                counters::compare_and_swap(&store, PROJECT, path, &run, |c| {
                    let next = c.cursor() + 1;
                    (next, Some(json!({"cursor": next})))
                })
                .await
                .unwrap();
            assert!(version.is_some());
            taken
        }));
    }
    let mut taken = Vec::new();
    for t in tasks {
        taken.push(t.await.unwrap());
    }
    taken.sort();
    assert_eq!(taken, [1, 2, 3, 4, 5, 6]);
    assert_eq!(
        Counters::read(&store, PROJECT, path)
            .await
            .unwrap()
            .cursor(),
        6
    );
    s.stop().await;
}

/// The plan document names the agent as the phase contract does, and a task whose result file
/// has another name than `todoist-auto-<key>.json` (the contract's `git_push` writes
/// `todoist-auto-gitpush.json`) is read under that name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_names_its_agent_and_a_task_may_name_its_result_file() {
    let s = Stack::start(quick()).await;
    let g = r##"
nodes:
  - id: plan
    type: plan
    agent: todoist-query
    date: "2026-03-01"
    counters: context/gitpush.json
    limits: {tasks: {git_push: {daily_limit: 1, prompt: push, result: todoist-auto-gitpush.json}}}
    result: todoist-plan.json
  - id: push
    type: write_file
    when: nodes.plan.selected.git_push
    path: "docs/{{run_id}}/push.json"
    content: '{"agent": "todoist-gitpush", "status": "success", "type": "git_push", "summary": "pushed"}'
    result: todoist-auto-gitpush.json
  - id: assemble
    type: assemble
    needs: [push]
    plan: todoist-plan.json
"##;
    let info = completed(&s, g, &[]).await;
    let plan = json_file(&s, &result_path(&info.run_id, "todoist-plan.json")).await;
    assert_eq!(plan["agent"], "todoist-query", "{plan}");
    let picked = &plan["auto_tasks"]["selected_tasks"][0];
    assert_eq!(picked["key"], "git_push", "{plan}");
    assert_eq!(picked["result_file"], "todoist-auto-gitpush.json", "{plan}");
    let assembled = outputs(&info, "assemble");
    assert_eq!(assembled["status"], "success", "{assembled}");
    let c = Counters::parse(
        "context/gitpush.json",
        Some(s.read_text("context/gitpush.json").await.as_bytes()),
    )
    .unwrap();
    assert_eq!(
        c.used("2026-03-01", "git_push"),
        1,
        "the success is counted"
    );
    s.stop().await;
}
