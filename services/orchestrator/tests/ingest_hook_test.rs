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
    // Ingest writes under an ingest claim bound to the orchestrator's claim on the run
    // (IngestRequest.claim), so a hook
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
    let asked = recording.0.lock().unwrap().clone();
    let nodes: Vec<_> = asked.iter().map(|r| r.node_id.as_str()).collect();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    let mut store = s.store.clone();
    for r in &asked {
        // An ingest claim the store made for this run: it verifies it, and binds it to the run.
        assert!(!r.claim.is_empty(), "node {}", r.node_id);
        let append = |run: &str| cairn_proto::v1::AppendEventsRequest {
            project_id: PROJECT.into(),
            run_id: run.into(),
            claim: r.claim.clone(),
            events: vec![cairn_proto::v1::EventInput {
                r#type: "ingest.checked".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        store.append_events(append(&run)).await.unwrap();
        let other = store.append_events(append("other-run")).await.unwrap_err();
        assert_eq!(
            cairn_proto::reason::of(&other).as_deref(),
            Some("claim_other_run"),
            "node {}",
            r.node_id
        );
    }
    s.stop().await;
}

/// A graph whose agent writes two workspace files (its cassette decides their content).
const UPDATE_GRAPH: &str = r#"
nodes:
  - id: author
    type: agent_task
    prompt: write the code
    path: "docs/{{run_id}}/design.md"
"#;

fn two_files(app: &str, util: &str) -> String {
    format!(
        "answers:\n  - node: author\n    content: |\n      Code.\n\n      ```python file=pkg/app.py\n      {app}\n      ```\n\n      ```python file=pkg/util.py\n      {util}\n      ```\n"
    )
}

async fn run_with(s: &Stack, name: &str, graph: &str, answers: &str) -> cairn_proto::v1::RunInfo {
    let llm = cassette(s.dir.path(), name, answers);
    let req = SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: graph.into(),
        llm,
        ..Default::default()
    };
    let run = s.submit_req(req).await.unwrap().run_id;
    s.wait_state(&run, TaskState::Completed, 30).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_run_updates_what_ingest_wrote_and_keeps_what_a_human_wrote_or_edited() {
    let s = Stack::start(Options::default()).await;
    // A file a human wrote before any ingest.
    put_file(&s.store, "workspace/pkg/notes.txt", b"mine\n").await;

    let first = run_with(&s, "c1.yaml", UPDATE_GRAPH, &two_files("v = 1", "u = 1")).await;
    assert_eq!(first.blocks_not_written, 0);
    assert_eq!(s.read_text("workspace/pkg/app.py").await, "v = 1\n");

    // A human edits one of the ingested files.
    put_file(&s.store, "workspace/pkg/util.py", b"u = 'edited'\n").await;

    let second = run_with(&s, "c2.yaml", UPDATE_GRAPH, &two_files("v = 2", "u = 2")).await;
    // What ingest wrote and nobody touched is updated; the human's edit is kept.
    assert_eq!(s.read_text("workspace/pkg/app.py").await, "v = 2\n");
    assert_eq!(s.read_text("workspace/pkg/util.py").await, "u = 'edited'\n");
    assert_eq!(s.read_text("workspace/pkg/notes.txt").await, "mine\n");
    // ... and the run says so: outputs, a warning event, RunInfo, README.
    assert_eq!(second.blocks_not_written, 1);
    let out = outputs(&second, "author");
    assert_eq!(
        out["workspace_files"],
        serde_json::json!(["workspace/pkg/app.py"])
    );
    assert_eq!(out["not_written"][0]["path"], "workspace/pkg/util.py");
    assert_eq!(out["not_written"][0]["reason"], "kept");
    assert_eq!(out["not_written"][0]["status"], "rejected");
    let events = s.events(&second.run_id).await;
    let warning = events
        .iter()
        .find(|e| e.r#type == "ingest.incomplete")
        .expect("an ingest.incomplete event");
    assert_eq!(warning.level, cairn_proto::v1::Level::Warning as i32);
    assert_eq!(data(warning)["rejected"], 1);
    let readme = s
        .wait_text(
            &format!(".cairn/runs/{}/README.md", second.run_id),
            "Not written",
            10,
        )
        .await;
    assert!(readme.contains("1 code block(s)"), "{readme}");

    // `ingest_overwrite: always` replaces even the human's edit.
    let always = UPDATE_GRAPH.replace(
        "    prompt: write the code\n",
        "    prompt: write the code\n    ingest_overwrite: always\n",
    );
    let third = run_with(&s, "c3.yaml", &always, &two_files("v = 3", "u = 3")).await;
    assert_eq!(third.blocks_not_written, 0);
    assert_eq!(s.read_text("workspace/pkg/util.py").await, "u = 3\n");

    // `never` replaces nothing, not even ingest's own files.
    let never = UPDATE_GRAPH.replace(
        "    prompt: write the code\n",
        "    prompt: write the code\n    ingest_overwrite: never\n",
    );
    let fourth = run_with(&s, "c4.yaml", &never, &two_files("v = 4", "u = 4")).await;
    assert_eq!(fourth.blocks_not_written, 2);
    assert_eq!(s.read_text("workspace/pkg/app.py").await, "v = 3\n");
    assert_eq!(
        outputs(&fourth, "author")["not_written"][0]["reason"],
        "exists"
    );
}
