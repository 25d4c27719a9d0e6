//! Slows down guessing of login tokens: logins are checked one at a time, and each one first
//! waits a delay that doubles with every recent failure from the same peer (and, when many
//! peers fail at once, with the failures of everybody). Waiting happens BEFORE the token is
//! checked, so firing guesses in parallel gains nothing: a right guess comes back as slowly
//! as a wrong one. The price is that while someone guesses, logins are slow for everybody;
//! sessions already logged in are not affected.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Delay after the first failure; doubled per further failure.
const BASE: Duration = Duration::from_millis(250);
/// Longest delay.
const MAX: Duration = Duration::from_secs(8);
/// Failures older than this are forgotten.
const WINDOW: Duration = Duration::from_secs(15 * 60);
/// Most peers remembered (oldest forgotten first).
const MAX_PEERS: usize = 10_000;

#[derive(Default)]
pub(super) struct LoginThrottle {
    /// One login checked at a time.
    turn: tokio::sync::Mutex<()>,
    failures: std::sync::Mutex<Failures>,
}

struct Failures {
    /// Per peer (None = unknown peer): count and time of the last failure.
    peers: HashMap<Option<IpAddr>, (u32, Instant)>,
    /// Everybody's failures.
    all: (u32, Instant),
}

impl Default for Failures {
    fn default() -> Failures {
        Failures {
            peers: HashMap::new(),
            all: (0, Instant::now()),
        }
    }
}

fn delay(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    BASE.saturating_mul(1 << (failures - 1).min(6)).min(MAX)
}

/// A login's turn: hold it while checking the token, then report the outcome.
pub(super) struct Turn<'a> {
    throttle: &'a LoginThrottle,
    peer: Option<IpAddr>,
    _held: tokio::sync::MutexGuard<'a, ()>,
}

impl LoginThrottle {
    /// Waits for this login's turn and its delay.
    pub(super) async fn turn(&self, peer: Option<IpAddr>) -> Turn<'_> {
        let held = self.turn.lock().await;
        let wait = {
            let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            f.peers
                .retain(|_, (_, at)| now.duration_since(*at) < WINDOW);
            if now.duration_since(f.all.1) >= WINDOW {
                f.all = (0, now);
            }
            let mine = f.peers.get(&peer).map(|(n, _)| *n).unwrap_or(0);
            // Many peers failing at once (a distributed guess): everybody waits a little.
            let everybody = f.all.0.saturating_sub(20) / 10;
            delay(mine).max(delay(everybody))
        };
        tokio::time::sleep(wait).await;
        Turn {
            throttle: self,
            peer,
            _held: held,
        }
    }
}

impl Turn<'_> {
    /// Records a failed login; returns how many this peer has had recently.
    pub(super) fn failed(self) -> u32 {
        let mut f = self
            .throttle
            .failures
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if f.peers.len() >= MAX_PEERS && !f.peers.contains_key(&self.peer) {
            if let Some(oldest) = f
                .peers
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| *k)
            {
                f.peers.remove(&oldest);
            }
        }
        let e = f.peers.entry(self.peer).or_insert((0, now));
        e.0 = e.0.saturating_add(1);
        e.1 = now;
        let n = e.0;
        f.all = (f.all.0.saturating_add(1), now);
        n
    }

    /// A successful login forgets the peer's failures.
    pub(super) fn succeeded(self) {
        let mut f = self
            .throttle
            .failures
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        f.peers.remove(&self.peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_doubles_and_caps() {
        assert_eq!(delay(0), Duration::ZERO);
        assert_eq!(delay(1), BASE);
        assert_eq!(delay(2), BASE * 2);
        assert_eq!(delay(3), BASE * 4);
        assert_eq!(delay(40), MAX);
    }
}
