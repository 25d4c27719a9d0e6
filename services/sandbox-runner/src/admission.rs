//! Admission of runs and sessions: `max_concurrent_runs` slots, and in front of them a bounded
//! FIFO queue (`queue_depth`, `queue_timeout_ms`) where a call above the limit waits for a
//! slot instead of failing. Only a full queue, or a wait past the queue timeout, refuses
//! (RESOURCE_EXHAUSTED with RetryInfo). A waiting call that is dropped (its client cancelled or
//! its deadline passed) leaves the queue at once and never takes a slot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};

/// What the queue reason is when it refuses: the orchestrator retries on this word.
const REASON: &str = "max_concurrent_runs";

/// Calls waiting in the queue now, shared with the warm pools so refills yield to them.
#[derive(Clone, Debug, Default)]
pub struct Queued(Arc<AtomicUsize>);

impl Queued {
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

pub struct Admission {
    slots: Arc<Semaphore>,
    max: usize,
    depth: usize,
    timeout: Duration,
    queued: Queued,
}

/// One place in the queue, given back however the wait ends.
struct Place<'a>(&'a AtomicUsize);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Admission {
    pub fn new(max: usize, depth: usize, timeout: Duration) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(max)),
            max,
            depth,
            timeout,
            queued: Queued::default(),
        }
    }

    /// The queue's length, for the pools.
    pub fn queued(&self) -> Queued {
        self.queued.clone()
    }

    /// A slot for one run or session: at once when one is free, else after the calls queued
    /// before this one (FIFO), within `queue_timeout_ms`.
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit> {
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => return Ok(slot),
            Err(tokio::sync::TryAcquireError::Closed) => return Err(Error::ShuttingDown),
            Err(tokio::sync::TryAcquireError::NoPermits) => {}
        }
        let queued = self
            .queued
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.depth).then_some(n + 1)
            });
        if queued.is_err() {
            return Err(self.refused(format!(
                "this runner already has {} runs and open sessions (its max_concurrent_runs) and {} more waiting (its queue_depth): \
                 retry later, send the work to another runner, close an idle session, or raise max_concurrent_runs or queue_depth in the runner config",
                self.max, self.depth
            )));
        }
        let _place = Place(&self.queued.0);
        match tokio::time::timeout(self.timeout, self.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => Ok(slot),
            Ok(Err(_closed)) => Err(Error::ShuttingDown),
            Err(_elapsed) => Err(self.refused(format!(
                "waited {} ms (the runner's queue_timeout_ms) for one of its {} slots (max_concurrent_runs) without getting one: \
                 retry later, send the work to another runner, or raise max_concurrent_runs or queue_timeout_ms in the runner config",
                self.timeout.as_millis(),
                self.max
            ))),
        }
    }

    fn refused(&self, message: String) -> Error {
        cairn_telemetry::metrics::sandbox_refused(REASON);
        Error::ResourceExhausted {
            message,
            reason: REASON,
        }
    }

    /// Ends every wait with UNAVAILABLE (shutting down) and admits nothing more.
    pub fn close(&self) {
        self.slots.close();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn admission(max: usize, depth: usize, timeout_ms: u64) -> Arc<Admission> {
        Arc::new(Admission::new(
            max,
            depth,
            Duration::from_millis(timeout_ms),
        ))
    }

    #[tokio::test]
    async fn waiters_are_admitted_in_arrival_order() {
        let a = admission(1, 8, 10_000);
        let first = a.admit().await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..4 {
            let (admission, order) = (a.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let slot = admission.admit().await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(slot);
            }));
            // Each is queued before the next arrives.
            while a.queued().count() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(a.queued().count(), 0);
        assert!(a.admit().await.is_ok(), "the slot came back");
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once_and_a_long_wait_times_out() {
        let a = admission(1, 1, 200);
        let _held = a.admit().await.unwrap();
        let waiter = tokio::spawn({
            let a = a.clone();
            async move { a.admit().await.map(drop) }
        });
        while a.queued().count() < 1 {
            tokio::task::yield_now().await;
        }
        let t0 = std::time::Instant::now();
        let full = a.admit().await.unwrap_err();
        assert!(
            t0.elapsed() < Duration::from_millis(100),
            "a full queue waits for nothing"
        );
        assert!(full.to_string().contains("queue_depth"), "{full}");
        let late = waiter.await.unwrap().unwrap_err();
        assert!(late.to_string().contains("queue_timeout_ms"), "{late}");
        assert_eq!(a.queued().count(), 0);
        let status = tonic::Status::from(late);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(cairn_proto::reason::retry_delay(&status).is_some());
    }

    #[tokio::test]
    async fn closing_ends_the_waits() {
        let a = admission(1, 4, 60_000);
        let _held = a.admit().await.unwrap();
        let waiter = tokio::spawn({
            let a = a.clone();
            async move { a.admit().await.map(drop) }
        });
        while a.queued().count() < 1 {
            tokio::task::yield_now().await;
        }
        a.close();
        assert!(matches!(waiter.await.unwrap(), Err(Error::ShuttingDown)));
        assert!(matches!(a.admit().await, Err(Error::ShuttingDown)));
    }
}
