//! The runs list and a run page through `console_router` (a real artifact-store, a fake
//! orchestrator): states and projects of the list; the run page's state, milestones, roster,
//! gates, notes, context, artifacts and ingest; escaping; the event stream; gate labels and
//! folded event fields; run-scoped files; the graph as an SVG.
#![allow(clippy::unwrap_used)]

mod console_support;

use std::time::Duration;

use axum::http::{header, StatusCode};
use console_support::*;

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
