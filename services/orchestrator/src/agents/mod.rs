//! Agents: the `Provider` seam every `agent_task` talks through: `replay` (recorded answers
//! from a cassette, so examples and tests need no LLM and no network) and `openai` (any
//! OpenAI-compatible chat-completions server, with the retry rule of `retry.rs`).

pub mod openai;
pub mod replay;
pub mod retry;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

pub use openai::{LlmConfig, OpenAiProvider};
pub use replay::ReplayProvider;
pub use retry::{Attempt, AttemptObserver, LlmError, NoObserver};

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
    /// The tool calls of an assistant message (replayed to the model in a tool loop).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For `Role::Tool`: the call this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// The assistant's turn that asked for `calls`.
    pub fn assistant_calls(content: impl Into<String>, calls: Vec<ToolCall>) -> Message {
        Message {
            tool_calls: calls,
            ..Message::new(Role::Assistant, content)
        }
    }

    /// The answer to tool call `call_id` (`role: tool`).
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            tool_call_id: Some(call_id.into()),
            ..Message::new(Role::Tool, content)
        }
    }
}

/// A function the model may call (OpenAI `tools[].function`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// OpenAI `tool_choice` (sent only when tools are offered).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    /// This one function.
    Function(String),
}

impl ToolChoice {
    pub fn wire(&self) -> serde_json::Value {
        match self {
            ToolChoice::Auto => "auto".into(),
            ToolChoice::None => "none".into(),
            ToolChoice::Required => "required".into(),
            ToolChoice::Function(name) => {
                serde_json::json!({"type": "function", "function": {"name": name}})
            }
        }
    }
}

/// A call the model asked for. `arguments` is the JSON text as the model wrote it (it may be
/// malformed: the tool loop answers that with an error message, never a crash).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
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
    /// Tools offered to the model (empty = none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Attempts for this request instead of `llm.max_attempts` (the code delivery agent
    /// passes `code_delivery.llm_max_retries_per_request`, seed 003 §7.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
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
    /// Tool calls the model asked for, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// `stop`, `tool_calls`, `length` ... as the provider said ("" when it said nothing).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub finish_reason: String,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    #[error("cassette {cassette} has no answer for node `{node}` turn {turn}; add an entry `- {{node: {node}, turn: {turn}, content: ...}}` under `answers:`")]
    MissingAnswer {
        cassette: String,
        node: String,
        turn: u32,
    },
    #[error("cassette {path}: {message}")]
    Cassette { path: String, message: String },
    #[error("LLM provider `{0}` is not known; use `replay:<cassette.yaml>` or `openai:<base_url>#<model>` (e.g. openai:http://127.0.0.1:8000/v1#qwen2.5-7b)")]
    Unsupported(String),
    #[error("LLM setting `{spec}`: {message}")]
    BadSpec { spec: String, message: String },
    /// An OpenAI-compatible request that ended without an answer (its attempts are in it).
    #[error(transparent)]
    Llm(Box<retry::LlmError>),
    #[error("no LLM provider configured for this run; submit with llm=replay:<cassette> or set the graph's `llm:`")]
    NotConfigured,
}

/// A language-model backend. Cancellation: the caller drops the future (a cancelled run
/// aborts its request).
pub trait Provider: Send + Sync {
    /// How the provider is named in records (`replay:/abs/cassette.yaml`).
    fn name(&self) -> String;
    fn complete<'a>(
        &'a self,
        request: &'a AgentRequest,
    ) -> BoxFuture<'a, Result<AgentReply, AgentError>>;

    /// `complete`, reporting every attempt to `observer` (the run records an event per
    /// attempt). Providers that retry report each try; the default reports one.
    fn complete_observed<'a>(
        &'a self,
        request: &'a AgentRequest,
        observer: &'a dyn AttemptObserver,
    ) -> BoxFuture<'a, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            let started = std::time::Instant::now();
            let result = self.complete(request).await;
            let outcome = match &result {
                Ok(_) => retry::AttemptOutcome::Succeeded,
                Err(e) => retry::AttemptOutcome::Failed {
                    failure: retry::AttemptFailure::new(
                        retry::FailureKind::Protocol,
                        e.to_string(),
                    ),
                    will_retry: false,
                },
            };
            observer.attempt(&Attempt {
                attempt: 1,
                max_attempts: 1,
                endpoint: self.name(),
                elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                outcome,
                retry_in_ms: None,
            });
            result
        })
    }
}

/// A parsed `llm` setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProviderSpec {
    /// `replay:<path>` to a cassette (YAML or JSON).
    Replay(PathBuf),
    /// `replay-inline:<base64 cassette>`: the cassette itself, sent by a client whose files the
    /// orchestrator cannot read (a remote `cairn run`); kept in the run's records for resume.
    ReplayInline(String),
    /// `openai:<base_url>#<model>` (or a bare `http(s)://.../v1#<model>`); model "" = `llm.model`.
    OpenAi { base_url: String, model: String },
}

impl ProviderSpec {
    pub fn parse(spec: &str) -> Result<ProviderSpec, AgentError> {
        if spec.trim_start().starts_with("http://") || spec.trim_start().starts_with("https://") {
            return openai::parse_spec(spec, spec);
        }
        match spec.split_once(':') {
            Some(("replay", path)) if !path.trim().is_empty() => {
                Ok(ProviderSpec::Replay(PathBuf::from(path.trim())))
            }
            Some(("replay-inline", encoded)) => {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(encoded.trim())
                    .map_err(|e| AgentError::BadSpec {
                        spec: "replay-inline".into(),
                        message: format!("not base64: {e}"),
                    })?;
                let text = String::from_utf8(bytes).map_err(|_| AgentError::BadSpec {
                    spec: "replay-inline".into(),
                    message: "the cassette is not UTF-8".into(),
                })?;
                Ok(ProviderSpec::ReplayInline(text))
            }
            Some(("openai", rest)) => openai::parse_spec(spec, rest),
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
            ProviderSpec::ReplayInline(text) => {
                use base64::Engine as _;
                format!(
                    "replay-inline:{}",
                    base64::engine::general_purpose::STANDARD.encode(text)
                )
            }
            ProviderSpec::OpenAi { base_url, model } => openai::spec_string(base_url, model),
        }
    }
}

/// Builds providers from specs. Cassettes are read at each use, so an edited cassette takes
/// effect on the next request (they are small).
#[derive(Default)]
pub struct Providers {
    /// The `[llm]` settings of OpenAI-compatible providers.
    pub llm: LlmConfig,
    /// One HTTP client (connection pool) for every OpenAI-compatible provider.
    http: std::sync::OnceLock<reqwest::Client>,
}

impl Providers {
    pub fn new(llm: LlmConfig) -> Providers {
        Providers {
            llm,
            http: std::sync::OnceLock::new(),
        }
    }

    /// Checks at submit time that `spec` can be used (cassette readable, model known).
    pub fn check(&self, spec: &ProviderSpec) -> Result<(), AgentError> {
        match spec {
            ProviderSpec::Replay(path) => ReplayProvider::load(path).map(|_| ()),
            ProviderSpec::ReplayInline(text) => {
                ReplayProvider::from_text("inline cassette", text).map(|_| ())
            }
            ProviderSpec::OpenAi { base_url, model } => self.openai(base_url, model).map(|_| ()),
        }
    }

    pub fn get(&self, spec: &str) -> Result<Arc<dyn Provider>, AgentError> {
        if spec.is_empty() {
            return Err(AgentError::NotConfigured);
        }
        let provider: Arc<dyn Provider> = match ProviderSpec::parse(spec)? {
            ProviderSpec::Replay(path) => Arc::new(ReplayProvider::load(&path)?),
            ProviderSpec::ReplayInline(text) => {
                Arc::new(ReplayProvider::from_text("inline cassette", &text)?)
            }
            ProviderSpec::OpenAi { base_url, model } => Arc::new(self.openai(&base_url, &model)?),
        };
        Ok(provider)
    }
}
