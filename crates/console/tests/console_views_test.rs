//! The run's views through `console_router` (a real artifact-store, a fake orchestrator): a
//! node's panel, a gate's decisions across a rework, the whole output of a node, event fields
//! that name files, the runs list's count and conditional refresh, graph files suggested in a
//! project full of runs, and run ids from the console.
#![allow(clippy::unwrap_used)]

mod console_support;

use axum::http::StatusCode;
use cairn_proto::v1 as pb;
use console_support::*;
use serde_json::json;

#[tokio::test]
async fn a_node_has_a_panel_with_its_attempts_outputs_files_and_events() {
    let s = Services::start().await;
    s.emit(
        RUN,
        "node.started",
        "draft",
        json!({"node_type": "write_file", "attempt": 1}),
    )
    .await;
    s.emit(
        RUN,
        "artifact.written",
        "draft",
        json!({"path": "docs/run-1/draft.txt", "bytes": 12}),
    )
    .await;
    s.emit(
        RUN,
        "node.completed",
        "draft",
        json!({"outputs": {"path": "docs/run-1/draft.txt"}}),
    )
    .await;
    let mut c = logged_in(&s).await;
    let p = c.get(&format!("{}/nodes/draft", run_url())).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    assert!(p.body.contains("id=\"node-attempts\""), "{}", p.body);
    assert!(p.body.contains("id=\"node-outputs\""), "{}", p.body);
    // The file it wrote, linked; its events (and no other node's).
    assert!(
        p.body
            .contains("href=\"/projects/proj/files?path=docs/run-1/draft.txt\""),
        "{}",
        p.body
    );
    assert!(p.body.contains("artifact.written"), "{}", p.body);
    assert!(!p.body.contains("gate.blocked"), "{}", p.body);
    // The graph links each node to its panel.
    let page = c.get(&run_url()).await;
    assert!(
        page.body
            .contains("href=\"/projects/proj/runs/run-1/nodes/draft\""),
        "{}",
        page.body
    );
    let missing = c.get(&format!("{}/nodes/nope", run_url())).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.body);
    assert!(missing.body.contains("no node `nope`"), "{}", missing.body);
}

#[tokio::test]
async fn a_gates_decisions_stay_listed_with_their_attempt_after_a_rework() {
    let s = Services::start().await;
    for (kind, node, data) in [
        ("node.started", "review", json!({"node_type": "gate"})),
        (
            "gate.approved",
            "review",
            json!({"gate_id": "review", "by": "ann", "note": "fine"}),
        ),
        ("node.completed", "review", json!({})),
        (
            "artifact.rework-requested",
            "draft",
            json!({"target": "draft", "by": "bob", "note": "", "nodes": ["draft", "review", "publish"]}),
        ),
        ("node.started", "review", json!({"node_type": "gate"})),
        (
            "gate.blocked",
            "review",
            json!({"gate_id": "review", "reason": "look again"}),
        ),
    ] {
        s.emit(RUN, kind, node, data).await;
    }
    let mut c = logged_in(&s).await;
    let p = c.get(&run_url()).await;
    let start = p.body.find("id=\"gate-history-review\"").expect(&p.body);
    let history = &p.body[start..start + p.body[start..].find("</ol>").unwrap()];
    let approved = history.find("attempt 1 · ").unwrap();
    let ok = history.find("approved by ann: “fine”").unwrap();
    let reopened = history
        .find("reopened by the rework of `draft` requested by bob")
        .unwrap();
    let again = history.find("attempt 2 · ").unwrap();
    let blocked = history.find("blocked: look again").unwrap();
    assert!(
        approved < ok && ok < reopened && reopened < again && again < blocked,
        "{history}"
    );
    // The gate's attempts are waits in the timeline, not work.
    assert!(p.body.contains("class=\"bar wait"), "{}", p.body);
}

/// One stored line of a node's output (`logs/<node>/<attempt>.jsonl`).
fn log_line(seq: u64, stream: &str, text: &str) -> String {
    json!({"seq": seq, "offset": 0, "stream": stream, "text": text}).to_string() + "\n"
}

#[tokio::test]
async fn a_nodes_whole_output_is_numbered_searchable_filtered_coloured_and_downloadable() {
    let s = Services::start().await;
    s.fake.set_node(
        RUN,
        pb::NodeInfo {
            id: "job".into(),
            r#type: "sandbox_run".into(),
            state: pb::NodeState::Running as i32,
            attempts: 2,
            ..Default::default()
        },
    );
    s.emit(
        RUN,
        "node.started",
        "job",
        json!({"node_type": "sandbox_run"}),
    )
    .await;
    s.emit(
        RUN,
        "node.failed",
        "job",
        json!({"error": "exit 1", "will_retry": true}),
    )
    .await;
    s.emit(
        RUN,
        "node.started",
        "job",
        json!({"node_type": "sandbox_run"}),
    )
    .await;
    let mut stored = String::new();
    for i in 1..=1500u64 {
        stored.push_str(&log_line(i, "stdout", &format!("line {i}\n")));
    }
    stored.push_str(&log_line(
        1501,
        "stderr",
        "\u{1b}[31mbad <b>thing</b>\u{1b}[0m\n",
    ));
    stored.push_str(
        "{\"seq\":1502,\"offset\":0,\"end\":{\"outcome\":\"failed\",\"error\":\"exit 1\"}}\n",
    );
    s.put(".cairn/runs/run-1/logs/job/1.jsonl", stored).await;
    let mut c = logged_in(&s).await;
    let url = format!("{}/nodes/job/log", run_url());

    // Attempt 1, stored: the last page by default, numbered, the colour as a class, the
    // markup as text.
    let p = c.get(&format!("{url}?attempt=1")).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    assert!(p.body.contains("id=\"L1501\""), "{}", p.body);
    assert!(
        p.body
            .contains("<span class=\"ansi-1\">bad &lt;b&gt;thing&lt;/b&gt;</span>"),
        "{}",
        p.body
    );
    assert!(!p.body.contains("\u{1b}"), "no raw escape reaches the page");
    assert!(p.body.contains("page 2 of 2"), "{}", p.body);
    assert!(
        !p.body.contains("id=\"L1\""),
        "the first page is behind a link"
    );
    let first = c.get(&format!("{url}?attempt=1&page=1")).await;
    assert!(first.body.contains("id=\"L1\"") && !first.body.contains("id=\"L1001\""));
    // Search and the stream filter.
    let found = c.get(&format!("{url}?attempt=1&q=LINE+1499")).await;
    assert!(found.body.contains("id=\"L1499\""), "{}", found.body);
    assert!(!found.body.contains("id=\"L1498\""), "{}", found.body);
    let errors = c.get(&format!("{url}?attempt=1&stream=stderr")).await;
    assert!(errors.body.contains("id=\"L1501\"") && !errors.body.contains("id=\"L1500\""));
    // The download is the output as text.
    let text = c.get(&format!("{url}?attempt=1&format=text")).await;
    assert!(text.headers["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment"));
    assert!(
        text.body.starts_with("line 1\nline 2\n"),
        "{}",
        &text.body[..40]
    );

    // Attempt 2 runs: not stored yet, read from the orchestrator; the default attempt.
    s.fake.add_log(
        RUN,
        pb::LogChunk {
            node_id: "job".into(),
            attempt: 2,
            seq: 1,
            stream: pb::LogStream::Stdout as i32,
            data: b"second try\n".to_vec().into(),
            ..Default::default()
        },
    );
    let live = c.get(&url).await;
    assert!(live.body.contains("second try"), "{}", live.body);
    assert!(
        live.body.contains("aria-current=\"page\">2<"),
        "{}",
        live.body
    );
}

#[tokio::test]
async fn event_fields_that_name_files_are_links_and_inline_cassettes_are_not_shown() {
    let s = Services::start().await;
    let cassette = "QUJD".repeat(2000);
    s.emit(
        RUN,
        "task.created",
        "",
        json!({"by": "cli", "llm": format!("replay-inline:{cassette}")}),
    )
    .await;
    s.emit(
        RUN,
        "artifact.written",
        "draft",
        json!({"path": "docs/run-1/a.md"}),
    )
    .await;
    let mut c = logged_in(&s).await;
    let p = c.get(&run_url()).await;
    assert!(
        !p.body.contains(&cassette[..400]),
        "the cassette is not in the page"
    );
    assert!(p.body.contains("an inline cassette"), "{}", p.body);
    assert!(
        p.body
            .contains("<a class=\"path\" href=\"/projects/proj/files?path=docs/run-1/a.md\">"),
        "{}",
        p.body
    );
    // Human notes: the front matter is the file's metadata, not shown.
    let notes = &p.body[p.body.find("id=\"notes-text\"").unwrap()..];
    let notes = &notes[..notes.find("</article>").unwrap()];
    assert!(!notes.contains("title:"), "{notes}");
    assert!(notes.contains("Keep the API stable."), "{notes}");
}

#[tokio::test]
async fn a_reject_says_what_it_does_and_the_page_has_a_skip_link() {
    let s = Services::start().await;
    let mut c = logged_in(&s).await;
    let page = c.get(&run_url()).await;
    assert!(
        page.body.contains("<a class=\"skip\" href=\"#main\">"),
        "{}",
        page.body
    );
    let csrf = page.csrf();
    c.post(
        &format!("{}/gates/review/reject", run_url()),
        &[("csrf", &csrf), ("note", "no")],
    )
    .await;
    let after = c.get(&run_url()).await;
    assert!(
        after
            .body
            .contains("Rejected gate review of run run-1: its node fails"),
        "{}",
        after.body
    );
}

#[tokio::test]
async fn the_runs_list_counts_its_runs_and_a_live_fetch_of_an_unchanged_list_is_304() {
    let s = Services::start().await;
    let mut c = logged_in(&s).await;
    let url = format!("/runs?project={PROJECT}");
    let first = c.get_with(&url, "x-cairn-live", "1").await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.body.contains("id=\"runs-total\""), "{}", first.body);
    let tag = first.headers["etag"].to_str().unwrap().to_owned();
    let again = c
        .raw(
            "GET",
            &url,
            &[
                ("host", CONSOLE_HOST),
                ("x-cairn-live", "1"),
                ("if-none-match", &tag),
            ],
            &[],
        )
        .await;
    assert_eq!(again.status, StatusCode::NOT_MODIFIED, "{}", again.body);
    assert!(again.bytes.is_empty());
    // A change is a new page.
    s.fake.set_title(RUN, "Renamed");
    let changed = c
        .raw(
            "GET",
            &url,
            &[
                ("host", CONSOLE_HOST),
                ("x-cairn-live", "1"),
                ("if-none-match", &tag),
            ],
            &[],
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK);
    assert!(changed.body.contains("Renamed"));
}

#[tokio::test]
async fn the_start_form_suggests_graphs_in_a_project_with_a_thousand_runs() {
    let s = Services::start().await;
    // 1,010 run directories (written where the store keeps the project: they sort first).
    let root = s.dir.path().join("data/projects").join(PROJECT);
    for i in 0..1010 {
        let dir = root.join(format!(".cairn/runs/r-{i:04}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("graph.yaml"), "nodes: []\n").unwrap();
    }
    let graph = "title: g\nnodes:\n  - {id: a, type: write_file, path: docs/a.md, content: x}\n";
    s.put("graphs/review.yaml", graph).await;
    s.put("examples/demo/plan.yml", graph).await;
    s.put("deploy/compose.yaml", "services:\n  web: {}\n").await;
    let mut c = logged_in(&s).await;
    let form = c.get(&format!("/start?project={PROJECT}")).await;
    assert!(
        form.body.contains("<option value=\"graphs/review.yaml\">"),
        "{}",
        form.body
    );
    assert!(
        form.body
            .contains("<option value=\"examples/demo/plan.yml\">"),
        "{}",
        form.body
    );
    assert!(!form.body.contains("deploy/compose.yaml"), "not a graph");
    assert!(
        !form.body.contains("value=\".cairn/"),
        "run records are not offered"
    );
}

#[tokio::test]
async fn a_run_started_from_the_console_gets_a_time_ordered_uuid_once() {
    let s = Services::start().await;
    s.put(
        "graphs/review.yaml",
        "title: g\nnodes:\n  - {id: a, type: write_file, path: docs/a.md, content: x}\n",
    )
    .await;
    let mut c = logged_in(&s).await;
    let form = c.get(&format!("/start?project={PROJECT}")).await;
    let at = form.body.find("name=\"request_id\" value=\"").unwrap() + 25;
    let id = form.body[at..at + 36].to_owned();
    let uuid = uuid_of(&id);
    let fields = [
        ("csrf", form.csrf()),
        ("project", PROJECT.to_owned()),
        ("source", "graph".to_owned()),
        ("graph_path", "graphs/review.yaml".to_owned()),
        ("request_id", id.clone()),
    ];
    let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let p = c.post("/start", &pairs).await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    assert_eq!(p.location(), format!("/projects/proj/runs/{id}"));
    assert_eq!(uuid, 7, "a time-ordered UUID, like `cairn run` gets");
    // The same form again: the same run, nothing new started.
    let again = c.post("/start", &pairs).await;
    assert_eq!(again.location(), format!("/projects/proj/runs/{id}"));
    assert_eq!(s.fake.submits().last().unwrap().run_id, id);
}

/// The version of a hyphenated UUID (panics when `id` is not one).
fn uuid_of(id: &str) -> u32 {
    let parts: Vec<&str> = id.split('-').collect();
    assert_eq!(
        parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
        vec![8, 4, 4, 4, 12],
        "{id}"
    );
    u32::from_str_radix(&parts[2][..1], 16).unwrap()
}

/// A map asked to unfold (`?expand=`) draws its items as nodes in the graph, at most 24 of
/// a large map (those that failed or run first) and one box for the rest that opens the
/// map's panel; folded, it is one node with a link that unfolds it.
#[tokio::test]
async fn a_map_unfolds_in_the_graph_with_a_bounded_number_of_items() {
    let s = Services::start().await;
    let mut info = blocked_run("run-map", "Fan out", "2026-02-01T00:00:00.000Z");
    info.gates.clear();
    info.nodes = vec![
        pb::NodeInfo {
            id: "fan".into(),
            r#type: "map".into(),
            state: pb::NodeState::Running as i32,
            ..Default::default()
        },
        pb::NodeInfo {
            id: "join".into(),
            r#type: "write_file".into(),
            ..Default::default()
        },
    ];
    s.fake.add_run(info);
    s.put(
        ".cairn/runs/run-map/graph.resolved.json",
        json!({"nodes": [{"id": "fan", "type": "map"}, {"id": "join", "type": "write_file", "needs": ["fan"]}]}).to_string(),
    )
    .await;
    let mut events = vec![("map.items", "fan".to_owned(), json!({"count": 500}))];
    for i in 0..500 {
        events.push(("node.started", format!("fan.{i}"), json!({})));
        if i != 400 {
            events.push(("node.completed", format!("fan.{i}"), json!({})));
        }
    }
    let events: Vec<(&str, &str, serde_json::Value)> = events
        .iter()
        .map(|(k, n, d)| (*k, n.as_str(), d.clone()))
        .collect();
    s.emit_all("run-map", &events).await;
    let mut c = logged_in(&s).await;
    let url = format!("/projects/{PROJECT}/runs/run-map");

    let folded = c.get(&url).await;
    assert_eq!(folded.status, StatusCode::OK, "{}", folded.body);
    assert!(
        !folded.body.contains("data-node=\"fan.0\""),
        "{}",
        folded.body
    );
    assert!(
        folded.body.contains(&format!(
            "href=\"{url}?expand=fan#graph\" data-map=\"fan\" aria-expanded=\"false\""
        )),
        "{}",
        folded.body
    );
    assert!(
        folded.body.contains("show the 500 items"),
        "{}",
        folded.body
    );

    let open = c.get(&format!("{url}?expand=fan")).await;
    assert_eq!(open.status, StatusCode::OK, "{}", open.body);
    let b = &open.body;
    let boxes = b.matches("<g class=\"node st-").count();
    let drawn_items = b.matches(" item\" data-node=\"fan.").count();
    assert_eq!(drawn_items, 24, "{b}");
    assert_eq!(boxes, 2 + 24, "the map, join and 24 items: {b}");
    // The running item far down the list is among them.
    assert!(
        b.contains("data-node=\"fan.400\" data-state=\"running\""),
        "{b}"
    );
    assert!(
        b.contains("data-node=\"fan.0\" data-state=\"succeeded\""),
        "{b}"
    );
    assert!(!b.contains("data-node=\"fan.30\""), "{b}");
    // The rest: one box, linked to the map's panel.
    assert!(b.contains("data-more=\"476\""), "{b}");
    assert!(b.contains("+476 more"), "{b}");
    assert!(
        b.contains(&format!("href=\"{url}/nodes/fan\" data-node=\"fan\"")),
        "{b}"
    );
    // Edges: the map to its items, its items to what needed the map.
    assert!(b.contains("data-from=\"fan\" data-to=\"fan.0\""), "{b}");
    assert!(b.contains("data-from=\"fan.0\" data-to=\"join\""), "{b}");
    assert!(!b.contains("data-from=\"fan\" data-to=\"join\""), "{b}");
    // The link folds it again.
    assert!(
        b.contains(&format!(
            "href=\"{url}#graph\" data-map=\"fan\" aria-expanded=\"true\""
        )),
        "{b}"
    );
}

/// A node that ran twice (a rework) has its two attempts compared on its panel: the output
/// that changed and the events, without their times; another pair can be asked for, and a
/// pair it does not have is refused.
#[tokio::test]
async fn a_nodes_panel_compares_two_of_its_attempts() {
    let s = Services::start().await;
    for (kind, data) in [
        (
            "node.started",
            json!({"node_type": "write_file", "attempt": 1}),
        ),
        (
            "node.completed",
            json!({"outputs": {"words": 10, "path": "docs/run-1/draft.txt"}, "duration_ms": 4}),
        ),
        (
            "node.started",
            json!({"node_type": "write_file", "attempt": 2}),
        ),
        (
            "node.completed",
            json!({"outputs": {"words": 12, "path": "docs/run-1/draft.txt"}, "duration_ms": 9}),
        ),
    ] {
        s.emit(RUN, kind, "draft", data).await;
    }
    let mut c = logged_in(&s).await;
    let page = format!("{}/nodes/draft", run_url());
    let p = c.get(&page).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    let b = &p.body;
    assert!(b.contains("Attempt 2 against attempt 1"), "{b}");
    assert!(b.contains("id=\"attempt-outputs-diff\""), "{b}");
    // The line of attempt 1 removed, that of attempt 2 added (whole lines of the outputs).
    assert!(
        b.contains("<td class=\"sign\">−</td><td class=\"text\">  &quot;words&quot;: 10</td>"),
        "{b}"
    );
    assert!(
        b.contains("<td class=\"sign\">+</td><td class=\"text\">  &quot;words&quot;: 12</td>"),
        "{b}"
    );
    // The events differ only in their outputs, not in their times or attempt numbers.
    let at = b.find("id=\"attempts-compared\"").unwrap();
    let section = &b[at..at + b[at..].find("</section>").unwrap()];
    assert!(section.contains("id=\"attempt-events-diff\""), "{section}");
    assert!(!section.contains("duration_ms"), "{section}");
    assert!(!section.contains("&quot;attempt&quot;"), "{section}");
    let p = c.get(&format!("{page}?attempts=2,1")).await;
    assert!(p.body.contains("Attempt 1 against attempt 2"), "{}", p.body);
    let p = c.get(&format!("{page}?attempts=1,5")).await;
    assert_eq!(p.status, StatusCode::BAD_REQUEST, "{}", p.body);
    assert!(p.body.contains("it has 1, 2"), "{}", p.body);
    // A node that ran once has nothing to compare.
    let p = c.get(&format!("{}/nodes/review", run_url())).await;
    assert!(!p.body.contains("attempts-compared"), "{}", p.body);
}
