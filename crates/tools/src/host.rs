//! The legacy tool backend (the default): the tool's program runs as a
//! subprocess of the orchestrator, in a scratch directory with the staged inputs under
//! `$CAIRN_INPUT_DIR` and its outputs collected from `$CAIRN_OUTPUT_DIR`, the same layout, caps
//! and protocol as the sandbox backend. What it does not give is isolation (no namespaces, no
//! memory limit, the host's network): that is what `use_for_tools` is for.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::installed::{Caps, Invocation, Outcome, Refused};
use super::manifest::interpreter;

/// Why the subprocess could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("preparing the tool's directories: {0}")]
    Stage(std::io::Error),
    #[error("starting `{program}`: {error} (is it installed on the orchestrator's host?)")]
    Spawn {
        program: String,
        error: std::io::Error,
    },
    #[error("waiting for the tool: {0}")]
    Wait(std::io::Error),
    #[error("collecting the tool's outputs: {0}")]
    Collect(std::io::Error),
}

/// Reads all of `r`, keeping at most `cap` bytes.
async fn read_capped<R: AsyncRead + Unpin>(mut r: R, cap: u64) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut buf = [0u8; 16 << 10];
    let mut truncated = false;
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = (cap as usize).saturating_sub(kept.len());
                if n > room {
                    truncated = true;
                }
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    (kept, truncated)
}

/// The reader's result, or (nothing, truncated) if it does not end within `grace` (then it is
/// stopped).
async fn join_within(
    mut task: tokio::task::JoinHandle<(Vec<u8>, bool)>,
    grace: std::time::Duration,
) -> (Vec<u8>, bool) {
    match tokio::time::timeout(grace, &mut task).await {
        Ok(Ok(r)) => r,
        _ => {
            task.abort();
            (Vec::new(), true)
        }
    }
}

fn stage(root: &Path, inv: &Invocation) -> std::io::Result<()> {
    for (path, bytes) in &inv.inputs {
        // Paths passed pathguard when they were listed: relative, no `..`, no links.
        let target = root.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&target, bytes)?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o444))?;
    }
    Ok(())
}

/// What the output directory held.
#[derive(Default)]
struct Collected {
    files: Vec<(String, Bytes)>,
    refused: Vec<Refused>,
    /// Over the count or byte cap: later files were left.
    truncated: bool,
}

/// Files beneath `dir` (relative paths), refusing what is not a regular file.
fn collect(dir: &Path, caps: &Caps) -> std::io::Result<Collected> {
    let mut files = Vec::new();
    let mut refused = Vec::new();
    let mut truncated = false;
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let rel = p
                .strip_prefix(dir)
                .map(|r| r.to_string_lossy().into_owned())
                .unwrap_or_default();
            let meta = std::fs::symlink_metadata(&p)?;
            if meta.is_dir() {
                stack.push(p);
                continue;
            }
            let reason = if meta.file_type().is_symlink() {
                Some("symlink".to_owned())
            } else if !meta.is_file() {
                Some("not_a_file".to_owned())
            } else if let Err(rej) = pathguard::validate(&rel) {
                Some(rej.to_string())
            } else {
                None
            };
            if let Some(reason) = reason {
                refused.push(Refused { path: rel, reason });
                continue;
            }
            if files.len() as u64 >= caps.max_output_files
                || total + meta.len() > caps.max_output_bytes
            {
                truncated = true;
                continue;
            }
            total += meta.len();
            files.push((rel, Bytes::from(std::fs::read(&p)?)));
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Collected {
        files,
        refused,
        truncated,
    })
}

pub async fn run(inv: &Invocation, caps: &Caps) -> Result<Outcome, HostError> {
    let scratch = tempfile::Builder::new()
        .prefix("cairn-tool-")
        .tempdir()
        .map_err(HostError::Stage)?;
    let input = scratch.path().join("input");
    let output = scratch.path().join("output");
    let work = scratch.path().join("work");
    for d in [&input, &output, &work] {
        std::fs::create_dir_all(d).map_err(HostError::Stage)?;
    }
    stage(&input, inv).map_err(HostError::Stage)?;
    let program = interpreter(&inv.language).unwrap_or("sh");
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg("-c")
        .arg(&inv.code)
        .current_dir(&work)
        // Nothing of the orchestrator's environment (credentials) reaches a tool.
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", &work)
        .env("LANG", "C.UTF-8")
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("CAIRN_INPUT_DIR", &input)
        .env("CAIRN_OUTPUT_DIR", &output)
        .envs(inv.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|error| HostError::Spawn {
        program: program.to_owned(),
        error,
    })?;
    let pgid = child.id();
    let out = child.stdout.take();
    let err = child.stderr.take();
    let (so, se) = (caps.max_stdout_bytes, caps.max_stderr_bytes);
    let stdout_task = tokio::spawn(async move {
        match out {
            Some(o) => read_capped(o, so).await,
            None => (Vec::new(), false),
        }
    });
    let stderr_task = tokio::spawn(async move {
        match err {
            Some(e) => read_capped(e, se).await,
            None => (Vec::new(), false),
        }
    });
    let kill_group = || {
        if let Some(pid) = pgid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
            // ESRCH when nothing is left: fine.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    };
    let (status, timed_out) = match tokio::time::timeout(inv.timeout, child.wait()).await {
        Ok(s) => (s.map_err(HostError::Wait)?, false),
        Err(_) => {
            kill_group();
            (child.wait().await.map_err(HostError::Wait)?, true)
        }
    };
    // Nothing outlives the tool: what it left running in its group dies now, which also
    // closes the pipes those processes held.
    kill_group();
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    // A process that left the group (setsid) may still hold a pipe: do not wait for it.
    let grace = std::time::Duration::from_secs(2);
    let (stdout, stdout_truncated) = join_within(stdout_task, grace).await;
    let (stderr, _) = join_within(stderr_task, grace).await;
    let collected = if timed_out {
        Collected::default()
    } else {
        collect(&output, caps).map_err(HostError::Collect)?
    };
    Ok(Outcome {
        backend: "legacy",
        exit_code: if timed_out {
            -1
        } else {
            status.code().unwrap_or(-1)
        },
        timed_out,
        duration_ms,
        stdout: Bytes::from(stdout),
        stderr: Bytes::from(stderr),
        stdout_truncated,
        outputs: collected.files,
        refused: collected.refused,
        outputs_truncated: collected.truncated,
        runner: String::new(),
        record: None,
    })
}
