//! examples/team-phases and examples/daily-digest run to completion with replayed agents
//! (phase contracts and auto tasks).
#![allow(clippy::unwrap_used)]

mod common;
#[path = "support/graph_files.rs"]
mod graph_files;

use cairn_phases::counters::Counters;
use cairn_proto::v1::{RunInfo, SubmitRunRequest, TaskState};
use common::*;
use graph_files::graph_files;
use serde_json::Value;

fn example(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

fn outputs(info: &RunInfo, id: &str) -> Value {
    let n = info.nodes.iter().find(|n| n.id == id).unwrap();
    serde_json::from_str(&n.outputs_json).unwrap_or(Value::Null)
}

async fn run_example(s: &Stack, name: &str, vars: &[(&str, &str)]) -> RunInfo {
    let dir = example(name);
    let req = SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: std::fs::read_to_string(dir.join("graph.yaml")).unwrap(),
        files: graph_files(&dir).await,
        // What `cairn run` sends for the graph's local `replay:cassette.yaml`.
        llm: inline_cassette(&std::fs::read(dir.join("cassette.yaml")).unwrap()),
        vars: vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        by: "example".into(),
        ..Default::default()
    };
    let run = s.submit_req(req).await.unwrap().run_id;
    let info = s.wait_final(&run, 60).await;
    assert_eq!(
        info.state,
        TaskState::Completed as i32,
        "{info:#?}\n{:#?}",
        s.event_types(&run).await
    );
    info
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn team_phases_reports_the_agent_without_a_result_as_failed() {
    let s = Stack::start(Options::default()).await;
    let info = run_example(&s, "team-phases", &[]).await;
    let run = &info.run_id;
    let out = outputs(&info, "assemble");
    assert_eq!(out["plan_type"], "tasks");
    assert_eq!(out["status"], "partial");
    let results = out["results"].as_array().unwrap();
    let statuses: Vec<(&str, &str)> = results
        .iter()
        .map(|r| (r["file"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("todoist-result-1.json", "success"),
            ("todoist-result-2.json", "success"),
            ("todoist-result-3.json", "failed"),
        ]
    );
    let why = results[2]["reason"].as_str().unwrap();
    assert!(why.contains("no result") && why.contains("work.2"), "{why}");
    assert_eq!(results[0]["action"], "close");
    // The plan and results are files of the run, checked against the example's schemas.
    let plan = s
        .read_text(&format!(".cairn/runs/{run}/results/todoist-plan.json"))
        .await;
    assert!(plan.contains("\"plan_type\": \"tasks\""), "{plan}");
    let third = s
        .read_text(&format!(".cairn/runs/{run}/results/todoist-result-3.json"))
        .await;
    assert!(third.contains("\"placeholder\": true"), "{third}");
    let summary = s
        .read_text(&format!("docs/team-phases/{run}/summary.md"))
        .await;
    assert!(
        summary.contains("Overall: **partial**")
            && summary.contains("| `todoist-result-3.json` | failed | comment_failed |"),
        "{summary}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daily_digest_runs_until_its_limits_are_reached() {
    let s = Stack::start(Options::default()).await;
    let inbox = example("daily-digest").join("inbox");
    let store = cairn_store_client::Store::connect(&s.store_addr).unwrap();
    for f in ["todoist.json", "news.json", "gmail.json"] {
        let bytes = std::fs::read(inbox.join(f)).unwrap();
        store
            .put(
                PROJECT,
                &format!("inbox/{f}"),
                bytes.into(),
                &Default::default(),
            )
            .await
            .unwrap();
    }
    let day = [("date", "2026-02-28")];
    let selected = |info: &RunInfo| -> Vec<String> {
        outputs(info, "plan")["selected_tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap().to_owned())
            .collect()
    };

    let r1 = run_example(&s, "daily-digest", &day).await;
    assert_eq!(selected(&r1), ["shurangama", "tech_research"]);
    let a1 = outputs(&r1, "assemble");
    assert_eq!(a1["status"], "success", "{a1:#}");
    assert_eq!(a1["results"].as_array().unwrap().len(), 5);
    // The fetch agents were given the inbox files.
    let requests = s
        .read_text(&format!(
            ".cairn/runs/{}/agents/fetch_gmail/runtime/requests.jsonl",
            r1.run_id
        ))
        .await;
    assert!(requests.contains("Your February bill"), "{requests}");
    let digest = s
        .read_text(&format!("docs/daily-digest/{}/digest.md", r1.run_id))
        .await;
    assert!(digest.contains("# Daily digest"), "{digest}");

    let r2 = run_example(&s, "daily-digest", &day).await;
    assert_eq!(selected(&r2), ["log_audit", "tech_research"]);
    assert_eq!(outputs(&r2, "assemble")["status"], "success");

    let r3 = run_example(&s, "daily-digest", &day).await;
    assert_eq!(outputs(&r3, "plan")["plan_type"], "idle");
    let a3 = outputs(&r3, "assemble");
    assert_eq!(a3["plan_type"], "idle");
    let report = s
        .read_text(&format!("docs/daily-digest/{}/phase-results.md", r3.run_id))
        .await;
    assert!(report.contains("nothing to do"), "{report}");

    let c = s.read_text("context/auto-tasks-today.json").await;
    let c = Counters::parse("c", Some(c.as_bytes())).unwrap();
    for (k, n) in [("shurangama", 1), ("tech_research", 2), ("log_audit", 1)] {
        assert_eq!(c.used("2026-02-28", k), n, "{k}");
    }

    // A new day: the counts start again; the rotation goes on from where it stopped.
    let r4 = run_example(&s, "daily-digest", &[("date", "2026-03-01")]).await;
    assert_eq!(selected(&r4), ["log_audit", "shurangama"]);
    s.stop().await;
}
