//! Command-line flags of the runner (its own binary and `cairn serve sandbox-runner`).

use std::path::PathBuf;

use crate::config::Config;
use crate::error::Error;

/// Settings come from the TOML file (--config), then CAIRN_SANDBOX_RUNNER_<KEY> environment
/// variables (CAIRN_SANDBOX_RUNNER_DEFAULTS_TIMEOUT_MS for [defaults] timeout_ms), then flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// TOML config file.
    #[arg(long, env = "CAIRN_SANDBOX_RUNNER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on (host:port).
    #[arg(long)]
    pub listen: Option<String>,
    /// auto | docker | local | gvisor.
    #[arg(long)]
    pub backend: Option<String>,
    /// Sandbox image (docker backend).
    #[arg(long)]
    pub image: Option<String>,
    /// Runner id (container labels, start-up sweep).
    #[arg(long)]
    pub runner_id: Option<String>,
    /// Directory for task directories of sessions and local runs.
    #[arg(long)]
    pub work_root: Option<PathBuf>,
    /// Sandboxes kept ready for one-shot runs: warm containers (docker) or waiting
    /// sandboxes (local, gvisor); 0 = off.
    #[arg(long)]
    pub pool_size: Option<usize>,
    /// Any other key: --set defaults.timeout_ms=5000 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// TLS flags, parsed by the program that embeds these flags (`--tls-dir` etc. are global).
    #[arg(skip)]
    pub tls: cairn_server::TlsArgs,
}

impl ConfigArgs {
    /// File, then environment, then these flags; checked.
    pub fn load(&self) -> Result<Config, Error> {
        let mut config = Config::load(self.config.as_deref())?;
        let work_root = self
            .work_root
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned());
        let pool_size = self.pool_size.map(|n| n.to_string());
        let flags = [
            ("listen", self.listen.clone()),
            ("backend", self.backend.clone()),
            ("image", self.image.clone()),
            ("runner_id", self.runner_id.clone()),
            ("work_root", work_root),
            ("pool_size", pool_size),
        ];
        for (key, value) in flags {
            if let Some(v) = value {
                config.set(key, &v)?;
            }
        }
        for kv in &self.set {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| Error::Config(format!("--set {kv:?}: expected KEY=VALUE")))?;
            config.set(k.trim(), v.trim())?;
        }
        config.tls = config.tls.overridden_by(&self.tls.config());
        config.insecure_listen |= self.tls.insecure_listen;
        config.check()?;
        Ok(config)
    }
}
