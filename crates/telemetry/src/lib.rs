//! Logs, traces and trace-context propagation for every cairn service (DESIGN.md
//! "Cross-cutting"). Services call [`init`] once, wrap clients with [`inject_context`] and
//! servers with [`server_layer`]; nothing else in cairn touches OpenTelemetry directly.
//!
//! Export is configured by the standard `OTEL_*` variables and is off when no OTLP endpoint is
//! set (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), or when
//! `OTEL_SDK_DISABLED=true` / `OTEL_TRACES_EXPORTER=none`.

use std::env;

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tower_http::classify::{GrpcErrorsAsFailures, SharedClassifier};
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the trace exporter alive; flushes and shuts it down when dropped.
#[must_use = "dropping the guard stops trace export"]
pub struct Guard {
    provider: Option<SdkTracerProvider>,
}

impl Guard {
    /// True when spans are exported over OTLP.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            // Shutdown blocks while it flushes; never do that on an async worker thread.
            let _ = std::thread::spawn(move || {
                let _ = provider.shutdown();
            })
            .join();
        }
    }
}

/// Installs the global subscriber: `RUST_LOG`-filtered logs on stderr (JSON when
/// `CAIRN_LOG_FORMAT=json`) plus, when configured, OTLP trace export. Safe to call more than
/// once (later calls keep the first subscriber). Must run inside a tokio runtime when OTLP
/// export is configured.
pub fn init(service_name: &str) -> Guard {
    init_with_level(service_name, "info")
}

/// [`init`] with another default level than `info` when `RUST_LOG` is unset (the CLI's
/// one-shot commands log only warnings).
pub fn init_with_level(service_name: &str, default_level: &str) -> Guard {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{default_level},h2=warn,hyper=warn,tower=warn,bollard=warn"
        ))
    });
    let fmt = if env::var("CAIRN_LOG_FORMAT").as_deref() == Ok("json") {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .compact()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .boxed()
    };
    let provider = otlp_enabled()
        .then(|| build_provider(service_name))
        .flatten();
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("cairn"))
            .boxed()
    });
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()
        .is_ok();
    match &provider {
        Some(_) if installed => tracing::info!(service = service_name, "OTLP trace export on"),
        Some(_) => {
            tracing::warn!("a tracing subscriber was already installed; OTLP export not attached")
        }
        None => {}
    }
    Guard {
        provider: provider.filter(|_| installed),
    }
}

fn otlp_enabled() -> bool {
    let set = |k: &str| env::var(k).map(|v| !v.trim().is_empty()).unwrap_or(false);
    let disabled = env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.eq_ignore_ascii_case("none"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

fn build_provider(service_name: &str) -> Option<SdkTracerProvider> {
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("cairn: OTLP exporter not started: {e}");
            return None;
        }
    };
    // OTEL_SERVICE_NAME, when set, wins over the built-in name.
    let mut resource = Resource::builder();
    if env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(service_name.to_owned());
    }
    Some(
        SdkTracerProvider::builder()
            .with_resource(resource.build())
            .with_batch_exporter(exporter)
            .build(),
    )
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

/// Makes one span per incoming RPC, parented to the caller's `traceparent` when present.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcMakeSpan;

impl<B> tower_http::trace::MakeSpan<B> for GrpcMakeSpan {
    fn make_span(&mut self, request: &http::Request<B>) -> Span {
        let path = request.uri().path();
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
