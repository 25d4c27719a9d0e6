//! Humans as principals: who is calling the orchestrator (a bearer token from the tokens file),
//! what each role may do (the one table, [`Rpc::required_role`]), and on which projects.
//!
//! The orchestrator asks [`Auth::authorize`] at the top of every handler, before anything is
//! read or written; what it returns ([`Caller`]) is the only source of the `by` recorded.
//! Without a tokens file nothing is checked (the single-user loopback default) and the
//! client's `by` is kept. This crate must never trust a name the client sends when a token is
//! configured, nor compare a token other than by constant-time hash comparison.

pub mod jwt;
mod throttle;
pub mod tokens;
mod watched;

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use cairn_server::roles::{Bearer, Role, Rpc, AUTHORIZATION};
use jwt::{JwtConfig, JwtVerifier};
use tokens::TokensFile;
use watched::Watched;

/// Why a configuration was not taken or a call was refused; the orchestrator maps each to its
/// gRPC status (INVALID_ARGUMENT, UNAUTHENTICATED, UNAVAILABLE with a retry delay,
/// PERMISSION_DENIED with the reason word).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    /// No token, or one nobody is known by.
    #[error("{0}")]
    Unauthenticated(String),
    /// Too many wrong tokens from the caller's address lately.
    #[error("too many wrong tokens from this address; retry in {retry_after_s} s")]
    Throttled { retry_after_s: u64 },
    /// The caller's role or project scope does not allow the call; `reason` is `role` or
    /// `project`.
    #[error("{message}")]
    PermissionDenied {
        reason: &'static str,
        message: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// `[auth]` of the orchestrator's configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// The tokens file (`cairn tokens add`); empty = no tokens.
    pub tokens_file: String,
    /// People signed in at an identity provider (OIDC JWTs); off until `jwks_file` is set.
    /// With neither tokens nor JWTs, nothing is authenticated (the loopback default).
    pub jwt: JwtConfig,
}

/// Who made a call, as far as the orchestrator knows.
#[derive(Clone, Debug, PartialEq)]
pub struct Caller {
    pub name: String,
    pub role: Role,
    /// Empty = every project.
    pub projects: Vec<String>,
    /// True when the name comes from a token (then it is the only `by` recorded).
    pub authenticated: bool,
}

impl Caller {
    /// Without a tokens file: the connecting user, whoever it is.
    fn local() -> Caller {
        Caller {
            name: "local".into(),
            role: Role::Admin,
            projects: Vec::new(),
            authenticated: false,
        }
    }

    /// The `by` to record: the token's name; without tokens, the name the client gave.
    pub fn by(&self, claimed: &str) -> String {
        if !self.authenticated {
            return claimed.to_owned();
        }
        if !claimed.is_empty() && claimed != self.name {
            tracing::debug!(principal = %self.name, claimed, "ignoring the client's `by`: the token's name is recorded");
        }
        self.name.clone()
    }
}

/// Authentication and authorization of the orchestrator's callers.
pub struct Auth {
    tokens: Option<Watched<TokensFile>>,
    jwt: Option<JwtVerifier>,
    throttle: throttle::Throttle,
}

/// Why a call was refused: the reason word and the message.
enum Refusal {
    Unauthenticated(String),
    Denied(&'static str, String),
    Throttled(std::time::Duration),
}

/// Why a presented token stands for nobody.
enum Unknown {
    /// Too many wrong tokens from the caller's address lately (not even checked).
    Throttled(std::time::Duration),
    Wrong(String),
}

impl Auth {
    pub fn new(config: &AuthConfig) -> Result<Auth> {
        let path = config.tokens_file.trim();
        let tokens = if path.is_empty() {
            None
        } else {
            let w = Watched::open(Path::new(path), "tokens file", |p| {
                TokensFile::read(p).map_err(|e| e.to_string())
            })
            .map_err(|e| Error::Config(format!("auth.tokens_file: {e}")))?;
            if w.current().tokens.is_empty() && !config.jwt.is_on() {
                tracing::warn!(path, "the tokens file has no tokens: every call will be refused; add one with `cairn tokens add`");
            }
            Some(w)
        };
        let jwt = if config.jwt.is_on() {
            Some(JwtVerifier::new(&config.jwt).map_err(Error::Config)?)
        } else {
            None
        };
        Ok(Auth {
            tokens,
            jwt,
            throttle: Default::default(),
        })
    }

    pub fn tokens_required(&self) -> bool {
        self.tokens.is_some() || self.jwt.is_some()
    }

    /// Who a bearer token stands for: a JWT (three dot-separated parts) when JWTs are on,
    /// else an entry of the tokens file.
    fn principal(&self, token: &str) -> std::result::Result<Caller, String> {
        if let Some(jwt) = &self.jwt {
            if jwt::looks_like_jwt(token) {
                return jwt.verify(token);
            }
        }
        let Some(tokens) = &self.tokens else {
            return Err("this orchestrator accepts only JWTs from its identity provider; sign in there and send the ID token".into());
        };
        match tokens.current().find(token) {
            None => Err("the token is not known (mistyped, or removed from the tokens file); ask an admin for one (`cairn tokens add`)".into()),
            Some(e) => Ok(Caller {
                name: e.name.clone(),
                role: e.role,
                projects: e.projects.clone(),
                authenticated: true,
            }),
        }
    }

    /// [`Auth::principal`] behind the throttle of wrong tokens per peer address.
    fn checked_principal(
        &self,
        peer: Option<std::net::IpAddr>,
        token: &str,
    ) -> std::result::Result<Caller, Unknown> {
        self.throttle.check(peer).map_err(Unknown::Throttled)?;
        self.principal(token).map_err(|why| {
            self.throttle.failed(peer);
            Unknown::Wrong(why)
        })
    }

    /// Who calls `rpc` on `project`, if the table lets them; every refusal is logged at warn
    /// with the principal (or "anonymous"), the peer address, the RPC and the reason.
    pub fn authorize<T>(&self, req: &tonic::Request<T>, rpc: Rpc, project: &str) -> Result<Caller> {
        if !self.tokens_required() {
            return Ok(Caller::local());
        }
        let addr = req.remote_addr().map(|a| a.ip());
        let peer = req
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "unknown".into());
        let decided = match bearer_of(req.metadata()).map(|t| self.checked_principal(addr, t)) {
            Err(why) => Err((None, Refusal::Unauthenticated(why))),
            Ok(Err(Unknown::Throttled(wait))) => Err((None, Refusal::Throttled(wait))),
            Ok(Err(Unknown::Wrong(why))) => Err((None, Refusal::Unauthenticated(why))),
            Ok(Ok(caller)) => match check(&caller, rpc, project) {
                Ok(()) => Ok(caller),
                Err(r) => Err((Some(caller.name), r)),
            },
        };
        decided.map_err(|(who, refusal)| {
            let who = who.unwrap_or_else(|| "anonymous".into());
            let (reason, error) = match refusal {
                Refusal::Unauthenticated(m) => ("unauthenticated", Error::Unauthenticated(m)),
                Refusal::Throttled(wait) => (
                    "throttled",
                    Error::Throttled {
                        retry_after_s: wait.as_secs().max(1),
                    },
                ),
                Refusal::Denied(reason, message) => {
                    (reason, Error::PermissionDenied { reason, message })
                }
            };
            tracing::warn!(principal = %who, peer = %peer, rpc = rpc.name(), reason, project, "call refused");
            error
        })
    }
}

/// The store, ingest and the runner on a host with tokens (`cairn up --tokens-file`): an
/// admin token for every project acts as the `cli` identity there, other tokens get nothing.
impl cairn_server::access::TokenCheck for Auth {
    fn check(
        &self,
        peer: Option<std::net::IpAddr>,
        token: &str,
    ) -> cairn_server::access::TokenHolder {
        use cairn_server::access::TokenHolder;
        match self.checked_principal(peer, token) {
            Ok(c) if c.role == Role::Admin && c.projects.is_empty() => {
                TokenHolder::Admin { name: c.name }
            }
            Ok(c) => TokenHolder::Limited {
                name: c.name,
                role: c.role.to_string(),
            },
            Err(Unknown::Throttled(retry_after)) => TokenHolder::Throttled { retry_after },
            Err(Unknown::Wrong(why)) => TokenHolder::Invalid(why),
        }
    }
}

/// The table and the project scope applied to one authenticated caller.
fn check(caller: &Caller, rpc: Rpc, project: &str) -> std::result::Result<(), Refusal> {
    let needed = rpc.required_role();
    if caller.role < needed {
        return Err(Refusal::Denied(
            "role",
            format!(
                "`{}` has role {}; {} needs role {needed} or above (ask an admin to change the role in the tokens file)",
                caller.name,
                caller.role,
                rpc.name()
            ),
        ));
    }
    if rpc.has_project()
        && !caller.projects.is_empty()
        && !caller.projects.iter().any(|p| p == project)
    {
        return Err(Refusal::Denied(
            "project",
            format!(
                "`{}` may act on project(s) {} only, not `{project}`",
                caller.name,
                caller.projects.join(", ")
            ),
        ));
    }
    Ok(())
}

/// The token of an `authorization: Bearer <token>` header.
fn bearer_of(md: &tonic::metadata::MetadataMap) -> std::result::Result<&str, String> {
    let Some(v) = md.get(AUTHORIZATION) else {
        return Err("this orchestrator needs a token: send `authorization: Bearer <token>` (cairn --token or CAIRN_TOKEN; an admin makes one with `cairn tokens add`)".into());
    };
    let v = v
        .to_str()
        .map_err(|_| "the authorization header is not text".to_owned())?;
    match v.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err("the authorization header must be `Bearer <token>`".into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bearer_header_forms() {
        let mut md = tonic::metadata::MetadataMap::new();
        assert!(bearer_of(&md).is_err());
        md.insert(AUTHORIZATION, "Basic abc".parse().unwrap());
        assert!(bearer_of(&md).is_err());
        md.insert(AUTHORIZATION, "bearer abc".parse().unwrap());
        assert_eq!(bearer_of(&md).unwrap(), "abc");
        md.insert(AUTHORIZATION, "Bearer ".parse().unwrap());
        assert!(bearer_of(&md).is_err());
    }

    /// What `f` logs, at debug level and above.
    fn logged_by(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let out = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = lines.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_token_holders_by_is_the_tokens_name_and_another_claimed_name_is_logged() {
        let ann = Caller {
            name: "ann".into(),
            role: Role::Viewer,
            projects: Vec::new(),
            authenticated: true,
        };
        let lines = logged_by(|| {
            assert_eq!(ann.by("mallory"), "ann");
            assert_eq!(ann.by(""), "ann");
            assert_eq!(ann.by("ann"), "ann");
        });
        // Only the name that differs from the token's is worth a line.
        assert_eq!(
            lines.matches("ignoring the client's `by`").count(),
            1,
            "{lines}"
        );
        assert!(
            lines.contains("mallory") && lines.contains("ann"),
            "{lines}"
        );
        // Without tokens, the client's name is the only one there is.
        assert_eq!(Caller::local().by("bob"), "bob");
    }

    /// The store, ingest and the runner (`cairn up --tokens-file`) ask the orchestrator's
    /// tokens who a bearer is: only an admin of every project acts as their `cli` identity.
    #[test]
    fn only_an_admin_token_for_every_project_is_an_admin_on_the_other_services() {
        use cairn_server::access::{TokenCheck, TokenHolder};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let mut file = TokensFile::read_or_empty(&path).unwrap();
        let root = file.add("root", Role::Admin, &[]).unwrap();
        let web_admin = file.add("wadmin", Role::Admin, &["web".into()]).unwrap();
        let viewer = file.add("vera", Role::Viewer, &[]).unwrap();
        file.write(&path).unwrap();
        let auth = Auth::new(&AuthConfig {
            tokens_file: path.display().to_string(),
            ..AuthConfig::default()
        })
        .unwrap();
        let peer = Some(std::net::IpAddr::from([127, 0, 0, 1]));
        let limited = |name: &str, role: &str| TokenHolder::Limited {
            name: name.into(),
            role: role.into(),
        };
        assert_eq!(
            auth.check(peer, &root),
            TokenHolder::Admin {
                name: "root".into()
            }
        );
        assert_eq!(auth.check(peer, &web_admin), limited("wadmin", "admin"));
        assert_eq!(auth.check(peer, &viewer), limited("vera", "viewer"));
        assert!(matches!(
            auth.check(peer, "cairn_wrong"),
            TokenHolder::Invalid(m) if m.contains("not known")
        ));
    }

    /// A tokens file with one person per role (and `webop`, an operator of `web` only), the
    /// `Auth` reading it, and each person's token.
    fn people() -> (
        tempfile::TempDir,
        Auth,
        std::collections::HashMap<&'static str, String>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let mut file = TokensFile::read_or_empty(&path).unwrap();
        let mut tokens = std::collections::HashMap::new();
        for (name, role, projects) in [
            ("vera", Role::Viewer, vec![]),
            ("otto", Role::Operator, vec![]),
            ("april", Role::Approver, vec![]),
            ("ada", Role::Admin, vec![]),
            ("webop", Role::Operator, vec!["web".to_owned()]),
        ] {
            tokens.insert(name, file.add(name, role, &projects).unwrap());
        }
        file.write(&path).unwrap();
        let auth = Auth::new(&AuthConfig {
            tokens_file: path.display().to_string(),
            ..AuthConfig::default()
        })
        .unwrap();
        (dir, auth, tokens)
    }

    /// A request carrying `header` as its authorization, from `peer` when given.
    fn request(header: Option<&str>, peer: Option<[u8; 4]>) -> tonic::Request<()> {
        let mut req = tonic::Request::new(());
        if let Some(h) = header {
            req.metadata_mut().insert(AUTHORIZATION, h.parse().unwrap());
        }
        if let Some(ip) = peer {
            req.extensions_mut()
                .insert(tonic::transport::server::TcpConnectInfo {
                    local_addr: None,
                    remote_addr: Some((ip, 50_000).into()),
                });
        }
        req
    }

    fn bearer(token: &str) -> Option<String> {
        Some(format!("Bearer {token}"))
    }

    #[test]
    fn without_tokens_every_call_is_the_local_admins_and_keeps_the_clients_name() {
        let auth = Auth::new(&AuthConfig::default()).unwrap();
        assert!(!auth.tokens_required());
        let c = auth
            .authorize(&request(None, None), Rpc::ApproveGate, "web")
            .unwrap();
        assert_eq!(c, Caller::local());
        assert_eq!((c.role, c.authenticated), (Role::Admin, false));
        assert_eq!(c.by("bob"), "bob");
    }

    #[test]
    fn a_call_without_a_known_bearer_token_is_unauthenticated() {
        let (_dir, auth, _) = people();
        assert!(auth.tokens_required());
        for (header, says) in [
            (None, "needs a token"),
            (Some("Basic abc".to_owned()), "must be `Bearer <token>`"),
            (bearer("cairn_0123"), "not known"),
        ] {
            match auth.authorize(&request(header.as_deref(), None), Rpc::GetRun, "web") {
                Err(Error::Unauthenticated(m)) => assert!(m.contains(says), "{m}"),
                other => panic!("{header:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn each_role_may_make_exactly_the_calls_its_role_allows_on_any_project() {
        let (_dir, auth, tokens) = people();
        let rank = |name: &str| match name {
            "vera" => Role::Viewer,
            "otto" => Role::Operator,
            "april" => Role::Approver,
            _ => Role::Admin,
        };
        let rpcs = [
            Rpc::GetRun,
            Rpc::WhoAmI,
            Rpc::SubmitRun,
            Rpc::EditTask,
            Rpc::ApproveGate,
            Rpc::RejectGate,
        ];
        for name in ["vera", "otto", "april", "ada"] {
            let token = &tokens[name];
            for rpc in rpcs {
                let got = auth.authorize(&request(bearer(token).as_deref(), None), rpc, "any");
                if rank(name) >= rpc.required_role() {
                    let c = got.unwrap_or_else(|e| panic!("{name} {rpc:?}: {e:?}"));
                    assert_eq!((c.name.as_str(), c.role), (name, rank(name)));
                    assert!(c.authenticated && c.projects.is_empty());
                    assert_eq!(c.by("someone-else"), name);
                } else {
                    match got {
                        Err(Error::PermissionDenied { reason, message }) => {
                            assert_eq!(reason, "role", "{name} {rpc:?}");
                            assert!(
                                message.contains(name) && message.contains(rpc.name()),
                                "{message}"
                            );
                        }
                        other => panic!("{name} {rpc:?} must be refused: {other:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn a_project_scoped_token_acts_on_its_projects_only() {
        let (_dir, auth, tokens) = people();
        let req = || request(bearer(&tokens["webop"]).as_deref(), None);
        let c = auth.authorize(&req(), Rpc::SubmitRun, "web").unwrap();
        assert_eq!(c.projects, vec!["web".to_owned()]);
        match auth.authorize(&req(), Rpc::GetRun, "api") {
            Err(Error::PermissionDenied { reason, message }) => {
                assert_eq!(reason, "project");
                assert!(
                    message.contains("`api`") && message.contains("web"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        // A call on no project (who am I) is not scoped.
        assert!(auth.authorize(&req(), Rpc::WhoAmI, "").is_ok());
        // The role is checked before the project.
        match auth.authorize(&req(), Rpc::ApproveGate, "api") {
            Err(Error::PermissionDenied { reason, .. }) => assert_eq!(reason, "role"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn wrong_tokens_from_one_address_are_throttled_and_its_right_ones_wait_too() {
        let (_dir, auth, tokens) = people();
        let (a, b) = ([127, 0, 0, 1], [127, 0, 0, 2]);
        for _ in 0..throttle::LIMIT {
            let r = auth.authorize(
                &request(bearer("cairn_x").as_deref(), Some(a)),
                Rpc::GetRun,
                "w",
            );
            assert!(matches!(r, Err(Error::Unauthenticated(_))), "{r:?}");
        }
        let right = bearer(&tokens["vera"]);
        match auth.authorize(&request(right.as_deref(), Some(a)), Rpc::GetRun, "w") {
            Err(Error::Throttled { retry_after_s }) => {
                assert!((1..=throttle::WINDOW.as_secs()).contains(&retry_after_s))
            }
            other => panic!("{other:?}"),
        }
        // Another address, and a call with no address, are not held back.
        assert!(auth
            .authorize(&request(right.as_deref(), Some(b)), Rpc::GetRun, "w")
            .is_ok());
        assert!(auth
            .authorize(&request(right.as_deref(), None), Rpc::GetRun, "w")
            .is_ok());
        // Right tokens do not count as failures.
        for _ in 0..throttle::LIMIT + 1 {
            assert!(auth
                .authorize(&request(right.as_deref(), Some(b)), Rpc::GetRun, "w")
                .is_ok());
        }
    }

    #[test]
    fn every_refusal_is_logged_with_who_from_where_which_call_and_why() {
        let (_dir, auth, tokens) = people();
        let lines = logged_by(|| {
            let _ = auth.authorize(&request(None, Some([10, 1, 2, 3])), Rpc::SubmitRun, "web");
            let _ = auth.authorize(
                &request(bearer(&tokens["vera"]).as_deref(), Some([10, 1, 2, 4])),
                Rpc::EditTask,
                "web",
            );
            let _ = auth.authorize(
                &request(bearer(&tokens["vera"]).as_deref(), None),
                Rpc::GetRun,
                "web",
            );
        });
        let refused: Vec<&str> = lines
            .lines()
            .filter(|l| l.contains("call refused"))
            .collect();
        assert_eq!(refused.len(), 2, "{lines}");
        for (line, who, peer, rpc, reason) in [
            (
                refused[0],
                "anonymous",
                "10.1.2.3:50000",
                "SubmitRun",
                "unauthenticated",
            ),
            (refused[1], "vera", "10.1.2.4:50000", "EditTask", "role"),
        ] {
            assert!(line.contains("WARN"), "{line}");
            for part in [who, peer, rpc, reason, "web"] {
                assert!(line.contains(part), "{part} missing: {line}");
            }
        }
    }

    #[test]
    fn with_jwts_only_a_token_that_is_no_jwt_is_told_to_sign_in() {
        let (_dir, auth, _) = people();
        // Not a JWT and not in the file: the file's answer.
        assert!(matches!(auth.principal("cairn_x"), Err(m) if m.contains("not known")));
        let jwt_only = Auth {
            tokens: None,
            jwt: None,
            throttle: Default::default(),
        };
        assert!(matches!(jwt_only.principal("cairn_x"), Err(m) if m.contains("only JWTs")));
    }

    #[test]
    fn a_tokens_file_that_cannot_be_read_is_a_configuration_error_naming_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.toml");
        match Auth::new(&AuthConfig {
            tokens_file: missing.display().to_string(),
            ..AuthConfig::default()
        }) {
            Err(Error::Config(m)) => assert!(
                m.contains("auth.tokens_file") && m.contains("none.toml"),
                "{m}"
            ),
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("a missing tokens file must be refused"),
        }
        // Blank is no tokens file at all.
        let blank = Auth::new(&AuthConfig {
            tokens_file: "  ".into(),
            ..AuthConfig::default()
        })
        .unwrap();
        assert!(!blank.tokens_required());
    }
}
