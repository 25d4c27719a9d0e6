//! What every service's configuration says about its telemetry: the `metrics_listen` address
//! of its `/metrics` page and the `[telemetry]` section (sampling of untraced calls).

use std::future::Future;

use serde::{Deserialize, Serialize};

/// `[telemetry]`: how a service traces what it serves (export itself is set by `OTEL_*`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Share (0.0 to 1.0) of incoming calls without a trace context that start a trace of
    /// their own; calls that carry a context follow the caller's decision.
    pub sample_untraced: f64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            sample_untraced: 0.0,
        }
    }
}

// Configurations compare exactly: the ratio by its bits.
impl PartialEq for TelemetryConfig {
    fn eq(&self, other: &Self) -> bool {
        self.sample_untraced.to_bits() == other.sample_untraced.to_bits()
    }
}
impl Eq for TelemetryConfig {}

impl TelemetryConfig {
    /// Refuses a ratio outside 0.0..=1.0.
    pub fn check(&self) -> Result<(), String> {
        if (0.0..=1.0).contains(&self.sample_untraced) {
            Ok(())
        } else {
            Err(format!(
                "telemetry.sample_untraced = {} is out of range: use 0.0 (never) to 1.0 (every call)",
                self.sample_untraced
            ))
        }
    }

    /// Makes the ratio the process's own (one tracer per process: the last call wins).
    pub fn apply(&self) {
        cairn_telemetry::sample_untraced(self.sample_untraced);
    }
}

/// Serves `GET /metrics` (the Prometheus text of [`cairn_telemetry::metrics::encode`]) on
/// `listener` until `shutdown` resolves. Plain HTTP: the page holds counts and durations
/// labelled by kinds, states and methods, never ids or contents.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|| async {
            (
                [(
                    http::header::CONTENT_TYPE,
                    cairn_telemetry::metrics::CONTENT_TYPE,
                )],
                cairn_telemetry::metrics::encode(),
            )
        }),
    );
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving metrics at /metrics");
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
