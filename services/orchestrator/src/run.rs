//! The state of one run as folded from its events. `apply` is the single transition function:
//! the scheduler changes a run only by emitting events and applying them, and a restarted
//! orchestrator rebuilds the same state by applying the stored events; so task.yaml and
//! state.json (rendered from this state) always match the events they were rendered from.

use std::collections::HashMap;

use cairn_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use cairn_graph::{Graph, NodeKind};
use cairn_node::events::{self as ev, Ev};
use cairn_node::SnapshotRef;

/// Task states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskState {
    Created,
    Working,
    InputRequired,
    Completed,
    Failed,
    Canceled,
}

impl TaskState {
    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Canceled
        )
    }
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Created => "created",
            TaskState::Working => "working",
            TaskState::InputRequired => "input-required",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
        }
    }
    pub fn to_proto(self) -> pb::TaskState {
        match self {
            TaskState::Created => pb::TaskState::Created,
            TaskState::Working => pb::TaskState::Working,
            TaskState::InputRequired => pb::TaskState::InputRequired,
            TaskState::Completed => pb::TaskState::Completed,
            TaskState::Failed => pb::TaskState::Failed,
            TaskState::Canceled => pb::TaskState::Canceled,
        }
    }
    pub fn from_proto(s: pb::TaskState) -> Option<TaskState> {
        Some(match s {
            pb::TaskState::Unspecified => return None,
            pb::TaskState::Created => TaskState::Created,
            pb::TaskState::Working => TaskState::Working,
            pb::TaskState::InputRequired => TaskState::InputRequired,
            pb::TaskState::Completed => TaskState::Completed,
            pb::TaskState::Failed => TaskState::Failed,
            pb::TaskState::Canceled => TaskState::Canceled,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Pending,
    Running,
    Succeeded,
    Failed,
    Skipped,
    Canceled,
    Blocked,
}

impl NodeState {
    pub fn is_done(self) -> bool {
        matches!(self, NodeState::Succeeded | NodeState::Skipped)
    }
    /// Milestone state words in task.yaml (done/working).
    pub fn milestone(self) -> &'static str {
        match self {
            NodeState::Pending => "pending",
            NodeState::Running => "working",
            NodeState::Succeeded => "done",
            NodeState::Failed => "failed",
            NodeState::Skipped => "skipped",
            NodeState::Canceled => "canceled",
            NodeState::Blocked => "blocked",
        }
    }
    pub fn to_proto(self) -> pb::NodeState {
        match self {
            NodeState::Pending => pb::NodeState::Pending,
            NodeState::Running => pb::NodeState::Running,
            NodeState::Succeeded => pb::NodeState::Succeeded,
            NodeState::Failed => pb::NodeState::Failed,
            NodeState::Skipped => pb::NodeState::Skipped,
            NodeState::Canceled => pb::NodeState::Canceled,
            NodeState::Blocked => pb::NodeState::Blocked,
        }
    }
}

pub use cairn_node::gate::{GateRecord, GateState};

/// One map item (`<map>.<index>`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemRecord {
    pub state: NodeState,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub resets: u32,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub outputs: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The step its latest attempt performed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepRecord>,
}

/// The step an attempt performs: its key stays the same when the attempt is delivered again
/// because its driver went away mid-way (a failover, a restart), and `redelivery` counts those.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub key: String,
    #[serde(default)]
    pub redelivery: u32,
    /// The attempt was running when its driver went away: the next start delivers it again.
    #[serde(default)]
    pub interrupted: bool,
}

impl StepRecord {
    fn from_started(d: &Map<String, Value>) -> Option<StepRecord> {
        Some(StepRecord {
            key: text(d, "step_key")?,
            redelivery: d.get("redelivery").and_then(Value::as_u64).unwrap_or(0) as u32,
            interrupted: false,
        })
    }

    /// The key and redelivery count of the next start, when it delivers this step again.
    pub fn redelivered(step: Option<&StepRecord>) -> Option<(String, u32)> {
        step.filter(|s| s.interrupted)
            .map(|s| (s.key.clone(), s.redelivery + 1))
    }
}

/// Marks the step of an attempt that was running as interrupted (a resume), or of one that
/// ended as done with (the next start is a new step).
fn end_step(step: &mut Option<StepRecord>, running: bool) {
    if let Some(s) = step.as_mut() {
        s.interrupted = running;
    }
}

impl ItemRecord {
    fn pending() -> ItemRecord {
        ItemRecord {
            state: NodeState::Pending,
            attempts: 0,
            resets: 0,
            outputs: Value::Null,
            error: None,
            step: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MapItems {
    /// The items when they did not come from the graph (recorded so a resume sees the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<Vec<Value>>,
    pub records: Vec<ItemRecord>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub state: NodeState,
    pub attempts: u32,
    /// 1 + reworks requested for this node (the agent turn).
    pub turn: u32,
    /// Times this node was reset to run again (rework, interrupted attempt, resumed failure):
    /// a reset node may overwrite what its earlier attempt wrote.
    pub resets: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub outputs: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<MapItems>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateRecord>,
    /// A human's note on this milestone (task.yaml `milestones[].note`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The step its latest attempt performed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepRecord>,
    /// The last session snapshot it took (a code_delivery checkpoint or pause).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotRef>,
    /// The snapshot a rework asked its next attempts to start their session from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_from: Option<SnapshotRef>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RosterEntry {
    pub instance: String,
    pub agent: String,
    /// working | awaiting | dormant
    pub state: String,
    pub node: String,
    /// A human's note on this agent (task.yaml `roster[].note`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub run_id: String,
    pub project: String,
    pub title: String,
    pub goal: String,
    pub topology: String,
    /// The provider spec agent nodes use (resolved at submit).
    pub llm: String,
    pub state: TaskState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub created_by: String,
    /// The run this one re-runs (task.created `rerun_of`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rerun_of: String,
    /// The run this one replays from its records (task.created `replay_of`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub replay_of: String,
    /// W3C traceparent of the run's latest life (task.created or task.resumed `traceparent`):
    /// the trace a run taken over later links to.
    #[serde(skip)]
    pub trace: String,
    pub nodes: Vec<NodeRecord>,
    pub roster: Vec<RosterEntry>,
    pub notes: u32,
    /// Highest event sequence number folded in (0 when only live events were applied).
    pub last_seq: u64,
    /// When the watchdog reported the run stalled (`run.stalled`), until its next node or
    /// task event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_since: Option<String>,
    /// Stored events the fold left out, not yet reported by a `records.event_ignored`.
    #[serde(skip)]
    pub ignored: Vec<Ignored>,
    #[serde(skip)]
    index: HashMap<String, usize>,
    #[serde(skip)]
    gate_nodes: Vec<usize>,
}

/// A stored event the fold left out: its `identity` may not emit its type (an ingest that
/// appended `gate.approved` before the store checked event types).
#[derive(Clone, Debug, PartialEq)]
pub struct Ignored {
    pub seq: u64,
    pub kind: String,
    pub identity: String,
}

impl Ignored {
    /// The warning that reports it.
    pub fn event(&self) -> Ev {
        Ev::run(ev::RECORDS_EVENT_IGNORED)
            .level(pb::Level::Warning)
            .with("ignored_seq", self.seq)
            .with("ignored_type", self.kind.as_str())
            .with("ignored_identity", self.identity.as_str())
            .with("rule", cairn_server::events::rule(&self.identity))
    }
}

/// An event as the fold sees it (stored, or live before its sequence number is known).
pub struct EventView<'a> {
    pub seq: u64,
    pub ts: &'a str,
    pub kind: &'a str,
    pub node: &'a str,
    pub data: &'a Map<String, Value>,
}

impl<'a> EventView<'a> {
    pub fn live(e: &'a Ev, ts: &'a str) -> EventView<'a> {
        EventView {
            seq: 0,
            ts,
            kind: e.kind,
            node: &e.node,
            data: &e.data,
        }
    }
}

fn text(data: &Map<String, Value>, key: &str) -> Option<String> {
    data.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// `<map>.<index>` → (map, index).
pub fn split_item(node: &str) -> Option<(&str, usize)> {
    let (map, index) = node.rsplit_once('.')?;
    Some((map, index.parse().ok()?))
}

impl RunState {
    /// A fresh run for `graph` (before task.created is applied).
    pub fn new(project: &str, graph: &Graph) -> RunState {
        let nodes: Vec<NodeRecord> = graph
            .nodes
            .iter()
            .map(|n| NodeRecord {
                id: n.id.clone(),
                kind: n.kind.type_name().into(),
                title: n.title.clone().unwrap_or_else(|| n.id.clone()),
                state: NodeState::Pending,
                attempts: 0,
                turn: 1,
                resets: 0,
                started_at: None,
                finished_at: None,
                error: None,
                skip_reason: None,
                outputs: Value::Null,
                items: None,
                // External agents ask a human mid-way: their approvals are the node's gate.
                gate: matches!(n.kind, NodeKind::Gate(_) | NodeKind::ExternalAgent(_)).then(|| {
                    GateRecord {
                        state: GateState::Open,
                        reason: None,
                        decided_by: None,
                        decided_at: None,
                        note: None,
                        note_ref: None,
                    }
                }),
                note: None,
                step: None,
                snapshot: None,
                start_from: None,
            })
            .collect();
        let index = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.clone(), i))
            .collect();
        let gate_nodes = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.gate.is_some())
            .map(|(i, _)| i)
            .collect();
        RunState {
            run_id: graph.run_id.clone(),
            project: project.to_owned(),
            title: graph.title.clone(),
            goal: graph.goal.clone(),
            topology: graph.topology.clone(),
            llm: String::new(),
            state: TaskState::Created,
            error: None,
            created_at: String::new(),
            updated_at: String::new(),
            created_by: String::new(),
            rerun_of: String::new(),
            replay_of: String::new(),
            trace: String::new(),
            nodes,
            roster: Vec::new(),
            notes: 0,
            last_seq: 0,
            stalled_since: None,
            ignored: Vec::new(),
            index,
            gate_nodes,
        }
    }

    pub fn node(&self, id: &str) -> Option<&NodeRecord> {
        self.index.get(id).map(|&i| &self.nodes[i])
    }

    pub fn node_mut(&mut self, id: &str) -> Option<&mut NodeRecord> {
        self.index.get(id).map(|&i| &mut self.nodes[i])
    }

    pub fn item(&self, map: &str, index: usize) -> Option<&ItemRecord> {
        self.node(map)?.items.as_ref()?.records.get(index)
    }

    /// Gates currently waiting for a human.
    /// A run that ended leaves no gate waiting: blocked gates become canceled (a resume
    /// reopens them).
    fn end_waiting_gates(&mut self) {
        for n in &mut self.nodes {
            if let Some(g) = n.gate.as_mut().filter(|g| g.state == GateState::Blocked) {
                g.state = GateState::Canceled;
                if n.state == NodeState::Blocked {
                    n.state = NodeState::Canceled;
                }
            }
        }
    }

    pub fn blocked_gates(&self) -> impl Iterator<Item = &NodeRecord> {
        self.gate_nodes.iter().map(|&i| &self.nodes[i]).filter(|n| {
            n.gate
                .as_ref()
                .is_some_and(|g| g.state == GateState::Blocked)
        })
    }

    /// Applies one event (the only state transition function).
    pub fn apply(&mut self, e: &EventView<'_>) {
        if e.seq > self.last_seq {
            self.last_seq = e.seq;
        }
        if !e.ts.is_empty() {
            self.updated_at = e.ts.to_owned();
        }
        let d = e.data;
        if e.kind == ev::RUN_STALLED {
            if self.stalled_since.is_none() {
                self.stalled_since = Some(e.ts.to_owned());
            }
        } else if !e.node.is_empty() || e.kind.starts_with("task.") {
            self.stalled_since = None;
        }
        match e.kind {
            ev::TASK_CREATED => {
                self.state = TaskState::Created;
                self.created_at = e.ts.to_owned();
                if let Some(t) = text(d, "title") {
                    self.title = t;
                }
                self.created_by = text(d, "by").unwrap_or_default();
                self.llm = text(d, "llm").unwrap_or_default();
                self.rerun_of = text(d, "rerun_of").unwrap_or_default();
                self.replay_of = text(d, "replay_of").unwrap_or_default();
                self.trace = text(d, "traceparent").unwrap_or_default();
            }
            ev::TASK_WORKING => {
                self.state = TaskState::Working;
                self.error = None;
            }
            ev::TASK_INPUT_REQUIRED => self.state = TaskState::InputRequired,
            ev::TASK_COMPLETED => self.state = TaskState::Completed,
            ev::TASK_FAILED => {
                self.state = TaskState::Failed;
                self.error = text(d, "error");
                self.end_waiting_gates();
            }
            ev::TASK_CANCELED => {
                self.state = TaskState::Canceled;
                self.error = text(d, "reason")
                    .filter(|r| !r.is_empty())
                    .or(Some("canceled".into()));
                self.end_waiting_gates();
            }
            ev::TASK_RESUMED => {
                self.state = TaskState::Working;
                self.error = None;
                if let Some(t) = text(d, "traceparent") {
                    self.trace = t;
                }
                for n in &mut self.nodes {
                    if let Some(g) = n.gate.as_mut().filter(|g| g.state == GateState::Canceled) {
                        g.state = GateState::Open;
                    }
                    if matches!(
                        n.state,
                        NodeState::Running | NodeState::Failed | NodeState::Canceled
                    ) {
                        end_step(&mut n.step, n.state == NodeState::Running);
                        n.state = NodeState::Pending;
                        n.resets += 1;
                    }
                    if let Some(items) = &mut n.items {
                        for it in &mut items.records {
                            if matches!(
                                it.state,
                                NodeState::Running | NodeState::Failed | NodeState::Canceled
                            ) {
                                end_step(&mut it.step, it.state == NodeState::Running);
                                it.state = NodeState::Pending;
                                it.resets += 1;
                            }
                        }
                    }
                }
            }
            ev::NODE_STARTED
            | ev::NODE_COMPLETED
            | ev::NODE_FAILED
            | ev::NODE_SKIPPED
            | ev::NODE_CANCELED => self.apply_node(e),
            ev::MAP_ITEMS => {
                if let Some(n) = self.node_mut(e.node) {
                    let count = d.get("count").and_then(Value::as_u64).unwrap_or(0) as usize;
                    let list = d.get("items").and_then(Value::as_array).cloned();
                    n.items = Some(MapItems {
                        list,
                        records: vec![ItemRecord::pending(); count],
                    });
                }
            }
            ev::GATE_BLOCKED => {
                if let Some(n) = self.node_mut(e.node) {
                    n.state = NodeState::Blocked;
                    if let Some(g) = &mut n.gate {
                        g.state = GateState::Blocked;
                        g.reason = text(d, "reason");
                    }
                }
            }
            ev::GATE_APPROVED | ev::GATE_REJECTED => {
                if let Some(n) = self.node_mut(e.node) {
                    // A node that blocked mid-way (external agent) runs again after a decision.
                    if n.kind != "gate" && n.state == NodeState::Blocked {
                        n.state = NodeState::Pending;
                    }
                    if let Some(g) = &mut n.gate {
                        g.state = if e.kind == ev::GATE_APPROVED {
                            GateState::Approved
                        } else {
                            GateState::Rejected
                        };
                        g.decided_by = text(d, "by");
                        g.decided_at = Some(e.ts.to_owned());
                        g.note = text(d, "note");
                        g.note_ref = text(d, "note_ref");
                    }
                }
            }
            ev::REWORK_REQUESTED => {
                let target = text(d, "target").unwrap_or_default();
                let nodes: Vec<String> = d
                    .get("nodes")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let from: Option<SnapshotRef> = d
                    .get("from_snapshot")
                    .and_then(|v| serde_json::from_value(v.clone()).ok());
                for id in nodes {
                    if let Some(n) = self.node_mut(&id) {
                        n.start_from = if id == target { from.clone() } else { None };
                        n.state = NodeState::Pending;
                        n.resets += 1;
                        n.step = None;
                        n.outputs = Value::Null;
                        n.error = None;
                        n.skip_reason = None;
                        n.items = None;
                        n.finished_at = None;
                        if id == target {
                            n.turn += 1;
                        }
                        if let Some(g) = &mut n.gate {
                            *g = GateRecord {
                                state: GateState::Open,
                                reason: None,
                                decided_by: None,
                                decided_at: None,
                                note: None,
                                note_ref: None,
                            };
                        }
                    }
                }
                if self.state != TaskState::Canceled {
                    self.state = TaskState::Working;
                    self.error = None;
                }
            }
            ev::HUMAN_NOTE => self.notes += 1,
            ev::SESSION_CHECKPOINTED => {
                if let (Some(taken), Some(n)) = (SnapshotRef::from_event(d), self.node_mut(e.node))
                {
                    n.snapshot = Some(taken);
                }
            }
            ev::TASK_EDITED => crate::task_edits::apply(self, d),
            ev::AGENT_STARTED | ev::AGENT_COMPLETED | ev::AGENT_FAILED | ev::AGENT_AWAITING => {
                let instance = text(d, "agent_instance").unwrap_or_else(|| e.node.to_owned());
                let state = match e.kind {
                    ev::AGENT_STARTED => "working",
                    ev::AGENT_AWAITING => "awaiting",
                    _ => "dormant",
                };
                match self.roster.iter_mut().find(|r| r.instance == instance) {
                    Some(r) => r.state = state.into(),
                    None => self.roster.push(RosterEntry {
                        agent: text(d, "agent").unwrap_or_else(|| instance.clone()),
                        instance,
                        state: state.into(),
                        node: e.node.to_owned(),
                        note: None,
                    }),
                }
            }
            _ => {}
        }
    }

    fn apply_node(&mut self, e: &EventView<'_>) {
        let d = e.data;
        if let Some((map, index)) = split_item(e.node) {
            let Some(items) = self.node_mut(map).and_then(|n| n.items.as_mut()) else {
                return;
            };
            let Some(it) = items.records.get_mut(index) else {
                return;
            };
            if e.kind != ev::NODE_STARTED {
                end_step(&mut it.step, false);
            }
            match e.kind {
                ev::NODE_STARTED => {
                    it.state = NodeState::Running;
                    it.attempts = d.get("attempt").and_then(Value::as_u64).unwrap_or(1) as u32;
                    it.step = StepRecord::from_started(d);
                }
                ev::NODE_COMPLETED => {
                    it.state = NodeState::Succeeded;
                    it.outputs = d.get("outputs").cloned().unwrap_or(Value::Null);
                    it.error = None;
                }
                ev::NODE_FAILED => {
                    let retry = d
                        .get("will_retry")
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    it.state = if retry {
                        NodeState::Pending
                    } else {
                        NodeState::Failed
                    };
                    it.error = text(d, "error");
                }
                ev::NODE_SKIPPED => it.state = NodeState::Skipped,
                _ => it.state = NodeState::Canceled,
            }
            return;
        }
        let Some(n) = self.node_mut(e.node) else {
            return;
        };
        if e.kind != ev::NODE_STARTED {
            end_step(&mut n.step, false);
        }
        match e.kind {
            ev::NODE_STARTED => {
                n.state = NodeState::Running;
                n.attempts = d.get("attempt").and_then(Value::as_u64).unwrap_or(1) as u32;
                n.step = StepRecord::from_started(d);
                n.started_at = Some(e.ts.to_owned());
                n.error = None;
            }
            ev::NODE_COMPLETED => {
                n.state = NodeState::Succeeded;
                n.outputs = d.get("outputs").cloned().unwrap_or(Value::Null);
                n.finished_at = Some(e.ts.to_owned());
                n.error = None;
            }
            ev::NODE_FAILED => {
                let retry = d
                    .get("will_retry")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                n.state = if retry {
                    NodeState::Pending
                } else {
                    NodeState::Failed
                };
                n.error = text(d, "error");
                if !retry {
                    n.finished_at = Some(e.ts.to_owned());
                }
            }
            ev::NODE_SKIPPED => {
                n.state = NodeState::Skipped;
                n.skip_reason = text(d, "reason");
                n.finished_at = Some(e.ts.to_owned());
            }
            _ => {
                n.state = NodeState::Canceled;
                n.finished_at = Some(e.ts.to_owned());
            }
        }
    }

    /// Folds stored events (resume, GetRun of a run not in memory). An event whose stored
    /// `identity` may not emit its type is left out (defence in depth for logs written before
    /// the store checked types) and kept in `ignored` until a `records.event_ignored` names it.
    pub fn apply_stored(&mut self, events: &[pb::Event]) {
        let empty = Map::new();
        let mut reported = std::collections::HashSet::new();
        for e in events {
            let data: Map<String, Value> = serde_json::from_str(&e.data_json).unwrap_or_default();
            let identity = data.get("identity").and_then(Value::as_str);
            if !cairn_server::events::may_emit(identity, &e.r#type) {
                self.last_seq = self.last_seq.max(e.seq);
                self.ignored.push(Ignored {
                    seq: e.seq,
                    kind: e.r#type.clone(),
                    identity: identity.unwrap_or_default().to_owned(),
                });
                continue;
            }
            if e.r#type == ev::RECORDS_EVENT_IGNORED {
                reported.extend(data.get("ignored_seq").and_then(Value::as_u64));
            }
            let view = EventView {
                seq: e.seq,
                ts: &e.ts,
                kind: &e.r#type,
                node: &e.node_id,
                data: if data.is_empty() { &empty } else { &data },
            };
            self.apply(&view);
        }
        self.ignored.retain(|i| !reported.contains(&i.seq));
    }

    /// The RunInfo message.
    pub fn to_info(&self, run_dir: &str) -> pb::RunInfo {
        let nodes = self
            .nodes
            .iter()
            .map(|n| pb::NodeInfo {
                id: n.id.clone(),
                r#type: n.kind.clone(),
                state: n.state.to_proto() as i32,
                attempts: n.attempts,
                started_at: n.started_at.clone().unwrap_or_default(),
                finished_at: n.finished_at.clone().unwrap_or_default(),
                error: n.error.clone().unwrap_or_default(),
                outputs_json: if n.outputs.is_null() {
                    String::new()
                } else {
                    n.outputs.to_string()
                },
            })
            .collect();
        let gates = self
            .nodes
            .iter()
            .filter_map(|n| {
                let g = n.gate.as_ref()?;
                Some(pb::GateInfo {
                    id: n.id.clone(),
                    state: g.state.to_proto() as i32,
                    reason: g.reason.clone().unwrap_or_default(),
                    decided_by: g.decided_by.clone().unwrap_or_default(),
                    note: g.note.clone().unwrap_or_default(),
                    decided_at: g.decided_at.clone().unwrap_or_default(),
                })
            })
            .collect();
        pb::RunInfo {
            run_id: self.run_id.clone(),
            project_id: self.project.clone(),
            title: self.title.clone(),
            state: self.state.to_proto() as i32,
            created_at: self.created_at.clone(),
            updated_at: self.updated_at.clone(),
            nodes,
            gates,
            run_dir: run_dir.to_owned(),
            error: self.error.clone().unwrap_or_default(),
            blocks_not_written: self.blocks_not_written(),
            goal: self.goal.clone(),
            rerun_of: self.rerun_of.clone(),
            replay_of: self.replay_of.clone(),
            replica: String::new(),
            stalled_since: self.stalled_since.clone().unwrap_or_default(),
        }
    }

    /// Code blocks that the ingests of the nodes' (and map items') latest attempts did not
    /// write.
    pub fn blocks_not_written(&self) -> u32 {
        fn of(outputs: &Value) -> u32 {
            let count = |k: &str| {
                outputs
                    .pointer(&format!("/ingest/{k}"))
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
            };
            u32::try_from(count("skipped") + count("rejected")).unwrap_or(u32::MAX)
        }
        self.nodes
            .iter()
            .map(|n| {
                let items = n
                    .items
                    .as_ref()
                    .map_or(0, |m| m.records.iter().map(|r| of(&r.outputs)).sum::<u32>());
                of(&n.outputs).saturating_add(items)
            })
            .fold(0u32, u32::saturating_add)
    }

    /// Rebuilds the id index after deserialising (state.json).
    pub fn reindex(&mut self) {
        self.index = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.clone(), i))
            .collect();
        self.gate_nodes = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.gate.is_some())
            .map(|(i, _)| i)
            .collect();
    }
}

#[cfg(test)]
mod step_tests {
    use super::*;
    use serde_json::json;

    fn apply(state: &mut RunState, kind: &str, node: &str, data: Value) {
        let data = data.as_object().cloned().unwrap_or_default();
        state.apply(&EventView {
            seq: state.last_seq + 1,
            ts: "",
            kind,
            node,
            data: &data,
        });
    }

    fn step(state: &RunState) -> Option<(String, u32)> {
        StepRecord::redelivered(state.node("a").and_then(|n| n.step.as_ref()))
    }

    /// Only an attempt that was running when its driver went away is delivered again; a retry
    /// after a failure, a rework or a finished attempt starts a new step.
    #[test]
    fn a_step_is_redelivered_only_after_an_interruption() {
        let graph = cairn_graph::Graph::from_yaml(
            "nodes:\n  - {id: a, type: write_file, path: docs/a.txt, content: a}\n",
            "r1",
            &Default::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut s = RunState::new("p", &graph);
        let started = |key: &str, n: u32| json!({"attempt": 1, "step_key": key, "redelivery": n});
        apply(&mut s, ev::NODE_STARTED, "a", started("r1/a/1", 0));
        assert_eq!(step(&s), None, "running, not interrupted");
        // The driver went away: the resume delivers r1/a/1 again.
        apply(&mut s, ev::TASK_RESUMED, "", json!({}));
        assert_eq!(step(&s), Some(("r1/a/1".into(), 1)));
        apply(&mut s, ev::NODE_STARTED, "a", started("r1/a/1", 1));
        apply(&mut s, ev::TASK_RESUMED, "", json!({}));
        assert_eq!(step(&s), Some(("r1/a/1".into(), 2)), "counted on");
        // A failure ends the step: a resume of a failed node starts a new one.
        apply(&mut s, ev::NODE_STARTED, "a", started("r1/a/1", 2));
        apply(&mut s, ev::NODE_FAILED, "a", json!({"will_retry": true}));
        assert_eq!(step(&s), None);
        apply(&mut s, ev::NODE_STARTED, "a", started("r1/a/2", 0));
        apply(&mut s, ev::NODE_FAILED, "a", json!({}));
        apply(&mut s, ev::TASK_RESUMED, "", json!({}));
        assert_eq!(
            step(&s),
            None,
            "a failed attempt is retried, not redelivered"
        );
        // A rework is a new step even when it caught the attempt running.
        apply(&mut s, ev::NODE_STARTED, "a", started("r1/a/3", 0));
        apply(
            &mut s,
            ev::REWORK_REQUESTED,
            "",
            json!({"target": "a", "nodes": ["a"]}),
        );
        assert_eq!(step(&s), None);
    }
}
