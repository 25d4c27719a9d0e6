//! Sessions (seed 003): one long-lived sandbox per task with `/workspace` and `/tmpfs`, kept
//! in `<work_root>/tasks/<session_id>/{workspace,tmpfs}` on this host. Opening clones a git
//! source on the host side (never with hooks, never through the `ext` transport); closing,
//! failing to open, and shutting down remove the container and the directories.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::SessionSandbox;
use crate::beneath::Root;
use crate::error::{Error, Result};

/// An open session.
pub struct Session {
    pub sandbox: SessionSandbox,
    /// The workspace, held open: every tool resolves beneath it.
    pub workspace: Root,
    pub git_commit: String,
}

enum Slot {
    /// Being opened (clone, container start): the id is taken.
    Opening,
    Open(Arc<Session>),
}

/// The open sessions of this runner.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Slot>>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn get(&self, id: &str) -> Result<Arc<Session>> {
        match self.lock().get(id) {
            Some(Slot::Open(s)) => Ok(s.clone()),
            _ => Err(Error::NotFound {
                what: "session",
                name: id.to_owned(),
            }),
        }
    }

    /// Takes `id` while the session is being opened (fails when taken or `max` are open).
    pub fn reserve(&self, id: &str, max: usize) -> Result<()> {
        let mut map = self.lock();
        if map.contains_key(id) {
            return Err(Error::SessionExists(id.to_owned()));
        }
        if map.len() >= max {
            return Err(Error::ResourceExhausted {
                message: format!(
                    "{} sessions are open, the limit is {max}: close one first",
                    map.len()
                ),
                reason: "too_many_files",
            });
        }
        map.insert(id.to_owned(), Slot::Opening);
        Ok(())
    }

    pub fn fill(&self, session: Session) {
        let id = session.sandbox.session_id.clone();
        self.lock().insert(id, Slot::Open(Arc::new(session)));
    }

    pub fn release(&self, id: &str) {
        let mut map = self.lock();
        if let Some(Slot::Opening) = map.get(id) {
            map.remove(id);
        }
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Session>> {
        let mut map = self.lock();
        match map.get(id) {
            Some(Slot::Open(_)) => match map.remove(id) {
                Some(Slot::Open(s)) => Some(s),
                _ => None,
            },
            _ => None,
        }
    }

    pub fn drain(&self) -> Vec<Arc<Session>> {
        let mut map = self.lock();
        let ids: Vec<String> = map
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Open(_)))
            .map(|(k, _)| k.clone())
            .collect();
        ids.into_iter()
            .filter_map(|id| match map.remove(&id) {
                Some(Slot::Open(s)) => Some(s),
                _ => None,
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.lock()
            .values()
            .filter(|s| matches!(s, Slot::Open(_)))
            .count()
    }
}

/// Creates `<task_dir>/workspace` and `<task_dir>/tmpfs`, owned by the sandbox user.
pub async fn create_task_dir(task_dir: &Path, owner: Option<(u32, u32)>) -> Result<()> {
    let dir = task_dir.to_path_buf();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        if let Some(parent) = dir.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(parent)?;
        }
        std::fs::DirBuilder::new().mode(0o711).create(&dir)?;
        for sub in ["workspace", "tmpfs"] {
            let p = dir.join(sub);
            std::fs::DirBuilder::new().mode(0o755).create(&p)?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&p, Some(uid), Some(gid))?;
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| Error::Sandbox(format!("task directory creation panicked: {e}")))?
    .map_err(Error::io(format!(
        "creating task directory {}",
        task_dir.display()
    )))
}

/// Clones `url` at `git_ref` into `workspace` (empty) and returns the checked-out commit.
/// Files are then given to the sandbox user.
pub async fn clone(
    url: &str,
    git_ref: &str,
    workspace: &Path,
    owner: Option<(u32, u32)>,
    timeout: Duration,
) -> Result<String> {
    if url.is_empty() || url.starts_with('-') || url.contains('\0') {
        return Err(Error::invalid(format!(
            "git url {url:?} is not a repository address"
        )));
    }
    if git_ref.starts_with('-')
        || git_ref.contains(['\0', ' ', '~', '^', ':', '\\'])
        || git_ref.contains("..")
    {
        return Err(Error::invalid(format!(
            "git ref {git_ref:?} is not a branch, tag or commit name"
        )));
    }
    let ws = workspace.to_string_lossy().into_owned();
    // The workspace belongs to the sandbox user; git would refuse it as "dubious" otherwise.
    let safe = format!("safe.directory={ws}");
    let git = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new("git");
        cmd.args([
            "-c",
            "protocol.ext.allow=never",
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "advice.detachedHead=false",
        ])
        .args(["-c", &safe])
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        cmd
    };
    let run = |mut cmd: tokio::process::Command, what: &'static str| async move {
        let out = tokio::time::timeout(timeout, cmd.output())
            .await
            .map_err(|_| {
                Error::invalid(format!(
                    "git {what} took longer than {} ms",
                    timeout.as_millis()
                ))
            })?
            .map_err(|e| Error::Sandbox(format!("cannot run git (is it installed?): {e}")))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: String = stderr.chars().take(2000).collect();
            return Err(Error::invalid(format!(
                "git {what} failed: {}",
                tail.trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    run(
        git(&[
            "clone",
            "--quiet",
            "--no-recurse-submodules",
            "--",
            url,
            &ws,
        ]),
        "clone",
    )
    .await?;
    if !git_ref.is_empty() {
        run(
            git(&["-C", &ws, "checkout", "--quiet", git_ref, "--"]),
            "checkout",
        )
        .await?;
    }
    let commit = run(git(&["-C", &ws, "rev-parse", "HEAD"]), "rev-parse").await?;
    if let Some((uid, gid)) = owner {
        let root = PathBuf::from(&ws);
        tokio::task::spawn_blocking(move || chown_tree(&root, uid, gid))
            .await
            .map_err(|e| Error::Sandbox(format!("chown panicked: {e}")))?
            .map_err(Error::io("giving the clone to the sandbox user"))?;
    }
    Ok(commit)
}

/// lchown every entry under `root` (links themselves, never their targets).
fn chown_tree(root: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        std::os::unix::fs::lchown(&dir, Some(uid), Some(gid))?;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let ft = entry.file_type()?;
            if ft.is_dir() {
                stack.push(entry.path());
            } else {
                std::os::unix::fs::lchown(entry.path(), Some(uid), Some(gid))?;
            }
        }
    }
    Ok(())
}
