//! The console in headless Chromium, page by page: every page fits a phone (no sideways
//! scrolling at 390 px, long tables collapsed), axe-core finds no serious or critical problem
//! at desktop and phone widths, a deep link from another site keeps the session, and a running
//! sandbox node's output appears live in its panel.
//!
//! Without chromedriver the tests print `SKIP: ...` and pass, unless `CAIRN_REQUIRE_BROWSER=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod browser_support;
mod console_support;

use std::time::Duration;

use browser_support::*;
use cairn_proto::v1::NodeState;
use console_support::*;
use fantoccini::Locator;

/// Item 10: at 390 px (a phone) the runs list and a run page reflow: the page never scrolls
/// sideways and every table becomes cards whose cells are at least 8 characters wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_list_and_a_run_page_fit_a_phone() {
    let Some((_driver, client)) = browser().await else {
        return;
    };
    let c = &client;
    let s = Services::start().await;
    let base = start_console(s.config(Some(TOKEN))).await;
    c.set_window_size(390, 844).await.unwrap();
    login(c, &base, &format!("runs?project={PROJECT}")).await;
    c.wait()
        .for_element(Locator::Css("table.runs"))
        .await
        .unwrap();
    assert_fits(c, "the runs list", 5).await;
    shoot_page(c, 390, "phone-runs.png").await;

    c.set_window_size(390, 844).await.unwrap();
    c.goto(&format!("{base}projects/{PROJECT}/runs/{RUN}"))
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#gate-review button.approve"))
        .await
        .unwrap();
    assert_fits(c, "the run page", 20).await;
    // The gate's buttons are on the screen, not beside it.
    let approve = c
        .find(Locator::Css("#gate-review button.approve"))
        .await
        .unwrap();
    let (x, _, w, _) = approve.rectangle().await.unwrap();
    assert!(x >= 0.0 && x + w <= 390.0, "Approve at x {x}, width {w}");
    shoot_page(c, 390, "phone-run.png").await;

    // The same page at desktop width keeps its tables (cells side by side).
    c.set_window_size(1280, 900).await.unwrap();
    let display = c
        .execute(
            "return getComputedStyle(document.querySelector('table.milestones td')).display;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(display, "table-cell");
    client.close().await.unwrap();
}

/// axe-core finds no critical or serious accessibility problem on any page (the login page,
/// the runs list, a run page with a blocked gate, a node's panel, its whole output, a file
/// view, a directory, the start form, a diff of two turns, two runs compared) at desktop and
/// phone widths, and at 390 px no page scrolls sideways (every finding is printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_have_no_critical_or_serious_accessibility_findings() {
    let axe = axe_path();
    let Ok(source) = std::fs::read_to_string(&axe) else {
        let why = format!(
            "axe-core is not at {} (scripts/setup.sh fetches it; CAIRN_AXE_JS names another file)",
            axe.display()
        );
        if browser_required() {
            panic!("CAIRN_REQUIRE_BROWSER=1 but {why}");
        }
        println!("SKIP: {why}");
        return;
    };
    let Some((_driver, client)) = browser().await else {
        return;
    };
    let c = &client;
    let s = Services::start().await;
    let turns = format!(".cairn/runs/{RUN}/agents/writer-1/artifacts");
    s.put(&format!("{turns}/turn-1.md"), "# Plan\n\none\ntwo\n")
        .await;
    s.put(&format!("{turns}/turn-2.md"), "# Plan\n\none\n2\nthree\n")
        .await;
    s.fake
        .add_run(blocked_run("run-2", "Again", "2026-01-02T00:00:00.000Z"));
    let (report, verdict) = sample_diff(RUN, "run-2");
    s.fake.set_diff(report, verdict);
    let base = start_console(s.config(Some(TOKEN))).await;
    let pages = [
        (format!("runs?project={PROJECT}"), "table.runs"),
        (
            format!("projects/{PROJECT}/runs/{RUN}"),
            "#gate-review button.approve",
        ),
        (
            format!("projects/{PROJECT}/runs/{RUN}/nodes/review"),
            "#node-page",
        ),
        (
            format!("projects/{PROJECT}/runs/{RUN}/nodes/draft/log"),
            "#log-summary",
        ),
        (
            format!("projects/{PROJECT}/files?path=docs/run-1/report.md"),
            "article.markdown",
        ),
        (
            format!("projects/{PROJECT}/tree?prefix=docs/run-1"),
            "main table",
        ),
        (format!("start?project={PROJECT}"), "#start-form"),
        (
            format!("projects/{PROJECT}/runs/{RUN}/agents/writer-1/diff?turn=2"),
            "#turn-diff",
        ),
        (
            format!("projects/{PROJECT}/diff?a={RUN}&b=run-2"),
            "#compare-verdict",
        ),
    ];
    for (width, height) in [(1280, 900), (390, 844)] {
        c.set_window_size(width, height).await.unwrap();
        c.delete_all_cookies().await.unwrap();
        c.goto(&format!("{base}login")).await.unwrap();
        c.wait()
            .for_element(Locator::Css("input[name=name]"))
            .await
            .unwrap();
        axe_check(c, &source, &format!("the login page at {width} px")).await;
        login(c, &base, &format!("runs?project={PROJECT}")).await;
        for (path, ready) in &pages {
            c.goto(&format!("{base}{path}")).await.unwrap();
            c.wait()
                .for_element(Locator::Css(ready))
                .await
                .unwrap_or_else(|e| panic!("{path}: {ready}: {e}"));
            let what = format!("{path} at {width} px");
            axe_check(c, &source, &what).await;
            if width < 640 {
                let m = c.execute(LAYOUT_JS, vec![]).await.unwrap();
                assert!(
                    m["scrollWidth"].as_f64() <= m["clientWidth"].as_f64()
                        && m["wide"].as_array().unwrap().is_empty(),
                    "{what}: the page scrolls sideways: {m}"
                );
            }
        }
    }
    client.close().await.unwrap();
}

/// Item 10: a link on another site (here: a page on `localhost`, another site than the
/// console's `127.0.0.1`) opens the run page with the session the browser holds (the cookie
/// is SameSite=Lax); a form on that site posting to the console with a forged CSRF token is
/// refused, and the orchestrator gets no call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_link_from_another_site_opens_the_page_with_the_session() {
    let Some((_driver, client)) = browser().await else {
        return;
    };
    let c = &client;
    let s = Services::start().await;
    let base = start_console(s.config(Some(TOKEN))).await;
    let target = format!("{base}projects/{PROJECT}/runs/{RUN}");
    let other = {
        let html = format!(
            r#"<!doctype html><title>chat</title>
<a id="deep" href="{target}">the run</a>
<form id="forged" method="post" action="{target}/notes">
<input type="hidden" name="csrf" value="{forged}"><input name="text" value="from elsewhere">
<button id="send" type="submit">send</button></form>"#,
            forged = "0".repeat(64)
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let app = axum::Router::new().route(
            "/",
            axum::routing::get(move || {
                let html = html.clone();
                async move { axum::response::Html(html) }
            }),
        );
        tokio::spawn(async move { axum::serve(l, app).await });
        format!("http://localhost:{port}/")
    };

    login(c, &base, "runs").await;
    c.goto(&other).await.unwrap();
    c.find(Locator::Css("#deep"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for("the run page", || async {
        c.current_url()
            .await
            .map(|u| u.as_str() == target)
            .unwrap_or(false)
    })
    .await;
    assert_eq!(text_of(c, "#who").await, "ann", "the session came along");
    assert!(c
        .find(Locator::Css("#gate-review button.approve"))
        .await
        .is_ok());

    c.goto(&other).await.unwrap();
    c.find(Locator::Css("#send"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for("the refusal", || async {
        text_of(c, "#error-message").await.contains("Origin")
            || text_of(c, "h1").await.contains("403")
    })
    .await;
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
    client.close().await.unwrap();
}

/// A sandbox program that prints a marker, flushes, and keeps running a while; its first line
/// carries markup that must stay text.
const LIVE_OUTPUT: &str = r##"
title: Live output
nodes:
  - id: job
    type: sandbox_run
    language: python
    allowed_prefixes: ["docs/"]
    timeout_s: 60
    code: |
      import sys, time
      print('<script>window.cairnXss = 1</script><img src=x onerror="window.cairnXss = 2">', flush=True)
      print('live-marker-1', flush=True)
      print('warming up', file=sys.stderr, flush=True)
      time.sleep(8)
      print('after-the-wait')
"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_sandbox_nodes_output_appears_live_in_its_panel() {
    let Some((_driver, client)) = browser().await else {
        return;
    };
    let c = &client;
    let dir = tempfile::tempdir().unwrap();
    let (store_addr, store_stop) = start_store(dir.path()).await;
    let (orchestrator_addr, handle, runner) =
        match real_orchestrator_with_runner(&store_addr, dir.path()).await {
            Ok(x) => x,
            Err(e) => {
                println!("SKIP: no sandbox backend can run here ({e})");
                return;
            }
        };
    let r = RealStack::over(dir, store_addr, store_stop, orchestrator_addr, handle).await;
    let run_id = r.submit(LIVE_OUTPUT, &[]).await;
    login(c, &r.base, &format!("projects/{PROJECT}/runs/{run_id}")).await;
    mark_page(c).await;
    wait_for("the marker in the node's panel", || async {
        text_of(c, "#log-job").await.contains("live-marker-1")
    })
    .await;
    // The orchestrator still runs the node: the line came live, not with the node's end.
    let info = r.get(&run_id).await;
    let job = info.nodes.iter().find(|n| n.id == "job").unwrap();
    assert_eq!(job.state, NodeState::Running as i32, "{info:#?}");
    let pane = text_of(c, "#log-job").await;
    assert!(!pane.contains("after-the-wait"), "{pane}");
    assert!(
        pane.contains("<script>window.cairnXss = 1</script>"),
        "{pane}"
    );
    assert!(page_kept(c).await, "appended, not reloaded");
    // The program's markup stayed text: nothing ran, no element was made from it.
    let inert = c
        .execute(
            "return window.cairnXss === undefined && document.querySelectorAll('#log-job img, #log-job script').length === 0;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(inert.as_bool(), Some(true));
    shoot(c, Some("#panel-job"), "node-output-live.png").await;

    // Then the node ends: the rest of its output and its end are in the panel.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let pane = text_of(c, "#log-job").await;
        if pane.contains("after-the-wait") && pane.contains("[attempt 1 ended: succeeded]") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the node's end never showed: {pane}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_for("the run to complete", || async {
        run_state(c).await == "completed"
    })
    .await;
    wait_for("the stream to say the output is complete", || async {
        text_of(c, "#log-status-job").await.contains("complete")
    })
    .await;
    client.close().await.unwrap();
    r.handle.shutdown().await;
    runner.shutdown().await;
}
