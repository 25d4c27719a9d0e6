//! Configuration: defaults, then a TOML file, then `CAIRN_ORCHESTRATOR_<KEY>` environment
//! variables (retry keys as `CAIRN_ORCHESTRATOR_RETRY_<KEY>`), then command-line flags.
//! docs/configuration of the keys: see `Config`'s field comments (also in docs/graphs.md).

use std::path::Path;

use cairn_server::config::{self, Alias, Env, UnknownVars};
use serde::{Deserialize, Serialize};

use crate::auth::AuthConfig;
use crate::error::{Error, Result};
use cairn_agents::LlmConfig;
use cairn_code_delivery::config::CodeDeliveryConfig;
use cairn_delivery::onebot::OneBotConfig;
use cairn_graph::{ErrorKind, RetrySpec};

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
    /// The artifact-store (required): every file and event goes there.
    pub store_addr: String,
    /// The ingest service; empty = the ingest hook and `ingest` nodes are off.
    pub ingest_addr: String,
    /// Sandbox runners: addresses, or DNS names standing for every address they resolve to
    /// (`dns:///name:port`; a Kubernetes headless Service). Healthy runners get work
    /// round-robin; an Unavailable one is ejected and the request goes to another
    /// (cairn-runner-client).
    pub sandbox_addrs: Vec<String>,
    /// Time between grpc.health.v1 checks of each runner (0 = no checks, no ejection).
    pub sandbox_health_interval_ms: u64,
    /// Time between resolutions of the DNS names in `sandbox_addrs` (0 = at start-up only).
    pub sandbox_resolve_interval_ms: u64,
    /// Runs executing at once; more wait in state `created`.
    pub max_parallel_runs: usize,
    /// Nodes of one run executing at once (a graph's `max_parallel` may lower it).
    pub max_parallel_nodes: usize,
    /// The ingest hook after nodes that write a document (the ingest service's own
    /// per-project/run flag applies too).
    pub ingest_hook: bool,
    /// At start-up, resume every run that is not final.
    pub resume_on_start: bool,
    /// LLM provider for agent nodes when neither the submit request nor the graph names one:
    /// a provider name of `[llm.providers]`, or `openai:<base_url>#<model>` / `replay:<path
    /// in the project>`, which make the implicit provider `default` (a URL here gets the key
    /// of `llm.api_key_env`).
    pub default_llm: String,
    /// Longest interval between rewrites of README.md/task.yaml/state.json while a run moves
    /// (state changes are written at once).
    pub snapshot_interval_ms: u64,
    /// Deadline of one node attempt when the node sets no `timeout_s`.
    pub node_timeout_s: u64,
    /// Longest time an event nobody waits for is held to be appended with later ones (group
    /// commit: fewer fsyncs). Whatever must be durable (before a node with effects starts, a
    /// reply to a human action, a snapshot) is appended at once.
    pub event_linger_ms: u64,
    /// Bytes of output (stdout, stderr, steps) kept per node attempt, in memory while it runs
    /// and in its stored log (`logs/<node>/<attempt>.jsonl`); older output is dropped first.
    pub log_retain_bytes: u64,
    /// How long calls to the store and to ingest that find them unreachable are retried
    /// (with backoff), counted from the start of the outage; 0 = not retried. A node waiting
    /// on such a call is not failed or restarted meanwhile.
    pub dependency_outage_s: u64,
    /// On shutdown, how long calls get to finish before they end with UNAVAILABLE.
    pub drain_deadline_s: u64,
    /// Default retry policy of nodes.
    pub retry: RetryPolicy,
    /// Time between reconcile passes: every unfinished run this orchestrator owns that no
    /// live driver here holds is resumed (a driver that ended without finishing its run, a
    /// run left behind by a membership change). 0 = no passes (start-up and membership
    /// changes only).
    pub reconcile_interval_ms: u64,
    /// Seconds a running node may go without any event of its run before the run is reported
    /// stalled; 0 = the node's own deadline (its `timeout_s`, else `node_timeout_s`).
    pub stall_after_s: u64,
    /// What happens to a stalled run besides its `run.stalled` event: `notify` (nothing
    /// more), `retry` (the stalled attempts are stopped and the nodes run again) or `fail`
    /// (the run fails, saying which nodes stalled).
    pub stall_policy: StallPolicy,
    /// `[llm]`: OpenAI-compatible providers (timeouts, attempts, API key variable).
    pub llm: LlmConfig,
    /// `[onebot]`: the OneBot v11 endpoint of `group` / `private` delivery targets.
    pub onebot: OneBotConfig,
    /// `[code_delivery]`: the code delivery agent.
    pub code_delivery: CodeDeliveryConfig,
    /// Directory of installed tools of `tool_call` nodes (`<dir>/<name>/tool.toml` and its
    /// program); empty = built-in tools only.
    pub tools_dir: String,
    /// `[sandbox.runner.features]`: opt-in uses of the sandbox runners.
    pub sandbox: SandboxSettings,
    /// `[auth]`: who may call (`tokens_file`: people, roles and token hashes; docs/security.md).
    pub auth: AuthConfig,
    /// `[orchestrator.cluster]`: replicas sharing the runs of one store through etcd; off
    /// (one orchestrator drives every run) until `etcd_endpoints` is set.
    pub cluster: crate::cluster::ClusterConfig,
}

/// What the watchdog does with a stalled run (`stall_policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StallPolicy {
    /// Only the `run.stalled` event (and log line and metric).
    #[default]
    Notify,
    /// Stop the stalled attempts and run their nodes again.
    Retry,
    /// Fail the run.
    Fail,
}

impl StallPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            StallPolicy::Notify => "notify",
            StallPolicy::Retry => "retry",
            StallPolicy::Fail => "fail",
        }
    }
}

/// `[sandbox]` (`sandbox.runner.*` keys; the runners themselves are `sandbox_addrs`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSettings {
    pub runner: SandboxRunnerSettings,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxRunnerSettings {
    pub features: SandboxFeatures,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxFeatures {
    /// `sandbox.runner.features.use_for_tools`: installed tools of `tool_call` nodes run on a
    /// sandbox runner instead of as subprocesses of the orchestrator (opt-in; a
    /// timeout or protocol error fails the node, never falls back).
    pub use_for_tools: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:50054".into(),
            tls: cairn_server::TlsConfig::default(),
            insecure_listen: false,
            metrics_listen: String::new(),
            telemetry: cairn_server::TelemetryConfig::default(),
            access: Default::default(),
            store_addr: "127.0.0.1:50051".into(),
            ingest_addr: String::new(),
            sandbox_addrs: Vec::new(),
            sandbox_health_interval_ms: 2000,
            sandbox_resolve_interval_ms: 10_000,
            max_parallel_runs: 16,
            max_parallel_nodes: 8,
            ingest_hook: true,
            resume_on_start: true,
            default_llm: String::new(),
            snapshot_interval_ms: 1000,
            node_timeout_s: 3600,
            event_linger_ms: 5,
            log_retain_bytes: cairn_node::logs::DEFAULT_RETAIN_BYTES as u64,
            dependency_outage_s: cairn_server::retry::DEFAULT_OUTAGE.as_secs(),
            drain_deadline_s: cairn_server::drain::DEFAULT_DEADLINE.as_secs(),
            retry: RetryPolicy::default(),
            reconcile_interval_ms: 3000,
            stall_after_s: 0,
            stall_policy: StallPolicy::Notify,
            llm: LlmConfig::default(),
            onebot: OneBotConfig::default(),
            code_delivery: CodeDeliveryConfig::default(),
            tools_dir: String::new(),
            sandbox: SandboxSettings::default(),
            auth: AuthConfig::default(),
            cluster: crate::cluster::ClusterConfig::default(),
        }
    }
}

/// `CAIRN_ORCHESTRATOR_<KEY>` / `CAIRN_ORCHESTRATOR_<SECTION>_<KEY>` overrides; an unknown
/// name is refused.
/// `CAIRN_ORCHESTRATOR_<KEY>`, and the orchestrator's own sections by their names:
/// `CAIRN_LLM_<KEY>`, `CAIRN_CODE_DELIVERY_<KEY>`, `CAIRN_ONEBOT_<KEY>`, `CAIRN_AUTH_<KEY>`
/// (`CAIRN_ORCHESTRATOR_LLM_<KEY>` etc. also work).
pub const ENV: Env = Env {
    prefix: ENV_PREFIX,
    unknown: UnknownVars::Refuse,
    aliases: &[
        section_alias("CAIRN_LLM_", "llm"),
        section_alias("CAIRN_CODE_DELIVERY_", "code_delivery"),
        section_alias("CAIRN_ONEBOT_", "onebot"),
        section_alias("CAIRN_AUTH_", "auth"),
    ],
};

const fn section_alias(prefix: &'static str, section: &'static str) -> Alias {
    Alias {
        prefix,
        section,
        unknown: UnknownVars::Refuse,
    }
}

impl Config {
    /// Defaults, then `file` (TOML) if given, then the environment.
    pub fn load(file: Option<&Path>) -> Result<Config> {
        let config: Config = ENV.load(file).map_err(config_error)?;
        config.check()?;
        Ok(config)
    }

    /// Applies one `key=value` override (flags use this too).
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let mut next = self.clone();
        config::set(&mut next, key, value).map_err(config_error)?;
        // A refused value leaves the config as it was.
        next.check()?;
        *self = next;
        Ok(())
    }

    pub fn check(&self) -> Result<()> {
        self.telemetry.check().map_err(Error::Config)?;
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
        self.llm.check().map_err(Error::Config)?;
        cairn_agents::providers::check_default(&self.llm, &self.default_llm)
            .map_err(Error::Config)?;
        self.onebot.check().map_err(Error::Config)?;
        self.code_delivery.check().map_err(Error::Config)?;
        self.cluster.check().map_err(Error::Config)?;
        Ok(())
    }
}

fn config_error(e: config::ConfigError) -> Error {
    let m = e.to_string();
    if m.contains("llm_base_dir") || m.contains("LLM_BASE_DIR") {
        // A setting of earlier versions: say why it went instead of only "unknown key".
        return Error::Config(format!(
            "{m}; `llm_base_dir` was removed: the orchestrator reads no file of its host for a graph (`cairn run` sends the files a graph names with the submit, and a graph started from the project finds them beside it); delete the setting"
        ));
    }
    Error::Config(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_key_use_for_tools_maps_to_sandbox_runner_features() {
        let mut c = Config::default();
        assert!(!c.sandbox.runner.features.use_for_tools);
        c.set("sandbox.runner.features.use_for_tools", "true")
            .unwrap();
        assert!(c.sandbox.runner.features.use_for_tools);
        // The environment spelling (CAIRN_ORCHESTRATOR_SANDBOX_RUNNER_FEATURES_USE_FOR_TOOLS).
        c.set("sandbox_runner_features_use_for_tools", "off")
            .unwrap();
        assert!(!c.sandbox.runner.features.use_for_tools);
        assert!(c.set("sandbox.runner.features.nope", "1").is_err());
        assert!(c
            .set("sandbox.runner.features.use_for_tools", "maybe")
            .is_err());
        c.set("tools_dir", "/opt/cairn/tools").unwrap();
        assert_eq!(c.tools_dir, "/opt/cairn/tools");
        // Other keys are untouched by the nested lookup.
        c.set("sandbox_addrs", "a:1").unwrap();
        assert_eq!(c.sandbox_addrs, vec!["a:1"]);

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("orchestrator.toml");
        // The documented key as a TOML dotted key.
        std::fs::write(&file, "sandbox.runner.features.use_for_tools = true\n").unwrap();
        assert!(
            Config::load(Some(&file))
                .unwrap()
                .sandbox
                .runner
                .features
                .use_for_tools
        );
        std::fs::write(&file, "[sandbox.runner.features]\nuse_for_tool = true\n").unwrap();
        assert!(Config::load(Some(&file)).is_err());
    }

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
        c.set("stall_policy", "retry").unwrap();
        assert_eq!(c.stall_policy, StallPolicy::Retry);
        assert!(c.set("stall_policy", "panic").is_err());
        c.set("reconcile_interval_ms", "500").unwrap();
        c.set("stall_after_s", "30").unwrap();
        assert_eq!((c.reconcile_interval_ms, c.stall_after_s), (500, 30));
    }

    #[test]
    fn sections_by_key_and_file() {
        let mut c = Config::default();
        c.set("llm_model", "qwen").unwrap();
        c.set("llm.max_attempts", "3").unwrap();
        c.set("onebot_api_base", "http://127.0.0.1:3000").unwrap();
        c.set("code_delivery_llm_max_retries_per_request", "4")
            .unwrap();
        c.set("code_delivery.default_archive_format", "tar.gz")
            .unwrap();
        assert_eq!(c.llm.model, "qwen");
        assert_eq!(c.llm.max_attempts, 3);
        assert_eq!(c.onebot.api_base, "http://127.0.0.1:3000");
        assert_eq!(c.code_delivery.llm_max_retries_per_request, 4);
        assert_eq!(
            c.code_delivery.default_archive_format,
            cairn_code_delivery::ArchiveFormat::TarGz
        );
        let err = c.set("llm.max_attempts", "0").unwrap_err().to_string();
        assert!(err.contains("llm.max_attempts"), "{err}");
        assert_eq!(c.llm.max_attempts, 3, "a refused value changes nothing");
        let err = c.set("onebot.api_base", "ftp://x").unwrap_err().to_string();
        assert!(err.contains("onebot.api_base"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("orchestrator.toml");
        std::fs::write(
            &file,
            "[llm]\nmodel = \"m\"\nstream = true\n[onebot]\napi_base = \"http://127.0.0.1:5700\"\n[code_delivery]\nenabled = false\n",
        )
        .unwrap();
        let c = Config::load(Some(&file)).unwrap();
        assert_eq!(c.llm.model, "m");
        assert!(c.llm.stream);
        assert_eq!(c.onebot.api_base, "http://127.0.0.1:5700");
        assert!(!c.code_delivery.enabled);
        std::fs::write(&file, "[llm]\nnope = 1\n").unwrap();
        assert!(Config::load(Some(&file)).is_err());
    }

    #[test]
    fn llm_providers_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("orchestrator.toml");
        std::fs::write(
            &file,
            "default_llm = \"local\"\n[llm]\nallow_request_llm_urls = true\n\
             [llm.providers.local]\nbase_url = \"http://127.0.0.1:8000/v1\"\nmodel = \"q\"\napi_key_env = \"LOCAL_KEY\"\n\
             [llm.providers.demo]\nkind = \"replay\"\ncassette = \"docs/cassettes/demo.yaml\"\n",
        )
        .unwrap();
        let c = Config::load(Some(&file)).unwrap();
        assert!(c.llm.allow_request_llm_urls);
        assert_eq!(c.llm.providers["local"].api_key_env, "LOCAL_KEY");
        assert_eq!(
            c.llm.providers["demo"].kind,
            cairn_agents::ProviderKind::Replay
        );
        // Each refusal names the key to fix.
        for (text, key) in [
            (
                "[llm.providers.x]\nbase_url = \"ftp://h\"\nmodel = \"m\"\n",
                "llm.providers.x.base_url",
            ),
            (
                "[llm.providers.x]\nkind = \"replay\"\ncassette = \"/etc/passwd\"\n",
                "llm.providers.x.cassette",
            ),
            (
                "[llm.providers.x]\nbase_url = \"http://h/v1\"\nmodle = \"m\"\n",
                "modle",
            ),
            ("default_llm = \"nope\"\n", "default_llm"),
            ("default_llm = \"replay:../c.yaml\"\n", "default_llm"),
        ] {
            std::fs::write(&file, text).unwrap();
            let e = Config::load(Some(&file)).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
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

    #[test]
    fn an_old_llm_base_dir_setting_says_it_was_removed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("o.toml");
        std::fs::write(
            &file,
            "store_addr = \"127.0.0.1:1\"\nllm_base_dir = \"/etc\"\n",
        )
        .unwrap();
        let e = Config::load(Some(&file)).unwrap_err().to_string();
        assert!(
            e.contains("llm_base_dir") && e.contains("was removed"),
            "{e}"
        );
        let e = Config::default()
            .set("llm_base_dir", "/etc")
            .unwrap_err()
            .to_string();
        assert!(e.contains("was removed") && e.contains("cairn run"), "{e}");
    }
}
