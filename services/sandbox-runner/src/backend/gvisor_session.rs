//! Sessions on the gvisor backend: one gVisor sandbox for the session's life (`runsc run`,
//! started at OpenSession), over the session's /workspace and /tmpfs, with its memory and cpu
//! limits over the whole sandbox. Its first process is the waiter as root with only
//! CAP_SETUID and CAP_SETGID (the sandbox user cannot signal it), waiting on a pipe the runner
//! holds: at end of file (the session closed, or the runner died) it exits and the sandbox
//! ends with every process in it. Each Exec is a `runsc exec` into it of the waiter as the
//! sandbox user, relaying `bash -lc COMMAND` in frames as a run's waiter does; the command
//! itself (in a session of its own, CAIRN_EXEC_ID in its environment, the session's rlimits)
//! is started as the sandbox user by the first process, which the relay asks over a unix
//! socket. So what a command leaves in the background runs on for the next Exec, and through
//! a checkpoint and restore: a restore ends every process started through `runsc exec`. A
//! timed-out or cancelled Exec signals only its own processes (exec_kill.py, run through
//! `runsc exec`): SIGTERM, the grace, SIGKILL.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

use super::docker::EXEC_KILL;
use super::gvisor::{
    waiter_argv, waiter_env, Base, GvisorBackend, Relayed, Sandbox, Spec, Target, WaiterMode,
};
use super::local::rlimits;
use super::local_pool::{send_go, Go, READY, READY_TIMEOUT};
use super::{die_with_runner, session_env, ExecOutcome, ExecSpec, KillOnDrop, SessionSandbox};
use crate::error::{Error, Result};
use crate::limits::Limits;

/// Longest a `runsc checkpoint` may take.
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(300);

/// An open session's sandbox: `runsc run`, its stdin (the waiter's pipe) held open.
pub(super) struct SessionBox {
    sandbox: Sandbox,
}

impl SessionBox {
    pub(super) fn id(&self) -> &str {
        &self.sandbox.id
    }

    /// Ends the sandbox (the waiter reads end of file; runsc run killed after 5 s) and
    /// deletes it.
    pub(super) async fn close(mut self) {
        drop(self.sandbox.child.stdin.take());
        let ended = tokio::time::timeout(Duration::from_secs(5), self.sandbox.child.wait()).await;
        if ended.is_err() {
            tracing::warn!(sandbox = %self.sandbox.id, "a session's gVisor sandbox did not end with its first process; killing it");
        }
        self.sandbox.destroy().await;
    }
}

impl GvisorBackend {
    /// Starts the session's sandbox and waits until its first process is ready.
    pub async fn open_session(&self, s: &SessionSandbox) -> Result<()> {
        self.boot(s, None, false).await
    }

    /// Starts the session's sandbox from the checkpoint in `image` (`runsc restore`): its
    /// processes go on where they were, over the session's (unpacked) files.
    pub async fn restore_session(&self, s: &SessionSandbox, image: &Path) -> Result<()> {
        self.boot(s, Some(image), false).await
    }

    /// After a `checkpoint` of the open session into `image`: its sandbox again from that
    /// image (`runsc restore`, over the same task directory), in place of the stopped one,
    /// so the session goes on under its id with its processes. Err when the restore fails
    /// (the stopped sandbox stays in the map for the caller's close) or the session was
    /// closed meanwhile (the restored sandbox is ended).
    pub async fn restore_in_place(&self, s: &SessionSandbox, image: &Path) -> Result<()> {
        self.boot(s, Some(image), true).await
    }

    /// `runsc checkpoint` of the session's sandbox into `image`: memory, processes and the
    /// sandbox's own /tmp. The sandbox stops (this runsc cannot leave it running): the
    /// caller closes the session after, or restores it in place.
    pub async fn checkpoint(&self, s: &SessionSandbox, image: &Path) -> Result<()> {
        let sandbox = self.session_sandbox(s)?;
        let _lifted = self.base.lift_cpu_quota(&sandbox);
        let mut cmd = Command::new(&self.base.runsc);
        cmd.env_clear()
            .args(self.base.global_args())
            .arg("checkpoint")
            .arg(format!("--image-path={}", image.display()))
            .args(&self.base.checkpoint_flags)
            .arg(&sandbox)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(CHECKPOINT_TIMEOUT, cmd.output())
            .await
            .map_err(|_| {
                Error::Sandbox(format!(
                    "runsc checkpoint took longer than {} s",
                    CHECKPOINT_TIMEOUT.as_secs()
                ))
            })?
            .map_err(Error::io("running runsc checkpoint"))?;
        if !out.status.success() {
            return Err(Error::Sandbox(format!(
                "runsc checkpoint of session {} failed: {}",
                s.session_id,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    fn session_sandbox(&self, s: &SessionSandbox) -> Result<String> {
        self.sessions
            .lock()
            .ok()
            .and_then(|m| m.get(&s.session_id).map(|b| b.id().to_owned()))
            .ok_or_else(|| {
                Error::Sandbox(format!(
                    "session {} has no gVisor sandbox (it was closed): open a new session",
                    s.session_id
                ))
            })
    }

    /// Is the session's sandbox running (`runsc state`)? False when it has none.
    pub async fn session_running(&self, s: &SessionSandbox) -> bool {
        match self.session_sandbox(s) {
            Ok(id) => self.base.state(&id).await.as_deref() == Some("running"),
            Err(_) => false,
        }
    }

    /// Starts the session's sandbox (restored from `image` when given). `in_place`: it
    /// replaces the session's stopped sandbox, which must still be in the map (a session
    /// closed meanwhile has none, and the new sandbox is ended).
    async fn boot(&self, s: &SessionSandbox, image: Option<&Path>, in_place: bool) -> Result<()> {
        let config = &self.base.config;
        let max = config.max_limits();
        // Memory and cpu hold over the sandbox; each command gets the session's rlimits.
        let limits = Limits {
            memory_bytes: s.limits.memory_bytes,
            cpu_millis: s.limits.cpu_millis,
            ..max
        };
        let env = waiter_env();
        let spec = Spec {
            id: format!("session-{}", uuid::Uuid::now_v7().simple()),
            root: true,
            binds: vec![
                (s.task_dir.join("workspace"), "/workspace", true),
                (s.task_dir.join("tmpfs"), "/tmpfs", true),
            ],
            network: s.network,
            limits: &limits,
            timeout: Duration::from_millis(max.timeout_ms),
            cwd: "/",
            env: &env,
            argv: {
                let mut argv = waiter_argv(WaiterMode::Ready);
                argv.push("--spawn".into());
                argv.push(format!("{}:{}", config.sandbox_uid, config.sandbox_gid));
                argv
            },
        };
        let mut sandbox = self
            .base
            .launch(&spec, Stdio::piped(), image)
            .await
            .map_err(|e| e.0)?;
        let (Some(mut out), Some(mut err)) =
            (sandbox.child.stdout.take(), sandbox.child.stderr.take())
        else {
            return Err(Error::Sandbox("runsc started without pipes".into()));
        };
        let started = match image {
            // The restored waiter said it was ready before its checkpoint: wait for runsc.
            Some(_) => self.base.restored(&mut sandbox).await,
            None => {
                let mut ready = [0u8; READY.len()];
                let answered =
                    tokio::time::timeout(READY_TIMEOUT, out.read_exact(&mut ready)).await;
                matches!(answered, Ok(Ok(_))) && ready == READY
            }
        };
        if !started {
            let _ = sandbox.child.start_kill();
            let mut why = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(2), err.read_to_end(&mut why)).await;
            sandbox.destroy().await;
            let why = String::from_utf8_lossy(&why);
            return Err(Error::Sandbox(match image {
                Some(_) => format!(
                    "runsc restore could not restore the session from its snapshot: {}",
                    why.trim()
                ),
                None => format!(
                    "the session's gVisor sandbox did not start (its image needs python3): {}",
                    why.trim()
                ),
            }));
        }
        // Nothing more comes from the waiter; runsc's own messages are logged.
        let sandbox_id = sandbox.id.clone();
        tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = out.read_to_end(&mut sink).await;
            let mut text = Vec::new();
            let _ = err.read_to_end(&mut text).await;
            if !text.is_empty() {
                tracing::debug!(sandbox = %sandbox_id, stderr = %String::from_utf8_lossy(&text).trim(), "runsc run of a session ended");
            }
        });
        let (old, orphan) = {
            let mut m = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            if in_place && !m.contains_key(&s.session_id) {
                (None, Some(SessionBox { sandbox }))
            } else {
                (m.insert(s.session_id.clone(), SessionBox { sandbox }), None)
            }
        };
        if let Some(old) = old {
            old.close().await;
        }
        if let Some(orphan) = orphan {
            orphan.close().await;
            return Err(Error::Sandbox(format!(
                "session {} was closed while it was being checkpointed",
                s.session_id
            )));
        }
        Ok(())
    }

    /// Runs `bash -lc COMMAND` in the session's sandbox (`runsc exec` of a relaying waiter).
    pub async fn exec(&self, s: &SessionSandbox, spec: &ExecSpec) -> Result<ExecOutcome> {
        let sandbox = self.session_sandbox(s)?;
        let exec_id = uuid::Uuid::now_v7().simple().to_string();
        let mut env = session_env();
        env.push(("CAIRN_EXEC_ID".into(), exec_id.clone()));
        let argv = vec!["bash".into(), "-lc".into(), spec.command.clone()];
        let mut cmd = self
            .base
            .exec_command(&sandbox, &waiter_argv(WaiterMode::Now));
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Armed before the command can exist: a call dropped from here on (client deadline,
        // cancel) kills what it started.
        let mut stopper = {
            let (base, sandbox, exec_id) = (self.base.clone(), sandbox.clone(), exec_id.clone());
            KillOnDrop::new(async move { base.kill_exec(&sandbox, &exec_id, "KILL").await })
        };
        let mut child = cmd.spawn().map_err(Error::io("starting runsc exec"))?;
        let go = Go {
            argv: &argv,
            env: &env,
            cwd: &spec.workdir,
            rlimits: rlimits(&s.limits, spec.timeout).into_iter().collect(),
            relay: true,
            reap: false,
        };
        let (_, t0) = send_go(&mut child, go).await?;
        let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(Error::Sandbox("runsc exec started without pipes".into()));
        };
        let grace = Duration::from_millis(self.base.config.kill_grace_ms);
        let caps = (spec.max_output_bytes, spec.max_output_bytes);
        let target = Target::Exec {
            sandbox: &sandbox,
            exec_id: &exec_id,
        };
        let Relayed {
            status,
            step,
            stdout,
            stderr,
        } = self
            .base
            .pump(
                &mut out,
                &mut err,
                t0 + spec.timeout,
                grace,
                caps,
                None,
                target,
            )
            .await?;
        let exit_code = match status {
            Some(code) => code,
            // No status: the relay did not finish (the sandbox ended, or runsc failed).
            None => {
                let status = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                match status {
                    Ok(Ok(st)) => st.code().unwrap_or(-1),
                    _ => -1,
                }
            }
        };
        // Background children of a command that ended stay, as in any shell session.
        stopper.disarm();
        Ok(ExecOutcome {
            exit_code: if step > 0 { -1 } else { exit_code },
            timed_out: step > 0,
            duration_ms: t0.elapsed().as_millis() as u64,
            stdout,
            stderr,
        })
    }

    /// Ends the session's sandbox and deletes it (nothing when it has none).
    pub async fn close_session(&self, s: &SessionSandbox) -> Result<()> {
        let session = self
            .sessions
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&s.session_id));
        if let Some(session) = session {
            session.close().await;
        }
        Ok(())
    }
}

impl Base {
    /// Waits until a restored sandbox runs, false when `runsc restore` ended first or
    /// READY_TIMEOUT passed. Polls the container's state file under runsc's `--root` (what
    /// `runsc state` reads; a starting Go binary per poll cost a fork of ten restores seconds
    /// of CPU), and, while there is no such file, `runsc state` every half second (a runsc
    /// that keeps its state elsewhere).
    async fn restored(&self, sandbox: &mut super::gvisor::Sandbox) -> bool {
        let t0 = std::time::Instant::now();
        let mut polls = 0u32;
        let file = self
            .state
            .join(format!("{0}_sandbox:{0}.state", sandbox.id));
        while t0.elapsed() < READY_TIMEOUT {
            if !matches!(sandbox.child.try_wait(), Ok(None)) {
                return false;
            }
            polls += 1;
            let status = match tokio::fs::read(&file).await {
                // Being rewritten: not yet.
                Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|v| v["status"].as_str().map(str::to_owned)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && polls.is_multiple_of(100) => {
                    self.state(&sandbox.id).await
                }
                Err(_) => None,
            };
            if status.as_deref() == Some("running") {
                tracing::debug!(sandbox = %sandbox.id, ms = t0.elapsed().as_millis() as u64, polls, "restored sandbox runs");
                return true;
            }
            // A state file read is cheap: a resume waits 2.5 ms on average past its start.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    }

    /// The status `runsc state` gives sandbox `id` (None when it does not answer).
    async fn state(&self, id: &str) -> Option<String> {
        let mut cmd = Command::new(&self.runsc);
        cmd.env_clear()
            .args(self.global_args())
            .args(["state", id])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(5), cmd.output())
            .await
            .ok()?
            .ok()?;
        let state: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        state["status"].as_str().map(str::to_owned)
    }

    /// `runsc exec` of `argv` in sandbox `id` as the sandbox user, in `/`, with the waiter's
    /// environment and no capabilities; killed when dropped or when the runner dies.
    pub(super) fn exec_command(&self, id: &str, argv: &[String]) -> Command {
        let mut cmd = Command::new(&self.runsc);
        cmd.env_clear()
            .args(self.global_args())
            .arg("exec")
            .arg(format!(
                "--user={}:{}",
                self.config.sandbox_uid, self.config.sandbox_gid
            ))
            .arg("--cwd=/");
        for (k, v) in waiter_env() {
            cmd.arg(format!("--env={k}={v}"));
        }
        cmd.arg(id)
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        die_with_runner(&mut cmd);
        cmd
    }

    /// Sends `signal` (TERM or KILL) to the processes of one session command: those with its
    /// CAIRN_EXEC_ID, and the sessions they lead (exec_kill.py).
    pub(super) async fn kill_exec(&self, sandbox: &str, exec_id: &str, signal: &str) {
        let number = if signal == "KILL" { "9" } else { "15" };
        let argv: Vec<String> = ["python3", "-I", "-S", "-c", EXEC_KILL, number, exec_id]
            .map(String::from)
            .to_vec();
        let mut cmd = self.exec_command(sandbox, &argv);
        let _ = tokio::time::timeout(Duration::from_secs(10), cmd.status()).await;
    }
}
