//! ListRuns search (text in title, goal or run id; creation time bounds; with states and
//! pages) and re-runs (SubmitRunRequest.rerun_of) over real gRPC on loopback.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::{ListRunsRequest, PageRequest, SubmitRunRequest, TaskState};
use common::*;
use tonic::Code;

async fn search(s: &Stack, req: ListRunsRequest) -> Result<Vec<String>, tonic::Status> {
    let mut req = req;
    req.project_id = PROJECT.into();
    let mut ids = Vec::new();
    loop {
        let page = s.client.clone().list_runs(req.clone()).await?.into_inner();
        ids.extend(page.runs.into_iter().map(|r| r.run_id));
        if page.next_page_token.is_empty() {
            return Ok(ids);
        }
        req.page = Some(PageRequest {
            page_size: 1,
            page_token: page.next_page_token,
        });
    }
}

fn text(t: &str) -> ListRunsRequest {
    ListRunsRequest {
        text: t.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_found_by_text_state_and_creation_time() {
    let s = Stack::start(Options::default()).await;
    let graph = |title: &str, goal: &str| {
        format!("title: {title}\ngoal: {goal}\nnodes:\n  - {{id: a, type: write_file, path: 'docs/{{{{run_id}}}}.txt', content: x}}\n")
    };
    let release = s
        .submit(&graph("Release notes", "Summarise the changes"), &[])
        .await
        .unwrap()
        .run_id;
    let parser = s
        .submit(&graph("Parser fix", "Handle EMPTY release files"), &[])
        .await
        .unwrap()
        .run_id;
    let other = s
        .submit(&graph("Docs", "Write a guide"), &[])
        .await
        .unwrap()
        .run_id;
    for r in [&release, &parser, &other] {
        s.wait_final(r, 30).await;
    }
    let waiting = s
        .submit(
            "title: Release gate\nnodes:\n  - {id: g, type: gate}\n",
            &[],
        )
        .await
        .unwrap()
        .run_id;
    s.wait_state(&waiting, TaskState::InputRequired, 20).await;

    // Title or goal, case-insensitive; newest first.
    assert_eq!(
        search(&s, text("RELEASE")).await.unwrap(),
        vec![waiting.clone(), parser.clone(), release.clone()]
    );
    assert_eq!(
        search(&s, text("empty release")).await.unwrap(),
        vec![parser.clone()]
    );
    // A part of the run id.
    let tail = &other[other.len() - 12..];
    assert_eq!(search(&s, text(tail)).await.unwrap(), vec![other.clone()]);
    assert!(search(&s, text("nothing like this"))
        .await
        .unwrap()
        .is_empty());
    // With a state.
    let req = ListRunsRequest {
        states: vec![TaskState::Completed as i32],
        ..text("release")
    };
    assert_eq!(
        search(&s, req).await.unwrap(),
        vec![parser.clone(), release.clone()]
    );
    // Pages of one keep to the search.
    let req = ListRunsRequest {
        page: Some(PageRequest {
            page_size: 1,
            page_token: String::new(),
        }),
        ..text("release")
    };
    assert_eq!(
        search(&s, req).await.unwrap(),
        vec![waiting.clone(), parser.clone(), release.clone()]
    );

    // Creation time: a run's own time as listed, as bounds (after is inclusive, before
    // exclusive).
    let listed = s
        .client
        .clone()
        .list_runs(ListRunsRequest {
            project_id: PROJECT.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .runs;
    let info = listed.iter().find(|r| r.run_id == parser).unwrap();
    let after = ListRunsRequest {
        created_after: info.created_at.clone(),
        ..Default::default()
    };
    let got = search(&s, after).await.unwrap();
    assert_eq!(got, vec![waiting.clone(), other.clone(), parser.clone()]);
    let before = ListRunsRequest {
        created_before: info.created_at.clone(),
        ..Default::default()
    };
    assert_eq!(search(&s, before).await.unwrap(), vec![release.clone()]);
    let far = ListRunsRequest {
        created_after: "2999-01-01T00:00:00Z".into(),
        ..Default::default()
    };
    assert!(search(&s, far).await.unwrap().is_empty());

    // Bad input is refused with what to fix.
    let bad = ListRunsRequest {
        created_after: "yesterday".into(),
        ..Default::default()
    };
    let e = search(&s, bad).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("created_after") && e.message().contains("RFC 3339"));
    let e = search(&s, text(&"x".repeat(201))).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_starts_a_new_run_from_the_recorded_graph_and_variables() {
    let s = Stack::start(Options::default()).await;
    let graph = "title: Greeting\ngoal: Say hello\nvars: {who: world}\nnodes:\n  - {id: a, type: write_file, path: 'docs/{{run_id}}.txt', content: 'hello {{vars.who}}'}\n";
    let first = s.submit(graph, &[("who", "ann")]).await.unwrap().run_id;
    s.wait_final(&first, 30).await;
    assert_eq!(s.read_text(&format!("docs/{first}.txt")).await, "hello ann");

    let rerun = |vars: &[(&str, &str)], request_id: &str| SubmitRunRequest {
        project_id: PROJECT.into(),
        rerun_of: first.clone(),
        by: "bob".into(),
        vars: vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        request_id: request_id.into(),
        ..Default::default()
    };
    // The recorded variables, title and goal; a new id; the source named.
    let second = s.submit_req(rerun(&[], "")).await.unwrap();
    assert_ne!(second.run_id, first);
    assert_eq!(second.rerun_of, first);
    assert_eq!(second.title, "Greeting");
    assert_eq!(second.goal, "Say hello");
    let done = s.wait_final(&second.run_id, 30).await;
    assert_eq!(done.state, TaskState::Completed as i32, "{done:?}");
    assert_eq!(
        s.read_text(&format!("docs/{}.txt", second.run_id)).await,
        "hello ann",
        "the run's own id and the recorded variable"
    );
    let created = s.events(&second.run_id).await;
    let d = data(&created[0]);
    assert_eq!(created[0].r#type, "task.created");
    assert_eq!(d["rerun_of"], first.as_str());
    assert_eq!(d["by"], "bob");

    // Variables given replace the recorded ones; a retried request starts one run.
    let third = s
        .submit_req(rerun(&[("who", "cy")], "again-1"))
        .await
        .unwrap();
    let same = s
        .submit_req(rerun(&[("who", "cy")], "again-1"))
        .await
        .unwrap();
    assert_eq!(third.run_id, same.run_id);
    s.wait_final(&third.run_id, 30).await;
    assert_eq!(
        s.read_text(&format!("docs/{}.txt", third.run_id)).await,
        "hello cy"
    );

    // A title given replaces the recorded one.
    let mut titled = rerun(&[], "");
    titled.title = "Greeting again".into();
    let fourth = s.submit_req(titled).await.unwrap();
    assert_eq!(fourth.title, "Greeting again");
    assert_eq!(fourth.goal, "Say hello");
    s.wait_final(&fourth.run_id, 30).await;

    // Refusals: an unknown run, a graph sent alongside, a run of another project.
    let mut bad = rerun(&[], "");
    bad.rerun_of = "no-such-run".into();
    let e = s.submit_req(bad).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let mut bad = rerun(&[], "");
    bad.graph_yaml = graph.into();
    let e = s.submit_req(bad).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("rerun_of"), "{}", e.message());
    let mut other = rerun(&[], "");
    other.project_id = "another-project".into();
    let e = s.submit_req(other).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let mut bad = rerun(&[], "");
    bad.rerun_of = "../x".into();
    let e = s.submit_req(bad).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    s.stop().await;
}

/// A finished run's state.json as the orchestrator writes it.
fn past_run(run: &str, title: &str, state: &str, day: u32) -> Vec<u8> {
    let at = format!("2026-02-{day:02}T08:00:00.000Z");
    serde_json::json!({
        "run_id": run, "project": PROJECT, "title": title, "goal": format!("goal of {title}"),
        "topology": "dag", "llm": "", "state": state, "created_at": at, "updated_at": at,
        "created_by": "user", "nodes": [], "roster": [], "notes": 0, "last_seq": 3,
    })
    .to_string()
    .into_bytes()
}

/// ListRuns pages through the store's run index for runs that are not live, merged with the
/// live ones, newest first, the page token resuming after the last run sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_comes_from_the_run_index_merged_with_live_runs() {
    let s = Stack::start(Options::default()).await;
    let states = ["completed", "failed", "canceled"];
    let mut past = Vec::new();
    for i in 1..=25u32 {
        let run = format!("past-{i:02}");
        let state = states[(i % 3) as usize];
        put_file(
            &s.store,
            &format!(".cairn/runs/{run}/state.json"),
            &past_run(&run, &format!("old run {i}"), state, i),
        )
        .await;
        past.push((run, state));
    }
    let live = s
        .submit("title: Live gate\nnodes:\n  - {id: g, type: gate}\n", &[])
        .await
        .unwrap()
        .run_id;
    s.wait_state(&live, TaskState::InputRequired, 20).await;

    // Pages of 4: the live run (newest), then the past runs newest first.
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let page = s
            .client
            .clone()
            .list_runs(ListRunsRequest {
                project_id: PROJECT.into(),
                page: Some(PageRequest {
                    page_size: 4,
                    page_token: token.clone(),
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.runs.len() <= 4);
        pages.extend(page.runs);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut want = vec![live.clone()];
    want.extend(past.iter().rev().map(|(r, _)| r.clone()));
    assert_eq!(
        pages.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>(),
        want
    );
    // The live run as its driver knows it; the others as their state.json says.
    assert_eq!(pages[0].state, TaskState::InputRequired as i32);
    assert_eq!(pages[0].gates.len(), 1);
    assert_eq!(pages[1].title, "old run 25");
    assert_eq!(pages[1].run_dir, ".cairn/runs/past-25");
    // Filters apply to both.
    let failed = search(
        &s,
        ListRunsRequest {
            states: vec![TaskState::Failed as i32, TaskState::InputRequired as i32],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut want = vec![live.clone()];
    want.extend(
        past.iter()
            .rev()
            .filter(|(_, st)| *st == "failed")
            .map(|(r, _)| r.clone()),
    );
    assert_eq!(failed, want);
    assert_eq!(
        search(&s, text("old run 7")).await.unwrap(),
        vec!["past-07".to_owned()]
    );
    // An offset (what tokens used to be) is not a token this server gave.
    let e = s
        .client
        .clone()
        .list_runs(ListRunsRequest {
            project_id: PROJECT.into(),
            page: Some(PageRequest {
                page_size: 4,
                page_token: "4".into(),
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    s.stop().await;
}
