//! `cairn project create|list`: projects in the artifact-store. Commands that write (store
//! put, sandbox run, ingest, run) create their project on first use; these are for explicit use.

use std::process::ExitCode;

use cairn_proto::v1::{CreateProjectRequest, ListProjectsRequest, PageRequest};
use serde_json::json;

use crate::cli::{Global, ProjectCommand};
use crate::embedded::{Needs, Services};
use crate::output;

pub async fn run(global: &Global, cmd: ProjectCommand) -> anyhow::Result<ExitCode> {
    let services = Services::open(global, Needs::default()).await?;
    let result = run_with(global, &services, cmd).await;
    services.close().await?;
    result
}

async fn run_with(
    global: &Global,
    services: &Services,
    cmd: ProjectCommand,
) -> anyhow::Result<ExitCode> {
    let mut store = services.store()?;
    match cmd {
        ProjectCommand::Create { name } => {
            let project_id = name.unwrap_or_else(|| global.project.clone());
            // CreateProject leaves an existing project as it is; look first to say which.
            let existed = list(&mut store)
                .await?
                .into_iter()
                .find(|p| p.project_id == project_id);
            let (outcome, created_at) = match existed {
                Some(p) => ("exists", p.created_at),
                None => {
                    let p = store
                        .create_project(CreateProjectRequest {
                            project_id: project_id.clone(),
                        })
                        .await?
                        .into_inner();
                    ("created", p.created_at)
                }
            };
            if global.json {
                output::json(
                    &json!({"project_id": project_id, "outcome": outcome, "created_at": created_at}),
                )?;
            } else if outcome == "created" {
                println!("created project {project_id}");
            } else {
                println!("project {project_id} already exists");
            }
        }
        ProjectCommand::List => {
            let all = list(&mut store).await?;
            if global.json {
                output::json(
                    &all.iter()
                        .map(|p| json!({"project_id": p.project_id, "created_at": p.created_at}))
                        .collect::<Vec<_>>(),
                )?;
            } else if all.is_empty() {
                println!("no projects yet (commands that write create theirs on first use)");
            } else {
                for p in &all {
                    println!("{}  {}", p.project_id, p.created_at);
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn list(
    store: &mut cairn_proto::v1::artifact_store_client::ArtifactStoreClient<
        crate::embedded::Authed,
    >,
) -> anyhow::Result<Vec<cairn_proto::v1::Project>> {
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let page = store
            .list_projects(ListProjectsRequest {
                page: Some(PageRequest {
                    page_size: 1000,
                    page_token: token,
                }),
            })
            .await?
            .into_inner();
        all.extend(page.projects);
        if page.next_page_token.is_empty() {
            return Ok(all);
        }
        token = page.next_page_token;
    }
}
