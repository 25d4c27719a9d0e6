//! `cairn-artifact-store`: runs the artifact-store alone.

use clap::Parser;

/// cairn's artifact-store: the single canonical writer of project files, run records and
/// manifests, served over gRPC (health and reflection included).
///
/// Configuration: defaults, then --config FILE (TOML), then CAIRN_ARTIFACT_STORE_* environment
/// variables (the older CAIRN_STORE_* also works), then these flags.
#[derive(Debug, Parser)]
#[command(name = "cairn-artifact-store", version)]
struct Cli {
    #[command(flatten)]
    config: cairn_artifact_store::ConfigArgs,
    #[command(flatten)]
    tls: cairn_server::TlsArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let _telemetry = cairn_telemetry::init("cairn-artifact-store");
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairn-artifact-store: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(mut cli: Cli) -> cairn_artifact_store::Result<()> {
    cli.config.tls = cli.tls;
    let config = cli.config.load()?;
    let listener = cairn_server::bind(&config.listen.to_string())
        .await
        .map_err(|e| cairn_artifact_store::Error::Server(e.to_string()))?;
    cairn_artifact_store::serve(config, listener, cairn_server::shutdown_signal()).await
}
