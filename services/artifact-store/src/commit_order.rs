//! Tests that watch the order of the durability steps of a commit after deferred Puts (a
//! process kill cannot show a missing fsync: the page cache survives it).
#![allow(clippy::unwrap_used)]

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::Config;
use crate::deferred::probe::{self, Step};
use crate::events::{NewEvent, RunLogs};
use crate::state::State;
use crate::write::{put, Durability, PutSpec};

struct Fixture {
    state: Arc<State>,
    runs: Arc<RunLogs>,
    root: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let root = tempfile::tempdir().unwrap();
    let state = State::open(Config {
        data_root: root.path().to_path_buf(),
        ..Config::default()
    })
    .unwrap();
    let runs = Arc::<RunLogs>::default();
    // Only the run's events may sync the deferred directories here.
    runs.no_timer.store(true, Ordering::Relaxed);
    Fixture {
        state: Arc::new(state),
        runs,
        root,
    }
}

impl Fixture {
    async fn put_deferred(&self, path: &str) {
        let spec = PutSpec {
            project_id: "p".into(),
            path: path.into(),
            run_id: "r1".into(),
            create_project: true,
            durability: Durability::WithRunEvents,
            ..PutSpec::default()
        };
        let body = futures::stream::iter([Ok(Bytes::from_static(b"bytes"))]);
        put(&self.state, &self.runs, spec, body).await.unwrap();
        self.state.slots.settled("p", path).await;
    }

    /// Appends one event. A commit waits for the run's publications: one never settled
    /// fails the test in 10 s instead of hanging it.
    async fn append(&self, run: &str) -> crate::Result<(u64, u64)> {
        let x = NewEvent::store("x", serde_json::json!({}));
        let append = self.runs.append(&self.state, "p", run, vec![x]);
        tokio::time::timeout(std::time::Duration::from_secs(10), append)
            .await
            .expect("the commit waited 10 s for a publication that never settled")
    }

    fn key(&self, rel: &str) -> (u64, u64) {
        let file = std::fs::File::open(self.root.path().join("projects/p").join(rel)).unwrap();
        probe::key_of(file.as_fd())
    }

    fn log_text(&self, run: &str) -> String {
        let path = self
            .root
            .path()
            .join(format!("projects/p/.cairn/runs/{run}/events.jsonl"));
        std::fs::read_to_string(path).unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_directories_are_fsynced_before_the_event_line_is_written() {
    let f = fixture();
    f.put_deferred("docs/a.md").await;
    f.put_deferred("docs/b.md").await;
    f.put_deferred("out/c.md").await;
    let (docs, out) = (f.key("docs"), f.key("out"));
    assert_eq!(f.runs.pending_dirs("p", "r1"), 2);
    f.append("r1").await.unwrap();
    let log = f.key(".cairn/runs/r1/events.jsonl");
    let steps = probe::steps(&[docs, out, log]);
    assert_eq!(steps.len(), 3, "{steps:?}");
    let (syncs, last) = steps.split_at(2);
    assert_eq!(last, [Step::EventsWritten(log)], "{steps:?}");
    let mut synced: Vec<_> = syncs.to_vec();
    let mut want = vec![Step::DirFsync(docs), Step::DirFsync(out)];
    synced.sort_by_key(|s| format!("{s:?}"));
    want.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(synced, want, "each directory once, before the events");
    // The next batch has nothing left to sync.
    f.append("r1").await.unwrap();
    let steps = probe::steps(&[docs, out, log]);
    assert_eq!(steps[3..], [Step::EventsWritten(log)], "{steps:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_directory_fsync_refuses_the_batch_and_the_next_one_retries_it() {
    let f = fixture();
    f.put_deferred("docs/a.md").await;
    f.put_deferred("out/c.md").await;
    let (docs, out) = (f.key("docs"), f.key("out"));
    probe::fail_fsync(out, true);
    let err = f.append("r1").await.unwrap_err();
    assert!(
        err.to_string()
            .contains("fsync of a directory written before these events"),
        "{err}"
    );
    // Nothing written; both directories still pending.
    assert_eq!(f.log_text("r1"), "");
    assert_eq!(f.runs.pending_dirs("p", "r1"), 2);
    probe::fail_fsync(out, false);
    let (first, last) = f.append("r1").await.unwrap();
    assert_eq!((first, last), (1, 1), "the refused batch took no seq");
    assert_eq!(f.log_text("r1").lines().count(), 1);
    assert_eq!(f.runs.pending_dirs("p", "r1"), 0);
    let log = f.key(".cairn/runs/r1/events.jsonl");
    let steps = probe::steps(&[docs, out, log]);
    let written = steps
        .iter()
        .position(|s| *s == Step::EventsWritten(log))
        .unwrap();
    assert_eq!(written, steps.len() - 1, "{steps:?}");
    assert!(steps[..written].contains(&Step::DirFsync(out)), "{steps:?}");
    assert!(
        steps[..written].contains(&Step::DirFsync(docs)),
        "{steps:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_dropped_unfinished_refuses_the_runs_later_events() {
    let f = fixture();
    f.put_deferred("docs/a.md").await;
    f.append("r1").await.unwrap();
    // A publication whose task ended (a panic, a runtime shut down) before it finished.
    drop(f.runs.start_publication("p", "r1", "docs/b.md"));
    // Refused at once (`append` fails after 10 s of waiting): nothing in flight is left to
    // wait for.
    let err = f.append("r1").await.unwrap_err();
    assert!(
        matches!(&err, crate::Error::PublicationLost { run, path, cause }
            if run == "r1" && path == "docs/b.md" && cause.contains("ended before publishing")),
        "{err}"
    );
    assert_eq!(
        f.log_text("r1").lines().count(),
        1,
        "nothing more committed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_seek_record_a_commit_writes_points_at_its_events_line() {
    let f = fixture();
    f.put_deferred("docs/a.md").await;
    // Three commits, so that records are written by later commits too (at offsets past the
    // bytes of the earlier ones).
    let mut n = 0;
    for size in [200, 100, 300] {
        let batch = (0..size)
            .map(|_| {
                n += 1;
                NewEvent::store("x", serde_json::json!({ "n": n, "pad": "y".repeat(n % 7) }))
            })
            .collect();
        f.runs.append(&f.state, "p", "r1", batch).await.unwrap();
    }
    let dir = f.root.path().join("projects/p/.cairn/runs/r1");
    let index = std::fs::File::open(dir.join("events.idx")).unwrap();
    let log = std::fs::File::open(dir.join("events.jsonl")).unwrap();
    let len = log.metadata().unwrap().len();
    let marks = crate::event_seek::read_marks(&index).unwrap();
    assert_eq!(
        marks.iter().map(|m| m.0).collect::<Vec<_>>(),
        [1, 257, 513],
        "{marks:?}"
    );
    for (seq, offset) in &marks {
        assert!(
            crate::event_seek::verify(&log, len, *seq, *offset),
            "the record of {seq} points at {offset}, not at its line"
        );
    }
}

#[tokio::test]
async fn an_event_is_refused_only_when_its_line_is_longer_than_the_limit() {
    let event = NewEvent::store("x", serde_json::json!({ "pad": "y".repeat(300) }));
    let size = event
        .render(u64::MAX, "2026-01-01T00:00:00.000Z", "r1")
        .len();
    for (max, refused) in [(size - 1, true), (size, false)] {
        let root = tempfile::tempdir().unwrap();
        let state = Arc::new(
            State::open(Config {
                data_root: root.path().to_path_buf(),
                max_event_bytes: max,
                ..Config::default()
            })
            .unwrap(),
        );
        let runs = Arc::<RunLogs>::default();
        let spec = PutSpec {
            project_id: "p".into(),
            path: "a.md".into(),
            create_project: true,
            ..PutSpec::default()
        };
        let body = futures::stream::iter([Ok(Bytes::from_static(b"x"))]);
        put(&state, &runs, spec, body).await.unwrap();
        let got = runs.append(&state, "p", "r1", vec![event.clone()]).await;
        match got {
            Err(crate::Error::TooLarge { .. }) => assert!(refused, "refused at exactly the limit"),
            Ok(range) => assert!(!refused, "a line over the limit was committed: {range:?}"),
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn after_a_restart_a_fenced_batch_is_checked_against_the_epoch_on_disk() {
    let root = tempfile::tempdir().unwrap();
    let state = Arc::new(
        State::open(Config {
            data_root: root.path().to_path_buf(),
            ..Config::default()
        })
        .unwrap(),
    );
    let runs = Arc::<RunLogs>::default();
    let spec = PutSpec {
        project_id: "p".into(),
        path: "a.md".into(),
        create_project: true,
        ..PutSpec::default()
    };
    let body = futures::stream::iter([Ok(Bytes::from_static(b"x"))]);
    put(&state, &runs, spec, body).await.unwrap();
    let (epoch, _) = runs.claim(&state, "p", "r1", "driver").await.unwrap();
    runs.claim(&state, "p", "r1", "driver").await.unwrap();
    // The store restarted: its run logs know no epoch until they read it.
    let restarted = Arc::<RunLogs>::default();
    let x = || vec![NewEvent::store("x", serde_json::json!({}))];
    let stale = restarted
        .append_fenced(&state, "p", "r1", x(), epoch, &[])
        .await;
    assert!(
        matches!(stale, Err(crate::Error::Fenced { sent, current, .. }) if sent == epoch && current == epoch + 1),
        "{stale:?}"
    );
    let restarted = Arc::<RunLogs>::default();
    let current = restarted
        .append_fenced(&state, "p", "r1", x(), epoch + 1, &[])
        .await;
    assert_eq!(current.unwrap(), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_deferred_put_leaves_its_directory_to_the_events_unless_the_set_is_full() {
    let f = fixture();
    f.put_deferred("docs/a.md").await;
    f.put_deferred("out/c.md").await;
    f.append("r1").await.unwrap();
    let (docs, out) = (f.key("docs"), f.key("out"));
    let fsyncs = |key| {
        probe::steps(&[key])
            .iter()
            .filter(|s| **s == Step::DirFsync(key))
            .count()
    };
    assert_eq!((fsyncs(docs), fsyncs(out)), (1, 1));
    // The same bytes again: the Put replies without an fsync, its directory joins the
    // run's pending set (the bytes may be a pre-crash Put's, never made durable).
    f.put_deferred("docs/a.md").await;
    assert_eq!(fsyncs(docs), 1, "an fsync the run's events were to make");
    assert_eq!(f.runs.pending_dirs("p", "r1"), 1);
    // With the set full, a Put syncs its directory itself before replying.
    let more = tempfile::tempdir().unwrap();
    for i in 1..1024 {
        let path = more.path().join(i.to_string());
        std::fs::create_dir(&path).unwrap();
        let dir = std::fs::File::open(&path).unwrap();
        assert!(f.runs.defer_dir_sync("p", "r1", &Arc::new(dir.into())));
    }
    assert_eq!(f.runs.pending_dirs("p", "r1"), 1024);
    f.put_deferred("out/c.md").await;
    assert_eq!(fsyncs(out), 2, "the full set took no more directories");
    assert_eq!(f.runs.pending_dirs("p", "r1"), 1024);
}
