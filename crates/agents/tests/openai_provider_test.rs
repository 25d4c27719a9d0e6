//! The OpenAI-compatible provider against a fake chat-completions server (axum on
//! 127.0.0.1:0) with scripted answers: content, tool calls (plain and streamed), retries with
//! backoff and Retry-After, the 5-attempt limit, statuses never retried,
//! timeouts, malformed answers, the API key kept out of errors, cancellation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use cairn_agents::retry::{AttemptOutcome, FailureKind, GaveUp};
use cairn_agents::{
    AgentError, AgentRequest, Attempt, LlmConfig, Message, OpenAiProvider, Provider, Providers,
    Role, ToolCall, ToolChoice, ToolSpec,
};
use serde_json::{json, Value};

const KEY: &str = "sk-test-5ecret-KEY-0123456789";

/// One scripted answer.
#[derive(Clone)]
enum Answer {
    Json {
        status: u16,
        body: Value,
        headers: Vec<(&'static str, String)>,
    },
    Raw {
        status: u16,
        content_type: &'static str,
        body: String,
    },
    /// Server-sent events: each chunk written after `gap`, then (if `hang`) silence.
    Sse {
        chunks: Vec<String>,
        gap: Duration,
        hang: bool,
    },
    /// Never answers; sets the flag when the request is abandoned.
    Hang,
}

fn ok(body: Value) -> Answer {
    Answer::Json {
        status: 200,
        body,
        headers: vec![],
    }
}

fn status(code: u16, body: Value) -> Answer {
    Answer::Json {
        status: code,
        body,
        headers: vec![],
    }
}

#[derive(Clone, Debug)]
struct Seen {
    authorization: Option<String>,
    accept: Option<String>,
    body: Value,
    at: Instant,
}

#[derive(Default)]
struct Script {
    answers: VecDeque<Answer>,
    /// Answer used once the script is empty.
    then: Option<Answer>,
    seen: Vec<Seen>,
}

#[derive(Clone)]
struct Fake {
    script: Arc<Mutex<Script>>,
    abandoned: Arc<AtomicBool>,
    base_url: String,
}

impl Fake {
    fn requests(&self) -> Vec<Seen> {
        self.script.lock().unwrap().seen.clone()
    }
}

/// Sets `abandoned` when dropped before `done` (the client went away).
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

async fn chat(State(fake): State<Fake>, headers: HeaderMap, body: Bytes) -> Response {
    let answer = {
        let mut s = fake.script.lock().unwrap();
        s.seen.push(Seen {
            authorization: headers
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_owned()),
            accept: headers
                .get("accept")
                .map(|v| v.to_str().unwrap().to_owned()),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            at: Instant::now(),
        });
        let then = s.then.clone();
        s.answers
            .pop_front()
            .or(then)
            .unwrap_or_else(|| status(500, json!({"error": {"message": "script exhausted"}})))
    };
    match answer {
        Answer::Json {
            status,
            body,
            headers,
        } => {
            let mut b = Response::builder()
                .status(status)
                .header("content-type", "application/json");
            for (k, v) in headers {
                b = b.header(k, v);
            }
            b.body(Body::from(body.to_string())).unwrap()
        }
        Answer::Raw {
            status,
            content_type,
            body,
        } => Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(Body::from(body))
            .unwrap(),
        Answer::Sse { chunks, gap, hang } => {
            let stream = futures::stream::unfold(
                (chunks.into_iter(), hang),
                move |(mut it, hang)| async move {
                    match it.next() {
                        Some(c) => {
                            tokio::time::sleep(gap).await;
                            Some((Ok::<_, Infallible>(Bytes::from(c)), (it, hang)))
                        }
                        None if hang => {
                            std::future::pending::<()>().await;
                            None
                        }
                        None => None,
                    }
                },
            );
            Response::builder()
                .status(200)
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(stream))
                .unwrap()
        }
        Answer::Hang => {
            let _flag = DropFlag(fake.abandoned.clone());
            std::future::pending::<()>().await;
            unreachable!()
        }
    }
}

async fn fake(answers: Vec<Answer>, then: Option<Answer>) -> Fake {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = Fake {
        script: Arc::new(Mutex::new(Script {
            answers: answers.into(),
            then,
            seen: vec![],
        })),
        abandoned: Arc::new(AtomicBool::new(false)),
        base_url: format!("http://{addr}/v1"),
    };
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(fake.clone());
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    fake
}

/// Small waits so retry tests run fast; the attempt limit stays 5.
fn config() -> LlmConfig {
    LlmConfig {
        initial_backoff_ms: 10,
        max_backoff_ms: 40,
        request_timeout_ms: 10_000,
        idle_timeout_ms: 5_000,
        ..LlmConfig::default()
    }
}

fn provider(fake: &Fake, config: &LlmConfig) -> OpenAiProvider {
    OpenAiProvider::new(&fake.base_url, "test-model", config)
        .unwrap()
        .with_api_key(Some(KEY.into()))
}

fn request(messages: Vec<Message>) -> AgentRequest {
    AgentRequest {
        run_id: "r1".into(),
        node_id: "author".into(),
        agent: "author".into(),
        instance: "author".into(),
        turn: 1,
        messages,
        tools: vec![],
        tool_choice: None,
        max_attempts: None,
    }
}

fn hello() -> AgentRequest {
    request(vec![
        Message::new(Role::System, "be brief"),
        Message::new(Role::User, "hello"),
    ])
}

fn completion(content: Value) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "test-model-2025",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    })
}

/// Collects the attempts the provider reports.
#[derive(Default, Clone)]
struct Attempts(Arc<Mutex<Vec<Attempt>>>);

impl Attempts {
    fn observer(&self) -> impl Fn(&Attempt) + Send + Sync + 'static {
        let v = self.0.clone();
        move |a: &Attempt| v.lock().unwrap().push(a.clone())
    }
    fn all(&self) -> Vec<Attempt> {
        self.0.lock().unwrap().clone()
    }
}

fn llm_error(e: AgentError) -> cairn_agents::LlmError {
    match e {
        AgentError::Llm(e) => *e,
        other => panic!("expected an LLM error, got {other:?}"),
    }
}

#[tokio::test]
async fn happy_path_returns_content_usage_and_sends_the_key_as_bearer() {
    let fake = fake(vec![ok(completion(json!("Hello there")))], None).await;
    let attempts = Attempts::default();
    let observer = attempts.observer();
    let p = provider(&fake, &config());
    let reply = p.complete_observed(&hello(), &observer).await.unwrap();
    assert_eq!(reply.content, "Hello there");
    assert_eq!(reply.model, "test-model-2025");
    assert_eq!(
        (reply.usage.prompt_tokens, reply.usage.completion_tokens),
        (12, 3)
    );
    assert_eq!(reply.finish_reason, "stop");
    assert!(reply.tool_calls.is_empty());

    let seen = fake.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(seen[0].accept.as_deref(), Some("application/json"));
    let body = &seen[0].body;
    assert_eq!(body["model"], "test-model");
    assert_eq!(
        body["messages"],
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}])
    );
    assert!(
        body.get("tools").is_none()
            && body.get("tool_choice").is_none()
            && body.get("stream").is_none(),
        "{body}"
    );

    let a = attempts.all();
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].attempt, a[0].max_attempts), (1, 5));
    assert_eq!(a[0].outcome, AttemptOutcome::Succeeded);
    assert_eq!(a[0].endpoint, format!("{}/chat/completions", fake.base_url));
    assert_eq!(p.name(), format!("openai:{}#test-model", fake.base_url));
}

#[tokio::test]
async fn tool_calls_are_sent_and_parsed() {
    let reply_body = json!({
        "model": "test-model",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"README.md\"}"}},
            {"id": "call_b", "type": "function", "function": {"name": "glob", "arguments": {"pattern": "**/*.rs"}}}
        ]}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 20}
    });
    let fake = fake(vec![ok(reply_body)], None).await;
    let mut req = request(vec![
        Message::new(Role::User, "look around"),
        Message::assistant_calls(
            "",
            vec![ToolCall {
                id: "call_0".into(),
                name: "todo".into(),
                arguments: "{\"action\":\"list\"}".into(),
            }],
        ),
        Message::tool_result("call_0", "[]"),
    ]);
    req.tools = vec![
        ToolSpec {
            name: "read".into(),
            description: "Read a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        },
        ToolSpec {
            name: "glob".into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        },
    ];
    req.tool_choice = Some(ToolChoice::Auto);
    let reply = provider(&fake, &config()).complete(&req).await.unwrap();
    assert_eq!(reply.content, "");
    assert_eq!(reply.finish_reason, "tool_calls");
    assert_eq!(
        reply.tool_calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "read".into(),
                arguments: "{\"path\":\"README.md\"}".into()
            },
            ToolCall {
                id: "call_b".into(),
                name: "glob".into(),
                arguments: "{\"pattern\":\"**/*.rs\"}".into()
            },
        ]
    );

    let body = &fake.requests()[0].body;
    assert_eq!(body["tool_choice"], "auto");
    assert_eq!(
        body["tools"][0],
        json!({"type": "function", "function": {"name": "read", "description": "Read a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}})
    );
    assert_eq!(body["tools"][1]["function"].get("description"), None);
    assert_eq!(
        body["messages"][1],
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "todo", "arguments": "{\"action\":\"list\"}"}}]})
    );
    assert_eq!(
        body["messages"][2],
        json!({"role": "tool", "content": "[]", "tool_call_id": "call_0"})
    );

    // A named function as tool_choice.
    let fake2 = self::fake(vec![ok(completion(json!("x")))], None).await;
    req.tool_choice = Some(ToolChoice::Function("read".into()));
    provider(&fake2, &config()).complete(&req).await.unwrap();
    assert_eq!(
        fake2.requests()[0].body["tool_choice"],
        json!({"type": "function", "function": {"name": "read"}})
    );
}

fn sse(events: &[Value]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

#[tokio::test]
async fn streamed_content_and_tool_call_fragments_are_assembled() {
    let events = sse(&[
        json!({"model": "m-stream", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me "}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": "check."}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_x", "type": "function", "function": {"name": "read", "arguments": ""}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"pa"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "call_y", "type": "function", "function": {"name": "grep", "arguments": "{\"pattern\":"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "th\":\"a.txt\"}"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": "\"fn main\"}"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9}}),
    ]) + ": keep-alive comment\n\n"
        + "data: [DONE]\n\n";
    // Cut the byte stream at awkward places (inside lines, inside "data:", CRLF-free).
    let bytes = events.as_bytes();
    let mut chunks = Vec::new();
    let mut at = 0;
    for size in [5usize, 17, 1, 64, 3, 200, 11].iter().cycle() {
        if at >= bytes.len() {
            break;
        }
        let end = (at + size).min(bytes.len());
        chunks.push(String::from_utf8(bytes[at..end].to_vec()).unwrap());
        at = end;
    }
    let fake = fake(
        vec![Answer::Sse {
            chunks,
            gap: Duration::from_millis(1),
            hang: false,
        }],
        None,
    )
    .await;
    let cfg = LlmConfig {
        stream: true,
        ..config()
    };
    let reply = provider(&fake, &cfg).complete(&hello()).await.unwrap();
    assert_eq!(reply.content, "Let me check.");
    assert_eq!(reply.model, "m-stream");
    assert_eq!(reply.finish_reason, "tool_calls");
    assert_eq!(
        (reply.usage.prompt_tokens, reply.usage.completion_tokens),
        (7, 9)
    );
    assert_eq!(
        reply.tool_calls,
        vec![
            ToolCall {
                id: "call_x".into(),
                name: "read".into(),
                arguments: "{\"path\":\"a.txt\"}".into()
            },
            ToolCall {
                id: "call_y".into(),
                name: "grep".into(),
                arguments: "{\"pattern\":\"fn main\"}".into()
            },
        ]
    );
    let seen = &fake.requests()[0];
    assert_eq!(seen.body["stream"], true);
    assert_eq!(seen.body["stream_options"], json!({"include_usage": true}));
    assert_eq!(seen.accept.as_deref(), Some("text/event-stream"));
}

#[tokio::test]
async fn a_stream_cut_before_done_is_retried() {
    let first = sse(&[json!({"choices": [{"index": 0, "delta": {"content": "partial"}}]})]);
    let whole = sse(&[
        json!({"choices": [{"index": 0, "delta": {"content": "whole"}, "finish_reason": "stop"}]}),
    ]) + "data: [DONE]\n\n";
    let fake = fake(
        vec![
            Answer::Sse {
                chunks: vec![first],
                gap: Duration::ZERO,
                hang: false,
            },
            Answer::Sse {
                chunks: vec![whole],
                gap: Duration::ZERO,
                hang: false,
            },
        ],
        None,
    )
    .await;
    let attempts = Attempts::default();
    let observer = attempts.observer();
    let reply = provider(
        &fake,
        &LlmConfig {
            stream: true,
            ..config()
        },
    )
    .complete_observed(&hello(), &observer)
    .await
    .unwrap();
    assert_eq!(reply.content, "whole");
    let a = attempts.all();
    assert_eq!(a.len(), 2);
    match &a[0].outcome {
        AttemptOutcome::Failed {
            failure,
            will_retry,
        } => {
            assert_eq!(failure.kind, FailureKind::Interrupted);
            assert!(*will_retry);
            assert!(failure.message.contains("[DONE]"), "{}", failure.message);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn retry_after_seconds_is_honoured() {
    let limited = Answer::Json {
        status: 429,
        body: json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}),
        headers: vec![("retry-after", "1".into())],
    };
    let fake = fake(vec![limited, ok(completion(json!("after the wait")))], None).await;
    let attempts = Attempts::default();
    let observer = attempts.observer();
    let started = Instant::now();
    let reply = provider(&fake, &config())
        .complete_observed(&hello(), &observer)
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(reply.content, "after the wait");
    let seen = fake.requests();
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    // Backoff alone would be at most 10 ms: the wait is the server's.
    assert!(
        gap >= Duration::from_millis(990),
        "second attempt after {gap:?}"
    );
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    let a = attempts.all();
    assert_eq!(a.len(), 2);
    assert_eq!(a[0].retry_in_ms, Some(1000));
    match &a[0].outcome {
        AttemptOutcome::Failed {
            failure,
            will_retry,
        } => {
            assert_eq!(
                (failure.kind, failure.status, *will_retry),
                (FailureKind::Http, Some(429), true)
            );
            assert!(
                failure.message.contains("Rate limit reached"),
                "{}",
                failure.message
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a[1].outcome, AttemptOutcome::Succeeded);
}

#[tokio::test]
async fn retry_after_http_date_is_honoured() {
    let at = std::time::SystemTime::now() + Duration::from_secs(2);
    let limited = Answer::Json {
        status: 503,
        body: json!({"error": {"message": "overloaded"}}),
        headers: vec![("retry-after", httpdate::fmt_http_date(at))],
    };
    let fake = fake(vec![limited, ok(completion(json!("ok")))], None).await;
    provider(&fake, &config()).complete(&hello()).await.unwrap();
    let seen = fake.requests();
    let gap = seen[1].at - seen[0].at;
    // The date has whole seconds, so the wait is between 1 and 2 s.
    assert!(
        gap >= Duration::from_millis(900) && gap < Duration::from_secs(4),
        "{gap:?}"
    );
}

#[tokio::test]
async fn five_server_errors_exhaust_the_five_attempts() {
    let fake = fake(
        vec![],
        Some(status(
            500,
            json!({"error": {"message": "upstream exploded"}}),
        )),
    )
    .await;
    let attempts = Attempts::default();
    let observer = attempts.observer();
    let e = provider(&fake, &config())
        .complete_observed(&hello(), &observer)
        .await
        .unwrap_err();
    let text = e.to_string();
    assert_eq!(fake.requests().len(), 5, "exactly 5 attempts");
    assert!(
        text.contains("failed 5 times in a row") && text.contains("5 of 5 attempts"),
        "{text}"
    );
    assert!(
        text.contains("HTTP 500") && text.contains("upstream exploded"),
        "{text}"
    );
    assert!(
        text.contains("test-model") && text.contains("/v1/chat/completions"),
        "{text}"
    );
    let e = llm_error(e);
    assert_eq!(
        (e.attempts, e.max_attempts, e.gave_up),
        (5, 5, GaveUp::Exhausted)
    );
    assert!(
        e.summary().contains("HTTP 500") && e.summary().contains("after 5 of 5 attempts"),
        "{}",
        e.summary()
    );
    assert!(
        e.retry_advice().contains("submit the task again"),
        "{}",
        e.retry_advice()
    );

    let a = attempts.all();
    assert_eq!(
        a.iter().map(|a| a.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    for (i, a) in a.iter().enumerate() {
        let last = i == 4;
        match &a.outcome {
            AttemptOutcome::Failed { will_retry, .. } => assert_eq!(*will_retry, !last),
            other => panic!("{other:?}"),
        }
        // Full jitter under the doubling ceiling (10, 20, 40, 40 ms).
        match a.retry_in_ms {
            Some(ms) => assert!(!last && ms <= 40, "{ms}"),
            None => assert!(last),
        }
    }
    // The event data the orchestrator records per attempt.
    let data = serde_json::to_value(&a[0]).unwrap();
    assert_eq!(data["outcome"], "failed");
    assert_eq!(data["status"], 500);
    assert_eq!(data["kind"], "http");
    assert_eq!(data["will_retry"], true);
}

#[tokio::test]
async fn a_request_may_lower_its_attempts() {
    let fake = fake(vec![], Some(status(502, json!({})))).await;
    let mut req = hello();
    req.max_attempts = Some(2);
    let e = llm_error(provider(&fake, &config()).complete(&req).await.unwrap_err());
    assert_eq!((e.attempts, e.max_attempts), (2, 2));
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn retryable_statuses_are_retried() {
    for code in [408u16, 409, 429, 502, 503, 504] {
        let fake = fake(
            vec![status(code, json!({"error": {"message": "busy"}}))],
            Some(ok(completion(json!("fine")))),
        )
        .await;
        let reply = provider(&fake, &config()).complete(&hello()).await.unwrap();
        assert_eq!(reply.content, "fine");
        assert_eq!(
            fake.requests().len(),
            2,
            "HTTP {code} is retried once, then succeeds"
        );
    }
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    for code in [400u16, 401, 403, 404, 422] {
        let fake = fake(
            vec![],
            Some(status(
                code,
                json!({"error": {"message": format!("bad thing {code}")}}),
            )),
        )
        .await;
        let e = provider(&fake, &config())
            .complete(&hello())
            .await
            .unwrap_err();
        assert_eq!(fake.requests().len(), 1, "HTTP {code} must not be retried");
        let text = e.to_string();
        assert!(
            text.contains("not retried") && text.contains(&format!("bad thing {code}")),
            "{text}"
        );
        let e = llm_error(e);
        assert_eq!(
            (e.attempts, e.gave_up, e.last.status),
            (1, GaveUp::NotRetryable, Some(code))
        );
        if code == 401 {
            assert!(
                text.contains("check the API key in $OPENAI_API_KEY"),
                "{text}"
            );
        }
        if code == 404 {
            assert!(text.contains("/v1"), "{text}");
        }
    }
}

#[tokio::test]
async fn quota_exhausted_429_is_not_retried_even_with_retry_after() {
    let quota = Answer::Json {
        status: 429,
        body: json!({"error": {"message": "You exceeded your current quota, please check your plan and billing details.", "type": "insufficient_quota", "code": "insufficient_quota"}}),
        headers: vec![("retry-after", "1".into())],
    };
    let fake = fake(vec![], Some(quota)).await;
    let started = Instant::now();
    let e = provider(&fake, &config())
        .complete(&hello())
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "no wait for a quota error"
    );
    assert_eq!(fake.requests().len(), 1);
    let text = e.to_string();
    assert!(
        text.contains("quota is exhausted") && text.contains("not retried"),
        "{text}"
    );
    let e = llm_error(e);
    assert_eq!(e.last.kind, FailureKind::QuotaExhausted);
    assert!(e.retry_advice().contains("quota"), "{}", e.retry_advice());
}

#[tokio::test]
async fn a_retry_after_longer_than_allowed_ends_the_request() {
    let limited = Answer::Json {
        status: 429,
        body: json!({}),
        headers: vec![("retry-after", "3600".into())],
    };
    let fake = fake(vec![], Some(limited)).await;
    let e = provider(&fake, &config())
        .complete(&hello())
        .await
        .unwrap_err();
    assert_eq!(fake.requests().len(), 1);
    assert!(
        e.to_string().contains("3600s") && e.to_string().contains("llm.max_retry_after_s"),
        "{e}"
    );
}

#[tokio::test]
async fn a_hanging_server_times_out_within_the_bound() {
    let fake = fake(vec![], Some(Answer::Hang)).await;
    let cfg = LlmConfig {
        request_timeout_ms: 300,
        max_attempts: 2,
        ..config()
    };
    let started = Instant::now();
    let e = provider(&fake, &cfg).complete(&hello()).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(600),
        "two attempts of 300 ms: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(2),
        "bounded by the timeouts: {elapsed:?}"
    );
    assert_eq!(fake.requests().len(), 2, "timeouts are retried");
    let text = e.to_string();
    assert!(
        text.contains("within 300 ms") && text.contains("llm.request_timeout_ms"),
        "{text}"
    );
    assert_eq!(llm_error(e).last.kind, FailureKind::Timeout);
}

#[tokio::test]
async fn a_silent_stream_hits_the_idle_timeout() {
    let first = sse(&[json!({"choices": [{"index": 0, "delta": {"content": "thinking"}}]})]);
    let fake = fake(
        vec![],
        Some(Answer::Sse {
            chunks: vec![first],
            gap: Duration::ZERO,
            hang: true,
        }),
    )
    .await;
    let cfg = LlmConfig {
        stream: true,
        idle_timeout_ms: 200,
        max_attempts: 1,
        ..config()
    };
    let started = Instant::now();
    let e = provider(&fake, &cfg).complete(&hello()).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        e.to_string()
            .contains("nothing for 200 ms (llm.idle_timeout_ms)"),
        "{e}"
    );
}

#[tokio::test]
async fn malformed_answers_are_clear_errors_and_not_retried() {
    let cases = [
        (
            Answer::Raw {
                status: 200,
                content_type: "application/json",
                body: "{\"choices\": [".into(),
            },
            "is not JSON",
        ),
        (
            Answer::Raw {
                status: 200,
                content_type: "text/html",
                body: "<html>proxy login</html>".into(),
            },
            "is not JSON",
        ),
        (ok(json!({"object": "list", "data": []})), "no choices[0]"),
        (ok(json!({"choices": [{"index": 0}]})), "no message object"),
        (
            ok(
                json!({"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}}]}),
            ),
            "no function name",
        ),
        (
            ok(json!({"error": {"message": "model overloaded"}})),
            "model overloaded",
        ),
    ];
    for (answer, expected) in cases {
        let fake = fake(vec![], Some(answer)).await;
        let e = provider(&fake, &config())
            .complete(&hello())
            .await
            .unwrap_err();
        assert_eq!(
            fake.requests().len(),
            1,
            "a malformed answer is not retried ({expected})"
        );
        assert!(e.to_string().contains(expected), "{e}");
        assert_eq!(llm_error(e).last.kind, FailureKind::Protocol);
    }
    // A malformed body with a 5xx status is a server error, and retried.
    let fake = fake(
        vec![Answer::Raw {
            status: 502,
            content_type: "text/html",
            body: "<h1>Bad Gateway</h1>".into(),
        }],
        Some(ok(completion(json!("ok")))),
    )
    .await;
    assert_eq!(
        provider(&fake, &config())
            .complete(&hello())
            .await
            .unwrap()
            .content,
        "ok"
    );
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn the_api_key_never_appears_in_errors() {
    // A server that echoes the Authorization header in its error message.
    let echo = status(
        401,
        json!({"error": {"message": format!("Incorrect API key provided: Bearer {KEY}. You can find your key at ...")}}),
    );
    let fake = fake(vec![], Some(echo)).await;
    let p = provider(&fake, &config());
    let e = p.complete(&hello()).await.unwrap_err();
    assert_eq!(
        fake.requests()[0].authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    for shown in [
        e.to_string(),
        format!("{e:?}"),
        format!("{p:?}"),
        serde_json::to_string(&llm_error(e.clone())).unwrap(),
    ] {
        assert!(
            !shown.contains(KEY) && !shown.contains("5ecret"),
            "key leaked: {shown}"
        );
    }
    assert!(e.to_string().contains("[redacted]"), "{e}");

    // Nor in connection errors.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let cfg = LlmConfig {
        max_attempts: 3,
        ..config()
    };
    let p = OpenAiProvider::new(&format!("http://{addr}/v1"), "m", &cfg)
        .unwrap()
        .with_api_key(Some(KEY.into()));
    let e = p.complete(&hello()).await.unwrap_err();
    assert!(!e.to_string().contains(KEY));
    let e = llm_error(e);
    assert_eq!(
        (e.attempts, e.last.kind),
        (3, FailureKind::Connect),
        "connection errors are retried"
    );

    // Without a key nothing is sent.
    let fake = self::fake(vec![ok(completion(json!("hi")))], None).await;
    provider(&fake, &config())
        .with_api_key(None)
        .complete(&hello())
        .await
        .unwrap();
    assert_eq!(fake.requests()[0].authorization, None);
}

#[tokio::test]
async fn providers_build_openai_from_the_llm_setting_with_the_key_configured_for_its_url() {
    let env = format!("CAIRN_TEST_OPENAI_KEY_{}", std::process::id());
    std::env::set_var(&env, KEY);
    let fake = fake(vec![ok(completion(json!("via spec")))], None).await;
    let named = cairn_agents::ProviderConfig {
        base_url: fake.base_url.clone(),
        api_key_env: env.clone(),
        ..Default::default()
    };
    let providers = Providers::new(LlmConfig {
        api_key_env: env.clone(),
        model: "default-model".into(),
        allow_request_llm_urls: true,
        providers: [("fake".to_owned(), named)].into(),
        ..config()
    });
    // No cassette is read here: the store is never dialled.
    let store = cairn_store_client::Store::connect("127.0.0.1:1").unwrap();
    // A bare URL works too; the model comes from llm.model when the spec names none.
    for spec in [
        format!("openai:{}#spec-model", fake.base_url),
        fake.base_url.clone(),
        "fake".to_owned(),
    ] {
        providers.get(&spec, &store, "p").await.unwrap();
    }
    let p = providers
        .get(&format!("openai:{}#spec-model", fake.base_url), &store, "p")
        .await
        .unwrap();
    assert_eq!(p.complete(&hello()).await.unwrap().content, "via spec");
    let seen = fake.requests();
    assert_eq!(seen[0].body["model"], "spec-model");
    // The key configured for this base URL.
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(!format!("{:?}", providers.openai(&fake.base_url, "").unwrap()).contains(KEY));

    let none = Providers::new(LlmConfig {
        allow_request_llm_urls: true,
        ..config()
    });
    let e = none
        .get(&fake.base_url, &store, "p")
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no model"), "{e}");
    std::env::remove_var(&env);
}

#[tokio::test]
async fn a_named_provider_sends_its_own_key_and_follows_no_redirect() {
    let env = format!("CAIRN_TEST_NAMED_KEY_{}", std::process::id());
    std::env::set_var(&env, KEY);
    let fake = fake(vec![ok(completion(json!("named")))], None).await;
    // A provider that answers with a redirect elsewhere: the request (and its key) must not
    // follow it.
    let elsewhere = self::fake(vec![], Some(ok(completion(json!("followed"))))).await;
    let redirect = Answer::Json {
        status: 307,
        body: json!({}),
        headers: vec![(
            "location",
            format!("{}/chat/completions", elsewhere.base_url),
        )],
    };
    let redirecting = self::fake(vec![], Some(redirect)).await;
    let table = |base_url: &str| cairn_agents::ProviderConfig {
        base_url: base_url.to_owned(),
        model: "m".into(),
        api_key_env: env.clone(),
        ..Default::default()
    };
    let providers = Providers::new(LlmConfig {
        providers: [
            ("fake".to_owned(), table(&fake.base_url)),
            ("redirecting".to_owned(), table(&redirecting.base_url)),
        ]
        .into(),
        ..config()
    });
    let store = cairn_store_client::Store::connect("127.0.0.1:1").unwrap();
    let named = providers.get("fake", &store, "p").await.unwrap();
    assert_eq!(named.complete(&hello()).await.unwrap().content, "named");
    assert_eq!(
        fake.requests()[0].authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    let redirected = providers.get("redirecting", &store, "p").await.unwrap();
    assert!(redirected.complete(&hello()).await.is_err());
    assert!(!redirecting.requests().is_empty());
    assert!(
        elsewhere.requests().is_empty(),
        "a redirect was followed: {:?}",
        elsewhere.requests()
    );
    std::env::remove_var(&env);
}

#[tokio::test]
async fn dropping_the_request_aborts_it() {
    let fake = fake(vec![], Some(Answer::Hang)).await;
    let p = provider(&fake, &config());
    let req = hello();
    let r = tokio::time::timeout(Duration::from_millis(300), p.complete(&req)).await;
    assert!(r.is_err(), "still waiting when dropped");
    assert_eq!(fake.requests().len(), 1);
    // The server sees the connection go away: its handler is dropped.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !fake.abandoned.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the request was not aborted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
