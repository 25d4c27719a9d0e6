//! A gate's record as a run holds it (and a node that blocks on its own gate reads it).

use cairn_proto::v1 as pb;
use serde::{Deserialize, Serialize};

/// Gate states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateState {
    Open,
    Blocked,
    Approved,
    Rejected,
    /// The run ended (canceled or failed) while the gate waited.
    Canceled,
}

impl GateState {
    pub fn to_proto(self) -> pb::GateState {
        match self {
            GateState::Open => pb::GateState::Open,
            GateState::Blocked => pb::GateState::Blocked,
            GateState::Approved => pb::GateState::Approved,
            GateState::Rejected => pb::GateState::Rejected,
            GateState::Canceled => pb::GateState::Canceled,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GateRecord {
    pub state: GateState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note_ref: Option<String>,
}
