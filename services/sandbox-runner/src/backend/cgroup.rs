//! Per-sandbox cgroups of the local backend: memory (which also counts the sandbox's /tmp
//! tmpfs, whose pages are charged to the cgroup of the process that writes them), pids and
//! CPU limits over everything a sandbox starts, and the OOM-kill count that says a run was
//! killed by its memory limit. cgroup v2 (a unified hierarchy with the memory, pids and cpu
//! controllers) is preferred; a host whose controllers sit on cgroup v1 hierarchies uses
//! those. Each runner keeps its cgroups under `cairn-sandbox-<runner_id>/` (one directory per
//! hierarchy); a sandbox's own is `<that>/<job id>`, removed after the sandbox, and the
//! start-up sweep removes those a killed runner left.
//!
//! A process joins its cgroup before bubblewrap starts (`join_on_exec`), so nothing of the
//! sandbox ever runs outside it. When the runner cannot create cgroups here, `Cgroups::detect`
//! says why and runs report `limits_enforced: false` (or the runner refuses to start, with
//! `require_limits`).

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::limits::Limits;

/// CPU limit period (µs): `cpu_millis` thousandths of a CPU per period.
const CPU_PERIOD_US: u64 = 100_000;
/// Time a removal waits for the last processes of a sandbox to leave its cgroup.
const REMOVE_WAIT: Duration = Duration::from_secs(10);

/// Where this runner makes cgroups.
#[derive(Debug, Clone)]
pub enum Cgroups {
    /// One directory in the unified hierarchy (controllers enabled for its children).
    V2 { dir: PathBuf },
    /// One directory per v1 hierarchy: memory, pids, cpu.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: PathBuf,
    },
}

/// One sandbox's cgroup (a directory per hierarchy). Dropped, it is removed in the background.
#[derive(Debug)]
pub struct Cgroup {
    v2: bool,
    dirs: Vec<PathBuf>,
}

impl Cgroups {
    /// Finds a hierarchy with memory, pids and cpu under `root` (where the cgroup file systems
    /// are mounted) and makes this runner's directory in it (enabling the controllers for its
    /// children). Err says why no limits can be enforced.
    pub fn detect(root: &Path, runner_id: &str) -> Result<Cgroups, String> {
        let own = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        let name = format!("cairn-sandbox-{runner_id}");
        let mut why = Vec::new();
        for unified in [root.to_path_buf(), root.join("unified")] {
            match v2_dir(&unified, &own, &name) {
                Ok(Some(dir)) => return Ok(Cgroups::V2 { dir }),
                Ok(None) => {}
                Err(e) => why.push(e),
            }
        }
        match v1_dirs(root, &own, &name) {
            Ok(c) => Ok(c),
            Err(e) => {
                why.push(e);
                Err(why.join("; "))
            }
        }
    }

    /// This runner's directories (one per hierarchy).
    fn parents(&self) -> Vec<&Path> {
        match self {
            Cgroups::V2 { dir } => vec![dir],
            Cgroups::V1 { memory, pids, cpu } => vec![memory, pids, cpu],
        }
    }

    /// Makes the cgroup of sandbox `id` with `limits` (memory and swap at `memory_bytes`,
    /// `pids`, `cpu_millis`).
    pub fn create(&self, id: &str, limits: &Limits) -> io::Result<Cgroup> {
        let mut cgroup = Cgroup {
            v2: matches!(self, Cgroups::V2 { .. }),
            dirs: Vec::new(),
        };
        for parent in self.parents() {
            let dir = parent.join(id);
            fs::create_dir(&dir)?;
            cgroup.dirs.push(dir);
        }
        cgroup.set_limits(limits)?;
        Ok(cgroup)
    }

    /// Removes the sandbox cgroups a killed runner left (their processes died with it);
    /// returns how many.
    pub async fn sweep(&self) -> usize {
        let mut n = 0;
        for parent in self.parents() {
            let Ok(entries) = fs::read_dir(parent) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    n += usize::from(remove(entry.path()).await);
                }
            }
        }
        n
    }

    /// Removes every sandbox cgroup, then this runner's directories (at shutdown, once the
    /// sandboxes are killed).
    pub async fn close(&self) {
        self.sweep().await;
        for parent in self.parents() {
            remove(parent.to_path_buf()).await;
        }
    }
}

impl Cgroup {
    /// Writes the limits (also to a waiting sandbox's cgroup when its job arrives).
    pub fn set_limits(&self, limits: &Limits) -> io::Result<()> {
        let memory = limits.memory_bytes.to_string();
        // The kernel's smallest quota is 1 ms per period.
        let quota = (limits.cpu_millis * CPU_PERIOD_US / 1000).max(1000);
        if self.v2 {
            let dir = &self.dirs[0];
            write(dir, "memory.max", &memory)?;
            // Absent without swap accounting; nothing to cap then.
            let _ = write(dir, "memory.swap.max", "0");
            write(dir, "pids.max", &limits.pids.to_string())?;
            write(dir, "cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?;
        } else {
            let (memory_dir, pids_dir, cpu_dir) = (&self.dirs[0], &self.dirs[1], &self.dirs[2]);
            // memsw (memory + swap) may not go below the memory limit: lower memory first
            // when shrinking, raise memsw first when growing; absent without swap accounting.
            let _ = write(memory_dir, "memory.memsw.limit_in_bytes", &memory);
            write(memory_dir, "memory.limit_in_bytes", &memory)?;
            let _ = write(memory_dir, "memory.memsw.limit_in_bytes", &memory);
            write(pids_dir, "pids.max", &limits.pids.to_string())?;
            write(cpu_dir, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
            write(cpu_dir, "cpu.cfs_quota_us", &quota.to_string())?;
        }
        Ok(())
    }

    /// `cgroup.procs` of each directory, opened for the process about to start: it writes
    /// "0" (itself) into each before it execs (see `join_on_exec`).
    pub fn procs_files(&self) -> io::Result<Vec<OwnedFd>> {
        self.dirs
            .iter()
            .map(|d| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("cgroup.procs"))
                    .map(OwnedFd::from)
            })
            .collect()
    }

    /// Processes killed by the memory limit so far.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        fs::read_to_string(self.dirs[0].join(file))
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// Removes the directories once their processes are gone (bounded wait).
    pub async fn remove(mut self) {
        for dir in std::mem::take(&mut self.dirs) {
            remove(dir).await;
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let dirs = std::mem::take(&mut self.dirs);
        if dirs.is_empty() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                for dir in dirs {
                    remove(dir).await;
                }
            });
        }
    }
}

/// Makes the child join the cgroups whose `cgroup.procs` files are `fds` (opened by the
/// runner, so the kernel checks the runner's rights, not the sandbox user's), just before it
/// execs bubblewrap.
#[allow(unsafe_code)]
pub fn join_on_exec(cmd: &mut tokio::process::Command, fds: &[OwnedFd]) {
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    // SAFETY: the closure runs in the forked child before exec; it only calls write(2), which
    // is async-signal-safe, on descriptors the parent keeps open until the spawn returns, and
    // allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            for fd in &raw {
                if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// The runner's directory in the unified hierarchy at `mount`, when it offers memory, pids
/// and cpu. Ok(None): no unified hierarchy there.
fn v2_dir(mount: &Path, own: &str, name: &str) -> Result<Option<PathBuf>, String> {
    let Ok(available) = fs::read_to_string(mount.join("cgroup.controllers")) else {
        return Ok(None);
    };
    let missing: Vec<&str> = ["memory", "pids", "cpu"]
        .into_iter()
        .filter(|c| !available.split_whitespace().any(|a| a == *c))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "cgroup v2 at {} lacks the {} controller(s) (they are bound to cgroup v1 hierarchies)",
            mount.display(),
            missing.join(", ")
        ));
    }
    let path = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("/");
    let base = mount.join(path.trim_start_matches('/'));
    let dir = base.join(name);
    let made = (|| -> io::Result<()> {
        // The controllers must be enabled for children at every level down to ours; a
        // cgroup that holds processes (other than the root) cannot enable them.
        enable_controllers(&base)?;
        create_dir(&dir)?;
        enable_controllers(&dir)
    })();
    made.map_err(|e| {
        format!(
            "cannot make cgroup v2 {} with memory, pids and cpu for sandboxes: {e} \
             (run the runner as root, or in a cgroup delegated to it with those controllers, e.g. systemd Delegate=yes)",
            dir.display()
        )
    })?;
    Ok(Some(dir))
}

fn enable_controllers(dir: &Path) -> io::Result<()> {
    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control"))?;
    let missing: Vec<String> = ["memory", "pids", "cpu"]
        .into_iter()
        .filter(|c| !enabled.split_whitespace().any(|e| e == *c))
        .map(|c| format!("+{c}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    write(dir, "cgroup.subtree_control", &missing.join(" "))
}

/// The runner's directories in the v1 memory, pids and cpu hierarchies (below its own cgroup
/// in each).
fn v1_dirs(root: &Path, own: &str, name: &str) -> Result<Cgroups, String> {
    let mut dirs = Vec::new();
    for controller in ["memory", "pids", "cpu"] {
        let mount = root.join(controller);
        if !mount.join("cgroup.procs").is_file() {
            return Err(format!(
                "no cgroup v1 {controller} hierarchy at {}",
                mount.display()
            ));
        }
        let path = own
            .lines()
            .find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers
                    .split(',')
                    .any(|c| c == controller)
                    .then_some(path)
            })
            .unwrap_or("/");
        let dir = mount.join(path.trim_start_matches('/')).join(name);
        create_dir(&dir).map_err(|e| {
            format!(
                "cannot make cgroup v1 {}: {e} (run the runner as root)",
                dir.display()
            )
        })?;
        dirs.push(dir);
    }
    let [memory, pids, cpu] = <[PathBuf; 3]>::try_from(dirs)
        .map_err(|_| "cgroup v1: expected three hierarchies".to_owned())?;
    Ok(Cgroups::V1 { memory, pids, cpu })
}

fn create_dir(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

fn write(dir: &Path, file: &str, value: &str) -> io::Result<()> {
    fs::write(dir.join(file), value)
        .map_err(|e| io::Error::new(e.kind(), format!("writing {value:?} to {file}: {e}")))
}

/// Removes one sandbox cgroup, waiting (bounded) while processes still leave it. True when
/// removed.
async fn remove(dir: PathBuf) -> bool {
    let t0 = Instant::now();
    loop {
        match fs::remove_dir(&dir) {
            Ok(()) => return true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return false,
            Err(e) if t0.elapsed() >= REMOVE_WAIT => {
                tracing::warn!(cgroup = %dir.display(), error = %e, "could not remove a sandbox cgroup");
                return false;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
