//! Run events: store-assigned gap-free sequence numbers under concurrency, durable JSON lines,
//! read and follow streams, recovery of a torn line after a crash.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;

use cairn_artifact_store::Config;
use cairn_proto::v1::{AppendEventsRequest, Event, EventInput, Level, ReadEventsRequest};
use common::*;
use futures::StreamExt;
use tonic::Code;

fn input(kind: &str, data: serde_json::Value) -> EventInput {
    EventInput {
        r#type: kind.into(),
        node_id: String::new(),
        level: Level::Unspecified as i32,
        data_json: data.to_string(),
    }
}

fn read_req(run: &str, from_seq: u64, follow: bool, limit: u64) -> ReadEventsRequest {
    ReadEventsRequest {
        project_id: "p".into(),
        run_id: run.into(),
        from_seq,
        follow,
        limit,
    }
}

async fn append(
    client: &mut Client,
    run: &str,
    events: Vec<EventInput>,
) -> Result<(u64, u64), tonic::Status> {
    let r = client
        .append_events(AppendEventsRequest {
            project_id: "p".into(),
            run_id: run.into(),
            events,
        })
        .await?
        .into_inner();
    Ok((r.first_seq, r.last_seq))
}

async fn read_all(client: &mut Client, run: &str, from_seq: u64, limit: u64) -> Vec<Event> {
    client
        .read_events(read_req(run, from_seq, false, limit))
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await
}

fn lines(s: &Served, run: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(
        s.project_dir("p")
            .join(format!(".cairn/runs/{run}/events.jsonl")),
    )
    .unwrap();
    assert!(text.ends_with('\n'));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("invalid JSON line {l:?}: {e}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_appenders_get_gap_free_sequences_and_followers_see_all() {
    const CALLERS: u64 = 32;
    const EACH: u64 = 500;
    let mut s = serve().await;
    s.client
        .create_project(cairn_proto::v1::CreateProjectRequest {
            project_id: "p".into(),
        })
        .await
        .unwrap();

    let follower = |mut client: Client| async move {
        let mut stream = client
            .read_events(read_req("r", 1, true, CALLERS * EACH))
            .await
            .unwrap()
            .into_inner();
        let mut seen = Vec::new();
        while let Some(e) = stream.next().await {
            seen.push(e.unwrap());
        }
        seen
    };
    let early = tokio::spawn(follower(s.client.clone()));
    let mut callers = Vec::new();
    for c in 0..CALLERS {
        let mut client = s.client.clone();
        callers.push(tokio::spawn(async move {
            let mut last = 0;
            for i in 0..EACH {
                let (first, last_seq) = append(
                    &mut client,
                    "r",
                    vec![input("test.tick", serde_json::json!({"caller": c, "i": i}))],
                )
                .await
                .unwrap();
                assert_eq!(first, last_seq);
                assert!(first > last, "a caller's own events are in order");
                last = first;
            }
        }));
    }
    // A second follower joins mid-way: it reads the file, then switches to live events.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let late = tokio::spawn(follower(s.client.clone()));
    for c in callers {
        c.await.unwrap();
    }

    let stored = lines(&s, "r");
    assert_eq!(stored.len() as u64, CALLERS * EACH);
    let mut pairs = HashSet::new();
    for (n, line) in stored.iter().enumerate() {
        assert_eq!(
            line["seq"].as_u64(),
            Some(n as u64 + 1),
            "seq strictly increasing without gap"
        );
        for key in ["ts", "type", "run_id", "node_id", "level"] {
            assert!(line.get(key).is_some(), "line has {key}: {line}");
        }
        assert_eq!(line["run_id"], "r");
        assert_eq!(line["level"], "info");
        assert!(
            pairs.insert((
                line["caller"].as_u64().unwrap(),
                line["i"].as_u64().unwrap()
            )),
            "duplicate {line}"
        );
    }
    assert_eq!(
        pairs.len() as u64,
        CALLERS * EACH,
        "every event present once"
    );

    for follower in [early, late] {
        let seen = tokio::time::timeout(std::time::Duration::from_secs(60), follower)
            .await
            .expect("follower finished")
            .unwrap();
        let seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
        assert_eq!(
            seqs,
            (1..=CALLERS * EACH).collect::<Vec<_>>(),
            "followers see every event once, in order"
        );
        let line: serde_json::Value = serde_json::from_str(&seen[100].line_json).unwrap();
        assert_eq!(line, stored[100]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_events_of_one_call_are_contiguous() {
    let mut s = serve().await;
    s.client
        .create_project(cairn_proto::v1::CreateProjectRequest {
            project_id: "p".into(),
        })
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for c in 0..8u64 {
        let mut client = s.client.clone();
        tasks.push(tokio::spawn(async move {
            let mut ranges = Vec::new();
            for b in 0..30u64 {
                let batch = (0..7)
                    .map(|k| input("batch.item", serde_json::json!({"c": c, "b": b, "k": k})))
                    .collect();
                ranges.push((c, b, append(&mut client, "r", batch).await.unwrap()));
            }
            ranges
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let stored = lines(&s, "r");
    assert_eq!(stored.len(), 8 * 30 * 7);
    for (c, b, (first, last)) in all {
        assert_eq!(last - first + 1, 7);
        for (k, seq) in (first..=last).enumerate() {
            let line = &stored[(seq - 1) as usize];
            assert_eq!(
                (line["c"].as_u64(), line["b"].as_u64(), line["k"].as_u64()),
                (Some(c), Some(b), Some(k as u64))
            );
        }
    }
}

#[tokio::test]
async fn read_events_honours_from_seq_limit_and_refuses_unknown_runs() {
    let mut s = serve().await;
    s.client
        .create_project(cairn_proto::v1::CreateProjectRequest {
            project_id: "p".into(),
        })
        .await
        .unwrap();
    let events = (1..=10)
        .map(|i| input("n", serde_json::json!({"i": i})))
        .collect();
    assert_eq!(append(&mut s.client, "r", events).await.unwrap(), (1, 10));
    let got = read_all(&mut s.client, "r", 4, 3).await;
    assert_eq!(got.iter().map(|e| e.seq).collect::<Vec<_>>(), [4, 5, 6]);
    assert_eq!(got[0].data_json, r#"{"i":4}"#);
    assert_eq!(
        got[0].level,
        Level::Info as i32,
        "unspecified is stored as info"
    );
    assert_eq!(
        read_all(&mut s.client, "r", 0, 0).await.len(),
        10,
        "0 is treated as 1"
    );
    assert!(read_all(&mut s.client, "r", 11, 0).await.is_empty());

    let err = s
        .client
        .read_events(read_req("unknown", 1, false, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("follow=true"), "{err:?}");

    // Following a run that has no events yet waits for them.
    let mut follow = s
        .client
        .read_events(read_req("later", 1, true, 2))
        .await
        .unwrap()
        .into_inner();
    append(
        &mut s.client,
        "later",
        vec![
            input("a", serde_json::json!({})),
            input("b", serde_json::json!({})),
        ],
    )
    .await
    .unwrap();
    let got: Vec<Event> = (&mut follow).map(Result::unwrap).collect().await;
    assert_eq!(
        got.iter().map(|e| e.r#type.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );

    for (bad, why) in [
        (input("x", serde_json::json!({"seq": 5})), "reserved"),
        (
            EventInput {
                r#type: "x".into(),
                data_json: "[1]".into(),
                ..Default::default()
            },
            "object",
        ),
        (
            EventInput {
                r#type: "".into(),
                ..Default::default()
            },
            "type",
        ),
        (
            EventInput {
                r#type: "x".into(),
                node_id: "a/b".into(),
                ..Default::default()
            },
            "node",
        ),
    ] {
        let err = append(&mut s.client, "r", vec![bad]).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{why}: {err:?}");
    }
    assert_eq!(
        append(&mut s.client, "r", vec![]).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        append(
            &mut s.client,
            "../r",
            vec![input("x", serde_json::json!({}))]
        )
        .await
        .unwrap_err()
        .code(),
        Code::InvalidArgument
    );
    assert_eq!(lines(&s, "r").len(), 10, "refused calls appended nothing");
}

#[tokio::test]
async fn a_torn_last_line_is_cut_and_sequences_continue_after_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = serve_with(Config::new(tmp.path())).await;
    s.client
        .create_project(cairn_proto::v1::CreateProjectRequest {
            project_id: "p".into(),
        })
        .await
        .unwrap();
    let events = (1..=5)
        .map(|i| input("n", serde_json::json!({"i": i})))
        .collect();
    append(&mut s.client, "r", events).await.unwrap();
    s.stop().await;

    let log = tmp.path().join("projects/p/.cairn/runs/r/events.jsonl");
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str(r#"{"ts":"2026-01-01T00:00:00.000Z","seq":6,"type":"tor"#);
    std::fs::write(&log, &text).unwrap();

    let mut s = serve_with(Config::new(tmp.path())).await;
    // Reading first (a fresh store, the log not touched yet) recovers the log too.
    assert_eq!(read_all(&mut s.client, "r", 1, 0).await.len(), 5);
    assert_eq!(
        append(
            &mut s.client,
            "r",
            vec![input("after", serde_json::json!({}))]
        )
        .await
        .unwrap(),
        (6, 6)
    );
    let stored = lines(&s, "r");
    assert_eq!(
        stored
            .iter()
            .map(|l| l["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(stored[5]["type"], "after");
    assert_eq!(read_all(&mut s.client, "r", 1, 0).await.len(), 6);
}

#[tokio::test]
async fn many_runs_close_idle_logs_and_reopen_them_where_they_were() {
    let mut s = serve().await;
    s.client
        .create_project(cairn_proto::v1::CreateProjectRequest {
            project_id: "p".into(),
        })
        .await
        .unwrap();
    for run in 0..300 {
        let first = append(
            &mut s.client,
            &format!("run-{run}"),
            vec![input("a", serde_json::json!({}))],
        )
        .await
        .unwrap();
        assert_eq!(first, (1, 1));
    }
    for run in [0, 150, 299] {
        let next = append(
            &mut s.client,
            &format!("run-{run}"),
            vec![input("b", serde_json::json!({}))],
        )
        .await
        .unwrap();
        assert_eq!(
            next,
            (2, 2),
            "run-{run} continues after its log was closed and reopened"
        );
    }
}
