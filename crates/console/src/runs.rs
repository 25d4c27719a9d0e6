//! The runs list: a project's runs, newest first, filtered by state (ListRuns), with the
//! project chosen from the store's projects (ListProjects). The page's script fetches it again
//! every few seconds and replaces the list when it changed.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use cairn_proto::v1::{ListProjectsRequest, ListRunsRequest, PageRequest};
use maud::html;
use serde::Deserialize;

use super::page::{self, layout};
use super::session::Visitor;
use super::{Console, ConsoleError};

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
}

pub(super) async fn list(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ConsoleError> {
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
    let projects = console
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
        .collect::<Vec<_>>();
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
    };
    let runs = console
        .call(
            &format!("listing the runs of {project}"),
            console.orchestrator(&visitor).list_runs(req),
        )
        .await?;
    let current = state.map(|(n, _)| n);
    let body = html! {
        h1 { "Runs of " (project) }
        form.filters method="get" action="/runs" {
            label { "Project "
                select name="project" {
                    @for p in &projects {
                        option value=(p.project_id) selected[p.project_id == project] { (p.project_id) }
                    }
                    @if !projects.iter().any(|p| p.project_id == project) {
                        option value=(project) selected { (project) }
                    }
                }
            }
            input type="hidden" name="state" value=(current.unwrap_or(""));
            button type="submit" { "Show" }
        }
        nav.states {
            a href=(page::runs_url(&project, None)) class=(if current.is_none() { "current" } else { "" }) { "all" }
            @for (name, _) in page::TASK_STATES {
                a href=(page::runs_url(&project, Some(name))) class=(if current == Some(name) { "current" } else { "" }) { (name) }
            }
        }
        div #runs-live data-live {
        @if runs.runs.is_empty() {
            p.hint #no-runs { "No runs" @if let Some(s) = current { " in state " (s) } "." }
        } @else {
            table.runs {
                thead { tr { th { "State" } th { "Title" } th { "Run" } th { "Started" } th { "Duration" } th { "Links" } } }
                tbody {
                    @for r in &runs.runs {
                        @let url = page::run_url(&r.project_id, &r.run_id);
                        @let run_dir = if r.run_dir.is_empty() { format!(".cairn/runs/{}", r.run_id) } else { r.run_dir.clone() };
                        tr {
                            td data-label="State" { (page::badge(page::task_state_name(r.state))) }
                            td data-label="Title" { a href=(url) { (if r.title.is_empty() { r.run_id.as_str() } else { r.title.as_str() }) } }
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
        @if !runs.next_page_token.is_empty() {
            p {
                a href=(format!("{}&state={}&page_token={}", page::runs_url(&project, None), page::qv(current.unwrap_or("")), page::qv(&runs.next_page_token))) { "Older runs" }
            }
        }
    };
    Ok(layout("Runs", Some(&visitor), flash.as_ref(), body).into_response())
}
