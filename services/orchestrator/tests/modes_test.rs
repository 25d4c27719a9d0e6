//! The built-in modes (single, self_critique, team) submitted with `mode` + `prompt` and run
//! to completion with the replay cassettes of examples/modes/ (no network), asserting every
//! file each mode must write and that what they write is ingested; the refusals of a bad
//! mode request; and `single` against a local fake OpenAI-compatible server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "support/fake_openai.rs"]
mod fake_openai;

use std::collections::HashMap;

use cairn_proto::v1::{RunInfo, SubmitRunRequest, TaskState};
use common::{Options, Stack, PROJECT};
use serde_json::Value;

const PROMPT: &str = "Write a word-count tool";

fn cassette(mode: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/modes")
        .join(format!("{mode}.yaml"));
    // What `cairn run --llm replay:<file>` sends.
    common::inline_cassette(&std::fs::read(path).unwrap())
}

fn request(mode: &str, llm: &str, vars: &[(&str, &str)]) -> SubmitRunRequest {
    SubmitRunRequest {
        project_id: PROJECT.into(),
        mode: mode.into(),
        prompt: PROMPT.into(),
        llm: llm.into(),
        vars: vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<HashMap<_, _>>(),
        by: "tester".into(),
        ..Default::default()
    }
}

async fn run_to_completion(stack: &Stack, req: SubmitRunRequest) -> (String, RunInfo) {
    let run = stack.submit_req(req).await.unwrap().run_id;
    let info = stack.wait_final(&run, 60).await;
    assert_eq!(
        info.state,
        TaskState::Completed as i32,
        "{info:#?}\n{:#?}",
        stack.event_types(&run).await
    );
    (run, info)
}

fn outputs(info: &RunInfo, id: &str) -> Value {
    let node = info.nodes.iter().find(|n| n.id == id).unwrap();
    serde_json::from_str(&node.outputs_json).unwrap()
}

/// The request the agent instance sent (its runtime/requests.jsonl), as text.
async fn request_of(stack: &Stack, run: &str, instance: &str) -> String {
    stack
        .read_text(&format!(
            ".cairn/runs/{run}/agents/{instance}/runtime/requests.jsonl"
        ))
        .await
}

#[tokio::test]
async fn single_writes_its_document_and_ingests_it() {
    let stack = Stack::start(Options::default()).await;
    let (run, info) = run_to_completion(&stack, request("single", &cassette("single"), &[])).await;
    assert_eq!(info.nodes.len(), 1);
    let doc = stack.read_text(&format!("docs/single_{run}.md")).await;
    assert!(
        doc.starts_with("---\n") && doc.contains("# Word count"),
        "{doc}"
    );
    let wc = stack.read_text("workspace/wordcount/wc.py").await;
    assert!(wc.contains("def count"), "{wc}");
    // The prompt is the agent's task.
    assert!(request_of(&stack, &run, "single_task")
        .await
        .contains(PROMPT));
    // The ingest manifest records the mode.
    let manifests = stack.list(&format!(".cairn/runs/{run}/ingest/")).await;
    let manifest: Value =
        serde_json::from_slice(&stack.read(&manifests[0]).await.unwrap()).unwrap();
    assert_eq!(manifest["source"]["mode"], "single");
    stack.stop().await;
}

#[tokio::test]
async fn self_critique_drafts_reviews_and_finalises() {
    let stack = Stack::start(Options::default()).await;
    let (run, info) = run_to_completion(
        &stack,
        request("self_critique", &cassette("self_critique"), &[]),
    )
    .await;
    let draft = stack.read_text(&format!("docs/draft_{run}.md")).await;
    assert!(draft.contains("(draft)"));
    let reviews = stack.list(&format!("docs/reviews/{run}/")).await;
    assert_eq!(
        reviews,
        [
            format!("docs/reviews/{run}/review_1.md"),
            format!("docs/reviews/{run}/review_2.md")
        ]
    );
    assert!(stack.read_text(&reviews[0]).await.contains("# Review 1"));
    assert!(stack.read_text(&reviews[1]).await.contains("# Review 2"));
    assert_eq!(outputs(&info, "reviews")["count"], 2);
    let fin = stack.read_text(&format!("docs/final_{run}.md")).await;
    assert!(fin.contains("Points not taken"), "{fin}");
    // The final author saw the draft and every review (the `docs/reviews/<run>/` context).
    let asked = request_of(&stack, &run, "final").await;
    assert!(
        asked.contains("(draft)") && asked.contains("# Review 1") && asked.contains("# Review 2"),
        "{asked}"
    );
    // The draft's file was ingested first; the final's version replaced it.
    let wc = stack.read_text("workspace/wordcount/wc.py").await;
    assert!(wc.contains("def main"), "{wc}");
    assert!(stack
        .read_text("workspace/wordcount/test_wc.py")
        .await
        .contains("unittest"));
    assert_eq!(outputs(&info, "ingest_final")["written"], 2);

    // N reviews as a var.
    let (run, _) = run_to_completion(
        &stack,
        request(
            "self_critique",
            &cassette("self_critique"),
            &[("reviews", "3")],
        ),
    )
    .await;
    assert_eq!(stack.list(&format!("docs/reviews/{run}/")).await.len(), 3);
    stack.stop().await;
}

#[tokio::test]
async fn team_plans_fans_out_audits_and_reports() {
    let stack = Stack::start(Options::default()).await;
    let (run, info) = run_to_completion(&stack, request("team", &cassette("team"), &[])).await;
    let dir = format!("docs/team/{run}");
    assert!(stack
        .read_text(&format!("{dir}/TODO.md"))
        .await
        .contains("- [ ] Unit tests"));
    // The fenced JSON answer is stored as plain JSON.
    let plan: Value =
        serde_json::from_slice(&stack.read(&format!("{dir}/team_plan.json")).await.unwrap())
            .unwrap();
    assert_eq!(plan["tasks"].as_array().unwrap().len(), 3);
    // map fan-out: one task document and one audit per planned task.
    let mut files = stack.list(&format!("{dir}/")).await;
    files.sort();
    let expect: Vec<String> = [
        "TODO.md",
        "audits/audit_0.md",
        "audits/audit_1.md",
        "audits/audit_2.md",
        "final.md",
        "tasks/task_0.md",
        "tasks/task_1.md",
        "tasks/task_2.md",
        "team_plan.json",
    ]
    .iter()
    .map(|f| format!("{dir}/{f}"))
    .collect();
    assert_eq!(files, expect);
    for map in ["tasks", "audits"] {
        let out = outputs(&info, map);
        assert_eq!(out["count"], 3, "{map}: {out}");
        assert_eq!(out["succeeded"], 3, "{map}: {out}");
    }
    assert!(request_of(&stack, &run, "tasks-1")
        .await
        .contains("Your task (number 1 of the plan above): Command line"));
    // Each task's files were ingested into the workspace.
    for f in ["count.py", "wc.py", "test_count.py"] {
        assert!(
            stack
                .read(&format!("workspace/wordcount/{f}"))
                .await
                .is_some(),
            "workspace/wordcount/{f} missing"
        );
    }
    // The final report saw the tasks and audits.
    let asked = request_of(&stack, &run, "final").await;
    assert!(
        asked.contains("tasks/task_2.md") && asked.contains("audits/audit_0.md"),
        "{asked}"
    );
    assert!(stack
        .read_text(&format!("{dir}/final.md"))
        .await
        .contains("# Final report"));
    stack.stop().await;
}

#[tokio::test]
async fn bad_mode_requests_are_refused() {
    let stack = Stack::start(Options {
        ingest: false,
        ..Default::default()
    })
    .await;
    let e = stack
        .submit_req(request("duo", &cassette("single"), &[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("unknown mode `duo`")
            && e.message().contains("single, self_critique, team"),
        "{}",
        e.message()
    );
    let mut both = request("single", &cassette("single"), &[]);
    both.graph_yaml =
        "version: 1\nnodes: [{id: a, type: write_file, path: docs/a.md, content: a}]\n".into();
    let e = stack.submit_req(both).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("graph_yaml"), "{}", e.message());
    let mut empty = request("team", &cassette("team"), &[]);
    empty.prompt = String::new();
    let e = stack.submit_req(empty).await.unwrap_err();
    assert!(e.message().contains("needs a prompt"), "{}", e.message());
    let e = stack
        .submit_req(request(
            "self_critique",
            &cassette("self_critique"),
            &[("reviews", "50")],
        ))
        .await
        .unwrap_err();
    assert!(e.message().contains("vars.reviews"), "{}", e.message());
    stack.stop().await;
}

#[tokio::test]
async fn single_against_an_openai_compatible_server() {
    let fake = fake_openai::FakeOpenAi::start(
        vec![fake_openai::completion(
            "# Answer\n\nFrom the fake server.\n",
        )],
        None,
    )
    .await;
    let stack = Stack::start(Options {
        // The fake server is named by URL in the request.
        tweak: |c| c.llm.allow_request_llm_urls = true,
        ..Default::default()
    })
    .await;
    let (run, info) = run_to_completion(&stack, request("single", &fake.llm(), &[])).await;
    let doc = stack.read_text(&format!("docs/single_{run}.md")).await;
    assert!(doc.contains("From the fake server."), "{doc}");
    let sent = fake.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["model"], "m");
    let last = sent[0]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    assert_eq!(last["content"], PROMPT);
    assert_eq!(
        outputs(&info, "single_task")["usage"]["completion_tokens"],
        3
    );
    stack.stop().await;
}
