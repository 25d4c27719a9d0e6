//! Calls without a trace context start a trace only at the `sample_untraced` ratio: none at
//! 0.0, every one at 1.0; a call that carries a context is traced at 0.0 too. Health checks
//! make no span at any ratio.
#![allow(clippy::unwrap_used)]

use cairn_telemetry::traced;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tracing::Instrument;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer as _;

const REFLECTION: &str = "grpc.reflection.v1.ServerReflection/ServerReflectionInfo";

/// One reflection call and one health check to `addr`; inside a client span when `traced`.
async fn call(addr: &str, in_span: bool) {
    let channel = || traced(cairn_server::connect(addr).unwrap());
    let calls = async {
        let mut reflection = ServerReflectionClient::new(channel());
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut answers = reflection
            .server_reflection_info(tokio_stream::once(request))
            .await
            .unwrap()
            .into_inner();
        assert!(answers.message().await.unwrap().is_some());
        let mut health = HealthClient::new(channel());
        health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap();
    };
    if in_span {
        calls.instrument(tracing::info_span!("client.call")).await;
    } else {
        calls.await;
    }
}

/// Root server spans (no parent) among `spans`.
fn server_roots(spans: &[SpanData]) -> Vec<String> {
    spans
        .iter()
        .filter(|s| s.name.contains('/') && s.parent_span_id == opentelemetry::SpanId::INVALID)
        .map(|s| s.name.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untraced_calls_are_sampled_at_the_configured_ratio() {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_sampler(cairn_telemetry::Sampling)
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry().with(
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("test"))
            .with_filter(LevelFilter::INFO),
    );
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let host = tokio::spawn(cairn_server::Host::new().serve(listener, async {
        let _ = stopped.await;
    }));
    let finished = || {
        let _ = provider.force_flush();
        let spans = exporter.get_finished_spans().unwrap();
        exporter.reset();
        spans
    };

    // Default 0.0: an untraced call makes no trace.
    cairn_telemetry::sample_untraced(0.0);
    call(&addr, false).await;
    let spans = finished();
    assert!(
        server_roots(&spans).is_empty(),
        "untraced call traced at 0.0: {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );

    // A call with a context is traced whatever the ratio: its server span is the client's child.
    call(&addr, true).await;
    let spans = finished();
    let client = spans.iter().find(|s| s.name == "client.call").unwrap();
    let server = spans
        .iter()
        .find(|s| s.name.contains(REFLECTION))
        .expect("a call with a trace context is traced at 0.0");
    assert_eq!(server.parent_span_id, client.span_context.span_id());

    // 1.0: every untraced call starts its own trace (health checks still none).
    cairn_telemetry::sample_untraced(1.0);
    call(&addr, false).await;
    let roots = server_roots(&finished());
    assert_eq!(
        roots.len(),
        1,
        "one root per untraced call at 1.0: {roots:?}"
    );
    assert!(roots[0].contains(REFLECTION), "{roots:?}");

    let _ = stop.send(());
    host.await.unwrap().unwrap();
}
