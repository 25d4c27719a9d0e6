//! Work deferred to a run's next event batch (`PUT_DURABILITY_WITH_RUN_EVENTS`).
//!
//! Such a Put replies once its outcome is decided; a background task then fsyncs its bytes
//! and publishes them (so a crash never shows a partial file), and leaves the directory's
//! fsync to the run: the directory joins its run's pending set. The run's next commit of
//! events first waits for every publication started before it ([`Publishing`]), then fsyncs
//! every pending directory, then writes the events. A writer that records each file in the
//! run's events thus overlaps its writes with the disk and pays one directory fsync per batch
//! of events instead of one per file, and an acknowledged event still implies that every file
//! acknowledged before it is durable. A timer bounds how long a directory stays pending when
//! no events follow, and a run log dropped at shutdown syncs what is left.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::io::Errno;
use tokio::sync::watch;

/// Longest a deferred directory waits when no events come.
pub const SYNC_AFTER: Duration = Duration::from_millis(500);
/// Most distinct directories pending per run; beyond it a Put syncs its directory itself.
const MAX_PENDING: usize = 1024;

/// Directories of one run whose new entries are not durable yet, keyed by (device, inode).
#[derive(Debug, Default)]
pub struct PendingDirs {
    dirs: Mutex<HashMap<(u64, u64), Arc<OwnedFd>>>,
}

/// What [`PendingDirs::add`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Added {
    /// The first pending directory: the caller arms the timer.
    First,
    /// Joined a non-empty set (or was there already).
    Joined,
    /// The set is full: the caller fsyncs the directory itself.
    Full,
}

impl PendingDirs {
    pub fn add(&self, dir: &Arc<OwnedFd>) -> Added {
        let Ok(st) = rustix::fs::fstat(dir.as_fd()) else {
            return Added::Full;
        };
        let key = (st.st_dev, st.st_ino);
        let mut dirs = self.lock();
        if dirs.contains_key(&key) {
            return Added::Joined;
        }
        if dirs.len() >= MAX_PENDING {
            return Added::Full;
        }
        dirs.insert(key, dir.clone());
        if dirs.len() == 1 {
            Added::First
        } else {
            Added::Joined
        }
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Takes the pending set; give it to [`sync`], and back with [`PendingDirs::restore`] if
    /// that fails.
    pub fn take(&self) -> Vec<((u64, u64), Arc<OwnedFd>)> {
        self.lock().drain().collect()
    }

    /// Puts back directories whose fsync failed, so the next commit tries again.
    pub fn restore(&self, dirs: Vec<((u64, u64), Arc<OwnedFd>)>) {
        let mut pending = self.lock();
        for (key, dir) in dirs {
            pending.entry(key).or_insert(dir);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64), Arc<OwnedFd>>> {
        self.dirs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// fsyncs one directory now (blocking): a Put's own, when its run could not defer it.
pub fn sync_now(dir: &OwnedFd) -> Result<(), Errno> {
    #[cfg(test)]
    probe::dir_fsync(probe::key_of(dir))?;
    rustix::fs::fsync(dir.as_fd())
}

/// fsyncs each directory (blocking).
pub fn sync(dirs: &[((u64, u64), Arc<OwnedFd>)]) -> Result<(), Errno> {
    for (_key, dir) in dirs {
        #[cfg(test)]
        probe::dir_fsync(*_key)?;
        rustix::fs::fsync(dir.as_fd())?;
    }
    Ok(())
}

/// Test-only record of the durability steps in the order they happen, and fsync failures on
/// demand. Keyed by (device, inode), so tests running side by side see only their own files.
#[cfg(test)]
pub mod probe {
    use std::collections::HashSet;
    use std::os::fd::AsFd;
    use std::sync::Mutex;

    use rustix::io::Errno;

    /// One step, by the (device, inode) it touched.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Step {
        /// A directory's fsync was called.
        DirFsync((u64, u64)),
        /// A batch of events is about to be written to this event log.
        EventsWritten((u64, u64)),
    }

    static STEPS: Mutex<Vec<Step>> = Mutex::new(Vec::new());
    static FAILING: Mutex<Option<HashSet<(u64, u64)>>> = Mutex::new(None);

    pub fn key_of(fd: impl AsFd) -> (u64, u64) {
        let st = rustix::fs::fstat(fd).unwrap_or_else(|e| panic!("fstat: {e}"));
        (st.st_dev, st.st_ino)
    }

    pub(super) fn dir_fsync(key: (u64, u64)) -> Result<(), Errno> {
        let failing = FAILING.lock().unwrap_or_else(|p| p.into_inner());
        if failing.as_ref().is_some_and(|f| f.contains(&key)) {
            return Err(Errno::IO);
        }
        record(Step::DirFsync(key));
        Ok(())
    }

    pub fn events_written(log: impl AsFd) {
        record(Step::EventsWritten(key_of(log)));
    }

    fn record(step: Step) {
        STEPS.lock().unwrap_or_else(|p| p.into_inner()).push(step);
    }

    /// The steps so far that touched one of `keys`, in order.
    pub fn steps(keys: &[(u64, u64)]) -> Vec<Step> {
        let steps = STEPS.lock().unwrap_or_else(|p| p.into_inner());
        steps
            .iter()
            .filter(|s| match s {
                Step::DirFsync(k) | Step::EventsWritten(k) => keys.contains(k),
            })
            .copied()
            .collect()
    }

    /// Makes the fsync of this directory fail with EIO (or succeed again).
    pub fn fail_fsync(key: (u64, u64), fail: bool) {
        let mut failing = FAILING.lock().unwrap_or_else(|p| p.into_inner());
        let set = failing.get_or_insert_with(HashSet::new);
        if fail {
            set.insert(key);
        } else {
            set.remove(&key);
        }
    }
}

impl Drop for PendingDirs {
    fn drop(&mut self) {
        let dirs = self.take();
        if let Err(e) = sync(&dirs) {
            tracing::error!(error = %e, "fsync of deferred directories at close failed");
        }
    }
}

/// A run's publications still in flight after their Puts replied, and the first one lost.
#[derive(Debug)]
pub struct Publishing {
    flight: watch::Sender<Flight>,
}

#[derive(Debug, Default)]
struct Flight {
    next: u64,
    in_flight: BTreeSet<u64>,
    /// (path, cause) of the first publication that failed; the run stays refused.
    lost: Option<(String, String)>,
}

impl Default for Publishing {
    fn default() -> Self {
        Publishing {
            flight: watch::channel(Flight::default()).0,
        }
    }
}

impl Publishing {
    /// Registers a publication; returns its id for [`Publishing::finish`].
    pub fn start(&self) -> u64 {
        let mut id = 0;
        self.flight.send_modify(|f| {
            id = f.next;
            f.next += 1;
            f.in_flight.insert(id);
        });
        id
    }

    /// Marks publication `id` done; a failure (path, cause) refuses the run's later events.
    pub fn finish(&self, id: u64, failure: Option<(String, String)>) {
        self.flight.send_modify(|f| {
            f.in_flight.remove(&id);
            if f.lost.is_none() {
                f.lost = failure;
            }
        });
    }

    /// The lost publication (path, cause), if one failed.
    pub fn lost(&self) -> Option<(String, String)> {
        self.flight.borrow().lost.clone()
    }

    /// Whether anything is in flight or was lost (the run's log must stay open).
    pub fn is_idle(&self) -> bool {
        let f = self.flight.borrow();
        f.in_flight.is_empty() && f.lost.is_none()
    }

    /// Waits for every publication started before this call; then returns the lost one, if any.
    pub async fn settle(&self) -> Option<(String, String)> {
        let upto = self.flight.borrow().next;
        let mut rx = self.flight.subscribe();
        // The sender lives in `self`, so this cannot fail.
        let _ = rx
            .wait_for(|f| f.in_flight.range(..upto).next().is_none())
            .await;
        self.lost()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(path: &std::path::Path) -> Arc<OwnedFd> {
        Arc::new(
            rustix::fs::open(
                path,
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap(),
        )
    }

    #[test]
    fn one_entry_per_directory_and_the_first_arms_the_timer() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("a")).unwrap();
        let pending = PendingDirs::default();
        assert_eq!(pending.add(&dir(tmp.path())), Added::First);
        // Another fd of the same directory is the same entry.
        assert_eq!(pending.add(&dir(tmp.path())), Added::Joined);
        assert_eq!(pending.add(&dir(&tmp.path().join("a"))), Added::Joined);
        let taken = pending.take();
        assert_eq!(taken.len(), 2);
        assert!(pending.is_empty());
        sync(&taken).unwrap();
        pending.restore(taken);
        assert!(!pending.is_empty());
        assert_eq!(pending.take().len(), 2);
    }

    #[test]
    fn a_set_dropped_at_close_syncs_the_directories_left_in_it() {
        let tmp = tempfile::tempdir().unwrap();
        let pending = PendingDirs::default();
        let d = dir(tmp.path());
        let key = probe::key_of(d.as_fd());
        assert_eq!(pending.add(&d), Added::First);
        let before = probe::steps(&[key]).len();
        drop(pending);
        let steps = probe::steps(&[key]);
        assert_eq!(steps[before..], [probe::Step::DirFsync(key)], "{steps:?}");
    }

    #[tokio::test]
    async fn events_wait_for_earlier_publications_only_and_a_lost_one_sticks() {
        let publishing = Publishing::default();
        let a = publishing.start();
        let settle = async {
            // Started after the settle began: not waited for.
            let _late = publishing.start();
            tokio::time::sleep(Duration::from_millis(50)).await;
            publishing.finish(a, None);
        };
        let (lost, ()) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(publishing.settle(), settle)
        })
        .await
        .expect("the settle never ended: a finished publication still counts as in flight");
        assert_eq!(lost, None);
        assert!(!publishing.is_idle(), "the late one is still in flight");
        let b = publishing.start();
        publishing.finish(b, Some(("x.txt".into(), "fsync failed".into())));
        let c = publishing.start();
        publishing.finish(c, Some(("y.txt".into(), "later".into())));
        let lost = tokio::time::timeout(Duration::from_secs(1), async {
            publishing.finish(1, None); // the late one
            publishing.settle().await
        })
        .await
        .unwrap();
        assert_eq!(lost, Some(("x.txt".into(), "fsync failed".into())));
        assert!(!publishing.is_idle(), "a lost publication keeps the log");
    }

    #[test]
    fn a_run_with_nothing_in_flight_and_nothing_lost_is_idle() {
        let publishing = Publishing::default();
        assert!(publishing.is_idle());
        let a = publishing.start();
        assert!(!publishing.is_idle());
        publishing.finish(a, None);
        assert!(
            publishing.is_idle(),
            "finished without a loss: its log may close"
        );
    }

    #[test]
    fn a_full_set_makes_the_writer_sync_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let pending = PendingDirs::default();
        for i in 0..MAX_PENDING {
            let p = tmp.path().join(i.to_string());
            std::fs::create_dir(&p).unwrap();
            assert_ne!(pending.add(&dir(&p)), Added::Full);
        }
        let extra = tmp.path().join("extra");
        std::fs::create_dir(&extra).unwrap();
        assert_eq!(pending.add(&dir(&extra)), Added::Full);
        // One already pending still joins.
        assert_eq!(pending.add(&dir(&tmp.path().join("0"))), Added::Joined);
    }
}
