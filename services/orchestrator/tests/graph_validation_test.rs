//! A graph is checked completely at submit: errors are InvalidArgument naming node and field,
//! and nothing of the run is created.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::SubmitRunRequest;
use common::*;
use tonic::Code;

async fn refused(s: &Stack, yaml: &str) -> String {
    let e = s
        .submit(yaml, &[])
        .await
        .expect_err("the graph must be refused");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    e.message().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_graphs_are_refused_before_anything_is_written() {
    let s = Stack::start(Options::default()).await;
    let m = refused(&s, "nodes:\n  - {id: a, type: write_file, path: docs/a, content: x, needs: [b]}\n  - {id: b, type: write_file, path: docs/b, content: '{{nodes.a.path}}'}\n").await;
    assert!(
        m.contains("cycle") && m.contains("a -> b") || m.contains("b -> a"),
        "{m}"
    );

    let m = refused(
        &s,
        "nodes:\n  - {id: a, type: write_file, path: docs/a, content: x, needs: [ghost]}\n",
    )
    .await;
    assert!(
        m.contains("node `a` field `needs`") && m.contains("unknown node `ghost`"),
        "{m}"
    );

    let m = refused(&s, "nodes:\n  - {id: a, type: write_file, path: docs/a, content: x}\n  - {id: b, type: write_file, path: docs/b, content: '{{nodes.a.size}}'}\n").await;
    assert!(
        m.contains("node `b` field `content`") && m.contains("no output `size`"),
        "{m}"
    );

    let m = refused(
        &s,
        "nodes:\n  - {id: a, type: write_file, path: 'docs/{{vars.missing}}', content: x}\n",
    )
    .await;
    assert!(
        m.contains("node `a` field `path`") && m.contains("vars.missing"),
        "{m}"
    );

    let m = refused(
        &s,
        "nodes:\n  - {id: a, type: write_file, path: docs/a, content: '{{ nodes.a.path'}\n",
    )
    .await;
    assert!(m.contains("node `a`") && m.contains("unterminated"), "{m}");

    let m = refused(&s, "nodes:\n  - {id: s, type: sandbox_run, language: python, code: 'print(1)', code_file: docs/x.py}\n").await;
    assert!(
        m.contains("node `s` field `code_file`") && m.contains("both `code` and `code_file`"),
        "{m}"
    );

    let m = refused(&s, "nodes:\n  - {id: w, type: agent_task, prompt: hi}\n").await;
    assert!(m.contains("no LLM provider"), "{m}");

    let m = refused(
        &s,
        "nodes:\n  - {id: w, type: write_file, path: docs/a, content: x, colour: red}\n",
    )
    .await;
    assert!(m.contains("node `w`") && m.contains("colour"), "{m}");

    // A missing cassette is caught at submit, not at the first agent node.
    let e = s
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: "nodes:\n  - {id: w, type: agent_task, prompt: hi}\n".into(),
            llm: "replay:docs/nonexistent/cassette.yaml".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("docs/nonexistent/cassette.yaml"),
        "{}",
        e.message()
    );

    // No run directory was created by any of these.
    assert!(
        s.list(".cairn/runs").await.is_empty(),
        "{:?}",
        s.list(".cairn/runs").await
    );

    // Bad ids.
    let e = s
        .submit_req(SubmitRunRequest {
            project_id: "../x".into(),
            graph_yaml: "nodes: [{id: g, type: gate}]".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_ids_are_unique_and_resolved_graph_is_frozen() {
    let s = Stack::start(Options::default()).await;
    let req = SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: "title: frozen\nvars: {v: default}\nnodes:\n  - {id: a, type: write_file, path: 'docs/{{run_id}}/{{vars.v}}.txt', content: x}\n".into(),
        run_id: "fixed-id".into(),
        vars: [("v".to_owned(), "given".to_owned())].into(),
        ..Default::default()
    };
    let info = s.submit_req(req.clone()).await.unwrap();
    assert_eq!(info.run_id, "fixed-id");
    assert_eq!(info.run_dir, ".cairn/runs/fixed-id");
    let e = s.submit_req(req).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    let resolved: serde_json::Value = serde_json::from_slice(
        &s.read(".cairn/runs/fixed-id/graph.resolved.json")
            .await
            .unwrap(),
    )
    .unwrap();
    // Templates as written; run id and final variable values recorded once.
    assert_eq!(
        resolved["nodes"][0]["path"],
        "docs/{{run_id}}/{{vars.v}}.txt"
    );
    assert_eq!(resolved["vars"]["v"], "given");
    assert_eq!(resolved["run_id"], "fixed-id");
    s.wait_state("fixed-id", cairn_proto::v1::TaskState::Completed, 20)
        .await;
    assert!(s.read("docs/fixed-id/given.txt").await.is_some());
    s.stop().await;
}
