//! A node's panel (`/projects/<p>/runs/<r>/nodes/<node>`): its state, every attempt with its
//! outcome and duration, two attempts compared (attempts.rs), a gate's decisions (the evidence
//! their notes cite linked, evidence.rs), a map's
//! items by state, its outputs, its output (live while it runs), the files it wrote and its
//! events. A page of its own; the run page's
//! script opens it beside the graph when a node is clicked.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use cairn_proto::v1::{Event, GetRunRequest};
use maud::{html, Markup};
use serde::Deserialize;
use serde_json::Value;

use super::dag::{self, GraphNode};
use super::evidence::{self, Cites};
use super::page::{self, layout};
use super::session::Visitor;
use super::{attempts, history, logs, logview, timeline};
use super::{Console, ConsoleError};

/// One line of a gate's history: when, what happened, and a decision's note.
pub(super) struct GateStep {
    pub attempt: u32,
    pub ts: String,
    pub text: String,
    pub note: String,
}

/// Everything that happened to gate `gate`, oldest first: each time it blocked (with the
/// attempt), each decision (who, when, note) and each rework that reopened it.
pub(super) fn gate_history(gate: &str, events: &[Event]) -> Vec<GateStep> {
    let mut out = Vec::new();
    let mut attempt = 0u32;
    for e in events {
        let d = history::data(e);
        let text = |k: &str| {
            d.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let mut note = String::new();
        let step = match e.r#type.as_str() {
            "node.started" if e.node_id == gate => {
                attempt += 1;
                continue;
            }
            "gate.blocked" if e.node_id == gate => {
                let reason = text("reason");
                if reason.is_empty() {
                    "blocked".to_owned()
                } else {
                    format!("blocked: {reason}")
                }
            }
            "gate.approved" | "gate.rejected" if e.node_id == gate => {
                let word = if e.r#type == "gate.approved" {
                    "approved"
                } else {
                    "rejected"
                };
                note = text("note");
                format!("{word} by {}", text("by"))
            }
            "artifact.rework-requested" => {
                let reopened = d
                    .get("nodes")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(gate)));
                if !reopened || attempt == 0 {
                    continue;
                }
                format!(
                    "reopened by the rework of `{}` requested by {}",
                    text("target"),
                    text("by")
                )
            }
            _ => continue,
        };
        out.push(GateStep {
            // A gate blocks in its first attempt even when its start was not recorded.
            attempt: attempt.max(1),
            ts: e.ts.clone(),
            text: step,
            note,
        });
    }
    out
}

/// A gate's history as a list (nothing when it has none); the evidence its notes cite linked.
pub(super) fn gate_history_list(gate: &str, events: &[Event], cites: &Cites) -> Markup {
    let steps = gate_history(gate, events);
    html! {
        @if !steps.is_empty() {
            ol.gate-history id=(format!("gate-history-{gate}")) aria-label=(format!("History of gate {gate}")) {
                @for s in &steps {
                    li { "attempt " (s.attempt) " · " time datetime=(s.ts) { (page::when(&s.ts)) } " · " (s.text)
                        @if !s.note.is_empty() { ": “" (cites.text(&s.note)) "”" } }
                }
            }
        }
    }
}

pub(super) fn node_url(run_url: &str, node: &str) -> String {
    format!("{run_url}/nodes/{}", page::seg(node))
}

/// The node's kind: the run's, else (a map item) its node.started event's.
fn kind_of(info: &cairn_proto::v1::RunInfo, events: &[Event], node: &str) -> Option<String> {
    if let Some(n) = info.nodes.iter().find(|n| n.id == node) {
        return Some(n.r#type.clone());
    }
    events
        .iter()
        .find(|e| e.node_id == node && e.r#type == "node.started")
        .map(|e| {
            history::data(e)
                .get("node_type")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_owned()
        })
}

#[derive(Deserialize)]
pub(super) struct NodeQuery {
    /// Two attempts to compare (`A,B`); default: the last two.
    #[serde(default)]
    attempts: String,
}

pub(super) async fn page(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run, node)): Path<(String, String, String)>,
    Query(q): Query<NodeQuery>,
) -> Result<Response, ConsoleError> {
    let what = format!("reading run {run}");
    let mut orchestrator = console.orchestrator(&visitor);
    let get = orchestrator.get_run(GetRunRequest {
        project_id: project.clone(),
        run_id: run.clone(),
    });
    let (info, events, cites) = tokio::join!(
        console.call(&what, get),
        history::read(&console, &project, &run),
        evidence::load(&console, &project, &run),
    );
    let info = info?;
    let events = events?.events;
    let Some(kind) = kind_of(&info, &events, &node) else {
        return Err(ConsoleError::NotFound(format!(
            "run {run} has no node `{node}`"
        )));
    };
    let compared = attempts::pick(&q.attempts, &node, &events).map_err(ConsoleError::BadRequest)?;
    let run_url = page::run_url(&project, &run);
    let here = node_url(&run_url, &node);
    let known = info.nodes.iter().find(|n| n.id == node);
    let item_prefix = format!("{node}.");
    let state = match known {
        Some(n) => page::node_state_name(n.state),
        None => node_item_state(&events, &node),
    };
    let mine: Vec<&Event> = events
        .iter()
        .filter(|e| e.node_id == node || e.node_id.starts_with(&item_prefix))
        .collect();
    let rows = timeline::rows(
        &[GraphNode {
            id: node.clone(),
            kind: kind.clone(),
            needs: Vec::new(),
            then: Vec::new(),
            otherwise: Vec::new(),
        }],
        &events,
    );
    let logged = kind == "sandbox_run" || kind == "code_delivery";
    let output = if logged {
        Some(logs::load(&console, &visitor, &project, &run, &node, logs::PAGE_BYTES).await)
    } else {
        None
    };
    let outputs = events
        .iter()
        .rev()
        .find(|e| e.node_id == node && e.r#type == "node.completed")
        .and_then(|e| history::data(e).get("outputs").cloned())
        .filter(|o| o.as_object().is_some_and(|m| !m.is_empty()));
    let written: Vec<history::Written> = history::written_files(&events)
        .into_iter()
        .filter(|w| w.node == node || w.node.starts_with(&item_prefix))
        .collect();
    let items = (kind == "map").then(|| dag::item_states(&node, &events));
    let title = format!("Node {node}");
    let body = html! {
        div #node-page data-node=(node) {
        p.meta { a href=(run_url) { "run " (run) } }
        h1 #node-title { "Node " code { (node) } }
        p { (page::badge(state)) " " span.glyph aria-hidden="true" { (dag::state_glyph(state)) } " " (kind)
            @if let Some(n) = known { " · attempts: " (n.attempts) } }
        @if let Some(n) = known { @if !n.error.is_empty() { p.error { "Error: " (n.error) } } }
        h2 { "Attempts" }
        @match rows.first() {
            Some(r) if !r.spans.is_empty() => {
                table.attempts #node-attempts {
                    thead { tr { th.num { "attempt" } th { "outcome" } th { "start" } th.num { "took" } } }
                    tbody {
                        @for (i, s) in r.spans.iter().enumerate() {
                            tr {
                                td.num data-label="attempt" { (i + 1) }
                                td data-label="outcome" { (page::badge(s.outcome)) }
                                td data-label="start" { (page::when(&s.start_ts)) }
                                td.num data-label="took" { @if let Some((t, _)) = &s.end { (timeline::span_text(*t - s.start)) } @else { "running" } }
                            }
                        }
                    }
                }
            }
            _ => p.hint { "It has not started." },
        }
        @if let Some(pair) = compared { (attempts::section(&node, &here, &events, pair)) }
        @if kind == "gate" {
            h2 { "Decisions" }
            (gate_history_list(&node, &events, &cites))
        }
        @if let Some(items) = &items {
            h2 { "Items (" (items.len()) ")" }
            @if items.is_empty() { p.hint { "No items yet." } } @else {
                ul.items #map-items {
                    @for (id, st) in items {
                        li { a href=(node_url(&run_url, id)) { code { (id) } } " " (page::badge(st)) }
                    }
                }
            }
        }
        @if let Some(o) = &outputs {
            h2 { "Outputs" }
            pre.fold #node-outputs { (serde_json::to_string_pretty(o).unwrap_or_default()) }
        }
        @if let Some(out) = &output {
            h2 { "Output" }
            @match out {
                Ok(o) => {
                    @let log_id = format!("nlog-{node}");
                    (logs::tools(&log_id, state == "running", &logview::log_url(&run_url, &node)))
                    (logs::pre(&log_id, &o.pieces, Some((&format!("{here}/logs"), &o.after))))
                }
                Err(e) => p.error { (e.to_string()) },
            }
        }
        h2 { "Files it wrote" }
        (history::written_table(&project, &written))
        h2 { "Events" }
        table.events #node-events {
            thead { tr { th.num { "seq" } th { "time" } th { "type" } th { "node" } th { "details" } } }
            tbody { @for e in &mine { (history::row(&project, e)) } }
        }
        }
    };
    Ok(layout(&title, Some(&visitor), None, body).into_response())
}

/// A map item's state from its events.
fn node_item_state(events: &[Event], node: &str) -> &'static str {
    let Some((map, _)) = node.rsplit_once('.') else {
        return "pending";
    };
    dag::item_states(map, events)
        .into_iter()
        .find(|(id, _)| id == node)
        .map_or("pending", |(_, s)| s)
}
