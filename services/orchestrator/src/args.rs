//! Command-line flags of the orchestrator (its own binary and `cairn serve orchestrator`).

use std::path::PathBuf;

use crate::config::Config;
use crate::error::Error;

/// Settings come from the TOML file (--config), then the environment, then these flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// TOML configuration file (keys: see docs/graphs.md "Orchestrator configuration").
    #[arg(long, env = "CAIRN_ORCHESTRATOR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Listen address (host:port).
    #[arg(long)]
    pub listen: Option<String>,
    /// Artifact-store address.
    #[arg(long)]
    pub store_addr: Option<String>,
    /// Ingest service address (empty disables the ingest hook).
    #[arg(long)]
    pub ingest_addr: Option<String>,
    /// Sandbox runner address; repeat for several (used round-robin).
    #[arg(long = "sandbox-addr")]
    pub sandbox_addrs: Vec<String>,
    /// Any other key: KEY=VALUE (e.g. --set max_parallel_runs=4 --set retry.max_attempts=5).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// TLS flags, parsed by the program that embeds these flags (`--tls-dir` etc. are global).
    #[arg(skip)]
    pub tls: cairn_server::TlsArgs,
}

impl ConfigArgs {
    /// File, then environment, then these flags.
    pub fn load(&self) -> Result<Config, Error> {
        let mut config = Config::load(self.config.as_deref())?;
        let mut sets: Vec<(String, String)> = Vec::new();
        if let Some(v) = &self.listen {
            sets.push(("listen".into(), v.clone()));
        }
        if let Some(v) = &self.store_addr {
            sets.push(("store_addr".into(), v.clone()));
        }
        if let Some(v) = &self.ingest_addr {
            sets.push(("ingest_addr".into(), v.clone()));
        }
        if !self.sandbox_addrs.is_empty() {
            sets.push(("sandbox_addrs".into(), self.sandbox_addrs.join(",")));
        }
        for kv in &self.set {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| Error::Config(format!("--set {kv}: expected KEY=VALUE")))?;
            sets.push((k.trim().to_owned(), v.to_owned()));
        }
        for (k, v) in sets {
            config.set(&k, &v)?;
        }
        config.tls = config.tls.overridden_by(&self.tls.config());
        config.insecure_listen |= self.tls.insecure_listen;
        Ok(config)
    }
}
