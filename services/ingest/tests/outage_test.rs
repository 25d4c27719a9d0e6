//! Ingest rides out a store outage: an ingest sent while the store is down waits for it (calls
//! resent with backoff within `dependency_outage_s`) and writes every block once the store is
//! up; readiness is NOT_SERVING while the store is unreachable and SERVING after, liveness
//! SERVING throughout.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use cairn_proto::v1::{BlockStatus, Level};
use common::{request, Ingest};

async fn serving(addr: &str, service: &str) -> Option<bool> {
    let channel = cairn_server::connect(addr).unwrap();
    cairn_server::serving(channel, service, Duration::from_secs(2))
        .await
        .ok()
}

async fn wait_serving(addr: &str, service: &str, want: bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while serving(addr, service).await != Some(want) {
        assert!(
            Instant::now() < deadline,
            "health of {service:?} never became serving={want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_sent_while_the_store_is_down_completes_when_it_is_back() {
    let store_addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut config = common::config(&format!("http://{store_addr}"));
    config.dependency_outage_s = 30;
    let mut ingest = Ingest::start(config).await;
    let ingest_addr = ingest.server.addr.to_string();

    wait_serving(&ingest_addr, "", false).await;
    wait_serving(&ingest_addr, "cairn.v1.Ingest", false).await;
    assert_eq!(
        serving(&ingest_addr, cairn_server::LIVENESS).await,
        Some(true)
    );

    let doc = "```py file=a.py\nA\n```\n```py file=b/c.py\nC\n```\n";
    let mut client = ingest.client.clone();
    let call =
        tokio::spawn(async move { client.ingest(request("demo", "r1", doc.as_bytes())).await });

    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !call.is_finished(),
        "the ingest gave up while the store was down"
    );
    let data_root = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind(&store_addr).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let store = tokio::spawn(cairn_artifact_store::serve(
        cairn_artifact_store::Config::new(data_root.path()),
        listener,
        async {
            let _ = stopped.await;
        },
    ));

    let reply = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("the ingest did not finish once the store was back")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(reply.level(), Level::Info, "{:?}", reply.errors);
    assert!(reply
        .artifacts
        .iter()
        .all(|a| a.status() == BlockStatus::Written));
    assert!(!reply.manifest_path.is_empty());
    let ws = data_root.path().join("projects/demo/workspace");
    assert_eq!(std::fs::read(ws.join("a.py")).unwrap(), b"A\n");
    assert_eq!(std::fs::read(ws.join("b/c.py")).unwrap(), b"C\n");
    wait_serving(&ingest_addr, "", true).await;

    let _ = stop.send(());
    store.await.unwrap().unwrap();
    ingest.server.stop().await;
}
