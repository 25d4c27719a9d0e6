//! The console end to end in headless Chromium (Debian `chromium` + `chromium-driver`), driven
//! over WebDriver with fantoccini: log in, open a run blocked at a gate, approve it with a note,
//! see the run complete and the note in the live events. Once against the real orchestrator
//! (a graph with a gate), once against the fake one. The run page is saved as a PNG screenshot
//! under `$CARGO_TARGET_DIR/console-screenshots/`.
//!
//! Without chromedriver the tests print `SKIP: ...` and pass, unless `CAIRN_REQUIRE_BROWSER=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod browser_support;
mod console_support;

use browser_support::*;
use cairn_proto::v1::TaskState;
use console_support::*;
use fantoccini::{Client, Locator};

/// Logs in through the form the run page redirects to, approves gate `review` with `note`,
/// and waits for the run to complete with the note in the live events; saves a screenshot.
async fn approve_in_browser(c: &Client, base: &str, run_id: &str, note: &str, shot: &str) {
    login(c, base, &format!("projects/{PROJECT}/runs/{run_id}")).await;
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
    approve_on_page(c, "review", note).await;

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
    // The stream stays open after the run's end (it may be reworked or resumed).
    assert!(status.starts_with("Live"), "{status}");
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
    let r = RealStack::start().await;
    let run_id = r.submit(GATED, &[]).await;
    r.wait_state(&run_id, TaskState::InputRequired).await;
    let note = "Checked the draft <b>by hand</b>; publish it.";
    approve_in_browser(&client, &r.base, &run_id, note, "run-page.png").await;

    // The orchestrator continued the run with the decision: who approved, and the note.
    let info = r.get(&run_id).await;
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
    r.handle.shutdown().await;
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

/// A graph with two gates in a row; the first gate's reason is long (its event gets folded).
fn two_gates() -> String {
    format!(
        r##"
title: Two looks
nodes:
  - {{id: draft, type: write_file, path: "docs/{{{{run_id}}}}/draft.md", content: "# Draft\n"}}
  - {{id: first, type: gate, reason: "{long}", needs: [draft]}}
  - {{id: second, type: gate, reason: "second look", needs: [first]}}
  - {{id: publish, type: write_file, path: "docs/{{{{run_id}}}}/published.txt", content: "ok", needs: [second]}}
"##,
        long = "look at the draft ".repeat(20)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_follows_a_real_run_live_through_gates_rework_and_its_end() {
    let Some((_driver, client)) = browser().await else {
        return;
    };
    let c = &client;
    let r = RealStack::start().await;
    let (base, mut orch) = (r.base.clone(), r.orch.clone());
    // Another run's file: the run page lists only what this run wrote, unless asked.
    r.put("docs/elsewhere/other.md", "# other\n").await;

    // The runs list updates by itself when a run is submitted.
    login(c, &base, &format!("runs?project={PROJECT}")).await;
    mark_page(c).await;
    let run_id = r.submit(&two_gates(), &[]).await;
    wait_for("the new run in the runs list", || async {
        text_of(c, "#runs-live").await.contains(&run_id)
    })
    .await;
    assert!(page_kept(c).await, "the list changed without a reload");

    // The run page, while the run waits at its first gate: the second is not reached.
    r.wait_state(&run_id, TaskState::InputRequired).await;
    c.goto(&format!("{base}projects/{PROJECT}/runs/{run_id}"))
        .await
        .unwrap();
    mark_page(c).await;
    assert!(text_of(c, "#gate-second").await.contains("not reached"));
    assert!(c
        .find(Locator::Css("#gate-second button.approve"))
        .await
        .is_err());

    // Approved elsewhere (gRPC): the page shows the second gate blocked with its buttons,
    // the milestones and the graph move on, all without a reload.
    orch.approve_gate(cairn_proto::v1::GateDecisionRequest {
        project_id: PROJECT.into(),
        run_id: run_id.clone(),
        gate_id: "first".into(),
        by: "bob".into(),
        note: "first ok".into(),
    })
    .await
    .unwrap();
    wait_for("the second gate's Approve button", || async {
        c.find(Locator::Css("#gate-second button.approve"))
            .await
            .is_ok()
    })
    .await;
    assert!(page_kept(c).await, "the gate appeared without a reload");
    assert!(text_of(c, "#gate-first").await.contains("approved by bob"));
    assert!(text_of(c, "#node-first").await.contains("succeeded"));
    assert_eq!(
        attr(c, "#dag g[data-node=first]", "data-state").await,
        "succeeded"
    );
    assert_eq!(
        attr(c, "#dag g[data-node=second]", "data-state").await,
        "blocked"
    );

    // Approved from the page.
    approve_on_page(c, "second", "second ok").await;
    wait_for("the run to complete", || async {
        run_state(c).await == "completed"
    })
    .await;
    assert_eq!(r.get(&run_id).await.gates[1].decided_by, "ann");

    // Reworked after its end: the same page (no reload) follows the run on.
    mark_page(c).await;
    orch.request_rework(cairn_proto::v1::ReworkRequest {
        project_id: PROJECT.into(),
        run_id: run_id.clone(),
        node_id: "draft".into(),
        by: "carol".into(),
        note: "once more".into(),
        from_snapshot: false,
    })
    .await
    .unwrap();
    wait_for("the reworked run at its first gate again", || async {
        run_state(c).await == "input-required"
            && c.find(Locator::Css("#gate-first button.approve"))
                .await
                .is_ok()
    })
    .await;
    for gate in ["first", "second"] {
        wait_for("the gate to block", || async {
            r.get(&run_id)
                .await
                .gates
                .iter()
                .any(|g| g.id == gate && g.state == cairn_proto::v1::GateState::Blocked as i32)
        })
        .await;
        orch.approve_gate(cairn_proto::v1::GateDecisionRequest {
            project_id: PROJECT.into(),
            run_id: run_id.clone(),
            gate_id: gate.into(),
            by: "bob".into(),
            note: String::new(),
        })
        .await
        .unwrap();
    }
    wait_for("the reworked run to complete", || async {
        run_state(c).await == "completed"
    })
    .await;
    assert!(page_kept(c).await, "followed without a reload");

    // History: the page shows every event the store holds, in order, and is still live.
    let stored = read_store_events(&r.store_addr, &run_id).await;
    assert!(stored
        .iter()
        .any(|e| e.r#type == "artifact.rework-requested"));
    wait_for("every stored event on the page", || async {
        event_seqs(c).await.len() == stored.len()
    })
    .await;
    let seqs: Vec<u64> = stored.iter().map(|e| e.seq).collect();
    assert_eq!(event_seqs(c).await, seqs);
    assert!(text_of(c, "#events-status").await.starts_with("Live"));

    // The graph names every node with its state.
    let info = r.get(&run_id).await;
    for n in &info.nodes {
        let state = match cairn_proto::v1::NodeState::try_from(n.state).unwrap() {
            cairn_proto::v1::NodeState::Succeeded => "succeeded",
            other => panic!("node {} is {other:?}", n.id),
        };
        let css = format!("#dag g[data-node={}]", n.id);
        assert_eq!(attr(c, &css, "data-state").await, state, "{}", n.id);
        let label = c
            .find(Locator::Css(&format!("{css} text.id")))
            .await
            .unwrap();
        assert!(label.is_displayed().await.unwrap(), "{} is drawn", n.id);
        assert_eq!(label.text().await.unwrap(), n.id);
        assert!(
            text_of(c, &format!("#node-{}", n.id)).await.contains(&n.id),
            "the milestone row the node links to"
        );
    }
    assert_eq!(
        c.find_all(Locator::Css("#dag g.node")).await.unwrap().len(),
        info.nodes.len()
    );

    // The timeline matches the events: first start, last end, attempts, retries.
    for n in &info.nodes {
        let mine: Vec<&cairn_proto::v1::Event> =
            stored.iter().filter(|e| e.node_id == n.id).collect();
        let starts: Vec<&str> = mine
            .iter()
            .filter(|e| e.r#type == "node.started")
            .map(|e| e.ts.as_str())
            .collect();
        let end = mine
            .iter()
            .rev()
            .find(|e| e.r#type == "node.completed")
            .map(|e| e.ts.as_str())
            .unwrap();
        let row = format!("#tl-{}", n.id);
        assert_eq!(attr(c, &row, "data-start").await, starts[0], "{}", n.id);
        assert_eq!(attr(c, &row, "data-end").await, end, "{}", n.id);
        assert_eq!(
            attr(c, &row, "data-attempts").await,
            starts.len().to_string(),
            "{}",
            n.id
        );
        assert_eq!(attr(c, &row, "data-retries").await, "0");
    }
    let bars = c.find_all(Locator::Css("#gantt rect.bar")).await.unwrap();
    assert_eq!(bars.len(), 2 * info.nodes.len(), "a bar per attempt");
    for b in bars {
        assert!(b.is_displayed().await.unwrap());
    }
    // Everything was redone once: two attempts each, publish last on the critical path.
    assert_eq!(attr(c, "#tl-draft", "data-attempts").await, "2");
    assert!(text_of(c, "#critical-path")
        .await
        .contains("draft → first → second → publish"));

    // Quiet events: the long gate reason is folded, and opens on a click.
    let blocked = stored
        .iter()
        .find(|e| e.r#type == "gate.blocked" && e.node_id == "first")
        .unwrap();
    let fold = c
        .find(Locator::Css(&format!("#ev-{} details.fold", blocked.seq)))
        .await
        .unwrap();
    let pre = fold.find(Locator::Css("pre")).await.unwrap();
    assert!(!pre.is_displayed().await.unwrap(), "folded");
    let summary = fold.find(Locator::Css("summary")).await.unwrap();
    assert!(summary.text().await.unwrap().chars().count() < 230);
    summary.click().await.unwrap();
    assert!(pre.is_displayed().await.unwrap(), "unfolded");
    assert!(pre
        .text()
        .await
        .unwrap()
        .contains(&"look at the draft ".repeat(20).trim_end().to_owned()));

    // Run-scoped files; the project's behind the toggle.
    let files = text_of(c, "#run-files").await;
    assert!(
        files.contains(&format!("docs/{run_id}/draft.md")),
        "{files}"
    );
    assert!(
        files.contains(&format!("docs/{run_id}/published.txt")),
        "{files}"
    );
    assert!(!c
        .source()
        .await
        .unwrap()
        .contains("docs/elsewhere/other.md"));

    // Screenshots of the new views.
    c.execute("window.scrollTo(0, 0); return true;", vec![])
        .await
        .unwrap();
    shoot(c, None, "run-page-live.png").await;
    shoot(c, Some("#graph-section"), "run-graph.png").await;
    shoot(c, Some("#timeline-section"), "run-timeline.png").await;
    shoot(c, Some("#events-section"), "run-events.png").await;

    c.find(Locator::Css("#files-toggle"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for("the whole project's files", || async {
        c.source()
            .await
            .map(|s| s.contains("docs/elsewhere/other.md"))
            .unwrap_or(false)
    })
    .await;
    client.close().await.unwrap();
    r.handle.shutdown().await;
}

/// A graph for the start form: an agent writes a plan, a person reviews it.
const PLAN_GRAPH: &str = r##"
title: Plan from a file
goal: "Plan the work in steps"
nodes:
  - {id: author, type: agent_task, prompt: "plan {{vars.topic}}", path: "docs/{{run_id}}/plan.md"}
  - {id: review, type: gate, reason: "check the plan", needs: [author]}
"##;

/// The agent's answers: a first turn, and a second one after a rework.
const PLAN_CASSETTE: &str = "answers:\n  - {node: author, content: \"# Plan\\n\\nstep one\\nstep two\\n\"}\n  - {node: author, turn: 2, content: \"# Plan\\n\\nstep one\\nstep 2, shorter\\nstep three\\n\"}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_started_searched_reworked_compared_canceled_re_run_and_resumed_from_the_page() {
    let Some((_driver, client)) = browser().await else {
        return;
    };
    let c = &client;
    let r = RealStack::start().await;
    let (base, mut orch) = (r.base.clone(), r.orch.clone());
    r.put("graphs/plan.yaml", PLAN_GRAPH).await;
    r.put("cassettes/plan.yaml", PLAN_CASSETTE).await;
    let unrelated = r
        .submit(
            "title: Unrelated work\nnodes:\n  - {id: g, type: gate}\n",
            &[],
        )
        .await;

    // Start: from the runs list to the form, a graph file of the project with a variable.
    login(c, &base, &format!("runs?project={PROJECT}")).await;
    click(c, "#start-run").await;
    c.wait()
        .for_element(Locator::Css("#start-form"))
        .await
        .unwrap();
    type_into(c, "input[name=graph_path]", "graphs/plan.yaml").await;
    type_into(c, "textarea[name=vars]", "topic=parser").await;
    type_into(c, "input[name=title]", "Console plan").await;
    type_into(c, "input[name=llm]", "replay:cassettes/plan.yaml").await;
    shoot(c, Some("#start-form"), "start-form.png").await;
    click(c, "#start-form button[type=submit]").await;
    wait_for("the new run's page", || async {
        c.current_url()
            .await
            .map(|u| u.path().starts_with(&format!("/projects/{PROJECT}/runs/")))
            .unwrap_or(false)
    })
    .await;
    let run = run_on_page(c).await;
    // The run id is a time-ordered UUID, like a run `cairn run` starts.
    assert_eq!(run.len(), 36, "{run}");
    assert_eq!(&run[14..15], "7", "{run}");
    wait_for("the new run at its gate", || async {
        run_state(c).await == "input-required"
    })
    .await;
    let info = r.get(&run).await;
    assert_eq!(info.title, "Console plan");
    assert_eq!(info.goal, "Plan the work in steps");
    let created = read_store_events(&r.store_addr, &run).await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&created[0].data_json).unwrap()["by"],
        "ann"
    );

    // Rework the agent from the page; its second answer is compared with the first.
    mark_page(c).await;
    let rework = c.find(Locator::Css("form.rework")).await.unwrap();
    rework
        .find(Locator::Css("select[name=node_id] option[value=author]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    rework
        .find(Locator::Css("textarea[name=note]"))
        .await
        .unwrap()
        .send_keys("shorter, and add a third step")
        .await
        .unwrap();
    rework
        .find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for("the link to the second turn's diff", || async {
        c.find(Locator::Css("a.turn-diff")).await.is_ok()
    })
    .await;
    click(c, "a.turn-diff").await;
    c.wait()
        .for_element(Locator::Css("#turn-diff"))
        .await
        .unwrap();
    let summary = text_of(c, "#diff-summary").await;
    assert!(summary.contains("Turn 2 against turn 1"), "{summary}");
    assert!(
        summary.contains("+2") && summary.contains("−1"),
        "{summary}"
    );
    let added: Vec<String> = {
        let mut v = Vec::new();
        for r in c
            .find_all(Locator::Css("#turn-diff tr.add td.text"))
            .await
            .unwrap()
        {
            v.push(r.text().await.unwrap());
        }
        v
    };
    assert_eq!(added, vec!["step 2, shorter", "step three"]);
    assert_eq!(text_of(c, "#turn-diff tr.del td.text").await, "step two");
    shoot(c, Some("main"), "turn-diff.png").await;

    // Cancel asks first; "No" keeps the run, "Yes" cancels it.
    c.goto(&format!("{base}projects/{PROJECT}/runs/{run}"))
        .await
        .unwrap();
    wait_for("the reworked run at its gate", || async {
        run_state(c).await == "input-required"
    })
    .await;
    type_into(c, "#cancel-form input[name=reason]", "plan is enough").await;
    click(c, "#cancel-form button").await;
    c.wait()
        .for_element(Locator::Css("#cancel-confirm"))
        .await
        .unwrap();
    assert!(text_of(c, "#cancel-what").await.contains("input-required"));
    assert_eq!(
        r.get(&run).await.state,
        TaskState::InputRequired as i32,
        "nothing is canceled before the confirmation"
    );
    shoot(c, Some("main"), "cancel-confirm.png").await;
    click(c, "#cancel-confirm button.danger").await;
    wait_for("the canceled run", || async {
        run_state(c).await == "canceled"
    })
    .await;
    let events = read_store_events(&r.store_addr, &run).await;
    let canceled = events.iter().find(|e| e.r#type == "task.canceled").unwrap();
    let d: serde_json::Value = serde_json::from_str(&canceled.data_json).unwrap();
    assert_eq!(
        (d["by"].as_str(), d["reason"].as_str()),
        (Some("ann"), Some("plan is enough"))
    );

    // Re-run: a new run of the same graph, variables, title and LLM.
    click(c, "#rerun-form button").await;
    wait_for("the re-run's page", || async {
        run_on_page(c).await != run && c.find(Locator::Css("#rerun-of")).await.is_ok()
    })
    .await;
    let second = run_on_page(c).await;
    // (The live refresh may replace the header between a find and a read: wait, not assert.)
    wait_for("the link to the re-run's source", || async {
        text_of(c, "#rerun-of").await == run
    })
    .await;
    wait_for("the re-run at its gate", || async {
        run_state(c).await == "input-required"
    })
    .await;
    let info = r.get(&second).await;
    assert_eq!(
        (info.title.as_str(), info.rerun_of.as_str()),
        ("Console plan", run.as_str())
    );

    // The re-run's page compares it with its source (DiffRuns): A the source, B the re-run.
    click(c, "#compare-rerun").await;
    c.wait()
        .for_element(Locator::Css("#compare-verdict"))
        .await
        .unwrap();
    assert_eq!(
        c.current_url().await.unwrap().query().unwrap_or_default(),
        format!("a={run}&b={second}")
    );
    assert!(text_of(c, "#side-a").await.contains(&run));
    assert!(text_of(c, "#side-b").await.contains(&second));
    assert!(text_of(c, "#nodes-table").await.contains("author"));
    // The source was canceled at its gate, the re-run waits there.
    assert_eq!(attr(c, "#verdict", "data-verdict").await, "running");
    c.goto(&format!("{base}projects/{PROJECT}/runs/{second}"))
        .await
        .unwrap();

    // Resume: rejected elsewhere, the run fails; the page offers Resume, which the run takes.
    orch.reject_gate(cairn_proto::v1::GateDecisionRequest {
        project_id: PROJECT.into(),
        run_id: second.clone(),
        gate_id: "review".into(),
        by: "bob".into(),
        note: "not yet".into(),
    })
    .await
    .unwrap();
    wait_for("the Resume button on the failed run", || async {
        run_state(c).await == "failed" && c.find(Locator::Css("#resume-form button")).await.is_ok()
    })
    .await;
    click(c, "#resume-form button").await;
    wait_for("the resume's confirmation", || async {
        text_of(c, ".flash.ok")
            .await
            .contains(&format!("Run {second} resumed"))
    })
    .await;
    let events = read_store_events(&r.store_addr, &second).await;
    let resumed = events.iter().find(|e| e.r#type == "task.resumed").unwrap();
    let d: serde_json::Value = serde_json::from_str(&resumed.data_json).unwrap();
    assert_eq!(d["by"], "ann");

    // Search: text in the title, then with a state.
    c.goto(&format!("{base}runs?project={PROJECT}"))
        .await
        .unwrap();
    type_into(c, "#run-search input[name=q]", "console PLAN").await;
    click(c, "#run-search button[type=submit]").await;
    wait_for("the search results", || async {
        c.current_url()
            .await
            .map(|u| u.query().unwrap_or_default().contains("q=console"))
            .unwrap_or(false)
    })
    .await;
    let listed = text_of(c, "#runs-live").await;
    assert!(
        listed.contains(&run) && listed.contains(&second),
        "{listed}"
    );
    assert!(!listed.contains(&unrelated), "{listed}");
    shoot(c, Some("main"), "runs-search.png").await;
    c.find(Locator::Css(
        "#run-search select[name=state] option[value=canceled]",
    ))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    click(c, "#run-search button[type=submit]").await;
    wait_for("the canceled one only", || async {
        let t = text_of(c, "#runs-live").await;
        t.contains(&run) && !t.contains(&second)
    })
    .await;
    client.close().await.unwrap();
    r.handle.shutdown().await;
}
