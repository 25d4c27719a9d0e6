//! A replay takes its recorded gate decisions whoever drives it: one resumed by another
//! orchestrator (a restart, a failover) goes on taking them there, less those taken before.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::{ReplayRunRequest, TaskState};
use common::*;

/// A chain long enough that a replay is still in it when its first orchestrator stops, then
/// two gates, each followed by a file.
fn graph() -> String {
    let mut g = String::from("nodes:\n");
    let mut prev = String::new();
    for i in 0..120 {
        let needs = if prev.is_empty() {
            String::new()
        } else {
            format!(", needs: [{prev}]")
        };
        g.push_str(&format!(
            "  - {{id: s{i}, type: write_file, path: 'docs/{{{{run_id}}}}/s{i}.txt', content: '{i}'{needs}}}\n"
        ));
        prev = format!("s{i}");
    }
    g.push_str(&format!("  - {{id: first, type: gate, needs: [{prev}]}}\n"));
    g.push_str("  - {id: a, type: write_file, path: 'docs/{{run_id}}/a.txt', content: a, needs: [first]}\n");
    g.push_str("  - {id: second, type: gate, needs: [a]}\n");
    g.push_str("  - {id: b, type: write_file, path: 'docs/{{run_id}}/b.txt', content: b, needs: [second]}\n");
    g
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_resumed_by_another_orchestrator_takes_the_recorded_decisions_there() {
    let s = Stack::start(Options {
        ingest: false,
        tweak: |c| c.resume_on_start = false,
        ..Default::default()
    })
    .await;
    let graph = graph();
    let run = s.submit(&graph, &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::InputRequired, 60).await;
    let mut first = approval(&run, "first", "alice");
    first.note = "chain is fine".into();
    s.client.clone().approve_gate(first).await.unwrap();
    // The second gate blocks once `a` is written.
    for _ in 0..600 {
        if s.events(&run)
            .await
            .iter()
            .any(|e| e.r#type == "gate.blocked" && e.node_id == "second")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let mut second = approval(&run, "second", "bob");
    second.note = "ship it".into();
    s.client
        .clone()
        .reject_gate(second.clone())
        .await
        .unwrap_or_else(|_| panic!("rejecting `second`"));
    let recorded = s.wait_final(&run, 60).await;

    // The replay starts here; this orchestrator stops while the replay is still in the chain.
    let replay = s
        .client
        .clone()
        .replay_run(ReplayRunRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            by: "tester".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    s.handle.as_ref().unwrap().shutdown().await;
    let decided = |events: &[cairn_proto::v1::Event]| {
        events
            .iter()
            .filter(|e| matches!(e.r#type.as_str(), "gate.approved" | "gate.rejected"))
            .map(|e| {
                let d = data(e);
                (
                    e.r#type.clone(),
                    d["gate_id"].as_str().unwrap_or_default().to_owned(),
                    d["by"].as_str().unwrap_or_default().to_owned(),
                    d["replayed_by"].as_str().unwrap_or_default().to_owned(),
                    d["replay_of"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    let before = read_events(&s.store, &replay).await;
    assert!(
        decided(&before).is_empty() && !before.iter().any(|e| e.r#type == "task.completed"),
        "the replay must still be in its chain when its orchestrator stops (make the chain longer)"
    );

    // Another orchestrator over the same store resumes it and takes both decisions.
    let config = cairn_orchestrator::Config {
        store_addr: s.store_addr.clone(),
        ingest_addr: s.ingest_addr.clone(),
        resume_on_start: false,
        ..Default::default()
    };
    let (_server, other) = cairn_orchestrator::orchestrator_service(config)
        .await
        .unwrap();
    assert_eq!(
        other.resume_unfinished().await,
        1,
        "the replay is taken over"
    );
    let mut events = Vec::new();
    for _ in 0..1200 {
        events = read_events(&s.store, &replay).await;
        if events.iter().any(|e| {
            matches!(
                e.r#type.as_str(),
                "task.completed" | "task.failed" | "task.canceled"
            )
        }) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let want = vec![
        (
            "gate.approved".to_owned(),
            "first".to_owned(),
            "alice".to_owned(),
            "tester".to_owned(),
            run.clone(),
        ),
        (
            "gate.rejected".to_owned(),
            "second".to_owned(),
            "bob".to_owned(),
            "tester".to_owned(),
            run.clone(),
        ),
    ];
    let types: Vec<&str> = events.iter().map(|e| e.r#type.as_str()).collect();
    assert_eq!(
        decided(&events),
        want,
        "the resumed replay took the recorded decisions, each once: {types:?}"
    );
    let end = |events: &[cairn_proto::v1::Event]| {
        events
            .iter()
            .rev()
            .find(|e| e.r#type.starts_with("task."))
            .map(|e| e.r#type.clone())
    };
    let source_events = read_events(&s.store, &run).await;
    assert_eq!(
        end(&events),
        end(&source_events),
        "the replay ends as the recorded run did ({:?})",
        recorded.state
    );
    other.shutdown().await;
    s.stop().await;
}
