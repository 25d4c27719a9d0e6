//! The runner's configuration: a TOML file, overridden by `CAIRN_SANDBOX_RUNNER_<KEY>`
//! environment variables (`CAIRN_SANDBOX_RUNNER_DEFAULTS_TIMEOUT_MS` for `[defaults]`
//! `timeout_ms`), overridden by command-line flags.

use std::path::{Path, PathBuf};

use cairn_server::config::{self, Env, UnknownVars};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits::{Limits, LimitsTable};

/// Prefix of the environment overrides.
pub const ENV_PREFIX: &str = "CAIRN_SANDBOX_RUNNER_";

/// The sandbox image deploy/images/ builds.
pub const SANDBOX_IMAGE: &str = "cairn-sandbox:latest";
/// The toolchain image deploy/images/ builds (pip, venv, node, npm, gcc, make, git, curl).
pub const TOOLCHAIN_IMAGE: &str = "cairn-toolchain:latest";

/// Which isolation to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// Docker when an engine answers, else the local backend when bwrap is installed.
    #[default]
    Auto,
    Docker,
    Local,
    /// gVisor sandboxes through runsc (never picked by `auto`).
    Gvisor,
}

/// Who makes a session's writable areas (/workspace and /tmpfs, bounded together or each by
/// `max_total_output_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AreasChoice {
    /// The runner when it may mount; else, on docker, the engine when the runner shares its
    /// pid namespace; else plain directories, capped per file only (said at warn).
    #[default]
    Auto,
    /// The runner mounts one tmpfs for both (plain directories when it may not).
    Runner,
    /// Docker only: the engine mounts each as a tmpfs of the session container.
    Engine,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address `serve` binds when run standalone.
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
    /// On shutdown, how long calls get to finish before they end with UNAVAILABLE (sandboxes
    /// are killed first, so runs in flight end at once).
    pub drain_deadline_s: u64,
    /// Id in container labels and names of leftovers to sweep; "" = the id stored in
    /// `<work_root>/runner-id`, made from the host name and a random suffix on first start.
    pub runner_id: String,
    pub backend: BackendChoice,
    /// Sandbox image when a request names none (built offline by deploy/images/).
    pub image: String,
    /// Images a request may name besides `image` (a name a request gives must be one of
    /// these, as written; the engine never pulls).
    pub allowed_images: Vec<String>,
    /// Container names are `<container_prefix><id><container_suffix>`.
    pub container_prefix: String,
    pub container_suffix: String,
    /// Task directories of sessions and local runs; one work_root per runner.
    pub work_root: PathBuf,
    /// Sandboxes kept ready for one-shot runs (0 = off): warm containers for the default
    /// image and limits (docker), or waiting bubblewrap sandboxes for jobs with the default
    /// memory and no network (local).
    pub pool_size: usize,
    /// May a request ask for network access?
    pub network_allowed: bool,
    /// Docker network a sandbox with network joins (`bridge`, or one made with `docker
    /// network create`, e.g. one whose egress goes through a proxy).
    pub docker_network: String,
    /// At start-up, also remove containers named `<prefix>*<suffix>` of other runner ids.
    pub sweep_all_prefixed: bool,
    /// Time between SIGTERM and SIGKILL when a run times out.
    pub kill_grace_ms: u64,
    /// RunStream sends a heartbeat this often while the program runs (0 = never), so a caller
    /// can tell a long quiet step from a runner that stopped.
    pub heartbeat_interval_ms: u64,
    /// Open sessions at most.
    pub max_sessions: usize,
    /// Runs and open sessions at once at most (each open session holds one); beyond it Run
    /// and OpenSession wait in the queue. 0 = derived from this host: min(4 × CPUs,
    /// memory / 256 MiB), at least 2 (`derived_max_concurrent_runs`).
    pub max_concurrent_runs: usize,
    /// Runs and OpenSessions that may wait, first come first served, for a slot of
    /// `max_concurrent_runs`; one more is refused at once with RESOURCE_EXHAUSTED (RetryInfo).
    /// 0 = no queue: refused as soon as every slot is taken.
    pub queue_depth: usize,
    /// How long a call waits in the queue at most (never beyond its own deadline); then it is
    /// refused with RESOURCE_EXHAUSTED (RetryInfo).
    pub queue_timeout_ms: u64,
    /// Local backend: refuse to start when memory, pids and cpu limits cannot be enforced
    /// over whole sandboxes (no cgroups for the runner). Off: runs proceed with per-process
    /// rlimits and report `limits_enforced: false`.
    pub require_limits: bool,
    /// Local backend: where the cgroup file systems are mounted.
    pub cgroup_root: PathBuf,
    /// bubblewrap binary of the local backend.
    pub bwrap: String,
    /// runsc binary of the gvisor backend.
    pub runsc: String,
    /// Where the gvisor backend keeps the sandbox image's root file system, exported once
    /// per image id through the Docker engine ("" = `<work_root>/gvisor/rootfs`).
    pub gvisor_rootfs_cache: PathBuf,
    /// gVisor platform: `ptrace` (works anywhere) or `kvm` (faster system calls; needs a
    /// working /dev/kvm).
    pub gvisor_platform: String,
    /// How a session's memory checkpoint is written: `flate-best-speed` (runsc's own
    /// default) or `none` (the image as large as the memory; restores and forks faster). A
    /// runsc that has no `--compression` (Debian 12's) always compresses.
    pub gvisor_checkpoint_compression: String,
    /// Uid/gid the program runs as.
    pub sandbox_uid: u32,
    pub sandbox_gid: u32,
    /// Bytes a sandbox may write in all: a run's /output, or a session's /workspace and
    /// /tmpfs together, each a file system of this size. Past it writes fail with ENOSPC and
    /// the result says `writable_area_full` (a run's outputs are then not published).
    pub max_total_output_bytes: u64,
    /// Session tool limits.
    pub session: SessionConfig,
    /// Limits applied when a request leaves them at 0.
    pub defaults: LimitsTable,
    /// Limits no request may exceed.
    pub max: LimitsTable,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionConfig {
    /// ReadFile cap (default and maximum).
    pub read_max_bytes: u64,
    pub glob_max_results: u32,
    pub grep_max_matches: u32,
    /// Exec stdout/stderr cap each.
    pub exec_max_output_bytes: u64,
    /// Pack archive cap.
    pub max_archive_bytes: u64,
    /// Files visited by one Glob/Grep/Pack walk at most.
    pub max_walk_entries: u64,
    /// Time a git clone of OpenSession may take.
    pub git_timeout_ms: u64,
    /// A session no call has used for this long (none in flight) is closed by the runner,
    /// freeing its slot: a client that died never closes its sessions. 0 = never.
    pub idle_timeout_ms: u64,
    /// Largest snapshot PauseSession makes and ResumeSession takes.
    pub max_snapshot_bytes: u64,
    /// Who makes the session's writable areas.
    pub areas: AreasChoice,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            read_max_bytes: 4 * 1024 * 1024,
            glob_max_results: 1000,
            grep_max_matches: 500,
            exec_max_output_bytes: 1024 * 1024,
            max_archive_bytes: 200 * 1024 * 1024,
            max_walk_entries: 200_000,
            git_timeout_ms: 120_000,
            idle_timeout_ms: 900_000,
            max_snapshot_bytes: 4 * 1024 * 1024 * 1024,
            areas: AreasChoice::Auto,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:50053".into(),
            tls: cairn_server::TlsConfig::default(),
            insecure_listen: false,
            metrics_listen: String::new(),
            telemetry: cairn_server::TelemetryConfig::default(),
            access: Default::default(),
            drain_deadline_s: cairn_server::drain::DEFAULT_DEADLINE.as_secs(),
            runner_id: String::new(),
            backend: BackendChoice::Auto,
            image: SANDBOX_IMAGE.into(),
            allowed_images: vec![SANDBOX_IMAGE.into(), TOOLCHAIN_IMAGE.into()],
            container_prefix: "cairn_".into(),
            container_suffix: "_runner".into(),
            work_root: std::env::temp_dir().join("cairn-sandbox-runner"),
            pool_size: 0,
            network_allowed: false,
            docker_network: "bridge".into(),
            sweep_all_prefixed: false,
            kill_grace_ms: 2000,
            heartbeat_interval_ms: 5000,
            max_sessions: 64,
            max_concurrent_runs: 0,
            queue_depth: 64,
            queue_timeout_ms: 60_000,
            require_limits: false,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            bwrap: "bwrap".into(),
            runsc: "runsc".into(),
            gvisor_platform: "ptrace".into(),
            gvisor_checkpoint_compression: "flate-best-speed".into(),
            gvisor_rootfs_cache: PathBuf::new(),
            sandbox_uid: 10001,
            sandbox_gid: 10001,
            max_total_output_bytes: 256 * 1024 * 1024,
            session: SessionConfig::default(),
            defaults: LimitsTable::default(),
            max: LimitsTable::default(),
        }
    }
}

/// `CAIRN_SANDBOX_RUNNER_<KEY>` overrides; an unknown name is refused.
pub const ENV: Env = Env {
    prefix: ENV_PREFIX,
    unknown: UnknownVars::Refuse,
    aliases: &[],
};

impl Config {
    /// Reads `path` (if any), then applies the environment overrides, then checks.
    pub fn load(path: Option<&Path>) -> Result<Config> {
        let config: Config = ENV.load(path).map_err(config_error)?;
        config.check()?;
        Ok(config)
    }

    /// Sets one key (`pool_size`, `defaults.timeout_ms`) from its textual value (flags).
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        config::set(self, key, value).map_err(config_error)
    }

    pub fn check(&self) -> Result<()> {
        self.telemetry.check().map_err(Error::Config)?;
        self.default_limits().check_against(&self.max_limits())?;
        for (name, value) in [
            ("container_prefix", &self.container_prefix),
            ("container_suffix", &self.container_suffix),
        ] {
            if !value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
            {
                return Err(Error::Config(format!(
                    "{name} {value:?} may only hold [A-Za-z0-9_.-]"
                )));
            }
        }
        for (key, value) in std::iter::once(("image", &self.image))
            .chain(self.allowed_images.iter().map(|i| ("allowed_images", i)))
        {
            if !is_image_name(value) {
                return Err(Error::Config(format!(
                    "{key}: {value:?} is not an image name (like cairn-toolchain:latest: [A-Za-z0-9._/:@-], up to 255 characters)"
                )));
            }
        }
        if self.docker_network.is_empty()
            || !self
                .docker_network
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        {
            return Err(Error::Config(format!(
                "docker_network {:?} must be a Docker network name of [A-Za-z0-9_.-] (default bridge)",
                self.docker_network
            )));
        }
        if !["ptrace", "kvm"].contains(&self.gvisor_platform.as_str()) {
            return Err(Error::Config(format!(
                "gvisor_platform {:?} must be ptrace or kvm",
                self.gvisor_platform
            )));
        }
        if !["none", "flate-best-speed"].contains(&self.gvisor_checkpoint_compression.as_str()) {
            return Err(Error::Config(format!(
                "gvisor_checkpoint_compression {:?} must be none or flate-best-speed",
                self.gvisor_checkpoint_compression
            )));
        }
        if self.session.areas == AreasChoice::Engine
            && matches!(self.backend, BackendChoice::Local | BackendChoice::Gvisor)
        {
            return Err(Error::Config(
                "[session] areas = \"engine\" needs the docker backend (the engine mounts the areas); use auto or runner".into(),
            ));
        }
        if self.container_prefix.is_empty() && self.sweep_all_prefixed {
            return Err(Error::Config(
                "sweep_all_prefixed needs a non-empty container_prefix".into(),
            ));
        }
        if !self.gvisor_rootfs_cache.as_os_str().is_empty()
            && !self.gvisor_rootfs_cache.is_absolute()
        {
            return Err(Error::Config(format!(
                "gvisor_rootfs_cache {:?} must be an absolute path (or empty for <work_root>/gvisor/rootfs)",
                self.gvisor_rootfs_cache
            )));
        }
        if self.queue_depth > 0 && self.queue_timeout_ms == 0 {
            return Err(Error::Config(
                "queue_timeout_ms must be positive while queue_depth is above 0 (set queue_depth = 0 to refuse at once instead of queueing)".into(),
            ));
        }
        if self.max_total_output_bytes < crate::limits::MIN_AREA_BYTES {
            return Err(Error::Config(format!(
                "max_total_output_bytes = {} is below {} (1 MiB): a sandbox needs room to write",
                self.max_total_output_bytes,
                crate::limits::MIN_AREA_BYTES
            )));
        }
        for (name, path) in [
            ("work_root", &self.work_root),
            ("cgroup_root", &self.cgroup_root),
        ] {
            if !path.is_absolute() {
                return Err(Error::Config(format!(
                    "{name} {path:?} must be an absolute path"
                )));
            }
        }
        Ok(())
    }

    /// The image a request runs in: the one it names when this runner allows it, else
    /// `image`. An image neither `image` nor in `allowed_images` is refused, naming the setting.
    pub fn image_for(&self, requested: &str) -> Result<String> {
        if requested.is_empty() || requested == self.image {
            return Ok(self.image.clone());
        }
        if self.allowed_images.iter().any(|i| i == requested) {
            return Ok(requested.to_owned());
        }
        Err(Error::ImageNotAllowed {
            image: requested.to_owned(),
            // `image` once, even when allowed_images names it too.
            allowed: std::iter::once(self.image.clone())
                .chain(
                    self.allowed_images
                        .iter()
                        .filter(|i| **i != self.image)
                        .cloned(),
                )
                .collect(),
        })
    }

    /// Refuses network for a request when this runner's policy forbids it.
    pub fn check_network(&self, requested: bool) -> Result<()> {
        if requested && !self.network_allowed {
            return Err(Error::NetworkNotAllowed);
        }
        Ok(())
    }

    /// `max_concurrent_runs`, or when 0 the value derived from this host.
    pub fn concurrent_runs(&self) -> usize {
        match self.max_concurrent_runs {
            0 => derived_max_concurrent_runs(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
                memory_bytes(),
            ),
            n => n,
        }
    }

    pub fn default_limits(&self) -> Limits {
        self.defaults.over(Limits::DEFAULTS)
    }

    pub fn max_limits(&self) -> Limits {
        self.max.over(Limits::MAXIMA)
    }
}

/// The default `max_concurrent_runs`: min(4 × `cpus`, `memory` / 256 MiB), at least 2. A
/// sandbox mostly waits (on I/O, on a model), hence four per CPU; 256 MiB each keeps the host
/// out of swap when half the sandboxes use half their default memory.
pub fn derived_max_concurrent_runs(cpus: usize, memory: u64) -> usize {
    let by_memory = usize::try_from(memory / (256 * 1024 * 1024)).unwrap_or(usize::MAX);
    (4 * cpus).min(by_memory).max(2)
}

/// The characters of a Docker image reference (name, optional tag or digest), at most 255,
/// starting with a letter or digit. The engine checks the rest of the grammar. (cairn-graph checks
/// `image:` of graph nodes with the same rule: services share no code, only the protos.)
pub fn is_image_name(s: &str) -> bool {
    s.len() <= 255
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._/:@-".contains(&b))
}

/// MemTotal of /proc/meminfo (8 GiB when unreadable).
fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(8 << 30, |kib| kib * 1024)
}

fn config_error(e: config::ConfigError) -> Error {
    Error::Config(e.to_string())
}
