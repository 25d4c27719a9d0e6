//! `cairn-ingest`: runs the ingest service alone.

use clap::Parser;

/// cairn's ingest service: turns strict code fences (```lang file=path) in agent documents into
/// workspace files, written through the artifact-store, with manifest v1 and ingest.* events.
///
/// Configuration: defaults, then --config FILE (TOML), then CAIRN_INGEST_* environment
/// variables, then these flags.
#[derive(Debug, Parser)]
#[command(name = "cairn-ingest", version)]
struct Cli {
    #[command(flatten)]
    config: cairn_ingest::ConfigArgs,
    #[command(flatten)]
    tls: cairn_server::TlsArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let _telemetry = cairn_telemetry::init("cairn-ingest");
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairn-ingest: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(mut cli: Cli) -> cairn_ingest::Result<()> {
    cli.config.tls = cli.tls;
    let config = cli.config.load()?;
    let listener = cairn_server::bind(&config.listen.to_string())
        .await
        .map_err(|e| cairn_ingest::Error::Server(e.to_string()))?;
    cairn_ingest::serve(config, listener, cairn_server::shutdown_signal()).await
}
