//! Agents: the `Provider` seam every `agent_task` talks through. This issue ships the `replay`
//! provider (recorded answers from a cassette, so examples and tests need no LLM and no
//! network); the OpenAI-compatible client plugs in here next (issue 6) by adding a
//! `ProviderSpec` variant and a `Provider` implementation.

pub mod replay;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

pub use replay::ReplayProvider;

/// Who speaks in a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

/// One request of an agent node to its provider.
#[derive(Clone, Debug, Serialize)]
pub struct AgentRequest {
    pub run_id: String,
    /// Graph node id (`<map>.<index>` for a map item).
    pub node_id: String,
    pub agent: String,
    pub instance: String,
    /// 1 for the first request of this node; +1 for each rework the human asked for.
    pub turn: u32,
    pub messages: Vec<Message>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AgentReply {
    pub content: String,
    pub model: String,
    pub usage: Usage,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    #[error("cassette {cassette} has no answer for node `{node}` turn {turn}; add an entry `- {{node: {node}, turn: {turn}, content: ...}}` under `answers:`")]
    MissingAnswer { cassette: String, node: String, turn: u32 },
    #[error("cassette {path}: {message}")]
    Cassette { path: String, message: String },
    #[error("LLM provider `{0}` is not available in this build; use `replay:<cassette.yaml>` (OpenAI-compatible providers come with the agents issue)")]
    Unsupported(String),
    #[error("no LLM provider configured for this run; submit with llm=replay:<cassette> or set the graph's `llm:`")]
    NotConfigured,
}

/// A language-model backend. Cancellation: the caller drops the future (a cancelled run
/// aborts its request).
pub trait Provider: Send + Sync {
    /// How the provider is named in records (`replay:/abs/cassette.yaml`).
    fn name(&self) -> String;
    fn complete<'a>(&'a self, request: &'a AgentRequest) -> BoxFuture<'a, Result<AgentReply, AgentError>>;
}

/// A parsed `llm` setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProviderSpec {
    /// `replay:<path>` to a cassette (YAML or JSON).
    Replay(PathBuf),
}

impl ProviderSpec {
    pub fn parse(spec: &str) -> Result<ProviderSpec, AgentError> {
        match spec.split_once(':') {
            Some(("replay", path)) if !path.trim().is_empty() => Ok(ProviderSpec::Replay(PathBuf::from(path.trim()))),
            _ => Err(AgentError::Unsupported(spec.to_owned())),
        }
    }

    /// The spec with relative paths made absolute against `base`.
    pub fn resolve(&self, base: &Path) -> ProviderSpec {
        match self {
            ProviderSpec::Replay(p) if p.is_relative() => ProviderSpec::Replay(base.join(p)),
            other => other.clone(),
        }
    }

    pub fn to_spec_string(&self) -> String {
        match self {
            ProviderSpec::Replay(p) => format!("replay:{}", p.display()),
        }
    }
}

/// Builds providers from specs. Cassettes are read at each use, so an edited cassette takes
/// effect on the next request (they are small).
#[derive(Default)]
pub struct Providers {}

impl Providers {
    pub fn get(&self, spec: &str) -> Result<Arc<dyn Provider>, AgentError> {
        if spec.is_empty() {
            return Err(AgentError::NotConfigured);
        }
        let provider: Arc<dyn Provider> = match ProviderSpec::parse(spec)? {
            ProviderSpec::Replay(path) => Arc::new(ReplayProvider::load(&path)?),
        };
        Ok(provider)
    }
}
