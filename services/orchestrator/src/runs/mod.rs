//! The runs of this orchestrator: submit, load and bring back to life, resume at start-up and
//! shut down; reading them is views.rs, the human actions are actions.rs. Live runs have a
//! driver (scheduler.rs); any other run is read from its records (graph.resolved.json and
//! events.jsonl, folded), and is brought back to life when an action needs it (resume, rework,
//! a gate decision). At start-up every run that is not final is resumed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cairn_proto::v1 as pb;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

mod actions;
mod heal;
mod replay;
mod views;

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::inputs::Inputs;
use crate::nodes::Backends;
use crate::recorder::Recorder;
use crate::run::{RunState, TaskState};
use crate::rundir::{self, RunDir};
use crate::scheduler::{self, Command, Launch};
use cairn_graph::{Graph, NodeKind};
use cairn_node::events::{self as ev, Ev};
use cairn_store_client::PutOptions;
use pathguard::SafePath;

/// Project and run ids: `[A-Za-z0-9._-]`, 1-128 characters (common.proto).
pub fn check_id(what: &str, id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::field(
            what,
            format!("{what} `{id}` must be 1-128 characters of letters, digits, `.`, `_`, `-`"),
        ))
    }
}

/// The run id a submit with `request_id` gets: "req-" and the first 32 hex digits of
/// sha256(project, NUL, request_id). Derived, not remembered, so a retry after a restart finds
/// the run its first submit created.
pub(crate) fn request_run_id(project: &str, request_id: &str) -> Result<String> {
    if request_id.len() > 256 {
        return Err(Error::InvalidArgument(format!(
            "request_id is {} bytes long: use at most 256 (a UUID is enough)",
            request_id.len()
        )));
    }
    let digest = cairn_sha256::Sha256::new()
        .chain(project.as_bytes())
        .chain(&[0u8])
        .chain(request_id.as_bytes())
        .finish_hex();
    Ok(format!("req-{}", &digest[..32]))
}

fn key(project: &str, run_id: &str) -> String {
    format!("{project}/{run_id}")
}

const CURSOR_PREFIX: &str = "r1.";

/// A ListRuns page token: the place (created_at, run id) of the last run sent.
fn cursor_token((created_at, run_id): &(String, String)) -> String {
    format!(
        "{CURSOR_PREFIX}{}",
        hex::encode(format!("{created_at}\n{run_id}"))
    )
}

fn parse_cursor(token: &str) -> Result<Option<(String, String)>> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || {
        Error::field(
            "page.page_token",
            "page_token is not one this server gave; start again without it",
        )
    };
    let bytes = token
        .strip_prefix(CURSOR_PREFIX)
        .and_then(|h| hex::decode(h).ok())
        .ok_or_else(bad)?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (created_at, run_id) = text.rsplit_once('\n').ok_or_else(bad)?;
    check_id("page_token", run_id).map_err(|_| bad())?;
    Ok(Some((created_at.to_owned(), run_id.to_owned())))
}

struct Live {
    cmd: mpsc::Sender<Command>,
    join: Option<tokio::task::JoinHandle<()>>,
    /// Stops this driver alone (the run stays resumable): another replica now owns the run.
    stop: Option<CancellationToken>,
}

/// What SubmitRun carries, decoded.
#[derive(Clone, Debug, Default)]
pub struct Submit {
    pub project_id: String,
    pub graph_yaml: String,
    pub vars: BTreeMap<String, String>,
    pub run_id: String,
    pub title: String,
    pub mode: String,
    pub prompt: String,
    pub by: String,
    pub llm: String,
    /// The files the graph names, as sent (SubmitRunRequest.files).
    pub files: Vec<pb::InputFile>,
    /// Where the graph's files are in the project when not sent (SubmitRunRequest.graph_dir).
    pub graph_dir: String,
    /// Idempotency key (SubmitRunRequest.request_id); empty = none.
    pub request_id: String,
    /// Re-run of this run of the same project (SubmitRunRequest.rerun_of); empty = none.
    pub rerun_of: String,
    /// Replay of this run of the same project from its records (ReplayRun); empty = none.
    pub replay_of: String,
    /// In a replay: sandbox steps run again instead of returning their recorded results.
    pub live_sandbox: bool,
    /// In a replay: gates wait for people instead of taking their recorded decisions.
    pub live_gates: bool,
    /// In a replay: what the records do not answer goes on live (to `llm`, else the recorded
    /// run's provider) instead of failing its node.
    pub live_after: bool,
}

/// Which runs ListRuns returns.
#[derive(Debug, Default)]
pub struct RunFilter {
    /// Any of these states (empty = all).
    pub states: Vec<TaskState>,
    /// Text in the title, goal or run id, lower-cased (empty = all).
    pub text: String,
    /// Created at or after.
    pub created_after: Option<time::OffsetDateTime>,
    /// Created before.
    pub created_before: Option<time::OffsetDateTime>,
    /// Only runs reported stalled.
    pub stalled: bool,
}

impl RunFilter {
    fn admits(&self, info: &pb::RunInfo) -> bool {
        let state = pb::TaskState::try_from(info.state)
            .ok()
            .and_then(TaskState::from_proto);
        if !self.states.is_empty() && !state.is_some_and(|s| self.states.contains(&s)) {
            return false;
        }
        if self.stalled && info.stalled_since.is_empty() {
            return false;
        }
        if !self.text.is_empty()
            && ![&info.title, &info.goal, &info.run_id]
                .iter()
                .any(|f| f.to_lowercase().contains(&self.text))
        {
            return false;
        }
        if self.created_after.is_none() && self.created_before.is_none() {
            return true;
        }
        // A run whose creation time is unknown matches no time bound.
        let Ok(created) = time::OffsetDateTime::parse(
            &info.created_at,
            &time::format_description::well_known::Rfc3339,
        ) else {
            return false;
        };
        self.created_after.is_none_or(|t| created >= t)
            && self.created_before.is_none_or(|t| created < t)
    }
}

/// What a re-run starts from: the source run's frozen graph and what its people last set.
struct Rerun {
    graph: Value,
    title: String,
    goal: String,
    llm: String,
}

pub struct Runs {
    b: Arc<Backends>,
    live: Arc<Mutex<HashMap<String, Live>>>,
    permits: Arc<Semaphore>,
    shutdown: CancellationToken,
    note_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per run: held while this process takes a claim on it (and while it writes under a claim
    /// taken only for that write), so a driver coming to life here and a person's note to the
    /// same run never fence each other off.
    claim_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Replicas sharing the store's runs (`[orchestrator.cluster]`); None = this one drives
    /// every run.
    cluster: std::sync::OnceLock<Arc<Cluster>>,
    /// Drivers released (stopping, no longer in `live`): waited for at shutdown.
    draining: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Runs the reconcile pass could not resume, and when it tries again.
    retry_resume: Mutex<HashMap<String, tokio::time::Instant>>,
    /// Replays whose recorded gate decisions a task of this process is taking (one per run).
    deciding: Mutex<std::collections::HashSet<String>>,
    /// This, for tasks that outlive a call (a resumed replay's gate decisions).
    me: std::sync::Weak<Runs>,
}

type Loaded = (Arc<Graph>, RunState);

impl Runs {
    pub fn new(b: Arc<Backends>) -> Arc<Runs> {
        let permits = Arc::new(Semaphore::new(b.config.max_parallel_runs));
        Arc::new_cyclic(|me| Runs {
            b,
            live: Arc::new(Mutex::new(HashMap::new())),
            permits,
            shutdown: CancellationToken::new(),
            note_locks: Mutex::new(HashMap::new()),
            claim_locks: Mutex::new(HashMap::new()),
            cluster: std::sync::OnceLock::new(),
            draining: Mutex::new(Vec::new()),
            retry_resume: Mutex::new(HashMap::new()),
            deciding: Mutex::new(Default::default()),
            me: me.clone(),
        })
    }

    /// Joins the replicas of `config` (etcd): from then on this orchestrator drives only the
    /// runs the membership gives it, adopting and releasing them as members come and go.
    pub fn join_cluster(
        self: &Arc<Self>,
        config: crate::cluster::ClusterConfig,
        tls: Option<cairn_server::Tls>,
    ) -> Arc<Cluster> {
        let cluster = Cluster::start(config, tls, self.shutdown.clone());
        let _ = self.cluster.set(cluster.clone());
        tokio::spawn(self.clone().follow_cluster(cluster.clone()));
        cluster
    }

    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.get()
    }

    fn live_cmd(&self, project: &str, run_id: &str) -> Option<mpsc::Sender<Command>> {
        let live = self.live.lock().ok()?;
        live.get(&key(project, run_id)).map(|l| l.cmd.clone())
    }

    /// The lock this process holds while it claims `run_id` (see `claim_locks`).
    fn claim_lock(&self, project: &str, run_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.claim_locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(key(project, run_id)).or_default().clone()
    }

    fn linger(&self) -> Duration {
        Duration::from_millis(self.b.config.event_linger_ms)
    }

    /// Validates and starts a run; returns once its directory and first events are durable.
    /// With a request id, a submit whose run already exists returns that run.
    pub async fn submit(&self, req: Submit) -> Result<pb::RunInfo> {
        check_id("project_id", &req.project_id)?;
        let run_id = match (req.run_id.is_empty(), req.request_id.is_empty()) {
            (true, true) => uuid::Uuid::now_v7().to_string(),
            (false, true) => req.run_id.clone(),
            (true, false) => request_run_id(&req.project_id, &req.request_id)?,
            (false, false) => {
                return Err(Error::field(
                    "request_id",
                    "run_id and request_id are both set: send request_id alone (the run id is derived from it, so a retry finds the run) or run_id alone",
                ))
            }
        };
        check_id("run_id", &run_id)?;
        let project = req.project_id.clone();
        let idempotent = !req.request_id.is_empty();
        match self.submit_as(req, run_id).await {
            Err(Error::RunExists { project: p, run_id }) if idempotent => {
                tracing::info!(project = %p, run_id = %run_id, "submit retried with its request_id: returning the run");
                self.get(&project, &run_id).await
            }
            other => other,
        }
    }

    async fn submit_as(&self, mut req: Submit, run_id: String) -> Result<pb::RunInfo> {
        let replay = !req.replay_of.is_empty();
        // A replay against a changed graph: the new graph with the recorded run's variables
        // (those of the request replace them), the recorded run's provider.
        let changed = replay && !req.graph_yaml.trim().is_empty();
        let (graph, llm_spec, inputs) = if changed {
            let (recorded, _, state) = self.read_records(&req.project_id, &req.replay_of).await?;
            let mut vars: BTreeMap<String, String> = recorded
                .get("vars")
                .and_then(serde_json::Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                        .collect()
                })
                .unwrap_or_default();
            vars.extend(std::mem::take(&mut req.vars));
            req.vars = vars;
            let (graph, _, inputs) = self.new_graph(&req, &run_id).await?;
            let llm = if req.llm.is_empty() {
                state.llm
            } else {
                req.llm.clone()
            };
            (graph, llm, inputs)
        } else if req.rerun_of.is_empty() && !replay {
            self.new_graph(&req, &run_id).await?
        } else {
            let src = self.rerun_source(&req).await?;
            let mut graph = Graph::from_value(src.graph, &run_id, &req.vars)?;
            self.b.kinds.check(&graph)?;
            graph.title = if req.title.is_empty() {
                src.title
            } else {
                req.title.clone()
            };
            graph.goal = src.goal;
            // Prompts, schemas and limits were read at the first submit and kept in the graph.
            let llm = if req.llm.is_empty() {
                src.llm
            } else {
                req.llm.clone()
            };
            (graph, llm, BTreeMap::new())
        };
        // The provider rules of agents/providers.rs: a name, a cassette, an allowed URL. A
        // replay is answered from the recorded run's exchanges only (cairn_agents::recorded),
        // or after a divergence by the provider those rules choose (`live_after`).
        let llm = if replay {
            let live_after = if req.live_after {
                let spec = cairn_agents::recorded::ReplaySpec::parse(&llm_spec)
                    .and_then(|r| r.live_after)
                    .unwrap_or(llm_spec);
                Some(
                    self.b
                        .providers
                        .choose(&spec, &graph, &self.b.store, &req.project_id)
                        .await?,
                )
            } else {
                None
            };
            cairn_agents::recorded::ReplaySpec {
                source: req.replay_of.clone(),
                live_sandbox: req.live_sandbox,
                live_gates: req.live_gates,
                live_after,
            }
            .to_spec_string()
        } else {
            self.b
                .providers
                .choose(&llm_spec, &graph, &self.b.store, &req.project_id)
                .await?
        };
        self.check_resources(&graph, &llm)?;
        let graph = Arc::new(graph);
        let project = req.project_id.clone();
        let dir = RunDir::new(&run_id);
        let store = &self.b.store;

        // Reserve the id among live runs while the directory is created.
        let Some(cmd_rx) = self.reserve(&project, &run_id)? else {
            return Err(Error::RunExists { project, run_id });
        };
        let created = match self.create_run_dir(&project, &run_id, &graph).await {
            Ok(epoch) => match crate::inputs::record(store, &project, &run_id, &inputs).await {
                Ok(()) => Ok(epoch),
                Err(e) => {
                    store.forget_claim(&project, &run_id, epoch);
                    Err(e)
                }
            },
            Err(e) => Err(e),
        };
        let epoch = match created {
            Ok(epoch) => epoch,
            Err(e) => {
                self.unreserve(&project, &run_id);
                return Err(e);
            }
        };

        // The run's span: its recorder, snapshot writer, driver and nodes live under it.
        let span = run_span(&project, &run_id, false);
        let recorder = span.in_scope(|| {
            Recorder::start(
                store.clone(),
                project.clone(),
                run_id.clone(),
                0,
                epoch,
                self.linger(),
            )
        });
        let mut state = RunState::new(&project, &graph);
        let by = if req.by.is_empty() {
            "user".to_owned()
        } else {
            req.by.clone()
        };
        let mut created = Ev::run(ev::TASK_CREATED)
            .with("by", by)
            .with("title", graph.title.clone())
            .with("topology", graph.topology.clone())
            .with("llm", llm)
            .with(
                "inputs",
                inputs.keys().map(|p| p.as_str()).collect::<Vec<_>>(),
            )
            .with("nodes", graph.nodes.len())
            .with("vars", json!(graph.vars));
        if !req.rerun_of.is_empty() {
            created = created.with("rerun_of", req.rerun_of.clone());
        }
        if replay {
            created = created.with("replay_of", req.replay_of.clone());
        }
        if let Some(t) = cairn_telemetry::traceparent(&span) {
            created = created.with("traceparent", t);
        }
        let ts = ev::now();
        state.apply(&crate::run::EventView::live(&created, &ts));
        recorder.push(&created);
        let flushed = recorder
            .flush()
            .await
            .map_err(|e| Error::Unavailable(e.to_string()));
        let written = match flushed {
            Ok(()) => {
                self.write_snapshot(&state, &graph, recorder.seq_of(1).unwrap_or(0))
                    .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            self.unreserve(&project, &run_id);
            return Err(e);
        }
        let info = state.to_info(dir.root());
        span.in_scope(|| self.launch(graph, state, recorder, None, None, cmd_rx))?;
        cairn_telemetry::metrics::run_entered(TaskState::Created.as_str());
        Ok(info)
    }

    /// A new run's graph from the request's YAML or built-in mode, with the files it names
    /// read (inputs.rs); with the LLM spec asked for and those files, to record.
    async fn new_graph(
        &self,
        req: &Submit,
        run_id: &str,
    ) -> Result<(Graph, String, BTreeMap<SafePath, Bytes>)> {
        // A built-in mode (modes.rs) is an embedded graph with the prompt as vars.prompt.
        let (graph_yaml, vars, mode_title) = if req.mode.trim().is_empty() {
            let mut vars = req.vars.clone();
            if !req.prompt.is_empty() {
                vars.entry("prompt".into())
                    .or_insert_with(|| req.prompt.clone());
            }
            (req.graph_yaml.as_str(), vars, None)
        } else {
            let b = crate::modes::builtin(&req.mode, &req.prompt, &req.graph_yaml, &req.vars)?;
            (b.graph_yaml, b.vars, Some(b.title))
        };
        if graph_yaml.trim().is_empty() {
            return Err(Error::field(
                "graph_yaml",
                format!(
                    "graph_yaml is empty: send the graph (docs/graphs.md), a built-in mode ({}) or rerun_of",
                    crate::modes::names()
                ),
            ));
        }
        let mut graph = Graph::from_yaml(graph_yaml, run_id, &vars)?;
        self.b.kinds.check(&graph)?;
        if !req.title.is_empty() {
            graph.title = req.title.clone();
        } else if let Some(t) = mode_title {
            graph.title = t;
        }
        // schema, limits and prompt files are read now and kept in the graph.
        let files = Inputs::new(
            &self.b.store,
            &req.project_id,
            &req.graph_dir,
            req.files.clone(),
        )?;
        let prepared = cairn_phases::prepare(&mut graph, &files).await;
        if let Some(e) = files.unavailable() {
            return Err(e);
        }
        prepared?;
        Ok((graph, req.llm.clone(), files.into_used()))
    }

    /// The records a re-run starts from (the source run must be in the same project).
    async fn rerun_source(&self, req: &Submit) -> Result<Rerun> {
        let (field, source) = if req.replay_of.is_empty() {
            ("rerun_of", &req.rerun_of)
        } else {
            ("replay_of", &req.replay_of)
        };
        check_id(field, source)?;
        if !req.graph_yaml.trim().is_empty() || !req.mode.is_empty() || !req.prompt.is_empty() {
            return Err(Error::field(
                "graph_yaml",
                format!("{field} starts from the recorded graph: leave graph_yaml, mode and prompt empty (vars, title and llm may replace the recorded ones)"),
            ));
        }
        let (value, _, state) = self.read_records(&req.project_id, source).await?;
        Ok(Rerun {
            graph: value,
            title: state.title,
            goal: state.goal,
            llm: state.llm,
        })
    }

    /// Checks what a run will need before it starts: an LLM provider for agent nodes (`llm`,
    /// chosen and checked by the providers), a runner for sandbox nodes.
    fn check_resources(&self, graph: &Graph, llm: &str) -> Result<()> {
        let kinds = |pred: &dyn Fn(&NodeKind) -> bool| {
            graph
                .nodes
                .iter()
                .any(|n| pred(&n.kind) || matches!(&n.kind, NodeKind::Map(m) if pred(&m.node.kind)))
        };
        let needs_llm = kinds(&|k| matches!(k, NodeKind::AgentTask(a) if a.llm.is_none()));
        if needs_llm && llm.is_empty() {
            return Err(Error::InvalidArgument(
                "the graph has agent_task nodes but no LLM provider: set `llm:` in the graph to a provider name, pass llm (e.g. `cairn run --llm replay:cassette.yaml`), or configure default_llm".into(),
            ));
        }
        // A replay's sandbox_run steps (and external agent turns) return their recorded
        // results unless they run live.
        let recorded_sandbox =
            cairn_agents::recorded::ReplaySpec::parse(llm).is_some_and(|r| !r.live_sandbox);
        if kinds(&|k| matches!(k, NodeKind::SandboxRun(_)))
            && self.b.runners.is_empty()
            && !recorded_sandbox
        {
            return Err(Error::FailedPrecondition(
                "the graph has sandbox_run nodes but this orchestrator has no sandbox runner (set sandbox_addrs)".into(),
            ));
        }
        // Installed tools were checked by their kind (they exist, their arguments are given).
        let installed = kinds(
            &|k| matches!(k, NodeKind::ToolCall(t) if !cairn_graph::tools::is_builtin(&t.tool)),
        );
        if installed
            && self.b.config.sandbox.runner.features.use_for_tools
            && self.b.runners.is_empty()
        {
            return Err(Error::FailedPrecondition(
                "sandbox.runner.features.use_for_tools is on but this orchestrator has no sandbox runner (set sandbox_addrs, or turn the feature off)".into(),
            ));
        }
        // A replay's external agent turns are answered from their records the same way.
        if kinds(&|k| matches!(k, NodeKind::ExternalAgent(_)))
            && self.b.runners.is_empty()
            && !recorded_sandbox
        {
            return Err(Error::FailedPrecondition(
                "the graph has external_agent nodes, which run in a sandbox session, but this orchestrator has no sandbox runner (set sandbox_addrs)".into(),
            ));
        }
        Ok(())
    }

    /// Claims a new run and writes its first records under that claim; returns the epoch.
    async fn create_run_dir(&self, project: &str, run_id: &str, graph: &Graph) -> Result<u64> {
        let store = &self.b.store;
        let dir = RunDir::new(run_id);
        store
            .create_project(project)
            .await
            .map_err(Error::store(format!("creating project {project}")))?;
        if store
            .stat(project, &dir.graph_resolved(), false)
            .await
            .map_err(Error::store("checking the run id"))?
            .is_some()
        {
            return Err(Error::RunExists {
                project: project.to_owned(),
                run_id: run_id.to_owned(),
            });
        }
        // Records are written only under the run's claim, the first ones included.
        let (epoch, _) = store
            .claim_run(project, run_id)
            .await
            .map_err(Error::store(format!("claiming run {run_id}")))?;
        let written = self.write_first_records(project, run_id, graph).await;
        if written.is_err() {
            store.forget_claim(project, run_id, epoch);
        }
        written.map(|()| epoch)
    }

    async fn write_first_records(&self, project: &str, run_id: &str, graph: &Graph) -> Result<()> {
        let store = &self.b.store;
        let dir = RunDir::new(run_id);
        let resolved = format!("{:#}\n", graph.to_resolved_json());
        store
            .put(
                project,
                &dir.graph_resolved(),
                Bytes::from(resolved),
                &PutOptions::default(),
            )
            .await
            .map_err(|s| {
                // Written once: another submit of this run id got there first.
                if s.code() == tonic::Code::AlreadyExists
                    || cairn_proto::reason::of(&s).as_deref() == Some("write_once")
                {
                    Error::RunExists {
                        project: project.to_owned(),
                        run_id: run_id.to_owned(),
                    }
                } else {
                    Error::Store {
                        context: format!("writing {}", dir.graph_resolved()),
                        status: s,
                    }
                }
            })?;
        let state = RunState::new(project, graph);
        let files = rundir::initial_files(&state);
        let opts = PutOptions::default();
        let puts = files
            .iter()
            .map(|(p, body)| store.put(project, p, Bytes::from(body.clone()), &opts));
        for (r, (p, _)) in futures::future::join_all(puts)
            .await
            .into_iter()
            .zip(&files)
        {
            r.map_err(Error::store(format!("writing {p}")))?;
        }
        Ok(())
    }

    async fn write_snapshot(&self, state: &RunState, graph: &Graph, seq: u64) -> Result<()> {
        let dir = RunDir::new(&state.run_id);
        let opts = PutOptions {
            overwrite: true,
            ..Default::default()
        };
        let files = [
            (dir.task_yaml(), rundir::render_task_yaml(state, seq)),
            (dir.state_json(), rundir::render_state_json(state, seq)),
            (dir.readme(), rundir::render_readme(state, graph)),
        ];
        let puts = files.iter().map(|(p, b)| {
            self.b
                .store
                .put(&state.project, p, Bytes::from(b.clone()), &opts)
        });
        for (r, (p, _)) in futures::future::join_all(puts)
            .await
            .into_iter()
            .zip(&files)
        {
            r.map_err(Error::store(format!("writing {p}")))?;
        }
        Ok(())
    }

    /// Takes back a reservation whose run did not come to life.
    fn unreserve(&self, project: &str, run_id: &str) {
        if let Ok(mut live) = self.live.lock() {
            live.remove(&key(project, run_id));
        }
    }

    /// Registers a run as live; None when it already is (another caller won the race).
    fn reserve(&self, project: &str, run_id: &str) -> Result<Option<mpsc::Receiver<Command>>> {
        let mut live = self
            .live
            .lock()
            .map_err(|_| Error::Internal("run table poisoned".into()))?;
        let k = key(project, run_id);
        if live.contains_key(&k) {
            return Ok(None);
        }
        let (tx, rx) = mpsc::channel(scheduler::COMMAND_QUEUE);
        live.insert(
            k,
            Live {
                cmd: tx,
                join: None,
                stop: None,
            },
        );
        Ok(Some(rx))
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        graph: Arc<Graph>,
        state: RunState,
        recorder: Recorder,
        resume: Option<(String, String)>,
        initial: Option<Command>,
        cmds: mpsc::Receiver<Command>,
    ) -> Result<()> {
        let k = key(&state.project, &state.run_id);
        let live = self.live.clone();
        let exit_key = k.clone();
        let (store, project, run_id, epoch) = (
            self.b.store.clone(),
            state.project.clone(),
            state.run_id.clone(),
            recorder.epoch(),
        );
        let mine = self.live_cmd(&state.project, &state.run_id);
        let logs = self.b.logs.clone();
        let stop = self.shutdown.child_token();
        let join = scheduler::launch(Launch {
            backends: self.b.clone(),
            graph,
            state,
            recorder,
            permits: self.permits.clone(),
            shutdown: stop.clone(),
            resume,
            initial,
            on_exit: Box::new(move || {
                if let Ok(mut l) = live.lock() {
                    // Only this driver's entry (a new driver may have registered since).
                    let ours = match (l.get(&exit_key), &mine) {
                        (Some(entry), Some(tx)) => entry.cmd.same_channel(tx),
                        _ => false,
                    };
                    if ours {
                        l.remove(&exit_key);
                    }
                }
                logs.forget(&project, &run_id);
                store.forget_claim(&project, &run_id, epoch);
            }),
            cmds,
        });
        let mut live = self
            .live
            .lock()
            .map_err(|_| Error::Internal("run table poisoned".into()))?;
        if let Some(l) = live.get_mut(&k) {
            l.join = Some(join);
            l.stop = Some(stop);
        }
        Ok(())
    }

    /// Reads a run from its records.
    async fn load(&self, project: &str, run_id: &str) -> Result<Loaded> {
        let (_, graph, state) = self.read_records(project, run_id).await?;
        Ok((Arc::new(graph), state))
    }

    /// A run's frozen graph (as JSON and parsed) and its state folded from its events.
    async fn read_records(&self, project: &str, run_id: &str) -> Result<(Value, Graph, RunState)> {
        check_id("project_id", project)?;
        check_id("run_id", run_id)?;
        let dir = RunDir::new(run_id);
        let store = &self.b.store;
        let bytes = store
            .get(project, &dir.graph_resolved())
            .await
            .map_err(Error::store(format!("reading {}", dir.graph_resolved())))?
            .ok_or_else(|| Error::RunNotFound {
                project: project.to_owned(),
                run_id: run_id.to_owned(),
            })?;
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Internal(format!("{} is not JSON: {e}", dir.graph_resolved())))?;
        let graph = Graph::from_value(value.clone(), run_id, &BTreeMap::new()).map_err(|e| {
            Error::Internal(format!("{} no longer validates: {e}", dir.graph_resolved()))
        })?;
        let events = store
            .read_events(project, run_id, 1)
            .await
            .map_err(Error::store(format!("reading the events of {run_id}")))?;
        let mut state = RunState::new(project, &graph);
        state.apply_stored(&events);
        Ok((value, graph, state))
    }

    /// Makes a non-final run live (resuming it from its records); returns its command line.
    async fn ensure_live(
        &self,
        project: &str,
        run_id: &str,
        by: &str,
        reason: &str,
        initial: Option<Command>,
    ) -> Result<mpsc::Sender<Command>> {
        self.held_here(project, run_id);
        if let Some(c) = self.live_cmd(project, run_id) {
            if let Some(cmd) = initial {
                c.send(cmd)
                    .await
                    .map_err(|_| Error::Unavailable("the run is stopping; retry".into()))?;
            }
            return Ok(c);
        }
        let by = if by.is_empty() {
            "orchestrator".to_owned()
        } else {
            by.to_owned()
        };
        let Some(cmds) = self.reserve(project, run_id)? else {
            // Someone else brought it to life meanwhile: use theirs.
            return Box::pin(self.ensure_live(project, run_id, &by, reason, initial)).await;
        };
        let loaded = async {
            // Fence off any earlier driver (a killed or partitioned orchestrator whose appends
            // may still be in flight), then read the records: after the claim they are
            // complete.
            let claiming = self.claim_lock(project, run_id);
            let claimed = claiming.lock().await;
            let (epoch, _) = self
                .b
                .store
                .claim_run(project, run_id)
                .await
                .map_err(Error::store(format!("claiming run {run_id}")))?;
            drop(claimed);
            let (graph, state) = self.load(project, run_id).await?;
            let resume = match (state.state, &initial) {
                // A finished run comes back only for the command (a rework resets what it
                // names).
                (TaskState::Completed | TaskState::Canceled | TaskState::Failed, Some(_)) => None,
                (TaskState::Completed | TaskState::Canceled, None) => {
                    return Err(Error::FailedPrecondition(format!(
                        "run {run_id} is {}",
                        state.state.as_str()
                    )))
                }
                // Not final (restart), or a failed run to retry: resume from the records.
                _ => Some((by.clone(), reason.to_owned())),
            };
            Ok((graph, state, epoch, resume))
        }
        .await;
        let (graph, state, epoch, resume) = match loaded {
            Ok(loaded) => loaded,
            Err(e) => {
                self.unreserve(project, run_id);
                return Err(e);
            }
        };
        // A replay resumed here takes its recorded gate decisions here.
        let replay = (resume.is_some() && !state.replay_of.is_empty())
            .then(|| (state.llm.clone(), state.created_by.clone()));
        let span = run_span(project, run_id, true);
        // The life before this one (a failover or restart has no caller to follow from).
        if !state.trace.is_empty() {
            cairn_telemetry::link_to(&span, &state.trace);
        }
        let recorder = span.in_scope(|| {
            Recorder::start(
                self.b.store.clone(),
                project.to_owned(),
                run_id.to_owned(),
                state.last_seq,
                epoch,
                self.linger(),
            )
        });
        span.in_scope(|| self.launch(graph, state, recorder, resume, initial, cmds))?;
        if let (Some((llm, created_by)), Some(runs)) = (replay, self.me.upgrade()) {
            let (project, run) = (project.to_owned(), run_id.to_owned());
            tokio::spawn(async move {
                runs.take_remaining_decisions(&project, &run, &llm, &created_by)
                    .await
            });
        }
        self.live_cmd(project, run_id)
            .ok_or_else(|| Error::Internal("run did not start".into()))
    }

    /// Resumes every run that is not final (start-up). Waits for the store for up to a minute.
    pub async fn resume_unfinished(self: Arc<Self>) -> usize {
        let mut delay = Duration::from_millis(100);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let projects = loop {
            match self.b.store.projects().await {
                Ok(p) => break p,
                Err(e)
                    if tokio::time::Instant::now() < deadline && !self.shutdown.is_cancelled() =>
                {
                    tracing::debug!(error = %e, "store not reachable yet; waiting to resume runs");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not list projects; unfinished runs are not resumed");
                    return 0;
                }
            }
        };
        self.resume_listed(projects).await
    }

    /// Resumes the runs of `projects` the store's run index names unfinished, unless live
    /// here or owned by another replica; returns how many came to life.
    async fn resume_listed(&self, projects: Vec<String>) -> usize {
        let mut resumed = 0;
        for project in projects {
            let mut token = String::new();
            loop {
                // The store's run index names the runs that may not be final (not every run
                // directory is read); each is checked against its own records below.
                let page = match self
                    .b
                    .store
                    .list_run_summaries(pb::ListRunSummariesRequest {
                        project_id: project.clone(),
                        unfinished: true,
                        page: Some(pb::PageRequest {
                            page_size: 1000,
                            page_token: token.clone(),
                        }),
                        ..Default::default()
                    })
                    .await
                {
                    Ok(page) => page,
                    Err(e) => {
                        tracing::warn!(%project, error = %e, "could not list the project's unfinished runs; they are not resumed now");
                        break;
                    }
                };
                for summary in page.runs {
                    if self.shutdown.is_cancelled() {
                        return resumed;
                    }
                    let run_id = summary.run_id;
                    if self.resume_one(&project, &run_id).await {
                        resumed += 1;
                    }
                }
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
        }
        resumed
    }

    /// Resumes one run found unfinished, unless it is live here or another replica owns it.
    async fn resume_one(&self, project: &str, run_id: &str) -> bool {
        if check_id("run_id", run_id).is_err() {
            return false;
        }
        let elsewhere = self.cluster().is_some_and(|c| !c.owns(project, run_id));
        if elsewhere
            || self.held_here(project, run_id)
            || self.resume_backing_off(project, run_id)
            || !self.unfinished(project, run_id).await
        {
            return false;
        }
        let started = std::time::Instant::now();
        let (why, reason) = if self.cluster().is_some() {
            ("adopted by this replica", "failover")
        } else {
            ("restart", "restart")
        };
        match self
            .ensure_live(project, run_id, "orchestrator", why, None)
            .await
        {
            Ok(_) => {
                cairn_telemetry::metrics::run_adopted(reason, started.elapsed());
                tracing::info!(%project, %run_id, "resumed unfinished run");
                true
            }
            Err(e) => {
                tracing::warn!(%project, %run_id, error = %e, "could not resume run");
                self.resume_failed(project, run_id);
                false
            }
        }
    }

    /// Whether a run is not final: state.json says so, or events were recorded after it.
    async fn unfinished(&self, project: &str, run_id: &str) -> bool {
        let dir = RunDir::new(run_id);
        let snapshot = match self.b.store.get(project, &dir.state_json()).await {
            Ok(Some(b)) => serde_json::from_slice::<Value>(&b).ok(),
            _ => None,
        };
        let (state, seq) = match &snapshot {
            Some(v) => (
                v.get("state")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                v.get("events_seq").and_then(Value::as_u64).unwrap_or(0),
            ),
            None => (String::new(), 0),
        };
        if !matches!(state.as_str(), "completed" | "failed" | "canceled") {
            // Not final by its snapshot: check the events (the snapshot may lag).
            return match self.load(project, run_id).await {
                Ok((_, s)) => !s.state.is_final() && s.last_seq > 0,
                Err(_) => false,
            };
        }
        // Final by its snapshot; anything recorded after it (a rework) means it moved on.
        match self.b.store.read_events(project, run_id, seq + 1).await {
            Ok(later) if !later.is_empty() => match self.load(project, run_id).await {
                Ok((_, s)) => !s.state.is_final(),
                Err(_) => false,
            },
            _ => false,
        }
    }

    /// Stops every driver (runs stay resumable) and waits for their records to be flushed.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let mut joins: Vec<tokio::task::JoinHandle<()>> = match self.live.lock() {
            Ok(mut l) => l.values_mut().filter_map(|r| r.join.take()).collect(),
            Err(_) => Vec::new(),
        };
        if let Ok(mut d) = self.draining.lock() {
            joins.append(&mut d);
        }
        for j in joins {
            let _ = tokio::time::timeout(Duration::from_secs(30), j).await;
        }
    }
}

/// The span of one life of a run: its driver, recorder, snapshots and node tasks run in it,
/// so every call they make joins its trace. A submitted run continues the submitter's trace
/// when that trace is recorded (a call without a trace context may not be: see
/// `sample_untraced`); otherwise, and for a run brought back to life (resume, rework or gate
/// decision of a run with no driver, start-up resume, adoption by another replica), it starts
/// a new trace that follows from the span that brought it back. A run brought back also links
/// its previous life's trace (see `ensure_live`).
fn run_span(project: &str, run_id: &str, resumed: bool) -> tracing::Span {
    let current = tracing::Span::current();
    if !resumed && cairn_telemetry::sampled(&current) {
        return tracing::info_span!(
            "cairn.run",
            otel.name = "run",
            cairn.project = %project,
            cairn.run_id = %run_id,
        );
    }
    let span = tracing::info_span!(
        parent: None,
        "cairn.run",
        otel.name = "run",
        cairn.project = %project,
        cairn.run_id = %run_id,
        cairn.resumed = resumed,
    );
    span.follows_from(current);
    span
}
