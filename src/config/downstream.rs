//! `[downstream]`: the product-registration API, the calls' timeouts,
//! retries and backoff, and [`RetryStatuses`], the answers worth another
//! attempt.

use std::time::Duration;

use serde::Deserialize;

use super::duration::human_duration;
use super::error::{self, Invalid};

/// Upper bound of `downstream.max_retry_after`.
const MAX_RETRY_AFTER_LIMIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// `[downstream]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownstreamSettings {
    /// The product-registration endpoint; jobs are POSTed here.
    pub url: String,
    /// Per call, connect to last byte.
    #[serde(deserialize_with = "human_duration")]
    pub timeout: Duration,
    /// Calls in flight at once, per replica: the fixed number, or with
    /// `adaptive_concurrency` the most the learnt limit may reach.
    pub concurrency: usize,
    /// Learn how many calls the downstream can take instead of always
    /// sending `concurrency`: the limit drops when calls are shed (502,
    /// 503, 504, timeouts, refused connections) or answer slower than
    /// `latency_tolerance` times the unloaded latency, and grows back
    /// while every slot is in use. Recommended; see
    /// [Adaptive concurrency](../concepts/adaptive-concurrency.md). Default
    /// false.
    pub adaptive_concurrency: bool,
    /// The fewest calls in flight the adaptive limit keeps, per replica
    /// (where it starts, too). At least 1, at most `concurrency`. Default 1.
    pub min_concurrency: usize,
    /// How many times slower than unloaded the downstream may answer
    /// before the adaptive limit drops: unloaded is the lowest average of
    /// a window of calls seen. More than 1. Default 2.0.
    pub latency_tolerance: f64,
    /// Calls per job before a retryable failure (5xx, timeout) is dead-lettered.
    pub max_attempts: u32,
    /// First backoff after a retryable failure; doubles per attempt, with jitter.
    #[serde(deserialize_with = "human_duration")]
    pub backoff_base: Duration,
    /// Upper bound of one backoff.
    #[serde(deserialize_with = "human_duration")]
    pub max_backoff: Duration,
    /// Longest wait a 429's `Retry-After` can impose on a seller; longer
    /// ones are clamped (and logged). Greater than zero. Default 1h.
    #[serde(deserialize_with = "human_duration")]
    pub max_retry_after: Duration,
    /// Failed calls in a row (5xx, timeouts, refused connections, from at
    /// least two jobs, no answer between them) that mark the downstream as
    /// out of service: then no job spends an attempt and only a probe goes
    /// out at a time, until it answers again. Default 5.
    pub outage_after_failures: u32,
    /// Longest interval between two probes during an outage; the first
    /// comes after 250 ms and the interval doubles up to this. Bounds how
    /// late the worker sees the downstream back. Default 2s.
    #[serde(deserialize_with = "human_duration")]
    pub max_outage_probe_interval: Duration,
    /// Statuses worth another attempt: codes (`"408"`) or classes
    /// (`"5xx"`). Every other status but 2xx and 429 dead-letters the job
    /// at once. Default `["5xx", "408", "425"]`. Parsed as it is read:
    /// a bad entry is refused naming this key.
    pub retry_statuses: RetryStatuses,
}

impl DownstreamSettings {
    /// Checks that serde's types cannot express.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        error::nonempty(&[("downstream.url", &self.url)])?;
        error::at_least_one(&[
            ("downstream.concurrency", self.concurrency as u64),
            ("downstream.min_concurrency", self.min_concurrency as u64),
            ("downstream.max_attempts", u64::from(self.max_attempts)),
            (
                "downstream.outage_after_failures",
                u64::from(self.outage_after_failures),
            ),
        ])?;
        error::longer_than_zero(&[
            ("downstream.timeout", self.timeout),
            ("downstream.backoff_base", self.backoff_base),
            ("downstream.max_retry_after", self.max_retry_after),
            (
                "downstream.max_outage_probe_interval",
                self.max_outage_probe_interval,
            ),
        ])?;
        // The worker adds this to `Instant::now()`; an absurd value (a typo
        // such as "1000000y") would bring back the overflow the clamp exists
        // to prevent, and a week is already longer than any real throttle.
        if self.max_retry_after > MAX_RETRY_AFTER_LIMIT {
            return Err(Invalid::new(
                "downstream.max_retry_after",
                DownstreamProblem::RetryAfterTooLong,
            ));
        }
        if self.min_concurrency > self.concurrency {
            return Err(Invalid::new(
                "downstream.min_concurrency",
                DownstreamProblem::FloorOverCeiling,
            ));
        }
        if !(self.latency_tolerance > 1.0 && self.latency_tolerance <= 100.0) {
            return Err(Invalid::new(
                "downstream.latency_tolerance",
                DownstreamProblem::Tolerance,
            ));
        }
        if self.max_backoff < self.backoff_base {
            return Err(Invalid::new(
                "downstream.max_backoff",
                DownstreamProblem::BackoffMaxBelowBase,
            ));
        }
        Ok(())
    }
}

/// What is wrong with a value of `[downstream]`.
#[derive(Debug, thiserror::Error)]
pub(super) enum DownstreamProblem {
    #[error("must be at most 7d (longer waits belong to the retry topic)")]
    RetryAfterTooLong,
    #[error("must not be shorter than downstream.backoff_base")]
    BackoffMaxBelowBase,
    #[error("must not be more than downstream.concurrency (the adaptive limit's ceiling)")]
    FloorOverCeiling,
    #[error("must be more than 1 (the unloaded latency) and at most 100")]
    Tolerance,
}

/// Which statuses are worth another attempt: whole classes (`5xx`) and
/// single codes (`408`). Any other status but 2xx and 429 is fatal.
///
/// Deserialized from the list as written (`["5xx", "408"]`), so a bad entry
/// is refused when the config loads, naming the key, and the worker takes
/// the parsed value.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Vec<String>")]
pub struct RetryStatuses {
    classes: Vec<u16>,
    codes: Vec<u16>,
}

impl RetryStatuses {
    /// Parses `downstream.retry_statuses`: each entry a code from 300 to
    /// 599 (not 429, which always throttles) or a class `3xx`, `4xx`,
    /// `5xx`. The error says which entry is wrong.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<RetryStatuses, RetryStatusError> {
        let mut out = RetryStatuses {
            classes: Vec::new(),
            codes: Vec::new(),
        };
        for e in entries {
            let e = e.as_ref().trim();
            match e.to_ascii_lowercase().as_str() {
                "3xx" => out.classes.push(3),
                "4xx" => out.classes.push(4),
                "5xx" => out.classes.push(5),
                code => match code.parse::<u16>() {
                    Ok(429) => return Err(RetryStatusError::TooManyRequests),
                    Ok(c) if (300..600).contains(&c) => out.codes.push(c),
                    _ => return Err(RetryStatusError::NotAStatus(e.to_owned())),
                },
            }
        }
        Ok(out)
    }

    pub fn contains(&self, status: u16) -> bool {
        self.codes.contains(&status) || self.classes.contains(&(status / 100))
    }
}

impl TryFrom<Vec<String>> for RetryStatuses {
    type Error = RetryStatusError;

    fn try_from(entries: Vec<String>) -> Result<RetryStatuses, RetryStatusError> {
        RetryStatuses::parse(&entries)
    }
}

/// Why an entry of `downstream.retry_statuses` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetryStatusError {
    #[error("429 always throttles the seller; leave it out")]
    TooManyRequests,
    /// The entry, as written.
    #[error("{0:?} is neither a status from 300 to 599 nor a class 3xx, 4xx, 5xx")]
    NotAStatus(String),
}

impl Default for RetryStatuses {
    /// 5xx, 408 Request Timeout and 425 Too Early: each says "try again".
    fn default() -> RetryStatuses {
        RetryStatuses {
            classes: vec![5],
            codes: vec![408, 425],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_statuses_parse_codes_and_classes_and_refuse_the_rest() {
        let r = RetryStatuses::parse(&["5xx", "408", "4XX"]).unwrap();
        assert!(r.contains(503) && r.contains(408) && r.contains(451));
        assert!(!r.contains(302));
        let d = RetryStatuses::default();
        assert!(d.contains(408) && d.contains(425) && d.contains(599));
        assert!(!d.contains(400) && !d.contains(409));
        for bad in ["429", "200", "6xx", "soon", ""] {
            assert!(RetryStatuses::parse(&[bad]).is_err(), "{bad:?} accepted");
        }
    }
}
