//! The web console's pages and actions (issue 8; seed 001 §6), driven through `console_router`
//! with `tower::ServiceExt::oneshot`, backed by a real artifact-store and a fake orchestrator
//! that records the calls it gets.
#![allow(clippy::unwrap_used)]

mod console_support;

use std::time::Duration;

use axum::http::{header, StatusCode};
use cairn_console::{console_url, serve_console, ConsoleConfig};
use cairn_proto::v1 as pb;
use console_support::*;

fn run_url() -> String {
    format!("/projects/{PROJECT}/runs/{RUN}")
}

/// Every POST form of the run page, with the fields it needs besides `csrf`.
fn actions() -> Vec<(String, Vec<(&'static str, &'static str)>)> {
    let run = run_url();
    vec![
        (format!("{run}/gates/review/approve"), vec![("note", "ok")]),
        (format!("{run}/gates/review/reject"), vec![("note", "no")]),
        (format!("{run}/notes"), vec![("text", "a note")]),
        (
            format!("{run}/context"),
            vec![("manifest_yaml", "attachments: []\n")],
        ),
        (format!("{run}/cancel"), vec![("reason", "stop")]),
        (
            format!("{run}/rework"),
            vec![("node_id", "draft"), ("note", "again")],
        ),
    ]
}

#[tokio::test]
async fn pages_need_a_login_and_a_wrong_token_is_refused() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(Some(TOKEN)));

    // Not logged in: pages redirect to the login form, POSTs are refused.
    let p = c.get("/runs").await;
    assert_eq!(p.status, StatusCode::SEE_OTHER);
    assert_eq!(p.location(), "/login?next=/runs");
    // The first visit starts a session: the cookie is HttpOnly and SameSite=Lax (links from
    // other sites land with the session; their POSTs carry no cookie and no CSRF token).
    let cookie = p
        .headers
        .get(header::SET_COOKIE)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax") && cookie.contains("Path=/"),
        "{cookie}"
    );
    let p = c.get(&run_url()).await;
    assert!(p.location().starts_with("/login?next="), "{}", p.location());
    for (url, _) in actions() {
        assert_eq!(c.get(&url).await.status, StatusCode::SEE_OTHER, "{url}");
    }
    let p = c
        .get(&format!(
            "/projects/{PROJECT}/download?path=docs/run-1/report.md"
        ))
        .await;
    assert_eq!(
        p.status,
        StatusCode::SEE_OTHER,
        "downloads need a login too"
    );

    let form = c.get("/login").await;
    let before = c.cookie.clone().unwrap();
    assert!(
        form.body.contains("type=\"password\" name=\"token\""),
        "{}",
        form.body
    );

    // Wrong token: 401, still logged out.
    let p = c.login("mallory", Some("guess")).await;
    assert_eq!(p.status, StatusCode::UNAUTHORIZED);
    assert!(p.body.contains("Wrong token"), "{}", p.body);
    assert_eq!(c.get("/runs").await.status, StatusCode::SEE_OTHER);
    // A login POST without the form's CSRF token is refused before the token is looked at.
    let p = c
        .post("/login", &[("name", "mallory"), ("token", TOKEN)])
        .await;
    assert_eq!(p.status, StatusCode::FORBIDDEN);
    assert_eq!(c.get("/runs").await.status, StatusCode::SEE_OTHER);

    // Right token: a new session id (no fixation), pages open.
    let p = c.login("ann", Some(TOKEN)).await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    assert_eq!(p.location(), "/runs");
    let set = p
        .headers
        .get(header::SET_COOKIE)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Lax") && set.contains("Path=/"),
        "{set}"
    );
    let after = c.cookie.clone().unwrap();
    assert_ne!(before, after, "logging in replaces the session id");
    let runs = c.get("/runs").await;
    assert_eq!(runs.status, StatusCode::OK, "{}", runs.body);
    assert!(
        runs.body
            .contains("signed in as <strong id=\"who\">ann</strong>"),
        "{}",
        runs.body
    );

    // The pre-login session id is dead.
    let mut old = Client::new(c.router.clone());
    old.cookie = Some(before);
    assert_eq!(old.get("/runs").await.status, StatusCode::SEE_OTHER);

    // Logging out ends the session.
    let csrf = c.csrf().await;
    let p = c.post("/logout", &[("csrf", &csrf)]).await;
    assert_eq!(p.status, StatusCode::SEE_OTHER);
    assert_eq!(c.get("/runs").await.status, StatusCode::SEE_OTHER);
    let mut stale = Client::new(c.router.clone());
    stale.cookie = Some(after);
    assert_eq!(
        stale.get("/runs").await.status,
        StatusCode::SEE_OTHER,
        "the logged-out id is dead"
    );
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
}

#[tokio::test]
async fn posts_without_the_sessions_csrf_token_are_forbidden() {
    let s = Services::start().await;
    let router = s.router(Some(TOKEN));
    let mut c = Client::new(router.clone());
    assert_eq!(
        c.login("ann", Some(TOKEN)).await.status,
        StatusCode::SEE_OTHER
    );
    let mut other = Client::new(router);
    assert_eq!(
        other.login("bob", Some(TOKEN)).await.status,
        StatusCode::SEE_OTHER
    );
    let others_csrf = other.csrf().await;
    let mine = c.csrf().await;
    assert_ne!(mine, others_csrf);

    for (url, fields) in actions() {
        let p = c.post(&url, &fields).await;
        assert_eq!(p.status, StatusCode::FORBIDDEN, "no csrf: {url}");
        assert!(p.body.contains("CSRF"), "{}", p.body);
        let mut wrong = fields.clone();
        wrong.push(("csrf", "0000"));
        assert_eq!(
            c.post(&url, &wrong).await.status,
            StatusCode::FORBIDDEN,
            "wrong csrf: {url}"
        );
        let mut foreign = fields.clone();
        foreign.push(("csrf", &others_csrf));
        assert_eq!(
            c.post(&url, &foreign).await.status,
            StatusCode::FORBIDDEN,
            "other session's csrf: {url}"
        );
    }
    // A body that is not a form carries no token either.
    let req = axum::http::Request::builder()
        .method("POST")
        .uri(format!("{}/notes", run_url()))
        .header(header::HOST, CONSOLE_HOST)
        .header(header::ORIGIN, CONSOLE_ORIGIN)
        .header(
            header::COOKIE,
            format!("cairn_console={}", c.cookie.clone().unwrap()),
        )
        .header(header::CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(format!(
            "{{\"csrf\":\"{mine}\",\"text\":\"x\"}}"
        )))
        .unwrap();
    assert_eq!(c.send(req).await.status, StatusCode::FORBIDDEN);
    assert!(
        s.fake.calls().is_empty(),
        "nothing reached the orchestrator: {:?}",
        s.fake.calls()
    );
}

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

#[tokio::test]
async fn without_a_token_pages_open_and_actions_carry_the_chosen_name() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(None));
    let runs = c.get("/runs").await;
    assert_eq!(runs.status, StatusCode::OK, "{}", runs.body);
    let csrf = c.csrf().await;
    c.post(
        &format!("{}/notes", run_url()),
        &[("csrf", &csrf), ("text", "first")],
    )
    .await;
    let form = c.get("/login").await;
    assert!(
        !form.body.contains("name=\"token\""),
        "no token field without a token"
    );
    assert_eq!(c.login("dave", None).await.status, StatusCode::SEE_OTHER);
    let csrf = c.csrf().await;
    c.post(
        &format!("{}/notes", run_url()),
        &[("csrf", &csrf), ("text", "second")],
    )
    .await;
    let by: Vec<_> = s.fake.calls().into_iter().map(|c| c.by).collect();
    assert_eq!(by, vec!["console", "dave"]);
    // CSRF applies without a token as well.
    let p = c
        .post(&format!("{}/notes", run_url()), &[("text", "third")])
        .await;
    assert_eq!(p.status, StatusCode::FORBIDDEN);
    // Names must be printable.
    let p = c.login("a\u{7}b", None).await;
    assert_eq!(p.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn runs_list_filters_by_state_and_offers_the_projects() {
    let s = Services::start().await;
    let mut done = blocked_run("run-0", "Older finished run", "2025-12-31T23:00:00.000Z");
    done.state = cairn_proto::v1::TaskState::Completed as i32;
    done.updated_at = "2025-12-31T23:01:05.000Z".into();
    s.fake.add_run(done);
    put(&s.store_addr, "other", "docs/x.md", b"x".to_vec()).await;
    let mut c = Client::new(s.router(None));

    // Without a project chosen (or configured), the first the store lists.
    let first = c.get("/runs").await;
    assert!(first.body.contains("Runs of other"), "{}", first.body);
    let all = c.get("/runs?project=proj").await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.body);
    assert!(all.body.contains("Runs of proj"), "{}", all.body);
    assert!(
        all.body.contains("<option value=\"other\">other</option>"),
        "{}",
        all.body
    );
    let newest = all.body.find("Draft and publish").unwrap();
    let older = all.body.find("Older finished run").unwrap();
    assert!(newest < older, "newest first");
    assert!(
        all.body.contains("1m 05s"),
        "duration of the finished run: {}",
        all.body
    );
    assert!(
        all.body.contains("href=\"/projects/proj/runs/run-1\""),
        "{}",
        all.body
    );

    let completed = c.get("/runs?project=proj&state=completed").await;
    assert!(
        completed.body.contains("Older finished run")
            && !completed.body.contains("Draft and publish"),
        "{}",
        completed.body
    );
    let waiting = c.get("/runs?project=proj&state=input-required").await;
    assert!(
        !waiting.body.contains("Older finished run") && waiting.body.contains("Draft and publish")
    );
    let none = c.get("/runs?project=proj&state=canceled").await;
    assert!(
        none.body.contains("No runs in state canceled."),
        "{}",
        none.body
    );
    let other = c.get("/runs?project=other").await;
    assert!(
        other.body.contains("Runs of other") && other.body.contains("No runs"),
        "{}",
        other.body
    );
    let bad = c.get("/runs?project=proj&state=sleeping").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(
        bad.body.contains("unknown state `sleeping`"),
        "{}",
        bad.body
    );
}

#[tokio::test]
async fn run_page_shows_state_milestones_roster_gates_notes_context_artifacts_and_ingest() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(None));
    // With the whole project's files (the default lists the run's own: run_scoped_files).
    let p = c.get(&format!("{}?files=project", run_url())).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    let b = &p.body;
    for want in [
        "<h1 id=\"run-title\">Draft and publish</h1>",
        "data-state=\"input-required\"",
        // milestones and roster from task.yaml
        "Write the draft",
        "Human review",
        "<code>writer-1</code>",
        // the gate, its reason and its form
        "id=\"gate-review\"",
        "check docs/run-1/draft.txt",
        "<textarea name=\"note\"",
        // the event stream
        // the events so far, then the live stream from the next one
        "data-src=\"/projects/proj/runs/run-1/events?from=3\"",
        "data-seq=\"2\"",
        "<tr id=\"ev-2\" class=\"level-info\" data-type=\"gate.blocked\">",
        // human notes rendered, with the note anchor kept
        "<a id=\"note-1\"></a>",
        "Keep the API stable.",
        // the context manifest in its editor
        "path: ./shared/contracts/api.md",
        // artifacts of the three areas
        "href=\"/projects/proj/files?path=docs/run-1/report.md\"",
        "href=\"/projects/proj/files?path=workspace/src/main.rs\"",
        "href=\"/projects/proj/files?path=.cairn/runs/run-1/task.yaml\"",
        "href=\"/projects/proj/download?path=docs/run-1/bundle.zip\"",
        // the ingest manifest with per-block status
        "Node <code>draft</code>",
        "1 written",
        "1 rejected",
        "<td data-label=\"reason\">traversal</td>",
        // cancel and rework
        "action=\"/projects/proj/runs/run-1/cancel\"",
        "<option value=\"publish\">publish (write_file)</option>",
    ] {
        assert!(b.contains(want), "missing {want:?} in\n{b}");
    }
    assert!(
        !b.contains("not an ingest manifest"),
        "enabled.json is not offered as a manifest"
    );
    // Security headers.
    let csp = p
        .headers
        .get(header::CONTENT_SECURITY_POLICY)
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(
        p.headers.get(header::X_CONTENT_TYPE_OPTIONS).unwrap(),
        "nosniff"
    );
    assert_eq!(p.headers.get(header::CACHE_CONTROL).unwrap(), "no-store");

    // An unknown run is a 404 page, an unknown page too.
    let missing = c.get("/projects/proj/runs/nope").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(
        missing.body.contains("run `nope` not found"),
        "{}",
        missing.body
    );
    assert_eq!(c.get("/nowhere").await.status, StatusCode::NOT_FOUND);
    // The static files are served.
    let js = c.get("/static/console.js").await;
    assert!(js.status.is_success() && js.body.contains("EventSource"));
    assert!(c.get("/static/console.css").await.status.is_success());
}

#[tokio::test]
async fn markup_in_titles_notes_and_file_names_is_escaped() {
    let s = Services::start().await;
    s.fake.set_title(RUN, "<script>alert('title')</script>");
    let mut c = Client::new(s.router(None));
    let p = c.get(&format!("{}?files=project", run_url())).await;
    let b = &p.body;
    assert!(!b.contains("<script>alert"), "{b}");
    assert!(
        b.contains("&lt;script&gt;alert('title')&lt;/script&gt;"),
        "{b}"
    );
    assert!(!b.contains("<img src=x"), "{b}");
    assert!(b.contains("&lt;img src=x onerror=alert(1)&gt;"), "{b}");
    assert!(!b.contains("javascript:"), "{b}");
    // A file name with & and ': escaped in text, percent-encoded in the link.
    assert!(
        b.contains("href=\"/projects/proj/files?path=docs/run-1/a%26b%27c.md\""),
        "{b}"
    );
    assert!(b.contains(">docs/run-1/a&amp;b'c.md</a>"), "{b}");
    let view = c
        .get("/projects/proj/files?path=docs/run-1/a%26b%27c.md")
        .await;
    assert_eq!(view.status, StatusCode::OK, "{}", view.body);
    assert!(view.body.contains("<h1>odd name</h1>"), "{}", view.body);

    // A name given at login is escaped wherever it shows.
    let mut evil = Client::new(s.router(None));
    evil.login("<b>eve</b>", None).await;
    let p = evil.get("/runs").await;
    assert!(
        p.body.contains("&lt;b&gt;eve&lt;/b&gt;") && !p.body.contains("<b>eve"),
        "{}",
        p.body
    );
}

#[tokio::test]
async fn traversal_in_an_artifact_link_is_refused_by_the_store() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(None));
    for (path, reason) in [
        ("../../etc/passwd", "traversal"),
        ("%2Fetc%2Fpasswd", "absolute_path"),
        ("docs/..%2F..%2F..%2Fetc%2Fpasswd", "traversal"),
    ] {
        let p = c.get(&format!("/projects/proj/files?path={path}")).await;
        assert_eq!(p.status, StatusCode::BAD_REQUEST, "{path}: {}", p.body);
        assert!(
            p.body.contains(&format!("(reason: {reason})")),
            "{path}: {}",
            p.body
        );
        assert!(p.body.contains("id=\"error-message\""), "{}", p.body);
        let d = c.get(&format!("/projects/proj/download?path={path}")).await;
        assert_eq!(d.status, StatusCode::BAD_REQUEST, "{path}");
        assert!(!d.body.contains("root:"), "nothing of the host leaks");
        let t = c.get(&format!("/projects/proj/tree?prefix={path}")).await;
        assert_eq!(t.status, StatusCode::BAD_REQUEST, "{path}");
    }
    // A project id that is a path is refused too.
    let p = c.get("/projects/..%2F..%2Fetc/files?path=passwd").await;
    assert!(p.status.is_client_error(), "{}", p.status);
    // The denylist holds for reads.
    let p = c.get("/projects/proj/files?path=.ssh/id_rsa").await;
    assert!(
        p.status == StatusCode::FORBIDDEN || p.status == StatusCode::BAD_REQUEST,
        "{}",
        p.status
    );
    // A missing file is a 404 page.
    let p = c.get("/projects/proj/files?path=docs/none.md").await;
    assert_eq!(p.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn markdown_is_rendered_without_raw_html_and_code_is_text() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(None));
    let md = c
        .get("/projects/proj/files?path=docs/run-1/report.md")
        .await;
    assert_eq!(md.status, StatusCode::OK, "{}", md.body);
    assert!(
        md.body.contains("<h1>Report</h1>") && md.body.contains("<strong>bold</strong>"),
        "{}",
        md.body
    );
    assert!(
        md.body.contains("&lt;script&gt;alert('md')&lt;/script&gt;"),
        "{}",
        md.body
    );
    assert!(!md.body.contains("<script>alert"), "{}", md.body);
    assert!(
        md.body
            .contains("href=\"/projects/proj/files?path=docs/run-1/next.md\""),
        "relative links stay in the project: {}",
        md.body
    );
    assert!(!md.body.contains("javascript:"), "{}", md.body);

    let code = c
        .get("/projects/proj/files?path=workspace/src/main.rs")
        .await;
    assert!(
        code.body.contains(
            "<pre class=\"code\"><code>fn main() { println!(&quot;&lt;b&gt;hi&lt;/b&gt;&quot;); }"
        ),
        "{}",
        code.body
    );

    let zip = c
        .get("/projects/proj/files?path=docs/run-1/bundle.zip")
        .await;
    assert!(zip.body.contains("This file is not text"), "{}", zip.body);
    assert!(!zip.body.contains("PK"), "binary bytes are not shown");

    let tree = c.get("/projects/proj/tree?prefix=docs").await;
    assert!(
        tree.body
            .contains("href=\"/projects/proj/tree?prefix=docs/run-1\""),
        "{}",
        tree.body
    );
}

#[tokio::test]
async fn archives_download_whole_as_attachments() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(None));
    let d = c
        .get("/projects/proj/download?path=docs/run-1/bundle.zip")
        .await;
    assert_eq!(d.status, StatusCode::OK);
    assert_eq!(
        d.headers.get(header::CONTENT_TYPE).unwrap(),
        "application/octet-stream"
    );
    let disp = d
        .headers
        .get(header::CONTENT_DISPOSITION)
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        disp.starts_with("attachment; filename=\"bundle.zip\""),
        "{disp}"
    );
    assert_eq!(
        d.bytes.len(),
        3_000_004,
        "the whole file, streamed in chunks"
    );
    assert_eq!(&d.bytes[..4], b"PK\x03\x04");
    assert!(d.bytes[4..]
        .iter()
        .enumerate()
        .all(|(i, b)| *b == (i as u32 % 251) as u8));
    assert_eq!(d.headers.get(header::CONTENT_LENGTH).unwrap(), "3000004");
    // Only raster images are ever inline; a Markdown file asked inline is still an attachment.
    let md = c
        .get("/projects/proj/download?path=docs/run-1/report.md&inline=1")
        .await;
    assert!(md
        .headers
        .get(header::CONTENT_DISPOSITION)
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("attachment"));
}

#[tokio::test]
async fn the_event_stream_replays_then_follows_past_the_runs_end() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(None));
    s.fake.emit(
        RUN,
        "human.note",
        "",
        serde_json::json!({"by": "ann", "note": "<i>x</i>"}),
    );
    let fake = s.fake.clone();
    let approve = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = cairn_proto::v1::GateDecisionRequest {
            project_id: PROJECT.into(),
            run_id: RUN.into(),
            gate_id: "review".into(),
            by: "ann".into(),
            note: "fine".into(),
        };
        use cairn_proto::v1::orchestrator_server::Orchestrator;
        fake.approve_gate(tonic::Request::new(r)).await.unwrap();
    });
    // The run is still blocked: the stream follows it live until it completes, and on.
    let (b, open) = c
        .stream_until(&format!("{}/events", run_url()), &[], "task.completed")
        .await;
    approve.await.unwrap();
    let b = &b;
    assert!(
        b.contains("event: run-event\nid: 1\n") || b.contains("id: 1\n"),
        "{b}"
    );
    assert!(b.contains("\"type\":\"gate.blocked\""), "{b}");
    assert!(
        b.contains("\"note\":\"fine\""),
        "the live event arrived: {b}"
    );
    assert!(b.contains("\"type\":\"task.completed\""), "{b}");
    assert!(open, "the stream stays open after the run's end: {b}");
    assert!(!b.contains("event: end"), "{b}");
    // Each event carries its table row, escaped.
    assert!(b.contains("\"row\":\"<tr id=\\\"ev-1\\\""), "{b}");
    assert!(b.contains("&lt;i&gt;x&lt;/i&gt;"), "{b}");
    // Resuming after id 3 sends only what followed.
    let (b, _) = c
        .stream_until(
            &format!("{}/events", run_url()),
            &[("last-event-id", "3")],
            "id: 4\n",
        )
        .await;
    assert!(!b.contains("id: 3\n"), "{b}");
    // An unknown run: 404, no stream.
    assert_eq!(
        c.get("/projects/proj/runs/nope/events").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn serving_needs_a_token_off_loopback_and_stops_with_open_streams() {
    let s = Services::start().await;
    let public = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let e = serve_console(s.config(None), public, async {})
        .await
        .unwrap_err();
    assert!(e.to_string().contains("without a login token"), "{e}");

    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    assert_eq!(
        console_url(addr),
        format!("http://127.0.0.1:{}/", addr.port())
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_console(s.config(None), l, async move {
        let _ = stopped.await;
    }));
    // A browser holding the event stream of a blocked run open.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(
        format!(
            "GET {}/events HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
            run_url(),
            addr.port()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("text/event-stream"));
    let _ = stop.send(());
    let served = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("shutdown does not wait for the stream");
    served.unwrap().unwrap();

    let bad = ConsoleConfig {
        store_addr: String::new(),
        ..s.config(None)
    };
    assert!(cairn_console::console_router(bad).is_err());
}

#[tokio::test]
async fn gate_labels_favicon_and_the_context_label() {
    let s = Services::start().await;
    let mut info = blocked_run("run-2", "Two gates", "2026-01-01T00:00:00.000Z");
    info.gates.push(cairn_proto::v1::GateInfo {
        id: "later".into(),
        state: cairn_proto::v1::GateState::Open as i32,
        ..Default::default()
    });
    s.fake.add_run(info);
    let mut c = Client::new(s.router(None));
    let b = c.get(&format!("/projects/{PROJECT}/runs/run-2")).await.body;
    // The gate not reached yet says so and offers no decision; the blocked one does.
    let later = b.split("id=\"gate-later\"").nth(1).unwrap();
    let later = later.split("</div>").next().unwrap();
    assert!(later.contains(">not reached</span>"), "{later}");
    assert!(
        !later.contains("<form") && !b.contains(">open</span>"),
        "{b}"
    );
    assert!(
        b.contains("/projects/proj/runs/run-2/gates/review/approve"),
        "{b}"
    );
    // The favicon, and a label for the context editor.
    assert!(
        b.contains("<link rel=\"icon\" type=\"image/svg+xml\" href=\"/static/favicon.svg\">"),
        "{b}"
    );
    assert!(
        b.contains("<label>Context manifest (YAML)<textarea class=\"code\" name=\"manifest_yaml\""),
        "{b}"
    );
    let icon = c.get("/static/favicon.svg").await;
    assert_eq!(icon.status, StatusCode::OK);
    assert_eq!(
        icon.headers.get(header::CONTENT_TYPE).unwrap(),
        "image/svg+xml"
    );
    assert!(icon.body.starts_with("<svg") && !icon.body.contains("script"));
}

#[tokio::test]
async fn long_event_fields_are_folded_and_json_is_pretty() {
    let s = Services::start().await;
    let long = format!("<b>{}</b>", "x".repeat(600));
    let e = cairn_proto::v1::Event {
        r#type: "task.created".into(),
        data_json:
            serde_json::json!({"llm": long, "vars": {"a": "1", "b": "y".repeat(300)}, "by": "cli"})
                .to_string(),
        ..Default::default()
    };
    append_events(&s.store_addr, PROJECT, RUN, &[e]).await;
    let mut c = Client::new(s.router(None));
    let b = c.get(&run_url()).await.body;
    let row = b.split("<tr id=\"ev-3\"").nth(1).unwrap();
    let row = row.split("</tr>").next().unwrap();
    // Short fields as they are; long ones folded: 200 characters, the rest on a click.
    assert!(
        row.contains("<span class=\"field\">by: cli</span>"),
        "{row}"
    );
    assert_eq!(row.matches("<details class=\"fold\">").count(), 2, "{row}");
    let head = format!("&lt;b&gt;{}…", "x".repeat(197));
    assert!(row.contains(&format!("<summary>{head}")), "{row}");
    assert!(
        row.contains(&format!(
            "<pre class=\"fold\">&lt;b&gt;{}&lt;/b&gt;</pre>",
            "x".repeat(600)
        )),
        "{row}"
    );
    // JSON values are pretty-printed when unfolded.
    assert!(
        row.contains("{\n  &quot;a&quot;: &quot;1&quot;,\n  &quot;b&quot;: &quot;yyy"),
        "{row}"
    );
    assert!(!row.contains("<b>"), "escaped: {row}");
}

#[tokio::test]
async fn run_scoped_files_by_default_and_the_project_behind_a_toggle() {
    let s = Services::start().await;
    let written = cairn_proto::v1::Event {
        r#type: "artifact.written".into(),
        node_id: "draft".into(),
        data_json: serde_json::json!({"path": "docs/run-1/report.md", "bytes": 120}).to_string(),
        ..Default::default()
    };
    let ingested = cairn_proto::v1::Event {
        r#type: "ingest.block.written".into(),
        node_id: "draft".into(),
        data_json: serde_json::json!({"path": "workspace/src/main.rs", "bytes": 42}).to_string(),
        ..Default::default()
    };
    append_events(&s.store_addr, PROJECT, RUN, &[written, ingested]).await;
    s.put("docs/elsewhere/other-run.md", "# another run's file\n")
        .await;
    let mut c = Client::new(s.router(None));
    let b = c.get(&run_url()).await.body;
    let files = b.split("id=\"run-files\"").nth(1).unwrap();
    let files = files.split("</table>").next().unwrap();
    assert!(files.contains(">docs/run-1/report.md</a>"), "{files}");
    assert!(files.contains(">workspace/src/main.rs</a>"), "{files}");
    assert!(files.contains("href=\"#ev-3\""), "{files}");
    assert!(
        !b.contains("other-run.md") && !b.contains("bundle.zip"),
        "{b}"
    );
    assert!(
        b.contains("href=\"/projects/proj/runs/run-1?files=project#artifacts\""),
        "{b}"
    );
    let all = c.get(&format!("{}?files=project", run_url())).await.body;
    assert!(all.contains(">docs/elsewhere/other-run.md</a>"), "{all}");
    assert!(all.contains(">docs/run-1/bundle.zip</a>"), "{all}");
    assert!(all.contains("Show this run's files only"), "{all}");
}

#[tokio::test]
async fn the_graph_is_an_svg_of_nodes_edges_and_branches_without_script() {
    let s = Services::start().await;
    let graph = serde_json::json!({"version": 1, "nodes": [
        {"id": "draft", "type": "write_file"},
        {"id": "check", "type": "condition", "needs": ["draft"], "if": "true", "then": ["review"], "else": ["publish"]},
        {"id": "review", "type": "gate", "needs": ["check"]},
        {"id": "publish", "type": "write_file", "needs": ["check", "review"]},
        {"id": "each", "type": "map", "needs": ["draft"], "over": [1, 2], "node": {"type": "write_file"}},
        {"id": "<b>odd", "type": "write_file", "needs": ["each"]}
    ]});
    s.put(
        &format!(".cairn/runs/{RUN}/graph.resolved.json"),
        graph.to_string(),
    )
    .await;
    let items: Vec<cairn_proto::v1::Event> = [
        ("node.started", "draft"),
        ("node.completed", "draft"),
        ("map.items", "each"),
        ("node.started", "each.0"),
        ("node.completed", "each.0"),
        ("node.started", "each.1"),
    ]
    .iter()
    .map(|(t, n)| cairn_proto::v1::Event {
        r#type: (*t).into(),
        node_id: (*n).into(),
        data_json: if *t == "map.items" {
            "{\"count\": 2}".into()
        } else {
            "{}".into()
        },
        ..Default::default()
    })
    .collect();
    append_events(&s.store_addr, PROJECT, RUN, &items).await;
    let mut c = Client::new(s.router(None));
    let b = c.get(&run_url()).await.body;
    let svg = b
        .split("<svg id=\"dag\"")
        .nth(1)
        .unwrap()
        .split("</svg>")
        .next()
        .unwrap();
    for (node, state) in [
        ("draft", "succeeded"),
        ("review", "blocked"),
        ("publish", "pending"),
        ("check", "pending"),
    ] {
        assert!(
            svg.contains(&format!("data-node=\"{node}\" data-state=\"{state}\"")),
            "{node} {state}: {svg}"
        );
        // Each node opens its panel.
        assert!(
            svg.contains(&format!(
                "href=\"/projects/proj/runs/run-1/nodes/{node}\" data-node=\"{node}\""
            )),
            "{svg}"
        );
    }
    // The map once, with its items counted; ids escaped.
    assert!(
        svg.contains("data-node=\"each\" data-state=\"pending\""),
        "{svg}"
    );
    assert!(svg.contains("map ×2 · 1 done"), "{svg}");
    assert!(!svg.contains("each.0"), "{svg}");
    assert!(
        svg.contains("data-node=\"&lt;b&gt;odd\"") && !svg.contains("<b>"),
        "{svg}"
    );
    // Edges, the branches labelled.
    assert!(
        svg.contains("class=\"edge then\" data-from=\"check\" data-to=\"review\""),
        "{svg}"
    );
    assert!(
        svg.contains("class=\"edge else\" data-from=\"check\" data-to=\"publish\""),
        "{svg}"
    );
    assert!(
        svg.contains("class=\"edge\" data-from=\"review\" data-to=\"publish\""),
        "{svg}"
    );
    assert!(
        !svg.to_lowercase().contains("script") && !svg.contains("style="),
        "{svg}"
    );
    // Closed explicitly: in HTML an SVG <rect> or <path> is not void.
    for tag in ["rect", "path", "text", "g", "a"] {
        assert_eq!(
            svg.matches(&format!("<{tag} ")).count() + svg.matches(&format!("<{tag}>")).count(),
            svg.matches(&format!("</{tag}>")).count(),
            "<{tag}> closed: {svg}"
        );
    }
    let gantt = b
        .split("<svg id=\"gantt\"")
        .nth(1)
        .unwrap()
        .split("</svg>")
        .next()
        .unwrap();
    for tag in ["rect", "line", "text", "g"] {
        assert_eq!(
            gantt.matches(&format!("<{tag} ")).count(),
            gantt.matches(&format!("</{tag}>")).count(),
            "<{tag}> closed: {gantt}"
        );
    }
    // Each node links to its row of the milestones.
    assert!(b.contains("<tr id=\"node-review\">"), "{b}");
}

fn log_chunk(node: &str, seq: u64, stream: pb::LogStream, data: &str) -> pb::LogChunk {
    pb::LogChunk {
        node_id: node.into(),
        attempt: 1,
        seq,
        stream: stream as i32,
        data: data.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

fn log_end(node: &str, seq: u64, outcome: &str, error: &str) -> pb::LogChunk {
    pb::LogChunk {
        end: true,
        outcome: outcome.into(),
        error: error.into(),
        ..log_chunk(node, seq, pb::LogStream::Unspecified, "")
    }
}

/// A run with a code_delivery node that failed at its test command and a sandbox_run node
/// that printed markup.
fn run_with_output(s: &Services) -> &'static str {
    use pb::LogStream::{Stderr, Stdout, Step};
    let run = "run-logs";
    let mut info = blocked_run(run, "Build and probe", "2026-01-02T00:00:00.000Z");
    info.state = pb::TaskState::Failed as i32;
    info.gates.clear();
    info.error = "node `build` failed".into();
    let node = |id: &str, kind: &str, state: pb::NodeState, error: &str| pb::NodeInfo {
        id: id.into(),
        r#type: kind.into(),
        state: state as i32,
        attempts: 1,
        error: error.into(),
        ..Default::default()
    };
    info.nodes = vec![
        node("probe", "sandbox_run", pb::NodeState::Succeeded, ""),
        node(
            "build",
            "code_delivery",
            pb::NodeState::Failed,
            "the task ended without a passing test run",
        ),
        node("notes", "write_file", pb::NodeState::Succeeded, ""),
    ];
    s.fake.add_run(info);
    let probe = [
        log_chunk(
            "probe",
            1,
            Stdout,
            "<script>alert(1)</script><img src=x onerror=alert(2)>\n",
        ),
        log_end("probe", 2, "succeeded", ""),
    ];
    let build = [
        log_chunk("build", 1, Step, "$ make\n"),
        log_chunk("build", 2, Stdout, "built ok\n"),
        log_chunk("build", 3, Step, "[exit 0]\n"),
        log_chunk("build", 4, Step, "$ cargo test\n"),
        log_chunk("build", 5, Stderr, "assertion failed: left == right\n"),
        log_chunk("build", 6, Step, "[exit 101]\n"),
        log_end(
            "build",
            7,
            "failed",
            "the task ended without a passing test run",
        ),
    ];
    for c in probe.into_iter().chain(build) {
        s.fake.add_log(run, c);
    }
    run
}

#[tokio::test]
async fn node_panels_show_output_as_text_and_the_failing_step_beside_its_error() {
    let s = Services::start().await;
    let run = run_with_output(&s);
    let mut c = Client::new(s.router(None));
    let p = c.get(&format!("/projects/{PROJECT}/runs/{run}")).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    let b = &p.body;
    // One panel per node that prints (not the write_file), with the output at page load.
    assert!(b.contains("id=\"panel-probe\""), "{b}");
    assert!(b.contains("id=\"panel-build\""), "{b}");
    assert!(!b.contains("id=\"panel-notes\""), "{b}");
    assert!(
        b.contains("data-src=\"/projects/proj/runs/run-logs/nodes/probe/logs\" data-after=\"1.2\""),
        "{b}"
    );
    // The program's markup is text.
    assert!(!b.contains("<script>alert(1)"), "{b}");
    assert!(!b.contains("<img src=x"), "{b}");
    assert!(
        b.contains("&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"),
        "{b}"
    );
    // The failed node: its error, and beside it the command that failed with its output
    // (not the one that passed).
    let head = b
        .split("id=\"panel-head-build\"")
        .nth(1)
        .and_then(|rest| rest.split("id=\"log-build\"").next())
        .unwrap_or_default();
    assert!(
        head.contains("Error: the task ended without a passing test run"),
        "{head}"
    );
    let failing = head
        .split("id=\"failing-build\"")
        .nth(1)
        .unwrap_or_default();
    assert!(failing.contains("$ cargo test"), "{head}");
    assert!(
        failing.contains("assertion failed: left == right"),
        "{head}"
    );
    assert!(failing.contains("[exit 101]"), "{head}");
    assert!(!failing.contains("$ make"), "{head}");
    // The whole output is in the log pane, with the attempt's end.
    let pane = b.split("id=\"log-build\"").nth(1).unwrap_or_default();
    assert!(
        pane.contains("built ok") && pane.contains("[attempt 1 ended: failed"),
        "{pane}"
    );

    // The live stream relays the chunks as JSON text (never markup) and resumes after an id.
    let url = format!("/projects/{PROJECT}/runs/{run}/nodes/probe/logs");
    let (t, _) = c.stream_until(&url, &[], "id: 1.2\n").await;
    assert!(t.contains("event: log\nid: 1.1\n"), "{t}");
    assert!(t.contains("\"class\":\"stdout\""), "{t}");
    assert!(t.contains("\"text\":\"<script>alert(1)</script>"), "{t}");
    let (t, _) = c
        .stream_until(&url, &[("last-event-id", "1.1")], "id: 1.2\n")
        .await;
    assert!(!t.contains("id: 1.1\n"), "{t}");
}

#[tokio::test]
async fn items_of_a_map_that_print_get_panels_of_their_own() {
    let s = Services::start().await;
    let run = "run-map";
    let mut info = blocked_run(run, "Fan out", "2026-01-03T00:00:00.000Z");
    info.gates.clear();
    info.state = pb::TaskState::Working as i32;
    info.nodes = vec![pb::NodeInfo {
        id: "fan".into(),
        r#type: "map".into(),
        state: pb::NodeState::Running as i32,
        attempts: 1,
        ..Default::default()
    }];
    s.fake.add_run(info);
    let started = |node: &str, kind: &str| pb::Event {
        r#type: "node.started".into(),
        node_id: node.into(),
        level: pb::Level::Info as i32,
        data_json: serde_json::json!({"node_type": kind, "attempt": 1}).to_string(),
        ..Default::default()
    };
    append_events(
        &s.store_addr,
        PROJECT,
        run,
        &[
            started("fan", "map"),
            started("fan.0", "sandbox_run"),
            started("fan.1", "sandbox_run"),
            started("fan.0", "sandbox_run"),
            started("other.2", "sandbox_run"),
        ],
    )
    .await;
    s.fake.add_log(
        run,
        log_chunk(
            "fan.0",
            1,
            pb::LogStream::Stdout,
            "item zero says <b>hi</b>\n",
        ),
    );
    let mut c = Client::new(s.router(None));
    let p = c.get(&format!("/projects/{PROJECT}/runs/{run}")).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    let b = &p.body;
    // One panel per item that ran a logged kind, once each; not for an id of no map.
    assert_eq!(b.matches("id=\"panel-fan.0\"").count(), 1, "{b}");
    assert!(b.contains("id=\"panel-fan.1\""), "{b}");
    assert!(
        !b.contains("id=\"panel-fan\""),
        "the map itself prints nothing: {b}"
    );
    assert!(!b.contains("panel-other.2"), "{b}");
    assert!(
        b.contains("Map item <code>fan.0</code> (sandbox_run)"),
        "{b}"
    );
    assert!(
        b.contains("data-src=\"/projects/proj/runs/run-map/nodes/fan.0/logs\""),
        "{b}"
    );
    assert!(b.contains("item zero says &lt;b&gt;hi&lt;/b&gt;"), "{b}");
}
