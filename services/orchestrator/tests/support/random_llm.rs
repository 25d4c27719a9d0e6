//! OpenAI-compatible chat-completions servers on 127.0.0.1:0 that answer at random (new
//! text, token counts and call ids each time), so a live re-run of a recorded run differs
//! from it and only a replay from the records can be identical.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

/// An OpenAI-compatible server on loopback whose every answer is new random text (so a live
/// re-run differs from the recorded one); `stop` takes it off the network.
pub struct RandomLlm {
    pub base_url: String,
    pub calls: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: tokio::task::JoinHandle<()>,
}

/// A chat completion of `message` with a random completion token count.
fn completion(message: Value, finish_reason: &str, prompt_tokens: u64) -> (StatusCode, Value) {
    let tokens = 1 + fastrand::u64(0..50);
    let body = json!({
        "id": "x", "object": "chat.completion", "model": "random-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}
    });
    (StatusCode::OK, body)
}

impl RandomLlm {
    pub async fn start() -> RandomLlm {
        RandomLlm::answering("answer").await
    }

    /// Each answer is `text` followed by a random line.
    pub async fn answering(text: &str) -> RandomLlm {
        RandomLlm::slow(text, 0).await
    }

    /// `answering`, each answer after `delay_ms` (a model's latency).
    pub async fn slow(text: &str, delay_ms: u64) -> RandomLlm {
        let text = text.to_owned();
        RandomLlm::with(delay_ms, move |_| {
            let content = format!("{text} {}\n", uuid::Uuid::new_v4());
            completion(json!({"role": "assistant", "content": content}), "stop", 10)
        })
        .await
    }

    /// Answers each request (its JSON body) with what `answer` gives it, after `delay_ms`;
    /// `calls` counts the requests.
    pub async fn with<F>(delay_ms: u64, answer: F) -> RandomLlm
    where
        F: Fn(Value) -> (StatusCode, Value) + Send + Sync + 'static,
    {
        let answer = Arc::new(answer);
        let calls = Arc::new(AtomicU64::new(0));
        let counter = calls.clone();
        let app = Router::new().route(
            "/v1/chat/completions",
            post(move |axum::Json(req): axum::Json<Value>| {
                let (counter, answer) = (counter.clone(), answer.clone());
                async move {
                    tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
                    counter.fetch_add(1, Ordering::SeqCst);
                    let (status, body) = answer(req);
                    (status, axum::Json(body))
                }
            }),
        );
        RandomLlm::serving(app, calls).await
    }

    /// Serves `app` on loopback; `calls` counts the answers it gave.
    pub async fn serving(app: Router, calls: Arc<AtomicU64>) -> RandomLlm {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let join = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        RandomLlm {
            base_url: format!("http://{addr}/v1"),
            calls,
            stop: Some(tx),
            join,
        }
    }

    pub fn llm(&self) -> String {
        format!("openai:{}#m", self.base_url)
    }

    /// Stops the server and checks that nothing listens there any more.
    pub async fn stop(mut self) -> String {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.join.abort();
        let _ = self.join.await;
        let addr = self
            .base_url
            .trim_start_matches("http://")
            .trim_end_matches("/v1");
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "the fake provider still answers"
        );
        self.base_url
    }
}

/// An OpenAI-compatible server answering each request of a tool loop with the tool calls
/// `cassette` (the examples' format) gives its step (the assistant messages so far, plus
/// one), each answer with random text and random call ids: a live re-run differs.
pub async fn cassette_llm(cassette: &str) -> RandomLlm {
    let cassette: Value = serde_saphyr::from_str(cassette).unwrap();
    let answers = cassette["answers"].as_array().unwrap().clone();
    RandomLlm::with(0, move |req| {
        let step = 1 + req["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .count() as u64;
        let answer = answers
            .iter()
            .find(|a| a["step"].as_u64() == Some(step))
            .unwrap_or_else(|| panic!("the cassette has no step {step}"));
        let tool_calls: Vec<Value> = answer["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                json!({"id": format!("call_{}", uuid::Uuid::new_v4().simple()), "type": "function",
                       "function": {"name": c["name"], "arguments": c["arguments"].to_string()}})
            })
            .collect();
        let content = format!(
            "{} {}",
            answer["content"].as_str().unwrap_or_default(),
            uuid::Uuid::new_v4()
        );
        let message = json!({"role": "assistant", "content": content, "tool_calls": tool_calls});
        completion(message, "tool_calls", 100)
    })
    .await
}

/// The text of the last user message of a chat request (its text parts joined).
fn last_user_text(req: &Value) -> String {
    let Some(m) = req["messages"]
        .as_array()
        .and_then(|ms| ms.iter().rev().find(|m| m["role"] == "user"))
    else {
        return String::new();
    };
    match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The answer a node-keyed cassette (the examples' `answers: [{node, content}]`) gives `node`:
/// its own entry, else the `<map>.*` entry of its map.
fn cassette_answer(answers: &[Value], node: &str) -> String {
    let wildcard = node.split_once('.').map(|(map, _)| format!("{map}.*"));
    answers
        .iter()
        .find(|a| a["node"] == node)
        .or_else(|| {
            answers
                .iter()
                .find(|a| a["node"].as_str().map(str::to_owned) == wildcard)
        })
        .and_then(|a| a["content"].as_str())
        .unwrap_or_else(|| panic!("the cassette has no answer for node `{node}`"))
        .to_owned()
}

/// An OpenAI-compatible server answering each request with the answer `cassette` (an
/// example's node-keyed cassette) gives the node of the first route whose needle is in the
/// request's last user message: routes are `(needle, node)`, most specific first. Every
/// answer has random token counts, and a prose answer (one that is not only JSON) ends with
/// a random line, so a live re-run differs. A request no route knows gets a 500 naming it.
pub async fn prompted_llm(cassette: &str, routes: &[(&str, &str)]) -> RandomLlm {
    let cassette: Value = serde_saphyr::from_str(cassette).unwrap();
    let answers = cassette["answers"].as_array().unwrap().clone();
    let routes: Vec<(String, String)> = routes
        .iter()
        .map(|(needle, node)| ((*needle).to_owned(), cassette_answer(&answers, node)))
        .collect();
    RandomLlm::with(0, move |req| {
        let asked = last_user_text(&req);
        let Some((_, content)) = routes
            .iter()
            .find(|(needle, _)| asked.contains(needle.as_str()))
        else {
            let body = json!({"error": {"message": format!("no route for the request: {asked}"), "type": "server_error"}});
            return (StatusCode::INTERNAL_SERVER_ERROR, body);
        };
        // JSON, bare or as the one fenced block, stays as it is: a JSON document.
        let t = content.trim();
        let json_only = serde_json::from_str::<Value>(t).is_ok()
            || (t.starts_with("```json") && t.ends_with("```"));
        let content = if json_only {
            content.clone()
        } else {
            format!("{content}\nnonce {}\n", uuid::Uuid::new_v4())
        };
        completion(json!({"role": "assistant", "content": content}), "stop", 10)
    })
    .await
}
