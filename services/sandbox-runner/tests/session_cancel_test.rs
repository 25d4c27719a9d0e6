//! Sessions that never finish opening leave nothing behind, over gRPC on every
//! backend: the client dropping OpenSession mid-clone, CloseSession while opening, and
//! cancels landing at any point of an empty open. The slow source is a git:// server on
//! 127.0.0.1 that accepts and never answers, so the clone hangs until stopped.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use cairn_proto as pb;
use common::*;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// A git:// server that accepts connections and holds them silent. Returns the repo URL and
/// a receiver told of each connection (the clone has started).
async fn silent_git_server() -> (String, mpsc::UnboundedReceiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
            let _ = tx.send(());
        }
    });
    (format!("git://127.0.0.1:{port}/repo.git"), rx)
}

fn slow_open(id: &str, url: &str) -> pb::OpenSessionRequest {
    pb::OpenSessionRequest {
        session_id: id.into(),
        git: Some(pb::GitSource {
            url: url.into(),
            r#ref: String::new(),
        }),
        ..Default::default()
    }
}

fn task_dirs(r: &TestRunner) -> Vec<String> {
    std::fs::read_dir(r.work_root.path().join("tasks"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Waits (up to 15 s) until the runner has no task directory, no container and no git
/// process on `url`; panics with what is left.
async fn wait_clean(r: &TestRunner, url: Option<&str>) {
    let t0 = Instant::now();
    loop {
        let dirs = task_dirs(r);
        let containers = if r.case.docker() {
            containers_of(r.handle.runner_id()).await
        } else {
            Vec::new()
        };
        let gits = url.map(processes_with).unwrap_or_default();
        if dirs.is_empty() && containers.is_empty() && gits.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{:?}: left behind: task dirs {dirs:?}, containers {containers:?}, git processes {gits:?}",
            r.case
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With max_sessions = 1: another session opens (the slot is free), then closes.
async fn slot_is_free(r: &TestRunner) {
    let mut c = r.client.clone();
    let t0 = Instant::now();
    let info = loop {
        match c
            .open_session(pb::OpenSessionRequest {
                // Unique: container names are shared by the tests running at once.
                session_id: format!("next-{}", std::process::id()),
                ..Default::default()
            })
            .await
        {
            Ok(info) => break info.into_inner(),
            // The slot is freed right after the directory goes: allow that moment.
            Err(s)
                if s.code() == tonic::Code::ResourceExhausted
                    && t0.elapsed() < Duration::from_secs(2) =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(s) => panic!("{:?}: the slot is still taken: {s}", r.case),
        }
    };
    let closed = c
        .close_session(pb::CloseSessionRequest {
            session_id: info.session_id,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(closed.closed);
    wait_clean(r, None).await;
}

type OpenCall = tokio::task::JoinHandle<Result<tonic::Response<pb::SessionInfo>, tonic::Status>>;

/// Starts OpenSession `id` from a silent git source and returns once git is cloning (the
/// task directory is made); gives the source URL and the call in flight.
async fn open_mid_clone(r: &TestRunner, id: &str) -> (String, OpenCall) {
    let (url, mut connected) = silent_git_server().await;
    let mut c = r.client.clone();
    let req = slow_open(id, &url);
    let call = tokio::spawn(async move { c.open_session(req).await });
    tokio::time::timeout(Duration::from_secs(10), connected.recv())
        .await
        .expect("git never connected to the slow source");
    assert_eq!(task_dirs(r), vec![id.to_string()], "{:?}", r.case);
    assert!(
        !processes_with(&url).is_empty(),
        "{:?}: git is not cloning",
        r.case
    );
    (url, call)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_open_mid_clone_leaves_nothing() {
    for case in cold_backends("dropped_open_mid_clone").await {
        let r = TestRunner::start_with(case, |c| c.max_sessions = 1).await;
        let (url, call) = open_mid_clone(&r, "slow-drop").await;
        // The client goes away: the call is dropped and the stream reset.
        call.abort();
        let _ = call.await;
        wait_clean(&r, Some(&url)).await;
        slot_is_free(&r).await;
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deadline_on_open_leaves_nothing() {
    for case in cold_backends("deadline_on_open").await {
        let r = TestRunner::start_with(case, |c| c.max_sessions = 1).await;
        let (url, _connected) = silent_git_server().await;
        let mut req = tonic::Request::new(slow_open("slow-deadline", &url));
        req.set_timeout(Duration::from_millis(400));
        let err = r.client.clone().open_session(req).await.unwrap_err();
        assert!(
            matches!(
                err.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
            "{case:?}: {err}"
        );
        wait_clean(&r, Some(&url)).await;
        slot_is_free(&r).await;
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn close_while_opening_closes_it() {
    for case in cold_backends("close_while_opening").await {
        let r = TestRunner::start_with(case, |c| c.max_sessions = 1).await;
        let (url, call) = open_mid_clone(&r, "slow-close").await;
        let closed = r
            .client
            .clone()
            .close_session(pb::CloseSessionRequest {
                session_id: "slow-close".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(closed.closed, "{case:?}: a session still opening is closed");
        // CloseSession answers once the teardown is done.
        assert!(task_dirs(&r).is_empty(), "{case:?}: {:?}", task_dirs(&r));
        let opened = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("OpenSession did not end after CloseSession")
            .unwrap();
        let err = opened.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Aborted, "{case:?}: {err}");
        assert!(err.message().contains("slow-close"), "{err}");
        wait_clean(&r, Some(&url)).await;
        slot_is_free(&r).await;
        // The id is free again, and closing it now finds nothing.
        let again = r
            .client
            .clone()
            .close_session(pb::CloseSessionRequest {
                session_id: "slow-close".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!again.closed);
        r.stop().await;
    }
}

/// Cancels an empty open after 0 to 300 ms, then closes its id as the orchestrator does: a
/// reply already on its way cannot be taken back, so a client that gave up closes the id.
/// Whether the cancel lands before, during or after the container start, nothing stays and
/// the slot comes free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_at_any_point_of_open_leaves_nothing() {
    for case in cold_backends("cancel_at_any_point_of_open").await {
        let r = TestRunner::start_with(case, |c| c.max_sessions = 1).await;
        for (i, ms) in [0u64, 2, 10, 30, 80, 150, 300].into_iter().enumerate() {
            let id = format!("cut-{i}-{}", std::process::id());
            let req = pb::OpenSessionRequest {
                session_id: id.clone(),
                ..Default::default()
            };
            let mut c = r.client.clone();
            let answered =
                tokio::time::timeout(Duration::from_millis(ms), c.open_session(req)).await;
            let closed = c
                .close_session(pb::CloseSessionRequest { session_id: id })
                .await
                .unwrap()
                .into_inner();
            if let Ok(Ok(_)) = answered {
                assert!(closed.closed, "{case:?}: an open session is closed");
            }
            wait_clean(&r, None).await;
        }
        slot_is_free(&r).await;
        r.stop().await;
    }
}
