//! Node output on the run page: a panel per sandbox_run and code_delivery node with its
//! retained output as of the page's loading (the orchestrator's WatchLogs), the error of a
//! failed node beside the output of the step that failed, and the live stream that the page's
//! script appends to the panel (server-sent `log` messages, id `<attempt>.<seq>` so a browser
//! that reconnects resumes after the last chunk it saw).
//!
//! Log output is the program's, so anyone's: it only ever reaches the page as text (maud
//! escapes it here; the script sets `textContent`).

use std::collections::HashMap;
use std::convert::Infallible;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::Extension;
use cairn_proto::v1::{Event, LogChunk, LogStream, NodeState, RunInfo, WatchLogsRequest};
use futures::Stream;
use maud::{html, Markup};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

use super::events::end;
use super::page;
use super::session::Visitor;
use super::{ansi, logview};
use super::{Console, ConsoleError};

/// Node types whose output the orchestrator keeps.
const LOGGED_TYPES: [&str; 2] = ["sandbox_run", "code_delivery"];
/// Most bytes of one node's output put on the page when it loads (the tail).
pub(super) const PAGE_BYTES: usize = 64 << 10;
/// Lines of a failed sandbox program's output shown beside its error.
const TAIL_LINES: usize = 40;

/// What gets a log panel, as (id, type): every sandbox_run and code_delivery node, then every
/// item of a map (`<map>.<index>`) whose `node.started` event names one of those types.
pub(super) fn logged(info: &RunInfo, events: &[Event]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = info
        .nodes
        .iter()
        .filter(|n| LOGGED_TYPES.contains(&n.r#type.as_str()))
        .map(|n| (n.id.clone(), n.r#type.clone()))
        .collect();
    let is_map = |id: &str| info.nodes.iter().any(|n| n.id == id && n.r#type == "map");
    for e in events.iter().filter(|e| e.r#type == "node.started") {
        let Some((map, index)) = e.node_id.rsplit_once('.') else {
            continue;
        };
        if !is_map(map)
            || index.parse::<u64>().is_err()
            || out.iter().any(|(id, _)| *id == e.node_id)
        {
            continue;
        }
        let kind = serde_json::from_str::<serde_json::Value>(&e.data_json)
            .ok()
            .and_then(|d| d.get("node_type")?.as_str().map(str::to_owned))
            .unwrap_or_default();
        if LOGGED_TYPES.contains(&kind.as_str()) {
            out.push((e.node_id.clone(), kind));
        }
    }
    out
}

/// One piece of output as the page shows it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Piece {
    pub attempt: u32,
    /// stdout | stderr | step | note
    pub class: &'static str,
    pub text: String,
}

/// A node's output as of now: the pieces (the tail), and the last chunk's position.
#[derive(Default)]
pub(super) struct NodeOutput {
    pub pieces: Vec<Piece>,
    /// `<attempt>.<seq>` of the last chunk read ("" = none).
    pub after: String,
}

fn class(stream: i32) -> &'static str {
    match LogStream::try_from(stream) {
        Ok(LogStream::Stdout) => "stdout",
        Ok(LogStream::Stderr) => "stderr",
        Ok(LogStream::Step) => "step",
        _ => "note",
    }
}

/// Text of chunks of one attempt: bytes of a character cut between two chunks wait for the
/// rest, so they are not shown as replacement characters.
#[derive(Default)]
struct Utf8 {
    pending: HashMap<(u32, i32), Vec<u8>>,
}

impl Utf8 {
    fn text(&mut self, c: &LogChunk) -> String {
        let buf = self.pending.entry((c.attempt, c.stream)).or_default();
        buf.extend_from_slice(&c.data);
        let keep = match std::str::from_utf8(buf) {
            Ok(_) => 0,
            // An incomplete character at the end (no error_len): keep its bytes for later.
            Err(e) if e.error_len().is_none() && !c.end => buf.len() - e.valid_up_to(),
            Err(_) => 0,
        };
        let rest = buf.split_off(buf.len() - keep);
        let text = String::from_utf8_lossy(buf).into_owned();
        *buf = rest;
        text
    }
}

/// The pieces one chunk shows as: a drop notice, its text, an end line.
fn pieces(c: &LogChunk, utf8: &mut Utf8) -> Vec<Piece> {
    let mut out = Vec::new();
    let piece = |class: &'static str, text: String| Piece {
        attempt: c.attempt,
        class,
        text,
    };
    if c.dropped_bytes > 0 {
        out.push(piece(
            "note",
            format!(
                "[{} of earlier output dropped: only the last part of each attempt's output is kept]\n",
                page::size(c.dropped_bytes)
            ),
        ));
    }
    let text = utf8.text(c);
    if !text.is_empty() {
        out.push(piece(class(c.stream), text));
    }
    if c.end {
        let mut line = format!("[attempt {} ended: {}", c.attempt, c.outcome);
        if !c.error.is_empty() {
            line.push_str(": ");
            line.push_str(&c.error);
        }
        line.push_str("]\n");
        out.push(piece("note", line));
    }
    out
}

/// What node `node` printed so far (WatchLogs without follow), its last `limit` bytes.
pub(super) async fn load(
    console: &Console,
    visitor: &Visitor,
    project: &str,
    run: &str,
    node: &str,
    limit: usize,
) -> Result<NodeOutput, ConsoleError> {
    let what = format!("reading the output of node {node}");
    let req = WatchLogsRequest {
        project_id: project.to_owned(),
        run_id: run.to_owned(),
        node_id: node.to_owned(),
        follow: false,
        after_attempt: 0,
        after_seq: 0,
    };
    let mut stream = console
        .call(&what, console.orchestrator(visitor).watch_logs(req))
        .await?;
    let mut out = NodeOutput::default();
    let mut utf8 = Utf8::default();
    let mut bytes = 0usize;
    let read = async {
        while let Some(c) = stream.message().await? {
            out.after = format!("{}.{}", c.attempt, c.seq);
            for p in pieces(&c, &mut utf8) {
                bytes += p.text.len();
                out.pieces.push(p);
            }
            // Keep the tail: drop whole pieces from the front beyond the bound.
            while bytes > limit && out.pieces.len() > 1 {
                bytes -= out.pieces.remove(0).text.len();
            }
        }
        Ok::<_, tonic::Status>(())
    };
    match tokio::time::timeout(console.rpc_timeout(), read).await {
        Ok(Ok(())) => Ok(out),
        Ok(Err(s)) => Err(ConsoleError::rpc(&what, s)),
        Err(_) => Err(ConsoleError::Timeout {
            what,
            secs: console.config().rpc_timeout_s,
        }),
    }
}

/// The output of the step that failed, from a failed node's last attempt: for code_delivery
/// the last command that did not exit 0, with its output; otherwise the last TAIL_LINES lines.
pub(super) fn failing_step(kind: &str, pieces: &[Piece]) -> Vec<Piece> {
    let Some(last) = pieces.iter().map(|p| p.attempt).max() else {
        return Vec::new();
    };
    let attempt: Vec<&Piece> = pieces
        .iter()
        .filter(|p| p.attempt == last && !(p.class == "note" && p.text.starts_with("[attempt ")))
        .collect();
    if kind == "code_delivery" {
        let starts: Vec<usize> = attempt
            .iter()
            .enumerate()
            .filter(|(_, p)| p.class == "step" && p.text.starts_with("$ "))
            .map(|(i, _)| i)
            .collect();
        for (k, &start) in starts.iter().enumerate().rev() {
            let end = starts.get(k + 1).copied().unwrap_or(attempt.len());
            let step = &attempt[start..end];
            let ok = step
                .iter()
                .any(|p| p.class == "step" && p.text.starts_with("[exit 0]"));
            if !ok {
                return step.iter().map(|p| (*p).clone()).collect();
            }
        }
        return Vec::new();
    }
    // The last TAIL_LINES lines, as pieces (the first one cut at a line start).
    let mut lines = 0;
    let mut out = Vec::new();
    for p in attempt.iter().rev() {
        let n = p.text.matches('\n').count();
        if lines + n <= TAIL_LINES {
            lines += n;
            out.push((*p).clone());
            continue;
        }
        let want = TAIL_LINES - lines;
        let cut = p
            .text
            .rmatch_indices('\n')
            .nth(want)
            .map_or(0, |(i, _)| i + 1);
        out.push(Piece {
            text: p.text[cut..].to_owned(),
            ..(*p).clone()
        });
        break;
    }
    out.reverse();
    out
}

/// A `<pre>` of pieces, each a span with its stream's class (terminal colours as classes).
pub(super) fn pre(id: &str, pieces: &[Piece], src: Option<(&str, &str)>) -> Markup {
    let mut style = ansi::Style::default();
    let spans = html! {
        @for p in pieces { span class=(p.class) { (ansi::render(&p.text, &mut style)) } }
    };
    html! {
        @match src {
            // A box that scrolls: focusable, so keyboards can scroll it too.
            Some((src, after)) => pre.log id=(id) data-src=(src) data-after=(after) tabindex="0" { (spans) },
            None => pre.log id=(id) tabindex="0" { (spans) },
        }
    }
}

/// The panel's tools: the "following" switch (on for a running node; scrolling up turns it
/// off) and the link to the whole output.
pub(super) fn tools(log_id: &str, follow: bool, full: &str) -> Markup {
    html! {
        div.log-tools {
            label.follow { input.follow type="checkbox" data-log=(log_id) checked[follow]; " following (scroll up to pause)" }
            " " a.full-log href=(full) { "whole output, numbered and searchable" }
        }
    }
}

/// The node panels of the run page.
/// (id, type, output) of each panel.
pub(super) type Outputs = [(String, String, Result<NodeOutput, ConsoleError>)];

pub(super) fn section(info: &RunInfo, run_url: &str, outputs: &Outputs) -> Markup {
    html! {
        section #logs-section {
            h2 #logs { "Node output" }
            @if outputs.is_empty() {
                p.hint #logs-none { "No node of this run prints output (sandbox_run and code_delivery nodes do)." }
            } @else {
                p.hint { "What sandbox programs print appears as they print it; code delivery commands appear with their output once each has finished. Each attempt keeps the last part of its output." }
            }
            @for (id, kind, out) in outputs {
                @let node = info.nodes.iter().find(|n| n.id == *id);
                @let kind = kind.as_str();
                @let state = node.map_or(0, |n| n.state);
                @let open = state != NodeState::Succeeded as i32 && state != NodeState::Skipped as i32;
                @let src = format!("{run_url}/nodes/{}/logs", page::seg(id));
                details.node-panel id=(format!("panel-{id}")) data-node=(id) open[open] {
                    summary { @if node.is_some() { "Node " } @else { "Map item " } code { (id) } " (" (kind) ")" }
                    div.panel-head id=(format!("panel-head-{id}")) data-live {
                        @if let Some(n) = node {
                            p { (page::badge(page::node_state_name(n.state))) " attempts: " (n.attempts) }
                            @if state == NodeState::Failed as i32 {
                                div.failure {
                                    p.error { "Error: " (n.error) }
                                    @if let Ok(o) = out {
                                        @let step = failing_step(kind, &o.pieces);
                                        @if !step.is_empty() {
                                            p.hint { @if kind == "code_delivery" { "The command that failed, with its output:" } @else { "The end of its output:" } }
                                            (pre(&format!("failing-{id}"), &step, None))
                                        }
                                    }
                                }
                            }
                        }
                    }
                    @match out {
                        Ok(o) => {
                            (tools(&format!("log-{id}"), node.is_none_or(|n| n.state == NodeState::Running as i32), &logview::log_url(run_url, id)))
                            (pre(&format!("log-{id}"), &o.pieces, Some((&src, &o.after))))
                            p.hint.log-status id=(format!("log-status-{id}")) {
                                @if o.pieces.is_empty() { "No output yet." } @else { "Output as of the page's loading." }
                            }
                        }
                        Err(e) => p.error { (e.to_string()) },
                    }
                }
            }
        }
    }
}

#[derive(Deserialize)]
pub(super) struct LogsQuery {
    /// `<attempt>.<seq>` of the last chunk the page has.
    #[serde(default)]
    after: Option<String>,
}

fn position(s: &str) -> Option<(u32, u64)> {
    let (a, q) = s.trim().split_once('.')?;
    Some((a.parse().ok()?, q.parse().ok()?))
}

/// The open watch, the text decoder and the shutdown signal; None once the stream has ended.
type Watch = Option<(Streaming<LogChunk>, Utf8, CancellationToken)>;

/// The live output of one node: WatchLogs in follow mode as server-sent events.
pub(super) async fn stream(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run, node)): Path<(String, String, String)>,
    Query(q): Query<LogsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ConsoleError> {
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(position);
    let (after_attempt, after_seq) = resume
        .or_else(|| q.after.as_deref().and_then(position))
        .unwrap_or((0, 0));
    let req = WatchLogsRequest {
        project_id: project,
        run_id: run,
        node_id: node.clone(),
        follow: true,
        after_attempt,
        after_seq,
    };
    let watch = console
        .call(
            &format!("watching the output of node {node}"),
            console.orchestrator(&visitor).watch_logs(req),
        )
        .await?;
    let state: Watch = Some((watch, Utf8::default(), console.inner.stopping.clone()));
    let events = futures::stream::unfold(state, |state| async move {
        let (mut watch, mut utf8, stopping) = state?;
        let next = tokio::select! {
            _ = stopping.cancelled() => return Some((Ok(end("the console is shutting down")), None)),
            next = watch.message() => next,
        };
        match next {
            Ok(Some(c)) => {
                let body = json!({
                    "attempt": c.attempt,
                    "seq": c.seq,
                    "end": c.end,
                    "pieces": pieces(&c, &mut utf8).iter().map(|p| json!({"class": p.class, "text": p.text})).collect::<Vec<_>>(),
                });
                let msg = SseEvent::default()
                    .event("log")
                    .id(format!("{}.{}", c.attempt, c.seq))
                    .json_data(body)
                    .unwrap_or_else(|_| SseEvent::default().event("log").data("{}"));
                Some((Ok(msg), Some((watch, utf8, stopping))))
            }
            // Everything of a finished run was sent: the page stops listening.
            Ok(None) => Some((Ok(end("the run has ended")), None)),
            // A watch that failed (an orchestrator restarting): the browser reconnects from
            // the last id it saw.
            Err(status) => {
                tracing::info!(message = status.message(), "a node's output stream ended");
                None
            }
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(attempt: u32, seq: u64, stream: LogStream, data: &[u8]) -> LogChunk {
        LogChunk {
            node_id: "n".into(),
            attempt,
            seq,
            stream: stream as i32,
            data: data.to_vec().into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_character_cut_between_chunks_is_shown_whole() {
        let mut u = Utf8::default();
        let e = "é".as_bytes();
        assert_eq!(u.text(&chunk(1, 1, LogStream::Stdout, &[b'a', e[0]])), "a");
        assert_eq!(u.text(&chunk(1, 2, LogStream::Stdout, &[e[1], b'b'])), "éb");
        assert_eq!(u.text(&chunk(1, 3, LogStream::Stdout, &[0xff])), "\u{fffd}");
    }

    #[test]
    fn the_failing_command_of_code_delivery_is_picked() {
        let p = |class: &'static str, text: &str| Piece {
            attempt: 1,
            class,
            text: text.into(),
        };
        let all = vec![
            p("step", "$ make\n"),
            p("stdout", "ok\n"),
            p("step", "[exit 0]\n"),
            p("step", "$ cargo test\n"),
            p("stderr", "boom\n"),
            p("step", "[exit 101]\n"),
            p("step", "$ ls\n"),
            p("step", "[exit 0]\n"),
        ];
        let step = failing_step("code_delivery", &all);
        assert_eq!(step, all[3..6].to_vec());
        let tail = failing_step("sandbox_run", &[p("stdout", &"x\n".repeat(100))]);
        assert_eq!(tail[0].text.matches('\n').count(), TAIL_LINES);
    }
}
