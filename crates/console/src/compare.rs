//! Two runs of a project compared (`/projects/<p>/diff?a=RUN&b=RUN`): the orchestrator's
//! DiffRuns, the comparison `cairn runs diff` prints, drawn as a page: whether B did the same
//! work as A and where it first did something else, the graph (a unified diff when it
//! changed), the variables that differ, per node the attempts, outputs (a diff when they
//! differ), tokens and time, and every file either run wrote (sha256 on each side, a unified
//! diff of text). Runs are picked on the runs list (two ticked rows), from a run page
//! ("compare with …", a re-run or replay against its source) or in this page's own form.
//! `/diff?project=P&a=…&b=…` leads here. The page is under the project's path, so a visitor
//! who may not see the project is refused before anything is asked (and the orchestrator
//! checks the caller's token again).

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use cairn_proto::v1::{DiffRunsRequest, GetRunRequest, ListRunsRequest, PageRequest, RunInfo};
use maud::{html, Markup};
use serde::Deserialize;
use tonic::Code;

use super::diff;
use super::nodepage::node_url;
use super::page::{self, layout};
use super::session::Visitor;
use super::timeline::span_text;
use super::{Console, ConsoleError};

/// How the comparison writes each run's own id inside paths and values (so two runs under
/// different ids compare equal when they did the same thing).
const RUN_MARK: &str = "⟨run_id⟩";
/// Lines of one diff drawn on the page (`cairn runs diff` prints all of them).
const MAX_DIFF_LINES: usize = 2000;
/// Runs offered in the form's suggestions.
const SUGGESTED: u32 = 100;

/// The comparison URL of runs `a` and `b` of `project` (either may be empty: the form).
pub(super) fn compare_url(project: &str, a: &str, b: &str) -> String {
    let mut url = format!("/projects/{}/diff", page::seg(project));
    let mut sep = '?';
    for (k, v) in [("a", a), ("b", b)] {
        if !v.is_empty() {
            url.push_str(&format!("{sep}{k}={}", page::qv(v)));
            sep = '&';
        }
    }
    url
}

/// Both sides of one figure.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Pair<T> {
    a: T,
    b: T,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
}

impl Usage {
    fn text(&self) -> String {
        format!("{} + {}", self.prompt_tokens, self.completion_tokens)
    }
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct GraphDiff {
    same: bool,
    diff: String,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct VarDiff {
    name: String,
    a: Option<String>,
    b: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct NodeDiff {
    node: String,
    attempts: Pair<u32>,
    outputs_same: bool,
    outputs_diff: String,
    usage: Pair<Usage>,
    duration_ms: Pair<Option<u64>>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct FileDiff {
    path: String,
    sha256: Pair<Option<String>>,
    same: bool,
    diff: Option<String>,
}

/// DiffRuns' report (docs/replay.md, "cairn runs diff").
#[derive(Default, Deserialize)]
#[serde(default)]
struct Report {
    state: Pair<String>,
    graph: GraphDiff,
    vars: Vec<VarDiff>,
    nodes: Vec<NodeDiff>,
    files: Vec<FileDiff>,
    usage: Pair<Usage>,
    duration_ms: Pair<Option<u64>>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Divergence {
    node: String,
    attempt: u64,
    what: String,
    diff: String,
}

/// B judged as a replay of A.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Verdict {
    verdict: String,
    divergence: Option<Divergence>,
}

/// What the query asks for.
#[derive(Debug, PartialEq)]
enum Pick {
    /// Both runs: compare them.
    Runs(String, String),
    /// Two rows ticked on the runs list (newest first): the comparison's own URL, the
    /// older run as A.
    Redirect(String, String),
    /// The form, with what was given and why it cannot compare yet (None: nothing wrong).
    Form {
        a: String,
        b: String,
        problem: Option<String>,
    },
}

fn pick(query: &[(String, String)]) -> Pick {
    let first = |key: &str| {
        query
            .iter()
            .find(|(k, v)| k == key && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default()
    };
    let (a, b) = (first("a"), first("b"));
    let ticked: Vec<&str> = query
        .iter()
        .filter(|(k, v)| k == "run" && !v.trim().is_empty())
        .map(|(_, v)| v.trim())
        .collect();
    if !ticked.is_empty() {
        return match ticked.as_slice() {
            [newer, older] if newer != older => {
                Pick::Redirect((*older).to_owned(), (*newer).to_owned())
            }
            _ => Pick::Form {
                a,
                b,
                problem: Some(format!(
                    "Tick two runs on the runs list to compare them ({} ticked), or name them here.",
                    ticked.len()
                )),
            },
        };
    }
    match (a.is_empty(), b.is_empty()) {
        (false, false) if a == b => Pick::Form {
            problem: Some(format!("Run {a} is both A and B: name two different runs.")),
            a,
            b,
        },
        (false, false) => Pick::Runs(a, b),
        _ => Pick::Form {
            a,
            b,
            problem: None,
        },
    }
}

#[derive(Deserialize)]
pub(super) struct TopQuery {
    #[serde(default)]
    project: String,
    #[serde(default)]
    a: String,
    #[serde(default)]
    b: String,
}

/// `/diff?project=P&a=…&b=…`: the project's comparison page.
pub(super) async fn top(Query(q): Query<TopQuery>) -> Result<Response, ConsoleError> {
    if q.project.trim().is_empty() {
        return Err(ConsoleError::BadRequest(
            "name the project of the two runs: /diff?project=P&a=RUN&b=RUN".into(),
        ));
    }
    Ok(Redirect::to(&compare_url(q.project.trim(), q.a.trim(), q.b.trim())).into_response())
}

pub(super) async fn view(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path(project): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Response, ConsoleError> {
    let (a, b) = match pick(&query) {
        Pick::Runs(a, b) => (a, b),
        Pick::Redirect(a, b) => {
            return Ok(Redirect::to(&compare_url(&project, &a, &b)).into_response())
        }
        Pick::Form { a, b, problem } => {
            let status = if problem.is_some() {
                axum::http::StatusCode::BAD_REQUEST
            } else {
                axum::http::StatusCode::OK
            };
            let body = form(&console, &visitor, &project, &a, &b, problem.as_deref()).await;
            return Ok((status, layout("Compare runs", Some(&visitor), None, body)).into_response());
        }
    };
    let orchestrator = console.orchestrator(&visitor);
    let console = &console;
    let get = |run: &str| {
        let mut o = orchestrator.clone();
        let req = GetRunRequest {
            project_id: project.clone(),
            run_id: run.to_owned(),
        };
        let what = format!("reading run {run}");
        async move { console.call(&what, o.get_run(req)).await }
    };
    let compared = {
        let mut o = orchestrator.clone();
        let req = DiffRunsRequest {
            project_id: project.clone(),
            run_a: a.clone(),
            run_b: b.clone(),
        };
        let what = format!("comparing runs {a} and {b}");
        async move { console.call(&what, o.diff_runs(req)).await }
    };
    let (info_a, info_b, compared) = tokio::join!(get(&a), get(&b), compared);
    let (info_a, info_b, compared) = (info_a?, info_b?, compared?);
    let unreadable = |what: &str, e: serde_json::Error| ConsoleError::Rpc {
        what: format!("comparing runs {a} and {b}"),
        code: Code::Internal,
        message: format!("the orchestrator's {what} is not the JSON expected: {e}"),
        reason: None,
    };
    let report: Report =
        serde_json::from_str(&compared.report_json).map_err(|e| unreadable("report", e))?;
    let verdict: Verdict =
        serde_json::from_str(&compared.verdict_json).map_err(|e| unreadable("verdict", e))?;
    let body = render(&project, (&info_a, &info_b), &report, &verdict);
    Ok(layout(&format!("{a} vs {b}"), Some(&visitor), None, body).into_response())
}

/// The form naming the two runs, with the project's newest runs as suggestions.
async fn form(
    console: &Console,
    visitor: &Visitor,
    project: &str,
    a: &str,
    b: &str,
    problem: Option<&str>,
) -> Markup {
    let mut orchestrator = console.orchestrator(visitor);
    let recent = console
        .call(
            "listing runs",
            orchestrator.list_runs(ListRunsRequest {
                project_id: project.to_owned(),
                page: Some(PageRequest {
                    page_size: SUGGESTED,
                    page_token: String::new(),
                }),
                ..Default::default()
            }),
        )
        .await
        .map(|r| r.runs)
        .unwrap_or_default();
    html! {
        h1 { "Compare runs of " (project) }
        @if let Some(p) = problem { p.error #compare-problem role="alert" { (p) } }
        p.hint { "A is the run compared against (the recorded one, for a replay); B the other. "
            "On the " a href=(page::runs_url(project, None)) { "runs list" } ", tick two runs and press "
            em { "Compare" } "." }
        form.filters #compare-form method="get" action=(compare_url(project, "", "")) {
            label.grow { "Run A" input type="text" name="a" value=(a) list="recent-runs" required spellcheck="false"; }
            label.grow { "Run B" input type="text" name="b" value=(b) list="recent-runs" required spellcheck="false"; }
            button type="submit" { "Compare" }
        }
        datalist #recent-runs {
            @for r in &recent {
                option value=(r.run_id) { (page::clip(if r.title.is_empty() { &r.run_id } else { &r.title }, 80)) }
            }
        }
    }
}

/// One side's run in the header: its link, state, start and title.
fn side(project: &str, label: &str, info: &RunInfo, usage: &Usage, took: Option<u64>) -> Markup {
    let state = page::task_state_name(info.state);
    html! {
        div.compare-side id=(format!("side-{}", label.to_lowercase())) {
            h2 { (label) ": " a href=(page::run_url(project, &info.run_id)) {
                (if info.title.is_empty() { info.run_id.as_str() } else { info.title.as_str() }) } }
            p.meta { code { (info.run_id) } " " (page::badge(state))
                " · started " (page::when(&info.created_at))
                " · " (ms(took)) " · tokens " (usage.text()) }
            @if !info.rerun_of.is_empty() { p.hint { "re-run of " code { (info.rerun_of) } } }
            @if !info.replay_of.is_empty() { p.hint { "replay of " code { (info.replay_of) } } }
        }
    }
}

fn ms(v: Option<u64>) -> String {
    v.map(|m| span_text(time::Duration::milliseconds(m as i64)))
        .unwrap_or_else(|| "—".into())
}

/// A unified diff (text) as a numbered table in its own scroll box; `id`: the table's.
fn diff_box(id: &str, label: &str, text: &str) -> Markup {
    let (hunks, left_out) = diff::parse_unified(text, MAX_DIFF_LINES);
    html! {
        @if hunks.is_empty() {
            p.hint { "No line differs (the difference is in bytes that are not text)." }
        } @else {
            div.scroll tabindex="0" role="region" aria-label=(label) { (diff::table(id, &hunks)) }
            @if left_out > 0 {
                p.hint { (left_out) " more lines not shown; " code { "cairn runs diff" } " prints all of them." }
            }
        }
    }
}

/// The first divergence, or why the runs count as doing the same work.
fn verdict_section(project: &str, a: &str, b: &str, v: &Verdict) -> Markup {
    let (word, class) = match v.verdict.as_str() {
        "identical" => ("same work", "badge ok"),
        "diverged" => ("diverged", "badge bad"),
        "failed" => ("ended differently", "badge bad"),
        "running" => ("not finished", "badge busy"),
        _ => ("unknown", "badge"),
    };
    html! {
        section #compare-verdict {
            h2 { "Same work? " span class=(class) #verdict data-verdict=(v.verdict) { (word) } }
            @match (v.verdict.as_str(), &v.divergence) {
                ("identical", _) => p { "B did what A did: the same end state, every node's outputs and events, and the same bytes in every file A wrote (each run's own id, times and other values of one life left out)." },
                ("running", _) => p { "B has not finished (it may wait at a gate): compare again when it ends." },
                (_, Some(d)) => {
                    p #divergence {
                        "First difference"
                        @if !d.node.is_empty() {
                            " at node " a href=(node_url(&page::run_url(project, b), &d.node)) { code { (d.node) } }
                            " attempt " (d.attempt)
                        }
                        ": " strong { (d.what) }
                        @if !d.node.is_empty() {
                            " (" a href=(node_url(&page::run_url(project, a), &d.node)) { "the node in A" } ")"
                        }
                    }
                    @if !d.diff.is_empty() {
                        @if d.diff.contains("\n@@ ") || d.diff.starts_with("@@ ") {
                            (diff_box("verdict-diff", "The first difference", &d.diff))
                        } @else {
                            pre.code #verdict-diff { (d.diff) }
                        }
                    }
                }
                _ => p.hint { "The orchestrator named no first difference." },
            }
        }
    }
}

fn render(project: &str, (a, b): (&RunInfo, &RunInfo), r: &Report, v: &Verdict) -> Markup {
    let (ra, rb) = (a.run_id.as_str(), b.run_id.as_str());
    let (url_a, url_b) = (page::run_url(project, ra), page::run_url(project, rb));
    let nodes_differ = r.nodes.iter().filter(|n| !n.outputs_same).count();
    let files_differ = r.files.iter().filter(|f| !f.same).count();
    let count =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    html! {
        div.listhead {
            h1 #compare-title { "Compare runs" }
            a #swap href=(compare_url(project, rb, ra)) { "swap A and B" }
        }
        div.compare-head #compare-head {
            (side(project, "A", a, &r.usage.a, r.duration_ms.a))
            (side(project, "B", b, &r.usage.b, r.duration_ms.b))
        }
        p #compare-summary {
            @if r.graph.same { "Same graph" } @else { "The graph changed" } " · "
            (count(r.vars.len(), "variable differs", "variables differ")) " · "
            (count(nodes_differ, "node's outputs differ", "nodes' outputs differ")) " of " (r.nodes.len()) " · "
            (count(files_differ, "file differs", "files differ")) " of " (r.files.len())
        }
        (verdict_section(project, ra, rb, v))
        section #compare-graph {
            h2 { "Graph" }
            @if r.graph.same {
                p #graph-same { "Both runs ran the same graph (variables apart)." }
            } @else {
                (diff_box("graph-diff", "How the graph changed", &r.graph.diff))
            }
        }
        section #compare-vars {
            h2 { "Variables" }
            @if r.vars.is_empty() {
                p.hint #vars-same { "The same variables, with the same values." }
            } @else {
                table.vars #vars-table {
                    thead { tr { th { "variable" } th { "A" } th { "B" } } }
                    tbody {
                        @for d in &r.vars {
                            tr {
                                td data-label="variable" { code { (d.name) } }
                                td data-label="A" { @match &d.a { Some(x) => code { (x) }, None => span.hint { "unset" } } }
                                td data-label="B" { @match &d.b { Some(x) => code { (x) }, None => span.hint { "unset" } } }
                            }
                        }
                    }
                }
            }
        }
        section #compare-nodes {
            h2 { "Nodes" }
            @if r.nodes.is_empty() {
                p.hint { "Neither run started a node." }
            } @else {
                table.nodes #nodes-table {
                    thead { tr { th { "node" } th { "outputs" } th.num { "attempts A / B" } th { "tokens A / B" } th { "took A / B" } } }
                    tbody {
                        @for n in &r.nodes {
                            tr id=(format!("cmp-node-{}", n.node)) data-same=(n.outputs_same) {
                                td data-label="node" {
                                    code { (n.node) } " "
                                    @if n.attempts.a > 0 { a href=(node_url(&url_a, &n.node)) { "A" } " " }
                                    @if n.attempts.b > 0 { a href=(node_url(&url_b, &n.node)) { "B" } }
                                }
                                td data-label="outputs" {
                                    @if n.attempts.a == 0 { span.badge.wait { "only in B" } }
                                    @else if n.attempts.b == 0 { span.badge.wait { "only in A" } }
                                    @else if n.outputs_same { span.badge.ok { "same" } }
                                    @else { a.badge.bad href=(format!("#node-diff-{}", n.node)) { "differ" } }
                                }
                                td.num data-label="attempts A / B" { (n.attempts.a) " / " (n.attempts.b) }
                                td data-label="tokens A / B" { (n.usage.a.text()) " / " (n.usage.b.text()) }
                                td data-label="took A / B" { (ms(n.duration_ms.a)) " / " (ms(n.duration_ms.b)) }
                            }
                        }
                    }
                }
                @for n in r.nodes.iter().filter(|n| !n.outputs_same && !n.outputs_diff.is_empty()) {
                    h3 id=(format!("node-diff-{}", n.node)) { "Outputs of " code { (n.node) } }
                    (diff_box(&format!("outputs-diff-{}", n.node), &format!("Outputs of {} in A and B", n.node), &n.outputs_diff))
                }
            }
        }
        section #compare-files {
            h2 { "Files written" }
            @if r.files.is_empty() {
                p.hint { "Neither run wrote a file." }
            } @else {
                p.hint { "Paths with " code { (RUN_MARK) } " are under each run's own directory." }
                table.files #files-table {
                    thead { tr { th { "path" } th { "A" } th { "B" } th { "same" } } }
                    tbody {
                        @for (i, f) in r.files.iter().enumerate() {
                            tr data-path=(f.path) data-same=(f.same) {
                                td data-label="path" { code { (f.path) } }
                                td data-label="A" { (file_cell(project, &f.path, ra, f.sha256.a.as_deref())) }
                                td data-label="B" { (file_cell(project, &f.path, rb, f.sha256.b.as_deref())) }
                                td data-label="same" {
                                    @if f.same { span.badge.ok { "same" } }
                                    @else if f.diff.is_some() { a.badge.bad href=(format!("#file-diff-{i}")) { "differ" } }
                                    @else { span.badge.bad { "differ" } }
                                }
                            }
                        }
                    }
                }
                @for (i, f) in r.files.iter().enumerate() {
                    @if let (false, Some(d)) = (f.same, &f.diff) {
                        h3 id=(format!("file-diff-{i}")) { code { (f.path) } }
                        (diff_box(&format!("file-diff-table-{i}"), &format!("{} in A and B", f.path), d))
                    }
                }
                @if r.files.iter().any(|f| !f.same && f.diff.is_none()) {
                    p.hint { "Files without a diff are not text or larger than 1 MiB: open each side to compare." }
                }
            }
        }
        p.hint { "States: A " (r.state.a) ", B " (r.state.b) ". The same comparison in a terminal: "
            code { "cairn runs diff " (ra) " " (rb) } "." }
    }
}

/// One side of a written file: a link to it and the start of its sha256, or that the run did
/// not write it.
fn file_cell(project: &str, path: &str, run: &str, sha: Option<&str>) -> Markup {
    html! {
        @match sha {
            Some(s) => {
                a href=(page::file_url(project, &path.replace(RUN_MARK, run))) title=(s) {
                    code { (page::clip(s.trim_start_matches("sha256:"), 13)) }
                }
            }
            None => span.hint { "not written" },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn two_ticked_rows_compare_the_older_as_a() {
        assert_eq!(
            pick(&q(&[("run", "new"), ("run", "old")])),
            Pick::Redirect("old".into(), "new".into())
        );
        assert_eq!(
            pick(&q(&[("a", "x"), ("b", " y ")])),
            Pick::Runs("x".into(), "y".into())
        );
        match pick(&q(&[("run", "one")])) {
            Pick::Form {
                problem: Some(p), ..
            } => assert!(p.contains("1 ticked"), "{p}"),
            other => panic!("{other:?}"),
        }
        match pick(&q(&[("a", "x"), ("b", "x")])) {
            Pick::Form {
                problem: Some(p), ..
            } => assert!(p.contains("two different"), "{p}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            pick(&q(&[("a", "x")])),
            Pick::Form {
                a: "x".into(),
                b: String::new(),
                problem: None
            }
        );
    }
}
