//! The small-Put journal, on the power-cut layer (`power_cut/`): a small synchronous Put is
//! made durable by one fdatasync of the journal, and what the journal holds is redone after a
//! cut or a kill -9 except where a later write replaced or removed it.
//!
//! Needs root and /dev/fuse; elsewhere it prints `SKIP:` and passes, unless
//! `CAIRN_REQUIRE_DOCKER=1` (CI), where it must run.
#![allow(clippy::unwrap_used)]

mod common;
mod power_cut;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use cairn_proto::v1::{DeleteRequest, PutHeader};
use common::*;
use power_cut::Mounted;
use tonic::Code;

const PROJECT: &str = "p";

/// Runs `test` on a machine that can mount the layer (see `power_cut::with_fuse`).
async fn with_fuse<F: std::future::Future<Output = ()>>(name: &str, test: impl FnOnce() -> F) {
    power_cut::with_fuse(name, std::time::Duration::from_secs(120), test).await
}

async fn store_on(root: &Path) -> (Process, Client) {
    let store = Process::spawn(root);
    let client = connect(&store.addr).await;
    (store, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_synchronous_put_costs_one_fsync_not_two() {
    with_fuse("put_journal_test", || async {
        let backing = tempfile::tempdir().unwrap();
        let disk = Mounted::new(backing.path()).unwrap();
        let (_store, mut client) = store_on(disk.path()).await;
        create_project(&mut client, PROJECT).await;
        put(&mut client, PROJECT, "out/first.txt", b"warm").await.unwrap();
        const PUTS: u64 = 20;
        let before = disk.fsyncs();
        for i in 0..PUTS {
            let body = format!("file {i}\n").repeat(400);
            put(&mut client, PROJECT, &format!("out/f{i}.txt"), body.as_bytes())
                .await
                .unwrap();
        }
        let after = disk.fsyncs();
        let (files, dirs) = (after.0 - before.0, after.1 - before.1);
        println!("{PUTS} small Puts: {files} file and {dirs} directory fsyncs");
        // Before the journal: one fsync of each file and one of its directory per Put.
        assert!(
            files <= PUTS && dirs == 0,
            "{PUTS} small Puts made {files} file and {dirs} directory fsyncs: each should cost one fdatasync of the journal"
        );
    })
    .await;
}

/// Journaled writes, then writes that replace or remove some of them:
/// `gone` is journaled then deleted, `big` journaled then replaced by a body too large for the
/// journal, `twice` journaled twice, `once` journaled once.
async fn write_then_replace(client: &mut Client) {
    create_project(client, PROJECT).await;
    for path in ["a/gone.txt", "b/big.txt", "c/twice.txt", "d/once.txt"] {
        put(client, PROJECT, path, format!("v1 of {path}").as_bytes())
            .await
            .unwrap();
    }
    let deleted = client
        .delete(DeleteRequest {
            project_id: PROJECT.into(),
            path: "a/gone.txt".into(),
            run_id: String::new(),
        })
        .await
        .unwrap();
    assert!(deleted.into_inner().deleted);
    let overwrite = |path: &str| PutHeader {
        overwrite: true,
        ..header(PROJECT, path)
    };
    put_with(client, overwrite("b/big.txt"), &big_body())
        .await
        .unwrap();
    put_with(client, overwrite("c/twice.txt"), b"v2 of c/twice.txt")
        .await
        .unwrap();
}

fn big_body() -> Vec<u8> {
    b"0123456789abcdef".repeat(200 << 6)
}

async fn check_replaced(client: &mut Client, context: &str) {
    let gone = get(client, PROJECT, "a/gone.txt").await;
    assert_eq!(
        gone.as_ref().map_err(|s| s.code()),
        Err(Code::NotFound),
        "{context}: a deleted file came back"
    );
    assert!(
        get(client, PROJECT, "b/big.txt").await.unwrap() == big_body(),
        "{context}: the large overwrite was undone"
    );
    assert_eq!(
        get(client, PROJECT, "c/twice.txt").await.unwrap(),
        b"v2 of c/twice.txt",
        "{context}"
    );
    assert_eq!(
        get(client, PROJECT, "d/once.txt").await.unwrap(),
        b"v1 of d/once.txt",
        "{context}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journaled_write_is_redone_after_a_cut_but_never_over_a_later_write() {
    with_fuse("put_journal_test", || async {
        let backing = tempfile::tempdir().unwrap();
        let disk = Mounted::new(backing.path()).unwrap();
        let (mut store, mut client) = store_on(disk.path()).await;
        write_then_replace(&mut client).await;
        disk.cut_now();
        store.kill9();
        let survived = disk.scratch("cut").join("survived");
        disk.materialise(&survived).unwrap();
        let (_store, mut client) = store_on(&survived).await;
        check_replaced(&mut client, "after a power cut").await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_never_brings_back_what_a_later_write_replaced() {
    // No power cut: every file is still in the page cache, so the journal's records are all
    // redone over what is there; the ones a later write replaced must not be.
    let root = tempfile::tempdir().unwrap();
    let (mut store, mut client) = store_on(root.path()).await;
    write_then_replace(&mut client).await;
    store.kill9();
    let (_store, mut client) = store_on(root.path()).await;
    check_replaced(&mut client, "after kill -9").await;
    // A second restart finds a journal with nothing to redo, and the same files.
    drop(_store);
    let (_store, mut client) = store_on(root.path()).await;
    check_replaced(&mut client, "after a second restart").await;
}

/// What one writer's path holds: bytes, or nothing (deleted).
type Held = Option<Vec<u8>>;

type Calls = Arc<Mutex<HashMap<String, Held>>>;

/// Checks that each path holds what its last acknowledged call left, or what the call under
/// way when the store went would have left; returns how many paths were checked.
async fn check_acked(client: &mut Client, acked: &Calls, flight: &Calls, context: &str) -> usize {
    let (acked, flight) = (
        acked.lock().unwrap().clone(),
        flight.lock().unwrap().clone(),
    );
    let mut checked = 0;
    for (path, want) in &acked {
        let got: Held = match get(client, PROJECT, path).await {
            Ok(bytes) => Some(bytes),
            Err(s) if s.code() == Code::NotFound => None,
            Err(s) => panic!("{context}: {path}: {s:?}"),
        };
        let allowed = got == *want || flight.get(path).is_some_and(|f| *f == got);
        assert!(
            allowed,
            "{context}: {path} holds {:?} bytes; its last acknowledged call left {:?} (call under way: {:?})",
            got.as_ref().map(|b| b.len()),
            want.as_ref().map(|b| b.len()),
            flight.get(path).map(|f| f.as_ref().map(|b| b.len()))
        );
        checked += 1;
    }
    checked
}

/// One writer's sequence: Puts (new bytes each time, overwriting) of its own few paths, now
/// and then a Delete. `acked` keeps, per path, what its last acknowledged call left there,
/// and `flight` what the call under way would leave (when the power goes, that call may or may
/// not have landed).
async fn writer(mut client: Client, w: usize, acked: Calls, flight: Calls) {
    for k in 0..100_000usize {
        let path = format!("w{w}/f{}.txt", k % 7);
        let next: Held = match k % 11 {
            10 => None,
            _ => Some(
                format!("writer {w} call {k}\n")
                    .repeat(1 + k % 300)
                    .into_bytes(),
            ),
        };
        flight.lock().unwrap().insert(path.clone(), next.clone());
        let done = match &next {
            Some(bytes) => {
                let h = PutHeader {
                    overwrite: true,
                    ..header(PROJECT, &path)
                };
                put_with(&mut client, h, bytes).await.map(|_| ())
            }
            None => client
                .delete(DeleteRequest {
                    project_id: PROJECT.into(),
                    path: path.clone(),
                    run_id: String::new(),
                })
                .await
                .map(|_| ()),
        };
        if done.is_err() {
            return;
        }
        acked.lock().unwrap().insert(path.clone(), next);
        flight.lock().unwrap().remove(&path);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_amid_concurrent_small_puts_and_deletes_keep_every_acknowledged_call() {
    with_fuse("put_journal_test", || async {
        for round in 0..3u64 {
            let backing = tempfile::tempdir().unwrap();
            let disk = Mounted::new(backing.path()).unwrap();
            let (mut store, mut client) = store_on(disk.path()).await;
            create_project(&mut client, PROJECT).await;
            let acked = Arc::new(Mutex::new(HashMap::new()));
            let flight = Arc::new(Mutex::new(HashMap::new()));
            let tasks: Vec<_> = (0..6)
                .map(|w| tokio::spawn(writer(client.clone(), w, acked.clone(), flight.clone())))
                .collect();
            // Enough calls for several checkpoints (each at most 256 files waiting), then a
            // cut at an operation that depends on the round.
            wait_until("every path written and some thousand calls made", || {
                let n = acked.lock().unwrap().len();
                n >= 42 && disk.ops() > 20_000 + round * 7_919
            })
            .await;
            disk.cut_after(1 + round * 37);
            wait_until("the power cut", || disk.is_cut()).await;
            store.kill9();
            for t in tasks {
                t.await.unwrap();
            }
            let survived = disk.scratch("cut").join("survived");
            disk.materialise(&survived).unwrap();
            let (_store, mut client) = store_on(&survived).await;
            let checked =
                check_acked(&mut client, &acked, &flight, &format!("round {round}")).await;
            println!(
                "round {round}: {checked} paths as acknowledged after the cut ({} fsyncs)",
                disk.fsyncs().0
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_amid_concurrent_small_puts_and_deletes_keeps_every_acknowledged_call() {
    // The real process on a real disk, killed at moments that vary with the round and the
    // clock: the journal's records are redone at the restart over the page cache's files,
    // never over a later write.
    let root = tempfile::tempdir().unwrap();
    let (mut store, mut client) = store_on(root.path()).await;
    create_project(&mut client, PROJECT).await;
    let acked: Calls = Arc::default();
    for round in 0..4u64 {
        let flight: Calls = Arc::default();
        let tasks: Vec<_> = (0..6)
            .map(|w| tokio::spawn(writer(client.clone(), w, acked.clone(), flight.clone())))
            .collect();
        let jitter = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_micros() as u64
            % 150_000;
        tokio::time::sleep(std::time::Duration::from_micros(
            200_000 + round * 90_000 + jitter,
        ))
        .await;
        store.kill9();
        for t in tasks {
            t.await.unwrap();
        }
        (store, client) = store_on(root.path()).await;
        let context = format!(
            "round {round}, killed {} ms in",
            200 + round * 90 + jitter / 1000
        );
        let checked = check_acked(&mut client, &acked, &flight, &context).await;
        // What the call under way left is now what stands (it did or did not land).
        let under_way: Vec<String> = flight.lock().unwrap().keys().cloned().collect();
        for path in under_way {
            let now = get(&mut client, PROJECT, &path).await.ok();
            acked.lock().unwrap().insert(path, now);
        }
        println!("{context}: {checked} paths as acknowledged");
    }
}
