//! `cairn-orchestrator`: the orchestrator service on its own.

use std::path::PathBuf;

use clap::Parser;

/// cairn's orchestrator: runs agent graphs as durable run directories with human gates.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Args {
    /// TOML configuration file (keys: see docs/graphs.md "Orchestrator configuration").
    #[arg(long, env = "CAIRN_ORCHESTRATOR_CONFIG")]
    config: Option<PathBuf>,
    /// Listen address (host:port).
    #[arg(long)]
    listen: Option<String>,
    /// Artifact-store address.
    #[arg(long)]
    store_addr: Option<String>,
    /// Ingest service address (empty disables the ingest hook).
    #[arg(long)]
    ingest_addr: Option<String>,
    /// Sandbox runner address; repeat for several (used round-robin).
    #[arg(long = "sandbox-addr")]
    sandbox_addrs: Vec<String>,
    /// Any other key: KEY=VALUE (e.g. --set max_parallel_runs=4 --set retry.max_attempts=5).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
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

async fn run(args: Args) -> Result<(), cairn_orchestrator::Error> {
    let mut config = cairn_orchestrator::Config::load(args.config.as_deref())?;
    let mut sets: Vec<(String, String)> = Vec::new();
    if let Some(v) = args.listen {
        sets.push(("listen".into(), v));
    }
    if let Some(v) = args.store_addr {
        sets.push(("store_addr".into(), v));
    }
    if let Some(v) = args.ingest_addr {
        sets.push(("ingest_addr".into(), v));
    }
    if !args.sandbox_addrs.is_empty() {
        sets.push(("sandbox_addrs".into(), args.sandbox_addrs.join(",")));
    }
    for kv in args.set {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| cairn_orchestrator::Error::Config(format!("--set {kv}: expected KEY=VALUE")))?;
        sets.push((k.trim().to_owned(), v.to_owned()));
    }
    for (k, v) in sets {
        config.set(&k, &v)?;
    }
    let listener = cairn_server::bind(&config.listen).await?;
    tracing::info!(addr = %config.listen, store = %config.store_addr, "cairn-orchestrator starting");
    cairn_orchestrator::serve(config, listener, cairn_server::shutdown_signal()).await
}
