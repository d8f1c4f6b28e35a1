//! The downstream HTTP API: the only module that imports `reqwest`.
//!
//! [`Downstream::send`] sends one job and classifies the answer into an
//! [`Answer`]; the worker decides what each answer means for the record
//! (commit, wait, retry topic, dead letter). [`crate::backoff`] is the retry delay
//! for [`Answer::Retryable`] and for a 429 whose wait is
//! [`RetryAfter::Unspecified`].
//!
//! Each call carries the job's W3C `traceparent` (its trace, the call's own
//! span id) and `tracestate` ([`crate::telemetry::trace`]).
//!
//! Everything read from the response is hostile input: a `Retry-After` is
//! parsed without panicking and every wait it yields is clamped to
//! `downstream.max_retry_after`, so one absurd header cannot overflow the
//! worker's `Instant + wait` (issue 6, defect 3).
//!
//! - `client.rs`: [`Downstream`], the request it sends (headers, trace
//!   context, the bound on calls in flight) and the classification of
//!   what came back.
//! - `retry_after.rs`: [`retry_after`] and [`parse_retry_after`], the wait
//!   a `Retry-After` asks for, clamped; `now` is the caller's.
//! - `fetch.rs`, with the `dev-tools` feature only: `get_text`, the plain
//!   `GET` of the tools (the demo's scrapes).
//! - `tests.rs`: the client against a live server on loopback.
//! - Here: what an answer means ([`Answer`], [`RetryAfter`]) and why a
//!   client could not be built ([`DownstreamError`]).

use std::error::Error as _;
use std::time::Duration;

mod client;
// Only the tools (src/dev/) fetch pages; the production build leaves it out.
#[cfg(feature = "dev-tools")]
mod fetch;
mod retry_after;
#[cfg(test)]
mod tests;

pub use crate::config::RetryStatuses;
pub use client::Downstream;
#[cfg(feature = "dev-tools")]
pub use fetch::{get_text, FetchError};
pub use retry_after::{parse_retry_after, retry_after, DEFAULT_MAX_RETRY_AFTER};

/// Why a [`Downstream`] could not be built. Each message names the config
/// key to fix.
#[derive(Debug, thiserror::Error)]
pub enum DownstreamError {
    #[error("downstream.url {url:?} is not a valid URL ({reason}); expected an absolute URL such as http://orders-api:8080/v1/jobs")]
    InvalidUrl { url: String, reason: String },
    #[error("downstream.url {url:?} uses scheme {scheme:?}; only http and https are supported")]
    UnsupportedScheme { url: String, scheme: String },
    #[error("downstream.concurrency must be at least 1")]
    ZeroConcurrency,
    #[error("downstream.timeout must be greater than zero")]
    ZeroTimeout,
    #[error("could not build the HTTP client: {0}")]
    Client(String),
}

/// The wait a 429 asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// Do not call again for this seller before this much time has passed.
    /// Already clamped to `downstream.max_retry_after`; zero for a date in
    /// the past or a negative number ("now").
    Wait(Duration),
    /// No `Retry-After`, or none that could be read (garbage, non-ASCII,
    /// fractions): the worker chooses the wait, with its [`crate::backoff`], rather
    /// than a fixed delay that would make every replica retry in lockstep.
    Unspecified,
}

/// What one call's answer means for the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// 2xx: the job is done.
    Done,
    /// 429: the downstream throttles this seller.
    Throttled(RetryAfter),
    /// 5xx (or another status of `downstream.retry_statuses`), timeout,
    /// connection or transport error: worth another attempt after
    /// [`crate::backoff`].
    Retryable { reason: String },
    /// The downstream itself did not serve the call: a gateway status (502,
    /// 503, 504) or no HTTP answer at all (timeout, refused or reset
    /// connection). Worth another attempt, and, when many calls of
    /// different jobs meet it in a row, the sign of an outage (unlike a
    /// 500, which the service answered, about this job).
    Unreachable { reason: String },
    /// A retryable status that named a `Retry-After` (a 503 during a
    /// deploy): the downstream as a whole is unavailable that long.
    Unavailable {
        retry_after: Duration,
        reason: String,
    },
    /// Any other status (4xx except 429, 1xx, 3xx): retrying will not help.
    /// `status` is `None` only when the request could not even be built.
    Fatal { status: Option<u16>, reason: String },
}

/// An error and its sources on one line: reqwest's own message alone
/// ("error sending request") hides the useful part.
fn error_chain(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
