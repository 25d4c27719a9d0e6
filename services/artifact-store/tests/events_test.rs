//! Run events: store-assigned gap-free sequence numbers under concurrency, durable JSON lines,
//! read and follow streams, recovery of a torn line after a crash.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;

use cairn_artifact_store::Config;
use cairn_proto::v1::{
    AppendEventsRequest, ClaimRunRequest, Event, EventInput, Level, ReadEventsRequest,
};
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
    append_as(client, run, events, 0).await
}

async fn append_as(
    client: &mut Client,
    run: &str,
    events: Vec<EventInput>,
    epoch: u64,
) -> Result<(u64, u64), tonic::Status> {
    let r = client
        .append_events(AppendEventsRequest {
            project_id: "p".into(),
            run_id: run.into(),
            events,
            epoch,
            publication_tokens: Vec::new(),
            claim: String::new(),
        })
        .await?
        .into_inner();
    Ok((r.first_seq, r.last_seq))
}

async fn read_all(client: &mut Client, run: &str, from_seq: u64, limit: u64) -> Vec<Event> {
    run_events_from(client, "p", run, from_seq, limit).await
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
    create_project(&mut s.client, "p").await;

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
    create_project(&mut s.client, "p").await;
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
    create_project(&mut s.client, "p").await;
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
    create_project(&mut s.client, "p").await;
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
    create_project(&mut s.client, "p").await;
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

async fn claim(client: &mut Client, run: &str) -> Result<(u64, u64), tonic::Status> {
    let r = client
        .claim_run(ClaimRunRequest {
            project_id: "p".into(),
            run_id: run.into(),
            holder: "test".into(),
        })
        .await?
        .into_inner();
    Ok((r.epoch, r.last_seq))
}

#[tokio::test]
async fn a_newer_claim_fences_off_the_older_writer_across_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = serve_with(Config::new(tmp.path())).await;
    create_project(&mut s.client, "p").await;
    let ev = |n: u64| vec![input("x", serde_json::json!({ "n": n }))];

    // The first claim of a new run: epoch 1, empty log.
    assert_eq!(claim(&mut s.client, "r").await.unwrap(), (1, 0));
    assert_eq!(
        append_as(&mut s.client, "r", ev(1), 1).await.unwrap(),
        (1, 1)
    );
    // Unfenced writers (ingest, the store's own events) are never refused.
    assert_eq!(append(&mut s.client, "r", ev(2)).await.unwrap(), (2, 2));

    // A successor claims: it learns where the log ends, and the old epoch is refused.
    assert_eq!(claim(&mut s.client, "r").await.unwrap(), (2, 2));
    let status = append_as(&mut s.client, "r", ev(3), 1).await;
    assert_refused(status, Code::FailedPrecondition, "fenced");
    // An epoch never granted is refused the same way.
    assert_refused(
        append_as(&mut s.client, "r", ev(4), 9).await,
        Code::FailedPrecondition,
        "fenced",
    );
    assert_eq!(
        append_as(&mut s.client, "r", ev(5), 2).await.unwrap(),
        (3, 3)
    );
    let ns: Vec<u64> = read_all(&mut s.client, "r", 1, 0)
        .await
        .iter()
        .map(|e| {
            serde_json::from_str::<serde_json::Value>(&e.data_json).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(ns, [1, 2, 5], "the fenced batches left nothing");

    // The epoch survives a restart: the next claim is 3 and epoch 2 is then fenced.
    s.stop().await;
    let mut s = serve_with(Config::new(tmp.path())).await;
    assert_eq!(
        append_as(&mut s.client, "r", ev(6), 2).await.unwrap(),
        (4, 4)
    );
    assert_eq!(claim(&mut s.client, "r").await.unwrap(), (3, 4));
    assert_refused(
        append_as(&mut s.client, "r", ev(7), 2).await,
        Code::FailedPrecondition,
        "fenced",
    );

    // The epoch file is the store's: clients cannot write it.
    let mut h = header("p", ".cairn/runs/r/events.epoch");
    h.overwrite = true;
    assert_refused(
        put_with(&mut s.client, h, b"99\n").await,
        Code::PermissionDenied,
        "denied",
    );
    // A damaged epoch file (edited by hand, at its maximum) is refused with what to do.
    for (run, text) in [("junk", "x\n"), ("max", "18446744073709551615\n")] {
        let dir = s.project_dir("p").join(format!(".cairn/runs/{run}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("events.epoch"), text).unwrap();
        let status = claim(&mut s.client, run).await.unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert!(status.message().contains("remove the file"), "{status:?}");
    }
    // Bad ids are refused before anything is touched.
    assert_eq!(
        claim(&mut s.client, "../x").await.unwrap_err().code(),
        Code::InvalidArgument
    );
}

/// Writers racing a claim: `n` tasks each make up to `calls` calls of `op(client, writer,
/// call)` and stop at the first refusal, which must be FailedPrecondition `fenced`. Once
/// `before` calls were acknowledged, `claim` runs (so it lands amid the writes, however slow
/// the machine); `at_claim` then looks at the store. Returns what `at_claim` saw, what every
/// acknowledged call returned, and whether any writer was refused.
async fn race_a_claim<T, F, Fut, C, CFut, S>(
    client: &Client,
    n: u64,
    calls: u64,
    before: u64,
    op: F,
    claim: C,
) -> (S, Vec<T>, bool)
where
    T: Send + 'static,
    F: Fn(Client, u64, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<T, tonic::Status>> + Send,
    C: FnOnce() -> CFut,
    CFut: std::future::Future<Output = S>,
{
    use std::sync::atomic::{AtomicU64, Ordering};
    let acknowledged = std::sync::Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..n {
        let (c, op, acknowledged) = (client.clone(), op.clone(), acknowledged.clone());
        writers.push(tokio::spawn(async move {
            let mut landed = Vec::new();
            for i in 0..calls {
                match op(c.clone(), w, i).await {
                    Ok(t) => {
                        landed.push(t);
                        acknowledged.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(status) => {
                        assert_refused::<()>(Err(status), Code::FailedPrecondition, "fenced");
                        return (landed, true);
                    }
                }
            }
            (landed, false)
        }));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while acknowledged.load(Ordering::SeqCst) < before {
        assert!(
            std::time::Instant::now() < deadline,
            "the writers made no progress"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let seen = claim().await;
    let (mut landed, mut refused) = (Vec::new(), false);
    for w in writers {
        let (l, r) = w.await.unwrap();
        landed.extend(l);
        refused |= r;
    }
    (seen, landed, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_racing_a_writer_leaves_every_batch_either_before_it_or_refused() {
    // The old writer appends as fast as it can while a successor claims; after the claim
    // returns last_seq L, every event of the old epoch has seq <= L (nothing lands later).
    let mut amid = 0;
    for round in 0..5u64 {
        let mut s = serve().await;
        create_project(&mut s.client, "p").await;
        let run = format!("race{round}");
        let (old, _) = claim(&mut s.client, &run).await.unwrap();
        let r = run.clone();
        let append = move |mut c: Client, w: u64, i: u64| {
            let run = r.clone();
            async move {
                let e = vec![input("old", serde_json::json!({ "w": w, "i": i }))];
                append_as(&mut c, &run, e, old)
                    .await
                    .map(|(first, _)| first)
            }
        };
        let mut c = s.client.clone();
        let (claimed, landed, refused) =
            race_a_claim(&s.client, 8, 200, 1 + 10 * round, append, || async {
                claim(&mut c, &run).await.unwrap()
            })
            .await;
        let (new, last_seq) = claimed;
        assert_eq!(new, old + 1);
        amid += u64::from(refused);
        assert!(
            landed.iter().all(|seq| *seq <= last_seq),
            "an old-epoch event landed after the claim (last_seq {last_seq}): {:?}",
            landed.iter().filter(|s| **s > last_seq).collect::<Vec<_>>()
        );
        let events = read_all(&mut s.client, &run, 1, 0).await;
        assert_eq!(
            events.len() as u64,
            last_seq,
            "exactly what was acknowledged"
        );
        assert_eq!(landed.len() as u64, last_seq);
    }
    assert!(
        amid > 0,
        "no claim landed amid the appends: nothing was raced"
    );
}

fn fenced(path: &str, run: &str, epoch: u64, deferred: bool) -> cairn_proto::v1::PutHeader {
    cairn_proto::v1::PutHeader {
        fence: Some(cairn_proto::v1::RunFence {
            run_id: run.into(),
            epoch,
        }),
        run_id: if deferred { run.into() } else { String::new() },
        durability: if deferred {
            cairn_proto::v1::PutDurability::WithRunEvents as i32
        } else {
            0
        },
        ..header("p", path)
    }
}

#[tokio::test]
async fn a_fenced_put_is_refused_once_another_writer_claims_the_run() {
    let mut s = serve().await;
    create_project(&mut s.client, "p").await;
    let docs = s.project_dir("p").join("docs");
    // Never claimed: epoch 0, so any fence is stale.
    assert_refused(
        put_with(&mut s.client, fenced("docs/a.txt", "r", 1, false), b"a").await,
        Code::FailedPrecondition,
        "fenced",
    );
    assert_eq!(claim(&mut s.client, "r").await.unwrap().0, 1);
    for (i, deferred) in [false, true].into_iter().enumerate() {
        let path = format!("docs/ok{i}.txt");
        let r = put_with(&mut s.client, fenced(&path, "r", 1, deferred), b"ok").await;
        assert_eq!(outcome(&r.unwrap()), cairn_proto::v1::WriteOutcome::Created);
    }
    assert_eq!(claim(&mut s.client, "r").await.unwrap().0, 2);
    for (i, deferred) in [false, true].into_iter().enumerate() {
        let path = format!("docs/late{i}.txt");
        let r = put_with(&mut s.client, fenced(&path, "r", 1, deferred), b"late").await;
        assert_refused(r, Code::FailedPrecondition, "fenced");
        assert!(!docs.join(format!("late{i}.txt")).exists());
    }
    // The new holder and unfenced writers go on.
    put_with(&mut s.client, fenced("docs/new.txt", "r", 2, true), b"n")
        .await
        .unwrap();
    put(&mut s.client, "p", "docs/free.txt", b"f")
        .await
        .unwrap();
    assert_eq!(get(&mut s.client, "p", "docs/new.txt").await.unwrap(), b"n");
    assert!(temp_files(&s.data_root).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_fenced_put_of_the_old_writer_lands_after_the_claim_returns() {
    let mut amid = 0;
    for round in 0..3u64 {
        let mut s = serve().await;
        create_project(&mut s.client, "p").await;
        let run = format!("race{round}");
        let (old, _) = claim(&mut s.client, &run).await.unwrap();
        let r = run.clone();
        let write = move |mut c: Client, w: u64, i: u64| {
            let run = r.clone();
            async move {
                let name = format!("w{w}-{i}.txt");
                let h = fenced(&format!("docs/{name}"), &run, old, i.is_multiple_of(2));
                put_with(&mut c, h, b"body").await.map(|_| name)
            }
        };
        let docs = s.project_dir("p").join("docs");
        let listing = || -> std::collections::BTreeSet<String> {
            std::fs::read_dir(&docs)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        };
        let mut c = s.client.clone();
        let (at_claim, acknowledged, refused) =
            race_a_claim(&s.client, 6, 400, 1 + 20 * round, write, || async {
                claim(&mut c, &run).await.unwrap();
                listing()
            })
            .await;
        amid += u64::from(refused);
        assert_eq!(listing(), at_claim, "a fenced Put landed after the claim");
        assert_eq!(
            acknowledged
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>(),
            at_claim,
            "every acknowledged Put, and only those"
        );
    }
    assert!(amid > 0, "no claim landed amid the Puts: nothing was raced");
}
