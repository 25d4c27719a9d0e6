//! Agents: the `Provider` seam every `agent_task` talks through: `replay` (recorded answers
//! from a cassette, so examples and tests need no LLM and no network) and `openai` (any
//! OpenAI-compatible chat-completions server, with the retry rule of `retry.rs`). Which
//! provider a run may use is the operator's choice (`providers.rs`); this crate never reads
//! the host's file system on a request's behalf (cassettes come through the store).
//! Depends on the graph language and the store client only.

pub mod cassette;
pub mod openai;
pub mod providers;
pub mod recorded;
pub mod records;
pub mod replay;
pub mod retry;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

pub use openai::{LlmConfig, OpenAiProvider};
pub use providers::{ProviderConfig, ProviderKind, Providers};
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
    /// passes `code_delivery.llm_max_retries_per_request`).
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentReply {
    pub content: String,
    pub model: String,
    #[serde(default)]
    pub usage: Usage,
    /// Tool calls the model asked for, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// `stop`, `tool_calls`, `length` ... as the provider said ("" when it said nothing).
    #[serde(default, skip_serializing_if = "String::is_empty")]
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
    /// A cassette refused (path, size, format). The message never quotes the file.
    #[error("cassette {path}: {message}")]
    Cassette {
        path: String,
        /// Reason word (`cairn-reason`).
        reason: &'static str,
        message: String,
    },
    #[error("LLM setting `{0}` is not known; use a provider name of the orchestrator's config (`llm: <name>`), `replay:<cassette path in the project>`, or `openai:<base_url>#<model>` where the operator allows URLs")]
    Unsupported(String),
    #[error("LLM setting `{spec}`: {message}")]
    BadSpec { spec: String, message: String },
    /// A setting the orchestrator's rules refuse (URL not allowed, unknown provider).
    #[error("LLM setting `{spec}`: {message}")]
    Refused {
        spec: String,
        /// Reason word (`cairn-reason`).
        reason: &'static str,
        message: String,
    },
    /// The artifact-store could not be asked for a cassette.
    #[error("{0}")]
    Unavailable(String),
    /// An OpenAI-compatible request that ended without an answer (its attempts are in it).
    #[error(transparent)]
    Llm(Box<retry::LlmError>),
    /// A replay could not use the recorded exchange (missing, unreadable, or the request
    /// differs from the recorded one).
    #[error("{0}")]
    Record(Box<records::RecordError>),
    /// A recorded provider failure, replayed.
    #[error("{0}")]
    Replayed(String),
    #[error("no LLM provider configured for this run; submit with llm=<provider name> (or a cassette: `cairn run --llm replay:<file>`) or set the graph's `llm:`")]
    NotConfigured,
}

impl AgentError {
    /// The reason word of a refusal, if it has one.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            AgentError::Cassette { reason, .. } | AgentError::Refused { reason, .. } => {
                Some(reason)
            }
            AgentError::Unavailable(_) => Some("store_unavailable"),
            AgentError::Record(r) => Some(r.reason()),
            _ => None,
        }
    }
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

/// A parsed `llm` setting (docs/agents.md "Choosing a provider").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProviderSpec {
    /// `<name>` or `provider:<name>`: one of the orchestrator's `[llm.providers.<name>]`.
    Named(String),
    /// `replay:<path>`: a cassette (YAML or JSON) at this path of the run's project, read
    /// through the artifact-store.
    Replay(String),
    /// `replay-inline:<base64 cassette>`: the cassette itself, sent by a client from its own
    /// files (`cairn run` does); kept in the run's records for resume.
    ReplayInline(String),
    /// `openai:<base_url>#<model>` (or a bare `http(s)://.../v1#<model>`): a URL the request
    /// names itself (only with `llm.allow_request_llm_urls`); model "" = `llm.model`.
    OpenAi { base_url: String, model: String },
}

impl ProviderSpec {
    /// Reads the syntax only; what the orchestrator accepts is `Providers::get`'s rule.
    pub fn parse(spec: &str) -> Result<ProviderSpec, AgentError> {
        let spec = spec.trim();
        if spec.starts_with("http://") || spec.starts_with("https://") {
            return openai::parse_spec(spec, spec);
        }
        if providers::valid_name(spec) {
            return Ok(ProviderSpec::Named(spec.to_owned()));
        }
        match spec.split_once(':') {
            Some(("provider", name)) if providers::valid_name(name.trim()) => {
                Ok(ProviderSpec::Named(name.trim().to_owned()))
            }
            Some(("replay", path)) if !path.trim().is_empty() => {
                let path = path.trim();
                pathguard::validate(path).map_err(|rej| AgentError::Cassette {
                    path: path.to_owned(),
                    reason: rej.reason.as_str(),
                    message: format!(
                        "{rej}; `replay:` takes a path in the run's project (e.g. docs/cassettes/demo.yaml), never a file of the orchestrator's host; `cairn run --llm replay:<local file>` sends a local cassette inline"
                    ),
                })?;
                Ok(ProviderSpec::Replay(path.to_owned()))
            }
            Some(("replay-inline", encoded)) => {
                use base64::Engine as _;
                let too_large = || AgentError::Cassette {
                    path: "inline cassette".into(),
                    reason: "too_large",
                    message: format!("larger than {} MiB", cassette::MAX_CASSETTE_BYTES >> 20),
                };
                if encoded.len() as u64 / 4 * 3 > cassette::MAX_CASSETTE_BYTES + 3 {
                    return Err(too_large());
                }
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(encoded.trim())
                    .map_err(|e| AgentError::BadSpec {
                        spec: "replay-inline".into(),
                        message: format!("not base64: {e}"),
                    })?;
                if bytes.len() as u64 > cassette::MAX_CASSETTE_BYTES {
                    return Err(too_large());
                }
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

    pub fn to_spec_string(&self) -> String {
        match self {
            ProviderSpec::Named(name) => format!("provider:{name}"),
            ProviderSpec::Replay(p) => format!("replay:{p}"),
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

/// A node's `llm:` names a provider spec this crate can parse (checked at submit).
pub fn check_llm(spec: &str) -> Result<(), String> {
    ProviderSpec::parse(spec)
        .map(|_| ())
        .map_err(|e| format!("field `llm`: {e}"))
}
