//! The console as a control plane: starting a run (a graph file of the project or a built-in
//! mode), re-running and resuming, searching the runs, and the diff of an agent's answer across
//! rework turns; driven through `console_router`, backed by a real artifact-store and a fake
//! orchestrator that records what it was asked.
#![allow(clippy::unwrap_used)]

mod console_support;

use axum::http::StatusCode;
use cairn_proto::v1::TaskState;
use console_support::*;

/// POSTs the start form with these fields.
async fn post(c: &mut Client, fields: Vec<(&str, String)>) -> Page {
    let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    c.post("/start", &pairs).await
}

const GRAPH: &str =
    "title: Review\nnodes:\n  - {id: a, type: write_file, path: docs/a.md, content: x}\n";

#[tokio::test]
async fn a_run_starts_from_a_graph_file_of_the_project_or_a_built_in_mode() {
    let s = Services::start().await;
    s.put("graphs/review.yaml", GRAPH).await;
    s.put("graphs/broken.yaml", "nodes: invalid\n").await;
    let mut c = Client::new(s.router(Some(TOKEN)));
    c.login("dora", Some(TOKEN)).await;

    // The runs list leads to the form, which suggests the project's graph files.
    let list = c.get(&format!("/runs?project={PROJECT}")).await;
    assert!(
        list.body.contains("href=\"/start?project=proj\""),
        "{}",
        list.body
    );
    let form = c.get("/start?project=proj").await;
    assert_eq!(form.status, StatusCode::OK, "{}", form.body);
    assert!(
        form.body.contains("<option value=\"graphs/review.yaml\">"),
        "{}",
        form.body
    );
    assert!(
        !form.body.contains("value=\".cairn/"),
        "run records are not offered as graphs"
    );
    assert!(form.body.contains("name=\"request_id\""), "{}", form.body);
    let csrf = form.csrf();

    // A graph file: its text is sent with the variables, the title and the request id.
    let fields = |path: &str, rid: &str| {
        vec![
            ("csrf", csrf.clone()),
            ("project", PROJECT.to_owned()),
            ("source", "graph".to_owned()),
            ("graph_path", path.to_owned()),
            ("vars", "who=ann\r\nlang = rust\r\n".to_owned()),
            ("title", "From the console".to_owned()),
            ("request_id", rid.to_owned()),
        ]
    };
    let p = post(&mut c, fields("graphs/review.yaml", "r1")).await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    assert_eq!(p.location(), "/projects/proj/runs/req-r1");
    let sent = s.fake.submits().last().cloned().unwrap();
    assert_eq!(sent.graph_yaml, GRAPH);
    assert_eq!(sent.project_id, PROJECT);
    assert_eq!(sent.title, "From the console");
    assert_eq!(sent.request_id, "r1");
    assert_eq!(sent.by, "dora");
    assert_eq!(sent.vars.get("who").map(String::as_str), Some("ann"));
    assert_eq!(sent.vars.get("lang").map(String::as_str), Some(" rust"));
    assert!(sent.mode.is_empty() && sent.rerun_of.is_empty());
    let page = c.get("/projects/proj/runs/req-r1").await;
    assert!(page.body.contains("Run req-r1 started."), "{}", page.body);

    // The same form sent again (a double click) is the same run.
    let p = post(&mut c, fields("graphs/review.yaml", "r1")).await;
    assert_eq!(p.location(), "/projects/proj/runs/req-r1");
    assert_eq!(s.fake.run("req-r1").title, "From the console");

    // A missing file, a bad variable line, a refused graph: the form again, with what was
    // typed and why.
    let before = s.fake.submits().len();
    let p = post(&mut c, fields("graphs/nope.yaml", "r2")).await;
    assert_eq!(p.status, StatusCode::NOT_FOUND, "{}", p.body);
    assert!(p.body.contains("project proj has no file graphs/nope.yaml"));
    assert!(p.body.contains("value=\"graphs/nope.yaml\""), "{}", p.body);
    assert!(p.body.contains("value=\"From the console\""), "{}", p.body);
    assert!(p.body.contains("value=\"r2\""), "the request id is kept");
    let mut bad_vars = fields("graphs/review.yaml", "r3");
    bad_vars[4].1 = "ok=1\nno equals sign".into();
    let p = post(&mut c, bad_vars).await;
    assert_eq!(p.status, StatusCode::BAD_REQUEST, "{}", p.body);
    assert!(p.body.contains("variables, line 2"), "{}", p.body);
    assert_eq!(s.fake.submits().len(), before, "nothing was sent");
    let p = post(&mut c, fields("graphs/broken.yaml", "r4")).await;
    assert_eq!(p.status, StatusCode::BAD_REQUEST, "{}", p.body);
    assert!(
        p.body.contains("starting the run: node `a`: field `type`"),
        "{}",
        p.body
    );
    assert!(p.body.contains("value=\"graphs/broken.yaml\""));

    // A built-in mode with its prompt; without a prompt it is refused here.
    let mode = |prompt: &str| {
        vec![
            ("csrf", csrf.clone()),
            ("project", "fresh".to_owned()),
            ("source", "mode".to_owned()),
            ("mode", "self_critique".to_owned()),
            ("prompt", prompt.to_owned()),
            ("request_id", "m1".to_owned()),
        ]
    };
    let p = post(&mut c, mode("  ")).await;
    assert_eq!(p.status, StatusCode::BAD_REQUEST, "{}", p.body);
    assert!(p.body.contains("needs a prompt"), "{}", p.body);
    let p = post(&mut c, mode("Write a haiku\r\nabout rust")).await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    assert_eq!(p.location(), "/projects/fresh/runs/req-m1");
    let sent = s.fake.submits().last().cloned().unwrap();
    assert_eq!(
        (
            sent.mode.as_str(),
            sent.prompt.as_str(),
            sent.graph_yaml.as_str()
        ),
        ("self_critique", "Write a haiku\nabout rust", "")
    );
    let mut other = mode("x");
    other[3].1 = "free_for_all".into();
    let p = post(&mut c, other).await;
    assert_eq!(p.status, StatusCode::BAD_REQUEST, "{}", p.body);

    // Without the session's CSRF token nothing starts.
    let n = s.fake.submits().len();
    let p = c
        .post(
            "/start",
            &[
                ("project", PROJECT),
                ("source", "graph"),
                ("graph_path", "graphs/review.yaml"),
            ],
        )
        .await;
    assert_eq!(p.status, StatusCode::FORBIDDEN, "{}", p.body);
    assert_eq!(s.fake.submits().len(), n);
}

#[tokio::test]
async fn a_run_is_re_run_and_a_failed_run_resumed_from_its_page() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(Some(TOKEN)));
    c.login("eve", Some(TOKEN)).await;
    let page = c.get(&run_url()).await;
    // Blocked at a gate: re-run and cancel are offered, resume is not (nothing failed).
    assert!(page.body.contains("id=\"rerun-form\""), "{}", page.body);
    assert!(page.body.contains("id=\"cancel-form\""), "{}", page.body);
    assert!(!page.body.contains("id=\"resume-form\""), "{}", page.body);
    let csrf = page.csrf();

    let p = c
        .post(
            &format!("{}/rerun", run_url()),
            &[("csrf", &csrf), ("request_id", "again")],
        )
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    assert_eq!(p.location(), "/projects/proj/runs/req-again");
    let sent = s.fake.submits().last().cloned().unwrap();
    assert_eq!(sent.rerun_of, RUN);
    assert_eq!(sent.by, "eve");
    assert!(sent.graph_yaml.is_empty() && sent.mode.is_empty());
    let new = c.get("/projects/proj/runs/req-again").await;
    assert!(
        new.body.contains("started as a re-run of run-1"),
        "{}",
        new.body
    );
    assert!(
        new.body
            .contains("re-run of <a id=\"rerun-of\" href=\"/projects/proj/runs/run-1\">"),
        "{}",
        new.body
    );

    // Resume is refused while the run has not failed (the orchestrator's word is shown).
    let p = c
        .post(&format!("{}/resume", run_url()), &[("csrf", &csrf)])
        .await;
    assert_eq!(p.status, StatusCode::CONFLICT, "{}", p.body);
    assert!(p.body.contains("the run has not failed"), "{}", p.body);
    s.fake.add_run(cairn_proto::v1::RunInfo {
        state: TaskState::Failed as i32,
        error: "node draft failed".into(),
        ..blocked_run(RUN, "Draft and publish", "2026-01-01T00:00:00.000Z")
    });
    let page = c.get(&run_url()).await;
    assert!(page.body.contains("id=\"resume-form\""), "{}", page.body);
    assert!(
        !page.body.contains("id=\"cancel-form\""),
        "a failed run is over"
    );
    let p = c
        .post(&format!("{}/resume", run_url()), &[("csrf", &csrf)])
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    let resumed = s
        .fake
        .calls()
        .into_iter()
        .filter(|c| c.method == "ResumeRun")
        .collect::<Vec<_>>();
    assert_eq!(resumed.len(), 2);
    assert_eq!(resumed[1].by, "eve");
    assert_eq!(s.fake.run(RUN).state, TaskState::Working as i32);
    assert!(c
        .get(&run_url())
        .await
        .body
        .contains("Run run-1 resumed; it is working."));
}

#[tokio::test]
async fn a_stalled_run_says_so_on_its_page() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(Some(TOKEN)));
    c.login("eve", Some(TOKEN)).await;
    let page = c.get(&run_url()).await;
    assert!(!page.body.contains("id=\"run-stalled\""), "{}", page.body);
    s.fake.add_run(cairn_proto::v1::RunInfo {
        state: TaskState::Working as i32,
        stalled_since: "2026-01-01T00:05:00.000Z".into(),
        ..blocked_run(RUN, "Draft and publish", "2026-01-01T00:00:00.000Z")
    });
    let page = c.get(&run_url()).await;
    assert!(page.body.contains("id=\"run-stalled\""), "{}", page.body);
    assert!(page.body.contains("Stalled since"), "{}", page.body);
}

#[tokio::test]
async fn the_runs_list_searches_by_text_state_and_days_and_pages_keep_the_search() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(Some(TOKEN)));
    c.login("fay", Some(TOKEN)).await;
    let p = c
        .get("/runs?project=proj&q=+Draft+&state=input-required&from=2026-01-01&to=2026-01-02")
        .await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    let asked = s.fake.lists().last().cloned().unwrap();
    assert_eq!(asked.text, "Draft");
    assert_eq!(asked.states, vec![TaskState::InputRequired as i32]);
    assert_eq!(asked.created_after, "2026-01-01T00:00:00Z");
    assert_eq!(
        asked.created_before, "2026-01-03T00:00:00Z",
        "the last day is included"
    );
    // The form shows the search; the state links keep it.
    assert!(p.body.contains("name=\"q\" value=\"Draft\""), "{}", p.body);
    assert!(p.body.contains("value=\"2026-01-02\""), "{}", p.body);
    assert!(
        p.body
            .contains("href=\"/runs?project=proj&amp;state=failed&amp;q=Draft&amp;from=2026-01-01&amp;to=2026-01-02\""),
        "{}",
        p.body
    );
    assert!(p.body.contains("Draft and publish"), "{}", p.body);

    for bad in [
        "/runs?project=proj&from=yesterday",
        "/runs?project=proj&to=2026-13-01",
    ] {
        let p = c.get(bad).await;
        assert_eq!(p.status, StatusCode::BAD_REQUEST, "{bad}: {}", p.body);
        assert!(
            p.body.contains("is not a day like 2026-11-25"),
            "{}",
            p.body
        );
    }
    let long = format!("/runs?project=proj&q={}", "x".repeat(201));
    assert_eq!(c.get(&long).await.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_agents_answer_is_compared_with_its_previous_turn() {
    let s = Services::start().await;
    let dir = format!(".cairn/runs/{RUN}/agents/writer-1/artifacts");
    s.put(
        &format!("{dir}/turn-1.md"),
        "# Plan\n\nstep one\nstep two\nstep three\n",
    )
    .await;
    s.put(
        &format!("{dir}/turn-2.md"),
        "# Plan\n\nstep one\nstep 2 <script>alert(1)</script>\nstep three\nstep four\n",
    )
    .await;
    let mut c = Client::new(s.router(Some(TOKEN)));
    c.login("gus", Some(TOKEN)).await;

    // The roster links the diff of each later turn.
    let page = c.get(&run_url()).await;
    let diff = format!("{}/agents/writer-1/diff?turn=2", run_url());
    assert!(
        page.body.contains(&format!("href=\"{diff}\"")),
        "{}",
        page.body
    );
    let p = c.get(&diff).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    assert!(
        p.body
            .contains("+2</span> <span class=\"removed\">−1</span>"),
        "{}",
        p.body
    );
    assert!(
        p.body.contains("<tr class=\"del\"><td class=\"num\">4</td><td class=\"num\"></td><td class=\"sign\">−</td><td class=\"text\">step two</td></tr>"),
        "{}",
        p.body
    );
    assert!(
        p.body
            .contains("step 2 &lt;script&gt;alert(1)&lt;/script&gt;"),
        "agent text is escaped: {}",
        p.body
    );
    assert!(!p.body.contains("<script>alert"), "{}", p.body);
    assert!(p.body.contains("<td class=\"text\">step four</td>"));
    // The latest turn by default; the first turn has nothing before it.
    let latest = c.get(&format!("{}/agents/writer-1/diff", run_url())).await;
    assert!(
        latest.body.contains("Turn 2 against turn 1"),
        "{}",
        latest.body
    );
    let first = c
        .get(&format!("{}/agents/writer-1/diff?turn=1", run_url()))
        .await;
    assert!(first.body.contains("id=\"no-earlier\""), "{}", first.body);
    // Turns and agents that do not exist, and a path in the agent's name, are not found.
    for (uri, want) in [
        (
            "/agents/writer-1/diff?turn=7",
            "has no turn 7 (turns: 1, 2)",
        ),
        ("/agents/nobody/diff", "no answers of an agent `nobody`"),
        ("/agents/..%2F..%2Ftask.yaml/diff", "no answers of an agent"),
    ] {
        let p = c.get(&format!("{}{uri}", run_url())).await;
        assert_eq!(p.status, StatusCode::NOT_FOUND, "{uri}: {}", p.body);
        assert!(p.body.contains(want), "{uri}: {}", p.body);
    }
}
