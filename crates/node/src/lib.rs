//! What a node kind may use, and the one trait every kind implements ([`Kind`]): the context
//! of one attempt ([`NodeCtx`]: the services, the node, its scope of values, a line to report
//! progress), its errors and results, the event vocabulary, the run directory's layout, and
//! the human notes and shared context agents are given.
//!
//! The orchestrator's core (runs, the scheduler, the records) drives kinds through
//! [`Registry`]; kinds live in crates of their own and depend on this crate, the graph
//! language and the service clients, never on the orchestrator.

pub mod context;
pub mod events;
pub mod evidence;
pub mod gate;
pub mod layout;
pub mod logs;
pub mod recorded;
pub mod snapshot;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cairn_agents::Providers;
use cairn_graph::{ErrorKind, Expr, Graph, Node, Ref, Template};
use cairn_proto::v1::ingest_client::IngestClient;
use cairn_runner_client::Runners;
use cairn_store_client::Store;
use cairn_telemetry::TracedChannel;
pub use futures::future::BoxFuture;
use serde_json::{Map, Value};
use tonic::{Code, Status};

pub use events::Ev;
pub use gate::{GateRecord, GateState};
pub use layout::RunDir;
pub use snapshot::SnapshotRef;

/// One node kind: what nodes of one graph `type:` do when they run.
pub trait Kind: Send + Sync {
    /// The graph `type:` it runs (`write_file`, `code_delivery` ...).
    fn type_name(&self) -> &'static str;

    /// Submit-time checks that need what this deployment has (installed tools, configured
    /// targets); the graph language has checked everything else. The error says what to fix.
    fn check(&self, _node: &Node) -> Result<(), String> {
        Ok(())
    }

    /// Runs one attempt: the outputs and the events recorded with `node.completed`.
    fn run<'a>(&'a self, ctx: &'a NodeCtx) -> BoxFuture<'a, Result<NodeSuccess, NodeError>>;
}

/// The error of a kind handed a node of another type (a registry bug, never a user's).
pub fn mismatch(kind: &str, node: &Node) -> NodeError {
    NodeError::refused(format!(
        "the {kind} kind was given node `{}` of type {}",
        node.id,
        node.kind.type_name()
    ))
}

/// A [`Kind`] without settings: a unit struct whose `run` hands the node's spec (the
/// `NodeKind` variant) to an `async fn(&NodeCtx, &Spec)`.
#[macro_export]
macro_rules! unit_kind {
    ($(#[$doc:meta])* $kind:ident, $name:literal, $variant:path, $run:path) => {
        $(#[$doc])*
        pub struct $kind;

        impl $crate::Kind for $kind {
            fn type_name(&self) -> &'static str {
                $name
            }

            fn run<'a>(
                &'a self,
                ctx: &'a $crate::NodeCtx,
            ) -> $crate::BoxFuture<'a, Result<$crate::NodeSuccess, $crate::NodeError>> {
                Box::pin(async move {
                    match &ctx.node.kind {
                        $variant(spec) => $run(ctx, spec).await,
                        _ => Err($crate::mismatch($name, &ctx.node)),
                    }
                })
            }
        }
    };
}

/// The node kinds an orchestrator runs, by graph `type:`.
#[derive(Clone, Default)]
pub struct Registry {
    kinds: BTreeMap<&'static str, Arc<dyn Kind>>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds (or replaces) the kind for its `type:`.
    pub fn with(mut self, kind: impl Kind + 'static) -> Registry {
        self.kinds.insert(kind.type_name(), Arc::new(kind));
        self
    }

    pub fn get(&self, type_name: &str) -> Option<&Arc<dyn Kind>> {
        self.kinds.get(type_name)
    }

    /// The registered `type:` names.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.kinds.keys().copied()
    }

    /// Every node's (and map body's) submit-time checks.
    pub fn check(&self, graph: &Graph) -> Result<(), cairn_graph::GraphError> {
        fn one(r: &Registry, n: &Node) -> Result<(), cairn_graph::GraphError> {
            if let cairn_graph::NodeKind::Map(m) = &n.kind {
                return one(r, &m.node);
            }
            match r.get(n.kind.type_name()) {
                Some(kind) => kind
                    .check(n)
                    .map_err(|e| cairn_graph::GraphError::node(&n.id, None, e)),
                None => Ok(()),
            }
        }
        graph.nodes.iter().try_for_each(|n| one(self, n))
    }
}

/// The services and settings node tasks use.
pub struct Services {
    pub store: Store,
    pub ingest: Option<IngestClient<TracedChannel>>,
    /// The ingest service as a dependency (outages ridden out; readiness ignores it: the
    /// hook is fail-open).
    pub ingest_dependency: cairn_server::retry::Dependency,
    pub runners: Runners,
    pub providers: Providers,
    /// Run the ingest hook on documents nodes write (when an ingest service is configured).
    pub ingest_hook: bool,
    /// A node's deadline when it sets no `timeout_s`.
    pub node_timeout_s: u64,
    /// What running nodes print (WatchLogs reads it).
    pub logs: Arc<logs::LogHub>,
}

/// Why a node attempt failed; `kind` decides whether it is retried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeError {
    pub kind: ErrorKind,
    pub message: String,
}

impl NodeError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> NodeError {
        NodeError {
            kind,
            message: message.into(),
        }
    }
    pub fn refused(message: impl Into<String>) -> NodeError {
        NodeError::new(ErrorKind::Refused, message)
    }
    pub fn failed(message: impl Into<String>) -> NodeError {
        NodeError::new(ErrorKind::Failed, message)
    }

    /// A failed call to another service, with what we were doing.
    pub fn from_status(context: &str, s: &Status) -> NodeError {
        let reason = cairn_proto::reason::of(s);
        let kind = match s.code() {
            // A sandbox-runner at its max_concurrent_runs ran nothing: retry (on another runner,
            // after the backoff).
            Code::ResourceExhausted if reason.as_deref() == Some("max_concurrent_runs") => {
                ErrorKind::Unavailable
            }
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::Unknown
            | Code::Internal
            | Code::Cancelled => ErrorKind::Unavailable,
            Code::ResourceExhausted => ErrorKind::Failed,
            _ => ErrorKind::Refused,
        };
        let reason = reason.map(|r| format!(" [{r}]")).unwrap_or_default();
        NodeError::new(kind, format!("{context}: {}{reason}", s.message()))
    }
}

/// What a successful attempt produced.
#[derive(Debug, Default)]
pub struct NodeSuccess {
    /// The node's outputs (a JSON object).
    pub outputs: Map<String, Value>,
    /// Events recorded together with node.completed.
    pub events: Vec<Ev>,
}

/// Values templates and expressions of one node can read.
#[derive(Clone)]
pub struct Scope {
    pub graph: Arc<Graph>,
    /// Outputs of the nodes this one needs, by id.
    pub outputs: HashMap<String, Value>,
    pub item: Option<Value>,
    pub index: Option<usize>,
}

fn at_path(mut v: &Value, path: &[String]) -> Option<Value> {
    for seg in path {
        v = match v {
            Value::Object(m) => m.get(seg)?,
            Value::Array(a) => a.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v.clone())
}

impl Scope {
    pub fn lookup(&self, r: &Ref) -> Option<Value> {
        match r {
            Ref::RunId => Some(Value::String(self.graph.run_id.clone())),
            Ref::Var { name, path } => {
                if let Some(node) = self.graph.store_output_node(name) {
                    return at_path(self.outputs.get(node)?, path);
                }
                if path.is_empty() {
                    self.graph.vars.get(name).map(|v| Value::String(v.clone()))
                } else {
                    None
                }
            }
            Ref::Node { id, field, path } => {
                let mut full = Vec::with_capacity(path.len() + 1);
                full.push(field.clone());
                full.extend(path.iter().cloned());
                at_path(self.outputs.get(id)?, &full)
            }
            Ref::Item { path } => at_path(self.item.as_ref()?, path),
            Ref::Index => self.index.map(Value::from),
        }
    }

    pub fn render(&self, field: &str, t: &Template) -> Result<String, NodeError> {
        t.render(&|r| self.lookup(r))
            .map_err(|e| NodeError::refused(format!("field `{field}`: {e}")))
    }

    pub fn render_value(&self, field: &str, t: &Template) -> Result<Value, NodeError> {
        t.render_value(&|r| self.lookup(r))
            .map_err(|e| NodeError::refused(format!("field `{field}`: {e}")))
    }

    pub fn eval(&self, field: &str, e: &Expr) -> Result<bool, NodeError> {
        e.eval(&|r| self.lookup(r))
            .map_err(|m| NodeError::refused(format!("`{field}: {}`: {m}", e.source())))
    }

    /// Fills the lazy `text` output (the file at `path`) of nodes this node reads it from.
    pub async fn load_texts(
        &mut self,
        store: &Store,
        project: &str,
        node: &Node,
    ) -> Result<(), NodeError> {
        let refs = node.refs().map_err(|e| NodeError::refused(e.to_string()))?;
        for (_, r) in refs {
            let Ref::Node { id, field, .. } = r else {
                continue;
            };
            if field != "text" {
                continue;
            }
            let Some(Value::Object(out)) = self.outputs.get_mut(&id) else {
                continue;
            };
            if out.contains_key("text") {
                continue;
            }
            let Some(path) = out.get("path").and_then(Value::as_str).map(str::to_owned) else {
                continue;
            };
            let bytes = store
                .get(project, &path)
                .await
                .map_err(|s| {
                    NodeError::from_status(&format!("reading {path} for nodes.{id}.text"), &s)
                })?
                .ok_or_else(|| {
                    NodeError::refused(format!("nodes.{id}.text: {path} no longer exists"))
                })?;
            out.insert(
                "text".into(),
                Value::String(String::from_utf8_lossy(&bytes).into_owned()),
            );
        }
        Ok(())
    }
}

/// Everything one node attempt needs.
pub struct NodeCtx {
    pub backends: Arc<Services>,
    pub project: String,
    pub run_id: String,
    /// The node (a map's body for a map item).
    pub node: Arc<Node>,
    /// Id in the records: the node id, or `<map>.<index>` for an item.
    pub node_id: String,
    pub attempt: u32,
    pub turn: u32,
    /// The node was reset (rework, interrupted or resumed attempt): it may overwrite what its
    /// earlier attempt wrote.
    pub reset: bool,
    pub scope: Scope,
    /// Events the node reports while it runs (the scheduler applies and records them).
    pub progress: Progress,
    /// The run's LLM provider spec.
    pub llm: String,
    /// This node's own gate, for nodes that block on one mid-way (`external_agent`): the
    /// decision a resumed attempt continues from.
    pub gate: Option<GateRecord>,
    /// The step this attempt performs: a key that stays the same when the attempt is
    /// delivered again after its driver went away, so effects outside cairn can be deduplicated.
    pub step: Step,
    /// A rework asked this node to start its sandbox session from this snapshot.
    pub start_from: Option<SnapshotRef>,
}

/// An attempt's idempotency key (`<run>/<node>/<attempt>`) and how often it was delivered before.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    pub key: String,
    pub redelivery: u32,
}

/// What a node task sends its scheduler.
pub enum TaskMsg {
    /// An event to record now (agent.started, sandbox_start ...).
    Event(Ev),
    /// The attempt ended. `task` identifies the attempt, so a stale one is ignored.
    Done {
        task: u64,
        result: Result<NodeSuccess, NodeError>,
    },
}

/// A node task's line to its scheduler.
#[derive(Clone)]
pub struct Progress(pub tokio::sync::mpsc::UnboundedSender<TaskMsg>);

impl Progress {
    pub fn emit(&self, e: Ev) {
        let _ = self.0.send(TaskMsg::Event(e));
    }
}

impl NodeCtx {
    pub fn store(&self) -> &Store {
        &self.backends.store
    }

    /// The provider a node uses: its own `llm:`, else the run's, under the orchestrator's
    /// provider rules (a cassette is read from the run's project).
    /// Every exchange is recorded in the run directory (`agents/<instance>/runtime/exchanges/`);
    /// in a replay (the run's setting is `recorded:<run>`) every node is answered from that
    /// run's records instead, whatever its own `llm:`; a replay that goes on live after a
    /// divergence sends what the records do not answer to the node's own `llm:` or the
    /// replay's live provider, and records a `replay.live` event once per attempt.
    pub async fn provider(
        &self,
        node_llm: Option<&str>,
    ) -> Result<Arc<dyn cairn_agents::Provider>, cairn_agents::AgentError> {
        use cairn_agents::recorded::{LiveAfter, Recorded, WentLive};
        use cairn_agents::records::{Recording, EXCHANGES_DIR};
        let instance = self.node_id.replace('.', "-");
        let store = &self.backends.store;
        let providers = &self.backends.providers;
        let inner: Arc<dyn cairn_agents::Provider> = match self.replay() {
            Some(replay) => {
                let recorded = Recorded::load(
                    store.clone(),
                    &self.project,
                    &RunDir::new(&replay.source).agent(&instance, EXCHANGES_DIR),
                    self.attempt,
                    self.turn,
                )
                .await?;
                match &replay.live_after {
                    Some(spec) => {
                        let progress = self.progress.clone();
                        let on_live = move |w: WentLive| {
                            progress.emit(went_live_event(&w));
                        };
                        Arc::new(
                            recorded.live_after(LiveAfter {
                                provider: providers
                                    .get(node_llm.unwrap_or(spec), store, &self.project)
                                    .await?,
                                on_live: Arc::new(on_live),
                            }),
                        )
                    }
                    None => Arc::new(recorded),
                }
            }
            None => {
                providers
                    .get(node_llm.unwrap_or(&self.llm), store, &self.project)
                    .await?
            }
        };
        Ok(Arc::new(Recording::new(
            inner,
            store.clone(),
            &self.project,
            &self.run_dir().agent(&instance, EXCHANGES_DIR),
            self.attempt,
        )))
    }

    /// How this run replays a recorded one, when it is a replay.
    pub fn replay(&self) -> Option<cairn_agents::recorded::ReplaySpec> {
        cairn_agents::recorded::ReplaySpec::parse(&self.llm)
    }

    pub fn run_dir(&self) -> RunDir {
        RunDir::new(&self.run_id)
    }

    /// This attempt's output line (kinds that print call `begin` first).
    pub fn log(&self) -> logs::NodeLog {
        logs::NodeLog::new(
            self.backends.logs.clone(),
            &self.project,
            &self.run_id,
            &self.node_id,
            self.attempt,
        )
    }
}

/// The `replay.live` event of a replay that left its records at a node.
pub fn went_live_event(w: &cairn_agents::recorded::WentLive) -> events::Ev {
    events::Ev::new(events::REPLAY_LIVE, &w.node)
        .level(cairn_proto::v1::Level::Warning)
        .with("attempt", w.attempt)
        .with("why", w.why)
        .with("turn", w.turn)
        .with("step", w.step)
        .with("diff", w.diff.as_str())
}

/// A refused or failed write, with the fix for the common case.
pub fn write_error(path: &str, s: &tonic::Status) -> NodeError {
    if s.code() == Code::AlreadyExists {
        return NodeError::refused(format!(
            "{path} already exists with other content; set `overwrite: true` on the node to replace it"
        ));
    }
    NodeError::from_status(&format!("writing {path}"), s)
}

/// What a node does with a path its graph names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// The run-records rule for a path (or prefix) a graph names, after rendering: a node never
/// writes under `.cairn/` and reads only its own run's records there.
pub fn check_access(
    run_id: &str,
    field: &str,
    path: &str,
    access: Access,
) -> Result<(), NodeError> {
    let checked = match access {
        Access::Write => pathguard::records::check_node_write(path),
        Access::Read => pathguard::records::check_node_read(path, run_id),
    };
    checked.map_err(|e| NodeError::refused(format!("field `{field}`: {e}")))
}

/// Renders and checks a project path field the node uses as `access` says.
pub fn project_path(
    scope: &Scope,
    field: &str,
    t: &Template,
    access: Access,
) -> Result<String, NodeError> {
    let path = scope.render(field, t)?;
    pathguard::validate(&path)
        .map_err(|rej| NodeError::refused(format!("field `{field}`: `{path}`: {rej}")))?;
    check_access(&scope.graph.run_id, field, &path, access)?;
    Ok(path)
}

/// Expands file entries a node reads: an entry ending in `/` is every file beneath that
/// prefix.
pub async fn expand_files(
    ctx: &NodeCtx,
    field: &str,
    entries: &[Template],
) -> Result<Vec<String>, NodeError> {
    let mut out = Vec::new();
    for (i, t) in entries.iter().enumerate() {
        let f = format!("{field}[{i}]");
        match ctx.scope.render_value(&f, t)? {
            Value::Array(list) => {
                for v in list {
                    let p = cairn_graph::template::value_text(&v);
                    pathguard::validate(&p)
                        .map_err(|rej| NodeError::refused(format!("field `{f}`: `{p}`: {rej}")))?;
                    check_access(&ctx.run_id, &f, &p, Access::Read)?;
                    out.push(p);
                }
            }
            v => {
                let p = cairn_graph::template::value_text(&v);
                if let Some(prefix) = p.strip_suffix('/') {
                    pathguard::validate_prefix(prefix)
                        .map_err(|rej| NodeError::refused(format!("field `{f}`: `{p}`: {rej}")))?;
                    check_access(&ctx.run_id, &f, &p, Access::Read)?;
                    let listed = ctx
                        .store()
                        .list(&ctx.project, prefix, true)
                        .await
                        .map_err(|s| NodeError::from_status(&format!("listing {p}"), &s))?;
                    out.extend(
                        listed
                            .into_iter()
                            .filter(|e| e.kind == cairn_proto::v1::EntryKind::File as i32)
                            .map(|e| e.path),
                    );
                } else {
                    pathguard::validate(&p)
                        .map_err(|rej| NodeError::refused(format!("field `{f}`: `{p}`: {rej}")))?;
                    check_access(&ctx.run_id, &f, &p, Access::Read)?;
                    out.push(p);
                }
            }
        }
    }
    out.dedup();
    Ok(out)
}

/// `artifact.written` for a file this node wrote.
pub fn artifact_written(
    node: &str,
    put: &cairn_proto::v1::PutResponse,
    agent_instance: Option<&str>,
) -> Ev {
    let digest = put.digest.clone().unwrap_or_default();
    let mut e = Ev::new(events::ARTIFACT_WRITTEN, node)
        .with("path", put.path.clone())
        .with("bytes", digest.size_bytes)
        .with("sha256", digest.sha256)
        .with("outcome", outcome_word(put.outcome));
    if let Some(a) = agent_instance {
        e = e.with("agent_instance", a);
    }
    e
}

pub fn outcome_word(outcome: i32) -> &'static str {
    use cairn_proto::v1::WriteOutcome as W;
    match W::try_from(outcome) {
        Ok(W::Created) => "created",
        Ok(W::Unchanged) => "unchanged",
        Ok(W::Overwritten) => "overwritten",
        _ => "written",
    }
}

/// The outputs every file-writing node shares.
pub fn file_outputs(put: &cairn_proto::v1::PutResponse) -> Map<String, Value> {
    let digest = put.digest.clone().unwrap_or_default();
    let mut m = Map::new();
    m.insert("path".into(), put.path.clone().into());
    m.insert("bytes".into(), digest.size_bytes.into());
    m.insert("sha256".into(), digest.sha256.into());
    m.insert("outcome".into(), outcome_word(put.outcome).into());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runner at max_concurrent_runs ran nothing: the node is retried; other exhaustion
    /// (inputs too large) fails it.
    #[test]
    fn a_busy_runner_is_retried_other_exhaustion_fails() {
        let busy = cairn_proto::reason::status(
            Code::ResourceExhausted,
            "this runner already has 8 runs",
            "max_concurrent_runs",
        );
        let e = NodeError::from_status("sandbox run", &busy);
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert!(e.message.contains("[max_concurrent_runs]"), "{}", e.message);
        let big =
            cairn_proto::reason::status(Code::ResourceExhausted, "too many", "too_many_files");
        assert_eq!(
            NodeError::from_status("sandbox run", &big).kind,
            ErrorKind::Failed
        );
    }
}
