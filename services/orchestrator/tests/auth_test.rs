//! Humans as principals over real gRPC on loopback: with a tokens file every call needs a bearer
//! token, each role may make exactly the calls of its row in the table, a project-scoped token
//! acts on its projects only, the recorded `by` is the token's name whatever the client sends,
//! and every refusal is logged with who, from where, which call and why.
#![allow(clippy::unwrap_used)]

mod auth_support;
mod common;

use std::time::Duration;

use auth_support::*;
use cairn_orchestrator::auth::tokens::TokensFile;
use cairn_orchestrator::auth::Role;
use cairn_proto::v1::{
    AddNoteRequest, DiffRunsRequest, EditContextRequest, EditTaskRequest, GateDecisionRequest,
    GetRunRequest, ListRunsRequest, ReplayRunRequest, ReworkRequest, RunActionRequest,
    SubmitRunRequest, TaskState, WatchLogsRequest, WatchRunRequest, WhoAmIRequest,
};
use common::{data, read_events, read_file, PROJECT};
use tonic::{Code, Request, Status};

const SIMPLE: &str =
    "nodes:\n  - {id: a, type: write_file, path: 'docs/{{run_id}}/a.txt', content: a}\n";

#[track_caller]
fn allowed<T: std::fmt::Debug>(what: &str, r: Result<T, Status>) {
    if let Err(e) = &r {
        assert!(
            !matches!(e.code(), Code::PermissionDenied | Code::Unauthenticated),
            "{what} must be allowed: {e:?}"
        );
    }
}

#[track_caller]
fn denied<T: std::fmt::Debug>(what: &str, r: Result<T, Status>, reason: &str) {
    let e = r.expect_err(what);
    assert_eq!(e.code(), Code::PermissionDenied, "{what}: {e:?}");
    assert_eq!(
        cairn_proto::reason::of(&e).as_deref(),
        Some(reason),
        "{what}: {e:?}"
    );
}

fn ok<T>(r: Result<tonic::Response<T>, Status>) -> Result<(), Status> {
    r.map(|_| ())
}

fn decision(project: &str, run: &str, by: &str, note: &str) -> GateDecisionRequest {
    GateDecisionRequest {
        project_id: project.into(),
        run_id: run.into(),
        gate_id: "review".into(),
        by: by.into(),
        note: note.into(),
    }
}

fn action(project: &str, run: &str, by: &str) -> RunActionRequest {
    RunActionRequest {
        project_id: project.into(),
        run_id: run.into(),
        by: by.into(),
        reason: "test".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_wrong_token_is_unauthenticated_and_logged() {
    let s = Secured::start(true).await;
    let mut c = s.client();
    let get = || GetRunRequest {
        project_id: PROJECT.into(),
        run_id: "r1".into(),
    };
    let e = c.get_run(get()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("token"), "{e:?}");
    let e = c
        .get_run(as_("cairn_0123456789abcdef0123456789abcdef", get()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let mut basic = Request::new(get());
    basic
        .metadata_mut()
        .insert("authorization", s.token("ada").parse().unwrap());
    assert_eq!(
        c.get_run(basic).await.unwrap_err().code(),
        Code::Unauthenticated,
        "the token without `Bearer ` is not accepted"
    );
    // A write without a token leaves nothing behind.
    let e = c
        .submit_run(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: SIMPLE.into(),
            run_id: "forged".into(),
            by: "ada".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(read_file(&s.store, ".cairn/runs/forged/task.yaml")
        .await
        .is_none());
    let logs = logged();
    let line = logs
        .lines()
        .find(|l| l.contains("call refused") && l.contains("SubmitRun"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{logs}"));
    assert!(
        line.contains("WARN")
            && line.contains("anonymous")
            && line.contains("127.0.0.1")
            && line.contains("unauthenticated"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_may_make_the_calls_of_its_row_and_no_others() {
    let s = Secured::start(true).await;
    for (name, role) in [
        ("vic", Role::Viewer),
        ("ozzy", Role::Operator),
        ("ann", Role::Approver),
        ("ada", Role::Admin),
    ] {
        let t = s.token(name);
        let mut c = s.client();
        let (approve_run, reject_run, cancel_run) = (
            s.blocked_run(PROJECT).await,
            s.blocked_run(PROJECT).await,
            s.blocked_run(PROJECT).await,
        );
        let at_least = |r: Role| role >= r;
        let expect = |what: &str, needed: Role, r: Result<(), Status>| {
            if at_least(needed) {
                allowed(&format!("{name}: {what}"), r)
            } else {
                denied(&format!("{name}: {what}"), r, "role")
            }
        };

        // Read: everybody.
        expect(
            "GetRun",
            Role::Viewer,
            ok(c.get_run(as_(
                &t,
                GetRunRequest {
                    project_id: PROJECT.into(),
                    run_id: approve_run.clone(),
                },
            ))
            .await),
        );
        expect(
            "ListRuns",
            Role::Viewer,
            ok(c.list_runs(as_(
                &t,
                ListRunsRequest {
                    project_id: PROJECT.into(),
                    ..Default::default()
                },
            ))
            .await),
        );
        let watch = c
            .watch_run(as_(
                &t,
                WatchRunRequest {
                    project_id: PROJECT.into(),
                    run_id: approve_run.clone(),
                    from_seq: 1,
                    follow_after_end: false,
                },
            ))
            .await;
        let first = watch
            .unwrap()
            .into_inner()
            .message()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.r#type, "task.created");

        // Operator and above.
        expect(
            "SubmitRun",
            Role::Operator,
            ok(c.submit_run(as_(
                &t,
                SubmitRunRequest {
                    project_id: PROJECT.into(),
                    graph_yaml: SIMPLE.into(),
                    ..Default::default()
                },
            ))
            .await),
        );
        expect(
            "AddNote",
            Role::Operator,
            ok(c.add_note(as_(
                &t,
                AddNoteRequest {
                    project_id: PROJECT.into(),
                    run_id: approve_run.clone(),
                    by: String::new(),
                    text: "a note".into(),
                },
            ))
            .await),
        );
        expect(
            "EditContext",
            Role::Operator,
            ok(c.edit_context(as_(
                &t,
                EditContextRequest {
                    project_id: PROJECT.into(),
                    run_id: approve_run.clone(),
                    by: String::new(),
                    manifest_yaml: "attachments: []\n".into(),
                },
            ))
            .await),
        );
        expect(
            "EditTask",
            Role::Operator,
            ok(c.edit_task(as_(
                &t,
                EditTaskRequest {
                    project_id: PROJECT.into(),
                    run_id: approve_run.clone(),
                    goal: Some(format!("a goal set by {name}")),
                    ..Default::default()
                },
            ))
            .await),
        );
        expect(
            "ResumeRun",
            Role::Operator,
            ok(c.resume_run(as_(&t, action(PROJECT, &approve_run, "")))
                .await),
        );
        let cancel = ok(c
            .cancel_run(as_(&t, action(PROJECT, &cancel_run, "")))
            .await);
        if at_least(Role::Operator) {
            cancel.unwrap();
        } else {
            denied(&format!("{name}: CancelRun"), cancel, "role");
        }

        // Approver and above.
        let approve = ok(c
            .approve_gate(as_(&t, decision(PROJECT, &approve_run, "", "")))
            .await);
        let reject = ok(c
            .reject_gate(as_(&t, decision(PROJECT, &reject_run, "", "")))
            .await);
        if at_least(Role::Approver) {
            approve.unwrap();
            reject.unwrap();
            s.wait_state(PROJECT, &approve_run, TaskState::Completed)
                .await;
        } else {
            denied(&format!("{name}: ApproveGate"), approve, "role");
            denied(&format!("{name}: RejectGate"), reject, "role");
            let info = s.get(PROJECT, &approve_run).await;
            assert_eq!(info.state, TaskState::InputRequired as i32, "{name}");
        }
        // A rework comes last: it reruns the draft of the approved (or still blocked) run.
        expect(
            "RequestRework",
            Role::Operator,
            ok(c.request_rework(as_(
                &t,
                ReworkRequest {
                    project_id: PROJECT.into(),
                    run_id: approve_run.clone(),
                    node_id: "draft".into(),
                    by: String::new(),
                    note: String::new(),
                    from_snapshot: false,
                },
            ))
            .await),
        );
    }
    let logs = logged();
    assert!(
        logs.lines().any(|l| l.contains("call refused")
            && l.contains("vic")
            && l.contains("ApproveGate")
            && l.contains("role")),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorded_by_is_the_tokens_name_whatever_the_client_sends() {
    let s = Secured::start(true).await;
    let mut c = s.client();
    let run = c
        .submit_run(as_(
            &s.token("ozzy"),
            SubmitRunRequest {
                project_id: PROJECT.into(),
                graph_yaml: GATED.into(),
                by: "mallory".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    s.wait_state(PROJECT, &run, TaskState::InputRequired).await;
    let (seq, _) = {
        let r = c
            .add_note(as_(
                &s.token("ozzy"),
                AddNoteRequest {
                    project_id: PROJECT.into(),
                    run_id: run.clone(),
                    by: "mallory".into(),
                    text: "use tabs".into(),
                },
            ))
            .await
            .unwrap()
            .into_inner();
        (r.seq, r.r#ref)
    };
    assert!(seq > 0);
    let info = c
        .approve_gate(as_(
            &s.token("ann"),
            decision(PROJECT, &run, "mallory", "looks right"),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.gates[0].decided_by, "ann");
    s.wait_state(PROJECT, &run, TaskState::Completed).await;

    let events = read_events(&s.store, &run).await;
    let by_of = |kind: &str| {
        let e = events
            .iter()
            .find(|e| e.r#type == kind)
            .unwrap_or_else(|| panic!("no {kind}"));
        data(e)["by"].as_str().unwrap_or_default().to_owned()
    };
    assert_eq!(by_of("task.created"), "ozzy");
    assert_eq!(by_of("human.note"), "ozzy");
    assert_eq!(by_of("gate.approved"), "ann");
    assert!(
        !events.iter().any(|e| e.data_json.contains("mallory")),
        "the client's name is recorded nowhere: {events:?}"
    );
    let notes = String::from_utf8(
        read_file(
            &s.store,
            &format!(".cairn/runs/{run}/shared/human-notes.md"),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    assert!(
        notes.contains("(by ozzy,") && notes.contains("(by ann,") && !notes.contains("mallory"),
        "{notes}"
    );
    let task = String::from_utf8(
        read_file(&s.store, &format!(".cairn/runs/{run}/task.yaml"))
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(!task.contains("mallory"), "{task}");

    // Cancel too.
    let other = s.blocked_run(PROJECT).await;
    c.cancel_run(as_(&s.token("ozzy"), action(PROJECT, &other, "mallory")))
        .await
        .unwrap();
    let events = read_events(&s.store, &other).await;
    let canceled = events.iter().find(|e| e.r#type == "task.canceled").unwrap();
    assert_eq!(data(canceled)["by"], "ozzy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_scoped_token_cannot_act_on_another_projects_run() {
    let s = Secured::start(true).await;
    let mut c = s.client();
    let theirs = s.blocked_run(OTHER).await;
    let pat = s.token("pat");
    denied(
        "approve in another project",
        c.approve_gate(as_(&pat, decision(OTHER, &theirs, "", "")))
            .await,
        "project",
    );
    denied(
        "read another project's run",
        c.get_run(as_(
            &pat,
            GetRunRequest {
                project_id: OTHER.into(),
                run_id: theirs.clone(),
            },
        ))
        .await,
        "project",
    );
    denied(
        "list another project",
        c.list_runs(as_(
            &pat,
            ListRunsRequest {
                project_id: OTHER.into(),
                ..Default::default()
            },
        ))
        .await,
        "project",
    );
    denied(
        "note on another project's run",
        c.add_note(as_(
            &pat,
            AddNoteRequest {
                project_id: OTHER.into(),
                run_id: theirs.clone(),
                by: String::new(),
                text: "x".into(),
            },
        ))
        .await,
        "project",
    );
    assert_eq!(
        s.get(OTHER, &theirs).await.state,
        TaskState::InputRequired as i32,
        "the other project's gate is still blocked"
    );
    // In its own project it acts as its role allows.
    let mine = s.blocked_run(PROJECT).await;
    c.approve_gate(as_(&pat, decision(PROJECT, &mine, "", "")))
        .await
        .unwrap();
    s.wait_state(PROJECT, &mine, TaskState::Completed).await;
    assert!(logged()
        .lines()
        .any(|l| l.contains("call refused") && l.contains("pat") && l.contains("project")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_am_i_and_token_file_changes_without_a_restart() {
    let s = Secured::start(true).await;
    let mut c = s.client();
    let me = c
        .who_am_i(as_(&s.token("pat"), WhoAmIRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            me.name.as_str(),
            me.role.as_str(),
            me.projects.clone(),
            me.tokens_required
        ),
        ("pat", "approver", vec![PROJECT.to_owned()], true)
    );
    assert_eq!(
        c.who_am_i(WhoAmIRequest {}).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    // Removing a person revokes the token; a new one works; no restart.
    let mut file = TokensFile::read(&s.tokens_file).unwrap();
    file.remove("ann").unwrap();
    let bob = file.add("bob", Role::Viewer, &[]).unwrap();
    file.write(&s.tokens_file).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ann = c.who_am_i(as_(&s.token("ann"), WhoAmIRequest {})).await;
        let b = c.who_am_i(as_(&bob, WhoAmIRequest {})).await;
        if let (Err(e), Ok(me)) = (&ann, &b) {
            if e.code() == Code::Unauthenticated {
                assert_eq!(me.get_ref().name, "bob");
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the change was not picked up: {ann:?} {b:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A broken file keeps the tokens that were in force.
    std::fs::write(&s.tokens_file, "not = [valid").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        c.who_am_i(as_(&bob, WhoAmIRequest {}))
            .await
            .unwrap()
            .into_inner()
            .name,
        "bob"
    );
    drop(s.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_tokens_file_calls_need_no_token_and_keep_the_clients_name() {
    let s = Secured::start(false).await;
    let mut c = s.client();
    let me = c.who_am_i(WhoAmIRequest {}).await.unwrap().into_inner();
    assert_eq!(
        (me.name.as_str(), me.role.as_str(), me.tokens_required),
        ("local", "admin", false)
    );
    let run = c
        .submit_run(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: GATED.into(),
            by: "ann".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while c
        .get_run(GetRunRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .state
        != TaskState::InputRequired as i32
    {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let info = c
        .approve_gate(decision(PROJECT, &run, "bob", ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.gates[0].decided_by, "bob");
}

/// WatchLogs is a read: a viewer may follow a run's output, a token scoped to another project
/// may not, and without a token (a tokens file being set) nobody may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_logs_needs_a_viewer_token_of_the_runs_project() {
    let s = Secured::start(true).await;
    let mut c = s.client();
    let ours = s.blocked_run(PROJECT).await;
    let theirs = s.blocked_run(OTHER).await;
    let req = |project: &str, run: &str| WatchLogsRequest {
        project_id: project.into(),
        run_id: run.into(),
        follow: false,
        ..Default::default()
    };
    // A viewer reads the (empty) output of a run; the stream ends without error.
    let mut stream = c
        .watch_logs(as_(&s.token("vic"), req(PROJECT, &ours)))
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().is_none());
    // pat's token is for PROJECT only.
    allowed(
        "pat on its project",
        ok(c.watch_logs(as_(&s.token("pat"), req(PROJECT, &ours)))
            .await),
    );
    denied(
        "pat on another project",
        ok(c.watch_logs(as_(&s.token("pat"), req(OTHER, &theirs)))
            .await),
        "project",
    );
    let e = c.watch_logs(req(PROJECT, &ours)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
}

/// Guessing tokens over gRPC: after 30 wrong tokens from one address, that address gets
/// RESOURCE_EXHAUSTED with the seconds to wait (even for a right token), while a right token
/// from another address still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_from_one_address_are_throttled_and_other_addresses_are_not() {
    let s = Secured::start(true).await;
    let mut c = s.client();
    let list = || ListRunsRequest {
        project_id: PROJECT.into(),
        ..Default::default()
    };
    for i in 0..30 {
        let e = c
            .list_runs(as_(&format!("cairn_wrong_guess_{i:02}"), list()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "guess {i}: {e:?}");
    }
    for token in ["cairn_wrong_guess_30".to_owned(), s.token("ada")] {
        let e = c.list_runs(as_(&token, list())).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        let wait: u64 = e
            .metadata()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("a retry-after in seconds: {e:?}"));
        assert!((1..=60).contains(&wait), "{wait}");
        assert!(e.message().contains("retry"), "{e:?}");
    }
    // Another address of this machine is not held up.
    let other = tonic::transport::Endpoint::from_shared(format!("http://{}", s.orch_addr))
        .unwrap()
        .local_address(Some([127, 0, 0, 2].into()))
        .connect()
        .await
        .unwrap();
    let mut other = cairn_proto::v1::orchestrator_client::OrchestratorClient::new(other);
    let me = other
        .who_am_i(as_(&s.token("ada"), WhoAmIRequest {}))
        .await
        .unwrap();
    assert_eq!(me.into_inner().name, "ada");
}

/// A replay is a submit that reads the recorded run: a viewer may compare runs (DiffRuns) and
/// not replay one; a token scoped to one project may neither replay nor compare another
/// project's runs; an operator (and the scoped token in its own project) may replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_needs_a_submitters_role_in_the_recorded_runs_project() {
    let s = Secured::start(true).await;
    let mut c = s.client();
    let (mine, theirs) = (s.blocked_run(PROJECT).await, s.blocked_run(OTHER).await);
    let replay = |project: &str, run: &str| ReplayRunRequest {
        project_id: project.into(),
        run_id: run.into(),
        ..Default::default()
    };
    let diff = |project: &str, run: &str| DiffRunsRequest {
        project_id: project.into(),
        run_a: run.into(),
        run_b: run.into(),
    };
    denied(
        "a viewer replays",
        c.replay_run(as_(&s.token("vic"), replay(PROJECT, &mine)))
            .await,
        "role",
    );
    allowed(
        "a viewer compares",
        c.diff_runs(as_(&s.token("vic"), diff(PROJECT, &mine)))
            .await,
    );
    denied(
        "a scoped token replays another project's run",
        c.replay_run(as_(&s.token("pat"), replay(OTHER, &theirs)))
            .await,
        "project",
    );
    denied(
        "a scoped token compares another project's runs",
        c.diff_runs(as_(&s.token("pat"), diff(OTHER, &theirs)))
            .await,
        "project",
    );
    for who in ["ozzy", "pat"] {
        let info = c
            .replay_run(as_(&s.token(who), replay(PROJECT, &mine)))
            .await
            .unwrap_or_else(|e| panic!("{who} replays: {e:?}"))
            .into_inner();
        assert_eq!(info.replay_of, mine, "{who}");
    }
    assert!(logged()
        .lines()
        .any(|l| l.contains("call refused") && l.contains("vic") && l.contains("ReplayRun")));
}
