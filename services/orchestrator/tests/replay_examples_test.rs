//! Every example replays offline to `identical`: the built-in modes (single, self_critique,
//! team), examples/team-phases and examples/daily-digest are each recorded against a loopback
//! OpenAI-compatible server that gives the example's answers with random text and token
//! counts (so a live re-run would differ); the server is stopped, and the replay of each
//! recorded run has the same outputs, events and files.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "support/graph_files.rs"]
mod graph_files;
#[path = "support/random_llm.rs"]
mod random_llm;

use cairn_proto::v1::{SubmitRunRequest, TaskState};
use common::{Options, Stack, PROJECT};
use random_llm::{prompted_llm, RandomLlm};
use serde_json::Value;

const WAIT_S: u64 = 90;

fn example(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

fn read(path: std::path::PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

async fn stack() -> Stack {
    Stack::start(Options {
        tweak: |c| {
            c.llm.allow_request_llm_urls = true;
            c.llm.max_attempts = 1;
        },
        ..Default::default()
    })
    .await
}

/// Records `req` against `llm` to completion, stops the provider, replays the run and
/// asserts the verdict `identical`; the recorded run's and the replay's ids.
async fn record_and_replay(
    s: &Stack,
    llm: RandomLlm,
    mut req: SubmitRunRequest,
) -> (String, String) {
    req.project_id = PROJECT.into();
    req.llm = llm.llm();
    req.by = "tester".into();
    let run = s.submit_req(req).await.unwrap().run_id;
    s.wait_completed(&run, WAIT_S).await;
    let asked = llm.calls.load(std::sync::atomic::Ordering::SeqCst);
    assert!(asked > 0, "the recorded run asked no model");
    llm.stop().await;

    let replayed = s.replay_with(&run, WAIT_S, |_| {}).await.unwrap();
    let info = s.get(&replayed).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    let (v, report) = s.verdict(&run, &replayed).await;
    assert_eq!(v["verdict"], "identical", "{v:#}\n{report:#}");
    // Every file the recorded run wrote was written again, with the same bytes.
    let files = report["files"].as_array().unwrap();
    assert!(!files.is_empty(), "{report:#}");
    for f in files {
        assert_eq!(f["same"], true, "{f:#}");
    }
    (run, replayed)
}

fn mode(name: &str) -> SubmitRunRequest {
    SubmitRunRequest {
        mode: name.into(),
        prompt: "Write a word-count tool".into(),
        ..Default::default()
    }
}

fn mode_cassette(name: &str) -> String {
    read(example("modes").join(format!("{name}.yaml")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_in_modes_replay_identically_with_their_provider_gone() {
    let s = stack().await;
    let single = prompted_llm(&mode_cassette("single"), &[("", "single_task")]).await;
    record_and_replay(&s, single, mode("single")).await;

    let critique = prompted_llm(
        &mode_cassette("self_critique"),
        &[
            ("Above are your draft and its reviews", "final"),
            ("You are reviewer 1 of", "reviews.0"),
            ("You are reviewer 2 of", "reviews.1"),
            ("Write a complete first draft", "draft"),
        ],
    )
    .await;
    record_and_replay(&s, critique, mode("self_critique")).await;

    let team = prompted_llm(
        &mode_cassette("team"),
        &[
            ("Above are the TODO list", "final"),
            ("Audit the engineer's result", "audits.*"),
            ("of the plan above): Counting function", "tasks.0"),
            ("of the plan above): Command line", "tasks.1"),
            ("of the plan above): Tests", "tasks.2"),
            ("Turn the TODO list", "plan"),
            ("Write TODO.md", "todo"),
        ],
    )
    .await;
    let (run, replayed) = record_and_replay(&s, team, mode("team")).await;
    // The replay ingested the tasks' code fences again: a manifest for every one the
    // recorded run made, and the files are in the workspace.
    let manifests = |run: String| {
        let s = &s;
        async move {
            let mut names: Vec<String> = s
                .list(&format!(".cairn/runs/{run}/ingest/"))
                .await
                .into_iter()
                // Without the hash of the document (which names the run) some names carry.
                .map(|p| {
                    p.rsplit('/')
                        .next()
                        .unwrap()
                        .split('.')
                        .filter(|part| {
                            !(part.len() == 16 && part.chars().all(|c| c.is_ascii_hexdigit()))
                        })
                        .collect::<Vec<_>>()
                        .join(".")
                })
                .collect();
            names.sort();
            names
        }
    };
    let recorded = manifests(run).await;
    assert!(recorded.len() >= 3, "{recorded:?}");
    assert_eq!(recorded, manifests(replayed).await);
    for f in ["count.py", "wc.py", "test_count.py"] {
        assert!(
            s.read(&format!("workspace/wordcount/{f}")).await.is_some(),
            "{f}"
        );
    }
    s.stop().await;
}

async fn example_request(name: &str, vars: &[(&str, &str)]) -> SubmitRunRequest {
    let dir = example(name);
    SubmitRunRequest {
        graph_yaml: read(dir.join("graph.yaml")),
        files: graph_files::graph_files(&dir).await,
        vars: vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

fn outputs(info: &cairn_proto::v1::RunInfo, id: &str) -> Value {
    let n = info.nodes.iter().find(|n| n.id == id).unwrap();
    serde_json::from_str(&n.outputs_json).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_team_phases_example_replays_identically_with_its_provider_gone() {
    let s = stack().await;
    let llm = prompted_llm(
        &read(example("team-phases").join("cassette.yaml")),
        &[
            ("Split \"document the cairn CLI\"", "query"),
            ("Task 1 (", "work.0"),
            ("Task 2 (", "work.1"),
            ("Task 3 (", "work.2"),
        ],
    )
    .await;
    let req = example_request("team-phases", &[]).await;
    let (run, replayed) = record_and_replay(&s, llm, req).await;
    // The contracts judged the replayed results as they judged the recorded ones.
    let (a, b) = (s.get(&run).await, s.get(&replayed).await);
    assert_eq!(outputs(&a, "assemble")["status"], "partial");
    let results = |info: &cairn_proto::v1::RunInfo| {
        outputs(info, "assemble")["results"]
            .to_string()
            .replace(&info.run_id, "R")
    };
    assert_eq!(results(&a), results(&b));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daily_digest_example_replays_identically_with_its_provider_gone() {
    let s = stack().await;
    let inbox = example("daily-digest").join("inbox");
    for f in ["todoist.json", "news.json", "gmail.json"] {
        common::put_file(
            &s.store,
            &format!("inbox/{f}"),
            &std::fs::read(inbox.join(f)).unwrap(),
        )
        .await;
    }
    let llm = prompted_llm(
        &read(example("daily-digest").join("cassette.yaml")),
        &[
            ("Write today's digest", "digest"),
            ("Todoist export", "fetch_todoist"),
            ("Read the news", "fetch_news"),
            ("Read the mail", "fetch_gmail"),
            ("Shurangama", "auto_shurangama"),
            ("Hacker News", "auto_tech_research"),
            ("run logs", "auto_log_audit"),
        ],
    )
    .await;
    let req = example_request("daily-digest", &[("date", "2026-02-28")]).await;
    let counters = "context/auto-tasks-today.json";
    let (run, replayed) = record_and_replay(&s, llm, req).await;
    let (a, b) = (s.get(&run).await, s.get(&replayed).await);
    assert_eq!(
        outputs(&a, "plan")["selected_tasks"],
        outputs(&b, "plan")["selected_tasks"]
    );
    assert_eq!(outputs(&a, "assemble")["status"], "success");
    // The replay took the recorded plan; the project's counters still count one run.
    let c = s.read_text(counters).await;
    let c = cairn_phases::counters::Counters::parse("c", Some(c.as_bytes())).unwrap();
    for (k, n) in [("shurangama", 1), ("tech_research", 1), ("log_audit", 0)] {
        assert_eq!(c.used("2026-02-28", k), n, "{k}");
    }
    s.stop().await;
}
