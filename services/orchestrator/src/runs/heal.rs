//! Healing: every unfinished run this orchestrator owns has one live driver here. Membership
//! changes release the runs another replica now owns and adopt the ones gained; a periodic
//! reconcile pass (`reconcile_interval_ms`) resumes any owned unfinished run no live driver
//! here holds (a driver that ended, was aborted or was fenced off without finishing its run,
//! a run left between owners by a quick succession of membership changes). The store's claim
//! on each run keeps the result exactly one driver.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, Interval};

use super::{key, Live, Runs};
use crate::cluster::{Cluster, View};

/// How long a run whose resume failed is left out of the reconcile passes.
const RESUME_BACKOFF: Duration = Duration::from_secs(10);

/// Whether a registered driver is gone: nobody receives its commands any more and its task
/// (if it was launched) has ended.
fn dead(l: &Live) -> bool {
    l.cmd.is_closed() && l.join.as_ref().is_none_or(|j| j.is_finished())
}

impl Runs {
    /// The reconcile ticker; None when `reconcile_interval_ms` is 0.
    fn reconcile_ticker(&self) -> Option<Interval> {
        let ms = self.b.config.reconcile_interval_ms;
        (ms > 0).then(|| {
            let every = Duration::from_millis(ms);
            let mut t = tokio::time::interval_at(Instant::now() + every, every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        })
    }

    /// Releases the runs this replica no longer owns and adopts the unfinished ones it gained,
    /// at every membership change; between changes, reconcile passes.
    pub(super) async fn follow_cluster(self: Arc<Self>, cluster: Arc<Cluster>) {
        let mut views = cluster.subscribe();
        let handover = Duration::from_millis(cluster.config().handover_ms);
        let mut ticker = self.reconcile_ticker();
        // The view the last adoption pass ran under: passes run only while it holds (a newer
        // view is first released and handed over).
        let mut settled: Option<Arc<View>> = None;
        loop {
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return,
                changed = views.changed() => if changed.is_err() { return },
                _ = tick(&mut ticker) => {
                    let view = cluster.view();
                    if view.joined && settled.as_ref().is_some_and(|s| Arc::ptr_eq(s, &view)) {
                        self.clone().reconcile().await;
                    }
                    continue;
                }
            }
            settled = None;
            let released = self.release_unowned(&cluster);
            if released > 0 {
                tracing::info!(member = %cluster.me(), released, "released runs now owned by other replicas");
            }
            if !views.borrow_and_update().joined {
                continue;
            }
            // Give a run's previous owner time to stop; a newer change starts over.
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(handover) => {}
            }
            if views.has_changed().unwrap_or(false) {
                continue;
            }
            settled = Some(cluster.view());
            let adopted = self.clone().resume_unfinished().await;
            if adopted > 0 {
                tracing::info!(member = %cluster.me(), adopted, "adopted runs");
            }
        }
    }

    /// Reconcile passes of an orchestrator without replicas, until shutdown.
    pub async fn reconcile_forever(self: Arc<Self>) {
        let Some(mut ticker) = self.reconcile_ticker() else {
            return;
        };
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            self.clone().reconcile().await;
        }
    }

    /// One reconcile pass: releases runs owned elsewhere, resumes runs whose driver here is
    /// gone and (when this orchestrator adopts runs: replicas, or `resume_on_start`) every
    /// unfinished run of the store's run index it owns and does not drive. Returns how many
    /// runs came to life.
    pub(crate) async fn reconcile(self: Arc<Self>) -> usize {
        if let Some(c) = self.cluster() {
            self.release_unowned(c);
        }
        let dead: Vec<String> = match self.live.lock() {
            Ok(live) => live
                .iter()
                .filter(|(_, l)| dead(l))
                .map(|(k, _)| k.clone())
                .collect(),
            Err(_) => return 0,
        };
        let mut healed = 0;
        for k in dead {
            if let Some((project, run_id)) = k.split_once('/') {
                if self.resume_one(project, run_id).await {
                    healed += 1;
                }
            }
        }
        if self.cluster().is_some() || self.b.config.resume_on_start {
            match self.b.store.projects().await {
                Ok(projects) => healed += self.resume_listed(projects).await,
                Err(e) => {
                    tracing::debug!(error = %e, "reconcile: the store is not reachable; trying again at the next pass");
                }
            }
        }
        for _ in 0..healed {
            cairn_telemetry::metrics::run_healed();
        }
        if healed > 0 {
            tracing::warn!(
                healed,
                "reconcile: resumed unfinished runs that had no live driver here"
            );
        }
        healed
    }

    /// Stops the drivers of live runs another member owns (or all, out of the cluster) and
    /// takes them out of the run table at once: a run released here and owned here again
    /// (a quick way out of the membership and back) is adopted anew, fencing the old driver
    /// off, instead of waiting for it to end. Returns how many were released.
    pub(super) fn release_unowned(&self, cluster: &Cluster) -> usize {
        let Ok(mut live) = self.live.lock() else {
            return 0;
        };
        // A reservation (no driver yet) is released once its driver has started.
        let gone: Vec<String> = live
            .iter()
            .filter(|(k, l)| {
                l.stop.is_some()
                    && k.split_once('/')
                        .is_some_and(|(project, run_id)| !cluster.owns(project, run_id))
            })
            .map(|(k, _)| k.clone())
            .collect();
        let Ok(mut draining) = self.draining.lock() else {
            return 0;
        };
        draining.retain(|j| !j.is_finished());
        for k in &gone {
            if let Some(mut l) = live.remove(k) {
                if let Some(stop) = &l.stop {
                    stop.cancel();
                }
                draining.extend(l.join.take());
            }
        }
        gone.len()
    }

    /// Whether a driver here holds the run (or is being started); an entry whose driver is
    /// gone is taken out of the run table (and said so) so the run can be resumed.
    pub(super) fn held_here(&self, project: &str, run_id: &str) -> bool {
        let Ok(mut live) = self.live.lock() else {
            return true;
        };
        let k = key(project, run_id);
        match live.get(&k) {
            None => false,
            Some(l) if !dead(l) => true,
            Some(_) => {
                live.remove(&k);
                tracing::warn!(%project, %run_id, "the run's driver here ended without finishing the run");
                false
            }
        }
    }

    /// Whether the reconcile passes leave the run alone for now (its last resume failed).
    pub(super) fn resume_backing_off(&self, project: &str, run_id: &str) -> bool {
        let Ok(mut r) = self.retry_resume.lock() else {
            return false;
        };
        let now = Instant::now();
        r.retain(|_, until| *until > now);
        r.contains_key(&key(project, run_id))
    }

    /// Leaves a run whose resume failed out of the reconcile passes for a while.
    pub(super) fn resume_failed(&self, project: &str, run_id: &str) {
        if let Ok(mut r) = self.retry_resume.lock() {
            r.insert(key(project, run_id), Instant::now() + RESUME_BACKOFF);
        }
    }

    /// Test support: aborts the task driving a run here, leaving its entry in the run table as
    /// a crashed driver would (the reconcile pass is what resumes the run). True when a
    /// driver was aborted.
    #[doc(hidden)]
    pub fn abort_driver(&self, project: &str, run_id: &str) -> bool {
        let Ok(live) = self.live.lock() else {
            return false;
        };
        match live
            .get(&key(project, run_id))
            .and_then(|l| l.join.as_ref())
        {
            Some(j) => {
                j.abort();
                true
            }
            None => false,
        }
    }
}

/// The next tick of `t`; never when there is no ticker.
async fn tick(t: &mut Option<Interval>) {
    match t {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}
