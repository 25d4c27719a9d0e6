//! The replay provider: answers recorded in a cassette file, matched by node id and turn.
//!
//! ```yaml
//! version: 1
//! answers:
//!   - node: author          # graph node id; `<map>.*` matches every item of a map
//!     turn: 1               # default 1; a rework asks for turn 2, ...
//!     content: |
//!       The answer text.
//! ```
//! A missing answer is an error naming the node and turn, never a silent empty reply.

use std::path::Path;

use futures::future::BoxFuture;
use serde::Deserialize;

use super::{AgentError, AgentReply, AgentRequest, Provider, Usage};

/// Largest cassette accepted.
const MAX_CASSETTE_BYTES: u64 = 16 << 20;

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
    #[serde(default = "first_turn")]
    turn: u32,
    content: String,
    #[serde(default)]
    usage: Option<Usage>,
}

fn first_turn() -> u32 {
    1
}

pub struct ReplayProvider {
    path: String,
    model: String,
    answers: Vec<Answer>,
}

impl ReplayProvider {
    pub fn load(path: &Path) -> Result<ReplayProvider, AgentError> {
        let shown = path.display().to_string();
        let err = |message: String| AgentError::Cassette {
            path: shown.clone(),
            message,
        };
        let meta = std::fs::metadata(path).map_err(|e| err(format!("cannot read it: {e}")))?;
        if meta.len() > MAX_CASSETTE_BYTES {
            return Err(err(format!("larger than {} MiB", MAX_CASSETTE_BYTES >> 20)));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| err(format!("cannot read it: {e}")))?;
        Self::from_text(&shown, &text)
    }

    pub fn from_text(path: &str, text: &str) -> Result<ReplayProvider, AgentError> {
        let err = |message: String| AgentError::Cassette {
            path: path.to_owned(),
            message,
        };
        let cassette: Cassette =
            serde_saphyr::from_str(text).map_err(|e| err(format!("not a cassette: {e}")))?;
        if cassette.version.is_some_and(|v| v != 1) {
            return Err(err("only cassette version 1 exists".into()));
        }
        Ok(ReplayProvider {
            path: path.to_owned(),
            model: cassette.model.unwrap_or_else(|| "replay".into()),
            answers: cassette.answers,
        })
    }

    fn find(&self, node: &str, turn: u32) -> Option<&Answer> {
        let exact = self
            .answers
            .iter()
            .find(|a| a.node == node && a.turn == turn);
        exact.or_else(|| {
            let (map, _) = node.rsplit_once('.')?;
            let wildcard = format!("{map}.*");
            self.answers
                .iter()
                .find(|a| a.node == wildcard && a.turn == turn)
        })
    }
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
            let answer = self.find(&request.node_id, request.turn).ok_or_else(|| {
                AgentError::MissingAnswer {
                    cassette: self.path.clone(),
                    node: request.node_id.clone(),
                    turn: request.turn,
                }
            })?;
            let usage = answer.usage.clone().unwrap_or_else(|| Usage {
                prompt_tokens: request
                    .messages
                    .iter()
                    .map(|m| m.content.len() as u64 / 4)
                    .sum(),
                completion_tokens: answer.content.len() as u64 / 4,
            });
            Ok(AgentReply {
                content: answer.content.clone(),
                model: self.model.clone(),
                usage,
                tool_calls: Vec::new(),
                finish_reason: String::new(),
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
}
