//! `cairn-orchestrator`: the orchestrator service on its own.

use clap::Parser;

/// cairn's orchestrator: runs agent graphs as durable run directories with human gates.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Args {
    #[command(flatten)]
    config: cairn_orchestrator::ConfigArgs,
    #[command(flatten)]
    tls: cairn_server::TlsArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let _telemetry = cairn_telemetry::init("cairn-orchestrator");
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairn-orchestrator: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(mut args: Args) -> Result<(), cairn_orchestrator::Error> {
    args.config.tls = args.tls;
    let config = args.config.load()?;
    let listener = cairn_server::bind(&config.listen).await?;
    tracing::info!(addr = %config.listen, store = %config.store_addr, "cairn-orchestrator starting");
    cairn_orchestrator::serve(config, listener, cairn_server::shutdown_signal()).await
}
