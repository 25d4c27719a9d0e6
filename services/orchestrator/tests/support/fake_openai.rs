//! A scripted OpenAI-compatible chat-completions server on 127.0.0.1:0 for graph-level tests:
//! each request takes the next answer (a status with a JSON body, or a hang); a drop flag
//! says when a hanging request was abandoned by the client.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

#[derive(Clone)]
pub enum Answer {
    Json(u16, Value),
    /// Never answers.
    Hang,
}

/// A chat completion with `content` and usage 12 + 3 tokens.
pub fn completion(content: &str) -> Answer {
    Answer::Json(
        200,
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "fake-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
        }),
    )
}

pub fn error(status: u16) -> Answer {
    Answer::Json(
        status,
        json!({"error": {"message": format!("scripted {status}"), "type": "server_error"}}),
    )
}

#[derive(Clone)]
pub struct FakeOpenAi {
    answers: Arc<Mutex<VecDeque<Answer>>>,
    /// Answer once the script is empty (`None`: 500).
    then: Arc<Mutex<Option<Answer>>>,
    seen: Arc<Mutex<Vec<Value>>>,
    /// The Authorization header of each request (None = absent).
    authorizations: Arc<Mutex<Vec<Option<String>>>>,
    pub abandoned: Arc<AtomicBool>,
    /// `http://127.0.0.1:PORT/v1`
    pub base_url: String,
}

struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

async fn chat(State(fake): State<FakeOpenAi>, headers: HeaderMap, body: Bytes) -> Response {
    fake.authorizations.lock().unwrap().push(
        headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    );
    fake.seen
        .lock()
        .unwrap()
        .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
    let next = fake.answers.lock().unwrap().pop_front();
    let answer = next
        .or_else(|| fake.then.lock().unwrap().clone())
        .unwrap_or_else(|| error(500));
    match answer {
        Answer::Json(status, body) => Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap(),
        Answer::Hang => {
            let _flag = DropFlag(fake.abandoned.clone());
            std::future::pending::<()>().await;
            unreachable!()
        }
    }
}

impl FakeOpenAi {
    pub async fn start(answers: Vec<Answer>, then: Option<Answer>) -> FakeOpenAi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let fake = FakeOpenAi {
            answers: Arc::new(Mutex::new(answers.into())),
            then: Arc::new(Mutex::new(then)),
            seen: Arc::default(),
            authorizations: Arc::default(),
            abandoned: Arc::default(),
            base_url: format!("http://{addr}/v1"),
        };
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .with_state(fake.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        fake
    }

    /// The request bodies received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }

    /// The Authorization header of each request received so far (None = none sent).
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.authorizations.lock().unwrap().clone()
    }

    /// The `llm` setting of this server with model `m`.
    pub fn llm(&self) -> String {
        format!("openai:{}#m", self.base_url)
    }
}
