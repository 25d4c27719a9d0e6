//! The `code_delivery` node of a graph (as a node type): its fields, the checks
//! made at submit time and the outputs later nodes may read.

use serde::{Deserialize, Serialize};

use crate::{Target, Template};

/// Turns (LLM requests) of one task when the node sets no `max_iterations`.
pub const DEFAULT_MAX_ITERATIONS: u32 = 50;
/// Most turns a node may ask for.
pub const MAX_ITERATIONS: u32 = 1000;
/// Longest time between checkpoints a node may ask for (a day).
pub const MAX_CHECKPOINT_EVERY_S: u64 = 86_400;
/// Shortest idle time before a session is paused, when pausing is on (a second).
pub const MIN_PAUSE_AFTER_MS: u64 = 1_000;

/// Where the workspace starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceType {
    /// An empty directory; the delivery must bring its README and docs.
    Empty,
    /// A clone of `git_url` at `git_ref`.
    Git,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeDelivery {
    /// The task for the agent.
    pub prompt: Template,
    pub source_type: SourceType,
    /// Repository the runner can reach: a URL or a path on the runner's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_url: Option<Template>,
    /// Branch, tag or commit; default the repository's default branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<Template>,
    /// `{type: group|private, id}` (OneBot) or `{type: directory, path}` (project directory).
    pub target: Target,
    /// Provider for this node (overrides the run's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<String>,
    /// LLM requests at most before the task fails.
    #[serde(default = "default_max_iterations")]
    pub max_iterations: u32,
    /// Network for the sandbox session (the runner must allow it).
    #[serde(default)]
    pub network: bool,
    /// Image of the sandbox session (the runner must allow it); default the runner's image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Seconds between checkpoints of the session (files-only snapshots taken between tool
    /// calls; the node resumes from the last one on another runner when its runner is lost);
    /// 0 = none; unset = the orchestrator's `code_delivery.checkpoint_every_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every_s: Option<u64>,
    /// Milliseconds the session may sit idle while the model answers before it is paused
    /// (checkpointed and closed: no sandbox held while waiting; resumed on any runner when
    /// the answer comes); 0 = never; unset = the orchestrator's `code_delivery.pause_after_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_after_ms: Option<u64>,
}

fn default_max_iterations() -> u32 {
    DEFAULT_MAX_ITERATIONS
}

/// Outputs `{{nodes.<id>.<field>}}` may read.
pub const OUTPUTS: &[&str] = &[
    "archive_name",
    "archive_path",
    "format",
    "size_bytes",
    "sha256",
    "entries",
    "excluded",
    "upload_status",
    "location",
    "delivered_path",
    "summary",
    "iterations",
    "tool_calls",
    "git_commit",
    "session_id",
    "provider",
    "usage",
];

impl CodeDelivery {
    /// Every template with its field name.
    pub fn templates_mut(&mut self) -> Vec<(String, &mut Template)> {
        let mut out = vec![("prompt".to_owned(), &mut self.prompt)];
        if let Some(t) = &mut self.git_url {
            out.push(("git_url".into(), t));
        }
        if let Some(t) = &mut self.git_ref {
            out.push(("git_ref".into(), t));
        }
        out
    }

    /// Submit-time checks: Err(field, message).
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        match (self.source_type, &self.git_url) {
            (SourceType::Git, None) => {
                return Err((
                    "git_url",
                    "source_type git needs `git_url` (a repository URL or a path the sandbox runner can reach)".into(),
                ))
            }
            (SourceType::Git, Some(u)) if u.is_static() && u.source().trim().is_empty() => {
                return Err(("git_url", "is empty".into()))
            }
            (SourceType::Empty, Some(_)) => {
                return Err((
                    "git_url",
                    "source_type empty starts from an empty directory; drop `git_url` or set source_type: git".into(),
                ))
            }
            _ => {}
        }
        if self.source_type == SourceType::Empty && self.git_ref.is_some() {
            return Err((
                "git_ref",
                "only a git source has a ref; drop `git_ref` or set source_type: git".into(),
            ));
        }
        if !(1..=MAX_ITERATIONS).contains(&self.max_iterations) {
            return Err((
                "max_iterations",
                format!("must be between 1 and {MAX_ITERATIONS}"),
            ));
        }
        crate::targets::check_code_delivery_target(&self.target).map_err(|e| ("target", e))?;
        crate::check_image(self.image.as_deref()).map_err(|e| ("image", e))?;
        if self
            .checkpoint_every_s
            .is_some_and(|s| s > MAX_CHECKPOINT_EVERY_S)
        {
            return Err((
                "checkpoint_every_s",
                format!(
                    "must be at most {MAX_CHECKPOINT_EVERY_S} (a day); 0 turns checkpoints off"
                ),
            ));
        }
        if self
            .pause_after_ms
            .is_some_and(|ms| ms != 0 && ms < MIN_PAUSE_AFTER_MS)
        {
            return Err((
                "pause_after_ms",
                format!("must be 0 (never) or at least {MIN_PAUSE_AFTER_MS} (a second)"),
            ));
        }
        Ok(())
    }
}
