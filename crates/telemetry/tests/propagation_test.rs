//! The trace context crosses a real gRPC hop: a client span and the server's span for the
//! same call share one trace id, and the server span is the client span's child. Health
//! checks (grpc.health.v1 Check and Watch) make no server span, even with every level traced.

use cairn_telemetry::traced;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_span_joins_the_callers_trace() {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cairn_server::Host::new().serve(listener, async {
        let _ = stopped.await;
    }));

    // A traced call (reflection: any service but health would do).
    let mut reflection = ServerReflectionClient::new(traced(cairn_server::connect(&addr).unwrap()));
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::once(request))
        .instrument(tracing::info_span!("client.call"))
        .await
        .unwrap()
        .into_inner();
    assert!(
        answers.message().await.unwrap().is_some(),
        "reflection answered"
    );

    // Probes, inside a span of their own so that they carry a traceparent too.
    let mut health = HealthClient::new(traced(cairn_server::connect(&addr).unwrap()));
    async {
        let status = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(status.into_inner().status, 1, "health must report SERVING");
        let mut watch = health
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(watch.message().await.unwrap().unwrap().status, 1);
    }
    .instrument(tracing::info_span!("probe"))
    .await;

    let _ = stop.send(());
    server.await.unwrap().unwrap();
    let _ = provider.force_flush();

    let spans = exporter.get_finished_spans().unwrap();
    let client = spans
        .iter()
        .find(|s| s.name == "client.call")
        .expect("client span exported");
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    let server = spans
        .iter()
        .find(|s| {
            s.name
                .contains("grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
        })
        .unwrap_or_else(|| panic!("server span exported; got {names:?}"));
    assert_eq!(
        server.span_context.trace_id(),
        client.span_context.trace_id(),
        "one call, one trace"
    );
    assert_eq!(
        server.parent_span_id,
        client.span_context.span_id(),
        "server span is the client's child"
    );
    assert!(names.contains(&"probe"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.contains("grpc.health.v1")),
        "health checks must make no server span: {names:?}"
    );
}

#[test]
fn inject_without_a_span_adds_no_traceparent() {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let request = cairn_telemetry::inject_context(tonic::Request::new(())).unwrap();
    assert!(request.metadata().get("traceparent").is_none());
}
