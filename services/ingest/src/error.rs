//! Ingest's error type and its ONE mapping to gRPC status codes. Ingest itself is fail-open
//! problems with the document or the store go into the manifest, not here. Errors
//! are for malformed requests, the flag RPCs, configuration and start-up.

use tonic::{Code, Status};

/// Everything that can make an ingest RPC (or the service's start-up) fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required request field is empty.
    #[error("{0} is required")]
    Missing(&'static str),

    /// An id is not of the form [A-Za-z0-9._-]{1,128}.
    #[error("{kind} id {id:?} is invalid: use 1-128 characters of A-Z a-z 0-9 . _ - (not \".\" or \"..\")")]
    InvalidId { kind: &'static str, id: String },

    /// An enum field holds a number the proto does not declare.
    #[error("{field} = {value} is not a known value: send one of the values the proto declares (this server may be older than the client)")]
    UnknownEnum { field: &'static str, value: i32 },

    /// The store refused the caller's ingest claim (expired, forged, for another run).
    #[error("{message}")]
    ClaimRefused { reason: String, message: String },

    /// The store requires an ingest claim of this caller and the request carried none.
    #[error("the artifact-store refused this write without an ingest claim ({0}); nothing was written: send the claim the run's orchestrator grants (IngestRequest.claim, from the store's GrantIngestClaim; `cairn ingest` asks for one itself), or ingest through a graph's `ingest:` node")]
    ClaimRequired(String),

    /// `doc_path` is not a relative path inside the project.
    #[error("doc_path {path:?} is not a path inside the project: {rejection}; give the document's path relative to the project root (no `..`, not absolute)")]
    DocPath {
        path: String,
        rejection: pathguard::Rejection,
    },

    /// A newer claim on the run fenced the caller off (the store refused a write `fenced`).
    #[error(
        "{0}; another orchestrator has claimed this run, so this caller may no longer write to it"
    )]
    Fenced(String),

    /// The artifact-store did not answer (flag RPCs only; Ingest records this in the manifest).
    #[error("the artifact-store is unavailable: {0}; check that it runs and that store_addr points to it")]
    StoreUnavailable(String),

    /// The artifact-store refused or failed a call (flag RPCs only).
    #[error("the artifact-store refused: {message}")]
    Store {
        reason: Option<String>,
        code: Code,
        message: String,
    },

    /// Bad configuration.
    #[error("configuration: {0}")]
    Config(String),

    /// The gRPC server failed.
    #[error("server: {0}")]
    Server(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        use cairn_proto::reason;
        let message = e.to_string();
        match e {
            Error::Missing(field) => reason::status_with(
                Code::InvalidArgument,
                message,
                reason::fallback(Code::InvalidArgument),
                &[("field", field)],
            ),
            Error::InvalidId { kind, id } => reason::status_with(
                Code::InvalidArgument,
                message,
                "invalid_id",
                &[("field", kind), ("id", &id)],
            ),
            Error::UnknownEnum { field, value } => reason::status_with(
                Code::InvalidArgument,
                message,
                reason::UNKNOWN_ENUM,
                &[("field", field), ("value", &value.to_string())],
            ),
            Error::ClaimRefused { reason, .. } => {
                reason::status(Code::PermissionDenied, message, &reason)
            }
            Error::ClaimRequired(_) => reason::status_with(
                Code::PermissionDenied,
                message,
                "claim_required",
                &[("field", "claim")],
            ),
            Error::DocPath { path, rejection } => reason::status_with(
                Code::InvalidArgument,
                message,
                rejection.reason.as_str(),
                &[("field", "doc_path"), ("path", &path)],
            ),
            Error::Fenced(_) => reason::status(
                Code::FailedPrecondition,
                message,
                crate::block::reason::FENCED,
            ),
            Error::StoreUnavailable(_) => reason::status(
                Code::Unavailable,
                message,
                crate::block::reason::STORE_UNAVAILABLE,
            ),
            Error::Store {
                reason: word, code, ..
            } => {
                let word = word.unwrap_or_else(|| reason::fallback(code).to_owned());
                reason::status(code, message, &word)
            }
            Error::Config(_) | Error::Server(_) => {
                reason::status(Code::Internal, message, reason::fallback(Code::Internal))
            }
        }
    }
}
