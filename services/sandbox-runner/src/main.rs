//! `cairn-sandbox-runner`: the sandbox-runner as its own process.

use std::path::PathBuf;

use clap::Parser;

/// Runs model-written code in Docker containers or bubblewrap sandboxes, over gRPC.
///
/// Settings come from the TOML file (--config), then CAIRN_SANDBOX_RUNNER_<KEY> environment
/// variables (CAIRN_SANDBOX_RUNNER_DEFAULTS_TIMEOUT_MS for [defaults] timeout_ms), then flags.
#[derive(Parser, Debug)]
#[command(name = "cairn-sandbox-runner", version)]
struct Args {
    /// TOML config file.
    #[arg(long, env = "CAIRN_SANDBOX_RUNNER_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on (host:port).
    #[arg(long)]
    listen: Option<String>,
    /// auto | docker | local.
    #[arg(long)]
    backend: Option<String>,
    /// Sandbox image (docker backend).
    #[arg(long)]
    image: Option<String>,
    /// Runner id (container labels, start-up sweep).
    #[arg(long)]
    runner_id: Option<String>,
    /// Directory for task directories of sessions and local runs.
    #[arg(long)]
    work_root: Option<PathBuf>,
    /// Warm containers kept ready (docker backend).
    #[arg(long)]
    pool_size: Option<usize>,
    /// Any other key: --set defaults.timeout_ms=5000 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let _telemetry = cairn_telemetry::init("cairn-sandbox-runner");
    let mut config = cairn_sandbox_runner::Config::load(args.config.as_deref())?;
    let work_root = args.work_root.map(|p| p.to_string_lossy().into_owned());
    let pool_size = args.pool_size.map(|n| n.to_string());
    let flags = [
        ("listen", args.listen),
        ("backend", args.backend),
        ("image", args.image),
        ("runner_id", args.runner_id),
        ("work_root", work_root),
        ("pool_size", pool_size),
    ];
    for (key, value) in flags {
        if let Some(v) = value {
            config.set(key, &v)?;
        }
    }
    for kv in &args.set {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("--set {kv:?}: expected KEY=VALUE"))?;
        config.set(k.trim(), v.trim())?;
    }
    config.check()?;
    let listener = cairn_server::bind(&config.listen).await?;
    cairn_sandbox_runner::serve(config, listener, cairn_server::shutdown_signal()).await?;
    Ok(())
}
