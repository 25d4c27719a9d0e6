//! Run records belong to their run: no node kind writes under `.cairn/` (its own run's or
//! another's), whether the path is a literal (refused at submit) or comes out of a template
//! (refused when the node runs); nodes read only their own run's records; a gated run whose
//! records another run tried to rewrite still waits for its approver after a restart.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{GateDecisionRequest, NodeState, SubmitRunRequest, TaskState};
use common::*;
use tonic::Code;

const GATED: &str = r#"
nodes:
  - {id: draft, type: write_file, path: "docs/{{run_id}}/draft.txt", content: draft}
  - {id: review, type: gate, reason: "check the draft", needs: [draft]}
  - {id: publish, type: write_file, path: "docs/{{run_id}}/published.txt", content: "ok by {{nodes.review.by}}", needs: [review]}
"#;

/// A graph that replaced the gated run's: the same nodes without the gate.
const GATELESS: &str = r#"{"version":1,"nodes":[]}"#;

async fn gated_run(s: &Stack) -> String {
    let run = s.submit(GATED, &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::InputRequired, 20).await;
    run
}

/// A graph whose node `n` (YAML flow mapping) names `{{nodes.v.value}}`: the value of
/// `vars.target`, known only when the node runs (vars alone are filled in at submit).
fn at_run_time(node: &str) -> String {
    format!(
        "nodes:\n  - {{id: v, type: tool_call, tool: echo, args: {{value: \"{{{{vars.target}}}}\"}}}}\n  - {node}\n"
    )
}

/// Runs a graph expected to fail on one of its nodes; returns that node's error.
async fn failed_node(s: &Stack, yaml: &str, vars: &[(&str, &str)]) -> String {
    let run = s.submit(yaml, vars).await.unwrap().run_id;
    let info = s.wait_final(&run, 30).await;
    assert_eq!(
        info.state,
        TaskState::Failed as i32,
        "the run must fail: {info:#?}"
    );
    let node = info
        .nodes
        .iter()
        .find(|n| n.state == NodeState::Failed as i32)
        .unwrap_or_else(|| panic!("no failed node: {info:#?}"));
    node.error.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn literal_paths_under_records_are_refused_at_submit() {
    let s = Stack::start(Options::default()).await;
    for (what, yaml) in [
        (
            "write_file to another run's task.yaml",
            r#"nodes: [{id: w, type: write_file, path: ".cairn/runs/other/task.yaml", content: x}]"#,
        ),
        (
            "write_file to its own run's graph",
            r#"nodes: [{id: w, type: write_file, path: ".cairn/runs/{{run_id}}/graph.resolved.json", content: x}]"#,
        ),
        (
            "write_file to the project record",
            r#"nodes: [{id: w, type: write_file, path: ".cairn/project.json", content: x}]"#,
        ),
        (
            "write_file in another spelling",
            r#"nodes: [{id: w, type: write_file, path: ".Cairn/runs/other/task.yaml", content: x}]"#,
        ),
        (
            "agent_task document",
            r#"nodes: [{id: a, type: agent_task, prompt: hi, path: ".cairn/runs/other/shared/human-notes.md"}]"#,
        ),
        (
            "sandbox output prefix",
            r#"nodes: [{id: s, type: sandbox_run, language: python, code: "print(1)", output_prefix: ".cairn/runs/{{run_id}}/out", allowed_prefixes: [".cairn/"]}]"#,
        ),
        (
            "delivery directory",
            r#"nodes: [{id: d, type: deliver, files: [docs/a.md], target: {type: local_dir, path: ".cairn/runs/other"}}]"#,
        ),
    ] {
        let e = s.submit(yaml, &[]).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e:?}");
        assert!(
            e.message().contains(".cairn/") && e.message().contains("only the run's driver"),
            "{what}: {}",
            e.message()
        );
    }
    // A variable is filled in at submit: refused there too.
    let e = s
        .submit(
            r#"nodes: [{id: w, type: write_file, path: "{{vars.p}}", content: x}]"#,
            &[("p", ".cairn/runs/other/shared/human-notes.md")],
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(s.list(".cairn/runs/other/").await.is_empty());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_file_through_a_template_never_rewrites_another_runs_records() {
    let s = Stack::start(Options::default()).await;
    let victim = gated_run(&s).await;
    let dir = format!(".cairn/runs/{victim}");
    let graph_before = s.read(&format!("{dir}/graph.resolved.json")).await.unwrap();
    // Give the victim a note, so its human-notes.md exists and must stay as it is.
    s.client
        .clone()
        .add_note(cairn_proto::v1::AddNoteRequest {
            project_id: PROJECT.into(),
            run_id: victim.clone(),
            by: "ann".into(),
            text: "keep the tone".into(),
        })
        .await
        .unwrap();
    let notes_before = s
        .read(&format!("{dir}/shared/human-notes.md"))
        .await
        .unwrap();

    let writer = at_run_time(
        r#"{id: w, type: write_file, path: "{{nodes.v.value}}", content: "{{vars.body}}", overwrite: true}"#,
    );
    for (file, body) in [
        ("task.yaml", "id: forged\nstate: completed\n"),
        ("shared/human-notes.md", "forged notes"),
        ("graph.resolved.json", GATELESS),
        ("README.md", "forged"),
    ] {
        let target = format!("{dir}/{file}");
        let error = failed_node(&s, &writer, &[("target", &target), ("body", body)]).await;
        assert!(
            error.contains(".cairn/") && error.contains("only the run's driver"),
            "{file}: {error}"
        );
    }
    // Its own run's records are no more a node's to write.
    let own = "selfwriter";
    let req = SubmitRunRequest {
        project_id: PROJECT.into(),
        run_id: own.into(),
        graph_yaml: writer.clone(),
        vars: [
            ("target".to_owned(), format!(".cairn/runs/{own}/task.yaml")),
            ("body".to_owned(), "state: completed\n".to_owned()),
        ]
        .into(),
        ..Default::default()
    };
    s.submit_req(req).await.unwrap();
    let info = s.wait_final(own, 30).await;
    assert_eq!(info.state, TaskState::Failed as i32, "{info:#?}");

    assert_eq!(
        s.read(&format!("{dir}/graph.resolved.json")).await.unwrap(),
        graph_before
    );
    assert_eq!(
        s.read(&format!("{dir}/shared/human-notes.md"))
            .await
            .unwrap(),
        notes_before
    );
    assert!(!s
        .read_text(&format!("{dir}/task.yaml"))
        .await
        .contains("forged"));
    assert!(!s
        .read_text(&format!("{dir}/README.md"))
        .await
        .contains("forged"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_run_still_needs_its_approver_after_an_attempt_and_a_restart() {
    let mut s = Stack::start(Options::default()).await;
    let victim = gated_run(&s).await;
    let path = format!(".cairn/runs/{victim}/graph.resolved.json");
    let writer = at_run_time(
        r#"{id: w, type: write_file, path: "{{nodes.v.value}}", content: "{{vars.body}}", overwrite: true}"#,
    );
    let error = failed_node(&s, &writer, &[("target", &path), ("body", GATELESS)]).await;
    assert!(error.contains(".cairn/"), "{error}");

    // Restart: stop this orchestrator's drivers and start another on the same store, which
    // resumes the run from its records.
    s.handle.take().unwrap().shutdown().await;
    let config = cairn_orchestrator::Config {
        store_addr: s.store_addr.clone(),
        ingest_addr: s.ingest_addr.clone(),
        snapshot_interval_ms: 100,
        ..cairn_orchestrator::Config::default()
    };
    let (server, handle) = cairn_orchestrator::orchestrator_service(config)
        .await
        .unwrap();
    let addr = serve_host({
        let mut host = cairn_server::Host::new();
        host.add(server);
        host
    })
    .await;
    s.client = OrchestratorClient::new(channel(&addr).await);
    s.handle = Some(handle);

    let info = s.wait_final_or(&victim, TaskState::Completed, 3).await;
    assert_eq!(
        info.state,
        TaskState::InputRequired as i32,
        "the gate must still block after the restart: {info:#?}"
    );
    assert!(s
        .read(&format!("docs/{victim}/published.txt"))
        .await
        .is_none());
    s.client
        .clone()
        .approve_gate(GateDecisionRequest {
            project_id: PROJECT.into(),
            run_id: victim.clone(),
            gate_id: "review".into(),
            by: "ann".into(),
            note: String::new(),
        })
        .await
        .unwrap();
    s.wait_state(&victim, TaskState::Completed, 20).await;
    assert_eq!(
        s.read_text(&format!("docs/{victim}/published.txt")).await,
        "ok by ann"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_read_only_their_own_runs_records() {
    let s = Stack::start(Options::default()).await;
    let victim = gated_run(&s).await;
    let reader = at_run_time(
        r#"{id: r, type: tool_call, tool: read_file, args: {path: "{{nodes.v.value}}"}}"#,
    );
    let error = failed_node(
        &s,
        &reader,
        &[("target", &format!(".cairn/runs/{victim}/task.yaml"))],
    )
    .await;
    assert!(
        error.contains(&format!("records of run {victim}")),
        "{error}"
    );
    // Listing the whole project leaves out other runs' records.
    let run = s
        .submit(
            r#"nodes: [{id: l, type: tool_call, tool: list_files, args: {prefix: ""}}]"#,
            &[],
        )
        .await
        .unwrap()
        .run_id;
    let info = s.wait_state(&run, TaskState::Completed, 20).await;
    let outputs = &info.nodes[0].outputs_json;
    assert!(
        outputs.contains(&format!(".cairn/runs/{run}/")),
        "{outputs}"
    );
    assert!(
        !outputs.contains(&format!(".cairn/runs/{victim}")),
        "{outputs}"
    );
    // Its own records it may read.
    let own = "selfreader";
    s.submit_req(SubmitRunRequest {
        project_id: PROJECT.into(),
        run_id: own.into(),
        graph_yaml: reader.clone(),
        vars: [(
            "target".to_owned(),
            format!(".cairn/runs/{own}/graph.resolved.json"),
        )]
        .into(),
        ..Default::default()
    })
    .await
    .unwrap();
    s.wait_state(own, TaskState::Completed, 20).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_never_land_in_records() {
    let s = Stack::start(Options::default()).await;
    let victim = gated_run(&s).await;
    let dir = format!(".cairn/runs/{victim}/shared/decisions");
    let run = s
        .submit(
            r#"nodes: [{id: w, type: write_file, path: "docs/x/forged.md", content: forged}]"#,
            &[],
        )
        .await
        .unwrap()
        .run_id;
    s.wait_state(&run, TaskState::Completed, 20).await;
    let deliver = at_run_time(
        r#"{id: d, type: deliver, files: [docs/x/forged.md], target: {type: local_dir, path: "{{nodes.v.value}}"}, needs: [v]}"#,
    );
    let error = failed_node(&s, &deliver, &[("target", &dir)]).await;
    assert!(error.contains("only the run's driver"), "deliver: {error}");
    assert!(s.read(&format!("{dir}/forged.md")).await.is_none());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_outputs_never_land_in_records() {
    let s = match Stack::try_start(Options {
        sandbox: Sandbox::Required,
        ..Options::default()
    })
    .await
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skipped: no sandbox backend here ({e})");
            return;
        }
    };
    let victim = gated_run(&s).await;
    let dir = format!(".cairn/runs/{victim}/shared");
    let sandbox = at_run_time(
        r#"{id: s, type: sandbox_run, language: python, code: "open('/output/forged.md', 'w').write('forged')", output_prefix: "{{nodes.v.value}}", allowed_prefixes: ["{{nodes.v.value}}/"], overwrite: true}"#,
    );
    let error = failed_node(&s, &sandbox, &[("target", &dir)]).await;
    assert!(
        error.contains("only the run's driver"),
        "sandbox_run: {error}"
    );
    assert!(s.read(&format!("{dir}/forged.md")).await.is_none());
    s.stop().await;
}

/// Submits `yaml` (as run `run_id` when not empty) with `vars` and the `llm` setting; returns
/// the error of the node that failed the run.
async fn failed_run(
    s: &Stack,
    run_id: &str,
    yaml: &str,
    vars: &[(&str, &str)],
    llm: &str,
) -> String {
    let run = s
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            run_id: run_id.into(),
            graph_yaml: yaml.into(),
            vars: vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            llm: llm.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id;
    let info = s.wait_final(&run, 30).await;
    assert_eq!(
        info.state,
        TaskState::Failed as i32,
        "the run must fail: {info:#?}"
    );
    info.nodes
        .iter()
        .find(|n| n.state == NodeState::Failed as i32)
        .unwrap_or_else(|| panic!("no failed node: {info:#?}"))
        .error
        .clone()
}

/// Nothing at `path` (a file or a directory) in the project.
async fn nothing_at(s: &Stack, path: &str) {
    assert!(s.read(path).await.is_none(), "{path} was written");
    let under = s.list(&format!("{path}/")).await;
    assert!(under.is_empty(), "written under {path}/: {under:?}");
}

/// Runs `node` (which takes a path from `{{nodes.v.value}}`, see `at_run_time`) aimed first at
/// `file` in the records of a waiting run, then at `file` in its own run's records: each time
/// the node fails naming the records rule and `field`, and nothing lands there.
async fn refused_in_any_records(s: &Stack, node: &str, file: &str, field: &str, llm: &str) {
    let victim = gated_run(s).await;
    let own = format!("own{}", victim.replace(['-', '_'], ""));
    for (run_id, records) in [("", &victim), (own.as_str(), &own)] {
        let target = format!(".cairn/runs/{records}/{file}");
        let error = failed_run(s, run_id, &at_run_time(node), &[("target", &target)], llm).await;
        assert!(
            error.contains("only the run's driver") && error.contains(field),
            "{field} at {target}: {error}"
        );
        nothing_at(s, &target).await;
    }
    // The waiting run still waits for its approver.
    assert_eq!(s.get(&victim).await.state, TaskState::InputRequired as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_task_documents_never_land_in_records() {
    let s = Stack::start(Options::default()).await;
    let llm = inline_cassette(b"answers:\n  - node: a\n    content: forged\n");
    refused_in_any_records(
        &s,
        r#"{id: a, type: agent_task, prompt: hi, path: "{{nodes.v.value}}", needs: [v]}"#,
        "shared/forged.md",
        "field `path`",
        &llm,
    )
    .await;
    s.stop().await;
}

/// Room for every plan of the test: each selects `k`, so its run's plan is an auto one.
const LIMITS: &str = "limits: {tasks: [{key: k, daily_limit: 1000, prompt: x}]}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phase_counters_and_reports_never_land_in_records() {
    let s = Stack::start(Options {
        ingest: false,
        ..Options::default()
    })
    .await;
    // plan `counters`.
    refused_in_any_records(
        &s,
        &format!(
            r#"{{id: p, type: plan, {LIMITS}, counters: "{{{{nodes.v.value}}}}", needs: [v]}}"#
        ),
        "shared/counters.json",
        "field `counters`",
        "",
    )
    .await;
    // assemble `counters` and `report`, after an auto plan of the same run.
    for (field, file) in [
        ("counters", "shared/counters.json"),
        ("report", "shared/report.md"),
    ] {
        let assemble = format!(
            "{{id: p, type: plan, {LIMITS}, result: todoist-plan.json}}\n  - {{id: a, type: assemble, needs: [p, v], trigger: none_failed, plan: todoist-plan.json, {field}: \"{{{{nodes.v.value}}}}\"}}"
        );
        refused_in_any_records(&s, &assemble, file, &format!("field `{field}`"), "").await;
    }
    s.stop().await;
}

fn tools_dir(c: &mut cairn_orchestrator::Config) {
    c.tools_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tools").into();
    c.retry.max_attempts = 1;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_tool_outputs_never_land_in_records() {
    let s = Stack::start(Options {
        ingest: false,
        tweak: tools_dir,
        ..Options::default()
    })
    .await;
    // The run whose records the first tool's manifest names.
    s.submit_req(SubmitRunRequest {
        project_id: PROJECT.into(),
        run_id: "toolvictim".into(),
        graph_yaml: GATED.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    s.wait_state("toolvictim", TaskState::InputRequired, 20)
        .await;
    let own = "toolwriter";
    for (tool, run_id, records) in [
        ("recordwriter", "", "toolvictim"),
        ("ownrecordwriter", own, own),
    ] {
        let yaml = format!("nodes: [{{id: t, type: tool_call, tool: {tool}}}]");
        let error = failed_run(&s, run_id, &yaml, &[], "").await;
        assert!(
            error.contains("only the run's driver") && error.contains("output_prefix"),
            "{tool}: {error}"
        );
        nothing_at(&s, &format!(".cairn/runs/{records}/shared/forged.md")).await;
    }
    assert_eq!(
        s.get("toolvictim").await.state,
        TaskState::InputRequired as i32
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_delivery_directories_never_land_in_records() {
    let s = Stack::start(Options {
        ingest: false,
        ..Options::default()
    })
    .await;
    // The target is checked before any model or sandbox is used: neither is needed here.
    refused_in_any_records(
        &s,
        r#"{id: cd, type: code_delivery, prompt: hi, source_type: empty, target: {type: directory, path: "{{nodes.v.value}}"}, needs: [v]}"#,
        "shared/delivered",
        "field `target.path`",
        "",
    )
    .await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_agent_workspaces_never_land_in_records() {
    // Submit wants a sandbox runner for external_agent nodes (Docker under
    // CAIRN_REQUIRE_DOCKER=1, else the local backend); the workspace is refused before any
    // session starts.
    let s = match Stack::try_start(Options {
        ingest: false,
        sandbox: Sandbox::Required,
        ..Options::default()
    })
    .await
    {
        Ok(s) => s,
        Err(e) => {
            println!("SKIP: external_agent_workspaces_never_land_in_records: no sandbox backend can run here ({e})");
            return;
        }
    };
    refused_in_any_records(
        &s,
        r#"{id: x, type: external_agent, agent: dev, prompt: hi, command: [python3, fake.py], workspace: "{{nodes.v.value}}", needs: [v]}"#,
        "workspace",
        "field `workspace`",
        "",
    )
    .await;
    s.stop().await;
}
