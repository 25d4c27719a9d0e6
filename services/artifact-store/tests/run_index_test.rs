//! The run index over gRPC (ListRunSummaries): it answers as a walk of the run directories
//! does, for mixed states, titles and dates, through pages and filters; it follows writes; a
//! deleted, corrupted or stale index is rebuilt at start-up; kill -9 of the store at random
//! points of a stream of run writes never leaves it disagreeing with the run directories.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use cairn_artifact_store::Config;
use cairn_proto::v1::{
    put_request, AppendEventsRequest, EventInput, ListRunSummariesRequest, PageRequest, PutHeader,
    PutRequest, RunCursor, RunSummary,
};
use common::*;
use serde_json::json;

const STATES: [&str; 6] = [
    "created",
    "working",
    "input-required",
    "completed",
    "failed",
    "canceled",
];
const WORDS: [&str; 4] = ["Alpha", "beta", "Gamma ray", "delta"];

/// A small deterministic generator (the seed is printed by the tests that vary it).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

fn state_json(run: &str, state: &str, title: &str, day: u64, minute: u64) -> Vec<u8> {
    json!({
        "run_id": run,
        "title": title,
        "goal": format!("goal of {run}: {}", WORDS[(day % 4) as usize]),
        "state": state,
        "created_at": format!("2026-03-{:02}T10:{:02}:00Z", day, minute),
        "updated_at": format!("2026-03-{:02}T11:{:02}:00Z", day, minute),
        "nodes": [],
    })
    .to_string()
    .into_bytes()
}

async fn put_over(client: &mut Client, path: &str, bytes: Vec<u8>) -> Result<(), tonic::Status> {
    let header = PutHeader {
        overwrite: true,
        ..header("p", path)
    };
    let msgs = vec![
        PutRequest {
            msg: Some(put_request::Msg::Header(header)),
        },
        PutRequest {
            msg: Some(put_request::Msg::Chunk(bytes.into())),
        },
    ];
    client.put(futures::stream::iter(msgs)).await.map(|_| ())
}

async fn append_event(client: &mut Client, run: &str) -> Result<(), tonic::Status> {
    client
        .append_events(AppendEventsRequest {
            project_id: "p".into(),
            run_id: run.into(),
            events: vec![EventInput {
                r#type: "test.noted".into(),
                ..Default::default()
            }],
            epoch: 0,
            publication_tokens: Vec::new(),
            claim: String::new(),
        })
        .await
        .map(|_| ())
}

#[derive(Clone, Default)]
struct Query {
    states: Vec<&'static str>,
    text: &'static str,
    after: &'static str,
    before: &'static str,
    exclude: Vec<String>,
}

impl Query {
    fn request(&self, size: u32, token: &str) -> ListRunSummariesRequest {
        ListRunSummariesRequest {
            project_id: "p".into(),
            states: self.states.iter().map(|s| (*s).to_owned()).collect(),
            text: self.text.into(),
            created_after: self.after.into(),
            created_before: self.before.into(),
            page: Some(PageRequest {
                page_size: size,
                page_token: token.into(),
            }),
            exclude_run_ids: self.exclude.clone(),
            include_state_json: false,
            after: None,
            unfinished: false,
            count_only: false,
        }
    }
}

/// (run id, state, title, created_at, indexed) in the order the store gives, all pages.
type Row = (String, String, String, String, bool);

fn row(s: &RunSummary) -> Row {
    (
        s.run_id.clone(),
        s.state.clone(),
        s.title.clone(),
        s.created_at.clone(),
        s.indexed,
    )
}

async fn listed(client: &mut Client, q: &Query, size: u32) -> Vec<Row> {
    let mut out = Vec::new();
    let mut token = String::new();
    for _ in 0..10_000 {
        let page = client
            .list_run_summaries(q.request(size, &token))
            .await
            .unwrap()
            .into_inner();
        assert!(page.runs.len() <= size as usize);
        out.extend(page.runs.iter().map(row));
        if page.next_page_token.is_empty() {
            return out;
        }
        token = page.next_page_token;
    }
    panic!("paging did not end");
}

fn rfc3339(s: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
}

/// What a walk of the run directories answers for `q`.
fn walked(data_root: &Path, q: &Query) -> Vec<Row> {
    let runs = data_root.join("projects/p/.cairn/runs");
    let mut rows = Vec::new();
    let Ok(dirs) = std::fs::read_dir(&runs) else {
        return rows;
    };
    for dir in dirs {
        let dir = dir.unwrap();
        if !dir.file_type().unwrap().is_dir() {
            continue;
        }
        let run = dir.file_name().to_str().unwrap().to_owned();
        let parsed = std::fs::read(dir.path().join("state.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .filter(serde_json::Value::is_object);
        if q.exclude.contains(&run) {
            continue;
        }
        let Some(v) = parsed else {
            rows.push((run, String::new(), String::new(), String::new(), false));
            continue;
        };
        let field = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_owned();
        let (state, title, goal, created) = (
            field("state"),
            field("title"),
            field("goal"),
            field("created_at"),
        );
        if !q.states.is_empty() && !q.states.contains(&state.as_str()) {
            continue;
        }
        let text = q.text.to_lowercase();
        if !text.is_empty()
            && ![&title, &goal, &run]
                .iter()
                .any(|f| f.to_lowercase().contains(&text))
        {
            continue;
        }
        if !q.after.is_empty() || !q.before.is_empty() {
            let Some(c) = rfc3339(&created) else { continue };
            if !q.after.is_empty() && c < rfc3339(q.after).unwrap() {
                continue;
            }
            if !q.before.is_empty() && c >= rfc3339(q.before).unwrap() {
                continue;
            }
        }
        rows.push((run, state, title, created, true));
    }
    rows.sort_by(|a, b| (&b.3, &b.0).cmp(&(&a.3, &a.0)));
    rows
}

fn queries() -> Vec<Query> {
    vec![
        Query::default(),
        Query {
            states: vec!["working"],
            ..Query::default()
        },
        Query {
            states: vec!["completed", "failed"],
            ..Query::default()
        },
        Query {
            text: "GAMMA",
            ..Query::default()
        },
        Query {
            text: "r-1",
            ..Query::default()
        },
        Query {
            after: "2026-03-05T00:00:00Z",
            before: "2026-03-12T00:00:00Z",
            ..Query::default()
        },
        Query {
            states: vec!["working", "input-required"],
            text: "a",
            after: "2026-03-03T00:00:00Z",
            ..Query::default()
        },
        Query {
            exclude: vec!["r-3".into(), "r-10".into()],
            ..Query::default()
        },
    ]
}

async fn assert_agrees(client: &mut Client, data_root: &Path, when: &str) {
    // A store answers once its start-up is over, which may redo journaled Puts: the files are
    // walked after that.
    listed(client, &Query::default(), 1000).await;
    for (i, q) in queries().iter().enumerate() {
        let want = walked(data_root, q);
        for size in [1000, 7] {
            let got = listed(client, q, size).await;
            assert_eq!(got, want, "{when}: query {i}, pages of {size}");
        }
        // Counted instead of listed: as many as the pages hold, and no run sent.
        let counted = client
            .list_run_summaries(ListRunSummariesRequest {
                count_only: true,
                ..q.request(7, "")
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (counted.total, counted.runs.len()),
            (want.len() as u64, 0),
            "{when}: query {i} counted"
        );
    }
}

/// Writes `n` runs of mixed states, titles and dates, some sharing a creation time, plus a
/// run with events but no state.json and one whose state.json is not JSON.
async fn write_runs(client: &mut Client, n: u64, rng: &mut Lcg) {
    for i in 0..n {
        let run = format!("r-{i}");
        let body = state_json(
            &run,
            STATES[rng.next(6) as usize],
            &format!("{} {i}", WORDS[rng.next(4) as usize]),
            1 + rng.next(20),
            rng.next(3),
        );
        put_over(client, &format!(".cairn/runs/{run}/state.json"), body)
            .await
            .unwrap();
    }
    append_event(client, "no-state").await.unwrap();
    put_over(client, ".cairn/runs/bad/state.json", b"{ not json".to_vec())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_answers_as_a_walk_and_follows_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let s = serve_with(Config::new(tmp.path())).await;
    let mut c = s.client.clone();
    write_runs(&mut c, 60, &mut Lcg(7)).await;
    assert_agrees(&mut c, tmp.path(), "after writing").await;

    // A state change moves a run between filters at once.
    put_over(
        &mut c,
        ".cairn/runs/r-5/state.json",
        state_json("r-5", "canceled", "renamed zeta", 28, 59),
    )
    .await
    .unwrap();
    let q = Query {
        text: "zeta",
        ..Query::default()
    };
    // (Runs without a readable state.json come unfiltered, after the indexed ones.)
    let got: Vec<Row> = listed(&mut c, &q, 10)
        .await
        .into_iter()
        .filter(|r| r.4)
        .collect();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0.as_str(), got[0].1.as_str()), ("r-5", "canceled"));
    // Newest first: its new creation time puts it first.
    let all = listed(&mut c, &Query::default(), 3).await;
    assert_eq!(all[0].0, "r-5");
    // A deleted state.json leaves a run known only by its id, after the indexed ones.
    c.delete(cairn_proto::v1::DeleteRequest {
        project_id: "p".into(),
        path: ".cairn/runs/r-6/state.json".into(),
        run_id: String::new(),
    })
    .await
    .unwrap();
    assert_agrees(&mut c, tmp.path(), "after a change and a delete").await;
    let all = listed(&mut c, &Query::default(), 1000).await;
    assert!(
        all.iter().rev().take(3).all(|r| !r.4),
        "{:?}",
        &all[all.len() - 3..]
    );

    // state_json on request; a cursor from a summary resumes after it.
    let mut first = c
        .list_run_summaries(ListRunSummariesRequest {
            include_state_json: true,
            ..Query::default().request(2, "")
        })
        .await
        .unwrap()
        .into_inner();
    let last = first.runs.pop().unwrap();
    let on_disk = std::fs::read(
        tmp.path()
            .join(format!("projects/p/.cairn/runs/{}/state.json", last.run_id)),
    )
    .unwrap();
    assert_eq!(last.state_json.as_ref(), &on_disk[..]);
    let resumed = c
        .list_run_summaries(ListRunSummariesRequest {
            after: Some(RunCursor {
                created_at: last.created_at.clone(),
                run_id: last.run_id.clone(),
            }),
            ..Query::default().request(1000, "")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resumed.runs.iter().map(row).collect::<Vec<_>>(),
        all[2..].to_vec()
    );

    // Refusals: a bad time, a token from elsewhere, an unknown project.
    let bad = |r: ListRunSummariesRequest| {
        let mut c = c.clone();
        async move { c.list_run_summaries(r).await.unwrap_err().code() }
    };
    let mut r = Query::default().request(10, "");
    r.created_after = "yesterday".into();
    assert_eq!(bad(r).await, tonic::Code::InvalidArgument);
    assert_eq!(
        bad(Query::default().request(10, "c1.zz")).await,
        tonic::Code::InvalidArgument
    );
    let mut r = Query::default().request(10, "");
    r.project_id = "nope".into();
    assert_eq!(bad(r).await, tonic::Code::NotFound);
    s.stop().await;
}

fn log_path(data_root: &Path) -> std::path::PathBuf {
    data_root.join("index/p/runs.log")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_corrupted_or_stale_index_is_rebuilt_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path();
    {
        let s = serve_with(Config::new(data)).await;
        let mut c = s.client.clone();
        write_runs(&mut c, 40, &mut Lcg(11)).await;
        assert_agrees(&mut c, data, "written").await;
        s.stop().await;
    }
    assert!(log_path(data).exists());

    // Deleted.
    std::fs::remove_file(log_path(data)).unwrap();
    {
        let s = serve_with(Config::new(data)).await;
        assert_agrees(&mut s.client.clone(), data, "index deleted").await;
        s.stop().await;
    }
    assert!(log_path(data).exists(), "rebuilt on disk");

    // Corrupted: a title changed in place (its check digits no longer match), garbage and a
    // torn line appended.
    let text = std::fs::read_to_string(log_path(data)).unwrap();
    let victim = text.lines().nth(3).unwrap().to_owned();
    let title_at = victim.find("\"title\":\"").unwrap() + 9;
    let mut damaged = victim.clone();
    damaged.replace_range(title_at..title_at + 1, "#");
    let text = text.replace(&victim, &damaged) + "garbage line\n0123 {\"run\":";
    std::fs::write(log_path(data), text).unwrap();
    {
        let s = serve_with(Config::new(data)).await;
        assert_agrees(&mut s.client.clone(), data, "index corrupted").await;
        s.stop().await;
    }
    let rewritten = std::fs::read_to_string(log_path(data)).unwrap();
    assert!(!rewritten.contains("garbage") && !rewritten.contains(&damaged));

    // Stale: run records changed behind the index's back (as a crash between a publication
    // and its index line leaves them): a state.json rewritten, one removed, a run directory
    // gone, a new one.
    let runs = data.join("projects/p/.cairn/runs");
    std::fs::write(
        runs.join("r-1/state.json"),
        state_json("r-1", "failed", "rewritten offline", 27, 1),
    )
    .unwrap();
    std::fs::remove_file(runs.join("r-2/state.json")).unwrap();
    std::fs::remove_dir_all(runs.join("r-3")).unwrap();
    std::fs::create_dir(runs.join("r-new")).unwrap();
    std::fs::write(
        runs.join("r-new/state.json"),
        state_json("r-new", "working", "appeared", 2, 2),
    )
    .unwrap();
    {
        let s = serve_with(Config::new(data)).await;
        let mut c = s.client.clone();
        assert_agrees(&mut c, data, "index stale").await;
        let q = Query {
            text: "rewritten offline",
            ..Query::default()
        };
        let found = listed(&mut c, &q, 10).await;
        assert_eq!(found.iter().filter(|r| r.4).count(), 1, "{found:?}");
        s.stop().await;
    }
}

/// kill -9 of the store process at random points of a stream of run writes (state.json
/// rewrites, new runs, events): after each restart the index agrees with the run directories.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_amid_run_writes_never_leaves_the_index_disagreeing() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!("seed {seed}");
    let mut rng = Lcg(seed);
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path();
    let mut next_run = 0u64;
    for round in 0..6 {
        let mut store = Process::spawn(data);
        let mut c = connect(&store.addr).await;
        if round == 0 {
            create_project(&mut c, "p").await;
        }
        // The index loaded at start agrees before anything is written this round.
        assert_agrees(&mut c, data, &format!("round {round}, after restart")).await;
        let writers: Vec<_> = (0..3)
            .map(|w| {
                let mut c = c.clone();
                let mut rng = Lcg(seed ^ (round * 31 + w));
                let first = next_run + w * 1000;
                tokio::spawn(async move {
                    for i in 0.. {
                        let run = match rng.next(3) {
                            0 => format!("r-{}", first + i),
                            _ => format!("r-{}", rng.next(first + i + 1)),
                        };
                        let body = state_json(
                            &run,
                            STATES[rng.next(6) as usize],
                            WORDS[rng.next(4) as usize],
                            1 + rng.next(20),
                            rng.next(60),
                        );
                        let wrote = if rng.next(5) == 0 {
                            append_event(&mut c, &run).await
                        } else {
                            put_over(&mut c, &format!(".cairn/runs/{run}/state.json"), body).await
                        };
                        if wrote.is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        next_run += 10_000;
        tokio::time::sleep(Duration::from_millis(50 + rng.next(400))).await;
        store.kill9();
        for w in writers {
            let _ = w.await;
        }
        drop(store);
    }
    let store = Process::spawn(data);
    let mut c = connect(&store.addr).await;
    assert_agrees(&mut c, data, "after the last restart").await;
    let all = listed(&mut c, &Query::default(), 1000).await;
    assert!(all.len() > 20, "the writers wrote runs: {}", all.len());
}
