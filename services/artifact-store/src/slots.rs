//! One publisher per path at a time.
//!
//! Every write holds its path's slot while it looks at what is there and publishes, so the
//! outcome it reports (created, unchanged, overwritten, exists) is still true when it lands. A
//! Put with `PUT_DURABILITY_WITH_RUN_EVENTS` replies once its outcome is decided and keeps the
//! slot until a background task has fsync'd and linked its bytes; readers of the path (Get,
//! Stat, List, Delete, another write) wait for the slot, so none of them sees the file missing
//! after its Put replied.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

type Key = (String, String);

/// The paths being published now, per (project, normalised path).
#[derive(Debug, Default)]
pub struct Slots {
    /// A receiver of each held slot's channel; the holder keeps the sender, and dropping it
    /// wakes the waiters.
    held: Mutex<HashMap<Key, watch::Receiver<()>>>,
}

/// A held slot; dropping it frees the path.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    key: Key,
    _held: watch::Sender<()>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Out of the map before the sender drops: a woken waiter finds the path free.
        self.slots.lock().remove(&self.key);
    }
}

impl Slots {
    /// Takes the slot of `path`, waiting (on a blocking thread) while another write holds it.
    pub fn claim_blocking(self: &Arc<Self>, project: &str, path: &str) -> Slot {
        let key = (project.to_owned(), path.to_owned());
        loop {
            let mut held = {
                let mut slots = self.lock();
                match slots.get(&key) {
                    Some(rx) => rx.clone(),
                    None => {
                        let (tx, rx) = watch::channel(());
                        slots.insert(key.clone(), rx);
                        return Slot {
                            slots: self.clone(),
                            key,
                            _held: tx,
                        };
                    }
                }
            };
            // Ends (with an error) when the holder drops its sender.
            let _ = futures::executor::block_on(held.changed());
        }
    }

    /// Waits until no write holds `path`.
    pub async fn settled(&self, project: &str, path: &str) {
        let key = (project.to_owned(), path.to_owned());
        loop {
            let held = self.lock().get(&key).cloned();
            match held {
                Some(mut rx) => {
                    let _ = rx.changed().await;
                }
                None => return,
            }
        }
    }

    /// Waits until no write holds a path of `project` under `prefix` ("" = the whole project).
    pub async fn settled_under(&self, project: &str, prefix: &str) {
        loop {
            let held: Vec<watch::Receiver<()>> = self
                .lock()
                .iter()
                .filter(|((p, path), _)| p == project && is_under(path, prefix))
                .map(|(_, rx)| rx.clone())
                .collect();
            if held.is_empty() {
                return;
            }
            for mut rx in held {
                let _ = rx.changed().await;
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, watch::Receiver<()>>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn is_under(path: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_claim_and_readers_wait_for_the_holder() {
        let slots = Arc::new(Slots::default());
        let first = slots.claim_blocking("p", "a/b.txt");
        let s2 = slots.clone();
        let second = tokio::task::spawn_blocking(move || s2.claim_blocking("p", "a/b.txt"));
        let reader = {
            let s3 = slots.clone();
            tokio::spawn(async move { s3.settled("p", "a/b.txt").await })
        };
        let lister = {
            let s4 = slots.clone();
            tokio::spawn(async move { s4.settled_under("p", "a").await })
        };
        // Other paths, prefixes and projects are not held up.
        tokio::time::timeout(Duration::from_secs(5), async {
            slots.settled("p", "a/c.txt").await;
            slots.settled("q", "a/b.txt").await;
            slots.settled_under("p", "ab").await;
            slots.settled_under("p", "a/b").await;
        })
        .await
        .expect("paths nobody holds are settled at once");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!second.is_finished(), "the second claim waits");
        assert!(!reader.is_finished(), "a reader of the path waits");
        assert!(!lister.is_finished(), "a lister of the directory waits");
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .unwrap()
            .unwrap();
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .unwrap()
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), lister)
            .await
            .unwrap()
            .unwrap();
        assert!(slots.lock().is_empty());
    }
}
