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
/// Files of the project looked through for graph files to suggest.
const LISTED_FILES: u32 = 1000;
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
        request_id: form.request_id.trim().to_owned(),
        ..Default::default()
    };
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
    let info = console
        .call(
            "starting the run",
            console.orchestrator(visitor).submit_run(req),
        )
        .await?;
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
        files::list(console, project, "", true, LISTED_FILES, "")
            .await
            .map(|(entries, _)| {
                entries
                    .into_iter()
                    .filter(|e| e.kind == EntryKind::File as i32)
                    .map(|e| e.path)
                    .filter(|p| {
                        (p.ends_with(".yaml") || p.ends_with(".yml")) && !p.starts_with(".cairn/")
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    (projects, graphs)
}

pub(super) async fn render(
    console: &Console,
    visitor: &Visitor,
    mut form: StartForm,
    flash: Option<Flash>,
) -> page::Html {
    if form.request_id.trim().is_empty() {
        form.request_id = uuid::Uuid::new_v4().to_string();
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
}
