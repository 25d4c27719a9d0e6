//! `deliver` nodes with OneBot targets through a graph run, against a fake OneBot v11 HTTP
//! API on 127.0.0.1: a group upload, a private chat whose implementation lacks the upload
//! action (fallback to a `file` message segment), receipts in the node outputs, and a total
//! failure that fails the node with the reason and the stored path.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use base64::Engine as _;
use cairn_orchestrator::Config;
use cairn_proto::v1::TaskState;
use common::{Options, Stack};
use serde_json::{json, Value};

const TOKEN_ENV: &str = "CAIRN_TEST_ONEBOT_GRAPH_TOKEN";
const TOKEN: &str = "graph-onebot-token";
/// The fake's address, for the config tweak (a plain fn).
static API_BASE: Mutex<String> = Mutex::new(String::new());

#[derive(Clone, Default)]
struct Fake {
    calls: Arc<Mutex<Vec<(String, Value)>>>,
}

/// group 111: uploads work; user 222: no upload action (404) but messages work; group 333:
/// everything fails.
async fn action(
    State(fake): State<Fake>,
    Path(action): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    fake.calls
        .lock()
        .unwrap()
        .push((action.clone(), body.clone()));
    let reply = |status: u16, v: Value| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(v.to_string()))
            .unwrap()
    };
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
    if auth != Some(&format!("Bearer {TOKEN}")) {
        return reply(401, json!({}));
    }
    let ok = json!({"status": "ok", "retcode": 0, "data": {}});
    match (
        action.as_str(),
        body["group_id"].as_i64(),
        body["user_id"].as_i64(),
    ) {
        ("upload_group_file", Some(111), _) => reply(200, ok),
        ("send_private_msg", _, Some(222)) => reply(200, ok),
        ("upload_group_file", Some(333), _) => reply(
            200,
            json!({"status": "failed", "retcode": 100, "message": "group file space is full", "wording": "group file space is full"}),
        ),
        _ => Response::builder().status(404).body(Body::empty()).unwrap(),
    }
}

async fn start_fake() -> (Fake, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = Fake::default();
    let app = Router::new()
        .route("/{action}", post(action))
        .with_state(fake.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (fake, format!("http://{addr}"))
}

fn onebot(c: &mut Config) {
    c.onebot.api_base = API_BASE.lock().unwrap().clone();
    c.onebot.access_token_env = TOKEN_ENV.into();
}

const GOOD: &str = r##"
version: 1
title: ship to chats
nodes:
  - id: report
    type: write_file
    path: "docs/{{run_id}}/report.md"
    content: "# Report\n\nAll green.\n"
    ingest: false
  - id: to_group
    type: deliver
    target: {type: group, id: 111}
    files: ["{{nodes.report.path}}"]
  - id: to_user
    type: deliver
    target: {type: private, id: "{{vars.user}}"}
    files: ["{{nodes.report.path}}"]
"##;

const BAD: &str = r##"
version: 1
title: ship to a full group
nodes:
  - id: report
    type: write_file
    path: "docs/{{run_id}}/report.md"
    content: "# Report\n"
    ingest: false
  - id: to_group
    type: deliver
    target: {type: group, id: 333}
    files: ["{{nodes.report.path}}"]
"##;

fn outputs(info: &cairn_proto::v1::RunInfo, id: &str) -> Value {
    let node = info.nodes.iter().find(|n| n.id == id).unwrap();
    serde_json::from_str(&node.outputs_json).unwrap_or(Value::Null)
}

#[tokio::test]
async fn deliver_nodes_upload_fall_back_and_fail_through_onebot() {
    std::env::set_var(TOKEN_ENV, TOKEN);
    let (fake, base) = start_fake().await;
    *API_BASE.lock().unwrap() = base;
    let stack = Stack::start(Options {
        ingest: false,
        tweak: onebot,
        ..Default::default()
    })
    .await;

    // A chat target is checked at submit time.
    let bad_target = GOOD.replace("{type: group, id: 111}", "{type: group, id: abc}");
    let e = stack
        .submit(&bad_target, &[("user", "222")])
        .await
        .unwrap_err();
    assert!(e.message().contains("not a group id"), "{}", e.message());

    let run = stack.submit(GOOD, &[("user", "222")]).await.unwrap().run_id;
    let info = stack.wait_final(&run, 30).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    let stored = format!("docs/{run}/report.md");

    let group = outputs(&info, "to_group");
    assert_eq!(group["target"], "group");
    assert_eq!(group["location"], "group:111");
    assert_eq!(group["delivered"], json!([stored]));
    assert_eq!(group["uploads"][0]["status"], "uploaded");
    assert_eq!(group["uploads"][0]["action"], "upload_group_file");
    assert_eq!(group["uploads"][0]["stored_path"], stored);

    let user = outputs(&info, "to_user");
    assert_eq!(user["location"], "private:222");
    assert_eq!(user["uploads"][0]["status"], "sent_as_message");
    assert_eq!(user["uploads"][0]["action"], "send_private_msg");

    let calls = fake.calls.lock().unwrap().clone();
    let (_, upload) = calls
        .iter()
        .find(|(a, _)| a == "upload_group_file")
        .unwrap();
    assert_eq!(upload["group_id"], 111);
    assert_eq!(upload["name"], "report.md");
    let data = upload["file"]
        .as_str()
        .unwrap()
        .strip_prefix("base64://")
        .unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap(),
        b"# Report\n\nAll green.\n"
    );
    assert!(calls
        .iter()
        .any(|(a, b)| a == "upload_private_file" && b["user_id"] == 222));
    let (_, msg) = calls.iter().find(|(a, _)| a == "send_private_msg").unwrap();
    assert_eq!(msg["message"][0]["type"], "file");

    let completed: Vec<Value> = stack
        .events(&run)
        .await
        .iter()
        .filter(|e| e.r#type == "deliver.completed")
        .map(common::data)
        .collect();
    assert_eq!(completed.len(), 2);
    assert!(completed
        .iter()
        .all(|d| d["uploads"][0]["status"].is_string()));

    // Total failure: the node fails with the implementation's reason and the stored path.
    let run = stack.submit(BAD, &[]).await.unwrap().run_id;
    let info = stack.wait_final(&run, 30).await;
    assert_eq!(info.state, TaskState::Failed as i32, "{info:#?}");
    let node = info.nodes.iter().find(|n| n.id == "to_group").unwrap();
    assert!(
        node.error.contains("group file space is full")
            && node.error.contains(&format!("docs/{run}/report.md"))
            && node.error.contains("group:333"),
        "{}",
        node.error
    );
    // Not a retryable kind: one upload call only.
    let uploads = fake
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(a, b)| a == "upload_group_file" && b["group_id"] == 333)
        .count();
    assert_eq!(uploads, 1);
    stack.stop().await;
}
