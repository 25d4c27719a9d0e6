//! The gVisor backend's pool (refill policy in crate::pool): gVisor sandboxes started ahead of
//! time (a fresh task directory behind /input and /output, no network, the default memory
//! and cpu) whose first process is waiter.py, waiting on its stdin. It is started as a plain
//! `python3 -c` (no -I -S) in a job's default environment, so it is itself the interpreter a
//! default Python job would start: such a job (`python3 -c CODE` or `python3 /input/FILE`, no
//! variables of its own) runs in a fork of it as a fresh `__main__` (sys.argv, sys.path[0],
//! sys.orig_argv set as `python3` sets them, the waiter's own modules dropped), without a new
//! interpreter's start; that fork is made while the sandbox waits. Any other job is exec'd. A run stages its inputs, sends one line
//! (argv, env, rlimits, relay) and the runner supervises the relayed program as a cold run.
//! The sandbox's own rlimits are the runner's maxima, so the waiter can set any job's (a
//! process may lower its hard limits, never raise them). A sandbox serves one run; its task
//! directory is `<work_root>/tasks/pool-<uuid>`, its runsc id the same `pool-<uuid>`.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::gvisor::{waiter_argv, Base, Sandbox, Spec, WaiterMode};
use super::local::TaskDir;
use super::local_pool::{POOL_DIR_PREFIX, READY, READY_TIMEOUT};
use crate::error::{Error, Result};
use crate::job::Job;
use crate::limits::Limits;
use crate::pool::Source;

pub struct GvisorSource {
    base: Arc<Base>,
    /// The waiter's own environment: a job's default one (the program gets its job's).
    env: Vec<(String, String)>,
}

/// A sandbox whose waiter is ready for one job.
pub struct Waiting {
    pub sandbox: Sandbox,
    pub task: TaskDir,
    pub id: String,
}

impl GvisorSource {
    pub fn new(base: Arc<Base>) -> GvisorSource {
        GvisorSource {
            base,
            env: crate::job::base_environment(),
        }
    }

    /// Can a waiting sandbox (the default memory and cpu, no network) take this job? Its
    /// other limits are rlimits the waiter sets.
    pub fn fits(&self, job: &Job) -> bool {
        let d = self.base.config.default_limits();
        !job.network
            && job.limits.memory_bytes == d.memory_bytes
            && job.limits.cpu_millis == d.cpu_millis
    }
}

impl Source for GvisorSource {
    type Item = Waiting;
    const WHAT: &'static str = "waiting gVisor sandbox";
    const KIND: &'static str = "gvisor";

    fn size(&self) -> usize {
        self.base.config.pool_size
    }

    async fn discard(&self, waiting: Waiting) {
        waiting.sandbox.destroy().await;
        waiting.task.remove().await;
    }

    async fn make(&self) -> Result<Waiting> {
        let config = &self.base.config;
        let id = format!("{POOL_DIR_PREFIX}{}", uuid::Uuid::now_v7().simple());
        let task = TaskDir::create(config, &id).await?;
        let max = config.max_limits();
        let default = config.default_limits();
        let limits = Limits {
            memory_bytes: default.memory_bytes,
            cpu_millis: default.cpu_millis,
            ..max
        };
        let spec = Spec {
            id: id.clone(),
            root: false,
            binds: vec![
                (task.path.join("input"), "/input", false),
                (task.path.join("output"), "/output", true),
            ],
            network: false,
            limits: &limits,
            timeout: Duration::from_millis(max.timeout_ms),
            cwd: "/tmp",
            env: &self.env,
            argv: waiter_argv(WaiterMode::Warm),
        };
        let mut sandbox = match self.base.start(&spec, Stdio::piped()).await {
            Ok(s) => s,
            Err(e) => {
                task.remove().await;
                return Err(e.0);
            }
        };
        let mut ready = [0u8; READY.len()];
        let answered = match sandbox.child.stdout.as_mut() {
            Some(out) => tokio::time::timeout(READY_TIMEOUT, out.read_exact(&mut ready)).await,
            None => return Err(Error::Sandbox("runsc started without pipes".into())),
        };
        if matches!(answered, Ok(Ok(_))) && ready == READY {
            return Ok(Waiting { sandbox, task, id });
        }
        // Not ready: say why (the waiter's or runsc's stderr), leave nothing.
        let _ = sandbox.child.start_kill();
        let mut why = Vec::new();
        if let Some(mut err) = sandbox.child.stderr.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), err.read_to_end(&mut why)).await;
        }
        sandbox.destroy().await;
        task.remove().await;
        Err(Error::Sandbox(format!(
            "a waiting gVisor sandbox did not start (its image needs python3): {}",
            String::from_utf8_lossy(&why).trim()
        )))
    }
}

/// Can a cold run of `argv` in `env` run in a fork of its waiter started as a plain `python3
/// -c` in that same environment (waiter.py's warm path), rather than in a second interpreter?
/// For `python3 -c CODE` and `python3 /input/FILE` whose `PYTHON*` variables and `PATH` are the
/// defaults: the others change how an interpreter starts (PYTHONSAFEPATH: sys.path), runs its
/// main module (PYTHONINSPECT) or what it prints of its own imports (PYTHONVERBOSE,
/// PYTHONPROFILEIMPORTTIME), where the waiter and a fresh interpreter would differ; and a
/// `PATH` without python3 must fail as the program's start does (exit 127), not runsc's.
pub(super) fn runs_in_the_waiter(argv: &[String], env: &[(String, String)]) -> bool {
    let base = crate::job::base_environment();
    let shape = match argv {
        [python, c, _] => python == "python3" && c == "-c",
        [python, file] => python == "python3" && file.starts_with("/input/"),
        _ => false,
    };
    shape
        && env
            .iter()
            .filter(|(k, _)| k.starts_with("PYTHON") || k == "PATH")
            .all(|kv| base.contains(kv))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_default_python_starts_run_in_the_waiter() {
        let base = crate::job::base_environment();
        let code = strings(&["python3", "-c", "print(1)"]);
        let file = strings(&["python3", "/input/main.py"]);
        assert!(runs_in_the_waiter(&code, &base));
        assert!(runs_in_the_waiter(&file, &base));
        // Variables of its own that no interpreter reads: still one interpreter.
        let mut step = base.clone();
        step.push(("CAIRN_STEP_KEY".into(), "k".into()));
        step.push(("API_URL".into(), "http://x".into()));
        assert!(runs_in_the_waiter(&code, &step));
        for (k, v) in [
            ("PYTHONSAFEPATH", "1"),
            ("PYTHONUNBUFFERED", "0"),
            ("PYTHONINSPECT", "1"),
            ("PATH", "/opt/bin"),
        ] {
            let mut env = base.clone();
            env.retain(|(name, _)| name != k);
            env.push((k.into(), v.into()));
            assert!(!runs_in_the_waiter(&code, &env), "{k}={v}");
        }
        for argv in [
            strings(&["python3", "-u", "-c", "print(1)"]),
            strings(&["python3", "main.py"]),
            strings(&["node", "-e", "1"]),
            strings(&["bash", "-c", "true"]),
            Vec::new(),
        ] {
            assert!(!runs_in_the_waiter(&argv, &base), "{argv:?}");
        }
    }
}
