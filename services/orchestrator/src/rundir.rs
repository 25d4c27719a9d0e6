//! The run directory `.cairn/runs/<run_id>/`: its layout,
//! the files written at submit, and the snapshot writer that regenerates README.md, task.yaml
//! and state.json as the run moves. Everything goes through the artifact-store; nothing here
//! touches a disk.
//!
//! Snapshots are rendered from the folded `RunState` and written only after the events they
//! reflect are durable, so task.yaml never claims more than events.jsonl holds (its
//! `events_seq` names the last event it reflects). They are rate-limited by the scheduler
//! (state changes at once, progress at most every `snapshot_interval_ms`): per-node rewrites
//! of three files would cost more than the nodes themselves.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::recorder::Recorder;
use crate::run::{NodeState, RunState, TaskState};
use crate::task_edits;
use cairn_graph::{Graph, NodeKind};
use cairn_node::events::Ev;
use cairn_store_client::{PutOptions, Store};

pub use cairn_node::layout::{front_matter, RunDir, RUNS_PREFIX};

/// The files a new run starts with (besides graph.resolved.json and the snapshots).
pub fn initial_files(state: &RunState) -> Vec<(String, String)> {
    let dir = RunDir::new(&state.run_id);
    let id = &state.run_id;
    let notes = format!(
        "{}# Human notes for run {id}\n\nWrite guidance, corrections and constraints here (or run `cairn notes add {id} \"...\"`).\nAgents of this run read this file as high-priority context before each step.\n",
        front_matter("Human notes", &format!("Guidance and corrections for run {id}"), &["human-notes"], id, None, None)
    );
    let manifest = "# Explicitly shared context of this run. Each attachment:\n#   - id: api-contract-v1\n#     kind: file            # file | snippet\n#     path: ./shared/contracts/checkout.md   # run-relative (./...) or project-relative\n#     range: \"120:180\"      # snippets: startLine:endLine\n#     reason: \"why the agents need it\"\nattachments: []\n".to_owned();
    let section = |name: &str, what: &str| {
        (
            dir.path(&format!("shared/{name}/README.md")),
            format!(
                "{}# {name}\n\n{what}\n",
                front_matter(name, what, &[name], id, None, None)
            ),
        )
    };
    vec![
        (dir.human_notes(), notes),
        (dir.context_manifest(), manifest),
        (dir.path(EVIDENCE_INDEX), "[]\n".into()),
        section(
            "contracts",
            "Contracts shared by the agents of this run (API, schemas, error models).",
        ),
        section(
            "decisions",
            "Decision records of this run (trade-offs and conclusions).",
        ),
        section("reports", "Joined summaries and reports of this run."),
    ]
}

#[derive(Serialize)]
struct Milestone<'a> {
    id: &'a str,
    title: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    state: &'a str,
    attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    progress: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    skip_reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<&'a str>,
}

#[derive(Serialize)]
struct RosterYaml<'a> {
    instance: &'a str,
    agent: &'a str,
    state: &'a str,
    node: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GateYaml<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    state: crate::run::GateState,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    instructions_ref: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    decided_by: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    decided_at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    comment_ref: Option<&'a str>,
}

#[derive(Serialize)]
struct TaskYaml<'a> {
    id: &'a str,
    title: &'a str,
    topology: &'a str,
    state: TaskState,
    project: &'a str,
    goal: &'a str,
    created_at: &'a str,
    updated_at: &'a str,
    created_by: &'a str,
    /// The run this one replays from its records.
    #[serde(skip_serializing_if = "str::is_empty")]
    replay_of: &'a str,
    /// Last event of events.jsonl this file reflects.
    events_seq: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    milestones: Vec<Milestone<'a>>,
    roster: Vec<RosterYaml<'a>>,
    gates: Vec<GateYaml<'a>>,
}

fn progress(n: &crate::run::NodeRecord) -> Option<String> {
    let items = n.items.as_ref()?;
    let done = items.records.iter().filter(|r| r.state.is_done()).count();
    Some(format!("{done}/{}", items.records.len()))
}

/// task.yaml (fields).
pub fn render_task_yaml(s: &RunState, events_seq: u64) -> String {
    let doc = TaskYaml {
        id: &s.run_id,
        title: &s.title,
        topology: &s.topology,
        state: s.state,
        project: &s.project,
        goal: &s.goal,
        created_at: &s.created_at,
        updated_at: &s.updated_at,
        created_by: &s.created_by,
        replay_of: &s.replay_of,
        events_seq,
        error: s.error.as_deref(),
        milestones: s
            .nodes
            .iter()
            .map(|n| Milestone {
                id: &n.id,
                title: &n.title,
                kind: &n.kind,
                state: n.state.milestone(),
                attempts: n.attempts,
                progress: progress(n),
                error: n.error.as_deref(),
                skip_reason: n.skip_reason.as_deref(),
                note: n.note.as_deref(),
            })
            .collect(),
        roster: s
            .roster
            .iter()
            .map(|r| RosterYaml {
                instance: &r.instance,
                agent: &r.agent,
                state: &r.state,
                node: &r.node,
                note: r.note.as_deref(),
            })
            .collect(),
        gates: s
            .nodes
            .iter()
            .filter_map(|n| {
                let g = n.gate.as_ref()?;
                Some(GateYaml {
                    id: &n.id,
                    kind: "human-approval",
                    state: g.state,
                    reason: g.reason.as_deref(),
                    instructions_ref: "./shared/human-notes.md",
                    decided_by: g.decided_by.as_deref(),
                    decided_at: g.decided_at.as_deref(),
                    comment_ref: g.note_ref.as_deref(),
                })
            })
            .collect(),
    };
    let header = format!("# Machine entry of this run, regenerated by the orchestrator from events.jsonl.\n# You may edit {}: the orchestrator applies such edits\n# (a task.edited event). Any other field is refused; change the run with `cairn gate`,\n# `cairn notes`, `cairn runs`.\n", task_edits::EDITABLE);
    match serde_saphyr::to_string(&doc) {
        Ok(yaml) => format!("{header}{yaml}"),
        // Serialising plain strings and numbers cannot fail; keep a parseable file regardless.
        Err(e) => format!(
            "{header}id: {:?}\nstate: {}\nerror: {:?}\n",
            s.run_id,
            s.state.as_str(),
            e.to_string()
        ),
    }
}

/// state.json: the whole folded state (node outputs, map items, gates).
pub fn render_state_json(s: &RunState, events_seq: u64) -> String {
    let mut v = serde_json::to_value(s).unwrap_or_default();
    if let serde_json::Value::Object(m) = &mut v {
        m.insert("events_seq".into(), events_seq.into());
        m.insert("version".into(), 1.into());
    }
    let mut out = serde_json::to_string(&v).unwrap_or_default();
    out.push('\n');
    out
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// README.md: the human entry (goal, state, milestones, links).
pub fn render_readme(s: &RunState, graph: &Graph) -> String {
    let id = &s.run_id;
    let mut out = front_matter(
        if s.title.is_empty() { id } else { &s.title },
        &format!("Entry point of run {id}: goal, state, milestones and links"),
        &["cairn-run", &s.topology],
        id,
        None,
        None,
    );
    let title = if s.title.is_empty() {
        format!("Run {id}")
    } else {
        s.title.clone()
    };
    let _ = writeln!(out, "# {title}\n");
    let _ = writeln!(
        out,
        "**State:** `{}` · **Run:** `{id}` · **Project:** `{}` · created {} · updated {}\n",
        s.state.as_str(),
        s.project,
        s.created_at,
        s.updated_at
    );
    if let Some(e) = &s.error {
        let _ = writeln!(out, "**Why it stopped:** {e}\n");
    }
    let not_written = s.blocks_not_written();
    if not_written > 0 {
        let _ = writeln!(
            out,
            "**Not written:** {not_written} code block(s) of this run's documents did not reach the workspace; the nodes' `not_written` outputs (state.json) and the `ingest.incomplete` events say which and why.\n"
        );
    }
    let _ = writeln!(
        out,
        "## Goal\n\n{}\n",
        if s.goal.is_empty() {
            "(no goal given in the graph)"
        } else {
            &s.goal
        }
    );
    let blocked: Vec<_> = s.blocked_gates().collect();
    if !blocked.is_empty() {
        let _ = writeln!(out, "## Waiting for you\n");
        for n in blocked {
            let reason = n
                .gate
                .as_ref()
                .and_then(|g| g.reason.clone())
                .unwrap_or_default();
            let instructions = graph.node(&n.id).and_then(|g| match &g.kind {
                // Rendered with what the README knows (the run id, vars); as written otherwise.
                NodeKind::Gate(gate) => gate.instructions.as_ref().map(|t| {
                    t.render(&|r| match r {
                        cairn_graph::Ref::RunId => {
                            Some(serde_json::Value::from(graph.run_id.clone()))
                        }
                        cairn_graph::Ref::Var { name, path } if path.is_empty() => {
                            graph.vars.get(name).cloned().map(serde_json::Value::from)
                        }
                        _ => None,
                    })
                    .unwrap_or_else(|_| t.source().to_owned())
                }),
                _ => None,
            });
            let _ = writeln!(out, "- Gate `{}`: {reason}", n.id);
            if let Some(i) = instructions {
                let _ = writeln!(out, "  - {i}");
            }
            let _ = writeln!(
                out,
                "  - approve: `cairn gate approve {id} {} --note \"...\"`",
                n.id
            );
            let _ = writeln!(
                out,
                "  - reject: `cairn gate reject {id} {} --note \"why\"`",
                n.id
            );
        }
        out.push('\n');
    }
    let _ = writeln!(out, "## Milestones\n\n| # | Node | Type | State | Attempts | Detail |\n|---|---|---|---|---|---|");
    const MAX_ROWS: usize = 200;
    for (i, n) in s.nodes.iter().enumerate().take(MAX_ROWS) {
        let detail = match (n.state, &n.error, &n.skip_reason, progress(n)) {
            (_, Some(e), _, _) if n.state != NodeState::Succeeded => cell(e),
            (NodeState::Skipped, _, Some(r), _) => cell(r),
            (_, _, _, Some(p)) => format!("{p} items"),
            _ => n
                .outputs
                .get("path")
                .and_then(|p| p.as_str())
                .map(|p| format!("`{}`", cell(p)))
                .unwrap_or_default(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            i + 1,
            cell(&n.title),
            n.kind,
            n.state.milestone(),
            n.attempts,
            detail
        );
    }
    if s.nodes.len() > MAX_ROWS {
        let _ = writeln!(
            out,
            "\n… and {} more nodes (see task.yaml).",
            s.nodes.len() - MAX_ROWS
        );
    }
    let outputs: Vec<(String, String)> = s
        .nodes
        .iter()
        .filter(|n| n.state == NodeState::Succeeded)
        .flat_map(|n| {
            let mut v = Vec::new();
            if let Some(p) = n.outputs.get("path").and_then(|p| p.as_str()) {
                v.push((p.to_owned(), n.id.clone()));
            }
            if let Some(ws) = n.outputs.get("written_files").and_then(|w| w.as_array()) {
                v.extend(
                    ws.iter()
                        .filter_map(|w| w.as_str())
                        .map(|w| (w.to_owned(), n.id.clone())),
                );
            }
            v
        })
        .take(100)
        .collect();
    if !outputs.is_empty() {
        let _ = writeln!(out, "\n## Outputs\n");
        for (p, node) in outputs {
            let _ = writeln!(out, "- `{p}` (node `{node}`)");
        }
    }
    let _ = writeln!(
        out,
        "\n## Links\n\n- [task.yaml](task.yaml): state machine, milestones, roster, gates\n- [events.jsonl](events.jsonl): every event of the run\n- [state.json](state.json): node outputs\n- [graph.resolved.json](graph.resolved.json): the graph as submitted, variables bound\n- [shared/human-notes.md](shared/human-notes.md): guidance for the agents (`cairn notes add {id} \"...\"`)\n- [shared/context-manifest.yaml](shared/context-manifest.yaml): explicitly shared context"
    );
    for r in &s.roster {
        let _ = writeln!(
            out,
            "- [agents/{0}/README.md](agents/{0}/README.md): agent `{1}` ({2})",
            r.instance, r.agent, r.state
        );
    }
    out
}

/// A snapshot to write: the state as of recorder position `upto`.
struct Snapshot {
    version: u64,
    upto: u64,
    state: RunState,
    graph: Arc<Graph>,
}

/// Writes README.md, task.yaml and state.json in the background, latest snapshot wins.
pub struct Snapshots {
    tx: watch::Sender<Option<Arc<Snapshot>>>,
    written: watch::Receiver<u64>,
    version: u64,
    /// Human edits found in task.yaml, as task.edited events for the driver to record.
    pub edits: mpsc::UnboundedReceiver<Ev>,
}

impl Snapshots {
    pub fn start(store: Store, project: String, recorder: Recorder) -> Snapshots {
        let (tx, rx) = watch::channel::<Option<Arc<Snapshot>>>(None);
        let (wtx, wrx) = watch::channel(0u64);
        let (etx, erx) = mpsc::unbounded_channel();
        // In the run's span: the snapshot writes belong to the run's trace.
        tokio::spawn(tracing::Instrument::in_current_span(write_loop(
            store, project, recorder, rx, wtx, etx,
        )));
        Snapshots {
            tx,
            written: wrx,
            version: 0,
            edits: erx,
        }
    }

    /// Queues a snapshot of `state` (which reflects the first `upto` recorded events).
    pub fn publish(&mut self, state: &RunState, graph: &Arc<Graph>, upto: u64) -> u64 {
        self.version += 1;
        let snap = Snapshot {
            version: self.version,
            upto,
            state: state.clone(),
            graph: graph.clone(),
        };
        self.tx.send_replace(Some(Arc::new(snap)));
        self.version
    }

    /// Waits until snapshot `version` (or a later one) is written, at most `timeout`.
    pub async fn wait_written(&self, version: u64, timeout: Duration) -> bool {
        let mut rx = self.written.clone();
        let wait = async {
            loop {
                if *rx.borrow_and_update() >= version {
                    return true;
                }
                if rx.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.unwrap_or(false)
    }
}

async fn write_loop(
    store: Store,
    project: String,
    recorder: Recorder,
    mut rx: watch::Receiver<Option<Arc<Snapshot>>>,
    written: watch::Sender<u64>,
    edits: mpsc::UnboundedSender<Ev>,
) {
    let mut task = TaskFile::default();
    // The evidence index, grown from the run's stored events (see cairn_node::evidence).
    let mut evidence: Option<cairn_node::evidence::Index> = None;
    let mut evidence_written = false;
    loop {
        if rx.changed().await.is_err() {
            return;
        }
        let Some(snap) = rx.borrow_and_update().clone() else {
            continue;
        };
        if recorder.flush_to(snap.upto).await.is_err() {
            continue; // events could not be recorded: no snapshot may claim them
        }
        let seq = if snap.upto == 0 {
            snap.state.last_seq
        } else {
            recorder.seq_of(snap.upto).unwrap_or(snap.state.last_seq)
        };
        let dir = RunDir::new(&snap.state.run_id);
        let mut files = vec![
            (dir.state_json(), render_state_json(&snap.state, seq)),
            (dir.readme(), render_readme(&snap.state, &snap.graph)),
        ];
        let evidence =
            evidence.get_or_insert_with(|| cairn_node::evidence::Index::new(&snap.state.run_id));
        let known = evidence.entries().len();
        match store
            .read_events(&project, &snap.state.run_id, evidence.last_seq + 1)
            .await
        {
            Ok(events) => events.iter().for_each(|e| evidence.observe(e)),
            Err(e) => {
                tracing::warn!(run_id = %snap.state.run_id, error = %e, "reading the run's events for its evidence index failed; the index catches up with the next snapshot")
            }
        }
        if evidence.entries().len() != known || !evidence_written {
            files.push((dir.path(EVIDENCE_INDEX), evidence.render()));
        }
        let opts = PutOptions {
            overwrite: true,
            ..Default::default()
        };
        let puts = files
            .iter()
            .map(|(path, body)| store.put(&project, path, Bytes::from(body.clone()), &opts));
        let task_path = dir.task_yaml();
        let task_yaml = task.write(&store, &project, &task_path, &snap.state, seq, &edits);
        let (results, task_result) = tokio::join!(futures::future::join_all(puts), task_yaml);
        if matches!(task_result, Ok(false)) {
            // A human's edit was found in task.yaml: write this snapshot again with it.
            rx.mark_changed();
            continue;
        }
        let failed = results
            .into_iter()
            .map(|r| r.map(|_| ()))
            .chain([task_result.map(|_| ())])
            .find(Result::is_err);
        if let Some(Err(e)) = failed {
            if cairn_proto::reason::of(&e).as_deref() == Some("fenced") {
                // Another driver has claimed the run: no later snapshot of ours may land.
                tracing::warn!(run_id = %snap.state.run_id, error = %e, "the run snapshot is fenced off (another driver claimed the run); this driver writes no more snapshots");
                return;
            }
            tracing::warn!(run_id = %snap.state.run_id, error = %e, "writing the run snapshot failed; retrying with the next one");
            tokio::time::sleep(Duration::from_millis(200)).await;
            // Make sure a later snapshot (or this one again) is written.
            rx.mark_changed();
            continue;
        }
        evidence_written = true;
        written.send_replace(snap.version);
    }
}

/// The run's evidence index, relative to its run directory.
pub const EVIDENCE_INDEX: &str = "shared/evidence/index.json";

/// task.yaml as the snapshot writer knows it: it replaces the file only while the file holds
/// what it last wrote or read (compare-and-swap), so a human's edit is read, never lost.
#[derive(Default)]
struct TaskFile {
    /// sha256 of what is there as far as this writer knows; None until it looked.
    sha: Option<String>,
    /// A human's edited text whose task.edited event the state has not absorbed yet: its
    /// edits are rendered into task.yaml regardless.
    held: Option<String>,
}

impl TaskFile {
    async fn write(
        &mut self,
        store: &Store,
        project: &str,
        path: &str,
        state: &RunState,
        seq: u64,
        edits: &mpsc::UnboundedSender<Ev>,
    ) -> Result<bool, tonic::Status> {
        if self.sha.is_none() {
            // This writer's first look: the file may have been edited while no one drove the
            // run (an edit that changes nothing editable is left to the snapshot to correct).
            if let Some(text) = self.read(store, project, path).await? {
                if task_edits::changes(&text, state).is_ok_and(|c| !c.is_empty()) {
                    let _ = edits.send(task_edits::event(&text, state));
                    self.held = Some(text);
                }
            }
        }
        let body = match self
            .held
            .as_deref()
            .map(|t| (t, task_edits::changes(t, state)))
        {
            Some((_, Ok(changes))) if !changes.is_empty() => {
                let mut edited = state.clone();
                let mut data = serde_json::Map::new();
                data.insert("changes".into(), serde_json::Value::Array(changes));
                task_edits::apply(&mut edited, &data);
                render_task_yaml(&edited, seq)
            }
            _ => {
                self.held = None;
                render_task_yaml(state, seq)
            }
        };
        let opts = PutOptions {
            overwrite: true,
            if_sha256: self.sha.clone().unwrap_or_default(),
            ..Default::default()
        };
        match store.put(project, path, Bytes::from(body), &opts).await {
            Ok(r) => {
                self.sha = r.digest.map(|d| d.sha256);
                Ok(true)
            }
            Err(s) if cairn_proto::reason::of(&s).as_deref() == Some("changed") => {
                // Changed since this writer wrote it: read the edit, have it recorded, and
                // write again with it (the caller's next round).
                if let Some(text) = self.read(store, project, path).await? {
                    let event = task_edits::event(&text, state);
                    if task_edits::changes(&text, state).is_ok_and(|c| !c.is_empty()) {
                        self.held = Some(text);
                    }
                    let _ = edits.send(event);
                }
                Ok(false)
            }
            Err(s) => Err(s),
        }
    }

    /// Reads task.yaml and remembers its digest; None when it is not there.
    async fn read(
        &mut self,
        store: &Store,
        project: &str,
        path: &str,
    ) -> Result<Option<String>, tonic::Status> {
        let Some(bytes) = store.get_at_most(project, path, TASK_YAML_MAX).await? else {
            self.sha = Some(String::new());
            return Ok(None);
        };
        self.sha = Some(cairn_sha256::sha256_hex(&bytes));
        Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
    }
}

/// Largest task.yaml read back (a run of 10,000 nodes stays far below).
const TASK_YAML_MAX: u64 = 16 << 20;
