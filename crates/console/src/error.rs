//! The console's errors and their one mapping to HTTP responses: a status code and an escaped
//! error page that says what went wrong (the gRPC message of the service that refused, with its
//! `cairn-reason`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tonic::Code;

use super::page;

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("console configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Address(#[from] cairn_server::Error),
    #[error("could not serve the console: {0}")]
    Serve(String),
    /// A call to the orchestrator or the store failed; keeps its code and reason.
    #[error("{what}: {message}{}", reason.as_deref().map(|r| format!(" (reason: {r})")).unwrap_or_default())]
    Rpc {
        what: String,
        code: Code,
        message: String,
        reason: Option<String>,
    },
    #[error("{what}: no answer within {secs} s (is the service running?)")]
    Timeout { what: String, secs: u64 },
    /// A POST without the form's CSRF token, or with another session's.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("log in first")]
    Unauthenticated,
}

impl ConsoleError {
    pub(super) fn rpc(what: &str, status: tonic::Status) -> ConsoleError {
        ConsoleError::Rpc {
            what: what.to_owned(),
            code: status.code(),
            message: status.message().to_owned(),
            reason: cairn_proto::reason::of(&status),
        }
    }

    pub(super) fn status(&self) -> StatusCode {
        match self {
            ConsoleError::Config(_) | ConsoleError::Address(_) | ConsoleError::Serve(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            ConsoleError::Rpc { code, .. } => match code {
                Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
                Code::NotFound => StatusCode::NOT_FOUND,
                Code::PermissionDenied => StatusCode::FORBIDDEN,
                Code::AlreadyExists | Code::FailedPrecondition | Code::Aborted => {
                    StatusCode::CONFLICT
                }
                Code::ResourceExhausted => StatusCode::PAYLOAD_TOO_LARGE,
                Code::Unauthenticated => StatusCode::UNAUTHORIZED,
                Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
                Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::BAD_GATEWAY,
            },
            ConsoleError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ConsoleError::Forbidden(_) => StatusCode::FORBIDDEN,
            ConsoleError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ConsoleError::NotFound(_) => StatusCode::NOT_FOUND,
            ConsoleError::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, "console request failed");
        }
        (status, page::error_page(status, &self.to_string())).into_response()
    }
}
