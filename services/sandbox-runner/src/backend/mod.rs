//! The isolation backends: `docker` (containers through the Engine API), `local` (Linux
//! namespaces through bubblewrap) and `gvisor` (gVisor sandboxes through runsc). All run
//! one-shot jobs and session commands with the same kill semantics; `select` picks one and
//! refuses to run without isolation.

mod cgroup;
pub mod docker;
mod docker_pool;
pub mod gvisor;
mod gvisor_pool;
pub mod local;
mod local_pool;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::{OutputChunk, StdStream};
use tokio::sync::mpsc;

use crate::capture::Capture;
use crate::config::{BackendChoice, Config};
use crate::error::{Error, Result};
use crate::job::{Job, Outcome};
use crate::limits::Limits;

/// Where live stdout/stderr chunks of a streaming run go.
pub type Live = mpsc::Sender<OutputChunk>;

/// A command of a session (`bash -lc`).
#[derive(Debug, Clone)]
pub struct ExecSpec {
    pub command: String,
    /// Working directory inside the sandbox (absolute, under /workspace).
    pub workdir: String,
    pub timeout: Duration,
    pub max_output_bytes: u64,
}

/// What a session command did.
#[derive(Debug)]
pub struct ExecOutcome {
    pub exit_code: i32,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout: Capture,
    pub stderr: Capture,
}

/// A session's sandbox as the backend needs it.
#[derive(Debug, Clone)]
pub struct SessionSandbox {
    pub session_id: String,
    /// `<prefix><session_id><suffix>`.
    pub name: String,
    /// The task directory (`workspace/`, `tmpfs/` inside).
    pub task_dir: PathBuf,
    pub network: bool,
    /// The image (docker), allowed by the runner.
    pub image: String,
    pub limits: Limits,
    pub run_id: String,
    pub node_id: String,
}

pub enum Backend {
    Docker(docker::DockerBackend),
    Local(local::LocalBackend),
    Gvisor(gvisor::GvisorBackend),
}

impl Backend {
    /// Picks the backend `config.backend` names; `auto` prefers docker when an engine answers.
    pub async fn select(config: Arc<Config>) -> Result<Backend> {
        match config.backend {
            BackendChoice::Docker => Ok(Backend::Docker(
                docker::DockerBackend::connect(config).await?,
            )),
            BackendChoice::Local => Ok(Backend::Local(local::LocalBackend::new(config)?)),
            BackendChoice::Gvisor => Ok(Backend::Gvisor(gvisor::GvisorBackend::new(config)?)),
            BackendChoice::Auto => {
                let docker_error = match docker::DockerBackend::connect(config.clone()).await {
                    Ok(d) => {
                        tracing::info!("backend auto: picked docker (the engine answered)");
                        return Ok(Backend::Docker(d));
                    }
                    Err(e) => e,
                };
                match local::LocalBackend::new(config) {
                    Ok(l) => {
                        tracing::info!(docker = %docker_error, "backend auto: picked local (bubblewrap); docker is unavailable");
                        Ok(Backend::Local(l))
                    }
                    Err(local_error) => Err(Error::NoIsolation(format!(
                        "no isolation backend is available, refusing to run code unisolated: docker: {docker_error}; local: {local_error}. \
                         Start a Docker engine this runner can reach (DOCKER_HOST or /var/run/docker.sock), or install bubblewrap (apt-get install bubblewrap)"
                    ))),
                }
            }
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::Docker(_) => "docker",
            Backend::Local(_) => "local",
            Backend::Gvisor(_) => "gvisor",
        }
    }

    /// Warm containers (docker) or waiting sandboxes (local) ready now.
    pub fn warm_containers(&self) -> usize {
        match self {
            Backend::Docker(d) => d.warm_containers(),
            Backend::Local(l) => l.warm_sandboxes(),
            Backend::Gvisor(g) => g.warm_sandboxes(),
        }
    }

    /// Removes this runner's leftovers (containers, sandbox cgroups); returns how many.
    pub async fn sweep(&self) -> Result<usize> {
        match self {
            Backend::Docker(d) => d.sweep().await,
            Backend::Local(l) => Ok(l.sweep().await),
            Backend::Gvisor(g) => Ok(g.sweep().await),
        }
    }

    /// Are memory, pids and cpu limits enforced over whole sandboxes? Docker: always (the
    /// engine's cgroups); local and gvisor: when cgroups can be made here.
    pub fn limits_enforced(&self) -> bool {
        match self {
            Backend::Docker(_) => true,
            Backend::Local(l) => l.limits_enforced(),
            Backend::Gvisor(g) => g.limits_enforced(),
        }
    }

    /// Starts background work (the warm pool).
    pub fn start(&self) {
        match self {
            Backend::Docker(d) => d.start_pool(),
            Backend::Local(l) => l.start_pool(),
            Backend::Gvisor(g) => g.start_pool(),
        }
    }

    pub async fn run(&self, job: &Job, live: Option<&Live>) -> Result<Outcome> {
        match self {
            Backend::Docker(d) => d.run(job, live).await,
            Backend::Local(l) => l.run(job, live).await,
            Backend::Gvisor(g) => g.run(job, live).await,
        }
    }

    pub async fn open_session(&self, s: &SessionSandbox) -> Result<()> {
        match self {
            Backend::Docker(d) => d.open_session(s).await,
            Backend::Local(_) | Backend::Gvisor(_) => Ok(()),
        }
    }

    pub async fn exec(&self, s: &SessionSandbox, spec: &ExecSpec) -> Result<ExecOutcome> {
        match self {
            Backend::Docker(d) => d.exec(s, spec).await,
            Backend::Local(l) => l.exec(s, spec).await,
            Backend::Gvisor(g) => g.exec(s, spec).await,
        }
    }

    pub async fn close_session(&self, s: &SessionSandbox) -> Result<()> {
        match self {
            Backend::Docker(d) => d.remove_container(&s.name).await,
            Backend::Local(_) | Backend::Gvisor(_) => Ok(()),
        }
    }

    /// Kills and removes everything this runner started.
    pub async fn shutdown(&self) {
        match self {
            Backend::Docker(d) => d.shutdown().await,
            Backend::Local(l) => l.shutdown().await,
            Backend::Gvisor(g) => g.shutdown().await,
        }
    }
}

/// The environment of a session command (local and gvisor backends).
pub(crate) fn session_env() -> Vec<(String, String)> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/tmpfs"),
        ("LANG", "C.UTF-8"),
        ("PYTHONUNBUFFERED", "1"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .to_vec()
}

/// Keeps `data` in `capture` and sends the kept part live.
pub(crate) async fn keep(
    capture: &mut Capture,
    data: &[u8],
    stream: StdStream,
    live: Option<&Live>,
) {
    let kept = capture.push(data);
    if let (Some(tx), false) = (live, kept.is_empty()) {
        let _ = tx
            .send(OutputChunk {
                stream: stream as i32,
                data: bytes::Bytes::copy_from_slice(kept),
            })
            .await;
    }
}

/// Removes a task directory (never follows links inside it).
pub(crate) async fn remove_dir(path: &Path) {
    let owned = path.to_path_buf();
    let result = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&owned)).await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
        Ok(Err(e)) => {
            tracing::warn!(path = %path.display(), error = %e, "could not remove task directory")
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "task directory removal panicked")
        }
    }
}
