//! A test-only disk with a volatile cache, over FUSE: what a program writes through the mount
//! is served back at once, but only what it fsync'd survives a power cut (see `model` for the
//! rules). [`Mounted::cut_now`] or [`Mounted::cut_after`] takes the power away; then
//! [`Mounted::materialise`] writes the durable state into a fresh directory, where the program
//! can be started again as after a reboot.
//!
//! Needs root and `/dev/fuse` (the mount is a plain mount(2), no fusermount). Mounts are
//! lazily unmounted when dropped, on a panic too; one left by a killed test process (a dead
//! connection, ENOTCONN) is unmounted by the next [`Mounted::new`].
#![allow(dead_code)]

pub mod fuse;
pub mod model;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use fuse::{Layer, Power};
use model::Model;

/// The source name of these mounts in /proc/self/mountinfo.
const FS_NAME: &str = "cairn-powercut";

/// Why this machine cannot run a power-cut test (None: it can).
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root: mounting the FUSE layer needs root".into());
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Some(format!(
            "/dev/fuse cannot be opened ({e}): FUSE is not available"
        ));
    }
    None
}

/// The layer mounted on a fresh directory.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    power: Arc<Mutex<Power>>,
    mountpoint: PathBuf,
    /// Holds the mount point (and the test's other directories); dropped after the unmount.
    tmp: tempfile::TempDir,
}

impl Mounted {
    /// Mounts a disk holding what `backing` holds (all of it durable) on a new directory
    /// under a fresh temp dir.
    pub fn new(backing: &Path) -> Result<Mounted, String> {
        unmount_dead_layers();
        let model =
            Model::load(backing).map_err(|e| format!("loading {}: {e}", backing.display()))?;
        let tmp = tempfile::Builder::new()
            .prefix("cairn-powercut-")
            .tempdir()
            .map_err(|e| format!("a temp dir: {e}"))?;
        let mountpoint = tmp.path().join("mnt");
        std::fs::create_dir(&mountpoint).map_err(|e| format!("the mount point: {e}"))?;
        let power = Arc::new(Mutex::new(Power::new(model)));
        let layer = Layer {
            power: power.clone(),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName(FS_NAME.into()),
            fuser::MountOption::NoAtime,
        ];
        let session = fuser::spawn_mount(layer, &mountpoint, &config)
            .map_err(|e| format!("mounting the FUSE layer on {}: {e}", mountpoint.display()))?;
        Ok(Mounted {
            session: Some(session),
            power,
            mountpoint,
            tmp,
        })
    }

    /// Where the disk is mounted.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// A directory beside the mount point, for the test's own files (not on the layer).
    pub fn scratch(&self, name: &str) -> PathBuf {
        let dir = self.tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        dir
    }

    fn power(&self) -> MutexGuard<'_, Power> {
        self.power.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the power away now: every later operation fails with EIO.
    pub fn cut_now(&self) {
        self.power().on = false;
    }

    /// The power goes at the `n`th operation from now (n ≥ 1; that one fails too).
    pub fn cut_after(&self, n: u64) {
        let mut power = self.power();
        power.cut_at = Some(power.ops + n.max(1));
    }

    pub fn is_cut(&self) -> bool {
        !self.power().on
    }

    /// Operations served so far.
    pub fn ops(&self) -> u64 {
        self.power().ops
    }

    /// (file fsyncs, directory fsyncs) served so far.
    pub fn fsyncs(&self) -> (u64, u64) {
        self.power().fsyncs
    }

    /// Writes what survived the cut into `dst` (created; must not exist); returns how many
    /// files it holds. The power must be off.
    pub fn materialise(&self, dst: &Path) -> std::io::Result<usize> {
        let power = self.power();
        assert!(!power.on, "materialise is for after a power cut");
        std::fs::create_dir(dst)?;
        power.model.materialise(dst)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.cut_now();
        // Lazy: detached at once even while a process still has files open in it.
        let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
        // The session's thread ends when the kernel closes the connection; not joined, so
        // a stuck request can never hang the test.
        drop(self.session.take());
    }
}

/// Lazily unmounts layers of earlier test processes whose connection is dead (the process
/// was killed before its drop ran). Live ones, of tests running now, are left alone.
fn unmount_dead_layers() {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut right = right.split(' ');
        let (Some(fstype), Some(source)) = (right.next(), right.next()) else {
            continue;
        };
        let Some(point) = left.split(' ').nth(4) else {
            continue;
        };
        if !fstype.starts_with("fuse") || source != FS_NAME || point.contains('\\') {
            continue;
        }
        if let Err(e) = std::fs::metadata(point) {
            if e.raw_os_error() == Some(nix::errno::Errno::ENOTCONN as i32) {
                let _ = nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

/// Runs `test` (within `limit`) when this machine can mount the layer; else prints SKIP, or
/// fails under `CAIRN_REQUIRE_DOCKER=1` (CI), where it must run.
pub async fn with_fuse<F: std::future::Future<Output = ()>>(
    name: &str,
    limit: std::time::Duration,
    test: impl FnOnce() -> F,
) {
    let required = std::env::var("CAIRN_REQUIRE_DOCKER").as_deref() == Ok("1");
    let reason = unavailable().or_else(|| {
        // A mount can still be refused (a container without CAP_SYS_ADMIN): try one.
        let backing = tempfile::tempdir().ok()?;
        Mounted::new(backing.path()).err()
    });
    if let Some(reason) = reason {
        assert!(
            !required,
            "{name}: CAIRN_REQUIRE_DOCKER=1 but the power-cut layer cannot run here: {reason}"
        );
        println!("SKIP: {name}: {reason}");
        return;
    }
    if tokio::time::timeout(limit, test()).await.is_err() {
        panic!("{name} did not finish within {limit:?}");
    }
}
