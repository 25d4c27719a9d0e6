//! Requests that are not valid protobuf. tonic's codec answers them INTERNAL ("failed to
//! decode Protobuf message"), which reads as the server's fault and invites retries; a request
//! the server cannot parse is the caller's to fix, so this layer answers INVALID_ARGUMENT with
//! reason `malformed` (and its `ErrorInfo`) instead. It rewrites only that status, only in a
//! response's headers: where tonic puts the status of a call whose request did not decode.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use cairn_proto::reason;
use tonic::Code;

/// What tonic-prost's decode error message begins with.
const DECODE_ERROR: &str = "failed to decode Protobuf message";

/// See the module documentation.
#[derive(Debug, Clone, Copy, Default)]
pub struct MalformedLayer;

impl<S> tower::Layer<S> for MalformedLayer {
    type Service = MalformedService<S>;
    fn layer(&self, inner: S) -> MalformedService<S> {
        MalformedService { inner }
    }
}

#[derive(Debug, Clone)]
pub struct MalformedService<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for MalformedService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let answer = self.inner.call(req);
        Box::pin(async move {
            let mut response = answer.await?;
            rewrite(response.headers_mut());
            Ok(response)
        })
    }
}

/// Replaces an INTERNAL decode failure in `headers` by the `malformed` refusal.
fn rewrite(headers: &mut http::HeaderMap) {
    if headers.get("grpc-status").map(http::HeaderValue::as_bytes) != Some(b"13") {
        return;
    }
    let Some(status) = tonic::Status::from_header_map(headers) else {
        return;
    };
    let Some(why) = status.message().strip_prefix(DECODE_ERROR) else {
        return;
    };
    let refusal = reason::status(
        Code::InvalidArgument,
        format!(
            "the request is not a valid protobuf message of this RPC's request type{why}; check that the client encodes the request message of cairn's protos (server reflection lists them)"
        ),
        reason::MALFORMED,
    );
    for name in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
        headers.remove(name);
    }
    if let Err(e) = refusal.add_header(headers) {
        tracing::warn!(error = %e, "could not rewrite a decode failure as INVALID_ARGUMENT");
        let _ = status.add_header(headers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_decode_failures_are_rewritten() {
        let mut headers = http::HeaderMap::new();
        tonic::Status::internal("failed to decode Protobuf message: invalid wire type")
            .add_header(&mut headers)
            .ok();
        rewrite(&mut headers);
        let status = tonic::Status::from_header_map(&headers).expect("a status");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(reason::of(&status).as_deref(), Some(reason::MALFORMED));
        assert!(
            status.message().contains("invalid wire type"),
            "{}",
            status.message()
        );

        let mut headers = http::HeaderMap::new();
        tonic::Status::internal("disk on fire")
            .add_header(&mut headers)
            .ok();
        rewrite(&mut headers);
        let status = tonic::Status::from_header_map(&headers).expect("a status");
        assert_eq!(status.code(), Code::Internal);
    }
}
