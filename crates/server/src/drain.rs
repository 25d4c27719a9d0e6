//! Shutdown of a server's open calls, bounded in time. Owns the drain phases and the one layer
//! that ends what is still open; must never end a call before the drain has begun.
//!
//! Why a layer and not per-handler code alone: some streams never end by themselves (a
//! ReadEvents follow, WatchRun, grpc.health.v1 Watch whose code is not ours) and hyper's
//! graceful shutdown waits for every one of them. So, once shutdown begins:
//! - endless streams (health Watch here; handlers select on [`Shutdown`]) end at once with
//!   UNAVAILABLE, after whatever they had ready;
//! - every other call gets until the drain deadline to finish; then its response (or its
//!   still-open body) ends with UNAVAILABLE, and the server returns shortly after even if a
//!   peer holds its connection.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::watch;

/// How long calls get to finish after shutdown begins (config `drain_deadline_s`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// After the deadline cut every call, how long the server may still take to close its
/// connections before it is dropped.
const AFTER_CUT: Duration = Duration::from_secs(1);

/// Streams that never end by themselves and whose code is not cairn's: ended as soon as the
/// drain begins.
const ENDLESS: &[&str] = &["/grpc.health.v1.Health/Watch"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Serving,
    /// Shutdown began: endless streams end, the rest may finish.
    Draining,
    /// The deadline passed: everything still open ends.
    Cut,
}

/// The drain of one server (cheap to clone).
#[derive(Clone, Debug)]
pub struct Drain {
    phase: watch::Sender<Phase>,
    deadline: Duration,
}

impl Default for Drain {
    fn default() -> Self {
        Drain::new(DEFAULT_DEADLINE)
    }
}

impl Drain {
    pub fn new(deadline: Duration) -> Drain {
        Drain {
            phase: watch::Sender::new(Phase::Serving),
            deadline,
        }
    }

    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Begins the drain: endless streams end now, other calls at the deadline.
    pub fn start(&self) {
        self.phase.send_if_modified(|p| {
            let started = *p == Phase::Serving;
            if started {
                *p = Phase::Draining;
            }
            started
        });
    }

    /// What handlers select on.
    pub fn shutdown(&self) -> Shutdown {
        Shutdown {
            phase: Some(self.phase.subscribe()),
        }
    }

    /// The layer that hands [`Shutdown`] to handlers (request extensions) and ends calls.
    pub fn layer(&self) -> DrainLayer {
        DrainLayer {
            phase: self.phase.subscribe(),
        }
    }

    /// Runs `serve` (a server whose graceful shutdown starts with [`Drain::start`]); once the
    /// drain has begun, waits at most the deadline for it, then ends every open call and gives
    /// it [`AFTER_CUT`] more before dropping it. `None` when it had to be dropped.
    pub async fn bounded<R>(&self, serve: impl Future<Output = R>) -> Option<R> {
        let mut phase = self.phase.subscribe();
        tokio::pin!(serve);
        tokio::select! {
            r = &mut serve => return Some(r),
            _ = phase.wait_for(|p| *p >= Phase::Draining) => {}
        }
        tokio::select! {
            r = &mut serve => return Some(r),
            () = tokio::time::sleep(self.deadline) => {}
        }
        self.phase.send_replace(Phase::Cut);
        tracing::warn!(
            deadline_ms = self.deadline.as_millis() as u64,
            "drain deadline passed: ending the calls still open with UNAVAILABLE"
        );
        tokio::select! {
            r = &mut serve => Some(r),
            () = tokio::time::sleep(AFTER_CUT) => {
                tracing::warn!("connections still open after the drain: closing them");
                None
            }
        }
    }
}

/// A handler's view of the drain: streams that would run forever select on
/// [`Shutdown::started`] and end with [`Shutdown::status`]. Found in a hosted request's
/// extensions ([`Shutdown::of`]); never fires when the service is not hosted by a
/// [`crate::Host`].
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    phase: Option<watch::Receiver<Phase>>,
}

impl Shutdown {
    /// The shutdown of the server that received `request`.
    pub fn of<T>(request: &tonic::Request<T>) -> Shutdown {
        request
            .extensions()
            .get::<Shutdown>()
            .cloned()
            .unwrap_or_default()
    }

    /// Resolves once the drain has begun (never when not hosted).
    pub async fn started(&self) {
        match &self.phase {
            Some(rx) => {
                let mut rx = rx.clone();
                if rx.wait_for(|p| *p >= Phase::Draining).await.is_err() {
                    // The server is gone: as good as shut down.
                }
            }
            None => std::future::pending().await,
        }
    }

    pub fn is_started(&self) -> bool {
        self.phase
            .as_ref()
            .is_some_and(|rx| *rx.borrow() >= Phase::Draining)
    }

    /// `stream` until the drain begins, then UNAVAILABLE and the end (a stream that ends by
    /// itself first ends as it would).
    pub fn ending<S, T>(self, stream: S) -> impl Stream<Item = Result<T, tonic::Status>> + Send
    where
        S: Stream<Item = Result<T, tonic::Status>> + Send,
        T: Send,
    {
        let stop = self.clone();
        let last = futures::stream::once(async move { self.is_started().then(Shutdown::status) })
            .filter_map(|s| async move { s.map(Err) });
        stream
            .take_until(async move { stop.started().await })
            .chain(last)
    }

    /// What an ended stream answers.
    pub fn status() -> tonic::Status {
        cairn_proto::reason::status(
            tonic::Code::Unavailable,
            "the server is shutting down; reconnect (to another instance, or once it is back) and resume",
            "shutting_down",
        )
    }
}

/// See [`Drain::layer`].
#[derive(Clone, Debug)]
pub struct DrainLayer {
    phase: watch::Receiver<Phase>,
}

impl<S> tower::Layer<S> for DrainLayer {
    type Service = DrainService<S>;
    fn layer(&self, inner: S) -> DrainService<S> {
        DrainService {
            inner,
            phase: self.phase.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct DrainService<S> {
    inner: S,
    phase: watch::Receiver<Phase>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Resolves when the drain reaches `at` (or the drain is gone).
fn reached(mut phase: watch::Receiver<Phase>, at: Phase) -> BoxFuture<()> {
    Box::pin(async move {
        let _ = phase.wait_for(|p| *p >= at).await;
    })
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for DrainService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
{
    type Response = http::Response<DrainBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<ReqBody>) -> Self::Future {
        let endless = ENDLESS.contains(&req.uri().path());
        req.extensions_mut().insert(Shutdown {
            phase: Some(self.phase.clone()),
        });
        let response = self.inner.call(req);
        let phase = self.phase.clone();
        Box::pin(async move {
            let cut = reached(phase.clone(), Phase::Cut);
            tokio::select! {
                r = response => {
                    let at = if endless { Phase::Draining } else { Phase::Cut };
                    Ok(r?.map(|inner| DrainBody::new(inner, reached(phase, at))))
                }
                () = cut => Ok(Shutdown::status().into_http::<DrainBody<ResBody>>()),
            }
        })
    }
}

/// A response body that ends with UNAVAILABLE trailers once its drain phase is reached.
pub struct DrainBody<B> {
    /// None: a trailers-only response (or finished).
    inner: Option<Pin<Box<B>>>,
    end: BoxFuture<()>,
    /// The drain phase was reached: one more ready frame may go out, then the trailers.
    ending: bool,
}

impl<B> DrainBody<B> {
    fn new(inner: B, end: BoxFuture<()>) -> Self {
        DrainBody {
            inner: Some(Box::pin(inner)),
            end,
            ending: false,
        }
    }
}

impl<B> Default for DrainBody<B> {
    fn default() -> Self {
        DrainBody {
            inner: None,
            end: Box::pin(std::future::pending()),
            ending: false,
        }
    }
}

impl<B> Body for DrainBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if !this.ending && this.end.as_mut().poll(cx).is_ready() {
            this.ending = true;
            // What the call has ready still goes out (a health Watch's NOT_SERVING).
            if let Poll::Ready(Some(Ok(frame))) = inner.as_mut().poll_frame(cx) {
                if frame.is_trailers() {
                    this.inner = None;
                }
                return Poll::Ready(Some(Ok(frame)));
            }
        }
        if this.ending {
            this.inner = None;
            let mut trailers = http::HeaderMap::new();
            let _ = Shutdown::status().add_header(&mut trailers);
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        let polled = inner.as_mut().poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.inner = None,
            Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => this.inner = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(|b| !self.ending && b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(b) if !self.ending => b.size_hint(),
            _ => SizeHint::default(),
        }
    }
}
