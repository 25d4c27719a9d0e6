//! Writable areas: the host directories a sandbox writes (a local or gvisor run's /output, a
//! session's task directory holding /workspace and /tmpfs) as tmpfs file systems of
//! `max_total_output_bytes` each, mounted by the runner, so a program that writes past the cap
//! gets ENOSPC and the runner's disk never holds its writes. (A docker run's /output is a tmpfs
//! the engine mounts: backend/docker_pool.rs.) Mounting needs root with the right to mount (a
//! runner in a container usually lacks it); a runner without it keeps plain directories
//! (bounded per file only) and says so once, at warn. Removing a task directory unmounts every
//! area below it first (`unmount_below`).
//!
//! A docker session on a runner that may not mount gets its areas from the engine instead
//! (`[session] areas`): /workspace and /tmpfs are tmpfs mounts of the session container, and
//! the runner reaches them through that container's root in /proc ([`SessionAreas`]), which
//! needs the runner in the engine's pid namespace (in a container: `pid: host`).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Free space below which an area counts as full: a writer that met ENOSPC leaves less than
/// a page or two.
const FULL_BELOW: u64 = 64 * 1024;

/// May this process mount writable areas? Asked once: root, and a probe tmpfs mounts (a
/// root without CAP_SYS_ADMIN, as in most containers, gets EPERM). Says so at warn when not.
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let why = if rustix::process::geteuid().is_root() {
            match probe() {
                Ok(()) => return true,
                Err(e) => format!("a probe tmpfs could not be mounted ({e})"),
            }
        } else {
            "the runner is not root".to_owned()
        };
        tracing::warn!(
            "writable areas the runner mounts are not bounded: {why}; the local and gvisor backends' /output and sessions' directories are plain directories, capped per file only (on docker, runs' /output is bounded by the engine either way, and sessions' areas are too when [session] areas picks the engine; run the runner as root with the right to mount, e.g. CAP_SYS_ADMIN, to cap the others' total at max_total_output_bytes)"
        );
        false
    })
}

/// Mounts and unmounts a small tmpfs in a fresh temporary directory.
fn probe() -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!(
        "cairn-area-probe-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    let mounted = mount_tmpfs(&dir, 1 << 20, (0, 0), 0o700);
    if mounted.is_ok() {
        unmount_below(&dir);
    }
    let _ = std::fs::remove_dir(&dir);
    mounted
}

/// Makes `dir` (existing, empty) a tmpfs of `bytes` owned by `owner` with `mode`. Ok(false)
/// when this process may not mount ([`available`]): `dir` stays a plain directory.
pub fn mount(dir: &Path, bytes: u64, owner: (u32, u32), mode: u32) -> std::io::Result<bool> {
    if !available() {
        return Ok(false);
    }
    mount_tmpfs(dir, bytes, owner, mode)?;
    Ok(true)
}

#[allow(unsafe_code)]
fn mount_tmpfs(dir: &Path, bytes: u64, owner: (u32, u32), mode: u32) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let target = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("a task directory path holds a NUL byte"))?;
    // Pages of the runner's tmpfs, never its disk; exec stays allowed (build tools run what
    // they make), setuid files and devices do not.
    let data = std::ffi::CString::new(format!(
        "size={bytes},mode={mode:o},uid={},gid={}",
        owner.0, owner.1
    ))
    .map_err(|_| std::io::Error::other("mount options hold a NUL byte"))?;
    let fstype = c"tmpfs";
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Is the file system of `dir` (an area) full? False when it cannot be asked.
pub fn is_full(dir: &Path) -> bool {
    match rustix::fs::statvfs(dir) {
        Ok(st) => st.f_bavail.saturating_mul(st.f_frsize) < FULL_BELOW,
        Err(_) => false,
    }
}

/// Where a session's `workspace/` and `tmpfs/` are, as the runner reaches them: in its task
/// directory, or (areas the engine mounted) below the session container's root, held open
/// so that a pid reused after the container ends never leads elsewhere.
#[derive(Clone, Debug)]
pub struct SessionAreas {
    dir: PathBuf,
    root: Option<Arc<OwnedFd>>,
}

impl SessionAreas {
    pub fn in_task_dir(task_dir: &Path) -> SessionAreas {
        SessionAreas {
            dir: task_dir.to_path_buf(),
            root: None,
        }
    }

    /// The root of the process `pid` (of this runner's pid namespace), held open; its
    /// `/workspace` and `/tmpfs` are the areas. The caller checks that `pid` is still the
    /// container's once this returns.
    pub fn of_process_root(pid: i64) -> std::io::Result<SessionAreas> {
        use rustix::fs::{Mode, OFlags};
        if pid <= 0 {
            return Err(std::io::Error::other(format!("no process {pid}")));
        }
        let fd = rustix::fs::open(
            format!("/proc/{pid}/root"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        // Paths through this process's own descriptor: also valid for a git it starts
        // (descriptors are close-on-exec, so /proc/self/fd would not be).
        let dir = PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            fd.as_raw_fd()
        ));
        std::fs::metadata(dir.join("workspace"))?;
        Ok(SessionAreas {
            dir,
            root: Some(Arc::new(fd)),
        })
    }

    /// The directory holding `workspace/` and `tmpfs/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn workspace(&self) -> PathBuf {
        self.dir.join("workspace")
    }

    /// Areas the engine mounted (not the runner's task directory)?
    pub fn in_engine(&self) -> bool {
        self.root.is_some()
    }

    /// Is either area full?
    pub fn is_full(&self) -> bool {
        is_full(&self.workspace()) || is_full(&self.dir.join("tmpfs"))
    }
}

/// Is this process in the initial pid namespace, as a Docker engine on the host is (so a
/// container's pid from the engine names the same process here)?
pub fn in_host_pid_namespace() -> bool {
    // The initial pid namespace has a fixed inode number (PROC_PID_INIT_INO).
    const INIT_PID_NS: u64 = 0xEFFF_FFFC;
    rustix::fs::stat("/proc/self/ns/pid").is_ok_and(|st| st.st_ino == INIT_PID_NS)
}

/// Is `dir` a mount point (an area the runner mounted)?
#[cfg(test)]
fn is_mounted(dir: &Path) -> bool {
    mounts().iter().any(|m| m == dir)
}

/// Unmounts (lazily: a container still holding one lets go later) every mount at or below
/// `path`, deepest first, so the directory can be removed.
#[allow(unsafe_code)]
pub fn unmount_below(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let mut below: Vec<PathBuf> = mounts()
        .into_iter()
        .filter(|m| m.starts_with(path))
        .collect();
    below.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for m in below {
        let Ok(target) = std::ffi::CString::new(m.as_os_str().as_bytes()) else {
            continue;
        };
        // SAFETY: a valid NUL-terminated path that outlives the call.
        let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            tracing::warn!(path = %m.display(), error = %e, "could not unmount a sandbox's writable area");
        }
    }
}

/// Mount points of this process's mount namespace (/proc/self/mountinfo, octal escapes
/// decoded).
fn mounts() -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .collect()
}

/// `\040` and the like back to their bytes.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\04"), "/end\\04");
    }

    #[test]
    fn an_area_is_bounded_and_goes_with_its_directory() {
        if !rustix::process::geteuid().is_root() {
            println!("SKIP: area mount: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let area = dir.path().join("output");
        std::fs::create_dir(&area).unwrap();
        assert!(mount(&area, 1 << 20, (0, 0), 0o700).unwrap());
        assert!(is_mounted(&area) && !is_full(&area));
        let e = std::fs::write(area.join("big"), vec![0u8; 2 << 20]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert!(is_full(&area));
        unmount_below(dir.path());
        assert!(!is_mounted(&area));
        assert!(!area.join("big").exists());
    }

    #[test]
    fn a_tree_copied_into_a_full_area_stops_with_enospc() {
        if !rustix::process::geteuid().is_root() {
            println!("SKIP: graft full area: needs root to mount a tmpfs");
            return;
        }
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("big"), vec![1u8; 3 << 20]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("workspace");
        std::fs::create_dir(&ws).unwrap();
        assert!(mount(&ws, 1 << 20, (0, 0), 0o755).unwrap());
        std::fs::create_dir(dir.path().join("tmpfs")).unwrap();
        let a = cairn_pack::graft::AreaRoots::open(dir.path(), None).unwrap();
        let e = cairn_pack::graft::copy_tree(src.path(), "workspace", &a).unwrap_err();
        unmount_below(dir.path());
        match e {
            cairn_pack::graft::GraftError::Io { source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOSPC))
            }
            other => panic!("{other}"),
        }
    }
}
