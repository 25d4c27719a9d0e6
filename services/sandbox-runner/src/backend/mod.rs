//! The isolation backends: `docker` (containers through the Engine API), `local` (Linux
//! namespaces through bubblewrap) and `gvisor` (gVisor sandboxes through runsc). All run
//! one-shot jobs and session commands with the same kill semantics; `select` picks one and
//! refuses to run without isolation.

pub mod area;
mod cgroup;
pub mod docker;
mod docker_config;
mod docker_pool;
pub mod gvisor;
mod gvisor_pool;
mod gvisor_rootfs;
mod gvisor_session;
mod gvisor_spec;
pub mod local;
mod local_pool;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::{OutputChunk, StdStream};
use tokio::sync::mpsc;

use crate::admission::Queued;
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
    /// The task directory on this host (`workspace/`, `tmpfs/` inside unless the engine
    /// makes them).
    pub task_dir: PathBuf,
    /// Where `workspace/` and `tmpfs/` are, as the runner reaches them.
    pub areas: area::SessionAreas,
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
    /// Its warm pool refills only while no call is `queued` for admission.
    pub async fn select(config: Arc<Config>, queued: Queued) -> Result<Backend> {
        match config.backend {
            BackendChoice::Docker => Ok(Backend::Docker(
                docker::DockerBackend::connect(config, queued).await?,
            )),
            BackendChoice::Local => Ok(Backend::Local(local::LocalBackend::new(config, queued)?)),
            BackendChoice::Gvisor => Ok(Backend::Gvisor(
                gvisor::GvisorBackend::new(config, queued).await?,
            )),
            BackendChoice::Auto => {
                let docker_error =
                    match docker::DockerBackend::connect(config.clone(), queued.clone()).await {
                        Ok(d) => {
                            tracing::info!("backend auto: picked docker (the engine answered)");
                            return Ok(Backend::Docker(d));
                        }
                        Err(e) => e,
                    };
                if config.session.areas == crate::config::AreasChoice::Engine {
                    return Err(Error::Config(format!(
                        "[session] areas = \"engine\" needs the docker backend, which is unavailable: {docker_error}"
                    )));
                }
                match local::LocalBackend::new(config, queued) {
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
            Backend::Gvisor(g) => g.open_session(s).await,
            Backend::Local(_) => Ok(()),
        }
    }

    pub async fn exec(&self, s: &SessionSandbox, spec: &ExecSpec) -> Result<ExecOutcome> {
        match self {
            Backend::Docker(d) => d.exec(s, spec).await,
            Backend::Local(l) => l.exec(s, spec).await,
            Backend::Gvisor(g) => g.exec(s, spec).await,
        }
    }

    /// Does the engine make sessions' areas (docker, `[session] areas`)? Their container then
    /// starts before any file goes in, and [`Backend::session_areas`] says where they are.
    pub fn engine_areas(&self) -> bool {
        matches!(self, Backend::Docker(d) if d.engine_areas())
    }

    /// The areas of a started session whose engine made them.
    pub async fn session_areas(&self, s: &SessionSandbox) -> Result<area::SessionAreas> {
        match self {
            Backend::Docker(d) if d.engine_areas() => d.session_areas(s).await,
            _ => Ok(s.areas.clone()),
        }
    }

    /// Can a session's snapshot hold its memory and processes (gvisor), not files only?
    pub fn checkpoints_memory(&self) -> bool {
        matches!(self, Backend::Gvisor(_))
    }

    /// Saves the session's memory and processes into `dir` when the backend can (gvisor:
    /// `runsc checkpoint`, which stops the sandbox); false when it keeps files only.
    pub async fn checkpoint(&self, s: &SessionSandbox, dir: &Path) -> Result<bool> {
        match self {
            Backend::Gvisor(g) => g.checkpoint(s, dir).await.map(|()| true),
            Backend::Docker(_) | Backend::Local(_) => Ok(false),
        }
    }

    /// After `checkpoint` into `dir`: the open session's sandbox restored from it in place
    /// of the stopped one (gvisor only), so the session goes on.
    pub async fn restore_in_place(&self, s: &SessionSandbox, dir: &Path) -> Result<()> {
        match self {
            Backend::Gvisor(g) => g.restore_in_place(s, dir).await,
            Backend::Docker(_) | Backend::Local(_) => Ok(()),
        }
    }

    /// Does the session's sandbox run? Only gvisor's checkpoint stops one: true elsewhere.
    pub async fn session_running(&self, s: &SessionSandbox) -> bool {
        match self {
            Backend::Gvisor(g) => g.session_running(s).await,
            Backend::Docker(_) | Backend::Local(_) => true,
        }
    }

    /// Starts a session's sandbox from the checkpoint in `dir` (gvisor only).
    pub async fn restore_session(&self, s: &SessionSandbox, dir: &Path) -> Result<()> {
        match self {
            Backend::Gvisor(g) => g.restore_session(s, dir).await,
            Backend::Docker(_) | Backend::Local(_) => Err(Error::SnapshotMismatch(format!(
                "the {} backend restores files only, not memory and processes",
                self.name()
            ))),
        }
    }

    /// Do processes a session command leaves behind live on after it (not on local, where
    /// each command is a sandbox of its own)?
    pub fn keeps_background(&self) -> bool {
        !matches!(self, Backend::Local(_))
    }

    pub async fn close_session(&self, s: &SessionSandbox) -> Result<()> {
        match self {
            Backend::Docker(d) => d.remove_container(&s.name).await,
            Backend::Gvisor(g) => g.close_session(s).await,
            Backend::Local(_) => Ok(()),
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

/// Binds a sandbox's first host process (bwrap, `runsc run`) to the runner: SIGKILL when the
/// runner's thread that spawned it ends (PR_SET_PDEATHSIG, armed in the child before exec and
/// kept across the exec, as neither program is set-user-ID), and an immediate exit when the
/// runner died between the fork and that call (the child's parent is then another process).
/// The programs' own parent-death handling (bwrap's --die-with-parent) comes later, after
/// they have started sandbox processes; nothing may depend on it. Spawn on a runtime worker
/// thread (they live as long as the runner), never from a blocking-pool thread, which exits
/// when idle.
#[allow(unsafe_code)]
pub(crate) fn die_with_runner(cmd: &mut tokio::process::Command) {
    let runner = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec; prctl(2), getppid(2) and
    // _exit(2) are async-signal-safe, and it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != runner {
                libc::_exit(127);
            }
            Ok(())
        });
    }
}

/// What the watchdog runs (`sh -c`): waits for end of file on stdin, then kills, three times
/// 100 ms apart, every process whose command line contains $NEEDLE (passed in the
/// environment, so its own command line never matches).
const WATCHDOG: &str = r#"read -r _
for _ in 1 2 3; do
  for f in $(grep -lsaF -- "$NEEDLE" /proc/[0-9]*/cmdline); do
    p=${f#/proc/}; kill -9 "${p%/cmdline}" 2>/dev/null
  done
  sleep 0.1
done"#;

/// Kills a session command's processes when its call is dropped before it finished (client
/// deadline, cancel): the clean-up future runs on the current runtime unless disarmed first.
pub(crate) struct KillOnDrop(
    Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
);

impl KillOnDrop {
    /// Armed from here on: build it before the command can exist.
    pub(crate) fn new(kill: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        KillOnDrop(Some(Box::pin(kill)))
    }

    /// The command ended by itself: nothing to kill.
    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let (Some(kill), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(kill);
        }
    }
}

/// A process that outlives the runner to kill the host processes of its sandboxes: it reads
/// a pipe only the runner holds and, at end of file (the runner exited, whatever killed it),
/// SIGKILLs every process whose command line names `needle` (this runner's task directories,
/// or its runsc state). It covers the windows in which a sandbox's processes are not yet
/// bound to the runner's life: bubblewrap's child waits for its parent's go-ahead before it
/// asks for its own parent-death signal, and blocks forever if the parent died meanwhile.
pub(crate) struct Watchdog {
    _lease: std::process::ChildStdin,
}

impl Watchdog {
    /// Starts this life's watchdog, once an earlier life's (killing with the same `needle`, as
    /// it would kill this life's processes too) has finished.
    pub(crate) fn start(needle: &std::ffi::OsStr) -> Result<Watchdog> {
        use std::os::unix::process::CommandExt;
        let t0 = std::time::Instant::now();
        while earlier_watchdog(needle) && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", WATCHDOG, "cairn-watchdog"])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("NEEDLE", needle)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(Error::io("starting the sandbox watchdog (/bin/sh)"))?;
        let lease = child
            .stdin
            .take()
            .ok_or_else(|| Error::Sandbox("the sandbox watchdog has no stdin".into()))?;
        // Reaped by a thread of its own once the runner lets it go (or never: it ends with
        // the runner).
        std::thread::spawn(move || child.wait());
        Ok(Watchdog { _lease: lease })
    }
}

/// Is a watchdog with `needle` still running (not a zombie)?
fn earlier_watchdog(needle: &std::ffi::OsStr) -> bool {
    let mut wanted = b"NEEDLE=".to_vec();
    wanted.extend_from_slice(needle.as_encoded_bytes());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        let dir = e.path();
        let named = std::fs::read(dir.join("cmdline"))
            .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"cairn-watchdog"));
        named
            && std::fs::read(dir.join("environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == wanted.as_slice()))
    })
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

/// Removes a task directory (never follows links inside it), its writable areas unmounted
/// first; a file (a leftover archive) is removed too.
pub(crate) async fn remove_dir(path: &Path) {
    let owned = path.to_path_buf();
    let result = tokio::task::spawn_blocking(move || {
        area::unmount_below(&owned);
        match std::fs::symlink_metadata(&owned) {
            Ok(m) if !m.is_dir() => std::fs::remove_file(&owned),
            _ => std::fs::remove_dir_all(&owned),
        }
    })
    .await;
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
