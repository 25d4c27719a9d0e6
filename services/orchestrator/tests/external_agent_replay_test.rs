//! Replaying `external_agent` nodes from their turn records over real gRPC: a run of the fake
//! `codex exec --json` (tests/fixtures/fake_codex.py, told `[random]` so that no two live runs
//! are alike: a fresh uuid in its last message and in nonce.txt, a fresh thread id) is
//! replayed with the sandbox runner stopped and the fake CLI gone from the project. Each turn
//! is answered from `agents/<instance>/turns/<attempt>-<turn>/`; a damaged record, changed
//! recorded bytes, a changed prompt and a run without turn records are each reported.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{DeleteRequest, GateDecisionRequest, TaskState};
use common::*;
use serde_json::Value;
use tonic::transport::Channel;

const FAKE_CODEX: &str = include_str!("fixtures/fake_codex.py");
const WAIT_S: u64 = 120;

async fn stack(test: &str) -> Option<Stack> {
    Stack::with_sandbox(test, |_| {}).await
}

fn graph(prompt: &str) -> String {
    format!(
        r#"
nodes:
  - id: coder
    type: external_agent
    agent: dev
    prompt: "{prompt}"
    command: ["python3", "/workspace/project/.fake-codex.py"]
    workspace: "app/"
    overwrite: true
    turn_timeout_s: 60
  - id: after
    type: write_file
    path: "docs/{{{{run_id}}}}/after.txt"
    content: "{{{{nodes.coder.text}}}} files={{{{nodes.coder.written_files}}}}"
"#
    )
}

const ONE_TURN: &str = "add hello.py [no-approval] [random]";
const TWO_TURNS: &str = "add hello.py and deploy it [random]";

/// Records a run of `prompt` (approving the CLI's one ask when it asks) to completion.
async fn record(s: &Stack, prompt: &str) -> String {
    put_file(&s.store, "app/README.md", b"# app\n").await;
    put_file(&s.store, "app/.fake-codex.py", FAKE_CODEX.as_bytes()).await;
    let run = s.submit(&graph(prompt), &[]).await.unwrap().run_id;
    let info = s
        .wait_final_or(&run, TaskState::InputRequired, WAIT_S)
        .await;
    if info.state == TaskState::InputRequired as i32 {
        s.client
            .clone()
            .approve_gate(GateDecisionRequest {
                note: "keep it on port 8080".into(),
                ..approval(&run, "coder", "ann")
            })
            .await
            .unwrap();
    }
    s.wait_completed(&run, WAIT_S).await;
    run
}

async fn delete(s: &Stack, path: &str) {
    s.store
        .clone()
        .delete(DeleteRequest {
            project_id: PROJECT.into(),
            path: path.into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// The recorded turn directories of `run`'s coder, in order.
async fn turn_dirs(s: &Stack, run: &str) -> Vec<String> {
    let mut dirs: Vec<String> = s
        .list(&format!(".cairn/runs/{run}/agents/coder/turns/"))
        .await
        .into_iter()
        .filter_map(|p| p.strip_suffix("/turn.json").map(str::to_owned))
        .collect();
    dirs.sort();
    dirs
}

/// (path, sha256) of every artifact.written of `run`'s coder, sorted.
async fn written(s: &Stack, run: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = s
        .events(run)
        .await
        .iter()
        .filter(|e| e.r#type == "artifact.written" && e.node_id == "coder")
        .map(|e| {
            let d = data(e);
            (
                d["path"].as_str().unwrap().to_owned(),
                d["sha256"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Another orchestrator over the same store, with no sandbox runner configured at all.
async fn runnerless(s: &Stack) -> (OrchestratorClient<Channel>, cairn_orchestrator::Handle) {
    let config = cairn_orchestrator::Config {
        store_addr: s.store_addr.clone(),
        resume_on_start: false,
        ..Default::default()
    };
    let (server, handle) = cairn_orchestrator::orchestrator_service(config)
        .await
        .unwrap();
    let mut host = cairn_server::Host::new();
    host.add(server);
    let addr = serve_host(host).await;
    (OrchestratorClient::new(channel(&addr).await), handle)
}

fn sha256(bytes: &[u8]) -> String {
    cairn_sha256::sha256_hex(bytes)
}

/// Two turns (the CLI asks, a human approves, the CLI is resumed) replay to `identical` with
/// no runner and no CLI: same outputs and events, same files with the same sha256, and the
/// recorded gate decision taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_agent_replays_identically_from_its_turn_records_with_no_runner() {
    let Some(mut s) =
        stack("an_external_agent_replays_identically_from_its_turn_records_with_no_runner").await
    else {
        return;
    };
    let run = record(&s, TWO_TURNS).await;
    let nonce = s.read_text("app/nonce.txt").await;
    assert_eq!(nonce.trim().len(), 36, "{nonce}");

    // One record per turn: the request, the transcript as printed, stderr, turn.json and the
    // bytes of each file written back, by sha256.
    let dirs = turn_dirs(&s, &run).await;
    assert_eq!(dirs.len(), 2, "{dirs:?}");
    let events = s
        .read_text(&format!(
            ".cairn/runs/{run}/agents/coder/runtime/events.jsonl"
        ))
        .await;
    let mut transcripts = String::new();
    for d in &dirs {
        let t = s.read_text(&format!("{d}/transcript.jsonl")).await;
        let turn: Value =
            serde_json::from_str(&s.read_text(&format!("{d}/turn.json")).await).unwrap();
        assert_eq!(turn["version"], 1);
        assert_eq!(turn["node"], "coder");
        assert_eq!(turn["transcript_sha256"], sha256(t.as_bytes()).as_str());
        assert_eq!(turn["exit_code"], 0);
        assert_eq!(turn["complete"], true);
        for f in turn["files"].as_array().unwrap() {
            let sha = f["sha256"].as_str().unwrap();
            let kept = s.read(&format!("{d}/files/{sha}")).await.unwrap();
            assert_eq!(sha256(&kept), sha);
        }
        let request = s.read_text(&format!("{d}/request.json")).await;
        assert_eq!(turn["request_sha256"], sha256(request.as_bytes()).as_str());
        assert!(request.contains("\"argv\""), "{request}");
        transcripts.push_str(&t);
    }
    assert_eq!(transcripts, events);
    let start = s.read_text(&format!("{}/request.json", dirs[0])).await;
    assert!(
        start.contains("add hello.py and deploy it [random]"),
        "{start}"
    );
    let resume = s.read_text(&format!("{}/request.json", dirs[1])).await;
    assert!(resume.contains("ann approved this request"), "{resume}");
    let first: Value =
        serde_json::from_str(&s.read_text(&format!("{}/turn.json", dirs[0])).await).unwrap();
    let nonce_file = first["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "app/nonce.txt")
        .unwrap();
    assert_eq!(nonce_file["sha256"], sha256(nonce.as_bytes()).as_str());

    // No runner, no CLI: a turn that ran live could neither open a session nor find its CLI.
    s.stop_sandbox().await;
    delete(&s, "app/.fake-codex.py").await;

    let replayed = s.replay_with(&run, WAIT_S, |_| {}).await.unwrap();
    let v = s.verdict(&run, &replayed).await.0;
    assert_eq!(
        v["verdict"],
        "identical",
        "{v:#}\n{:#?}",
        s.event_types(&replayed).await
    );
    assert_eq!(written(&s, &replayed).await, written(&s, &run).await);
    assert_eq!(s.read_text("app/nonce.txt").await, nonce);
    // The text of the first turn (the nonce in it) came from the recorded transcript.
    let said = s
        .read_text(&format!(
            ".cairn/runs/{replayed}/agents/coder/artifacts/turn-1-attempt-1.md"
        ))
        .await;
    assert!(said.contains(nonce.trim()), "{said}");
    let types = s.event_types(&replayed).await;
    assert!(
        types.iter().any(|t| t.starts_with("gate.approved ")),
        "{types:?}"
    );
    assert!(
        !types.iter().any(|t| t.starts_with("replay.live")),
        "{types:?}"
    );
    // Answered from the records: the replay's requests name them and no sandbox.
    let requests = s
        .read_text(&format!(
            ".cairn/runs/{replayed}/agents/coder/runtime/requests.jsonl"
        ))
        .await;
    assert_eq!(requests.lines().count(), 2, "{requests}");
    for line in requests.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        assert_eq!(r["replay_of"], run.as_str(), "{r}");
        assert!(r.get("sandbox").is_none(), "{r}");
    }
    // The replay keeps turn records of its own: it can be replayed in turn, here by an
    // orchestrator that has no sandbox runner at all.
    assert_eq!(turn_dirs(&s, &replayed).await.len(), 2);
    let (other, handle) = runnerless(&s).await;
    let first = std::mem::replace(&mut s.client, other);
    let again = s.replay_with(&replayed, WAIT_S, |_| {}).await.unwrap();
    assert_eq!(
        s.verdict(&replayed, &again).await.0["verdict"],
        "identical",
        "{:#?}",
        s.event_types(&again).await
    );
    handle.shutdown().await;
    s.client = first;
    s.stop().await;
}

/// A transcript whose bytes no longer match its record, or recorded file bytes that changed,
/// are refused naming the file; restored, the same run replays identically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_turn_record_is_refused_naming_the_file() {
    let Some(mut s) = stack("a_damaged_turn_record_is_refused_naming_the_file").await else {
        return;
    };
    let run = record(&s, ONE_TURN).await;
    s.stop_sandbox().await;
    let dirs = turn_dirs(&s, &run).await;
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let dir = &dirs[0];

    // The transcript, edited.
    let path = format!("{dir}/transcript.jsonl");
    let good = s.read(&path).await.unwrap();
    let text = String::from_utf8(good.clone()).unwrap();
    assert!(text.contains("Nonce "), "{text}");
    put_file(&s.store, &path, text.replace("Nonce ", "Nonse ").as_bytes()).await;
    let replayed = s.replay_with(&run, WAIT_S, |_| {}).await.unwrap();
    let v = s.verdict(&run, &replayed).await.0;
    assert_eq!(v["verdict"], "failed", "{v:#}");
    assert_eq!(v["divergence"]["node"], "coder", "{v:#}");
    let error = v["divergence"]["diff"].as_str().unwrap();
    assert!(
        error.contains(&path) && error.contains("damaged"),
        "{error}"
    );
    put_file(&s.store, &path, &good).await;

    // The recorded bytes of nonce.txt, changed.
    let turn: Value =
        serde_json::from_str(&s.read_text(&format!("{dir}/turn.json")).await).unwrap();
    let sha = turn["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "app/nonce.txt")
        .unwrap()["sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    let kept = format!("{dir}/files/{sha}");
    let bytes = s.read(&kept).await.unwrap();
    put_file(&s.store, &kept, b"not the recorded nonce\n").await;
    let replayed = s.replay_with(&run, WAIT_S, |_| {}).await.unwrap();
    let v = s.verdict(&run, &replayed).await.0;
    assert_eq!(v["verdict"], "failed", "{v:#}");
    let error = v["divergence"]["diff"].as_str().unwrap();
    assert!(
        error.contains(&kept) && error.contains("app/nonce.txt"),
        "{error}"
    );
    // Refused before anything was written back.
    assert!(written(&s, &replayed).await.is_empty());

    put_file(&s.store, &kept, &bytes).await;
    let replayed = s.replay_with(&run, WAIT_S, |_| {}).await.unwrap();
    let v = s.verdict(&run, &replayed).await.0;
    assert_eq!(v["verdict"], "identical", "{v:#}");
    s.stop().await;
}

/// A changed prompt (`--graph` with another prompt) diverges at the agent, with the diff of
/// the recorded request against the new one: with `--live-after` the turn goes on live, by
/// default the node fails there and the CLI is not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_prompt_diverges_at_the_agent_with_the_request_diff() {
    let Some(mut s) = stack("a_changed_prompt_diverges_at_the_agent_with_the_request_diff").await
    else {
        return;
    };
    let run = record(&s, ONE_TURN).await;
    let changed = graph("add hello.py and a test [no-approval] [random]");
    let line = |diff: &str, sign: char, text: &str| {
        diff.lines()
            .any(|l| l.starts_with(sign) && l.contains(text))
    };

    // --live-after: the changed turn is told as `replay.live` and runs on the runner.
    let went_on = s
        .replay_with(&run, WAIT_S, |r| {
            r.graph_yaml = changed.clone();
            r.live_after = true;
        })
        .await
        .unwrap();
    assert_eq!(s.get(&went_on).await.state, TaskState::Completed as i32);
    let v = s.verdict(&run, &went_on).await.0;
    assert_eq!(v["verdict"], "diverged", "{v:#}");
    assert_eq!(v["divergence"]["node"], "coder", "{v:#}");
    assert_eq!(
        v["divergence"]["what"], "external agent request (went on live)",
        "{v:#}"
    );
    let diff = v["divergence"]["diff"].as_str().unwrap();
    assert!(line(diff, '-', "add hello.py [no-approval]"), "{diff}");
    assert!(!written(&s, &went_on).await.is_empty());

    // Until the divergence (the default): the node fails there, the CLI is not run.
    s.stop_sandbox().await;
    let replayed = s
        .replay_with(&run, WAIT_S, |r| r.graph_yaml = changed)
        .await
        .unwrap();
    let v = s.verdict(&run, &replayed).await.0;
    assert_eq!(v["verdict"], "diverged", "{v:#}");
    assert_eq!(v["divergence"]["node"], "coder", "{v:#}");
    assert_eq!(v["divergence"]["what"], "request", "{v:#}");
    let diff = v["divergence"]["diff"].as_str().unwrap();
    assert!(
        line(diff, '-', "add hello.py [no-approval]") && line(diff, '+', "add hello.py and a test"),
        "{diff}"
    );
    assert!(written(&s, &replayed).await.is_empty());
    s.stop().await;
}

/// A run recorded before turns were (no `turns/`) is refused naming the missing directory;
/// `--sandbox live` needs no turn records and runs the CLI again, which comes out otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_without_turn_records_says_which_are_missing() {
    let Some(s) = stack("a_run_without_turn_records_says_which_are_missing").await else {
        return;
    };
    let run = record(&s, ONE_TURN).await;
    for f in s
        .list(&format!(".cairn/runs/{run}/agents/coder/turns/"))
        .await
    {
        delete(&s, &f).await;
    }
    let e = s.replay_with(&run, WAIT_S, |_| {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains(&format!(
            ".cairn/runs/{run}/agents/coder/turns/ (node `coder`, external agent turns)"
        )),
        "{}",
        e.message()
    );
    assert!(e.message().contains("--sandbox live"), "{}", e.message());

    let live = s
        .replay_with(&run, WAIT_S, |r| r.live_sandbox = true)
        .await
        .unwrap();
    let v = s.verdict(&run, &live).await.0;
    assert_eq!(
        v["verdict"], "diverged",
        "a live CLI draws another nonce: {v:#}"
    );
    assert_eq!(v["divergence"]["node"], "coder", "{v:#}");
    s.stop().await;
}

/// A turn that failed before its CLI ran (its one runner does not answer) is recorded with
/// the node's error, request and an empty transcript; the replay, with no runner at all,
/// fails the turn with the same error and ends `identical`, where a replay used to stop at a
/// missing record.
#[tokio::test]
async fn a_turn_that_failed_before_its_cli_ran_fails_the_same_way_in_the_replay() {
    let s = Stack::start(Options {
        ingest: false,
        tweak: |c| c.sandbox_addrs = vec!["127.0.0.1:1".into()],
        ..Default::default()
    })
    .await;
    let run = s.submit(&graph(ONE_TURN), &[]).await.unwrap().run_id;
    let info = s.wait_final(&run, WAIT_S).await;
    assert_eq!(info.state, TaskState::Failed as i32, "{info:#?}");
    let error = |info: &cairn_proto::v1::RunInfo| {
        info.nodes
            .iter()
            .find(|n| n.id == "coder")
            .unwrap()
            .error
            .clone()
    };
    let recorded_error = error(&info);
    assert!(
        recorded_error.contains("sandbox session"),
        "{recorded_error}"
    );
    let turns = turn_dirs(&s, &run).await;
    assert!(!turns.is_empty(), "no turn record of the failed turn");
    let record: Value =
        serde_json::from_str(&s.read_text(&format!("{}/turn.json", turns[0])).await).unwrap();
    assert_eq!(record["complete"], false, "{record:#}");
    assert!(
        record["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sandbox session"),
        "{record:#}"
    );
    assert!(record["error"]["kind"].is_string(), "{record:#}");

    let replayed = s.replay_with(&run, WAIT_S, |_| {}).await.unwrap();
    let again = s.get(&replayed).await;
    assert_eq!(again.state, TaskState::Failed as i32, "{again:#?}");
    assert_eq!(error(&again).replace(&replayed, &run), recorded_error);
    let v = s.verdict(&run, &replayed).await.0;
    assert_eq!(v["verdict"], "identical", "{v:#}");
    assert_eq!(turn_dirs(&s, &replayed).await.len(), turns.len());
    s.stop().await;
}
