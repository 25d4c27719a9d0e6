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

#[derive(Default)]
pub struct Throttle {
    /// Per address: failures and when the first of them happened.
    peers: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

impl Throttle {
    /// `Err(wait)` while `peer` has sent too many wrong tokens lately.
    pub fn check(&self, peer: Option<IpAddr>) -> Result<(), Duration> {
        let Some(peer) = peer else { return Ok(()) };
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        match peers.get(&peer) {
            Some((n, first)) if *n >= LIMIT => {
                let waited = first.elapsed();
                if waited < WINDOW {
                    Err(WINDOW - waited)
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
        if peers.len() >= MAX_PEERS {
            peers.retain(|_, (_, first)| now.duration_since(*first) < WINDOW);
            if peers.len() >= MAX_PEERS {
                if let Some(oldest) = peers.iter().min_by_key(|(_, (_, t))| *t).map(|(p, _)| *p) {
                    peers.remove(&oldest);
                }
            }
        }
        let entry = peers.entry(peer).or_insert((0, now));
        if now.duration_since(entry.1) >= WINDOW {
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
}
