//! The live event stream of a run page: the orchestrator's WatchRun in follow mode as
//! server-sent events. Each run event is one `run-event` message (id = the event's sequence
//! number, so a browser that reconnects resumes after the last one it saw) carrying the event
//! and its table row as the page renders it. The stream goes on past the run's end (a failed
//! run may be resumed or reworked) while the page is open; when the watch fails the stream
//! just ends and the browser reconnects. Only the console's shutdown sends `end`.

use std::convert::Infallible;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::Extension;
use cairn_proto::v1::{Event, WatchRunRequest};
use futures::Stream;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

use super::history;
use super::session::Visitor;
use super::{Console, ConsoleError};

#[derive(Deserialize)]
pub(super) struct EventsQuery {
    /// First sequence number wanted (default: all).
    #[serde(default)]
    from: Option<u64>,
}

/// The JSON a browser gets for one run event: the event, and `row`, its table row (markup
/// rendered and escaped here, inserted as is by the page's script).
fn browser_event(project: &str, e: &Event) -> Value {
    json!({
        "seq": e.seq,
        "ts": e.ts,
        "type": e.r#type,
        "node_id": e.node_id,
        "level": history::level_name(e.level),
        "data": history::data(e),
        "row": history::row(project, e).into_string(),
    })
}

/// The open watch and the shutdown signal; None once the stream has ended.
type Watch = Option<(Streaming<Event>, CancellationToken, String)>;

/// The `end` message: the stream is over and the browser should not reconnect.
pub(super) fn end(reason: &str) -> SseEvent {
    SseEvent::default()
        .event("end")
        .json_data(json!({ "reason": reason }))
        .unwrap_or_else(|_| SseEvent::default().event("end"))
}

pub(super) async fn stream(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run)): Path<(String, String)>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ConsoleError> {
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let from_seq = resume.map(|s| s + 1).or(q.from).unwrap_or(1);
    let req = WatchRunRequest {
        project_id: project.clone(),
        run_id: run.clone(),
        from_seq,
        follow_after_end: true,
    };
    let watch = console
        .call(
            &format!("watching run {run}"),
            console.orchestrator(&visitor).watch_run(req),
        )
        .await?;
    let state: Watch = Some((watch, console.inner.stopping.clone(), project));
    let events = futures::stream::unfold(state, |state| async move {
        let (mut watch, stopping, project) = state?;
        let next = tokio::select! {
            _ = stopping.cancelled() => return Some((Ok(end("the console is shutting down")), None)),
            next = watch.message() => next,
        };
        match next {
            Ok(Some(e)) => {
                let msg = SseEvent::default()
                    .event("run-event")
                    .id(e.seq.to_string())
                    .json_data(browser_event(&project, &e));
                let msg = msg.unwrap_or_else(|_| SseEvent::default().event("run-event").data("{}"));
                Some((Ok(msg), Some((watch, stopping, project))))
            }
            // The watch ended or failed (an orchestrator restarting): end the response without
            // `end`, so the browser reconnects from the last id it saw.
            Ok(None) => None,
            Err(status) => {
                tracing::info!(message = status.message(), "a run's event stream ended");
                None
            }
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
