//! The run page: state and milestones (GetRun and task.yaml), the roster, gates with their
//! Approve / Reject form, the live event stream, human-notes.md with a form to add a note, the
//! context manifest editor, the run's artifacts, the ingest manifests, cancel and rework.
//! Everything is read through the orchestrator and the store at each request.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use cairn_proto::v1::{GateState, GetRunRequest, ReadEventsRequest, RunInfo};
use maud::{html, Markup};
use serde_json::Value;

use super::files::{self, Read};
use super::ingest;
use super::markdown;
use super::page::{self, layout, Html};
use super::session::{Flash, Visitor};
use super::{Console, ConsoleError};
use cairn_server::roles::Rpc;

/// Files listed per area on the run page (the directory browser has the rest).
const FILES_PER_AREA: u32 = 100;
/// Largest task.yaml / human-notes.md / context manifest read for the page.
const DOC_LIMIT: u64 = 1 << 20;

/// What a person typed into a form that was refused, shown again instead of the stored text.
#[derive(Default)]
pub(super) struct Drafts {
    pub note: Option<String>,
    pub context: Option<String>,
    /// (gate id, note)
    pub gate_note: Option<(String, String)>,
    pub rework_note: Option<String>,
    pub cancel_reason: Option<String>,
}

pub(super) async fn page(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run)): Path<(String, String)>,
) -> Result<Response, ConsoleError> {
    let flash = console.sessions().take_flash(&visitor.session_id);
    Ok(
        render(&console, &visitor, &project, &run, flash, Drafts::default())
            .await?
            .into_response(),
    )
}

/// The run's directory (the orchestrator's `run_dir`, or its known layout).
pub(super) fn run_dir(info: Option<&RunInfo>, run: &str) -> String {
    match info {
        Some(i) if !i.run_dir.is_empty() => i.run_dir.clone(),
        _ => format!(".cairn/runs/{run}"),
    }
}

/// Most events read to find the newest one (beyond task.yaml's `events_seq`).
const MAX_TAIL_EVENTS: u64 = 10_000;

/// Sequence number of the run's newest event, read from the store after `from` (task.yaml's
/// `events_seq`, which may lag a little); `from` when the store cannot say.
async fn last_event_seq(console: &Console, project: &str, run: &str, from: u64) -> u64 {
    let req = ReadEventsRequest {
        project_id: project.to_owned(),
        run_id: run.to_owned(),
        from_seq: from + 1,
        follow: false,
        limit: MAX_TAIL_EVENTS,
    };
    let read = async {
        let mut last = from;
        let mut stream = console.store().read_events(req).await?.into_inner();
        while let Some(e) = stream.message().await? {
            last = last.max(e.seq);
        }
        Ok::<u64, tonic::Status>(last)
    };
    match tokio::time::timeout(console.rpc_timeout(), read).await {
        Ok(Ok(last)) => last,
        _ => from,
    }
}

type Listing = Result<(Vec<cairn_proto::v1::FileInfo>, String), ConsoleError>;

pub(super) async fn render(
    console: &Console,
    visitor: &Visitor,
    project: &str,
    run: &str,
    flash: Option<Flash>,
    drafts: Drafts,
) -> Result<Html, ConsoleError> {
    let dir = run_dir(None, run);
    // task.yaml first: its `events_seq` lets the page learn cheaply which event it shows the
    // run as of (the browser applies only later events to the state it displays).
    let task = files::read(console, project, &format!("{dir}/task.yaml"), DOC_LIMIT).await;
    let task_doc: Result<Option<Value>, String> = match &task {
        Ok(Some(r)) => match r.text() {
            Some(t) => serde_saphyr::from_str::<Value>(t)
                .map(Some)
                .map_err(|e| format!("task.yaml does not parse: {e}")),
            None => Err("task.yaml is not text".into()),
        },
        Ok(None) => Ok(None),
        Err(e) => Err(e.to_string()),
    };
    let snapshot_seq = task_doc
        .as_ref()
        .ok()
        .and_then(|v| v.as_ref())
        .and_then(|t| t.get("events_seq"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let events_seq = last_event_seq(console, project, run, snapshot_seq).await;

    let (notes_path, context_path) = (
        format!("{dir}/shared/human-notes.md"),
        format!("{dir}/shared/context-manifest.yaml"),
    );
    let what = format!("reading run {run}");
    let mut orchestrator = console.orchestrator(visitor);
    let get = console.call(
        &what,
        orchestrator.get_run(GetRunRequest {
            project_id: project.to_owned(),
            run_id: run.to_owned(),
        }),
    );
    let (info, notes, context, docs, workspace, records, manifests) = tokio::join!(
        get,
        files::read(console, project, &notes_path, DOC_LIMIT),
        files::read(console, project, &context_path, DOC_LIMIT),
        files::list(console, project, "docs", true, FILES_PER_AREA, ""),
        files::list(console, project, "workspace", true, FILES_PER_AREA, ""),
        files::list(console, project, &dir, true, FILES_PER_AREA * 2, ""),
        ingest::load(console, project, &dir),
    );
    let info = info?;
    let state = page::task_state_name(info.state);
    let title = if info.title.is_empty() {
        info.run_id.clone()
    } else {
        info.title.clone()
    };
    let run_url = page::run_url(project, run);
    let body = html! {
        div.runhead {
            h1 #run-title { (title) }
            span #run-state-wrap { span #run-state data-state=(state) { (page::badge(state)) } }
        }
        p.meta {
            "run " code #run-id { (info.run_id) } " · project " a href=(page::runs_url(project, None)) { (project) }
            " · started " (page::when(&info.created_at)) " · updated " (page::when(&info.updated_at))
            " · " (page::duration(&info.created_at, &info.updated_at, page::is_final(info.state)))
            " · " a href=(page::file_url(project, &format!("{dir}/README.md"))) { "README.md" }
            " · " a href=(page::file_url(project, &format!("{dir}/task.yaml"))) { "task.yaml" }
        }
        @if !info.error.is_empty() {
            p.error #run-error { "Why it stopped: " (info.error) }
        }
        nav.sections {
            a href="#gates" { "Gates" } a href="#milestones" { "Milestones" } a href="#events" { "Events" }
            a href="#notes" { "Notes" } a href="#context" { "Context" } a href="#artifacts" { "Artifacts" }
            a href="#ingest" { "Ingest" } a href="#control" { "Cancel / rework" }
        }
        (gates(&info, visitor, &run_url, &drafts))
        (milestones(&info, &task_doc))
        section #events-section {
            h2 #events { "Events" }
            p.hint #events-status { "Connecting to the event stream…" }
            noscript { p { "The live stream needs JavaScript; " a href=(page::file_url(project, &format!("{dir}/events.jsonl"))) { "events.jsonl" } " has every event." } }
            table.events #event-table data-src=(format!("{run_url}/events")) data-seq=(events_seq) {
                thead { tr { th.num { "seq" } th { "time" } th { "type" } th { "node" } th { "details" } } }
                tbody {}
            }
        }
        (notes_section(project, &dir, &notes, visitor, &run_url, &drafts))
        (context_section(&context, visitor, &run_url, &drafts))
        section {
            h2 #artifacts { "Artifacts" }
            (area(project, "Run records", &dir, &records))
            (area(project, "Documents", "docs", &docs))
            (area(project, "Workspace", "workspace", &workspace))
        }
        section {
            h2 #ingest { "Ingest" }
            @match &manifests {
                Ok(m) => (ingest::render(project, m)),
                Err(e) => p.error { (e.to_string()) },
            }
        }
        (control(&info, visitor, &run_url, &drafts))
    };
    Ok(layout(&title, Some(visitor), flash.as_ref(), body))
}

fn gates(info: &RunInfo, visitor: &Visitor, run_url: &str, drafts: &Drafts) -> Markup {
    html! {
        section {
            h2 #gates { "Gates" }
            @if info.gates.is_empty() {
                p.hint { "This run has no gates." }
            }
            @for g in &info.gates {
                div.gate id=(format!("gate-{}", g.id)) {
                    h3 { "Gate " code { (g.id) } " " (page::badge(page::gate_state_name(g.state))) }
                    @if !g.reason.is_empty() { p.reason { (g.reason) } }
                    @if !g.decided_by.is_empty() {
                        p.decision {
                            (page::gate_state_name(g.state)) " by " strong { (g.decided_by) }
                            @if !g.decided_at.is_empty() { " at " (page::when(&g.decided_at)) }
                            @if !g.note.is_empty() { ": " q.note { (g.note) } }
                        }
                    }
                    @if g.state == GateState::Blocked as i32 && visitor.may(Rpc::ApproveGate) {
                        @let gate_url = format!("{run_url}/gates/{}", page::seg(&g.id));
                        @let draft = drafts.gate_note.as_ref().filter(|(id, _)| *id == g.id).map(|(_, n)| n.as_str()).unwrap_or("");
                        form.gate method="post" action=(format!("{gate_url}/approve")) {
                            input type="hidden" name="csrf" value=(visitor.csrf);
                            label { "Note (appended to human-notes.md, recorded with your decision)"
                                textarea name="note" rows="3" { (draft) }
                            }
                            div.buttons {
                                button.approve type="submit" { "Approve" }
                                button.reject type="submit" formaction=(format!("{gate_url}/reject")) { "Reject" }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn text_of(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// One row of the milestones table.
struct Milestone {
    id: String,
    title: String,
    kind: String,
    state: String,
    attempts: String,
    detail: String,
    error: String,
}

/// Milestones: the orchestrator's live node states, with titles and progress from task.yaml
/// (a snapshot that may lag); task.yaml alone when the orchestrator lists no nodes.
fn milestone_rows(info: &RunInfo, from_task: Option<&Vec<Value>>) -> Vec<Milestone> {
    let by_id = |id: &str| {
        from_task.and_then(|ms| {
            ms.iter()
                .find(|m| m.get("id").and_then(Value::as_str) == Some(id))
        })
    };
    if info.nodes.is_empty() {
        return from_task
            .map(|ms| {
                ms.iter()
                    .map(|m| Milestone {
                        id: text_of(m, "id"),
                        title: text_of(m, "title"),
                        kind: text_of(m, "type"),
                        state: text_of(m, "state"),
                        attempts: text_of(m, "attempts"),
                        detail: format!("{} {}", text_of(m, "progress"), text_of(m, "skip_reason"))
                            .trim()
                            .to_owned(),
                        error: text_of(m, "error"),
                    })
                    .collect()
            })
            .unwrap_or_default();
    }
    info.nodes
        .iter()
        .map(|n| {
            let m = by_id(&n.id);
            let from = |k: &str| m.map(|m| text_of(m, k)).unwrap_or_default();
            Milestone {
                id: n.id.clone(),
                title: from("title"),
                kind: n.r#type.clone(),
                state: page::node_state_name(n.state).to_owned(),
                attempts: n.attempts.to_string(),
                detail: format!("{} {}", from("progress"), from("skip_reason"))
                    .trim()
                    .to_owned(),
                error: n.error.clone(),
            }
        })
        .collect()
}

fn milestones(info: &RunInfo, task: &Result<Option<Value>, String>) -> Markup {
    let from_task = task.as_ref().ok().and_then(|t| t.as_ref());
    let ms = from_task
        .and_then(|t| t.get("milestones"))
        .and_then(Value::as_array);
    let roster = from_task
        .and_then(|t| t.get("roster"))
        .and_then(Value::as_array);
    let rows = milestone_rows(info, ms);
    html! {
        section {
            h2 #milestones { "Milestones" }
            @if let Err(e) = task { p.error { (e) } }
            @if rows.is_empty() {
                p.hint { "No milestones yet." }
            } @else {
                table.milestones {
                    thead { tr { th { "id" } th { "title" } th { "type" } th { "state" } th.num { "attempts" } th { "progress / error" } } }
                    tbody {
                        @for m in &rows {
                            tr {
                                td { code { (m.id) } }
                                td { (m.title) }
                                td { (m.kind) }
                                td { (page::badge(&m.state)) }
                                td.num { (m.attempts) }
                                td { (m.detail) @if !m.error.is_empty() { " " span.error { (m.error) } } }
                            }
                        }
                    }
                }
            }
            h3 { "Roster" }
            @match roster {
                Some(r) if !r.is_empty() => {
                    table.roster {
                        thead { tr { th { "instance" } th { "agent" } th { "state" } th { "node" } } }
                        tbody {
                            @for a in r {
                                tr { td { code { (text_of(a, "instance")) } } td { (text_of(a, "agent")) } td { (page::badge(&text_of(a, "state"))) } td { (text_of(a, "node")) } }
                            }
                        }
                    }
                }
                _ => { p.hint { "No agents have joined this run." } }
            }
        }
    }
}

fn notes_section(
    project: &str,
    dir: &str,
    notes: &Result<Option<Read>, ConsoleError>,
    visitor: &Visitor,
    run_url: &str,
    drafts: &Drafts,
) -> Markup {
    let path = format!("{dir}/shared/human-notes.md");
    html! {
        section {
            h2 #notes { "Human notes" }
            p.hint { "Agents of this run read these as high-priority context before each step. "
                a href=(page::file_url(project, &path)) { "shared/human-notes.md" } }
            @match notes {
                Ok(Some(r)) => {
                    @match r.text() {
                        Some(t) => article.markdown #notes-text { (markdown::render(t, &markdown::Base { project, path: &path })) },
                        None => p.error { "human-notes.md is not text" },
                    }
                }
                Ok(None) => p.hint { "No notes file yet." },
                Err(e) => p.error { (e.to_string()) },
            }
            @if visitor.may(Rpc::AddNote) {
                form.note method="post" action=(format!("{run_url}/notes")) {
                    input type="hidden" name="csrf" value=(visitor.csrf);
                    label { "Add a note (Markdown)" textarea name="text" rows="4" required { (drafts.note.as_deref().unwrap_or("")) } }
                    button type="submit" { "Add note" }
                }
            }
        }
    }
}

fn context_section(
    context: &Result<Option<Read>, ConsoleError>,
    visitor: &Visitor,
    run_url: &str,
    drafts: &Drafts,
) -> Markup {
    let stored = match context {
        Ok(Some(r)) => r.text().map(str::to_owned),
        _ => None,
    };
    let text = drafts.context.clone().or(stored).unwrap_or_default();
    html! {
        section {
            h2 #context { "Context manifest" }
            p.hint { "What is explicitly shared with the agents: "
                code { "attachments: [{id, kind: file|snippet, path, range, reason}]" } }
            @if let Err(e) = context { p.error { (e.to_string()) } }
            @if visitor.may(Rpc::EditContext) {
                form.context method="post" action=(format!("{run_url}/context")) {
                    input type="hidden" name="csrf" value=(visitor.csrf);
                    textarea.code name="manifest_yaml" rows="12" spellcheck="false" { (text) }
                    button type="submit" { "Save context" }
                }
            } @else {
                pre.code { (text) }
            }
        }
    }
}

fn area(project: &str, title: &str, prefix: &str, listing: &Listing) -> Markup {
    html! {
        h3 { (title) " " small { a href=(page::tree_url(project, prefix)) { (prefix) "/" } } }
        @match listing {
            Ok((entries, next)) => {
                @if entries.is_empty() {
                    p.hint { "Nothing yet." }
                } @else {
                    (files::file_table(project, entries))
                    @if !next.is_empty() {
                        p.hint { "More files: " a href=(page::tree_url(project, prefix)) { "browse " (prefix) "/" } }
                    }
                }
            }
            Err(e) => p.error { (e.to_string()) },
        }
    }
}

fn control(info: &RunInfo, visitor: &Visitor, run_url: &str, drafts: &Drafts) -> Markup {
    html! {
        section {
            h2 #control { "Cancel / rework" }
            @if !visitor.may(Rpc::CancelRun) {
                p.hint { "Your role can follow this run, not change it." }
            }
            @if !page::is_final(info.state) && visitor.may(Rpc::CancelRun) {
                form.cancel method="post" action=(format!("{run_url}/cancel")) {
                    input type="hidden" name="csrf" value=(visitor.csrf);
                    label { "Reason" input type="text" name="reason" value=(drafts.cancel_reason.as_deref().unwrap_or("")); }
                    button.danger type="submit" { "Cancel run" }
                }
            }
            @if !info.nodes.is_empty() && visitor.may(Rpc::RequestRework) {
                form.rework method="post" action=(format!("{run_url}/rework")) {
                    input type="hidden" name="csrf" value=(visitor.csrf);
                    label { "Node to redo (with everything after it)"
                        select name="node_id" {
                            @for n in &info.nodes { option value=(n.id) { (n.id) " (" (n.r#type) ")" } }
                        }
                    }
                    label { "What to change" textarea name="note" rows="3" { (drafts.rework_note.as_deref().unwrap_or("")) } }
                    button type="submit" { "Request rework" }
                }
            }
        }
    }
}
