//! Unit tests of `write` (a file of their own, so write.rs stays readable).
#![allow(clippy::unwrap_used)]

use super::*;
use crate::config::Config;
use crate::layout::TEMP_PREFIX;

/// The state and the run logs, composed as the store composes them.
#[derive(Clone)]
struct Fixture {
    state: Arc<State>,
    runs: Arc<RunLogs>,
}

impl std::ops::Deref for Fixture {
    type Target = Arc<State>;
    fn deref(&self) -> &Arc<State> {
        &self.state
    }
}

fn fixture(state: State) -> Fixture {
    Fixture {
        state: Arc::new(state),
        runs: Arc::default(),
    }
}

fn open_state(root: &std::path::Path) -> Fixture {
    fixture(
        State::open(Config {
            data_root: root.to_path_buf(),
            ..Config::default()
        })
        .unwrap(),
    )
}

async fn put<S>(f: &Fixture, spec: PutSpec, chunks: S) -> Result<Written>
where
    S: Stream<Item = Result<Bytes>> + Unpin + Send,
{
    super::put(&f.state, &f.runs, spec, chunks).await
}

fn spec(path: &str, run: &str, durability: Durability) -> PutSpec {
    PutSpec {
        project_id: "p".into(),
        path: path.into(),
        run_id: run.into(),
        create_project: true,
        durability,
        ..PutSpec::default()
    }
}

async fn put_bytes(state: &Fixture, spec: PutSpec, body: &'static [u8]) -> Result<Written> {
    put(
        state,
        spec,
        futures::stream::iter([Ok(Bytes::from_static(body))]),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compare_and_swap_replaces_only_the_expected_bytes_now_or_deferred() {
    let tmp = tempfile::tempdir().unwrap();
    let state = open_state(tmp.path());
    let sha = |b: &[u8]| files::digest_of(&[Bytes::copy_from_slice(b)]).sha256;
    for durability in [Durability::Sync, Durability::WithRunEvents] {
        let path = format!("w/{durability:?}.txt");
        let cas = |body: &'static [u8], expected: &[u8]| {
            let spec = PutSpec {
                if_sha256: sha(expected),
                ..spec(&path, "r", durability)
            };
            put_bytes(&state, spec, body)
        };
        // Nothing there: created.
        assert_eq!(cas(b"v1", b"v0").await.unwrap().outcome, Outcome::Created);
        // Holds the expected bytes: replaced.
        assert_eq!(
            cas(b"v2", b"v1").await.unwrap().outcome,
            Outcome::Overwritten
        );
        // Holds other bytes (someone changed it): refused, nothing written.
        match cas(b"v3", b"v1").await {
            Err(Error::Changed {
                expected, actual, ..
            }) => {
                assert_eq!(expected, sha(b"v1"));
                assert_eq!(actual, sha(b"v2"));
            }
            other => panic!("expected changed, got {other:?}"),
        }
        // The new bytes are there already: unchanged, whatever was expected.
        assert_eq!(cas(b"v2", b"v1").await.unwrap().outcome, Outcome::Unchanged);
        let (entry, _) = crate::read::get(&state, "p", &path, 0, 0).await.unwrap();
        assert_eq!(entry.sha256, sha(b"v2"));
    }
    let bad = PutSpec {
        if_sha256: "xyz".into(),
        ..spec("w/bad.txt", "", Durability::Sync)
    };
    assert!(matches!(
        put_bytes(&state, bad, b"x").await,
        Err(Error::BadRequest(m)) if m.contains("if_sha256")
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_yaml_by_hand_may_change_only_the_editable_fields() {
    let tmp = tempfile::tempdir().unwrap();
    let state = open_state(tmp.path());
    let path = ".cairn/runs/r1/task.yaml";
    let by_hand = |body: &'static [u8]| {
        let spec = PutSpec {
            overwrite: true,
            by_hand: true,
            ..spec(path, "", Durability::Sync)
        };
        put_bytes(&state, spec, body)
    };
    let run_writer = PutSpec {
        overwrite: true,
        ..spec(path, "", Durability::Sync)
    };
    put_bytes(&state, run_writer, b"id: r1\ntitle: t\nstate: working\n")
        .await
        .unwrap();
    assert_eq!(
        by_hand(b"id: r1\ntitle: better\nstate: working\n")
            .await
            .unwrap()
            .outcome,
        Outcome::Overwritten
    );
    match by_hand(b"id: r1\ntitle: better\nstate: completed\n").await {
        Err(e @ Error::NotEditable { .. }) => assert!(e.to_string().contains("`state`"), "{e}"),
        other => panic!("expected not_editable, got {other:?}"),
    }
    let (entry, _) = crate::read::get(&state, "p", path, 0, 0).await.unwrap();
    assert_eq!(
        entry.size_bytes,
        "id: r1\ntitle: better\nstate: working\n".len() as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o_direct_writers_are_bounded_and_the_rest_use_the_page_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let body: Vec<u8> = (0..(3 << 20) + 5).map(|i: u32| (i % 251) as u8).collect();
    let chunks = || {
        let parts: Vec<Result<Bytes>> = body
            .chunks(1 << 20)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures::stream::iter(parts)
    };
    let stream = |name: &'static str, permit| {
        let file = File::create(tmp.path().join(name)).unwrap();
        stream_into(file, Vec::new(), chunks(), 0, u64::MAX, name, permit)
    };
    // With a permit: O_DIRECT; without one: the page cache; the same bytes either way.
    let state = open_state(tmp.path());
    let permit = state.direct_writers.clone().try_acquire_owned().ok();
    let (_, digest, direct) = stream("a", permit).await.unwrap();
    assert!(direct);
    let (_, same, direct) = stream("b", None).await.unwrap();
    assert!(!direct);
    assert_eq!(digest.sha256, same.sha256);
    for name in ["a", "b"] {
        assert!(std::fs::read(tmp.path().join(name)).unwrap() == body);
    }

    // Put takes a permit per large body and gives it back; with none left it still writes.
    let all = state.direct_writers.available_permits();
    let held = state
        .direct_writers
        .clone()
        .acquire_many_owned(all as u32)
        .await
        .unwrap();
    let spec = || spec("d/big.bin", "", Durability::Sync);
    let w = put(&state, spec(), chunks()).await.unwrap();
    assert_eq!(w.digest.sha256, digest.sha256);
    drop(held);
    let spec2 = PutSpec {
        path: "d/big2.bin".into(),
        ..spec()
    };
    put(&state, spec2, chunks()).await.unwrap();
    assert_eq!(state.direct_writers.available_permits(), all);
    for name in ["big.bin", "big2.bin"] {
        let on_disk = std::fs::read(tmp.path().join("projects/p/d").join(name)).unwrap();
        assert!(on_disk == body);
    }
}

#[tokio::test]
async fn deferred_directories_are_synced_before_the_runs_next_events() {
    let tmp = tempfile::tempdir().unwrap();
    let state = open_state(tmp.path());
    for (i, path) in ["docs/a.md", "docs/b.md", "out/c.md"].iter().enumerate() {
        let w = put_bytes(
            &state,
            spec(path, "r1", Durability::WithRunEvents),
            b"bytes",
        )
        .await
        .unwrap();
        assert_eq!(w.outcome, Outcome::Created, "{i}");
    }
    // Published in the background, directories pending: two distinct ones.
    state.slots.settled_under("p", "").await;
    assert_eq!(
        std::fs::read(tmp.path().join("projects/p/docs/b.md")).unwrap(),
        b"bytes"
    );
    assert_eq!(state.runs.pending_dirs("p", "r1"), 2);
    let event = |run: &'static str| {
        let state = state.clone();
        async move {
            let x = NewEvent::store("x", serde_json::json!({}));
            state.runs.append(&state, "p", run, vec![x]).await.unwrap();
        }
    };
    // Another run's events do not sync them.
    event("r2").await;
    assert_eq!(state.runs.pending_dirs("p", "r1"), 2);
    // The run's own next events do, before they are acknowledged.
    event("r1").await;
    assert_eq!(state.runs.pending_dirs("p", "r1"), 0);
}

#[tokio::test]
async fn a_sync_put_defers_nothing_and_deferral_needs_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let state = open_state(tmp.path());
    put_bytes(&state, spec("a.md", "r1", Durability::Sync), b"x")
        .await
        .unwrap();
    assert_eq!(state.runs.pending_dirs("p", "r1"), 0);
    let err = put_bytes(&state, spec("b.md", "", Durability::WithRunEvents), b"x")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::BadRequest(m) if m.contains("needs a run_id")),
        "{err}"
    );
    assert!(!tmp.path().join("projects/p/b.md").exists());
    // An unchanged rewrite publishes nothing, but its bytes may be those of a Put
    // acknowledged before a crash: its directory is synced with the run's next events, and
    // it gets a token for them.
    let w = put_bytes(&state, spec("a.md", "r1", Durability::WithRunEvents), b"x")
        .await
        .unwrap();
    assert_eq!(w.outcome, Outcome::Unchanged);
    assert!(w.publication.is_some());
    assert_eq!(state.runs.pending_dirs("p", "r1"), 1);
    let x = NewEvent::store("x", serde_json::json!({}));
    state.runs.append(&state, "p", "r1", vec![x]).await.unwrap();
    assert_eq!(state.runs.pending_dirs("p", "r1"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unnamed_and_named_temp_files_publish_the_same_way_now_or_deferred() {
    let tmp = tempfile::tempdir().unwrap();
    // This filesystem (the test's temp dir) has O_TMPFILE; the probe finds it.
    assert!(open_state(tmp.path()).unnamed_temps);
    let modes = [true, false]
        .into_iter()
        .flat_map(|u| [(u, Durability::Sync), (u, Durability::WithRunEvents)]);
    for (unnamed, durability) in modes {
        let state = fixture(
            State::open(Config {
                data_root: tmp.path().to_path_buf(),
                ..Config::default()
            })
            .map(|mut s| {
                s.unnamed_temps = unnamed;
                s
            })
            .unwrap(),
        );
        let path = format!("d/{unnamed}-{durability:?}.txt");
        let put = |body: &'static [u8], overwrite: bool| {
            let spec = PutSpec {
                overwrite,
                ..spec(&path, "r", durability)
            };
            put_bytes(&state, spec, body)
        };
        assert_eq!(put(b"one", false).await.unwrap().outcome, Outcome::Created);
        assert_eq!(
            put(b"one", false).await.unwrap().outcome,
            Outcome::Unchanged
        );
        assert!(matches!(
            put(b"two", false).await,
            Err(Error::Exists { .. })
        ));
        assert_eq!(
            put(b"two", true).await.unwrap().outcome,
            Outcome::Overwritten
        );
        // Read through the store (which waits for a deferred publication).
        let (entry, _) = crate::read::get(&state, "p", &path, 0, 0).await.unwrap();
        assert_eq!(entry.size_bytes, 3);
        let file = tmp.path().join("projects/p").join(&path);
        assert_eq!(std::fs::read(&file).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(file.parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(TEMP_PREFIX))
            .collect();
        assert!(names.is_empty(), "temp names left: {names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is held on purpose: it keeps the blocking publication thread waiting.
#[allow(clippy::await_holding_lock)]
async fn a_deferred_put_replies_before_publishing_and_readers_and_events_wait_for_it() {
    let tmp = tempfile::tempdir().unwrap();
    let state = open_state(tmp.path());
    let file = tmp.path().join("projects/p/d/a.md");
    let held = state.hold_publications.lock().unwrap();
    let w = put_bytes(
        &state,
        spec("d/a.md", "r1", Durability::WithRunEvents),
        b"abc",
    )
    .await
    .unwrap();
    assert_eq!(w.outcome, Outcome::Created);
    assert!(!file.exists(), "replied before it was published");
    let (s1, s2, s3) = (state.clone(), state.clone(), state.clone());
    let get = tokio::spawn(async move {
        crate::read::get(&s1, "p", "d/a.md", 0, 0)
            .await
            .map(|(e, _)| e.size_bytes)
    });
    let stat = tokio::spawn(async move {
        crate::read::stat(&s2, "p", "d/a.md", true)
            .await
            .map(|e| e.sha256)
    });
    let events = tokio::spawn(async move {
        let x = NewEvent::store("x", serde_json::json!({}));
        s3.runs.append(&s3, "p", "r1", vec![x]).await
    });
    // Another run's events do not wait.
    let x = NewEvent::store("x", serde_json::json!({}));
    state.runs.append(&state, "p", "r2", vec![x]).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        !get.is_finished() && !stat.is_finished(),
        "readers wait for the publication"
    );
    assert!(
        !events.is_finished(),
        "the run's events wait for the publication"
    );
    drop(held);
    assert_eq!(get.await.unwrap().unwrap(), 3);
    assert_eq!(stat.await.unwrap().unwrap(), w.digest.sha256);
    events.await.unwrap().unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), b"abc");
    // Its directory was synced with those events.
    assert_eq!(state.runs.pending_dirs("p", "r1"), 0);
}

/// A deferred Put holds its publication permit (the bound on publications in flight) and
/// a snapshot's room under its quota until the background publication is done, not only
/// until the reply.
#[tokio::test]
// The guard is held on purpose: it keeps the blocking publication thread waiting.
#[allow(clippy::await_holding_lock)]
async fn a_deferred_publication_holds_its_permit_and_reservation_until_it_is_done() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = Config::new(tmp.path());
    config.snapshots.max_project_bytes = 1 << 20;
    let state = fixture(State::open(config).unwrap());
    let all = state.publish_permits.available_permits();
    let path = ".cairn/runs/r1/snapshots/s/1.snap";
    let held = state.hold_publications.lock().unwrap();
    put_bytes(&state, spec(path, "r1", Durability::WithRunEvents), b"abc")
        .await
        .unwrap();
    assert_eq!(state.publish_permits.available_permits(), all - 1);
    assert_eq!(state.snapshot_quota.pending("p"), 3);
    drop(held);
    let file = tmp.path().join("projects/p").join(path);
    for _ in 0..500 {
        if state.publish_permits.available_permits() == all && file.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(file.exists());
    assert_eq!(state.publish_permits.available_permits(), all);
    assert_eq!(state.snapshot_quota.pending("p"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is held on purpose: it keeps the blocking publication thread waiting.
#[allow(clippy::await_holding_lock)]
async fn a_lost_publication_refuses_the_runs_events_and_leaves_no_temp_file() {
    let tmp = tempfile::tempdir().unwrap();
    let state = open_state(tmp.path());
    let dir = tmp.path().join("projects/p/d");
    let held = state.hold_publications.lock().unwrap();
    let w = put_bytes(
        &state,
        spec("d/a.md", "r1", Durability::WithRunEvents),
        b"ours",
    )
    .await
    .unwrap();
    assert_eq!(w.outcome, Outcome::Created);
    // Someone writes the path behind the store's back before the publication links it.
    std::fs::write(dir.join("a.md"), b"theirs").unwrap();
    drop(held);
    let event = || NewEvent::store("x", serde_json::json!({}));
    for _ in 0..2 {
        let err = state
            .runs
            .append(&state, "p", "r1", vec![event()])
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::PublicationLost { path, .. } if path == "d/a.md"),
            "{err}"
        );
        assert_eq!(
            tonic::Status::from(err).code(),
            tonic::Code::FailedPrecondition
        );
    }
    // Their bytes stay; other runs go on; nothing of ours is left behind.
    assert_eq!(std::fs::read(dir.join("a.md")).unwrap(), b"theirs");
    state
        .runs
        .append(&state, "p", "r2", vec![event()])
        .await
        .unwrap();
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["a.md"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is held on purpose: it keeps the blocking publication thread waiting.
#[allow(clippy::await_holding_lock)]
async fn a_claim_waits_for_fenced_puts_past_their_check_and_refuses_later_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let state = open_state(tmp.path());
    // Creates the project.
    put_bytes(&state, spec("x.md", "", Durability::Sync), b"x")
        .await
        .unwrap();
    let (epoch, _) = state.runs.claim(&state, "p", "r", "a").await.unwrap();
    let fenced = |path: &str| PutSpec {
        fence: Some(("r".into(), epoch)),
        ..spec(path, "r", Durability::WithRunEvents)
    };
    let held = state.hold_publications.lock().unwrap();
    let w = put_bytes(&state, fenced("d/a.md"), b"abc").await.unwrap();
    assert_eq!(w.outcome, Outcome::Created);
    let s2 = state.clone();
    let claim = tokio::spawn(async move { s2.runs.claim(&s2, "p", "r", "b").await });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        !claim.is_finished(),
        "the claim waits for the Put past its check"
    );
    // A Put checked after the claim began is refused at once.
    let late = put_bytes(&state, fenced("d/b.md"), b"late")
        .await
        .unwrap_err();
    assert!(
        matches!(late, Error::Fenced { sent, current, .. } if sent == epoch && current == epoch + 1),
        "{late}"
    );
    drop(held);
    let (next, _) = claim.await.unwrap().unwrap();
    assert_eq!(next, epoch + 1);
    // Published before the claim returned; the late one never.
    let dir = tmp.path().join("projects/p/d");
    assert_eq!(std::fs::read(dir.join("a.md")).unwrap(), b"abc");
    assert!(!dir.join("b.md").exists());
}

#[tokio::test]
async fn without_events_the_timer_syncs_deferred_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let state = open_state(tmp.path());
    put_bytes(
        &state,
        spec("d/a.md", "r1", Durability::WithRunEvents),
        b"x",
    )
    .await
    .unwrap();
    state.slots.settled("p", "d/a.md").await;
    assert_eq!(state.runs.pending_dirs("p", "r1"), 1);
    let start = std::time::Instant::now();
    while state.runs.pending_dirs("p", "r1") > 0 {
        assert!(
            start.elapsed() < crate::deferred::SYNC_AFTER * 10,
            "the deferred directory was never synced"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(start.elapsed() >= crate::deferred::SYNC_AFTER / 2);
}
