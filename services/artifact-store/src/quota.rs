//! The bookkeeping of snapshot quotas: snapshot Puts admitted one at a time, and the bytes
//! each holds until it is published. What counts and the walk of the disk are `snapshots`'.
//!
//! A snapshot is counted exactly once: while a walk of the disk runs, no admitted snapshot is
//! published (its link and the return of its reservation happen together, never during a
//! walk), so each one is either on the disk the walk sees or in the pending bytes read with
//! it, never in both nor in neither.
//!
//! May depend on: error.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use parking_lot::RwLock;

use crate::error::{Error, Result};

/// The admissions of snapshot Puts (one per store).
#[derive(Debug, Default)]
pub struct Quota {
    /// One admission at a time: looking at the disk and reserving are one step.
    admitting: tokio::sync::Mutex<()>,
    /// Bytes admitted per project and not yet published.
    pending: Arc<Mutex<HashMap<String, u64>>>,
    /// Written by a walk of the disk, read by publications (see the module's comment). A
    /// publication may wait for a path's slot that another publication holds while that one
    /// asks for its read: reads never queue behind a waiting walk (`read_recursive`), or the
    /// three would wait on each other.
    walking: Arc<RwLock<()>>,
}

/// Room taken by an admitted snapshot Put until it is published (or fails): given back when
/// dropped, or by [`Reservation::publish`] together with the publication.
#[derive(Debug)]
pub struct Reservation {
    pending: Arc<Mutex<HashMap<String, u64>>>,
    walking: Arc<RwLock<()>>,
    project: String,
    bytes: u64,
}

impl Quota {
    /// Held from looking at the disk to [`Quota::reserve`].
    pub async fn one_at_a_time(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.admitting.lock().await
    }

    /// Reserves `bytes` for `path` of `project`, unless with the snapshots `walk` finds on
    /// disk (the file `path` replaces left out) and the pending ones they pass `limit`. No
    /// admitted snapshot is published while `walk` runs (blocking: call off the async
    /// threads).
    pub fn reserve(
        &self,
        project: &str,
        path: &str,
        bytes: u64,
        limit: u64,
        walk: impl FnOnce() -> Result<u64>,
    ) -> Result<Reservation> {
        let _walk = self.walking.write();
        let on_disk = walk()?;
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let held = on_disk.saturating_add(pending.get(project).copied().unwrap_or(0));
        if held.saturating_add(bytes) > limit {
            return Err(Error::SnapshotQuota {
                project: project.to_owned(),
                path: path.to_owned(),
                bytes,
                held,
                limit,
            });
        }
        *pending.entry(project.to_owned()).or_insert(0) += bytes;
        Ok(Reservation {
            pending: self.pending.clone(),
            walking: self.walking.clone(),
            project: project.to_owned(),
            bytes,
        })
    }

    /// Bytes reserved for `project` now.
    #[cfg(test)]
    pub fn pending(&self, project: &str) -> u64 {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.get(project).copied().unwrap_or(0)
    }
}

impl Reservation {
    /// Runs `publish` (what puts the snapshot on disk) and gives the room back with it, both
    /// outside any walk of the disk (blocking).
    pub fn publish<T>(self, publish: impl FnOnce() -> T) -> T {
        let walking = self.walking.clone();
        let _published = walking.read_recursive();
        let out = publish();
        drop(self);
        out
    }
}

/// [`Reservation::publish`] when there is a reservation, else `publish` alone.
pub fn publish_with<T>(reservation: Option<Reservation>, publish: impl FnOnce() -> T) -> T {
    match reservation {
        Some(r) => r.publish(publish),
        None => publish(),
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(left) = pending.get_mut(&self.project) {
            *left = left.saturating_sub(self.bytes);
            if *left == 0 {
                pending.remove(&self.project);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    fn disk(bytes: u64) -> impl FnOnce() -> Result<u64> {
        move || Ok(bytes)
    }

    #[test]
    fn reservations_count_until_dropped_and_the_limit_is_inclusive() {
        let quota = Quota::default();
        let a = quota.reserve("p", "a", 30, 100, disk(40)).unwrap();
        assert_eq!(quota.pending("p"), 30);
        // 40 on disk + 30 pending + 30 = 100: exactly the limit fits.
        let b = quota.reserve("p", "b", 30, 100, disk(40)).unwrap();
        let refused = quota.reserve("p", "c", 1, 100, disk(40)).unwrap_err();
        assert!(matches!(
            refused,
            Error::SnapshotQuota {
                held: 100,
                bytes: 1,
                limit: 100,
                ..
            }
        ));
        assert_eq!(refused.reason(), "snapshot_quota");
        // Another project has its own room.
        drop(quota.reserve("q", "a", 100, 100, disk(0)).unwrap());
        drop(a);
        assert_eq!(quota.pending("p"), 30);
        // Published: the room goes back with it.
        assert_eq!(b.publish(|| 7), 7);
        assert_eq!(quota.pending("p"), 0);
        let _c = quota.reserve("p", "c", 60, 100, disk(40)).unwrap();
        // A walk that fails reserves nothing.
        let failed = quota.reserve("p", "d", 1, 100, || Err(Error::Unavailable));
        assert!(failed.is_err());
        assert_eq!(quota.pending("p"), 60);
    }

    /// A publication that waits (for a path's slot) on a second one, while a walk waits for
    /// the first: the second's read must not queue behind the walk, or none of the three
    /// would ever go on.
    #[test]
    fn a_publication_is_not_held_up_by_a_walk_waiting_for_another_publication() {
        let quota = Quota::default();
        let first = quota.reserve("p", "a", 1, 1024, disk(0)).unwrap();
        let second = quota.reserve("p", "b", 1, 1024, disk(0)).unwrap();
        let (in_first_tx, in_first_rx) = std::sync::mpsc::channel::<()>();
        let (second_done_tx, second_done_rx) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|scope| {
            let first = scope.spawn(move || {
                first.publish(|| {
                    in_first_tx.send(()).unwrap();
                    second_done_rx.recv_timeout(Duration::from_secs(5))
                })
            });
            in_first_rx.recv().unwrap();
            let walk = scope.spawn(|| quota.reserve("p", "c", 1, 1024, disk(0)).is_ok());
            // The walk is waiting for the first publication by now.
            std::thread::sleep(Duration::from_millis(100));
            second.publish(|| {
                let _ = second_done_tx.send(());
            });
            assert!(
                first.join().unwrap().is_ok(),
                "the second publication waited behind the walk"
            );
            assert!(walk.join().unwrap());
        });
    }

    /// Put `a` (300 bytes, admitted, `on_disk_before` bytes of snapshots on disk) is
    /// published while Put `b` (300) is admitted under 1024. `walk_first`: the publication is
    /// asked for during b's walk, else the walk during the publication. Was b let in?
    fn race(on_disk_before: u64, walk_first: bool) -> bool {
        let quota = Quota::default();
        let on_disk = AtomicU64::new(on_disk_before);
        let published = quota
            .reserve("p", "a", 300, 1024, disk(on_disk_before))
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tx, rx) = (Mutex::new(Some(tx)), Mutex::new(Some(rx)));
        let signal = || {
            if let Some(tx) = tx.lock().unwrap().take() {
                tx.send(()).unwrap();
            }
        };
        let wait = || {
            if let Some(rx) = rx.lock().unwrap().take() {
                rx.recv().unwrap();
            }
        };
        std::thread::scope(|scope| {
            let publisher = scope.spawn(|| {
                if walk_first {
                    wait();
                }
                published.publish(|| {
                    if !walk_first {
                        signal();
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    on_disk.fetch_add(300, Ordering::SeqCst)
                });
            });
            if !walk_first {
                wait();
            }
            let admitted = quota.reserve("p", "b", 300, 1024, || {
                let seen = on_disk.load(Ordering::SeqCst);
                if walk_first {
                    signal();
                    // The publication waits for this walk (else: counted twice).
                    std::thread::sleep(Duration::from_millis(100));
                    Ok(on_disk.load(Ordering::SeqCst))
                } else {
                    // A walk that read the disk before the link and ended after the room
                    // went back would count the Put nowhere.
                    std::thread::sleep(Duration::from_millis(200));
                    Ok(seen)
                }
            });
            publisher.join().unwrap();
            admitted.is_ok()
        })
    }

    /// A Put published while another admission walks the disk is counted once, on the disk
    /// or in the pending bytes, whichever of the two asks first: 300 + 300 + 300 fit in
    /// 1024 (not counted twice), 600 + 300 + 300 do not (not counted nowhere).
    #[test]
    fn a_put_published_during_a_walk_is_counted_exactly_once() {
        for on_disk_before in [300, 600] {
            for walk_first in [true, false] {
                assert_eq!(
                    race(on_disk_before, walk_first),
                    on_disk_before == 300,
                    "{on_disk_before} on disk, walk first: {walk_first}"
                );
            }
        }
    }
}
