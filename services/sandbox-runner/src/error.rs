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
    /// A request limit below what any sandbox can run with (Docker's smallest memory limit).
    #[error("limit {name} = {requested} is below the smallest this runner can enforce ({min}): ask for at least {min}, or 0 for the default")]
    LimitBelowMin {
        name: &'static str,
        requested: u64,
        min: u64,
    },
    /// A request named an image this runner does not allow.
    #[error("image {image:?} is not allowed on this runner (allowed: {}): name one of those, or add it to allowed_images in the runner's config ([sandbox_runner] allowed_images, CAIRN_SANDBOX_RUNNER_ALLOWED_IMAGES)", .allowed.join(", "))]
    ImageNotAllowed { image: String, allowed: Vec<String> },
    /// A request asked for network on a runner whose policy forbids it.
    #[error("network access is not allowed on this runner: drop `network`, or set network_allowed = true in the runner's config ([sandbox_runner] network_allowed, CAIRN_SANDBOX_RUNNER_NETWORK_ALLOWED)")]
    NetworkNotAllowed,
    /// The local backend runs on the host's interpreters and the gvisor backend on the
    /// runner's one image: neither picks images per request.
    #[error("this runner uses the {backend} backend, which runs sandboxes on one file system only (the host's interpreters, or the runner's image) and cannot run image {image:?}: send the work to a runner with the docker backend, or leave the image unset")]
    ImageNeedsDocker {
        backend: &'static str,
        image: String,
    },
    /// The engine does not have an allowed image (nothing is ever pulled).
    #[error("image {0:?} is allowed but missing on this runner's Docker engine: build it there with deploy/images/build-images.sh (nothing is pulled)")]
    ImageMissing(String),
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
    /// Closed by the runner after no call used it for the session idle timeout.
    #[error(
        "session {id:?} was closed by the runner after {} ms without a call (its [session] idle_timeout_ms): open a new session, or call it (TouchSession) at least that often",
        idle_ms
    )]
    SessionExpired { id: String, idle_ms: u64 },
    /// CloseSession (or the client going away) came while the session was opening.
    #[error(
        "session {0:?} was closed before it finished opening: open it again if it is still needed"
    )]
    OpenAborted(String),
    /// A snapshot taken on another backend or image than this runner's.
    #[error("{0}")]
    SnapshotMismatch(String),
    /// A snapshot whose bytes do not match its header (cut short, altered, or not a snapshot).
    #[error("{0}")]
    SnapshotCorrupt(String),
    /// Detached commands need a backend whose sessions keep processes between calls.
    #[error("this runner uses the local backend, whose session commands end with their Exec: a detached command needs a runner with the docker or gvisor backend")]
    DetachUnsupported,
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

impl From<cairn_pack::Error> for Error {
    fn from(e: cairn_pack::Error) -> Error {
        use cairn_pack::Error as P;
        let message = e.to_string();
        match e {
            P::Invalid(_) => Error::invalid(message),
            P::TooManyFiles { .. } => Error::ResourceExhausted {
                message,
                reason: "too_many_files",
            },
            P::TooLarge { .. } => Error::ResourceExhausted {
                message,
                reason: "too_large",
            },
            P::Io { context, source } => Error::io(context)(source),
        }
    }
}

impl From<cairn_snapshot::Error> for Error {
    fn from(e: cairn_snapshot::Error) -> Error {
        use cairn_snapshot::Error as S;
        match e {
            S::Corrupt(m) => Error::SnapshotCorrupt(m),
            S::TooLarge(message) => Error::ResourceExhausted {
                message,
                reason: "too_large",
            },
            S::NoSpace(message) => Error::ResourceExhausted {
                message,
                reason: "no_space",
            },
            S::Io { context, source } => Error::Io { context, source },
        }
    }
}

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

impl Error {
    fn code(&self) -> Code {
        match self {
            Error::InvalidArgument { .. }
            | Error::LimitAboveMax { .. }
            | Error::LimitBelowMin { .. }
            | Error::Config(_)
            | Error::Path { .. }
            | Error::ImageNotAllowed { .. }
            | Error::NetworkNotAllowed => Code::InvalidArgument,
            Error::ImageNeedsDocker { .. } | Error::ImageMissing(_) => Code::FailedPrecondition,
            // The engine refused the container's settings: retrying cannot help.
            Error::Docker { source, .. } if engine_refused(source) => Code::InvalidArgument,
            Error::ResourceExhausted { .. } => Code::ResourceExhausted,
            Error::Refused { .. } => Code::PermissionDenied,
            Error::NotFound { .. } | Error::SessionExpired { .. } => Code::NotFound,
            Error::SessionExists(_) => Code::AlreadyExists,
            Error::OpenAborted(_) => Code::Aborted,
            Error::NoIsolation(_) => Code::FailedPrecondition,
            Error::SnapshotMismatch(_) | Error::DetachUnsupported => Code::FailedPrecondition,
            Error::SnapshotCorrupt(_) => Code::InvalidArgument,
            Error::ShuttingDown | Error::Docker { .. } => Code::Unavailable,
            Error::Io { .. } | Error::Sandbox(_) | Error::Server(_) => Code::Internal,
        }
    }

    /// The reason word (`cairn-reason` and `ErrorInfo.reason`).
    fn reason(&self) -> &'static str {
        match self {
            Error::InvalidArgument {
                reason: Some(r), ..
            }
            | Error::ResourceExhausted { reason: r, .. }
            | Error::Refused { reason: r, .. } => r,
            Error::Path { rejection, .. } => rejection.reason.as_str(),
            Error::LimitAboveMax { .. } | Error::LimitBelowMin { .. } => "limit_out_of_range",
            Error::SessionExists(_) => "exists",
            Error::SessionExpired { .. } => "session_idle",
            Error::NoIsolation(_) => "no_isolation",
            Error::SnapshotMismatch(_) => "snapshot_mismatch",
            Error::SnapshotCorrupt(_) => "snapshot_corrupt",
            Error::DetachUnsupported => "detach_unsupported",
            Error::ImageNotAllowed { .. } => "image_not_allowed",
            Error::NetworkNotAllowed => "network_not_allowed",
            Error::ImageNeedsDocker { .. } => "image_needs_docker",
            Error::ImageMissing(_) => "image_missing",
            Error::ShuttingDown => "shutting_down",
            e => reason::fallback(e.code()),
        }
    }

    /// What the refusal is about, for `ErrorInfo.metadata`.
    fn details(&self) -> Vec<(&'static str, String)> {
        match self {
            Error::LimitAboveMax { name, max, .. } => {
                vec![
                    ("field", format!("limits.{name}")),
                    ("max", max.to_string()),
                ]
            }
            Error::LimitBelowMin { name, min, .. } => {
                vec![
                    ("field", format!("limits.{name}")),
                    ("min", min.to_string()),
                ]
            }
            Error::Refused { path, .. } => vec![("path", path.clone())],
            Error::ImageNotAllowed { image, .. }
            | Error::ImageNeedsDocker { image, .. }
            | Error::ImageMissing(image) => {
                vec![("field", "image".into()), ("image", image.clone())]
            }
            Error::NetworkNotAllowed => vec![("field", "network".into())],
            Error::NotFound { what, name } => vec![(*what, name.clone())],
            Error::SessionExists(id)
            | Error::OpenAborted(id)
            | Error::SessionExpired { id, .. } => {
                vec![("session_id", id.clone())]
            }
            _ => Vec::new(),
        }
    }
}

/// The Docker engine answered 400 (Bad Request): it refused the container's settings (a
/// memory limit below its minimum, ...), which is the caller's to fix, not an outage.
fn engine_refused(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 400,
            ..
        }
    )
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let details = e.details();
        let pairs: Vec<(&str, &str)> = details.iter().map(|(k, v)| (*k, v.as_str())).collect();
        reason::status_with(e.code(), e.to_string(), e.reason(), &pairs)
    }
}
