//! What people decide on a run page, through `console_router` (a real artifact-store, a fake
//! orchestrator that records its calls): approving and rejecting a gate, a note, the context
//! manifest, cancel and rework, each sent as the logged-in person with what they typed, and a
//! refusal that keeps it.
#![allow(clippy::unwrap_used)]

mod console_support;

use axum::http::StatusCode;
use console_support::*;

#[tokio::test]
async fn approve_sends_the_logged_in_name_and_the_note() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(Some(TOKEN)));
    c.login("ann", Some(TOKEN)).await;
    let page = c.get(&run_url()).await;
    assert!(
        page.body
            .contains("action=\"/projects/proj/runs/run-1/gates/review/approve\""),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("formaction=\"/projects/proj/runs/run-1/gates/review/reject\""),
        "{}",
        page.body
    );
    let csrf = page.csrf();

    let p = c
        .post(
            &format!("{}/gates/review/approve", run_url()),
            &[("csrf", &csrf), ("note", "  Ship it.  ")],
        )
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    assert_eq!(p.location(), format!("{}#gates", run_url()));
    let calls = s.fake.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].method, "ApproveGate");
    assert_eq!(
        (
            calls[0].project_id.as_str(),
            calls[0].run_id.as_str(),
            calls[0].gate_id.as_str()
        ),
        (PROJECT, RUN, "review")
    );
    assert_eq!(calls[0].by, "ann");
    assert_eq!(calls[0].text, "Ship it.");

    let after = c.get(&run_url()).await;
    assert!(
        after
            .body
            .contains("Approved gate review of run run-1: the run goes on."),
        "{}",
        after.body
    );
    assert!(
        after.body.contains("data-state=\"completed\""),
        "{}",
        after.body
    );
    assert!(
        after.body.contains("by <strong>ann</strong>"),
        "{}",
        after.body
    );
    assert!(
        !after.body.contains("gates/review/approve"),
        "a decided gate has no buttons"
    );
    // The flash shows once.
    assert!(!c
        .get(&run_url())
        .await
        .body
        .contains("Approved gate review"));

    // Deciding again is refused by the orchestrator; the page says why, the note is kept.
    let p = c
        .post(
            &format!("{}/gates/review/reject", run_url()),
            &[("csrf", &csrf), ("note", "too late")],
        )
        .await;
    assert_eq!(p.status, StatusCode::CONFLICT);
    assert!(
        p.body
            .contains("rejecting gate review: gate `review` is not blocked"),
        "{}",
        p.body
    );
}

#[tokio::test]
async fn reject_sends_the_name_and_note() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(Some(TOKEN)));
    c.login("bob", Some(TOKEN)).await;
    let csrf = c.csrf().await;
    let p = c
        .post(
            &format!("{}/gates/review/reject", run_url()),
            &[("csrf", &csrf), ("note", "The draft cites no source.")],
        )
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    let calls = s.fake.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (
            calls[0].method,
            calls[0].by.as_str(),
            calls[0].text.as_str()
        ),
        ("RejectGate", "bob", "The draft cites no source.")
    );
    assert_eq!(
        s.fake.run(RUN).state,
        cairn_proto::v1::TaskState::Failed as i32
    );
    assert!(c
        .get(&run_url())
        .await
        .body
        .contains("Rejected gate review"));
}

#[tokio::test]
async fn note_context_cancel_and_rework_call_the_orchestrator_as_the_visitor() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(Some(TOKEN)));
    c.login("carol", Some(TOKEN)).await;
    let csrf = c.csrf().await;
    let run = run_url();

    let p = c
        .post(
            &format!("{run}/notes"),
            &[("csrf", &csrf), ("text", "Use **tabs**.\r\nNot spaces.")],
        )
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    assert_eq!(p.location(), format!("{run}#notes"));
    assert!(c
        .get(&run)
        .await
        .body
        .contains("Note added to run run-1 (shared/human-notes.md#note-2)."));
    // An empty note never reaches the orchestrator.
    let p = c
        .post(&format!("{run}/notes"), &[("csrf", &csrf), ("text", "   ")])
        .await;
    assert_eq!(p.status, StatusCode::BAD_REQUEST);
    assert!(p.body.contains("the note is empty"), "{}", p.body);

    let yaml = "attachments:\n  - id: spec\n    kind: file\n    path: docs/spec.md\n    reason: the spec\n";
    let p = c
        .post(
            &format!("{run}/context"),
            &[
                ("csrf", &csrf),
                ("manifest_yaml", &yaml.replace('\n', "\r\n")),
            ],
        )
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    // Refused by the orchestrator: 400, its message, and the typed text kept in the editor.
    let p = c
        .post(
            &format!("{run}/context"),
            &[("csrf", &csrf), ("manifest_yaml", "stuff: <1>")],
        )
        .await;
    assert_eq!(p.status, StatusCode::BAD_REQUEST);
    assert!(
        p.body
            .contains("saving the context manifest: not a context manifest"),
        "{}",
        p.body
    );
    assert!(
        p.body.contains(">stuff: &lt;1&gt;</textarea>"),
        "{}",
        p.body
    );

    let p = c
        .post(
            &format!("{run}/rework"),
            &[
                ("csrf", &csrf),
                ("node_id", "draft"),
                ("note", "cite sources"),
            ],
        )
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    // Cancel asks first: the first POST shows what stops, with the reason kept, and cancels
    // nothing; the confirmation's POST cancels.
    let p = c
        .post(
            &format!("{run}/cancel"),
            &[("csrf", &csrf), ("reason", "wrong goal")],
        )
        .await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    assert!(p.body.contains("id=\"cancel-confirm\""), "{}", p.body);
    assert!(p.body.contains("value=\"wrong goal\""), "{}", p.body);
    assert!(p.body.contains("Yes, cancel the run"), "{}", p.body);
    assert!(!s.fake.calls().iter().any(|c| c.method == "CancelRun"));
    let p = c
        .post(
            &format!("{run}/cancel"),
            &[
                ("csrf", &csrf),
                ("reason", "wrong goal"),
                ("confirm", "yes"),
            ],
        )
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    assert!(c.get(&run).await.body.contains("Run run-1 is canceled."));

    let calls: Vec<_> = s
        .fake
        .calls()
        .into_iter()
        .map(|c| (c.method, c.by, c.node_id, c.text))
        .collect();
    let carol = || "carol".to_owned();
    assert_eq!(
        calls,
        vec![
            (
                "AddNote",
                carol(),
                String::new(),
                "Use **tabs**.\nNot spaces.".to_owned()
            ),
            ("EditContext", carol(), String::new(), yaml.to_owned()),
            (
                "EditContext",
                carol(),
                String::new(),
                "stuff: <1>".to_owned()
            ),
            (
                "RequestRework",
                carol(),
                "draft".to_owned(),
                "cite sources".to_owned()
            ),
            ("CancelRun", carol(), String::new(), "wrong goal".to_owned()),
        ]
    );
}
