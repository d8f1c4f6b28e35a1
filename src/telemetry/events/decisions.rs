//! What the limiter decided for a seller, the series
//! `throttle_limiter_decisions` counts: granted, refused, never, denied by
//! shadow rules; and a call not made because the seller is known to be
//! refused.

use std::time::Duration;

use super::{secs, Event};
use crate::telemetry::metrics::{
    metrics, seller_label, DecisionLabels, KindLabel, SellerLabel, TierSellerLabels,
};
use crate::telemetry::trace;
use crate::telemetry::Every;

/// The limiter found a job that can never pass (its cost is over a rule's
/// capacity); it is dead-lettered.
#[derive(Debug)]
pub struct LimiterNever<'a> {
    pub seller: &'a str,
    pub tier: &'a str,
    pub rule: usize,
}

impl Event for LimiterNever<'_> {
    const NAME: &'static str = "LimiterNever";

    fn record(&self) {
        metrics()
            .limiter_decisions
            .get_or_create(&DecisionLabels {
                result: "never",
                by: format!("rule{}", self.rule),
                tier: self.tier.to_owned(),
                seller: seller_label(self.seller),
            })
            .inc();
    }
}

/// Shadow rules were asked about `units` the enforced rules granted:
/// `denied` of them they would have held back (`by`: which shadow rule, when
/// one refused outright). The jobs go through either way.
#[derive(Debug)]
pub struct ShadowDecided<'a> {
    pub seller: &'a str,
    pub tier: &'a str,
    pub units: u64,
    pub denied: u64,
    pub by: Option<usize>,
    pub error: Option<&'a str>,
}

impl Event for ShadowDecided<'_> {
    const NAME: &'static str = "ShadowDecided";

    fn record(&self) {
        let m = metrics();
        if let Some(error) = self.error {
            m.limiter_errors
                .get_or_create(&KindLabel { kind: "shadow" })
                .inc();
            static LOG: Every = Every::new(Duration::from_secs(10));
            if let Some(more) = LOG.tick() {
                tracing::warn!(
                    seller = self.seller,
                    error,
                    more_since_last_line = more,
                    "shadow rules could not be asked; the jobs went through uncounted"
                );
            }
            return;
        }
        if self.denied == 0 {
            return;
        }
        let seller = seller_label(self.seller);
        m.limiter_decisions
            .get_or_create(&DecisionLabels {
                result: "shadow_denied",
                by: self
                    .by
                    .map_or_else(|| "shadow".to_owned(), |i| format!("shadow{i}")),
                tier: self.tier.to_owned(),
                seller: seller.clone(),
            })
            .inc();
        m.limiter_shadow_denied_units
            .get_or_create(&TierSellerLabels {
                tier: self.tier.to_owned(),
                seller,
            })
            .inc_by(self.denied);
        tracing::debug!(
            seller = self.seller,
            units = self.units,
            denied = self.denied,
            "shadow rules would have held units back"
        );
    }
}

/// A limiter call not made: the seller is known to be refused (or held by
/// a 429) until later, so a job arriving for it just joins its queue.
#[derive(Debug)]
pub struct CallAvoided<'a> {
    pub seller: &'a str,
}

impl Event for CallAvoided<'_> {
    const NAME: &'static str = "CallAvoided";

    fn record(&self) {
        metrics()
            .limiter_calls_avoided
            .get_or_create(&SellerLabel {
                seller: seller_label(self.seller),
            })
            .inc();
    }
}

/// The limiter refused a seller for a while.
#[derive(Debug)]
pub struct SellerThrottled<'a> {
    pub seller: &'a str,
    pub tier: &'a str,
    pub retry_after: Duration,
    pub waiting: usize,
    /// What refused: `rule0`, `rule1`, …, `downstream_429`, `unavailable`.
    pub by: &'a str,
}

impl Event for SellerThrottled<'_> {
    const NAME: &'static str = "SellerThrottled";

    fn record(&self) {
        let m = metrics();
        m.limiter_decisions
            .get_or_create(&DecisionLabels {
                result: "denied",
                by: self.by.to_owned(),
                tier: self.tier.to_owned(),
                seller: seller_label(self.seller),
            })
            .inc();
        m.limiter_retry_after.observe(secs(self.retry_after));
        trace::note_seller_wait(
            self.seller,
            trace::cause_of_refusal(self.by),
            Some(self.retry_after),
        );
        tracing::debug!(
            seller = self.seller,
            retry_after_ms = self.retry_after.as_millis() as u64,
            waiting = self.waiting,
            "seller throttled"
        );
    }
}

/// The limiter admitted jobs of a seller: `units` is the sum of their costs.
#[derive(Debug)]
pub struct JobsAdmitted<'a> {
    pub seller: &'a str,
    pub tier: &'a str,
    pub jobs: usize,
    pub units: u64,
    /// At most a fifth of the seller's smallest rule capacity is left.
    pub near_limit: bool,
}

impl Event for JobsAdmitted<'_> {
    const NAME: &'static str = "JobsAdmitted";

    fn record(&self) {
        let m = metrics();
        let seller = seller_label(self.seller);
        if self.near_limit {
            m.limiter_near_limit
                .get_or_create(&TierSellerLabels {
                    tier: self.tier.to_owned(),
                    seller: seller.clone(),
                })
                .inc();
        }
        m.limiter_decisions
            .get_or_create(&DecisionLabels {
                result: "granted",
                by: String::new(),
                tier: self.tier.to_owned(),
                seller,
            })
            .inc();
        m.jobs_admitted.inc_by(self.jobs as u64);
        m.units_admitted.inc_by(self.units);
    }
}

inherent_emit!(
    LimiterNever<'_>,
    ShadowDecided<'_>,
    CallAvoided<'_>,
    SellerThrottled<'_>,
    JobsAdmitted<'_>
);
