//! Session snapshots in the store over real gRPC: the per-project quota (refused before
//! anything is published, replacements and deletes counted, concurrent Puts unable to share
//! the last room) and the sweep of the CLI's old snapshots.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::{DeleteRequest, PutDurability, PutHeader};
use common::*;
use tonic::Code;

const KIB: usize = 1024;

fn config_with_quota(tmp: &tempfile::TempDir, kib: u64) -> cairn_artifact_store::Config {
    let mut config = cairn_artifact_store::Config::new(tmp.path().join("data"));
    config.snapshots.max_project_bytes = kib * KIB as u64;
    config
}

fn body(kib: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; kib * KIB];
    Bytegen::new(seed).fill(&mut bytes);
    bytes
}

fn assert_quota_refusal<T: std::fmt::Debug>(result: Result<T, tonic::Status>) {
    let status = assert_refused(result, Code::ResourceExhausted, "snapshot_quota");
    assert!(
        status.message().contains("snapshots.max_project_bytes"),
        "the refusal says what to change: {}",
        status.message()
    );
    assert_eq!(
        cairn_proto::reason::retry_delay(&status),
        None,
        "a full quota is not cured by retrying"
    );
    assert!(cairn_proto::reason::detail(&status, "limit_bytes").is_some());
}

#[tokio::test]
async fn snapshots_past_the_projects_quota_are_refused_and_other_files_are_not() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config_with_quota(&tmp, 4096);
    config.snapshots.projects.insert("free".into(), 0);
    let s = serve_with(config).await;
    let mut c = s.client.clone();
    let cli = ".cairn/snapshots/s1";
    let run = ".cairn/runs/r1/snapshots/s2";

    // Large bodies (past the store's small-write size) and small ones take the same check.
    put(&mut c, "p", &format!("{cli}/1.snap"), &body(1536, 1))
        .await
        .unwrap();
    put(&mut c, "p", &format!("{run}/1.snap"), &body(1536, 2))
        .await
        .unwrap();
    assert_quota_refusal(put(&mut c, "p", &format!("{cli}/2.snap"), &body(1536, 3)).await);
    assert!(
        !s.project_dir("p").join(cli).join("2.snap").exists(),
        "a refused snapshot leaves nothing behind"
    );
    assert_no_temp_files_stay(&s.data_root, "after a refused snapshot").await;
    put(&mut c, "p", &format!("{cli}/2.snap"), &body(900, 4))
        .await
        .unwrap();
    assert_quota_refusal(put(&mut c, "p", &format!("{cli}/3.snap"), &body(200, 5)).await);

    // Files that are no snapshots are not counted nor bounded by it.
    put(&mut c, "p", "docs/big.bin", &body(3072, 6))
        .await
        .unwrap();
    put(&mut c, "p", ".cairn/snapshotsX/big.bin", &body(3072, 6))
        .await
        .unwrap();

    // A replacement counts its new size only: 1536 + 900 held besides, 1660 new = the quota.
    put_overwrite(&mut c, "p", &format!("{cli}/1.snap"), &body(1660, 7))
        .await
        .unwrap();
    assert_quota_refusal(
        put_overwrite(&mut c, "p", &format!("{cli}/1.snap"), &body(1661, 7)).await,
    );
    assert_eq!(
        get(&mut c, "p", &format!("{cli}/1.snap")).await.unwrap(),
        body(1660, 7),
        "the refused replacement left the stored snapshot as it was"
    );

    // An announced size past the room is refused before the body is taken.
    let announced = PutHeader {
        expected_size: Some(300 * KIB as u64),
        ..header("p", &format!("{cli}/4.snap"))
    };
    assert_quota_refusal(put_with(&mut c, announced, &body(300, 8)).await);

    // A delete gives the room back.
    c.delete(DeleteRequest {
        project_id: "p".into(),
        path: format!("{cli}/2.snap"),
        run_id: String::new(),
    })
    .await
    .unwrap();
    put(&mut c, "p", &format!("{cli}/3.snap"), &body(200, 5))
        .await
        .unwrap();

    // Quotas are per project; a project given 0 has none.
    put(&mut c, "q", &format!("{cli}/1.snap"), &body(3072, 9))
        .await
        .unwrap();
    put(&mut c, "free", &format!("{cli}/1.snap"), &body(5120, 9))
        .await
        .unwrap();
}

/// A snapshot whose size comes after its bytes (`digest_at_end`, as a checkpoint streamed
/// while the runner makes it) is refused as soon as its header arrives when the quota has no
/// room left at all, while its sender still holds the stream open; with some room, it is
/// admitted at its end with its size, and refused there when it does not fit.
#[tokio::test]
async fn a_snapshot_sized_at_its_end_is_refused_at_once_when_no_room_is_left() {
    use cairn_proto::v1::{put_request, PutEnd, PutRequest};
    let tmp = tempfile::tempdir().unwrap();
    let s = serve_with(config_with_quota(&tmp, 1024)).await;
    let mut c = s.client.clone();
    let dir = ".cairn/runs/r1/snapshots/s1";
    put(&mut c, "p", &format!("{dir}/1.snap"), &body(1024, 1))
        .await
        .unwrap();

    let streamed = |path: String| PutHeader {
        digest_at_end: true,
        ..header("p", &path)
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<PutRequest>(4);
    tx.send(PutRequest {
        msg: Some(put_request::Msg::Header(streamed(format!("{dir}/2.snap")))),
    })
    .await
    .unwrap();
    tx.send(PutRequest {
        msg: Some(put_request::Msg::Chunk(body(64, 2).into())),
    })
    .await
    .unwrap();
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        c.put(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
    .await
    .expect("refused while the stream is still open, not after its end");
    assert_quota_refusal(answer);
    drop(tx);
    assert_no_temp_files_stay(&s.data_root, "after a snapshot refused at its header").await;

    // Room for 300 KiB: a 200 KiB snapshot sized at its end fits, the next 200 KiB does not.
    c.delete(DeleteRequest {
        project_id: "p".into(),
        path: format!("{dir}/1.snap"),
        run_id: String::new(),
    })
    .await
    .unwrap();
    put(&mut c, "p", &format!("{dir}/1.snap"), &body(724, 3))
        .await
        .unwrap();
    let sized_at_end = |path: String, bytes: Vec<u8>| {
        let end = PutEnd {
            sha256: String::new(),
            size_bytes: bytes.len() as u64,
        };
        let msgs = [
            put_request::Msg::Header(streamed(path)),
            put_request::Msg::Chunk(bytes.into()),
            put_request::Msg::End(end),
        ]
        .map(|m| PutRequest { msg: Some(m) });
        tokio_stream::iter(msgs)
    };
    c.put(sized_at_end(format!("{dir}/2.snap"), body(200, 4)))
        .await
        .unwrap();
    assert_quota_refusal(
        c.put(sized_at_end(format!("{dir}/3.snap"), body(200, 5)))
            .await,
    );
    assert!(!s.project_dir("p").join(dir).join("3.snap").exists());
}

#[tokio::test]
async fn concurrent_snapshot_puts_cannot_share_the_last_room() {
    let tmp = tempfile::tempdir().unwrap();
    let s = serve_with(config_with_quota(&tmp, 1024)).await;
    let mut c = s.client.clone();
    create_project(&mut c, "p").await;
    // Half published with the run's next events (after their reply), half at once.
    let calls = (0..8).map(|i| {
        let mut c = s.client.clone();
        async move {
            let mut h = header("p", &format!(".cairn/runs/r1/snapshots/s{i}/1.snap"));
            if i % 2 == 0 {
                h.durability = PutDurability::WithRunEvents as i32;
                h.run_id = "r1".into();
            }
            put_with(&mut c, h, &body(300, i)).await
        }
    });
    let results = futures::future::join_all(calls).await;
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(admitted, 3, "3 x 300 KiB fit in 1024 KiB, a 4th does not");
    for r in results.into_iter().filter(Result::is_err) {
        assert_quota_refusal(r);
    }
    let dir = s.project_dir("p").join(".cairn/runs/r1/snapshots");
    wait_until("the admitted snapshots are published", || {
        (0..8)
            .filter(|i| dir.join(format!("s{i}/1.snap")).exists())
            .count()
            == 3
    })
    .await;
    // Once published, the reservations are given back: the disk alone counts.
    assert_quota_refusal(put(&mut c, "p", ".cairn/snapshots/x/1.snap", &body(200, 1)).await);
    put(&mut c, "p", ".cairn/snapshots/x/1.snap", &body(100, 1))
        .await
        .unwrap();
}

#[tokio::test]
async fn the_sweep_removes_the_clis_old_snapshots_and_leaves_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = cairn_artifact_store::Config::new(tmp.path().join("data"));
    config.snapshots.delete_after_days = 0;
    let s = serve_with(config.clone()).await;
    let mut c = s.client.clone();
    let files = [
        ".cairn/snapshots/old/1.snap",
        ".cairn/snapshots/mixed/1.snap",
        ".cairn/snapshots/mixed/2.snap",
        ".cairn/runs/r1/snapshots/s/1.snap",
        "docs/old.txt",
    ];
    for (i, f) in files.iter().enumerate() {
        put(&mut c, "p", f, &body(4, i as u64)).await.unwrap();
    }
    s.stop().await;
    let project = tmp.path().join("data/projects/p");
    let three_days_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3 * 86_400);
    for f in [files[0], files[1], files[3], files[4]] {
        std::fs::File::options()
            .write(true)
            .open(project.join(f))
            .unwrap()
            .set_modified(three_days_ago)
            .unwrap();
    }

    config.snapshots.delete_after_days = 2;
    config.retention.sweep_interval_s = 1;
    let s = serve_with(config).await;
    wait_until("the sweep removes the old CLI snapshots", || {
        !project.join(files[0]).exists() && !project.join(files[1]).exists()
    })
    .await;
    wait_until("the emptied session directory goes too", || {
        !project.join(".cairn/snapshots/old").exists()
    })
    .await;
    assert!(project.join(files[2]).exists(), "a young snapshot stays");
    assert!(
        project.join(files[3]).exists(),
        "a run's snapshots go with the run's archive, not by age"
    );
    assert!(
        project.join(files[4]).exists(),
        "other files are never swept"
    );
    s.stop().await;
}
