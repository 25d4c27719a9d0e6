//! The web console: server-rendered pages where people follow runs, decide gates, write notes
//! and edit the shared context, on its own HTTP listener (`cairn up` serves it beside the
//! services). A client of the services: it depends on the protos and the shared crates, never
//! on a service library.
//!
//! The console owns no run state and never touches a disk: every read and every action is a
//! gRPC call to the orchestrator (the same calls as the CLI, each recorded there as an event
//! with `by` and `ts`) or to the artifact-store (which validates every path it is given, so no
//! page can reach a file outside the project). It must never open a file or judge a path itself.
//!
//! Embedding: [`serve_console`] on a listener; [`console_router`] for tests.

mod actions;
mod ansi;
mod attempts;
mod compare;
mod dag;
mod diff;
mod error;
mod events;
mod evidence;
mod files;
mod guard;
mod health;
mod history;
mod ingest;
mod logs;
mod logview;
mod markdown;
mod nodepage;
mod page;
mod run;
mod runs;
mod session;
mod start;
mod throttle;
mod timeline;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_telemetry::TracedChannel;
use tonic::service::interceptor::InterceptedService;

use cairn_server::roles::Bearer;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use error::ConsoleError;

/// The identity the console dials the services with (`<tls.dir>/console.pem`).
pub const IDENTITY: &str = "console";

/// The console's settings (a `[console]` section of the orchestrator's configuration).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve the console at all (off in production configuration, on in `cairn up`).
    pub enabled: bool,
    /// HTTP listen address of the console.
    pub listen: String,
    /// The orchestrator's gRPC address (every action goes there).
    pub orchestrator_addr: String,
    /// The artifact-store's gRPC address (every file read goes there).
    pub store_addr: String,
    /// Shared login token, at least 16 characters; unset or empty = no login (only allowed on a
    /// loopback address). Not together with `user_tokens`.
    #[serde(serialize_with = "token_out", deserialize_with = "token_in")]
    pub token: Option<String>,
    /// Project shown first; empty = the first project the store lists.
    pub default_project: String,
    /// Name actions are recorded under when nobody gave one at /login.
    pub default_name: String,
    /// Lifetime of a login session, in seconds.
    pub session_ttl_s: u64,
    /// Mark the session cookie `Secure` (set this when the console is behind HTTPS).
    pub secure_cookie: bool,
    /// Deadline of one gRPC call made for a page or an action, in seconds.
    pub rpc_timeout_s: u64,
    /// Mutual TLS to the orchestrator and the store, with the `console` certificate.
    pub tls: cairn_server::TlsConfig,
    /// People log in with their own token from the orchestrator's tokens file (`cairn tokens
    /// add`): the console asks the orchestrator whose it is (WhoAmI), shows and allows what
    /// that person's role allows, and relays the token with every call, so the orchestrator
    /// decides and records who did it.
    pub user_tokens: bool,
    /// Host names (optionally `name:port`) the console answers to besides the listen address
    /// and the loopback names (localhost, 127.0.0.1, [::1]): the names people reach it by,
    /// e.g. behind a reverse proxy. Any other Host is refused (DNS rebinding).
    pub public_hosts: Vec<String>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: false,
            listen: "127.0.0.1:7480".into(),
            orchestrator_addr: "127.0.0.1:50054".into(),
            store_addr: "127.0.0.1:50051".into(),
            token: None,
            default_project: String::new(),
            default_name: "console".into(),
            session_ttl_s: 12 * 3600,
            secure_cookie: false,
            rpc_timeout_s: 30,
            tls: cairn_server::TlsConfig::default(),
            user_tokens: false,
            public_hosts: Vec::new(),
        }
    }
}

fn token_out<S: Serializer>(token: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(token.as_deref().unwrap_or(""))
}

fn token_in<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let t = Option::<String>::deserialize(d)?;
    Ok(t.filter(|t| !t.is_empty()))
}

impl ConsoleConfig {
    /// Refuses settings the console cannot work with; the message names the key to fix.
    pub fn check(&self) -> Result<(), ConsoleError> {
        let bad = |m: &str| Err(ConsoleError::Config(m.to_owned()));
        if self.orchestrator_addr.trim().is_empty() {
            return bad("console.orchestrator_addr is required (the orchestrator's gRPC address)");
        }
        if self.store_addr.trim().is_empty() {
            return bad("console.store_addr is required (the artifact-store's gRPC address)");
        }
        if let Some(t) = &self.token {
            if t.trim() != t || t.chars().any(char::is_control) {
                return bad("console.token has surrounding whitespace or control characters");
            }
            let n = t.chars().count();
            if n < MIN_TOKEN_CHARS {
                return Err(ConsoleError::Config(format!(
                    "console.token is {n} characters; use at least {MIN_TOKEN_CHARS} random ones (e.g. the output of `openssl rand -hex 16`), or personal tokens from a tokens file (user_tokens)"
                )));
            }
            if self.user_tokens {
                return bad("console.token and console.user_tokens exclude each other: with personal tokens from the tokens file, unset the shared token");
            }
        }
        for h in &self.public_hosts {
            guard::HostName::parse(h)
                .map_err(|e| ConsoleError::Config(format!("console.public_hosts: `{h}`: {e}")))?;
        }
        let name = self.default_name.trim();
        if name.is_empty()
            || name.chars().count() > session::MAX_NAME_CHARS
            || name.chars().any(char::is_control)
        {
            return bad("console.default_name must be 1-64 printable characters");
        }
        if self.session_ttl_s == 0 || self.rpc_timeout_s == 0 {
            return bad("console.session_ttl_s and console.rpc_timeout_s must be at least 1");
        }
        Ok(())
    }
}

/// Fewest characters of a shared console token.
pub const MIN_TOKEN_CHARS: usize = 16;

/// The URL people open for a console listening on `addr` (a wildcard address becomes loopback).
pub fn console_url(addr: SocketAddr) -> String {
    let host = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => "127.0.0.1".to_owned(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => "[::1]".to_owned(),
        std::net::IpAddr::V4(ip) => ip.to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
    };
    format!("http://{host}:{}/", addr.port())
}

/// What every handler shares: the two gRPC clients, the sessions and the stop signal.
#[derive(Clone)]
struct Console {
    inner: Arc<Inner>,
}

/// An orchestrator client that relays the visitor's token.
type Relayed = OrchestratorClient<InterceptedService<TracedChannel, Bearer>>;

struct Inner {
    config: ConsoleConfig,
    orchestrator: TracedChannel,
    store: ArtifactStoreClient<TracedChannel>,
    /// What `/readyz` dials.
    health: health::Channels,
    sessions: session::Sessions,
    hosts: guard::AllowedHosts,
    throttle: throttle::LoginThrottle,
    /// Cancelled at shutdown: ends the event streams, which would otherwise hold it open.
    stopping: CancellationToken,
}

impl Console {
    /// `listen`: the address actually listened on (else `config.listen`), for the Host check.
    fn new(config: ConsoleConfig, listen: Option<SocketAddr>) -> Result<Console, ConsoleError> {
        config.check()?;
        let listen = match listen {
            Some(a) => Some(a),
            None => config.listen.parse().ok(),
        };
        let hosts = guard::AllowedHosts::new(listen, &config.public_hosts)?;
        let tls = config
            .tls
            .load(IDENTITY)
            .map_err(|e| ConsoleError::Config(e.to_string()))?;
        let health = health::Channels {
            orchestrator: cairn_server::connect_tls(&config.orchestrator_addr, tls.as_ref())?,
            store: cairn_server::connect_tls(&config.store_addr, tls.as_ref())?,
        };
        let orchestrator = cairn_telemetry::traced(health.orchestrator.clone());
        let store = ArtifactStoreClient::new(cairn_telemetry::traced(health.store.clone()))
            .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES);
        let sessions = session::Sessions::new(&config);
        Ok(Console {
            inner: Arc::new(Inner {
                config,
                orchestrator,
                store,
                health,
                sessions,
                hosts,
                throttle: throttle::LoginThrottle::default(),
                stopping: CancellationToken::new(),
            }),
        })
    }

    fn config(&self) -> &ConsoleConfig {
        &self.inner.config
    }

    /// The orchestrator, called with the visitor's token (none without personal tokens).
    fn orchestrator(&self, visitor: &session::Visitor) -> Relayed {
        OrchestratorClient::new(InterceptedService::new(
            self.inner.orchestrator.clone(),
            visitor.bearer(),
        ))
        .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
    }

    /// The orchestrator, called with `token` (a login being checked).
    fn orchestrator_as(&self, token: &str) -> Result<Relayed, ConsoleError> {
        let bearer = Bearer::new(Some(token)).map_err(ConsoleError::BadRequest)?;
        Ok(OrchestratorClient::new(InterceptedService::new(
            self.inner.orchestrator.clone(),
            bearer,
        ))
        .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES))
    }

    fn store(&self) -> ArtifactStoreClient<TracedChannel> {
        self.inner.store.clone()
    }

    fn sessions(&self) -> &session::Sessions {
        &self.inner.sessions
    }

    fn rpc_timeout(&self) -> Duration {
        Duration::from_secs(self.inner.config.rpc_timeout_s)
    }

    /// Runs one unary call under the configured deadline; `what` names it in errors.
    async fn call<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, ConsoleError> {
        match tokio::time::timeout(self.rpc_timeout(), fut).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(ConsoleError::rpc(what, status)),
            Err(_) => Err(ConsoleError::Timeout {
                what: what.to_owned(),
                secs: self.inner.config.rpc_timeout_s,
            }),
        }
    }
}

/// The console's routes with sessions, CSRF checks, login and security headers applied.
/// Connections to the orchestrator and the store are lazy: this works before they are up.
pub fn console_router(config: ConsoleConfig) -> Result<Router, ConsoleError> {
    Ok(router(Console::new(config, None)?))
}

fn router(console: Console) -> Router {
    let project_routes = Router::new()
        .route("/runs/{run}", get(run::page))
        .route("/runs/{run}/events", get(events::stream))
        .route("/runs/{run}/nodes/{node}", get(nodepage::page))
        .route("/runs/{run}/nodes/{node}/logs", get(logs::stream))
        .route("/runs/{run}/nodes/{node}/log", get(logview::view))
        .route("/runs/{run}/gates/{gate}/approve", post(actions::approve))
        .route("/runs/{run}/gates/{gate}/reject", post(actions::reject))
        .route("/runs/{run}/notes", post(actions::note))
        .route("/runs/{run}/context", post(actions::context))
        .route("/runs/{run}/cancel", post(actions::cancel))
        .route("/runs/{run}/rework", post(actions::rework))
        .route("/runs/{run}/resume", post(actions::resume))
        .route("/runs/{run}/rerun", post(actions::rerun))
        .route("/runs/{run}/agents/{instance}/diff", get(diff::view))
        .route("/diff", get(compare::view))
        .route("/files", get(files::view))
        .route("/download", get(files::download))
        .route("/tree", get(files::tree));
    let pages = Router::new()
        .route("/", get(|| async { Redirect::to("/runs") }))
        .route("/runs", get(runs::list))
        .route("/diff", get(compare::top))
        .route("/start", get(start::form).post(start::submit))
        .route("/login", get(session::login_form).post(session::login))
        .route("/logout", post(session::logout))
        .route("/static/console.css", get(page::stylesheet))
        .route("/static/console.js", get(page::script))
        .route("/static/favicon.svg", get(page::favicon))
        .nest("/projects/{project}", project_routes)
        .fallback(|| async { ConsoleError::NotFound("no such page".into()) })
        // Outermost first: headers, span, Host and Origin, session, CSRF, login.
        .layer(middleware::from_fn_with_state(
            console.clone(),
            session::require_login,
        ))
        .layer(middleware::from_fn_with_state(
            console.clone(),
            session::check_csrf,
        ))
        .layer(middleware::from_fn_with_state(
            console.clone(),
            session::attach,
        ))
        .layer(middleware::from_fn_with_state(
            console.clone(),
            guard::check_host_and_origin,
        ))
        .layer(middleware::from_fn(request_span))
        .layer(middleware::from_fn(page::conditional));
    // The probes stand outside the Host check and the session: a kubelet sends the pod's
    // address as Host and has no session, and they reveal nothing (health.rs).
    Router::new()
        .route(HEALTHZ, get(health::live))
        .route(READYZ, get(health::ready))
        .merge(pages)
        .layer(middleware::from_fn(security_headers))
        .with_state(console)
}

/// Liveness probe path: 200 while the console serves HTTP (no login, any Host).
pub const HEALTHZ: &str = "/healthz";
/// Readiness probe path: 200 when the orchestrator and the store answer gRPC health, else 503
/// (no login, any Host).
pub const READYZ: &str = "/readyz";

/// One span per request, so the gRPC calls it makes carry its trace context.
async fn request_span(req: Request, next: Next) -> Response {
    let span = tracing::info_span!("console.request", http.method = %req.method(), http.path = %req.uri().path());
    next.run(req).instrument(span).await
}

/// Headers every response carries: scripts and styles only from this origin, no framing, no
/// content sniffing, no caching of pages that hold a CSRF token.
async fn security_headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    let set = |h: &mut axum::http::HeaderMap, k: header::HeaderName, v: &'static str| {
        if !h.contains_key(&k) {
            h.insert(k, HeaderValue::from_static(v));
        }
    };
    set(
        h,
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(h, header::X_FRAME_OPTIONS, "DENY");
    set(h, header::REFERRER_POLICY, "same-origin");
    set(h, header::CACHE_CONTROL, "no-store");
    res
}

/// A console ready to serve: its settings checked, its listener bound. Everything that can
/// refuse a start refuses here, so a caller that starts other things too (`cairn up`) can
/// fail before it starts any of them.
pub struct ConsoleServer {
    console: Console,
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
}

impl ConsoleServer {
    /// Checks `config` for `listener`; refuses to serve without a login token on an address
    /// other machines can reach.
    pub fn new(
        config: ConsoleConfig,
        listener: tokio::net::TcpListener,
    ) -> Result<ConsoleServer, ConsoleError> {
        let addr = listener
            .local_addr()
            .map_err(|e| ConsoleError::Serve(e.to_string()))?;
        if config.token.is_none() && !config.user_tokens && !addr.ip().is_loopback() {
            return Err(ConsoleError::Config(format!(
                "refusing to serve the console on {addr} without a login token: set console.token (CAIRN_CONSOLE_TOKEN, at least {MIN_TOKEN_CHARS} characters), or personal tokens (user_tokens with a tokens file), or listen on 127.0.0.1"
            )));
        }
        let console = Console::new(config, Some(addr))?;
        Ok(ConsoleServer {
            console,
            listener,
            addr,
        })
    }

    /// The URL people open.
    pub fn url(&self) -> String {
        console_url(self.addr)
    }

    /// Serves until `shutdown` resolves; open event streams are ended then, so shutdown does
    /// not wait for browsers to go away.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ConsoleError> {
        let stopping = self.console.inner.stopping.clone();
        tracing::info!(url = %self.url(), "serving the web console");
        // The peer address: login throttling and refusal logs.
        let app = router(self.console).into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(self.listener, app)
            .with_graceful_shutdown(async move {
                shutdown.await;
                stopping.cancel();
            })
            .await
            .map_err(|e| ConsoleError::Serve(e.to_string()))
    }
}

/// [`ConsoleServer::new`] then [`ConsoleServer::serve`].
pub async fn serve_console(
    config: ConsoleConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ConsoleError> {
    ConsoleServer::new(config, listener)?.serve(shutdown).await
}
