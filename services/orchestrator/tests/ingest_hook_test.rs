//! The ingest hook after nodes that write a document: on, off by the server flag,
//! off by the ingest service's own per-project flag, fail-open when ingest is down, and under
//! the orchestrator's claim on the run.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::ingest_client::IngestClient;
use cairn_proto::v1::{SetEnabledRequest, SubmitRunRequest, TaskState};
use common::*;
use serde_json::Value;

const GRAPH: &str = r#"
nodes:
  - id: author
    type: agent_task
    prompt: write the code
    path: "docs/{{run_id}}/design.md"
  - id: notes
    type: write_file
    path: "docs/{{run_id}}/notes.md"
    content: "```text file=notes/{{run_id}}.txt\nremember\n```\n"
"#;

const CASSETTE: &str = "answers:\n  - node: author\n    content: |\n      Here it is.\n\n      ```python file=hello/app.py\n      print('hi')\n      ```\n";

async fn run(s: &Stack) -> (String, cairn_proto::v1::RunInfo) {
    let llm = cassette(s.dir.path(), "c.yaml", CASSETTE);
    let req = SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: GRAPH.into(),
        llm,
        ..Default::default()
    };
    let run = s.submit_req(req).await.unwrap().run_id;
    let info = s.wait_state(&run, TaskState::Completed, 30).await;
    (run, info)
}

fn outputs(info: &cairn_proto::v1::RunInfo, id: &str) -> Value {
    serde_json::from_str(&info.nodes.iter().find(|n| n.id == id).unwrap().outputs_json).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_on_writes_workspace_files_and_manifests() {
    let s = Stack::start(Options::default()).await;
    let (run, info) = run(&s).await;
    assert_eq!(s.read_text("workspace/hello/app.py").await, "print('hi')\n");
    assert_eq!(
        s.read_text(&format!("workspace/notes/{run}.txt")).await,
        "remember\n"
    );
    assert_eq!(
        outputs(&info, "author")["workspace_files"],
        serde_json::json!(["workspace/hello/app.py"])
    );
    let manifest: Value = serde_json::from_slice(
        &s.read(&format!(".cairn/runs/{run}/ingest/author.json"))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["summary"]["written"], 1);
    assert_eq!(
        manifest["source"]["doc_path"],
        format!("docs/{run}/design.md")
    );
    let events = s.events(&run).await;
    assert!(
        events
            .iter()
            .any(|e| e.r#type.starts_with("ingest.") && e.node_id == "author"),
        "{:?}",
        s.event_types(&run).await
    );
    assert!(events
        .iter()
        .any(|e| e.r#type.starts_with("ingest.") && e.node_id == "notes"));
    // The hook ran before the node completed (its events precede node.completed).
    let pos = |t: &str, n: &str| {
        events
            .iter()
            .position(|e| e.r#type.starts_with(t) && e.node_id == n)
            .unwrap()
    };
    assert!(pos("ingest.", "author") < pos("node.completed", "author"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_off_by_server_flag() {
    let s = Stack::start(Options {
        tweak: |c| c.ingest_hook = false,
        ..Default::default()
    })
    .await;
    let (run, info) = run(&s).await;
    assert!(s.list("workspace").await.is_empty());
    assert!(s
        .events(&run)
        .await
        .iter()
        .all(|e| !e.r#type.starts_with("ingest.")));
    assert!(outputs(&info, "author").get("workspace_files").is_none());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_off_by_the_ingest_services_project_flag() {
    let s = Stack::start(Options::default()).await;
    let mut ingest = IngestClient::new(channel(&s.ingest_addr).await);
    ingest
        .set_enabled(SetEnabledRequest {
            project_id: PROJECT.into(),
            run_id: String::new(),
            enabled: false,
        })
        .await
        .unwrap();
    let (_, info) = run(&s).await;
    assert!(s.list("workspace").await.is_empty());
    assert_eq!(outputs(&info, "author")["ingest"]["enabled"], false);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_down_is_fail_open() {
    let s = Stack::start(Options {
        ingest: false,
        tweak: |c| {
            c.ingest_addr = "127.0.0.1:1".into();
            // Ingest stays down: given up after the outage budget (counted from the outage's
            // start, so the second hook does not wait again).
            c.dependency_outage_s = 1;
        },
        ..Default::default()
    })
    .await;
    let (run, info) = run(&s).await;
    let events = s.events(&run).await;
    let failed: Vec<_> = events
        .iter()
        .filter(|e| e.r#type == "ingest.hook_failed")
        .collect();
    assert_eq!(failed.len(), 2, "{:?}", s.event_types(&run).await);
    assert!(outputs(&info, "author")["ingest"]["error"]
        .as_str()
        .unwrap()
        .contains("failed"));
    s.stop().await;
}

/// With ingest down, `workspace_files` is an empty list (not missing), so a later node that
/// reads it still runs; the outage is a warning event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_down_leaves_an_empty_workspace_files_list() {
    let s = Stack::start(Options {
        ingest: false,
        tweak: |c| {
            c.ingest_addr = "127.0.0.1:1".into();
            c.dependency_outage_s = 1;
        },
        ..Default::default()
    })
    .await;
    let graph = format!(
        "{GRAPH}  - id: report\n    type: write_file\n    path: \"docs/{{{{run_id}}}}/report.md\"\n    content: \"files: {{{{nodes.author.workspace_files}}}}\"\n"
    );
    let llm = cassette(s.dir.path(), "c.yaml", CASSETTE);
    let run = s
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: graph,
            llm,
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id;
    let info = s.wait_final_or(&run, TaskState::Completed, 30).await;
    assert_eq!(
        info.state,
        TaskState::Completed as i32,
        "{:?}",
        s.event_types(&run).await
    );
    assert_eq!(
        outputs(&info, "author")["workspace_files"],
        serde_json::json!([])
    );
    let report = s.read_text(&format!("docs/{run}/report.md")).await;
    assert_eq!(report, "files: []");
    let warned = s
        .events(&run)
        .await
        .into_iter()
        .filter(|e| e.r#type == "ingest.hook_failed")
        .all(|e| e.level == cairn_proto::v1::Level::Warning as i32);
    assert!(warned);
    s.stop().await;
}

/// An ingest service that records what it is asked and answers with an empty manifest.
#[derive(Clone, Default)]
struct Recording(std::sync::Arc<std::sync::Mutex<Vec<cairn_proto::v1::IngestRequest>>>);

#[tonic::async_trait]
impl cairn_proto::v1::ingest_server::Ingest for Recording {
    async fn parse(
        &self,
        _: tonic::Request<cairn_proto::v1::IngestRequest>,
    ) -> Result<tonic::Response<cairn_proto::v1::IngestResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not used by the hook"))
    }
    async fn ingest(
        &self,
        r: tonic::Request<cairn_proto::v1::IngestRequest>,
    ) -> Result<tonic::Response<cairn_proto::v1::IngestResponse>, tonic::Status> {
        self.0.lock().unwrap().push(r.into_inner());
        Ok(tonic::Response::new(cairn_proto::v1::IngestResponse {
            enabled: true,
            ..Default::default()
        }))
    }
    async fn set_enabled(
        &self,
        _: tonic::Request<SetEnabledRequest>,
    ) -> Result<tonic::Response<cairn_proto::v1::SetEnabledResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not used by the hook"))
    }
    async fn get_enabled(
        &self,
        _: tonic::Request<cairn_proto::v1::GetEnabledRequest>,
    ) -> Result<tonic::Response<cairn_proto::v1::SetEnabledResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not used by the hook"))
    }
}

static RECORDING_ADDR: std::sync::OnceLock<String> = std::sync::OnceLock::new();

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hook_hands_the_runs_claim_to_ingest() {
    // Ingest writes under the orchestrator's claim on the run (IngestRequest.fence), so a hook
    // of an orchestrator that a successor fenced off lands nothing (services/ingest
    // claim_test covers that side).
    let recording = Recording::default();
    let mut host = cairn_server::Host::new();
    host.add(cairn_proto::v1::ingest_server::IngestServer::new(
        recording.clone(),
    ));
    RECORDING_ADDR.set(serve_host(host).await).unwrap();
    let s = Stack::start(Options {
        ingest: false,
        tweak: |c| c.ingest_addr = RECORDING_ADDR.get().unwrap().clone(),
        ..Default::default()
    })
    .await;
    let (run, _) = run(&s).await;
    let epoch: u64 = s
        .read_text(&format!(".cairn/runs/{run}/events.epoch"))
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(epoch > 0);
    let asked = recording.0.lock().unwrap().clone();
    let nodes: Vec<_> = asked.iter().map(|r| r.node_id.as_str()).collect();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    for r in &asked {
        assert_eq!(
            r.fence,
            Some(cairn_proto::v1::RunFence {
                run_id: run.clone(),
                epoch
            }),
            "node {}",
            r.node_id
        );
    }
    s.stop().await;
}
