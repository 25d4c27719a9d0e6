//! Human edits of task.yaml. The orchestrator regenerates the file from the run's events, but
//! people may change a few fields in it: the run's `title` and `goal`, and a `note` on any
//! milestone or roster entry. Such an edit becomes a `task.edited` event (so the state, GetRun
//! and every later rewrite carry it); the store refuses a Put that changes anything else. An
//! edit is never overwritten unseen: the snapshot writer replaces task.yaml only while it holds
//! what the writer last wrote (a compare-and-swap) and reads it first otherwise.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use cairn_node::events::{Ev, TASK_EDITED};
use cairn_proto::v1::Level;

use crate::run::RunState;

/// The fields of task.yaml a human may edit, as help and errors name them.
pub const EDITABLE: &str = "title, goal, milestones[].note and roster[].note";

#[derive(Deserialize, Default)]
struct Milestone {
    id: String,
    #[serde(default)]
    note: Option<String>,
}

#[derive(Deserialize, Default)]
struct Roster {
    instance: String,
    #[serde(default)]
    note: Option<String>,
}

/// The editable part of task.yaml (everything else is ignored here).
#[derive(Deserialize, Default)]
struct Editable {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    goal: Option<String>,
    #[serde(default)]
    milestones: Vec<Milestone>,
    #[serde(default)]
    roster: Vec<Roster>,
}

/// An empty note is no note.
fn note(n: &Option<String>) -> Option<&str> {
    n.as_deref().map(str::trim_end).filter(|s| !s.is_empty())
}

fn change(field: &str, id: Option<&str>, from: Option<&str>, to: Option<&str>) -> Value {
    let mut c = json!({"field": field, "from": from, "to": to});
    if let Some(id) = id {
        c["id"] = id.into();
    }
    c
}

/// What `file` (the text of task.yaml) changes in `state`'s editable fields: the
/// `changes` of a task.edited event, empty when nothing. Err when the file does not parse.
pub fn changes(file: &str, state: &RunState) -> Result<Vec<Value>, String> {
    let edit: Editable = serde_saphyr::from_str(file).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    if let Some(title) = edit.title.filter(|t| *t != state.title) {
        out.push(change("title", None, Some(&state.title), Some(&title)));
    }
    if let Some(goal) = edit.goal.filter(|g| *g != state.goal) {
        out.push(change("goal", None, Some(&state.goal), Some(&goal)));
    }
    for m in &edit.milestones {
        if let Some(n) = state.nodes.iter().find(|n| n.id == m.id) {
            if note(&m.note) != note(&n.note) {
                out.push(change(
                    "milestone_note",
                    Some(&m.id),
                    note(&n.note),
                    note(&m.note),
                ));
            }
        }
    }
    for r in &edit.roster {
        if let Some(e) = state.roster.iter().find(|e| e.instance == r.instance) {
            if note(&r.note) != note(&e.note) {
                out.push(change(
                    "roster_note",
                    Some(&r.instance),
                    note(&e.note),
                    note(&r.note),
                ));
            }
        }
    }
    Ok(out)
}

/// The event for what a changed task.yaml holds: its edits (info), or a warning that
/// nothing in it could be applied (`why`).
pub fn event(file: &str, state: &RunState) -> Ev {
    let ev = Ev::run(TASK_EDITED).with("file", "task.yaml");
    match changes(file, state) {
        Ok(c) if !c.is_empty() => ev.with("changes", Value::Array(c)),
        Ok(_) => ev.level(Level::Warning).with("changes", json!([])).with(
            "ignored",
            format!("task.yaml was changed outside the editable fields ({EDITABLE}); those are regenerated from the run's events"),
        ),
        Err(e) => ev.level(Level::Warning).with("changes", json!([])).with(
            "ignored",
            format!("task.yaml was changed and no longer parses ({e}); it is regenerated from the run's events"),
        ),
    }
}

/// Applies a task.edited event's `changes` to the state.
pub fn apply(state: &mut RunState, data: &Map<String, Value>) {
    let Some(Value::Array(changes)) = data.get("changes") else {
        return;
    };
    for c in changes {
        let to = c.get("to").and_then(Value::as_str);
        let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
        match c.get("field").and_then(Value::as_str) {
            Some("title") => state.title = to.unwrap_or_default().to_owned(),
            Some("goal") => state.goal = to.unwrap_or_default().to_owned(),
            Some("milestone_note") => {
                if let Some(n) = state.nodes.iter_mut().find(|n| n.id == id) {
                    n.note = to.map(str::to_owned);
                }
            }
            Some("roster_note") => {
                if let Some(r) = state.roster.iter_mut().find(|r| r.instance == id) {
                    r.note = to.map(str::to_owned);
                }
            }
            _ => {}
        }
    }
}
