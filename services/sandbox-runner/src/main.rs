//! `cairn-sandbox-runner`: the sandbox-runner as its own process.

use clap::Parser;

/// Runs model-written code in Docker containers or bubblewrap sandboxes, over gRPC.
#[derive(Parser, Debug)]
#[command(name = "cairn-sandbox-runner", version)]
struct Args {
    #[command(flatten)]
    config: cairn_sandbox_runner::ConfigArgs,
    #[command(flatten)]
    tls: cairn_server::TlsArgs,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = Args::parse();
    args.config.tls = args.tls.clone();
    let _telemetry = cairn_telemetry::init("cairn-sandbox-runner");
    let config = args.config.load()?;
    let listener = cairn_server::bind(&config.listen).await?;
    cairn_sandbox_runner::serve(config, listener, cairn_server::shutdown_signal()).await?;
    Ok(())
}
