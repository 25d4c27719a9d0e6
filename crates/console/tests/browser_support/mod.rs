//! Driving the console in headless Chromium (Debian `chromium` + `chromium-driver`) over
//! WebDriver with fantoccini: the browser session, logging in, waiting, reading the page,
//! screenshots, axe-core and the phone-layout measure. Shared by the browser test files.
//!
//! Without chromedriver the tests print `SKIP: ...` and pass, unless `CAIRN_REQUIRE_BROWSER=1`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_console::{serve_console, ConsoleConfig};
use fantoccini::{Client, ClientBuilder, Locator};
use tokio::process::{Child, Command};

use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{GetRunRequest, RunInfo, SubmitRunRequest, TaskState};
use tonic::transport::Channel;

use crate::console_support::{put, real_orchestrator, start_store, PROJECT, TOKEN};

pub fn browser_required() -> bool {
    std::env::var("CAIRN_REQUIRE_BROWSER")
        .map(|v| v == "1")
        .unwrap_or(false)
}

/// A program on PATH (or the path an env var names).
pub fn find_program(env: &str, names: &[&str]) -> Option<PathBuf> {
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
pub async fn browser() -> Option<(Child, Client)> {
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

/// Polls `check` until it holds (45 s at most: the whole suite runs beside it on two cores).
pub async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(45);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

pub async fn run_state(c: &Client) -> String {
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
pub async fn event_rows(c: &Client) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rows) = c.find_all(Locator::Css("#event-table tbody tr")).await {
        for r in rows {
            out.push(r.text().await.unwrap_or_default());
        }
    }
    out
}

pub fn screenshot_path(name: &str) -> PathBuf {
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

pub async fn start_console(config: ConsoleConfig) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = cairn_console::console_url(l.local_addr().unwrap());
    tokio::spawn(serve_console(config, l, std::future::pending()));
    url
}

/// Opens `path` (relative to `base`), logs in as ann through the form it redirects to, and
/// waits to be back on `path`.
pub async fn login(c: &Client, base: &str, path: &str) {
    c.goto(&format!("{base}{path}")).await.unwrap();
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
    let want = path.split('?').next().unwrap_or(path).to_owned();
    wait_for("the page after login", || async {
        c.current_url()
            .await
            .map(|u| u.path().trim_start_matches('/') == want)
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
}

/// Types `note` into gate `gate`'s form on the page and clicks Approve.
pub async fn approve_on_page(c: &Client, gate: &str, note: &str) {
    let gate = c
        .find(Locator::Css(&format!("#gate-{gate}")))
        .await
        .unwrap();
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
}

/// A console with the shared login token over these services.
pub async fn console_with_token(orchestrator_addr: String, store_addr: &str) -> String {
    start_console(ConsoleConfig {
        enabled: true,
        orchestrator_addr,
        store_addr: store_addr.to_owned(),
        token: Some(TOKEN.into()),
        ..ConsoleConfig::default()
    })
    .await
}

/// What most browser tests start from: a real artifact-store and the real orchestrator on
/// loopback ports (a temp dir each), a gRPC client of the orchestrator, and a console with
/// the shared login token over them.
pub struct RealStack {
    pub dir: tempfile::TempDir,
    pub store_addr: String,
    pub orchestrator_addr: String,
    pub orch: OrchestratorClient<Channel>,
    pub handle: cairn_orchestrator::Handle,
    /// The console's URL.
    pub base: String,
    _store_stop: tokio::sync::oneshot::Sender<()>,
}

impl RealStack {
    pub async fn start() -> RealStack {
        RealStack::start_in(tempfile::tempdir().unwrap()).await
    }

    /// The stack over `dir`, whose `data/` may hold projects already (the store indexes them
    /// at start).
    pub async fn start_in(dir: tempfile::TempDir) -> RealStack {
        let (store_addr, store_stop) = start_store(dir.path()).await;
        let (orchestrator_addr, handle) = real_orchestrator(&store_addr).await;
        RealStack::over(dir, store_addr, store_stop, orchestrator_addr, handle).await
    }

    /// The stack over services already started (e.g. an orchestrator with a sandbox runner).
    pub async fn over(
        dir: tempfile::TempDir,
        store_addr: String,
        store_stop: tokio::sync::oneshot::Sender<()>,
        orchestrator_addr: String,
        handle: cairn_orchestrator::Handle,
    ) -> RealStack {
        let orch = OrchestratorClient::new(cairn_server::connect(&orchestrator_addr).unwrap());
        let base = console_with_token(orchestrator_addr.clone(), &store_addr).await;
        RealStack {
            dir,
            store_addr,
            orchestrator_addr,
            orch,
            handle,
            base,
            _store_stop: store_stop,
        }
    }

    /// Submits `graph` to the project (by `cli`) with `vars`; the new run's id.
    pub async fn submit(&self, graph: &str, vars: &[(&str, &str)]) -> String {
        self.orch
            .clone()
            .submit_run(SubmitRunRequest {
                project_id: PROJECT.into(),
                graph_yaml: graph.into(),
                by: "cli".into(),
                vars: vars
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .run_id
    }

    /// GetRun of `run` in the project.
    pub async fn get(&self, run: &str) -> RunInfo {
        self.orch
            .clone()
            .get_run(GetRunRequest {
                project_id: PROJECT.into(),
                run_id: run.into(),
            })
            .await
            .unwrap()
            .into_inner()
    }

    /// Waits until `run` is in `state` (as GetRun says).
    pub async fn wait_state(&self, run: &str, state: TaskState) -> RunInfo {
        wait_for(&format!("run {run} to be {state:?}"), || async {
            self.get(run).await.state == state as i32
        })
        .await;
        self.get(run).await
    }

    /// Writes `text` to `path` of the project.
    pub async fn put(&self, path: &str, text: &str) {
        put(&self.store_addr, PROJECT, path, text.as_bytes().to_vec()).await
    }
}

/// Marks the page so a reload (which would lose the mark) shows.
pub async fn mark_page(c: &Client) {
    c.execute("window.cairnMark = 'kept'; return true;", vec![])
        .await
        .unwrap();
}

pub async fn page_kept(c: &Client) -> bool {
    c.execute("return window.cairnMark === 'kept';", vec![])
        .await
        .unwrap()
        .as_bool()
        .unwrap_or(false)
}

pub async fn attr(c: &Client, css: &str, name: &str) -> String {
    match c.find(Locator::Css(css)).await {
        Ok(e) => e.attr(name).await.ok().flatten().unwrap_or_default(),
        Err(_) => String::new(),
    }
}

pub async fn text_of(c: &Client, css: &str) -> String {
    match c.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The seq of every row of the event table.
pub async fn event_seqs(c: &Client) -> Vec<u64> {
    let mut out = Vec::new();
    if let Ok(rows) = c.find_all(Locator::Css("#event-table tbody tr")).await {
        for r in rows {
            let id = r.attr("id").await.ok().flatten().unwrap_or_default();
            out.push(id.trim_start_matches("ev-").parse().unwrap_or(0));
        }
    }
    out
}

/// Saves a PNG of the element (or the page) under the screenshots directory.
pub async fn shoot(c: &Client, css: Option<&str>, name: &str) {
    let png = match css {
        Some(css) => c
            .find(Locator::Css(css))
            .await
            .unwrap()
            .screenshot()
            .await
            .unwrap(),
        None => c.screenshot().await.unwrap(),
    };
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let path = screenshot_path(name);
    std::fs::write(&path, &png).unwrap();
    println!("screenshot: {}", path.display());
}

/// Clicks the element `css` finds. A live page may redraw it between the find and the click
/// (the graph is drawn again on its run's events): WebDriver then refuses the click as stale,
/// without clicking, and it is found and clicked again.
pub async fn click(c: &Client, css: &str) {
    for _ in 0..20 {
        let found = c
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        match found.click().await {
            Ok(_) => return,
            Err(e) if e.is_stale_element_reference() => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("clicking {css}: {e}"),
        }
    }
    panic!("{css}: still redrawn after 20 tries to click it");
}

pub async fn type_into(c: &Client, css: &str, text: &str) {
    let e = c
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    e.clear().await.unwrap();
    e.send_keys(text).await.unwrap();
}

/// The run id of the run page the browser is on.
pub async fn run_on_page(c: &Client) -> String {
    let url = c.current_url().await.unwrap();
    let path = url.path().to_owned();
    path.rsplit("/runs/").next().unwrap_or_default().to_owned()
}

/// Where `scripts/setup.sh` puts axe-core (CAIRN_AXE_JS overrides).
pub fn axe_path() -> PathBuf {
    std::env::var_os("CAIRN_AXE_JS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/cairn-axe/axe.min.js")
        })
}

/// Measures the page as laid out now: its width against the window's, and every visible table
/// cell against 8 characters of the page's font (`8ch` of the body). A diff and a node's output
/// stay tables on a phone, in their own scroll box, like code: their gutters (line numbers, the
/// change sign) are narrow so the text keeps the width; their text column is measured.
pub const LAYOUT_JS: &str = r#"
const probe = document.createElement('div');
probe.style.cssText = 'position:absolute;visibility:hidden;width:8ch';
document.body.appendChild(probe);
const min = probe.getBoundingClientRect().width;
probe.remove();
const narrow = [];
let cells = 0;
for (const c of document.querySelectorAll('main td, main tbody th')) {
  if (c.getClientRects().length === 0 || getComputedStyle(c).display === 'none') continue;
  if (c.matches('table.diff td.num, table.diff td.sign, table.logview td.ln')) continue;
  cells += 1;
  const w = c.getBoundingClientRect().width;
  if (w + 0.5 < min) {
    narrow.push(`${c.closest('table').className} row ${c.parentElement.rowIndex} cell ${c.cellIndex}: ${w.toFixed(1)}px`);
  }
}
const wide = [];
for (const e of document.querySelectorAll('main *')) {
  const r = e.getBoundingClientRect();
  if (r.width === 0 || e.closest('div.scroll, pre')) continue;
  if (r.right > document.documentElement.clientWidth + 0.5) {
    wide.push(`${e.tagName.toLowerCase()}.${e.className} right ${r.right.toFixed(1)}`);
  }
}
return {
  scrollWidth: document.documentElement.scrollWidth,
  clientWidth: document.documentElement.clientWidth,
  innerWidth: window.innerWidth,
  eightCh: min,
  cells, narrow, wide: wide.slice(0, 20),
};
"#;

/// Asserts the page fits a phone: no sideways scrolling, no cell under 8 characters.
pub async fn assert_fits(c: &Client, what: &str, min_cells: u64) {
    let m = c.execute(LAYOUT_JS, vec![]).await.unwrap();
    println!("{what} at phone width: {m}");
    let n = |k: &str| m[k].as_f64().unwrap();
    assert!(
        n("innerWidth") <= 400.0,
        "{what}: the window is not phone-sized: {m}"
    );
    assert!(
        n("scrollWidth") <= n("clientWidth"),
        "{what}: the page scrolls sideways: {m}"
    );
    assert!(
        m["wide"].as_array().unwrap().is_empty(),
        "{what}: elements reach past the window: {m}"
    );
    assert!(
        m["cells"].as_u64().unwrap() >= min_cells,
        "{what}: fewer table cells than expected: {m}"
    );
    assert!(
        m["narrow"].as_array().unwrap().is_empty(),
        "{what}: table cells narrower than 8 characters: {m}"
    );
}

/// Saves a screenshot of the whole page (the window grown to the page's height first).
pub async fn shoot_page(c: &Client, width: u32, name: &str) {
    let height = c
        .execute(
            "return Math.min(document.documentElement.scrollHeight, 4000);",
            vec![],
        )
        .await
        .unwrap()
        .as_u64()
        .unwrap_or(900) as u32;
    c.set_window_size(width, height.max(600)).await.unwrap();
    c.execute("window.scrollTo(0, 0); return true;", vec![])
        .await
        .unwrap();
    shoot(c, None, name).await;
}

/// Runs axe-core (its source: `source`) in the page and fails on any critical or serious
/// finding; prints every finding.
pub async fn axe_check(c: &Client, source: &str, what: &str) {
    c.execute(&format!("{source}\nreturn true;"), vec![])
        .await
        .unwrap();
    let found = c
        .execute_async(
            r#"const done = arguments[arguments.length - 1];
               axe.run(document, { resultTypes: ['violations'] })
                 .then(r => done(r.violations.map(v => ({
                    id: v.id, impact: v.impact, help: v.help,
                    nodes: v.nodes.map(n => n.target.join(' ') + ' :: ' + n.failureSummary) }))))
                 .catch(e => done([{ id: 'axe-error', impact: 'critical', help: String(e), nodes: [] }]));"#,
            vec![],
        )
        .await
        .unwrap();
    let all = found.as_array().cloned().unwrap_or_default();
    for v in &all {
        println!("axe on {what}: {v}");
    }
    let bad: Vec<_> = all
        .iter()
        .filter(|v| matches!(v["impact"].as_str(), Some("critical" | "serious")))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} critical/serious axe findings:\n{}",
        bad.len(),
        bad.iter()
            .map(|v| format!("{v:#}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
