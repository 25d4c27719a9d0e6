//! The run page: state and milestones (GetRun and task.yaml), the roster, gates with their
//! Approve / Reject form, the output of sandbox_run and code_delivery nodes (logs.rs), the
//! graph (dag.rs) and the timeline (timeline.rs), the events
//! (history.rs, then live), human-notes.md with a form to add a note, the context manifest
//! editor, the files the run wrote (the whole project's behind a toggle), the ingest
//! manifests, cancel and rework. Everything is read through the orchestrator and the store at
//! each request.
//!
//! Live: the parts marked `data-live` are fetched again by the page's script whenever an event
//! arrives and replaced when they changed (a part someone is typing in is left alone until
//! they are done); without JavaScript the page is the same, as of its loading.

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use cairn_proto::v1::{GateState, GetRunRequest, RunInfo};
use maud::{html, Markup};
use serde::Deserialize;
use serde_json::Value;

use super::evidence::{self, Cites};
use super::files::{self, Read};
use super::markdown;
use super::page::{self, layout, Html};
use super::session::{Flash, Visitor};
use super::{compare, dag, diff, history, ingest, logs, nodepage, timeline};
use super::{Console, ConsoleError};
use cairn_server::roles::Rpc;

/// Files listed per area on the run page (the directory browser has the rest).
const FILES_PER_AREA: u32 = 100;
/// Largest task.yaml / human-notes.md / context manifest read for the page.
const DOC_LIMIT: u64 = 1 << 20;
/// Largest graph.resolved.json read for the drawing.
const GRAPH_LIMIT: u64 = 4 << 20;

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

/// Header the page's script sends when it fetches the page again for its live parts (the
/// flash message, already shown, is then left alone).
pub(super) const LIVE_HEADER: &str = "x-cairn-live";

#[derive(Default, Deserialize)]
pub(super) struct PageQuery {
    /// `project`: list the whole project's docs/ and workspace/ too.
    #[serde(default)]
    files: String,
    /// Maps drawn with their items in the graph (ids separated by commas).
    #[serde(default)]
    expand: String,
}

pub(super) async fn page(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
    headers: HeaderMap,
) -> Result<Response, ConsoleError> {
    let flash = if headers.contains_key(LIVE_HEADER) {
        None
    } else {
        console.sessions().take_flash(&visitor.session_id)
    };
    let view = View {
        project_files: q.files == "project",
        expand: dag::expand_list(&q.expand),
    };
    Ok(render(
        &console,
        &visitor,
        &project,
        &run,
        flash,
        Drafts::default(),
        view,
    )
    .await?
    .into_response())
}

/// How the page is asked for.
#[derive(Clone, Default)]
pub(super) struct View {
    /// List the project's docs/ and workspace/ besides the run's own files.
    pub project_files: bool,
    /// Maps whose items the graph draws as nodes.
    pub expand: Vec<String>,
}

/// The run's directory (the orchestrator's `run_dir`, or its known layout).
pub(super) fn run_dir(info: Option<&RunInfo>, run: &str) -> String {
    match info {
        Some(i) if !i.run_dir.is_empty() => i.run_dir.clone(),
        _ => format!(".cairn/runs/{run}"),
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
    view: View,
) -> Result<Html, ConsoleError> {
    let dir = run_dir(None, run);
    let task_path = format!("{dir}/task.yaml");
    let graph_path = format!("{dir}/graph.resolved.json");
    let (task, graph) = tokio::join!(
        files::read(console, project, &task_path, DOC_LIMIT),
        files::read(console, project, &graph_path, GRAPH_LIMIT),
    );
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
    let graph = match graph {
        Ok(Some(r)) => r
            .text()
            .ok_or_else(|| "graph.resolved.json is not text".to_owned())
            .and_then(dag::parse_graph),
        Ok(None) => Err("this run has no graph.resolved.json".to_owned()),
        Err(e) => Err(e.to_string()),
    };

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
    let project_files = async {
        if view.project_files {
            Some(tokio::join!(
                files::list(console, project, "docs", true, FILES_PER_AREA, ""),
                files::list(console, project, "workspace", true, FILES_PER_AREA, ""),
            ))
        } else {
            None
        }
    };
    let (info, notes, context, project_files, records, manifests, events, turns, cites) = tokio::join!(
        get,
        files::read(console, project, &notes_path, DOC_LIMIT),
        files::read(console, project, &context_path, DOC_LIMIT),
        project_files,
        files::list(console, project, &dir, true, FILES_PER_AREA * 2, ""),
        ingest::load(console, project, &dir),
        history::read(console, project, run),
        diff::turns(console, project, &dir),
        evidence::load(console, project, run),
    );
    let info = info?;
    let no_events: &[cairn_proto::v1::Event] = &[];
    let event_list = events.as_ref().map_or(no_events, |h| h.events.as_slice());
    let outputs: Vec<(String, String, Result<logs::NodeOutput, ConsoleError>)> =
        futures::future::join_all(logs::logged(&info, event_list).into_iter().map(
            |(id, kind)| async move {
                let out = logs::load(console, visitor, project, run, &id, logs::PAGE_BYTES).await;
                (id, kind, out)
            },
        ))
        .await;
    let nodes = dag::nodes_or_run(&graph, &info);
    let rows = timeline::rows(&nodes, event_list);
    let now = if page::is_final(info.state) {
        page::parse_time(&info.updated_at).unwrap_or_else(time::OffsetDateTime::now_utc)
    } else {
        time::OffsetDateTime::now_utc()
    };
    let written = history::written_files(event_list);
    let state = page::task_state_name(info.state);
    let title = if info.title.is_empty() {
        info.run_id.clone()
    } else {
        info.title.clone()
    };
    let run_url = page::run_url(project, run);
    let files_url = if view.project_files {
        format!("{run_url}#artifacts")
    } else {
        format!("{run_url}?files=project#artifacts")
    };
    let body = html! {
        div #run-head data-live {
        div.runhead {
            h1 #run-title { (title) }
            span #run-state-wrap { span #run-state data-state=(state) { (page::badge(state)) } }
            @if !info.stalled_since.is_empty() {
                " " span.badge.bad #run-stalled { "stalled" }
            }
        }
        p.meta {
            "run " code #run-id { (info.run_id) } " · project " a href=(page::runs_url(project, None)) { (project) }
            " · started " (page::when(&info.created_at)) " · updated " (page::when(&info.updated_at))
            " · " (page::duration(&info.created_at, &info.updated_at, page::is_final(info.state)))
            " · " a href=(page::file_url(project, &format!("{dir}/README.md"))) { "README.md" }
            " · " a href=(page::file_url(project, &format!("{dir}/task.yaml"))) { "task.yaml" }
            @if !info.rerun_of.is_empty() {
                " · re-run of " a #rerun-of href=(page::run_url(project, &info.rerun_of)) { (info.rerun_of) }
                " (" a #compare-rerun href=(compare::compare_url(project, &info.rerun_of, run)) { "compare" } ")"
            }
            @if !info.replay_of.is_empty() {
                " · replay of " a #replay-of href=(page::run_url(project, &info.replay_of)) { (info.replay_of) }
                " (" a #compare-replay href=(compare::compare_url(project, &info.replay_of, run)) { "compare" } ")"
            }
            " · " a #compare-other href=(compare::compare_url(project, run, "")) { "compare with another run" }
        }
        @if !info.goal.is_empty() {
            p.goal #run-goal { (info.goal) }
        }
        @if !info.error.is_empty() {
            p.error #run-error { "Why it stopped: " (page::linkify(project, &info.error)) }
        }
        @if !info.stalled_since.is_empty() {
            p.error #run-stall { "Stalled since " (page::when(&info.stalled_since)) ": a running node has gone past its stall limit without any event (see the run.stalled event)." }
        }
        }
        nav.sections {
            a href="#gates" { "Gates" } a href="#milestones" { "Milestones" } a href="#logs" { "Output" } a href="#graph" { "Graph" }
            a href="#timeline" { "Timeline" } a href="#events" { "Events" }
            a href="#notes" { "Notes" } a href="#context" { "Context" } a href="#artifacts" { "Artifacts" }
            a href="#ingest" { "Ingest" } a href="#control" { "Actions" }
        }
        (gates(&info, event_list, &cites, visitor, &run_url, &drafts))
        (milestones(&info, &task_doc, &turns))
        (logs::section(&info, &run_url, &outputs))
        section #graph-section {
            h2 #graph { "Graph" }
            div.graph-tools role="toolbar" aria-label="Zoom the graph" aria-controls="graph-view" {
                button type="button" data-zoom="in" aria-label="Zoom in" { "+" }
                button type="button" data-zoom="out" aria-label="Zoom out" { "−" }
                button type="button" data-zoom="fit" { "Fit" }
                button type="button" data-zoom="reset" { "100%" }
                span.hint { "Click a node for its panel. Wheel or + and − zoom, dragging or the arrow keys move." }
            }
            div.scroll.graph-view #graph-view tabindex="0" role="region" aria-label="The run's graph, zoomable" {
                div #graph-live data-live { (dag::render(&graph, &info, event_list, &format!("{run_url}/nodes"), &dag::View { expand: &view.expand, run_url: &run_url })) }
            }
            aside #node-aside aria-label="Node panel" aria-live="polite" hidden {}
        }
        section #timeline-section data-live {
            h2 #timeline { "Timeline" }
            div.scroll tabindex="0" role="region" aria-label="Timeline strip" { (timeline::render(&rows, now)) }
        }
        section #events-section {
            h2 #events { "Events" }
            p.hint #events-status { "Every event of the run so far; new ones are added as they happen while this page is open." }
            (history::table(project, &events, &format!("{run_url}/events")))
            p.hint { a href=(page::file_url(project, &format!("{dir}/events.jsonl"))) { "events.jsonl" } " has every event as recorded." }
        }
        (notes_section(project, &dir, &notes, &cites, visitor, &run_url, &drafts))
        (context_section(&context, visitor, &run_url, &drafts))
        section #artifacts-section data-live {
            h2 #artifacts { "Artifacts" }
            h3 { "Written by this run" }
            p.hint {
                "The project files this run's events name. "
                a #files-toggle href=(files_url) {
                    @if view.project_files { "Show this run's files only" } @else { "Show the whole project's docs/ and workspace/" }
                }
            }
            (history::written_table(project, &written))
            (area(project, "Run records", &dir, &records))
            @if let Some((docs, workspace)) = &project_files {
                (area(project, "Documents (whole project)", "docs", docs))
                (area(project, "Workspace (whole project)", "workspace", workspace))
            }
        }
        section #ingest-section data-live {
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

fn gates(
    info: &RunInfo,
    events: &[cairn_proto::v1::Event],
    cites: &Cites,
    visitor: &Visitor,
    run_url: &str,
    drafts: &Drafts,
) -> Markup {
    html! {
        section #gates-section data-live {
            h2 #gates { "Gates" }
            @if info.gates.is_empty() {
                p.hint { "This run has no gates." }
            }
            @for g in &info.gates {
                div.gate id=(format!("gate-{}", g.id)) {
                    h3 { "Gate " code { (g.id) } " " (page::badge(page::gate_state_name(g.state))) }
                    @if !g.reason.is_empty() { p.reason { (page::linkify(&info.project_id, &g.reason)) } }
                    @if !g.decided_by.is_empty() {
                        p.decision {
                            (page::gate_state_name(g.state)) " by " strong { (g.decided_by) }
                            @if !g.decided_at.is_empty() { " at " (page::when(&g.decided_at)) }
                            @if !g.note.is_empty() { ": " q.note { (cites.text(&g.note)) } }
                        }
                    }
                    (nodepage::gate_history_list(&g.id, events, cites))
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

fn milestones(info: &RunInfo, task: &Result<Option<Value>, String>, turns: &diff::Turns) -> Markup {
    let from_task = task.as_ref().ok().and_then(|t| t.as_ref());
    let ms = from_task
        .and_then(|t| t.get("milestones"))
        .and_then(Value::as_array);
    let roster = from_task
        .and_then(|t| t.get("roster"))
        .and_then(Value::as_array);
    let rows = milestone_rows(info, ms);
    html! {
        section #milestones-section data-live {
            h2 #milestones { "Milestones" }
            @if let Err(e) = task { p.error { (e) } }
            @if rows.is_empty() {
                p.hint { "No milestones yet." }
            } @else {
                table.milestones #milestones-table {
                    thead { tr { th { "id" } th { "title" } th { "type" } th { "state" } th.num { "attempts" } th { "progress / error" } } }
                    tbody {
                        @for m in &rows {
                            tr id=(format!("node-{}", m.id)) {
                                td data-label="id" { code { (m.id) } }
                                td data-label="title" { (m.title) }
                                td data-label="type" { (m.kind) }
                                td data-label="state" { (page::badge(&m.state)) }
                                td.num data-label="attempts" { (m.attempts) }
                                td data-label="progress / error" { (m.detail) @if !m.error.is_empty() { " " span.error { (m.error) } } }
                            }
                        }
                    }
                }
            }
            h3 { "Roster" }
            @match roster {
                Some(r) if !r.is_empty() => {
                    table.roster {
                        thead { tr { th { "instance" } th { "agent" } th { "state" } th { "node" } th { "turns" } } }
                        tbody {
                            @for a in r {
                                @let instance = text_of(a, "instance");
                                tr {
                                    td data-label="instance" { code { (instance) } } td data-label="agent" { (text_of(a, "agent")) } td data-label="state" { (page::badge(&text_of(a, "state"))) } td data-label="node" { (text_of(a, "node")) }
                                    td.turns data-label="turns" { (diff::links(&info.project_id, &info.run_id, &instance, turns.get(&instance).map_or(&[][..], Vec::as_slice))) }
                                }
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
    cites: &Cites,
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
            div #notes-live data-live {
                @match notes {
                    Ok(Some(r)) => {
                        @match r.text() {
                            Some(t) => article.markdown #notes-text { (markdown::render(t, &markdown::Base { project, path: &path, cites: Some(cites) })) },
                            None => p.error { "human-notes.md is not text" },
                        }
                    }
                    Ok(None) => p.hint { "No notes file yet." },
                    Err(e) => p.error { (e.to_string()) },
                }
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
                    label { "Context manifest (YAML)"
                        textarea.code name="manifest_yaml" rows="12" spellcheck="false" { (text) }
                    }
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
    let state = page::task_state_name(info.state);
    let may_change = visitor.may(Rpc::CancelRun) || visitor.may(Rpc::SubmitRun);
    html! {
        section #control-section data-live {
            h2 #control { "Run actions" }
            @if !may_change {
                p.hint { "Your role can follow this run, not change it." }
            }
            div.actions {
                @if state == "failed" && visitor.may(Rpc::ResumeRun) {
                    form.inline-card #resume-form method="post" action=(format!("{run_url}/resume")) {
                        input type="hidden" name="csrf" value=(visitor.csrf);
                        p.hint { "Retry the failed nodes; what succeeded is kept." }
                        button.approve type="submit" { "Resume" }
                    }
                }
                @if visitor.may(Rpc::SubmitRun) {
                    form.inline-card #rerun-form method="post" action=(format!("{run_url}/rerun")) {
                        input type="hidden" name="csrf" value=(visitor.csrf);
                        input type="hidden" name="request_id" value=(super::start::new_request_id());
                        p.hint { "Start a new run with this run's graph, variables, title and LLM." }
                        button type="submit" { "Re-run" }
                    }
                }
                @if !page::is_final(info.state) && visitor.may(Rpc::CancelRun) {
                    form.inline-card #cancel-form method="post" action=(format!("{run_url}/cancel")) {
                        input type="hidden" name="csrf" value=(visitor.csrf);
                        label { "Reason" input type="text" name="reason" value=(drafts.cancel_reason.as_deref().unwrap_or("")); }
                        button.danger type="submit" { "Cancel run…" }
                    }
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
