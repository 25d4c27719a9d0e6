//! Two runs compared through `console_router`: the page drawn from DiffRuns (graph, variables,
//! outputs per node, files with their diffs, the first divergence), runs picked on the runs
//! list or from a run page, refusals that keep the form; against a real orchestrator, two runs
//! of a graph under different variables, and a token scoped to one project that cannot
//! compare the runs of another.
#![allow(clippy::unwrap_used)]

#[path = "../../../services/orchestrator/tests/auth_support/mod.rs"]
mod auth_support;
#[path = "../../../services/orchestrator/tests/common/mod.rs"]
mod common;
mod console_support;

use axum::http::StatusCode;
use cairn_console::ConsoleConfig;
use cairn_proto::v1::{SubmitRunRequest, TaskState};
use console_support::*;

const OTHER_RUN: &str = "run-2";

async fn with_two_runs() -> (Services, Client) {
    let s = Services::start().await;
    let mut b = blocked_run(OTHER_RUN, "Draft again", "2026-01-02T00:00:00.000Z");
    b.rerun_of = RUN.into();
    s.fake.add_run(b);
    let c = logged_in(&s).await;
    (s, c)
}

fn diff_url(a: &str, b: &str) -> String {
    format!("/projects/{PROJECT}/diff?a={a}&b={b}")
}

#[tokio::test]
async fn the_compare_page_shows_graph_variables_outputs_and_files_from_diff_runs() {
    let (s, mut c) = with_two_runs().await;
    let (report, verdict) = sample_diff(RUN, OTHER_RUN);
    s.fake.set_diff(report, verdict);
    let p = c.get(&diff_url(RUN, OTHER_RUN)).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    let diffs = s.fake.diffs();
    assert_eq!(diffs.len(), 1);
    assert_eq!(
        (
            diffs[0].project_id.as_str(),
            diffs[0].run_a.as_str(),
            diffs[0].run_b.as_str()
        ),
        (PROJECT, RUN, OTHER_RUN)
    );
    let b = &p.body;
    // Both runs, linked, and the summary.
    assert!(b.contains("href=\"/projects/proj/runs/run-1\""), "{b}");
    assert!(b.contains("href=\"/projects/proj/runs/run-2\""), "{b}");
    assert!(
        b.contains("The graph changed · 2 variables differ · 2 nodes' outputs differ of 3 · 2 files differ of 3"),
        "{b}"
    );
    // The first divergence, naming the node in B.
    assert!(b.contains("data-verdict=\"diverged\""), "{b}");
    assert!(
        b.contains("href=\"/projects/proj/runs/run-2/nodes/draft\""),
        "{b}"
    );
    assert!(b.contains("id=\"verdict-diff\""), "{b}");
    // The graph's diff, with line numbers.
    assert!(b.contains("id=\"graph-diff\""), "{b}");
    // Variables: values escaped, a missing one said.
    assert!(b.contains("&lt;b&gt;rain&lt;/b&gt;"), "{b}");
    assert!(!b.contains("<b>rain</b>"), "{b}");
    assert!(b.contains("unset"), "{b}");
    // Nodes: outputs differ (linked to their diff), same, only in B; durations.
    assert!(
        b.contains("id=\"cmp-node-draft\" data-same=\"false\""),
        "{b}"
    );
    assert!(b.contains("href=\"#node-diff-draft\""), "{b}");
    assert!(b.contains("id=\"outputs-diff-draft\""), "{b}");
    assert!(
        b.contains("id=\"cmp-node-review\" data-same=\"true\""),
        "{b}"
    );
    assert!(b.contains("only in B"), "{b}");
    assert!(b.contains("1.2 s / 1m 05s"), "{b}");
    // Files: each side linked under its own run's directory; the text diff escaped.
    assert!(
        b.contains("href=\"/projects/proj/files?path=docs/run-1/draft.md\""),
        "{b}"
    );
    assert!(
        b.contains("href=\"/projects/proj/files?path=docs/run-2/draft.md\""),
        "{b}"
    );
    assert!(b.contains("id=\"file-diff-table-0\""), "{b}");
    assert!(
        b.contains("&lt;script&gt;alert(1)&lt;/script&gt; rain falls"),
        "{b}"
    );
    assert!(!b.contains("<script>alert(1)"), "{b}");
    assert!(b.contains("not written"), "{b}");
    assert!(
        b.contains("Files without a diff are not text or larger than 1 MiB"),
        "{b}"
    );
    assert!(
        b.contains(&format!(
            "href=\"{}\"",
            diff_url(OTHER_RUN, RUN).replace('&', "&amp;")
        )),
        "swap: {b}"
    );
}

#[tokio::test]
async fn runs_are_picked_on_the_runs_list_or_a_run_page() {
    let (s, mut c) = with_two_runs().await;
    // The runs list: a box per run for the comparison form, which sits outside the live part.
    let list = c.get(&format!("/runs?project={PROJECT}")).await;
    assert!(
        list.body
            .contains("<form id=\"compare-runs\" method=\"get\" action=\"/projects/proj/diff\">"),
        "{}",
        list.body
    );
    for run in [RUN, OTHER_RUN] {
        assert!(
            list.body.contains(&format!(
                "type=\"checkbox\" name=\"run\" value=\"{run}\" form=\"compare-runs\""
            )),
            "{}",
            list.body
        );
    }
    // Two ticked (newest first): the older is A.
    let p = c
        .get(&format!(
            "/projects/{PROJECT}/diff?run={OTHER_RUN}&run={RUN}"
        ))
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
    assert_eq!(p.location(), diff_url(RUN, OTHER_RUN));
    // One ticked: the form again, saying why.
    let p = c.get(&format!("/projects/{PROJECT}/diff?run={RUN}")).await;
    assert_eq!(p.status, StatusCode::BAD_REQUEST, "{}", p.body);
    assert!(p.body.contains("1 ticked"), "{}", p.body);
    assert!(p.body.contains("id=\"compare-form\""), "{}", p.body);
    // The same run twice.
    let p = c.get(&diff_url(RUN, RUN)).await;
    assert_eq!(p.status, StatusCode::BAD_REQUEST, "{}", p.body);
    assert!(p.body.contains("two different runs"), "{}", p.body);
    assert!(s.fake.diffs().is_empty(), "nothing compared yet");
    // The form alone, A filled in, the project's runs suggested.
    let p = c.get(&format!("/projects/{PROJECT}/diff?a={RUN}")).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    assert!(p.body.contains("name=\"a\" value=\"run-1\""), "{}", p.body);
    assert!(p.body.contains("<option value=\"run-2\">"), "{}", p.body);
    // A re-run's page compares it with its source; every run page offers a comparison.
    let page = c
        .get(&format!("/projects/{PROJECT}/runs/{OTHER_RUN}"))
        .await;
    assert!(
        page.body.contains(&format!(
            "id=\"compare-rerun\" href=\"{}\"",
            diff_url(RUN, OTHER_RUN).replace('&', "&amp;")
        )),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("id=\"compare-other\" href=\"/projects/proj/diff?a=run-2\""),
        "{}",
        page.body
    );
    // `/diff?project=` leads to the project's page.
    let p = c
        .get(&format!("/diff?project={PROJECT}&a={RUN}&b={OTHER_RUN}"))
        .await;
    assert_eq!(p.status, StatusCode::SEE_OTHER);
    assert_eq!(p.location(), diff_url(RUN, OTHER_RUN));
    let p = c.get("/diff?a=x&b=y").await;
    assert_eq!(p.status, StatusCode::BAD_REQUEST, "{}", p.body);
    // A run the orchestrator does not know: its refusal, as a 404.
    let p = c.get(&diff_url(RUN, "nope")).await;
    assert_eq!(p.status, StatusCode::NOT_FOUND, "{}", p.body);
    assert!(p.body.contains("nope"), "{}", p.body);
}

const WORDS: &str = r##"
vars: {word: one}
nodes:
  - {id: write, type: write_file, path: "docs/{{run_id}}/word.md", content: "# Word\n\nthe word is {{vars.word}}\n"}
  - {id: fixed, type: write_file, path: "docs/{{run_id}}/fixed.md", content: "fixed", needs: [write]}
"##;

/// Two runs of the same graph under different variables, compared by the real orchestrator:
/// the variable, the node whose output changed and the file's diff; a token limited to one
/// project compares that project's runs and is refused another's, before any call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_runs_are_compared_and_a_scoped_token_cannot_compare_another_projects_runs() {
    let o = auth_support::Secured::start(true).await;
    let router = cairn_console::console_router(ConsoleConfig {
        enabled: true,
        orchestrator_addr: o.orch_addr.clone(),
        store_addr: o.store_addr.clone(),
        user_tokens: true,
        ..ConsoleConfig::default()
    })
    .unwrap();
    let submit = |project: &'static str, word: &'static str| {
        let mut client = o.client();
        let token = o.token("ada");
        async move {
            client
                .submit_run(auth_support::as_(
                    &token,
                    SubmitRunRequest {
                        project_id: project.into(),
                        graph_yaml: WORDS.into(),
                        vars: [("word".to_owned(), word.to_owned())].into(),
                        ..Default::default()
                    },
                ))
                .await
                .unwrap()
                .into_inner()
                .run_id
        }
    };
    let mut runs = Vec::new();
    for (project, word) in [
        (PROJECT, "one"),
        (PROJECT, "two"),
        (auth_support::OTHER, "one"),
        (auth_support::OTHER, "two"),
    ] {
        let run = submit(project, word).await;
        o.wait_state(project, &run, TaskState::Completed).await;
        runs.push(run);
    }

    // A token limited to PROJECT compares PROJECT's runs.
    let mut pat = Client::new(router.clone());
    assert_eq!(
        pat.login_token(&o.token("pat")).await.status,
        StatusCode::SEE_OTHER
    );
    let p = pat.get(&diff_url(&runs[0], &runs[1])).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    let b = &p.body;
    assert!(b.contains("Same graph"), "{b}");
    assert!(
        b.contains("<td data-label=\"variable\"><code>word</code></td>"),
        "{b}"
    );
    assert!(
        b.contains("id=\"cmp-node-write\" data-same=\"false\""),
        "{b}"
    );
    assert!(
        b.contains("id=\"cmp-node-fixed\" data-same=\"true\""),
        "{b}"
    );
    assert!(
        b.contains("data-path=\"docs/⟨run_id⟩/word.md\" data-same=\"false\""),
        "{b}"
    );
    assert!(
        b.contains("data-path=\"docs/⟨run_id⟩/fixed.md\" data-same=\"true\""),
        "{b}"
    );
    // The file's diff: the changed line on each side.
    assert!(b.contains("the word is one"), "{b}");
    assert!(b.contains("the word is two"), "{b}");
    assert!(b.contains("data-verdict=\"diverged\""), "{b}");

    // ... and is refused another project's, by the console, as page or via /diff.
    let (theirs_a, theirs_b) = (&runs[2], &runs[3]);
    let other = format!(
        "/projects/{}/diff?a={theirs_a}&b={theirs_b}",
        auth_support::OTHER
    );
    let p = pat.get(&other).await;
    assert_eq!(p.status, StatusCode::FORBIDDEN, "{}", p.body);
    assert!(!p.body.contains("the word is"), "{}", p.body);
    let p = pat
        .get(&format!(
            "/diff?project={}&a={theirs_a}&b={theirs_b}",
            auth_support::OTHER
        ))
        .await;
    assert_eq!(p.location(), other);
    assert_eq!(pat.get(p.location()).await.status, StatusCode::FORBIDDEN);
    // The orchestrator refuses it too, whoever asks with that token.
    let refused = o
        .client()
        .diff_runs(auth_support::as_(
            &o.token("pat"),
            cairn_proto::v1::DiffRunsRequest {
                project_id: auth_support::OTHER.into(),
                run_a: theirs_a.clone(),
                run_b: theirs_b.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);

    // A viewer of every project compares the other project's runs.
    let mut vic = Client::new(router);
    assert_eq!(
        vic.login_token(&o.token("vic")).await.status,
        StatusCode::SEE_OTHER
    );
    let p = vic.get(&other).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    assert!(p.body.contains("the word is two"), "{}", p.body);
}
