//! Complete provider records: every request a node sends and the whole reply it got (content,
//! tool calls, finish reason, usage; a streamed reply as assembled) or its error, with the
//! attempts the provider made, one JSON file per exchange:
//! `agents/<instance>/runtime/exchanges/<attempt>-<turn>-<step>.json` (step = the n-th model
//! call of a tool loop). `Recording` writes them around any provider; `recorded.rs` answers
//! a replay from them. Records never hold the run's own id: it is written as [`RUN_ID_MARK`],
//! so a replay under a new id compares and answers byte for byte.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use cairn_sha256::sha256_hex;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{AgentError, AgentReply, AgentRequest, Attempt, AttemptObserver, NoObserver, Provider};
use cairn_store_client::{PutOptions, Store};

/// Version of the exchange record format.
pub const RECORD_VERSION: u32 = 1;
/// What the run's own id is written as in records.
pub const RUN_ID_MARK: &str = "⟨run_id⟩";
/// Where an agent instance's exchanges live, under its directory.
pub const EXCHANGES_DIR: &str = "runtime/exchanges";

/// One provider exchange as recorded.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exchange {
    pub version: u32,
    pub node: String,
    pub attempt: u32,
    pub turn: u32,
    pub step: u32,
    /// The provider's name in the run's records.
    pub provider: String,
    /// sha256 of `request` as compact JSON (keys sorted).
    pub request_sha256: String,
    /// The request as compared: messages, tools, tool choice and parameters, without the run
    /// id field and with the run id marked.
    pub request: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<AgentReply>,
    /// Why the request ended without an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Every attempt the provider made (`llm.attempt` events).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<Attempt>,
}

/// Why a replay could not use a record.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RecordError {
    #[error("replay record missing: {path} (node `{node}`, attempt {attempt}, turn {turn}, step {step}) is not in the recorded run; a run recorded before complete provider records (or with this exchange lost) cannot be replayed from its records: re-run it live instead")]
    Missing {
        path: String,
        node: String,
        attempt: u32,
        turn: u32,
        step: u32,
    },
    #[error("replay record {path} is damaged at line {line}, column {column}: {message}; restore the file from a backup or replay another run")]
    Corrupt {
        path: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("replay diverged at node `{node}` attempt {attempt} (turn {turn}, step {step}): the request differs from the recorded one\n{diff}")]
    Diverged {
        node: String,
        attempt: u32,
        turn: u32,
        step: u32,
        /// Unified diff, recorded request first.
        diff: String,
    },
}

impl RecordError {
    /// A request the records do not answer as it is (a divergence or no record of it), as
    /// opposed to records that cannot be read.
    pub fn left_records(&self) -> bool {
        matches!(
            self,
            RecordError::Missing { .. } | RecordError::Diverged { .. }
        )
    }

    /// Reason word (`cairn-reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            RecordError::Missing { .. } => "record_missing",
            RecordError::Corrupt { .. } => "record_corrupt",
            RecordError::Diverged { .. } => "replay_diverged",
        }
    }
}

impl From<RecordError> for AgentError {
    fn from(e: RecordError) -> AgentError {
        AgentError::Record(Box::new(e))
    }
}

/// The file name of one exchange.
pub fn file_name(attempt: u32, turn: u32, step: u32) -> String {
    format!("{attempt}-{turn}-{step}.json")
}

/// Every string in `v` with `from` replaced by `to`.
pub fn replace_in(v: Value, from: &str, to: &str) -> Value {
    if from.is_empty() {
        return v;
    }
    match v {
        Value::String(s) if s.contains(from) => Value::String(s.replace(from, to)),
        Value::Array(a) => Value::Array(a.into_iter().map(|x| replace_in(x, from, to)).collect()),
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, x)| (k, replace_in(x, from, to)))
                .collect(),
        ),
        other => other,
    }
}

/// The request as recorded and compared: no run id field, the run id marked.
pub fn comparable(request: &AgentRequest) -> Value {
    let mut v = serde_json::to_value(request).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.remove("run_id");
    }
    replace_in(v, &request.run_id, RUN_ID_MARK)
}

/// sha256 (hex) of `v` as compact JSON; object keys are sorted, so equal values hash equal.
pub fn hash(v: &Value) -> String {
    sha256_hex(v.to_string().as_bytes())
}

/// A unified diff of two texts, `a` as `recorded`, `b` as `replay`.
pub fn unified_diff(a: &str, b: &str, a_name: &str, b_name: &str) -> String {
    similar::TextDiff::from_lines(a, b)
        .unified_diff()
        .context_radius(3)
        .header(a_name, b_name)
        .to_string()
}

/// Pretty JSON for diffs.
pub fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// Parses an exchange file; a damaged one names its line and column.
pub fn parse(path: &str, bytes: &[u8]) -> Result<Exchange, RecordError> {
    let ex: Exchange = serde_json::from_slice(bytes).map_err(|e| RecordError::Corrupt {
        path: path.to_owned(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let at_end = || {
        let text = String::from_utf8_lossy(bytes);
        (text.lines().count().max(1), 1)
    };
    if ex.version != RECORD_VERSION {
        let (line, column) = at_end();
        return Err(RecordError::Corrupt {
            path: path.to_owned(),
            line,
            column,
            message: format!(
                "record version {} (this orchestrator reads {RECORD_VERSION})",
                ex.version
            ),
        });
    }
    if hash(&ex.request) != ex.request_sha256 {
        // Which line holds the hash, so the message points at it.
        let text = String::from_utf8_lossy(bytes);
        let line = text
            .lines()
            .position(|l| l.contains("\"request_sha256\""))
            .map_or(1, |i| i + 1);
        return Err(RecordError::Corrupt {
            path: path.to_owned(),
            line,
            column: 1,
            message:
                "the recorded request does not match its request_sha256 (the file was changed)"
                    .into(),
        });
    }
    Ok(ex)
}

/// Records every exchange of one node attempt around `inner`.
pub struct Recording {
    inner: Arc<dyn Provider>,
    store: Store,
    project: String,
    /// `.cairn/runs/<run>/agents/<instance>/runtime/exchanges`.
    dir: String,
    attempt: u32,
}

impl Recording {
    pub fn new(
        inner: Arc<dyn Provider>,
        store: Store,
        project: &str,
        dir: &str,
        attempt: u32,
    ) -> Recording {
        Recording {
            inner,
            store,
            project: project.to_owned(),
            dir: dir.to_owned(),
            attempt,
        }
    }

    async fn write(&self, ex: &Exchange) -> Result<(), AgentError> {
        let path = format!("{}/{}", self.dir, file_name(ex.attempt, ex.turn, ex.step));
        let mut body = serde_json::to_string_pretty(ex).unwrap_or_default();
        body.push('\n');
        // A redelivered attempt records its exchange again: the same file.
        let opts = PutOptions {
            overwrite: true,
            ..Default::default()
        };
        self.store
            .put(&self.project, &path, Bytes::from(body), &opts)
            .await
            .map(|_| ())
            .map_err(|s| AgentError::Unavailable(format!("recording {path}: {}", s.message())))
    }
}

/// Passes attempts on and keeps them for the record.
struct Tee<'a> {
    observer: &'a dyn AttemptObserver,
    seen: Mutex<Vec<Attempt>>,
}

impl AttemptObserver for Tee<'_> {
    fn attempt(&self, a: &Attempt) {
        self.observer.attempt(a);
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(a.clone());
    }
}

impl Provider for Recording {
    fn name(&self) -> String {
        self.inner.name()
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
            let tee = Tee {
                observer,
                seen: Mutex::new(Vec::new()),
            };
            let result = self.inner.complete_observed(request, &tee).await;
            let run = request.run_id.as_str();
            let req = comparable(request);
            let mark = |v: Value| replace_in(v, run, RUN_ID_MARK);
            let ex = Exchange {
                version: RECORD_VERSION,
                node: request.node_id.clone(),
                attempt: self.attempt,
                turn: request.turn,
                step: super::replay::step_of(request),
                provider: self.inner.name(),
                request_sha256: hash(&req),
                request: req,
                reply: match &result {
                    Ok(r) => {
                        serde_json::from_value(mark(serde_json::to_value(r).unwrap_or_default()))
                            .ok()
                    }
                    Err(_) => None,
                },
                error: result
                    .as_ref()
                    .err()
                    .map(|e| mark(Value::String(e.to_string())))
                    .and_then(|v| v.as_str().map(str::to_owned)),
                attempts: tee
                    .seen
                    .into_inner()
                    .unwrap_or_else(|p| p.into_inner())
                    .into_iter()
                    .filter_map(|a| {
                        serde_json::from_value(mark(serde_json::to_value(a).ok()?)).ok()
                    })
                    .collect(),
            };
            let written = self.write(&ex).await;
            match (result, written) {
                (Ok(_), Err(e)) => Err(e),
                (result, _) => result,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, Role};

    fn request(run: &str, prompt: &str) -> AgentRequest {
        AgentRequest {
            run_id: run.into(),
            node_id: "a".into(),
            agent: "a".into(),
            instance: "a".into(),
            turn: 1,
            messages: vec![Message::new(Role::User, format!("run {run}: {prompt}"))],
            tools: vec![],
            tool_choice: None,
            max_attempts: None,
        }
    }

    #[test]
    fn requests_of_two_runs_hash_equal_and_a_changed_prompt_does_not() {
        let a = comparable(&request("run-1", "hi"));
        let b = comparable(&request("run-2", "hi"));
        assert_eq!(hash(&a), hash(&b));
        assert_ne!(hash(&a), hash(&comparable(&request("run-2", "hello"))));
        assert!(a.to_string().contains(RUN_ID_MARK));
    }

    #[test]
    fn a_damaged_record_names_its_line_and_a_changed_one_is_caught_by_its_hash() {
        let req = comparable(&request("run-7", "hi"));
        let ex = Exchange {
            version: RECORD_VERSION,
            node: "a".into(),
            attempt: 1,
            turn: 1,
            step: 1,
            provider: "p".into(),
            request_sha256: hash(&req),
            request: req,
            reply: None,
            error: Some("x".into()),
            attempts: vec![],
        };
        let text = serde_json::to_string_pretty(&ex).unwrap();
        assert!(parse("f.json", text.as_bytes()).is_ok());
        let broken = text.replacen("\"turn\": 1", "\"turn\": ", 1);
        let line = broken.lines().position(|l| l.contains("\"turn\"")).unwrap() + 1;
        let e = parse("f.json", broken.as_bytes()).unwrap_err();
        assert!(
            matches!(e, RecordError::Corrupt { line: l, .. } if l == line || l == line + 1),
            "{e}"
        );
        assert!(e.to_string().contains("f.json"), "{e}");
        let edited = text.replacen("run ⟨run_id⟩: hi", "run ⟨run_id⟩: ho", 1);
        let e = parse("f.json", edited.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("request_sha256"), "{e}");
    }
}
