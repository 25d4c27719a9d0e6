//! cairn's graph language (docs/graphs.md, docs/graph.schema.json): YAML parsed with serde-saphyr,
//! checked completely at submit time so a run never fails on something that could have been
//! seen before it started: unknown fields, unknown or self `needs`, cycles, template references
//! to unknown nodes/fields/variables, both `code` and `code_file`, bad static
//! paths. Errors name the node and the field.
//!
//! A validated [`Graph`] is what graph.resolved.json holds (templates as written, the run id and
//! the final variable values, dependencies made explicit), so a
//! run never changes under edits of its source graph; resuming re-reads and re-checks it.
//!
//! This crate is pure: the spec of every node kind, validation, expressions and templates,
//! with no async runtime, RPC or I/O (it depends on serde, pathguard, globset and jsonschema
//! only). What only a deployment knows (its LLM providers, adapters, installed tools) is
//! checked by the node kinds at submit; running nodes is the orchestrator's.

pub mod assemble;
pub mod code_delivery;
pub mod contract;
pub mod expr;
pub mod plan;
pub mod targets;
pub mod template;
pub mod tools;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use expr::Expr;
pub use template::{Ref, Template};

/// The adapter of an `external_agent` node that names none.
pub const DEFAULT_ADAPTER: &str = "codex-exec";

/// Largest graph document accepted.
pub const MAX_GRAPH_BYTES: usize = 4 << 20;
/// Most nodes in one graph (map items are not nodes).
pub const MAX_NODES: usize = 10_000;
/// Most items one map may fan out to.
pub const MAX_MAP_ITEMS: usize = 100_000;

/// A graph error: which node and field, and what to fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphError {
    pub node: Option<String>,
    pub field: Option<String>,
    pub message: String,
    /// The node's index in the graph's `nodes:` list, once known.
    pub position: Option<usize>,
}

impl GraphError {
    fn graph(message: impl Into<String>) -> Self {
        GraphError {
            position: None,
            node: None,
            field: None,
            message: message.into(),
        }
    }
    pub fn node(node: &str, field: Option<&str>, message: impl Into<String>) -> Self {
        GraphError {
            position: None,
            node: Some(node.to_owned()),
            field: field.map(str::to_owned),
            message: message.into(),
        }
    }
}

impl GraphError {
    /// This error with the index of its node in `ids` (the graph's node ids, in order).
    pub fn locate(mut self, ids: &[String]) -> Self {
        if self.position.is_none() {
            let id = self.node.as_deref().unwrap_or_default();
            // A map body is named `<map>.item`; its fields are under the map's `node:`.
            let top = id.strip_suffix(".item").unwrap_or(id);
            self.position = ids.iter().position(|i| i == top);
        }
        self
    }

    /// The refused field as a path into the graph document, as in a `BadRequest` field
    /// violation: `nodes[3].prompt_file`, `nodes[2].node.type` (a map body),
    /// `contracts[0].schema_file`, `version`; empty for the graph as a whole.
    pub fn field_path(&self) -> String {
        let body = self.node.as_deref().is_some_and(|n| n.ends_with(".item"));
        let field = self.field.as_deref().map(|f| match body {
            true if !f.starts_with("node.") => format!("node.{f}"),
            _ => f.to_owned(),
        });
        match (self.position, field) {
            (Some(i), Some(f)) => format!("nodes[{i}].{f}"),
            (Some(i), None) => format!("nodes[{i}]"),
            (None, Some(f)) => f,
            (None, None) => String::new(),
        }
    }
}

impl fmt::Display for GraphError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.node, &self.field) {
            (Some(n), Some(field)) => write!(f, "node `{n}` field `{field}`: {}", self.message),
            (Some(n), None) => write!(f, "node `{n}`: {}", self.message),
            (None, Some(field)) => write!(f, "graph field `{field}`: {}", self.message),
            (None, None) => write!(f, "graph: {}", self.message),
        }
    }
}

impl std::error::Error for GraphError {}

/// Error kinds a retry policy can name (`retry_on`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The node's deadline passed (per-node `timeout_s`).
    Timeout,
    /// A service (store, runner, ingest, LLM) could not be reached or was shutting down.
    Unavailable,
    /// The node's own work failed (non-zero exit, provider error, ...).
    Failed,
    /// A request was refused as invalid (bad path, exists, not allowed); never worth a retry.
    Refused,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Failed => "failed",
            ErrorKind::Refused => "refused",
        }
    }
}

/// Per-node (or graph-wide) retry settings; unset fields fall back to the server's policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_backoff_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_backoff_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<Vec<ErrorKind>>,
}

/// When a node whose needs include a skipped node runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Every need succeeded; a skipped need skips this node too (the default).
    #[default]
    AllSucceeded,
    /// Every need succeeded or was skipped (a join after condition branches).
    NoneFailed,
}

/// What a rejected gate does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnReject {
    /// The run fails (default).
    #[default]
    Fail,
    /// The gate completes with `approved: false`; dependents decide with `when`.
    Continue,
}

/// Which existing workspace files (holding other bytes) an ingest may replace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Overwrite {
    /// None: such a block is rejected `exists`.
    Never,
    /// Files an earlier ingest wrote that nobody changed since; a human's file is kept.
    #[default]
    Ingested,
    /// Every file, whoever wrote it.
    Always,
}

impl<'de> Deserialize<'de> for Overwrite {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Spelled {
            Flag(bool),
            Word(String),
        }
        match Spelled::deserialize(d)? {
            Spelled::Flag(true) => Ok(Overwrite::Always),
            Spelled::Flag(false) => Ok(Overwrite::Ingested),
            Spelled::Word(w) => match w.as_str() {
                "never" => Ok(Overwrite::Never),
                "ingested" => Ok(Overwrite::Ingested),
                "always" => Ok(Overwrite::Always),
                other => Err(serde::de::Error::custom(format!(
                    "unknown overwrite `{other}`: one of never, ingested, always (or true = always)"
                ))),
            },
        }
    }
}

impl Overwrite {
    fn is_default(&self) -> bool {
        *self == Overwrite::Ingested
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteFile {
    pub path: Template,
    pub content: Template,
    #[serde(default)]
    pub overwrite: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentTask {
    /// The task for the agent.
    pub prompt: Template,
    /// Where the document goes (default `docs/<run_id>/<node>.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Template>,
    /// Agent name (roster); default the node id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// System prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<Template>,
    /// Project files given to the agent as context.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<Template>,
    /// Provider for this node (overrides the run's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<String>,
    #[serde(default)]
    pub overwrite: bool,
    /// YAML front matter (title, purpose, tags, task and agent ids) on the written Markdown
    /// (default true).
    #[serde(default = "yes")]
    pub front_matter: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purpose: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    #[serde(rename = "if")]
    pub cond: Expr,
    /// Nodes that run only when the condition is true.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub then: Vec<String>,
    /// Nodes that run only when it is false.
    #[serde(default, rename = "else", skip_serializing_if = "Vec::is_empty")]
    pub otherwise: Vec<String>,
}

/// Where a map's items come from.
#[derive(Clone, Debug, PartialEq)]
pub enum MapOver {
    /// Items written in the graph.
    List(Vec<Value>),
    /// A template that renders to a JSON array (`{{nodes.x.paths}}`).
    Template(Template),
    /// A JSON file in the project holding an array (optionally at a JSON pointer).
    File {
        file: Template,
        pointer: Option<String>,
    },
}

impl Serialize for MapOver {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MapOver::List(items) => items.serialize(s),
            MapOver::Template(t) => t.serialize(s),
            MapOver::File { file, pointer } => {
                let mut m = Map::new();
                m.insert("file".into(), Value::String(file.source().to_owned()));
                if let Some(p) = pointer {
                    m.insert("pointer".into(), Value::String(p.clone()));
                }
                m.serialize(s)
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct MapNode {
    pub over: MapOver,
    /// Items running at once (default 4).
    pub parallelism: u32,
    /// The node run for each item (`{{item}}`, `{{index}}` available).
    pub node: Box<Node>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    pub tool: String,
    /// Arguments; text values are templates.
    #[serde(default)]
    pub args: Map<String, Value>,
}

fn default_output_prefix() -> Template {
    Template::literal_with_refs("docs/artifacts/{{run_id}}")
}

fn default_allowed_prefixes() -> Vec<Template> {
    vec![
        Template::literal("docs/"),
        Template::literal_with_refs(".cairn/runs/{{run_id}}/"),
    ]
}

/// Its fields as graphs spell them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxRun {
    pub language: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<Template>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_file: Option<Template>,
    /// Project files (or `dir/` prefixes: every file beneath) staged read-only under /input.
    #[serde(default)]
    pub input_files: Vec<Template>,
    /// Where /output files land in the project.
    #[serde(default = "default_output_prefix")]
    pub output_prefix: Template,
    /// Prefixes inputs and outputs must lie under.
    #[serde(default = "default_allowed_prefixes")]
    pub allowed_prefixes: Vec<Template>,
    #[serde(default)]
    pub overwrite: bool,
    /// Also expose the result as `{{vars.<name>.<field>}}` (step 7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_output: Option<String>,
    /// Succeed even when the program exits non-zero or times out (the outputs say how it ended).
    #[serde(default)]
    pub allow_failure: bool,
    /// Image to run in (the runner must allow it); default the runner's image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Network in the sandbox (the runner must allow it).
    #[serde(default)]
    pub network: bool,
}

/// Characters of a sandbox image name (`cairn-toolchain:latest`, `registry/app@sha256:...`),
/// at most 255, starting with a letter or digit. Which images run is the runner's
/// `allowed_images`, known only there.
pub fn is_image_name(s: &str) -> bool {
    s.len() <= 255
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._/:@-".contains(&b))
}

/// Submit-time check of an `image:` field.
pub(crate) fn check_image(image: Option<&str>) -> Result<(), String> {
    match image {
        Some(i) if !is_image_name(i) => Err(format!(
            "`{i}` is not an image name (like cairn-toolchain:latest: letters, digits and ._/:@-, up to 255)"
        )),
        _ => Ok(()),
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gate {
    /// Why a human must look (gate.blocked reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Template>,
    /// What to check, shown in README.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<Template>,
    #[serde(default)]
    pub on_reject: OnReject,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestNode {
    pub doc_path: Template,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Which existing workspace files the blocks may replace (default `ingested`).
    #[serde(default, skip_serializing_if = "Overwrite::is_default")]
    pub overwrite: Overwrite,
}

/// A delivery target; `type` picks the implementation (delivery.rs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deliver {
    pub target: Target,
    /// Project files (or `dir/` prefixes) to deliver.
    pub files: Vec<Template>,
}

fn default_adapter() -> String {
    DEFAULT_ADAPTER.into()
}

fn default_agent_workspace() -> Template {
    Template::literal("workspace/")
}

/// An external coding-agent CLI run turn by turn in a sandbox session
/// (nodes/external_agent.rs, docs/adapters.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalAgent {
    /// The adapter (`codex-exec`).
    #[serde(default = "default_adapter")]
    pub adapter: String,
    /// The task for the agent.
    pub prompt: Template,
    /// Agent name (roster); default the node id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The program (argv prefix) instead of the adapter's default (`["codex"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Extra arguments of every turn, after the adapter's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment of the CLI (names `[A-Z_][A-Z0-9_]*`; no secrets: they are recorded).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Project directory staged as the CLI's working directory; the files it changes are
    /// written back beneath it.
    #[serde(default = "default_agent_workspace")]
    pub workspace: Template,
    /// Replace existing project files the agent changed (a resumed instance always may).
    #[serde(default)]
    pub overwrite: bool,
    /// Longest time one turn may run (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_timeout_s: Option<u64>,
    /// Network in the sandbox (the runner must allow it).
    #[serde(default)]
    pub network: bool,
    /// What a rejected approval request does: fail the run, or resume the agent told so.
    #[serde(default)]
    pub on_reject: OnReject,
}

/// What a node does.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    WriteFile(WriteFile),
    AgentTask(AgentTask),
    Condition(Condition),
    Map(MapNode),
    ToolCall(ToolCall),
    SandboxRun(SandboxRun),
    Gate(Gate),
    Ingest(IngestNode),
    Deliver(Deliver),
    /// The code delivery agent.
    CodeDelivery(code_delivery::CodeDelivery),
    ExternalAgent(ExternalAgent),
    /// plan_type tasks/auto/idle.
    Plan(plan::PlanSpec),
    /// reads phase results.
    Assemble(assemble::AssembleSpec),
}

pub const NODE_TYPES: &[&str] = &[
    "write_file",
    "agent_task",
    "condition",
    "map",
    "tool_call",
    "sandbox_run",
    "gate",
    "ingest",
    "deliver",
    "code_delivery",
    "external_agent",
    "plan",
    "assemble",
];

impl NodeKind {
    pub fn type_name(&self) -> &'static str {
        match self {
            NodeKind::WriteFile(_) => "write_file",
            NodeKind::AgentTask(_) => "agent_task",
            NodeKind::Condition(_) => "condition",
            NodeKind::Map(_) => "map",
            NodeKind::ToolCall(_) => "tool_call",
            NodeKind::SandboxRun(_) => "sandbox_run",
            NodeKind::Gate(_) => "gate",
            NodeKind::Ingest(_) => "ingest",
            NodeKind::Deliver(_) => "deliver",
            NodeKind::CodeDelivery(_) => "code_delivery",
            NodeKind::ExternalAgent(_) => "external_agent",
            NodeKind::Plan(_) => "plan",
            NodeKind::Assemble(_) => "assemble",
        }
    }

    /// The output fields `{{nodes.<id>.<field>}}` may read.
    pub fn outputs(&self) -> &'static [&'static str] {
        match self {
            NodeKind::WriteFile(_) => &[
                "path",
                "bytes",
                "sha256",
                "outcome",
                "text",
                "workspace_files",
                "not_written",
            ],
            NodeKind::AgentTask(_) => &[
                "path",
                "bytes",
                "sha256",
                "outcome",
                "text",
                "turn",
                "provider",
                "agent_instance",
                "usage",
                "workspace_files",
                "not_written",
            ],
            NodeKind::Condition(_) => &["value", "branch"],
            NodeKind::Map(_) => &["count", "succeeded", "items"],
            NodeKind::ToolCall(t) => tools::outputs(&t.tool).unwrap_or(&[]),
            NodeKind::SandboxRun(_) => &[
                "exit_code",
                "timed_out",
                "duration_ms",
                "written_files",
                "stdout",
                "stderr",
                "result_path",
                "ok",
                "runner_id",
            ],
            NodeKind::Gate(_) => &["approved", "by", "note", "decided_at"],
            NodeKind::Ingest(_) => &[
                "manifest_path",
                "written",
                "skipped",
                "rejected",
                "workspace_files",
                "not_written",
                "enabled",
            ],
            NodeKind::Deliver(_) => &["target", "location", "delivered", "uploads"],
            NodeKind::CodeDelivery(_) => code_delivery::OUTPUTS,
            NodeKind::ExternalAgent(_) => &[
                "agent_instance",
                "adapter",
                "handle",
                "text",
                "written_files",
                "deleted_files",
                "usage",
                "turn",
            ],
            NodeKind::Plan(_) => &[
                "plan_type",
                "date",
                "tasks",
                "selected_tasks",
                "selected",
                "prompts",
                "all_exhausted",
                "counters",
                "result",
            ],
            NodeKind::Assemble(_) => &[
                "plan_type",
                "status",
                "results",
                "succeeded",
                "partial",
                "failed",
                "no_changes",
                "counters",
                "result",
                "path",
                "bytes",
                "sha256",
                "outcome",
                "text",
            ],
        }
    }

    /// Pure nodes do no I/O: the scheduler runs them inline and group-commits their records
    /// (redoing one after a crash has no effect outside the run's own records).
    pub fn is_pure(&self) -> bool {
        matches!(self, NodeKind::Condition(_))
    }
}

/// One node of a validated graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub id: String,
    pub title: Option<String>,
    /// Explicit `needs` plus the dependencies implied by references and condition branches.
    pub needs: Vec<String>,
    pub when: Option<Expr>,
    pub trigger: Trigger,
    pub retry: Option<RetrySpec>,
    pub timeout_s: Option<u64>,
    /// Ingest hook for this node's document: None = by document type.
    pub ingest: Option<bool>,
    /// Which existing workspace files the hook's blocks may replace (default `ingested`).
    pub ingest_overwrite: Overwrite,
    /// the result file (under the run's results/) this node writes, fail-safe.
    pub result: Option<Template>,
    pub kind: NodeKind,
}

/// A validated graph, with the run id and variables bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    pub run_id: String,
    pub title: String,
    pub goal: String,
    pub topology: String,
    pub mode: String,
    pub llm: Option<String>,
    pub vars: BTreeMap<String, String>,
    pub max_parallel: Option<u32>,
    pub retry: Option<RetrySpec>,
    /// JSON Schemas of result files.
    pub contracts: Vec<contract::Contract>,
    pub nodes: Vec<Node>,
    index: HashMap<String, usize>,
    dependents: Vec<Vec<usize>>,
    store_outputs: HashMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGraph {
    #[serde(default = "one")]
    version: u32,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    goal: Option<String>,
    #[serde(default)]
    topology: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    llm: Option<String>,
    #[serde(default)]
    vars: BTreeMap<String, Value>,
    #[serde(default)]
    max_parallel: Option<u32>,
    #[serde(default)]
    retry: Option<RetrySpec>,
    #[serde(default)]
    contracts: Vec<contract::Contract>,
    // Present in graph.resolved.json; ignored on input (the caller's run id wins).
    #[serde(default, rename = "run_id")]
    _run_id: Option<String>,
    nodes: Vec<Value>,
}

fn one() -> u32 {
    1
}

/// Ids of runs, nodes and gates: `[A-Za-z0-9_-]`, 1-64 characters (no `.`, which separates
/// map items and template segments).
pub fn valid_node_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn field_err<'a, E: fmt::Display>(
    node: &'a str,
    field: &'a str,
) -> impl FnOnce(E) -> GraphError + 'a {
    move |e| GraphError::node(node, Some(field), e.to_string())
}

fn take<T: serde::de::DeserializeOwned>(
    obj: &mut Map<String, Value>,
    node: &str,
    field: &str,
) -> Result<Option<T>, GraphError> {
    match obj.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v)
            .map(Some)
            .map_err(field_err(node, field)),
    }
}

/// Parses one node object (`in_map`: it is a map body, whose id is given).
fn parse_node(v: Value, position: usize, body_of: Option<&str>) -> Result<Node, GraphError> {
    let Value::Object(mut obj) = v else {
        return Err(GraphError::graph(format!(
            "nodes[{position}] must be a mapping with `id` and `type`"
        )));
    };
    let id = match body_of {
        Some(map_id) => {
            if obj.remove("id").is_some() {
                return Err(GraphError::node(map_id, Some("node.id"), "a map body has no id; its items are named <map>.<index>"));
            }
            format!("{map_id}.item")
        }
        None => match obj.remove("id") {
            Some(Value::String(s)) if valid_node_id(&s) => s,
            Some(Value::String(s)) => {
                return Err(GraphError::graph(format!(
                    "nodes[{position}]: id `{s}` must be 1-64 letters, digits, `_` or `-`"
                )))
            }
            Some(Value::Bool(b)) => {
                return Err(GraphError::graph(format!(
                    "nodes[{position}]: id was read as the boolean {b} (YAML reads yes/no/on/off/true/false that way); quote it"
                )))
            }
            _ => return Err(GraphError::graph(format!("nodes[{position}] has no `id` (text)"))),
        },
    };
    let id_ref = id.as_str();
    let ty = match obj.remove("type") {
        Some(Value::String(s)) => s,
        _ => {
            return Err(GraphError::node(
                id_ref,
                Some("type"),
                format!("missing; one of {}", NODE_TYPES.join(", ")),
            ))
        }
    };
    let title: Option<String> = take(&mut obj, id_ref, "title")?;
    let needs: Option<Vec<String>> = take(&mut obj, id_ref, "needs")?;
    let when: Option<Expr> = take(&mut obj, id_ref, "when")?;
    let trigger: Option<Trigger> = take(&mut obj, id_ref, "trigger")?;
    let retry: Option<RetrySpec> = take(&mut obj, id_ref, "retry")?;
    let timeout_s: Option<u64> = take(&mut obj, id_ref, "timeout_s")?;
    let ingest: Option<bool> = take(&mut obj, id_ref, "ingest")?;
    let ingest_overwrite: Option<Overwrite> = take(&mut obj, id_ref, "ingest_overwrite")?;
    let result: Option<Template> = take(&mut obj, id_ref, "result")?;
    if body_of.is_some() && needs.as_ref().is_some_and(|n| !n.is_empty()) {
        return Err(GraphError::node(
            id_ref,
            Some("needs"),
            "a map body cannot have needs; put them on the map",
        ));
    }
    let rest = Value::Object(obj.clone());
    let kind = match ty.as_str() {
        "write_file" => NodeKind::WriteFile(fields(&id, rest)?),
        "agent_task" => NodeKind::AgentTask(fields(&id, rest)?),
        "condition" => NodeKind::Condition(fields(&id, rest)?),
        "tool_call" => NodeKind::ToolCall(fields(&id, rest)?),
        "sandbox_run" => NodeKind::SandboxRun(fields(&id, rest)?),
        "gate" => NodeKind::Gate(fields(&id, rest)?),
        "ingest" => NodeKind::Ingest(fields(&id, rest)?),
        "deliver" => NodeKind::Deliver(fields(&id, rest)?),
        "code_delivery" => NodeKind::CodeDelivery(fields(&id, rest)?),
        "external_agent" => NodeKind::ExternalAgent(fields(&id, rest)?),
        "plan" => NodeKind::Plan(fields(&id, rest)?),
        "assemble" => NodeKind::Assemble(fields(&id, rest)?),
        "map" => {
            if body_of.is_some() {
                return Err(GraphError::node(
                    id_ref,
                    Some("type"),
                    "a map body cannot be another map",
                ));
            }
            NodeKind::Map(parse_map(&id, obj)?)
        }
        other => {
            return Err(GraphError::node(
                id_ref,
                Some("type"),
                format!(
                    "unknown node type `{other}`; one of {}",
                    NODE_TYPES.join(", ")
                ),
            ))
        }
    };
    if body_of.is_some()
        && matches!(
            kind,
            NodeKind::Gate(_)
                | NodeKind::Condition(_)
                | NodeKind::ExternalAgent(_)
                | NodeKind::Plan(_)
                | NodeKind::Assemble(_)
        )
    {
        return Err(GraphError::node(
            id_ref,
            Some("type"),
            "a map body must be write_file, agent_task, tool_call, sandbox_run, ingest or deliver",
        ));
    }
    Ok(Node {
        id,
        title,
        needs: needs.unwrap_or_default(),
        when,
        trigger: trigger.unwrap_or_default(),
        retry,
        timeout_s,
        ingest,
        ingest_overwrite: ingest_overwrite.unwrap_or_default(),
        result,
        kind,
    })
}

/// Deserialises a node type's fields; the error names the field (also nested ones).
fn fields<T: serde::de::DeserializeOwned>(id: &str, rest: Value) -> Result<T, GraphError> {
    serde_path_to_error::deserialize(rest).map_err(|e| {
        let path = e.path().to_string();
        let msg = e.into_inner().to_string();
        let field = if path == "." || path.is_empty() {
            msg.split('`')
                .nth(1)
                .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"))
                .map(str::to_owned)
        } else {
            Some(path)
        };
        GraphError {
            position: None,
            node: Some(id.to_owned()),
            field,
            message: msg,
        }
    })
}

fn parse_map(id: &str, mut obj: Map<String, Value>) -> Result<MapNode, GraphError> {
    let over =
        match obj.remove("over") {
            Some(Value::Array(items)) => MapOver::List(items),
            Some(Value::String(s)) => {
                MapOver::Template(Template::parse(&s).map_err(field_err(id, "over"))?)
            }
            Some(Value::Object(mut o)) => {
                let file: Template = match o.remove("file") {
                    Some(Value::String(f)) => {
                        Template::parse(&f).map_err(field_err(id, "over.file"))?
                    }
                    _ => {
                        return Err(GraphError::node(
                            id,
                            Some("over"),
                            "a mapping needs `file: <path of a JSON array>`",
                        ))
                    }
                };
                let pointer: Option<String> = match o.remove("pointer") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(p)) => Some(p),
                    Some(_) => {
                        return Err(GraphError::node(
                            id,
                            Some("over.pointer"),
                            "a JSON pointer is text (`/items`)",
                        ))
                    }
                };
                if let Some(k) = o.keys().next() {
                    return Err(GraphError::node(
                        id,
                        Some("over"),
                        format!("unknown field `{k}`; expected file, pointer"),
                    ));
                }
                MapOver::File { file, pointer }
            }
            _ => return Err(GraphError::node(
                id,
                Some("over"),
                "expected a list, a template such as `{{nodes.x.paths}}`, or `{file: items.json}`",
            )),
        };
    let parallelism: u32 = take(&mut obj, id, "parallelism")?.unwrap_or(4);
    if !(1..=1024).contains(&parallelism) {
        return Err(GraphError::node(
            id,
            Some("parallelism"),
            "must be between 1 and 1024",
        ));
    }
    let body = obj.remove("node").ok_or_else(|| {
        GraphError::node(id, Some("node"), "missing: the node to run for each item")
    })?;
    if let Some(k) = obj.keys().next() {
        return Err(GraphError::node(
            id,
            Some(k),
            format!("unknown field `{k}`; a map has over, parallelism, node"),
        ));
    }
    if let MapOver::List(items) = &over {
        if items.len() > MAX_MAP_ITEMS {
            return Err(GraphError::node(
                id,
                Some("over"),
                format!("more than {MAX_MAP_ITEMS} items"),
            ));
        }
    }
    let node = parse_node(body, 0, Some(id))?;
    Ok(MapNode {
        over,
        parallelism,
        node: Box::new(node),
    })
}

impl Node {
    fn to_value(&self) -> Value {
        let mut m = Map::new();
        if !self.id.ends_with(".item") || matches!(self.kind, NodeKind::Map(_)) {
            m.insert("id".into(), Value::String(self.id.clone()));
        }
        m.insert("type".into(), Value::String(self.kind.type_name().into()));
        if let Some(t) = &self.title {
            m.insert("title".into(), Value::String(t.clone()));
        }
        if !self.needs.is_empty() {
            m.insert("needs".into(), serde_json::json!(self.needs));
        }
        if let Some(w) = &self.when {
            m.insert("when".into(), Value::String(w.source().into()));
        }
        if self.trigger != Trigger::AllSucceeded {
            m.insert("trigger".into(), serde_json::json!(self.trigger));
        }
        if let Some(r) = &self.retry {
            m.insert("retry".into(), serde_json::json!(r));
        }
        if let Some(t) = self.timeout_s {
            m.insert("timeout_s".into(), t.into());
        }
        if let Some(i) = self.ingest {
            m.insert("ingest".into(), i.into());
        }
        if !self.ingest_overwrite.is_default() {
            m.insert(
                "ingest_overwrite".into(),
                serde_json::json!(self.ingest_overwrite),
            );
        }
        if let Some(r) = &self.result {
            m.insert("result".into(), Value::String(r.source().into()));
        }
        let fields = match &self.kind {
            NodeKind::WriteFile(k) => serde_json::to_value(k),
            NodeKind::AgentTask(k) => serde_json::to_value(k),
            NodeKind::Condition(k) => serde_json::to_value(k),
            NodeKind::ToolCall(k) => serde_json::to_value(k),
            NodeKind::SandboxRun(k) => serde_json::to_value(k),
            NodeKind::Gate(k) => serde_json::to_value(k),
            NodeKind::Ingest(k) => serde_json::to_value(k),
            NodeKind::Deliver(k) => serde_json::to_value(k),
            NodeKind::CodeDelivery(k) => serde_json::to_value(k),
            NodeKind::ExternalAgent(k) => serde_json::to_value(k),
            NodeKind::Plan(k) => serde_json::to_value(k),
            NodeKind::Assemble(k) => serde_json::to_value(k),
            NodeKind::Map(k) => {
                let mut body = k.node.to_value();
                if let Value::Object(b) = &mut body {
                    b.remove("id");
                }
                Ok(serde_json::json!({"over": k.over, "parallelism": k.parallelism, "node": body}))
            }
        };
        if let Ok(Value::Object(f)) = fields {
            m.extend(f);
        }
        Value::Object(m)
    }

    /// Every template of the node with its field name (`input_files[1]`, `args.path`).
    pub fn templates_mut(&mut self) -> Vec<(String, &mut Template)> {
        let mut out: Vec<(String, &mut Template)> = Vec::new();
        fn list<'a>(out: &mut Vec<(String, &'a mut Template)>, name: &str, v: &'a mut [Template]) {
            for (i, t) in v.iter_mut().enumerate() {
                out.push((format!("{name}[{i}]"), t));
            }
        }
        match &mut self.kind {
            NodeKind::WriteFile(k) => {
                out.push(("path".into(), &mut k.path));
                out.push(("content".into(), &mut k.content));
            }
            NodeKind::AgentTask(k) => {
                out.push(("prompt".into(), &mut k.prompt));
                if let Some(p) = &mut k.path {
                    out.push(("path".into(), p));
                }
                if let Some(s) = &mut k.system {
                    out.push(("system".into(), s));
                }
                list(&mut out, "context", &mut k.context);
            }
            NodeKind::Condition(_) | NodeKind::ToolCall(_) => {}
            NodeKind::Map(k) => {
                match &mut k.over {
                    MapOver::Template(t) => out.push(("over".into(), t)),
                    MapOver::File { file, .. } => out.push(("over.file".into(), file)),
                    MapOver::List(_) => {}
                }
                for (name, t) in k.node.templates_mut() {
                    out.push((format!("node.{name}"), t));
                }
            }
            NodeKind::SandboxRun(k) => {
                if let Some(c) = &mut k.code {
                    out.push(("code".into(), c));
                }
                if let Some(c) = &mut k.code_file {
                    out.push(("code_file".into(), c));
                }
                list(&mut out, "input_files", &mut k.input_files);
                out.push(("output_prefix".into(), &mut k.output_prefix));
                list(&mut out, "allowed_prefixes", &mut k.allowed_prefixes);
            }
            NodeKind::Gate(k) => {
                if let Some(r) = &mut k.reason {
                    out.push(("reason".into(), r));
                }
                if let Some(i) = &mut k.instructions {
                    out.push(("instructions".into(), i));
                }
            }
            NodeKind::Ingest(k) => out.push(("doc_path".into(), &mut k.doc_path)),
            NodeKind::Deliver(k) => list(&mut out, "files", &mut k.files),
            NodeKind::CodeDelivery(k) => out.extend(k.templates_mut()),
            NodeKind::ExternalAgent(k) => {
                out.push(("prompt".into(), &mut k.prompt));
                out.push(("workspace".into(), &mut k.workspace));
            }
            NodeKind::Plan(k) => out.extend(k.templates_mut()),
            NodeKind::Assemble(k) => out.extend(k.templates_mut()),
        }
        if let Some(r) = &mut self.result {
            out.push(("result".into(), r));
        }
        out
    }

    /// Every reference of the node (templates, expressions, tool arguments), with field names.
    pub fn refs(&self) -> Result<Vec<(String, Ref)>, GraphError> {
        let mut copy = self.clone();
        let mut out: Vec<(String, Ref)> = copy
            .templates_mut()
            .into_iter()
            .flat_map(|(f, t)| t.refs().cloned().map(move |r| (f.clone(), r)))
            .collect();
        if let Some(w) = &self.when {
            out.extend(w.refs().into_iter().map(|r| ("when".to_owned(), r.clone())));
        }
        match &self.kind {
            NodeKind::Condition(c) => out.extend(
                c.cond
                    .refs()
                    .into_iter()
                    .map(|r| ("if".to_owned(), r.clone())),
            ),
            NodeKind::ToolCall(t) => {
                for (field, tpl) in tool_arg_templates(&self.id, &t.args)? {
                    out.extend(tpl.refs().cloned().map(|r| (field.clone(), r)));
                }
            }
            NodeKind::Map(m) => {
                if let Some(w) = &m.node.when {
                    out.extend(
                        w.refs()
                            .into_iter()
                            .map(|r| ("node.when".to_owned(), r.clone())),
                    );
                }
                if let NodeKind::ToolCall(t) = &m.node.kind {
                    for (field, tpl) in tool_arg_templates(&self.id, &t.args)? {
                        out.extend(tpl.refs().cloned().map(|r| (format!("node.{field}"), r)));
                    }
                }
            }
            _ => {}
        }
        Ok(out)
    }
}

/// The text arguments of a tool call parsed as templates (`args.path`, `args.items[0]`).
pub fn tool_arg_templates(
    node: &str,
    args: &Map<String, Value>,
) -> Result<Vec<(String, Template)>, GraphError> {
    fn walk(
        node: &str,
        name: String,
        v: &Value,
        out: &mut Vec<(String, Template)>,
    ) -> Result<(), GraphError> {
        match v {
            Value::String(s) => {
                let t = Template::parse(s).map_err(|e| GraphError::node(node, Some(&name), e))?;
                out.push((name, t));
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    walk(node, format!("{name}[{i}]"), x, out)?;
                }
            }
            Value::Object(o) => {
                for (k, x) in o {
                    walk(node, format!("{name}.{k}"), x, out)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
    let mut out = Vec::new();
    for (k, v) in args {
        walk(node, format!("args.{k}"), v, &mut out)?;
    }
    Ok(out)
}

/// Binds `{{run_id}}` and plain `{{vars.x}}` in tool arguments (text values only).
fn bind_args(args: &mut Map<String, Value>, bind: &dyn Fn(&Ref) -> Option<String>) {
    fn walk(v: &mut Value, bind: &dyn Fn(&Ref) -> Option<String>) {
        match v {
            Value::String(s) => {
                if let Ok(t) = Template::parse(s) {
                    *s = t.bind(bind).source().to_owned();
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| walk(x, bind)),
            Value::Object(o) => o.values_mut().for_each(|x| walk(x, bind)),
            _ => {}
        }
    }
    args.values_mut().for_each(|v| walk(v, bind));
}

impl Graph {
    /// Parses a YAML (or JSON) graph and validates it for run `run_id` with `vars` given at
    /// submit time (they override the graph's `vars:` defaults).
    pub fn from_yaml(
        yaml: &str,
        run_id: &str,
        vars: &BTreeMap<String, String>,
    ) -> Result<Graph, GraphError> {
        if yaml.len() > MAX_GRAPH_BYTES {
            return Err(GraphError::graph(format!(
                "the graph is larger than {} MiB",
                MAX_GRAPH_BYTES >> 20
            )));
        }
        let options = serde_saphyr::Options::default();
        let value: Value = serde_saphyr::from_str_with_options(yaml, options)
            .map_err(|e| GraphError::graph(format!("not valid YAML: {e}")))?;
        Graph::from_value(value, run_id, vars)
    }

    /// Validates an already parsed graph document (graph.resolved.json uses this on resume).
    pub fn from_value(
        value: Value,
        run_id: &str,
        vars: &BTreeMap<String, String>,
    ) -> Result<Graph, GraphError> {
        if !matches!(value, Value::Object(_)) {
            return Err(GraphError::graph(
                "the graph must be a mapping with `nodes:`",
            ));
        }
        let raw: RawGraph = serde_json::from_value(value).map_err(|e| {
            let msg = e.to_string();
            let field = msg
                .split('`')
                .nth(1)
                .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"));
            GraphError {
                position: None,
                node: None,
                field: field.map(str::to_owned),
                message: msg.clone(),
            }
        })?;
        if raw.version != 1 {
            return Err(GraphError {
                position: None,
                node: None,
                field: Some("version".into()),
                message: "only version 1 exists".into(),
            });
        }
        if raw.nodes.is_empty() {
            return Err(GraphError {
                position: None,
                node: None,
                field: Some("nodes".into()),
                message: "a graph needs at least one node".into(),
            });
        }
        if raw.nodes.len() > MAX_NODES {
            return Err(GraphError::graph(format!(
                "more than {MAX_NODES} nodes; use a map for fan-out"
            )));
        }
        let mut all_vars = BTreeMap::new();
        for (k, v) in raw.vars {
            let text = match v {
                Value::String(s) => s,
                Value::Null => String::new(),
                Value::Bool(_) | Value::Number(_) => v.to_string(),
                _ => {
                    return Err(GraphError {
                        position: None,
                        node: None,
                        field: Some(format!("vars.{k}")),
                        message: "variables are text (or numbers/booleans)".into(),
                    })
                }
            };
            all_vars.insert(k, text);
        }
        all_vars.extend(vars.iter().map(|(k, v)| (k.clone(), v.clone())));
        let mut nodes = Vec::with_capacity(raw.nodes.len());
        for (i, v) in raw.nodes.into_iter().enumerate() {
            nodes.push(parse_node(v, i, None).map_err(|e| GraphError {
                position: Some(i),
                ..e
            })?);
        }
        let ids: Vec<String> = nodes.iter().map(|n| n.id.clone()).collect();
        let mut graph = Graph {
            run_id: run_id.to_owned(),
            title: raw.title.unwrap_or_default(),
            goal: raw.goal.unwrap_or_default(),
            topology: raw.topology.unwrap_or_else(|| "dag".into()),
            mode: raw.mode.unwrap_or_else(|| "unknown".into()),
            llm: raw.llm.filter(|s| !s.is_empty()),
            vars: all_vars,
            max_parallel: raw.max_parallel,
            retry: raw.retry,
            contracts: raw.contracts,
            nodes,
            index: HashMap::new(),
            dependents: Vec::new(),
            store_outputs: HashMap::new(),
        };
        graph.validate().map_err(|e| e.locate(&ids))?;
        Ok(graph)
    }

    fn validate(&mut self) -> Result<(), GraphError> {
        contract::check_all(&self.contracts)?;
        // Ids unique.
        for (i, n) in self.nodes.iter().enumerate() {
            if self.index.insert(n.id.clone(), i).is_some() {
                return Err(GraphError::node(
                    &n.id,
                    Some("id"),
                    "two nodes have this id; ids must be unique",
                ));
            }
        }
        // store_output names.
        for n in &self.nodes {
            let so = match &n.kind {
                NodeKind::SandboxRun(s) => s.store_output.as_ref(),
                _ => None,
            };
            if let Some(name) = so {
                if !valid_node_id(name) {
                    return Err(GraphError::node(
                        &n.id,
                        Some("store_output"),
                        "must be 1-64 letters, digits, `_` or `-`",
                    ));
                }
                if self.vars.contains_key(name) {
                    return Err(GraphError::node(
                        &n.id,
                        Some("store_output"),
                        format!("`{name}` is already a variable"),
                    ));
                }
                if self
                    .store_outputs
                    .insert(name.clone(), n.id.clone())
                    .is_some()
                {
                    return Err(GraphError::node(
                        &n.id,
                        Some("store_output"),
                        format!("`{name}` is used by two nodes"),
                    ));
                }
            }
            if let NodeKind::Map(m) = &n.kind {
                if let NodeKind::SandboxRun(s) = &m.node.kind {
                    if s.store_output.is_some() {
                        return Err(GraphError::node(
                            &n.id,
                            Some("node.store_output"),
                            "not available in a map body",
                        ));
                    }
                }
            }
        }
        // Per-node checks and implicit dependencies.
        let mut deps: Vec<BTreeSet<String>> = Vec::with_capacity(self.nodes.len());
        for n in &self.nodes {
            let mut d: BTreeSet<String> = BTreeSet::new();
            for need in &n.needs {
                if need == &n.id {
                    return Err(GraphError::node(
                        &n.id,
                        Some("needs"),
                        "a node cannot need itself",
                    ));
                }
                if !self.index.contains_key(need) {
                    return Err(GraphError::node(
                        &n.id,
                        Some("needs"),
                        format!("unknown node `{need}`{}", self.suggest(need)),
                    ));
                }
                d.insert(need.clone());
            }
            for (field, r) in n.refs()? {
                self.check_ref(n, &field, &r, &mut d)?;
            }
            self.check_kind(n)?;
            deps.push(d);
        }
        // Condition branches depend on their condition.
        for n in &self.nodes {
            if let NodeKind::Condition(c) = &n.kind {
                for (field, list) in [("then", &c.then), ("else", &c.otherwise)] {
                    for target in list {
                        let Some(&t) = self.index.get(target) else {
                            return Err(GraphError::node(
                                &n.id,
                                Some(field),
                                format!("unknown node `{target}`{}", self.suggest(target)),
                            ));
                        };
                        if target == &n.id {
                            return Err(GraphError::node(
                                &n.id,
                                Some(field),
                                "a condition cannot branch to itself",
                            ));
                        }
                        deps[t].insert(n.id.clone());
                    }
                }
            }
        }
        for (n, d) in self.nodes.iter_mut().zip(deps) {
            n.needs = d.into_iter().collect();
        }
        self.check_cycles()?;
        let mut dependents = vec![Vec::new(); self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for need in &n.needs {
                dependents[self.index[need]].push(i);
            }
        }
        self.dependents = dependents;
        Ok(())
    }

    fn suggest(&self, name: &str) -> String {
        let close = self
            .nodes
            .iter()
            .map(|n| n.id.as_str())
            .filter(|id| {
                id.eq_ignore_ascii_case(name)
                    || (id.len() > 2 && (id.contains(name) || name.contains(id)))
            })
            .collect::<Vec<_>>();
        match close.first() {
            Some(c) => format!(" (did you mean `{c}`?)"),
            None => String::new(),
        }
    }

    fn check_ref(
        &self,
        n: &Node,
        field: &str,
        r: &Ref,
        deps: &mut BTreeSet<String>,
    ) -> Result<(), GraphError> {
        let in_body = field.starts_with("node.");
        let err = |m: String| Err(GraphError::node(&n.id, Some(field), m));
        match r {
            Ref::RunId => Ok(()),
            Ref::Index | Ref::Item { .. } if in_body => Ok(()),
            Ref::Index | Ref::Item { .. } => {
                err(format!("`{r}` is only available inside a map's `node`"))
            }
            Ref::Var { name, path } => {
                if let Some(src) = self.store_outputs.get(name) {
                    if src == &n.id {
                        return err(format!("`{r}` is this node's own result"));
                    }
                    if let Some(f) = path.first() {
                        let kind = &self.nodes[self.index[src]].kind;
                        if !kind.outputs().contains(&f.as_str()) {
                            return err(format!(
                                "`vars.{name}` (the result of sandbox_run `{src}`) has no field `{f}`; its fields are: {}",
                                kind.outputs().join(", ")
                            ));
                        }
                    }
                    deps.insert(src.clone());
                    return Ok(());
                }
                if self.vars.contains_key(name) {
                    if path.is_empty() {
                        return Ok(());
                    }
                    return err(format!(
                        "`vars.{name}` is text; it has no field `{}`",
                        path.join(".")
                    ));
                }
                err(format!(
                    "unknown variable `vars.{name}`: pass it at submit (--var {name}=...) or declare a default under `vars:`"
                ))
            }
            Ref::Node { id, field: out, .. } => {
                if id == &n.id {
                    return err(format!("`{r}` refers to the node itself"));
                }
                let Some(&i) = self.index.get(id) else {
                    return err(format!(
                        "`{r}` names unknown node `{id}`{}",
                        self.suggest(id)
                    ));
                };
                let kind = &self.nodes[i].kind;
                let result_output = self.nodes[i].result.is_some()
                    && contract::RESULT_OUTPUTS.contains(&out.as_str());
                if !kind.outputs().contains(&out.as_str()) && !result_output {
                    return err(format!(
                        "`{r}`: node `{id}` ({}) has no output `{out}`; its outputs are: {}",
                        kind.type_name(),
                        kind.outputs().join(", ")
                    ));
                }
                deps.insert(id.clone());
                Ok(())
            }
        }
    }

    /// A copy of `n` with `{{run_id}}` and plain `{{vars.x}}` replaced by their values, so
    /// paths known at submit time are checked at submit time. (graph.resolved.json keeps the
    /// templates as written, with the values recorded once under `vars` and `run_id`.)
    fn bound(&self, n: &Node) -> Node {
        let bind = |r: &Ref| -> Option<String> {
            match r {
                Ref::RunId => Some(self.run_id.clone()),
                Ref::Var { name, path }
                    if path.is_empty() && !self.store_outputs.contains_key(name) =>
                {
                    self.vars.get(name).cloned()
                }
                _ => None,
            }
        };
        let mut copy = n.clone();
        for (_, t) in copy.templates_mut() {
            *t = t.bind(&bind);
        }
        match &mut copy.kind {
            NodeKind::ToolCall(tc) => bind_args(&mut tc.args, &bind),
            NodeKind::Map(m) => {
                if let NodeKind::ToolCall(tc) = &mut m.node.kind {
                    bind_args(&mut tc.args, &bind)
                }
            }
            _ => {}
        }
        copy
    }

    fn check_kind(&self, n: &Node) -> Result<(), GraphError> {
        let bound = self.bound(n);
        let n = &bound;
        check_kind(n)?;
        if let NodeKind::Map(m) = &n.kind {
            check_kind(&m.node).map_err(|e| GraphError {
                position: None,
                node: Some(n.id.clone()),
                field: Some(format!("node.{}", e.field.unwrap_or_default())),
                message: e.message,
            })?;
        }
        Ok(())
    }

    fn check_cycles(&self) -> Result<(), GraphError> {
        // Kahn's algorithm; on leftovers, walk needs from one of them to print the cycle.
        let n = self.nodes.len();
        let mut indeg: Vec<usize> = self.nodes.iter().map(|x| x.needs.len()).collect();
        let mut rdeps = vec![Vec::new(); n];
        for (i, x) in self.nodes.iter().enumerate() {
            for need in &x.needs {
                rdeps[self.index[need]].push(i);
            }
        }
        let mut queue: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
        let mut seen = 0;
        while let Some(i) = queue.pop() {
            seen += 1;
            for &j in &rdeps[i] {
                indeg[j] -= 1;
                if indeg[j] == 0 {
                    queue.push(j);
                }
            }
        }
        if seen == n {
            return Ok(());
        }
        let Some(start) = (0..n).find(|&i| indeg[i] > 0) else {
            return Ok(());
        };
        let mut path = vec![start];
        let mut on_path: HashMap<usize, usize> = HashMap::from([(start, 0)]);
        let mut cur = start;
        while let Some(next) = self.nodes[cur]
            .needs
            .iter()
            .map(|x| self.index[x])
            .find(|&j| indeg[j] > 0)
        {
            if let Some(&at) = on_path.get(&next) {
                let mut cycle: Vec<&str> = path[at..]
                    .iter()
                    .map(|&i| self.nodes[i].id.as_str())
                    .collect();
                cycle.reverse();
                cycle.push(cycle[0]);
                return Err(GraphError::node(
                    &self.nodes[next].id,
                    Some("needs"),
                    format!(
                        "dependency cycle: {} (through needs, references and condition branches)",
                        cycle.join(" -> ")
                    ),
                ));
            }
            on_path.insert(next, path.len());
            path.push(next);
            cur = next;
        }
        Err(GraphError::graph("dependency cycle"))
    }

    pub fn node(&self, id: &str) -> Option<&Node> {
        self.index.get(id).map(|&i| &self.nodes[i])
    }

    pub fn position(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    /// Nodes that need node `i` directly.
    pub fn dependents(&self, i: usize) -> &[usize] {
        &self.dependents[i]
    }

    /// Node `id` and everything that depends on it, transitively, in graph order.
    pub fn downstream(&self, id: &str) -> Vec<String> {
        let Some(&start) = self.index.get(id) else {
            return vec![];
        };
        let mut seen = vec![false; self.nodes.len()];
        let mut stack = vec![start];
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            stack.extend(self.dependents[i].iter().copied());
        }
        (0..self.nodes.len())
            .filter(|&i| seen[i])
            .map(|i| self.nodes[i].id.clone())
            .collect()
    }

    /// The sandbox_run node whose result is `vars.<name>`.
    pub fn store_output_node(&self, name: &str) -> Option<&str> {
        self.store_outputs.get(name).map(String::as_str)
    }

    /// graph.resolved.json.
    pub fn to_resolved_json(&self) -> Value {
        serde_json::json!({
            "version": 1,
            "run_id": self.run_id,
            "title": self.title,
            "goal": self.goal,
            "topology": self.topology,
            "mode": self.mode,
            "llm": self.llm,
            "vars": self.vars,
            "max_parallel": self.max_parallel,
            "retry": self.retry,
            "contracts": self.contracts,
            "nodes": self.nodes.iter().map(Node::to_value).collect::<Vec<_>>(),
        })
    }
}

fn check_static_path(n: &Node, field: &str, t: &Template, prefix: bool) -> Result<(), GraphError> {
    if !t.is_static() {
        return Ok(());
    }
    let text = t.render(&|_| None).unwrap_or_default();
    let text = if prefix {
        text.trim_end_matches('/').to_owned()
    } else {
        text
    };
    let result = if prefix {
        pathguard::validate_prefix(&text).map(|_| ())
    } else {
        pathguard::validate(&text).map(|_| ())
    };
    result.map_err(|rej| GraphError::node(&n.id, Some(field), format!("`{text}`: {rej}")))
}

/// Refuses at submit a path a node writes whose literal head is the records directory
/// `.cairn/` (the same rule is applied at run time to the rendered path).
pub(crate) fn check_write_template(source: &str) -> Result<(), String> {
    if pathguard::records::template_in_records(source) {
        return pathguard::records::check_node_write(source).map_err(|e| e.to_string());
    }
    Ok(())
}

/// [`check_write_template`] for a node's field.
fn check_write_field(n: &Node, field: &str, t: &Template) -> Result<(), GraphError> {
    check_write_template(t.source()).map_err(|m| GraphError::node(&n.id, Some(field), m))
}

fn check_kind(n: &Node) -> Result<(), GraphError> {
    check_record_writes(n)?;
    match &n.kind {
        NodeKind::WriteFile(w) => check_static_path(n, "path", &w.path, false)?,
        NodeKind::AgentTask(a) => {
            if let Some(p) = &a.path {
                check_static_path(n, "path", p, false)?;
            }
            for (i, c) in a.context.iter().enumerate() {
                let is_dir = c.source().ends_with('/');
                check_static_path(n, &format!("context[{i}]"), c, is_dir)?;
            }
            if let Some(agent) = &a.agent {
                if !valid_node_id(agent) {
                    return Err(GraphError::node(
                        &n.id,
                        Some("agent"),
                        "must be 1-64 letters, digits, `_` or `-`",
                    ));
                }
            }
        }
        NodeKind::SandboxRun(s) => {
            match (&s.code, &s.code_file) {
                (Some(_), Some(_)) => {
                    return Err(GraphError::node(
                        &n.id,
                        Some("code_file"),
                        "both `code` and `code_file` are set; keep exactly one",
                    ))
                }
                (None, None) => {
                    return Err(GraphError::node(
                        &n.id,
                        Some("code"),
                        "set `code` (program text) or `code_file` (a project file)",
                    ))
                }
                _ => {}
            }
            check_image(s.image.as_deref())
                .map_err(|m| GraphError::node(&n.id, Some("image"), m))?;
            if !matches!(s.language.as_str(), "python" | "bash" | "sh") {
                return Err(GraphError::node(
                    &n.id,
                    Some("language"),
                    format!("`{}` is not supported; use python, bash or sh", s.language),
                ));
            }
            if let Some(c) = &s.code_file {
                check_static_path(n, "code_file", c, false)?;
            }
            for (i, f) in s.input_files.iter().enumerate() {
                let is_dir = f.source().ends_with('/');
                check_static_path(n, &format!("input_files[{i}]"), f, is_dir)?;
            }
            check_static_path(n, "output_prefix", &s.output_prefix, true)?;
            for (i, p) in s.allowed_prefixes.iter().enumerate() {
                check_static_path(n, &format!("allowed_prefixes[{i}]"), p, true)?;
            }
            if s.output_prefix.is_static() && s.allowed_prefixes.iter().all(Template::is_static) {
                let out = s.output_prefix.render(&|_| None).unwrap_or_default();
                let allowed: Vec<String> = s
                    .allowed_prefixes
                    .iter()
                    .map(|p| p.render(&|_| None).unwrap_or_default())
                    .collect();
                if !allowed
                    .iter()
                    .any(|p| under_prefix(&format!("{}/", out.trim_end_matches('/')), p))
                {
                    return Err(GraphError::node(
                        &n.id,
                        Some("output_prefix"),
                        format!("`{out}` is not under any of allowed_prefixes {allowed:?}"),
                    ));
                }
            }
        }
        NodeKind::ToolCall(t) => {
            tools::check(&t.tool, &t.args).map_err(|e| GraphError::node(&n.id, Some("args"), e))?;
            tool_arg_templates(&n.id, &t.args)?;
        }
        NodeKind::Ingest(i) => check_static_path(n, "doc_path", &i.doc_path, false)?,
        NodeKind::Deliver(d) => {
            targets::check_deliver_target(&d.target)
                .map_err(|e| GraphError::node(&n.id, Some("target"), e))?;
            if d.files.is_empty() {
                return Err(GraphError::node(
                    &n.id,
                    Some("files"),
                    "list at least one file to deliver",
                ));
            }
            for (i, f) in d.files.iter().enumerate() {
                let is_dir = f.source().ends_with('/');
                check_static_path(n, &format!("files[{i}]"), f, is_dir)?;
            }
        }
        NodeKind::ExternalAgent(x) => check_external_agent(n, x)?,
        NodeKind::CodeDelivery(c) => c
            .check()
            .map_err(|(field, message)| GraphError::node(&n.id, Some(field), message))?,
        NodeKind::Plan(p) => p
            .check()
            .map_err(|(field, message)| GraphError::node(&n.id, Some(field.as_str()), message))?,
        NodeKind::Assemble(a) => a
            .check()
            .map_err(|(field, message)| GraphError::node(&n.id, Some(field.as_str()), message))?,
        NodeKind::Condition(_) | NodeKind::Gate(_) | NodeKind::Map(_) => {}
    }
    if let Some(r) = &n.result {
        if matches!(
            n.kind,
            NodeKind::Condition(_) | NodeKind::Gate(_) | NodeKind::Map(_)
        ) {
            return Err(GraphError::node(
                &n.id,
                Some("result"),
                format!("a {} node writes no result; put `result:` on a node that does (a map's on its `node`)", n.kind.type_name()),
            ));
        }
        if r.is_static() {
            let name = r.render(&|_| None).unwrap_or_default();
            contract::check_result_name(&name)
                .map_err(|m| GraphError::node(&n.id, Some("result"), m))?;
        }
    }
    Ok(())
}

/// Every field a node writes through: none may name `.cairn/`.
fn check_record_writes(n: &Node) -> Result<(), GraphError> {
    match &n.kind {
        NodeKind::WriteFile(w) => check_write_field(n, "path", &w.path),
        NodeKind::AgentTask(a) => match &a.path {
            Some(p) => check_write_field(n, "path", p),
            None => Ok(()),
        },
        NodeKind::SandboxRun(s) => check_write_field(n, "output_prefix", &s.output_prefix),
        NodeKind::ExternalAgent(x) => check_write_field(n, "workspace", &x.workspace),
        NodeKind::Plan(p) => match &p.counters {
            Some(c) => check_write_field(n, "counters", c),
            None => Ok(()),
        },
        NodeKind::Assemble(a) => {
            for (field, t) in [("counters", &a.counters), ("report", &a.report)] {
                if let Some(t) = t {
                    check_write_field(n, field, t)?;
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn check_external_agent(n: &Node, x: &ExternalAgent) -> Result<(), GraphError> {
    if let Some(agent) = &x.agent {
        if !valid_node_id(agent) {
            return Err(GraphError::node(
                &n.id,
                Some("agent"),
                "must be 1-64 letters, digits, `_` or `-`",
            ));
        }
    }
    if x.workspace.source().trim_matches('/').is_empty() {
        return Err(GraphError::node(
            &n.id,
            Some("workspace"),
            "name a project directory (e.g. `workspace/`); the whole project is never staged",
        ));
    }
    check_static_path(n, "workspace", &x.workspace, true)?;
    if x.command.iter().any(|c| c.is_empty() || c.contains('\0')) {
        return Err(GraphError::node(
            &n.id,
            Some("command"),
            "every word of the command must be non-empty text",
        ));
    }
    if x.args.iter().any(|a| a.contains('\0')) {
        return Err(GraphError::node(
            &n.id,
            Some("args"),
            "an argument contains NUL",
        ));
    }
    for (k, v) in &x.env {
        let name_ok = !k.is_empty()
            && k.bytes()
                .enumerate()
                .all(|(i, b)| b == b'_' || b.is_ascii_uppercase() || (i > 0 && b.is_ascii_digit()));
        if !name_ok || v.contains('\0') {
            return Err(GraphError::node(
                &n.id,
                Some(&format!("env.{k}")),
                "names are [A-Z_][A-Z0-9_]* and values have no NUL",
            ));
        }
    }
    if x.turn_timeout_s == Some(0) {
        return Err(GraphError::node(
            &n.id,
            Some("turn_timeout_s"),
            "must be at least 1",
        ));
    }
    Ok(())
}

/// `path` lies under `prefix` (a prefix ends with `/` or names a directory).
pub fn under_prefix(path: &str, prefix: &str) -> bool {
    let p = prefix.trim_end_matches('/');
    p.is_empty()
        || path == p
        || path
            .strip_prefix(p)
            .is_some_and(|rest| rest.starts_with('/'))
}

impl Template {
    /// A template from trusted source text (defaults written in this crate).
    pub(crate) fn literal_with_refs(src: &str) -> Template {
        Template::parse(src).unwrap_or_else(|_| Template::literal(src))
    }
}

#[cfg(test)]
mod tests;
