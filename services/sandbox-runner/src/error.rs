//! The runner's error type and its one mapping to gRPC status codes (sandbox.proto header).
//! A run whose program fails, times out or is killed is not an error: it is a RunResult.

use cairn_proto::reason;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; the message says what to fix.
    #[error("{message}")]
    InvalidArgument {
        message: String,
        reason: Option<&'static str>,
    },
    /// A path was refused by the pathguard rules.
    #[error("{what}: {rejection}")]
    Path {
        what: &'static str,
        rejection: pathguard::Rejection,
    },
    /// A request limit above the server maximum.
    #[error("limit {name} = {requested} is above this runner's maximum {max}: ask for at most {max}, or raise max.{name} in the runner config")]
    LimitAboveMax {
        name: &'static str,
        requested: u64,
        max: u64,
    },
    /// Input count/bytes, sessions, archive size.
    #[error("{message}")]
    ResourceExhausted {
        message: String,
        reason: &'static str,
    },
    /// A workspace operation refused by confinement (symlink, not a file, hard link).
    #[error("{path:?}: {message}")]
    Refused {
        path: String,
        message: String,
        reason: &'static str,
    },
    #[error("{what} {name:?} not found")]
    NotFound { what: &'static str, name: String },
    #[error("session {0:?} already exists: close it first or use another id")]
    SessionExists(String),
    /// CloseSession (or the client going away) came while the session was opening.
    #[error(
        "session {0:?} was closed before it finished opening: open it again if it is still needed"
    )]
    OpenAborted(String),
    /// No isolation backend is available.
    #[error("{0}")]
    NoIsolation(String),
    #[error("the runner is shutting down: retry on another runner")]
    ShuttingDown,
    #[error("docker engine: {context}: {source}")]
    Docker {
        context: String,
        source: bollard::errors::Error,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    /// The sandbox itself misbehaved (agent protocol, bwrap failure).
    #[error("sandbox failed: {0}")]
    Sandbox(String),
    #[error("config: {0}")]
    Config(String),
    #[error(transparent)]
    Server(#[from] cairn_server::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            message: message.into(),
            reason: None,
        }
    }

    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }

    pub fn docker(context: impl Into<String>) -> impl FnOnce(bollard::errors::Error) -> Error {
        let context = context.into();
        move |source| Error::Docker { context, source }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let message = e.to_string();
        match &e {
            Error::InvalidArgument {
                reason: Some(r), ..
            } => reason::status(Code::InvalidArgument, message, r),
            Error::InvalidArgument { reason: None, .. }
            | Error::LimitAboveMax { .. }
            | Error::Config(_) => Status::invalid_argument(message),
            Error::Path { rejection, .. } => {
                reason::status(Code::InvalidArgument, message, rejection.reason.as_str())
            }
            Error::ResourceExhausted { reason: r, .. } => {
                reason::status(Code::ResourceExhausted, message, r)
            }
            Error::Refused { reason: r, .. } => reason::status(Code::PermissionDenied, message, r),
            Error::NotFound { .. } => Status::not_found(message),
            Error::SessionExists(_) => reason::status(Code::AlreadyExists, message, "exists"),
            Error::OpenAborted(_) => Status::aborted(message),
            Error::NoIsolation(_) => Status::failed_precondition(message),
            Error::ShuttingDown | Error::Docker { .. } => Status::unavailable(message),
            Error::Io { .. } | Error::Sandbox(_) | Error::Server(_) => Status::internal(message),
        }
    }
}
