//! Counts and times every gRPC call a server answers (see [`crate::metrics::rpc_served`]): the
//! status code comes from the response headers (an error answered at once) or from the
//! trailers after the last message; a call whose response ends without either (the caller went
//! away) counts as `CANCELLED`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};

/// The tower layer of [`RpcMetrics`].
#[derive(Clone, Copy, Debug, Default)]
pub struct RpcMetricsLayer;

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;
    fn layer(&self, inner: S) -> RpcMetrics<S> {
        RpcMetrics { inner }
    }
}

/// A gRPC server service that records each call's code and duration.
#[derive(Clone, Debug)]
pub struct RpcMetrics<S> {
    inner: S,
}

/// One call being served: what to record when its status is known.
#[derive(Debug)]
struct Call {
    service: String,
    method: String,
    started: Instant,
}

impl Call {
    fn new(path: &str) -> Call {
        let (service, method) = path
            .trim_start_matches('/')
            .split_once('/')
            .unwrap_or((path, ""));
        Call {
            service: service.to_owned(),
            method: method.to_owned(),
            started: Instant::now(),
        }
    }

    fn end(self, code: &str) {
        // A path no service answers is the caller's text: one series for all of them.
        let (service, method) = if code == "UNIMPLEMENTED" {
            ("unknown", "unknown")
        } else {
            (self.service.as_str(), self.method.as_str())
        };
        crate::metrics::rpc_served(service, method, code, self.started.elapsed());
    }
}

/// The name of a `grpc-status` value (`OK`, `NOT_FOUND`, ...).
fn code_name(headers: &http::HeaderMap) -> Option<&'static str> {
    let code = headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .parse::<i32>()
        .ok()?;
    Some(match tonic::Code::from(code) {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
    })
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for RpcMetrics<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Body,
{
    type Response = http::Response<RpcBody<ResBody>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let call = Call::new(request.uri().path());
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = match answer.await {
                Ok(r) => r,
                Err(e) => {
                    call.end("UNKNOWN");
                    return Err(e);
                }
            };
            // A trailers-only answer (an error, usually) carries its status in the headers.
            let call = match code_name(response.headers()) {
                Some(code) => {
                    call.end(code);
                    None
                }
                None => Some(call),
            };
            Ok(response.map(|inner| RpcBody { inner, call }))
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that records its call when the trailers (or the end) arrive.
    pub struct RpcBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }

    impl<B> PinnedDrop for RpcBody<B> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(call) = this.project().call.take() {
                call.end("CANCELLED");
            }
        }
    }
}

impl<B: Body> Body for RpcBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    if let Some(call) = this.call.take() {
                        call.end(code_name(trailers).unwrap_or("OK"));
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(call) = this.call.take() {
                    call.end("INTERNAL");
                }
            }
            Poll::Ready(None) => {
                if let Some(call) = this.call.take() {
                    call.end("OK");
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
