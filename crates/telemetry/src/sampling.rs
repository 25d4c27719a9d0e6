//! Which spans are recorded, and the W3C trace context of a span as text.
//!
//! A call that arrives without a trace context (a probe, a script, another system's client)
//! would start a trace of its own; such server spans are sampled at the ratio
//! [`sample_untraced`] sets (default 0: none). Every other span follows its parent's decision,
//! and spans cairn starts itself (a run's life, a CLI command) are always recorded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::trace::{Link, SpanKind, TraceContextExt as _, TraceId};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{Sampler, SamplingResult, ShouldSample};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// `f64` bits of the ratio of untraced calls that are traced (0.0 at start).
static UNTRACED_RATIO: AtomicU64 = AtomicU64::new(0);

/// Sets the ratio (0.0 to 1.0, clamped) of calls without a trace context that start a trace.
pub fn sample_untraced(ratio: f64) {
    let ratio = if ratio.is_nan() {
        0.0
    } else {
        ratio.clamp(0.0, 1.0)
    };
    UNTRACED_RATIO.store(ratio.to_bits(), Ordering::Relaxed);
}

fn untraced_ratio() -> f64 {
    f64::from_bits(UNTRACED_RATIO.load(Ordering::Relaxed))
}

/// The sampler of cairn's tracer provider: parent-based; a root server span (an incoming call
/// without a trace context) is kept at the [`sample_untraced`] ratio, other roots always.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sampling;

impl ShouldSample for Sampling {
    fn should_sample(
        &self,
        parent: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let has_parent =
            parent.is_some_and(|cx| cx.has_active_span() && cx.span().span_context().is_valid());
        let root = if !has_parent && *kind == SpanKind::Server {
            Sampler::TraceIdRatioBased(untraced_ratio())
        } else {
            Sampler::AlwaysOn
        };
        Sampler::ParentBased(Box::new(root))
            .should_sample(parent, trace_id, name, kind, attributes, links)
    }
}

/// True when `span` is recorded for export (false for a span a sampler dropped and for a span
/// without OpenTelemetry data).
pub fn sampled(span: &Span) -> bool {
    span.context().span().span_context().is_sampled()
}

/// `span`'s W3C `traceparent`, if it has a valid context.
pub fn traceparent(span: &Span) -> Option<String> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier.remove("traceparent")
}

/// Links `span` (not entered yet) to the span a W3C `traceparent` names; false when the text
/// names none.
pub fn link_to(span: &Span, traceparent: &str) -> bool {
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&carrier));
    let linked = cx.span().span_context().clone();
    if !linked.is_valid() {
        return false;
    }
    span.add_link(linked);
    true
}
