//! The replay provider: answers recorded in a cassette file, matched by node id, turn and step.
//!
//! ```yaml
//! version: 1
//! answers:
//!   - node: author          # graph node id; `<map>.*` matches every item of a map
//!     turn: 1               # default 1; a rework asks for turn 2, ...
//!     content: |
//!       The answer text.
//!   - node: deliver         # a tool loop (code_delivery): one answer per request
//!     step: 2               # default 1; the n-th request of the loop (see below)
//!     tool_calls:
//!       - name: write
//!         arguments: {path: README.md, content: "# Demo\n"}   # a mapping, or JSON text as written
//!         id: call_7        # optional; default `call_<step>_<index>`
//! ```
//! The step of a request is 1 + the number of assistant messages already in it, so a plain
//! agent request is step 1 and the n-th model call of a tool loop is step n. An answer has
//! `content`, `tool_calls` or both. A missing answer is an error naming the node, turn and
//! step, never a silent empty reply.

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::Value;

use super::{AgentError, AgentReply, AgentRequest, Provider, Role, ToolCall, Usage};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cassette {
    #[serde(default)]
    version: Option<u32>,
    #[serde(default)]
    model: Option<String>,
    answers: Vec<Answer>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    node: String,
    #[serde(default = "first")]
    turn: u32,
    /// The request within a tool loop (1 = the first model call).
    #[serde(default = "first")]
    step: u32,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<RecordedCall>,
    #[serde(default)]
    usage: Option<Usage>,
}

/// A recorded tool call; `arguments` is a mapping or the JSON text (kept verbatim, so a
/// cassette can replay malformed arguments too).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordedCall {
    #[serde(default)]
    id: Option<String>,
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

fn first() -> u32 {
    1
}

pub struct ReplayProvider {
    path: String,
    model: String,
    answers: Vec<Answer>,
}

/// Reason word of a cassette that is not one (YAML, schema, values).
pub const REASON_MALFORMED: &str = "malformed_cassette";

/// What is wrong with a cassette that did not parse: position and kind, never its text (the
/// parser's own message quotes the document, and a cassette may be any file).
fn parse_failure(e: &serde_saphyr::Error) -> String {
    let text = e.to_string();
    let kind = if text.contains("unknown field") {
        "an unknown key (a cassette has version, model and answers; an answer has node, turn, step, content, tool_calls and usage)"
    } else if text.contains("missing field `answers`") {
        "no `answers:` list"
    } else if text.contains("missing field") {
        "an entry without a required key (an answer needs `node`, a tool call `name`)"
    } else if text.contains("invalid type") || text.contains("invalid value") {
        "a value of the wrong type"
    } else {
        "not YAML or JSON of a cassette"
    };
    match e.location() {
        Some(at) if at.line() > 0 => format!(
            "not a cassette: {kind} at line {}, column {}",
            at.line(),
            at.column()
        ),
        _ => format!("not a cassette: {kind}"),
    }
}

impl ReplayProvider {
    /// The cassette `text`, shown in records and messages as `path`. Errors give position and
    /// kind, never the text.
    pub fn from_text(path: &str, text: &str) -> Result<ReplayProvider, AgentError> {
        let err = |message: String| AgentError::Cassette {
            path: path.to_owned(),
            reason: REASON_MALFORMED,
            message,
        };
        if text.len() as u64 > super::cassette::MAX_CASSETTE_BYTES {
            return Err(AgentError::Cassette {
                path: path.to_owned(),
                reason: "too_large",
                message: format!(
                    "larger than {} MiB",
                    super::cassette::MAX_CASSETTE_BYTES >> 20
                ),
            });
        }
        let cassette: Cassette =
            serde_saphyr::from_str(text).map_err(|e| err(parse_failure(&e)))?;
        if cassette.version.is_some_and(|v| v != 1) {
            return Err(err("only cassette version 1 exists".into()));
        }
        for (i, a) in cassette.answers.iter().enumerate() {
            if a.content.is_none() && a.tool_calls.is_empty() {
                return Err(err(format!(
                    "answers[{i}] has neither `content` nor `tool_calls`"
                )));
            }
            if a.turn == 0 || a.step == 0 {
                return Err(err(format!("answers[{i}]: turn and step count from 1")));
            }
            if let Some(j) = a.tool_calls.iter().position(|c| c.name.trim().is_empty()) {
                return Err(err(format!(
                    "answers[{i}]: tool_calls[{j}] has an empty name"
                )));
            }
        }
        Ok(ReplayProvider {
            path: path.to_owned(),
            model: cassette.model.unwrap_or_else(|| "replay".into()),
            answers: cassette.answers,
        })
    }

    fn find(&self, node: &str, turn: u32, step: u32) -> Option<&Answer> {
        let exact = self
            .answers
            .iter()
            .find(|a| a.node == node && a.turn == turn && a.step == step);
        exact.or_else(|| {
            let (map, _) = node.rsplit_once('.')?;
            let wildcard = format!("{map}.*");
            self.answers
                .iter()
                .find(|a| a.node == wildcard && a.turn == turn && a.step == step)
        })
    }
}

/// 1 + the assistant messages already in the request: the n-th model call of a tool loop.
pub(crate) fn step_of(request: &AgentRequest) -> u32 {
    let answered = request
        .messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count();
    u32::try_from(answered).unwrap_or(u32::MAX - 1) + 1
}

fn calls_of(answer: &Answer, step: u32) -> Vec<ToolCall> {
    answer
        .tool_calls
        .iter()
        .enumerate()
        .map(|(i, c)| ToolCall {
            id: c.id.clone().unwrap_or_else(|| format!("call_{step}_{i}")),
            name: c.name.clone(),
            arguments: match &c.arguments {
                None | Some(Value::Null) => "{}".into(),
                Some(Value::String(text)) => text.clone(),
                Some(v) => v.to_string(),
            },
        })
        .collect()
}

impl Provider for ReplayProvider {
    fn name(&self) -> String {
        format!("replay:{}", self.path)
    }

    fn complete<'a>(
        &'a self,
        request: &'a AgentRequest,
    ) -> BoxFuture<'a, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            let step = step_of(request);
            let Some(answer) = self.find(&request.node_id, request.turn, step) else {
                if step == 1 {
                    return Err(AgentError::MissingAnswer {
                        cassette: self.path.clone(),
                        node: request.node_id.clone(),
                        turn: request.turn,
                    });
                }
                return Err(AgentError::Cassette {
                    path: self.path.clone(),
                    reason: "missing_answer",
                    message: format!(
                        "no answer for node `{node}` turn {turn} step {step} (request {step} of its tool loop); add an entry `- {{node: {node}, turn: {turn}, step: {step}, tool_calls: [...]}}` under `answers:`",
                        node = request.node_id,
                        turn = request.turn,
                    ),
                });
            };
            let content = answer.content.clone().unwrap_or_default();
            let tool_calls = calls_of(answer, step);
            let usage = answer.usage.clone().unwrap_or_else(|| Usage {
                prompt_tokens: request
                    .messages
                    .iter()
                    .map(|m| m.content.len() as u64 / 4)
                    .sum(),
                completion_tokens: (content.len()
                    + tool_calls.iter().map(|c| c.arguments.len()).sum::<usize>())
                    as u64
                    / 4,
            });
            Ok(AgentReply {
                content,
                model: self.model.clone(),
                usage,
                finish_reason: if tool_calls.is_empty() {
                    "stop"
                } else {
                    "tool_calls"
                }
                .into(),
                tool_calls,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(node: &str, turn: u32) -> AgentRequest {
        AgentRequest {
            run_id: "r".into(),
            node_id: node.into(),
            agent: "a".into(),
            instance: "a".into(),
            turn,
            messages: vec![],
            tools: vec![],
            tool_choice: None,
            max_attempts: None,
        }
    }

    #[tokio::test]
    async fn matches_node_and_turn() {
        let p = ReplayProvider::from_text(
            "c.yaml",
            "answers:\n  - {node: a, content: one}\n  - {node: a, turn: 2, content: two}\n  - {node: m.*, content: item}\n",
        )
        .unwrap();
        assert_eq!(p.complete(&request("a", 1)).await.unwrap().content, "one");
        assert_eq!(p.complete(&request("a", 2)).await.unwrap().content, "two");
        assert_eq!(
            p.complete(&request("m.7", 1)).await.unwrap().content,
            "item"
        );
        let e = p.complete(&request("b", 1)).await.unwrap_err();
        assert!(matches!(e, AgentError::MissingAnswer { .. }));
        assert!(e.to_string().contains("node `b` turn 1"), "{e}");
        assert!(ReplayProvider::from_text("c", "answers: [{node: a}]").is_err());
        assert!(ReplayProvider::from_text("c", "nope: 1").is_err());
    }

    #[tokio::test]
    async fn tool_loop_answers_by_step() {
        let p = ReplayProvider::from_text(
            "c.yaml",
            r#"answers:
  - node: cd
    tool_calls:
      - {name: write, arguments: {path: a.txt, content: hi}}
      - {id: mine, name: glob, arguments: '{"pattern": "*"'}
  - node: cd
    step: 2
    content: done
    tool_calls: [{name: end}]
"#,
        )
        .unwrap();
        let mut req = request("cd", 1);
        let first = p.complete(&req).await.unwrap();
        assert_eq!(first.finish_reason, "tool_calls");
        assert_eq!(first.tool_calls.len(), 2);
        assert_eq!(first.tool_calls[0].id, "call_1_0");
        assert_eq!(first.tool_calls[0].name, "write");
        let args: Value = serde_json::from_str(&first.tool_calls[0].arguments).unwrap();
        assert_eq!(args, serde_json::json!({"path": "a.txt", "content": "hi"}));
        // Text arguments are replayed verbatim, malformed or not.
        assert_eq!(first.tool_calls[1].id, "mine");
        assert_eq!(first.tool_calls[1].arguments, r#"{"pattern": "*""#);
        req.messages.push(super::super::Message::assistant_calls(
            "",
            first.tool_calls.clone(),
        ));
        let second = p.complete(&req).await.unwrap();
        assert_eq!(second.content, "done");
        assert_eq!(second.tool_calls[0].arguments, "{}");
        req.messages.push(super::super::Message::assistant_calls(
            "",
            second.tool_calls,
        ));
        let e = p.complete(&req).await.unwrap_err();
        assert!(e.to_string().contains("step 3"), "{e}");
        assert!(
            ReplayProvider::from_text("c", "answers: [{node: a, tool_calls: [{name: ''}]}]")
                .is_err()
        );
        assert!(
            ReplayProvider::from_text("c", "answers: [{node: a, step: 0, content: x}]").is_err()
        );
    }
}
