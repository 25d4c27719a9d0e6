//! `cairn tokens add|list|remove`: the tokens file of the orchestrator and the console. The
//! token is printed once, on stdout alone (so it can be captured); only its hash is stored.

use std::process::ExitCode;

use cairn_orchestrator::auth::tokens::TokensFile;
use cairn_orchestrator::auth::Role;
use serde_json::json;

use crate::cli::{Global, TokensCommand};
use crate::output;

pub fn run(global: &Global, cmd: TokensCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TokensCommand::Add {
            name,
            role,
            projects,
            file,
        } => {
            let role: Role = role.parse().map_err(anyhow::Error::msg)?;
            let mut tokens = TokensFile::read_or_empty(&file.path)?;
            let token = tokens.add(&name, role, &projects)?;
            tokens.write(&file.path)?;
            if global.json {
                output::json(
                    &json!({"name": name, "role": role, "projects": projects, "token": token}),
                )?;
            } else {
                println!("{token}");
            }
            eprintln!(
                "added `{name}` ({role}) to {}; the token above is shown once and not stored: give it to {name} (cairn --token / CAIRN_TOKEN, or the console's login)",
                file.path.display()
            );
        }
        TokensCommand::List { file } => {
            let tokens = TokensFile::read(&file.path)?;
            if global.json {
                let list: Vec<_> = tokens
                    .tokens
                    .iter()
                    .map(|t| json!({"name": t.name, "role": t.role, "projects": t.projects}))
                    .collect();
                output::json(&list)?;
            } else {
                for t in &tokens.tokens {
                    let projects = if t.projects.is_empty() {
                        "(every project)".to_owned()
                    } else {
                        t.projects.join(",")
                    };
                    println!("{:<24} {:<9} {projects}", t.name, t.role.as_str());
                }
            }
        }
        TokensCommand::Remove { name, file } => {
            let mut tokens = TokensFile::read(&file.path)?;
            tokens.remove(&name)?;
            tokens.write(&file.path)?;
            eprintln!(
                "removed `{name}` from {}; a running orchestrator refuses the token within a second",
                file.path.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
