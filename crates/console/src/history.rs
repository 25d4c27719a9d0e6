//! A run's events as the run page shows them: read from the store (ReadEvents), one table row
//! per event with long fields folded (the first 200 characters, the rest behind a click) and
//! JSON values pretty-printed, and the files the run wrote as its events name them.
//!
//! The same row markup is sent with each live event (events.rs), so the page shows an event
//! the same way whether it was there at load time or arrived later.

use std::collections::BTreeMap;

use cairn_proto::v1::{Event, Level, ReadEventsRequest};
use maud::{html, Markup};
use serde_json::Value;

use super::page;
use super::{Console, ConsoleError};

/// Most events read for a page (the table says so when a run has more).
pub(super) const MAX_EVENTS: u64 = 10_000;
/// Characters of a field shown before it is folded.
pub(super) const FOLD_CHARS: usize = 200;

/// The run's events, oldest first; `more` when the store holds more than [`MAX_EVENTS`].
pub(super) struct History {
    pub events: Vec<Event>,
    pub more: bool,
}

impl History {
    /// Sequence number of the newest event read (0 without events).
    pub fn last_seq(&self) -> u64 {
        self.events.last().map_or(0, |e| e.seq)
    }
}

/// Reads the run's events from the store, under the console's deadline.
pub(super) async fn read(
    console: &Console,
    project: &str,
    run: &str,
) -> Result<History, ConsoleError> {
    let req = ReadEventsRequest {
        project_id: project.to_owned(),
        run_id: run.to_owned(),
        from_seq: 1,
        follow: false,
        limit: MAX_EVENTS + 1,
    };
    let what = format!("reading the events of run {run}");
    let read = async {
        let mut events = Vec::new();
        let mut stream = console.store().read_events(req).await?.into_inner();
        while let Some(e) = stream.message().await? {
            events.push(e);
        }
        Ok::<_, tonic::Status>(events)
    };
    let mut events = match tokio::time::timeout(console.rpc_timeout(), read).await {
        Ok(Ok(events)) => events,
        Ok(Err(status)) => return Err(ConsoleError::rpc(&what, status)),
        Err(_) => {
            return Err(ConsoleError::Timeout {
                what,
                secs: console.config().rpc_timeout_s,
            })
        }
    };
    let more = events.len() as u64 > MAX_EVENTS;
    events.truncate(MAX_EVENTS as usize);
    Ok(History { events, more })
}

pub(super) fn level_name(level: i32) -> &'static str {
    match Level::try_from(level) {
        Ok(Level::Debug) => "debug",
        Ok(Level::Warning) => "warning",
        Ok(Level::Error) => "error",
        _ => "info",
    }
}

/// The event's fields (its `data_json`; text that is not JSON is one string).
pub(super) fn data(e: &Event) -> Value {
    serde_json::from_str::<Value>(&e.data_json)
        .unwrap_or_else(|_| Value::String(e.data_json.clone()))
}

/// The level as a class from a fixed set (never from the input).
fn level_class(level: i32) -> &'static str {
    match level_name(level) {
        "debug" => "level-debug",
        "warning" => "level-warning",
        "error" => "level-error",
        _ => "level-info",
    }
}

/// One row of the events table; paths in its fields link to the files of `project`.
pub(super) fn row(project: &str, e: &Event) -> Markup {
    let ts = e.ts.as_str();
    // The time of day is enough in the table; the whole timestamp is the cell's tooltip.
    let time = ts.get(11..23).unwrap_or(ts).trim_end_matches('Z');
    html! {
        tr id=(format!("ev-{}", e.seq)) class=(level_class(e.level)) data-type=(e.r#type) {
            td.num data-label="seq" { (e.seq) }
            td.nowrap data-label="time" title=(ts) { (time) }
            td.nowrap data-label="type" { (e.r#type) }
            td.nowrap data-label="node" { (e.node_id) }
            td.details data-label="details" { (details(project, &data(e))) }
        }
    }
}

/// The fields of an event as `key: value` items, long values folded, paths as links.
fn details(project: &str, data: &Value) -> Markup {
    match data {
        Value::Object(m) => html! {
            @for (i, (k, v)) in m.iter().enumerate() {
                @if i > 0 { " · " }
                span.field { (k) ": " (field(project, k, v)) }
            }
        },
        other => value(other),
    }
}

/// Fields that name a file of the project (by its project-relative path).
fn names_a_file(key: &str) -> bool {
    key == "path" || key == "file" || key.ends_with("_path")
}

/// A project-relative path worth a link (the store still checks it when it is opened).
fn linkable(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 1024
        && !path.starts_with('/')
        && !path.contains("://")
        && !path.split('/').any(|p| p == "..")
        && !path.chars().any(char::is_whitespace)
}

/// A field's value: a path as a link to the file, an inline cassette or other base64 blob
/// as its size only, anything else as [`value`].
fn field(project: &str, key: &str, v: &Value) -> Markup {
    match v {
        Value::String(s) if names_a_file(key) && linkable(s) => {
            html! { a.path href=(page::file_url(project, s)) { (s) } }
        }
        Value::String(s) if blob(s).is_some() => {
            let (what, bytes) = blob(s).unwrap_or_default();
            html! { span.hint.blob { (what) " (" (page::size(bytes)) ", not shown)" } }
        }
        Value::Array(a) if names_a_file(key.trim_end_matches('s')) || key == "written_files" => {
            html! {
                @for (i, p) in a.iter().enumerate() {
                    @if i > 0 { ", " }
                    @let path = p.as_str().or_else(|| p.get("path").and_then(Value::as_str)).filter(|x| linkable(x));
                    @if let Some(path) = path {
                        a.path href=(page::file_url(project, path)) { (path) }
                    } @else {
                        (value(p))
                    }
                }
            }
        }
        other => value(other),
    }
}

/// An inline cassette (`replay-inline:<base64>`) or a long base64 text: what it is and its
/// size in bytes.
fn blob(s: &str) -> Option<(&'static str, u64)> {
    if let Some(b) = s.strip_prefix("replay-inline:") {
        return Some(("replay-inline: an inline cassette", b.len() as u64 * 3 / 4));
    }
    let base64 = s.len() > FOLD_CHARS
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=' | b'\n' | b'\r'));
    base64.then_some(("base64 data", s.len() as u64 * 3 / 4))
}

/// One value: strings as they are, JSON compact when short and pretty when folded open.
fn value(v: &Value) -> Markup {
    let (short, full) = match v {
        Value::String(s) => (s.clone(), s.clone()),
        other => (
            other.to_string(),
            serde_json::to_string_pretty(other).unwrap_or_else(|_| other.to_string()),
        ),
    };
    if short.chars().count() <= FOLD_CHARS && !short.contains('\n') {
        return html! { (short) };
    }
    let head: String = short.chars().take(FOLD_CHARS).collect();
    let head = head.lines().next().unwrap_or_default().to_owned();
    html! {
        details.fold {
            summary { (head) "…" small.hint { " (" (page::size(full.len() as u64)) ")" } }
            pre.fold { (full) }
        }
    }
}

/// The events table, every event read.
pub(super) fn table(project: &str, history: &Result<History, ConsoleError>, src: &str) -> Markup {
    let (events, last, more) = match history {
        Ok(h) => (h.events.as_slice(), h.last_seq(), h.more),
        Err(_) => (&[][..], 0, false),
    };
    html! {
        @if let Err(e) = history { p.error { (e.to_string()) } }
        @if more { p.hint { "The first " (MAX_EVENTS) " events are shown; events.jsonl has them all." } }
        table.events #event-table data-src=(format!("{src}?from={}", last + 1)) data-seq=(last) {
            thead { tr { th.num { "seq" } th { "time" } th { "type" } th { "node" } th { "details" } } }
            tbody {
                @for e in events { (row(project, e)) }
            }
        }
    }
}

/// A file the run wrote, as its newest event about it says.
pub(super) struct Written {
    pub path: String,
    pub bytes: Option<u64>,
    pub node: String,
    pub seq: u64,
    pub how: &'static str,
}

/// The project files this run wrote: `artifact.written`, written ingest blocks and the files a
/// sandbox run wrote; newest event per path, sorted by path.
pub(super) fn written_files(events: &[Event]) -> Vec<Written> {
    let mut out: BTreeMap<String, Written> = BTreeMap::new();
    let mut add = |path: &str, bytes: Option<u64>, e: &Event, how: &'static str| {
        if path.is_empty() {
            return;
        }
        out.insert(
            path.to_owned(),
            Written {
                path: path.to_owned(),
                bytes,
                node: e.node_id.clone(),
                seq: e.seq,
                how,
            },
        );
    };
    for e in events {
        let d = data(e);
        let text = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or_default();
        let bytes = d.get("bytes").and_then(Value::as_u64);
        match e.r#type.as_str() {
            "artifact.written" => add(text("path"), bytes, e, "written"),
            "ingest.block.written" => add(text("path"), bytes, e, "ingested"),
            "sandbox_complete" => {
                for f in d
                    .get("written_files")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let path = match f {
                        Value::String(s) => s.as_str(),
                        other => other
                            .get("path")
                            .and_then(Value::as_str)
                            .unwrap_or_default(),
                    };
                    add(path, None, e, "sandbox");
                }
            }
            _ => {}
        }
    }
    out.into_values().collect()
}

/// The table of the files this run wrote.
pub(super) fn written_table(project: &str, files: &[Written]) -> Markup {
    html! {
        @if files.is_empty() {
            p.hint #run-files-none { "This run has written no project files yet." }
        } @else {
            table.files #run-files {
                thead { tr { th { "Path" } th.num { "Size" } th { "How" } th { "Node" } th.num { "Event" } } }
                tbody {
                    @for f in files {
                        tr {
                            td data-label="Path" { a.file href=(page::file_url(project, &f.path)) { (f.path) } }
                            td.num data-label="Size" { @if let Some(b) = f.bytes { (page::size(b)) } }
                            td data-label="How" { (f.how) }
                            td data-label="Node" { code { (f.node) } }
                            td.num data-label="Event" { a href=(format!("#ev-{}", f.seq)) { (f.seq) } }
                        }
                    }
                }
            }
        }
    }
}
