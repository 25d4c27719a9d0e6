//! Starting a run from the console: a graph file of the project (read through the store) or a
//! built-in mode with its prompt, variables, a title and an LLM provider. The form carries a
//! request id made when it was shown, so sending it twice (a double click, a reload) starts one
//! run (SubmitRunRequest.request_id). Success opens the new run's page; a refusal shows the
//! form again with what was typed and the orchestrator's message.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use cairn_proto::v1::{EntryKind, SubmitRunRequest};
use maud::html;
use serde::Deserialize;

use super::actions::permitted;
use super::files;
use super::page::{self, layout};
use super::session::{Flash, Visitor};
use super::{Console, ConsoleError};
use cairn_server::roles::Rpc;

/// Largest graph file sent (the orchestrator reads graphs of this size comfortably).
const MAX_GRAPH_BYTES: u64 = 1 << 20;
/// Directories looked through first for graph files to suggest, in this order.
const GRAPH_DIRS: [&str; 2] = ["graphs", "examples"];
/// Other top-level directories looked through (hidden ones and `.cairn/` never are).
const MORE_DIRS: usize = 8;
/// Files listed per directory looked through.
const LISTED_PER_DIR: u32 = 500;
/// YAML files read to see whether they are graphs.
const READ_CANDIDATES: usize = 40;
/// Bytes of a candidate read to tell whether it is a graph.
const CANDIDATE_BYTES: u64 = 64 << 10;
/// The built-in modes (graphs the orchestrator carries; `prompt` is their goal).
const MODES: [(&str, &str); 3] = [
    ("single", "single: one agent writes the document"),
    (
        "self_critique",
        "self_critique: an author, reviews, a revision",
    ),
    ("team", "team: a planner splits the work among agents"),
];

/// The form as typed.
#[derive(Clone, Default, Deserialize)]
pub(super) struct StartForm {
    #[serde(default)]
    pub project: String,
    /// `graph` (a file of the project) or `mode` (built-in).
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub graph_path: String,
    #[serde(default)]
    pub mode: String,
    #[serde(default)]
    pub prompt: String,
    /// `KEY=VALUE` per line.
    #[serde(default)]
    pub vars: String,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub llm: String,
    #[serde(default)]
    pub request_id: String,
}

#[derive(Deserialize)]
pub(super) struct StartQuery {
    #[serde(default)]
    project: String,
}

pub(super) async fn form(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Query(q): Query<StartQuery>,
) -> Result<Response, ConsoleError> {
    permitted(&visitor, Rpc::SubmitRun)?;
    let form = StartForm {
        project: q.project,
        source: "graph".into(),
        ..Default::default()
    };
    Ok(render(&console, &visitor, form, None).await.into_response())
}

pub(super) async fn submit(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Form(form): Form<StartForm>,
) -> Response {
    if let Err(e) = permitted(&visitor, Rpc::SubmitRun) {
        return e.into_response();
    }
    match start(&console, &visitor, &form).await {
        Ok((project, run)) => {
            let text = format!("Run {run} started.");
            tracing::info!(by = %visitor.name, project, run, "console started a run");
            console
                .sessions()
                .set_flash(&visitor.session_id, text, false);
            Redirect::to(&page::run_url(&project, &run)).into_response()
        }
        Err(e) => {
            tracing::info!(by = %visitor.name, error = %e, "console start refused");
            let status = e.status();
            let flash = Flash {
                text: e.to_string(),
                error: true,
            };
            (status, render(&console, &visitor, form, Some(flash)).await).into_response()
        }
    }
}

/// `KEY=VALUE` lines (blank lines skipped) as variables.
fn parse_vars(text: &str) -> Result<HashMap<String, String>, ConsoleError> {
    let mut vars = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(ConsoleError::BadRequest(format!(
                "variables, line {}: `{}` is not KEY=VALUE",
                i + 1,
                page::clip(line, 60)
            )));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(ConsoleError::BadRequest(format!(
                "variables, line {}: the name before `=` is empty",
                i + 1
            )));
        }
        vars.insert(k.to_owned(), v.to_owned());
    }
    Ok(vars)
}

/// A new form's request id: a time-ordered UUID, the kind of run id the orchestrator gives
/// runs started without one (`cairn run`), which the run started from the form then gets.
pub(super) fn new_request_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Sets how a submit names its run: a form's request id that is a UUID becomes the run id
/// (so a run started from the console has the same kind of id as one started by `cairn run`,
/// and sending the form twice finds the run the first one started); any other text is sent
/// as the request id, from which the orchestrator derives the run id.
pub(super) fn identify(req: &mut SubmitRunRequest, request_id: &str) {
    let id = request_id.trim();
    match uuid::Uuid::parse_str(id) {
        Ok(u) => req.run_id = u.hyphenated().to_string(),
        Err(_) => req.request_id = id.to_owned(),
    }
}

/// SubmitRun; a run id that already exists in the project is the run an earlier send of the
/// same form started (its id was made for that form), so that run is the answer.
pub(super) async fn submit_run(
    console: &Console,
    visitor: &Visitor,
    req: SubmitRunRequest,
    what: &str,
) -> Result<cairn_proto::v1::RunInfo, ConsoleError> {
    let (project, run_id) = (req.project_id.clone(), req.run_id.clone());
    match console
        .call(what, console.orchestrator(visitor).submit_run(req))
        .await
    {
        Err(ConsoleError::Rpc {
            code: tonic::Code::AlreadyExists,
            ..
        }) if !run_id.is_empty() => {
            console
                .call(
                    what,
                    console
                        .orchestrator(visitor)
                        .get_run(cairn_proto::v1::GetRunRequest {
                            project_id: project,
                            run_id,
                        }),
                )
                .await
        }
        other => other,
    }
}

/// Submits the run; its project and id.
async fn start(
    console: &Console,
    visitor: &Visitor,
    form: &StartForm,
) -> Result<(String, String), ConsoleError> {
    let project = form.project.trim().to_owned();
    if project.is_empty() {
        return Err(ConsoleError::BadRequest(
            "name the project the run belongs to (a new name creates it)".into(),
        ));
    }
    if !visitor.may_see(&project) {
        return Err(ConsoleError::Forbidden(format!(
            "`{}` may not act on project {project}",
            visitor.name
        )));
    }
    let vars = parse_vars(&form.vars)?;
    let mut req = SubmitRunRequest {
        project_id: project.clone(),
        vars,
        title: form.title.trim().to_owned(),
        by: visitor.name.clone(),
        llm: form.llm.trim().to_owned(),
        ..Default::default()
    };
    identify(&mut req, &form.request_id);
    match form.source.as_str() {
        "mode" => {
            if !MODES.iter().any(|(m, _)| *m == form.mode) {
                return Err(ConsoleError::BadRequest(format!(
                    "choose a built-in mode: {}",
                    MODES.map(|(m, _)| m).join(", ")
                )));
            }
            if form.prompt.trim().is_empty() {
                return Err(ConsoleError::BadRequest(
                    "a built-in mode needs a prompt: what the agents should do".into(),
                ));
            }
            req.mode = form.mode.clone();
            req.prompt = form.prompt.replace("\r\n", "\n");
        }
        "graph" => {
            let path = form.graph_path.trim();
            if path.is_empty() {
                return Err(ConsoleError::BadRequest(
                    "give the path of a graph file in the project (e.g. graphs/review.yaml)".into(),
                ));
            }
            let read = files::read(console, &project, path, MAX_GRAPH_BYTES)
                .await?
                .ok_or_else(|| {
                    ConsoleError::NotFound(format!("project {project} has no file {path}"))
                })?;
            if read.truncated {
                return Err(ConsoleError::BadRequest(format!(
                    "{path} is larger than {}; a graph is a small YAML file",
                    page::size(MAX_GRAPH_BYTES)
                )));
            }
            let Some(text) = read.text() else {
                return Err(ConsoleError::BadRequest(format!(
                    "{path} is not text; a graph is a YAML file"
                )));
            };
            req.graph_yaml = text.to_owned();
            // The files it names are found beside it in the project.
            req.graph_dir = path
                .trim_start_matches('/')
                .rsplit_once('/')
                .map(|(dir, _)| dir.to_owned())
                .unwrap_or_default();
        }
        other => {
            return Err(ConsoleError::BadRequest(format!(
                "unknown source `{other}`: a graph file of the project or a built-in mode"
            )))
        }
    }
    let info = submit_run(console, visitor, req, "starting the run").await?;
    Ok((info.project_id, info.run_id))
}

/// Projects the visitor sees, and the YAML files of `project` (outside run records) to
/// suggest as graphs. Either is empty when it cannot be listed: the form works without.
async fn suggestions(
    console: &Console,
    visitor: &Visitor,
    project: &str,
) -> (Vec<String>, Vec<String>) {
    let projects: Vec<String> = super::runs::visible_projects(console, visitor)
        .await
        .map(|ps| ps.into_iter().map(|p| p.project_id).collect())
        .unwrap_or_default();
    // File names are data of the project: listed only where the visitor may act.
    let graphs = if project.is_empty() || !visitor.may_see(project) {
        Vec::new()
    } else {
        graph_files(console, project).await
    };
    (projects, graphs)
}

fn is_yaml(path: &str) -> bool {
    path.ends_with(".yaml") || path.ends_with(".yml")
}

/// Whether `text` reads as a graph: a YAML mapping with a `nodes` list.
fn is_graph(text: &str) -> bool {
    serde_saphyr::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v.get("nodes").map(serde_json::Value::is_array))
        .unwrap_or(false)
}

/// Graph files of `project` to suggest, by a bounded search outside the run records: the
/// project root, `graphs/` and `examples/`, then a few other top-level directories (never
/// hidden ones such as `.cairn/`); YAML files that read as graphs (a `nodes` list), those of
/// `graphs/` and `examples/` first. Nothing when the store cannot list them.
async fn graph_files(console: &Console, project: &str) -> Vec<String> {
    let Ok((top, _)) = files::list(console, project, "", false, 1000, "").await else {
        return Vec::new();
    };
    let dir = EntryKind::Directory as i32;
    let name = |p: &str| {
        p.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    let mut dirs: Vec<String> = GRAPH_DIRS
        .iter()
        .filter(|d| top.iter().any(|e| e.kind == dir && name(&e.path) == **d))
        .map(|d| (*d).to_owned())
        .collect();
    dirs.extend(
        top.iter()
            .filter(|e| e.kind == dir)
            .map(|e| name(&e.path))
            .filter(|n| !n.starts_with('.') && !GRAPH_DIRS.contains(&n.as_str()))
            .take(MORE_DIRS),
    );
    let listed = futures::future::join_all(
        dirs.iter()
            .map(|d| files::list(console, project, d, true, LISTED_PER_DIR, "")),
    )
    .await;
    let mut candidates: Vec<String> = top
        .iter()
        .filter(|e| e.kind == EntryKind::File as i32 && is_yaml(&e.path))
        .map(|e| e.path.clone())
        .collect();
    // graphs/ and examples/ first: they come first in `dirs`.
    let mut ordered: Vec<String> = listed
        .into_iter()
        .flat_map(|l| l.map(|(entries, _)| entries).unwrap_or_default())
        .filter(|e| e.kind == EntryKind::File as i32 && is_yaml(&e.path))
        .map(|e| e.path)
        .filter(|p| !p.starts_with(".cairn/") && !p.split('/').any(|s| s.starts_with('.')))
        .collect();
    ordered.append(&mut candidates);
    ordered.truncate(READ_CANDIDATES);
    let reads = futures::future::join_all(
        ordered
            .iter()
            .map(|p| files::read(console, project, p, CANDIDATE_BYTES)),
    )
    .await;
    ordered
        .into_iter()
        .zip(reads)
        .filter(|(_, r)| match r {
            Ok(Some(r)) => !r.truncated && r.text().is_some_and(is_graph),
            _ => false,
        })
        .map(|(p, _)| p)
        .collect()
}

pub(super) async fn render(
    console: &Console,
    visitor: &Visitor,
    mut form: StartForm,
    flash: Option<Flash>,
) -> page::Html {
    if form.request_id.trim().is_empty() {
        form.request_id = new_request_id();
    }
    let project = form.project.trim().to_owned();
    let (projects, graphs) = suggestions(console, visitor, &project).await;
    let mode = form.source == "mode";
    let body = html! {
        h1 { "Start a run" }
        form.card #start-form method="post" action="/start" {
            input type="hidden" name="csrf" value=(visitor.csrf);
            input type="hidden" name="request_id" value=(form.request_id);
            label { "Project (a new name creates it)"
                input type="text" name="project" value=(project) list="project-names" required autocomplete="off";
            }
            datalist #project-names { @for p in &projects { option value=(p) {} } }
            fieldset {
                legend { "What to run" }
                label.choice {
                    input type="radio" name="source" value="graph" checked[!mode];
                    " a graph file of the project"
                }
                label { "Graph file (project path)"
                    input type="text" name="graph_path" value=(form.graph_path) list="graph-files" placeholder="graphs/review.yaml" autocomplete="off";
                }
                datalist #graph-files { @for g in &graphs { option value=(g) {} } }
                label.choice {
                    input type="radio" name="source" value="mode" checked[mode];
                    " a built-in mode"
                }
                label { "Mode"
                    select name="mode" {
                        @for (m, text) in MODES {
                            option value=(m) selected[form.mode == m] { (text) }
                        }
                    }
                }
                label { "Prompt (the goal of a built-in mode; {{vars.prompt}} of a graph)"
                    textarea name="prompt" rows="4" { (form.prompt) }
                }
            }
            label { "Variables ({{vars.KEY}}), one KEY=VALUE per line"
                textarea.code name="vars" rows="3" spellcheck="false" { (form.vars) }
            }
            label { "Title (empty: the graph's)"
                input type="text" name="title" value=(form.title);
            }
            label { "LLM provider (empty: the graph's, else the server's default; e.g. a provider name or replay:cassettes/x.yaml)"
                input type="text" name="llm" value=(form.llm) autocomplete="off";
            }
            p.hint { "Files a graph names (schemas, limits, prompts) are read from the project, relative to the graph file's directory." }
            button.approve type="submit" { "Start the run" }
        }
    };
    layout("Start a run", Some(visitor), flash.as_ref(), body)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn variables_are_key_value_lines() {
        let v = parse_vars("a=1\r\n\n b = two=2\n").unwrap();
        assert_eq!(v.get("a").map(String::as_str), Some("1"));
        assert_eq!(v.get("b").map(String::as_str), Some(" two=2"));
        assert_eq!(v.len(), 2);
        let e = parse_vars("ok=1\nno equals sign").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        assert!(parse_vars("=x").unwrap_err().to_string().contains("empty"));
    }

    #[test]
    fn only_yaml_with_a_node_list_is_a_graph() {
        assert!(is_graph("title: t\nnodes:\n  - id: a\n    type: agent\n"));
        assert!(!is_graph("services:\n  web: {}\n"));
        assert!(!is_graph("nodes: 3\n"));
        assert!(!is_graph(": : not yaml ["));
    }
}
