//! `agent_task` through a graph run against a local fake OpenAI-compatible server: every
//! attempt of the LLM request is an `llm.attempt` event, token usage lands in the node's
//! outputs, five failures fail the node with the five-failures message, and cancelling the
//! run aborts the request in flight.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "support/fake_openai.rs"]
mod fake_openai;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cairn_orchestrator::Config;
use cairn_proto::v1::{RunActionRequest, SubmitRunRequest, TaskState};
use common::{data, Options, Stack, PROJECT};
use fake_openai::{completion, error, Answer, FakeOpenAi};
use serde_json::Value;

const GRAPH: &str = r#"
version: 1
title: one agent
nodes:
  - id: writer
    type: agent_task
    prompt: "Write a haiku about {{vars.topic}}."
    path: "docs/haiku.md"
"#;

/// Short LLM backoff so retries take milliseconds.
fn fast(c: &mut Config) {
    c.llm.initial_backoff_ms = 5;
    c.llm.max_backoff_ms = 20;
    // The fake server is named by URL in each request.
    c.llm.allow_request_llm_urls = true;
}

async fn stack() -> Stack {
    Stack::start(Options {
        ingest: false,
        tweak: fast,
        ..Default::default()
    })
    .await
}

async fn submit(stack: &Stack, llm: &str) -> String {
    stack
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: GRAPH.into(),
            vars: [("topic".to_owned(), "rain".to_owned())].into(),
            llm: llm.into(),
            by: "tester".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id
}

async fn attempts(stack: &Stack, run_id: &str) -> Vec<Value> {
    stack
        .events(run_id)
        .await
        .iter()
        .filter(|e| e.r#type == "llm.attempt")
        .map(|e| {
            assert_eq!(e.node_id, "writer");
            data(e)
        })
        .collect()
}

#[tokio::test]
async fn retried_attempts_are_events_and_usage_is_recorded() {
    let fake = FakeOpenAi::start(
        vec![error(429), error(500), completion("Rain on the roof.")],
        None,
    )
    .await;
    let stack = stack().await;
    let run = submit(&stack, &fake.llm()).await;
    let info = stack.wait_final(&run, 30).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    assert_eq!(fake.requests().len(), 3);
    assert_eq!(fake.requests()[0]["model"], "m");

    let a = attempts(&stack, &run).await;
    assert_eq!(a.len(), 3, "{a:#?}");
    assert_eq!(a[0]["outcome"], "failed");
    assert_eq!(a[0]["status"], 429);
    assert_eq!(a[0]["will_retry"], true);
    assert_eq!(a[1]["status"], 500);
    assert_eq!(a[2]["outcome"], "succeeded");
    for (i, x) in a.iter().enumerate() {
        assert_eq!(x["attempt"], i as u64 + 1);
        assert_eq!(x["max_attempts"], 5);
        assert_eq!(x["agent_instance"], "writer");
    }

    let node = info.nodes.iter().find(|n| n.id == "writer").unwrap();
    let out: Value = serde_json::from_str(&node.outputs_json).unwrap();
    assert_eq!(out["usage"]["prompt_tokens"], 12);
    assert_eq!(out["usage"]["completion_tokens"], 3);
    assert!(stack
        .read_text("docs/haiku.md")
        .await
        .contains("Rain on the roof."));
    // The same usage is in node.completed's record.
    let completed = stack
        .events(&run)
        .await
        .into_iter()
        .find(|e| e.r#type == "node.completed" && e.node_id == "writer")
        .unwrap();
    assert_eq!(data(&completed)["outputs"]["usage"]["completion_tokens"], 3);
    stack.stop().await;
}

#[tokio::test]
async fn five_failed_attempts_fail_the_node_with_the_seed_message() {
    let fake = FakeOpenAi::start(vec![], Some(error(503))).await;
    let stack = stack().await;
    let run = submit(&stack, &fake.llm()).await;
    let info = stack.wait_final(&run, 30).await;
    assert_eq!(info.state, TaskState::Failed as i32, "{info:#?}");
    // The provider made its 5 attempts; the node is not retried on top of them.
    assert_eq!(fake.requests().len(), 5);
    let a = attempts(&stack, &run).await;
    assert_eq!(a.len(), 5, "{a:#?}");
    assert_eq!(a[4]["will_retry"], false);
    let node = info.nodes.iter().find(|n| n.id == "writer").unwrap();
    assert!(
        node.error.contains("failed 5 times in a row")
            && node.error.contains("attempts per request")
            && node.error.contains("scripted 503"),
        "{}",
        node.error
    );
    assert!(stack.read("docs/haiku.md").await.is_none());
    stack.stop().await;
}

#[tokio::test]
async fn cancelling_the_run_aborts_the_request() {
    let fake = FakeOpenAi::start(vec![], Some(Answer::Hang)).await;
    let stack = stack().await;
    let run = submit(&stack, &fake.llm()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake.requests().is_empty() {
        assert!(Instant::now() < deadline, "the request never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!fake.abandoned.load(Ordering::SeqCst));
    let asked = Instant::now();
    stack
        .client
        .clone()
        .cancel_run(RunActionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            by: "tester".into(),
            reason: "enough".into(),
        })
        .await
        .unwrap();
    while !fake.abandoned.load(Ordering::SeqCst) {
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "the LLM request was still open 2s after the cancel"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let info = stack.wait_final(&run, 10).await;
    assert_eq!(info.state, TaskState::Canceled as i32, "{info:#?}");
    assert_eq!(fake.requests().len(), 1);
    stack.stop().await;
}
