//! Hosting of cairn gRPC services: what every service needs around its own handlers and must
//! not write again: grpc.health.v1, reflection, one trace span per RPC, message limits, mutual
//! TLS and the access table ([`tls`], [`access`]), and a graceful shutdown that stops
//! accepting and lets in-flight calls finish.
//! Also the one way clients build channels ([`connect`], [`connect_tls`]) and services layer
//! their configuration ([`config`]).

pub mod access;
pub mod caller;
pub mod config;
mod dial;
pub mod events;
pub mod inproc;
#[cfg(feature = "pki")]
pub mod pki;
pub mod reload;
pub mod tls;
pub mod unix;

pub use access::Access;
pub use caller::Caller;
pub use tls::{Tls, TlsArgs, TlsConfig};
pub mod drain;
mod health;
pub mod malformed;
pub mod observe;
pub mod retry;
pub mod roles;

pub use health::LIVENESS;
pub use observe::TelemetryConfig;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tonic::body::Body;
use tonic::server::NamedService;
use tonic::service::RoutesBuilder;
use tonic::transport::{Channel, Endpoint};

/// Largest gRPC message any cairn service accepts or sends (inline files are capped by the
/// services' own limits well below this).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reflection service could not be built: {0}")]
    Reflection(String),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error(
        "invalid address {addr:?}: {reason} (expected host:port, http://host:port or unix:PATH)"
    )]
    Address { addr: String, reason: String },
    #[error("TLS is not served on a Unix socket ({path}): the socket file's mode (0600) decides who may connect; serve TLS on a TCP port instead")]
    TlsOnUnixSocket { path: String },
    #[error("could not bind the Unix socket {0}")]
    BindUnix(#[from] unix::BindError),
    #[error("could not bind {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("refusing to serve plaintext on {addr}, which is not a loopback address: give --tls-dir (a PKI from `cairn certs init`) or, to accept that anyone who reaches the port is trusted, --insecure-listen")]
    PlaintextBeyondLoopback { addr: String },
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("could not make a TLS connection to {addr}: {source} (is the service up, and are your TLS settings of its CA?)")]
    Dial {
        addr: String,
        source: std::io::Error,
    },
}

/// Where a host serves: a TCP port, or a Unix socket ([`unix`]).
pub enum Listen {
    Tcp(tokio::net::TcpListener),
    Unix(unix::Listener),
}

impl From<tokio::net::TcpListener> for Listen {
    fn from(l: tokio::net::TcpListener) -> Self {
        Listen::Tcp(l)
    }
}

impl From<unix::Listener> for Listen {
    fn from(l: unix::Listener) -> Self {
        Listen::Unix(l)
    }
}

/// The services to host on one listener.
#[derive(Default)]
pub struct Host {
    routes: RoutesBuilder,
    names: Vec<&'static str>,
    tls: Option<Tls>,
    insecure_listen: bool,
    access: Access,
    drain: drain::Drain,
    required: Vec<health::Required>,
    tokens: Option<std::sync::Arc<dyn access::TokenCheck>>,
    in_process: Option<inproc::Listener>,
    metrics: Option<tokio::net::TcpListener>,
    tls_poll: Option<Duration>,
}

impl Host {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a generated `XServer<T>`; health reports it SERVING while the host runs.
    pub fn add<S>(&mut self, svc: S) -> &mut Self
    where
        S: tower::Service<http::Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        self.names.push(S::NAME);
        self.routes.add_service(svc);
        self
    }

    /// The TLS settings, plaintext rule and access table of a service's configuration.
    pub fn secure(
        &mut self,
        identity: &str,
        tls: &TlsConfig,
        insecure_listen: bool,
        access: &std::collections::BTreeMap<String, Vec<String>>,
    ) -> Result<&mut Self, Error> {
        self.tls = tls.load(identity)?;
        self.insecure_listen = insecure_listen;
        self.access = Access::with_overrides(access);
        Ok(self)
    }

    /// Every caller on the listener needs a token `tokens` vouches for, or a client
    /// certificate; plaintext callers are no longer trusted as the local user (see
    /// [`access`]). In-process callers stay trusted.
    pub fn require_tokens(&mut self, tokens: std::sync::Arc<dyn access::TokenCheck>) -> &mut Self {
        self.tokens = Some(tokens);
        self
    }

    /// Also serves the same services to this process's own clients at `listener`'s address.
    pub fn in_process(&mut self, listener: inproc::Listener) -> &mut Self {
        self.in_process = Some(listener);
        self
    }

    /// Also serves `GET /metrics` (Prometheus text) over plain HTTP on `listener`, for as long
    /// as the gRPC listener serves (see [`observe::serve_metrics`]).
    pub fn metrics(&mut self, listener: tokio::net::TcpListener) -> &mut Self {
        self.metrics = Some(listener);
        self
    }

    /// A service's telemetry settings: applies `telemetry` and, unless `metrics_listen` is
    /// empty, binds it for [`Host::metrics`].
    pub async fn observe(
        &mut self,
        metrics_listen: &str,
        telemetry: &TelemetryConfig,
    ) -> Result<&mut Self, Error> {
        telemetry.apply();
        if !metrics_listen.trim().is_empty() {
            self.metrics(bind(metrics_listen.trim()).await?);
        }
        Ok(self)
    }

    /// How often the TLS files are checked for changes (default [`reload::POLL_EVERY`]);
    /// SIGHUP reloads them at once either way.
    pub fn tls_poll(&mut self, every: Duration) -> &mut Self {
        self.tls_poll = Some(every);
        self
    }

    /// How long calls get to finish once shutdown begins (default 5 s); then the calls still
    /// open end with UNAVAILABLE and `serve` returns.
    pub fn drain_deadline(&mut self, deadline: Duration) -> &mut Self {
        self.drain = drain::Drain::new(deadline);
        self
    }

    /// Readiness (health "" and every hosted name) is NOT_SERVING while `dependency` is
    /// unreachable; liveness ([`LIVENESS`]) stays SERVING.
    pub fn require(&mut self, dependency: &retry::Dependency) -> &mut Self {
        self.required.push(health::Required {
            name: dependency.name().to_owned(),
            up: dependency.watch(),
        });
        self
    }

    /// Serves until `shutdown` resolves, then stops accepting, reports NOT_SERVING, ends
    /// endless streams and waits for in-flight calls to finish, at most the drain deadline
    /// (see [`drain`]).
    pub async fn serve(
        self,
        listener: impl Into<Listen>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), Error> {
        let listener = listener.into();
        let (reporter, health) = health::Health::start(self.names.clone(), self.required).await;
        // Reflection lists exactly what this port serves: its cairn services, health and
        // reflection itself (the descriptors of the other cairn services stay resolvable).
        let names = self.names.clone();
        let reflection = || {
            let builder = tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(cairn_proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
            names
                .iter()
                .copied()
                .chain(ALWAYS_SERVED)
                .fold(builder, |b, name| b.with_service_name(name))
        };
        let reflection_v1 = reflection()
            .build_v1()
            .map_err(|e| Error::Reflection(e.to_string()))?;
        let reflection_v1alpha = reflection()
            .build_v1alpha()
            .map_err(|e| Error::Reflection(e.to_string()))?;
        let mut routes = self.routes;
        routes.add_service(health);
        routes.add_service(reflection_v1);
        routes.add_service(reflection_v1alpha);
        let local = match &listener {
            Listen::Tcp(l) => l.local_addr().ok(),
            Listen::Unix(l) if self.tls.is_some() => {
                return Err(Error::TlsOnUnixSocket {
                    path: l.path().display().to_string(),
                })
            }
            Listen::Unix(l) => {
                tracing::info!(socket = %l.path().display(), services = ?self.names, "serving gRPC on a Unix socket (mode 0600)");
                None
            }
        };
        if let Some(addr) = local {
            check_listen(addr, self.tls.is_some(), self.insecure_listen)?;
            tracing::info!(addr = ?local, services = ?self.names, tls = self.tls.is_some(), "serving gRPC");
        }
        let drain = self.drain;
        let start_drain = drain.clone();
        let shutdown = async move {
            shutdown.await;
            tracing::info!("shutting down: finishing in-flight calls");
            reporter.stopping().await;
            start_drain.start();
        };
        // TLS is served here rather than by tonic, whose configuration is fixed at start: the
        // files are read again on SIGHUP and when they change (see [`reload`]).
        let reloading = match &self.tls {
            Some(tls) => Some(std::sync::Arc::new(reload::ReloadingTls::new(
                tls.paths().clone(),
            )?)),
            None => None,
        };
        let builder = tonic::transport::Server::builder();
        let routes = routes.routes();
        let access = access::AccessLayer::new(self.access, self.tokens);
        // The in-process listener stops with the TCP one.
        let (stopped, stop_in_process) = tokio::sync::watch::channel(false);
        let metrics = self.metrics.map(|listener| {
            let mut stop = stop_in_process.clone();
            tokio::spawn(observe::serve_metrics(listener, async move {
                let _ = stop.wait_for(|s| *s).await;
            }))
        });
        let in_process = self.in_process.map(|listener| {
            let server = tonic::transport::Server::builder()
                .initial_stream_window_size(Some(STREAM_WINDOW))
                .initial_connection_window_size(Some(CONNECTION_WINDOW))
                .layer(drain.layer())
                .layer(cairn_telemetry::server_layer())
                .layer(cairn_telemetry::RpcMetricsLayer)
                .layer(access.clone())
                .layer(malformed::MalformedLayer)
                .add_routes(routes.clone());
            let mut stop = stop_in_process.clone();
            tokio::spawn(server.serve_with_incoming_shutdown(
                listener.into_incoming(),
                async move {
                    let _ = stop.wait_for(|s| *s).await;
                },
            ))
        });
        let shutdown = async move {
            shutdown.await;
            let _ = stopped.send(true);
        };
        let router = builder
            .tcp_nodelay(true)
            // Streamed file bodies: larger flow-control windows and frames cut the round trips
            // and per-frame work of a Put (see bench/RESULTS.md, artifact-store).
            .initial_stream_window_size(Some(STREAM_WINDOW))
            .initial_connection_window_size(Some(CONNECTION_WINDOW))
            .max_frame_size(Some(MAX_FRAME))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .layer(drain.layer())
            .layer(cairn_telemetry::server_layer())
            .layer(cairn_telemetry::RpcMetricsLayer)
            .layer(access)
            .layer(malformed::MalformedLayer)
            .add_routes(routes);
        let served = match (reloading, listener) {
            (_, Listen::Unix(listener)) => {
                drain
                    .bounded(
                        router.serve_with_incoming_shutdown(listener.into_incoming(), shutdown),
                    )
                    .await
            }
            (Some(tls), Listen::Tcp(listener)) => {
                let watcher = tls
                    .clone()
                    .watch(self.tls_poll.unwrap_or(reload::POLL_EVERY));
                let incoming = reload::incoming(listener, tls);
                let served = drain
                    .bounded(router.serve_with_incoming_shutdown(incoming, shutdown))
                    .await;
                watcher.abort();
                served
            }
            (None, Listen::Tcp(listener)) => {
                // tonic's own tcp_nodelay is not applied to a caller's listener; without it
                // Nagle delays HTTP/2 window updates and streamed Puts crawl.
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                drain
                    .bounded(router.serve_with_incoming_shutdown(incoming, shutdown))
                    .await
            }
        };
        if let Some(task) = in_process {
            task.abort();
        }
        if let Some(task) = metrics {
            task.abort();
        }
        served.transpose()?;
        Ok(())
    }
}
/// HTTP/2 flow-control windows (bytes a peer may send before it must wait for an update).
pub const STREAM_WINDOW: u32 = 4 << 20;
pub const CONNECTION_WINDOW: u32 = 8 << 20;
/// Largest HTTP/2 frame a peer may send us (the protocol's default is 16 KiB).
pub const MAX_FRAME: u32 = 1 << 20;

/// Plaintext only on loopback: refuses a non-loopback `addr` without TLS unless
/// `insecure_listen` (then warns). Call it before binding; [`Host::serve`] checks it again.
pub fn check_listen(addr: SocketAddr, tls: bool, insecure_listen: bool) -> Result<(), Error> {
    if tls || addr.ip().is_loopback() {
        return Ok(());
    }
    if !insecure_listen {
        return Err(Error::PlaintextBeyondLoopback {
            addr: addr.to_string(),
        });
    }
    tracing::warn!(%addr, "serving PLAINTEXT beyond loopback (--insecure-listen): anyone who reaches this port is trusted with every call");
    Ok(())
}

/// [`check_listen`] for a `host:port` text (names other than `localhost` count as
/// non-loopback: they may resolve anywhere).
pub fn check_listen_text(addr: &str, tls: bool, insecure_listen: bool) -> Result<(), Error> {
    let parsed = addr
        .parse::<SocketAddr>()
        .ok()
        .or_else(|| match addr.rsplit_once(':') {
            Some(("localhost", port)) => port
                .parse::<u16>()
                .ok()
                .map(|p| SocketAddr::from(([127, 0, 0, 1], p))),
            _ => None,
        });
    match parsed {
        Some(a) => check_listen(a, tls, insecure_listen),
        // A name or a bad address: bind() reports the latter; Host::serve checks what it bound.
        None => Ok(()),
    }
}

/// The services every port serves beside its own (listed by reflection).
const ALWAYS_SERVED: [&str; 3] = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// Binds a TCP listener, with an error that names the address.
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind {
            addr: addr.to_owned(),
            source,
        })
}

/// A lazily connecting channel to `addr` (`host:port` or `http://host:port`). Connection errors
/// surface as `Unavailable` on the first call, so a dead peer never blocks start-up.
pub fn connect(addr: &str) -> Result<Channel, Error> {
    connect_tls(addr, None)
}

/// [`connect`], over mutual TLS when `tls` is given (the address's scheme becomes https; the
/// server must present a certificate of the CA for the host name dialled). Each new connection
/// reads `tls`'s files as they are then: renewed ones are taken without a restart.
pub fn connect_tls(addr: &str, tls: Option<&Tls>) -> Result<Channel, Error> {
    connect_named(addr, tls, None)
}

/// [`connect_tls`] with the name the server's certificate must carry (see [`endpoint`]); an
/// in-process address (`inproc://`, [`inproc`]) is dialled in memory, and a Unix socket
/// (`unix:PATH`, [`unix`]) without TLS.
pub fn connect_named(
    addr: &str,
    tls: Option<&Tls>,
    server_name: Option<&str>,
) -> Result<Channel, Error> {
    if addr.starts_with(inproc::SCHEME) {
        return Ok(inproc::channel(addr));
    }
    if let Some(path) = unix::path_of(addr) {
        if tls.is_some() {
            return Err(Error::Address {
                addr: addr.to_owned(),
                reason: "a Unix socket is dialled without TLS (its file's mode decides who may connect): leave out --tls-dir / CAIRN_TLS_DIR".into(),
            });
        }
        return Ok(unix::channel(path));
    }
    let Some(tls) = tls else {
        return Ok(endpoint(addr, None, None)?.connect_lazy());
    };
    // TLS is dialled here rather than by tonic, whose configuration is fixed: each new
    // connection reads the files as they are then (see [`dial`]). The scheme stays http, or
    // tonic would insist on its own TLS.
    let dialer = dial::Dialer::new(tls.paths().clone(), server_name)?;
    let plain = endpoint(&format!("http://{}", bare_address(addr)), None, None)?;
    Ok(plain.connect_with_connector_lazy(tower::service_fn(move |uri| dialer.clone().dial(uri))))
}

/// The certificate (DER) the server at `addr` presents to a new connection made with `tls`'s
/// files, verified as every connection is (the CA bundle, the name dialled or `server_name`):
/// what `cairn certs show --served` prints, to check which certificate a service serves.
pub async fn served_certificate(
    addr: &str,
    tls: &Tls,
    server_name: Option<&str>,
) -> Result<Vec<u8>, Error> {
    let dialer = dial::Dialer::new(tls.paths().clone(), server_name)?;
    let uri: http::Uri =
        format!("https://{}", bare_address(addr))
            .parse()
            .map_err(|e: http::uri::InvalidUri| Error::Address {
                addr: addr.to_owned(),
                reason: e.to_string(),
            })?;
    let io = dialer.dial(uri).await.map_err(|source| Error::Dial {
        addr: addr.to_owned(),
        source,
    })?;
    let (_, connection) = io.inner().get_ref();
    connection
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|leaf| leaf.to_vec())
        .ok_or_else(|| Error::Dial {
            addr: addr.to_owned(),
            source: std::io::Error::other("the server presented no certificate"),
        })
}

/// `addr` without an `http://` or `https://` scheme.
fn bare_address(addr: &str) -> &str {
    addr.strip_prefix("http://")
        .or_else(|| addr.strip_prefix("https://"))
        .unwrap_or(addr)
}

/// An endpoint to `addr`, with tonic's TLS when `tls` is given: that material is fixed when
/// the endpoint is made ([`connect_named`] follows renewed files instead). `server_name`: the name the server's certificate must
/// carry when `addr` is an address a name resolved to (default: the host dialled).
pub fn endpoint(
    addr: &str,
    tls: Option<&Tls>,
    server_name: Option<&str>,
) -> Result<Endpoint, Error> {
    let bare = bare_address(addr);
    let uri = match (tls.is_some(), addr.contains("://")) {
        (true, _) => format!("https://{bare}"),
        (false, true) => addr.to_owned(),
        (false, false) => format!("http://{addr}"),
    };
    let bad = |e: &dyn std::fmt::Display| Error::Address {
        addr: addr.to_owned(),
        reason: e.to_string(),
    };
    let mut endpoint = Endpoint::from_shared(uri).map_err(|e| bad(&e))?;
    if let Some(tls) = tls {
        let mut client = tls.client();
        if let Some(name) = server_name {
            client = client.domain_name(name);
        }
        endpoint = endpoint.tls_config(client).map_err(|e| bad(&e))?;
    }
    Ok(endpoint
        .connect_timeout(Duration::from_secs(5))
        .initial_stream_window_size(Some(STREAM_WINDOW))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30)))
}

/// Asks the grpc.health.v1 service behind `channel` whether `service` (a full service name
/// such as `cairn.v1.SandboxRunner`; "" = the whole server) is SERVING, within `timeout`.
/// `Ok(false)`: it answered with another status; `Err`: it did not answer (down, timeout,
/// unknown service).
pub async fn serving(
    channel: Channel,
    service: &str,
    timeout: Duration,
) -> Result<bool, tonic::Status> {
    use tonic_health::pb::health_check_response::ServingStatus as Status;
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    let mut request = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
        service: service.to_owned(),
    });
    request.set_timeout(timeout);
    let call = client.check(request);
    match tokio::time::timeout(timeout, call).await {
        Ok(answer) => Ok(answer?.into_inner().status == Status::Serving as i32),
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "no health answer within {} ms",
            timeout.as_millis()
        ))),
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
