//! The event vocabulary of a run's events.jsonl (run, node, gate and sandbox
//! events). Every state change of a run is one of these events; `run::RunState::apply` is the
//! only place that turns them into state, live and on resume alike.

use cairn_proto::v1::{EventInput, Level};
use serde_json::{Map, Value};

pub const TASK_CREATED: &str = "task.created";
pub const TASK_WORKING: &str = "task.working";
pub const TASK_INPUT_REQUIRED: &str = "task.input-required";
pub const TASK_COMPLETED: &str = "task.completed";
pub const TASK_FAILED: &str = "task.failed";
pub const TASK_CANCELED: &str = "task.canceled";
/// A run picked up again (after a restart, or ResumeRun of a failed run).
pub const TASK_RESUMED: &str = "task.resumed";

pub const NODE_STARTED: &str = "node.started";
pub const NODE_COMPLETED: &str = "node.completed";
/// With `will_retry: true` the node waits for its next attempt.
pub const NODE_FAILED: &str = "node.failed";
pub const NODE_SKIPPED: &str = "node.skipped";
pub const NODE_CANCELED: &str = "node.canceled";
/// A map's items are known (count, and the list when it did not come from the graph).
pub const MAP_ITEMS: &str = "map.items";

pub const ARTIFACT_WRITTEN: &str = "artifact.written";
pub const REWORK_REQUESTED: &str = "artifact.rework-requested";

pub const GATE_BLOCKED: &str = "gate.blocked";
pub const GATE_APPROVED: &str = "gate.approved";
pub const GATE_REJECTED: &str = "gate.rejected";

pub const HUMAN_NOTE: &str = "human.note";
pub const CONTEXT_EDITED: &str = "context.edited";
/// A human's edit of task.yaml (title, goal, milestone or roster notes) was applied.
pub const TASK_EDITED: &str = "task.edited";

pub const AGENT_STARTED: &str = "agent.started";
pub const AGENT_COMPLETED: &str = "agent.completed";
pub const AGENT_FAILED: &str = "agent.failed";
/// One attempt of one LLM request (the `agents::Attempt` fields: attempt, max_attempts,
/// endpoint, elapsed_ms, outcome, and on failure kind/status/message/will_retry/retry_in_ms).
pub const LLM_ATTEMPT: &str = "llm.attempt";
/// An external agent's turn ended asking a human (state `awaiting`).
pub const AGENT_AWAITING: &str = "agent.awaiting";

// Sandbox runs.
pub const SANDBOX_START: &str = "sandbox_start";
pub const SANDBOX_COMPLETE: &str = "sandbox_complete";
pub const SANDBOX_FAILED: &str = "sandbox_failed";

/// The orchestrator's side of the ingest hook (the ingest service appends its own `ingest.*`
/// events); only written when the call itself failed (fail-open).
pub const INGEST_HOOK_FAILED: &str = "ingest.hook_failed";
/// Warning: some code blocks of a node's document were not written (rejected or skipped).
pub const INGEST_INCOMPLETE: &str = "ingest.incomplete";

pub const DELIVERY_COMPLETED: &str = "deliver.completed";

/// Warning: folding the run's log left out a stored event whose identity may not emit its
/// type (`ignored_seq`, `ignored_type`, `ignored_identity`); recorded once per such event.
pub const RECORDS_EVENT_IGNORED: &str = "records.event_ignored";
/// A running node went longer than its stall limit without any event of its run (the
/// orchestrator's watchdog; `nodes`, `silent_s`, `policy`).
pub const RUN_STALLED: &str = "run.stalled";

/// A replay left its records at a node and went on live (`live_after`): `attempt`, `why`
/// (`request`: it differs from the recorded one; `missing`: no record; `sandbox`: the step's
/// request differs), `turn`, `step` and `diff` (recorded first).
pub const REPLAY_LIVE: &str = "replay.live";

// Sessions of session-holding nodes (code_delivery).
/// A checkpoint of a node's sandbox session was stored: `session_id`, `snapshot` (its store
/// path), `bytes`, `sha256`, `memory`, `n`, `step`, `runner`, `git_commit`, `ms`. The run
/// keeps the last as the node's `snapshot` (what `rework --from-snapshot` starts from).
pub const SESSION_CHECKPOINTED: &str = "session.checkpointed";
/// Warning: a due checkpoint was not taken (`session_id`, `error`); the work goes on, and a
/// failover would use the previous one.
pub const SESSION_CHECKPOINT_FAILED: &str = "session.checkpoint_failed";
/// A node whose session's runner was lost goes on in a session resumed from its last
/// checkpoint: `snapshot`, `session_id` (the new one), `runner`, `previous_session_id`,
/// `previous_runner`, `error` (how the old one was lost), `step` (of the checkpoint),
/// `turns_undone`, `ms`, `cause` (`failover`; `idle` after a `session.paused`, with
/// `paused_ms` and no `error`; `rework` for a reworked attempt started from a snapshot).
pub const SESSION_RESUMED: &str = "session.resumed";
/// A node's session, idle past `pause_after_ms` while the model answered, was checkpointed
/// and closed, so it holds no sandbox while it waits: `session_id`, `snapshot`, `step`,
/// `runner`, `idle_ms`, `ms`. A `session.resumed` with `cause: idle` follows when work goes on.
pub const SESSION_PAUSED: &str = "session.paused";
/// Warning: an idle session could not be paused (`session_id`, `error`); it stays open.
pub const SESSION_PAUSE_FAILED: &str = "session.pause_failed";

/// Events that end a run (WatchRun stops after one unless asked to follow).
pub fn is_final(kind: &str) -> bool {
    matches!(kind, TASK_COMPLETED | TASK_FAILED | TASK_CANCELED)
}

/// An event before the store gives it a sequence number.
#[derive(Clone, Debug, PartialEq)]
pub struct Ev {
    pub kind: &'static str,
    pub node: String,
    pub level: Level,
    pub data: Map<String, Value>,
}

impl Ev {
    pub fn new(kind: &'static str, node: &str) -> Ev {
        Ev {
            kind,
            node: node.to_owned(),
            // A failed run is an error wherever it is read (logs, console, watchers).
            level: if kind == TASK_FAILED {
                Level::Error
            } else {
                Level::Info
            },
            data: Map::new(),
        }
    }

    pub fn run(kind: &'static str) -> Ev {
        Ev::new(kind, "")
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Ev {
        self.data.insert(key.to_owned(), value.into());
        self
    }

    pub fn level(mut self, level: Level) -> Ev {
        self.level = level;
        self
    }

    pub fn to_input(&self) -> EventInput {
        EventInput {
            r#type: self.kind.to_owned(),
            node_id: self.node.clone(),
            level: self.level as i32,
            data_json: Value::Object(self.data.clone()).to_string(),
        }
    }
}

/// Now as RFC 3339 UTC with milliseconds (common.proto timestamp convention).
pub fn now() -> String {
    let t = time::OffsetDateTime::now_utc();
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    t.format(&fmt).unwrap_or_default()
}
