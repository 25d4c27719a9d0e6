//! Slows down guessing of tokens over gRPC: after [`LIMIT`] wrong tokens from one peer address
//! within [`WINDOW`], that address is refused (RESOURCE_EXHAUSTED, with the seconds to wait)
//! until the window of its first counted failure has passed. Other addresses are not
//! affected, so a guesser cannot lock people out from elsewhere. Callers without an address
//! (in-process: the console, which throttles its own logins) are not counted.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Wrong tokens one address may send within [`WINDOW`].
pub const LIMIT: u32 = 30;
/// How long failures count.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Most addresses remembered (the oldest are forgotten first).
const MAX_PEERS: usize = 10_000;

pub struct Throttle {
    limit: u32,
    window: Duration,
    max_peers: usize,
    /// Per address: failures and when the first of them happened.
    peers: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new(LIMIT, WINDOW, MAX_PEERS)
    }
}

impl Throttle {
    fn new(limit: u32, window: Duration, max_peers: usize) -> Throttle {
        Throttle {
            limit,
            window,
            max_peers,
            peers: Mutex::default(),
        }
    }

    /// `Err(wait)` while `peer` has sent too many wrong tokens lately.
    pub fn check(&self, peer: Option<IpAddr>) -> Result<(), Duration> {
        let Some(peer) = peer else { return Ok(()) };
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        match peers.get(&peer) {
            Some((n, first)) if *n >= self.limit => {
                let waited = first.elapsed();
                if waited < self.window {
                    Err(self.window - waited)
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }

    /// Counts a wrong token from `peer`.
    pub fn failed(&self, peer: Option<IpAddr>) {
        let Some(peer) = peer else { return };
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if peers.len() >= self.max_peers {
            peers.retain(|_, (_, first)| now.duration_since(*first) < self.window);
            if peers.len() >= self.max_peers {
                if let Some(oldest) = peers.iter().min_by_key(|(_, (_, t))| *t).map(|(p, _)| *p) {
                    peers.remove(&oldest);
                }
            }
        }
        let entry = peers.entry(peer).or_insert((0, now));
        if now.duration_since(entry.1) >= self.window {
            *entry = (0, now);
        }
        entry.0 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_refused_after_the_limit_and_others_are_not() {
        let t = Throttle::default();
        let a: IpAddr = [127, 0, 0, 1].into();
        let b: IpAddr = [127, 0, 0, 2].into();
        for _ in 0..LIMIT {
            assert!(t.check(Some(a)).is_ok());
            t.failed(Some(a));
        }
        let wait = t.check(Some(a)).unwrap_err();
        assert!(wait <= WINDOW && wait > WINDOW / 2, "{wait:?}");
        assert!(t.check(Some(b)).is_ok());
        t.failed(None);
        assert!(t.check(None).is_ok());
    }

    fn refused(t: &Throttle, peer: IpAddr) -> bool {
        t.check(Some(peer)).is_err()
    }

    #[test]
    fn an_address_is_let_in_again_once_the_window_of_its_first_failure_has_passed() {
        let window = Duration::from_millis(300);
        let t = Throttle::new(3, window, 100);
        let a: IpAddr = [127, 0, 0, 1].into();
        for _ in 0..3 {
            assert!(!refused(&t, a));
            t.failed(Some(a));
        }
        let wait = t.check(Some(a)).unwrap_err();
        assert!(wait <= window && wait > Duration::ZERO, "{wait:?}");
        std::thread::sleep(window + Duration::from_millis(50));
        assert!(!refused(&t, a), "the window has passed");
        // A failure after the window starts a new count: one more is not yet too many.
        t.failed(Some(a));
        assert!(!refused(&t, a), "the old failures no longer count");
        t.failed(Some(a));
        t.failed(Some(a));
        assert!(refused(&t, a), "three in the new window are");
    }

    #[test]
    fn past_the_peers_bound_expired_addresses_go_first_then_the_oldest() {
        let window = Duration::from_millis(300);
        let t = Throttle::new(1, window, 2);
        let (a, b, c, d): (IpAddr, IpAddr, IpAddr, IpAddr) = (
            [10, 0, 0, 1].into(),
            [10, 0, 0, 2].into(),
            [10, 0, 0, 3].into(),
            [10, 0, 0, 4].into(),
        );
        t.failed(Some(a));
        std::thread::sleep(Duration::from_millis(20));
        t.failed(Some(b));
        assert!(refused(&t, a) && refused(&t, b));
        // Full: the oldest (a) is forgotten to make room, b is kept.
        t.failed(Some(c));
        assert!(!refused(&t, a), "the oldest address was forgotten");
        assert!(refused(&t, b) && refused(&t, c));
        assert_eq!(t.peers.lock().unwrap().len(), 2);
        // Once b and c have expired, a new address clears both out, not just one.
        std::thread::sleep(window + Duration::from_millis(50));
        t.failed(Some(d));
        let peers = t.peers.lock().unwrap();
        assert_eq!(peers.len(), 1, "expired entries are dropped first");
        assert!(peers.contains_key(&d));
    }
}
