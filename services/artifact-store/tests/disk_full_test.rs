//! A full disk answers RESOURCE_EXHAUSTED on every write RPC (Put, AppendEvents, UpdateJson,
//! ClaimRun), with a message that says to free space, and the store keeps serving reads.
//! The data root is a small tmpfs (needs root to mount; the test says SKIP otherwise).
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use cairn_proto::v1::{
    AppendEventsRequest, ClaimRunRequest, EventInput, MergePolicy, UpdateJsonRequest,
};
use common::{create_project, put, run_events, serve_with};
use tonic::{Code, Status};

/// A tmpfs of `size` mounted on a temp dir; unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Writes a file under `dir` until the file system refuses more bytes.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let block = vec![0u8; 4096];
    loop {
        match f.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("filling {}: {e}", dir.display()),
        }
    }
    // Single bytes into the last partial page.
    while f.write(&[0]).is_ok_and(|n| n == 1) {}
    path
}

fn assert_full(result: Result<impl std::fmt::Debug, Status>, what: &str) {
    let status = result.expect_err(&format!("{what} on a full disk must fail"));
    assert_eq!(status.code(), Code::ResourceExhausted, "{what}: {status:?}");
    assert!(
        status.message().contains("free space"),
        "{what}: the message should say what to do: {}",
        status.message()
    );
}

fn event(kind: &str, pad: usize) -> EventInput {
    EventInput {
        r#type: kind.into(),
        data_json: serde_json::json!({ "pad": "x".repeat(pad) }).to_string(),
        ..Default::default()
    }
}

#[tokio::test]
async fn every_write_rpc_answers_resource_exhausted_on_a_full_disk() {
    let Some(fs) = Tmpfs::mount("2m") else {
        println!("SKIP: cannot mount a tmpfs (needs root)");
        return;
    };
    let mut s = serve_with(cairn_artifact_store::Config::new(fs.path().join("data"))).await;
    let c = &mut s.client;
    create_project(c, "p").await;
    put(c, "p", "docs/before.txt", b"before").await.unwrap();
    let append = |events: Vec<EventInput>| AppendEventsRequest {
        project_id: "p".into(),
        run_id: "r".into(),
        events,
        epoch: 0,
        publication_tokens: Vec::new(),
        claim: String::new(),
    };
    c.append_events(append(vec![event("run.started", 10)]))
        .await
        .unwrap();
    c.update_json(UpdateJsonRequest {
        project_id: "p".into(),
        path: "docs/state.json".into(),
        expected_version: 0,
        patch_json: r#"{"n": 1}"#.into(),
        merge: MergePolicy::None as i32,
        run_id: String::new(),
    })
    .await
    .unwrap();

    // A Put larger than the whole file system.
    assert_full(
        put(c, "p", "docs/big.bin", &vec![7u8; 3 << 20]).await,
        "a Put larger than the disk",
    );
    let filler = fill(fs.path());

    assert_full(
        put(c, "p", "docs/after.bin", &vec![1u8; 64 << 10]).await,
        "Put",
    );
    // More than a page, so the log's last partial page cannot absorb it.
    assert_full(
        c.append_events(append(vec![event("node.finished", 16 << 10)]))
            .await,
        "AppendEvents",
    );
    assert_full(
        c.update_json(UpdateJsonRequest {
            project_id: "p".into(),
            path: "docs/state.json".into(),
            expected_version: 1,
            patch_json: serde_json::json!({ "pad": "y".repeat(16 << 10) }).to_string(),
            merge: MergePolicy::None as i32,
            run_id: String::new(),
        })
        .await,
        "UpdateJson",
    );
    assert_full(
        c.claim_run(ClaimRunRequest {
            project_id: "p".into(),
            run_id: "r".into(),
            holder: "test".into(),
        })
        .await,
        "ClaimRun",
    );

    // Reads still work, and nothing half-written shows.
    assert_eq!(run_events(c, "p", "r").await.len(), 1);
    let got = common::get(c, "p", "docs/before.txt").await.unwrap();
    assert_eq!(got, b"before");

    // Space freed: writes succeed again.
    std::fs::remove_file(filler).unwrap();
    c.append_events(append(vec![event("node.finished", 16 << 10)]))
        .await
        .unwrap();
    put(c, "p", "docs/after.bin", &vec![1u8; 64 << 10])
        .await
        .unwrap();
    assert_eq!(run_events(c, "p", "r").await.len(), 2);
    s.stop().await;
}
