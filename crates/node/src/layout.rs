//! The run directory `.cairn/runs/<run_id>/` as paths in the project, and the front matter
//! of the Markdown artifacts written into it.

use std::fmt::Write as _;

/// Where all runs of a project live.
pub const RUNS_PREFIX: &str = ".cairn/runs";
/// An external agent instance's turn records, under `agents/<instance>/`: one directory
/// `<attempt>-<turn>/` per CLI turn (what a replay answers the turn from).
pub const AGENT_TURNS_DIR: &str = "turns";

/// Paths inside one run directory.
#[derive(Clone, Debug)]
pub struct RunDir {
    root: String,
}

impl RunDir {
    pub fn new(run_id: &str) -> RunDir {
        RunDir {
            root: format!("{RUNS_PREFIX}/{run_id}"),
        }
    }
    pub fn root(&self) -> &str {
        &self.root
    }
    pub fn path(&self, rel: &str) -> String {
        format!("{}/{rel}", self.root)
    }
    pub fn readme(&self) -> String {
        self.path("README.md")
    }
    pub fn task_yaml(&self) -> String {
        self.path("task.yaml")
    }
    pub fn state_json(&self) -> String {
        self.path("state.json")
    }
    pub fn graph_resolved(&self) -> String {
        self.path("graph.resolved.json")
    }
    pub fn human_notes(&self) -> String {
        self.path("shared/human-notes.md")
    }
    pub fn context_manifest(&self) -> String {
        self.path("shared/context-manifest.yaml")
    }
    pub fn agent(&self, instance: &str, rel: &str) -> String {
        self.path(&format!("agents/{instance}/{rel}"))
    }
    /// The records of one external agent turn: `agents/<instance>/turns/<attempt>-<turn>/<rel>`.
    pub fn agent_turn(&self, instance: &str, attempt: u32, turn: u32, rel: &str) -> String {
        self.agent(
            instance,
            &format!("{AGENT_TURNS_DIR}/{attempt}-{turn}/{rel}"),
        )
    }
    /// result.json, one per sandbox node (or map item).
    pub fn sandbox_result(&self, node: &str) -> String {
        self.path(&format!("sandbox/{node}/result.json"))
    }
    /// request.json: the request of a sandbox node's last attempt as a replay compares it
    /// (the run id written as a mark, inputs by sha256).
    pub fn sandbox_request(&self, node: &str) -> String {
        self.path(&format!("sandbox/{node}/request.json"))
    }
    /// What one node attempt printed (sandbox_run, code_delivery), as JSON lines.
    pub fn node_log(&self, node: &str, attempt: u32) -> String {
        self.path(&format!("logs/{node}/{attempt}.jsonl"))
    }
}

/// YAML front matter of a shareable Markdown artifact.
pub fn front_matter(
    title: &str,
    purpose: &str,
    tags: &[&str],
    task_id: &str,
    agent_instance: Option<&str>,
    artifact_id: Option<&str>,
) -> String {
    let q = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    let mut out = String::from("---\n");
    let _ = writeln!(out, "title: {}", q(title));
    let _ = writeln!(out, "purpose: {}", q(purpose));
    let _ = writeln!(
        out,
        "tags: [{}]",
        tags.iter().map(|t| q(t)).collect::<Vec<_>>().join(", ")
    );
    let _ = writeln!(out, "task_id: {}", q(task_id));
    if let Some(a) = agent_instance {
        let _ = writeln!(out, "agent_instance: {}", q(a));
    }
    if let Some(a) = artifact_id {
        let _ = writeln!(out, "artifact_id: {}", q(a));
    }
    out.push_str("---\n");
    out
}
