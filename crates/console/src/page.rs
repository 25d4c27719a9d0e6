//! The page frame and the small pieces every page uses: the layout, state badges, links into
//! the console, times and durations, and the static stylesheet and script.
//!
//! Templates are `maud` markup, which escapes every interpolated value; `PreEscaped` appears
//! only for the sanitised Markdown renderer's output (markdown.rs). URLs are built here and
//! nowhere else, with every part percent-encoded.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use cairn_proto::v1::{GateState, NodeState, TaskState};
use maud::{html, Markup, DOCTYPE};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::session::{Flash, Visitor};

/// A rendered page.
pub(super) struct Html(pub Markup);

impl IntoResponse for Html {
    fn into_response(self) -> Response {
        (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            self.0.into_string(),
        )
            .into_response()
    }
}

/// Everything but unreserved characters is encoded in a path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');
/// Query values keep `/` readable.
const QUERY_VALUE: &AsciiSet = &SEGMENT.remove(b'/');

pub(super) fn seg(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

pub(super) fn qv(s: &str) -> String {
    utf8_percent_encode(s, QUERY_VALUE).to_string()
}

pub(super) fn run_url(project: &str, run: &str) -> String {
    format!("/projects/{}/runs/{}", seg(project), seg(run))
}

pub(super) fn runs_url(project: &str, state: Option<&str>) -> String {
    match state {
        Some(s) => format!("/runs?project={}&state={}", qv(project), qv(s)),
        None => format!("/runs?project={}", qv(project)),
    }
}

/// The start-a-run form, for `project` (empty: the visitor names one).
pub(super) fn start_url(project: &str) -> String {
    if project.is_empty() {
        "/start".to_owned()
    } else {
        format!("/start?project={}", qv(project))
    }
}

/// At most `n` characters of `s`, with `…` when cut.
pub(super) fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

pub(super) fn file_url(project: &str, path: &str) -> String {
    format!("/projects/{}/files?path={}", seg(project), qv(path))
}

pub(super) fn download_url(project: &str, path: &str) -> String {
    format!("/projects/{}/download?path={}", seg(project), qv(path))
}

pub(super) fn tree_url(project: &str, prefix: &str) -> String {
    format!("/projects/{}/tree?prefix={}", seg(project), qv(prefix))
}

/// Top-level directories whose paths in free text (gate reasons, errors) become links.
const LINKED_DIRS: [&str; 4] = ["docs/", "workspace/", "graphs/", ".cairn/runs/"];

/// `text` with the project paths in it (words under [`LINKED_DIRS`]) as links to the files.
pub(super) fn linkify(project: &str, text: &str) -> Markup {
    let mut parts: Vec<(bool, &str)> = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let start = rest
            .char_indices()
            .find(|(i, _)| {
                (*i == 0
                    || rest[..*i].ends_with(|c: char| c.is_whitespace() || "(`'\"".contains(c)))
                    && LINKED_DIRS.iter().any(|d| rest[*i..].starts_with(d))
            })
            .map(|(i, _)| i);
        let Some(start) = start else {
            parts.push((false, rest));
            break;
        };
        let len = rest[start..]
            .find(|c: char| c.is_whitespace() || "`'\"()<>".contains(c))
            .unwrap_or(rest.len() - start);
        let path = rest[start..start + len].trim_end_matches(['.', ',', ';', ':', '!', '?']);
        parts.push((false, &rest[..start]));
        parts.push((!path.split('/').any(|p| p == ".."), path));
        rest = &rest[start + path.len()..];
    }
    html! {
        @for (link, t) in parts {
            @if link { a.path href=(file_url(project, t)) { (t) } } @else { (t) }
        }
    }
}

/// The task state names.
pub(super) fn task_state_name(state: i32) -> &'static str {
    match TaskState::try_from(state) {
        Ok(TaskState::Created) => "created",
        Ok(TaskState::Working) => "working",
        Ok(TaskState::InputRequired) => "input-required",
        Ok(TaskState::Completed) => "completed",
        Ok(TaskState::Failed) => "failed",
        Ok(TaskState::Canceled) => "canceled",
        _ => "unknown",
    }
}

pub(super) const TASK_STATES: [(&str, TaskState); 6] = [
    ("created", TaskState::Created),
    ("working", TaskState::Working),
    ("input-required", TaskState::InputRequired),
    ("completed", TaskState::Completed),
    ("failed", TaskState::Failed),
    ("canceled", TaskState::Canceled),
];

pub(super) fn is_final(state: i32) -> bool {
    matches!(
        TaskState::try_from(state),
        Ok(TaskState::Completed | TaskState::Failed | TaskState::Canceled)
    )
}

pub(super) fn gate_state_name(state: i32) -> &'static str {
    match GateState::try_from(state) {
        // Declared, not reached yet: nothing to decide.
        Ok(GateState::Open) => "not reached",
        Ok(GateState::Blocked) => "blocked",
        Ok(GateState::Approved) => "approved",
        Ok(GateState::Rejected) => "rejected",
        Ok(GateState::Canceled) => "canceled",
        _ => "unknown",
    }
}

pub(super) fn node_state_name(state: i32) -> &'static str {
    match NodeState::try_from(state) {
        Ok(NodeState::Pending) => "pending",
        Ok(NodeState::Running) => "running",
        Ok(NodeState::Succeeded) => "succeeded",
        Ok(NodeState::Failed) => "failed",
        Ok(NodeState::Skipped) => "skipped",
        Ok(NodeState::Canceled) => "canceled",
        Ok(NodeState::Blocked) => "blocked",
        _ => "unknown",
    }
}

/// A state word as a badge; the class is chosen from a fixed set, never from the input.
pub(super) fn badge(state: &str) -> Markup {
    let class = match state {
        "completed" | "succeeded" | "approved" | "done" | "written" => "badge ok",
        "failed" | "rejected" | "canceled" => "badge bad",
        "input-required" | "blocked" | "skipped" => "badge wait",
        "working" | "running" => "badge busy",
        _ => "badge",
    };
    html! { span class=(class) { (state) } }
}

pub(super) fn parse_time(t: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(t, &Rfc3339).ok()
}

/// `2026-01-01 10:00:00` from an RFC 3339 time (the text as given when it does not parse).
pub(super) fn when(t: &str) -> String {
    match parse_time(t) {
        Some(_) if t.len() >= 19 => format!("{} {}", &t[..10], &t[11..19]),
        _ => t.to_owned(),
    }
}

/// How long a run took (final) or has been going (not final).
pub(super) fn duration(created: &str, updated: &str, finished: bool) -> String {
    let Some(start) = parse_time(created) else {
        return String::new();
    };
    let end = if finished {
        parse_time(updated)
    } else {
        Some(OffsetDateTime::now_utc())
    };
    let Some(end) = end else { return String::new() };
    let secs = (end - start).whole_seconds().max(0);
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m {:02}s", s / 60, s % 60),
        s => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// Human size of a byte count.
pub(super) fn size(bytes: u64) -> String {
    match bytes {
        b if b < 1024 => format!("{b} B"),
        b if b < 1 << 20 => format!("{:.1} KiB", b as f64 / 1024.0),
        b if b < 1 << 30 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
    }
}

/// The frame of every page: header with navigation and who is logged in, the flash message,
/// then `body`.
pub(super) fn layout(
    title: &str,
    visitor: Option<&Visitor>,
    flash: Option<&Flash>,
    body: Markup,
) -> Html {
    Html(html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · cairn" }
                link rel="icon" type="image/svg+xml" href="/static/favicon.svg";
                link rel="stylesheet" href="/static/console.css";
                script src="/static/console.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to the content" }
                header.top {
                    a.brand href="/runs" { "cairn" }
                    nav aria-label="Console" { a href="/runs" { "Runs" } }
                    @if let Some(v) = visitor {
                        @if v.authenticated {
                            span.who {
                                "signed in as " strong #who { (v.name) }
                                @if let Some(role) = v.role {
                                    " (" span #role { (role.as_str()) } ")"
                                } @else {
                                    " · " a href="/login" { "change name" }
                                }
                                @if v.login_required {
                                    " · "
                                    form.inline method="post" action="/logout" {
                                        input type="hidden" name="csrf" value=(v.csrf);
                                        button.link type="submit" { "log out" }
                                    }
                                }
                            }
                        }
                    }
                }
                main #main tabindex="-1" {
                    @if let Some(f) = flash {
                        p class=(if f.error { "flash error" } else { "flash ok" }) role="status" { (f.text) }
                    }
                    (body)
                }
            }
        }
    })
}

/// The page of an error (no session details: it may be rendered before there is one).
pub(super) fn error_page(status: StatusCode, message: &str) -> Html {
    let title = status.canonical_reason().unwrap_or("Error");
    layout(
        title,
        None,
        None,
        html! {
            h1 { (status.as_u16()) " " (title) }
            p.error #error-message { (message) }
            p { a href="/runs" { "Back to the runs" } }
        },
    )
}

/// Live fetches of a page (header `X-Cairn-Live`) get an `ETag` (a hash of the page); when it
/// matches their `If-None-Match`, the answer is 304 without a body, so a list that did not
/// change costs a few bytes.
pub(super) async fn conditional(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let live =
        req.headers().contains_key("x-cairn-live") && req.method() == axum::http::Method::GET;
    let known = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let res = next.run(req).await;
    let html = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/html"));
    if !live || res.status() != StatusCode::OK || !html {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, PAGE_LIMIT).await else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the page could not be read",
        )
            .into_response();
    };
    let tag = format!("\"{}\"", &cairn_sha256::sha256_hex(&bytes)[..32]);
    if let Ok(v) = header::HeaderValue::from_str(&tag) {
        parts.headers.insert(header::ETAG, v);
    }
    if known.as_deref() == Some(tag.as_str()) {
        parts.status = StatusCode::NOT_MODIFIED;
        parts.headers.remove(header::CONTENT_TYPE);
        return Response::from_parts(parts, axum::body::Body::empty());
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// Largest page a live fetch is compared for.
const PAGE_LIMIT: usize = 64 << 20;

pub(super) async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        include_str!("assets/console.css"),
    )
        .into_response()
}

pub(super) async fn favicon() -> Response {
    (
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CACHE_CONTROL, "max-age=86400"),
        ],
        include_str!("assets/favicon.svg"),
    )
        .into_response()
}

pub(super) async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        include_str!("assets/console.js"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_in_text_become_links() {
        let m = linkify(
            "p",
            "check docs/run-1/draft.md, then (workspace/a<b>.rs) and ../docs/x",
        );
        assert_eq!(
            m.into_string(),
            "check <a class=\"path\" href=\"/projects/p/files?path=docs/run-1/draft.md\">docs/run-1/draft.md</a>, then (<a class=\"path\" href=\"/projects/p/files?path=workspace/a\">workspace/a</a>&lt;b&gt;.rs) and ../docs/x"
        );
        assert_eq!(linkify("p", "no path").into_string(), "no path");
    }
}
