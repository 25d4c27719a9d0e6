//! The OpenAI-compatible chat-completions provider (vLLM, llama.cpp server, Ollama, hosted
//! APIs): `POST {base_url}/chat/completions` with `model`, `messages`, optional `tools` /
//! `tool_choice`; the answer's `choices[0].message.{content,tool_calls}` and `usage`. With
//! `stream = true` the answer is read as server-sent events and tool-call fragments are
//! assembled by their `index`.
//!
//! Each request goes through the retry rule of `retry.rs`. The API key is the
//! one configured for this base URL (`providers.rs` decides; a URL a request names gets none
//! unless it is a configured provider's); it is sent as a Bearer token and never appears in
//! Debug output, logs or error messages.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use futures::StreamExt;
use reqwest::header::{ACCEPT, CONTENT_TYPE, RETRY_AFTER};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::retry::{self, AttemptFailure, AttemptObserver, FailureKind, NoObserver, RetryRule};
use super::{
    AgentError, AgentReply, AgentRequest, Message, Provider, ProviderSpec, Role, ToolCall, Usage,
};

/// Most bytes of an error body kept for the message.
const ERROR_BODY_BYTES: usize = 64 << 10;
/// Most characters of a body quoted in a message.
const EXCERPT_CHARS: usize = 300;

/// The `[llm]` section: settings of OpenAI-compatible providers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// Model when the `llm` setting names none (`openai:<base_url>` without `#<model>`).
    pub model: String,
    /// Environment variable holding the API key; unset or empty = no Authorization header
    /// (local servers need none).
    pub api_key_env: String,
    /// Ask for a streamed answer (server-sent events).
    pub stream: bool,
    /// With `stream`, ask for usage in the last event (`stream_options.include_usage`).
    pub stream_include_usage: bool,
    /// `max_tokens` of each request; 0 = the server's default.
    pub max_tokens: u32,
    /// Deadline of the TCP (and TLS) connection.
    pub connect_timeout_ms: u64,
    /// Deadline of one whole attempt, answer read included.
    pub request_timeout_ms: u64,
    /// Longest silence while reading an answer (and, when streaming, before its headers).
    pub idle_timeout_ms: u64,
    /// Attempts per request, the first included (5).
    pub max_attempts: u32,
    /// Ceiling of the first backoff wait; doubles per attempt (full jitter below it).
    pub initial_backoff_ms: u64,
    /// Largest backoff ceiling.
    pub max_backoff_ms: u64,
    /// Longest `Retry-After` honoured; a longer one ends the request at once.
    pub max_retry_after_s: u64,
    /// Largest answer accepted.
    pub max_response_mb: u64,
    /// Accept an `openai:<url>` (or bare URL) setting from a request or graph. Off by default:
    /// requests and graphs name a provider of `providers`. Even when on, such a URL gets no
    /// API key unless it is the `base_url` of a configured provider (then that provider's).
    pub allow_request_llm_urls: bool,
    /// `[llm.providers.<name>]`: the LLM providers of this orchestrator, picked by name
    /// (`llm: <name>` in a request or graph).
    pub providers: std::collections::BTreeMap<String, super::providers::ProviderConfig>,
}

impl Default for LlmConfig {
    fn default() -> Self {
        LlmConfig {
            model: String::new(),
            api_key_env: "OPENAI_API_KEY".into(),
            stream: false,
            stream_include_usage: true,
            max_tokens: 0,
            connect_timeout_ms: 10_000,
            request_timeout_ms: 600_000,
            idle_timeout_ms: 120_000,
            max_attempts: 5,
            initial_backoff_ms: 1_000,
            max_backoff_ms: 30_000,
            max_retry_after_s: 120,
            max_response_mb: 32,
            allow_request_llm_urls: false,
            providers: std::collections::BTreeMap::new(),
        }
    }
}

impl LlmConfig {
    /// Checks the section; the message names the key to fix.
    pub fn check(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("llm.max_attempts must be at least 1".into());
        }
        for (key, v) in [
            ("llm.connect_timeout_ms", self.connect_timeout_ms),
            ("llm.request_timeout_ms", self.request_timeout_ms),
            ("llm.idle_timeout_ms", self.idle_timeout_ms),
            ("llm.max_response_mb", self.max_response_mb),
        ] {
            if v == 0 {
                return Err(format!("{key} must be more than 0"));
            }
        }
        if self.max_backoff_ms < self.initial_backoff_ms {
            return Err("llm.max_backoff_ms must be at least llm.initial_backoff_ms".into());
        }
        for (name, provider) in &self.providers {
            provider.check(name, &self.model)?;
        }
        Ok(())
    }

    pub fn retry_rule(&self) -> RetryRule {
        RetryRule {
            max_attempts: self.max_attempts.max(1),
            initial_backoff: Duration::from_millis(self.initial_backoff_ms),
            max_backoff: Duration::from_millis(self.max_backoff_ms),
            max_retry_after: Duration::from_secs(self.max_retry_after_s),
        }
    }
}

/// The key, kept out of every Debug and Display.
#[derive(Clone)]
struct ApiKey(String);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

/// A client of one `base_url` and model.
#[derive(Clone, Debug)]
pub struct OpenAiProvider {
    base_url: String,
    endpoint: String,
    model: String,
    api_key: Option<ApiKey>,
    config: LlmConfig,
    http: reqwest::Client,
}

/// The HTTP client providers share (one connection pool): connect timeout, no redirects
/// (a redirected POST would silently turn into a GET).
pub fn http_client(config: &LlmConfig) -> Result<reqwest::Client, AgentError> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("cairn/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| AgentError::BadSpec {
            spec: "openai".into(),
            message: format!("cannot build the HTTP client: {}", chain(&e)),
        })
}

/// Parses the part after `openai:` (or a whole `http(s)://` URL): `<base_url>[#<model>]`.
pub(super) fn parse_spec(spec: &str, rest: &str) -> Result<ProviderSpec, AgentError> {
    let (url, model) = match rest.split_once('#') {
        Some((u, m)) => (u.trim(), m.trim()),
        None => (rest.trim(), ""),
    };
    let base_url = base_url(url).map_err(|(shown, message)| AgentError::BadSpec {
        spec: if shown.is_empty() {
            spec.to_owned()
        } else {
            format!("openai:{shown}#{model}")
        },
        message,
    })?;
    Ok(ProviderSpec::OpenAi {
        base_url,
        model: model.to_owned(),
    })
}

/// `openai:<base_url>#<model>` (`openai:<base_url>` when the model comes from `llm.model`).
pub(super) fn spec_string(base_url: &str, model: &str) -> String {
    if model.is_empty() {
        format!("openai:{base_url}")
    } else {
        format!("openai:{base_url}#{model}")
    }
}

/// The base URL without trailing `/` or `/chat/completions`. Errors carry the URL to show
/// (credentials removed) when it differs from the spec.
pub(super) fn base_url(url: &str) -> Result<String, (String, String)> {
    let mut parsed = reqwest::Url::parse(url).map_err(|e| {
        (String::new(), format!("`{url}` is not a URL ({e}); write openai:<base_url>#<model>, e.g. openai:http://127.0.0.1:8000/v1#qwen2.5-7b"))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err((
            String::new(),
            format!(
                "the base URL must be http:// or https://, not {}://",
                parsed.scheme()
            ),
        ));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        let _ = parsed.set_username("");
        let _ = parsed.set_password(None);
        return Err((
            parsed.to_string(),
            "the URL carries credentials; remove them and put the API key in the environment variable named by llm.api_key_env".into(),
        ));
    }
    if parsed.query().is_some() {
        return Err((
            String::new(),
            "the base URL must not have a query (`?...`)".into(),
        ));
    }
    let mut s = parsed.as_str().trim_end_matches('/').to_owned();
    if let Some(stripped) = s.strip_suffix("/chat/completions") {
        s = stripped.to_owned();
    }
    Ok(s)
}

impl OpenAiProvider {
    /// A provider with its own HTTP client.
    pub fn new(
        base_url: &str,
        model: &str,
        config: &LlmConfig,
    ) -> Result<OpenAiProvider, AgentError> {
        OpenAiProvider::with_client(http_client(config)?, base_url, model, config)
    }

    /// A provider on `http`; `model` "" = `config.model`. The API key is read from the
    /// environment variable `config.api_key_env`.
    pub fn with_client(
        http: reqwest::Client,
        base_url: &str,
        model: &str,
        config: &LlmConfig,
    ) -> Result<OpenAiProvider, AgentError> {
        let shown = spec_string(base_url, model);
        let base_url = self::base_url(base_url).map_err(|(s, message)| AgentError::BadSpec {
            spec: if s.is_empty() { shown.clone() } else { s },
            message,
        })?;
        let model = if model.trim().is_empty() {
            config.model.trim()
        } else {
            model.trim()
        };
        if model.is_empty() {
            return Err(AgentError::BadSpec {
                spec: shown,
                message: "no model: write openai:<base_url>#<model> or set llm.model in the orchestrator's config".into(),
            });
        }
        let api_key = std::env::var(&config.api_key_env)
            .ok()
            .filter(|k| !k.trim().is_empty())
            .map(|k| ApiKey(k.trim().to_owned()));
        Ok(OpenAiProvider {
            endpoint: format!("{base_url}/chat/completions"),
            base_url,
            model: model.to_owned(),
            api_key,
            config: config.clone(),
            http,
        })
    }

    /// Replaces the key read from the environment (None = send no Authorization header).
    pub fn with_api_key(mut self, key: Option<String>) -> OpenAiProvider {
        self.api_key = key.filter(|k| !k.is_empty()).map(ApiKey);
        self
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// The request body of `request`.
    pub fn body(&self, request: &AgentRequest) -> Value {
        let mut body = json!({
            "model": self.model,
            "messages": request.messages.iter().map(wire_message).collect::<Vec<_>>(),
        });
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|t| {
                    let mut function = json!({"name": t.name, "parameters": t.parameters});
                    if !t.description.is_empty() {
                        function["description"] = json!(t.description);
                    }
                    json!({"type": "function", "function": function})
                })
                .collect();
            // tool_choice without tools is an error on hosted APIs.
            if let Some(choice) = &request.tool_choice {
                body["tool_choice"] = choice.wire();
            }
        }
        if self.config.max_tokens > 0 {
            body["max_tokens"] = json!(self.config.max_tokens);
        }
        if self.config.stream {
            body["stream"] = json!(true);
            if self.config.stream_include_usage {
                body["stream_options"] = json!({"include_usage": true});
            }
        }
        body
    }

    /// One attempt: the exchange under the request deadline, its failure scrubbed of the key.
    async fn attempt(&self, body: &Value) -> Result<AgentReply, AttemptFailure> {
        let deadline = Duration::from_millis(self.config.request_timeout_ms);
        let result = match tokio::time::timeout(deadline, self.exchange(body)).await {
            Ok(r) => r,
            Err(_) => Err(AttemptFailure::new(
                FailureKind::Timeout,
                format!(
                    "no complete answer within {} ms (llm.request_timeout_ms)",
                    self.config.request_timeout_ms
                ),
            )),
        };
        result.map_err(|mut f| {
            f.message = self.redact(&f.message);
            f
        })
    }

    async fn exchange(&self, body: &Value) -> Result<AgentReply, AttemptFailure> {
        let accept = if self.config.stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        let mut req = self
            .http
            .post(&self.endpoint)
            .header(ACCEPT, accept)
            .json(body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(&key.0);
        }
        // A streaming server answers headers at once; a non-streaming one only when the
        // whole completion is ready, so only the request deadline bounds that wait.
        let response = if self.config.stream {
            self.idle(req.send()).await?
        } else {
            req.send().await
        }
        .map_err(|e| send_failure(&e))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry::parse_retry_after(v, SystemTime::now()));
        let event_stream = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("text/event-stream")
            });
        if !status.is_success() {
            let body = self
                .read_body(response, ERROR_BODY_BYTES, true)
                .await
                .unwrap_or_default();
            return Err(self.status_failure(status, &body, retry_after));
        }
        if event_stream {
            self.read_stream(response).await
        } else {
            let bytes = self
                .read_body(response, self.max_response_bytes(), false)
                .await?;
            parse_completion(&bytes, &self.model)
        }
    }

    fn max_response_bytes(&self) -> usize {
        usize::try_from(self.config.max_response_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }

    /// `f` unless the server stays silent longer than `idle_timeout_ms`.
    async fn idle<F: Future>(&self, f: F) -> Result<F::Output, AttemptFailure> {
        tokio::time::timeout(Duration::from_millis(self.config.idle_timeout_ms), f)
            .await
            .map_err(|_| {
                AttemptFailure::new(
                    FailureKind::Timeout,
                    format!(
                        "the server sent nothing for {} ms (llm.idle_timeout_ms)",
                        self.config.idle_timeout_ms
                    ),
                )
            })
    }

    /// The body, at most `limit` bytes: cut there when `truncate`, else an error.
    async fn read_body(
        &self,
        response: reqwest::Response,
        limit: usize,
        truncate: bool,
    ) -> Result<Vec<u8>, AttemptFailure> {
        let mut stream = response.bytes_stream();
        let mut buf = Vec::new();
        while let Some(chunk) = self.idle(stream.next()).await? {
            let chunk = chunk.map_err(|e| body_failure(&e))?;
            if buf.len() + chunk.len() > limit {
                if truncate {
                    buf.extend_from_slice(&chunk[..limit - buf.len()]);
                    break;
                }
                return Err(self.too_large());
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf)
    }

    fn too_large(&self) -> AttemptFailure {
        AttemptFailure::new(
            FailureKind::Protocol,
            format!(
                "the answer is larger than {} MiB (llm.max_response_mb)",
                self.config.max_response_mb
            ),
        )
    }

    /// Reads server-sent events until `[DONE]` (or the end of a stream that finished).
    async fn read_stream(&self, response: reqwest::Response) -> Result<AgentReply, AttemptFailure> {
        let mut stream = response.bytes_stream();
        let mut events = EventStream::default();
        let mut answer = StreamedAnswer::new(&self.model);
        let limit = self.max_response_bytes();
        let mut total = 0usize;
        while let Some(chunk) = self.idle(stream.next()).await? {
            let chunk = chunk.map_err(|e| body_failure(&e))?;
            total += chunk.len();
            if total > limit {
                return Err(self.too_large());
            }
            for data in events.push(&chunk) {
                if data.trim() == "[DONE]" {
                    return answer.finish(true);
                }
                answer.apply(&data)?;
            }
        }
        if let Some(data) = events.end() {
            if data.trim() == "[DONE]" {
                return answer.finish(true);
            }
            answer.apply(&data)?;
        }
        answer.finish(false)
    }

    fn status_failure(
        &self,
        status: reqwest::StatusCode,
        body: &[u8],
        retry_after: Option<Duration>,
    ) -> AttemptFailure {
        let code = status.as_u16();
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let error = parsed.as_ref().and_then(|v| v.get("error"));
        let api_message = error.and_then(|e| {
            e.get("message")
                .and_then(Value::as_str)
                .or_else(|| e.as_str())
        });
        let quota = code == 429
            && error.is_some_and(|e| {
                ["code", "type"]
                    .iter()
                    .any(|k| e.get(*k).and_then(Value::as_str) == Some("insufficient_quota"))
            });
        let detail = match api_message {
            Some(m) => m.to_owned(),
            None if body.is_empty() => "(empty body)".into(),
            None => excerpt(&String::from_utf8_lossy(body)),
        };
        let hint = match code {
            401 | 403 => match self.api_key {
                Some(_) => format!(" (check the API key in ${})", self.config.api_key_env),
                None => format!(
                    " (no API key was sent: ${} is not set)",
                    self.config.api_key_env
                ),
            },
            404 => " (check the base URL, which usually ends in /v1, and the model name)".into(),
            429 if quota => " (the account's quota is exhausted; retrying will not help)".into(),
            _ => String::new(),
        };
        AttemptFailure {
            kind: if quota {
                FailureKind::QuotaExhausted
            } else {
                FailureKind::Http
            },
            status: Some(code),
            message: format!("HTTP {status}: {detail}{hint}"),
            retry_after,
        }
    }

    /// `s` with every occurrence of the API key replaced (a server may echo it).
    fn redact(&self, s: &str) -> String {
        match &self.api_key {
            Some(k) if !k.0.is_empty() => s.replace(&k.0, "[redacted]"),
            _ => s.to_owned(),
        }
    }
}

impl Provider for OpenAiProvider {
    fn name(&self) -> String {
        spec_string(&self.base_url, &self.model)
    }

    fn complete<'a>(
        &'a self,
        request: &'a AgentRequest,
    ) -> BoxFuture<'a, Result<AgentReply, AgentError>> {
        self.complete_observed(request, &NoObserver)
    }

    fn complete_observed<'a>(
        &'a self,
        request: &'a AgentRequest,
        observer: &'a dyn AttemptObserver,
    ) -> BoxFuture<'a, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            let body = self.body(request);
            let mut rule = self.config.retry_rule();
            if let Some(n) = request.max_attempts {
                rule.max_attempts = n.max(1);
            }
            let reply = retry::run(&rule, &self.endpoint, &self.model, observer, |_| {
                self.attempt(&body)
            })
            .await?;
            Ok(reply)
        })
    }
}

/// A message as the API wants it.
fn wire_message(m: &Message) -> Value {
    let role = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut out = json!({"role": role, "content": m.content});
    if !m.tool_calls.is_empty() {
        if m.content.is_empty() {
            out["content"] = Value::Null;
        }
        out["tool_calls"] = m
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    if let Some(id) = &m.tool_call_id {
        out["tool_call_id"] = json!(id);
    }
    out
}

/// Error text of `e` with its causes ("error sending request ...: connection refused").
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        source = cause.source();
    }
    s
}

fn send_failure(e: &reqwest::Error) -> AttemptFailure {
    let kind = if e.is_timeout() {
        FailureKind::Timeout
    } else {
        FailureKind::Connect
    };
    AttemptFailure::new(kind, format!("no answer: {}", chain(e)))
}

fn body_failure(e: &reqwest::Error) -> AttemptFailure {
    AttemptFailure::new(
        FailureKind::Interrupted,
        format!("the answer was cut off: {}", chain(e)),
    )
}

fn protocol(message: impl Into<String>) -> AttemptFailure {
    AttemptFailure::new(FailureKind::Protocol, message)
}

fn excerpt(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() > EXCERPT_CHARS {
        s.chars().take(EXCERPT_CHARS).collect::<String>() + "…"
    } else {
        s.to_owned()
    }
}

/// `content` as text: a string, null, or an array of `{type: text, text}` parts.
fn text_of(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str).or_else(|| p.as_str()))
            .collect::<Vec<_>>()
            .concat(),
        _ => String::new(),
    }
}

/// Arguments as JSON text (a few servers send an object instead of a string).
fn arguments_of(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    }
}

fn usage_of(v: &Value) -> Usage {
    let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    Usage {
        prompt_tokens: n("prompt_tokens"),
        completion_tokens: n("completion_tokens"),
    }
}

fn error_in_body(v: &Value) -> Option<String> {
    let e = v.get("error").filter(|e| !e.is_null())?;
    Some(
        e.get("message")
            .and_then(Value::as_str)
            .or_else(|| e.as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| excerpt(&e.to_string())),
    )
}

/// A non-streamed chat completion.
fn parse_completion(bytes: &[u8], requested_model: &str) -> Result<AgentReply, AttemptFailure> {
    let text = String::from_utf8_lossy(bytes);
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        protocol(format!(
            "the answer is not JSON ({e}); it starts: {}",
            excerpt(&text)
        ))
    })?;
    if let Some(message) = error_in_body(&v) {
        return Err(protocol(format!(
            "the server answered with an error: {message}"
        )));
    }
    let choice = v.get("choices").and_then(|c| c.get(0)).ok_or_else(|| {
        protocol(format!(
            "the answer has no choices[0], so it is not a chat completion: {}",
            excerpt(&text)
        ))
    })?;
    let message = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| {
            protocol(format!(
                "choices[0] has no message object: {}",
                excerpt(&text)
            ))
        })?;
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        for (i, c) in calls.iter().enumerate() {
            let function = c.get("function");
            let name = function
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            if name.is_empty() {
                return Err(protocol(format!(
                    "tool call {i} has no function name: {}",
                    excerpt(&c.to_string())
                )));
            }
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map_or_else(|| format!("call_{i}"), str::to_owned);
            tool_calls.push(ToolCall {
                id,
                name: name.to_owned(),
                arguments: arguments_of(function.and_then(|f| f.get("arguments"))),
            });
        }
    }
    Ok(AgentReply {
        content: text_of(message.get("content")),
        model: v
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(requested_model)
            .to_owned(),
        usage: v.get("usage").map(usage_of).unwrap_or_default(),
        tool_calls,
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    })
}

/// Splits a byte stream into server-sent events and yields each event's `data`.
#[derive(Default)]
struct EventStream {
    line: Vec<u8>,
    data: Vec<String>,
}

impl EventStream {
    fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in chunk {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            let line = String::from_utf8_lossy(&self.line).into_owned();
            self.line.clear();
            if line.is_empty() {
                if !self.data.is_empty() {
                    out.push(self.data.join("\n"));
                    self.data.clear();
                }
            } else if let Some(value) = line.strip_prefix("data:") {
                self.data
                    .push(value.strip_prefix(' ').unwrap_or(value).to_owned());
            }
            // Comments (`:`), `event:`, `id:` and `retry:` lines carry nothing we use.
        }
        out
    }

    /// The last event when the stream ends without a blank line.
    fn end(&mut self) -> Option<String> {
        if !self.line.is_empty() {
            let _ = self.push(b"\n");
        }
        (!self.data.is_empty()).then(|| self.data.join("\n"))
    }
}

#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// A streamed answer being assembled: content deltas appended, tool-call fragments merged
/// by their `index`.
struct StreamedAnswer {
    model: String,
    content: String,
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: String,
    usage: Usage,
}

impl StreamedAnswer {
    fn new(model: &str) -> StreamedAnswer {
        StreamedAnswer {
            model: model.to_owned(),
            content: String::new(),
            calls: BTreeMap::new(),
            finish_reason: String::new(),
            usage: Usage::default(),
        }
    }

    fn apply(&mut self, data: &str) -> Result<(), AttemptFailure> {
        let v: Value = serde_json::from_str(data).map_err(|e| {
            protocol(format!(
                "a stream event is not JSON ({e}): {}",
                excerpt(data)
            ))
        })?;
        if let Some(message) = error_in_body(&v) {
            return Err(protocol(format!(
                "the server sent an error in the stream: {message}"
            )));
        }
        if let Some(m) = v
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
        {
            m.clone_into(&mut self.model);
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = usage_of(u);
        }
        let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else {
            return Ok(());
        };
        if let Some(delta) = choice.get("delta") {
            self.content.push_str(&text_of(delta.get("content")));
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                for (pos, c) in calls.iter().enumerate() {
                    let index = c.get("index").and_then(Value::as_u64).unwrap_or(pos as u64);
                    let call = self.calls.entry(index).or_default();
                    if let Some(id) = c
                        .get("id")
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                    {
                        if call.id.is_empty() {
                            id.clone_into(&mut call.id);
                        }
                    }
                    let function = c.get("function");
                    if let Some(name) = function
                        .and_then(|f| f.get("name"))
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                    {
                        if call.name.is_empty() {
                            name.clone_into(&mut call.name);
                        }
                    }
                    call.arguments
                        .push_str(&arguments_of(function.and_then(|f| f.get("arguments"))));
                }
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            reason.clone_into(&mut self.finish_reason);
        }
        Ok(())
    }

    fn finish(self, done: bool) -> Result<AgentReply, AttemptFailure> {
        if !done && self.finish_reason.is_empty() {
            return Err(AttemptFailure::new(
                FailureKind::Interrupted,
                "the stream ended before `data: [DONE]` or a finish_reason",
            ));
        }
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, c) in self.calls {
            if c.name.is_empty() {
                return Err(protocol(format!(
                    "streamed tool call {index} has no function name"
                )));
            }
            let id = if c.id.is_empty() {
                format!("call_{index}")
            } else {
                c.id
            };
            tool_calls.push(ToolCall {
                id,
                name: c.name,
                arguments: c.arguments,
            });
        }
        Ok(AgentReply {
            content: self.content,
            model: self.model,
            usage: self.usage,
            tool_calls,
            finish_reason: self.finish_reason,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let p = |s: &str| ProviderSpec::parse(s);
        assert_eq!(
            p("openai:http://127.0.0.1:8000/v1#qwen2.5:7b").unwrap(),
            ProviderSpec::OpenAi {
                base_url: "http://127.0.0.1:8000/v1".into(),
                model: "qwen2.5:7b".into()
            }
        );
        assert_eq!(
            p("https://api.example.com/v1/chat/completions#m").unwrap(),
            ProviderSpec::OpenAi {
                base_url: "https://api.example.com/v1".into(),
                model: "m".into()
            }
        );
        assert_eq!(
            p("openai:http://h/v1/").unwrap(),
            ProviderSpec::OpenAi {
                base_url: "http://h/v1".into(),
                model: String::new()
            }
        );
        assert_eq!(
            p("openai:http://h/v1#m").unwrap().to_spec_string(),
            "openai:http://h/v1#m"
        );
        assert!(p("openai:ftp://h/v1#m")
            .unwrap_err()
            .to_string()
            .contains("http://"));
        assert!(p("openai:not a url#m").is_err());
        let e = p("openai:http://user:sk-secret@h/v1#m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("credentials") && !e.contains("sk-secret"), "{e}");
        let none = OpenAiProvider::new("http://h/v1", "", &LlmConfig::default())
            .unwrap_err()
            .to_string();
        assert!(none.contains("no model"), "{none}");
    }

    #[test]
    fn event_stream_lines() {
        let mut s = EventStream::default();
        assert!(s.push(b"data: {\"a\"").is_empty());
        assert_eq!(
            s.push(b":1}\r\n\r\n: keep-alive\n\nevent: x\ndata: [DONE]\n\n"),
            vec!["{\"a\":1}", "[DONE]"]
        );
        assert!(s.push(b"data: tail").is_empty());
        assert_eq!(s.end().as_deref(), Some("tail"));
    }

    #[test]
    fn debug_never_shows_the_key() {
        let p = OpenAiProvider::new("http://h/v1", "m", &LlmConfig::default())
            .unwrap()
            .with_api_key(Some("sk-test-123".into()));
        let d = format!("{p:?}");
        assert!(!d.contains("sk-test-123") && d.contains("redacted"), "{d}");
    }
}
