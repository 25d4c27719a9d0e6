//! Replays of recorded runs (ReplayRun, DiffRuns) over gRPC: runs recorded against a fake
//! OpenAI-compatible server that answers at random replay to `identical` with the server
//! gone; a changed variable diverges at exactly the node whose request changed, with the
//! request diff; a changed graph diverges at its change, and goes on live only from there
//! when asked; a changed sandbox step diverges; a damaged record and a run without records
//! are refused, naming what.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "support/random_llm.rs"]
mod random_llm;

use std::sync::atomic::Ordering;

use cairn_orchestrator::Config;
use cairn_proto::v1::{ReplayRunRequest, SubmitRunRequest, TaskState};
use common::{data, put_file, Options, Stack, PROJECT};
use random_llm::{cassette_llm, RandomLlm};
use serde_json::{json, Value};

/// Two agents and a file made from their outputs; only `second` reads the variable.
const GRAPH: &str = r#"
version: 1
title: two agents
nodes:
  - id: first
    type: agent_task
    prompt: "Name a colour."
    path: "docs/{{run_id}}/first.md"
  - id: second
    type: agent_task
    needs: [first]
    prompt: "Write a line about {{vars.topic}} in the colour of: {{nodes.first.path}}"
    path: "docs/{{run_id}}/second.md"
  - id: summary
    type: write_file
    needs: [second]
    path: "docs/{{run_id}}/summary.md"
    content: "first {{nodes.first.sha256}} second {{nodes.second.sha256}} tokens {{nodes.second.usage.completion_tokens}}"
"#;

/// How long a replay may take to end (a code delivery replay runs its session again).
const REPLAY_WAIT_S: u64 = 120;

fn fast(c: &mut Config) {
    c.llm.initial_backoff_ms = 5;
    c.llm.max_backoff_ms = 20;
    c.llm.max_attempts = 2;
    c.llm.allow_request_llm_urls = true;
}

async fn stack() -> Stack {
    Stack::start(Options {
        ingest: false,
        tweak: fast,
        ..Default::default()
    })
    .await
}

async fn record(stack: &Stack, llm: &RandomLlm) -> String {
    let run = stack
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: GRAPH.into(),
            vars: [("topic".to_owned(), "rain".to_owned())].into(),
            llm: llm.llm(),
            by: "tester".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id;
    let info = stack.wait_final(&run, 30).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    run
}

/// A run of GRAPH recorded against the random provider, which is stopped.
async fn recorded_offline() -> (Stack, String) {
    let llm = RandomLlm::start().await;
    let stack = stack().await;
    let run = record(&stack, &llm).await;
    llm.stop().await;
    (stack, run)
}

#[tokio::test]
async fn a_recorded_run_replays_identically_with_its_provider_gone() {
    let llm = RandomLlm::start().await;
    let stack = stack().await;
    let run = record(&stack, &llm).await;
    assert_eq!(llm.calls.load(Ordering::SeqCst), 2);
    // Every exchange is recorded whole: request with its hash, reply with usage.
    let ex = stack
        .read_text(&format!(
            ".cairn/runs/{run}/agents/second/runtime/exchanges/1-1-1.json"
        ))
        .await;
    let ex: Value = serde_json::from_str(&ex).unwrap();
    assert_eq!(ex["node"], "second");
    assert_eq!(ex["request_sha256"].as_str().unwrap().len(), 64);
    assert!(ex["request"]["messages"].to_string().contains("rain"));
    assert!(ex["reply"]["content"]
        .as_str()
        .unwrap()
        .starts_with("answer "));
    assert_eq!(ex["reply"]["finish_reason"], "stop");
    assert!(ex["reply"]["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    assert_eq!(ex["attempts"][0]["outcome"], "succeeded");

    // A live re-run gets other answers: the comparison sees it.
    let rerun = stack
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            rerun_of: run.clone(),
            by: "tester".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id;
    stack.wait_final(&rerun, 30).await;
    let (v, _) = stack.verdict(&run, &rerun).await;
    assert_eq!(v["verdict"], "diverged", "{v:#}");

    let calls = llm.calls.load(Ordering::SeqCst);
    llm.stop().await;
    let replayed = stack
        .replay_with(&run, REPLAY_WAIT_S, |_| {})
        .await
        .unwrap();
    let info = stack.get(&replayed).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    let (v, report) = stack.verdict(&run, &replayed).await;
    assert_eq!(
        v,
        json!({"run_id": replayed, "replay_of": run, "verdict": "identical", "divergence": null}),
        "{report:#}"
    );
    // Byte for byte but for the run id: the documents hold the recorded answers. (summary.md
    // holds the documents' hashes, which change with the id they contain: compared above.)
    for f in ["first.md", "second.md"] {
        let a = stack.read_text(&format!("docs/{run}/{f}")).await;
        let b = stack.read_text(&format!("docs/{replayed}/{f}")).await;
        assert_eq!(a.replace(&run, "R"), b.replace(&replayed, "R"), "{f}");
    }
    assert_eq!(report["files"].as_array().unwrap().len(), 3, "{report:#}");
    // task.created and task.yaml name the source.
    let created = stack
        .events(&replayed)
        .await
        .into_iter()
        .find(|e| e.r#type == "task.created")
        .unwrap();
    assert_eq!(data(&created)["replay_of"], run.as_str());
    let task = stack
        .read_text(&format!(".cairn/runs/{replayed}/task.yaml"))
        .await;
    assert!(task.contains(&format!("replay_of: {run}")), "{task}");
    // A replay of the replay is identical too (its own exchanges were recorded).
    let again = stack
        .replay_with(&replayed, REPLAY_WAIT_S, |_| {})
        .await
        .unwrap();
    assert_eq!(
        stack.verdict(&replayed, &again).await.0["verdict"],
        "identical"
    );
    assert_eq!(calls, 4);
    stack.stop().await;
}

#[tokio::test]
async fn a_changed_variable_diverges_at_the_node_whose_request_changed() {
    let (stack, run) = recorded_offline().await;
    let replayed = stack
        .replay_with(&run, REPLAY_WAIT_S, |r| {
            r.vars = [("topic".to_owned(), "snow".to_owned())].into();
        })
        .await
        .unwrap();
    let (v, _) = stack.verdict(&run, &replayed).await;
    assert_eq!(v["verdict"], "diverged", "{v:#}");
    assert_eq!(v["divergence"]["node"], "second");
    assert_eq!(v["divergence"]["attempt"], 1);
    assert_eq!(v["divergence"]["what"], "request");
    let diff = v["divergence"]["diff"].as_str().unwrap();
    assert!(
        diff.contains("--- recorded") && diff.contains("+++ replay"),
        "{diff}"
    );
    let minus: Vec<&str> = diff
        .lines()
        .filter(|l| l.starts_with('-') && !l.starts_with("---"))
        .collect();
    let plus: Vec<&str> = diff
        .lines()
        .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
        .collect();
    assert!(minus.len() == 1 && minus[0].contains("rain"), "{diff}");
    assert!(plus.len() == 1 && plus[0].contains("snow"), "{diff}");
    // `first` did not change: it replayed from the records.
    let info = stack.get(&replayed).await;
    let state = |id: &str| info.nodes.iter().find(|n| n.id == id).unwrap().state;
    assert_eq!(state("first"), cairn_proto::v1::NodeState::Succeeded as i32);
    assert_eq!(state("second"), cairn_proto::v1::NodeState::Failed as i32);
    stack.stop().await;
}

#[tokio::test]
async fn a_damaged_record_is_refused_naming_its_file_and_line() {
    let (stack, run) = recorded_offline().await;
    let path = format!(".cairn/runs/{run}/agents/first/runtime/exchanges/1-1-1.json");
    let text = stack.read_text(&path).await;
    let line = text.lines().position(|l| l.contains("\"step\"")).unwrap() + 1;
    let broken = text.replacen("\"step\": 1", "\"step\": one", 1);
    put_file(&stack.store, &path, broken.as_bytes()).await;
    let replayed = stack
        .replay_with(&run, REPLAY_WAIT_S, |_| {})
        .await
        .unwrap();
    let (v, _) = stack.verdict(&run, &replayed).await;
    assert_eq!(v["verdict"], "failed", "{v:#}");
    assert_eq!(v["divergence"]["node"], "first");
    let error = v["divergence"]["diff"].as_str().unwrap();
    assert!(error.contains(&path), "{error}");
    assert!(error.contains(&format!("line {line}")), "{error}");
    stack.stop().await;
}

#[tokio::test]
async fn a_run_without_exchange_records_says_which_are_missing() {
    let (stack, run) = recorded_offline().await;
    // As a run recorded before exchanges were: the directory of `second` is gone.
    let dir = format!(".cairn/runs/{run}/agents/second/runtime/exchanges/");
    for f in stack.list(&dir).await {
        stack
            .store
            .clone()
            .delete(cairn_proto::v1::DeleteRequest {
                project_id: PROJECT.into(),
                path: f,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let e = stack
        .replay_with(&run, REPLAY_WAIT_S, |_| {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message()
            .contains("agents/second/runtime/exchanges/ (node `second`)"),
        "{}",
        e.message()
    );
    assert!(!e.message().contains("node `first`"), "{}", e.message());
    stack.stop().await;
}

/// The hello example (agent, ingest, sandbox_run, gate, write_file), recorded against the
/// random provider and a real sandbox runner, replays to `identical` with the provider gone:
/// the sandbox step returns its recorded result and files, the gate takes the recorded
/// decision.
#[tokio::test]
async fn the_hello_example_replays_identically_with_recorded_sandbox_and_gate() {
    let cassette: Value =
        serde_saphyr::from_str(include_str!("../../../examples/hello/cassette.yaml")).unwrap();
    let answer = cassette["answers"][0]["content"].as_str().unwrap();
    let llm = RandomLlm::answering(answer).await;
    let Some(stack) = Stack::sandboxed(
        "the_hello_example_replays_identically_with_recorded_sandbox_and_gate",
        true,
        fast,
    )
    .await
    else {
        return;
    };
    let run = stack
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: include_str!("../../../examples/hello/graph.yaml").into(),
            llm: llm.llm(),
            by: "tester".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id;
    stack.wait_state(&run, TaskState::InputRequired, 60).await;
    let mut approve = common::approval(&run, "approve", "alice");
    approve.note = "tests look fine".into();
    stack.client.clone().approve_gate(approve).await.unwrap();
    let info = stack.wait_final(&run, 30).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    llm.stop().await;

    let replayed = stack
        .replay_with(&run, REPLAY_WAIT_S, |_| {})
        .await
        .unwrap();
    let info = stack.get(&replayed).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    let (v, report) = stack.verdict(&run, &replayed).await;
    assert_eq!(v["verdict"], "identical", "{v:#}\n{report:#}");
    // The report names the recorded approval, its time and the recorded test run.
    let a = stack
        .read_text(&format!("docs/hello/{run}/report.md"))
        .await;
    let b = stack
        .read_text(&format!("docs/hello/{replayed}/report.md"))
        .await;
    assert_eq!(a.replace(&run, "R"), b.replace(&replayed, "R"));
    assert!(b.contains("Approved by alice"), "{b}");
    let decided = stack
        .events(&replayed)
        .await
        .into_iter()
        .find(|e| e.r#type == "gate.approved")
        .unwrap();
    assert_eq!(data(&decided)["by"], "alice");
    assert_eq!(data(&decided)["replayed_by"], "tester");
    stack.stop().await;
}

/// The code delivery example (its tool calls from its cassette, each answer with random text
/// and call ids), recorded against a live provider and a real sandbox runner, replays to
/// `identical` with the provider gone: the session's commands run again on the runner, and
/// the archive it delivers is the recorded one byte for byte (every entry carries one fixed
/// time). A replay with a changed prompt diverges at `deliver`, with the request diff.
#[tokio::test]
async fn the_code_delivery_example_replays_identically_with_its_provider_gone() {
    const TEST: &str = "the_code_delivery_example_replays_identically_with_its_provider_gone";
    let Some(stack) = Stack::sandboxed(TEST, false, fast).await else {
        return;
    };
    let graph = include_str!("../../../examples/code_delivery/graph.yaml");
    let llm = cassette_llm(include_str!(
        "../../../examples/code_delivery/cassette.yaml"
    ))
    .await;
    let submit = |rerun_of: &str| SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: if rerun_of.is_empty() {
            graph.into()
        } else {
            String::new()
        },
        rerun_of: rerun_of.into(),
        llm: if rerun_of.is_empty() {
            llm.llm()
        } else {
            String::new()
        },
        by: "tester".into(),
        ..Default::default()
    };
    let run = stack.submit_req(submit("")).await.unwrap().run_id;
    let info = stack.wait_final(&run, 300).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    assert_eq!(llm.calls.load(Ordering::SeqCst), 5);
    let archive = |run: &str| format!("docs/artifacts/{run}/wordcount.zip");
    let recorded = stack.read(&archive(&run)).await.unwrap();
    // Every entry carries the fixed time, whenever its file was written.
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(recorded.clone())).unwrap();
    assert!(zip.len() >= 4, "{:?}", zip.file_names().collect::<Vec<_>>());
    for i in 0..zip.len() {
        let t = zip.by_index(i).unwrap().last_modified().unwrap();
        assert_eq!(
            (
                t.year(),
                t.month(),
                t.day(),
                t.hour(),
                t.minute(),
                t.second()
            ),
            (1980, 1, 1, 0, 0, 0)
        );
    }

    // A live re-run gets other answers (text, call ids): the comparison sees it.
    let rerun = stack.submit_req(submit(&run)).await.unwrap().run_id;
    let info = stack.wait_final(&rerun, 300).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    let (v, _) = stack.verdict(&run, &rerun).await;
    assert_eq!(v["verdict"], "diverged", "{v:#}");
    assert_eq!(v["divergence"]["node"], "deliver", "{v:#}");
    assert_eq!(llm.calls.load(Ordering::SeqCst), 10);
    llm.stop().await;

    let replayed = stack
        .replay_with(&run, REPLAY_WAIT_S, |_| {})
        .await
        .unwrap();
    let info = stack.get(&replayed).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    let (v, report) = stack.verdict(&run, &replayed).await;
    assert_eq!(
        v,
        json!({"run_id": replayed, "replay_of": run, "verdict": "identical", "divergence": null}),
        "{report:#}"
    );
    // The session ran again (another session), and delivered the same bytes.
    let opened = |events: Vec<cairn_proto::v1::Event>| {
        events
            .into_iter()
            .find(|e| e.r#type == "code_delivery.session_opened")
            .map(|e| data(&e)["session_id"].as_str().unwrap().to_owned())
            .unwrap()
    };
    assert_ne!(
        opened(stack.events(&run).await),
        opened(stack.events(&replayed).await)
    );
    let again = stack.read(&archive(&replayed)).await.unwrap();
    assert!(
        again == recorded,
        "the replay's archive differs from the recorded one"
    );
    let delivered = |run: &str| format!("delivered/{run}/wordcount.zip");
    assert!(stack.read(&delivered(&replayed)).await.unwrap() == recorded);
    assert!(stack.read(&delivered(&run)).await.unwrap() == recorded);

    // A changed prompt: the first request differs; `deliver` fails there with the diff.
    let changed = graph.replace(
        "that prints the number of words",
        "that prints the number of lines",
    );
    assert_ne!(changed, graph);
    let diverged = stack
        .replay_with(&run, REPLAY_WAIT_S, |r| r.graph_yaml = changed)
        .await
        .unwrap();
    let (v, _) = stack.verdict(&run, &diverged).await;
    assert_eq!(v["verdict"], "diverged", "{v:#}");
    assert_eq!(v["divergence"]["node"], "deliver", "{v:#}");
    assert_eq!(v["divergence"]["what"], "request", "{v:#}");
    let diff = v["divergence"]["diff"].as_str().unwrap();
    let changed_lines = |sign: char| {
        diff.lines()
            .filter(|l| l.starts_with(sign) && !l.starts_with(&sign.to_string().repeat(3)))
            .collect::<Vec<_>>()
    };
    let (minus, plus) = (changed_lines('-'), changed_lines('+'));
    assert!(
        minus.len() == 1 && minus[0].contains("number of words"),
        "{diff}"
    );
    assert!(
        plus.len() == 1 && plus[0].contains("number of lines"),
        "{diff}"
    );
    assert!(stack.read(&archive(&diverged)).await.is_none());
    stack.stop().await;
}

/// GRAPH with `second`'s prompt changed.
fn changed_graph() -> String {
    let g = GRAPH.replace("Write a line about", "Write two lines about");
    assert_ne!(g, GRAPH);
    g
}

/// A changed graph evaluated against the records: `first`, unchanged, replays from them;
/// `second`, whose prompt changed, is the divergence. By default the replay stops there;
/// with live_after it goes on against the live provider for `second` only, completes, and
/// the verdict still names the divergence with the request diff.
#[tokio::test]
async fn a_changed_graph_diverges_at_its_change_and_goes_on_live_only_after_it() {
    let (stack, run) = recorded_offline().await;

    // Until the divergence (the default): `second` fails, nothing is asked of any model.
    let stopped = stack
        .replay_with(&run, REPLAY_WAIT_S, |r| r.graph_yaml = changed_graph())
        .await
        .unwrap();
    let (v, _) = stack.verdict(&run, &stopped).await;
    assert_eq!(v["verdict"], "diverged", "{v:#}");
    assert_eq!(v["divergence"]["node"], "second", "{v:#}");
    assert_eq!(v["divergence"]["what"], "request", "{v:#}");
    let diff = v["divergence"]["diff"].as_str().unwrap();
    assert!(
        diff.contains("-") && diff.contains("Write a line") && diff.contains("Write two lines"),
        "{diff}"
    );
    let info = stack.get(&stopped).await;
    let state = |info: &cairn_proto::v1::RunInfo, id: &str| {
        info.nodes.iter().find(|n| n.id == id).unwrap().state
    };
    assert_eq!(
        state(&info, "first"),
        cairn_proto::v1::NodeState::Succeeded as i32
    );
    assert_eq!(
        state(&info, "second"),
        cairn_proto::v1::NodeState::Failed as i32
    );

    // live_after needs a provider: a live one answering "live ...".
    let llm = RandomLlm::answering("live").await;
    let went_on = stack
        .replay_with(&run, REPLAY_WAIT_S, |r| {
            r.graph_yaml = changed_graph();
            r.live_after = true;
            r.llm = llm.llm();
        })
        .await
        .unwrap();
    let info = stack.get(&went_on).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    // Only the changed node asked the model.
    assert_eq!(llm.calls.load(Ordering::SeqCst), 1);
    let first_a = stack.read_text(&format!("docs/{run}/first.md")).await;
    let first_b = stack.read_text(&format!("docs/{went_on}/first.md")).await;
    assert_eq!(first_a.replace(&run, "R"), first_b.replace(&went_on, "R"));
    let second = stack.read_text(&format!("docs/{went_on}/second.md")).await;
    assert!(second.contains("\nlive "), "{second}");
    let (v, _) = stack.verdict(&run, &went_on).await;
    assert_eq!(v["verdict"], "diverged", "{v:#}");
    assert_eq!(v["divergence"]["node"], "second", "{v:#}");
    assert_eq!(v["divergence"]["what"], "request (went on live)", "{v:#}");
    assert!(
        v["divergence"]["diff"]
            .as_str()
            .unwrap()
            .contains("Write two lines"),
        "{v:#}"
    );
    let live: Vec<_> = stack
        .events(&went_on)
        .await
        .into_iter()
        .filter(|e| e.r#type == "replay.live")
        .collect();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0].node_id, "second");
    assert_eq!(data(&live[0])["why"], "request");

    // The same change without live_after but with a provider named is refused: the provider
    // would never be asked.
    let e = stack
        .client
        .clone()
        .replay_run(ReplayRunRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            llm: llm.llm(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(
        cairn_proto::reason::violations(&e)
            .first()
            .map(|v| v.0.clone()),
        Some("llm".to_owned()),
        "{e:?}"
    );
    llm.stop().await;
    stack.stop().await;
}

/// The provider a replay goes on live to is under SubmitRun's rules: an orchestrator that
/// takes no URLs from clients refuses one given as a replay's `llm`, and starts nothing.
#[tokio::test]
async fn a_live_after_provider_url_is_refused_where_clients_may_not_name_urls() {
    let stack = Stack::start(Options {
        ingest: false,
        tweak: |c: &mut Config| {
            fast(c);
            c.llm.allow_request_llm_urls = false;
        },
        ..Default::default()
    })
    .await;
    // A recorded run that asked no model (nothing else may use a URL here).
    let run = stack
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: "version: 1\nnodes:\n  - {id: w, type: write_file, path: \"docs/{{run_id}}/w.md\", content: \"w\"}\n".into(),
            by: "tester".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id;
    stack.wait_final(&run, 30).await;
    let llm = RandomLlm::start().await;
    let e = stack
        .client
        .clone()
        .replay_run(ReplayRunRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            graph_yaml: GRAPH.into(),
            vars: [("topic".to_owned(), "rain".to_owned())].into(),
            live_after: true,
            llm: llm.llm(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        cairn_proto::reason::of(&e).as_deref(),
        Some("llm_url_not_allowed"),
        "{e:?}"
    );
    assert_eq!(llm.calls.load(Ordering::SeqCst), 0);
    // Nothing was started: the project holds the recorded run only.
    let runs = stack
        .client
        .clone()
        .list_runs(cairn_proto::v1::ListRunsRequest {
            project_id: PROJECT.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .runs;
    assert_eq!(runs.len(), 1, "{runs:?}");
    llm.stop().await;
    stack.stop().await;
}

/// A graph whose sandbox step, agent and file writer; the step's code is `code`.
fn step_graph(code: &str) -> String {
    format!(
        r#"
version: 1
title: step
nodes:
  - id: ask
    type: agent_task
    prompt: "Name a number."
    path: "docs/{{{{run_id}}}}/ask.md"
  - id: step
    type: sandbox_run
    needs: [ask]
    language: python
    allowed_prefixes: ["docs/"]
    input_files: ["docs/{{{{run_id}}}}/ask.md"]
    output_prefix: "docs/{{{{run_id}}}}/step"
    code: |
      import uuid
      open("/output/out.txt", "w").write("{code} " + str(uuid.uuid4()))
"#
    )
}

/// A recorded sandbox step is returned from the records only while its request (code,
/// inputs by content, limits) is the one recorded: a changed step diverges naming the
/// code's diff, and with live_after runs again on a runner.
#[tokio::test]
async fn a_changed_sandbox_step_diverges_and_runs_live_only_after_it() {
    let llm = RandomLlm::start().await;
    let Some(stack) = Stack::sandboxed(
        "a_changed_sandbox_step_diverges_and_runs_live_only_after_it",
        false,
        fast,
    )
    .await
    else {
        return;
    };
    let run = stack
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: step_graph("old"),
            llm: llm.llm(),
            by: "tester".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id;
    let info = stack.wait_final(&run, 60).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    llm.stop().await;
    let recorded_out = stack.read_text(&format!("docs/{run}/step/out.txt")).await;

    // Unchanged: the step's recorded output comes back (its random part included).
    let same = stack
        .replay_with(&run, REPLAY_WAIT_S, |r| r.graph_yaml = step_graph("old"))
        .await
        .unwrap();
    let (v, _) = stack.verdict(&run, &same).await;
    assert_eq!(v["verdict"], "identical", "{v:#}");
    assert_eq!(
        stack.read_text(&format!("docs/{same}/step/out.txt")).await,
        recorded_out
    );

    // Changed code: the divergence names the step and shows the code's diff.
    let stopped = stack
        .replay_with(&run, REPLAY_WAIT_S, |r| r.graph_yaml = step_graph("new"))
        .await
        .unwrap();
    let (v, _) = stack.verdict(&run, &stopped).await;
    assert_eq!(v["verdict"], "diverged", "{v:#}");
    assert_eq!(v["divergence"]["node"], "step", "{v:#}");
    let diff = v["divergence"]["diff"].as_str().unwrap();
    assert!(diff.contains("old") && diff.contains("new"), "{diff}");
    assert!(
        stack
            .read(&format!("docs/{stopped}/step/out.txt"))
            .await
            .is_none(),
        "a diverged step wrote its recorded output"
    );

    // live_after: the changed step runs on the runner; the agent before it still replays.
    let went_on = stack
        .replay_with(&run, REPLAY_WAIT_S, |r| {
            r.graph_yaml = step_graph("new");
            r.live_after = true;
        })
        .await
        .unwrap();
    let info = stack.get(&went_on).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    let out = stack
        .read_text(&format!("docs/{went_on}/step/out.txt"))
        .await;
    assert!(out.starts_with("new "), "{out}");
    let (v, _) = stack.verdict(&run, &went_on).await;
    assert_eq!(v["divergence"]["node"], "step", "{v:#}");
    assert_eq!(
        v["divergence"]["what"], "sandbox request (went on live)",
        "{v:#}"
    );
    stack.stop().await;
}

/// Benchmark (bench/RESULTS.md): a 100-node agent run recorded against the random provider
/// answering after `CAIRN_BENCH_LATENCY_MS` (default 200 ms), then replayed; prints both wall
/// times, the ratio and the replay's time per node. Ignored in the suite: run it with
/// `cargo nextest run -p cairn-orchestrator --test replay_test --run-ignored only --no-capture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_replay_of_a_100_node_run() {
    let latency: u64 = std::env::var("CAIRN_BENCH_LATENCY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let nodes: u64 = 100;
    let mut graph = String::from("version: 1\ntitle: hundred\nmax_parallel: 8\nnodes:\n");
    for i in 0..nodes {
        graph.push_str(&format!(
            "  - id: n{i}\n    type: agent_task\n    prompt: \"Step {i} of {{{{vars.topic}}}}.\"\n    path: \"docs/{{{{run_id}}}}/n{i}.md\"\n"
        ));
        if i >= 8 {
            graph.push_str(&format!("    needs: [n{}]\n", i - 8));
        }
    }
    let llm = RandomLlm::slow("answer", latency).await;
    let stack = stack().await;
    let started = std::time::Instant::now();
    let run = stack
        .submit_req(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: graph,
            vars: [("topic".to_owned(), "rain".to_owned())].into(),
            llm: llm.llm(),
            by: "tester".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id;
    let info = stack.wait_final(&run, 600).await;
    let original = started.elapsed();
    assert_eq!(info.state, TaskState::Completed as i32);
    llm.stop().await;
    let started = std::time::Instant::now();
    let replayed = stack
        .replay_with(&run, REPLAY_WAIT_S, |_| {})
        .await
        .unwrap();
    let replay_time = started.elapsed();
    assert_eq!(
        stack.verdict(&run, &replayed).await.0["verdict"],
        "identical"
    );
    // Where the replay's time went: each node's own time (started to completed) and its
    // wait after the node it needs completed (scheduling).
    let ts = |e: &cairn_proto::v1::Event| {
        time::OffsetDateTime::parse(&e.ts, &time::format_description::well_known::Rfc3339).unwrap()
    };
    let events = stack.events(&replayed).await;
    let at = |node: &str, kind: &str| {
        events
            .iter()
            .find(|e| e.node_id == node && e.r#type == kind)
            .map(ts)
    };
    if std::env::var("CAIRN_BENCH_TRACE").is_ok() {
        for e in events.iter().filter(|e| e.node_id == "n50") {
            println!(
                "TRACE {} {} {}",
                e.ts,
                e.r#type,
                e.data_json.chars().take(150).collect::<String>()
            );
        }
    }
    let (mut own, mut wait) = (0f64, 0f64);
    for i in 0..nodes {
        let (s, c) = (
            at(&format!("n{i}"), "node.started").unwrap(),
            at(&format!("n{i}"), "node.completed").unwrap(),
        );
        own += (c - s).as_seconds_f64();
        if i >= 8 {
            wait += (s - at(&format!("n{}", i - 8), "node.completed").unwrap()).as_seconds_f64();
        }
    }
    println!(
        "BENCH replay_breakdown node_ms_mean={:.1} wait_after_need_ms_mean={:.1}",
        own * 1000.0 / nodes as f64,
        wait * 1000.0 / (nodes - 8) as f64
    );
    // The provider's latency the original spent waiting, on its critical path (8 parallel
    // chains of 12-13 requests).
    let waited = std::time::Duration::from_millis(latency * nodes.div_ceil(8));
    println!(
        "BENCH replay_100_nodes latency_ms={latency} original_ms={} original_without_latency_ms={} replay_ms={} ratio_pct={:.1} ratio_without_latency_pct={:.1} replay_ms_per_node={:.1}",
        original.as_millis(),
        original.saturating_sub(waited).as_millis(),
        replay_time.as_millis(),
        100.0 * replay_time.as_secs_f64() / original.as_secs_f64(),
        100.0 * replay_time.as_secs_f64() / original.saturating_sub(waited).as_secs_f64().max(0.001),
        replay_time.as_secs_f64() * 1000.0 / nodes as f64,
    );
    stack.stop().await;
}
