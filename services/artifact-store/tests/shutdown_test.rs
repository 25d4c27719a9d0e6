//! SIGTERM ends every open stream: the store process, with a ReadEvents follow stream and a
//! grpc.health.v1 Watch open (neither ends by itself), exits within the drain deadline, and
//! both streams end with UNAVAILABLE (not a cut connection, not OK).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use cairn_proto::v1::{AppendEventsRequest, EventInput, ReadEventsRequest};
use common::{connect, create_project, Process};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// The default drain deadline, plus room for a loaded machine.
const EXIT_WITHIN: Duration = Duration::from_secs(5 + 3);

#[tokio::test]
async fn sigterm_ends_follow_and_health_watch_streams_and_the_process_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Process::spawn(&tmp.path().join("data"));
    let mut c = connect(&store.addr).await;
    create_project(&mut c, "p").await;
    c.append_events(AppendEventsRequest {
        project_id: "p".into(),
        run_id: "r".into(),
        events: vec![EventInput {
            r#type: "run.started".into(),
            ..Default::default()
        }],
        epoch: 0,
        publication_tokens: Vec::new(),
        claim: String::new(),
    })
    .await
    .unwrap();

    let mut follow = c
        .read_events(ReadEventsRequest {
            project_id: "p".into(),
            run_id: "r".into(),
            from_seq: 1,
            follow: true,
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(follow.message().await.unwrap().unwrap().seq, 1);

    let channel = tonic::transport::Endpoint::from_shared(store.addr.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);

    let term = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(store.child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();

    // The follow stream ends with UNAVAILABLE.
    let ended = tokio::time::timeout(EXIT_WITHIN, follow.message())
        .await
        .expect("the follow stream stayed open after SIGTERM");
    let status = ended.expect_err("the follow stream must end with a status, not OK");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shutting down"), "{status:?}");

    // The health watch says NOT_SERVING, then ends with UNAVAILABLE.
    let mut statuses = Vec::new();
    let end = loop {
        match tokio::time::timeout(EXIT_WITHIN, watch.message())
            .await
            .expect("the health watch stayed open after SIGTERM")
        {
            Ok(Some(m)) => statuses.push(m.status),
            Ok(None) => panic!("the health watch ended without a status"),
            Err(s) => break s,
        }
    };
    assert_eq!(end.code(), Code::Unavailable, "{end:?}");
    assert_eq!(statuses.last(), Some(&(ServingStatus::NotServing as i32)));

    // And the process is gone.
    loop {
        if let Some(exit) = store.child.try_wait().unwrap() {
            assert!(exit.success(), "{exit:?}");
            break;
        }
        assert!(
            term.elapsed() < EXIT_WITHIN,
            "the store was still running {:?} after SIGTERM",
            term.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
