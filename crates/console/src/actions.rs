//! Human actions from the run page: approve / reject a gate, add a note, edit
//! the context manifest, cancel (after a confirmation), resume, re-run, request rework. Each is the orchestrator call the CLI makes,
//! with `by` = the visitor's name and the visitor's personal token relayed (when people log in
//! with their own); the orchestrator records it as an event with `by` and `ts`. An action the
//! visitor's role does not allow is refused here first (the orchestrator would refuse it too).
//! Success redirects to the run page with a message; a refusal shows the run page again with
//! the orchestrator's message and what was typed, under the refusal's status code.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use cairn_proto::v1::{
    AddNoteRequest, EditContextRequest, GateDecisionRequest, GetRunRequest, NodeState,
    ReworkRequest, RunActionRequest, SubmitRunRequest,
};
use maud::html;
use serde::Deserialize;

use super::page;
use super::run::{self, Drafts};
use super::session::{Flash, Visitor};
use super::{Console, ConsoleError};
use cairn_server::roles::Rpc;

/// Where the run page is after an action (the section the action belongs to).
fn back(project: &str, run: &str, section: &str) -> Response {
    Redirect::to(&format!("{}#{section}", page::run_url(project, run))).into_response()
}

/// The run page again, showing why `err` refused the action, with the typed text kept.
async fn refused(
    console: &Console,
    visitor: &Visitor,
    project: &str,
    run: &str,
    err: ConsoleError,
    drafts: Drafts,
) -> Response {
    tracing::info!(by = %visitor.name, run, error = %err, "console action refused");
    let status = err.status();
    let flash = Flash {
        text: err.to_string(),
        error: true,
    };
    match run::render(
        console,
        visitor,
        project,
        run,
        Some(flash),
        drafts,
        run::View::default(),
    )
    .await
    {
        Ok(html) => (status, html).into_response(),
        // The run page itself cannot be shown: the refusal alone.
        Err(_) => err.into_response(),
    }
}

/// Refuses an action the visitor's role does not allow.
pub(super) fn permitted(visitor: &Visitor, rpc: Rpc) -> Result<(), ConsoleError> {
    if visitor.may(rpc) {
        return Ok(());
    }
    let role = visitor.role.map(|r| r.as_str()).unwrap_or("none");
    tracing::warn!(principal = %visitor.name, peer = %visitor.peer_text(), rpc = rpc.name(), reason = "role", "console action refused");
    Err(ConsoleError::Forbidden(format!(
        "`{}` has role {role}; {} needs role {} or above",
        visitor.name,
        rpc.name(),
        rpc.required_role()
    )))
}

fn done(console: &Console, visitor: &Visitor, text: String) {
    tracing::info!(by = %visitor.name, "{text}");
    console
        .sessions()
        .set_flash(&visitor.session_id, text, false);
}

#[derive(Deserialize)]
pub(super) struct GateForm {
    #[serde(default)]
    note: String,
}

pub(super) async fn approve(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run, gate)): Path<(String, String, String)>,
    Form(form): Form<GateForm>,
) -> Response {
    decide(console, visitor, project, run, gate, form.note, true).await
}

pub(super) async fn reject(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run, gate)): Path<(String, String, String)>,
    Form(form): Form<GateForm>,
) -> Response {
    decide(console, visitor, project, run, gate, form.note, false).await
}

async fn decide(
    console: Console,
    visitor: Visitor,
    project: String,
    run: String,
    gate: String,
    note: String,
    approve: bool,
) -> Response {
    let rpc = if approve {
        Rpc::ApproveGate
    } else {
        Rpc::RejectGate
    };
    if let Err(e) = permitted(&visitor, rpc) {
        return e.into_response();
    }
    let req = GateDecisionRequest {
        project_id: project.clone(),
        run_id: run.clone(),
        gate_id: gate.clone(),
        by: visitor.name.clone(),
        note: note.trim().to_owned(),
    };
    let result = if approve {
        console
            .call(
                &format!("approving gate {gate}"),
                console.orchestrator(&visitor).approve_gate(req),
            )
            .await
    } else {
        console
            .call(
                &format!("rejecting gate {gate}"),
                console.orchestrator(&visitor).reject_gate(req),
            )
            .await
    };
    match result {
        Ok(_) => {
            // The answer is the run as of the decision; what follows (the run going on, or
            // failing) happens after it, so the message says what the decision does.
            let text = if approve {
                format!("Approved gate {gate} of run {run}: the run goes on.")
            } else {
                format!("Rejected gate {gate} of run {run}: its node fails, and the run stops unless a rework or a resume follows.")
            };
            done(&console, &visitor, text);
            back(&project, &run, "gates")
        }
        Err(e) => {
            refused(
                &console,
                &visitor,
                &project,
                &run,
                e,
                Drafts {
                    gate_note: Some((gate, note)),
                    ..Default::default()
                },
            )
            .await
        }
    }
}

#[derive(Deserialize)]
pub(super) struct NoteForm {
    #[serde(default)]
    text: String,
}

pub(super) async fn note(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run)): Path<(String, String)>,
    Form(form): Form<NoteForm>,
) -> Response {
    if let Err(e) = permitted(&visitor, Rpc::AddNote) {
        return e.into_response();
    }
    let drafts = || Drafts {
        note: Some(form.text.clone()),
        ..Default::default()
    };
    if form.text.trim().is_empty() {
        let e =
            ConsoleError::BadRequest("the note is empty; write what the agents should know".into());
        return refused(&console, &visitor, &project, &run, e, drafts()).await;
    }
    // Browsers send textarea line breaks as CRLF; human-notes.md is a Unix text file.
    let text = form.text.replace("\r\n", "\n");
    let req = AddNoteRequest {
        project_id: project.clone(),
        run_id: run.clone(),
        by: visitor.name.clone(),
        text,
    };
    match console
        .call(
            "adding the note",
            console.orchestrator(&visitor).add_note(req),
        )
        .await
    {
        Ok(r) => {
            done(
                &console,
                &visitor,
                format!("Note added to run {run} ({}).", r.r#ref),
            );
            back(&project, &run, "notes")
        }
        Err(e) => refused(&console, &visitor, &project, &run, e, drafts()).await,
    }
}

#[derive(Deserialize)]
pub(super) struct ContextForm {
    #[serde(default)]
    manifest_yaml: String,
}

pub(super) async fn context(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run)): Path<(String, String)>,
    Form(form): Form<ContextForm>,
) -> Response {
    if let Err(e) = permitted(&visitor, Rpc::EditContext) {
        return e.into_response();
    }
    let yaml = form.manifest_yaml.replace("\r\n", "\n");
    let req = EditContextRequest {
        project_id: project.clone(),
        run_id: run.clone(),
        by: visitor.name.clone(),
        manifest_yaml: yaml.clone(),
    };
    match console
        .call(
            "saving the context manifest",
            console.orchestrator(&visitor).edit_context(req),
        )
        .await
    {
        Ok(r) => {
            done(
                &console,
                &visitor,
                format!("Context manifest of run {run} saved (event {}).", r.seq),
            );
            back(&project, &run, "context")
        }
        Err(e) => {
            refused(
                &console,
                &visitor,
                &project,
                &run,
                e,
                Drafts {
                    context: Some(yaml),
                    ..Default::default()
                },
            )
            .await
        }
    }
}

#[derive(Deserialize)]
pub(super) struct CancelForm {
    #[serde(default)]
    reason: String,
    /// `yes` once the person confirmed on the confirmation page.
    #[serde(default)]
    confirm: String,
}

pub(super) async fn cancel(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run)): Path<(String, String)>,
    Form(form): Form<CancelForm>,
) -> Response {
    if let Err(e) = permitted(&visitor, Rpc::CancelRun) {
        return e.into_response();
    }
    if form.confirm != "yes" {
        return confirm_cancel(&console, &visitor, &project, &run, &form.reason).await;
    }
    let req = RunActionRequest {
        project_id: project.clone(),
        run_id: run.clone(),
        by: visitor.name.clone(),
        reason: form.reason.trim().to_owned(),
    };
    match console
        .call(
            "canceling the run",
            console.orchestrator(&visitor).cancel_run(req),
        )
        .await
    {
        Ok(info) => {
            done(
                &console,
                &visitor,
                format!("Run {run} is {}.", page::task_state_name(info.state)),
            );
            back(&project, &run, "control")
        }
        Err(e) => {
            refused(
                &console,
                &visitor,
                &project,
                &run,
                e,
                Drafts {
                    cancel_reason: Some(form.reason),
                    ..Default::default()
                },
            )
            .await
        }
    }
}

#[derive(Deserialize)]
pub(super) struct ReworkForm {
    #[serde(default)]
    node_id: String,
    #[serde(default)]
    note: String,
}

pub(super) async fn rework(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run)): Path<(String, String)>,
    Form(form): Form<ReworkForm>,
) -> Response {
    if let Err(e) = permitted(&visitor, Rpc::RequestRework) {
        return e.into_response();
    }
    let req = ReworkRequest {
        project_id: project.clone(),
        run_id: run.clone(),
        node_id: form.node_id.clone(),
        by: visitor.name.clone(),
        note: form.note.trim().to_owned(),
        from_snapshot: false,
    };
    match console
        .call(
            &format!("requesting rework of {}", form.node_id),
            console.orchestrator(&visitor).request_rework(req),
        )
        .await
    {
        Ok(info) => {
            done(
                &console,
                &visitor,
                format!(
                    "Rework of {} requested; the run is {}.",
                    form.node_id,
                    page::task_state_name(info.state)
                ),
            );
            back(&project, &run, "milestones")
        }
        Err(e) => {
            refused(
                &console,
                &visitor,
                &project,
                &run,
                e,
                Drafts {
                    rework_note: Some(form.note),
                    ..Default::default()
                },
            )
            .await
        }
    }
}

/// The page that asks whether to cancel: what the run is doing, what stops, and the two
/// answers. Nothing is canceled until its "Yes" is sent.
async fn confirm_cancel(
    console: &Console,
    visitor: &Visitor,
    project: &str,
    run: &str,
    reason: &str,
) -> Response {
    let info = match console
        .call(
            &format!("reading run {run}"),
            console.orchestrator(visitor).get_run(GetRunRequest {
                project_id: project.to_owned(),
                run_id: run.to_owned(),
            }),
        )
        .await
    {
        Ok(i) => i,
        Err(e) => return e.into_response(),
    };
    let run_url = page::run_url(project, run);
    let running: Vec<&str> = info
        .nodes
        .iter()
        .filter(|n| n.state == NodeState::Running as i32)
        .map(|n| n.id.as_str())
        .collect();
    let title = if info.title.is_empty() {
        run.to_owned()
    } else {
        info.title.clone()
    };
    let body = html! {
        h1 { "Cancel run " (title) "?" }
        @if page::is_final(info.state) {
            p #cancel-final { "The run is already " (page::task_state_name(info.state)) "; there is nothing to cancel." }
            p { a href=(run_url) { "Back to the run" } }
        } @else {
            p #cancel-what {
                "The run is " strong { (page::task_state_name(info.state)) } ". "
                @if running.is_empty() { "No node is running now. " }
                @else { "Running now: " (running.join(", ")) "; their sandbox work is stopped. " }
                "A canceled run ends for good: it cannot be resumed (a re-run starts a new one)."
            }
            form.card #cancel-confirm method="post" action=(format!("{run_url}/cancel")) {
                input type="hidden" name="csrf" value=(visitor.csrf);
                input type="hidden" name="confirm" value="yes";
                label { "Reason (recorded with the cancel)" input type="text" name="reason" value=(reason); }
                div.buttons {
                    button.danger type="submit" { "Yes, cancel the run" }
                    a.button href=(run_url) { "No, keep it running" }
                }
            }
        }
    };
    page::layout("Cancel the run?", Some(visitor), None, body).into_response()
}

pub(super) async fn resume(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run)): Path<(String, String)>,
) -> Response {
    if let Err(e) = permitted(&visitor, Rpc::ResumeRun) {
        return e.into_response();
    }
    let req = RunActionRequest {
        project_id: project.clone(),
        run_id: run.clone(),
        by: visitor.name.clone(),
        reason: "resumed from the console".into(),
    };
    match console
        .call(
            "resuming the run",
            console.orchestrator(&visitor).resume_run(req),
        )
        .await
    {
        Ok(info) => {
            done(
                &console,
                &visitor,
                format!(
                    "Run {run} resumed; it is {}.",
                    page::task_state_name(info.state)
                ),
            );
            back(&project, &run, "control")
        }
        Err(e) => refused(&console, &visitor, &project, &run, e, Drafts::default()).await,
    }
}

#[derive(Deserialize)]
pub(super) struct RerunForm {
    /// Made when the run page was shown: the same form sent twice starts one run.
    #[serde(default)]
    request_id: String,
}

pub(super) async fn rerun(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run)): Path<(String, String)>,
    Form(form): Form<RerunForm>,
) -> Response {
    if let Err(e) = permitted(&visitor, Rpc::SubmitRun) {
        return e.into_response();
    }
    let mut req = SubmitRunRequest {
        project_id: project.clone(),
        rerun_of: run.clone(),
        by: visitor.name.clone(),
        ..Default::default()
    };
    super::start::identify(&mut req, &form.request_id);
    match super::start::submit_run(&console, &visitor, req, &format!("re-running {run}")).await {
        Ok(info) => {
            done(
                &console,
                &visitor,
                format!("Run {} started as a re-run of {run}.", info.run_id),
            );
            Redirect::to(&page::run_url(&info.project_id, &info.run_id)).into_response()
        }
        Err(e) => refused(&console, &visitor, &project, &run, e, Drafts::default()).await,
    }
}
