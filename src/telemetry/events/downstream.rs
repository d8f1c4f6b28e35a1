//! The downstream's answers: each call's class and latency, a 429 and the
//! clamp of its `Retry-After`, a failure retried, an outage.

use std::time::Duration;

use super::{secs, Event};
use crate::telemetry::metrics::{metrics, ClassLabel, ReasonLabel};
use crate::telemetry::trace;

/// The downstream answered (or failed to): `class` is `2xx`, `429`, `4xx`,
/// `5xx`, `other`, `timeout` or `error`.
#[derive(Debug)]
pub struct DownstreamAnswered {
    pub class: &'static str,
    pub took: Duration,
}

impl Event for DownstreamAnswered {
    const NAME: &'static str = "DownstreamAnswered";

    fn record(&self) {
        let m = metrics();
        m.downstream_requests
            .get_or_create(&ClassLabel { class: self.class })
            .inc();
        m.downstream_request_duration.observe(secs(self.took));
    }
}

/// The downstream answered 429 for a seller.
#[derive(Debug)]
pub struct DownstreamThrottled<'a> {
    pub seller: &'a str,
    pub retry_after: Duration,
}

impl Event for DownstreamThrottled<'_> {
    const NAME: &'static str = "DownstreamThrottled";

    fn record(&self) {
        trace::note_seller_wait(self.seller, "downstream_429", Some(self.retry_after));
        tracing::info!(
            seller = self.seller,
            retry_after_ms = self.retry_after.as_millis() as u64,
            "downstream throttled seller; blocking it for every replica"
        );
    }
}

/// The downstream went out of service (every call failing), or came back.
#[derive(Debug)]
pub struct DownstreamOutage {
    pub open: bool,
    /// How long it lasted (when it ends).
    pub lasted: Duration,
    /// Probes that failed meanwhile.
    pub probes: u32,
}

impl Event for DownstreamOutage {
    const NAME: &'static str = "DownstreamOutage";

    fn record(&self) {
        metrics().downstream_outage.set(i64::from(self.open));
        if self.open {
            metrics().downstream_outages.inc();
            tracing::warn!(
                "downstream out of service: calls failing across jobs; holding every job (no attempt spent) and probing"
            );
        } else {
            tracing::warn!(
                lasted_ms = self.lasted.as_millis() as u64,
                probes = self.probes,
                "downstream answering again; resuming every seller"
            );
        }
    }
}

/// A downstream call failed in a way worth retrying.
#[derive(Debug)]
pub struct DownstreamFailed<'a> {
    pub job_id: &'a str,
    pub attempts: u32,
    pub reason: &'a str,
    pub backoff: Duration,
}

impl Event for DownstreamFailed<'_> {
    const NAME: &'static str = "DownstreamFailed";

    fn record(&self) {
        metrics().jobs_retried.inc();
        tracing::info!(
            job_id = self.job_id,
            attempts = self.attempts,
            reason = self.reason,
            backoff_ms = self.backoff.as_millis() as u64,
            "downstream call failed; retrying after backoff"
        );
    }
}

/// A downstream 429 asked for a longer wait than `downstream.max_retry_after`;
/// the seller waits the maximum instead. Often a misconfigured or hostile
/// server: a 10^19 s `Retry-After` once overflowed the worker's clock
/// arithmetic.
#[derive(Debug)]
pub struct RetryAfterClamped {
    pub requested: Duration,
    pub max: Duration,
}

impl Event for RetryAfterClamped {
    const NAME: &'static str = "RetryAfterClamped";

    fn record(&self) {
        metrics().downstream_retry_after_clamped.inc();
        tracing::warn!(
            requested_s = self.requested.as_secs(),
            max_s = self.max.as_secs(),
            "downstream Retry-After is over downstream.max_retry_after; clamped"
        );
    }
}

/// The downstream concurrency limit at start: adaptive from its floor, or
/// fixed.
#[derive(Debug)]
pub struct ConcurrencyConfigured {
    pub limit: usize,
    pub ceiling: usize,
    pub adaptive: bool,
}

impl Event for ConcurrencyConfigured {
    const NAME: &'static str = "ConcurrencyConfigured";

    fn record(&self) {
        metrics()
            .downstream_concurrency_limit
            .set(self.limit as i64);
        if self.adaptive {
            tracing::info!(
                limit = self.limit,
                ceiling = self.ceiling,
                "downstream concurrency adaptive: starting at the floor, learning from the downstream's answers"
            );
        }
    }
}

/// The adaptive downstream concurrency limit moved (see
/// `worker::concurrency`). Every move is counted; a large one (a quarter
/// of the limit last logged, or the floor or ceiling reached) is logged
/// once, with its reason.
#[derive(Debug)]
pub struct ConcurrencyLimit {
    pub from: usize,
    pub to: usize,
    /// `overload`, `latency`, `growth`.
    pub reason: &'static str,
    /// Calls out when the call that moved it started.
    pub in_flight: usize,
    /// For `latency`: the window's average and the unloaded baseline.
    pub window_ms: Option<u64>,
    pub baseline_ms: Option<u64>,
    pub loud: bool,
}

impl Event for ConcurrencyLimit {
    const NAME: &'static str = "ConcurrencyLimit";

    fn record(&self) {
        let m = metrics();
        m.downstream_concurrency_limit.set(self.to as i64);
        m.downstream_concurrency_changes
            .get_or_create(&ReasonLabel {
                reason: self.reason,
            })
            .inc();
        if !self.loud {
            return;
        }
        let why = match self.reason {
            "overload" => "calls shed or unreached (502/503/504, timeout, refused)",
            "latency" => "calls slower than downstream.latency_tolerance times unloaded",
            _ => "every slot in use and the downstream keeping up",
        };
        tracing::info!(
            from = self.from,
            to = self.to,
            reason = self.reason,
            in_flight = self.in_flight,
            window_ms = self.window_ms,
            baseline_ms = self.baseline_ms,
            "downstream concurrency limit moved: {why}"
        );
    }
}

inherent_emit!(
    ConcurrencyConfigured,
    ConcurrencyLimit,
    DownstreamAnswered,
    DownstreamThrottled<'_>,
    DownstreamOutage,
    DownstreamFailed<'_>,
    RetryAfterClamped
);
