//! Sessions: one long-lived sandbox per task with `/workspace` and `/tmpfs`, kept
//! in `<work_root>/tasks/<session_id>/{workspace,tmpfs}` on this host. Opening clones a git
//! source on the host side (never with hooks, never through the `ext` transport); closing,
//! failing to open, shutting down, and going unused for `idle_timeout_ms` remove the container
//! and the directories.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backend::{area, SessionSandbox};
use crate::error::{Error, Result};
use cairn_contain::Root;

/// An open session.
pub struct Session {
    pub sandbox: SessionSandbox,
    /// The workspace, held open: every tool resolves beneath it.
    pub workspace: Root,
    pub git_commit: String,
    /// Its share of max_concurrent_runs, held while the session is open (and while a call
    /// still uses it after its close).
    pub _slot: tokio::sync::OwnedSemaphorePermit,
    /// Calls using it now, and when the last one ended (or it opened).
    pub activity: Mutex<Activity>,
    /// Held by each Exec (shared) and by a memory checkpoint (alone): a checkpoint waits
    /// for the running commands, and commands sent meanwhile wait for it.
    pub checkpointing: tokio::sync::RwLock<()>,
}

#[derive(Debug)]
pub struct Activity {
    in_flight: usize,
    since: Instant,
}

impl Activity {
    /// No call yet; idle from now.
    pub fn new() -> Activity {
        Activity {
            in_flight: 0,
            since: Instant::now(),
        }
    }
}

impl Session {
    fn activity(&self) -> std::sync::MutexGuard<'_, Activity> {
        self.activity
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// No call in flight and none for `idle` or longer.
    fn idle_for(&self, idle: Duration) -> bool {
        let a = self.activity();
        a.in_flight == 0 && a.since.elapsed() >= idle
    }
}

/// A call's use of an open session: while it lives the session is not idle.
pub struct InUse(Arc<Session>);

impl std::ops::Deref for InUse {
    type Target = Session;
    fn deref(&self) -> &Session {
        &self.0
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        let mut a = self.0.activity();
        a.in_flight -= 1;
        a.since = Instant::now();
    }
}

/// Ids of sessions closed for idleness that a late call may still name (the newest ones).
const EXPIRED_KEPT: usize = 1024;

enum Slot {
    /// Being opened (clone, container start): the id is taken. Cancelling `cancel` makes the
    /// opener tear down what it made; `gone` ends when the slot is released.
    Opening {
        cancel: CancellationToken,
        gone: watch::Receiver<()>,
    },
    Open(Arc<Session>),
}

/// The opener's hold on a slot being opened: it either fills it or releases it.
pub struct Reservation {
    id: String,
    cancel: CancellationToken,
    /// Dropped on release: wakes the CloseSession calls waiting for the teardown.
    _gone: watch::Sender<()>,
}

impl Reservation {
    /// Cancels the opening (the client went away, or CloseSession or shutdown came first).
    pub fn token(&self) -> &CancellationToken {
        &self.cancel
    }
}

/// What CloseSession found under an id.
pub enum Closing {
    Open(Arc<Session>),
    /// Being opened: its opening was cancelled; the receiver ends when the teardown is done.
    Opening(watch::Receiver<()>),
    Absent,
}

/// The open sessions of this runner.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Slot>>,
    /// Sessions closed for idleness, to tell a late caller why (oldest first, at most
    /// `EXPIRED_KEPT`; only looked through on the NotFound path).
    expired: Mutex<VecDeque<String>>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn expired(&self) -> std::sync::MutexGuard<'_, VecDeque<String>> {
        self.expired
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The open session `id`, marked in use until the returned guard is dropped (taken under
    /// the lock `take_idle` looks under, so a session in use is never closed as idle).
    pub fn enter(&self, id: &str, idle_timeout: Duration) -> Result<InUse> {
        if let Some(Slot::Open(s)) = self.lock().get(id) {
            s.activity().in_flight += 1;
            return Ok(InUse(s.clone()));
        }
        if self.expired().iter().any(|e| e == id) {
            return Err(Error::SessionExpired {
                id: id.to_owned(),
                idle_ms: idle_timeout.as_millis() as u64,
            });
        }
        Err(Error::NotFound {
            what: "session",
            name: id.to_owned(),
        })
    }

    /// Takes out the open sessions no call has used for `idle` (none in flight).
    pub fn take_idle(&self, idle: Duration) -> Vec<Arc<Session>> {
        let mut map = self.lock();
        let mut expired = self.expired();
        map.extract_if(|_, slot| matches!(slot, Slot::Open(s) if s.idle_for(idle)))
            .filter_map(|(id, slot)| match slot {
                Slot::Open(s) => {
                    expired.push_back(id);
                    if expired.len() > EXPIRED_KEPT {
                        expired.pop_front();
                    }
                    Some(s)
                }
                Slot::Opening { .. } => None,
            })
            .collect()
    }

    /// Takes `id` while the session is being opened (fails when taken or `max` are open).
    pub fn reserve(&self, id: &str, max: usize) -> Result<Reservation> {
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
        self.expired().retain(|e| e != id);
        let cancel = CancellationToken::new();
        let (gone_tx, gone) = watch::channel(());
        map.insert(
            id.to_owned(),
            Slot::Opening {
                cancel: cancel.clone(),
                gone,
            },
        );
        Ok(Reservation {
            id: id.to_owned(),
            cancel,
            _gone: gone_tx,
        })
    }

    /// Makes the reserved session open and returns true, unless its opening was cancelled:
    /// then false, and the opener tears it down (and `release`s). Checked under the lock
    /// that `close` cancels under, so a session is never filled after a close saw it opening.
    #[must_use]
    pub fn fill(&self, reservation: &Reservation, session: Session) -> bool {
        let mut map = self.lock();
        if reservation.cancel.is_cancelled() {
            return false;
        }
        map.insert(reservation.id.clone(), Slot::Open(Arc::new(session)));
        true
    }

    /// Frees a slot whose opening failed or was cancelled (after its teardown).
    pub fn release(&self, reservation: Reservation) {
        let mut map = self.lock();
        if let Some(Slot::Opening { .. }) = map.get(&reservation.id) {
            map.remove(&reservation.id);
        }
        drop(map);
        drop(reservation);
    }

    /// Takes an open session out, or cancels one being opened.
    pub fn close(&self, id: &str) -> Closing {
        let mut map = self.lock();
        match map.get(id) {
            Some(Slot::Open(_)) => match map.remove(id) {
                Some(Slot::Open(s)) => Closing::Open(s),
                _ => Closing::Absent,
            },
            Some(Slot::Opening { cancel, gone }) => {
                cancel.cancel();
                Closing::Opening(gone.clone())
            }
            None => Closing::Absent,
        }
    }

    /// Takes every open session out and cancels those being opened (their openers tear
    /// them down).
    pub fn drain(&self) -> Vec<Arc<Session>> {
        let mut map = self.lock();
        let mut ids = Vec::new();
        for (id, slot) in map.iter() {
            match slot {
                Slot::Open(_) => ids.push(id.clone()),
                Slot::Opening { cancel, .. } => cancel.cancel(),
            }
        }
        ids.into_iter()
            .filter_map(|id| match map.remove(&id) {
                Some(Slot::Open(s)) => Some(s),
                _ => None,
            })
            .collect()
    }

    /// Open sessions (those being opened are not counted).
    pub fn len(&self) -> usize {
        self.lock()
            .values()
            .filter(|s| matches!(s, Slot::Open(_)))
            .count()
    }
}

/// Creates `task_dir` and, with `areas`, `<task_dir>/workspace` and `<task_dir>/tmpfs`, owned
/// by the sandbox user, on one file system of `bytes` at `task_dir` when the runner is root
/// (area.rs): both count against the session's cap. Without `areas` the engine makes them.
pub async fn create_task_dir(
    task_dir: &Path,
    owner: Option<(u32, u32)>,
    bytes: u64,
    areas: bool,
) -> Result<()> {
    let dir = task_dir.to_path_buf();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        if let Some(parent) = dir.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(parent)?;
        }
        std::fs::DirBuilder::new().mode(0o711).create(&dir)?;
        if !areas {
            return Ok(());
        }
        if owner.is_some() {
            area::mount(&dir, bytes, (0, 0), 0o711)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))?;
        }
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
        "creating task directory {} (a tmpfs of max_total_output_bytes)",
        task_dir.display()
    )))
}

/// Clones `url` at `git_ref` into `workspace` (empty) and returns the checked-out commit.
/// Files are then given to the sandbox user. Cancelling `cancel` stops git (see `run_git`).
pub async fn clone(
    url: &str,
    git_ref: &str,
    workspace: &Path,
    owner: Option<(u32, u32)>,
    timeout: Duration,
    cancel: &CancellationToken,
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
        // Its own group: git's helpers (git-remote-https, index-pack) are stopped with it.
        .process_group(0)
        .kill_on_drop(true);
        cmd
    };
    run_git(
        git(&[
            "clone",
            "--quiet",
            "--no-recurse-submodules",
            "--",
            url,
            &ws,
        ]),
        "clone",
        timeout,
        cancel,
    )
    .await?;
    if !git_ref.is_empty() {
        run_git(
            git(&["-C", &ws, "checkout", "--quiet", git_ref, "--"]),
            "checkout",
            timeout,
            cancel,
        )
        .await?;
    }
    let commit = run_git(
        git(&["-C", &ws, "rev-parse", "HEAD"]),
        "rev-parse",
        timeout,
        cancel,
    )
    .await?;
    if let Some((uid, gid)) = owner {
        let root = PathBuf::from(&ws);
        tokio::task::spawn_blocking(move || chown_tree(&root, uid, gid))
            .await
            .map_err(|e| Error::Sandbox(format!("chown panicked: {e}")))?
            .map_err(Error::io("giving the clone to the sandbox user"))?;
    }
    Ok(commit)
}

/// Bytes kept of git's stdout and of its stderr.
const MAX_GIT_OUTPUT: u64 = 64 * 1024;

/// Runs one git command; returns its trimmed stdout. On timeout or cancel its whole process
/// group is killed and awaited, so nothing writes into the workspace once this returns and
/// the task directory can be removed.
async fn run_git(
    mut cmd: tokio::process::Command,
    what: &'static str,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<String> {
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::Sandbox(format!("cannot run git (is it installed?): {e}")))?;
    let group = child
        .id()
        .and_then(|id| rustix::process::Pid::from_raw(id as i32));
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let finished = async {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (status, (), ()) = tokio::join!(
            child.wait(),
            read_capped(stdout, &mut out),
            read_capped(stderr, &mut err)
        );
        (status, out, err)
    };
    let stopped = tokio::select! {
        (status, out, err) = finished => {
            let status = status
                .map_err(|e| Error::Sandbox(format!("waiting for git {what}: {e}")))?;
            if !status.success() {
                let stderr = String::from_utf8_lossy(&err);
                let tail: String = stderr.chars().take(2000).collect();
                return Err(Error::invalid(format!("git {what} failed: {}", tail.trim())));
            }
            return Ok(String::from_utf8_lossy(&out).trim().to_owned());
        }
        () = cancel.cancelled() => Error::Sandbox(format!("git {what} was cancelled")),
        () = tokio::time::sleep(timeout) => Error::invalid(format!(
            "git {what} took longer than {} ms",
            timeout.as_millis()
        )),
    };
    if let Some(group) = group {
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    }
    let _ = child.wait().await;
    if let Some(group) = group {
        // Helpers of the group are reaped by init; wait (bounded) until none is left.
        for _ in 0..250 {
            if rustix::process::test_kill_process_group(group).is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Err(stopped)
}

async fn read_capped(pipe: Option<impl tokio::io::AsyncRead + Unpin>, buf: &mut Vec<u8>) {
    if let Some(pipe) = pipe {
        let mut pipe = pipe.take(MAX_GIT_OUTPUT);
        let _ = pipe.read_to_end(buf).await;
        // Drain the rest so git never blocks on a full pipe.
        let _ = tokio::io::copy(pipe.get_mut(), &mut tokio::io::sink()).await;
    }
}

/// lchown every entry under `root` (links themselves, never their targets).
pub(crate) fn chown_tree(root: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
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

/// `command` as a detached session command: `bash -lc COMMAND` started in a session of its
/// own with stdin, stdout and stderr on /dev/null; the shell prints its process id and ends.
pub fn detached(command: &str) -> String {
    let quoted = command.replace('\'', r"'\''");
    format!("setsid bash -lc '{quoted}' </dev/null >/dev/null 2>&1 & echo $!")
}
