//! The local backend: each run or session command in its own bubblewrap sandbox: new mount,
//! pid, network (off), ipc, uts, user and cgroup namespaces; a root of the host's interpreters
//! only (/usr, /bin, /lib*, a few /etc files: `SHOWN_DIRS`, `SHOWN_ETC`), read-only; a private
//! /tmp; /input read-only and /output a fresh directory of bounded size (TaskDir); rlimits
//! through prlimit; the program as the sandbox uid, never root.
//! With `pool_size` > 0, jobs with the default memory and no network take a sandbox made
//! ahead of time whose process waits for them (local_pool.rs); the rest run cold.
//! Kill semantics: bwrap gets SIGKILL when the runner dies (its parent-death signal, armed
//! before bwrap is exec'd: `die_with_runner`), the sandbox's pid-1 dies with bwrap
//! (--die-with-parent), and everything in the pid namespace dies with it, setsid'd children
//! included. A pid 1 that has not yet asked for its parent-death signal (bwrap's child waits
//! for its parent's go-ahead first, forever if the parent died) is killed by the runner's
//! watchdog (`Watchdog`); a restarted runner kills what an earlier life left (`sweep`).
//! Nothing of the runner reaches the sandbox: bwrap itself starts with an empty environment
//! (its pid-1 init is a fork of it, whose /proc/1/environ the program can read), descriptors
//! above 2 are closed on exec, and the program sees only its own pid namespace. Each sandbox
//! runs in a cgroup of its own (cgroup.rs) when the host lets the runner make one.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_proto::StdStream;
use rustix::process::{Pid, Signal};
use time::OffsetDateTime;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::time::sleep_until;

use super::area;
use super::cgroup::{self, Cgroup, Cgroups};
use super::local_pool::{send_go, Go, LocalSource, Waiting};
use super::{
    die_with_runner, keep, remove_dir, session_env, ExecOutcome, ExecSpec, Live, SessionSandbox,
    Watchdog,
};
use crate::admission::Queued;
use crate::capture::Capture;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::job::{Job, Outcome};
use crate::limits::Limits;
use crate::outputs::{self, OutputLimits};
use crate::pool::{Pool, Pooled, Served};

/// Runs its arguments unless stdin (the runner's end held open) is already at end of file.
const GATE: &str = "read -t 0 && exit 125; exec \"$@\" </dev/null";

/// Host directories shown read-only (when present): the interpreters and their libraries.
/// Never /var, /srv, /opt, /home, /root, /mnt, /media, /work or a data root.
const SHOWN_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// Files and directories of the host's /etc shown read-only (when present): users and groups,
/// the dynamic linker's cache, certificates, alternatives, locale and shell start-up files,
/// name resolution without DNS. Nothing else of /etc (no shadow, no keys, no service config).
const SHOWN_ETC: &[&str] = &[
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "services",
    "protocols",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "alternatives",
    "localtime",
    "timezone",
    "locale.alias",
    "mime.types",
    "profile",
    "profile.d",
    "bash.bashrc",
    "inputrc",
    "environment",
    "shells",
    "gitconfig",
    "python3",
    "debian_version",
    "os-release",
];

pub struct LocalBackend {
    base: Arc<Base>,
    /// Process groups of running sandboxes (killed at shutdown).
    running: Arc<Mutex<HashSet<i32>>>,
    /// Waiting sandboxes for jobs with the default memory and no network (`pool_size` > 0).
    pool: Option<Arc<Pool<LocalSource>>>,
    /// Kills what names this runner's task directories once the runner is gone.
    _watchdog: Watchdog,
}

/// What every sandbox of this backend is built from.
pub(super) struct Base {
    pub(super) config: Arc<Config>,
    bwrap: PathBuf,
    /// Arguments that build the read-only root from the host's shown set.
    root_args: Vec<OsString>,
    as_root: bool,
    /// Where sandbox cgroups are made; None when this host does not let the runner (runs then
    /// report `limits_enforced: false`).
    cgroups: Option<Cgroups>,
}

/// The sandbox around one process, up to its program: binds, network, /tmp size, env.
pub(super) struct Frame<'a> {
    /// (host path, sandbox path, writable)
    pub(super) binds: Vec<(PathBuf, &'static str, bool)>,
    pub(super) network: bool,
    /// Size of the private /tmp.
    pub(super) memory_bytes: u64,
    pub(super) chdir: &'a str,
    pub(super) env: &'a [(String, String)],
}

/// One sandboxed process to start.
struct Spawn<'a> {
    /// Names its cgroup (unique among running sandboxes).
    id: String,
    frame: Frame<'a>,
    argv: Vec<String>,
    limits: &'a Limits,
    timeout: Duration,
    max_stdout: u64,
    max_stderr: u64,
}

struct Finished {
    exit_code: i32,
    timed_out: bool,
    oom_killed: bool,
    started_at: OffsetDateTime,
    duration_ms: u64,
    stdout: Capture,
    stderr: Capture,
}

impl LocalBackend {
    /// Finds bubblewrap and checks that it can build a sandbox here.
    pub fn new(config: Arc<Config>, queued: Queued) -> Result<LocalBackend> {
        let bwrap = find_program(&config.bwrap).ok_or_else(|| {
            Error::NoIsolation(format!(
                "bubblewrap ({:?}) is not installed: apt-get install bubblewrap, or set `bwrap` to its path",
                config.bwrap
            ))
        })?;
        let as_root = rustix::process::geteuid().is_root();
        let cgroups = match Cgroups::detect(&config.cgroup_root, &config.runner_id) {
            Ok(c) => Some(c),
            Err(why) if config.require_limits => {
                return Err(Error::NoIsolation(format!(
                    "the local backend cannot enforce memory, pids and cpu limits here: {why}. \
                     Give the runner cgroups, or set require_limits = false to run with per-process rlimits only (runs then report limits_enforced: false)"
                )))
            }
            Err(why) => {
                tracing::warn!(reason = %why, "local backend: no cgroups for sandboxes; memory, pids and cpu are limited per process only and runs report limits_enforced: false");
                None
            }
        };
        let mut base = Base {
            root_args: Vec::new(),
            bwrap,
            as_root,
            config,
            cgroups,
        };
        base.root_args = base.minimal_root();
        if as_root {
            base.check_reachable()?;
        }
        base.probe()?;
        let base = Arc::new(base);
        let pool = (base.config.pool_size > 0)
            .then(|| Arc::new(Pool::new(LocalSource::new(base.clone()), queued)));
        let mut tasks = base.config.work_root.join("tasks").into_os_string();
        tasks.push("/");
        Ok(LocalBackend {
            base,
            running: Arc::default(),
            pool,
            _watchdog: Watchdog::start(&tasks)?,
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

    /// Are memory, pids and cpu limits enforced over whole sandboxes (cgroups)?
    pub fn limits_enforced(&self) -> bool {
        self.base.cgroups.is_some()
    }

    /// Kills the sandboxes an earlier life of this runner left running (a bwrap that outlived
    /// its runner) and removes their cgroups; returns how many sandboxes and cgroups there
    /// were.
    pub async fn sweep(&self) -> usize {
        let tasks = self.base.config.work_root.join("tasks");
        let killed = kill_leftovers(&tasks).await;
        if killed > 0 {
            tracing::warn!(
                sandboxes = killed,
                "killed sandboxes an earlier life of this runner left running"
            );
        }
        killed
            + match &self.base.cgroups {
                Some(c) => c.sweep().await,
                None => 0,
            }
    }
}

impl Base {
    /// The root of every sandbox: an empty tmpfs with the shown directories bound read-only
    /// (top-level symlinks, /bin -> usr/bin, recreated), /etc holding only the shown files,
    /// and the work_root covered by an empty tmpfs should it lie below a shown directory.
    fn minimal_root(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        for dir in SHOWN_DIRS {
            let path = Path::new(dir);
            let Ok(meta) = std::fs::symlink_metadata(path) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                if let Ok(target) = std::fs::read_link(path) {
                    args.extend(["--symlink".into(), target.into_os_string(), path.into()]);
                }
            } else if meta.is_dir() {
                args.extend(["--ro-bind".into(), path.into(), path.into()]);
            }
        }
        args.extend(["--dir".into(), "/etc".into()]);
        for name in SHOWN_ETC {
            let path = Path::new("/etc").join(name);
            // Bound by what it names (a link to /run or /usr resolves on the host).
            if path.exists() {
                args.extend([
                    "--ro-bind".into(),
                    path.clone().into_os_string(),
                    path.into_os_string(),
                ]);
            }
        }
        let work_root = &self.config.work_root;
        if SHOWN_DIRS.iter().any(|d| work_root.starts_with(d)) {
            args.extend(["--tmpfs".into(), work_root.clone().into_os_string()]);
        }
        args
    }

    /// bwrap runs as the sandbox user and must reach the task directories: work_root (ours) is
    /// made 0711, and every directory above it must let others through.
    fn check_reachable(&self) -> Result<()> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let root = &self.config.work_root;
        for dir in [root.clone(), root.join("tasks")] {
            std::fs::create_dir_all(&dir)
                .map_err(Error::io(format!("creating {}", dir.display())))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
                .map_err(Error::io(format!("chmod {}", dir.display())))?;
        }
        for ancestor in root.ancestors().skip(1) {
            let meta = std::fs::metadata(ancestor)
                .map_err(Error::io(format!("stat {}", ancestor.display())))?;
            let others_pass = meta.mode() & 0o001 != 0;
            if !others_pass && meta.uid() != self.config.sandbox_uid {
                return Err(Error::NoIsolation(format!(
                    "the local backend's sandbox user (uid {}) cannot reach work_root {}: {} has mode {:o}; \
                     choose a work_root below directories others may traverse, or chmod o+x {}",
                    self.config.sandbox_uid,
                    root.display(),
                    ancestor.display(),
                    meta.mode() & 0o7777,
                    ancestor.display()
                )));
            }
        }
        Ok(())
    }

    /// Runs `true` in a sandbox once, so a host that cannot build one fails at start-up.
    fn probe(&self) -> Result<()> {
        let mut cmd = std::process::Command::new(&self.bwrap);
        cmd.args(self.namespace_args(false))
            .args(&self.root_args)
            .args(["--proc", "/proc", "--dev", "/dev"]);
        cmd.args(["--", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if self.as_root {
            use std::os::unix::process::CommandExt;
            cmd.uid(self.config.sandbox_uid)
                .gid(self.config.sandbox_gid);
        }
        cmd.env_clear();
        let out = cmd.output().map_err(|e| {
            Error::NoIsolation(format!("cannot start {}: {e}", self.bwrap.display()))
        })?;
        if !out.status.success() {
            return Err(Error::NoIsolation(format!(
                "bubblewrap cannot build a sandbox here ({}): {}. Unprivileged user namespaces must be enabled (sysctl user.max_user_namespaces > 0)",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    fn namespace_args(&self, network: bool) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "--unshare-user".into(),
            "--uid".into(),
            self.config.sandbox_uid.to_string().into(),
            "--gid".into(),
            self.config.sandbox_gid.to_string().into(),
            "--unshare-pid".into(),
            "--unshare-ipc".into(),
            "--unshare-uts".into(),
            "--unshare-cgroup-try".into(),
            "--hostname".into(),
            "sandbox".into(),
            "--disable-userns".into(),
            "--die-with-parent".into(),
            "--new-session".into(),
        ];
        if !network {
            args.push("--unshare-net".into());
        }
        args
    }

    /// The bwrap command for `frame`, up to the `--` before the program: namespaces, the
    /// read-only root, /dev, /proc, a private /tmp of `memory_bytes`, the binds, a clean env.
    /// Its own process group, killed when dropped, started as the sandbox uid when we are root.
    pub(super) fn command(&self, frame: &Frame<'_>) -> Command {
        let mut cmd = Command::new(&self.bwrap);
        // bwrap's own environment is that of its pid-1 init inside the sandbox, readable at
        // /proc/1/environ: it gets none (the program's comes through --setenv).
        cmd.env_clear();
        cmd.args(self.namespace_args(frame.network));
        cmd.args(&self.root_args);
        cmd.args(["--dev", "/dev", "--proc", "/proc"]);
        cmd.args(["--size", &frame.memory_bytes.to_string(), "--tmpfs", "/tmp"]);
        if frame.network && Path::new("/etc/resolv.conf").exists() {
            // Name servers only for a sandbox that has the network.
            cmd.args(["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]);
        }
        for (host, inside, writable) in &frame.binds {
            cmd.args(["--dir", inside]);
            cmd.arg(if *writable { "--bind" } else { "--ro-bind" })
                .arg(host)
                .arg(inside);
        }
        cmd.args(["--remount-ro", "/", "--chdir", frame.chdir, "--clearenv"]);
        for (k, v) in frame.env {
            cmd.arg("--setenv").arg(k).arg(v);
        }
        cmd.process_group(0).kill_on_drop(true);
        die_with_runner(&mut cmd);
        if self.as_root {
            cmd.uid(self.config.sandbox_uid)
                .gid(self.config.sandbox_gid);
        }
        close_inherited_fds_on_exec(&mut cmd);
        cmd
    }

    /// The cgroup of sandbox `id` with `limits`, when this host has them.
    pub(super) fn cgroup(&self, id: &str, limits: &Limits) -> Result<Option<Cgroup>> {
        let Some(cgroups) = &self.cgroups else {
            return Ok(None);
        };
        cgroups
            .create(id, limits)
            .map(Some)
            .map_err(Error::io(format!("creating the cgroup of sandbox {id}")))
    }

    /// Makes `cmd`'s process join `cgroup` before it execs; keep what this returns until the
    /// spawn has returned.
    pub(super) fn join(
        cmd: &mut Command,
        cgroup: Option<&Cgroup>,
    ) -> Result<Vec<std::os::fd::OwnedFd>> {
        let Some(cgroup) = cgroup else {
            return Ok(Vec::new());
        };
        let fds = cgroup
            .procs_files()
            .map_err(Error::io("opening a sandbox cgroup"))?;
        cgroup::join_on_exec(cmd, &fds);
        Ok(fds)
    }
}

/// A descriptor the runner's process holds without close-on-exec (inherited from whoever
/// started it, or opened so by other code in the process) must not reach the sandbox: in the
/// child, just before exec, every descriptor above 2 is marked close-on-exec.
#[allow(unsafe_code)]
fn close_inherited_fds_on_exec(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and makes one system call,
    // close_range(2) with CLOSE_RANGE_CLOEXEC, which is async-signal-safe, allocates nothing
    // and closes nothing (std's exec-error pipe is close-on-exec already).
    unsafe {
        cmd.pre_exec(|| {
            if libc::close_range(
                3,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC as libc::c_int,
            ) == 0
            {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

impl LocalBackend {
    pub async fn run(&self, job: &Job, live: Option<&Live>) -> Result<Outcome> {
        let pooled = |waiting| self.run_pooled(waiting, job, live);
        let _cold = match Pool::serve(self.pool.as_ref(), |p| p.fits(job), pooled).await {
            Served::Done(outcome) => return outcome,
            Served::Cold(hold) => hold,
        };
        let config = &self.base.config;
        let task = TaskDir::for_job(config, job).await?;
        let (input, output) = (task.input(), task.output());
        let env = job.environment();
        let spawn = Spawn {
            id: job.id.clone(),
            frame: Frame {
                binds: vec![(input, "/input", false), (output.clone(), "/output", true)],
                network: job.network,
                memory_bytes: job.limits.memory_bytes,
                chdir: "/tmp",
                env: &env,
            },
            argv: job.argv(),
            limits: &job.limits,
            timeout: Duration::from_millis(job.limits.timeout_ms),
            max_stdout: job.limits.max_stdout_bytes,
            max_stderr: job.limits.max_stderr_bytes,
        };
        let done = self.sandboxed(spawn, live).await?;
        let outputs = collect(output, job).await?;
        // The reply need not wait for the directory to go (the drop removes it in the background).
        drop(task);
        Ok(outcome(done, outputs, false))
    }

    /// Runs `job` in a waiting sandbox: stages its inputs, sends the go line, then supervises
    /// the program as a cold run would. The sandbox is never used again.
    async fn run_pooled(
        &self,
        waiting: Waiting,
        job: &Job,
        live: Option<&Live>,
    ) -> std::result::Result<Outcome, Pooled> {
        let Waiting {
            mut child,
            task,
            cgroup,
        } = waiting;
        let output = task.path.join("output");
        if let Some(c) = &cgroup {
            // The job's pids and cpu limits (its memory is the default the sandbox has).
            c.set_limits(&job.limits).map_err(|e| {
                Pooled::Unstarted(Error::io("setting a waiting sandbox's limits")(e))
            })?;
        }
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
            relay: false,
            reap: false,
        };
        let (started_at, t0) = send_go(&mut child, go).await.map_err(Pooled::Unstarted)?;
        let caps = (job.limits.max_stdout_bytes, job.limits.max_stderr_bytes);
        let done = self
            .supervise(child, started_at, t0, timeout, caps, live)
            .await
            .map_err(Pooled::Failed)?;
        let done = finish(done, cgroup).await;
        let outputs = collect(output, job).await.map_err(Pooled::Failed)?;
        drop(task);
        Ok(outcome(done, outputs, true))
    }

    pub async fn exec(&self, s: &SessionSandbox, spec: &ExecSpec) -> Result<ExecOutcome> {
        let env = session_env();
        let spawn = Spawn {
            id: format!("{}-{}", s.session_id, uuid::Uuid::now_v7().simple()),
            frame: Frame {
                binds: vec![
                    (s.task_dir.join("workspace"), "/workspace", true),
                    (s.task_dir.join("tmpfs"), "/tmpfs", true),
                ],
                network: s.network,
                memory_bytes: s.limits.memory_bytes,
                chdir: &spec.workdir,
                env: &env,
            },
            argv: vec!["bash".into(), "-lc".into(), spec.command.clone()],
            limits: &s.limits,
            timeout: spec.timeout,
            max_stdout: spec.max_output_bytes,
            max_stderr: spec.max_output_bytes,
        };
        let done = self.sandboxed(spawn, None).await?;
        Ok(ExecOutcome {
            exit_code: done.exit_code,
            timed_out: done.timed_out,
            duration_ms: done.duration_ms,
            stdout: done.stdout,
            stderr: done.stderr,
        })
    }

    /// Starts a sandbox for one program (its rlimits set by prlimit, in its own cgroup when
    /// the host has them) and supervises it; the cgroup is gone when this returns.
    async fn sandboxed(&self, spawn: Spawn<'_>, live: Option<&Live>) -> Result<Finished> {
        let cgroup = self.base.cgroup(&spawn.id, spawn.limits)?;
        let mut cmd = self.base.command(&spawn.frame);
        cmd.arg("--").arg("prlimit");
        for (name, value) in rlimits(spawn.limits, spawn.timeout) {
            cmd.arg(format!("--{name}={value}"));
        }
        // The gate: bwrap's stdin is a pipe the runner holds (and never writes). A runner that
        // died while bwrap was still building the sandbox (before its inner process asked for
        // the parent-death signal) left it at end of file, and the program never starts;
        // otherwise the program runs with stdin on /dev/null.
        // `-p`: no BASH_ENV file runs before the check (the environment passes on unchanged).
        cmd.args(["--", "/bin/bash", "-p", "-c", GATE, "cairn-gate"])
            .args(&spawn.argv);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started_at = OffsetDateTime::now_utc();
        let t0 = Instant::now();
        let joining = Base::join(&mut cmd, cgroup.as_ref())?;
        let child = cmd.spawn().map_err(Error::io("starting bubblewrap"))?;
        drop(joining);
        let caps = (spawn.max_stdout, spawn.max_stderr);
        let done = self
            .supervise(child, started_at, t0, spawn.timeout, caps, live)
            .await?;
        Ok(finish(done, cgroup).await)
    }

    /// Captures a started sandbox's output, enforces the timeout from `t0` (SIGTERM to the
    /// program's processes, grace, SIGKILL to the sandbox) and waits for it.
    async fn supervise(
        &self,
        mut child: Child,
        started_at: OffsetDateTime,
        t0: Instant,
        timeout: Duration,
        (max_stdout, max_stderr): (u64, u64),
        live: Option<&Live>,
    ) -> Result<Finished> {
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        let _registered = Registered::new(&self.running, pid);
        let mut unreaped = Unreaped(pid);
        let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(Error::Sandbox("bubblewrap started without pipes".into()));
        };
        let mut stdout = Capture::new(max_stdout);
        let mut stderr = Capture::new(max_stderr);
        let (mut out_open, mut err_open) = (true, true);
        let mut obuf = vec![0u8; 64 * 1024];
        let mut ebuf = vec![0u8; 64 * 1024];
        let mut step = 0u8;
        let mut next = t0 + timeout;
        let grace = Duration::from_millis(self.base.config.kill_grace_ms);
        while out_open || err_open {
            tokio::select! {
                r = out.read(&mut obuf), if out_open => match r {
                    Ok(0) | Err(_) => out_open = false,
                    Ok(n) => keep(&mut stdout, &obuf[..n], StdStream::Stdout, live).await,
                },
                r = err.read(&mut ebuf), if err_open => match r {
                    Ok(0) | Err(_) => err_open = false,
                    Ok(n) => keep(&mut stderr, &ebuf[..n], StdStream::Stderr, live).await,
                },
                _ = sleep_until(next.into()) => {
                    match step {
                        0 => {
                            terminate_program(pid);
                            next = Instant::now() + grace;
                        }
                        1 => {
                            kill_group(pid, Signal::KILL);
                            next = Instant::now() + Duration::from_secs(5);
                        }
                        _ => break,
                    }
                    step += 1;
                }
            }
        }
        let status = tokio::select! {
            s = child.wait() => s.map_err(Error::io("waiting for bubblewrap"))?,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {
                kill_group(pid, Signal::KILL);
                child.wait().await.map_err(Error::io("waiting for bubblewrap"))?
            }
        };
        unreaped.0 = 0;
        let exit_code = status.code().unwrap_or_else(|| {
            use std::os::unix::process::ExitStatusExt;
            128 + status.signal().unwrap_or(0)
        });
        Ok(Finished {
            exit_code: if step > 0 { -1 } else { exit_code },
            timed_out: step > 0,
            oom_killed: false,
            started_at,
            duration_ms: t0.elapsed().as_millis() as u64,
            stdout,
            stderr,
        })
    }

    /// Removes the waiting sandboxes, then kills every running one.
    pub async fn shutdown(&self) {
        if let Some(pool) = &self.pool {
            pool.close().await;
        }
        let groups: Vec<i32> = self
            .running
            .lock()
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for pid in groups {
            kill_group(pid, Signal::KILL);
        }
        if let Some(c) = &self.base.cgroups {
            c.close().await;
        }
    }
}

/// The rlimits of a program (prlimit's names): pids, memory, output bytes, CPU time (the
/// timeout + 1 s), no core files.
pub(super) fn rlimits(limits: &Limits, timeout: Duration) -> [(&'static str, u64); 5] {
    [
        ("nproc", limits.pids),
        ("as", limits.memory_bytes),
        // One byte over the output limit: a file cut there is known to be cut.
        (
            "fsize",
            OutputLimits::file_size_cap(limits.max_output_bytes),
        ),
        ("cpu", timeout.as_secs() + 1),
        ("core", 0),
    ]
}

/// Collects `/output` through its host directory (a no-follow walk, limits from the job);
/// nothing is published when its area filled up (`writable_area_full`).
pub(super) async fn collect(output: PathBuf, job: &Job) -> Result<Collected> {
    let limits = OutputLimits {
        max_files: job.limits.max_output_files,
        max_bytes: job.limits.max_output_bytes,
    };
    tokio::task::spawn_blocking(move || {
        let outputs = outputs::from_dir(&output, limits)?;
        Ok(match area::is_full(&output) {
            true => Collected {
                outputs: outputs.out_of_space(),
                full: true,
            },
            false => Collected {
                outputs,
                full: false,
            },
        })
    })
    .await
    .map_err(|e| Error::Sandbox(format!("output collection panicked: {e}")))?
    .map_err(Error::io("reading /output"))
}

/// What /output held, and whether its area was full.
pub(super) struct Collected {
    pub(super) outputs: outputs::Outputs,
    pub(super) full: bool,
}

fn outcome(done: Finished, collected: Collected, warm: bool) -> Outcome {
    Outcome {
        exit_code: done.exit_code,
        timed_out: done.timed_out,
        // Without a cgroup, memory is capped by RLIMIT_AS only: allocations fail, nothing is
        // OOM-killed.
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

/// Reads whether the memory limit killed a process of the finished sandbox, then removes its
/// cgroup.
async fn finish(mut done: Finished, cgroup: Option<Cgroup>) -> Finished {
    if let Some(c) = cgroup {
        done.oom_killed = c.oom_kills() > 0;
        c.remove().await;
    }
    done
}

/// Sends SIGTERM to every process inside the sandbox below its pid 1 (the program and
/// whatever it started), so it can finish writing; bwrap itself would die at once.
fn terminate_program(bwrap_pid: i32) {
    let mut stack = children(bwrap_pid); // bwrap's child: pid 1 of the namespace
    let mut inside = Vec::new();
    while let Some(p) = stack.pop() {
        let kids = children(p);
        inside.extend(kids.iter().copied());
        stack.extend(kids);
    }
    for p in inside {
        if let Some(pid) = Pid::from_raw(p) {
            let _ = rustix::process::kill_process(pid, Signal::TERM);
        }
    }
}

fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|s| s.parse::<i32>().ok()),
            );
        }
    }
    out
}

/// Kills a sandbox and waits (bounded) until it is gone: SIGKILL to bwrap's process group and
/// to the namespace's pid 1 (which sits in a session of its own), then waits for bwrap and for
/// pid 1 to exit; the kernel kills everything else in the pid namespace with its pid 1.
pub(super) async fn kill_and_wait(child: &mut Child) {
    let Some(pid) = child.id().map(|p| p as i32) else {
        return;
    };
    let inits = children(pid);
    kill_group(pid, Signal::KILL);
    for p in &inits {
        if let Some(p) = Pid::from_raw(*p) {
            let _ = rustix::process::kill_process(p, Signal::KILL);
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    let t0 = Instant::now();
    while inits
        .iter()
        .any(|p| Path::new(&format!("/proc/{p}")).exists())
        && t0.elapsed() < Duration::from_secs(5)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub(super) fn kill_group(pid: i32, sig: Signal) {
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = rustix::process::kill_process_group(pid, sig);
    }
}

/// Kills every process whose command line names a task directory under `tasks` (bwrap, and
/// the pid 1 of its namespace, a fork of it; the namespace dies with its pid 1) and waits
/// (bounded) until they are gone; returns how many sandboxes (outermost bwraps) there were.
async fn kill_leftovers(tasks: &Path) -> usize {
    let mut prefix = tasks.as_os_str().as_encoded_bytes().to_vec();
    prefix.push(b'/');
    let me = std::process::id() as i32;
    let mut found: Vec<(i32, i32)> = Vec::new(); // (pid, parent)
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            if pid == me
                || !alive(pid)
                || !cmdline.split(|b| *b == 0).any(|a| a.starts_with(&prefix))
            {
                continue;
            }
            found.push((pid, parent_of(pid).unwrap_or(0)));
        }
    }
    for (pid, _) in &found {
        if let Some(p) = Pid::from_raw(*pid) {
            let _ = rustix::process::kill_process(p, Signal::KILL);
        }
    }
    let t0 = Instant::now();
    while found.iter().any(|(p, _)| alive(*p)) && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    found
        .iter()
        .filter(|(_, parent)| !found.iter().any(|(p, _)| p == parent))
        .count()
}

/// Fields 3 on of /proc/<pid>/stat (after the command name): state, parent, ...
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

fn parent_of(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// Exists and is not a zombie.
fn alive(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|s| s != "Z"))
}

/// Kills a sandbox whose supervision is dropped before bwrap was reaped (its call was
/// cancelled, or its client's deadline passed): bwrap's group and the namespace's pid 1 (in a
/// session of its own), so nothing the program started runs on. Until it is reaped, bwrap's
/// pid cannot name another process. 0 = reaped.
struct Unreaped(i32);

impl Drop for Unreaped {
    fn drop(&mut self) {
        if self.0 > 0 {
            let inits = children(self.0);
            kill_group(self.0, Signal::KILL);
            for p in inits.into_iter().filter_map(Pid::from_raw) {
                let _ = rustix::process::kill_process(p, Signal::KILL);
            }
        }
    }
}

/// Keeps a running sandbox's process group in the shutdown list while it runs.
struct Registered<'a> {
    set: &'a Mutex<HashSet<i32>>,
    pid: i32,
}

impl<'a> Registered<'a> {
    fn new(set: &'a Mutex<HashSet<i32>>, pid: i32) -> Self {
        if let Ok(mut s) = set.lock() {
            s.insert(pid);
        }
        Registered { set, pid }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.set.lock() {
            s.remove(&self.pid);
        }
    }
}

/// A job's directory under `<work_root>/tasks/`; removed (in the background) when dropped.
pub struct TaskDir {
    pub path: PathBuf,
}

impl TaskDir {
    /// `<work_root>/tasks/<id>/` with `input/` (ours, read-only for the sandbox) and `output/`
    /// (owned by the sandbox user), a file system of `max_total_output_bytes` (area.rs).
    pub async fn create(config: &Config, id: &str) -> Result<TaskDir> {
        let (uid, gid) = (config.sandbox_uid, config.sandbox_gid);
        let bytes = config.max_total_output_bytes;
        let path = config.work_root.join("tasks").join(id);
        let p = path.clone();
        // From here on the directory is ours to remove, made whole or not.
        let task = TaskDir { path };
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(p.parent().unwrap_or(&p))?;
            std::fs::DirBuilder::new().mode(0o711).create(&p)?;
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(p.join("input"))?;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(p.join("output"))?;
            let as_root = rustix::process::geteuid().is_root();
            if as_root {
                std::os::unix::fs::chown(p.join("output"), Some(uid), Some(gid))?;
                area::mount(&p.join("output"), bytes, (uid, gid), 0o700)?;
            }
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o711))?;
            Ok(())
        })
        .await
        .map_err(|e| Error::Sandbox(format!("task directory creation panicked: {e}")))?
        .map_err(Error::io(format!(
            "creating task directory {} (its /output a tmpfs of max_total_output_bytes)",
            task.path.display()
        )))?;
        Ok(task)
    }

    /// A one-shot job's directory with its inputs staged in `input/`.
    pub async fn for_job(config: &Config, job: &Job) -> Result<TaskDir> {
        let task = TaskDir::create(config, &job.id).await?;
        if !job.inputs.is_empty() {
            stage_inputs(&task.input(), job).await?;
        }
        Ok(task)
    }

    pub fn input(&self) -> PathBuf {
        self.path.join("input")
    }

    pub fn output(&self) -> PathBuf {
        self.path.join("output")
    }

    /// Removes the directory now (the drop would do it in the background).
    pub async fn remove(mut self) {
        let path = std::mem::take(&mut self.path);
        remove_dir(&path).await;
    }
}

impl Drop for TaskDir {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        let path = self.path.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { remove_dir(&path).await });
        }
    }
}

/// Writes the inputs under `dir` (fresh, ours). The sandbox sees them through a read-only
/// bind mount, whatever their modes.
pub(super) async fn stage_inputs(dir: &Path, job: &Job) -> Result<()> {
    let dir = dir.to_path_buf();
    let inputs = job.inputs.clone();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        for input in &inputs {
            let target = dir.join(input.path.as_str());
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o444)
                .open(&target)?;
            std::io::Write::write_all(&mut f, &input.content)?;
        }
        Ok(())
    })
    .await
    .map_err(|e| Error::Sandbox(format!("staging inputs panicked: {e}")))?
    .map_err(Error::io("staging /input"))
}

pub(super) fn find_program(name: &str) -> Option<PathBuf> {
    let p = Path::new(name);
    if p.is_absolute() {
        return p.is_file().then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|c| c.is_file())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn base(work_root: &Path, sandbox_uid: u32, bwrap: &str) -> Base {
        Base {
            config: Arc::new(Config {
                work_root: work_root.to_owned(),
                sandbox_uid,
                ..Config::default()
            }),
            bwrap: bwrap.into(),
            root_args: Vec::new(),
            as_root: false,
            cgroups: None,
        }
    }

    fn args(cmd: &Command) -> Vec<String> {
        cmd.as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn every_namespace_is_new_and_the_network_only_when_asked() {
        let b = base(Path::new("/nonexistent"), 65534, "bwrap");
        let isolated = b.namespace_args(false);
        for flag in [
            "--unshare-user",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--unshare-net",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
        ] {
            assert!(isolated.iter().any(|a| a == flag), "{flag} missing");
        }
        let networked = b.namespace_args(true);
        assert!(!networked.iter().any(|a| a == "--unshare-net"));
        assert_eq!(networked.len() + 1, isolated.len());
    }

    #[test]
    fn name_servers_are_shown_only_to_a_sandbox_with_the_network() {
        let b = base(Path::new("/nonexistent"), 65534, "bwrap");
        let frame = |network| Frame {
            binds: Vec::new(),
            network,
            memory_bytes: 1 << 20,
            chdir: "/",
            env: &[],
        };
        let resolv = |cmd: &Command| args(cmd).iter().any(|a| a == "/etc/resolv.conf");
        assert!(!resolv(&b.command(&frame(false))));
        if Path::new("/etc/resolv.conf").exists() {
            assert!(resolv(&b.command(&frame(true))));
        }
    }

    #[test]
    fn rlimits_bound_processes_memory_output_cpu_and_core_files() {
        let limits = Limits {
            pids: 7,
            memory_bytes: 1 << 20,
            max_output_bytes: 1000,
            ..Limits::DEFAULTS
        };
        assert_eq!(
            rlimits(&limits, Duration::from_millis(5_500)),
            [
                ("nproc", 7),
                ("as", 1 << 20),
                ("fsize", 1001),
                ("cpu", 6),
                ("core", 0)
            ]
        );
    }

    #[test]
    fn a_work_root_the_sandbox_user_cannot_traverse_to_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let locked = tmp.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
        let root = locked.join("work");
        let me = rustix::process::geteuid().as_raw();
        let other = if me == 65534 { 65533 } else { 65534 };
        let e = base(&root, other, "bwrap").check_reachable().unwrap_err();
        assert!(
            matches!(&e, Error::NoIsolation(m) if m.contains(&locked.display().to_string())),
            "{e:?}"
        );
        // The owner passes its own directory; anyone passes one others may traverse.
        base(&root, me, "bwrap").check_reachable().unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o701)).unwrap();
        base(&root, other, "bwrap").check_reachable().unwrap();
        let mode = std::fs::metadata(&root).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o711);
    }

    #[test]
    fn a_host_where_bubblewrap_fails_is_refused_at_start() {
        let tmp = tempfile::tempdir().unwrap();
        let e = base(tmp.path(), 65534, "/bin/false").probe().unwrap_err();
        assert!(matches!(e, Error::NoIsolation(_)), "{e:?}");
    }

    #[tokio::test]
    async fn a_descriptor_left_open_on_exec_does_not_reach_the_program() {
        let file = std::fs::File::open("/dev/null").unwrap();
        // A high number, so the program's own descriptors cannot take it.
        let leaked = rustix::io::fcntl_dupfd_cloexec(&file, 200).unwrap();
        rustix::io::fcntl_setfd(&leaked, rustix::io::FdFlags::empty()).unwrap();
        let n = std::os::fd::AsRawFd::as_raw_fd(&leaked).to_string();
        let listing = |close: bool| {
            let mut cmd = Command::new("/bin/ls");
            cmd.arg("/proc/self/fd");
            if close {
                close_inherited_fds_on_exec(&mut cmd);
            }
            async move {
                let out = cmd.output().await.unwrap();
                assert!(out.status.success());
                String::from_utf8(out.stdout).unwrap()
            }
        };
        // The descriptor is inheritable, so without the call the program would see it.
        assert!(listing(false).await.lines().any(|l| l == n));
        assert!(!listing(true).await.lines().any(|l| l == n));
    }
}
