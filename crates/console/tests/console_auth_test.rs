//! The console's trust boundary: only its own Host names are answered (a DNS-rebinding page
//! gets nothing), every POST must come from its own Origin, a shared token is at least 16
//! characters, guessing logins is slow and logged, and people log in with their own token
//! from the tokens file: the console shows and allows what their role allows and relays their
//! token, so the orchestrator decides and records who did it.
#![allow(clippy::unwrap_used)]

#[path = "../../../services/orchestrator/tests/auth_support/mod.rs"]
mod auth_support;
#[path = "../../../services/orchestrator/tests/common/mod.rs"]
mod common;
mod console_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{header, StatusCode};
use cairn_console::{console_router, serve_console, ConsoleConfig};
use cairn_proto::v1::{GateState, TaskState};
use console_support::{run_url, Client, Services, CONSOLE_HOST, CONSOLE_ORIGIN, PROJECT, TOKEN};

#[tokio::test]
async fn a_foreign_host_gets_nothing() {
    let s = Services::start().await;
    let router = console_router(ConsoleConfig {
        public_hosts: vec!["cairn.example.com".into(), "ops.example.com:8443".into()],
        ..s.config(None)
    })
    .unwrap();
    let mut c = Client::new(router);
    // A page whose name rebinds to 127.0.0.1 reaches the console with its own name as Host.
    for host in [
        "evil.example",
        "evil.example:7480",
        "127.0.0.1.evil.example:7480",
        "cairn.example.com.evil.example",
        "ops.example.com:9999",
        "",
    ] {
        let headers: Vec<(&str, &str)> = if host.is_empty() {
            vec![]
        } else {
            vec![("host", host)]
        };
        for path in ["/runs".to_owned(), run_url(), "/login".to_owned()] {
            let p = c.raw("GET", &path, &headers, &[]).await;
            assert!(
                p.status == StatusCode::FORBIDDEN || p.status == StatusCode::MISDIRECTED_REQUEST,
                "Host {host:?} {path}: {} {}",
                p.status,
                p.body
            );
            assert!(!p.body.contains("csrf"), "no form for {host:?}: {}", p.body);
            assert!(
                !p.headers.contains_key(header::SET_COOKIE),
                "no session for {host:?}"
            );
            assert!(!p.body.contains("Draft and publish"), "{}", p.body);
        }
    }
    // Not even with a valid session and CSRF token: a rebound page cannot act.
    let csrf = c.csrf().await;
    let p = c
        .raw(
            "POST",
            &format!("{}/gates/review/approve", run_url()),
            &[
                ("host", "evil.example:7480"),
                ("origin", "http://evil.example:7480"),
            ],
            &[("csrf", &csrf), ("note", "pwned")],
        )
        .await;
    assert!(p.status.is_client_error(), "{}", p.status);
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());

    for host in [
        CONSOLE_HOST,
        "localhost:7480",
        "LOCALHOST:7480",
        "[::1]:7480",
        "localhost:8080",
        "cairn.example.com",
        "cairn.example.com:443",
        "ops.example.com:8443",
    ] {
        let p = c.raw("GET", "/runs", &[("host", host)], &[]).await;
        assert_eq!(p.status, StatusCode::OK, "Host {host}: {}", p.body);
    }
}

#[tokio::test]
async fn a_post_without_the_consoles_own_origin_is_refused() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(None));
    let csrf = c.csrf().await;
    let url = format!("{}/notes", run_url());
    for origin in [
        Some("http://evil.example"),
        Some("http://127.0.0.1:9999"),
        Some("https://127.0.0.1:7480.evil.example"),
        Some("null"),
        None,
    ] {
        let mut headers = vec![("host", CONSOLE_HOST)];
        if let Some(o) = origin {
            headers.push(("origin", o));
        }
        let p = c
            .raw("POST", &url, &headers, &[("csrf", &csrf), ("text", "x")])
            .await;
        assert_eq!(
            p.status,
            StatusCode::FORBIDDEN,
            "Origin {origin:?}: {}",
            p.body
        );
        assert!(p.body.contains("Origin"), "says why: {}", p.body);
    }
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
    let p = c
        .raw(
            "POST",
            &url,
            &[("host", CONSOLE_HOST), ("origin", CONSOLE_ORIGIN)],
            &[("csrf", &csrf), ("text", "from the console")],
        )
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    assert_eq!(s.fake.calls().len(), 1);
    // The login form is a POST too.
    let mut fresh = Client::new(s.router(Some(TOKEN)));
    let form = fresh.get("/login").await;
    let p = fresh
        .raw(
            "POST",
            "/login",
            &[("host", CONSOLE_HOST), ("origin", "http://evil.example")],
            &[("csrf", &form.csrf()), ("name", "x"), ("token", TOKEN)],
        )
        .await;
    assert_eq!(p.status, StatusCode::FORBIDDEN, "{}", p.body);
}

#[tokio::test]
async fn a_console_token_shorter_than_16_characters_is_refused_at_start() {
    let s = Services::start().await;
    for short in ["x", "123456789012345"] {
        let e = console_router(s.config(Some(short))).err().unwrap();
        assert!(e.to_string().contains("16"), "names the rule: {e}");
        assert!(
            e.to_string().contains("console.token"),
            "names the key: {e}"
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        assert!(serve_console(s.config(Some(short)), l, async {})
            .await
            .is_err());
    }
    let _ = console_router(s.config(Some("1234567890123456"))).unwrap();
}

/// GET /login for a session and its CSRF token, then POST a wrong token; the POST's status.
async fn guess(base: String, host: String, n: usize) -> StatusCode {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let page = http
        .get(format!("{base}/login"))
        .header("host", &host)
        .send()
        .await
        .unwrap();
    let cookie = page
        .headers()
        .get(header::SET_COOKIE)
        .unwrap()
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let body = page.text().await.unwrap();
    let at = body.find("name=\"csrf\" value=\"").unwrap() + 19;
    let csrf = body[at..].split('"').next().unwrap().to_owned();
    http.post(format!("{base}/login"))
        .header("host", &host)
        .header("origin", &base)
        .header(header::COOKIE, cookie)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(console_support::encode(&[
            ("csrf", &csrf),
            ("name", "mallory"),
            ("token", &format!("guess-number-{n:04}-xxxx")),
        ]))
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_wrong_logins_are_slowed_and_logged() {
    auth_support::logs();
    let s = Services::start().await;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_console(s.config(Some(TOKEN)), l, async move {
        let _ = stopped.await;
    }));
    let base = format!("http://{addr}");
    let host = addr.to_string();
    let answered = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..20 {
        let (base, host, answered) = (base.clone(), host.clone(), answered.clone());
        tasks.push(tokio::spawn(async move {
            let status = guess(base, host, n).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED);
            answered.fetch_add(1, Ordering::SeqCst);
        }));
    }
    // Unthrottled, 20 guesses in parallel are all answered within a fraction of a second.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let within = answered.load(Ordering::SeqCst);
    assert!(
        within < 10,
        "{within} of 20 parallel wrong logins were answered within {:?}",
        started.elapsed()
    );
    for t in &tasks {
        t.abort();
    }
    let logs = auth_support::logged();
    let refused: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("console login refused"))
        .collect();
    assert!(!refused.is_empty(), "{logs}");
    assert!(
        refused
            .iter()
            .all(|l| l.contains("WARN") && l.contains("127.0.0.1")),
        "{refused:?}"
    );
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_log_in_with_their_own_token_and_get_what_their_role_allows() {
    let o = auth_support::Secured::start(true).await;
    let config = ConsoleConfig {
        enabled: true,
        orchestrator_addr: o.orch_addr.clone(),
        store_addr: o.store_addr.clone(),
        user_tokens: true,
        ..ConsoleConfig::default()
    };
    let router = console_router(config.clone()).unwrap();
    // Personal tokens and a shared token do not mix.
    assert!(console_router(ConsoleConfig {
        token: Some(TOKEN.into()),
        ..config
    })
    .is_err());
    let run = o.blocked_run(PROJECT).await;
    let page = format!("/projects/{PROJECT}/runs/{run}");

    // Not logged in: nothing.
    let mut anon = Client::new(router.clone());
    assert_eq!(anon.get(&page).await.status, StatusCode::SEE_OTHER);
    let form = anon.get("/login").await;
    assert!(
        !form.body.contains("name=\"name\""),
        "the file names people: {}",
        form.body
    );
    let p = anon.login_token("cairn_not-a-token-0000000000000000").await;
    assert_eq!(p.status, StatusCode::UNAUTHORIZED, "{}", p.body);

    // A viewer sees the run and no buttons; its POSTs are refused.
    let mut vic = Client::new(router.clone());
    let p = vic.login_token(&o.token("vic")).await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    let p = vic.get(&page).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    assert!(
        p.body
            .contains("signed in as <strong id=\"who\">vic</strong>"),
        "{}",
        p.body
    );
    assert!(p.body.contains("viewer"), "shows the role: {}", p.body);
    assert!(!p.body.contains(">Approve<"), "{}", p.body);
    assert!(
        !p.body.contains("Add note") && !p.body.contains("Save context"),
        "{}",
        p.body
    );
    let csrf = p.csrf();
    let approve = format!("{page}/gates/review/approve");
    let p = vic.post(&approve, &[("csrf", &csrf), ("note", "")]).await;
    assert_eq!(p.status, StatusCode::FORBIDDEN, "{}", p.body);
    let p = vic
        .post(&format!("{page}/notes"), &[("csrf", &csrf), ("text", "x")])
        .await;
    assert_eq!(p.status, StatusCode::FORBIDDEN, "{}", p.body);
    assert_eq!(
        o.get(PROJECT, &run).await.state,
        TaskState::InputRequired as i32
    );

    // An operator may write a note, not decide; the note is recorded under its name.
    let mut ozzy = Client::new(router.clone());
    assert_eq!(
        ozzy.login_token(&o.token("ozzy")).await.status,
        StatusCode::SEE_OTHER
    );
    let p = ozzy.get(&page).await;
    assert!(
        p.body.contains("Add note") && !p.body.contains(">Approve<"),
        "{}",
        p.body
    );
    let csrf = p.csrf();
    let p = ozzy
        .post(
            &format!("{page}/notes"),
            &[("csrf", &csrf), ("text", "use tabs")],
        )
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    let p = ozzy.post(&approve, &[("csrf", &csrf), ("note", "")]).await;
    assert_eq!(p.status, StatusCode::FORBIDDEN, "{}", p.body);

    // An approver decides; the orchestrator records the token's name.
    let mut ann = Client::new(router.clone());
    assert_eq!(
        ann.login_token(&o.token("ann")).await.status,
        StatusCode::SEE_OTHER
    );
    let p = ann.get(&page).await;
    assert!(p.body.contains(">Approve<"), "{}", p.body);
    let csrf = p.csrf();
    let p = ann
        .post(&approve, &[("csrf", &csrf), ("note", "fine")])
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    let info = o.wait_state(PROJECT, &run, TaskState::Completed).await;
    assert_eq!(info.gates[0].state, GateState::Approved as i32);
    assert_eq!(info.gates[0].decided_by, "ann");
    let events = common::read_events(&o.store, &run).await;
    let by =
        |kind: &str| common::data(events.iter().find(|e| e.r#type == kind).unwrap())["by"].clone();
    assert_eq!(by("human.note"), "ozzy");
    assert_eq!(by("gate.approved"), "ann");

    // A token scoped to one project sees nothing of another.
    let theirs = o.blocked_run(auth_support::OTHER).await;
    let mut pat = Client::new(router);
    assert_eq!(
        pat.login_token(&o.token("pat")).await.status,
        StatusCode::SEE_OTHER
    );
    let p = pat
        .get(&format!("/projects/{}/runs/{theirs}", auth_support::OTHER))
        .await;
    assert_eq!(p.status, StatusCode::FORBIDDEN, "{}", p.body);
    let p = pat
        .get(&format!(
            "/projects/{}/download?path=.cairn/runs/{theirs}/task.yaml",
            auth_support::OTHER
        ))
        .await;
    assert_eq!(p.status, StatusCode::FORBIDDEN, "{}", p.body);
    assert_eq!(pat.get(&page).await.status, StatusCode::OK);
}

/// POSTs `fields` to `uri`.
async fn post(c: &mut Client, uri: String, fields: Vec<(&str, String)>) -> console_support::Page {
    let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    c.post(&uri, &pairs).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_re_running_resuming_and_canceling_follow_the_roles() {
    let o = auth_support::Secured::start(true).await;
    let router = console_router(ConsoleConfig {
        enabled: true,
        orchestrator_addr: o.orch_addr.clone(),
        store_addr: o.store_addr.clone(),
        user_tokens: true,
        ..ConsoleConfig::default()
    })
    .unwrap();
    console_support::put(
        &o.store_addr,
        PROJECT,
        "graphs/gated.yaml",
        auth_support::GATED.as_bytes().to_vec(),
    )
    .await;
    let run = o.blocked_run(PROJECT).await;
    let page = format!("/projects/{PROJECT}/runs/{run}");
    let start = |csrf: &str, project: &str| {
        vec![
            ("csrf", csrf.to_owned()),
            ("project", project.to_owned()),
            ("source", "graph".to_owned()),
            ("graph_path", "graphs/gated.yaml".to_owned()),
        ]
    };

    // A viewer is offered none of it, and each POST is refused before the orchestrator.
    let mut vic = Client::new(router.clone());
    vic.login_token(&o.token("vic")).await;
    let list = vic.get(&format!("/runs?project={PROJECT}")).await;
    assert!(!list.body.contains("id=\"start-run\""), "{}", list.body);
    let p = vic.get(&page).await;
    for id in ["rerun-form", "cancel-form", "resume-form"] {
        assert!(
            !p.body.contains(&format!("id=\"{id}\"")),
            "{id}: {}",
            p.body
        );
    }
    let csrf = p.csrf();
    assert_eq!(vic.get("/start").await.status, StatusCode::FORBIDDEN);
    for (uri, fields) in [
        ("/start".to_owned(), start(&csrf, PROJECT)),
        (format!("{page}/rerun"), vec![("csrf", csrf.clone())]),
        (format!("{page}/resume"), vec![("csrf", csrf.clone())]),
        (
            format!("{page}/cancel"),
            vec![("csrf", csrf.clone()), ("confirm", "yes".to_owned())],
        ),
    ] {
        let r = post(&mut vic, uri.clone(), fields).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{uri}: {}", r.body);
    }
    assert_eq!(
        o.get(PROJECT, &run).await.state,
        TaskState::InputRequired as i32
    );

    // An operator starts and re-runs; the runs are recorded under its name.
    let mut ozzy = Client::new(router.clone());
    ozzy.login_token(&o.token("ozzy")).await;
    let p = ozzy.get(&page).await;
    assert!(p.body.contains("id=\"rerun-form\"") && p.body.contains("id=\"cancel-form\""));
    let csrf = p.csrf();
    let r = post(&mut ozzy, "/start".into(), start(&csrf, PROJECT)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let started = r.location().rsplit('/').next().unwrap().to_owned();
    let r = post(
        &mut ozzy,
        format!("{page}/rerun"),
        vec![("csrf", csrf.clone()), ("request_id", "ozzy-1".into())],
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let rerun = r.location().rsplit('/').next().unwrap().to_owned();
    assert_eq!(o.get(PROJECT, &rerun).await.rerun_of, run);
    for id in [&started, &rerun] {
        let events = common::read_events(&o.store, id).await;
        assert_eq!(common::data(&events[0])["by"], "ozzy", "{id}");
    }

    // A token limited to one project starts nothing in another.
    let mut pat = Client::new(router);
    pat.login_token(&o.token("pat")).await;
    let csrf = pat.get(&page).await.csrf();
    let r = post(&mut pat, "/start".into(), start(&csrf, auth_support::OTHER)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
}

/// The start form suggests graph files of the projects the visitor may act on only: an
/// operator scoped to one project who names another in `?project=` gets none of its names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_form_lists_no_graph_of_a_project_outside_the_visitors_scope() {
    let o = auth_support::Secured::start(true).await;
    let router = console_router(ConsoleConfig {
        enabled: true,
        orchestrator_addr: o.orch_addr.clone(),
        store_addr: o.store_addr.clone(),
        user_tokens: true,
        ..ConsoleConfig::default()
    })
    .unwrap();
    for project in [PROJECT, auth_support::OTHER] {
        console_support::put(
            &o.store_addr,
            project,
            &format!("graphs/plan-of-{project}.yaml"),
            auth_support::GATED.as_bytes().to_vec(),
        )
        .await;
    }
    let mut pat = Client::new(router);
    pat.login_token(&o.token("pat")).await;
    let own = pat.get(&format!("/start?project={PROJECT}")).await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.body);
    assert!(
        own.body.contains(&format!("plan-of-{PROJECT}.yaml")),
        "{}",
        own.body
    );
    let other = pat
        .get(&format!("/start?project={}", auth_support::OTHER))
        .await;
    assert!(
        !other
            .body
            .contains(&format!("plan-of-{}.yaml", auth_support::OTHER)),
        "{}",
        other.body
    );
}

/// A deep link from another site (chat, a ticket, a mail) opens the page when the visitor has
/// a session: the cookie is SameSite=Lax, which browsers send with a top-level GET navigation
/// from elsewhere, and nothing else about the request is held against it. A POST from
/// elsewhere that carries the cookie (a form on another site, or a page of it that guessed
/// the session) is refused without the console's own Origin, and without the session's CSRF
/// token even with it.
#[tokio::test]
async fn a_link_from_another_site_opens_the_page_but_its_posts_need_the_csrf_token() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(Some(TOKEN)));
    let p = c.login("ann", Some(TOKEN)).await;
    let set = p.headers.get(header::SET_COOKIE).unwrap().to_str().unwrap();
    assert!(set.contains("SameSite=Lax"), "{set}");
    // What a browser sends for a link clicked on another site.
    let cross_site = [
        ("host", CONSOLE_HOST),
        ("referer", "https://chat.example/room/42"),
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-mode", "navigate"),
        ("sec-fetch-dest", "document"),
    ];
    let p = c.raw("GET", &run_url(), &cross_site, &[]).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    assert!(p.body.contains("Draft and publish"), "{}", p.body);
    assert!(p.body.contains(">ann</strong>"), "the session came along");
    // Without a session the same link leads to the login, then back to the page.
    let mut stranger = Client::new(c.router.clone());
    let p = stranger.raw("GET", &run_url(), &cross_site, &[]).await;
    assert_eq!(p.status, StatusCode::SEE_OTHER);
    assert_eq!(p.location(), format!("/login?next={}", run_url()));

    // POSTs with the cookie from another site: refused, and nothing reaches the orchestrator.
    let csrf = c.csrf().await;
    let url = format!("{}/gates/review/approve", run_url());
    let forged = "0".repeat(64);
    for (origin, token) in [
        ("https://chat.example", ""),
        ("https://chat.example", forged.as_str()),
        ("https://chat.example", csrf.as_str()),
        (CONSOLE_ORIGIN, ""),
        (CONSOLE_ORIGIN, forged.as_str()),
    ] {
        let mut fields = vec![("note", "from elsewhere")];
        if !token.is_empty() {
            fields.push(("csrf", token));
        }
        let p = c
            .raw(
                "POST",
                &url,
                &[
                    ("host", CONSOLE_HOST),
                    ("origin", origin),
                    ("sec-fetch-site", "cross-site"),
                ],
                &fields,
            )
            .await;
        assert_eq!(
            p.status,
            StatusCode::FORBIDDEN,
            "Origin {origin}, csrf {token:?}: {}",
            p.body
        );
    }
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
    // The console's own form (its Origin, the session's token) still works.
    let p = c
        .raw(
            "POST",
            &url,
            &[("host", CONSOLE_HOST), ("origin", CONSOLE_ORIGIN)],
            &[("csrf", &csrf), ("note", "from the console")],
        )
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    assert_eq!(s.fake.calls().len(), 1);
}

/// The probes answer without a login and whatever the Host (a kubelet sends the pod's IP
/// address), and reveal nothing: a word, no cookie, no address; pages stay behind the Host
/// check. /readyz follows the orchestrator and the store.
#[tokio::test]
async fn probes_answer_any_host_without_login_and_say_nothing_else() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(Some(TOKEN)));
    for host in ["10.244.1.17:7480", CONSOLE_HOST, "evil.example"] {
        let p = c.raw("GET", "/healthz", &[("host", host)], &[]).await;
        assert_eq!(
            (p.status, p.body.as_str()),
            (StatusCode::OK, "ok\n"),
            "{host}"
        );
        assert!(!p.headers.contains_key(header::SET_COOKIE), "{host}");
        let p = c.raw("GET", "/readyz", &[("host", host)], &[]).await;
        assert_eq!(
            (p.status, p.body.as_str()),
            (StatusCode::OK, "ready\n"),
            "{host}"
        );
        assert!(!p.headers.contains_key(header::SET_COOKIE), "{host}");
    }
    // The pod address is not a name of the console's pages.
    let p = c
        .raw("GET", "/runs", &[("host", "10.244.1.17:7480")], &[])
        .await;
    assert_eq!(p.status, StatusCode::FORBIDDEN, "{}", p.body);
    // Only GET: the probes are no way around the Origin and CSRF checks.
    let p = c
        .raw("POST", "/healthz", &[("host", "evil.example")], &[])
        .await;
    assert_eq!(p.status, StatusCode::METHOD_NOT_ALLOWED);

    // The store and the orchestrator unreachable: not ready, and not why (that is logged).
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut down = Client::new(
        console_router(ConsoleConfig {
            orchestrator_addr: dead.clone(),
            store_addr: dead.clone(),
            ..s.config(Some(TOKEN))
        })
        .unwrap(),
    );
    let t = Instant::now();
    let p = down
        .raw("GET", "/readyz", &[("host", "10.244.1.17:7480")], &[])
        .await;
    assert_eq!(
        (p.status, p.body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    );
    assert!(!p.body.contains(&dead));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let p = down
        .raw("GET", "/healthz", &[("host", "10.244.1.17:7480")], &[])
        .await;
    assert_eq!(
        p.status,
        StatusCode::OK,
        "alive while its services are away"
    );
}
