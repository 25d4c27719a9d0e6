//! Node output on the run page through `console_router` (a real artifact-store, a fake
//! orchestrator's WatchLogs): panels show what programs printed as text, a failed node's
//! failing step beside its error, and each map item that prints gets a panel of its own.
#![allow(clippy::unwrap_used)]

mod console_support;

use axum::http::StatusCode;
use cairn_proto::v1 as pb;
use console_support::*;

fn log_chunk(node: &str, seq: u64, stream: pb::LogStream, data: &str) -> pb::LogChunk {
    pb::LogChunk {
        node_id: node.into(),
        attempt: 1,
        seq,
        stream: stream as i32,
        data: data.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

fn log_end(node: &str, seq: u64, outcome: &str, error: &str) -> pb::LogChunk {
    pb::LogChunk {
        end: true,
        outcome: outcome.into(),
        error: error.into(),
        ..log_chunk(node, seq, pb::LogStream::Unspecified, "")
    }
}

/// A run with a code_delivery node that failed at its test command and a sandbox_run node
/// that printed markup.
fn run_with_output(s: &Services) -> &'static str {
    use pb::LogStream::{Stderr, Stdout, Step};
    let run = "run-logs";
    let mut info = blocked_run(run, "Build and probe", "2026-01-02T00:00:00.000Z");
    info.state = pb::TaskState::Failed as i32;
    info.gates.clear();
    info.error = "node `build` failed".into();
    let node = |id: &str, kind: &str, state: pb::NodeState, error: &str| pb::NodeInfo {
        id: id.into(),
        r#type: kind.into(),
        state: state as i32,
        attempts: 1,
        error: error.into(),
        ..Default::default()
    };
    info.nodes = vec![
        node("probe", "sandbox_run", pb::NodeState::Succeeded, ""),
        node(
            "build",
            "code_delivery",
            pb::NodeState::Failed,
            "the task ended without a passing test run",
        ),
        node("notes", "write_file", pb::NodeState::Succeeded, ""),
    ];
    s.fake.add_run(info);
    let probe = [
        log_chunk(
            "probe",
            1,
            Stdout,
            "<script>alert(1)</script><img src=x onerror=alert(2)>\n",
        ),
        log_end("probe", 2, "succeeded", ""),
    ];
    let build = [
        log_chunk("build", 1, Step, "$ make\n"),
        log_chunk("build", 2, Stdout, "built ok\n"),
        log_chunk("build", 3, Step, "[exit 0]\n"),
        log_chunk("build", 4, Step, "$ cargo test\n"),
        log_chunk("build", 5, Stderr, "assertion failed: left == right\n"),
        log_chunk("build", 6, Step, "[exit 101]\n"),
        log_end(
            "build",
            7,
            "failed",
            "the task ended without a passing test run",
        ),
    ];
    for c in probe.into_iter().chain(build) {
        s.fake.add_log(run, c);
    }
    run
}

#[tokio::test]
async fn node_panels_show_output_as_text_and_the_failing_step_beside_its_error() {
    let s = Services::start().await;
    let run = run_with_output(&s);
    let mut c = Client::new(s.router(None));
    let p = c.get(&format!("/projects/{PROJECT}/runs/{run}")).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    let b = &p.body;
    // One panel per node that prints (not the write_file), with the output at page load.
    assert!(b.contains("id=\"panel-probe\""), "{b}");
    assert!(b.contains("id=\"panel-build\""), "{b}");
    assert!(!b.contains("id=\"panel-notes\""), "{b}");
    assert!(
        b.contains("data-src=\"/projects/proj/runs/run-logs/nodes/probe/logs\" data-after=\"1.2\""),
        "{b}"
    );
    // The program's markup is text.
    assert!(!b.contains("<script>alert(1)"), "{b}");
    assert!(!b.contains("<img src=x"), "{b}");
    assert!(
        b.contains("&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"),
        "{b}"
    );
    // The failed node: its error, and beside it the command that failed with its output
    // (not the one that passed).
    let head = b
        .split("id=\"panel-head-build\"")
        .nth(1)
        .and_then(|rest| rest.split("id=\"log-build\"").next())
        .unwrap_or_default();
    assert!(
        head.contains("Error: the task ended without a passing test run"),
        "{head}"
    );
    let failing = head
        .split("id=\"failing-build\"")
        .nth(1)
        .unwrap_or_default();
    assert!(failing.contains("$ cargo test"), "{head}");
    assert!(
        failing.contains("assertion failed: left == right"),
        "{head}"
    );
    assert!(failing.contains("[exit 101]"), "{head}");
    assert!(!failing.contains("$ make"), "{head}");
    // The whole output is in the log pane, with the attempt's end.
    let pane = b.split("id=\"log-build\"").nth(1).unwrap_or_default();
    assert!(
        pane.contains("built ok") && pane.contains("[attempt 1 ended: failed"),
        "{pane}"
    );

    // The live stream relays the chunks as JSON text (never markup) and resumes after an id.
    let url = format!("/projects/{PROJECT}/runs/{run}/nodes/probe/logs");
    let (t, _) = c.stream_until(&url, &[], "id: 1.2\n").await;
    assert!(t.contains("event: log\nid: 1.1\n"), "{t}");
    assert!(t.contains("\"class\":\"stdout\""), "{t}");
    assert!(t.contains("\"text\":\"<script>alert(1)</script>"), "{t}");
    let (t, _) = c
        .stream_until(&url, &[("last-event-id", "1.1")], "id: 1.2\n")
        .await;
    assert!(!t.contains("id: 1.1\n"), "{t}");
}

#[tokio::test]
async fn items_of_a_map_that_print_get_panels_of_their_own() {
    let s = Services::start().await;
    let run = "run-map";
    let mut info = blocked_run(run, "Fan out", "2026-01-03T00:00:00.000Z");
    info.gates.clear();
    info.state = pb::TaskState::Working as i32;
    info.nodes = vec![pb::NodeInfo {
        id: "fan".into(),
        r#type: "map".into(),
        state: pb::NodeState::Running as i32,
        attempts: 1,
        ..Default::default()
    }];
    s.fake.add_run(info);
    let started = |node: &str, kind: &str| pb::Event {
        r#type: "node.started".into(),
        node_id: node.into(),
        level: pb::Level::Info as i32,
        data_json: serde_json::json!({"node_type": kind, "attempt": 1}).to_string(),
        ..Default::default()
    };
    append_events(
        &s.store_addr,
        PROJECT,
        run,
        &[
            started("fan", "map"),
            started("fan.0", "sandbox_run"),
            started("fan.1", "sandbox_run"),
            started("fan.0", "sandbox_run"),
            started("other.2", "sandbox_run"),
        ],
    )
    .await;
    s.fake.add_log(
        run,
        log_chunk(
            "fan.0",
            1,
            pb::LogStream::Stdout,
            "item zero says <b>hi</b>\n",
        ),
    );
    let mut c = Client::new(s.router(None));
    let p = c.get(&format!("/projects/{PROJECT}/runs/{run}")).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    let b = &p.body;
    // One panel per item that ran a logged kind, once each; not for an id of no map.
    assert_eq!(b.matches("id=\"panel-fan.0\"").count(), 1, "{b}");
    assert!(b.contains("id=\"panel-fan.1\""), "{b}");
    assert!(
        !b.contains("id=\"panel-fan\""),
        "the map itself prints nothing: {b}"
    );
    assert!(!b.contains("panel-other.2"), "{b}");
    assert!(
        b.contains("Map item <code>fan.0</code> (sandbox_run)"),
        "{b}"
    );
    assert!(
        b.contains("data-src=\"/projects/proj/runs/run-map/nodes/fan.0/logs\""),
        "{b}"
    );
    assert!(b.contains("item zero says &lt;b&gt;hi&lt;/b&gt;"), "{b}");
}
