//! The runner: its identity, backend, sessions and start-up sweep, and one method per thing
//! a client can ask (service.rs only translates the wire types). Shutting down kills and
//! removes everything it started.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_proto as pb;

use crate::admission::Admission;
use crate::backend::{self, Backend, ExecSpec, Live, SessionSandbox};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::job::{self, Job};
use crate::limits::Limits;
use crate::session::{self, Closing, Session, Sessions};
use crate::snapshot::Origin;
use crate::workspace;
use cairn_contain::Root;
use cairn_pack::graft::{self, AreaRoots, GraftError};
use cairn_pack::{self as pack, Format, PackReport};

mod pause;

pub struct Runner {
    config: Arc<Config>,
    backend: Backend,
    sessions: Sessions,
    swept: usize,
    closing: AtomicBool,
    /// Runs in flight (for shutdown to wait on).
    running: AtomicUsize,
    /// One slot per run in flight or open session, `max_concurrent_runs` in all, and the
    /// queue of calls waiting for one.
    admission: Admission,
    /// Owner given to workspace files when the runner is root.
    owner: Option<(u32, u32)>,
}

/// A packed archive on disk, ready to stream; removed when dropped.
pub struct Packed {
    pub path: PathBuf,
    pub name: String,
    pub report: PackReport,
}

impl Drop for Packed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Runner {
    /// Checks the config, settles the runner id, picks the backend, removes leftovers of an
    /// earlier life (containers labelled with this id, task directories) and starts the pool.
    pub async fn start(mut config: Config) -> Result<Runner> {
        config.check()?;
        std::fs::create_dir_all(config.work_root.join("tasks")).map_err(Error::io(format!(
            "creating work_root {}",
            config.work_root.display()
        )))?;
        if config.runner_id.is_empty() {
            config.runner_id = stored_runner_id(&config.work_root)?;
        } else if !job::is_id(&config.runner_id) {
            return Err(Error::Config(format!(
                "runner_id {:?} must be 1-128 characters of [A-Za-z0-9._-]",
                config.runner_id
            )));
        }
        let config = Arc::new(config);
        let admission = Admission::new(
            config.concurrent_runs(),
            config.queue_depth,
            Duration::from_millis(config.queue_timeout_ms),
        );
        let backend = Backend::select(config.clone(), admission.queued()).await?;
        let containers = backend.sweep().await?;
        let dirs = sweep_task_dirs(&config.work_root.join("tasks")).await;
        let swept = containers + dirs;
        tracing::info!(
            runner_id = %config.runner_id,
            backend = backend.name(),
            removed_containers = containers,
            removed_task_dirs = dirs,
            max_concurrent_runs = config.concurrent_runs(),
            limits_enforced = backend.limits_enforced(),
            "sandbox-runner ready; removed {containers} leftover sandboxes (containers, sandbox processes or cgroups) and {dirs} task directories"
        );
        backend.start();
        let owner = rustix::process::geteuid()
            .is_root()
            .then_some((config.sandbox_uid, config.sandbox_gid));
        Ok(Runner {
            admission,
            config,
            backend,
            sessions: Sessions::default(),
            swept,
            closing: AtomicBool::new(false),
            running: AtomicUsize::new(0),
            owner,
        })
    }

    pub fn runner_id(&self) -> &str {
        &self.config.runner_id
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Leftovers removed at start-up (containers + task directories).
    /// How often RunStream sends a heartbeat while a program runs (None = never).
    pub fn heartbeat_interval(&self) -> Option<std::time::Duration> {
        (self.config.heartbeat_interval_ms > 0)
            .then(|| std::time::Duration::from_millis(self.config.heartbeat_interval_ms))
    }

    pub fn swept(&self) -> usize {
        self.swept
    }

    fn open(&self) -> Result<()> {
        if self.closing.load(Ordering::SeqCst) {
            cairn_telemetry::metrics::sandbox_refused("shutting_down");
            return Err(Error::ShuttingDown);
        }
        Ok(())
    }

    /// The local and gvisor backends run on the host's files: any image but the default is
    /// refused there rather than ignored.
    fn backend_runs(&self, image: &str) -> Result<()> {
        match self.backend {
            Backend::Local(_) | Backend::Gvisor(_) if image != self.config.image => {
                Err(Error::ImageNeedsDocker {
                    backend: self.backend.name(),
                    image: image.to_owned(),
                })
            }
            _ => Ok(()),
        }
    }

    pub async fn run(&self, req: pb::RunRequest, live: Option<&Live>) -> Result<pb::RunResult> {
        self.open()?;
        let job = Job::from_request(req, &self.config)?;
        self.backend_runs(&job.image)?;
        let _slot = self.admission.admit().await?;
        self.running.fetch_add(1, Ordering::SeqCst);
        let _done = Decrement(&self.running);
        tracing::info!(job_id = %job.id, request_id = %job.request_id, run_id = %job.run_id, language = job.language.as_str(), "run");
        let started = std::time::Instant::now();
        let outcome = self.backend.run(&job, live).await;
        let (label, took) = match &outcome {
            Ok(o) if o.timed_out => ("timed_out", Duration::from_millis(o.duration_ms)),
            Ok(o) if o.oom_killed => ("oom_killed", Duration::from_millis(o.duration_ms)),
            Ok(o) if o.exit_code != 0 => ("exit_nonzero", Duration::from_millis(o.duration_ms)),
            Ok(o) => ("ok", Duration::from_millis(o.duration_ms)),
            Err(_) => ("error", started.elapsed()),
        };
        cairn_telemetry::metrics::sandbox_finished(self.backend.name(), label, took);
        // Shutdown killed it: not the program's failure nor the engine's; retry elsewhere.
        self.open()?;
        let outcome = outcome?;
        tracing::info!(job_id = %job.id, exit_code = outcome.exit_code, timed_out = outcome.timed_out, oom = outcome.oom_killed, ms = outcome.duration_ms, "run finished");
        Ok(job::run_result(
            &job,
            outcome,
            &self.config.runner_id,
            self.backend.name(),
            self.backend.limits_enforced(),
        ))
    }

    /// Opens a session. The opening runs in a task of its own: when this call is dropped
    /// (the client cancelled or its deadline passed) or CloseSession comes first, the task
    /// stops the clone and removes what it made (container, task directory, slot).
    pub async fn open_session(
        self: &Arc<Self>,
        req: pb::OpenSessionRequest,
    ) -> Result<pb::SessionInfo> {
        let git = req.git.clone();
        self.open_from(req, Origin::Git(git)).await
    }

    async fn open_from(
        self: &Arc<Self>,
        req: pb::OpenSessionRequest,
        origin: Origin,
    ) -> Result<pb::SessionInfo> {
        self.open()?;
        let session_id = if req.session_id.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else if job::is_id(&req.session_id) {
            req.session_id
        } else {
            return Err(Error::invalid(format!(
                "session_id {:?} must be 1-128 characters of [A-Za-z0-9._-]",
                req.session_id
            )));
        };
        self.config.check_network(req.network)?;
        let image = self.config.image_for(&req.image)?;
        self.backend_runs(&image)?;
        let limits = Limits::resolve(
            req.limits.as_ref(),
            &self.config.default_limits(),
            &self.config.max_limits(),
        )?;
        let slot = self.admission.admit().await?;
        let reservation = self
            .sessions
            .reserve(&session_id, self.config.max_sessions)?;
        let task_dir = self.config.work_root.join("tasks").join(&session_id);
        let sandbox = SessionSandbox {
            name: format!(
                "{}{}{}",
                self.config.container_prefix, session_id, self.config.container_suffix
            ),
            areas: backend::area::SessionAreas::in_task_dir(&task_dir),
            task_dir,
            session_id,
            network: req.network,
            image,
            limits,
            run_id: req.run_id,
            node_id: req.node_id,
        };
        let _cancel_when_dropped = reservation.token().clone().drop_guard();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let runner = self.clone();
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            let opened = runner
                .open_reserved(reservation, sandbox, origin, slot)
                .await;
            // Opened just as the caller left: nobody will learn of it, so close it.
            if let Err(Ok(info)) = answer.send(opened) {
                runner.close_unclaimed(info.session_id).await;
            }
        }));
        let mut answer = Unclaimed {
            runner: self.clone(),
            rx: answered,
            taken: false,
        };
        let opened = (&mut answer.rx).await;
        answer.taken = true;
        opened.map_err(|_| {
            Error::Sandbox("the session opening task ended without an answer".into())
        })?
    }

    async fn close_unclaimed(&self, session_id: String) {
        if let Err(e) = self.close_session(&session_id).await {
            tracing::warn!(session_id = %session_id, error = %e, "could not close a session whose caller left");
        }
    }

    /// Opens the reserved session, or tears it down when opening fails or is cancelled.
    async fn open_reserved(
        &self,
        reservation: session::Reservation,
        sandbox: SessionSandbox,
        origin: Origin,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<pb::SessionInfo> {
        let (snapshot_of, memory_restored) = match &origin {
            Origin::Git(_) => (String::new(), false),
            Origin::Snapshot(p) => (p.header.session_id.clone(), p.header.memory),
        };
        let failed = match self
            .open_sandbox(&reservation, &sandbox, origin, slot)
            .await
        {
            Ok(session) => {
                let git_commit = session.git_commit.clone();
                if self.sessions.fill(&reservation, session) {
                    tracing::info!(session_id = %sandbox.session_id, "session opened");
                    return Ok(pb::SessionInfo {
                        session_id: sandbox.session_id.clone(),
                        container_name: sandbox.name.clone(),
                        backend: self.backend.name().into(),
                        git_commit,
                        image: match self.backend {
                            Backend::Docker(_) => sandbox.image.clone(),
                            Backend::Local(_) | Backend::Gvisor(_) => String::new(),
                        },
                        idle_timeout_ms: self.config.session.idle_timeout_ms,
                        snapshot_of,
                        memory_restored,
                        copies: Vec::new(),
                    });
                }
                None
            }
            Err(e) => Some(e),
        };
        // A cancelled opening reports why, not the git or engine error it caused.
        let error = match failed {
            _ if reservation.token().is_cancelled() && self.closing.load(Ordering::SeqCst) => {
                Error::ShuttingDown
            }
            Some(e) if !reservation.token().is_cancelled() => e,
            _ => Error::OpenAborted(sandbox.session_id.clone()),
        };
        // Nothing half-made stays: container and directories go, then the slot.
        let _ = self.backend.close_session(&sandbox).await;
        backend::remove_dir(&sandbox.task_dir).await;
        self.sessions.release(reservation);
        tracing::info!(session_id = %sandbox.session_id, error = %error, "session not opened; removed what was made");
        Err(error)
    }

    async fn open_sandbox(
        &self,
        reservation: &session::Reservation,
        sandbox: &SessionSandbox,
        origin: Origin,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<Session> {
        let cancel = reservation.token();
        let engine = self.backend.engine_areas();
        // Not cut short (it is quick): a directory made after the teardown would stay.
        session::create_task_dir(
            &sandbox.task_dir,
            self.owner,
            self.config.max_total_output_bytes,
            !engine,
        )
        .await?;
        let mut sandbox = sandbox.clone();
        if engine {
            // The engine makes the areas: the container first, then the files go in.
            self.backend.open_session(&sandbox).await?;
            sandbox.areas = self.backend.session_areas(&sandbox).await?;
        }
        let ws = sandbox.areas.workspace();
        let mut snapshot = None;
        let git_commit = match origin {
            Origin::Git(Some(g)) if !g.url.is_empty() => {
                self.clone_into(&sandbox, &g, engine, cancel).await?
            }
            Origin::Git(_) => String::new(),
            Origin::Snapshot(p) => {
                self.unpack_snapshot(&sandbox, p.clone()).await?;
                snapshot = Some(p);
                String::new()
            }
        };
        let workspace = Root::open(&ws).map_err(Error::io("opening the workspace"))?;
        if cancel.is_cancelled() {
            return Err(Error::OpenAborted(sandbox.session_id.clone()));
        }
        // Not cut short either: a container create cancelled in flight may still finish in
        // the engine; once this returns, the teardown's removal is sure to find it.
        let checkpoint = snapshot
            .as_ref()
            .and_then(|p| p.checkpoint.as_ref())
            .and_then(|r| r.checkpoint.as_deref());
        match checkpoint {
            Some(dir) => self.backend.restore_session(&sandbox, dir).await?,
            None if engine => {}
            None => self.backend.open_session(&sandbox).await?,
        }
        drop(snapshot);
        Ok(Session {
            sandbox,
            workspace,
            git_commit,
            _slot: slot,
            activity: std::sync::Mutex::new(session::Activity::new()),
            checkpointing: tokio::sync::RwLock::new(()),
        })
    }

    /// Clones `g` into the session's /workspace; returns the commit. Areas the engine made are
    /// reached through the container's root, where git (which resolves its paths) would lead
    /// back into the runner's own: there it clones beside the task directory, and the tree is
    /// copied in by descriptor (cairn_pack::graft).
    async fn clone_into(
        &self,
        sandbox: &SessionSandbox,
        g: &pb::GitSource,
        engine: bool,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<String> {
        let timeout = Duration::from_millis(self.config.session.git_timeout_ms);
        if !engine {
            let ws = sandbox.areas.workspace();
            return session::clone(&g.url, &g.r#ref, &ws, self.owner, timeout, cancel).await;
        }
        let staging = sandbox.task_dir.join("clone");
        let commit =
            session::clone(&g.url, &g.r#ref, &staging, self.owner, timeout, cancel).await?;
        let (areas, owner, from) = (
            sandbox.areas.dir().to_path_buf(),
            self.owner,
            staging.clone(),
        );
        let copied = blocking(move || {
            let roots =
                AreaRoots::open(&areas, owner).map_err(Error::io("opening the session's areas"))?;
            graft::copy_tree(&from, "workspace", &roots).map_err(|e| match e {
                GraftError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
                    Error::ResourceExhausted {
                        message: "the repository does not fit the session's /workspace (max_total_output_bytes): ask the operator to raise the cap".into(),
                        reason: "no_space",
                    }
                }
                GraftError::Io { context, source } => Error::Io { context, source },
                GraftError::Refused(why) => Error::Sandbox(why),
            })
        })
        .await;
        backend::remove_dir(&staging).await;
        copied.map(|()| commit)
    }

    /// The open session `id`, in use (not idle) while the returned guard lives.
    fn session(&self, id: &str) -> Result<session::InUse> {
        self.sessions.enter(id, self.idle_timeout())
    }

    fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.config.session.idle_timeout_ms)
    }

    /// Closes, every `idle_timeout_ms / 4` (at least 50 ms, at most 10 s), the sessions no
    /// call has used for `idle_timeout_ms`; stops with the runner (or at once when it is 0).
    pub fn expire_idle_sessions(self: &Arc<Self>) {
        let idle = self.idle_timeout();
        if idle.is_zero() {
            return;
        }
        let every = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(10));
        let runner = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(runner) = runner.upgrade() else {
                    return;
                };
                if runner.closing.load(Ordering::SeqCst) {
                    return;
                }
                for s in runner.sessions.take_idle(idle) {
                    let id = &s.sandbox.session_id;
                    match runner.remove_session(&s).await {
                        Ok(()) => {
                            tracing::warn!(session_id = %id, idle_timeout_ms = idle.as_millis() as u64, run_id = %s.sandbox.run_id, node_id = %s.sandbox.node_id, "session closed: no call used it for the idle timeout")
                        }
                        Err(e) => {
                            tracing::warn!(session_id = %id, error = %e, "closing an idle session failed")
                        }
                    }
                }
            }
        });
    }

    /// TouchSession: the session's idle time starts again; returns the idle timeout.
    pub fn touch_session(&self, id: &str) -> Result<u64> {
        self.open()?;
        drop(self.session(id)?);
        Ok(self.config.session.idle_timeout_ms)
    }

    /// Removes a session taken out of the map: its sandbox, then its directories.
    async fn remove_session(&self, s: &Session) -> Result<()> {
        let closed = self.backend.close_session(&s.sandbox).await;
        backend::remove_dir(&s.sandbox.task_dir).await;
        closed
    }

    pub async fn exec(&self, req: pb::ExecRequest) -> Result<pb::ExecResult> {
        self.open()?;
        let s = self.session(&req.session_id)?;
        let max = self.config.max_limits();
        let timeout_ms = match req.timeout_ms {
            0 => self.config.default_limits().timeout_ms,
            v if v > max.timeout_ms => {
                return Err(Error::LimitAboveMax {
                    name: "timeout_ms",
                    requested: v,
                    max: max.timeout_ms,
                })
            }
            v => v,
        };
        let cap = self.config.session.exec_max_output_bytes;
        let max_output_bytes = match req.max_output_bytes {
            0 => cap,
            v if v > cap => {
                return Err(Error::LimitAboveMax {
                    name: "max_output_bytes",
                    requested: v,
                    max: cap,
                })
            }
            v => v,
        };
        let workdir = match workspace::path(&req.workdir, "workdir", true)? {
            None => "/workspace".to_owned(),
            Some(p) => {
                // Must be a real directory inside the workspace, reached without links.
                s.workspace
                    .open_dir(p.as_str())
                    .map_err(|e| workspace::refusal(p.as_str(), e))?;
                format!("/workspace/{p}")
            }
        };
        if req.command.contains('\0') {
            return Err(Error::invalid("command contains a NUL character"));
        }
        if req.detach && !self.backend.keeps_background() {
            return Err(Error::DetachUnsupported);
        }
        let spec = ExecSpec {
            command: if req.detach {
                session::detached(&req.command)
            } else {
                req.command
            },
            workdir,
            timeout: Duration::from_millis(timeout_ms),
            max_output_bytes,
        };
        let out = {
            let _between_checkpoints = s.checkpointing.read().await;
            self.backend.exec(&s.sandbox, &spec).await
        };
        // Shutdown killed it (and removed the session): retry elsewhere.
        self.open()?;
        let out = out?;
        Ok(pb::ExecResult {
            exit_code: out.exit_code,
            timed_out: out.timed_out,
            stdout_truncated: out.stdout.truncated(),
            stderr_truncated: out.stderr.truncated(),
            stdout: out.stdout.into_bytes().into(),
            stderr: out.stderr.into_bytes().into(),
            duration_ms: out.duration_ms,
            writable_area_full: s.sandbox.areas.is_full(),
        })
    }

    pub async fn read_file(&self, req: pb::ReadFileRequest) -> Result<pb::ReadFileResponse> {
        self.open()?;
        let s = self.session(&req.session_id)?;
        let cap = self.config.session.read_max_bytes;
        let max = match req.max_bytes {
            0 => cap,
            v if v > cap => {
                return Err(Error::LimitAboveMax {
                    name: "max_bytes",
                    requested: v,
                    max: cap,
                })
            }
            v => v,
        };
        let path = workspace::path(&req.path, "path", false)?
            .ok_or_else(|| Error::invalid("path is empty"))?;
        let (content, truncated, size) =
            blocking(move || workspace::read(&s.workspace, &path, max)).await?;
        Ok(pb::ReadFileResponse {
            content: content.into(),
            truncated,
            size_bytes: size,
        })
    }

    pub async fn write_file(&self, req: pb::WriteFileRequest) -> Result<pb::WriteFileResponse> {
        self.open()?;
        let s = self.session(&req.session_id)?;
        let path = workspace::path(&req.path, "path", false)?
            .ok_or_else(|| Error::invalid("path is empty"))?;
        let append = req.mode == pb::WriteMode::Append as i32;
        let owner = self.owner;
        let cap = self.config.max_total_output_bytes;
        let together = if s.sandbox.areas.in_engine() {
            "for /workspace and for /tmpfs each"
        } else {
            "for /workspace and /tmpfs together"
        };
        let (written, size) =
            blocking(move || workspace::write(&s.workspace, &path, &req.content, append, owner))
                .await
                .map_err(|e| match e {
                    Error::Io { source, .. }
                        if source.raw_os_error() == Some(libc::ENOSPC) =>
                    {
                        Error::ResourceExhausted {
                            message: format!(
                                "the session's writable area is full (max_total_output_bytes = {cap} {together}): remove files, or ask the operator to raise the cap"
                            ),
                            reason: "no_space",
                        }
                    }
                    other => other,
                })?;
        Ok(pb::WriteFileResponse {
            bytes_written: written,
            size_bytes: size,
        })
    }

    pub async fn glob(&self, req: pb::GlobRequest) -> Result<pb::GlobResponse> {
        self.open()?;
        let s = self.session(&req.session_id)?;
        let cap = self.config.session.glob_max_results;
        let max = match req.max_results {
            0 => cap,
            v if v > cap => {
                return Err(Error::LimitAboveMax {
                    name: "max_results",
                    requested: v.into(),
                    max: cap.into(),
                })
            }
            v => v,
        };
        if req.pattern.is_empty() {
            return Err(Error::invalid("pattern is empty"));
        }
        let base = workspace::path(&req.base_path, "base_path", true)?;
        let walk = self.config.session.max_walk_entries;
        let (paths, truncated) =
            blocking(move || workspace::glob(&s.workspace, base.as_ref(), &req.pattern, max, walk))
                .await?;
        Ok(pb::GlobResponse { paths, truncated })
    }

    pub async fn grep(&self, req: pb::GrepRequest) -> Result<pb::GrepResponse> {
        self.open()?;
        let s = self.session(&req.session_id)?;
        let cap = self.config.session.grep_max_matches;
        let max = match req.max_matches {
            0 => cap,
            v if v > cap => {
                return Err(Error::LimitAboveMax {
                    name: "max_matches",
                    requested: v.into(),
                    max: cap.into(),
                })
            }
            v => v,
        };
        if req.pattern.is_empty() {
            return Err(Error::invalid("pattern is empty"));
        }
        let path = workspace::path(&req.path, "path", true)?;
        let walk = self.config.session.max_walk_entries;
        let (matches, truncated) = blocking(move || {
            workspace::grep(
                &s.workspace,
                path.as_ref(),
                &req.pattern,
                req.is_regex,
                req.case_sensitive,
                max,
                walk,
            )
        })
        .await?;
        Ok(pb::GrepResponse {
            matches: matches
                .into_iter()
                .map(|m| pb::GrepMatch {
                    path: m.path,
                    line: m.line,
                    text: m.text,
                })
                .collect(),
            truncated,
        })
    }

    /// Packs the workspace into a file beside the task directory.
    pub async fn pack(&self, req: pb::PackRequest) -> Result<Packed> {
        self.open()?;
        let s = self.session(&req.session_id)?;
        // The service refused numbers the proto does not declare (reason `unknown_enum`).
        let format = match req.format() {
            pb::ArchiveFormat::Zip => Format::Zip,
            pb::ArchiveFormat::TarGz => Format::TarGz,
        };
        let cap = self.config.session.max_archive_bytes;
        let max = match req.max_archive_bytes {
            0 => cap,
            v if v > cap => {
                return Err(Error::LimitAboveMax {
                    name: "max_archive_bytes",
                    requested: v,
                    max: cap,
                })
            }
            v => v,
        };
        let name = if req.archive_name.is_empty() {
            format!("{}.{}", s.sandbox.session_id, format.extension())
        } else {
            let p = pathguard::validate(&req.archive_name).map_err(|rejection| Error::Path {
                what: "archive_name",
                rejection,
            })?;
            if p.components().count() != 1 {
                return Err(Error::invalid(format!(
                    "archive_name {:?} must be a file name without directories",
                    req.archive_name
                )));
            }
            p.as_str().to_owned()
        };
        let excludes = pack::excludes(&req.exclude_patterns)?;
        let mtime = pack::entry_time(&req.entry_mtime)?;
        // Beside the task directory, not in it: the archive does not count against the
        // session's writable area (its own cap is max_archive_bytes).
        let path = s.sandbox.task_dir.with_file_name(format!(
            "{}.pack-{}",
            s.sandbox.session_id,
            uuid::Uuid::new_v4().simple()
        ));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .open(&path)
            .map_err(Error::io("creating the archive file"))?;
        let mut packed = Packed {
            path,
            name,
            report: PackReport::default(),
        };
        let walk = self.config.session.max_walk_entries;
        packed.report = blocking(move || {
            pack::pack(&s.workspace, format, &excludes, mtime, file, max, walk).map_err(Error::from)
        })
        .await?;
        Ok(packed)
    }

    /// Closes an open session; one still opening is cancelled and this waits until its
    /// teardown is done. False when no session has this id.
    pub async fn close_session(&self, id: &str) -> Result<bool> {
        match self.sessions.close(id) {
            Closing::Absent => Ok(false),
            Closing::Opening(mut gone) => {
                // Ends (Err) when the opener releases the slot.
                while gone.changed().await.is_ok() {}
                tracing::info!(session_id = %id, "session closed while opening");
                Ok(true)
            }
            Closing::Open(s) => {
                self.remove_session(&s).await?;
                tracing::info!(session_id = %id, "session closed");
                Ok(true)
            }
        }
    }

    pub fn info(&self) -> pb::RunnerInfo {
        pb::RunnerInfo {
            runner_id: self.config.runner_id.clone(),
            backend: self.backend.name().into(),
            default_limits: Some(self.config.default_limits().to_proto()),
            max_limits: Some(self.config.max_limits().to_proto()),
            languages: job::LANGUAGES.iter().map(|s| s.to_string()).collect(),
            open_sessions: self.sessions.len() as u32,
            warm_containers: self.backend.warm_containers() as u32,
            image: self.config.image.clone(),
            allowed_images: self.config.allowed_images.clone(),
            network_allowed: self.config.network_allowed,
        }
    }

    /// Refuses new work, closes every session, kills and removes every sandbox.
    pub async fn shutdown(&self) {
        if self.closing.swap(true, Ordering::SeqCst) {
            return;
        }
        self.admission.close();
        for s in self.sessions.drain() {
            if let Err(e) = self.remove_session(&s).await {
                tracing::warn!(session_id = %s.sandbox.session_id, error = %e, "could not close session at shutdown");
            }
        }
        self.backend.shutdown().await;
        tracing::info!(
            runs_in_flight = self.running.load(Ordering::SeqCst),
            "sandbox-runner shut down; sandboxes removed"
        );
    }
}

/// The answer of an opening while the OpenSession call waits for it. Dropped with the call
/// after the session opened but before the call took the answer: the session is closed.
struct Unclaimed {
    runner: Arc<Runner>,
    rx: tokio::sync::oneshot::Receiver<Result<pb::SessionInfo>>,
    taken: bool,
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        if let (Ok(Ok(info)), Ok(rt)) = (self.rx.try_recv(), tokio::runtime::Handle::try_current())
        {
            let runner = self.runner.clone();
            rt.spawn(async move { runner.close_unclaimed(info.session_id).await });
        }
    }
}

struct Decrement<'a>(&'a AtomicUsize);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Sandbox(format!("worker panicked: {e}")))?
}

/// The id kept in `<work_root>/runner-id`, made on first start from the host name and a random
/// suffix, so a restarted runner finds (and removes) the containers of its earlier life.
fn stored_runner_id(work_root: &std::path::Path) -> Result<String> {
    let file = work_root.join("runner-id");
    if let Ok(text) = std::fs::read_to_string(&file) {
        let id = text.trim();
        if job::is_id(id) {
            return Ok(id.to_owned());
        }
    }
    let host =
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "runner".into());
    let host: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let id = format!(
        "{}-{suffix}",
        if host.is_empty() { "runner" } else { &host }
    );
    std::fs::write(&file, format!("{id}\n"))
        .map_err(Error::io(format!("writing {}", file.display())))?;
    Ok(id)
}

/// Removes every task directory left under `tasks` (one work_root per runner).
async fn sweep_task_dirs(tasks: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(tasks) else {
        return 0;
    };
    let mut n = 0;
    for entry in entries.flatten() {
        backend::remove_dir(&entry.path()).await;
        n += 1;
    }
    n
}
