//! The watchdog of a run's progress (in its driver): a running node attempt that goes longer
//! than its stall limit without any event of its run makes the run stalled. The limit is
//! `stall_after_s` when set, else the attempt's own deadline and [`SLACK`] (the driver ends an
//! attempt at its deadline itself; past that plus the slack, something is stuck). A stall is
//! reported once (`run.stalled`) until the run records another event, and acted on by
//! `stall_policy`.

use std::time::Duration;

use tokio::time::Instant;

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
