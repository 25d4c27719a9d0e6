//! The bookkeeping of snapshot quotas: snapshot Puts admitted one at a time, and the bytes
//! each holds until it is published. What counts and the walk of the disk are `snapshots`'.
//!
//! May depend on: error.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// The admissions of snapshot Puts (one per store).
#[derive(Debug, Default)]
pub struct Quota {
    /// One admission at a time: looking at the disk and reserving are one step.
    admitting: tokio::sync::Mutex<()>,
    /// Bytes admitted per project and not yet published.
    pending: Arc<Mutex<HashMap<String, u64>>>,
}

/// Room taken by an admitted snapshot Put until it is published (or fails): given back when
/// dropped.
#[derive(Debug)]
pub struct Reservation {
    pending: Arc<Mutex<HashMap<String, u64>>>,
    project: String,
    bytes: u64,
}

impl Quota {
    /// Held from looking at the disk to [`Quota::reserve`].
    pub async fn one_at_a_time(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.admitting.lock().await
    }

    /// Reserves `bytes` for `path` of `project`, which holds `on_disk` bytes of snapshots
    /// (the file `path` replaces left out), unless with the pending ones they pass `limit`.
    /// `pending_before` is [`Quota::pending`] read before the disk was walked: a Put
    /// published during the walk may be missing from both the walk and the reservations
    /// left now, so the larger of the two counts (a Put counted twice is a refusal at worst,
    /// one counted nowhere would let two Puts share the last room).
    pub fn reserve(
        &self,
        project: &str,
        path: &str,
        on_disk: u64,
        pending_before: u64,
        bytes: u64,
        limit: u64,
    ) -> Result<Reservation> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let now = pending.get(project).copied().unwrap_or(0);
        let held = on_disk.saturating_add(now.max(pending_before));
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
            project: project.to_owned(),
            bytes,
        })
    }

    /// Bytes reserved for `project` now.
    pub fn pending(&self, project: &str) -> u64 {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.get(project).copied().unwrap_or(0)
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

    #[test]
    fn reservations_count_until_dropped_and_the_limit_is_inclusive() {
        let quota = Quota::default();
        let a = quota.reserve("p", "a", 40, 0, 30, 100).unwrap();
        assert_eq!(quota.pending("p"), 30);
        // 40 on disk + 30 pending + 30 = 100: exactly the limit fits.
        let b = quota.reserve("p", "b", 40, 0, 30, 100).unwrap();
        let refused = quota.reserve("p", "c", 40, 0, 1, 100).unwrap_err();
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
        drop(quota.reserve("q", "a", 0, 0, 100, 100).unwrap());
        drop(a);
        assert_eq!(quota.pending("p"), 30);
        drop(b);
        assert_eq!(quota.pending("p"), 0);
        assert!(quota.reserve("p", "c", 40, 0, 60, 100).is_ok());
    }

    /// A Put published while an admission walked the disk: the walk missed its file and its
    /// reservation is gone by the time of the check. It still counts, so a 4th Put of 300
    /// under 1024 is refused where it used to be let in.
    #[test]
    fn a_put_published_during_the_walk_is_still_counted() {
        let quota = Quota::default();
        let published = quota.reserve("p", "a", 600, 0, 300, 1024).unwrap();
        let before = quota.pending("p");
        // The walk ran (600 on disk: it missed `a`), then `a` was published.
        drop(published);
        let refused = quota.reserve("p", "d", 600, before, 300, 1024).unwrap_err();
        assert!(
            matches!(refused, Error::SnapshotQuota { held: 900, .. }),
            "{refused:?}"
        );
        // Read after the walk, the same numbers would have let it in.
        assert!(quota
            .reserve("p", "d", 600, quota.pending("p"), 300, 1024)
            .is_ok());
    }
}
