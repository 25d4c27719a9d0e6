//! Logging in and out through `console_router` (a real artifact-store, a fake orchestrator):
//! pages and actions need a session, a wrong token is refused, the session id changes at login
//! and dies at logout, every POST needs the session's CSRF token, the console without a token
//! records the name people chose, and serving refuses an address off loopback without a token
//! and stops with event streams open.
#![allow(clippy::unwrap_used)]

mod console_support;

use std::time::Duration;

use axum::http::{header, StatusCode};
use cairn_console::{console_url, serve_console, ConsoleConfig};
use console_support::*;

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
