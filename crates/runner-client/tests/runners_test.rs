//! Client-side balancing over sandbox runners (cairn-runner-client) against fake runners served
//! over real gRPC on loopback: round-robin, retry on another runner when one is Unavailable,
//! ejection by health checks and readmission, and DNS names that stand for several addresses
//! (an injected resolver over 127.0.0.1 and 127.0.0.2, and the system resolver's localhost).
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_proto::v1 as pb;
use cairn_proto::v1::sandbox_runner_server::{SandboxRunner, SandboxRunnerServer};
use cairn_runner_client::{Balancing, Resolver, Runners};
use futures::Stream;
use tonic::{Code, Request, Response, Status};

type Reply<T> = Result<Response<T>, Status>;
type Streamed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A runner that answers Run with its name, or Unavailable when told to.
#[derive(Clone)]
struct Fake {
    name: String,
    calls: Arc<AtomicUsize>,
    unavailable: Arc<AtomicBool>,
}

#[tonic::async_trait]
impl SandboxRunner for Fake {
    async fn run(&self, _: Request<pb::RunRequest>) -> Reply<pb::RunResult> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.unavailable.load(Ordering::SeqCst) {
            return Err(Status::unavailable("the runner is shutting down"));
        }
        Ok(Response::new(pb::RunResult {
            runner_id: self.name.clone(),
            ..Default::default()
        }))
    }
    type RunStreamStream = Streamed<pb::RunStreamResponse>;
    async fn run_stream(&self, _: Request<pb::RunRequest>) -> Reply<Self::RunStreamStream> {
        Err(Status::unimplemented("fake"))
    }
    async fn open_session(&self, _: Request<pb::OpenSessionRequest>) -> Reply<pb::SessionInfo> {
        Err(Status::unimplemented("fake"))
    }
    async fn exec(&self, _: Request<pb::ExecRequest>) -> Reply<pb::ExecResult> {
        Err(Status::unimplemented("fake"))
    }
    async fn read_file(&self, _: Request<pb::ReadFileRequest>) -> Reply<pb::ReadFileResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn write_file(&self, _: Request<pb::WriteFileRequest>) -> Reply<pb::WriteFileResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn glob(&self, _: Request<pb::GlobRequest>) -> Reply<pb::GlobResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn grep(&self, _: Request<pb::GrepRequest>) -> Reply<pb::GrepResponse> {
        Err(Status::unimplemented("fake"))
    }
    type PackStream = Streamed<pb::PackResponse>;
    async fn pack(&self, _: Request<pb::PackRequest>) -> Reply<Self::PackStream> {
        Err(Status::unimplemented("fake"))
    }
    async fn close_session(
        &self,
        _: Request<pb::CloseSessionRequest>,
    ) -> Reply<pb::CloseSessionResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn touch_session(
        &self,
        _: Request<pb::TouchSessionRequest>,
    ) -> Reply<pb::TouchSessionResponse> {
        Err(Status::unimplemented("fake"))
    }
    type PauseSessionStream = Streamed<pb::SnapshotPart>;
    async fn pause_session(
        &self,
        _: Request<pb::PauseSessionRequest>,
    ) -> Reply<Self::PauseSessionStream> {
        Err(Status::unimplemented("fake"))
    }
    async fn resume_session(
        &self,
        _: Request<tonic::Streaming<pb::SnapshotPart>>,
    ) -> Reply<pb::SessionInfo> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_runner_info(&self, _: Request<pb::GetRunnerInfoRequest>) -> Reply<pb::RunnerInfo> {
        Err(Status::unimplemented("fake"))
    }
}

/// A fake runner serving on `addr`, with grpc.health.v1 under the test's control.
struct Served {
    fake: Fake,
    addr: SocketAddr,
    health: tonic_health::server::HealthReporter,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<tokio::task::JoinHandle<()>>,
}

impl Served {
    async fn start(name: &str, addr: SocketAddr) -> std::io::Result<Served> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let fake = Fake {
            name: name.to_owned(),
            calls: Default::default(),
            unavailable: Default::default(),
        };
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<SandboxRunnerServer<Fake>>().await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(SandboxRunnerServer::new(fake.clone()))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                async {
                    let _ = stopped.await;
                },
            );
        let join = tokio::spawn(async move {
            let _ = server.await;
        });
        Ok(Served {
            fake,
            addr,
            health,
            stop: Some(stop),
            join: Some(join),
        })
    }

    fn calls(&self) -> usize {
        self.fake.calls.load(Ordering::SeqCst)
    }

    async fn set_serving(&self, serving: bool) {
        if serving {
            self.health.set_serving::<SandboxRunnerServer<Fake>>().await;
        } else {
            self.health
                .set_not_serving::<SandboxRunnerServer<Fake>>()
                .await;
        }
    }

    /// Stops the server: the address refuses connections from now on.
    async fn kill(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        // Graceful: open connections get GOAWAY and close, so clients see the runner gone.
        if let Some(mut j) = self.join.take() {
            if tokio::time::timeout(Duration::from_secs(5), &mut j)
                .await
                .is_err()
            {
                j.abort();
            }
        }
    }
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

const QUICK: Balancing = Balancing {
    health_interval: Duration::from_millis(50),
    resolve_interval: Duration::from_millis(50),
};

async fn run(runners: &Runners) -> Result<String, Status> {
    runners
        .run(pb::RunRequest::default())
        .await
        .map(|(r, _addr)| r.runner_id)
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 5 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn healthy(runners: &Runners, addr: SocketAddr) -> Option<bool> {
    let want = addr.to_string();
    runners
        .endpoints()
        .into_iter()
        .find(|(a, _)| a.trim_start_matches("http://") == want)
        .map(|(_, h)| h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_round_robin_and_an_unavailable_runner_passes_them_on() {
    let a = Served::start("a", loopback()).await.unwrap();
    let b = Served::start("b", loopback()).await.unwrap();
    let addrs = vec![a.addr.to_string(), format!("http://{}", b.addr)];
    // No health check in the test's time: only the refusal ejects.
    let slow = Balancing {
        health_interval: Duration::from_secs(60),
        resolve_interval: Duration::from_secs(60),
    };
    let runners = Runners::start(&addrs, slow).await.unwrap();
    let mut by = Vec::new();
    for _ in 0..10 {
        by.push(run(&runners).await.unwrap());
    }
    assert_eq!(by.iter().filter(|r| *r == "a").count(), 5, "{by:?}");
    assert_eq!(by.iter().filter(|r| *r == "b").count(), 5, "{by:?}");

    // `a` refuses with Unavailable (draining): every request still succeeds, on `b`.
    a.fake.unavailable.store(true, Ordering::SeqCst);
    for _ in 0..10 {
        assert_eq!(run(&runners).await.unwrap(), "b");
    }
    // Ejected at its first refusal: one call, not the 5 of its turns.
    assert_eq!(a.calls(), 5 + 1);
    assert_eq!(healthy(&runners, a.addr), Some(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_failing_its_health_check_gets_no_work_until_it_passes() {
    let a = Served::start("a", loopback()).await.unwrap();
    let b = Served::start("b", loopback()).await.unwrap();
    let runners = Runners::start(&[a.addr.to_string(), b.addr.to_string()], QUICK)
        .await
        .unwrap();
    a.set_serving(false).await;
    eventually("a ejected", || healthy(&runners, a.addr) == Some(false)).await;
    let before = a.calls();
    for _ in 0..8 {
        assert_eq!(run(&runners).await.unwrap(), "b");
    }
    assert_eq!(a.calls(), before, "an ejected runner gets no request");

    a.set_serving(true).await;
    eventually("a readmitted", || healthy(&runners, a.addr) == Some(true)).await;
    let mut by = Vec::new();
    for _ in 0..4 {
        by.push(run(&runners).await.unwrap());
    }
    assert!(by.contains(&"a".to_owned()), "{by:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_runner_is_ejected_and_its_work_goes_to_the_others() {
    let mut a = Served::start("a", loopback()).await.unwrap();
    let b = Served::start("b", loopback()).await.unwrap();
    let runners = Runners::start(&[a.addr.to_string(), b.addr.to_string()], QUICK)
        .await
        .unwrap();
    assert_eq!(run(&runners).await.unwrap(), "a");
    a.kill().await;
    for _ in 0..6 {
        assert_eq!(run(&runners).await.unwrap(), "b");
    }
    eventually("a ejected", || healthy(&runners, a.addr) == Some(false)).await;

    // With every runner down, the error says which were tried.
    let mut b = b;
    b.kill().await;
    let e = run(&runners).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(
        e.message().contains(&a.addr.to_string()) && e.message().contains(&b.addr.to_string()),
        "{e:?}"
    );
}

/// A resolver whose answer the test changes.
fn fake_resolver(answer: Arc<Mutex<std::io::Result<Vec<IpAddr>>>>) -> (Resolver, Arc<AtomicUsize>) {
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    let resolver: Resolver = Arc::new(move |host_port: String| {
        count.fetch_add(1, Ordering::SeqCst);
        let answer = match &*answer.lock().unwrap() {
            Ok(ips) => Ok(ips.clone()),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        };
        Box::pin(async move {
            assert!(host_port.starts_with("runners.cairn.test:"), "{host_port}");
            // Only the IPs count: the port is the configured one.
            answer.map(|ips| ips.into_iter().map(|ip| SocketAddr::new(ip, 1)).collect())
        })
    });
    (resolver, asked)
}

/// Two fake runners on one port at 127.0.0.1 and 127.0.0.2 (both loopback), as the pods
/// behind a headless Service are.
async fn two_on_one_port() -> (Served, Served) {
    for _ in 0..20 {
        let a = Served::start("one", loopback()).await.unwrap();
        let second: SocketAddr = SocketAddr::new("127.0.0.2".parse().unwrap(), a.addr.port());
        if let Ok(b) = Served::start("two", second).await {
            return (a, b);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_name_stands_for_every_address_and_is_resolved_again() {
    let (one, _two) = two_on_one_port().await;
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let answer = Arc::new(Mutex::new(Ok(vec![ip("127.0.0.1"), ip("127.0.0.2")])));
    let (resolver, asked) = fake_resolver(answer.clone());
    let name = format!("dns:///runners.cairn.test:{}", one.addr.port());
    let runners = Runners::start_with_resolver(&[name], QUICK, resolver)
        .await
        .unwrap();
    let mut by = Vec::new();
    for _ in 0..6 {
        by.push(run(&runners).await.unwrap());
    }
    assert_eq!(by.iter().filter(|r| *r == "one").count(), 3, "{by:?}");
    assert_eq!(by.iter().filter(|r| *r == "two").count(), 3, "{by:?}");

    // A pod goes away: the next resolution drops its address.
    *answer.lock().unwrap() = Ok(vec![ip("127.0.0.2")]);
    eventually("re-resolved to one address", || {
        runners.endpoints().len() == 1
    })
    .await;
    for _ in 0..4 {
        assert_eq!(run(&runners).await.unwrap(), "two");
    }

    // DNS fails, then answers nothing: the last good addresses stay.
    *answer.lock().unwrap() = Err(std::io::Error::other("SERVFAIL"));
    let n = asked.load(Ordering::SeqCst);
    eventually("asked again", || asked.load(Ordering::SeqCst) > n + 1).await;
    assert_eq!(run(&runners).await.unwrap(), "two");
    *answer.lock().unwrap() = Ok(vec![]);
    let n = asked.load(Ordering::SeqCst);
    eventually("asked again", || asked.load(Ordering::SeqCst) > n + 1).await;
    assert_eq!(runners.endpoints().len(), 1);
    assert_eq!(run(&runners).await.unwrap(), "two");

    // The pod is back (a new one scaled up): both get work again.
    *answer.lock().unwrap() = Ok(vec![ip("127.0.0.1"), ip("127.0.0.2")]);
    eventually("both addresses again", || runners.endpoints().len() == 2).await;
    let mut by = Vec::new();
    for _ in 0..4 {
        by.push(run(&runners).await.unwrap());
    }
    assert!(
        by.contains(&"one".to_owned()) && by.contains(&"two".to_owned()),
        "{by:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_with_no_address_yet_is_resolved_when_work_arrives() {
    let one = Served::start("one", loopback()).await.unwrap();
    let answer = Arc::new(Mutex::new(Ok(vec![])));
    let (resolver, _) = fake_resolver(answer.clone());
    let slow = Balancing {
        health_interval: Duration::from_secs(60),
        resolve_interval: Duration::from_secs(60),
    };
    let name = format!("runners.cairn.test:{}", one.addr.port());
    let runners = Runners::start_with_resolver(&[name], slow, resolver)
        .await
        .unwrap();
    assert!(!runners.is_empty(), "a name is configured");
    let e = run(&runners).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.message().contains("resolved to no address"), "{e:?}");

    // The runner's pod became ready: the next request resolves again, without waiting.
    *answer.lock().unwrap() = Ok(vec!["127.0.0.1".parse().unwrap()]);
    assert_eq!(run(&runners).await.unwrap(), "one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localhost_goes_through_the_system_resolver() {
    let one = Served::start("one", loopback()).await.unwrap();
    let runners = Runners::start(&[format!("localhost:{}", one.addr.port())], QUICK)
        .await
        .unwrap();
    let endpoints = runners.endpoints();
    assert!(
        endpoints.iter().any(|(a, _)| *a == one.addr.to_string()),
        "localhost resolved to 127.0.0.1: {endpoints:?}"
    );
    // Whatever else localhost resolves to here (::1 with nothing listening) is ejected or
    // skipped: every request lands.
    for _ in 0..4 {
        assert_eq!(run(&runners).await.unwrap(), "one");
    }
}

#[tokio::test]
async fn bad_addresses_are_refused_with_the_reason() {
    for (addr, reason) in [
        ("runner-without-port", "no port"),
        ("runner:http", "not a number"),
        ("dns:///10.1.2.3:7070", "needs a name"),
        ("unix:///var/run/runner.sock", "only http"),
        (":7070", "no host"),
    ] {
        let e = Runners::start(&[addr.to_owned()], QUICK).await.err();
        let e = e.unwrap_or_else(|| panic!("{addr} accepted")).to_string();
        assert!(e.contains(reason) && e.contains(addr), "{addr}: {e}");
    }
    let none = Runners::start(&[], QUICK).await.unwrap();
    assert!(none.is_empty());
    let e = run(&none).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("sandbox_addrs"), "{e:?}");
}
