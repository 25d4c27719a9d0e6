//! Human gates: who may decide what, and the events a decision is
//! recorded as. The scheduler applies decisions; this module owns their rules.

use crate::error::{Error, Result};
use crate::run::{GateState, RunState};
use cairn_node::events::{Ev, GATE_APPROVED, GATE_REJECTED};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Reject,
}

impl Decision {
    pub fn word(self) -> &'static str {
        match self {
            Decision::Approve => "approval",
            Decision::Reject => "rejection",
        }
    }
}

/// A decision is only taken on a gate that is blocked right now.
pub fn check_decidable(state: &RunState, gate_id: &str) -> Result<()> {
    let Some(node) = state.node(gate_id) else {
        return Err(Error::NodeNotFound {
            project: state.project.clone(),
            run_id: state.run_id.clone(),
            node: gate_id.to_owned(),
            what: "gate",
            hint: "; `cairn runs show RUN` lists its gates",
        });
    };
    let Some(gate) = &node.gate else {
        return Err(Error::field(
            "gate_id",
            format!("node `{gate_id}` is a {}, not a gate", node.kind),
        ));
    };
    match gate.state {
        GateState::Blocked => Ok(()),
        GateState::Open => Err(Error::FailedPrecondition(format!(
            "gate `{gate_id}` has not been reached yet (state open); decide once the run blocks there"
        ))),
        s => Err(Error::FailedPrecondition(format!(
            "gate `{gate_id}` was already decided ({s:?} by {}); request a rework of it to decide again",
            gate.decided_by.clone().unwrap_or_default()
        ))),
    }
}

/// The gate.approved / gate.rejected event (example fields).
/// A decision a replay takes from its recorded run: when it was made there, and who
/// started the replay (recorded beside the recorded `by`).
#[derive(Clone, Debug)]
pub struct Recorded {
    pub decided_at: String,
    pub replayed_by: String,
    pub replay_of: String,
}

pub fn decision_event(
    d: Decision,
    gate_id: &str,
    by: &str,
    note: &str,
    note_ref: Option<&str>,
) -> Ev {
    let kind = match d {
        Decision::Approve => GATE_APPROVED,
        Decision::Reject => GATE_REJECTED,
    };
    let mut e = Ev::new(kind, gate_id)
        .with("gate_id", gate_id)
        .with("by", by)
        .with("note", note);
    if let Some(r) = note_ref {
        e = e.with("note_ref", r);
    }
    e
}
