//! `cairn serve <service>`: one service standalone, configured like its own binary.

use std::process::ExitCode;

use crate::cli::{ServeArgs, ServeService};

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    match args.service {
        ServeService::ArtifactStore(config) => {
            let config = config.load()?;
            let listener = cairn_server::bind(&config.listen.to_string()).await?;
            cairn_artifact_store::serve(config, listener, cairn_server::shutdown_signal()).await?;
        }
        ServeService::Ingest(config) => {
            let config = config.load()?;
            let listener = cairn_server::bind(&config.listen.to_string()).await?;
            cairn_ingest::serve(config, listener, cairn_server::shutdown_signal()).await?;
        }
        ServeService::SandboxRunner(config) => {
            let config = config.load()?;
            let listener = cairn_server::bind(&config.listen).await?;
            cairn_sandbox_runner::serve(config, listener, cairn_server::shutdown_signal()).await?;
        }
        ServeService::Orchestrator(config) => {
            let config = config.load()?;
            let listener = cairn_server::bind(&config.listen).await?;
            cairn_orchestrator::serve(config, listener, cairn_server::shutdown_signal()).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
