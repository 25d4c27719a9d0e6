//! Probes for orchestrators of containers (Kubernetes, compose): `/healthz` says the process
//! serves HTTP, `/readyz` that the orchestrator and the artifact-store answer gRPC health too.
//!
//! They are answered before the Host check, sessions and login (a kubelet sends the pod's IP
//! address as Host and has no session), so they must never reveal anything: a fixed word and a
//! status code, no address, no error text (those go to the log), no cookie.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::Console;

/// Longest wait for one service's health answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

fn answer(status: StatusCode, word: &'static str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        word,
    )
        .into_response()
}

/// Liveness: the process answers HTTP.
pub(super) async fn live() -> Response {
    answer(StatusCode::OK, "ok\n")
}

/// Readiness: the orchestrator and the store both answer SERVING on grpc.health.v1.
pub(super) async fn ready(State(console): State<Console>) -> Response {
    let inner = &console.inner;
    let (orchestrator, store) = tokio::join!(
        cairn_server::serving(inner.health.orchestrator.clone(), "", PROBE_TIMEOUT),
        cairn_server::serving(inner.health.store.clone(), "", PROBE_TIMEOUT),
    );
    let mut ready = true;
    for (name, addr, result) in [
        (
            "orchestrator",
            &inner.config.orchestrator_addr,
            orchestrator,
        ),
        ("artifact-store", &inner.config.store_addr, store),
    ] {
        match result {
            Ok(true) => {}
            Ok(false) => {
                ready = false;
                tracing::warn!(service = name, addr = %addr, "console not ready: the service is not SERVING");
            }
            Err(status) => {
                ready = false;
                tracing::warn!(service = name, addr = %addr, error = %status.message(), "console not ready: no health answer");
            }
        }
    }
    if ready {
        answer(StatusCode::OK, "ready\n")
    } else {
        answer(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// The untraced channels the probes dial (health calls need no trace context).
pub(super) struct Channels {
    pub orchestrator: tonic::transport::Channel,
    pub store: tonic::transport::Channel,
}
