//! Admission that queues, over gRPC on loopback (local backend): above max_concurrent_runs a
//! Run or OpenSession waits for a slot, first come first served; a full queue or a wait past
//! queue_timeout_ms is refused RESOURCE_EXHAUSTED with RetryInfo; a waiting call whose
//! deadline passes or whose client cancels leaves the queue and takes no slot.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use cairn_proto::{run_stream_response::Msg, OpenSessionRequest, RunStreamResponse};
use cairn_sandbox_runner::{BackendChoice, Config};
use common::*;
use tonic::{Code, Streaming};

/// A local runner with one slot; None (with a SKIP line) without bubblewrap.
async fn one_slot_runner(test: &str, tweak: impl FnOnce(&mut Config)) -> Option<TestRunner> {
    if let Err(reason) = bwrap_ready() {
        println!("SKIP: {test} [local]: {reason}");
        return None;
    }
    let case = Case {
        backend: BackendChoice::Local,
        pool: false,
    };
    Some(
        TestRunner::start_with(case, |c| {
            c.max_concurrent_runs = 1;
            tweak(c);
        })
        .await,
    )
}

/// Starts a run that holds the only slot for `secs` seconds; returns once its program runs.
async fn hold_the_slot(r: &TestRunner, secs: u32) -> Streaming<RunStreamResponse> {
    let req = with_timeout(
        python(&format!(
            "import time\nprint('holding', flush=True)\ntime.sleep({secs})"
        )),
        300_000,
    );
    let mut stream = r.client.clone().run_stream(req).await.unwrap().into_inner();
    loop {
        match stream.message().await.unwrap().unwrap().msg {
            Some(Msg::Heartbeat(_)) => continue,
            Some(Msg::Output(_)) => return stream,
            other => panic!("the holding run ended early: {other:?}"),
        }
    }
}

fn refused_with_retry(status: &tonic::Status, setting: &str) -> bool {
    status.code() == Code::ResourceExhausted
        && status.message().contains(setting)
        && cairn_proto::reason::of(status).as_deref() == Some("max_concurrent_runs")
        && cairn_proto::reason::retry_delay(status).is_some()
}

/// A run and a session above the limit wait for the slot and then go, in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_above_the_limit_wait_for_a_slot_instead_of_failing() {
    let Some(r) = one_slot_runner("queue_waits", |_| {}).await else {
        return;
    };
    let held = Instant::now();
    let holder = hold_the_slot(&r, 2).await;
    let run = tokio::spawn({
        let mut c = r.client.clone();
        async move { c.run(bash("echo queued")).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let session = tokio::spawn({
        let mut c = r.client.clone();
        async move { c.open_session(OpenSessionRequest::default()).await }
    });
    let out = run.await.unwrap().unwrap().into_inner();
    assert_eq!(text(&out.stdout), "queued\n");
    assert!(
        held.elapsed() >= Duration::from_secs(2),
        "the queued run went before the holding run gave its slot back"
    );
    // The session came second: it opens once the queued run is done.
    let session = session.await.unwrap().unwrap().into_inner();
    drop(holder);
    r.client
        .clone()
        .close_session(cairn_proto::CloseSessionRequest {
            session_id: session.session_id,
        })
        .await
        .unwrap();
    r.stop().await;
}

/// A full queue refuses at once, a wait past queue_timeout_ms is refused; both say which
/// setting and carry RetryInfo.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_and_a_long_wait_are_refused_with_retry_info() {
    let Some(r) = one_slot_runner("queue_bound", |c| {
        c.queue_depth = 1;
        c.queue_timeout_ms = 1500;
    })
    .await
    else {
        return;
    };
    let holder = hold_the_slot(&r, 30).await;
    let waiting = Instant::now();
    let first = tokio::spawn({
        let mut c = r.client.clone();
        async move { c.run(bash("echo first")).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    let full = r.client.clone().run(bash("echo second")).await.unwrap_err();
    assert!(refused_with_retry(&full, "queue_depth"), "{full:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "a full queue refuses at once"
    );
    let full = r
        .client
        .clone()
        .open_session(OpenSessionRequest::default())
        .await
        .unwrap_err();
    assert!(refused_with_retry(&full, "queue_depth"), "{full:?}");
    let late = first.await.unwrap().unwrap_err();
    assert!(refused_with_retry(&late, "queue_timeout_ms"), "{late:?}");
    let waited = waiting.elapsed();
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_secs(10),
        "refused after {waited:?}, not after queue_timeout_ms"
    );
    drop(holder);
    r.stop().await;
}

/// A queued Run whose deadline passes, and one whose client goes away, leave the queue and
/// never take the slot: the next caller queues in their place and gets the slot as soon as
/// the holding run ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_run_honours_its_deadline_and_cancellation_and_leaks_nothing() {
    let Some(r) = one_slot_runner("queue_deadline", |c| c.queue_depth = 1).await else {
        return;
    };
    let holder = hold_the_slot(&r, 3).await;

    let mut late = tonic::Request::new(bash("echo late"));
    late.set_timeout(Duration::from_millis(500));
    let t0 = Instant::now();
    let late = r.client.clone().run(late).await.unwrap_err();
    assert!(
        matches!(late.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{late:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "the deadline ended the wait: {:?}",
        t0.elapsed()
    );

    let gone = tokio::spawn({
        let mut c = r.client.clone();
        async move { c.run(bash("echo gone")).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    gone.abort();
    let _ = gone.await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // queue_depth is 1: had either left its place behind, this call would be refused.
    let t0 = Instant::now();
    let next = r.client.clone().run(bash("echo next")).await.unwrap();
    assert_eq!(text(&next.into_inner().stdout), "next\n");
    drop(holder);
    // And the slot went to it when the holder ended, not to a departed caller.
    let after = r.client.clone().run(bash("echo after")).await.unwrap();
    assert_eq!(text(&after.into_inner().stdout), "after\n");
    assert!(t0.elapsed() < Duration::from_secs(20));
    r.stop().await;
}
