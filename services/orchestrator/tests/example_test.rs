//! examples/hello runs with no LLM and no network: replayed agent, ingest into workspace/,
//! unit tests in the sandbox, a gate, a report in docs/.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "support/graph_files.rs"]
mod graph_files;

use cairn_proto::v1::{GateDecisionRequest, SubmitRunRequest, TaskState};
use common::*;
use graph_files::graph_files;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_example_runs_to_its_report() {
    let s = match Stack::try_start(Options {
        sandbox: Sandbox::Required,
        ..Default::default()
    })
    .await
    {
        Ok(s) => s,
        Err(e) => {
            println!(
                "SKIP: hello_example_runs_to_its_report: no sandbox backend can run here ({e})"
            );
            return;
        }
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello");
    let graph = std::fs::read_to_string(dir.join("graph.yaml")).unwrap();
    let req = SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: graph,
        files: graph_files(&dir).await,
        // What `cairn run` sends for the graph's local `replay:cassette.yaml`.
        llm: inline_cassette(&std::fs::read(dir.join("cassette.yaml")).unwrap()),
        by: "example".into(),
        ..Default::default()
    };
    let run = s.submit_req(req).await.unwrap().run_id;
    let blocked = s.wait_final_or(&run, TaskState::InputRequired, 120).await;
    assert_eq!(
        blocked.state,
        TaskState::InputRequired as i32,
        "{blocked:#?}\n{:#?}",
        s.event_types(&run).await
    );
    assert!(
        blocked.gates[0].reason.contains("exit code 0"),
        "{}",
        blocked.gates[0].reason
    );
    assert!(s
        .read_text("workspace/hello/greeter.py")
        .await
        .contains("def greet"));
    let test_report = s
        .read_text(&format!("docs/artifacts/{run}/test-report.txt"))
        .await;
    assert!(
        test_report.contains("Ran 2 tests") && test_report.contains("OK"),
        "{test_report}"
    );
    assert!(
        s.read(&format!("docs/hello/{run}/report.md"))
            .await
            .is_none(),
        "no report before approval"
    );

    s.client
        .clone()
        .approve_gate(GateDecisionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            gate_id: "approve".into(),
            by: "reader".into(),
            note: "tests look fine".into(),
        })
        .await
        .unwrap();
    s.wait_state(&run, TaskState::Completed, 60).await;
    let report = s.read_text(&format!("docs/hello/{run}/report.md")).await;
    assert!(
        report.starts_with("---\ntitle: \"Hello, cairn: report\""),
        "{report}"
    );
    assert!(
        report.contains("exit code 0")
            && report.contains("Approved by reader")
            && report.contains("tests look fine"),
        "{report}"
    );
    assert!(
        report.contains("workspace/hello/test_greeter.py") && report.contains("Ran 2 tests"),
        "{report}"
    );
    let design = s.read_text(&format!("docs/hello/{run}/design.md")).await;
    assert!(design.starts_with("---\n") && design.contains("```python file=hello/greeter.py"));
    s.stop().await;
}
