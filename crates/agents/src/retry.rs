//! The retry rule of one LLM request: at most `max_attempts` attempts per
//! request (not per task), exponential backoff with full jitter, `Retry-After` honoured.
//! Connection errors, timeouts, interrupted streams and HTTP 408/409/429/5xx are retried;
//! every other status, a quota-exhausted 429 and a malformed answer are not. Each attempt is
//! reported to an [`AttemptObserver`] so the run records one event per attempt.
//!
//! This module decides *whether and when* to try again; `openai.rs` says what went wrong.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

/// Why one attempt failed, as the retry rule sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// No connection (refused, DNS, TLS, reset before an answer). Retried.
    Connect,
    /// No answer within `request_timeout_ms`, or silence longer than `idle_timeout_ms`. Retried.
    Timeout,
    /// The answer stopped before it was complete (stream cut, body read error). Retried.
    Interrupted,
    /// An HTTP error status; retried only for 408, 409, 429 and 5xx.
    Http,
    /// 429 with `insufficient_quota`: the account is out of credit. Never retried.
    QuotaExhausted,
    /// A success status with a body that is not a chat completion. Never retried (the same
    /// server would answer the same way).
    Protocol,
}

/// One failed attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptFailure {
    pub kind: FailureKind,
    /// The HTTP status, when the server answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// What went wrong and what to check; never contains the API key.
    pub message: String,
    /// The server's `Retry-After`, when it sent one.
    #[serde(skip)]
    pub retry_after: Option<Duration>,
}

impl AttemptFailure {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> AttemptFailure {
        AttemptFailure {
            kind,
            status: None,
            message: message.into(),
            retry_after: None,
        }
    }

    /// Whether the rule allows another attempt after this failure.
    pub fn retryable(&self) -> bool {
        match self.kind {
            FailureKind::Connect | FailureKind::Timeout | FailureKind::Interrupted => true,
            FailureKind::Http => self.status.is_some_and(retryable_status),
            FailureKind::QuotaExhausted | FailureKind::Protocol => false,
        }
    }
}

impl fmt::Display for AttemptFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// HTTP statuses worth another attempt: request timeout, conflict, too many requests and
/// server errors. 400/401/403/404/422 (and every other 4xx) would fail the same way again.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429) || (500..=599).contains(&status)
}

/// `Retry-After` as delay-seconds or an HTTP date (RFC 9110 §10.2.3), relative to `now`.
/// A date in the past means "now"; anything else unparsable is ignored.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Attempts and waits of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryRule {
    /// Attempts per request, the first included (5).
    pub max_attempts: u32,
    /// Ceiling of the first wait; doubles per attempt.
    pub initial_backoff: Duration,
    /// Largest ceiling of a wait.
    pub max_backoff: Duration,
    /// Longest `Retry-After` honoured; a server asking for more ends the request at once
    /// (waiting would outlive any sensible run, retrying earlier would be refused again).
    pub max_retry_after: Duration,
}

impl Default for RetryRule {
    fn default() -> Self {
        RetryRule {
            max_attempts: 5,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(120),
        }
    }
}

impl RetryRule {
    /// The wait after failed attempt `attempt` (1-based) without a `Retry-After`: "full
    /// jitter", uniform in [0, min(max_backoff, initial_backoff * 2^(attempt-1))], so many
    /// clients hit by the same outage do not retry in lockstep.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let ms = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(fastrand::u64(0..=ms))
    }

    /// The upper bound of [`RetryRule::backoff`].
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }
}

/// What one attempt came to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum AttemptOutcome {
    Succeeded,
    Failed {
        #[serde(flatten)]
        failure: AttemptFailure,
        /// Whether another attempt follows.
        will_retry: bool,
    },
}

/// One attempt of one request, as reported to the observer (serialises into an event's
/// data: `{"attempt":2,"max_attempts":5,"elapsed_ms":31,"outcome":"failed","kind":"http",
/// "status":503,"message":"...","will_retry":true,"retry_in_ms":812}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// 1-based.
    pub attempt: u32,
    pub max_attempts: u32,
    /// Endpoint the attempt went to (no credentials in it).
    pub endpoint: String,
    pub elapsed_ms: u64,
    #[serde(flatten)]
    pub outcome: AttemptOutcome,
    /// The wait before the next attempt, when one follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_in_ms: Option<u64>,
}

/// Receives every attempt of a request as it ends (the orchestrator records an event per
/// attempt). Called synchronously from the request's task: keep it quick (push to a channel,
/// emit an event).
pub trait AttemptObserver: Send + Sync {
    fn attempt(&self, attempt: &Attempt);
}

/// An observer that ignores everything.
pub struct NoObserver;

impl AttemptObserver for NoObserver {
    fn attempt(&self, _: &Attempt) {}
}

impl<F: Fn(&Attempt) + Send + Sync> AttemptObserver for F {
    fn attempt(&self, attempt: &Attempt) {
        self(attempt)
    }
}

/// Why the request ended without an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GaveUp {
    /// Every allowed attempt failed.
    Exhausted,
    /// The last failure is of a kind that is never retried.
    NotRetryable,
    /// The server asked for a longer wait than `max_retry_after`.
    RetryAfterTooLong,
}

/// A request that ended without an answer: how far it got and the last failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LlmError {
    pub endpoint: String,
    pub model: String,
    /// Attempts made.
    pub attempts: u32,
    pub max_attempts: u32,
    pub gave_up: GaveUp,
    pub last: AttemptFailure,
    /// The longest `Retry-After` allowed, for the message of `RetryAfterTooLong`.
    #[serde(skip)]
    pub max_retry_after: Duration,
}

impl fmt::Display for LlmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = format!("LLM request to {} (model `{}`)", self.endpoint, self.model);
        match self.gave_up {
            GaveUp::Exhausted => write!(
                f,
                "{what} failed {n} times in a row, {n} of {max} attempts used (at most {max} attempts per request); last error: {last}",
                n = self.attempts,
                max = self.max_attempts,
                last = self.last
            ),
            GaveUp::NotRetryable => write!(
                f,
                "{what} failed on attempt {} of {} and is not retried: {}",
                self.attempts, self.max_attempts, self.last
            ),
            GaveUp::RetryAfterTooLong => write!(
                f,
                "{what} failed on attempt {} of {}: the server asks to wait {}s before retrying, longer than llm.max_retry_after_s = {}; last error: {}",
                self.attempts,
                self.max_attempts,
                self.last.retry_after.unwrap_or_default().as_secs(),
                self.max_retry_after.as_secs(),
                self.last
            ),
        }
    }
}

impl std::error::Error for LlmError {}

impl From<LlmError> for super::AgentError {
    fn from(e: LlmError) -> Self {
        super::AgentError::Llm(Box::new(e))
    }
}

impl LlmError {
    /// One line for a chat notice.
    pub fn summary(&self) -> String {
        let status = self
            .last
            .status
            .map(|s| format!("HTTP {s}, "))
            .unwrap_or_default();
        let mut message = self.last.message.clone();
        if message.chars().count() > 300 {
            message = message.chars().take(300).collect::<String>() + "…";
        }
        format!(
            "{status}{message} (after {} of {} attempts)",
            self.attempts, self.max_attempts
        )
    }

    /// What an operator should do before retrying.
    pub fn retry_advice(&self) -> String {
        match (self.last.kind, self.last.status) {
            (FailureKind::QuotaExhausted, _) => {
                "the provider account has no quota left: add credit or switch the API key, then submit the task again".into()
            }
            (FailureKind::Http, Some(401 | 403)) => {
                "the provider refused the API key: check the key (the environment variable named by llm.api_key_env), then submit the task again".into()
            }
            (FailureKind::Http, Some(404)) => {
                "the endpoint or model was not found: check the llm setting (openai:<base_url>#<model>, base_url usually ends in /v1), then submit again".into()
            }
            (FailureKind::Http, Some(400 | 422)) | (FailureKind::Protocol, _) => {
                "the provider rejected or garbled the request: check the model supports chat completions (and tool calls), then submit again".into()
            }
            _ if self.gave_up == GaveUp::RetryAfterTooLong => format!(
                "the provider is rate limiting: submit the task again after {}s",
                self.last.retry_after.unwrap_or_default().as_secs()
            ),
            _ => "the provider is unreachable, overloaded or timing out: wait a few minutes and submit the task again (or raise llm.request_timeout_ms)".into(),
        }
    }
}

/// Runs `attempt(n)` for n = 1.. until it succeeds or the rule says stop; reports each
/// attempt to `observer`; sleeps between attempts. Dropping the returned future stops
/// everything (the in-flight attempt included).
pub async fn run<T, F, Fut>(
    rule: &RetryRule,
    endpoint: &str,
    model: &str,
    observer: &dyn AttemptObserver,
    mut attempt: F,
) -> Result<T, LlmError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, AttemptFailure>>,
{
    let max_attempts = rule.max_attempts.max(1);
    let mut n = 1;
    loop {
        let started = Instant::now();
        let result = attempt(n).await;
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let report = |outcome: AttemptOutcome, retry_in: Option<Duration>| Attempt {
            attempt: n,
            max_attempts,
            endpoint: endpoint.to_owned(),
            elapsed_ms,
            outcome,
            retry_in_ms: retry_in.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        };
        let failure = match result {
            Ok(value) => {
                observer.attempt(&report(AttemptOutcome::Succeeded, None));
                return Ok(value);
            }
            Err(failure) => failure,
        };
        let stop = if !failure.retryable() {
            Some(GaveUp::NotRetryable)
        } else if n >= max_attempts {
            Some(GaveUp::Exhausted)
        } else if failure
            .retry_after
            .is_some_and(|d| d > rule.max_retry_after)
        {
            Some(GaveUp::RetryAfterTooLong)
        } else {
            None
        };
        // The server's Retry-After is the wait when it sent one; else full-jitter backoff.
        let wait = stop
            .is_none()
            .then(|| failure.retry_after.unwrap_or_else(|| rule.backoff(n)));
        observer.attempt(&report(
            AttemptOutcome::Failed {
                failure: failure.clone(),
                will_retry: stop.is_none(),
            },
            wait,
        ));
        if let Some(gave_up) = stop {
            return Err(LlmError {
                endpoint: endpoint.to_owned(),
                model: model.to_owned(),
                attempts: n,
                max_attempts,
                gave_up,
                last: failure,
                max_retry_after: rule.max_retry_after,
            });
        }
        tokio::time::sleep(wait.unwrap_or_default()).await;
        n += 1;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        for s in [408, 409, 429, 500, 502, 503, 504, 599] {
            assert!(retryable_status(s), "{s}");
        }
        for s in [400, 401, 403, 404, 405, 413, 422, 200, 301] {
            assert!(!retryable_status(s), "{s}");
        }
    }

    #[test]
    fn retry_after_forms() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Sunday, 06-Nov-94 08:49:40 GMT", now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            parse_retry_after("Sun Nov  6 08:49:38 1994", now),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
    }

    #[test]
    fn full_jitter_stays_under_a_doubling_ceiling() {
        let rule = RetryRule {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
            ..Default::default()
        };
        assert_eq!(rule.ceiling(1), Duration::from_millis(100));
        assert_eq!(rule.ceiling(2), Duration::from_millis(200));
        assert_eq!(rule.ceiling(3), Duration::from_millis(350));
        assert_eq!(rule.ceiling(99), Duration::from_millis(350));
        let waits: Vec<_> = (0..200).map(|_| rule.backoff(3)).collect();
        assert!(waits.iter().all(|w| *w <= Duration::from_millis(350)));
        // Jitter really spreads the waits.
        assert!(
            waits.iter().any(|w| *w < Duration::from_millis(150))
                && waits.iter().any(|w| *w > Duration::from_millis(200))
        );
    }
}
