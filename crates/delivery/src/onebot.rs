//! OneBot v11 over HTTP as a delivery target: files go to a group
//! (`upload_group_file`) or a private chat (`upload_private_file`); an implementation without
//! the upload action gets a `file` message segment instead, and when that fails too the
//! result says so and names the file's stored path in the project so a human can hand it
//! over. Also the failure notice sent after one LLM request failed all its attempts.
//! The access token never appears in Debug output, logs or error messages.
//!
//! Graph targets: `{type: group, id: 123456}` and `{type: private, id: 10001}`; the endpoint
//! and token come from the `[onebot]` config section.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use futures::future::BoxFuture;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::{DeliveryCtx, DeliveryTarget, Receipt};
use cairn_graph::{Target, Template};
use cairn_node::{NodeError, Scope};

/// Most bytes of a OneBot reply read.
const MAX_REPLY_BYTES: usize = 1 << 20;
/// Most characters of a reply quoted in an error.
const EXCERPT_CHARS: usize = 300;
/// Most characters of the error summary in a failure notice.
const NOTICE_ERROR_CHARS: usize = 800;

/// How the `file` parameter names the file for the OneBot implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileRef {
    /// `base64` up to `base64_max_mb`, else `shared_dir` when set, else `store` when set.
    Auto,
    /// `base64://<data>` inline in the request (small files; the implementation needs no
    /// access to our disks).
    Base64,
    /// Written to `shared_dir/<run_id>/<name>` and named as `shared_dir_seen_as/<run_id>/<name>`
    /// (a directory both sides mount); removed again after the calls.
    SharedDir,
    /// Named where the artifact-store keeps it: `store_root/projects/<project>/<path>` (the
    /// store's data root mounted into the OneBot implementation). Nothing is copied.
    Store,
}

/// The `[onebot]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OneBotConfig {
    /// HTTP API of the OneBot v11 implementation (`http://127.0.0.1:3000`); "" = OneBot
    /// targets are refused.
    pub api_base: String,
    /// Environment variable holding the access token (sent as `Authorization: Bearer`);
    /// unset or empty = no header.
    pub access_token_env: String,
    pub file_ref: FileRef,
    /// Largest file sent as `base64://`.
    pub base64_max_mb: u64,
    /// Directory this process writes files to for `shared_dir`.
    pub shared_dir: String,
    /// The same directory as the OneBot implementation sees it (a path, `file://` or
    /// `http://` prefix); "" = `shared_dir`.
    pub shared_dir_seen_as: String,
    /// The artifact-store's data root as the OneBot implementation sees it, for `store`.
    pub store_root: String,
    /// Deadline of the TCP connection.
    pub connect_timeout_ms: u64,
    /// Deadline of one API call (an upload of a large file takes a while).
    pub call_timeout_ms: u64,
}

impl Default for OneBotConfig {
    fn default() -> Self {
        OneBotConfig {
            api_base: String::new(),
            access_token_env: "ONEBOT_ACCESS_TOKEN".into(),
            file_ref: FileRef::Auto,
            base64_max_mb: 16,
            shared_dir: String::new(),
            shared_dir_seen_as: String::new(),
            store_root: String::new(),
            connect_timeout_ms: 10_000,
            call_timeout_ms: 300_000,
        }
    }
}

impl OneBotConfig {
    /// Checks the section; the message names the key to fix.
    pub fn check(&self) -> Result<(), String> {
        if !self.api_base.is_empty() {
            let url = reqwest::Url::parse(&self.api_base)
                .map_err(|e| format!("onebot.api_base `{}` is not a URL: {e}", self.api_base))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err("onebot.api_base must be an http:// or https:// URL".into());
            }
        }
        if self.call_timeout_ms == 0 || self.connect_timeout_ms == 0 {
            return Err(
                "onebot.call_timeout_ms and onebot.connect_timeout_ms must be more than 0".into(),
            );
        }
        match self.file_ref {
            FileRef::SharedDir if self.shared_dir.is_empty() => {
                Err("onebot.file_ref = \"shared_dir\" needs onebot.shared_dir".into())
            }
            FileRef::Store if self.store_root.is_empty() => {
                Err("onebot.file_ref = \"store\" needs onebot.store_root".into())
            }
            _ => Ok(()),
        }
    }
}

/// Where a file or message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chat {
    Group(i64),
    Private(i64),
}

impl Chat {
    /// From a target type (`group` | `private`) and id (target_type/target_id).
    pub fn new(kind: &str, id: i64) -> Result<Chat, String> {
        if id <= 0 {
            return Err(format!("a {kind} id must be a positive number, not {id}"));
        }
        match kind {
            "group" => Ok(Chat::Group(id)),
            "private" => Ok(Chat::Private(id)),
            other => Err(format!(
                "target type `{other}` is not a chat; use group or private"
            )),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Chat::Group(_) => "group",
            Chat::Private(_) => "private",
        }
    }

    fn upload_action(&self) -> &'static str {
        match self {
            Chat::Group(_) => "upload_group_file",
            Chat::Private(_) => "upload_private_file",
        }
    }

    fn message_action(&self) -> &'static str {
        match self {
            Chat::Group(_) => "send_group_msg",
            Chat::Private(_) => "send_private_msg",
        }
    }

    /// `{"group_id": n}` or `{"user_id": n}` plus `more`.
    fn params(&self, more: Value) -> Value {
        let mut p = match self {
            Chat::Group(id) => json!({"group_id": id}),
            Chat::Private(id) => json!({"user_id": id}),
        };
        if let (Value::Object(p), Value::Object(more)) = (&mut p, more) {
            p.extend(more);
        }
        p
    }
}

impl fmt::Display for Chat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Chat::Group(id) => write!(f, "group:{id}"),
            Chat::Private(id) => write!(f, "private:{id}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OneBotError {
    /// The implementation lacks the action (HTTP 404, retcode 1404, or "unsupported").
    #[error("OneBot action `{action}` is not supported by this implementation ({message})")]
    Unsupported { action: String, message: String },
    /// The implementation answered with a failure.
    #[error("OneBot action `{action}` failed: {message}")]
    Failed { action: String, message: String },
    /// No answer (connection, timeout).
    #[error("OneBot action `{action}`: no answer from {api_base}: {message}")]
    Unreachable {
        action: String,
        api_base: String,
        message: String,
    },
    #[error("OneBot: {0}")]
    Config(String),
    /// The file could not be named for the implementation (too large, spool write failed).
    #[error("OneBot file `{name}`: {message}")]
    File { name: String, message: String },
}

#[derive(Clone)]
struct AccessToken(String);

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AccessToken([redacted])")
    }
}

/// Calls actions of one OneBot v11 HTTP API.
#[derive(Clone, Debug)]
pub struct OneBotClient {
    api_base: String,
    token: Option<AccessToken>,
    token_env: String,
    call_timeout: Duration,
    http: reqwest::Client,
}

impl OneBotClient {
    /// A client of `config.api_base`; the token is read from `config.access_token_env` now.
    pub fn new(config: &OneBotConfig) -> Result<OneBotClient, OneBotError> {
        config.check().map_err(OneBotError::Config)?;
        if config.api_base.trim().is_empty() {
            return Err(OneBotError::Config(
                "no OneBot endpoint: set onebot.api_base (e.g. http://127.0.0.1:3000)".into(),
            ));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| {
                OneBotError::Config(format!("cannot build the HTTP client: {}", chain(&e)))
            })?;
        let token = std::env::var(&config.access_token_env)
            .ok()
            .filter(|t| !t.trim().is_empty())
            .map(|t| AccessToken(t.trim().to_owned()));
        Ok(OneBotClient {
            api_base: config.api_base.trim().trim_end_matches('/').to_owned(),
            token,
            token_env: config.access_token_env.clone(),
            call_timeout: Duration::from_millis(config.call_timeout_ms),
            http,
        })
    }

    /// Replaces the token read from the environment (None = no Authorization header).
    pub fn with_access_token(mut self, token: Option<String>) -> OneBotClient {
        self.token = token.filter(|t| !t.is_empty()).map(AccessToken);
        self
    }

    /// `POST {api_base}/{action}` with `params`; the reply's `data` on success.
    pub async fn call(&self, action: &str, params: Value) -> Result<Value, OneBotError> {
        self.call_keyed(action, params, None).await
    }

    /// [`OneBotClient::call`] with an `Idempotency-Key` header: the same key for every attempt
    /// at one effect, so a gateway or the implementation can drop a repeat.
    pub async fn call_keyed(
        &self,
        action: &str,
        params: Value,
        key: Option<&str>,
    ) -> Result<Value, OneBotError> {
        self.call_inner(action, params, key)
            .await
            .map_err(|e| self.redact(e))
    }

    async fn call_inner(
        &self,
        action: &str,
        params: Value,
        key: Option<&str>,
    ) -> Result<Value, OneBotError> {
        let failed = |message: String| OneBotError::Failed {
            action: action.to_owned(),
            message,
        };
        let unreachable = |message: String| OneBotError::Unreachable {
            action: action.to_owned(),
            api_base: self.api_base.clone(),
            message,
        };
        let mut req = self
            .http
            .post(format!("{}/{action}", self.api_base))
            .timeout(self.call_timeout)
            .json(&params);
        if let Some(t) = &self.token {
            req = req.bearer_auth(&t.0);
        }
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        let response = req.send().await.map_err(|e| unreachable(chain(&e)))?;
        let status = response.status();
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| unreachable(format!("the reply was cut off: {}", chain(&e))))?;
            body.extend_from_slice(&chunk[..chunk.len().min(MAX_REPLY_BYTES - body.len())]);
            if body.len() >= MAX_REPLY_BYTES {
                break;
            }
        }
        let text = String::from_utf8_lossy(&body);
        match status.as_u16() {
            404 => {
                return Err(OneBotError::Unsupported {
                    action: action.to_owned(),
                    message: "HTTP 404".into(),
                })
            }
            401 => {
                return Err(failed(format!(
                "HTTP 401: the implementation wants an access token (set ${} to its access_token)",
                self.token_env
            )))
            }
            403 => {
                return Err(failed(format!(
                    "HTTP 403: the access token was refused (check ${})",
                    self.token_env
                )))
            }
            s if !(200..300).contains(&s) => {
                return Err(failed(format!("HTTP {status}: {}", excerpt(&text))))
            }
            _ => {}
        }
        let reply: Value = serde_json::from_slice(&body)
            .map_err(|_| failed(format!("the reply is not OneBot JSON: {}", excerpt(&text))))?;
        let state = reply
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let retcode = reply.get("retcode").and_then(Value::as_i64);
        let message = ["message", "msg", "wording"]
            .iter()
            .filter_map(|k| {
                reply
                    .get(*k)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
            })
            .collect::<Vec<_>>()
            .join("; ");
        if retcode == Some(1404) {
            return Err(OneBotError::Unsupported {
                action: action.to_owned(),
                message: format!("retcode 1404 {message}").trim().to_owned(),
            });
        }
        if matches!(state, "ok" | "async") || (state.is_empty() && retcode == Some(0)) {
            return Ok(reply.get("data").cloned().unwrap_or(Value::Null));
        }
        let lower = message.to_lowercase();
        let what = format!(
            "status {}, retcode {}: {}",
            if state.is_empty() { "?" } else { state },
            retcode.map_or("?".into(), |r| r.to_string()),
            if message.is_empty() {
                excerpt(&text)
            } else {
                message.clone()
            }
        );
        if state == "failed"
            && [
                "unsupported",
                "not supported",
                "not support",
                "not found",
                "不支持",
            ]
            .iter()
            .any(|w| lower.contains(w))
        {
            return Err(OneBotError::Unsupported {
                action: action.to_owned(),
                message: what,
            });
        }
        Err(failed(what))
    }

    fn redact(&self, e: OneBotError) -> OneBotError {
        let Some(token) = &self.token else { return e };
        let r = |s: String| s.replace(&token.0, "[redacted]");
        match e {
            OneBotError::Unsupported { action, message } => OneBotError::Unsupported {
                action,
                message: r(message),
            },
            OneBotError::Failed { action, message } => OneBotError::Failed {
                action,
                message: r(message),
            },
            OneBotError::Unreachable {
                action,
                api_base,
                message,
            } => OneBotError::Unreachable {
                action,
                api_base,
                message: r(message),
            },
            other => other,
        }
    }
}

/// A file to send, with where it stays in the project.
#[derive(Clone, Copy, Debug)]
pub struct OutgoingFile<'a> {
    /// The name shown in the chat (a plain file name).
    pub name: &'a str,
    pub bytes: &'a [u8],
    pub project: &'a str,
    /// Its path in the project (`docs/artifacts/<run_id>/<name>`).
    pub stored_path: &'a str,
    pub run_id: &'a str,
    /// The step delivering it (`<run>/<node>/<attempt>`, the same when the step is delivered
    /// again after a failover); "" = none. Each call carries `<step>/<stored_path>#<action>`
    /// as its `Idempotency-Key`.
    pub step_key: &'a str,
}

impl OutgoingFile<'_> {
    fn idempotency_key(&self, action: &str) -> Option<String> {
        (!self.step_key.is_empty())
            .then(|| format!("{}/{}#{action}", self.step_key, self.stored_path))
    }
}

/// How a file delivery ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UploadStatus {
    /// Uploaded with `upload_group_file` / `upload_private_file`.
    Uploaded,
    /// The upload action is missing; sent as a `file` message segment instead.
    SentAsMessage,
    /// Not delivered; the file stays at `stored_path`.
    Failed,
}

/// The result of sending one file (never an Err: a failure is a status with its error, so
/// the caller can report it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UploadReceipt {
    pub name: String,
    /// Where the file stays in the project (always kept, delivered or not).
    pub stored_path: String,
    /// `group:<id>` or `private:<id>`.
    pub chat: String,
    pub status: UploadStatus,
    /// The action that delivered the file, or the last one tried.
    pub action: String,
    /// What failed, with the stored path for manual hand-over; absent on success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A OneBot chat as a delivery target.
#[derive(Clone, Debug)]
pub struct OneBotTarget {
    client: OneBotClient,
    chat: Chat,
    config: OneBotConfig,
}

/// The file reference handed to the implementation, and a spooled copy to remove after.
struct FileReference {
    file: String,
    spooled: Option<PathBuf>,
}

impl OneBotTarget {
    pub fn new(config: &OneBotConfig, chat: Chat) -> Result<OneBotTarget, OneBotError> {
        Ok(OneBotTarget {
            client: OneBotClient::new(config)?,
            chat,
            config: config.clone(),
        })
    }

    /// Replaces the token read from the environment.
    pub fn with_access_token(mut self, token: Option<String>) -> OneBotTarget {
        self.client = self.client.with_access_token(token);
        self
    }

    pub fn chat(&self) -> Chat {
        self.chat
    }

    pub fn client(&self) -> &OneBotClient {
        &self.client
    }

    /// Sends `file`: the upload action, then on "unsupported" a `file` message segment
    /// Never fails: the receipt says what happened.
    pub async fn send_file(&self, file: &OutgoingFile<'_>) -> UploadReceipt {
        let upload = self.chat.upload_action();
        let receipt = |status: UploadStatus, action: &str, error: Option<String>| UploadReceipt {
            name: file.name.to_owned(),
            stored_path: file.stored_path.to_owned(),
            chat: self.chat.to_string(),
            status,
            action: action.to_owned(),
            error: error.map(|e| {
                format!(
                    "{e}; the file is kept in the project at {} for manual delivery",
                    file.stored_path
                )
            }),
        };
        let reference = match self.reference(file).await {
            Ok(r) => r,
            Err(e) => return receipt(UploadStatus::Failed, upload, Some(e.to_string())),
        };
        let out = match self
            .client
            .call_keyed(
                upload,
                self.chat
                    .params(json!({"file": reference.file, "name": file.name})),
                file.idempotency_key(upload).as_deref(),
            )
            .await
        {
            Ok(_) => receipt(UploadStatus::Uploaded, upload, None),
            Err(upload_error @ OneBotError::Unsupported { .. }) => {
                let fallback = self.chat.message_action();
                let segment =
                    json!([{"type": "file", "data": {"file": reference.file, "name": file.name}}]);
                let key = file.idempotency_key(fallback);
                match self.client.call_keyed(fallback, self.chat.params(json!({"message": segment})), key.as_deref()).await {
                    Ok(_) => receipt(UploadStatus::SentAsMessage, fallback, None),
                    Err(e) => receipt(
                        UploadStatus::Failed,
                        fallback,
                        Some(format!("{upload_error}; the fallback {fallback} with a file segment failed too: {e}")),
                    ),
                }
            }
            Err(e) => receipt(UploadStatus::Failed, upload, Some(e.to_string())),
        };
        if let Some(path) = reference.spooled {
            if let Err(e) = tokio::fs::remove_file(&path).await {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove the spooled OneBot file");
            }
        }
        out
    }

    /// Sends a plain-text message (as a text segment, so nothing in it is read as CQ code).
    pub async fn send_text(&self, text: &str) -> Result<(), OneBotError> {
        let message = json!([{"type": "text", "data": {"text": text}}]);
        self.client
            .call(
                self.chat.message_action(),
                self.chat.params(json!({"message": message})),
            )
            .await
            .map(|_| ())
    }

    async fn reference(&self, file: &OutgoingFile<'_>) -> Result<FileReference, OneBotError> {
        let err = |message: String| OneBotError::File {
            name: file.name.to_owned(),
            message,
        };
        if file.name.is_empty()
            || file.name.contains(['/', '\\', '\0'])
            || file.name == "."
            || file.name == ".."
        {
            return Err(err("not a plain file name".into()));
        }
        let c = &self.config;
        let limit = c.base64_max_mb.saturating_mul(1 << 20);
        let small = (file.bytes.len() as u64) <= limit;
        let mode = match c.file_ref {
            FileRef::Auto if small => FileRef::Base64,
            FileRef::Auto if !c.shared_dir.is_empty() => FileRef::SharedDir,
            FileRef::Auto if !c.store_root.is_empty() => FileRef::Store,
            FileRef::Auto => {
                return Err(err(format!(
                    "{} bytes is more than onebot.base64_max_mb = {}; set onebot.shared_dir or onebot.store_root so the implementation can read it from disk",
                    file.bytes.len(),
                    c.base64_max_mb
                )))
            }
            other => other,
        };
        match mode {
            FileRef::Base64 if !small => Err(err(format!(
                "{} bytes is more than onebot.base64_max_mb = {}",
                file.bytes.len(),
                c.base64_max_mb
            ))),
            FileRef::Base64 | FileRef::Auto => Ok(FileReference {
                file: format!(
                    "base64://{}",
                    base64::engine::general_purpose::STANDARD.encode(file.bytes)
                ),
                spooled: None,
            }),
            FileRef::SharedDir => {
                if c.shared_dir.is_empty() {
                    return Err(err("onebot.shared_dir is not set".into()));
                }
                if file.run_id.is_empty()
                    || file.run_id.contains(['/', '\\', '\0'])
                    || file.run_id.starts_with('.')
                {
                    return Err(err(format!(
                        "run id `{}` cannot name a spool directory",
                        file.run_id
                    )));
                }
                let dir = Path::new(&c.shared_dir).join(file.run_id);
                let local = dir.join(file.name);
                spool(&dir, &local, file.bytes)
                    .await
                    .map_err(|e| err(format!("cannot write {}: {e}", local.display())))?;
                let seen = if c.shared_dir_seen_as.is_empty() {
                    &c.shared_dir
                } else {
                    &c.shared_dir_seen_as
                };
                Ok(FileReference {
                    file: format!(
                        "{}/{}/{}",
                        seen.trim_end_matches('/'),
                        file.run_id,
                        file.name
                    ),
                    spooled: Some(local),
                })
            }
            FileRef::Store => {
                if c.store_root.is_empty() {
                    return Err(err("onebot.store_root is not set".into()));
                }
                Ok(FileReference {
                    file: format!(
                        "{}/projects/{}/{}",
                        c.store_root.trim_end_matches('/'),
                        file.project,
                        file.stored_path
                    ),
                    spooled: None,
                })
            }
        }
    }
}

/// Writes `bytes` to `to` through a temporary file and a rename, so the implementation
/// never reads a half-written file.
async fn spool(dir: &Path, to: &Path, bytes: &[u8]) -> std::io::Result<()> {
    tokio::fs::create_dir_all(dir).await?;
    let tmp = dir.join(format!(".{}.part", uuid::Uuid::new_v4()));
    if let Err(e) = tokio::fs::write(&tmp, bytes).await {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e);
    }
    tokio::fs::rename(&tmp, to).await.inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

impl DeliveryTarget for OneBotTarget {
    fn kind(&self) -> &'static str {
        self.chat.kind()
    }

    fn deliver<'a>(
        &'a self,
        ctx: &'a DeliveryCtx<'a>,
        files: &'a [String],
    ) -> BoxFuture<'a, Result<Receipt, NodeError>> {
        Box::pin(async move {
            let mut delivered = Vec::new();
            let mut uploads = Vec::new();
            for f in files {
                let bytes = ctx
                    .store
                    .get(ctx.project, f)
                    .await
                    .map_err(|s| NodeError::from_status(&format!("reading {f}"), &s))?
                    .ok_or_else(|| NodeError::refused(format!("{f} does not exist")))?;
                let name = f.rsplit('/').next().unwrap_or(f);
                let file = OutgoingFile {
                    name,
                    bytes: &bytes,
                    project: ctx.project,
                    stored_path: f,
                    run_id: ctx.run_id,
                    step_key: ctx.step_key,
                };
                let receipt = self.send_file(&file).await;
                if receipt.status == UploadStatus::Failed {
                    let error = receipt.error.unwrap_or_default();
                    return Err(NodeError::failed(format!(
                        "delivering {f} to {}: {error}",
                        self.chat
                    )));
                }
                delivered.push(f.clone());
                uploads.push(receipt);
            }
            Ok(Receipt {
                target: self.kind().into(),
                location: self.chat.to_string(),
                delivered,
                uploads,
            })
        })
    }
}

pub use cairn_graph::targets::check_chat_target as check_target;

/// The chat a node's (checked) target names, its template rendered.
pub fn chat_for(t: &Target, scope: &Scope) -> Result<Chat, NodeError> {
    let id = match t.fields.get("id") {
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| NodeError::refused(format!("target.id `{n}` is not a chat id")))?,
        Some(Value::String(s)) => {
            let tpl = Template::parse(s).map_err(NodeError::refused)?;
            let text = scope.render("target.id", &tpl)?;
            text.trim()
                .parse::<i64>()
                .map_err(|_| NodeError::refused(format!("target.id `{text}` is not a number")))?
        }
        _ => {
            return Err(NodeError::refused(format!(
                "a {} target needs `id`",
                t.kind
            )))
        }
    };
    Chat::new(&t.kind, id).map_err(NodeError::refused)
}

/// The OneBot target of a node's `group` / `private` target.
pub fn target_for(
    t: &Target,
    scope: &Scope,
    config: &OneBotConfig,
) -> Result<OneBotTarget, NodeError> {
    let chat = chat_for(t, scope)?;
    OneBotTarget::new(config, chat).map_err(|e| NodeError::refused(e.to_string()))
}

/// The notice of a task that ended because one LLM request failed all its attempts
/// (task id; stage; error summary; retry advice).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureNotice<'a> {
    pub task_id: &'a str,
    pub stage: &'a str,
    pub error_summary: &'a str,
    pub retry_advice: &'a str,
}

impl FailureNotice<'_> {
    pub fn text(&self) -> String {
        let mut error = self.error_summary.trim().to_owned();
        if error.chars().count() > NOTICE_ERROR_CHARS {
            error = error.chars().take(NOTICE_ERROR_CHARS).collect::<String>() + "…";
        }
        format!(
            "[cairn] task failed\ntask: {}\nstage: {}\nerror: {}\nretry: {}",
            self.task_id,
            self.stage,
            error,
            self.retry_advice.trim()
        )
    }
}

/// Sends the failure notice to `target` as a text message.
pub async fn notify_failure(
    target: &OneBotTarget,
    task_id: &str,
    stage: &str,
    error_summary: &str,
    retry_advice: &str,
) -> Result<(), OneBotError> {
    target
        .send_text(
            &FailureNotice {
                task_id,
                stage,
                error_summary,
                retry_advice,
            }
            .text(),
        )
        .await
}

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

fn excerpt(s: &str) -> String {
    let s = s.trim();
    if s.is_empty() {
        return "(empty body)".into();
    }
    if s.chars().count() > EXCERPT_CHARS {
        s.chars().take(EXCERPT_CHARS).collect::<String>() + "…"
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn target(kind: &str, id: Value) -> Target {
        let mut fields = serde_json::Map::new();
        fields.insert("id".into(), id);
        Target {
            kind: kind.into(),
            fields,
        }
    }

    #[test]
    fn targets() {
        assert!(check_target(&target("group", json!(123))).is_ok());
        assert!(check_target(&target("private", json!("10001"))).is_ok());
        assert!(check_target(&target("group", json!("{{vars.group}}"))).is_ok());
        assert!(check_target(&target("group", json!(0)))
            .unwrap_err()
            .contains("positive"));
        assert!(check_target(&target("group", json!("abc")))
            .unwrap_err()
            .contains("not a group id"));
        let mut t = target("group", json!(1));
        t.fields.insert("token".into(), json!("x"));
        assert!(check_target(&t)
            .unwrap_err()
            .contains("unknown field `token`"));
    }

    #[test]
    fn debug_never_shows_the_token() {
        let c = OneBotConfig {
            api_base: "http://127.0.0.1:9".into(),
            ..Default::default()
        };
        let t = OneBotTarget::new(&c, Chat::Group(1))
            .unwrap()
            .with_access_token(Some("tok-secret".into()));
        let d = format!("{t:?}");
        assert!(!d.contains("tok-secret") && d.contains("redacted"), "{d}");
    }
}
