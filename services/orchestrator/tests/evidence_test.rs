//! The evidence index (`shared/evidence/index.json`) over real gRPC: files a node and ingest
//! wrote, sandbox commands and gate decisions become entries with ids that stay put, and a
//! gate decision may cite only ids the index holds.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::{GateDecisionRequest, TaskState};
use common::*;
use serde_json::Value;
use tonic::Code;

const GATED: &str = r#"
nodes:
  - id: draft
    type: write_file
    path: "docs/{{run_id}}/draft.md"
    content: "```python file=ev/{{run_id}}/app.py\nprint('hi')\n```\n"
  - {id: review, type: gate, reason: "check the draft", needs: [draft]}
  - {id: publish, type: write_file, path: "docs/{{run_id}}/ok.txt", content: "ok", needs: [review]}
"#;

fn decision(run: &str, note: &str) -> GateDecisionRequest {
    GateDecisionRequest {
        project_id: PROJECT.into(),
        run_id: run.into(),
        gate_id: "review".into(),
        by: "ann".into(),
        note: note.into(),
    }
}

async fn index(s: &Stack, run: &str, needle: &str) -> Vec<Value> {
    let text = s
        .wait_text(
            &format!(".cairn/runs/{run}/shared/evidence/index.json"),
            needle,
            15,
        )
        .await;
    serde_json::from_str(&text).unwrap()
}

fn entry<'a>(entries: &'a [Value], kind: &str, source: &str) -> &'a Value {
    entries
        .iter()
        .find(|e| e["kind"] == kind && e["source"] == source)
        .unwrap_or_else(|| panic!("no {kind} entry for {source} in {entries:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_a_gate_decision_are_evidence_with_stable_ids() {
    let s = Stack::start(Options::default()).await;
    let run = s.submit(GATED, &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::InputRequired, 20).await;
    let app = format!("workspace/ev/{run}/app.py");
    let at_gate = index(&s, &run, &app).await;
    let events = s.events(&run).await;

    // The node's own file and the file ingest wrote from its code block, each with its digest
    // and the id of the event that records it.
    let doc = entry(&at_gate, "file", &format!("docs/{run}/draft.md"));
    let written = events
        .iter()
        .find(|e| e.r#type == "artifact.written" && e.node_id == "draft")
        .unwrap();
    assert_eq!(doc["id"], format!("E{}", written.seq));
    assert_eq!(doc["sha256"], data(written)["sha256"]);
    assert_eq!(doc["node"], "draft");
    assert_eq!(doc["run"], run.as_str());
    let code = entry(&at_gate, "file", &app);
    assert_eq!(code["event"], "ingest.block.written");
    assert_eq!(
        code["sha256"],
        cairn_sha256::sha256_hex(&s.read(&app).await.unwrap())
    );

    // A decision citing an id the run does not hold is refused and changes nothing.
    let e = s
        .client
        .clone()
        .approve_gate(decision(&run, "fine, see evidence:E9999"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(
        cairn_proto::reason::of(&e).as_deref(),
        Some("unknown_evidence")
    );
    assert!(e.message().contains("evidence:E9999"), "{}", e.message());
    assert_eq!(s.get(&run).await.state, TaskState::InputRequired as i32);
    assert!(!s
        .read_text(&format!(".cairn/runs/{run}/shared/human-notes.md"))
        .await
        .contains("E9999"));

    // Citing a real one is taken, and the decision becomes a range over the wait.
    let cite = format!("fine, see evidence:{}", code["id"].as_str().unwrap());
    s.client
        .clone()
        .approve_gate(decision(&run, &cite))
        .await
        .unwrap();
    s.wait_state(&run, TaskState::Completed, 20).await;
    let done = index(&s, &run, "event_range").await;
    let events = s.events(&run).await;
    let blocked = events.iter().find(|e| e.r#type == "gate.blocked").unwrap();
    let approved = events.iter().find(|e| e.r#type == "gate.approved").unwrap();
    let range = entry(
        &done,
        "event_range",
        &format!("events.jsonl#{}-{}", blocked.seq, approved.seq),
    );
    assert_eq!(range["id"], format!("E{}", approved.seq));
    assert_eq!(range["detail"]["by"], "ann");
    assert_eq!(range["detail"]["decision"], "approved");
    let lines: Vec<&str> = events
        .iter()
        .filter(|e| e.seq >= blocked.seq && e.seq <= approved.seq)
        .map(|e| e.line_json.as_str())
        .collect();
    assert_eq!(
        range["sha256"],
        cairn_sha256::sha256_hex(lines.join("\n").as_bytes())
    );
    // Ids do not move as the run grows: what was cited at the gate is still there, unchanged.
    for e in &at_gate {
        assert!(done.contains(e), "{e} changed or vanished: {done:#?}");
    }
    // The published file is evidence too.
    entry(&done, "file", &format!("docs/{run}/ok.txt"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_command_is_evidence() {
    let Some(s) = Stack::with_sandbox("a_sandbox_command_is_evidence", |_| {}).await else {
        return;
    };
    let graph = r#"
nodes:
  - {id: check, type: sandbox_run, language: python, code: "print('checked')", timeout_s: 60}
"#;
    let run = s.submit(graph, &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::Completed, 90).await;
    let entries = index(&s, &run, "command").await;
    let events = s.events(&run).await;
    let done = events
        .iter()
        .find(|e| e.r#type == "sandbox_complete")
        .unwrap();
    let key = data(done)["step_key"].as_str().unwrap().to_owned();
    let cmd = entry(&entries, "command", &format!("step {key}"));
    assert_eq!(cmd["id"], format!("E{}", done.seq));
    assert_eq!(cmd["node"], "check");
    assert_eq!(cmd["detail"]["exit_code"], 0);
    assert_eq!(
        cmd["sha256"],
        cairn_sha256::sha256_hex(done.line_json.as_bytes())
    );
}
