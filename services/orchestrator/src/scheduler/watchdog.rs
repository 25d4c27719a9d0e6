//! The watchdog of a run's progress (in its driver): a running node attempt that goes longer
//! than its stall limit without any event of its run makes the run stalled. The limit is
//! `stall_after_s` when set, else the attempt's own deadline and [`SLACK`] (the driver ends an
//! attempt at its deadline itself; past that plus the slack, something is stuck). A stall is
//! reported once (`run.stalled`) until the run records another event, and acted on by
//! `stall_policy`.

use std::time::Duration;

use cairn_proto::v1 as pb;
use serde_json::json;
use tokio::time::Instant;

use super::Driver;
use cairn_node::events::{self as ev, Ev};

/// Time past a node attempt's own deadline before it counts as stalled (when `stall_after_s`
/// is not set).
pub const SLACK: Duration = Duration::from_secs(30);

/// The stall limit of an attempt whose deadline is `deadline`; `stall_after` zero = unset.
pub fn limit(stall_after: Duration, deadline: Duration) -> Duration {
    if stall_after.is_zero() {
        deadline + SLACK
    } else {
        stall_after
    }
}

/// When the run becomes stalled, the last event having been at `last_event`: the earliest
/// moment one of the running attempts (their deadlines) has gone its limit without an event.
/// None when nothing runs.
pub fn stall_at(
    last_event: Instant,
    deadlines: impl IntoIterator<Item = Duration>,
    stall_after: Duration,
) -> Option<Instant> {
    deadlines
        .into_iter()
        .map(|d| last_event + limit(stall_after, d))
        .min()
}

/// The attempts (id, deadline) that are stalled at `now`.
pub fn stalled<'a>(
    now: Instant,
    last_event: Instant,
    attempts: impl IntoIterator<Item = (&'a str, Duration)>,
    stall_after: Duration,
) -> Vec<&'a str> {
    let mut ids: Vec<&str> = attempts
        .into_iter()
        .filter(|(_, d)| last_event + limit(stall_after, *d) <= now)
        .map(|(id, _)| id)
        .collect();
    ids.sort_unstable();
    ids
}

impl Driver {
    /// When the watchdog next looks (None: nothing runs, the stall is reported, or the run
    /// is ending).
    pub(super) fn stall_due(&self) -> Option<Instant> {
        if self.stall_reported || self.failing.is_some() || self.canceling.is_some() {
            return None;
        }
        let after = Duration::from_secs(self.b.config.stall_after_s);
        stall_at(
            self.last_event,
            self.running
                .values()
                .filter(|r| !r.canceled && !r.stall_retry)
                .map(|r| r.deadline),
            after,
        )
    }

    /// Reports a stall (`run.stalled`, a log line, a metric) and acts on it by `stall_policy`.
    pub(super) fn on_stall(&mut self) {
        let after = Duration::from_secs(self.b.config.stall_after_s);
        let ids: Vec<String> = stalled(
            Instant::now(),
            self.last_event,
            self.running
                .iter()
                .filter(|(_, r)| !r.canceled && !r.stall_retry)
                .map(|(id, r)| (id.as_str(), r.deadline)),
            after,
        )
        .into_iter()
        .map(str::to_owned)
        .collect();
        if ids.is_empty() {
            return;
        }
        let policy = self.b.config.stall_policy;
        let silent_s = self.last_event.elapsed().as_secs();
        tracing::warn!(run_id = %self.state.run_id, nodes = ?ids, silent_s, policy = policy.as_str(), "run stalled: running nodes went past their stall limit without any event");
        cairn_telemetry::metrics::run_stalled(policy.as_str());
        self.emit(
            Ev::run(ev::RUN_STALLED)
                .level(pb::Level::Warning)
                .with("nodes", json!(ids))
                .with("silent_s", silent_s)
                .with("policy", policy.as_str()),
        );
        self.stall_reported = true;
        match policy {
            crate::config::StallPolicy::Notify => {}
            crate::config::StallPolicy::Retry => {
                for id in &ids {
                    if let Some(r) = self.running.get_mut(id) {
                        r.stall_retry = true;
                        r.cancel.cancel();
                    }
                }
            }
            crate::config::StallPolicy::Fail => self.fail(format!(
                "stalled: node {} went {silent_s} s without any event (stall_policy = fail)",
                ids.join(", ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_stall_after_or_the_deadline_and_the_slack() {
        let s = Duration::from_secs;
        assert_eq!(limit(s(0), s(60)), s(90));
        assert_eq!(limit(s(5), s(60)), s(5));
        let t0 = Instant::now();
        assert_eq!(stall_at(t0, [], s(5)), None, "nothing runs: no stall");
        assert_eq!(stall_at(t0, [s(60), s(10)], s(0)), Some(t0 + s(40)));
        assert_eq!(stall_at(t0, [s(60), s(10)], s(5)), Some(t0 + s(5)));
        let running = [("b", s(10)), ("a", s(100))];
        assert!(stalled(t0 + s(39), t0, running, s(0)).is_empty());
        assert_eq!(stalled(t0 + s(40), t0, running, s(0)), ["b"]);
        assert_eq!(stalled(t0 + s(5), t0, running, s(5)), ["a", "b"]);
        // An event since resets the clock.
        assert!(stalled(t0 + s(41), t0 + s(2), running, s(0)).is_empty());
    }
}
