//! Riding out a dependency's outage: a client's calls that find the dependency unavailable
//! are sent again with backoff until the outage budget (config `dependency_outage_s`) is
//! spent. Owns the dependency's reachability (which readiness follows, see [`crate::health`])
//! and the outage's two log lines; must never resend a call that may already have taken
//! effect unless the caller says the call is idempotent.
//!
//! The budget counts from the start of the outage, not of each call: once a dependency has
//! been away longer than the budget, calls fail at their first refusal instead of each
//! waiting the budget again.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tonic::{Code, Status};

/// Default outage budget (config `dependency_outage_s`).
pub const DEFAULT_OUTAGE: Duration = Duration::from_secs(60);

const FIRST_DELAY: Duration = Duration::from_millis(100);
const MAX_DELAY: Duration = Duration::from_secs(2);

/// Whether a failed call may be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Safety {
    /// Sending it twice has the effect of sending it once (reads; Puts that carry the
    /// expected digest; ...): resent on any UNAVAILABLE.
    Idempotent,
    /// Resent only when the request provably never reached the server (connection refused,
    /// stream refused before processing).
    Once,
}

/// One dependency of a service, shared by its clients (cheap to clone).
#[derive(Clone, Debug)]
pub struct Dependency {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    budget: Duration,
    up: watch::Sender<bool>,
    /// The current outage (None = reachable).
    down: Mutex<Option<Outage>>,
    /// Outages whose warn line was logged.
    logged: std::sync::atomic::AtomicU64,
}

/// An outage under way.
#[derive(Debug, Clone, Copy)]
struct Outage {
    since: Instant,
    /// Whether its warn line went out: only once it is confirmed (see `Dependency::call`).
    warned: bool,
}

impl Dependency {
    /// `name` as the logs and readiness say it (e.g. "artifact-store").
    pub fn new(name: impl Into<String>, budget: Duration) -> Dependency {
        Dependency {
            inner: Arc::new(Inner {
                name: name.into(),
                budget,
                up: watch::Sender::new(true),
                down: Mutex::new(None),
                logged: Default::default(),
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn budget(&self) -> Duration {
        self.inner.budget
    }

    /// Reachability as last seen (true until a call or probe finds it away).
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.inner.up.subscribe()
    }

    pub fn is_up(&self) -> bool {
        *self.inner.up.borrow()
    }

    /// Outages logged so far (their warn lines).
    pub fn outages_logged(&self) -> u64 {
        self.inner.logged.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `call` until it succeeds, fails for another reason than the dependency being
    /// away, may not be resent (`safety`), or the outage outlasts the budget.
    ///
    /// A single refusal that its first resend gets past (a channel handing back its last
    /// failed connect just after the dependency came back) marks the dependency away but logs
    /// no outage: the warn line goes out when the resend fails too, when the call is not
    /// resent, or when a health check finds the dependency away.
    pub async fn call<T, F, Fut>(
        &self,
        safety: Safety,
        what: &str,
        mut call: F,
    ) -> Result<T, Status>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut delay = FIRST_DELAY;
        let mut refused = 0u32;
        loop {
            match call().await {
                Err(status) if unreachable(&status) => {
                    refused += 1;
                    let resend = safety == Safety::Idempotent || never_sent(&status);
                    let since = self.mark_down(what, &status, refused > 1 || !resend);
                    if !resend || since.elapsed() >= self.inner.budget {
                        self.mark_down(what, &status, true);
                        return Err(status);
                    }
                    let left = self.inner.budget.saturating_sub(since.elapsed());
                    tokio::time::sleep(delay.min(left)).await;
                    delay = (delay * 2).min(MAX_DELAY);
                }
                other => {
                    // Any answer from the server (also a refusal) means it is back.
                    if !matches!(&other, Err(s) if s.code() == Code::Unavailable) {
                        self.came_back();
                    }
                    return other;
                }
            }
        }
    }

    /// Marks the dependency away (the outage's warn line, once); returns when it went away.
    pub fn went_down(&self, what: &str, status: &Status) -> Instant {
        self.mark_down(what, status, true)
    }

    /// Marks the dependency away; logs the outage's warn line (once) when `confirmed`.
    fn mark_down(&self, what: &str, status: &Status, confirmed: bool) -> Instant {
        let mut down = self.inner.down.lock().unwrap_or_else(|p| p.into_inner());
        let outage = down.get_or_insert_with(|| {
            self.inner.up.send_replace(false);
            Outage {
                since: Instant::now(),
                warned: false,
            }
        });
        if outage.warned || !confirmed {
            return outage.since;
        }
        outage.warned = true;
        self.inner
            .logged
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(
            dependency = %self.inner.name,
            call = what,
            error = %status.message(),
            budget_s = self.inner.budget.as_secs(),
            "{} is unreachable: retrying calls for up to {} s",
            self.inner.name,
            self.inner.budget.as_secs()
        );
        outage.since
    }

    /// Marks the dependency reachable (the outage's info line, once).
    pub fn came_back(&self) {
        let mut down = self.inner.down.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Outage { since: t, warned }) = down.take() {
            self.inner.up.send_replace(true);
            if !warned {
                return;
            }
            tracing::info!(
                dependency = %self.inner.name,
                outage_ms = t.elapsed().as_millis() as u64,
                "{} is reachable again after {:.1} s",
                self.inner.name,
                t.elapsed().as_secs_f64()
            );
        }
    }

    /// Checks reachability every `interval` through grpc.health.v1 on `channel` (service ""),
    /// so readiness follows the dependency also while no call is made. Ends with the runtime.
    pub fn probe(&self, channel: tonic::transport::Channel, interval: Duration) {
        let dep = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                match crate::serving(channel.clone(), "", interval.max(Duration::from_secs(1)))
                    .await
                {
                    Ok(true) => dep.came_back(),
                    Ok(false) => {
                        dep.went_down("health check", &Status::unavailable("not serving"));
                    }
                    Err(s) if unreachable(&s) || s.code() == Code::DeadlineExceeded => {
                        dep.went_down("health check", &s);
                    }
                    // Answers, but without this health service: it is there.
                    Err(_) => dep.came_back(),
                }
            }
        });
    }
}

/// The dependency did not answer (connect refused, connection lost, shutting down).
fn unreachable(status: &Status) -> bool {
    status.code() == Code::Unavailable
}

/// Whether the request provably never reached the server's handler: the connection could
/// not be made, or the server refused the stream before processing it (HTTP/2
/// REFUSED_STREAM, as after a GOAWAY).
pub fn never_sent(status: &Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::AddrNotAvailable
                    | std::io::ErrorKind::NotFound
            ) {
                return true;
            }
        }
        let text = e.to_string();
        if text.contains("tcp connect error")
            || text.contains("refused stream before processing")
            || text.contains("error trying to connect")
        {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_outage_is_ridden_out_and_logged_once() {
        let dep = Dependency::new("store", Duration::from_secs(5));
        let mut n = 0;
        let r = dep
            .call(Safety::Idempotent, "get", || {
                n += 1;
                let n = n;
                async move {
                    if n < 4 {
                        Err(Status::unavailable("down"))
                    } else {
                        Ok(n)
                    }
                }
            })
            .await;
        assert_eq!(r.unwrap(), 4);
        assert!(dep.is_up());
        assert_eq!(dep.outages_logged(), 1);
    }

    #[tokio::test]
    async fn one_stale_refusal_that_a_resend_gets_past_logs_no_outage() {
        // The channel's last failed connect, handed back once after the dependency returned.
        let dep = Dependency::new("store", Duration::from_secs(5));
        for round in 1..=3u64 {
            let mut n = 0;
            let r = dep
                .call(Safety::Idempotent, "read", || {
                    n += 1;
                    let n = n;
                    async move {
                        match n {
                            1 => Err(Status::unavailable("tcp connect error")),
                            _ => Ok(n),
                        }
                    }
                })
                .await;
            assert_eq!(r.unwrap(), 2);
            assert!(dep.is_up());
            assert_eq!(dep.outages_logged(), 0, "round {round}");
        }
        // A refusal that is not resent reaches the caller: that outage is logged.
        let r: Result<(), Status> = dep
            .call(Safety::Once, "append", || async {
                Err(Status::unavailable("connection reset"))
            })
            .await;
        assert!(r.is_err());
        assert_eq!(dep.outages_logged(), 1);
        // A health check finding it away logs nothing more for the same outage.
        dep.went_down("health check", &Status::unavailable("down"));
        assert_eq!(dep.outages_logged(), 1);
        dep.came_back();
        dep.went_down("health check", &Status::unavailable("down"));
        assert_eq!(dep.outages_logged(), 2);
    }

    #[tokio::test]
    async fn a_call_that_may_have_landed_is_not_resent() {
        let dep = Dependency::new("store", Duration::from_secs(5));
        let mut n = 0;
        let r: Result<(), Status> = dep
            .call(Safety::Once, "append", || {
                n += 1;
                async { Err(Status::unavailable("connection reset")) }
            })
            .await;
        assert_eq!(r.unwrap_err().code(), Code::Unavailable);
        assert_eq!(n, 1);
        assert!(!dep.is_up());
        assert_eq!(dep.outages_logged(), 1, "the caller sees this outage");
    }

    #[tokio::test]
    async fn the_budget_counts_from_the_outage_start() {
        let dep = Dependency::new("store", Duration::from_millis(300));
        let started = Instant::now();
        let r: Result<(), Status> = dep
            .call(Safety::Idempotent, "get", || async {
                Err(Status::unavailable("down"))
            })
            .await;
        assert!(r.is_err());
        assert!(started.elapsed() >= Duration::from_millis(300));
        // The outage is older than the budget: the next call fails at once.
        let again = Instant::now();
        let mut n = 0;
        let _: Result<(), Status> = dep
            .call(Safety::Idempotent, "get", || {
                n += 1;
                async { Err(Status::unavailable("down")) }
            })
            .await;
        assert_eq!(n, 1);
        assert!(again.elapsed() < Duration::from_millis(250));
    }

    #[tokio::test]
    async fn other_errors_are_returned_at_once() {
        let dep = Dependency::new("store", Duration::from_secs(5));
        let mut n = 0;
        let r: Result<(), Status> = dep
            .call(Safety::Idempotent, "get", || {
                n += 1;
                async { Err(Status::not_found("x")) }
            })
            .await;
        assert_eq!(r.unwrap_err().code(), Code::NotFound);
        assert_eq!(n, 1);
    }
}
