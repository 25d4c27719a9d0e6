//! Log lines: compact text or JSON, each with the W3C `trace_id` and `span_id` of the span it
//! was logged in, so a line found in one service's logs leads to the whole trace.

use std::fmt;
use std::sync::{Arc, OnceLock};

use opentelemetry::trace::{SpanId, TraceContextExt as _, TraceId};
use tracing::dispatcher::WeakDispatch;
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// How log lines look: `CAIRN_LOG_FORMAT=json` for JSON lines (one object per line, with
/// `timestamp`, `level`, `fields`, `target`, `span`, `spans`, `trace_id`, `span_id`),
/// anything else for compact text ending in `trace_id=… span_id=…` inside a span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text { ansi: bool },
    Json,
}

impl LogFormat {
    /// From `CAIRN_LOG_FORMAT`; text is coloured when stderr is a terminal.
    pub fn from_env() -> LogFormat {
        match std::env::var("CAIRN_LOG_FORMAT") {
            Ok(v) if v.trim().eq_ignore_ascii_case("json") => LogFormat::Json,
            _ => LogFormat::Text {
                ansi: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            },
        }
    }

    pub(crate) fn layer<S, W>(
        self,
        writer: W,
        dispatch: Arc<OnceLock<WeakDispatch>>,
    ) -> Box<dyn Layer<S> + Send + Sync>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
    {
        // A log line that cannot be written (stderr closed: `cairn up 2>&1 | head -1`) is
        // dropped; reporting it would eprintln! into the same closed pipe and panic.
        let fmt = tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .log_internal_errors(false);
        match self {
            LogFormat::Json => fmt
                .fmt_fields(JsonFields::new())
                .event_format(WithTraceIds {
                    inner: tracing_subscriber::fmt::format().json(),
                    json: true,
                    dispatch,
                })
                .boxed(),
            LogFormat::Text { ansi } => fmt
                .with_ansi(ansi)
                .event_format(WithTraceIds {
                    // The line is formatted into a buffer first, whose writer knows no colours.
                    inner: tracing_subscriber::fmt::format().compact().with_ansi(ansi),
                    json: false,
                    dispatch,
                })
                .boxed(),
        }
    }
}

/// Formats with `inner`, then appends the ids of the event's innermost span that has them.
struct WithTraceIds<F> {
    inner: F,
    json: bool,
    /// The dispatch this formatter belongs to (set once it is built): span ids live in the
    /// OpenTelemetry layer's data, reachable only through it.
    dispatch: Arc<OnceLock<WeakDispatch>>,
}

impl<F> WithTraceIds<F> {
    fn ids<S, N>(&self, ctx: &FmtContext<'_, S, N>) -> Option<(TraceId, SpanId)>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'w> FormatFields<'w> + 'static,
    {
        let dispatch = self.dispatch.get()?.upgrade()?;
        let scope = ctx.event_scope()?;
        for span in scope {
            // Spans the trace filter left out have no OpenTelemetry data: use their parent's.
            if let Some(cx) = tracing_opentelemetry::get_otel_context(&span.id(), &dispatch) {
                let sc = cx.span().span_context().clone();
                if sc.is_valid() {
                    return Some((sc.trace_id(), sc.span_id()));
                }
            }
        }
        None
    }
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((trace_id, span_id)) = self.ids(ctx) else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        let body = line.trim_end_matches('\n');
        match body.strip_suffix('}').filter(|_| self.json) {
            Some(open) => writeln!(
                writer,
                r#"{open},"trace_id":"{trace_id}","span_id":"{span_id}"}}"#
            ),
            None if self.json => writeln!(writer, "{body}"),
            None => writeln!(writer, "{body} trace_id={trace_id} span_id={span_id}"),
        }
    }
}
