//! Human in the loop: gates approved and rejected, notes given to later agents,
//! rework of a node and its dependents, context edits, cancel; each an event with by and ts.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::{
    AddNoteRequest, EditContextRequest, GateDecisionRequest, GateState, NodeState, ReworkRequest,
    RunActionRequest, SubmitRunRequest, TaskState,
};
use common::*;
use serde_json::Value;
use tonic::Code;

fn decision(run: &str, gate: &str, by: &str, note: &str) -> GateDecisionRequest {
    GateDecisionRequest {
        project_id: PROJECT.into(),
        run_id: run.into(),
        gate_id: gate.into(),
        by: by.into(),
        note: note.into(),
    }
}

const GATED: &str = r#"
nodes:
  - {id: draft, type: write_file, path: "docs/{{run_id}}/draft.txt", content: draft}
  - {id: review, type: gate, reason: "check {{nodes.draft.path}}", needs: [draft], instructions: "read docs/{{run_id}}/draft.txt first"}
  - {id: publish, type: write_file, path: "docs/{{run_id}}/published.txt", content: "ok by {{nodes.review.by}}"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_gate_continues_the_run() {
    let s = Stack::start(Options::default()).await;
    let run = s.submit(GATED, &[]).await.unwrap().run_id;
    let blocked = s.wait_state(&run, TaskState::InputRequired, 20).await;
    let gate = &blocked.gates[0];
    assert_eq!(gate.state, GateState::Blocked as i32);
    assert_eq!(gate.reason, format!("check docs/{run}/draft.txt"));
    assert!(
        s.read(&format!("docs/{run}/published.txt")).await.is_none(),
        "nothing passes a blocked gate"
    );
    let yaml = s
        .wait_text(
            &format!(".cairn/runs/{run}/task.yaml"),
            "state: input-required",
            10,
        )
        .await;
    let task: Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(task["state"], "input-required");
    assert_eq!(task["gates"][0]["state"], "blocked");
    let readme = s
        .wait_text(
            &format!(".cairn/runs/{run}/README.md"),
            "Waiting for you",
            10,
        )
        .await;
    assert!(
        readme.contains("Waiting for you")
            && readme.contains(&format!("cairn gate approve {run} review"))
            && readme.contains(&format!("read docs/{run}/draft.txt first")),
        "{readme}"
    );

    // Approving an unknown gate or a non-gate is refused.
    let e = s
        .client
        .clone()
        .approve_gate(decision(&run, "nope", "ann", ""))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = s
        .client
        .clone()
        .approve_gate(decision(&run, "draft", "ann", ""))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    let info = s
        .client
        .clone()
        .approve_gate(decision(&run, "review", "ann", "looks right"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.gates[0].state, GateState::Approved as i32);
    assert_eq!(info.gates[0].decided_by, "ann");
    let done = s.wait_state(&run, TaskState::Completed, 20).await;
    assert_eq!(
        s.read_text(&format!("docs/{run}/published.txt")).await,
        "ok by ann"
    );
    assert_eq!(done.gates[0].note, "looks right");
    let events = s.events(&run).await;
    let blocked = events.iter().find(|e| e.r#type == "gate.blocked").unwrap();
    assert_eq!(
        data(blocked)["reason"],
        format!("check docs/{run}/draft.txt")
    );
    let approved = events.iter().find(|e| e.r#type == "gate.approved").unwrap();
    assert_eq!(data(approved)["by"], "ann");
    assert!(!approved.ts.is_empty());
    assert_eq!(data(approved)["note_ref"], "shared/human-notes.md#note-1");
    assert!(events.iter().any(|e| e.r#type == "task.input-required"));
    let notes = s
        .read_text(&format!(".cairn/runs/{run}/shared/human-notes.md"))
        .await;
    assert!(
        notes.contains("<a id=\"note-1\"></a>")
            && notes.contains("approval of gate `review`")
            && notes.contains("looks right"),
        "{notes}"
    );
    // A decided gate cannot be decided again.
    let e = s
        .client
        .clone()
        .reject_gate(decision(&run, "review", "bob", ""))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_gate_fails_the_run_or_continues_when_told() {
    let s = Stack::start(Options::default()).await;
    let run = s.submit(GATED, &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::InputRequired, 20).await;
    s.client
        .clone()
        .reject_gate(decision(&run, "review", "bob", "not good"))
        .await
        .unwrap();
    let failed = s.wait_state(&run, TaskState::Failed, 20).await;
    assert!(
        failed
            .error
            .contains("gate `review` rejected by bob: not good"),
        "{}",
        failed.error
    );
    assert_eq!(failed.gates[0].state, GateState::Rejected as i32);
    assert!(s.read(&format!("docs/{run}/published.txt")).await.is_none());
    let events = s.events(&run).await;
    let rejected = events.iter().find(|e| e.r#type == "gate.rejected").unwrap();
    assert_eq!(data(rejected)["by"], "bob");

    let graph = r#"
nodes:
  - {id: review, type: gate, on_reject: continue}
  - {id: accepted, type: write_file, path: "docs/{{run_id}}/yes.txt", content: y, when: "nodes.review.approved"}
  - {id: declined, type: write_file, path: "docs/{{run_id}}/no.txt", content: "n: {{nodes.review.note}}", when: "!nodes.review.approved"}
"#;
    let run = s.submit(graph, &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::InputRequired, 20).await;
    s.client
        .clone()
        .reject_gate(decision(&run, "review", "bob", "rewrite"))
        .await
        .unwrap();
    let done = s.wait_state(&run, TaskState::Completed, 20).await;
    assert_eq!(
        s.read_text(&format!("docs/{run}/no.txt")).await,
        "n: rewrite"
    );
    assert!(s.read(&format!("docs/{run}/yes.txt")).await.is_none());
    assert_eq!(
        done.nodes
            .iter()
            .find(|n| n.id == "accepted")
            .unwrap()
            .state,
        NodeState::Skipped as i32
    );
    s.stop().await;
}

const AGENTS: &str = r#"
nodes:
  - {id: author, type: agent_task, prompt: "write it", path: "docs/{{run_id}}/doc.md"}
  - {id: wait, type: gate, needs: [author]}
  - {id: editor, type: agent_task, prompt: "edit: {{nodes.author.text}}", path: "docs/{{run_id}}/edited.md"}
"#;

const CASSETTE: &str = "answers:\n  - {node: author, content: first version}\n  - {node: author, turn: 2, content: second version}\n  - {node: editor, content: edited}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notes_reach_later_agents_and_rework_reruns_dependents() {
    let s = Stack::start(Options::default()).await;
    let llm = cassette(s.dir.path(), "c.yaml", CASSETTE);
    let req = SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: AGENTS.into(),
        llm,
        ..Default::default()
    };
    let run = s.submit_req(req).await.unwrap().run_id;
    s.wait_state(&run, TaskState::InputRequired, 20).await;

    // A note while the run waits; the next agent gets it as high-priority context.
    let note = s
        .client
        .clone()
        .add_note(AddNoteRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            by: "ann".into(),
            text: "Use British spelling.".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(note.r#ref, "shared/human-notes.md#note-1");
    let events = s.events(&run).await;
    let ev = events.iter().find(|e| e.seq == note.seq).unwrap();
    assert_eq!(ev.r#type, "human.note");
    assert_eq!(data(ev)["by"], "ann");

    // Context edits: refused when malformed, recorded when valid.
    let bad = EditContextRequest {
        project_id: PROJECT.into(),
        run_id: run.clone(),
        by: "ann".into(),
        manifest_yaml: "attachments: [{id: x, kind: file, path: ../etc}]".into(),
    };
    assert_eq!(
        s.client.clone().edit_context(bad).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let manifest = format!("attachments:\n  - {{id: draft, kind: file, path: docs/{run}/doc.md, reason: the first draft}}\n");
    let good = EditContextRequest {
        project_id: PROJECT.into(),
        run_id: run.clone(),
        by: "ann".into(),
        manifest_yaml: manifest.clone(),
    };
    let seq = s
        .client
        .clone()
        .edit_context(good)
        .await
        .unwrap()
        .into_inner()
        .seq;
    assert_eq!(
        s.read_text(&format!(".cairn/runs/{run}/shared/context-manifest.yaml"))
            .await,
        manifest
    );
    let events = s.events(&run).await;
    assert_eq!(
        events.iter().find(|e| e.seq == seq).unwrap().r#type,
        "context.edited"
    );

    s.client
        .clone()
        .approve_gate(decision(&run, "wait", "ann", ""))
        .await
        .unwrap();
    s.wait_state(&run, TaskState::Completed, 20).await;
    let requests = s
        .read_text(&format!(
            ".cairn/runs/{run}/agents/editor/runtime/requests.jsonl"
        ))
        .await;
    assert!(
        requests.contains("Human notes for this run") && requests.contains("Use British spelling."),
        "{requests}"
    );
    assert!(
        requests.contains("Context file `docs/") && requests.contains("the first draft"),
        "{requests}"
    );
    assert!(s
        .read_text(&format!("docs/{run}/doc.md"))
        .await
        .ends_with("first version"));

    // Rework of the author: it runs again (turn 2), the gate blocks again, the editor reruns.
    let info = s
        .client
        .clone()
        .request_rework(ReworkRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            node_id: "author".into(),
            by: "ann".into(),
            note: "make it shorter".into(),
            from_snapshot: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(info.state, TaskState::Completed as i32);
    s.wait_state(&run, TaskState::InputRequired, 20).await;
    assert!(s
        .read_text(&format!("docs/{run}/doc.md"))
        .await
        .ends_with("second version"));
    s.client
        .clone()
        .approve_gate(decision(&run, "wait", "ann", ""))
        .await
        .unwrap();
    let done = s.wait_state(&run, TaskState::Completed, 20).await;
    let author: Value = serde_json::from_str(
        &done
            .nodes
            .iter()
            .find(|n| n.id == "author")
            .unwrap()
            .outputs_json,
    )
    .unwrap();
    assert_eq!(author["turn"], 2);
    let events = s.events(&run).await;
    let rework = events
        .iter()
        .find(|e| e.r#type == "artifact.rework-requested")
        .unwrap();
    assert_eq!(data(rework)["by"], "ann");
    assert_eq!(
        data(rework)["nodes"],
        serde_json::json!(["author", "wait", "editor"])
    );
    let editor_done = events
        .iter()
        .filter(|e| e.r#type == "node.completed" && e.node_id == "editor")
        .count();
    assert_eq!(editor_done, 2, "the dependent ran again");
    let requests = s
        .read_text(&format!(
            ".cairn/runs/{run}/agents/author/runtime/requests.jsonl"
        ))
        .await;
    assert!(
        requests.lines().last().unwrap().contains("make it shorter"),
        "the rework note reaches the agent"
    );
    let notes = s
        .read_text(&format!(".cairn/runs/{run}/shared/human-notes.md"))
        .await;
    assert!(notes.contains("rework of node `author`") && notes.contains("make it shorter"));

    // Unknown node.
    let e = s
        .client
        .clone()
        .request_rework(ReworkRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            node_id: "ghost".into(),
            by: "ann".into(),
            note: String::new(),
            from_snapshot: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_at_a_gate_and_resume_rules() {
    let s = Stack::start(Options::default()).await;
    let run = s.submit(GATED, &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::InputRequired, 20).await;
    let info = s
        .client
        .clone()
        .cancel_run(RunActionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            by: "carol".into(),
            reason: "changed my mind".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.state, TaskState::Canceled as i32);
    let events = s.events(&run).await;
    let c = events.iter().find(|e| e.r#type == "task.canceled").unwrap();
    assert_eq!(data(c)["by"], "carol");
    assert_eq!(data(c)["reason"], "changed my mind");
    // A canceled run stays canceled.
    let e = s
        .client
        .clone()
        .resume_run(RunActionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            by: "carol".into(),
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let e = s
        .client
        .clone()
        .approve_gate(decision(&run, "review", "ann", ""))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let yaml = s
        .wait_text(
            &format!(".cairn/runs/{run}/task.yaml"),
            "state: canceled",
            10,
        )
        .await;
    let task: Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(task["state"], "canceled");
    // The gate no longer waits: task.yaml and GetRun say so.
    assert_eq!(task["gates"][0]["state"], "canceled", "{yaml}");
    assert_eq!(info.gates[0].state, GateState::Canceled as i32);

    // ResumeRun retries a failed run's failed node.
    let graph =
        "nodes:\n  - {id: r, type: tool_call, tool: read_file, args: {path: docs/later.txt}}\n";
    let run = s.submit(graph, &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::Failed, 20).await;
    s.store
        .clone()
        .put(tokio_stream::iter(vec![
            cairn_proto::v1::PutRequest {
                msg: Some(cairn_proto::v1::put_request::Msg::Header(
                    cairn_proto::v1::PutHeader {
                        project_id: PROJECT.into(),
                        path: "docs/later.txt".into(),
                        ..Default::default()
                    },
                )),
            },
            cairn_proto::v1::PutRequest {
                msg: Some(cairn_proto::v1::put_request::Msg::Chunk(
                    bytes::Bytes::from_static(b"now here"),
                )),
            },
        ]))
        .await
        .unwrap_or_else(|_| panic!("put"));
    s.client
        .clone()
        .resume_run(RunActionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            by: "carol".into(),
            reason: "file added".into(),
        })
        .await
        .unwrap();
    let done = s.wait_state(&run, TaskState::Completed, 20).await;
    let r: Value = serde_json::from_str(&done.nodes[0].outputs_json).unwrap();
    assert_eq!(r["text"], "now here");
    assert!(s
        .events(&run)
        .await
        .iter()
        .any(|e| e.r#type == "task.resumed" && data(e)["by"] == "carol"));
    s.stop().await;
}

/// Puts `text` at `path` as a person would (no claim on the run).
async fn put_by_hand(s: &Stack, path: &str, text: &str) -> Result<(), tonic::Status> {
    use cairn_proto::v1::{put_request, PutHeader, PutRequest};
    let msgs = vec![
        PutRequest {
            msg: Some(put_request::Msg::Header(PutHeader {
                project_id: PROJECT.into(),
                path: path.into(),
                overwrite: true,
                ..Default::default()
            })),
        },
        PutRequest {
            msg: Some(put_request::Msg::Chunk(text.as_bytes().to_vec().into())),
        },
    ];
    s.store
        .clone()
        .put(tokio_stream::iter(msgs))
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_yaml_edits_are_applied_and_other_edits_refused() {
    let s = Stack::start(Options::default()).await;
    let run = s.submit(GATED, &[]).await.unwrap().run_id;
    s.wait_state(&run, TaskState::InputRequired, 20).await;
    let path = format!(".cairn/runs/{run}/task.yaml");
    let yaml = s.wait_text(&path, "state: input-required", 10).await;
    assert!(yaml.contains("You may edit title, goal"), "{yaml}");

    // Anything but the editable fields is refused, naming the field; nothing changes.
    let forged = yaml.replace("state: input-required", "state: completed");
    let e = put_by_hand(&s, &path, &forged).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(cairn_proto::reason::of(&e).as_deref(), Some("not_editable"));
    assert!(e.message().contains("`state`"), "{}", e.message());
    assert_eq!(s.read_text(&path).await, yaml);
    // So is deleting it.
    let e = s
        .store
        .clone()
        .delete(cairn_proto::v1::DeleteRequest {
            project_id: PROJECT.into(),
            path: path.clone(),
            run_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(cairn_proto::reason::of(&e).as_deref(), Some("not_editable"));

    // A new title, goal and a milestone note are accepted...
    let mut task: Value = serde_saphyr::from_str(&yaml).unwrap();
    task["title"] = "Reviewed draft".into();
    task["goal"] = "Ship the draft once reviewed".into();
    task["milestones"][0]["note"] = "keep it short".into();
    let edited = serde_saphyr::to_string(&task).unwrap();
    put_by_hand(&s, &path, &edited).await.unwrap();

    // ... applied at the next step as a task.edited event, and never reverted.
    s.client
        .clone()
        .approve_gate(decision(&run, "review", "ann", ""))
        .await
        .unwrap();
    let done = s.wait_state(&run, TaskState::Completed, 20).await;
    assert_eq!(done.title, "Reviewed draft");
    let events = s.events(&run).await;
    let edit = events
        .iter()
        .find(|e| e.r#type == "task.edited")
        .expect("a task.edited event");
    let changes = data(edit)["changes"].clone();
    let fields: Vec<&str> = changes
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["title", "goal", "milestone_note"], "{changes}");
    assert_eq!(changes[2]["id"], "draft");
    let after = s.wait_text(&path, "state: completed", 10).await;
    let after: Value = serde_saphyr::from_str(&after).unwrap();
    assert_eq!(after["title"], "Reviewed draft");
    assert_eq!(after["goal"], "Ship the draft once reviewed");
    assert_eq!(after["milestones"][0]["note"], "keep it short");
}
