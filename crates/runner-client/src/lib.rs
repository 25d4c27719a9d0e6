//! The sandbox runners a caller may use (many runners behind one
//! orchestrator), balanced on the client side, and sessions on one runner (session.rs).
//! Depends on the protos and the shared server/telemetry crates only.
//!
//! Each entry of `sandbox_addrs` is an address (`host:port`, `http://host:port`) or a DNS name
//! (`dns:///name:port` says so explicitly; any host that is not an IP literal is one too). A
//! name stands for every address it resolves to (a Kubernetes headless Service: one per ready
//! runner pod) and is resolved again every `sandbox_resolve_interval_ms`, so runners that
//! come and go are picked up; a failed or empty resolution keeps the last good set.
//!
//! Requests go round-robin over the runners whose last health check (grpc.health.v1, every
//! `sandbox_health_interval_ms`) said SERVING; a runner that fails its check, or answers a
//! call with Unavailable (down, draining, killed mid-call), is ejected until a check passes
//! again, and the request moves on to the next runner. Ejected runners are tried last, so a
//! broken health check never stops the work. Cancelling a run drops the call, which resets
//! the HTTP/2 stream so the runner stops the job.

pub mod session;
pub mod snapshot;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient;
use cairn_proto::v1::{run_stream_response, OutputChunk, RunRequest, RunResult, StdStream};
use cairn_telemetry::TracedChannel;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// The service whose health decides whether a runner gets work.
const HEALTH_SERVICE: &str = "cairn.v1.SandboxRunner";
/// Longest wait for one DNS resolution.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How the runners are watched.
#[derive(Clone, Copy, Debug)]
pub struct Balancing {
    /// Time between health checks of every runner; zero = no health checks and no ejection
    /// (an Unavailable runner only passes the request on).
    pub health_interval: Duration,
    /// Time between resolutions of DNS names; zero = resolve once at start-up (and whenever a
    /// call finds no runner at all).
    pub resolve_interval: Duration,
}

impl Default for Balancing {
    fn default() -> Self {
        Balancing {
            health_interval: Duration::from_secs(2),
            resolve_interval: Duration::from_secs(10),
        }
    }
}

/// Resolves `host:port` to socket addresses (the system resolver unless a test injects one).
pub type Resolver = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>>
        + Send
        + Sync,
>;

/// The system resolver (getaddrinfo through tokio).
pub fn system_resolver() -> Resolver {
    Arc::new(|host_port: String| {
        Box::pin(async move { Ok(tokio::net::lookup_host(host_port).await?.collect()) })
    })
}

/// One entry of `sandbox_addrs`.
#[derive(Debug)]
enum Target {
    /// A fixed address, dialled as given.
    Fixed(String),
    /// A name resolved to every address it has.
    Name {
        spec: String,
        /// `http://` or `https://` when the entry named one ("" = as cairn_server::connect
        /// defaults), kept on each address.
        scheme: &'static str,
        host_port: String,
        port: u16,
    },
}

impl Target {
    fn parse(spec: &str) -> Result<Target, cairn_server::Error> {
        let bad = |reason: &str| cairn_server::Error::Address {
            addr: spec.to_owned(),
            reason: reason.to_owned(),
        };
        let trimmed = spec.trim();
        // The runner hosted in this very process.
        if trimmed.starts_with(cairn_server::inproc::SCHEME) {
            return Ok(Target::Fixed(trimmed.to_owned()));
        }
        let (explicit_dns, rest) = match trimmed.strip_prefix("dns:") {
            Some(r) => (true, r.trim_start_matches('/')),
            None => (false, trimmed),
        };
        let (scheme, authority) = if let Some(r) = rest.strip_prefix("http://") {
            ("http://", r)
        } else if let Some(r) = rest.strip_prefix("https://") {
            ("https://", r)
        } else if rest.contains("://") {
            return Err(bad(
                "only http://, https:// and dns:/// addresses are supported",
            ));
        } else {
            ("", rest)
        };
        let authority = authority.trim_end_matches('/');
        let (host, port) = authority.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        let port: u16 = port.parse().map_err(|_| bad("the port is not a number"))?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if bare.is_empty() {
            return Err(bad("no host"));
        }
        if bare.parse::<IpAddr>().is_ok() {
            if explicit_dns {
                return Err(bad("dns:/// needs a name, not an IP address"));
            }
            // As given: events and logs name the runner the way the operator wrote it.
            return Ok(Target::Fixed(trimmed.to_owned()));
        }
        Ok(Target::Name {
            spec: spec.to_owned(),
            scheme,
            host_port: format!("{bare}:{port}"),
            port,
        })
    }
}

/// One runner address and its connection.
struct Endpoint {
    addr: String,
    channel: Channel,
    client: SandboxRunnerClient<TracedChannel>,
    healthy: AtomicBool,
}

impl Endpoint {
    /// `server_name`: the name a resolved address's certificate must carry (with TLS).
    fn connect(
        addr: String,
        tls: Option<&cairn_server::Tls>,
        server_name: Option<&str>,
    ) -> Result<Arc<Endpoint>, cairn_server::Error> {
        let channel = cairn_server::connect_named(&addr, tls, server_name)?;
        let client = SandboxRunnerClient::new(cairn_telemetry::traced(channel.clone()))
            .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES);
        Ok(Arc::new(Endpoint {
            addr,
            channel,
            client,
            healthy: AtomicBool::new(true),
        }))
    }

    fn set_healthy(&self, healthy: bool, why: &str) {
        if self.healthy.swap(healthy, Ordering::Relaxed) != healthy {
            if healthy {
                tracing::info!(runner = %self.addr, "sandbox runner healthy again; it gets work");
            } else {
                tracing::warn!(runner = %self.addr, reason = %why, "sandbox runner ejected: no work until a health check passes");
            }
        }
    }
}

struct Shared {
    targets: Vec<Target>,
    /// The current runners: fixed ones, then every address of every name.
    endpoints: RwLock<Arc<Vec<Arc<Endpoint>>>>,
    /// Last good addresses of each name (by target index).
    resolved: tokio::sync::Mutex<HashMap<usize, Vec<SocketAddr>>>,
    next: AtomicUsize,
    balancing: Balancing,
    resolver: Resolver,
    /// Mutual TLS to every runner (the orchestrator's certificate).
    tls: Option<cairn_server::Tls>,
}

/// The runners, with a background task that resolves names and checks health (it stops
/// when this is dropped).
pub struct Runners {
    shared: Arc<Shared>,
    watcher: Option<tokio::task::AbortHandle>,
}

impl Drop for Runners {
    fn drop(&mut self) {
        if let Some(w) = self.watcher.take() {
            w.abort();
        }
    }
}

impl Runners {
    /// Parses `addrs`, resolves names once and starts watching.
    pub async fn start(
        addrs: &[String],
        balancing: Balancing,
    ) -> Result<Runners, cairn_server::Error> {
        Self::start_tls(addrs, balancing, None).await
    }

    /// [`Runners::start`] over mutual TLS when `tls` is given.
    pub async fn start_tls(
        addrs: &[String],
        balancing: Balancing,
        tls: Option<cairn_server::Tls>,
    ) -> Result<Runners, cairn_server::Error> {
        Self::start_secure(addrs, balancing, system_resolver(), tls).await
    }

    /// [`Runners::start`] with another resolver (tests), plaintext.
    pub async fn start_with_resolver(
        addrs: &[String],
        balancing: Balancing,
        resolver: Resolver,
    ) -> Result<Runners, cairn_server::Error> {
        Self::start_secure(addrs, balancing, resolver, None).await
    }

    async fn start_secure(
        addrs: &[String],
        balancing: Balancing,
        resolver: Resolver,
        tls: Option<cairn_server::Tls>,
    ) -> Result<Runners, cairn_server::Error> {
        let targets = addrs
            .iter()
            .filter(|a| !a.trim().is_empty())
            .map(|a| Target::parse(a))
            .collect::<Result<Vec<_>, _>>()?;
        let mut fixed = Vec::new();
        for t in &targets {
            if let Target::Fixed(addr) = t {
                fixed.push(Endpoint::connect(addr.clone(), tls.as_ref(), None)?);
            }
        }
        let shared = Arc::new(Shared {
            targets,
            endpoints: RwLock::new(Arc::new(fixed)),
            resolved: Default::default(),
            next: AtomicUsize::new(0),
            balancing,
            resolver,
            tls,
        });
        shared.resolve().await;
        let watcher = shared
            .has_work_in_background()
            .then(|| tokio::spawn(watch(Arc::downgrade(&shared), balancing)).abort_handle());
        Ok(Runners { shared, watcher })
    }

    /// No runner configured at all.
    pub fn is_empty(&self) -> bool {
        self.shared.targets.is_empty()
    }

    /// The runners known now, with whether each gets work (tests, diagnostics).
    pub fn endpoints(&self) -> Vec<(String, bool)> {
        self.shared
            .snapshot()
            .iter()
            .map(|e| (e.addr.clone(), e.healthy.load(Ordering::Relaxed)))
            .collect()
    }

    /// The next healthy runner (an ejected one when none is healthy), with its address, for
    /// calls that must stay on one runner (sessions). Resolves names first when none has
    /// resolved yet.
    pub async fn pick(&self) -> Result<(String, SandboxRunnerClient<TracedChannel>), Status> {
        let order = self.shared.order().await?;
        let first = order
            .first()
            .ok_or_else(|| Status::unavailable("no sandbox runner address is known"))?;
        Ok((first.addr.clone(), first.client.clone()))
    }

    /// The runners to try for one request that must stay on the runner that takes it
    /// (sessions), with their addresses: healthy ones round-robin, then ejected ones. Empty
    /// when none is configured or no name has resolved yet.
    pub fn rotation(&self) -> Vec<(String, SandboxRunnerClient<TracedChannel>)> {
        self.shared
            .rotated(&self.shared.snapshot())
            .into_iter()
            .map(|e| (e.addr.clone(), e.client.clone()))
            .collect()
    }

    /// Runs `req` on the next healthy runner, moving on while runners are Unavailable.
    /// Returns the result and the address of the runner that produced it.
    pub async fn run(&self, req: RunRequest) -> Result<(RunResult, String), Status> {
        let mut passed = PassedOver::default();
        for e in self.shared.order().await? {
            match e.client.clone().run(req.clone()).await {
                Ok(r) => return Ok((r.into_inner(), e.addr.clone())),
                Err(s) if runner_gone(&s) => passed.add(&self.shared, &e, s),
                Err(s) => return Err(s),
            }
        }
        Err(passed.into_status())
    }

    /// [`Runners::run`] over `RunStream`: `output` gets stdout/stderr chunks as the program
    /// writes them. Moves on to the next runner only while the job has not started (no output
    /// yet); a runner lost after that is the caller's Unavailable, so no output is repeated.
    pub async fn run_streaming(
        &self,
        mut req: RunRequest,
        mut output: impl FnMut(OutputChunk) + Send,
        mut redelivered: impl FnMut(&str, &Status) + Send,
    ) -> Result<(RunResult, String), Status> {
        let mut passed = PassedOver::default();
        for e in self.shared.order().await? {
            let mut started = false;
            match stream_one(&e, req.clone(), &mut started, &mut output).await {
                Ok(r) => return Ok((r, e.addr.clone())),
                // A runner that went quiet may still be running the step: the next runner
                // gets it as a redelivery of the same step.
                Err(Failure::Silent(s)) => {
                    redelivered(&e.addr, &s);
                    passed.add(&self.shared, &e, s);
                    req.redelivery += 1;
                }
                Err(Failure::Status(s)) if runner_gone(&s) && !started => {
                    passed.add(&self.shared, &e, s)
                }
                Err(Failure::Status(s)) => return Err(s),
            }
        }
        Err(passed.into_status())
    }
}

/// How one RunStream call failed.
enum Failure {
    /// The runner answered with this status, or the connection broke.
    Status(Status),
    /// The runner sent heartbeats and then nothing for [`MISSED_HEARTBEATS`] intervals.
    Silent(Status),
}

impl From<Status> for Failure {
    fn from(s: Status) -> Self {
        Failure::Status(s)
    }
}

/// Heartbeat intervals without a message after which a runner is taken for lost.
const MISSED_HEARTBEATS: u32 = 3;
/// The shortest silence taken for a lost runner, whatever its interval.
const MIN_SILENCE: Duration = Duration::from_secs(1);

/// The runners a request moved on from because they were gone.
#[derive(Default)]
struct PassedOver {
    tried: Vec<String>,
    last: Option<Status>,
}

impl PassedOver {
    fn add(&mut self, shared: &Shared, e: &Endpoint, s: Status) {
        tracing::warn!(runner = %e.addr, error = %s.message(), "sandbox runner unavailable; trying the next one");
        if !shared.balancing.health_interval.is_zero() {
            e.set_healthy(false, s.message());
        }
        self.tried.push(e.addr.clone());
        self.last = Some(s);
    }

    fn into_status(self) -> Status {
        let last = self
            .last
            .map(|s| s.message().to_owned())
            .unwrap_or_default();
        Status::unavailable(format!(
            "no sandbox runner answered (tried {}): {last}",
            self.tried.join(", ")
        ))
    }
}

/// One RunStream call: output to `output` (setting `started`), then the result. A runner
/// that heartbeats is given [`MISSED_HEARTBEATS`] intervals of silence at most.
async fn stream_one(
    e: &Endpoint,
    req: RunRequest,
    started: &mut bool,
    output: &mut (impl FnMut(OutputChunk) + Send),
) -> Result<RunResult, Failure> {
    let mut stream = match e.client.clone().run_stream(req.clone()).await {
        Ok(s) => s.into_inner(),
        // A runner without RunStream (an older version) runs it whole; its output follows.
        Err(s) if s.code() == Code::Unimplemented => {
            let r = e.client.clone().run(req).await?.into_inner();
            *started = true;
            for (stream, data) in [
                (StdStream::Stdout, &r.stdout),
                (StdStream::Stderr, &r.stderr),
            ] {
                if !data.is_empty() {
                    output(OutputChunk {
                        stream: stream as i32,
                        data: data.clone(),
                    });
                }
            }
            return Ok(r);
        }
        Err(s) => return Err(s.into()),
    };
    let mut silence: Option<Duration> = None;
    loop {
        let next = match silence {
            Some(limit) => match tokio::time::timeout(limit, stream.message()).await {
                Ok(next) => next?,
                Err(_) => {
                    return Err(Failure::Silent(Status::unavailable(format!(
                        "sandbox runner {} sent no heartbeat for {} ms",
                        e.addr,
                        limit.as_millis()
                    ))))
                }
            },
            None => stream.message().await?,
        };
        let Some(msg) = next else { break };
        match msg.msg {
            Some(run_stream_response::Msg::Output(chunk)) => {
                *started = true;
                output(chunk);
            }
            Some(run_stream_response::Msg::Result(r)) => return Ok(r),
            Some(run_stream_response::Msg::Heartbeat(h)) if h.interval_ms > 0 => {
                let every = Duration::from_millis(h.interval_ms);
                silence = Some((every * MISSED_HEARTBEATS).max(MIN_SILENCE));
            }
            Some(run_stream_response::Msg::Heartbeat(_)) | None => {}
        }
    }
    Err(Status::unavailable(format!(
        "sandbox runner {} ended the run stream without a result",
        e.addr
    ))
    .into())
}

/// Did the call fail because the runner is down or went away mid-call? Unavailable, or a
/// Cancelled that the transport made (hyper's "connection closed" when the runner dies while
/// answering; our own cancellation drops the call and never sees a status).
fn runner_gone(s: &Status) -> bool {
    s.code() == Code::Unavailable || (s.code() == Code::Cancelled && from_transport(s))
}

/// The status was made by the transport (the connection), not sent by the runner.
fn from_transport(s: &Status) -> bool {
    std::error::Error::source(s)
        .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some())
}

impl Shared {
    fn snapshot(&self) -> Arc<Vec<Arc<Endpoint>>> {
        match self.endpoints.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn has_names(&self) -> bool {
        self.targets
            .iter()
            .any(|t| matches!(t, Target::Name { .. }))
    }

    fn has_work_in_background(&self) -> bool {
        !self.targets.is_empty()
            && (!self.balancing.health_interval.is_zero()
                || (self.has_names() && !self.balancing.resolve_interval.is_zero()))
    }

    /// The runners to try for one request: healthy ones round-robin, then ejected ones.
    async fn order(&self) -> Result<Vec<Arc<Endpoint>>, Status> {
        if self.targets.is_empty() {
            return Err(Status::failed_precondition(
                "no sandbox runner configured: set sandbox_addrs (CAIRN_ORCHESTRATOR_SANDBOX_ADDRS) to run sandbox_run nodes",
            ));
        }
        let mut all = self.snapshot();
        if all.is_empty() {
            // Names that resolved to nothing so far: ask again now rather than fail.
            self.resolve().await;
            all = self.snapshot();
        }
        if all.is_empty() {
            let names: Vec<&str> = self
                .targets
                .iter()
                .filter_map(|t| match t {
                    Target::Name { spec, .. } => Some(spec.as_str()),
                    Target::Fixed(_) => None,
                })
                .collect();
            return Err(Status::unavailable(format!(
                "no sandbox runner address: {} resolved to no address (is any runner ready?)",
                names.join(", ")
            )));
        }
        Ok(self.rotated(&all))
    }

    /// `all` from the next position on, healthy runners first.
    fn rotated(&self, all: &[Arc<Endpoint>]) -> Vec<Arc<Endpoint>> {
        let n = all.len();
        if n == 0 {
            return Vec::new();
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let rotated = (0..n).map(|k| all[(start + k) % n].clone());
        let (mut healthy, ejected): (Vec<_>, Vec<_>) =
            rotated.partition(|e| e.healthy.load(Ordering::Relaxed));
        healthy.extend(ejected);
        healthy
    }

    /// Resolves every name; keeps a name's last good addresses when it fails or is empty.
    async fn resolve(&self) {
        if !self.has_names() {
            return;
        }
        let mut resolved = self.resolved.lock().await;
        let mut changed = false;
        for (i, t) in self.targets.iter().enumerate() {
            let Target::Name {
                spec,
                host_port,
                port,
                ..
            } = t
            else {
                continue;
            };
            let answer =
                tokio::time::timeout(RESOLVE_TIMEOUT, (self.resolver)(host_port.clone())).await;
            let mut addrs = match answer {
                Ok(Ok(a)) => a,
                Ok(Err(e)) => {
                    tracing::warn!(target_addr = %spec, error = %e, "cannot resolve sandbox runner name; keeping its last addresses");
                    continue;
                }
                Err(_) => {
                    tracing::warn!(target_addr = %spec, "resolving the sandbox runner name timed out; keeping its last addresses");
                    continue;
                }
            };
            for a in &mut addrs {
                a.set_port(*port);
            }
            addrs.sort();
            addrs.dedup();
            if addrs.is_empty() {
                tracing::warn!(target_addr = %spec, "sandbox runner name resolved to no address; keeping its last addresses");
                continue;
            }
            if resolved.get(&i) != Some(&addrs) {
                tracing::info!(target_addr = %spec, addrs = ?addrs, "sandbox runners of the name");
                resolved.insert(i, addrs);
                changed = true;
            }
        }
        if changed || self.snapshot().is_empty() {
            self.rebuild(&resolved);
        }
    }

    /// The endpoint list from the targets and the resolved addresses; endpoints whose address
    /// stays keep their connection and health.
    fn rebuild(&self, resolved: &HashMap<usize, Vec<SocketAddr>>) {
        let old = self.snapshot();
        let mut by_addr: HashMap<&str, &Arc<Endpoint>> =
            old.iter().map(|e| (e.addr.as_str(), e)).collect();
        let mut list = Vec::new();
        for (i, t) in self.targets.iter().enumerate() {
            let (addrs, name): (Vec<String>, Option<&str>) = match t {
                Target::Fixed(a) => (vec![a.clone()], None),
                Target::Name {
                    scheme, host_port, ..
                } => (
                    resolved
                        .get(&i)
                        .map(|v| v.iter().map(|a| format!("{scheme}{a}")).collect())
                        .unwrap_or_default(),
                    host_port.rsplit_once(':').map(|(host, _)| host),
                ),
            };
            for addr in addrs {
                if list.iter().any(|e: &Arc<Endpoint>| e.addr == addr) {
                    continue;
                }
                match by_addr.remove(addr.as_str()) {
                    Some(e) => list.push(e.clone()),
                    None => match Endpoint::connect(addr.clone(), self.tls.as_ref(), name) {
                        Ok(e) => list.push(e),
                        Err(e) => {
                            tracing::warn!(runner = %addr, error = %e, "cannot use resolved sandbox runner address")
                        }
                    },
                }
            }
        }
        let list = Arc::new(list);
        match self.endpoints.write() {
            Ok(mut g) => *g = list,
            Err(p) => *p.into_inner() = list,
        }
    }

    /// Checks every runner's health at once and ejects or readmits each.
    async fn check_health(&self, timeout: Duration) {
        let all = self.snapshot();
        let checks = all.iter().map(|e| async move {
            let answer = cairn_server::serving(e.channel.clone(), HEALTH_SERVICE, timeout).await;
            match answer {
                Ok(true) => e.set_healthy(true, ""),
                Ok(false) => e.set_healthy(false, "health check: not serving"),
                Err(s) => e.set_healthy(false, &format!("health check failed: {}", s.message())),
            }
        });
        futures::future::join_all(checks).await;
    }
}

/// The background task: health checks every `health_interval`, resolutions every
/// `resolve_interval`. Holds the runners weakly: it ends when they are dropped.
async fn watch(shared: Weak<Shared>, b: Balancing) {
    let tick = [b.health_interval, b.resolve_interval]
        .into_iter()
        .filter(|d| !d.is_zero())
        .min()
        .unwrap_or(Duration::from_secs(10));
    // A check may take most of a tick, never longer than 2 s; never less than 500 ms either,
    // so a busy but healthy runner is not ejected for one slow answer.
    let timeout = (tick * 3 / 4).clamp(Duration::from_millis(500), Duration::from_secs(2));
    let mut last_resolve = Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let due = !b.resolve_interval.is_zero() && last_resolve.elapsed() >= b.resolve_interval;
        if due {
            shared.resolve().await;
            last_resolve = Instant::now();
        }
        if !b.health_interval.is_zero() {
            shared.check_health(timeout).await;
        }
    }
}
