//! Log lines carry the W3C trace id and span id of the span they were logged in (text and
//! JSON), the ids of the caller's trace when the span continues one, and none outside spans.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use cairn_telemetry::LogFormat;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Logs one line inside a span continuing the caller's trace, one inside a DEBUG child span
/// (no OpenTelemetry span of its own), and one outside any span; returns the lines.
fn log_lines(format: LogFormat) -> Vec<String> {
    let buf = Buf::default();
    let writer = buf.clone();
    let provider = SdkTracerProvider::builder().build();
    let dispatch = cairn_telemetry::dispatch(
        format,
        EnvFilter::new("debug"),
        move || writer.clone(),
        Some(&provider),
    );
    tracing::dispatcher::with_default(&dispatch, || {
        let caller = opentelemetry::Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_hex(TRACE).unwrap(),
            SpanId::from_hex(CALLER_SPAN).unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        ));
        let span = tracing::info_span!("grpc.server", rpc.method = "Put");
        span.set_parent(caller).unwrap();
        span.in_scope(|| {
            tracing::info!(path = "docs/a.md", "stored");
            tracing::debug_span!("detail").in_scope(|| tracing::debug!("inner detail"));
        });
        tracing::info!("no span here");
    });
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    text.lines().map(str::to_owned).collect()
}

fn hex_id(s: &str, len: usize) -> bool {
    s.len() == len && s.chars().all(|c| c.is_ascii_hexdigit()) && s.chars().any(|c| c != '0')
}

#[test]
fn text_lines_end_with_trace_and_span_ids() {
    let lines = log_lines(LogFormat::Text { ansi: false });
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let (head, ids) = lines[0].split_once(" trace_id=").unwrap();
    assert!(
        head.contains("stored") && head.contains("docs/a.md"),
        "{head}"
    );
    let (trace, span) = ids.split_once(" span_id=").unwrap();
    assert_eq!(trace, TRACE, "the caller's trace continues");
    assert!(
        hex_id(span, 16) && span != CALLER_SPAN,
        "the server span's own id: {span}"
    );
    assert!(
        lines[1].contains("inner detail")
            && lines[1].ends_with(&format!("trace_id={TRACE} span_id={span}")),
        "a span without OpenTelemetry data logs its parent's ids: {}",
        lines[1]
    );
    assert!(!lines[2].contains("trace_id"), "{}", lines[2]);
}

#[test]
fn json_lines_have_trace_and_span_id_fields() {
    let lines = log_lines(LogFormat::Json);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let v: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(v[0]["fields"]["message"], "stored");
    assert_eq!(v[0]["fields"]["path"], "docs/a.md");
    assert_eq!(v[0]["trace_id"], TRACE);
    let span = v[0]["span_id"].as_str().unwrap();
    assert!(hex_id(span, 16) && span != CALLER_SPAN, "{span}");
    assert_eq!(v[1]["trace_id"], TRACE);
    assert_eq!(v[1]["span_id"], span);
    assert!(v[2].get("trace_id").is_none(), "{}", lines[2]);
    assert_eq!(v[2]["fields"]["message"], "no span here");
}
