//! The local backend's pool (refill policy in crate::pool): complete bubblewrap sandboxes made
//! ahead of time (namespaces, mounts, a fresh task directory behind /tmp, /input and /output,
//! the sandbox uid) whose process, waiter.py, waits on a pipe. A run stages its inputs into the
//! task directory, sends one line (argv, env, rlimits), and the waiter execs the program in its
//! place with stdin on /dev/null; the runner then supervises it as a cold run. A sandbox serves
//! one run; its directory is `<work_root>/tasks/pool-<uuid>` (swept at start-up like any).

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rustix::process::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;

use super::cgroup::Cgroup;
use super::local::{kill_and_wait, kill_group, Base, Frame, TaskDir};
use crate::error::{Error, Result};
use crate::job::Job;
use crate::pool::Source;

pub(super) const WAITER: &str = include_str!("../waiter.py");
/// What the waiter writes once it is ready (before anything of a job exists).
pub(super) const READY: &[u8] = b"cairn-waiting\n";
/// Time a new sandbox gets to become ready.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Time a waiting sandbox gets to take its job line.
const GO_TIMEOUT: Duration = Duration::from_secs(10);
/// Task directories of waiting sandboxes start with this.
pub const POOL_DIR_PREFIX: &str = "pool-";

/// Makes waiting sandboxes.
pub struct LocalSource {
    base: Arc<Base>,
    /// The waiter's own environment (the program gets the job's).
    env: Vec<(String, String)>,
}

/// A sandbox whose waiter is ready for one job. Dropped, bwrap is killed (kill_on_drop) and
/// its pid 1 and namespace with it; the task directory goes in the background.
pub struct Waiting {
    /// bwrap, with stdin (the go pipe), stdout and stderr piped.
    pub child: Child,
    pub task: TaskDir,
    /// Its cgroup (made with the default limits; the job's are set when it arrives).
    pub cgroup: Option<Cgroup>,
}

impl LocalSource {
    pub fn new(base: Arc<Base>) -> LocalSource {
        LocalSource {
            base,
            env: vec![
                (
                    "PATH".into(),
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                ),
                ("LANG".into(), "C.UTF-8".into()),
            ],
        }
    }

    /// Can a waiting sandbox (its /tmp sized for the default memory, no network) take this
    /// job? Every other limit is set when the job starts.
    pub fn fits(&self, job: &Job) -> bool {
        !job.network && job.limits.memory_bytes == self.base.config.default_limits().memory_bytes
    }
}

impl Source for LocalSource {
    type Item = Waiting;
    const WHAT: &'static str = "waiting local sandbox";
    const KIND: &'static str = "local";

    fn size(&self) -> usize {
        self.base.config.pool_size
    }

    async fn discard(&self, waiting: Waiting) {
        let Waiting {
            mut child,
            task,
            cgroup,
        } = waiting;
        kill_and_wait(&mut child).await;
        task.remove().await;
        if let Some(c) = cgroup {
            c.remove().await;
        }
    }

    async fn make(&self) -> Result<Waiting> {
        let config = &self.base.config;
        let id = format!("{POOL_DIR_PREFIX}{}", uuid::Uuid::now_v7().simple());
        let task = TaskDir::create(config, &id).await?;
        let frame = Frame {
            binds: vec![
                (task.path.join("input"), "/input", false),
                (task.path.join("output"), "/output", true),
            ],
            network: false,
            memory_bytes: config.default_limits().memory_bytes,
            chdir: "/tmp",
            env: &self.env,
        };
        let cgroup = self.base.cgroup(&id, &config.default_limits())?;
        let mut cmd = self.base.command(&frame);
        cmd.args(["--", "python3", "-I", "-S", "-c", WAITER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let joining = Base::join(&mut cmd, cgroup.as_ref())?;
        let mut child = cmd
            .spawn()
            .map_err(Error::io("starting bubblewrap for a waiting sandbox"))?;
        drop(joining);
        let mut ready = [0u8; READY.len()];
        let answered = match child.stdout.as_mut() {
            Some(out) => tokio::time::timeout(READY_TIMEOUT, out.read_exact(&mut ready)).await,
            None => return Err(Error::Sandbox("bubblewrap started without pipes".into())),
        };
        if matches!(answered, Ok(Ok(_))) && ready == READY {
            return Ok(Waiting {
                child,
                task,
                cgroup,
            });
        }
        // Not ready: say why (the waiter's or bwrap's stderr), leave nothing.
        let mut why = Vec::new();
        if let Some(pid) = child.id() {
            kill_group(pid as i32, Signal::KILL);
        }
        if let Some(mut err) = child.stderr.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), err.read_to_end(&mut why)).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        task.remove().await;
        Err(Error::Sandbox(format!(
            "a waiting sandbox did not start (it needs python3 inside the sandbox): {}",
            String::from_utf8_lossy(&why).trim()
        )))
    }
}

/// What a waiter is to run: the program's argv, env and working directory, its rlimits, and
/// whether the waiter relays its output in frames (gvisor) rather than exec it in its place.
pub(super) struct Go<'a> {
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
    pub cwd: &'a str,
    pub rlimits: std::collections::BTreeMap<&'static str, u64>,
    pub relay: bool,
    /// Kill what the program left running once it has ended (relayed one-shot runs).
    pub reap: bool,
}

impl Go<'_> {
    /// The job line: one JSON object and a newline.
    fn line(&self) -> Vec<u8> {
        let line = serde_json::json!({
            "relay": self.relay,
            "reap": self.reap,
            "argv": self.argv,
            "env": self.env,
            "cwd": self.cwd,
            "rlimits": self.rlimits,
        });
        let mut line = line.to_string().into_bytes();
        line.push(b'\n');
        line
    }
}

/// Sends a waiting sandbox its job line and closes the pipe; returns when it is sent. An error
/// means the program never started (the waiter reads the whole line before it starts anything).
pub(super) async fn send_go(
    child: &mut Child,
    go: Go<'_>,
) -> Result<(time::OffsetDateTime, std::time::Instant)> {
    let line = go.line();
    let Some(mut stdin) = child.stdin.take() else {
        return Err(Error::Sandbox(
            "waiting sandbox without a stdin pipe".into(),
        ));
    };
    let started_at = time::OffsetDateTime::now_utc();
    let t0 = std::time::Instant::now();
    match tokio::time::timeout(GO_TIMEOUT, stdin.write_all(&line)).await {
        Ok(Ok(())) => Ok((started_at, t0)),
        Ok(Err(e)) => Err(Error::io("sending the job to a waiting sandbox")(e)),
        Err(_) => Err(Error::Sandbox(
            "a waiting sandbox did not take its job".into(),
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The waiter run by the host's python3 with the job line `go` (not relayed: it execs the
    /// program in its place); returns (exit code, stdout, the waiter's stderr).
    fn waiter(python: &std::path::Path, flags: &[&str], line: &[u8]) -> (i32, String, String) {
        let mut child = std::process::Command::new(python)
            .args(flags)
            .args(["-c", WAITER, "--now"])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(line).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The waiter decodes every line the runner sends (escapes, any Unicode, large integers)
    /// as json.loads would, without importing json, re or enum (tens of ms of a cold gVisor
    /// sandbox's start); a line that is not one JSON object starts nothing.
    #[test]
    fn the_waiter_reads_job_lines_without_importing_json() {
        let Some(python) = super::super::local::find_program("/usr/bin/python3")
            .or_else(|| super::super::local::find_program("python3"))
        else {
            println!("SKIP: waiter_job_line: no python3 on this host");
            return;
        };
        let tricky = "quote \" backslash \\ tab\t soh\u{1} é 漢字 😀 \u{7f}\u{2028}";
        let argv = [
            python.display().to_string(),
            "-c".to_owned(),
            "import sys, resource; print(ascii(sys.argv[1]), resource.getrlimit(resource.RLIMIT_AS)[0])".to_owned(),
            tricky.to_owned(),
        ];
        let env = [("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
        let go = Go {
            argv: &argv,
            env: &env,
            cwd: "/",
            rlimits: [("as", 1u64 << 40), ("core", 0)].into_iter().collect(),
            relay: false,
            reap: false,
        };
        let (code, stdout, stderr) = waiter(&python, &["-I", "-S", "-X", "importtime"], &go.line());
        assert_eq!(code, 0, "{stderr}");
        let expected = format!("{} {}\n", ascii(tricky), 1u64 << 40);
        assert_eq!(stdout, expected);
        let imported: Vec<&str> = stderr
            .lines()
            .filter_map(|l| l.rsplit('|').next())
            .map(str::trim)
            .filter(|m| ["json", "re", "enum", "signal"].contains(m))
            .collect();
        assert!(stderr.contains("import time:"), "{stderr}");
        assert_eq!(imported, Vec::<&str>::new(), "{stderr}");
        for bad in [&b"{\"argv\": [\"x\"]} {}\n"[..], b"{\"argv\": \n"] {
            let (code, stdout, stderr) = waiter(&python, &["-I", "-S"], bad);
            assert_ne!(code, 0, "{stderr}");
            assert_eq!(stdout, "");
            assert!(stderr.contains("ValueError"), "{stderr}");
        }
    }

    /// Python's ascii() of `s`.
    fn ascii(s: &str) -> String {
        let mut out = String::from("'");
        for c in s.chars() {
            match c {
                '\'' => out.push_str("\\'"),
                '\\' => out.push_str("\\\\"),
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                ' '..='~' => out.push(c),
                c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
                c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push_str(&format!("\\U{:08x}", c as u32)),
            }
        }
        out.push('\'');
        out
    }
}
