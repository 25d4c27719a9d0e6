//! Who may call which RPC: one table of identity → allowed methods, enforced by a layer in
//! front of every service a [`crate::Host`] serves. In-process callers, and plaintext callers
//! of a host that requires no credential (`local`: loopback, or a listener told
//! `--insecure-listen`), are the single trusted user and pass; certificate identities get only
//! what the table grants. On a host that requires tokens ([`TokenCheck`]) a plaintext caller
//! is `anonymous`: it reaches the orchestrator (which checks the token itself) and the probes;
//! an admin token for every project acts as `cli`; anything else is refused. Health and
//! reflection are open to every authenticated caller (probes). Every refusal is logged at warn with the identity, the
//! peer's address, the RPC and the reason. Finer rules (which paths an identity may write)
//! belong to the service that owns the data; the store applies them itself.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::body::Body;

use crate::caller::{Caller, Principal, Unidentified};
use crate::inproc::InProcess;

/// Services that authenticate their callers' tokens themselves: an `anonymous` caller reaches
/// them, and they decide.
const CHECKS_TOKENS: &str = "cairn.v1.Orchestrator/*";

/// The identity an admin token acts as on a host that requires tokens.
pub const ADMIN_TOKEN_IDENTITY: &str = "cli";

/// What a host that requires tokens learns of a bearer token. The orchestrator's
/// authentication implements it (tokens file, JWTs, the throttle of wrong tokens).
pub trait TokenCheck: Send + Sync {
    /// Who `token` stands for, presented from `peer`.
    fn check(&self, peer: Option<IpAddr>, token: &str) -> TokenHolder;
}

/// The answer of a [`TokenCheck`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenHolder {
    /// An admin for every project: acts as [`ADMIN_TOKEN_IDENTITY`].
    Admin { name: String },
    /// A valid token that is not an admin's for every project.
    Limited { name: String, role: String },
    /// Not a token this deployment knows; the message says what to do.
    Invalid(String),
    /// Too many wrong tokens from this peer lately.
    Throttled { retry_after: Duration },
}

/// Methods every authenticated caller may use.
const OPEN: [&str; 3] = [
    "grpc.health.v1.Health/*",
    "grpc.reflection.v1.ServerReflection/*",
    "grpc.reflection.v1alpha.ServerReflection/*",
];

/// The built-in table (docs/security.md shows it; `[access]` in a service's config replaces
/// the entry of an identity). Patterns: `package.Service/Method`, `package.Service/*`, `*`.
pub fn default_table() -> BTreeMap<String, Vec<String>> {
    let store_read = [
        "cairn.v1.ArtifactStore/Get",
        "cairn.v1.ArtifactStore/Stat",
        "cairn.v1.ArtifactStore/List",
        "cairn.v1.ArtifactStore/ListProjects",
        "cairn.v1.ArtifactStore/ReadEvents",
        "cairn.v1.ArtifactStore/ListRunSummaries",
    ];
    // Everything the orchestrator does with the store; backups, restores and archiving are
    // the operator's (admin) alone.
    let store_driver = [
        "cairn.v1.ArtifactStore/CreateProject",
        "cairn.v1.ArtifactStore/Put",
        "cairn.v1.ArtifactStore/Delete",
        "cairn.v1.ArtifactStore/AppendEvents",
        "cairn.v1.ArtifactStore/ClaimRun",
        "cairn.v1.ArtifactStore/GrantIngestClaim",
        "cairn.v1.ArtifactStore/UpdateJson",
    ];
    let rows: [(&str, Vec<&str>); 6] = [
        (
            "orchestrator",
            [
                &store_read[..],
                &store_driver[..],
                &[
                    "cairn.v1.Ingest/*",
                    "cairn.v1.SandboxRunner/*",
                    // Replicas forward calls about a run to the replica that drives it.
                    "cairn.v1.Orchestrator/*",
                ],
            ]
            .concat(),
        ),
        (
            "ingest",
            [
                &store_read[..],
                &[
                    "cairn.v1.ArtifactStore/Put",
                    "cairn.v1.ArtifactStore/AppendEvents",
                    "cairn.v1.ArtifactStore/CreateProject",
                ],
            ]
            .concat(),
        ),
        ("sandbox-runner", vec![]),
        (
            "console",
            [&store_read[..], &["cairn.v1.Orchestrator/*"]].concat(),
        ),
        // The operator's admin tool: every cairn RPC.
        ("cli", vec!["cairn.v1.*"]),
        ("artifact-store", vec![]),
    ];
    rows.into_iter()
        .map(|(id, methods)| {
            (
                id.to_owned(),
                methods.into_iter().map(str::to_owned).collect(),
            )
        })
        .collect()
}

/// Why a call was refused; the word goes into the `cairn-reason` trailer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No usable identity on a TLS connection.
    Unauthenticated(&'static str),
    /// The identity may not call this method.
    Denied,
}

/// The access table of one host.
#[derive(Debug, Clone)]
pub struct Access {
    table: BTreeMap<String, Vec<String>>,
}

impl Default for Access {
    fn default() -> Self {
        Access {
            table: default_table(),
        }
    }
}

impl Access {
    /// The built-in table with `overrides` replacing whole entries (an identity → its methods).
    pub fn with_overrides(overrides: &BTreeMap<String, Vec<String>>) -> Access {
        let mut table = default_table();
        for (id, methods) in overrides {
            table.insert(id.clone(), methods.clone());
        }
        Access { table }
    }

    /// Whether `caller` may call `path` (`/package.Service/Method`).
    pub fn allows(&self, caller: &Caller, path: &str) -> bool {
        let method = path.trim_start_matches('/');
        if caller.is_local() || OPEN.iter().any(|p| matches(p, method)) {
            return true;
        }
        if caller.principal == Principal::Anonymous {
            return matches(CHECKS_TOKENS, method);
        }
        self.table
            .get(caller.name())
            .is_some_and(|patterns| patterns.iter().any(|p| matches(p, method)))
    }
}

fn matches(pattern: &str, method: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => method.starts_with(prefix),
        None => pattern == method,
    }
}

/// Logs a refused call at warn: who (or "anonymous"), from where, which RPC, why.
pub fn audit_refusal(identity: &str, peer: &str, rpc: &str, reason: &str) {
    tracing::warn!(identity, peer, rpc, reason, "call refused");
}

/// The layer: identifies the caller, refuses what the table does not grant, and hands the
/// [`Caller`] to the service in the request's extensions.
#[derive(Clone)]
pub struct AccessLayer {
    access: Arc<Access>,
    tokens: Option<Arc<dyn TokenCheck>>,
}

impl AccessLayer {
    /// `tokens`: the host requires a token (or a certificate) from every caller.
    pub fn new(access: Access, tokens: Option<Arc<dyn TokenCheck>>) -> AccessLayer {
        AccessLayer {
            access: Arc::new(access),
            tokens,
        }
    }
}

impl<S> tower::Layer<S> for AccessLayer {
    type Service = AccessService<S>;
    fn layer(&self, inner: S) -> AccessService<S> {
        AccessService {
            inner,
            access: self.access.clone(),
            tokens: self.tokens.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AccessService<S> {
    inner: S,
    access: Arc<Access>,
    tokens: Option<Arc<dyn TokenCheck>>,
}

/// Who a plaintext caller of a host that requires tokens is, by its bearer token.
fn by_token(
    tokens: &dyn TokenCheck,
    caller: Caller,
    rpc: &str,
    authorization: Option<&http::HeaderValue>,
) -> Result<Caller, tonic::Status> {
    let refuse = |code, who: &str, reason, message: String| {
        audit_refusal(who, &caller.peer_text(), rpc, reason);
        cairn_proto::reason::status(code, message, reason)
    };
    if OPEN.iter().any(|p| matches(p, rpc)) || matches(CHECKS_TOKENS, rpc) {
        return Ok(Caller {
            principal: Principal::Anonymous,
            ..caller
        });
    }
    let token = authorization
        .and_then(|v| v.to_str().ok())
        .and_then(crate::roles::bearer_token);
    let Some(token) = token else {
        return Err(refuse(
            tonic::Code::Unauthenticated,
            "anonymous",
            "unauthenticated",
            format!("this cairn requires a credential for {rpc}: an admin's token (`authorization: Bearer`; cairn --token-file or CAIRN_TOKEN) or a client certificate"),
        ));
    };
    match tokens.check(caller.peer.map(|p| p.ip()), token) {
        TokenHolder::Admin { .. } => Ok(Caller {
            principal: Principal::Service(ADMIN_TOKEN_IDENTITY.to_owned()),
            ..caller
        }),
        TokenHolder::Limited { name, role } => Err(refuse(
            tonic::Code::PermissionDenied,
            &name,
            "role",
            format!("`{name}` (role {role}) may not call {rpc}: only an admin token for every project may call the store, ingest or the sandbox-runner directly; use the orchestrator's commands (cairn run, runs, gate, notes)"),
        )),
        TokenHolder::Invalid(why) => Err(refuse(
            tonic::Code::Unauthenticated,
            "anonymous",
            "unauthenticated",
            why,
        )),
        TokenHolder::Throttled { retry_after } => {
            let secs = retry_after.as_secs().max(1);
            let mut status = refuse(
                tonic::Code::ResourceExhausted,
                "anonymous",
                "throttled",
                format!("too many wrong tokens from this address; retry in {secs} s"),
            );
            if let Ok(v) = secs.to_string().parse() {
                status.metadata_mut().insert(crate::roles::RETRY_AFTER, v);
            }
            Err(status)
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for AccessService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let rpc = req.uri().path().trim_start_matches('/').to_owned();
        let identified = Caller::from_extensions(req.extensions());
        let identified = match (&self.tokens, identified) {
            (Some(tokens), Ok(caller))
                if caller.is_local() && req.extensions().get::<InProcess>().is_none() =>
            {
                match by_token(
                    tokens.as_ref(),
                    caller,
                    &rpc,
                    req.headers().get(crate::roles::AUTHORIZATION),
                ) {
                    Ok(caller) => Ok(caller),
                    Err(status) => return Box::pin(std::future::ready(Ok(status.into_http()))),
                }
            }
            (_, identified) => identified,
        };
        let status = match identified {
            Ok(caller) if self.access.allows(&caller, &rpc) => {
                req.extensions_mut().insert(caller);
                return Box::pin(self.inner.call(req));
            }
            Ok(caller) => {
                audit_refusal(caller.name(), &caller.peer_text(), &rpc, "identity");
                cairn_proto::reason::status(
                    tonic::Code::PermissionDenied,
                    format!(
                        "identity `{}` may not call {rpc} (the access table in docs/security.md says who may; an operator can change it under [access])",
                        caller.name()
                    ),
                    "identity",
                )
            }
            Err(why) => {
                let (reason, message) = match why {
                    Unidentified::NoCertificate => (
                        "no_certificate",
                        "a client certificate is required (give --tls-dir with this program's certificate)",
                    ),
                    Unidentified::NoIdentity => (
                        "no_identity",
                        "the client certificate names no cairn identity (a SAN URI cairn://<identity>; make certificates with `cairn certs init`)",
                    ),
                    Unidentified::SeveralIdentities => (
                        "several_identities",
                        "the client certificate names more than one cairn identity (SAN URIs cairn://...); a certificate must name exactly one: make it with `cairn certs init`",
                    ),
                };
                let peer = req
                    .extensions()
                    .get::<tonic::transport::server::TlsConnectInfo<
                        tonic::transport::server::TcpConnectInfo,
                    >>()
                    .and_then(|t| t.get_ref().remote_addr())
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "unknown".to_owned());
                audit_refusal("anonymous", &peer, &rpc, reason);
                cairn_proto::reason::status(tonic::Code::Unauthenticated, message, reason)
            }
        };
        Box::pin(std::future::ready(Ok(status.into_http())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller::Principal;

    fn caller(id: &str) -> Caller {
        Caller {
            principal: Principal::Service(id.to_owned()),
            peer: None,
        }
    }

    #[test]
    fn the_table_grants_what_it_names_and_nothing_else() {
        let a = Access::default();
        assert!(a.allows(&caller("orchestrator"), "/cairn.v1.ArtifactStore/ClaimRun"));
        assert!(a.allows(&caller("cli"), "/cairn.v1.ArtifactStore/ClaimRun"));
        assert!(!a.allows(&caller("ingest"), "/cairn.v1.ArtifactStore/ClaimRun"));
        assert!(!a.allows(&caller("ingest"), "/cairn.v1.ArtifactStore/Delete"));
        assert!(!a.allows(&caller("sandbox-runner"), "/cairn.v1.ArtifactStore/Get"));
        assert!(!a.allows(&caller("console"), "/cairn.v1.SandboxRunner/Run"));
        assert!(!a.allows(&caller("stranger"), "/cairn.v1.ArtifactStore/Get"));
        assert!(a.allows(&caller("stranger"), "/grpc.health.v1.Health/Check"));
        let local = Caller {
            principal: Principal::Local,
            peer: None,
        };
        assert!(a.allows(&local, "/cairn.v1.ArtifactStore/ClaimRun"));
        // A prefix pattern does not match a longer service name.
        assert!(!matches("cairn.v1.Ingest/*", "cairn.v1.IngestX/Parse"));
    }

    /// Every RPC of cairn's protos as `cairn.v1.Service/Method`, read from the .proto files
    /// (so an RPC added later is in the matrix below without anyone listing it).
    fn every_rpc() -> Vec<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto/cairn/v1");
        let mut rpcs = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            let mut service = String::new();
            for line in text.lines().map(str::trim) {
                if let Some(rest) = line.strip_prefix("service ") {
                    service = rest.trim_end_matches('{').trim().to_owned();
                } else if let Some(rest) = line.strip_prefix("rpc ") {
                    let method = rest.split('(').next().unwrap().trim().to_owned();
                    rpcs.push((service.clone(), method));
                }
            }
        }
        rpcs
    }

    /// Calls that change something, by service; everything else is a read.
    fn writes(service: &str, method: &str) -> bool {
        match service {
            "ArtifactStore" => [
                "CreateProject",
                "Put",
                "Delete",
                "AppendEvents",
                "ClaimRun",
                // Issues a capability to write for a run: a write in effect.
                "GrantIngestClaim",
                "UpdateJson",
                // Reads every project's bytes at once: admin only, like the writes below.
                "Backup",
                "Restore",
                "ArchiveRun",
                "UnarchiveRun",
            ]
            .contains(&method),
            "Ingest" => ["Ingest", "SetEnabled"].contains(&method),
            "SandboxRunner" => true,
            "Orchestrator" => {
                !["GetRun", "ListRuns", "WatchRun", "WatchLogs", "WhoAmI"].contains(&method)
            }
            other => panic!("service {other} has no cells here: add them"),
        }
    }

    const ADMIN_ONLY: [&str; 4] = ["Backup", "Restore", "ArchiveRun", "UnarchiveRun"];

    /// What each identity may call, written out on its own (not derived from the table).
    fn expected(identity: &str, service: &str, method: &str) -> bool {
        let write = writes(service, method);
        match (identity, service) {
            ("cli", _) => true,
            // Backups, restores and archiving are the operator's (admin) alone.
            ("orchestrator", "ArtifactStore") => !ADMIN_ONLY.contains(&method),
            ("orchestrator", _) => true,
            ("ingest", "ArtifactStore") => {
                !write || ["Put", "AppendEvents", "CreateProject"].contains(&method)
            }
            // The console reads the store and acts through the orchestrator only.
            ("console", "ArtifactStore") => !write,
            ("console", "Orchestrator") => true,
            _ => false,
        }
    }

    #[test]
    fn every_identity_gets_exactly_its_cells_of_every_rpc() {
        let a = Access::default();
        let rpcs = every_rpc();
        let services: std::collections::BTreeSet<_> =
            rpcs.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(
            services.into_iter().collect::<Vec<_>>(),
            ["ArtifactStore", "Ingest", "Orchestrator", "SandboxRunner"]
        );
        let identities = [
            "orchestrator",
            "ingest",
            "sandbox-runner",
            "console",
            "cli",
            "artifact-store",
            "stranger",
        ];
        let mut wrong = Vec::new();
        for id in identities {
            for (service, method) in &rpcs {
                let path = format!("/cairn.v1.{service}/{method}");
                let want = expected(id, service, method);
                if a.allows(&caller(id), &path) != want {
                    wrong.push(format!("{id} {path}: expected allowed={want}"));
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        let write_rpcs = rpcs.iter().filter(|(s, m)| writes(s, m)).count();
        assert!(rpcs.len() >= 40 && write_rpcs >= 25, "{} rpcs", rpcs.len());
        // The console's write cells, named: none on the store, none on the runner or ingest.
        for m in [
            "Put",
            "Delete",
            "AppendEvents",
            "ClaimRun",
            "UpdateJson",
            "CreateProject",
        ] {
            let path = format!("/cairn.v1.ArtifactStore/{m}");
            assert!(!a.allows(&caller("console"), &path), "{path}");
        }
        assert!(!a.allows(&caller("console"), "/cairn.v1.Ingest/SetEnabled"));
        // Backup and restore, named: the admin tool only.
        for m in ADMIN_ONLY {
            let path = format!("/cairn.v1.ArtifactStore/{m}");
            assert!(a.allows(&caller("cli"), &path), "{path}");
            for id in [
                "orchestrator",
                "ingest",
                "console",
                "sandbox-runner",
                "stranger",
            ] {
                assert!(!a.allows(&caller(id), &path), "{id} {path}");
            }
        }
        assert!(a.allows(&caller("console"), "/cairn.v1.Orchestrator/ApproveGate"));
        // Every caller, even one the table does not know, may probe health.
        for id in identities {
            assert!(
                a.allows(&caller(id), "/grpc.health.v1.Health/Watch"),
                "{id}"
            );
        }
    }

    /// A host's tokens: `admin` an admin for every project, three limited roles, nothing else.
    struct Tokens;
    impl TokenCheck for Tokens {
        fn check(&self, _: Option<IpAddr>, token: &str) -> TokenHolder {
            match token {
                "admin" => TokenHolder::Admin { name: "ann".into() },
                "viewer" | "operator" | "approver" => TokenHolder::Limited {
                    name: "bob".into(),
                    role: token.into(),
                },
                _ => TokenHolder::Invalid("unknown token".into()),
            }
        }
    }

    fn plaintext() -> Caller {
        Caller {
            principal: Principal::Local,
            peer: Some("127.0.0.1:4000".parse().unwrap()),
        }
    }

    /// Probes and the orchestrator (which checks tokens itself) take a plaintext caller
    /// without a token as `anonymous`; an admin token acts as `cli`; the peer is kept.
    #[test]
    fn a_plaintext_caller_is_anonymous_on_open_rpcs_and_cli_with_an_admin_token() {
        for rpc in [
            "grpc.health.v1.Health/Check",
            "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "cairn.v1.Orchestrator/SubmitRun",
        ] {
            let c = by_token(&Tokens, plaintext(), rpc, None).unwrap();
            assert_eq!(c.principal, Principal::Anonymous, "{rpc}");
            assert_eq!(c.peer, plaintext().peer, "{rpc}");
        }
        let admin = http::HeaderValue::from_static("Bearer admin");
        let c = by_token(
            &Tokens,
            plaintext(),
            "cairn.v1.ArtifactStore/Get",
            Some(&admin),
        )
        .unwrap();
        assert_eq!(
            c.principal,
            Principal::Service(ADMIN_TOKEN_IDENTITY.to_owned())
        );
        assert_eq!(c.peer, plaintext().peer);
        let e = by_token(&Tokens, plaintext(), "cairn.v1.ArtifactStore/Get", None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
    }

    /// The inner service: answers OK, and says which caller the layer let through.
    #[derive(Clone)]
    struct Inner;
    impl tower::Service<http::Request<()>> for Inner {
        type Response = http::Response<Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<http::Response<Body>, Self::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: http::Request<()>) -> Self::Future {
            let who = req
                .extensions()
                .get::<Caller>()
                .map(|c| c.name().to_owned())
                .unwrap_or_default();
            let mut resp = http::Response::new(Body::empty());
            resp.headers_mut()
                .insert("x-caller", http::HeaderValue::from_str(&who).unwrap());
            std::future::ready(Ok(resp))
        }
    }

    async fn call(in_process: bool, token: Option<&str>) -> http::Response<Body> {
        use tower::Service as _;
        let mut layer = AccessService {
            inner: Inner,
            access: Arc::new(Access::default()),
            tokens: Some(Arc::new(Tokens)),
        };
        let mut req = http::Request::builder()
            .uri("/cairn.v1.ArtifactStore/Stat")
            .body(())
            .unwrap();
        if in_process {
            req.extensions_mut().insert(InProcess);
        }
        if let Some(t) = token {
            req.headers_mut().insert(
                crate::roles::AUTHORIZATION,
                http::HeaderValue::from_str(&format!("Bearer {t}")).unwrap(),
            );
        }
        layer.call(req).await.unwrap()
    }

    fn grpc_status(r: &http::Response<Body>) -> Option<&str> {
        r.headers().get("grpc-status").and_then(|v| v.to_str().ok())
    }

    /// On a host that requires tokens, a plaintext caller must show one; a call from this
    /// very process (an in-process connection) needs none.
    #[tokio::test]
    async fn on_a_host_with_tokens_only_in_process_callers_pass_without_one() {
        let plain = call(false, None).await;
        assert_eq!(grpc_status(&plain), Some("16"), "unauthenticated");
        assert!(
            plain.headers().get("x-caller").is_none(),
            "never reached the service"
        );

        let admin = call(false, Some("admin")).await;
        assert_eq!(grpc_status(&admin), None);
        assert_eq!(admin.headers()["x-caller"], ADMIN_TOKEN_IDENTITY);

        let viewer = call(false, Some("viewer")).await;
        assert_eq!(grpc_status(&viewer), Some("7"), "permission denied");

        let inproc = call(true, None).await;
        assert_eq!(grpc_status(&inproc), None, "in-process: no token asked");
        assert_eq!(inproc.headers()["x-caller"], crate::caller::LOCAL);
    }

    /// Tokens on a host that requires them: only an admin's reaches backups and restores.
    #[test]
    fn only_an_admin_token_backs_up_or_restores() {
        let a = Access::default();
        let plaintext = Caller {
            principal: Principal::Local,
            peer: None,
        };
        for m in ADMIN_ONLY {
            let rpc = format!("cairn.v1.ArtifactStore/{m}");
            let admin = http::HeaderValue::from_static("Bearer admin");
            let caller = by_token(&Tokens, plaintext.clone(), &rpc, Some(&admin)).unwrap();
            assert!(a.allows(&caller, &format!("/{rpc}")), "{rpc}");
            for token in ["viewer", "operator", "approver", "nobody"] {
                let value = http::HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
                let refused = by_token(&Tokens, plaintext.clone(), &rpc, Some(&value));
                assert!(refused.is_err(), "{token} {rpc}");
            }
            assert!(
                by_token(&Tokens, plaintext.clone(), &rpc, None).is_err(),
                "{rpc}"
            );
        }
    }

    #[test]
    fn overrides_replace_an_identity_entry() {
        let overrides = BTreeMap::from([(
            "sandbox-runner".to_owned(),
            vec!["cairn.v1.ArtifactStore/Stat".to_owned()],
        )]);
        let a = Access::with_overrides(&overrides);
        assert!(a.allows(&caller("sandbox-runner"), "/cairn.v1.ArtifactStore/Stat"));
        assert!(!a.allows(&caller("sandbox-runner"), "/cairn.v1.ArtifactStore/Get"));
    }
}
