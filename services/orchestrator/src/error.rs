//! The orchestrator's errors and their one mapping to gRPC status codes. Messages say what was wrong and how to fix it.

use tonic::{Code, Status};

use cairn_graph::GraphError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The graph was refused at submit time (names node and field).
    #[error("invalid graph: {0}")]
    Graph(#[from] GraphError),
    #[error("{0}")]
    InvalidArgument(String),
    /// One request field is wrong: `field` is its path in the request (`page.page_token`,
    /// `vars.reviews`), sent as a BadRequest field violation.
    #[error("{message}")]
    BadField { field: String, message: String },
    #[error("run `{run_id}` not found in project `{project}`; list runs with `cairn runs list`")]
    RunNotFound { project: String, run_id: String },
    #[error("run `{run_id}` already exists in project `{project}`; choose another run id or leave it empty to get a new one (a retried submit should send the same request_id instead)")]
    RunExists { project: String, run_id: String },
    /// The run has no such node (or gate).
    #[error("run `{run_id}` has no {what} `{node}`{hint}")]
    NodeNotFound {
        project: String,
        run_id: String,
        node: String,
        /// `node` or `gate`.
        what: &'static str,
        /// More to say (how to find the right one), starting with `;` or empty.
        hint: &'static str,
    },
    /// A note cites `evidence:<id>` ids the run's evidence index does not hold.
    #[error("the note cites {} that run `{run_id}` does not hold; `cairn store get PROJECT .cairn/runs/{run_id}/shared/evidence/index.json` lists its evidence ids", ids.iter().map(|i| format!("evidence:{i}")).collect::<Vec<_>>().join(", "))]
    UnknownEvidence { run_id: String, ids: Vec<String> },
    /// The request does not fit the run's state (gate not blocked, run already final, ...).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A store call failed; keeps the store's code (and its `cairn-reason`).
    #[error("{context}: {}", status.message())]
    Store { context: String, status: Status },
    #[error("{0}")]
    Unavailable(String),
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Server(#[from] cairn_server::Error),
    #[error("internal error: {0}")]
    Internal(String),
    /// A caller not signed in, throttled or not allowed the call; the auth settings refused.
    #[error(transparent)]
    Auth(#[from] cairn_auth::Error),
    /// An `llm` setting refused at submit (URL rule, unknown provider, cassette); its reason
    /// word goes in `cairn-reason`.
    #[error(transparent)]
    Llm(#[from] cairn_agents::AgentError),
}

impl Error {
    /// A refusal of one request field.
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Error {
        Error::BadField {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Wraps a store status with what we were doing.
    pub fn store(context: impl Into<String>) -> impl FnOnce(Status) -> Error {
        let context = context.into();
        move |status| Error::Store { context, status }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        use cairn_proto::reason;
        let message = e.to_string();
        let plain =
            |code: Code, message: String| reason::status(code, message, reason::fallback(code));
        match e {
            Error::Graph(g) => {
                let path = g.field_path();
                let extra = reason::Extra {
                    violations: vec![(path.clone(), g.message.clone())],
                    ..Default::default()
                };
                reason::detailed(
                    Code::InvalidArgument,
                    message,
                    "invalid_graph",
                    &[
                        ("field", &path),
                        ("node", g.node.as_deref().unwrap_or_default()),
                    ],
                    extra,
                )
            }
            Error::InvalidArgument(_) | Error::Config(_) => plain(Code::InvalidArgument, message),
            Error::BadField { field, .. } => reason::detailed(
                Code::InvalidArgument,
                message.clone(),
                reason::fallback(Code::InvalidArgument),
                &[("field", &field)],
                reason::Extra {
                    violations: vec![(field.clone(), message)],
                    ..Default::default()
                },
            ),
            Error::RunNotFound { project, run_id } => reason::status_with(
                Code::NotFound,
                message,
                "not_found",
                &[("project", &project), ("run_id", &run_id)],
            ),
            Error::NodeNotFound {
                project,
                run_id,
                node,
                ..
            } => reason::status_with(
                Code::NotFound,
                message,
                "not_found",
                &[
                    ("project", &project),
                    ("run_id", &run_id),
                    ("node_id", &node),
                ],
            ),
            Error::RunExists { project, run_id } => reason::status_with(
                Code::AlreadyExists,
                message,
                "exists",
                &[("project", &project), ("run_id", &run_id)],
            ),
            Error::UnknownEvidence { run_id, ids } => reason::detailed(
                Code::InvalidArgument,
                message.clone(),
                "unknown_evidence",
                &[("run_id", &run_id), ("evidence", &ids.join(","))],
                reason::Extra {
                    violations: vec![("note".into(), message)],
                    ..Default::default()
                },
            ),
            Error::FailedPrecondition(_) => plain(Code::FailedPrecondition, message),
            Error::Store { status, .. } => {
                let code = match status.code() {
                    // A store that cannot be reached is this service being unavailable.
                    Code::Unknown | Code::Cancelled => Code::Unavailable,
                    c => c,
                };
                reason::relay(code, message, &status)
            }
            Error::Unavailable(_) => plain(Code::Unavailable, message),
            Error::Server(_) | Error::Internal(_) => plain(Code::Internal, message),
            Error::Auth(cairn_auth::Error::Config(_)) => plain(Code::InvalidArgument, message),
            Error::Auth(cairn_auth::Error::Unauthenticated(_)) => {
                plain(Code::Unauthenticated, message)
            }
            Error::Auth(cairn_auth::Error::Throttled { retry_after_s }) => {
                let mut status = reason::status_with(
                    Code::ResourceExhausted,
                    message,
                    "throttled",
                    &[("retry_after_s", &retry_after_s.to_string())],
                );
                if let Ok(v) = retry_after_s.to_string().parse() {
                    status
                        .metadata_mut()
                        .insert(cairn_server::roles::RETRY_AFTER, v);
                }
                status
            }
            Error::Auth(cairn_auth::Error::PermissionDenied { reason: word, .. }) => {
                reason::status(Code::PermissionDenied, message, word)
            }
            Error::Llm(e) => {
                let code = match e {
                    cairn_agents::AgentError::Unavailable(_) => Code::Unavailable,
                    _ => Code::InvalidArgument,
                };
                reason::status(code, message, e.reason().unwrap_or(reason::fallback(code)))
            }
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
