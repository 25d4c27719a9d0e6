//! OneBot v11 delivery against a fake OneBot HTTP API (axum on 127.0.0.1:0): group and
//! private uploads, the fallback to a `file` message segment, total failure keeping the
//! stored path, the access token, and the failure notice after an LLM
//! request used its 5 attempts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use base64::Engine as _;
use cairn_agents::{AgentError, AgentRequest, LlmConfig, Message, OpenAiProvider, Provider, Role};
use cairn_delivery::onebot::{
    notify_failure, Chat, FileRef, OneBotConfig, OneBotTarget, OutgoingFile, UploadStatus,
};
use cairn_delivery::{DeliveryCtx, DeliveryTarget};
use cairn_store_client::{PutOptions, Store};
use serde_json::{json, Value};

const TOKEN: &str = "onebot-t0ken-XYZ";

/// How the fake answers an action.
#[derive(Clone, Debug)]
enum Behaviour {
    Ok,
    /// HTTP 404 (the usual "no such action").
    NotFound,
    /// 200 with retcode 1404.
    Retcode1404,
    /// 200, status failed, with this message.
    Failed(&'static str),
}

#[derive(Clone, Debug)]
struct Call {
    action: String,
    authorization: Option<String>,
    idempotency_key: Option<String>,
    body: Value,
    /// For `shared_dir` references: the spooled file's bytes at call time (mapped back to
    /// our side of the mount).
    spooled: Option<Vec<u8>>,
}

#[derive(Clone)]
struct Fake {
    behaviours: Arc<HashMap<&'static str, Behaviour>>,
    calls: Arc<Mutex<Vec<Call>>>,
    /// `seen_as` prefix -> local directory.
    mount: Option<(String, PathBuf)>,
    api_base: String,
}

impl Fake {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

async fn action(
    State(fake): State<Fake>,
    Path(action): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let authorization = headers
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_owned());
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let spooled = match (&fake.mount, body.get("file").and_then(Value::as_str)) {
        (Some((prefix, local)), Some(file)) if file.starts_with(prefix.as_str()) => {
            std::fs::read(local.join(file[prefix.len()..].trim_start_matches('/'))).ok()
        }
        _ => None,
    };
    fake.calls.lock().unwrap().push(Call {
        action: action.clone(),
        authorization: authorization.clone(),
        idempotency_key: headers
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap().to_owned()),
        body,
        spooled,
    });
    let json = |status: u16, v: Value| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(v.to_string()))
            .unwrap()
    };
    // Like go-cqhttp / NapCat: 401 without a token, 403 with a wrong one.
    match authorization.as_deref() {
        None => return json(401, json!({})),
        Some(a) if a != format!("Bearer {TOKEN}") => return json(403, json!({})),
        _ => {}
    }
    match fake
        .behaviours
        .get(action.as_str())
        .cloned()
        .unwrap_or(Behaviour::NotFound)
    {
        Behaviour::Ok => json(
            200,
            json!({"status": "ok", "retcode": 0, "data": {"message_id": 7}}),
        ),
        Behaviour::NotFound => Response::builder().status(404).body(Body::empty()).unwrap(),
        Behaviour::Retcode1404 => json(
            200,
            json!({"status": "failed", "retcode": 1404, "msg": "API不存在", "wording": "API not found"}),
        ),
        Behaviour::Failed(m) => json(
            200,
            json!({"status": "failed", "retcode": 100, "message": m, "wording": m}),
        ),
    }
}

async fn fake(behaviours: &[(&'static str, Behaviour)], mount: Option<(String, PathBuf)>) -> Fake {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = Fake {
        behaviours: Arc::new(behaviours.iter().cloned().collect()),
        calls: Arc::new(Mutex::new(Vec::new())),
        mount,
        api_base: format!("http://{addr}"),
    };
    let app = Router::new()
        .route("/{action}", post(action))
        .with_state(fake.clone());
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    fake
}

fn config(fake: &Fake) -> OneBotConfig {
    OneBotConfig {
        api_base: fake.api_base.clone(),
        ..OneBotConfig::default()
    }
}

fn target(fake: &Fake, chat: Chat) -> OneBotTarget {
    OneBotTarget::new(&config(fake), chat)
        .unwrap()
        .with_access_token(Some(TOKEN.into()))
}

const ARCHIVE: &[u8] = b"PK\x03\x04 pretend this is a zip";
const STORED: &str = "docs/artifacts/run-1/app.zip";

fn archive() -> OutgoingFile<'static> {
    OutgoingFile {
        name: "app.zip",
        bytes: ARCHIVE,
        project: "proj",
        stored_path: STORED,
        run_id: "run-1",
        step_key: "run-1/ship/2",
    }
}

fn decode(file: &str) -> Vec<u8> {
    let data = file
        .strip_prefix("base64://")
        .expect("a base64:// reference");
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap()
}

#[tokio::test]
async fn group_upload_sends_the_file_with_the_token() {
    let fake = fake(&[("upload_group_file", Behaviour::Ok)], None).await;
    let receipt = target(&fake, Chat::Group(123456))
        .send_file(&archive())
        .await;
    assert_eq!(receipt.status, UploadStatus::Uploaded, "{receipt:?}");
    assert_eq!(receipt.action, "upload_group_file");
    assert_eq!(receipt.chat, "group:123456");
    assert_eq!(receipt.stored_path, STORED);
    assert_eq!(receipt.error, None);
    let calls = fake.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].action, "upload_group_file");
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(calls[0].body["group_id"], 123456);
    assert_eq!(calls[0].body["name"], "app.zip");
    assert_eq!(decode(calls[0].body["file"].as_str().unwrap()), ARCHIVE);
}

#[tokio::test]
async fn private_upload_through_a_shared_directory() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake(
        &[("upload_private_file", Behaviour::Ok)],
        Some(("/mnt/cairn-share".into(), dir.path().to_owned())),
    )
    .await;
    let cfg = OneBotConfig {
        file_ref: FileRef::SharedDir,
        shared_dir: dir.path().display().to_string(),
        shared_dir_seen_as: "/mnt/cairn-share".into(),
        ..config(&fake)
    };
    let t = OneBotTarget::new(&cfg, Chat::Private(10001))
        .unwrap()
        .with_access_token(Some(TOKEN.into()));
    let receipt = t.send_file(&archive()).await;
    assert_eq!(receipt.status, UploadStatus::Uploaded, "{receipt:?}");
    assert_eq!(receipt.action, "upload_private_file");
    let calls = fake.calls();
    assert_eq!(calls[0].body["user_id"], 10001);
    assert_eq!(calls[0].body["file"], "/mnt/cairn-share/run-1/app.zip");
    assert_eq!(calls[0].body["name"], "app.zip");
    assert_eq!(
        calls[0].spooled.as_deref(),
        Some(ARCHIVE),
        "the file was in the shared directory when OneBot read it"
    );
    assert!(
        !dir.path().join("run-1/app.zip").exists(),
        "the spooled copy is removed after the call"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("run-1")).unwrap().count(),
        0,
        "no temporary files left"
    );
}

#[tokio::test]
async fn store_references_name_the_stored_file() {
    let fake = fake(&[("upload_group_file", Behaviour::Ok)], None).await;
    let cfg = OneBotConfig {
        file_ref: FileRef::Store,
        store_root: "/srv/cairn/".into(),
        ..config(&fake)
    };
    let t = OneBotTarget::new(&cfg, Chat::Group(5))
        .unwrap()
        .with_access_token(Some(TOKEN.into()));
    assert_eq!(t.send_file(&archive()).await.status, UploadStatus::Uploaded);
    assert_eq!(
        fake.calls()[0].body["file"],
        format!("/srv/cairn/projects/proj/{STORED}")
    );
}

#[tokio::test]
async fn a_large_file_needs_a_shared_directory_in_auto_mode() {
    let fake = fake(&[("upload_group_file", Behaviour::Ok)], None).await;
    let cfg = OneBotConfig {
        base64_max_mb: 0,
        ..config(&fake)
    };
    let t = OneBotTarget::new(&cfg, Chat::Group(5))
        .unwrap()
        .with_access_token(Some(TOKEN.into()));
    let receipt = t.send_file(&archive()).await;
    assert_eq!(receipt.status, UploadStatus::Failed);
    let error = receipt.error.unwrap();
    assert!(
        error.contains("onebot.base64_max_mb")
            && error.contains("onebot.shared_dir")
            && error.contains(STORED),
        "{error}"
    );
    assert!(fake.calls().is_empty(), "nothing sent");
}

#[tokio::test]
async fn an_unsupported_upload_falls_back_to_a_file_segment() {
    // HTTP 404 for the group upload.
    let fake1 = fake(&[("send_group_msg", Behaviour::Ok)], None).await;
    let receipt = target(&fake1, Chat::Group(42)).send_file(&archive()).await;
    assert_eq!(receipt.status, UploadStatus::SentAsMessage, "{receipt:?}");
    assert_eq!(receipt.action, "send_group_msg");
    let calls = fake1.calls();
    assert_eq!(
        calls.iter().map(|c| c.action.as_str()).collect::<Vec<_>>(),
        vec!["upload_group_file", "send_group_msg"]
    );
    assert_eq!(calls[1].body["group_id"], 42);
    // Each effect its own key, the same for every attempt at it (the step key stays the same
    // when the step is delivered again after a failover).
    assert_eq!(
        calls[0].idempotency_key.as_deref(),
        Some("run-1/ship/2/docs/artifacts/run-1/app.zip#upload_group_file")
    );
    assert_eq!(
        calls[1].idempotency_key.as_deref(),
        Some("run-1/ship/2/docs/artifacts/run-1/app.zip#send_group_msg")
    );
    let segment = &calls[1].body["message"][0];
    assert_eq!(segment["type"], "file");
    assert_eq!(segment["data"]["name"], "app.zip");
    assert_eq!(decode(segment["data"]["file"].as_str().unwrap()), ARCHIVE);

    // retcode 1404 for the private upload; and "unsupported" wording.
    for behaviour in [
        Behaviour::Retcode1404,
        Behaviour::Failed("action upload_private_file is unsupported"),
    ] {
        let fake2 = fake(
            &[
                ("upload_private_file", behaviour),
                ("send_private_msg", Behaviour::Ok),
            ],
            None,
        )
        .await;
        let receipt = target(&fake2, Chat::Private(7)).send_file(&archive()).await;
        assert_eq!(receipt.status, UploadStatus::SentAsMessage, "{receipt:?}");
        let calls = fake2.calls();
        assert_eq!(calls[1].action, "send_private_msg");
        assert_eq!(calls[1].body["user_id"], 7);
        assert_eq!(calls[1].body["message"][0]["type"], "file");
    }
}

#[tokio::test]
async fn an_upload_that_fails_for_another_reason_does_not_fall_back() {
    let fake = fake(
        &[
            (
                "upload_group_file",
                Behaviour::Failed("group file space is full"),
            ),
            ("send_group_msg", Behaviour::Ok),
        ],
        None,
    )
    .await;
    let receipt = target(&fake, Chat::Group(42)).send_file(&archive()).await;
    assert_eq!(receipt.status, UploadStatus::Failed);
    assert_eq!(fake.calls().len(), 1);
    let error = receipt.error.unwrap();
    assert!(
        error.contains("group file space is full") && error.contains(STORED),
        "{error}"
    );
}

#[tokio::test]
async fn total_failure_is_a_clear_error_that_keeps_the_stored_path() {
    let fake = fake(
        &[(
            "send_group_msg",
            Behaviour::Failed("file segment not allowed here"),
        )],
        None,
    )
    .await;
    let receipt = target(&fake, Chat::Group(42)).send_file(&archive()).await;
    assert_eq!(receipt.status, UploadStatus::Failed);
    assert_eq!(receipt.stored_path, STORED);
    assert_eq!(fake.calls().len(), 2, "upload, then the fallback");
    let error = receipt.error.clone().unwrap();
    for part in [
        "upload_group_file",
        "not supported",
        "send_group_msg",
        "file segment not allowed here",
        STORED,
        "manual delivery",
    ] {
        assert!(error.contains(part), "`{part}` missing from: {error}");
    }
    // The receipt serialises with its status for the `end` tool's answer.
    let v = serde_json::to_value(&receipt).unwrap();
    assert_eq!(v["status"], "failed");
    assert_eq!(v["stored_path"], STORED);
}

#[tokio::test]
async fn the_access_token_is_checked_and_never_shown() {
    let fake = fake(&[("upload_group_file", Behaviour::Ok)], None).await;
    // Wrong token: 403, no fallback, the message says what to check.
    let wrong = OneBotTarget::new(&config(&fake), Chat::Group(1))
        .unwrap()
        .with_access_token(Some("wrong-token-123".into()));
    let receipt = wrong.send_file(&archive()).await;
    assert_eq!(receipt.status, UploadStatus::Failed);
    let error = receipt.error.unwrap();
    assert!(
        error.contains("HTTP 403") && error.contains("$ONEBOT_ACCESS_TOKEN"),
        "{error}"
    );
    assert!(!error.contains("wrong-token-123"));
    assert_eq!(
        fake.calls().last().unwrap().authorization.as_deref(),
        Some("Bearer wrong-token-123")
    );
    // No token: 401.
    let none = OneBotTarget::new(&config(&fake), Chat::Group(1))
        .unwrap()
        .with_access_token(None);
    let error = none.send_file(&archive()).await.error.unwrap();
    assert!(
        error.contains("HTTP 401") && error.contains("access token"),
        "{error}"
    );
    assert_eq!(fake.calls().last().unwrap().authorization, None);
    // The right one passes; Debug output never shows it.
    let right = target(&fake, Chat::Group(1));
    assert_eq!(
        right.send_file(&archive()).await.status,
        UploadStatus::Uploaded
    );
    assert!(!format!("{right:?}").contains(TOKEN));
}

#[tokio::test]
async fn the_token_comes_from_the_configured_environment_variable() {
    let env = format!("CAIRN_TEST_ONEBOT_TOKEN_{}", std::process::id());
    std::env::set_var(&env, TOKEN);
    let fake = fake(&[("upload_group_file", Behaviour::Ok)], None).await;
    let cfg = OneBotConfig {
        access_token_env: env.clone(),
        ..config(&fake)
    };
    let t = OneBotTarget::new(&cfg, Chat::Group(9)).unwrap();
    assert_eq!(t.send_file(&archive()).await.status, UploadStatus::Uploaded);
    assert_eq!(
        fake.calls()[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    std::env::remove_var(&env);
}

#[tokio::test]
async fn the_failure_notice_names_task_stage_error_and_advice() {
    let fake = fake(
        &[
            ("send_group_msg", Behaviour::Ok),
            ("send_private_msg", Behaviour::Ok),
        ],
        None,
    )
    .await;
    notify_failure(
        &target(&fake, Chat::Group(88)),
        "task-42",
        "tool loop, turn 3",
        "HTTP 500: upstream exploded (after 5 of 5 attempts)",
        "wait a few minutes and submit the task again",
    )
    .await
    .unwrap();
    notify_failure(
        &target(&fake, Chat::Private(99)),
        "task-43",
        "planning",
        "timeout",
        "raise llm.request_timeout_ms",
    )
    .await
    .unwrap();
    let calls = fake.calls();
    assert_eq!(calls[0].action, "send_group_msg");
    assert_eq!(calls[0].body["group_id"], 88);
    let segment = &calls[0].body["message"][0];
    assert_eq!(
        segment["type"], "text",
        "sent as a text segment, never parsed as CQ code"
    );
    let text = segment["data"]["text"].as_str().unwrap();
    for part in [
        "task-42",
        "tool loop, turn 3",
        "HTTP 500: upstream exploded (after 5 of 5 attempts)",
        "wait a few minutes and submit the task again",
    ] {
        assert!(text.contains(part), "`{part}` missing from: {text}");
    }
    assert_eq!(calls[1].action, "send_private_msg");
    assert_eq!(calls[1].body["user_id"], 99);
    assert!(calls[1].body["message"][0]["data"]["text"]
        .as_str()
        .unwrap()
        .contains("task-43"));

    // A notice that cannot be sent is an error, not silence.
    let down = self::fake(&[], None).await;
    let e = notify_failure(&target(&down, Chat::Group(1)), "t", "s", "e", "r")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("send_group_msg"), "{e}");
}

/// Seed 003 §7.4 end to end: one LLM request fails 5 times, then the notice goes out with
/// the provider's own summary and advice.
#[tokio::test]
async fn five_failed_llm_attempts_lead_to_a_notice() {
    let llm = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(Mutex::new(0u32));
        let h = hits.clone();
        let app = Router::new().route(
            "/v1/chat/completions",
            post(move || {
                let h = h.clone();
                async move {
                    *h.lock().unwrap() += 1;
                    Response::builder()
                        .status(503)
                        .body(Body::from("{\"error\":{\"message\":\"no capacity\"}}"))
                        .unwrap()
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}/v1"), hits)
    };
    let cfg = LlmConfig {
        initial_backoff_ms: 5,
        max_backoff_ms: 20,
        ..LlmConfig::default()
    };
    let provider = OpenAiProvider::new(&llm.0, "m", &cfg).unwrap();
    let request = AgentRequest {
        run_id: "run-7".into(),
        node_id: "deliver".into(),
        agent: "code_delivery".into(),
        instance: "deliver".into(),
        turn: 1,
        messages: vec![Message::new(Role::User, "build it")],
        tools: vec![],
        tool_choice: None,
        max_attempts: Some(5),
    };
    let e = match provider.complete(&request).await {
        Err(AgentError::Llm(e)) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(*llm.1.lock().unwrap(), 5);

    let fake = fake(&[("send_group_msg", Behaviour::Ok)], None).await;
    notify_failure(
        &target(&fake, Chat::Group(5)),
        "run-7",
        "llm request",
        &e.summary(),
        &e.retry_advice(),
    )
    .await
    .unwrap();
    let calls = fake.calls();
    let text = calls[0].body["message"][0]["data"]["text"]
        .as_str()
        .unwrap();
    assert!(
        text.contains("run-7")
            && text.contains("no capacity")
            && text.contains("after 5 of 5 attempts"),
        "{text}"
    );
    assert!(text.contains("submit the task again"), "{text}");
}

/// The `DeliveryTarget` side: files come from the artifact-store; a failure names the
/// stored path.
#[tokio::test]
async fn deliver_reads_from_the_store_and_reports_the_stored_path_on_failure() {
    let dir = tempfile::tempdir().unwrap();
    let store_svc = cairn_artifact_store::artifact_store_service(
        cairn_artifact_store::Config::new(dir.path().join("data")),
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut host = cairn_server::Host::new();
        host.add(store_svc);
        let _ = host.serve(listener, std::future::pending()).await;
    });
    let store = Store::connect(&addr).unwrap();
    store.create_project("proj").await.unwrap();
    store
        .put(
            "proj",
            STORED,
            Bytes::from_static(ARCHIVE),
            &PutOptions::default(),
        )
        .await
        .unwrap();
    let ctx = DeliveryCtx {
        store: &store,
        project: "proj",
        run_id: "run-1",
        overwrite: false,
        step_key: "",
    };
    let files = vec![STORED.to_owned()];

    let good = fake(&[("upload_group_file", Behaviour::Ok)], None).await;
    let t = target(&good, Chat::Group(321));
    assert_eq!(t.kind(), "group");
    let receipt = t.deliver(&ctx, &files).await.unwrap();
    assert_eq!(receipt.target, "group");
    assert_eq!(receipt.location, "group:321");
    assert_eq!(receipt.delivered, files);
    assert_eq!(
        decode(good.calls()[0].body["file"].as_str().unwrap()),
        ARCHIVE
    );
    assert_eq!(good.calls()[0].idempotency_key, None, "no step, no key");

    let bad = fake(&[], None).await;
    let e = target(&bad, Chat::Private(5))
        .deliver(&ctx, &files)
        .await
        .unwrap_err();
    assert!(
        e.message.contains(STORED)
            && e.message.contains("send_private_msg")
            && e.message.contains("private:5"),
        "{}",
        e.message
    );

    let missing = vec!["docs/artifacts/run-1/nope.zip".to_owned()];
    let e = target(&good, Chat::Group(321))
        .deliver(&ctx, &missing)
        .await
        .unwrap_err();
    assert!(e.message.contains("does not exist"), "{}", e.message);
}

#[test]
fn config_and_targets_are_checked() {
    assert!(OneBotTarget::new(&OneBotConfig::default(), Chat::Group(1))
        .unwrap_err()
        .to_string()
        .contains("onebot.api_base"));
    let bad = OneBotConfig {
        api_base: "ftp://x".into(),
        ..OneBotConfig::default()
    };
    assert!(bad.check().unwrap_err().contains("http"));
    let shared = OneBotConfig {
        api_base: "http://x".into(),
        file_ref: FileRef::SharedDir,
        ..OneBotConfig::default()
    };
    assert!(shared.check().unwrap_err().contains("onebot.shared_dir"));
    assert_eq!(Chat::new("group", 5), Ok(Chat::Group(5)));
    assert!(Chat::new("channel", 5).is_err());
    assert!(Chat::new("private", -1).is_err());
    let text = toml::to_string(&OneBotConfig::default()).unwrap();
    assert!(text.contains("file_ref = \"auto\""), "{text}");
    assert_eq!(
        toml::from_str::<OneBotConfig>(&text).unwrap(),
        OneBotConfig::default()
    );
}
