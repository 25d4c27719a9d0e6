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

/// The `href` of the link the page gives citation `evidence:<id>` (None when it is no link).
fn cite_href<'a>(html: &'a str, id: &str) -> Option<&'a str> {
    let end = html.find(&format!("data-evidence=\"{id}\">evidence:{id}</a>"))?;
    let tag = &html[html[..end].rfind("<a class=\"evidence\"")?..end];
    let from = tag.find("href=\"")? + "href=\"".len();
    Some(&tag[from..from + tag[from..].find('"')?])
}

/// A gate note, a human note or a run's report citing `evidence:<id>` links to what the run's
/// evidence index (shared/evidence/index.json) says the id is: a file to the file, a gate's
/// wait to its first event on the run page, a command to its node's output at that attempt.
/// An id the index does not hold, and a citation in code, stay text.
#[tokio::test]
async fn cited_evidence_links_to_the_entry_it_names() {
    let s = Services::start().await;
    let dir = format!(".cairn/runs/{RUN}");
    let index = [
        r#"{"id":"E2","kind":"file","source":"docs/run-1/draft.txt","sha256":"aa","run":"run-1","node":"draft","event":"artifact.written","ts":"t","detail":{"bytes":3}}"#,
        r#"{"id":"E7","kind":"command","source":"step run-1/tests/2","sha256":"bb","run":"run-1","node":"tests","event":"sandbox_failed","ts":"t","detail":{"exit_code":1}}"#,
        r#"{"id":"E9","kind":"event_range","source":"events.jsonl#4-9","sha256":"cc","run":"run-1","node":"review","event":"gate.approved","ts":"t","detail":{"gate":"review","decision":"approved","by":"ann","from_seq":4,"to_seq":9}}"#,
    ];
    s.put(
        &format!("{dir}/shared/evidence/index.json"),
        format!("[\n{}\n]\n", index.join(",\n")),
    )
    .await;
    s.put(
        &format!("{dir}/shared/human-notes.md"),
        "# Human notes\n\nThe draft is evidence:E2; the tests failed (evidence:E7).\n\n`evidence:E2` is how to cite it; evidence:E404 is no entry.\n",
    )
    .await;
    s.put(
        &format!("{dir}/shared/reports/review.md"),
        "# Review\n\nApproved on evidence:E9.\n",
    )
    .await;
    let mut c = logged_in(&s).await;
    let csrf = c.get(&run_url()).await.csrf();
    let note = "Ship it per evidence:E9 and evidence:E2.";
    let p = c
        .post(
            &format!("{}/gates/review/approve", run_url()),
            &[("csrf", &csrf), ("note", note)],
        )
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    s.emit(
        RUN,
        "gate.approved",
        "review",
        serde_json::json!({"gate_id": "review", "by": "ann", "note": note}),
    )
    .await;

    let file = "/projects/proj/files?path=docs/run-1/draft.txt";
    let range = "/projects/proj/runs/run-1#ev-4";
    let command = "/projects/proj/runs/run-1/nodes/tests/log?attempt=2";
    let page = c.get(&run_url()).await.body;
    let at = page.find("id=\"notes-text\"").unwrap();
    let notes = &page[at..at + page[at..].find("</article>").unwrap()];
    assert_eq!(cite_href(notes, "E2"), Some(file), "{notes}");
    assert_eq!(cite_href(notes, "E7"), Some(command), "{notes}");
    assert!(notes.contains("<code>evidence:E2</code>"), "{notes}");
    assert!(
        notes.contains(">evidence:E404</span>") && cite_href(notes, "E404").is_none(),
        "{notes}"
    );
    // The decision on the gate, and the gate's history, link the note's evidence.
    let at = page.find("id=\"gate-review\"").unwrap();
    let gate = &page[at..at + page[at..].find("</ol>").unwrap()];
    let decision = &gate[gate.find("<q class=\"note\">").unwrap()..];
    assert_eq!(cite_href(decision, "E9"), Some(range), "{gate}");
    let history = &gate[gate.find("gate-history-review").unwrap()..];
    assert_eq!(cite_href(history, "E9"), Some(range), "{gate}");
    assert_eq!(cite_href(history, "E2"), Some(file), "{gate}");

    // The gate's own panel.
    let panel = c.get(&format!("{}/nodes/review", run_url())).await.body;
    assert_eq!(cite_href(&panel, "E9"), Some(range), "{panel}");
    // A report of the run, opened as a file.
    let report = c
        .get(&format!(
            "/projects/{PROJECT}/files?path={dir}/shared/reports/review.md"
        ))
        .await
        .body;
    assert_eq!(cite_href(&report, "E9"), Some(range), "{report}");
    // A document outside a run has no index: its citations stay text.
    s.put("docs/run-1/cites.md", "See evidence:E9.\n").await;
    let doc = c
        .get(&format!(
            "/projects/{PROJECT}/files?path=docs/run-1/cites.md"
        ))
        .await
        .body;
    assert!(doc.contains("See evidence:E9."), "{doc}");
}
