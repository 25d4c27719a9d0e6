//! Logs, traces, metrics and trace-context propagation for every cairn service. Services call
//! [`init`] once, wrap clients with [`traced`] and servers with [`server_layer`] and
//! [`RpcMetricsLayer`], and count what they do through [`metrics`] (read as Prometheus text by
//! [`metrics::encode`], pushed over OTLP when configured); nothing else in cairn touches
//! OpenTelemetry directly. Calls without a trace context are traced at the
//! [`sample_untraced`] ratio (see [`Sampling`]).
//!
//! Spans always get W3C ids (logs print them, and calls carry them to the next service);
//! export is configured by the standard `OTEL_*` variables and is off when no OTLP endpoint is
//! set (`OTEL_EXPORTER_OTLP_ENDPOINT`, or the signal's own `..._TRACES_ENDPOINT` /
//! `..._METRICS_ENDPOINT`), for one signal with `OTEL_TRACES_EXPORTER=none` /
//! `OTEL_METRICS_EXPORTER=none`, and for everything with `OTEL_SDK_DISABLED=true`.

mod logfmt;
pub mod metrics;
mod rpc;
mod sampling;

use std::env;
use std::sync::{Arc, OnceLock};

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tower_http::classify::{GrpcErrorsAsFailures, SharedClassifier};
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::{Dispatch, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use logfmt::LogFormat;
pub use rpc::{RpcMetrics, RpcMetricsLayer};
pub use sampling::{link_to, sample_untraced, sampled, traceparent, Sampling};

/// Keeps the exporters alive; flushes and shuts them down when dropped.
#[must_use = "dropping the guard stops export"]
pub struct Guard {
    traces: Option<SdkTracerProvider>,
    metrics: Option<SdkMeterProvider>,
}

impl Guard {
    /// True when spans are exported over OTLP.
    pub fn exporting(&self) -> bool {
        self.traces.is_some()
    }

    /// True when metrics are exported over OTLP.
    pub fn exporting_metrics(&self) -> bool {
        self.metrics.is_some()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let (traces, metrics) = (self.traces.take(), self.metrics.take());
        if traces.is_none() && metrics.is_none() {
            return;
        }
        // Shutdown blocks while it flushes; never do that on an async worker thread.
        let _ = std::thread::spawn(move || {
            if let Some(m) = metrics {
                let _ = m.shutdown();
            }
            if let Some(t) = traces {
                let _ = t.shutdown();
            }
        })
        .join();
    }
}

/// Installs the global subscriber: `RUST_LOG`-filtered logs on stderr (see [`LogFormat`] for
/// `CAIRN_LOG_FORMAT`), W3C trace ids on every span (spans at `CAIRN_TRACE_FILTER`, default
/// `info`, whatever `RUST_LOG` says), and, when configured, OTLP export of traces and metrics.
/// Safe to call more than once (later calls keep the first subscriber). Must run inside a
/// tokio runtime when OTLP export is configured.
pub fn init(service_name: &str) -> Guard {
    init_with_level(service_name, "info")
}

/// [`init`] with another default log level than `info` when `RUST_LOG` is unset (the CLI's
/// one-shot commands log only warnings; their spans are still made and exported).
pub fn init_with_level(service_name: &str, default_level: &str) -> Guard {
    install(
        service_name,
        default_level,
        LogFormat::from_env(),
        std::io::stderr,
    )
}

/// [`init_with_level`] writing the logs to `writer` instead of stderr, without colours (the
/// CLI's commands keep the logs of the services they embed in a file).
pub fn init_with_writer<W>(service_name: &str, default_level: &str, writer: W) -> Guard
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let format = match LogFormat::from_env() {
        LogFormat::Text { .. } => LogFormat::Text { ansi: false },
        json => json,
    };
    install(service_name, default_level, format, writer)
}

fn install<W>(service_name: &str, default_level: &str, format: LogFormat, writer: W) -> Guard
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let export = Export::from_env();
    let resource = resource(service_name);
    // Metrics do not need the subscriber: /metrics works whoever installed it.
    let metrics = metrics::install(&resource, export.metrics.then(otlp_metrics).flatten());
    let traces = (!export.sdk_disabled).then(|| tracer_provider(&resource, export.traces));
    let dispatch = dispatch(format, log_filter(default_level), writer, traces.as_ref());
    let installed = dispatch.try_init().is_ok();
    if !installed {
        tracing::warn!("a tracing subscriber was already installed; OTLP export not attached");
        return Guard {
            traces: None,
            metrics,
        };
    }
    if export.traces && traces.is_some() {
        tracing::info!(service = service_name, "OTLP trace export on");
    }
    if metrics.is_some() {
        tracing::info!(service = service_name, "OTLP metrics export on");
    }
    Guard {
        traces: traces.filter(|_| export.traces),
        metrics,
    }
}

/// The subscriber [`init`] installs, writing logs to `writer` (exposed for tests and for
/// embedders that install it themselves): logs filtered by `log_filter`, spans (for ids and
/// export through `tracer`) by `CAIRN_TRACE_FILTER` (default `info`).
pub fn dispatch<W>(
    format: LogFormat,
    log_filter: EnvFilter,
    writer: W,
    tracer: Option<&SdkTracerProvider>,
) -> Dispatch
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let slot = Arc::new(OnceLock::new());
    let fmt = format.layer(writer, slot.clone()).with_filter(log_filter);
    let otel = tracer.map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("cairn"))
            .with_filter(trace_filter())
    });
    let dispatch = Dispatch::new(tracing_subscriber::registry().with(fmt).with(otel));
    // The log formatter reads span ids through the dispatch it is part of.
    let _ = slot.set(dispatch.downgrade());
    dispatch
}

fn log_filter(default_level: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{default_level},h2=warn,hyper=warn,tower=warn,bollard=warn"
        ))
    })
}

/// Which spans become OpenTelemetry spans: `CAIRN_TRACE_FILTER` (EnvFilter syntax), default
/// `info` (health checks have no span at any level: see [`untraced`]).
fn trace_filter() -> EnvFilter {
    EnvFilter::try_from_env("CAIRN_TRACE_FILTER")
        .unwrap_or_else(|_| EnvFilter::new("info,h2=off,hyper=off,tower=off"))
}

/// What the `OTEL_*` variables ask for.
struct Export {
    sdk_disabled: bool,
    traces: bool,
    metrics: bool,
}

impl Export {
    fn from_env() -> Export {
        let set = |k: &str| env::var(k).map(|v| !v.trim().is_empty()).unwrap_or(false);
        let none = |k: &str| env::var(k).is_ok_and(|v| v.trim().eq_ignore_ascii_case("none"));
        let sdk_disabled =
            env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let endpoint = set("OTEL_EXPORTER_OTLP_ENDPOINT");
        Export {
            sdk_disabled,
            traces: !sdk_disabled
                && !none("OTEL_TRACES_EXPORTER")
                && (endpoint || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")),
            metrics: !sdk_disabled
                && !none("OTEL_METRICS_EXPORTER")
                && (endpoint || set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")),
        }
    }
}

/// `service.name` is `service_name` unless `OTEL_SERVICE_NAME` says otherwise; the builder
/// also reads `OTEL_RESOURCE_ATTRIBUTES`.
fn resource(service_name: &str) -> Resource {
    let mut resource = Resource::builder();
    if env::var("OTEL_SERVICE_NAME").map_or(true, |v| v.trim().is_empty()) {
        resource = resource.with_service_name(service_name.to_owned());
    }
    resource.build()
}

/// Spans always get ids (for logs and propagation); they are exported only when `export`.
fn tracer_provider(resource: &Resource, export: bool) -> SdkTracerProvider {
    let mut builder = SdkTracerProvider::builder().with_resource(resource.clone());
    // A sampler named by OTEL_TRACES_SAMPLER replaces cairn's (and sample_untraced with it).
    if env::var("OTEL_TRACES_SAMPLER").map_or(true, |v| v.trim().is_empty()) {
        builder = builder.with_sampler(sampling::Sampling);
    }
    if !export {
        return builder.build();
    }
    match opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
    {
        Ok(exporter) => builder.with_batch_exporter(exporter).build(),
        Err(e) => {
            eprintln!("cairn: OTLP trace exporter not started: {e}");
            builder.build()
        }
    }
}

/// The OTLP metrics exporter the `OTEL_*` variables describe.
fn otlp_metrics() -> Option<opentelemetry_otlp::MetricExporter> {
    match opentelemetry_otlp::MetricExporter::builder()
        .with_tonic()
        .build()
    {
        Ok(e) => Some(e),
        Err(e) => {
            eprintln!("cairn: OTLP metrics exporter not started: {e}");
            None
        }
    }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Client interceptor: writes the current span's W3C `traceparent`/`tracestate` into the
/// request metadata, so the callee's spans join the caller's trace.
pub fn inject_context(
    mut request: tonic::Request<()>,
) -> Result<tonic::Request<()>, tonic::Status> {
    let cx = Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut MetadataInjector(request.metadata_mut()))
    });
    Ok(request)
}

/// The interceptor's function type.
pub type ContextInjector = fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status>;

/// A channel whose requests carry the trace context.
pub type TracedChannel =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, ContextInjector>;

/// Wraps a channel so every request carries the current trace context.
pub fn traced(channel: tonic::transport::Channel) -> TracedChannel {
    tonic::service::interceptor::InterceptedService::new(channel, inject_context as ContextInjector)
}

/// The gRPC service whose calls get no span at all: probes (Docker `HEALTHCHECK`, Kubernetes,
/// load balancers, the orchestrator's checks of runners) call it every few seconds, and a
/// trace per probe would bury the runs in the tracing backend.
pub const UNTRACED_SERVICE: &str = "grpc.health.v1.Health";

/// True for RPC paths that get no span ([`UNTRACED_SERVICE`]'s `/grpc.health.v1.Health/*`:
/// Check and Watch), whatever `CAIRN_TRACE_FILTER` says.
pub fn untraced(path: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|p| p.strip_prefix(UNTRACED_SERVICE))
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Makes one span per incoming RPC, parented to the caller's `traceparent` when present.
/// Health checks ([`untraced`]) get none.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcMakeSpan;

impl<B> tower_http::trace::MakeSpan<B> for GrpcMakeSpan {
    fn make_span(&mut self, request: &http::Request<B>) -> Span {
        let path = request.uri().path();
        if untraced(path) {
            return Span::none();
        }
        let (service, method) = path
            .trim_start_matches('/')
            .split_once('/')
            .unwrap_or((path, ""));
        let span = tracing::info_span!(
            "grpc.server",
            otel.name = %path,
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = %service,
            rpc.method = %method,
        );
        let parent = opentelemetry::global::get_text_map_propagator(|p| {
            p.extract(&HeaderExtractor(request.headers()))
        });
        let _ = span.set_parent(parent);
        span
    }
}

/// The tower layer that [`server_layer`] returns.
pub type ServerTraceLayer = TraceLayer<
    SharedClassifier<GrpcErrorsAsFailures>,
    GrpcMakeSpan,
    (),
    DefaultOnResponse,
    (),
    (),
    DefaultOnFailure,
>;

/// Server layer: one span per RPC (see [`GrpcMakeSpan`]); responses and failures logged at
/// DEBUG (refusals are normal traffic, not errors of the server).
pub fn server_layer() -> ServerTraceLayer {
    TraceLayer::new_for_grpc()
        .make_span_with(GrpcMakeSpan)
        .on_request(())
        .on_response(DefaultOnResponse::new().level(tracing::Level::DEBUG))
        .on_body_chunk(())
        .on_eos(())
        .on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG))
}

/// Records cairn's correlation attributes on the current span (run_id, node_id, project).
pub fn record_ids(project: &str, run_id: &str, node_id: &str) {
    let span = Span::current();
    if !project.is_empty() {
        span.set_attribute("cairn.project", project.to_owned());
    }
    if !run_id.is_empty() {
        span.set_attribute("cairn.run_id", run_id.to_owned());
    }
    if !node_id.is_empty() {
        span.set_attribute("cairn.node_id", node_id.to_owned());
    }
}

/// The W3C trace id of the current span (32 hex digits), if it has one.
pub fn current_trace_id() -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    let cx = Span::current().context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::untraced;

    #[test]
    fn health_paths_are_untraced_and_nothing_else() {
        for path in [
            "/grpc.health.v1.Health/Check",
            "/grpc.health.v1.Health/Watch",
            "/grpc.health.v1.Health/List",
        ] {
            assert!(untraced(path), "{path}");
        }
        for path in [
            "/cairn.v1.ArtifactStore/Put",
            "/grpc.health.v1.HealthX/Check",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "grpc.health.v1.Health/Check",
            "/grpc.health.v1.Health",
            "",
        ] {
            assert!(!untraced(path), "{path}");
        }
    }
}
