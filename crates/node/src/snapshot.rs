//! A stored session snapshot as a run remembers it: the last one a node took (from its
//! `session.checkpointed` events), and the one a rework asks the node to start from.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRef {
    /// Its store path (`.cairn/runs/<run>/snapshots/<session>/<n>.snap`).
    pub path: String,
    pub sha256: String,
    pub bytes: u64,
    /// The session it was taken of.
    pub session_id: String,
    /// The commit a git source had checked out ("" for an empty source).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub git_commit: String,
}

impl SnapshotRef {
    /// From a `session.checkpointed` event's data (None when a field is missing).
    pub fn from_event(d: &Map<String, Value>) -> Option<SnapshotRef> {
        let text = |k: &str| d.get(k).and_then(Value::as_str).map(str::to_owned);
        Some(SnapshotRef {
            path: text("snapshot")?,
            sha256: text("sha256")?,
            bytes: d.get("bytes").and_then(Value::as_u64)?,
            session_id: text("session_id").unwrap_or_default(),
            git_commit: text("git_commit").unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_event_names_its_snapshot_and_an_incomplete_one_none() {
        let d = serde_json::json!({"snapshot": ".cairn/runs/r/snapshots/s/1.snap", "sha256": "ab", "bytes": 7, "session_id": "s", "git_commit": "c0"});
        let r = SnapshotRef::from_event(d.as_object().unwrap_or(&Map::new()))
            .unwrap_or_else(|| panic!("a complete event gives a snapshot"));
        assert_eq!(r.path, ".cairn/runs/r/snapshots/s/1.snap");
        assert_eq!((r.bytes, r.git_commit.as_str()), (7, "c0"));
        for missing in ["snapshot", "sha256", "bytes"] {
            let mut d = d.as_object().cloned().unwrap_or_default();
            d.remove(missing);
            assert_eq!(SnapshotRef::from_event(&d), None, "{missing}");
        }
    }
}
