//! The gVisor backend: each run in its own gVisor sandbox (`runsc run` on an OCI bundle the
//! runner writes), each session in one sandbox for its life (gvisor_session.rs), so the
//! program talks to gVisor's user-space kernel, never to the host's. The root is the sandbox
//! image's file system (gvisor_rootfs.rs), read-only and served through gVisor's file proxy:
//! nothing of the host's own files; /input read-only, /output (or /workspace and /tmpfs of a
//! session) writable areas of bounded size, /tmp a private tmpfs; the program runs as
//! the sandbox uid with no capabilities and an environment of its own only. No network
//! (`--network=none` and a new network namespace) unless the job has it (`--network=host`:
//! sockets of the runner's network namespace, as on the local backend). rlimits as the other
//! backends set them (gVisor enforces RLIMIT_NPROC over its whole kernel, as every process
//! there runs as the sandbox uid); memory and cpu over the whole sandbox through the cgroups
//! runsc makes (`cairn-gvisor-<runner_id>/<id>`) when the host has them.
//!
//! Kill semantics: on timeout `runsc kill --all <id> TERM` (the waiter, below, ignores it), the
//! grace, then `KILL`; the sandbox ends when its first process does, taking every other
//! process with it. `runsc run` gets SIGKILL when the runner dies (parent-death signal, armed
//! before it is exec'd), and its attached sandbox dies with it; the runner's watchdog kills
//! whatever process still names the state directory. Once the program's exit status is in,
//! the reply goes; `runsc run` ends, then `runsc delete --force` and the bundle directory go,
//! in the background (shutdown waits for them). runsc keeps its state in
//! `<work_root>/gvisor/state` (its `--root`), so a restarted runner finds and removes what an
//! earlier life left.
//!
//! Found on runsc 2022-12-19: a write to the host pipe behind stdout/stderr may return short
//! (64 KiB) although the pipe is blocking to the program, and a program that does not retry
//! (Python's unbuffered text streams) loses the rest; so every sandbox's first process is the
//! waiter (waiter.py, as in the pools), which starts the program with stdout and stderr on
//! pipes of gVisor's own and sends their bytes, then the exit status, in frames on its stdout
//! (`Frames`), and kills whatever the program left running once it has exited (as the end of
//! its sandbox would). `--platform=kvm` hangs in nested virtualisation (ptrace works); its
//! statx refuses AT_NO_AUTOMOUNT (EINVAL), so coreutils' `ls` and `stat` fail inside while
//! Python's os.stat, find and shells work; `--network=sandbox` refuses the root network
//! namespace; `--rootless` is not needed as root.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_proto::StdStream;
use time::OffsetDateTime;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStderr, ChildStdout, Command};
use tokio::time::sleep_until;

use super::gvisor_pool::{runs_in_the_waiter, GvisorSource, Waiting};
use super::gvisor_session::SessionBox;
pub(super) use super::gvisor_spec::Spec;
use super::gvisor_spec::{network_flag, oci_config};
use super::local::{collect, find_program, rlimits, stage_inputs, Collected, TaskDir};
use super::local_pool::{send_go, Go, WAITER};
use super::{die_with_runner, keep, remove_dir, Live, Watchdog};
use crate::admission::Queued;
use crate::capture::Capture;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::job::{Job, Outcome};
use crate::pool::{Pool, Pooled, Served};

pub struct GvisorBackend {
    pub(super) base: Arc<Base>,
    /// Ids of running sandboxes (killed at shutdown).
    running: Arc<Mutex<HashSet<String>>>,
    pool: Option<Arc<Pool<GvisorSource>>>,
    /// The sandboxes of open sessions, by session id.
    pub(super) sessions: Mutex<HashMap<String, SessionBox>>,
    /// Kills the runsc processes of this runner's state directory once the runner is gone.
    _watchdog: Watchdog,
}

/// Sandbox deletions under way in the background (the reply does not wait for them; shutdown
/// does).
#[derive(Default)]
pub(super) struct Pending {
    count: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

impl Pending {
    /// Waits (at most `limit`) until no deletion is under way.
    async fn settle(&self, limit: Duration) {
        use std::sync::atomic::Ordering;
        let t0 = Instant::now();
        while self.count.load(Ordering::SeqCst) > 0 && t0.elapsed() < limit {
            let _ = tokio::time::timeout(Duration::from_millis(100), self.idle.notified()).await;
        }
    }
}

/// What every sandbox of this backend is built from.
pub(super) struct Base {
    pub(super) config: Arc<Config>,
    pub(super) runsc: PathBuf,
    /// runsc's `--root`: its state of this runner's sandboxes.
    pub(super) state: PathBuf,
    /// `<id>/config.json` of each sandbox.
    bundles: PathBuf,
    /// The sandbox image's root file system, shared read-only by every sandbox.
    rootfs: PathBuf,
    /// Does runsc put sandboxes in cgroups with their memory and cpu limits here?
    cgroups: bool,
    /// Flags of `runsc checkpoint` beyond the image path (the compression, when this runsc
    /// takes one).
    pub(super) checkpoint_flags: Vec<String>,
    pending: Arc<Pending>,
}

pub(super) struct Finished {
    pub(super) exit_code: i32,
    pub(super) timed_out: bool,
    pub(super) oom_killed: bool,
    pub(super) started_at: OffsetDateTime,
    pub(super) duration_ms: u64,
    pub(super) stdout: Capture,
    pub(super) stderr: Capture,
}

impl GvisorBackend {
    /// Finds runsc, makes (or finds) the image's root file system, and checks that runsc can
    /// run a sandbox on it here (with cgroups when it can).
    pub async fn new(config: Arc<Config>, queued: Queued) -> Result<GvisorBackend> {
        let runsc = find_program(&config.runsc).ok_or_else(|| {
            Error::NoIsolation(format!(
                "gVisor's runsc ({:?}) is not installed: apt-get install runsc, or set `runsc` to its path",
                config.runsc
            ))
        })?;
        if !rustix::process::geteuid().is_root() {
            return Err(Error::NoIsolation(
                "the gvisor backend needs the runner to run as root (runsc creates namespaces and cgroups)"
                    .into(),
            ));
        }
        let dir = config.work_root.join("gvisor");
        let cache = match config.gvisor_rootfs_cache.as_os_str().is_empty() {
            true => dir.join("rootfs"),
            false => config.gvisor_rootfs_cache.clone(),
        };
        let rootfs = super::gvisor_rootfs::prepare(&cache, &config.image).await?;
        let mut base = Base {
            runsc,
            state: dir.join("state"),
            bundles: dir.join("bundles"),
            rootfs,
            cgroups: true,
            checkpoint_flags: Vec::new(),
            pending: Arc::default(),
            config,
        };
        // Before any runsc process of this life exists (see Watchdog::start).
        let watchdog = Watchdog::start(format!("--root={}", base.state.display()).as_ref())?;
        for d in [&base.state, &base.bundles] {
            std::fs::create_dir_all(d).map_err(Error::io(format!("creating {}", d.display())))?;
        }
        let dirs = ["usr/local/bin", "usr/bin", "bin"];
        if !dirs.iter().any(|d| {
            base.rootfs
                .join(d)
                .join("python3")
                .symlink_metadata()
                .is_ok()
        }) {
            return Err(Error::NoIsolation(format!(
                "image {:?} has no python3, which the gvisor backend needs (the first process of each sandbox is a small Python program that relays the output): use an image with python3, such as the one deploy/images/ builds",
                base.config.image
            )));
        }
        base.probe()?;
        base.checkpoint_flags = checkpoint_flags(&base.runsc, &base.config).await;
        let base = Arc::new(base);
        let pool = (base.config.pool_size > 0)
            .then(|| Arc::new(Pool::new(GvisorSource::new(base.clone()), queued)));
        Ok(GvisorBackend {
            base,
            running: Arc::default(),
            pool,
            sessions: Mutex::default(),
            _watchdog: watchdog,
        })
    }

    pub fn start_pool(&self) {
        if let Some(pool) = &self.pool {
            pool.clone().fill();
        }
    }

    /// Waiting sandboxes ready now.
    pub fn warm_sandboxes(&self) -> usize {
        self.pool.as_ref().map(|p| p.ready_count()).unwrap_or(0)
    }

    /// Memory and cpu over whole sandboxes need cgroups; pids hold through RLIMIT_NPROC in
    /// gVisor's kernel, where every process is the sandbox uid's.
    pub fn limits_enforced(&self) -> bool {
        self.base.cgroups
    }

    /// Kills and deletes every sandbox in runsc's state directory (an earlier life's), removes
    /// their bundles and cgroups; returns how many sandboxes there were.
    pub async fn sweep(&self) -> usize {
        let ids = self.base.list().await;
        for id in &ids {
            self.base.destroy(id).await;
        }
        if let Ok(entries) = std::fs::read_dir(&self.base.bundles) {
            for e in entries.flatten() {
                remove_dir(&e.path()).await;
            }
        }
        self.base.remove_runner_cgroups();
        ids.len()
    }

    pub async fn run(&self, job: &Job, live: Option<&Live>) -> Result<Outcome> {
        let pooled = |waiting| self.run_pooled(waiting, job, live);
        let _cold = match Pool::serve(self.pool.as_ref(), |p| p.fits(job), pooled).await {
            Served::Done(outcome) => return outcome,
            Served::Cold(hold) => hold,
        };
        let config = &self.base.config;
        let t0 = Instant::now();
        let task = TaskDir::for_job(config, job).await?;
        tracing::debug!(job = %job.id, ms = t0.elapsed().as_secs_f64() * 1e3, "gvisor cold run: task directory ready");
        let (input, output) = (task.input(), task.output());
        let env = job.environment();
        let spec = Spec {
            id: job.id.clone(),
            root: false,
            binds: vec![(input, "/input", false), (output.clone(), "/output", true)],
            network: job.network,
            limits: &job.limits,
            timeout: Duration::from_millis(job.limits.timeout_ms),
            cwd: "/tmp",
            env: &env,
            argv: job.argv(),
        };
        let caps = (job.limits.max_stdout_bytes, job.limits.max_stderr_bytes);
        let done = self.sandboxed(&spec, caps, live).await?;
        let outputs = collect(output, job).await?;
        drop(task);
        Ok(outcome(done, outputs, false))
    }

    /// Runs `job` in a waiting sandbox: stages its inputs, sends the go line, supervises.
    async fn run_pooled(
        &self,
        waiting: Waiting,
        job: &Job,
        live: Option<&Live>,
    ) -> std::result::Result<Outcome, Pooled> {
        let Waiting {
            mut sandbox,
            task,
            id,
        } = waiting;
        let output = task.path.join("output");
        if !job.inputs.is_empty() {
            stage_inputs(&task.input(), job)
                .await
                .map_err(Pooled::Failed)?;
        }
        let timeout = Duration::from_millis(job.limits.timeout_ms);
        let (argv, env) = (job.argv(), job.environment());
        let go = Go {
            argv: &argv,
            env: &env,
            cwd: "/tmp",
            rlimits: rlimits(&job.limits, timeout).into_iter().collect(),
            relay: true,
            reap: true,
        };
        let (started_at, t0) = send_go(&mut sandbox.child, go)
            .await
            .map_err(Pooled::Unstarted)?;
        let _registered = Registered::new(&self.running, &id);
        let caps = (job.limits.max_stdout_bytes, job.limits.max_stderr_bytes);
        let done = self
            .base
            .supervise(sandbox, started_at, t0, timeout, caps, live)
            .await
            .map_err(Pooled::Failed)?;
        let outputs = collect(output, job).await.map_err(Pooled::Failed)?;
        drop(task);
        Ok(outcome(done, outputs, true))
    }

    /// Writes the bundle, starts the sandbox with the waiter as its first process, sends it
    /// the program (relayed, see the module comment), supervises it; nothing of it is left
    /// after.
    async fn sandboxed(
        &self,
        spec: &Spec<'_>,
        caps: (u64, u64),
        live: Option<&Live>,
    ) -> Result<Finished> {
        let _registered = Registered::new(&self.running, &spec.id);
        // A Python job that starts as a pooled warm one would runs in a fork of the waiter,
        // started as that job's interpreter (its environment and directory): one
        // interpreter's start instead of two.
        let (mode, waiter_env, cwd) = match runs_in_the_waiter(&spec.argv, spec.env) {
            true => (WaiterMode::JobInterpreter, spec.env.to_vec(), spec.cwd),
            false => (WaiterMode::Now, waiter_env(), "/"),
        };
        let waiter = Spec {
            id: spec.id.clone(),
            root: false,
            binds: spec.binds.clone(),
            network: spec.network,
            limits: spec.limits,
            timeout: spec.timeout,
            cwd,
            env: &waiter_env,
            argv: waiter_argv(mode),
        };
        let t0 = Instant::now();
        let started_at = OffsetDateTime::now_utc();
        let mut sandbox = self
            .base
            .start(&waiter, Stdio::piped())
            .await
            .map_err(|e| e.0)?;
        let go = Go {
            argv: &spec.argv,
            env: spec.env,
            cwd: spec.cwd,
            rlimits: rlimits(spec.limits, spec.timeout).into_iter().collect(),
            relay: true,
            reap: true,
        };
        let spawned = t0.elapsed();
        send_go(&mut sandbox.child, go).await?;
        let done = self
            .base
            .supervise(sandbox, started_at, t0, spec.timeout, caps, live)
            .await;
        tracing::debug!(
            job = %spec.id,
            in_the_waiter = mode == WaiterMode::JobInterpreter,
            bundle_and_spawn_ms = spawned.as_secs_f64() * 1e3,
            to_exit_status_ms = t0.elapsed().as_secs_f64() * 1e3,
            "gvisor cold run: sandbox"
        );
        done
    }

    /// Removes the waiting sandboxes, then kills every running one (their supervisors
    /// delete them), then the runner's cgroup directories.
    pub async fn shutdown(&self) {
        if let Some(pool) = &self.pool {
            pool.close().await;
        }
        let sessions: Vec<SessionBox> = self
            .sessions
            .lock()
            .map(|mut m| m.drain().map(|(_, s)| s).collect())
            .unwrap_or_default();
        for s in sessions {
            s.close().await;
        }
        let ids: Vec<String> = self
            .running
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for id in ids {
            self.base.kill(&id, "KILL").await;
        }
        // Their supervisors end and queue the deletions; then those finish.
        let t0 = Instant::now();
        while self.running.lock().map(|s| !s.is_empty()).unwrap_or(false)
            && t0.elapsed() < Duration::from_secs(10)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.base.pending.settle(Duration::from_secs(15)).await;
        self.base.remove_runner_cgroups();
    }
}

/// A started sandbox: `runsc run` and what to remove when it is over. Dropped before
/// `finish`, everything goes in the background (runsc run is killed on drop, its sandbox
/// with it).
pub(super) struct Sandbox {
    pub(super) child: Child,
    pub(super) id: String,
    base: Arc<BaseRef>,
    done: bool,
}

/// What a dropped sandbox needs to clean up after itself.
pub(super) struct BaseRef {
    runsc: PathBuf,
    global: Vec<String>,
    bundles: PathBuf,
    pending: Arc<Pending>,
}

/// Why a sandbox did not start, with its task untouched.
pub(super) struct StartError(pub(super) Error);

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(pid) = self.child.id() {
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        self.base.delete_later(&self.id);
    }
}

impl Sandbox {
    /// In the background: lets `runsc run` end (its first process has ended or is ending;
    /// killed after 5 s), then deletes the sandbox. Shutdown waits for it.
    pub(super) fn end_later(mut self) {
        use std::sync::atomic::Ordering;
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pending = self.base.pending.clone();
        pending.count.fetch_add(1, Ordering::SeqCst);
        rt.spawn(async move {
            let ended = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
            if ended.is_err() {
                let _ = self.child.start_kill();
                let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
            }
            self.done = true;
            self.base.delete(&self.id).await;
            pending.count.fetch_sub(1, Ordering::SeqCst);
            pending.idle.notify_waiters();
        });
    }

    /// Kills `runsc run` (its sandbox dies with it), waits for it, deletes the sandbox.
    pub(super) async fn destroy(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        self.done = true;
        self.base.delete(&self.id).await;
    }
}

impl BaseRef {
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.runsc);
        cmd.env_clear().args(&self.global);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    }

    /// `delete` in the background; shutdown waits for it.
    fn delete_later(self: &Arc<Self>, id: &str) {
        use std::sync::atomic::Ordering;
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.pending.count.fetch_add(1, Ordering::SeqCst);
        let (me, id) = (self.clone(), id.to_owned());
        rt.spawn(async move {
            me.delete(&id).await;
            me.pending.count.fetch_sub(1, Ordering::SeqCst);
            me.pending.idle.notify_waiters();
        });
    }

    /// `runsc delete --force` (kills what still runs) and the bundle directory.
    async fn delete(&self, id: &str) {
        let mut cmd = self.command();
        cmd.args(["delete", "--force", id]);
        if let Ok(Ok(out)) = tokio::time::timeout(Duration::from_secs(10), cmd.output()).await {
            let err = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() && !err.contains("does not exist") {
                tracing::warn!(sandbox = id, error = %err.trim(), "runsc delete failed");
            }
        }
        remove_dir(&self.bundles.join(id)).await;
    }
}

impl Base {
    pub(super) fn global_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--root={}", self.state.display()),
            format!("--platform={}", self.config.gvisor_platform),
        ];
        if !self.cgroups {
            args.push("--ignore-cgroups".into());
        }
        args
    }

    fn cleaner(&self) -> Arc<BaseRef> {
        Arc::new(BaseRef {
            runsc: self.runsc.clone(),
            global: self.global_args(),
            bundles: self.bundles.clone(),
            pending: self.pending.clone(),
        })
    }

    /// Runs `true` in a sandbox once, with cgroups, else without them; fails when neither works.
    fn probe(&mut self) -> Result<()> {
        let env: Vec<(String, String)> = Vec::new();
        let limits = self.config.default_limits();
        let mut why = String::new();
        for cgroups in [true, false] {
            self.cgroups = cgroups;
            let id = format!("probe-{}", uuid::Uuid::now_v7().simple());
            let spec = Spec {
                id: id.clone(),
                root: false,
                binds: Vec::new(),
                network: false,
                limits: &limits,
                timeout: Duration::from_secs(30),
                cwd: "/",
                env: &env,
                argv: vec!["/bin/true".into()],
            };
            let bundle = self.write_bundle_sync(&spec)?;
            let mut cmd = std::process::Command::new(&self.runsc);
            cmd.env_clear()
                .args(self.global_args())
                .arg(network_flag(false))
                .args(["run", "--bundle"])
                .arg(&bundle)
                .arg(&id);
            let out = output_within(cmd, PROBE_LIMIT);
            let _ = std::process::Command::new(&self.runsc)
                .env_clear()
                .args(self.global_args())
                .args(["delete", "--force", &id])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let _ = std::fs::remove_dir_all(&bundle);
            match out {
                Ok(o) if o.status.success() => {
                    if !cgroups {
                        tracing::warn!(reason = %why, "gvisor backend: runsc cannot use cgroups here; memory and cpu are limited per process only and runs report limits_enforced: false");
                    }
                    return Ok(());
                }
                Ok(o) => why = String::from_utf8_lossy(&o.stderr).trim().to_owned(),
                Err(e) => why = e.to_string(),
            }
        }
        Err(Error::NoIsolation(format!(
            "runsc ({}) cannot run a sandbox here: {why}. Run the runner as root; with gvisor_platform = \"kvm\", /dev/kvm must work (ptrace is the default)",
            self.runsc.display()
        )))
    }

    fn runner_cgroup(&self) -> String {
        format!("cairn-gvisor-{}", self.config.runner_id)
    }

    /// `<bundles>/<id>/config.json`, readable by root only.
    fn write_bundle_sync(&self, spec: &Spec<'_>) -> Result<PathBuf> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.bundles.join(&spec.id);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(Error::io(format!("creating bundle {}", dir.display())))?;
        let cgroup = self.cgroups.then(|| self.runner_cgroup());
        let user = (self.config.sandbox_uid, self.config.sandbox_gid);
        let config = oci_config(spec, &self.rootfs, cgroup.as_deref(), user);
        let text = serde_json::to_vec(&config)
            .map_err(|e| Error::Sandbox(format!("encoding the OCI spec: {e}")))?;
        std::fs::write(dir.join("config.json"), text)
            .map_err(Error::io(format!("writing {}/config.json", dir.display())))?;
        Ok(dir)
    }

    /// Writes the bundle and starts `runsc run` (its stdout and stderr piped) with `stdin`.
    pub(super) async fn start(
        self: &Arc<Self>,
        spec: &Spec<'_>,
        stdin: Stdio,
    ) -> std::result::Result<Sandbox, StartError> {
        self.launch(spec, stdin, None).await
    }

    /// `start`, with `runsc restore` from the checkpoint in `image` (a directory) when given:
    /// the sandbox goes on from its checkpointed memory and processes.
    pub(super) async fn launch(
        self: &Arc<Self>,
        spec: &Spec<'_>,
        stdin: Stdio,
        image: Option<&std::path::Path>,
    ) -> std::result::Result<Sandbox, StartError> {
        let bundle = self.write_bundle_sync(spec).map_err(StartError)?;
        let mut cmd = Command::new(&self.runsc);
        // runsc's environment reaches nothing inside (the program gets the spec's), but it
        // gets none of the runner's either.
        cmd.env_clear()
            .args(self.global_args())
            // `--network=sandbox` (gVisor's own stack) refuses the root network namespace, where
            // runners usually are; `host` hands the sandbox sockets of the runner's namespace.
            .arg(network_flag(spec.network))
            .args(match image {
                Some(dir) => vec![
                    "restore".to_owned(),
                    format!("--image-path={}", dir.display()),
                ],
                None => vec!["run".to_owned()],
            })
            .arg("--bundle")
            .arg(&bundle)
            .arg(&spec.id)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        die_with_runner(&mut cmd);
        match cmd.spawn() {
            Ok(child) => Ok(Sandbox {
                child,
                id: spec.id.clone(),
                base: self.cleaner(),
                done: false,
            }),
            Err(e) => {
                remove_dir(&bundle).await;
                Err(StartError(Error::io("starting runsc")(e)))
            }
        }
    }

    /// Captures a started sandbox's output (the waiter's frames), enforces the timeout from
    /// `t0` (SIGTERM to every process, grace, SIGKILL), reads whether memory ran out. Returns
    /// once the waiter has sent the program's exit status; the sandbox ends and is deleted in
    /// the background.
    pub(super) async fn supervise(
        &self,
        mut sandbox: Sandbox,
        started_at: OffsetDateTime,
        t0: Instant,
        timeout: Duration,
        caps: (u64, u64),
        live: Option<&Live>,
    ) -> Result<Finished> {
        let (Some(mut out), Some(mut err)) =
            (sandbox.child.stdout.take(), sandbox.child.stderr.take())
        else {
            return Err(Error::Sandbox("runsc started without pipes".into()));
        };
        let grace = Duration::from_millis(self.config.kill_grace_ms);
        let target = Target::Sandbox(&sandbox.id);
        let relayed = self
            .pump(&mut out, &mut err, t0 + timeout, grace, caps, live, target)
            .await?;
        let Relayed {
            status,
            step,
            stdout,
            stderr,
        } = relayed;
        let exit_code = match status {
            Some(code) => code,
            // No status: the sandbox ended without its waiter (killed, or runsc failed).
            None => {
                let status = tokio::select! {
                    s = sandbox.child.wait() => s.map_err(Error::io("waiting for runsc"))?,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {
                        let _ = sandbox.child.start_kill();
                        sandbox.child.wait().await.map_err(Error::io("waiting for runsc"))?
                    }
                };
                status.code().unwrap_or_else(|| {
                    use std::os::unix::process::ExitStatusExt;
                    128 + status.signal().unwrap_or(0)
                })
            }
        };
        let duration_ms = t0.elapsed().as_millis() as u64;
        let oom_killed = self.oom_kills(&sandbox.id) > 0;
        // Its program has ended: the reply need not wait for the sandbox to go.
        sandbox.end_later();
        Ok(Finished {
            exit_code: if step > 0 { -1 } else { exit_code },
            timed_out: step > 0,
            oom_killed,
            started_at,
            duration_ms,
            stdout,
            stderr,
        })
    }

    /// Reads a relay's frames (`out`) and runsc's own stderr (`err`) until the exit frame or
    /// the end of both; from `deadline` on signals `target`: SIGTERM, SIGKILL after `grace`,
    /// and gives up 5 s later.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn pump(
        &self,
        out: &mut ChildStdout,
        err: &mut ChildStderr,
        deadline: Instant,
        grace: Duration,
        (max_stdout, max_stderr): (u64, u64),
        live: Option<&Live>,
        target: Target<'_>,
    ) -> Result<Relayed> {
        let mut frames = Frames::default();
        let mut stdout = Capture::new(max_stdout);
        let mut stderr = Capture::new(max_stderr);
        let (mut out_open, mut err_open) = (true, true);
        let mut obuf = vec![0u8; 64 * 1024];
        let mut ebuf = vec![0u8; 64 * 1024];
        let mut step = 0u8;
        let mut next = deadline;
        let mut status = None;
        while status.is_none() && (out_open || err_open) {
            tokio::select! {
                r = out.read(&mut obuf), if out_open => match r {
                    Ok(0) | Err(_) => out_open = false,
                    Ok(n) => {
                        for f in frames.feed(&obuf[..n])? {
                            match f {
                                Frame::Stdout(d) => keep(&mut stdout, &d, StdStream::Stdout, live).await,
                                Frame::Stderr(d) => keep(&mut stderr, &d, StdStream::Stderr, live).await,
                                Frame::Exit(code) => status = Some(code),
                            }
                        }
                    }
                },
                // runsc's own errors, and the waiter's before it relays anything.
                r = err.read(&mut ebuf), if err_open => match r {
                    Ok(0) | Err(_) => err_open = false,
                    Ok(n) => keep(&mut stderr, &ebuf[..n], StdStream::Stderr, live).await,
                },
                _ = sleep_until(next.into()) => {
                    match step {
                        0 => {
                            self.signal(target, "TERM").await;
                            next = Instant::now() + grace;
                        }
                        1 => {
                            self.signal(target, "KILL").await;
                            next = Instant::now() + Duration::from_secs(5);
                        }
                        _ => break,
                    }
                    step += 1;
                }
            }
        }
        Ok(Relayed {
            status,
            step,
            stdout,
            stderr,
        })
    }

    /// Sends `signal` (TERM or KILL) to what `target` names.
    pub(super) async fn signal(&self, target: Target<'_>, signal: &str) {
        match target {
            Target::Sandbox(id) => self.kill(id, signal).await,
            Target::Exec { sandbox, exec_id } => self.kill_exec(sandbox, exec_id, signal).await,
        }
    }

    /// `runsc kill --all <id> <signal>` (errors are the sandbox having ended already).
    async fn kill(&self, id: &str, signal: &str) {
        let mut cmd = self.cleaner().command();
        cmd.args(["kill", "--all", id, signal]);
        let _ = tokio::time::timeout(Duration::from_secs(10), cmd.output()).await;
    }

    async fn destroy(&self, id: &str) {
        self.kill(id, "KILL").await;
        self.cleaner().delete(id).await;
    }

    /// Ids in runsc's state directory.
    async fn list(&self) -> Vec<String> {
        let mut cmd = self.cleaner().command();
        cmd.args(["list", "--quiet"]).stdout(Stdio::piped());
        match tokio::time::timeout(Duration::from_secs(30), cmd.output()).await {
            Ok(Ok(out)) => String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The memory cgroup's OOM kill count of sandbox `id` (v1 `memory.oom_control`, v2
    /// `memory.events`); 0 without cgroups.
    fn oom_kills(&self, id: &str) -> u64 {
        if !self.cgroups {
            return 0;
        }
        let rel = format!("{}/{id}", self.runner_cgroup());
        let root = &self.config.cgroup_root;
        [
            root.join("memory").join(&rel).join("memory.oom_control"),
            root.join(&rel).join("memory.events"),
        ]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.strip_prefix("oom_kill "))
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
    }

    /// Lifts sandbox `id`'s CPU quota (v1 `cpu.cfs_quota_us`, v2 `cpu.max`) until the
    /// returned guard drops: `runsc checkpoint` saves the sandbox inside its own cgroup, and
    /// under a one-core quota its compression of 100 MiB of memory took 0.73-0.75 s where two
    /// cores take 0.36-0.41 s. The sandbox's tasks are stopped while it saves. None without
    /// cgroups, or when no quota file is found.
    pub(super) fn lift_cpu_quota(&self, id: &str) -> Option<CpuQuota> {
        if !self.cgroups {
            return None;
        }
        let rel = format!("{}/{id}", self.runner_cgroup());
        let root = &self.config.cgroup_root;
        let files = [
            (root.join("cpu").join(&rel).join("cpu.cfs_quota_us"), "-1"),
            (
                root.join("cpu,cpuacct").join(&rel).join("cpu.cfs_quota_us"),
                "-1",
            ),
            (root.join(&rel).join("cpu.max"), "max"),
        ];
        files.into_iter().find_map(|(file, unlimited)| {
            let was = std::fs::read_to_string(&file).ok()?.trim().to_owned();
            std::fs::write(&file, unlimited).ok()?;
            Some(CpuQuota { file, was })
        })
    }

    /// Removes `cairn-gvisor-<runner_id>` (and sandbox cgroups left in it) from every
    /// hierarchy under cgroup_root.
    fn remove_runner_cgroups(&self) {
        let name = self.runner_cgroup();
        let root = &self.config.cgroup_root;
        let mut parents = vec![root.join(&name)];
        if let Ok(entries) = std::fs::read_dir(root) {
            parents.extend(entries.flatten().map(|e| e.path().join(&name)));
        }
        for parent in parents {
            if let Ok(kids) = std::fs::read_dir(&parent) {
                for kid in kids.flatten() {
                    if kid.file_type().is_ok_and(|t| t.is_dir()) {
                        let _ = std::fs::remove_dir(kid.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(&parent);
        }
    }
}

/// A sandbox's CPU quota lifted for a checkpoint, put back when dropped (a sandbox the
/// checkpoint left running keeps its limit; a stopped one's cgroup is gone, and the write
/// fails unseen).
pub(super) struct CpuQuota {
    file: PathBuf,
    was: String,
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.file, &self.was);
    }
}

/// How the waiter starts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum WaiterMode {
    /// No "ready" line, the job follows at once (cold runs).
    Now,
    /// Says it is ready, waits for its job line (or end of file).
    Ready,
    /// As `Ready`, started as a plain `python3 -c` in a job's default environment
    /// (`job::base_environment`), so a Python job that would start the same runs in a fork of
    /// it (waiter.py).
    Warm,
    /// As `Warm` in the job's own environment, the job following at once (a cold run of a
    /// Python job, see `runs_in_the_waiter`).
    JobInterpreter,
}

/// `--compression=<gvisor_checkpoint_compression>` when `runsc checkpoint --help` lists the
/// flag; nothing for a runsc without it (Debian 12's, which always compresses).
async fn checkpoint_flags(runsc: &Path, config: &Config) -> Vec<String> {
    let help = Command::new(runsc)
        .env_clear()
        .args(["checkpoint", "--help"])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let help = match tokio::time::timeout(Duration::from_secs(10), help).await {
        Ok(Ok(out)) => [out.stdout, out.stderr].concat(),
        _ => Vec::new(),
    };
    let takes = String::from_utf8_lossy(&help).contains("-compression");
    tracing::debug!(runsc = %runsc.display(), takes_compression = takes, "runsc checkpoint flags");
    if takes {
        vec![format!(
            "--compression={}",
            config.gvisor_checkpoint_compression
        )]
    } else {
        Vec::new()
    }
}

/// The waiter's command line.
pub(super) fn waiter_argv(mode: WaiterMode) -> Vec<String> {
    let flags: &[&str] = match mode {
        WaiterMode::Warm | WaiterMode::JobInterpreter => &[],
        WaiterMode::Now | WaiterMode::Ready => &["-I", "-S"],
    };
    let mut argv: Vec<String> = std::iter::once("python3")
        .chain(flags.iter().copied())
        .chain(["-c", WAITER])
        .map(String::from)
        .collect();
    match mode {
        WaiterMode::Now => argv.push("--now".into()),
        WaiterMode::Warm => argv.push("--warm".into()),
        WaiterMode::JobInterpreter => argv.extend(["--warm".into(), "--now".into()]),
        WaiterMode::Ready => {}
    }
    argv
}

/// The waiter's own environment (the program gets its job's).
pub(super) fn waiter_env() -> Vec<(String, String)> {
    vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("LANG".into(), "C.UTF-8".into()),
    ]
}

/// Time the start-up probe may take (runsc on the kvm platform without a working /dev/kvm
/// hangs rather than failing).
const PROBE_LIMIT: Duration = Duration::from_secs(30);

/// Runs `cmd` (stdin and stdout null, stderr piped) for at most `limit`; killed after it.
fn output_within(
    mut cmd: std::process::Command,
    limit: Duration,
) -> std::io::Result<std::process::Output> {
    use std::io::Read;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let t0 = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} s", limit.as_secs()),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = Vec::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_end(&mut stderr);
    }
    Ok(std::process::Output {
        status,
        stdout: Vec::new(),
        stderr,
    })
}

/// What a relay's frames told: the exit status (None: it ended without sending one), how far
/// the timeout's steps went (0: not timed out), the output.
pub(super) struct Relayed {
    pub(super) status: Option<i32>,
    pub(super) step: u8,
    pub(super) stdout: Capture,
    pub(super) stderr: Capture,
}

/// What a timeout signals.
#[derive(Clone, Copy)]
pub(super) enum Target<'a> {
    /// Every process of the sandbox with this id.
    Sandbox(&'a str),
    /// The processes of one session command (gvisor_session.rs).
    Exec { sandbox: &'a str, exec_id: &'a str },
}

/// What the waiter sends on its stdout when it relays (waiter.py): the program's output, then
/// its exit status.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Frame {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(i32),
}

/// Splits the waiter's stdout into frames: a kind byte, a 4-byte big-endian length, the bytes.
#[derive(Default)]
pub(super) struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    /// Adds `data`; returns the frames it completes.
    pub(super) fn feed(&mut self, data: &[u8]) -> Result<Vec<Frame>> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(head) = self.buf.get(at..at + 5) {
            let mut len = [0u8; 4];
            len.copy_from_slice(&head[1..]);
            let len = u32::from_be_bytes(len) as usize;
            let kind = head[0];
            let Some(body) = self.buf.get(at + 5..at + 5 + len) else {
                break;
            };
            out.push(match (kind, body.len()) {
                (b'1', _) => Frame::Stdout(body.to_vec()),
                (b'2', _) => Frame::Stderr(body.to_vec()),
                (b'x', 4) => {
                    let mut code = [0u8; 4];
                    code.copy_from_slice(body);
                    Frame::Exit(i32::from_be_bytes(code))
                }
                _ => {
                    return Err(Error::Sandbox(format!(
                        "the sandbox's relay sent a malformed frame (kind {kind:#04x}, {len} bytes)"
                    )))
                }
            });
            at += 5 + len;
        }
        self.buf.drain(..at);
        Ok(out)
    }
}

fn outcome(done: Finished, collected: Collected, warm: bool) -> Outcome {
    Outcome {
        exit_code: done.exit_code,
        timed_out: done.timed_out,
        oom_killed: done.oom_killed,
        warm,
        started_at: done.started_at,
        duration_ms: done.duration_ms,
        stdout: done.stdout,
        stderr: done.stderr,
        outputs: collected.outputs,
        writable_area_full: collected.full,
    }
}

/// Keeps a running sandbox's id in the shutdown list while it runs.
struct Registered<'a> {
    set: &'a Mutex<HashSet<String>>,
    id: String,
}

impl<'a> Registered<'a> {
    fn new(set: &'a Mutex<HashSet<String>>, id: &str) -> Self {
        if let Ok(mut s) = set.lock() {
            s.insert(id.to_owned());
        }
        Registered {
            set,
            id: id.to_owned(),
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.set.lock() {
            s.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut f = vec![kind];
        f.extend_from_slice(&(body.len() as u32).to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    #[test]
    fn frames_split_anywhere_come_out_whole_and_in_order() {
        let mut wire = frame(b'1', b"hello\n");
        wire.extend(frame(b'2', b""));
        wire.extend(frame(b'2', &[7u8; 70_000]));
        wire.extend(frame(b'x', &(-9i32).to_be_bytes()));
        for cut in [1, 3, 5, 11, 4096] {
            let mut frames = Frames::default();
            let mut got = Vec::new();
            for piece in wire.chunks(cut) {
                got.extend(frames.feed(piece).unwrap_or_default());
            }
            assert_eq!(
                got,
                [
                    Frame::Stdout(b"hello\n".to_vec()),
                    Frame::Stderr(Vec::new()),
                    Frame::Stderr(vec![7u8; 70_000]),
                    Frame::Exit(-9),
                ],
                "cut every {cut} bytes"
            );
            assert!(frames.buf.is_empty());
        }
    }

    #[test]
    fn a_frame_of_unknown_kind_is_an_error() {
        let mut frames = Frames::default();
        assert!(frames.feed(&frame(b'q', b"x")).is_err());
        let mut frames = Frames::default();
        assert!(frames.feed(&frame(b'x', b"12345")).is_err());
    }
}
