//! `gate`: a human approval point. Reaching it blocks the run
//! (`gate.blocked`, task `input-required`); ApproveGate/RejectGate decide. A rejection fails
//! the run unless the gate says `on_reject: continue`.

use serde_json::{Map, Value};

use super::{NodeError, Scope};
use cairn_graph::Gate;

/// The reason recorded in gate.blocked.
pub fn reason(scope: &Scope, node: &str, spec: &Gate) -> Result<String, NodeError> {
    match &spec.reason {
        Some(t) => scope.render("reason", t),
        None => Ok(format!("human approval required at `{node}`")),
    }
}

/// The gate's outputs once decided.
pub fn outputs(approved: bool, by: &str, note: &str, decided_at: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("approved".into(), approved.into());
    m.insert("by".into(), by.into());
    m.insert("note".into(), note.into());
    m.insert("decided_at".into(), decided_at.into());
    m
}
