//! Runs that heal themselves in one orchestrator: a driver that dies inside a live process
//! (its task aborted) is noticed by the reconcile pass and its run resumed; a node that hangs
//! makes the run stalled (`run.stalled`, RunInfo.stalled_since, ListRuns `stalled`) and the
//! stall policy acts on it (notify, retry, fail).
//!
//! The stall tests need a sandbox runner (the local backend, or Docker when
//! CAIRN_REQUIRE_DOCKER=1); without one they are skipped with a SKIP line.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use cairn_orchestrator::config::{Config, StallPolicy};
use cairn_proto::v1::{ListRunsRequest, RunActionRequest, TaskState};
use common::*;

const GATED: &str = "title: gated\nnodes:\n\
  - {id: a, type: write_file, path: \"docs/{{run_id}}/a.txt\", content: \"a\"}\n\
  - {id: g, type: gate, reason: \"check\", needs: [a]}\n\
  - {id: b, type: write_file, path: \"docs/{{run_id}}/b.txt\", content: \"b\", needs: [g]}\n";

/// Polls the run's events until one of `kind` is there (after the first `skip`).
async fn wait_event(s: &Stack, run: &str, kind: &str, skip: usize, secs: u64) -> usize {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let events = s.events(run).await;
        if let Some(i) = events.iter().skip(skip).position(|e| e.r#type == kind) {
            return skip + i;
        }
        assert!(
            Instant::now() < deadline,
            "run {run}: no {kind} within {secs} s: {:?}",
            events.iter().map(|e| &e.r#type).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_aborted_in_a_live_process_is_noticed_and_its_run_resumed() {
    let s = Stack::start(Options {
        ingest: false,
        tweak: |c| c.reconcile_interval_ms = 300,
        ..Default::default()
    })
    .await;
    let run = s.submit(GATED, &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::InputRequired, 30).await;
    let seen = s.events(&run).await.len();
    let runs = s.handle.as_ref().unwrap().runs();
    assert!(runs.abort_driver(PROJECT, &run), "the run has a driver");
    // The reconcile pass finds the run without a live driver and resumes it.
    wait_event(&s, &run, "task.resumed", seen, 5).await;
    // And counts it in this process's cairn_runs_healed_total (the stack runs in this test),
    // once the reconcile pass that resumed it is over.
    let healed = || {
        cairn_telemetry::metrics::encode().lines().find_map(|l| {
            l.strip_prefix("cairn_runs_healed_total ")
                .map(str::to_owned)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while healed().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(healed().as_deref(), Some("1"));
    let info = s.wait_state(&run, TaskState::InputRequired, 10).await;
    assert_eq!(info.gates.len(), 1);
    s.client
        .clone()
        .approve_gate(approval(&run, "g", "ann"))
        .await
        .unwrap();
    s.wait_state(&run, TaskState::Completed, 30).await;
    let events = s.events(&run).await;
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "a gap in the events at {i}");
    }
    let completed = |n: &str| {
        events
            .iter()
            .filter(|e| e.r#type == "node.completed" && e.node_id == n)
            .count()
    };
    assert_eq!((completed("a"), completed("b")), (1, 1), "each node once");
}

/// A stack with a sandbox runner whose orchestrator reports a stall after 2 s without an
/// event and acts by `policy`; None (SKIP) when no sandbox backend can run here.
async fn stalling_stack(test: &str, policy: StallPolicy) -> Option<Stack> {
    let tweak: fn(&mut Config) = match policy {
        StallPolicy::Notify => |c| {
            c.stall_after_s = 2;
            c.stall_policy = StallPolicy::Notify;
        },
        StallPolicy::Retry => |c| {
            c.stall_after_s = 2;
            c.stall_policy = StallPolicy::Retry;
        },
        StallPolicy::Fail => |c| {
            c.stall_after_s = 2;
            c.stall_policy = StallPolicy::Fail;
        },
    };
    Stack::with_sandbox(test, tweak).await
}

/// One sandbox node that prints nothing and sleeps `secs`.
fn sleeper(secs: u64) -> String {
    format!(
        "title: sleeper\nnodes:\n  - {{id: nap, type: sandbox_run, language: python, timeout_s: 120, retry: {{max_attempts: 1}}, code: 'import time; time.sleep({secs})'}}\n"
    )
}

async fn stalled_list(s: &Stack) -> Vec<String> {
    s.client
        .clone()
        .list_runs(ListRunsRequest {
            project_id: PROJECT.into(),
            stalled: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .runs
        .into_iter()
        .map(|r| r.run_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_node_is_reported_stalled_once_and_notify_only_tells() {
    let Some(s) = stalling_stack("notify", StallPolicy::Notify).await else {
        return;
    };
    let quiet = s.submit(GATED, &[]).await.unwrap().run_id;
    let run = s.submit(&sleeper(8), &[]).await.unwrap().run_id;
    wait_event(&s, &run, "run.stalled", 0, 20).await;
    let info = s.get(&run).await;
    assert!(!info.stalled_since.is_empty(), "{info:?}");
    assert_eq!(info.state, TaskState::Working as i32);
    // Listed as stalled; a run waiting at its gate is not.
    let listed = stalled_list(&s).await;
    assert_eq!(
        listed,
        vec![run.clone()],
        "{listed:?} ({quiet} is not stalled)"
    );
    // The stalled-runs gauge of this process counts it (the stack runs in this test).
    let gauge = || {
        cairn_telemetry::metrics::encode()
            .lines()
            .find_map(|l| l.strip_prefix("cairn_runs_stalled ").map(str::to_owned))
    };
    assert_eq!(gauge().as_deref(), Some("1"));
    // Notify only tells: the node goes on and completes; the stall ends with it.
    let done = s.wait_final(&run, 30).await;
    assert_eq!(done.state, TaskState::Completed as i32, "{done:?}");
    assert!(done.stalled_since.is_empty(), "{done:?}");
    assert!(stalled_list(&s).await.is_empty());
    assert_eq!(gauge().as_deref(), Some("0"));
    let events = s.events(&run).await;
    let stalls: Vec<_> = events
        .iter()
        .filter(|e| e.r#type == "run.stalled")
        .collect();
    assert_eq!(stalls.len(), 1, "one report per stall");
    let d = data(stalls[0]);
    assert_eq!(d["nodes"], serde_json::json!(["nap"]), "{d}");
    assert_eq!(d["policy"], "notify", "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_run_fails_under_the_fail_policy() {
    let Some(s) = stalling_stack("fail", StallPolicy::Fail).await else {
        return;
    };
    let run = s.submit(&sleeper(60), &[]).await.unwrap().run_id;
    let started = Instant::now();
    let done = s.wait_final(&run, 20).await;
    assert_eq!(done.state, TaskState::Failed as i32, "{done:?}");
    assert!(
        done.error.contains("stalled") && done.error.contains("nap"),
        "{done:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "failed by the stall, not the sleep"
    );
    let types = s.event_types(&run).await;
    let at = |kind: &str| types.iter().position(|t| t.split(' ').next() == Some(kind));
    let (stalled, failed) = (at("run.stalled").unwrap(), at("task.failed").unwrap());
    assert!(stalled < failed, "{types:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_node_runs_again_under_the_retry_policy() {
    let Some(s) = stalling_stack("retry", StallPolicy::Retry).await else {
        return;
    };
    // max_attempts 1: the second attempt is the watchdog's, not the retry budget's.
    let run = s.submit(&sleeper(60), &[]).await.unwrap().run_id;
    let stalled = wait_event(&s, &run, "run.stalled", 0, 20).await;
    let again = wait_event(&s, &run, "node.started", stalled, 10).await;
    let events = s.events(&run).await;
    assert_eq!(data(&events[again])["attempt"], 2, "{:?}", events[again]);
    let failed = events[stalled..again]
        .iter()
        .find(|e| e.r#type == "node.failed")
        .expect("the stalled attempt ends as a failed attempt");
    assert_eq!(data(failed)["will_retry"], true, "{failed:?}");
    assert_ne!(s.get(&run).await.state, TaskState::Failed as i32);
    s.client
        .clone()
        .cancel_run(RunActionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            by: "ann".into(),
            reason: "done testing".into(),
        })
        .await
        .unwrap();
    s.wait_final(&run, 30).await;
}
