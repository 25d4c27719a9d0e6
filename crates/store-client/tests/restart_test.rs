//! The real client across a store restart: a deferred Put whose file the restart lost is
//! written again before the events that name it commit. The store runs in-process on
//! loopback behind a layer that records what each AppendEvents carried.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_proto::v1::{AppendEventsRequest, EventInput};
use cairn_server::retry::Dependency;
use cairn_store_client::{is_publication_unproven, PutOptions, Store, STORE};
use http_body_util::BodyExt;
use prost::Message;
use tonic::body::Body;

const APPEND: &str = "/cairn.v1.ArtifactStore/AppendEvents";

/// The AppendEvents requests the store received, decoded from the wire.
type Seen = Arc<Mutex<Vec<AppendEventsRequest>>>;

#[derive(Clone)]
struct Record<S> {
    inner: S,
    seen: Seen,
}

impl<S> tower::Service<http::Request<Body>> for Record<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let mut inner = self.inner.clone();
        let seen = self.seen.clone();
        Box::pin(async move {
            if req.uri().path() != APPEND {
                return inner.call(req).await;
            }
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await.unwrap().to_bytes();
            // One uncompressed gRPC message: flag, length, then the message.
            assert_eq!(bytes[0], 0, "compressed AppendEvents");
            seen.lock()
                .unwrap()
                .push(AppendEventsRequest::decode(&bytes[5..]).unwrap());
            let body = Body::new(http_body_util::Full::new(bytes));
            inner.call(http::Request::from_parts(parts, body)).await
        })
    }
}

#[derive(Clone)]
struct RecordLayer(Seen);

impl<S> tower::Layer<S> for RecordLayer {
    type Service = Record<S>;
    fn layer(&self, inner: S) -> Record<S> {
        Record {
            inner,
            seen: self.0.clone(),
        }
    }
}

/// The store served in-process on a fixed address until `stop`.
struct Served {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn serve(addr: &str, root: &std::path::Path, seen: &Seen) -> Served {
    let deadline = Instant::now() + Duration::from_secs(10);
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) if Instant::now() > deadline => panic!("cannot bind {addr} again: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let service =
        cairn_artifact_store::artifact_store_service(cairn_artifact_store::Config::new(root))
            .await
            .unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let layer = RecordLayer(seen.clone());
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(service)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async move {
                    let _ = rx.await;
                },
            )
            .await
            .unwrap();
    });
    Served { stop, task }
}

impl Served {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

fn event(kind: &str) -> EventInput {
    EventInput {
        r#type: kind.to_owned(),
        data_json: r#"{"path":"docs/a.md"}"#.to_owned(),
        ..Default::default()
    }
}

async fn wait_for(path: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_lost_in_a_store_restart_is_written_again_before_its_events_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let seen = Seen::default();
    let store = serve(&addr, tmp.path(), &seen).await;
    let client = Store::connect(&addr)
        .unwrap()
        .riding_out(Dependency::new(STORE, Duration::from_secs(20)));
    let opts = PutOptions {
        run_id: "r1".into(),
        with_run_events: true,
        ..PutOptions::default()
    };
    let put = client
        .put("p", "docs/a.md", Bytes::from_static(b"hello"), &opts)
        .await
        .unwrap();
    assert!(
        !put.publication_token.is_empty(),
        "a deferred Put has a token"
    );
    let file = tmp.path().join("projects/p/docs/a.md");
    wait_for(&file).await;

    // The store restarts; the directory entry it had not made durable yet is gone (as after
    // a power cut).
    store.stop().await;
    std::fs::remove_file(&file).unwrap();
    let store = serve(&addr, tmp.path(), &seen).await;
    // A read (resent while the store is away) brings the client's connection back.
    assert_eq!(client.stat("p", "docs/a.md", false).await.unwrap(), None);

    let err = client
        .append_events("p", "r1", vec![event("doc.written")])
        .await
        .unwrap_err();
    assert!(is_publication_unproven(&err), "{err:?}");
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].publication_tokens, [put.publication_token.as_str()]);
    }
    // Refused, nothing committed; the client wrote the file again.
    let none = client.read_events("p", "r1", 1).await.unwrap_err();
    assert_eq!(none.code(), tonic::Code::NotFound, "{none:?}");
    wait_for(&file).await;

    // The same events sent again commit, with the file on disk.
    let r = client
        .append_events("p", "r1", vec![event("doc.written")])
        .await
        .unwrap();
    assert_eq!((r.first_seq, r.last_seq), (1, 1));
    assert_eq!(std::fs::read(&file).unwrap(), b"hello");
    let events = client.read_events("p", "r1", 1).await.unwrap();
    assert_eq!(events.len(), 1);
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        let resent = &seen[1].publication_tokens;
        assert_eq!(resent.len(), 1, "the rewrite's token only");
        assert_ne!(
            resent[0], put.publication_token,
            "a new token after the rewrite"
        );
    }

    // Proven: the next batch presents nothing.
    client
        .append_events("p", "r1", vec![event("later")])
        .await
        .unwrap();
    assert!(seen.lock().unwrap()[2].publication_tokens.is_empty());
    store.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_restart_the_tokens_are_presented_once_and_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let seen = Seen::default();
    let store = serve(&addr, tmp.path(), &seen).await;
    let client = Store::connect(&addr).unwrap();
    let deferred = PutOptions {
        run_id: "r1".into(),
        with_run_events: true,
        ..PutOptions::default()
    };
    let mut tokens = Vec::new();
    for path in ["a.md", "b.md"] {
        let r = client
            .put("p", path, Bytes::from_static(b"x"), &deferred)
            .await
            .unwrap();
        tokens.push(r.publication_token);
    }
    // A synced Put has nothing to prove.
    let synced = PutOptions {
        run_id: "r1".into(),
        ..PutOptions::default()
    };
    let r = client
        .put("p", "c.md", Bytes::from_static(b"x"), &synced)
        .await
        .unwrap();
    assert!(r.publication_token.is_empty());
    // Another run's events carry none of them.
    client
        .append_events("p", "r2", vec![event("x")])
        .await
        .unwrap();
    client
        .append_events("p", "r1", vec![event("x")])
        .await
        .unwrap();
    client
        .append_events("p", "r1", vec![event("y")])
        .await
        .unwrap();
    let carried: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|r| (r.run_id.clone(), r.publication_tokens.clone()))
        .collect();
    assert_eq!(
        carried,
        [
            ("r2".to_owned(), vec![]),
            ("r1".to_owned(), tokens),
            ("r1".to_owned(), vec![])
        ],
        "each deferred Put's token goes once, with its own run's next events"
    );
    store.stop().await;
}

/// A deferred Put of run r1 on a fresh store and client; the store, the client, what the
/// store received, and the Put's token.
async fn one_deferred_put(tmp: &std::path::Path) -> (Served, Store, Seen, String) {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let seen = Seen::default();
    let store = serve(&addr, tmp, &seen).await;
    let client = Store::connect(&addr).unwrap();
    let deferred = PutOptions {
        run_id: "r1".into(),
        with_run_events: true,
        ..PutOptions::default()
    };
    let token = client
        .put("p", "a.md", Bytes::from_static(b"x"), &deferred)
        .await
        .unwrap()
        .publication_token;
    assert!(!token.is_empty());
    (store, client, seen, token)
}

fn presented(seen: &Seen) -> Vec<Vec<String>> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|r| r.publication_tokens.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_for_another_reason_keeps_its_tokens_and_rewrites_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, client, seen, token) = one_deferred_put(tmp.path()).await;
    let bad = EventInput {
        r#type: "x".to_owned(),
        data_json: "[1]".to_owned(),
        ..Default::default()
    };
    let err = client
        .append_events("p", "r1", vec![bad])
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(!is_publication_unproven(&err));
    // Nothing committed, so the same token (not a rewrite's new one) goes with the next batch.
    client
        .append_events("p", "r1", vec![event("x")])
        .await
        .unwrap();
    assert_eq!(presented(&seen), [[token.clone()], [token]]);
    store.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_forgets_its_claim_drops_its_runs_tokens_and_an_older_epoch_does_not() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, client, seen, token) = one_deferred_put(tmp.path()).await;
    assert_eq!(client.ingest_claim("p", "r1").await.unwrap(), None);
    let (epoch, _) = client.claim_run("p", "r1").await.unwrap();
    // The store grants an ingest claim for the run this process now drives.
    let claim = client.ingest_claim("p", "r1").await.unwrap();
    assert!(claim.is_some_and(|c| !c.is_empty()));
    // Not the claim this process holds: nothing is forgotten.
    client.forget_claim("p", "r1", epoch + 1);
    assert!(client.run_fence("p", "r1").is_some());
    client
        .append_events_fenced("p", "r1", vec![event("x")], epoch)
        .await
        .unwrap();
    let deferred = PutOptions {
        run_id: "r1".into(),
        with_run_events: true,
        ..PutOptions::default()
    };
    client
        .put("p", "b.md", Bytes::from_static(b"y"), &deferred)
        .await
        .unwrap();
    // The driver ended: its claim and the Puts no event of it named are forgotten.
    client.forget_claim("p", "r1", epoch);
    assert!(client.run_fence("p", "r1").is_none());
    assert_eq!(client.ingest_claim("p", "r1").await.unwrap(), None);
    client
        .append_events("p", "r1", vec![event("y")])
        .await
        .unwrap();
    assert_eq!(presented(&seen), [vec![token], vec![]]);
    store.stop().await;
}
