//! The docker backend: one container per run (or per session), created with every limit the
//! engine offers, and removed on every path (a drop guard removes it when a call is cancelled
//! or fails). A run's container runs the agent (docker_pool.rs, agent.py): inputs in, /output
//! (a tmpfs of `max_total_output_bytes` the engine mounts) read back as a tar stream.
//! It must never leave a container behind nor read an output file through the host.
//!
//! Runner liveness: every container's first process reads an attach stream the runner holds
//! open (stdin, closed by the engine when the runner's connection goes: `stdin_once`). A run's
//! agent and a session's idle process end the container at end of file, so the sandboxes of a
//! runner that died stop at once instead of running on beside the retry. Session Execs carry a CAIRN_EXEC_ID in their environment: a timed-out or
//! cancelled Exec kills its own processes (exec_kill.py), never the session's others.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use cairn_proto::StdStream;
use futures::{Stream, StreamExt};
use tokio::time::sleep_until;

use super::area::{self, SessionAreas};
pub use super::docker_config::{host_config, session_host_config, SessionAreasAt};
use super::docker_pool::{start_agent, AgentContainer, DockerSource, Warm};
use super::{keep, ExecOutcome, ExecSpec, KillOnDrop, Live, SessionSandbox};
use crate::admission::Queued;
use crate::capture::Capture;
use crate::config::{AreasChoice, Config};
use crate::error::{Error, Result};
use crate::job::{Job, Outcome};
use crate::pool::{Pool, Pooled, Served};

pub const LABEL_RUNNER: &str = "cairn.runner_id";
pub(super) const EXEC_KILL: &str = include_str!("../exec_kill.py");
/// The runner's end of a container's stdin: dropped (or the runner gone), the container stops.
pub type Lease = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;
pub const LABEL_KIND: &str = "cairn.kind";

/// How long the engine gets to close the output stream after SIGKILL before we stop waiting.
const KILL_BACKSTOP: Duration = Duration::from_secs(10);

/// Containers this runner created and has not removed yet.
pub type LiveSet = Arc<Mutex<HashSet<String>>>;

pub struct DockerBackend {
    client: bollard::Docker,
    config: Arc<Config>,
    live: LiveSet,
    pool: Option<Arc<Pool<DockerSource>>>,
    /// The stdin leases of session containers (by name), held until the session is removed.
    leases: Mutex<HashMap<String, Lease>>,
    /// Sessions' /workspace and /tmpfs are tmpfs mounts the engine makes (area.rs).
    engine_areas: bool,
}

impl DockerBackend {
    /// Connects and negotiates the API version (the engine here speaks 1.41); checks the image.
    pub async fn connect(config: Arc<Config>, queued: Queued) -> Result<DockerBackend> {
        let client = bollard::Docker::connect_with_local_defaults()
            .map_err(Error::docker("connecting to the Docker engine"))?;
        let client = tokio::time::timeout(Duration::from_secs(5), client.negotiate_version())
            .await
            .map_err(|_| Error::Sandbox("the Docker engine did not answer within 5 s".into()))?
            .map_err(Error::docker("negotiating the Engine API version"))?;
        client.inspect_image(&config.image).await.map_err(|e| Error::Docker {
            context: format!(
                "sandbox image {:?} is missing: build it with deploy/images/build-images.sh (nothing can be pulled) or set `image`",
                config.image
            ),
            source: e,
        })?;
        let live = LiveSet::default();
        let pool = (config.pool_size > 0).then(|| {
            Arc::new(Pool::new(
                DockerSource {
                    client: client.clone(),
                    config: config.clone(),
                    live: live.clone(),
                },
                queued,
            ))
        });
        let engine_areas = match config.session.areas {
            AreasChoice::Engine => true,
            AreasChoice::Runner => false,
            AreasChoice::Auto => !area::available() && area::in_host_pid_namespace(),
        };
        if engine_areas {
            tracing::info!(
                bytes = config.max_total_output_bytes,
                "sessions' /workspace and /tmpfs are tmpfs mounts the engine makes, each of max_total_output_bytes"
            );
        }
        Ok(DockerBackend {
            client,
            config,
            live,
            pool,
            leases: Mutex::default(),
            engine_areas,
        })
    }

    pub fn start_pool(&self) {
        if let Some(pool) = &self.pool {
            pool.clone().fill();
        }
    }

    pub fn warm_containers(&self) -> usize {
        self.pool.as_ref().map(|p| p.ready_count()).unwrap_or(0)
    }

    fn container_name(&self, id: &str) -> String {
        format!(
            "{}{id}{}",
            self.config.container_prefix, self.config.container_suffix
        )
    }

    /// Removes containers labelled with this runner's id (and, with `sweep_all_prefixed`, any
    /// named `<prefix>*<suffix>`): leftovers of a runner that died.
    pub async fn sweep(&self) -> Result<usize> {
        let mut names = HashSet::new();
        let by_label = HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_RUNNER}={}", self.config.runner_id)],
        )]);
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&by_label)
            .build();
        for c in self
            .client
            .list_containers(Some(opts))
            .await
            .map_err(Error::docker("listing containers"))?
        {
            if let Some(id) = c.id {
                names.insert(id);
            }
        }
        if self.config.sweep_all_prefixed {
            let by_name = HashMap::from([(
                "name".to_string(),
                vec![self.config.container_prefix.clone()],
            )]);
            let opts = ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&by_name)
                .build();
            for c in self
                .client
                .list_containers(Some(opts))
                .await
                .map_err(Error::docker("listing containers"))?
            {
                let matches = c.names.iter().flatten().any(|n| {
                    let n = n.trim_start_matches('/');
                    n.starts_with(&self.config.container_prefix)
                        && n.ends_with(&self.config.container_suffix)
                });
                if let (true, Some(id)) = (matches, c.id) {
                    names.insert(id);
                }
            }
        }
        for name in &names {
            remove_and_wait(&self.client, name).await?;
        }
        Ok(names.len())
    }

    pub async fn run(&self, job: &Job, live: Option<&Live>) -> Result<Outcome> {
        let grace = self.config.kill_grace_ms;
        // A warm container's failure is the run's: its program had started.
        let warm =
            |warm: Warm| async move { warm.run(job, live, grace).await.map_err(Pooled::Failed) };
        let _cold = match Pool::serve(self.pool.as_ref(), |p| p.fits(job), warm).await {
            Served::Done(outcome) => return outcome,
            Served::Cold(hold) => hold,
        };
        self.run_cold(job, live).await
    }

    /// A container made for this job, running the agent as a warm one does (its /output a
    /// tmpfs of `max_total_output_bytes` the engine mounts): whatever rights the runner has.
    async fn run_cold(&self, job: &Job, live: Option<&Live>) -> Result<Outcome> {
        let mut labels = self.labels("run");
        labels.insert("cairn.job_id".into(), job.id.clone());
        labels.insert("cairn.run_id".into(), job.run_id.clone());
        labels.insert("cairn.node_id".into(), job.node_id.clone());
        let agent = start_agent(
            &self.client,
            &self.live,
            &self.config,
            AgentContainer {
                name: self.container_name(&job.id),
                labels,
                image: &job.image,
                limits: &job.limits,
                network: job.network.then_some(self.config.docker_network.as_str()),
                warm: false,
            },
        )
        .await?;
        agent.run(job, live, self.config.kill_grace_ms).await
    }

    fn labels(&self, kind: &str) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_RUNNER.to_string(), self.config.runner_id.clone()),
            (LABEL_KIND.to_string(), kind.to_string()),
        ])
    }

    /// Creates a container and returns the guard that removes it.
    async fn create(&self, name: &str, body: ContainerCreateBody) -> Result<ContainerGuard> {
        create(&self.client, &self.live, name, body).await
    }

    /// Reads the output stream until it ends; at the deadline sends SIGTERM, after the grace
    /// SIGKILL. Returns whether the deadline was hit. Output written before the kill is kept.
    async fn pump(
        &self,
        output: &mut (impl Stream<Item = Result<LogOutput, bollard::errors::Error>> + Unpin),
        stdout: &mut Capture,
        stderr: &mut Capture,
        live: Option<&Live>,
        deadline: Instant,
        target: Target<'_>,
    ) -> bool {
        pump(
            &self.client,
            self.config.kill_grace_ms,
            output,
            stdout,
            stderr,
            live,
            deadline,
            target,
        )
        .await
    }

    pub fn engine_areas(&self) -> bool {
        self.engine_areas
    }

    /// The session container's /workspace and /tmpfs as this runner reaches them (areas the
    /// engine mounted): through the root of its main process, checked to still be its own
    /// once held open.
    pub async fn session_areas(&self, s: &SessionSandbox) -> Result<SessionAreas> {
        let pid = self.running_pid(&s.name).await?;
        let areas = SessionAreas::of_process_root(pid).map_err(|e| {
            Error::Sandbox(format!(
                "the runner cannot reach the files of session container {} (process {pid}): {e}. \
                 With [session] areas = \"engine\" the runner must share the engine's pid namespace \
                 (in a container: pid: host) and may read other processes' roots; otherwise set areas = \"runner\"",
                s.name
            ))
        })?;
        if self.running_pid(&s.name).await? != pid {
            return Err(Error::Sandbox(format!(
                "session container {} restarted while its files were being reached",
                s.name
            )));
        }
        Ok(areas)
    }

    async fn running_pid(&self, name: &str) -> Result<i64> {
        let info = self
            .client
            .inspect_container(name, None)
            .await
            .map_err(Error::docker("inspecting the session container"))?;
        match info.state.as_ref().and_then(|st| st.pid) {
            Some(pid) if pid > 0 && info.state.as_ref().and_then(|st| st.running) == Some(true) => {
                Ok(pid)
            }
            _ => Err(Error::Sandbox(format!(
                "session container {name} is not running"
            ))),
        }
    }

    /// Starts the long-lived container of a session: /workspace and /tmpfs bound from the
    /// task directory, or (engine areas) tmpfs mounts of `max_total_output_bytes` each; the
    /// main process only sleeps, commands come by exec.
    pub async fn open_session(&self, s: &SessionSandbox) -> Result<()> {
        let mut labels = self.labels("session");
        labels.insert("cairn.session_id".into(), s.session_id.clone());
        labels.insert("cairn.run_id".into(), s.run_id.clone());
        labels.insert("cairn.node_id".into(), s.node_id.clone());
        let workspace = s.task_dir.join("workspace");
        let tmpfs = s.task_dir.join("tmpfs");
        let body = ContainerCreateBody {
            image: Some(s.image.clone()),
            // Idle until the runner's stdin lease closes (session closed, or the runner gone).
            cmd: Some(vec!["cat".into()]),
            // The idle process runs as (capability-less) root so that nothing the sandbox user
            // does can end the container.
            user: Some("0:0".into()),
            working_dir: Some("/workspace".into()),
            labels: Some(labels),
            attach_stdin: Some(true),
            open_stdin: Some(true),
            stdin_once: Some(true),
            tty: Some(false),
            network_disabled: Some(!s.network),
            host_config: Some(session_host_config(
                host_config(
                    &s.limits,
                    s.network.then_some(self.config.docker_network.as_str()),
                ),
                match self.engine_areas {
                    true => SessionAreasAt::Engine {
                        size: self.config.max_total_output_bytes,
                        uid: self.config.sandbox_uid,
                        gid: self.config.sandbox_gid,
                    },
                    false => SessionAreasAt::Runner {
                        workspace: &workspace,
                        tmpfs: &tmpfs,
                    },
                },
            )),
            ..Default::default()
        };
        let guard = self.create(&s.name, body).await?;
        let attach = AttachContainerOptionsBuilder::default()
            .stdin(true)
            .stream(true)
            .build();
        let lease = self
            .client
            .attach_container(&s.name, Some(attach))
            .await
            .map_err(Error::docker("attaching to the session container"))?
            .input;
        self.client
            .start_container(&s.name, None)
            .await
            .map_err(Error::docker("starting the session container"))?;
        if let Ok(mut leases) = self.leases.lock() {
            leases.insert(s.name.clone(), lease);
        }
        // The session owns it from here; CloseSession (or shutdown) removes it.
        guard.keep();
        Ok(())
    }

    /// Runs `bash -lc COMMAND` in the session's container as the sandbox user.
    pub async fn exec(&self, s: &SessionSandbox, spec: &ExecSpec) -> Result<ExecOutcome> {
        let exec_id = uuid::Uuid::new_v4().simple().to_string();
        let user = format!("{}:{}", self.config.sandbox_uid, self.config.sandbox_gid);
        // Armed before the exec exists: a call dropped (client deadline, cancel) from here on
        // kills what the command started.
        let mut stopper = {
            let (client, container) = (self.client.clone(), s.name.clone());
            let (user, exec_id) = (user.clone(), exec_id.clone());
            KillOnDrop::new(async move {
                let target = Target {
                    name: &container,
                    user: &user,
                    exec_id: &exec_id,
                };
                signal(&client, target, "SIGKILL").await;
            })
        };
        let opts = CreateExecOptions {
            attach_stdin: Some(false),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            env: Some(vec![
                "HOME=/tmpfs".to_string(),
                "LANG=C.UTF-8".to_string(),
                "PYTHONUNBUFFERED=1".to_string(),
                format!("CAIRN_EXEC_ID={exec_id}"),
            ]),
            cmd: Some(vec![
                "bash".to_string(),
                "-lc".to_string(),
                spec.command.clone(),
            ]),
            user: Some(format!(
                "{}:{}",
                self.config.sandbox_uid, self.config.sandbox_gid
            )),
            working_dir: Some(spec.workdir.clone()),
            ..Default::default()
        };
        let exec = self
            .client
            .create_exec(&s.name, opts)
            .await
            .map_err(Error::docker("creating the exec"))?;
        let t0 = Instant::now();
        let started = self
            .client
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(Error::docker("starting the exec"))?;
        let StartExecResults::Attached { mut output, input } = started else {
            return Err(Error::Sandbox("the engine detached the exec".into()));
        };
        // stdin closed at once: the command reads EOF.
        drop(input);
        let mut stdout = Capture::new(spec.max_output_bytes);
        let mut stderr = Capture::new(spec.max_output_bytes);
        let target = Target {
            name: &s.name,
            user: &user,
            exec_id: &exec_id,
        };
        let timed_out = self
            .pump(
                &mut output,
                &mut stdout,
                &mut stderr,
                None,
                t0 + spec.timeout,
                target,
            )
            .await;
        let exit_code = if timed_out {
            -1
        } else {
            let info = self
                .client
                .inspect_exec(&exec.id)
                .await
                .map_err(Error::docker("inspecting the exec"))?;
            info.exit_code.unwrap_or(-1) as i32
        };
        // Background children of a command that ended stay, as in any shell session.
        stopper.disarm();
        Ok(ExecOutcome {
            exit_code,
            timed_out,
            duration_ms: t0.elapsed().as_millis() as u64,
            stdout,
            stderr,
        })
    }

    pub async fn remove_container(&self, name: &str) -> Result<()> {
        remove(&self.client, name).await?;
        forget(&self.live, name);
        if let Ok(mut leases) = self.leases.lock() {
            leases.remove(name);
        }
        Ok(())
    }

    pub async fn shutdown(&self) {
        if let Some(pool) = &self.pool {
            pool.close().await;
        }
        let names: Vec<String> = match self.live.lock() {
            Ok(set) => set.iter().cloned().collect(),
            Err(_) => Vec::new(),
        };
        for name in names {
            if let Err(e) = self.remove_container(&name).await {
                tracing::warn!(container = %name, error = %e, "could not remove container at shutdown");
            }
        }
    }
}

/// Which processes a timeout signal goes to: one Exec of a session container, the processes
/// carrying its id (exec_kill.py).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    name: &'a str,
    user: &'a str,
    exec_id: &'a str,
}

#[allow(clippy::too_many_arguments)]
pub async fn pump(
    client: &bollard::Docker,
    grace_ms: u64,
    output: &mut (impl Stream<Item = Result<LogOutput, bollard::errors::Error>> + Unpin),
    stdout: &mut Capture,
    stderr: &mut Capture,
    live: Option<&Live>,
    deadline: Instant,
    target: Target<'_>,
) -> bool {
    // Steps after the deadline: SIGTERM, SIGKILL after the grace, then give up waiting.
    let mut step = 0u8;
    let mut next = deadline;
    loop {
        tokio::select! {
            item = output.next() => match item {
                Some(Ok(LogOutput::StdOut { message })) | Some(Ok(LogOutput::Console { message })) => {
                    keep(stdout, &message, StdStream::Stdout, live).await
                }
                Some(Ok(LogOutput::StdErr { message })) => keep(stderr, &message, StdStream::Stderr, live).await,
                Some(Ok(LogOutput::StdIn { .. })) => {}
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "output stream ended with an error");
                    break;
                }
                None => break,
            },
            _ = sleep_until(next.into()) => {
                match step {
                    0 => {
                        signal(client, target, "SIGTERM").await;
                        next = Instant::now() + Duration::from_millis(grace_ms);
                    }
                    1 => {
                        signal(client, target, "SIGKILL").await;
                        next = Instant::now() + KILL_BACKSTOP;
                    }
                    _ => {
                        tracing::warn!("output stream still open after SIGKILL; removing the container");
                        break;
                    }
                }
                step += 1;
            }
        }
    }
    step > 0
}

async fn signal(client: &bollard::Docker, target: Target<'_>, sig: &str) {
    let Target {
        name,
        user,
        exec_id,
    } = target;
    let number = if sig == "SIGKILL" { "9" } else { "15" };
    let opts = CreateExecOptions {
        cmd: Some(vec![
            "/usr/bin/python3".to_string(),
            "-I".to_string(),
            "-S".to_string(),
            "-c".to_string(),
            EXEC_KILL.to_string(),
            number.to_string(),
            exec_id.to_string(),
        ]),
        user: Some(user.to_string()),
        ..Default::default()
    };
    let result = match client.create_exec(name, opts).await {
        Ok(exec) => client
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: true,
                    tty: false,
                    output_capacity: None,
                }),
            )
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        // 409: the container already stopped; nothing to kill.
        tracing::debug!(signal = sig, error = %e, "signal not delivered");
    }
}

/// Creates a container and returns the guard that removes it.
pub async fn create(
    client: &bollard::Docker,
    live: &LiveSet,
    name: &str,
    body: ContainerCreateBody,
) -> Result<ContainerGuard> {
    let opts = CreateContainerOptionsBuilder::default().name(name).build();
    let image = body.image.clone();
    if let Ok(mut set) = live.lock() {
        set.insert(name.to_owned());
    }
    // The create runs in a task of its own, so the engine's answer is always heard: a call
    // dropped while the engine creates leaves a `PendingCreate` that removes the container
    // once the create is through (a removal sent earlier would find nothing and the container
    // would stay, `created`, until the next start-up sweep).
    let task = tokio::spawn({
        let client = client.clone();
        async move { client.create_container(Some(opts), body).await.map(|_| ()) }
    });
    let mut pending = PendingCreate {
        task: Some(task),
        client: client.clone(),
        live: live.clone(),
        name: name.to_owned(),
    };
    let created = match pending.task.as_mut() {
        Some(task) => task.await,
        None => return Err(Error::Sandbox("container create task missing".into())),
    };
    pending.task = None;
    let guard = ContainerGuard {
        client: client.clone(),
        live: live.clone(),
        name: name.to_owned(),
        armed: true,
    };
    match created {
        Ok(Ok(())) => Ok(guard),
        // The engine refused: nothing to remove (the name may be somebody else's container).
        Ok(Err(e)) => {
            forget(live, name);
            guard.keep();
            Err(create_error(name, image.as_deref(), e))
        }
        // The task panicked or was aborted (runtime ending): the guard removes whatever exists.
        Err(e) => Err(Error::Sandbox(format!("creating container {name}: {e}"))),
    }
}

/// The engine's refusal of a create; a missing image says how to get it (nothing is pulled).
fn create_error(name: &str, image: Option<&str>, e: bollard::errors::Error) -> Error {
    match (&e, image) {
        (
            bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                message,
            },
            Some(image),
        ) if message.contains("No such image") => Error::ImageMissing(image.to_owned()),
        _ => Error::docker(format!("creating container {name}"))(e),
    }
}

/// A container create still in flight when its caller went away: removes the container once
/// the engine has made it.
struct PendingCreate {
    task: Option<tokio::task::JoinHandle<Result<(), bollard::errors::Error>>>,
    client: bollard::Docker,
    live: LiveSet,
    name: String,
}

impl Drop for PendingCreate {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        let (client, live, name) = (self.client.clone(), self.live.clone(), self.name.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Ok(Ok(())) = task.await {
                    if let Err(e) = remove_and_wait(&client, &name).await {
                        tracing::warn!(container = %name, error = %e, "could not remove a container whose run was cancelled");
                    }
                }
                forget(&live, &name);
            });
        }
    }
}

/// Force-removes a container and its anonymous volumes; a missing container is fine.
pub async fn remove(client: &bollard::Docker, name: &str) -> Result<()> {
    let opts = RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    match client.remove_container(name, Some(opts)).await {
        Ok(()) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404 | 409,
            ..
        }) => Ok(()),
        Err(e) => Err(Error::docker(format!("removing container {name}"))(e)),
    }
}

/// Removes a container and waits (bounded) until the engine no longer has it: a dead runner's
/// last requests may still be running in the engine, and a 409 (another removal in progress)
/// does not mean the container is gone.
async fn remove_and_wait(client: &bollard::Docker, name: &str) -> Result<()> {
    for _ in 0..50 {
        remove(client, name).await?;
        match client.inspect_container(name, None).await {
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(()),
            _ => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
    Err(Error::Sandbox(format!(
        "container {name} is still there after 5 s of removal attempts"
    )))
}

fn forget(live: &LiveSet, name: &str) {
    if let Ok(mut set) = live.lock() {
        set.remove(name);
    }
}

/// Removes its container when dropped unless `remove` or `keep` ran: a cancelled or failed
/// run leaves nothing behind.
pub struct ContainerGuard {
    client: bollard::Docker,
    live: LiveSet,
    name: String,
    armed: bool,
}

impl ContainerGuard {
    pub async fn remove(mut self) -> Result<()> {
        self.armed = false;
        let result = remove(&self.client, &self.name).await;
        forget(&self.live, &self.name);
        result
    }

    /// Removes the container from a spawned task (the guard's drop does exactly that).
    pub fn remove_in_background(self) {
        drop(self);
    }

    /// Hands the container to a longer-lived owner (session, pool).
    pub fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (client, live, name) = (self.client.clone(), self.live.clone(), self.name.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    // Until the engine no longer has it: a start or upload cancelled in flight
                    // may still be running there (a 409, or a removal that comes too early).
                    if let Err(e) = remove_and_wait(&client, &name).await {
                        tracing::warn!(container = %name, error = %e, "could not remove container");
                    }
                    forget(&live, &name);
                });
            }
            Err(_) => {
                tracing::warn!(container = %self.name, "no runtime to remove container; the start-up sweep will")
            }
        }
    }
}
