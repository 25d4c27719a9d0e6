//! The store's configuration: defaults, then a TOML file, then `CAIRN_ARTIFACT_STORE_*`
//! environment variables, then command-line flags (each later source wins).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use cairn_server::config::{self, Alias, Env, UnknownVars};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Largest Get chunk (proto: "up to 1 MiB each").
pub const MAX_CHUNK_BYTES: usize = 1 << 20;
const MIN_CHUNK_BYTES: usize = 4 << 10;

/// Configuration of one artifact-store.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Directory holding `projects/<project_id>/...`; created when missing.
    pub data_root: PathBuf,
    /// Address the standalone server listens on.
    pub listen: SocketAddr,
    /// Names refused as any path component, in addition to `pathguard::DEFAULT_DENYLIST`.
    pub denylist: Vec<String>,
    /// Project-relative prefixes writes are confined to; empty = the whole project.
    pub allowed_prefixes: Vec<String>,
    /// Largest file a Put may write.
    pub max_file_bytes: u64,
    /// Size of the chunks Get sends (4 KiB - 1 MiB).
    pub chunk_bytes: usize,
    /// Largest stored event line (JSON) AppendEvents accepts.
    pub max_event_bytes: usize,
    /// Largest JSON document UpdateJson reads or writes.
    pub max_json_bytes: usize,
    /// Write bodies over 1 MiB with O_DIRECT where the filesystem allows it (no page-cache
    /// copy; the file is fsync'd all the same).
    pub direct_io: bool,
    /// Make synchronous Puts of small bodies (up to 128 KiB) durable by one fdatasync of
    /// `<data_root>/put.journal` instead of fsyncing the file and its directory each time.
    pub put_journal: bool,
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
    /// On shutdown, how long calls get to finish before they end with UNAVAILABLE (follow
    /// streams end at once).
    pub drain_deadline_s: u64,
    /// Which finished runs the store archives, and deletes, by itself (`[retention]`).
    pub retention: Retention,
    /// Session snapshots: the per-project quota, how long the CLI's are kept (`[snapshots]`).
    pub snapshots: Snapshots,
}

/// Session snapshots (the CLI's `.cairn/snapshots/`, the runs' `.cairn/runs/<run>/snapshots/`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Snapshots {
    /// Most bytes of snapshots one project may hold; a snapshot Put past it is refused
    /// (RESOURCE_EXHAUSTED, `snapshot_quota`). 0 = no limit.
    pub max_project_bytes: u64,
    /// The sweep removes the CLI's snapshots last written more than this many days ago
    /// (0 = kept until removed by hand). A run's snapshots go when the run is archived.
    pub delete_after_days: u64,
    /// Quotas of single projects (project id -> bytes, 0 = no limit), replacing
    /// `max_project_bytes` for them.
    pub projects: std::collections::BTreeMap<String, u64>,
}

impl Default for Snapshots {
    fn default() -> Self {
        Snapshots {
            max_project_bytes: 64 << 30,
            delete_after_days: 30,
            projects: Default::default(),
        }
    }
}

impl Snapshots {
    /// The snapshot quota of `project` in bytes (0 = no limit).
    pub fn quota(&self, project: &str) -> u64 {
        self.projects
            .get(project)
            .copied()
            .unwrap_or(self.max_project_bytes)
    }
}

/// What the retention sweep keeps of finished (completed, failed, canceled) runs: a finished
/// run is archived (packed into one file its records are still read from) once it is older
/// than `archive_after_days` and not among the project's newest `keep_runs` finished runs
/// (a 0 leaves that condition out; both 0 archive nothing). An archived run is deleted
/// `delete_after_days` after it was archived (0 = never). Unfinished runs are never touched.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Retention {
    pub archive_after_days: u64,
    pub keep_runs: u64,
    pub delete_after_days: u64,
    /// Seconds between sweeps.
    pub sweep_interval_s: u64,
    /// Rules of single projects, replacing the three above for them.
    pub projects: std::collections::BTreeMap<String, RetentionRule>,
}

/// The retention of one project (see [`Retention`]).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionRule {
    pub archive_after_days: u64,
    pub keep_runs: u64,
    pub delete_after_days: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            archive_after_days: 0,
            keep_runs: 0,
            delete_after_days: 0,
            sweep_interval_s: 3600,
            projects: Default::default(),
        }
    }
}

impl Retention {
    /// The rule of `project`.
    pub fn rule(&self, project: &str) -> RetentionRule {
        self.projects
            .get(project)
            .copied()
            .unwrap_or(RetentionRule {
                archive_after_days: self.archive_after_days,
                keep_runs: self.keep_runs,
                delete_after_days: self.delete_after_days,
            })
    }

    /// Whether any project's rule archives or deletes anything.
    pub fn active(&self) -> bool {
        self.rule("").active() || self.projects.values().any(RetentionRule::active)
    }
}

impl RetentionRule {
    /// Whether the rule archives or deletes anything.
    pub fn active(&self) -> bool {
        self.archive_after_days > 0 || self.keep_runs > 0 || self.delete_after_days > 0
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_root: PathBuf::from(".cairn-data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            denylist: Vec::new(),
            allowed_prefixes: Vec::new(),
            max_file_bytes: 10 << 30,
            chunk_bytes: MAX_CHUNK_BYTES,
            max_event_bytes: 1 << 20,
            max_json_bytes: 16 << 20,
            direct_io: true,
            put_journal: true,
            tls: cairn_server::TlsConfig::default(),
            insecure_listen: false,
            metrics_listen: String::new(),
            telemetry: cairn_server::TelemetryConfig::default(),
            access: Default::default(),
            drain_deadline_s: cairn_server::drain::DEFAULT_DEADLINE.as_secs(),
            retention: Retention::default(),
            snapshots: Snapshots::default(),
        }
    }
}

/// `CAIRN_ARTIFACT_STORE_<KEY>` overrides (lists comma-separated); the older `CAIRN_STORE_<KEY>` still works (that prefix is
/// shared with `CAIRN_STORE_ADDR` and compose's variables, so unknown names are skipped there).
pub const ENV: Env = Env {
    prefix: "CAIRN_ARTIFACT_STORE_",
    unknown: UnknownVars::Refuse,
    aliases: &[Alias {
        prefix: "CAIRN_STORE_",
        section: "",
        unknown: UnknownVars::Ignore,
    }],
};

impl Config {
    /// A default configuration over `data_root`.
    pub fn new(data_root: impl Into<PathBuf>) -> Self {
        Config {
            data_root: data_root.into(),
            ..Config::default()
        }
    }

    /// Defaults, then the TOML `file` (if given), then `CAIRN_ARTIFACT_STORE_*` variables.
    pub fn load(file: Option<&Path>) -> Result<Config> {
        let config: Config = ENV.load(file).map_err(config_error)?;
        config.check()?;
        Ok(config)
    }

    /// Applies `CAIRN_ARTIFACT_STORE_*` (or `CAIRN_STORE_*`) overrides read through `var`.
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) -> Result<()> {
        ENV.apply_lookup(self, var).map_err(config_error)
    }

    /// Whether the store sweeps by itself: runs by `[retention]`, old CLI snapshots by
    /// `snapshots.delete_after_days`.
    pub fn sweeps(&self) -> bool {
        self.retention.active() || self.snapshots.delete_after_days > 0
    }

    /// Refuses values the store cannot work with.
    pub fn check(&self) -> Result<()> {
        self.telemetry.check().map_err(Error::Config)?;
        if !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&self.chunk_bytes) {
            return Err(Error::Config(format!(
                "chunk_bytes = {} is out of range: use {MIN_CHUNK_BYTES}..={MAX_CHUNK_BYTES}",
                self.chunk_bytes
            )));
        }
        if self.max_event_bytes < 256 {
            return Err(Error::Config("max_event_bytes must be at least 256".into()));
        }
        if self.max_json_bytes < 256 {
            return Err(Error::Config("max_json_bytes must be at least 256".into()));
        }
        if self.retention.sweep_interval_s == 0 {
            return Err(Error::Config(
                "retention.sweep_interval_s must be at least 1".into(),
            ));
        }
        if self.data_root.as_os_str().is_empty() {
            return Err(Error::Config("data_root is empty: give a directory".into()));
        }
        Ok(())
    }
}

fn config_error(e: config::ConfigError) -> Error {
    Error::Config(e.to_string())
}

/// Command-line flags of the store (also flattened into `cairn serve artifact-store`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// TOML configuration file (keys: data_root, listen, denylist, allowed_prefixes,
    /// max_file_bytes, chunk_bytes, max_event_bytes, max_json_bytes).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory holding the projects (env CAIRN_ARTIFACT_STORE_DATA_ROOT).
    #[arg(long, value_name = "DIR")]
    pub data_root: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:7070 (env CAIRN_ARTIFACT_STORE_LISTEN).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Extra denylisted name (repeatable; adds to the built-in list and the config's).
    #[arg(long = "deny", value_name = "NAME")]
    pub deny: Vec<String>,
    /// Allowed write prefix (repeatable; replaces the config's list).
    #[arg(long = "allowed-prefix", value_name = "PREFIX")]
    pub allowed_prefixes: Vec<String>,
    /// Largest file a Put may write, in bytes.
    #[arg(long, value_name = "BYTES")]
    pub max_file_bytes: Option<u64>,
    /// Get chunk size in bytes (4096-1048576).
    #[arg(long, value_name = "BYTES")]
    pub chunk_bytes: Option<usize>,
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
                ("max_file_bytes", self.max_file_bytes.map(|v| v.to_string())),
                ("chunk_bytes", self.chunk_bytes.map(|v| v.to_string())),
            ],
        )
        .map_err(config_error)?;
        // A path may not be UTF-8: set directly.
        if let Some(v) = &self.data_root {
            config.data_root = v.clone();
        }
        config.denylist.extend(self.deny.iter().cloned());
        if !self.allowed_prefixes.is_empty() {
            config.allowed_prefixes = self.allowed_prefixes.clone();
        }
        config.tls = config.tls.overridden_by(&self.tls.config());
        config.insecure_listen |= self.tls.insecure_listen;
        config.check()?;
        Ok(config)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_file_values() {
        let mut config: Config =
            toml::from_str("data_root = \"/srv/a\"\nmax_file_bytes = 10\n").unwrap();
        config
            .apply_env(|k| match k {
                "CAIRN_ARTIFACT_STORE_MAX_FILE_BYTES" => Some("20".into()),
                "CAIRN_STORE_DENYLIST" => Some(" secrets , .npmrc,".into()),
                _ => None,
            })
            .unwrap();
        assert_eq!(config.data_root, PathBuf::from("/srv/a"));
        assert_eq!(config.max_file_bytes, 20);
        assert_eq!(
            config.denylist,
            vec!["secrets".to_string(), ".npmrc".to_string()]
        );
    }

    #[test]
    fn bad_values_are_refused_with_the_key() {
        let mut config = Config::default();
        let err = config
            .apply_env(|k| (k == "CAIRN_STORE_LISTEN").then(|| "nowhere".into()))
            .unwrap_err();
        assert!(err.to_string().contains("CAIRN_STORE_LISTEN"), "{err}");
        let config = Config {
            chunk_bytes: 10,
            ..Config::default()
        };
        assert!(config.check().is_err());
        assert!(toml::from_str::<Config>("unknown_key = 1").is_err());
    }

    #[test]
    fn the_section_name_is_the_prefix_and_typos_under_it_are_refused() {
        let mut config = Config::default();
        let names = ENV.names(&config).unwrap();
        assert!(
            names.contains(&"CAIRN_ARTIFACT_STORE_MAX_FILE_BYTES".to_owned()),
            "{names:?}"
        );
        let vars = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        // The CLI's and compose's CAIRN_STORE_* variables are not keys and pass.
        ENV.apply(
            &mut config,
            vars(&[
                ("CAIRN_STORE_ADDR", "127.0.0.1:1"),
                ("CAIRN_STORE_VOLUME", "v"),
                ("CAIRN_ARTIFACT_STORE_CHUNK_BYTES", "65536"),
            ]),
        )
        .unwrap();
        assert_eq!(config.chunk_bytes, 65536);
        let err = ENV
            .apply(
                &mut config,
                vars(&[("CAIRN_ARTIFACT_STORE_MAX_FILE_BYTE", "1")]),
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("CAIRN_ARTIFACT_STORE_MAX_FILE_BYTE") && err.contains("max_file_bytes"),
            "{err}"
        );
    }
}
