//! A run taken over by another orchestrator (no caller to follow from) starts a new trace
//! whose run span links the trace of the run's previous life, as task.created recorded it.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::TaskState;
use common::*;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer as _;

const GATED: &str = r#"
nodes:
  - {id: draft, type: write_file, path: "docs/{{run_id}}/draft.txt", content: draft}
  - {id: review, type: gate, needs: [draft]}
"#;

/// The trace id (32 hex digits) of a W3C traceparent.
fn trace_of(traceparent: &str) -> String {
    traceparent.split('-').nth(1).unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_run_links_its_previous_trace() {
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

    let s = Stack::start(Options {
        tweak: |c| c.resume_on_start = false,
        ..Default::default()
    })
    .await;
    let run = s.submit(GATED, &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::InputRequired, 20).await;
    let created = s
        .events(&run)
        .await
        .into_iter()
        .find(|e| e.r#type == "task.created")
        .unwrap();
    let data: serde_json::Value = serde_json::from_str(&created.data_json).unwrap();
    let first = data["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("task.created records the run's trace: {data}"))
        .to_owned();

    // The first orchestrator stops driving it; another one over the same store takes it over.
    s.handle.as_ref().unwrap().shutdown().await;
    let config = cairn_orchestrator::Config {
        store_addr: s.store_addr.clone(),
        ingest_addr: s.ingest_addr.clone(),
        resume_on_start: false,
        ..Default::default()
    };
    let (_server, second) = cairn_orchestrator::orchestrator_service(config)
        .await
        .unwrap();
    exporter.reset();
    assert_eq!(second.resume_unfinished().await, 1, "the run is taken over");
    second.shutdown().await;

    // The life's span ends when the last of its tasks (driver, recorder, snapshots) has.
    let is_new_life = |sp: &opentelemetry_sdk::trace::SpanData| {
        let has = |k: &str, v: &str| {
            sp.attributes
                .iter()
                .any(|kv| kv.key.as_str() == k && kv.value.as_str() == v)
        };
        // The first life's span may end (and be exported) only now: the new one is resumed.
        sp.name == "run" && has("cairn.run_id", &run) && has("cairn.resumed", "true")
    };
    let mut life = None;
    for _ in 0..100 {
        let _ = provider.force_flush();
        life = exporter
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .find(|sp| is_new_life(sp));
        if life.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let life = life.expect("the new life's run span was exported");
    assert_eq!(
        life.parent_span_id,
        opentelemetry::SpanId::INVALID,
        "a new root"
    );
    let old = trace_of(&first);
    assert_ne!(life.span_context.trace_id().to_string(), old, "a new trace");
    let linked: Vec<String> = life
        .links
        .iter()
        .map(|l| l.span_context.trace_id().to_string())
        .collect();
    assert!(
        linked.contains(&old),
        "the adopted run links its previous trace {old}: {linked:?}"
    );
    s.stop().await;
}
