//! Which identity may emit which run event type: one table, used by the store when it appends
//! a batch and by the orchestrator when it folds a run's log (where it ignores, and reports,
//! any stored event whose identity may not have emitted it).
//!
//! | identity | event types |
//! |---|---|
//! | `orchestrator`, `cli`, `local` (plaintext) | every type |
//! | none on the line (plaintext callers, the store's own `store.*`) | every type |
//! | `ingest` | `ingest.*` (the store also requires its claim on the run) |
//! | `console`, `sandbox-runner`, any other | none |

/// The event types `ingest` may emit start with this.
pub const INGEST_PREFIX: &str = "ingest.";

/// May an event of `event_type` come from `identity`? `None`: the stored line names no
/// identity (a plaintext caller, or the store itself).
pub fn may_emit(identity: Option<&str>, event_type: &str) -> bool {
    match identity {
        None | Some("orchestrator" | "cli" | crate::caller::LOCAL) => true,
        Some("ingest") => event_type.starts_with(INGEST_PREFIX),
        Some(_) => false,
    }
}

/// What `identity` may emit, in words (for refusals and warnings).
pub fn rule(identity: &str) -> &'static str {
    match identity {
        "ingest" => "ingest may append only its own `ingest.*` events; gate, node, task and every other event come from the orchestrator",
        "orchestrator" | "cli" | crate::caller::LOCAL => "every event type",
        _ => "only the orchestrator (and the cli) append run events",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table() {
        for t in [
            "gate.approved",
            "node.completed",
            "task.working",
            "ingest.started",
        ] {
            assert!(may_emit(None, t));
            assert!(may_emit(Some("orchestrator"), t));
            assert!(may_emit(Some("cli"), t));
            assert!(may_emit(Some("local"), t));
            assert!(!may_emit(Some("console"), t));
            assert!(!may_emit(Some("sandbox-runner"), t));
            assert!(!may_emit(Some("stranger"), t));
        }
        assert!(may_emit(Some("ingest"), "ingest.block.written"));
        for t in [
            "gate.approved",
            "node.completed",
            "task.working",
            "store.deleted",
            "ingest",
            "ingestx.y",
        ] {
            assert!(!may_emit(Some("ingest"), t), "{t}");
        }
    }
}
