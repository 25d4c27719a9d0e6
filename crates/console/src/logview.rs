//! A node's whole output, one attempt at a time, like a terminal's scrollback: read from the
//! run directory (`logs/<node>/<attempt>.jsonl`, written when the attempt ends) or, while the
//! attempt runs, from the orchestrator (WatchLogs). Numbered lines, paged; a search, a
//! stdout / stderr filter, terminal colours rendered safely (ansi.rs) and a plain-text download.

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine as _;
use maud::html;
use serde::Deserialize;
use serde_json::Value;

use super::page::{self, layout};
use super::session::Visitor;
use super::{ansi, files, history, logs, run};
use super::{Console, ConsoleError};

/// Lines per page.
pub(super) const PAGE_LINES: usize = 1000;
/// Largest stored log read (an attempt keeps at most `log_retain_bytes`, 1 MiB by default;
/// its JSON lines are somewhat larger).
const LOG_FILE_LIMIT: u64 = 16 << 20;
/// Most bytes of a running attempt read from the orchestrator.
const LIVE_LIMIT: usize = 16 << 20;

#[derive(Default, Deserialize)]
pub(super) struct LogQuery {
    /// Attempt (default: the last).
    #[serde(default)]
    attempt: Option<u32>,
    /// Text to find (case-insensitive; lines that contain it).
    #[serde(default)]
    q: String,
    /// `stdout`, `stderr` or empty (all).
    #[serde(default)]
    stream: String,
    /// Page, from 1 (default: the last).
    #[serde(default)]
    page: Option<usize>,
    /// `text`: the attempt's output as a plain-text download.
    #[serde(default)]
    format: String,
}

/// One line of output: its number in the attempt, its stream, its text (escapes kept).
pub(super) struct Line {
    pub number: usize,
    pub class: &'static str,
    pub text: String,
}

/// Pieces (stream class, text) as numbered lines; a line written in pieces of two streams
/// takes the first one's.
pub(super) fn lines(pieces: &[(&'static str, String)]) -> Vec<Line> {
    let mut out: Vec<Line> = Vec::new();
    // The last line has not ended yet: the next text continues it.
    let mut open = false;
    for (class, text) in pieces {
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let (part, ended) = match rest.find('\n') {
                Some(i) => {
                    let part = &rest[..i];
                    rest = &rest[i + 1..];
                    (part, true)
                }
                None => (std::mem::take(&mut rest), false),
            };
            match out.last_mut() {
                Some(l) if open => l.text.push_str(part),
                _ => out.push(Line {
                    number: out.len() + 1,
                    class,
                    text: part.to_owned(),
                }),
            }
            open = !ended;
        }
    }
    out
}

/// The stored attempt as (stream class, text) pieces, consecutive chunks of one stream joined
/// (a character cut between two chunks is whole again); None when not stored (yet).
fn stored_pieces(text: &str) -> Vec<(&'static str, String)> {
    let mut parts: Vec<(&'static str, Vec<u8>)> = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let class = match v.get("stream").and_then(Value::as_str) {
            Some("stdout") => "stdout",
            Some("stderr") => "stderr",
            Some("step") => "step",
            _ => "note",
        };
        let bytes = match (v.get("text"), v.get("base64")) {
            (Some(Value::String(t)), _) => t.as_bytes().to_vec(),
            (_, Some(Value::String(b))) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        if let Some(end) = v.get("end") {
            let text = |k: &str| end.get(k).and_then(Value::as_str).unwrap_or_default();
            let mut l = format!("[attempt ended: {}", text("outcome"));
            if !text("error").is_empty() {
                l.push_str(": ");
                l.push_str(text("error"));
            }
            l.push_str("]\n");
            parts.push(("note", l.into_bytes()));
            continue;
        }
        match parts.last_mut() {
            Some((c, b)) if *c == class => b.extend_from_slice(&bytes),
            _ => parts.push((class, bytes)),
        }
    }
    parts
        .into_iter()
        .map(|(c, b)| (c, String::from_utf8_lossy(&b).into_owned()))
        .collect()
}

/// The attempts of `node` the events record (node.started), at least 1.
fn attempts(events: &[cairn_proto::v1::Event], node: &str) -> u32 {
    events
        .iter()
        .filter(|e| e.node_id == node && e.r#type == "node.started")
        .count()
        .max(1) as u32
}

pub(super) fn log_url(run_url: &str, node: &str) -> String {
    format!("{run_url}/nodes/{}/log", page::seg(node))
}

pub(super) async fn view(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run_id, node)): Path<(String, String, String)>,
    Query(q): Query<LogQuery>,
) -> Result<Response, ConsoleError> {
    let dir = run::run_dir(None, &run_id);
    let events = history::read(&console, &project, &run_id).await?;
    let count = attempts(&events.events, &node);
    let attempt = q.attempt.unwrap_or(count).clamp(1, count.max(1));
    let path = format!("{dir}/logs/{node}/{attempt}.jsonl");
    let stored = files::read(&console, &project, &path, LOG_FILE_LIMIT).await?;
    let (pieces, source) = match &stored {
        Some(r) => (stored_pieces(&String::from_utf8_lossy(&r.bytes)), "stored"),
        None => {
            // Not stored yet: the attempt runs (or its output is held in memory).
            let out = logs::load(&console, &visitor, &project, &run_id, &node, LIVE_LIMIT).await?;
            (
                out.pieces
                    .into_iter()
                    .filter(|p| p.attempt == attempt)
                    .map(|p| (p.class, p.text))
                    .collect(),
                "live",
            )
        }
    };
    if q.format == "text" {
        let text: String = pieces.iter().map(|(_, t)| t.as_str()).collect();
        let name = format!(
            "{}-attempt-{attempt}.log",
            node.replace(
                |c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '.',
                "_"
            )
        );
        return Ok((
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_owned()),
                (
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{name}\""),
                ),
            ],
            text,
        )
            .into_response());
    }
    let all = lines(&pieces);
    let needle = q.q.trim().to_lowercase();
    // Colours carry from line to line: the style of each line is worked out over all of them.
    let mut style = ansi::Style::default();
    let mut styled: Vec<(&Line, ansi::Style)> = Vec::with_capacity(all.len());
    for l in &all {
        styled.push((l, style));
        ansi::runs(&l.text, &mut style);
    }
    let shown: Vec<&(&Line, ansi::Style)> = styled
        .iter()
        .filter(|(l, _)| match q.stream.as_str() {
            "stdout" | "stderr" => l.class == q.stream,
            _ => true,
        })
        .filter(|(l, _)| needle.is_empty() || ansi::strip(&l.text).to_lowercase().contains(&needle))
        .collect();
    let pages = shown.len().div_ceil(PAGE_LINES).max(1);
    let page_no = q.page.unwrap_or(pages).clamp(1, pages);
    let window = &shown
        [((page_no - 1) * PAGE_LINES).min(shown.len())..(page_no * PAGE_LINES).min(shown.len())];
    let run_url = page::run_url(&project, &run_id);
    let here = log_url(&run_url, &node);
    let link = |attempt: u32, page: Option<usize>| {
        let mut u = format!("{here}?attempt={attempt}");
        if !q.q.trim().is_empty() {
            u.push_str(&format!("&q={}", page::qv(q.q.trim())));
        }
        if !q.stream.is_empty() {
            u.push_str(&format!("&stream={}", page::qv(&q.stream)));
        }
        if let Some(p) = page {
            u.push_str(&format!("&page={p}"));
        }
        u
    };
    let title = format!("Output of {node}, attempt {attempt}");
    let body = html! {
        p.meta { a href=(run_url) { "run " (run_id) } " · " a href=(format!("{run_url}/nodes/{}", page::seg(&node))) { "node " (node) } }
        h1 { "Output of " code { (node) } }
        nav.attempts aria-label="Attempts" {
            "Attempt: "
            @for a in 1..=count {
                @if a == attempt { strong aria-current="page" { (a) } } @else { a href=(link(a, None)) { (a) } }
                " "
            }
        }
        form.filters #log-search method="get" action=(here) role="search" {
            input type="hidden" name="attempt" value=(attempt);
            label.grow { "Find" input type="search" name="q" value=(q.q) placeholder="text in a line"; }
            label { "Stream"
                select name="stream" {
                    option value="" selected[q.stream.is_empty()] { "all" }
                    option value="stdout" selected[q.stream == "stdout"] { "stdout" }
                    option value="stderr" selected[q.stream == "stderr"] { "stderr" }
                }
            }
            button type="submit" { "Show" }
        }
        p.hint #log-summary {
            (all.len()) " lines"
            @if shown.len() != all.len() { ", " (shown.len()) " shown" }
            @if source == "live" { " (the attempt is running or not stored yet: reload for more)" }
            " · " a #log-download href=(format!("{here}?attempt={attempt}&format=text")) download { "download as text" }
            @if stored.is_some() { " · " a href=(page::download_url(&project, &path)) { (format!("{attempt}.jsonl")) } }
        }
        @if pages > 1 {
            nav.pages aria-label="Pages of output" {
                @if page_no > 1 { a href=(link(attempt, Some(page_no - 1))) { "Earlier lines" } }
                span { "page " (page_no) " of " (pages) }
                @if page_no < pages { a href=(link(attempt, Some(page_no + 1))) { "Later lines" } }
            }
        }
        @if window.is_empty() {
            p.hint #log-empty { @if all.is_empty() { "No output." } @else { "No line matches." } }
        } @else {
            div.scroll.logview tabindex="0" role="region" aria-label="Output lines" {
                table.logview #log-lines {
                    tbody {
                        @for (l, st) in window {
                            @let mut s = *st;
                            tr class=(l.class) id=(format!("L{}", l.number)) {
                                td.ln { a href=(format!("#L{}", l.number)) { (l.number) } }
                                td.text { (ansi::render(&l.text, &mut s)) }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(layout(&title, Some(&visitor), None, body).into_response())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pieces_become_numbered_lines() {
        let l = lines(&[
            ("stdout", "one\ntw".into()),
            ("stderr", "o\nthree\n".into()),
            ("stdout", "four".into()),
        ]);
        let got: Vec<(usize, &str, &str)> = l
            .iter()
            .map(|l| (l.number, l.class, l.text.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, "stdout", "one"),
                (2, "stdout", "two"),
                (3, "stderr", "three"),
                (4, "stdout", "four")
            ]
        );
    }

    #[test]
    fn stored_lines_are_read_back() {
        let text = "{\"seq\":1,\"offset\":0,\"stream\":\"stdout\",\"text\":\"h\"}\n{\"seq\":2,\"offset\":1,\"stream\":\"stdout\",\"base64\":\"w6k=\"}\nnot json\n{\"seq\":3,\"offset\":3,\"end\":{\"outcome\":\"failed\",\"error\":\"exit 1\"}}\n";
        let p = stored_pieces(text);
        assert_eq!(p[0], ("stdout", "hé".to_owned()));
        assert_eq!(
            p[1],
            ("note", "[attempt ended: failed: exit 1]\n".to_owned())
        );
    }
}
