//! Who is at the console: sessions (an HttpOnly, SameSite=Lax cookie naming a server-side
//! session), the login, the CSRF check of every POST, and who actions are recorded under.
//!
//! Logins: with personal tokens (`user_tokens`) a person gives their token from the tokens
//! file; the orchestrator says whose it is (WhoAmI), and the session keeps the name, role,
//! projects and the token, which is relayed with every call so the orchestrator decides and
//! records who acted. With a shared token (`token`) people give a name and the shared token.
//! Every login waits its turn (throttle.rs) before the token is checked.
//!
//! Every visitor gets a session on the first request, before logging in, so the login form is
//! CSRF-protected like every other form. The CSRF token is a random secret of the session
//! (synchronizer token), compared in constant time; so is the shared token. Logging in replaces
//! the session id (no fixation). SameSite=Lax lets a link from another site land on the page
//! with the session; a POST from another site carries no cookie, and would fail the Origin and
//! CSRF checks anyway. Sessions live in memory: a restart logs everybody out.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, FromRequest, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::html;
use serde::Deserialize;

use super::page::{self, layout};
use super::{Console, ConsoleConfig, ConsoleError};
use cairn_server::roles::{Bearer, Role, Rpc};

/// Name of the session cookie.
pub(super) const COOKIE: &str = "cairn_console";
/// Longest name a person may give.
pub(super) const MAX_NAME_CHARS: usize = 64;
/// Most sessions kept; beyond it expired, then anonymous ones are dropped first.
const MAX_SESSIONS: usize = 10_000;
/// Largest POST body the console reads (notes are at most 64 KiB, manifests 256 KiB).
const MAX_FORM_BYTES: usize = 1 << 20;

/// A message shown once on the next page (the result of an action).
#[derive(Clone, Debug)]
pub(super) struct Flash {
    pub text: String,
    pub error: bool,
}

/// A secret kept out of Debug output and logs.
#[derive(Clone)]
pub(super) struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

/// Who a login says the visitor is.
#[derive(Clone, Debug)]
struct Login {
    name: String,
    /// None without personal tokens: the console shows everything and the orchestrator
    /// decides alone.
    role: Option<Role>,
    /// Empty = every project.
    projects: Vec<String>,
    /// The personal token, relayed to the orchestrator as bearer.
    token: Option<Secret>,
}

/// The visitor of one request, as handlers see it.
#[derive(Clone, Debug)]
pub(super) struct Visitor {
    pub session_id: String,
    /// Recorded as `by` of every action (the orchestrator records the token's name when a
    /// personal token is relayed).
    pub name: String,
    /// The CSRF token every form of this session carries.
    pub csrf: String,
    /// Logged in (always true when no token is configured).
    pub authenticated: bool,
    pub login_required: bool,
    pub user_tokens: bool,
    pub role: Option<Role>,
    pub projects: Vec<String>,
    token: Option<Secret>,
    /// The peer address of this request, when known.
    pub peer: Option<SocketAddr>,
}

impl Visitor {
    /// Whether this visitor's role allows `rpc` (always, without personal tokens).
    pub fn may(&self, rpc: Rpc) -> bool {
        self.role.is_none_or(|r| r >= rpc.required_role())
    }

    /// Whether this visitor may see `project`.
    pub fn may_see(&self, project: &str) -> bool {
        self.projects.is_empty() || self.projects.iter().any(|p| p == project)
    }

    /// The peer address for logs.
    pub fn peer_text(&self) -> String {
        self.peer
            .map(|p| p.to_string())
            .unwrap_or_else(|| "unknown".into())
    }

    /// The interceptor relaying this visitor's token (none without personal tokens).
    pub fn bearer(&self) -> Bearer {
        Bearer::new(self.token.as_ref().map(|t| t.0.as_str())).unwrap_or_default()
    }
}

struct Session {
    login: Login,
    csrf: String,
    authenticated: bool,
    expires: Instant,
    flash: Option<Flash>,
}

pub(super) struct Sessions {
    map: Mutex<HashMap<String, Session>>,
    ttl: Duration,
    token: Option<String>,
    user_tokens: bool,
    default_name: String,
    secure: bool,
}

/// 256 random bits as hex (two v4 UUIDs: the OS random source, 244 random bits together).
fn secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Equality of two secrets in time independent of where they differ (both are hashed first,
/// so their lengths do not show either).
fn same_secret(given: &str, expected: &str) -> bool {
    let (a, b) = (
        cairn_sha256::sha256(given.as_bytes()),
        cairn_sha256::sha256(expected.as_bytes()),
    );
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

impl Sessions {
    pub(super) fn new(config: &ConsoleConfig) -> Sessions {
        Sessions {
            map: Mutex::new(HashMap::new()),
            ttl: Duration::from_secs(config.session_ttl_s),
            token: config.token.clone(),
            user_tokens: config.user_tokens,
            default_name: config.default_name.trim().to_owned(),
            secure: config.secure_cookie,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn login_required(&self) -> bool {
        self.token.is_some() || self.user_tokens
    }

    fn visitor(&self, id: &str, s: &Session) -> Visitor {
        Visitor {
            session_id: id.to_owned(),
            name: s.login.name.clone(),
            csrf: s.csrf.clone(),
            authenticated: s.authenticated,
            login_required: self.login_required(),
            user_tokens: self.user_tokens,
            role: s.login.role,
            projects: s.login.projects.clone(),
            token: s.login.token.clone(),
            peer: None,
        }
    }

    fn find(&self, id: &str) -> Option<Visitor> {
        let mut map = self.lock();
        match map.get(id) {
            Some(s) if s.expires > Instant::now() => Some(self.visitor(id, s)),
            Some(_) => {
                map.remove(id);
                None
            }
            None => None,
        }
    }

    /// A new session; authenticated from the start when no token is configured.
    fn create(&self, login: Option<Login>, authenticated: bool) -> Visitor {
        let id = secret();
        let session = Session {
            login: login.unwrap_or_else(|| Login {
                name: self.default_name.clone(),
                role: None,
                projects: Vec::new(),
                token: None,
            }),
            csrf: secret(),
            authenticated: authenticated || !self.login_required(),
            expires: Instant::now() + self.ttl,
            flash: None,
        };
        let mut map = self.lock();
        if map.len() >= MAX_SESSIONS {
            let now = Instant::now();
            map.retain(|_, s| s.expires > now);
        }
        if map.len() >= MAX_SESSIONS {
            map.retain(|_, s| s.authenticated && s.login.name != self.default_name);
        }
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        let visitor = self.visitor(&id, &session);
        map.insert(id, session);
        visitor
    }

    fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    pub(super) fn set_flash(&self, id: &str, text: impl Into<String>, error: bool) {
        if let Some(s) = self.lock().get_mut(id) {
            s.flash = Some(Flash {
                text: text.into(),
                error,
            });
        }
    }

    pub(super) fn take_flash(&self, id: &str) -> Option<Flash> {
        self.lock().get_mut(id).and_then(|s| s.flash.take())
    }

    fn cookie(&self, id: &str) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let v = format!(
            "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Lax; Max-Age={}{secure}",
            self.ttl.as_secs()
        );
        HeaderValue::from_str(&v)
            .unwrap_or_else(|_| HeaderValue::from_static("cairn_console=; Path=/; Max-Age=0"))
    }
}

/// The session id in the request's cookies, if any.
fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Middleware: finds or starts the visitor's session and hands handlers a [`Visitor`].
pub(super) async fn attach(
    State(console): State<Console>,
    mut req: Request,
    next: Next,
) -> Response {
    let sessions = console.sessions();
    let found = session_cookie(req.headers()).and_then(|id| sessions.find(&id));
    let (mut visitor, created) = match found {
        Some(v) => (v, false),
        None => (sessions.create(None, false), true),
    };
    visitor.peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let id = visitor.session_id.clone();
    req.extensions_mut().insert(visitor);
    let mut res = next.run(req).await;
    if created && !res.headers().contains_key(header::SET_COOKIE) {
        res.headers_mut()
            .append(header::SET_COOKIE, sessions.cookie(&id));
    }
    res
}

#[derive(Deserialize)]
struct CsrfField {
    #[serde(default)]
    csrf: String,
}

/// Middleware: every request that changes something must carry the session's CSRF token in
/// its form (field `csrf`); otherwise 403 before any handler runs.
pub(super) async fn check_csrf(
    Extension(visitor): Extension<Visitor>,
    req: Request,
    next: Next,
) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_FORM_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return ConsoleError::BadRequest(format!(
                "the form is larger than {} KiB",
                MAX_FORM_BYTES >> 10
            ))
            .into_response()
        }
    };
    let probe = Request::from_parts(parts.clone(), Body::from(bytes.clone()));
    let given = match Form::<CsrfField>::from_request(probe, &()).await {
        Ok(Form(f)) => f.csrf,
        Err(_) => String::new(),
    };
    if given.is_empty() || !same_secret(&given, &visitor.csrf) {
        tracing::warn!(path = %parts.uri.path(), "POST refused: missing or wrong CSRF token");
        return ConsoleError::Forbidden(
            "this form is missing its CSRF token or it belongs to another session; reload the page and try again".into(),
        )
        .into_response();
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Middleware: with a token configured, everything but the login page and the static files
/// needs a logged-in session; pages of a project need a session that may see it.
pub(super) async fn require_login(
    Extension(visitor): Extension<Visitor>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    if visitor.authenticated {
        if let Some(project) = path
            .strip_prefix("/projects/")
            .and_then(|rest| rest.split('/').next())
        {
            let project = percent_encoding::percent_decode_str(project).decode_utf8_lossy();
            if !visitor.may_see(&project) {
                tracing::warn!(principal = %visitor.name, peer = %visitor.peer_text(), project = %project, "console request refused: project");
                return ConsoleError::Forbidden(format!(
                    "`{}` may see project(s) {} only",
                    visitor.name,
                    visitor.projects.join(", ")
                ))
                .into_response();
            }
        }
        return next.run(req).await;
    }
    if path == "/login" || path.starts_with("/static/") {
        return next.run(req).await;
    }
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        let target = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/runs");
        return Redirect::to(&format!("/login?next={}", page::qv(target))).into_response();
    }
    ConsoleError::Unauthenticated.into_response()
}

/// Where to go after logging in: only a path of this console.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.contains('\\')
                && !n.chars().any(char::is_control) =>
        {
            n.to_owned()
        }
        _ => "/runs".to_owned(),
    }
}

#[derive(Deserialize)]
pub(super) struct LoginQuery {
    next: Option<String>,
}

pub(super) async fn login_form(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Query(q): Query<LoginQuery>,
) -> Response {
    let flash = console.sessions().take_flash(&visitor.session_id);
    login_page(&visitor, q.next.as_deref(), flash.as_ref(), StatusCode::OK)
}

fn login_page(
    visitor: &Visitor,
    next: Option<&str>,
    flash: Option<&Flash>,
    status: StatusCode,
) -> Response {
    let body = html! {
        h1 { (if visitor.login_required { "Log in" } else { "Who are you?" }) }
        @if visitor.user_tokens {
            p.hint { "Log in with your personal token (an admin makes one with " code { "cairn tokens add" } "). Your name and role come with it; every gate decision, note and edit you make here is recorded under your name." }
        } @else {
            p.hint { "Your name is recorded with every gate decision, note and edit you make here." }
        }
        form.card method="post" action="/login" {
            input type="hidden" name="csrf" value=(visitor.csrf);
            input type="hidden" name="next" value=(safe_next(next));
            @if !visitor.user_tokens {
                label { "Name" input type="text" name="name" value=(visitor.name) maxlength="64" required; }
            }
            @if visitor.login_required {
                label { "Token" input type="password" name="token" autocomplete="current-password" required; }
            }
            button type="submit" { (if visitor.login_required { "Log in" } else { "Save" }) }
        }
    };
    let visible = visitor.authenticated.then_some(visitor);
    (status, layout("Log in", visible, flash, body)).into_response()
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    token: String,
    #[serde(default)]
    next: Option<String>,
}

/// A name people may give: 1-64 printable characters.
fn valid_name(name: &str) -> Option<String> {
    let n = name.trim();
    (!n.is_empty() && n.chars().count() <= MAX_NAME_CHARS && !n.chars().any(char::is_control))
        .then(|| n.to_owned())
}

/// Whose personal token this is, as the orchestrator says; None for a token it does not know.
async fn who_is(console: &Console, token: &str) -> Result<Option<Login>, ConsoleError> {
    if token.trim().is_empty() {
        return Ok(None);
    }
    let Ok(mut client) = console.orchestrator_as(token) else {
        return Ok(None);
    };
    let who = match console
        .call(
            "checking the token",
            client.who_am_i(cairn_proto::v1::WhoAmIRequest {}),
        )
        .await
    {
        Ok(who) => who,
        Err(ConsoleError::Rpc {
            code: tonic::Code::Unauthenticated,
            ..
        }) => return Ok(None),
        Err(e) => return Err(e),
    };
    if !who.tokens_required {
        // It would accept anybody as an admin.
        return Err(ConsoleError::Config(
            "console.user_tokens is on but the orchestrator has no tokens file: set [auth] tokens_file (cairn up --tokens-file)".into(),
        ));
    }
    let role = who.role.parse::<Role>().map_err(ConsoleError::BadRequest)?;
    Ok(Some(Login {
        name: who.name,
        role: Some(role),
        projects: who.projects,
        token: Some(Secret(token.trim().to_owned())),
    }))
}

pub(super) async fn login(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Form(form): Form<LoginForm>,
) -> Response {
    let sessions = console.sessions();
    let bad_name = || {
        let flash = Flash {
            text: "Give a name of 1-64 printable characters.".into(),
            error: true,
        };
        login_page(
            &visitor,
            form.next.as_deref(),
            Some(&flash),
            StatusCode::BAD_REQUEST,
        )
    };
    let login = if sessions.user_tokens {
        let turn = console
            .inner
            .throttle
            .turn(visitor.peer.map(|p| p.ip()))
            .await;
        match who_is(&console, &form.token).await {
            Ok(Some(login)) => {
                turn.succeeded();
                Some(login)
            }
            Ok(None) => {
                let failures = turn.failed();
                tracing::warn!(peer = %visitor.peer_text(), failures, "console login refused: unknown token");
                None
            }
            Err(e) => return e.into_response(),
        }
    } else {
        let Some(name) = valid_name(&form.name) else {
            return bad_name();
        };
        let login = Login {
            name,
            role: None,
            projects: Vec::new(),
            token: None,
        };
        match &sessions.token {
            None => Some(login),
            Some(token) => {
                let turn = console
                    .inner
                    .throttle
                    .turn(visitor.peer.map(|p| p.ip()))
                    .await;
                if same_secret(&form.token, token) {
                    turn.succeeded();
                    Some(login)
                } else {
                    let failures = turn.failed();
                    tracing::warn!(peer = %visitor.peer_text(), failures, "console login refused: wrong token");
                    None
                }
            }
        }
    };
    let Some(login) = login else {
        let flash = Flash {
            text: "Wrong token.".into(),
            error: true,
        };
        return login_page(
            &visitor,
            form.next.as_deref(),
            Some(&flash),
            StatusCode::UNAUTHORIZED,
        );
    };
    sessions.remove(&visitor.session_id);
    let name = login.name.clone();
    let fresh = sessions.create(Some(login), true);
    tracing::info!(name = %name, role = ?fresh.role, peer = %visitor.peer_text(), "console login");
    let mut res = Redirect::to(&safe_next(form.next.as_deref())).into_response();
    res.headers_mut()
        .append(header::SET_COOKIE, sessions.cookie(&fresh.session_id));
    res
}

pub(super) async fn logout(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
) -> Response {
    console.sessions().remove(&visitor.session_id);
    let mut res = Redirect::to("/login").into_response();
    res.headers_mut().append(
        header::SET_COOKIE,
        HeaderValue::from_static("cairn_console=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0"),
    );
    res
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_by_content() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("", "abc"));
        assert_ne!(secret(), secret());
        assert_eq!(secret().len(), 64);
    }

    #[test]
    fn next_stays_on_the_console() {
        assert_eq!(safe_next(Some("/projects/p/runs/r")), "/projects/p/runs/r");
        assert_eq!(safe_next(Some("//evil.example/")), "/runs");
        assert_eq!(safe_next(Some("https://evil.example/")), "/runs");
        assert_eq!(safe_next(Some("/\\evil.example")), "/runs");
        assert_eq!(safe_next(None), "/runs");
    }

    #[test]
    fn cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        let id = "a".repeat(64);
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("x=1; {COOKIE}={id}; y=2")).unwrap(),
        );
        assert_eq!(session_cookie(&h), Some(id));
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("cairn_console=../../etc"),
        );
        assert_eq!(session_cookie(&h), None);
    }
}
