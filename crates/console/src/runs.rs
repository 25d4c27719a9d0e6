//! The runs list: a project's runs, newest first, searched and filtered by text (title, goal,
//! run id), state and creation day (ListRuns), paginated, with the project chosen from the
//! store's projects (ListProjects). The page's script fetches it again every few seconds and
//! replaces the list when it changed. A "Start a run" link leads to start.rs.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use cairn_proto::v1::{
    ListProjectsRequest, ListRunSummariesRequest, ListRunsRequest, PageRequest, Project,
};
use maud::html;
use serde::Deserialize;

use super::compare;
use super::page::{self, layout};
use super::session::Visitor;
use super::{Console, ConsoleError};
use cairn_server::roles::Rpc;

/// Runs per page.
const PAGE_SIZE: u32 = 100;

#[derive(Deserialize)]
pub(super) struct ListQuery {
    #[serde(default)]
    project: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    page_token: String,
    /// Text in the title, goal or run id.
    #[serde(default)]
    q: String,
    /// First day (YYYY-MM-DD, UTC) a run was created on.
    #[serde(default)]
    from: String,
    /// Last day (YYYY-MM-DD, UTC) a run was created on.
    #[serde(default)]
    to: String,
}

/// Longest search text, in characters (the orchestrator's bound).
const MAX_SEARCH_CHARS: usize = 200;

/// The search as typed, checked, and as the orchestrator's time bounds.
struct Search {
    q: String,
    from: String,
    to: String,
    created_after: String,
    created_before: String,
}

impl Search {
    fn of(q: &ListQuery) -> Result<Search, ConsoleError> {
        let text = q.q.trim().to_owned();
        if text.chars().count() > MAX_SEARCH_CHARS {
            return Err(ConsoleError::BadRequest(format!(
                "the search text is longer than {MAX_SEARCH_CHARS} characters"
            )));
        }
        let from = q.from.trim().to_owned();
        let to = q.to.trim().to_owned();
        let created_after = day_bound("from", &from, false)?;
        let created_before = day_bound("to", &to, true)?;
        Ok(Search {
            q: text,
            from,
            to,
            created_after,
            created_before,
        })
    }

    /// This search in a runs-list URL (without the page token).
    fn url(&self, project: &str, state: Option<&str>) -> String {
        let mut url = page::runs_url(project, state);
        for (k, v) in [("q", &self.q), ("from", &self.from), ("to", &self.to)] {
            if !v.is_empty() {
                url.push_str(&format!("&{k}={}", page::qv(v)));
            }
        }
        url
    }

    fn is_empty(&self) -> bool {
        self.q.is_empty() && self.from.is_empty() && self.to.is_empty()
    }
}

/// A day (YYYY-MM-DD) as an RFC 3339 bound: its start, or (`end`) the next day's start.
fn day_bound(field: &str, day: &str, end: bool) -> Result<String, ConsoleError> {
    if day.is_empty() {
        return Ok(String::new());
    }
    let format = time::macros::format_description!("[year]-[month]-[day]");
    let bad = || ConsoleError::BadRequest(format!("{field} `{day}` is not a day like 2026-11-25"));
    let d = time::Date::parse(day, &format).map_err(|_| bad())?;
    let d = if end {
        d.next_day().ok_or_else(bad)?
    } else {
        d
    };
    Ok(format!("{d}T00:00:00Z"))
}

/// The store's projects this visitor may see (the first thousand).
pub(super) async fn visible_projects(
    console: &Console,
    visitor: &Visitor,
) -> Result<Vec<Project>, ConsoleError> {
    Ok(console
        .call(
            "listing projects",
            console.store().list_projects(ListProjectsRequest {
                page: Some(PageRequest {
                    page_size: 1000,
                    page_token: String::new(),
                }),
            }),
        )
        .await?
        .projects
        .into_iter()
        .filter(|p| visitor.may_see(&p.project_id))
        .collect())
}

/// How many runs match the search, counted by the store in its run index (the states of
/// runs still running may lag there by a moment; no run is sent); None when it cannot say.
async fn count(
    console: &Console,
    project: &str,
    state: Option<&str>,
    search: &Search,
) -> Option<u64> {
    let counted = console
        .call(
            "counting runs",
            console.store().list_run_summaries(ListRunSummariesRequest {
                project_id: project.to_owned(),
                states: state.map(|s| vec![s.to_owned()]).unwrap_or_default(),
                text: search.q.clone(),
                created_after: search.created_after.clone(),
                created_before: search.created_before.clone(),
                count_only: true,
                ..Default::default()
            }),
        )
        .await
        .ok()?;
    Some(counted.total)
}

pub(super) async fn list(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ConsoleError> {
    let search = Search::of(&q)?;
    let state = match q.state.as_str() {
        "" | "all" => None,
        s => Some(
            page::TASK_STATES
                .iter()
                .find(|(name, _)| *name == s)
                .map(|(name, st)| (*name, *st))
                .ok_or_else(|| ConsoleError::BadRequest(format!("unknown state `{s}`; use one of created, working, input-required, completed, failed, canceled")))?,
        ),
    };
    let projects = visible_projects(&console, &visitor).await?;
    let default_project = &console.config().default_project;
    let project = if !q.project.is_empty() {
        q.project.clone()
    } else if !default_project.is_empty() && visitor.may_see(default_project) {
        default_project.clone()
    } else {
        projects
            .first()
            .map(|p| p.project_id.clone())
            .unwrap_or_default()
    };
    let flash = console.sessions().take_flash(&visitor.session_id);
    if project.is_empty() {
        let body = html! {
            h1 { "Runs" }
            p.hint { "There are no projects yet. Start a run with " code { "cairn run <graph.yaml>" } "." }
            @if visitor.may(Rpc::SubmitRun) {
                p { a.button #start-run href=(page::start_url("")) { "Start a run" } }
            }
        };
        return Ok(layout("Runs", Some(&visitor), flash.as_ref(), body).into_response());
    }
    let req = ListRunsRequest {
        project_id: project.clone(),
        states: state.map(|(_, s)| vec![s as i32]).unwrap_or_default(),
        page: Some(PageRequest {
            page_size: PAGE_SIZE,
            page_token: q.page_token.clone(),
        }),
        text: search.q.clone(),
        created_after: search.created_after.clone(),
        created_before: search.created_before.clone(),
        stalled: false,
    };
    let what = format!("listing the runs of {project}");
    let mut orchestrator = console.orchestrator(&visitor);
    let (runs, total) = tokio::join!(
        console.call(&what, orchestrator.list_runs(req)),
        count(&console, &project, state.map(|(n, _)| n), &search),
    );
    let runs = runs?;
    let current = state.map(|(n, _)| n);
    let body = html! {
        div.listhead {
            h1 { "Runs of " (project) }
            div.buttons {
                // The rows' boxes belong to this form (`form=`), so the list can be replaced
                // live without it.
                form #compare-runs method="get" action=(compare::compare_url(&project, "", "")) {
                    button type="submit" #compare-button { "Compare ticked runs" }
                }
                @if visitor.may(Rpc::SubmitRun) {
                    a.button #start-run href=(page::start_url(&project)) { "Start a run" }
                }
            }
        }
        form.filters #run-search method="get" action="/runs" role="search" {
            label { "Project"
                select name="project" {
                    @for p in &projects {
                        option value=(p.project_id) selected[p.project_id == project] { (p.project_id) }
                    }
                    @if !projects.iter().any(|p| p.project_id == project) {
                        option value=(project) selected { (project) }
                    }
                }
            }
            label.grow { "Title, goal or run id"
                input type="search" name="q" value=(search.q) maxlength=(MAX_SEARCH_CHARS) placeholder="text to find";
            }
            label { "State"
                select name="state" {
                    option value="" selected[current.is_none()] { "any" }
                    @for (name, _) in page::TASK_STATES {
                        option value=(name) selected[current == Some(name)] { (name) }
                    }
                }
            }
            label { "Created from" input type="date" name="from" value=(search.from); }
            label { "to" input type="date" name="to" value=(search.to); }
            button type="submit" { "Search" }
            @if !search.is_empty() || current.is_some() {
                a #clear-search href=(page::runs_url(&project, None)) { "clear" }
            }
        }
        nav.states aria-label="Runs by state" {
            a href=(search.url(&project, None)) class=(if current.is_none() { "current" } else { "" }) { "all" }
            @for (name, _) in page::TASK_STATES {
                a href=(search.url(&project, Some(name))) class=(if current == Some(name) { "current" } else { "" }) { (name) }
            }
        }
        div #runs-live data-live {
        // The index may not know runs the orchestrator just started: never fewer than shown.
        @if let Some(n) = total.filter(|n| *n >= runs.runs.len() as u64) {
            p.hint #runs-total {
                (n) @if n == 1 { " run" } @else { " runs" }
                @if current.is_some() || !search.is_empty() { " match" }
                @if n > u64::from(PAGE_SIZE) { " · " (PAGE_SIZE) " per page" }
            }
        }
        @if runs.runs.is_empty() {
            p.hint #no-runs {
                "No runs"
                @if let Some(s) = current { " in state " (s) }
                @if !search.is_empty() { " match this search" }
                "."
            }
        } @else {
            table.runs {
                thead { tr { th { span.visually-hidden { "Compare" } } th { "State" } th { "Title" } th { "Run" } th { "Started" } th { "Duration" } th { "Links" } } }
                tbody {
                    @for r in &runs.runs {
                        @let url = page::run_url(&r.project_id, &r.run_id);
                        @let run_dir = if r.run_dir.is_empty() { format!(".cairn/runs/{}", r.run_id) } else { r.run_dir.clone() };
                        tr {
                            // On a phone the box is a row of its own, its word beside it.
                            td.pick {
                                label.pick {
                                    input type="checkbox" name="run" value=(r.run_id) form="compare-runs" aria-label=(format!("Compare run {}", r.run_id));
                                    span.pick-word { "Compare" }
                                }
                            }
                            td data-label="State" { (page::badge(page::task_state_name(r.state))) }
                            td data-label="Title" {
                                a href=(url) { (if r.title.is_empty() { r.run_id.as_str() } else { r.title.as_str() }) }
                                @if !r.goal.is_empty() { div.goal.hint { (page::clip(&r.goal, 160)) } }
                            }
                            td data-label="Run" { code { (r.run_id) } }
                            td data-label="Started" { (page::when(&r.created_at)) }
                            td data-label="Duration" { (page::duration(&r.created_at, &r.updated_at, page::is_final(r.state))) }
                            td.links data-label="Links" {
                                a href=(url) { "run" } " "
                                a href=(format!("{url}#gates")) { "gates" } " "
                                a href=(page::tree_url(&r.project_id, &run_dir)) { "files" }
                            }
                        }
                    }
                }
            }
        }
        }
        nav.pages aria-label="Pages" {
            @if !q.page_token.is_empty() {
                a #newest-runs href=(search.url(&project, current)) { "Newest runs" }
            }
            @if !runs.next_page_token.is_empty() {
                a #older-runs href=(format!("{}&page_token={}", search.url(&project, current), page::qv(&runs.next_page_token))) { "Older runs" }
            }
        }
    };
    Ok(layout("Runs", Some(&visitor), flash.as_ref(), body).into_response())
}
