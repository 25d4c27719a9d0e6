//! The warm pool's policy, shared by both backends: `pool_size` sandboxes made ahead of time
//! (docker: containers running the agent, backend/docker_pool.rs; local: bubblewrap sandboxes
//! whose process waits for its job, backend/local_pool.rs). A sandbox serves one run and is
//! discarded; a replacement is made in the background.
//!
//! Refills yield to demand: while runs that missed the pool are being served cold, or calls
//! wait in the admission queue for a slot, no replacement is started (both would compete for
//! the same engine or cores), and at most `REFILL_PARALLEL` replacements are made at once.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::admission::Queued;
use crate::error::{Error, Result};

/// Sandboxes made at once by the refill.
const REFILL_PARALLEL: usize = 2;
/// A take waits this long before refilling, so a burst shows its size first.
const REFILL_DELAY: Duration = Duration::from_millis(50);

/// What a pool holds and how to make and discard one.
pub trait Source: Send + Sync + 'static {
    type Item: Send + 'static;
    /// Names one item in logs ("warm container").
    const WHAT: &'static str;
    /// Names the pool in metrics (`docker`, `local`, `gvisor`).
    const KIND: &'static str;
    /// Items to keep ready.
    fn size(&self) -> usize;
    fn make(&self) -> impl Future<Output = Result<Self::Item>> + Send;
    /// Removes an item never used (pool closed).
    fn discard(&self, item: Self::Item) -> impl Future<Output = ()> + Send;
}

pub struct Pool<S: Source> {
    source: S,
    ready: Mutex<VecDeque<S::Item>>,
    /// `ready.len()`, readable without the lock.
    ready_len: AtomicUsize,
    creating: AtomicUsize,
    /// Runs that fit the pool but found it empty and are being served cold.
    cold: AtomicUsize,
    /// Calls waiting for admission (runner-wide).
    queued: Queued,
    closed: AtomicBool,
}

/// Why a run on a waiting sandbox gave no outcome.
pub enum Pooled {
    /// The sandbox failed before the program started: the job may still run cold.
    Unstarted(Error),
    /// The program started: its run failed, and is not run again.
    Failed(Error),
}

/// What [`Pool::serve`] did with a job.
pub enum Served<T, S: Source> {
    /// Ran on a waiting sandbox (or failed there once started).
    Done(Result<T>),
    /// Run it cold; hold this (when the job fit the pool) until the cold run ends.
    Cold(Option<ColdRun<S>>),
}

/// Marks one cold run of a job the pool could have served; refills resume when the last ends.
pub struct ColdRun<S: Source>(Arc<Pool<S>>);

impl<S: Source> Drop for ColdRun<S> {
    fn drop(&mut self) {
        if self.0.cold.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.clone().fill();
        }
    }
}

impl<S: Source> Pool<S> {
    pub fn new(source: S, queued: Queued) -> Pool<S> {
        Pool {
            source,
            ready: Mutex::new(VecDeque::new()),
            ready_len: AtomicUsize::new(0),
            creating: AtomicUsize::new(0),
            cold: AtomicUsize::new(0),
            queued,
            closed: AtomicBool::new(false),
        }
    }

    /// Keeps `ready_len` and the `cairn.sandbox.pool.ready` gauge at `n`.
    fn set_ready(&self, n: usize) {
        self.ready_len.store(n, Ordering::SeqCst);
        cairn_telemetry::metrics::pool_ready(S::KIND, n);
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    /// Makes items in the background until `size` are ready or being made.
    pub fn fill(self: Arc<Self>) {
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return;
            }
            let ready = self.ready_len.load(Ordering::SeqCst);
            let creating = self.creating.load(Ordering::SeqCst);
            if ready + creating >= self.source.size()
                || creating >= REFILL_PARALLEL
                || self.cold.load(Ordering::SeqCst) > 0
                || self.queued.count() > 0
            {
                return;
            }
            self.creating.fetch_add(1, Ordering::SeqCst);
            let pool = self.clone();
            tokio::spawn(async move {
                match pool.source.make().await {
                    Ok(item) => {
                        let mut ready = pool.ready.lock().await;
                        if pool.closed.load(Ordering::SeqCst) {
                            // closed meanwhile: `close` waits for this removal
                            drop(ready);
                            pool.source.discard(item).await;
                        } else {
                            ready.push_back(item);
                            pool.set_ready(ready.len());
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not make a {}; retrying in 5 s", S::WHAT);
                        for _ in 0..50 {
                            if pool.closed.load(Ordering::SeqCst) {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
                pool.creating.fetch_sub(1, Ordering::SeqCst);
                pool.fill();
            });
        }
    }

    /// A ready item, if any (the caller falls back to a cold run otherwise).
    pub async fn take(self: &Arc<Self>) -> Option<S::Item> {
        let item = {
            let mut ready = self.ready.lock().await;
            let item = ready.pop_front();
            self.set_ready(ready.len());
            item
        };
        let pool = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(REFILL_DELAY).await;
            pool.fill();
        });
        item
    }

    /// Runs a job on a waiting sandbox (`run`) when there is a pool, the job `fits` it and an
    /// item is ready; a sandbox that failed before the program started is logged and the job
    /// goes cold, as it does when the pool is empty.
    pub async fn serve<T, Fut>(
        pool: Option<&Arc<Self>>,
        fits: impl FnOnce(&S) -> bool,
        run: impl FnOnce(S::Item) -> Fut,
    ) -> Served<T, S>
    where
        Fut: Future<Output = std::result::Result<T, Pooled>>,
    {
        let Some(pool) = pool.filter(|p| fits(p.source())) else {
            return Served::Cold(None);
        };
        if let Some(item) = pool.take().await {
            match run(item).await {
                Ok(done) => return Served::Done(Ok(done)),
                Err(Pooled::Failed(e)) => return Served::Done(Err(e)),
                Err(Pooled::Unstarted(e)) => {
                    tracing::warn!(error = %e, "a {} failed before its program started; running cold", S::WHAT);
                }
            }
        }
        Served::Cold(Some(pool.cold_run()))
    }

    /// Called when a job that fits the pool goes cold: holds refills until it ends.
    pub fn cold_run(self: &Arc<Self>) -> ColdRun<S> {
        self.cold.fetch_add(1, Ordering::SeqCst);
        ColdRun(self.clone())
    }

    /// Items ready now.
    pub fn ready_count(&self) -> usize {
        self.ready_len.load(Ordering::SeqCst)
    }

    /// Stops refilling and discards every ready item (and those being made, once made).
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Items being made are discarded by their makers; wait for them (bounded).
        let t0 = Instant::now();
        while self.creating.load(Ordering::SeqCst) > 0 && t0.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let drained: Vec<S::Item> = self.ready.lock().await.drain(..).collect();
        self.set_ready(0);
        for item in drained {
            self.source.discard(item).await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Counts what it makes.
    struct Counter(Arc<AtomicUsize>);

    impl Source for Counter {
        type Item = ();
        const WHAT: &'static str = "test item";
        const KIND: &'static str = "test";
        fn size(&self) -> usize {
            2
        }
        async fn make(&self) -> Result<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        async fn discard(&self, _item: ()) {}
    }

    #[tokio::test]
    async fn refills_wait_while_calls_wait_for_admission() {
        let admission = crate::admission::Admission::new(1, 4, Duration::from_secs(60));
        let made = Arc::new(AtomicUsize::new(0));
        let pool = Arc::new(Pool::new(Counter(made.clone()), admission.queued()));
        let held = admission.admit().await.unwrap();
        let admission = Arc::new(admission);
        let queued = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit().await.map(drop) }
        });
        while admission.queued().count() == 0 {
            tokio::task::yield_now().await;
        }
        pool.clone().fill();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            made.load(Ordering::SeqCst),
            0,
            "a refill ran while a call waited"
        );
        drop(held);
        queued.await.unwrap().unwrap();
        pool.clone().fill();
        let t0 = Instant::now();
        while pool.ready_count() < 2 {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "no refill once the queue emptied"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
