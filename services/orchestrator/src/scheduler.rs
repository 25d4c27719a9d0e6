//! The scheduler: one driver task per live run. It owns the run's `RunState` and changes it
//! only by emitting events (applied, then queued on the run's recorder), starts nodes whose
//! needs are done, bounded by `max_parallel`, retries failed attempts with exponential backoff
//! and jitter, enforces per-node deadlines, blocks at gates, and obeys human commands.
//!
//! Durability (issue item 4): before a node with effects starts, everything recorded so far is
//! flushed (one AppendEvents per scheduling step, group-committed), so a completion is durable
//! before anything that depends on it runs. Pure nodes (`condition`) run inline and are
//! committed with the next batch: redoing one after a crash touches nothing but the records.
//!
//! Cancellation: every node task runs under a child of the run's token; cancelling drops the
//! task's future, which aborts its gRPC calls (a sandbox run is stopped by the runner when its
//! call goes away).
//!
//! The commands of the outside world (gate decisions, rework, cancel, recorded human events) are
//! commands.rs; a map node's items are maps.rs; the watchdog of the run's progress (a node
//! silent past its stall limit) is watchdog.rs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::v1 as pb;
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::gates::Decision;
use crate::nodes::{self, Backends, NodeCtx, NodeError, NodeSuccess, Progress, Scope, TaskMsg};
use crate::recorder::Recorder;
use crate::run::{EventView, NodeState, RunState, TaskState};
use crate::rundir::{RunDir, Snapshots};
use cairn_graph::{ErrorKind, Graph, Node, NodeKind, Trigger};
use cairn_node::events::{self as ev, now, Ev};

mod commands;
mod maps;
mod watchdog;

/// Extra time a sandbox node gets beyond its program's `timeout_s` (staging and outputs).
const SANDBOX_GRACE: Duration = Duration::from_secs(60);

/// What the outside world asks a live run.
pub enum Command {
    Info(oneshot::Sender<pb::RunInfo>),
    Decide {
        gate: String,
        decision: Decision,
        by: String,
        note: String,
        note_ref: Option<String>,
        /// When it was made (a replay's: when the recorded one was).
        at: String,
        /// A replay's recorded decision.
        recorded: Option<crate::gates::Recorded>,
        reply: oneshot::Sender<Result<pb::RunInfo>>,
    },
    Rework {
        node: String,
        by: String,
        note: String,
        note_ref: Option<String>,
        /// Start the node's session from its last snapshot.
        from_snapshot: bool,
        reply: oneshot::Sender<Result<pb::RunInfo>>,
    },
    Cancel {
        by: String,
        reason: String,
        reply: oneshot::Sender<Result<pb::RunInfo>>,
    },
    /// Records a human event (note, context edit) in order with the run's own events.
    Record {
        event: Ev,
        reply: oneshot::Sender<Result<u64>>,
    },
}

/// Everything a driver starts from.
pub struct Launch {
    pub backends: Arc<Backends>,
    pub graph: Arc<Graph>,
    pub state: RunState,
    pub recorder: Recorder,
    pub permits: Arc<Semaphore>,
    pub shutdown: CancellationToken,
    /// Picked up again from records: (by, reason) for task.resumed.
    pub resume: Option<(String, String)>,
    /// A command handled before the first scheduling step (rework of a finished run).
    pub initial: Option<Command>,
    /// Called once the driver has stopped (final state reached, or shutdown).
    pub on_exit: Box<dyn FnOnce() + Send>,
    /// The run's command line (its sender is registered before the driver starts, so
    /// commands sent meanwhile wait in order).
    pub cmds: mpsc::Receiver<Command>,
}

/// Capacity of a run's command line.
pub const COMMAND_QUEUE: usize = 64;

pub fn launch(l: Launch) -> tokio::task::JoinHandle<()> {
    let rx = l.cmds;
    let project = l.state.project.clone();
    let snaps = Snapshots::start(l.backends.store.clone(), project, l.recorder.clone());
    let (ttx, trx) = mpsc::unbounded_channel();
    let max_parallel = l
        .graph
        .max_parallel
        .map(|m| (m as usize).clamp(1, l.backends.config.max_parallel_nodes))
        .unwrap_or(l.backends.config.max_parallel_nodes);
    let driver = Driver {
        run_dir: RunDir::new(&l.state.run_id).root().to_owned(),
        b: l.backends,
        graph: l.graph,
        state: l.state,
        rec: l.recorder,
        snaps,
        cmds: rx,
        tasks_tx: ttx,
        tasks_rx: trx,
        running: HashMap::new(),
        task_ids: HashMap::new(),
        next_task: 1,
        running_nodes: 0,
        ready: BTreeSet::new(),
        retry_at: BTreeMap::new(),
        waiting_retry: HashSet::new(),
        tries: HashMap::new(),
        maps: HashMap::new(),
        failing: None,
        canceling: None,
        cancel_replies: Vec::new(),
        children: CancellationToken::new(),
        shutdown: l.shutdown,
        permits: l.permits,
        permit: None,
        max_parallel,
        must_flush_to: 0,
        dirty: false,
        state_changed: false,
        last_snapshot: Instant::now(),
        snapshot_every: Duration::from_millis(0),
        last_event: Instant::now(),
        stall_reported: false,
    };
    let on_exit = l.on_exit;
    let resume = l.resume;
    let initial = l.initial;
    // In the run's span (runs.rs `run_span`): node spans are its children.
    tokio::spawn(tracing::Instrument::in_current_span(async move {
        driver.run(resume, initial).await;
        on_exit();
    }))
}

struct Running {
    task: u64,
    cancel: CancellationToken,
    canceled: bool,
    /// The attempt's deadline (the watchdog's limit derives from it).
    deadline: Duration,
    /// Stopped by the watchdog (`stall_policy = "retry"`): its end is a failed attempt that
    /// runs again at once.
    stall_retry: bool,
}

/// A map whose items are being worked through.
struct MapRun {
    items: Arc<Vec<Value>>,
    pending: VecDeque<usize>,
    running: usize,
    parallelism: usize,
}

struct Driver {
    b: Arc<Backends>,
    graph: Arc<Graph>,
    state: RunState,
    rec: Recorder,
    snaps: Snapshots,
    run_dir: String,
    cmds: mpsc::Receiver<Command>,
    tasks_tx: mpsc::UnboundedSender<TaskMsg>,
    tasks_rx: mpsc::UnboundedReceiver<TaskMsg>,
    /// Running attempts by node or item id.
    running: HashMap<String, Running>,
    task_ids: HashMap<u64, String>,
    next_task: u64,
    /// Running attempts of graph nodes (not map items): bounded by max_parallel.
    running_nodes: usize,
    /// Graph positions of pending nodes whose needs are done.
    ready: BTreeSet<usize>,
    retry_at: BTreeMap<(Instant, u64), String>,
    waiting_retry: HashSet<String>,
    /// Attempts since the node was last reset (retry budget).
    tries: HashMap<String, u32>,
    maps: HashMap<String, MapRun>,
    failing: Option<String>,
    canceling: Option<(String, String)>,
    cancel_replies: Vec<oneshot::Sender<Result<pb::RunInfo>>>,
    children: CancellationToken,
    shutdown: CancellationToken,
    permits: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
    max_parallel: usize,
    /// Recorder position a write_file must wait for before it starts (the last completion of
    /// a node whose result would differ if redone).
    must_flush_to: u64,
    dirty: bool,
    state_changed: bool,
    last_snapshot: Instant,
    snapshot_every: Duration,
    /// When the run's last event (other than `run.stalled`) was emitted.
    last_event: Instant,
    /// The current stall was reported (until the next event).
    stall_reported: bool,
}

impl Drop for Driver {
    /// A driver that ends any way (its task aborted included) stops its node attempts.
    fn drop(&mut self) {
        self.children.cancel();
        if self.stall_reported {
            cairn_telemetry::metrics::run_stall(&self.stall_key(), false);
        }
    }
}

enum Exit {
    Final,
    Shutdown,
    RecordingFailed(String),
}

impl Driver {
    /// The run's name in the stalled-runs gauge.
    fn stall_key(&self) -> String {
        format!("{}/{}", self.state.project, self.state.run_id)
    }

    fn emit(&mut self, e: Ev) {
        self.apply(&e);
        self.rec.push(&e);
    }

    /// Folds `e` into the run's state (the caller queues it with the recorder).
    fn apply(&mut self, e: &Ev) {
        let ts = now();
        let before = (self.state.state, self.state.blocked_gates().count());
        self.state.apply(&EventView::live(e, &ts));
        self.dirty = true;
        if e.kind == ev::RUN_STALLED {
            cairn_telemetry::metrics::run_stall(&self.stall_key(), true);
        } else {
            self.last_event = Instant::now();
            if std::mem::take(&mut self.stall_reported) {
                cairn_telemetry::metrics::run_stall(&self.stall_key(), false);
            }
        }
        if self.state.state != before.0 {
            cairn_telemetry::metrics::run_entered(self.state.state.as_str());
            cairn_telemetry::metrics::run_moved(
                Some(before.0.as_str()),
                Some(self.state.state.as_str()),
            );
        }
        if (self.state.state, self.state.blocked_gates().count()) != before {
            self.state_changed = true;
        }
    }

    fn info(&self) -> pb::RunInfo {
        self.state.to_info(&self.run_dir)
    }

    fn publish(&mut self) -> u64 {
        self.dirty = false;
        self.state_changed = false;
        self.last_snapshot = Instant::now();
        self.snaps
            .publish(&self.state, &self.graph, self.rec.queued())
    }

    async fn run(mut self, resume: Option<(String, String)>, initial: Option<Command>) {
        cairn_telemetry::metrics::run_moved(None, Some(self.state.state.as_str()));
        self.snapshot_every = Duration::from_millis(self.b.config.snapshot_interval_ms.max(10));
        // Events the fold left out are reported once, by the run's driver.
        for ignored in std::mem::take(&mut self.state.ignored) {
            tracing::warn!(run_id = %self.state.run_id, seq = ignored.seq, r#type = %ignored.kind, identity = %ignored.identity, "a stored event was ignored: its identity may not emit that type");
            self.emit(ignored.event());
        }
        if let Some((by, reason)) = resume {
            let interrupted: Vec<String> = self
                .state
                .nodes
                .iter()
                .filter(|n| {
                    matches!(
                        n.state,
                        NodeState::Running | NodeState::Failed | NodeState::Canceled
                    )
                })
                .map(|n| n.id.clone())
                .collect();
            let mut resumed = Ev::run(ev::TASK_RESUMED)
                .with("by", by)
                .with("reason", reason)
                .with("reset", json!(interrupted));
            // In the run's span: the trace of this life, for a later one to link to.
            if let Some(t) = cairn_telemetry::traceparent(&tracing::Span::current()) {
                resumed = resumed.with("traceparent", t);
            }
            self.emit(resumed);
        }
        let exit = self.drive(initial).await;
        match exit {
            Exit::Final => {
                let v = self.publish();
                let _ = self.rec.flush().await;
                let mut written = self.snaps.wait_written(v, Duration::from_secs(30)).await;
                // Edits of task.yaml found while the last snapshots were written.
                let mut edited = false;
                while let Ok(edit) = self.snaps.edits.try_recv() {
                    self.emit(edit);
                    edited = true;
                }
                if edited {
                    let v = self.publish();
                    let _ = self.rec.flush().await;
                    written = self.snaps.wait_written(v, Duration::from_secs(30)).await;
                }
                if !written {
                    tracing::warn!(run_id = %self.state.run_id, "final snapshot not written in time");
                }
                let info = self.info();
                for r in self.cancel_replies.drain(..) {
                    let _ = r.send(Ok(info.clone()));
                }
            }
            Exit::Shutdown => {
                self.children.cancel();
                let v = self.publish();
                let _ = self.rec.flush().await;
                let _ = self.snaps.wait_written(v, Duration::from_secs(5)).await;
            }
            Exit::RecordingFailed(why) => {
                self.children.cancel();
                tracing::error!(run_id = %self.state.run_id, %why, "run stopped: its events cannot be recorded");
                for r in self.cancel_replies.drain(..) {
                    let _ = r.send(Err(Error::Unavailable(why.clone())));
                }
            }
        }
        cairn_telemetry::metrics::run_moved(Some(self.state.state.as_str()), None);
        // Answer whatever is still queued so no caller waits forever.
        self.cmds.close();
        while let Ok(cmd) = self.cmds.try_recv() {
            let gone = || {
                Error::FailedPrecondition(format!(
                    "run {} is no longer active ({})",
                    self.state.run_id,
                    self.state.state.as_str()
                ))
            };
            match cmd {
                Command::Info(r) => {
                    let _ = r.send(self.info());
                }
                Command::Decide { reply, .. } | Command::Rework { reply, .. } => {
                    let _ = reply.send(Err(gone()));
                }
                Command::Cancel { reply, .. } => {
                    let _ = reply.send(Ok(self.info()));
                }
                Command::Record { reply, .. } => {
                    let _ = reply.send(Err(gone()));
                }
            }
        }
    }

    /// The main loop; returns why it stopped.
    async fn drive(&mut self, initial: Option<Command>) -> Exit {
        // Wait for a run slot (max_parallel_runs); cancel and info still work meanwhile.
        if !self.acquire_permit().await {
            return Exit::Shutdown;
        }
        if let Some(c) = initial {
            self.command(c).await;
        }
        if self.canceling.is_none() && self.state.state == TaskState::Created {
            self.emit(Ev::run(ev::TASK_WORKING));
        }
        if self.state.blocked_gates().next().is_some()
            && self.state.state != TaskState::InputRequired
        {
            self.emit(Ev::run(ev::TASK_INPUT_REQUIRED));
        }
        self.refresh_all();
        loop {
            if let Err(e) = self.step().await {
                return Exit::RecordingFailed(e);
            }
            if let Some(exit) = self.finish_if_done() {
                return exit;
            }
            if self.state_changed
                || (self.dirty && self.last_snapshot.elapsed() >= self.snapshot_every)
            {
                self.publish();
            }
            if self.idle_for_human() {
                // Nothing runs until a human decides: give the run slot back.
                self.permit = None;
            }
            let next_retry = self.retry_at.keys().next().map(|(t, _)| *t);
            let snapshot_due = self.dirty.then(|| self.last_snapshot + self.snapshot_every);
            let stall_due = self.stall_due();
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Exit::Shutdown,
                msg = self.tasks_rx.recv() => {
                    if let Some(m) = msg {
                        self.task_msg(m);
                        // Take everything else that is ready: one batch, one flush.
                        while let Ok(m) = self.tasks_rx.try_recv() {
                            self.task_msg(m);
                        }
                    }
                }
                cmd = self.cmds.recv() => {
                    if let Some(c) = cmd {
                        self.command(c).await;
                    }
                }
                _ = sleep_until_opt(next_retry) => self.due_retries(),
                _ = sleep_until_opt(snapshot_due) => { self.publish(); }
                _ = sleep_until_opt(stall_due) => self.on_stall(),
                Some(edit) = self.snaps.edits.recv() => {
                    // A human's task.yaml edit: recorded, applied, and in the next snapshot.
                    self.emit(edit);
                    self.state_changed = true;
                }
            }
            if self.permit.is_none() && self.has_work() && !self.acquire_permit().await {
                return Exit::Shutdown;
            }
        }
    }

    async fn acquire_permit(&mut self) -> bool {
        let _queued = self
            .permit
            .is_none()
            .then(cairn_telemetry::metrics::run_queued);
        while self.permit.is_none() {
            let permits = self.permits.clone();
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return false,
                p = permits.acquire_owned() => match p {
                    Ok(p) => self.permit = Some(p),
                    Err(_) => return false,
                },
                cmd = self.cmds.recv() => {
                    if let Some(c) = cmd {
                        self.command(c).await;
                    }
                    if self.canceling.is_some() {
                        return true;
                    }
                }
            }
        }
        true
    }

    fn has_work(&self) -> bool {
        !self.ready.is_empty()
            || !self.running.is_empty()
            || !self.retry_at.is_empty()
            || self.canceling.is_some()
    }

    fn idle_for_human(&self) -> bool {
        self.running.is_empty()
            && self.retry_at.is_empty()
            && self.state.blocked_gates().next().is_some()
    }

    /// Recomputes readiness of every node (start, resume, rework).
    fn refresh_all(&mut self) {
        for i in 0..self.graph.nodes.len() {
            self.consider(i);
        }
    }

    /// Adds node `i` to `ready` when it is pending and its needs are done; skips it when a
    /// need was skipped and its trigger says so (cascading).
    fn consider(&mut self, i: usize) {
        let mut work = vec![i];
        while let Some(i) = work.pop() {
            let node = &self.graph.nodes[i];
            let Some(rec) = self.state.node(&node.id) else {
                continue;
            };
            if rec.state != NodeState::Pending
                || self.running.contains_key(&node.id)
                || self.waiting_retry.contains(&node.id)
                || self.ready.contains(&i)
            {
                continue;
            }
            let mut skipped_need = None;
            let mut all_done = true;
            for need in &node.needs {
                match self.state.node(need).map(|r| r.state) {
                    Some(NodeState::Succeeded) => {}
                    Some(NodeState::Skipped) => skipped_need = skipped_need.or(Some(need.clone())),
                    _ => all_done = false,
                }
            }
            if !all_done {
                continue;
            }
            if let (Some(need), Trigger::AllSucceeded) = (skipped_need, node.trigger) {
                let id = node.id.clone();
                self.emit(
                    Ev::new(ev::NODE_SKIPPED, &id)
                        .with("reason", format!("needs `{need}`, which was skipped")),
                );
                work.extend(self.graph.dependents(i).iter().copied());
                continue;
            }
            self.ready.insert(i);
        }
    }

    fn after_finish(&mut self, id: &str) {
        if let Some(i) = self.graph.position(id) {
            let deps: Vec<usize> = self.graph.dependents(i).to_vec();
            for d in deps {
                self.consider(d);
            }
        }
    }

    fn scope_for(&self, node: &Node) -> Scope {
        let outputs = node
            .needs
            .iter()
            .filter_map(|n| self.state.node(n).map(|r| (n.clone(), r.outputs.clone())))
            .collect();
        Scope {
            graph: self.graph.clone(),
            outputs,
            item: None,
            index: None,
        }
    }

    /// One scheduling step: inline nodes, then every startable node behind one flush.
    async fn step(&mut self) -> std::result::Result<(), String> {
        let mut jobs: Vec<Job> = Vec::new();
        loop {
            if self.failing.is_some()
                || self.canceling.is_some()
                || self.state.blocked_gates().next().is_some()
            {
                // while a gate waits, nothing new starts.
                break;
            }
            let Some(&i) = self.ready.iter().next() else {
                break;
            };
            let node = self.graph.nodes[i].clone();
            let scope = self.scope_for(&node);
            if let Some(w) = &node.when {
                match scope.eval("when", w) {
                    Ok(true) => {}
                    Ok(false) => {
                        self.ready.remove(&i);
                        self.emit(
                            Ev::new(ev::NODE_SKIPPED, &node.id)
                                .with("reason", format!("`when: {}` was false", w.source())),
                        );
                        self.after_finish(&node.id);
                        continue;
                    }
                    Err(e) => {
                        self.ready.remove(&i);
                        self.final_failure(&node.id, 1, &e);
                        continue;
                    }
                }
            }
            match &node.kind {
                NodeKind::Condition(c) => {
                    self.ready.remove(&i);
                    let attempt = self.next_attempt(&node.id);
                    self.emit(
                        Ev::new(ev::NODE_STARTED, &node.id)
                            .with("node_type", "condition")
                            .with("attempt", attempt),
                    );
                    match nodes::condition::evaluate(&scope, c) {
                        Ok((value, out)) => {
                            self.emit(
                                Ev::new(ev::NODE_COMPLETED, &node.id)
                                    .with("outputs", Value::Object(out)),
                            );
                            for target in nodes::condition::not_taken(c, value) {
                                if self.state.node(target).map(|r| r.state)
                                    == Some(NodeState::Pending)
                                {
                                    if let Some(t) = self.graph.position(target) {
                                        self.ready.remove(&t);
                                    }
                                    self.emit(Ev::new(ev::NODE_SKIPPED, target).with(
                                        "reason",
                                        format!(
                                            "condition `{}` took the {} branch",
                                            node.id,
                                            if value { "then" } else { "else" }
                                        ),
                                    ));
                                    self.after_finish(target);
                                }
                            }
                            self.after_finish(&node.id);
                        }
                        Err(e) => self.final_failure(&node.id, attempt, &e),
                    }
                }
                NodeKind::Gate(g) => {
                    self.ready.remove(&i);
                    let attempt = self.next_attempt(&node.id);
                    match nodes::gate::reason(&scope, &node.id, g) {
                        Ok(reason) => {
                            self.emit(
                                Ev::new(ev::NODE_STARTED, &node.id)
                                    .with("node_type", "gate")
                                    .with("attempt", attempt),
                            );
                            self.emit(
                                Ev::new(ev::GATE_BLOCKED, &node.id)
                                    .with("gate_id", node.id.as_str())
                                    .with("reason", reason),
                            );
                            if self.state.state != TaskState::InputRequired {
                                self.emit(
                                    Ev::run(ev::TASK_INPUT_REQUIRED)
                                        .with("gate_id", node.id.as_str()),
                                );
                            }
                        }
                        Err(e) => self.final_failure(&node.id, attempt, &e),
                    }
                }
                NodeKind::Map(m) => {
                    if self.running_nodes >= self.max_parallel {
                        break;
                    }
                    self.ready.remove(&i);
                    if let Err(e) = self.start_map(&node, m, &scope).await {
                        let attempt = self
                            .state
                            .node(&node.id)
                            .map(|r| r.attempts)
                            .unwrap_or(1)
                            .max(1);
                        self.final_failure(&node.id, attempt, &e);
                    }
                }
                _ => {
                    if self.running_nodes >= self.max_parallel {
                        break;
                    }
                    self.ready.remove(&i);
                    let rec = self.state.node(&node.id);
                    let reset = rec.map(|r| r.resets > 0).unwrap_or(false);
                    let turn = rec.map(|r| r.turn).unwrap_or(1);
                    jobs.push(Job {
                        id: node.id.clone(),
                        node: Arc::new(node.clone()),
                        scope,
                        reset,
                        turn,
                        item: false,
                    });
                }
            }
        }
        // Map items, bounded by each map's parallelism.
        let map_ids: Vec<String> = self.maps.keys().cloned().collect();
        for map_id in map_ids {
            if self.failing.is_some() || self.canceling.is_some() {
                break;
            }
            let Some(node) = self.graph.node(&map_id).cloned() else {
                continue;
            };
            let NodeKind::Map(spec) = &node.kind else {
                continue;
            };
            let base_scope = self.scope_for(&node);
            while let Some(mr) = self.maps.get_mut(&map_id) {
                if mr.running >= mr.parallelism {
                    break;
                }
                let Some(index) = mr.pending.pop_front() else {
                    break;
                };
                mr.running += 1;
                let item = mr.items.get(index).cloned().unwrap_or(Value::Null);
                let id = format!("{map_id}.{index}");
                let rec = self.state.item(&map_id, index);
                let reset = rec.map(|r| r.resets > 0).unwrap_or(false);
                let mut scope = base_scope.clone();
                scope.item = Some(item);
                scope.index = Some(index);
                if let Some(w) = &spec.node.when {
                    match scope.eval("node.when", w) {
                        Ok(true) => {}
                        Ok(false) => {
                            self.emit(
                                Ev::new(ev::NODE_SKIPPED, &id)
                                    .with("reason", format!("`when: {}` was false", w.source())),
                            );
                            self.item_finished(&map_id);
                            continue;
                        }
                        Err(e) => {
                            self.final_failure(&id, 1, &e);
                            break;
                        }
                    }
                }
                jobs.push(Job {
                    id,
                    node: Arc::new((*spec.node).clone()),
                    scope,
                    reset,
                    turn: 1,
                    item: true,
                });
            }
        }
        if jobs.is_empty() {
            return Ok(());
        }
        // Issue item 4: what these nodes depend on is durable before they start. A write_file
        // writes bytes fixed by records that precede it, so it may start while they are still
        // being committed: the recorder keeps order, so after a crash it is simply redone and
        // the store answers UNCHANGED (no duplicate file, and its events were never recorded).
        if jobs
            .iter()
            .any(|j| !matches!(j.node.kind, NodeKind::WriteFile(_)))
        {
            self.rec.flush().await.map_err(|e| e.0)?;
        } else if self.must_flush_to > 0 {
            // ... unless they depend on something that would not come out the same again (an
            // agent's answer, a sandbox run): that must be durable first.
            self.rec
                .flush_to(self.must_flush_to)
                .await
                .map_err(|e| e.0)?;
        }
        for job in jobs {
            self.start_job(job);
        }
        Ok(())
    }

    /// The step attempt `attempt` of `id` performs: the interrupted one's again (its key, one
    /// more redelivery) when the last attempt was running as its driver went away, else a new
    /// one keyed by run, node and attempt.
    fn step_of(&self, id: &str, attempt: u32) -> cairn_node::Step {
        let recorded = match crate::run::split_item(id) {
            Some((map, index)) => self.state.item(map, index).and_then(|r| r.step.as_ref()),
            None => self.state.node(id).and_then(|r| r.step.as_ref()),
        };
        match crate::run::StepRecord::redelivered(recorded) {
            Some((key, redelivery)) => cairn_node::Step { key, redelivery },
            None => cairn_node::Step {
                key: format!("{}/{id}/{attempt}", self.state.run_id),
                redelivery: 0,
            },
        }
    }

    fn next_attempt(&mut self, id: &str) -> u32 {
        *self.tries.entry(id.to_owned()).or_insert(0) += 1;
        let before = match crate::run::split_item(id) {
            Some((map, index)) => self.state.item(map, index).map(|r| r.attempts).unwrap_or(0),
            None => self.state.node(id).map(|r| r.attempts).unwrap_or(0),
        };
        before + 1
    }

    fn start_job(&mut self, job: Job) {
        let attempt = self.next_attempt(&job.id);
        let tries = self.tries.get(&job.id).copied().unwrap_or(1);
        let step = self.step_of(&job.id, attempt);
        self.emit(
            Ev::new(ev::NODE_STARTED, &job.id)
                .with("node_type", job.node.kind.type_name())
                .with("attempt", attempt)
                .with("step_key", step.key.as_str())
                .with("redelivery", step.redelivery),
        );
        let task = self.next_task;
        self.next_task += 1;
        let cancel = self.children.child_token();
        let deadline = match &job.node.kind {
            NodeKind::SandboxRun(_) => {
                Duration::from_secs(
                    job.node
                        .timeout_s
                        .unwrap_or(nodes::sandbox_run::DEFAULT_TIMEOUT_S),
                ) + SANDBOX_GRACE
            }
            _ => Duration::from_secs(job.node.timeout_s.unwrap_or(self.b.config.node_timeout_s)),
        };
        let kind = job.node.kind.type_name();
        // One span per attempt, a child of the run's span: the node's calls join the trace.
        let span = tracing::info_span!(
            "cairn.node",
            otel.name = %format!("node {}", job.id),
            cairn.project = %self.state.project,
            cairn.run_id = %self.state.run_id,
            cairn.node_id = %job.id,
            cairn.node.kind = kind,
            cairn.attempt = attempt,
        );
        let backends = self.b.clone();
        let mut ctx = NodeCtx {
            backends: self.b.services.clone(),
            project: self.state.project.clone(),
            run_id: self.state.run_id.clone(),
            node: job.node,
            node_id: job.id.clone(),
            attempt,
            turn: job.turn,
            reset: job.reset || tries > 1,
            scope: job.scope,
            progress: Progress(self.tasks_tx.clone()),
            llm: self.state.llm.clone(),
            gate: self.state.node(&job.id).and_then(|r| r.gate.clone()),
            step,
            start_from: self.state.node(&job.id).and_then(|r| r.start_from.clone()),
        };
        let tx = self.tasks_tx.clone();
        let token = cancel.clone();
        let work = async move {
            let started = Instant::now();
            let work = async {
                match tokio::time::timeout(deadline, nodes::execute(&mut ctx, &backends.kinds))
                    .await
                {
                    Ok(r) => r,
                    Err(_) => Err(NodeError::new(
                        ErrorKind::Timeout,
                        format!(
                            "no result within {}s (the node's timeout_s)",
                            deadline.as_secs()
                        ),
                    )),
                }
            };
            let (result, outcome) = tokio::select! {
                r = work => {
                    let outcome = match &r {
                        Ok(_) => "succeeded",
                        Err(e) => e.kind.as_str(),
                    };
                    (r, outcome)
                }
                _ = token.cancelled() => (Err(NodeError::new(ErrorKind::Refused, "canceled")), "canceled"),
            };
            cairn_telemetry::metrics::node_finished(kind, outcome, started.elapsed());
            // The attempt's output is stored before its end is recorded.
            let end = cairn_node::logs::End {
                outcome: outcome.to_owned(),
                error: result
                    .as_ref()
                    .err()
                    .map(|e| e.message.clone())
                    .unwrap_or_default(),
            };
            ctx.log().finish(&ctx.backends.store, end).await;
            let _ = tx.send(TaskMsg::Done { task, result });
        };
        tokio::spawn(tracing::Instrument::instrument(work, span));
        self.task_ids.insert(task, job.id.clone());
        if !job.item {
            self.running_nodes += 1;
        }
        self.running.insert(
            job.id,
            Running {
                task,
                cancel,
                canceled: false,
                deadline,
                stall_retry: false,
            },
        );
    }

    fn task_msg(&mut self, m: TaskMsg) {
        match m {
            TaskMsg::Event(e) => {
                // Progress of an attempt that was abandoned (rework, cancel) is still a fact.
                self.emit(e)
            }
            TaskMsg::Done { task, result } => self.done(task, result),
        }
    }

    fn done(&mut self, task: u64, result: std::result::Result<NodeSuccess, NodeError>) {
        let Some(id) = self.task_ids.remove(&task) else {
            return;
        };
        let Some(run) = self.running.remove(&id) else {
            return;
        };
        let item = crate::run::split_item(&id);
        if item.is_none() {
            self.running_nodes = self.running_nodes.saturating_sub(1);
        }
        if run.stall_retry && !run.canceled {
            // Stopped by the watchdog: a failed attempt, run again now whatever the budget.
            self.emit(
                Ev::new(ev::NODE_FAILED, &id)
                    .level(pb::Level::Warning)
                    .with("error", "stalled: stopped by the watchdog to run again")
                    .with("kind", ErrorKind::Timeout.as_str())
                    .with("will_retry", true)
                    .with("retry_in_ms", 0),
            );
            self.retry_at
                .insert((Instant::now(), self.next_task), id.clone());
            self.next_task += 1;
            self.waiting_retry.insert(id);
            return;
        }
        if run.canceled {
            self.emit(Ev::new(ev::NODE_CANCELED, &id));
            if let Some((map, _)) = item {
                self.item_finished(map);
            }
            return;
        }
        // Would this node write the same bytes if redone? (Only write_file: its content comes
        // from records.)
        let deterministic = match item {
            Some((map, _)) => self
                .graph
                .node(map)
                .is_some_and(|n| matches!(&n.kind, NodeKind::Map(m) if matches!(m.node.kind, NodeKind::WriteFile(_)))),
            None => self.graph.node(&id).is_some_and(|n| matches!(n.kind, NodeKind::WriteFile(_))),
        };
        match result {
            Ok(success) => {
                // The node's effects and its completion go in one group.
                let mut group = success.events;
                for e in &group {
                    self.apply(e);
                }
                if self.state.node(&id).map(|r| r.state) == Some(NodeState::Blocked) {
                    self.rec.push_group(&group);
                    // The attempt ended at the node's own gate (an external agent asked for
                    // approval): the run waits; a decision starts the node again.
                    self.must_flush_to = self.rec.queued();
                    if self.state.state != TaskState::InputRequired {
                        self.emit(Ev::run(ev::TASK_INPUT_REQUIRED).with("gate_id", id.as_str()));
                    }
                    return;
                }
                let done = Ev::new(ev::NODE_COMPLETED, &id)
                    .with("outputs", Value::Object(success.outputs));
                self.apply(&done);
                group.push(done);
                self.rec.push_group(&group);
                if !deterministic {
                    self.must_flush_to = self.rec.queued();
                }
                match item {
                    Some((map, _)) => {
                        let map = map.to_owned();
                        self.item_finished(&map);
                    }
                    None => self.after_finish(&id),
                }
            }
            Err(e) => {
                let node = match item {
                    Some((map, _)) => self.graph.node(map).and_then(|n| match &n.kind {
                        NodeKind::Map(m) => Some((*m.node).clone()),
                        _ => None,
                    }),
                    None => self.graph.node(&id).cloned(),
                };
                let policy = self.b.config.retry.merged(&[
                    self.graph.retry.as_ref(),
                    node.as_ref().and_then(|n| n.retry.as_ref()),
                ]);
                let tries = self.tries.get(&id).copied().unwrap_or(1);
                let attempt = match item {
                    Some((map, index)) => self
                        .state
                        .item(map, index)
                        .map(|r| r.attempts)
                        .unwrap_or(tries),
                    None => self.state.node(&id).map(|r| r.attempts).unwrap_or(tries),
                };
                if tries < policy.max_attempts
                    && policy.retry_on.contains(&e.kind)
                    && self.failing.is_none()
                    && self.canceling.is_none()
                {
                    let delay = policy.backoff(tries + 1);
                    self.emit(
                        Ev::new(ev::NODE_FAILED, &id)
                            .level(pb::Level::Warning)
                            .with("error", e.message.clone())
                            .with("kind", e.kind.as_str())
                            .with("attempt", attempt)
                            .with("will_retry", true)
                            .with("retry_in_ms", delay.as_millis() as u64),
                    );
                    let key = (Instant::now() + delay, self.next_task);
                    self.next_task += 1;
                    self.retry_at.insert(key, id.clone());
                    self.waiting_retry.insert(id);
                } else {
                    if let Some((map, _)) = item {
                        if let Some(mr) = self.maps.get_mut(map) {
                            mr.running = mr.running.saturating_sub(1);
                        }
                    }
                    self.final_failure(&id, attempt, &e);
                }
            }
        }
    }

    fn final_failure(&mut self, id: &str, attempt: u32, e: &NodeError) {
        self.emit(
            Ev::new(ev::NODE_FAILED, id)
                .level(pb::Level::Error)
                .with("error", e.message.clone())
                .with("kind", e.kind.as_str())
                .with("attempt", attempt)
                .with("will_retry", false),
        );
        if let Some((map, _)) = crate::run::split_item(id) {
            let map = map.to_owned();
            self.emit(
                Ev::new(ev::NODE_FAILED, &map)
                    .level(pb::Level::Error)
                    .with("error", format!("item `{id}` failed: {}", e.message))
                    .with("kind", e.kind.as_str())
                    .with("will_retry", false),
            );
        }
        self.fail(format!("node `{id}` failed: {}", e.message));
    }

    /// The run fails once what is running has stopped.
    fn fail(&mut self, why: String) {
        if self.failing.is_none() {
            self.failing = Some(why);
        }
        self.cancel_running(None);
    }

    /// Cancels running attempts (all, or those in `only`).
    fn cancel_running(&mut self, only: Option<&HashSet<String>>) {
        for (id, r) in self.running.iter_mut() {
            let hit = only
                .map(|o| {
                    o.contains(id) || crate::run::split_item(id).is_some_and(|(m, _)| o.contains(m))
                })
                .unwrap_or(true);
            if hit && !r.canceled {
                r.canceled = true;
                r.cancel.cancel();
            }
        }
    }

    fn due_retries(&mut self) {
        let now = Instant::now();
        let due: Vec<(Instant, u64)> = self
            .retry_at
            .range(..=(now, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            let Some(id) = self.retry_at.remove(&k) else {
                continue;
            };
            self.waiting_retry.remove(&id);
            match crate::run::split_item(&id) {
                Some((map, index)) => {
                    let map = map.to_owned();
                    if let Some(mr) = self.maps.get_mut(&map) {
                        mr.running = mr.running.saturating_sub(1);
                        mr.pending.push_front(index);
                    }
                }
                None => {
                    if let Some(i) = self.graph.position(&id) {
                        self.consider(i);
                    }
                }
            }
        }
    }

    /// Emits the final task event when nothing is left to do; returns how the loop ends.
    fn finish_if_done(&mut self) -> Option<Exit> {
        if !self.running.is_empty() {
            return None;
        }
        if let Some((by, reason)) = self.canceling.clone() {
            self.retry_at.clear();
            self.emit(
                Ev::run(ev::TASK_CANCELED)
                    .with("by", by)
                    .with("reason", reason),
            );
            return Some(Exit::Final);
        }
        if let Some(why) = self.failing.clone() {
            self.emit(Ev::run(ev::TASK_FAILED).with("error", why));
            return Some(Exit::Final);
        }
        if !self.ready.is_empty() || !self.retry_at.is_empty() || !self.maps.is_empty() {
            return None;
        }
        if self.state.blocked_gates().next().is_some() {
            return None;
        }
        if let Some(n) = self
            .state
            .nodes
            .iter()
            .find(|n| n.state == NodeState::Failed)
        {
            let why = format!(
                "node `{}` failed: {}",
                n.id,
                n.error.clone().unwrap_or_default()
            );
            self.emit(Ev::run(ev::TASK_FAILED).with("error", why));
            return Some(Exit::Final);
        }
        let stuck: Vec<String> = self
            .state
            .nodes
            .iter()
            .filter(|n| !n.state.is_done())
            .map(|n| n.id.clone())
            .collect();
        if stuck.is_empty() {
            self.emit(Ev::run(ev::TASK_COMPLETED));
        } else {
            self.emit(Ev::run(ev::TASK_FAILED).with(
                "error",
                format!("nodes that can never run: {}", stuck.join(", ")),
            ));
        }
        Some(Exit::Final)
    }
}

struct Job {
    id: String,
    node: Arc<Node>,
    scope: Scope,
    reset: bool,
    turn: u32,
    item: bool,
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Map of a run's node outputs (for tests and summaries).
pub fn outputs_of(state: &RunState) -> Map<String, Value> {
    state
        .nodes
        .iter()
        .filter(|n| !n.outputs.is_null())
        .map(|n| (n.id.clone(), n.outputs.clone()))
        .collect()
}
