//! Ingest's configuration: defaults, then a TOML file, then `CAIRN_INGEST_*` environment
//! variables, then command-line flags (each later source wins).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_server::config::{self, Env, UnknownVars};
use serde::{Deserialize, Serialize};

use crate::block::Limits;
use crate::error::{Error, Result};

/// Configuration of one ingest service.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the standalone server listens on.
    pub listen: SocketAddr,
    /// Mutual TLS (`[tls]`: dir, or cert/key/ca); without it only loopback may be served.
    pub tls: cairn_server::TlsConfig,
    /// Serve plaintext beyond loopback anyway (anyone who reaches the port is trusted).
    pub insecure_listen: bool,
    /// Address of the plain-HTTP `/metrics` page (Prometheus text); empty = not served.
    pub metrics_listen: String,
    /// `[telemetry]`: sampling of calls that carry no trace context.
    pub telemetry: cairn_server::TelemetryConfig,
    /// Replacements for entries of the built-in access table (identity -> methods).
    pub access: std::collections::BTreeMap<String, Vec<String>>,
    /// The artifact-store ingest writes through (`host:port` or `http://host:port`).
    pub store_addr: String,
    /// Longest wait for one store call (a Put of one block, an AppendEvents); a store that does
    /// not answer in time counts as unavailable (fail-open).
    pub store_timeout_ms: u64,
    /// Whether ingest is on for projects and runs that have no flag of their own.
    pub default_enabled: bool,
    /// A block whose content is larger is rejected (`too_large`).
    pub max_block_bytes: u64,
    /// Recorded blocks from this index on are rejected (`too_many_blocks`).
    pub max_blocks: u32,
    /// A larger document is not parsed (one `too_large` entry stands for it).
    pub max_document_bytes: u64,
    /// Names refused as any path component, in addition to `pathguard::DEFAULT_DENYLIST`.
    pub denylist: Vec<String>,
    /// Blocks written to the store at the same time (1 = one after the other).
    pub write_concurrency: usize,
    /// How long store calls that find the store unreachable are retried (with backoff),
    /// counted from the start of the outage; 0 = not retried.
    pub dependency_outage_s: u64,
    /// On shutdown, how long calls get to finish before they end with UNAVAILABLE.
    pub drain_deadline_s: u64,
}

impl Default for Config {
    fn default() -> Self {
        let limits = Limits::default();
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 7071)),
            tls: cairn_server::TlsConfig::default(),
            insecure_listen: false,
            metrics_listen: String::new(),
            telemetry: cairn_server::TelemetryConfig::default(),
            access: Default::default(),
            store_addr: "http://127.0.0.1:7070".to_owned(),
            store_timeout_ms: 10_000,
            default_enabled: true,
            max_block_bytes: limits.max_block_bytes,
            max_blocks: limits.max_blocks,
            max_document_bytes: limits.max_document_bytes,
            denylist: Vec::new(),
            write_concurrency: 8,
            dependency_outage_s: cairn_server::retry::DEFAULT_OUTAGE.as_secs(),
            drain_deadline_s: cairn_server::drain::DEFAULT_DEADLINE.as_secs(),
        }
    }
}

/// `CAIRN_INGEST_<KEY>` overrides (lists comma-separated); other `CAIRN_INGEST_*` variables (the
/// CLI's `CAIRN_INGEST_ADDR`) are not ours and are skipped.
pub const ENV: Env = Env {
    prefix: "CAIRN_INGEST_",
    unknown: UnknownVars::Ignore,
    aliases: &[],
};

impl Config {
    /// Defaults, then the TOML `file` (if given), then `CAIRN_INGEST_*` variables.
    pub fn load(file: Option<&Path>) -> Result<Config> {
        let config: Config = ENV.load(file).map_err(config_error)?;
        config.check()?;
        Ok(config)
    }

    /// Applies `CAIRN_INGEST_*` overrides read through `var`.
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) -> Result<()> {
        ENV.apply_lookup(self, var).map_err(config_error)
    }

    /// Refuses values ingest cannot work with.
    pub fn check(&self) -> Result<()> {
        self.telemetry.check().map_err(Error::Config)?;
        if self.store_addr.trim().is_empty() {
            return Err(Error::Config("store_addr is empty: give the artifact-store's address, e.g. http://127.0.0.1:7070".into()));
        }
        if self.store_timeout_ms == 0 {
            return Err(Error::Config("store_timeout_ms must be at least 1".into()));
        }
        if self.write_concurrency == 0 || self.write_concurrency > 256 {
            return Err(Error::Config(format!(
                "write_concurrency = {} is out of range: use 1..=256",
                self.write_concurrency
            )));
        }
        Ok(())
    }

    /// The size limits.
    pub fn limits(&self) -> Limits {
        Limits {
            max_block_bytes: self.max_block_bytes,
            max_blocks: self.max_blocks,
            max_document_bytes: self.max_document_bytes,
        }
    }

    /// The path policy: pathguard's default denylist plus `denylist`; no prefixes (ingest only
    /// writes beneath `workspace/`, and narrows every Put to it).
    pub fn policy(&self) -> pathguard::Policy {
        let mut denylist: Vec<String> = pathguard::DEFAULT_DENYLIST
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        denylist.extend(self.denylist.iter().cloned());
        pathguard::Policy::new(denylist, Vec::new())
    }

    pub fn store_timeout(&self) -> Duration {
        Duration::from_millis(self.store_timeout_ms)
    }

    pub fn dependency_outage(&self) -> Duration {
        Duration::from_secs(self.dependency_outage_s)
    }

    pub fn drain_deadline(&self) -> Duration {
        Duration::from_secs(self.drain_deadline_s)
    }
}

fn config_error(e: config::ConfigError) -> Error {
    Error::Config(e.to_string())
}

/// Command-line flags of the ingest service (also flattened into `cairn serve ingest`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// TOML configuration file (keys: listen, store_addr, store_timeout_ms, default_enabled,
    /// max_block_bytes, max_blocks, max_document_bytes, denylist, write_concurrency,
    /// dependency_outage_s, drain_deadline_s).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:7071 (env CAIRN_INGEST_LISTEN).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// The artifact-store to write through, e.g. http://127.0.0.1:7070 (env CAIRN_INGEST_STORE_ADDR).
    #[arg(long, value_name = "ADDR")]
    pub store_addr: Option<String>,
    /// Longest wait for one store call, in milliseconds (env CAIRN_INGEST_STORE_TIMEOUT_MS).
    #[arg(long, value_name = "MS")]
    pub store_timeout_ms: Option<u64>,
    /// Ingest on (true) or off (false) where no project or run flag says otherwise.
    #[arg(long, value_name = "BOOL")]
    pub default_enabled: Option<bool>,
    /// Largest block, in bytes (default 1 MiB).
    #[arg(long, value_name = "BYTES")]
    pub max_block_bytes: Option<u64>,
    /// Most blocks per document (default 1000).
    #[arg(long, value_name = "N")]
    pub max_blocks: Option<u32>,
    /// Largest document, in bytes (default 16 MiB).
    #[arg(long, value_name = "BYTES")]
    pub max_document_bytes: Option<u64>,
    /// Extra denylisted name (repeatable; adds to the built-in list and the config's).
    #[arg(long = "deny", value_name = "NAME")]
    pub deny: Vec<String>,
    /// TLS flags, parsed by the program that embeds these flags (`--tls-dir` etc. are global).
    #[arg(skip)]
    pub tls: cairn_server::TlsArgs,
}

impl ConfigArgs {
    /// Defaults, file, environment, then these flags.
    pub fn load(&self) -> Result<Config> {
        let mut config = Config::load(self.config.as_deref())?;
        config::set_flags(
            &mut config,
            [
                ("listen", self.listen.map(|v| v.to_string())),
                ("store_addr", self.store_addr.clone()),
                (
                    "store_timeout_ms",
                    self.store_timeout_ms.map(|v| v.to_string()),
                ),
                (
                    "default_enabled",
                    self.default_enabled.map(|v| v.to_string()),
                ),
                (
                    "max_block_bytes",
                    self.max_block_bytes.map(|v| v.to_string()),
                ),
                ("max_blocks", self.max_blocks.map(|v| v.to_string())),
                (
                    "max_document_bytes",
                    self.max_document_bytes.map(|v| v.to_string()),
                ),
            ],
        )
        .map_err(config_error)?;
        config.denylist.extend(self.deny.iter().cloned());
        config.tls = config.tls.overridden_by(&self.tls.config());
        config.insecure_listen |= self.tls.insecure_listen;
        config.check()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_then_env_then_defaults() {
        let mut config: Config =
            toml::from_str("max_blocks = 5\nstore_addr = \"10.0.0.1:1\"\n").unwrap();
        config
            .apply_env(|k| match k {
                "CAIRN_INGEST_STORE_ADDR" => Some("http://127.0.0.1:9".into()),
                "CAIRN_INGEST_DEFAULT_ENABLED" => Some("false".into()),
                "CAIRN_INGEST_DENYLIST" => Some(" secrets, .npmrc ,".into()),
                _ => None,
            })
            .unwrap();
        assert_eq!(config.max_blocks, 5);
        assert_eq!(config.store_addr, "http://127.0.0.1:9");
        assert!(!config.default_enabled);
        assert_eq!(config.denylist, ["secrets", ".npmrc"]);
        assert_eq!(config.max_block_bytes, 1 << 20);
    }

    #[test]
    fn bad_values_name_the_key() {
        let mut config = Config::default();
        let err = config
            .apply_env(|k| (k == "CAIRN_INGEST_MAX_BLOCKS").then(|| "many".into()))
            .unwrap_err();
        assert!(err.to_string().contains("CAIRN_INGEST_MAX_BLOCKS"), "{err}");
        assert!(Config {
            write_concurrency: 0,
            ..Config::default()
        }
        .check()
        .is_err());
        assert!(toml::from_str::<Config>("nonsense = 1").is_err());
    }
}
