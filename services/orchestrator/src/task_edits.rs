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

/// An edit asked for through the API (`EditTask`, `cairn runs edit`): what to set, unset = keep.
#[derive(Debug, Default)]
pub struct Edit {
    pub title: Option<String>,
    pub goal: Option<String>,
    /// Milestone (node id) → its new note; empty removes it.
    pub milestone_notes: Vec<(String, String)>,
}

/// The task.edited event for `edit` against `state` (None: it changes nothing). Err names
/// what is wrong: an empty title, a milestone the run does not have.
pub fn edit_event(edit: &Edit, state: &RunState, by: &str) -> Result<Option<Ev>, String> {
    let mut out = Vec::new();
    if let Some(title) = &edit.title {
        if title.trim().is_empty() {
            return Err("the title is empty; give the run a title (`--title TEXT`)".into());
        }
        if *title != state.title {
            out.push(change("title", None, Some(&state.title), Some(title)));
        }
    }
    if let Some(goal) = edit.goal.as_ref().filter(|g| **g != state.goal) {
        out.push(change("goal", None, Some(&state.goal), Some(goal)));
    }
    for (id, text) in &edit.milestone_notes {
        let Some(n) = state.nodes.iter().find(|n| n.id == *id) else {
            let known: Vec<&str> = state.nodes.iter().map(|n| n.id.as_str()).collect();
            return Err(format!(
                "the run has no milestone {id:?}; name one of its milestones: {}",
                known.join(", ")
            ));
        };
        let to = note(&Some(text.clone())).map(str::to_owned);
        if to.as_deref() != note(&n.note) {
            out.push(change(
                "milestone_note",
                Some(id),
                note(&n.note),
                to.as_deref(),
            ));
        }
    }
    Ok((!out.is_empty()).then(|| {
        Ev::run(TASK_EDITED)
            .with("by", by)
            .with("changes", Value::Array(out))
    }))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> RunState {
        let graph = cairn_graph::Graph::from_yaml(
            "title: T\ngoal: G\nnodes: [{id: a, type: gate}, {id: b, type: gate, needs: [a]}]",
            "r1",
            &Default::default(),
        )
        .unwrap();
        RunState::new("p", &graph)
    }

    fn fields(e: &Ev) -> Vec<(String, Option<String>)> {
        let data: Value = serde_json::from_str(&e.to_input().data_json).unwrap();
        data["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["field"].as_str().unwrap().to_owned(),
                    c["to"].as_str().map(str::to_owned),
                )
            })
            .collect()
    }

    #[test]
    fn an_edit_records_only_what_it_changes() {
        let mut s = state();
        let edit = Edit {
            title: Some("New".into()),
            goal: Some(s.goal.clone()),
            milestone_notes: vec![("b".into(), "check it".into())],
        };
        let e = edit_event(&edit, &s, "ann").unwrap().unwrap();
        assert_eq!(
            fields(&e),
            [
                ("title".into(), Some("New".into())),
                ("milestone_note".into(), Some("check it".into()))
            ]
        );
        // Applied, the same edit is no change; an empty note removes it.
        let data: Map<String, Value> = serde_json::from_str(&e.to_input().data_json).unwrap();
        apply(&mut s, &data);
        assert_eq!(s.title, "New");
        assert!(edit_event(&edit, &s, "ann").unwrap().is_none());
        let clear = Edit {
            milestone_notes: vec![("b".into(), " ".into())],
            ..Edit::default()
        };
        let e = edit_event(&clear, &s, "ann").unwrap().unwrap();
        assert_eq!(fields(&e), [("milestone_note".into(), None)]);
    }

    #[test]
    fn an_edit_naming_nothing_real_is_refused() {
        let s = state();
        let unknown = Edit {
            milestone_notes: vec![("zz".into(), "x".into())],
            ..Edit::default()
        };
        let err = edit_event(&unknown, &s, "ann").unwrap_err();
        assert!(err.contains("\"zz\"") && err.contains("a, b"), "{err}");
        let empty = Edit {
            title: Some("  ".into()),
            ..Edit::default()
        };
        assert!(edit_event(&empty, &s, "ann").unwrap_err().contains("title"));
    }
}
