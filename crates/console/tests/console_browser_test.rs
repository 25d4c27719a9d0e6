//! The console end to end in headless Chromium (Debian `chromium` + `chromium-driver`), driven
//! over WebDriver with fantoccini: log in, open a run blocked at a gate, approve it with a note,
//! see the run complete and the note in the live events. Once against the real orchestrator
//! (a graph with a gate), once against the fake one. The run page is saved as a PNG screenshot
//! under `$CARGO_TARGET_DIR/console-screenshots/`.
//!
//! Without chromedriver the tests print `SKIP: ...` and pass, unless `CAIRN_REQUIRE_BROWSER=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod console_support;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_console::{serve_console, ConsoleConfig};
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{GetRunRequest, SubmitRunRequest, TaskState};
use console_support::*;
use fantoccini::{Client, ClientBuilder, Locator};
use tokio::process::{Child, Command};

fn browser_required() -> bool {
    std::env::var("CAIRN_REQUIRE_BROWSER")
        .map(|v| v == "1")
        .unwrap_or(false)
}

/// A program on PATH (or the path an env var names).
fn find_program(env: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// chromedriver on a free port with a Chromium session; None (after printing SKIP) when the
/// packages are not installed and the browser is not required.
async fn browser() -> Option<(Child, Client)> {
    let driver = find_program("CAIRN_CHROMEDRIVER", &["chromedriver"]);
    let chromium = find_program(
        "CAIRN_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
    );
    let (Some(driver), Some(chromium)) = (driver, chromium) else {
        let why = "chromedriver or chromium is not installed (Debian packages chromium and chromium-driver; scripts/setup.sh installs them)";
        if browser_required() {
            panic!("CAIRN_REQUIRE_BROWSER=1 but {why}");
        }
        println!("SKIP: {why}");
        return None;
    };
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let child = Command::new(&driver)
        .arg(format!("--port={port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", driver.display()));
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,2200"]
        }),
    );
    let url = format!("http://127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(client) => return Some((child, client)),
            Err(e) if tokio::time::Instant::now() > deadline => {
                panic!("no WebDriver session from {}: {e}", driver.display())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Polls `check` until it holds (20 s at most).
async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

async fn run_state(c: &Client) -> String {
    match c.find(Locator::Css("#run-state")).await {
        Ok(e) => e
            .attr("data-state")
            .await
            .ok()
            .flatten()
            .unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Texts of the rows of the live event table.
async fn event_rows(c: &Client) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rows) = c.find_all(Locator::Css("#event-table tbody tr")).await {
        for r in rows {
            out.push(r.text().await.unwrap_or_default());
        }
    }
    out
}

fn screenshot_path(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_TARGET_TMPDIR"))
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("target"))
        });
    let dir = target.join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

async fn start_console(config: ConsoleConfig) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = cairn_console::console_url(l.local_addr().unwrap());
    tokio::spawn(serve_console(config, l, std::future::pending()));
    url
}

/// Logs in through the form the run page redirects to, approves gate `review` with `note`,
/// and waits for the run to complete with the note in the live events; saves a screenshot.
async fn approve_in_browser(c: &Client, base: &str, run_id: &str, note: &str, shot: &str) {
    let run_page = format!("{base}projects/{PROJECT}/runs/{run_id}");
    c.goto(&run_page).await.unwrap();
    let name = c
        .wait()
        .for_element(Locator::Css("input[name=name]"))
        .await
        .unwrap();
    assert!(
        c.current_url().await.unwrap().path().starts_with("/login"),
        "the run page asks for a login first"
    );
    name.clear().await.unwrap();
    name.send_keys("ann").await.unwrap();
    c.find(Locator::Css("input[name=token]"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    c.find(Locator::Css("form.card button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for("the run page after login", || async {
        c.current_url()
            .await
            .map(|u| u.path().contains(run_id))
            .unwrap_or(false)
    })
    .await;
    assert_eq!(
        c.find(Locator::Css("#who"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "ann"
    );

    wait_for("the run to wait at its gate", || async {
        run_state(c).await == "input-required"
    })
    .await;
    wait_for("the gate.blocked event in the live table", || async {
        event_rows(c)
            .await
            .iter()
            .any(|r| r.contains("gate.blocked"))
    })
    .await;
    let gate = c.find(Locator::Css("#gate-review")).await.unwrap();
    gate.find(Locator::Css("textarea[name=note]"))
        .await
        .unwrap()
        .send_keys(note)
        .await
        .unwrap();
    gate.find(Locator::Css("button.approve"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();

    wait_for("the confirmation", || async {
        match c.find(Locator::Css(".flash.ok")).await {
            Ok(e) => e
                .text()
                .await
                .unwrap_or_default()
                .contains("Approved gate review"),
            Err(_) => false,
        }
    })
    .await;
    wait_for("the run to complete", || async {
        run_state(c).await == "completed"
    })
    .await;
    wait_for("the approval with its note in the events", || async {
        event_rows(c)
            .await
            .iter()
            .any(|r| r.contains("gate.approved") && r.contains(note) && r.contains("by: ann"))
    })
    .await;
    wait_for("task.completed in the events", || async {
        event_rows(c)
            .await
            .iter()
            .any(|r| r.contains("task.completed"))
    })
    .await;
    let status = c
        .find(Locator::Css("#events-status"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        status.contains("Stream closed: the run is over"),
        "{status}"
    );
    // The note is markup-free text everywhere it shows.
    let html = c.source().await.unwrap();
    assert!(
        !html.contains("<b>by hand</b>"),
        "the note's markup is not rendered"
    );

    // The redirect lands on #gates; the screenshot shows the page from its top.
    c.execute("window.scrollTo(0, 0); return true;", vec![])
        .await
        .unwrap();
    let png = c.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let path = screenshot_path(shot);
    std::fs::write(&path, &png).unwrap();
    println!("screenshot of the run page: {}", path.display());
}

const GATED: &str = r##"
title: Draft, review, publish
nodes:
  - {id: draft, type: write_file, path: "docs/{{run_id}}/draft.md", content: "# Draft\n\nTo be reviewed.\n"}
  - {id: review, type: gate, reason: "check {{nodes.draft.path}}", needs: [draft]}
  - {id: publish, type: write_file, path: "docs/{{run_id}}/published.txt", content: "ok by {{nodes.review.by}}", needs: [review]}
"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_approves_a_gate_of_a_real_run_from_the_browser() {
    let Some((_driver, client)) = browser().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (store_addr, _store_stop) = start_store(dir.path()).await;
    let config = cairn_orchestrator::Config {
        store_addr: store_addr.clone(),
        snapshot_interval_ms: 100,
        ..cairn_orchestrator::Config::default()
    };
    let (server, handle) = cairn_orchestrator::orchestrator_service(config)
        .await
        .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let orchestrator_addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut host = cairn_server::Host::new();
        host.add(server);
        let _ = host.serve(l, std::future::pending()).await;
    });
    let mut orch = OrchestratorClient::new(cairn_server::connect(&orchestrator_addr).unwrap());
    let run = orch
        .submit_run(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: GATED.into(),
            by: "cli".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let run_id = run.run_id.clone();
    wait_for("the real run to block at its gate", || {
        let mut orch = orch.clone();
        let run_id = run_id.clone();
        async move {
            let info = orch
                .get_run(GetRunRequest {
                    project_id: PROJECT.into(),
                    run_id,
                })
                .await
                .unwrap()
                .into_inner();
            info.state == TaskState::InputRequired as i32
        }
    })
    .await;

    let base = start_console(ConsoleConfig {
        enabled: true,
        orchestrator_addr,
        store_addr: store_addr.clone(),
        token: Some(TOKEN.into()),
        ..ConsoleConfig::default()
    })
    .await;
    let note = "Checked the draft <b>by hand</b>; publish it.";
    approve_in_browser(&client, &base, &run_id, note, "run-page.png").await;

    // The orchestrator continued the run with the decision: who approved, and the note.
    let info = orch
        .get_run(GetRunRequest {
            project_id: PROJECT.into(),
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.state, TaskState::Completed as i32);
    assert_eq!(
        (
            info.gates[0].decided_by.as_str(),
            info.gates[0].note.as_str()
        ),
        ("ann", note)
    );
    // The page shows the published file and the note in human-notes.md after a reload.
    client.refresh().await.unwrap();
    let notes = client
        .wait()
        .for_element(Locator::Css("#notes-text"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(notes.contains(note), "{notes}");
    let source = client.source().await.unwrap();
    assert!(
        source.contains(&format!("docs/{run_id}/published.txt")),
        "the published file is linked"
    );
    client.close().await.unwrap();
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_approves_a_gate_from_the_browser_with_the_fake_orchestrator() {
    let Some((_driver, client)) = browser().await else {
        return;
    };
    let s = Services::start().await;
    let base = start_console(s.config(Some(TOKEN))).await;
    let note = "Ship it, checked <b>by hand</b>.";
    approve_in_browser(&client, &base, RUN, note, "run-page-fake.png").await;
    let calls = s.fake.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        (
            calls[0].method,
            calls[0].by.as_str(),
            calls[0].text.as_str()
        ),
        ("ApproveGate", "ann", note)
    );
    client.close().await.unwrap();
}
