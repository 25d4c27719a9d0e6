//! `cairn serve <service>`: one service standalone, configured like its own binary.

use std::process::ExitCode;

use crate::cli::{Global, ServeArgs, ServeService};

pub async fn run(global: &Global, args: ServeArgs) -> anyhow::Result<ExitCode> {
    // The TLS flags are global: `cairn serve <svc> --tls-dir DIR` and `cairn --tls-dir DIR serve`.
    let tls = global.tls.clone();
    match args.service {
        ServeService::ArtifactStore(mut config) => {
            config.tls = tls;
            let config = config.load()?;
            let listen = config.listen.to_string();
            cairn_server::check_listen_text(&listen, config.tls.is_set(), config.insecure_listen)?;
            let listener = cairn_server::bind(&listen).await?;
            cairn_artifact_store::serve(config, listener, cairn_server::shutdown_signal()).await?;
        }
        ServeService::Ingest(mut config) => {
            config.tls = tls;
            let config = config.load()?;
            let listen = config.listen.to_string();
            cairn_server::check_listen_text(&listen, config.tls.is_set(), config.insecure_listen)?;
            let listener = cairn_server::bind(&listen).await?;
            cairn_ingest::serve(config, listener, cairn_server::shutdown_signal()).await?;
        }
        ServeService::SandboxRunner(mut config) => {
            config.tls = tls;
            let config = config.load()?;
            cairn_server::check_listen_text(
                &config.listen,
                config.tls.is_set(),
                config.insecure_listen,
            )?;
            let listener = cairn_server::bind(&config.listen).await?;
            cairn_sandbox_runner::serve(config, listener, cairn_server::shutdown_signal()).await?;
        }
        ServeService::Orchestrator(mut config) => {
            config.tls = tls;
            let config = config.load()?;
            cairn_server::check_listen_text(
                &config.listen,
                config.tls.is_set(),
                config.insecure_listen,
            )?;
            let listener = cairn_server::bind(&config.listen).await?;
            cairn_orchestrator::serve(config, listener, cairn_server::shutdown_signal()).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
