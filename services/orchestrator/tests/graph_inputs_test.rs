//! The files a graph names come with the submit (`files`) or from the run's project under
//! `graph_dir`, over real gRPC on loopback: what is sent is checked and bounded, what the graph
//! used is recorded under `.cairn/runs/<run>/inputs/`, a re-run needs none of it again, and
//! run records are no graph's input.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::{InputFile, SubmitRunRequest, TaskState};
use common::*;
use tonic::Code;

const GRAPH: &str = r#"
contracts:
  - {files: ["*.json"], schema_file: contracts/s.json}
nodes:
  - {id: p, type: plan, limits_file: l/limits.yaml}
  - {id: w, type: write_file, path: "docs/{{run_id}}/a.txt", content: a}
"#;

const SCHEMA: &str = r#"{"type": "object", "description": "the sent schema"}"#;
const LIMITS: &str = "tasks:\n  a: {daily_limit: 1}\n  b: {daily_limit: 1, prompt_file: b.md}\n";

fn file(path: &str, content: &str) -> InputFile {
    InputFile {
        path: path.into(),
        content: content.as_bytes().to_vec().into(),
    }
}

fn sent() -> Vec<InputFile> {
    vec![
        file("contracts/s.json", SCHEMA),
        file("l/limits.yaml", LIMITS),
        file("l/prompts/todoist-auto-a.md", "prompt of a"),
        file("l/b.md", "prompt of b"),
        file("unused.md", "not named by the graph"),
    ]
}

fn request(files: Vec<InputFile>) -> SubmitRunRequest {
    SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: GRAPH.into(),
        by: "tester".into(),
        files,
        ..Default::default()
    }
}

async fn stack() -> Stack {
    Stack::start(Options {
        ingest: false,
        ..Default::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_files_are_recorded_and_a_rerun_needs_none() {
    let s = stack().await;
    let run = s.submit_req(request(sent())).await.unwrap().run_id;
    let info = s.wait_final(&run, 60).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    let inputs = format!(".cairn/runs/{run}/inputs");
    assert_eq!(
        s.read_text(&format!("{inputs}/contracts/s.json")).await,
        SCHEMA
    );
    assert_eq!(
        s.read_text(&format!("{inputs}/l/b.md")).await,
        "prompt of b"
    );
    assert!(
        s.read(&format!("{inputs}/unused.md")).await.is_none(),
        "a file the graph does not name is not kept"
    );
    let created = s
        .events(&run)
        .await
        .into_iter()
        .find(|e| e.r#type == "task.created")
        .unwrap();
    assert_eq!(
        data(&created)["inputs"],
        serde_json::json!([
            "contracts/s.json",
            "l/b.md",
            "l/limits.yaml",
            "l/prompts/todoist-auto-a.md"
        ])
    );
    let resolved = s
        .read_text(&format!(".cairn/runs/{run}/graph.resolved.json"))
        .await;
    assert!(resolved.contains("prompt of a") && resolved.contains("the sent schema"));

    // A re-run starts from the frozen graph: nothing is sent or read again.
    let again = s
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            rerun_of: run.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id;
    let info = s.wait_final(&again, 60).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    let resolved = s
        .read_text(&format!(".cairn/runs/{again}/graph.resolved.json"))
        .await;
    assert!(resolved.contains("prompt of b"), "{resolved}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_files_are_checked_and_bounded() {
    let s = stack().await;
    let mut twice = sent();
    twice.push(file("l/b.md", "again"));
    let many: Vec<InputFile> = (0..257).map(|i| file(&format!("f{i}.md"), "x")).collect();
    let big: Vec<InputFile> = (0..9)
        .map(|i| InputFile {
            path: format!("big{i}.md"),
            content: vec![b'x'; 1 << 20].into(),
        })
        .collect();
    let cases: Vec<(Vec<InputFile>, &str)> = vec![
        (vec![file("../contracts/s.json", SCHEMA)], "`..`"),
        (vec![file("/etc/passwd", "x")], "absolute"),
        (twice, "sent twice"),
        (many, "at most 256 files"),
        (big, "at most 8 MiB"),
        (
            vec![InputFile {
                path: "contracts/s.json".into(),
                content: vec![0xff, 0xfe].into(),
            }],
            "not UTF-8",
        ),
    ];
    for (files, want) in cases {
        let e = s.submit_req(request(files)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{want}: {e:?}");
        assert!(e.message().contains(want), "{want}: {}", e.message());
    }
    // A file neither sent nor in the project: named, with where it was looked for.
    let mut missing = sent();
    missing.retain(|f| f.path != "l/b.md");
    let e = s.submit_req(request(missing)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("task `b`")
            && e.message().contains("`l/b.md` was not sent with the graph")
            && e.message().contains("cairn run"),
        "{}",
        e.message()
    );
    assert!(s.list(".cairn/runs").await.is_empty());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_graph_finds_its_files_beside_it_but_never_in_run_records() {
    let s = stack().await;
    for f in sent() {
        put_file(&s.store, &format!("graphs/{}", f.path), &f.content).await;
    }
    let mut req = request(Vec::new());
    req.graph_dir = "graphs".into();
    let run = s.submit_req(req).await.unwrap().run_id;
    let resolved = s
        .read_text(&format!(".cairn/runs/{run}/graph.resolved.json"))
        .await;
    assert!(resolved.contains("prompt of b"), "{resolved}");
    assert_eq!(
        s.read_text(&format!(".cairn/runs/{run}/inputs/l/b.md"))
            .await,
        "prompt of b"
    );
    s.wait_final(&run, 60).await;

    // Another run's records are not a graph's input, by graph_dir or by path.
    let mut req = request(Vec::new());
    req.graph_dir = format!(".cairn/runs/{run}/inputs");
    let e = s.submit_req(req).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("run records"), "{}", e.message());
    let graph = format!(
        "contracts:\n  - {{files: [\"*.json\"], schema_file: .cairn/runs/{run}/inputs/contracts/s.json}}\nnodes:\n  - {{id: w, type: write_file, path: \"docs/x.txt\", content: a}}\n"
    );
    let e = s
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: graph,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("schema_file") && e.message().contains("run records"),
        "{}",
        e.message()
    );
    s.stop().await;
}
