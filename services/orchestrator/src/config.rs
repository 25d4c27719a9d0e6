//! Configuration: defaults, then a TOML file, then `CAIRN_ORCHESTRATOR_<KEY>` environment
//! variables (retry keys as `CAIRN_ORCHESTRATOR_RETRY_<KEY>`), then command-line flags.
//! docs/configuration of the keys: see `Config`'s field comments (also in docs/graphs.md).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::graph::{ErrorKind, RetrySpec};

/// Environment prefix of overrides.
pub const ENV_PREFIX: &str = "CAIRN_ORCHESTRATOR_";

/// Default retry policy of nodes (a node's or graph's `retry:` overrides single fields).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts per node, the first included (1 = no retry).
    pub max_attempts: u32,
    /// Wait before the second attempt.
    pub initial_backoff_ms: u64,
    /// Longest wait between attempts.
    pub max_backoff_ms: u64,
    /// Growth of the wait per attempt.
    pub multiplier: f64,
    /// Random spread of each wait, as a fraction (0.2 = ±20%).
    pub jitter: f64,
    /// Which errors are retried: timeout, unavailable, failed, refused.
    pub retry_on: Vec<ErrorKind>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff_ms: 200,
            max_backoff_ms: 30_000,
            multiplier: 2.0,
            jitter: 0.2,
            retry_on: vec![ErrorKind::Timeout, ErrorKind::Unavailable],
        }
    }
}

impl RetryPolicy {
    /// This policy with a graph's and then a node's overrides applied.
    pub fn merged(&self, specs: &[Option<&RetrySpec>]) -> RetryPolicy {
        let mut p = self.clone();
        for s in specs.iter().flatten() {
            if let Some(v) = s.max_attempts {
                p.max_attempts = v.max(1);
            }
            if let Some(v) = s.initial_backoff_ms {
                p.initial_backoff_ms = v;
            }
            if let Some(v) = s.max_backoff_ms {
                p.max_backoff_ms = v;
            }
            if let Some(v) = s.multiplier {
                p.multiplier = v;
            }
            if let Some(v) = s.jitter {
                p.jitter = v;
            }
            if let Some(v) = &s.retry_on {
                p.retry_on = v.clone();
            }
        }
        p
    }

    /// Wait before attempt `next` (2 = the first retry): exponential, capped, with jitter.
    pub fn backoff(&self, next: u32) -> std::time::Duration {
        let exp = self.multiplier.max(1.0).powi(next.saturating_sub(2) as i32);
        let base = (self.initial_backoff_ms as f64 * exp).min(self.max_backoff_ms as f64);
        let spread = self.jitter.clamp(0.0, 1.0);
        let factor = 1.0 + spread * (fastrand::f64() * 2.0 - 1.0);
        std::time::Duration::from_millis((base * factor).max(0.0) as u64)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// gRPC listen address of the standalone service.
    pub listen: String,
    /// The artifact-store (required): every file and event goes there.
    pub store_addr: String,
    /// The ingest service; empty = the ingest hook and `ingest` nodes are off.
    pub ingest_addr: String,
    /// Sandbox runners, used round-robin; a runner that is Unavailable is skipped for another.
    pub sandbox_addrs: Vec<String>,
    /// Runs executing at once; more wait in state `created`.
    pub max_parallel_runs: usize,
    /// Nodes of one run executing at once (a graph's `max_parallel` may lower it).
    pub max_parallel_nodes: usize,
    /// The ingest hook after nodes that write a document (seed 000; the ingest service's own
    /// per-project/run flag applies too).
    pub ingest_hook: bool,
    /// At start-up, resume every run that is not final.
    pub resume_on_start: bool,
    /// LLM provider for agent nodes when neither the submit request nor the graph names one
    /// (`replay:<cassette>`).
    pub default_llm: String,
    /// Directory relative cassette paths resolve against when the submitter gives none
    /// (empty = the working directory).
    pub llm_base_dir: String,
    /// Longest interval between rewrites of README.md/task.yaml/state.json while a run moves
    /// (state changes are written at once).
    pub snapshot_interval_ms: u64,
    /// Deadline of one node attempt when the node sets no `timeout_s`.
    pub node_timeout_s: u64,
    /// Longest time an event nobody waits for is held to be appended with later ones (group
    /// commit: fewer fsyncs). Whatever must be durable (before a node with effects starts, a
    /// reply to a human action, a snapshot) is appended at once.
    pub event_linger_ms: u64,
    /// Default retry policy of nodes.
    pub retry: RetryPolicy,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:50054".into(),
            store_addr: "127.0.0.1:50051".into(),
            ingest_addr: String::new(),
            sandbox_addrs: Vec::new(),
            max_parallel_runs: 16,
            max_parallel_nodes: 8,
            ingest_hook: true,
            resume_on_start: true,
            default_llm: String::new(),
            llm_base_dir: String::new(),
            snapshot_interval_ms: 1000,
            node_timeout_s: 3600,
            event_linger_ms: 5,
            retry: RetryPolicy::default(),
        }
    }
}

impl Config {
    /// Defaults, then `file` (TOML) if given, then the environment.
    pub fn load(file: Option<&Path>) -> Result<Config> {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
                toml::from_str::<toml::Table>(&text)
                    .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?
            }
            None => toml::Table::new(),
        };
        for (key, value) in std::env::vars() {
            if let Some(k) = key.strip_prefix(ENV_PREFIX) {
                set_key(&mut table, &k.to_ascii_lowercase(), &value)
                    .map_err(|e| Error::Config(format!("environment variable {key}: {e}")))?;
            }
        }
        let config: Config = table
            .try_into()
            .map_err(|e: toml::de::Error| Error::Config(e.to_string()))?;
        config.check()?;
        Ok(config)
    }

    /// Applies one `key=value` override (flags use this too).
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let mut table = toml::Table::try_from(&*self).map_err(|e| Error::Config(e.to_string()))?;
        set_key(&mut table, key, value).map_err(Error::Config)?;
        *self = table
            .try_into()
            .map_err(|e: toml::de::Error| Error::Config(e.to_string()))?;
        self.check()
    }

    pub fn check(&self) -> Result<()> {
        if self.store_addr.trim().is_empty() {
            return Err(Error::Config(
                "store_addr is required (the artifact-store's address)".into(),
            ));
        }
        if self.max_parallel_runs == 0 || self.max_parallel_nodes == 0 {
            return Err(Error::Config(
                "max_parallel_runs and max_parallel_nodes must be at least 1".into(),
            ));
        }
        if self.retry.max_attempts == 0 {
            return Err(Error::Config(
                "retry.max_attempts must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Sets `key` (a Config field, or `retry_<field>` / `retry.<field>`) from text, typed by the
/// field's default.
fn set_key(table: &mut toml::Table, key: &str, value: &str) -> std::result::Result<(), String> {
    let defaults = toml::Table::try_from(Config::default()).map_err(|e| e.to_string())?;
    let key = key.replace('-', "_");
    let (section, field) = match key.split_once('.') {
        Some((s, f)) => (Some(s.to_owned()), f.to_owned()),
        None => match key.strip_prefix("retry_") {
            Some(f) if defaults.get("retry").and_then(|r| r.get(f)).is_some() => {
                (Some("retry".into()), f.to_owned())
            }
            _ => (None, key.clone()),
        },
    };
    let template = match &section {
        Some(s) => defaults.get(s).and_then(|t| t.get(&field)),
        None => defaults.get(&field),
    };
    let Some(template) = template else {
        return Err(format!("unknown key `{key}`"));
    };
    let parsed = match template {
        toml::Value::Boolean(_) => toml::Value::Boolean(match value.trim() {
            "1" | "true" | "yes" | "on" => true,
            "0" | "false" | "no" | "off" => false,
            other => return Err(format!("`{other}` is not a boolean")),
        }),
        toml::Value::Integer(_) => toml::Value::Integer(
            value
                .trim()
                .parse()
                .map_err(|_| format!("`{value}` is not an integer"))?,
        ),
        toml::Value::Float(_) => toml::Value::Float(
            value
                .trim()
                .parse()
                .map_err(|_| format!("`{value}` is not a number"))?,
        ),
        toml::Value::Array(_) => toml::Value::Array(
            value
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.to_owned()))
                .collect(),
        ),
        _ => toml::Value::String(value.to_owned()),
    };
    match section {
        Some(s) => {
            let entry = table
                .entry(s)
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            match entry {
                toml::Value::Table(t) => {
                    t.insert(field, parsed);
                }
                _ => return Err("not a table".into()),
            }
        }
        None => {
            table.insert(field, parsed);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_by_key() {
        let mut c = Config::default();
        c.set("sandbox_addrs", "a:1, b:2").unwrap();
        c.set("retry_max_attempts", "5").unwrap();
        c.set("retry.jitter", "0.5").unwrap();
        c.set("ingest_hook", "off").unwrap();
        assert_eq!(c.sandbox_addrs, vec!["a:1", "b:2"]);
        assert_eq!(c.retry.max_attempts, 5);
        assert_eq!(c.retry.jitter, 0.5);
        assert!(!c.ingest_hook);
        assert!(c
            .set("nope", "1")
            .unwrap_err()
            .to_string()
            .contains("unknown key"));
        assert!(c.set("max_parallel_runs", "many").is_err());
        assert!(c.set("max_parallel_runs", "0").is_err());
    }

    #[test]
    fn backoff_grows_and_caps() {
        let p = RetryPolicy {
            jitter: 0.0,
            initial_backoff_ms: 100,
            max_backoff_ms: 350,
            ..Default::default()
        };
        assert_eq!(p.backoff(2).as_millis(), 100);
        assert_eq!(p.backoff(3).as_millis(), 200);
        assert_eq!(p.backoff(4).as_millis(), 350);
        let j = RetryPolicy {
            jitter: 0.5,
            initial_backoff_ms: 1000,
            ..Default::default()
        };
        for _ in 0..50 {
            let d = j.backoff(2).as_millis();
            assert!((500..=1500).contains(&d), "{d}");
        }
    }
}
